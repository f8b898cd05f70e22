// The worker REST API end to end: a real server on port 0 over the SQLite store, the operator and
// an in-memory pod runtime. Every response is checked against docs/openapi.yaml, and the last test
// asserts that the document and the server list the same routes and that all were exercised.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { test } from 'node:test';
import { SandboxTemplateType, SandboxType } from '../src/api/types.ts';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TeamFileStore } from '../src/builds/files.ts';
import { TemplateBuilds } from '../src/builds/service.ts';
import { systemClock } from '../src/base/clock.ts';
import { silentLogger } from '../src/base/log.ts';
import { OpenApiChecker } from './support/openapi-check.ts';
import { RecordingEngine } from './support/recording-engine.ts';
import { BASE_TEMPLATE, call, startWorkerFixture, type ApiResponse, type CallOptions, type WorkerFixture } from './support/worker-fixture.ts';

const checker = new OpenApiChecker(new URL('../docs/openapi.yaml', import.meta.url).pathname);
let registered: string[] = [];

interface View { id: string; phase: string; ready: boolean; owner: string; labels: Record<string, string>; shutdownTime?: string; launchType: string; accessToken?: string }

function client(fx: WorkerFixture) {
  return async (method: string, path: string, opts: CallOptions = {}): Promise<ApiResponse> => {
    const res = await call(fx, method, path, opts);
    checker.check(method, path, res);
    return res;
  };
}

async function start(t: { after: (fn: () => Promise<void>) => void }): Promise<WorkerFixture> {
  // Builds with the test engine (runs nothing): the build API's routes answer in their shapes.
  const fx = await startWorkerFixture((fn) => t.after(fn), {}, {
    events: {},
    builds: (store, dir) => new TemplateBuilds({ recordsDir: join(dir, 'builds'), files: new TeamFileStore({ dir: join(dir, 'build-files'), now: () => Date.now() }), store, engine: new RecordingEngine(), namespace: 'default', clusterTag: 'tst1', clock: systemClock, log: silentLogger() }),
  });
  registered = fx.server.routes.map((r) => `${r.method} ${r.pattern}`).sort();
  return fx;
}

