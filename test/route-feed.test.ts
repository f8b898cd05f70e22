// The worker side of the data plane against a real worker API (SQLite store, operator, memory
// runtime): the route feed a router connects to, data-plane access tokens, public ports,
// sandbox URLs, and activity reports.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { WebSocket } from 'ws';
import type { Sandbox } from '../src/api/types.ts';
import { SandboxType } from '../src/api/types.ts';
import { createApiKey, revokeApiKey } from '../src/auth/keys.ts';
import { isAsbError } from '../src/errors.ts';
import { ClusterType, type Cluster } from '../src/api/hub-contract.ts';
import type { ClustersMessage, FeedMessage, RouteEntry } from '../src/router/contract.ts';
import { createAccessTokens, loadClusterSecret, tokenHash, tokenMatches } from '../src/worker/access-token.ts';
import { systemClock } from '../src/base/clock.ts';
import { silentLogger } from '../src/base/log.ts';
import { createFeedUpgrade } from '../src/worker/route-feed/endpoint.ts';
import { RouteFeed } from '../src/worker/route-feed/feed.ts';
import { call, startWorkerFixture, type WorkerFixture } from './support/worker-fixture.ts';
import { within } from './support/wait.ts';

interface View {
  id: string;
  phase: string;
  ip?: string;
  accessToken?: string;
  domain?: string;
  defaultPort?: number;
  publicPorts?: number[];
  url?: string;
}

/** A route feed connection that queues every message; `next` waits (bounded) for one that matches. */
class FeedClient {
  readonly messages: FeedMessage[] = [];
  readonly ws: WebSocket;
  #waiters: (() => void)[] = [];
  #read = 0;
  closed: Promise<number>;

