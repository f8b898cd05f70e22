// The host's side of asb-init's agent (asb-init.c, which has the protocol): how a pod's process
// spec is turned into asb-init's command line, and exec, spawn and terminals over one TCP
// connection per process to the agent in the pod's network namespace. Processes started this way
// are children of the container's init, so a checkpoint keeps them (runc exec's and runsc exec's
// are outside that tree: asb-init.c's header). An exec of `true` takes 1.2 ms on runc and 9.5 ms
// under gVisor (p50 of 50, .scratch-style probe of 2026-11-29), against ~30 ms for `runc exec` and
// ~210 ms for `runsc exec` (test/oci-runsc.test.ts prints it).
//
// A connection that drops while its process runs (a pause with memory drops every connection from
// outside) leaves the process running in the pod; the handle here waits, and the runtime either
// reattaches it by pid once the pod runs again (AgentLink.resume) or ends it when the pod ended
// (AgentLink.end).
import { randomBytes } from 'node:crypto';
import { connect, type Socket } from 'node:net';
import { constants } from 'node:os';
import { PassThrough } from 'node:stream';
import { AsbError } from '../../errors.ts';
import { AGENT_PORT } from '../../router/contract.ts';
import { CappedBuffer, DEFAULT_MAX_OUTPUT } from '../capped-buffer.ts';
import type { OciSpec } from '../oci/spec.ts';
import type { ExecRequest, ExecResult, PodProcess, PtyOptions, PtySession, SpawnRequest } from '../runtime.ts';

export { AGENT_PORT };
/** asb-init reads `<port>:<token>` from this variable and removes it before anything else runs. */
export const AGENT_ENV = 'ASB_AGENT';
/** runc's exit code when it cannot start a process; the agent's start failures get the same. */
export const START_FAILED_CODE = 255;
/** The agent listens a moment after the pod's init starts: connects are retried this long. */
const CONNECT_RETRY_MS = 3000;
const CONNECT_STEP_MS = 20;
/**
 * One connect's bound. The agent is on the pod's veth: it answers a SYN (or refuses) in well under a
 * millisecond. A pod gone while its address keeps the static neighbour entry the runtime gives it
 * answers nothing, and the kernel would resend the SYN for ~2 min (tcp_syn_retries 6: 127 s),
 * holding the caller (a reattach after a drop, the test process at its exit) that long.
 */
const CONNECT_ATTEMPT_MS = 5000;
/** A dropped connection of a running pod: reattach attempts before the process is given up. */
const REATTACH_TRIES = 3;
/**
 * A request's connection closed before the agent said a word (no pid, no refusal): the request was
 * not taken, since a process it starts is named first. Asked again this many times, 50 ms apart,
 * before the call fails. Seen rarely under load (the cause is not found yet); a wrong token (a pod
 * that is not the one asked for) closes every try the same way and still fails.
 */
const UNANSWERED_TRIES = 2;

export interface AgentAddress {
  host: string;
  port: number;
  token: string;
}

/**
 * The capabilities asb-init needs for itself: to set a child's user (SETUID, SETGID) and bounding
 * set (SETPCAP), to signal processes of another user of the pod (KILL: a stop's SIGTERM to a
 * command running as uid 1000, an exec's timeout), and to give a started process its own stdio
 * pipes or terminal (CHOWN: a program that opens /dev/stdout must find it its user's).
 */
const INIT_CAPS = ['CAP_CHOWN', 'CAP_KILL', 'CAP_SETGID', 'CAP_SETUID', 'CAP_SETPCAP'];

