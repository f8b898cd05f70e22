// One `pods/exec` session over WebSocket, the channel protocol kubectl speaks: every binary
// message starts with a channel byte (0 stdin, 1 stdout, 2 stderr, 3 error: the exit status as a
// metav1.Status, 4 resize: {"Width","Height"} for a TTY, 255 close: the next byte names the
// stream the client closes). v5.channel.k8s.io (Kubernetes 1.30+) is what makes stdin EOF
// possible; v4 is accepted for sessions that never close stdin.
//
// Why not client-node's Exec class: its handler ends process.stdout when a close frame arrives
// (the default streams are the process's own), throws from inside the socket's message event on
// channel 255, and writes stdin without backpressure. What we take from the library is the part
// that is hard to get right: KubeConfig.applyToHTTPSOptions fills the socket's TLS options,
// credentials (tokens, client certificates, exec plugins) and proxy agent (ExecCredentials: once
// per runtime, and again after a 401).
import type { KubeConfig } from '@kubernetes/client-node';
import type { ClientRequest, IncomingMessage } from 'node:http';
import WebSocket from 'ws';
import { AsbError } from '../../errors.ts';
import { credentialsOf } from '../../store/kube-http.ts';

const PROTOCOL_V5 = 'v5.channel.k8s.io';
const PROTOCOLS = [PROTOCOL_V5, 'v4.channel.k8s.io'];
const STDIN = 0;
const STDOUT = 1;
const STDERR = 2;
const ERROR = 3;
const RESIZE = 4;
const CLOSE = 255;
// Stdin goes out in frames of at most 64 KiB: a big file is many small messages, never one that
// a proxy's message limit (the apiserver's websocket reader allows 32 MiB) could refuse.
const STDIN_FRAME = 64 * 1024;
const HANDSHAKE_TIMEOUT_MS = 30_000;

export interface ExecTarget {
  namespace: string;
  pod: string;
  container: string;
}

export interface ExecStreams {
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
  tty: boolean;
  /** The caller will close stdin (exec with input, file writes): refuse a server without v5. */
  closesStdin?: boolean;
}

export interface ExecHandlers {
  stdout?: (chunk: Buffer) => void;
  stderr?: (chunk: Buffer) => void;
}

/** How a session ended: the command's exit code, a failure the server reported, or a socket closed without a status. */
export type ExecEnd = { kind: 'exit'; exitCode: number } | { kind: 'failed'; error: AsbError } | { kind: 'closed'; reason: string };

interface Status {
  status?: string;
  reason?: string;
  message?: string;
  details?: { causes?: { reason?: string; message?: string }[] };
}

interface SocketOptions {
  /** The API server as a ws: or wss: URL, with no trailing slash (a path prefix is kept). */
  server: string;
  options: WebSocket.ClientOptions;
}

/**
 * The API server and the socket options (TLS, credentials, proxy agent) from the kubeconfig, read
 * on the first exec and kept: reading them reads the CA and client certificate files
 * (synchronously) and may run a credential plugin, which an exec per request should not pay.
 * Read again after a 401, once however many sessions were refused.
 */
export class ExecCredentials {
  readonly #kc: KubeConfig;
  #current: Promise<SocketOptions> | undefined;

  constructor(kc: KubeConfig) {
    this.#kc = kc;
  }

