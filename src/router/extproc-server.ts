// The ext_proc v3 gRPC server Envoy calls once per HTTP request (one bidi stream per request).
// Conformance rules this file keeps (shared/research/extproc.md §5): exactly one reply per
// message with the matching oneof case; header values in raw_value only; clear_route_cache
// always together with a header_mutation; immediate responses always with a status; one
// override_message_timeout before a hold, then the real answer; never an empty reply, never a
// reply to observability_mode; on 'end' (Envoy half-closed or reset) abort the work and end.
import { Server, ServerCredentials, status as GrpcStatus, type sendUnaryData, type ServerDuplexStream, type ServerUnaryCall, type ServerWritableStream } from '@grpc/grpc-js';
import { AsbError, isAsbError } from '../errors.ts';
import type { Logger } from '../system/log.ts';
import { problemOf } from '../worker/problem.ts';
import { accessCookie } from './access.ts';
import { decide, notFound, RETRY_AFTER_S, type DecideContext, type Decision, type RequestHeaders } from './decide.ts';
import { EXT_PROC_SERVICE, HEADER_SEND, loadRouterProtos, SERVING_STATUS, type HeaderValue, type HeaderValueOption, type HttpHeaders, type ProcessingRequest, type ProcessingResponse } from './proto.ts';
import type { ActivityReporter } from './activity.ts';
import type { RouterMetrics } from './router-metrics.ts';
import type { Waker } from './waker.ts';

export interface ExtProcServerOptions extends DecideContext {
  waker: Waker;
  activity: ActivityReporter | undefined;
  metrics: RouterMetrics | undefined;
  log: Logger;
  /** host:port to listen on; port 0 picks one. */
  listen: string;
  /**
   * Sent as override_message_timeout when a hold starts. Default: hold limit + 3 s, so our 503
   * always beats Envoy's 504. Envoy's max_message_timeout must be at least this.
   */
  holdMessageTimeoutMs?: number;
}

interface StreamState {
  readonly abort: AbortController;
  ended: boolean;
  /** Token to set as a cookie when the response headers come through. */
  cookie: string | undefined;
  /** Ends the activity mark of the sandbox this request reached. */
  release: (() => void) | undefined;
}

// Node ≥22's http2 rapid-reset limiter (nghttp2 token bucket: burst 1000, 33/s) sends GOAWAY
// once Envoy has reset ~1000 streams faster than 33/s, and Envoy resets every ext_proc stream by
// default. Only Envoy talks to this port, so the limiter protects nothing here: lift it.
const RESET_LIMITS = { streamResetBurst: 1_000_000_000, streamResetRate: 1_000_000_000 };

export class ExtProcServer {
  readonly #opts: ExtProcServerOptions;
  readonly #server: Server;
  readonly #log: Logger;
  readonly #holdTimeout: { seconds: number; nanos: number };
  readonly #watchers = new Set<ServerWritableStream<unknown, unknown>>();
  #serving = true;
  #address = '';
  #closing: Promise<void> | undefined;
  readonly #streams = new Set<StreamState>();

  private constructor(opts: ExtProcServerOptions) {
    this.#opts = opts;
    this.#log = opts.log;
    const ms = opts.holdMessageTimeoutMs ?? opts.waker.holdLimitMs + 3_000;
    this.#holdTimeout = { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1_000_000 };
    this.#server = new Server();
    // grpc-js has no option for these; its private http2 options object is read at bind time.
    Object.assign((this.#server as unknown as { commonServerOptions: object }).commonServerOptions, RESET_LIMITS);
    const protos = loadRouterProtos();
    this.#server.addService(protos.extProc, { Process: (call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => this.#process(call) });
    this.#server.addService(protos.health, {
      Check: (call: ServerUnaryCall<{ service?: string }, unknown>, cb: sendUnaryData<unknown>) => this.#healthCheck(call, cb),
      Watch: (call: ServerWritableStream<{ service?: string }, unknown>) => this.#healthWatch(call),
    });
  }

  static async start(opts: ExtProcServerOptions): Promise<ExtProcServer> {
    const server = new ExtProcServer(opts);
    const port = await new Promise<number>((resolve, reject) => {
      server.#server.bindAsync(opts.listen, ServerCredentials.createInsecure(), (err, p) => (err === null ? resolve(p) : reject(err)));
    });
    const host = opts.listen.slice(0, opts.listen.lastIndexOf(':'));
    server.#address = `${host}:${port}`;
    return server;
  }

  /** host:port actually bound. */
  get address(): string {
    return this.#address;
  }

  /** Streams open right now (one per in-flight HTTP request through Envoy). */
  get openStreams(): number {
    return this.#streams.size;
  }

