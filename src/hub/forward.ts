// What the hub sends on to a worker cluster's API on a caller's behalf, and how a worker's answer
// comes back: shared by placement (src/hub/create-placement.ts) and the list fan-out
// (src/hub/list-fanout.ts), for our /v1 API and E2B's alike. The caller's own key travels, so
// each worker checks it and scopes the answer to the caller's team itself.
import type { ObjectStore } from '../store/store.ts';
import type { Reply } from '../http/router.ts';
import { ClusterType, type Cluster } from '../api/hub-contract.ts';
import type { HubContext } from './hub-context.ts';
import { NO_LIVE_CLUSTERS, type LiveCluster } from './live-clusters.ts';
import type { WorkerAnswer } from './worker-call.ts';

/** Deadlines of the hub's calls to workers; every field optional, defaults below. */
export interface PlacementOptions {
  /** To connect to a worker; a cluster that does not accept within it is skipped. Default 2 s. */
  connectTimeoutMs?: number;
  /** For a create's whole answer; a worker waits up to 60 s for Ready by default. Default 90 s. */
  createTimeoutMs?: number;
  /** For one cluster's page of a list; a cluster slower than this is listed as unreachable. Default 10 s. */
  listTimeoutMs?: number;
}

export type CallLimits = Required<PlacementOptions>;

export function callLimits(opts: PlacementOptions): CallLimits {
  return { connectTimeoutMs: 2_000, createTimeoutMs: 90_000, listTimeoutMs: 10_000, ...opts };
}

/** A worker's answer to a create is one view (~1 KB); to a list, up to 1,000 of them. */
export const MAX_ANSWER_BYTES = 32 * 1024 * 1024;

/**
 * Sent on with the caller's key (forwardedHeaders): the scheme the caller used at the edge (Envoy's
 * x-forwarded-proto), from which an E2B create tells the SDK the edge's HTTPS port rather than
 * its plain one.
 */
export const EDGE_HEADERS: readonly string[] = ['x-forwarded-proto'];

/** What a worker said in a failed answer: a problem's `detail`, an E2B error's `message`, else the text. */
export function detailOf(answer: WorkerAnswer): string {
  try {
    const parsed = JSON.parse(answer.body.toString('utf8')) as { detail?: unknown; message?: unknown };
    if (typeof parsed.detail === 'string') return parsed.detail;
    if (typeof parsed.message === 'string') return parsed.message;
  } catch {
    // neither a problem nor an E2B error
  }
  return answer.body.toString('utf8').slice(0, 200);
}

export function workerUrl(apiUrl: string, path: string, query?: URLSearchParams): URL {
  const url = new URL(`${apiUrl.replace(/\/$/, '')}${path}`);
  if (query !== undefined) url.search = query.toString();
  return url;
}

/** The worker's answer as the caller's, with `x-asb-cluster` naming the cluster that gave it. */
export function passOn(answer: WorkerAnswer, cluster: string): Reply {
  const contentType = answer.headers['content-type'] ?? 'application/json';
  return { status: answer.status, bytes: answer.body, contentType, headers: { 'x-asb-cluster': cluster } };
}

/** Registered clusters, less those being deleted. */
export async function registeredClusters(store: ObjectStore): Promise<Cluster[]> {
  return (await store.list<Cluster>(ClusterType)).items.filter((c) => c.metadata.deletionTimestamp === undefined);
}

/** Connected clusters with their last heartbeat; none while the sync server is not serving. */
export function liveClusters(h: HubContext): ReadonlyMap<string, LiveCluster> {
  return h.sync?.live() ?? NO_LIVE_CLUSTERS;
}
