// What lifecycle events cost a claim, and how soon a webhook hears of it: `node bench/events.ts`.
// The worker API with the real SQLite store and the in-memory pod runtime (so only the store, the
// recorder and the event loop are measured, not containers), a warm pool of 128, bursts of 64
// claims, once with lifecycle events off and once on with a webhook receiver on loopback. Prints
// claim p50 / p99 for both, the time from a burst's last answer until every claim's `created`
// event was persisted, and until the receiver had them all.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { SandboxWarmPoolType } from '../src/api/types.ts';
import { call, startWorkerFixture, type WorkerFixture } from '../test/support/worker-fixture.ts';
import { round, summarize } from './claims.ts';

const POOL = 128;
const BURST = 64;
const ROUNDS = 5;

async function waitUntil(what: string, fn: () => boolean | Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

async function readyMembers(fx: WorkerFixture): Promise<number> {
  const pool = await fx.store.get<{ status?: { readyReplicas?: number } } & import('../src/api/meta.ts').KubeObject>(SandboxWarmPoolType, 'default', 'base');
  return pool.status?.readyReplicas ?? 0;
}

async function run(events: boolean): Promise<{ p50Ms: number; p99Ms: number; loopP99Ms: number; loopMaxMs: number; persistedMs?: number; deliveredMs?: number }> {
  const cleanups: (() => Promise<void> | void)[] = [];
  // The receiver is a process of its own, as a user's would be: it prints each sandbox id it got.
  const received = new Set<string>();
  const receiver = spawn(process.execPath, ['-e', `
    const s = require('node:http').createServer((req, res) => {
      let b = ''; req.on('data', (c) => (b += c)); req.on('end', () => { process.stdout.write(JSON.parse(b).sandboxId + '\\n'); res.writeHead(204).end(); });
    });
    s.listen(0, '127.0.0.1', () => process.stdout.write('port ' + s.address().port + '\\n'));`], { stdio: ['ignore', 'pipe', 'inherit'] });
  cleanups.push(() => {
    receiver.kill();
  });
  const port = await new Promise<number>((resolve) => {
    createInterface({ input: receiver.stdout }).on('line', (line) => {
      if (line.startsWith('port ')) resolve(Number(line.slice(5)));
      else received.add(line);
    });
  });
  // The receiver is on loopback: the worker runs with --webhook-allow-private (allowPrivate).
  const fx = await startWorkerFixture((fn) => cleanups.push(fn), {}, events ? { events: { webhooks: { allowPrivate: true } } } : {});
  try {
    if (events && process.env.BENCH_NO_HOOK === undefined) {
      const url = `http://127.0.0.1:${String(port)}/`;
      await call(fx, 'POST', '/v1/events/webhooks', { key: fx.keys.teamA, json: { url, signatureSecret: 'bench-secret-0123456789', events: ['sandbox.lifecycle.created'] } });
    }
    await fx.store.create(SandboxWarmPoolType, { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxWarmPool', metadata: { name: 'base', namespace: 'default' }, spec: { replicas: POOL, sandboxTemplateRef: { name: 'base' } } });
    const samples: number[] = [];
    const loop = monitorEventLoopDelay({ resolution: 1 });
    loop.enable();
    const persisted: number[] = [];
    const delivered: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      await waitUntil('a full pool', async () => (await readyMembers(fx)) >= POOL);
      const ids = await Promise.all(Array.from({ length: BURST }, async () => {
        const t0 = performance.now();
        const res = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: { template: 'base' } });
        samples.push(performance.now() - t0);
        if (res.status !== 201) throw new Error(`claim: ${String(res.status)} ${res.text}`);
        return (res.json as { id: string; launchType: string }).id;
      }));
      const done = performance.now();
      if (events) {
        const log = fx.eventLog;
        if (log === undefined) throw new Error('no event log');
        await waitUntil('created persisted', () => ids.every((id) => (log.sandboxEvents('team-a', id, { offset: 0, limit: 1, orderAsc: true, types: ['sandbox.lifecycle.created'] }) ?? []).length === 1));
        persisted.push(performance.now() - done);
        if (process.env.BENCH_NO_HOOK === undefined) await waitUntil('created delivered', () => ids.every((id) => received.has(id)));
        delivered.push(performance.now() - done);
      }
      await Promise.all(ids.map((id) => call(fx, 'DELETE', `/v1/sandboxes/${id}`, { key: fx.keys.teamA })));
    }
    loop.disable();
    const s = summarize(samples);
    const median = (xs: number[]): number => round([...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN, 1);
    return { p50Ms: s.p50Ms, p99Ms: s.p99Ms, loopP99Ms: round(loop.percentile(99) / 1e6, 1), loopMaxMs: round(loop.max / 1e6, 1), ...(events ? { persistedMs: median(persisted), deliveredMs: median(delivered) } : {}) };
  } finally {
    for (const c of cleanups.reverse()) await c();
  }
}

// Off, on, off, on: the first run warms the JIT, and the machine is shared, so each is run twice.
const runs = [];
for (const events of [false, true, false, true]) runs.push({ events, ...(await run(events)) });
console.log(`warm claims, ${String(ROUNDS)} bursts of ${String(BURST)} (in-memory pods, real store):`);
for (const r of runs) {
  console.log(`  events ${r.events ? 'on: ' : 'off:'} p50 / p99 ${String(r.p50Ms)} / ${String(r.p99Ms)} ms, event-loop delay p99 / max ${String(r.loopP99Ms)} / ${String(r.loopMaxMs)} ms${r.events ? `; last claim answered → all ${String(BURST)} created events persisted ${String(r.persistedMs)} ms, delivered to the webhook ${String(r.deliveredMs)} ms (medians of bursts)` : ''}`);
}
