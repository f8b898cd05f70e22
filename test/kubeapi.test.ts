// The worker's Kubernetes API on the wire (src/kubeapi/): discovery in both forms, /version,
// OpenAPI v3, Status objects shaped as kube-apiserver 1.37 writes them (one case per reason),
// lists with selectors and paging, both versions, watches (changes, field selectors, initial
// events, 410 Expired), patches of three types, the status and scale subresources, delete
// preconditions and deletecollection.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BOOKMARK_MS } from '../src/kubeapi/watch.ts';
import { ManualClock } from './support/operator-harness.ts';
import { call, startWorkerFixture, type ApiResponse, type WorkerFixture } from './support/worker-fixture.ts';
import { waitFor } from './support/wait.ts';

const CORE = '/apis/agents.x-k8s.io';
const EXT = '/apis/extensions.agents.x-k8s.io';
const AGG_ACCEPT = 'application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json';

const pool = (name: string, extra: Record<string, unknown> = {}): unknown => ({
  apiVersion: 'extensions.agents.x-k8s.io/v1beta1', kind: 'SandboxWarmPool', metadata: { name, ...extra }, spec: { replicas: 0, sandboxTemplateRef: { name: 'base' } },
});
const claim = (name: string): unknown => ({ apiVersion: 'extensions.agents.x-k8s.io/v1beta1', kind: 'SandboxClaim', metadata: { name }, spec: { warmPoolRef: { name: 'p' } } });

function statusBody(res: ApiResponse): Record<string, unknown> {
  assert.equal(res.headers.get('content-type'), 'application/json', res.text);
  const body = res.json as Record<string, unknown>;
  assert.equal(body.kind, 'Status');
  assert.equal(body.apiVersion, 'v1');
  assert.deepEqual(body.metadata, {});
  return body;
}

test('discovery answers the legacy and the aggregated forms, /version and OpenAPI v3', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const key = fx.keys.teamA;
  const api = await call(fx, 'GET', '/api', { key });
  assert.deepEqual((api.json as { versions: string[] }).versions, ['v1']);
  const groups = (await call(fx, 'GET', '/apis', { key })).json as { kind: string; groups: { name: string; preferredVersion: { version: string }; versions: unknown[] }[] };
  assert.equal(groups.kind, 'APIGroupList');
  assert.deepEqual(groups.groups.map((g) => [g.name, g.preferredVersion.version, g.versions.length]), [['agents.x-k8s.io', 'v1beta1', 2], ['extensions.agents.x-k8s.io', 'v1beta1', 2]]);
  const gv = (await call(fx, 'GET', `${EXT}/v1alpha1`, { key })).json as { groupVersion: string; resources: { name: string; kind: string; verbs: string[]; shortNames?: string[] }[] };
  assert.equal(gv.groupVersion, 'extensions.agents.x-k8s.io/v1alpha1');
  assert.deepEqual(gv.resources.map((r) => r.name), ['sandboxtemplates', 'sandboxtemplates/status', 'sandboxclaims', 'sandboxclaims/status', 'sandboxwarmpools', 'sandboxwarmpools/status', 'sandboxwarmpools/scale', 'sandboxsnapshots', 'sandboxsnapshots/status']);
  assert.deepEqual(gv.resources.find((r) => r.name === 'sandboxwarmpools')?.shortNames, ['swp']);
  // As kube-apiserver 1.37 lists a CRD's: every verb, deletecollection included, and the scale
  // subresource in autoscaling/v1 (the scale client kubectl uses finds its kind there).
  assert.deepEqual(gv.resources[0]?.verbs, ['delete', 'deletecollection', 'get', 'list', 'patch', 'create', 'update', 'watch']);
  assert.deepEqual(gv.resources.find((r) => r.name === 'sandboxwarmpools/scale'), { name: 'sandboxwarmpools/scale', singularName: '', namespaced: true, group: 'autoscaling', version: 'v1', kind: 'Scale', verbs: ['get', 'patch', 'update'] });

  for (const [accept, version] of [[AGG_ACCEPT, 'v2'], ['application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList', 'v2beta1']] as const) {
    const agg = await call(fx, 'GET', '/apis', { key, headers: { accept } });
    assert.equal(agg.headers.get('content-type'), `application/json;g=apidiscovery.k8s.io;v=${version};as=APIGroupDiscoveryList`);
    const doc = agg.json as { kind: string; apiVersion: string; items: { metadata: { name: string }; versions: { version: string; resources: { resource: string; responseKind: { version: string } }[] }[] }[] };
    assert.equal(doc.kind, 'APIGroupDiscoveryList');
    assert.equal(doc.apiVersion, `apidiscovery.k8s.io/${version}`);
    const core = doc.items.find((i) => i.metadata.name === 'agents.x-k8s.io');
    assert.deepEqual(core?.versions.map((v) => [v.version, v.resources.map((r) => `${r.resource}@${r.responseKind.version}`)]), [['v1beta1', ['sandboxes@v1beta1']], ['v1alpha1', ['sandboxes@v1alpha1']]]);
    const pools = doc.items.find((i) => i.metadata.name === 'extensions.agents.x-k8s.io')?.versions[0]?.resources.find((r) => r.resource === 'sandboxwarmpools') as { subresources?: unknown } | undefined;
    assert.deepEqual(pools?.subresources, [
      { subresource: 'status', responseKind: { group: 'extensions.agents.x-k8s.io', version: 'v1beta1', kind: 'SandboxWarmPool' }, verbs: ['get', 'patch', 'update'] },
      { subresource: 'scale', responseKind: { group: 'autoscaling', version: 'v1', kind: 'Scale' }, verbs: ['get', 'patch', 'update'] },
    ]);
  }
  const coreAgg = await call(fx, 'GET', '/api', { key, headers: { accept: AGG_ACCEPT } });
  // The core group serves Events only, read-only: what kubectl get events and describe read.
  assert.deepEqual((coreAgg.json as { items: unknown[] }).items, [{ metadata: {}, versions: [{ version: 'v1', resources: [{ resource: 'events', responseKind: { group: '', version: 'v1', kind: 'Event' }, scope: 'Namespaced', singularResource: 'event', verbs: ['get', 'list'], shortNames: ['ev'] }], freshness: 'Current' }] }]);

  const version = (await call(fx, 'GET', '/version', { key })).json as { major: string; minor: string; gitVersion: string };
  assert.deepEqual([version.major, version.minor], ['1', '37']);
  assert.match(version.gitVersion, /^v1\.37\.0\+asb\.0\.1\.0-test$/);

  const index = (await call(fx, 'GET', '/openapi/v3', { key })).json as { paths: Record<string, { serverRelativeURL: string }> };
  assert.deepEqual(Object.keys(index.paths).sort(), ['apis/agents.x-k8s.io/v1alpha1', 'apis/agents.x-k8s.io/v1beta1', 'apis/extensions.agents.x-k8s.io/v1alpha1', 'apis/extensions.agents.x-k8s.io/v1beta1']);
  const docUrl = index.paths['apis/agents.x-k8s.io/v1beta1']?.serverRelativeURL ?? '';
  const doc = (await call(fx, 'GET', docUrl, { key })).json as { paths: Record<string, { patch?: { parameters: { name: string }[]; 'x-kubernetes-group-version-kind': unknown; requestBody: { content: Record<string, unknown> } } }>; components: { schemas: Record<string, { 'x-kubernetes-group-version-kind'?: unknown }> } };
  const patch = doc.paths['/apis/agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxes/{name}']?.patch;
  assert.deepEqual(patch?.['x-kubernetes-group-version-kind'], { group: 'agents.x-k8s.io', version: 'v1beta1', kind: 'Sandbox' });
  assert.ok(patch.parameters.some((p) => p.name === 'fieldValidation'), 'kubectl apply validates on the server only when PATCH takes fieldValidation');
  assert.ok(!('application/strategic-merge-patch+json' in patch.requestBody.content), 'custom resources take no strategic merge patch');
  assert.deepEqual(doc.components.schemas['io.x-k8s.agents.v1beta1.Sandbox']?.['x-kubernetes-group-version-kind'], [{ group: 'agents.x-k8s.io', kind: 'Sandbox', version: 'v1beta1' }]);

  const unknown = await call(fx, 'GET', '/apis/nope.io/v1/namespaces/default/foos', { key });
  assert.equal(unknown.status, 404);
  assert.equal(unknown.text, '404 page not found\n');
});

