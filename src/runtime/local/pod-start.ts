// Starting a pod (a first start, a wake, a fork from a snapshot): its image (a wake's kept bytes, or
// a pull by the container's policy), its address and id range, its disk, bundle and firewall
// chains, its memory checkpoint when one can be restored (pod-memory.ts, snapshot-fork.ts), then
// its shim through the launcher (pod-launch.ts), which reports the init's pid, or why it failed.
// Every await is followed by a check of `pod.generation`: a stop or remove meanwhile wins, and the
// events of an old shim never touch a new one. LocalRuntime.start() runs one at a time per pod.
import { chmod, chown, mkdir } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { AsbError, isAsbError } from '../../errors.ts';
import { isoNow } from '../../base/clock.ts';
import type { PullPolicy } from '../../images/image-store.ts';
import { DEFAULT_EGRESS_POLICY } from '../../network/egress-policy.ts';
import type { PodRequest, PodState } from '../runtime.ts';
import { discardCheckpoint, readRestoreStatus, withRestore } from './checkpoint.ts';
import { madeBeforeDisks } from './disk.ts';
import { claimIdRange } from './id-ranges.ts';
import { inSubnet } from './network.ts';
import { preparePod } from './oci-pod.ts';
import { launchPodInit } from './pod-launch.ts';
import { mainContainer } from './pod-process.ts';
import { mountsAt } from './reclaim.ts';
import { processStartTime, readExitStatus, type PersistedImage } from './rootfs.ts';
import { decideRuntimeClass } from './runtime-class.ts';
import { readSnapshot, type SnapshotMeta } from './snapshots.ts';
import { ROOT_ID_MAP, type IdRange } from '../oci/spec.ts';
import { dropCheckpoint, restorePlan } from './pod-memory.ts';
import { endOrphanedInit, onLauncherLost, pollExit, podExited, podRunning } from './pod-run.ts';
import { copySnapshotDisk, snapshotImage, snapshotRestorePlan } from './snapshot-fork.ts';
import { exists } from '../../base/exists.ts';
import { lastLine, MOUNT_ROOT, persist, signal, type Pod, type RuntimeContext } from './runtime-context.ts';

/** The image of a container that names none (`image:` empty, as kubernetes-sigs' getting-started example). */
export const DEFAULT_IMAGE = 'agent-sandbox/base';

/**
 * One start of the pod (LocalRuntime.start() runs one at a time per pod). `discardMemory`: from its
 * files, a kept checkpoint deleted (E2B's reboot). What stops a start is mostly answered as the
 * pod's state, Failed with a reason (`fail`).
 */
