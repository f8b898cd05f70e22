// A sandbox id names one sandbox in its cluster, whatever its namespace: the REST API, envd, the
// terminals, the route feed and the runtime all address a sandbox by id alone. The API refuses a
// second object with a taken id (409), but objects can still meet under one name (two API
// replicas on one API server racing, or kubectl). Then one rule says which object holds the id:
// 1. the object whose pod or kept volumes the runtime has (the controller alone knows this): a
//    running or hibernated sandbox is never taken over, whatever the timestamps say;
// 2. not one its controller has already marked NameConflict (so every component follows the
//    controller's decision once it is written);
// 3. the one created first, the uid breaking a tie. Kubernetes stamps creation to the second, so
//    two objects made within one second tie; rules 1 and 2 decide those for good within a
//    reconcile, and the API never hands a caller a pod made for another uid (sandbox-index.ts).
// The others never get a pod, a route or a token, and their controller says why.
import type { Sandbox } from './types.ts';

/** The reason the sandbox controller writes on a Sandbox whose id another one holds. */
export const NAME_CONFLICT = 'NameConflict';

export interface IdHolder {
  namespace: string;
  uid: string;
  /** creationTimestamp in ms since the epoch; NaN (never first) when absent. */
  created: number;
  /** Its controller has marked it NameConflict. */
  conflicted: boolean;
}

export function idHolderOf(sandbox: Sandbox): IdHolder {
  const { namespace, uid, creationTimestamp } = sandbox.metadata;
  return {
    namespace: namespace ?? 'default',
    uid: uid ?? '',
    created: creationTimestamp === undefined ? Number.NaN : Date.parse(creationTimestamp),
    conflicted: sandbox.status?.conditions?.some((c) => c.reason === NAME_CONFLICT) === true,
  };
}

/** Whether `a` holds the id against `b` by rules 2 and 3: not marked conflicting, created earlier, or at the same time with the smaller uid. */
export function holdsBefore(a: IdHolder, b: IdHolder): boolean {
  if (a.conflicted !== b.conflicted) return !a.conflicted;
  // Store timestamps are RFC 3339 with or without fractions, so they compare as numbers, not text.
  const ca = Number.isNaN(a.created) ? Infinity : a.created;
  const cb = Number.isNaN(b.created) ? Infinity : b.created;
  return ca !== cb ? ca < cb : a.uid < b.uid;
}

/** The holder among objects that share one name: the one whose pod the runtime has (`podUid`), else the first by `holdsBefore`. */
export function holderAmong<T extends Sandbox>(sandboxes: readonly T[], podUid?: string): T | undefined {
  if (podUid !== undefined) {
    const owner = sandboxes.find((s) => s.metadata.uid === podUid);
    if (owner !== undefined) return owner;
  }
  let best: T | undefined;
  for (const s of sandboxes) if (best === undefined || holdsBefore(idHolderOf(s), idHolderOf(best))) best = s;
  return best;
}

/**
 * Which object holds each id, fed with every Sandbox a watch delivers: almost always one per id.
 * Each component that addresses sandboxes by id keeps one beside its own watch, so its answer
 * never depends on the order in which two watches deliver.
 */
export class IdHolders {
  /** id → every object of that name seen, holder first. */
  readonly #byId = new Map<string, IdHolder[]>();

  /** Records the object (added or changed); returns whether it holds its id now. */
  remember(sandbox: Sandbox): boolean {
    const holder = idHolderOf(sandbox);
    const id = sandbox.metadata.name;
    const seen = this.#byId.get(id);
    if (seen === undefined || (seen.length === 1 && seen[0]?.namespace === holder.namespace)) {
      this.#byId.set(id, [holder]); // the common case, without a sort
      return true;
    }
    const all = [...seen.filter((h) => h.namespace !== holder.namespace), holder].sort((a, b) => (holdsBefore(a, b) ? -1 : holdsBefore(b, a) ? 1 : 0));
    this.#byId.set(id, all);
    return all[0] === holder;
  }

  forget(sandbox: Sandbox): void {
    const { name, namespace = 'default' } = sandbox.metadata;
    const left = (this.#byId.get(name) ?? []).filter((h) => h.namespace !== namespace);
    if (left.length === 0) this.#byId.delete(name);
    else this.#byId.set(name, left);
  }

  /** The holder of `id`, as far as this has seen. */
  holder(id: string): IdHolder | undefined {
    return this.#byId.get(id)?.[0];
  }

  /**
   * The object that holds `id` when the runtime's pod or kept volumes for it were made for
   * `podUid` (rule 1): that one if seen, else the holder by rules 2 and 3.
   */
  holderFor(id: string, podUid: string | undefined): IdHolder | undefined {
    const seen = this.#byId.get(id);
    return (podUid === undefined ? undefined : seen?.find((h) => h.uid === podUid)) ?? seen?.[0];
  }

  /** Whether `sandbox` holds its id, as far as this has seen (true for one not seen yet with no rival). */
  holds(sandbox: Sandbox): boolean {
    const holder = this.holder(sandbox.metadata.name);
    return holder === undefined || holder.namespace === (sandbox.metadata.namespace ?? 'default');
  }

  clear(): void {
    this.#byId.clear();
  }
}