test('errors are Status objects as kube-apiserver writes them, one per reason', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const admin = fx.keys.admin;
  const pools = `${EXT}/v1beta1/namespaces/default/sandboxwarmpools`;

  const unauthorized = await call(fx, 'GET', '/apis');
  assert.equal(unauthorized.status, 401);
  assert.deepEqual(statusBody(unauthorized), { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: 'Unauthorized', reason: 'Unauthorized', code: 401 });
  assert.equal((await call(fx, 'GET', '/apis', { key: 'asb_00000000_00000000000000000000000000000000' })).status, 401);

  const notFound = await call(fx, 'GET', `${CORE}/v1beta1/namespaces/default/sandboxes/nope`, { key: admin });
  assert.equal(notFound.status, 404);
  assert.deepEqual(statusBody(notFound), {
    kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: 'sandboxes.agents.x-k8s.io "nope" not found', reason: 'NotFound',
    details: { name: 'nope', group: 'agents.x-k8s.io', kind: 'sandboxes' }, code: 404,
  });

  const created = await call(fx, 'POST', pools, { key: admin, json: pool('p') });
  assert.equal(created.status, 201, created.text);
  const exists = await call(fx, 'POST', pools, { key: admin, json: pool('p') });
  assert.equal(exists.status, 409);
  assert.deepEqual(statusBody(exists), {
    kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: 'sandboxwarmpools.extensions.agents.x-k8s.io "p" already exists', reason: 'AlreadyExists',
    details: { name: 'p', group: 'extensions.agents.x-k8s.io', kind: 'sandboxwarmpools' }, code: 409,
  });

  // The pool controller writes status meanwhile: read the current version and write with it (again
  // if the controller got in between), then write with the same, now stale, version.
  let stale: Record<string, unknown> = {};
  let update: ApiResponse | undefined;
  for (let i = 0; i < 5 && update?.status !== 200; i++) {
    stale = { ...((await call(fx, 'GET', `${pools}/p`, { key: admin })).json as Record<string, unknown>) };
    update = await call(fx, 'PUT', `${pools}/p`, { key: admin, json: { ...stale, spec: { replicas: 0, sandboxTemplateRef: { name: 'base' }, updateStrategy: { type: 'Recreate' } } } });
  }
  assert.equal(update?.status, 200, update?.text);
  const conflict = await call(fx, 'PUT', `${pools}/p`, { key: admin, json: { ...stale, spec: { replicas: 2, sandboxTemplateRef: { name: 'base' } } } });
  assert.equal(conflict.status, 409);
  assert.deepEqual(statusBody(conflict), {
    kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure',
    message: 'Operation cannot be fulfilled on sandboxwarmpools.extensions.agents.x-k8s.io "p": the object has been modified; please apply your changes to the latest version and try again',
    reason: 'Conflict', details: { name: 'p', group: 'extensions.agents.x-k8s.io', kind: 'sandboxwarmpools' }, code: 409,
  });

  const invalid = await call(fx, 'POST', pools, { key: admin, json: { apiVersion: 'extensions.agents.x-k8s.io/v1beta1', kind: 'SandboxWarmPool', metadata: { name: 'x' }, spec: { replicas: -1 } } });
  assert.equal(invalid.status, 422);
  const inv = statusBody(invalid) as { reason: string; code: number; message: string; details: { name: string; group: string; kind: string; causes: { reason: string; field: string }[] } };
  assert.equal(inv.reason, 'Invalid');
  assert.equal(inv.code, 422);
  assert.match(inv.message, /^SandboxWarmPool\.extensions\.agents\.x-k8s\.io "x" is invalid: \[.*spec\.replicas/);
  assert.deepEqual([inv.details.name, inv.details.group, inv.details.kind], ['x', 'extensions.agents.x-k8s.io', 'SandboxWarmPool']);
  assert.ok(inv.details.causes.some((c) => c.field === 'spec.replicas' && c.reason === 'FieldValueInvalid'), JSON.stringify(inv.details.causes));

  const forbidden = await call(fx, 'DELETE', `${pools}/p`, { key: fx.keys.teamA });
  assert.equal(forbidden.status, 403);
  const fb = statusBody(forbidden) as { reason: string; message: string; details: unknown; code: number };
  assert.equal(fb.reason, 'Forbidden');
  assert.match(fb.message, /^sandboxwarmpools\.extensions\.agents\.x-k8s\.io "p" is forbidden: key asb_\w+ of team "team-a" cannot delete resource "sandboxwarmpools" in API group "extensions\.agents\.x-k8s\.io" in the namespace "default": writing a SandboxWarmPool needs an admin API key$/);
  assert.deepEqual(fb.details, { name: 'p', group: 'extensions.agents.x-k8s.io', kind: 'sandboxwarmpools' });

  const badSelector = await call(fx, 'GET', `${pools}?fieldSelector=spec.replicas%3D1`, { key: admin });
  assert.equal(badSelector.status, 400);
  assert.equal(statusBody(badSelector).reason, 'BadRequest');
  assert.equal(statusBody(badSelector).message, 'field label not supported: spec.replicas');

  // A bad percent-encoding in an Events path is the caller's error, as in any other path.
  for (const path of ['/api/v1/namespaces/%E0%A4%A/events', '/api/v1/namespaces/default/events/%E0%A4%A']) {
    const badEscape = await call(fx, 'GET', path, { key: admin });
    assert.deepEqual([badEscape.status, statusBody(badEscape).reason, statusBody(badEscape).message], [400, 'BadRequest', 'path segment "%E0%A4%A" is not valid percent-encoding'], path);
  }

  const strategic = await call(fx, 'PATCH', `${pools}/p`, { key: admin, body: '{}', headers: { 'content-type': 'application/strategic-merge-patch+json' } });
  assert.equal(strategic.status, 415);
  assert.equal(statusBody(strategic).reason, 'UnsupportedMediaType');

  const method = await call(fx, 'POST', `${pools}/p`, { key: admin, json: {} });
  assert.equal(method.status, 405);
  assert.equal(statusBody(method).reason, 'MethodNotAllowed');
});

