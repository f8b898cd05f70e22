// Claims on Kubernetes: a real kube-apiserver on a real etcd (fsync on: the real write path),
// our CRDs, a real node (test/support/kube-node.ts: the kubelet on containerd and runc), and a
// worker process with --store=kube --runtime=kube.
//
// Through the kubelet: a cold Sandbox to Ready (create with wait, a template with no
// pool, the image already in containerd's cache, one at a time: the Pod's schedule, sandbox, CNI
// and container start), and a wake from Suspended (resume with wait of a sandbox once it is
// Hibernated, its Pod deleted: a new Pod).
// Claims go through the worker's REST API as in bench/claims.ts (bursts of N at once against a
// full pool, p50/p99 per claim, claims per second over the bursts' wall time).
//
// API-server writes per claim come from the worker's own count of them (asb_store_write_seconds
// by op, every write its store sends) before and after the 20-concurrent bursts, once the pool is
// full again: the bind itself (update) and everything the claims set off (the pool's refill:
// member creates, their Pods, their status writes, the pool's status). The pod runtime writes
// through the worker's store, so its Pod creates are in the same count.
//
// The floor: the same 20-at-once bursts of one update each, sent straight to the API server by
// this process (no worker in the path, nothing set off), on the pool's own Ready members. What
// the API server and etcd take for one write of these objects is what a claim cannot go below.
import { performance } from 'node:perf_hooks';
import { installCrds } from '../test/support/kube-store.ts';
import { startKubeApiServer, type KubeApiServer } from '../test/support/kube-apiserver.ts';
import { startKubeNode } from '../test/support/kube-node.ts';
import { removeDataDir, startWorkerProcess } from '../test/support/worker-process.ts';
import { call, poolObjects, round, summarize, waitPool, warmClaims, type LatencySummary, type Target } from './claims.ts';

const TAG = 'kbch';
const POOL = 'kubebench';
const POOL_SIZE = 40;
/**
 * Fewer than on the embedded store (100 and 10): every claimed member stays a running Pod until the
 * end, and the node holds 250 (kubelet maxPods); 40 members plus 90 claims' refills fit.
 */
const RUNS = [[1, 30], [20, 3]] as const;
const COLD = 'kubecold';
const COLD_STARTS = 20;
const WAKES = 10;

export interface KubeBench {
  apiServerReadyMs: number;
  /** Create with wait → Ready, one at a time, no pool: through the kubelet. */
  coldReady: LatencySummary;
  /** Resume with wait of a hibernated sandbox → Ready. */
  wake: LatencySummary;
  fill40Ms: number;
  claims1: LatencySummary & { claimsPerSec: number };
  claims20: LatencySummary & { claimsPerSec: number };
  /** 20 concurrent bare updates of pool members straight to the API server: the floor of claims20. */
  bareUpdates20: LatencySummary & { updatesPerSec: number; workerWrites: number };
  /** Over the 20-concurrent bursts, per claim. */
  writesPerClaim: {
    /** The bind: one compare-and-swap update of the member. */
    claimPath: number;
    /** Every write the worker sent, the refill (and its Pods) included. */
    total: number;
    /** The same by op (update, create, updateStatus, delete). */
    byOp: Record<string, number>;
  };
}

export async function benchKube(): Promise<KubeBench> {
  const kube = await startKubeApiServer();
  try {
    const kubelet = await startKubeNode(kube);
    try {
      await installCrds(kube.kubeconfigPath);
      const w = await startWorkerProcess({
        clusterTag: TAG,
        subnetOctet: 229, // unused with --runtime=kube
        basePool: 0,
        extraArgs: ['--store=kube', '--runtime=kube', '--kubeconfig', kube.kubeconfigPath],
      });
      try {
        return await measure(kube, { apiUrl: w.apiUrl, adminKey: w.adminKey });
      } finally {
        await w.stop();
        removeDataDir(w.dataDir);
      }
    } finally {
      await kubelet.stop();
    }
  } finally {
    await kube.stop();
  }
}

