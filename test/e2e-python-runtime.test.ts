// The python-runtime API (what k8s-agent-sandbox's Direct mode speaks on port 8888) answered by
// the owning worker, end to end: through the real Envoy edge and router to a real sandbox that
// runs nothing but `sleep` (no agent in the image), addressed by X-Sandbox-ID alone (no
// X-Sandbox-Port: 8888) and authenticated by the team's API key. Requests are built as the SDK
// builds them: JSON /execute, multipart /upload with the path as the part's filename, and
// quote(path, safe='') path segments.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { test } from 'node:test';
import { startTestSystem } from './support/local-system.ts';
import { api } from './support/worker-process.ts';

const template = (name: string, env: { name: string; value: string }[] = []): unknown => ({
  apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
  kind: 'SandboxTemplate',
  metadata: { name, namespace: 'default' },
  spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'python:3.11', command: ['sh', '-c', 'exec sleep 100000'], env }] } } },
});

// An image that serves the python-runtime API itself on 8888 (here: a stand-in answering every
// POST with a marker), annotated so the worker passes its requests through.
const OWN_RUNTIME = `
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get('content-length') or 0))
        out = json.dumps({'stdout': 'from the pod ' + self.path, 'stderr': '', 'exit_code': 0}).encode()
        self.send_response(200)
        self.send_header('content-type', 'application/json')
        self.send_header('content-length', str(len(out)))
        self.end_headers()
        self.wfile.write(out)
http.server.ThreadingHTTPServer(('', 8888), H).serve_forever()
`;
const OWN_TEMPLATE = {
  apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
  kind: 'SandboxTemplate',
  metadata: { name: 'own', namespace: 'default' },
  spec: { podTemplate: { metadata: { annotations: { 'asb.dev/python-runtime': 'pod' } }, spec: { containers: [{ name: 'main', image: 'python:3.11', command: ['python3', '-c', OWN_RUNTIME], ports: [{ containerPort: 8888 }], readinessProbe: { tcpSocket: { port: 8888 }, periodSeconds: 1 } }] } } },
};

interface Execute {
  stdout: string;
  stderr: string;
  exit_code: number;
  timed_out: boolean;
}

interface Entry {
  name: string;
  size: number;
  type: string;
  mod_time: number;
}

/** quote(path, safe=''), as the SDK encodes a path argument. */
const q = (path: string): string => encodeURIComponent(path);

