// Cross-cluster routing in the router: the cluster registry built from the feeds' clusters
// messages, decide() for sandboxes of other clusters on the edge and ingress listeners, creates
// and lists to the hub, DNS-named ingresses, and the same through the real ext_proc server with
// the listener metadata Envoy sets, and through a real worker's route feed.
import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { Metadata } from '@grpc/grpc-js';
import { Registry } from 'prom-client';
import { ClusterType, type Cluster } from '../src/api/hub-contract.ts';
import { ActivityReporter } from '../src/router/activity.ts';
import type { ClusterRoute, ClustersMessage, RouteEntry } from '../src/router/contract.ts';
import { decide, type DecideContext, type Decision, type Listener } from '../src/router/decide.ts';
import { ExtProcServer } from '../src/router/extproc-server.ts';
import { FeedClient } from '../src/router/feed-client.ts';
import type { ProcessingRequest, ProcessingResponse } from '../src/router/proto.ts';
import { ClusterRegistry, INGRESS_REFRESH_MS } from '../src/router/registry.ts';
import { parseRouterConfig } from '../src/router/router-config.ts';
import { createRouterMetrics } from '../src/router/router-metrics.ts';
import { RouteTable } from '../src/router/route-table.ts';
import { PortWaiter } from '../src/router/port-wait.ts';
import { Waker } from '../src/router/waker.ts';
import { ConfigError } from '../src/base/flags.ts';
import { systemClock } from '../src/base/clock.ts';
import { silentLogger } from '../src/base/log.ts';
import { extProcClient, get, headerValue, immediate, requestHeaders } from './support/envoy-mimic.ts';
import { CLUSTER, DOMAIN, entry, fakePorts, ManualClock, startFakeWorker, TOKEN, until } from './support/router-fixture.ts';
import { startWorkerFixture } from './support/worker-fixture.ts';

const LOCAL_ID = 'loc1aaaaaaaaaaaaaaaa';
const FAR_ID = 'far2aaaaaaaaaaaaaaaa';
const V6_ID = 'far3aaaaaaaaaaaaaaaa';
const BARE_ID = 'far4aaaaaaaaaaaaaaaa';
const DNS_ID = 'far5aaaaaaaaaaaaaaaa';
const DRAINED_ID = 'far6aaaaaaaaaaaaaaaa';
const UNKNOWN_ID = 'zzz9aaaaaaaaaaaaaaaa';

const CLUSTERS: ClusterRoute[] = [
  { name: CLUSTER, tag: 'loc1', region: 'eu', ingressAddress: '10.0.0.1:10443', drain: false },
  { name: 'c2', tag: 'far2', region: 'us', ingressAddress: '10.0.0.2:10443', drain: false },
  { name: 'c3', tag: 'far3', region: 'ap', ingressAddress: '[fd00::3]:10443', drain: false },
  { name: 'c4', tag: 'far4', region: 'ap', ingressAddress: '', drain: false },
  { name: 'c5', tag: 'far5', region: 'sa', ingressAddress: 'ingress.c5.test:10443', drain: false },
  { name: 'c6', tag: 'far6', region: 'af', ingressAddress: '10.0.0.6:10443', drain: true },
];

function clustersMessage(patch: Partial<ClustersMessage> = {}): ClustersMessage {
  return { type: 'clusters', self: CLUSTER, hubConnected: true, clusters: CLUSTERS, ...patch };
}

/** A resolver the test answers by hand: each lookup waits until the test resolves or rejects it. */
class ManualResolver {
  readonly pending: { host: string; resolve: (ip: string) => void; reject: (err: Error) => void }[] = [];
  readonly resolve = (host: string): Promise<string> => new Promise((resolve, reject) => this.pending.push({ host, resolve, reject }));
  /** Answers the oldest lookup and lets its continuation run. */
  async answer(result: string | Error): Promise<string> {
    const next = this.pending.shift();
    if (next === undefined) throw new Error('no lookup in flight');
    if (result instanceof Error) next.reject(result);
    else next.resolve(result);
    await new Promise((r) => setImmediate(r));
    return next.host;
  }
}

