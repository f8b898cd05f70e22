// Data-plane benchmark: what the router costs a request through Envoy. One Envoy runs two
// listeners in one run: the edge (ext_proc → router → ORIGINAL_DST to the pod address) and a
// static listener (same connection manager, no ext_proc, a fixed route to the same upstream),
// which is the physical limit of this machine. A second Envoy, configured the same, sends its
// ext_proc streams to bench/null-extproc.ts instead: the router's gRPC layer answering every
// request with one precomputed routed reply, no lookup. Its throughput over its own static
// listener (each ratio compares one Envoy process with itself; two identical Envoys' static
// figures differ by ~10 % here) is the ceiling any ext_proc router reaches on this box,
// printed next to ours. The same load goes to all four listeners, interleaved; we report the
// throughput ratios and the latency the router adds at 50 connections, plus the router's memory
// for 1,000,000 routes (bench/router-memory.ts in a child with --expose-gc).
//
// Load comes from wrk (Debian's package, installed by `scripts/bootstrap.sh apt wrk:wrk`), not a
// Node client: on this 2-core machine a Node keep-alive client spends ~3x the CPU per request of
// wrk's C event loop, and every cycle it takes is one Envoy and the router do not get, so a Node
// generator measures itself as much as the data plane. The upstream runs in its own Node process
// (bench/dataplane-upstream.ts) for the same reason; the router and the null server run in this
// process, each idle apart from its own runs.
//
// Run alone: `node bench/dataplane.ts` prints the figures as JSON.
//
// Figures (2 vCPU shared with other engineers' work, Envoy --concurrency 1, RST per stream; the
// box is so noisy that static alone swings 11,000-27,000 req/s between runs, so compare the
// per-request CPU figures, which move far less):
//   first (grpc-js router): static 8,200-25,000 req/s, routed 2,800-5,400, ratio 0.21-0.34,
//     added p50 7-10 ms, p99 27-42 ms at 50 connections; router 109-126 µs CPU per request,
//     Envoy 134-172 µs routed vs 39-47 µs static.
//   node:http2 + hand-written codec (src/router/grpc-server.ts, extproc-codec.ts), same runs
//     interleaved: routed 6,100-6,800 req/s, ratio 0.29-0.32, added p99 16 ms; router 63-78 µs.
//   1 connection (no queueing): added p50 0.32-0.35 ms before and after.
//   with the null server beside it (4 runs): routed 8,200-9,200 req/s, ratio 0.32-0.38, Envoy
//     90-99 µs, router 50-59 µs; null 9,200-13,100 req/s, ratio 0.37-0.48, Envoy 63-95 µs,
//     null server 33-46 µs. The router's own work (decode, decide) is the 10-20 µs difference.
// Why 50 connections queue: nothing waits on a lock. On 2 cores the routed request costs
// Envoy + router + upstream + wrk ~ 200 µs of CPU against ~90 µs static, and Envoy's own share
// is 2-2.5x its static work (a gRPC side stream per request), so its one worker saturates near
// 9,000-13,000 req/s even behind the null server: nullRps / nullRatio measure that ceiling in
// every run (the null server still pays node:http2 and gRPC framing, 33-46 µs, on the shared
// cores). Ratio 0.6 is out of reach on this box with Envoy at one worker, whatever the router
// does; by Little's law the added latency at 50 connections is set by the throughput gap
// (50 / rps), so the 1-connection figure is the router hop's own latency.
// Of the router's remaining cost ~20 % is Node building an ERR_HTTP2_STREAM_ERROR (with its
// stack) for every RST_STREAM(INTERNAL_ERROR) Envoy sends; Envoy's graceful close avoids it, but
// with gracefulClose the router measured 52-68 µs vs 65-73 µs with RST: within the noise.
// 1,000,000 routes: 291 MB heap, 305 B per route (target ≤ 512 MB: met).
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import type { EnvoyProcess } from '../src/edge/envoy-process.ts';
import { startNullExtProc } from './null-extproc.ts';
import type { RouteMemory } from './router-memory.ts';
import { DOMAIN, sandboxEntry, startFakeWorker, startTestEnvoy, startTestRouter, until, type After } from '../test/support/dataplane-fixture.ts';

