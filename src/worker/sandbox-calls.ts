// How much of the worker one sandbox's callers hold at once through the API: processes (exec,
// envd's commands, the files endpoints' readers and writers, each a `runc exec` with its pipes
// in the worker) and terminals. Every surface (REST, E2B and envd, the terminal WebSocket, the
// Python runtime, the sandbox-router protocol) reaches a sandbox through the runtime the worker
// context carries, so the bound is put there, once: past it a call is refused at once with 429
// TooManyRequests naming the bound (the E2B SDKs raise RateLimitError), never queued, and never
// left to fail as a 500 when the worker runs out of descriptors (spawn EMFILE, as measured when
// two sandboxes' connections held all 20,000 of them). Probes and the operator's own calls use
// the runtime directly and are not counted.
//
// Numbers, against the worker's 20,000 descriptors (this host's `ulimit -Hn`): a process holds
// ~5 of them (stdin, stdout and stderr pipes, the pid-file watch, the request's socket), a
// terminal ~4 (the WebSocket, the helper's socket and its pipes). Per sandbox 64 processes and
// 256 terminals (200 sessions at once on one sandbox is a tested use: test/terminal.test.ts),
// ~1,350 descriptors; on the whole worker 1,024 of each, ~9,200, which with the DNS resolver's
// 4,096 TCP connections leaves ~6,700 for the API's connections, the store, the image cache and
// the runtime's launcher. 64 processes is far above what one agent runs at once (the E2B SDK's
// own tests run 10 in parallel); a background command (`commands.run(..., { background: true
// })`) holds its slot until it exits.
//
// And how many a sandbox starts a second, processes and terminals together: each is a spawn,
// which blocks the worker's event loop 6–20 ms here, for every tenant. 25 a second (a quarter of
// the loop at ~10 ms each) after a burst of 300 (a sweep of file reads, or 200 terminals at
// once, goes through); an agent's turn takes seconds and starts a few.
import { AsbError } from '../errors.ts';
import type { PodProcess, PodRuntime, PtySession } from '../runtime/runtime.ts';
import type { Clock } from '../base/clock.ts';
import { TokenBuckets } from '../base/token-buckets.ts';
import { Slots, type SlotBounds } from './slots.ts';

export interface SandboxCallLimits {
  processes: SlotBounds;
  terminals: SlotBounds;
  /** Processes and terminals a sandbox starts a second, after a burst. */
  starts: { ratePerS: number; burst: number };
}

export const DEFAULT_SANDBOX_CALL_LIMITS: Readonly<SandboxCallLimits> = Object.freeze({
  processes: { perKey: 64, total: 1024 },
  terminals: { perKey: 256, total: 1024 },
  starts: { ratePerS: 25, burst: 300 },
});

/** Sandboxes whose start buckets are kept (least recently used forgotten: it starts full again). */
const MAX_BUCKETS = 10_000;

/** When a refused caller should try again: a typical exec or file call ends within a second. */
export const SANDBOX_CALL_RETRY_AFTER_S = 1;

type Kind = 'processes' | 'terminals';

/** The runtime as the API sees it: the same, with each sandbox's processes and terminals bounded. */
export function boundSandboxCalls(runtime: PodRuntime, clock: Clock, limits: SandboxCallLimits = DEFAULT_SANDBOX_CALL_LIMITS): PodRuntime {
  const slots: Record<Kind, Slots> = { processes: new Slots(limits.processes), terminals: new Slots(limits.terminals) };
  const starts = new TokenBuckets({ clock, burst: limits.starts.burst, ratePerS: limits.starts.ratePerS, maxKeys: MAX_BUCKETS });
  const admit = (kind: Kind, id: string): (() => void) => {
    const a = slots[kind].admit(id);
    if (a.kind === 'admitted') {
      // The rate after the count: a call refused for being one too many spends no token.
      const waitMs = starts.take(id);
      if (waitMs === 0) return a.release;
      a.release();
      const message = `sandbox "${id}" started ${String(limits.starts.burst)} processes and terminals in a burst and is held to ${String(limits.starts.ratePerS)} a second; retry after the Retry-After seconds`;
      throw new AsbError('TooManyRequests', message, { retryAfterS: Math.max(1, Math.ceil(waitMs / 1000)) });
    }
    const what = kind === 'processes' ? 'processes (exec, commands, file reads and writes)' : 'terminals';
    const where = a.scope === 'key' ? `sandbox "${id}" already has ${String(a.limit)} ${what} open` : `this worker already has ${String(a.limit)} ${what} open for all sandboxes`;
    throw new AsbError('TooManyRequests', `${where}, the most it allows at once; retry when one has finished`, { retryAfterS: SANDBOX_CALL_RETRY_AFTER_S });
  };
  /** A call that ends when its promise settles. */
  const during = async <T>(kind: Kind, id: string, call: () => Promise<T>): Promise<T> => {
    const release = admit(kind, id);
    try {
      return await call();
    } finally {
      release();
    }
  };
  /** A call that opens something which holds the slot until it exits. */
  const until = async <T extends { exited: Promise<unknown> }>(kind: Kind, id: string, open: () => Promise<T>): Promise<T> => {
    const release = admit(kind, id);
    try {
      const opened = await open();
      opened.exited.then(release, release);
      return opened;
    } catch (err) {
      release();
      throw err;
    }
  };
  const bounded: Partial<PodRuntime> = {
    exec: (id, req) => during('processes', id, () => runtime.exec(id, req)),
    readFile: (id, path) => during('processes', id, () => runtime.readFile(id, path)),
    writeFile: (id, path, data, mode) => during('processes', id, () => runtime.writeFile(id, path, data, mode)),
    listDir: (id, path) => during('processes', id, () => runtime.listDir(id, path)),
    spawn: (id, req) => until<PodProcess>('processes', id, () => runtime.spawn(id, req)),
    openPty: (id, opts) => until<PtySession>('terminals', id, () => runtime.openPty(id, opts)),
  };
  return new Proxy(runtime, {
    get(target, prop) {
      if (typeof prop === 'string' && Object.hasOwn(bounded, prop)) return bounded[prop as keyof PodRuntime];
      // Getters and methods run on the runtime itself (its private fields), never on the proxy.
      const value: unknown = Reflect.get(target, prop);
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
    },
  });
}