interface Setup {
  ctx: DecideContext & { federation: ClusterRegistry };
  clock: ManualClock;
  resolver: ManualResolver;
}

function setup(t: TestContext, opts: { hubUpstream?: boolean; entries?: RouteEntry[] } = {}): Setup {
  const clock = new ManualClock();
  const resolver = new ManualResolver();
  const table = new RouteTable({ clock });
  table.setConnected(CLUSTER, true);
  table.apply(CLUSTER, { type: 'snapshot', version: 1, cluster: CLUSTER, entries: opts.entries ?? [entry(LOCAL_ID)] });
  const federation = new ClusterRegistry({ clock, log: silentLogger(), resolve: resolver.resolve });
  t.after(() => federation.close());
  assert.equal(federation.apply(CLUSTER, clustersMessage()), 'applied');
  return { ctx: { table, domain: DOMAIN, clusters: new Set([CLUSTER]), defaultCluster: CLUSTER, federation, hubUpstream: opts.hubUpstream ?? false }, clock, resolver };
}

function headers(authority: string, path = '/', extra: Record<string, string> = {}, method = 'GET'): Map<string, string> {
  return new Map(Object.entries({ ':authority': authority, ':path': path, ':method': method, ...extra }));
}

const host = (id: string, port = 8080): string => `${port}-${id}.${DOMAIN}:10000`;

function routed(d: Decision): Extract<Decision, { kind: 'route' }> {
  assert.equal(d.kind, 'route', `expected a route, got ${JSON.stringify(d)}`);
  return d;
}

function refused(d: Decision): Extract<Decision, { kind: 'reject' }> {
  assert.equal(d.kind, 'reject', `expected a refusal, got ${JSON.stringify(d)}`);
  return d;
}

const setOf = (d: Extract<Decision, { kind: 'route' }>): Record<string, string> => Object.fromEntries(d.set);

test('a sandbox of another cluster, asked on the edge, goes to that cluster ingress with its token, cookie and E2B headers intact', (t) => {
  const { ctx } = setup(t);
  const client = { 'x-access-token': TOKEN, cookie: 'asb_access=abc; theme=dark', 'x-asb-upstream': 'sandbox', 'x-asb-dst': '169.254.169.254:80', 'x-asb-listener': 'ingress' };
  const d = routed(decide(headers(host(FAR_ID), '/x', client), ctx, 'edge'));
  assert.deepEqual(setOf(d), { 'x-asb-upstream': 'ingress', 'x-asb-dst': '10.0.0.2:10443' });
  assert.deepEqual(d.remove.sort(), ['x-asb-listener'], 'client x-asb-* removed (the two we set are overwritten); nothing else');
  assert.equal(d.setCookie, undefined, 'the owning cluster sets the cookie');
  assert.equal(d.sandboxId, undefined, 'no activity reported here');
  assert.equal(d.ingress, 'c2');

  // E2B style: the headers name the sandbox and must reach the owning router.
  const e2b = routed(decide(headers('127.0.0.1:10000', '/files', { 'e2b-sandbox-id': FAR_ID, 'e2b-sandbox-port': '49983', 'x-access-token': TOKEN }), ctx, 'edge'));
  assert.equal(setOf(e2b)['x-asb-dst'], '10.0.0.2:10443');
  assert.deepEqual(e2b.remove, []);

  // The API of another cluster's sandbox goes there too (that cluster's router sends it to its worker API).
  const api = routed(decide(headers(`api.${DOMAIN}`, `/v1/sandboxes/${FAR_ID}/pause`, { authorization: 'Bearer k' }, 'POST'), ctx, 'edge'));
  assert.deepEqual(setOf(api), { 'x-asb-upstream': 'ingress', 'x-asb-dst': '10.0.0.2:10443' });
  const e2bApi = routed(decide(headers('localhost:10000', `/sandboxes/${FAR_ID}`), ctx, 'edge'));
  assert.equal(setOf(e2bApi)['x-asb-upstream'], 'ingress');

  // IPv6 ingress addresses are bracketed; drained clusters are still routed to.
  assert.equal(setOf(routed(decide(headers(host(V6_ID)), ctx, 'edge')))['x-asb-dst'], '[fd00::3]:10443');
  assert.equal(setOf(routed(decide(headers(host(DRAINED_ID)), ctx, 'edge')))['x-asb-dst'], '10.0.0.6:10443');
});

