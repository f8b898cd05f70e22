// A step's changes (layer-diff.ts) as an OCI layer: a gzip'ed tar written to `<dir>/<digest>`,
// with its digest (of the gzip bytes) and diff ID (of the tar). Ownership goes from the pod's host
// ids back to the container's (host id - the pod's first id); a file owned by an id outside the
// pod's range (none a sandbox can make; a kernel's overflow id) becomes root's and loses its
// setuid and setgid bits, so no layer carries a privilege the build did not have. Hardlinks within
// the layer stay hardlinks. Extended attributes other than the overlay's opacity are not kept
// (a sandbox has no CAP_SETFCAP to set file capabilities anyway).
// Each file is opened without following a link and must be the regular file, of the size, that
// the walk saw (the disk is frozen, so it is); a FIFO is never opened.
import { createHash, randomBytes } from 'node:crypto';
import { constants, createWriteStream } from 'node:fs';
import { mkdir, open, rename, rm } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { once } from 'node:events';
import { createGzip, constants as zlib } from 'node:zlib';
import { readlink } from 'node:fs/promises';
import { AsbError } from '../errors.ts';
import { hostPath, type Change, type LayerFiles, type UpperNode } from './layer-diff.ts';
import { padding, tarEnd, tarHeader, type TarEntry } from './tar-header.ts';

export interface LayerBlob {
  /** sha256 of the gzip bytes: the blob's name in the registry. */
  digest: string;
  /** sha256 of the tar: the image config's rootfs.diff_ids. */
  diffId: string;
  size: number;
}

export interface IdRangeOf { hostId: number; size: number }

const CHUNK = 1 << 20;

/** A layer being written: tar bytes in, a gzip'ed blob in `blobsDir` (named by its digest) out. */
export interface LayerOutput {
  readonly write: (b: Buffer) => Promise<void>;
  /** Ends the archive (its two zero blocks) and names the blob by its digest. */
  readonly finish: () => Promise<LayerBlob>;
  /** Drops what was written. */
  readonly abort: () => Promise<void>;
}

export async function openLayerOutput(blobsDir: string): Promise<LayerOutput> {
  await mkdir(blobsDir, { recursive: true, mode: 0o700 });
  const tmp = join(blobsDir, `.layer-${randomBytes(8).toString('hex')}.tmp`);
  const tarHash = createHash('sha256');
  const gzHash = createHash('sha256');
  let size = 0;
  // Level 1: layers go to a registry on this machine; level 6 took ~3x the CPU for ~10% fewer bytes.
  const gzip = createGzip({ level: zlib.Z_BEST_SPEED });
  const out = createWriteStream(tmp, { mode: 0o600 });
  gzip.on('data', (b: Buffer) => {
    gzHash.update(b);
    size += b.length;
  });
  gzip.pipe(out);
  const closed = once(out, 'close');
  const write = async (b: Buffer): Promise<void> => {
    tarHash.update(b);
    if (!gzip.write(b)) await once(gzip, 'drain');
  };
  return {
    write,
    finish: async () => {
      await write(tarEnd());
      gzip.end();
      await closed;
      const hex = gzHash.digest('hex');
      await rename(tmp, join(blobsDir, hex));
      return { digest: `sha256:${hex}`, diffId: `sha256:${tarHash.digest('hex')}`, size };
    },
    abort: async () => {
      gzip.destroy();
      out.destroy();
      await rm(tmp, { force: true });
    },
  };
}

/** Writes the layer into `blobsDir` (its file named by the digest's hex); the caller's signal stops it. */
export async function writeLayer(changes: readonly Change[], upper: string | LayerFiles, ids: IdRangeOf, blobsDir: string, signal: AbortSignal): Promise<LayerBlob> {
  const output = await openLayerOutput(blobsDir);
  const write = output.write;
  try {
    const linked = new Map<number, string>();
    for (const change of changes) {
      signal.throwIfAborted();
      if (change.kind === 'whiteout') {
        await write(whiteoutHeader(change.path));
        continue;
      }
      if (change.kind === 'opaque') {
        await write(tarHeader({ path: `${change.dir}/.wh..wh..opq`, type: 'file', mode: 0o644, uid: 0, gid: 0, size: 0, mtime: 0 }));
        continue;
      }
      const { path, node } = change;
      const owner = ownership(node, ids);
      const base = { path, mode: owner.mode, uid: owner.uid, gid: owner.gid, size: 0, mtime: node.mtime };
      if (node.type === 'dir' || node.type === 'fifo') {
        await write(tarHeader({ ...base, type: node.type }));
      } else if (node.type === 'symlink') {
        await write(tarHeader({ ...base, type: 'symlink', linkname: await readlink(hostPath(upper, path)) }));
      } else if (node.type === 'file') {
        const first = node.nlink > 1 ? linked.get(node.ino) : undefined;
        if (first !== undefined) {
          await write(tarHeader({ ...base, type: 'hardlink', linkname: first }));
          continue;
        }
        if (node.nlink > 1) linked.set(node.ino, path);
        await writeFileEntry({ ...base, type: 'file', size: node.size }, hostPath(upper, path), node, write);
      }
    }
    return await output.finish();
  } catch (err) {
    await output.abort();
    throw err;
  }
}

/** The OCI whiteout entry that deletes `path` (relative) from the layers below. */
export function whiteoutHeader(path: string): Buffer {
  return tarHeader({ path: posix.join(posix.dirname(path), `.wh.${posix.basename(path)}`), type: 'file', mode: 0o644, uid: 0, gid: 0, size: 0, mtime: 0 });
}

/** Container ids from host ids; outside the pod's range: root's, without setuid/setgid. */
function ownership(node: UpperNode, ids: IdRangeOf): { uid: number; gid: number; mode: number } {
  const inRange = (id: number): boolean => id >= ids.hostId && id < ids.hostId + ids.size;
  if (inRange(node.uid) && inRange(node.gid)) return { uid: node.uid - ids.hostId, gid: node.gid - ids.hostId, mode: node.mode };
  return { uid: inRange(node.uid) ? node.uid - ids.hostId : 0, gid: inRange(node.gid) ? node.gid - ids.hostId : 0, mode: node.mode & ~0o6000 };
}

async function writeFileEntry(entry: TarEntry, path: string, node: UpperNode, write: (b: Buffer) => Promise<void>): Promise<void> {
  const handle = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK | constants.O_NOCTTY);
  try {
    const st = await handle.stat();
    if (!st.isFile() || st.ino !== node.ino || st.size !== node.size) throw new AsbError('Internal', `/${entry.path} changed while its layer was written`);
    await write(tarHeader(entry));
    const buf = Buffer.alloc(Math.min(CHUNK, Math.max(node.size, 1)));
    let done = 0;
    while (done < node.size) {
      const { bytesRead } = await handle.read(buf, 0, Math.min(buf.length, node.size - done), done);
      if (bytesRead === 0) throw new AsbError('Internal', `/${entry.path} ended early while its layer was written`);
      await write(Buffer.from(buf.subarray(0, bytesRead)));
      done += bytesRead;
    }
    await write(padding(node.size));
  } finally {
    await handle.close();
  }
}