/** Linux's capability numbers (linux/capability.h), for asb-init's masks. */
const CAP_NUMBERS: Readonly<Record<string, number>> = {
  CAP_CHOWN: 0, CAP_DAC_OVERRIDE: 1, CAP_DAC_READ_SEARCH: 2, CAP_FOWNER: 3, CAP_FSETID: 4, CAP_KILL: 5, CAP_SETGID: 6,
  CAP_SETUID: 7, CAP_SETPCAP: 8, CAP_LINUX_IMMUTABLE: 9, CAP_NET_BIND_SERVICE: 10, CAP_NET_BROADCAST: 11, CAP_NET_ADMIN: 12,
  CAP_NET_RAW: 13, CAP_IPC_LOCK: 14, CAP_IPC_OWNER: 15, CAP_SYS_MODULE: 16, CAP_SYS_RAWIO: 17, CAP_SYS_CHROOT: 18,
  CAP_SYS_PTRACE: 19, CAP_SYS_PACCT: 20, CAP_SYS_ADMIN: 21, CAP_SYS_BOOT: 22, CAP_SYS_NICE: 23, CAP_SYS_RESOURCE: 24,
  CAP_SYS_TIME: 25, CAP_SYS_TTY_CONFIG: 26, CAP_MKNOD: 27, CAP_LEASE: 28, CAP_AUDIT_WRITE: 29, CAP_AUDIT_CONTROL: 30,
  CAP_SETFCAP: 31, CAP_MAC_OVERRIDE: 32, CAP_MAC_ADMIN: 33, CAP_SYSLOG: 34, CAP_WAKE_ALARM: 35, CAP_BLOCK_SUSPEND: 36,
  CAP_AUDIT_READ: 37, CAP_PERFMON: 38, CAP_BPF: 39, CAP_CHECKPOINT_RESTORE: 40,
};

function mask(names: readonly string[]): string {
  let bits = 0n;
  for (const name of names) {
    const n = CAP_NUMBERS[name];
    if (n === undefined) throw new Error(`unknown capability ${name}`);
    bits |= 1n << BigInt(n);
  }
  return bits.toString(16);
}

export function newAgentToken(): string {
  return randomBytes(24).toString('hex');
}

/**
 * The pod's process as asb-init runs it: asb-init as container root with INIT_CAPS besides the
 * pod's own, the pod's user and capabilities as its flags (the command and every started process
 * get those), and the agent's address in its environment. `init` is where asb-init is mounted.
 */
export function initProcess(spec: OciSpec, init: string, agent: { port: number; token: string }): OciSpec['process'] {
  const p = spec.process;
  const c = p.capabilities;
  const groups = p.user.additionalGids ?? [];
  const user = `${String(p.user.uid)}:${String(p.user.gid)}${groups.length > 0 ? `:${groups.join(',')}` : ''}`;
  const caps = [c.bounding, c.effective, c.permitted, c.inheritable, c.ambient].map(mask).join(':');
  const own = (set: readonly string[]): string[] => [...new Set([...set, ...INIT_CAPS])];
  return {
    ...p,
    // No additionalGids at all, not an empty list: runsc's restore compares the user with the saved spec, which drops an empty one (runsc.ts).
    user: { uid: 0, gid: 0 },
    capabilities: { bounding: own(c.bounding), effective: own(c.effective), permitted: own(c.permitted), inheritable: [...c.inheritable], ambient: [] },
    args: [init, '--user', user, '--caps', caps, '--', ...p.args],
    env: [...p.env, `${AGENT_ENV}=${String(agent.port)}:${agent.token}`],
  };
}

/**
 * The home directory /etc/passwd gives `uid`, else "/": what runc sets HOME to when the process's
 * environment has none. asb-init runs as root, so runc would give the init (and through it the
 * command and every exec) root's home: the pod's spec gets the user's HOME itself instead.
 */
export function homeOf(passwd: string, uid: number): string {
  for (const line of passwd.split('\n')) {
    const f = line.split(':');
    if (f.length >= 7 && Number(f[2]) === uid && f[5] !== undefined && f[5] !== '') return f[5];
  }
  return '/';
}

