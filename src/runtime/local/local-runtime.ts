// The local pod runtime: plays the kubelet's part on one machine. Each pod is an OCI container run
// by runc (issue 16): its image pulled from a registry into the image cache (src/images/), its
// rootfs an overlay of the cached tree under its own writable layer, a user namespace, seccomp, no
// capabilities and cgroup limits (src/runtime/oci/spec.ts, oci-pod.ts). oci-shim.c starts each
// pod and stays as its parent; the shims are forked by one long-lived launcher (launcher.c), so the
// worker never forks per pod. The writable layer and volumes are directories under the state dir
// (rootfs.ts), so stop() hibernates without losing a byte and start() wakes the same disk, the same
// image bytes and the same IP.
// Pods outlive the worker: their shims run in their own session, and a new runtime on the same
// root re-adopts every pod whose init is still alive (checked by pid AND start time).
// Without root, runc or the init binary, the runtime starts no pod and says why (README): it never
// runs a sandbox unisolated. A pod with runtimeClassName gvisor runs under gVisor's runsc instead
// of runc (runtime-class.ts), through the same shim, exec and terminal code; such a pod can also
// stop with its memory (stop(id, { memory: true }): a runsc checkpoint in its state dir,
// checkpoint.ts) and its next start resumes every process where it was. So can a runc pod started
// checkpointable (PodRequest.checkpointable: runc makes its user namespace and its stdio is pipes),
// through CRIU (`runc checkpoint` / `runc restore`, docs/criu.md).
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { chmod, chown, mkdir, readdir, rmdir } from 'node:fs/promises';
import { dirname, join, posix, resolve } from 'node:path';
import type { RootIsolation } from '../../api/pod-security.ts';
import { AsbError, isAsbError } from '../../errors.ts';
import { systemClock, isoNow } from '../../system/clock.ts';
import type { EgressCount, ExecRequest, ExecResult, FileEntry, PodProcess, PodRequest, PodRuntime, PodState, PodUsage, PtyOptions, PtySession, SnapshotInfo, SpawnRequest, StartOptions, StopOptions, WritableLayer } from '../runtime.ts';
import { DEFAULT_EGRESS_POLICY, type EgressPolicy, type EgressPolicySource } from '../../network/egress-policy.ts';
import { PodNetwork } from './pod-network.ts';
import { execInPod, type PodTarget } from './exec.ts';
import { spawnPodProcess } from './process.ts';
import { listPodDir, readPodFile, writePodFile } from './files.ts';
import { ensureInitBinary, ensureLauncherBinary, ensureShimBinary } from './init-binary.ts';
import { agentPty, agentRequest } from './agent.ts';
import { DEFAULT_PTY_COMMAND } from '../oci/pty.ts';
import { Launcher } from './launcher.ts';
import { inSubnet } from './network.ts';
import { mountsAt, removeMountDir } from './reclaim.ts';
import { launchPodInit } from './pod-launch.ts';
import { mainContainer } from './pod-process.ts';
import { limitParentPids, parentPidsLimit, removeParent } from './cgroup-parent.ts';
import { imageUsersCache, preparePod, type OciHost } from './oci-pod.ts';
import { diskTool, madeBeforeDisks } from './disk.ts';
import { discardCheckpoint, readRestoreStatus, withRestore } from './checkpoint.ts';
import { decideRuntimeClass } from './runtime-class.ts';
import { listSnapshots, readSnapshot, type SnapshotMeta } from './snapshots.ts';
import { cgroupUsage, mountedDiskUsage } from './pod-usage.ts';
import { openRuncPty } from '../oci/pty.ts';
import { podPaths, processStartTime, readExitStatus, type PersistedImage } from './rootfs.ts';
import type { PullPolicy } from '../../images/image-store.ts';
import { findRuncBinary } from '../oci/runc-binary.ts';
import { findRunscBinary, releaseRunscRoot } from '../oci/runsc-binary.ts';
import { findCriuBinary } from '../oci/criu-binary.ts';
import { runscFlags } from '../oci/runsc.ts';
import { ROOT_ID_MAP, type IdRange } from '../oci/spec.ts';
import { claimIdRange, DEFAULT_ID_RANGES_DIR } from './id-ranges.ts';
import type { LocalRuntimeOptions } from './runtime-options.ts';
import { exists, lastLine, persist, POD_ID, signal, type Pod, type RuntimeContext } from './runtime-context.ts';
import { endOrphanedInit, onLauncherLost, pollExit, podExited, podRunning } from './pod-run.ts';
import { dropCheckpoint, restorePlan } from './pod-memory.ts';
import { copySnapshotDisk, deleteSnapshot, snapshotImage, snapshotRestorePlan, takeSnapshot } from './snapshot-fork.ts';
import { endStraySaves, reclaim, recover, sweepIdRanges } from './pod-recovery.ts';
import { remove, stop } from './pod-stop.ts';

export type { LocalRuntimeOptions };

export const DEFAULT_IMAGE = 'agent-sandbox/base';
/** Parent of every runtime's mount points (one directory per state dir, by its hash). */
export const MOUNT_ROOT = '/run/asb/rootfs';

