// POST and GET /v1/sandboxes at the hub, for any valid API key (edges forward them here): a
// create is placed on a worker cluster (src/hub/placement.ts) and forwarded to that cluster's
// worker API with the caller's own key; a list asks every connected cluster and merges.
//
// Create failover: a cluster that cannot be reached (connect error or timeout, a connection lost
// mid-call) or answers 502, 503 or 504 is skipped for the next one in the placement order. Any
// other answer (201, or a 4xx such as an unknown key or a bad label) is the caller's answer,
// passed through as it came, with `x-asb-cluster` naming the cluster that gave it. A worker that
// times out after it began a create may still finish it: failing over then can leave one extra
// sandbox in the first cluster, which its owner sees in lists and can delete; the alternative,
// refusing the create, fails the user for a fault of ours.
import { Counter, type Registry } from 'prom-client';
import { SandboxTemplateType } from '../api/types.ts';
import { AsbError } from '../errors.ts';
import { principalOf } from '../worker/access.ts';
import { readJson } from '../worker/body.ts';
import { checkCreateBody, type CreateBody } from '../worker/create-body.ts';
import type { Reply, RequestContext, Route } from '../worker/router.ts';
import { candidatesFor, PlacedSinceHeartbeat } from './candidates.ts';
import { clusterNotFound } from './clusters.ts';
import { ClusterType, type Cluster } from './contract.ts';
import type { HubContext } from './hub-context.ts';
import { NO_LIVE_CLUSTERS, type LiveCluster } from './live-clusters.ts';
import { place } from './placement.ts';
import { WorkerAgents, WorkerCallError, type WorkerAnswer } from './worker-call.ts';

/** Deadlines of the hub's calls to workers; every field optional, defaults below. */
export interface PlacementOptions {
  /** To connect to a worker; a cluster that does not accept within it is skipped. Default 2 s. */
  connectTimeoutMs?: number;
  /** For a create's whole answer; a worker waits up to 60 s for Ready by default. Default 90 s. */
  createTimeoutMs?: number;
  /** For one cluster's page of a list; a cluster slower than this is listed as unreachable. Default 10 s. */
  listTimeoutMs?: number;
}

const DEFAULTS = { connectTimeoutMs: 2_000, createTimeoutMs: 90_000, listTimeoutMs: 10_000 };
/** A worker's answer to a create is one view (~1 KB); to a list, up to 1,000 of them. */
const MAX_ANSWER_BYTES = 32 * 1024 * 1024;
/** Worker answers after which the next cluster is tried. */
const FAILOVER_STATUSES: ReadonlySet<number> = new Set([502, 503, 504]);
/** Prefix of the hub's own list continue token (one worker token per cluster). */
const HUB_TOKEN_PREFIX = 'hub.';

interface PlacementMetrics {
  placements: Counter<'result' | 'cluster'>;
  failovers: Counter<'cluster'>;
}

function createPlacementMetrics(registry: Registry): PlacementMetrics {
  return {
    placements: new Counter({
      name: 'asb_hub_placements_total',
      help: 'Creates placed by the hub, by result (created: 201; refused: another answer from the worker, passed on; unavailable: no cluster could take it, cluster="none") and cluster.',
      labelNames: ['result', 'cluster'],
      registers: [registry],
    }),
    failovers: new Counter({
      name: 'asb_hub_placement_failovers_total',
      help: 'Create attempts a cluster failed (unreachable, or answered 502/503/504) after which the next cluster was tried, by the cluster that failed.',
      labelNames: ['cluster'],
      registers: [registry],
    }),
  };
}

/** The caller's credential, as presented, for the worker to check and scope by team itself. */
function credentialHeaders(ctx: RequestContext): Record<string, string> {
  const out: Record<string, string> = {};
  const { authorization } = ctx.req.headers;
  const apiKey = ctx.req.headers['x-api-key'];
  if (authorization !== undefined) out.authorization = authorization;
  if (typeof apiKey === 'string') out['x-api-key'] = apiKey;
  return out;
}

function detailOf(answer: WorkerAnswer): string {
  try {
    const parsed = JSON.parse(answer.body.toString('utf8')) as { detail?: unknown };
    if (typeof parsed.detail === 'string') return parsed.detail;
  } catch {
    // not a problem document
  }
  return answer.body.toString('utf8').slice(0, 200);
}

function workerUrl(apiUrl: string, path: string, query?: URLSearchParams): URL {
  const url = new URL(`${apiUrl.replace(/\/$/, '')}${path}`);
  if (query !== undefined) url.search = query.toString();
  return url;
}

