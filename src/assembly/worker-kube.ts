// The worker's Kubernetes parts, loaded only with --store=kube (dynamic import from worker.ts:
// @kubernetes/client-node costs ~0.4 s to load, which the SQLite default never pays):
// - the kube store;
// - the controllers under the Lease: the operator, the lifecycle event recorder (and the hub sync agent, which writes what the
//   hub sends, and its link's state for the API processes: hub-link.ts) start when this process
//   takes the Lease and stop when it loses it. The Lease has a connection of its own, so a
//   renewal never queues behind a claim burst on the store's sockets; only a process that
//   campaigns opens it (--role=api never does).
import type { Metrics } from '../metrics/metrics.ts';
import { startOperator, type Operator } from '../operator/operator.ts';
import type { EventLog } from '../events/event-log.ts';
import { startLifecycleEvents, type LifecycleEvents } from '../events/lifecycle-events.ts';
import { LeaderElector } from '../operator/leader.ts';
import type { PodRuntime } from '../runtime/runtime.ts';
import { openKubeStore, type KubeStore } from '../store/kube.ts';
import { inClusterKubeConfig, KubeHttp, loadKubeConfig } from '../store/kube-http.ts';
import { startSyncAgent, type SyncAgent } from '../worker/sync/sync-agent.ts';
import type { KubeConfig } from '@kubernetes/client-node';
import type { Registry } from 'prom-client';
import { createKubeRuntime } from '../runtime/kube/kube-runtime.ts';
import type { Clock } from '../base/clock.ts';
import type { WorkerConfig } from './worker-config.ts';
import type { Logger } from '../base/log.ts';

export interface KubeConnection {
  store: KubeStore;
  /** The kubeconfig the store was opened with (a file's, or the Pod's own). */
  kubeconfig: KubeConfig;
}

export async function connectKube(config: WorkerConfig, opts: { clock: Clock; metrics: Metrics; log: Logger }): Promise<KubeConnection> {
  const kubeconfig = config.kubeconfig === undefined ? inClusterKubeConfig() : loadKubeConfig(config.kubeconfig);
  const store = await openKubeStore({ kubeconfig, namespace: config.namespace, metrics: opts.metrics, log: opts.log, clock: opts.clock });
  return { store, kubeconfig };
}

/**
 * Sandboxes as Pods (with their PVCs) in --pod-namespace (default --namespace), whatever
 * namespace their Sandbox is in: the worker's own namespace (the kubeconfig's, in a Pod) is for
 * the worker and holds its Secrets; clusters/base runs sandboxes in `agent-sandboxes`, which
 * enforces Pod Security `restricted`.
 */
export function createKubePodRuntime(config: WorkerConfig, kube: KubeConnection, opts: { clock: Clock; log: Logger; namespace?: string }): Promise<PodRuntime> {
  return createKubeRuntime({ kubeconfig: kube.kubeconfig, store: kube.store, namespace: opts.namespace ?? config.podNamespace, log: opts.log, clock: opts.clock, egressFloor: config.egressFloor });
}

export interface LedControllers {
  readonly elector: LeaderElector;
  /** The running operator while this process leads. */
  current(): Operator | undefined;
  /** Stops leading (controllers first), then releases the Lease and closes its connection. Idempotent. */
  close(): Promise<void>;
}

export interface LedControllersOptions {
  config: WorkerConfig;
  kube: KubeConnection;
  runtime: PodRuntime;
  hubCredential: string | undefined;
  log: Logger;
  metrics: Metrics;
  registry: Registry;
  clock: Clock;
  /** Lifecycle events are recorded into this log (and written as Kubernetes Events) while this process leads. */
  eventLog?: EventLog;
}

/** The operator (and the hub sync agent) run only while this process holds the operator Lease. */
export async function startLedControllers(opts: LedControllersOptions): Promise<LedControllers> {
  const { config, kube, runtime, log, metrics, clock } = opts;
  const http = await KubeHttp.open(kube.kubeconfig);
  let operator: Operator | undefined;
  let sync: SyncAgent | undefined;
  let lifecycle: LifecycleEvents | undefined;
  const elector = new LeaderElector({
    http,
    // The kubeconfig context's namespace (in a Pod: the Pod's), else --namespace.
    namespace: http.target.namespace ?? config.namespace,
    // One Lease per worker cluster: the tag is unique in a federation and a valid name part.
    name: `asb-operator-${config.clusterTag}`,
    clock,
    log,
    registry: opts.registry,
    async onStartedLeading() {
      operator = await startOperator({ store: kube.store, runtime, log: log.child({ component: 'operator' }), metrics, clock, clusterTag: config.clusterTag });
      if (opts.eventLog !== undefined) lifecycle = await startLifecycleEvents({ store: kube.store, log, clock, events: opts.eventLog, instance: config.clusterTag, metrics, webhooks: { allowPrivate: config.webhookAllowPrivate } });
      if (config.hubUrl !== undefined && opts.hubCredential !== undefined) {
        sync = startSyncAgent({ hubUrl: config.hubUrl, credential: opts.hubCredential, cluster: config.clusterName, clusterTag: config.clusterTag, store: kube.store, log, clock });
      }
    },
    async onStoppedLeading() {
      const [o, s, l] = [operator, sync, lifecycle];
      operator = undefined;
      sync = undefined;
      lifecycle = undefined;
      await l?.close();
      await s?.close();
      await o?.close();
    },
  });
  elector.start();
  return {
    elector,
    current: () => operator,
    async close() {
      await elector.close();
      http.close();
    },
  };
}
