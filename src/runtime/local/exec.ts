// Running a command inside a running pod with `runc exec`: runc joins the container's namespaces
// and cgroup, sets the user, no_new_privs and the container's seccomp filter and (empty)
// capabilities, and only then execs the command, so nothing the sandbox wrote ever runs with the
// host's privileges (research/runtime.md §1a escape 1: `nsenter … setpriv` looked `setpriv` up on
// the pod's PATH as host root). runc is spawned by absolute path with a fixed environment; the
// pod's environment reaches only the command (runc exec gives it the container's env, plus
// --env). ~30 ms per exec against ~4 ms for nsenter; there is still no daemon in the pod.
// Under gVisor (runtimeClassName gvisor) the same through `runsc exec -process <file>`: runsc exec
// runs a process as uid 0 with the container's capabilities unless told otherwise, so the file
// spells out the user, the environment, no capabilities and no_new_privs. The process lives in the
// sentry, with no host pid: a kill goes through `runsc kill --pgid` (it leads its own session there).
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { constants } from 'node:os';
import type { ExecRequest, ExecResult } from '../runtime.ts';
import { CappedBuffer, DEFAULT_MAX_OUTPUT } from '../capped-buffer.ts';
import { HOST_ENV, killGroup, noCapabilities, type UnprivilegedProcess } from '../oci/host-process.ts';
import { runscFailure } from '../oci/runsc.ts';
import { withPodRlimits } from '../oci/inherited-rlimits.ts';
import type { RuntimeKind } from './runtime-class.ts';
import { agentExec, agentRequest, processUser } from './agent.ts';
import type { AgentLink } from './agent-link.ts';

/** How to reach one running container and who its processes are by default. */
export interface PodTarget {
  /** runc, or gVisor's runsc (then `runc` and `runcRoot` are runsc's binary and --root). */
  kind: RuntimeKind;
  runc: string;
  runcRoot: string;
  /** Global flags before the subcommand (runsc's). */
  runtimeFlags: readonly string[];
  /** The container id (the pod id). */
  id: string;
  /** Host pid of the container's init. */
  pid: number;
  uid: number;
  gid: number;
  /** The pod's user's supplementary groups. */
  groups?: readonly number[];
  /** The container's environment (what runc exec gives a process before --env). */
  env: Record<string, string>;
  cwd: string;
  /** A private directory for runc exec's pid files (one per running process). */
  execDir: string;
  /**
   * The agent of the pod's init (agent.ts): processes start through it, as children of the init,
   * when the pod has one. A pod started before asb-init (tini as its init) has none: runc exec.
   */
  agent?: AgentLink;
}

export interface SpawnInPodOptions {
  user?: number;
  group?: number;
  groups?: readonly number[];
  cwd?: string;
  env?: Record<string, string>;
}


/** Who runs an exec'd process, and the environment it gets beyond the container's. */
function execUser(target: PodTarget, opts: SpawnInPodOptions): { uid: number; gid: number; groups: readonly number[]; env: Record<string, string> } {
  const { uid, gid, groups } = processUser(target, opts);
  const env = { ...opts.env };
  // A user other than the pod's gets its own HOME unless the caller set one (runc only fills in HOME when unset).
  if (uid !== target.uid && opts.env?.HOME === undefined) env.HOME = uid === 0 ? '/root' : '/';
  return { uid, gid, groups, env };
}

export function runcExecArgv(target: PodTarget, command: readonly string[], opts: SpawnInPodOptions, pidFile: string): string[] {
  const { uid, gid, groups, env } = execUser(target, opts);
  const envArgs = Object.entries(env).flatMap(([k, v]) => ['--env', `${k}=${v}`]);
  const groupArgs = groups.flatMap((g) => ['--additional-gids', String(g)]);
  return [...target.runtimeFlags, '--root', target.runcRoot, 'exec', '--pid-file', pidFile, '--user', `${String(uid)}:${String(gid)}`, ...groupArgs, '--cwd', opts.cwd ?? target.cwd, ...envArgs, '--', target.id, ...command];
}

/** runtime-spec's process for `runsc exec -process`: the container's environment plus opts.env, as runc exec gives it. */
export function runscExecProcess(target: PodTarget, command: readonly string[], opts: SpawnInPodOptions): UnprivilegedProcess {
  const { uid, gid, groups, env } = execUser(target, opts);
  const vars = { ...target.env, ...env };
  return {
    user: { uid, gid, additionalGids: [...groups] },
    args: [...command],
    env: Object.entries(vars).map(([k, v]) => `${k}=${v}`),
    cwd: opts.cwd ?? target.cwd,
    capabilities: noCapabilities(),
    noNewPrivileges: true,
  };
}

/**
 * `runsc exec`: the process's pid inside the sandbox goes to internalPidFile (runsc's -pid-file
 * would name runsc itself). runsc's own errors go to logFile: when the process cannot start, runsc
 * dies of SIGPIPE writing its message to a stderr the sandbox has already shut down (it hands its
 * stdio to the sentry), and only the log keeps the message (see startFailure).
 */
export function runscExecArgv(target: PodTarget, processFile: string, internalPidFile: string, logFile: string): string[] {
  return [...target.runtimeFlags, `--debug-log=${logFile}`, '--root', target.runcRoot, 'exec', '-internal-pid-file', internalPidFile, '-process', processFile, target.id];
}

/** runc's exit code when it cannot start the process (a missing command, cwd): runsc exec's failures get the same. */
export const EXEC_FAILED_CODE = 255;

