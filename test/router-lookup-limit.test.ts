// Requests for ids the route table lacks make the router ask the worker (GET /v1/sandboxes/{id})
// before answering 404. The probe's L5: 300 unauthenticated requests for random ids cost the
// worker 300 lookups. These pin the bounds: a per-client token bucket (429 past it, the worker not
// asked), the negative cache, single flight per id, and a cap on lookups in flight; all with an
// injected clock. test/dataplane-envoy.test.ts runs the same attack through a real Envoy.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { clientKey, UNKNOWN_CLIENT } from '../src/router/client-address.ts';
import { LookupLimiter } from '../src/router/lookup-limiter.ts';
import { TokenBuckets } from '../src/base/token-buckets.ts';
import { parseRouterConfig } from '../src/router/router-config.ts';
import { RouteTable } from '../src/router/route-table.ts';
import { ConfigError } from '../src/base/flags.ts';
import { exchange, extProcClient, get, headerValue, immediate } from './support/envoy-mimic.ts';
import { DOMAIN, entry, ManualClock, startRouterUnderTest, TOKEN, until } from './support/router-fixture.ts';

const KNOWN = 'loc1kkkkkkkkkkkkkkkk';
const randomId = (i: number): string => `loc1${i.toString(36).padStart(16, 'x')}`;
const host = (id: string): string => `8080-${id}.${DOMAIN}:10000`;
/** What Envoy's connection manager leaves in x-forwarded-for: whatever the client sent, then the peer's address. */
const from = (address: string, spoofed?: string): Record<string, string> => ({ 'x-forwarded-for': spoofed === undefined ? address : `${spoofed},${address}` });

test('token buckets: burst at once, then one per 1/rate; each key its own; the wait until the next token is reported', () => {
  const clock = new ManualClock();
  const buckets = new TokenBuckets({ clock, burst: 3, ratePerS: 2, maxKeys: 10 });
  assert.deepEqual([buckets.take('a'), buckets.take('a'), buckets.take('a')], [0, 0, 0]);
  assert.equal(buckets.take('a'), 500, '2/s: the next token in 500 ms');
  assert.equal(buckets.take('b'), 0, 'another key has its own bucket');
  clock.advance(499);
  assert.equal(buckets.take('a'), 1);
  clock.advance(1);
  assert.equal(buckets.take('a'), 0, 'refilled after 500 ms');
  clock.advance(60_000);
  assert.deepEqual([buckets.take('a'), buckets.take('a'), buckets.take('a'), buckets.take('a') > 0], [0, 0, 0, true], 'never more than burst, however long idle');
});

test('token buckets stay bounded: past maxKeys the least recently seen key is forgotten', () => {
  const clock = new ManualClock();
  const buckets = new TokenBuckets({ clock, burst: 1, ratePerS: 1, maxKeys: 100 });
  for (let i = 0; i < 1000; i++) buckets.take(`10.0.${i >> 8}.${i & 255}`);
  assert.equal(buckets.size, 100);
});

test('lookup limiter: past maxInFlight it refuses as busy without spending the client’s token; past the budget, rate_limited with Retry-After', () => {
  const clock = new ManualClock();
  const limiter = new LookupLimiter({ clock, limits: { burst: 2, ratePerS: 0.5, maxInFlight: 4 } });
  assert.deepEqual(limiter.admit('a', 4), { reason: 'busy', retryAfterS: 1 });
  assert.equal(limiter.admit('a', 3), undefined);
  assert.equal(limiter.admit('a', 0), undefined, 'the busy refusal cost no token: both of the burst are still there');
  assert.deepEqual(limiter.admit('a', 0), { reason: 'rate_limited', retryAfterS: 2 }, '0.5/s: a token in 2 s');
  assert.equal(limiter.admit('b', 0), undefined, 'another client is not affected');
  clock.advance(2_000);
  assert.equal(limiter.admit('a', 0), undefined);
});

