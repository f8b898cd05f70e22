// The worker REST API: a factory that composes the routes (one file per area) behind one
// request pipeline: authenticate → route → handler → reply, with every error converted once
// into application/problem+json and every request counted by route pattern and status.
//
// WebSocket upgrades (the route feed, terminals) go through `upgrade`, which a caller that owns
// its server attaches to the server's 'upgrade' event; it dispatches on the path.
//
// The Kubernetes API (/api, /apis, /version, /openapi/v3: src/kubeapi/) is a surface of its own
// beside the REST pipeline, with its own error format, on the same store, keys and tenancy.
//
// Shutdown order in close(): abort requests proxied to pods for the X-Sandbox-* headers, close the route feed's and the terminals' WebSockets (goingAway; an upgraded socket would keep
// server.close() waiting forever) and end the Kubernetes API's watches, stop accepting connections, end idle keep-alive sockets, wait
// for in-flight requests, then stop the sandbox index watch. The key ring and the store belong to
// the caller and are closed by it afterwards.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import type { AddressInfo } from 'node:net';
import { createSecretKey, randomBytes } from 'node:crypto';
import { systemClock } from '../base/clock.ts';
import { createAccessTokens } from './access-token.ts';
import { DEFAULT_JSON_LIMIT_BYTES, DEFAULT_UPLOAD_LIMIT_BYTES } from '../http/body.ts';
import type { DataPlane, WorkerContext, WorkerDeps, WorkerLimits } from './deps.ts';
import { createPipeline } from '../http/pipeline.ts';
import { createRouter, type Route, type Router } from '../http/router.ts';
import { objectRoutes } from './routes-objects.ts';
import { activityRoutes } from './routes-activity.ts';
import { createFeedUpgrade, feedRoutes } from './route-feed/endpoint.ts';
import { RouteFeed } from './route-feed/feed.ts';
import { fileRoutes } from './routes-files.ts';
import { sandboxRoutes } from './routes-sandboxes.ts';
import { snapshotRoutes } from './routes-snapshots.ts';
import { buildRoutes } from './routes-builds.ts';
import { e2bSnapshotRoutes } from './e2b/snapshots.ts';
import { e2bRoutes } from './e2b/routes.ts';
import { e2bTemplateRoutes } from './e2b/templates.ts';
import { egressRoutes } from './routes-egress.ts';
import { e2bEventRoutes, eventRoutes, eventsApiOf } from './routes-events.ts';
import { systemRoutes } from './routes-system.ts';
import { SandboxIndex } from './sandbox-index.ts';
import { TERMINAL_TOKEN_TTL_MS } from '../terminal/contract.ts';
import { terminalRoutes } from './terminal/routes.ts';
import { DEFAULT_TERMINAL_IDLE_MS, TerminalEndpoint, terminalPathId } from './terminal/endpoint.ts';
import { createTerminalTokens } from './terminal/token.ts';
import { UserIds } from './envd/users.ts';
import { Envd, isEnvdRequest } from './envd/envd.ts';
import { isKubeApiPath, KubeApi } from '../kubeapi/server.ts';
import { SandboxRouterProxy } from './sandbox-router/proxy.ts';
import { isSigsRequest } from './sandbox-router/request.ts';
import { boundSandboxCalls } from './sandbox-calls.ts';
import { DEFAULT_UPLOADS_PER_KEY, DEFAULT_UPLOADS_TOTAL, UploadSlots } from './upload-slots.ts';
import { createMcpEndpoint, isMcpPath } from '../mcp/http-endpoint.ts';

export interface WorkerServer {
  /** The node:http request listener, for callers that own their server. */
  handler: (req: IncomingMessage, res: ServerResponse) => void;
  /** Every registered route (method + pattern), e.g. to check the OpenAPI file covers them. */
  routes: readonly Pick<Route, 'method' | 'pattern'>[];
  /** The node:http 'upgrade' listener (WebSocket endpoints: the route feed, terminals). */
  upgrade: (req: IncomingMessage, socket: Duplex, head: Buffer) => void;
  /** Closes long-lived upgraded connections (route feeds, terminals with goingAway), so the caller's server.close() can finish. Idempotent. */
  closeStreams(): void;
  /** The route feed, e.g. for its connection count. */
  readonly routeFeed: RouteFeed;
  /** The terminal endpoint, e.g. for its session count. */
  readonly terminals: TerminalEndpoint;
  /** Starts an HTTP server on host:port (port 0 picks a free one). */
  listen(port: number, host?: string): Promise<AddressInfo>;
  /** Idempotent. */
  close(): Promise<void>;
}

