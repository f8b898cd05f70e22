// POST and GET /v1/sandboxes at the hub, for any valid API key (edges forward them here): a
// create is placed on a worker cluster (src/hub/create-placement.ts) and forwarded to that
// cluster's worker API with the caller's own key; a list asks every connected cluster and merges
// (src/hub/list-fanout.ts). E2B's creates and lists are served beside them the same way
// (src/hub/routes-e2b.ts).
import type { Authenticator } from '../auth/keyring.ts';
import { AsbError } from '../errors.ts';
import { principalOf } from '../worker/access.ts';
import { readJson } from '../http/body.ts';
import { checkCreateBody, type CreateBody } from '../worker/create-body.ts';
import type { Reply, RequestContext, Route } from '../http/router.ts';
import { clusterNotFound } from './clusters.ts';
import type { Cluster } from '../api/hub-contract.ts';
import { createPlacer } from './create-placement.ts';
import { callLimits, registeredClusters, type PlacementOptions } from './forward.ts';
import type { HubContext } from './hub-context.ts';
import { createFanOut, decodeHubToken, encodeHubToken, type Unreachable } from './list-fanout.ts';
import { e2bHubRoutes } from './routes-e2b.ts';
import { WorkerAgents } from './worker-call.ts';

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

export interface SandboxHubRoutes {
  routes: Route[];
  /** Closes the keep-alive connections to workers. */
  close(): void;
}

/** Ours and E2B's create and list at the hub; `auth` authenticates the E2B routes, which answer failures E2B's way. */
export function sandboxHubRoutes(h: HubContext, auth: Authenticator, opts: PlacementOptions = {}): SandboxHubRoutes {
  const limits = callLimits(opts);
  const agents = new WorkerAgents(h.clock);
  const placer = createPlacer(h, agents, limits);
  const fanOut = createFanOut(h, agents, limits);

  async function create(ctx: RequestContext): Promise<Reply> {
    principalOf(ctx);
    const body = checkCreateBody(await readJson(ctx.req, h.jsonBytes));
    const clusters = await registeredClusters(h.store);
    checkTarget(body, clusters);
    const { region, cluster, ...rest } = body;
    const target = {
      namespace: body.namespace ?? h.defaultNamespace,
      template: body.template ?? 'base',
      ...(region === undefined ? {} : { region }),
      ...(cluster === undefined ? {} : { cluster }),
    };
    return placer.create(ctx, clusters, target, { path: '/v1/sandboxes', body: Buffer.from(JSON.stringify(rest)) });
  }

  async function list(ctx: RequestContext): Promise<Reply> {
    principalOf(ctx);
    const query = new URLSearchParams(ctx.query);
    query.delete('continue');
    const result = await fanOut(ctx, { path: '/v1/sandboxes', query, tokenParam: 'continue', resume: decodeHubToken(ctx.query, 'continue'), parse: parsePage });
    if (result.kind === 'refused') return result.reply;
    const items: unknown[] = [];
    const next: Record<string, string> = {};
    for (const { cluster, page } of result.pages) {
      items.push(...page.items);
      if (page.continue !== undefined) next[cluster] = page.continue;
    }
    const json: { items: unknown[]; continue?: string; unreachable?: Unreachable[] } = { items };
    if (Object.keys(next).length > 0) json.continue = encodeHubToken(next);
    if (result.unreachable.length > 0) json.unreachable = result.unreachable;
    return { status: 200, json };
  }

  return {
    routes: [
      { method: 'POST', pattern: '/v1/sandboxes', handler: create },
      { method: 'GET', pattern: '/v1/sandboxes', handler: list },
      ...e2bHubRoutes(h, auth, placer, fanOut),
    ],
    close: () => agents.close(),
  };
}

function parsePage(answer: { body: Buffer }): { items: unknown[]; continue?: string } | undefined {
  try {
    const parsed = JSON.parse(answer.body.toString('utf8')) as { items?: unknown; continue?: unknown };
    if (!Array.isArray(parsed.items)) return undefined;
    return typeof parsed.continue === 'string' && parsed.continue !== '' ? { items: parsed.items, continue: parsed.continue } : { items: parsed.items };
  } catch {
    return undefined;
  }
}
