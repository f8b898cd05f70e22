// Lifecycle events on every surface: one sandbox's life (create, ready, pause, resume, a wake by
// a request, a new timeout, expiry) reads the same on the events API (ours and E2B's), a signed
// webhook on loopback, and kubectl (`describe sandbox`, `get events`); another team sees none of
// it. A receiver killed mid-stream and brought back gets every event (at-least-once: each event
// id arrives, a retry may repeat one), with the failed attempts recorded on the delivery.
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { Counter } from 'prom-client';
import { KeyRing } from '../src/auth/keyring.ts';
import type { LifecycleEvent } from '../src/events/event-log.ts';
import { verify } from '../src/events/signature.ts';
import { freePort } from '../src/assembly/local-system.ts';
import { silentLogger } from '../src/base/log.ts';
import { createPipeline } from '../src/http/pipeline.ts';
import { createRouter } from '../src/http/router.ts';
import { e2bEventRoutes, eventRoutes, type EventsApi } from '../src/worker/routes-events.ts';
import { kubectlFor, serveTls } from './support/kubectl.ts';
import { call, startWorkerFixture, type WorkerFixture } from './support/worker-fixture.ts';
import { waitFor } from './support/wait.ts';

const SECRET = 'whsec-0123456789abcdef';

interface Received {
  event: LifecycleEvent;
  headers: IncomingMessage['headers'];
}

/** A webhook receiver on loopback that checks every signature, as a user's would. */
class Receiver {
  readonly received: Received[] = [];
  readonly badSignatures: string[] = [];
  #server: Server | undefined;
  port = 0;

  async start(port = 0): Promise<void> {
    const server = createServer((req: IncomingMessage, res: ServerResponse) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8');
        const verdict = verify(SECRET, { signature: header(req, 'asb-signature'), timestamp: header(req, 'asb-timestamp') }, body, Math.floor(Date.now() / 1000));
        if (!verdict.ok) {
          this.badSignatures.push(verdict.why);
          res.writeHead(401).end();
          return;
        }
        this.received.push({ event: JSON.parse(body) as LifecycleEvent, headers: req.headers });
        res.writeHead(204).end();
      });
    });
    await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
    this.#server = server;
    this.port = (server.address() as AddressInfo).port;
  }

  /** Down at once: new connections are refused, open ones cut. */
  async stop(): Promise<void> {
    const s = this.#server;
    this.#server = undefined;
    if (s === undefined) return;
    const closed = new Promise<void>((resolve) => s.close(() => resolve()));
    s.closeAllConnections();
    await closed;
  }

  ids(): Set<string> {
    return new Set(this.received.map((r) => r.event.id));
  }
}

function header(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

async function eventsOf(fx: WorkerFixture, id: string, key: string): Promise<LifecycleEvent[]> {
  const res = await call(fx, 'GET', `/v1/events/sandboxes/${id}?orderAsc=true&limit=100`, { key });
  assert.equal(res.status, 200, res.text);
  return res.json as LifecycleEvent[];
}

async function waitForType(fx: WorkerFixture, id: string, type: string, count = 1): Promise<LifecycleEvent[]> {
  return waitFor(`${String(count)} ${type} event(s) of ${id}`, async () => {
    // Events are recorded a moment after the change (with the rest of its burst): until the first is, the sandbox has none (404).
    const res = await call(fx, 'GET', `/v1/events/sandboxes/${id}?orderAsc=true&limit=100`, { key: fx.keys.teamA });
    if (res.status === 404) return undefined;
    const events = res.json as LifecycleEvent[];
    return events.filter((e) => e.type === type).length >= count ? events : undefined;
  }, 20_000);
}

async function setup(t: { after: (fn: () => Promise<void> | void) => void }) {
  // The receiver is on loopback, so the worker runs with --webhook-allow-private (allowPrivate);
  // without it such a URL is refused (events-webhook-private.test.ts).
  const fx = await startWorkerFixture((fn) => t.after(fn), {}, { events: { webhooks: { backoffBaseMs: 50, backoffMaxMs: 400, timeoutMs: 2000, allowPrivate: true } } });
  const receiver = new Receiver();
  await receiver.start();
  t.after(() => receiver.stop());
  return { fx, receiver };
}

async function register(fx: WorkerFixture, receiver: Receiver, path = '/v1/events/webhooks'): Promise<string> {
  const res = await call(fx, 'POST', path, { key: fx.keys.teamA, json: { name: 'ops', url: `http://127.0.0.1:${String(receiver.port)}/hook`, signatureSecret: SECRET } });
  assert.equal(res.status, 201, res.text);
  const hook = res.json as { id: string; signatureSecret?: string };
  assert.equal(hook.signatureSecret, undefined, 'the secret is never shown back');
  return hook.id;
}

async function create(fx: WorkerFixture): Promise<string> {
  const res = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: {} });
  assert.equal(res.status, 201, res.text);
  return (res.json as { id: string }).id;
}

