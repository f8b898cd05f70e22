// A pod's memory checkpoint on disk: what stop(id, { memory: true }) keeps and the next start
// restores (pod-memory.ts drives it, oci-shim.c -C restores it). gVisor's is runsc's image
// (runsc.ts has the commands); runc's is CRIU's (`runc checkpoint`, docs/criu.md), whose directory
// is root's with the pod's root group (its range's first host id), 0750: CRIU's restored tasks open
// image files from inside the pod's user namespace, first as host root without capabilities there
// (owner), then as the namespace's root (group); with the directory the pod's own (0700), 1 restore
// in 2 failed "Unable to open timens-0.img: Permission denied". The pod dir above keeps everyone else out.
//
// Where it lives: <pod>/checkpoint/, in the pod's private state dir (0700), on the worker's disk,
// NOT on the pod's own disk (<pod>/disk, the ext4 image of its ephemeral-storage). The pod disk is
// mounted only while the sandbox runs and the shim unmounts it the moment the sandbox ends, which
// is the moment the save finishes: sealing the image there (fsync, checksum, rename) would race that
// unmount or need a second mount of the disk, and a save that fills the pod disk would trip the
// shim's eviction watchdog (two full checks in a row kill the pod as Evicted) instead of leaving the
// pod running. The image still counts against the pod's ephemeral-storage: the runtime refuses a
// save when the disk's used bytes plus the sandbox's memory (what the image will hold, ~1:1: a
// python3 holding 256 MiB made a 259 MB image) would pass the limit, and checks again with the
// image's real size once written (checkpointRoom). remove() deletes the pod dir, and the image with it.
//
// The image is written to checkpoint.partial/ and becomes checkpoint/ once the metadata
// (asb-checkpoint.json: runsc or CRIU version, bytes, when, the host's boot id, each file's size,
// and the sha256 of the small files) is written beside them, by one rename: a worker killed in
// between leaves either a whole image or a partial one that recover() deletes. The save is
// acknowledged then, and the bytes reach the disk after it (makeDurable: every file fsync'd, then
// the durable mark): fsync of a 1 GiB CRIU image took ~0.4 s here, as long as CRIU's dump itself.
// Nothing is lost to a kill -9 of any process of ours meanwhile (the bytes are in the page cache);
// only a host crash in that second can lose them, and then the boot id differs and the mark is
// missing, so verifyCheckpoint refuses the image and the pod starts from its files, saying why.
// A truncated image (google/gvisor#14229: near ENOSPC runsc truncated the pages file and still
// exited 0) is refused at the save by the free space left after it, and at a restore by the size
// list. The pages file (the application's memory, ~all of the bytes) is checked by size only:
// sha256 runs at 1.6 GB/s here, so hashing it would add ~0.65 s per GiB to each of the save and the
// restore, more than the save itself; the kernel's state and the pages' index, where damage panics
// a restore, are hashed.
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { open, readdir, readFile, rename, rm, stat, statfs, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';

export const CHECKPOINT_META = 'asb-checkpoint.json';
/** Written into an image once every file of it is on the disk (makeDurable). */
export const DURABLE_MARK = 'asb-durable';
/** The files of application memory, runsc's and CRIU's (pages-<n>.img): checked by size only (see the top). */
const PAGES_FILE = /^pages(-\d+)?\.img$/;
/** Fewer free bytes than this after a save is a save that may have met ENOSPC (the shim's full-disk mark, oci-shim.c). */
export const MIN_FREE_AFTER_SAVE_BYTES = 1 << 20;

export interface CheckpointFile {
  name: string;
  bytes: number;
  sha256?: string;
}

export interface CheckpointMeta {
  /** gVisor's image: runsc refuses one of another version (its own metadata, checked only once the restore runs). */
  runscVersion?: string;
  /** runc's image: the CRIU version that made it (CRIU's image format changes between versions). */
  criuVersion?: string;
  bytes: number;
  /** When the save finished (ISO 8601). */
  at: string;
  /** The host's boot id at the save: after a restart an image without DURABLE_MARK may have lost bytes. */
  bootId?: string;
  files: CheckpointFile[];
}

export type CheckpointCheck = { ok: true; meta: CheckpointMeta } | { ok: false; reason: string };

/** What made an image: runsc (gVisor pods) or CRIU (runc pods), and its version. */
export type CheckpointMaker = { runsc: string } | { criu: string };

function makerOf(maker: CheckpointMaker): Pick<CheckpointMeta, 'runscVersion' | 'criuVersion'> {
  return 'runsc' in maker ? { runscVersion: maker.runsc } : { criuVersion: maker.criu };
}

/**
 * Makes a written image whole: every file described, then renamed to `dir` in one step. Its bytes
 * are not on the disk yet: makeDurable(dir) puts them there, after the save is acknowledged.
 */
export async function sealCheckpoint(partial: string, dir: string, maker: CheckpointMaker, at: string): Promise<CheckpointMeta> {
  const names = (await readdir(partial)).filter((name) => name !== CHECKPOINT_META).sort();
  const files = await Promise.all(names.map(async (name): Promise<CheckpointFile> => {
    const path = join(partial, name);
    const { size } = await stat(path);
    return PAGES_FILE.test(name) ? { name, bytes: size } : { name, bytes: size, sha256: await sha256(path) };
  }));
  const meta: CheckpointMeta = { ...makerOf(maker), bytes: files.reduce((sum, f) => sum + f.bytes, 0), at, bootId: await hostBootId(), files };
  await writeFile(join(partial, CHECKPOINT_META), JSON.stringify(meta), { mode: 0o600 });
  await rm(dir, { recursive: true, force: true });
  await rename(partial, dir);
  return meta;
}

/**
 * Puts the files of `dir` on the disk (fsync), then DURABLE_MARK beside them, and the directory's
 * entries. Never rejects: an image deleted meanwhile needs nothing, and one whose mark is missing
 * is refused only after a host restart (verifyCheckpoint).
 */
export async function makeDurable(dir: string): Promise<void> {
  try {
    // One at a time: each fsync holds one of libuv's four threads until the disk answers, and
    // all at once held every file operation of the worker (a wake waited ~0.3 s behind them).
    for (const entry of await readdir(dir, { withFileTypes: true })) {
      if (entry.isFile()) await fsyncPath(join(dir, entry.name));
    }
    await writeFile(join(dir, DURABLE_MARK), '', { mode: 0o600 });
    await fsyncPath(dir);
    await fsyncPath(dirname(dir));
  } catch {
    // Gone (restored, discarded or removed) before its bytes were synced: nothing to keep.
  }
}

let bootId: Promise<string> | undefined;

/** This boot's id (the kernel's random boot_id): it changes at every host restart. */
function hostBootId(): Promise<string> {
  bootId ??= readFile('/proc/sys/kernel/random/boot_id', 'utf8').then((id) => id.trim());
  return bootId;
}

/** The metadata of a sealed image, or undefined when there is none (or it cannot be read). */
export async function readCheckpointMeta(dir: string): Promise<CheckpointMeta | undefined> {
  try {
    const meta = JSON.parse(await readFile(join(dir, CHECKPOINT_META), 'utf8')) as Partial<CheckpointMeta>;
    if ((typeof meta.runscVersion !== 'string' && typeof meta.criuVersion !== 'string') || typeof meta.bytes !== 'number' || typeof meta.at !== 'string' || !Array.isArray(meta.files)) return undefined;
    return meta as CheckpointMeta;
  } catch {
    return undefined;
  }
}

/** Whether the image in `dir` can be given to `runsc restore` or (runc) CRIU of this version; the reason when not. */
export async function verifyCheckpoint(dir: string, maker: CheckpointMaker): Promise<CheckpointCheck> {
  const meta = await readCheckpointMeta(dir);
  if (meta === undefined) return { ok: false, reason: 'the checkpoint has no readable metadata' };
  if ('runsc' in maker && meta.runscVersion !== undefined && meta.runscVersion !== maker.runsc) return { ok: false, reason: `the checkpoint was made by runsc ${meta.runscVersion}, this worker runs ${maker.runsc}` };
  if ('criu' in maker && meta.criuVersion !== undefined && meta.criuVersion !== maker.criu) return { ok: false, reason: `the checkpoint was made by CRIU ${meta.criuVersion}, this worker runs CRIU ${maker.criu}` };
  if ('runsc' in maker ? meta.runscVersion === undefined : meta.criuVersion === undefined) {
    return { ok: false, reason: `the checkpoint was made ${meta.runscVersion === undefined ? 'by CRIU for runc' : 'by runsc for gVisor'}, and the pod now runs on ${'runsc' in maker ? 'gVisor' : 'runc'}` };
  }
  if (meta.bootId !== undefined && meta.bootId !== (await hostBootId()) && !(await stat(join(dir, DURABLE_MARK)).then(() => true, () => false))) {
    return { ok: false, reason: 'the host restarted before the checkpoint reached its disk, so its bytes may be lost' };
  }
  for (const file of meta.files) {
    const path = join(dir, file.name);
    const size = await stat(path).then((s) => s.size, () => undefined);
    if (size === undefined) return { ok: false, reason: `the checkpoint's ${file.name} is missing` };
    if (size !== file.bytes) return { ok: false, reason: `the checkpoint's ${file.name} has ${String(size)} bytes, ${String(file.bytes)} were written` };
    if (file.sha256 !== undefined && (await sha256(path)) !== file.sha256) return { ok: false, reason: `the checkpoint's ${file.name} is damaged (its sha256 differs)` };
  }
  return { ok: true, meta };
}

export interface RoomInput {
  /** The pod's ephemeral-storage limit (its disk's size); undefined for a pod without a disk (made before disks). */
  limitBytes: number | undefined;
  /** What the pod's disk holds now. */
  diskUsedBytes: number;
  /** What the image will hold (before the save: the sandbox's memory) or holds (after: its size). */
  imageBytes: number;
  /** Free bytes on the worker's disk where the image goes. */
  hostFreeBytes: number;
  /** Left free on the worker's disk whatever the image (before the save), or MIN_FREE_AFTER_SAVE_BYTES (after). */
  hostReserveBytes: number;
}

const mib = (bytes: number): string => `${(bytes / 2 ** 20).toFixed(1)} MiB`;

/** Whether an image fits the pod's ephemeral-storage and the worker's disk; the reason when it does not. */
export function checkpointRoom(input: RoomInput): { ok: true } | { ok: false; reason: string } {
  if (input.limitBytes !== undefined && input.diskUsedBytes + input.imageBytes > input.limitBytes) {
    return { ok: false, reason: `the memory checkpoint (${mib(input.imageBytes)}) and the sandbox's files (${mib(input.diskUsedBytes)}) would pass its ephemeral-storage limit of ${mib(input.limitBytes)}` };
  }
  if (input.hostFreeBytes - input.imageBytes < input.hostReserveBytes) {
    return { ok: false, reason: `the worker's disk has ${mib(input.hostFreeBytes)} free, too little for a memory checkpoint of ${mib(input.imageBytes)}` };
  }
  return { ok: true };
}

/** Free bytes (for an unprivileged writer) on the filesystem holding `path`. */
export async function freeBytes(path: string): Promise<number> {
  const fs = await statfs(path);
  return fs.bavail * fs.bsize;
}

export async function discardCheckpoint(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true });
}

