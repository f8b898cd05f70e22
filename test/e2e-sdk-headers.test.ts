// The kubernetes-sigs SDK's data plane end to end (k8s-agent-sandbox's Direct mode, as its
// requests go on the wire): through the real Envoy edge and router to a real sandbox, addressed
// only by X-Sandbox-ID / -Namespace / -Port on the edge's own address and authenticated by the
// team's API key, which the owning worker checks before anything reaches the pod. The app in the
// sandbox echoes the request it got, so the test sees exactly what reached it.
import assert from 'node:assert/strict';
import { createServer, type Socket } from 'node:net';
import { test } from 'node:test';
import { startTestSystem } from './support/local-system.ts';
import { edgeGet, slowListenTemplate } from './support/web-sandbox.ts';
import { api } from './support/worker-process.ts';
import { waitFor } from './support/wait.ts';

// http.server answering every GET and POST with what it received: method, path, headers, body.
const ECHO_APP = `
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def answer(self):
        n = int(self.headers.get('content-length') or 0)
        body = self.rfile.read(n).decode() if n else ''
        out = json.dumps({'method': self.command, 'path': self.path, 'headers': {k.lower(): v for k, v in self.headers.items()}, 'body': body}).encode()
        self.send_response(200)
        self.send_header('content-type', 'application/json')
        self.send_header('content-length', str(len(out)))
        if self.path == '/cookies':
            self.send_header('set-cookie', 'asb_access=planted; Domain=asb.localhost; Path=/')
            self.send_header('set-cookie', 'app=1; Domain=asb.localhost; Path=/')
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = answer
http.server.ThreadingHTTPServer(('', 8080), H).serve_forever()
`;

