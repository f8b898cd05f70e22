// A router under test without feeds: a route table filled directly, a fake worker HTTP API on
// port 0 (resume, lookup, activity) and the real ext_proc server on port 0.
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { TestContext } from 'node:test';
import { ActivityReporter } from '../../src/router/activity.ts';
import type { RouteEntry } from '../../src/router/contract.ts';
import { ExtProcServer } from '../../src/router/extproc-server.ts';
import { LookupLimiter, type LookupLimits } from '../../src/router/lookup-limiter.ts';
import { PortWaiter } from '../../src/router/port-wait.ts';
import { RouteTable } from '../../src/router/route-table.ts';
import { Waker, type LookupResult } from '../../src/router/waker.ts';
import type { Clock, Timer } from '../../src/base/clock.ts';
import { silentLogger } from '../../src/base/log.ts';

export const CLUSTER = 'c1';
export const DOMAIN = 'asb.localhost';
export const TOKEN = 'tok_0123456789abcdefghijklmnopqrst';

/** A route entry; `podIp: undefined` in the patch removes the pod address. */
export function entry(id: string, patch: { [K in keyof RouteEntry]?: RouteEntry[K] | undefined } = {}): RouteEntry {
  const e: Record<string, unknown> = {
    id,
    cluster: CLUSTER,
    state: 'running',
    podIp: '10.213.0.7',
    defaultPort: 49983,
    publicPorts: [],
    tokenHash: createHash('sha256').update(TOKEN).digest('hex'),
    owner: 'team-a',
    ...patch,
  };
  if (e.podIp === undefined) delete e.podIp;
  return e as unknown as RouteEntry;
}

