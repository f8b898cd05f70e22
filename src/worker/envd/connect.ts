// The Connect protocol (connectrpc.com/docs/protocol) with the JSON codec, as far as envd's
// clients use it: unary calls (application/json both ways), server streams and client streams
// (application/connect+json: envelopes of 1 flag byte, a 4-byte big-endian length and the JSON;
// the last one has flag 0x02 and carries `{}` or `{"error":…}`; a client stream's reply is one
// message and that end-stream envelope). No compression: the E2B SDK
// never compresses, and a compressed envelope (flag 0x01) is refused.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { AsbError, type ErrorCode } from '../../errors.ts';
import type { Clock, Timer } from '../../base/clock.ts';
import { isPlainObject } from '../../http/body.ts';

/** Connect error codes (the subset envd answers with). */
export type ConnectCode =
  | 'canceled' | 'unknown' | 'invalid_argument' | 'deadline_exceeded' | 'not_found' | 'already_exists'
  | 'permission_denied' | 'resource_exhausted' | 'failed_precondition' | 'unimplemented' | 'internal'
  | 'unavailable' | 'unauthenticated';

/** The HTTP status of each code on a unary reply (Connect protocol, "Error Codes"). */
const HTTP_STATUS: Record<ConnectCode, number> = {
  canceled: 499,
  unknown: 500,
  invalid_argument: 400,
  deadline_exceeded: 504,
  not_found: 404,
  already_exists: 409,
  permission_denied: 403,
  resource_exhausted: 429,
  failed_precondition: 400,
  unimplemented: 501,
  internal: 500,
  unavailable: 503,
  unauthenticated: 401,
};

const FROM_ASB: Record<ErrorCode, ConnectCode> = {
  NotFound: 'not_found',
  AlreadyExists: 'already_exists',
  Conflict: 'already_exists',
  Invalid: 'invalid_argument',
  BadRequest: 'invalid_argument',
  MalformedJson: 'invalid_argument',
  UnsupportedMediaType: 'invalid_argument',
  PayloadTooLarge: 'resource_exhausted',
  TooManyRequests: 'resource_exhausted',
  Unauthorized: 'unauthenticated',
  Forbidden: 'permission_denied',
  QuotaExceeded: 'resource_exhausted',
  MethodNotAllowed: 'unimplemented',
  Gone: 'failed_precondition',
  PoolExhausted: 'unavailable',
  Unavailable: 'unavailable',
  Timeout: 'deadline_exceeded',
  SandboxNotRunning: 'unavailable',
  NotImplemented: 'unimplemented',
  CheckpointFailed: 'internal',
  BuildFailed: 'failed_precondition',
  Internal: 'internal',
};

/** An error with a Connect code, for the few answers our catalogue has no code for (unimplemented). */
export class ConnectError extends Error {
  readonly code: ConnectCode;
  constructor(code: ConnectCode, message: string) {
    super(message);
    this.name = 'ConnectError';
    this.code = code;
  }
}

export interface WireError {
  code: ConnectCode;
  message: string;
}

/** Any error as Connect sends it; errors that are not ours become `internal` with their message. */
export function toWireError(err: unknown): WireError {
  if (err instanceof ConnectError) return { code: err.code, message: err.message };
  if (err instanceof AsbError) return { code: FROM_ASB[err.code], message: err.message };
  return { code: 'internal', message: err instanceof Error ? err.message : String(err) };
}

export function httpStatusOf(code: ConnectCode): number {
  return HTTP_STATUS[code];
}

