// The router's route table: every sandbox of every worker cluster, in memory, fed by each
// worker's route feed (contract.ts). Lookups are a Map get: no remote call on the hot path for
// a known sandbox. Unknown ids that a worker confirmed missing sit in an LRU so a flood of
// requests for a bogus id costs one lookup per TTL, not one per request.
import { LRUCache } from 'lru-cache';
import { clusterTagOf } from '../api/ids.ts';
import type { Clock } from '../base/clock.ts';
import type { FeedMessage, RouteEntry } from './contract.ts';

export type ApplyResult = 'applied' | 'stale' | 'unsynced' | 'foreign';

interface FeedState {
  /** Last applied version; deltas at or below it are duplicates or out of order. */
  version: number;
  /** A snapshot arrived on the current connection; deltas before one are refused. */
  synced: boolean;
  /** The feed connection is up (the worker is reachable). */
  connected: boolean;
}

export interface RouteTableOptions {
  clock: Clock;
  /** Most ids remembered as missing. Default 100 000 (~10 MB at worst). */
  negativeMax?: number;
  /** How long an id stays known-missing. Default 5 s: a typo'd URL retried in a loop costs one worker lookup per 5 s. */
  negativeTtlMs?: number;
}

type Watcher = (entry: RouteEntry | undefined) => void;
const NO_PORTS: readonly number[] = Object.freeze([]);

export class RouteTable {
  readonly #entries = new Map<string, RouteEntry>();
  readonly #feeds = new Map<string, FeedState>();
  readonly #tags = new Map<string, string>();
  readonly #watchers = new Map<string, Set<Watcher>>();
  readonly #missing: LRUCache<string, true>;
  // 1 000 000 entries share a handful of cluster and owner names: interning them saves ~40 B each.
  readonly #interned = new Map<string, string>();
  #missingHits = 0;

  constructor(opts: RouteTableOptions) {
    const clock = opts.clock;
    this.#missing = new LRUCache<string, true>({
      max: opts.negativeMax ?? 100_000,
      ttl: opts.negativeTtlMs ?? 5_000,
      ttlResolution: 0,
      perf: { now: () => clock.now() },
    });
  }

  get size(): number {
    return this.#entries.size;
  }

  get(id: string): RouteEntry | undefined {
    return this.#entries.get(id);
  }

  /** Applies one feed message from `cluster`'s worker under the version rules of contract.ts. */
  apply(cluster: string, msg: FeedMessage): ApplyResult {
    const feed = this.#feed(cluster);
    if (msg.type === 'snapshot') {
      if (msg.cluster !== cluster) return 'foreign';
      const fresh = new Set<string>();
      for (const entry of msg.entries) {
        if (entry.cluster !== cluster) continue;
        fresh.add(entry.id);
        this.#put(entry);
      }
      for (const [id, entry] of this.#entries) {
        if (entry.cluster === cluster && !fresh.has(id)) this.#remove(id);
      }
      feed.version = msg.version;
      feed.synced = true;
      return 'applied';
    }
    // The federation registry is not a route entry (handled by the router's registry).
    if (msg.type === 'clusters') return 'applied';
    if (!feed.synced) return 'unsynced';
    if (msg.version <= feed.version) return 'stale';
    if (msg.type === 'upsert') {
      if (msg.entry.cluster !== cluster) return 'foreign';
      this.#put(msg.entry);
    } else {
      const current = this.#entries.get(msg.id);
      if (current !== undefined && current.cluster !== cluster) return 'foreign';
      this.#remove(msg.id);
    }
    feed.version = msg.version;
    return 'applied';
  }

  /** The feed connection went up or down. Down keeps the entries (pods keep serving) but unsyncs. */
  setConnected(cluster: string, connected: boolean): void {
    const feed = this.#feed(cluster);
    feed.connected = connected;
    if (!connected) feed.synced = false;
  }

  isConnected(cluster: string): boolean {
    return this.#feeds.get(cluster)?.connected ?? false;
  }

  isSynced(cluster: string): boolean {
    return this.#feeds.get(cluster)?.synced ?? false;
  }

  version(cluster: string): number | undefined {
    return this.#feeds.get(cluster)?.version;
  }

  /** The cluster a generated id belongs to, learnt from the tags of ids the feeds delivered. */
  clusterOfId(id: string): string | undefined {
    const tag = clusterTagOf(id);
    return tag === undefined ? undefined : this.#tags.get(tag);
  }

  rememberMissing(id: string): void {
    this.#missing.set(id, true);
  }

  /** Whether a worker confirmed `id` missing within the TTL; each yes is a request answered without a lookup. */
  isKnownMissing(id: string): boolean {
    if (this.#missing.get(id) !== true) return false;
    this.#missingHits += 1;
    return true;
  }

  /** Requests answered 404 from the negative cache so far (metrics). */
  get knownMissingHits(): number {
    return this.#missingHits;
  }

  /** Calls fn after every change to `id` (upsert, delete, snapshot) until the returned function is called. */
  watch(id: string, fn: Watcher): () => void {
    let set = this.#watchers.get(id);
    if (set === undefined) {
      set = new Set();
      this.#watchers.set(id, set);
    }
    set.add(fn);
    return () => {
      const current = this.#watchers.get(id);
      if (current === undefined) return;
      current.delete(fn);
      if (current.size === 0) this.#watchers.delete(id);
    };
  }

  #feed(cluster: string): FeedState {
    let feed = this.#feeds.get(cluster);
    if (feed === undefined) {
      feed = { version: 0, synced: false, connected: false };
      this.#feeds.set(cluster, feed);
    }
    return feed;
  }

  #put(raw: RouteEntry): void {
    const entry: RouteEntry = {
      id: raw.id,
      cluster: this.#intern(raw.cluster),
      state: raw.state,
      defaultPort: raw.defaultPort,
      publicPorts: raw.publicPorts.length === 0 ? (NO_PORTS as number[]) : raw.publicPorts,
      tokenHash: raw.tokenHash,
      owner: this.#intern(raw.owner),
    };
    if (raw.podIp !== undefined) entry.podIp = raw.podIp;
    if (raw.envdInPod === true) entry.envdInPod = true;
    if (raw.resumeOnTraffic === false) entry.resumeOnTraffic = false;
    if (raw.h2cPorts !== undefined && raw.h2cPorts.length > 0) entry.h2cPorts = raw.h2cPorts;
    this.#entries.set(entry.id, entry);
    this.#missing.delete(entry.id);
    const tag = clusterTagOf(entry.id);
    if (tag !== undefined && !this.#tags.has(tag)) this.#tags.set(tag, entry.cluster);
    this.#notify(entry.id, entry);
  }

  #remove(id: string): void {
    if (!this.#entries.delete(id)) return;
    this.#notify(id, undefined);
  }

  #notify(id: string, entry: RouteEntry | undefined): void {
    const set = this.#watchers.get(id);
    if (set === undefined) return;
    for (const fn of [...set]) fn(entry);
  }

  #intern(text: string): string {
    const known = this.#interned.get(text);
    if (known !== undefined) return known;
    // Bounded: names come from configuration (clusters, teams), not from requests.
    if (this.#interned.size < 10_000) this.#interned.set(text, text);
    return text;
  }
}
