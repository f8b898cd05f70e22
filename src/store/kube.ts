// The object store over a real kube-apiserver: the same ObjectStore contract as the embedded
// SQLite store (store.ts), for clusters where Kubernetes holds the state. Our kinds are custom
// resources (src/api/crd.ts installs them); the apiserver enforces the semantics (optimistic
// concurrency, status subresource, generation, finalizers) and this module translates calls,
// errors and watches.
//
// Hot path: a claim is one conditional PUT (update with the member's resourceVersion). Only an
// unconditional update or updateStatus (no resourceVersion) costs a GET first: the apiserver
// refuses unconditional updates of custom resources, so we read the current version and retry
// on Conflict.
//
// Where the apiserver differs from the embedded store:
// - resourceVersions are etcd revisions, shared by every kind and by the apiserver's own writes;
//   a list's version is the server's, not the last write to that kind.
// - A watch from "0" starts with the current state as ADDED events (no history replay), and a
//   watch from a version etcd has compacted (5 min by default) ends with Gone.
// - A Conflict cannot name the object's current version without another read, so it names
//   only the stale one.
// - delete of an object that goes at once answers with its name, namespace and uid only (the
//   apiserver returns a Status, not the object, for custom resources); one held by finalizers
//   answers with the whole object, as the embedded store does.
// - The write that removes the last finalizer answers with the version before the deletion.
// - Empty lists (finalizers: [], ownerReferences: []) come back absent.
import type { KubeObject, ObjectMeta, ResourceType } from '../api/meta.ts';
import { apiVersionOf } from '../api/meta.ts';
import { AsbError } from '../errors.ts';
import type { Metrics } from '../metrics/metrics.ts';
import { systemClock, type Clock } from '../base/clock.ts';
import { silentLogger, type Logger } from '../base/log.ts';
import { kubeError, type KubeStatus, type Subject } from './kube-errors.ts';
import { KubeHttp, loadKubeConfig, type KubeResponse } from './kube-http.ts';
import { KubeWatch } from './kube-watch.ts';
import { describeObject, type WriteOp } from './mutation.ts';
import type { DeleteOptions, ListOptions, ListResult, ObjectStore, Watch, WatchHandlers, WatchOptions } from './store.ts';
import type { KubeConfig } from '@kubernetes/client-node';

export interface KubeStoreOptions {
  /** A kubeconfig file, or one already loaded. */
  kubeconfig: string | KubeConfig;
  /**
   * The namespace for namespaced objects that name none ('' or absent). Default: the kubeconfig
   * context's namespace, else "default".
   */
  namespace?: string;
  metrics?: Metrics;
  log?: Logger;
  clock?: Clock;
}

// An unconditional update reads, then writes with the version it read; another writer in
// between costs a retry. Eight in a row means the object is being rewritten continuously.
const UNCONDITIONAL_ATTEMPTS = 8;

interface KubeList {
  items?: KubeObject[];
  metadata?: { resourceVersion?: string; continue?: string };
}

// Durations for metrics only; behaviour never depends on them.
function monotonicMs(): number {
  return performance.now();
}

/** metadata.managedFields is server bookkeeping, kilobytes per object that no caller reads. */
function normalize(rt: ResourceType, obj: KubeObject): KubeObject {
  const meta = obj.metadata as ObjectMeta & { managedFields?: unknown };
  if (meta.managedFields !== undefined) delete meta.managedFields;
  obj.apiVersion = apiVersionOf(rt);
  obj.kind = rt.kind;
  return obj;
}

export class KubeStore implements ObjectStore {
  #http: KubeHttp;
  #namespace: string;
  #metrics: Metrics | undefined;
  #log: Logger;
  #clock: Clock;
  #watches = new Set<KubeWatch<KubeObject>>();
  /** Watches finding the server's current version; writes through this store wait for them. */
  #starting = new Set<Promise<unknown>>();
  #closed = false;

