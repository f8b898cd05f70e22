// The ext_proc v3 gRPC server Envoy calls once per HTTP request (one bidi stream per request).
// Conformance rules this file keeps (shared/research/extproc.md §5): exactly one reply per
// message with the matching oneof case; header values in raw_value only; clear_route_cache
// always together with a header_mutation; immediate responses always with a status; one
// override_message_timeout before a hold, then the real answer; never an empty reply, never a
// reply to observability_mode; on 'end' (Envoy half-closed or reset) abort the work and end.
import { AsbError, isAsbError } from '../errors.ts';
import type { Logger } from '../base/log.ts';
import { problemOf } from '../http/problem.ts';
import { e2bSandboxNotFoundJson, HEADER } from './contract.ts';
import { decide, notFound, RETRY_AFTER_S, type DecideContext, type Decision, type Listener, type RequestHeaders } from './decide.ts';
import { decodeProcessingRequest, encodeProcessingResponse } from './extproc-codec.ts';
import { clientKey } from './client-address.ts';
import { lookupRefused } from './lookup-limiter.ts';
import { GRPC_STATUS, GrpcServer, type GrpcCall, type GrpcMethod } from './grpc-server.ts';
import { EXT_PROC_SERVICE, HEADER_SEND, HEALTH_SERVICE, loadRouterProtos, SERVING_STATUS, type HeaderValue, type HeaderValueOption, type HttpHeaders, type ProcessingRequest, type ProcessingResponse } from './proto.ts';
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
  /** The Envoy listener this request came in on, from the stream's metadata. */
  listener: Listener;
  /** Only for a hold or lookup: most streams never wait, and an AbortController per stream (its abort() builds a DOMException with a stack) was measurable. */
  abort: AbortController | undefined;
  ended: boolean;
  /** Set-Cookie value (asb_access) to add when the response headers come through. */
  cookie: string | undefined;
  /** Ends the activity mark of the sandbox this request reached. */
  release: (() => void) | undefined;
}

type Call = GrpcCall<StreamState>;

export class ExtProcServer {
  readonly #opts: ExtProcServerOptions;
  readonly #server: GrpcServer;
  readonly #log: Logger;
  readonly #holdTimeout: { seconds: number; nanos: number };
  readonly #watchers = new Set<GrpcCall<undefined>>();
  readonly #routed: { inc(): void } | undefined;
  #serving = true;
  #address = '';
  #closing: Promise<void> | undefined;
  readonly #streams = new Set<StreamState>();

  private constructor(opts: ExtProcServerOptions) {
    this.#opts = opts;
    this.#log = opts.log;
    const ms = opts.holdMessageTimeoutMs ?? opts.waker.holdLimitMs + 3_000;
    this.#holdTimeout = { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1_000_000 };
    // The labelled child once, not a label lookup per request.
    this.#routed = opts.metrics?.requestsTotal.labels({ result: 'route' });
    this.#server = new GrpcServer({ log: opts.log, methods: this.#methods() });
  }

