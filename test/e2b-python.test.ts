// The unmodified `e2b` Python SDK from PyPI end to end through the real data plane: a worker with
// real sandboxes, the router and a real Envoy, reached the way research e2b.md calls Recipe A
// (E2B_API_URL and E2B_SANDBOX_URL both the edge's address). The scenarios are pytest tests in
// test/python/test_e2b_sdk.py, run with the project venv's Python (`make test` installs e2b and
// pytest there); this file starts the system, runs pytest once and reads its summary line, so a
// test that pytest skipped or never collected fails here instead of passing quietly.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { startTestSystem } from './support/local-system.ts';

const repoRoot = resolve(import.meta.dirname, '..');
const python = join(repoRoot, '.venv', 'bin', 'python');
const suite = join('test', 'python', 'test_e2b_sdk.py');
/** The run takes ~30 s (cold sandboxes for the list test, a pause and a resume); past this pytest is killed. */
const PYTEST_TIMEOUT_MS = 240_000;

interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  output: string;
}

function runPytest(env: NodeJS.ProcessEnv): Promise<Run> {
  return new Promise((res, rej) => {
    // -p no:cacheprovider and PYTHONDONTWRITEBYTECODE: nothing is written into the checkout.
    const child = spawn(python, ['-m', 'pytest', '-q', '--tb=short', '-p', 'no:cacheprovider', suite], {
      cwd: repoRoot,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: PYTEST_TIMEOUT_MS,
      killSignal: 'SIGKILL',
    });
    let output = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => { output += d; });
    child.stderr.setEncoding('utf8').on('data', (d: string) => { output += d; });
    child.once('error', rej);
    child.once('close', (code, signal) => { res({ code, signal, output }); });
  });
}

/** The outcome counts of pytest's summary line ("12 passed, 1 skipped, 2 warnings in 20.1s"), warnings left out. */
function outcomes(output: string): Record<string, number> {
  const summary = output.trim().split('\n').at(-1) ?? '';
  const counts: Record<string, number> = {};
  for (const m of summary.matchAll(/(\d+) ([a-z]+)/g)) {
    const word = m[2] ?? '';
    if (!word.startsWith('warning')) counts[word] = Number(m[1]);
  }
  return counts;
}

test('the E2B Python SDK through Envoy and the router: every pytest scenario passes, none skipped', async (t) => {
  assert.ok(existsSync(python), `${python} is missing: make test installs e2b and pytest into .venv`);
  const defined = [...readFileSync(join(repoRoot, suite), 'utf8').matchAll(/^def test_/gm)].length;
  assert.ok(defined >= 12, `${suite} defines ${String(defined)} tests`);

  const system = await startTestSystem('e2bq', 240, 'local', 2);
  t.after(() => system.cleanup());
  const run = await runPytest({
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    PYTHONDONTWRITEBYTECODE: '1',
    E2B_API_KEY: system.adminKey,
    E2B_API_URL: system.edgeUrl,
    E2B_SANDBOX_URL: system.edgeUrl,
    E2B_DOMAIN: `asb.localhost:${new URL(system.edgeUrl).port}`,
  });
  const failure = `pytest exited ${String(run.code)}${run.signal === null ? '' : ` (${run.signal})`}:\n${run.output}`;
  assert.equal(run.code, 0, failure);
  assert.deepEqual(outcomes(run.output), { passed: defined }, failure);
});
