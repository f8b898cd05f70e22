// The SandboxClaim reconciler, for claims users apply as objects (`asb apply`, kubectl, the
// kubernetes-sigs SDK). It binds through the same Claimer as the REST API (warm if a member is
// ready, else cold), then records the binding on the claim: annotation
// agents.x-k8s.io/sandbox-name and status.sandbox.name.
// Idempotent across restarts: the bound sandbox carries the claim-uid label and an
// ownerReference to the claim, so a claim that already has a sandbox is never bound again; a
// sandbox that went away after binding (deleted) is reported, not replaced.
// As k8s-sigs' claim controller, in the reasons its SDK acts on:
// - A claim that cannot be bound as asked says why in Ready=False at once: WarmPoolNotFound,
//   TemplateNotFound, EnvVarsInjectionRejected, VolumeClaimTemplatesError (the SDK fails on these
//   instead of waiting out its 180 s). No retry with backoff: the pool, template and claim
//   informers enqueue the claim again when what it waits for changes (operator.ts).
// - env and volumeClaimTemplates force a cold start (claimer.ts), applied under the template's
//   policies (blueprint.ts).
// - At spec.lifecycle.shutdownTime the claim says Ready=False ClaimExpired, then its sandbox is
//   deleted whatever the policy; Delete deletes the claim too, DeleteForeground deletes it once
//   the sandbox is gone, Retain keeps it, naming no sandbox.
// Deleting the claim deletes its sandbox.
import { isDeepStrictEqual } from 'node:util';
import type { Condition, ResourceType } from '../api/meta.ts';
import { findCondition } from '../api/meta.ts';
import {
  ANNOTATION,
  LABEL,
  SandboxClaimType,
  SandboxType,
  type Sandbox,
  type SandboxClaim,
  type SandboxClaimStatus,
} from '../api/types.ts';
import { isAsbError } from '../errors.ts';
import type { ObjectStore } from '../store/store.ts';
import { isoNow, type Clock } from '../base/clock.ts';
import { isDeleting } from './blueprint.ts';
import { ClaimRefused, type Claimer, type ClaimRequest } from './claimer.ts';
import type { Reconciler, ReconcileResult } from './controller.ts';
import { splitKey, type Informer } from '../store/informer.ts';

export const CLAIM_INDEX = 'claim';

/** Index function for the sandbox informer: `<namespace>/<claim>` of the claim owning it. */
export function claimIndexValues(sandbox: Sandbox): string[] {
  return (sandbox.metadata.ownerReferences ?? [])
    .filter((o) => o.kind === SandboxClaimType.kind)
    .map((o) => `${sandbox.metadata.namespace ?? ''}/${o.name}`);
}

/** Index on the claim informer: what a claim waits for, `pool:<ns>/<name>` and `template:<ns>/<name>`. */
export const CLAIM_NEEDS_INDEX = 'needs';
export function claimNeedsIndexValues(claim: SandboxClaim): string[] {
  const { pool, template, namespace } = claimRequestOf(claim);
  return [...(pool === undefined ? [] : [`pool:${namespace}/${pool}`]), ...(template === undefined ? [] : [`template:${namespace}/${template}`])];
}

/** Whether a claim has no sandbox yet: the only claims a pool or template change can unblock. */
export function isUnbound(claim: SandboxClaim): boolean {
  return claim.status?.sandbox?.name === undefined && claim.metadata.annotations?.[ANNOTATION.sandboxName] === undefined;
}

/** Milliseconds since the epoch at which the claim expires, if it has a shutdown time. */
export function claimExpiryOf(claim: SandboxClaim): number | undefined {
  const at = claim.spec.lifecycle?.shutdownTime;
  const ms = at === undefined ? Number.NaN : Date.parse(at);
  return Number.isNaN(ms) ? undefined : ms;
}

export interface ClaimControllerDeps {
  store: ObjectStore;
  claims: Informer<SandboxClaim>;
  sandboxes: Informer<Sandbox>;
  claimer: Claimer;
  clock: Clock;
}

