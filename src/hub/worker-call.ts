// The hub's HTTP calls to worker APIs (placement's creates, fan-out lists), on keep-alive
// connections, with two deadlines: one to connect, one for the whole answer. Failures come back
// as a WorkerCallError with a kind, so the caller can tell "nothing reached the worker" from "it
// said something" without reading messages.
//
// node:http rather than fetch: fetch cannot bound the connect phase on its own (undici's default
// is 10 s), and a dead cluster must cost placement a connect timeout, not a request timeout.
import { Agent as HttpAgent, request as httpRequest, type IncomingHttpHeaders, type IncomingMessage } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import type { Socket } from 'node:net';
import type { Clock, Timer } from '../base/clock.ts';

export type WorkerCallFailure = 'connect' | 'timeout' | 'reset' | 'too-large';

export class WorkerCallError extends Error {
  readonly kind: WorkerCallFailure;

  constructor(kind: WorkerCallFailure, message: string, options?: { cause?: unknown }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'WorkerCallError';
    this.kind = kind;
  }
}

export interface WorkerAnswer {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

export interface WorkerCall {
  method: 'GET' | 'POST';
  url: URL;
  headers: Record<string, string>;
  body?: Buffer;
  /** From the start of the call to a connected socket. */
  connectTimeoutMs: number;
  /** From the start of the call to the last byte of the answer. */
  timeoutMs: number;
  /** Answers larger than this fail with kind 'too-large'. */
  maxBytes: number;
}

/** Keep-alive agents shared by every call of one hub API; close() when the hub stops. */
export class WorkerAgents {
  readonly #http = new HttpAgent({ keepAlive: true });
  readonly #https = new HttpsAgent({ keepAlive: true });
  readonly #clock: Clock;

  constructor(clock: Clock) {
    this.#clock = clock;
  }

  call(c: WorkerCall): Promise<WorkerAnswer> {
    return callWorker(c.url.protocol === 'https:' ? this.#https : this.#http, this.#clock, c);
  }

  close(): void {
    this.#http.destroy();
    this.#https.destroy();
  }
}

function callWorker(agent: HttpAgent, clock: Clock, c: WorkerCall): Promise<WorkerAnswer> {
  const send = c.url.protocol === 'https:' ? httpsRequest : httpRequest;
  return new Promise<WorkerAnswer>((resolve, reject) => {
    let connected = false;
    let settled = false;
    const timers: Timer[] = [];
    const finish = (err: Error | undefined, answer?: WorkerAnswer): void => {
      if (settled) return;
      settled = true;
      for (const t of timers) t.cancel();
      if (err !== undefined) reject(err);
      else if (answer !== undefined) resolve(answer);
    };
    const headers: Record<string, string | number> = { ...c.headers };
    if (c.body !== undefined) headers['content-length'] = c.body.byteLength;
    const req = send(c.url, { method: c.method, headers, agent });
    const fail = (err: WorkerCallError): void => {
      finish(err);
      req.destroy(err);
    };
    timers.push(
      clock.after(c.connectTimeoutMs, () => {
        if (!connected) fail(new WorkerCallError('connect', `could not connect to ${c.url.host} within ${c.connectTimeoutMs} ms`));
      }),
      clock.after(c.timeoutMs, () => fail(new WorkerCallError('timeout', `no complete answer from ${c.url.host} within ${c.timeoutMs} ms`))),
    );
    req.on('socket', (socket: Socket) => {
      // A reused keep-alive socket is connected already.
      if (!socket.connecting) connected = true;
      else socket.once('connect', () => (connected = true));
    });
    req.on('error', (err: NodeJS.ErrnoException) => {
      if (settled) return;
      const kind: WorkerCallFailure = connected ? 'reset' : 'connect';
      finish(new WorkerCallError(kind, `${kind === 'connect' ? 'could not connect to' : 'connection lost to'} ${c.url.host}: ${err.code ?? err.message}`, { cause: err }));
    });
    req.on('response', (res: IncomingMessage) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (chunk: Buffer) => {
        size += chunk.byteLength;
        if (size > c.maxBytes) fail(new WorkerCallError('too-large', `the answer from ${c.url.host} is larger than ${c.maxBytes} bytes`));
        else chunks.push(chunk);
      });
      res.on('end', () => finish(undefined, { status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on('error', (err) => finish(new WorkerCallError('reset', `connection lost to ${c.url.host} mid-answer: ${err.message}`, { cause: err })));
    });
    req.end(c.body);
  });
}
