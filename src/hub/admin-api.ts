// The hub's admin REST API: one request pipeline (authenticate → route → handler → reply) over
// routes split by area (keys, clusters, templates, system). It reuses the worker's router, key
// extraction and problem+json writer, so both APIs authenticate and fail the same way: every
// error leaves as application/problem+json with a stable code, and every request is counted by
// route pattern and status.
//
// Every route but /healthz needs an API key held in the hub's store. Admin keys may do
// everything; other keys may read templates, the status summary and GET /v1/federation, and
// create and list their team's sandboxes, which the hub places on and gathers from worker
// clusters (403 otherwise). Two paths bypass the router: /v1/sandboxes/{id}[/...] streams to the
// owning worker (src/hub/sandbox-proxy.ts, still keyed first), and /console/ serves the web
// console's files without a key (src/hub/console-files.ts).
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Registry } from 'prom-client';
import type { ObjectStore } from '../store/store.ts';
import { systemClock, type Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { DEFAULT_JSON_LIMIT_BYTES } from '../http/body.ts';
import type { Authenticator } from '../auth/keyring.ts';
import { createPipeline } from '../http/pipeline.ts';
import { createRouter, type Route } from '../http/router.ts';
import type { HubContext, SyncView } from './hub-context.ts';
import { createHubMetrics } from './hub-metrics.ts';
import { isConsolePath, loadConsoleFiles } from './console-files.ts';
import { clusterRoutes } from './routes-clusters.ts';
import { federationRoutes } from './routes-federation.ts';
import { keyRoutes } from './routes-keys.ts';
import type { PlacementOptions } from './forward.ts';
import { sandboxHubRoutes } from './routes-sandboxes.ts';
import { hubSystemRoutes } from './routes-system.ts';
import { createSandboxProxy, proxiedSandboxId } from './sandbox-proxy.ts';
import { createMcpEndpoint, MCP_PATH } from '../mcp/http-endpoint.ts';
import { templateRoutes } from './routes-templates.ts';

export interface HubApiDeps {
  store: ObjectStore;
  auth: Authenticator;
  log: Logger;
  registry: Registry;
  clock?: Clock;
  version?: string;
  /** Largest JSON body; default 1 MiB, as on the worker. */
  jsonBytes?: number;
  /** Live sync state, overlaid on the stored Cluster status in views, and what placement reads. */
  sync?: SyncView;
  /** Deadlines of placement's calls to workers. */
  placement?: PlacementOptions;
}

export interface HubApi {
  /** The node:http request listener. */
  handler: (req: IncomingMessage, res: ServerResponse) => void;
  /** Every registered route (method + pattern). */
  routes: readonly Pick<Route, 'method' | 'pattern'>[];
  /** Closes the API's connections to workers; after the HTTP server stopped taking requests. */
  close(): void;
}

export function createHubApi(deps: HubApiDeps): HubApi {
  const log = deps.log.child({ component: 'hub-api' });
  const h: HubContext = Object.freeze({
    store: deps.store,
    log,
    clock: deps.clock ?? systemClock,
    registry: deps.registry,
    version: deps.version ?? '0.0.0',
    jsonBytes: deps.jsonBytes ?? DEFAULT_JSON_LIMIT_BYTES,
    sync: deps.sync,
    defaultNamespace: 'default',
  });
  const sandboxes = sandboxHubRoutes(h, deps.auth, deps.placement);
  const router = createRouter([...hubSystemRoutes(h), ...keyRoutes(h), ...clusterRoutes(h), ...templateRoutes(h), ...federationRoutes(h), ...sandboxes.routes]);
  const requests = createHubMetrics(deps.registry).httpRequestsTotal;
  const pipeline = createPipeline({ router, auth: deps.auth, log, requests, server: 'the hub', realm: 'asb-hub' });
  const proxy = createSandboxProxy({ store: h.store, sync: h.sync, auth: deps.auth, log, clock: h.clock, requests, ...(deps.placement?.connectTimeoutMs === undefined ? {} : { connectTimeoutMs: deps.placement.connectTimeoutMs }) });
  const consoleFiles = loadConsoleFiles();
  // MCP (streamable HTTP): its tools call the hub's own REST routes (and, through its proxy, the workers') with the caller's key.
  const mcp = createMcpEndpoint({ auth: deps.auth, log, requests, server: 'the hub', realm: 'asb-hub', version: h.version });

  return {
    handler: (req, res) => {
      const path = new URL(req.url ?? '/', 'http://hub.invalid').pathname;
      if (proxiedSandboxId(path) !== undefined) proxy.handle(req, res);
      else if (path === MCP_PATH) mcp(req, res);
      else if (isConsolePath(path)) consoleFiles.handle(req, res);
      else pipeline(req, res);
    },
    routes: router.routes.map((r) => ({ method: r.method, pattern: r.pattern })),
    close: () => {
      sandboxes.close();
      proxy.close();
    },
  };
}
