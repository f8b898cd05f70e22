// exec, spawn and the PTY of the PodRuntime contract over pods/exec. pods/exec only runs an argv
// in a container as the container's user in its working directory, so what the local runtime
// does with nsenter and setpriv is done here by a small POSIX sh wrapper in the container:
// exported variables for env, `cd` for cwd, coreutils/busybox `timeout -s KILL` for a timeout,
// and `setpriv` for another uid. The image needs a POSIX shell; the rest only when asked for:
// - user: needs setpriv in the image and a container running as root; otherwise the call is
//   refused with a BadRequest that says which (Kubernetes grants no other way to switch users).
// - timeoutMs: needs `timeout`; the whole process group is killed when it fires.
// - signals (spawn's kill): one more exec running `kill` on the process's group (or the process
//   alone when it leads none), since pods/exec has no signal channel.
// - PtySession.close(): pods/exec cannot send SIGHUP; the session's socket is closed and the
//   kubelet ends the exec (the container runtime decides how; ours kills its process group).
import { constants } from 'node:os';
import { Readable, Writable } from 'node:stream';
import { AsbError } from '../../errors.ts';
import type { Clock } from '../../base/clock.ts';
import type { ExecRequest, ExecResult, PodProcess, PtyOptions, PtySession, SpawnRequest } from '../runtime.ts';
import { PodExec, type ExecCredentials, type ExecEnd, type ExecTarget } from './pod-exec.ts';
import { CappedBuffer, DEFAULT_MAX_OUTPUT } from '../capped-buffer.ts';

/** A command past its timeout whose exit the container never reported is given up this much later. */
const TIMEOUT_SLACK_MS = 10_000;
/** Output a consumer has not read yet, per session, before the socket is paused. */
const HIGH_WATER = 1024 * 1024;
/** What the wrapper prints on stderr, exiting 126, when it refuses a request it cannot honour. */
const REFUSED = 'asb-exec-refused: ';
/** The first stderr line of a spawned process: its pid, for kill(). */
const PID_LINE = /^asb-pid (\d+)\n/;
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

// $1 cwd, $2 uid, $3 timeout in seconds, $4 "pid" to print the pid first ('' for each: not asked);
// then NAME=value words up to "--"; then the command. Exit 125: the cwd does not exist (as
// `env -C` in the local runtime); 127: the command was not found (sh's own code).
const WRAPPER = [
  'cwd=$1 uid=$2 limit=$3 pid=$4; shift 4',
  'while [ "$#" -gt 0 ] && [ "$1" != -- ]; do export "$1"; shift; done; shift',
  'if [ -n "$cwd" ]; then cd -- "$cwd" || exit 125; fi',
  'if [ -n "$uid" ] && [ "$(id -u 2>/dev/null)" != "$uid" ]; then',
  `  command -v setpriv >/dev/null 2>&1 || { echo "${REFUSED}cannot run as uid $uid: the image has no setpriv" >&2; exit 126; }`,
  `  if [ "$(id -u)" != 0 ]; then echo "${REFUSED}the container runs as uid $(id -u), not root, and cannot switch to uid $uid" >&2; exit 126; fi`,
  '  set -- setpriv --reuid "$uid" --regid "$uid" --clear-groups -- "$@"',
  'fi',
  'if [ -n "$limit" ]; then',
  `  command -v timeout >/dev/null 2>&1 || { echo "${REFUSED}cannot enforce a timeout: the image has no timeout command" >&2; exit 126; }`,
  '  set -- timeout -s KILL "$limit" "$@"',
  'fi',
  'if [ -n "$pid" ]; then echo "asb-pid $$" >&2; fi',
  'exec "$@"',
].join('\n');

interface WrapOptions {
  cwd?: string | undefined;
  user?: number | undefined;
  env?: Record<string, string> | undefined;
  timeoutMs?: number | undefined;
  printPid?: boolean;
}

/** The argv that runs `command` in the container through the wrapper. */
export function wrapCommand(command: readonly string[], opts: WrapOptions): string[] {
  if (command.length === 0) throw new AsbError('BadRequest', 'command is empty');
  const env = Object.entries(opts.env ?? {}).map(([name, value]) => {
    if (!ENV_NAME.test(name)) throw new AsbError('BadRequest', `environment variable name "${name}" is not a valid shell name`);
    return `${name}=${value}`;
  });
  if (opts.user !== undefined && (!Number.isInteger(opts.user) || opts.user < 0)) throw new AsbError('BadRequest', `user must be a uid (a non-negative integer), got ${opts.user}`);
  if (opts.timeoutMs !== undefined && (!Number.isFinite(opts.timeoutMs) || opts.timeoutMs <= 0)) throw new AsbError('BadRequest', `timeoutMs must be positive, got ${opts.timeoutMs}`);
  const seconds = opts.timeoutMs === undefined ? '' : String(Math.max(opts.timeoutMs, 1) / 1000);
  return ['sh', '-c', WRAPPER, 'sh', opts.cwd ?? '', opts.user === undefined ? '' : String(opts.user), seconds, opts.printPid === true ? 'pid' : '', ...env, '--', ...command];
}

