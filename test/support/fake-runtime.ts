// TEST DOUBLE: an in-memory PodRuntime for operator tests. No process runs; a pod "starts" by
// changing a map entry. It becomes ready at once (autoReady) or when the test says so, keeps
// its volumes and IP across stop (hibernation) like the real runtime, and loses them on remove.
// The real runtime lives in src/runtime/local/; end-to-end tests use that one.
import { AsbError } from '../../src/errors.ts';
import type { ExecResult, FileEntry, PodRequest, PodRuntime, PodProcess, PodState, PtySession, SpawnRequest, StartOptions, StopOptions } from '../../src/runtime/runtime.ts';

interface FakePod {
  request: PodRequest;
  state: PodState;
}

export class FakeRuntime implements PodRuntime {
  /** Pods become ready as soon as they start; tests flip it to hold pods in Pending. */
  autoReady: boolean;
  /** Every start/stop/remove call, in order, as `<verb> <id>`. */
  readonly calls: string[] = [];
  #pods = new Map<string, FakePod>();
  /** Volumes per pod id: kept across stop, gone after remove. */
  #volumes = new Set<string>();
  #listeners = new Set<(id: string) => void>();
  #nextIp = 2;

  constructor(opts: { autoReady?: boolean } = {}) {
    this.autoReady = opts.autoReady ?? true;
  }

  /** When set, start() rejects with it (as an API server refusing the Pod would). */
  startError: Error | undefined;
  /**
   * Whether a stop with memory keeps it (as gVisor pods do): false (the default) rejects it with
   * NotImplemented, as runc pods and the Kubernetes tier do; the pod keeps running.
   */
  keepsMemory = false;
  /** When set, a stop with memory rejects with it and the pod keeps running (a save that failed). */
  checkpointError: Error | undefined;
  /** When set, the next restore of a checkpoint fails with this reason: the pod starts from its files. */
  restoreFailure: string | undefined;
  /** Checkpoints kept per stopped pod id. */
  readonly #checkpoints = new Map<string, { bytes: number; at: string }>();

  start(pod: PodRequest, opts: StartOptions = {}): Promise<PodState> {
    this.calls.push(opts.memory === false ? `start ${pod.id} from-files` : `start ${pod.id}`);
    if (this.startError !== undefined) return Promise.reject(this.startError);
    const existing = this.#pods.get(pod.id);
    if (existing !== undefined && existing.request.uid !== pod.uid) {
      // As the real runtimes: a pod and volumes made for another sandbox uid are never reused.
      return Promise.reject(new Error(`fake runtime: pod ${pod.id} belongs to uid ${existing.request.uid}, not ${pod.uid}`));
    }
    if (existing !== undefined && (existing.state.phase === 'Running' || existing.state.phase === 'Pending')) {
      return Promise.resolve({ ...existing.state });
    }
    const ip = existing?.state.ip ?? `10.77.${Math.floor(this.#nextIp / 250)}.${(this.#nextIp++ % 250) + 2}`;
    this.#volumes.add(pod.id);
    const restoring = this.#checkpoints.delete(pod.id) && opts.memory !== false;
    const failure = restoring ? this.restoreFailure : undefined;
    if (restoring) this.restoreFailure = undefined;
    const state: PodState = this.autoReady
      ? { phase: 'Running', ready: true, ip, startedAt: new Date().toISOString() }
      : { phase: 'Pending', ready: false, ip };
    if (failure !== undefined) state.restoreFailure = failure;
    this.#pods.set(pod.id, { request: pod, state });
    this.#emit(pod.id);
    return Promise.resolve({ ...state });
  }

