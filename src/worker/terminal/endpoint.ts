// The worker's terminal endpoint: GET /v1/sandboxes/{id}/terminal with Upgrade: websocket, per
// src/terminal/contract.ts. Everything that can be refused is refused before the upgrade, as an
// ordinary problem+json answer: auth (API key header, or a single-use terminal token in
// ?token=), visibility (the same rule as GET /v1/sandboxes/{id}: another team's sandbox is 404),
// 409 when the sandbox is not running, 400 for a bad size or command, 500 when the PTY cannot be
// opened. Only then is the socket upgraded and a TerminalSession (session.ts) started.
//
// The endpoint watches the runtime: when a sandbox with open sessions leaves Running (hibernated,
// deleted, crashed), its sessions close with sandboxGone. It watches the key ring too: each session
// remembers the prefix of the API key that opened it (its header, or the key a terminal token was
// issued to), and when that key is revoked the session closes with keyRevoked (4003) and its PTY is
// hung up; a token whose key was revoked opens nothing. A revocation at the hub reaches the
// worker's key ring within the sync bound (3 heartbeats). close() ends every session with
// goingAway (worker shutdown).
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { Counter, Gauge, type Registry } from 'prom-client';
import { WebSocketServer } from 'ws';
import { LABEL, wantsRunning, type Sandbox } from '../../api/types.ts';
import { AsbError } from '../../errors.ts';
import type { PtyOptions } from '../../runtime/runtime.ts';
import { TERMINAL_PATH_SUFFIX } from '../../terminal/contract.ts';
import { canSee, sandboxNotFound } from '../access.ts';
import { isObjectName } from '../../api/names.ts';
import type { WorkerContext } from '../deps.ts';
import type { Authenticator } from '../../auth/keyring.ts';
import { AUTH_HINT, presentedKey } from '../../http/presented-key.ts';
import { refuseUpgrade, toAsbError } from '../../http/problem.ts';
import { isDimension, MAX_TERMINAL_DIMENSION, TerminalSession, type TerminalEndReason } from './session.ts';
import type { TerminalTokens } from './token.ts';

/** Default idle timeout: 15 minutes with no frame either way. */
export const DEFAULT_TERMINAL_IDLE_MS = 15 * 60 * 1000;
// Typed input and pastes; a larger frame is not a person typing.
const MAX_INBOUND_FRAME_BYTES = 1024 * 1024;
const MAX_COMMAND_ARGS = 256;
const MAX_COMMAND_ARG_CHARS = 4096;
const DEFAULT_SIZE = { cols: 80, rows: 24 } as const;
const PATH_PATTERN = new RegExp(`^/v1/sandboxes/([^/]+)${TERMINAL_PATH_SUFFIX}$`);

export interface TerminalEndpointOptions {
  w: WorkerContext;
  auth: Authenticator;
  tokens: TerminalTokens;
  /** Close a session after this long with no frame either way. */
  idleMs: number;
  registry?: Registry;
}

interface TerminalMetrics {
  open: Gauge;
  ended: Counter;
}

function terminalMetrics(registry: Registry | undefined): TerminalMetrics | undefined {
  if (registry === undefined) return undefined;
  // Several worker servers may share one registry (tests): reuse a metric already registered.
  const open = registry.getSingleMetric('asb_terminal_sessions');
  const ended = registry.getSingleMetric('asb_terminal_sessions_total');
  return {
    open: open instanceof Gauge ? open : new Gauge({ name: 'asb_terminal_sessions', help: 'Terminal sessions open on this worker', registers: [registry] }),
    ended:
      ended instanceof Counter
        ? ended
        : new Counter({
            name: 'asb_terminal_sessions_total',
            help: 'Terminal sessions ended, by reason (exit, client, idle, sandboxGone, shutdown, protocol, error, revoked)',
            labelNames: ['reason'],
            registers: [registry],
          }),
  };
}

/** The sandbox id in a terminal path, or undefined when the path is not one. */
export function terminalPathId(path: string): string | undefined {
  const m = PATH_PATTERN.exec(path);
  if (m?.[1] === undefined) return undefined;
  try {
    return decodeURIComponent(m[1]);
  } catch {
    return undefined;
  }
}

