// The lifecycle events API and webhooks, in E2B's shape (its docs: "lifecycle events API",
// "lifecycle webhooks"), at /v1/events/… with our API's errors and at /events/… with E2B's:
//
//   GET    /events/sandboxes/{id}                  a sandbox's events (404 if the team has none for it)
//   GET    /events/sandboxes                       the team's events
//          ?offset (0) &limit (10, 1-100) &orderAsc (false) &types=<type> (repeatable)
//   POST   /events/webhooks                        {name?, url, signatureSecret, events?, enabled?} → 201
//   GET    /events/webhooks                        the team's webhooks (never their secrets)
//   GET    /events/webhooks/{id}
//   PATCH  /events/webhooks/{id}                   any of the fields above
//   DELETE /events/webhooks/{id}                   204; its queue goes with it
//   GET    /events/webhooks/{id}/deliveries        every delivery and its attempts (?offset, ?limit up to 1000)
//
// Everything is the caller's team's: another team's sandbox or webhook is a 404, as if absent.
// A webhook URL naming a private address or localhost is refused unless the worker runs with
// --webhook-allow-private (src/events/webhook-target.ts; deliveries check the address again).
import { AsbError, type FieldProblem } from '../errors.ts';
import type { EventLog, ListQuery } from '../events/event-log.ts';
import { EVENT_TYPES } from '../events/facts.ts';
import { privateHostProblem } from '../events/webhook-target.ts';
import { principalOf } from './access.ts';
import { readBody, readJson } from '../http/body.ts';
import type { EventsSource, WorkerContext } from './deps.ts';
import type { Authenticator } from '../auth/keyring.ts';
import { queryInt } from './input.ts';
import { isPlainObject } from '../http/body.ts';
import { forwardedHeaders } from '../http/presented-key.ts';
import type { Reply, RequestContext, Route } from '../http/router.ts';
import { e2bRoute } from './e2b/reply.ts';

const MAX_URL = 2048;
/** Below 16 characters a secret can be guessed; above 512 it is not a secret but a file. */
const SECRET_MIN = 16;
const SECRET_MAX = 512;
const NAME_MAX = 128;

/** What the events routes read: the source and the request limits. */
export interface EventsApi {
  source: EventsSource;
  jsonBytes: number;
  webhookAllowPrivate: boolean;
}

/** The events API of a worker's routes. */
export function eventsApiOf(w: WorkerContext): EventsApi {
  return { source: w.events, jsonBytes: w.limits.jsonBytes, webhookAllowPrivate: w.webhookAllowPrivate };
}

function logOf(e: EventsApi): EventLog {
  if (e.source === undefined || !('log' in e.source)) throw new AsbError('NotFound', 'this worker keeps no lifecycle events');
  return e.source.log;
}

// Request headers an API process passes on to the operator besides the caller's key: the body's type and the answer's.
const FORWARDED_HEADERS = ['content-type', 'accept'];
// The operator answers from its own SQLite file: anything past this is an operator in trouble.
const FORWARD_TIMEOUT_MS = 10_000;

/**
 * Passes the request on to the operator at `to`, as the caller sent it (method, path, query, key,
 * body), and its answer back as it came: the operator checks the key and the team again and
 * shapes its errors for the surface asked (ours or E2B's). Unreachable: 503, naming it.
 */
async function forward(to: string, e: EventsApi, ctx: RequestContext): Promise<Reply> {
  const method = ctx.req.method ?? 'GET';
  const body = method === 'GET' || method === 'DELETE' ? undefined : await readBody(ctx.req, e.jsonBytes);
  const headers = forwardedHeaders(ctx.req, FORWARDED_HEADERS);
  let answer: Response;
  let bytes: Uint8Array;
  try {
    answer = await fetch(new URL(ctx.req.url ?? '/', to), { method, headers, ...(body === undefined ? {} : { body }), signal: AbortSignal.timeout(FORWARD_TIMEOUT_MS) });
    bytes = new Uint8Array(await answer.arrayBuffer());
  } catch (err) {
    throw new AsbError('Unavailable', `the operator that keeps this cluster's lifecycle events (${to}) did not answer (${err instanceof Error ? err.message : String(err)}); try again shortly`, { cause: err });
  }
  if (answer.status === 204) return { status: 204 };
  return { status: answer.status, bytes, contentType: answer.headers.get('content-type') ?? 'application/json' };
}