test('client key: the address Envoy appended, never one the client sent; on the ingress listener the one before the edge; IPv6 by /64', () => {
  const h = (xff: string | undefined): Map<string, string> => new Map(xff === undefined ? [] : [['x-forwarded-for', xff]]);
  assert.equal(clientKey(h('203.0.113.9'), 'edge'), '203.0.113.9');
  assert.equal(clientKey(new Map([['x-forwarded-for', '1.2.3.4, 5.6.7.8,203.0.113.9'], ['x-envoy-external-address', '9.9.9.9'], ['x-real-ip', '8.8.8.8']]), 'edge'), '203.0.113.9', 'client-sent entries are left of Envoy’s');
  assert.equal(clientKey(h('1.2.3.4,203.0.113.9,10.0.0.5'), 'ingress'), '203.0.113.9', 'ingress: the last hop is the forwarding edge');
  assert.equal(clientKey(h('2001:db8:1:2:3:4:5:6'), 'edge'), '2001:db8:1:2::/64');
  assert.equal(clientKey(h('2001:db8:1:2::ffff'), 'edge'), '2001:db8:1:2::/64', 'one /64, one budget');
  assert.equal(clientKey(h('2001:db8::1'), 'edge'), '2001:db8:0:0::/64');
  assert.equal(clientKey(h('::ffff:203.0.113.9'), 'edge'), '203.0.113.9');
  assert.equal(clientKey(h(undefined), 'edge'), UNKNOWN_CLIENT);
  assert.equal(clientKey(h('not-an-ip'), 'edge'), UNKNOWN_CLIENT);
});

test('negative cache: a confirmed miss is known for its TTL (counted per hit), then forgotten; an upsert of the id clears it at once', () => {
  const clock = new ManualClock();
  const table = new RouteTable({ clock, negativeTtlMs: 5_000 });
  table.rememberMissing(KNOWN);
  assert.equal(table.isKnownMissing(KNOWN), true);
  assert.equal(table.isKnownMissing(KNOWN), true);
  assert.equal(table.knownMissingHits, 2);
  clock.advance(5_001);
  assert.equal(table.isKnownMissing(KNOWN), false, 'expired');
  table.rememberMissing(KNOWN);
  table.setConnected('c1', true);
  table.apply('c1', { type: 'snapshot', version: 1, cluster: 'c1', entries: [entry(KNOWN)] });
  assert.equal(table.isKnownMissing(KNOWN), false, 'created meanwhile: routable at once');
  assert.equal(table.knownMissingHits, 2);
});

