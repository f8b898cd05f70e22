// Runs the asb CLI as a user runs it: a child process with only the environment a test gives
// (plus PATH) and an empty state directory, so a developer's .asb/env never leaks in.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const ASB = join(import.meta.dirname, '..', '..', 'src', 'cli', 'asb.ts');

export interface RunResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

export interface RunOptions {
  env?: Record<string, string>;
  /** Default: an empty temporary directory. */
  cwd?: string;
  /** Written to stdin, which is then closed. */
  input?: string;
}

const dirs: string[] = [];
process.once('exit', () => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** A temporary directory removed when the test process exits. */
export function emptyDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'asb-cli-'));
  dirs.push(dir);
  return dir;
}

export function runAsb(args: string[], opts: RunOptions = {}): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [ASB, ...args], {
      cwd: opts.cwd ?? emptyDir(),
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ASB_STATE_DIR: emptyDir(), ...opts.env },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
    child.stdin.end(opts.input ?? '');
  });
}