  stop(id: string, opts: StopOptions = {}): Promise<void> {
    this.calls.push(opts.memory === true ? `stop ${id} with-memory` : `stop ${id}`);
    const pod = this.#pods.get(id);
    if (opts.memory === true) {
      if (!this.keepsMemory) return Promise.reject(new AsbError('NotImplemented', `pod ${id} runs on runc, whose pause with memory needs CRIU (fake runtime)`));
      if (this.checkpointError !== undefined) return Promise.reject(this.checkpointError);
      if (pod !== undefined && pod.state.phase !== 'Stopped') this.#checkpoints.set(id, { bytes: 42 * 1024 * 1024, at: new Date().toISOString() });
    }
    if (pod !== undefined && pod.state.phase !== 'Stopped') {
      pod.state = { phase: 'Stopped', ready: false, ...(pod.state.ip === undefined ? {} : { ip: pod.state.ip }) };
      this.#emit(id);
    }
    return Promise.resolve();
  }

  /** When set, every remove() waits for it before it removes anything (a slow teardown: stop, unmounts, runc delete). */
  removeGate: Promise<void> | undefined;

  async remove(id: string): Promise<void> {
    this.calls.push(`remove ${id}`);
    if (this.removeGate !== undefined) await this.removeGate;
    this.#checkpoints.delete(id);
    this.#volumes.delete(id);
    if (this.#pods.delete(id)) this.#emit(id);
  }

  state(id: string): PodState {
    const pod = this.#pods.get(id);
    if (pod === undefined) return { phase: 'Absent', ready: false };
    const checkpoint = pod.state.phase === 'Stopped' ? this.#checkpoints.get(id) : undefined;
    return { ...pod.state, uid: pod.request.uid, ...(checkpoint === undefined ? {} : { checkpoint }) };
  }

  list(): string[] {
    return [...this.#pods.keys()];
  }

  onChange(listener: (id: string) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  // ---- test controls

  /** Marks a pending pod running and ready, as a passing readiness probe would. */
  makeReady(id: string): void {
    const pod = this.#pods.get(id);
    if (pod === undefined) throw new Error(`fake runtime: no pod ${id}`);
    pod.state = { ...pod.state, phase: 'Running', ready: true, startedAt: new Date().toISOString() };
    this.#emit(id);
  }

  /** Makes the pod's main process exit with a failure. */
  fail(id: string, message: string): void {
    const pod = this.#pods.get(id);
    if (pod === undefined) throw new Error(`fake runtime: no pod ${id}`);
    pod.state = { phase: 'Failed', ready: false, exitCode: 1, message };
    this.#emit(id);
  }

  /** Places a pod the operator does not know about, as if left over from before a restart. */
  adopt(request: PodRequest, phase: 'Running' | 'Stopped'): void {
    this.#volumes.add(request.id);
    this.#pods.set(request.id, { request, state: { phase, ready: phase === 'Running', ip: `10.77.250.${this.#nextIp++ % 250}` } });
  }

  hasVolumes(id: string): boolean {
    return this.#volumes.has(id);
  }

  request(id: string): PodRequest | undefined {
    return this.#pods.get(id)?.request;
  }

  // ---- not used by the operator

  exec(): Promise<ExecResult> {
    return Promise.reject(new Error('fake runtime: exec not supported'));
  }
  readFile(): Promise<Uint8Array> {
    return Promise.reject(new Error('fake runtime: readFile not supported'));
  }
  writeFile(): Promise<void> {
    return Promise.reject(new Error('fake runtime: writeFile not supported'));
  }
  listDir(): Promise<FileEntry[]> {
    return Promise.reject(new Error('fake runtime: listDir not supported'));
  }
  openPty(): Promise<PtySession> {
    return Promise.reject(new Error('fake runtime: openPty not supported'));
  }
  /** Not supported; a test double of its own overrides it (test/pod-layers.test.ts). */
  spawn(_id: string, _req: SpawnRequest): Promise<PodProcess> {
    return Promise.reject(new Error('fake runtime: spawn not supported'));
  }
  close(): Promise<void> {
    this.#listeners.clear();
    return Promise.resolve();
  }

  #emit(id: string): void {
    // Asynchronous, like a real runtime's watcher: never re-enters the caller.
    queueMicrotask(() => {
      for (const listener of this.#listeners) listener(id);
    });
  }
}