  constructor(url: string, key: string) {
    this.ws = new WebSocket(`${url.replace(/^http/, 'ws')}/v1/routes/feed`, { headers: { authorization: `Bearer ${key}` } });
    this.ws.on('message', (data: Buffer) => {
      this.messages.push(JSON.parse(data.toString('utf8')) as FeedMessage);
      for (const w of this.#waiters.splice(0)) w();
    });
    this.closed = new Promise((resolve) => this.ws.on('close', (code) => resolve(code)));
  }

  /** The next unread message satisfying `match` (earlier unread ones are skipped but kept in `messages`). */
  async next(match: (m: FeedMessage) => boolean, what: string, timeoutMs = 10_000): Promise<FeedMessage> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      while (this.#read < this.messages.length) {
        const m = this.messages[this.#read++]!;
        if (match(m)) return m;
      }
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no route feed message: ${what}; got ${JSON.stringify(this.messages)}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.#waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  close(): Promise<number> {
    this.ws.close();
    return this.closed;
  }
}

function connect(fx: { url: string }, key: string, t: { after: (fn: () => Promise<unknown>) => void }): FeedClient {
  const client = new FeedClient(fx.url, key);
  t.after(() => {
    client.ws.terminate();
    return client.closed;
  });
  return client;
}

/** The HTTP status a refused upgrade answered with. */
function refusedStatus(url: string, headers: Record<string, string>): Promise<number> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${url.replace(/^http/, 'ws')}/v1/routes/feed`, { headers });
    ws.on('unexpected-response', (_req, res) => {
      resolve(res.statusCode ?? 0);
      res.resume();
      ws.terminate();
    });
    ws.on('open', () => {
      ws.close();
      reject(new Error('the upgrade was accepted'));
    });
    ws.on('error', () => undefined);
  });
}

/** A feed of its own on the fixture's store and its own HTTP server, with limits a test can make small. */
async function standaloneFeed(
  fx: WorkerFixture,
  t: { after: (fn: () => Promise<unknown>) => void },
  limits: { maxBufferedBytes?: number; pingIntervalMs?: number; hubConnected?: () => boolean; hubPollMs?: number },
): Promise<{ feed: RouteFeed; url: string }> {
  const feed = await RouteFeed.open({ store: fx.store, cluster: 'test', tokens: createAccessTokens(Buffer.alloc(32, 7)), log: silentLogger(), clock: systemClock, ...limits });
  const upgrade = createFeedUpgrade({ feed, auth: { verify: () => ({ team: 'ops', admin: true, prefix: 'asb_test' }), live: () => true, onRevoked: () => () => undefined }, log: silentLogger() });
  const server = createServer((_req, res) => res.end());
  server.on('upgrade', upgrade.handle);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(async () => {
    upgrade.close();
    feed.close();
    await new Promise((resolve) => server.close(resolve));
  });
  return { feed, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

const sha256 = (text: string): string => createHash('sha256').update(text).digest('hex');
const isUpsert = (id: string, state: RouteEntry['state']) => (m: FeedMessage) => m.type === 'upsert' && m.entry.id === id && m.entry.state === state;

test('the route feed sends a snapshot, then versioned deltas as a sandbox pauses, resumes and is deleted; a reconnect resyncs', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const created = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: {} });
  assert.equal(created.status, 201, created.text);
  const view = created.json as View;
  assert.ok(view.ip !== undefined && view.accessToken !== undefined);

  const feed = connect(fx, fx.keys.admin, t);
  const snapshot = await feed.next((m) => m.type === 'snapshot', 'snapshot');
  assert.ok(snapshot.type === 'snapshot');
  assert.equal(snapshot.cluster, 'test');
  const entry = snapshot.entries.find((e) => e.id === view.id);
  assert.deepEqual(entry, {
    id: view.id,
    cluster: 'test',
    state: 'running',
    podIp: view.ip,
    defaultPort: 49983,
    publicPorts: [],
    tokenHash: sha256(view.accessToken),
    owner: 'team-a',
  });
  assert.ok(snapshot.entries.every((e) => e.owner !== ''), 'unclaimed warm members are not routable');

  assert.equal((await call(fx, 'POST', `/v1/sandboxes/${view.id}/pause`, { key: fx.keys.teamA })).status, 200);
  const paused = await feed.next(isUpsert(view.id, 'hibernated'), 'upsert hibernated');
  assert.ok(paused.type === 'upsert');
  assert.equal(paused.entry.podIp, undefined, 'a hibernated entry has no pod address');

  const resumed = await call(fx, 'POST', `/v1/sandboxes/${view.id}/resume`, { key: fx.keys.teamA });
  assert.equal(resumed.status, 200, resumed.text);
  const running = await feed.next(isUpsert(view.id, 'running'), 'upsert running');
  assert.ok(running.type === 'upsert');
  assert.equal(running.entry.podIp, (resumed.json as View).ip);

  assert.equal((await call(fx, 'DELETE', `/v1/sandboxes/${view.id}`, { key: fx.keys.teamA })).status, 202);
  await feed.next((m) => m.type === 'delete' && m.id === view.id, 'delete');

  const versions = feed.messages.flatMap((m) => (m.type === 'clusters' ? [] : [m.version]));
  for (let i = 1; i < versions.length; i++) assert.ok(versions[i]! > versions[i - 1]!, `versions strictly increase: ${versions.join(', ')}`);
  const deltas = feed.messages.slice(1).filter((m) => m.type === 'upsert' && m.entry.id === view.id);
  for (let i = 1; i < deltas.length; i++) {
    assert.notDeepEqual({ ...deltas[i], version: 0 }, { ...deltas[i - 1], version: 0 }, 'a delta is sent only when the entry changed');
  }
  assert.ok(!feed.messages.slice(1).some((m) => m.type === 'snapshot'), 'one snapshot per connection');

  await feed.close();
  const again = connect(fx, fx.keys.admin, t);
  const fresh = await again.next((m) => m.type === 'snapshot', 'snapshot after reconnect');
  assert.ok(fresh.type === 'snapshot');
  assert.ok(!fresh.entries.some((e) => e.id === view.id), 'the deleted sandbox is gone from a fresh snapshot');
  assert.ok(fresh.version >= versions.at(-1)!, 'a fresh snapshot is at least as new as the last delta');
});

test('the route feed refuses non-admin keys and missing keys before upgrading; a plain GET says to upgrade', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  assert.equal(await refusedStatus(fx.url, { authorization: `Bearer ${fx.keys.teamA}` }), 403);
  assert.equal(await refusedStatus(fx.url, {}), 401);
  assert.equal(await refusedStatus(fx.url, { authorization: 'Bearer asb_nope' }), 401);
  const plain = await call(fx, 'GET', '/v1/routes/feed', { key: fx.keys.admin });
  assert.equal(plain.status, 400);
  assert.match(plain.text, /WebSocket/);
  assert.equal(fx.server.routeFeed.connections, 0);
});

test('revoking the admin key a route feed was opened with closes the feed (1008), and its reconnect is refused', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const doomed = await createApiKey(fx.store, { team: 'ops', admin: true });
  const feed = connect(fx, doomed.key, t);
  await feed.next((m) => m.type === 'snapshot', 'snapshot');
  const other = connect(fx, fx.keys.admin, t);
  await other.next((m) => m.type === 'snapshot', 'snapshot');
  await revokeApiKey(fx.store, doomed.object.spec.prefix);
  // The key ring follows the store's watch: the close comes as soon as the revocation is written.
  assert.equal(await within('the feed to close', feed.closed, 10_000), 1008);
  assert.equal(await refusedStatus(fx.url, { authorization: `Bearer ${doomed.key}` }), 401);
  assert.equal(other.ws.readyState, WebSocket.OPEN, "another key's feed stays open");
});

test('a router that stops reading is dropped instead of buffered without bound, and resyncs on reconnect', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  // A second feed on the same store with a 256 KiB limit, so a few dozen large deltas overflow it.
  const { feed, url } = await standaloneFeed(fx, t, { maxBufferedBytes: 256 * 1024 });

  const created = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: {} });
  const id = (created.json as View).id;
  const stalled = connect({ url }, 'any', t);
  await stalled.next((m) => m.type === 'snapshot', 'snapshot');
  // Stop reading: the kernel's socket buffers fill first, then the feed's own send buffer grows.
  (stalled.ws as unknown as { _socket: { pause(): void } })._socket.pause();
  // Each write flips the public ports between two sets of 4,000: a real change, ~25 KB per delta.
  const ports = (offset: number): string => Array.from({ length: 4000 }, (_, i) => String(offset + i)).join(',');
  let sandbox = await fx.store.get<Sandbox>(SandboxType, 'default', id);
  let writes = 0;
  const deadline = Date.now() + 60_000;
  while (feed.connections > 0) {
    if (Date.now() > deadline) throw new Error(`the feed still holds the stalled router after ${writes} deltas`);
    const annotations = { ...sandbox.metadata.annotations, 'asb.dev/public-ports': ports(writes % 2 === 0 ? 1000 : 6000) };
    try {
      sandbox = await fx.store.update<Sandbox>(SandboxType, { ...sandbox, metadata: { ...sandbox.metadata, annotations } });
      writes += 1;
    } catch (err) {
      // The operator writes status meanwhile: read again and retry.
      if (!isAsbError(err, 'Conflict')) throw err;
      sandbox = await fx.store.get<Sandbox>(SandboxType, 'default', id);
    }
  }
  assert.ok(writes > 10, `dropped only after the backlog passed the limit (${writes} writes)`);
  const again = connect({ url }, 'any', t);
  const fresh = await again.next((m) => m.type === 'snapshot', 'snapshot after the drop');
  assert.ok(fresh.type === 'snapshot');
  assert.equal(fresh.entries.find((e) => e.id === id)?.publicPorts.length, 4000, 'the reconnect gets the latest state');
});

test('the feed pings routers and drops one that stops answering pings', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const { feed, url } = await standaloneFeed(fx, t, { pingIntervalMs: 20 });
  const healthy = connect({ url }, 'any', t);
  await healthy.next((m) => m.type === 'snapshot', 'snapshot');
  // ws answers pings by itself: three pings answered keep the connection.
  await new Promise<void>((resolve) => {
    let pings = 0;
    healthy.ws.on('ping', () => ++pings === 3 && resolve());
  });
  assert.equal(healthy.ws.readyState, healthy.ws.OPEN);

  const deaf = new WebSocket(`${url.replace(/^http/, 'ws')}/v1/routes/feed`, { autoPong: false, headers: { authorization: 'Bearer any' } });
  t.after(() => deaf.terminate());
  const closed = new Promise<void>((resolve) => deaf.on('close', () => resolve()));
  await closed;
  assert.equal(feed.connections, 1, 'only the router that answers pings is still connected');
});

test('the access token from create hashes to the feed tokenHash; only its owner and admins can read it', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const created = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: {} });
  const view = created.json as View;
  assert.match(view.accessToken ?? '', /^[A-Za-z0-9_-]{32}$/);
  assert.equal(view.url, `http://49983-${view.id}.asb.localhost:10000`);
  assert.equal(view.domain, 'asb.localhost');
  assert.equal(view.defaultPort, 49983);

