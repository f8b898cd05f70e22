// A list+watch cache of one kind, supervised here rather than trusted to restart itself:
// list, then watch from the list's resourceVersion (no gap); when the watch ends (Gone, store
// closed, error) relist with backoff (50 ms doubling to 10 s) and notify every key that changed
// across the gap. Handlers receive the key plus the current and previous object so they can map
// a change to the keys of other controllers (owner, pool, claim); controllers only see keys.
import type { KubeObject, ResourceType } from '../api/meta.ts';
import type { Clock, Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import type { ObjectStore, Watch, WatchEvent } from '../store/store.ts';

export type ChangeHandler<T> = (key: string, current: T | undefined, previous: T | undefined) => void;
/** Maps an object to the index values it is found under. */
export type IndexFn<T> = (obj: T) => readonly string[];

export interface InformerOptions {
  store: ObjectStore;
  type: ResourceType;
  clock: Clock;
  log: Logger;
  namespace?: string;
  labelSelector?: string;
}

const RELIST_BASE_MS = 50;
const RELIST_MAX_MS = 10_000;

export function objectKey(obj: KubeObject): string {
  return `${obj.metadata.namespace ?? ''}/${obj.metadata.name}`;
}

export function splitKey(key: string): { namespace: string; name: string } {
  const slash = key.indexOf('/');
  return { namespace: key.slice(0, slash), name: key.slice(slash + 1) };
}

export class Informer<T extends KubeObject> {
  readonly type: ResourceType;
  #opts: InformerOptions;
  #log: Logger;
  #cache = new Map<string, T>();
  #handlers: ChangeHandler<T>[] = [];
  #indexFns = new Map<string, IndexFn<T>>();
  /** index name → value → keys */
  #indexes = new Map<string, Map<string, Set<string>>>();
  #watch: Watch | undefined;
  #retry: Timer | undefined;
  #failures = 0;
  #healthy = false;
  #closed = false;
  #synced: Promise<void>;
  #markSynced: () => void = () => undefined;

  constructor(opts: InformerOptions) {
    this.type = opts.type;
    this.#opts = opts;
    this.#log = opts.log.child({ informer: opts.type.kind });
    this.#synced = new Promise((resolve) => {
      this.#markSynced = resolve;
    });
  }

  /** Handlers run synchronously inside watch delivery: keep them to enqueues and map updates. */
  onChange(handler: ChangeHandler<T>): () => void {
    this.#handlers.push(handler);
    return () => {
      this.#handlers = this.#handlers.filter((h) => h !== handler);
    };
  }

  /** Adds an index; call before start(). */
  addIndex(name: string, fn: IndexFn<T>): void {
    this.#indexFns.set(name, fn);
    this.#indexes.set(name, new Map());
  }

  start(): void {
    void this.#relist();
  }

  /** Resolves once the first list has filled the cache. */
  synced(): Promise<void> {
    return this.#synced;
  }

  /** True while a watch is open on top of a complete list. */
  get healthy(): boolean {
    return this.#healthy;
  }

  get(key: string): T | undefined {
    return this.#cache.get(key);
  }

  getByName(namespace: string, name: string): T | undefined {
    return this.#cache.get(`${namespace}/${name}`);
  }

  list(): T[] {
    return [...this.#cache.values()];
  }

  byIndex(index: string, value: string): T[] {
    const keys = this.#indexes.get(index)?.get(value);
    if (keys === undefined) return [];
    const out: T[] = [];
    for (const key of keys) {
      const obj = this.#cache.get(key);
      if (obj !== undefined) out.push(obj);
    }
    return out;
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#healthy = false;
    this.#retry?.cancel();
    this.#watch?.close();
  }

  #isClosed(): boolean {
    return this.#closed;
  }

  async #relist(): Promise<void> {
    if (this.#closed) return;
    const { store, type, namespace, labelSelector } = this.#opts;
    try {
      const listOpts = { ...(namespace === undefined ? {} : { namespace }), ...(labelSelector === undefined ? {} : { labelSelector }) };
      const items: T[] = [];
      let resourceVersion = '';
      let token: string | undefined;
      do {
        const page = await store.list<T>(type, { ...listOpts, ...(token === undefined ? {} : { continue: token }) });
        items.push(...page.items);
        resourceVersion = page.resourceVersion;
        token = page.continue;
      } while (token !== undefined);
      if (this.#isClosed()) return;
      this.#replace(items);
      this.#watch = store.watch<T>(type, { ...listOpts, resourceVersion }, {
        onEvent: (event) => this.#apply(event),
        onError: (err) => this.#watchEnded(err),
      });
      this.#failures = 0;
      this.#healthy = true;
      this.#markSynced();
    } catch (err) {
      this.#watchEnded(err instanceof Error ? err : new Error(String(err)));
    }
  }

  #watchEnded(err: Error): void {
    this.#healthy = false;
    this.#watch = undefined;
    if (this.#closed) return;
    this.#failures += 1;
    const delay = Math.min(RELIST_MAX_MS, RELIST_BASE_MS * 2 ** Math.min(this.#failures - 1, 20));
    this.#log.warn({ err, delay }, 'watch ended; relisting');
    this.#retry = this.#clock.after(delay, () => void this.#relist());
  }

  get #clock(): Clock {
    return this.#opts.clock;
  }

  #replace(items: T[]): void {
    const seen = new Set<string>();
    for (const obj of items) {
      const key = objectKey(obj);
      seen.add(key);
      const prev = this.#cache.get(key);
      if (prev?.metadata.resourceVersion === obj.metadata.resourceVersion && prev !== undefined) continue;
      this.#set(key, obj, prev);
    }
    for (const [key, prev] of [...this.#cache]) {
      if (!seen.has(key)) this.#remove(key, prev);
    }
  }

  #apply(event: WatchEvent<T>): void {
    if (event.type === 'BOOKMARK') return;
    const key = objectKey(event.object);
    const prev = this.#cache.get(key);
    if (event.type === 'DELETED') {
      if (prev !== undefined) this.#remove(key, prev);
      return;
    }
    this.#set(key, event.object, prev);
  }

  #set(key: string, obj: T, prev: T | undefined): void {
    if (prev !== undefined) this.#unindex(key, prev);
    this.#cache.set(key, obj);
    for (const [name, fn] of this.#indexFns) {
      const index = this.#indexes.get(name);
      if (index === undefined) continue;
      for (const value of fn(obj)) {
        let keys = index.get(value);
        if (keys === undefined) index.set(value, (keys = new Set()));
        keys.add(key);
      }
    }
    this.#notify(key, obj, prev);
  }

  #remove(key: string, prev: T): void {
    this.#unindex(key, prev);
    this.#cache.delete(key);
    this.#notify(key, undefined, prev);
  }

  #unindex(key: string, obj: T): void {
    for (const [name, fn] of this.#indexFns) {
      const index = this.#indexes.get(name);
      if (index === undefined) continue;
      for (const value of fn(obj)) {
        const keys = index.get(value);
        keys?.delete(key);
        if (keys?.size === 0) index.delete(value);
      }
    }
  }

  #notify(key: string, current: T | undefined, previous: T | undefined): void {
    for (const handler of this.#handlers) {
      try {
        handler(key, current, previous);
      } catch (err) {
        this.#log.error({ err, key }, 'informer handler threw');
      }
    }
  }
}