const DEFAULT_LIMITS: WorkerLimits = {
  jsonBytes: DEFAULT_JSON_LIMIT_BYTES,
  uploadBytes: DEFAULT_UPLOAD_LIMIT_BYTES,
  uploadsPerKey: DEFAULT_UPLOADS_PER_KEY,
  uploadsTotal: DEFAULT_UPLOADS_TOTAL,
  waitReadyMs: 60_000,
  execOutputBytes: 8 * 1024 * 1024,
  snapshotsPerTeam: 100,
  snapshotBytesPerTeam: 100 * 2 ** 30,
};

/** The path of a request target, without its query. */
function pathOf(url: string | undefined): string {
  const target = url ?? '/';
  const q = target.indexOf('?');
  return q === -1 ? target : target.slice(0, q);
}

export async function createWorkerServer(deps: WorkerDeps): Promise<WorkerServer> {
  const log = deps.log.child({ component: 'worker-api' });
  const clock = deps.clock ?? systemClock;
  const index = await SandboxIndex.open(deps.store, log, clock, (id) => deps.runtime.state(id).uid);
  const dataPlane: DataPlane = Object.freeze({
    domain: deps.dataPlane?.domain ?? 'asb.localhost',
    edgeUrl: deps.dataPlane?.edgeUrl ?? 'http://127.0.0.1:10000',
    ...(deps.dataPlane?.edgeTlsUrl === undefined ? {} : { edgeTlsUrl: deps.dataPlane.edgeTlsUrl }),
    tokens: deps.dataPlane?.tokens ?? createAccessTokens(randomBytes(32)),
  });
  const routeFeed = await RouteFeed.open({
    store: deps.store,
    cluster: deps.cluster.name,
    tokens: dataPlane.tokens,
    log,
    clock,
    registry: deps.registry,
    // Routers send creates and lists to the hub only while this worker's hub link is up.
    ...(deps.sync === undefined ? {} : { hubConnected: () => deps.sync?.().connected ?? false }),
    ...deps.routeFeed,
  });
  const feedUpgrade = createFeedUpgrade({ feed: routeFeed, auth: deps.auth, log });
  // Terminal tokens are signed with a key derived from the cluster secret: the HMAC of a name no
  // sandbox id can take (ids have no ':'), so they verify on every worker of the cluster and
  // survive a restart, and no access token is ever a terminal-token key.
  const terminalTokens = createTerminalTokens({
    key: createSecretKey(Buffer.from(dataPlane.tokens.derive('asb:terminal-token-key'), 'utf8')),
    clock,
    ttlMs: deps.terminal?.tokenTtlMs ?? TERMINAL_TOKEN_TTL_MS,
  });

  const w: WorkerContext = Object.freeze({
    store: deps.store,
    runtime: boundSandboxCalls(deps.runtime, clock, deps.sandboxCallLimits),
    operator: deps.operator,
    registry: deps.registry,
    log,
    clock,
    cluster: deps.cluster,
    version: deps.version ?? '0.0.0',
    defaultNamespace: deps.defaultNamespace ?? 'default',
    limits: Object.freeze({ ...DEFAULT_LIMITS, ...deps.limits }),
    index,
    dataPlane,
    sync: deps.sync,
    reportToHub: deps.reportToHub,
    egressCredentials: deps.egressCredentials,
    egressProxy: deps.egressProxy ?? false,
    builds: deps.builds,
    events: deps.events,
    webhookAllowPrivate: deps.webhookAllowPrivate ?? false,
  });
  const terminalEndpoint = new TerminalEndpoint({ w, auth: deps.auth, tokens: terminalTokens, idleMs: deps.terminal?.idleMs ?? DEFAULT_TERMINAL_IDLE_MS, registry: deps.registry });
  const uploads = new UploadSlots({ perKey: w.limits.uploadsPerKey, total: w.limits.uploadsTotal });
  const users = new UserIds(w.runtime);
  const envd = new Envd(w, uploads, users);
  const kubeApi = new KubeApi({ w, auth: deps.auth, requests: deps.metrics.httpRequestsTotal });
  const sandboxRouter = new SandboxRouterProxy(w, deps.auth, uploads, users);
  const closeStreams = (): void => {
    envd.close();
    sandboxRouter.close();
    users.close();
    kubeApi.close();
    feedUpgrade.close();
    routeFeed.close();
    terminalEndpoint.close();
  };
  const upgrade = (req: IncomingMessage, socket: Duplex, head: Buffer): void => {
    const path = new URL(req.url ?? '/', 'http://worker.invalid').pathname;
    if (terminalPathId(path) !== undefined) terminalEndpoint.handle(req, socket, head);
    else feedUpgrade.handle(req, socket, head);
  };
  const router: Router = createRouter([
    ...systemRoutes(w),
    ...egressRoutes(w),
    ...objectRoutes(w),
    ...sandboxRoutes(w),
    ...snapshotRoutes(w),
    ...fileRoutes(w, uploads),
    ...buildRoutes(w, uploads),
    ...activityRoutes(w),
    ...feedRoutes(),
    ...terminalRoutes(w, terminalTokens),
    ...e2bRoutes(w, deps.auth),
    // Before the snapshots' DELETE /templates/{id}: /templates/tags is a literal path of its own.
    ...e2bTemplateRoutes(w, deps.auth, uploads),
    ...e2bSnapshotRoutes(w, deps.auth),
    ...eventRoutes(eventsApiOf(w)),
    ...e2bEventRoutes(eventsApiOf(w), deps.auth),
  ]);
  const requests = deps.metrics.httpRequestsTotal;

  const api = createPipeline({
    router,
    auth: deps.auth,
    log,
    requests,
    errors: deps.metrics.apiErrorsTotal,
    server: 'the worker',
    realm: 'asb',
    routesHint: '; the routes are listed in docs/openapi.yaml',
  });
  // MCP (streamable HTTP) beside the REST pipeline: its tools call the REST routes with the caller's key.
  const mcp = createMcpEndpoint({ auth: deps.auth, log, requests, errors: deps.metrics.apiErrorsTotal, server: 'the worker', realm: 'asb', version: w.version });
  // envd (the E2B SDK's in-sandbox API) for requests the router sent for a sandbox's port 49983:
  // kept apart from our API, with its own auth (the sandbox's access token) and error format.
  // Requests the router sent by the kubernetes-sigs X-Sandbox-* headers (any path, any port):
  // checked against the team's API key and proxied to the pod (sandbox-router/). First, as their
  // paths may look like envd's.
  const handler = (req: IncomingMessage, res: ServerResponse): void => {
    if (isSigsRequest(req.headers)) {
      res.once('finish', () => requests.inc({ route: 'sandbox-router', code: String(res.statusCode) }));
      sandboxRouter.handle(req, res);
    } else if (isEnvdRequest(req)) {
      res.once('finish', () => requests.inc({ route: 'envd', code: String(res.statusCode) }));
      envd.handle(req, res);
    } else if (isKubeApiPath(pathOf(req.url))) {
      kubeApi.handle(req, res);
    } else if (isMcpPath(req.url)) {
      mcp(req, res);
    } else {
      api(req, res);
    }
  };

  let server: Server | undefined;
  let closing: Promise<void> | undefined;
  return {
    handler,
    routes: router.routes.map((r) => ({ method: r.method, pattern: r.pattern })),
    upgrade,
    closeStreams,
    routeFeed,
    terminals: terminalEndpoint,
    listen(port, host = '127.0.0.1') {
      if (server !== undefined) return Promise.reject(new Error('worker API is already listening'));
      const s = createServer(handler);
      s.on('upgrade', upgrade);
      server = s;
      return new Promise<AddressInfo>((resolve, reject) => {
        s.once('error', reject);
        s.listen(port, host, () => {
          s.off('error', reject);
          resolve(s.address() as AddressInfo);
        });
      });
    },
    close() {
      closing ??= (async () => {
        closeStreams();
        const s = server;
        if (s !== undefined) {
          const closed = new Promise<void>((resolve) => s.close(() => resolve()));
          s.closeIdleConnections();
          await closed;
        }
        index.close();
      })();
      return closing;
    },
  };
}
