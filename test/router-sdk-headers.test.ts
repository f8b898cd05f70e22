// The kubernetes-sigs sandbox-router contract at the edge, decided without sockets: the
// k8s-agent-sandbox SDK's X-Sandbox-ID / -Namespace / -Port / -Timeout route on the edge's own
// address to the owning worker (which checks the API key and team), never by a host that names
// another target or beside E2B's headers, never to a client-given X-Sandbox-Pod-IP, and an
// unknown id is a plain 404.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isAsbError } from '../src/errors.ts';
import { decide, type DecideContext, type Decision } from '../src/router/decide.ts';
import { parseTarget, type RequestLine, type SigsHeaders } from '../src/router/host.ts';
import { RouteTable } from '../src/router/route-table.ts';
import { CLUSTER, DOMAIN, entry, ManualClock, TOKEN } from './support/router-fixture.ts';

const ID = 'loc1aaaaaaaaaaaaaaaa';
const SLEEPY = 'loc1bbbbbbbbbbbbbbbb';
const DEAD = 'loc1cccccccccccccccc';
const KEY = 'asb_abcdefgh_0123456789abcdef0123456789abcdef';

const sigsLine = (authority: string, sigs: Partial<SigsHeaders>, e2b: { id?: string; port?: string } = {}, path = '/execute'): RequestLine => ({
  authority,
  path,
  e2bSandboxId: e2b.id,
  e2bSandboxPort: e2b.port,
  sigs: { id: sigs.id, namespace: sigs.namespace, port: sigs.port, timeout: sigs.timeout },
});

function context(): DecideContext {
  const table = new RouteTable({ clock: new ManualClock() });
  table.setConnected(CLUSTER, true);
  table.apply(CLUSTER, {
    type: 'snapshot',
    version: 1,
    cluster: CLUSTER,
    entries: [entry(ID), entry(SLEEPY, { state: 'hibernated', podIp: undefined }), entry(DEAD, { state: 'failed', podIp: undefined })],
  });
  // Its worker said it does not exist (a lookup's negative cache).
  table.rememberMissing('loc1gonegonegonegone');
  return { table, domain: DOMAIN, clusters: new Set([CLUSTER]), defaultCluster: CLUSTER };
}

function ask(headers: Record<string, string>): Decision {
  return decide(new Map(Object.entries({ ':method': 'POST', ':path': '/execute', ':authority': '127.0.0.1:10000', ...headers })), context());
}

function rejected(d: Decision): { status: number; code: string; message: string } {
  assert.equal(d.kind, 'reject', JSON.stringify(d));
  assert.equal(d.e2bSandboxId, undefined, 'never E2B proxy\'s 502 body');
  return { status: d.error.status, code: d.error.code, message: d.error.message };
}

test('X-Sandbox-ID routes on the edge address (IP, localhost, sandbox.<domain>): port default 8888, namespace default "default", timeout capped at 180 s', () => {
  for (const host of ['127.0.0.1:10000', '[::1]:10002', 'localhost', `sandbox.${DOMAIN}`]) {
    assert.deepEqual(parseTarget(sigsLine(host, { id: ID }), DOMAIN), { kind: 'sandbox', id: ID, port: 8888, sigs: { namespace: 'default', timeoutS: undefined } }, host);
  }
  assert.deepEqual(parseTarget(sigsLine('127.0.0.1', { id: ` ${ID} `, namespace: 'team-a', port: '8080', timeout: '60' }), DOMAIN), { kind: 'sandbox', id: ID, port: 8080, sigs: { namespace: 'team-a', timeoutS: 60 } });
  assert.deepEqual(parseTarget(sigsLine('127.0.0.1', { id: ID, timeout: '70.5' }), DOMAIN), { kind: 'sandbox', id: ID, port: 8888, sigs: { namespace: 'default', timeoutS: 70.5 } });
  assert.deepEqual(parseTarget(sigsLine('127.0.0.1', { id: ID, timeout: '3600' }), DOMAIN), { kind: 'sandbox', id: ID, port: 8888, sigs: { namespace: 'default', timeoutS: 180 } });
  // X-Sandbox-Timeout (or Pod-IP, which is not even read) alone steers nothing: API paths stay API paths.
  assert.deepEqual(parseTarget(sigsLine('127.0.0.1', { timeout: '60' }, {}, '/v1/sandboxes'), DOMAIN), { kind: 'api', id: undefined });
});

