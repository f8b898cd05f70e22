// The files a COPY step needs, packed from the build context into one tar whose sha256 is the
// step's filesHash: the build's cache key for that step and the name the upload is stored by.
//
// The tar is deterministic, so the same files give the same hash on any machine and after any
// checkout: entries sorted by path (byte order), owner 0:0 with no names (Docker's COPY makes files
// root's unless --chown), the permission bits kept, and every mtime fixed at FIXED_MTIME_S. Kept
// mtimes would make the hash change with every `git clone` (checkout time), so a CI build would
// never hit the cache; BuildKit leaves mtimes out of its COPY cache key for the same reason.
// 2000-01-01 rather than 1970: zip refuses times before 1980, and a user zipping copied files
// would meet that.
//
// Paths: relative to the context, `/`-separated, `.dockerignore` applied; a source that names a
// path outside the context (`..`, or through a symlinked directory) is refused. Symlinks are
// packed as links, never followed: a link to /etc/passwd copies the link, not the host's file.
//
// The tar's headers are the image layers' own (tar-header.ts: ustar, a pax header where a field
// does not fit), with every field fixed here for determinism; no tar dependency in the CLI.
import { createHash, type Hash } from 'node:crypto';
import { closeSync, existsSync, lstatSync, mkdtempSync, openSync, readFileSync, readSync, readdirSync, readlinkSync, realpathSync, rmSync, writeSync, type Stats } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative, sep } from 'node:path';
import { AsbError } from '../errors.ts';
import { cleanPath, globRegex, IgnoreMatcher, isGlob, parseDockerignore } from './context-ignore.ts';
import { BLOCK, tarEnd, tarHeader } from './tar-header.ts';

/** 2000-01-01T00:00:00Z. */
export const FIXED_MTIME_S = 946_684_800;
const READ_CHUNK = 1024 * 1024;
/** The largest size a ustar header's 11 octal digits hold. */
const MAX_FILE_BYTES = 0o77777777777;

export interface ContextEntry {
  /** Relative to the context, `/`-separated; directories without a trailing slash. */
  path: string;
  kind: 'file' | 'dir' | 'symlink';
  mode: number;
  size: number;
  linkTarget?: string;
}

export interface BuildContext {
  readonly dir: string;
  readonly ignore: IgnoreMatcher;
}

function contextError(message: string): AsbError {
  return new AsbError('BadRequest', message);
}

/** The build context at dir, with its .dockerignore read. */
export function openContext(dir: string): BuildContext {
  let real: string;
  try {
    real = realpathSync(dir);
  } catch {
    throw contextError(`build context ${dir} does not exist`);
  }
  if (!lstatSync(real).isDirectory()) throw contextError(`build context ${dir} is not a directory`);
  const ignoreFile = join(real, '.dockerignore');
  let ignore = new IgnoreMatcher([]);
  if (existsSync(ignoreFile)) {
    try {
      ignore = new IgnoreMatcher(parseDockerignore(readFileSync(ignoreFile, 'utf8')));
    } catch (err) {
      throw contextError(`${ignoreFile}: ${(err as Error).message}`);
    }
  }
  return { dir: real, ignore };
}

function entryOf(ctx: BuildContext, path: string, st: Stats): ContextEntry {
  const abs = join(ctx.dir, path);
  if (st.isSymbolicLink()) return { path, kind: 'symlink', mode: st.mode & 0o7777, size: 0, linkTarget: readlinkSync(abs) };
  if (st.isDirectory()) return { path, kind: 'dir', mode: st.mode & 0o7777, size: 0 };
  if (st.isFile()) {
    if (st.size > MAX_FILE_BYTES) throw contextError(`${path} in the build context is larger than a tar entry may be (8 GiB)`);
    return { path, kind: 'file', mode: st.mode & 0o7777, size: st.size };
  }
  throw contextError(`${path} in the build context is neither a file, a directory nor a symlink (a socket or device cannot be copied)`);
}

/** Every path under dir (relative), not descending into ignored directories unless a `!` line may re-include something there. */
function walk(ctx: BuildContext, rel: string, out: ContextEntry[]): void {
  for (const name of readdirSync(join(ctx.dir, rel)).sort()) {
    const path = rel === '.' ? name : `${rel}/${name}`;
    const ignored = ctx.ignore.ignores(path);
    const st = lstatSync(join(ctx.dir, path));
    if (!ignored) out.push(entryOf(ctx, path, st));
    if (st.isDirectory() && (!ignored || ctx.ignore.hasExceptions)) walk(ctx, path, out);
  }
}

/** Refuses a path whose parent directories lead out of the context through a symlink. */
function checkInside(ctx: BuildContext, path: string, source: string): void {
  const parent = path.includes('/') ? path.slice(0, path.lastIndexOf('/')) : '.';
  let real: string;
  try {
    real = realpathSync(join(ctx.dir, parent));
  } catch {
    throw contextError(`COPY source "${source}": ${parent} does not exist in the build context ${ctx.dir}`);
  }
  const rel = relative(ctx.dir, real);
  if (rel === '..' || rel.startsWith(`..${sep}`) || rel.startsWith(sep)) throw contextError(`COPY source "${source}" leaves the build context through the symlink ${parent} (-> ${real})`);
}