test('lists page and select, in either version, across namespaces; patches of three types; status; delete preconditions', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const admin = fx.keys.admin;
  const pools = `${EXT}/v1beta1/namespaces/default/sandboxwarmpools`;
  for (const name of ['a', 'b', 'c']) assert.equal((await call(fx, 'POST', pools, { key: admin, json: pool(name, { labels: { tier: name === 'b' ? 'gold' : 'plain' } }) })).status, 201);
  const page1 = (await call(fx, 'GET', `${pools}?limit=2`, { key: admin })).json as { kind: string; apiVersion: string; metadata: { continue?: string; resourceVersion: string }; items: { metadata: { name: string } }[] };
  assert.equal(page1.kind, 'SandboxWarmPoolList');
  assert.equal(page1.apiVersion, 'extensions.agents.x-k8s.io/v1beta1');
  assert.deepEqual(page1.items.map((i) => i.metadata.name), ['a', 'b']);
  assert.ok(page1.metadata.continue !== undefined && page1.metadata.resourceVersion !== '');
  const page2 = (await call(fx, 'GET', `${pools}?limit=2&continue=${encodeURIComponent(page1.metadata.continue)}`, { key: admin })).json as typeof page1;
  assert.deepEqual(page2.items.map((i) => i.metadata.name), ['c']);
  assert.equal(page2.metadata.continue, undefined);
  const gold = (await call(fx, 'GET', `${pools}?labelSelector=tier%3Dgold`, { key: admin })).json as typeof page1;
  assert.deepEqual(gold.items.map((i) => i.metadata.name), ['b']);
  const byName = (await call(fx, 'GET', `${EXT}/v1alpha1/sandboxwarmpools?fieldSelector=metadata.name%3Dc`, { key: admin })).json as { items: { apiVersion: string; metadata: { name: string } }[] };
  assert.deepEqual(byName.items.map((i) => [i.apiVersion, i.metadata.name]), [['extensions.agents.x-k8s.io/v1alpha1', 'c']]);

  // Merge patch, JSON patch, server-side apply (create, then update).
  const merged = await call(fx, 'PATCH', `${pools}/a`, { key: admin, body: JSON.stringify({ spec: { replicas: 2 }, metadata: { labels: { tier: null } } }), headers: { 'content-type': 'application/merge-patch+json' } });
  assert.equal(merged.status, 200, merged.text);
  const m = merged.json as { spec: { replicas: number }; metadata: { labels?: Record<string, string> } };
  assert.equal(m.spec.replicas, 2);
  assert.equal(m.metadata.labels?.tier, undefined);
  const jp = await call(fx, 'PATCH', `${pools}/a`, { key: admin, body: JSON.stringify([{ op: 'test', path: '/spec/replicas', value: 2 }, { op: 'replace', path: '/spec/replicas', value: 3 }]), headers: { 'content-type': 'application/json-patch+json' } });
  assert.equal((jp.json as { spec: { replicas: number } }).spec.replicas, 3);
  const failedTest = await call(fx, 'PATCH', `${pools}/a`, { key: admin, body: JSON.stringify([{ op: 'test', path: '/spec/replicas', value: 9 }]), headers: { 'content-type': 'application/json-patch+json' } });
  assert.equal(failedTest.status, 422);
  const applyBody = 'apiVersion: extensions.agents.x-k8s.io/v1beta1\nkind: SandboxWarmPool\nmetadata: {name: d}\nspec: {replicas: 0, sandboxTemplateRef: {name: base}}\n';
  const applied = await call(fx, 'PATCH', `${pools}/d?fieldManager=kubectl&force=false`, { key: admin, body: applyBody, headers: { 'content-type': 'application/apply-patch+yaml' } });
  assert.equal(applied.status, 201, applied.text);
  const reapplied = await call(fx, 'PATCH', `${pools}/d?fieldManager=kubectl`, { key: admin, body: applyBody.replace('replicas: 0', 'replicas: 1'), headers: { 'content-type': 'application/apply-patch+yaml' } });
  assert.equal(reapplied.status, 200);
  assert.equal((reapplied.json as { spec: { replicas: number } }).spec.replicas, 1);
  assert.equal((await call(fx, 'PATCH', `${pools}/d?dryRun=All`, { key: admin, body: '{}', headers: { 'content-type': 'application/merge-patch+json' } })).status, 400);

  // The status subresource: admins write it, spec untouched; a team key may not.
  const withStatus = await call(fx, 'PATCH', `${pools}/d/status`, { key: admin, body: JSON.stringify({ status: { readyReplicas: 7 } }), headers: { 'content-type': 'application/merge-patch+json' } });
  assert.equal(withStatus.status, 200, withStatus.text);
  assert.equal((withStatus.json as { status: { readyReplicas: number }; spec: { replicas: number } }).status.readyReplicas, 7);
  assert.equal((await call(fx, 'GET', `${pools}/d/status`, { key: admin })).status, 200);

  // Delete: a wrong uid precondition is a Conflict; the right one deletes, answered by a Success Status.
  const d = (await call(fx, 'GET', `${pools}/d`, { key: admin })).json as { metadata: { uid: string } };
  const wrongUid = await call(fx, 'DELETE', `${pools}/d`, { key: admin, json: { preconditions: { uid: 'not-it' } } });
  assert.equal(wrongUid.status, 409);
  assert.equal(statusBody(wrongUid).reason, 'Conflict');
  const deleted = await call(fx, 'DELETE', `${pools}/d`, { key: admin, json: { preconditions: { uid: d.metadata.uid }, propagationPolicy: 'Background' } });
  assert.equal(deleted.status, 200);
  assert.deepEqual(deleted.json, { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success', details: { name: 'd', group: 'extensions.agents.x-k8s.io', kind: 'sandboxwarmpools', uid: d.metadata.uid } });
});

test('a team key cannot write status, nor see another team\'s claims by list, get or watch', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const claims = `${EXT}/v1beta1/namespaces/default/sandboxclaims`;
  assert.equal((await call(fx, 'POST', `${EXT}/v1beta1/namespaces/default/sandboxwarmpools`, { key: fx.keys.admin, json: pool('p') })).status, 201);
  const watchB = await fetch(`${fx.url}${claims}?watch=true`, { headers: { authorization: `Bearer ${fx.keys.teamB}` } });
  const readerB = watchB.body?.getReader();
  t.after(() => readerB?.cancel());
  assert.equal((await call(fx, 'POST', claims, { key: fx.keys.teamA, json: claim('mine') })).status, 201);
  assert.equal((await call(fx, 'POST', claims, { key: fx.keys.teamB, json: claim('theirs') })).status, 201);
  const status = await call(fx, 'PUT', `${claims}/mine/status`, { key: fx.keys.teamA, json: { ...(claim('mine') as object), status: { conditions: [] } } });
  assert.equal(status.status, 403);
  assert.match(statusBody(status).message as string, /status is written by the controllers/);
  const listB = (await call(fx, 'GET', claims, { key: fx.keys.teamB })).json as { items: { metadata: { name: string } }[] };
  assert.deepEqual(listB.items.map((i) => i.metadata.name), ['theirs']);
  assert.equal((await call(fx, 'GET', `${claims}/mine`, { key: fx.keys.teamB })).status, 404);
  // Team B's watch saw its own claim and never team A's, which was created first.
  const first = await readLine(readerB);
  assert.equal(first.type, 'ADDED');
  assert.equal(first.object.metadata.name, 'theirs');
});

