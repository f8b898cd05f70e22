// Host resolution: which sandbox and port, or which worker API, a request names; 400 for
// malformed hosts and ports.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isAsbError } from '../src/errors.ts';
import { parseTarget, type RequestLine, type Target } from '../src/router/host.ts';

const D = 'asb.localhost';
const line = (authority: string, path = '/', e2b: { id?: string; port?: string } = {}): RequestLine => ({ authority, path, e2bSandboxId: e2b.id, e2bSandboxPort: e2b.port });

test('resolves every host form to a target', () => {
  const cases: [RequestLine, Target][] = [
    [line(`8080-loc1abc.${D}`), { kind: 'sandbox', id: 'loc1abc', port: 8080 }],
    [line(`8080-loc1abc.${D}:10000`), { kind: 'sandbox', id: 'loc1abc', port: 8080 }],
    [line(`8080-LOC1ABC.ASB.LOCALHOST`), { kind: 'sandbox', id: 'loc1abc', port: 8080 }],
    [line(`loc1abc.${D}`), { kind: 'sandbox', id: 'loc1abc', port: undefined }],
    [line(`my-box.${D}`), { kind: 'sandbox', id: 'my-box', port: undefined }],
    [line(`3000-my-box.${D}`), { kind: 'sandbox', id: 'my-box', port: 3000 }],
    [line(`api.${D}`, '/sandboxes/loc1abc/pause'), { kind: 'api', id: 'loc1abc' }],
    [line(`api.${D}`, '/v2/sandboxes?state=running'), { kind: 'api', id: undefined }],
    [line(`api.${D}`, '/v1/status'), { kind: 'api', id: undefined }],
    [line('127.0.0.1:10000', '/sandboxes/loc1abc'), { kind: 'api', id: 'loc1abc' }],
    [line('localhost', '/v2/sandboxes/loc1abc/logs'), { kind: 'api', id: 'loc1abc' }],
    // E2B's build API: a built template's id carries its cluster's tag, as a sandbox id does.
    [line('127.0.0.1:10000', '/v2/templates/loc1abc/builds/b-1'), { kind: 'api', id: 'loc1abc' }],
    [line('127.0.0.1:10000', '/templates/loc1abc/builds/b-1/status?logsOffset=0'), { kind: 'api', id: 'loc1abc' }],
    [line('127.0.0.1:10000', '/v3/templates'), { kind: 'api', id: undefined }],
    // A sandbox's lifecycle events are kept by its worker: the path names the owner.
    [line('127.0.0.1:10000', '/events/sandboxes/loc1abc?limit=5'), { kind: 'api', id: 'loc1abc' }],
    [line(`api.${D}`, '/v1/events/sandboxes/loc1abc'), { kind: 'api', id: 'loc1abc' }],
    [line(`api.${D}`, '/events/webhooks'), { kind: 'api', id: undefined }],
    [line('127.0.0.1', '/files', { id: 'loc1abc', port: '49983' }), { kind: 'sandbox', id: 'loc1abc', port: 49983, e2bHeaders: true }],
    [line('[::1]:10000', '/', { id: 'loc1abc' }), { kind: 'sandbox', id: 'loc1abc', port: undefined, e2bHeaders: true }],
    [line(`sandbox.${D}`, '/', { id: 'loc1abc', port: '8080' }), { kind: 'sandbox', id: 'loc1abc', port: 8080, e2bHeaders: true }],
    // The Kubernetes API (kubectl, the k8s-sigs SDK): on the bare edge and api.<domain>; a Sandbox's path names its owner.
    [line('127.0.0.1:10002', '/apis'), { kind: 'api', id: undefined }],
    [line('127.0.0.1:10002', '/api?timeout=32s'), { kind: 'api', id: undefined }],
    [line('localhost', '/version'), { kind: 'api', id: undefined }],
    [line('127.0.0.1', '/openapi/v3/apis/agents.x-k8s.io/v1beta1?hash=AB'), { kind: 'api', id: undefined }],
    [line('127.0.0.1', '/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxclaims?watch=true'), { kind: 'api', id: undefined }],
    [line('127.0.0.1', '/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes/loc1abc'), { kind: 'api', id: 'loc1abc' }],
    [line(`api.${D}`, '/apis/agents.x-k8s.io/v1alpha1/namespaces/team/sandboxes/loc1abc/status'), { kind: 'api', id: 'loc1abc' }],
    [line(`api.${D}`, '/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes?watch=1'), { kind: 'api', id: undefined }],
    // The host decides when it names a sandbox: E2B headers cannot override it.
    [line(`8080-loc1abc.${D}`, '/', { id: 'loc1other', port: '22' }), { kind: 'sandbox', id: 'loc1abc', port: 8080 }],
  ];
  for (const [input, want] of cases) assert.deepEqual(parseTarget(input, D), want, JSON.stringify(input));
});

test('malformed hosts and ports are 400, foreign hosts and unnamed bare requests 404', () => {
  const cases: [RequestLine, 'BadRequest' | 'NotFound'][] = [
    [line(`0-loc1abc.${D}`), 'BadRequest'],
    [line(`65536-loc1abc.${D}`), 'BadRequest'],
    [line(`123456-loc1abc.${D}`), 'BadRequest'],
    [line(`8080-.${D}`), 'BadRequest'],
    [line(`a.b.${D}`), 'BadRequest'],
    [line(`bad_id.${D}`), 'BadRequest'],
    [line(`-x.${D}`), 'BadRequest'],
    [line('127.0.0.1', '/', { id: 'Not Valid' }), 'BadRequest'],
    [line('127.0.0.1', '/', { id: 'loc1abc', port: '80a' }), 'BadRequest'],
    [line('127.0.0.1', '/', { port: '80' }), 'BadRequest'],
    [line(`sandbox.${D}`, '/'), 'BadRequest'],
    [line('example.com'), 'NotFound'],
    [line(`x.other-${D}`), 'NotFound'],
    [line('127.0.0.1:10000', '/'), 'NotFound'],
    // Only the Kubernetes API's own prefixes, not look-alikes.
    [line('127.0.0.1:10000', '/apisx'), 'NotFound'],
    [line('127.0.0.1:10000', '/versions'), 'NotFound'],
    [line('127.0.0.1:10000', '/openapi/v2'), 'NotFound'],
  ];
  for (const [input, code] of cases) {
    assert.throws(() => parseTarget(input, D), (err) => isAsbError(err, code), JSON.stringify(input));
  }
});
