// Federation contract: what the hub (the wsproxy of the design) keeps, and the sync protocol
// between the hub and each worker cluster. The hub (src/hub/) and the worker's sync agent
// (src/worker/sync/sync-agent.ts) both follow this file.
//
// The hub is the source of truth for API keys (hashed), sandbox templates and the cluster
// registry. Each worker dials the hub (outbound only, so clusters behind NAT work) and keeps a
// copy of what it needs in its own store, so it goes on serving when the hub is away.
import type { KubeObject, ObjectMeta, ResourceType } from '../api/meta.ts';
import { ASB_GROUP } from '../api/types.ts';

/** A worker cluster as the hub knows it (cluster-scoped, `asb.dev/v1alpha1`, kind Cluster). */
export interface ClusterSpec {
  region: string;
  /** Where other edges send this cluster's sandbox traffic (its Envoy ingress), host:port. */
  ingressAddress: string;
  /** Base URL of its worker API, for the hub's own calls (placement, terminals). */
  apiUrl?: string;
  labels?: Record<string, string>;
  /** Drained clusters keep their sandboxes but get no new ones. */
  drain?: boolean;
  /** 4 chars [a-z0-9]: the prefix of this cluster's sandbox ids (src/api/ids.ts). */
  tag: string;
  /** hex sha256 of the cluster's sync credential; the credential itself is shown once. */
  credentialHash: string;
}

export interface ClusterStatus {
  connected?: boolean;
  /** Last hub version this cluster acknowledged as applied. */
  appliedVersion?: number;
  /** Hub version minus appliedVersion when last seen. */
  lag?: number;
  lastSeen?: string;
  /** Reported by the worker in heartbeats, for placement. */
  warm?: Record<string, number>;
  healthy?: boolean;
}

export interface Cluster extends KubeObject {
  metadata: ObjectMeta;
  spec: ClusterSpec;
  status?: ClusterStatus;
}

export const ClusterType: ResourceType = { group: ASB_GROUP, version: 'v1alpha1', kind: 'Cluster', plural: 'clusters', namespaced: false };

/** Kinds the hub syncs to workers. Cluster objects are synced too, without credential hashes. */
export type SyncKind = 'ApiKey' | 'SandboxTemplate' | 'Cluster';

export interface SyncItem {
  kind: SyncKind;
  namespace: string;
  name: string;
  /**
   * The object as the hub holds it (Cluster: credentialHash and status removed — the hub rewrites
   * status on every ack, and syncing that would make acks cause deltas forever). Absent when deleted.
   */
  object?: KubeObject;
}

/**
 * Sync over WebSocket at `GET <hub>/v1/sync`, `Authorization: Bearer <cluster credential>`.
 * Versions are the hub store's resourceVersions (numbers), strictly increasing.
 *
 * worker → hub
 *   hello      first frame: which cluster, and the last hub version it applied (0: none)
 *   ack        after applying (and persisting) everything up to `version`
 *   heartbeat  every few seconds: liveness and what placement needs; with a seq, also at once
 *              after a local template or pool write, and the hub answers with that seq
 *   built      the SandboxTemplates this cluster's template builds made (names starting with its
 *              tag), all of them, when it connects and after each change: the hub holds them and
 *              syncs them to every cluster (src/hub/built-templates.ts)
 * hub → worker
 *   snapshot   everything, at `version` — when the worker's lastVersion is 0 or older than the
 *              hub retains; the worker replaces its synced copy (deleting what is absent)
 *   delta      one change after the worker's version, in version order, none skipped
 *   heartbeat  liveness; with a seq, the answer to the worker heartbeat of that seq
 * Either side closes a connection that has been silent for 3 heartbeat intervals.
 */
export type WorkerToHub =
  | { type: 'hello'; cluster: string; lastVersion: number }
  | { type: 'ack'; version: number }
  | { type: 'built'; items: KubeObject[] }
  | {
      type: 'heartbeat';
      /** `<namespace>/<pool>` → ready members of that warm pool. */
      warm: Record<string, number>;
      healthy: boolean;
      /**
       * `<namespace>/<template>` → ready warm sandboxes of that template (0 when it has no warm
       * pool or an empty one). Every template the worker holds is listed; one absent here cannot
       * be created there. Optional only so an older worker's heartbeat still parses.
       */
      templates?: Record<string, number>;
      /**
       * `<namespace>/<pool>` → the pool's ready and desired members and its template's name, for
       * the console. Optional so an older worker's heartbeat still parses.
       */
      pools?: Record<string, PoolReport>;
      /**
       * Asks the hub to answer with a heartbeat carrying the same seq once placement reads this
       * one: a worker that has just written a template or pool waits for it before acknowledging
       * the write, so a create that follows at the hub finds it (read-your-writes).
       */
      seq?: number;
    };

/** One warm pool as a worker reports it in heartbeats. */
export interface PoolReport {
  ready: number;
  desired: number;
  template: string;
}

export type HubToWorker =
  | { type: 'snapshot'; version: number; items: SyncItem[] }
  | { type: 'delta'; version: number; item: SyncItem }
  | { type: 'heartbeat'; version: number; /** The worker heartbeat's seq this answers, if it asked. */ seq?: number };

/** Heartbeat interval; a peer silent for 3 intervals is dead (so within ~6 s). */
export const HEARTBEAT_MS = 2000;

/** What placement knows of one cluster (from the registry and the cluster's live sync session). */
export interface PlacementCandidate {
  name: string;
  region: string;
  drain: boolean;
  /** Connected now and its last heartbeat said healthy. */
  healthy: boolean;
  /** As the heartbeat's `templates` (minus the creates placed there since): absent = not available. */
  templates: Record<string, number>;
}

export interface PlacementRequest {
  namespace: string;
  template: string;
  /** Preferred region: its clusters come first; the others are the failover. */
  region?: string;
  /** A named cluster: only it is tried (no failover). */
  cluster?: string;
  /**
   * `template` is a snapshot's id (E2B's create from a snapshot): a new sandbox can start only where
   * the snapshot is, so `cluster` names the cluster whose tag starts the id and no template is looked for.
   */
  fromSnapshot?: true;
}

export interface PlacementResult {
  /** Clusters to try, best first; the next one is the failover when one refuses or is unreachable. */
  order: string[];
  /** Clusters left out, each with why (`drained`, `down`, `no template default/base`, `not the named cluster`). */
  skipped: { cluster: string; reason: string }[];
}

/** The annotations a worker's sync writes on what it took from the hub: that it came from there, and at which version. */
export const SYNC_ANNOTATION = { from: 'asb.dev/synced-from', version: 'asb.dev/synced-version' } as const;
