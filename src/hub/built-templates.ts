// Templates a cluster's builds made, taken into the hub so they sync to every cluster like the
// templates an admin applies: a team's build is then startable on any cluster (its image is in the
// registry the federation's clusters share: each worker's --build-registry names the same one).
// A worker sends every such SandboxTemplate it holds (`built` in contract.ts) when it connects and
// after each change; the hub makes its set for that cluster exactly that: writes what is new or
// different, deletes what the cluster no longer has. What a cluster may send is bounded:
// - SandboxTemplates only, each valid as any applied one (src/api/validate.ts);
// - its own: every name starts with the cluster's tag (a built template's id does, and a pinned
//   build's name starts with its template's id), and it is owned by a team (LABEL.owner);
// - each object is labelled BUILT_ON with the cluster it came from, and only objects with that
//   label naming this cluster are replaced or deleted: an admin's template is never touched.
// A cluster removed at the hub takes its built templates with it (forgetBuiltTemplates): their
// records (builds, tags, logs, and the only way to rebuild or delete them) lived in that cluster's
// worker, so the hub cannot re-home them, and a template no cluster can manage would start for
// ever from an image nobody collects. The team builds it again on a cluster that is still there.
import type { KubeObject } from '../api/meta.ts';
import { LABEL, SandboxTemplateType, type SandboxTemplate } from '../api/types.ts';
import { applyDefaults, validateObject } from '../api/validate.ts';
import { isAsbError } from '../errors.ts';
import { applyObject } from '../store/apply.ts';
import type { ObjectStore } from '../store/store.ts';
import type { Logger } from '../base/log.ts';
import { SYNC_ANNOTATION } from '../api/hub-contract.ts';
import { ClusterType, type Cluster } from '../api/hub-contract.ts';

/** The cluster a built template came from (its Cluster's name at the hub). */
export const BUILT_ON_LABEL = 'asb.dev/built-on';

/** What one `built` message may hold: a cluster's built templates and pins (~1.5 KB each). */
export const MAX_BUILT_TEMPLATES = 500;

function accepted(raw: KubeObject, tag: string, cluster: string): SandboxTemplate | string {
  let obj: SandboxTemplate;
  try {
    obj = applyDefaults(validateObject(raw, 'object')) as SandboxTemplate;
  } catch (err) {
    return err instanceof Error ? err.message : String(err);
  }
  if (obj.kind !== SandboxTemplateType.kind) return `${obj.kind} is not a SandboxTemplate`;
  if (!obj.metadata.name.startsWith(tag)) return `${obj.metadata.name} does not start with the cluster's tag ${tag}`;
  if ((obj.metadata.labels?.[LABEL.owner] ?? '') === '') return `${obj.metadata.name} has no owning team`;
  const annotations = Object.fromEntries(Object.entries(obj.metadata.annotations ?? {}).filter(([k]) => k !== SYNC_ANNOTATION.from && k !== SYNC_ANNOTATION.version));
  return {
    apiVersion: obj.apiVersion,
    kind: obj.kind,
    metadata: { name: obj.metadata.name, namespace: obj.metadata.namespace ?? 'default', labels: { ...obj.metadata.labels, [BUILT_ON_LABEL]: cluster }, annotations },
    spec: obj.spec,
  };
}

/** Makes the hub's built templates of `cluster` the ones it sent; returns how many it wrote or deleted. */
export async function acceptBuiltTemplates(store: ObjectStore, cluster: string, items: readonly KubeObject[], log: Logger): Promise<number> {
  const registered = await store.tryGet<Cluster>(ClusterType, '', cluster);
  const tag = registered?.spec.tag;
  if (tag === undefined || tag === '') {
    log.warn({ cluster }, 'built templates from a cluster without a tag; ignored');
    return 0;
  }
  const wanted = new Map<string, SandboxTemplate>();
  for (const raw of items.slice(0, MAX_BUILT_TEMPLATES)) {
    const obj = accepted(raw, tag, cluster);
    if (typeof obj === 'string') {
      log.warn({ cluster, problem: obj }, 'a built template the cluster sent was refused');
      continue;
    }
    wanted.set(`${obj.metadata.namespace ?? 'default'}/${obj.metadata.name}`, obj);
  }
  let changed = 0;
  const held = await store.list<SandboxTemplate>(SandboxTemplateType, { labelSelector: `${BUILT_ON_LABEL}=${cluster}` });
  const heldByKey = new Map(held.items.map((obj) => [`${obj.metadata.namespace ?? 'default'}/${obj.metadata.name}`, obj]));
  for (const [key, obj] of heldByKey) {
    if (!wanted.has(key) && (await deleteTemplate(store, obj))) changed++;
  }
  for (const [key, obj] of wanted) {
    // Read again only for a name this cluster does not hold yet: it may be an admin's.
    const existing = heldByKey.get(key) ?? (await store.tryGet<SandboxTemplate>(SandboxTemplateType, obj.metadata.namespace ?? 'default', obj.metadata.name));
    // An admin's template of that name is the admin's: a cluster never replaces it.
    if (existing !== undefined && existing.metadata.labels?.[BUILT_ON_LABEL] !== cluster) continue;
    const { action } = await applyObject(store, SandboxTemplateType, obj, existing);
    if (action !== 'unchanged') changed++;
  }
  // Removed while this set was written: what it wrote goes with the rest.
  if (changed > 0 && (await store.tryGet<Cluster>(ClusterType, '', cluster)) === undefined) await forgetBuiltTemplates(store, cluster);
  return changed;
}

/** Deletes every built template `cluster` sent (a removed cluster's); returns how many went. */
export async function forgetBuiltTemplates(store: ObjectStore, cluster: string): Promise<number> {
  const held = await store.list<SandboxTemplate>(SandboxTemplateType, { labelSelector: `${BUILT_ON_LABEL}=${cluster}` });
  let removed = 0;
  for (const obj of held.items) if (await deleteTemplate(store, obj)) removed++;
  return removed;
}

/** Deletes a built template; false when it was already gone. */
async function deleteTemplate(store: ObjectStore, obj: SandboxTemplate): Promise<boolean> {
  try {
    await store.delete(SandboxTemplateType, obj.metadata.namespace ?? 'default', obj.metadata.name);
    return true;
  } catch (err) {
    if (isAsbError(err, 'NotFound')) return false;
    throw err;
  }
}
