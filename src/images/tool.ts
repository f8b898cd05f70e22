// Runs one of the image tools (skopeo, umoci) to completion with a deadline: absolute path, a
// fixed environment, output captured up to a cap, SIGKILL at the deadline. Nothing that
// pulls or unpacks may hang a sandbox start.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { AsbError } from '../errors.ts';
import { systemClock, type Clock } from '../base/clock.ts';

export const SKOPEO = '/usr/bin/skopeo';
export const UMOCI = '/usr/bin/umoci';

export interface ToolResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
}

// Error output is a few lines; a runaway tool must not grow our heap.
const OUTPUT_CAP = 64 * 1024;

export interface RunToolOptions {
  timeoutMs: number;
  clock?: Clock;
  /** Extra environment (HOME, TMPDIR…); PATH is always the system's. */
  env?: Record<string, string>;
}

export async function runTool(binary: string, args: readonly string[], opts: RunToolOptions): Promise<ToolResult> {
  if (!existsSync(binary)) throw new AsbError('Unavailable', `${binary} is missing: install Debian's ${binary.slice(binary.lastIndexOf('/') + 1)} package (make test and make up do, through scripts/bootstrap.sh)`);
  const clock = opts.clock ?? systemClock;
  const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin', ...opts.env } });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (s: string) => {
    if (stdout.length < OUTPUT_CAP) stdout += s;
  });
  child.stderr.setEncoding('utf8').on('data', (s: string) => {
    if (stderr.length < OUTPUT_CAP) stderr += s;
  });
  let timedOut = false;
  const timer = clock.after(opts.timeoutMs, () => {
    timedOut = true;
    child.kill('SIGKILL');
  });
  try {
    return await new Promise<ToolResult>((resolve, reject) => {
      child.once('error', (err) => {
        reject(new AsbError('Unavailable', `${binary} could not be started: ${err.message}`, { cause: err }));
      });
      child.once('close', (code, signal) => {
        resolve({ code, signal, stdout, stderr, timedOut });
      });
    });
  } finally {
    timer.cancel();
  }
}

/** The message of skopeo's or umoci's fatal log line (`level=fatal msg="…"`), else the last non-empty line. */
export function toolMessage(stderr: string): string {
  const lines = stderr.split('\n').map((l) => l.trim()).filter((l) => l !== '');
  for (const line of lines.toReversed()) {
    const m = /level=(?:fatal|error) msg="((?:[^"\\]|\\.)*)"/.exec(line);
    if (m?.[1] !== undefined) return m[1].replace(/\\(.)/g, '$1');
  }
  return lines.at(-1) ?? '(no output)';
}