export class TerminalEndpoint {
  readonly #o: TerminalEndpointOptions;
  readonly #wss = new WebSocketServer({ noServer: true, maxPayload: MAX_INBOUND_FRAME_BYTES });
  readonly #metrics: TerminalMetrics | undefined;
  /** sandbox id → its open sessions. */
  readonly #sessions = new Map<string, Set<TerminalSession>>();
  readonly #unwatch: () => void;
  readonly #unwatchKeys: () => void;
  #closed = false;

  constructor(opts: TerminalEndpointOptions) {
    this.#o = opts;
    this.#metrics = terminalMetrics(opts.registry);
    this.#unwatch = opts.w.runtime.onChange((id) => this.#podChanged(id));
    this.#unwatchKeys = opts.auth.onRevoked((prefix) => this.#keyRevoked(prefix));
  }

  /** After close(): new sessions are refused. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Open sessions. */
  get size(): number {
    let n = 0;
    for (const set of this.#sessions.values()) n += set.size;
    return n;
  }

  /** The node:http 'upgrade' listener for terminal paths. */
  handle(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    socket.on('error', (err) => this.#o.w.log.debug({ err }, 'terminal upgrade socket error'));
    this.#open(req, socket, head).catch((err: unknown) => {
      const problem = toAsbError(err);
      if (problem.code === 'Internal') this.#o.w.log.error({ err, url: req.url }, 'terminal open failed');
      if (!socket.destroyed) refuseUpgrade(socket, problem);
    });
  }

  /** Ends every session with goingAway; refuses new ones. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#unwatch();
    this.#unwatchKeys();
    for (const set of this.#sessions.values()) for (const s of [...set]) s.end('shutdown');
    this.#wss.close();
  }

  async #open(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const { w } = this.#o;
    if (this.#closed) throw new AsbError('Unavailable', 'the worker is shutting down; retry shortly');
    if (req.method !== 'GET') throw new AsbError('MethodNotAllowed', `${req.method ?? ''} is not allowed on a terminal; use GET with Upgrade: websocket`);
    const url = new URL(req.url ?? '/', 'http://worker.invalid');
    const id = terminalPathId(url.pathname) ?? '';
    const { may, keyPrefix } = this.#authenticate(req, url, id);
    const ptyOpts = ptyOptions(url.searchParams);
    if (!isObjectName(id)) throw sandboxNotFound(id);
    const sandbox = await w.index.find(id, [w.defaultNamespace]);
    if (sandbox === undefined || !may(sandbox)) throw sandboxNotFound(id);
    if (w.runtime.state(id).phase !== 'Running') {
      throw new AsbError('SandboxNotRunning', `sandbox "${id}" is not running (hibernated, starting or stopped); resume it with POST /v1/sandboxes/${id}/resume and open the terminal again`);
    }
    const pty = await w.runtime.openPty(id, ptyOpts);
    // The client may have gone, or the worker started closing, while the PTY opened.
    if (this.closed || socket.destroyed) {
      pty.close();
      if (!socket.destroyed) refuseUpgrade(socket, new AsbError('Unavailable', 'the worker is shutting down; retry shortly'));
      return;
    }
    w.operator.activity.touch(id);
    this.#wss.handleUpgrade(req, socket, head, (ws) => {
      const session = new TerminalSession({
        ws,
        pty,
        sandboxId: id,
        keyPrefix,
        cluster: w.cluster.name,
        idleMs: this.#o.idleMs,
        clock: w.clock,
        log: w.log.child({ component: 'terminal', sandbox: id }),
        onActivity: () => w.operator.activity.touch(id),
        stillRunning: () => this.#stillRunning(id),
        onEnd: (reason) => this.#ended(session, reason),
      });
      let set = this.#sessions.get(id);
      if (set === undefined) this.#sessions.set(id, (set = new Set()));
      set.add(session);
      this.#metrics?.open.inc();
      session.start();
      // It may have stopped, or its key been revoked, between the checks and now (the session is
      // registered above, so a revocation from here on finds it).
      if (w.runtime.state(id).phase !== 'Running') session.end('sandboxGone');
      else if (!this.#o.auth.live(keyPrefix)) session.end('revoked');
    });
  }

  /**
   * Who is asking, as a check on the sandbox (an API key's visibility, or a token's owner team) and
   * the prefix of the key behind it. 401 when neither holds, or the token's key was revoked.
   */
  #authenticate(req: IncomingMessage, url: URL, id: string): { may: (sandbox: Sandbox) => boolean; keyPrefix: string } {
    const key = presentedKey(req);
    if (key !== undefined) {
      const principal = this.#o.auth.verify(key);
      if (principal === undefined) throw new AsbError('Unauthorized', `the API key is unknown to the worker or revoked (or not of the form asb_<8 chars>_<32 chars>); ${AUTH_HINT}`);
      return { may: (sandbox) => canSee(principal, sandbox), keyPrefix: principal.prefix };
    }
    const token = url.searchParams.get('token');
    if (token === null || token === '') throw new AsbError('Unauthorized', `no API key or terminal token: ${AUTH_HINT}, or open the terminal with ?token= from POST /v1/sandboxes/{id}/terminal-tokens`);
    const claims = this.#o.tokens.redeem(token, id);
    if (!this.#o.auth.live(claims.keyPrefix)) {
      throw new AsbError('Unauthorized', `terminal token refused: the API key it was issued to (${claims.keyPrefix}) is revoked; get a new one with POST /v1/sandboxes/{id}/terminal-tokens`);
    }
    // The token names the team that owned the sandbox when it was issued; it must still.
    return { may: (sandbox) => (sandbox.metadata.labels?.[LABEL.owner] ?? '') === claims.team, keyPrefix: claims.keyPrefix };
  }

  async #stillRunning(id: string): Promise<boolean> {
    const { w } = this.#o;
    if (w.runtime.state(id).phase !== 'Running') return false;
    const sandbox = await w.index.find(id, [w.defaultNamespace]);
    return sandbox !== undefined && sandbox.metadata.deletionTimestamp === undefined && wantsRunning(sandbox.spec);
  }

  #ended(session: TerminalSession, reason: TerminalEndReason): void {
    const set = this.#sessions.get(session.sandboxId);
    if (set?.delete(session) === true) {
      this.#metrics?.open.dec();
      if (set.size === 0) this.#sessions.delete(session.sandboxId);
    }
    this.#metrics?.ended.inc({ reason });
  }

  #keyRevoked(prefix: string): void {
    for (const set of this.#sessions.values()) {
      for (const s of [...set]) if (s.keyPrefix === prefix) s.end('revoked');
    }
  }

  #podChanged(id: string): void {
    const set = this.#sessions.get(id);
    if (set === undefined || this.#o.w.runtime.state(id).phase === 'Running') return;
    for (const s of [...set]) s.end('sandboxGone');
  }
}

