// Liveness, Prometheus metrics and the federation summary: the hub's version and, per cluster,
// whether it is connected, the hub version it has applied and how far behind it is.
import type { Cluster } from '../api/hub-contract.ts';
import { ClusterType } from '../api/hub-contract.ts';
import type { Route } from '../http/router.ts';
import { clusterView } from './clusters.ts';
import type { HubContext } from './hub-context.ts';

export interface HubStatusView {
  /** The hub's package version. */
  version: string;
  /** The version of the last change synced to workers (the store's version without a sync server). */
  hubVersion: number;
  clusters: {
    name: string;
    region: string;
    tag: string;
    drain: boolean;
    connected: boolean;
    healthy: boolean | undefined;
    appliedVersion: number | undefined;
    lag: number | undefined;
    lastSeen: string | undefined;
  }[];
}

export async function hubStatus(h: HubContext): Promise<HubStatusView> {
  const listed = await h.store.list<Cluster>(ClusterType);
  return {
    version: h.version,
    hubVersion: h.sync?.version() ?? Number(listed.resourceVersion),
    clusters: listed.items.map((cluster) => {
      const { spec, status } = clusterView(cluster, h.sync);
      return {
        name: cluster.metadata.name,
        region: spec.region,
        tag: spec.tag,
        drain: spec.drain === true,
        connected: status.connected === true,
        healthy: status.healthy,
        appliedVersion: status.appliedVersion,
        lag: status.lag,
        lastSeen: status.lastSeen,
      };
    }),
  };
}

export function hubSystemRoutes(h: HubContext): Route[] {
  return [
    { method: 'GET', pattern: '/healthz', auth: false, handler: () => Promise.resolve({ status: 200, json: { ok: true } }) },
    {
      method: 'GET',
      pattern: '/metrics',
      async handler() {
        const text = await h.registry.metrics();
        return { status: 200, bytes: Buffer.from(text, 'utf8'), contentType: h.registry.contentType };
      },
    },
    { method: 'GET', pattern: '/v1/status', handler: async () => ({ status: 200, json: await hubStatus(h) }) },
  ];
}