/** A process started in the pod: runc's child process (its pipes are the process's) and a kill for the process's whole group. */
export interface InPod {
  readonly child: ChildProcess;
  /**
   * Under gVisor, once the child exited: why the process never started (runsc's message), else
   * undefined. runc says it on stderr itself, with exit code 255; runsc cannot (runscExecArgv).
   */
  startFailure(): string | undefined;
  /**
   * Signals the process's group inside the container (runc exec makes it a session leader, so
   * its group is its host pid), or runc's own group while runc has not started it yet. Ignored
   * once the process ended.
   */
  kill(signal: NodeJS.Signals): void;
}

let execs = 0;

/** Spawns `command` inside the pod; its pid file is removed when runc exits. */
export function spawnInPod(target: PodTarget, command: readonly string[], opts: SpawnInPodOptions): InPod {
  const name = join(target.execDir, `${String(process.pid)}-${String(++execs)}`);
  const pidFile = `${name}.pid`;
  const gvisor = target.kind === 'runsc';
  const processFile = `${name}.json`;
  const logFile = `${name}.log`;
  // ~0.1 ms: a few hundred bytes into the pod's private exec dir, so spawnInPod stays synchronous.
  if (gvisor) writeFileSync(processFile, JSON.stringify(runscExecProcess(target, command, opts)), { mode: 0o600 });
  const argv = gvisor ? [target.runc, ...runscExecArgv(target, processFile, pidFile, logFile)] : withPodRlimits([target.runc, ...runcExecArgv(target, command, opts, pidFile)]);
  const child = spawn(argv[0] ?? target.runc, argv.slice(1), {
    env: HOST_ENV,
    detached: true,
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let ended = false;
  let failure: string | undefined;
  child.once('exit', () => {
    ended = true;
    // runsc writes the internal pid file once the process runs: without it, it never did. Read
    // here, before 'close' (which always follows 'exit'), so execInPod can report it.
    if (gvisor && !existsSync(pidFile)) failure = runscFailure(readText(logFile));
    rm(pidFile, { force: true }).catch(() => undefined);
    if (gvisor) for (const file of [processFile, logFile]) rm(file, { force: true }).catch(() => undefined);
  });
  child.once('error', () => (ended = true));
  return {
    child,
    startFailure: () => failure,
    kill(signal) {
      if (ended) return;
      let pid = Number.NaN;
      try {
        pid = Number.parseInt(readFileSync(pidFile, 'utf8'), 10);
      } catch {
        // runc has not started it yet: runc's group below
      }
      if (gvisor && Number.isInteger(pid) && pid > 1) {
        // runsc exec forwards no signal to a process without a terminal, and a killed runsc exec
        // would leave the process running in the sandbox: runsc signals its group there.
        killInSandbox(target, pid, signal);
        return;
      }
      if (Number.isInteger(pid) && pid > 1) {
        try {
          // runc itself stays: it reaps the process and exits with its status. Killed, runc would
          // leave the process to the host's init as a zombie, and a zombie of a pid namespace
          // holds that namespace's init in its exit (a stop then took ~1.5 s instead of 5 ms).
          process.kill(-pid, signal);
          return;
        } catch {
          // already gone
        }
      }
      killGroup(child, signal);
    },
  };
}

function readText(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return '';
  }
}

/** `runsc kill --pgid`: the group of an exec'd process inside the sandbox (runsc exec makes it a session leader there). */
function killInSandbox(target: PodTarget, pgid: number, signal: NodeJS.Signals): void {
  const kill = spawn(target.runc, [...target.runtimeFlags, '--root', target.runcRoot, 'kill', '--pgid', String(pgid), target.id, signal], { env: HOST_ENV, stdio: 'ignore' });
  kill.on('error', () => undefined); // runsc is there (exec ran it); a sandbox already gone needs no kill
}

/** The signal a runc exit code stands for: runc exits 128+n when the process died of signal n (an exit(128+n) reads the same). */
export function signalOfCode(code: number): NodeJS.Signals | undefined {
  if (code <= 128 || code > 128 + 64) return undefined;
  return SIGNAL_NAMES.get(code - 128);
}

const SIGNAL_NAMES = new Map(Object.entries(constants.signals).map(([name, n]) => [n, name as NodeJS.Signals]));

function signalNumber(signal: NodeJS.Signals): number {
  return constants.signals[signal];
}

export function execInPod(target: PodTarget, req: ExecRequest): Promise<ExecResult> {
  if (target.agent !== undefined) return agentExec(target.agent, agentRequest(target, req), req);
  const max = req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
  return new Promise((resolve, reject) => {
    const proc = spawnInPod(target, req.command, req);
    const child = proc.child;
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
      proc.kill('SIGKILL');
    }, req.timeoutMs);
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      const failure = proc.startFailure();
      if (failure !== undefined) {
        resolve({ exitCode: EXEC_FAILED_CODE, stdout: stdout.bytes(), stderr: new TextEncoder().encode(`runsc exec: ${failure}\n`), timedOut, truncated: false });
        return;
      }
      const result: ExecResult = {
        exitCode: code ?? (signal === null ? 1 : 128 + signalNumber(signal)),
        stdout: stdout.bytes(),
        stderr: stderr.bytes(),
        timedOut,
        truncated: stdout.truncated || stderr.truncated,
      };
      const died = signal ?? signalOfCode(result.exitCode);
      if (died !== undefined) result.signal = died;
      resolve(result);
    });
  });
}
