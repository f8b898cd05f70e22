// Webhooks reach public addresses only, unless the worker runs with --webhook-allow-private: a
// team cannot point one at loopback (the worker's own admin API), a private range or the cloud
// metadata endpoint and read back the status (a request forgery, a port scanner). A URL naming
// such an address or localhost is a 422 at registration; a name that resolves to one is refused
// at delivery, the address checked being the one connected to, with the reason recorded on the
// delivery; with the flag the same name is delivered to.
import assert from 'node:assert/strict';
import { lookup, type LookupAddress, type LookupAllOptions } from 'node:dns';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { hostname } from 'node:os';
import { test } from 'node:test';
import type { Delivery } from '../src/events/event-log.ts';
import { PrivateAddressError, privateHostProblem, publicOnlyLookup } from '../src/events/webhook-target.ts';
import { isPrivateAddress } from '../src/network/egress-policy.ts';
import { call, startWorkerFixture, type WorkerFixture } from './support/worker-fixture.ts';
import { waitFor } from './support/wait.ts';

const SECRET = 'whsec-0123456789abcdef';
const FLAG = /--webhook-allow-private \(ASB_WEBHOOK_ALLOW_PRIVATE\)/;

/** A receiver on loopback counting what reaches it. */
async function receiver(t: { after: (fn: () => Promise<void>) => void }): Promise<{ port: number; hits: () => number }> {
  let hits = 0;
  const server: Server = createServer((req, res) => {
    hits++;
    req.resume();
    res.writeHead(204).end();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return { port: (server.address() as AddressInfo).port, hits: () => hits };
}

/** This machine's own name, which the system resolver (/etc/hosts) answers with a private address: loopback here, 127.0.1.1 on Debian, the container's address in one. */
async function ownNameResolvingPrivate(): Promise<{ name: string; addresses: string[] }> {
  const name = hostname();
  const answers = await new Promise<LookupAddress[]>((resolve, reject) => lookup(name, { all: true }, (err, a) => (err === null ? resolve(a) : reject(err))));
  const addresses = answers.map((a) => a.address);
  assert.ok(addresses.length > 0 && addresses.every((a) => isPrivateAddress(a)), `${name} resolves to private addresses only (got ${addresses.join(', ')})`);
  return { name, addresses };
}

async function createSandbox(fx: WorkerFixture): Promise<void> {
  const res = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: {} });
  assert.equal(res.status, 201, res.text);
}

test('without --webhook-allow-private a webhook URL naming loopback, a private range, link-local or localhost is a 422 naming url, why and the flag; nothing is registered or changed', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn), {}, { events: {} });
  const refused = [
    'http://127.0.0.1:7080/v1/sandboxes',
    'http://127.1/',
    'http://0x7f000001/',
    'http://0.0.0.0:7080/',
    'http://[::1]:7080/',
    'http://[::ffff:127.0.0.1]/',
    'http://169.254.169.254/latest/meta-data/',
    'http://10.1.2.3/hook',
    'http://192.168.1.1/hook',
    'http://[fd00::1]/hook',
    'http://localhost:7080/',
    'http://LOCALHOST./',
    'https://admin.localhost/hook',
  ];
  for (const url of refused) {
    const res = await call(fx, 'POST', '/v1/events/webhooks', { key: fx.keys.teamA, json: { url, signatureSecret: SECRET } });
    assert.equal(res.status, 422, `${url}: ${res.text}`);
    const body = res.json as { detail: string; fields?: { field: string; message: string }[] };
    const problem = body.fields?.find((f) => f.field === 'url');
    assert.ok(problem !== undefined, `${url}: names the url field: ${res.text}`);
    assert.match(problem.message, /(private, loopback or link-local address|loopback host)/, url);
    assert.match(problem.message, FLAG, url);
  }
  // E2B's route refuses it the same way, as a 400.
  const e2b = await call(fx, 'POST', '/events/webhooks', { headers: { 'x-api-key': fx.keys.teamA }, json: { url: 'http://169.254.169.254/', signatureSecret: SECRET } });
  assert.equal(e2b.status, 400, e2b.text);
  assert.match(e2b.text, /url: 169\.254\.169\.254 is a private/);
  assert.deepEqual((await call(fx, 'GET', '/v1/events/webhooks', { key: fx.keys.teamA })).json, [], 'nothing was registered');

  // Public addresses and names register; a PATCH to a private one is refused and changes nothing.
  for (const url of ['https://hooks.example.com/asb', 'http://203.0.113.7:8080/hook', 'http://[2001:db8::7]/hook']) {
    const ok = await call(fx, 'POST', '/v1/events/webhooks', { key: fx.keys.teamA, json: { url, signatureSecret: SECRET, enabled: false } });
    assert.equal(ok.status, 201, `${url}: ${ok.text}`);
  }
  const hooks = (await call(fx, 'GET', '/v1/events/webhooks', { key: fx.keys.teamA })).json as { id: string; url: string }[];
  const first = hooks.find((h) => h.url === 'https://hooks.example.com/asb');
  assert.ok(first !== undefined);
  const patch = await call(fx, 'PATCH', `/v1/events/webhooks/${first.id}`, { key: fx.keys.teamA, json: { url: 'http://127.0.0.1:7080/', enabled: true } });
  assert.equal(patch.status, 422, patch.text);
  assert.match(patch.text, FLAG);
  assert.deepEqual((await call(fx, 'GET', `/v1/events/webhooks/${first.id}`, { key: fx.keys.teamA })).json, { ...first, enabled: false });
});

