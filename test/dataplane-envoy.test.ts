// The data plane through a real Envoy 1.40: the router (startRouter, in-process), Envoy from
// .venv (EnvoyProcess, generated from envoy/edge.yaml), a fake worker feeding routes, and loopback
// upstreams standing in for sandbox servers. Everything a client of <port>-<id>.<domain> would
// notice: routing, WebSockets, tokens and cookies, spoofed routing headers, 404/400/503, wake on
// connect, router and Envoy restarts, and 20,000 requests with Envoy's RST-per-stream default.
import { test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { Agent } from 'node:http';
import { WebSocket } from 'ws';
import { ACCESS_COOKIE, type RouteEntry } from '../src/router/contract.ts';
import { DEFAULT_LOOKUP_LIMITS } from '../src/router/lookup-limiter.ts';
import type { RunningRouter } from '../src/router/start-router.ts';
import type { EnvoyProcess } from '../src/edge/envoy-process.ts';
import { freePort } from '../src/assembly/local-system.ts';
import {
  DOMAIN,
  load,
  sandboxEntry,
  send,
  startFakeWorker,
  startTestEnvoy,
  startTestRouter,
  startUpstream,
  TOKEN,
  until,
  type FakeWorker,
  type Upstream,
} from './support/dataplane-fixture.ts';

interface Plane {
  pod: Upstream;
  other: Upstream;
  worker: FakeWorker;
  router: RunningRouter;
  envoy: EnvoyProcess;
  edge: string;
  /** Port of the down cluster c2's worker. */
  downPort: number;
  /** Publishes c1's entries and waits until the router applied them. */
  publish(entries: RouteEntry[]): Promise<void>;
}

const ID = 'sbx1';
const OTHER = 'sbx2';

async function plane(t: TestContext, opts: { gracefulClose?: boolean; holdLimitMs?: number } = {}): Promise<Plane> {
  const after = (fn: () => unknown): void => t.after(fn);
  const pod = await startUpstream(after, 'pod');
  const other = await startUpstream(after, 'other');
  const worker = await startFakeWorker(after, 'c1');
  const downPort = await freePort();
  const router = await startTestRouter(after, {
    workers: [
      { cluster: 'c1', url: worker.url },
      { cluster: 'c2', url: `http://127.0.0.1:${downPort}` },
    ],
    ...(opts.holdLimitMs === undefined ? {} : { holdLimitMs: opts.holdLimitMs }),
  });
  const envoy = await startTestEnvoy(after, {
    listenPort: 0,
    adminPort: 0,
    routerAddress: router.address,
    workers: [
      { cluster: 'c1', apiAddress: worker.address },
      { cluster: 'c2', apiAddress: `127.0.0.1:${downPort}` },
    ],
    ...(opts.gracefulClose === undefined ? {} : { gracefulClose: opts.gracefulClose }),
  });
  const p: Plane = {
    pod,
    other,
    worker,
    router,
    envoy,
    edge: envoy.endpoints.edgeUrl,
    downPort,
    async publish(entries) {
      const version = worker.publish(entries);
      await until(() => p.router.table.version('c1') === version, 5_000, `route feed version ${version}`);
    },
  };
  await p.publish([sandboxEntry(ID, 'c1', { defaultPort: pod.port }), sandboxEntry(OTHER, 'c1', { defaultPort: other.port })]);
  return p;
}

const host = (port: number, id: string): string => `${port}-${id}.${DOMAIN}`;
const problem = (body: string): { code?: string; status?: number } => JSON.parse(body) as { code?: string; status?: number };

/** Every ext_proc failure counter Envoy keeps; all must stay 0 when the router behaves. */
async function extProcFailures(envoy: EnvoyProcess): Promise<Record<string, number>> {
  const stats = await envoy.stats('ext_proc');
  const out: Record<string, number> = {};
  for (const name of ['streams_failed', 'message_timeouts', 'spurious_msgs_received', 'rejected_header_mutations', 'clear_route_cache_ignored', 'override_message_timeout_ignored', 'failure_mode_allowed']) {
    out[name] = stats.get(`http.edge.ext_proc.${name}`) ?? 0;
  }
  return out;
}
const NO_FAILURES = { streams_failed: 0, message_timeouts: 0, spurious_msgs_received: 0, rejected_header_mutations: 0, clear_route_cache_ignored: 0, override_message_timeout_ignored: 0, failure_mode_allowed: 0 };

test('a request to <port>-<id>.<domain> with the token reaches that pod port, and the pod sees no routing header', async (t) => {
  const p = await plane(t);
  const res = await send(p.edge, host(p.pod.port, ID), '/hello?x=1', { 'x-access-token': TOKEN });
  assert.equal(res.status, 200, res.body);
  assert.equal(res.body, 'pod GET /hello?x=1');
  const seen = p.pod.seen.at(-1) ?? {};
  assert.equal(seen.host, host(p.pod.port, ID), 'the pod sees the client Host');
  assert.equal(seen['x-asb-sandbox-id'], ID, 'the router tells the pod which sandbox it serves');
  for (const name of ['x-asb-upstream', 'x-asb-dst', 'x-access-token']) assert.equal(seen[name], undefined, `${name} reaches the pod`);

  // <id>.<domain>: the template's default port. E2B style: headers on localhost.
  assert.equal((await send(p.edge, `${ID}.${DOMAIN}`, '/default', { 'x-access-token': TOKEN })).body, 'pod GET /default');
  const e2b = await send(p.edge, 'localhost', '/e2b', { 'e2b-sandbox-id': OTHER, 'e2b-sandbox-port': String(p.other.port), 'x-access-token': TOKEN });
  assert.equal(e2b.body, 'other GET /e2b');
  assert.equal(p.other.seen.at(-1)?.['e2b-sandbox-id'], undefined, 'E2B routing headers are removed');

  // API paths on api.<domain> go to the owning worker's API.
  const api = await send(p.edge, `api.${DOMAIN}`, `/sandboxes/${ID}`);
  assert.equal(api.status, 200);
  assert.deepEqual(JSON.parse(api.body), { api: 'c1', path: `/sandboxes/${ID}` });
  assert.deepEqual(await extProcFailures(p.envoy), NO_FAILURES);
});

test('WebSocket echo through Envoy; the open socket keeps its ext_proc stream open and reports activity until it closes', async (t) => {
  const p = await plane(t);
  const ws = new WebSocket(`${p.edge.replace('http', 'ws')}/term`, { headers: { host: host(p.pod.port, ID), 'x-access-token': TOKEN } });
  t.after(() => ws.terminate());
  await new Promise<void>((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('error', reject);
  });
  const reply = new Promise<string>((resolve) => ws.once('message', (data: Buffer) => resolve(data.toString())));
  ws.send('hi');
  assert.equal(await reply, 'pod:hi');
  assert.equal(p.pod.seen.at(-1)?.['x-access-token'], undefined);

  // response_trailer_mode: SEND (envoy/edge.yaml) keeps the stream for the socket's life.
  assert.equal(p.router.server.openStreams, 1);
  // Reports keep coming while the socket is open, not just the one for its first request.
  const reportsAtOpen = p.worker.activity.length;
  await until(() => p.worker.activity.slice(reportsAtOpen + 1).some((ids) => ids.includes(ID)), 5_000, 'a later activity report naming the sandbox');

  ws.close();
  await until(() => p.router.server.openStreams === 0, 5_000, 'the ext_proc stream to end with the socket');
  assert.deepEqual(await extProcFailures(p.envoy), NO_FAILURES);
});

test('without the token a private port refuses; a wrong token is refused; a public port needs none; the token sets a cookie that works alone', async (t) => {
  const p = await plane(t);
  await p.publish([sandboxEntry(ID, 'c1', { defaultPort: p.pod.port }), sandboxEntry(OTHER, 'c1', { defaultPort: p.other.port, publicPorts: [p.other.port] })]);
  const before = p.pod.seen.length;

  const none = await send(p.edge, host(p.pod.port, ID), '/private');
  assert.equal(none.status, 401);
  assert.match(String(none.headers['content-type']), /application\/json/);
  assert.equal(problem(none.body).code, 'Unauthorized');
  const wrong = await send(p.edge, host(p.pod.port, ID), '/private', { 'x-access-token': 'tok_wrong' });
  assert.equal(wrong.status, 403);
  assert.equal(problem(wrong.body).code, 'Forbidden');
  const wrongCookie = await send(p.edge, host(p.pod.port, ID), '/private', { cookie: `${ACCESS_COOKIE}=tok_wrong` });
  assert.equal(wrongCookie.status, 403);
  assert.equal(p.pod.seen.length, before, 'no refused request reached the pod');

  const open = await send(p.edge, host(p.other.port, OTHER), '/public');
  assert.equal(open.status, 200);
  assert.equal(open.body, 'other GET /public');

  // A browser: the first request carries the header, the response sets the cookie.
  const first = await send(p.edge, host(p.pod.port, ID), '/page', { 'x-access-token': TOKEN });
  assert.equal(first.status, 200);
  const setCookie = (first.headers['set-cookie'] ?? []).find((c) => c.startsWith(`${ACCESS_COOKIE}=`));
  assert.ok(setCookie !== undefined, `Set-Cookie ${ACCESS_COOKIE} on the token-bearing request, got ${JSON.stringify(first.headers['set-cookie'])}`);
  assert.match(setCookie, /HttpOnly/);
  const cookie = setCookie.split(';')[0] ?? '';
  const follow = await send(p.edge, host(p.pod.port, ID), '/link', { cookie: `theme=dark; ${cookie}` });
  assert.equal(follow.status, 200);
  assert.equal(follow.body, 'pod GET /link');
  assert.equal(p.pod.seen.at(-1)?.cookie, 'theme=dark', 'the pod gets its own cookies, never the token');
  assert.equal(follow.headers['set-cookie'], undefined, 'no cookie is set again when the browser already has it');
  assert.deepEqual(await extProcFailures(p.envoy), NO_FAILURES);
});

test('client-sent routing headers cannot redirect a request to another upstream', async (t) => {
  const p = await plane(t);
  const spoof = {
    'x-access-token': TOKEN,
    'x-asb-upstream': 'sandbox',
    'x-asb-dst': `127.0.0.1:${p.other.port}`,
    'x-asb-sandbox-id': OTHER,
    'e2b-sandbox-id': OTHER,
    'e2b-sandbox-port': String(p.other.port),
  };
  const res = await send(p.edge, host(p.pod.port, ID), '/mine', spoof);
  assert.equal(res.body, 'pod GET /mine');
  assert.equal(p.pod.seen.at(-1)?.['x-asb-sandbox-id'], ID, "the router's value, not the client's");
  // The API cluster name and a bare host cannot be used to reach the other pod either.
  const viaApi = await send(p.edge, `api.${DOMAIN}`, '/v1/sandboxes', { ...spoof, 'x-asb-upstream': 'sandbox' });
  assert.deepEqual(JSON.parse(viaApi.body), { api: 'c1', path: '/v1/sandboxes' });
  assert.equal(p.worker.apiSeen.at(-1)?.headers['x-asb-dst'], undefined);
  const unknown = await send(p.edge, host(p.other.port, 'nosuchbox'), '/', spoof);
  assert.equal(unknown.status, 404);
  // Underscores would alias dashes in some servers; Envoy drops such headers (E2B's SDKs send
  // lang_version, so refusing the request is not an option).
  const underscored = await send(p.edge, host(p.pod.port, ID), '/under', { x_asb_dst: `127.0.0.1:${p.other.port}`, 'x-access-token': TOKEN, lang_version: 'v24' });
  assert.equal(underscored.body, 'pod GET /under', 'the request reaches its own pod');
  assert.equal(p.pod.seen.at(-1)?.x_asb_dst, undefined, 'without the underscored header');
  assert.equal(p.pod.seen.at(-1)?.lang_version, undefined);
  assert.equal(p.other.seen.length, 0, 'the other upstream saw nothing');
});

test('unknown sandbox is 404 JSON, a malformed host or port 400, a cluster whose worker is down 503 at once', async (t) => {
  const p = await plane(t);
  const unknown = await send(p.edge, host(8080, 'nosuchbox'), '/');
  assert.equal(unknown.status, 404);
  assert.match(String(unknown.headers['content-type']), /application\/json/);
  assert.equal(problem(unknown.body).code, 'NotFound');
  for (const bad of [`99999-${ID}.${DOMAIN}`, `0-${ID}.${DOMAIN}`, `a.b.${DOMAIN}`, `bad_id.${DOMAIN}`]) {
    const res = await send(p.edge, bad, '/');
    assert.equal(res.status, 400, `${bad}: ${res.body}`);
    assert.equal(problem(res.body).code, 'BadRequest');
  }

  // c2's feed never connected; the entries it delivered before going down are still known.
  p.router.table.apply('c2', { type: 'snapshot', version: 7, cluster: 'c2', entries: [sandboxEntry('far1', 'c2', { state: 'hibernated' })] });
  // The guard only orders events: a 503 must come before it, long before any connect timeout.
  let guardFired = false;
  const guard = setTimeout(() => (guardFired = true), 5_000);
  t.after(() => clearTimeout(guard));
  for (const [h, path] of [[host(8080, 'far1'), '/'], [`api.${DOMAIN}`, '/sandboxes/far1']] as const) {
    const res = await send(p.edge, h, path, { 'x-access-token': TOKEN });
    assert.equal(res.status, 503, `${h}${path}: ${res.body}`);
    assert.equal(res.headers['retry-after'], '2');
    assert.equal(problem(res.body).code, 'Unavailable');
  }
  assert.equal(guardFired, false, '503 arrived before the 5 s guard');
  assert.deepEqual(await extProcFailures(p.envoy), NO_FAILURES);
});

test('300 requests for random ids from one address cost its lookup budget at the worker, not 300 lookups; the rest get 429, spoofed forwarding headers or not; other addresses are served meanwhile', async (t) => {
  // The default budget (lookup-limiter.ts): 20 at once, 5 a second.
  const p = await plane(t);
  // A sandbox with a generated id teaches the router that ids tagged tst1 belong to c1, so a
  // random tst1… id is looked up there (as rgna… ids were in the probe).
  const known = 'tst1kkkkkkkkkkkkkkkk';
  await p.publish([sandboxEntry(ID, 'c1', { defaultPort: p.pod.port }), sandboxEntry(known, 'c1', { defaultPort: p.pod.port })]);
  const lookups = (): number => [...p.worker.lookups.values()].reduce((a, b) => a + b, 0);
  const randomId = (): string => `tst1${Math.random().toString(36).slice(2, 10).padEnd(8, '0')}${Math.random().toString(36).slice(2, 10).padEnd(8, '0')}`;
  // Loopback has every 127.x address: one "client" per source address.
  const attacker = new Agent({ keepAlive: true, maxSockets: 20, localAddress: '127.0.0.1' });
  const bystander = new Agent({ keepAlive: true, localAddress: '127.0.0.2' });
  const other = new Agent({ keepAlive: true, localAddress: '127.0.0.3' });
  t.after(() => {
    for (const a of [attacker, bystander, other]) a.destroy();
  });

  const started = performance.now();
  const statuses = new Map<number, number>();
  let retryAfter: string | undefined;
  let bystanderServed = 0;
  for (let batch = 0; batch < 15; batch++) {
    const spoof = { 'x-forwarded-for': `10.9.${batch}.1`, 'x-envoy-external-address': `10.9.${batch}.2`, 'x-real-ip': `10.9.${batch}.3`, forwarded: `for=10.9.${batch}.4` };
    const answers = await Promise.all(Array.from({ length: 20 }, () => send(p.edge, host(8080, randomId()), '/', batch % 2 === 0 ? {} : spoof, attacker)));
    for (const res of answers) {
      statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
      if (res.status === 429) {
        retryAfter = String(res.headers['retry-after']);
        assert.equal(problem(res.body).code, 'TooManyRequests');
      }
    }
    const mine = await send(p.edge, host(p.pod.port, known), '/mine', { 'x-access-token': TOKEN }, bystander);
    if (mine.status === 200 && mine.body === 'pod GET /mine') bystanderServed += 1;
  }
  const elapsedS = (performance.now() - started) / 1000;
  const budget = DEFAULT_LOOKUP_LIMITS.burst + Math.ceil(elapsedS * DEFAULT_LOOKUP_LIMITS.ratePerS);
  assert.ok(lookups() <= budget, `the worker saw ${lookups()} lookups for 300 requests in ${elapsedS.toFixed(2)} s; the budget is ${budget}`);
  assert.equal((statuses.get(404) ?? 0) + (statuses.get(429) ?? 0), 300, JSON.stringify([...statuses]));
  assert.equal(statuses.get(404), lookups(), 'every request past the budget got 429 at the router, not a lookup');
  assert.ok(retryAfter !== undefined && Number(retryAfter) >= 1, 'a 429 says when to retry');
  assert.equal(bystanderServed, 15, 'a known sandbox was served to another address between every batch');

  // Another address still has its budget: its request for a fresh id is looked up (404).
  const before = lookups();
  const fresh = await send(p.edge, host(8080, randomId()), '/', {}, other);
  assert.equal(fresh.status, 404);
  assert.equal(problem(fresh.body).code, 'NotFound');
  assert.equal(lookups(), before + 1);
  const metrics = await p.router.registry.getSingleMetricAsString('asb_router_lookups_total');
  assert.match(metrics, /result="rate_limited"} [1-9]/);
  assert.deepEqual(await extProcFailures(p.envoy), NO_FAILURES);
});

