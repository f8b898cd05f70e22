// E2B's create and list at the hub (edges forward them here, as they do ours), so an E2B program
// pointed at any edge creates in whichever cluster placement picks and lists every cluster:
//
//   POST /sandboxes, /v2/sandboxes   placed like POST /v1/sandboxes: template = templateID ?? base,
//                                    no region (E2B has no such field); the body goes unchanged to
//                                    the chosen worker's same path, its answer comes back as it is.
//                                    A templateID that is a snapshot's id (a registered cluster's tag
//                                    first) goes to that cluster only: the snapshot is there
//   GET  /sandboxes, /v2/sandboxes   every connected cluster's page, merged in the list's order
//   GET  /templates, /v2/templates   the team's built templates of every connected cluster (each
//                                    worker lists the builds it ran), one list, oldest first; a
//                                    template is listed once even where two clusters name it
//
// A list page holds at most `limit` items whatever the number of clusters: each cluster is asked
// for `limit`, the pages are merged by (startedAt, id) in the asked order, the first `limit` are
// answered, and X-Next-Token carries a hub token with, for each cluster with more, where it stops:
// the worker's own token when all of its page was used, else the position of its last item used.
// E2B has no field for clusters that did not answer: they are logged and named in the
// `x-asb-unreachable` header. Failures the hub itself finds are E2B's `{code, message}`.
import type { Authenticator } from '../auth/keyring.ts';
import { readJson } from '../http/body.ts';
import { compareCursors, DEFAULT_LIMIT, encodeCursor, listOrder, MAX_LIMIT, type Cursor } from '../worker/e2b/list.ts';
import { e2bRoute, type AuthedContext } from '../worker/e2b/reply.ts';
import { checkKnown, CREATE_BODY } from '../worker/e2b/routes.ts';
import { queryInt } from '../worker/input.ts';
import { isPlainObject } from '../http/body.ts';
import type { Reply, Route } from '../http/router.ts';
import { clusterTagOf } from '../api/ids.ts';
import { SandboxTemplateType } from '../api/types.ts';
import type { PlacementRequest } from '../api/hub-contract.ts';
import type { Placer } from './create-placement.ts';
import { registeredClusters } from './forward.ts';
import type { HubContext } from './hub-context.ts';
import { decodeHubToken, encodeHubToken, type FanOut } from './list-fanout.ts';
import type { WorkerAnswer } from './worker-call.ts';

const TEMPLATE_FIELD = { templateID: CREATE_BODY.templateID };

interface Listed {
  item: unknown;
  key: Cursor;
}

interface E2bPage {
  items: Listed[];
  /** The worker's X-Next-Token: it has more after this page. */
  next: string | undefined;
}

/** A worker's answer body as a JSON array, or undefined when it is not one. */
function jsonArray(answer: WorkerAnswer): unknown[] | undefined {
  try {
    const parsed: unknown = JSON.parse(answer.body.toString('utf8'));
    return Array.isArray(parsed) ? (parsed as unknown[]) : undefined;
  } catch {
    return undefined;
  }
}

/** A worker's E2B list answer: a JSON array of ListedSandbox, each with its sandboxID and startedAt. */
function parseE2bPage(answer: WorkerAnswer): E2bPage | undefined {
  const parsed = jsonArray(answer);
  if (parsed === undefined) return undefined;
  const items: Listed[] = [];
  for (const item of parsed) {
    if (!isPlainObject(item) || typeof item.sandboxID !== 'string' || typeof item.startedAt !== 'string') return undefined;
    items.push({ item, key: { startedAt: item.startedAt, id: item.sandboxID } });
  }
  const next = answer.headers['x-next-token'];
  return { items, next: typeof next === 'string' && next !== '' ? next : undefined };
}

/** A worker's E2B template list: a JSON array of templates, each with its templateID. */
function parseTemplates(answer: WorkerAnswer): { templateID: string; item: Record<string, unknown> }[] | undefined {
  const parsed = jsonArray(answer);
  if (parsed === undefined) return undefined;
  const out: { templateID: string; item: Record<string, unknown> }[] = [];
  for (const item of parsed) {
    if (!isPlainObject(item) || typeof item.templateID !== 'string') return undefined;
    out.push({ templateID: item.templateID, item });
  }
  return out;
}

