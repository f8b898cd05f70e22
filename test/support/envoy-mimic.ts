// Plays Envoy's ext_proc filter against the router, as a grpc-js client: one bidi stream per
// HTTP request, request_headers with values in raw_value, then either a reset (RST_STREAM, Envoy's
// default) or a half-close (the graceful-close runtime guard) once the answer is in.
import { credentials, Metadata, type Client, type ClientDuplexStream, type ServiceClientConstructor, type GrpcObject } from '@grpc/grpc-js';
import { loadRouterProtos, type ProcessingRequest, type ProcessingResponse } from '../../src/router/proto.ts';

export type CloseMode = 'rst' | 'half-close';

export interface Exchange {
  /** Every message the router sent, in order (an override_message_timeout first for holds). */
  replies: ProcessingResponse[];
  /** The final answer (the last reply). */
  answer: ProcessingResponse;
}

export function extProcClient(address: string): Client & { Process(metadata?: Metadata): ClientDuplexStream<ProcessingRequest, ProcessingResponse> } {
  const pkg = loadRouterProtos().grpc;
  const ctor = lookup(pkg, 'envoy.service.ext_proc.v3.ExternalProcessor') as ServiceClientConstructor;
  // A private subchannel pool: a test's client never reuses a connection to an earlier test's server.
  return new ctor(address, credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 }) as unknown as Client & { Process(metadata?: Metadata): ClientDuplexStream<ProcessingRequest, ProcessingResponse> };
}

export function healthClient(address: string): Client & Record<string, (...args: unknown[]) => unknown> {
  const ctor = lookup(loadRouterProtos().grpc, 'grpc.health.v1.Health') as ServiceClientConstructor;
  return new ctor(address, credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 }) as unknown as Client & Record<string, (...args: unknown[]) => unknown>;
}

function lookup(pkg: GrpcObject, path: string): unknown {
  let node: unknown = pkg;
  for (const part of path.split('.')) node = (node as Record<string, unknown>)[part];
  return node;
}

export function requestHeaders(headers: Record<string, string | string[]>, endOfStream = true): ProcessingRequest {
  const list = Object.entries(headers).flatMap(([key, v]) => (Array.isArray(v) ? v : [v]).map((value) => ({ key, raw_value: Buffer.from(value, 'latin1') })));
  return { request_headers: { headers: { headers: list }, end_of_stream: endOfStream } };
}

/** A GET to `authority` + `path` with extra headers, as Envoy would send it. */
export function get(authority: string, path = '/', extra: Record<string, string | string[]> = {}): ProcessingRequest {
  return requestHeaders({ ':authority': authority, ':path': path, ':method': 'GET', ':scheme': 'http', 'user-agent': 'curl/8', ...extra });
}

/**
 * Sends one request's headers and waits for the answer (skipping an override_message_timeout),
 * then closes the stream the way Envoy does. `listener`: the x-asb-listener metadata Envoy's
 * ingress listener sends (none: the edge's stream, which sends none).
 */
export function exchange(client: ReturnType<typeof extProcClient>, req: ProcessingRequest, close: CloseMode = 'rst', more: ProcessingRequest[] = [], listener?: 'ingress'): Promise<Exchange> {
  return new Promise((resolve, reject) => {
    const metadata = new Metadata();
    if (listener !== undefined) metadata.set('x-asb-listener', listener);
    const call = client.Process(metadata);
    const replies: ProcessingResponse[] = [];
    const pending = [...more];
    let done = false;
    call.on('data', (msg: ProcessingResponse) => {
      replies.push(msg);
      if (msg.override_message_timeout !== undefined && Object.keys(msg).length === 1) return;
      const next = pending.shift();
      if (next !== undefined) {
        call.write(next);
        return;
      }
      done = true;
      if (close === 'rst') call.cancel();
      else call.end();
      const answer = msg;
      resolve({ replies, answer });
    });
    call.on('error', (err: Error & { code?: number }) => {
      // 1 = CANCELLED: our own reset.
      if (done && err.code === 1) return;
      if (!done) reject(err);
    });
    call.on('end', () => {
      if (!done) reject(new Error('stream ended before an answer'));
    });
    call.write(req);
  });
}

export function headerValue(answer: ProcessingResponse, key: string): string | undefined {
  const set = answer.request_headers?.response?.header_mutation?.set_headers ?? [];
  const h = set.find((s) => s.header.key === key);
  return h?.header.raw_value === undefined ? undefined : Buffer.from(h.header.raw_value).toString('latin1');
}

export function immediate(answer: ProcessingResponse): { status: number; headers: Record<string, string>; body: Record<string, unknown> } | undefined {
  const ir = answer.immediate_response;
  if (ir === undefined) return undefined;
  const headers: Record<string, string> = {};
  for (const s of ir.headers?.set_headers ?? []) headers[s.header.key] = Buffer.from(s.header.raw_value ?? []).toString('latin1');
  return { status: ir.status.code, headers, body: JSON.parse(Buffer.from(ir.body ?? []).toString('utf8')) as Record<string, unknown> };
}