test('the python-runtime API on port 8888 through Envoy: execute (output, exit code, timeout), upload/download bytes, list, exists, one base directory, paths stay in it, other teams 404; an image serving 8888 itself is passed through', async (t) => {
  const system = await startTestSystem('pyrt', 163, 'local', 0, false, ['pyrt-team-a', 'pyrt-team-b']);
  t.after(() => system.cleanup());
  const keyA = system.teamKeys['pyrt-team-a'] ?? '';
  const keyB = system.teamKeys['pyrt-team-b'] ?? '';
  const applied = await api(system, 'POST', '/v1/apply', { objects: [template('plain'), template('based', [{ name: 'SANDBOX_BASE_DIR', value: '/tmp/work' }]), OWN_TEMPLATE] });
  assert.equal(applied.status, 200, JSON.stringify(applied.body));
  const create = async (name: string): Promise<string> => {
    const created = await api<{ id: string }>(system, 'POST', '/v1/sandboxes', { template: name }, keyA);
    assert.equal(created.status, 201, JSON.stringify(created.body));
    return created.body.id;
  };
  const id = await create('plain');

  const call = async (path: string, init: { method?: string; body?: string | FormData; json?: unknown; key?: string; sandbox?: string } = {}): Promise<Response> => {
    const headers: Record<string, string> = { 'x-sandbox-id': init.sandbox ?? id, 'x-sandbox-namespace': 'default', 'x-sandbox-timeout': '60', 'x-api-key': init.key ?? keyA };
    let body = init.body;
    if (init.json !== undefined) {
      headers['content-type'] = 'application/json';
      body = JSON.stringify(init.json);
    }
    return fetch(`${system.edgeUrl}${path}`, { method: init.method ?? (body === undefined ? 'GET' : 'POST'), headers, ...(body === undefined ? {} : { body }) });
  };
  const run = async (command: string, extra: Record<string, unknown> = {}, sandbox?: string): Promise<Execute> => {
    const res = await call('/execute', { json: { command, ...extra }, ...(sandbox === undefined ? {} : { sandbox }) });
    const text = await res.text();
    assert.equal(res.status, 200, text);
    assert.match(res.headers.get('content-type') ?? '', /^application\/json/);
    return JSON.parse(text) as Execute;
  };
  const upload = async (filename: string, bytes: Uint8Array, sandbox?: string): Promise<Response> => {
    const form = new FormData();
    form.append('file', new Blob([bytes]), filename);
    return call('/upload', { body: form, ...(sandbox === undefined ? {} : { sandbox }) });
  };

  const health = await call('/');
  assert.deepEqual([health.status, await health.json()], [200, { status: 'ok', message: 'Sandbox Runtime is active.' }]);

  // /execute: stdout, stderr and the exit code, as a shell command line.
  assert.deepEqual(await run('echo hello from asb; echo oops >&2; exit 3'), { stdout: 'hello from asb\n', stderr: 'oops\n', exit_code: 3, timed_out: false });
  assert.deepEqual(await run("sh -c 'exit 3'"), { stdout: '', stderr: '', exit_code: 3, timed_out: false });
  // The base directory is the pod user's home, and commands start there.
  const home = (await run('printf %s "$HOME"')).stdout;
  assert.ok(home.startsWith('/'), home);
  assert.equal((await run('pwd')).stdout, `${home}\n`);

  // A timeout: the command is killed, exit code 124, timed_out, well before it would have ended.
  const started = Date.now();
  const slow = await run('echo started; sleep 30; echo never', { timeout_seconds: 1 });
  assert.deepEqual([slow.exit_code, slow.timed_out, slow.stdout], [124, true, 'started\n']);
  assert.ok(Date.now() - started < 20_000, `the command ran ${Date.now() - started} ms`);

  // /upload then /download: every byte value round-trips.
  const bytes = Buffer.concat([Buffer.from(Array.from({ length: 256 }, (_, i) => i)), randomBytes(300 * 1024)]);
  const up = await upload('dir/bin.dat', bytes);
  assert.deepEqual([up.status, await up.json()], [200, { message: "File 'dir/bin.dat' uploaded successfully." }]);
  const down = await call(`/download/${q('dir/bin.dat')}`);
  assert.equal(down.status, 200);
  assert.equal(down.headers.get('content-type'), 'application/octet-stream');
  assert.equal(down.headers.get('content-length'), String(bytes.length));
  assert.ok(Buffer.from(await down.arrayBuffer()).equals(bytes), 'the downloaded bytes are the uploaded ones');
  // Exec and files share the base directory: the command sees the uploaded file by the same relative path.
  assert.equal((await run('wc -c < dir/bin.dat')).stdout.trim(), String(bytes.length));
  const small = await upload('/dir/note.txt', Buffer.from('kept'));
  assert.equal(small.status, 200, 'a leading / is from the base directory, as upstream strips it');
  assert.equal((await run('cat dir/note.txt')).stdout, 'kept');

  // /list and /exists see the file.
  const listed = await call(`/list/${q('dir')}`);
  assert.equal(listed.status, 200);
  const entries = await listed.json() as Entry[];
  assert.deepEqual(entries.map((e) => [e.name, e.size, e.type]).sort(), [['bin.dat', bytes.length, 'file'], ['note.txt', 4, 'file']]);
  assert.ok(entries.every((e) => typeof e.mod_time === 'number' && Math.abs(e.mod_time - Date.now() / 1000) < 600), JSON.stringify(entries));
  const root = await (await call('/list/')).json() as Entry[];
  assert.deepEqual(root.filter((e) => e.name === 'dir').map((e) => e.type), ['directory'], 'list(".") arrives as /list/: the base directory');
  assert.deepEqual(await (await call(`/exists/${q('dir/bin.dat')}`)).json(), { path: 'dir/bin.dat', exists: true });
  assert.deepEqual(await (await call(`/exists/${q('dir')}`)).json(), { path: 'dir', exists: true });
  assert.deepEqual(await (await call(`/exists/${q('nope.txt')}`)).json(), { path: 'nope.txt', exists: false });

  // Not found: a missing file and a directory are 404 for /download, a file is 404 for /list.
  const missing = await call(`/download/${q('missing.txt')}`);
  assert.equal(missing.status, 404);
  assert.equal(((await missing.json()) as { message: string }).message, 'File not found');
  assert.equal((await call(`/download/${q('dir')}`)).status, 404);
  const notDir = await call(`/list/${q('dir/bin.dat')}`);
  assert.equal(notDir.status, 404);
  assert.equal(((await notDir.json()) as { message: string }).message, 'Path is not a directory');

  // Paths with .. stay in the base directory: 403, nothing read or written outside it.
  assert.equal((await run('echo secret > /tmp/outside.txt && echo ok')).stdout, 'ok\n');
  const toRoot = '../'.repeat(home.split('/').length - 1); // from the home to the sandbox's /
  for (const path of ['../outside.txt', `${toRoot}tmp/outside.txt`, `/${toRoot}tmp/outside.txt`, `dir/../${toRoot}tmp/outside.txt`]) {
    const read = await call(`/download/${q(path)}`);
    assert.equal(read.status, 403, path);
    assert.match(((await read.json()) as { message: string }).message, /^Access denied/);
    assert.equal((await call(`/exists/${q(path)}`)).status, 403, path);
    assert.equal((await call(`/list/${q(path.replace(/outside\.txt$/, ''))}`)).status, 403, path);
  }
  const escape = await upload('../escaped.txt', Buffer.from('no'));
  assert.equal(escape.status, 403, await escape.text());
  assert.equal((await upload(`${toRoot}tmp/escaped.txt`, Buffer.from('no'))).status, 403);
  assert.equal((await run('ls /tmp/escaped.txt 2>/dev/null | wc -l')).stdout.trim(), '0', 'no file was written outside the base');
  // An absolute path is from the base, never the sandbox's root.
  assert.equal((await call(`/download/${q('/tmp/outside.txt')}`)).status, 404);

  // Another team's key: 404 as for an unknown sandbox, and nothing ran.
  for (const [path, init] of [['/execute', { json: { command: 'touch by-b' } }], [`/download/${q('dir/bin.dat')}`, {}], [`/list/`, {}], [`/exists/${q('dir')}`, {}]] as const) {
    const res = await call(path, { ...init, key: keyB });
    assert.equal(res.status, 404, `${path}: ${await res.text()}`);
  }
  const b = new FormData();
  b.append('file', new Blob(['b']), 'by-b-upload');
  assert.equal((await call('/upload', { body: b, key: keyB })).status, 404);
  assert.deepEqual(await (await call(`/exists/${q('by-b')}`)).json(), { path: 'by-b', exists: false });
  assert.deepEqual(await (await call(`/exists/${q('by-b-upload')}`)).json(), { path: 'by-b-upload', exists: false });

  // Bad input: 4xx naming what is wrong.
  const noCommand = await call('/execute', { json: { cmd: 'true' } });
  assert.equal(noCommand.status, 422);
  assert.match(await noCommand.text(), /command/);
  assert.equal((await call('/execute', { body: '{not json', method: 'POST' })).status, 400);
  const notMultipart = await call('/upload', { json: { file: 'x' } });
  assert.equal(notMultipart.status, 422);
  assert.equal((await call('/execute')).status, 405);
  assert.equal((await call('/agent', { json: { query: 'x' } })).status, 404);

  // SANDBOX_BASE_DIR in the main container: exec and files share that directory instead.
  const based = await create('based');
  assert.equal((await upload('a.txt', Buffer.from('in work'), based)).status, 200);
  assert.deepEqual(await run('pwd; cat a.txt', {}, based), { stdout: '/tmp/work\nin work', stderr: '', exit_code: 0, timed_out: false });

  // asb.dev/python-runtime: pod: the image's own server answers, the worker only passes it through.
  const own = await create('own');
  assert.deepEqual(await run('true', {}, own), { stdout: 'from the pod /execute', stderr: '', exit_code: 0 });
});
