// A terminal into a running runc container, with nothing of ours inside it (research/runtime.md §2b
// "PTY", §3a). `runc exec -d --console-socket` starts the process in the container's namespaces,
// cgroup and seccomp filter, as the user we name, with no capabilities and no_new_privs, on a new
// pty whose master runc hands back over a unix socket. pty-helper.c (one small host process per
// terminal) receives it, is the process's subreaper (so it gets the exit code), and speaks a small
// framed protocol to Node (data and resize frames): the image needs no python3 (busybox, alpine and
// distroless have none), only the command it runs.
//
// Output is the helper's stdout read through an async iterator: it is pulled, so a consumer that
// stops reading leaves the pipe full, the helper stops reading the pty, and the shell blocks.
//
// The helper is C rather than the host's python3 running a bridge (pty-bridge.py did, inside the pod), because one
// lives as long as each open terminal. Measured here: the helper's RSS is ~1.5 MB, of which
// ~120 KiB is its own (the rest is libc, shared with every process; test/oci-pty.test.ts prints
// both), against ~10 MB for pty-bridge.py idling under `python3 -I -S`, which also takes ~80 ms to
// start on this 2-core VM. openRuncPty resolves in ~20 ms and the first prompt arrives ~30 ms
// after the call (most of it `runc exec`; up to ~55 ms when other tests load the machine).
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { constants } from 'node:os';
import { isAbsolute, join } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { AsbError } from '../../errors.ts';
import { ensureCBinary } from '../../base/c-binary.ts';
import { privateDir } from '../../base/private-files.ts';
import { CappedBuffer } from '../capped-buffer.ts';
import { HOST_ENV, killGroup, noCapabilities, type UnprivilegedProcess } from './host-process.ts';
import { withPodRlimits } from './inherited-rlimits.ts';
import type { PtyOptions, PtySession } from '../runtime.ts';
import { runscFailure } from './runsc.ts';

/** After close(): how long a hung-up shell has to exit before the helper sends SIGKILL. */
export const HANGUP_GRACE_MS = 2000;
/** `runc exec` takes ~35 ms here; this only bounds a runc that hangs. */
const OPEN_TIMEOUT_MS = 30_000;
/** After close(), if the helper itself is still there this long after the grace, it is killed. */
const HELPER_BACKSTOP_MS = 5000;
/**
 * The default command: bash where the image has it, else the POSIX sh
 * every shell image has. Interactive, not a login shell (`docker exec -it`, `kubectl exec -it` do
 * the same): Debian's /etc/profile would reset an image's PATH.
 */
export const DEFAULT_PTY_COMMAND: readonly string[] = Object.freeze(['/bin/sh', '-c', 'if command -v bash >/dev/null 2>&1; then exec bash; fi; exec sh']);
const MAX_ERROR_BYTES = 4096;
/** runsc's log in the terminal's private dir (execArgv). */
const RUNSC_LOG = 'runsc.log';

/** Which running container a terminal goes into, and as whom. */
export interface RuncPtyTarget {
  /** Absolute path of runc (findRuncBinary()), or of runsc when `runtime` is 'runsc'. */
  runc: string;
  /** runc's `--root`: the state dir the container was started with. */
  root: string;
  /** The container runs under gVisor's runsc ('runsc'); default runc. */
  runtime?: 'runc' | 'runsc';
  /** Global flags before `--root` (runsc's --platform and the like: runscFlags). */
  runtimeFlags?: readonly string[];
  /** The container's id. */
  id: string;
  /** The container's user (SandboxIdentity); opts.user replaces the uid. */
  user: { uid: number; gid: number; additionalGids?: readonly number[] };
  /** The container's environment as `NAME=value` (its config.json process.env). */
  env: readonly string[];
  /** The container's working dir, unless opts.cwd names one. */
  cwd: string;
  /** The runtime's state dir: the helper is built into `<stateDir>/bin`, console sockets live briefly in `<stateDir>/pty`. */
  stateDir: string;
  /** The container has a user namespace (SandboxIdentity.userNamespace set). Only then may opts.user be 0: without one uid 0 is the host's root. */
  userNamespace?: boolean;
}

