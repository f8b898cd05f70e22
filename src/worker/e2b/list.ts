// GET /sandboxes and /v2/sandboxes: the caller's sandboxes as `ListedSandbox` items, filtered by
// state, metadata, template and start time, ordered by start time, paged with a cursor in the
// `X-Next-Token` response header (absent on the last page).
//
// State and metadata are not labels (state comes from the spec, metadata is an annotation), so
// filtering happens here rather than in the store: the team's sandboxes are read once, filtered,
// sorted, and the page starts after the cursor. The cursor is the last item's (startedAt, id),
// not an offset, so a sandbox created or deleted between two pages shifts nothing.
import type { Sandbox } from '../../api/types.ts';
import { LABEL, SandboxType } from '../../api/types.ts';
import type { Principal } from '../../auth/keyring.ts';
import { AsbError } from '../../errors.ts';
import { visibilitySelector } from '../access.ts';
import type { WorkerContext } from '../deps.ts';
import { queryInt } from '../input.ts';
import type { Reply } from '../../http/router.ts';
import { e2bListedSandbox, metadataOf, startedAtOf, stateOf, type E2bState } from './shape.ts';

/** E2B's own default page size. */
export const DEFAULT_LIMIT = 100;
export const MAX_LIMIT = 1000;
const STATES: readonly E2bState[] = ['running', 'paused'];

/** A position in a list: the last listed item's start time and id (the hub merges clusters' pages by it). */
export interface Cursor {
  startedAt: string;
  id: string;
}

interface ListQuery {
  states: ReadonlySet<E2bState>;
  metadata: Record<string, string>;
  template: string | undefined;
  startedAfter: number | undefined;
  order: 'asc' | 'desc';
  limit: number;
  after: Cursor | undefined;
}

function badQuery(param: string, message: string): AsbError {
  return new AsbError('BadRequest', `query parameter ${param} ${message}`, { fields: [{ field: param, message }] });
}

/**
 * The metadata filter. The SDK encodes each key and value with encodeURIComponent, joins them as
 * a query string, and that string is encoded once more as the parameter's value; URLSearchParams
 * has undone the outer layer, so this undoes the other two (`user%2520id=a%2526b` → "user id": "a&b").
 */
export function parseMetadataFilter(raw: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [key, value] of new URLSearchParams(raw)) {
    try {
      out[decodeURIComponent(key)] = decodeURIComponent(value);
    } catch {
      throw badQuery('metadata', `must be key=value pairs with each key and value URL-encoded, got "${raw}"`);
    }
  }
  return out;
}

export function encodeCursor(c: Cursor): string {
  return Buffer.from(JSON.stringify([c.startedAt, c.id]), 'utf8').toString('base64url');
}

function decodeCursor(token: string): Cursor {
  try {
    const parsed = JSON.parse(Buffer.from(token, 'base64url').toString('utf8')) as unknown;
    if (Array.isArray(parsed) && parsed.length === 2 && typeof parsed[0] === 'string' && typeof parsed[1] === 'string') {
      return { startedAt: parsed[0], id: parsed[1] };
    }
  } catch {
    // reported below
  }
  throw badQuery('nextToken', 'is not a token this API returned in X-Next-Token');
}

/** The `order` query parameter: desc (newest first) unless asc; anything else is a 400. */
export function listOrder(q: URLSearchParams): 'asc' | 'desc' {
  const order = q.get('order') ?? 'desc';
  if (order !== 'asc' && order !== 'desc') throw badQuery('order', `must be asc or desc, got "${order}"`);
  return order;
}

function parseQuery(q: URLSearchParams): ListQuery {
  const states = new Set<E2bState>();
  for (const value of q.getAll('state').flatMap((s) => s.split(','))) {
    if (value === '') continue;
    if (!(STATES as readonly string[]).includes(value)) throw badQuery('state', `must be running, paused or both (comma-separated), got "${value}"`);
    states.add(value as E2bState);
  }
  const metadata = q.get('metadata');
  const template = q.get('template');
  const startedAfterRaw = q.get('startedAfter');
  let startedAfter: number | undefined;
  if (startedAfterRaw !== null && startedAfterRaw !== '') {
    startedAfter = Date.parse(startedAfterRaw);
    if (Number.isNaN(startedAfter)) throw badQuery('startedAfter', `must be an RFC 3339 time, got "${startedAfterRaw}"`);
  }
  const order = listOrder(q);
  const nextToken = q.get('nextToken');
  return {
    states: states.size === 0 ? new Set(STATES) : states,
    metadata: metadata === null || metadata === '' ? {} : parseMetadataFilter(metadata),
    template: template === null || template === '' ? undefined : template,
    startedAfter,
    order,
    limit: queryInt(q, 'limit', 1, MAX_LIMIT) ?? DEFAULT_LIMIT,
    after: nextToken === null || nextToken === '' ? undefined : decodeCursor(nextToken),
  };
}

/** Sandboxes E2B would list: not being deleted, not expired (E2B has killed those). */
function isListed(s: Sandbox): boolean {
  return s.metadata.deletionTimestamp === undefined && s.status?.phase !== 'Expired' && s.status?.phase !== 'Terminating';
}

function matches(s: Sandbox, query: ListQuery): boolean {
  if (!isListed(s) || !query.states.has(stateOf(s))) return false;
  if (query.template !== undefined && s.metadata.labels?.[LABEL.template] !== query.template) return false;
  if (query.startedAfter !== undefined && !(Date.parse(startedAtOf(s)) >= query.startedAfter)) return false;
  const entries = Object.entries(query.metadata);
  if (entries.length > 0) {
    const metadata = metadataOf(s);
    if (!entries.every(([k, v]) => metadata[k] === v)) return false;
  }
  return true;
}

/** Ascending list order: by start time, then by id. */
export function compareCursors(a: Cursor, b: Cursor): number {
  const t = Date.parse(a.startedAt) - Date.parse(b.startedAt);
  if (t !== 0 && !Number.isNaN(t)) return t;
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}

export async function listE2bSandboxes(w: WorkerContext, p: Principal, q: URLSearchParams): Promise<Reply> {
  const query = parseQuery(q);
  const { items } = await w.store.list<Sandbox>(SandboxType, { labelSelector: visibilitySelector(p) });
  const sign = query.order === 'asc' ? 1 : -1;
  const keyed = items
    .filter((s) => matches(s, query))
    .map((s) => ({ s, key: { startedAt: startedAtOf(s), id: s.metadata.name } }))
    .sort((a, b) => sign * compareCursors(a.key, b.key));
  const after = query.after;
  const rest = after === undefined ? keyed : keyed.filter((k) => sign * compareCursors(k.key, after) > 0);
  const page = rest.slice(0, query.limit);
  const last = page.at(-1);
  const headers: Record<string, string> = rest.length > page.length && last !== undefined ? { 'x-next-token': encodeCursor(last.key) } : {};
  return { status: 200, json: page.map((k) => e2bListedSandbox(w, k.s)), headers };
}