  current(): Promise<SocketOptions> {
    if (this.#current !== undefined) return this.#current;
    const reading = this.#read();
    this.#current = reading;
    // A failed read is not kept: the next exec tries again.
    void reading.catch(() => {
      if (this.#current === reading) this.#current = undefined;
    });
    return reading;
  }

  /** Reads them again unless another session already did since `used` was read. */
  refresh(used: Promise<SocketOptions>): Promise<SocketOptions> {
    if (this.#current === used) this.#current = undefined;
    return this.current();
  }

  async #read(): Promise<SocketOptions> {
    const server = this.#kc.getCurrentCluster()?.server;
    if (server === undefined) throw new AsbError('Unavailable', 'kubeconfig: the current context names no cluster');
    const url = new URL(server);
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
    const { agentOptions, headers } = await credentialsOf(this.#kc);
    const options: WebSocket.ClientOptions = { ...agentOptions, headers, perMessageDeflate: false, handshakeTimeout: HANDSHAKE_TIMEOUT_MS, followRedirects: false };
    return { server: url.href.replace(/\/+$/, ''), options };
  }
}

export class PodExec {
  readonly #ws: WebSocket;
  readonly #handlers: ExecHandlers;
  readonly #what: string;
  #status = '';
  #end: ExecEnd | undefined;
  #settle: (end: ExecEnd) => void = () => undefined;
  /** Resolves once, never rejects. */
  readonly ended: Promise<ExecEnd>;

  private constructor(ws: WebSocket, handlers: ExecHandlers, what: string) {
    this.#ws = ws;
    this.#handlers = handlers;
    this.#what = what;
    this.ended = new Promise((resolve) => (this.#settle = resolve));
    ws.on('message', (data: WebSocket.RawData) => this.#message(data));
    ws.on('close', (code, reason) => this.#finish({ kind: 'closed', reason: `${what}: connection closed (${code}${reason.length > 0 ? ` ${reason.toString()}` : ''}) before the exit status arrived` }));
    ws.on('error', (err) => this.#finish({ kind: 'closed', reason: `${what}: ${err.message}` }));
  }

  /** Opens the session; rejects with an AsbError (SandboxNotRunning for a pod or container that cannot take an exec). */
  static async open(credentials: ExecCredentials, target: ExecTarget, command: readonly string[], streams: ExecStreams, handlers: ExecHandlers): Promise<PodExec> {
    const query = new URLSearchParams();
    for (const arg of command) query.append('command', arg);
    query.set('container', target.container);
    query.set('stdin', String(streams.stdin));
    query.set('stdout', String(streams.stdout));
    query.set('stderr', String(streams.stderr && !streams.tty));
    query.set('tty', String(streams.tty));
    const path = `/api/v1/namespaces/${encodeURIComponent(target.namespace)}/pods/${encodeURIComponent(target.pod)}/exec?${query.toString()}`;
    const what = `exec in pod ${target.namespace}/${target.pod}`;
    const used = credentials.current();
    let shake = await PodExec.#handshake(await used, path, handlers, what);
    // A token from a credential plugin or a ServiceAccount expires: read the credentials again
    // once before giving up, as the store does.
    if ('status' in shake && shake.status === 401) shake = await PodExec.#handshake(await credentials.refresh(used), path, handlers, what);
    if ('status' in shake) throw refusal(what, shake.status, shake.body);
    const { session } = shake;
    if (streams.closesStdin === true && session.#ws.protocol !== PROTOCOL_V5) {
      session.abort();
      throw new AsbError('Unavailable', `${what}: the API server speaks ${session.#ws.protocol === '' ? 'no channel protocol' : session.#ws.protocol}, not ${PROTOCOL_V5} (Kubernetes 1.30+), so stdin cannot be closed`);
    }
    return session;
  }

  /** The WebSocket upgrade: an open session, or the API server's refusal. */
  static async #handshake(socket: SocketOptions, path: string, handlers: ExecHandlers, what: string): Promise<{ session: PodExec } | { status: number; body: string }> {
    const ws = new WebSocket(`${socket.server}${path}`, PROTOCOLS, socket.options);
    const session = new PodExec(ws, handlers, what);
    return new Promise((resolve, reject) => {
      ws.once('open', () => resolve({ session }));
      ws.once('unexpected-response', (req: ClientRequest, res: IncomingMessage) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          req.destroy();
          resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') });
        });
        res.on('error', (err) => reject(new AsbError('Unavailable', `${what}: ${err.message}`, { cause: err })));
      });
      void session.ended.then((end) => reject(new AsbError('Unavailable', end.kind === 'closed' ? end.reason : `${what}: the session ended during the handshake`)));
    });
  }

  #message(data: WebSocket.RawData): void {
    const buf = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
    if (buf.length < 2) return; // the server's opening empty frame on the first stream
    const payload = buf.subarray(1);
    switch (buf[0]) {
      case STDOUT:
        this.#handlers.stdout?.(payload);
        return;
      case STDERR:
        this.#handlers.stderr?.(payload);
        return;
      case ERROR: {
        // Output and status travel in order on one socket, and the server sends the status only
        // once the command's output is all sent: the status is the end.
        this.#status += payload.toString('utf8');
        let status: Status;
        try {
          status = JSON.parse(this.#status) as Status;
        } catch {
          return; // the rest of the status is still to come
        }
        this.#finish(endOf(this.#what, status));
        this.#ws.close(1000);
        return;
      }
      default:
        return; // CLOSE frames of the server's streams: the status says when it is over
    }
  }

  #finish(end: ExecEnd): void {
    if (this.#end !== undefined) return;
    this.#end = end;
    this.#settle(end);
  }

  get open(): boolean {
    return this.#end === undefined && this.#ws.readyState === WebSocket.OPEN;
  }

  /** Sends bytes to stdin; resolves once they are handed to the socket (backpressure). */
  async writeStdin(data: Uint8Array): Promise<void> {
    for (let at = 0; at < data.length; at += STDIN_FRAME) {
      await this.#send(STDIN, data.subarray(at, at + STDIN_FRAME));
    }
  }

  /** EOF on stdin (v5). */
  closeStdin(): void {
    if (this.open && this.#ws.protocol === PROTOCOL_V5) this.#ws.send(Buffer.from([CLOSE, STDIN]));
  }

  resize(cols: number, rows: number): void {
    if (!this.open) return;
    const size = { Width: clamp(cols), Height: clamp(rows) };
    this.#ws.send(Buffer.concat([Buffer.from([RESIZE]), Buffer.from(JSON.stringify(size))]));
  }

  /** Stops reading the socket (the consumer is behind); output waits in the server's buffers. */
  pause(): void {
    if (this.#ws.readyState === WebSocket.OPEN) this.#ws.pause();
  }

  resume(): void {
    if (this.#ws.readyState === WebSocket.OPEN) this.#ws.resume();
  }

  /** Drops the session; `ended` resolves with kind 'closed'. Idempotent. */
  abort(): void {
    this.#finish({ kind: 'closed', reason: `${this.#what}: closed by the caller` });
    this.#ws.terminate();
  }

  #send(channel: number, payload: Uint8Array): Promise<void> {
    if (!this.open) return Promise.reject(new AsbError('Unavailable', `${this.#what}: the session has ended`));
    const frame = Buffer.allocUnsafe(payload.length + 1);
    frame[0] = channel;
    frame.set(payload, 1);
    return new Promise((resolve, reject) => {
      this.#ws.send(frame, { binary: true }, (err) => (err instanceof Error ? reject(new AsbError('Unavailable', `${this.#what}: ${err.message}`, { cause: err })) : resolve()));
    });
  }
}

function clamp(n: number): number {
  return Math.max(1, Math.min(Math.floor(n), 0xffff));
}

/** The exit status the server sent on the error channel (v4 and v5: a metav1.Status). */
export function endOf(what: string, status: Status): ExecEnd {
  if (status.status === 'Success') return { kind: 'exit', exitCode: 0 };
  const code = status.details?.causes?.find((c) => c.reason === 'ExitCode')?.message;
  if (status.reason === 'NonZeroExitCode' && code !== undefined && /^\d+$/.test(code)) return { kind: 'exit', exitCode: Number(code) };
  return { kind: 'failed', error: new AsbError('Internal', `${what}: ${status.message ?? 'failed without an exit code'}`) };
}

/** The API server refused the upgrade: the pod is gone, not scheduled, or the container is not running (400/404), or we may not exec. */
function refusal(what: string, httpStatus: number, body: string): AsbError {
  let message = body.trim();
  try {
    message = (JSON.parse(body) as Status).message ?? message;
  } catch {
    // a plain-text answer
  }
  const detail = `${what}: ${message === '' ? `HTTP ${httpStatus}` : message}`;
  if (httpStatus === 400 || httpStatus === 404) return new AsbError('SandboxNotRunning', detail);
  if (httpStatus === 403) return new AsbError('Forbidden', detail);
  if (httpStatus === 401 || httpStatus === 429 || httpStatus >= 500) return new AsbError('Unavailable', detail);
  return new AsbError('Internal', detail);
}