export function e2bHubRoutes(h: HubContext, auth: Authenticator, placer: Placer, fanOut: FanOut): Route[] {
  async function create(ctx: AuthedContext, path: string): Promise<Reply> {
    const raw = await readJson(ctx.req, h.jsonBytes);
    // Only what placement needs is checked here; the chosen worker checks the rest.
    const { templateID } = checkKnown(raw, TEMPLATE_FIELD);
    const body = raw === undefined ? Buffer.alloc(0) : Buffer.from(JSON.stringify(raw));
    const clusters = await registeredClusters(h.store);
    const template = templateID ?? 'base';
    const target: PlacementRequest = { namespace: h.defaultNamespace, template };
    // A snapshot's id starts with its cluster's tag, as a sandbox's does: the sandbox starts there
    // (placement follows the snapshot), unless the hub holds a template of that name.
    const tag = clusterTagOf(template);
    const holder = tag === undefined ? undefined : clusters.find((c) => c.spec.tag === tag);
    if (holder !== undefined && (await h.store.tryGet(SandboxTemplateType, h.defaultNamespace, template)) === undefined) {
      target.cluster = holder.metadata.name;
      target.fromSnapshot = true;
    }
    return placer.create(ctx, clusters, target, { path, body });
  }

  async function list(ctx: AuthedContext, path: string): Promise<Reply> {
    const limit = queryInt(ctx.query, 'limit', 1, MAX_LIMIT) ?? DEFAULT_LIMIT;
    // Checked here too: with no cluster connected, no worker would refuse it.
    const sign = listOrder(ctx.query) === 'asc' ? 1 : -1;
    const query = new URLSearchParams(ctx.query);
    query.delete('nextToken');
    query.set('limit', String(limit));
    const result = await fanOut(ctx, { path, query, tokenParam: 'nextToken', resume: decodeHubToken(ctx.query, 'nextToken'), parse: parseE2bPage });
    if (result.kind === 'refused') return result.reply;

    const merged = result.pages.flatMap(({ cluster, page }) => page.items.map((listed) => ({ cluster, listed })));
    merged.sort((a, b) => sign * compareCursors(a.listed.key, b.listed.key));
    const answered = merged.slice(0, limit);
    const used = new Map<string, { count: number; last: Cursor }>();
    for (const { cluster, listed } of answered) used.set(cluster, { count: (used.get(cluster)?.count ?? 0) + 1, last: listed.key });
    const next: Record<string, string> = {};
    for (const { cluster, token, page } of result.pages) {
      const u = used.get(cluster);
      if (u === undefined) {
        if (page.items.length > 0) next[cluster] = token;
      } else if (u.count < page.items.length) {
        next[cluster] = encodeCursor(u.last);
      } else if (page.next !== undefined) {
        next[cluster] = page.next;
      }
    }

    const headers: Record<string, string> = {};
    if (Object.keys(next).length > 0) headers['x-next-token'] = encodeHubToken(next);
    if (result.unreachable.length > 0) {
      headers['x-asb-unreachable'] = result.unreachable.map((u) => u.cluster).join(',');
      ctx.log.warn({ unreachable: result.unreachable }, 'E2B list: clusters left out');
    }
    return { status: 200, json: answered.map((a) => a.listed.item), headers };
  }

  async function listTemplates(ctx: AuthedContext, path: string): Promise<Reply> {
    const result = await fanOut(ctx, { path, query: new URLSearchParams(ctx.query), tokenParam: 'nextToken', resume: undefined, parse: parseTemplates });
    if (result.kind === 'refused') return result.reply;
    const seen = new Map<string, Record<string, unknown>>();
    for (const { page } of result.pages) for (const t of page) if (!seen.has(t.templateID)) seen.set(t.templateID, t.item);
    const createdAt = (t: Record<string, unknown>): string => (typeof t.createdAt === 'string' ? t.createdAt : '');
    const items = [...seen.values()].sort((a, b) => createdAt(a).localeCompare(createdAt(b)));
    const headers: Record<string, string> = {};
    if (result.unreachable.length > 0) {
      headers['x-asb-unreachable'] = result.unreachable.map((u) => u.cluster).join(',');
      ctx.log.warn({ unreachable: result.unreachable }, 'E2B template list: clusters left out');
    }
    return { status: 200, json: items, headers };
  }

  const routes: Route[] = [];
  for (const path of ['/templates', '/v2/templates']) routes.push(e2bRoute(auth, 'GET', path, (ctx) => listTemplates(ctx, path), 'hub'));
  for (const path of ['/sandboxes', '/v2/sandboxes']) {
    routes.push(
      e2bRoute(auth, 'POST', path, (ctx) => create(ctx, path), 'hub'),
      e2bRoute(auth, 'GET', path, (ctx) => list(ctx, path), 'hub'),
    );
  }
  return routes;
}