async function measure(kube: KubeApiServer, target: Target): Promise<KubeBench> {
  const applied = await call(target, 'POST', '/v1/apply', { objects: poolObjects(POOL, POOL_SIZE) });
  if (applied.status !== 200) throw new Error(`apply failed: ${JSON.stringify(applied.body)}`);
  const fillMs = await waitPool(target, POOL, POOL_SIZE, 180_000);
  const ids: string[] = [];
  const results: Partial<KubeBench> = { apiServerReadyMs: kube.readyMs, fill40Ms: round(fillMs, 0), ...await coldAndWake(target) };
  for (const [concurrency, rounds] of RUNS) {
    // The count starts on a full, settled pool and ends on one: the refills of these claims are in it.
    await settle(target);
    const storeBefore = await storeWrites(target);
    const s = await warmClaims(target, POOL, concurrency, rounds, ids, POOL);
    if (s.cold > 0) throw new Error(`${s.cold} claims were cold: pool too small for the benchmark`);
    await settle(target);
    const storeAfter = await storeWrites(target);
    const { cold: _cold, ...summary } = s;
    if (concurrency === 1) results.claims1 = summary;
    else {
      results.claims20 = summary;
      const claims = concurrency * rounds;
      const made = writesBetween(storeBefore, storeAfter);
      const byOp = Object.fromEntries([...made].map(([op, n]) => [op, round(n / claims)]));
      results.writesPerClaim = { claimPath: byOp.update ?? 0, total: round(total(made) / claims), byOp };
    }
  }
  await Promise.all(ids.map((id) => call(target, 'DELETE', `/v1/sandboxes/${id}`)));
  await settle(target);
  const before = await storeWrites(target);
  const bare = await bareUpdates(kube, 20, 10);
  await settle(target);
  // Members changed behind the worker's back must not set it writing, or this is no floor.
  const workerWrites = total(writesBetween(before, await storeWrites(target)));
  results.bareUpdates20 = { ...bare, workerWrites };
  return results as KubeBench;
}

/** COLD_STARTS creates with wait of a pool-less template, one at a time; WAKES of them paused and resumed with wait; all deleted after. */
async function coldAndWake(target: Target): Promise<{ coldReady: LatencySummary; wake: LatencySummary }> {
  const applied = await call(target, 'POST', '/v1/apply', { objects: poolObjects(COLD, 0) });
  if (applied.status !== 200) throw new Error(`apply failed: ${JSON.stringify(applied.body)}`);
  const create = async (): Promise<{ id: string; ms: number }> => {
    const start = performance.now();
    const res = await call<{ id: string; ready?: boolean }>(target, 'POST', '/v1/sandboxes', { template: COLD, wait: true });
    const ms = performance.now() - start;
    if (res.status !== 201 || res.body.ready !== true) throw new Error(`cold create failed: ${res.status} ${JSON.stringify(res.body)}`);
    return { id: res.body.id, ms };
  };
  const ids = [(await create()).id]; // the first pulls nothing (pool members did) but warms the path: not counted
  const cold: number[] = [];
  for (let i = 0; i < COLD_STARTS; i++) {
    const c = await create();
    ids.push(c.id);
    cold.push(c.ms);
  }
  const wake: number[] = [];
  for (const id of ids.slice(1, 1 + WAKES)) {
    const paused = await call(target, 'POST', `/v1/sandboxes/${id}/pause`);
    if (paused.status !== 200) throw new Error(`pause failed: ${paused.status} ${JSON.stringify(paused.body)}`);
    // From Suspended: the hibernation (the Pod's graceful deletion through the kubelet) is done
    // before the clock starts, so the figure is the wake's alone.
    await waitHibernated(target, id);
    const start = performance.now();
    const resumed = await call<{ ready?: boolean }>(target, 'POST', `/v1/sandboxes/${id}/resume`, { wait: true });
    if (resumed.status !== 200 || resumed.body.ready !== true) throw new Error(`resume failed: ${resumed.status} ${JSON.stringify(resumed.body)}`);
    wake.push(performance.now() - start);
  }
  await Promise.all(ids.map((id) => call(target, 'DELETE', `/v1/sandboxes/${id}`)));
  return { coldReady: summarize(cold), wake: summarize(wake) };
}

