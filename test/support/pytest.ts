// Runs a pytest file of test/python/ with the project venv's Python (`make test` installs the
// SDKs and pytest there) and reads its summary line, for the tests that drive unmodified Python
// SDKs: a test pytest skipped or never collected then fails in node:test instead of passing.
import { spawn } from 'node:child_process';
import { join, resolve } from 'node:path';

export const REPO_ROOT = resolve(import.meta.dirname, '../..');
export const VENV_PYTHON = join(REPO_ROOT, '.venv', 'bin', 'python');

export interface PytestRun {
  code: number | null;
  signal: NodeJS.Signals | null;
  output: string;
}

/** pytest on `file` (relative to the repo) with `env`; killed after timeoutMs. */
export function runPytest(file: string, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<PytestRun> {
  return new Promise((res, rej) => {
    // -p no:cacheprovider and PYTHONDONTWRITEBYTECODE: nothing is written into the checkout.
    const child = spawn(VENV_PYTHON, ['-m', 'pytest', '-q', '-s', '--tb=short', '-p', 'no:cacheprovider', file], {
      cwd: REPO_ROOT,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: timeoutMs,
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
export function outcomes(output: string): Record<string, number> {
  const summary = output.trim().split('\n').at(-1) ?? '';
  const counts: Record<string, number> = {};
  for (const m of summary.matchAll(/(\d+) ([a-z]+)/g)) {
    const word = m[2] ?? '';
    if (!word.startsWith('warning')) counts[word] = Number(m[1]);
  }
  return counts;
}
