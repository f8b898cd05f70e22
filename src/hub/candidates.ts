// What placement is given for each registered cluster: its spec from the registry, its health and
// template counts from the live sync view, minus the sandboxes placed there since its last
// heartbeat. Without that correction a burst of creates in the 2 s between heartbeats would all
// go to the cluster that reported the most warm sandboxes and drain its pool into cold starts
// while others still had warm ones.
import type { Cluster, PlacementCandidate } from '../api/hub-contract.ts';
import type { LiveCluster } from './live-clusters.ts';

/** Creates placed on each cluster since its last heartbeat, by `<namespace>/<template>`. */
export class PlacedSinceHeartbeat {
  readonly #placed = new Map<string, { heartbeatAt: number; counts: Map<string, number> }>();

  /** One sandbox of `template` was created on `cluster`, whose heartbeat in effect is from `heartbeatAt`. */
  record(cluster: string, heartbeatAt: number, template: string): void {
    let entry = this.#placed.get(cluster);
    if (entry?.heartbeatAt !== heartbeatAt) {
      entry = { heartbeatAt, counts: new Map() };
      this.#placed.set(cluster, entry);
    }
    entry.counts.set(template, (entry.counts.get(template) ?? 0) + 1);
  }

  /** The heartbeat's counts minus what was placed since it; the heartbeat's own object when nothing was. */
  corrected(cluster: string, live: LiveCluster): Readonly<Record<string, number>> {
    const entry = this.#placed.get(cluster);
    if (entry === undefined) return live.templates;
    if (entry.heartbeatAt !== live.heartbeatAt) {
      // A newer heartbeat counted what was claimed before it was sent.
      this.#placed.delete(cluster);
      return live.templates;
    }
    const out = { ...live.templates };
    for (const [template, n] of entry.counts) {
      const reported = out[template];
      if (reported !== undefined) out[template] = Math.max(0, reported - n);
    }
    return out;
  }
}

export interface Candidates {
  candidates: PlacementCandidate[];
  /** Registered clusters that cannot be used at all, with why (no apiUrl to send a create to). */
  unusable: { cluster: string; reason: string }[];
}

/**
 * The asked-for template as the hub holds it: a cluster that has acknowledged the hub version that
 * wrote it holds it too, even before a heartbeat lists it (a template applied at the hub and
 * used at once). `version` is its resourceVersion; `applied` each connected cluster's acked version.
 */
export interface HubTemplate {
  key: string;
  version: number;
  applied: ReadonlyMap<string, number>;
}

export function candidatesFor(clusters: readonly Cluster[], live: ReadonlyMap<string, LiveCluster>, placed: PlacedSinceHeartbeat, hubTemplate?: HubTemplate): Candidates {
  const candidates: PlacementCandidate[] = [];
  const unusable: Candidates['unusable'] = [];
  for (const c of clusters) {
    const name = c.metadata.name;
    if (c.spec.apiUrl === undefined) {
      unusable.push({ cluster: name, reason: 'no apiUrl registered (set it with PUT /v1/clusters/{name})' });
      continue;
    }
    const now = live.get(name);
    let templates = now === undefined ? {} : placed.corrected(name, now);
    if (hubTemplate !== undefined && templates[hubTemplate.key] === undefined && (hubTemplate.applied.get(name) ?? 0) >= hubTemplate.version) {
      templates = { ...templates, [hubTemplate.key]: 0 };
    }
    candidates.push({ name, region: c.spec.region, drain: c.spec.drain === true, healthy: now?.healthy === true, templates });
  }
  return { candidates, unusable };
}