test('a hibernated sandbox wakes once for concurrent first requests, which are held past Envoy’s 1 s message timeout and then served', async (t) => {
  const p = await plane(t, { holdLimitMs: 2_500 });
  await p.publish([sandboxEntry(ID, 'c1', { defaultPort: p.pod.port, state: 'hibernated' }), sandboxEntry(OTHER, 'c1', { state: 'hibernated' })]);
  p.worker.onResume = (id) => {
    if (id !== ID) return; // OTHER never comes up: its requests hit the hold limit.
    p.worker.publish([sandboxEntry(ID, 'c1', { defaultPort: p.pod.port, state: 'starting' }), sandboxEntry(OTHER, 'c1', { state: 'hibernated' })]);
    // 1.2 s: longer than message_timeout (1 s), so only override_message_timeout keeps Envoy waiting.
    setTimeout(() => p.worker.publish([sandboxEntry(ID, 'c1', { defaultPort: p.pod.port }), sandboxEntry(OTHER, 'c1', { state: 'hibernated' })]), 1_200);
  };
  const replies = await Promise.all(Array.from({ length: 5 }, (_, i) => send(p.edge, host(p.pod.port, ID), `/wake/${i}`, { 'x-access-token': TOKEN })));
  assert.deepEqual(
    replies.map((r) => r.status),
    [200, 200, 200, 200, 200],
  );
  assert.equal(replies[0]?.body, 'pod GET /wake/0');
  assert.equal(p.worker.resumes.get(ID), 1, 'one wake for five requests');
  assert.equal(p.router.table.get(ID)?.state, 'running');

  // Past the hold limit: the router's 503 with Retry-After, not Envoy's 504.
  const late = await send(p.edge, host(p.pod.port, OTHER), '/late', { 'x-access-token': TOKEN });
  assert.equal(late.status, 503, late.body);
  assert.equal(late.headers['retry-after'], '2');
  assert.equal(p.worker.resumes.get(OTHER), 1);
  assert.deepEqual(await extProcFailures(p.envoy), NO_FAILURES);
});