interface Event { type: string; object: { kind?: string; code?: number; reason?: string; metadata: { name: string; resourceVersion?: string; annotations?: Record<string, string> }; spec?: { replicas?: number } } }

const buffers = new WeakMap<object, string>();
async function readLine(reader: ReadableStreamDefaultReader<Uint8Array> | undefined): Promise<Event> {
  assert.ok(reader !== undefined);
  let buf = buffers.get(reader) ?? '';
  // Bounded: each read returns at least one chunk or the end of the stream.
  for (let i = 0; i < 1000 && !buf.includes('\n'); i++) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`the watch ended; buffered: ${buf}`);
    buf += new TextDecoder().decode(value);
  }
  const nl = buf.indexOf('\n');
  buffers.set(reader, buf.slice(nl + 1));
  return JSON.parse(buf.slice(0, nl)) as Event;
}

async function openWatch(t: { after: (fn: () => unknown) => void }, fx: WorkerFixture, path: string, key: string): Promise<ReadableStreamDefaultReader<Uint8Array>> {
  const res = await fetch(`${fx.url}${path}`, { headers: { authorization: `Bearer ${key}` } });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('content-type'), 'application/json');
  const reader = res.body?.getReader();
  assert.ok(reader !== undefined);
  t.after(() => reader.cancel());
  return reader;
}

