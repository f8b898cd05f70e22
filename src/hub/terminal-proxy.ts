// The hub's terminal proxy (src/terminal/contract.ts): a `GET /v1/sandboxes/{id}/terminal`
// upgrade at the hub opens the same path, with the same query and credential, at the worker of
// the cluster that owns the id, and relays frames both ways as they came (binary stays binary,
// text stays text; close codes and reasons pass through).
//
// The worker is asked first and the client accepted only once the worker accepted, so a refusal
// (401 bad token, 404, 409 not running, 400 bad size) reaches the client as the same HTTP status
// and body. A key in the Authorization header is checked at the hub first (401 without asking a
// worker); a `?token=` is the worker's to check (it issued it).
//
// Revocation: a session opened with a key in the header is closed here, with the worker's close
// code for it (TERMINAL_CLOSE.keyRevoked), the moment the hub's key ring drops the key, without
// waiting for the worker to hear of it through sync. A session opened with ?token= is the
// worker's to close (the token names its key); the close passes through the relay.
//
// Backpressure: a side is paused (no reads from its socket) while the other side has more than
// TERMINAL_HIGH_WATER_BYTES waiting to be sent, and resumed when a send completes under the mark,
// so a stalled browser stalls the shell's output at the worker instead of growing the hub.
import { STATUS_CODES, type IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocket, WebSocketServer, type RawData } from 'ws';
import type { Principal } from '../auth/keyring.ts';
import { AsbError } from '../errors.ts';
import type { ObjectStore } from '../store/store.ts';
import type { Logger } from '../base/log.ts';
import { TERMINAL_CLOSE, TERMINAL_HIGH_WATER_BYTES, TERMINAL_PATH_SUFFIX } from '../terminal/contract.ts';
import { problemOf, toAsbError } from '../http/problem.ts';
import type { SyncView } from './hub-context.ts';
import { ownerOf } from './sandbox-owner.ts';
import { authenticate } from './sandbox-proxy.ts';

/** A refusal's body is one problem document; more than this from a worker is cut. */
const MAX_REFUSAL_BYTES = 64 * 1024;
/** Close codes a peer may not send (RFC 6455 §7.4.1): the other side gets a bare close or a drop. */
const UNSENDABLE: ReadonlySet<number> = new Set([1004, 1005, 1006, 1015]);

/** The sandbox id of a terminal path (`/v1/sandboxes/{id}/terminal`), or undefined. */
export function terminalSandboxId(path: string): string | undefined {
  const parts = path.split('/');
  if (parts.length !== 5 || parts[1] !== 'v1' || parts[2] !== 'sandboxes' || `/${parts[4] ?? ''}` !== TERMINAL_PATH_SUFFIX) return undefined;
  try {
    const id = decodeURIComponent(parts[3] ?? '');
    return id === '' ? undefined : id;
  } catch {
    return undefined;
  }
}

export interface TerminalProxyOptions {
  store: ObjectStore;
  sync: SyncView | undefined;
  auth: {
    verify(presented: string): Principal | undefined;
    live(prefix: string): boolean;
    onRevoked(listener: (prefix: string) => void): () => void;
  };
  log: Logger;
  /** For the worker's whole WebSocket handshake; past it the client gets 503. Default 10 s. */
  handshakeTimeoutMs?: number;
}

export interface TerminalProxy {
  /** Handles an upgrade whose path terminalSandboxId() accepts. */
  upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void;
  /** Closes every relayed session (1001 going away; ws drops a peer that does not answer in 30 s) and the pending ones; idempotent. */
  close(): Promise<void>;
}

function writeRaw(socket: Duplex, status: number, headers: Record<string, string>, body: Buffer): void {
  if (socket.destroyed) return;
  const lines = [`HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}`];
  for (const [name, value] of Object.entries({ ...headers, 'content-length': String(body.byteLength), connection: 'close' })) lines.push(`${name}: ${value}`);
  socket.end(Buffer.concat([Buffer.from(`${lines.join('\r\n')}\r\n\r\n`), body]));
}

function refuse(socket: Duplex, err: AsbError): void {
  const headers: Record<string, string> = { 'content-type': 'application/problem+json' };
  if (err.code === 'Unauthorized') headers['www-authenticate'] = 'Bearer realm="asb-hub"';
  writeRaw(socket, err.status, headers, Buffer.from(JSON.stringify(problemOf(err))));
}

function passClose(to: WebSocket, code: number, reason: Buffer): void {
  if (to.readyState === WebSocket.CLOSING || to.readyState === WebSocket.CLOSED) return;
  if (to.readyState === WebSocket.CONNECTING || code === 1006 || code === 1015) to.terminate();
  else if (UNSENDABLE.has(code)) to.close();
  else to.close(code, reason);
}

/** Frames from `from` to `to`, pausing `from` while `to` is over the high-water mark. */
function relay(from: WebSocket, to: WebSocket): void {
  from.on('message', (data: RawData, isBinary: boolean) => {
    if (to.readyState !== WebSocket.OPEN) return;
    to.send(data, { binary: isBinary }, () => {
      if (from.isPaused && to.bufferedAmount <= TERMINAL_HIGH_WATER_BYTES) from.resume();
    });
    if (to.bufferedAmount > TERMINAL_HIGH_WATER_BYTES) from.pause();
  });
  from.on('close', (code: number, reason: Buffer) => passClose(to, code, reason));
}

