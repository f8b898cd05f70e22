// The wire to asb-init's agent (asb-init.c has the protocol): frames, a connection per process
// dialled with retries (the agent listens a moment after the pod's init starts), and the link of
// one running pod that keeps its processes' streams across a pause.
//
// A connection that drops while its process runs (a pause with memory drops every connection from
// outside) leaves the process running in the pod; the handle here waits, and the runtime either
// reattaches it by pid once the pod runs again (AgentLink.resume) or ends it when the pod ended
// (AgentLink.end).
import { connect, type Socket } from 'node:net';
import { constants } from 'node:os';
import { AsbError } from '../../errors.ts';

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
 * A request's connection closed before the agent said a word (no pid, no refusal): asked again
 * this many times, 50 ms apart, before the call fails; a wrong token (a pod that is not the one
 * asked for) closes every try the same way and still fails. The agent names a process before
 * anything else, but the words can be lost here: a write that reaches the agent after it closed
 * the connection (the process ended at once) is answered with a reset, and the failed write
 * destroys the socket before its unread answer is read. So a call whose frames are known at the
 * start (an exec's stdin and its end) sends them in the request's own write (agentExec).
 */
const UNANSWERED_TRIES = 2;

export interface AgentAddress {
  host: string;
  port: number;
  token: string;
}

export function frame(type: string, payload: Uint8Array = new Uint8Array(0)): Buffer {
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

export interface StreamEvents {
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
export class AgentStream {
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
    // One write: what was queued goes out with the request, before the agent can have answered.
    socket.write(this.#queued.length === 0 ? request : Buffer.concat([request, ...this.#queued]));
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