  private constructor(http: KubeHttp, opts: KubeStoreOptions) {
    this.#http = http;
    this.#namespace = opts.namespace ?? http.target.namespace ?? 'default';
    this.#metrics = opts.metrics;
    this.#log = (opts.log ?? silentLogger()).child({ component: 'store', server: http.target.server });
    this.#clock = opts.clock ?? systemClock;
  }

  static async open(opts: KubeStoreOptions): Promise<KubeStore> {
    const http = await KubeHttp.open(loadKubeConfig(opts.kubeconfig));
    const store = new KubeStore(http, opts);
    store.#log.info({ namespace: store.#namespace }, 'store opened');
    return store;
  }

  /** The namespace a call lands in: '' for cluster-scoped kinds, the default when none is named. */
  #ns(rt: ResourceType, namespace: string | undefined): string {
    if (!rt.namespaced) return '';
    return namespace === undefined || namespace === '' ? this.#namespace : namespace;
  }

  #collection(rt: ResourceType, namespace: string): string {
    const base = rt.group === '' ? `/api/${rt.version}` : `/apis/${rt.group}/${rt.version}`;
    return rt.namespaced && namespace !== '' ? `${base}/namespaces/${encodeURIComponent(namespace)}/${rt.plural}` : `${base}/${rt.plural}`;
  }

  #item(rt: ResourceType, namespace: string, name: string): string {
    if (name === '') throw new AsbError('BadRequest', `${rt.kind}: a name is required`);
    return `${this.#collection(rt, namespace)}/${encodeURIComponent(name)}`;
  }

  async #call(method: string, path: string, body?: string): Promise<KubeResponse> {
    if (this.#closed) throw new AsbError('Unavailable', 'store is closed');
    return this.#http.request(method, path, body);
  }

  /** A write request, counted in the store metrics as one apiserver write whatever its answer. */
  async #write(op: WriteOp, method: string, path: string, body: string): Promise<KubeResponse> {
    if (this.#starting.size > 0) await Promise.allSettled([...this.#starting]);
    const startedAt = monotonicMs();
    try {
      return await this.#call(method, path, body);
    } finally {
      this.#metrics?.storeWriteSeconds.observe({ op }, (monotonicMs() - startedAt) / 1000);
      // Each apiserver write is its own etcd transaction: batches of one.
      this.#metrics?.storeCommitBatch.observe(1);
    }
  }

  #object(rt: ResourceType, res: KubeResponse, subject: Subject): KubeObject {
    if (res.status < 200 || res.status >= 300) throw kubeError(subject, res.status, res.body);
    if (typeof res.body !== 'object' || res.body === null) {
      throw new AsbError('Internal', `API server answered ${res.status} without an object for ${rt.kind} "${subject.name}"`);
    }
    return normalize(rt, res.body as KubeObject);
  }

  async get<T extends KubeObject>(rt: ResourceType, namespace: string, name: string): Promise<T> {
    const ns = this.#ns(rt, namespace);
    const res = await this.#call('GET', this.#item(rt, ns, name));
    return this.#object(rt, res, { rt, namespace: ns, name }) as T;
  }

  async tryGet<T extends KubeObject>(rt: ResourceType, namespace: string, name: string): Promise<T | undefined> {
    const ns = this.#ns(rt, namespace);
    const res = await this.#call('GET', this.#item(rt, ns, name));
    if (res.status === 404) return undefined;
    return this.#object(rt, res, { rt, namespace: ns, name }) as T;
  }

  async exists(rt: ResourceType, namespace: string, name: string): Promise<boolean> {
    return (await this.tryGet(rt, namespace, name)) !== undefined;
  }

  async list<T extends KubeObject>(rt: ResourceType, opts: ListOptions = {}): Promise<ListResult<T>> {
    const limit = opts.limit ?? 0;
    if (!Number.isInteger(limit) || limit < 0) throw new AsbError('BadRequest', `list limit must be a non-negative integer, got ${limit}`);
    const query = new URLSearchParams();
    if (opts.labelSelector !== undefined && opts.labelSelector.trim() !== '') query.set('labelSelector', opts.labelSelector);
    if (limit > 0) query.set('limit', String(limit));
    if (opts.continue !== undefined && opts.continue !== '') query.set('continue', opts.continue);
    const ns = rt.namespaced && opts.namespace !== undefined ? opts.namespace : '';
    const qs = query.toString();
    const res = await this.#call('GET', `${this.#collection(rt, ns)}${qs === '' ? '' : `?${qs}`}`);
    if (res.status !== 200) throw kubeError({ rt, namespace: ns, name: '' }, res.status, res.body);
    const body = res.body as KubeList;
    const result: ListResult<T> = {
      items: (body.items ?? []).map((o) => normalize(rt, o) as T),
      resourceVersion: body.metadata?.resourceVersion ?? '',
    };
    const next = body.metadata?.continue;
    if (next !== undefined && next !== '') result.continue = next;
    return result;
  }

  /** The body for a write, serialized now: what the caller does with obj afterwards changes nothing. */
  #body(rt: ResourceType, obj: KubeObject, create: boolean): { ns: string; name: string; meta: ObjectMeta; json: string } {
    if (typeof obj !== 'object' || typeof obj.metadata !== 'object') throw new AsbError('Invalid', `${rt.kind} is invalid: metadata: required`);
    const ns = this.#ns(rt, obj.metadata.namespace);
    const meta: ObjectMeta & { managedFields?: unknown } = { ...obj.metadata };
    delete meta.managedFields;
    if (rt.namespaced) meta.namespace = ns;
    else delete meta.namespace;
    if (create) {
      // System fields are the server's to set; a resourceVersion on create is even refused.
      delete meta.uid;
      delete meta.resourceVersion;
      delete meta.generation;
      delete meta.creationTimestamp;
      delete meta.deletionTimestamp;
      if (meta.name === '') delete (meta as Partial<ObjectMeta>).name;
    }
    const json = JSON.stringify({ ...obj, apiVersion: apiVersionOf(rt), kind: rt.kind, metadata: meta });
    return { ns, name: (meta as Partial<ObjectMeta>).name ?? '', meta, json };
  }

  async create<T extends KubeObject>(rt: ResourceType, obj: T): Promise<T> {
    const { ns, name, meta, json } = this.#body(rt, obj, true);
    const res = await this.#write('create', 'POST', this.#collection(rt, ns), json);
    return this.#object(rt, res, { rt, namespace: ns, name: name === '' ? (meta.generateName ?? '') : name }) as T;
  }

  update<T extends KubeObject>(rt: ResourceType, obj: T): Promise<T> {
    return this.#put<T>(rt, obj, 'update');
  }

  updateStatus<T extends KubeObject>(rt: ResourceType, obj: T): Promise<T> {
    return this.#put<T>(rt, obj, 'updateStatus');
  }

  async #put<T extends KubeObject>(rt: ResourceType, obj: T, op: 'update' | 'updateStatus'): Promise<T> {
    const body = this.#body(rt, obj, false);
    const path = this.#item(rt, body.ns, body.name) + (op === 'updateStatus' ? '/status' : '');
    const rv = body.meta.resourceVersion;
    const subject = { rt, namespace: body.ns, name: body.name };
    if (rv !== undefined && rv !== '') {
      const res = await this.#write(op, 'PUT', path, body.json);
      return this.#object(rt, res, { ...subject, resourceVersion: rv }) as T;
    }
    // Unconditional: the apiserver wants a version for custom resources, so write with the
    // current one, and again if someone else wrote in between.
    const snapshot = JSON.parse(body.json) as KubeObject;
    const uid = snapshot.metadata.uid;
    for (let attempt = 1; ; attempt++) {
      const current = await this.get(rt, body.ns, body.name);
      // A uid is a precondition no retry can meet: the object was replaced by another of its name.
      if (uid !== undefined && uid !== '' && uid !== current.metadata.uid) {
        throw new AsbError('Conflict', `${describeObject(rt, body.ns, body.name)}: precondition failed: uid ${uid} given, the object has uid ${current.metadata.uid ?? ''}`);
      }
      const json = JSON.stringify({ ...snapshot, metadata: { ...snapshot.metadata, resourceVersion: current.metadata.resourceVersion } });
      const res = await this.#write(op, 'PUT', path, json);
      if (res.status !== 409 || attempt >= UNCONDITIONAL_ATTEMPTS) return this.#object(rt, res, subject) as T;
    }
  }

  async delete<T extends KubeObject>(rt: ResourceType, namespace: string, name: string, opts: DeleteOptions = {}): Promise<T> {
    const ns = this.#ns(rt, namespace);
    const preconditions: { resourceVersion?: string; uid?: string } = {};
    if (opts.resourceVersion !== undefined && opts.resourceVersion !== '') preconditions.resourceVersion = opts.resourceVersion;
    if (opts.uid !== undefined && opts.uid !== '') preconditions.uid = opts.uid;
    // Background propagation (the default): Foreground would add a finalizer only the garbage
    // collector removes.
    const json = JSON.stringify({ apiVersion: 'v1', kind: 'DeleteOptions', preconditions });
    const res = await this.#write('delete', 'DELETE', this.#item(rt, ns, name), json);
    // Held by finalizers, the answer is the object with deletionTimestamp set. Removed at once,
    // the apiserver answers custom resources with a Status naming only the name and uid.
    const status = res.body as KubeStatus | undefined;
    if (status?.kind !== 'Status' || res.status >= 300) return this.#object(rt, res, { rt, namespace: ns, name, resourceVersion: preconditions.resourceVersion }) as T;
    const uid = status.details?.uid;
    const metadata: ObjectMeta = { name, ...(rt.namespaced ? { namespace: ns } : {}), ...(uid === undefined ? {} : { uid }) };
    return { apiVersion: apiVersionOf(rt), kind: rt.kind, metadata } as T;
  }

  watch<T extends KubeObject>(rt: ResourceType, opts: WatchOptions, handlers: WatchHandlers<T>): Watch {
    if (this.#closed) throw new AsbError('Unavailable', 'store is closed');
    const ns = rt.namespaced && opts.namespace !== undefined ? opts.namespace : '';
    const w = new KubeWatch<T>({
      http: this.#http,
      rt,
      path: this.#collection(rt, ns),
      labelSelector: opts.labelSelector,
      from: opts.resourceVersion ?? '',
      handlers,
      normalize: (obj) => normalize(rt, obj),
      clock: this.#clock,
      log: this.#log,
      onStop: (stopped) => this.#watches.delete(stopped),
    });
    this.#watches.add(w);
    if (opts.resourceVersion !== undefined && opts.resourceVersion !== '') {
      w.start();
      return w;
    }
    // "Now": the apiserver's watch without a version would first replay the current state, so
    // find the current version (a one-item list) and watch from there. Writes made through this
    // store after watch() returned wait for this, so the watch sees every one of them.
    const starting = this.#currentVersion(rt, ns, opts.labelSelector).then(
      (rv) => {
        w.setStart(rv);
        w.start();
      },
      (err: unknown) => w.end(err instanceof Error ? err : new Error(String(err))),
    );
    this.#starting.add(starting);
    void starting.finally(() => this.#starting.delete(starting));
    return w;
  }

  async #currentVersion(rt: ResourceType, ns: string, labelSelector: string | undefined): Promise<string> {
    const opts: ListOptions = { limit: 1, namespace: ns };
    if (labelSelector !== undefined) opts.labelSelector = labelSelector;
    return (await this.list(rt, opts)).resourceVersion;
  }

  close(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    this.#closed = true;
    for (const w of [...this.#watches]) w.close();
    this.#watches.clear();
    this.#http.close();
    this.#log.info('store closed');
    return Promise.resolve();
  }
}

export function openKubeStore(opts: KubeStoreOptions): Promise<KubeStore> {
  return KubeStore.open(opts);
}