/** cols, rows (default 80×24) and command (repeated; default the sandbox's shell) from the query. */
export function ptyOptions(query: URLSearchParams): PtyOptions {
  const dim = (name: 'cols' | 'rows'): number => {
    const text = query.get(name);
    if (text === null) return DEFAULT_SIZE[name];
    const value = /^\d{1,4}$/.test(text) ? Number(text) : NaN;
    if (!isDimension(value)) {
      const message = `must be an integer from 1 to ${MAX_TERMINAL_DIMENSION}, got "${text.slice(0, 20)}"`;
      throw new AsbError('BadRequest', `query parameter ${name} ${message}`, { fields: [{ field: name, message }] });
    }
    return value;
  };
  const opts: PtyOptions = { cols: dim('cols'), rows: dim('rows') };
  const command = query.getAll('command');
  if (command.length > 0) {
    const bad = (message: string): AsbError => new AsbError('BadRequest', `query parameter command ${message}`, { fields: [{ field: 'command', message }] });
    if (command.length > MAX_COMMAND_ARGS) throw bad(`has ${command.length} arguments; at most ${MAX_COMMAND_ARGS}`);
    if (command[0] === '') throw bad('must start with a program name (the first command= is empty)');
    if (command.some((a) => a.includes('\0') || a.length > MAX_COMMAND_ARG_CHARS)) throw bad(`arguments must have no NUL byte and at most ${MAX_COMMAND_ARG_CHARS} characters`);
    opts.command = command;
  }
  return opts;
}