test('one sandbox\'s life reads the same on the events API, a signed webhook and kubectl; another team sees none of it', async (t) => {
  const { fx, receiver } = await setup(t);
  await register(fx, receiver);
  const id = await create(fx);
  await waitForType(fx, id, 'sandbox.lifecycle.ready');
  assert.equal((await call(fx, 'POST', `/v1/sandboxes/${id}/pause`, { key: fx.keys.teamA, json: {} })).status, 200);
  await waitForType(fx, id, 'sandbox.lifecycle.paused');
  assert.equal((await call(fx, 'POST', `/v1/sandboxes/${id}/resume`, { key: fx.keys.teamA, json: {} })).status, 200);
  await waitForType(fx, id, 'sandbox.lifecycle.ready', 2);
  assert.equal((await call(fx, 'POST', `/v1/sandboxes/${id}/pause`, { key: fx.keys.teamA, json: {} })).status, 200);
  await waitForType(fx, id, 'sandbox.lifecycle.paused', 2);
  // The router's wake: the request that reached the hibernated sandbox rides on the resume.
  const woke = await call(fx, 'POST', `/v1/sandboxes/${id}/resume`, { key: fx.keys.admin, json: { wait: false, cause: { host: `8080-${id}.asb.localhost`, path: '/api/run' } } });
  assert.equal(woke.status, 200, woke.text);
  await waitForType(fx, id, 'sandbox.lifecycle.ready', 3);

  // kubectl, while the sandbox is there: describe shows its Events, get events lists them.
  const tls = await serveTls(fx.server.handler, (fn) => t.after(fn));
  const kubectl = kubectlFor(tls.url, tls.caPath, fx.keys.teamA, (fn) => t.after(fn));
  // Kubernetes Events are written a moment after the change (not inside a burst of claims).
  const described = await waitFor('the Events in describe', async () => {
    const out = await kubectl.run(['describe', 'sandbox', id]);
    return /SandboxReady\s+\S+ \(x3 over \S+\)/.test(out) && /SandboxResumed\s+.*woken by a request/.test(out) ? out : undefined;
  }, 20_000);
  const eventLines = described.slice(described.indexOf('Events:'));
  for (const reason of ['SandboxCreated', 'SandboxReady', 'SandboxSuspended', 'SandboxResumed']) assert.match(eventLines, new RegExp(`Normal\\s+${reason}\\s`), described);
  assert.match(eventLines, new RegExp(`SandboxResumed\\s+.*woken by a request to 8080-${id}\\.asb\\.localhost/api/run`));
  // Aggregated as Kubernetes does: the second and third Ready are one Event counted three times.
  assert.match(eventLines, /SandboxReady\s+\S+ \(x3 over \S+\)\s+agent-sandbox-controller/);
  const listed = await kubectl.run(['get', 'events']);
  assert.match(listed, /^LAST SEEN\s+TYPE\s+REASON\s+OBJECT\s+MESSAGE\n/);
  assert.match(listed, new RegExp(`Normal\\s+SandboxSuspended\\s+sandbox/${id}\\s+`));
  // --sort-by sorts the whole Events the table carries (includeObject=Object), oldest first.
  const sorted = (await kubectl.run(['get', 'events', '--sort-by=.lastTimestamp'])).split('\n').filter((l) => l.includes(`sandbox/${id}`));
  assert.ok(sorted.length >= 4, `kubectl get events --sort-by lists the sandbox's Events:\n${sorted.join('\n')}`);
  assert.match(sorted[0] ?? '', /SandboxCreated/);
  const otherKubectl = kubectlFor(tls.url, tls.caPath, fx.keys.teamB, (fn) => t.after(fn));
  assert.doesNotMatch(await otherKubectl.run(['get', 'events', '-A']), new RegExp(id));

  assert.equal((await call(fx, 'POST', `/v1/sandboxes/${id}/timeout`, { key: fx.keys.teamA, json: { timeoutMs: 1 } })).status, 200);
  const events = await waitForType(fx, id, 'sandbox.lifecycle.killed');
  const types = events.map((e) => e.type);
  assert.deepEqual(types, [
    'sandbox.lifecycle.created', 'sandbox.lifecycle.ready',
    'sandbox.lifecycle.paused', 'sandbox.lifecycle.resumed', 'sandbox.lifecycle.ready',
    'sandbox.lifecycle.paused', 'sandbox.lifecycle.resumed', 'sandbox.lifecycle.ready',
    'sandbox.lifecycle.updated', 'sandbox.lifecycle.expired', 'sandbox.lifecycle.killed',
  ]);
  const [firstResume, wake] = events.filter((e) => e.type === 'sandbox.lifecycle.resumed');
  assert.deepEqual(firstResume?.eventData?.trigger, 'api');
  assert.deepEqual(wake?.eventData, { reason: 'SandboxResumed', message: `woken by a request to 8080-${id}.asb.localhost/api/run`, trigger: 'request', host: `8080-${id}.asb.localhost`, path: '/api/run' });
  assert.equal(events[2]?.eventData?.memory, false, 'a pause of a runc sandbox without memory says so');
  for (const e of events) {
    assert.equal(e.sandboxId, id);
    assert.equal(e.sandboxTeamId, 'team-a');
    assert.equal(e.version, 'v1');
  }

  // E2B's path and shape: the newest first by default, limit 10.
  const e2b = await fetch(`${fx.url}/events/sandboxes/${id}`, { headers: { 'x-api-key': fx.keys.teamA } });
  assert.equal(e2b.status, 200);
  const newestFirst = (await e2b.json()) as LifecycleEvent[];
  assert.equal(newestFirst.length, 10);
  assert.equal(newestFirst[0]?.type, 'sandbox.lifecycle.killed');
  const paused = (await (await fetch(`${fx.url}/events/sandboxes/${id}?types=sandbox.lifecycle.paused`, { headers: { 'x-api-key': fx.keys.teamA } })).json()) as LifecycleEvent[];
  assert.deepEqual(paused.map((e) => e.type), ['sandbox.lifecycle.paused', 'sandbox.lifecycle.paused']);

  // The webhook got the same events, each signed (the receiver refuses a bad signature).
  await waitFor('every event delivered', () => Promise.resolve(events.every((e) => receiver.ids().has(e.id)) ? true : undefined), 20_000);
  assert.deepEqual(receiver.badSignatures, []);
  const delivered = [...new Map(receiver.received.map((r) => [r.event.id, r.event])).values()].sort((a, b) => events.findIndex((e) => e.id === a.id) - events.findIndex((e) => e.id === b.id));
  assert.deepEqual(delivered, events);
  const one = receiver.received[0];
  assert.equal(one?.headers['asb-event-id'], one?.event.id);
  assert.equal(one?.headers['asb-event-type'], one?.event.type);

  // Another team: the sandbox's events are a 404 on both APIs, and its team list holds none.
  const other = await call(fx, 'GET', `/v1/events/sandboxes/${id}`, { key: fx.keys.teamB });
  assert.equal(other.status, 404);
  const otherE2b = await fetch(`${fx.url}/events/sandboxes/${id}`, { headers: { 'x-api-key': fx.keys.teamB } });
  assert.equal(otherE2b.status, 404);
  assert.equal(((await otherE2b.json()) as { code: number }).code, 404);
  assert.deepEqual((await call(fx, 'GET', '/v1/events/sandboxes', { key: fx.keys.teamB })).json, []);
});