test('on the ingress listener a sandbox of another cluster is refused, never forwarded again', (t) => {
  const { ctx } = setup(t);
  for (const [h, path] of [
    [host(FAR_ID), '/'],
    [`api.${DOMAIN}`, `/v1/sandboxes/${FAR_ID}`],
  ] as const) {
    const r = refused(decide(headers(h, path, { 'x-access-token': TOKEN }), ctx, 'ingress'));
    assert.equal(r.error.status, 404);
    assert.equal(r.error.message, `sandbox ${FAR_ID} belongs to cluster c2; this ingress serves ${CLUSTER}`);
  }
});

test('a local sandbox is routed as before on both listeners; unknown tags are looked up at the local worker', (t) => {
  const { ctx } = setup(t);
  for (const listener of ['edge', 'ingress'] as Listener[]) {
    const d = routed(decide(headers(host(LOCAL_ID), '/', { 'x-access-token': TOKEN }), ctx, listener));
    assert.deepEqual(setOf(d), { 'x-asb-upstream': 'sandbox', 'x-asb-dst': '10.213.0.7:8080', 'x-asb-sandbox-id': LOCAL_ID });
    assert.deepEqual(d.remove, ['x-access-token']);
    assert.equal(d.setCookie?.split(';')[0], `asb_access=${TOKEN}`, `${listener}: the owning router sets the cookie`);
    assert.equal(d.sandboxId, LOCAL_ID);
    assert.equal(d.ingress, undefined);
  }
  // A local id not in the table yet (feed lag) is still asked of the local worker, by its tag.
  assert.deepEqual(decide(headers(host('loc1bbbbbbbbbbbbbbbb')), ctx, 'ingress'), { kind: 'lookup', id: 'loc1bbbbbbbbbbbbbbbb', cluster: CLUSTER, e2b: false });
  assert.deepEqual(decide(headers(host(UNKNOWN_ID)), ctx, 'edge'), { kind: 'lookup', id: UNKNOWN_ID, cluster: CLUSTER, e2b: false });
  assert.equal(setOf(routed(decide(headers(`api.${DOMAIN}`, `/v1/sandboxes/${UNKNOWN_ID}`), ctx, 'edge')))['x-asb-upstream'], `api-${CLUSTER}`);
});

test('a cluster without an ingress address, or one that does not resolve, gets 503 naming it', async (t) => {
  const { ctx, resolver } = setup(t);
  const bare = refused(decide(headers(host(BARE_ID)), ctx, 'edge'));
  assert.equal(bare.error.status, 503);
  assert.match(bare.error.message, /cluster c4 has no ingress address/);
  assert.equal(bare.retryAfterS, 2);

  assert.match(refused(decide(headers(host(DNS_ID)), ctx, 'edge')).error.message, /ingress\.c5\.test:10443 of cluster c5 is still being resolved/);
  assert.equal(await resolver.answer(new Error('getaddrinfo ENOTFOUND ingress.c5.test')), 'ingress.c5.test');
  const failed = refused(decide(headers(host(DNS_ID)), ctx, 'edge'));
  assert.equal(failed.error.status, 503);
  assert.match(failed.error.message, /ingress address ingress\.c5\.test:10443 of cluster c5 does not resolve: getaddrinfo ENOTFOUND/);
});

