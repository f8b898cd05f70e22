// API keys: stored only as a hash, verified from memory, revocable; every route but /healthz
// needs one; admins alone write templates and pools; one team cannot see or touch another's
// sandboxes (it gets the same 404 as for an id that does not exist).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { test } from 'node:test';
import { ApiKeyType, type ApiKey } from '../src/api/types.ts';
import { createApiKey, revokeApiKey } from '../src/auth/keys.ts';
import { KeyRing } from '../src/auth/keyring.ts';
import { CLUSTER_SCOPE } from '../src/store/store.ts';
import { silentLogger } from '../src/base/log.ts';
import { BASE_TEMPLATE, call, startWorkerFixture } from './support/worker-fixture.ts';

async function waitFor(condition: () => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error('condition not met within the deadline');
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

test('a key is stored only as its sha256, and the key ring follows creation and revocation', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const { key, object } = await createApiKey(fx.store, { team: 'team-c', description: 'ci' });
  assert.match(key, /^asb_[a-z0-9]{8}_[a-z0-9]{32}$/);
  const stored = await fx.store.get(ApiKeyType, CLUSTER_SCOPE, object.metadata.name);
  const text = JSON.stringify(stored);
  assert.ok(!text.includes(key.slice(13)), 'the secret is not stored');
  assert.equal(object.spec.hash, createHash('sha256').update(key).digest('hex'));

  const ring = await KeyRing.open({ store: fx.store, log: silentLogger() });
  t.after(() => ring.close());
  assert.deepEqual(ring.verify(key), { team: 'team-c', admin: false, prefix: object.spec.prefix });
  const wrongSecret = key.slice(0, -1) + (key.endsWith('a') ? 'b' : 'a');
  assert.equal(ring.verify(wrongSecret), undefined, 'right prefix, wrong secret');
  assert.equal(ring.verify('not-a-key'), undefined);

  const later = await createApiKey(fx.store, { team: 'team-d', admin: true });
  await waitFor(() => ring.verify(later.key)?.admin === true);
  await revokeApiKey(fx.store, object.spec.prefix);
  await waitFor(() => ring.verify(key) === undefined);

  await assert.rejects(createApiKey(fx.store, { team: 'not a team!' }), /team/);
});

test('the key ring announces a key that stops verifying or grants less, by prefix, and no other change', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const ring = await KeyRing.open({ store: fx.store, log: silentLogger() });
  t.after(() => ring.close());
  const announced: string[] = [];
  const unsubscribe = ring.onRevoked((prefix) => announced.push(prefix));
  const edit = async (name: string, spec: Partial<ApiKey['spec']>): Promise<void> => {
    const current = await fx.store.get<ApiKey>(ApiKeyType, CLUSTER_SCOPE, name);
    await fx.store.update<ApiKey>(ApiKeyType, { ...current, spec: { ...current.spec, ...spec } });
  };
  const a = await createApiKey(fx.store, { team: 'team-a', admin: true });
  const b = await createApiKey(fx.store, { team: 'team-b' });
  await waitFor(() => ring.live(a.object.spec.prefix) && ring.live(b.object.spec.prefix));
  assert.equal(ring.live(a.object.metadata.name), false, 'live() takes the prefix with its asb_');

  await edit(b.object.metadata.name, { description: 'renamed' });
  await edit(a.object.metadata.name, { admin: false });
  await waitFor(() => ring.verify(a.key)?.admin === false);
  await edit(b.object.metadata.name, { team: 'team-c' });
  await waitFor(() => ring.verify(b.key)?.team === 'team-c');
  await revokeApiKey(fx.store, a.object.spec.prefix);
  await waitFor(() => !ring.live(a.object.spec.prefix));
  await fx.store.delete(ApiKeyType, CLUSTER_SCOPE, b.object.metadata.name);
  await waitFor(() => !ring.live(b.object.spec.prefix));
  // A description change is no loss; losing admin, changing team, revoking and deleting are.
  assert.deepEqual(announced, [a.object.spec.prefix, b.object.spec.prefix, a.object.spec.prefix, b.object.spec.prefix]);
  unsubscribe();
});

test('requests without a valid key get 401 saying how to pass one', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const none = await call(fx, 'GET', '/v1/sandboxes');
  assert.equal(none.status, 401);
  assert.equal(none.headers.get('content-type'), 'application/problem+json');
  assert.match((none.json as { detail: string }).detail, /Authorization: Bearer/);
  assert.match(none.headers.get('www-authenticate') ?? '', /Bearer/);
  const unknownRoute = await call(fx, 'GET', '/v1/secret-stuff');
  assert.equal(unknownRoute.status, 401, 'unauthenticated callers learn nothing about routes');
  const forged = await call(fx, 'GET', '/v1/sandboxes', { key: 'asb_aaaaaaaa_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb' });
  assert.equal(forged.status, 401);
  const viaHeader = await call(fx, 'GET', '/v1/sandboxes', { headers: { 'x-api-key': fx.keys.teamA } });
  assert.equal(viaHeader.status, 200, 'X-API-Key works as well as Authorization');
  assert.equal((await call(fx, 'GET', '/metrics')).status, 401);

  const { key, object } = await createApiKey(fx.store, { team: 'team-a' });
  await waitFor(async () => (await call(fx, 'GET', '/v1/status', { key })).status === 200);
  await revokeApiKey(fx.store, object.metadata.name);
  await waitFor(async () => (await call(fx, 'GET', '/v1/status', { key })).status === 401);
});