export async function createLocalRuntime(opts: LocalRuntimeOptions): Promise<LocalRuntime> {
  const [shim, launcher] = await Promise.all([ensureShimBinary(opts.root), ensureLauncherBinary(opts.root)]);
  const unavailable = await whyUnavailable(opts);
  const init = unavailable === undefined ? await ensureInitBinary(opts.root) : 'asb-init';
  const runtime = new LocalRuntime(opts, shim, launcher, init, unavailable);
  if (unavailable !== undefined) {
    opts.log.error(`the local runtime will start NO sandbox: ${unavailable}`);
    return runtime;
  }
  // At start, not at the first pod: a bridge or subnet another instance holds fails the worker
  // with the holder's name, instead of its pods taking that instance's addresses later.
  await runtime.hasPodNetwork();
  await runtime.limitPids();
  // What a killed worker left never stops this one from starting: logged, and tried again next start.
  await runtime.endStraySaves().catch((err: unknown) => opts.log.error({ err }, 'cannot end the saves a previous worker left running'));
  await runtime.recover();
  await runtime.reclaim().catch((err: unknown) => opts.log.error({ err }, 'cannot reclaim what a previous worker left'));
  await runtime.sweepIdRanges();
  return runtime;
}

/** Why no pod can be started here (undefined: they can). Never a fallback to running them unisolated. */
function whyUnavailable(opts: LocalRuntimeOptions): Promise<string | undefined> {
  if (process.getuid?.() !== 0) return Promise.resolve('it must run as root to start containers (runc with user namespaces, cgroups and a bridge); run make up as root');
  try {
    findRuncBinary();
  } catch (err) {
    if (opts.runc === undefined) return Promise.resolve(err instanceof Error ? err.message : String(err));
  }
  return Promise.resolve(undefined);
}

export class LocalRuntime implements PodRuntime, EgressPolicySource {
  readonly #ctx: RuntimeContext;
  readonly #listeners = new Set<(id: string) => void>();