/** Polls the sandbox (every 50 ms, 60 s at most) until its phase is Hibernated. */
async function waitHibernated(target: Target, id: string): Promise<void> {
  const deadline = performance.now() + 60_000;
  while (performance.now() < deadline) {
    if ((await call<{ phase?: string }>(target, 'GET', `/v1/sandboxes/${id}`)).body.phase === 'Hibernated') return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`sandbox ${id} never reached Hibernated`);
}

interface Member {
  metadata: { name: string; annotations?: Record<string, string> };
}

/** Bursts of `concurrency` updates (an annotation changed) of Ready pool members, PUT by this process with their resourceVersion, as a claim's bind is. */
async function bareUpdates(kube: KubeApiServer, concurrency: number, rounds: number): Promise<LatencySummary & { updatesPerSec: number }> {
  const path = '/apis/agents.x-k8s.io/v1alpha1/namespaces/default/sandboxes';
  const listed = await kube.request<{ items: Member[] }>('GET', `${path}?labelSelector=${encodeURIComponent(`agents.x-k8s.io/warm-pool-sandbox=${POOL}`)}`);
  const members = listed.body.items.slice(0, concurrency);
  if (members.length < concurrency) throw new Error(`only ${members.length} pool members for ${concurrency} concurrent updates`);
  const samples: number[] = [];
  let busyMs = 0;
  for (let r = 0; r < rounds; r++) {
    const burstStart = performance.now();
    await Promise.all(
      members.map(async (m, i) => {
        m.metadata.annotations = { ...m.metadata.annotations, 'bench.asb.dev/round': String(r) };
        const start = performance.now();
        const res = await kube.request<Member>('PUT', `${path}/${m.metadata.name}`, { body: m });
        samples.push(performance.now() - start);
        if (res.status !== 200) throw new Error(`bare update failed: ${res.status} ${JSON.stringify(res.body)}`);
        members[i] = res.body;
      }),
    );
    busyMs += performance.now() - burstStart;
  }
  return { ...summarize(samples), updatesPerSec: round((concurrency * rounds) / (busyMs / 1000), 0) };
}

/** The pool full and its status written: nothing of the last burst still to come. */
async function settle(target: Target): Promise<void> {
  await waitPool(target, POOL, POOL_SIZE, 120_000);
  // The pool's status follows its members after the operator's 20 ms coalescing; a quiet 500 ms
  // with no write means the refill is done.
  let last = -1;
  const deadline = performance.now() + 30_000;
  for (;;) {
    const now = total(await storeWrites(target));
    if (now === last) return;
    if (performance.now() > deadline) throw new Error('the worker never stopped writing');
    last = now;
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** Writes by op from the `before` count to the `after` one. */
function writesBetween(before: Map<string, number>, after: Map<string, number>): Map<string, number> {
  return new Map([...after].map(([op, n]) => [op, n - (before.get(op) ?? 0)]));
}

function total(writes: Map<string, number>): number {
  return [...writes.values()].reduce((a, b) => a + b, 0);
}

/** asb_store_write_seconds_count by op, from the worker's /metrics. */
async function storeWrites(target: Target): Promise<Map<string, number>> {
  const res = await call<string>(target, 'GET', '/metrics');
  const counts = new Map<string, number>();
  for (const m of res.body.matchAll(/^asb_store_write_seconds_count\{op="([^"]+)"\} (\d+)$/gm)) counts.set(m[1] ?? '', Number(m[2]));
  return counts;
}
