// Regression: a request held for a wake was released as soon as the pod ran, before its server
// listened, and got Envoy's 503. The router now waits for the port to accept a connection.
// PortWaiter alone (manual clock, fake connector), then through the ext_proc server.
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:net';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { isAsbError } from '../src/errors.ts';
import { PortWaiter, tcpConnector } from '../src/router/port-wait.ts';
import { exchange, extProcClient, get, headerValue, immediate } from './support/envoy-mimic.ts';
import { DOMAIN, entry, fakePorts, ManualClock, startRouterUnderTest, TOKEN, until } from './support/router-fixture.ts';

const ID = 'loc1aaaaaaaaaaaaaaaa';
const HOST = (port: number): string => `${port}-${ID}.${DOMAIN}`;
const POD = '10.213.0.9';

/** Lets the fake connector's answers (one setImmediate each) and the promise chains after them run. */
async function settle(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
}

test('PortWaiter: resolves at the first accepted connect, retrying every retryMs until then; one probe loop for all waiters of a pod:port', async () => {
  const clock = new ManualClock();
  const ports = fakePorts();
  ports.closed.add(`${POD}:8000`);
  const waiter = new PortWaiter({ clock, connect: ports.connect, retryMs: 25 });
  const released: number[] = [];
  const waits = [1, 2, 3].map((n) => waiter.untilListening(POD, 8000, 25_000, new AbortController().signal, 'sandbox x').then(() => released.push(n)));
  await settle();
  assert.deepEqual(ports.attempts, [`${POD}:8000`], 'three waiters, one connect');
  for (let i = 0; i < 4; i++) {
    clock.advance(25);
    await settle();
  }
  assert.equal(ports.attempts.length, 5, 'one attempt per 25 ms while refused');
  assert.deepEqual(released, [], 'nobody released while the port refuses');
  ports.closed.clear();
  clock.advance(25);
  await Promise.all(waits);
  assert.deepEqual(released, [1, 2, 3]);
  assert.equal(waiter.probing, 0, 'the loop ended with its waiters');
  clock.advance(1_000);
  await settle();
  assert.equal(ports.attempts.length, 6, 'no connect after the port answered');
});

test('PortWaiter: past the limit the waiter gets Unavailable naming the port; a request that goes away leaves; the loop stops with the last waiter', async () => {
  const clock = new ManualClock();
  const ports = fakePorts();
  ports.closed.add(`${POD}:8000`);
  const waiter = new PortWaiter({ clock, connect: ports.connect, retryMs: 25 });
  const gone = new AbortController();
  const short = waiter.untilListening(POD, 8000, 100, new AbortController().signal, 'sandbox x is running');
  const leaving = waiter.untilListening(POD, 8000, 25_000, gone.signal, 'sandbox x is running');
  await settle();
  clock.advance(25);
  await settle();
  clock.advance(75);
  await assert.rejects(short, (err: unknown) => isAsbError(err, 'Unavailable') && /port 8000/.test(err.message));
  assert.equal(waiter.probing, 1, 'the other waiter keeps the loop');
  gone.abort(new Error('client went away'));
  await assert.rejects(leaving, /client went away/);
  assert.equal(waiter.probing, 0);
  const attempts = ports.attempts.length;
  clock.advance(10_000);
  await settle();
  assert.equal(ports.attempts.length, attempts, 'no connect once nobody waits');
});

test('tcpConnector: true once a real server accepts, false when refused', async (t) => {
  const server: Server = createServer((s) => s.destroy());
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  t.after(() => server.close());
  assert.equal(await tcpConnector('127.0.0.1', port), true);
  server.close();
  await new Promise((r) => server.once('close', r));
  assert.equal(await tcpConnector('127.0.0.1', port), false);
});

for (const listener of [undefined, 'ingress'] as const) {
  test(`a request held for a wake is answered only once the woken pod's port accepts connections (${listener ?? 'edge'} listener)`, async (t) => {
    const clock = new ManualClock();
    const r = await startRouterUnderTest(t, { clock });
    r.snapshot([entry(ID, { state: 'hibernated', podIp: undefined })]);
    r.ports.closed.add(`${POD}:8000`);
    r.worker.onResume = (id) => setTimeout(() => r.upsert(entry(id, { podIp: POD })), 10);
    const client = extProcClient(r.server.address);
    t.after(() => client.close());
    let answered = false;
    const held = Promise.all([1, 2].map(() => exchange(client, get(HOST(8000), '/', { 'x-access-token': TOKEN }), 'rst', [], listener))).finally(() => (answered = true));
    await until(() => r.ports.attempts.length >= 1, 5_000, 'the first connect to the woken pod');
    // The retry timer is set once the refused connect's answer came back: step the clock until it ran.
    await until(() => (clock.advance(25), r.ports.attempts.length >= 2), 5_000, 'a second connect after 25 ms');
    assert.equal(answered, false, 'running is not listening: still held');
    r.ports.closed.clear();
    await until(() => (clock.advance(25), answered), 5_000, 'the answers once the port accepts');
    for (const { answer } of await held) assert.equal(headerValue(answer, 'x-asb-dst'), `${POD}:8000`);
    assert.ok(r.ports.attempts.every((a) => a === `${POD}:8000`));
    assert.ok(r.ports.attempts.length <= 3, `two held requests share the probe (${r.ports.attempts.length} connects)`);

    // The hot path: a request to a sandbox already running connects to nothing.
    const before = r.ports.attempts.length;
    r.ports.closed.add(`${POD}:8000`);
    const routed = await exchange(client, get(HOST(8000), '/', { 'x-access-token': TOKEN }), 'rst', [], listener);
    assert.equal(headerValue(routed.answer, 'x-asb-dst'), `${POD}:8000`);
    assert.equal(r.ports.attempts.length, before);
  });
}

test('a woken pod whose port never opens: 503 with Retry-After at the hold limit, naming the port', async (t) => {
  const clock = new ManualClock();
  const r = await startRouterUnderTest(t, { clock, holdLimitMs: 25_000 });
  r.snapshot([entry(ID, { state: 'hibernated', podIp: undefined })]);
  r.ports.closed.add(`${POD}:8000`);
  r.worker.onResume = (id) => setTimeout(() => r.upsert(entry(id, { podIp: POD })), 10);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  const held = exchange(client, get(HOST(8000), '/', { 'x-access-token': TOKEN }));
  await until(() => r.ports.attempts.length >= 1, 5_000, 'the first connect');
  clock.advance(25_000);
  const { answer } = await held;
  assert.equal(immediate(answer)?.status, 503);
  assert.equal(immediate(answer)?.headers['retry-after'], '2');
  assert.match(String(immediate(answer)?.body.message), /port 8000/);
});
