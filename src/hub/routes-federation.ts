// GET /v1/federation: the federation at a glance, for any valid API key (the web console's
// cluster and pool panels). Each registered cluster with its region, health, drain, how far its
// copy of the hub's objects lags, and its warm pools (ready of desired) from its last heartbeat.
// No addresses, tags or credentials: what a team may know, not how to reach a cluster.
//
// health: healthy (connected, last heartbeat healthy) | unhealthy (connected, heartbeat said not)
// | down (not connected to the hub now).
import { principalOf } from '../worker/access.ts';
import type { Reply, RequestContext, Route } from '../http/router.ts';
import { ClusterType, type Cluster, type PoolReport } from '../api/hub-contract.ts';
import type { HubContext } from './hub-context.ts';

export type ClusterHealth = 'healthy' | 'unhealthy' | 'down';

export interface FederationClusterView {
  name: string;
  region: string;
  health: ClusterHealth;
  drained: boolean;
  /** The last hub version this cluster applied (0: none known). */
  appliedVersion: number;
  /** Hub version minus appliedVersion. */
  lag: number;
  /** `<namespace>/<pool>` → ready, desired, template; empty while down. */
  pools: Record<string, PoolReport>;
}

export interface FederationView {
  /** The hub's current version of what it syncs. */
  version: number;
  clusters: FederationClusterView[];
}

export function federationRoutes(h: HubContext): Route[] {
  async function view(ctx: RequestContext): Promise<Reply> {
    principalOf(ctx);
    const clusters = (await h.store.list<Cluster>(ClusterType)).items.filter((c) => c.metadata.deletionTimestamp === undefined);
    const version = h.sync?.version() ?? 0;
    const live = h.sync?.live();
    const applied = new Map((h.sync?.connections() ?? []).map((c) => [c.cluster, c.appliedVersion]));
    const out: FederationClusterView[] = clusters
      .map((c) => {
        const name = c.metadata.name;
        const now = live?.get(name);
        const appliedVersion = applied.get(name) ?? c.status?.appliedVersion ?? 0;
        const health: ClusterHealth = now === undefined ? 'down' : now.healthy ? 'healthy' : 'unhealthy';
        return { name, region: c.spec.region, health, drained: c.spec.drain === true, appliedVersion, lag: Math.max(0, version - appliedVersion), pools: { ...(now?.pools ?? {}) } };
      })
      .sort((a, b) => a.name.localeCompare(b.name));
    const json: FederationView = { version, clusters: out };
    return { status: 200, json };
  }
  return [{ method: 'GET', pattern: '/v1/federation', handler: view }];
}
