// Holds requests for sandboxes that are not running yet. A hibernated sandbox gets exactly one
// resume call however many requests arrive for it (they coalesce on one in-flight wake); every
// held request waits until the route feed shows the sandbox running with a pod IP and then until
// the requested port accepts connections (port-wait.ts: running is not listening), or is refused
// with 503 when the wake fails or the hold limit passes. Ids the table lacks are
// looked up at their worker once (coalesced too) before a 404, which covers feed lag for a
// sandbox created a moment ago; a sandbox the table shows paused without resume on traffic is
// asked about the same way, which covers feed lag for one a connect resumed a moment ago. New
// lookups are limited per client and in total (lookup-limiter.ts); refuseLookup says when one
// may not start.
import { AsbError } from '../errors.ts';
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import type { RouteEntry } from './contract.ts';
import { LookupLimiter, type LookupRefusal } from './lookup-limiter.ts';
import { PortWaiter } from './port-wait.ts';
import type { RouteTable } from './route-table.ts';
import { resumeSandbox, sandboxPhase, type WorkerEndpoint } from './worker-api.ts';

/** The request that caused a wake (host and path), told to the worker for the lifecycle event. */
export interface WakeCause {
  host: string;
  path: string;
}

export interface WakerOptions {
  table: RouteTable;
  workers: ReadonlyMap<string, WorkerEndpoint>;
  clock: Clock;
  log: Logger;
  /** Longest a request is held for a wake. Default 25 s: below Envoy's route/message deadlines (30 s) so the client gets our 503, not Envoy's 504. */
  holdLimitMs?: number;
  /** Longest a request waits for the feed to deliver an id its worker says exists. Default 2 s. */
  missWaitMs?: number;
  /** Called once per resume call (metrics, tests). */
  onWake?: (id: string, result: 'ok' | 'failed') => void;
  /** Limits on lookups of ids the table lacks. Default: DEFAULT_LOOKUP_LIMITS on this clock. */
  limiter?: LookupLimiter;
  /** Called once per worker lookup, with its outcome, and once per refused one (metrics). */
  onLookup?: (result: LookupResult) => void;
  /** Waits for a woken pod's port to accept connections. Default: real TCP connects on this clock. */
  portWaiter?: PortWaiter;
}

export type LookupResult = 'found' | 'missing' | 'failed' | LookupRefusal['reason'];

export const DEFAULT_HOLD_LIMIT_MS = 25_000;

/** Worker phases (views.ts) of a sandbox that a connect has resumed: it runs, or is on its way. */
const RESUMED_PHASES: ReadonlySet<string> = new Set(['Pending', 'Running']);

export class Waker {
  readonly #opts: WakerOptions;
  readonly #holdLimitMs: number;
  readonly #missWaitMs: number;
  /** Sandbox id → its wake, kept until the feed shows the sandbox leave `hibernated`. */
  readonly #wakes = new Map<string, Promise<void>>();
  /** Id → its lookup at the worker (the phase it answers, undefined if missing), while in flight: concurrent requests for one id share it. */
  readonly #lookups = new Map<string, Promise<string | undefined>>();
  readonly #limiter: LookupLimiter;
  readonly #ports: PortWaiter;

  constructor(opts: WakerOptions) {
    this.#opts = opts;
    this.#ports = opts.portWaiter ?? new PortWaiter({ clock: opts.clock });
    this.#limiter = opts.limiter ?? new LookupLimiter({ clock: opts.clock });
    this.#holdLimitMs = opts.holdLimitMs ?? DEFAULT_HOLD_LIMIT_MS;
    this.#missWaitMs = opts.missWaitMs ?? 2_000;
  }

  get holdLimitMs(): number {
    return this.#holdLimitMs;
  }

  /** Sandboxes with a wake in flight. */
  get waking(): number {
    return this.#wakes.size;
  }

