// The router's own /metrics (--metrics-listen): what Prometheus scrapes for the data-plane
// dashboard, behind the admin key the router holds, and a clear refusal of a bad address.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConfigError } from '../src/base/flags.ts';
import { silentLogger } from '../src/base/log.ts';
import { parseRouterConfig } from '../src/router/router-config.ts';
import { startRouter } from '../src/router/start-router.ts';

const KEY = 'asb_abcdefgh_0123456789abcdef0123456789abcdef';
// A worker that is not there: the feed retries in the background; /metrics does not need it.
const BASE = ['--listen', '127.0.0.1:0', '--worker', 'c1=http://127.0.0.1:9', '--worker-key', KEY];

test('the router serves its metrics on --metrics-listen to the admin key only', async (t) => {
  const router = await startRouter(parseRouterConfig([...BASE, '--metrics-listen', '127.0.0.1:0'], {}), { log: silentLogger() });
  t.after(() => router.close());
  assert.ok(router.metricsAddress !== undefined);
  const url = `http://${router.metricsAddress}/metrics`;
  assert.equal((await fetch(url)).status, 401, 'no key');
  const wrong = await fetch(url, { headers: { authorization: 'Bearer asb_abcdefgh_ffffffffffffffffffffffffffffffff' } });
  assert.equal(wrong.status, 401, 'another key');
  assert.match(wrong.headers.get('www-authenticate') ?? '', /^Bearer/);
  const res = await fetch(url, { headers: { authorization: `Bearer ${KEY}` } });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type') ?? '', /^text\/plain; version=0\.0\.4/);
  const text = await res.text();
  for (const name of ['asb_router_routes', 'asb_router_held_requests', 'asb_router_requests_total', 'asb_router_hold_seconds']) assert.match(text, new RegExp(`^# TYPE ${name} `, 'm'), name);
  assert.equal((await fetch(`http://${router.metricsAddress}/other`, { headers: { authorization: `Bearer ${KEY}` } })).status, 404);
});

test('no --metrics-listen, no listener; a bad one is refused naming the flag', () => {
  assert.equal(parseRouterConfig(BASE, {}).metricsListen, undefined);
  assert.equal(parseRouterConfig(BASE, { ASB_ROUTER_METRICS_LISTEN: '0.0.0.0:9003' }).metricsListen, '0.0.0.0:9003');
  assert.throws(() => parseRouterConfig([...BASE, '--metrics-listen', '9003'], {}), (err: unknown) => err instanceof ConfigError && /--metrics-listen \(ASB_ROUTER_METRICS_LISTEN\) must be host:port, got "9003"/.test(err.message));
});

test('the router serves its metrics on a bracketed IPv6 --metrics-listen', async (t) => {
  const router = await startRouter(parseRouterConfig([...BASE, '--metrics-listen', '[::1]:0'], {}), { log: silentLogger() });
  t.after(() => router.close());
  assert.match(router.metricsAddress ?? '', /^\[::1\]:\d+$/);
  const res = await fetch(`http://${router.metricsAddress ?? ''}/metrics`, { headers: { authorization: `Bearer ${KEY}` } });
  assert.equal(res.status, 200);
  assert.match(await res.text(), /^# TYPE asb_router_routes /m);
});

test("the router's metrics listener answers refusals as problem+json, as the APIs do, and counts them", async (t) => {
  const router = await startRouter(parseRouterConfig([...BASE, '--metrics-listen', '127.0.0.1:0'], {}), { log: silentLogger() });
  t.after(() => router.close());
  const base = `http://${router.metricsAddress ?? ''}`;
  const refused = await fetch(`${base}/metrics`);
  assert.equal(refused.status, 401);
  assert.equal(refused.headers.get('content-type'), 'application/problem+json');
  assert.equal(((await refused.json()) as { code?: string }).code, 'Unauthorized');
  const post = await fetch(`${base}/metrics`, { method: 'POST', headers: { authorization: `Bearer ${KEY}` } });
  assert.equal(post.status, 405);
  assert.equal(post.headers.get('allow'), 'GET');
  assert.equal(((await post.json()) as { code?: string }).code, 'MethodNotAllowed');
  const text = await (await fetch(`${base}/metrics`, { headers: { authorization: `Bearer ${KEY}` } })).text();
  assert.match(text, /^asb_router_http_requests_total\{route="\/metrics",code="401"\} 1$/m);
  assert.match(text, /^asb_router_http_requests_total\{route="\/metrics",code="405"\} 1$/m);
});