/** What asb-init's command line and environment say (a pod's config.json read back after a restart). */
export function readInitProcess(process: OciSpec['process'], init: string): { uid: number; gid: number; groups: number[]; env: string[]; agent?: { port: number; token: string } } | undefined {
  const [binary, flag, user] = process.args;
  if (binary !== init || flag !== '--user' || user === undefined) return undefined;
  const [uidText, gidText, groupsText = ''] = user.split(':');
  const uid = Number(uidText);
  const gid = Number(gidText);
  if (!Number.isInteger(uid) || !Number.isInteger(gid)) return undefined;
  const groups = groupsText === '' ? [] : groupsText.split(',').map(Number).filter((g) => Number.isInteger(g));
  const env = process.env.filter((e) => !e.startsWith(`${AGENT_ENV}=`));
  const value = process.env.find((e) => e.startsWith(`${AGENT_ENV}=`))?.slice(AGENT_ENV.length + 1);
  const colon = value?.indexOf(':') ?? -1;
  const agent = value === undefined || colon < 0 ? undefined : { port: Number(value.slice(0, colon)), token: value.slice(colon + 1) };
  return { uid, gid, groups, env, ...(agent === undefined ? {} : { agent }) };
}

// ---- the wire

function frame(type: string, payload: Uint8Array = new Uint8Array(0)): Buffer {
  const head = Buffer.alloc(5);
  head.write(type, 0, 'latin1');
  head.writeUInt32BE(payload.length, 1);
  return Buffer.concat([head, payload]);
}

/** Who a started process runs as, where, with what, on which terminal size. */
export interface AgentRequest {
  uid: number;
  gid: number;
  /** Supplementary groups; none when absent. */
  groups?: readonly number[];
  cwd: string;
  command: readonly string[];
  env: readonly string[];
  pty?: { cols: number; rows: number };
}

function requestFrame(token: string, req: AgentRequest | { attach: number }): Buffer {
  const fields = 'attach' in req
    ? [token, 'attach', String(req.attach)]
    : [token, req.pty === undefined ? 'exec' : 'pty', String(req.uid), String(req.gid), (req.groups ?? []).join(','), req.cwd, String(req.pty?.cols ?? 0), String(req.pty?.rows ?? 0), String(req.command.length), ...req.command, String(req.env.length), ...req.env];
  for (const f of fields) if (f.includes('\0')) throw new AsbError('BadRequest', `a command, argument, environment variable or path must not contain a NUL byte: ${JSON.stringify(f.slice(0, 80))}`);
  return frame('Q', Buffer.from(fields.map((f) => `${f}\0`).join(''), 'utf8'));
}

type Frame = { type: string; payload: Buffer };

/** Splits a byte stream into frames. */
function frameReader(onFrame: (f: Frame) => void): (chunk: Buffer) => void {
  let pending: Buffer = Buffer.alloc(0);
  return (chunk) => {
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
    while (pending.length >= 5) {
      const len = pending.readUInt32BE(1);
      if (pending.length < 5 + len) break;
      onFrame({ type: String.fromCharCode(pending[0] ?? 0), payload: pending.subarray(5, 5 + len) });
      pending = pending.subarray(5 + len);
    }
  };
}

/** A wait that keeps the process alive: a call in flight is not abandoned by an idle event loop. */
function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** A connection to the agent; refused connects are retried a while (the agent listens a moment after the init starts). */
async function dial(addr: AgentAddress): Promise<Socket> {
  const until = Date.now() + CONNECT_RETRY_MS;
  for (;;) {
    try {
      return await new Promise<Socket>((resolve, reject) => {
        const socket = connect({ host: addr.host, port: addr.port, noDelay: true });
        const unanswered = setTimeout(() => socket.destroy(Object.assign(new Error(`no answer in ${String(CONNECT_ATTEMPT_MS)} ms`), { code: 'ETIMEDOUT' })), CONNECT_ATTEMPT_MS);
        const failed = (err: Error): void => {
          clearTimeout(unanswered);
          reject(err);
        };
        socket.once('connect', () => {
          clearTimeout(unanswered);
          socket.removeListener('error', failed);
          resolve(socket);
        });
        socket.once('error', failed);
      });
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if ((code !== 'ECONNREFUSED' && code !== 'EHOSTUNREACH') || Date.now() > until) {
        throw new AsbError('Unavailable', `cannot reach the sandbox's init at ${addr.host}:${String(addr.port)}: ${(err as Error).message}`);
      }
      await delay(CONNECT_STEP_MS);
    }
  }
}

