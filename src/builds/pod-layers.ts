// A step's layer taken from inside its build pod, for runtimes whose pods' disks this process
// cannot read (Kubernetes: the Pod's overlay is on a node, behind the kubelet). Before the first
// step and after each one, the pod lists its own root filesystem (GNU find: type, mode, owner,
// size, mtime, ctime, inode, links, path; the kernel's mounts /proc, /sys, /dev and the files the
// kubelet mounts are left out); what differs from the previous listing is the step's change. The
// pod's own tar archives the changed paths, streamed over the runtime's exec; this process reads
// that archive (tar-read.ts) and writes the layer with headers of its own (tar-header.ts):
// - only paths the listing named as changed are taken; any other entry is dropped;
// - only files, directories, symlinks, FIFOs and hardlinks to an earlier entry are kept;
// - a path gone since the last listing becomes a whiteout (its topmost gone directory only);
// - the archive may not pass the build's disk limit, nor a listing LISTING_MAX bytes.
// The pod is hostile: it can lie in its listing or its archive. That only shapes its own layer,
// which is the step's output anyway (as the upper dir is on the local runtime); what it cannot do
// is make this process read or write anything but that layer. Unlike the local runtime the disk is
// not frozen while it is read: a step's background process still writing then may leave a file
// half-written in the layer, which is its own template's loss.
import { posix } from 'node:path';
import { AsbError } from '../errors.ts';
import type { PodRuntime } from '../runtime/runtime.ts';
import { openLayerOutput, whiteoutHeader, type LayerBlob } from './layer-writer.ts';
import { padding, tarHeader, type TarType } from './tar-header.ts';
import { readTar } from './tar-read.ts';

/** The bytes of one listing at most: ~100 bytes an entry, so ~1 million entries (a full Debian with build tools has ~60,000), held as a map here. */
const LISTING_MAX = 128 * 2 ** 20;

/** Paths the kubelet and the kernel mount into every container: never the image's. */
const PRUNED = ['/proc', '/sys', '/dev', '/etc/hosts', '/etc/hostname', '/etc/resolv.conf', '/run/secrets', '/var/run/secrets'];

const LIST_SCRIPT = `
find / -maxdepth 0 -printf '' >/dev/null 2>&1 || { echo "the image has no GNU find (with -printf): a build on Kubernetes needs one to list what a step changed" >&2; exit 127; }
exec find / -xdev \\( ${PRUNED.map((p) => `-path ${p}`).join(' -o ')} \\) -prune -o -printf '%y %m %U %G %s %T@ %C@ %i %n %P\\0'
`;

const TAR_SCRIPT = `
tar --version 2>/dev/null | grep -q 'GNU tar' || { echo "the image has no GNU tar: a build on Kubernetes needs one to archive what a step changed" >&2; exit 127; }
tar -c -f - -C / --no-recursion --numeric-owner --null -T -
rc=$?
# 1: a file changed while it was read; what was read is archived.
[ "$rc" -le 1 ] || exit "$rc"
`;

/** Path → its listing line without the path (what a change is compared by); the type is its first letter. */
type Listing = Map<string, string>;

async function output(runtime: PodRuntime, pod: string, script: string, input: string | undefined, onStdout: (chunks: AsyncIterable<Buffer>) => Promise<void>, signal: AbortSignal): Promise<void> {
  const proc = await runtime.spawn(pod, { command: ['sh', '-c', script], user: 0, cwd: '/' });
  const kill = (): void => proc.kill('SIGKILL');
  signal.addEventListener('abort', kill, { once: true });
  const stderr: Buffer[] = [];
  let stderrBytes = 0;
  proc.stderr.on('data', (b: Buffer) => {
    if (stderrBytes < 4096) stderr.push(b);
    stderrBytes += b.length;
  });
  try {
    proc.stdin.end(input ?? '');
    let failure: Error | undefined;
    await onStdout(proc.stdout as AsyncIterable<Buffer>).catch((err: unknown) => {
      failure = err instanceof Error ? err : new AsbError('Internal', 'reading the build sandbox\'s output failed');
      kill();
      proc.stdout.resume();
    });
    const exited = await proc.exited;
    signal.throwIfAborted();
    if (failure !== undefined) throw failure;
    if (exited.exitCode !== 0) throw new AsbError('BuildFailed', `reading the step's files in the build sandbox failed (exit code ${String(exited.exitCode)}): ${Buffer.concat(stderr).toString('utf8').trim().slice(0, 1000)}`);
  } finally {
    signal.removeEventListener('abort', kill);
  }
}