test('a receiver killed mid-stream and brought back gets every event; the failed attempts are recorded, and the API never waits on it', async (t) => {
  const { fx, receiver } = await setup(t);
  const hook = await register(fx, receiver, '/events/webhooks');
  const id = await create(fx);
  await waitForType(fx, id, 'sandbox.lifecycle.ready');
  await waitFor('the first events delivered', () => Promise.resolve(receiver.ids().size >= 2 ? true : undefined), 20_000);
  const port = receiver.port;
  await receiver.stop();

  // While it is down, the sandbox goes on living; each call answers as usual.
  assert.equal((await call(fx, 'POST', `/v1/sandboxes/${id}/pause`, { key: fx.keys.teamA, json: {} })).status, 200);
  await waitForType(fx, id, 'sandbox.lifecycle.paused');
  assert.equal((await call(fx, 'POST', `/v1/sandboxes/${id}/resume`, { key: fx.keys.teamA, json: {} })).status, 200);
  await waitForType(fx, id, 'sandbox.lifecycle.ready', 2);
  // The failures are on record before the receiver comes back.
  await waitFor('a failed attempt recorded', async () => {
    const list = (await call(fx, 'GET', `/v1/events/webhooks/${hook}/deliveries`, { key: fx.keys.teamA })).json as { state: string; attempts: { error?: string }[] }[];
    return list.some((d) => d.state === 'pending' && d.attempts.length >= 2 && d.attempts.every((a) => a.error !== undefined)) ? true : undefined;
  }, 20_000);

  await receiver.start(port);
  const events = await eventsOf(fx, id, fx.keys.teamA);
  assert.equal(events.length, 5);
  await waitFor('every event delivered after the receiver came back', () => Promise.resolve(events.every((e) => receiver.ids().has(e.id)) ? true : undefined), 30_000);
  assert.deepEqual(receiver.badSignatures, []);
  const deliveries = (await call(fx, 'GET', `/v1/events/webhooks/${hook}/deliveries`, { key: fx.keys.teamA })).json as { eventId: string; state: string; attempts: { status?: number; error?: string }[] }[];
  assert.deepEqual(deliveries.map((d) => d.eventId), events.map((e) => e.id));
  assert.ok(deliveries.every((d) => d.state === 'delivered'), JSON.stringify(deliveries));
  const retried = deliveries.filter((d) => d.attempts.length > 1);
  assert.ok(retried.length >= 3, 'the events made while it was down were retried');
  for (const d of retried) {
    assert.equal(d.attempts.at(-1)?.status, 204);
    assert.match(d.attempts[0]?.error ?? '', /fetch failed|ECONNREFUSED/);
  }
  // The retry header counts attempts; /metrics counts them by outcome.
  assert.ok(receiver.received.some((r) => Number(r.headers['asb-delivery-attempt']) > 1));
  const metrics = (await call(fx, 'GET', '/metrics', { key: fx.keys.admin })).text;
  assert.match(metrics, /asb_webhook_attempts_total\{outcome="retried"\} [1-9]/);
  assert.match(metrics, /asb_webhook_attempts_total\{outcome="delivered"\} [1-9]/);
  assert.match(metrics, /asb_lifecycle_events_total\{type="sandbox\.lifecycle\.paused"\} 1\n/);
  assert.match(metrics, /asb_kube_events_total\{result="ok"\} [1-9]/);
  // Another team cannot see the webhook or its deliveries.
  assert.equal((await call(fx, 'GET', `/v1/events/webhooks/${hook}/deliveries`, { key: fx.keys.teamB })).status, 404);
  assert.equal((await call(fx, 'GET', `/v1/events/webhooks/${hook}`, { key: fx.keys.teamB })).status, 404);
  assert.equal((await call(fx, 'DELETE', `/v1/events/webhooks/${hook}`, { key: fx.keys.teamB })).status, 404);
});

