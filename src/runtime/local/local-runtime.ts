// The local pod runtime: plays the kubelet's part on one machine. Each pod is an OCI container run
// by runc: its image pulled from a registry into the image cache (src/images/), its rootfs an
// overlay of the cached tree under its own writable layer, a user namespace, seccomp, no
// capabilities and cgroup limits (src/runtime/oci/spec.ts, oci-pod.ts). oci-shim.c starts each
// pod and stays as its parent; the shims are forked by one long-lived launcher (launcher.c), so the
// worker never forks per pod. The writable layer and volumes are on the pod's own disk under the
// state dir (rootfs.ts, disk.ts), so stop() hibernates without losing a byte and start() wakes the
// same disk, the same image bytes and the same IP.
// Pods outlive the worker: their shims run in their own session, and a new runtime on the same
// root re-adopts every pod whose init is still alive (checked by pid AND start time).
// Without root, runc or the init binary, the runtime starts no pod and says why (README): it never
// runs a sandbox unisolated. A pod with runtimeClassName gvisor runs under gVisor's runsc instead
// of runc (runtime-class.ts), through the same shim, exec and terminal code; such a pod can also
// stop with its memory (stop(id, { memory: true }): a runsc checkpoint in its state dir,
// checkpoint.ts) and its next start resumes every process where it was. So can a runc pod started
// checkpointable (PodRequest.checkpointable: runc makes its user namespace and its stdio is pipes),
// through CRIU (`runc checkpoint` / `runc restore`, docs/criu.md).
//
// LocalRuntime is the public face (PodRuntime); it holds one RuntimeContext (runtime-context.ts:
// the pods and the runtime's state) and hands it to the part that does the work:
//   pod-start.ts      start: image, address, id range, bundle, restore, shim
//   pod-run.ts        a running pod until it ends: target, probe, exit, polling
//   pod-stop.ts       stop (hibernate) and remove
//   pod-memory.ts     a pod's memory saved (stop with memory) and restored
//   snapshot-fork.ts  snapshots, and pods started from them
//   pod-recovery.ts   a previous worker's pods: adopted, or reclaimed
//   pod-network.ts    the bridge, addresses, veths and firewall
//   pod-egress.ts     each pod's egress policy
// Exec, files and terminals go straight to the pod's target (exec.ts, files.ts, agent.ts).
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { readdir, rmdir } from 'node:fs/promises';
import { join, posix, resolve } from 'node:path';
import type { RootIsolation } from '../../api/pod-security.ts';
import { AsbError } from '../../errors.ts';
import { systemClock } from '../../base/clock.ts';
import type { ExecRequest, ExecResult, FileEntry, PodProcess, PodRequest, PodRuntime, PodState, PodUsage, PtyOptions, PtySession, SnapshotInfo, SpawnRequest, StartOptions, StopOptions, WritableLayer } from '../runtime.ts';
import type { EgressCount } from '../../network/egress-metrics.ts';
import { type EgressPolicy, type EgressPolicySource } from '../../network/egress-policy.ts';
import { PodNetwork } from './pod-network.ts';
import { execInPod, type PodTarget } from './exec.ts';
import { spawnPodProcess } from './process.ts';
import { listPodDir, readPodFile, writePodFile } from './files.ts';
import { ensureInitBinary, ensureLauncherBinary, ensureShimBinary } from './init-binary.ts';
import { agentPty, agentRequest } from './agent.ts';
import { DEFAULT_PTY_COMMAND } from '../oci/pty.ts';
import { Launcher } from './launcher.ts';
import { removeMountDir } from './reclaim.ts';
import { limitParentPids, parentPidsLimit, removeParent } from './cgroup-parent.ts';
import { imageUsersCache, type OciHost } from './oci-pod.ts';
import { diskTool, madeBeforeDisks } from './disk.ts';
import { listSnapshots } from './snapshots.ts';
import { cgroupUsage, mountedDiskUsage } from './pod-usage.ts';
import { openRuncPty } from '../oci/pty.ts';
import { podPaths } from './rootfs.ts';
import { findRuncBinary } from '../oci/runc-binary.ts';
import { findRunscBinary, releaseRunscRoot } from '../oci/runsc-binary.ts';
import { findCriuBinary } from '../oci/criu-binary.ts';
import { runscFlags } from '../oci/runsc.ts';
import { DEFAULT_ID_RANGES_DIR } from './id-ranges.ts';
import type { LocalRuntimeOptions } from './runtime-options.ts';
import { MOUNT_ROOT, POD_ID, type Pod, type RuntimeContext } from './runtime-context.ts';
import { deleteSnapshot, takeSnapshot } from './snapshot-fork.ts';
import { endStraySaves, reclaim, recover, sweepIdRanges } from './pod-recovery.ts';
import { remove, stop } from './pod-stop.ts';
import { startPod } from './pod-start.ts';
import { egressCounts, policyForPodIp, sandboxForPodIp, setEgressPolicy } from './pod-egress.ts';

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
      snapshotsSettling: new Map(),
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

  /** Ends the memory saves a killed worker left running on this state dir (pod-recovery.ts). Before recover. */
  async endStraySaves(): Promise<void> {
    return endStraySaves(this.#ctx);
  }

  /** The sweep at start, after recover: what belongs to no running pod goes (pod-recovery.ts). */
  async reclaim(): Promise<void> {
    return reclaim(this.#ctx);
  }

  /** Loads every pod dir: pods whose init still runs are adopted, the others are Stopped. */
  async recover(): Promise<void> {
    return recover(this.#ctx);
  }

  /** Starts (or wakes, or forks) the pod, one start at a time per pod (pod-start.ts). */
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
    current.starting = startPod(this.#ctx, current, req, opts.memory === false).then((started) => (this.#ctx.pods.get(req.id) === current ? this.state(req.id) : started)).finally(() => (current.starting = undefined));
    return current.starting;
  }

  /** Keeps the pod's files, and with `memory` its memory and processes, as a snapshot (snapshot-fork.ts). */
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

  /** Hibernates the pod, or with `memory` keeps its memory too (pod-stop.ts, pod-memory.ts). */
  async stop(id: string, opts: StopOptions = {}): Promise<void> {
    return stop(this.#ctx, id, opts);
  }

  /** Stops the pod and deletes everything of it (pod-stop.ts). */
  async remove(id: string): Promise<void> {
    return remove(this.#ctx, id);
  }

  /** Replaces a pod's egress policy: applied at once when it runs, and kept (persisted) for its next wake. */
  async setEgressPolicy(id: string, policy: EgressPolicy): Promise<void> {
    return setEgressPolicy(this.#ctx, id, policy);
  }

  onPolicyChange(listener: (podIp: string) => Promise<void>): () => void {
    return this.#ctx.net.onPolicyChange(listener);
  }

  /** The policy of the pod holding `ip`, asked per connection or question (pod-egress.ts). */
  policyForPodIp(ip: string): EgressPolicy | undefined {
    return policyForPodIp(this.#ctx, ip);
  }

  /** The pod (= sandbox id) holding `ip`, for the egress proxy's per-sandbox counts; the same scan as policyForPodIp. */
  sandboxForPodIp(ip: string): string | undefined {
    return sandboxForPodIp(this.#ctx, ip);
  }

  /** The kernel's per-pod, per-rule counts of connection attempts. */
  async egressCounts(): Promise<EgressCount[]> {
    return egressCounts(this.#ctx);
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