test('without --webhook-allow-private a name that resolves to a private address is refused at delivery, naming the address and the flag, and retried; nothing reaches the receiver', async (t) => {
  const { name, addresses } = await ownNameResolvingPrivate();
  const rx = await receiver(t);
  const fx = await startWorkerFixture((fn) => t.after(fn), {}, { events: { webhooks: { backoffBaseMs: 50, backoffMaxMs: 100, timeoutMs: 2000 } } });
  const reg = await call(fx, 'POST', '/v1/events/webhooks', { key: fx.keys.teamA, json: { url: `http://${name}:${String(rx.port)}/hook`, signatureSecret: SECRET, events: ['sandbox.lifecycle.created'] } });
  assert.equal(reg.status, 201, `a name is not resolved at registration: ${reg.text}`);
  const hook = (reg.json as { id: string }).id;
  await createSandbox(fx);
  const delivery = await waitFor('two refused attempts recorded', async () => {
    const list = (await call(fx, 'GET', `/v1/events/webhooks/${hook}/deliveries`, { key: fx.keys.teamA })).json as Delivery[];
    const d = list[0];
    return d !== undefined && d.attempts.length >= 2 ? d : undefined;
  }, 20_000);
  assert.equal(delivery.state, 'pending', 'a refused delivery is retried like any failure');
  for (const attempt of delivery.attempts) {
    assert.equal(attempt.status, undefined, 'no answer: nothing was connected to');
    assert.match(attempt.error ?? '', new RegExp(`^refused: ${name} resolves to ${addresses.join(', ').replaceAll('.', '\\.')}, no public address; `));
    assert.match(attempt.error ?? '', FLAG);
  }
  assert.equal(rx.hits(), 0, 'the receiver on loopback was never reached');
});

test('with --webhook-allow-private the same name and a loopback URL are registered and delivered to', async (t) => {
  const { name, addresses } = await ownNameResolvingPrivate();
  if (!addresses.includes('127.0.0.1')) assert.fail(`${name} resolves to ${addresses.join(', ')}, not 127.0.0.1 where the receiver listens`);
  const rx = await receiver(t);
  const fx = await startWorkerFixture((fn) => t.after(fn), {}, { events: { webhooks: { backoffBaseMs: 50, backoffMaxMs: 100, timeoutMs: 2000, allowPrivate: true } } });
  for (const url of [`http://${name}:${String(rx.port)}/hook`, `http://127.0.0.1:${String(rx.port)}/hook`]) {
    const reg = await call(fx, 'POST', '/v1/events/webhooks', { key: fx.keys.teamA, json: { url, signatureSecret: SECRET, events: ['sandbox.lifecycle.created'] } });
    assert.equal(reg.status, 201, reg.text);
  }
  await createSandbox(fx);
  await waitFor('both webhooks delivered to', () => Promise.resolve(rx.hits() >= 2 ? true : undefined), 20_000);
});

test('the delivery lookup answers only public addresses: private ones are dropped, a name with none is refused, and each connection asks again (a rebinding is caught)', async () => {
  const answers: LookupAddress[][] = [
    [{ address: '203.0.113.9', family: 4 }, { address: '127.0.0.1', family: 4 }, { address: '2001:db8::9', family: 6 }, { address: '::1', family: 6 }],
    [{ address: '169.254.169.254', family: 4 }, { address: '::ffff:10.0.0.1', family: 6 }],
  ];
  const resolve = (_name: string, _options: LookupAllOptions, cb: (err: NodeJS.ErrnoException | null, a: LookupAddress[]) => void): void => cb(null, answers.shift() ?? []);
  const guarded = publicOnlyLookup(resolve);
  const ask = (all: boolean) => new Promise<{ err: Error | null; address: unknown; family: unknown }>((done) => guarded('rebind.example', { all }, (err, address, family) => done({ err, address, family })));
  // First answer: public and private mixed, asked for all (as net.connect does): the public ones only.
  assert.deepEqual(await ask(true), { err: null, address: [{ address: '203.0.113.9', family: 4 }, { address: '2001:db8::9', family: 6 }], family: undefined });
  // The same name now rebound to the metadata endpoint and a mapped private address: refused.
  const rebound = await ask(false);
  assert.ok(rebound.err instanceof PrivateAddressError);
  assert.equal(rebound.err.message, 'refused: rebind.example resolves to 169.254.169.254, ::ffff:10.0.0.1, no public address; webhooks are delivered to public addresses only unless the worker runs with --webhook-allow-private (ASB_WEBHOOK_ALLOW_PRIVATE)');
  // Registration names no problem for a public literal or a name it does not resolve.
  for (const url of ['http://203.0.113.9/', 'http://[2001:db8::1]/', 'https://example.com/', 'http://localhost.example.com/']) assert.equal(privateHostProblem(new URL(url)), undefined, url);
});
