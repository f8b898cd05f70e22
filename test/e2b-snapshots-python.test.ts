// The unmodified `e2b` Python SDK's snapshots and fork (test/python/test_e2b_snapshots.py) against
// the whole local system through Envoy, with a gVisor template whose server keeps a counter in
// memory. This file starts the system, runs pytest once and reads its summary, so a skipped or
// uncollected scenario fails here. Its own system (tag e2bs, subnet 10.247.0.0/16).
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { baseTemplate } from '../src/api/builtin.ts';
import { startTestSystem } from './support/local-system.ts';
import { outcomes, REPO_ROOT, runPytest, VENV_PYTHON } from './support/pytest.ts';
import { api } from './support/worker-process.ts';

const suite = join('test', 'python', 'test_e2b_snapshots.py');
const COUNTER = 'import http.server, os\ntoken = os.urandom(8).hex()\nn = 0\nclass H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        global n\n        n += 1\n        b = f"{token} {n}".encode()\n        self.send_response(200)\n        self.send_header("Content-Length", str(len(b)))\n        self.end_headers()\n        self.wfile.write(b)\n    def log_message(self, *a):\n        pass\nhttp.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()';

test('the E2B Python SDK: create_snapshot, list_snapshots, Sandbox.create(snapshot), delete_snapshot and fork(count=3) keep memory and processes', async (t) => {
  assert.ok(existsSync(VENV_PYTHON), `${VENV_PYTHON} is missing: make test installs e2b and pytest into .venv`);
  const defined = [...readFileSync(join(REPO_ROOT, suite), 'utf8').matchAll(/^def test_/gm)].length;
  const system = await startTestSystem('e2bs', 247);
  t.after(() => system.cleanup());
  const template = baseTemplate();
  template.metadata.name = 'gvcount';
  const main = template.spec.podTemplate.spec.containers[0];
  assert.ok(main !== undefined);
  main.command = ['python3', '-c', COUNTER];
  main.readinessProbe = { tcpSocket: { port: 8080 }, periodSeconds: 1 };
  template.spec.podTemplate.spec.runtimeClassName = 'gvisor';
  const applied = await api(system, 'POST', '/v1/apply', { objects: [template] });
  assert.equal(applied.status, 200, JSON.stringify(applied.body));
  const env = { PATH: process.env.PATH, HOME: process.env.HOME, PYTHONDONTWRITEBYTECODE: '1', E2B_API_KEY: system.adminKey, E2B_API_URL: system.edgeUrl, E2B_SANDBOX_URL: system.edgeUrl, E2B_DOMAIN: `asb.localhost:${new URL(system.edgeUrl).port}`, SNAP_TEMPLATE: 'gvcount' };
  const run = await runPytest(suite, env, 240_000);
  const failure = `pytest exited ${String(run.code)}${run.signal === null ? '' : ` (${run.signal})`}:\n${run.output}`;
  assert.equal(run.code, 0, failure);
  assert.deepEqual(outcomes(run.output), { passed: defined }, failure);
});
