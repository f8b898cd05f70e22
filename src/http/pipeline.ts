// The request pipeline both REST servers (the worker API and the hub's admin API) run:
// authenticate → route → handler → reply, every error converted once into
// application/problem+json, every request counted by route pattern and status, every error by code.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { randomUUID } from 'node:crypto';
import type { Counter } from 'prom-client';
import type { Principal } from '../auth/keyring.ts';
import { AsbError } from '../errors.ts';
import type { Logger } from '../base/log.ts';
import { AUTH_HINT, presentedKey } from './presented-key.ts';
import { toAsbError, writeProblem } from './problem.ts';
import type { Reply, Router } from './router.ts';

export interface PipelineOptions {
  router: Router;
  auth: { verify(presented: string): Principal | undefined };
  log: Logger;
  requests: Counter<'route' | 'code'>;
  /** Error answers by catalogue code (asb_api_errors_total), when this server counts them. */
  errors?: Counter<'code'>;
  /** Named in messages: "the worker", "the hub". */
  server: string;
  /** WWW-Authenticate realm. */
  realm: string;
  /** Appended to the 404 for an unknown route, e.g. where the routes are documented. */
  routesHint?: string;
}

export function writeReply(res: ServerResponse, reply: Reply): void {
  if ('json' in reply) {
    const body = JSON.stringify(reply.json);
    res.writeHead(reply.status, { ...reply.headers, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  } else if ('bytes' in reply) {
    res.writeHead(reply.status, { ...reply.headers, 'content-type': reply.contentType, 'content-length': reply.bytes.byteLength });
    res.end(reply.bytes);
  } else {
    res.writeHead(204);
    res.end();
  }
}

/** The caller's API key and whose it is; Unauthorized naming what was wrong when none is valid. */
export function authenticate(req: IncomingMessage, auth: PipelineOptions['auth'], server: string): { key: string; principal: Principal } {
  const key = presentedKey(req);
  if (key === undefined) throw new AsbError('Unauthorized', `no API key: ${AUTH_HINT}`);
  const principal = auth.verify(key);
  if (principal === undefined) throw new AsbError('Unauthorized', `the API key is unknown to ${server} or revoked (or not of the form asb_<8 chars>_<32 chars>); ${AUTH_HINT}`);
  return { key, principal };
}

/** A node:http request listener that runs the pipeline. */
export function createPipeline(opts: PipelineOptions): (req: IncomingMessage, res: ServerResponse) => void {
  const { router, auth, log, requests, errors } = opts;

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<string> {
    // The request's logger is made when something logs: a child logger and its id per request
    // were 6 of the 56 ms of request handling in a profile of 320 warm claims, and most requests
    // log nothing.
    let reqLogger: Logger | undefined;
    const reqLog = (): Logger => (reqLogger ??= log.child({ reqId: randomUUID() }));
    let label = 'unmatched';
    try {
      const url = new URL(req.url ?? '/', 'http://api.invalid');
      const resolution = router.resolve(req.method ?? '', url.pathname);
      const route = resolution.kind === 'match' ? resolution.match.route : undefined;
      if (resolution.kind !== 'none') label = route?.pattern ?? (resolution.kind === 'method' ? resolution.pattern : label);
      let principal: Principal | undefined;
      // Authentication comes before "no such route", so unauthenticated callers learn nothing.
      if (route?.auth !== false) principal = authenticate(req, auth, opts.server).principal;
      if (resolution.kind === 'none') throw new AsbError('NotFound', `no such route on ${opts.server}: ${req.method ?? ''} ${url.pathname}${opts.routesHint ?? ''}`);
      if (resolution.kind === 'method') {
        const allow = resolution.allow.join(', ');
        res.setHeader('allow', allow);
        throw new AsbError('MethodNotAllowed', `${req.method ?? ''} is not allowed on ${url.pathname}; allowed: ${allow}`);
      }
      let ctxLogger: Logger | undefined;
      const reply = await resolution.match.route.handler({
        req,
        params: resolution.match.params,
        query: url.searchParams,
        principal,
        get log() {
          ctxLogger ??= principal === undefined ? reqLog() : reqLog().child({ team: principal.team, key: principal.prefix });
          return ctxLogger;
        },
      });
      writeReply(res, reply);
      if ('errorCode' in reply) errors?.inc({ code: reply.errorCode });
      return label;
    } catch (err) {
      const problem = toAsbError(err);
      errors?.inc({ code: problem.code });
      if (problem.code === 'Internal') reqLog().error({ err, method: req.method, url: req.url }, 'request failed');
      else if (log.isLevelEnabled('debug')) reqLog().debug({ code: problem.code, detail: problem.message }, 'request rejected');
      const headers: Record<string, string> = problem.code === 'Unauthorized' ? { 'www-authenticate': `Bearer realm="${opts.realm}"` } : {};
      if (res.headersSent) res.destroy();
      else writeProblem(res, problem, headers);
      return label;
    }
  }

  return (req, res) => {
    handle(req, res).then(
      (route) => requests.inc({ route, code: String(res.statusCode) }),
      (err: unknown) => {
        log.error({ err }, 'request pipeline failed');
        res.destroy();
      },
    );
  };
}
