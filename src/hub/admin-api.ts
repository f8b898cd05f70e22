// The hub's admin REST API: one request pipeline (authenticate → route → handler → reply) over
// routes split by area (keys, clusters, templates, system). It reuses the worker's router, key
// extraction and problem+json writer, so both APIs authenticate and fail the same way: every
// error leaves as application/problem+json with a stable code, and every request is counted by
// route pattern and status.
//
// Every route but /healthz needs an API key held in the hub's store. Admin keys may do
// everything; other keys may only read templates and the status summary (403 otherwise).
import type { IncomingMessage, ServerResponse } from 'node:http';
import { randomUUID } from 'node:crypto';
import type { Registry } from 'prom-client';
import { AsbError } from '../errors.ts';
import type { ObjectStore } from '../store/store.ts';
import { systemClock, type Clock } from '../system/clock.ts';
import type { Logger } from '../system/log.ts';
import { DEFAULT_JSON_LIMIT_BYTES } from '../worker/body.ts';
import type { Authenticator } from '../worker/deps.ts';
import { AUTH_HINT, presentedKey } from '../worker/presented-key.ts';
import { toAsbError, writeProblem } from '../worker/problem.ts';
import { createRouter, type Reply, type Route } from '../worker/router.ts';
import type { HubContext, SyncView } from './hub-context.ts';
import { createHubMetrics } from './hub-metrics.ts';
import { clusterRoutes } from './routes-clusters.ts';
import { keyRoutes } from './routes-keys.ts';
import { hubSystemRoutes } from './routes-system.ts';
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
  /** Live sync state, overlaid on the stored Cluster status in views. */
  sync?: SyncView;
}

export interface HubApi {
  /** The node:http request listener. */
  handler: (req: IncomingMessage, res: ServerResponse) => void;
  /** Every registered route (method + pattern). */
  routes: readonly Pick<Route, 'method' | 'pattern'>[];
}

function writeReply(res: ServerResponse, reply: Reply): void {
  if ('json' in reply) {
    const body = JSON.stringify(reply.json);
    res.writeHead(reply.status, { ...reply.headers, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  } else if ('bytes' in reply) {
    res.writeHead(reply.status, { 'content-type': reply.contentType, 'content-length': reply.bytes.byteLength });
    res.end(reply.bytes);
  } else {
    res.writeHead(204);
    res.end();
  }
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
  const router = createRouter([...hubSystemRoutes(h), ...keyRoutes(h), ...clusterRoutes(h), ...templateRoutes(h)]);
  const requests = createHubMetrics(deps.registry).httpRequestsTotal;

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<string> {
    const reqLog = log.child({ reqId: randomUUID() });
    let label = 'unmatched';
    try {
      const url = new URL(req.url ?? '/', 'http://hub.invalid');
      const resolution = router.resolve(req.method ?? '', url.pathname);
      const route = resolution.kind === 'match' ? resolution.match.route : undefined;
      if (resolution.kind !== 'none') label = route?.pattern ?? (resolution.kind === 'method' ? resolution.pattern : label);
      let principal;
      if (route?.auth !== false) {
        const key = presentedKey(req);
        if (key === undefined) throw new AsbError('Unauthorized', `no API key: ${AUTH_HINT}`);
        principal = deps.auth.verify(key);
        if (principal === undefined) throw new AsbError('Unauthorized', `the API key is unknown to the hub or revoked (or not of the form asb_<8 chars>_<32 chars>); ${AUTH_HINT}`);
      }
      if (resolution.kind === 'none') throw new AsbError('NotFound', `no such route on the hub: ${req.method ?? ''} ${url.pathname}`);
      if (resolution.kind === 'method') {
        const allow = resolution.allow.join(', ');
        res.setHeader('allow', allow);
        throw new AsbError('MethodNotAllowed', `${req.method ?? ''} is not allowed on ${url.pathname}; allowed: ${allow}`);
      }
      const reply = await resolution.match.route.handler({
        req,
        params: resolution.match.params,
        query: url.searchParams,
        principal,
        log: principal === undefined ? reqLog : reqLog.child({ team: principal.team, key: principal.prefix }),
      });
      writeReply(res, reply);
      return label;
    } catch (err) {
      const problem = toAsbError(err);
      if (problem.code === 'Internal') reqLog.error({ err, method: req.method, url: req.url }, 'request failed');
      else reqLog.debug({ code: problem.code, detail: problem.message }, 'request rejected');
      const headers: Record<string, string> = problem.code === 'Unauthorized' ? { 'www-authenticate': 'Bearer realm="asb-hub"' } : {};
      if (res.headersSent) res.destroy();
      else writeProblem(res, problem, headers);
      return label;
    }
  }

  return {
    handler(req, res) {
      handle(req, res).then(
        (route) => requests.inc({ route, code: String(res.statusCode) }),
        (err: unknown) => {
          log.error({ err }, 'request pipeline failed');
          res.destroy();
        },
      );
    },
    routes: router.routes.map((r) => ({ method: r.method, pattern: r.pattern })),
  };
}