test('bad webhook input is a 422 naming the field, and registers nothing', async (t) => {
  const { fx } = await setup(t);
  const bad = async (json: unknown, field: string, path = '/v1/events/webhooks'): Promise<void> => {
    const res = await call(fx, 'POST', path, { key: fx.keys.teamA, json });
    assert.equal(res.status, 422, res.text);
    assert.match(res.text, new RegExp(field));
  };
  await bad({ url: 'http://127.0.0.1:9/hook' }, 'signatureSecret: is required');
  await bad({ signatureSecret: SECRET }, 'url: is required');
  await bad({ url: 'ftp://example.com/hook', signatureSecret: SECRET }, 'url: scheme ftp: is not supported');
  await bad({ url: 'not a url', signatureSecret: SECRET }, 'url: \\\\"not a url\\\\" is not an absolute URL');
  await bad({ url: 'http://127.0.0.1:9/hook', signatureSecret: 'short' }, 'signatureSecret: must be a string of 16');
  await bad({ url: 'http://127.0.0.1:9/hook', signatureSecret: SECRET, events: ['sandbox.lifecycle.exploded'] }, 'events: unknown event type');
  await bad({ url: 'http://127.0.0.1:9/hook', signatureSecret: SECRET, colour: 'red' }, 'colour: unknown field');
  const e2b = await fetch(`${fx.url}/events/webhooks`, { method: 'POST', headers: { 'x-api-key': fx.keys.teamA, 'content-type': 'application/json' }, body: JSON.stringify({ url: 'http://127.0.0.1:9/hook' }) });
  // E2B's API answers bad input with 400 and {code, message}, as E2B's own does.
  assert.equal(e2b.status, 400);
  assert.match(((await e2b.json()) as { message: string }).message, /signatureSecret: is required/);
  assert.deepEqual((await call(fx, 'GET', '/v1/events/webhooks', { key: fx.keys.teamA })).json, []);
  const badQuery = await call(fx, 'GET', '/v1/events/sandboxes?limit=1000', { key: fx.keys.teamA });
  assert.equal(badQuery.status, 400);
  assert.match(badQuery.text, /limit/);
});

