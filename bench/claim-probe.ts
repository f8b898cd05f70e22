// A quick probe of the warm-claim path: one worker with the fake runtime (pool refills cost no
// process starts; --real for the local runtime), 5 bursts of 64 claims against a full pool of
// 128, through the HTTP API.
// The client runs in a child process, as in `make bench`, so the 64 requests of a burst really
// arrive together and the worker's profile holds only the worker's work.
// Prints the client-side summary (bench/claims.ts), the SERVER-side p50/p99 of the POSTs (from
// diagnostics_channel: request start to response finish, so client queueing is excluded), the
// worker's CPU time per claim (the claims and the pool refills they cause; the figure noise on a
// shared machine moves least), the store's commits (--timeline), and writes a CPU profile of the bursts to /tmp/claim4.cpuprofile
// (100 µs sampling).
//
//   .tools/node/bin/node bench/claim-probe.ts
//
// It is a probe for finding where the time goes, not the benchmark: `make bench` (bench/run.ts
// claims) measures the real worker process with the real runtime.
import { fork } from 'node:child_process';
import { subscribe } from 'node:diagnostics_channel';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Session } from 'node:inspector/promises';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseWorkerConfig } from '../src/assembly/worker-config.ts';
import { silentLogger } from '../src/base/log.ts';
import { startWorker } from '../src/assembly/worker.ts';
import { FakeRuntime } from '../test/support/fake-runtime.ts';
import { commitChannel, type CommitReport } from '../src/store/sqlite-commit.ts';
import { call, poolObjects, round, waitPool, warmClaims, type Target } from './claims.ts';

const POOL = 'cb';
const POOL_SIZE = 128;
const BURST = 64;
const ROUNDS = 5;
const PROFILE_PATH = '/tmp/claim4.cpuprofile';

/** The messages of the http.server.* diagnostics channels this probe reads. */
interface ServerMessage {
  request: IncomingMessage;
  response: ServerResponse;
}

function isServerMessage(m: unknown): m is ServerMessage {
  return typeof m === 'object' && m !== null && 'request' in m && 'response' in m;
}

function quantile(sorted: number[], q: number): number {
  return round(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN);
}

/** Runs of requests and responses collapsed to counts; a gap over 50 ms starts a new burst. */
function printTimeline(timeline: [number, string][]): void {
  timeline.sort((a, b) => a[0] - b[0]);
  let t0 = timeline[0]?.[0] ?? 0;
  let last = t0;
  let run: { what: string; n: number; at: number } | undefined;
  const flushRun = (): void => {
    if (run !== undefined) console.log(`${round(run.at - t0).toFixed(2).padStart(8)} ${run.what} x${run.n}`);
    run = undefined;
  };
  for (const [at, what] of timeline) {
    if (at - last > 50) {
      flushRun();
      console.log('--- burst');
      t0 = at;
    }
    last = at;
    if (what === 'req' || what === 'res') {
      if (run?.what === what) run.n++;
      else {
        flushRun();
        run = { what, n: 1, at };
      }
      continue;
    }
    flushRun();
    console.log(`${round(at - t0).toFixed(2).padStart(8)} ${what}`);
  }
  flushRun();
}

/** The child: runs the bursts against the target it is given and sends back the summary. */
async function client(target: Target): Promise<void> {
  const ids: string[] = [];
  const summary = await warmClaims(target, POOL, BURST, ROUNDS, ids, POOL);
  process.send?.(summary);
}

