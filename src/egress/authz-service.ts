// The egress decision service: Envoy's ext_authz gRPC API (envoy.service.auth.v3.Authorization/
// Check) served over the router's hand-written gRPC server, one Check per outbound TCP/TLS
// connection (network filter) and one per plain-HTTP request (HTTP filter).
//
// Why ext_authz and not ext_proc: ext_proc is an HTTP filter only, and most egress is HTTPS that
// passes through unopened, where only a network filter sees the connection; ext_authz has both a
// network and an HTTP filter speaking the same Check, so one service decides both, and its OK
// answer carries the headers to set (credential injection). Why no decision cached in Envoy: a
// passthrough connection costs one Check for its whole life (bulk transfers pay nothing per
// byte), and a cache would keep a policy replaced while the sandbox runs (PUT .../network) alive
// past the update; the Check is a decode, a map lookup and decideEgress (tens of µs). A connection
// already open when the policy changes was judged under the old one: each allowed Check is handed
// to onAllowed, and proxy-cut.ts re-decides and closes them on the change.
import { Counter, type Registry } from 'prom-client';
import { GRPC_STATUS, GrpcServer, type GrpcMethod } from '../router/grpc-server.ts';
import type { Logger } from '../base/log.ts';
import { decodeCheckRequest, encodeCheckResponse, type CheckAttributes } from './authz-codec.ts';
import { decideConnection, type DecisionInputs, type EgressDecision } from './egress-decision.ts';

export const AUTHZ_CHECK_PATH = '/envoy.service.auth.v3.Authorization/Check';

export interface EgressMetrics {
  /** Every decision, per sandbox and deciding rule: denied connections are counted here. */
  decisionsTotal: Counter<'sandbox' | 'rule' | 'verdict' | 'protocol'>;
}

export function createEgressMetrics(registry: Registry): EgressMetrics {
  return {
    decisionsTotal: new Counter({
      name: 'asb_egress_decisions_total',
      help: 'Egress proxy decisions (one per TCP/TLS connection, one per plain-HTTP request) by sandbox, deciding rule, verdict (allowed, denied) and protocol (tls, http, tcp).',
      labelNames: ['sandbox', 'rule', 'verdict', 'protocol'],
      registers: [registry],
    }),
  };
}

export interface EgressAuthzOptions extends DecisionInputs {
  metrics: EgressMetrics;
  log: Logger;
  /** Every allowed Check, before the answer goes (proxy-cut.ts remembers it for a later policy change). */
  onAllowed?: (check: CheckAttributes) => void;
}

/** The Check method, for any GrpcServer (the worker's or a test's). */
export function egressAuthzMethod(opts: EgressAuthzOptions): GrpcMethod<undefined> {
  return {
    open: () => undefined,
    message: (call, bytes) => {
      let decision: EgressDecision;
      let check: CheckAttributes;
      try {
        check = decodeCheckRequest(bytes);
        decision = decideConnection(check, opts);
      } catch (err) {
        // Envoy's filters fail closed (failure_mode_allow: false): an error denies.
        opts.log.warn({ err }, 'egress check failed');
        call.end(GRPC_STATUS.invalidArgument, 'bad CheckRequest');
        return;
      }
      opts.metrics.decisionsTotal.inc({ sandbox: decision.sandbox, rule: decision.rule, verdict: decision.allowed ? 'allowed' : 'denied', protocol: decision.protocol });
      if (decision.allowed) opts.onAllowed?.(check);
      else opts.log.debug({ sandbox: decision.sandbox, rule: decision.rule, domain: decision.domain }, 'egress denied');
      const target = decision.domain ?? 'this address';
      call.write(
        encodeCheckResponse(
          decision.allowed
            ? { allowed: true, ...(decision.setHeaders === undefined ? {} : { setHeaders: decision.setHeaders }) }
            : {
                allowed: false,
                deniedStatus: 403,
                deniedBody: `egress to ${target} denied by this sandbox's network policy (rule ${decision.rule})\n`,
                deniedHeaders: [{ name: 'x-asb-egress-rule', value: decision.rule }],
              },
        ),
      );
      call.end();
    },
    halfClose: (call) => call.end(),
    closed: () => undefined,
  };
}

/** A gRPC server serving only the egress Check (the worker runs one beside its REST API). */
export class EgressAuthzServer {
  readonly #server: GrpcServer;
  #port = 0;

  private constructor(server: GrpcServer) {
    this.#server = server;
  }

  static async start(opts: EgressAuthzOptions & { host: string; port: number }): Promise<EgressAuthzServer> {
    const server = new GrpcServer({ log: opts.log, methods: new Map<string, GrpcMethod<unknown>>([[AUTHZ_CHECK_PATH, egressAuthzMethod(opts)]]) });
    const s = new EgressAuthzServer(server);
    s.#port = await server.listen(opts.host, opts.port);
    return s;
  }

  get port(): number {
    return this.#port;
  }

  /** Idempotent; Checks in flight finish within 1 s. */
  close(): Promise<void> {
    return this.#server.close(1000);
  }
}