  /** gRPC health status reported to Envoy's health checker. */
  setServing(serving: boolean): void {
    if (this.#serving === serving) return;
    this.#serving = serving;
    for (const call of this.#watchers) call.write({ status: this.#healthStatus() });
  }

  /** Stops accepting streams, lets open ones finish for up to graceMs, then cuts them. Idempotent. */
  close(graceMs = 2_000): Promise<void> {
    this.#closing ??= new Promise<void>((resolve) => {
      this.setServing(false);
      for (const call of this.#watchers) call.end();
      const timer = setTimeout(() => this.#server.forceShutdown(), graceMs);
      this.#server.tryShutdown(() => {
        clearTimeout(timer);
        for (const s of this.#streams) s.abort.abort();
        resolve();
      });
    });
    return this.#closing;
  }

  #process(call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>): void {
    const state: StreamState = { abort: new AbortController(), ended: false, cookie: undefined, release: undefined };
    this.#streams.add(state);
    const finish = (): void => {
      if (!this.#streams.delete(state)) return;
      state.abort.abort();
      state.release?.();
    };
    call.on('data', (req: ProcessingRequest) => {
      try {
        this.#onMessage(call, state, req);
      } catch (err) {
        this.#opts.metrics?.streamErrorsTotal.inc({ kind: 'handler' });
        this.#log.error({ err }, 'ext_proc message handling failed');
        // Non-OK so Envoy fails closed (status_on_error), never an OK close that would let the request through unrouted.
        call.destroy(err instanceof Error ? err : new Error(String(err)));
      }
    });
    // Envoy half-closes (graceful) or resets once it needs nothing more; both arrive as 'end'.
    call.on('end', () => {
      state.ended = true;
      finish();
      call.end();
    });
    // Also fires after a normal end: release state, not an error.
    call.on('cancelled', () => {
      state.ended = true;
      finish();
    });
    call.on('error', (err) => {
      this.#log.debug({ err }, 'ext_proc stream error');
      state.ended = true;
      finish();
    });
  }

  #onMessage(call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>, state: StreamState, req: ProcessingRequest): void {
    if (req.observability_mode === true) return;
    switch (req.request) {
      case 'request_headers':
        this.#onRequestHeaders(call, state, req.request_headers ?? {});
        return;
      case 'response_headers': {
        const cookie = state.cookie;
        state.cookie = undefined;
        // append: true so a Set-Cookie from the sandbox itself is kept beside ours.
        const mutation = cookie === undefined ? {} : { set_headers: [{ header: raw('set-cookie', accessCookie(cookie)), append: { value: true } }] };
        this.#write(call, state, { response_headers: { response: { header_mutation: mutation } } });
        return;
      }
      // Not configured (bodies NONE, trailers SKIP), but if Envoy is set up to send them, answer
      // each with a plain CONTINUE of the matching case: an unanswered message is a 504.
      case 'request_body':
      case 'response_body':
        this.#write(call, state, { [req.request]: {} });
        return;
      case 'request_trailers':
      case 'response_trailers':
        this.#write(call, state, { [req.request]: {} });
        return;
      case undefined:
        this.#opts.metrics?.streamErrorsTotal.inc({ kind: 'unexpected' });
        return;
    }
  }