  constructor(opts: LocalRuntimeOptions, shim: string, launcherBinary: string, init: string, unavailable: string | undefined) {
    const log = opts.log.child({ component: 'local-runtime' });
    const clock = opts.clock ?? systemClock;
    const root = resolve(opts.root);
    const tag = createHash('sha256').update(root).digest('hex').slice(0, 12);
    let runsc = opts.runsc;
    let runscUnavailable: string | undefined;
    try {
      runsc ??= findRunscBinary();
    } catch (err) {
      runscUnavailable = err instanceof Error ? err.message : String(err);
    }
    let criu: RuntimeContext['criu'];
    try {
      criu = { binary: opts.criu ?? findCriuBinary() };
    } catch (err) {
      criu = { unavailable: err instanceof Error ? err.message : String(err) };
    }
    const launcher = new Launcher(launcherBinary, log, clock);
    const host: OciHost = {
      runc: opts.runc ?? (unavailable === undefined ? findRuncBinary() : 'runc'),
      runcRoot: join(root, 'runc'),
      init,
      mountRoot: opts.mountRoot ?? join(MOUNT_ROOT, tag),
      cgroupParent: `/asb-${tag}`,
      disk: diskTool(root, (argv) => launcher.run(argv, '')),
      imageUsers: imageUsersCache(),
      ...(runsc === undefined ? {} : { runsc: { binary: runsc, root: join(root, 'runsc'), flags: runscFlags({}) } }),
      ...(opts.podDns === true ? { dnsOnGateway: true } : {}),
      ...(opts.extraCaPath === undefined ? {} : { extraCaPem: readFileSync(opts.extraCaPath, 'utf8') }),
    };
    const pods = new Map<string, Pod>();
    const net: PodNetwork = new PodNetwork(opts, unavailable, launcher, log, () => [...pods.values()]
      .filter((pod) => pod.persisted !== undefined && (pod.state.phase === 'Running' || pod.state.phase === 'Pending' || pod.starting !== undefined))
      .map((pod) => net.podNet(pod.id, pod.persisted?.ip ?? '', pod.persisted?.request.egress)));
    this.#ctx = {
      opts, log, clock, shim, launcher, host, images: opts.images, net, unavailable, runscUnavailable, criu,
      idRangesDir: opts.idRangesDir ?? DEFAULT_ID_RANGES_DIR,
      pods,
      closed: false,
      emit: (id) => this.#emit(id),
      mountRootReady: undefined,
      nullNetns: { unstacking: Promise.resolve(), single: false },
      snapshotsChecked: new Map(),
      versions: {},
    };
  }

  /** Every pod runs in a user namespace: root in a sandbox is root of that namespace only. runtimeClassName gvisor runs it under gVisor when runsc is built. */
  get rootIsolation(): RootIsolation {
    return { userNamespace: 'always', gvisor: this.#ctx.unavailable === undefined && this.#ctx.runscUnavailable === undefined };
  }

  get canKeepMemory(): { gvisor: boolean; runc: boolean } {
    const runs = this.#ctx.unavailable === undefined;
    return { gvisor: runs && this.#ctx.runscUnavailable === undefined, runc: runs && 'binary' in this.#ctx.criu };
  }

  /** The pid of the launcher process that starts pods, while it runs (diagnostics, tests). */
  get launcherPid(): number | undefined {
    return this.#ctx.launcher.pid;
  }

  /** Why this runtime starts no pod (not root, no runc, no init); undefined when it does. */
  get unavailable(): string | undefined {
    return this.#ctx.unavailable;
  }

  /** The pids limit over all of this runtime's pods (cgroup-parent.ts); a host without the controller is warned about. */
  async limitPids(): Promise<void> {
    const max = await parentPidsLimit();
    if (!(await limitParentPids(this.#ctx.host.cgroupParent, max))) this.#ctx.log.warn('no pids cgroup controller: only each pod\'s own pids limit applies, not one over all of them');
  }

  /** Sets up the bridge once; false when the runtime is unavailable (it starts no pod). */
  hasPodNetwork(): Promise<boolean> {
    return this.#ctx.net.hasPodNetwork();
  }

  /** Takes back the id ranges of pods that are gone (id-ranges.ts), here and in any other state dir on the host. */
  async sweepIdRanges(): Promise<void> {
    return sweepIdRanges(this.#ctx);
  }


  /**
   * Leaves one of the null-netns mounts concurrent first gVisor starts stack in the runsc root (runsc
   * pins one per cold start that found none; 1 → 5 over one run before this): the others pin the
   * same kind of empty namespace, and each gofer joins the top one when it starts, so taking the
   * extra ones away changes nothing for a running sandbox. One at a time; not for a start launched
   * once one was all there was (`settled`): mountinfo grows with every pod, and that start found the
   * pin and made none.
   */
  #unstackNullNetns(settled: boolean): Promise<void> {
    const root = this.#ctx.host.runsc?.root;
    if (root === undefined || settled) return Promise.resolve();
    const path = join(root, 'null-netns');
    this.#ctx.nullNetns.unstacking = this.#ctx.nullNetns.unstacking.then(async () => {
      let n = await mountsAt(path);
      for (; n > 1; n--) {
        const r = await this.#ctx.launcher.run(['umount', '--lazy', path], '');
        if (r.code !== 0) throw new Error(`umount ${path}: ${lastLine(r.output)}`);
      }
      this.#ctx.nullNetns.single = n === 1;
    }).catch((err: unknown) => this.#ctx.log.warn({ err }, 'cannot unmount the null-netns mounts runsc stacked'));
    return this.#ctx.nullNetns.unstacking;
  }

  /**
   * Ends the memory saves (runc/runsc pause and checkpoint) a killed worker left running on this
   * state dir: nobody will finish them. Before recover, which deletes their half-written images;
   * reclaim then resumes the sandboxes they paused.
   */
  async endStraySaves(): Promise<void> {
    return endStraySaves(this.#ctx);
  }

  /**
   * The sweep at start, after recover (reclaim.ts): the adopted pods a killed save left paused
   * run again, then everything of this state dir that belongs to no running pod goes: shims,
   * runc and gVisor containers, mounts (gVisor's stacked null-netns among them), veths, cgroups
   * and mount-point directories. The firewall table was rebuilt at start with the adopted pods'
   * chains only; half-written checkpoints and snapshots went in recover; id ranges go next
   * (sweepIdRanges). A failure is logged and the next start tries again: a worker never fails to
   * start because of what an earlier one left.
   */
  async reclaim(): Promise<void> {
    return reclaim(this.#ctx);
  }

  /** Loads every pod dir: pods whose init still runs are adopted, the others are Stopped. */
  async recover(): Promise<void> {
    return recover(this.#ctx);
  }

  start(req: PodRequest, opts: StartOptions = {}): Promise<PodState> {
    if (this.#ctx.closed) return Promise.reject(new AsbError('Unavailable', 'local runtime is closed'));
    if (!POD_ID.test(req.id)) return Promise.reject(new AsbError('BadRequest', `pod id "${req.id}" must match ${POD_ID.source}`));
    let pod = this.#ctx.pods.get(req.id);
    if (pod === undefined) {
      pod = { id: req.id, paths: podPaths(this.#ctx.opts.root, req.id), persisted: undefined, state: { phase: 'Absent', ready: false }, generation: 0, stopping: false };
      this.#ctx.pods.set(req.id, pod);
    }
    const madeFor = pod.persisted?.request.uid;
    if (madeFor !== undefined && madeFor !== req.uid) {
      return Promise.reject(new AsbError('Conflict', `pod ${req.id} and its volumes belong to sandbox uid ${madeFor}, not ${req.uid}; remove it first`));
    }
    if (pod.starting !== undefined) return pod.starting;
    if (pod.state.phase === 'Running') return Promise.resolve(this.state(req.id));
    const current = pod;
    // Answered from state(), which also says whose pod it is (the uid).
    current.starting = this.#start(current, req, opts.memory === false).then((started) => (this.#ctx.pods.get(req.id) === current ? this.state(req.id) : started)).finally(() => (current.starting = undefined));
    return current.starting;
  }

  /**
   * The image a start runs: a wake reuses the bytes the pod first ran (the tag may have moved
   * since, and a hibernated sandbox must wake as it was), else a pull by the container's policy.
   */
  async #image(pod: Pod, image: string, policy: PullPolicy | undefined): Promise<PersistedImage> {
    const kept = pod.persisted?.image;
    // Pinned before it is looked up, in a pod dir that exists (the pin's validity): the cache's
    // GC, in this process or another sharing the cache, then never removes it under this pod.
    await mkdir(pod.paths.dir, { recursive: true, mode: 0o700 });
    await this.#ctx.images.pin(pod.paths.dir, { reference: image, rootfs: kept?.reference === image ? kept.rootfs : undefined });
    if (kept !== undefined && kept.reference === image && (await exists(kept.rootfs))) return kept;
    const pulled = await this.#ctx.images.pull(image, { idMap: ROOT_ID_MAP, ...(policy === undefined ? {} : { policy }) });
    // The tree itself too: the reference's record may later name other bytes (its tag moved).
    await this.#ctx.images.pin(pod.paths.dir, { reference: image, rootfs: pulled.rootfs });
    return { reference: image, manifestDigest: pulled.manifestDigest, rootfs: pulled.rootfs, config: pulled.config };
  }

  async #start(pod: Pod, req: PodRequest, discardMemory = false): Promise<PodState> {
    // A new shim only once the last one has deleted its container and unmounted the disk.
    await pod.teardown;
    const generation = ++pod.generation;
    pod.stopping = false;
    pod.pendingExit = undefined;
    const fail = (message: string, reason?: string): PodState => {
      pod.state = { phase: 'Failed', ready: false, message };
      if (reason !== undefined) pod.state.reason = reason;
      if (pod.persisted !== undefined) pod.state.ip = pod.persisted.ip;
      this.#emit(pod.id);
      return { ...pod.state };
    };
    if (this.#ctx.unavailable !== undefined) return fail(`this worker runs no sandboxes: ${this.#ctx.unavailable}`, 'RuntimeUnavailable');
    const runtimeClass = decideRuntimeClass(req.spec.runtimeClassName, this.#ctx.runscUnavailable);
    if (!runtimeClass.ok) return fail(runtimeClass.message, runtimeClass.reason);
    const container = mainContainer(req.spec);
    pod.state = { phase: 'Pending', ready: false };
    this.#emit(pod.id);
    // No Secret objects here (README, "Pull credentials"): the worker's credentials are used, and
    // the kubelet likewise pulls without a named secret it cannot find, with a warning.
    if (Array.isArray(req.spec.imagePullSecrets) && req.spec.imagePullSecrets.length > 0) {
      this.#ctx.log.warn({ id: pod.id, imagePullSecrets: req.spec.imagePullSecrets }, 'imagePullSecrets are not read by the local runtime: the worker\'s --registries credentials are used');
    }
    // A new pod from a snapshot: the snapshot's image bytes, disk and (below) memory.
    let snap: SnapshotMeta | undefined;
    if (req.from !== undefined && pod.persisted === undefined) {
      try {
        snap = await readSnapshot(this.#ctx.opts.root, req.from.snapshot);
      } catch (err) {
        return fail(err instanceof Error ? err.message : String(err), 'SnapshotUnavailable');
      }
    }
    let image: PersistedImage;
    try {
      image = snap === undefined ? await this.#image(pod, container.image || (this.#ctx.opts.defaultImage ?? DEFAULT_IMAGE), pullPolicy(container.imagePullPolicy)) : await snapshotImage(this.#ctx, pod, snap);
    } catch (err) {
      if (pod.generation !== generation) return { ...pod.state };
      return fail(err instanceof Error ? err.message : String(err), snap === undefined ? 'ErrImagePull' : 'SnapshotUnavailable');
    }
    if (pod.generation !== generation) return { ...pod.state };
    const net = await this.#ctx.net.forStart();
    const kept = pod.persisted?.ip;
    // Kept across hibernation, unless it lies outside this bridge's subnet (hibernated before the
    // subnet changed: state from before subnets were per state dir, or another ASB_SUBNET). It
    // could not be reached there, so the pod gets a new address.
    const moved = kept !== undefined && !inSubnet(kept, this.#ctx.net.subnet);
    if (moved) this.#ctx.log.warn({ id: pod.id, ip: kept, subnet: this.#ctx.net.subnet.cidr }, 'pod address is outside the subnet: it gets a new one');
    const ip = kept !== undefined && !moved ? kept : this.#ctx.net.ips.allocate();
    // A request without a policy keeps the one the pod had (a wake), else the default.
    const egress = req.egress ?? pod.persisted?.request.egress ?? DEFAULT_EGRESS_POLICY;
    // A runc pod restored from memory (a snapshot's, or its own checkpoint) runs in the user
    // namespace CRIU makes, as when it was saved: its bundle must be a checkpointable one.
    const restoresMemory = snap === undefined ? pod.checkpoint?.criuVersion !== undefined && !discardMemory : snap.memory;
    req = { ...req, egress, ...(restoresMemory && runtimeClass.kind === 'runc' ? { checkpointable: true } : {}) };
    let idRange: IdRange;
    try {
      idRange = await this.#idRange(pod);
    } catch (err) {
      return fail(err instanceof Error ? err.message : String(err), isAsbError(err, 'Conflict') ? 'CreateContainerConfigError' : 'RuntimeUnavailable');
    }
    pod.persisted = { request: req, ip, image, idRange };
    // A runc fork's own copy of the snapshot's memory image is made while its disk is (they share nothing).
    const forkPlan = snap !== undefined && runtimeClass.kind === 'runc' ? snapshotRestorePlan(this.#ctx, pod, snap, 'runc') : undefined;
    let shimArgs: string[];
    try {
      await mkdir(pod.paths.dir, { recursive: true, mode: 0o700 });
      await this.#mountRoot();
      if (snap !== undefined) await copySnapshotDisk(this.#ctx, pod, snap);
      const prepared = await preparePod(this.#ctx.host, pod.paths, req, { rootfs: image.rootfs, config: image.config }, net ? { ip, prefix: this.#ctx.net.subnet.prefix, gateway: this.#ctx.net.subnet.gateway } : undefined, runtimeClass.kind, idRange);
      shimArgs = prepared.shimArgs;
      pod.identity = prepared.identity;
      // The copied disk's files are the source pod's: they become this pod's (its own host ids).
      const disk = pod.paths.disk;
      if (snap !== undefined && disk !== undefined && snap.idRange.hostId !== idRange.hostId) {
        await this.#ctx.host.disk.shift(disk.mount, snap.idRange.hostId, idRange.hostId, Math.min(snap.idRange.size, idRange.size));
      }
      await persist(pod);
    } catch (err) {
      this.#ctx.log.warn({ err, id: pod.id }, 'cannot prepare pod');
      if (forkPlan !== undefined) await forkPlan.then(() => discardCheckpoint(pod.paths.checkpoint));
      const invalid = err instanceof AsbError && err.code === 'Invalid';
      return fail(`cannot prepare pod: ${err instanceof Error ? err.message : String(err)}`, invalid ? 'CreateContainerConfigError' : undefined);
    }
    // Asked to start from its files (E2B's reboot): a kept checkpoint is deleted, not restored.
    if (discardMemory && snap === undefined && pod.checkpoint !== undefined) {
      await dropCheckpoint(this.#ctx, pod);
      pod.keptAgent?.end();
      pod.keptAgent = undefined;
    }
    // A pod stopped with memory wakes from its checkpoint when the image can still be restored, else from its files, saying why.
    const restore: { from?: string; shared?: boolean; failure?: string } = await (forkPlan ?? (snap === undefined ? restorePlan(this.#ctx, pod, runtimeClass.kind) : snapshotRestorePlan(this.#ctx, pod, snap, runtimeClass.kind)));
    if (pod.generation !== generation) return { ...pod.state };
    if (restore.from !== undefined) shimArgs = withRestore(shimArgs, restore.from, restore.shared === true, runtimeClass.kind === 'runc' && 'binary' in this.#ctx.criu ? dirname(this.#ctx.criu.binary) : undefined);
    pod.lostLauncher = false;
    const nullNetnsSettled = this.#ctx.nullNetns.single; // before runsc looks for its pin (#unstackNullNetns)
    const launcherLost = (): boolean => pod.lostLauncher === true; // set by the lost hook during the awaits
    pod.exited = new Promise((resolve) => (pod.markExited = resolve));
    const launch = launchPodInit(this.#ctx.launcher, this.#ctx.shim, shimArgs, {
      ...(net ? { attach: (pid: number) => Promise.all([this.#ctx.net.firewall.apply(this.#ctx.net.podNet(pod.id, ip, egress)), this.#ctx.net.attachVeth(pid, this.#ctx.net.veth(pod.id), ip)]).then(() => undefined) } : {}),
      exited: (code) => {
        if (pod.generation !== generation) return;
        // A shim exits after the pod's init, unless it was killed: then the init runs on,
        // reparented to the host's init, with nobody to end it or report it, and its mounts keep
        // the pod's teardown from finishing (found by make soak's kill -9 of a shim). It ends with
        // its shim: SIGKILL to the pod's pid 1, so the kernel ends the rest of its namespace.
        void endOrphanedInit(this.#ctx, pod)
          .then(() => readExitStatus(pod.paths))
          .then((status) => {
            // The shim wrote the status before it exited: it also says whether the OOM killer struck.
            if (pod.generation === generation) podExited(this.#ctx, pod, code, status?.reason);
          });
      },
      lost: () => {
        if (pod.generation === generation) onLauncherLost(this.#ctx, pod);
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
      if (restore.from !== undefined && restore.shared !== true && (await readRestoreStatus(pod.paths.restoreStatus)) !== undefined) await dropCheckpoint(this.#ctx, pod);
      return fail(outcome.message);
    }
    if (runtimeClass.kind === 'runsc') await this.#unstackNullNetns(nullNetnsSettled);
    let restoreFailure = restore.failure;
    if (restore.from !== undefined) {
      const status = await readRestoreStatus(pod.paths.restoreStatus);
      if (status?.restored !== true) restoreFailure = `${runtimeClass.kind === 'runsc' ? 'runsc' : 'CRIU'} could not restore the memory checkpoint, so the pod started from its files: ${status?.reason ?? 'the shim said nothing of the restore'}`;
      // Its memory now lives in the running sandbox: a stale image must never be restored again
      // (a snapshot's is kept: it is the snapshot's, for every pod started from it).
      if (restore.shared !== true) await dropCheckpoint(this.#ctx, pod);
    }
    if (restoreFailure !== undefined) this.#ctx.log.warn({ id: pod.id, reason: restoreFailure }, 'the pod\'s memory checkpoint was not restored');
    if (restore.from === undefined || restoreFailure !== undefined) {
      // Started from its files: the processes of the kept handles are gone.
      pod.keptAgent?.end();
      pod.keptAgent = undefined;
    }
    launch.child.closeStdin();
    launch.child.unref();
    const startedAt = isoNow(this.#ctx.clock);
    const pidStart = await processStartTime(outcome.pid);
    if (pod.generation !== generation) return { ...pod.state };
    pod.persisted = { request: req, ip, image, idRange, pid: outcome.pid, pidStart: pidStart ?? 'gone', startedAt, ...(restoreFailure === undefined ? {} : { restoreFailure }) };
    podRunning(this.#ctx, pod, outcome.pid, startedAt);
    // The container may have ended already (a command that exits at once).
    const early = pod.pendingExit as number | undefined; // set by the exit event during the awaits
    if (early !== undefined) podExited(this.#ctx, pod, early);
    else if (launcherLost()) pollExit(this.#ctx, pod, outcome.pid, pod.persisted.pidStart ?? 'gone');
    if (pod.target !== undefined) await persist(pod);
    return { ...pod.state };
  }

  /**
   * The pod's host id range: the one it has had since it was made (recover checked the pool),
   * ROOT_ID_MAP for a pod made before ranges (its files are owned by that one), else one claimed
   * for it now.
   */
  async #idRange(pod: Pod): Promise<IdRange> {
    if (pod.rangeConflict !== undefined) throw new AsbError('Conflict', pod.rangeConflict);
    const kept = pod.persisted?.idRange;
    if (kept !== undefined) return kept;
    if (pod.persisted !== undefined) return ROOT_ID_MAP;
    if (await madeBeforeDisks(pod.paths.dir)) return ROOT_ID_MAP;
    return claimIdRange(this.#ctx.idRangesDir, pod.paths.dir);
  }

  /**
   * Keeps the pod's files, and with `memory` its memory and processes, as a snapshot (snapshots.ts).
   * A running pod is paused for the save (gVisor) and its disk frozen for the copy, then goes on;
   * a pod stopped with its memory gives its checkpoint. One at a time per pod, like a stop with memory.
   */
  async snapshot(id: string, snapshotId: string, opts: { memory: boolean }): Promise<SnapshotInfo> {
    return takeSnapshot(this.#ctx, id, snapshotId, opts);
  }

  /**
   * The pod's upper dir, read while its disk is frozen: the sandbox's writes wait (they do not
   * fail) until `read` is done, so what is read cannot change under the reader.
   */
  async readWritableLayer<T>(id: string, read: (layer: WritableLayer) => Promise<T>): Promise<T> {
    const pod = this.#ctx.pods.get(id);
    const disk = pod?.paths.disk;
    const idRange = pod?.persisted?.idRange;
    if (pod?.target === undefined) throw new AsbError('SandboxNotRunning', `sandbox pod ${id} is not running`);
    if (disk === undefined || idRange === undefined || (await madeBeforeDisks(pod.paths.dir))) {
      throw new AsbError('NotImplemented', `pod ${id} was made before pods had disks of their own and id ranges: its writable layer cannot be read`);
    }
    await this.#ctx.host.disk.freeze(disk.mount);
    try {
      // gVisor's /tmp is disk/tmp, bound over the image's (runscSpec's tmpDir), not in the upper dir.
      const mounts = pod.target.kind === 'runsc' ? [{ path: 'tmp', dir: pod.paths.tmp }] : [];
      return await read({ dir: pod.paths.upper, idRange: { hostId: idRange.hostId, size: idRange.size }, mounts });
    } finally {
      await this.#ctx.host.disk.thaw(disk.mount);
    }
  }

  /** Deletes a snapshot and its pin on the image; idempotent. */
  async deleteSnapshot(snapshotId: string): Promise<void> {
    return deleteSnapshot(this.#ctx, snapshotId);
  }

  /** The snapshots this runtime holds (partial ones left by a worker that died are deleted). */
  snapshots(): Promise<string[]> {
    return listSnapshots(this.#ctx.opts.root);
  }

  /** The mount points' parent, made once: each pod's directory in it is walkable by that pod's root only (oci-pod.ts). */
  #mountRoot(): Promise<void> {
    this.#ctx.mountRootReady ??= (async () => {
      await mkdir(this.#ctx.host.mountRoot, { recursive: true, mode: 0o711 });
      await chown(this.#ctx.host.mountRoot, 0, 0);
      await chmod(this.#ctx.host.mountRoot, 0o711);
      // /run/asb may exist already (network claims), made before with a private mode.
      if (this.#ctx.host.mountRoot.startsWith(`${MOUNT_ROOT}/`)) await Promise.all([chmod(MOUNT_ROOT, 0o711), chmod(resolve(MOUNT_ROOT, '..'), 0o711)]);
    })();
    return this.#ctx.mountRootReady;
  }

  async stop(id: string, opts: StopOptions = {}): Promise<void> {
    return stop(this.#ctx, id, opts);
  }

  async remove(id: string): Promise<void> {
    return remove(this.#ctx, id);
  }

  /** Replaces a pod's egress policy: applied at once when it runs, and kept (persisted) for its next wake. */
  async setEgressPolicy(id: string, policy: EgressPolicy): Promise<void> {
    const pod = this.#ctx.pods.get(id);
    if (pod?.persisted === undefined) throw new AsbError('NotFound', `pod ${id} not found`);
    await pod.starting?.catch(() => undefined);
    const persisted = pod.persisted;
    persisted.request = { ...persisted.request, egress: policy };
    await persist(pod);
    if (pod.state.phase !== 'Running' && pod.state.phase !== 'Pending') return;
    const net = this.#ctx.net.podNet(id, persisted.ip, policy);
    await this.#ctx.net.firewall.apply(net);
    // The rules above decide new connections only: open ones the policy now forbids are cut here,
    // before the change is acknowledged (runc's and gVisor's flows alike leave through the bridge).
    const cut = await this.#ctx.net.firewall.cutForbidden(net).catch((err: unknown) => {
      this.#ctx.log.error({ err, id }, 'cannot cut the open connections the new egress policy forbids: they keep running until they end');
      return [];
    });
    if (cut.length > 0) this.#ctx.log.info({ id, destinations: cut }, 'cut open connections the new egress policy forbids');
    // The proxied ones are not the kernel's: the egress proxy's own (onPolicyChange), also before the acknowledgement.
    await this.#ctx.net.policyChanged(id, persisted.ip);
  }

  onPolicyChange(listener: (podIp: string) => Promise<void>): () => void {
    return this.#ctx.net.onPolicyChange(listener);
  }

  /**
   * The policy of the pod holding `ip` (the egress proxy and DNS resolver ask, per connection or
   * question): the pod's persisted request, the same the kernel rules were made from. A scan of
   * the pods: ~1 µs per pod, well under a connection's cost at the few thousand a worker holds.
   */
  policyForPodIp(ip: string): EgressPolicy | undefined {
    for (const pod of this.#ctx.pods.values()) {
      if (pod.persisted?.ip === ip) return pod.persisted.request.egress ?? DEFAULT_EGRESS_POLICY;
    }
    return undefined;
  }

  /** The pod (= sandbox id) holding `ip`, for the egress proxy's per-sandbox counts; the same scan as policyForPodIp. */
  sandboxForPodIp(ip: string): string | undefined {
    for (const pod of this.#ctx.pods.values()) if (pod.persisted?.ip === ip) return pod.id;
    return undefined;
  }

  /** The kernel's per-pod, per-rule counts of connection attempts. */
  async egressCounts(): Promise<EgressCount[]> {
    if (!(await this.hasPodNetwork().catch(() => false))) return [];
    const byIp = new Map<string, string>();
    for (const pod of this.#ctx.pods.values()) if (pod.persisted !== undefined) byIp.set(pod.persisted.ip, pod.id);
    const out: EgressCount[] = [];
    for (const c of await this.#ctx.net.firewall.counters()) {
      const pod = byIp.get(c.ip);
      if (pod !== undefined) out.push({ pod, rule: c.rule, verdict: c.verdict, count: c.packets });
    }
    return out;
  }

  /** Hibernates every running pod, e.g. when `make up` shuts down. */
  async stopAll(): Promise<void> {
    await Promise.all([...this.#ctx.pods.keys()].map((id) => this.stop(id)));
  }

  /** What the pod uses, from its disk and its cgroup on the host (pod-usage.ts says why not /proc). */
  async usage(id: string): Promise<PodUsage | undefined> {
    const pod = this.#ctx.pods.get(id);
    if (pod?.state.phase !== 'Running') return undefined;
    const disk = pod.paths.disk;
    const [onDisk, cgroup] = await Promise.all([
      disk === undefined ? undefined : mountedDiskUsage(disk.mount, pod.paths.dir),
      cgroupUsage(posix.join(this.#ctx.host.cgroupParent, id)),
    ]);
    return { ...(onDisk === undefined ? {} : { disk: onDisk }), ...cgroup };
  }

  state(id: string): PodState {
    const pod = this.#ctx.pods.get(id);
    if (pod === undefined) return { phase: 'Absent', ready: false };
    const uid = pod.persisted?.request.uid;
    const state: PodState = uid === undefined ? { ...pod.state } : { ...pod.state, uid };
    if (pod.state.phase === 'Stopped' && pod.checkpoint !== undefined) state.checkpoint = { bytes: pod.checkpoint.bytes, at: pod.checkpoint.at };
    const restoreFailure = pod.persisted?.restoreFailure;
    if (restoreFailure !== undefined && pod.target !== undefined) state.restoreFailure = restoreFailure;
    return state;
  }

  list(): string[] {
    return [...this.#ctx.pods.keys()];
  }

  onChange(listener: (id: string) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #emit(id: string): void {
    for (const listener of this.#listeners) {
      try {
        listener(id);
      } catch (err) {
        this.#ctx.log.error({ err, id }, 'onChange listener threw');
      }
    }
  }

  #target(id: string): PodTarget {
    const target = this.#ctx.pods.get(id)?.target;
    if (target === undefined) throw new AsbError('SandboxNotRunning', `sandbox pod ${id} is not running`);
    return target;
  }

  async exec(id: string, req: ExecRequest): Promise<ExecResult> {
    return execInPod(this.#target(id), req);
  }

  async readFile(id: string, path: string): Promise<Uint8Array> {
    return readPodFile(this.#target(id), path);
  }

  async writeFile(id: string, path: string, data: Uint8Array | AsyncIterable<Uint8Array>, mode?: number): Promise<void> {
    return writePodFile(this.#target(id), path, data, mode);
  }

  async listDir(id: string, path: string): Promise<FileEntry[]> {
    return listPodDir(this.#target(id), path);
  }

  async openPty(id: string, opts: PtyOptions): Promise<PtySession> {
    const t = this.#target(id);
    if (t.agent !== undefined) {
      return agentPty(t.agent, { ...agentRequest(t, { ...opts, command: opts.command ?? [...DEFAULT_PTY_COMMAND] }), pty: { cols: opts.cols, rows: opts.rows } }, id);
    }
    return openRuncPty({
      runc: t.runc, root: t.runcRoot, runtime: t.kind, runtimeFlags: t.runtimeFlags, id: t.id, user: { uid: t.uid, gid: t.gid }, cwd: t.cwd, stateDir: this.#ctx.opts.root, userNamespace: true,
      env: Object.entries(t.env).map(([k, v]) => `${k}=${v}`),
    }, opts);
  }

  async spawn(id: string, req: SpawnRequest): Promise<PodProcess> {
    return spawnPodProcess(this.#target(id), req);
  }

  /** Stops probes and watchers; pods keep running and a new runtime re-adopts them. */
  close(): Promise<void> {
    if (this.#ctx.closed) return Promise.resolve();
    this.#ctx.closed = true;
    for (const pod of this.#ctx.pods.values()) {
      pod.probe?.cancel();
      pod.poll?.cancel();
    }
    // The launcher exits without touching the pods it started; a new runtime re-adopts them.
    // The directory of mount points goes when no pod has one (a test's runtime leaves nothing in /run).
    // runsc's state dir holds a bind mount it never removes (releaseRunscRoot): released once no
    // gVisor pod runs, so a shut-down worker leaves no mount behind and its root can be deleted.
    const gvisorRuns = [...this.#ctx.pods.values()].some((pod) => pod.target?.kind === 'runsc' || pod.starting !== undefined);
    const runscRoot = this.#ctx.host.runsc?.root;
    // A running pod keeps its rules (the next runtime re-adopts it); with none left the tables, the bridge and its claim go.
    const anyRuns = [...this.#ctx.pods.values()].some((pod) => pod.state.phase === 'Running' || pod.state.phase === 'Pending' || pod.starting !== undefined);
    // The empty mount-point directories of pods that do not run (a stopped pod's shim unmounted them).
    const running = new Set([...this.#ctx.pods.values()].filter((pod) => pod.target !== undefined || pod.starting !== undefined).map((pod) => pod.id));
    const dropMountDirs = async (): Promise<void> => {
      const names = await readdir(this.#ctx.host.mountRoot).catch(() => []);
      for (const id of names) if (!running.has(id)) await removeMountDir(this.#ctx.host.mountRoot, id).catch((err: unknown) => this.#ctx.log.warn({ err, id }, 'cannot remove the pod\'s mount-point directory'));
      await rmdir(this.#ctx.host.mountRoot).catch(() => undefined);
    };
    return Promise.all([
      this.#ctx.net.close(anyRuns).then(() => this.#ctx.launcher.close()),
      dropMountDirs(),
      removeParent(this.#ctx.host.cgroupParent),
      runscRoot === undefined || gvisorRuns ? undefined : releaseRunscRoot(runscRoot).catch((err: unknown) => this.#ctx.log.warn({ err }, 'cannot release runsc state')),
    ]).then(() => undefined);
  }
}

/** Kubernetes' imagePullPolicy; anything else (absent, or a value validation let through) is the default rule. */
function pullPolicy(value: unknown): PullPolicy | undefined {
  return value === 'Always' || value === 'IfNotPresent' || value === 'Never' ? value : undefined;
}
