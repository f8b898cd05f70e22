// Pause with memory end to end with the unmodified E2B SDKs through the real data plane: a worker
// with real gVisor and runc sandboxes, the router and a real Envoy (bridge asbpmem, 10.204.0.0/16).
// The Python scenarios (test/python/test_e2b_pause.py) run under pytest once; this file counts
// them so one that pytest skipped or never collected fails here. The JS SDK's pause({keepMemory})
// and connect are checked here directly.
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import * as e2b from 'e2b';
import { baseTemplate } from '../src/api/builtin.ts';
import type { SandboxTemplate } from '../src/api/types.ts';
import { startTestSystem } from './support/local-system.ts';
import { outcomes, REPO_ROOT, runPytest, VENV_PYTHON } from './support/pytest.ts';
import { edgeGet } from './support/web-sandbox.ts';
import { api } from './support/worker-process.ts';
import { waitForFile } from './support/e2b-wait.ts';

const suite = join('test', 'python', 'test_e2b_pause.py');
const PYTEST_TIMEOUT_MS = 280_000;

/** The built-in `base` template, on gVisor (which can keep memory) or runc (which cannot yet). */
function template(name: string, gvisor: boolean): SandboxTemplate {
  const t = baseTemplate();
  t.metadata.name = name;
  if (gvisor) t.spec.podTemplate.spec.runtimeClassName = 'gvisor';
  return t;
}

test('pause with memory through the E2B SDKs: gVisor keeps a background server\'s memory, runc says it cannot', async (t) => {
  assert.ok(existsSync(VENV_PYTHON), `${VENV_PYTHON} is missing: make test installs e2b and pytest into .venv`);
  const defined = [...readFileSync(join(REPO_ROOT, suite), 'utf8').matchAll(/^def test_/gm)].length;
  assert.ok(defined >= 5, `${suite} defines ${String(defined)} tests`);
  const system = await startTestSystem('pmem', 204);
  t.after(() => system.cleanup());
  const applied = await api(system, 'POST', '/v1/apply', { objects: [template('gvmem', true), template('runcmem', false)] });
  assert.equal(applied.status, 200, JSON.stringify(applied.body));

  await t.test('the JS SDK: pause({keepMemory: true}) then connect keeps a shell variable\'s process; keepMemory false drops it', async () => {
    const opts = { apiUrl: system.edgeUrl, sandboxUrl: system.edgeUrl, apiKey: system.adminKey };
    const sbx = await e2b.Sandbox.create('gvmem', { ...opts, timeoutMs: 600_000 });
    t.after(() => e2b.Sandbox.kill(sbx.sandboxId, opts).catch(() => false));
    // A process whose only state is in memory: it prints what it was started with, every read.
    const bg = await sbx.commands.run('secret=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d " \\n"); echo "$secret" > /tmp/first; while true; do echo "$secret" > /tmp/now; sleep 0.2; done', { background: true });
    assert.ok(bg.pid > 0);
    const first = await waitForFile(sbx, '/tmp/first');
    assert.equal(await sbx.pause({ keepMemory: true }), true);
    assert.equal((await e2b.Sandbox.getInfo(sbx.sandboxId, opts)).state, 'paused');
    const again = await e2b.Sandbox.connect(sbx.sandboxId, opts);
    await again.files.remove('/tmp/now');
    assert.equal(await waitForFile(again, '/tmp/now'), first, 'the loop runs on with the secret it held in memory');

    assert.equal(await again.pause({ keepMemory: false }), true);
    const cold = await e2b.Sandbox.connect(sbx.sandboxId, opts);
    await cold.files.remove('/tmp/now');
    const after = await cold.commands.run('sleep 1; cat /tmp/now 2>/dev/null || echo none');
    assert.equal(after.stdout.trim(), 'none', 'a filesystem pause ended the loop');
  });

  await t.test('traffic does not resume a sandbox paused without auto_resume (E2B answers 502); connect does', async () => {
    const opts = { apiUrl: system.edgeUrl, sandboxUrl: system.edgeUrl, apiKey: system.adminKey };
    const sbx = await e2b.Sandbox.create('runcmem', { ...opts, timeoutMs: 600_000 });
    t.after(() => e2b.Sandbox.kill(sbx.sandboxId, opts).catch(() => false));
    await sbx.files.write('/tmp/kept', 'files stay');
    assert.equal(await sbx.pause(), true);
    // envd's /health through the edge: the SDK reads E2B's 502 as "not running".
    assert.equal(await sbx.isRunning(), false);
    await assert.rejects(sbx.files.read('/tmp/kept'), (err: Error) => /not running|timeout|not found/i.test(err.message), 'a files call to a paused sandbox fails as on E2B');
    // A user port too: E2B's body, and the sandbox stays paused.
    const res = await edgeGet(system.edgeUrl, `8080-${sbx.sandboxId}.asb.localhost`, { headers: { 'x-access-token': await accessToken(system.edgeUrl, system.adminKey, sbx.sandboxId) } });
    assert.equal(res.status, 502, res.body);
    assert.equal((JSON.parse(res.body) as { sandboxId?: string }).sandboxId, sbx.sandboxId);
    assert.equal((await e2b.Sandbox.getInfo(sbx.sandboxId, opts)).state, 'paused', 'traffic did not resume it');
    const again = await e2b.Sandbox.connect(sbx.sandboxId, opts);
    assert.equal(await again.isRunning(), true);
    assert.equal(await again.files.read('/tmp/kept'), 'files stay');
  });

  await t.test('the Python SDK scenarios', async () => {
    const run = await runPytest(suite, {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      PYTHONDONTWRITEBYTECODE: '1',
      E2B_API_KEY: system.adminKey,
      E2B_API_URL: system.edgeUrl,
      E2B_SANDBOX_URL: system.edgeUrl,
      E2B_DOMAIN: `asb.localhost:${new URL(system.edgeUrl).port}`,
      E2B_GVISOR_TEMPLATE: 'gvmem',
      E2B_RUNC_TEMPLATE: 'runcmem',
    }, PYTEST_TIMEOUT_MS);
    const failure = `pytest exited ${String(run.code)}${run.signal === null ? '' : ` (${run.signal})`}:\n${run.output}`;
    assert.equal(run.code, 0, failure);
    assert.deepEqual(outcomes(run.output), { passed: defined }, failure);
  });
});


/** The sandbox's data-plane token, as E2B's API gives it (GET /sandboxes/{id}'s envdAccessToken). */
async function accessToken(edgeUrl: string, apiKey: string, id: string): Promise<string> {
  const res = await fetch(`${edgeUrl}/sandboxes/${id}`, { headers: { 'X-API-Key': apiKey } });
  assert.equal(res.status, 200, await res.clone().text());
  const token = ((await res.json()) as { envdAccessToken?: string }).envdAccessToken;
  assert.ok(token !== undefined && token !== '', 'getInfo gives the envd access token');
  return token;
}
