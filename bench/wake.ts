// Wake on first connection through Envoy (`node bench/run.ts wake`): pause a sandbox, then ask
// its server for a page through the edge and time the first 200. Two templates:
// - `wakeready`: the server listens as soon as its pod starts and a readiness probe says so: the
//   cost of the wake itself (resume, feed, router release);
// - `wakeslow`: the server starts listening LISTEN_DELAY_S after its pod starts, with no probe,
//   as any app that loads before it binds. Before the router waited for the port, it released
//   the request when the pod ran, and the client got 503s for as long as the server was not
//   listening;
// - `wakegvisor`: `wakeready` with `runtimeClassName: gvisor`, gVisor's figure beside runc's,
//   absent when this machine cannot run runsc;
// - `wakememory`: a gVisor app holding 64 MiB, paused with its memory (pause {memory: true}) and
//   woken by restoring it: the server answers from where it was, no start-up of its own;
// - `wakememrunc`: the same app on runc (suspensionStrategy Hibernate, CRIU's restore).
// The client behaves as a user pressing reload: after a non-200 it asks again 100 ms later, up
// to 30 s; the time is from the first request to the first 200, and every non-200 is counted.
import { request } from 'node:http';
import { performance } from 'node:perf_hooks';
import { call, poolObjects, summarize, waitPool, type LatencySummary as Summary, type Target } from './claims.ts';
import { findRunscBinary } from '../src/runtime/oci/runsc-binary.ts';
import { startTestSystem } from '../test/support/local-system.ts';

/** Seconds between the slow template's pod start and its server's listen. */
export const LISTEN_DELAY_S = 0.5;
const WAKES = 20;
const RELOAD_MS = 100;
const GIVE_UP_MS = 30_000;

export interface WakeFigures {
  /** Time to the first 200. */
  firstOk: Summary;
  /** Non-200 answers before it, over all wakes, by status. */
  refused: Record<string, number>;
  /** Wakes that got no 200 within GIVE_UP_MS. */
  failed: number;
}

export interface WakeResults {
  ready: WakeFigures;
  slowListen: WakeFigures & { listenDelayS: number };
  gvisor?: WakeFigures;
  /** gVisor, paused with memory, an app holding MEMORY_APP_MIB. */
  memory?: WakeFigures & { heldMiB: number };
  /** runc (CRIU), the same. */
  memoryRunc: WakeFigures & { heldMiB: number };
}

/** What the memory-kept wake's app holds. */
const MEMORY_APP_MIB = 64;

export async function benchWake(): Promise<WakeResults> {
  const system = await startTestSystem('bnwk', 218, 'bench');
  try {
    const target: Target = { apiUrl: system.apiUrl, adminKey: system.adminKey };
    const ready = await wakes(system.edgeUrl, system.domain, target, 'wakeready', ['python3', '-m', 'http.server', '8080', '--directory', '/tmp'], true);
    const slow = await wakes(system.edgeUrl, system.domain, target, 'wakeslow', ['sh', '-c', `sleep ${LISTEN_DELAY_S} && exec python3 -m http.server 8080 --directory /tmp`], false);
    const app = `hold = b"\\x01" * (${String(MEMORY_APP_MIB)} << 20)\nimport http.server\nhttp.server.HTTPServer(("0.0.0.0", 8080), http.server.SimpleHTTPRequestHandler).serve_forever()`;
    const memoryRunc = { ...await wakes(system.edgeUrl, system.domain, target, 'wakememrunc', ['python3', '-c', app], true, undefined, true), heldMiB: MEMORY_APP_MIB };
    const results: WakeResults = { ready, slowListen: { ...slow, listenDelayS: LISTEN_DELAY_S }, memoryRunc };
    if (canRunGvisor()) {
      results.gvisor = await wakes(system.edgeUrl, system.domain, target, 'wakegvisor', ['python3', '-m', 'http.server', '8080', '--directory', '/tmp'], true, 'gvisor');
      results.memory = { ...await wakes(system.edgeUrl, system.domain, target, 'wakememory', ['python3', '-c', app], true, 'gvisor', true), heldMiB: MEMORY_APP_MIB };
    }
    return results;
  } finally {
    await system.cleanup();
  }
}

