// The SandboxWarmPool reconciler: keeps spec.replicas unclaimed Sandbox members of a template.
// Members are full Sandbox objects labelled LABEL.pool=<pool>, owned by the pool and named by
// newSandboxId (ids must be [a-z0-9]+ and carry the cluster tag, so no generateName).
// - Refill creates the whole deficit at once, 64 creates in flight: the 300-member refill target
//   is 3 s, and the store's group commit makes parallel creates cheap, so the 1, 2, 4, … slow
//   start of k8s-sigs (which protects a shared apiserver) would only cost seconds here.
// - "Expectations": names created but not yet seen by the informer count as members, and names
//   deleted but still cached do not, so a fast requeue never over- or under-shoots.
// - A member not Ready within notReadyReplaceMs (60 s; k8s-sigs waits 5 min) is deleted and
//   replaced; scale-down deletes surplus members, not-ready ones first.
// - Status (replicas, readyReplicas, selector, observedGeneration, Ready) is written on change.
import { createHash } from 'node:crypto';
import { isDeepStrictEqual } from 'node:util';
import { newSandboxId } from '../api/ids.ts';
import { apiVersionOf, type Condition } from '../api/meta.ts';
import {
  LABEL,
  SandboxType,
  SandboxWarmPoolType,
  type Sandbox,
  type SandboxTemplate,
  type SandboxWarmPool,
  type SandboxWarmPoolStatus,
} from '../api/types.ts';
import { isAsbError } from '../errors.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { ObjectStore } from '../store/store.ts';
import { isoNow, type Clock } from '../base/clock.ts';
import { isDeleting, isSandboxReady, sandboxFromTemplate } from './blueprint.ts';
import type { Reconciler } from './controller.ts';
import { splitKey, type Informer } from '../store/informer.ts';

export const POOL_INDEX = 'pool';
/** On members: which version of the template built them, for updateStrategy Recreate. */
export const TEMPLATE_HASH_ANNOTATION = 'asb.dev/template-hash';
const CREATE_CONCURRENCY = 64;
const DEFAULT_NOT_READY_REPLACE_MS = 60_000;
const TEMPLATE_MISSING_RECHECK_MS = 10_000;

export interface WarmPoolControllerDeps {
  store: ObjectStore;
  sandboxes: Informer<Sandbox>;
  pools: Informer<SandboxWarmPool>;
  templates: Informer<SandboxTemplate>;
  clock: Clock;
  metrics: Metrics;
  clusterTag: string;
  notReadyReplaceMs?: number;
}

/**
 * Index function for the sandbox informer: `<namespace>/<pool>` of unclaimed members. A member
 * carries the pool label, no owner yet, and the pool as its owner reference, as this controller
 * creates it: a sandbox that only wears the label (security probe M1: a team applied owned
 * sandboxes labelled as members, and the pool counted them ready and stopped refilling) is none.
 */
export function poolIndexValues(sandbox: Sandbox): string[] {
  const { labels, ownerReferences, namespace } = sandbox.metadata;
  const pool = labels?.[LABEL.pool];
  if (pool === undefined || labels?.[LABEL.owner] !== undefined) return [];
  const ownedByPool = ownerReferences?.some((o) => o.kind === SandboxWarmPoolType.kind && o.name === pool) === true;
  return ownedByPool ? [`${namespace ?? ''}/${pool}`] : [];
}

/** A short digest of what a member copies from its template. */
export function templateHash(template: SandboxTemplate): string {
  const { podTemplate, volumeClaimTemplates, service, idleTimeoutMs, network, networkPolicy } = template.spec;
  return createHash('sha256').update(JSON.stringify({ podTemplate, volumeClaimTemplates, service, idleTimeoutMs, network, networkPolicy })).digest('hex').slice(0, 16);
}

