// Placement at the hub: the pure ordering rules of place(), the sync server's live view and ack
// hook, and POST/GET /v1/sandboxes at a real hub in front of two real worker processes (own
// bridges asbplca/asbplcb, subnets 10.24/10.25), through region preference, failover past a
// cluster whose API refuses connections, drain, kill -9 of a worker and its return.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { WebSocket } from 'ws';
import { HEARTBEAT_MS, type PlacementCandidate } from '../src/api/hub-contract.ts';
import { startHub, type RunningHub } from '../src/hub/hub.ts';
import { parseHubConfig } from '../src/hub/hub-config.ts';
import { place } from '../src/hub/placement.ts';
import { createSyncServer } from '../src/hub/sync-server.ts';
import { systemClock } from '../src/base/clock.ts';
import { freePort } from '../src/assembly/local-system.ts';
import { silentLogger } from '../src/base/log.ts';
import { OpenApiChecker } from './support/openapi-check.ts';
import { runAsb } from './support/run-asb.ts';
import { waitFor } from './support/wait.ts';
import { hubStoreWithCluster, serveUpgrades } from './support/hub-unit.ts';
import { call, type ApiResponse } from './support/worker-fixture.ts';
import { removeDataDir, startWorkerProcess, type WorkerProcess } from './support/worker-process.ts';

// ---- place(): one test per rule

function candidate(name: string, over: Partial<PlacementCandidate> = {}): PlacementCandidate {
  return { name, region: 'east', drain: false, healthy: true, templates: { 'default/base': 0 }, ...over };
}

const BASE = { namespace: 'default', template: 'base' };

test('place: drained, down and template-less clusters are skipped, each with its reason', () => {
  const result = place(BASE, [
    candidate('a'),
    candidate('b', { drain: true }),
    candidate('c', { healthy: false }),
    candidate('d', { templates: { 'default/other': 3 } }),
    candidate('e', { drain: true, healthy: false }),
  ]);
  assert.deepEqual(result.order, ['a']);
  assert.deepEqual(result.skipped, [
    { cluster: 'b', reason: 'drained' },
    { cluster: 'c', reason: 'down' },
    { cluster: 'd', reason: 'no template default/base' },
    { cluster: 'e', reason: 'drained' },
  ]);
});

test('place: the template is matched in its namespace', () => {
  const result = place({ namespace: 'team', template: 'base' }, [candidate('a'), candidate('b', { templates: { 'team/base': 0 } })]);
  assert.deepEqual(result.order, ['b']);
  assert.deepEqual(result.skipped, [{ cluster: 'a', reason: 'no template team/base' }]);
});

test('place: a built template\'s name:tag goes to a cluster that holds the name (its worker resolves the tag)', () => {
  const result = place({ namespace: 'default', template: 'my-env:v1' }, [candidate('a'), candidate('b', { templates: { 'default/my-env': 0 } })]);
  assert.deepEqual(result.order, ['b']);
  assert.deepEqual(result.skipped, [{ cluster: 'a', reason: 'no template default/my-env' }]);
});

test('place: the preferred region comes first, even with fewer warm sandboxes; other regions are the failover', () => {
  const result = place({ ...BASE, region: 'west' }, [candidate('a', { templates: { 'default/base': 9 } }), candidate('b', { region: 'west' }), candidate('c', { region: 'west', templates: { 'default/base': 1 } })]);
  assert.deepEqual(result.order, ['c', 'b', 'a']);
  assert.deepEqual(result.skipped, []);
});

test('place: warm capacity first, more warm first, then by name', () => {
  const result = place(BASE, [
    candidate('zulu', { templates: { 'default/base': 0 } }),
    candidate('alpha', { templates: { 'default/base': 0 } }),
    candidate('mike', { templates: { 'default/base': 2 } }),
    candidate('bravo', { templates: { 'default/base': 5 } }),
    candidate('kilo', { templates: { 'default/base': 2 } }),
  ]);
  assert.deepEqual(result.order, ['bravo', 'kilo', 'mike', 'alpha', 'zulu']);
  assert.deepEqual(place(BASE, [candidate('b'), candidate('a')]).order, ['a', 'b'], 'the same inputs in another order give the same order');
});

