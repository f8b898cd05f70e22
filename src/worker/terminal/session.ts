// One terminal session: a WebSocket joined to a PTY inside a sandbox, per src/terminal/contract.ts.
//
// Backpressure, both ways:
// - out: PTY output is pulled (runtime PtySession.output) and the next chunk is pulled only once
//   the socket holds less than TERMINAL_HIGH_WATER_BYTES; past the mark we wait for the send that
//   crossed it to reach the kernel. A client that stops reading therefore stalls the pull, the
//   bridge's pipe fills, the PTY fills and the program in it blocks: worker memory stays bounded
//   by the high-water mark plus the socket and pipe buffers (a few hundred KiB per session).
// - in: each binary frame is written to the PTY; while a write is pending the socket is paused,
//   so a client pasting faster than the shell reads fills its own TCP window, not our heap.
//
// A session ends exactly once, with one reason (counted by the endpoint): exit (the program
// ended: `exit` frame, then close 1000), client (the client closed or the socket failed), idle,
// sandboxGone, shutdown, protocol (a bad control frame), error (the PTY failed), revoked (the API
// key that opened it was revoked: the PTY is hung up at once, so input still in flight runs nothing).
import { WebSocket, type RawData } from 'ws';
import { TERMINAL_CLOSE, TERMINAL_HIGH_WATER_BYTES, type TerminalServerControl } from '../../terminal/contract.ts';
import type { PtySession } from '../../runtime/runtime.ts';
import type { Clock, Timer } from '../../base/clock.ts';
import type { Logger } from '../../base/log.ts';

export type TerminalEndReason = 'exit' | 'client' | 'idle' | 'sandboxGone' | 'shutdown' | 'protocol' | 'error' | 'revoked';

/** A close handshake the client does not finish within this long is cut (terminate). */
const CLOSE_GRACE_MS = 2000;
/** Activity (which holds off idle hibernation) is reported at most this often per session. */
const ACTIVITY_EVERY_MS = 1000;
/** Terminal sizes the protocol accepts (contract: 1-1000). */
export const MAX_TERMINAL_DIMENSION = 1000;

export interface TerminalSessionOptions {
  ws: WebSocket;
  pty: PtySession;
  sandboxId: string;
  /** The prefix of the API key that opened the session, itself or through a terminal token. */
  keyPrefix: string;
  cluster: string;
  idleMs: number;
  clock: Clock;
  log: Logger;
  /** The sandbox was used (input or output), throttled to once a second. */
  onActivity: () => void;
  /**
   * Whether the sandbox is still meant to run. Asked when the program ends: a pause or delete
   * kills the PTY before the pod's state changes, and that is sandboxGone, not an exit.
   */
  stillRunning: () => Promise<boolean>;
  /** Called once, when the session has ended. */
  onEnd: (reason: TerminalEndReason) => void;
}

export class TerminalSession {
  readonly sandboxId: string;
  readonly keyPrefix: string;
  readonly #o: TerminalSessionOptions;
  #ended = false;
  #lastFrame: number;
  #lastActivity = 0;
  #idleTimer: Timer | undefined;
  #pendingWrites = 0;

  constructor(opts: TerminalSessionOptions) {
    this.#o = opts;
    this.sandboxId = opts.sandboxId;
    this.keyPrefix = opts.keyPrefix;
    this.#lastFrame = opts.clock.now();
  }