test('a refused /mcp call is answered as the API refuses, and counted as the API counts its refusals', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const rpc = { json: { jsonrpc: '2.0', id: 1, method: 'tools/list' }, headers: { accept: 'application/json, text/event-stream' } };
  const none = await call(fx, 'POST', '/mcp', rpc);
  assert.equal(none.status, 401);
  assert.equal(none.headers.get('content-type'), 'application/problem+json');
  assert.equal((none.json as { code: string }).code, 'Unauthorized');
  assert.match((none.json as { detail: string }).detail, /no API key: .*Authorization: Bearer/);
  assert.match(none.headers.get('www-authenticate') ?? '', /^Bearer realm="asb"/);
  const forged = await call(fx, 'POST', '/mcp', { ...rpc, key: 'asb_aaaaaaaa_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb' });
  assert.equal(forged.status, 401);
  assert.match((forged.json as { detail: string }).detail, /unknown to the worker or revoked/);
  const listed = await call(fx, 'POST', '/mcp', { ...rpc, key: fx.keys.teamA });
  assert.equal(listed.status, 200, 'a valid key still gets through');
  assert.ok(((listed.json as { result?: { tools?: unknown[] } }).result?.tools?.length ?? 0) > 0, listed.text);
  const metrics = (await call(fx, 'GET', '/metrics', { key: fx.keys.admin })).text;
  assert.match(metrics, /^asb_http_requests_total\{route="\/mcp",code="401"\} 2$/m);
  assert.match(metrics, /^asb_api_errors_total\{code="Unauthorized"\} 2$/m);
});

test('only admin keys write templates and pools', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const template = { ...structuredClone(BASE_TEMPLATE), metadata: { name: 'mine', namespace: 'default' } };
  const put = await call(fx, 'PUT', '/v1/templates/mine', { key: fx.keys.teamA, json: template });
  assert.equal(put.status, 403);
  assert.match((put.json as { detail: string }).detail, /admin/);
  const applied = await call(fx, 'POST', '/v1/apply', { key: fx.keys.teamA, json: { objects: [template] } });
  assert.equal(applied.status, 403);
  assert.equal((await call(fx, 'DELETE', '/v1/templates/base', { key: fx.keys.teamA })).status, 403);
  assert.equal((await call(fx, 'GET', '/v1/templates/base', { key: fx.keys.teamA })).status, 200, 'reading is allowed');
  assert.equal((await call(fx, 'PUT', '/v1/templates/mine', { key: fx.keys.admin, json: template })).status, 201);
});

test("one team can neither see nor touch another team's sandboxes", async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const a = fx.keys.teamA;
  const b = fx.keys.teamB;
  const created = await call(fx, 'POST', '/v1/sandboxes', { key: a, json: {} });
  assert.equal(created.status, 201, created.text);
  const id = (created.json as { id: string }).id;

  const asB = [
    await call(fx, 'GET', `/v1/sandboxes/${id}`, { key: b }),
    await call(fx, 'POST', `/v1/sandboxes/${id}/exec`, { key: b, json: { command: 'echo pwned' } }),
    await call(fx, 'GET', `/v1/sandboxes/${id}/files?path=/etc/hostname`, { key: b }),
    await call(fx, 'PUT', `/v1/sandboxes/${id}/files?path=/x`, { key: b, body: 'x' }),
    await call(fx, 'POST', `/v1/sandboxes/${id}/pause`, { key: b }),
    await call(fx, 'POST', `/v1/sandboxes/${id}/timeout`, { key: b, json: { timeoutMs: 1 } }),
    await call(fx, 'DELETE', `/v1/sandboxes/${id}`, { key: b }),
  ];
  const missing = await call(fx, 'GET', '/v1/sandboxes/tst1doesnotexist0000', { key: b });
  for (const res of asB) {
    assert.equal(res.status, 404, res.text);
    assert.equal((res.json as { code: string }).code, 'NotFound', 'the same answer as for an id that does not exist');
  }
  assert.equal(missing.status, 404);
  assert.deepEqual((await call(fx, 'GET', '/v1/sandboxes', { key: b })).json, { items: [] });
  assert.deepEqual(((await call(fx, 'GET', '/v1/status', { key: b })).json as { sandboxes: object }).sandboxes, {});

  // Still there and untouched for its owner; visible to an admin.
  const own = await call(fx, 'GET', `/v1/sandboxes/${id}`, { key: a });
  assert.equal(own.status, 200);
  assert.equal((own.json as { shutdownTime?: string }).shutdownTime, undefined, "B's timeout did not apply");
  assert.equal((own.json as { phase: string }).phase, 'Running', "B's pause did not apply");
  const adminList = await call(fx, 'GET', '/v1/sandboxes', { key: fx.keys.admin });
  assert.deepEqual((adminList.json as { items: { id: string }[] }).items.map((v) => v.id), [id]);
});
