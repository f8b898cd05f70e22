// Waits until a woken sandbox's port accepts TCP connections, so a request held for a wake is
// released to a server that listens. The feed turns a sandbox `running` once its pod runs (or,
// with a readiness probe, once the probe passes); an app without a probe may bind its port
// seconds later (python -m http.server after a slow import: ~1.5 s), and releasing the request
// then gave Envoy's instant 503 "remote connection failure" instead of one slow 200.
//
// Only held requests come here: a request to a sandbox already known running is routed with no
// I/O. Concurrent requests for one pod:port share one probe loop (a thousand requests held for
// one wake make one connect every RETRY_MS, not a thousand), which stops when its last waiter
// is released, gives up (its own deadline) or goes away.
import { connect as netConnect } from 'node:net';
import { AsbError } from '../errors.ts';
import type { Clock, Timer } from '../base/clock.ts';

/** One TCP connect attempt: resolves true once `host:port` accepted, false when refused, unreachable or timed out. Never rejects. */
export type Connector = (host: string, port: number) => Promise<boolean>;

export interface PortWaitOptions {
  clock: Clock;
  /** Default: a real TCP connect bounded by ATTEMPT_TIMEOUT_MS, closed at once. */
  connect?: Connector;
  /** Pause between a failed attempt and the next. Default RETRY_MS. */
  retryMs?: number;
}

/**
 * 25 ms between attempts: a refused connect to a local pod answers in well under 1 ms, so this
 * is ~40 connects a second per pod:port, and a server adds at most 25 ms to its first answer.
 */
export const RETRY_MS = 25;
/** A pod address whose veth is not up yet can swallow a SYN: give one attempt this long, then try again. */
const ATTEMPT_TIMEOUT_MS = 500;

/** A real TCP connect: accepted → closed at once (the app sees a connection open and close). */
export const tcpConnector: Connector = (host, port) =>
  new Promise<boolean>((resolve) => {
    const socket = netConnect({ host, port, timeout: ATTEMPT_TIMEOUT_MS });
    const done = (ok: boolean): void => {
      socket.removeAllListeners();
      socket.on('error', () => undefined);
      socket.destroy();
      resolve(ok);
    };
    socket.once('connect', () => done(true));
    socket.once('timeout', () => done(false));
    socket.once('error', () => done(false));
  });

interface Waiter {
  resolve(): void;
  reject(err: Error): void;
}

interface Probe {
  waiters: Set<Waiter>;
  timer: Timer | undefined;
}

export class PortWaiter {
  readonly #clock: Clock;
  readonly #connect: Connector;
  readonly #retryMs: number;
  /** `host:port` → its probe loop, while someone waits for it. */
  readonly #probes = new Map<string, Probe>();

  constructor(opts: PortWaitOptions) {
    this.#clock = opts.clock;
    this.#connect = opts.connect ?? tcpConnector;
    this.#retryMs = opts.retryMs ?? RETRY_MS;
  }

  /** Probe loops running (one per pod:port someone waits for). */
  get probing(): number {
    return this.#probes.size;
  }

  /**
   * Resolves once `host:port` accepts a connection. Rejects with AsbError Unavailable when
   * `limitMs` pass first, or with the signal's reason when the request goes away.
   */
  untilListening(host: string, port: number, limitMs: number, signal: AbortSignal, what: string): Promise<void> {
    const key = `${host}:${port}`;
    return new Promise<void>((resolve, reject) => {
      if (signal.aborted) {
        reject(reasonOf(signal));
        return;
      }
      let probe = this.#probes.get(key);
      const fresh = probe === undefined;
      probe ??= { waiters: new Set(), timer: undefined };
      const found = probe;
      const leave = (): void => {
        timer.cancel();
        signal.removeEventListener('abort', onAbort);
        found.waiters.delete(waiter);
        if (found.waiters.size === 0) this.#stop(key, found);
      };
      const waiter: Waiter = {
        resolve: () => {
          leave();
          resolve();
        },
        reject: (err) => {
          leave();
          reject(err);
        },
      };
      const onAbort = (): void => waiter.reject(reasonOf(signal));
      const timer = this.#clock.after(Math.max(0, limitMs), () => waiter.reject(new AsbError('Unavailable', `${what}: nothing accepted connections on port ${port} within the hold limit`)));
      signal.addEventListener('abort', onAbort, { once: true });
      probe.waiters.add(waiter);
      if (fresh) {
        this.#probes.set(key, probe);
        this.#attempt(key, probe, host, port);
      }
    });
  }

  #attempt(key: string, probe: Probe, host: string, port: number): void {
    probe.timer = undefined;
    void this.#connect(host, port).then((ok) => {
      if (this.#probes.get(key) !== probe) return; // every waiter left meanwhile
      if (ok) {
        this.#probes.delete(key);
        for (const w of [...probe.waiters]) w.resolve();
        return;
      }
      probe.timer = this.#clock.after(this.#retryMs, () => this.#attempt(key, probe, host, port));
    });
  }

  #stop(key: string, probe: Probe): void {
    probe.timer?.cancel();
    probe.timer = undefined;
    if (this.#probes.get(key) === probe) this.#probes.delete(key);
  }
}

function reasonOf(signal: AbortSignal): Error {
  const reason: unknown = signal.reason;
  return reason instanceof Error ? reason : new AsbError('Internal', String(reason));
}