const repoRoot = resolve(import.meta.dirname, '..');

export interface DataplaneBench {
  /** Requests per second through Envoy + router (best of the rounds). */
  rps: number;
  /** Requests per second through the same Envoy's static route to the same upstream. */
  staticRps: number;
  /** rps / staticRps; target ≥ 0.6. */
  ratio: number;
  /** Routed minus static latency at 50 connections; target p99 ≤ 1 ms. */
  addedP50Ms: number;
  addedP99Ms: number;
  p50Ms: number;
  p99Ms: number;
  staticP50Ms: number;
  staticP99Ms: number;
  /** CPU per request (µs) in the routed round, by process: less noisy on a shared box than rps. */
  routedCpuUs: { envoy: number; router: number; upstream: number };
  /** Envoy's CPU per request (µs) in the static round. */
  staticEnvoyCpuUs: number;
  /** Requests per second through a second Envoy whose ext_proc server is bench/null-extproc.ts (fixed reply, no work). */
  nullRps: number;
  /** That second Envoy's own static route, in the same rounds. */
  nullStaticRps: number;
  /** nullRps / nullStaticRps: the most any ext_proc router can reach here (the ceiling for `ratio`). */
  nullRatio: number;
  /** CPU per request (µs) in the null round: the second Envoy, and this process (the null server). */
  nullCpuUs: { envoy: number; router: number };
  /** One connection (no queueing): what one request pays for the router hop. */
  addedP50Ms1: number;
  addedP99Ms1: number;
  /** Router heap for 1,000,000 routes; target ≤ 512 MB. */
  routeMemory: RouteMemory;
}

export interface DataplaneBenchOptions {
  /** Seconds of load per listener per round. Default 5. */
  durationS?: number;
  /** Rounds, each running static, routed, null-server static and null-server routed in turn; the best of each counts (other work on a shared box only ever slows a round). Default 2. */
  rounds?: number;
  connections?: number;
  /** Envoy half-closes ext_proc streams instead of resetting them (EdgeConfigOptions.gracefulClose). */
  gracefulClose?: boolean;
  /** Routes for the memory figure. Default 1,000,000. */
  routes?: number;
}

interface WrkResult {
  requests: number;
  /** CPU seconds each watched process used during the run. */
  cpuS: Record<string, number>;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  /** Connect/read/write errors, timeouts and non-2xx answers. */
  errors: number;
}

// wrk's done() hook: one JSON line with exact percentiles (microseconds) and every error count.
const WRK_REPORT = `
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('ASB {"requests":%d,"durationUs":%d,"p50Us":%d,"p99Us":%d,"errors":%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout))
end
`;