/** The wrapper refused (exit 126 with its marker): a request this container cannot honour. */
function refusedBy(exitCode: number, stderr: Uint8Array): AsbError | undefined {
  if (exitCode !== 126) return undefined;
  const text = Buffer.from(stderr).toString('utf8');
  return text.startsWith(REFUSED) ? new AsbError('BadRequest', text.slice(REFUSED.length).trim()) : undefined;
}

function failure(end: ExecEnd): AsbError {
  if (end.kind === 'failed') return end.error;
  if (end.kind === 'closed') return new AsbError('Unavailable', end.reason);
  return new AsbError('Internal', `unexpected exit ${end.exitCode}`);
}

export interface ExecContext {
  credentials: ExecCredentials;
  target: ExecTarget;
  clock: Clock;
}

export async function execInPod(ctx: ExecContext, req: ExecRequest): Promise<ExecResult> {
  const argv = wrapCommand(req.command, { cwd: req.cwd, user: req.user, env: req.env, timeoutMs: req.timeoutMs });
  const max = req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
  const stdout = new CappedBuffer(max);
  const stderr = new CappedBuffer(max);
  const hasStdin = req.stdin !== undefined;
  const started = ctx.clock.now();
  const session = await PodExec.open(ctx.credentials, ctx.target, argv, { stdin: hasStdin, stdout: true, stderr: true, tty: false, closesStdin: hasStdin }, {
    stdout: (c) => stdout.push(c),
    stderr: (c) => stderr.push(c),
  });
  if (req.stdin !== undefined) {
    // A command that exits without reading its input ends the session under the write: that is no error.
    await session.writeStdin(typeof req.stdin === 'string' ? Buffer.from(req.stdin, 'utf8') : req.stdin).catch(() => undefined);
    session.closeStdin();
  }
  const deadline = { passed: false };
  const timer = req.timeoutMs === undefined ? undefined : ctx.clock.after(req.timeoutMs + TIMEOUT_SLACK_MS, () => {
    deadline.passed = true;
    session.abort();
  });
  const end = await session.ended;
  timer?.cancel();
  if (deadline.passed) return { exitCode: 137, stdout: stdout.bytes(), stderr: stderr.bytes(), timedOut: true, truncated: stdout.truncated || stderr.truncated, signal: 'SIGKILL' };
  if (end.kind !== 'exit') throw failure(end);
  const result: ExecResult = { exitCode: end.exitCode, stdout: stdout.bytes(), stderr: stderr.bytes(), timedOut: false, truncated: stdout.truncated || stderr.truncated };
  const refused = refusedBy(end.exitCode, result.stderr);
  if (refused !== undefined) throw refused;
  // `timeout -s KILL` ends the command with 137 (128 + SIGKILL) once the limit has passed.
  if (req.timeoutMs !== undefined && end.exitCode === 137 && ctx.clock.now() - started >= req.timeoutMs) {
    result.timedOut = true;
    result.signal = 'SIGKILL';
  }
  return result;
}

/** Pauses the session while any of its streams holds more than HIGH_WATER unread bytes. */
class Flow {
  #session: PodExec | undefined;
  readonly #full = new Set<string>();

