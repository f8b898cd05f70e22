// The Kubernetes API's pure parts (src/kubeapi/), without sockets: printer columns and ages,
// patches (RFC 7386, RFC 6902), content negotiation, paths and selectors, and Status reasons.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AsbError, ERRORS, isAsbError, type ErrorCode } from '../src/errors.ts';
import { aggregatedVersion } from '../src/kubeapi/discovery.ts';
import { jsonPatch, mergePatch } from '../src/kubeapi/patch.ts';
import { isKubeApiPath, parseFieldSelector, parseResourcePath } from '../src/kubeapi/request.ts';
import { SERVED } from '../src/kubeapi/resources.ts';
import { statusOf } from '../src/kubeapi/status.ts';
import { evalJsonPath, humanDuration, parseJsonPath, toTable, wantsTable } from '../src/kubeapi/table.ts';
import { SandboxClaimType } from '../src/api/types.ts';

test('every printer column of every served kind converts, and a claim prints as kubectl shows it', () => {
  for (const s of SERVED) for (const c of s.columns) assert.doesNotThrow(() => parseJsonPath(c.jsonPath), `${s.rt.kind} ${c.name}`);
  const claims = SERVED.find((s) => s.rt === SandboxClaimType);
  assert.ok(claims !== undefined);
  const now = Date.parse('2026-01-01T01:00:00Z');
  const claim = {
    apiVersion: 'extensions.agents.x-k8s.io/v1beta1', kind: 'SandboxClaim',
    metadata: { name: 'c', namespace: 'default', creationTimestamp: '2026-01-01T00:55:00Z' },
    status: { sandbox: { name: 'loc1abc' }, conditions: [{ type: 'Other', status: 'False', reason: 'X' }, { type: 'Ready', status: 'True', reason: 'SandboxReady' }] },
  };
  const table = toTable([claim], { columns: claims.columns, now, include: 'Metadata', resourceVersion: '9' }) as { columnDefinitions: { name: string }[]; rows: { cells: unknown[]; object: { kind: string } }[]; metadata: unknown };
  assert.deepEqual(table.columnDefinitions.map((c) => c.name), ['Name', 'Ready', 'Sandbox', 'Reason', 'Age']);
  assert.deepEqual(table.rows[0]?.cells, ['c', 'True', 'loc1abc', 'SandboxReady', '5m']);
  assert.equal(table.rows[0].object.kind, 'PartialObjectMetadata');
  assert.deepEqual(table.metadata, { resourceVersion: '9' });
  const bare = toTable([{ ...claim, status: {} }], { columns: claims.columns, now, include: 'None', noHeaders: true }) as { columnDefinitions: unknown[]; rows: Record<string, unknown>[] };
  assert.deepEqual(bare.columnDefinitions, []);
  assert.deepEqual(bare.rows[0], { cells: ['c', null, null, null, '5m'] });
  assert.equal(evalJsonPath(parseJsonPath('.status.podIPs[1]'), { status: { podIPs: ['a', 'b'] } }), 'b');
});

test('ages read as kubectl prints them (duration.HumanDuration)', () => {
  const s = 1000;
  const cases: [number, string][] = [
    [-5 * s, '<invalid>'], [-500, '0s'], [0, '0s'], [119 * s, '119s'], [120 * s, '2m'], [125 * s, '2m5s'], [600 * s, '10m'], [179 * 60 * s, '179m'],
    [3 * 3600 * s, '3h'], [3 * 3600 * s + 60 * s, '3h1m'], [8 * 3600 * s, '8h'], [47 * 3600 * s, '47h'], [48 * 3600 * s, '2d'], [50 * 3600 * s, '2d2h'],
    [8 * 86400 * s, '8d'], [730 * 86400 * s, '2y'], [731 * 86400 * s, '2y1d'], [8 * 365 * 86400 * s, '8y'],
  ];
  for (const [ms, want] of cases) assert.equal(humanDuration(ms), want, String(ms));
});

test('merge patches follow RFC 7386 and JSON patches RFC 6902, refusing bad operations with 400', () => {
  assert.deepEqual(mergePatch({ a: 'b', c: { d: 'e', f: 'g' } }, { a: 'z', c: { f: null } }), { a: 'z', c: { d: 'e' } });
  assert.deepEqual(mergePatch({ a: [1, 2] }, { a: [3] }), { a: [3] });
  assert.deepEqual(mergePatch({ a: 'b' }, { a: { x: null, y: 1 } }), { a: { y: 1 } });
  const doc = { spec: { list: ['a', 'b'], keep: 1 }, metadata: { 'a/b': 1, 'c~d': 2 } };
  assert.deepEqual(jsonPatch(doc, [
    { op: 'add', path: '/spec/list/-', value: 'c' },
    { op: 'add', path: '/spec/list/0', value: 'z' },
    { op: 'remove', path: '/metadata/a~1b' },
    { op: 'replace', path: '/metadata/c~0d', value: 3 },
    { op: 'copy', from: '/spec/keep', path: '/spec/copied' },
    { op: 'move', from: '/spec/keep', path: '/spec/moved' },
    { op: 'test', path: '/spec/moved', value: 1 },
  ]), { spec: { list: ['z', 'a', 'b', 'c'], copied: 1, moved: 1 }, metadata: { 'c~d': 3 } });
  assert.deepEqual(doc.spec.list, ['a', 'b'], 'the input is not changed');
  for (const bad of [{}, [{ op: 'nope', path: '/a' }], [{ op: 'remove', path: '/missing' }], [{ op: 'add', path: 'no-slash', value: 1 }], [{ op: 'add', path: '/spec/list/9', value: 1 }], [{ op: 'add', path: '/spec/x' }]]) {
    assert.throws(() => jsonPatch(doc, bad), (err) => isAsbError(err, 'BadRequest'), JSON.stringify(bad));
  }
  assert.throws(() => jsonPatch(doc, [{ op: 'test', path: '/spec/keep', value: 2 }]), (err) => isAsbError(err, 'Invalid'));
});