function listQuery(query: URLSearchParams): ListQuery {
  const types = query.getAll('types').flatMap((t) => t.split(',')).filter((t) => t !== '');
  const unknown = types.filter((t) => !EVENT_TYPES.includes(t));
  if (unknown.length > 0) throw new AsbError('BadRequest', `types: unknown event type ${unknown.map((t) => JSON.stringify(t)).join(', ')}; known types are ${EVENT_TYPES.join(', ')}`, { fields: [{ field: 'types', message: 'unknown event type' }] });
  const order = query.get('orderAsc');
  if (order !== null && order !== 'true' && order !== 'false') throw new AsbError('BadRequest', `orderAsc must be true or false, got "${order}"`, { fields: [{ field: 'orderAsc', message: 'must be true or false' }] });
  return { offset: queryInt(query, 'offset', 0, 1_000_000) ?? 0, limit: queryInt(query, 'limit', 1, 100) ?? 10, orderAsc: order === 'true', types };
}

interface WebhookInput { name?: string; url?: string; secret?: string; events?: string[]; enabled?: boolean }

/**
 * The webhook fields of a body, or 422 naming every bad one. `create`: url and signatureSecret
 * are required. `allowPrivate` (--webhook-allow-private): a URL may name a private address or
 * localhost; without it such a URL is refused here, and any other is still checked at delivery.
 */
export function parseWebhookBody(raw: unknown, create: boolean, allowPrivate: boolean): WebhookInput {
  if (!isPlainObject(raw)) throw new AsbError('BadRequest', 'request body must be a JSON object with url and signatureSecret');
  const problems: FieldProblem[] = [];
  const out: WebhookInput = {};
  const allowed = ['name', 'url', 'signatureSecret', 'events', 'enabled'];
  for (const k of Object.keys(raw)) if (!allowed.includes(k)) problems.push({ field: k, message: `unknown field; allowed fields are ${allowed.join(', ')}` });
  const { name, url, signatureSecret, events, enabled } = raw;
  if (name !== undefined) {
    if (typeof name !== 'string' || name.length === 0 || name.length > NAME_MAX) problems.push({ field: 'name', message: `must be a string of 1 to ${String(NAME_MAX)} characters` });
    else out.name = name;
  }
  if (url === undefined) {
    if (create) problems.push({ field: 'url', message: 'is required: the http(s) URL each event is POSTed to' });
  } else {
    const why = urlProblem(url, allowPrivate);
    if (why !== undefined) problems.push({ field: 'url', message: why });
    else out.url = url as string;
  }
  if (signatureSecret === undefined) {
    if (create) problems.push({ field: 'signatureSecret', message: 'is required: the secret each delivery is signed with (HMAC-SHA256)' });
  } else if (typeof signatureSecret !== 'string' || signatureSecret.length < SECRET_MIN || signatureSecret.length > SECRET_MAX || /[\0\r\n]/.test(signatureSecret)) {
    problems.push({ field: 'signatureSecret', message: `must be a string of ${String(SECRET_MIN)} to ${String(SECRET_MAX)} characters without CR, LF or NUL` });
  } else out.secret = signatureSecret;
  if (events !== undefined) {
    if (!Array.isArray(events) || !events.every((e): e is string => typeof e === 'string')) problems.push({ field: 'events', message: 'must be an array of event types' });
    else {
      const unknown = events.filter((e) => !EVENT_TYPES.includes(e));
      if (unknown.length > 0) problems.push({ field: 'events', message: `unknown event type ${unknown.map((e) => JSON.stringify(e)).join(', ')}; known types are ${EVENT_TYPES.join(', ')}` });
      else out.events = [...new Set(events)];
    }
  }
  if (enabled !== undefined) {
    if (typeof enabled !== 'boolean') problems.push({ field: 'enabled', message: 'must be true or false' });
    else out.enabled = enabled;
  }
  if (problems.length > 0) throw new AsbError('Invalid', `invalid webhook: ${problems.map((p) => `${p.field}: ${p.message}`).join('; ')}`, { fields: problems });
  return out;
}

function urlProblem(url: unknown, allowPrivate: boolean): string | undefined {
  if (typeof url !== 'string' || url.length === 0) return 'must be a string: an absolute http:// or https:// URL';
  if (url.length > MAX_URL) return `must be at most ${String(MAX_URL)} characters`;
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return `"${url}" is not an absolute URL`;
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') return `scheme ${parsed.protocol} is not supported: use http:// or https://`;
  if (parsed.username !== '' || parsed.password !== '') return 'must not carry credentials: the signature authenticates deliveries';
  return allowPrivate ? undefined : privateHostProblem(parsed);
}

type Handler = (e: EventsApi, ctx: RequestContext) => Promise<Reply>;

