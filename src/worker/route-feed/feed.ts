// The route feed: every router keeps a WebSocket to `GET /v1/routes/feed` on each worker and gets
// one `snapshot` of this cluster's route entries, then `upsert`/`delete` deltas (src/router/
// contract.ts). The feed keeps its own list+watch of Sandboxes rather than the operator's
// informer, because each message carries the store resourceVersion of the change that caused it
// and an informer hides those (a relist merges many changes into one).
//
// Ordering: the watch delivers changes in resourceVersion order and every send happens in that
// callback, after the snapshot of the same map, so on one connection versions strictly increase
// and nothing is missed. When the watch itself breaks (Gone, store restart) the feed relists and
// drops every router connection: a reconnect gets a fresh snapshot, which is simpler and safer
// than inventing versions for the changes merged by the relist.
//
// The federation: after every snapshot, and whenever it changes, the feed sends a `clusters`
// message (clusters.ts). The HTTP endpoint that admits routers is endpoint.ts.
//
// Backpressure: a router that stops reading is dropped once its socket holds more than
// `maxBufferedBytes` (default 16 MiB, ~60,000 deltas of ~250 bytes) beyond the snapshot still in
// flight, instead of buffering without bound; it reconnects and resyncs. Liveness: a WebSocket
// ping every 10 s; a router that has not answered the previous one is dropped.
import { Counter, Gauge, type Registry } from 'prom-client';
import type { WebSocket } from 'ws';
import { IdHolders } from '../../api/sandbox-identity.ts';
import type { Sandbox } from '../../api/types.ts';
import { SandboxType } from '../../api/types.ts';
import type { FeedMessage, RouteEntry } from '../../router/contract.ts';
import type { ObjectStore, Watch, WatchEvent } from '../../store/store.ts';
import type { Clock, Timer } from '../../base/clock.ts';
import type { Logger } from '../../base/log.ts';
import type { AccessTokens } from '../access-token.ts';
import { routeEntryOf, sameEntry } from '../route-entry.ts';
import { ClustersFeed } from './clusters.ts';

const DEFAULT_MAX_BUFFERED_BYTES = 16 * 1024 * 1024;
const DEFAULT_PING_INTERVAL_MS = 10_000;
/** 1001 going away (worker shutting down), 1012 service restart (resync: reconnect for a snapshot), 1008 policy (dropped). */
export const CLOSE = { shutdown: 1001, resync: 1012, policy: 1008 } as const;
const RELIST_BASE_MS = 100;
const RELIST_MAX_MS = 5000;

export interface RouteFeedOptions {
  store: ObjectStore;
  /** This worker cluster's name, written into every entry. */
  cluster: string;
  tokens: AccessTokens;
  log: Logger;
  clock: Clock;
  registry?: Registry;
  /** Drop a router whose unsent bytes exceed this beyond its snapshot. Default 16 MiB. */
  maxBufferedBytes?: number;
  /** WebSocket ping interval. Default 10 s. */
  pingIntervalMs?: number;
  /** Whether the worker's sync link to the hub is up now. Absent: the worker has no hub (always false). */
  hubConnected?: () => boolean;
  /** How often hubConnected is read. Default 1 000 ms: the edge stops sending creates to a lost hub within ~1 s. */
  hubPollMs?: number;
}

interface Subscriber {
  ws: WebSocket;
  /** Bytes the socket may hold before it is dropped: the snapshot plus maxBufferedBytes, until the snapshot drains. */
  allowance: number;
  alive: boolean;
  ping: Timer | undefined;
  /** Messages for this router not yet handed to its socket (see #send). */
  outbox: { text: string; type: FeedMessage['type'] }[];
}

interface FeedMetrics {
  connections: Gauge;
  entries: Gauge;
  messages: Counter;
  drops: Counter;
}

function feedMetrics(registry: Registry | undefined): FeedMetrics | undefined {
  if (registry === undefined) return undefined;
  // Several worker servers may share one registry (tests): reuse a metric already registered.
  const gauge = (name: string, help: string): Gauge => {
    const found = registry.getSingleMetric(name);
    return found instanceof Gauge ? found : new Gauge({ name, help, registers: [registry] });
  };
  const counter = (name: string, help: string, label: string): Counter => {
    const found = registry.getSingleMetric(name);
    return found instanceof Counter ? found : new Counter({ name, help, labelNames: [label], registers: [registry] });
  };
  return {
    connections: gauge('asb_route_feed_connections', "Routers connected to this worker's route feed"),
    entries: gauge('asb_route_feed_entries', 'Route entries this worker publishes'),
    messages: counter('asb_route_feed_messages_total', 'Route feed messages sent, by type (one per router)', 'type'),
    drops: counter('asb_route_feed_drops_total', 'Router connections the feed dropped, by reason (backpressure, ping, resync)', 'reason'),
  };
}

