// One run of test/python/test_k8s_sigs_sdk.py (kubernetes-sigs' `k8s-agent-sandbox` 1.0.8 from
// PyPI, unmodified, in Direct mode), the same scenarios for every tier that runs it: the embedded
// system behind `make up`'s kubeconfig (test/k8s-sigs-python.test.ts) and our operator on a real
// kube-apiserver (test/k8s/k8s-sigs-python.test.ts). pytest's summary is read, so a test it
// skipped or never collected fails here.
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { outcomes, REPO_ROOT, runPytest, VENV_PYTHON } from './pytest.ts';

export const SDK_SUITE = join('test', 'python', 'test_k8s_sigs_sdk.py');
/** The run takes ~15-40 s (two claims, a 1 s command timeout, a 1 MiB upload); past this pytest is killed. */
const PYTEST_TIMEOUT_MS = 180_000;
/** The scenarios of the issue: create, output, exit code, timeout, files, 404, terminate, missing pool. */
const MIN_TESTS = 7;

export interface SdkTarget {
  /** The Kubernetes API the SDK makes its claims through. */
  kubeconfig: string;
  /** The key in Direct mode's extra_headers: the data plane's credential. */
  apiKey: string;
  /** The edge's plain HTTP address: Direct mode's api_url. */
  edgeUrl: string;
  /** A warm pool in namespace default. */
  pool: string;
  /** A scratch HOME for the run (kubernetes' client may write there). */
  home: string;
}

/** Runs every scenario once against `target`; fails naming pytest's output unless all passed. */
export async function runSdkSuite(target: SdkTarget): Promise<void> {
  assert.ok(existsSync(VENV_PYTHON), `${VENV_PYTHON} is missing: make test installs k8s-agent-sandbox and pytest into .venv`);
  const defined = [...readFileSync(join(REPO_ROOT, SDK_SUITE), 'utf8').matchAll(/^def test_/gm)].length;
  assert.ok(defined >= MIN_TESTS, `${SDK_SUITE} defines ${String(defined)} tests`);
  const env = { PATH: process.env.PATH, HOME: target.home, PYTHONDONTWRITEBYTECODE: '1', KUBECONFIG: target.kubeconfig, ASB_API_KEY: target.apiKey, ASB_EDGE_URL: target.edgeUrl, POOL: target.pool };
  const run = await runPytest(SDK_SUITE, env, PYTEST_TIMEOUT_MS);
  const failure = `pytest exited ${String(run.code ?? run.signal)}:\n${run.output}`;
  assert.equal(run.code, 0, failure);
  assert.deepEqual(outcomes(run.output), { passed: defined }, failure);
}