  const entry = fx.server.routeFeed.entries().find((e) => e.id === view.id);
  assert.equal(entry?.tokenHash, tokenHash(view.accessToken ?? ''));
  assert.ok(tokenMatches(view.accessToken ?? '', entry.tokenHash));
  assert.ok(!tokenMatches('x'.repeat(32), entry.tokenHash));

  assert.equal(((await call(fx, 'GET', `/v1/sandboxes/${view.id}`, { key: fx.keys.teamA })).json as View).accessToken, view.accessToken, 'the owner reads the same token again');
  assert.equal(((await call(fx, 'GET', `/v1/sandboxes/${view.id}`, { key: fx.keys.admin })).json as View).accessToken, view.accessToken, 'an admin reads it');
  const other = await call(fx, 'GET', `/v1/sandboxes/${view.id}`, { key: fx.keys.teamB });
  assert.equal(other.status, 404, 'another team cannot even see the sandbox');
  assert.ok(!other.text.includes(view.accessToken ?? '<none>'));
  const list = await call(fx, 'GET', '/v1/sandboxes', { key: fx.keys.teamA });
  assert.ok(!list.text.includes(view.accessToken ?? '<none>'), 'lists carry no tokens');
  assert.equal((list.json as { items: View[] }).items[0]?.url, view.url, 'lists carry URLs');
});