const SIGNAL_NAMES = new Map(Object.entries(constants.signals).map(([name, n]) => [n, name as NodeJS.Signals]));

export interface AgentEnd {
  exitCode: number;
  signal?: NodeJS.Signals;
}

interface StreamEvents {
  started(pid: number): void;
  failed(message: string): void;
  stdout(bytes: Buffer): void;
  stderr(bytes: Buffer): void;
  ended(end: AgentEnd): void;
}

/**
 * One process's connection, kept across a pause: a drop while the pod is suspended waits for
 * AgentLink.resume, which attaches again by pid; a drop while it runs is tried again a few times.
 */
class AgentStream {
  readonly #link: AgentLink;
  readonly #events: StreamEvents;
  #socket: Socket | undefined;
  #pid: number | undefined;
  #done = false;
  /** Frames for the process written while no connection was up (stdin, signals): sent on reattach. */
  #queued: Buffer[] = [];
  #paused = false;
  /** The request, and the frames sent after it before the agent named the process: sent again on a retry. */
  #request: Buffer | undefined;
  #unconfirmed: Buffer[] = [];
  #unanswered = 0;

  constructor(link: AgentLink, events: StreamEvents) {
    this.#link = link;
    this.#events = events;
  }

  get pid(): number | undefined {
    return this.#pid;
  }

  async open(req: AgentRequest): Promise<void> {
    this.#link.add(this);
    try {
      this.#request = requestFrame(this.#link.address.token, req);
      this.#bind(await dial(this.#link.address), this.#request);
    } catch (err) {
      this.#link.delete(this);
      throw err;
    }
  }

