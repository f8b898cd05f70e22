// The E2B control-plane API with the real, unmodified `e2b` SDKs (2.51.0, which uses
// /v2/sandboxes for create/connect/list, and 2.50.0, which uses /sandboxes) against a real worker
// process running real sandboxes. Recipe A of research e2b.md: apiUrl = the worker's API URL,
// apiKey = one of our team keys; no TLS, no DNS. Only control-plane calls here: envd has its own
// test (test/envd.test.ts).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as e2bLatest from 'e2b';
import * as e2b250 from 'e2b-2-50';
import { SandboxType, type Sandbox as SandboxObject } from '../src/api/types.ts';
import { E2B_ANNOTATION } from '../src/worker/e2b/shape.ts';
import { removeDataDir, startWorkerProcess, teamKeyIn, tempDataDir, type WorkerProcess } from './support/worker-process.ts';
import { startWorkerFixture } from './support/worker-fixture.ts';

/** The two SDKs share their API; the older one's types are a structural subset for what we call. */
type Sdk = typeof e2bLatest;
const SDKS: readonly { version: string; sdk: Sdk }[] = [
  { version: '2.51.0', sdk: e2bLatest },
  { version: '2.50.0', sdk: e2b250 as unknown as Sdk },
];

/** A raw HTTP call, for what the SDK hides: the error body and content type. */
async function raw(w: WorkerProcess, method: string, path: string, opts: { key?: string; body?: string } = {}): Promise<{ status: number; type: string; json: unknown }> {
  const headers: Record<string, string> = opts.body === undefined ? {} : { 'content-type': 'application/json' };
  if (opts.key !== undefined) headers['x-api-key'] = opts.key;
  const res = await fetch(`${w.apiUrl}${path}`, { method, headers, ...(opts.body === undefined ? {} : { body: opts.body }) });
  const text = await res.text();
  return { status: res.status, type: res.headers.get('content-type') ?? '', json: text === '' ? undefined : (JSON.parse(text) as unknown) };
}