  /**
   * Resolves with the entry once it is running with a pod IP. Rejects with AsbError
   * Unavailable (wake failed, hold limit, sandbox failed) or NotFound (deleted meanwhile), or
   * with the signal's reason when the request goes away first.
   */
  async holdUntilRunning(entry: RouteEntry, wake: boolean, signal: AbortSignal, cause?: WakeCause): Promise<RouteEntry> {
    const wakeCall = wake ? this.#wake(entry, cause) : undefined;
    return this.#waitFor(entry.id, this.#holdLimitMs, signal, wakeCall, (e) => {
      if (e === undefined) throw new AsbError('NotFound', `sandbox ${entry.id} was deleted while waking`);
      if (e.state === 'failed' || e.state === 'expired') throw new AsbError('Unavailable', `sandbox ${entry.id} is ${e.state}`);
      return e.state === 'running' && e.podIp !== undefined;
    }, `sandbox ${entry.id} did not become ready within ${this.#holdLimitMs} ms`);
  }

  /**
   * After a hold: resolves once `pod` accepts a TCP connection, so the released request reaches a
   * listening server. Rejects with AsbError Unavailable after `limitMs` (what is left of the hold
   * limit), or with the signal's reason when the request goes away first.
   */
  untilListening(id: string, pod: { host: string; port: number }, limitMs: number, signal: AbortSignal): Promise<void> {
    return this.#ports.untilListening(pod.host, pod.port, limitMs, signal, `sandbox ${id} is running`);
  }

  /**
   * Before lookup(): why `client` may not make a new lookup of `id` now, or undefined (one of its
   * tokens spent). Joining a lookup of `id` already in flight is always allowed and free. Call
   * lookup() right after, in the same tick, so the in-flight count it checked still holds.
   */
  refuseLookup(id: string, client: string): LookupRefusal | undefined {
    if (this.#lookups.has(id)) return undefined;
    const refusal = this.#limiter.admit(client, this.#lookups.size);
    if (refusal !== undefined) this.#opts.onLookup?.(refusal.reason);
    return refusal;
  }

  /** For an id the table lacks: resolves with its entry once the feed delivers it, or rejects NotFound. */
  async lookup(id: string, cluster: string, signal: AbortSignal): Promise<RouteEntry> {
    const asked = this.#ask(id, cluster).then((phase) => {
      if (phase === undefined) {
        this.#opts.table.rememberMissing(id);
        throw new AsbError('NotFound', `sandbox ${id} not found`);
      }
    });
    // The watch is registered before the answer comes, so an upsert landing meanwhile is not missed.
    return this.#waitFor(id, this.#missWaitMs, signal, asked, (e) => e !== undefined, `sandbox ${id} exists but its route has not arrived yet`);
  }

  /**
   * For a sandbox the table shows paused without resume on traffic: E2B's connect resumes it and
   * returns once its worker says running, and the client's next request can come before the feed
   * says so. Resolves with its entry once the feed shows it running, if its worker says it is no
   * longer paused; rejects NotFound if the worker says it still is (or is gone).
   */
  async confirmPaused(entry: RouteEntry, signal: AbortSignal): Promise<RouteEntry> {
    const asked = this.#ask(entry.id, entry.cluster).then((phase) => {
      if (phase === undefined || !RESUMED_PHASES.has(phase)) throw new AsbError('NotFound', `sandbox ${entry.id} is ${phase === undefined ? 'gone' : 'not resumed'}`);
    });
    return this.#waitFor(entry.id, this.#holdLimitMs, signal, asked, (e) => e?.state === 'running' && e.podIp !== undefined, `sandbox ${entry.id} was resumed but did not become ready within ${this.#holdLimitMs} ms`);
  }

  /** The sandbox's phase at its worker, one call however many requests ask at once. */
  #ask(id: string, cluster: string): Promise<string | undefined> {
    const worker = this.#opts.workers.get(cluster);
    if (worker === undefined) return Promise.resolve(undefined);
    let pending = this.#lookups.get(id);
    if (pending === undefined) {
      const onLookup = this.#opts.onLookup;
      pending = sandboxPhase(worker, id).finally(() => this.#lookups.delete(id));
      if (onLookup !== undefined) void pending.then((phase) => onLookup(phase === undefined ? 'missing' : 'found'), () => onLookup('failed'));
      this.#lookups.set(id, pending);
    }
    return pending;
  }

  #wake(entry: RouteEntry, cause: WakeCause | undefined): Promise<void> {
    const known = this.#wakes.get(entry.id);
    if (known !== undefined) return known;
    const worker = this.#opts.workers.get(entry.cluster);
    const log = this.#opts.log;
    const call = worker === undefined ? Promise.reject(new AsbError('Unavailable', `no worker for cluster ${entry.cluster}`)) : resumeSandbox(worker, entry.id, cause);
    const wake = call.then(
      () => {
        this.#opts.onWake?.(entry.id, 'ok');
        log.info({ sandboxId: entry.id }, 'wake requested');
      },
      (err: unknown) => {
        this.#opts.onWake?.(entry.id, 'failed');
        log.warn({ sandboxId: entry.id, err }, 'wake failed');
        this.#wakes.delete(entry.id);
        throw err;
      },
    );
    this.#wakes.set(entry.id, wake);
    // Forget the wake once the feed shows the sandbox out of `hibernated`, so a later
    // hibernation gets a fresh wake; the hold limit bounds it if the feed never does.
    const forget = (): void => {
      unwatch();
      timer.cancel();
      if (this.#wakes.get(entry.id) === wake) this.#wakes.delete(entry.id);
    };
    const unwatch = this.#opts.table.watch(entry.id, (e) => {
      if (e?.state !== 'hibernated') forget();
    });
    const timer = this.#opts.clock.after(this.#holdLimitMs, forget);
    // Waiters observe the failure; this handler only keeps it from being unhandled when none are left.
    wake.catch(() => undefined);
    return wake;
  }

  #waitFor(id: string, limitMs: number, signal: AbortSignal, gate: Promise<void> | undefined, ready: (e: RouteEntry | undefined) => boolean, timeoutMessage: string): Promise<RouteEntry> {
    const { table, clock } = this.#opts;
    return new Promise<RouteEntry>((resolve, reject) => {
      let settled = false;
      const finish = (err: unknown, entry?: RouteEntry): void => {
        if (settled) return;
        settled = true;
        unwatch();
        timer.cancel();
        signal.removeEventListener('abort', onAbort);
        if (entry !== undefined) resolve(entry);
        else reject(err instanceof Error ? err : new AsbError('Internal', String(err)));
      };
      const check = (e: RouteEntry | undefined): void => {
        try {
          if (ready(e) && e !== undefined) finish(undefined, e);
        } catch (err) {
          finish(err);
        }
      };
      const onAbort = (): void => finish(signal.reason);
      const unwatch = table.watch(id, check);
      const timer = clock.after(limitMs, () => finish(new AsbError('Unavailable', timeoutMessage)));
      signal.addEventListener('abort', onAbort, { once: true });
      if (signal.aborted) {
        onAbort();
        return;
      }
      gate?.catch((err: unknown) => finish(err));
      const current = table.get(id);
      if (current !== undefined) check(current);
    });
  }
}
