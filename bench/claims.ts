// Claim benchmarks through the HTTP API of a real worker process with the real local runtime.
//
// "N concurrent" means bursts of N claims issued at the same instant (as when an RL trainer
// starts N rollouts), repeated; each claim's latency is measured from its own request to its
// response. Claims per second come from the largest burst: claims / wall time of the burst.
import { Agent, request } from 'node:http';
import { performance } from 'node:perf_hooks';
import { startBurstClient, type BurstClient } from './burst.ts';

export interface Target {
  apiUrl: string;
  adminKey: string;
}

export interface LatencySummary {
  count: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
}

export function summarize(samples: number[]): LatencySummary {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (q: number): number => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;
  return { count: sorted.length, p50Ms: round(at(0.5)), p99Ms: round(at(0.99)), maxMs: round(sorted.at(-1) ?? Number.NaN) };
}

export function round(n: number, digits = 2): number {
  const f = 10 ** digits;
  return Math.round(n * f) / f;
}

const agent = new Agent({ keepAlive: true, maxSockets: 256 });

/** One JSON request over a kept-alive connection; resolves with status and parsed body. */
export function call<T>(target: Target, method: string, path: string, body?: unknown): Promise<{ status: number; body: T }> {
  const payload = body === undefined ? undefined : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = request(
      `${target.apiUrl}${path}`,
      {
        method,
        agent,
        headers: {
          authorization: `Bearer ${target.adminKey}`,
          ...(payload === undefined ? {} : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) }),
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString();
          try {
            resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as T });
          } catch {
            resolve({ status: res.statusCode ?? 0, body: text as T });
          }
        });
      },
    );
    req.on('error', reject);
    req.end(payload);
  });
}

interface Claimed {
  id: string;
  launchType: string;
}

/** A burst client (burst.ts) whose every request is a warm claim of `template`, as warmClaims sends. */
export function startClaimBursts(target: Target, template: string, concurrency: number): Promise<BurstClient> {
  return startBurstClient({
    url: `${target.apiUrl}/v1/sandboxes`,
    method: 'POST',
    headers: { authorization: `Bearer ${target.adminKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({ template, wait: false, coldStart: false }),
    concurrency,
  });
}

/**
 * Runs `rounds` bursts of `concurrency` warm claims; every claim must be warm. With `pool`, each
 * burst starts only once that pool is fully ready again, so every burst meets a warm pool that
 * is not busy refilling: the figure is the claim path's, not the pod starts' it triggers.
 * The bursts go through the burst client (burst.ts), one kept-alive connection per claim.
 */
export async function warmClaims(target: Target, template: string, concurrency: number, rounds: number, ids: string[], pool?: string): Promise<LatencySummary & { claimsPerSec: number; cold: number }> {
  const client = await startClaimBursts(target, template, concurrency);
  const samples: number[] = [];
  let cold = 0;
  let busyMs = 0;
  try {
    for (let r = 0; r < rounds; r++) {
      if (pool !== undefined) {
        // The pool's status lags its members by the operator's 20 ms coalescing of refills: give
        // it time to see the last burst before trusting "all ready".
        await new Promise((r) => setTimeout(r, 100));
        const { replicas } = await poolReady(target, pool);
        await waitPool(target, pool, replicas, 120_000);
      }
      const burst = await client.burst();
      busyMs += burst.wallMs;
      for (const res of burst.results) {
        if (res.status !== 201) throw new Error(`claim failed: ${res.status} ${res.body}`);
        const claimed = JSON.parse(res.body) as Claimed;
        if (claimed.launchType !== 'warm') cold++;
        ids.push(claimed.id);
        samples.push(res.ms);
      }
    }
  } finally {
    client.close();
  }
  return { ...summarize(samples), claimsPerSec: round((concurrency * rounds) / (busyMs / 1000), 0), cold };
}

export async function poolReady(target: Target, name: string): Promise<{ replicas: number; ready: number }> {
  const res = await call<{ spec: { replicas: number }; status?: { readyReplicas?: number } }>(target, 'GET', `/v1/pools/${name}`);
  return { replicas: res.body.spec.replicas, ready: res.body.status?.readyReplicas ?? 0 };
}

export async function waitPool(target: Target, name: string, want: number, timeoutMs: number): Promise<number> {
  const start = performance.now();
  for (;;) {
    const { ready } = await poolReady(target, name);
    if (ready >= want) return performance.now() - start;
    if (performance.now() - start > timeoutMs) throw new Error(`pool ${name} reached only ${ready}/${want} ready in ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

export function poolObjects(name: string, replicas: number): unknown[] {
  return [
    {
      apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
      kind: 'SandboxTemplate',
      metadata: { name, namespace: 'default' },
      spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'agent-sandbox/base', command: ['sleep', 'infinity'] }] } } },
    },
    {
      apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
      kind: 'SandboxWarmPool',
      metadata: { name, namespace: 'default' },
      spec: { replicas, sandboxTemplateRef: { name } },
    },
  ];
}

/**
 * `count` cold creates of `template` (a template with no warm members), one at a time, each until
 * ready and then deleted: the time of each create, in ms.
 */
export async function coldCreates(target: Target, template: string, count: number): Promise<number[]> {
  const samples: number[] = [];
  for (let i = 0; i < count; i++) {
    const start = performance.now();
    const res = await call<{ id: string; ready: boolean; launchType: string }>(target, 'POST', '/v1/sandboxes', { template, wait: true });
    if (res.status !== 201 || !res.body.ready || res.body.launchType !== 'cold') throw new Error(`cold create failed: ${JSON.stringify(res.body)}`);
    samples.push(performance.now() - start);
    await call(target, 'DELETE', `/v1/sandboxes/${res.body.id}`);
  }
  return samples;
}

/** Waits until no sandbox of `template` is left (deleted ones included, until torn down); the wait in ms. */
export async function waitGone(target: Target, template: string, timeoutMs: number): Promise<number> {
  const start = performance.now();
  for (;;) {
    const res = await call<{ items?: unknown[] }>(target, 'GET', `/v1/sandboxes?template=${template}`);
    if (res.status === 200 && (res.body.items ?? []).length === 0) return performance.now() - start;
    if (performance.now() - start > timeoutMs) throw new Error(`sandboxes of ${template} still there after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
