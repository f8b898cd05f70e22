// A quick in-process probe of the warm-claim path: one worker with the fake runtime (so pool
// refills cost nothing), 5 bursts of 64 claims against a full pool of 128, through the HTTP API.
// Prints the client-side summary (bench/claims.ts), the SERVER-side p50/p99 of the POSTs (from
// diagnostics_channel: request start to response finish, so client queueing is excluded) and
// writes a CPU profile of the bursts to /tmp/claim4.cpuprofile (100 µs sampling).
//
//   .tools/node/bin/node bench/claim-probe.ts
//
// It is a probe for finding where the time goes, not the benchmark: `make bench` (bench/run.ts
// claims) measures the real worker process with the real runtime.
import { subscribe } from 'node:diagnostics_channel';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Session } from 'node:inspector/promises';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseWorkerConfig } from '../src/system/config.ts';
import { silentLogger } from '../src/system/log.ts';
import { startWorker } from '../src/system/worker.ts';
import { FakeRuntime } from '../test/support/fake-runtime.ts';
import { call, poolObjects, round, waitPool, warmClaims } from './claims.ts';

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

const dir = mkdtempSync('/tmp/cf-');
const keyFile = join(dir, 'key');
const config = parseWorkerConfig(['--data-dir', dir, '--port', '0', '--admin-key-file', keyFile, '--base-pool', '0'], {});
const worker = await startWorker(config, { log: silentLogger(), runtime: new FakeRuntime() });
try {
  const target = { apiUrl: worker.apiUrl, adminKey: readFileSync(keyFile, 'utf8').trim() };
  await call(target, 'POST', '/v1/apply', { objects: poolObjects(POOL, POOL_SIZE) });
  await waitPool(target, POOL, POOL_SIZE, 60_000);

  const starts = new WeakMap<ServerResponse, number>();
  const serverMs: number[] = [];
  subscribe('http.server.request.start', (m) => {
    if (isServerMessage(m)) starts.set(m.response, performance.now());
  });
  subscribe('http.server.response.finish', (m) => {
    if (!isServerMessage(m) || m.request.method !== 'POST') return;
    const start = starts.get(m.response);
    if (start !== undefined) serverMs.push(performance.now() - start);
  });

  const session = new Session();
  session.connect();
  await session.post('Profiler.enable');
  await session.post('Profiler.setSamplingInterval', { interval: 100 });
  await session.post('Profiler.start');
  const ids: string[] = [];
  console.log(await warmClaims(target, POOL, BURST, ROUNDS, ids, POOL));
  const { profile } = await session.post('Profiler.stop');
  writeFileSync(PROFILE_PATH, JSON.stringify(profile));
  session.disconnect();

  serverMs.sort((a, b) => a - b);
  const at = (q: number): number => round(serverMs[Math.min(serverMs.length - 1, Math.floor(q * serverMs.length))] ?? Number.NaN);
  console.log({ server: { count: serverMs.length, p50Ms: at(0.5), p99Ms: at(0.99) }, profile: PROFILE_PATH });
} finally {
  await worker.close();
  rmSync(dir, { recursive: true, force: true });
}
