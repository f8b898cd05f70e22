// Tells each worker which of its sandboxes saw data-plane traffic, so idle hibernation does not
// stop a sandbox in use. Requests mark their sandbox; open long-lived requests (WebSocket,
// streaming: the ext_proc stream stays open while they do) keep marking it every flush. One
// POST /v1/activity per worker per flush, each id at most once per flush (default every 5 s).
import type { Clock, Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { reportActivity, type WorkerEndpoint } from './worker-api.ts';

export interface ActivityOptions {
  workers: ReadonlyMap<string, WorkerEndpoint>;
  clock: Clock;
  log: Logger;
  /** Default 5 000 ms: an idle timeout is minutes, so 5 s of lag is noise; fewer calls matter more at 10k req/s. */
  flushMs?: number;
  /** Replaces the HTTP call (tests). */
  send?: (worker: WorkerEndpoint, ids: readonly string[]) => Promise<void>;
}

/** The worker accepts at most 10 000 ids per report (src/worker/routes-activity.ts). */
const MAX_IDS_PER_REPORT = 10_000;

export class ActivityReporter {
  readonly #opts: ActivityOptions;
  readonly #flushMs: number;
  readonly #send: (worker: WorkerEndpoint, ids: readonly string[]) => Promise<void>;
  /** cluster → ids touched since the last flush. */
  #touched = new Map<string, Set<string>>();
  /** `${cluster}\n${id}` → open long-lived requests. */
  readonly #open = new Map<string, number>();
  #timer: Timer | undefined;
  #closed = false;
  #inflight = new Set<Promise<void>>();

  constructor(opts: ActivityOptions) {
    this.#opts = opts;
    this.#flushMs = opts.flushMs ?? 5_000;
    this.#send = opts.send ?? reportActivity;
    this.#schedule();
  }

  touch(cluster: string, id: string): void {
    let set = this.#touched.get(cluster);
    if (set === undefined) {
      set = new Set();
      this.#touched.set(cluster, set);
    }
    set.add(id);
  }

  /** A long-lived request started; call the returned function once when it ends. */
  open(cluster: string, id: string): () => void {
    const key = `${cluster}\n${id}`;
    this.#open.set(key, (this.#open.get(key) ?? 0) + 1);
    this.touch(cluster, id);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const left = (this.#open.get(key) ?? 1) - 1;
      if (left <= 0) this.#open.delete(key);
      else this.#open.set(key, left);
      // Its last moment counts as activity too.
      this.touch(cluster, id);
    };
  }

  /** Sends what accumulated now (the timer calls this; tests may too). */
  async flush(): Promise<void> {
    for (const key of this.#open.keys()) {
      const nl = key.indexOf('\n');
      this.touch(key.slice(0, nl), key.slice(nl + 1));
    }
    const batch = this.#touched;
    this.#touched = new Map();
    const sends: Promise<void>[] = [];
    for (const [cluster, ids] of batch) {
      const worker = this.#opts.workers.get(cluster);
      if (worker === undefined || ids.size === 0) continue;
      const all = [...ids];
      for (let i = 0; i < all.length; i += MAX_IDS_PER_REPORT) sends.push(this.#track(worker, all.slice(i, i + MAX_IDS_PER_REPORT)));
    }
    await Promise.all(sends);
  }

  /** Stops the timer, sends what is left. Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#timer?.cancel();
    await this.flush();
    await Promise.all(this.#inflight);
  }

  #track(worker: WorkerEndpoint, ids: readonly string[]): Promise<void> {
    // A lost report only means a sandbox may hibernate 5 s early at worst if nothing else
    // touches it; it is logged and counted, not retried (the next flush carries open requests).
    const p = this.#send(worker, ids).catch((err: unknown) => {
      this.#opts.log.warn({ err, cluster: worker.cluster, ids: ids.length }, 'activity report failed');
    });
    this.#inflight.add(p);
    void p.finally(() => this.#inflight.delete(p));
    return p;
  }

  #schedule(): void {
    if (this.#closed) return;
    this.#timer = this.#opts.clock.after(this.#flushMs, () => {
      void this.flush().finally(() => this.#schedule());
    });
  }
}
