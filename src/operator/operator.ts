// Composition of the operator: five informers (Sandbox, SandboxTemplate, SandboxWarmPool,
// SandboxClaim, SandboxSnapshot), four controllers, the claimer and the activity tracker.
// Start order: informers list and sync first; only then do controllers get keys (a pool
// reconciled against a half-filled sandbox cache would over-create members), and only then does
// recovery run: pods the runtime holds for sandboxes that no longer exist are removed, and every
// sandbox is reconciled, which restarts pods that should run (after a worker restart).
// Shutdown order, under one deadline: controllers drain, the claimer rejects its waiters, the
// informers stop. The store and the runtime belong to the caller and stay open.
import {
  SandboxClaimType,
  SandboxSnapshotType,
  SandboxTemplateType,
  SandboxType,
  SandboxWarmPoolType,
  type Sandbox,
  type SandboxClaim,
  type SandboxSnapshot,
  type SandboxTemplate,
  type SandboxWarmPool,
} from '../api/types.ts';
import { AsbError } from '../errors.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { PodRuntime } from '../runtime/runtime.ts';
import type { ObjectStore } from '../store/store.ts';
import { systemClock, type Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { createActivity, type Activity } from './activity.ts';
import { CLAIM_INDEX, CLAIM_NEEDS_INDEX, claimIndexValues, claimNeedsIndexValues, createClaimReconciler, isUnbound } from './claim-controller.ts';
import { Claimer, POOL_BY_TEMPLATE_INDEX, poolTemplateIndexValues } from './claimer.ts';
import { Controller } from './controller.ts';
import { Informer, objectKey } from '../store/informer.ts';
import { createSandboxReconciler, isTeardown, NAME_INDEX, nameIndexValues } from './sandbox-controller.ts';
import { createSnapshotReconciler } from './snapshot-controller.ts';
import { POOL_INDEX, createWarmPoolController, poolIndexValues } from './warmpool-controller.ts';

/** How long member changes wait before the pool reconciles; see the sandbox informer handler. */
const POOL_COALESCE_MS = 20;

export interface OperatorOptions {
  store: ObjectStore;
  runtime: PodRuntime;
  log: Logger;
  metrics: Metrics;
  clock?: Clock;
  /** This worker's 4-character cluster tag, the prefix of every sandbox id it makes. */
  clusterTag: string;
  /** Sandbox reconciles at once; default 64 (each may wait on a pod start). */
  workers?: number;
  /** Replace warm members not Ready after this long; default 60 s. */
  notReadyReplaceMs?: number;
  /** Deadline for close(); default 10 s. */
  closeDeadlineMs?: number;
}

export interface Operator {
  claimer: Claimer;
  activity: Activity;
  sandboxes: Informer<Sandbox>;
  /** Resolves once every cache has synced and recovery has run. */
  ready(): Promise<void>;
  /** Reconciles queued or running across controllers; 0 when the operator has settled. */
  depth(): number;
  close(): Promise<void>;
}

const SANDBOX_WORKERS = 64;
/** Of those, teardowns of deleted sandboxes at once (Controller's background keys). */
const TEARDOWN_WORKERS = 8;
const POOL_WORKERS = 4;
const CLAIM_WORKERS = 16;
/** Snapshots at once: each copies a disk and may save a sandbox's memory. */
const SNAPSHOT_WORKERS = 4;

export function startOperator(opts: OperatorOptions): Promise<Operator> {
  const { store, runtime, metrics, clusterTag } = opts;
  const clock = opts.clock ?? systemClock;
  const log = opts.log.child({ component: 'operator' });

  const sandboxes = new Informer<Sandbox>({ store, type: SandboxType, clock, log });
  const templates = new Informer<SandboxTemplate>({ store, type: SandboxTemplateType, clock, log });
  const pools = new Informer<SandboxWarmPool>({ store, type: SandboxWarmPoolType, clock, log });
  const claims = new Informer<SandboxClaim>({ store, type: SandboxClaimType, clock, log });
  const snapshots = new Informer<SandboxSnapshot>({ store, type: SandboxSnapshotType, clock, log });
  sandboxes.addIndex(POOL_INDEX, poolIndexValues);
  sandboxes.addIndex(CLAIM_INDEX, claimIndexValues);
  sandboxes.addIndex(NAME_INDEX, nameIndexValues);
  pools.addIndex(POOL_BY_TEMPLATE_INDEX, poolTemplateIndexValues);
  claims.addIndex(CLAIM_NEEDS_INDEX, claimNeedsIndexValues);

  const activity = createActivity(clock);
  const claimer = new Claimer({ store, sandboxes, pools, templates, clock, metrics, clusterTag, activity });
  const warmPool = createWarmPoolController({
    store,
    sandboxes,
    pools,
    templates,
    clock,
    metrics,
    clusterTag,
    ...(opts.notReadyReplaceMs === undefined ? {} : { notReadyReplaceMs: opts.notReadyReplaceMs }),
  });
  const sandboxController = new Controller({
    name: 'sandbox',
    reconcile: createSandboxReconciler({ store, runtime, sandboxes, activity, clock, metrics }),
    clock,
    log,
    metrics,
    workers: opts.workers ?? SANDBOX_WORKERS,
    // A deleted sandbox's teardown is work nobody waits on: it must never hold up a start, and
    // few run at once, since each contends with starts for the same kernel work (unmounts, nft
    // commits, runc). During 320 teardowns on 2 busy cores, creates took 500-870 ms with 16 at
    // once and 280-860 ms with 4 (trace: the shim's mount and runc create, the nft commit).
    background: (key) => isTeardown(sandboxes.get(key)),
    backgroundWorkers: TEARDOWN_WORKERS,
  });
  const poolController = new Controller({ name: 'warmpool', reconcile: warmPool.reconcile, clock, log, metrics, workers: POOL_WORKERS });
  const claimController = new Controller({
    name: 'claim',
    reconcile: createClaimReconciler({ store, claims, sandboxes, claimer, clock }),
    clock,
    log,
    metrics,
    workers: CLAIM_WORKERS,
  });
  const snapshotController = new Controller({ name: 'snapshot', reconcile: createSnapshotReconciler({ store, runtime, snapshots, sandboxes, clock }), clock, log, metrics, workers: SNAPSHOT_WORKERS });
  const controllers = [sandboxController, poolController, claimController, snapshotController];

  let started = false;
  const phaseCounts = new Map<string, number>();
  const countPhase = (sandbox: Sandbox | undefined, delta: number): void => {
    if (sandbox === undefined) return;
    const phase = sandbox.status?.phase ?? 'Pending';
    const n = (phaseCounts.get(phase) ?? 0) + delta;
    phaseCounts.set(phase, n);
    metrics.sandboxesByPhase.set({ phase }, n);
  };

  sandboxes.onChange((key, current, previous) => {
    // Most changes (a claim, a status write) keep the phase: the gauge moves only when it changes.
    if (current?.status?.phase !== previous?.status?.phase || current === undefined || previous === undefined) {
      countPhase(previous, -1);
      countPhase(current, 1);
    }
    warmPool.observed(key, current);
    claimer.observe(key, current, previous);
    if (!started) return;
    sandboxController.enqueueSoon(key);
    // Member changes reach the pool after a short coalescing delay: a burst of 64 claims then
    // costs one refill reconcile after the burst instead of refill work interleaved with (and
    // delaying) every claim's response.
    for (const poolKey of new Set([...(current ? poolIndexValues(current) : []), ...(previous ? poolIndexValues(previous) : [])])) {
      poolController.enqueueAfter(poolKey, POOL_COALESCE_MS);
    }
    for (const claimKey of new Set([...(current ? claimIndexValues(current) : []), ...(previous ? claimIndexValues(previous) : [])])) {
      claimController.enqueue(claimKey);
    }
  });
  // Claims that said WarmPoolNotFound or TemplateNotFound (or that a template refused) wait for
  // the pool or template to change; bound claims never do, so they are not enqueued.
  const enqueueWaiting = (needs: string): void => {
    for (const claim of claims.byIndex(CLAIM_NEEDS_INDEX, needs)) if (isUnbound(claim)) claimController.enqueue(objectKey(claim));
  };
  pools.onChange((key, current, previous) => {
    if (!started) return;
    poolController.enqueue(key);
    // Status-only writes (every claim's refill moves readyReplicas) change nothing a claim waits for.
    if (current === undefined || previous === undefined || current.metadata.generation !== previous.metadata.generation) enqueueWaiting(`pool:${key}`);
  });
  templates.onChange((key) => {
    if (!started) return;
    for (const pool of pools.byIndex(POOL_BY_TEMPLATE_INDEX, key)) {
      poolController.enqueue(objectKey(pool));
      enqueueWaiting(`pool:${objectKey(pool)}`);
    }
    enqueueWaiting(`template:${key}`);
  });
  claims.onChange((key) => {
    if (started) claimController.enqueue(key);
  });
  snapshots.onChange((key) => {
    if (started) snapshotController.enqueue(key);
  });
  const stopRuntimeEvents = runtime.onChange((id) => {
    if (!started) return;
    for (const sandbox of sandboxes.byIndex(NAME_INDEX, id)) sandboxController.enqueue(objectKey(sandbox));
  });

  const informers = [sandboxes, templates, pools, claims, snapshots];
  for (const informer of informers) informer.start();
  // close() before the caches sync must not leave ready() callers hanging.
  let abortStart: (err: Error) => void = () => undefined;
  const closedEarly = new Promise<never>((_, reject) => {
    abortStart = reject;
  });
  const readyPromise = (async () => {
    await Promise.race([Promise.all(informers.map((i) => i.synced())), closedEarly]);
    // Recovery: pods whose sandbox is gone (deleted while this worker was down).
    const orphans = runtime.list().filter((id) => sandboxes.byIndex(NAME_INDEX, id).length === 0);
    await Promise.all(orphans.map((id) => runtime.remove(id)));
    if (orphans.length > 0) log.info({ orphans: orphans.length }, 'removed pods of sandboxes that no longer exist');
    started = true;
    for (const s of sandboxes.list()) sandboxController.enqueue(objectKey(s));
    for (const p of pools.list()) poolController.enqueue(objectKey(p));
    for (const c of claims.list()) claimController.enqueue(objectKey(c));
    for (const s of snapshots.list()) snapshotController.enqueue(objectKey(s));
    log.info({ sandboxes: sandboxes.list().length, pools: pools.list().length, claims: claims.list().length }, 'operator caches synced');
  })();
  readyPromise.catch((err: unknown) => log.error({ err }, 'operator failed to start'));

  let closing: Promise<void> | undefined;
  const close = (): Promise<void> => {
    closing ??= (async () => {
      stopRuntimeEvents();
      abortStart(new AsbError('Unavailable', 'operator closed before its caches synced'));
      const deadline = opts.closeDeadlineMs ?? 10_000;
      await Promise.all(controllers.map((c) => c.close(deadline)));
      claimer.close();
      for (const informer of informers) informer.close();
    })();
    return closing;
  };

  return Promise.resolve({
    claimer,
    activity,
    sandboxes,
    ready: () => readyPromise,
    depth: () => controllers.reduce((n, c) => n + c.depth, 0),
    close,
  });
}
