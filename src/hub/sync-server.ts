// The hub end of sync (protocol in src/api/hub-contract.ts): `GET /v1/sync` WebSocket upgrades from
// worker clusters. A worker authenticates with its cluster credential before the upgrade, says
// which hub version it last applied, and gets a snapshot or the deltas since, then live deltas
// and heartbeats; its acks and heartbeats land in its Cluster status (src/hub/cluster-status.ts),
// and its heartbeats in the in-memory live view placement reads (src/hub/live-clusters.ts).
//
// One connection per cluster: a second one from the same cluster (a worker that noticed a dead
// link before the hub did) replaces the first.
//
// Backpressure: a worker whose socket holds more than `maxBufferedBytes` (default 16 MiB) beyond
// the snapshot in flight is not reading; it is dropped and resyncs when it reconnects, instead of
// the hub buffering without bound. Liveness: heartbeats every HEARTBEAT_MS both ways; a worker
// silent for 3 intervals is dropped.
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { Counter, Gauge, type Registry } from 'prom-client';
import { WebSocketServer, type RawData, type WebSocket } from 'ws';
import { AsbError } from '../errors.ts';
import type { ObjectStore } from '../store/store.ts';
import type { Clock, Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { refuseUpgrade } from '../http/problem.ts';
import { credentialMatches } from './cluster-credential.ts';
import { ClusterStatusWriter } from './cluster-status.ts';
import { HEARTBEAT_MS, type HubToWorker, type PoolReport, type WorkerToHub } from '../api/hub-contract.ts';
import { LiveClusters, NO_LIVE_CLUSTERS, type LiveCluster } from './live-clusters.ts';
import { acceptBuiltTemplates } from './built-templates.ts';
import type { KubeObject } from '../api/meta.ts';
import { SyncFeed, type SyncDelta } from './sync-feed.ts';

export const SYNC_PATH = '/v1/sync';
const DEFAULT_MAX_BUFFERED_BYTES = 16 * 1024 * 1024;
// Workers send hello, acks and heartbeats with pool and template count maps (64 KiB holds ~1,000
// of each), and their built templates (~1.5 KB each: MAX_BUILT_TEMPLATES of them in 1 MiB).
const MAX_INBOUND_FRAME_BYTES = 1024 * 1024;
const SILENT_INTERVALS = 3;
/** 1001 hub going away, 1008 policy (dropped: silent, backlog, bad frame, replaced), 1012 resync. */
const CLOSE = { shutdown: 1001, policy: 1008, resync: 1012 } as const;

export interface SyncMetrics {
  connections: Gauge;
  messages: Counter<'type'>;
  drops: Counter<'reason'>;
  /** asb_hub_cluster_connected{cluster}: read at each scrape from clusterLinks. */
  clusterConnected: Gauge<'cluster'>;
  /** Set by the running sync server: every cluster the hub knows and whether it is connected now. */
  clusterLinks?: () => Iterable<readonly [string, boolean]>;
}

export function createSyncMetrics(registry: Registry): SyncMetrics {
  const metrics: SyncMetrics = {
    connections: new Gauge({ name: 'asb_hub_sync_connections', help: 'Worker clusters connected to the hub for sync.', registers: [registry] }),
    messages: new Counter({ name: 'asb_hub_sync_messages_total', help: 'Sync messages sent to workers, by type.', labelNames: ['type'], registers: [registry] }),
    drops: new Counter({
      name: 'asb_hub_sync_drops_total',
      help: 'Sync connections the hub dropped, by reason (silent, backpressure, protocol, replaced, resync).',
      labelNames: ['reason'],
      registers: [registry],
    }),
    clusterConnected: new Gauge({
      name: 'asb_hub_cluster_connected',
      help: 'Each worker cluster the hub knows: 1 while its sync link is up (hello done), 0 while it is not (down, unreachable, or never connected).',
      labelNames: ['cluster'],
      registers: [registry],
      collect() {
        this.reset();
        for (const [cluster, up] of metrics.clusterLinks?.() ?? []) this.set({ cluster }, up ? 1 : 0);
      },
    }),
  };
  return metrics;
}

export interface SyncServerOptions {
  store: ObjectStore;
  log: Logger;
  clock: Clock;
  metrics?: SyncMetrics;
  heartbeatMs?: number;
  maxBufferedBytes?: number;
  /** Batch interval of Cluster status writes. Default 500 ms. */
  statusFlushMs?: number;
}

export interface SyncConnection {
  cluster: string;
  /** Last version the worker acknowledged on this connection (0: none yet). */
  appliedVersion: number;
}

export interface SyncServer {
  /** The node:http 'upgrade' listener for SYNC_PATH (other paths get 404). */
  upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void;
  /** The version of the last change workers see. */
  version(): number;
  connections(): SyncConnection[];
  /**
   * Connected clusters that have sent a heartbeat, with what it said; a cluster leaves the moment
   * its socket closes. The same map object on every call, current as of the last message.
   */
  live(): ReadonlyMap<string, LiveCluster>;
  /**
   * Calls `listener` on every ack a worker sends, with the version it acknowledged (never more
   * than the hub has sent). Returns the unsubscribe function. A listener that throws is logged
   * and does not disturb sync.
   */
  onAck(listener: AckListener): () => void;
  /** Closes every sync connection (1001) and writes pending statuses. Idempotent. */
  close(): Promise<void>;
}

export type AckListener = (cluster: string, version: number) => void;

interface Session {
  ws: WebSocket;
  cluster: string;
  live: boolean;
  appliedVersion: number;
  lastHeard: number;
  allowance: number;
  timer: Timer | undefined;
  unsubscribe: (() => void) | undefined;
  /** The cluster's built templates being taken in: each set after the one before. */
  built: Promise<void>;
}

/**
 * Returns at once; the feed lists the hub's store in the background (from memory: microseconds
 * for the embedded store), and upgrades that arrive before that wait for it.
 */
export function createSyncServer(opts: SyncServerOptions): SyncServer {
  const log = opts.log.child({ component: 'sync-server' });
  const opening = SyncFeed.open({ store: opts.store, log, clock: opts.clock });
  const ackListeners = new Set<AckListener>();
  let ready: Served | undefined;
  let failed: unknown;
  let closing: Promise<void> | undefined;
  const whenOpen = opening.then(
    (feed) => {
      if (closing !== undefined) feed.close();
      else ready = serve(opts, log, feed, ackListeners);
    },
    (err: unknown) => {
      failed = err;
      log.error({ err }, 'sync feed could not list the hub store; sync upgrades answer 503');
    },
  );
  return {
    upgrade(req, socket, head) {
      if (ready !== undefined || closing !== undefined || failed !== undefined) {
        handleUpgrade(ready, log, req, socket, head);
        return;
      }
      void whenOpen.then(() => handleUpgrade(ready, log, req, socket, head));
    },
    version: () => ready?.feed.version ?? 0,
    connections: () => ready?.connections() ?? [],
    live: () => ready?.live() ?? NO_LIVE_CLUSTERS,
    onAck(listener) {
      ackListeners.add(listener);
      return () => ackListeners.delete(listener);
    },
    close() {
      closing ??= (async () => {
        await whenOpen;
        await ready?.close();
      })();
      return closing;
    },
  };
}

function handleUpgrade(served: Served | undefined, log: Logger, req: IncomingMessage, socket: Duplex, head: Buffer): void {
  socket.on('error', (err) => log.debug({ err }, 'sync upgrade socket error'));
  if (served === undefined) {
    refuseUpgrade(socket, new AsbError('Unavailable', 'hub sync is not available (starting, stopping or failed; see the hub log); retry shortly'), 'asb-hub');
    return;
  }
  served.upgrade(req, socket, head);
}

interface Served {
  feed: SyncFeed;
  upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void;
  connections(): SyncConnection[];
  live(): ReadonlyMap<string, LiveCluster>;
  close(): Promise<void>;
}

function serve(opts: SyncServerOptions, log: Logger, feed: SyncFeed, ackListeners: ReadonlySet<AckListener>): Served {
  const { clock, metrics } = opts;
  const heartbeatMs = opts.heartbeatMs ?? HEARTBEAT_MS;
  const maxBuffered = opts.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES;
  const status = new ClusterStatusWriter({ store: opts.store, log, clock, hubVersion: () => feed.version, ...(opts.statusFlushMs === undefined ? {} : { flushMs: opts.statusFlushMs }) });
  const wss = new WebSocketServer({ noServer: true, maxPayload: MAX_INBOUND_FRAME_BYTES });
  const sessions = new Map<string, Session>();
  const live = new LiveClusters();
  let closing: Promise<void> | undefined;

  // A hub that crashed left `connected: true` behind; nobody is connected to a hub just started.
  for (const c of feed.clusters()) if (c.status?.connected === true) status.report(c.metadata.name, { connected: false });

  const countSessions = (): void => metrics?.connections.set(sessions.size);
  if (metrics !== undefined) metrics.clusterLinks = () => feed.clusters().map((c) => [c.metadata.name, sessions.get(c.metadata.name)?.live === true] as const);

  const send = (s: Session, text: string, type: HubToWorker['type']): void => {
    if (s.ws.readyState !== s.ws.OPEN) return;
    s.ws.send(text);
    metrics?.messages.inc({ type });
    if (s.ws.bufferedAmount > s.allowance) {
      log.warn({ cluster: s.cluster, buffered: s.ws.bufferedAmount, limit: s.allowance }, 'worker is not reading sync; dropping it (it resyncs on reconnect)');
      drop(s, CLOSE.policy, 'sync backlog too large', 'backpressure');
    }
  };

  const drop = (s: Session, code: number, reason: string, metric: string | undefined): void => {
    end(s);
    if (metric !== undefined) metrics?.drops.inc({ reason: metric });
    // A dropped peer is terminated at once: a close handshake would queue behind its backlog.
    if (code === CLOSE.policy) s.ws.terminate();
    else {
      s.ws.close(code, reason);
      const timer = clock.after(1000, () => s.ws.terminate());
      s.ws.once('close', () => timer.cancel());
    }
  };

  /** Forgets a session; its cluster is recorded as disconnected unless a newer session took over. */
  const end = (s: Session): void => {
    s.timer?.cancel();
    s.timer = undefined;
    s.unsubscribe?.();
    s.unsubscribe = undefined;
    if (sessions.get(s.cluster) === s) {
      sessions.delete(s.cluster);
      live.forget(s.cluster);
      countSessions();
      if (s.live) status.report(s.cluster, { connected: false });
    }
  };

  const beat = (s: Session): void => {
    s.timer = clock.after(heartbeatMs, () => {
      if (s.ws.readyState !== s.ws.OPEN) return;
      if (clock.now() - s.lastHeard > SILENT_INTERVALS * heartbeatMs) {
        log.warn({ cluster: s.cluster }, `worker silent for ${SILENT_INTERVALS} heartbeat intervals; dropping it`);
        drop(s, CLOSE.policy, 'silent', 'silent');
        return;
      }
      // Once the snapshot has drained the allowance falls back to the plain limit.
      if (s.ws.bufferedAmount <= maxBuffered) s.allowance = maxBuffered;
      if (s.live) send(s, JSON.stringify({ type: 'heartbeat', version: feed.version } satisfies HubToWorker), 'heartbeat');
      beat(s);
    });
  };

  const hello = (s: Session, lastVersion: number): void => {
    const deltas = lastVersion > 0 ? feed.since(lastVersion) : undefined;
    if (deltas === undefined) {
      const text = JSON.stringify(feed.snapshot());
      s.allowance = Buffer.byteLength(text) + maxBuffered;
      send(s, text, 'snapshot');
      log.info({ cluster: s.cluster, lastVersion, version: feed.version }, 'worker synced from a snapshot');
    } else {
      for (const d of deltas) send(s, d.text, 'delta');
      log.info({ cluster: s.cluster, lastVersion, deltas: deltas.length, version: feed.version }, 'worker resumed with deltas');
    }
    // Deltas are broadcast synchronously from the store's watch, so nothing can fall between
    // what was just sent and the subscription.
    s.unsubscribe = feed.subscribe((d: SyncDelta) => send(s, d.text, 'delta'));
    s.live = true;
    // Tells a worker that was already current which version that is, without waiting a beat.
    send(s, JSON.stringify({ type: 'heartbeat', version: feed.version } satisfies HubToWorker), 'heartbeat');
    status.report(s.cluster, { connected: true });
  };

  const onMessage = (s: Session, data: RawData): void => {
    s.lastHeard = clock.now();
    let msg: WorkerToHub;
    try {
      msg = parseMessage(data);
    } catch (err) {
      log.warn({ cluster: s.cluster, err }, 'bad sync frame; dropping the worker');
      drop(s, CLOSE.policy, 'bad frame', 'protocol');
      return;
    }
    if (msg.type === 'hello') {
      if (s.live || msg.cluster !== s.cluster) {
        log.warn({ cluster: s.cluster, claimed: msg.cluster }, 'unexpected hello; dropping the worker');
        drop(s, CLOSE.policy, s.live ? 'second hello' : `credential is for cluster ${s.cluster}`, 'protocol');
        return;
      }
      hello(s, msg.lastVersion);
    } else if (msg.type === 'built') {
      // The session's cluster is its credential's (checked at the upgrade); a replaced one is ignored.
      if (sessions.get(s.cluster) !== s) return;
      // One cluster's sets in the order sent: each replaces the one before.
      s.built = s.built.then(() => acceptBuiltTemplates(opts.store, s.cluster, msg.items, log)).then(
        (changed) => {
          if (changed > 0) log.info({ cluster: s.cluster, changed }, 'built templates of the cluster taken in');
        },
        (err: unknown) => log.warn({ err, cluster: s.cluster }, 'could not take in the cluster\'s built templates'),
      );
    } else if (msg.type === 'ack') {
      // An ack past what the hub sent can only be a confused worker; record no more than the truth.
      s.appliedVersion = Math.min(msg.version, feed.version);
      status.report(s.cluster, { appliedVersion: s.appliedVersion });
      for (const listener of ackListeners) {
        try {
          listener(s.cluster, s.appliedVersion);
        } catch (err) {
          log.warn({ err, cluster: s.cluster }, 'an ack listener threw; ignored');
        }
      }
    } else {
      status.report(s.cluster, { warm: msg.warm, healthy: msg.healthy });
      // Before hello a session is not yet the cluster's (a replaced one may still be talking).
      if (s.live && sessions.get(s.cluster) === s) {
        live.report(s.cluster, msg.healthy, msg.templates ?? {}, s.lastHeard, msg.pools ?? {});
        // Answered once the built templates sent before it are in the hub's store too.
        const seq = msg.seq;
        if (seq !== undefined) void s.built.then(() => send(s, JSON.stringify({ type: 'heartbeat', version: feed.version, seq } satisfies HubToWorker), 'heartbeat'));
      }
    }
  };

  const attach = (ws: WebSocket, cluster: string): void => {
    const s: Session = { ws, cluster, live: false, appliedVersion: 0, lastHeard: clock.now(), allowance: maxBuffered, timer: undefined, unsubscribe: undefined, built: Promise.resolve() };
    const previous = sessions.get(cluster);
    if (previous !== undefined) {
      log.info({ cluster }, 'cluster reconnected; replacing its previous sync connection');
      drop(previous, CLOSE.policy, 'replaced by a newer connection', 'replaced');
    }
    sessions.set(cluster, s);
    countSessions();
    ws.on('message', (data) => onMessage(s, data));
    ws.on('error', (err) => log.debug({ err, cluster }, 'sync socket error'));
    ws.on('close', () => end(s));
    beat(s);
  };

  const offReset = feed.onReset(() => {
    for (const s of [...sessions.values()]) drop(s, CLOSE.resync, 'hub resync: reconnect for a snapshot', 'resync');
  });

  const authenticate = (req: IncomingMessage): string => {
    if (closing !== undefined) throw new AsbError('Unavailable', 'the hub is shutting down; retry shortly');
    const path = new URL(req.url ?? '/', 'http://hub.invalid').pathname;
    if (path !== SYNC_PATH) throw new AsbError('NotFound', `no WebSocket endpoint at ${path}; sync is at ${SYNC_PATH}`);
    if (req.method !== 'GET') throw new AsbError('MethodNotAllowed', `${req.method ?? ''} is not allowed on ${path}; use GET with Upgrade: websocket`);
    const m = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '');
    const credential = m?.[1];
    if (credential === undefined) throw new AsbError('Unauthorized', 'no cluster credential: pass it as "Authorization: Bearer asbc_<32 chars>"');
    // Every cluster is compared, in constant time each, so timing reveals nothing about which matched.
    let found: { name: string; deleting: boolean } | undefined;
    for (const c of feed.clusters()) {
      if (credentialMatches(credential, c.spec.credentialHash)) found = { name: c.metadata.name, deleting: c.metadata.deletionTimestamp !== undefined };
    }
    if (found === undefined) throw new AsbError('Unauthorized', 'the cluster credential is unknown (rotated, or the cluster was removed)');
    if (found.deleting) throw new AsbError('Forbidden', `cluster ${found.name} is being removed from the hub`);
    return found.name;
  };

  return {
    feed,
    upgrade(req, socket, head) {
      let cluster: string;
      try {
        cluster = authenticate(req);
      } catch (err) {
        refuseUpgrade(socket, err instanceof AsbError ? err : new AsbError('Internal', 'internal error; the hub log has the details', { cause: err }), 'asb-hub');
        return;
      }
      wss.handleUpgrade(req, socket, head, (ws) => attach(ws, cluster));
    },
    connections: () => [...sessions.values()].map((s) => ({ cluster: s.cluster, appliedVersion: s.appliedVersion })),
    live: () => live.view(),
    close() {
      closing ??= (async () => {
        offReset();
        for (const s of [...sessions.values()]) drop(s, CLOSE.shutdown, 'hub shutting down', undefined);
        wss.close();
        feed.close();
        await status.close();
      })();
      return closing;
    },
  };
}