/** What the claim asks of the claimer: v1beta1 warmPoolRef, else v1alpha1 warmpool/template. */
export function claimRequestOf(claim: SandboxClaim): ClaimRequest {
  const { spec, metadata } = claim;
  const namespace = metadata.namespace ?? 'default';
  const template = spec.sandboxTemplateRef?.name;
  const poolName = spec.warmPoolRef?.name ?? (spec.warmpool === undefined || spec.warmpool === 'default' || spec.warmpool === 'none' ? undefined : spec.warmpool);
  const lifecycle = spec.lifecycle;
  return {
    namespace,
    ...(template === undefined ? {} : { template }),
    // warmpool: none asks for a cold start from the template, skipping every pool.
    ...(poolName === undefined ? {} : { pool: poolName }),
    ...(spec.warmpool === 'none' && poolName === undefined ? { warm: false } : {}),
    owner: metadata.labels?.[LABEL.owner] ?? namespace,
    ...(spec.additionalPodMetadata?.labels === undefined ? {} : { labels: spec.additionalPodMetadata.labels }),
    ...(spec.additionalPodMetadata?.annotations === undefined ? {} : { annotations: spec.additionalPodMetadata.annotations }),
    // The sandbox goes at the claim's shutdownTime under every claim policy (the policy says what
    // becomes of the claim), so the sandbox controller stops it on time even if this one lags.
    ...(lifecycle?.shutdownTime === undefined ? {} : { shutdownTime: lifecycle.shutdownTime, shutdownPolicy: 'Delete' }),
    claimRef: { name: metadata.name, uid: metadata.uid ?? '' },
    ...(spec.env === undefined || spec.env.length === 0 ? {} : { env: spec.env }),
    ...(spec.volumeClaimTemplates === undefined || spec.volumeClaimTemplates.length === 0 ? {} : { volumeClaimTemplates: spec.volumeClaimTemplates }),
  };
}

