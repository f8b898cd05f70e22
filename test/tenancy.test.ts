// Tenant isolation in the control plane, attacked through the worker's REST API with one team's
// key against another team's sandbox (security probe C1, H1, M1: shared/research/security-probe.md).
// Each test performs the attack and checks what the victim would notice.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Sandbox } from '../src/api/types.ts';
import { LABEL, SandboxType } from '../src/api/types.ts';
import { tokenHash } from '../src/worker/access-token.ts';
import { call, startWorkerFixture, type WorkerFixture } from './support/worker-fixture.ts';
import { waitFor } from './support/wait.ts';

interface View { id: string; namespace: string; phase: string; ready: boolean; accessToken?: string }

function sandboxObject(name: string, namespace: string, metadata: Record<string, unknown> = {}): unknown {
  return {
    apiVersion: 'agents.x-k8s.io/v1alpha1',
    kind: 'Sandbox',
    metadata: { name, namespace, ...metadata },
    spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox', command: ['sleep', 'infinity'] }] } } },
  };
}

async function apply(fx: WorkerFixture, key: string, ...objects: unknown[]): Promise<{ status: number; text: string; json: unknown }> {
  return call(fx, 'POST', '/v1/apply', { key, json: { objects } });
}

async function view(fx: WorkerFixture, key: string, id: string): Promise<{ status: number; view: View }> {
  const res = await call(fx, 'GET', `/v1/sandboxes/${id}`, { key });
  return { status: res.status, view: res.json as View };
}

async function running(fx: WorkerFixture, key: string, id: string): Promise<View> {
  return waitFor(`sandbox ${id} running`, async () => {
    const got = await view(fx, key, id);
    return got.status === 200 && got.view.phase === 'Running' ? got.view : undefined;
  }, 10_000);
}

test('security probe C1: a Sandbox applied under another team\'s id, in a namespace of its own, is refused with 409 and changes nothing', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const created = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamB, json: { template: 'base' } });
  assert.equal(created.status, 201, created.text);
  const victim = created.json as View;
  await call(fx, 'POST', `/v1/sandboxes/${victim.id}/exec`, { key: fx.keys.teamB, json: { command: ['true'] } });

  const attack = await apply(fx, fx.keys.teamA, sandboxObject(victim.id, 'evil'));
  assert.equal(attack.status, 409, attack.text);
  assert.match(attack.text, /is taken/);
  assert.equal(await fx.store.tryGet(SandboxType, 'evil', victim.id), undefined, 'nothing was written');

  const owner = await view(fx, fx.keys.teamB, victim.id);
  assert.equal(owner.status, 200, 'the victim still sees its sandbox');
  assert.equal(owner.view.namespace, victim.namespace);
  assert.equal(owner.view.accessToken, victim.accessToken, "the victim's token is unchanged");
  assert.equal((await view(fx, fx.keys.teamA, victim.id)).status, 404, 'the attacker gets nothing for the id');

  // A user-chosen name is taken the same way, across namespaces, whoever asks.
  assert.equal((await apply(fx, fx.keys.teamB, sandboxObject('my-sandbox', 'default'))).status, 200);
  assert.equal((await apply(fx, fx.keys.teamA, sandboxObject('my-sandbox', 'team-a'))).status, 409);
  assert.equal((await apply(fx, fx.keys.admin, sandboxObject('my-sandbox', 'ops'))).status, 409, 'ids are unique for admins too');
});

test('security probe C1: two applies racing for one new name in two namespaces: exactly one wins', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const results = await Promise.all([
    apply(fx, fx.keys.teamA, sandboxObject('contested', 'team-a')),
    apply(fx, fx.keys.teamB, sandboxObject('contested', 'team-b')),
    apply(fx, fx.keys.teamB, sandboxObject('contested', 'other')),
  ]);
  assert.deepEqual(results.map((r) => r.status).sort(), [200, 409, 409], results.map((r) => r.text).join('\n'));
  const stored = (await fx.store.list<Sandbox>(SandboxType)).items.filter((s) => s.metadata.name === 'contested');
  assert.equal(stored.length, 1, 'one object holds the name');
});