export async function benchDataplane(opts: DataplaneBenchOptions = {}): Promise<DataplaneBench> {
  const durationS = opts.durationS ?? 5;
  const rounds = opts.rounds ?? 2;
  const connections = opts.connections ?? 50;
  execFileSync(join(repoRoot, 'scripts', 'bootstrap.sh'), ['apt', 'wrk:wrk'], { stdio: 'inherit' });

  const cleanups: (() => unknown)[] = [];
  const after: After = (fn) => cleanups.push(fn);
  const dir = mkdtempSync(join(tmpdir(), 'asb-bench-dataplane-'));
  after(() => rmSync(dir, { recursive: true, force: true }));
  try {
    const { port: upstreamPort, pid: upstreamPid } = await startUpstreamProcess(after);
    const upstream = `127.0.0.1:${upstreamPort}`;
    const worker = await startFakeWorker(after, 'bench');
    const router = await startTestRouter(after, { workers: [{ cluster: 'bench', url: worker.url }], activityFlushMs: 5_000 });
    // Envoy with one worker thread: on 2 cores the other one is shared by wrk, the router and the upstream.
    const startEnvoy = (routerAddress: string): Promise<EnvoyProcess> =>
      startTestEnvoy(
        after,
        { listenPort: 0, adminPort: 0, routerAddress, workers: [{ cluster: 'bench', apiAddress: worker.address }], static: { listenPort: 0, upstreamAddress: upstream }, accessLogPath: '/dev/null', gracefulClose: opts.gracefulClose ?? false },
        1,
      );
    const envoy = await startEnvoy(router.address);
    // The ceiling: a second Envoy in front of a server that costs nothing, with its own static
    // listener, so each ratio compares one Envoy process with itself.
    const nullServer = await startNullExtProc(upstream, 'bench1');
    after(() => nullServer.close());
    const nullEnvoy = await startEnvoy(nullServer.address);
    // A public port: the token check (one sha256) is not what this measures.
    const version = worker.publish([sandboxEntry('bench1', 'bench', { defaultPort: upstreamPort, publicPorts: [upstreamPort] })]);
    await until(() => router.table.version('bench') === version, 5_000, 'route feed snapshot');

    const script = join(dir, 'report.lua');
    writeFileSync(script, WRK_REPORT);
    const routedHost = `${upstreamPort}-bench1.${DOMAIN}`;
    const staticUrl = envoy.endpoints.staticUrl ?? '';
    const nullStaticUrl = nullEnvoy.endpoints.staticUrl ?? '';
    // `router` is this process: the router, or in the null rounds the null server (the router idles then).
    const pids = { envoy: envoy.pid ?? 0, router: process.pid, upstream: upstreamPid };
    const nullPids = { ...pids, envoy: nullEnvoy.pid ?? 0 };
    const run = (url: string, conns: number, seconds: number, watched = pids): Promise<WrkResult> => wrk(url, routedHost, script, conns, seconds, watched);
    // Warm every path: Envoy's connection pools, the router's JIT.
    await run(envoy.endpoints.edgeUrl, connections, 1);
    await run(staticUrl, connections, 1);
    await run(nullEnvoy.endpoints.edgeUrl, connections, 1, nullPids);
    await run(nullStaticUrl, connections, 1, nullPids);
    let best: WrkResult | undefined;
    let bestStatic: WrkResult | undefined;
    let bestNull: WrkResult | undefined;
    let bestNullStatic: WrkResult | undefined;
    let best1: WrkResult | undefined;
    let bestStatic1: WrkResult | undefined;
    const faster = (a: WrkResult | undefined, b: WrkResult): WrkResult => (a === undefined || b.rps > a.rps ? b : a);
    for (let i = 0; i < rounds; i++) {
      bestStatic = faster(bestStatic, await run(staticUrl, connections, durationS));
      best = faster(best, await run(envoy.endpoints.edgeUrl, connections, durationS));
      bestNullStatic = faster(bestNullStatic, await run(nullStaticUrl, connections, durationS, nullPids));
      bestNull = faster(bestNull, await run(nullEnvoy.endpoints.edgeUrl, connections, durationS, nullPids));
      const s1 = await run(staticUrl, 1, 2);
      const r1 = await run(envoy.endpoints.edgeUrl, 1, 2);
      if (bestStatic1 === undefined || s1.p50Ms < bestStatic1.p50Ms) bestStatic1 = s1;
      if (best1 === undefined || r1.p50Ms < best1.p50Ms) best1 = r1;
    }
    if (best === undefined || bestStatic === undefined || bestNull === undefined || bestNullStatic === undefined || best1 === undefined || bestStatic1 === undefined) throw new Error('no benchmark rounds ran');
    const perRequestUs = (r: WrkResult, name: string): number => Math.round(((r.cpuS[name] ?? 0) / r.requests) * 1e6);
    await assertNoFailedStreams(envoy, 'router');
    await assertNoFailedStreams(nullEnvoy, 'null ext_proc server');

    const routeMemory = measureRouteMemory(opts.routes ?? 1_000_000);
    return {
      rps: Math.round(best.rps),
      staticRps: Math.round(bestStatic.rps),
      ratio: round(best.rps / bestStatic.rps, 3),
      addedP50Ms: round(best.p50Ms - bestStatic.p50Ms, 3),
      addedP99Ms: round(best.p99Ms - bestStatic.p99Ms, 3),
      p50Ms: round(best.p50Ms, 3),
      p99Ms: round(best.p99Ms, 3),
      staticP50Ms: round(bestStatic.p50Ms, 3),
      staticP99Ms: round(bestStatic.p99Ms, 3),
      routedCpuUs: { envoy: perRequestUs(best, 'envoy'), router: perRequestUs(best, 'router'), upstream: perRequestUs(best, 'upstream') },
      staticEnvoyCpuUs: perRequestUs(bestStatic, 'envoy'),
      nullRps: Math.round(bestNull.rps),
      nullStaticRps: Math.round(bestNullStatic.rps),
      nullRatio: round(bestNull.rps / bestNullStatic.rps, 3),
      nullCpuUs: { envoy: perRequestUs(bestNull, 'envoy'), router: perRequestUs(bestNull, 'router') },
      addedP50Ms1: round(best1.p50Ms - bestStatic1.p50Ms, 3),
      addedP99Ms1: round(best1.p99Ms - bestStatic1.p99Ms, 3),
      routeMemory,
    };
  } finally {
    for (const fn of cleanups.reverse()) await fn();
  }
}