test('place: a named cluster is the only one tried, and is skipped when it cannot take the sandbox', () => {
  const named = place({ ...BASE, cluster: 'b' }, [candidate('a', { templates: { 'default/base': 9 } }), candidate('b')]);
  assert.deepEqual(named.order, ['b']);
  assert.deepEqual(named.skipped, [{ cluster: 'a', reason: 'not the named cluster' }]);

  const down = place({ ...BASE, cluster: 'b' }, [candidate('a'), candidate('b', { healthy: false })]);
  assert.deepEqual(down.order, []);
  assert.deepEqual(down.skipped, [
    { cluster: 'a', reason: 'not the named cluster' },
    { cluster: 'b', reason: 'down' },
  ]);
});

// ---- the sync server's live view and ack hook, with a worker spoken by hand

test('sync server: live() holds what each connected cluster last reported and drops it when its socket closes; onAck sees every ack', async (t) => {
  const { store, credential } = await hubStoreWithCluster(t);
  // A heartbeat interval far beyond this test: only the socket's close can remove the cluster.
  const sync = createSyncServer({ store, log: silentLogger(), clock: systemClock, heartbeatMs: 600_000 });
  const port = await serveUpgrades(t, sync);
  const acks: [string, number][] = [];
  const off = sync.onAck((cluster, version) => acks.push([cluster, version]));

  const ws = new WebSocket(`ws://127.0.0.1:${port}/v1/sync`, { headers: { authorization: `Bearer ${credential}` } });
  t.after(() => ws.terminate());
  const snapshot = new Promise<{ version: number }>((resolve) => ws.on('message', (data: Buffer) => {
    const msg = JSON.parse(data.toString()) as { type: string; version: number };
    if (msg.type === 'snapshot') resolve(msg);
  }));
  await new Promise<void>((resolve) => ws.once('open', () => resolve()));
  ws.send(JSON.stringify({ type: 'hello', cluster: 'c1', lastVersion: 0 }));
  const { version } = await snapshot;
  assert.equal(sync.live().size, 0, 'a cluster enters the live view with its first heartbeat');

  ws.send(JSON.stringify({ type: 'heartbeat', warm: { 'default/base': 2 }, healthy: true, templates: { 'default/base': 2, 'default/py': 0, 'default/bad': -1 } }));
  const entry = await waitFor('the heartbeat in the live view', () => Promise.resolve(sync.live().get('c1')), 5_000, 10);
  assert.equal(entry.healthy, true);
  assert.deepEqual(entry.templates, { 'default/base': 2, 'default/py': 0 }, 'a negative count is not a count');
  ws.send(JSON.stringify({ type: 'heartbeat', warm: {}, healthy: false, templates: {} }));
  await waitFor('the second heartbeat to replace the first', () => Promise.resolve(sync.live().get('c1')?.healthy === false ? true : undefined), 5_000, 10);

  ws.send(JSON.stringify({ type: 'ack', version }));
  ws.send(JSON.stringify({ type: 'ack', version: version + 1000 }));
  await waitFor('both acks seen', () => Promise.resolve(acks.length >= 2 ? true : undefined), 5_000, 10);
  assert.deepEqual(acks, [['c1', version], ['c1', version]], 'an ack past what the hub sent is reported as what it sent');
  off();
  ws.send(JSON.stringify({ type: 'ack', version }));

  ws.terminate();
  await waitFor('the cluster to leave the live view when its socket closed', () => Promise.resolve(sync.live().has('c1') ? undefined : true), 5_000, 10);
  assert.equal(acks.length, 2, 'no ack reaches a listener after it unsubscribed');
});

// ---- a real hub and two real workers

interface View {
  id: string;
  cluster: string;
  owner: string;
  launchType: string;
}

interface Problem {
  code: string;
  detail: string;
  fields?: { field: string; message: string }[];
}

