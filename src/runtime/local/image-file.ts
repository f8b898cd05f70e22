// Reads a file of an unpacked image tree on the host as the container would see it: every symlink
// is resolved inside the tree (an absolute target starts again at the tree's root, `..` never
// climbs above it), as openat2(RESOLVE_IN_ROOT) does. The tree is the tenant's: a plain readFile
// of <tree>/etc/ssl/certs/ca-certificates.crt followed an image's link to /root/... and handed a
// host file to the sandbox as its CA bundle. Only a regular file is opened: the type is checked
// before the open (umoci unpacks device nodes as root, and opening one can act on the host's
// device: a watchdog arms on open), then the file is opened O_NOFOLLOW and O_NONBLOCK and must be
// the same regular file (device and inode), and only up to a size is read: the tenant picks that too.
// Trees are unpacked once and never written after (image-store.ts), and no sandbox can write to a
// lower layer, so nothing changes between the walk and the open.
import { constants, type Stats } from 'node:fs';
import { lstat, open, readlink } from 'node:fs/promises';
import { join } from 'node:path';
import { AsbError } from '../../errors.ts';

/** Linux's own bound on the links one path resolution follows (MAXSYMLINKS). */
const MAX_LINKS = 40;
/** Debian's CA bundle is ~220 KiB and a large passwd a few hundred; 4 MiB is far above either. */
export const IMAGE_FILE_MAX_BYTES = 4 * 2 ** 20;

/**
 * Where `path` (absolute, as inside the container) lands inside `tree`, every link resolved within
 * it; undefined when a component is missing or not a directory (the file does not exist there).
 */
export async function resolveInTree(tree: string, path: string): Promise<string | undefined> {
  return (await lookUpInTree(tree, path))?.at;
}

/** resolveInTree, with the lstat of what it found. */
async function lookUpInTree(tree: string, path: string): Promise<{ at: string; st: Stats } | undefined> {
  const pending = path.split('/');
  const resolved: string[] = [];
  let links = 0;
  while (pending.length > 0) {
    const name = pending.shift() ?? '';
    if (name === '' || name === '.') continue;
    if (name === '..') {
      resolved.pop();
      continue;
    }
    const candidate = join(tree, ...resolved, name);
    const st = await lstat(candidate).catch((err: unknown) => {
      if (isMissing(err)) return undefined;
      throw err;
    });
    if (st === undefined) return undefined;
    if (st.isSymbolicLink()) {
      if (++links > MAX_LINKS) throw invalid(path, `has more than ${String(MAX_LINKS)} symbolic links in its path`);
      const target = await readlink(candidate);
      if (target.startsWith('/')) resolved.length = 0;
      pending.unshift(...target.split('/'));
      continue;
    }
    if (pending.some((rest) => rest !== '' && rest !== '.') && !st.isDirectory()) return undefined;
    resolved.push(name);
  }
  const at = join(tree, ...resolved);
  // Never a link: every one on the way was followed.
  return { at, st: await lstat(at) };
}

/**
 * The image's file at `path` as text, or undefined when the image has none. An `Invalid` AsbError
 * naming the path when it is there but not a regular file, or larger than `maxBytes`.
 */
export async function readImageFile(tree: string, path: string, maxBytes = IMAGE_FILE_MAX_BYTES): Promise<string | undefined> {
  const found = await lookUpInTree(tree, path);
  if (found === undefined) return undefined;
  if (!found.st.isFile()) throw invalid(path, `is ${kindOf(found.st)}, not a regular file`);
  const handle = await open(found.at, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK).catch((err: unknown) => {
    if (isMissing(err)) return undefined;
    throw err;
  });
  if (handle === undefined) return undefined;
  try {
    const st = await handle.stat();
    if (!st.isFile() || st.dev !== found.st.dev || st.ino !== found.st.ino) throw invalid(path, 'changed while it was being read');
    if (st.size > maxBytes) throw invalid(path, `is ${String(st.size)} bytes, more than the ${String(maxBytes)} the runtime reads`);
    const buf = Buffer.alloc(st.size);
    const { bytesRead } = await handle.read(buf, 0, st.size, 0);
    return buf.subarray(0, bytesRead).toString('utf8');
  } finally {
    await handle.close();
  }
}

function isMissing(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ENOTDIR';
}

function invalid(path: string, what: string): AsbError {
  return new AsbError('Invalid', `the image's ${path} ${what}`, { fields: [{ field: 'image', message: `${path} ${what}` }] });
}

function kindOf(st: { isDirectory(): boolean; isFIFO(): boolean; isCharacterDevice(): boolean; isBlockDevice(): boolean; isSocket(): boolean }): string {
  if (st.isDirectory()) return 'a directory';
  if (st.isFIFO()) return 'a FIFO';
  if (st.isCharacterDevice()) return 'a character device';
  if (st.isBlockDevice()) return 'a block device';
  if (st.isSocket()) return 'a socket';
  return 'a special file';
}