test('X-Sandbox-* that conflict or are malformed are 400, naming the header; never a silent pick', () => {
  const cases: [RequestLine, RegExp][] = [
    // A host that names a sandbox, or the API, already names the target.
    [sigsLine(`8080-${ID}.${DOMAIN}`, { id: 'loc1other' }), /X-Sandbox-ID.*names its own target/],
    [sigsLine(`8080-${ID}.${DOMAIN}`, { id: ID }), /names its own target/],
    [sigsLine(`${ID}.${DOMAIN}`, { port: '22' }), /names its own target/],
    [sigsLine(`api.${DOMAIN}`, { id: ID }, {}, '/v1/sandboxes'), /names its own target/],
    [sigsLine(`api.${DOMAIN}`, { namespace: 'default' }, {}, '/v1/sandboxes'), /names its own target/],
    // Both SDKs' headers on one request.
    [sigsLine('127.0.0.1', { id: ID }, { id: ID }), /both E2b-Sandbox-\* and X-Sandbox-\*/],
    [sigsLine('127.0.0.1', { id: ID }, { port: '49983' }), /both/],
    [sigsLine(`sandbox.${DOMAIN}`, { port: '8080' }, { id: ID }), /both/],
    // Malformed values, or a port or namespace for no sandbox.
    [sigsLine('127.0.0.1', { id: 'Not_A_Label' }), /malformed X-Sandbox-ID/],
    [sigsLine('127.0.0.1', { id: ID.toUpperCase() }), /malformed X-Sandbox-ID/],
    [sigsLine('127.0.0.1', { id: ID, namespace: 'a/b' }), /malformed X-Sandbox-Namespace/],
    [sigsLine('127.0.0.1', { id: ID, port: '0' }), /X-Sandbox-Port/],
    [sigsLine('127.0.0.1', { id: ID, port: '65536' }), /X-Sandbox-Port/],
    [sigsLine('127.0.0.1', { id: ID, port: '80a' }), /X-Sandbox-Port/],
    [sigsLine('127.0.0.1', { id: ID, timeout: '0' }), /X-Sandbox-Timeout/],
    [sigsLine('127.0.0.1', { id: ID, timeout: '-5' }), /X-Sandbox-Timeout/],
    [sigsLine('127.0.0.1', { id: ID, timeout: 'soon' }), /X-Sandbox-Timeout/],
    [sigsLine('127.0.0.1', { port: '8888' }), /without X-Sandbox-ID/],
    [sigsLine('127.0.0.1', { namespace: 'default' }), /without X-Sandbox-ID/],
  ];
  for (const [input, message] of cases) {
    assert.throws(() => parseTarget(input, DOMAIN), (err) => isAsbError(err, 'BadRequest') && message.test(err.message), JSON.stringify(input));
  }
});