  /** Attaches again by pid (after a restore, or a dropped connection). */
  async reattach(): Promise<void> {
    if (this.#done || this.#pid === undefined || this.#socket !== undefined) return;
    this.#bind(await dial(this.#link.address), requestFrame(this.#link.address.token, { attach: this.#pid }));
  }

  #bind(socket: Socket, request: Buffer): void {
    this.#socket = socket;
    if (this.#paused) socket.pause();
    socket.write(request);
    for (const f of this.#queued) socket.write(f);
    if (this.#request !== undefined) this.#unconfirmed.push(...this.#queued);
    this.#queued = [];
    let sawEnd = false;
    socket.on('data', frameReader((f) => {
      switch (f.type) {
        case 'P': {
          const first = this.#pid === undefined;
          this.#pid = f.payload.readUInt32BE(0);
          this.#request = undefined;
          this.#unconfirmed = [];
          if (first) this.#events.started(this.#pid);
          break;
        }
        case 'F':
          sawEnd = true;
          // An attach that finds no process: it ended and its end was lost (more than the agent keeps).
          if (this.#pid === undefined) this.#events.failed(f.payload.toString('utf8'));
          this.#finish({ exitCode: START_FAILED_CODE });
          break;
        case 'O': this.#events.stdout(Buffer.from(f.payload)); break;
        case 'R': this.#events.stderr(Buffer.from(f.payload)); break;
        case 'X': {
          sawEnd = true;
          const exitCode = f.payload.readUInt32BE(0);
          const signal = SIGNAL_NAMES.get(f.payload[4] ?? 0);
          this.#finish(signal === undefined || f.payload[4] === 0 ? { exitCode } : { exitCode, signal });
          break;
        }
      }
    }));
    socket.on('error', () => undefined); // 'close' follows
    socket.on('close', () => {
      if (this.#socket !== socket) return; // detached: a new connection may be up already
      this.#socket = undefined;
      if (sawEnd || this.#done) return;
      if (this.#pid === undefined) {
        // Closed before a word: the request was not taken. Asked again, then a wrong token or an agent that went away.
        if (this.#request !== undefined && this.#unanswered < UNANSWERED_TRIES) {
          this.#unanswered++;
          void this.#askAgain(this.#request);
          return;
        }
        this.#events.failed('the sandbox\'s init closed the connection');
        this.#finish({ exitCode: START_FAILED_CODE });
        return;
      }
      this.#link.dropped(this);
    });
  }

  /** The request again on a new connection, with what was sent after it. */
  async #askAgain(request: Buffer): Promise<void> {
    this.#queued = [...this.#unconfirmed, ...this.#queued];
    this.#unconfirmed = [];
    try {
      await delay(50);
      if (this.#done) return;
      this.#bind(await dial(this.#link.address), request);
    } catch (err) {
      this.#events.failed(err instanceof Error ? err.message : String(err));
      this.#finish({ exitCode: START_FAILED_CODE });
    }
  }

  send(f: Buffer): void {
    if (this.#done) return;
    if (this.#socket === undefined) {
      this.#queued.push(f);
      return;
    }
    this.#socket.write(f);
    if (this.#request !== undefined) this.#unconfirmed.push(f);
  }

  /** Stops reading the process's output (the agent then stops reading its pipes: backpressure). */
  pause(): void {
    this.#paused = true;
    this.#socket?.pause();
  }

  resume(): void {
    this.#paused = false;
    this.#socket?.resume();
  }

  #finish(end: AgentEnd): void {
    if (this.#done) return;
    this.#done = true;
    this.#link.delete(this);
    this.#socket?.end();
    this.#events.ended(end);
  }

  /**
   * Drops the connection and keeps the process: a checkpoint is coming, whose restore a connection
   * from outside does not survive (it could look open long after, and swallow what is written).
   */
  detach(): void {
    const socket = this.#socket;
    this.#socket = undefined;
    socket?.destroy();
  }

  /** The pod ended (or was stopped without its memory): the process is gone with it. */
  lost(end: AgentEnd): void {
    this.#socket?.destroy();
    this.#finish(end);
  }
}

/**
 * One running pod's agent and the processes started through it. The runtime suspends it before a
 * checkpoint (dropped connections then wait), resumes it once the pod runs again (each process is
 * attached again by pid) and ends it when the pod ends.
 */
export class AgentLink {
  #address: AgentAddress;
  #suspended = false;
  readonly #streams = new Set<AgentStream>();

  constructor(address: AgentAddress) {
    this.#address = address;
  }

  get address(): AgentAddress {
    return this.#address;
  }

  add(s: AgentStream): void {
    this.#streams.add(s);
  }

  delete(s: AgentStream): void {
    this.#streams.delete(s);
  }

  /** How many processes started through the agent are still followed. */
  get size(): number {
    return this.#streams.size;
  }

  dropped(s: AgentStream): void {
    if (this.#suspended) return; // resume() attaches it again
    void (async () => {
      for (let i = 0; i < REATTACH_TRIES && !this.#suspended; i++) {
        try {
          await s.reattach();
          return;
        } catch {
          await delay(100 * (i + 1));
        }
      }
      if (!this.#suspended) s.lost({ exitCode: START_FAILED_CODE });
    })();
  }

  /** A checkpoint is about to drop every connection: processes wait for resume() or end(). */
  suspend(): void {
    this.#suspended = true;
    for (const s of this.#streams) s.detach();
  }

  /** The pod runs again with its memory (maybe at a new address): every process is attached again. */
  async resume(address: AgentAddress = this.#address): Promise<void> {
    this.#address = address;
    this.#suspended = false;
    await Promise.all([...this.#streams].map((s) => s.reattach().catch(() => s.lost({ exitCode: START_FAILED_CODE }))));
  }

  /** The pod's processes are gone (it ended, or stopped without its memory): each ends as killed. */
  end(): void {
    this.#suspended = false;
    for (const s of [...this.#streams]) s.lost({ exitCode: 128 + constants.signals.SIGKILL, signal: 'SIGKILL' });
  }
}

// ---- exec, spawn, terminals

export function agentExec(link: AgentLink, req: AgentRequest, opts: Pick<ExecRequest, 'stdin' | 'timeoutMs' | 'maxOutputBytes'>): Promise<ExecResult> {
  const max = opts.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
  const stdout = new CappedBuffer(max);
  const stderr = new CappedBuffer(max);
  let timedOut = false;
  let timer: NodeJS.Timeout | undefined;
  return new Promise<ExecResult>((resolve, reject) => {
    const stream: AgentStream = new AgentStream(link, {
      started: () => {
        if (opts.timeoutMs !== undefined) {
          timer = setTimeout(() => {
            timedOut = true;
            stream.send(frame('K', Uint8Array.of(constants.signals.SIGKILL)));
          }, opts.timeoutMs);
        }
      },
      failed: (message) => {
        stderr.push(Buffer.from(`${message}\n`));
      },
      stdout: (b) => stdout.push(b),
      stderr: (b) => stderr.push(b),
      ended: (end) => {
        clearTimeout(timer);
        const result: ExecResult = { exitCode: end.exitCode, stdout: stdout.bytes(), stderr: stderr.bytes(), timedOut, truncated: stdout.truncated || stderr.truncated };
        if (end.signal !== undefined) result.signal = end.signal;
        resolve(result);
      },
    });
    stream.open(req).then(() => {
      if (opts.stdin !== undefined) stream.send(frame('I', typeof opts.stdin === 'string' ? Buffer.from(opts.stdin) : opts.stdin));
      stream.send(frame('E'));
    }, reject);
  });
}

export function agentSpawn(link: AgentLink, req: AgentRequest): Promise<PodProcess> {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  let resolveEnd: (end: { exitCode: number; signal?: string }) => void = () => undefined;
  const exited = new Promise<{ exitCode: number; signal?: string }>((resolve) => (resolveEnd = resolve));
  return new Promise<PodProcess>((resolve, reject) => {
    let stream: AgentStream | undefined = undefined;
    // Writes go out as frames; end() is the end of stdin. Backpressure is the socket's.
    const stdin = new PassThrough();
    stdin.on('data', (chunk: Buffer) => stream?.send(frame('I', chunk)));
    stdin.on('end', () => stream?.send(frame('E')));
    stdin.pause();
    const handle: PodProcess = {
      stdin, stdout, stderr, exited,
      kill: (signal) => stream?.send(frame('K', Uint8Array.of(constants.signals[signal]))),
    };
    stream = new AgentStream(link, {
      started: () => {
        stdin.resume();
        resolve(handle);
      },
      failed: (message) => {
        // As runc exec did: the process "ran" and said why it could not start, with 255.
        stderr.write(`${message}\n`);
        resolve(handle);
      },
      stdout: (b) => {
        if (!stdout.write(b)) stream?.pause();
      },
      stderr: (b) => {
        if (!stderr.write(b)) stream?.pause();
      },
      ended: (end) => {
        stdout.end();
        stderr.end();
        resolveEnd(end.signal === undefined ? { exitCode: end.exitCode } : { exitCode: end.exitCode, signal: end.signal });
      },
    });
    const flow = (): void => {
      if (stdout.writableLength === 0 && stderr.writableLength === 0) stream.resume();
    };
    stdout.on('drain', flow);
    stderr.on('drain', flow);
    stream.open(req).catch(reject);
  });
}

/** After close(): how long a hung-up terminal has before it is killed (as the runc terminal did). */
const HANGUP_GRACE_MS = 2000;
/** Terminal output held for a reader that does not read: beyond it the agent stops reading the terminal. */
const PTY_HIGH_WATER = 256 * 1024;

export function agentPty(link: AgentLink, req: AgentRequest & { pty: { cols: number; rows: number } }, id: string): Promise<PtySession> {
  const chunks: Uint8Array[] = [];
  let held = 0;
  let wake: (() => void) | undefined;
  let ended = false;
  let resolveExit: (code: number) => void = () => undefined;
  const exited = new Promise<number>((resolve) => (resolveExit = resolve));
  return new Promise<PtySession>((resolve, reject) => {
    let closed = false;
    const stream = new AgentStream(link, {
      started: () => resolve(session),
      failed: (message) => reject(new AsbError('BadRequest', `cannot start the terminal's command in container ${id}: ${message}`, { fields: [{ field: 'command', message }] })),
      stdout: (b) => {
        chunks.push(new Uint8Array(b));
        held += b.length;
        if (held > PTY_HIGH_WATER) stream.pause();
        wake?.();
      },
      stderr: () => undefined,
      ended: (end) => {
        ended = true;
        wake?.();
        resolveExit(end.exitCode);
      },
    });
    const output = (async function* () {
      for (;;) {
        const next = chunks.shift();
        if (next !== undefined) {
          held -= next.length;
          if (held <= PTY_HIGH_WATER / 2) stream.resume();
          yield next;
          continue;
        }
        if (ended) return;
        await new Promise<void>((r) => (wake = r));
        wake = undefined;
      }
    })();
    const session: PtySession = {
      write: (data) => {
        stream.send(frame('I', typeof data === 'string' ? Buffer.from(data, 'utf8') : data));
        return Promise.resolve();
      },
      resize(cols, rows) {
        const size = Buffer.alloc(4);
        size.writeUInt16BE(Math.max(1, Math.min(cols, 65535)), 0);
        size.writeUInt16BE(Math.max(1, Math.min(rows, 65535)), 2);
        stream.send(frame('W', size));
      },
      output,
      exited,
      close() {
        if (closed) return;
        closed = true;
        stream.send(frame('K', Uint8Array.of(constants.signals.SIGHUP)));
        const timer = setTimeout(() => stream.send(frame('K', Uint8Array.of(constants.signals.SIGKILL))), HANGUP_GRACE_MS);
        timer.unref();
        void exited.then(() => clearTimeout(timer));
      },
    };
    stream.open(req).catch(reject);
  });
}

/** The request for a PodProcess-style call: who runs it (the pod's user unless `user`), where and with what. */
export function agentRequest(target: ProcessOwner & { env: Record<string, string>; cwd: string }, req: SpawnRequest | PtyOptions, pty?: { cols: number; rows: number }): AgentRequest {
  const { uid, gid, groups } = processUser(target, req);
  const env: Record<string, string> = { ...target.env, ...req.env };
  // A user other than the pod's gets its own HOME unless the caller set one (as runc exec did).
  if (uid !== target.uid && req.env?.HOME === undefined) env.HOME = uid === 0 ? '/root' : '/';
  return {
    uid, gid, ...(groups.length === 0 ? {} : { groups }), cwd: req.cwd ?? target.cwd,
    command: req.command ?? [],
    env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
    ...(pty === undefined ? {} : { pty }),
  };
}

/** The pod's own user: who its processes are unless a request names another. */
export interface ProcessOwner {
  uid: number;
  gid: number;
  /** The pod's supplementary groups (its image user's, from /etc/group). */
  groups?: readonly number[];
}

/**
 * Who a started process is: the request's uid, group and groups; the pod's group and groups for the
 * pod's own uid when the request names none; else the uid as its gid and no groups.
 */
export function processUser(owner: ProcessOwner, req: { user?: number; group?: number; groups?: readonly number[] }): { uid: number; gid: number; groups: readonly number[] } {
  const uid = req.user ?? owner.uid;
  const own = uid === owner.uid && req.group === undefined;
  return { uid, gid: req.group ?? (own ? owner.gid : uid), groups: req.groups ?? (own ? owner.groups ?? [] : []) };
}