test('security probe C1: an object that meets another under its id anyway never reaches the holder\'s pod, and deleting it leaves the holder alone', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const created = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamB, json: { template: 'base' } });
  const victim = created.json as View;
  await running(fx, fx.keys.teamB, victim.id);
  const holder = await fx.store.get<Sandbox>(SandboxType, victim.namespace, victim.id);

  // Written past the API (kubectl, or a second API replica racing): an earlier check cannot stop it.
  const rival = sandboxObject(victim.id, 'evil', { labels: { [LABEL.owner]: 'team-a' } }) as Sandbox;
  await fx.store.create(SandboxType, rival);
  const conflicted = await waitFor('the rival to report NameConflict', async () => {
    const s = await fx.store.tryGet<Sandbox>(SandboxType, 'evil', victim.id);
    return s?.status?.conditions?.find((c) => c.reason === 'NameConflict') === undefined ? undefined : s;
  }, 10_000);
  assert.equal(conflicted.status?.phase, 'Failed');
  assert.equal(fx.runtime.state(victim.id).uid, holder.metadata.uid, 'the pod is still the holder\'s');

  assert.equal((await view(fx, fx.keys.teamA, victim.id)).status, 404, 'the rival\'s team reaches nothing by the id');
  const owner = await view(fx, fx.keys.teamB, victim.id);
  assert.equal(owner.status, 200);
  assert.equal(owner.view.accessToken, victim.accessToken);
  const entry = fx.server.routeFeed.entries().find((e) => e.id === victim.id);
  assert.equal(entry?.tokenHash, tokenHash(victim.accessToken ?? ''), 'the route keeps the holder\'s token');
  assert.equal(entry.owner, 'team-b');

  await fx.store.delete(SandboxType, 'evil', victim.id);
  await waitFor('the rival to be gone', async () => ((await fx.store.tryGet(SandboxType, 'evil', victim.id)) === undefined ? true : undefined), 10_000);
  const after = fx.runtime.state(victim.id);
  assert.equal(after.phase, 'Running', 'deleting the rival did not stop the holder\'s pod');
  assert.equal(after.uid, holder.metadata.uid);
  const exec = await call(fx, 'POST', `/v1/sandboxes/${victim.id}/exec`, { key: fx.keys.teamB, json: { command: ['true'] } });
  assert.equal(exec.status, 200, exec.text);
});

test('security probe H1: a name used again by another team gets a new access token', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  assert.equal((await apply(fx, fx.keys.teamA, sandboxObject('my-sandbox', 'default'))).status, 200);
  const old = (await view(fx, fx.keys.teamA, 'my-sandbox')).view.accessToken ?? '';
  assert.notEqual(old, '');
  assert.equal((await call(fx, 'DELETE', '/v1/sandboxes/my-sandbox', { key: fx.keys.teamA })).status, 202);
  await waitFor('my-sandbox gone', async () => ((await fx.store.tryGet(SandboxType, 'default', 'my-sandbox')) === undefined ? true : undefined), 10_000);

  assert.equal((await apply(fx, fx.keys.teamB, sandboxObject('my-sandbox', 'default'))).status, 200);
  const fresh = (await view(fx, fx.keys.teamB, 'my-sandbox')).view.accessToken ?? '';
  assert.notEqual(fresh, old, 'the old owner\'s token does not open the new sandbox');
  const entry = await waitFor('the new route', () => Promise.resolve(fx.server.routeFeed.entries().find((e) => e.id === 'my-sandbox' && e.owner === 'team-b')), 10_000);
  assert.equal(entry.tokenHash, tokenHash(fresh));
  assert.notEqual(entry.tokenHash, tokenHash(old));
});

test('rotating a sandbox\'s access token retires the old one at envd and on the route feed', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const created = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: { template: 'base' } });
  const sb = created.json as View;
  const old = sb.accessToken ?? '';
  const rotated = await call(fx, 'POST', `/v1/sandboxes/${sb.id}/access-token`, { key: fx.keys.teamA, json: {} });
  assert.equal(rotated.status, 200, rotated.text);
  const fresh = (rotated.json as View).accessToken ?? '';
  assert.ok(fresh !== '' && fresh !== old);
  assert.equal((await view(fx, fx.keys.teamA, sb.id)).view.accessToken, fresh, 'GET shows the new token');
  await waitFor('the feed to carry the new hash', () => Promise.resolve(fx.server.routeFeed.entries().find((e) => e.id === sb.id)?.tokenHash === tokenHash(fresh) ? true : undefined), 10_000);
  // envd on the worker checks the token itself, from the object: the old one is refused at once.
  // The router forwards envd requests (port 49983) with x-asb-sandbox-id, as here.
  const envd = (token: string) => call(fx, 'POST', '/process.Process/List', { headers: { 'x-asb-sandbox-id': sb.id, 'x-access-token': token }, json: {} });
  const refused = await envd(old);
  assert.ok([401, 403].includes(refused.status), `the old token no longer opens envd (${refused.status} ${refused.text})`);
  const allowed = await envd(fresh);
  assert.equal(allowed.status, 200, `the new one does (${allowed.text})`);
  const bad = await call(fx, 'POST', `/v1/sandboxes/${sb.id}/access-token`, { key: fx.keys.teamA, json: { generation: 7 } });
  assert.equal(bad.status, 422, 'the body has no fields');
});

