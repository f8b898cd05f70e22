// E2B's create and list at the hub (src/hub/routes-e2b.ts): a hub API in front of two real
// in-process workers (real E2B routes, store and operator; pods in memory), a cluster that
// answers every call 503 and one whose port is closed, with the live sync view set by the test,
// so placement order, failover, the merged and paged list and E2B-shaped errors are all seen as
// an E2B client sees them.
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test, type TestContext } from 'node:test';
import { Registry } from 'prom-client';
import { ApiKeyType, SandboxTemplateType, type ApiKey, type SandboxTemplate } from '../src/api/types.ts';
import { createApiKey } from '../src/auth/keys.ts';
import { KeyRing } from '../src/auth/keyring.ts';
import { createHubApi } from '../src/hub/admin-api.ts';
import { ClusterType } from '../src/api/hub-contract.ts';
import type { SyncView } from '../src/hub/hub-context.ts';
import type { LiveCluster } from '../src/hub/live-clusters.ts';
import type { ObjectStore } from '../src/store/store.ts';
import { freePort } from '../src/assembly/local-system.ts';
import { silentLogger } from '../src/base/log.ts';
import { hubStoreWithCluster } from './support/hub-unit.ts';
import { OpenApiChecker } from './support/openapi-check.ts';
import { waitFor } from './support/wait.ts';
import { BASE_TEMPLATE, call, startWorkerFixture, type ApiResponse, type WorkerFixture } from './support/worker-fixture.ts';

interface E2bError {
  code: number;
  message: string;
}

interface Listed {
  sandboxID: string;
  startedAt: string;
  metadata: Record<string, string>;
}

interface Recorded {
  method: string;
  url: string;
  apiKey: string | undefined;
  body: string;
}

/** A cluster whose API answers everything 503 the E2B way, recording what it was sent. */
async function startBusyCluster(t: TestContext): Promise<{ url: string; seen: Recorded[] }> {
  const seen: Recorded[] = [];
  const server: Server = createServer((req: IncomingMessage, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const apiKey = req.headers['x-api-key'];
      seen.push({ method: req.method ?? '', url: req.url ?? '', apiKey: typeof apiKey === 'string' ? apiKey : undefined, body: Buffer.concat(chunks).toString('utf8') });
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ code: 503, message: 'busy: no capacity right now' }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen };
}

/** The same key, usable at the hub and at both workers (as the hub's sync would make it). */
async function sharedKey(hubStore: ObjectStore, team: string, workers: readonly WorkerFixture[]): Promise<string> {
  const { key, object } = await createApiKey(hubStore, { team });
  for (const w of workers) {
    await w.store.create<ApiKey>(ApiKeyType, { apiVersion: object.apiVersion, kind: object.kind, metadata: { name: object.metadata.name, labels: object.metadata.labels ?? {} }, spec: object.spec });
    await waitFor(`the ${team} key at a worker`, async () => ((await e2b(w, 'GET', '/v2/sandboxes', key)).status === 200 ? true : undefined), 5_000, 10);
  }
  return key;
}

const checker = new OpenApiChecker(new URL('../docs/openapi.yaml', import.meta.url).pathname);

/** An E2B call as the SDK makes it (X-API-KEY, JSON body), its answer checked against docs/openapi.yaml. */
async function e2b(target: { url: string }, method: string, path: string, key: string | undefined, json?: unknown): Promise<ApiResponse> {
  const res = await call(target, method, path, { headers: key === undefined ? {} : { 'x-api-key': key }, ...(json === undefined ? {} : { json }) });
  checker.check(method, path, res);
  return res;
}

function errorOf(res: ApiResponse, status: number): E2bError {
  assert.equal(res.status, status, res.text);
  assert.equal(res.headers.get('content-type'), 'application/json', 'E2B errors are plain JSON, not problem+json');
  const body = res.json as E2bError;
  assert.equal(body.code, status, 'the status, as a number, in code');
  assert.equal(typeof body.message, 'string');
  return body;
}

function live(templates: Record<string, number>): LiveCluster {
  return { healthy: true, templates, heartbeatAt: 1, pools: {} };
}