/** A clock whose timers fire only when the test says so. */
export class ManualClock implements Clock {
  #now = 1_700_000_000_000;
  readonly timers = new Set<{ at: number; fn: () => void }>();
  now(): number {
    return this.#now;
  }
  after(ms: number, fn: () => void): Timer {
    const t = { at: this.#now + ms, fn };
    this.timers.add(t);
    return { cancel: () => this.timers.delete(t) };
  }
  advance(ms: number): void {
    this.#now += ms;
    for (const t of [...this.timers]) {
      if (t.at <= this.#now) {
        this.timers.delete(t);
        t.fn();
      }
    }
  }
}

export interface FakeWorker {
  url: string;
  resumes: Map<string, number>;
  /** Each resume's JSON body, per id, in order. */
  resumeBodies: Map<string, unknown[]>;
  lookups: Map<string, number>;
  activity: string[][];
  /** Ids GET /v1/sandboxes/{id} answers 200 for. */
  existing: Set<string>;
  /** The phase that 200 says, per id; default Running. */
  phases: Map<string, string>;
  /** While set, lookups (GET /v1/sandboxes/{id}) are counted at once but answered only when it resolves. */
  holdLookups: Promise<void> | undefined;
  /** What a resume answers; default 200. */
  resumeStatus: number;
  onResume: (id: string) => void;
}

export async function startFakeWorker(t: TestContext): Promise<FakeWorker> {
  const fake: FakeWorker = { url: '', resumes: new Map(), resumeBodies: new Map(), lookups: new Map(), activity: [], existing: new Set(), phases: new Map(), holdLookups: undefined, resumeStatus: 200, onResume: () => undefined };
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const url = req.url ?? '';
      const resume = /^\/v1\/sandboxes\/([^/]+)\/resume$/.exec(url);
      const one = /^\/v1\/sandboxes\/([^/]+)$/.exec(url);
      if (req.headers.authorization !== 'Bearer admin-key') return send(res, 401, {});
      if (req.method === 'POST' && resume?.[1] !== undefined) {
        const id = resume[1];
        fake.resumes.set(id, (fake.resumes.get(id) ?? 0) + 1);
        fake.resumeBodies.set(id, [...(fake.resumeBodies.get(id) ?? []), JSON.parse(Buffer.concat(chunks).toString('utf8') || 'null') as unknown]);
        send(res, fake.resumeStatus, { id });
        if (fake.resumeStatus === 200) fake.onResume(id);
        return;
      }
      if (req.method === 'GET' && one?.[1] !== undefined) {
        const id = one[1];
        fake.lookups.set(id, (fake.lookups.get(id) ?? 0) + 1);
        const answer = (): void => send(res, fake.existing.has(id) ? 200 : 404, fake.existing.has(id) ? { id, phase: fake.phases.get(id) ?? 'Running' } : { id });
        if (fake.holdLookups === undefined) return answer();
        void fake.holdLookups.then(answer);
        return;
      }
      if (req.method === 'POST' && url === '/v1/activity') {
        fake.activity.push((JSON.parse(Buffer.concat(chunks).toString()) as { ids: string[] }).ids);
        return send(res, 200, { touched: 0 });
      }
      send(res, 404, {});
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  fake.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return fake;
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

export interface RouterUnderTest {
  server: ExtProcServer;
  table: RouteTable;
  worker: FakeWorker;
  clock: Clock;
  activity: ActivityReporter;
  /** Every lookup outcome and refusal, in order. */
  lookupResults: LookupResult[];
  /** The pods' ports as the router's connect attempts see them (no real connect leaves the test). */
  ports: FakePorts;
  /** Replaces cluster c1's entries (a feed snapshot) and marks its feed connected. */
  snapshot(entries: RouteEntry[]): void;
  /** The next feed delta for c1. */
  upsert(e: RouteEntry): void;
}

/**
 * Pod ports for the router's "does it listen yet" connects: every `host:port` accepts unless in
 * `closed`; `attempts` lists each connect in order. A connect answers on the next tick, as a
 * refused local connect does.
 */
export interface FakePorts {
  closed: Set<string>;
  attempts: string[];
  connect: (host: string, port: number) => Promise<boolean>;
}

export function fakePorts(): FakePorts {
  const ports: FakePorts = {
    closed: new Set(),
    attempts: [],
    connect: (host, port) => {
      const key = `${host}:${port}`;
      ports.attempts.push(key);
      return new Promise((resolve) => setImmediate(() => resolve(!ports.closed.has(key))));
    },
  };
  return ports;
}

export async function startRouterUnderTest(t: TestContext, opts: { clock?: Clock; holdLimitMs?: number; lookupLimits?: Partial<LookupLimits> } = {}): Promise<RouterUnderTest> {
  const worker = await startFakeWorker(t);
  const clock = opts.clock ?? new ManualClock();
  const log = silentLogger();
  const table = new RouteTable({ clock });
  const workers = new Map([[CLUSTER, { cluster: CLUSTER, url: worker.url, key: 'admin-key' }]]);
  const lookupResults: LookupResult[] = [];
  const limiter = new LookupLimiter({ clock, ...(opts.lookupLimits === undefined ? {} : { limits: opts.lookupLimits }) });
  const ports = fakePorts();
  const portWaiter = new PortWaiter({ clock, connect: ports.connect });
  const waker = new Waker({ table, workers, clock, log, limiter, portWaiter, onLookup: (r) => lookupResults.push(r), ...(opts.holdLimitMs === undefined ? {} : { holdLimitMs: opts.holdLimitMs }) });
  const activity = new ActivityReporter({ workers, clock, log });
  const server = await ExtProcServer.start({ table, domain: DOMAIN, clusters: new Set([CLUSTER]), defaultCluster: CLUSTER, waker, activity, metrics: undefined, log, listen: '127.0.0.1:0' });
  t.after(async () => {
    await server.close(100);
    await activity.close();
  });
  let version = 1;
  return {
    server,
    table,
    worker,
    clock,
    activity,
    lookupResults,
    ports,
    snapshot(entries) {
      table.setConnected(CLUSTER, true);
      table.apply(CLUSTER, { type: 'snapshot', version: ++version, cluster: CLUSTER, entries });
    },
    upsert(e) {
      table.apply(CLUSTER, { type: 'upsert', version: ++version, entry: e });
    },
  };
}

/** Polls `cond` every 5 ms until it holds or `ms` pass. */
export async function until(cond: () => boolean, ms = 5_000, what = 'condition'): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}
