// A controller in the controller-runtime mould: a keyed work queue feeding `reconcile(key)`.
// - Level-based: the queue carries keys, never events; a key enqueued N times before a worker
//   picks it up is reconciled once.
// - The same key never runs concurrently: a key enqueued while it runs is marked dirty and
//   runs again once the current reconcile ends.
// - Errors requeue with per-key exponential backoff (5 ms doubling to a 10 s cap); an AsbError
//   with code Invalid is terminal: counted and logged, not retried (retrying cannot fix input).
// - `{ requeueAfterMs }` schedules a recheck (expiry, idle timeout, not-ready replacement).
// - Background keys (`background(key)`: a deleted sandbox's teardown) wait in their own queue:
//   a key of the other queue always runs first, and background keys never take more than
//   `backgroundWorkers` workers, so the rest stay free. In one FIFO, a cold create enqueued after
//   a bulk delete of 320 sandboxes waited 3.7 s of its 4.1 s for the teardowns ahead of it, each
//   a runtime.remove() (a stop, unmounts, runc delete), and `make bench`'s, after ~700, 5-7 s.
import { randomString } from '../api/ids.ts';
import { isAsbError } from '../errors.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { Clock, Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';

export interface ReconcileResult {
  requeueAfterMs?: number;
}

export interface ReconcileContext {
  log: Logger;
  reconcileId: string;
}

export type Reconciler = (key: string, ctx: ReconcileContext) => Promise<ReconcileResult | undefined>;

export interface ControllerOptions {
  name: string;
  reconcile: Reconciler;
  clock: Clock;
  log: Logger;
  metrics: Metrics;
  /** Reconciles running at once (different keys). Default 16. */
  workers?: number;
  /** Whether the key's work is background work (a teardown nobody waits on); read at each enqueue. */
  background?: (key: string) => boolean;
  /** Background reconciles running at once, at most; default a quarter of workers (at least 1). */
  backgroundWorkers?: number;
  baseBackoffMs?: number;
  maxBackoffMs?: number;
}

const DEFAULT_WORKERS = 16;
const BASE_BACKOFF_MS = 5;
const MAX_BACKOFF_MS = 10_000;
// Timers cannot wait longer than 2^31-1 ms (~24.8 days; longer fires after 1 ms). A recheck
// that far out (a shutdownTime in a year) is clamped to a daily level check instead.
const MAX_REQUEUE_MS = 86_400_000;

export class Controller {
  readonly name: string;
  #reconcile: Reconciler;
  #clock: Clock;
  #log: Logger;
  #metrics: Metrics;
  #workers: number;
  #baseBackoffMs: number;
  #maxBackoffMs: number;
  /** Keys waiting for a worker, in arrival order (a Set keeps order and dedups). */
  #pending = new Set<string>();
  /** Background keys waiting: they run only when #pending is empty. */
  #pendingBackground = new Set<string>();
  #running = new Set<string>();
  #runningBackground = new Set<string>();
  #background: ((key: string) => boolean) | undefined;
  #backgroundWorkers: number;
  /** Keys enqueued while they were running: they run again when the current run ends. */
  #dirty = new Set<string>();
  #failures = new Map<string, number>();
  #timers = new Map<string, { at: number; timer: Timer }>();
  #idle: (() => void)[] = [];
  #closed = false;
  /**
   * Reconcile ids are this random prefix plus a counter: unique per process and cheap. A fresh
   * randomString per reconcile cost 7 ms of a 5×64-claim probe's worker CPU (randomBytes), and a
   * pino child logger per reconcile 4 ms; the child is now made only when a reconcile logs.
   */
  #idPrefix = randomString(4);
  #pumpScheduled = false;
  #runs = 0;

  constructor(opts: ControllerOptions) {
    this.name = opts.name;
    this.#reconcile = opts.reconcile;
    this.#clock = opts.clock;
    this.#log = opts.log.child({ controller: opts.name });
    this.#metrics = opts.metrics;
    this.#workers = opts.workers ?? DEFAULT_WORKERS;
    this.#background = opts.background;
    this.#backgroundWorkers = Math.max(1, Math.min(this.#workers, opts.backgroundWorkers ?? Math.floor(this.#workers / 4)));
    this.#baseBackoffMs = opts.baseBackoffMs ?? BASE_BACKOFF_MS;
    this.#maxBackoffMs = opts.maxBackoffMs ?? MAX_BACKOFF_MS;
  }