  /** The session once open; output can arrive (and fill a stream) before open() returns. */
  attach(session: PodExec): void {
    this.#session = session;
    if (this.#full.size > 0) session.pause();
  }

  full(stream: string): void {
    if (this.#full.size === 0) this.#session?.pause();
    this.#full.add(stream);
  }

  drained(stream: string): void {
    if (!this.#full.delete(stream)) return;
    if (this.#full.size === 0) this.#session?.resume();
  }
}

export async function spawnInPod(ctx: ExecContext, req: SpawnRequest): Promise<PodProcess> {
  const argv = wrapCommand(req.command, { cwd: req.cwd, user: req.user, env: req.env, printPid: true });
  const flow = new Flow();
  const readable = (name: string): Readable => new Readable({ highWaterMark: HIGH_WATER, read: () => flow.drained(name) });
  const stdout = readable('stdout');
  const stderr = readable('stderr');
  const push = (stream: Readable, name: string, chunk: Buffer): void => {
    if (!stream.push(Buffer.from(chunk))) flow.full(name);
  };
  let pid: number | undefined;
  let head: Buffer | undefined = Buffer.alloc(0); // stderr until the wrapper's pid line is complete
  const opened = await PodExec.open(ctx.credentials, ctx.target, argv, { stdin: true, stdout: true, stderr: true, tty: false, closesStdin: true }, {
    stdout: (c) => push(stdout, 'stdout', c),
    stderr: (c) => {
      if (head === undefined) {
        push(stderr, 'stderr', c);
        return;
      }
      head = Buffer.concat([head, c]);
      const text = head.toString('latin1');
      const match = PID_LINE.exec(text);
      if (match === null && !text.includes('\n') && head.length < 64) return;
      if (match !== null) pid = Number(match[1]); // else the wrapper refused: its message is the stderr
      const rest = match === null ? head : head.subarray(match[0].length);
      head = undefined;
      if (rest.length > 0) push(stderr, 'stderr', rest);
    },
  });
  flow.attach(opened);
  const stdin = new Writable({
    write: (chunk: Buffer, _enc, cb) => void opened.writeStdin(chunk).then(() => cb(), (err: unknown) => cb(err instanceof Error ? err : new Error(String(err)))),
    final: (cb) => {
      opened.closeStdin();
      cb();
    },
  });
  stdin.on('error', () => undefined); // a process that exited: `exited` reports the end
  let killedWith: NodeJS.Signals | undefined;
  const exited = opened.ended.then((end) => {
    stdout.push(null);
    stderr.push(null);
    if (end.kind !== 'exit') return { exitCode: 137 }; // the session was lost: the process is as good as killed
    const signal = killedWith !== undefined && end.exitCode === 128 + constants.signals[killedWith] ? killedWith : undefined;
    return signal === undefined ? { exitCode: end.exitCode } : { exitCode: end.exitCode, signal };
  });
  return {
    stdin,
    stdout,
    stderr,
    exited,
    kill: (signal) => {
      if (!opened.open || pid === undefined) return;
      killedWith = signal;
      const name = signal.replace(/^SIG/, '');
      // The group first (a shell and what it started), else the process alone.
      const script = `kill -s ${name} -- -${pid} 2>/dev/null || kill -s ${name} ${pid}`;
      void execInPod(ctx, { command: ['sh', '-c', script] }).catch(() => undefined);
    },
  };
}

/** Output chunks pulled by the consumer; the socket pauses while HIGH_WATER bytes wait. */
class ChunkQueue {
  readonly #chunks: Uint8Array[] = [];
  #bytes = 0;
  #ended = false;
  #wake: (() => void) | undefined;
  readonly #flow: Flow;

  constructor(flow: Flow) {
    this.#flow = flow;
  }

  push(chunk: Buffer): void {
    this.#chunks.push(new Uint8Array(chunk));
    this.#bytes += chunk.length;
    if (this.#bytes > HIGH_WATER) this.#flow.full('pty');
    this.#wake?.();
  }

  end(): void {
    this.#ended = true;
    this.#wake?.();
  }

  async *iterate(): AsyncGenerator<Uint8Array> {
    for (;;) {
      const chunk = this.#chunks.shift();
      if (chunk !== undefined) {
        this.#bytes -= chunk.length;
        if (this.#bytes <= HIGH_WATER) this.#flow.drained('pty');
        yield chunk;
        continue;
      }
      if (this.#ended) return;
      await new Promise<void>((resolve) => (this.#wake = resolve));
      this.#wake = undefined;
    }
  }
}

// Without a command: bash when the image has it, else sh.
const DEFAULT_SHELL = ['sh', '-c', 'if command -v bash >/dev/null 2>&1; then exec bash; fi; exec sh'];

export async function openPtyInPod(ctx: ExecContext, opts: PtyOptions): Promise<PtySession> {
  const command = opts.command !== undefined && opts.command.length > 0 ? opts.command : DEFAULT_SHELL;
  const argv = wrapCommand(command, { cwd: opts.cwd, user: opts.user, env: { TERM: 'xterm-256color', ...opts.env } });
  const flow = new Flow();
  const queue = new ChunkQueue(flow);
  const opened = await PodExec.open(ctx.credentials, ctx.target, argv, { stdin: true, stdout: true, stderr: false, tty: true }, { stdout: (c) => queue.push(c) });
  flow.attach(opened);
  opened.resize(opts.cols, opts.rows);
  let closed = false;
  const exited = opened.ended.then((end) => {
    queue.end();
    if (end.kind === 'exit') return end.exitCode;
    return closed ? 128 + constants.signals.SIGHUP : 137; // hung up by close(), or the connection was lost
  });
  return {
    write: (data) => opened.writeStdin(typeof data === 'string' ? Buffer.from(data, 'utf8') : data),
    resize: (cols, rows) => opened.resize(cols, rows),
    output: queue.iterate(),
    exited,
    close: () => {
      if (closed) return;
      closed = true;
      opened.abort();
    },
  };
}
