// The pod runtime on Kubernetes: a sandbox is a Pod named after it (plus a PVC per
// volumeClaimTemplate and, when asked, a headless Service) in one namespace, and the kubelet
// runs it. State comes from list+watch caches of our Pods and PVCs (selected by the
// asb.dev/sandbox label; the operator's Informer over the kube store: watches resume from the
// last version seen and relist after 410 Gone, with backoff), so state() reads memory.
//
// Hibernation on Kubernetes keeps only the volumes: stop() deletes the Pod and keeps its PVCs,
// and start() makes a new Pod on the same claims. A stop with memory is refused (KUBE_NO_MEMORY)
// and the Pod keeps running. The container's writable layer (everything
// outside the claim volumes: installed packages, files in /tmp or the home directory when it is
// not on a claim) is gone after a stop, unlike in the local runtime, which keeps it.
//
// Exec, files and PTY go through pods/exec (pod-exec.ts, exec.ts, files.ts).
import type { KubeConfig } from '@kubernetes/client-node';
import type { KubeObject, ResourceType } from '../../api/meta.ts';
import type { RootIsolation } from '../../api/pod-security.ts';
import { isDeepStrictEqual } from 'node:util';
import { AsbError, isAsbError } from '../../errors.ts';
import { Informer } from '../../store/informer.ts';
import { loadKubeConfig } from '../../store/kube-http.ts';
import { openKubeStore, type KubeStore } from '../../store/kube.ts';
import { systemClock, type Clock, type Timer } from '../../base/clock.ts';
import type { Logger } from '../../base/log.ts';
import type { ExecRequest, ExecResult, FileEntry, PodProcess, PodRequest, PodRuntime, PodState, PtyOptions, PtySession, SpawnRequest, StopOptions } from '../runtime.ts';
import { execInPod, openPtyInPod, spawnInPod, type ExecContext } from './exec.ts';
import { ExecCredentials } from './pod-exec.ts';
import { listPodDir, readPodFile, writePodFile } from './files.ts';
import { claimManifests, sandboxUidOf, podManifest, userNamespaceDropped, podState, PodType, PvcType, sandboxOf, SANDBOX_LABEL, serviceManifest, ServiceType, networkPolicyManifest, NetworkPolicyType, type KubePod, type KubePvc } from './objects.ts';
import { DEFAULT_EGRESS_POLICY, type EgressPolicy } from '../../network/egress-policy.ts';
import { DEFAULT_FLOOR, type EgressFloor } from '../../network/egress-floor.ts';

export interface KubeRuntimeOptions {
  /** A kubeconfig file, or one already loaded. */
  kubeconfig: string | KubeConfig;
  /** Where the pods live (the worker's --namespace). */
  namespace: string;
  log: Logger;
  clock?: Clock;
  /**
   * terminationGracePeriodSeconds for pods whose spec sets none: how long a stop lets the
   * container end before the kubelet kills it. Default 2 (Kubernetes' own default is 30).
   */
  stopGraceSeconds?: number;
  /** How long start() waits for the watch to show the new Pod, and stop()/remove() for objects to go. Default 60 s (plus the grace). */
  waitTimeoutMs?: number;
  /**
   * The worker's own kube store, opened on the same kubeconfig: one connection, and the runtime's
   * writes counted with the rest. Without it the runtime opens (and on close closes) its own.
   */
  store?: KubeStore;
  /** Addresses no sandbox's NetworkPolicy opens (src/network/egress-floor.ts). Default DEFAULT_FLOOR: cloud metadata. */
  egressFloor?: EgressFloor;
}

/**
 * Why no pod here keeps its memory, as the API says it (README.md beside this file has the probe
 * on the real node). A pause with memory is only worth taking if it can be brought back, and
 * containerd 2.4's CRI has no restore: CreateContainer never calls the client's
 * container.Restore, and a Pod whose image is a kubelet checkpoint runs that image as an ordinary
 * one. gVisor's containerd shim answers the CRI checkpoint with "not implemented" and restores
 * only through a shim extension that the open-source shim does not have.
 */
