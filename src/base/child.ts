// A system process started by the local supervisor (`make up`) or by end-to-end tests: a Node
// entry point that prints one JSON line with `"ready": true` on stdout when it serves, and
// logs to stderr (sent to a file here). stop() asks with SIGTERM and kills after a deadline.
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, fstatSync, openSync, readSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { openPrivateLog } from './private-files.ts';
import { withPdeathsig } from './watched-process.ts';

export interface ReadyChild<R> {
  readonly name: string;
  readonly proc: ChildProcess;
  /** The ready line, parsed. */
  readonly ready: R;
  /** Resolves with the exit code (or signal name) when the process ends. */
  readonly exited: Promise<number | string>;
  /** SIGTERM, then SIGKILL after deadlineMs; resolves when it has exited. Idempotent. */
  stop(deadlineMs?: number): Promise<void>;
  /** SIGKILL now (tests of crashes). */
  kill(): Promise<void>;
}

export interface StartChildOptions {
  name: string;
  /** The .ts entry point, run with this Node. */
  entry: string;
  args: readonly string[];
  /** stderr goes here (appended). */
  logPath: string;
  env?: NodeJS.ProcessEnv;
  /** How long to wait for the ready line. Default 60 s (a first start compiles the pod init). */
  readyTimeoutMs?: number;
  /**
   * Run it in a process group of its own, and have it sent SIGTERM if this process dies
   * (setpriv --pdeathsig). For `make up`: Ctrl-C and a SIGTERM to the group reach only the
   * supervisor, which stops its children in order and exits last, and none outlives it.
   */
  ownGroup?: boolean;
}

const DEFAULT_STOP_DEADLINE_MS = 20_000;

export async function startChild<R extends { ready: true }>(opts: StartChildOptions): Promise<ReadyChild<R>> {
  const logFd = openPrivateLog(opts.logPath);
  const logStart = fstatSync(logFd).size;
  const argv = [opts.entry, ...opts.args];
  const own = opts.ownGroup === true;
  const [command, args] = own ? withPdeathsig(process.execPath, argv, 'SIGTERM') : [process.execPath, argv];
  const proc = spawn(command, args, { stdio: ['ignore', 'pipe', logFd], env: opts.env ?? process.env, detached: own });
  closeSync(logFd);
  const exited = new Promise<number | string>((resolve) => proc.once('exit', (code, signal) => resolve(code ?? signal ?? 'unknown')));
  const ready = await new Promise<R>((resolve, reject) => {
    if (proc.stdout === null) {
      reject(new Error(`${opts.name}: stdout is not piped`));
      return;
    }
    const timer = setTimeout(() => reject(new Error(`${opts.name} did not become ready within ${opts.readyTimeoutMs ?? 60_000} ms; see ${opts.logPath}`)), opts.readyTimeoutMs ?? 60_000);
    const lines = createInterface({ input: proc.stdout });
    lines.on('line', (line) => {
      if (!isReadyLine(line)) return;
      clearTimeout(timer);
      resolve(JSON.parse(line) as R);
    });
    void exited.then((code) => {
      clearTimeout(timer);
      // Its own last words (e.g. "worker failed to start: cannot set up pod networking: bridge … is
      // held by …"), so the user reads why without opening the log.
      const why = failureLine(opts.logPath, logStart);
      reject(new Error(`${opts.name} exited (${String(code)}) before it was ready${why === undefined ? '' : `: ${why}`}; see ${opts.logPath}`));
    });
  }).catch((err: unknown) => {
    proc.kill('SIGKILL');
    throw err;
  });

  let stopping: Promise<void> | undefined;
  return {
    name: opts.name,
    proc,
    ready,
    exited,
    stop(deadlineMs = DEFAULT_STOP_DEADLINE_MS) {
      stopping ??= (async () => {
        if (proc.exitCode !== null || proc.signalCode !== null) return;
        proc.kill('SIGTERM');
        const timer = setTimeout(() => proc.kill('SIGKILL'), deadlineMs);
        await exited;
        clearTimeout(timer);
      })();
      return stopping;
    },
    async kill() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      await exited;
    },
  };
}

function isReadyLine(line: string): boolean {
  try {
    return (JSON.parse(line) as { ready?: unknown }).ready === true;
  } catch {
    return false;
  }
}

/** What follows "failed to start: " in the last such line the child wrote to its log since `from` (bytes) (process-main.ts). */
function failureLine(logPath: string, from: number): string | undefined {
  try {
    const fd = openSync(logPath, 'r');
    try {
      // The last 64 KiB is plenty for the final error and keeps a chatty log cheap to read.
      const size = fstatSync(fd).size;
      const start = Math.max(from, size - 65_536);
      const buf = Buffer.alloc(size - start);
      readSync(fd, buf, 0, buf.length, start);
      const marker = ' failed to start: ';
      const line = buf.toString('utf8').split('\n').findLast((l) => l.includes(marker));
      return line?.slice(line.indexOf(marker) + marker.length);
    } finally {
      closeSync(fd);
    }
  } catch {
    return undefined;
  }
}
