// The hub's admin API against a real hub on port 0: API keys are shown once and never leave as
// hashes, a cluster's sync credential is shown once and only its hash is stored, templates are
// validated as on a worker, tenants cannot administer, and bad input is a 4xx naming the
// problem, never a 500.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { SandboxTemplateType } from '../src/api/types.ts';
import { builtTemplateObject } from '../src/builds/template-object.ts';
import { acceptBuiltTemplates } from '../src/hub/built-templates.ts';
import { WebSocket } from 'ws';
import type { ClusterView } from '../src/hub/clusters.ts';
import { ClusterType, type Cluster, type HubToWorker } from '../src/api/hub-contract.ts';
import { startHub, type RunningHub } from '../src/hub/hub.ts';
import { parseHubConfig } from '../src/hub/hub-config.ts';
import { silentLogger } from '../src/base/log.ts';
import { waitFor } from './support/wait.ts';
import { call, type ApiResponse } from './support/worker-fixture.ts';

interface ProblemBody { code: string; detail: string; fields?: { field: string; message: string }[] }

function problem(res: ApiResponse): ProblemBody {
  assert.equal(res.headers.get('content-type'), 'application/problem+json', `a problem+json body, got ${res.status} ${res.text}`);
  return res.json as ProblemBody;
}

function sha256(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

const TEMPLATE = {
  apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
  kind: 'SandboxTemplate',
  metadata: { name: 'python' },
  spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'python:3.12' }] } } },
};

async function startTestHub(dir: string): Promise<RunningHub> {
  const config = parseHubConfig(['--data-dir', join(dir, 'hub'), '--port', '0', '--admin-key-file', join(dir, 'admin.key')], {});
  return startHub(config, { log: silentLogger() });
}

