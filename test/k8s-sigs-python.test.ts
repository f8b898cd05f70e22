// kubernetes-sigs' own Python SDK (`k8s-agent-sandbox` 1.0.8 from PyPI, unmodified) end to end,
// in Direct mode: a worker with real sandboxes and a warm pool, the router and a real Envoy; the
// SDK makes its claims through the worker's Kubernetes API with the kubeconfig `make up` writes
// (over the edge's HTTPS listener), and its data plane (the python-runtime API on port 8888, by
// X-Sandbox-ID with the API key in extra_headers) goes through the edge's plain HTTP listener to
// the owning worker. The scenarios are pytest tests (test/python/test_k8s_sigs_sdk.py) run with
// the project venv's Python (`make test` installs the SDK and pytest there); this file starts the
// system, runs pytest once and reads its summary, so a skipped or uncollected test fails here.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { writeKubeconfig } from '../src/system/kubeconfig.ts';
import { startTestSystem } from './support/local-system.ts';
import { outcomes, REPO_ROOT, runPytest, VENV_PYTHON } from './support/pytest.ts';

const suite = join('test', 'python', 'test_k8s_sigs_sdk.py');
/** The run takes ~15 s (two claims, a 1 s command timeout, a 1 MiB upload); past this pytest is killed. */
const PYTEST_TIMEOUT_MS = 180_000;

test('k8s-agent-sandbox 1.0.8 in Direct mode: create from a warm pool, commands.run (output, exit code, timeout), files write/read/list/exists, terminate, the missing-pool error', async (t) => {
  assert.ok(existsSync(VENV_PYTHON), `${VENV_PYTHON} is missing: make test installs k8s-agent-sandbox and pytest into .venv`);
  const defined = [...readFileSync(join(REPO_ROOT, suite), 'utf8').matchAll(/^def test_/gm)].length;
  assert.ok(defined >= 7, `${suite} defines ${String(defined)} tests`);

  const system = await startTestSystem('k8py', 164, 'local', 1, true);
  t.after(() => system.cleanup());
  assert.ok(system.edgeTlsUrl !== undefined && system.caCertPath !== undefined);
  const dir = mkdtempSync(join(tmpdir(), 'asb-k8spy-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const kubeconfig = join(dir, 'kubeconfig');
  writeKubeconfig(kubeconfig, [{ name: 'local', server: system.edgeTlsUrl }], system.caCertPath, system.adminKey);

  const run = await runPytest(suite, { PATH: process.env.PATH, HOME: dir, PYTHONDONTWRITEBYTECODE: '1', KUBECONFIG: kubeconfig, ASB_API_KEY: system.adminKey, ASB_EDGE_URL: system.edgeUrl, POOL: 'base' }, PYTEST_TIMEOUT_MS);
  const failure = `pytest exited ${String(run.code)}:\n${run.output}`;
  assert.equal(run.code, 0, failure);
  assert.deepEqual(outcomes(run.output), { passed: defined }, failure);
});