/** asb_http_requests_total by "route code", from the worker's /metrics. */
async function requestCounts(w: WorkerProcess): Promise<Map<string, number>> {
  const text = await (await fetch(`${w.apiUrl}/metrics`, { headers: { authorization: `Bearer ${w.adminKey}` } })).text();
  const counts = new Map<string, number>();
  for (const m of text.matchAll(/^asb_http_requests_total\{route="([^"]*)",code="(\d+)"\} (\d+)$/gm)) counts.set(`${m[1] ?? ''} ${m[2] ?? ''}`, Number(m[3]));
  return counts;
}

test('the real E2B SDKs (2.51 and 2.50) drive sandboxes through the worker: create, list with filters and paging, getInfo, setTimeout, pause, connect, kill, errors', async (t) => {
  const dataDir = tempDataDir('e2bs');
  const keyA = await teamKeyIn(dataDir, 'e2b-team-a');
  const keyB = await teamKeyIn(dataDir, 'e2b-team-b');
  const w = await startWorkerProcess({ dataDir, clusterTag: 'e2bs', subnetOctet: 238, basePool: 2 });
  t.after(async () => {
    await w.stop();
    removeDataDir(w.dataDir);
  });

  for (const { version, sdk } of SDKS) {
    const before = await requestCounts(w);
    const { Sandbox, SandboxNotFoundError, AuthenticationError } = sdk;
    // sandboxUrl too (Recipe A), so nothing the SDK might do reaches for *.e2b.app.
    const opts = { apiUrl: w.apiUrl, sandboxUrl: w.apiUrl, apiKey: keyA };
    const run = `sdk-${version}`;

    await t.test(`${version}: create with metadata, envs and timeout; getInfo shows them`, async () => {
      const sbx = await Sandbox.create('base', { ...opts, metadata: { run, 'user id': 'a&b=c' }, envs: { FOO: 'bar' }, timeoutMs: 120_000 });
      assert.match(sbx.sandboxId, /^e2bs[a-z0-9]{16}$/, 'our id, with the cluster tag');
      const info = await sbx.getInfo();
      assert.equal(info.sandboxId, sbx.sandboxId);
      assert.equal(info.templateId, 'base');
      assert.equal(info.state, 'running');
      assert.deepEqual(info.metadata, { run, 'user id': 'a&b=c' });
      assert.equal(info.envdVersion, '0.6.13');
      assert.equal(info.endAt.getTime() - info.startedAt.getTime(), 120_000, 'timeout (s) sets the end, from the create');
      assert.ok(info.cpuCount >= 1 && info.memoryMB > 0, 'the machine the sandbox may use');
      const bySpecial = await Sandbox.list({ ...opts, query: { metadata: { run, 'user id': 'a&b=c' } } }).nextItems();
      assert.deepEqual(bySpecial.map((s) => s.sandboxId), [sbx.sandboxId], 'metadata with a space, & and = filters through the triple encoding');
      assert.deepEqual(await Sandbox.list({ ...opts, query: { metadata: { run, 'user id': 'a&b' } } }).nextItems(), []);

      await sbx.setTimeout(600_000);
      const later = await sbx.getInfo();
      assert.ok(later.endAt.getTime() - info.endAt.getTime() > 400_000, `setTimeout moved the end from ${info.endAt.toISOString()} to ${later.endAt.toISOString()}`);

      const metrics = await sbx.getMetrics();
      assert.equal(metrics.length, 1, 'one sample of the running pod');
      assert.ok((metrics[0]?.memUsed ?? 0) > 0, 'its processes use memory');
      assert.ok((metrics[0]?.diskTotal ?? 0) > 0);

      assert.equal(await sbx.kill(), true);
      assert.equal(await Sandbox.kill(sbx.sandboxId, opts), false, 'a second kill finds nothing');
      await assert.rejects(Sandbox.getInfo(sbx.sandboxId, opts), SandboxNotFoundError);
    });

    await t.test(`${version}: list filters by metadata and state and pages with nextToken; pause, connect resumes`, async () => {
      const made = await Promise.all([0, 1, 2, 3, 4].map((i) => Sandbox.create('base', { ...opts, metadata: { run, n: String(i), group: i < 2 ? 'first' : 'rest' } })));
      const ids = made.map((s) => s.sandboxId).sort();

      const paginator = Sandbox.list({ ...opts, query: { metadata: { run } }, limit: 2 });
      const pages: string[][] = [];
      for (let i = 0; i < 10 && paginator.hasNext; i++) pages.push((await paginator.nextItems()).map((s) => s.sandboxId));
      assert.deepEqual(pages.map((p) => p.length), [2, 2, 1], 'limit 2 over 5 sandboxes: pages of 2, 2, 1, then no next token');
      assert.deepEqual(pages.flat().sort(), ids, 'every sandbox once');

      const firstGroup = await Sandbox.list({ ...opts, query: { metadata: { run, group: 'first' } } }).nextItems();
      assert.equal(firstGroup.length, 2);
      assert.ok(firstGroup.every((s) => s.metadata.group === 'first' && s.state === 'running'));

      const paused = made[0];
      assert.ok(paused !== undefined);
      assert.equal(await paused.pause(), true);
      assert.equal(await paused.pause(), false, 'already paused: false, not an error');
      assert.equal((await paused.getInfo()).state, 'paused', 'getInfo returns paused sandboxes');
      const pausedList = await Sandbox.list({ ...opts, query: { metadata: { run }, state: ['paused'] } }).nextItems();
      assert.deepEqual(pausedList.map((s) => s.sandboxId), [paused.sandboxId]);
      const runningList = await Sandbox.list({ ...opts, query: { metadata: { run }, state: ['running'] } }).nextItems();
      assert.equal(runningList.length, 4);

      const resumed = await Sandbox.connect(paused.sandboxId, opts);
      assert.equal(resumed.sandboxId, paused.sandboxId);
      assert.equal((await resumed.getInfo()).state, 'running', 'connect resumed it');
      assert.equal((await resumed.getMetrics()).length, 1, 'its pod runs again: a sample of its processes');
      const again = await Sandbox.connect(paused.sandboxId, opts);
      assert.equal((await again.getInfo()).state, 'running', 'connect to a running sandbox');

      const otherTeam = { ...opts, apiKey: keyB };
      await assert.rejects(Sandbox.getInfo(paused.sandboxId, otherTeam), SandboxNotFoundError, "another team's sandbox does not exist for it");
      assert.deepEqual(await Sandbox.list({ ...otherTeam, query: { metadata: { run } } }).nextItems(), []);

      for (const s of made) assert.equal(await s.kill(), true);
      assert.deepEqual(await Sandbox.list({ ...opts, query: { metadata: { run } } }).nextItems(), [], 'killed sandboxes are not listed');
    });

    await t.test(`${version}: missing sandboxes and bad keys are the SDK's own errors`, async () => {
      const missing = 'e2bs0000000000000000';
      await assert.rejects(Sandbox.connect(missing, opts), SandboxNotFoundError);
      await assert.rejects(Sandbox.setTimeout(missing, 10_000, opts), SandboxNotFoundError);
      await assert.rejects(Sandbox.pause(missing, opts), SandboxNotFoundError);
      await assert.rejects(Sandbox.create('base', { ...opts, apiKey: 'asb_deadbeef_00000000000000000000000000000000' }), AuthenticationError);
      await assert.rejects(Sandbox.list({ ...opts, apiKey: 'e2b_not_one_of_ours' }).nextItems(), AuthenticationError);
    });

    await t.test(`${version}: ${version === '2.50.0' ? 'creates and connects at /sandboxes' : 'creates, connects and lists at /v2/sandboxes'}`, async () => {
      const after = await requestCounts(w);
      const delta = (route: string, code: number): number => (after.get(`${route} ${code}`) ?? 0) - (before.get(`${route} ${code}`) ?? 0);
      const prefix = version === '2.50.0' ? '' : '/v2';
      const other = version === '2.50.0' ? '/v2' : '';
      assert.equal(delta(`${prefix}/sandboxes`, 201), 6, 'six creates');
      assert.equal(delta(`${other}/sandboxes`, 201), 0);
      assert.equal(delta(`${prefix}/sandboxes/{id}/connect`, 201), 1, 'one resume');
      assert.equal(delta(`${prefix}/sandboxes/{id}/connect`, 200), 1, 'one connect to a running sandbox');
      assert.ok(delta('/v2/sandboxes', 200) >= 7, 'both list at /v2/sandboxes');
    });
  }

  await t.test('raw HTTP: every failure is JSON {code, message} with the status in code', async () => {
    const noKey = await raw(w, 'GET', '/v2/sandboxes');
    assert.equal(noKey.status, 401);
    assert.equal(noKey.type, 'application/json');
    assert.equal((noKey.json as { code: number }).code, 401);
    assert.match((noKey.json as { message: string }).message, /API key/);

    const badTimeout = await raw(w, 'POST', '/v2/sandboxes', { key: keyA, body: JSON.stringify({ templateID: 'base', timeout: 'soon' }) });
    assert.equal(badTimeout.status, 400);
    assert.equal((badTimeout.json as { code: number }).code, 400);
    assert.match((badTimeout.json as { message: string }).message, /timeout: must be an integer/);

    const badJson = await raw(w, 'POST', '/sandboxes', { key: keyA, body: '{"templateID":' });
    assert.deepEqual([badJson.status, (badJson.json as { code: number }).code], [400, 400]);

    const noTemplate = await raw(w, 'POST', '/v2/sandboxes', { key: keyA, body: JSON.stringify({ templateID: 'no-such-template' }) });
    assert.deepEqual([noTemplate.status, (noTemplate.json as { code: number }).code], [404, 404]);
    assert.match((noTemplate.json as { message: string }).message, /template "no-such-template" not found/);

    const badState = await raw(w, 'GET', '/v2/sandboxes?state=sleeping', { key: keyA });
    assert.deepEqual([badState.status, (badState.json as { code: number }).code], [400, 400]);
    const badToken = await raw(w, 'GET', '/v2/sandboxes?nextToken=garbage', { key: keyA });
    assert.deepEqual([badToken.status, (badToken.json as { code: number }).code], [400, 400]);

    const kill = await raw(w, 'DELETE', '/sandboxes/e2bs0000000000000000', { key: keyA });
    assert.equal(kill.status, 404);
    assert.deepEqual(Object.keys(kill.json as object).sort(), ['code', 'message']);
  });
});

test('create keeps envVars and metadata on the sandbox (annotations) for envd and list; the other fields the SDK sends are ignored or refused', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const post = async (body: unknown): Promise<{ status: number; json: unknown }> => {
    const res = await fetch(`${fx.url}/v2/sandboxes`, { method: 'POST', headers: { 'x-api-key': fx.keys.teamA, 'content-type': 'application/json' }, body: JSON.stringify(body) });
    return { status: res.status, json: await res.json() };
  };
  const created = await post({ templateID: 'base', envVars: { FOO: 'bar baz' }, metadata: { k: 'v w' }, secure: true, allow_internet_access: true, network: { allowOut: ['0.0.0.0/0'] } });
  assert.equal(created.status, 201, JSON.stringify(created.json));
  const id = (created.json as { sandboxID: string }).sandboxID;
  const { items } = await fx.store.list<SandboxObject>(SandboxType, {});
  const sandbox = items.find((s) => s.metadata.name === id);
  assert.ok(sandbox !== undefined);
  assert.deepEqual(JSON.parse(sandbox.metadata.annotations?.[E2B_ANNOTATION.envVars] ?? 'null'), { FOO: 'bar baz' });
  assert.deepEqual(JSON.parse(sandbox.metadata.annotations?.[E2B_ANNOTATION.metadata] ?? 'null'), { k: 'v w' });

  // autoPause is kept: the sandbox pauses at its timeout (with memory unless autoPauseMemory is false).
  const autoPause = await post({ templateID: 'base', autoPause: true, autoResume: { enabled: true } });
  assert.equal(autoPause.status, 201, JSON.stringify(autoPause.json));
  const paused = (await fx.store.list<SandboxObject>(SandboxType, {})).items.find((s) => s.metadata.name === (autoPause.json as { sandboxID: string }).sandboxID);
  assert.deepEqual([paused?.spec.lifecycle?.shutdownPolicy, paused?.spec.suspensionStrategy], ['Suspend', 'Hibernate']);
  const filesOnly = await post({ templateID: 'base', autoPause: true, autoPauseMemory: false, autoResume: { enabled: true } });
  assert.deepEqual([filesOnly.status, (filesOnly.json as { code: number }).code], [400, 400], 'a filesystem-only pause cannot be resumed by traffic');
  const resumeAlone = await post({ templateID: 'base', autoResume: { enabled: true } });
  assert.deepEqual([resumeAlone.status, (resumeAlone.json as { code: number }).code], [400, 400], 'autoResume needs autoPause');
  const volumes = await post({ templateID: 'base', volumeMounts: [{ name: 'v', path: '/data' }] });
  assert.deepEqual([volumes.status, (volumes.json as { code: number }).code], [400, 400]);
});