test('router restart: Envoy fails closed while it is down, then recovers by itself on the same port', async (t) => {
  const p = await plane(t);
  const ok = await send(p.edge, host(p.pod.port, ID), '/before', { 'x-access-token': TOKEN });
  assert.equal(ok.status, 200);
  const address = p.router.address;
  await p.router.close();
  const seen = p.pod.seen.length;
  for (const headers of [{ 'x-access-token': TOKEN }, { 'x-access-token': TOKEN, 'x-asb-upstream': 'sandbox', 'x-asb-dst': `127.0.0.1:${p.pod.port}` }]) {
    const down = await send(p.edge, host(p.pod.port, ID), '/down', headers);
    assert.equal(down.status, 503, 'fail closed');
  }
  assert.equal(p.pod.seen.length, seen, 'nothing reached the pod while the router was down');

  p.router = await startTestRouter((fn) => t.after(fn), {
    listen: address,
    workers: [
      { cluster: 'c1', url: p.worker.url },
      { cluster: 'c2', url: `http://127.0.0.1:${p.downPort}` },
    ],
  });
  // Not router.synced(): that waits for c2's feed too, and c2's worker is down for good.
  const restarted = p.router;
  await until(() => restarted.table.get(ID) !== undefined, 5_000, 'c1 feed snapshot in the restarted router');
  // Envoy reconnects on its own: no restart, no config push. Bounded poll until it has.
  let res = await send(p.edge, host(p.pod.port, ID), '/after', { 'x-access-token': TOKEN });
  await until(
    async () => {
      res = await send(p.edge, host(p.pod.port, ID), '/after', { 'x-access-token': TOKEN });
      return res.status === 200;
    },
    15_000,
    'Envoy to route through the restarted router',
  );
  assert.equal(res.body, 'pod GET /after');
});