/** runtime-spec's process, as `runc exec --process` reads it. */
export interface ExecProcess extends UnprivilegedProcess {
  terminal: true;
  consoleSize: { height: number; width: number };
}

/** Builds the helper into `<stateDir>/bin` if needed (~0.3 s once); call at start so the first terminal does not wait for it. */
export function ensurePtyHelper(stateDir: string): Promise<string> {
  return ensureCBinary(stateDir, new URL('./pty-helper.c', import.meta.url));
}

function clampSize(n: number): number {
  return Math.max(1, Math.min(Number.isFinite(n) ? Math.floor(n) : 1, 0xffff));
}

/** The process.json of a terminal: pure. A `BadRequest` (or `Forbidden` for uid 0 without a user namespace) naming the field. */
export function execProcess(target: RuncPtyTarget, opts: PtyOptions): ExecProcess {
  const command = opts.command !== undefined && opts.command.length > 0 ? opts.command : DEFAULT_PTY_COMMAND;
  if (command[0] === '' || command.some((a) => a.includes('\0'))) throw new AsbError('BadRequest', 'command: the program must be named and no argument may hold a NUL byte', { fields: [{ field: 'command', message: 'must name a program, with no NUL bytes' }] });
  const cwd = opts.cwd ?? target.cwd;
  if (!cwd.startsWith('/') || cwd.includes('\0')) throw new AsbError('BadRequest', `cwd: must be an absolute path, got ${JSON.stringify(cwd)}`, { fields: [{ field: 'cwd', message: 'must be an absolute path' }] });
  const uid = opts.user ?? target.user.uid;
  if (!Number.isInteger(uid) || uid < 0 || uid > 65_535) throw new AsbError('BadRequest', `user: must be a uid from 0 to 65535, got ${String(uid)}`, { fields: [{ field: 'user', message: 'must be a uid from 0 to 65535' }] });
  if (uid === 0 && target.userNamespace !== true) {
    throw new AsbError('Forbidden', `user: uid 0 in sandbox container ${target.id} would be root on the host (it has no user namespace); run the pod as root to get one`, { fields: [{ field: 'user', message: 'uid 0 needs a pod that runs as root' }] });
  }
  // Another uid gets the group of the same number and no supplementary groups, as local/exec.ts does.
  const own = uid === target.user.uid;
  const env = new Map<string, string>();
  for (const entry of target.env) {
    const eq = entry.indexOf('=');
    if (eq > 0) env.set(entry.slice(0, eq), entry.slice(eq + 1));
  }
  env.set('TERM', 'xterm-256color');
  for (const [name, value] of Object.entries(opts.env ?? {})) {
    if (name === '' || name.includes('=') || name.includes('\0') || value.includes('\0')) {
      throw new AsbError('BadRequest', `env: ${JSON.stringify(name)} is not a valid variable (a name without "=", no NUL bytes)`, { fields: [{ field: `env.${name}`, message: 'must be a name without "=" and a value without NUL bytes' }] });
    }
    env.set(name, value);
  }
  return {
    terminal: true,
    consoleSize: { height: clampSize(opts.rows), width: clampSize(opts.cols) },
    user: { uid, gid: own ? target.user.gid : uid, additionalGids: own ? [...(target.user.additionalGids ?? [])] : [] },
    args: [...command],
    env: [...env].map(([k, v]) => `${k}=${v}`),
    cwd,
    capabilities: noCapabilities(),
    noNewPrivileges: true,
  };
}

/**
 * The runc command the helper runs, in a private dir holding process.json; the helper listens on
 * ./console.sock and reads ./pid (relative names: runc resolves them in the helper's cwd, so a
 * long stateDir never meets sun_path's 108-byte limit).
 */
