// The data plane on loopback for tests and the benchmark: the real router (startRouter), a real
// Envoy (EnvoyProcess) in front of it, a fake worker that serves the route feed, resume and
// activity calls and stands in for the worker API, and plain upstream servers playing sandbox
// servers (HTTP + WebSocket echo on 127.0.0.1, reached as <port>-<id>.<domain>).
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { Agent, createServer, request, type IncomingHttpHeaders, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WebSocketServer, type WebSocket } from 'ws';
import { EnvoyProcess } from '../../src/edge/envoy-process.ts';
import type { EdgeConfigOptions } from '../../src/edge/envoy-config.ts';
import type { RouteEntry } from '../../src/router/contract.ts';
import { FEED_PATH } from '../../src/router/feed-client.ts';
import { parseRouterConfig } from '../../src/router/router-config.ts';
import { startRouter, type RunningRouter } from '../../src/router/start-router.ts';
import { silentLogger } from '../../src/base/log.ts';

export const DOMAIN = 'asb.localhost';
export const WORKER_KEY = 'admin-key';
/** A 32-char token, as the worker derives them; the feed carries only its sha256. */
export const TOKEN = 'tok_0123456789abcdefghijklmnopqrs';
export const TOKEN_HASH = createHash('sha256').update(TOKEN).digest('hex');

/** Registers a cleanup (node:test's t.after, or a list the benchmark runs). */
export type After = (fn: () => unknown) => void;

export interface Upstream {
  name: string;
  port: number;
  /** Headers of every HTTP request (and WebSocket upgrade) it received. */
  seen: IncomingHttpHeaders[];
}

/** An HTTP server answering `<name> <method> <url>` and echoing WebSocket messages as `<name>:<msg>`. */
export async function startUpstream(after: After, name: string): Promise<Upstream> {
  const seen: IncomingHttpHeaders[] = [];
  const body = (req: IncomingMessage): string => `${name} ${req.method ?? '?'} ${req.url ?? '?'}`;
  const server: Server = createServer((req, res) => {
    seen.push(req.headers);
    const text = body(req);
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  });
  server.keepAliveTimeout = 60_000;
  const wss = new WebSocketServer({ server });
  wss.on('connection', (socket, req) => {
    seen.push(req.headers);
    socket.on('message', (data: Buffer) => socket.send(`${name}:${data.toString()}`));
  });
  await listen(server);
  after(() => {
    for (const c of wss.clients) c.terminate();
    wss.close();
    server.closeAllConnections();
    server.close();
  });
  return { name, port: (server.address() as AddressInfo).port, seen };
}

export interface FakeWorker {
  /** http://127.0.0.1:<port> */
  url: string;
  address: string;
  /** Resume calls per sandbox id. */
  resumes: Map<string, number>;
  /** Ids of every activity report, in order. */
  activity: string[][];
  /** The router's lookups (GET /v1/sandboxes/{id} with the admin key) per id: 200 for a published id, else 404. */
  lookups: Map<string, number>;
  /** Requests that reached it as the cluster's API (method + path + headers). */
  apiSeen: { path: string; headers: IncomingHttpHeaders }[];
  /** Called on each resume after it is counted (tests publish the running entry from here). */
  onResume: (id: string) => void;
  /** Replaces the cluster's entries: a fresh snapshot to every connected router. Returns its version. */
  publish(entries: RouteEntry[]): number;
  /** Connected feed sockets. */
  feeds(): number;
}

/** A worker's data-plane side for cluster `cluster`: route feed, resume, activity, API stand-in. */
export async function startFakeWorker(after: After, cluster: string): Promise<FakeWorker> {
  let entries: RouteEntry[] = [];
  let version = 1;
  const sockets = new Set<WebSocket>();
  const snapshot = (): string => JSON.stringify({ type: 'snapshot', version, cluster, entries });
  const fake: FakeWorker = {
    url: '',
    address: '',
    resumes: new Map(),
    activity: [],
    lookups: new Map(),
    apiSeen: [],
    onResume: () => undefined,
    publish(next) {
      entries = next;
      version += 1;
      for (const s of sockets) s.send(snapshot());
      return version;
    },
    feeds: () => sockets.size,
  };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const url = req.url ?? '/';
      const resume = /^\/v1\/sandboxes\/([^/]+)\/resume$/.exec(url);
      if (req.method === 'POST' && resume?.[1] !== undefined && req.headers.authorization === `Bearer ${WORKER_KEY}`) {
        const id = resume[1];
        fake.resumes.set(id, (fake.resumes.get(id) ?? 0) + 1);
        json(res, 200, { id });
        fake.onResume(id);
        return;
      }
      if (req.method === 'POST' && url === '/v1/activity' && req.headers.authorization === `Bearer ${WORKER_KEY}`) {
        fake.activity.push((JSON.parse(Buffer.concat(chunks).toString()) as { ids: string[] }).ids);
        json(res, 200, { touched: 0 });
        return;
      }
      const lookup = /^\/v1\/sandboxes\/([^/?]+)$/.exec(url);
      if (req.method === 'GET' && lookup?.[1] !== undefined && req.headers.authorization === `Bearer ${WORKER_KEY}`) {
        const id = lookup[1];
        fake.lookups.set(id, (fake.lookups.get(id) ?? 0) + 1);
        json(res, entries.some((e) => e.id === id) ? 200 : 404, { id });
        return;
      }
      fake.apiSeen.push({ path: url, headers: req.headers });
      json(res, 200, { api: cluster, path: url });
    });
  });
  const wss = new WebSocketServer({ noServer: true });
  server.on('upgrade', (req, socket, head) => {
    if (req.url !== FEED_PATH || req.headers.authorization !== `Bearer ${WORKER_KEY}`) {
      socket.end('HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n');
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      sockets.add(ws);
      ws.on('close', () => sockets.delete(ws));
      ws.send(snapshot());
    });
  });
  // The router drops a feed silent for 30 s; a long test keeps it alive as a worker would.
  const pings = setInterval(() => {
    for (const s of sockets) s.ping();
  }, 5_000);
  await listen(server);
  const port = (server.address() as AddressInfo).port;
  fake.address = `127.0.0.1:${port}`;
  fake.url = `http://${fake.address}`;
  after(() => {
    clearInterval(pings);
    for (const s of sockets) s.terminate();
    wss.close();
    server.closeAllConnections();
    server.close();
  });
  return fake;
}

