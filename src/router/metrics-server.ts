// The router's Prometheus metrics over HTTP (--metrics-listen): GET /metrics serves its registry
// (the asb_router_* series) for the admin key the router already holds to reach its workers, the
// same key a worker's /metrics takes. It runs the same request pipeline as the worker's and the
// hub's APIs (worker/pipeline.ts), so a refusal is the same problem+json answer and every request
// is counted in asb_router_http_requests_total. The ext_proc hot path never waits on it.
import { createHash, timingSafeEqual } from 'node:crypto';
import { createServer } from 'node:http';
import { Counter, type Registry } from 'prom-client';
import type { Principal } from '../auth/keyring.ts';
import { parseHostPort } from '../base/host-port.ts';
import { listen } from '../http/http-server.ts';
import type { Logger } from '../base/log.ts';
import { createPipeline } from '../http/pipeline.ts';
import { createRouter } from '../http/router.ts';

export interface MetricsServer {
  /** host:port it listens on (an IPv6 host in brackets). */
  readonly address: string;
  close(): Promise<void>;
}

const digest = (text: string): Buffer => createHash('sha256').update(text).digest();

/** The one key this listener takes, compared as digests: equal lengths, constant time. */
function singleKey(key: string): { verify(presented: string): Principal | undefined } {
  const expected = digest(key);
  // The prefix (asb_xxxxxxxx) is the key's public part, safe to log.
  const principal: Principal = { team: 'admin', admin: true, prefix: key.slice(0, 12) };
  return { verify: (presented) => (timingSafeEqual(digest(presented), expected) ? principal : undefined) };
}

export async function startMetricsServer(opts: { listen: string; registry: Registry; key: string; log: Logger }): Promise<MetricsServer> {
  const at = parseHostPort(opts.listen);
  if (at === undefined) throw new Error(`the router's metrics listener needs host:port or [v6]:port, got "${opts.listen}"`);
  const requests = new Counter({ name: 'asb_router_http_requests_total', help: "Requests on the router's metrics listener, by route pattern and status code.", labelNames: ['route', 'code'], registers: [opts.registry] });
  const routes = [{ method: 'GET' as const, pattern: '/metrics', handler: async () => ({ status: 200, bytes: Buffer.from(await opts.registry.metrics(), 'utf8'), contentType: opts.registry.contentType }) }];
  const server = createServer(
    createPipeline({ router: createRouter(routes), auth: singleKey(opts.key), log: opts.log, requests, server: "the router's metrics listener", realm: 'asb-router', routesHint: '; it serves GET /metrics' }),
  );
  await listen(server, at.port, at.host);
  const bound = server.address();
  const port = typeof bound === 'object' && bound !== null ? bound.port : at.port;
  const address = at.host.includes(':') ? `[${at.host}]:${String(port)}` : `${at.host}:${String(port)}`;
  let closing: Promise<void> | undefined;
  return {
    address,
    close() {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return closing;
    },
  };
}
