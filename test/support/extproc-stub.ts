// A stand-in for the router, to test Envoy configurations without it: an ext_proc server
// (grpc-js, port 0) that answers each request's headers with what the test's decide() says
// (routing headers to set, or an immediate response), optionally after a hold announced with
// override_message_timeout as the router does for a waking sandbox. It records what Envoy sent:
// the request headers and the x-asb-listener gRPC metadata of the stream.
import { Server, ServerCredentials, type ServerDuplexStream, type ServerUnaryCall, type sendUnaryData } from '@grpc/grpc-js';
import { HEADER } from '../../src/router/contract.ts';
import { loadRouterProtos, SERVING_STATUS, type ProcessingRequest, type ProcessingResponse } from '../../src/router/proto.ts';

export interface SeenRequest {
  headers: Record<string, string>;
  /** The x-asb-listener metadata of the ext_proc stream (`ingress` on the ingress listener). */
  listener: string | undefined;
}

export type Decision =
  | { set: Record<string, string>; holdMs?: number }
  | { status: number; body: string };

export interface ExtProcStub {
  /** host:port to give Envoy as routerAddress. */
  address: string;
  seen: SeenRequest[];
}

/** `after` registers a cleanup (node:test's t.after, or a list the caller runs). */
export async function startExtProcStub(after: (fn: () => unknown) => void, decide: (req: SeenRequest) => Decision): Promise<ExtProcStub> {
  const protos = loadRouterProtos();
  const seen: SeenRequest[] = [];
  const timers = new Set<NodeJS.Timeout>();
  const server = new Server();
  server.addService(protos.extProc, {
    Process(call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>) {
      const listener = call.metadata.get(HEADER.listener)[0];
      call.on('data', (msg: ProcessingRequest) => {
        if (msg.request_headers === undefined) {
          // response_trailer_mode is SEND: trailers (HTTP/2 responses only) get an empty answer.
          call.write({ response_trailers: {} });
          return;
        }
        const headers: Record<string, string> = {};
        for (const h of msg.request_headers.headers?.headers ?? []) headers[h.key] = h.raw_value === undefined ? (h.value ?? '') : Buffer.from(h.raw_value).toString('latin1');
        const req: SeenRequest = { headers, listener: typeof listener === 'string' ? listener : undefined };
        seen.push(req);
        const decision = decide(req);
        const answer = (): void => {
          if (call.destroyed) return;
          call.write(reply(decision));
        };
        if ('set' in decision && decision.holdMs !== undefined) {
          // As the router: raise Envoy's per-message deadline first, then answer when done.
          call.write({ override_message_timeout: { seconds: Math.ceil(decision.holdMs / 1000) + 5, nanos: 0 } });
          const timer = setTimeout(() => {
            timers.delete(timer);
            answer();
          }, decision.holdMs);
          timers.add(timer);
        } else {
          answer();
        }
      });
      call.on('end', () => call.end());
      // Envoy resets each stream when it is done with it: expected, nothing to report.
      call.on('error', () => undefined);
    },
  });
  server.addService(protos.health, {
    Check(_call: ServerUnaryCall<unknown, unknown>, callback: sendUnaryData<unknown>) {
      callback(null, { status: SERVING_STATUS.serving });
    },
  });
  const port = await new Promise<number>((resolve, reject) => {
    server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, bound) => {
      if (err === null) resolve(bound);
      else reject(err);
    });
  });
  after(() => {
    for (const timer of timers) clearTimeout(timer);
    server.forceShutdown();
  });
  return { address: `127.0.0.1:${port}`, seen };
}

function reply(decision: Decision): ProcessingResponse {
  if ('status' in decision) {
    return { immediate_response: { status: { code: decision.status }, body: Buffer.from(decision.body) } };
  }
  const setHeaders = Object.entries(decision.set).map(([key, value]) => ({ header: { key, raw_value: Buffer.from(value, 'latin1') } }));
  return { request_headers: { response: { header_mutation: { set_headers: setHeaders }, clear_route_cache: true } } };
}
