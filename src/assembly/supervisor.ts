// `make up` keeps its processes running as a kubelet keeps containers: a hub, worker, router or
// Envoy that exits when nobody asked is started again on the same ports and data, after a
// backoff that doubles with each crash (500 ms up to 10 s; a kubelet's 10 s to 5 min is tuned for
// image pulls, not a laptop). One that crashes 5 times within a minute is given up on, with a
// message saying so and where its log is, rather than restarted forever; the other processes
// keep serving meanwhile (other clusters, the edge's failover to them through the hub).
// Every decision is said on the console, so a user sees what happened without reading logs.
import type { Clock, Timer } from '../base/clock.ts';

/** One run of a supervised process. */
export interface Run {
  /** Resolves with the exit code or signal when the process ends, however it ends. */
  readonly exited: Promise<unknown>;
  /** Asks it to stop and resolves when it has (SIGTERM, then SIGKILL after a deadline). */
  stop(): Promise<void>;
  /** SIGKILL now; resolves when it has exited. */
  kill(): Promise<void>;
}

export interface SupervisorPolicy {
  /** First restart delay; doubled for each crash in the window. Default 500 ms. */
  baseMs?: number;
  /** Longest restart delay. Default 10 s. */
  maxMs?: number;
  /** Crashes within `windowMs` that make it give up. Default 5. */
  crashLimit?: number;
  /** Default 60 s. */
  windowMs?: number;
}

export interface SupervisorOptions extends SupervisorPolicy {
  clock: Clock;
  /** Where the supervisor says what it does (the `make up` console). */
  say: (line: string) => void;
}

/** A supervised process: the current run, and stop() that ends it for good. */
export interface Supervised<R extends Run> {
  readonly name: string;
  /** The run now (a new object after each restart). */
  readonly current: R;
  /** true once the supervisor gave up on it. */
  readonly failed: boolean;
  /** Stops it and every restart to come; idempotent. */
  stop(): Promise<void>;
  /** Kills it and every restart to come; idempotent. */
  kill(): Promise<void>;
}

/** The delay before restart number `crashes` (1 = the first): base doubling per crash, capped. */
export function restartDelay(crashes: number, baseMs: number, maxMs: number): number {
  return Math.min(maxMs, baseMs * 2 ** Math.max(0, crashes - 1));
}

/**
 * Supervises a process already started as `first`; `start` starts it again. `hint` is added to
 * every message about it (e.g. where its log is).
 */
export function supervise<R extends Run>(name: string, first: R, start: () => Promise<R>, opts: SupervisorOptions, hint = ''): Supervised<R> {
  const baseMs = opts.baseMs ?? 500;
  const maxMs = opts.maxMs ?? 10_000;
  const crashLimit = opts.crashLimit ?? 5;
  const windowMs = opts.windowMs ?? 60_000;
  const suffix = hint === '' ? '' : `; ${hint}`;
  let current = first;
  let ended = false;
  let failed = false;
  let timer: Timer | undefined;
  let restarting: Promise<void> | undefined;
  let crashes: number[] = [];

  const crashed = (why: string): void => {
    const now = opts.clock.now();
    crashes = [...crashes.filter((at) => now - at < windowMs), now];
    if (crashes.length >= crashLimit) {
      failed = true;
      opts.say(`${name} ${why}; it crashed ${crashes.length} times within ${windowMs / 1000} s, so it is not restarted again${suffix}. The rest keeps running; stop and start make up to try again.`);
      return;
    }
    const delay = restartDelay(crashes.length, baseMs, maxMs);
    opts.say(`${name} ${why}; restarting it in ${delay} ms${suffix}`);
    timer = opts.clock.after(delay, () => {
      timer = undefined;
      restarting = start().then(
        (next) => {
          if (ended) {
            // Stopped while it was starting: it must not outlive the stop.
            return next.stop();
          }
          current = next;
          opts.say(`${name} is running again`);
          watch(next);
          return undefined;
        },
        (err: unknown) => {
          if (!ended) crashed(`could not be started again (${err instanceof Error ? err.message : String(err)})`);
        },
      ).finally(() => (restarting = undefined));
    });
  };

  const watch = (run: R): void => {
    void run.exited.then((code) => {
      if (ended || run !== current) return;
      crashed(`exited unexpectedly (${String(code)})`);
    });
  };
  watch(first);

  const end = async (how: (run: R) => Promise<void>): Promise<void> => {
    ended = true;
    timer?.cancel();
    await restarting;
    await how(current);
  };
  let stopping: Promise<void> | undefined;
  let killing: Promise<void> | undefined;
  return {
    name,
    get current() {
      return current;
    },
    get failed() {
      return failed;
    },
    stop() {
      stopping ??= end((run) => run.stop());
      return stopping;
    },
    kill() {
      killing ??= end((run) => run.kill());
      return killing;
    },
  };
}

/** A process that is not restarted (tests that kill one on purpose): the same shape, no policy. */
export function unsupervised<R extends Run>(name: string, run: R): Supervised<R> {
  return {
    name,
    current: run,
    failed: false,
    stop: () => run.stop(),
    kill: () => run.kill(),
  };
}