test('a DNS-named ingress is resolved, refreshed every 30 s, and keeps its last good address through a failed lookup', async (t) => {
  const { ctx, clock, resolver } = setup(t);
  assert.equal(resolver.pending.length, 1, 'only the DNS name is looked up; IP literals are used as they are');
  await resolver.answer('192.0.2.5');
  const dst = (): string | undefined => setOf(routed(decide(headers(host(DNS_ID)), ctx, 'edge')))['x-asb-dst'];
  assert.equal(dst(), '192.0.2.5:10443');

  clock.advance(INGRESS_REFRESH_MS - 1);
  assert.equal(resolver.pending.length, 0, 'no lookup before 30 s');
  clock.advance(1);
  await resolver.answer('192.0.2.6');
  assert.equal(dst(), '192.0.2.6:10443', 'the refresh moved it');

  clock.advance(INGRESS_REFRESH_MS);
  await resolver.answer(new Error('SERVFAIL'));
  assert.equal(dst(), '192.0.2.6:10443', 'a failed refresh keeps the last good address');

  clock.advance(INGRESS_REFRESH_MS);
  await resolver.answer('2001:db8::7');
  assert.equal(dst(), '[2001:db8::7]:10443');

  // The cluster leaves the federation: no more lookups for it.
  ctx.federation.apply(CLUSTER, clustersMessage({ clusters: CLUSTERS.filter((c) => c.name !== 'c5') }));
  clock.advance(INGRESS_REFRESH_MS * 3);
  assert.equal(resolver.pending.length, 0);
  assert.equal(ctx.federation.clusterOfTag('far5'), undefined);
});

test('a DNS name resolves through node:dns (localhost)', async (t) => {
  const federation = new ClusterRegistry({ clock: systemClock, log: silentLogger() });
  t.after(() => federation.close());
  federation.apply(CLUSTER, clustersMessage({ clusters: [{ name: 'c2', tag: 'far2', region: 'us', ingressAddress: 'localhost:10443', drain: false }] }));
  await until(() => federation.ingress('c2').ok, 5_000, 'localhost to resolve');
  const target = federation.ingress('c2');
  assert.ok(target.ok);
  assert.ok(['127.0.0.1:10443', '[::1]:10443'].includes(target.destination), target.destination);
});