  static async start(opts: ExtProcServerOptions): Promise<ExtProcServer> {
    const server = new ExtProcServer(opts);
    const sep = opts.listen.lastIndexOf(':');
    const host = opts.listen.slice(0, sep);
    const port = await server.#server.listen(host.replace(/^\[(.*)\]$/, '$1'), Number(opts.listen.slice(sep + 1)));
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
    for (const call of this.#watchers) this.#writeHealth(call, this.#healthStatus());
  }

  /** Stops accepting streams, lets open ones finish for up to graceMs, then cuts them. Idempotent. */
  close(graceMs = 2_000): Promise<void> {
    this.#closing ??= (async () => {
      this.setServing(false);
      for (const call of this.#watchers) call.end();
      await this.#server.close(graceMs);
      for (const s of this.#streams) s.abort?.abort();
    })();
    return this.#closing;
  }

  #methods(): Map<string, GrpcMethod<unknown>> {
    const protos = loadRouterProtos();
    const health = protos.health;
    const process: GrpcMethod<StreamState> = {
      open: (call) => {
        const state: StreamState = { listener: listenerOf(call.metadata[HEADER.listener]), abort: undefined, ended: false, cookie: undefined, release: undefined };
        this.#streams.add(state);
        return state;
      },
      message: (call, bytes) => {
        try {
          this.#onMessage(call, call.state, decodeProcessingRequest(bytes));
        } catch (err) {
          this.#opts.metrics?.streamErrorsTotal.inc({ kind: 'handler' });
          this.#log.error({ err }, 'ext_proc message handling failed');
          // Non-OK so Envoy fails closed (status_on_error), never an OK close that would let the request through unrouted.
          call.end(GRPC_STATUS.internal, 'ext_proc message handling failed');
        }
      },
      // Envoy half-closes (graceful) once it needs nothing more: abort any hold, end at once.
      halfClose: (call) => {
        this.#finish(call.state);
        call.end();
      },
      // Reset by Envoy (its default close), ended by us, or the connection died.
      closed: (call) => this.#finish(call.state),
    };
    const healthRequest = (bytes: Buffer): string => (health.Check?.requestDeserialize(bytes) as { service?: string } | undefined)?.service ?? '';
    const check: GrpcMethod<undefined> = {
      open: () => undefined,
      message: (call, bytes) => {
        const service = healthRequest(bytes);
        if (service !== '' && service !== EXT_PROC_SERVICE) {
          call.end(GRPC_STATUS.notFound, `unknown service ${service}`);
          return;
        }
        this.#writeHealth(call, this.#healthStatus());
        call.end();
      },
      halfClose: (call) => call.end(),
      closed: () => undefined,
    };
    const watch: GrpcMethod<undefined> = {
      open: () => undefined,
      message: (call, bytes) => {
        const service = healthRequest(bytes);
        if (service !== '' && service !== EXT_PROC_SERVICE) {
          this.#writeHealth(call, SERVING_STATUS.serviceUnknown);
          return;
        }
        this.#writeHealth(call, this.#healthStatus());
        this.#watchers.add(call);
      },
      halfClose: () => undefined,
      closed: (call) => this.#watchers.delete(call),
    };
    return new Map<string, GrpcMethod<unknown>>([
      [`/${EXT_PROC_SERVICE}/Process`, process],
      [`/${HEALTH_SERVICE}/Check`, check],
      [`/${HEALTH_SERVICE}/Watch`, watch],
    ]);
  }

  #finish(state: StreamState): void {
    state.ended = true;
    if (!this.#streams.delete(state)) return;
    state.abort?.abort();
    state.release?.();
  }

