// Time is injected so tests control it: components take a Clock, never call Date.now() or
// setTimeout directly.

export interface Timer {
  cancel(): void;
}

export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  /** Runs fn after ms; the returned timer does not keep the process alive. */
  after(ms: number, fn: () => void): Timer;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  after(ms, fn) {
    const handle = setTimeout(fn, ms);
    handle.unref();
    return { cancel: () => clearTimeout(handle) };
  },
};

export function isoNow(clock: Clock): string {
  return new Date(clock.now()).toISOString();
}