test('the cluster secret is created once (0600) and tokens survive a restart', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'asb-secret-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const first = createAccessTokens(loadClusterSecret(dir));
  assert.equal((await stat(join(dir, 'cluster.secret'))).mode & 0o777, 0o600);
  const second = createAccessTokens(loadClusterSecret(dir));
  const sandbox = (name: string, uid: string, generation?: string) => ({ metadata: { name, uid, ...(generation === undefined ? {} : { annotations: { 'asb.dev/token-generation': generation } }) } });
  assert.equal(second.accessToken(sandbox('loc1abc', 'u-1')), first.accessToken(sandbox('loc1abc', 'u-1')), 'the same secret gives the same token after a restart');
  assert.notEqual(first.accessToken(sandbox('loc1abc', 'u-1')), first.accessToken(sandbox('loc1abd', 'u-2')), 'each sandbox has its own token');
  // Regression (security probe H1): the token came from the name, so a name's next owner shared it.
  assert.notEqual(first.accessToken(sandbox('my-sandbox', 'u-3')), first.accessToken(sandbox('my-sandbox', 'u-4')), 'a name used again gets a new token');
  assert.notEqual(first.accessToken(sandbox('loc1abc', 'u-1', '1')), first.accessToken(sandbox('loc1abc', 'u-1')), 'a bumped generation gives a new token');
  assert.throws(() => first.accessToken({ metadata: { name: 'unsaved' } }), /no uid/, 'an object never stored has no token');
});