  #onRequestHeaders(call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>, state: StreamState, msg: HttpHeaders): void {
    const headers = headerMap(msg);
    const decision = decide(headers, this.#opts);
    if (decision.kind !== 'hold' && decision.kind !== 'lookup') {
      this.#answer(call, state, decision);
      return;
    }
    // One override_message_timeout, then the real answer once the sandbox is ready.
    this.#write(call, state, { override_message_timeout: this.#holdTimeout });
    const started = performance.now();
    const signal = state.abort.signal;
    const wait = decision.kind === 'hold' ? this.#opts.waker.holdUntilRunning(decision.entry, decision.wake, signal) : this.#opts.waker.lookup(decision.id, decision.cluster, signal);
    wait.then(
      () => {
        // Decide again from the table as it is now; a second hold or lookup would loop, so it ends here.
        let again = decide(headers, this.#opts);
        if (again.kind === 'lookup') again = notFound(again.id);
        if (again.kind === 'hold') again = { kind: 'reject', error: unavailable(`sandbox ${again.entry.id} is not running`), retryAfterS: RETRY_AFTER_S };
        this.#opts.metrics?.holdSeconds.observe({ result: again.kind }, (performance.now() - started) / 1000);
        this.#answer(call, state, again);
      },
      (err: unknown) => {
        if (signal.aborted) return;
        const error = isAsbError(err) ? err : unavailable('internal error while holding the request');
        if (!isAsbError(err)) this.#log.error({ err }, 'hold failed');
        this.#opts.metrics?.holdSeconds.observe({ result: String(error.status) }, (performance.now() - started) / 1000);
        this.#answer(call, state, { kind: 'reject', error, retryAfterS: error.status === 503 ? RETRY_AFTER_S : undefined });
      },
    );
  }

  #answer(call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>, state: StreamState, decision: Decision): void {
    if (decision.kind === 'reject') {
      this.#opts.metrics?.requestsTotal.inc({ result: String(decision.error.status) });
      this.#write(call, state, { immediate_response: immediateResponse(decision.error, decision.retryAfterS) });
      return;
    }
    if (decision.kind !== 'route') throw new Error(`cannot answer a ${decision.kind} decision`);
    this.#opts.metrics?.requestsTotal.inc({ result: 'route' });
    const reply: ProcessingResponse = {
      request_headers: {
        response: {
          header_mutation: { set_headers: decision.set.map(([k, v]) => ({ header: raw(k, v) })), remove_headers: decision.remove },
          // The route picks its cluster from x-asb-upstream (cluster_header): Envoy must re-match.
          clear_route_cache: true,
        },
      },
    };
    if (decision.setCookie !== undefined) {
      state.cookie = decision.setCookie;
      // Only this request needs its response headers: Envoy skips them for all others (allow_mode_override).
      reply.mode_override = { response_header_mode: HEADER_SEND.send };
    }
    if (decision.sandboxId !== undefined && decision.cluster !== undefined && this.#opts.activity !== undefined) {
      // Open until the stream ends: with Envoy keeping the stream for the request's life (WebSocket,
      // streaming), the sandbox counts as active for as long as the connection is open.
      state.release = this.#opts.activity.open(decision.cluster, decision.sandboxId);
    }
    this.#write(call, state, reply);
  }

  #write(call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>, state: StreamState, msg: ProcessingResponse): void {
    if (state.ended) {
      this.#opts.metrics?.streamErrorsTotal.inc({ kind: 'late' });
      return;
    }
    call.write(msg);
  }

  #healthStatus(): number {
    return this.#serving ? SERVING_STATUS.serving : SERVING_STATUS.notServing;
  }

  #healthCheck(call: ServerUnaryCall<{ service?: string }, unknown>, cb: sendUnaryData<unknown>): void {
    const service = call.request.service ?? '';
    if (service !== '' && service !== EXT_PROC_SERVICE) {
      cb({ code: GrpcStatus.NOT_FOUND, details: `unknown service ${service}` });
      return;
    }
    cb(null, { status: this.#healthStatus() });
  }

  #healthWatch(call: ServerWritableStream<{ service?: string }, unknown>): void {
    const service = call.request.service ?? '';
    if (service !== '' && service !== EXT_PROC_SERVICE) {
      call.write({ status: SERVING_STATUS.serviceUnknown });
    } else {
      call.write({ status: this.#healthStatus() });
    }
    this.#watchers.add(call);
    call.on('cancelled', () => this.#watchers.delete(call));
  }
}

/** Header list → map; Envoy sends values in raw_value (value only with the raw-value guard off). */
export function headerMap(msg: HttpHeaders): RequestHeaders {
  const map = new Map<string, string>();
  for (const h of msg.headers?.headers ?? []) {
    const key = h.key.toLowerCase();
    // latin1 maps bytes 1:1, so a value we send back (the Cookie header) keeps its exact bytes.
    const value = h.raw_value !== undefined && h.raw_value.length > 0 ? h.raw_value.toString('latin1') : (h.value ?? '');
    const prev = map.get(key);
    map.set(key, prev === undefined ? value : `${prev}${key === 'cookie' ? '; ' : ','}${value}`);
  }
  return map;
}

function raw(key: string, value: string): HeaderValue {
  return { key, raw_value: Buffer.from(value, 'latin1') };
}

function immediateResponse(error: AsbError, retryAfterS: number | undefined): NonNullable<ProcessingResponse['immediate_response']> {
  const body = JSON.stringify({ ...problemOf(error), message: error.message });
  const set: HeaderValueOption[] = [{ header: raw('content-type', 'application/json') }, { header: raw('cache-control', 'no-store') }];
  if (retryAfterS !== undefined) set.push({ header: raw('retry-after', String(retryAfterS)) });
  return {
    status: { code: error.status },
    headers: { set_headers: set },
    body: Buffer.from(body),
    // Shown in Envoy's access log as %RESPONSE_CODE_DETAILS%; no spaces (Envoy would turn them into '_').
    details: `asb_${error.code}`,
  };
}

function unavailable(message: string): AsbError {
  return new AsbError('Unavailable', message);
}
