// The E2B SDK's time to first output: `Sandbox.create()` from a warm pool, then
// `commands.run('echo …')` until its first stdout chunk arrives, through the real local system
// (worker with real sandboxes, router, Envoy) and the unmodified `e2b` npm package, Recipe A
// (apiUrl and sandboxUrl are the edge). Sequential, one sandbox at a time, each killed after; the
// pool is refilled before the next round starts (not timed), so every create is a warm claim.
import { performance } from 'node:perf_hooks';
import { Sandbox } from 'e2b';
import { startTestSystem } from '../test/support/local-system.ts';
import { summarize, waitPool, type LatencySummary } from './claims.ts';

const ROUNDS = 60;
const POOL = 4;
const POOL_TIMEOUT_MS = 30_000;

export interface E2bBench {
  /** create → first stdout chunk of the first command. */
  firstOutput: LatencySummary;
  /** Of which: create returned. */
  create: LatencySummary;
  /** Of which: run started → first stdout chunk. */
  run: LatencySummary;
}

export async function benchE2b(): Promise<E2bBench> {
  const system = await startTestSystem('e2bb', 217, 'bench', POOL);
  try {
    const target = { apiUrl: system.apiUrl, adminKey: system.adminKey };
    const opts = { apiUrl: system.edgeUrl, sandboxUrl: system.edgeUrl, apiKey: system.adminKey };
    const total: number[] = [];
    const create: number[] = [];
    const run: number[] = [];
    // One untimed round: module and connection set-up happen once per program, not per sandbox.
    await (await Sandbox.create('base', opts)).kill();
    for (let i = 0; i < ROUNDS; i++) {
      await waitPool(target, 'base', POOL, POOL_TIMEOUT_MS);
      const t0 = performance.now();
      const sbx = await Sandbox.create('base', opts);
      const t1 = performance.now();
      let first: number | undefined;
      await sbx.commands.run(`echo round ${i}`, {
        onStdout: () => {
          first ??= performance.now();
        },
      });
      if (first === undefined) throw new Error(`round ${i}: the command printed nothing`);
      total.push(first - t0);
      create.push(t1 - t0);
      run.push(first - t1);
      await sbx.kill();
    }
    return { firstOutput: summarize(total), create: summarize(create), run: summarize(run) };
  } finally {
    await system.cleanup();
  }
}

