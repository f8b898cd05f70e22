// The hub's own metrics, created against the injected prom-client Registry (no global registry),
// so a test can run a hub and workers in one process without name clashes.
import { Counter, type Registry } from 'prom-client';
import type { HubMetrics } from './hub-context.ts';

export function createHubMetrics(registry: Registry): HubMetrics {
  return {
    httpRequestsTotal: new Counter({
      name: 'asb_hub_http_requests_total',
      help: 'Hub admin API requests by route pattern and status code.',
      labelNames: ['route', 'code'],
      registers: [registry],
    }),
  };
}