function json(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function listen(server: Server): Promise<void> {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
}

/** A loopback port nobody listens on (bound, then closed): a worker that is down. */
/** A running sandbox served by an upstream on 127.0.0.1. */
export function sandboxEntry(id: string, cluster: string, patch: Partial<RouteEntry> = {}): RouteEntry {
  return { id, cluster, state: 'running', podIp: '127.0.0.1', defaultPort: 49983, publicPorts: [], tokenHash: TOKEN_HASH, owner: 'team-a', ...patch };
}

export interface RouterOptions {
  /** `host:port` to listen on (a restart passes the previous address). */
  listen?: string;
  workers: { cluster: string; url: string }[];
  holdLimitMs?: number;
  /** Activity report interval; default 100 ms so tests see reports quickly (production: 5 s). */
  activityFlushMs?: number;
}

export async function startTestRouter(after: After, opts: RouterOptions): Promise<RunningRouter> {
  const argv = ['--listen', opts.listen ?? '127.0.0.1:0', '--domain', DOMAIN, '--worker-key', WORKER_KEY];
  for (const w of opts.workers) argv.push('--worker', `${w.cluster}=${w.url}`);
  if (opts.holdLimitMs !== undefined) argv.push('--hold-limit-ms', String(opts.holdLimitMs));
  const router = await startRouter(parseRouterConfig(argv, {}), { log: silentLogger(), activityFlushMs: opts.activityFlushMs ?? 100 });
  after(() => router.close());
  return router;
}

export async function startTestEnvoy(after: After, config: EdgeConfigOptions, concurrency = 1): Promise<EnvoyProcess> {
  const dir = mkdtempSync(join(tmpdir(), 'asb-dataplane-'));
  const envoy = new EnvoyProcess({ stateDir: dir, config, logger: silentLogger(), concurrency });
  after(async () => {
    await envoy.close();
    rmSync(dir, { recursive: true, force: true });
  });
  await envoy.start();
  return envoy;
}

export interface Reply {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

/** One HTTP/1.1 request to `baseUrl` with the Host header `host` (fetch cannot set Host). */
export function send(baseUrl: string, host: string, path = '/', headers: Record<string, string> = {}, agent?: Agent): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = request(`${baseUrl}${path}`, { headers: { host, ...headers }, ...(agent === undefined ? {} : { agent }) }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/** Polls `cond` every 10 ms until it holds, or fails after `ms` (bounded: never sleep-and-hope). */
export async function until(cond: () => boolean | Promise<boolean>, ms: number, what: string): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

export interface LoadResult {
  ok: number;
  failed: number;
  /** status → count for the failures (0: connection error). */
  failures: Map<number, number>;
  /** Per-request latency in ms, in completion order. */
  latenciesMs: number[];
}

/**
 * `total` GETs over `connections` keep-alive connections, each connection sending its next
 * request when the previous answer is in (closed loop), every answer checked for `expect`.
 */
export async function load(baseUrl: string, host: string, opts: { total: number; connections: number; headers?: Record<string, string>; expect: (r: Reply) => boolean }): Promise<LoadResult> {
  const agent = new Agent({ keepAlive: true, maxSockets: opts.connections });
  const result: LoadResult = { ok: 0, failed: 0, failures: new Map(), latenciesMs: [] };
  let issued = 0;
  const worker = async (): Promise<void> => {
    while (issued < opts.total) {
      issued += 1;
      const started = performance.now();
      let status = 0;
      try {
        const r = await send(baseUrl, host, `/load/${issued}`, opts.headers ?? {}, agent);
        status = r.status;
        if (opts.expect(r)) {
          result.ok += 1;
          result.latenciesMs.push(performance.now() - started);
          continue;
        }
      } catch {
        status = 0;
      }
      result.failed += 1;
      result.failures.set(status, (result.failures.get(status) ?? 0) + 1);
    }
  };
  try {
    await Promise.all(Array.from({ length: opts.connections }, worker));
  } finally {
    agent.destroy();
  }
  return result;
}