async function probe(): Promise<void> {
  const dir = mkdtempSync('/tmp/cf-');
  const keyFile = join(dir, 'key');
  const config = parseWorkerConfig(['--data-dir', dir, '--port', '0', '--admin-key-file', keyFile, '--base-pool', '0'], {});
  // --real: the local runtime (real sandbox processes, as in `make bench`) instead of the fake.
  const real = process.argv.includes('--real');
  const worker = await startWorker(config, { log: silentLogger(), ...(real ? {} : { runtime: new FakeRuntime() }) });
  try {
    const target: Target = { apiUrl: worker.apiUrl, adminKey: readFileSync(keyFile, 'utf8').trim() };
    await call(target, 'POST', '/v1/apply', { objects: poolObjects(POOL, POOL_SIZE) });
    await waitPool(target, POOL, POOL_SIZE, 60_000);

    const starts = new WeakMap<ServerResponse, number>();
    const serverMs: number[] = [];
    // With --timeline: every POST's start and finish and every group commit, in time order.
    const timeline: [number, string][] = [];
    const withTimeline = process.argv.includes('--timeline');
    // The CLOCK_MONOTONIC µs of every POST's start and finish, the clock of the profile's
    // timestamps: /tmp/claim4.marks.json lets a reader keep only the samples inside bursts.
    const marks: number[] = [];
    const mark = (): number => marks.push(Number(process.hrtime.bigint() / 1000n));
    subscribe('http.server.request.start', (m) => {
      if (!isServerMessage(m)) return;
      starts.set(m.response, performance.now());
      if (m.request.method !== 'POST') return;
      mark();
      if (withTimeline) timeline.push([performance.now(), 'req']);
    });
    subscribe('http.server.response.finish', (m) => {
      if (!isServerMessage(m) || m.request.method !== 'POST') return;
      mark();
      const start = starts.get(m.response);
      if (start !== undefined) serverMs.push(performance.now() - start);
      if (withTimeline) timeline.push([performance.now(), 'res']);
    });
    commitChannel.subscribe((m) => {
      const r = m as CommitReport;
      if (!withTimeline) return;
      timeline.push([r.flushedAt, `flush ${r.writes} writes, ${r.changes} changes; posted +${round(r.postedAt - r.flushedAt)} committed +${round(r.committedAt - r.flushedAt)} published +${round(r.publishedAt - r.flushedAt)} (writer: rows ${round(r.rowsMs ?? 0)} commit ${round(r.commitMs ?? 0)})`]);
    });

    // The profiler's 100 µs sampling slows the worker by a fifth; --no-profile for clean figures.
    const profiling = !process.argv.includes('--no-profile');
    const session = new Session();
    session.connect();
    if (profiling) {
      await session.post('Profiler.enable');
      await session.post('Profiler.setSamplingInterval', { interval: 100 });
      await session.post('Profiler.start');
    }
    // CPU time is the figure the shared, noisy machine does not move: latency is.
    const cpuBefore = process.cpuUsage();
    const child = fork(fileURLToPath(import.meta.url), ['--client', JSON.stringify(target)]);
    const summary = await new Promise<unknown>((resolve, reject) => {
      child.once('message', resolve);
      child.once('error', reject);
      child.once('exit', (code) => reject(new Error(`client exited with code ${code ?? 'null'}`)));
    });
    child.kill();
    const cpu = process.cpuUsage(cpuBefore);
    const cpuMsPerClaim = round((cpu.user + cpu.system) / 1000 / (BURST * ROUNDS), 3);
    if (profiling) {
      const { profile } = await session.post('Profiler.stop');
      writeFileSync(PROFILE_PATH, JSON.stringify(profile));
      writeFileSync(PROFILE_PATH.replace('.cpuprofile', '.marks.json'), JSON.stringify(marks));
    }
    session.disconnect();

    if (withTimeline) printTimeline(timeline);
    serverMs.sort((a, b) => a - b);
    console.log({ client: summary, server: { count: serverMs.length, p50Ms: quantile(serverMs, 0.5), p99Ms: quantile(serverMs, 0.99) }, workerCpuMsPerClaim: cpuMsPerClaim, profile: profiling ? PROFILE_PATH : 'off' });
  } finally {
    // Local pods outlive their worker by design (a restart finds them): remove them, or every
    // --real run leaves 128+ sandbox processes and their network links behind.
    await Promise.all(worker.runtime.list().map((id) => worker.runtime.remove(id)));
    await worker.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

const clientAt = process.argv.indexOf('--client');
if (clientAt >= 0) await client(JSON.parse(process.argv[clientAt + 1] ?? '{}') as Target);
else await probe();