export function createClaimReconciler(deps: ClaimControllerDeps): Reconciler {
  const { store, claims, sandboxes, claimer, clock } = deps;
  /** claim uid → sandbox name bound in this process, covering the gap before the cache shows it. */
  const bound = new Map<string, string>();

  const findBound = async (claim: SandboxClaim, owned: Sandbox[]): Promise<Sandbox | 'gone' | undefined> => {
    const uid = claim.metadata.uid ?? '';
    const mine = owned.find((s) => s.metadata.labels?.[LABEL.claimUid] === uid);
    if (mine !== undefined) return mine;
    const name = bound.get(uid) ?? claim.metadata.annotations?.[ANNOTATION.sandboxName] ?? claim.status?.sandbox?.name;
    if (name === undefined) return undefined;
    // The cache may lag our own write: ask the store, which is authoritative.
    const fresh = await store.tryGet<Sandbox>(SandboxType, claim.metadata.namespace ?? '', name);
    return fresh?.metadata.labels?.[LABEL.claimUid] === uid ? fresh : 'gone';
  };

  const condition = (claim: SandboxClaim, status: Condition['status'], reason: string, message?: string): Condition => {
    const prev = findCondition(claim.status?.conditions, 'Ready');
    return {
      type: 'Ready',
      status,
      reason,
      ...(message === undefined ? {} : { message }),
      lastTransitionTime: prev !== undefined && prev.status === status ? prev.lastTransitionTime : isoNow(clock),
      ...(claim.metadata.generation === undefined ? {} : { observedGeneration: claim.metadata.generation }),
    };
  };

  const writeStatus = async (claim: SandboxClaim, status: SandboxClaimStatus): Promise<SandboxClaim> => {
    if (isDeepStrictEqual(claim.status ?? {}, status)) return claim;
    return store.updateStatus<SandboxClaim>(SandboxClaimType, { ...claim, status });
  };

  const deleteIfThere = async (type: ResourceType, namespace: string, name: string, uid?: string): Promise<void> => {
    try {
      await store.delete(type, namespace, name, uid === undefined ? undefined : { uid });
    } catch (err) {
      // NotFound: gone already. Conflict on the uid precondition: a new object of that name, not ours.
      if (!isAsbError(err, 'NotFound') && !isAsbError(err, 'Conflict')) throw err;
    }
  };

  /** The claim at or past its shutdownTime; `mine`: the sandboxes it owns. */
  const expire = async (claim: SandboxClaim, mine: Sandbox[]): Promise<undefined> => {
    const { namespace = '', name, uid } = claim.metadata;
    const policy = claim.spec.lifecycle?.shutdownPolicy ?? 'Retain';
    const message = `shutdownTime ${claim.spec.lifecycle?.shutdownTime ?? ''} reached: the sandbox is deleted${policy === 'Retain' ? ' and the claim kept (shutdownPolicy Retain)' : ', then the claim'}`;
    // Said first, so a watcher (the SDK) sees why before the sandbox or the claim goes.
    let current = claim;
    if (findCondition(claim.status?.conditions, 'Ready')?.reason !== 'ClaimExpired') {
      current = await writeStatus(claim, { ...claim.status, conditions: [condition(claim, 'False', 'ClaimExpired', message)] });
    }
    bound.delete(uid ?? '');
    for (const sandbox of mine) {
      if (!isDeleting(sandbox)) await deleteIfThere(SandboxType, namespace, sandbox.metadata.name);
    }
    // Delete: the claim goes now and its sandbox with it (the claim-gone path deletes what it owns).
    // DeleteForeground and Retain wait until the sandbox is gone: its deletion enqueues this claim.
    if (policy === 'Delete' || (policy === 'DeleteForeground' && mine.length === 0)) {
      await deleteIfThere(SandboxClaimType, namespace, name, uid);
    } else if (policy === 'Retain' && mine.length === 0) {
      const { sandbox: _gone, ...kept } = current.status ?? {};
      await writeStatus(current, { ...kept, conditions: [condition(current, 'False', 'ClaimExpired', message)] });
    }
    return undefined;
  };

  return async (key) => {
    const { namespace } = splitKey(key);
    const claim = claims.get(key);
    const owned = sandboxes.byIndex(CLAIM_INDEX, key);
    if (claim === undefined || isDeleting(claim)) {
      for (const sandbox of owned) {
        const uid = sandbox.metadata.labels?.[LABEL.claimUid];
        if (uid !== undefined) bound.delete(uid);
        if (isDeleting(sandbox)) continue;
        try {
          await store.delete(SandboxType, namespace, sandbox.metadata.name);
        } catch (err) {
          if (!isAsbError(err, 'NotFound')) throw err;
        }
      }
      return undefined;
    }
    const uid = claim.metadata.uid ?? '';
    // Sandboxes owned by an earlier claim of the same name belong to nobody now.
    for (const stale of owned.filter((s) => s.metadata.labels?.[LABEL.claimUid] !== uid && !isDeleting(s))) {
      await store.delete(SandboxType, namespace, stale.metadata.name).catch((err: unknown) => {
        if (!isAsbError(err, 'NotFound')) throw err;
      });
    }

    const now = clock.now();
    const expiry = claimExpiryOf(claim);
    if (expiry !== undefined && now >= expiry) {
      return expire(claim, owned.filter((s) => s.metadata.labels?.[LABEL.claimUid] === uid));
    }
    // As the sandbox controller, the recheck lands at the exact shutdown time (memory, no read).
    const recheck: ReconcileResult | undefined = expiry === undefined ? undefined : { requeueAfterMs: expiry - now };

    let found = await findBound(claim, owned);
    if (found === 'gone') {
      const name = bound.get(uid) ?? claim.metadata.annotations?.[ANNOTATION.sandboxName] ?? claim.status?.sandbox?.name ?? '';
      await writeStatus(claim, {
        ...claim.status,
        sandbox: { name },
        conditions: [condition(claim, 'False', 'SandboxDeleted', `sandbox ${name} no longer exists`)],
      });
      return recheck;
    }
    if (found === undefined) {
      let result;
      try {
        result = await claimer.claim(claimRequestOf(claim));
      } catch (err) {
        if (!(err instanceof ClaimRefused)) throw err;
        // Said at once and not retried: the informers enqueue the claim when the pool, the
        // template or the claim changes (operator.ts), which is what can make it bindable.
        await writeStatus(claim, { conditions: [condition(claim, 'False', err.reason, err.message)] });
        return recheck;
      }
      found = result.sandbox;
      bound.set(uid, found.metadata.name);
    }
    const sandbox = found;
    let current = claim;
    if (claim.metadata.annotations?.[ANNOTATION.sandboxName] !== sandbox.metadata.name) {
      current = await store.update<SandboxClaim>(SandboxClaimType, {
        ...claim,
        metadata: { ...claim.metadata, annotations: { ...claim.metadata.annotations, [ANNOTATION.sandboxName]: sandbox.metadata.name } },
      });
    }
    const ready = findCondition(sandbox.status?.conditions, 'Ready');
    const launch = sandbox.metadata.labels?.[LABEL.launchType];
    const podIPs = sandbox.status?.podIPs;
    await writeStatus(current, {
      sandbox: { name: sandbox.metadata.name, ...(podIPs === undefined ? {} : { podIPs }) },
      ...(launch === 'warm' || launch === 'cold' ? { launchType: launch } : {}),
      conditions: [
        ready?.status === 'True'
          ? condition(current, 'True', 'SandboxReady')
          : condition(current, 'False', ready?.reason ?? 'SandboxNotReady', ready?.message ?? `sandbox ${sandbox.metadata.name} is not ready yet`),
      ],
    });
    return recheck;
  };
}
