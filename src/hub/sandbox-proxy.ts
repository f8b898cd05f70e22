// The hub's proxy for one sandbox's API: every `/v1/sandboxes/{id}` and `/v1/sandboxes/{id}/...`
// request (GET, POST, PUT, DELETE) goes to the worker of the cluster whose tag starts the id
// (src/hub/sandbox-owner.ts), with the caller's headers (its Authorization or X-API-Key: the
// worker checks the key again and scopes by team) and query string. Bodies stream both ways, so
// a file upload or a long exec answer costs the hub a socket buffer, not the whole body.
//
// The hub authenticates the key first, so a bad key gets 401 without any worker being asked.
// Refusals of the hub's own (401, 404 unknown tag, 503 cluster away, 502 connection lost before
// an answer) are problem+json; the worker's answers pass through as they came, status, headers and
// body, with `x-asb-cluster` added.
import { Agent as HttpAgent, request as httpRequest, type IncomingMessage, type OutgoingHttpHeaders, type ServerResponse } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import type { Socket } from 'node:net';
import type { Counter } from 'prom-client';
import type { Principal } from '../auth/keyring.ts';
import { AsbError } from '../errors.ts';
import type { ObjectStore } from '../store/store.ts';
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { AUTH_HINT, presentedKey } from '../http/presented-key.ts';
import { toAsbError, writeProblem } from '../http/problem.ts';
import type { SyncView } from './hub-context.ts';
import { ownerOf } from './sandbox-owner.ts';

/** The metrics label of every proxied request: one series, whatever the id and sub-path. */
export const PROXY_ROUTE_LABEL = '/v1/sandboxes/{id}/*';

const METHODS: ReadonlySet<string> = new Set(['GET', 'POST', 'PUT', 'DELETE']);
/** Headers that describe one connection, not the message (RFC 9110 §7.6.1), plus host. */
const HOP_BY_HOP: ReadonlySet<string> = new Set(['connection', 'keep-alive', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'host']);

/** The sandbox id of a path the proxy serves, or undefined. */
export function proxiedSandboxId(path: string): string | undefined {
  const parts = path.split('/');
  if (parts.length < 4 || parts[0] !== '' || parts[1] !== 'v1' || parts[2] !== 'sandboxes') return undefined;
  const segment = parts[3] ?? '';
  if (segment === '') return undefined;
  try {
    return decodeURIComponent(segment);
  } catch {
    return undefined;
  }
}

export function forwardedHeaders(headers: IncomingMessage['headers']): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  const named = new Set((headers.connection ?? '').split(',').map((s) => s.trim().toLowerCase()));
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || HOP_BY_HOP.has(name) || named.has(name)) continue;
    out[name] = value;
  }
  return out;
}

export interface SandboxProxyOptions {
  store: ObjectStore;
  sync: SyncView | undefined;
  auth: { verify(presented: string): Principal | undefined };
  log: Logger;
  clock: Clock;
  requests: Counter<'route' | 'code'>;
  /** To connect to a worker; past it the caller gets 503. Default 2 s, as placement. */
  connectTimeoutMs?: number;
}

export interface SandboxProxy {
  /** A node:http request listener for paths proxiedSandboxId() accepts. */
  handle(req: IncomingMessage, res: ServerResponse): void;
  /** Closes the keep-alive connections to workers. */
  close(): void;
}

/** The caller's key checked at the hub: 401 before any worker is asked. */
export function authenticate(auth: SandboxProxyOptions['auth'], req: IncomingMessage): Principal {
  const key = presentedKey(req);
  if (key === undefined) throw new AsbError('Unauthorized', `no API key: ${AUTH_HINT}`);
  const principal = auth.verify(key);
  if (principal === undefined) throw new AsbError('Unauthorized', `the API key is unknown to the hub or revoked (or not of the form asb_<8 chars>_<32 chars>); ${AUTH_HINT}`);
  return principal;
}

export function createSandboxProxy(opts: SandboxProxyOptions): SandboxProxy {
  const log = opts.log.child({ component: 'sandbox-proxy' });
  const connectTimeoutMs = opts.connectTimeoutMs ?? 2_000;
  const http = new HttpAgent({ keepAlive: true });
  const https = new HttpsAgent({ keepAlive: true });

  async function forward(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://hub.invalid');
    const id = proxiedSandboxId(url.pathname) ?? '';
    const principal = authenticate(opts.auth, req);
    if (!METHODS.has(req.method ?? '')) {
      res.setHeader('allow', [...METHODS].join(', '));
      throw new AsbError('MethodNotAllowed', `${req.method ?? ''} is not allowed on ${url.pathname}; allowed: ${[...METHODS].join(', ')}`);
    }
    const owner = await ownerOf(opts.store, opts.sync, id);
    const target = new URL(`${owner.apiUrl}${url.pathname}${url.search}`);
    const secure = target.protocol === 'https:';
    const reqLog = log.child({ cluster: owner.cluster, team: principal.team, key: principal.prefix });

    await new Promise<void>((resolve, reject) => {
      let connected = false;
      const upstream = (secure ? httpsRequest : httpRequest)(target, { method: req.method, headers: forwardedHeaders(req.headers), agent: secure ? https : http });
      const timer = opts.clock.after(connectTimeoutMs, () => {
        if (connected) return;
        upstream.destroy();
        reject(new AsbError('Unavailable', `cluster "${owner.cluster}", which holds sandbox "${id}", did not accept a connection within ${connectTimeoutMs} ms`));
      });
      upstream.on('socket', (socket: Socket) => {
        if (!socket.connecting) connected = true;
        else socket.once('connect', () => (connected = true));
      });
      upstream.on('error', (err: NodeJS.ErrnoException) => {
        timer.cancel();
        if (res.headersSent) {
          reqLog.warn({ err: err.message }, 'connection to the worker lost mid-answer');
          res.destroy();
          resolve();
          return;
        }
        const why = err.code ?? err.message;
        reject(
          connected
            ? new AsbError('Unavailable', `cluster "${owner.cluster}", which holds sandbox "${id}", closed the connection before answering (${why})`, { cause: err })
            : new AsbError('Unavailable', `cluster "${owner.cluster}", which holds sandbox "${id}", is unreachable (${why})`, { cause: err }),
        );
      });
      upstream.on('response', (answer: IncomingMessage) => {
        timer.cancel();
        res.writeHead(answer.statusCode ?? 502, { ...forwardedHeaders(answer.headers), 'x-asb-cluster': owner.cluster });
        answer.pipe(res);
        answer.on('error', () => res.destroy());
        res.on('close', () => {
          if (!res.writableFinished) answer.destroy();
          resolve();
        });
      });
      // The caller went away before the answer: the worker need not finish writing it.
      res.on('close', () => {
        if (!res.writableFinished) upstream.destroy();
      });
      req.pipe(upstream);
    });
  }

  return {
    handle(req, res) {
      forward(req, res)
        .catch((err: unknown) => {
          const problem = toAsbError(err);
          if (problem.code === 'Internal') log.error({ err, method: req.method, url: req.url }, 'proxied request failed');
          if (res.headersSent) res.destroy();
          else writeProblem(res, problem, problem.code === 'Unauthorized' ? { 'www-authenticate': 'Bearer realm="asb-hub"' } : {});
        })
        .finally(() => opts.requests.inc({ route: PROXY_ROUTE_LABEL, code: String(res.statusCode) }));
    },
    close() {
      http.destroy();
      https.destroy();
    },
  };
}