export async function startPod(ctx: RuntimeContext, pod: Pod, req: PodRequest, discardMemory = false): Promise<PodState> {
  // A new shim only once the last one has deleted its container and unmounted the disk.
  await pod.teardown;
  const generation = ++pod.generation;
  pod.stopping = false;
  pod.pendingExit = undefined;
  const fail = (message: string, reason?: string): PodState => {
    pod.state = { phase: 'Failed', ready: false, message };
    if (reason !== undefined) pod.state.reason = reason;
    if (pod.persisted !== undefined) pod.state.ip = pod.persisted.ip;
    ctx.emit(pod.id);
    return { ...pod.state };
  };
  if (ctx.unavailable !== undefined) return fail(`this worker runs no sandboxes: ${ctx.unavailable}`, 'RuntimeUnavailable');
  const runtimeClass = decideRuntimeClass(req.spec.runtimeClassName, ctx.runscUnavailable);
  if (!runtimeClass.ok) return fail(runtimeClass.message, runtimeClass.reason);
  const container = mainContainer(req.spec);
  pod.state = { phase: 'Pending', ready: false };
  ctx.emit(pod.id);
  // No Secret objects here (README, "Pull credentials"): the worker's credentials are used, and
  // the kubelet likewise pulls without a named secret it cannot find, with a warning.
  if (Array.isArray(req.spec.imagePullSecrets) && req.spec.imagePullSecrets.length > 0) {
    ctx.log.warn({ id: pod.id, imagePullSecrets: req.spec.imagePullSecrets }, 'imagePullSecrets are not read by the local runtime: the worker\'s --registries credentials are used');
  }
  // A new pod from a snapshot: the snapshot's image bytes, disk and (below) memory.
  let snap: SnapshotMeta | undefined;
  if (req.from !== undefined && pod.persisted === undefined) {
    try {
      snap = await readSnapshot(ctx.opts.root, req.from.snapshot);
    } catch (err) {
      return fail(err instanceof Error ? err.message : String(err), 'SnapshotUnavailable');
    }
  }
  let image: PersistedImage;
  try {
    image = snap === undefined ? await podImage(ctx, pod, container.image || (ctx.opts.defaultImage ?? DEFAULT_IMAGE), pullPolicy(container.imagePullPolicy)) : await snapshotImage(ctx, pod, snap);
  } catch (err) {
    if (pod.generation !== generation) return { ...pod.state };
    return fail(err instanceof Error ? err.message : String(err), snap === undefined ? 'ErrImagePull' : 'SnapshotUnavailable');
  }
  if (pod.generation !== generation) return { ...pod.state };
  const net = await ctx.net.forStart();
  const kept = pod.persisted?.ip;
  // Kept across hibernation, unless it lies outside this bridge's subnet (hibernated before the
  // subnet changed: state from before subnets were per state dir, or another ASB_SUBNET). It
  // could not be reached there, so the pod gets a new address.
  const moved = kept !== undefined && !inSubnet(kept, ctx.net.subnet);
  if (moved) ctx.log.warn({ id: pod.id, ip: kept, subnet: ctx.net.subnet.cidr }, 'pod address is outside the subnet: it gets a new one');
  const ip = kept !== undefined && !moved ? kept : ctx.net.ips.allocate();
  // A request without a policy keeps the one the pod had (a wake), else the default.
  const egress = req.egress ?? pod.persisted?.request.egress ?? DEFAULT_EGRESS_POLICY;
  // A runc pod restored from memory (a snapshot's, or its own checkpoint) runs in the user
  // namespace CRIU makes, as when it was saved: its bundle must be a checkpointable one.
  const restoresMemory = snap === undefined ? pod.checkpoint?.criuVersion !== undefined && !discardMemory : snap.memory;
  req = { ...req, egress, ...(restoresMemory && runtimeClass.kind === 'runc' ? { checkpointable: true } : {}) };
  let idRange: IdRange;
  try {
    idRange = await podIdRange(ctx, pod);
  } catch (err) {
    return fail(err instanceof Error ? err.message : String(err), isAsbError(err, 'Conflict') ? 'CreateContainerConfigError' : 'RuntimeUnavailable');
  }
  pod.persisted = { request: req, ip, image, idRange };
  // A runc fork's own copy of the snapshot's memory image is made while its disk is (they share nothing).
  const forkPlan = snap !== undefined && runtimeClass.kind === 'runc' ? snapshotRestorePlan(ctx, pod, snap, 'runc') : undefined;
  let shimArgs: string[];
  try {
    await mkdir(pod.paths.dir, { recursive: true, mode: 0o700 });
    await ensureMountRoot(ctx);
    if (snap !== undefined) await copySnapshotDisk(ctx, pod, snap);
    const prepared = await preparePod(ctx.host, pod.paths, req, { rootfs: image.rootfs, config: image.config }, net ? { ip, prefix: ctx.net.subnet.prefix, gateway: ctx.net.subnet.gateway } : undefined, runtimeClass.kind, idRange);
    shimArgs = prepared.shimArgs;
    pod.identity = prepared.identity;
    // The copied disk's files are the source pod's: they become this pod's (its own host ids).
    const disk = pod.paths.disk;
    if (snap !== undefined && disk !== undefined && snap.idRange.hostId !== idRange.hostId) {
      await ctx.host.disk.shift(disk.mount, snap.idRange.hostId, idRange.hostId, Math.min(snap.idRange.size, idRange.size));
    }
    await persist(pod);
  } catch (err) {
    ctx.log.warn({ err, id: pod.id }, 'cannot prepare pod');
    if (forkPlan !== undefined) await forkPlan.then(() => discardCheckpoint(pod.paths.checkpoint));
    const invalid = err instanceof AsbError && err.code === 'Invalid';
    return fail(`cannot prepare pod: ${err instanceof Error ? err.message : String(err)}`, invalid ? 'CreateContainerConfigError' : undefined);
  }
  // Asked to start from its files (E2B's reboot): a kept checkpoint is deleted, not restored.
  if (discardMemory && snap === undefined && pod.checkpoint !== undefined) {
    await dropCheckpoint(ctx, pod);
    pod.keptAgent?.end();
    pod.keptAgent = undefined;
  }
  // A pod stopped with memory wakes from its checkpoint when the image can still be restored, else from its files, saying why.
  const restore: { from?: string; shared?: boolean; failure?: string } = await (forkPlan ?? (snap === undefined ? restorePlan(ctx, pod, runtimeClass.kind) : snapshotRestorePlan(ctx, pod, snap, runtimeClass.kind)));
  if (pod.generation !== generation) return { ...pod.state };
  if (restore.from !== undefined) shimArgs = withRestore(shimArgs, restore.from, restore.shared === true, runtimeClass.kind === 'runc' && 'binary' in ctx.criu ? dirname(ctx.criu.binary) : undefined);
  pod.lostLauncher = false;
  const nullNetnsSettled = ctx.nullNetns.single; // before runsc looks for its pin (unstackNullNetns)
  const launcherLost = (): boolean => pod.lostLauncher === true; // set by the lost hook during the awaits
  pod.exited = new Promise((resolve) => (pod.markExited = resolve));
  const launch = launchPodInit(ctx.launcher, ctx.shim, shimArgs, {
    ...(net ? { attach: (pid: number) => Promise.all([ctx.net.firewall.apply(ctx.net.podNet(pod.id, ip, egress)), ctx.net.attachVeth(pid, ctx.net.veth(pod.id), ip)]).then(() => undefined) } : {}),
    exited: (code) => {
      if (pod.generation !== generation) return;
      // A shim exits after the pod's init, unless it was killed: then the init runs on,
      // reparented to the host's init, with nobody to end it or report it, and its mounts keep
      // the pod's teardown from finishing (found by make soak's kill -9 of a shim). It ends with
      // its shim: SIGKILL to the pod's pid 1, so the kernel ends the rest of its namespace.
      void endOrphanedInit(ctx, pod)
        .then(() => readExitStatus(pod.paths))
        .then((status) => {
          // The shim wrote the status before it exited: it also says whether the OOM killer struck.
          if (pod.generation === generation) podExited(ctx, pod, code, status?.reason);
        });
    },
    lost: () => {
      if (pod.generation === generation) onLauncherLost(ctx, pod);
    },
  });
  pod.shim = launch.child;
  const outcome = await launch.outcome;
  if (pod.generation !== generation) return { ...pod.state };
  if (!outcome.ok) {
    launch.child.kill('SIGKILL');
    // A lost launcher cannot kill: the pod's init is killed directly (its pid is fresh, seconds old).
    const initPid = launch.pid();
    if (launcherLost() && initPid !== undefined) signal(initPid, 'SIGKILL');
    // The shim's exit comes after this and would say only "exited with code 125": its own
    // message (runc's error) is the reason, so that event is for an older generation now.
    pod.generation++;
    // A restore that was tried is not tried twice (the sandbox may have run from it); one the
    // start never reached (the network set-up failed first) is kept for the next start.
    if (restore.from !== undefined && restore.shared !== true && (await readRestoreStatus(pod.paths.restoreStatus)) !== undefined) await dropCheckpoint(ctx, pod);
    return fail(outcome.message);
  }
  if (runtimeClass.kind === 'runsc') await unstackNullNetns(ctx, nullNetnsSettled);
  let restoreFailure = restore.failure;
  if (restore.from !== undefined) {
    const status = await readRestoreStatus(pod.paths.restoreStatus);
    if (status?.restored !== true) restoreFailure = `${runtimeClass.kind === 'runsc' ? 'runsc' : 'CRIU'} could not restore the memory checkpoint, so the pod started from its files: ${status?.reason ?? 'the shim said nothing of the restore'}`;
    // Its memory now lives in the running sandbox: a stale image must never be restored again
    // (a snapshot's is kept: it is the snapshot's, for every pod started from it).
    if (restore.shared !== true) await dropCheckpoint(ctx, pod);
  }
  if (restoreFailure !== undefined) ctx.log.warn({ id: pod.id, reason: restoreFailure }, 'the pod\'s memory checkpoint was not restored');
  if (restore.from === undefined || restoreFailure !== undefined) {
    // Started from its files: the processes of the kept handles are gone.
    pod.keptAgent?.end();
    pod.keptAgent = undefined;
  }
  launch.child.closeStdin();
  launch.child.unref();
  const startedAt = isoNow(ctx.clock);
  const pidStart = await processStartTime(outcome.pid);
  if (pod.generation !== generation) return { ...pod.state };
  pod.persisted = { request: req, ip, image, idRange, pid: outcome.pid, pidStart: pidStart ?? 'gone', startedAt, ...(restoreFailure === undefined ? {} : { restoreFailure }) };
  podRunning(ctx, pod, outcome.pid, startedAt);
  // The container may have ended already (a command that exits at once).
  const early = pod.pendingExit as number | undefined; // set by the exit event during the awaits
  if (early !== undefined) podExited(ctx, pod, early);
  else if (launcherLost()) pollExit(ctx, pod, outcome.pid, pod.persisted.pidStart ?? 'gone');
  if (pod.target !== undefined) await persist(pod);
  return { ...pod.state };
}