/** 400 for a region no cluster is in, 404 for an unregistered cluster, 400 when the two disagree. */
function checkTarget(body: CreateBody, clusters: readonly Cluster[]): void {
  if (body.region !== undefined && !clusters.some((c) => c.spec.region === body.region)) {
    const known = [...new Set(clusters.map((c) => c.spec.region))].sort();
    const message = `no registered cluster is in region "${body.region}"; known regions: ${known.length === 0 ? 'none (no cluster is registered)' : known.join(', ')}`;
    throw new AsbError('BadRequest', message, { fields: [{ field: 'region', message }] });
  }
  if (body.cluster === undefined) return;
  const named = clusters.find((c) => c.metadata.name === body.cluster);
  if (named === undefined) throw clusterNotFound(body.cluster);
  if (body.region !== undefined && named.spec.region !== body.region) {
    const message = `cluster "${body.cluster}" is in region "${named.spec.region}", not "${body.region}"; give one of the two, or both in agreement`;
    throw new AsbError('BadRequest', message, { fields: [{ field: 'region', message }] });
  }
}

function passOn(answer: WorkerAnswer, cluster: string): Reply {
  const contentType = answer.headers['content-type'] ?? 'application/json';
  return { status: answer.status, bytes: answer.body, contentType, headers: { 'x-asb-cluster': cluster } };
}

export interface SandboxHubRoutes {
  routes: Route[];
  /** Closes the keep-alive connections to workers. */
  close(): void;
}

export function sandboxHubRoutes(h: HubContext, opts: PlacementOptions = {}): SandboxHubRoutes {
  const limits = { ...DEFAULTS, ...opts };
  const metrics = createPlacementMetrics(h.registry);
  const agents = new WorkerAgents(h.clock);
  const placed = new PlacedSinceHeartbeat();
  const live = (): ReadonlyMap<string, LiveCluster> => h.sync?.live() ?? NO_LIVE_CLUSTERS;

  const registered = async (): Promise<Cluster[]> => (await h.store.list<Cluster>(ClusterType)).items.filter((c) => c.metadata.deletionTimestamp === undefined);

  async function create(ctx: RequestContext): Promise<Reply> {
    principalOf(ctx);
    const body = checkCreateBody(await readJson(ctx.req, h.jsonBytes));
    const clusters = await registered();
    checkTarget(body, clusters);
    const namespace = body.namespace ?? h.defaultNamespace;
    const template = body.template ?? 'base';
    const fromHub = await h.store.tryGet(SandboxTemplateType, namespace, template);
    const hubTemplate = fromHub === undefined ? undefined : {
      key: `${namespace}/${template}`,
      version: Number(fromHub.metadata.resourceVersion),
      applied: new Map((h.sync?.connections() ?? []).map((c) => [c.cluster, c.appliedVersion])),
    };
    const { candidates, unusable } = candidatesFor(clusters, live(), placed, hubTemplate);
    const plan = place(
      { namespace, template, ...(body.region === undefined ? {} : { region: body.region }), ...(body.cluster === undefined ? {} : { cluster: body.cluster }) },
      candidates,
    );
    const { region: _region, cluster: _cluster, ...rest } = body;
    const forward = Buffer.from(JSON.stringify(rest));
    const headers = { ...credentialHeaders(ctx), 'content-type': 'application/json' };
    const apiUrls = new Map(clusters.map((c) => [c.metadata.name, c.spec.apiUrl ?? '']));
    const failed: { cluster: string; reason: string }[] = [];

    for (const [i, name] of plan.order.entries()) {
      let answer: WorkerAnswer;
      try {
        answer = await agents.call({
          method: 'POST',
          url: workerUrl(apiUrls.get(name) ?? '', '/v1/sandboxes'),
          headers,
          body: forward,
          connectTimeoutMs: limits.connectTimeoutMs,
          timeoutMs: limits.createTimeoutMs,
          maxBytes: MAX_ANSWER_BYTES,
        });
      } catch (err) {
        if (!(err instanceof WorkerCallError)) throw err;
        failed.push({ cluster: name, reason: `unreachable: ${err.message}` });
        ctx.log.warn({ cluster: name, failure: err.kind, err: err.message }, 'placement: cluster unreachable; trying the next');
        if (i < plan.order.length - 1) metrics.failovers.inc({ cluster: name });
        continue;
      }
      if (FAILOVER_STATUSES.has(answer.status)) {
        failed.push({ cluster: name, reason: `answered ${answer.status}: ${detailOf(answer)}` });
        ctx.log.info({ cluster: name, status: answer.status }, 'placement: cluster could not create; trying the next');
        if (i < plan.order.length - 1) metrics.failovers.inc({ cluster: name });
        continue;
      }
      if (answer.status === 201) {
        const now = live().get(name);
        if (now !== undefined) placed.record(name, now.heartbeatAt, `${namespace}/${template}`);
        metrics.placements.inc({ result: 'created', cluster: name });
      } else {
        metrics.placements.inc({ result: 'refused', cluster: name });
      }
      return passOn(answer, name);
    }

    metrics.placements.inc({ result: 'unavailable', cluster: 'none' });
    // For a named cluster, only its own story: every other was skipped for not being it.
    const why = [...plan.skipped, ...unusable, ...failed].filter((s) => body.cluster === undefined || s.cluster === body.cluster).map((s) => `${s.cluster}: ${s.reason}`);
    const what = body.cluster === undefined ? 'no cluster could take' : `cluster "${body.cluster}" could not take`;
    throw new AsbError('Unavailable', `${what} a sandbox of template ${namespace}/${template}; ${why.length === 0 ? 'no cluster is registered' : why.join('; ')}`);
  }

  async function list(ctx: RequestContext): Promise<Reply> {
    principalOf(ctx);
    const clusters = await registered();
    const now = live();
    const token = ctx.query.get('continue');
    const resume = token === null || token === '' ? undefined : decodeHubToken(token);
    const unreachable: { cluster: string; reason: string }[] = [];
    const targets: { name: string; apiUrl: string; token: string | undefined }[] = [];
    for (const c of clusters) {
      const name = c.metadata.name;
      // A later page asks only the clusters that had more.
      if (resume !== undefined && !Object.hasOwn(resume, name)) continue;
      if (c.spec.apiUrl === undefined) unreachable.push({ cluster: name, reason: 'no apiUrl registered' });
      else if (!now.has(name)) unreachable.push({ cluster: name, reason: 'not connected to the hub' });
      else targets.push({ name, apiUrl: c.spec.apiUrl, token: resume?.[name] });
    }
    const headers = credentialHeaders(ctx);
    const answers = await Promise.all(
      targets.map(async (t) => {
        const query = new URLSearchParams(ctx.query);
        query.delete('continue');
        if (t.token !== undefined) query.set('continue', t.token);
        try {
          const answer = await agents.call({ method: 'GET', url: workerUrl(t.apiUrl, '/v1/sandboxes', query), headers, connectTimeoutMs: limits.connectTimeoutMs, timeoutMs: limits.listTimeoutMs, maxBytes: MAX_ANSWER_BYTES });
          return { name: t.name, answer };
        } catch (err) {
          if (!(err instanceof WorkerCallError)) throw err;
          return { name: t.name, error: err.message };
        }
      }),
    );

    const items: unknown[] = [];
    const next: Record<string, string> = {};
    let refusal: { name: string; answer: WorkerAnswer } | undefined;
    let listed = 0;
    for (const a of answers) {
      if (a.answer === undefined) {
        unreachable.push({ cluster: a.name, reason: `unreachable: ${a.error}` });
        continue;
      }
      const page = a.answer.status === 200 ? parsePage(a.answer.body) : undefined;
      if (page === undefined) {
        if (a.answer.status >= 400 && a.answer.status < 500) refusal ??= { name: a.name, answer: a.answer };
        unreachable.push({ cluster: a.name, reason: `answered ${a.answer.status}: ${detailOf(a.answer)}` });
        continue;
      }
      listed += 1;
      items.push(...page.items);
      if (page.continue !== undefined) next[a.name] = page.continue;
    }
    // The same bad query or key at every cluster: the caller's mistake, said as a worker said it.
    if (listed === 0 && refusal !== undefined) return passOn(refusal.answer, refusal.name);
    const json: { items: unknown[]; continue?: string; unreachable?: typeof unreachable } = { items };
    if (Object.keys(next).length > 0) json.continue = encodeHubToken(next);
    if (unreachable.length > 0) json.unreachable = unreachable;
    return { status: 200, json };
  }

  return {
    routes: [
      { method: 'POST', pattern: '/v1/sandboxes', handler: create },
      { method: 'GET', pattern: '/v1/sandboxes', handler: list },
    ],
    close: () => agents.close(),
  };
}