export function writeUnary(res: ServerResponse, message: unknown): void {
  const body = JSON.stringify(message);
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

export function writeUnaryError(res: ServerResponse, err: unknown): void {
  const wire = toWireError(err);
  const body = JSON.stringify(wire);
  res.writeHead(httpStatusOf(wire.code), { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

const FLAG_COMPRESSED = 0x01;
const FLAG_END_STREAM = 0x02;

export function envelope(flags: number, message: unknown): Buffer {
  const json = Buffer.from(JSON.stringify(message), 'utf8');
  const frame = Buffer.allocUnsafe(5 + json.length);
  frame.writeUInt8(flags, 0);
  frame.writeUInt32BE(json.length, 1);
  json.copy(frame, 5);
  return frame;
}

/** The one message a server-streaming request carries, from its body's first envelope. */
export function parseStreamRequest(body: Buffer): unknown {
  if (body.length < 5) throw new AsbError('BadRequest', `a Connect stream request needs an envelope (5-byte header), got ${body.length} bytes`);
  const flags = body.readUInt8(0);
  if ((flags & FLAG_COMPRESSED) !== 0) throw new AsbError('BadRequest', 'compressed Connect envelopes are not supported (send Connect-Content-Encoding: identity)');
  const length = body.readUInt32BE(1);
  if (body.length < 5 + length) throw new AsbError('BadRequest', `Connect envelope says ${length} bytes, the body holds ${body.length - 5}`);
  return parseJson(body.subarray(5, 5 + length));
}

/** A client stream's messages as their envelopes arrive; an end-stream envelope (optional from a client) ends them. */
export async function* streamMessages(body: AsyncIterable<Buffer>, maxMessageBytes: number): AsyncGenerator<unknown, void, undefined> {
  let pending: Buffer = Buffer.alloc(0);
  for await (const chunk of body) {
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
    while (pending.length >= 5) {
      const flags = pending.readUInt8(0);
      const length = pending.readUInt32BE(1);
      if (length > maxMessageBytes) throw new AsbError('PayloadTooLarge', `a Connect envelope of ${length} bytes is over the ${maxMessageBytes}-byte limit`);
      if (pending.length < 5 + length) break;
      if ((flags & FLAG_COMPRESSED) !== 0) throw new AsbError('BadRequest', 'compressed Connect envelopes are not supported (send Connect-Content-Encoding: identity)');
      const message = pending.subarray(5, 5 + length);
      pending = pending.subarray(5 + length);
      if ((flags & FLAG_END_STREAM) !== 0) return;
      yield parseJson(message);
    }
  }
  if (pending.length > 0) throw new AsbError('BadRequest', `the request ended inside a Connect envelope (${pending.length} bytes left over)`);
}

/** A client stream's reply: its one message, or the error, then the end-stream envelope. */
export function writeClientStreamReply(res: ServerResponse, reply: { message: unknown } | { error: unknown }): void {
  const body = 'message' in reply
    ? Buffer.concat([envelope(0, reply.message), envelope(FLAG_END_STREAM, {})])
    : envelope(FLAG_END_STREAM, { error: toWireError(reply.error) });
  res.writeHead(200, { 'content-type': 'application/connect+json', 'content-length': body.length });
  res.end(body);
}

/** A request message, or an object field of one; BadRequest naming `what` when it is not a JSON object. */
export function record(value: unknown, what = 'the request message'): Record<string, unknown> {
  if (!isPlainObject(value)) throw new AsbError('BadRequest', `${what} must be a JSON object`);
  return value;
}

export function parseJson(bytes: Buffer): unknown {
  if (bytes.length === 0) return {};
  try {
    return JSON.parse(bytes.toString('utf8')) as unknown;
  } catch (err) {
    throw new AsbError('MalformedJson', `request message is not JSON: ${(err as Error).message}`);
  }
}

/** `Connect-Timeout-Ms`, if sent and valid (at most 10 digits, per the protocol). */
export function timeoutOf(req: IncomingMessage): number | undefined {
  const raw = req.headers['connect-timeout-ms'];
  if (typeof raw !== 'string' || !/^\d{1,10}$/.test(raw)) return undefined;
  return Number(raw);
}

/** `Keepalive-Ping-Interval` in seconds (the E2B SDK sends 50); envd's own default is 90. */
export function keepaliveOf(req: IncomingMessage, fallbackS = 90): number {
  const raw = req.headers['keepalive-ping-interval'];
  const n = typeof raw === 'string' && /^\d{1,6}$/.test(raw) ? Number(raw) : fallbackS;
  return Math.max(1, n) * 1000;
}

export interface StreamOptions {
  clock: Clock;
  /** Sent every `keepaliveMs` while the stream is open. */
  keepalive: () => unknown;
  keepaliveMs: number;
  /** From Connect-Timeout-Ms: the stream ends with deadline_exceeded after this long. */
  timeoutMs: number | undefined;
}

/**
 * One server stream: messages as envelopes, keepalives on a timer, a deadline, and exactly one
 * end-stream envelope. `closed` resolves when the stream ended for any reason (finished, deadline,
 * the client went away), so a producer stops there.
 */
export class ServerStream {
  readonly #res: ServerResponse;
  #ping: Timer | undefined;
  #deadline: Timer | undefined;
  #ended = false;
  #resolveClosed!: (why: 'finished' | 'deadline' | 'aborted') => void;
  readonly closed: Promise<'finished' | 'deadline' | 'aborted'>;

  constructor(res: ServerResponse, opts: StreamOptions) {
    this.#res = res;
    this.closed = new Promise((resolve) => (this.#resolveClosed = resolve));
    res.writeHead(200, { 'content-type': 'application/connect+json' });
    res.flushHeaders();
    res.on('close', () => this.#finish('aborted'));
    const ping = (): void => {
      if (this.#ended) return;
      this.send(opts.keepalive());
      this.#ping = opts.clock.after(opts.keepaliveMs, ping);
    };
    this.#ping = opts.clock.after(opts.keepaliveMs, ping);
    if (opts.timeoutMs !== undefined) {
      const timeoutMs = opts.timeoutMs;
      this.#deadline = opts.clock.after(timeoutMs, () => this.#close(new ConnectError('deadline_exceeded', `the stream passed its deadline of ${timeoutMs} ms (Connect-Timeout-Ms)`), 'deadline'));
    }
  }

  get ended(): boolean {
    return this.#ended;
  }

  send(message: unknown): void {
    if (this.#ended) return;
    this.#res.write(envelope(0, message));
  }

  /** Writes the end-stream envelope (with the error, if any) and ends the response. Idempotent. */
  end(err?: unknown): void {
    this.#close(err, 'finished');
  }

  #close(err: unknown, why: 'finished' | 'deadline'): void {
    if (this.#ended) return;
    const trailer = err === undefined ? {} : { error: toWireError(err) };
    this.#ended = true;
    this.#res.end(envelope(FLAG_END_STREAM, trailer));
    this.#finish(why);
  }

  #finish(why: 'finished' | 'deadline' | 'aborted'): void {
    this.#ended = true;
    this.#ping?.cancel();
    this.#deadline?.cancel();
    this.#resolveClosed(why);
  }
}