test('a sandbox goes through create, get, list, exec, files, pause, resume, timeout and delete', async (t) => {
  const fx = await start(t);
  const api = client(fx);
  const key = fx.keys.teamA;

  const created = await api('POST', '/v1/sandboxes', { key, json: { template: 'base', labels: { app: 'web' } } });
  assert.equal(created.status, 201, created.text);
  const view = created.json as View;
  assert.match(view.id, /^tst1[a-z0-9]{16}$/, 'ids carry the cluster tag');
  assert.equal(view.ready, true, 'wait defaults to true: the sandbox is Ready when create answers');
  assert.equal(view.owner, 'team-a');
  assert.equal(view.labels.app, 'web');

  const got = await api('GET', `/v1/sandboxes/${view.id}`, { key });
  assert.equal(got.status, 200);
  assert.equal((got.json as View).id, view.id);

  const second = await api('POST', '/v1/sandboxes', { key, json: { labels: { app: 'db' } } });
  const third = await api('POST', '/v1/sandboxes', { key, json: { labels: { app: 'db' }, wait: false } });
  assert.equal(second.status, 201);
  assert.equal(third.status, 201);

  // Paging: two pages of 2 then 1, no duplicates, no gaps.
  const page1 = await api('GET', '/v1/sandboxes?limit=2', { key });
  const p1 = page1.json as { items: View[]; continue?: string };
  assert.equal(p1.items.length, 2);
  assert.ok(p1.continue !== undefined, 'a full page carries a continue token');
  const page2 = await api('GET', `/v1/sandboxes?limit=2&continue=${encodeURIComponent(p1.continue)}`, { key });
  const p2 = page2.json as { items: View[]; continue?: string };
  assert.equal(p2.items.length, 1);
  assert.equal(p2.continue, undefined);
  assert.equal(new Set([...p1.items, ...p2.items].map((v) => v.id)).size, 3);

  const dbs = await api('GET', '/v1/sandboxes?labelSelector=app%3Ddb', { key });
  assert.deepEqual((dbs.json as { items: View[] }).items.map((v) => v.labels.app), ['db', 'db']);
  // The third was created with wait: false, so it may still be starting: wait for it (the test
  // read it at once, and under load it was Pending: 2 !== 3).
  await waitFor(async () => ((await api('GET', '/v1/sandboxes?template=base&phase=Running', { key })).json as { items: View[] }).items.length === 3);
  const hibernated = await api('GET', '/v1/sandboxes?template=base&phase=Hibernated', { key });
  assert.equal((hibernated.json as { items: View[] }).items.length, 0, 'the phase filter filters');

  const exec = await api('POST', `/v1/sandboxes/${view.id}/exec`, { key, json: { command: ['sh', '-c', 'read x; echo "got $x from $GREETING"; exit 3'], stdin: 'input\n', env: { GREETING: 'hi' } } });
  assert.equal(exec.status, 200, exec.text);
  assert.deepEqual(exec.json, { exitCode: 3, stdout: 'got input from hi\n', stderr: '', timedOut: false, truncated: false });
  const terminalToken = await api('POST', `/v1/sandboxes/${view.id}/terminal-tokens`, { key });
  assert.equal(terminalToken.status, 201, terminalToken.text);
  assert.equal((await api('POST', `/v1/sandboxes/${view.id}/terminal-tokens`, { key: fx.keys.teamB })).status, 404, "another team's sandbox");
  assert.equal((await api('GET', `/v1/sandboxes/${view.id}/terminal`, { key })).status, 400, 'the terminal needs a WebSocket upgrade');
  const shell = await api('POST', `/v1/sandboxes/${view.id}/exec`, { key, json: { command: 'echo one; echo two >&2' } });
  assert.equal((shell.json as { stdout: string }).stdout, 'one\n');
  assert.equal((shell.json as { stderr: string }).stderr, 'two\n');

  const payload = new Uint8Array([0, 1, 2, 250, 255]);
  const put = await api('PUT', `/v1/sandboxes/${view.id}/files?path=/work/data.bin`, { key, body: payload, headers: { 'content-type': 'application/octet-stream' } });
  assert.equal(put.status, 204);
  const read = await api('GET', `/v1/sandboxes/${view.id}/files?path=/work/data.bin`, { key });
  assert.equal(read.status, 200);
  assert.deepEqual([...read.bytes], [...payload]);
  const listing = await api('GET', `/v1/sandboxes/${view.id}/files/list?path=/work`, { key });
  const entries = (listing.json as { entries: { name: string; size: number }[] }).entries;
  assert.deepEqual(entries.map((e) => [e.name, e.size]), [['data.bin', 5]]);
  const missing = await api('GET', `/v1/sandboxes/${view.id}/files?path=/work/nope`, { key });
  assert.equal(missing.status, 404);
  assert.match((missing.json as { detail: string }).detail, /\/work\/nope/);

  const paused = await api('POST', `/v1/sandboxes/${view.id}/pause`, { key });
  assert.equal(paused.status, 200);
  await waitFor(async () => ((await api('GET', `/v1/sandboxes/${view.id}`, { key })).json as View).phase === 'Hibernated');
  const execPaused = await api('POST', `/v1/sandboxes/${view.id}/exec`, { key, json: { command: 'true' } });
  assert.equal(execPaused.status, 409, 'exec on a hibernated sandbox says it is not running');
  assert.match((execPaused.json as { detail: string }).detail, /resume/);

  const resumed = await api('POST', `/v1/sandboxes/${view.id}/resume`, { key, json: { wait: true } });
  assert.equal(resumed.status, 200, resumed.text);
  assert.equal((resumed.json as View).ready, true);
  const afterWake = await api('GET', `/v1/sandboxes/${view.id}/files?path=/work/data.bin`, { key });
  assert.deepEqual([...afterWake.bytes], [...payload], 'files survive hibernation');

  const before = Date.now();
  const timed = await api('POST', `/v1/sandboxes/${view.id}/timeout`, { key, json: { timeoutMs: 3_600_000 } });
  assert.equal(timed.status, 200);
  const shutdown = Date.parse((timed.json as View).shutdownTime ?? '');
  assert.ok(shutdown >= before + 3_600_000 && shutdown <= Date.now() + 3_600_000, 'shutdownTime is an hour from now');

  const firstToken = ((await api('GET', `/v1/sandboxes/${view.id}`, { key })).json as View).accessToken;
  const rotated = await api('POST', `/v1/sandboxes/${view.id}/access-token`, { key });
  assert.equal(rotated.status, 200, rotated.text);
  assert.ok((rotated.json as View).accessToken !== undefined && (rotated.json as View).accessToken !== firstToken, 'a rotated sandbox answers with a new token');
  assert.equal((await api('POST', `/v1/sandboxes/${view.id}/access-token`, { key: fx.keys.teamB })).status, 404, "another team cannot rotate it");

  const deleted = await api('DELETE', `/v1/sandboxes/${view.id}`, { key });
  assert.equal(deleted.status, 202);
  assert.equal((deleted.json as View).phase, 'Terminating');
  await waitFor(async () => (await api('GET', `/v1/sandboxes/${view.id}`, { key })).status === 404);
  const gone = await api('GET', `/v1/sandboxes/${view.id}`, { key });
  assert.match((gone.json as { detail: string }).detail, new RegExp(view.id));
});

