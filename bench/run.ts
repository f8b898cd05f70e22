// `make bench`: benchmarks, not tests. Starts a real worker (real store, real local runtime),
// measures, prints a table, writes bench/results/<time>.json and bench/results/latest.json, and
// replaces the table between the bench markers in README.md.
import { execFileSync } from 'node:child_process';
import { cpus, totalmem } from 'node:os';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { call, poolObjects, round, summarize, waitPool, warmClaims } from './claims.ts';
import { benchStore } from './store-bench.ts';
import { removeDataDir, startWorkerProcess } from '../test/support/worker-process.ts';

const repoRoot = resolve(import.meta.dirname, '..');

interface Row {
  metric: string;
  value: string;
  target: string;
  ok: boolean | undefined;
}

async function main(): Promise<void> {
  const rows: Row[] = [];
  const results: Record<string, unknown> = {};
  const row = (metric: string, value: string, target: string, ok?: boolean): void => {
    rows.push({ metric, value, target, ok });
  };

  const store = await benchStore();
  results.store = store;
  row('store CAS updates/s (64 concurrent, group commit)', String(store.updatesPerSec), '—');

  const w = await startWorkerProcess({ clusterTag: 'bnch', subnetOctet: 219, basePool: 0 });
  try {
    // 1. Warm claims through the HTTP API. 600 warm members: 100 + 160 + 320 claims.
    const target = { apiUrl: w.apiUrl, adminKey: w.adminKey };
    const applied = await call(target, 'POST', '/v1/apply', { objects: poolObjects('claimbench', 600) });
    if (applied.status !== 200) throw new Error(`apply failed: ${JSON.stringify(applied.body)}`);
    const fillMs = await waitPool(target, 'claimbench', 600, 120_000);
    results.fill600Ms = round(fillMs, 0);
    const ids: string[] = [];
    for (const [concurrency, rounds] of [[1, 100], [16, 10], [64, 5]] as const) {
      const s = await warmClaims(target, 'claimbench', concurrency, rounds, ids);
      results[`warmClaim${concurrency}`] = s;
      const ok = concurrency === 64 ? s.p50Ms <= 5 && s.p99Ms <= 20 : undefined;
      row(`warm claim p50 / p99, ${concurrency} concurrent (${s.count} claims)`, `${s.p50Ms} / ${s.p99Ms} ms`, concurrency === 64 ? '≤ 5 / ≤ 20 ms' : '—', ok);
      if (concurrency === 64) row('claims per second (64-claim bursts)', String(s.claimsPerSec), '≥ 2,000', s.claimsPerSec >= 2000);
      if (s.cold > 0) throw new Error(`${s.cold} claims were cold: pool too small for the benchmark`);
    }
    await call(target, 'PUT', '/v1/pools/claimbench?namespace=default', { ...(poolObjects('claimbench', 0)[1] as object) });
    await Promise.all(ids.map((id) => call(target, 'DELETE', `/v1/sandboxes/${id}`)));

    // 2. Cold create: a template with no warm members, waiting until the sandbox is ready.
    await call(target, 'POST', '/v1/apply', { objects: poolObjects('coldbench', 0) });
    const cold: number[] = [];
    for (let i = 0; i < 10; i++) {
      const start = performance.now();
      const res = await call<{ id: string; ready: boolean; launchType: string }>(target, 'POST', '/v1/sandboxes', { template: 'coldbench', wait: true });
      if (res.status !== 201 || !res.body.ready || res.body.launchType !== 'cold') throw new Error(`cold create failed: ${JSON.stringify(res.body)}`);
      cold.push(performance.now() - start);
      await call(target, 'DELETE', `/v1/sandboxes/${res.body.id}`);
    }
    const coldSummary = summarize(cold);
    results.coldCreate = coldSummary;
    row('cold create to ready, p50 / p99 (10 sandboxes)', `${coldSummary.p50Ms} / ${coldSummary.p99Ms} ms`, '—');

    // 3. Refill: a 300-member pool from empty until every member is ready.
    await new Promise((r) => setTimeout(r, 2000)); // let deletions of the claimed sandboxes drain
    const start = performance.now();
    await call(target, 'POST', '/v1/apply', { objects: poolObjects('refill', 300) });
    await waitPool(target, 'refill', 300, 60_000);
    const refillMs = performance.now() - start;
    results.refill300Ms = round(refillMs, 0);
    row('refill of a 300-member pool to all ready', `${round(refillMs / 1000, 2)} s`, '≤ 3 s', refillMs <= 3000);
  } finally {
    await w.stop();
    removeDataDir(w.dataDir);
    try {
      execFileSync('ip', ['link', 'del', 'asbbnch'], { stdio: 'ignore' });
    } catch {
      // no bridge
    }
  }

  const machine = `${cpus().length} × ${cpus()[0]?.model.trim() ?? 'cpu'}, ${Math.round(totalmem() / 2 ** 30)} GiB, Node ${process.versions.node}`;
  const table = [
    `Measured ${new Date().toISOString().slice(0, 10)} on ${machine} by \`make bench\`.`,
    '',
    '| metric | measured | target |',
    '|---|---|---|',
    ...rows.map((r) => `| ${r.metric} | ${r.value}${r.ok === undefined ? '' : r.ok ? ' ✅' : ' ❌'} | ${r.target} |`),
  ].join('\n');
  console.log(`\n${table}\n`);

  const dir = join(repoRoot, 'bench/results');
  mkdirSync(dir, { recursive: true });
  const json = JSON.stringify({ machine, at: new Date().toISOString(), results, rows }, null, 2);
  writeFileSync(join(dir, `${new Date().toISOString().replace(/[:.]/g, '-')}.json`), json);
  writeFileSync(join(dir, 'latest.json'), json);
  updateReadme(table);
}

function updateReadme(table: string): void {
  const path = join(repoRoot, 'README.md');
  const text = readFileSync(path, 'utf8');
  const start = '<!-- bench:start -->';
  const end = '<!-- bench:end -->';
  const a = text.indexOf(start);
  const b = text.indexOf(end);
  if (a < 0 || b < a) return;
  writeFileSync(path, `${text.slice(0, a + start.length)}\n${table}\n${text.slice(b)}`);
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
