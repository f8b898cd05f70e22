// What every hub route handler may use. Built once by the admin API and frozen.
import type { Counter, Registry } from 'prom-client';
import type { ObjectStore } from '../store/store.ts';
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import type { LiveCluster } from './live-clusters.ts';

/** What the admin API reads from the sync server: live connections beat stored status. */
export interface SyncView {
  /** The version of the last change workers see. */
  version(): number;
  connections(): { cluster: string; appliedVersion: number }[];
  /** Connected clusters with their last heartbeat: what placement decides on. */
  live(): ReadonlyMap<string, LiveCluster>;
  /** Calls `listener` on each worker's ack with the version it applied; returns the unsubscribe. */
  onAck(listener: (cluster: string, version: number) => void): () => void;
}

export interface HubContext {
  readonly store: ObjectStore;
  readonly log: Logger;
  readonly clock: Clock;
  readonly registry: Registry;
  /** The package version, reported by GET /v1/status. */
  readonly version: string;
  /** Largest JSON request body accepted, in bytes. */
  readonly jsonBytes: number;
  /** The sync server, for live connection state; undefined when the hub runs without one. */
  readonly sync: SyncView | undefined;
  /** Namespace of templates written without one. */
  readonly defaultNamespace: string;
}

export interface HubMetrics {
  httpRequestsTotal: Counter<'route' | 'code'>;
}
