// The embedded object store: Kubernetes semantics (store.ts) over one SQLite file, for the
// single-machine default.
//
// Reads never touch SQLite: every object lives in memory too, and get/list answer from there
// with deep copies (a claim on the hot path reads in microseconds).
//
// Writes use group commit. A write call only enqueues; a flush scheduled with setImmediate
// decides every queued write in order against the state the writes before it left (so 50
// compare-and-swaps from one version give one winner and 49 Conflicts), persists all of them in
// ONE transaction (one fsync of the WAL, synchronous=FULL), and only after COMMIT returns
// updates the memory, delivers watch events and settles the promises. Nothing is acknowledged
// before it is durable, so kill -9 at any moment loses no acknowledged write. If COMMIT fails,
// every write in the batch is rejected and memory is untouched (it was never changed).
//
// Watch handlers run synchronously inside the flush, in commit order, before the writers'
// promises resolve: a writer that awaits its write finds its own event already delivered.
import type { KubeObject, ResourceType } from '../api/meta.ts';
import { AsbError, isAsbError } from '../errors.ts';
import type { Metrics } from '../metrics/metrics.ts';
import { isoNow, systemClock, type Clock } from '../system/clock.ts';
import { silentLogger, type Logger } from '../system/log.ts';
import { listPage, objectKey } from './list-page.ts';
import { decide, describeObject, type Decision, type WriteOp, type WriteRequest } from './mutation.ts';
import { parseSelector } from './selector.ts';
import { openTables, readEventsAfter, readObjects, readOldestEvent, readVersion, type Tables } from './sqlite-tables.ts';
import {
  CLUSTER_SCOPE,
  type DeleteOptions,
  type ListOptions,
  type ListResult,
  type ObjectStore,
  type Watch,
  type WatchHandlers,
  type WatchOptions,
} from './store.ts';
import { StoreWatch, type StoredEvent } from './watch-stream.ts';

export interface SqliteStoreOptions {
  /** The database file; created if missing. */
  path: string;
  clock?: Clock;
  metrics?: Metrics;
  log?: Logger;
  /** Events kept for watch resumption; older versions get Gone. Default 100,000. */
  eventRetention?: number;
}

// 100k events is ~1-2 hours of a busy worker (20 writes/s) at ~1 KB each: 100 MB at most.
const DEFAULT_EVENT_RETENTION = 100_000;
// One transaction holds at most this many writes, so a burst cannot stall the event loop for
// long in one synchronous flush; the rest go in the next flush, one setImmediate later.
const MAX_BATCH = 1024;

interface PendingWrite {
  rt: ResourceType;
  req: WriteRequest;
  startedAt: number;
  resolve: (obj: KubeObject) => void;
  reject: (err: Error) => void;
}

type Outcome = { ok: true; object: KubeObject } | { ok: false; err: AsbError };

interface KindState {
  objects: Map<string, KubeObject>;
  /** Keys in list order; rebuilt lazily after a create or delete. */
  sorted: string[] | undefined;
}

interface StagedEvent {
  gk: string;
  ev: StoredEvent;
  name: string;
}

function kindKey(rt: ResourceType): string {
  return `${rt.group}/${rt.kind}`;
}

function toAsbError(err: unknown): AsbError {
  if (err instanceof AsbError) return err;
  return new AsbError('Internal', `store: unexpected failure: ${String(err)}`, { cause: err });
}

// Durations for metrics only; behaviour never depends on them, so they need no injected clock.
function monotonicMs(): number {
  return performance.now();
}

export class SqliteStore implements ObjectStore {
  #tables: Tables;
  #clock: Clock;
  #metrics: Metrics | undefined;
  #log: Logger;
  #retention: number;
  #kinds = new Map<string, KindState>();
  #watches = new Map<string, Set<StoreWatch<KubeObject>>>();
  #queue: PendingWrite[] = [];
  #flushScheduled = false;
  /** The last resourceVersion handed out (and committed). */
  #rv: number;
  /** The oldest version a watch can resume from is #oldestEvent - 1. */
  #oldestEvent: number;
  #closing: Promise<void> | undefined;