test('kubectl describe shows Events on SandboxClaims and SandboxWarmPools too: a claim bound, a pool\'s members made', async (t) => {
  const { fx } = await setup(t);
  const tls = await serveTls(fx.server.handler, (fn) => t.after(fn));
  const kubectl = kubectlFor(tls.url, tls.caPath, fx.keys.admin, (fn) => t.after(fn));
  const seed = (name: string): string => new URL(`./fixtures/seeds/${name}`, import.meta.url).pathname;
  await kubectl.run(['apply', '-f', seed('sandboxtemplate.yaml'), '-f', seed('sandboxwarmpool.yaml')]);
  await kubectl.run(['apply', '-f', seed('sandboxclaim-v1beta1.yaml')]);
  await kubectl.run(['wait', '--for=condition=Ready', '--timeout=60s', 'sandboxclaim/my-secure-sandbox']);
  const claim = await waitFor('the claim\'s Event', async () => {
    const out = await kubectl.run(['describe', 'sandboxclaim', 'my-secure-sandbox']);
    return /SandboxClaimed/.test(out) ? out : undefined;
  }, 20_000);
  assert.match(claim.slice(claim.indexOf('Events:')), /Normal\s+SandboxClaimed\s+\S+\s+agent-sandbox-controller\s+bound sandbox \S+ \((warm|cold) start\)/);
  const pool = await waitFor('the pool\'s Events', async () => {
    const out = await kubectl.run(['describe', 'swp', 'sandboxwarmpool-example']);
    return /SandboxCreated/.test(out) ? out : undefined;
  }, 20_000);
  assert.match(pool.slice(pool.indexOf('Events:')), /Normal\s+SandboxCreated\s+\S+\s+agent-sandbox-controller\s+created warm sandbox \S+/);
});

/**
 * An API process in front (--role=api --events-url): the events routes of a second server, with
 * its own key check over the same keys, pass every request on to the worker that keeps the log,
 * as the API pods of clusters/base do to the operator.
 */
async function apiFront(t: { after: (fn: () => Promise<void> | void) => void }, fx: WorkerFixture, forwardTo: string): Promise<{ url: string }> {
  const auth = await KeyRing.open({ store: fx.store, log: silentLogger() });
  t.after(() => auth.close());
  const events: EventsApi = { source: { forwardTo }, jsonBytes: 1 << 20, webhookAllowPrivate: false };
  const handler = createPipeline({ router: createRouter([...eventRoutes(events), ...e2bEventRoutes(events, auth)]), auth, log: silentLogger(), requests: new Counter({ name: 'front_requests_total', help: 'x', labelNames: ['route', 'code'], registers: [] }), server: 'the worker', realm: 'asb' });
  const server = createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return { url: `http://127.0.0.1:${String((server.address() as AddressInfo).port)}` };
}

