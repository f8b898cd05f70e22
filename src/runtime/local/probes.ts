// Readiness probes with Kubernetes semantics: exec (inside the pod, exit 0), httpGet (2xx/3xx
// from the pod's address) and tcpSocket (a connection is accepted), run every period; ready after
// successThreshold successes in a row, unready after failureThreshold failures in a row.
import { request } from 'node:http';
import { connect } from 'node:net';
import type { ContainerPort, Probe } from '../../api/types.ts';
import type { Clock, Timer } from '../../base/clock.ts';
import type { ExecResult } from '../runtime.ts';

export interface ProbeTarget {
  host: string;
  ports: readonly ContainerPort[];
  exec(command: string[], timeoutMs: number): Promise<ExecResult>;
}

export function probePort(port: number | string, ports: readonly ContainerPort[]): number {
  if (typeof port === 'number') return port;
  const named = ports.find((p) => p.name === port)?.containerPort;
  return named ?? Number(port);
}

function tcpCheck(host: string, port: number, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host, port, timeout: timeoutMs });
    const done = (ok: boolean): void => {
      socket.destroy();
      resolve(ok);
    };
    socket.once('connect', () => done(true));
    socket.once('timeout', () => done(false));
    socket.once('error', () => done(false));
  });
}

function httpCheck(host: string, port: number, path: string, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const req = request({ host, port, path, method: 'GET', timeout: timeoutMs, agent: false }, (res) => {
      res.resume();
      const status = res.statusCode ?? 0;
      resolve(status >= 200 && status < 400);
    });
    req.once('timeout', () => req.destroy(new Error('timeout')));
    req.once('error', () => resolve(false));
    req.end();
  });
}

export async function runProbe(probe: Probe, target: ProbeTarget, timeoutMs: number): Promise<boolean> {
  if (probe.exec !== undefined) {
    const result = await target.exec(probe.exec.command, timeoutMs);
    return result.exitCode === 0 && !result.timedOut;
  }
  if (probe.httpGet !== undefined) {
    const path = probe.httpGet.path ?? '/';
    return httpCheck(target.host, probePort(probe.httpGet.port, target.ports), path.startsWith('/') ? path : `/${path}`, timeoutMs);
  }
  if (probe.tcpSocket !== undefined) return tcpCheck(target.host, probePort(probe.tcpSocket.port, target.ports), timeoutMs);
  return true;
}

/** Probe interval while a pod has not yet been ready; see the loop. */
const STARTUP_PROBE_MS = 25;

export interface ProbeLoopOptions {
  probe: Probe;
  target: ProbeTarget;
  clock: Clock;
  /** Period when the probe sets no periodSeconds (Kubernetes' own default is 10 s; too slow here). */
  defaultPeriodMs: number;
  onChange(ready: boolean): void;
  onError(err: unknown): void;
}

/** Runs the probe until cancelled; calls onChange only on transitions. */
export function startProbeLoop(opts: ProbeLoopOptions): { cancel(): void } {
  const { probe } = opts;
  const periodMs = probe.periodSeconds !== undefined ? probe.periodSeconds * 1000 : opts.defaultPeriodMs;
  const timeoutMs = (probe.timeoutSeconds ?? 1) * 1000;
  const successThreshold = probe.successThreshold ?? 1;
  const failureThreshold = probe.failureThreshold ?? 3;
  let ready = false;
  let everReady = false;
  let successes = 0;
  let failures = 0;
  let cancelled = false;
  let timer: Timer | undefined;
  const tick = (): void => {
    runProbe(probe, opts.target, timeoutMs).then(
      (ok) => {
        if (cancelled) return;
        successes = ok ? successes + 1 : 0;
        failures = ok ? 0 : failures + 1;
        if (!ready && successes >= successThreshold) {
          ready = true;
          everReady = true;
          opts.onChange(true);
        } else if (ready && failures >= failureThreshold) {
          ready = false;
          opts.onChange(false);
        }
      },
      (err: unknown) => opts.onError(err),
    ).finally(() => {
      // Until the pod is first ready, probe every STARTUP_PROBE_MS rather than every period: a
      // woken sandbox is usually ready within tens of ms, and waiting a whole period (1 s here,
      // 10 s in Kubernetes) made every wake cost that long. Once ready, the period applies.
      if (!cancelled) timer = opts.clock.after(everReady ? periodMs : Math.min(periodMs, STARTUP_PROBE_MS), tick);
    });
  };
  timer = opts.clock.after((probe.initialDelaySeconds ?? 0) * 1000, tick);
  return {
    cancel() {
      cancelled = true;
      timer?.cancel();
    },
  };
}