export class RouteFeed {
  readonly #opts: RouteFeedOptions;
  readonly #log: Logger;
  readonly #maxBuffered: number;
  readonly #pingMs: number;
  readonly #metrics: FeedMetrics | undefined;
  /** id → entry, and the namespace it came from: the id's holder's (sandbox-identity.ts). */
  #entries = new Map<string, { entry: RouteEntry; namespace: string }>();
  /** Which object holds each id: another object of the same name never gets the route or its token hash. */
  readonly #holders = new IdHolders();
  #version = 0;
  #subscribers = new Set<Subscriber>();
  #watch: Watch | undefined;
  #retry: Timer | undefined;
  #failures = 0;
  #closed = false;
  readonly #clusters: ClustersFeed;
  #flushScheduled = false;

  private constructor(opts: RouteFeedOptions) {
    this.#opts = opts;
    this.#log = opts.log.child({ component: 'route-feed' });
    this.#maxBuffered = opts.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES;
    this.#pingMs = opts.pingIntervalMs ?? DEFAULT_PING_INTERVAL_MS;
    this.#metrics = feedMetrics(opts.registry);
    this.#clusters = new ClustersFeed({
      store: opts.store,
      cluster: opts.cluster,
      log: this.#log,
      clock: opts.clock,
      hubConnected: opts.hubConnected,
      hubPollMs: opts.hubPollMs,
      onChange: (text) => {
        for (const sub of this.#subscribers) this.#send(sub, text, 'clusters');
      },
    });
  }

  /** Lists and starts watching; resolves once the first snapshot is ready. */
  static async open(opts: RouteFeedOptions): Promise<RouteFeed> {
    const feed = new RouteFeed(opts);
    await feed.#sync(true);
    try {
      await feed.#clusters.start();
    } catch (err) {
      feed.close();
      throw err;
    }
    return feed;
  }

  /** The version the next snapshot will carry. */
  get version(): number {
    return this.#version;
  }

  get connections(): number {
    return this.#subscribers.size;
  }

  entries(): RouteEntry[] {
    return [...this.#entries.values()].map((e) => e.entry);
  }

  /** Serves an accepted WebSocket: snapshot now, deltas as they happen, pings until it closes. */
  attach(ws: WebSocket): void {
    if (this.#closed) {
      ws.close(CLOSE.shutdown, 'worker shutting down');
      return;
    }
    const sub: Subscriber = { ws, allowance: this.#maxBuffered, alive: true, ping: undefined, outbox: [] };
    this.#subscribers.add(sub);
    this.#metrics?.connections.set(this.#subscribers.size);
    ws.on('pong', () => (sub.alive = true));
    ws.on('message', () => (sub.alive = true));
    ws.on('error', (err) => this.#log.debug({ err }, 'route feed socket error'));
    ws.on('close', () => {
      sub.ping?.cancel();
      this.#subscribers.delete(sub);
      this.#metrics?.connections.set(this.#subscribers.size);
    });
    const snapshot = JSON.stringify({ type: 'snapshot', version: this.#version, cluster: this.#opts.cluster, entries: this.entries() } satisfies FeedMessage);
    sub.allowance = Buffer.byteLength(snapshot) + this.#maxBuffered;
    this.#send(sub, snapshot, 'snapshot');
    this.#send(sub, this.#clusters.text, 'clusters');
    this.#schedulePing(sub);
    this.#log.info({ entries: this.#entries.size, version: this.#version }, 'router connected to the route feed');
  }

  /** Idempotent: stops the watch and closes every router connection (1001 going away). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#watch?.close();
    this.#retry?.cancel();
    this.#clusters.close();
    for (const sub of this.#subscribers) this.#drop(sub, CLOSE.shutdown, 'worker shutting down', undefined);
  }

  async #sync(first: boolean): Promise<void> {
    const { store, cluster, tokens } = this.#opts;
    const items: Sandbox[] = [];
    let resourceVersion = '';
    let token: string | undefined;
    do {
      const page = await store.list<Sandbox>(SandboxType, token === undefined ? {} : { continue: token });
      items.push(...page.items);
      resourceVersion = page.resourceVersion;
      token = page.continue;
    } while (token !== undefined);
    if (this.#closed) return;
    const next = new Map<string, { entry: RouteEntry; namespace: string }>();
    this.#holders.clear();
    for (const s of items) this.#holders.remember(s);
    for (const s of items) {
      if (!this.#holders.holds(s)) continue;
      const entry = routeEntryOf(s, cluster, tokens);
      if (entry !== undefined) next.set(entry.id, { entry, namespace: s.metadata.namespace ?? '' });
    }
    this.#entries = next;
    this.#version = Math.max(this.#version, Number(resourceVersion));
    this.#metrics?.entries.set(next.size);
    if (!first) {
      // Changes inside the gap have no versions of their own: every router resyncs instead.
      for (const sub of this.#subscribers) this.#drop(sub, CLOSE.resync, 'route feed resync: reconnect for a snapshot', 'resync');
    }
    this.#watch = store.watch<Sandbox>(SandboxType, { resourceVersion }, {
      onEvent: (event) => {
        this.#failures = 0;
        this.#apply(event);
      },
      onError: (err) => {
        this.#watch = undefined;
        this.#log.warn({ err }, 'sandbox watch ended; relisting');
        this.#scheduleResync();
      },
    });
  }

  #scheduleResync(): void {
    if (this.#closed) return;
    const delay = Math.min(RELIST_MAX_MS, RELIST_BASE_MS * 2 ** Math.min(this.#failures, 16));
    this.#failures += 1;
    this.#retry = this.#opts.clock.after(delay, () => {
      this.#sync(false).catch((err: unknown) => {
        this.#log.warn({ err }, 'route feed relist failed');
        this.#scheduleResync();
      });
    });
  }

  #apply(event: WatchEvent<Sandbox>): void {
    if (event.type === 'BOOKMARK') return;
    const version = Number(event.object.metadata.resourceVersion);
    // A replayed or out-of-order event can only be stale: never send a version twice.
    if (!(version > this.#version)) return;
    this.#version = version;
    const { name: id, namespace = '' } = event.object.metadata;
    if (event.type === 'DELETED') this.#holders.forget(event.object);
    else if (!this.#holders.remember(event.object)) return;
    const prev = this.#entries.get(id);
    // Another object's delete leaves the holder's entry alone.
    if (event.type === 'DELETED' && prev !== undefined && prev.namespace !== namespace) return;
    const next = event.type === 'DELETED' ? undefined : routeEntryOf(event.object, this.#opts.cluster, this.#opts.tokens);
    if (next === undefined) {
      if (prev === undefined) return;
      this.#entries.delete(id);
      this.#broadcast({ type: 'delete', version, id });
    } else {
      if (prev !== undefined && sameEntry(prev.entry, next)) return;
      this.#entries.set(id, { entry: next, namespace });
      this.#broadcast({ type: 'upsert', version, entry: next });
    }
    this.#metrics?.entries.set(this.#entries.size);
  }

  #broadcast(message: FeedMessage): void {
    if (this.#subscribers.size === 0) return;
    const text = JSON.stringify(message);
    for (const sub of this.#subscribers) this.#send(sub, text, message.type);
  }

  /**
   * Queues a message for one router; the queues go to the sockets from a setImmediate, in order.
   * Changes are delivered inside the store's commit, before the writers' promises resolve: sent
   * there, a burst of 64 claims made 64 socket writes (and woke the router 64 times) ahead of
   * every claim's response. Queued, they follow the responses within the same turn of the loop.
   */
  #send(sub: Subscriber, text: string, type: FeedMessage['type']): void {
    sub.outbox.push({ text, type });
    if (this.#flushScheduled) return;
    this.#flushScheduled = true;
    setImmediate(() => {
      this.#flushScheduled = false;
      for (const queued of this.#subscribers) this.#flush(queued);
    });
  }

  #flush(sub: Subscriber): void {
    const outbox = sub.outbox;
    sub.outbox = [];
    for (const { text, type } of outbox) {
      if (sub.ws.readyState !== sub.ws.OPEN || !this.#subscribers.has(sub)) return;
      sub.ws.send(text);
      this.#metrics?.messages.inc({ type });
      if (sub.ws.bufferedAmount > sub.allowance) {
        this.#log.warn({ buffered: sub.ws.bufferedAmount, limit: sub.allowance }, 'router is not reading the route feed; dropping it (it will resync)');
        this.#drop(sub, CLOSE.policy, 'route feed backlog too large', 'backpressure');
        return;
      }
    }
  }

  #schedulePing(sub: Subscriber): void {
    sub.ping = this.#opts.clock.after(this.#pingMs, () => {
      if (sub.ws.readyState !== sub.ws.OPEN) return;
      if (!sub.alive) {
        this.#log.warn('router did not answer the last route feed ping; dropping it');
        this.#drop(sub, CLOSE.policy, 'no pong', 'ping');
        return;
      }
      // Once the snapshot has drained the allowance falls back to the plain limit.
      if (sub.ws.bufferedAmount <= this.#maxBuffered) sub.allowance = this.#maxBuffered;
      sub.alive = false;
      sub.ws.ping();
      this.#schedulePing(sub);
    });
  }

  /** Closes a connection. Dropped ones (backlog, no pong) are terminated at once: a close handshake would queue behind the backlog. */
  #drop(sub: Subscriber, code: number, reason: string, metric: string | undefined): void {
    sub.ping?.cancel();
    this.#subscribers.delete(sub);
    this.#metrics?.connections.set(this.#subscribers.size);
    if (metric !== undefined) this.#metrics?.drops.inc({ reason: metric });
    if (code === CLOSE.policy) sub.ws.terminate();
    else {
      sub.ws.close(code, reason);
      // A peer that never answers the close frame must not keep the socket (and shutdown) waiting.
      const timer = this.#opts.clock.after(1000, () => sub.ws.terminate());
      sub.ws.once('close', () => timer.cancel());
    }
  }
}

