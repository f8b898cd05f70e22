// The federation end to end, as `make up` runs it: a hub process and two clusters, each with
// its own worker (store, runtime), router and Envoy. Clients talk only to an edge: creates are
// placed by the hub, and any edge reaches any sandbox (the owner's ingress routes it again,
// over mutual TLS). Then one cluster dies, and comes back.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import WebSocket from 'ws';
import type { FederatedCluster } from '../src/assembly/federation.ts';
import { startTestFederation, type TestFederation } from './support/federation.ts';
import { runAsb } from './support/run-asb.ts';
import { waitFor } from './support/wait.ts';
import { edgeGet, slowListenTemplate, startWsEcho, WEB_TEMPLATE, webPool, type EdgeAnswer } from './support/web-sandbox.ts';

interface View {
  id: string;
  cluster: string;
  ready: boolean;
  phase: string;
  accessToken: string;
}

interface Answer<T = unknown> {
  status: number;
  body: T;
  headers: Headers;
}

/** A JSON call with the hub's admin key (synced everywhere) to an edge, a worker or the hub. */
async function call<T = unknown>(fed: TestFederation, base: string, method: string, path: string, body?: unknown): Promise<Answer<T>> {
  const res = await fetch(`${base}${path}`, {
    method,
    headers: { authorization: `Bearer ${fed.adminKey}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(20_000),
  });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // not JSON: keep the text
  }
  return { status: res.status, body: parsed as T, headers: res.headers };
}

/** A GET through a cluster's edge for a sandbox host. */
function viaEdge(edge: FederatedCluster, host: string, headers: Record<string, string> = {}, path = '/', timeoutMs = 20_000): Promise<EdgeAnswer> {
  return edgeGet(edge.edgeUrl, host, { headers, path, timeoutMs });
}

function asbEnv(fed: TestFederation, edge: FederatedCluster): Record<string, string> {
  return { ASB_API_URL: edge.edgeUrl, ASB_API_KEY: fed.adminKey, ASB_HUB_URL: fed.hubUrl, ASB_HUB_KEY: fed.adminKey };
}

function clusterNamed(fed: TestFederation, name: string): FederatedCluster {
  const c = fed.clusters.find((x) => x.clusterName === name);
  assert.ok(c !== undefined, `cluster ${name} is running`);
  return c;
}

async function readyPools(fed: TestFederation, replicas: number): Promise<void> {
  for (const c of fed.clusters) {
    const applied = await call(fed, c.apiUrl, 'POST', '/v1/apply', { objects: [webPool(replicas)] });
    assert.equal(applied.status, 200, JSON.stringify(applied.body));
  }
  for (const c of fed.clusters) {
    await waitFor(`${c.clusterName}'s web pool to be ready`, async () => {
      const s = await call<{ pools: { name: string; readyReplicas: number }[] }>(fed, c.apiUrl, 'GET', '/v1/status');
      return s.body.pools.some((p) => p.name === 'web' && p.readyReplicas >= replicas) ? true : undefined;
    });
  }
}