function parsePage(body: Buffer): { items: unknown[]; continue?: string } | undefined {
  try {
    const parsed = JSON.parse(body.toString('utf8')) as { items?: unknown; continue?: unknown };
    if (!Array.isArray(parsed.items)) return undefined;
    return typeof parsed.continue === 'string' && parsed.continue !== '' ? { items: parsed.items, continue: parsed.continue } : { items: parsed.items };
  } catch {
    return undefined;
  }
}

/** A hub list's continue token: each cluster that had more, with the worker's own token. */
function encodeHubToken(next: Record<string, string>): string {
  return HUB_TOKEN_PREFIX + Buffer.from(JSON.stringify(next)).toString('base64url');
}

function decodeHubToken(token: string): Record<string, string> {
  let parsed: unknown;
  try {
    if (token.startsWith(HUB_TOKEN_PREFIX)) parsed = JSON.parse(Buffer.from(token.slice(HUB_TOKEN_PREFIX.length), 'base64url').toString('utf8'));
  } catch {
    // reported below
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed) || !Object.values(parsed).every((v) => typeof v === 'string')) {
    throw new AsbError('BadRequest', 'query parameter continue is not a token from a list at the hub; list again without it', { fields: [{ field: 'continue', message: 'not a hub list token' }] });
  }
  return parsed as Record<string, string>;
}