const checker = new OpenApiChecker(new URL('../docs/openapi.yaml', import.meta.url).pathname);

/** A call to the hub's /v1/sandboxes, its answer checked against docs/openapi.yaml. */
async function sandboxes(hub: RunningHub, method: 'POST' | 'GET', key: string | undefined, opts: { json?: unknown; query?: string } = {}): Promise<ApiResponse> {
  const path = `/v1/sandboxes${opts.query ?? ''}`;
  const res = await call(hub, method, path, { ...(key === undefined ? {} : { key }), ...(opts.json === undefined ? {} : { json: opts.json }) });
  checker.check(method, path, res);
  return res;
}

function problemOf(res: ApiResponse): Problem {
  assert.equal(res.headers.get('content-type'), 'application/problem+json', `a problem, got ${res.status} ${res.text}`);
  return res.json as Problem;
}

interface HubStatus {
  clusters: { name: string; connected: boolean; healthy?: boolean }[];
}

test('placement at a hub in front of two worker processes', { timeout: 240_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-placement-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const hub = await startHub(parseHubConfig(['--data-dir', join(dir, 'hub'), '--port', '0', '--admin-key-file', join(dir, 'admin.key')], {}), { log: silentLogger() });
  t.after(() => hub.close());
  const admin = hub.adminKey ?? '';
  const hubAdmin = async (method: string, path: string, json?: unknown): Promise<ApiResponse> => {
    const res = await call(hub, method, path, { key: admin, ...(json === undefined ? {} : { json }) });
    assert.ok(res.status < 300, `hub ${method} ${path}: ${res.status} ${res.text}`);
    return res;
  };

  const spec = { 'plc-a': { region: 'east', tag: 'plca', octet: 24 }, 'plc-b': { region: 'west', tag: 'plcb', octet: 25 } } as const;
  type Name = keyof typeof spec;
  const workers = {} as Record<Name, WorkerProcess>;
  const startCluster = async (name: Name, dataDir?: string): Promise<WorkerProcess> => {
    const { tag, octet } = spec[name];
    const w = await startWorkerProcess({
      clusterTag: tag,
      subnetOctet: octet,
      basePool: 1,
      ...(dataDir === undefined ? {} : { dataDir }),
      extraArgs: ['--cluster', name, '--hub-url', hub.url, '--hub-credential-file', join(dir, `${name}.credential`)],
    });
    await hubAdmin('PUT', `/v1/clusters/${name}`, { apiUrl: w.apiUrl });
    workers[name] = w;
    return w;
  };
  for (const name of Object.keys(spec) as Name[]) {
    const { region, tag, octet } = spec[name];
    const registered = await hubAdmin('PUT', `/v1/clusters/${name}`, { region, tag, ingressAddress: `127.0.0.1:${10_000 + octet}` });
    writeFileSync(join(dir, `${name}.credential`), `${(registered.json as { credential: string }).credential}\n`, { mode: 0o600 });
    await startCluster(name);
  }
  t.after(async () => {
    // Every worker stops before any directory goes: a directory that cannot go (a SIGKILLed
    // worker's mounts) must not leave the other worker running, which would keep this file alive.
    for (const w of Object.values(workers)) await w.stop();
    for (const w of Object.values(workers)) removeDataDir(w.dataDir);
  });
  const clusterState = async (name: string): Promise<HubStatus['clusters'][number] | undefined> => ((await hubAdmin('GET', '/v1/status')).json as HubStatus).clusters.find((c) => c.name === name);
  for (const name of Object.keys(spec)) {
    await waitFor(`${name} connected and healthy at the hub`, async () => {
      const s = await clusterState(name);
      return s?.connected === true && s.healthy === true ? true : undefined;
    });
  }

  await t.test('a create with a region preference lands in that region; the answer names the cluster', async () => {
    for (const [region, name] of [['west', 'plc-b'], ['east', 'plc-a']] as const) {
      const res = await sandboxes(hub, 'POST', admin, { json: { region } });
      assert.equal(res.status, 201, res.text);
      const view = res.json as View;
      assert.equal(res.headers.get('x-asb-cluster'), name);
      assert.equal(view.cluster, name);
      assert.ok(view.id.startsWith(spec[name].tag), `the id carries ${name}'s tag: ${view.id}`);
    }
  });

  await t.test('asb create --region goes through the hub and prints the cluster', async () => {
    const env = { ASB_API_URL: hub.url, ASB_API_KEY: admin };
    const json = await runAsb(['create', '--region', 'west', '--json'], { env });
    assert.equal(json.code, 0, json.stderr);
    assert.equal((JSON.parse(json.stdout) as View).cluster, 'plc-b');
    const plain = await runAsb(['create', '--cluster', 'plc-a', '--no-wait'], { env });
    assert.equal(plain.code, 0, plain.stderr);
    assert.match(plain.stdout, /^plca[a-z0-9]+ .* cluster plc-a\n$/);
  });

  await t.test('a template held by one cluster only is placed there, whatever the region', async () => {
    const template = { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxTemplate', metadata: { name: 'only-b', namespace: 'default' }, spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'agent-sandbox/base', command: ['sleep', 'infinity'] }] } } } };
    const applied = await call({ url: workers['plc-b'].apiUrl }, 'POST', '/v1/apply', { key: admin, json: { objects: [template] } });
    assert.equal(applied.status, 200, applied.text);
    // Read-your-writes: the apply was answered once the hub knew, so a create right after it
    // finds the template (it used to wait for plc-b's next heartbeat, up to 2 s).
    const res = await sandboxes(hub, 'POST', admin, { json: { template: 'only-b', region: 'east', wait: false } });
    assert.equal(res.status, 201, res.text);
    assert.equal(res.headers.get('x-asb-cluster'), 'plc-b');
    const named = await sandboxes(hub, 'POST', admin, { json: { template: 'only-b', cluster: 'plc-a' } });
    assert.equal(named.status, 503, named.text);
    assert.match(problemOf(named).detail, /plc-a: no template default\/only-b/);
  });

  await t.test('no key or a bad key: 401 from the hub itself', async () => {
    for (const key of [undefined, 'asb_zzzzzzzz_zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz', 'nonsense']) {
      for (const method of ['POST', 'GET'] as const) {
        const res = await sandboxes(hub, method, key, method === 'POST' ? { json: {} } : {});
        assert.equal(res.status, 401, `${method} with ${key ?? 'no key'}: ${res.text}`);
        assert.equal(problemOf(res).code, 'Unauthorized');
        assert.equal(res.headers.get('x-asb-cluster'), null, 'no worker was asked');
      }
    }
  });

  await t.test('bad bodies: 4xx naming the field, before any worker is asked', async () => {
    const unknown = await sandboxes(hub, 'POST', admin, { json: { template: 'base', regoin: 'east' } });
    assert.equal(unknown.status, 422, unknown.text);
    assert.deepEqual(problemOf(unknown).fields?.map((f) => f.field), ['regoin']);

    const badNames = await sandboxes(hub, 'POST', admin, { json: { region: 'East Coast', cluster: 'a/b', template: 'Base' } });
    assert.equal(badNames.status, 422, badNames.text);
    assert.deepEqual(problemOf(badNames).fields?.map((f) => f.field).sort(), ['cluster', 'region', 'template']);

    const region = await sandboxes(hub, 'POST', admin, { json: { region: 'mars' } });
    assert.equal(region.status, 400, region.text);
    assert.match(problemOf(region).detail, /region "mars".*known regions: east, west/);
    assert.equal(problemOf(region).fields?.[0]?.field, 'region');

    const cluster = await sandboxes(hub, 'POST', admin, { json: { cluster: 'plc-z' } });
    assert.equal(cluster.status, 404, cluster.text);
    assert.match(problemOf(cluster).detail, /plc-z/);

    const disagree = await sandboxes(hub, 'POST', admin, { json: { cluster: 'plc-a', region: 'west' } });
    assert.equal(disagree.status, 400, disagree.text);
    assert.match(problemOf(disagree).detail, /plc-a.*east/);
    for (const res of [unknown, badNames, region, cluster, disagree]) assert.equal(res.headers.get('x-asb-cluster'), null);
  });

  await t.test('a worker refuses a create for another cluster or region, pointing at the hub', async () => {
    const b = { url: workers['plc-b'].apiUrl };
    const other = await call(b, 'POST', '/v1/sandboxes', { key: admin, json: { cluster: 'plc-a' } });
    assert.equal(other.status, 400, other.text);
    assert.match(problemOf(other).detail, /cluster "plc-b", not "plc-a".*hub or an edge/);
    const elsewhere = await call(b, 'POST', '/v1/sandboxes', { key: admin, json: { region: 'east' } });
    assert.equal(elsewhere.status, 400, elsewhere.text);
    assert.match(problemOf(elsewhere).detail, /region "west", not "east"/);
    const own = await call(b, 'POST', '/v1/sandboxes', { key: admin, json: { region: 'west', cluster: 'plc-b', wait: false } });
    assert.equal(own.status, 201, own.text);
    assert.equal((own.json as View).cluster, 'plc-b');
  });

  await t.test("GET at the hub lists a team's sandboxes from both clusters, and not another team's", async () => {
    const one = ((await hubAdmin('POST', '/v1/keys', { team: 'team-one' })).json as { key: string }).key;
    const two = ((await hubAdmin('POST', '/v1/keys', { team: 'team-two' })).json as { key: string }).key;
    for (const w of Object.values(workers)) {
      for (const key of [one, two]) await waitFor('the team key to reach the worker', async () => ((await call({ url: w.apiUrl }, 'GET', '/v1/status', { key })).status === 200 ? true : undefined));
    }
    const mine: string[] = [];
    for (const cluster of ['plc-a', 'plc-b']) {
      const res = await sandboxes(hub, 'POST', one, { json: { cluster, wait: false } });
      assert.equal(res.status, 201, res.text);
      assert.equal((res.json as View).owner, 'team-one');
      mine.push((res.json as View).id);
    }
    const theirs = await sandboxes(hub, 'POST', two, { json: { wait: false } });
    assert.equal(theirs.status, 201, theirs.text);

    const listed = await sandboxes(hub, 'GET', one);
    assert.equal(listed.status, 200, listed.text);
    const body = listed.json as { items: View[]; unreachable?: unknown };
    assert.deepEqual(body.items.map((v) => v.id).sort(), [...mine].sort(), 'both clusters, only team-one');
    assert.deepEqual(body.items.map((v) => v.cluster).sort(), ['plc-a', 'plc-b']);
    assert.equal(body.unreachable, undefined, 'every cluster answered');
    const other = (await sandboxes(hub, 'GET', two)).json as { items: View[] };
    assert.deepEqual(other.items.map((v) => v.id), [(theirs.json as View).id]);

    // Pages of one per cluster, followed to the end (at most a few pages).
    const paged: string[] = [];
    let query = '?limit=1';
    for (let page = 0; page < 5; page++) {
      const res = await sandboxes(hub, 'GET', one, { query });
      assert.equal(res.status, 200, res.text);
      const p = res.json as { items: View[]; continue?: string };
      paged.push(...p.items.map((v) => v.id));
      if (p.continue === undefined) break;
      query = `?limit=1&continue=${encodeURIComponent(p.continue)}`;
    }
    assert.deepEqual(paged.sort(), [...mine].sort());
    const badToken = await sandboxes(hub, 'GET', one, { query: '?continue=nope' });
    assert.equal(badToken.status, 400, badToken.text);
    const badQuery = await sandboxes(hub, 'GET', one, { query: '?phase=Sleeping' });
    assert.equal(badQuery.status, 400, 'a query every worker refuses is refused as they said it');
    assert.match(problemOf(badQuery).detail, /phase/);
  });

  await t.test('a cluster whose API refuses connections while its sync is up: the create fails over and still answers 201', async (st) => {
    await hubAdmin('PUT', '/v1/clusters/plc-a', { apiUrl: `http://127.0.0.1:${await freePort()}` });
    st.after(() => hubAdmin('PUT', '/v1/clusters/plc-a', { apiUrl: workers['plc-a'].apiUrl }));
    assert.equal((await clusterState('plc-a'))?.connected, true, 'plc-a still syncs');

    const res = await sandboxes(hub, 'POST', admin, { json: { region: 'east' } });
    assert.equal(res.status, 201, res.text);
    assert.equal(res.headers.get('x-asb-cluster'), 'plc-b');
    assert.ok((res.json as View).id.startsWith('plcb'));
    const metrics = (await hubAdmin('GET', '/metrics')).text;
    assert.match(metrics, /asb_hub_placement_failovers_total\{cluster="plc-a"\} [1-9]/);
    assert.match(metrics, /asb_hub_placements_total\{result="created",cluster="plc-b"\} [1-9]/);

    const listed = await sandboxes(hub, 'GET', admin);
    const unreachable = (listed.json as { unreachable?: { cluster: string; reason: string }[] }).unreachable ?? [];
    assert.deepEqual(unreachable.map((u) => u.cluster), ['plc-a']);
    assert.match(unreachable[0]?.reason ?? '', /ECONNREFUSED/);

    const named = await sandboxes(hub, 'POST', admin, { json: { cluster: 'plc-a' } });
    assert.equal(named.status, 503, named.text);
    assert.match(problemOf(named).detail, /plc-a: unreachable/);
  });

  await t.test('a drained cluster gets no new sandboxes', async (st) => {
    await hubAdmin('PUT', '/v1/clusters/plc-b', { drain: true });
    st.after(() => hubAdmin('PUT', '/v1/clusters/plc-b', { drain: false }));
    for (let i = 0; i < 2; i++) {
      const res = await sandboxes(hub, 'POST', admin, { json: { region: 'west', wait: false } });
      assert.equal(res.status, 201, res.text);
      assert.equal(res.headers.get('x-asb-cluster'), 'plc-a');
    }
    const named = await sandboxes(hub, 'POST', admin, { json: { cluster: 'plc-b' } });
    assert.equal(named.status, 503, named.text);
    assert.match(problemOf(named).detail, /plc-b: drained/);
    assert.doesNotMatch(problemOf(named).detail, /plc-a/, 'only the named cluster is accounted for');
  });

  await t.test('kill -9 a worker: the hub sees it gone at once, places on the other, and again on it once it is back', async () => {
    const dataDir = workers['plc-a'].dataDir;
    workers['plc-a'].proc.kill('SIGKILL');
    await workers['plc-a'].exited;
    // Well inside one heartbeat interval: the socket's close, not 3 silent heartbeats, told the hub.
    await waitFor('the hub to see plc-a disconnected', async () => ((await clusterState('plc-a'))?.connected === false ? true : undefined), HEARTBEAT_MS, 10);

    const res = await sandboxes(hub, 'POST', admin, { json: { region: 'east', wait: false } });
    assert.equal(res.status, 201, res.text);
    assert.equal(res.headers.get('x-asb-cluster'), 'plc-b');
    const named = await sandboxes(hub, 'POST', admin, { json: { cluster: 'plc-a' } });
    assert.equal(named.status, 503, named.text);
    assert.match(problemOf(named).detail, /cluster "plc-a" could not take .*plc-a: down/);
    const listed = await sandboxes(hub, 'GET', admin);
    assert.deepEqual((listed.json as { unreachable?: { cluster: string; reason: string }[] }).unreachable, [{ cluster: 'plc-a', reason: 'not connected to the hub' }]);

    await startCluster('plc-a', dataDir);
    const back = await waitFor('placement to use plc-a again', async () => {
      const r = await sandboxes(hub, 'POST', admin, { json: { cluster: 'plc-a', wait: false } });
      return r.status === 201 ? r : undefined;
    });
    assert.ok((back.json as View).id.startsWith('plca'));
  });
});