export function execArgv(target: Pick<RuncPtyTarget, 'runc' | 'root' | 'id' | 'runtime' | 'runtimeFlags'>): string[] {
  const global = [target.runc, ...(target.runtimeFlags ?? []), '--root', target.root];
  // runsc has no -d; its ./pid is then the host pid of a `runsc exec` that waits for the process
  // (a session leader on the terminal, re-parented to the helper), exits with its code and
  // forwards the signals it gets (the helper's SIGHUP) to the terminal's foreground group.
  // runsc's errors go to ./runsc.log too: on a failed start it cannot write them to stderr (runscFailure).
  if (target.runtime === 'runsc') return [target.runc, ...(target.runtimeFlags ?? []), `--debug-log=${RUNSC_LOG}`, '--root', target.root, 'exec', '-detach', '-console-socket', 'console.sock', '-pid-file', 'pid', '-process', 'process.json', target.id];
  return withPodRlimits([...global, 'exec', '-d', '--console-socket', 'console.sock', '--pid-file', 'pid', '--process', 'process.json', target.id]);
}

function frame(kind: 'd' | 'r', payload: Uint8Array): Buffer {
  const header = Buffer.alloc(5);
  header.write(kind, 0, 'latin1');
  header.writeUInt32BE(payload.length, 1);
  return Buffer.concat([header, payload]);
}

function sizePayload(cols: number, rows: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt16BE(clampSize(cols), 0);
  b.writeUInt16BE(clampSize(rows), 2);
  return b;
}

/** Reads the helper's fd 3 to its end: "ready PID\n" once the terminal is up, nothing if it failed. */
function readyLine(pipe: Readable): Promise<string> {
  return new Promise((resolve) => {
    let text = '';
    pipe.setEncoding('latin1');
    pipe.on('data', (s: string) => (text += s.slice(0, 64)));
    pipe.on('error', () => resolve(text));
    pipe.on('close', () => resolve(text));
  });
}

/**
 * Opens a terminal running `opts.command` (default DEFAULT_PTY_COMMAND) in the running container
 * `target.id`. Resolves once the process runs on its pty (~40 ms); rejects with a `BadRequest`
 * when runc cannot start the command (not in the image, cwd missing), `Unavailable` for other
 * runc failures (the container is not running), `Timeout` if runc hangs.
 */
export async function openRuncPty(target: RuncPtyTarget, opts: PtyOptions): Promise<PtySession> {
  // The host side never looks anything up: runc by absolute path, with HOST_ENV.
  if (!isAbsolute(target.runc)) throw new AsbError('Internal', `runc must be an absolute path, got ${JSON.stringify(target.runc)}`);
  const processJson = execProcess(target, opts);
  const helper = await ensurePtyHelper(target.stateDir);
  const ptyDir = join(target.stateDir, 'pty');
  privateDir(ptyDir);
  const dir = await mkdtemp(join(ptyDir, 't-'));
  try {
    await writeFile(join(dir, 'process.json'), JSON.stringify(processJson), { mode: 0o600 });
    const child = spawn(helper, [String(HANGUP_GRACE_MS), ...execArgv(target)], {
      cwd: dir,
      env: HOST_ENV,
      detached: true, // its own group: a hung open is killed with the runc it started
      stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
    });
    const { stdin, stdout, stderr: stderrPipe } = child;
    const readyPipe = child.stdio[3] as Readable | null | undefined;
    if (readyPipe == null) throw new AsbError('Internal', 'pty helper has no fd 3');
    // When the helper exits, Node resumes (flowing, data dropped) every stdio stream nobody reads
    // yet (flushStdio in child_process): a command that printed and exited before the consumer's
    // first read, or even before the ready line was seen, lost its output. A 'readable' listener
    // keeps the stream paused, so the bytes wait for the reader (up to the stream's highWaterMark;
    // beyond that the helper waits, as it should).
    stdout.on('readable', () => undefined);
    stdin.on('error', () => undefined); // the helper exited; `exited` reports it
    const stderr = new CappedBuffer(MAX_ERROR_BYTES);
    stderrPipe.on('data', (c: Buffer) => stderr.push(c));
    const exited = new Promise<number>((resolve) => {
      // 'exit', not 'close': 'close' waits for stdout to end, which never happens if nobody reads it.
      child.on('exit', (code, signal) => resolve(code ?? (signal === null ? 1 : 128 + constants.signals[signal])));
      child.on('error', () => resolve(127));
    });
    const closed = new Promise<void>((resolve) => child.on('close', () => resolve()));
    const timer = setTimeout(() => killGroup(child, 'SIGKILL'), OPEN_TIMEOUT_MS);
    const ready = await readyLine(readyPipe);
    clearTimeout(timer);
    if (!/^ready \d+\n$/.test(ready)) {
      killGroup(child, 'SIGKILL');
      stdout.destroy();
      await closed;
      const log = target.runtime === 'runsc' ? await readFile(join(dir, RUNSC_LOG), 'utf8').catch(() => '') : '';
      if (log.includes('FATAL ERROR: ')) stderr.push(Buffer.from(`\nlevel=error msg=${JSON.stringify(runscFailure(log))}`));
      throw openError(target.id, child, stderr);
    }
    // runsc ignores process.json's consoleSize: the helper sets the size on the master (TIOCSWINSZ).
    if (target.runtime === 'runsc') stdin.write(frame('r', sizePayload(opts.cols, opts.rows)));
    return session(child, stdin, stdout, exited);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * What went wrong, from the helper's stderr: runc logs `time=… level=error msg="…"` lines; their
 * messages alone, else the text as it is (the helper's own `pty-helper: …` lines).
 */
export function runcMessage(stderr: string): string {
  const messages = [...stderr.matchAll(/\blevel=(?:error|fatal) msg="((?:[^"\\]|\\.)*)"/g)].map((m) => {
    try {
      return JSON.parse(`"${m[1] ?? ''}"`) as string;
    } catch {
      return m[1] ?? '';
    }
  });
  return messages.length > 0 ? messages.join('; ') : stderr.trim();
}