test('E2B creates and lists at the hub', async (t) => {
  const w1 = await startWorkerFixture((fn) => t.after(fn));
  const w2 = await startWorkerFixture((fn) => t.after(fn));
  const busy = await startBusyCluster(t);
  const { store } = await hubStoreWithCluster(t, { apiUrl: w1.url });
  const register = (name: string, tag: string, apiUrl: string): Promise<unknown> =>
    store.create(ClusterType, { apiVersion: 'asb.dev/v1alpha1', kind: 'Cluster', metadata: { name }, spec: { region: 'r', ingressAddress: '127.0.0.1:1', tag, credentialHash: 'x', apiUrl } });
  await register('c2', 'cc02', w2.url);
  await register('busy', 'busy', busy.url);
  await register('gone', 'gone', `http://127.0.0.1:${await freePort()}`);

  // What placement reads: every cluster connected and healthy; more warm sandboxes first.
  const liveView = new Map<string, LiveCluster>([
    ['busy', live({ 'default/base': 9 })],
    ['gone', live({ 'default/base': 8 })],
    ['c1', live({ 'default/base': 2 })],
    ['c2', live({ 'default/base': 1, 'default/py': 0 })],
  ]);
  // Acks the test sends: which hub version each connected cluster has applied.
  const applied: { cluster: string; appliedVersion: number }[] = [];
  const ackListeners = new Set<(cluster: string, version: number) => void>();
  const ack = (cluster: string, version: number): void => {
    for (const c of applied) if (c.cluster === cluster) c.appliedVersion = version;
    for (const listener of ackListeners) listener(cluster, version);
  };
  const sync: SyncView = {
    version: () => 0,
    connections: () => applied,
    live: () => liveView,
    onAck: (listener) => {
      ackListeners.add(listener);
      return () => ackListeners.delete(listener);
    },
  };
  const keyRing = await KeyRing.open({ store, log: silentLogger() });
  t.after(() => keyRing.close());
  const registry = new Registry();
  const api = createHubApi({ store, auth: keyRing, log: silentLogger(), registry, sync, placement: { connectTimeoutMs: 2_000 } });
  const server = createServer(api.handler);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => {
    server.closeAllConnections();
    server.close();
    api.close();
  });
  const hub = { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
  const teamA = await sharedKey(store, 'team-a', [w1, w2]);
  const teamB = await sharedKey(store, 'team-b', [w1, w2]);

  await t.test('a create is placed in placement order, failing over past a 503 and a closed port, at both paths', async () => {
    for (const path of ['/v2/sandboxes', '/sandboxes']) {
      const before = busy.seen.length;
      const body = { templateID: 'base', metadata: { via: path }, timeout: 60, secure: true };
      const res = await e2b(hub, 'POST', path, teamA, body);
      assert.equal(res.status, 201, res.text);
      assert.equal(res.headers.get('x-asb-cluster'), 'c1', 'busy and gone were tried first and skipped');
      const id = (res.json as { sandboxID: string }).sandboxID;
      assert.equal((await e2b(w1, 'GET', `/sandboxes/${id}`, teamA)).status, 200, 'the sandbox is in c1, the caller\'s');
      const info = (await e2b(w1, 'GET', `/sandboxes/${id}`, teamA)).json as Listed;
      assert.deepEqual(info.metadata, { via: path }, 'the body reached the worker as sent');
      const tried = busy.seen.slice(before);
      assert.deepEqual(tried.map((r) => `${r.method} ${r.url}`), [`POST ${path}`], 'the same path at the busy cluster');
      const [first] = tried;
      assert.ok(first !== undefined);
      assert.equal(first.apiKey, teamA, 'with the caller\'s own key');
      assert.deepEqual(JSON.parse(first.body), body, 'and the body unchanged');
    }
    const metrics = await registry.metrics();
    assert.match(metrics, /asb_hub_placement_failovers_total\{cluster="busy"\} 2/);
    assert.match(metrics, /asb_hub_placement_failovers_total\{cluster="gone"\} 2/);
    assert.match(metrics, /asb_hub_placements_total\{result="created",cluster="c1"\} 2/);
  });

  await t.test('templateID decides placement: a template only c2 holds is created there; c1 disconnected, base goes to c2', async (st) => {
    await w2.store.create(SandboxTemplateType, { ...structuredClone(BASE_TEMPLATE), metadata: { name: 'py', namespace: 'default' } });
    const py = await e2b(hub, 'POST', '/v2/sandboxes', teamA, { templateID: 'py' });
    assert.equal(py.status, 201, py.text);
    assert.equal(py.headers.get('x-asb-cluster'), 'c2');
    assert.equal((py.json as { templateID: string }).templateID, 'py');

    const c1 = liveView.get('c1');
    liveView.delete('c1');
    st.after(() => liveView.set('c1', c1 ?? live({})));
    const base = await e2b(hub, 'POST', '/sandboxes', teamA, {});
    assert.equal(base.status, 201, base.text);
    assert.equal(base.headers.get('x-asb-cluster'), 'c2', 'no templateID is base');
  });

  await t.test('a template applied at the hub and used at once: the create waits for the cluster to apply it, not for its next heartbeat', async (st) => {
    st.after(() => applied.splice(0));
    const fresh = (name: string): SandboxTemplate => ({ ...structuredClone(BASE_TEMPLATE), metadata: { name, namespace: 'default' } });
    const first = Number((await store.create(SandboxTemplateType, fresh('fresh'))).metadata.resourceVersion);
    // c2 is connected, its last heartbeat from before the template, and has not applied it yet.
    applied.push({ cluster: 'c2', appliedVersion: first - 1 });
    const creating = e2b(hub, 'POST', '/v2/sandboxes', teamA, { templateID: 'fresh' });
    await waitFor('the create to wait for c2', () => Promise.resolve(ackListeners.size > 0 ? true : undefined));
    await w2.store.create(SandboxTemplateType, fresh('fresh'));
    ack('c2', first);
    const res = await creating;
    assert.equal(res.status, 201, res.text);
    assert.equal(res.headers.get('x-asb-cluster'), 'c2');
    assert.equal(ackListeners.size, 0, 'the create stopped listening');

    // A cluster that never applies it: the wait is bounded, then the answer names why.
    const second = Number((await store.create(SandboxTemplateType, fresh('fresh-2'))).metadata.resourceVersion);
    assert.ok(second > first);
    const never = await e2b(hub, 'POST', '/v2/sandboxes', teamA, { templateID: 'fresh-2' });
    assert.match(errorOf(never, 503).message, /c2: no template default\/fresh-2/);
    assert.equal(ackListeners.size, 0);
  });

  await t.test('a create from a snapshot id goes only to the cluster whose tag starts the id, where the snapshot is', async () => {
    // c2 (tag cc02) holds no such snapshot: its own answer comes back, not the hub's "no template".
    const res = await e2b(hub, 'POST', '/v2/sandboxes', teamA, { templateID: 'cc02abcdefghijklmnop' });
    assert.equal(res.headers.get('x-asb-cluster'), 'c2', res.text);
    assert.doesNotMatch(res.text, /no cluster could take/);
    assert.equal(busy.seen.filter((r) => r.body.includes('cc02abcdefghijklmnop')).length, 0, 'no other cluster was tried');
    // A tag no cluster has: placed as a template name, which no cluster holds.
    const unknown = await e2b(hub, 'POST', '/v2/sandboxes', teamA, { templateID: 'zz99abcdefghijklmnop' });
    assert.match(errorOf(unknown, 503).message, /no template default\/zz99abcdefghijklmnop/);
  });

  await t.test('a worker\'s own refusal is the answer, passed on as it came', async () => {
    const res = await e2b(hub, 'POST', '/v2/sandboxes', teamA, { templateID: 'base', volumeMounts: [{ name: 'data', path: '/data' }] });
    assert.match(errorOf(res, 400).message, /volumeMounts are not supported/);
    assert.equal(res.headers.get('x-asb-cluster'), 'c1');
  });

  await t.test('errors the hub finds itself are E2B-shaped: no cluster can take it, bad body, bad key', async () => {
    const nowhere = await e2b(hub, 'POST', '/v2/sandboxes', teamA, { templateID: 'nowhere' });
    const message = errorOf(nowhere, 503).message;
    assert.match(message, /no cluster could take a sandbox of template default\/nowhere/);
    for (const name of ['busy', 'gone', 'c1', 'c2']) assert.match(message, new RegExp(`${name}: no template default/nowhere`));

    const saved = new Map(liveView);
    liveView.delete('c1');
    liveView.delete('c2');
    const down = await e2b(hub, 'POST', '/sandboxes', teamA, { templateID: 'base' });
    for (const [k, v] of saved) liveView.set(k, v);
    const why = errorOf(down, 503).message;
    for (const reason of ['c1: down', 'c2: down', 'busy: answered 503: busy: no capacity right now', 'gone: unreachable: could not connect to']) assert.ok(why.includes(reason), `"${reason}" in ${why}`);

    const badTemplate = await e2b(hub, 'POST', '/v2/sandboxes', teamA, { templateID: 5 });
    assert.match(errorOf(badTemplate, 400).message, /templateID: must be a string/);
    assert.match(errorOf(await e2b(hub, 'POST', '/v2/sandboxes', teamA, [1]), 400).message, /must be a JSON object/);
    const notJson = await call(hub, 'POST', '/sandboxes', { headers: { 'x-api-key': teamA, 'content-type': 'application/json' }, body: '{"templateID":' });
    assert.match(errorOf(notJson, 400).message, /not valid JSON/);
    const wrongType = await call(hub, 'POST', '/sandboxes', { headers: { 'x-api-key': teamA, 'content-type': 'text/plain' }, body: '{}' });
    errorOf(wrongType, 415);

    for (const [method, path] of [['POST', '/v2/sandboxes'], ['GET', '/v2/sandboxes'], ['POST', '/sandboxes'], ['GET', '/sandboxes']] as const) {
      assert.match(errorOf(await e2b(hub, method, path, undefined, method === 'POST' ? {} : undefined), 401).message, /no API key.*this hub/);
      const bad = await e2b(hub, method, path, 'asb_zzzzzzzz_zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz', method === 'POST' ? {} : undefined);
      assert.match(errorOf(bad, 401).message, /unknown to the hub/);
      assert.equal(bad.headers.get('x-asb-cluster'), null, 'no worker was asked');
    }
  });

  await t.test('a list merges every cluster in the asked order, pages by limit across clusters, and names clusters that did not answer', async () => {
    // Five sandboxes, alternating clusters, so the two clusters' start times interleave.
    const created: string[] = [];
    for (const w of [w1, w2, w1, w2, w1]) {
      const res = await e2b(w, 'POST', '/v2/sandboxes', teamA, { templateID: 'base', metadata: { suite: 'paging' } });
      assert.equal(res.status, 201, res.text);
      created.push((res.json as { sandboxID: string }).sandboxID);
    }
    await e2b(w2, 'POST', '/v2/sandboxes', teamB, { templateID: 'base', metadata: { suite: 'paging' } });
    const filter = `metadata=${encodeURIComponent('suite=paging')}`;

    for (const path of ['/v2/sandboxes', '/sandboxes']) {
      const all = await e2b(hub, 'GET', `${path}?${filter}`, teamA);
      assert.equal(all.status, 200, all.text);
      const items = all.json as Listed[];
      assert.deepEqual(items.map((i) => i.sandboxID).sort(), [...created].sort(), 'both clusters, only team-a');
      const keys = items.map((i) => [Date.parse(i.startedAt), i.sandboxID] as const);
      const sorted = [...keys].sort((a, b) => (b[0] - a[0]) || (a[1] < b[1] ? 1 : -1));
      assert.deepEqual(keys, sorted, 'newest first, as one worker would list them');
      assert.equal(all.headers.get('x-next-token'), null, 'one page');
      assert.deepEqual(all.headers.get('x-asb-unreachable')?.split(',').sort(), ['busy', 'gone']);
    }

    // limit 1 also leaves a cluster with nothing used on a later page: it must resume where it was.
    for (const [limit, sizes] of [[2, [2, 2, 1]], [1, [1, 1, 1, 1, 1]]] as const) {
      for (const order of ['desc', 'asc']) {
        const whole = ((await e2b(hub, 'GET', `/v2/sandboxes?${filter}&order=${order}`, teamA)).json as Listed[]).map((i) => i.sandboxID);
        const paged: string[][] = [];
        let token: string | null = null;
        for (let page = 0; page < 10; page++) {
          const res = await e2b(hub, 'GET', `/v2/sandboxes?${filter}&order=${order}&limit=${limit}${token === null ? '' : `&nextToken=${encodeURIComponent(token)}`}`, teamA);
          assert.equal(res.status, 200, res.text);
          paged.push((res.json as Listed[]).map((i) => i.sandboxID));
          token = res.headers.get('x-next-token');
          if (token === null) break;
        }
        assert.deepEqual(paged.map((p) => p.length), sizes, `${order}, limit ${limit}: pages of at most limit across both clusters`);
        assert.deepEqual(paged.flat(), whole, `${order}, limit ${limit}: the pages, in turn, are the whole list: nothing twice, nothing missed`);
      }
    }

    const teamBList = (await e2b(hub, 'GET', `/v2/sandboxes?${filter}`, teamB)).json as Listed[];
    assert.equal(teamBList.length, 1, 'team-b sees its own only');
    assert.deepEqual((await e2b(hub, 'GET', `/v2/sandboxes?${filter}&state=paused`, teamA)).json, [], 'the state filter reached the workers');
  });

  await t.test('list errors: a bad nextToken or limit from the hub; a query every worker refuses, as they refused it', async () => {
    assert.match(errorOf(await e2b(hub, 'GET', '/v2/sandboxes?nextToken=nope', teamA), 400).message, /nextToken is not a token from a list at the hub/);
    assert.match(errorOf(await e2b(hub, 'GET', '/sandboxes?limit=0', teamA), 400).message, /limit must be an integer from 1 to 1000/);
    const badState = await e2b(hub, 'GET', '/v2/sandboxes?state=sleeping', teamA);
    assert.match(errorOf(badState, 400).message, /state must be running, paused or both/);
    assert.ok(['c1', 'c2'].includes(badState.headers.get('x-asb-cluster') ?? ''), 'a worker said it');

    liveView.clear();
    const none = await e2b(hub, 'GET', '/v2/sandboxes', teamA);
    assert.equal(none.status, 200, 'no cluster connected: an empty list, not an error');
    assert.deepEqual(none.json, []);
    assert.match(errorOf(await e2b(hub, 'GET', '/v2/sandboxes?order=newest', teamA), 400).message, /order must be asc or desc, got "newest"/, 'refused by the hub itself, with no worker to ask');
    assert.deepEqual(none.headers.get('x-asb-unreachable')?.split(',').sort(), ['busy', 'c1', 'c2', 'gone']);
  });
});