test('content negotiation: the Accept headers kubectl 1.37 sends', () => {
  assert.equal(aggregatedVersion('application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json'), 'v2');
  assert.equal(aggregatedVersion('application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json'), 'v2beta1');
  assert.equal(aggregatedVersion('application/json, */*'), undefined);
  assert.equal(aggregatedVersion(undefined), undefined);
  assert.equal(wantsTable('application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json'), true);
  assert.equal(wantsTable('application/json'), false);
});

test('paths and field selectors', () => {
  assert.equal(isKubeApiPath('/apis/agents.x-k8s.io'), true);
  assert.equal(isKubeApiPath('/openapi/v3'), true);
  assert.equal(isKubeApiPath('/apisx'), false);
  assert.equal(isKubeApiPath('/v1/sandboxes'), false);
  const one = parseResourcePath('/apis/agents.x-k8s.io/v1beta1/namespaces/team-a/sandboxes/loc1abc/status');
  assert.deepEqual(one && { kind: one.served.rt.kind, v: one.version, ns: one.namespace, name: one.name, sub: one.subresource }, { kind: 'Sandbox', v: 'v1beta1', ns: 'team-a', name: 'loc1abc', sub: 'status' });
  const all = parseResourcePath('/apis/extensions.agents.x-k8s.io/v1alpha1/sandboxclaims');
  assert.deepEqual(all && [all.served.rt.kind, all.namespace, all.name], ['SandboxClaim', undefined, undefined]);
  // Any subresource parses; the server answers NotFound for one the CRD does not declare, as the apiserver does.
  const scale = parseResourcePath('/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/d/sandboxwarmpools/p/scale');
  assert.deepEqual(scale && [scale.served.rt.kind, scale.name, scale.subresource], ['SandboxWarmPool', 'p', 'scale']);
  for (const none of [
    '/apis/agents.x-k8s.io/v1/namespaces/d/sandboxes', '/apis/asb.dev/v1alpha1/apikeys', '/apis/agents.x-k8s.io/v1beta1/namespaces/d/sandboxes/x/scale/more',
    '/apis/agents.x-k8s.io/v1beta1/sandboxes/x', '/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/d/sandboxes', '/apis/agents.x-k8s.io/v1beta1/namespaces/d/sandboxes/x/',
  ]) assert.equal(parseResourcePath(none), undefined, none);
  assert.deepEqual(parseFieldSelector('metadata.name=a,metadata.namespace!=b'), { name: { op: '=', value: 'a' }, namespace: { op: '!=', value: 'b' } });
  assert.deepEqual(parseFieldSelector('metadata.name==a'), { name: { op: '=', value: 'a' } });
  assert.throws(() => parseFieldSelector('status.phase=Running'), (err) => isAsbError(err, 'BadRequest') && err.message === 'field label not supported: status.phase');
});

test('every error code has the apiserver\'s reason and its HTTP code in a Status', () => {
  const want: Record<ErrorCode, string> = {
    NotFound: 'NotFound', AlreadyExists: 'AlreadyExists', Conflict: 'Conflict', Invalid: 'Invalid', BadRequest: 'BadRequest', MalformedJson: 'BadRequest',
    UnsupportedMediaType: 'UnsupportedMediaType', PayloadTooLarge: 'RequestEntityTooLarge', TooManyRequests: 'TooManyRequests', Unauthorized: 'Unauthorized',
    Forbidden: 'Forbidden', MethodNotAllowed: 'MethodNotAllowed', Gone: 'Expired', PoolExhausted: 'ServiceUnavailable', Unavailable: 'ServiceUnavailable',
    Timeout: 'Timeout', SandboxNotRunning: 'Conflict', NotImplemented: '', CheckpointFailed: 'InternalError', BuildFailed: 'Invalid', Internal: 'InternalError',
  };
  for (const code of Object.keys(ERRORS) as ErrorCode[]) {
    const s = statusOf(new AsbError(code, 'm'));
    assert.deepEqual([s.kind, s.apiVersion, s.status, s.reason, s.code, s.message], ['Status', 'v1', 'Failure', want[code], ERRORS[code].status, 'm'], code);
  }
  const retry = statusOf(new AsbError('TooManyRequests', 'slow down', { retryAfterS: 2 }));
  assert.deepEqual(retry.details, { retryAfterSeconds: 2 });
});