test('hub admin API', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-hub-api-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  let hub = await startTestHub(dir);
  t.after(() => hub.close());
  const admin = hub.adminKey ?? '';
  assert.match(admin, /^asb_[a-z0-9]{8}_[a-z0-9]{32}$/);
  assert.equal(readFileSync(join(dir, 'admin.key'), 'utf8').trim(), admin, 'the admin key is written to --admin-key-file');

  let tenant = '';
  await t.test('keys: created once, listed without hashes, refused once revoked', async () => {
    const created = await call(hub, 'POST', '/v1/keys', { key: admin, json: { team: 'team-a', description: 'ci' } });
    assert.equal(created.status, 201, created.text);
    const body = created.json as { key: string; prefix: string; team: string; admin: boolean };
    assert.match(body.key, /^asb_[a-z0-9]{8}_[a-z0-9]{32}$/);
    assert.equal(body.prefix, body.key.slice(0, 12));
    assert.deepEqual({ team: body.team, admin: body.admin }, { team: 'team-a', admin: false });
    tenant = body.key;

    const listed = await call(hub, 'GET', '/v1/keys', { key: admin });
    assert.equal(listed.status, 200);
    const items = (listed.json as { items: { prefix: string; team: string; admin: boolean; revoked: boolean; created?: string }[] }).items;
    const mine = items.find((k) => k.prefix === body.prefix);
    assert.match(mine?.created ?? '', /^\d{4}-\d\d-\d\dT/);
    assert.deepEqual({ ...mine, created: undefined }, { prefix: body.prefix, team: 'team-a', admin: false, revoked: false, description: 'ci', created: undefined });
    assert.ok(items.some((k) => k.admin && k.team === 'admin'), 'the bootstrap admin key is listed');
    assert.ok(!listed.text.includes(sha256(body.key)) && !listed.text.includes('hash'), 'no hash in the listing');
    assert.ok(!listed.text.includes(body.key), 'no key in the listing');

    // The new key works at once (tenant reads), then stops working the moment it is revoked.
    assert.equal((await call(hub, 'GET', '/v1/templates', { key: tenant })).status, 200);
    const throwaway = ((await call(hub, 'POST', '/v1/keys', { key: admin, json: { team: 'team-b' } })).json as { key: string; prefix: string });
    const revoked = await call(hub, 'POST', `/v1/keys/${throwaway.prefix}/revoke`, { key: admin });
    assert.equal(revoked.status, 200, revoked.text);
    assert.equal((revoked.json as { revoked: boolean }).revoked, true);
    const refused = await call(hub, 'GET', '/v1/templates', { key: throwaway.key });
    assert.equal(refused.status, 401);
    assert.equal(problem(refused).code, 'Unauthorized');
    assert.equal((await call(hub, 'POST', '/v1/keys/asb_zzzzzzzz/revoke', { key: admin })).status, 404);
    assert.equal((await call(hub, 'POST', '/v1/keys/not-a-prefix/revoke', { key: admin })).status, 404);
  });

  await t.test('tenants read templates and status but administer nothing', async () => {
    assert.equal((await call(hub, 'GET', '/v1/status', { key: tenant })).status, 200);
    for (const [method, path, json] of [
      ['GET', '/v1/keys', undefined],
      ['POST', '/v1/keys', { team: 'team-a', admin: true }],
      ['GET', '/v1/clusters', undefined],
      ['PUT', '/v1/clusters/x', { region: 'r', ingressAddress: 'h:1', tag: 'abcd' }],
      ['POST', '/v1/apply', { objects: [TEMPLATE] }],
      ['PUT', '/v1/templates/python', TEMPLATE],
      ['DELETE', '/v1/templates/python', undefined],
    ] as const) {
      const res = await call(hub, method, path, { key: tenant, ...(json === undefined ? {} : { json }) });
      assert.equal(res.status, 403, `${method} ${path}: ${res.text}`);
      assert.equal(problem(res).code, 'Forbidden');
    }
    const keys = await hub.store.list(ClusterType);
    assert.equal(keys.items.length, 0, 'a refused request wrote nothing');
  });

  let credential = '';
  await t.test('clusters: the credential is shown once and only its hash is stored', async () => {
    const spec = { region: 'region-a', ingressAddress: '127.0.0.1:10001', apiUrl: 'http://127.0.0.1:7081', tag: 'rga1', labels: { tier: 'gold' } };
    const created = await call(hub, 'PUT', '/v1/clusters/region-a', { key: admin, json: spec });
    assert.equal(created.status, 201, created.text);
    const body = created.json as { cluster: { spec: Record<string, unknown>; status: object }; credential: string };
    assert.match(body.credential, /^asbc_[a-z0-9]{32}$/);
    assert.deepEqual(body.cluster.spec, spec);
    const stored = await hub.store.get<Cluster>(ClusterType, '', 'region-a');
    assert.equal(stored.spec.credentialHash, sha256(body.credential));
    credential = body.credential;

    // Updating keeps the tag and credential, returns no credential, merges the fields given.
    const drained = await call(hub, 'PUT', '/v1/clusters/region-a', { key: admin, json: { drain: true } });
    assert.equal(drained.status, 200, drained.text);
    assert.equal((drained.json as { credential?: string }).credential, undefined);
    assert.deepEqual((drained.json as { cluster: { spec: object } }).cluster.spec, { ...spec, drain: true });
    assert.equal((await hub.store.get<Cluster>(ClusterType, '', 'region-a')).spec.credentialHash, sha256(credential));

    const listed = await call(hub, 'GET', '/v1/clusters', { key: admin });
    assert.equal(listed.status, 200);
    assert.ok(!listed.text.includes('credentialHash') && !listed.text.includes(sha256(credential)), listed.text);
    assert.equal((listed.json as { items: { metadata: { name: string } }[] }).items[0]?.metadata.name, 'region-a');

    const rotated = await call(hub, 'POST', '/v1/clusters/region-a/credential', { key: admin });
    assert.equal(rotated.status, 200, rotated.text);
    const next = (rotated.json as { credential: string }).credential;
    assert.notEqual(next, credential);
    assert.equal((await hub.store.get<Cluster>(ClusterType, '', 'region-a')).spec.credentialHash, sha256(next));
    credential = next;
  });

  await t.test('clusters: tags are unique and fixed, names and addresses checked', async () => {
    const clash = await call(hub, 'PUT', '/v1/clusters/region-b', { key: admin, json: { region: 'region-b', ingressAddress: '127.0.0.1:10002', tag: 'rga1' } });
    assert.equal(clash.status, 409);
    assert.match(problem(clash).detail, /region-a/);
    const retag = await call(hub, 'PUT', '/v1/clusters/region-a', { key: admin, json: { tag: 'zzzz' } });
    assert.equal(retag.status, 422);
    assert.deepEqual(problem(retag).fields?.map((f) => f.field), ['tag']);
    const bad = await call(hub, 'PUT', '/v1/clusters/Bad_Name', { key: admin, json: { region: 'Region A', ingressAddress: 'nope', apiUrl: 'ftp://x', tag: 'TOOLONG', labels: { 'bad key': 'x' } } });
    assert.equal(bad.status, 422);
    assert.deepEqual(problem(bad).fields?.map((f) => f.field).sort(), ['apiUrl', 'ingressAddress', 'labels.bad key', 'metadata.name', 'region', 'tag']);
    const missing = await call(hub, 'PUT', '/v1/clusters/region-c', { key: admin, json: {} });
    assert.equal(missing.status, 422);
    assert.deepEqual(problem(missing).fields?.map((f) => f.field).sort(), ['ingressAddress', 'region', 'tag']);
    assert.equal((await hub.store.list(ClusterType)).items.length, 1, 'nothing was registered');

    const gone = await call(hub, 'PUT', '/v1/clusters/temp', { key: admin, json: { region: 'r', ingressAddress: '[::1]:10003', tag: 'tmp1' } });
    assert.equal(gone.status, 201, gone.text);
    // What the cluster's builds made is at the hub (its `built` sync message), beside an admin's template.
    const builtThere = builtTemplateObject({ namespace: 'default', templateId: 'tmp10000000000000001', team: 'team-t', name: 'env', buildId: 'b1', image: 'reg:5000/templates/x@sha256:' + '0'.repeat(64), config: { env: [] }, cpuCount: 1, memoryMB: 512 });
    const pinThere = builtTemplateObject({ namespace: 'default', templateId: 'tmp10000000000000001', team: 'team-t', name: 'env', buildId: 'b1', image: 'reg:5000/templates/x@sha256:' + '0'.repeat(64), config: { env: [] }, cpuCount: 1, memoryMB: 512, pinned: true, tags: ['v1'] });
    assert.equal(await acceptBuiltTemplates(hub.store, 'temp', [builtThere, pinThere], silentLogger()), 2);
    assert.equal((await call(hub, 'POST', '/v1/apply', { key: admin, json: { objects: [{ ...TEMPLATE, metadata: { name: 'admins-own' } }] } })).status, 200);
    assert.equal((await call(hub, 'DELETE', '/v1/clusters/temp', { key: admin })).status, 200);
    const left = (await hub.store.list(SandboxTemplateType)).items.map((o) => o.metadata.name);
    assert.ok(!left.some((n) => n.startsWith('tmp1')), `the removed cluster's built templates are gone from the hub: ${left.join(', ')}`);
    assert.ok(left.includes('admins-own'), 'an admin\'s template stays');
    assert.equal(await acceptBuiltTemplates(hub.store, 'temp', [builtThere], silentLogger()), 0, 'a removed cluster\'s next set is ignored');
    assert.equal((await call(hub, 'DELETE', '/v1/templates/admins-own', { key: admin })).status < 300, true);
    assert.equal((await call(hub, 'DELETE', '/v1/clusters/temp', { key: admin })).status, 404);
    assert.equal((await call(hub, 'POST', '/v1/clusters/temp/credential', { key: admin })).status, 404);
  });

  await t.test('templates: validated as on a worker, all or nothing, SandboxTemplates only', async () => {
    const applied = await call(hub, 'POST', '/v1/apply', { key: admin, json: { objects: [TEMPLATE] } });
    assert.equal(applied.status, 200, applied.text);
    assert.deepEqual((applied.json as { results: unknown[] }).results, [{ kind: 'SandboxTemplate', namespace: 'default', name: 'python', action: 'created' }]);
    const again = await call(hub, 'POST', '/v1/apply', { key: admin, json: { objects: [TEMPLATE] } });
    assert.equal((again.json as { results: { action: string }[] }).results[0]?.action, 'unchanged');

    const second = { ...TEMPLATE, metadata: { name: 'node' } };
    const broken = { ...TEMPLATE, metadata: { name: 'broken' }, spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 7 }] } } } };
    const pool = { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxWarmPool', metadata: { name: 'p' }, spec: { replicas: 1, sandboxTemplateRef: { name: 'python' } } };
    const refused = await call(hub, 'POST', '/v1/apply', { key: admin, json: { objects: [second, broken, pool] } });
    assert.equal(refused.status, 422, refused.text);
    assert.deepEqual(problem(refused).fields?.map((f) => f.field), ['objects[1].spec.podTemplate.spec.containers[0].image', 'objects[2].kind']);
    assert.equal(await hub.store.tryGet(SandboxTemplateType, 'default', 'node'), undefined, 'nothing of a refused apply was written');

    const tenantGet = await call(hub, 'GET', '/v1/templates/python', { key: tenant });
    assert.equal(tenantGet.status, 200);
    assert.equal((tenantGet.json as { kind: string }).kind, 'SandboxTemplate');
    const put = await call(hub, 'PUT', '/v1/templates/node', { key: admin, json: second });
    assert.equal(put.status, 201, put.text);
    const mismatch = await call(hub, 'PUT', '/v1/templates/other', { key: admin, json: second });
    assert.equal(mismatch.status, 422);
    assert.deepEqual(problem(mismatch).fields?.map((f) => f.field), ['metadata.name']);
    assert.equal((await call(hub, 'DELETE', '/v1/templates/node', { key: admin })).status, 200);
    assert.equal((await call(hub, 'GET', '/v1/templates/node', { key: admin })).status, 404);
  });

  await t.test('bad input is a 4xx naming the problem, never a 500', async () => {
    const raw = (method: string, path: string, body: string, type = 'application/json'): Promise<ApiResponse> =>
      call(hub, method, path, { key: admin, body, headers: { 'content-type': type } });
    const cases: [Promise<ApiResponse>, number, string][] = [
      [raw('POST', '/v1/keys', '{"team": "a",'), 400, 'MalformedJson'],
      [raw('POST', '/v1/keys', 'team=a', 'application/x-www-form-urlencoded'), 415, 'UnsupportedMediaType'],
      [raw('POST', '/v1/keys', JSON.stringify({ team: 'x'.repeat(2 * 1024 * 1024) })), 413, 'PayloadTooLarge'],
      [call(hub, 'POST', '/v1/keys', { key: admin, json: [1] }), 400, 'BadRequest'],
      [call(hub, 'POST', '/v1/keys', { key: admin, json: { team: 'bad team!' } }), 422, 'Invalid'],
      [call(hub, 'POST', '/v1/keys', { key: admin, json: { tem: 'a', admin: 'yes' } }), 422, 'Invalid'],
      [call(hub, 'PUT', '/v1/clusters/x', { key: admin, json: { region: 5, labels: { a: 1 } } }), 422, 'Invalid'],
      [call(hub, 'POST', '/v1/apply', { key: admin, json: { objects: 'no' } }), 422, 'Invalid'],
      [call(hub, 'GET', '/v1/templates?namespace=Bad_NS', { key: admin }), 400, 'BadRequest'],
      [call(hub, 'GET', '/v1/clusters/%E0%A4%A', { key: admin }), 400, 'BadRequest'],
      [call(hub, 'GET', '/v1/nothing', { key: admin }), 404, 'NotFound'],
      [call(hub, 'PATCH', '/v1/keys', { key: admin }), 405, 'MethodNotAllowed'],
      [call(hub, 'GET', '/v1/keys'), 401, 'Unauthorized'],
      [call(hub, 'GET', '/v1/keys', { key: 'asb_aaaaaaaa_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb' }), 401, 'Unauthorized'],
    ];
    for (const [pending, status, code] of cases) {
      const res = await pending;
      assert.equal(res.status, status, res.text);
      assert.equal(problem(res).code, code);
    }
    const typed = await call(hub, 'POST', '/v1/keys', { key: admin, json: { tem: 'a', admin: 'yes' } });
    assert.deepEqual(problem(typed).fields?.map((f) => f.field).sort(), ['admin', 'team', 'tem']);
  });

  await t.test('healthz without a key, metrics and status with one', async () => {
    assert.equal((await call(hub, 'GET', '/healthz')).status, 200);
    const metrics = await call(hub, 'GET', '/metrics', { key: admin });
    assert.equal(metrics.status, 200);
    assert.match(metrics.text, /asb_hub_http_requests_total\{route="\/v1\/keys",code="201"\} \d+/);
    const status = await call(hub, 'GET', '/v1/status', { key: admin });
    const body = status.json as { version: string; hubVersion: number; clusters: { name: string; drain: boolean; connected: boolean }[] };
    assert.ok(body.hubVersion > 0);
    assert.deepEqual(body.clusters.map((c) => [c.name, c.drain, c.connected]), [['region-a', true, false]]);
  });

  await t.test('a cluster on the sync endpoint shows as connected, with its applied version and lag', async () => {
    const ws = new WebSocket(`${hub.url.replace('http', 'ws')}/v1/sync`, { headers: { authorization: `Bearer ${credential}` } });
    const frames: HubToWorker[] = [];
    ws.on('message', (data: Buffer) => frames.push(JSON.parse(data.toString()) as HubToWorker));
    await new Promise<void>((resolve, reject) => ws.once('open', () => resolve()).once('error', reject));
    const closed = new Promise<void>((resolve) => ws.once('close', () => resolve()));
    t.after(async () => {
      ws.terminate();
      await closed;
    });
    ws.send(JSON.stringify({ type: 'hello', cluster: 'region-a', lastVersion: 0 }));
    const snapshot = await waitFor('the snapshot', () => Promise.resolve(frames.find((f) => f.type === 'snapshot')), 5000);
    const clusterOf = async (): Promise<ClusterView> => {
      const res = await call(hub, 'GET', '/v1/clusters/region-a', { key: admin });
      return res.json as ClusterView;
    };
    const before = await clusterOf();
    assert.equal(before.status.connected, true);
    assert.equal(before.status.lag, snapshot.version, 'nothing acknowledged yet: the whole version behind');

    ws.send(JSON.stringify({ type: 'ack', version: snapshot.version }));
    await waitFor('the ack to show', async () => ((await clusterOf()).status.lag === 0 ? true : undefined), 5000);
    const status = (await call(hub, 'GET', '/v1/status', { key: admin })).json as { hubVersion: number; clusters: { name: string; connected: boolean; appliedVersion: number; lag: number }[] };
    assert.equal(status.hubVersion, snapshot.version);
    assert.deepEqual(status.clusters.map((c) => [c.name, c.connected, c.appliedVersion, c.lag]), [['region-a', true, snapshot.version, 0]]);

    // A change the cluster has not acknowledged yet is lag, as soon as it is made. (Versions are
    // the store's global counter, which status writes also advance, so the gap may exceed 1.)
    assert.equal((await call(hub, 'POST', '/v1/keys', { key: admin, json: { team: 'team-c' } })).status, 201);
    await waitFor('the new key to count as lag', async () => (((await clusterOf()).status.lag ?? 0) > 0 ? true : undefined), 5000);

    ws.close();
    await closed;
    await waitFor('the cluster to show disconnected', async () => ((await clusterOf()).status.connected === false ? true : undefined), 5000);
  });

  await t.test('a restart keeps keys, clusters and templates, and the same admin key', async () => {
    await hub.close();
    const files = readdirSync(join(dir, 'hub'));
    for (const f of files) {
      const bytes = readFileSync(join(dir, 'hub', f));
      assert.ok(!bytes.includes(credential) && !bytes.includes(tenant) && !bytes.includes(admin), `${f} holds no key or credential in clear`);
    }
    hub = await startTestHub(dir);
    assert.equal(hub.adminKey, admin);
    assert.equal((await call(hub, 'GET', '/v1/templates/python', { key: tenant })).status, 200);
    assert.equal((await hub.store.get<Cluster>(ClusterType, '', 'region-a')).spec.credentialHash, sha256(credential));
  });
});