  enqueue(key: string): void {
    if (this.#closed) return;
    if (this.#running.has(key)) {
      this.#dirty.add(key);
      return;
    }
    this.#queue(key);
    this.#pump();
  }

  /** Files a key in its queue, moving it when its kind changed (a name deleted and created again). */
  #queue(key: string): void {
    const background = this.#background?.(key) === true;
    (background ? this.#pending : this.#pendingBackground).delete(key);
    (background ? this.#pendingBackground : this.#pending).add(key);
  }

  /**
   * Like enqueue, but the reconcile starts from a setImmediate. For handlers inside the store's
   * watch delivery: a burst of 64 claims delivers 64 events before any claim's response is
   * written, and started inline, 64 sandbox reconciles ran ahead of every response.
   */
  enqueueSoon(key: string): void {
    if (this.#closed) return;
    if (this.#running.has(key)) {
      this.#dirty.add(key);
      return;
    }
    this.#queue(key);
    this.#schedulePump();
  }

  #schedulePump(): void {
    if (this.#pumpScheduled) return;
    this.#pumpScheduled = true;
    setImmediate(() => {
      this.#pumpScheduled = false;
      if (!this.#closed) this.#pump();
    });
  }

  /** Enqueues the key after ms; an earlier pending recheck for the same key wins. */
  enqueueAfter(key: string, ms: number): void {
    if (this.#closed) return;
    if (ms <= 0) {
      this.enqueue(key);
      return;
    }
    ms = Math.min(ms, MAX_REQUEUE_MS);
    const at = this.#clock.now() + ms;
    const existing = this.#timers.get(key);
    if (existing !== undefined) {
      if (existing.at <= at) return;
      existing.timer.cancel();
    }
    const timer = this.#clock.after(ms, () => {
      this.#timers.delete(key);
      this.enqueue(key);
    });
    this.#timers.set(key, { at, timer });
  }

  /** Keys queued or running: tests and health checks use it to tell a settled controller. */
  get depth(): number {
    return this.#pending.size + this.#pendingBackground.size + this.#running.size;
  }

  /** Stops taking keys, cancels rechecks and waits (up to deadlineMs) for running reconciles. */
  async close(deadlineMs = 10_000): Promise<void> {
    if (!this.#closed) {
      this.#closed = true;
      this.#pending.clear();
      this.#pendingBackground.clear();
      this.#dirty.clear();
      for (const { timer } of this.#timers.values()) timer.cancel();
      this.#timers.clear();
    }
    if (this.#running.size === 0) return;
    await new Promise<void>((resolve) => {
      const timer = this.#clock.after(deadlineMs, () => {
        this.#log.warn({ running: [...this.#running] }, 'reconciles still running at close deadline');
        resolve();
      });
      this.#idle.push(() => {
        timer.cancel();
        resolve();
      });
    });
  }

  #pump(): void {
    while (this.#running.size < this.#workers) {
      const key = this.#next();
      if (key === undefined) return;
      this.#running.add(key);
      void this.#run(key);
    }
  }

  /** The next key to run, taken off its queue: the other queue's first, else a background one while background workers are free. */
  #next(): string | undefined {
    for (const key of this.#pending) {
      this.#pending.delete(key);
      return key;
    }
    if (this.#runningBackground.size >= this.#backgroundWorkers) return undefined;
    for (const key of this.#pendingBackground) {
      this.#pendingBackground.delete(key);
      this.#runningBackground.add(key);
      return key;
    }
    return undefined;
  }

  async #run(key: string): Promise<void> {
    const reconcileId = `${this.#idPrefix}${(this.#runs++).toString(36)}`;
    let child: Logger | undefined;
    const parent = this.#log;
    const ctx: ReconcileContext = {
      reconcileId,
      get log(): Logger {
        child ??= parent.child({ reconcileId, key });
        return child;
      },
    };
    try {
      const result = await this.#reconcile(key, ctx);
      this.#failures.delete(key);
      const after = result?.requeueAfterMs;
      if (after !== undefined) {
        this.#metrics.reconcileTotal.inc({ controller: this.name, result: 'requeue' });
        this.enqueueAfter(key, after);
      } else {
        this.#metrics.reconcileTotal.inc({ controller: this.name, result: 'ok' });
      }
    } catch (err) {
      this.#metrics.reconcileTotal.inc({ controller: this.name, result: 'error' });
      if (isAsbError(err, 'Invalid')) {
        this.#failures.delete(key);
        ctx.log.warn({ err }, 'terminal reconcile error; not retried');
      } else {
        const failures = (this.#failures.get(key) ?? 0) + 1;
        this.#failures.set(key, failures);
        const delay = Math.min(this.#maxBackoffMs, this.#baseBackoffMs * 2 ** Math.min(failures - 1, 20));
        // Conflicts are expected when a cache lags a write; they are noise at info level.
        if (isAsbError(err, 'Conflict')) ctx.log.debug({ err, delay }, 'reconcile conflict; retrying');
        else ctx.log.warn({ err, delay, failures }, 'reconcile failed; retrying');
        this.enqueueAfter(key, delay);
      }
    } finally {
      this.#running.delete(key);
      this.#runningBackground.delete(key);
      if (this.#dirty.delete(key)) this.enqueue(key);
      this.#pump();
      if (this.#running.size === 0) for (const done of this.#idle.splice(0)) done();
    }
  }
}
