// The unmodified `e2b` Python SDK from PyPI end to end through the real data plane: a worker with
// real sandboxes, the router and a real Envoy, reached both ways research e2b.md describes:
// Recipe A (E2B_API_URL and E2B_SANDBOX_URL both the edge's address; test/python/test_e2b_sdk.py)
// and Recipe B (only E2B_DOMAIN, host routing over the edge's HTTPS listener with a test CA;
// test/python/test_e2b_https.py). The scenarios are pytest tests, run with the project venv's Python (`make test` installs e2b and
// pytest there); this file starts the system, runs pytest once and reads its summary line, so a
// test that pytest skipped or never collected fails here instead of passing quietly.
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { startTestSystem } from './support/local-system.ts';
import { outcomes, REPO_ROOT, runPytest, VENV_PYTHON } from './support/pytest.ts';
import { waitFor } from './support/wait.ts';

const suite = join('test', 'python', 'test_e2b_sdk.py');
const httpsSuite = join('test', 'python', 'test_e2b_https.py');
/** The run takes ~30 s (cold sandboxes for the list test, a pause and a resume); past this pytest is killed. */
const PYTEST_TIMEOUT_MS = 240_000;

test('the E2B Python SDK through Envoy and the router: every pytest scenario passes, none skipped', async (t) => {
  assert.ok(existsSync(VENV_PYTHON), `${VENV_PYTHON} is missing: make test installs e2b and pytest into .venv`);
  const defined = [...readFileSync(join(REPO_ROOT, suite), 'utf8').matchAll(/^def test_/gm)].length;
  assert.ok(defined >= 12, `${suite} defines ${String(defined)} tests`);

  const system = await startTestSystem('e2bq', 21, 'local', 2, true);
  t.after(() => system.cleanup());
  const base = { PATH: process.env.PATH, HOME: process.env.HOME, PYTHONDONTWRITEBYTECODE: '1', E2B_API_KEY: system.adminKey };

  await t.test('header routing over plain HTTP (E2B_API_URL and E2B_SANDBOX_URL at the edge)', async () => {
    const run = await runPytest(suite, { ...base, E2B_API_URL: system.edgeUrl, E2B_SANDBOX_URL: system.edgeUrl, E2B_DOMAIN: `asb.localhost:${new URL(system.edgeUrl).port}` }, PYTEST_TIMEOUT_MS);
    const failure = `pytest exited ${String(run.code)}${run.signal === null ? '' : ` (${run.signal})`}:\n${run.output}`;
    assert.equal(run.code, 0, failure);
    assert.deepEqual(outcomes(run.output), { passed: defined }, failure);
  });

  await t.test('host routing over TLS with a test CA (only E2B_DOMAIN set)', async () => {
    const tlsPort = new URL(system.edgeTlsUrl ?? '').port;
    const run = await runPytest(httpsSuite, { ...base, E2B_DOMAIN: `asb.localhost:${tlsPort}`, SSL_CERT_FILE: system.caCertPath }, PYTEST_TIMEOUT_MS);
    const failure = `pytest exited ${String(run.code)}${run.signal === null ? '' : ` (${run.signal})`}:\n${run.output}`;
    assert.equal(run.code, 0, failure);
    assert.deepEqual(outcomes(run.output), { passed: 1 }, failure);
    const id = /SANDBOX_ID=([a-z0-9]+)/.exec(run.output)?.[1] ?? '';
    // Envoy saw the calls by host, over TLS: the API at api.<domain>, envd at 49983-<id>.<domain>.
    const log = await waitFor('the host-routed envd calls in the access log', () => {
      const lines = readFileSync(system.envoy.accessLogPath, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { authority: string; path: string; status: number });
      return Promise.resolve(lines.some((l) => l.path === `/sandboxes/${id}`) ? lines : undefined);
    }, 10_000);
    assert.ok(log.some((l) => l.authority === `api.asb.localhost:${tlsPort}` && l.status === 201), 'create at api.<domain>');
    assert.ok(log.some((l) => l.authority === `49983-${id}.asb.localhost:${tlsPort}` && l.path === '/process.Process/Start' && l.status === 200), 'commands.run by host');
  });
});