function openError(id: string, child: ChildProcess, stderr: CappedBuffer): AsbError {
  const message = runcMessage(Buffer.from(stderr.bytes()).toString('utf8'));
  if (child.signalCode === 'SIGKILL') return new AsbError('Timeout', `runc exec into container ${id} did not finish in ${String(OPEN_TIMEOUT_MS / 1000)} s`);
  // runc's words when the container's own execve of the command fails (runc 1.5: `exec failed:
  // unable to start container process: exec: "zsh": executable file not found in $PATH`, or a
  // chdir to a missing cwd): the caller's request, not the runtime, is at fault.
  // runsc's: `executing command "zsh" in sandbox: error finding executable "zsh" in PATH [...]`,
  // `failed to load /x`, `failed to find initial working directory "/nope"`.
  if (/unable to start container process: (exec:|error during container init: chdir|chdir to cwd)|in sandbox: (error finding executable|failed to load|failed to find initial working directory)/.test(message)) {
    return new AsbError('BadRequest', `cannot start the terminal's command in container ${id}: ${message}`, { fields: [{ field: 'command', message }] });
  }
  return new AsbError('Unavailable', `cannot open a terminal in container ${id}: ${message === '' ? `pty helper exited with ${String(child.exitCode ?? child.signalCode)}` : message}`);
}

function session(child: ChildProcess, stdin: Writable, stdout: Readable, exited: Promise<number>): PtySession {
  let closed = false;
  return {
    write: (data) =>
      new Promise<void>((resolve, reject) => {
        const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
        stdin.write(frame('d', bytes), (err) => (err ? reject(err) : resolve()));
      }),
    resize(cols, rows) {
      if (!stdin.writable) return;
      stdin.write(frame('r', sizePayload(cols, rows)));
    },
    output: (async function* () {
      for await (const chunk of stdout) yield new Uint8Array(chunk as Buffer);
    })(),
    exited,
    close() {
      if (closed) return;
      closed = true;
      stdin.end(); // the helper hangs up the terminal, and kills what is left after HANGUP_GRACE_MS
      const timer = setTimeout(() => killGroup(child, 'SIGKILL'), HANGUP_GRACE_MS + HELPER_BACKSTOP_MS);
      timer.unref();
      void exited.then(() => clearTimeout(timer));
    },
  };
}
