// The hub's side of what workers copy: one in-memory view of every synced object (ApiKeys,
// SandboxTemplates, Clusters) kept current by store watches, the recent deltas for workers that
// resume, and the connections that follow it live. One feed serves every worker connection, so N
// workers cost one watch, not N.
//
// Versions: each delta carries the store resourceVersion of the change that caused it. Changes a
// worker does not see are not deltas and do not move the feed's version: a Cluster is synced
// without its credentialHash and without its status, and the hub writes a cluster's status on
// every ack (src/hub/cluster-status.ts). Were those writes deltas, every ack would cause a delta to
// every worker, whose acks would cause more status writes, forever. So the feed keeps a
// fingerprint of what it last published per object and publishes only when that changes.
//
// Ordering: live watch events arrive synchronously in commit order across kinds (the embedded
// store delivers one batch's events in order, src/store/sqlite-commit.ts), and each is broadcast in that
// callback, so every subscriber sees strictly increasing versions with none skipped. When a watch
// ends (Gone, store trouble) the feed relists and calls its reset listeners: a relist merges many
// changes under one version, so connections must start over (a snapshot) rather than get deltas
// the feed cannot number.
import type { KubeObject, ResourceType } from '../api/meta.ts';
import { ApiKeyType, SandboxTemplateType } from '../api/types.ts';
import type { ObjectStore, Watch, WatchEvent } from '../store/store.ts';
import type { Clock, Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { ClusterType, type Cluster, type HubToWorker, type SyncItem, type SyncKind } from '../api/hub-contract.ts';

const SYNCED: readonly { kind: SyncKind; rt: ResourceType }[] = [
  { kind: 'ApiKey', rt: ApiKeyType },
  { kind: 'SandboxTemplate', rt: SandboxTemplateType },
  { kind: 'Cluster', rt: ClusterType },
];
// 10,000 deltas or 8 MiB, whichever comes first: a worker away for hours of ordinary key and
// template churn resumes with deltas; beyond that a snapshot (~1 KB per object) is as cheap.
const DEFAULT_RETAIN_DELTAS = 10_000;
const DEFAULT_RETAIN_BYTES = 8 * 1024 * 1024;
const RELIST_BASE_MS = 100;
const RELIST_MAX_MS = 5000;

export interface SyncDelta {
  version: number;
  /** The `delta` message, serialized once for every connection. */
  text: string;
}

interface Entry {
  item: SyncItem;
  fingerprint: string;
  /** Clusters only: the object as stored, with its credentialHash, for authentication. */
  raw: KubeObject;
}

export interface SyncFeedOptions {
  store: ObjectStore;
  log: Logger;
  clock: Clock;
  retainDeltas?: number;
  retainBytes?: number;
}

export class SyncFeed {
  readonly #opts: SyncFeedOptions;
  readonly #log: Logger;
  readonly #retainDeltas: number;
  readonly #retainBytes: number;
  #entries = new Map<string, Entry>();
  #version = 0;
  /** Deltas with versions in (#floor, #version], oldest first. */
  #recent: SyncDelta[] = [];
  #recentBytes = 0;
  #floor = 0;
  #subscribers = new Set<(d: SyncDelta) => void>();
  #resetListeners = new Set<() => void>();
  #watches: Watch[] = [];
  #retry: Timer | undefined;
  #failures = 0;
  #closed = false;

  private constructor(opts: SyncFeedOptions) {
    this.#opts = opts;
    this.#log = opts.log.child({ component: 'sync-feed' });
    this.#retainDeltas = opts.retainDeltas ?? DEFAULT_RETAIN_DELTAS;
    this.#retainBytes = opts.retainBytes ?? DEFAULT_RETAIN_BYTES;
  }

  static async open(opts: SyncFeedOptions): Promise<SyncFeed> {
    const feed = new SyncFeed(opts);
    await feed.#sync();
    return feed;
  }

  /** The version of the last change workers see; a snapshot taken now carries it. */
  get version(): number {
    return this.#version;
  }

  snapshot(): Extract<HubToWorker, { type: 'snapshot' }> {
    return { type: 'snapshot', version: this.#version, items: [...this.#entries.values()].map((e) => e.item) };
  }

  /** Deltas after `version`, or undefined when the feed no longer holds them all (send a snapshot). */
  since(version: number): SyncDelta[] | undefined {
    if (version < this.#floor || version > this.#version) return undefined;
    let i = this.#recent.length;
    while (i > 0 && (this.#recent[i - 1]?.version ?? 0) > version) i--;
    return this.#recent.slice(i);
  }

  /** Cluster objects as stored (with credential hashes). */
  clusters(): Cluster[] {
    const out: Cluster[] = [];
    for (const e of this.#entries.values()) if (e.item.kind === 'Cluster') out.push(e.raw as Cluster);
    return out;
  }

  /** Calls `fn` with every later delta, synchronously, in version order. Returns unsubscribe. */
  subscribe(fn: (d: SyncDelta) => void): () => void {
    this.#subscribers.add(fn);
    return () => this.#subscribers.delete(fn);
  }

  /** Calls `fn` when the feed had to relist: its subscribers' streams have a hole and must restart. */
  onReset(fn: () => void): () => void {
    this.#resetListeners.add(fn);
    return () => this.#resetListeners.delete(fn);
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const w of this.#watches) w.close();
    this.#watches = [];
    this.#retry?.cancel();
    this.#subscribers.clear();
    this.#resetListeners.clear();
  }

  async #sync(): Promise<void> {
    const { store } = this.#opts;
    // Lists of the embedded store answer from memory in the call itself, so three lists started
    // together see one state; a store that could not promise that shows different versions and
    // the lists are retried.
    let lists = await Promise.all(SYNCED.map(({ rt }) => store.list(rt)));
    for (let attempt = 0; new Set(lists.map((l) => l.resourceVersion)).size > 1 && attempt < 5; attempt++) {
      lists = await Promise.all(SYNCED.map(({ rt }) => store.list(rt)));
    }
    if (this.#closed) return;
    const version = Math.max(...lists.map((l) => Number(l.resourceVersion)));
    const next = new Map<string, Entry>();
    SYNCED.forEach(({ kind }, i) => {
      for (const obj of lists[i]?.items ?? []) next.set(keyOf(kind, obj), entryOf(kind, obj));
    });
    const resync = this.#watches.length > 0 || this.#version > 0;
    for (const w of this.#watches) w.close();
    this.#entries = next;
    this.#version = Math.max(this.#version, version);
    this.#recent = [];
    this.#recentBytes = 0;
    this.#floor = this.#version;
    this.#watches = SYNCED.map(({ kind, rt }) =>
      store.watch<KubeObject>(rt, { resourceVersion: String(version) }, {
        onEvent: (event) => {
          this.#failures = 0;
          this.#apply(kind, event);
        },
        onError: (err) => {
          this.#log.warn({ err, kind }, 'sync watch ended; relisting');
          this.#scheduleResync();
        },
      }),
    );
    if (resync) for (const fn of [...this.#resetListeners]) fn();
    this.#log.info({ objects: next.size, version: this.#version }, 'sync feed listed');
  }

  #scheduleResync(): void {
    if (this.#closed || this.#retry !== undefined) return;
    for (const w of this.#watches) w.close();
    const delay = Math.min(RELIST_MAX_MS, RELIST_BASE_MS * 2 ** Math.min(this.#failures, 16));
    this.#failures += 1;
    this.#retry = this.#opts.clock.after(delay, () => {
      this.#retry = undefined;
      this.#sync().catch((err: unknown) => {
        this.#log.warn({ err }, 'sync feed relist failed');
        this.#scheduleResync();
      });
    });
  }

  #apply(kind: SyncKind, event: WatchEvent<KubeObject>): void {
    if (event.type === 'BOOKMARK') return;
    const version = Number(event.object.metadata.resourceVersion);
    if (!(version > this.#version)) return;
    const key = keyOf(kind, event.object);
    const prev = this.#entries.get(key);
    let item: SyncItem;
    if (event.type === 'DELETED') {
      if (prev === undefined) return;
      this.#entries.delete(key);
      item = { kind, namespace: prev.item.namespace, name: prev.item.name };
    } else {
      const entry = entryOf(kind, event.object);
      this.#entries.set(key, entry);
      if (prev !== undefined && prev.fingerprint === entry.fingerprint) return;
      item = entry.item;
    }
    this.#version = version;
    const delta: SyncDelta = { version, text: JSON.stringify({ type: 'delta', version, item } satisfies HubToWorker) };
    this.#remember(delta);
    for (const fn of [...this.#subscribers]) fn(delta);
  }

  #remember(delta: SyncDelta): void {
    this.#recent.push(delta);
    this.#recentBytes += delta.text.length;
    while (this.#recent.length > this.#retainDeltas || (this.#recentBytes > this.#retainBytes && this.#recent.length > 1)) {
      const dropped = this.#recent.shift();
      if (dropped === undefined) break;
      this.#recentBytes -= dropped.text.length;
      this.#floor = dropped.version;
    }
  }
}

function keyOf(kind: SyncKind, obj: KubeObject): string {
  return `${kind}/${obj.metadata.namespace ?? ''}/${obj.metadata.name}`;
}

/** What a worker gets: the object minus what it must not see (a cluster's credential hash and status). */
export function syncFormOf(kind: SyncKind, obj: KubeObject): KubeObject {
  if (kind !== 'Cluster') return obj;
  const cluster = obj as Cluster;
  const { credentialHash: _hidden, ...spec } = cluster.spec;
  return { apiVersion: cluster.apiVersion, kind: cluster.kind, metadata: cluster.metadata, spec };
}

function entryOf(kind: SyncKind, obj: KubeObject): Entry {
  const object = syncFormOf(kind, obj);
  const { resourceVersion: _rv, ...meta } = object.metadata;
  // Status is left out of the fingerprint: only the hub writes it, and workers act on spec.
  const fingerprint = JSON.stringify([meta, object.spec]);
  return { item: { kind, namespace: obj.metadata.namespace ?? '', name: obj.metadata.name, object }, fingerprint, raw: obj };
}
