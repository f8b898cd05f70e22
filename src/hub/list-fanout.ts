// A list at the hub, whichever API it came in by (our GET /v1/sandboxes, E2B's GET /sandboxes and
// /v2/sandboxes): every connected cluster is asked in parallel, with the caller's query and key,
// and the caller's API merges the pages it gets. A cluster that cannot be asked (not connected,
// no API URL) or does not answer with a page is reported as unreachable, and the list answers
// with the rest: one region down must not hide the others' sandboxes.
//
// Paging: the hub's continue token holds, for each cluster that had more, that cluster's own
// token (`''`: from its start). A request with one asks only those clusters, each from its token.
import { AsbError } from '../errors.ts';
import { forwardedHeaders } from '../http/presented-key.ts';
import type { Reply, RequestContext } from '../http/router.ts';
import { detailOf, EDGE_HEADERS, liveClusters, MAX_ANSWER_BYTES, passOn, registeredClusters, workerUrl, type CallLimits } from './forward.ts';
import type { HubContext } from './hub-context.ts';
import { WorkerCallError, type WorkerAgents, type WorkerAnswer } from './worker-call.ts';

/** Prefix of the hub's own list continue token (one worker token per cluster). */
const HUB_TOKEN_PREFIX = 'hub.';

export interface Unreachable {
  cluster: string;
  reason: string;
}

export interface FanOutRequest<P> {
  /** The worker API path: the one the caller used at the hub. */
  path: string;
  /** The caller's query without its continue token; each cluster's own token is added to it. */
  query: URLSearchParams;
  /** The query parameter that carries a continue token (`continue`, E2B's `nextToken`). */
  tokenParam: string;
  /** The clusters to resume and their tokens, from the caller's hub token; undefined: every cluster from its start. */
  resume: Readonly<Record<string, string>> | undefined;
  /** One cluster's page from its answer; undefined when the answer is not one. */
  parse: (answer: WorkerAnswer) => P | undefined;
}

export interface ClusterPage<P> {
  cluster: string;
  /** The token this cluster was asked with; '' for its first page. */
  token: string;
  page: P;
}

export type FanOutResult<P> =
  /** No cluster gave a page and one refused the request (4xx): the caller's mistake, said as that worker said it. */
  | { kind: 'refused'; reply: Reply }
  | { kind: 'pages'; pages: ClusterPage<P>[]; unreachable: Unreachable[] };

export type FanOut = <P>(ctx: RequestContext, req: FanOutRequest<P>) => Promise<FanOutResult<P>>;

export function createFanOut(h: HubContext, agents: WorkerAgents, limits: CallLimits): FanOut {
  return async <P>(ctx: RequestContext, req: FanOutRequest<P>): Promise<FanOutResult<P>> => {
    const now = liveClusters(h);
    const unreachable: Unreachable[] = [];
    const targets: { name: string; apiUrl: string; token: string }[] = [];
    for (const c of await registeredClusters(h.store)) {
      const name = c.metadata.name;
      // A later page asks only the clusters that had more.
      if (req.resume !== undefined && !Object.hasOwn(req.resume, name)) continue;
      if (c.spec.apiUrl === undefined) unreachable.push({ cluster: name, reason: 'no apiUrl registered' });
      else if (!now.has(name)) unreachable.push({ cluster: name, reason: 'not connected to the hub' });
      else targets.push({ name, apiUrl: c.spec.apiUrl, token: req.resume?.[name] ?? '' });
    }
    const headers = forwardedHeaders(ctx.req, EDGE_HEADERS);
    const answers = await Promise.all(
      targets.map(async (t) => {
        const query = new URLSearchParams(req.query);
        if (t.token !== '') query.set(req.tokenParam, t.token);
        try {
          const answer = await agents.call({ method: 'GET', url: workerUrl(t.apiUrl, req.path, query), headers, connectTimeoutMs: limits.connectTimeoutMs, timeoutMs: limits.listTimeoutMs, maxBytes: MAX_ANSWER_BYTES });
          return { target: t, answer };
        } catch (err) {
          if (!(err instanceof WorkerCallError)) throw err;
          return { target: t, error: err.message };
        }
      }),
    );

    const pages: ClusterPage<P>[] = [];
    let refusal: { name: string; answer: WorkerAnswer } | undefined;
    for (const a of answers) {
      const name = a.target.name;
      if (a.answer === undefined) {
        unreachable.push({ cluster: name, reason: `unreachable: ${a.error}` });
        continue;
      }
      const page = a.answer.status === 200 ? req.parse(a.answer) : undefined;
      if (page === undefined) {
        if (a.answer.status >= 400 && a.answer.status < 500) refusal ??= { name, answer: a.answer };
        unreachable.push({ cluster: name, reason: `answered ${a.answer.status}: ${detailOf(a.answer)}` });
        continue;
      }
      pages.push({ cluster: name, token: a.target.token, page });
    }
    // The same bad query or key at every cluster: the caller's mistake.
    if (pages.length === 0 && refusal !== undefined) return { kind: 'refused', reply: passOn(refusal.answer, refusal.name) };
    return { kind: 'pages', pages, unreachable };
  };
}

/** A hub list's continue token: each cluster that had more, with its own token ('' = from its start). */
export function encodeHubToken(next: Readonly<Record<string, string>>): string {
  return HUB_TOKEN_PREFIX + Buffer.from(JSON.stringify(next)).toString('base64url');
}

/** The clusters to resume from the query parameter `param`; undefined when it is absent or empty; 400 when it is not a hub token. */
export function decodeHubToken(query: URLSearchParams, param: string): Record<string, string> | undefined {
  const token = query.get(param);
  if (token === null || token === '') return undefined;
  let parsed: unknown;
  try {
    if (token.startsWith(HUB_TOKEN_PREFIX)) parsed = JSON.parse(Buffer.from(token.slice(HUB_TOKEN_PREFIX.length), 'base64url').toString('utf8'));
  } catch {
    // reported below
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed) || !Object.values(parsed).every((v) => typeof v === 'string')) {
    throw new AsbError('BadRequest', `query parameter ${param} is not a token from a list at the hub; list again without it`, { fields: [{ field: param, message: 'not a hub list token' }] });
  }
  return parsed as Record<string, string>;
}