/** Whether runsc is built here (make runsc), as the worker finds it. */
function canRunGvisor(): boolean {
  try {
    findRunscBinary();
    return true;
  } catch {
    return false;
  }
}

async function wakes(edgeUrl: string, domain: string, target: Target, name: string, command: string[], probe: boolean, runtimeClassName?: string, memory = false): Promise<WakeFigures> {
  const [template, pool] = poolObjects(name, 1) as [{ spec: { podTemplate: { spec: { containers: Record<string, unknown>[]; runtimeClassName?: string } }; suspensionStrategy?: string } }, unknown];
  if (runtimeClassName !== undefined) template.spec.podTemplate.spec.runtimeClassName = runtimeClassName;
  // A runc pod keeps its memory only when started for it (PodRequest.checkpointable).
  if (memory && runtimeClassName === undefined) template.spec.suspensionStrategy = 'Hibernate';
  template.spec.podTemplate.spec.containers = [
    {
      name: 'main',
      image: 'python:3.11',
      command,
      ports: [{ containerPort: 8080 }],
      ...(probe ? { readinessProbe: { tcpSocket: { port: 8080 }, periodSeconds: 1 } } : {}),
    },
  ];
  const applied = await call(target, 'POST', '/v1/apply', { objects: [template, pool] });
  if (applied.status !== 200) throw new Error(`apply failed: ${JSON.stringify(applied.body)}`);
  await waitPool(target, name, 1, 60_000);
  const sb = await call<{ id: string; accessToken: string }>(target, 'POST', '/v1/sandboxes', { template: name });
  const host = `8080-${sb.body.id}.${domain}`;
  // Once before the first pause: a sandbox just claimed was never held, its server may still be starting.
  await firstOk(edgeUrl, host, sb.body.accessToken, {});
  const times: number[] = [];
  const refused: Record<string, number> = {};
  let failed = 0;
  for (let i = 0; i < WAKES; i++) {
    const paused = await call(target, 'POST', `/v1/sandboxes/${sb.body.id}/pause`, memory ? { memory: true } : undefined);
    if (paused.status !== 200) throw new Error(`pause failed: ${JSON.stringify(paused.body)}`);
    await waitPhase(target, sb.body.id, 'Hibernated');
    const start = performance.now();
    const ok = await firstOk(edgeUrl, host, sb.body.accessToken, refused);
    if (ok) times.push(performance.now() - start);
    else failed++;
  }
  await call(target, 'DELETE', `/v1/sandboxes/${sb.body.id}`);
  return { firstOk: summarize(times), refused, failed };
}

/** Asks until a 200 (a user pressing reload every RELOAD_MS), counting every other answer by status; false after GIVE_UP_MS. */
async function firstOk(edgeUrl: string, host: string, token: string, refused: Record<string, number>): Promise<boolean> {
  const deadline = performance.now() + GIVE_UP_MS;
  while (performance.now() < deadline) {
    const status = await get(edgeUrl, host, token);
    if (status === 200) return true;
    refused[String(status)] = (refused[String(status)] ?? 0) + 1;
    await new Promise((r) => setTimeout(r, RELOAD_MS));
  }
  return false;
}

async function waitPhase(target: Target, id: string, phase: string, timeoutMs = 30_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (performance.now() < deadline) {
    const got = await call<{ phase: string }>(target, 'GET', `/v1/sandboxes/${id}`);
    if (got.body.phase === phase) return;
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error(`sandbox ${id} never reached ${phase}`);
}

/** One GET through the edge on a fresh connection; its status (0: no answer). */
function get(edgeUrl: string, host: string, token: string): Promise<number> {
  return new Promise((resolve) => {
    const req = request(`${edgeUrl}/`, { headers: { host, 'x-access-token': token }, agent: false, timeout: GIVE_UP_MS }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(0));
    req.end();
  });
}