  #writeHealth(call: GrpcCall<undefined>, status: number): void {
    const bytes = loadRouterProtos().health.Check?.responseSerialize({ status });
    if (bytes !== undefined) call.write(bytes);
  }

  #onMessage(call: Call, state: StreamState, req: ProcessingRequest): void {
    if (req.observability_mode === true) return;
    switch (req.request) {
      case 'request_headers':
        this.#onRequestHeaders(call, state, req.request_headers ?? {});
        return;
      case 'response_headers': {
        const cookie = state.cookie;
        state.cookie = undefined;
        // append: true so a Set-Cookie from the sandbox itself is kept beside ours.
        const mutation = cookie === undefined ? {} : { set_headers: [{ header: raw('set-cookie', cookie), append: { value: true } }] };
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

  #onRequestHeaders(call: Call, state: StreamState, msg: HttpHeaders): void {
    const headers = headerMap(msg);
    const decision = decide(headers, this.#opts, state.listener);
    if (decision.kind !== 'hold' && decision.kind !== 'lookup' && decision.kind !== 'confirm') {
      this.#answer(call, state, decision);
      return;
    }
    if (decision.kind !== 'hold') {
      // Refused lookups are answered here, before any hold: the worker is never asked. A paused
      // sandbox gets the table's answer then, as E2B's SDKs expect, not a 429.
      const id = decision.kind === 'lookup' ? decision.id : decision.entry.id;
      const refused = this.#opts.waker.refuseLookup(id, clientKey(headers, state.listener));
      if (refused !== undefined) {
        this.#answer(call, state, decision.kind === 'lookup' ? lookupRefused(id, refused) : decision.paused);
        return;
      }
    }
    // One override_message_timeout, then the real answer once the sandbox is ready.
    this.#write(call, state, { override_message_timeout: this.#holdTimeout });
    const started = performance.now();
    const held = this.#opts.metrics?.held;
    held?.inc();
    state.abort = new AbortController();
    const signal = state.abort.signal;
    const waker = this.#opts.waker;
    const wait =
      decision.kind === 'hold' ? waker.holdUntilRunning(decision.entry, decision.wake, signal, wakeCauseOf(headers))
      : decision.kind === 'lookup' ? waker.lookup(decision.id, decision.cluster, signal)
      : waker.confirmPaused(decision.entry, signal);
    wait.then(
      () => this.#release(headers, state.listener, signal, waker.holdLimitMs - (performance.now() - started)),
    ).then(
      (again) => {
        held?.dec();
        this.#opts.metrics?.holdSeconds.observe({ result: again.kind }, (performance.now() - started) / 1000);
        this.#answer(call, state, again);
      },
      (err: unknown) => {
        held?.dec();
        if (signal.aborted) return;
        const error = isAsbError(err) ? err : unavailable('internal error while holding the request');
        if (!isAsbError(err)) this.#log.error({ err }, 'hold failed');
        this.#opts.metrics?.holdSeconds.observe({ result: String(error.status) }, (performance.now() - started) / 1000);
        if (decision.kind === 'confirm' && isAsbError(err, 'NotFound')) {
          this.#answer(call, state, decision.paused);
          return;
        }
        const reject: Decision = { kind: 'reject', error, retryAfterS: error.status === 503 ? RETRY_AFTER_S : undefined };
        if (decision.kind === 'lookup' && decision.e2b && isAsbError(err, 'NotFound')) reject.e2bSandboxId = decision.id;
        this.#answer(call, state, reject);
      },
    );
  }

  /**
   * The answer to a request whose hold ended: decided again from the table as it is now (a second
   * hold or lookup would loop, so it ends here), and, when it goes to a pod, only once that pod's
   * port accepts connections (a pod runs before its server listens). Checked again after the wait
   * in case the table moved the sandbox meanwhile; every wait is bounded by what is left of the
   * hold limit, so this ends.
   */
  async #release(headers: RequestHeaders, listener: Listener, signal: AbortSignal, limitMs: number): Promise<Decision> {
    const deadline = performance.now() + limitMs;
    let listening: string | undefined;
    for (;;) {
      const again = decide(headers, this.#opts, listener);
      if (again.kind === 'lookup') return notFound(again.id, again.e2b);
      if (again.kind === 'confirm') return again.paused;
      if (again.kind === 'hold') return { kind: 'reject', error: unavailable(`sandbox ${again.entry.id} is not running`), retryAfterS: RETRY_AFTER_S };
      if (again.kind !== 'route' || again.pod === undefined || again.sandboxId === undefined) return again;
      const pod = `${again.pod.host}:${again.pod.port}`;
      if (pod === listening) return again;
      await this.#opts.waker.untilListening(again.sandboxId, again.pod, deadline - performance.now(), signal);
      listening = pod;
    }
  }

  #answer(call: Call, state: StreamState, decision: Decision): void {
    if (decision.kind === 'reject') {
      this.#opts.metrics?.requestsTotal.inc({ result: String(decision.error.status) });
      const reply = decision.e2bSandboxId === undefined ? immediateResponse(decision.error, decision.retryAfterS) : e2bNotFound(decision.e2bSandboxId);
      this.#write(call, state, { immediate_response: reply });
      return;
    }
    if (decision.kind !== 'route') throw new Error(`cannot answer a ${decision.kind} decision`);
    this.#routed?.inc();
    if (decision.ingress !== undefined) this.#opts.metrics?.ingressForwardsTotal.inc({ cluster: decision.ingress });
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

  #write(call: Call, state: StreamState, msg: ProcessingResponse): void {
    if (state.ended) {
      this.#opts.metrics?.streamErrorsTotal.inc({ kind: 'late' });
      return;
    }
    if (!call.write(encodeProcessingResponse(msg))) this.#opts.metrics?.streamErrorsTotal.inc({ kind: 'late' });
  }

  #healthStatus(): number {
    return this.#serving ? SERVING_STATUS.serving : SERVING_STATUS.notServing;
  }
}

/**
 * The listener a stream serves, from Envoy's initial_metadata on that listener's ext_proc filter:
 * `ingress` only when it says exactly that. Only our Envoy reaches this port, and every listener
 * but the ingress one is an edge.
 */
function listenerOf(value: string | string[] | undefined): Listener {
  return value === 'ingress' ? 'ingress' : 'edge';
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

/** E2B's proxy answer for a sandbox it does not know (research e2b.md §4): 502, `{sandboxId, message, code}`. */
function e2bNotFound(id: string): NonNullable<ProcessingResponse['immediate_response']> {
  return {
    status: { code: 502 },
    headers: { set_headers: [{ header: raw('content-type', 'application/json') }, { header: raw('cache-control', 'no-store') }] },
    body: Buffer.from(e2bSandboxNotFoundJson(id)),
    details: 'asb_E2bSandboxNotFound',
  };
}

function unavailable(message: string): AsbError {
  return new AsbError('Unavailable', message);
}

/** The request that wakes a sandbox, as its lifecycle event tells it: host and path, the query left out (it may carry tokens). */
function wakeCauseOf(headers: RequestHeaders): { host: string; path: string } {
  const path = headers.get(':path') ?? '/';
  const q = path.indexOf('?');
  return { host: (headers.get(':authority') ?? '').slice(0, 253), path: (q === -1 ? path : path.slice(0, q)).slice(0, 512) };
}
