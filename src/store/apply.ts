// `apply` semantics shared by every API that takes whole objects (the worker's /v1/apply and
// PUTs, the hub's templates): create when absent; otherwise merge the user's spec, labels and
// annotations over what is stored (keeping system metadata) and write only when that changes
// something, so re-applying a file is a no-op.
import type { KubeObject, ResourceType } from '../api/meta.ts';
import type { ObjectStore } from './store.ts';

export type ApplyAction = 'created' | 'configured' | 'unchanged';

function sameContent(a: KubeObject, b: KubeObject): boolean {
  return JSON.stringify([a.spec, a.metadata.labels ?? {}, a.metadata.annotations ?? {}]) === JSON.stringify([b.spec, b.metadata.labels ?? {}, b.metadata.annotations ?? {}]);
}

/** The object to write over `existing`: the user's spec, labels and annotations merged in. */
function merged<T extends KubeObject>(existing: T, desired: T): T {
  return {
    ...existing,
    spec: desired.spec,
    metadata: {
      ...existing.metadata,
      labels: { ...existing.metadata.labels, ...desired.metadata.labels },
      annotations: { ...existing.metadata.annotations, ...desired.metadata.annotations },
    },
  };
}

export async function applyObject<T extends KubeObject>(store: ObjectStore, rt: ResourceType, obj: T, existing: T | undefined): Promise<{ action: ApplyAction; object: T }> {
  if (existing === undefined) return { action: 'created', object: await store.create(rt, obj) };
  const next = merged(existing, obj);
  if (sameContent(next, existing)) return { action: 'unchanged', object: existing };
  return { action: 'configured', object: await store.update(rt, next) };
}