test('a template marks ports public; the default port is its first container port', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const template = {
    apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
    kind: 'SandboxTemplate',
    metadata: { name: 'web', namespace: 'default', annotations: { 'asb.dev/public-ports': '8080, 3000,bogus' } },
    spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox', command: ['sleep', 'infinity'], ports: [{ containerPort: 8080 }, { containerPort: 9000 }] }] } } },
  };
  const put = await call(fx, 'PUT', '/v1/templates/web', { key: fx.keys.admin, json: template });
  assert.ok(put.status === 200 || put.status === 201, put.text);
  const created = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: { template: 'web' } });
  assert.equal(created.status, 201, created.text);
  const view = created.json as View;
  assert.deepEqual(view.publicPorts, [3000, 8080], 'the bogus item is ignored, never widening access');
  assert.equal(view.defaultPort, 8080);
  assert.equal(view.url, `http://8080-${view.id}.asb.localhost:10000`);
  const entry = fx.server.routeFeed.entries().find((e) => e.id === view.id);
  assert.deepEqual(entry?.publicPorts, [3000, 8080]);
  assert.equal(entry.defaultPort, 8080);
});

test('POST /v1/activity touches known sandboxes for admins only', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const created = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: {} });
  const id = (created.json as View).id;
  const ok = await call(fx, 'POST', '/v1/activity', { key: fx.keys.admin, json: { ids: [id, id, 'loc1doesnotexist'] } });
  assert.equal(ok.status, 200, ok.text);
  assert.deepEqual(ok.json, { touched: 1 }, 'duplicates count once, unknown ids are skipped');
  assert.equal((await call(fx, 'POST', '/v1/activity', { key: fx.keys.teamA, json: { ids: [id] } })).status, 403);
  const bad = await call(fx, 'POST', '/v1/activity', { key: fx.keys.admin, json: { ids: 'x' } });
  assert.equal(bad.status, 422);
  assert.match(bad.text, /ids/);
});

test('activity reports keep a sandbox in use from hibernating; without them it hibernates', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  // 1.5 s idle timeout, reports every 200 ms: a router reporting an open connection (7 reports per
  // timeout) must keep it running; the margin is wide so a slow machine cannot flip the result.
  const created = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: { idleTimeoutMs: 1500 } });
  const id = (created.json as View).id;
  const phase = async (): Promise<string> => ((await call(fx, 'GET', `/v1/sandboxes/${id}`, { key: fx.keys.teamA })).json as View).phase;
  for (let i = 0; i < 20; i++) {
    assert.deepEqual((await call(fx, 'POST', '/v1/activity', { key: fx.keys.admin, json: { ids: [id] } })).json, { touched: 1 });
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  assert.equal(await phase(), 'Running', 'reported activity keeps the sandbox running past its idle timeout');
  const deadline = Date.now() + 20_000;
  while ((await phase()) !== 'Hibernated') {
    if (Date.now() > deadline) throw new Error('the sandbox never hibernated once reports stopped');
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
});

/** Polls `cond` every 5 ms, for 10 s at most. */
async function waitFor(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 2000 && !cond(); i++) await new Promise((resolve) => setTimeout(resolve, 5));
  if (!cond()) throw new Error(`timed out waiting for ${what}`);
}

const isClusters = (m: FeedMessage): m is ClustersMessage => m.type === 'clusters';

function clusterObject(name: string, spec: Partial<Cluster['spec']>): Cluster {
  return { apiVersion: 'asb.dev/v1alpha1', kind: 'Cluster', metadata: { name }, spec: { region: 'eu', ingressAddress: '', tag: 'eu01', credentialHash: '', ...spec } };
}