/**
 * The image a start runs: a wake reuses the bytes the pod first ran (the tag may have moved
 * since, and a hibernated sandbox must wake as it was), else a pull by the container's policy.
 */
async function podImage(ctx: RuntimeContext, pod: Pod, image: string, policy: PullPolicy | undefined): Promise<PersistedImage> {
  const kept = pod.persisted?.image;
  // Pinned before it is looked up, in a pod dir that exists (the pin's validity): the cache's
  // GC, in this process or another sharing the cache, then never removes it under this pod.
  await mkdir(pod.paths.dir, { recursive: true, mode: 0o700 });
  await ctx.images.pin(pod.paths.dir, { reference: image, rootfs: kept?.reference === image ? kept.rootfs : undefined });
  if (kept !== undefined && kept.reference === image && (await exists(kept.rootfs))) return kept;
  const pulled = await ctx.images.pull(image, { idMap: ROOT_ID_MAP, ...(policy === undefined ? {} : { policy }) });
  // The tree itself too: the reference's record may later name other bytes (its tag moved).
  await ctx.images.pin(pod.paths.dir, { reference: image, rootfs: pulled.rootfs });
  return { reference: image, manifestDigest: pulled.manifestDigest, rootfs: pulled.rootfs, config: pulled.config };
}

/**
 * The pod's host id range: the one it has had since it was made (recover checked the pool),
 * ROOT_ID_MAP for a pod made before ranges (its files are owned by that one), else one claimed
 * for it now.
 */