  private constructor(tables: Tables, opts: SqliteStoreOptions) {
    this.#tables = tables;
    this.#clock = opts.clock ?? systemClock;
    this.#metrics = opts.metrics;
    this.#log = (opts.log ?? silentLogger()).child({ component: 'store' });
    this.#retention = Math.max(1, opts.eventRetention ?? DEFAULT_EVENT_RETENTION);
    this.#rv = readVersion(tables);
    this.#oldestEvent = readOldestEvent(tables) ?? this.#rv + 1;
    for (const row of readObjects(tables)) {
      this.#kind(row.gk).objects.set(objectKey(row.namespace, row.name), JSON.parse(row.json) as KubeObject);
    }
    this.#log.info({ path: opts.path, resourceVersion: this.#rv, oldestEvent: this.#oldestEvent }, 'store opened');
  }

  static open(opts: SqliteStoreOptions): SqliteStore {
    return new SqliteStore(openTables(opts.path), opts);
  }

  /** The last resourceVersion committed. */
  get resourceVersion(): string {
    return String(this.#rv);
  }

  #kind(gk: string): KindState {
    let state = this.#kinds.get(gk);
    if (state === undefined) {
      state = { objects: new Map(), sorted: undefined };
      this.#kinds.set(gk, state);
    }
    return state;
  }

