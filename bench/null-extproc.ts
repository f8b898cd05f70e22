// A null ext_proc server: the instrument behind bench/dataplane.ts's ceiling figure. It serves
// the router's gRPC methods on the router's own GrpcServer (node:http2 + gRPC framing) but does
// no lookup, no auth and no header decoding: it reads only which kind of message came, and
// answers every request_headers with one precomputed reply, the one the router sends for a
// routed request to a running sandbox on a public port (decide.ts: x-asb-upstream: sandbox,
// x-asb-dst: ip:port, x-asb-sandbox-id; clear_route_cache so Envoy re-matches on them). Envoy
// in front of it does all of its own ext_proc work, so its throughput is the most any ext_proc
// router can give on this machine. Every other message kind gets the matching empty reply
// (exactly one reply per message); edge.yaml only sends request headers and, for responses
// with trailers, response trailers.
import { HEADER, UPSTREAM } from '../src/router/contract.ts';
import { encodeProcessingResponse } from '../src/router/extproc-codec.ts';
import { GRPC_STATUS, GrpcServer, type GrpcMethod } from '../src/router/grpc-server.ts';
import { EXT_PROC_SERVICE, HEALTH_SERVICE, SERVING_STATUS, type ProcessingResponse } from '../src/router/proto.ts';
import { reader, readVarint, skipField, WireWriter } from '../src/router/protobuf-wire.ts';
import { silentLogger } from '../src/base/log.ts';

export interface NullExtProc {
  /** host:port bound. */
  address: string;
  close(): Promise<void>;
}

/** ProcessingRequest's `request` oneof in field order 2-7; the reply's case is the field before (1-6). */
const CASES = ['request_headers', 'response_headers', 'request_body', 'response_body', 'request_trailers', 'response_trailers'] as const;
const FIRST_CASE_FIELD = 2;

/** Answers every request on 127.0.0.1 (port chosen by the kernel) as routed to `destination` (ip:port), sandbox `sandboxId`. */
export async function startNullExtProc(destination: string, sandboxId: string): Promise<NullExtProc> {
  const routed: ProcessingResponse = {
    request_headers: {
      response: {
        header_mutation: { set_headers: [header(HEADER.upstream, UPSTREAM.sandbox), header(HEADER.destination, destination), header(HEADER.sandboxId, sandboxId)] },
        clear_route_cache: true,
      },
    },
  };
  const replies = CASES.map((kase) => encodeProcessingResponse(kase === 'request_headers' ? routed : { [kase]: {} }));
  const process: GrpcMethod<undefined> = {
    open: () => undefined,
    message: (call, bytes) => {
      const reply = replies[requestField(bytes) - FIRST_CASE_FIELD];
      if (reply === undefined) call.end(GRPC_STATUS.internal, 'null ext_proc: message of no known kind');
      else call.write(reply);
    },
    halfClose: (call) => call.end(),
    closed: () => undefined,
  };
  const serving = new WireWriter().uint(1, SERVING_STATUS.serving).finish();
  const check: GrpcMethod<undefined> = {
    open: () => undefined,
    message: (call) => {
      call.write(serving);
      call.end();
    },
    halfClose: (call) => call.end(),
    closed: () => undefined,
  };
  const server = new GrpcServer({
    log: silentLogger(),
    methods: new Map<string, GrpcMethod<unknown>>([
      [`/${EXT_PROC_SERVICE}/Process`, process],
      [`/${HEALTH_SERVICE}/Check`, check],
    ]),
  });
  const port = await server.listen('127.0.0.1', 0);
  return { address: `127.0.0.1:${port}`, close: () => server.close(1_000) };
}

/** The field number of the message's `request` oneof, or 0: a scan of top-level tags, nothing decoded. */
function requestField(msg: Buffer): number {
  try {
    const r = reader(msg);
    while (r.pos < r.end) {
      const tag = readVarint(r);
      const field = tag >>> 3;
      if (field >= FIRST_CASE_FIELD && field < FIRST_CASE_FIELD + CASES.length) return field;
      skipField(r, tag & 7);
    }
  } catch {
    // Malformed: the caller ends the stream with an error, which fails the request in wrk's count.
  }
  return 0;
}

function header(key: string, value: string): { header: { key: string; raw_value: Buffer } } {
  return { header: { key, raw_value: Buffer.from(value, 'latin1') } };
}