async function list(runtime: PodRuntime, pod: string, signal: AbortSignal): Promise<Listing> {
  const entries: Listing = new Map();
  await output(runtime, pod, LIST_SCRIPT, undefined, async (chunks) => {
    let partial: Buffer = Buffer.alloc(0);
    let total = 0;
    for await (const chunk of chunks) {
      total += chunk.length;
      if (total > LISTING_MAX) throw new AsbError('BuildFailed', `the build sandbox's file listing passed ${String(LISTING_MAX / 2 ** 20)} MiB`);
      partial = partial.length === 0 ? chunk : Buffer.concat([partial, chunk]);
      let at = 0;
      for (let nul = partial.indexOf(0, at); nul !== -1; nul = partial.indexOf(0, at)) {
        const line = partial.subarray(at, nul).toString('utf8');
        at = nul + 1;
        // Nine fields, then the path (which may hold spaces); the start point has an empty path.
        let cut = -1;
        for (let i = 0; i < 9; i++) {
          cut = line.indexOf(' ', cut + 1);
          if (cut === -1) break;
        }
        if (cut === -1) continue;
        const path = line.slice(cut + 1);
        if (path !== '') entries.set(path, line.slice(0, cut));
      }
      partial = partial.subarray(at);
    }
  }, signal);
  return entries;
}

/** A pod's changes, one step at a time. */
export interface PodLayers {
  /** The layer of what changed since the last call (or since open); undefined when nothing did. */
  next(blobsDir: string, diskBytes: number, signal: AbortSignal): Promise<LayerBlob | undefined>;
}

const TYPES: Record<string, TarType> = { '0': 'file', '7': 'file', '1': 'hardlink', '2': 'symlink', '5': 'dir', '6': 'fifo' };

/** Lists the pod's files now (the base the first step's changes are taken against). */
export async function openPodLayers(runtime: PodRuntime, pod: string, signal: AbortSignal): Promise<PodLayers> {
  let before = await list(runtime, pod, signal);
  return {
    async next(blobsDir, diskBytes, signal2) {
      const after = await list(runtime, pod, signal2);
      const changed = [...after.keys()].filter((p) => after.get(p) !== before.get(p)).sort();
      const isDir = (l: Listing, p: string): boolean => l.get(p)?.startsWith('d ') === true;
      // Gone: whiteout the topmost only (a gone directory's entries go with it). A path whose
      // parent is now something else than a directory went with that replacement.
      const gone = [...before.keys()].filter((p) => !after.has(p) && (posix.dirname(p) === '.' || (isDir(after, posix.dirname(p)) && isDir(before, posix.dirname(p))))).sort();
      before = after;
      if (changed.length === 0 && gone.length === 0) return undefined;
      const wanted = new Set(changed);
      const layer = await openLayerOutput(blobsDir);
      try {
        const written = new Set<string>();
        let bytes = 0;
        if (changed.length > 0) {
          await output(runtime, pod, TAR_SCRIPT, changed.map((p) => `${p}\0`).join(''), (chunks) => readTar(chunks, async (entry, content) => {
            const path = entry.path.replace(/^(\.\/)+/, '').replace(/\/+$/, '');
            const type = TYPES[entry.typeFlag];
            if (type === undefined || !wanted.has(path) || written.has(path)) return;
            const linkname = type === 'hardlink' ? entry.linkname.replace(/^(\.\/)+/, '') : entry.linkname;
            if (type === 'hardlink' && !written.has(linkname)) return;
            bytes += entry.size;
            if (bytes > diskBytes) throw new AsbError('BuildFailed', `the step's files passed the build's disk limit of ${String(Math.round(diskBytes / 2 ** 20))} MiB`);
            written.add(path);
            const base = { path, type, mode: entry.mode & 0o7777, uid: entry.uid, gid: entry.gid, mtime: entry.mtime };
            if (type === 'file') {
              await layer.write(tarHeader({ ...base, size: entry.size }));
              await content(layer.write);
              await layer.write(padding(entry.size));
            } else {
              await layer.write(tarHeader({ ...base, size: 0, ...(type === 'symlink' || type === 'hardlink' ? { linkname } : {}) }));
            }
          }), signal2);
        }
        for (const p of gone) await layer.write(whiteoutHeader(p));
        return await layer.finish();
      } catch (err) {
        await layer.abort();
        throw err;
      }
    },
  };
}
