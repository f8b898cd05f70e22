// Snapshots and forks: a snapshot keeps a pod's files (its disk image, copied while frozen) and,
// with `memory`, its memory and processes (pod-memory.ts' save), under the runtime's state dir
// (snapshots.ts is their format); a fork is a new pod started from one: the snapshot's image bytes,
// its own sparse copy of the disk with the files moved to the new pod's id range, and its memory
// restored when the snapshot kept some and this worker's runsc or CRIU can restore it.
import { chmod, chown, copyFile, link, mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { AsbError } from '../../errors.ts';
import { isoNow } from '../../base/clock.ts';
import type { SnapshotInfo } from '../runtime.ts';
import { discardCheckpoint, makeDurable, type CheckpointCheck } from './checkpoint.ts';
import { remapUsernsImage, USERNS_IMAGE } from './criu-userns.ts';
import { madeBeforeDisks } from './disk.ts';
import type { PersistedImage } from './rootfs.ts';
import { makePartial, sealSnapshot, snapshotPaths, specDifference, type SnapshotMeta } from './snapshots.ts';
import { ROOT_ID_MAP, type OciSpec } from '../oci/spec.ts';
import { canSaveMemory, checkImage, oneSaveAtATime, resumePaused, savePaused } from './pod-memory.ts';
import { exists } from '../../base/exists.ts';
import { lastLine, type Pod, type RuntimeContext } from './runtime-context.ts';

/**
 * A pod started from a snapshot restores the snapshot's memory when it kept some, on gVisor,
 * made by this runsc, and when the pod's new config.json matches the snapshot's wherever runsc
 * compares except the id maps (specDifference): runsc only warns about those (`shared`).
 */
export async function snapshotRestorePlan(ctx: RuntimeContext, pod: Pod, snap: SnapshotMeta, kind: 'runc' | 'runsc'): Promise<{ from?: string; shared?: boolean; failure?: string }> {
  if (!snap.memory) return {};
  const paths = snapshotPaths(ctx.opts.root, snap.id);
  let failure: string;
  if (kind !== 'runsc') {
    const check = await snapshotMemoryCheck(ctx, snap, 'runc');
    if (check.ok) {
      try {
        await ownCopyOfImage(ctx, pod, paths.memory, snap.idRange.hostId);
        return { from: pod.paths.checkpoint };
      } catch (err) {
        await discardCheckpoint(pod.paths.checkpoint);
        failure = err instanceof Error ? err.message : String(err);
      }
    } else {
      failure = check.reason;
    }
  } else {
    const check = await snapshotMemoryCheck(ctx, snap, 'runsc');
    const [saved, fresh] = await Promise.all([readFile(paths.config, 'utf8'), readFile(join(pod.paths.dir, 'config.json'), 'utf8')]);
    const differs = specDifference(JSON.parse(saved) as OciSpec, JSON.parse(fresh) as OciSpec);
    if (check.ok && differs === undefined) return { from: paths.memory, shared: true };
    failure = check.ok ? `the pod's ${differs ?? ''} differs from the snapshot's` : check.reason;
  }
  return { failure: `the snapshot's memory cannot be restored, so the pod started from its files: ${failure}` };
}

/**
 * verifyCheckpoint of a snapshot's memory image, run once per snapshot while it passes: its files
 * never change once sealed (root's, in the runtime's 0700 state dir), and hashing them for each of
 * ten forks at once cost ~0.1 s of each fork's start. A failed check is not kept (the tool may run later).
 */
function snapshotMemoryCheck(ctx: RuntimeContext, snap: SnapshotMeta, kind: 'runc' | 'runsc'): Promise<CheckpointCheck> {
  const key = `${snap.id}@${snap.at}`;
  const kept = ctx.snapshotsChecked.get(key);
  if (kept !== undefined) return kept;
  const check = checkImage(ctx, snapshotPaths(ctx.opts.root, snap.id).memory, kind);
  ctx.snapshotsChecked.set(key, check);
  void check.then((c) => {
    if (!c.ok && ctx.snapshotsChecked.get(key) === check) ctx.snapshotsChecked.delete(key);
  });
  return check;
}

/**
 * A runc pod's own copy of a snapshot's CRIU image, as its checkpoint (deleted once restored):
 * the files hard-linked (CRIU only reads them), except the user namespace's map, moved to the
 * pod's own host id range (criu-userns.ts says why); the directory root:<pod's root group> 0750
 * like a checkpoint of its own (savePaused).
 */
async function ownCopyOfImage(ctx: RuntimeContext, pod: Pod, from: string, fromHostId: number): Promise<void> {
  const to = pod.persisted?.idRange?.hostId ?? ROOT_ID_MAP.hostId;
  const dir = pod.paths.checkpoint;
  await discardCheckpoint(dir);
  await mkdir(dir, { mode: 0o750 });
  await chown(dir, 0, to);
  await chmod(dir, 0o750);
  for (const name of await readdir(from)) {
    if (USERNS_IMAGE.test(name)) await writeFile(join(dir, name), remapUsernsImage(await readFile(join(from, name)), fromHostId, to), { mode: 0o644 });
    else await link(join(from, name), join(dir, name)).catch(() => copyFile(join(from, name), join(dir, name)));
  }
}

/** The snapshot's image tree, pinned for this pod: it must still be in the cache (the snapshot pins it). */
export async function snapshotImage(ctx: RuntimeContext, pod: Pod, snap: SnapshotMeta): Promise<PersistedImage> {
  await mkdir(pod.paths.dir, { recursive: true, mode: 0o700 });
  await ctx.images.pin(pod.paths.dir, { reference: snap.image.reference, rootfs: snap.image.rootfs });
  if (!(await exists(snap.image.rootfs))) throw new AsbError('NotFound', `the image of snapshot "${snap.id}" (${snap.image.reference}) is no longer in the image cache`);
  return snap.image;
}

/** The snapshot's disk becomes the new pod's (a sparse copy), and its config the pod's first (it carries the init's token). */
export async function copySnapshotDisk(ctx: RuntimeContext, pod: Pod, snap: SnapshotMeta): Promise<void> {
  const paths = snapshotPaths(ctx.opts.root, snap.id);
  const disk = pod.paths.disk;
  if (disk === undefined) throw new AsbError('Internal', `pod ${pod.id} has no disk to copy the snapshot into`);
  await ctx.host.disk.copy(paths.disk, disk.image);
  await copyFile(paths.config, join(pod.paths.dir, 'config.json'));
}

/**
 * Keeps the pod's files, and with `memory` its memory and processes, as a snapshot (snapshots.ts).
 * A running pod is paused (gVisor) or frozen (runc) for the save, its disk copied meanwhile, then
 * goes on; for files only its disk is frozen for the copy; a pod stopped with its memory gives its
 * checkpoint. One at a time per pod, like a stop with memory.
 */
export async function takeSnapshot(ctx: RuntimeContext, id: string, snapshotId: string, opts: { memory: boolean }): Promise<SnapshotInfo> {
  const pod = ctx.pods.get(id);
  if (pod?.persisted === undefined) throw new AsbError('NotFound', `pod ${id} not found`);
  const paths = snapshotPaths(ctx.opts.root, snapshotId);
  if (await exists(paths.dir)) throw new AsbError('Conflict', `snapshot "${snapshotId}" exists already`);
  await pod.starting?.catch(() => undefined);
  await pod.teardown;
  const meta = await oneSaveAtATime(ctx, pod, () => saveSnapshot(ctx, pod, snapshotId, opts.memory));
  return { id: meta.id, memory: meta.memory, bytes: meta.bytes, memoryBytes: meta.memoryBytes, at: meta.at };
}

async function saveSnapshot(ctx: RuntimeContext, pod: Pod, snapshotId: string, memory: boolean): Promise<SnapshotMeta> {
  const persisted = pod.persisted;
  const disk = pod.paths.disk;
  if (persisted?.image === undefined || persisted.idRange === undefined || disk === undefined || (await madeBeforeDisks(pod.paths.dir))) {
    throw new AsbError('NotImplemented', `pod ${pod.id} was made before pods had disks of their own and id ranges: it cannot be snapshotted; recreate it`);
  }
  const paths = snapshotPaths(ctx.opts.root, snapshotId);
  await makePartial(paths);
  try {
    let memoryBytes = 0;
    const target = pod.target;
    if (target === undefined) {
      if (memory && pod.checkpoint === undefined) throw new AsbError('SandboxNotRunning', `pod ${pod.id} is not running and was not stopped with its memory: there is no memory to keep (snapshot its files only)`);
      if (memory) {
        await ctx.launcher.run(['cp', '-a', pod.paths.checkpoint, join(paths.partial, 'memory')], '').then(({ code, output }) => {
          if (code !== 0) throw new AsbError('Internal', `cannot copy the pod's memory image: ${lastLine(output)}`);
        });
        memoryBytes = pod.checkpoint?.bytes ?? 0;
      }
      await ctx.host.disk.copy(disk.image, join(paths.partial, 'disk.img'));
    } else {
      if (memory) canSaveMemory(ctx, pod, target, 'snapshot');
      // A running sandbox's disk is frozen for the copy; a paused one writes nothing, and a sync
      // puts its writes on the image (pod-disk.c: a freeze cost ~50 ms more of the pause).
      const copyDisk = (quiesce: 'freeze' | 'sync'): Promise<void> => ctx.host.disk.copy(disk.image, join(paths.partial, 'disk.img'), { dir: disk.mount, quiesce });
      if (!memory) {
        await copyDisk('freeze');
      } else {
        // The disk is copied while the sandbox is paused, so its files match its memory: on runc
        // while CRIU dumps (CRIU writes nothing to the pod's disk; that saved ~50 ms of a fork);
        // on gVisor while the image is sealed, after runsc's save (savePaused).
        const failed = (why: string): AsbError => new AsbError('CheckpointFailed', `pod ${pod.id}'s memory was not saved for its snapshot, it keeps running: ${why}`);
        memoryBytes = (await savePaused(ctx, pod, target, paths.memoryPartial, join(paths.partial, 'memory'), failed, undefined, () => copyDisk('sync'))).bytes;
        await resumePaused(ctx, pod, target);
      }
    }
    await copyFile(join(pod.paths.dir, 'config.json'), join(paths.partial, 'config.json'));
    const diskBytes = (await stat(join(paths.partial, 'disk.img'))).blocks * 512;
    const meta: SnapshotMeta = {
      id: snapshotId, source: pod.id, request: persisted.request, image: persisted.image, idRange: persisted.idRange,
      memory, bytes: diskBytes + memoryBytes, memoryBytes, at: isoNow(ctx.clock),
    };
    await sealSnapshot(paths, meta);
    await ctx.images.pin(paths.dir, { reference: persisted.image.reference, rootfs: persisted.image.rootfs });
    // Its bytes reach the disk after it is acknowledged, as a stop's do (checkpoint.ts).
    const durable = (memory ? makeDurable(join(paths.dir, 'memory')) : Promise.resolve()).then(() => makeDurable(paths.dir));
    // A delete right after waits for it: its mark written into a directory being deleted made the
    // delete fail with ENOTEMPTY (a snapshot deleted right after a remove, 2 runs in 5 under load).
    ctx.snapshotsSettling.set(snapshotId, durable);
    void durable.then(() => {
      if (ctx.snapshotsSettling.get(snapshotId) === durable) ctx.snapshotsSettling.delete(snapshotId);
    });
    ctx.log.info({ id: pod.id, snapshot: snapshotId, memory, bytes: meta.bytes }, 'snapshot taken');
    return meta;
  } catch (err) {
    await rm(paths.partial, { recursive: true, force: true });
    throw err;
  }
}

/** Deletes a snapshot and its pin on the image; idempotent. */
export async function deleteSnapshot(ctx: RuntimeContext, snapshotId: string): Promise<void> {
  const paths = snapshotPaths(ctx.opts.root, snapshotId);
  await ctx.snapshotsSettling.get(snapshotId);
  // After the wait: a fork meanwhile may have checked the image again, and its check must go too.
  for (const key of ctx.snapshotsChecked.keys()) if (key.startsWith(`${snapshotId}@`)) ctx.snapshotsChecked.delete(key);
  await rm(paths.dir, { recursive: true, force: true });
  await ctx.images.unpin(paths.dir);
}