test('the Cluster objects in the worker store reach routers as a clusters message after the snapshot and again on every change', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const feed = connect(fx, fx.keys.admin, t);
  await feed.next((m) => m.type === 'snapshot', 'snapshot');
  assert.equal(feed.messages[1]?.type, 'clusters', 'the clusters message follows the snapshot at once');
  assert.deepEqual(await feed.next(isClusters, 'first clusters message'), { type: 'clusters', self: 'test', hubConnected: false, clusters: [] }, 'no hub: only itself, by its snapshot');

  // A synced copy as the sync agent writes it: no ingress address and no drain flag yet.
  const synced = clusterObject('eu-west', { tag: 'euw1' });
  delete (synced.spec as Partial<Cluster['spec']>).ingressAddress;
  await fx.store.create(ClusterType, synced);
  const first = await feed.next(isClusters, 'clusters message with eu-west');
  assert.deepEqual(first, { type: 'clusters', self: 'test', hubConnected: false, clusters: [{ name: 'eu-west', tag: 'euw1', region: 'eu', ingressAddress: '', drain: false }] });

  const stored = await fx.store.get<Cluster>(ClusterType, '', 'eu-west');
  await fx.store.update(ClusterType, { ...stored, spec: { ...stored.spec, ingressAddress: 'ingress.eu.example:10443', drain: true } });
  await fx.store.create(ClusterType, clusterObject('ap-south', { tag: 'aps1', region: 'ap', ingressAddress: '10.0.0.9:10443' }));
  const changed = await feed.next((m) => isClusters(m) && m.clusters.length === 2, 'clusters message with both clusters');
  assert.ok(isClusters(changed));
  assert.deepEqual(changed.clusters, [
    { name: 'ap-south', tag: 'aps1', region: 'ap', ingressAddress: '10.0.0.9:10443', drain: false },
    { name: 'eu-west', tag: 'euw1', region: 'eu', ingressAddress: 'ingress.eu.example:10443', drain: true },
  ]);

  await fx.store.delete(ClusterType, '', 'ap-south');
  const afterDelete = await feed.next((m) => isClusters(m) && m.clusters.length === 1, 'clusters message after a delete');
  assert.ok(isClusters(afterDelete));
  assert.equal(afterDelete.clusters[0]?.name, 'eu-west');

  // A reconnecting router gets the registry as it is now, right after its snapshot.
  const again = connect(fx, fx.keys.admin, t);
  await again.next((m) => m.type === 'snapshot', 'snapshot after reconnect');
  assert.deepEqual(await again.next(isClusters, 'clusters after reconnect'), afterDelete);
  // Writes that change nothing a router uses (a label) send nothing: the next message seen is the delete's.
  const current = await fx.store.get<Cluster>(ClusterType, '', 'eu-west');
  await fx.store.update(ClusterType, { ...current, metadata: { ...current.metadata, labels: { team: 'x' } } });
  await fx.store.delete(ClusterType, '', 'eu-west');
  const emptied = await again.next(isClusters, 'clusters message after the last delete');
  assert.ok(isClusters(emptied));
  assert.deepEqual(emptied.clusters, []);
});

test('the hub link going up and down is sent to routers once per change', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  let hub = false;
  let polls = 0;
  const hubConnected = (): boolean => {
    polls += 1;
    return hub;
  };
  const { url } = await standaloneFeed(fx, t, { hubConnected, hubPollMs: 5 });
  const router = connect({ url }, 'any', t);
  await router.next((m) => m.type === 'snapshot', 'snapshot');
  assert.equal((await router.next(isClusters, 'first clusters')).type, 'clusters');
  hub = true;
  const up = await router.next(isClusters, 'hub connected');
  assert.ok(isClusters(up) && up.hubConnected);
  hub = false;
  const down = await router.next(isClusters, 'hub disconnected');
  assert.ok(isClusters(down) && !down.hubConnected);
  // Twenty more polls with nothing changed; only the changes were sent.
  const seen = polls;
  await waitFor(() => polls >= seen + 20, 'twenty more polls');
  assert.deepEqual(router.messages.filter(isClusters).map((m) => m.hubConnected), [false, true, false]);
  assert.equal(router.messages.filter(isClusters).at(0)?.self, 'test');
});