  #sortedKeys(state: KindState): string[] {
    state.sorted ??= [...state.objects.keys()].sort();
    return state.sorted;
  }

  #scope(rt: ResourceType, namespace: string): string {
    return rt.namespaced ? namespace : CLUSTER_SCOPE;
  }

  async get<T extends KubeObject>(rt: ResourceType, namespace: string, name: string): Promise<T> {
    const found = await this.tryGet<T>(rt, namespace, name);
    if (found === undefined) throw new AsbError('NotFound', `${describeObject(rt, namespace, name)} not found`);
    return found;
  }

  tryGet<T extends KubeObject>(rt: ResourceType, namespace: string, name: string): Promise<T | undefined> {
    const obj = this.#kinds.get(kindKey(rt))?.objects.get(objectKey(this.#scope(rt, namespace), name));
    return Promise.resolve(obj === undefined ? undefined : (structuredClone(obj) as T));
  }

  list<T extends KubeObject>(rt: ResourceType, opts: ListOptions = {}): Promise<ListResult<T>> {
    try {
      return Promise.resolve(this.#listNow<T>(rt, opts));
    } catch (err) {
      return Promise.reject(toAsbError(err));
    }
  }

  #listNow<T extends KubeObject>(rt: ResourceType, opts: ListOptions): ListResult<T> {
    const state = this.#kinds.get(kindKey(rt));
    const page = listPage(rt, state?.objects ?? new Map<string, KubeObject>(), state === undefined ? [] : this.#sortedKeys(state), opts);
    const result: ListResult<T> = { items: page.items.map((o) => structuredClone(o) as T), resourceVersion: String(this.#rv) };
    if (page.continue !== undefined) result.continue = page.continue;
    return result;
  }

  create<T extends KubeObject>(rt: ResourceType, obj: T): Promise<T> {
    return this.#enqueue(rt, { op: 'create', obj: structuredClone(obj) });
  }

  update<T extends KubeObject>(rt: ResourceType, obj: T): Promise<T> {
    return this.#enqueue(rt, { op: 'update', obj: structuredClone(obj) });
  }

  updateStatus<T extends KubeObject>(rt: ResourceType, obj: T): Promise<T> {
    return this.#enqueue(rt, { op: 'updateStatus', obj: structuredClone(obj) });
  }

  delete<T extends KubeObject>(rt: ResourceType, namespace: string, name: string, opts: DeleteOptions = {}): Promise<T> {
    return this.#enqueue(rt, { op: 'delete', namespace, name, opts: { ...opts } });
  }

  #enqueue<T extends KubeObject>(rt: ResourceType, req: WriteRequest): Promise<T> {
    if (this.#closing !== undefined) return Promise.reject(new AsbError('Unavailable', 'store is closed'));
    return new Promise<T>((resolve, reject) => {
      this.#queue.push({ rt, req, startedAt: monotonicMs(), resolve: (o) => resolve(o as T), reject });
      this.#scheduleFlush();
    });
  }

  #scheduleFlush(): void {
    if (this.#flushScheduled) return;
    this.#flushScheduled = true;
    setImmediate(() => {
      this.#flushScheduled = false;
      this.#flush();
    });
  }

  /** Decides, commits and acknowledges up to MAX_BATCH queued writes. */
  #flush(): void {
    const batch = this.#queue.splice(0, MAX_BATCH);
    if (this.#queue.length > 0) this.#scheduleFlush();
    if (batch.length === 0) return;
    // Writes in this batch see each other's effects through `staged` (null: deleted).
    const staged = new Map<string, Map<string, KubeObject | null>>();
    const outcomes: Outcome[] = [];
    const events: StagedEvent[] = [];
    const now = isoNow(this.#clock);
    let rv = this.#rv;
    for (const w of batch) {
      const gk = kindKey(w.rt);
      const stagedKind = staged.get(gk) ?? new Map<string, KubeObject | null>();
      staged.set(gk, stagedKind);
      const committed = this.#kinds.get(gk)?.objects;
      const lookup = (ns: string, name: string): KubeObject | undefined => {
        const key = objectKey(ns, name);
        const s = stagedKind.get(key);
        return s === null ? undefined : (s ?? committed?.get(key));
      };
      let d: Decision;
      try {
        d = decide({ rt: w.rt, lookup, rv: String(rv + 1), now }, w.req);
      } catch (err) {
        outcomes.push({ ok: false, err: toAsbError(err) });
        continue;
      }
      if (d.kind === 'noop') {
        outcomes.push({ ok: true, object: d.result });
        continue;
      }
      rv++;
      stagedKind.set(objectKey(d.namespace, d.name), d.kind === 'put' ? d.object : null);
      const type = d.kind === 'put' ? d.type : 'DELETED';
      const prevLabels = d.prev?.metadata.labels ?? (d.prev === undefined ? undefined : {});
      events.push({ gk, name: d.name, ev: { rv, type, namespace: d.namespace, object: d.object, prevLabels } });
      outcomes.push({ ok: true, object: d.object });
    }
    if (events.length > 0) {
      try {
        this.#persist(events, rv);
      } catch (err) {
        const failure = new AsbError('Unavailable', `store commit failed; ${batch.length} writes rejected: ${String(err)}`, { cause: err });
        this.#log.error({ err, writes: batch.length }, 'store commit failed');
        for (const w of batch) w.reject(failure);
        return;
      }
      this.#rv = rv;
      this.#oldestEvent = Math.max(this.#oldestEvent, rv - this.#retention + 1);
      this.#apply(staged);
    }
    this.#metrics?.storeCommitBatch.observe(batch.length);
    const done = monotonicMs();
    for (const [i, w] of batch.entries()) {
      this.#metrics?.storeWriteSeconds.observe({ op: w.req.op satisfies WriteOp }, (done - w.startedAt) / 1000);
      const outcome = outcomes[i];
      if (outcome === undefined) w.reject(new AsbError('Internal', 'store: write lost its outcome'));
      else if (outcome.ok) w.resolve(structuredClone(outcome.object));
      else w.reject(outcome.err);
    }
    for (const { gk, ev } of events) this.#publish(gk, ev);
  }

  #persist(events: StagedEvent[], rv: number): void {
    const t = this.#tables;
    t.db.exec('BEGIN IMMEDIATE');
    try {
      for (const { gk, name, ev } of events) {
        const json = JSON.stringify(ev.object);
        if (ev.type === 'DELETED') t.deleteObject.run(gk, ev.namespace, name);
        else t.upsertObject.run(gk, ev.namespace, name, ev.rv, json);
        const prev = ev.prevLabels === undefined ? null : JSON.stringify(ev.prevLabels);
        t.insertEvent.run(ev.rv, ev.type, gk, ev.namespace, name, json, prev);
      }
      t.setMeta.run('rv', String(rv));
      // Versions are dense (one per write), so "keep the last N" is a range delete on the key.
      t.trimEvents.run(rv - this.#retention);
      t.db.exec('COMMIT');
    } catch (err) {
      if (t.db.isTransaction) t.db.exec('ROLLBACK');
      throw err;
    }
  }

  #apply(staged: Map<string, Map<string, KubeObject | null>>): void {
    for (const [gk, changes] of staged) {
      const state = this.#kind(gk);
      for (const [key, obj] of changes) {
        const existed = state.objects.has(key);
        if (obj === null) state.objects.delete(key);
        else state.objects.set(key, obj);
        if (existed !== (obj !== null)) state.sorted = undefined;
      }
    }
  }

  #publish(gk: string, ev: StoredEvent): void {
    const watches = this.#watches.get(gk);
    if (watches === undefined) return;
    for (const w of watches) w.deliver(ev);
  }

  watch<T extends KubeObject>(rt: ResourceType, opts: WatchOptions, handlers: WatchHandlers<T>): Watch {
    if (this.#closing !== undefined) throw new AsbError('Unavailable', 'store is closed');
    const gk = kindKey(rt);
    const filter = {
      namespace: rt.namespaced && opts.namespace !== undefined && opts.namespace !== '' ? opts.namespace : undefined,
      selector: parseSelector(opts.labelSelector),
    };
    const from = parseVersion(opts.resourceVersion);
    const set = this.#watches.get(gk) ?? new Set<StoreWatch<KubeObject>>();
    this.#watches.set(gk, set);
    const w = new StoreWatch<T>({
      filter,
      after: Math.max(this.#rv, from ?? 0),
      handlers,
      log: this.#log,
      onStop: (stopped) => set.delete(stopped),
    });
    set.add(w);
    if (from === undefined || from >= this.#rv) {
      w.start([]);
    } else if (from === 0 && this.#oldestEvent > 1) {
      // "0" means "any version", as in Kubernetes: the current state as ADDED events, then live.
      // While the whole history is still retained we replay it instead (below), so a client
      // that listed an empty store (version "0") and watches from there misses nothing.
      const state = this.#kinds.get(gk);
      const current = state === undefined ? [] : this.#sortedKeys(state).flatMap((key) => state.objects.get(key) ?? []);
      w.start(current.map((object) => ({ rv: this.#rv, type: 'ADDED', namespace: object.metadata.namespace ?? CLUSTER_SCOPE, object, prevLabels: undefined })));
    } else if (from + 1 < this.#oldestEvent) {
      w.fail(
        new AsbError(
          'Gone',
          `resourceVersion ${from} is too old: the store keeps changes after ${this.#oldestEvent - 1}; list again and watch from the list's resourceVersion`,
        ),
      );
    } else {
      w.start(this.#replay(gk, from));
    }
    return w;
  }

  #replay(gk: string, from: number): StoredEvent[] {
    return readEventsAfter(this.#tables, gk, from).map((row) => ({
      rv: row.rv,
      type: row.type === 'ADDED' || row.type === 'DELETED' ? row.type : 'MODIFIED',
      namespace: row.namespace,
      object: JSON.parse(row.json) as KubeObject,
      prevLabels: row.prev_labels === null ? undefined : (JSON.parse(row.prev_labels) as Record<string, string>),
    }));
  }

  close(): Promise<void> {
    this.#closing ??= Promise.resolve().then(() => {
      // Pending writes are committed (or rejected) before the file closes, never dropped.
      while (this.#queue.length > 0) this.#flush();
      for (const set of this.#watches.values()) for (const w of [...set]) w.close();
      this.#watches.clear();
      this.#tables.db.close();
      this.#log.info({ resourceVersion: this.#rv }, 'store closed');
    });
    return this.#closing;
  }
}

function parseVersion(rv: string | undefined): number | undefined {
  if (rv === undefined || rv === '') return undefined;
  if (!/^\d+$/.test(rv)) throw new AsbError('BadRequest', `invalid resourceVersion "${rv}": expected a decimal number`);
  return Number(rv);
}

export function openSqliteStore(opts: SqliteStoreOptions): Promise<SqliteStore> {
  try {
    return Promise.resolve(SqliteStore.open(opts));
  } catch (err) {
    return Promise.reject(isAsbError(err) ? err : new AsbError('Unavailable', `store ${opts.path}: ${String(err)}`, { cause: err }));
  }
}
