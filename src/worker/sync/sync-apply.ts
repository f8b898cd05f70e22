// How a worker applies what the hub sends to its own store, and where it keeps the last hub
// version it applied, so that a restarted worker resumes where it was and the KeyRing and the
// operator (which read only this store) go on working while the hub is away.
//
// Applying is idempotent: an object whose labels, annotations and spec already match is not
// written again, so replaying a delta or a snapshot after a crash between "applied" and
// "persisted the version" changes nothing. Synced copies carry `asb.dev/synced-from: hub` and
// the hub version they came from (`asb.dev/synced-version`); only marked objects are ever
// deleted by sync, so objects made locally (the worker's own admin key, its built-ins) stay.
import type { KubeObject, ResourceType } from '../../api/meta.ts';
import { apiVersionOf } from '../../api/meta.ts';
import { ApiKeyType, ASB_GROUP, SandboxTemplateType } from '../../api/types.ts';
import { isAsbError } from '../../errors.ts';
import { ClusterType, SYNC_ANNOTATION, type SyncItem, type SyncKind } from '../../api/hub-contract.ts';
import { CLUSTER_SCOPE, type ObjectStore } from '../../store/store.ts';


/** The worker's record of its sync with the hub (one object, named `hub`). */
export interface SyncState extends KubeObject {
  spec: { appliedVersion: number };
  /** The sync agent's link to the hub, written on each change (hub-link.ts). */
  status?: { hubConnected: boolean; lastTransitionTime: string };
}

export const SyncStateType: ResourceType = { group: ASB_GROUP, version: 'v1alpha1', kind: 'SyncState', plural: 'syncstates', namespaced: false };
export const STATE_NAME = 'hub';

const TYPES: Record<SyncKind, ResourceType> = { ApiKey: ApiKeyType, SandboxTemplate: SandboxTemplateType, Cluster: ClusterType };

export async function loadAppliedVersion(store: ObjectStore): Promise<number> {
  const state = await store.tryGet<SyncState>(SyncStateType, CLUSTER_SCOPE, STATE_NAME);
  return state?.spec.appliedVersion ?? 0;
}

export function newSyncState(appliedVersion: number): SyncState {
  return { apiVersion: apiVersionOf(SyncStateType), kind: SyncStateType.kind, metadata: { name: STATE_NAME }, spec: { appliedVersion } };
}

function saveAppliedVersion(store: ObjectStore, version: number): Promise<unknown> {
  const obj = newSyncState(version);
  return store.update(SyncStateType, obj).catch((err: unknown) => {
    if (isAsbError(err, 'NotFound')) return store.create(SyncStateType, obj);
    throw err;
  });
}

function isSynced(obj: KubeObject): boolean {
  return obj.metadata.annotations?.[SYNC_ANNOTATION.from] === 'hub';
}

/** The worker's copy: the hub's name, labels, annotations and spec, marked as synced. */
function localCopy(obj: KubeObject, version: number): KubeObject {
  const { name, namespace, labels, annotations } = obj.metadata;
  const copy: KubeObject = {
    apiVersion: obj.apiVersion,
    kind: obj.kind,
    metadata: {
      name,
      ...(namespace === undefined || namespace === '' ? {} : { namespace }),
      ...(labels === undefined ? {} : { labels }),
      annotations: { ...annotations, [SYNC_ANNOTATION.from]: 'hub', [SYNC_ANNOTATION.version]: String(version) },
    },
  };
  if (obj.spec !== undefined) copy.spec = obj.spec;
  return copy;
}

function sameContent(a: KubeObject, b: KubeObject): boolean {
  const content = (o: KubeObject): string => {
    const { [SYNC_ANNOTATION.version]: _v, ...annotations } = o.metadata.annotations ?? {};
    return JSON.stringify([o.metadata.labels ?? {}, annotations, o.spec ?? null]);
  };
  return content(a) === content(b);
}

/** Writes one item unless the store already holds the same; returns whether it wrote. */
async function applyItem(store: ObjectStore, item: SyncItem, version: number): Promise<boolean> {
  const rt = TYPES[item.kind];
  const current = await store.tryGet(rt, item.namespace, item.name);
  if (item.object === undefined) {
    if (current === undefined || !isSynced(current)) return false;
    await store.delete(rt, item.namespace, item.name).catch((err: unknown) => {
      if (!isAsbError(err, 'NotFound')) throw err;
    });
    return true;
  }
  const desired = localCopy(item.object, version);
  if (current !== undefined && isSynced(current) && sameContent(current, desired)) return false;
  if (current === undefined) {
    try {
      await store.create(rt, desired);
      return true;
    } catch (err) {
      if (!isAsbError(err, 'AlreadyExists')) throw err;
    }
  }
  // The hub is the source of truth: a local object of the same name is replaced by the hub's.
  await store.update(rt, desired);
  return true;
}

/** Applies deltas (in version order) and persists the last version. Returns the objects written. */
export async function applyDeltas(store: ObjectStore, deltas: readonly { version: number; item: SyncItem }[]): Promise<number> {
  const last = deltas.at(-1);
  if (last === undefined) return 0;
  // Several changes to one object in a batch: only the last matters.
  const latest = new Map<string, { version: number; item: SyncItem }>();
  for (const d of deltas) {
    const key = `${d.item.kind}/${d.item.namespace}/${d.item.name}`;
    latest.delete(key);
    latest.set(key, d);
  }
  const written = await Promise.all([...latest.values()].map((d) => applyItem(store, d.item, d.version)));
  await saveAppliedVersion(store, last.version);
  return written.filter(Boolean).length;
}

/** Replaces the synced copy with a snapshot: writes what differs, deletes synced objects it lacks. */
export async function applySnapshot(store: ObjectStore, version: number, items: readonly SyncItem[]): Promise<number> {
  const wanted = new Set(items.map((i) => `${i.kind}/${i.namespace}/${i.name}`));
  const stale: SyncItem[] = [];
  for (const kind of Object.keys(TYPES) as SyncKind[]) {
    const listed = await store.list(TYPES[kind]);
    for (const obj of listed.items) {
      const namespace = obj.metadata.namespace ?? CLUSTER_SCOPE;
      if (isSynced(obj) && !wanted.has(`${kind}/${namespace}/${obj.metadata.name}`)) stale.push({ kind, namespace, name: obj.metadata.name });
    }
  }
  const written = await Promise.all([...items, ...stale].map((item) => applyItem(store, item, version)));
  await saveAppliedVersion(store, version);
  return written.filter(Boolean).length;
}

/** Records that everything up to `version` is applied (the hub said nothing else changed). */
export function advanceTo(store: ObjectStore, version: number): Promise<unknown> {
  return saveAppliedVersion(store, version);
}