test('creates and lists, ours and E2B\'s, go to the hub only with --hub-upstream on, on the edge, while a worker reports the hub connected', (t) => {
  const on = setup(t, { hubUpstream: true });
  const upstream = (ctx: DecideContext, path: string, method: string, listener: Listener = 'edge', h = `api.${DOMAIN}`): string | undefined =>
    setOf(routed(decide(headers(h, path, { authorization: 'Bearer k' }, method), ctx, listener)))['x-asb-upstream'];

  assert.equal(upstream(on.ctx, '/v1/sandboxes', 'POST'), 'hub');
  assert.equal(upstream(on.ctx, '/v1/sandboxes?label=a&limit=5', 'GET'), 'hub');
  assert.equal(upstream(on.ctx, '/v1/sandboxes', 'GET', 'edge', '127.0.0.1:10000'), 'hub', 'the bare edge too');
  // E2B's create and list: SDK 2.51 at /v2/sandboxes, 2.50 at /sandboxes, on an IP or api.<domain>.
  for (const h of ['127.0.0.1:10000', `api.${DOMAIN}`, 'localhost:10000']) {
    assert.equal(upstream(on.ctx, '/v2/sandboxes', 'POST', 'edge', h), 'hub', `E2B create at ${h}`);
    assert.equal(upstream(on.ctx, '/sandboxes', 'POST', 'edge', h), 'hub', `E2B 2.50 create at ${h}`);
    assert.equal(upstream(on.ctx, '/v2/sandboxes?state=running&limit=2&nextToken=abc', 'GET', 'edge', h), 'hub', `E2B list at ${h}`);
    assert.equal(upstream(on.ctx, '/sandboxes?metadata=a%3Db', 'GET', 'edge', h), 'hub', `E2B 2.50 list at ${h}`);
    // E2B's template list: the team's templates of every cluster.
    assert.equal(upstream(on.ctx, '/templates', 'GET', 'edge', h), 'hub', `E2B template list at ${h}`);
    assert.equal(upstream(on.ctx, '/v2/templates?teamID=x', 'GET', 'edge', h), 'hub', `E2B 2.51 template list at ${h}`);
  }
  for (const [path, method] of [
    // A POST /templates is a build: this edge's cluster runs it.
    ['/templates', 'POST'],
    ['/v3/templates', 'POST'],
    ['/templates/', 'GET'],
    ['/v1/sandboxes/', 'GET'],
    ['/v1/sandboxes', 'DELETE'],
    ['/v1/templates', 'GET'],
    ['/sandboxes/', 'GET'],
    ['/sandboxes', 'DELETE'],
    ['/v2/sandboxes/', 'POST'],
    ['/v3/sandboxes', 'GET'],
    ['/sandboxesx', 'GET'],
  ] as const) {
    assert.equal(upstream(on.ctx, path, method), `api-${CLUSTER}`, `${method} ${path} is not the hub's`);
  }
  // A path naming a sandbox goes to its owner, the hub never sees it.
  assert.equal(upstream(on.ctx, `/sandboxes/${LOCAL_ID}`, 'GET', 'edge', '127.0.0.1:10000'), `api-${CLUSTER}`);
  assert.equal(upstream(on.ctx, `/v2/sandboxes/${LOCAL_ID}/connect`, 'POST', 'edge', '127.0.0.1:10000'), `api-${CLUSTER}`);
  assert.equal(upstream(on.ctx, `/sandboxes/${FAR_ID}/pause`, 'POST', 'edge', '127.0.0.1:10000'), 'ingress');
  for (const path of ['/v1/sandboxes', '/sandboxes', '/v2/sandboxes']) {
    assert.equal(upstream(on.ctx, path, 'POST', 'ingress'), `api-${CLUSTER}`, `${path}: never the hub from the ingress listener`);
  }

  on.ctx.federation.apply(CLUSTER, clustersMessage({ hubConnected: false }));
  for (const path of ['/v1/sandboxes', '/sandboxes', '/v2/sandboxes']) {
    assert.equal(upstream(on.ctx, path, 'POST'), `api-${CLUSTER}`, `${path}: hub link down: the local worker`);
  }
  on.ctx.federation.apply(CLUSTER, clustersMessage({ hubConnected: true }));
  assert.equal(upstream(on.ctx, '/v1/sandboxes', 'POST'), 'hub');
  on.ctx.federation.feedDown(CLUSTER);
  assert.equal(upstream(on.ctx, '/v1/sandboxes', 'POST'), `api-${CLUSTER}`, 'a worker whose feed dropped cannot vouch for the hub');
  assert.equal(upstream(on.ctx, '/v2/sandboxes', 'GET'), `api-${CLUSTER}`, 'nor for an E2B list');
  // Our own worker is down (crashed, being restarted by `make up`'s supervisor) after it said the
  // hub was up: creates go to the hub, which places them on another cluster, instead of a 503 here.
  on.ctx.table.setConnected(CLUSTER, false);
  assert.equal(upstream(on.ctx, '/v1/sandboxes', 'POST'), 'hub', 'our worker is down: the hub places the create elsewhere');
  assert.equal(upstream(on.ctx, '/v2/sandboxes', 'POST'), 'hub');
  on.ctx.federation.apply(CLUSTER, clustersMessage({ hubConnected: false }));
  on.ctx.federation.feedDown(CLUSTER);
  const refused = decide(headers(`api.${DOMAIN}`, '/v1/sandboxes', { authorization: 'Bearer k' }, 'POST'), on.ctx, 'edge');
  assert.equal(refused.kind, 'reject', 'a worker that last said its hub was away: no hub to fail over to');
  on.ctx.table.setConnected(CLUSTER, true);

  const off = setup(t, { hubUpstream: false });
  for (const path of ['/v1/sandboxes', '/sandboxes', '/v2/sandboxes']) {
    assert.equal(upstream(off.ctx, path, 'POST'), `api-${CLUSTER}`, `${path}: hub upstream off`);
  }
});

test('the registry takes a feed only for its own cluster and keeps clusters known when the feed drops', (t) => {
  const { ctx } = setup(t);
  assert.equal(ctx.federation.apply('c2', clustersMessage()), 'foreign');
  ctx.federation.feedDown(CLUSTER);
  assert.equal(ctx.federation.clusterOfTag('far2'), 'c2');
  assert.equal(setOf(routed(decide(headers(host(FAR_ID)), ctx, 'edge')))['x-asb-dst'], '10.0.0.2:10443', 'other clusters stay reachable while our worker restarts');
});