test('watches: changes after a version, name selection, initial events with their bookmark, and 410 Expired for a version no longer kept', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn), {}, { eventRetention: 5 });
  const admin = fx.keys.admin;
  const pools = `${EXT}/v1beta1/namespaces/default/sandboxwarmpools`;
  assert.equal((await call(fx, 'POST', pools, { key: admin, json: pool('a') })).status, 201);
  const list = (await call(fx, 'GET', pools, { key: admin })).json as { metadata: { resourceVersion: string } };

  const fromList = await openWatch(t, fx, `${pools}?watch=1&resourceVersion=${list.metadata.resourceVersion}&fieldSelector=metadata.name%3Db`, admin);
  const initial = await openWatch(t, fx, `${pools}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true`, admin);
  const added = await readLine(initial);
  assert.deepEqual([added.type, added.object.metadata.name], ['ADDED', 'a']);
  const end = await readLine(initial);
  assert.equal(end.type, 'BOOKMARK');
  assert.deepEqual(end.object.metadata.annotations, { 'k8s.io/initial-events-end': 'true' });
  // The controllers may have written since the list: the bookmark's version is that list's or later.
  assert.ok(Number(end.object.metadata.resourceVersion) >= Number(list.metadata.resourceVersion), JSON.stringify(end));

  assert.equal((await call(fx, 'POST', pools, { key: admin, json: pool('b') })).status, 201);
  await call(fx, 'PATCH', `${pools}/a`, { key: admin, body: '{"spec":{"replicas":1}}', headers: { 'content-type': 'application/merge-patch+json' } });
  await call(fx, 'PATCH', `${pools}/b`, { key: admin, body: '{"spec":{"replicas":2}}', headers: { 'content-type': 'application/merge-patch+json' } });
  const b1 = await readLine(fromList);
  assert.deepEqual([b1.type, b1.object.metadata.name], ['ADDED', 'b']);
  // The pool controller's status writes come as MODIFIED too; the patch's is among the next few.
  let b2 = await readLine(fromList);
  for (let i = 0; i < 10 && b2.object.spec?.replicas !== 2; i++) b2 = await readLine(fromList);
  assert.deepEqual([b2.type, b2.object.metadata.name, b2.object.spec?.replicas], ['MODIFIED', 'b', 2]);
  // This watch has no selector: the pool controller's status writes to a (and the patch of a)
  // may come first, as MODIFIED of a; the first event of b is its ADDED.
  let i1 = await readLine(initial);
  for (let i = 0; i < 10 && i1.object.metadata.name === 'a'; i++) {
    assert.equal(i1.type, 'MODIFIED', JSON.stringify(i1));
    i1 = await readLine(initial);
  }
  assert.deepEqual([i1.type, i1.object.metadata.name], ['ADDED', 'b']);

  // More changes than the store keeps (5): the first list's version is gone.
  for (let i = 0; i < 6; i++) await call(fx, 'PATCH', `${pools}/a`, { key: admin, body: JSON.stringify({ spec: { replicas: 10 + i } }), headers: { 'content-type': 'application/merge-patch+json' } });
  const expired = await openWatch(t, fx, `${pools}?watch=true&resourceVersion=${list.metadata.resourceVersion}`, admin);
  const err = await readLine(expired);
  assert.equal(err.type, 'ERROR');
  assert.deepEqual([err.object.kind, err.object.reason, err.object.code], ['Status', 'Expired', 410]);
  const { done } = await expired.read();
  assert.equal(done, true, 'the stream ends after the ERROR event');
});

test('a team\'s Sandbox passes the pod-security check and takes its id for the whole cluster, as in /v1/apply', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const sandbox = (name: string, spec: Record<string, unknown> = {}, namespace = 'default'): unknown => ({
    apiVersion: 'agents.x-k8s.io/v1beta1', kind: 'Sandbox', metadata: { name, namespace },
    spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox', command: ['sleep', 'infinity'], ...spec }] } } },
  });
  const at = (ns: string): string => `${CORE}/v1beta1/namespaces/${ns}/sandboxes`;
  const privileged = await call(fx, 'POST', at('default'), { key: fx.keys.teamA, json: sandbox('root', { securityContext: { privileged: true } }) });
  assert.equal(privileged.status, 422, privileged.text);
  const causes = (statusBody(privileged).details as { causes: { field: string }[] }).causes.map((c) => c.field);
  assert.ok(causes.includes('spec.podTemplate.spec.containers[0].securityContext.privileged'), JSON.stringify(causes));
  assert.equal((await call(fx, 'GET', `${at('default')}/root`, { key: fx.keys.admin })).status, 404, 'nothing was written');

  const mine = await call(fx, 'POST', at('default'), { key: fx.keys.teamA, json: sandbox('shared-id') });
  assert.equal(mine.status, 201, mine.text);
  assert.equal((mine.json as { metadata: { labels: Record<string, string> } }).metadata.labels['asb.dev/owner'], 'team-a');
  // The same id in another namespace, by another team: taken, with nothing said about whose.
  const taken = await call(fx, 'POST', at('elsewhere'), { key: fx.keys.teamB, json: sandbox('shared-id', {}, 'elsewhere') });
  assert.equal(taken.status, 409, taken.text);
  assert.equal(statusBody(taken).reason, 'AlreadyExists');
  assert.equal((await call(fx, 'GET', `${CORE}/v1alpha1/sandboxes`, { key: fx.keys.teamB })).text.includes('shared-id'), false);
});

test('a watch that asks for bookmarks gets one every minute with the last version, and ends after timeoutSeconds', async (t) => {
  const clock = new ManualClock();
  const fx = await startWorkerFixture((fn) => t.after(fn), {}, { clock });
  const pools = `${EXT}/v1beta1/namespaces/default/sandboxwarmpools`;
  const list = (await call(fx, 'GET', pools, { key: fx.keys.admin })).json as { metadata: { resourceVersion: string } };
  const watch = await openWatch(t, fx, `${pools}?watch=true&resourceVersion=${list.metadata.resourceVersion}&allowWatchBookmarks=true&timeoutSeconds=150`, fx.keys.admin);
  clock.advance(BOOKMARK_MS);
  const first = await readLine(watch);
  assert.deepEqual([first.type, first.object.kind, first.object.metadata.resourceVersion], ['BOOKMARK', 'SandboxWarmPool', list.metadata.resourceVersion]);
  clock.advance(BOOKMARK_MS);
  assert.equal((await readLine(watch)).type, 'BOOKMARK');
  clock.advance(30_000);
  const { done } = await watch.read();
  assert.equal(done, true, 'the stream ends at timeoutSeconds');
});

