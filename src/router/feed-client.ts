// The router's side of the route feed (contract.ts): one supervised WebSocket per worker to
// `GET <worker API>/v1/routes/feed`, authenticated with the admin key. Every (re)connect begins
// with a snapshot that resyncs that cluster's entries; deltas follow in version order. When the
// connection drops the cluster's entries stay (its pods keep serving) but the cluster counts as
// unreachable, so requests that need its worker (API, wake) get 503 at once, and we reconnect
// with capped exponential backoff and jitter. The worker pings every 10 s; we also close a
// connection that has been silent for 30 s (three missed pings). `clusters` messages (the
// federation as the worker knows it) go to the cluster registry, not the route table.
import WebSocket from 'ws';
import type { Clock, Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import type { ClusterRoute, ClustersMessage, FeedMessage, RouteEntry } from './contract.ts';
import type { ClusterRegistry } from './registry.ts';
import type { ApplyResult, RouteTable } from './route-table.ts';
import type { WorkerEndpoint } from './worker-api.ts';

export const FEED_PATH = '/v1/routes/feed';

export interface FeedClientOptions {
  worker: WorkerEndpoint;
  table: RouteTable;
  /** Where `clusters` messages go; absent: they are ignored. */
  federation?: ClusterRegistry;
  clock: Clock;
  log: Logger;
  /** First reconnect delay. Default 100 ms; doubles per failure up to maxBackoffMs. */
  baseBackoffMs?: number;
  /** Default 5 000 ms: a worker restart takes ~1 s, so we are back within a few seconds. */
  maxBackoffMs?: number;
  /** Close a connection silent this long. Default 30 000 ms (three of the worker's 10 s pings). */
  silenceMs?: number;
  /** Random in [0,1) for jitter (tests pin it). */
  random?: () => number;
  /** Every applied or refused message (metrics). */
  onMessage?: (type: FeedMessage['type'] | 'invalid', result: ApplyResult | 'invalid') => void;
}

export interface FeedStatus {
  cluster: string;
  connected: boolean;
  synced: boolean;
  version: number | undefined;
  /** Connections opened so far (1 + reconnects). */
  connects: number;
}

export class FeedClient {
  readonly #opts: FeedClientOptions;
  readonly #log: Logger;
  #ws: WebSocket | undefined;
  #retry: Timer | undefined;
  #silence: Timer | undefined;
  #failures = 0;
  #connects = 0;
  #closed = false;
  #synced: Promise<void>;
  #resolveSynced: () => void = () => undefined;

  constructor(opts: FeedClientOptions) {
    this.#opts = opts;
    this.#log = opts.log.child({ feed: opts.worker.cluster });
    this.#synced = new Promise((resolve) => (this.#resolveSynced = resolve));
    this.#connect();
  }

  /** Resolves after the first snapshot has been applied. */
  synced(): Promise<void> {
    return this.#synced;
  }

  status(): FeedStatus {
    const cluster = this.#opts.worker.cluster;
    const { table } = this.#opts;
    return { cluster, connected: table.isConnected(cluster), synced: table.isSynced(cluster), version: table.version(cluster), connects: this.#connects };
  }

  /** Stops for good. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#retry?.cancel();
    this.#silence?.cancel();
    this.#ws?.terminate();
    this.#opts.table.setConnected(this.#opts.worker.cluster, false);
    this.#opts.federation?.feedDown(this.#opts.worker.cluster);
  }

  #connect(): void {
    if (this.#closed) return;
    const { worker, table } = this.#opts;
    const url = new URL(FEED_PATH, worker.url);
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
    this.#connects += 1;
    const ws = new WebSocket(url, { headers: { authorization: `Bearer ${worker.key}` }, handshakeTimeout: 5_000, perMessageDeflate: false });
    this.#ws = ws;
    let opened = false;
    ws.on('open', () => {
      opened = true;
      table.setConnected(worker.cluster, true);
      this.#log.info({ url: url.href }, 'route feed connected');
      this.#armSilence(ws);
    });
    ws.on('ping', () => this.#armSilence(ws));
    ws.on('message', (data, isBinary) => {
      this.#armSilence(ws);
      if (isBinary) return this.#invalid('binary frame');
      this.#handle(textOf(data));
    });
    ws.on('unexpected-response', (_req, res) => {
      this.#log.warn({ status: res.statusCode }, 'route feed refused');
      res.resume();
      ws.terminate();
    });
    ws.on('error', (err) => {
      this.#log.warn({ err: err.message }, 'route feed error');
    });
    ws.on('close', (code) => {
      if (this.#ws !== ws) return;
      this.#ws = undefined;
      this.#silence?.cancel();
      table.setConnected(worker.cluster, false);
      this.#opts.federation?.feedDown(worker.cluster);
      if (this.#closed) return;
      if (!opened) this.#failures += 1;
      const delay = this.#backoff();
      this.#log.warn({ code, retryInMs: Math.round(delay) }, 'route feed closed; reconnecting');
      this.#retry = this.#opts.clock.after(delay, () => this.#connect());
    });
  }

  #handle(text: string): void {
    let msg: unknown;
    try {
      msg = JSON.parse(text);
    } catch {
      return this.#invalid('not JSON');
    }
    if (!isFeedMessage(msg)) return this.#invalid('unknown message shape');
    if (msg.type === 'clusters') return this.#clusters(msg);
    const result = this.#opts.table.apply(this.#opts.worker.cluster, msg);
    this.#opts.onMessage?.(msg.type, result);
    if (msg.type === 'snapshot') {
      if (result === 'foreign') {
        this.#log.error({ expected: this.#opts.worker.cluster, got: msg.cluster }, 'route feed snapshot is for another cluster: check --worker name=url');
        return;
      }
      this.#failures = 0;
      this.#log.info({ version: msg.version, entries: msg.entries.length }, 'route feed snapshot applied');
      this.#resolveSynced();
    } else if (result !== 'applied') {
      this.#log.warn({ type: msg.type, version: msg.version, result }, 'route feed delta refused');
    }
  }

  #clusters(msg: ClustersMessage): void {
    const result = this.#opts.federation?.apply(this.#opts.worker.cluster, msg) ?? 'applied';
    this.#opts.onMessage?.(msg.type, result);
    if (result === 'foreign') {
      this.#log.error({ expected: this.#opts.worker.cluster, got: msg.self }, 'route feed clusters message is for another cluster: check --worker name=url');
      return;
    }
    this.#log.debug({ clusters: msg.clusters.length, hubConnected: msg.hubConnected }, 'route feed clusters applied');
  }

  #invalid(why: string): void {
    this.#opts.onMessage?.('invalid', 'invalid');
    this.#log.warn({ why }, 'route feed message ignored');
  }

  #armSilence(ws: WebSocket): void {
    this.#silence?.cancel();
    this.#silence = this.#opts.clock.after(this.#opts.silenceMs ?? 30_000, () => {
      this.#log.warn('route feed silent; reconnecting');
      ws.terminate();
    });
  }

  #backoff(): number {
    const base = this.#opts.baseBackoffMs ?? 100;
    const max = this.#opts.maxBackoffMs ?? 5_000;
    const ceiling = Math.min(max, base * 2 ** Math.min(this.#failures, 16));
    // Full jitter over the upper half: routers restarted together do not reconnect in lockstep.
    return ceiling / 2 + (this.#opts.random ?? Math.random)() * (ceiling / 2);
  }
}

function textOf(data: WebSocket.RawData): string {
  if (Array.isArray(data)) return Buffer.concat(data).toString('utf8');
  if (Buffer.isBuffer(data)) return data.toString('utf8');
  return Buffer.from(data).toString('utf8');
}

function isFeedMessage(v: unknown): v is FeedMessage {
  if (typeof v !== 'object' || v === null) return false;
  const m = v as Record<string, unknown>;
  if (m.type === 'clusters') {
    return typeof m.self === 'string' && typeof m.hubConnected === 'boolean' && Array.isArray(m.clusters) && m.clusters.every(isClusterRoute);
  }
  if (typeof m.version !== 'number') return false;
  switch (m.type) {
    case 'snapshot':
      return typeof m.cluster === 'string' && Array.isArray(m.entries) && m.entries.every(isRouteEntry);
    case 'upsert':
      return isRouteEntry(m.entry);
    case 'delete':
      return typeof m.id === 'string';
    default:
      return false;
  }
}

const STATES: readonly string[] = ['running', 'starting', 'hibernated', 'failed', 'expired'];

function isRouteEntry(v: unknown): v is RouteEntry {
  if (typeof v !== 'object' || v === null) return false;
  const e = v as Record<string, unknown>;
  return (
    typeof e.id === 'string' &&
    typeof e.cluster === 'string' &&
    typeof e.state === 'string' &&
    STATES.includes(e.state) &&
    (e.podIp === undefined || typeof e.podIp === 'string') &&
    typeof e.defaultPort === 'number' &&
    Array.isArray(e.publicPorts) &&
    e.publicPorts.every((p) => typeof p === 'number') &&
    (e.h2cPorts === undefined || (Array.isArray(e.h2cPorts) && e.h2cPorts.every((p) => typeof p === 'number'))) &&
    typeof e.tokenHash === 'string' &&
    typeof e.owner === 'string'
  );
}

function isClusterRoute(v: unknown): v is ClusterRoute {
  if (typeof v !== 'object' || v === null) return false;
  const c = v as Record<string, unknown>;
  return typeof c.name === 'string' && typeof c.tag === 'string' && typeof c.region === 'string' && typeof c.ingressAddress === 'string' && typeof c.drain === 'boolean';
}