test('an API process passes the events API on to the process that keeps the log: the same answers in both shapes, webhooks registered there, 503 naming it when it is down', async (t) => {
  const { fx, receiver } = await setup(t);
  const front = await apiFront(t, fx, fx.url);
  const id = await create(fx);
  await waitForType(fx, id, 'sandbox.lifecycle.ready');

  const direct = await call(fx, 'GET', `/v1/events/sandboxes/${id}?orderAsc=true&types=sandbox.lifecycle.created`, { key: fx.keys.teamA });
  const passed = await call(front, 'GET', `/v1/events/sandboxes/${id}?orderAsc=true&types=sandbox.lifecycle.created`, { key: fx.keys.teamA });
  assert.equal(passed.status, 200, passed.text);
  assert.deepEqual(passed.json, direct.json, 'the query went with the request');
  assert.deepEqual((passed.json as LifecycleEvent[]).map((e) => e.type), ['sandbox.lifecycle.created']);
  const e2b = await fetch(`${front.url}/events/sandboxes/${id}`, { headers: { 'x-api-key': fx.keys.teamA } });
  assert.equal(e2b.status, 200);
  assert.equal(((await e2b.json()) as LifecycleEvent[])[0]?.sandboxId, id);

  // The team is the caller's key's, at the log too: another team gets E2B's 404 and our 404.
  const otherE2b = await fetch(`${front.url}/events/sandboxes/${id}`, { headers: { 'x-api-key': fx.keys.teamB } });
  assert.equal(otherE2b.status, 404);
  assert.equal(((await otherE2b.json()) as { code: number }).code, 404);
  assert.equal((await call(front, 'GET', `/v1/events/sandboxes/${id}`, { key: fx.keys.teamB })).status, 404);
  assert.equal((await call(front, 'GET', `/v1/events/sandboxes/${id}`, {})).status, 401, 'no key: refused at the front');

  // A webhook registered at the front is the log's (the body went along); bad input is its 422.
  const hook = await call(front, 'POST', '/v1/events/webhooks', { key: fx.keys.teamA, json: { name: 'via-front', url: `http://127.0.0.1:${String(receiver.port)}/hook`, signatureSecret: SECRET } });
  assert.equal(hook.status, 201, hook.text);
  const hookId = (hook.json as { id: string }).id;
  assert.deepEqual(((await call(fx, 'GET', '/v1/events/webhooks', { key: fx.keys.teamA })).json as { id: string }[]).map((h) => h.id), [hookId]);
  const bad = await call(front, 'POST', '/v1/events/webhooks', { key: fx.keys.teamA, json: { url: 'http://127.0.0.1:9/hook' } });
  assert.equal(bad.status, 422, bad.text);
  assert.match(bad.text, /signatureSecret: is required/);
  assert.equal((await call(front, 'DELETE', `/v1/events/webhooks/${hookId}`, { key: fx.keys.teamA })).status, 204);
  assert.deepEqual((await call(fx, 'GET', '/v1/events/webhooks', { key: fx.keys.teamA })).json, []);

  // The log's process away: 503 on both surfaces, naming where it was looked for.
  const closed = `http://127.0.0.1:${String(await freePort())}`;
  const away = await apiFront(t, fx, closed);
  const down = await call(away, 'GET', `/v1/events/sandboxes/${id}`, { key: fx.keys.teamA });
  assert.equal(down.status, 503, down.text);
  assert.match(down.text, new RegExp(`operator that keeps this cluster's lifecycle events \\(${closed.replaceAll('.', '\\.')}\\) did not answer`));
  const downE2b = await fetch(`${away.url}/events/webhooks`, { headers: { 'x-api-key': fx.keys.teamA } });
  assert.equal(downE2b.status, 503);
  assert.match(((await downE2b.json()) as { message: string }).message, /did not answer/);
});
