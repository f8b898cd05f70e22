// Every metric the worker exposes, created against an injected prom-client Registry (no
// global registry), so tests and several workers in one process never collide.
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import { ERRORS } from '../errors.ts';

// Claims are sub-millisecond to seconds (cold start): buckets from 0.25 ms to 30 s.
const LATENCY_BUCKETS = [0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
// A commit of the embedded store is ~0.3 ms of fsync on this class of disk.
const STORE_BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5];

export interface Metrics {
  claimSeconds: Histogram<'launch'>;
  claimsTotal: Counter<'launch' | 'result'>;
  poolReady: Gauge<'namespace' | 'pool'>;
  poolDesired: Gauge<'namespace' | 'pool'>;
  sandboxesByPhase: Gauge<'phase'>;
  wakeSeconds: Histogram;
  storeWriteSeconds: Histogram<'op'>;
  storeCommitBatch: Histogram;
  reconcileTotal: Counter<'controller' | 'result'>;
  httpRequestsTotal: Counter<'route' | 'code'>;
  imageGcRunsTotal: Counter<'result'>;
  imageGcRemovedTotal: Counter<'kind'>;
  imageGcFreedBytesTotal: Counter;
  /** API answers that were errors, by catalogue code (src/errors.ts): the "errors by reason" an operator reads. */
  apiErrorsTotal: Counter<'code'>;
  /** Sandboxes that entered a failure, by the reason their Ready condition gives. */
  sandboxFailuresTotal: Counter<'reason'>;
  /** Wakes of a sandbox that had a memory checkpoint, by result (restored, failed, discarded). */
  memoryRestoresTotal: Counter<'result'>;
  /** Pauses that asked for memory, by result (saved, fell_back, failed). */
  checkpointsTotal: Counter<'result'>;
  lifecycleEventsTotal: Counter<'type'>;
  kubeEventsTotal: Counter<'result'>;
  webhookAttemptsTotal: Counter<'outcome'>;
}

/**
 * Reasons a sandbox fails that we know of, exported at 0 from the start: Prometheus's increase()
 * sees no rise in a series that first appears at 1, so an alert on the first failure needs the 0.
 */
const FAILURE_REASONS = ['PodStartFailed', 'ErrImagePull', 'ImagePullBackOff', 'InvalidImageName', 'ErrImageNeverPull', 'Evicted', 'OOMKilled', 'PodFailed', 'SnapshotNotReady', 'NameConflict'];

export function createMetrics(registry: Registry): Metrics {
  const metrics = createSeries(registry);
  // Known label values at 0 (see FAILURE_REASONS): the first failure is then a rise an alert sees.
  for (const code of Object.keys(ERRORS)) metrics.apiErrorsTotal.inc({ code }, 0);
  for (const reason of FAILURE_REASONS) metrics.sandboxFailuresTotal.inc({ reason }, 0);
  for (const result of ['restored', 'failed', 'discarded']) metrics.memoryRestoresTotal.inc({ result }, 0);
  for (const result of ['saved', 'fell_back', 'failed']) metrics.checkpointsTotal.inc({ result }, 0);
  for (const launch of ['warm', 'cold']) metrics.claimsTotal.inc({ launch, result: 'bound' }, 0);
  metrics.claimsTotal.inc({ launch: 'none', result: 'failed' }, 0);
  // Histograms too: a rate() of buckets that first appear with the first claim stays 0.
  for (const launch of ['warm', 'cold']) metrics.claimSeconds.zero({ launch });
  return metrics;
}

