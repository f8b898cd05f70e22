// A gRPC server on node:http2, for the two services the router serves (ext_proc and health).
// gRPC over HTTP/2 is small: POST <path>, content-type application/grpc, each message framed as
// 1 byte "compressed" flag + 4 bytes big-endian length + bytes, the status in trailers
// (grpc-status, grpc-message), or in the response headers when nothing else was sent
// ("trailers-only"). Spec: github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md.
//
// Why not grpc-js: measured through Envoy 1.40 at 50 connections on 2 cores, grpc-js + protobufjs
// cost ~125 µs of router CPU per ext_proc stream (a per-call object graph, metadata parsing,
// deadline and status handling, an Error object for every RST Envoy sends), while node:http2
// alone costs ~40 µs. Envoy opens one stream per HTTP request, so that difference is the
// router's share of the request cost. bench/dataplane.ts has the before/after figures.
import http2, { type Http2Server, type Http2Session, type IncomingHttpHeaders, type ServerHttp2Stream } from 'node:http2';
import type { AddressInfo } from 'node:net';
import type { Logger } from '../base/log.ts';

export const GRPC_STATUS = { ok: 0, cancelled: 1, unknown: 2, invalidArgument: 3, notFound: 5, resourceExhausted: 8, unimplemented: 12, internal: 13, unavailable: 14 } as const;

/** gRPC's default receive limit; ext_proc request headers are a few KB. */
const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

// Node ≥22's http2 rapid-reset limiter (nghttp2 token bucket: burst 1000, 33/s) sends GOAWAY
// once a peer has reset ~1000 streams faster than 33/s, and Envoy resets every ext_proc stream
// by default. Only Envoy talks to this port, so the limiter protects nothing here: lift it.
// maxSessionMemory: every in-flight request (and every open WebSocket) holds one stream on
// Envoy's connection; Node's 10 MB default would refuse streams long before the circuit breaker's
// 100,000 (grpc-js lifts it the same way).
const HTTP2_OPTIONS = { streamResetBurst: 1_000_000_000, streamResetRate: 1_000_000_000, maxSessionMemory: 1_000_000 };

/** One method's behaviour. Each call gets `open`, then messages, then one of halfClose or nothing, then `closed`. */
export interface GrpcMethod<S> {
  open(call: GrpcCall<S>): S;
  message(call: GrpcCall<S>, msg: Buffer): void;
  /** The client sent END_STREAM (Envoy's graceful close, or a unary request complete). */
  halfClose(call: GrpcCall<S>): void;
  /** The stream is gone (ended, reset by the peer, or the session died). Always called once. */
  closed(call: GrpcCall<S>): void;
}

export class GrpcCall<S> {
  readonly #stream: ServerHttp2Stream;
  readonly #method: GrpcMethod<S>;
  /** The method's per-call state (what `open` returned). */
  readonly state: S;
  /** The request's HTTP/2 headers: gRPC metadata such as Envoy's initial_metadata (x-asb-listener). */
  readonly metadata: IncomingHttpHeaders;
  #responded = false;
  #ended = false;
  #status: number = GRPC_STATUS.ok;
  #statusMessage = '';
  /** Bytes of an incomplete frame (a frame split across DATA chunks). */
  #pending: Buffer | undefined;