/** Runs fn over items with at most `limit` in flight; rejects with the first error after all settle. */
async function forEachBounded<T>(items: readonly T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  let firstError: unknown;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const item = items[next++] as T;
      try {
        await fn(item);
      } catch (err) {
        firstError ??= err;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  if (firstError !== undefined) throw firstError instanceof Error ? firstError : new Error('member operation failed', { cause: firstError });
}

export interface WarmPoolController {
  reconcile: Reconciler;
  /** Called by the sandbox informer so expectations clear as soon as the cache shows a member. */
  observed(key: string, current: Sandbox | undefined): void;
}

export function createWarmPoolController(deps: WarmPoolControllerDeps): WarmPoolController {
  const { store, sandboxes, pools, templates, clock, metrics, clusterTag } = deps;
  const replaceMs = deps.notReadyReplaceMs ?? DEFAULT_NOT_READY_REPLACE_MS;
  /** pool key → member names created but not yet in the cache */
  const pendingCreates = new Map<string, Set<string>>();
  /** sandbox key → deleted by us, still in the cache */
  const pendingDeletes = new Set<string>();
  /**
   * sandbox key → when this process first saw it. The not-ready deadline counts from here, not
   * from creationTimestamp: the store's clock may differ from ours (another host, a test clock),
   * and a skew larger than the window would delete every new member at once, forever.
   */
  const firstSeen = new Map<string, number>();

  const observed = (key: string, current: Sandbox | undefined): void => {
    if (current === undefined) {
      pendingDeletes.delete(key);
      firstSeen.delete(key);
      return;
    }
    if (!firstSeen.has(key)) firstSeen.set(key, clock.now());
    for (const poolKey of poolIndexValues(current)) pendingCreates.get(poolKey)?.delete(current.metadata.name);
  };

  const deleteMember = async (sandbox: Sandbox): Promise<void> => {
    const key = `${sandbox.metadata.namespace ?? ''}/${sandbox.metadata.name}`;
    pendingDeletes.add(key);
    try {
      await store.delete(SandboxType, sandbox.metadata.namespace ?? '', sandbox.metadata.name, {
        ...(sandbox.metadata.uid === undefined ? {} : { uid: sandbox.metadata.uid }),
      });
    } catch (err) {
      pendingDeletes.delete(key);
      if (!isAsbError(err, 'NotFound')) throw err;
    }
  };

  const writeStatus = async (pool: SandboxWarmPool, status: SandboxWarmPoolStatus): Promise<void> => {
    if (isDeepStrictEqual(pool.status ?? {}, status)) return;
    await store.updateStatus<SandboxWarmPool>(SandboxWarmPoolType, { ...pool, status });
  };

  const condition = (pool: SandboxWarmPool, status: Condition['status'], reason: string, message?: string): Condition => {
    const prev = pool.status?.conditions?.find((c) => c.type === 'Ready');
    return {
      type: 'Ready',
      status,
      reason,
      ...(message === undefined ? {} : { message }),
      lastTransitionTime: prev !== undefined && prev.status === status ? prev.lastTransitionTime : isoNow(clock),
      ...(pool.metadata.generation === undefined ? {} : { observedGeneration: pool.metadata.generation }),
    };
  };

  const reconcile: Reconciler = async (key) => {
    const { namespace, name } = splitKey(key);
    const members = sandboxes.byIndex(POOL_INDEX, key).filter((s) => !isDeleting(s) && !pendingDeletes.has(`${namespace}/${s.metadata.name}`));
    const pool = pools.get(key);
    if (pool === undefined || isDeleting(pool)) {
      // No garbage collector here: the pool's members go with it.
      pendingCreates.delete(key);
      metrics.poolReady.remove({ namespace, pool: name });
      metrics.poolDesired.remove({ namespace, pool: name });
      await forEachBounded(members, CREATE_CONCURRENCY, deleteMember);
      return undefined;
    }
    const desired = Math.max(0, pool.spec.replicas);
    const templateName = pool.spec.sandboxTemplateRef.name;
    const template = templates.getByName(namespace, templateName);
    const now = clock.now();
    // Recreate: members built from an older template are replaced now; OnReplenish (the
    // default) lets them be claimed and only new members use the new template.
    const hash = template === undefined ? undefined : templateHash(template);
    const outdated = (m: Sandbox): boolean =>
      pool.spec.updateStrategy?.type === 'Recreate' && hash !== undefined && m.metadata.annotations?.[TEMPLATE_HASH_ANNOTATION] !== hash;

    // Replace members that were given their chance to become ready.
    const ready: Sandbox[] = [];
    const notReady: Sandbox[] = [];
    const stale: Sandbox[] = [];
    let nextDeadline = Infinity;
    for (const member of members) {
      if (outdated(member)) {
        stale.push(member);
        continue;
      }
      if (isSandboxReady(member)) {
        ready.push(member);
        continue;
      }
      const seen = firstSeen.get(`${namespace}/${member.metadata.name}`) ?? now;
      const deadline = seen + replaceMs;
      const failed = member.status?.phase === 'Failed';
      if (failed || deadline <= now) stale.push(member);
      else {
        notReady.push(member);
        nextDeadline = Math.min(nextDeadline, deadline);
      }
    }
    const pending = pendingCreates.get(key) ?? new Set<string>();
    pendingCreates.set(key, pending);
    let current = ready.length + notReady.length + pending.size;
    const toDelete = [...stale];
    if (current > desired) {
      // Not-ready first (they are furthest from useful), newest first within each group.
      const byNewest = (a: Sandbox, b: Sandbox): number => (b.metadata.creationTimestamp ?? '').localeCompare(a.metadata.creationTimestamp ?? '');
      const surplus = [...notReady.sort(byNewest), ...ready.sort(byNewest)].slice(0, current - desired);
      toDelete.push(...surplus);
      current -= surplus.length;
    }
    await forEachBounded(toDelete, CREATE_CONCURRENCY, deleteMember);

    const readyCount = ready.filter((m) => !toDelete.includes(m)).length;
    const memberCount = ready.length + notReady.length - (toDelete.length - stale.length);
    metrics.poolDesired.set({ namespace, pool: name }, desired);
    metrics.poolReady.set({ namespace, pool: name }, readyCount);

    if (template === undefined) {
      await writeStatus(pool, {
        replicas: memberCount,
        readyReplicas: readyCount,
        selector: `${LABEL.pool}=${name}`,
        ...(pool.metadata.generation === undefined ? {} : { observedGeneration: pool.metadata.generation }),
        conditions: [condition(pool, 'False', 'TemplateNotFound', `SandboxTemplate "${templateName}" not found`)],
      });
      return { requeueAfterMs: TEMPLATE_MISSING_RECHECK_MS };
    }

    const deficit = desired - current;
    if (deficit > 0) {
      const names = Array.from({ length: deficit }, () => newSandboxId(clusterTag));
      for (const n of names) pending.add(n);
      const owner = {
        apiVersion: apiVersionOf(SandboxWarmPoolType),
        kind: SandboxWarmPoolType.kind,
        name,
        uid: pool.metadata.uid ?? '',
        controller: true,
        blockOwnerDeletion: true,
      };
      await forEachBounded(names, CREATE_CONCURRENCY, async (memberName) => {
        const member = sandboxFromTemplate(template, {
          name: memberName,
          namespace,
          labels: { [LABEL.pool]: name, [LABEL.template]: templateName },
          annotations: { [TEMPLATE_HASH_ANNOTATION]: templateHash(template) },
          ownerReferences: [owner],
        });
        try {
          await store.create(SandboxType, member);
        } catch (err) {
          pending.delete(memberName);
          throw err;
        }
      });
    }

    const full = readyCount >= desired;
    await writeStatus(pool, {
      replicas: memberCount,
      readyReplicas: readyCount,
      selector: `${LABEL.pool}=${name}`,
      ...(pool.metadata.generation === undefined ? {} : { observedGeneration: pool.metadata.generation }),
      conditions: [full ? condition(pool, 'True', 'PoolReady') : condition(pool, 'False', 'PoolFilling', `${readyCount}/${desired} ready`)],
    });
    return Number.isFinite(nextDeadline) ? { requeueAfterMs: Math.max(1, nextDeadline - now) } : undefined;
  };

  return { reconcile, observed };
}
