// Running a command inside a running pod: nsenter joins every namespace of the pod's init (so the
// command sees the pod's root, processes, hostname and network), setpriv becomes the sandbox user
// with no capabilities and no_new_privs (the host's setuid binaries are visible under /usr), and
// `env -C` sets the working dir inside the pod's root. Three execs cost ~4 ms; there is no daemon
// in the pod to talk to, by design: a POSIX userland is all a sandbox image needs.
import { spawn, type ChildProcess } from 'node:child_process';
import { constants } from 'node:os';
import type { ExecRequest, ExecResult } from '../runtime.ts';
import { CappedBuffer, DEFAULT_MAX_OUTPUT } from '../capped-buffer.ts';

/** How to enter one pod: its init pid and the identity and environment its processes get. */
export interface PodTarget {
  pid: number;
  uid: number;
  gid: number;
  env: Record<string, string>;
  cwd: string;
  /** Degraded (non-root) mode: the pod's user namespace forbids setgroups. */
  userns: boolean;
}

export interface SpawnInPodOptions {
  user?: number;
  cwd?: string;
  env?: Record<string, string>;
}

export function podArgv(target: PodTarget, command: readonly string[], opts: SpawnInPodOptions): string[] {
  const uid = opts.user ?? target.uid;
  const gid = opts.user === undefined || opts.user === target.uid ? target.gid : uid;
  return [
    '-t', String(target.pid), '-a', '--',
    'setpriv', '--reuid', String(uid), '--regid', String(gid), target.userns ? '--keep-groups' : '--clear-groups',
    '--inh-caps=-all', '--bounding-set=-all', '--no-new-privs', '--',
    'env', '-C', opts.cwd ?? target.cwd, '--', ...command,
  ];
}

/** Spawns `command` inside the pod in its own process group (so a timeout can kill all of it). */
export function spawnInPod(target: PodTarget, command: readonly string[], opts: SpawnInPodOptions): ChildProcess {
  return spawn('nsenter', podArgv(target, command, opts), {
    env: { ...target.env, ...opts.env },
    detached: true,
    stdio: ['pipe', 'pipe', 'pipe'],
  });
}

function signalNumber(signal: NodeJS.Signals): number {
  return constants.signals[signal];
}

export function execInPod(target: PodTarget, req: ExecRequest): Promise<ExecResult> {
  const max = req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
  return new Promise((resolve, reject) => {
    const child = spawnInPod(target, req.command, req);
    const stdout = new CappedBuffer(max);
    const stderr = new CappedBuffer(max);
    let timedOut = false;
    child.stdout?.on('data', (c: Buffer) => stdout.push(c));
    child.stderr?.on('data', (c: Buffer) => stderr.push(c));
    // A command that never reads stdin closes the pipe under us: that is not an error.
    child.stdin?.on('error', () => undefined);
    child.stdin?.end(req.stdin === undefined ? undefined : Buffer.from(req.stdin));
    const timer = req.timeoutMs === undefined ? undefined : setTimeout(() => {
      timedOut = true;
      killGroup(child, 'SIGKILL');
    }, req.timeoutMs);
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      const result: ExecResult = {
        exitCode: code ?? (signal === null ? 1 : 128 + signalNumber(signal)),
        stdout: stdout.bytes(),
        stderr: stderr.bytes(),
        timedOut,
        truncated: stdout.truncated || stderr.truncated,
      };
      if (signal !== null) result.signal = signal;
      resolve(result);
    });
  });
}

export function killGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    // already gone
  }
}
