// Liveness, Prometheus metrics and a status summary of this worker cluster.
import type { Sandbox, SandboxWarmPool } from '../api/types.ts';
import { SandboxType, SandboxWarmPoolType } from '../api/types.ts';
import { principalOf, visibilitySelector } from './access.ts';
import type { WorkerContext } from './deps.ts';
import type { Reply, RequestContext, Route } from '../http/router.ts';
import { sandboxView } from './views.ts';

async function metrics(w: WorkerContext): Promise<Reply> {
  const text = await w.registry.metrics();
  return { status: 200, bytes: Buffer.from(text, 'utf8'), contentType: w.registry.contentType };
}

async function status(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const p = principalOf(ctx);
  const [pools, sandboxes] = await Promise.all([
    w.store.list<SandboxWarmPool>(SandboxWarmPoolType),
    w.store.list<Sandbox>(SandboxType, { labelSelector: visibilitySelector(p) }),
  ]);
  const byPhase: Record<string, number> = {};
  for (const s of sandboxes.items) {
    const phase = sandboxView(s).phase;
    byPhase[phase] = (byPhase[phase] ?? 0) + 1;
  }
  const sync = w.sync?.();
  return {
    status: 200,
    json: {
      // Present when the worker syncs from a hub: whether it is connected and the hub version applied.
      ...(sync === undefined ? {} : { sync: { connected: sync.connected, appliedVersion: sync.appliedVersion } }),
      cluster: { name: w.cluster.name, tag: w.cluster.tag },
      pools: pools.items.map((pool) => ({
        namespace: pool.metadata.namespace ?? w.defaultNamespace,
        name: pool.metadata.name,
        template: pool.spec.sandboxTemplateRef.name,
        replicas: pool.spec.replicas,
        readyReplicas: pool.status?.readyReplicas ?? 0,
      })),
      sandboxes: byPhase,
      version: w.version,
    },
  };
}

export function systemRoutes(w: WorkerContext): Route[] {
  return [
    { method: 'GET', pattern: '/healthz', auth: false, handler: () => Promise.resolve({ status: 200, json: { ok: true } }) },
    { method: 'GET', pattern: '/metrics', handler: () => metrics(w) },
    { method: 'GET', pattern: '/v1/status', handler: (ctx) => status(w, ctx) },
  ];
}
