// One page of a list over the in-memory objects of one kind: namespace filter, label selector,
// (namespace, name) order, limit and continue token (semantics in continue-token.ts).
import type { KubeObject, ResourceType } from '../api/meta.ts';
import { AsbError } from '../errors.ts';
import { decodeContinue, encodeContinue } from './continue-token.ts';
import { matchesSelector, parseSelector } from './selector.ts';
import { CLUSTER_SCOPE, type ListOptions } from './store.ts';

// NUL sorts before every character a name may hold, so key order is (namespace, name) order.
export function objectKey(namespace: string, name: string): string {
  return `${namespace}\u0000${name}`;
}

/** Index of the first key >= start (or > start when `exclusive`), by binary search. */
function firstIndexAfter(keys: readonly string[], start: string, exclusive: boolean): number {
  let lo = 0;
  let hi = keys.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    const key = keys[mid] ?? '';
    if (key < start || (exclusive && key === start)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

export interface Page {
  /** The stored objects themselves: the caller copies them before handing them out. */
  items: KubeObject[];
  continue?: string;
}

/**
 * Reads one page. `sortedKeys` are the keys of `objects` in order. Throws AsbError BadRequest
 * for a malformed selector, token or limit.
 */
export function listPage(rt: ResourceType, objects: ReadonlyMap<string, KubeObject>, sortedKeys: readonly string[], opts: ListOptions): Page {
  const selector = parseSelector(opts.labelSelector);
  const after = opts.continue === undefined || opts.continue === '' ? undefined : decodeContinue(opts.continue);
  const limit = opts.limit ?? 0;
  if (!Number.isInteger(limit) || limit < 0) throw new AsbError('BadRequest', `list limit must be a non-negative integer, got ${limit}`);
  const namespace = rt.namespaced && opts.namespace !== undefined && opts.namespace !== '' ? opts.namespace : undefined;
  const prefix = namespace === undefined ? '' : `${namespace}\u0000`;
  const startKey = after === undefined ? prefix : objectKey(after.namespace, after.name);
  const page: Page = { items: [] };
  let last: KubeObject | undefined;
  for (let i = firstIndexAfter(sortedKeys, startKey, after !== undefined); i < sortedKeys.length; i++) {
    const key = sortedKeys[i] ?? '';
    if (!key.startsWith(prefix)) {
      if (key > prefix) break; // past the namespace in sorted order
      continue;
    }
    const obj = objects.get(key);
    if (obj === undefined || !matchesSelector(selector, obj.metadata.labels)) continue;
    if (limit > 0 && page.items.length === limit) {
      // One more match exists: hand out a token that resumes after the last item returned.
      if (last !== undefined) page.continue = encodeContinue({ namespace: last.metadata.namespace ?? CLUSTER_SCOPE, name: last.metadata.name });
      break;
    }
    page.items.push(obj);
    last = obj;
  }
  return page;
}