const ECHO_TEMPLATE = {
  apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
  kind: 'SandboxTemplate',
  metadata: { name: 'echo', namespace: 'default' },
  spec: {
    podTemplate: {
      spec: {
        containers: [{ name: 'main', image: 'python:3.11', command: ['python3', '-c', ECHO_APP], ports: [{ containerPort: 8080 }], readinessProbe: { tcpSocket: { port: 8080 }, periodSeconds: 1 } }],
      },
    },
  },
};
const ECHO_POOL = { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxWarmPool', metadata: { name: 'echo', namespace: 'default' }, spec: { replicas: 1, sandboxTemplateRef: { name: 'echo' } } };

interface Echo {
  method: string;
  path: string;
  headers: Record<string, string>;
  body: string;
}

test('X-Sandbox-* with the team API key reach the sandbox through Envoy; other teams, no key, unknown ids, wrong namespaces do not; Pod-IP is never dialled; no key reaches the app', async (t) => {
  const system = await startTestSystem('sdkh', 187, 'local', 0, false, ['sdk-team-a', 'sdk-team-b']);
  t.after(() => system.cleanup());
  const keyA = system.teamKeys['sdk-team-a'] ?? '';
  const keyB = system.teamKeys['sdk-team-b'] ?? '';
  const applied = await api(system, 'POST', '/v1/apply', { objects: [ECHO_TEMPLATE, ECHO_POOL] });
  assert.equal(applied.status, 200, JSON.stringify(applied.body));
  const created = await api<{ id: string; ready: boolean }>(system, 'POST', '/v1/sandboxes', { template: 'echo' }, keyA);
  assert.equal(created.status, 201, JSON.stringify(created.body));
  const id = created.body.id;

  // A listener standing in for what X-Sandbox-Pod-IP: 127.0.0.1 would make upstream's router dial.
  const dialled: Socket[] = [];
  const bait = createServer((socket) => {
    dialled.push(socket);
    socket.destroy();
  });
  await new Promise<void>((resolve) => bait.listen(0, '127.0.0.1', resolve));
  t.after(() => bait.close());
  const baitPort = (bait.address() as { port: number }).port;

  const edge = system.edgeUrl;
  const send = async (headers: Record<string, string>, init: { method?: string; path?: string; body?: string } = {}): Promise<{ status: number; text: string }> => {
    const res = await fetch(`${edge}${init.path ?? '/echo?x=1'}`, { method: init.method ?? 'POST', headers, ...(init.body === undefined ? {} : { body: init.body }) });
    return { status: res.status, text: await res.text() };
  };
  const sdk = (key: Record<string, string>, extra: Record<string, string> = {}): Record<string, string> => ({
    'x-sandbox-id': id,
    'x-sandbox-namespace': 'default',
    'x-sandbox-port': '8080',
    'x-sandbox-timeout': '60',
    ...key,
    ...extra,
  });

  // The team's key, both ways the SDK's extra_headers can carry it: 200 from the app itself.
  const ok = await send(sdk({ authorization: `Bearer ${keyA}` }, { 'x-sandbox-pod-ip': '127.0.0.1', 'x-sandbox-uid': 'u', 'x-access-token': 'nope', cookie: 'asb_access=nope; theme=dark' }), { body: '{"command":"true"}' });
  assert.equal(ok.status, 200, ok.text);
  const echo = JSON.parse(ok.text) as Echo;
  assert.deepEqual([echo.method, echo.path, echo.body], ['POST', '/echo?x=1', '{"command":"true"}']);
  const reached = Object.keys(echo.headers);
  assert.deepEqual(reached.filter((h) => h.startsWith('x-sandbox-')), [], 'no X-Sandbox-* header reaches the app (Pod-IP included)');
  assert.ok(!reached.includes('authorization') && !reached.includes('x-api-key'), `the API key never reaches the app: ${reached.join(', ')}`);
  assert.ok(!reached.includes('x-access-token') && echo.headers.cookie === 'theme=dark', 'no access token in any form');
  assert.ok(!Object.values(echo.headers).some((v) => v.includes(keyA.slice(4))), 'the key appears in no header value');
  assert.equal(echo.headers['x-asb-sandbox-id'], id, 'the app learns which sandbox it is, as on every edge route');
  const viaApiKey = await send(sdk({ 'x-api-key': keyA }), { method: 'GET', path: '/' });
  assert.equal(viaApiKey.status, 200, viaApiKey.text);
  assert.ok(!Object.keys((JSON.parse(viaApiKey.text) as Echo).headers).includes('x-api-key'));

  // X-Sandbox-Pod-IP pointed at our listener, on the listener's port: nothing dials it (the pod
  // has nothing on that port, so the worker reports it unreachable), and the listener saw nothing.
  const bated = await send(sdk({ authorization: `Bearer ${keyA}` }, { 'x-sandbox-pod-ip': '127.0.0.1', 'x-sandbox-port': String(baitPort) }));
  assert.equal(bated.status, 503, bated.text);
  assert.equal(dialled.length, 0, 'X-Sandbox-Pod-IP was never dialled');

  // Another team's key: 404, exactly as for an id that does not exist.
  const other = await send(sdk({ authorization: `Bearer ${keyB}` }));
  assert.equal(other.status, 404, other.text);
  // No key: 401; a made-up key: 401 from the worker.
  const none = await send(sdk({}));
  assert.equal(none.status, 401, none.text);
  const madeUp = await send(sdk({ authorization: 'Bearer asb_zzzzzzzz_0123456789abcdef0123456789abcdef' }));
  assert.equal(madeUp.status, 401, madeUp.text);
  // An unknown sandbox: 404 (the SDK's not-found, not a 5xx it would retry).
  const unknown = await send(sdk({ authorization: `Bearer ${keyA}` }, { 'x-sandbox-id': 'sdkhnosuchsandbox000' }));
  assert.equal(unknown.status, 404, unknown.text);
  // A namespace that is not the sandbox's: 404, never another sandbox.
  const elsewhere = await send(sdk({ authorization: `Bearer ${keyA}` }, { 'x-sandbox-namespace': 'team-x' }));
  assert.equal(elsewhere.status, 404, elsewhere.text);
  // No X-Sandbox-Port: the python-runtime's 8888, which the worker answers (e2e-python-runtime.test.ts).
  const runtime = await send({ 'x-sandbox-id': id, authorization: `Bearer ${keyA}` }, { path: '/execute', body: '{"command":"true"}' });
  assert.equal(runtime.status, 200, runtime.text);
  assert.deepEqual(JSON.parse(runtime.text), { stdout: '', stderr: '', exit_code: 0, timed_out: false });
  // A host that names a sandbox and X-Sandbox-ID: 400, whichever sandbox each names.
  const conflict = await edgeGet(edge, `8080-${id}.asb.localhost`, { headers: { 'x-sandbox-id': id, authorization: `Bearer ${keyA}` } });
  assert.equal(conflict.status, 400, conflict.body);
  assert.equal(dialled.length, 0);

  // A cookie for every sandbox host, or one shadowing asb_access, does not get out (as on sandbox hosts).
  const cookies = await fetch(`${edge}/cookies`, { headers: { host: 'sandbox.asb.localhost', ...sdk({ 'x-api-key': keyA }) } });
  assert.equal(cookies.status, 200);
  assert.deepEqual(cookies.headers.getSetCookie(), ['app=1; Path=/']);

  // Hibernated: the worker wakes it once the key checks out, and the request is answered.
  const paused = await api(system, 'POST', `/v1/sandboxes/${id}/pause`, undefined, keyA);
  assert.equal(paused.status, 200, JSON.stringify(paused.body));
  await waitFor('the sandbox to hibernate', async () => ((await api<{ phase: string }>(system, 'GET', `/v1/sandboxes/${id}`, undefined, keyA)).body.phase === 'Hibernated' ? true : undefined));
  const stillAsleep = await send(sdk({ authorization: `Bearer ${keyB}` }));
  assert.equal(stillAsleep.status, 404, 'another team cannot wake it');
  assert.equal((await api<{ phase: string }>(system, 'GET', `/v1/sandboxes/${id}`, undefined, keyA)).body.phase, 'Hibernated');
  const woken = await send(sdk({ authorization: `Bearer ${keyA}` }), { body: 'after a wake' });
  assert.equal(woken.status, 200, woken.text);
  assert.equal((JSON.parse(woken.text) as Echo).body, 'after a wake');
});

test('a hibernated sandbox whose app binds its port seconds after the pod runs: the worker wakes it and waits for the port, one slow 200 (not a 503)', async (t) => {
  const system = await startTestSystem('sdki', 188, 'local', 0, false, ['sdk-team-a']);
  t.after(() => system.cleanup());
  const key = system.teamKeys['sdk-team-a'] ?? '';
  const applied = await api(system, 'POST', '/v1/apply', { objects: [slowListenTemplate('slow', 2)] });
  assert.equal(applied.status, 200, JSON.stringify(applied.body));
  const created = await api<{ id: string }>(system, 'POST', '/v1/sandboxes', { template: 'slow' }, key);
  assert.equal(created.status, 201, JSON.stringify(created.body));
  const id = created.body.id;
  const phase = async (): Promise<string> => (await api<{ phase: string }>(system, 'GET', `/v1/sandboxes/${id}`, undefined, key)).body.phase;
  assert.equal((await api(system, 'POST', `/v1/sandboxes/${id}/pause`, undefined, key)).status, 200);
  await waitFor('the sandbox to hibernate', async () => ((await phase()) === 'Hibernated' ? true : undefined));
  const res = await fetch(`${system.edgeUrl}/whoami.txt`, { headers: { 'x-sandbox-id': id, 'x-sandbox-port': '8000', authorization: `Bearer ${key}` } });
  const text = await res.text();
  assert.equal(res.status, 200, text);
  assert.equal(text.trim(), id, 'the sandbox itself answered');
});