/** Where discardCheckpointSoon puts an image until it is deleted: beside it, `<name>.discarded-<n>`. */
const DISCARDED = /\.discarded-[0-9a-f]+$/;

/**
 * Takes the image away from `dir` at once (a rename) and deletes it in the background: deleting a
 * 1 GiB image took ~0.2 s, which a wake would otherwise wait for. recover() calls
 * discardLeftovers for one a killed worker left.
 */
export async function discardCheckpointSoon(dir: string): Promise<void> {
  const away = `${dir}.discarded-${randomBytes(6).toString('hex')}`;
  try {
    await rename(dir, away);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  void rm(away, { recursive: true, force: true }).catch(() => undefined);
}

/** Deletes the images discardCheckpointSoon left in `podDir` (a worker killed before it finished). */
export async function discardLeftovers(podDir: string): Promise<void> {
  const names = await readdir(podDir).catch(() => []);
  await Promise.all(names.filter((n) => DISCARDED.test(n)).map((n) => rm(join(podDir, n), { recursive: true, force: true })));
}

async function fsyncPath(path: string): Promise<void> {
  const handle = await open(path, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

async function sha256(path: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

/** Bytes of the files in an image directory (before it is sealed). */
export async function imageBytes(dir: string): Promise<number> {
  const sizes = await Promise.all((await readdir(dir)).map(async (name) => (await stat(join(dir, name))).size));
  return sizes.reduce((sum, n) => sum + n, 0);
}

/**
 * The shim's argv with a restore from `dir` (oci-shim.c -C), placed before the runtime's global
 * flags (`--`); `criuDir` (runc) is put first on the PATH of runc's restore (-K).
 */
export function withRestore(shimArgs: readonly string[], dir: string, otherPod = false, criuDir?: string): string[] {
  const flags = shimArgs.indexOf('--');
  const own = flags < 0 ? [...shimArgs] : shimArgs.slice(0, flags);
  const global = flags < 0 ? [] : shimArgs.slice(flags + 1);
  // Another pod's image (a snapshot, a fork): its host id maps differ by design, and runsc's check
  // of them is relaxed to a warning; the runtime compared the rest first (snapshots.ts specDifference).
  if (otherPod) global.push('--restore-spec-validation=warning');
  return [...own, '-C', dir, ...(criuDir === undefined ? [] : ['-K', criuDir]), ...(global.length > 0 ? ['--', ...global] : [])];
}

/** What the shim wrote of a restore it tried (restore-status): undefined when it tried none. */
export async function readRestoreStatus(path: string): Promise<{ restored: true } | { restored: false; reason: string } | undefined> {
  const text = await readFile(path, 'utf8').catch(() => undefined);
  if (text === undefined) return undefined;
  const line = text.trim();
  if (line === 'restored') return { restored: true };
  return { restored: false, reason: line.replace(/^failed\s*/, '') || 'the runtime gave no reason' };
}