  /** Sends `ready` and starts both directions. */
  start(): void {
    const { ws } = this.#o;
    ws.on('message', (data, isBinary) => this.#onMessage(data, isBinary));
    ws.on('close', () => this.end('client'));
    ws.on('error', (err) => {
      this.#o.log.debug({ err }, 'terminal socket error');
      this.end('client');
    });
    this.#control({ type: 'ready', sandboxId: this.#o.sandboxId, cluster: this.#o.cluster });
    this.#armIdle(this.#o.idleMs);
    this.#pumpOutput().catch((err: unknown) => {
      this.#o.log.warn({ err }, 'terminal output failed');
      this.end('error');
    });
  }

  /** Ends the session (idempotent): closes the socket with the reason's code and hangs up the PTY. */
  end(reason: TerminalEndReason, detail?: string): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#idleTimer?.cancel();
    this.#o.pty.close();
    const { ws } = this.#o;
    if (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING) {
      ws.close(closeCode(reason), (detail ?? defaultDetail(reason)).slice(0, 120));
      const cut = this.#o.clock.after(CLOSE_GRACE_MS, () => ws.terminate());
      ws.once('close', () => cut.cancel());
    }
    this.#o.onEnd(reason);
  }

  get ended(): boolean {
    return this.#ended;
  }

  async #pumpOutput(): Promise<void> {
    const { pty, ws } = this.#o;
    for await (const chunk of pty.output) {
      if (this.#ended) return;
      this.#seen();
      await this.#send(chunk);
    }
    const code = await pty.exited;
    if (this.#ended || ws.readyState !== WebSocket.OPEN) return;
    if (!(await this.#o.stillRunning())) {
      this.end('sandboxGone');
      return;
    }
    // The client may have closed while the store was read (a getter: not narrowed by the check above).
    if (this.ended) return;
    this.#control({ type: 'exit', code });
    this.end('exit');
  }

  /** Sends a chunk; resolves at once under the high-water mark, else when this chunk has reached the kernel. */
  #send(chunk: Uint8Array): Promise<void> {
    const { ws } = this.#o;
    if (ws.readyState !== WebSocket.OPEN) return Promise.resolve();
    if (ws.bufferedAmount + chunk.byteLength <= TERMINAL_HIGH_WATER_BYTES) {
      ws.send(chunk, { binary: true });
      return Promise.resolve();
    }
    // The callback also runs (with an error) when the socket dies, so this never hangs.
    return new Promise<void>((resolve) => ws.send(chunk, { binary: true }, () => resolve()));
  }

  #control(msg: TerminalServerControl): void {
    this.#o.ws.send(JSON.stringify(msg));
  }

  #onMessage(data: RawData, isBinary: boolean): void {
    if (this.#ended) return;
    this.#seen();
    if (!isBinary) {
      this.#onControl(rawText(data));
      return;
    }
    const { ws, pty } = this.#o;
    this.#pendingWrites++;
    if (this.#pendingWrites === 1) ws.pause();
    pty.write(rawBytes(data)).then(
      () => {
        this.#pendingWrites--;
        if (this.#pendingWrites === 0 && !this.#ended) ws.resume();
      },
      // The PTY is gone (the program exited): its output ending reports the exit.
      () => {
        this.#pendingWrites--;
      },
    );
  }

  #onControl(text: string): void {
    let msg: unknown;
    try {
      msg = JSON.parse(text);
    } catch {
      this.end('protocol', 'a text frame must be a JSON control message');
      return;
    }
    const m = (typeof msg === 'object' && msg !== null ? msg : {}) as Record<string, unknown>;
    if (m.type !== 'resize') {
      this.end('protocol', `unknown control message type ${JSON.stringify(m.type ?? null)}; only "resize" is sent by clients`);
      return;
    }
    if (!isDimension(m.cols) || !isDimension(m.rows)) {
      this.end('protocol', `resize needs integer cols and rows from 1 to ${MAX_TERMINAL_DIMENSION}`);
      return;
    }
    this.#o.pty.resize(m.cols, m.rows);
  }

  /** A frame went either way: the session is not idle, and the sandbox is in use. */
  #seen(): void {
    const now = this.#o.clock.now();
    this.#lastFrame = now;
    if (now - this.#lastActivity >= ACTIVITY_EVERY_MS) {
      this.#lastActivity = now;
      this.#o.onActivity();
    }
  }

  // One timer per session, re-armed only when it fires: a busy session (`yes`) sends thousands of
  // frames a second, and re-arming on each would be most of its cost.
  #armIdle(ms: number): void {
    this.#idleTimer = this.#o.clock.after(ms, () => {
      if (this.#ended) return;
      const quiet = this.#o.clock.now() - this.#lastFrame;
      if (quiet >= this.#o.idleMs) this.end('idle');
      else this.#armIdle(this.#o.idleMs - quiet);
    });
  }
}

export function isDimension(value: unknown): value is number {
  return typeof value === 'number' && Number.isInteger(value) && value >= 1 && value <= MAX_TERMINAL_DIMENSION;
}

function closeCode(reason: TerminalEndReason): number {
  switch (reason) {
    case 'exit':
    case 'client':
      return TERMINAL_CLOSE.normal;
    case 'idle':
      return TERMINAL_CLOSE.idle;
    case 'sandboxGone':
      return TERMINAL_CLOSE.sandboxGone;
    case 'shutdown':
      return TERMINAL_CLOSE.goingAway;
    case 'protocol':
      return TERMINAL_CLOSE.protocolError;
    case 'error':
      return TERMINAL_CLOSE.internal;
    case 'revoked':
      return TERMINAL_CLOSE.keyRevoked;
  }
}

function defaultDetail(reason: TerminalEndReason): string {
  switch (reason) {
    case 'exit':
      return 'the program exited';
    case 'client':
      return '';
    case 'idle':
      return 'idle timeout: no input or output';
    case 'sandboxGone':
      return 'the sandbox stopped (hibernated or deleted)';
    case 'shutdown':
      return 'the worker is shutting down';
    case 'protocol':
      return 'protocol error';
    case 'error':
      return 'the terminal failed; the worker log has the details';
    case 'revoked':
      return 'the API key that opened this terminal was revoked';
  }
}

function rawBytes(data: RawData): Uint8Array {
  if (Array.isArray(data)) return Buffer.concat(data);
  return data instanceof ArrayBuffer ? new Uint8Array(data) : data;
}

function rawText(data: RawData): string {
  return Buffer.from(rawBytes(data)).toString('utf8');
}