test('300 requests for random ids from one client: `burst` lookups reach the worker, the rest are 429 without one; other clients are still looked up and served', async (t) => {
  const clock = new ManualClock();
  const r = await startRouterUnderTest(t, { clock, lookupLimits: { burst: 20, ratePerS: 5 } });
  r.snapshot([entry(KNOWN)]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  const totalLookups = (): number => [...r.worker.lookups.values()].reduce((a, b) => a + b, 0);

  const statuses = new Map<number, number>();
  const refusals: ReturnType<typeof immediate>[] = [];
  let served = 0;
  for (let batch = 0; batch < 15; batch++) {
    // 20 at a time, each with a different spoofed x-forwarded-for: none buys a fresh budget.
    const answers = await Promise.all(
      Array.from({ length: 20 }, (_, i) => exchange(client, get(host(randomId(batch * 20 + i)), '/', from('198.51.100.7', `10.${batch}.${i}.1`)))),
    );
    for (const { answer } of answers) {
      const ir = immediate(answer);
      assert.ok(ir !== undefined, 'refused or not found, never routed');
      statuses.set(ir.status, (statuses.get(ir.status) ?? 0) + 1);
      if (ir.status === 429) refusals.push(ir);
    }
    // Meanwhile another client's request for a running sandbox is routed as ever.
    const known = await exchange(client, get(host(KNOWN), '/', { 'x-access-token': TOKEN, ...from('192.0.2.50') }));
    if (headerValue(known.answer, 'x-asb-dst') === '10.213.0.7:8080') served += 1;
  }
  assert.equal(totalLookups(), 20, 'the worker saw the burst, not 300 lookups');
  assert.deepEqual([...statuses.entries()].sort(), [[404, 20], [429, 280]]);
  assert.equal(served, 15, 'the known sandbox was served between every batch');
  const refusal = refusals[0];
  assert.equal(refusal?.headers['retry-after'], '1', '5/s: a token within a second');
  assert.equal(refusal.body.code, 'TooManyRequests');
  assert.equal(refusal.body.status, 429);

  // Another address has its own budget: its request for a fresh id is still looked up (404).
  const other = await exchange(client, get(host(randomId(9_999)), '/', from('192.0.2.60')));
  assert.equal(immediate(other.answer)?.status, 404);
  assert.equal(totalLookups(), 21);
  // A confirmed miss is answered from the negative cache, even for the limited client.
  const cached = await exchange(client, get(host(randomId(0)), '/', from('198.51.100.7')));
  assert.equal(immediate(cached.answer)?.status, 404);
  assert.equal(totalLookups(), 21);
  // The budget refills with the clock: one second, five more lookups.
  clock.advance(1_000);
  const refilled = await Promise.all(Array.from({ length: 6 }, (_, i) => exchange(client, get(host(randomId(500 + i)), '/', from('198.51.100.7')))));
  assert.deepEqual(refilled.map(({ answer }) => immediate(answer)?.status).sort(), [404, 404, 404, 404, 404, 429]);
  assert.equal(totalLookups(), 26);
  assert.equal(r.lookupResults.filter((x) => x === 'rate_limited').length, 281);
  assert.equal(r.lookupResults.filter((x) => x === 'missing').length, 26);
});

test('concurrent requests for one unknown id make one lookup (single flight) and spend one token', async (t) => {
  const r = await startRouterUnderTest(t, { lookupLimits: { burst: 2, ratePerS: 0.001 } });
  r.snapshot([]);
  let release = (): void => undefined;
  r.worker.holdLookups = new Promise<void>((resolve) => (release = resolve));
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  const id = randomId(1);
  const all = Array.from({ length: 30 }, () => exchange(client, get(host(id), '/', from('198.51.100.8'))));
  await until(() => r.worker.lookups.get(id) === 1, 5_000, 'the lookup at the worker');
  release();
  const answers = await Promise.all(all);
  assert.deepEqual([...new Set(answers.map(({ answer }) => immediate(answer)?.status))], [404]);
  assert.equal(r.worker.lookups.get(id), 1);
  const next = await exchange(client, get(host(randomId(2)), '/', from('198.51.100.8')));
  assert.equal(immediate(next.answer)?.status, 404, 'the second token was still there: 30 requests cost one');
});

test('at most maxInFlight ids are looked up at once across all clients; the next gets 503 at once, the worker not asked', async (t) => {
  const r = await startRouterUnderTest(t, { lookupLimits: { maxInFlight: 3 } });
  r.snapshot([]);
  let release = (): void => undefined;
  r.worker.holdLookups = new Promise<void>((resolve) => (release = resolve));
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  const held = [1, 2, 3].map((i) => exchange(client, get(host(randomId(i)), '/', from(`192.0.2.${i}`))));
  await until(() => r.worker.lookups.size === 3, 5_000, 'three lookups in flight');
  const busy = await exchange(client, get(host(randomId(4)), '/', from('192.0.2.4')));
  assert.equal(immediate(busy.answer)?.status, 503);
  assert.equal(immediate(busy.answer)?.headers['retry-after'], '1');
  assert.equal(r.worker.lookups.has(randomId(4)), false);
  const joined = exchange(client, get(host(randomId(1)), '/', from('192.0.2.4')));
  release();
  assert.equal(immediate((await joined).answer)?.status, 404, 'joining a lookup in flight is never refused');
  for (const h of await Promise.all(held)) assert.equal(immediate(h.answer)?.status, 404);
  const after = await exchange(client, get(host(randomId(4)), '/', from('192.0.2.4')));
  assert.equal(immediate(after.answer)?.status, 404, 'looked up once the others finished');
});

test('--lookup-burst and --lookup-rate (or their variables) set the budget; bad values are all reported at once', () => {
  const base = ['--worker', 'c1=http://127.0.0.1:7080', '--worker-key', 'k'];
  const defaults = parseRouterConfig(base, {});
  assert.deepEqual([defaults.lookupBurst, defaults.lookupRatePerS], [20, 5]);
  const set = parseRouterConfig([...base, '--lookup-burst', '50'], { ASB_ROUTER_LOOKUP_RATE: '0.5' });
  assert.deepEqual([set.lookupBurst, set.lookupRatePerS], [50, 0.5]);
  assert.throws(
    () => parseRouterConfig([...base, '--lookup-burst', '0', '--lookup-rate', 'fast'], {}),
    (err: unknown) => err instanceof ConfigError && err.problems.some((m) => m.includes('--lookup-burst')) && err.problems.some((m) => m.includes('--lookup-rate')),
  );
});
