// Every class of bad input gets a 4xx problem naming what was wrong, never a 500, and leaves no
// partial state behind in the store.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { SandboxTemplateType, SandboxType, SandboxWarmPoolType } from '../src/api/types.ts';
import { argvFields, MAX_ARG_BYTES, MAX_SPAWN_BYTES, spawnProblems } from '../src/worker/input.ts';
import { BASE_TEMPLATE, call, startWorkerFixture, type ApiResponse } from './support/worker-fixture.ts';

interface ProblemBody { code: string; detail: string; fields?: { field: string; message: string }[] }

function problem(res: ApiResponse): ProblemBody {
  assert.equal(res.headers.get('content-type'), 'application/problem+json', `a problem+json body, got ${res.text}`);
  return res.json as ProblemBody;
}

test('bad input is a 4xx naming the problem, never a 500, and writes nothing', async (t) => {
  // A small upload limit so the oversize-upload case needs only a few bytes.
  const fx = await startWorkerFixture((fn) => t.after(fn), { uploadBytes: 1024 });
  const key = fx.keys.teamA;
  const admin = fx.keys.admin;
  const raw = (method: string, path: string, body: string, type = 'application/json'): Promise<ApiResponse> =>
    call(fx, method, path, { key, body, headers: { 'content-type': type } });

  await t.test('malformed JSON: 400 with the parser position', async () => {
    const res = await raw('POST', '/v1/sandboxes', '{"template": "base",');
    assert.equal(res.status, 400);
    const p = problem(res);
    assert.equal(p.code, 'MalformedJson');
    assert.match(p.detail, /position|line/);
  });

  await t.test('unknown field: 422 naming it', async () => {
    const res = await call(fx, 'POST', '/v1/sandboxes', { key, json: { templat: 'base' } });
    assert.equal(res.status, 422);
    assert.deepEqual(problem(res).fields?.map((f) => f.field), ['templat']);
  });

  await t.test('wrong types: 422 naming every bad field at once', async () => {
    const res = await call(fx, 'POST', '/v1/sandboxes', { key, json: { timeoutMs: '10', wait: 'yes', labels: { a: 1 } } });
    assert.equal(res.status, 422);
    assert.deepEqual(problem(res).fields?.map((f) => f.field).sort(), ['labels.a', 'timeoutMs', 'wait']);
  });

  await t.test('a body that is not an object: 400', async () => {
    const res = await call(fx, 'POST', '/v1/sandboxes', { key, json: [1, 2] });
    assert.equal(res.status, 400);
    assert.match(problem(res).detail, /JSON object/);
  });

  await t.test('reserved or malformed labels: 422 naming the label', async () => {
    const res = await call(fx, 'POST', '/v1/sandboxes', { key, json: { labels: { 'asb.dev/owner': 'team-b', 'bad key': 'x' } } });
    assert.equal(res.status, 422);
    assert.deepEqual(problem(res).fields?.map((f) => f.field).sort(), ['labels.asb.dev/owner', 'labels.bad key']);
  });

  await t.test('oversize JSON body: 413', async () => {
    const res = await raw('POST', '/v1/sandboxes', JSON.stringify({ labels: { a: 'x'.repeat(2 * 1024 * 1024) } }));
    assert.equal(res.status, 413);
    assert.equal(problem(res).code, 'PayloadTooLarge');
  });

  await t.test('non-JSON content type on a JSON route: 415', async () => {
    const res = await raw('POST', '/v1/sandboxes', 'template=base', 'application/x-www-form-urlencoded');
    assert.equal(res.status, 415);
    assert.match(problem(res).detail, /application\/json/);
  });

  await t.test('unknown template: 404 naming it', async () => {
    const res = await call(fx, 'POST', '/v1/sandboxes', { key, json: { template: 'no-such-template' } });
    assert.equal(res.status, 404);
    assert.match(problem(res).detail, /no-such-template/);
  });

  await t.test('unknown ids: 404 naming the id, on every sandbox route', async () => {
    for (const [method, path] of [['GET', ''], ['DELETE', ''], ['POST', '/pause'], ['POST', '/resume'], ['GET', '/files?path=/a']] as const) {
      const res = await call(fx, method, `/v1/sandboxes/nosuchbox${path}`, { key });
      assert.equal(res.status, 404, `${method} ${path}`);
      assert.match(problem(res).detail, /nosuchbox/);
    }
    const exec = await call(fx, 'POST', '/v1/sandboxes/nosuchbox/exec', { key, json: { command: 'true' } });
    assert.equal(exec.status, 404);
    const weird = await call(fx, 'GET', '/v1/sandboxes/..%2F..%2Fetc', { key });
    assert.equal(weird.status, 404);
    const badEscape = await call(fx, 'GET', '/v1/sandboxes/%E0%A4%A', { key });
    assert.equal(badEscape.status, 400);
  });

  await t.test('unknown route: 404; wrong method: 405 with Allow', async () => {
    const unknown = await call(fx, 'GET', '/v1/nothing-here', { key });
    assert.equal(unknown.status, 404);
    assert.match(problem(unknown).detail, /openapi/);
    const wrong = await call(fx, 'PATCH', '/v1/sandboxes', { key });
    assert.equal(wrong.status, 405);
    assert.equal(wrong.headers.get('allow'), 'POST, GET');
    assert.equal(problem(wrong).code, 'MethodNotAllowed');
  });

  await t.test('bad query parameters: 400 naming them', async () => {
    for (const query of ['limit=0', 'limit=abc', 'labelSelector=%3D%3D', 'phase=Sleeping', 'template=Not_A_Name']) {
      const res = await call(fx, 'GET', `/v1/sandboxes?${query}`, { key });
      assert.equal(res.status, 400, query);
      assert.ok(problem(res).detail.includes(query.split('=')[0] ?? ''), `${query}: ${res.text}`);
    }
    const token = await call(fx, 'GET', '/v1/sandboxes?limit=1&continue=garbage', { key });
    assert.ok(token.status >= 400 && token.status < 500, `a bad continue token is a 4xx, got ${token.status}`);
  });

  await t.test('exec and files inputs are checked before anything runs', async () => {
    const created = await call(fx, 'POST', '/v1/sandboxes', { key, json: {} });
    assert.equal(created.status, 201, created.text);
    const id = (created.json as { id: string }).id;
    const empty = await call(fx, 'POST', `/v1/sandboxes/${id}/exec`, { key, json: { command: [] } });
    assert.equal(empty.status, 422);
    assert.deepEqual(problem(empty).fields?.map((f) => f.field), ['command']);
    const noCmd = await call(fx, 'POST', `/v1/sandboxes/${id}/exec`, { key, json: { cwd: 'relative' } });
    assert.equal(noCmd.status, 422);
    assert.deepEqual(problem(noCmd).fields?.map((f) => f.field), ['command']);
    const relative = await call(fx, 'GET', `/v1/sandboxes/${id}/files?path=etc/passwd`, { key });
    assert.equal(relative.status, 400);
    assert.match(problem(relative).detail, /absolute/);
    const noPath = await call(fx, 'GET', `/v1/sandboxes/${id}/files/list`, { key });
    assert.equal(noPath.status, 400);
    const big = await call(fx, 'PUT', `/v1/sandboxes/${id}/files?path=/big`, { key, body: new Uint8Array(4096) });
    assert.equal(big.status, 413);
    const read = await call(fx, 'GET', `/v1/sandboxes/${id}/files?path=/big`, { key });
    assert.equal(read.status, 404, 'a rejected upload writes no file');
    const timeout = await call(fx, 'POST', `/v1/sandboxes/${id}/timeout`, { key, json: {} });
    assert.equal(timeout.status, 422);
    assert.deepEqual(problem(timeout).fields?.map((f) => f.field), ['timeoutMs']);
    assert.equal((await call(fx, 'DELETE', `/v1/sandboxes/${id}`, { key })).status, 202);
  });

  await t.test('security probe L2: E2B create with envVars a program cannot be given is 400 naming the variable, and creates nothing', async () => {
    for (const [envVars, field] of [[{ A: 'x\0y' }, 'envVars.A'], [{ 'B\0C': 'x' }, 'envVars.B\0C'], [{ 'D=E': 'x' }, 'envVars.D=E'], [{ BIG: 'x'.repeat(200 * 1024) }, 'envVars.BIG']] as const) {
      const res = await call(fx, 'POST', '/sandboxes', { headers: { 'x-api-key': key }, json: { templateID: 'base', envVars } });
      assert.equal(res.status, 400, `${field}: ${res.text.slice(0, 300)}`);
      const body = res.json as { code: number; message: string };
      assert.equal(body.code, 400);
      assert.ok(body.message.includes(`${field}:`), body.message.slice(0, 300));
    }
  });

  await t.test('apply: one invalid object means nothing is applied', async () => {
    const template = { ...structuredClone(BASE_TEMPLATE), metadata: { name: 'applied-template' } };
    const pool = { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxWarmPool', metadata: { name: 'p' }, spec: { replicas: 'three', sandboxTemplateRef: { name: 'applied-template' } } };
    const res = await call(fx, 'POST', '/v1/apply', { key: admin, json: { objects: [template, pool] } });
    assert.equal(res.status, 422);
    assert.ok(problem(res).fields?.some((f) => f.field === 'objects[1].spec.replicas'), res.text);
    assert.equal(await fx.store.tryGet(SandboxTemplateType, 'default', 'applied-template'), undefined, 'the valid template was not written');
    const extra = await call(fx, 'POST', '/v1/apply', { key: admin, json: { objects: [], force: true } });
    assert.equal(extra.status, 422);
    assert.deepEqual(problem(extra).fields?.map((f) => f.field), ['force']);
  });

  await t.test('PUT with a body that disagrees with the path: 422 naming metadata.name', async () => {
    const res = await call(fx, 'PUT', '/v1/templates/other', { key: admin, json: BASE_TEMPLATE });
    assert.equal(res.status, 422);
    assert.ok(problem(res).fields?.some((f) => f.field === 'metadata.name'));
  });

  // Nothing above left an object behind, and nothing was a 500.
  await waitFor(async () => (await fx.store.list(SandboxType)).items.every((s) => s.metadata.labels?.['asb.dev/owner'] === undefined));
  assert.deepEqual((await fx.store.list(SandboxTemplateType)).items.map((i) => i.metadata.name), ['base']);
  assert.deepEqual((await fx.store.list(SandboxWarmPoolType)).items, []);
  const metrics = await call(fx, 'GET', '/metrics', { key: admin });
  assert.doesNotMatch(metrics.text, /code="5\d\d"/, 'no request ended in a 5xx');
});

async function waitFor(condition: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error('condition not met within the deadline');
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

test('spawnProblems: the limits are execve\'s, counted in bytes, and every bad field is named at once', () => {
  const fields = (input: Parameters<typeof spawnProblems>[0]): string[] => spawnProblems(input).map((p) => p.field);
  assert.deepEqual(fields({ argv: argvFields('command', ['echo', 'x'.repeat(MAX_ARG_BYTES)]) }), [], 'MAX_ARG_BYTES itself is allowed');
  assert.deepEqual(fields({ argv: argvFields('command', ['echo', 'x'.repeat(MAX_ARG_BYTES + 1)]) }), ['command[1]']);
  // 'é' is 2 bytes in UTF-8: half as many characters already pass the limit.
  assert.deepEqual(fields({ argv: argvFields('command', ['echo', 'é'.repeat(MAX_ARG_BYTES / 2 + 1)]) }), ['command[1]']);
  // NAME=value is one string to execve: the name counts too.
  assert.deepEqual(fields({ argv: argvFields('command', 'true'), env: { field: 'env', vars: { AB: 'x'.repeat(MAX_ARG_BYTES - 2) } } }), ['env.AB'], 'AB= and its value: one byte over');
  assert.deepEqual(
    fields({ argv: argvFields('command', ['a\0', 'b']), env: { field: 'env', vars: { '': 'x', 'A=B': 'y', C: 'z\0' } }, cwd: { field: 'cwd', value: '/\0' } }),
    ['command[0]', 'env', 'env.A=B', 'env.C', 'cwd'],
  );
  const many = Array.from({ length: Math.ceil(MAX_SPAWN_BYTES / 100_000) }, () => 'y'.repeat(100_000));
  assert.deepEqual(fields({ argv: argvFields('process.args', many) }), ['process.args'], 'too much together names the command');
  assert.deepEqual(fields({ argv: argvFields('command', 'true'), env: { field: 'envVars', vars: Object.fromEntries(many.map((v, i) => [`V${i}`, v])) } }), ['envVars'], 'or the environment, when it is the larger part');
});