test('--hub-upstream on|off (ASB_ROUTER_HUB_UPSTREAM), default off', () => {
  const base = ['--worker', 'c1=http://127.0.0.1:1', '--worker-key', 'k'];
  assert.equal(parseRouterConfig(base, {}).hubUpstream, false);
  assert.equal(parseRouterConfig([...base, '--hub-upstream', 'on'], {}).hubUpstream, true);
  assert.equal(parseRouterConfig(base, { ASB_ROUTER_HUB_UPSTREAM: 'on' }).hubUpstream, true);
  assert.equal(parseRouterConfig([...base, '--hub-upstream=off'], { ASB_ROUTER_HUB_UPSTREAM: 'on' }).hubUpstream, false, 'the flag wins');
  assert.throws(
    () => parseRouterConfig([...base, '--hub-upstream', 'yes'], {}),
    (err: unknown) => err instanceof ConfigError && err.problems.some((p) => p.includes('--hub-upstream (ASB_ROUTER_HUB_UPSTREAM) must be on or off, got "yes"')),
  );
});

// Through the real ext_proc server, with the listener metadata Envoy's ingress listener sets.

type Client = ReturnType<typeof extProcClient>;

/** One request's headers on a stream opened with `metadata`; the final answer. */
function exchangeOn(client: Client, req: ProcessingRequest, listener: Listener | undefined): Promise<ProcessingResponse> {
  return new Promise((resolve, reject) => {
    const metadata = new Metadata();
    if (listener !== undefined) metadata.set('x-asb-listener', listener);
    const call = client.Process(metadata);
    let done = false;
    call.on('data', (msg: ProcessingResponse) => {
      if (msg.override_message_timeout !== undefined && Object.keys(msg).length === 1) return;
      done = true;
      call.cancel();
      resolve(msg);
    });
    call.on('error', (err: Error) => {
      if (!done) reject(err);
    });
    call.write(req);
  });
}

async function startFederatedRouter(t: TestContext, hubUpstream: boolean): Promise<{ client: Client; registry: Registry; federation: ClusterRegistry; worker: Awaited<ReturnType<typeof startFakeWorker>> }> {
  const worker = await startFakeWorker(t);
  const clock = new ManualClock();
  const log = silentLogger();
  const table = new RouteTable({ clock });
  table.setConnected(CLUSTER, true);
  table.apply(CLUSTER, { type: 'snapshot', version: 1, cluster: CLUSTER, entries: [entry(LOCAL_ID)] });
  const federation = new ClusterRegistry({ clock, log, resolve: () => Promise.resolve('192.0.2.5') });
  federation.apply(CLUSTER, clustersMessage());
  const registry = new Registry();
  const metrics = createRouterMetrics(registry, table);
  const workers = new Map([[CLUSTER, { cluster: CLUSTER, url: worker.url, key: 'admin-key' }]]);
  // No hold here reaches a pod; the fake ports keep any connect inside the test all the same.
  const waker = new Waker({ table, workers, clock, log, portWaiter: new PortWaiter({ clock, connect: fakePorts().connect }) });
  const activity = new ActivityReporter({ workers, clock, log });
  const server = await ExtProcServer.start({ table, domain: DOMAIN, clusters: new Set([CLUSTER]), defaultCluster: CLUSTER, federation, hubUpstream, waker, activity, metrics, log, listen: '127.0.0.1:0' });
  const client = extProcClient(server.address);
  t.after(async () => {
    client.close();
    await server.close(100);
    await activity.close();
    federation.close();
  });
  return { client, registry, federation, worker };
}