const handlers: Record<string, Handler> = {
  sandboxEvents: (e, ctx) => {
    const id = ctx.params.id ?? '';
    const events = logOf(e).sandboxEvents(principalOf(ctx).team, id, listQuery(ctx.query));
    if (events === undefined) throw new AsbError('NotFound', `sandbox ${id} has no events for your team (it is not yours, or its events are past their retention)`);
    return Promise.resolve({ status: 200, json: events });
  },
  teamEvents: (e, ctx) => Promise.resolve({ status: 200, json: logOf(e).teamEvents(principalOf(ctx).team, listQuery(ctx.query)) }),
  createWebhook: async (e, ctx) => {
    const log = logOf(e);
    const input = parseWebhookBody(await readJson(ctx.req, e.jsonBytes), true, e.webhookAllowPrivate);
    const hook = log.addWebhook(principalOf(ctx).team, { name: input.name ?? 'webhook', url: input.url ?? '', secret: input.secret ?? '', events: input.events ?? [], enabled: input.enabled ?? true });
    return { status: 201, json: hook };
  },
  listWebhooks: (e, ctx) => Promise.resolve({ status: 200, json: logOf(e).webhooks(principalOf(ctx).team) }),
  getWebhook: (e, ctx) => Promise.resolve({ status: 200, json: ownWebhook(e, ctx) }),
  updateWebhook: async (e, ctx) => {
    const log = logOf(e);
    const team = principalOf(ctx).team;
    ownWebhook(e, ctx);
    const input = parseWebhookBody(await readJson(ctx.req, e.jsonBytes), false, e.webhookAllowPrivate);
    log.updateWebhook(team, ctx.params.id ?? '', input);
    return { status: 200, json: ownWebhook(e, ctx) };
  },
  deleteWebhook: (e, ctx) => {
    if (!logOf(e).deleteWebhook(principalOf(ctx).team, ctx.params.id ?? '')) throw webhookNotFound(ctx.params.id ?? '');
    return Promise.resolve({ status: 204 });
  },
  deliveries: (e, ctx) => {
    const list = logOf(e).deliveries(principalOf(ctx).team, ctx.params.id ?? '', { offset: queryInt(ctx.query, 'offset', 0, 1_000_000) ?? 0, limit: queryInt(ctx.query, 'limit', 1, 1000) ?? 100 });
    if (list === undefined) throw webhookNotFound(ctx.params.id ?? '');
    return Promise.resolve({ status: 200, json: list });
  },
};

function webhookNotFound(id: string): AsbError {
  return new AsbError('NotFound', `webhook ${id} not found`);
}

function ownWebhook(e: EventsApi, ctx: RequestContext) {
  const hook = logOf(e).webhook(principalOf(ctx).team, ctx.params.id ?? '');
  if (hook === undefined) throw webhookNotFound(ctx.params.id ?? '');
  return hook;
}

const TABLE: readonly [Route['method'], string, keyof typeof handlers][] = [
  ['GET', '/events/sandboxes/{id}', 'sandboxEvents'],
  ['GET', '/events/sandboxes', 'teamEvents'],
  ['POST', '/events/webhooks', 'createWebhook'],
  ['GET', '/events/webhooks', 'listWebhooks'],
  ['GET', '/events/webhooks/{id}', 'getWebhook'],
  ['PATCH', '/events/webhooks/{id}', 'updateWebhook'],
  ['DELETE', '/events/webhooks/{id}', 'deleteWebhook'],
  ['GET', '/events/webhooks/{id}/deliveries', 'deliveries'],
];

/** The handler of one route: forwarded to the operator, or answered from the log here. */
function handlerOf(e: EventsApi, name: keyof typeof handlers): (ctx: RequestContext) => Promise<Reply> {
  const source = e.source;
  if (source !== undefined && 'forwardTo' in source) return (ctx) => forward(source.forwardTo, e, ctx);
  return (ctx) => handlers[name]?.(e, ctx) ?? Promise.reject(new AsbError('Internal', name));
}

/** Our API's: /v1/events/…, problem+json errors. */
export function eventRoutes(e: EventsApi): Route[] {
  return TABLE.map(([method, path, name]) => ({ method, pattern: `/v1${path}`, handler: handlerOf(e, name) }));
}

/** E2B's: /events/…, with E2B's X-API-Key and {code, message} errors. */
export function e2bEventRoutes(e: EventsApi, auth: Authenticator): Route[] {
  return TABLE.map(([method, path, name]) => e2bRoute(auth, method, path, handlerOf(e, name)));
}