test('a federation of two clusters: placement, any edge reaches any sandbox, a cluster dies and comes back', { timeout: 280_000 }, async (t) => {
  const fed = await startTestFederation([
    ['fed-a', 'fdra', 13],
    ['fed-b', 'fdrb', 14],
  ]);
  t.after(() => fed.cleanup());
  const a = clusterNamed(fed, 'fed-a');

  // The template is applied once, at the hub; it reaches both clusters by sync.
  const template = await call(fed, fed.hubUrl, 'POST', '/v1/apply', { objects: [WEB_TEMPLATE] });
  assert.equal(template.status, 200, JSON.stringify(template.body));
  for (const c of fed.clusters) {
    await waitFor(`the web template at ${c.clusterName}`, async () => ((await call(fed, c.apiUrl, 'GET', '/v1/templates/web')).status === 200 ? true : undefined));
  }
  await readyPools(fed, 2);

  let inB: View | undefined;
  await t.test('asb status lists every cluster with its health, sync version and lag', async () => {
    const out = await waitFor('both clusters healthy with no lag', async () => {
      const run = await runAsb(['status'], { env: asbEnv(fed, a) });
      assert.equal(run.code, 0, run.stderr);
      return /fed-a\s+fed-a\s+healthy\s+\d+\s+0\b/.test(run.stdout) && /fed-b\s+fed-b\s+healthy\s+\d+\s+0\b/.test(run.stdout) ? run.stdout : undefined;
    });
    assert.match(out, /CLUSTER\s+REGION\s+HEALTH\s+SYNC VERSION\s+LAG/);
  });

  await t.test('a create at one edge with a region preference is placed in that region', async () => {
    const created = await call<View>(fed, a.edgeUrl, 'POST', '/v1/sandboxes', { template: 'web', region: 'fed-b' });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    assert.equal(created.body.cluster, 'fed-b', JSON.stringify(created.body));
    assert.ok(created.body.id.startsWith('fdrb'), `the id carries fed-b's tag: ${created.body.id}`);
    assert.equal(created.headers.get('x-asb-cluster'), 'fed-b');
    inB = created.body;

    const cli = await runAsb(['create', '--template', 'web', '--region', 'fed-a', '--json'], { env: asbEnv(fed, a) });
    assert.equal(cli.code, 0, cli.stderr);
    const viaCli = JSON.parse(cli.stdout) as View;
    assert.equal(viaCli.cluster, 'fed-a');
    assert.ok(viaCli.id.startsWith('fdra'));
  });

  await t.test("any edge reaches any sandbox over HTTP, and only with the sandbox's token", async () => {
    assert.ok(inB !== undefined);
    const host = `8080-${inB.id}.asb.localhost`;
    for (const edge of fed.clusters) {
      const ok = await viaEdge(edge, host, { 'x-access-token': inB.accessToken }, '/whoami.txt');
      assert.equal(ok.status, 200, `through ${edge.clusterName}'s edge: ${ok.body}`);
      assert.equal(ok.body.trim(), inB.id, 'the sandbox in fed-b answered');
      const refused = await viaEdge(edge, host, {}, '/whoami.txt');
      assert.equal(refused.status, 401, `no token through ${edge.clusterName}'s edge`);
    }
    // The API of a sandbox in fed-b, through fed-a's edge.
    const got = await call<View>(fed, a.edgeUrl, 'GET', `/v1/sandboxes/${inB.id}`);
    assert.equal(got.status, 200, JSON.stringify(got.body));
    assert.equal(got.body.phase, 'Running');
    const exec = await runAsb(['exec', inB.id, '--', 'cat', '/tmp/whoami.txt'], { env: asbEnv(fed, a) });
    assert.equal(exec.code, 0, exec.stderr);
    assert.equal(exec.stdout.trim(), inB.id);
    // A list at an edge shows the sandboxes of both clusters.
    const listed = await call<{ items: View[] }>(fed, a.edgeUrl, 'GET', '/v1/sandboxes');
    assert.equal(listed.status, 200, JSON.stringify(listed.body));
    const clusters = new Set(listed.body.items.map((s) => s.id.slice(0, 4)));
    assert.ok(clusters.has('fdra') && clusters.has('fdrb'), `both clusters listed: ${[...clusters].join(', ')}`);
  });

  await t.test("a WebSocket through one cluster's edge reaches a sandbox in the other", async () => {
    assert.ok(inB !== undefined);
    const b = clusterNamed(fed, 'fed-b');
    await startWsEcho({ apiUrl: b.apiUrl, adminKey: fed.adminKey }, inB.id, 8765);
    const ws = new WebSocket(`ws://127.0.0.1:${new URL(a.edgeUrl).port}/`, { headers: { host: `8765-${inB.id}.asb.localhost`, 'x-access-token': inB.accessToken } });
    t.after(() => ws.terminate());
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('error', reject);
    });
    const echoed = new Promise<string>((resolve) => ws.once('message', (data: Buffer) => resolve(data.toString())));
    ws.send('across clusters');
    assert.equal(await echoed, 'across clusters');
    ws.close();
  });

  // The held wake across the federation (a request released before the server listened got a 503):
  // the owning cluster's router holds the request that came in on its ingress listener until the
  // woken pod's port accepts, as on its own edge.
  await t.test("through another cluster's edge, a paused sandbox whose server listens late wakes with one 200", async () => {
    const applied = await call(fed, fed.hubUrl, 'POST', '/v1/apply', { objects: [slowListenTemplate('slow', 1.5)] });
    assert.equal(applied.status, 200, JSON.stringify(applied.body));
    const b = clusterNamed(fed, 'fed-b');
    await waitFor('the slow template at fed-b', async () => ((await call(fed, b.apiUrl, 'GET', '/v1/templates/slow')).status === 200 ? true : undefined));
    const created = await call<View>(fed, a.edgeUrl, 'POST', '/v1/sandboxes', { template: 'slow', cluster: 'fed-b', wait: true });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const sb = created.body;
    const host = `8000-${sb.id}.asb.localhost`;
    await waitFor('its server to listen after create', async () => ((await viaEdge(a, host, { 'x-access-token': sb.accessToken })).status === 200 ? true : undefined), 30_000, 100);
    assert.equal((await call(fed, a.edgeUrl, 'POST', `/v1/sandboxes/${sb.id}/pause`)).status, 200);
    await waitFor('hibernation', async () => ((await call<View>(fed, b.apiUrl, 'GET', `/v1/sandboxes/${sb.id}`)).body.phase === 'Hibernated' ? true : undefined));
    const answers = await Promise.all([1, 2].map(() => viaEdge(a, host, { 'x-access-token': sb.accessToken }, '/whoami.txt', 28_000)));
    for (const answer of answers) {
      assert.equal(answer.status, 200, answer.body);
      assert.equal(answer.body.trim(), sb.id);
    }
  });

  await t.test('a cluster that dies: its sandboxes get 503 at once, placement avoids it, the other cluster serves on', async () => {
    assert.ok(inB !== undefined);
    const b = clusterNamed(fed, 'fed-b');
    const inA = await call<View>(fed, a.edgeUrl, 'POST', '/v1/sandboxes', { template: 'web', region: 'fed-a' });
    assert.equal(inA.status, 201, JSON.stringify(inA.body));
    // First its worker alone (kill -9): the API for its sandboxes answers 503 at once, while its
    // running sandboxes keep serving through its router and Envoy, which still run.
    await b.worker.kill();
    const api = await call(fed, a.edgeUrl, 'GET', `/v1/sandboxes/${inB.id}`);
    assert.equal(api.status, 503, JSON.stringify(api.body));
    const served = await viaEdge(a, `8080-${inB.id}.asb.localhost`, { 'x-access-token': inB.accessToken }, '/whoami.txt');
    assert.equal(served.status, 200, 'a running sandbox outlives its control plane');
    // Then the rest of the cluster.
    await b.router.kill();
    b.envoy.destroy();

    // Not held until some timeout: the edge cannot connect to fed-b's ingress and says so.
    const gone = await viaEdge(a, `8080-${inB.id}.asb.localhost`, { 'x-access-token': inB.accessToken }, '/whoami.txt', 5_000);
    assert.equal(gone.status, 503, gone.body);

    // A create preferring fed-b fails over to fed-a; so does one that names no region.
    const placed = await waitFor('the hub to place around fed-b', async () => {
      const r = await call<View>(fed, a.edgeUrl, 'POST', '/v1/sandboxes', { template: 'web', region: 'fed-b' });
      return r.status === 201 ? r : undefined;
    });
    assert.equal(placed.body.cluster, 'fed-a');
    const named = await call<{ detail?: string }>(fed, a.edgeUrl, 'POST', '/v1/sandboxes', { template: 'web', cluster: 'fed-b' });
    assert.equal(named.status, 503, JSON.stringify(named.body));
    assert.match(JSON.stringify(named.body), /fed-b/);

    const stillA = await viaEdge(a, `8080-${inA.body.id}.asb.localhost`, { 'x-access-token': inA.body.accessToken }, '/whoami.txt');
    assert.equal(stillA.status, 200, 'fed-a is unaffected');
    const status = await waitFor('asb status to show fed-b down', async () => {
      const run = await runAsb(['status'], { env: asbEnv(fed, a) });
      return /fed-b\s+fed-b\s+down/.test(run.stdout) ? run.stdout : undefined;
    });
    assert.match(status, /fed-a\s+fed-a\s+healthy/);
  });

  await t.test('the dead cluster returns: it resyncs what changed meanwhile and serves its sandboxes again', async () => {
    assert.ok(inB !== undefined);
    const key = await call<{ key: string }>(fed, fed.hubUrl, 'POST', '/v1/keys', { team: 'late-team' });
    assert.equal(key.status, 201, JSON.stringify(key.body));
    const b = await fed.restart('fed-b');
    await waitFor('the key made while fed-b was down to work there', async () => {
      const r = await fetch(`${b.apiUrl}/v1/sandboxes`, { headers: { authorization: `Bearer ${key.body.key}` } });
      await r.body?.cancel();
      return r.status === 200 ? true : undefined;
    });
    const back = await waitFor("fed-b's sandbox through fed-a's edge", async () => {
      const r = await viaEdge(a, `8080-${inB?.id ?? ''}.asb.localhost`, { 'x-access-token': inB?.accessToken ?? '' }, '/whoami.txt');
      return r.status === 200 ? r : undefined;
    });
    assert.equal(back.body.trim(), inB.id);
    const placed = await waitFor('placement to use fed-b again', async () => {
      const r = await call<View>(fed, a.edgeUrl, 'POST', '/v1/sandboxes', { template: 'web', cluster: 'fed-b' });
      return r.status === 201 ? r : undefined;
    });
    assert.ok(placed.body.id.startsWith('fdrb'));
  });
});