test('with an API key, a known sandbox goes to its owning worker with the validated port, namespace and timeout; every x-sandbox-*, E2B and x-asb-* header is removed, the key kept for the worker', () => {
  const d = ask({
    'x-sandbox-id': ID,
    'x-sandbox-namespace': 'default',
    'x-sandbox-port': '8080',
    'x-sandbox-timeout': '60',
    'x-sandbox-pod-ip': '127.0.0.1',
    'x-sandbox-uid': 'u1',
    'x-asb-dst': '127.0.0.1:22',
    'x-access-token': TOKEN,
    authorization: `Bearer ${KEY}`,
  });
  assert.equal(d.kind, 'route');
  assert.deepEqual(d.set, [['x-asb-upstream', `api-${CLUSTER}`], ['x-asb-sandbox-id', ID], ['x-asb-sandbox-port', '8080'], ['x-asb-sandbox-namespace', 'default'], ['x-asb-sandbox-timeout', '60']]);
  assert.deepEqual(new Set(d.remove), new Set(['x-sandbox-id', 'x-sandbox-namespace', 'x-sandbox-port', 'x-sandbox-timeout', 'x-sandbox-pod-ip', 'x-sandbox-uid', 'x-asb-dst', 'x-access-token']));
  assert.equal(d.pod, undefined, 'nothing is dialled by the router: the worker serves it');
  assert.ok(!d.set.some(([, v]) => v.includes('127.0.0.1')), 'X-Sandbox-Pod-IP steers nothing');
  // X-API-Key works the same; without -Port, 8888 and no timeout header.
  const viaApiKey = ask({ 'x-sandbox-id': ID, 'x-api-key': KEY });
  assert.equal(viaApiKey.kind, 'route');
  assert.deepEqual(viaApiKey.set, [['x-asb-upstream', `api-${CLUSTER}`], ['x-asb-sandbox-id', ID], ['x-asb-sandbox-port', '8888'], ['x-asb-sandbox-namespace', 'default']]);
});

test('a hibernated sandbox is not woken by the router (the worker wakes it after the key check); a failed one is 503', () => {
  const d = ask({ 'x-sandbox-id': SLEEPY, 'x-api-key': KEY });
  assert.equal(d.kind, 'route', 'routed to the worker, not held for a wake here');
  const dead = rejected(ask({ 'x-sandbox-id': DEAD, 'x-api-key': KEY }));
  assert.equal(dead.status, 503);
});

test('no API key is 401 before anything is looked up or woken; an unknown sandbox is a plain 404', () => {
  for (const headers of [{}, { 'x-access-token': TOKEN }, { authorization: 'Basic dXNlcjpwYXNz' }, { 'x-api-key': ' ' }]) {
    const r = rejected(ask({ 'x-sandbox-id': SLEEPY, ...headers }));
    assert.deepEqual([r.status, r.code], [401, 'Unauthorized'], JSON.stringify(headers));
    assert.match(r.message, /API key/);
  }
  // Known missing: 404 (the SDK's "not found"), not E2B's 502, not a 5xx it would retry.
  const gone = rejected(ask({ 'x-sandbox-id': 'loc1gonegonegonegone', 'x-api-key': KEY }));
  assert.deepEqual([gone.status, gone.code], [404, 'NotFound']);
  const gone49983 = rejected(ask({ 'x-sandbox-id': 'loc1gonegonegonegone', 'x-sandbox-port': '49983', 'x-api-key': KEY }));
  assert.equal(gone49983.status, 404);
  // Not in the table yet: looked up at its worker, and answered as a plain 404 if it is missing there.
  const fresh = ask({ 'x-sandbox-id': 'loc1newnewnewnewnewn', 'x-api-key': KEY });
  assert.deepEqual(fresh, { kind: 'lookup', id: 'loc1newnewnewnewnewn', cluster: CLUSTER, e2b: false });
});

test('x-sandbox-* headers never reach a pod on any route, and a sandbox host with X-Sandbox-ID is 400', () => {
  const d = ask({ ':authority': `8080-${ID}.${DOMAIN}`, 'x-access-token': TOKEN, 'x-sandbox-pod-ip': '127.0.0.1', 'x-sandbox-timeout': '5' });
  assert.equal(d.kind, 'route');
  assert.ok(d.remove.includes('x-sandbox-pod-ip') && d.remove.includes('x-sandbox-timeout'), JSON.stringify(d.remove));
  assert.deepEqual(d.pod, { host: '10.213.0.7', port: 8080 }, 'the pod from the route table, never the client-given address');
  const conflict = rejected(ask({ ':authority': `8080-${ID}.${DOMAIN}`, 'x-access-token': TOKEN, 'x-sandbox-id': ID, 'x-api-key': KEY }));
  assert.equal(conflict.status, 400);
  const both = rejected(ask({ 'x-sandbox-id': ID, 'e2b-sandbox-id': ID, 'x-api-key': KEY }));
  assert.equal(both.status, 400);
});