test('templates, pools, claims and apply', async (t) => {
  const fx = await start(t);
  const api = client(fx);
  const admin = fx.keys.admin;

  const templates = await api('GET', '/v1/templates', { key: fx.keys.teamA });
  assert.deepEqual((templates.json as { items: { metadata: { name: string } }[] }).items.map((i) => i.metadata.name), ['base']);
  assert.equal((await api('GET', '/v1/templates/base', { key: fx.keys.teamA })).status, 200);

  const python = { ...structuredClone(BASE_TEMPLATE), metadata: { name: 'python', namespace: 'default' } };
  const putT = await api('PUT', '/v1/templates/python', { key: admin, json: python });
  assert.equal(putT.status, 201, putT.text);
  const again = await api('PUT', '/v1/templates/python', { key: admin, json: python });
  assert.equal(again.status, 200);

  const pool = { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxWarmPool', metadata: { name: 'python-pool', namespace: 'default' }, spec: { replicas: 1, sandboxTemplateRef: { name: 'python' } } };
  const putP = await api('PUT', '/v1/pools/python-pool', { key: admin, json: pool });
  assert.equal(putP.status, 201, putP.text);
  assert.equal((await api('GET', '/v1/pools', { key: fx.keys.teamA })).status, 200);
  assert.equal((await api('GET', '/v1/pools/python-pool', { key: fx.keys.teamA })).status, 200);
  await waitFor(async () => {
    const s = (await api('GET', '/v1/status', { key: admin })).json as { pools: { name: string; readyReplicas: number }[] };
    return s.pools.some((p) => p.name === 'python-pool' && p.readyReplicas === 1);
  });
  const warm = await api('POST', '/v1/sandboxes', { key: fx.keys.teamA, json: { template: 'python' } });
  assert.equal(warm.status, 201, warm.text);
  assert.equal((warm.json as View).launchType, 'warm', 'a ready pool member is claimed, not cold-started');

  const claim = { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxClaim', metadata: { name: 'my-claim' }, spec: { sandboxTemplateRef: { name: 'base' } } };
  const applied = await api('POST', '/v1/apply', { key: fx.keys.teamA, json: { objects: [claim] } });
  assert.equal(applied.status, 200, applied.text);
  assert.deepEqual(applied.json, { results: [{ kind: 'SandboxClaim', namespace: 'default', name: 'my-claim', action: 'created' }] });
  const reapplied = await api('POST', '/v1/apply', { key: fx.keys.teamA, json: { objects: [claim] } });
  assert.equal((reapplied.json as { results: { action: string }[] }).results[0]?.action, 'unchanged');
  assert.equal((await api('GET', '/v1/claims', { key: fx.keys.teamA })).status, 200);
  assert.equal((await api('GET', '/v1/claims/my-claim', { key: fx.keys.teamA })).status, 200);
  assert.equal((await api('GET', '/v1/claims/my-claim', { key: fx.keys.teamB })).status, 404, 'claims are team-scoped');
  assert.equal((await api('DELETE', '/v1/claims/my-claim', { key: fx.keys.teamA })).status, 200);

  assert.equal((await api('DELETE', '/v1/pools/python-pool', { key: admin })).status, 200);
  assert.equal((await api('DELETE', '/v1/templates/python', { key: admin })).status, 200);
  assert.equal((await api('GET', '/v1/templates/python', { key: admin })).status, 404);
});

test('/healthz needs no key, /metrics is Prometheus text that promtool accepts', async (t) => {
  const fx = await start(t);
  const api = client(fx);
  assert.deepEqual((await api('GET', '/healthz')).json, { ok: true });
  await api('GET', '/v1/sandboxes', { key: fx.keys.teamA });
  const metrics = await api('GET', '/metrics', { key: fx.keys.admin });
  assert.equal(metrics.status, 200);
  assert.match(metrics.text, /asb_http_requests_total\{route="\/v1\/sandboxes",code="200"\} 1/, 'requests are counted by route pattern');
  // Errors by their code, on our API and on E2B's (which answers in its own shape).
  assert.equal((await call(fx, 'GET', '/v1/sandboxes')).status, 401);
  assert.equal((await call(fx, 'GET', '/v1/sandboxes/nosuchsandbox', { key: fx.keys.teamA })).status, 404);
  assert.equal((await call(fx, 'GET', '/sandboxes/nosuchsandbox', { key: fx.keys.teamA })).status, 404);
  const errors = (await api('GET', '/metrics', { key: fx.keys.admin })).text;
  assert.match(errors, /^asb_api_errors_total\{code="Unauthorized"\} 1$/m);
  assert.match(errors, /^asb_api_errors_total\{code="NotFound"\} 2$/m);
  const check = await promtool(metrics.text);
  assert.equal(check.code, 0, `promtool check metrics: ${check.output}`);
});

test('data plane: create returns accessToken and url; routers report activity and find the feed a WebSocket', async (t) => {
  const fx = await start(t);
  const api = client(fx);
  const created = await api('POST', '/v1/sandboxes', { key: fx.keys.teamA, json: {} });
  const view = created.json as View & { accessToken?: string; url?: string };
  assert.match(view.accessToken ?? '', /^[A-Za-z0-9_-]{32}$/);
  assert.equal(view.url, `http://49983-${view.id}.asb.localhost:10000`);
  assert.deepEqual((await api('POST', '/v1/activity', { key: fx.keys.admin, json: { ids: [view.id] } })).json, { touched: 1 });
  assert.equal((await api('POST', '/v1/activity', { key: fx.keys.teamA, json: { ids: [view.id] } })).status, 403, 'activity is for routers (admin keys)');
  assert.equal((await api('GET', '/v1/routes/feed', { key: fx.keys.admin })).status, 400, 'the feed needs a WebSocket upgrade');
  assert.equal((await api('GET', '/v1/routes/feed', { key: fx.keys.teamA })).status, 403);
});

test('the E2B routes answer in the documented shapes, errors as {code, message}', async (t) => {
  const fx = await start(t);
  const api = client(fx);
  const e2b = (method: string, path: string, json?: unknown, key: string = fx.keys.teamA) => api(method, path, { headers: { 'x-api-key': key }, ...(json === undefined ? {} : { json }) });

  const created = await e2b('POST', '/v2/sandboxes', { templateID: 'base', metadata: { 'user id': 'a&b=c' }, envVars: { FOO: 'bar' }, timeout: 60, secure: true });
  assert.equal(created.status, 201, created.text);
  const id = (created.json as { sandboxID: string }).sandboxID;
  assert.equal((await e2b('POST', '/sandboxes', { templateID: 'base' })).status, 201);
  const listed = await e2b('GET', `/v2/sandboxes?metadata=${encodeURIComponent(new URLSearchParams({ [encodeURIComponent('user id')]: encodeURIComponent('a&b=c') }).toString())}`);
  assert.deepEqual((listed.json as { sandboxID: string }[]).map((s) => s.sandboxID), [id]);
  assert.equal(((await e2b('GET', '/sandboxes?limit=1')).json as unknown[]).length, 1);
  assert.equal((await e2b('GET', `/sandboxes/${id}`)).status, 200);
  assert.equal((await e2b('GET', `/sandboxes/${id}/metrics`)).status, 200);
  assert.equal((await e2b('POST', `/sandboxes/${id}/timeout`, { timeout: 120 })).status, 204);
  assert.equal((await e2b('POST', `/sandboxes/${id}/connect`, { timeout: 30 })).status, 200, 'running: 200');
  assert.equal((await e2b('POST', `/sandboxes/${id}/pause`, {})).status, 204);
  assert.deepEqual((await e2b('POST', `/sandboxes/${id}/pause`, {})).json, { code: 409, message: `sandbox "${id}" is already paused; resume it with connect` });
  assert.equal((await e2b('POST', `/v2/sandboxes/${id}/connect`, {})).status, 201, 'paused: resumed, 201');
  assert.equal((await e2b('GET', `/sandboxes/${id}`, undefined, fx.keys.teamB)).status, 404, "another team's sandbox");
  // Snapshots and fork: this worker's runtime keeps no snapshots (test/snapshot-api.test.ts and
  // test/e2b-snapshots.test.ts run them on gVisor), so a snapshot is a 501 saying why.
  const snap = await e2b('POST', `/sandboxes/${id}/snapshots`, { name: 'x' });
  assert.equal(snap.status, 501, snap.text);
  assert.equal((await e2b('POST', `/sandboxes/${id}/fork`, { count: 2 })).status, 501);
  assert.deepEqual((await e2b('GET', `/snapshots?sandboxID=${id}`)).json, []);
  assert.equal((await e2b('DELETE', '/templates/no-such-snapshot')).status, 404);
  assert.equal((await e2b('DELETE', `/sandboxes/${id}`)).status, 204);
  assert.equal((await e2b('DELETE', `/sandboxes/${id}`)).status, 404);
  const unauthorized = await e2b('GET', '/v2/sandboxes', undefined, 'e2b_not_ours');
  assert.equal((unauthorized.json as { code: number }).code, 401);
});

test('egress secrets and credential rules: admin keys only, values write-only, bad input 4xx naming the field', async (t) => {
  const fx = await start(t);
  const api = client(fx);
  const key = fx.keys.admin;
  const value = 'Bearer sk-test-0123456789abcdef';
  assert.equal((await api('PUT', '/v1/egress/secrets/openai', { key: fx.keys.teamA, json: { value } })).status, 403, 'team keys cannot set secrets');
  const put = await api('PUT', '/v1/egress/secrets/openai', { key, json: { value } });
  assert.equal(put.status, 200, put.text);
  assert.doesNotMatch(put.text, /sk-test/, 'the answer never carries the value');
  const listed = await api('GET', '/v1/egress/secrets', { key });
  assert.deepEqual((listed.json as { items: { name: string }[] }).items.map((s) => s.name), ['openai']);
  assert.doesNotMatch(listed.text, /sk-test/);
  const badValue = await api('PUT', '/v1/egress/secrets/openai', { key, json: { value: 'a\r\nx-evil: 1' } });
  assert.equal(badValue.status, 422);
  assert.equal((badValue.json as { fields: { field: string }[] }).fields[0]?.field, 'value');
  assert.equal((await api('PUT', '/v1/egress/secrets/Bad_Name', { key, json: { value } })).status, 422);

  const rule = { host: 'api.openai.com', pathPrefix: '/v1/', header: 'Authorization', secret: 'openai' };
  const made = await api('PUT', '/v1/egress/credentials/openai', { key, json: rule });
  assert.equal(made.status, 200, made.text);
  assert.deepEqual(made.json, { id: 'openai', host: 'api.openai.com', pathPrefix: '/v1/', header: 'authorization', secret: 'openai' });
  const bad = await api('PUT', '/v1/egress/credentials/x', { key, json: { host: 'not a host', header: 'host', secret: 'missing', extra: 1 } });
  assert.equal(bad.status, 422);
  assert.deepEqual((bad.json as { fields: { field: string }[] }).fields.map((f) => f.field).sort(), ['extra', 'header', 'host']);
  const noSecret = await api('PUT', '/v1/egress/credentials/x', { key, json: { ...rule, secret: 'missing' } });
  assert.equal(noSecret.status, 422);
  assert.equal((await api('GET', '/v1/egress/credentials', { key: fx.keys.teamA })).status, 403);
  const rules = await api('GET', '/v1/egress/credentials', { key });
  assert.equal((rules.json as { items: unknown[] }).items.length, 1);
  assert.doesNotMatch(rules.text, /sk-test/);
  assert.equal((await api('DELETE', '/v1/egress/secrets/openai', { key })).status, 409, 'a secret a rule uses stays');
  assert.equal((await api('DELETE', '/v1/egress/credentials/openai', { key })).status, 204);
  assert.equal((await api('DELETE', '/v1/egress/credentials/openai', { key })).status, 404);
  assert.equal((await api('DELETE', '/v1/egress/secrets/openai', { key })).status, 204);
});

test('egress policy: the template\'s by default, replaced at create and while running (REST and E2B), given to the runtime; bad entries 422 and nothing changes', async (t) => {
  const fx = await start(t);
  const api = client(fx);
  const key = fx.keys.teamA;
  const e2b = (method: string, path: string, json?: unknown) => api(method, path, { headers: { 'x-api-key': key }, ...(json === undefined ? {} : { json }) });
  type Net = { internet: boolean; allow: string[]; deny: string[] };
  const template = (name: string, spec: Record<string, unknown>): Promise<unknown> =>
    fx.store.create(SandboxTemplateType, { ...structuredClone(BASE_TEMPLATE), metadata: { name, namespace: 'default' }, spec: { ...structuredClone(BASE_TEMPLATE.spec), ...spec } });
  await template('offline', { network: { internet: false, allow: ['198.51.100.0/24'] } });
  await template('sigs', { networkPolicy: { egress: [{ to: [{ ipBlock: { cidr: '0.0.0.0/0', except: ['203.0.113.0/24'] } }] }, { to: [{ ipBlock: { cidr: '10.239.5.0/24' } }], ports: [{ port: 5432 }] }] } });

  const plain = (await api('POST', '/v1/sandboxes', { key, json: {} })).json as { id: string; network: Net };
  assert.deepEqual(plain.network, { internet: true, allow: [], deny: [] }, 'the default');
  assert.deepEqual(fx.runtime.egress.get(plain.id), { internet: true, allow: [], deny: [] }, 'the runtime got it with the pod');
  const offline = (await api('POST', '/v1/sandboxes', { key, json: { template: 'offline' } })).json as { id: string; network: Net };
  assert.deepEqual(offline.network, { internet: false, allow: ['198.51.100.0/24'], deny: [] }, 'the template\'s');
  assert.deepEqual(fx.runtime.egress.get(offline.id), { internet: false, allow: ['198.51.100.0/24'], deny: [] });
  const sigs = (await api('POST', '/v1/sandboxes', { key, json: { template: 'sigs' } })).json as { network: Net };
  assert.deepEqual(sigs.network, { internet: true, allow: ['10.239.5.0/24'], deny: ['203.0.113.0/24'] }, 'kubernetes-sigs networkPolicy.egress');
  const own = await api('POST', '/v1/sandboxes', { key, json: { template: 'offline', network: { allow: ['API.example.com', '203.0.113.9/24'], deny: ['0.0.0.0/0'] } } });
  assert.equal(own.status, 201, own.text);
  const ownView = own.json as { id: string; network: Net };
  assert.deepEqual(ownView.network, { internet: true, allow: ['api.example.com', '203.0.113.0/24'], deny: ['0.0.0.0/0'] }, 'the create\'s replaces the template\'s, normalised');

  const before = (await fx.store.list(SandboxType, {})).items.length;
  const bad = await api('POST', '/v1/sandboxes', { key, json: { network: { allow: ['10.0.0.0/33'], internet: 'no' } } });
  assert.equal(bad.status, 422, bad.text);
  assert.deepEqual((bad.json as { fields: { field: string }[] }).fields.map((f) => f.field), ['network.internet']);
  assert.equal((await fx.store.list(SandboxType, {})).items.length, before, 'no sandbox made');

  const put = await api('PUT', `/v1/sandboxes/${plain.id}/network`, { key, json: { internet: false, allow: ['198.51.100.7'] } });
  assert.equal(put.status, 200, put.text);
  assert.deepEqual((put.json as { network: Net }).network, { internet: false, allow: ['198.51.100.7'], deny: [] });
  assert.deepEqual(fx.runtime.egress.get(plain.id), { internet: false, allow: ['198.51.100.7'], deny: [] }, 'applied to the running pod before the answer');
  const badPut = await api('PUT', `/v1/sandboxes/${plain.id}/network`, { key, json: { allow: ['not a host'] } });
  assert.equal(badPut.status, 422);
  assert.deepEqual((badPut.json as { fields: { field: string }[] }).fields.map((f) => f.field), ['body.allow[0]']);
  assert.deepEqual(((await api('GET', `/v1/sandboxes/${plain.id}`, { key })).json as { network: Net }).network.allow, ['198.51.100.7'], 'unchanged by the refused PUT');
  assert.equal((await api('PUT', `/v1/sandboxes/${plain.id}/network`, { key: fx.keys.teamB, json: {} })).status, 404, "another team's sandbox");

  // Hibernate and wake: the pod is started again with the policy the Sandbox holds.
  fx.runtime.egress.delete(plain.id);
  assert.equal((await api('POST', `/v1/sandboxes/${plain.id}/pause`, { key, json: {} })).status, 200);
  // Snapshots: refused with the reason where the runtime keeps none; nothing is left behind.
  const taken = await api('POST', `/v1/sandboxes/${plain.id}/snapshots`, { key, json: { name: 'first' } });
  assert.equal(taken.status, 501, taken.text);
  assert.match(taken.text, /keeps no snapshots/);
  assert.deepEqual((await api('GET', '/v1/snapshots', { key })).json, { items: [] });
  assert.equal((await api('GET', '/v1/snapshots/first', { key })).status, 404);
  assert.equal((await api('DELETE', '/v1/snapshots/first', { key })).status, 404);
  assert.equal((await api('POST', '/v1/snapshots/first/sandboxes', { key, json: {} })).status, 404);
  assert.equal((await api('POST', `/v1/sandboxes/${plain.id}/fork`, { key, json: { count: 2 } })).status, 501);
  assert.equal((await api('POST', `/v1/sandboxes/${plain.id}/resume`, { key, json: {} })).status, 200);
  assert.deepEqual(fx.runtime.egress.get(plain.id), { internet: false, allow: ['198.51.100.7'], deny: [] });

  // E2B: create with allow_internet_access and network, getInfo, updateNetwork.
  const created = await e2b('POST', '/v2/sandboxes', { templateID: 'base', allow_internet_access: false, network: { allowOut: ['api.example.com'], denyOut: ['198.51.100.0/24'], allowPublicTraffic: true } });
  assert.equal(created.status, 201, created.text);
  const id = (created.json as { sandboxID: string }).sandboxID;
  const info = (await e2b('GET', `/sandboxes/${id}`)).json as { allowInternetAccess: boolean; network: { allowOut: string[]; denyOut: string[] } };
  assert.deepEqual([info.allowInternetAccess, info.network], [false, { allowOut: ['api.example.com'], denyOut: ['198.51.100.0/24'] }]);
  assert.equal((await e2b('PUT', `/sandboxes/${id}/network`, { allowOut: ['1.1.1.1'], denyOut: ['0.0.0.0/0'] })).status, 204);
  assert.deepEqual(fx.runtime.egress.get(id), { internet: true, allow: ['1.1.1.1'], deny: ['0.0.0.0/0'] }, 'omitted fields cleared: allow_internet_access back to true');
  const refused = await e2b('PUT', `/sandboxes/${id}/network`, { egressProxy: { address: 'socks5://x:1080' } });
  assert.equal((refused.json as { code: number }).code, 400, refused.text);
  const sdk250 = await e2b('POST', '/sandboxes', { templateID: 'offline', allow_internet_access: true, secure: true });
  const kept = (await e2b('GET', `/sandboxes/${(sdk250.json as { sandboxID: string }).sandboxID}`)).json as { allowInternetAccess: boolean };
  assert.equal(kept.allowInternetAccess, false, 'the 2.50 SDK\'s constant allow_internet_access: true keeps the template\'s policy');
});

test('egress proxy off: a policy naming a domain is refused (422 naming each entry) at create and PUT, REST and E2B; CIDR policies still go; nothing made or changed', async (t) => {
  // Without the proxy a domain entry decides nothing: deny ["evil.example"] beside the internet
  // would let it through, allow ["api.example.com"] beside internet off would open nothing.
  const fx = await startWorkerFixture((fn) => t.after(fn), {}, { egressProxy: false });
  const api = client(fx);
  const key = fx.keys.teamA;
  const e2b = (method: string, path: string, json?: unknown) => api(method, path, { headers: { 'x-api-key': key }, ...(json === undefined ? {} : { json }) });
  const fields = (r: ApiResponse): string[] => (r.json as { fields: { field: string }[] }).fields.map((f) => f.field);
  const before = (await fx.store.list(SandboxType, {})).items.length;
  const denyDomain = await api('POST', '/v1/sandboxes', { key, json: { network: { deny: ['evil.example', '203.0.113.0/24'] } } });
  assert.equal(denyDomain.status, 422, denyDomain.text);
  assert.deepEqual(fields(denyDomain), ['network.deny[0]']);
  assert.match(denyDomain.text, /egress proxy is off/);
  const allowDomain = await api('POST', '/v1/sandboxes', { key, json: { network: { internet: false, allow: ['*.example.com'] } } });
  assert.deepEqual([allowDomain.status, fields(allowDomain)], [422, ['network.allow[0]']]);
  const e2bCreate = await e2b('POST', '/v2/sandboxes', { templateID: 'base', network: { allowOut: ['api.example.com'], denyOut: ['0.0.0.0/0'] } });
  assert.equal((e2bCreate.json as { code: number }).code, 400, e2bCreate.text);
  assert.match(e2bCreate.text, /network\.allowOut\[0\]/);
  assert.equal((await fx.store.list(SandboxType, {})).items.length, before, 'no sandbox made');

  const plain = await api('POST', '/v1/sandboxes', { key, json: { network: { internet: false, allow: ['198.51.100.0/24'] } } });
  assert.equal(plain.status, 201, plain.text);
  const id = (plain.json as { id: string }).id;
  const put = await api('PUT', `/v1/sandboxes/${id}/network`, { key, json: { deny: ['evil.example'] } });
  assert.deepEqual([put.status, fields(put)], [422, ['body.deny[0]']]);
  const e2bPut = await e2b('PUT', `/sandboxes/${id}/network`, { denyOut: ['evil.example'] });
  assert.equal((e2bPut.json as { code: number }).code, 400, e2bPut.text);
  assert.deepEqual(fx.runtime.egress.get(id), { internet: false, allow: ['198.51.100.0/24'], deny: [] }, 'the running pod keeps its policy');
  assert.equal((await api('PUT', `/v1/sandboxes/${id}/network`, { key, json: { internet: true, deny: ['203.0.113.0/24'] } })).status, 200, 'CIDRs need no proxy');
});

test('E2B\'s build API answers in the documented shapes: request, upload, build, status, logs, list, tags, update, delete', async (t) => {
  const fx = await start(t);
  const api = client(fx);
  const e2b = (method: string, path: string, json?: unknown, key: string = fx.keys.teamA) => api(method, path, { headers: { 'x-api-key': key }, ...(json === undefined ? {} : { json }) });
  const requested = await e2b('POST', '/v3/templates', { name: 'docs-env', tags: ['v1'], cpuCount: 1, memoryMB: 512 });
  assert.equal(requested.status, 202, requested.text);
  const { templateID, buildID } = requested.json as { templateID: string; buildID: string };
  const hash = 'd'.repeat(64);
  const link = await e2b('GET', `/templates/${templateID}/files/${hash}`);
  assert.equal(link.status, 201);
  const url = new URL((link.json as { url: string }).url);
  const ctx = mkdtempSync(join(tmpdir(), 'asb-docs-'));
  t.after(() => rmSync(ctx, { recursive: true, force: true }));
  writeFileSync(join(ctx, 'a.txt'), 'a');
  const tar = new Uint8Array(execFileSync('tar', ['-cf', '-', '-C', ctx, 'a.txt']));
  assert.equal((await api('PUT', url.pathname + url.search, { body: tar })).status, 200);
  assert.equal((await api('PUT', url.pathname, { body: tar })).status, 401);
  const started = await e2b('POST', `/v2/templates/${templateID}/builds/${buildID}`, { fromImage: 'debian:12', force: false, steps: [{ type: 'COPY', args: ['a.txt', '/a.txt'], filesHash: hash, force: false }, { type: 'ENV', args: ['A', '1'], force: false }], startCmd: 'sleep 1', readyCmd: 'true' });
  assert.equal(started.status, 202, started.text);
  await waitFor(async () => ((await e2b('GET', `/templates/${templateID}/builds/${buildID}/status?logsOffset=0`)).json as { status: string }).status === 'ready');
  const logs = await e2b('GET', `/templates/${templateID}/builds/${buildID}/logs?limit=10`);
  assert.ok((logs.json as { logs: unknown[] }).logs.length > 0);
  assert.equal(((await e2b('GET', '/templates')).json as unknown[]).length, 1);
  assert.equal(((await e2b('GET', '/v2/templates', undefined, fx.keys.teamB)).json as unknown[]).length, 0);
  assert.equal(((await e2b('GET', `/templates/${templateID}`)).json as { builds: unknown[] }).builds.length, 1);
  assert.deepEqual((await e2b('GET', '/templates/aliases/docs-env')).json, { templateID, public: false });
  assert.equal((await e2b('GET', '/templates/aliases/docs-env', undefined, fx.keys.teamB)).status, 404);
  assert.equal((await e2b('POST', '/templates/tags', { target: 'docs-env:v1', tags: ['stable'] })).status, 201);
  assert.deepEqual(((await e2b('GET', `/templates/${templateID}/tags`)).json as { tag: string }[]).map((x) => x.tag).sort(), ['default', 'stable', 'v1']);
  assert.equal((await e2b('DELETE', '/templates/tags', { name: 'docs-env', tags: ['stable'] })).status, 204);
  assert.equal((await e2b('PATCH', `/templates/${templateID}`, { public: false })).status, 200);
  assert.equal((await e2b('PATCH', `/v2/templates/${templateID}`, { public: true })).status, 400);
  assert.equal((await e2b('DELETE', `/templates/${templateID}`, undefined, fx.keys.teamB)).status, 404);
  assert.equal((await e2b('DELETE', `/templates/${templateID}`)).status, 204);
  assert.equal((await e2b('GET', `/templates/${templateID}`)).status, 404);
});

test('template build routes on a worker without a build service: 501 saying so, in the documented shape', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const api = client(fx);
  const key = fx.keys.teamA;
  const hash = 'a'.repeat(64);
  for (const [method, path, json] of [
    ['GET', `/v1/templates/web/files/${hash}`, undefined],
    ['PUT', `/v1/templates/web/files/${hash}`, undefined],
    ['POST', '/v1/templates/web/builds', { from: { image: 'agent-sandbox/base' } }],
    ['GET', '/v1/templates/web/builds/b1', undefined],
    ['GET', '/v1/templates/web/builds/b1/logs', undefined],
  ] as const) {
    const res = await api(method, path, { key, ...(json === undefined ? {} : { json }) });
    assert.equal(res.status, 501, `${method} ${path}: ${res.text}`);
    assert.match((res.json as { detail: string }).detail, /template builds are not enabled on this worker/);
  }
  const built = await api('GET', '/v1/built-templates', { key });
  assert.equal(built.status, 200, 'a worker that builds nothing has built nothing');
  assert.deepEqual(built.json, { items: [] });
});

test('the events API and webhooks answer in their documented shapes, ours and E2B\'s', async (t) => {
  const fx = await start(t);
  const api = client(fx);
  const key = fx.keys.teamA;
  const created = await api('POST', '/v1/sandboxes', { key, json: {} });
  const id = (created.json as View).id;
  await waitFor(async () => ((await call(fx, 'GET', `/v1/events/sandboxes/${id}`, { key })).json as unknown[] | undefined)?.length === 2);
  for (const [prefix, auth] of [['/v1', { key }], ['', { headers: { 'x-api-key': key } }]] as const) {
    const events = await api('GET', `${prefix}/events/sandboxes/${id}?orderAsc=true&types=sandbox.lifecycle.created&types=sandbox.lifecycle.ready`, auth);
    assert.deepEqual((events.json as { type: string }[]).map((e) => e.type), ['sandbox.lifecycle.created', 'sandbox.lifecycle.ready']);
    assert.equal(((await api('GET', `${prefix}/events/sandboxes?limit=1`, auth)).json as unknown[]).length, 1);
    assert.equal((await api('GET', `${prefix}/events/sandboxes/nope`, auth)).status, 404);
    // A public name (this worker refuses private ones): never delivered to, as the webhook wants killed events only and is deleted before any.
    const hook = await api('POST', `${prefix}/events/webhooks`, { ...auth, json: { url: 'https://hooks.example.com/hook', signatureSecret: 'a-secret-of-16-chars', events: ['sandbox.lifecycle.killed'], enabled: false } });
    assert.equal(hook.status, 201, hook.text);
    const hookId = (hook.json as { id: string }).id;
    assert.equal(((await api('GET', `${prefix}/events/webhooks`, auth)).json as unknown[]).length, 1);
    assert.equal(((await api('GET', `${prefix}/events/webhooks/${hookId}`, auth)).json as { enabled: boolean }).enabled, false);
    assert.equal(((await api('PATCH', `${prefix}/events/webhooks/${hookId}`, { ...auth, json: { enabled: true } })).json as { enabled: boolean }).enabled, true);
    assert.deepEqual((await api('GET', `${prefix}/events/webhooks/${hookId}/deliveries`, auth)).json, []);
    assert.equal((await api('DELETE', `${prefix}/events/webhooks/${hookId}`, auth)).status, 204);
    assert.equal((await api('GET', `${prefix}/events/webhooks/${hookId}`, auth)).status, 404);
  }
});

test('docs/openapi.yaml documents exactly the routes the server registers, and the tests exercised them all', () => {
  assert.deepEqual(checker.operations(), registered);
  assert.deepEqual([...checker.exercised].sort(), registered);
});

async function waitFor(condition: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error('condition not met within the deadline');
    // 10 ms between polls: the operator settles in a few ms; this just avoids a hot loop.
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

function promtool(text: string): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn('promtool', ['check', 'metrics'], { stdio: ['pipe', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, output }));
    child.stdin.end(text);
  });
}
