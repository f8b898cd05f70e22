// The embedded object store: Kubernetes semantics (store.ts) over one SQLite file, for the
// single-machine default.
//
// Reads never touch SQLite: every object lives in memory too, and get/list answer from there
// with deep copies (a claim on the hot path reads in microseconds).
//
// Writes use group commit (sqlite-commit.ts): decided in batches on this thread, persisted by a
// writer thread in one transaction per batch, and acknowledged only once durable. Watches are
// served from memory as writes commit, and resumed from the events table (sqlite-tables.ts).
import type { KubeObject, ResourceType } from '../api/meta.ts';
import { AsbError, isAsbError } from '../errors.ts';
import type { Metrics } from '../metrics/metrics.ts';
import { systemClock, type Clock } from '../base/clock.ts';
import { privateFile, restrictExisting } from '../base/private-files.ts';
import { silentLogger, type Logger } from '../base/log.ts';
import { listPage, objectKey } from './list-page.ts';
import { describeObject, type WriteRequest } from './mutation.ts';
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
import { deepFreeze, ownCopy } from './frozen.ts';
import { acquireOwnerLock, acquireOwnerLockWaiting, type OwnerLock } from './owner-lock.ts';
import { GroupCommit, kindKey, kindOf, toAsbError, type KindState } from './sqlite-commit.ts';

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

export class SqliteStore implements ObjectStore {
  #tables: Tables;
  #log: Logger;
  /** Every committed object by kind; written only by #commit, once durable. */
  #kinds = new Map<string, KindState>();
  #watches = new Map<string, Set<StoreWatch<KubeObject>>>();
  #commit: GroupCommit;
  #lock: OwnerLock;
  #closing: Promise<void> | undefined;

