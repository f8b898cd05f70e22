// What the hub knows of each connected cluster right now, from its sync session: whether its last
// heartbeat said healthy, which templates it holds with how many ready warm sandboxes each, and
// when that heartbeat came. Placement reads it on every create, so it lives in memory only (the
// stored Cluster status is written in batches and may be seconds old); a cluster leaves it the
// moment its sync socket closes, so a worker killed with -9 is out of placement at once, not
// after 3 silent heartbeats.
//
// A cluster enters at its first heartbeat after hello (the worker sends one at once), so an
// entry always carries a report.
import type { PoolReport } from '../api/hub-contract.ts';

export interface LiveCluster {
  /** Its last heartbeat said healthy. */
  readonly healthy: boolean;
  /** `<namespace>/<template>` → ready warm sandboxes of it (0: held, no warm one). */
  readonly templates: Readonly<Record<string, number>>;
  /** When the hub received that heartbeat (clock ms). */
  readonly heartbeatAt: number;
  /** `<namespace>/<pool>` → ready/desired members and template (empty from an older worker). */
  readonly pools: Readonly<Record<string, PoolReport>>;
}

export class LiveClusters {
  readonly #entries = new Map<string, LiveCluster>();

  /** Records a heartbeat; each one replaces the entry, so a reader holding one sees it whole. */
  report(cluster: string, healthy: boolean, templates: Record<string, number>, at: number, pools: Record<string, PoolReport> = {}): void {
    this.#entries.set(cluster, Object.freeze({ healthy, templates: Object.freeze(templates), heartbeatAt: at, pools: Object.freeze(pools) }));
  }

  forget(cluster: string): void {
    this.#entries.delete(cluster);
  }

  view(): ReadonlyMap<string, LiveCluster> {
    return this.#entries;
  }
}

/** An empty view, for a hub whose sync server is not serving (starting or failed). */
export const NO_LIVE_CLUSTERS: ReadonlyMap<string, LiveCluster> = new Map();