async function assertNoFailedStreams(envoy: EnvoyProcess, server: string): Promise<void> {
  const failures = await envoy.stats('ext_proc.streams_failed');
  if ((failures.get('http.edge.ext_proc.streams_failed') ?? 0) > 0) throw new Error(`ext_proc streams to the ${server} failed during the benchmark: ${JSON.stringify(Object.fromEntries(failures))}`);
}

async function startUpstreamProcess(after: After): Promise<{ port: number; pid: number }> {
  const child: ChildProcess = spawn(process.execPath, [join(repoRoot, 'bench', 'dataplane-upstream.ts')], { stdio: ['pipe', 'pipe', 'inherit'] });
  after(() => {
    child.stdin?.end();
    child.kill();
  });
  const lines = createInterface({ input: child.stdout ?? process.stdin });
  const exited = new Promise<never>((_, reject) => child.once('exit', (code) => reject(new Error(`bench upstream exited (${code ?? 'signal'}) before listening`))));
  const first = new Promise<string>((res) => lines.once('line', res));
  const line = await Promise.race([first, exited]);
  lines.close();
  return { port: (JSON.parse(line) as { port: number }).port, pid: child.pid ?? 0 };
}

/** utime + stime of a process in seconds (Linux /proc; USER_HZ is 100 on every Linux we run). */
function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ') ?? [];
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

function wrk(baseUrl: string, host: string, script: string, connections: number, durationS: number, pids: Record<string, number>): Promise<WrkResult> {
  const before = Object.fromEntries(Object.entries(pids).map(([name, pid]) => [name, cpuSeconds(pid)]));
  return new Promise((resolvePromise, reject) => {
    const args = ['-t1', `-c${connections}`, `-d${durationS}s`, '--timeout', '5s', '-s', script, '-H', `Host: ${host}`, `${baseUrl}/bench`];
    const child = spawn('wrk', args, { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.once('error', reject);
    child.once('exit', (code) => {
      const m = /^ASB (\{.*\})$/m.exec(out);
      if (code !== 0 || m?.[1] === undefined) {
        reject(new Error(`wrk failed (exit ${code ?? 'signal'}):\n${out}`));
        return;
      }
      const r = JSON.parse(m[1]) as { requests: number; durationUs: number; p50Us: number; p99Us: number; errors: number };
      if (r.errors > 0) {
        reject(new Error(`wrk saw ${r.errors} failed requests against ${baseUrl}:\n${out}`));
        return;
      }
      const cpuS = Object.fromEntries(Object.entries(pids).map(([name, pid]) => [name, cpuSeconds(pid) - (before[name] ?? 0)]));
      resolvePromise({ cpuS, requests: r.requests, rps: r.requests / (r.durationUs / 1e6), p50Ms: r.p50Us / 1000, p99Ms: r.p99Us / 1000, errors: r.errors });
    });
  });
}

/** In a child with --expose-gc so the heap figure is the table's, not garbage or this process's servers. */
function measureRouteMemory(routes: number): RouteMemory {
  const out = execFileSync(process.execPath, ['--expose-gc', join(repoRoot, 'bench', 'router-memory.ts'), String(routes)], { encoding: 'utf8', maxBuffer: 1 << 20 });
  return JSON.parse(out.trim().split('\n').at(-1) ?? '{}') as RouteMemory;
}

function round(n: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(n * f) / f;
}

if (import.meta.main) {
  console.log(JSON.stringify(await benchDataplane(), null, 2));
}