export const KUBE_NO_MEMORY = "containerd's CRI (2.4) restores no checkpoint (a Pod whose image is a checkpoint runs it as an ordinary image, without its processes), and gVisor's containerd shim implements neither checkpoint nor restore through the CRI";

// A pod name is a DNS-1123 label here, since it is also the pod's hostname and Service name.
const ID = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
const SYNC_TIMEOUT_MS = 60_000;

interface Waiter {
  done: () => boolean;
  resolve: () => void;
  reject: (err: Error) => void;
  timer: Timer;
}

/** Opens the store, lists our Pods and PVCs and starts watching; resolves once both caches are filled. */
export async function createKubeRuntime(opts: KubeRuntimeOptions): Promise<KubePodRuntime> {
  const kc = loadKubeConfig(opts.kubeconfig);
  const store = opts.store ?? (await openKubeStore({ kubeconfig: kc, namespace: opts.namespace, log: opts.log }));
  const runtime = new KubePodRuntime(opts, kc, store);
  try {
    await runtime.synced();
  } catch (err) {
    await runtime.close();
    throw err;
  }
  return runtime;
}

export class KubePodRuntime implements PodRuntime {
  readonly namespace: string;
  /**
   * The kubelet runs a pod with `hostUsers: false` in a user namespace (Kubernetes 1.33+), which
   * hardenedSpec sets on every pod that does not choose otherwise, and `runtimeClassName: gvisor`
   * names a RuntimeClass (admission refuses the Pod when the cluster has none). Pod Security
   * Admission on the namespace may still refuse root (clusters/README.md).
   */
  readonly rootIsolation: RootIsolation = { userNamespace: 'unless-host-users', gvisor: true };
  readonly #credentials: ExecCredentials;
  readonly #store: KubeStore;
  /** The store is the runtime's own (not the worker's): close() closes it. */
  readonly #ownsStore: boolean;
  readonly #log: Logger;
  readonly #clock: Clock;
  readonly #graceSeconds: number;
  readonly #waitMs: number;
  readonly #pods: Informer<KubePod>;
  readonly #claims: Informer<KubePvc>;
  /** Ids stopped here: Stopped rather than Absent while no Pod runs, even with no claims to show for it. */
  readonly #stopped = new Set<string>();
  readonly #starting = new Map<string, Promise<PodState>>();
  readonly #listeners = new Set<(id: string) => void>();
  /** The state last reported per id, so onChange fires on changes only. */
  readonly #reported = new Map<string, PodState>();
  readonly #waiters = new Set<Waiter>();
  #closed = false;
  readonly #floor: EgressFloor;

