// The local pod runtime: plays the kubelet's part on one machine. Each pod is an isolated process
// tree (pid, mount, uts, ipc and, when root, network namespaces) started by pod-init.c, whose
// writable filesystem and volumes are directories under the state dir (see rootfs.ts), so stop()
// hibernates without losing a byte and start() wakes the same disk with the same IP.
// Pods outlive the worker: their processes run in their own session, and a new runtime on the
// same root re-adopts every pod whose init is still alive (checked by pid AND start time).
// Degraded mode (documented in README.md): without root, or when the bridge cannot be set up, pods
// share the host network (their ports on 127.0.0.1) and, without root, run in a user namespace as
// the caller's own uid; one warning is logged.
import { readdir, rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { RootIsolation } from '../../api/pod-security.ts';
import { AsbError } from '../../errors.ts';
import { systemClock, isoNow, type Clock, type Timer } from '../../system/clock.ts';
import type { Logger } from '../../system/log.ts';
import type { ExecRequest, ExecResult, FileEntry, PodProcess, PodRequest, PodRuntime, PodState, PtyOptions, PtySession, SpawnRequest } from '../runtime.ts';
import { execInPod, type PodTarget } from './exec.ts';
import { spawnPodProcess } from './process.ts';
import { listPodDir, readPodFile, writePodFile } from './files.ts';
import { resolveImage } from './images.ts';
import { ensureInitBinary, ensureLauncherBinary } from './init-binary.ts';
import { Launcher, type Launched } from './launcher.ts';
import { createIpPool, createVethBatcher, ensureBridge, inSubnet, parseSubnet, vethName, type IpPool, type Subnet } from './network.ts';
import { claimNetwork, DEFAULT_CLAIMS_DIR, releaseNetwork } from './network-claim.ts';
import { derivedNetwork } from '../../system/local-network.ts';
import { launchPodInit } from './pod-launch.ts';
import { containerArgv, initArgs, mainContainer, podEnv, podUser, resolveMounts, type InitNetwork } from './pod-process.ts';
import { startProbeLoop } from './probes.ts';
import { openPodPty } from './pty.ts';
import { podPaths, prepareEtc, processStartTime, readExitStatus, readPersisted, writePersisted, type PersistedPod, type PodPaths } from './rootfs.ts';

export interface LocalRuntimeOptions {
  /** State dir, e.g. .asb/data/runtime: pods/, volumes/ and the compiled init live here. */
  root: string;
  log: Logger;
  clock?: Clock;
  /** Pod subnet; the bridge takes its first address. Default: derived from root (src/system/local-network.ts). */
  subnet?: string;
  /** Host bridge name (≤ 15 bytes); distinct per worker or test run. Default: derived from root. */
  bridge?: string;
  /** Host-wide directory of bridge and subnet claims (network-claim.ts). Default /run/asb/networks */
  claimsDir?: string;
  /** Readiness probe period when a probe sets no periodSeconds. Default 1000 ms. */
  probeIntervalMs?: number;
  /** How often to check the init of an adopted pod (one we did not spawn). Default 500 ms. */
  pollIntervalMs?: number;
  /** stop(): SIGTERM, then SIGKILL after this long. Default 2000 ms. */
  stopGraceMs?: number;
  /** false forces degraded networking (host network) even as root. */
  network?: boolean;
}

const ID = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

interface Pod {
  id: string;
  paths: PodPaths;
  persisted: PersistedPod | undefined;
  state: PodState;
  target?: PodTarget;
  shim?: Launched;
  /** Bumped on every start so events of an old process never touch a new one. */
  generation: number;
  stopping: boolean;
  starting?: Promise<PodState> | undefined;
  probe?: { cancel(): void } | undefined;
  poll?: Timer;
  exited?: Promise<void> | undefined;
  markExited?: () => void;
  /** An exit seen while start() was still waiting for the init: start() reports it. */
  pendingExit?: number | undefined;
  /** The launcher died while start() was still finishing: start() switches to polling. */
  lostLauncher?: boolean;
}

export async function createLocalRuntime(opts: LocalRuntimeOptions): Promise<LocalRuntime> {
  const [binary, launcher] = await Promise.all([ensureInitBinary(opts.root), ensureLauncherBinary(opts.root)]);
  const runtime = new LocalRuntime(opts, binary, launcher);
  // At start, not at the first pod: a bridge or subnet another instance holds fails the worker
  // with the holder's name, instead of its pods taking that instance's addresses later.
  await runtime.hasPodNetwork();
  await runtime.recover();
  return runtime;
}

export class LocalRuntime implements PodRuntime {
  readonly #opts: LocalRuntimeOptions;
  readonly #log: Logger;
  readonly #clock: Clock;
  readonly #binary: string;
  readonly #launcher: Launcher;
  readonly #subnet: Subnet;
  readonly #bridge: string;
  readonly #ips: IpPool;
  readonly #attachVeth: (pid: number, hostIf: string, ip: string) => Promise<void>;
  readonly #userns: boolean;
  readonly #pods = new Map<string, Pod>();
  readonly #listeners = new Set<(id: string) => void>();
  #network: Promise<boolean> | undefined;
  #closed = false;

  constructor(opts: LocalRuntimeOptions, binary: string, launcherBinary: string) {
    this.#opts = opts;
    this.#log = opts.log.child({ component: 'local-runtime' });
    this.#clock = opts.clock ?? systemClock;
    this.#binary = binary;
    const derived = derivedNetwork(resolve(opts.root));
    this.#subnet = parseSubnet(opts.subnet ?? derived.subnet);
    this.#bridge = opts.bridge ?? derived.bridge;
    this.#ips = createIpPool(this.#subnet);
    this.#launcher = new Launcher(launcherBinary, this.#log, this.#clock);
    this.#attachVeth = createVethBatcher(this.#bridge, this.#log, async (lines) => (await this.#launcher.run(['ip', '-force', '-batch', '-'], lines.join('\n') + '\n')).output);
    this.#userns = process.getuid?.() !== 0;
    if (this.#userns) {
      this.#log.warn('local runtime is not running as root: DEGRADED MODE — pods run in a user namespace as your own uid and share the host network (ports on 127.0.0.1)');
    }
  }

  /**
   * As root, a pod's uid 0 is the host's uid 0 (capabilities dropped, but it owns every root-owned
   * file it can reach), and runtimeClassName is ignored: root is refused for tenants. Not root,
   * every pod runs in a user namespace mapping only our own uid, so uid 0 in the pod is us.
   */
  get rootIsolation(): RootIsolation {
    return { userNamespace: this.#userns ? 'always' : 'never', gvisor: false };
  }

  /** The pid of the launcher process that starts pods, while it runs (diagnostics, tests). */
  get launcherPid(): number | undefined {
    return this.#launcher.pid;
  }

  /** Whether pods get their own network namespace and address (false: degraded, host network). */
  hasPodNetwork(): Promise<boolean> {
    this.#network ??= this.#setUpNetwork();
    return this.#network;
  }

  /** Rejects (AsbError Unavailable, naming the holder) when another instance holds the bridge or subnet. */
  async #setUpNetwork(): Promise<boolean> {
    if (this.#userns || this.#opts.network === false) return false;
    const claimsDir = this.#opts.claimsDir ?? DEFAULT_CLAIMS_DIR;
    // Refused, never shared: the other instance's pods would receive our traffic.
    const warnings = await claimNetwork({ bridge: this.#bridge, subnet: this.#subnet.cidr, owner: resolve(this.#opts.root), pid: process.pid }, { claimsDir });
    for (const warning of warnings) this.#log.warn(warning);
    try {
      await ensureBridge(this.#bridge, this.#subnet);
      this.#log.info({ bridge: this.#bridge, subnet: this.#subnet.cidr }, 'pod network ready');
      return true;
    } catch (err) {
      await releaseNetwork(claimsDir, this.#bridge, resolve(this.#opts.root));
      this.#log.warn({ err }, `cannot create bridge ${this.#bridge}: DEGRADED MODE — pods share the host network (ports on 127.0.0.1)`);
      return false;
    }
  }

  /** Loads every pod dir: pods whose init still runs are adopted, the others are Stopped. */
  async recover(): Promise<void> {
    let ids: string[] = [];
    try {
      ids = await readdir(join(this.#opts.root, 'pods'));
    } catch {
      return;
    }
    await Promise.all(ids.filter((id) => ID.test(id)).map(async (id) => {
      const paths = podPaths(this.#opts.root, id);
      const persisted = await readPersisted(paths);
      const pod: Pod = { id, paths, persisted, state: { phase: 'Stopped', ready: false }, generation: 0, stopping: false };
      this.#pods.set(id, pod);
      if (persisted === undefined) return;
      if (persisted.ip !== '127.0.0.1') this.#ips.reserve(persisted.ip);
      pod.state.ip = persisted.ip;
      const { pid, pidStart } = persisted;
      if (pid === undefined || pidStart === undefined || (await processStartTime(pid)) !== pidStart) return;
      this.#running(pod, pid, persisted.startedAt ?? isoNow(this.#clock));
      this.#pollExit(pod, pid, pidStart);
      this.#log.info({ id, pid }, 'adopted running pod');
    }));
  }

  start(req: PodRequest): Promise<PodState> {
    if (this.#closed) return Promise.reject(new AsbError('Unavailable', 'local runtime is closed'));
    if (!ID.test(req.id)) return Promise.reject(new AsbError('BadRequest', `pod id "${req.id}" must match ${ID.source}`));
    let pod = this.#pods.get(req.id);
    if (pod === undefined) {
      pod = { id: req.id, paths: podPaths(this.#opts.root, req.id), persisted: undefined, state: { phase: 'Absent', ready: false }, generation: 0, stopping: false };
      this.#pods.set(req.id, pod);
    }
    const madeFor = pod.persisted?.request.uid;
    if (madeFor !== undefined && madeFor !== req.uid) {
      return Promise.reject(new AsbError('Conflict', `pod ${req.id} and its volumes belong to sandbox uid ${madeFor}, not ${req.uid}; remove it first`));
    }
    if (pod.starting !== undefined) return pod.starting;
    if (pod.state.phase === 'Running') return Promise.resolve(this.state(req.id));
    const current = pod;
    // Answered from state(), which also says whose pod it is (the uid).
    current.starting = this.#start(current, req).then((started) => (this.#pods.get(req.id) === current ? this.state(req.id) : started)).finally(() => (current.starting = undefined));
    return current.starting;
  }

  async #start(pod: Pod, req: PodRequest): Promise<PodState> {
    const generation = ++pod.generation;
    pod.stopping = false;
    pod.pendingExit = undefined;
    const fail = (message: string): PodState => {
      pod.state = { phase: 'Failed', ready: false, message };
      if (pod.persisted !== undefined) pod.state.ip = pod.persisted.ip;
      this.#emit(pod.id);
      return { ...pod.state };
    };
    const container = mainContainer(req.spec);
    const image = resolveImage(container.image);
    if (!image.ok) return fail(image.message);
    pod.state = { phase: 'Pending', ready: false };
    this.#emit(pod.id);
    const net = await this.hasPodNetwork();
    const firstStart = pod.persisted === undefined;
    const kept = pod.persisted?.ip;
    // Kept across hibernation, unless it lies outside this bridge's subnet (hibernated before the
    // subnet changed: state from before subnets were per state dir, or another ASB_SUBNET). It
    // could not be reached there, so the pod gets a new address.
    const moved = net && kept !== undefined && kept !== '127.0.0.1' && !inSubnet(kept, this.#subnet);
    if (moved) this.#log.warn({ id: pod.id, ip: kept, subnet: this.#subnet.cidr }, 'pod address is outside the subnet: it gets a new one');
    const ip = kept !== undefined && !moved ? kept : net ? this.#ips.allocate() : '127.0.0.1';
    pod.persisted = { request: req, ip };
    const { uid, gid } = this.#userns ? { uid: 0, gid: 0 } : podUser(req.spec, container);
    const env = podEnv(req, container, uid);
    const cwd = container.workingDir ?? env.HOME ?? '/';
    let args: string[];
    try {
      const mounts = await resolveMounts(req, container, pod.paths, { uid, gid });
      await prepareEtc(pod.paths, req.hostname, ip, firstStart);
      const initNet: InitNetwork | undefined = net ? { ip, prefix: this.#subnet.prefix, gateway: this.#subnet.gateway } : undefined;
      args = initArgs(pod.paths, req.hostname, { uid, gid, env, cwd, argv: containerArgv(container), mounts }, initNet, this.#userns);
    } catch (err) {
      this.#log.warn({ err, id: pod.id }, 'cannot prepare pod');
      return fail(`cannot prepare pod: ${err instanceof Error ? err.message : String(err)}`);
    }
    pod.lostLauncher = false;
    const launcherLost = (): boolean => pod.lostLauncher === true; // set by the lost hook during the awaits
    pod.exited = new Promise((resolve) => (pod.markExited = resolve));
    const launch = launchPodInit(this.#launcher, this.#binary, args, {
      ...(net ? { attach: (pid: number) => this.#attachVeth(pid, vethName(this.#bridge, pod.id), ip) } : {}),
      exited: (code) => {
        if (pod.generation === generation) this.#exited(pod, code);
      },
      lost: () => {
        if (pod.generation === generation) this.#launcherLost(pod);
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
      return fail(outcome.message);
    }
    launch.child.closeStdin();
    launch.child.unref();
    const startedAt = isoNow(this.#clock);
    const pidStart = await processStartTime(outcome.pid);
    if (pod.generation !== generation) return { ...pod.state };
    pod.persisted = { request: req, ip, pid: outcome.pid, pidStart: pidStart ?? 'gone', startedAt };
    this.#running(pod, outcome.pid, startedAt);
    // The container may have ended already (a command that exits at once).
    const early = pod.pendingExit as number | undefined; // set by the exit event during the awaits
    if (early !== undefined) this.#exited(pod, early);
    else if (launcherLost()) this.#pollExit(pod, outcome.pid, pod.persisted.pidStart ?? 'gone');
    if (pod.target !== undefined) await writePersisted(pod.paths, pod.persisted);
    return { ...pod.state };
  }

  /**
   * The launcher died: running pods keep running but their exit events are gone, so they are
   * watched by polling, like adopted pods. A pod still starting is finished by start().
   */
  #launcherLost(pod: Pod): void {
    pod.lostLauncher = true;
    const { pid, pidStart } = pod.persisted ?? {};
    if (this.#closed || pod.state.phase !== 'Running' || pid === undefined || pidStart === undefined) return;
    this.#pollExit(pod, pid, pidStart);
  }

  #running(pod: Pod, pid: number, startedAt: string): void {
    const request = pod.persisted?.request;
    if (request === undefined) return;
    const container = mainContainer(request.spec);
    const { uid, gid } = this.#userns ? { uid: 0, gid: 0 } : podUser(request.spec, container);
    const env = podEnv(request, container, uid);
    pod.target = { pid, uid, gid, env, cwd: container.workingDir ?? env.HOME ?? '/', userns: this.#userns };
    const probe = container.readinessProbe;
    pod.state = { phase: 'Running', ready: probe === undefined, ip: pod.persisted?.ip ?? '127.0.0.1', pid, startedAt };
    pod.exited ??= new Promise((resolve) => (pod.markExited = resolve));
    if (probe !== undefined && !this.#closed) {
      const target = pod.target;
      pod.probe = startProbeLoop({
        probe,
        clock: this.#clock,
        defaultPeriodMs: this.#opts.probeIntervalMs ?? 1000,
        target: { host: pod.state.ip ?? '127.0.0.1', ports: container.ports ?? [], exec: (command, timeoutMs) => execInPod(target, { command, timeoutMs }) },
        onChange: (ready) => {
          if (pod.state.phase !== 'Running') return;
          pod.state = { ...pod.state, ready };
          this.#emit(pod.id);
        },
        onError: (err) => this.#log.warn({ err, id: pod.id }, 'readiness probe failed to run'),
      });
    }
    this.#emit(pod.id);
  }

  /** For pods we did not spawn (adopted): no exit event, so check the init's pid and start time. */
  #pollExit(pod: Pod, pid: number, pidStart: string): void {
    const generation = pod.generation;
    const check = (): void => {
      void processStartTime(pid).then(async (start) => {
        if (pod.generation !== generation || this.#closed) return;
        if (start === pidStart) {
          pod.poll = this.#clock.after(this.#opts.pollIntervalMs ?? 500, check);
          return;
        }
        this.#exited(pod, (await readExitStatus(pod.paths)) ?? 137);
      });
    };
    pod.poll = this.#clock.after(this.#opts.pollIntervalMs ?? 500, check);
  }

  #exited(pod: Pod, code: number): void {
    pod.probe?.cancel();
    pod.poll?.cancel();
    pod.probe = undefined;
    delete pod.target;
    pod.markExited?.();
    pod.exited = undefined;
    const ip = pod.persisted?.ip;
    if (pod.persisted !== undefined) {
      pod.persisted = { request: pod.persisted.request, ip: pod.persisted.ip };
      writePersisted(pod.paths, pod.persisted).catch((err: unknown) => this.#log.warn({ err, id: pod.id }, 'cannot persist pod state'));
    }
    if (pod.state.phase === 'Pending') {
      pod.pendingExit = code; // start() reports it, with pod-init's message when there is one
      return;
    }
    pod.state = pod.stopping ? { phase: 'Stopped', ready: false } : { phase: code === 0 ? 'Succeeded' : 'Failed', ready: false, exitCode: code, message: `the container exited with code ${code}` };
    if (ip !== undefined) pod.state.ip = ip;
    if (!this.#closed) this.#emit(pod.id);
  }

  async stop(id: string): Promise<void> {
    const pod = this.#pods.get(id);
    if (pod === undefined) return;
    await pod.starting?.catch(() => undefined);
    const target = pod.target;
    if (target === undefined) {
      if (pod.state.phase !== 'Absent' && pod.state.phase !== 'Stopped') {
        pod.state = { phase: 'Stopped', ready: false };
        if (pod.persisted !== undefined) pod.state.ip = pod.persisted.ip;
        this.#emit(id);
      }
      return;
    }
    pod.stopping = true;
    const exited = pod.exited ?? Promise.resolve();
    // The shim and clock timers are unref'd so running pods never hold the worker open; a stop in
    // progress must, or a shutdown that awaits it would exit half-way.
    const keepAlive = setInterval(() => undefined, 60_000);
    try {
      signal(target.pid, 'SIGTERM'); // pod-init forwards it to every process in the pod
      if (!(await this.#within(exited, this.#opts.stopGraceMs ?? 2000))) {
        signal(target.pid, 'SIGKILL'); // pid 1 of the namespace: the kernel kills all the rest
        if (!(await this.#within(exited, 10_000))) throw new AsbError('Timeout', `pod ${id} did not end after SIGKILL`);
      }
    } finally {
      clearInterval(keepAlive);
    }
  }

  #within(p: Promise<void>, ms: number): Promise<boolean> {
    return new Promise((resolve) => {
      const timer = this.#clock.after(ms, () => resolve(false));
      void p.then(() => {
        timer.cancel();
        resolve(true);
      });
    });
  }

  async remove(id: string): Promise<void> {
    const pod = this.#pods.get(id);
    if (pod === undefined) return;
    await this.stop(id);
    pod.generation++;
    this.#pods.delete(id);
    if (pod.persisted !== undefined && pod.persisted.ip !== '127.0.0.1') this.#ips.release(pod.persisted.ip);
    await Promise.all([rm(pod.paths.dir, { recursive: true, force: true }), rm(pod.paths.volumes, { recursive: true, force: true })]);
    this.#emit(id);
  }

  /** Hibernates every running pod, e.g. when `make up` shuts down. */
  async stopAll(): Promise<void> {
    await Promise.all([...this.#pods.keys()].map((id) => this.stop(id)));
  }

  state(id: string): PodState {
    const pod = this.#pods.get(id);
    if (pod === undefined) return { phase: 'Absent', ready: false };
    const uid = pod.persisted?.request.uid;
    return uid === undefined ? { ...pod.state } : { ...pod.state, uid };
  }

  list(): string[] {
    return [...this.#pods.keys()];
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
        this.#log.error({ err, id }, 'onChange listener threw');
      }
    }
  }

  #target(id: string): PodTarget {
    const target = this.#pods.get(id)?.target;
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
    return openPodPty(this.#target(id), opts);
  }

  async spawn(id: string, req: SpawnRequest): Promise<PodProcess> {
    return spawnPodProcess(this.#target(id), req);
  }

  /** Stops probes and watchers; pods keep running and a new runtime re-adopts them. */
  close(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    this.#closed = true;
    for (const pod of this.#pods.values()) {
      pod.probe?.cancel();
      pod.poll?.cancel();
    }
    // The launcher exits without touching the pods it started; a new runtime re-adopts them.
    return this.#launcher.close();
  }
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // already gone
  }
}