test('the scale subresource where the CRD declares one: an autoscaling/v1 Scale read and written as kube-apiserver 1.37 does, with its Status objects', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const admin = fx.keys.admin;
  const pools = `${EXT}/v1beta1/namespaces/default/sandboxwarmpools`;
  const merge = { 'content-type': 'application/merge-patch+json' };
  assert.equal((await call(fx, 'POST', pools, { key: admin, json: pool('p') })).status, 201);
  // The pool controller writes the status the Scale reads (replicas, selector).
  const stored = await waitFor('the pool status', async () => {
    const got = (await call(fx, 'GET', `${pools}/p`, { key: admin })).json as { metadata: Record<string, string>; status?: { selector?: string } };
    return got.status?.selector === undefined ? undefined : got;
  }, 10_000);
  const read = await call(fx, 'GET', `${pools}/p/scale`, { key: admin });
  assert.equal(read.status, 200, read.text);
  const { name, namespace, uid, resourceVersion, creationTimestamp } = stored.metadata;
  // spec.replicas 0 is omitted, as the apiserver's int32 omitempty writes it.
  assert.deepEqual(read.json, { kind: 'Scale', apiVersion: 'autoscaling/v1', metadata: { name, namespace, uid, resourceVersion, creationTimestamp }, spec: {}, status: { replicas: 0, selector: 'agents.x-k8s.io/warm-pool-sandbox=p' } });

  // kubectl scale's merge patch, a JSON patch, and a PUT of the whole Scale: each writes spec.replicas.
  const patched = await call(fx, 'PATCH', `${pools}/p/scale`, { key: admin, body: '{"spec":{"replicas":2}}', headers: merge });
  assert.equal(patched.status, 200, patched.text);
  assert.deepEqual((patched.json as { spec: unknown }).spec, { replicas: 2 });
  assert.equal(((await call(fx, 'GET', `${pools}/p`, { key: admin })).json as { spec: { replicas: number } }).spec.replicas, 2);
  const jp = await call(fx, 'PATCH', `${pools}/p/scale`, { key: admin, body: JSON.stringify([{ op: 'replace', path: '/spec/replicas', value: 1 }]), headers: { 'content-type': 'application/json-patch+json' } });
  assert.deepEqual([jp.status, (jp.json as { spec: unknown }).spec], [200, { replicas: 1 }]);
  const put = await call(fx, 'PUT', `${EXT}/v1alpha1/namespaces/default/sandboxwarmpools/p/scale`, { key: admin, json: { apiVersion: 'autoscaling/v1', kind: 'Scale', metadata: { name: 'p' }, spec: { replicas: 0 } } });
  assert.deepEqual([put.status, (put.json as { spec: unknown }).spec], [200, {}]);
  assert.equal(((await call(fx, 'GET', `${pools}/p`, { key: admin })).json as { spec: { replicas: number } }).spec.replicas, 0);

  // A Scale naming a version the object no longer has: the apiserver's Conflict, nothing written.
  const stale = await call(fx, 'PUT', `${pools}/p/scale`, { key: admin, json: { apiVersion: 'autoscaling/v1', kind: 'Scale', metadata: { name: 'p', resourceVersion: resourceVersion ?? '' }, spec: { replicas: 3 } } });
  assert.equal(stale.status, 409);
  assert.deepEqual(statusBody(stale), {
    kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure',
    message: 'Operation cannot be fulfilled on sandboxwarmpools.extensions.agents.x-k8s.io "p": the object has been modified; please apply your changes to the latest version and try again',
    reason: 'Conflict', details: { name: 'p', group: 'extensions.agents.x-k8s.io', kind: 'sandboxwarmpools' }, code: 409,
  });
  const otherName = await call(fx, 'PUT', `${pools}/p/scale`, { key: admin, json: { apiVersion: 'autoscaling/v1', kind: 'Scale', metadata: { name: 'zz' }, spec: { replicas: 3 } } });
  assert.deepEqual([otherName.status, statusBody(otherName).reason, statusBody(otherName).message], [400, 'BadRequest', 'the name of the object (zz) does not match the name on the URL (p)']);
  const noName = await call(fx, 'PUT', `${pools}/p/scale`, { key: admin, json: { apiVersion: 'autoscaling/v1', kind: 'Scale', spec: { replicas: 3 } } });
  assert.deepEqual([noName.status, statusBody(noName).message], [400, 'the name of the object (p based on URL) was undeterminable: name must be provided']);
  for (const replicas of [-1, 5000, 'x']) {
    const bad = await call(fx, 'PATCH', `${pools}/p/scale`, { key: admin, body: JSON.stringify({ spec: { replicas } }), headers: merge });
    assert.equal(bad.status, 422, `${String(replicas)}: ${bad.text}`);
    const inv = statusBody(bad) as { reason: string; message: string; details: { name: string; group: string; kind: string; causes: { field: string }[] } };
    assert.equal(inv.reason, 'Invalid');
    assert.match(inv.message, /^SandboxWarmPool\.extensions\.agents\.x-k8s\.io "p" is invalid: \[spec\.replicas: /);
    assert.deepEqual([inv.details.name, inv.details.group, inv.details.kind, inv.details.causes.map((c) => c.field)], ['p', 'extensions.agents.x-k8s.io', 'SandboxWarmPool', ['spec.replicas']]);
  }
  assert.equal(((await call(fx, 'GET', `${pools}/p`, { key: admin })).json as { spec: { replicas: number } }).spec.replicas, 0, 'no refused write changed the pool');

  // Methods a subresource does not take, and subresources a kind does not have.
  for (const [method, verb, path] of [['POST', 'create', `${pools}/p/scale`], ['DELETE', 'delete', `${pools}/p/scale`], ['DELETE', 'delete', `${pools}/p/status`]] as const) {
    const res = await call(fx, method, path, { key: admin, json: {} });
    assert.equal(res.status, 405);
    assert.deepEqual(statusBody(res), {
      kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: `${verb} is not supported on resources of kind "sandboxwarmpools.extensions.agents.x-k8s.io"`,
      reason: 'MethodNotAllowed', details: { group: 'extensions.agents.x-k8s.io', kind: 'sandboxwarmpools' }, code: 405,
    });
  }
  const claimScale = await call(fx, 'GET', `${EXT}/v1beta1/namespaces/default/sandboxclaims/x/scale`, { key: admin });
  assert.equal(claimScale.status, 404);
  assert.deepEqual(statusBody(claimScale), {
    kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: 'sandboxclaims.extensions.agents.x-k8s.io "x" not found', reason: 'NotFound',
    details: { name: 'x', group: 'extensions.agents.x-k8s.io', kind: 'sandboxclaims' }, code: 404,
  });
  const bogus = await call(fx, 'GET', `${pools}/p/bogus`, { key: admin });
  assert.deepEqual([bogus.status, statusBody(bogus).message], [404, 'sandboxwarmpools.extensions.agents.x-k8s.io "p" not found']);

  // A team key reads a pool's scale and cannot write it; it scales its own Sandbox (v1alpha1 replicas).
  assert.equal((await call(fx, 'GET', `${pools}/p/scale`, { key: fx.keys.teamA })).status, 200);
  const forbidden = await call(fx, 'PATCH', `${pools}/p/scale`, { key: fx.keys.teamA, body: '{"spec":{"replicas":5}}', headers: merge });
  assert.equal(forbidden.status, 403);
  assert.match(statusBody(forbidden).message as string, /^sandboxwarmpools\.extensions\.agents\.x-k8s\.io "p" is forbidden: key asb_\w+ of team "team-a" cannot patch resource "sandboxwarmpools\/scale" in API group "extensions\.agents\.x-k8s\.io" in the namespace "default": writing a SandboxWarmPool needs an admin API key$/);
  const sandboxes = `${CORE}/v1beta1/namespaces/default/sandboxes`;
  const mine = { apiVersion: 'agents.x-k8s.io/v1beta1', kind: 'Sandbox', metadata: { name: 'scaled' }, spec: { replicas: 1, podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox', command: ['sleep', 'infinity'] }] } } } };
  assert.equal((await call(fx, 'POST', sandboxes, { key: fx.keys.teamA, json: mine })).status, 201);
  const down = await call(fx, 'PATCH', `${sandboxes}/scaled/scale`, { key: fx.keys.teamA, body: '{"spec":{"replicas":0}}', headers: merge });
  assert.equal(down.status, 200, down.text);
  const after = (await call(fx, 'GET', `${sandboxes}/scaled`, { key: fx.keys.teamA })).json as { spec: { replicas: number }; metadata: { labels: Record<string, string> } };
  assert.deepEqual([after.spec.replicas, after.metadata.labels['asb.dev/owner']], [0, 'team-a']);
  assert.equal((await call(fx, 'GET', `${sandboxes}/scaled/scale`, { key: fx.keys.teamB })).status, 404, "another team's Sandbox is not there");
});

test('deletecollection: DELETE on a namespace\'s collection deletes what the same list selects and answers that list; a team key deletes only its own', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const admin = fx.keys.admin;
  const pools = `${EXT}/v1beta1/namespaces/default/sandboxwarmpools`;
  for (const name of ['a', 'b', 'c']) assert.equal((await call(fx, 'POST', pools, { key: admin, json: pool(name, { labels: { tier: name === 'b' ? 'gold' : 'plain' } }) })).status, 201);
  const names = async (): Promise<string[]> => ((await call(fx, 'GET', pools, { key: admin })).json as { items: { metadata: { name: string } }[] }).items.map((i) => i.metadata.name);

  const before = (await call(fx, 'GET', `${pools}/b`, { key: admin })).json as { metadata: { resourceVersion: string } };
  const gold = await call(fx, 'DELETE', `${pools}?labelSelector=tier%3Dgold`, { key: admin });
  assert.equal(gold.status, 200, gold.text);
  const list = gold.json as { apiVersion: string; kind: string; metadata: { continue: string; resourceVersion: string }; items: { metadata: { name: string; resourceVersion: string } }[] };
  assert.deepEqual([list.apiVersion, list.kind, list.metadata.continue, list.items.map((i) => i.metadata.name)], ['extensions.agents.x-k8s.io/v1beta1', 'SandboxWarmPoolList', '', ['b']]);
  assert.ok(Number(list.items[0]?.metadata.resourceVersion) >= Number(before.metadata.resourceVersion), 'the item as it was listed, before its delete');
  assert.deepEqual(await names(), ['a', 'c']);
  const byField = await call(fx, 'DELETE', `${pools}?fieldSelector=metadata.name%3Dc`, { key: admin, json: { kind: 'DeleteOptions', apiVersion: 'v1', propagationPolicy: 'Background' } });
  assert.deepEqual((byField.json as typeof list).items.map((i) => i.metadata.name), ['c']);
  const none = await call(fx, 'DELETE', `${pools}?labelSelector=tier%3Dnone`, { key: admin });
  assert.deepEqual([none.status, (none.json as typeof list).items], [200, []]);
  assert.deepEqual(await names(), ['a']);
  // Across namespaces the apiserver has no deletecollection route; a dry run is refused.
  const everywhere = await call(fx, 'DELETE', `${EXT}/v1beta1/sandboxwarmpools`, { key: admin });
  assert.deepEqual([everywhere.status, everywhere.text], [404, '404 page not found\n']);
  assert.equal((await call(fx, 'DELETE', `${pools}?dryRun=All`, { key: admin })).status, 400);
  assert.deepEqual(await names(), ['a']);

  // A team key: pools are not its to delete; its claims are, and only its own.
  const forbidden = await call(fx, 'DELETE', pools, { key: fx.keys.teamA });
  assert.equal(forbidden.status, 403);
  assert.deepEqual(statusBody(forbidden).details, { group: 'extensions.agents.x-k8s.io', kind: 'sandboxwarmpools' });
  assert.match(statusBody(forbidden).message as string, /cannot deletecollection resource "sandboxwarmpools" in API group "extensions\.agents\.x-k8s\.io" in the namespace "default": writing a SandboxWarmPool needs an admin API key$/);
  assert.deepEqual(await names(), ['a']);
  const claims = `${EXT}/v1beta1/namespaces/default/sandboxclaims`;
  for (const [key, name] of [[fx.keys.teamA, 'a1'], [fx.keys.teamA, 'a2'], [fx.keys.teamB, 'b1']] as const) assert.equal((await call(fx, 'POST', claims, { key, json: claim(name) })).status, 201);
  const mine = await call(fx, 'DELETE', claims, { key: fx.keys.teamA });
  assert.equal(mine.status, 200, mine.text);
  assert.deepEqual((mine.json as typeof list).items.map((i) => i.metadata.name), ['a1', 'a2']);
  const left = ((await call(fx, 'GET', claims, { key: admin })).json as typeof list).items.map((i) => i.metadata.name);
  assert.deepEqual(left, ['b1'], "team B's claim is untouched");
});

test('a team key\'s read-modify-write of its own bound claim and sandbox (patch, scale) sends the controller\'s keys back unchanged: that passes; changing one is refused, dropping one keeps it', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const key = fx.keys.teamA;
  const merge = { 'content-type': 'application/merge-patch+json' };
  const claims = `${EXT}/v1beta1/namespaces/default/sandboxclaims`;
  const sandboxes = `${CORE}/v1beta1/namespaces/default/sandboxes`;
  assert.equal((await call(fx, 'POST', `${EXT}/v1beta1/namespaces/default/sandboxwarmpools`, { key: fx.keys.admin, json: pool('p') })).status, 201);
  assert.equal((await call(fx, 'POST', claims, { key, json: claim('mine') })).status, 201);
  interface Obj { metadata: { uid: string; labels?: Record<string, string>; annotations?: Record<string, string>; ownerReferences?: { uid: string }[] }; spec: { replicas?: number }; status?: { sandbox?: { name: string } } }
  const bound = await waitFor('the claim bound', async () => {
    const c = (await call(fx, 'GET', `${claims}/mine`, { key })).json as Obj;
    return c.status?.sandbox?.name;
  }, 10_000);
  const sandbox = (await call(fx, 'GET', `${sandboxes}/${bound}`, { key })).json as Obj;
  const claimUid = sandbox.metadata.labels?.['agents.x-k8s.io/claim-uid'];
  assert.ok(claimUid !== undefined && sandbox.metadata.ownerReferences?.length === 1, JSON.stringify(sandbox.metadata));

  // kubectl scale and kubectl label send the controller's labels and owner reference back as they are.
  const scaled = await call(fx, 'PATCH', `${sandboxes}/${bound}/scale`, { key, body: '{"spec":{"replicas":0}}', headers: merge });
  assert.equal(scaled.status, 200, scaled.text);
  const labelled = await call(fx, 'PATCH', `${sandboxes}/${bound}`, { key, body: '{"metadata":{"labels":{"app":"mine"}}}', headers: merge });
  assert.equal(labelled.status, 200, labelled.text);
  const claimLabelled = await call(fx, 'PATCH', `${claims}/mine`, { key, body: '{"metadata":{"labels":{"app":"mine"}}}', headers: merge });
  assert.equal(claimLabelled.status, 200, claimLabelled.text);

  // Changing one is still refused; dropping one (null in a merge patch) leaves it as it was.
  const moved = await call(fx, 'PATCH', `${sandboxes}/${bound}`, { key, body: '{"metadata":{"labels":{"agents.x-k8s.io/claim-uid":"other"}}}', headers: merge });
  assert.equal(moved.status, 422, moved.text);
  const rebound = await call(fx, 'PATCH', `${claims}/mine`, { key, body: '{"metadata":{"annotations":{"agents.x-k8s.io/sandbox-name":"someone-elses"}}}', headers: merge });
  assert.equal(rebound.status, 422, rebound.text);
  const owned = await call(fx, 'PATCH', `${sandboxes}/${bound}`, { key, body: JSON.stringify({ metadata: { ownerReferences: [{ apiVersion: 'v1', kind: 'SandboxWarmPool', name: 'p', uid: 'x' }] } }), headers: merge });
  assert.equal(owned.status, 422, owned.text);
  const dropped = await call(fx, 'PATCH', `${sandboxes}/${bound}`, { key, body: '{"metadata":{"labels":{"agents.x-k8s.io/claim-uid":null},"ownerReferences":null}}', headers: merge });
  assert.equal(dropped.status, 200, dropped.text);
  const now = (await call(fx, 'GET', `${sandboxes}/${bound}`, { key })).json as Obj;
  assert.equal(now.metadata.labels?.['agents.x-k8s.io/claim-uid'], claimUid);
  assert.deepEqual(now.metadata.ownerReferences, sandbox.metadata.ownerReferences);
  assert.deepEqual([now.spec.replicas, now.metadata.labels.app, now.metadata.labels['asb.dev/owner']], [0, 'mine', 'team-a']);
});