function createSeries(registry: Registry): Metrics {
  const registers = [registry];
  return {
    claimSeconds: new Histogram({
      name: 'asb_claim_seconds',
      help: 'Time from a claim request to a bound sandbox, by launch type (warm or cold).',
      labelNames: ['launch'],
      buckets: LATENCY_BUCKETS,
      registers,
    }),
    claimsTotal: new Counter({
      name: 'asb_claims_total',
      help: 'Claims handled, by launch type and result (bound, failed).',
      labelNames: ['launch', 'result'],
      registers,
    }),
    poolReady: new Gauge({
      name: 'asb_warm_pool_ready_replicas',
      help: 'Ready, unclaimed members of each warm pool.',
      labelNames: ['namespace', 'pool'],
      registers,
    }),
    poolDesired: new Gauge({
      name: 'asb_warm_pool_desired_replicas',
      help: 'Desired members of each warm pool (spec.replicas).',
      labelNames: ['namespace', 'pool'],
      registers,
    }),
    sandboxesByPhase: new Gauge({
      name: 'asb_sandboxes',
      help: 'Sandboxes on this worker by phase.',
      labelNames: ['phase'],
      registers,
    }),
    wakeSeconds: new Histogram({
      name: 'asb_wake_seconds',
      help: 'Time to wake a hibernated sandbox until it is ready again.',
      buckets: LATENCY_BUCKETS,
      registers,
    }),
    storeWriteSeconds: new Histogram({
      name: 'asb_store_write_seconds',
      help: 'Time from a store write call to its durable commit, by operation.',
      labelNames: ['op'],
      buckets: STORE_BUCKETS,
      registers,
    }),
    storeCommitBatch: new Histogram({
      name: 'asb_store_commit_batch_writes',
      help: 'Writes committed together in one transaction (group commit).',
      buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
      registers,
    }),
    reconcileTotal: new Counter({
      name: 'asb_reconcile_total',
      help: 'Reconciles run, by controller and result (ok, requeue, error).',
      labelNames: ['controller', 'result'],
      registers,
    }),
    httpRequestsTotal: new Counter({
      name: 'asb_http_requests_total',
      help: 'Worker API requests by route and status code.',
      labelNames: ['route', 'code'],
      registers,
    }),
    imageGcRunsTotal: new Counter({
      name: 'asb_image_gc_runs_total',
      help: 'Image cache GC passes of the local runtime, by result (ok, error).',
      labelNames: ['result'],
      registers,
    }),
    imageGcRemovedTotal: new Counter({
      name: 'asb_image_gc_removed_total',
      help: 'What image GC removed: kind image (a pulled reference) or rootfs (an unpacked tree).',
      labelNames: ['kind'],
      registers,
    }),
    imageGcFreedBytesTotal: new Counter({
      name: 'asb_image_gc_freed_bytes_total',
      help: 'Disk space image GC gave back: blobs and unpacked trees, in allocated bytes.',
      registers,
    }),
    apiErrorsTotal: new Counter({
      name: 'asb_api_errors_total',
      help: 'Worker API requests answered with an error, by error code (docs/errors.md: NotFound, Unauthorized, PoolExhausted, Internal, ...).',
      labelNames: ['code'],
      registers,
    }),
    sandboxFailuresTotal: new Counter({
      name: 'asb_sandbox_failures_total',
      help: 'Sandboxes that entered a failure, by the reason of their Ready condition (PodStartFailed, ErrImagePull, Evicted, OOMKilled, PodFailed, SnapshotNotReady, NameConflict, ...).',
      labelNames: ['reason'],
      registers,
    }),
    memoryRestoresTotal: new Counter({
      name: 'asb_memory_restores_total',
      help: 'Starts of a sandbox that had a memory checkpoint, by result: restored, failed (started from its files instead), discarded (as asked).',
      labelNames: ['result'],
      registers,
    }),
    checkpointsTotal: new Counter({
      name: 'asb_checkpoints_total',
      help: 'Pauses that asked to keep memory, by result: saved, fell_back (files kept, the pause allowed it), failed (not paused, the sandbox keeps running).',
      labelNames: ['result'],
      registers,
    }),
    lifecycleEventsTotal: new Counter({
      name: 'asb_lifecycle_events_total',
      help: 'Lifecycle events recorded for teams (events API, webhooks), by type.',
      labelNames: ['type'],
      registers,
    }),
    kubeEventsTotal: new Counter({
      name: 'asb_kube_events_total',
      help: 'Facts written as Kubernetes Events, by result (ok, error: given up, Events are best-effort).',
      labelNames: ['result'],
      registers,
    }),
    webhookAttemptsTotal: new Counter({
      name: 'asb_webhook_attempts_total',
      help: 'Webhook delivery attempts, by outcome (delivered, retried, failed: out of attempts).',
      labelNames: ['outcome'],
      registers,
    }),
  };
}