  private constructor(tables: Tables, lock: OwnerLock, opts: SqliteStoreOptions) {
    this.#tables = tables;
    this.#lock = lock;
    this.#log = (opts.log ?? silentLogger()).child({ component: 'store' });
    const rv = readVersion(tables);
    const oldestEvent = readOldestEvent(tables) ?? rv + 1;
    for (const row of readObjects(tables)) {
      kindOf(this.#kinds, row.gk).objects.set(objectKey(row.namespace, row.name), deepFreeze(JSON.parse(row.json) as KubeObject));
    }
    this.#commit = new GroupCommit({
      path: opts.path,
      kinds: this.#kinds,
      rv,
      oldestEvent,
      retention: Math.max(1, opts.eventRetention ?? DEFAULT_EVENT_RETENTION),
      clock: opts.clock ?? systemClock,
      metrics: opts.metrics,
      log: this.#log,
      publish: (gk, ev) => this.#publish(gk, ev),
    });
    this.#log.info({ path: opts.path, resourceVersion: rv, oldestEvent }, 'store opened');
  }

  /** Opens the store under `lock` (taken here, refusing at once, when not given). */
  static open(opts: SqliteStoreOptions, lock: OwnerLock = acquireOwnerLock(opts.path)): SqliteStore {
    let tables: Tables;
    try {
      // 0600 before SQLite opens it: SQLite creates -wal and -shm with the database file's mode,
      // and would create the file itself 0644 (the umask's), readable by every local user
      // (the objects hold E2B envVars). Files an older version made are closed down too.
      privateFile(opts.path);
      restrictExisting([`${opts.path}-wal`, `${opts.path}-shm`, `${opts.path}-journal`]);
      tables = openTables(opts.path);
    } catch (err) {
      lock.release();
      throw err;
    }
    return new SqliteStore(tables, lock, opts);
  }

  /** The last resourceVersion committed. */
  get resourceVersion(): string {
    return String(this.#commit.rv);
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

  exists(rt: ResourceType, namespace: string, name: string): Promise<boolean> {
    return Promise.resolve(this.#kinds.get(kindKey(rt))?.objects.has(objectKey(this.#scope(rt, namespace), name)) ?? false);
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
    const result: ListResult<T> = { items: page.items.map((o) => structuredClone(o) as T), resourceVersion: String(this.#commit.rv) };
    if (page.continue !== undefined) result.continue = page.continue;
    return result;
  }

  create<T extends KubeObject>(rt: ResourceType, obj: T): Promise<T> {
    return this.#enqueue(rt, { op: 'create', obj: ownCopy(obj) });
  }

  update<T extends KubeObject>(rt: ResourceType, obj: T): Promise<T> {
    return this.#enqueue(rt, { op: 'update', obj: ownCopy(obj) });
  }

  updateStatus<T extends KubeObject>(rt: ResourceType, obj: T): Promise<T> {
    return this.#enqueue(rt, { op: 'updateStatus', obj: ownCopy(obj) });
  }

  delete<T extends KubeObject>(rt: ResourceType, namespace: string, name: string, opts: DeleteOptions = {}): Promise<T> {
    return this.#enqueue(rt, { op: 'delete', namespace, name, opts: { ...opts } });
  }

  #enqueue<T extends KubeObject>(rt: ResourceType, req: WriteRequest): Promise<T> {
    if (this.#closing !== undefined) return Promise.reject(new AsbError('Unavailable', 'store is closed'));
    return this.#commit.enqueue(rt, req);
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
    const rv = this.#commit.rv;
    const oldestEvent = this.#commit.oldestEvent;
    const set = this.#watches.get(gk) ?? new Set<StoreWatch<KubeObject>>();
    this.#watches.set(gk, set);
    const w = new StoreWatch<T>({
      filter,
      after: Math.max(rv, from ?? 0),
      handlers,
      log: this.#log,
      onStop: (stopped) => set.delete(stopped),
    });
    set.add(w);
    if (from === undefined || from >= rv) {
      w.start([]);
    } else if (from === 0 && oldestEvent > 1) {
      // "0" means "any version", as in Kubernetes: the current state as ADDED events, then live.
      // While the whole history is still retained we replay it instead (below), so a client
      // that listed an empty store (version "0") and watches from there misses nothing.
      const state = this.#kinds.get(gk);
      const current = state === undefined ? [] : this.#sortedKeys(state).flatMap((key) => state.objects.get(key) ?? []);
      w.start(current.map((object) => ({ rv, type: 'ADDED', namespace: object.metadata.namespace ?? CLUSTER_SCOPE, object, prevLabels: undefined })));
    } else if (from + 1 < oldestEvent) {
      w.fail(
        new AsbError(
          'Gone',
          `resourceVersion ${from} is too old: the store keeps changes after ${oldestEvent - 1}; list again and watch from the list's resourceVersion`,
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
      object: deepFreeze(JSON.parse(row.json) as KubeObject),
      prevLabels: row.prev_labels === null ? undefined : (JSON.parse(row.prev_labels) as Record<string, string>),
    }));
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      // Pending writes are committed (or rejected) before the file closes, never dropped.
      await this.#commit.finish();
      for (const set of this.#watches.values()) for (const w of [...set]) w.close();
      this.#watches.clear();
      await this.#commit.stopWriter();
      this.#tables.db.close();
      this.#lock.release();
      this.#log.info({ resourceVersion: this.#commit.rv }, 'store closed');
    })();
    return this.#closing;
  }
}

function parseVersion(rv: string | undefined): number | undefined {
  if (rv === undefined || rv === '') return undefined;
  if (!/^\d+$/.test(rv)) throw new AsbError('BadRequest', `invalid resourceVersion "${rv}": expected a decimal number`);
  return Number(rv);
}

/**
 * How long a hub or worker start waits for the store's previous owner to exit: as long as `make
 * up` gives a process to stop before it kills it (src/base/child.ts), so a restart right after
 * a stop waits the old process out instead of failing.
 */
export const EXITING_OWNER_WAIT_MS = 20_000;

/**
 * Opens the store; a process still holding it (one exiting, e.g. the previous `make up`) is
 * waited for up to `ownerWaitMs` (default 0: refuse at once), then named in the error.
 */
export async function openSqliteStore(opts: SqliteStoreOptions & { ownerWaitMs?: number }): Promise<SqliteStore> {
  try {
    const lock = await acquireOwnerLockWaiting(opts.path, opts.ownerWaitMs ?? 0);
    return SqliteStore.open(opts, lock);
  } catch (err) {
    throw isAsbError(err) ? err : new AsbError('Unavailable', `store ${opts.path}: ${String(err)}`, { cause: err });
  }
}