async function podIdRange(ctx: RuntimeContext, pod: Pod): Promise<IdRange> {
  if (pod.rangeConflict !== undefined) throw new AsbError('Conflict', pod.rangeConflict);
  const kept = pod.persisted?.idRange;
  if (kept !== undefined) return kept;
  if (pod.persisted !== undefined) return ROOT_ID_MAP;
  if (await madeBeforeDisks(pod.paths.dir)) return ROOT_ID_MAP;
  return claimIdRange(ctx.idRangesDir, pod.paths.dir);
}

/** The mount points' parent, made once: each pod's directory in it is walkable by that pod's root only (oci-pod.ts). */
function ensureMountRoot(ctx: RuntimeContext): Promise<void> {
  ctx.mountRootReady ??= (async () => {
    await mkdir(ctx.host.mountRoot, { recursive: true, mode: 0o711 });
    await chown(ctx.host.mountRoot, 0, 0);
    await chmod(ctx.host.mountRoot, 0o711);
    // /run/asb may exist already (network claims), made before with a private mode.
    if (ctx.host.mountRoot.startsWith(`${MOUNT_ROOT}/`)) await Promise.all([chmod(MOUNT_ROOT, 0o711), chmod(resolve(MOUNT_ROOT, '..'), 0o711)]);
  })();
  return ctx.mountRootReady;
}

/**
 * Leaves one of the null-netns mounts concurrent first gVisor starts stack in the runsc root (runsc
 * pins one per cold start that found none; 1 → 5 over one run before this): the others pin the
 * same kind of empty namespace, and each gofer joins the top one when it starts, so taking the
 * extra ones away changes nothing for a running sandbox. One at a time; not for a start launched
 * once one was all there was (`settled`): mountinfo grows with every pod, and that start found the
 * pin and made none.
 */
function unstackNullNetns(ctx: RuntimeContext, settled: boolean): Promise<void> {
  const root = ctx.host.runsc?.root;
  if (root === undefined || settled) return Promise.resolve();
  const path = join(root, 'null-netns');
  ctx.nullNetns.unstacking = ctx.nullNetns.unstacking.then(async () => {
    let n = await mountsAt(path);
    for (; n > 1; n--) {
      const r = await ctx.launcher.run(['umount', '--lazy', path], '');
      if (r.code !== 0) throw new Error(`umount ${path}: ${lastLine(r.output)}`);
    }
    ctx.nullNetns.single = n === 1;
  }).catch((err: unknown) => ctx.log.warn({ err }, 'cannot unmount the null-netns mounts runsc stacked'));
  return ctx.nullNetns.unstacking;
}

/** Kubernetes' imagePullPolicy; anything else (absent, or a value validation let through) is the default rule. */
function pullPolicy(value: unknown): PullPolicy | undefined {
  return value === 'Always' || value === 'IfNotPresent' || value === 'Never' ? value : undefined;
}
