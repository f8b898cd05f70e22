// The SandboxClaim reconciler, for claims users apply as objects (`asb apply`, kubectl). It binds
// through the same Claimer as the REST API (warm if a member is ready, else cold), then records
// the binding on the claim: annotation agents.x-k8s.io/sandbox-name and status.sandbox.name.
// Idempotent across restarts: the bound sandbox carries the claim-uid label and an
// ownerReference to the claim, so a claim that already has a sandbox is never bound again; a
// sandbox that went away after binding (expired, deleted) is reported, not replaced.
// Deleting the claim deletes its sandbox.
import { isDeepStrictEqual } from 'node:util';
import type { Condition } from '../api/meta.ts';
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
import { isoNow, type Clock } from '../system/clock.ts';
import { isDeleting } from './blueprint.ts';
import type { Claimer, ClaimRequest } from './claimer.ts';
import type { Reconciler } from './controller.ts';
import { splitKey, type Informer } from './informer.ts';

export const CLAIM_INDEX = 'claim';

/** Index function for the sandbox informer: `<namespace>/<claim>` of the claim owning it. */
export function claimIndexValues(sandbox: Sandbox): string[] {
  return (sandbox.metadata.ownerReferences ?? [])
    .filter((o) => o.kind === SandboxClaimType.kind)
    .map((o) => `${sandbox.metadata.namespace ?? ''}/${o.name}`);
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
    ...(lifecycle?.shutdownTime === undefined ? {} : { shutdownTime: lifecycle.shutdownTime }),
    // DeleteForeground only matters to a garbage collector; here it deletes like Delete.
    ...(lifecycle?.shutdownPolicy === undefined ? {} : { shutdownPolicy: lifecycle.shutdownPolicy === 'Retain' ? 'Retain' : 'Delete' }),
    claimRef: { name: metadata.name, uid: metadata.uid ?? '' },
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

  const writeStatus = async (claim: SandboxClaim, status: SandboxClaimStatus): Promise<void> => {
    if (isDeepStrictEqual(claim.status ?? {}, status)) return;
    await store.updateStatus<SandboxClaim>(SandboxClaimType, { ...claim, status });
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

    let found = await findBound(claim, owned);
    if (found === 'gone') {
      const name = bound.get(uid) ?? claim.metadata.annotations?.[ANNOTATION.sandboxName] ?? claim.status?.sandbox?.name ?? '';
      await writeStatus(claim, {
        ...claim.status,
        sandbox: { name },
        conditions: [condition(claim, 'False', 'SandboxDeleted', `sandbox ${name} no longer exists`)],
      });
      return undefined;
    }
    if (found === undefined) {
      const result = await claimer.claim(claimRequestOf(claim));
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
    return undefined;
  };
}