  constructor(opts: KubeRuntimeOptions, kc: KubeConfig, store: KubeStore) {
    const { namespace } = opts;
    this.namespace = namespace;
    this.#credentials = new ExecCredentials(kc);
    this.#store = store;
    this.#ownsStore = opts.store === undefined;
    this.#log = opts.log.child({ component: 'kube-runtime', namespace });
    this.#clock = opts.clock ?? systemClock;
    this.#graceSeconds = opts.stopGraceSeconds ?? 2;
    this.#waitMs = opts.waitTimeoutMs ?? 60_000;
    this.#floor = opts.egressFloor ?? DEFAULT_FLOOR;
    const informer = <T extends KubeObject>(type: ResourceType): Informer<T> =>
      new Informer<T>({ store, type, clock: this.#clock, log: this.#log, namespace, labelSelector: SANDBOX_LABEL });
    this.#pods = informer<KubePod>(PodType);
    this.#claims = informer<KubePvc>(PvcType);
    this.#claims.addIndex('sandbox', (pvc) => {
      const id = sandboxOf(pvc);
      return id === undefined ? [] : [id];
    });
    for (const cache of [this.#pods, this.#claims] as const) {
      cache.onChange((_key, current, previous) => {
        const id = sandboxOf(current ?? previous ?? { apiVersion: '', kind: '', metadata: { name: '' } });
        if (id !== undefined) this.#changed(id);
      });
      cache.start();
    }
  }

  async synced(): Promise<void> {
    let timer: Timer | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = this.#clock.after(SYNC_TIMEOUT_MS, () => reject(new AsbError('Unavailable', `kube runtime: no list of pods and claims in namespace ${this.namespace} within ${SYNC_TIMEOUT_MS} ms`)));
    });
    try {
      await Promise.race([Promise.all([this.#pods.synced(), this.#claims.synced()]), timeout]);
    } finally {
      timer?.cancel();
    }
  }

  #pod(id: string): KubePod | undefined {
    return this.#pods.getByName(this.namespace, id);
  }

  #claimsOf(id: string): KubePvc[] {
    return this.#claims.byIndex('sandbox', id);
  }

  state(id: string): PodState {
    const pod = this.#pod(id);
    const kept = this.#claimsOf(id).filter((c) => c.metadata.deletionTimestamp === undefined);
    const state = podState(pod, this.#stopped.has(id) || kept.length > 0);
    const uid = sandboxUidOf(pod) ?? kept.map(sandboxUidOf).find((u) => u !== undefined);
    return uid === undefined || state.phase === 'Absent' ? state : { ...state, uid };
  }

  list(): string[] {
    const ids = new Set(this.#stopped);
    for (const pod of this.#pods.list()) ids.add(pod.metadata.name);
    for (const claim of this.#claims.list()) {
      const id = sandboxOf(claim);
      if (id !== undefined) ids.add(id);
    }
    return [...ids];
  }

  onChange(listener: (id: string) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #changed(id: string): void {
    for (const w of [...this.#waiters]) {
      if (!w.done()) continue;
      this.#waiters.delete(w);
      w.timer.cancel();
      w.resolve();
    }
    const state = this.state(id);
    if (isDeepStrictEqual(this.#reported.get(id), state)) return;
    if (state.phase === 'Absent') this.#reported.delete(id);
    else this.#reported.set(id, state);
    for (const listener of this.#listeners) {
      try {
        listener(id);
      } catch (err) {
        this.#log.error({ err, id }, 'onChange listener threw');
      }
    }
  }

  /** Resolves when done() holds after a cache change (or at once); rejects after ms. */
  #waitUntil(what: string, done: () => boolean, ms: number): Promise<void> {
    if (done()) return Promise.resolve();
    if (this.#closed) return Promise.reject(new AsbError('Unavailable', 'kube runtime is closed'));
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        done,
        resolve,
        reject,
        timer: this.#clock.after(ms, () => {
          this.#waiters.delete(waiter);
          reject(new AsbError('Timeout', `timed out after ${ms} ms waiting for ${what}`));
        }),
      };
      this.#waiters.add(waiter);
    });
  }

  start(req: PodRequest): Promise<PodState> {
    if (this.#closed) return Promise.reject(new AsbError('Unavailable', 'kube runtime is closed'));
    if (!ID.test(req.id)) return Promise.reject(new AsbError('BadRequest', `pod id "${req.id}" must match ${ID.source}`));
    const running = this.#starting.get(req.id);
    if (running !== undefined) return running;
    const started = this.#start(req).finally(() => this.#starting.delete(req.id));
    this.#starting.set(req.id, started);
    return started;
  }

  async #start(req: PodRequest): Promise<PodState> {
    const { id } = req;
    const madeFor = this.state(id).uid;
    if (madeFor !== undefined && madeFor !== req.uid) {
      throw new AsbError('Conflict', `pod ${id} and its volumes belong to sandbox uid ${madeFor}, not ${req.uid}; remove it first`);
    }
    const existing = this.#pod(id);
    if (existing !== undefined && existing.metadata.deletionTimestamp === undefined) return this.state(id);
    if (existing !== undefined) {
      // A stop still in progress: the new Pod takes the name (and the claims) once the old one is gone.
      await this.#waitUntil(`pod ${id} to finish terminating`, () => this.#pod(id)?.metadata.uid !== existing.metadata.uid, this.#waitMs + this.#graceMs(existing));
    }
    for (const claim of claimManifests(req, this.namespace)) await this.#createIfMissing(PvcType, claim);
    // Before the Pod: its egress is what the policy allows from its first packet (the CNI
    // enforces it; without one that enforces NetworkPolicy, nothing does: clusters/README.md).
    await this.setEgressPolicy(id, req.egress ?? DEFAULT_EGRESS_POLICY);
    if (req.service === true) await this.#createIfMissing(ServiceType, serviceManifest(req, this.namespace));
    const manifest = podManifest(req, { namespace: this.namespace, graceSeconds: this.#graceSeconds });
    const created = await this.#createIfMissing(PodType, manifest);
    if (created !== undefined && userNamespaceDropped(manifest, created)) {
      await this.#store.delete(PodType, this.namespace, id).catch((err: unknown) => this.#log.error({ err, id }, 'cannot delete a Pod the API server made without its user namespace'));
      throw new AsbError('Unavailable', `the cluster dropped hostUsers: false from pod ${id} (Kubernetes before 1.33, or the UserNamespacesSupport feature gate off), so it would share the node's user ids; the pod was deleted. Enable user namespaces on the cluster, or run sandboxes under gVisor (runtimeClassName: gvisor)`);
    }
    const uid = created?.metadata.uid;
    await this.#waitUntil(`pod ${id} to appear in the watch`, () => {
      const seen = this.#pod(id);
      return seen !== undefined && (uid === undefined || seen.metadata.uid === uid);
    }, this.#waitMs);
    this.#stopped.delete(id);
    this.#changed(id);
    this.#log.debug({ id, uid }, 'pod created');
    return this.state(id);
  }

  /** Creates or replaces the sandbox's NetworkPolicy (networkPolicyManifest). */
  async setEgressPolicy(id: string, policy: EgressPolicy): Promise<void> {
    const want = networkPolicyManifest(id, this.namespace, policy, this.#floor);
    for (let attempt = 0; attempt < 3; attempt++) {
      const have = await this.#store.tryGet(NetworkPolicyType, this.namespace, id);
      try {
        if (have === undefined) await this.#store.create(NetworkPolicyType, want);
        else if (!isDeepStrictEqual(have.spec, want.spec)) await this.#store.update(NetworkPolicyType, { ...want, metadata: { ...have.metadata, ...want.metadata } });
        return;
      } catch (err) {
        // A racing writer (a start and a PUT): read again and retry.
        if (!isAsbError(err, 'Conflict') && !isAsbError(err, 'AlreadyExists')) throw err;
      }
    }
    throw new AsbError('Conflict', `the NetworkPolicy of sandbox ${id} kept changing while it was being replaced`);
  }

  /** Creates obj; an object of that name already there is fine (kept claims, a racing start). */
  async #createIfMissing<T extends KubeObject>(type: ResourceType, obj: T): Promise<T | undefined> {
    try {
      return await this.#store.create(type, obj);
    } catch (err) {
      if (isAsbError(err, 'AlreadyExists')) return undefined;
      throw err;
    }
  }

  #graceMs(pod: KubePod): number {
    return (pod.spec.terminationGracePeriodSeconds ?? this.#graceSeconds) * 1000;
  }

  async stop(id: string, opts: StopOptions = {}): Promise<void> {
    if (opts.memory === true) {
      // Never a silent filesystem-only stop: the caller asked for memory and is told it cannot have it.
      throw new AsbError('NotImplemented', `the Kubernetes tier cannot keep the memory of pod ${id} (left running): ${KUBE_NO_MEMORY}`);
    }
    await this.#starting.get(id)?.catch(() => undefined);
    const pod = this.#pod(id);
    if (pod === undefined) {
      if (this.list().includes(id) && !this.#stopped.has(id)) {
        this.#stopped.add(id);
        this.#changed(id);
      }
      return;
    }
    this.#stopped.add(id);
    await this.#deletePod(pod);
    this.#changed(id);
  }

  /** Deletes the Pod (graceful: the kubelet stops it, then the object goes) and waits for it to go. */
  async #deletePod(pod: KubePod): Promise<void> {
    const { name, uid } = pod.metadata;
    if (pod.metadata.deletionTimestamp === undefined) {
      try {
        await this.#store.delete(PodType, this.namespace, name, uid === undefined ? {} : { uid });
      } catch (err) {
        // Gone already, or replaced by a Pod of the same name (its uid no longer matches).
        if (!isAsbError(err, 'NotFound') && !isAsbError(err, 'Conflict')) throw err;
      }
    }
    await this.#waitUntil(`pod ${name} to be deleted`, () => this.#pod(name)?.metadata.uid !== uid, this.#waitMs + this.#graceMs(pod));
  }

  async remove(id: string): Promise<void> {
    await this.#starting.get(id)?.catch(() => undefined);
    const pod = this.#pod(id);
    if (pod !== undefined) await this.#deletePod(pod);
    // Claims after the Pod: a PVC in use stays Terminating (pvc-protection) until its Pod is gone.
    for (const claim of this.#claimsOf(id)) {
      if (claim.metadata.deletionTimestamp !== undefined) continue;
      await this.#store.delete(PvcType, this.namespace, claim.metadata.name).catch((err: unknown) => {
        if (!isAsbError(err, 'NotFound')) throw err;
      });
    }
    await this.#store.delete(NetworkPolicyType, this.namespace, id).catch((err: unknown) => {
      if (!isAsbError(err, 'NotFound')) throw err;
    });
    const service = await this.#store.tryGet(ServiceType, this.namespace, id);
    if (service !== undefined && sandboxOf(service) === id) {
      await this.#store.delete(ServiceType, this.namespace, id, service.metadata.uid === undefined ? {} : { uid: service.metadata.uid }).catch((err: unknown) => {
        if (!isAsbError(err, 'NotFound') && !isAsbError(err, 'Conflict')) throw err;
      });
    }
    await this.#waitUntil(`claims of ${id} to be deleted`, () => this.#claimsOf(id).length === 0, this.#waitMs);
    this.#stopped.delete(id);
    this.#changed(id);
  }

  #exec(id: string): ExecContext {
    const pod = this.#pod(id);
    const container = pod?.spec.containers[0]?.name;
    if (pod === undefined || container === undefined || pod.metadata.deletionTimestamp !== undefined || pod.status?.phase !== 'Running') {
      throw new AsbError('SandboxNotRunning', `sandbox pod ${id} is not running`);
    }
    return { credentials: this.#credentials, target: { namespace: this.namespace, pod: id, container }, clock: this.#clock };
  }

  async exec(id: string, req: ExecRequest): Promise<ExecResult> {
    return execInPod(this.#exec(id), req);
  }

  async readFile(id: string, path: string): Promise<Uint8Array> {
    return readPodFile(this.#exec(id), path);
  }

  async writeFile(id: string, path: string, data: Uint8Array | AsyncIterable<Uint8Array>, mode?: number): Promise<void> {
    return writePodFile(this.#exec(id), path, data, mode);
  }

  async listDir(id: string, path: string): Promise<FileEntry[]> {
    return listPodDir(this.#exec(id), path);
  }

  async openPty(id: string, opts: PtyOptions): Promise<PtySession> {
    return openPtyInPod(this.#exec(id), opts);
  }

  async spawn(id: string, req: SpawnRequest): Promise<PodProcess> {
    return spawnInPod(this.#exec(id), req);
  }

  /** Stops watching; the pods keep running (a new runtime finds them by their label). Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#pods.close();
    this.#claims.close();
    for (const w of this.#waiters) {
      w.timer.cancel();
      w.reject(new AsbError('Unavailable', 'kube runtime is closed'));
    }
    this.#waiters.clear();
    if (this.#ownsStore) await this.#store.close();
  }
}
