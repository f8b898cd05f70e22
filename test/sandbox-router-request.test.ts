// What the owning worker takes from a request routed by the kubernetes-sigs X-Sandbox-* headers,
// and what of it the pod gets: never the API key, the access token or its cookie, nor any
// routing header of ours or upstream's (X-Sandbox-Pod-IP included). Pure.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isAsbError } from '../src/errors.ts';
import { clientResponseHeaders, DEFAULT_SIGS_TIMEOUT_MS, isSigsRequest, podRequestHeaders, sigsCallOf } from '../src/worker/sandbox-router/request.ts';

const ID = 'loc1aaaaaaaaaaaaaaaa';

test('the router\'s x-asb-sandbox-* headers make the call; a request without -port is not one (envd keeps its own)', () => {
  assert.equal(isSigsRequest({ 'x-asb-sandbox-id': ID }), false, 'envd requests carry only the id');
  assert.equal(isSigsRequest({ 'x-asb-sandbox-id': ID, 'x-asb-sandbox-port': '8080' }), true);
  assert.deepEqual(sigsCallOf({ 'x-asb-sandbox-id': ID, 'x-asb-sandbox-port': '8080', 'x-asb-sandbox-namespace': 'default' }), { id: ID, port: 8080, namespace: 'default', timeoutMs: DEFAULT_SIGS_TIMEOUT_MS });
  assert.deepEqual(sigsCallOf({ 'x-asb-sandbox-id': ID, 'x-asb-sandbox-port': '8888', 'x-asb-sandbox-namespace': 'team', 'x-asb-sandbox-timeout': '70.5' }), { id: ID, port: 8888, namespace: 'team', timeoutMs: 70_500 });
  assert.equal(sigsCallOf({ 'x-asb-sandbox-id': ID, 'x-asb-sandbox-port': '1', 'x-asb-sandbox-namespace': 'a', 'x-asb-sandbox-timeout': '9999' }).timeoutMs, DEFAULT_SIGS_TIMEOUT_MS, 'capped at 180 s');
  for (const bad of [{ 'x-asb-sandbox-port': '0' }, { 'x-asb-sandbox-port': 'x' }, { 'x-asb-sandbox-namespace': '' }, { 'x-asb-sandbox-timeout': '-1' }]) {
    assert.throws(() => sigsCallOf({ 'x-asb-sandbox-id': ID, 'x-asb-sandbox-port': '80', 'x-asb-sandbox-namespace': 'a', ...bad }), (err) => isAsbError(err, 'BadRequest'), JSON.stringify(bad));
  }
});

test('the pod gets no key, token, access cookie, x-asb-*, x-sandbox-*, E2B or hop-by-hop header; it gets x-asb-sandbox-id', () => {
  const out = podRequestHeaders({
    host: '127.0.0.1:10000',
    'content-type': 'application/json',
    'content-length': '17',
    authorization: 'Bearer asb_abcdefgh_secret',
    'x-api-key': 'asb_abcdefgh_secret',
    'x-access-token': 'tok',
    cookie: 'a=1; asb_access=tok; b=2',
    'x-sandbox-id': ID,
    'x-sandbox-pod-ip': '127.0.0.1',
    'x-sandbox-uid': 'u',
    'x-asb-sandbox-port': '8080',
    'x-asb-dst': '127.0.0.1:22',
    'e2b-sandbox-id': ID,
    connection: 'keep-alive, x-custom-hop',
    'x-custom-hop': '1',
    'keep-alive': 'timeout=5',
    'transfer-encoding': 'chunked',
    upgrade: 'h2c',
    'x-request-id': 'r1',
  }, ID);
  assert.deepEqual(out, { host: '127.0.0.1:10000', 'content-type': 'application/json', 'content-length': '17', cookie: 'a=1; b=2', 'x-request-id': 'r1', 'x-asb-sandbox-id': ID });
  assert.deepEqual(podRequestHeaders({ cookie: 'asb_access=tok' }, ID), { 'x-asb-sandbox-id': ID }, 'a cookie header of only the token goes entirely');
  assert.deepEqual(clientResponseHeaders({ 'content-type': 'text/plain', connection: 'close', 'transfer-encoding': 'chunked', 'set-cookie': ['a=1'] }), { 'content-type': 'text/plain', 'set-cookie': ['a=1'] });
});

test('a pod cannot set a cookie for every sandbox host or shadow asb_access through these responses (as the edge filters the sandbox upstream)', () => {
  const out = clientResponseHeaders({ 'set-cookie': ['a=1; Domain=asb.localhost; Path=/; HttpOnly', 'ASB_ACCESS=x; Path=/', 'asb_access=y', 'b=2;domain=.localhost'] });
  assert.deepEqual(out, { 'set-cookie': ['a=1; Path=/; HttpOnly', 'b=2'] });
  assert.deepEqual(clientResponseHeaders({ 'set-cookie': ['asb_access=y; Domain=asb.localhost'] }), {});
});