export function createTerminalProxy(opts: TerminalProxyOptions): TerminalProxy {
  const log = opts.log.child({ component: 'terminal-proxy' });
  const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false, maxPayload: 16 * 1024 * 1024 });
  const sockets = new Set<WebSocket>();
  /** Relayed sessions opened with a key header: the client side → the key's prefix. */
  const byKey = new Map<WebSocket, { prefix: string; upstream: WebSocket }>();
  let closed = false;
  const REVOKED = 'the API key that opened this terminal was revoked';
  const unwatchKeys = opts.auth.onRevoked((prefix) => {
    for (const [client, session] of byKey) {
      if (session.prefix !== prefix) continue;
      byKey.delete(client);
      // The worker's side is cut first so no input in flight reaches the shell.
      session.upstream.terminate();
      if (client.readyState === WebSocket.OPEN) client.close(TERMINAL_CLOSE.keyRevoked, REVOKED);
    }
  });

  const track = (ws: WebSocket): void => {
    sockets.add(ws);
    ws.once('close', () => sockets.delete(ws));
  };

  async function open(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    if (closed) throw new AsbError('Unavailable', 'the hub is shutting down');
    const url = new URL(req.url ?? '/', 'http://hub.invalid');
    const id = terminalSandboxId(url.pathname) ?? '';
    const headers: Record<string, string> = {};
    const { authorization } = req.headers;
    const apiKey = req.headers['x-api-key'];
    let keyPrefix: string | undefined;
    if (authorization !== undefined || apiKey !== undefined) {
      keyPrefix = authenticate(opts.auth, req).prefix;
      if (authorization !== undefined) headers.authorization = authorization;
      if (typeof apiKey === 'string') headers['x-api-key'] = apiKey;
    } else if (url.searchParams.get('token') === null) {
      throw new AsbError('Unauthorized', 'no API key or terminal token: pass "Authorization: Bearer <API key>", or ?token= from POST /v1/sandboxes/{id}/terminal-tokens');
    }
    const owner = await ownerOf(opts.store, opts.sync, id);
    const target = new URL(`${owner.apiUrl}${url.pathname}${url.search}`);
    target.protocol = target.protocol === 'https:' ? 'wss:' : 'ws:';
    const sessionLog = log.child({ cluster: owner.cluster, sandbox: id });

    const upstream = new WebSocket(target, { headers, perMessageDeflate: false, handshakeTimeout: opts.handshakeTimeoutMs ?? 10_000, maxPayload: 16 * 1024 * 1024 });
    track(upstream);
    // The client gave up while the worker was still answering: nothing to relay to.
    const clientGone = (): void => upstream.terminate();
    socket.once('close', clientGone);

    upstream.on('unexpected-response', (request, answer: IncomingMessage) => {
      const chunks: Buffer[] = [];
      let size = 0;
      answer.on('data', (chunk: Buffer) => {
        size += chunk.byteLength;
        if (size <= MAX_REFUSAL_BYTES) chunks.push(chunk);
      });
      answer.on('end', () => {
        socket.off('close', clientGone);
        const passed: Record<string, string> = { 'x-asb-cluster': owner.cluster };
        for (const name of ['content-type', 'www-authenticate', 'retry-after']) {
          const value = answer.headers[name];
          if (typeof value === 'string') passed[name] = value;
        }
        writeRaw(socket, answer.statusCode ?? 502, passed, Buffer.concat(chunks));
        request.destroy();
        sessionLog.debug({ status: answer.statusCode }, 'worker refused the terminal');
      });
      answer.on('error', () => socket.destroy());
    });
    upstream.once('error', (err: Error) => {
      if (upstream.readyState === WebSocket.OPEN || upstream.readyState === WebSocket.CLOSING) return;
      socket.off('close', clientGone);
      refuse(socket, new AsbError('Unavailable', `cluster "${owner.cluster}", which holds sandbox "${id}", did not open the terminal: ${err.message}`));
    });
    upstream.once('open', () => {
      socket.off('close', clientGone);
      if (socket.destroyed) {
        upstream.terminate();
        return;
      }
      wss.handleUpgrade(req, socket, head, (client) => {
        track(client);
        if (keyPrefix !== undefined) {
          byKey.set(client, { prefix: keyPrefix, upstream });
          client.once('close', () => byKey.delete(client));
          // Revoked while the worker was answering: the listener did not know this session yet.
          if (!opts.auth.live(keyPrefix)) {
            byKey.delete(client);
            upstream.terminate();
            client.close(TERMINAL_CLOSE.keyRevoked, REVOKED);
            return;
          }
        }
        client.on('error', (err) => sessionLog.debug({ err: err.message }, 'terminal client socket error'));
        upstream.on('error', (err) => sessionLog.debug({ err: err.message }, 'terminal worker socket error'));
        relay(upstream, client);
        relay(client, upstream);
        sessionLog.debug('terminal relayed');
      });
    });
  }

  return {
    upgrade(req, socket, head) {
      socket.on('error', () => socket.destroy());
      open(req, socket, head).catch((err: unknown) => {
        const problem = toAsbError(err);
        if (problem.code === 'Internal') log.error({ err, url: req.url }, 'terminal upgrade failed');
        refuse(socket, problem);
      });
    },
    async close() {
      closed = true;
      unwatchKeys();
      const waits = [...sockets].map((ws) => new Promise<void>((resolve) => {
        if (ws.readyState === WebSocket.CLOSED) resolve();
        else ws.once('close', () => resolve());
      }));
      for (const ws of sockets) {
        if (ws.readyState === WebSocket.OPEN) ws.close(1001, 'the hub is shutting down');
        else ws.terminate();
      }
      wss.close();
      await Promise.all(waits);
    },
  };
}
