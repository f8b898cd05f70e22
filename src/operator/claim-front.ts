// The claim side of the operator alone, for a process that serves the API but does not run the
// controllers: --role=api, and --role=all on the kube store, whose controllers run only while it
// holds the leader Lease (leader.ts) but whose API claims all the time. It keeps what a claim
// needs in memory (the Sandbox, SandboxTemplate and SandboxWarmPool caches and the Claimer's
// FIFOs over them), so a warm claim stays one compare-and-swap write with no read, whichever
// process holds the Lease. Two claimers over the same members are safe: the write is
// conditional on the member's resourceVersion, so a member goes to one of them.
// Activity the API sees (exec, files, terminals, the routers' reports) is written to the
// sandboxes for the operator's idle clock, which is in another process (activity-recorder.ts).
import { SandboxTemplateType, SandboxType, SandboxWarmPoolType, type Sandbox, type SandboxTemplate, type SandboxWarmPool } from '../api/types.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { ObjectStore } from '../store/store.ts';
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { createActivityRecorder, type ActivityRecorder } from './activity-recorder.ts';
import { Claimer, POOL_BY_TEMPLATE_INDEX, poolTemplateIndexValues } from './claimer.ts';
import { Informer } from '../store/informer.ts';
import { holderOfId, NAME_INDEX, nameIndexValues } from './sandbox-controller.ts';

export interface ClaimFrontOptions {
  store: ObjectStore;
  log: Logger;
  metrics: Metrics;
  clock: Clock;
  /** This cluster's tag, for the ids of cold-started sandboxes. */
  clusterTag: string;
}

export interface ClaimFront {
  claimer: Claimer;
  /**
   * Touches seen by this process's API, written to the sandboxes they concern for the operator's
   * idle check (activity-recorder.ts).
   */
  activity: ActivityRecorder;
  close(): void;
}


export async function startClaimFront(opts: ClaimFrontOptions): Promise<ClaimFront> {
  const { store, clock, metrics, clusterTag } = opts;
  const log = opts.log.child({ component: 'claim-front' });
  const sandboxes = new Informer<Sandbox>({ store, type: SandboxType, clock, log });
  const templates = new Informer<SandboxTemplate>({ store, type: SandboxTemplateType, clock, log });
  const pools = new Informer<SandboxWarmPool>({ store, type: SandboxWarmPoolType, clock, log });
  pools.addIndex(POOL_BY_TEMPLATE_INDEX, poolTemplateIndexValues);
  // Sandbox ids are unique across namespaces; the API names sandboxes by id alone.
  sandboxes.addIndex(NAME_INDEX, nameIndexValues);
  const activity = createActivityRecorder({ store, sandbox: (id) => holderOfId(sandboxes, id), clock, log });
  // No activity for the claimer: the bind itself stamps the claim as the last activity (bindWarm).
  const claimer = new Claimer({ store, sandboxes, pools, templates, clock, metrics, clusterTag });
  sandboxes.onChange((key, current, previous) => claimer.observe(key, current, previous));
  const informers = [sandboxes, templates, pools];
  for (const informer of informers) informer.start();
  await Promise.all(informers.map((i) => i.synced()));
  log.info({ sandboxes: sandboxes.list().length, pools: pools.list().length }, 'claim caches synced');
  return {
    claimer,
    activity,
    close() {
      activity.close();
      claimer.close();
      for (const informer of informers) informer.close();
    },
  };
}
