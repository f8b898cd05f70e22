// The unmodified `e2b` SDKs' snapshots and fork against the whole local system through Envoy, with
// a gVisor template whose server keeps a counter in memory: the Python SDK's scenarios
// (test/python/test_e2b_snapshots.py; pytest runs once and its summary is read, so a skipped or
// uncollected scenario fails here), then the JS SDK's. Its own system (tag e2bn, subnet 10.247.0.0/16).
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { baseTemplate } from '../src/api/builtin.ts';
import { startTestSystem } from './support/local-system.ts';
import { outcomes, REPO_ROOT, runPytest, VENV_PYTHON } from './support/pytest.ts';
import * as e2b from 'e2b';
import { api } from './support/worker-process.ts';
import { counterApp } from './support/counter-app.ts';

const suite = join('test', 'python', 'test_e2b_snapshots.py');
const COUNTER = counterApp(8080);

test('the E2B Python SDK: create_snapshot, list_snapshots, Sandbox.create(snapshot), delete_snapshot and fork(count=3) keep memory and processes', async (t) => {
  assert.ok(existsSync(VENV_PYTHON), `${VENV_PYTHON} is missing: make test installs e2b and pytest into .venv`);
  const defined = [...readFileSync(join(REPO_ROOT, suite), 'utf8').matchAll(/^def test_/gm)].length;
  const system = await startTestSystem('e2bn', 247);
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
  await t.test('the Python SDK', async () => {
    const run = await runPytest(suite, env, 240_000);
    const failure = `pytest exited ${String(run.code)}${run.signal === null ? '' : ` (${run.signal})`}:\n${run.output}`;
    assert.equal(run.code, 0, failure);
    assert.deepEqual(outcomes(run.output), { passed: defined }, failure);
  });

  await t.test('the JS SDK: createSnapshot, listSnapshots, Sandbox.create(snapshotId), fork and deleteSnapshot', async () => {
    const { Sandbox } = e2b;
    const opts = { apiUrl: system.edgeUrl, sandboxUrl: system.edgeUrl, apiKey: system.adminKey };
    const count = async (s: e2b.Sandbox): Promise<string> => (await s.commands.run('python3 -c "import urllib.request; print(urllib.request.urlopen(\'http://127.0.0.1:8080/\').read().decode())"')).stdout.trim();
    const sbx = await Sandbox.create('gvcount', opts);
    try {
      const [token] = (await count(sbx)).split(' ');
      const info = await sbx.createSnapshot({ name: 'js-snap' });
      assert.deepEqual(info.names, ['js-snap']);
      const listed = await Sandbox.listSnapshots({ ...opts, sandboxId: sbx.sandboxId }).nextItems();
      assert.deepEqual(listed.map((s) => s.snapshotId), [info.snapshotId]);
      const copy = await Sandbox.create(info.snapshotId, opts);
      assert.equal(await count(copy), `${token ?? ''} 2`);
      await copy.kill();
      const forks = await sbx.fork({ count: 2 });
      assert.equal(forks.length, 2);
      for (const fork of forks) {
        assert.ok(fork instanceof Sandbox, `a fork failed: ${fork instanceof Error ? fork.message : 'not a sandbox'}`);
        // The source's own count was 1: the copy's GET was the copy's.
        assert.equal(await count(fork), `${token ?? ''} 2`);
        await fork.kill();
      }
      assert.equal(await Sandbox.deleteSnapshot(info.snapshotId, opts), true);
      assert.equal(await Sandbox.deleteSnapshot(info.snapshotId, opts), false);
    } finally {
      await sbx.kill();
    }
  });
});
