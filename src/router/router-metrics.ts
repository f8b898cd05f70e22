// The router's Prometheus metrics, created against an injected Registry.
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import type { RouteTable } from './route-table.ts';

export interface RouterMetrics {
  /** result: route, or the HTTP status we answered ourselves. */
  requestsTotal: Counter<'result'>;
  holdSeconds: Histogram<'result'>;
  /** Requests held right now, waiting for a wake or a lookup. */
  held: Gauge;
  wakesTotal: Counter<'result'>;
  feedMessagesTotal: Counter<'type' | 'result'>;
  streamErrorsTotal: Counter<'kind'>;
  /** Requests sent on to another cluster's ingress, by that cluster. */
  ingressForwardsTotal: Counter<'cluster'>;
  /** Failed lookups of DNS-named ingress addresses (the last good address is kept). */
  ingressResolveErrorsTotal: Counter;
  /** Lookups of ids the table lacks: at the worker (found, missing, failed) or refused here (rate_limited, busy). */
  lookupsTotal: Counter<'result'>;
}

export function createRouterMetrics(registry: Registry, table: RouteTable): RouterMetrics {
  const registers = [registry];
  new Gauge({
    name: 'asb_router_routes',
    help: 'Route entries in the table (all clusters).',
    registers,
    collect() {
      this.set(table.size);
    },
  });
  new Counter({
    name: 'asb_router_lookup_cache_hits_total',
    help: 'Requests for an unknown sandbox answered 404 from the negative cache (a worker confirmed the id missing within 5 s), without a lookup.',
    registers,
    collect() {
      this.reset();
      this.inc(table.knownMissingHits);
    },
  });
  const metrics: RouterMetrics = {
    requestsTotal: new Counter({ name: 'asb_router_requests_total', help: 'Requests decided, by result (route or the status answered).', labelNames: ['result'], registers }),
    // A wake on the local runtime is ~0.1-2 s; the hold limit is 25 s.
    holdSeconds: new Histogram({ name: 'asb_router_hold_seconds', help: 'Time requests were held for a wake or lookup, by result.', labelNames: ['result'], buckets: [0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 25], registers }),
    held: new Gauge({ name: 'asb_router_held_requests', help: 'Requests held right now while their sandbox wakes or its id is looked up.', registers }),
    wakesTotal: new Counter({ name: 'asb_router_wakes_total', help: 'Resume calls made to wake a sandbox on first connection, by result.', labelNames: ['result'], registers }),
    feedMessagesTotal: new Counter({ name: 'asb_router_feed_messages_total', help: 'Route feed messages, by type and result (applied, stale, unsynced, foreign, invalid).', labelNames: ['type', 'result'], registers }),
    streamErrorsTotal: new Counter({ name: 'asb_router_stream_errors_total', help: 'ext_proc stream problems, by kind (unexpected message, write after end, handler error).', labelNames: ['kind'], registers }),
    ingressForwardsTotal: new Counter({ name: 'asb_router_ingress_forwards_total', help: "Requests forwarded to another cluster's ingress listener, by that cluster.", labelNames: ['cluster'], registers }),
    lookupsTotal: new Counter({
      name: 'asb_router_lookups_total',
      help: 'Lookups of sandbox ids the route table lacks, by result: found, missing, failed (asked the worker), rate_limited (429, the client spent its budget), busy (503, too many in flight).',
      labelNames: ['result'],
      registers,
    }),
    ingressResolveErrorsTotal: new Counter({ name: 'asb_router_ingress_resolve_errors_total', help: "Failed DNS lookups of other clusters' ingress addresses (the last good address is kept).", registers }),
  };
  // At 0 from the start, so the first failed wake is a rise Prometheus's increase() sees.
  for (const result of ['ok', 'failed']) metrics.wakesTotal.inc({ result }, 0);
  // And the hold that ends in a route, so the first held request is a rise in its buckets too.
  metrics.holdSeconds.zero({ result: 'route' });
  return metrics;
}