  constructor(stream: ServerHttp2Stream, method: GrpcMethod<S>, metadata: IncomingHttpHeaders) {
    this.#stream = stream;
    this.#method = method;
    this.metadata = metadata;
    stream.on('data', (chunk: Buffer) => this.#onData(chunk));
    stream.on('end', () => {
      if (!this.#ended) method.halfClose(this);
    });
    stream.on('close', () => {
      this.#ended = true;
      method.closed(this);
    });
    // A reset with an error code or a dead session: 'close' follows and releases the call.
    stream.on('error', () => undefined);
    stream.on('wantTrailers', () => this.#sendTrailers());
    this.state = method.open(this);
  }

  /** False once the call was ended or the stream is gone: nothing more can be sent. */
  get writable(): boolean {
    return !this.#ended && !this.#stream.destroyed;
  }

  /** Sends one message. Returns false (and sends nothing) when the call is over. */
  write(msg: Buffer): boolean {
    if (!this.writable) return false;
    this.#respond();
    const frame = Buffer.allocUnsafe(5 + msg.length);
    frame[0] = 0;
    frame.writeUInt32BE(msg.length, 1);
    msg.copy(frame, 5);
    this.#stream.write(frame);
    return true;
  }

  /** Ends the call with a status; idempotent (the first status wins). */
  end(status: number = GRPC_STATUS.ok, message = ''): void {
    if (!this.writable) return;
    this.#ended = true;
    if (!this.#responded) {
      // Trailers-only: one HEADERS frame with the status and END_STREAM.
      this.#responded = true;
      this.#stream.respond({ ':status': 200, 'content-type': 'application/grpc', 'grpc-status': String(status), ...grpcMessage(message) }, { endStream: true });
      return;
    }
    this.#status = status;
    this.#statusMessage = message;
    this.#stream.end();
  }

  #respond(): void {
    if (this.#responded) return;
    this.#responded = true;
    this.#stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
  }

  #sendTrailers(): void {
    if (this.#stream.destroyed) return;
    this.#stream.sendTrailers({ 'grpc-status': String(this.#status), ...grpcMessage(this.#statusMessage) });
  }

  #onData(chunk: Buffer): void {
    let buf = this.#pending === undefined ? chunk : Buffer.concat([this.#pending, chunk]);
    this.#pending = undefined;
    while (buf.length >= 5) {
      const len = buf.readUInt32BE(1);
      if (buf[0] !== 0) {
        this.end(GRPC_STATUS.unimplemented, 'compressed messages are not supported');
        return;
      }
      if (len > MAX_MESSAGE_BYTES) {
        this.end(GRPC_STATUS.resourceExhausted, `message of ${len} bytes exceeds ${MAX_MESSAGE_BYTES}`);
        return;
      }
      if (buf.length < 5 + len) break;
      const msg = buf.subarray(5, 5 + len);
      buf = buf.subarray(5 + len);
      if (this.#ended) return;
      this.#method.message(this, msg);
    }
    if (buf.length > 0) this.#pending = buf;
  }
}

function grpcMessage(message: string): Record<string, string> {
  // grpc-message is percent-encoded (PROTOCOL-HTTP2.md); encodeURIComponent is a superset.
  return message === '' ? {} : { 'grpc-message': encodeURIComponent(message) };
}

export interface GrpcServerOptions {
  log: Logger;
  /** Full method path (`/package.Service/Method`) → behaviour. */
  methods: ReadonlyMap<string, GrpcMethod<unknown>>;
}

/** Owns the HTTP/2 listener and its sessions (Envoy keeps one or a few connections open). */
export class GrpcServer {
  readonly #server: Http2Server;
  readonly #sessions = new Set<Http2Session>();
  readonly #methods: ReadonlyMap<string, GrpcMethod<unknown>>;
  readonly #log: Logger;
  #closing: Promise<void> | undefined;

  constructor(opts: GrpcServerOptions) {
    this.#methods = opts.methods;
    this.#log = opts.log;
    this.#server = http2.createServer(HTTP2_OPTIONS);
    this.#server.on('session', (session: Http2Session) => {
      this.#sessions.add(session);
      session.once('close', () => this.#sessions.delete(session));
      session.on('error', (err) => this.#log.debug({ err }, 'gRPC session error'));
    });
    this.#server.on('stream', (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => this.#onStream(stream, headers));
  }

  /** Listens on host:port (port 0 picks one); resolves with the port bound. */
  listen(host: string, port: number): Promise<number> {
    return new Promise((resolve, reject) => {
      this.#server.once('error', reject);
      this.#server.listen(port, host, () => {
        this.#server.off('error', reject);
        this.#server.on('error', (err) => this.#log.error({ err }, 'gRPC server error'));
        resolve((this.#server.address() as AddressInfo).port);
      });
    });
  }

  /** Stops accepting, sends GOAWAY, waits up to graceMs for open streams, then cuts them. Idempotent. */
  close(graceMs: number): Promise<void> {
    this.#closing ??= new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        for (const s of this.#sessions) s.destroy();
      }, graceMs);
      this.#server.close(() => {
        clearTimeout(timer);
        resolve();
      });
      for (const s of this.#sessions) s.close();
    });
    return this.#closing;
  }

  #onStream(stream: ServerHttp2Stream, headers: IncomingHttpHeaders): void {
    const path = headers[':path'] ?? '';
    const method = this.#methods.get(path);
    const contentType = headers['content-type'] ?? '';
    if (headers[':method'] !== 'POST' || !contentType.startsWith('application/grpc')) {
      stream.on('error', () => undefined);
      stream.respond({ ':status': 415 }, { endStream: true });
      return;
    }
    if (method === undefined) {
      stream.on('error', () => undefined);
      stream.respond({ ':status': 200, 'content-type': 'application/grpc', 'grpc-status': String(GRPC_STATUS.unimplemented), ...grpcMessage(`unknown method ${path}`) }, { endStream: true });
      return;
    }
    new GrpcCall(stream, method, headers);
  }
}