test('Envoy restart: requests succeed again once it is back', async (t) => {
  const p = await plane(t);
  assert.equal((await send(p.edge, host(p.pod.port, ID), '/one', { 'x-access-token': TOKEN })).status, 200);
  await p.envoy.restart();
  const res = await send(p.envoy.endpoints.edgeUrl, host(p.pod.port, ID), '/two', { 'x-access-token': TOKEN });
  assert.equal(res.status, 200);
  assert.equal(res.body, 'pod GET /two');
  await p.envoy.kill('SIGKILL');
  await p.envoy.start();
  assert.equal((await send(p.envoy.endpoints.edgeUrl, host(p.pod.port, ID), '/three', { 'x-access-token': TOKEN })).body, 'pod GET /three');
});

// Without the router's raised HTTP/2 reset limits (grpc-server.ts HTTP2_OPTIONS) the RST run
// fails: measured here, 478 of 20,000 requests got 503 (streams_failed 478) once Node's
// rapid-reset limiter sent GOAWAY; with them, 0. The graceful run proves the other close path.
for (const [mode, total] of [
  ['RST per stream (Envoy default)', 20_000],
  ['graceful close (runtime guard on)', 20_000],
] as const) {
  test(`${total} requests through Envoy, ${mode}, 50 connections: none fails`, async (t) => {
    const p = await plane(t, { gracefulClose: mode.startsWith('graceful') });
    const result = await load(p.edge, host(p.pod.port, ID), {
      total,
      connections: 50,
      headers: { 'x-access-token': TOKEN },
      expect: (r) => r.status === 200 && r.body.startsWith('pod GET /load/'),
    });
    assert.deepEqual({ ok: result.ok, failed: result.failed, failures: Object.fromEntries(result.failures) }, { ok: total, failed: 0, failures: {} });
    const stats = await p.envoy.stats('ext_proc');
    assert.equal(stats.get('http.edge.ext_proc.streams_started'), total);
    assert.deepEqual(await extProcFailures(p.envoy), NO_FAILURES);
    assert.equal(p.pod.seen.length, total, 'every request reached the pod once');
  });
}