test('through the ext_proc server: the edge forwards to the owning ingress and counts it; the ingress listener refuses the same', async (t) => {
  const { client, registry } = await startFederatedRouter(t, false);
  const req = get(host(FAR_ID), '/', { 'x-access-token': TOKEN, cookie: 'asb_access=abc', 'x-asb-dst': '169.254.169.254:80', 'x-asb-other': '1' });

  for (const listener of [undefined, 'edge'] as const) {
    const answer = await exchangeOn(client, req, listener);
    assert.equal(headerValue(answer, 'x-asb-upstream'), 'ingress', `metadata ${listener ?? 'absent'}`);
    assert.equal(headerValue(answer, 'x-asb-dst'), '10.0.0.2:10443');
    assert.deepEqual(answer.request_headers?.response?.header_mutation?.remove_headers, ['x-asb-other'], 'token and cookie travel on');
    assert.equal(answer.request_headers.response.clear_route_cache, true);
    assert.equal(answer.mode_override, undefined, 'no cookie to set here: response headers stay skipped');
  }
  assert.match(await registry.getSingleMetricAsString('asb_router_ingress_forwards_total'), /asb_router_ingress_forwards_total\{cluster="c2"\} 2/);

  const refusal = immediate(await exchangeOn(client, req, 'ingress'));
  assert.equal(refusal?.status, 404);
  assert.equal(refusal.body.message, `sandbox ${FAR_ID} belongs to cluster c2; this ingress serves ${CLUSTER}`);

  // The owning side: the ingress listener routes its own sandbox and sets the cookie.
  const own = await exchangeOn(client, get(host(LOCAL_ID), '/', { 'x-access-token': TOKEN }), 'ingress');
  assert.equal(headerValue(own, 'x-asb-dst'), '10.213.0.7:8080');
  assert.equal(own.mode_override?.response_header_mode, 1, 'response headers requested for the Set-Cookie');

  // An unknown tag is asked of the local worker and answered 404.
  const unknown = immediate(await exchangeOn(client, get(host(UNKNOWN_ID), '/'), 'edge'));
  assert.equal(unknown?.status, 404);
});

test('through the ext_proc server: creates go to the hub from the edge only, while it is connected', async (t) => {
  const { client, federation } = await startFederatedRouter(t, true);
  const create = requestHeaders({ ':authority': `api.${DOMAIN}`, ':path': '/v1/sandboxes', ':method': 'POST', authorization: 'Bearer k' });
  assert.equal(headerValue(await exchangeOn(client, create, 'edge'), 'x-asb-upstream'), 'hub');
  assert.equal(headerValue(await exchangeOn(client, create, 'ingress'), 'x-asb-upstream'), `api-${CLUSTER}`);
  federation.apply(CLUSTER, clustersMessage({ hubConnected: false }));
  assert.equal(headerValue(await exchangeOn(client, create, 'edge'), 'x-asb-upstream'), `api-${CLUSTER}`);
});

test('a real worker route feed delivers its Cluster objects and hub link to the router registry', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const table = new RouteTable({ clock: systemClock });
  const federation = new ClusterRegistry({ clock: systemClock, log: silentLogger() });
  const results: string[] = [];
  const feed = new FeedClient({ worker: { cluster: 'test', url: fx.url, key: fx.keys.admin }, table, federation, clock: systemClock, log: silentLogger(), onMessage: (type, result) => results.push(`${type}:${result}`) });
  t.after(() => {
    feed.close();
    federation.close();
  });
  await feed.synced();
  await until(() => results.includes('clusters:applied'), 5_000, 'the first clusters message');
  assert.equal(federation.clusterOfTag('far2'), undefined);

  const cluster: Cluster = { apiVersion: 'asb.dev/v1alpha1', kind: 'Cluster', metadata: { name: 'c2' }, spec: { region: 'us', ingressAddress: '10.0.0.2:10443', tag: 'far2', credentialHash: '' } };
  await fx.store.create(ClusterType, cluster);
  await until(() => federation.clusterOfTag('far2') === 'c2', 5_000, 'the registry to learn c2');
  assert.deepEqual(federation.ingress('c2'), { ok: true, destination: '10.0.0.2:10443' });
  assert.equal(federation.hubConnected, false, 'the fixture worker has no hub');
  assert.ok(!results.includes('clusters:invalid') && !results.includes('invalid:invalid'), results.join(' '));

  feed.close();
  assert.equal(federation.clusterOfTag('far2'), 'c2', 'the federation stays known after the feed closes');
});
