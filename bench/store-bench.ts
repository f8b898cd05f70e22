// Embedded store throughput: 64 concurrent callers each loop get -> modify -> compare-and-swap
// update on their own Sandbox for ~2 s, on a temporary database with synchronous=FULL.
// 64 callers is the claim burst we size the group commit for; the goal is >= 2,000 updates/s on
// 2 cores. Run directly to print the figures: node bench/store-bench.ts
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { KubeObject } from '../src/api/meta.ts';
import { SandboxType } from '../src/api/types.ts';
import { isAsbError } from '../src/errors.ts';
import { openSqliteStore } from '../src/store/sqlite.ts';

const CALLERS = 64;
const DURATION_MS = 2000;

function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] ?? 0;
}

export async function benchStore(): Promise<{ updatesPerSec: number; p50Ms: number; p99Ms: number }> {
  const dir = mkdtempSync(join(tmpdir(), 'asb-store-bench-'));
  const store = await openSqliteStore({ path: join(dir, 'store.db') });
  try {
    const names = Array.from({ length: CALLERS }, (_, i) => `bench-${i}`);
    await Promise.all(
      names.map((name) =>
        store.create(SandboxType, { apiVersion: '', kind: '', metadata: { name, namespace: 'bench' }, spec: { n: 0 } }),
      ),
    );
    const latencies: number[] = [];
    const deadline = performance.now() + DURATION_MS;
    const started = performance.now();
    const caller = async (name: string): Promise<void> => {
      while (performance.now() < deadline) {
        const t0 = performance.now();
        const cur = await store.get<KubeObject & { spec: { n: number } }>(SandboxType, 'bench', name);
        try {
          await store.update(SandboxType, { ...cur, spec: { n: cur.spec.n + 1 } });
          latencies.push(performance.now() - t0);
        } catch (err) {
          if (!isAsbError(err, 'Conflict')) throw err;
        }
      }
    };
    await Promise.all(names.map(caller));
    const elapsedS = (performance.now() - started) / 1000;
    latencies.sort((a, b) => a - b);
    return {
      updatesPerSec: Math.round(latencies.length / elapsedS),
      p50Ms: Number(percentile(latencies, 50).toFixed(3)),
      p99Ms: Number(percentile(latencies, 99).toFixed(3)),
    };
  } finally {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

if (import.meta.main) {
  const r = await benchStore();
  console.log(`store: ${r.updatesPerSec} CAS updates/s with ${CALLERS} callers, p50 ${r.p50Ms} ms, p99 ${r.p99Ms} ms`);
}
