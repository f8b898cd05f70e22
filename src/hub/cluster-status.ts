// Records what each connected cluster reports (acks, heartbeats, connects) in its Cluster
// object's status, so `asb cluster ls` and GET /v1/clusters show applied version, lag and health.
//
// Writes are batched: reports only change memory, and one flush at most every 500 ms writes each
// cluster whose recorded status changed. An ack per delta from 50 workers during a burst of key
// changes would otherwise be 50 store commits per change. A heartbeat that changes nothing but
// lastSeen is written only once lastSeen in the store is 30 s old, so an idle federation costs
// no writes beyond that refresh.
import type { ObjectStore } from '../store/store.ts';
import { CLUSTER_SCOPE } from '../store/store.ts';
import { isoNow, type Clock, type Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { ClusterType, type Cluster, type ClusterStatus } from '../api/hub-contract.ts';

const DEFAULT_FLUSH_MS = 500;
const LAST_SEEN_REFRESH_MS = 30_000;

export interface ClusterStatusOptions {
  store: ObjectStore;
  log: Logger;
  clock: Clock;
  /** The feed's version now: lag is this minus appliedVersion. */
  hubVersion: () => number;
  flushMs?: number;
}

export type StatusReport = Pick<ClusterStatus, 'connected' | 'appliedVersion' | 'warm' | 'healthy'>;

export class ClusterStatusWriter {
  readonly #opts: ClusterStatusOptions;
  readonly #flushMs: number;
  /** cluster → what was reported since the last flush, merged. */
  #pending = new Map<string, { report: StatusReport; seenAt: number }>();
  #timer: Timer | undefined;
  #lastFlush = Number.NEGATIVE_INFINITY;
  #flushing: Promise<void> | undefined;
  #closed = false;

  constructor(opts: ClusterStatusOptions) {
    this.#opts = opts;
    this.#flushMs = opts.flushMs ?? DEFAULT_FLUSH_MS;
  }

  report(cluster: string, report: StatusReport): void {
    if (this.#closed) return;
    const prev = this.#pending.get(cluster);
    this.#pending.set(cluster, { report: { ...prev?.report, ...report }, seenAt: this.#opts.clock.now() });
    this.#schedule();
  }

  /** Writes what is pending now, then stops taking reports. Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#timer?.cancel();
    this.#timer = undefined;
    await this.#flushing;
    await this.#flush();
  }

  #schedule(): void {
    if (this.#timer !== undefined || this.#flushing !== undefined) return;
    const wait = Math.max(0, this.#lastFlush + this.#flushMs - this.#opts.clock.now());
    this.#timer = this.#opts.clock.after(wait, () => {
      this.#timer = undefined;
      this.#flushing = this.#flush().finally(() => {
        this.#flushing = undefined;
        if (this.#pending.size > 0 && !this.#closed) this.#schedule();
      });
    });
  }

  async #flush(): Promise<void> {
    this.#lastFlush = this.#opts.clock.now();
    const batch = [...this.#pending];
    this.#pending.clear();
    await Promise.all(batch.map(([name, p]) => this.#write(name, p.report, p.seenAt)));
  }

  async #write(name: string, report: StatusReport, seenAt: number): Promise<void> {
    const { store, log, clock } = this.#opts;
    try {
      const current = await store.tryGet<Cluster>(ClusterType, CLUSTER_SCOPE, name);
      if (current === undefined) return;
      const prev = current.status ?? {};
      const next: ClusterStatus = { ...prev, ...report };
      if (next.appliedVersion !== undefined) next.lag = Math.max(0, this.#opts.hubVersion() - next.appliedVersion);
      const lastSeen = prev.lastSeen === undefined ? Number.NEGATIVE_INFINITY : Date.parse(prev.lastSeen);
      const changed = JSON.stringify({ ...prev, lastSeen: undefined }) !== JSON.stringify({ ...next, lastSeen: undefined });
      if (!changed && seenAt - lastSeen < LAST_SEEN_REFRESH_MS) return;
      next.lastSeen = new Date(seenAt).toISOString();
      // No resourceVersion: status is ours alone, so an unconditional write cannot lose anything.
      const { resourceVersion: _rv, ...metadata } = current.metadata;
      await store.updateStatus<Cluster>(ClusterType, { ...current, metadata, status: next });
    } catch (err) {
      log.warn({ err, cluster: name, at: isoNow(clock) }, 'could not record cluster status');
    }
  }
}