function parseMessage(data: RawData): WorkerToHub {
  const text = Array.isArray(data) ? Buffer.concat(data).toString('utf8') : Buffer.from(data as ArrayBuffer).toString('utf8');
  const msg = JSON.parse(text) as unknown;
  if (typeof msg !== 'object' || msg === null) throw new Error('frame is not a JSON object');
  const m = msg as Record<string, unknown>;
  const version = (v: unknown): number => {
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) throw new Error('version must be a non-negative integer');
    return v;
  };
  switch (m.type) {
    case 'hello':
      if (typeof m.cluster !== 'string') throw new Error('hello needs a cluster name');
      return { type: 'hello', cluster: m.cluster, lastVersion: version(m.lastVersion) };
    case 'ack':
      return { type: 'ack', version: version(m.version) };
    case 'built':
      if (!Array.isArray(m.items) || !m.items.every((i) => typeof i === 'object' && i !== null)) throw new Error('built needs an array of objects');
      return { type: 'built', items: m.items as KubeObject[] };
    case 'heartbeat': {
      const heartbeat: Extract<WorkerToHub, { type: 'heartbeat' }> = { type: 'heartbeat', warm: counts(m.warm), healthy: m.healthy === true };
      // Absent from an older worker: then it offers no template for placement.
      if (m.templates !== undefined) heartbeat.templates = counts(m.templates);
      if (m.pools !== undefined) heartbeat.pools = poolReports(m.pools);
      if (m.seq !== undefined) heartbeat.seq = version(m.seq);
      return heartbeat;
    }
    default:
      throw new Error(`unknown message type ${JSON.stringify(m.type)}`);
  }
}

/** A `name → count` map; entries that are not non-negative finite numbers are left out. */
function counts(value: unknown): Record<string, number> {
  const out: Record<string, number> = {};
  if (typeof value !== 'object' || value === null) return out;
  for (const [k, v] of Object.entries(value)) if (typeof v === 'number' && Number.isFinite(v) && v >= 0) out[k] = v;
  return out;
}

/** Pool reports; an entry whose counts are not non-negative integers or whose template is not a string is left out. */
function poolReports(value: unknown): Record<string, PoolReport> {
  const out: Record<string, PoolReport> = {};
  if (typeof value !== 'object' || value === null) return out;
  const count = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
  for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
    if (typeof v !== 'object' || v === null) continue;
    const { ready, desired, template } = v as Record<string, unknown>;
    if (count(ready) && count(desired) && typeof template === 'string') out[k] = { ready, desired, template };
  }
  return out;
}