/** The entries one COPY source names, sorted by path; 400 when it names nothing or leaves the context. */
export function contextEntries(ctx: BuildContext, source: string): ContextEntry[] {
  const clean = cleanPath(source);
  if (clean === '..' || clean.startsWith('../')) throw contextError(`COPY source "${source}" leaves the build context`);
  const roots: string[] = [];
  if (isGlob(clean)) {
    const all: ContextEntry[] = [];
    walk(ctx, '.', all);
    const re = globRegex(clean);
    roots.push(...all.map((e) => e.path).filter((p) => re.test(p)));
  } else if (clean === '.') {
    roots.push('.');
  } else {
    checkInside(ctx, clean, source);
    if (!existsSync(join(ctx.dir, clean)) && !isLink(join(ctx.dir, clean))) throw contextError(`COPY source "${source}": no such file or directory in the build context ${ctx.dir}`);
    if (!ctx.ignore.ignores(clean)) roots.push(clean);
  }
  const byPath = new Map<string, ContextEntry>();
  for (const root of roots) {
    if (root === '.') {
      const all: ContextEntry[] = [];
      walk(ctx, '.', all);
      for (const e of all) byPath.set(e.path, e);
      continue;
    }
    const st = lstatSync(join(ctx.dir, root));
    byPath.set(root, entryOf(ctx, root, st));
    if (st.isDirectory()) {
      const under: ContextEntry[] = [];
      walk(ctx, root, under);
      for (const e of under) byPath.set(e.path, e);
    }
  }
  if (byPath.size === 0) throw contextError(`COPY source "${source}" matches no file in the build context ${ctx.dir}${roots.length === 0 ? ' (or .dockerignore excludes all of it)' : ''}`);
  return [...byPath.values()].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

function isLink(abs: string): boolean {
  try {
    return lstatSync(abs).isSymbolicLink();
  } catch {
    return false;
  }
}

// --- the tar ---

class TarSink {
  readonly #fd: number;
  readonly #hash: Hash = createHash('sha256');
  size = 0;

  constructor(fd: number) {
    this.#fd = fd;
  }

  write(buf: Buffer): void {
    writeSync(this.#fd, buf);
    this.#hash.update(buf);
    this.size += buf.length;
  }

  pad(): void {
    const rest = this.size % BLOCK;
    if (rest !== 0) this.write(Buffer.alloc(BLOCK - rest));
  }

  digest(): string {
    return this.#hash.digest('hex');
  }
}

function writeEntry(sink: TarSink, ctx: BuildContext, e: ContextEntry): void {
  const type = e.kind === 'dir' ? 'dir' : e.kind === 'symlink' ? 'symlink' : 'file';
  sink.write(tarHeader({ path: e.path, type, mode: e.mode, uid: 0, gid: 0, size: e.kind === 'file' ? e.size : 0, mtime: FIXED_MTIME_S, ...(e.linkTarget === undefined ? {} : { linkname: e.linkTarget }) }));
  if (e.kind !== 'file') return;
  const fd = openSync(join(ctx.dir, e.path), 'r');
  try {
    const buf = Buffer.alloc(Math.min(READ_CHUNK, Math.max(e.size, 1)));
    let done = 0;
    while (done < e.size) {
      const n = readSync(fd, buf, 0, Math.min(buf.length, e.size - done), null);
      if (n === 0) throw contextError(`${e.path} in the build context shrank while it was being packed; build again once it stops changing`);
      sink.write(buf.subarray(0, n));
      done += n;
    }
  } finally {
    closeSync(fd);
  }
  sink.pad();
}

export interface PackedFiles {
  /** sha256 of the tar, hex: the COPY step's filesHash. */
  sha256: string;
  /** The tar, in a private (0700) temporary directory; call remove() when done. */
  path: string;
  bytes: number;
  entries: number;
  remove(): void;
}

/** Packs what one COPY source names into a deterministic tar in a private temporary directory. */
export function packSource(ctx: BuildContext, source: string): PackedFiles {
  const entries = contextEntries(ctx, source);
  const dir = mkdtempSync(join(tmpdir(), 'asb-build-'));
  const path = join(dir, 'files.tar');
  const remove = (): void => rmSync(dir, { recursive: true, force: true });
  try {
    const fd = openSync(path, 'wx', 0o600);
    const sink = new TarSink(fd);
    try {
      for (const e of entries) writeEntry(sink, ctx, e);
      sink.write(tarEnd());
    } finally {
      closeSync(fd);
    }
    return { sha256: sink.digest(), path, bytes: sink.size, entries: entries.length, remove };
  } catch (err) {
    remove();
    throw err;
  }
}