test('security probe M1: a team key cannot apply reserved labels, annotations or owner references', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const poisoned = sandboxObject('pf-a', 'default', {
    labels: { 'agents.x-k8s.io/warm-pool-sandbox': 'base', 'asb.dev/template': 'base', app: 'ok' },
    annotations: { 'asb.dev/token-generation': '9', 'asb.dev/public-ports': '8080' },
    ownerReferences: [{ apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxWarmPool', name: 'base', uid: 'x', controller: true }],
  });
  const claim = {
    apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
    kind: 'SandboxClaim',
    metadata: { name: 'c1', labels: { 'agents.x-k8s.io/claim-uid': 'forged' } },
    spec: { sandboxTemplateRef: { name: 'base' } },
  };
  const refused = await apply(fx, fx.keys.teamA, poisoned, claim);
  assert.equal(refused.status, 422, refused.text);
  const fields = ((refused.json as { fields: { field: string }[] }).fields).map((f) => f.field).sort();
  assert.deepEqual(fields, [
    'objects[0].metadata.annotations.asb.dev/token-generation',
    'objects[0].metadata.labels.agents.x-k8s.io/warm-pool-sandbox',
    'objects[0].metadata.labels.asb.dev/template',
    'objects[0].metadata.ownerReferences',
    'objects[1].metadata.labels.agents.x-k8s.io/claim-uid',
  ]);
  assert.equal(await fx.store.tryGet(SandboxType, 'default', 'pf-a'), undefined, 'nothing was applied');
  // The owner label is set from the key whatever was sent, and public-ports is the team's to set.
  const fine = await apply(fx, fx.keys.teamA, sandboxObject('pf-b', 'default', { labels: { [LABEL.owner]: 'team-b' }, annotations: { 'asb.dev/public-ports': '8080' } }));
  assert.equal(fine.status, 200, fine.text);
  const stored = await fx.store.get<Sandbox>(SandboxType, 'default', 'pf-b');
  assert.equal(stored.metadata.labels?.[LABEL.owner], 'team-a');
});

test('a team key may put on its claims the two keys kubernetes-sigs\' client sets (agents.x-k8s.io/created-by, …/client-first-requested-at), and still no other reserved key, nor those two on a Sandbox', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const sdkClaim = (name: string, labels: Record<string, string> = {}, annotations: Record<string, string> = {}): unknown => ({
    apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
    kind: 'SandboxClaim',
    // What k8s-agent-sandbox 1.0.8 sends (research/k8s-sigs-sdk.md §2).
    metadata: {
      name,
      labels: { 'agents.x-k8s.io/created-by': 'python-client', ...labels },
      annotations: { 'agents.x-k8s.io/client-first-requested-at': '2026-01-02T03:04:05.678901+00:00', ...annotations },
    },
    spec: { warmPoolRef: { name: 'base' } },
  });
  // Through the Kubernetes API (the SDK's way) and through /v1/apply: one gate.
  const viaKube = await call(fx, 'POST', '/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxclaims', { key: fx.keys.teamA, json: sdkClaim('sdk-a') });
  assert.equal(viaKube.status, 201, viaKube.text);
  const created = viaKube.json as { metadata: { labels: Record<string, string> } };
  assert.deepEqual(created.metadata.labels, { 'agents.x-k8s.io/created-by': 'python-client', [LABEL.owner]: 'team-a' });
  assert.equal((await apply(fx, fx.keys.teamA, sdkClaim('sdk-b'))).status, 200);

  // The attack: a team's claim naming another team's sandbox as its own binding, or forging the
  // pool-membership, claim-uid and owner-side keys; and the two client keys on a Sandbox.
  const victim = (await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamB, json: { template: 'base' } })).json as View;
  const forged = sdkClaim('sdk-c', { 'agents.x-k8s.io/warm-pool-sandbox': 'base', 'agents.x-k8s.io/claim-uid': 'x', 'asb.dev/template': 'base' }, { 'agents.x-k8s.io/sandbox-name': victim.id });
  const sandbox = sandboxObject('sdk-d', 'default', { labels: { 'agents.x-k8s.io/created-by': 'python-client' }, annotations: { 'agents.x-k8s.io/client-first-requested-at': 'now' } });
  const refused = await apply(fx, fx.keys.teamA, forged, sandbox);
  assert.equal(refused.status, 422, refused.text);
  assert.deepEqual(((refused.json as { fields: { field: string }[] }).fields).map((f) => f.field).sort(), [
    'objects[0].metadata.annotations.agents.x-k8s.io/sandbox-name',
    'objects[0].metadata.labels.agents.x-k8s.io/claim-uid',
    'objects[0].metadata.labels.agents.x-k8s.io/warm-pool-sandbox',
    'objects[0].metadata.labels.asb.dev/template',
    'objects[1].metadata.annotations.agents.x-k8s.io/client-first-requested-at',
    'objects[1].metadata.labels.agents.x-k8s.io/created-by',
  ]);
  const forgedKube = await call(fx, 'POST', '/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxclaims', { key: fx.keys.teamA, json: sdkClaim('sdk-e', {}, { 'agents.x-k8s.io/sandbox-name': victim.id }) });
  assert.equal(forgedKube.status, 422, forgedKube.text);
  assert.equal((forgedKube.json as { reason: string }).reason, 'Invalid');
  // The client's label value is still a label value.
  const badValue = await apply(fx, fx.keys.teamA, sdkClaim('sdk-f', { 'agents.x-k8s.io/created-by': 'not a value' }));
  assert.equal(badValue.status, 422, badValue.text);
  // The victim's sandbox is untouched and still team B's alone.
  assert.equal((await view(fx, fx.keys.teamA, victim.id)).status, 404);
  assert.equal((await view(fx, fx.keys.teamB, victim.id)).status, 200);
});
