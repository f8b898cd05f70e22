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
// The federation: after every snapshot, and again whenever the worker's copies of the hub's
// Cluster objects change or its hub link goes up or down, the feed sends a `clusters` message
// (the whole registry; it replaces the last one). Clusters are listed and watched on their own,
// and a broken Cluster watch only relists them: a clusters message carries no version, so no
// router has to resync its route entries for it. The hub link is polled once per second (a
// SyncAgent status read is a few property reads), and a message goes out only when its text
// changed, so an idle worker sends nothing.
//
// Backpressure: a router that stops reading is dropped once its socket holds more than
// `maxBufferedBytes` (default 16 MiB, ~60,000 deltas of ~250 bytes) beyond the snapshot still in
// flight, instead of buffering without bound; it reconnects and resyncs. Liveness: a WebSocket
// ping every 10 s; a router that has not answered the previous one is dropped.
import type { IncomingMessage } from 'node:http';
import { STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';
import { Counter, Gauge, type Registry } from 'prom-client';
import { WebSocketServer, type WebSocket } from 'ws';
import { IdHolders } from '../api/sandbox-identity.ts';
import type { Sandbox } from '../api/types.ts';
import { SandboxType } from '../api/types.ts';
import { AsbError } from '../errors.ts';
import { ClusterType, type Cluster, type ClusterSpec } from '../api/hub-contract.ts';
import type { ClusterRoute, ClustersMessage, FeedMessage, RouteEntry } from '../router/contract.ts';
import type { ObjectStore, Watch, WatchEvent } from '../store/store.ts';
import type { Clock, Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import type { AccessTokens } from './access-token.ts';
import type { Authenticator } from '../auth/keyring.ts';
import { requireAdmin } from './access.ts';
import { AUTH_HINT, presentedKey } from '../http/presented-key.ts';
import { problemOf } from '../http/problem.ts';
import { routeEntryOf, sameEntry } from './route-entry.ts';
import type { Route } from '../http/router.ts';

export const ROUTE_FEED_PATH = '/v1/routes/feed';
const DEFAULT_MAX_BUFFERED_BYTES = 16 * 1024 * 1024;
const DEFAULT_PING_INTERVAL_MS = 10_000;
// Routers send nothing but pongs; a larger frame is a misbehaving client.
const MAX_INBOUND_FRAME_BYTES = 4096;
/** 1001 going away (worker shutting down), 1012 service restart (resync: reconnect for a snapshot), 1008 policy (dropped). */
const CLOSE = { shutdown: 1001, resync: 1012, policy: 1008 } as const;
const RELIST_BASE_MS = 100;
const RELIST_MAX_MS = 5000;
const DEFAULT_HUB_POLL_MS = 1000;

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
  /** name → the cluster as routers need it, from the Cluster objects in the store. */
  #clusters = new Map<string, ClusterRoute>();
  #clustersWatch: Watch | undefined;
  #clustersRetry: Timer | undefined;
  #clustersFailures = 0;
  #hubConnected = false;
  #hubPoll: Timer | undefined;
  /** The clusters message as last sent (sent again only when this text changes). */
  #clustersText = '';
  #flushScheduled = false;

  private constructor(opts: RouteFeedOptions) {
    this.#opts = opts;
    this.#log = opts.log.child({ component: 'route-feed' });
    this.#maxBuffered = opts.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES;
    this.#pingMs = opts.pingIntervalMs ?? DEFAULT_PING_INTERVAL_MS;
    this.#metrics = feedMetrics(opts.registry);
  }

  /** Lists and starts watching; resolves once the first snapshot is ready. */
  static async open(opts: RouteFeedOptions): Promise<RouteFeed> {
    const feed = new RouteFeed(opts);
    await feed.#sync(true);
    try {
      await feed.#syncClusters();
    } catch (err) {
      feed.close();
      throw err;
    }
    feed.#hubConnected = opts.hubConnected?.() ?? false;
    feed.#clustersText = JSON.stringify(feed.clustersMessage());
    feed.#pollHub();
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

  /** The federation as routers get it now. */
  clustersMessage(): ClustersMessage {
    const clusters = [...this.#clusters.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    return { type: 'clusters', self: this.#opts.cluster, hubConnected: this.#hubConnected, clusters };
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
    this.#send(sub, this.#clustersText, 'clusters');
    this.#schedulePing(sub);
    this.#log.info({ entries: this.#entries.size, version: this.#version }, 'router connected to the route feed');
  }

  /** Idempotent: stops the watch and closes every router connection (1001 going away). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#watch?.close();
    this.#retry?.cancel();
    this.#clustersWatch?.close();
    this.#clustersRetry?.cancel();
    this.#hubPoll?.cancel();
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

  async #syncClusters(): Promise<void> {
    const items: Cluster[] = [];
    let resourceVersion = '';
    let token: string | undefined;
    do {
      const page = await this.#opts.store.list<Cluster>(ClusterType, token === undefined ? {} : { continue: token });
      items.push(...page.items);
      resourceVersion = page.resourceVersion;
      token = page.continue;
    } while (token !== undefined);
    if (this.#closed) return;
    this.#clusters = new Map(items.map((c) => [c.metadata.name, clusterRouteOf(c)]));
    this.#publishClusters();
    this.#clustersWatch = this.#opts.store.watch<Cluster>(ClusterType, { resourceVersion }, {
      onEvent: (event) => {
        this.#clustersFailures = 0;
        if (event.type === 'BOOKMARK') return;
        if (event.type === 'DELETED') this.#clusters.delete(event.object.metadata.name);
        else this.#clusters.set(event.object.metadata.name, clusterRouteOf(event.object));
        this.#publishClusters();
      },
      onError: (err) => {
        this.#clustersWatch = undefined;
        this.#log.warn({ err }, 'cluster watch ended; relisting');
        this.#scheduleClustersRelist();
      },
    });
  }

  #scheduleClustersRelist(): void {
    if (this.#closed) return;
    const delay = Math.min(RELIST_MAX_MS, RELIST_BASE_MS * 2 ** Math.min(this.#clustersFailures, 16));
    this.#clustersFailures += 1;
    this.#clustersRetry = this.#opts.clock.after(delay, () => {
      this.#syncClusters().catch((err: unknown) => {
        this.#log.warn({ err }, 'cluster relist failed');
        this.#scheduleClustersRelist();
      });
    });
  }

  #pollHub(): void {
    const read = this.#opts.hubConnected;
    if (read === undefined || this.#closed) return;
    this.#hubPoll = this.#opts.clock.after(this.#opts.hubPollMs ?? DEFAULT_HUB_POLL_MS, () => {
      const connected = read();
      if (connected !== this.#hubConnected) {
        this.#hubConnected = connected;
        this.#log.info({ hubConnected: connected }, 'hub link changed; telling the routers');
        this.#publishClusters();
      }
      this.#pollHub();
    });
  }

  /** Sends the clusters message to every router if it differs from the last one sent. */
  #publishClusters(): void {
    const text = JSON.stringify(this.clustersMessage());
    if (text === this.#clustersText) return;
    this.#clustersText = text;
    for (const sub of this.#subscribers) this.#send(sub, text, 'clusters');
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

/** A Cluster object as routers need it; fields a synced copy lacks get their neutral value. */
function clusterRouteOf(c: Cluster): ClusterRoute {
  const spec = (c.spec as Partial<ClusterSpec> | undefined) ?? {};
  return { name: c.metadata.name, tag: spec.tag ?? '', region: spec.region ?? '', ingressAddress: spec.ingressAddress ?? '', drain: spec.drain ?? false };
}

export interface FeedUpgradeOptions {
  feed: RouteFeed;
  auth: Authenticator;
  log: Logger;
}

/**
 * The HTTP server's 'upgrade' listener: accepts WebSockets on /v1/routes/feed from admin keys and
 * answers anything else with a problem+json response before upgrading (401 no or bad key, 403 not
 * admin, 404 other paths). A feed whose key is revoked (or loses admin) is closed with 1008, and
 * its router's reconnect is refused. Returns a close function that stops accepting upgrades.
 */
export function createFeedUpgrade(opts: FeedUpgradeOptions): { handle: (req: IncomingMessage, socket: Duplex, head: Buffer) => void; close: () => void } {
  const wss = new WebSocketServer({ noServer: true, maxPayload: MAX_INBOUND_FRAME_BYTES });
  let closed = false;
  /** Open feeds → the prefix of the key that opened each. */
  const opened = new Map<WebSocket, string>();
  const unwatchKeys = opts.auth.onRevoked((prefix) => {
    for (const [ws, by] of opened) if (by === prefix) ws.close(CLOSE.policy, 'the API key that opened this feed was revoked');
  });
  const handle = (req: IncomingMessage, socket: Duplex, head: Buffer): void => {
    socket.on('error', (err) => opts.log.debug({ err }, 'upgrade socket error'));
    let prefix: string;
    try {
      if (closed) throw new AsbError('Unavailable', 'the worker is shutting down; reconnect to another worker or retry shortly');
      const path = new URL(req.url ?? '/', 'http://worker.invalid').pathname;
      if (path !== ROUTE_FEED_PATH) throw new AsbError('NotFound', `no WebSocket endpoint at ${path}; the route feed is at ${ROUTE_FEED_PATH}`);
      if (req.method !== 'GET') throw new AsbError('MethodNotAllowed', `${req.method ?? ''} is not allowed on ${path}; use GET with Upgrade: websocket`);
      const key = presentedKey(req);
      if (key === undefined) throw new AsbError('Unauthorized', `no API key: ${AUTH_HINT}`);
      const principal = opts.auth.verify(key);
      if (principal === undefined) throw new AsbError('Unauthorized', `the API key is unknown or revoked; ${AUTH_HINT}`);
      if (!principal.admin) throw new AsbError('Forbidden', `the route feed needs an admin API key; key ${principal.prefix} of team "${principal.team}" is not one`);
      prefix = principal.prefix;
    } catch (err) {
      refuse(socket, err instanceof AsbError ? err : new AsbError('Internal', 'internal error; the worker log has the details', { cause: err }));
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      opened.set(ws, prefix);
      ws.once('close', () => opened.delete(ws));
      opts.feed.attach(ws);
      // Revoked while the handshake ran: the listener above did not see this socket yet.
      if (!opts.auth.live(prefix)) ws.close(CLOSE.policy, 'the API key that opened this feed was revoked');
    });
  };
  return {
    handle,
    close: () => {
      if (closed) return;
      closed = true;
      unwatchKeys();
      wss.close();
    },
  };
}

function refuse(socket: Duplex, err: AsbError): void {
  const body = JSON.stringify(problemOf(err));
  const extra = err.code === 'Unauthorized' ? 'WWW-Authenticate: Bearer realm="asb"\r\n' : '';
  socket.end(
    `HTTP/1.1 ${err.status} ${STATUS_CODES[err.status] ?? ''}\r\nContent-Type: application/problem+json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}Connection: close\r\n\r\n${body}`,
  );
}

/** A plain GET (no Upgrade header) of the feed: an admin gets 400 naming what to do, others 401/403 as usual. */
export function feedRoutes(): Route[] {
  return [
    {
      method: 'GET',
      pattern: ROUTE_FEED_PATH,
      handler: (ctx) => {
        requireAdmin(ctx, 'the route feed');
        return Promise.reject(new AsbError('BadRequest', `${ROUTE_FEED_PATH} is a WebSocket endpoint: connect with "Upgrade: websocket" (messages are described in src/router/contract.ts)`));
      },
    },
  ];
}
