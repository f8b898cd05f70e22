// What one write does to one object, decided as a pure function of the object's current state.
// The SQLite store runs these in queue order against the state its earlier writes in the same
// batch left behind, then persists the decisions in one transaction (see sqlite-commit.ts).
import { randomUUID } from 'node:crypto';
import { apiVersionOf, type KubeObject, type ObjectMeta, type ResourceType } from '../api/meta.ts';
import { AsbError, invalid } from '../errors.ts';
import { CLUSTER_SCOPE, type DeleteOptions } from './store.ts';

export type WriteRequest =
  | { op: 'create'; obj: KubeObject }
  | { op: 'update'; obj: KubeObject }
  | { op: 'updateStatus'; obj: KubeObject }
  | { op: 'delete'; namespace: string; name: string; opts: DeleteOptions };

export type WriteOp = WriteRequest['op'];

/** A write either changes nothing (noop), stores a new state (put) or removes the object. */
export type Decision =
  | { kind: 'noop'; result: KubeObject }
  | { kind: 'put'; type: 'ADDED' | 'MODIFIED'; namespace: string; name: string; object: KubeObject; prev: KubeObject | undefined }
  | { kind: 'remove'; namespace: string; name: string; object: KubeObject; prev: KubeObject };

export interface DecideContext {
  rt: ResourceType;
  /** The object as earlier writes (committed or earlier in this batch) left it. */
  lookup(namespace: string, name: string): KubeObject | undefined;
  /** The resourceVersion this write gets if it changes anything. */
  rv: string;
  /** creationTimestamp / deletionTimestamp for this write (RFC 3339). */
  now: string;
}

// generateName: 5 characters of [a-z0-9] as the apiserver does: 36^5 = 60M names per prefix,
// so 8 attempts only fail when a prefix is already crowded beyond any realistic pool.
const SUFFIX_ALPHABET = 'abcdefghijklmnopqrstuvwxyz0123456789';
const SUFFIX_LENGTH = 5;
const GENERATE_ATTEMPTS = 8;
const MAX_NAME_LENGTH = 253;

export function randomSuffix(): string {
  let out = '';
  for (let i = 0; i < SUFFIX_LENGTH; i++) out += SUFFIX_ALPHABET[Math.floor(Math.random() * SUFFIX_ALPHABET.length)] ?? 'x';
  return out;
}

export function describeObject(rt: ResourceType, namespace: string, name: string): string {
  return rt.namespaced ? `${rt.kind} "${namespace}/${name}"` : `${rt.kind} "${name}"`;
}

/** The namespace an object is keyed under: CLUSTER_SCOPE for cluster-scoped kinds. */
export function scopeOf(rt: ResourceType, namespace: string | undefined, name: string): string {
  if (!rt.namespaced) return CLUSTER_SCOPE;
  if (namespace === undefined || namespace === '') {
    throw invalid(rt.kind, name, [{ field: 'metadata.namespace', message: `required: ${rt.kind} is namespaced` }]);
  }
  return namespace;
}

function checkName(rt: ResourceType, name: string): void {
  const problem =
    name.length > MAX_NAME_LENGTH ? `must be at most ${MAX_NAME_LENGTH} characters`
    : name.includes('/') || name.includes('\u0000') ? 'must not contain "/" or NUL'
    : name === '.' || name === '..' ? 'must not be "." or ".."'
    : undefined;
  if (problem !== undefined) throw invalid(rt.kind, name, [{ field: 'metadata.name', message: problem }]);
}

/** Structural equality of JSON-like values; a property set to undefined equals an absent one. */
export function jsonEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a) && Array.isArray(b)) {
    return a.length === b.length && a.every((v, i) => jsonEqual(v, b[i]));
  }
  const ra = a as Record<string, unknown>;
  const rb = b as Record<string, unknown>;
  const keys = new Set([...Object.keys(ra), ...Object.keys(rb)]);
  for (const key of keys) if (!jsonEqual(ra[key], rb[key])) return false;
  return true;
}

/**
 * True when two versions differ outside metadata and status: what moves generation, as for the
 * apiserver's custom resources. A warm claim changes only labels and owners; bumping generation
 * for it made the sandbox controller rewrite status.observedGeneration of every claimed sandbox,
 * one more commit and one more round of watch events per claim.
 */
function contentChanged(a: KubeObject, b: KubeObject): boolean {
  const ra = a as unknown as Record<string, unknown>;
  const rb = b as unknown as Record<string, unknown>;
  for (const key of new Set([...Object.keys(ra), ...Object.keys(rb)])) {
    if (key === 'metadata' || key === 'status') continue;
    if (!jsonEqual(ra[key], rb[key])) return true;
  }
  return false;
}

function metadataOf(rt: ResourceType, obj: KubeObject): ObjectMeta {
  if (typeof obj !== 'object' || typeof obj.metadata !== 'object') {
    throw invalid(rt.kind, '', [{ field: 'metadata', message: 'required' }]);
  }
  return obj.metadata;
}

function withStatus(obj: KubeObject, status: unknown): KubeObject {
  const out: KubeObject = { ...obj };
  if (status === undefined) delete out.status;
  else out.status = status;
  return out;
}

function mustExist(ctx: DecideContext, namespace: string, name: string): KubeObject {
  const cur = ctx.lookup(namespace, name);
  if (cur === undefined) throw new AsbError('NotFound', `${describeObject(ctx.rt, namespace, name)} not found`);
  return cur;
}

function checkPreconditions(ctx: DecideContext, cur: KubeObject, rv: string | undefined, uid: string | undefined): void {
  const what = describeObject(ctx.rt, cur.metadata.namespace ?? CLUSTER_SCOPE, cur.metadata.name);
  if (uid !== undefined && uid !== '' && uid !== cur.metadata.uid) {
    throw new AsbError('Conflict', `${what}: precondition failed: uid ${uid} given, the object has uid ${cur.metadata.uid ?? ''}`);
  }
  if (rv !== undefined && rv !== '' && rv !== cur.metadata.resourceVersion) {
    throw new AsbError(
      'Conflict',
      `${what} has been modified: resourceVersion ${rv} is stale, the object is at ${cur.metadata.resourceVersion ?? ''}; read it again and retry`,
    );
  }
}

function decideCreate(ctx: DecideContext, input: KubeObject): Decision {
  const { rt } = ctx;
  const meta = metadataOf(rt, input);
  const given = meta.name as string | undefined;
  const namespace = scopeOf(rt, meta.namespace, given ?? meta.generateName ?? '');
  let name: string;
  if (given !== undefined && given !== '') {
    if (ctx.lookup(namespace, given) !== undefined) {
      throw new AsbError('AlreadyExists', `${describeObject(rt, namespace, given)} already exists`);
    }
    name = given;
  } else if (meta.generateName !== undefined && meta.generateName !== '') {
    const prefix = meta.generateName;
    const free = Array.from({ length: GENERATE_ATTEMPTS }, () => prefix + randomSuffix()).find((n) => ctx.lookup(namespace, n) === undefined);
    if (free === undefined) {
      throw new AsbError('AlreadyExists', `${rt.kind}: no free name with prefix "${prefix}" after ${GENERATE_ATTEMPTS} attempts; retry`);
    }
    name = free;
  } else {
    throw invalid(rt.kind, '', [{ field: 'metadata.name', message: 'name or generateName is required' }]);
  }
  checkName(rt, name);
  const metadata: ObjectMeta = { ...meta, name, uid: randomUUID(), resourceVersion: ctx.rv, generation: 1, creationTimestamp: ctx.now };
  delete metadata.deletionTimestamp;
  if (rt.namespaced) metadata.namespace = namespace;
  else delete metadata.namespace;
  // Like the apiserver for kinds with a status subresource: status is not set on create, only
  // through updateStatus, so a controller's view of status always comes from the controller.
  const object = withStatus({ ...input, apiVersion: apiVersionOf(rt), kind: rt.kind, metadata }, undefined);
  return { kind: 'put', type: 'ADDED', namespace, name, object, prev: undefined };
}

function decideUpdate(ctx: DecideContext, input: KubeObject): Decision {
  const { rt } = ctx;
  const meta = metadataOf(rt, input);
  const namespace = scopeOf(rt, meta.namespace, meta.name);
  const cur = mustExist(ctx, namespace, meta.name);
  checkPreconditions(ctx, cur, meta.resourceVersion, meta.uid);
  const curMeta = cur.metadata;
  // System fields come from the stored object whatever the caller sent.
  const metadata: ObjectMeta = {
    ...meta,
    name: curMeta.name,
    uid: curMeta.uid ?? '',
    resourceVersion: curMeta.resourceVersion ?? '',
    generation: curMeta.generation ?? 1,
    creationTimestamp: curMeta.creationTimestamp ?? ctx.now,
  };
  if (curMeta.namespace === undefined) delete metadata.namespace;
  else metadata.namespace = curMeta.namespace;
  if (curMeta.deletionTimestamp === undefined) delete metadata.deletionTimestamp;
  else metadata.deletionTimestamp = curMeta.deletionTimestamp;
  const candidate = withStatus({ ...input, apiVersion: apiVersionOf(rt), kind: rt.kind, metadata }, cur.status);
  // An update that changes nothing writes nothing and keeps the version, as the apiserver does:
  // controllers that re-apply the same object must not wake every watcher.
  if (jsonEqual(candidate, cur)) return { kind: 'noop', result: cur };
  if (curMeta.deletionTimestamp !== undefined) {
    const before = new Set(curMeta.finalizers ?? []);
    const added = (metadata.finalizers ?? []).filter((f) => !before.has(f));
    if (added.length > 0) {
      throw invalid(rt.kind, curMeta.name, [
        { field: 'metadata.finalizers', message: `no new finalizers can be added while the object is being deleted (${added.join(', ')})` },
      ]);
    }
  }
  metadata.resourceVersion = ctx.rv;
  if (contentChanged(candidate, cur)) metadata.generation = (curMeta.generation ?? 1) + 1;
  if (metadata.deletionTimestamp !== undefined && (metadata.finalizers ?? []).length === 0) {
    return { kind: 'remove', namespace, name: curMeta.name, object: candidate, prev: cur };
  }
  return { kind: 'put', type: 'MODIFIED', namespace, name: curMeta.name, object: candidate, prev: cur };
}

function decideUpdateStatus(ctx: DecideContext, input: KubeObject): Decision {
  const meta = metadataOf(ctx.rt, input);
  const namespace = scopeOf(ctx.rt, meta.namespace, meta.name);
  const cur = mustExist(ctx, namespace, meta.name);
  checkPreconditions(ctx, cur, meta.resourceVersion, meta.uid);
  if (jsonEqual(input.status, cur.status)) return { kind: 'noop', result: cur };
  const object = withStatus({ ...cur, metadata: { ...cur.metadata, resourceVersion: ctx.rv } }, input.status);
  return { kind: 'put', type: 'MODIFIED', namespace, name: cur.metadata.name, object, prev: cur };
}

function decideDelete(ctx: DecideContext, namespace: string, name: string, opts: DeleteOptions): Decision {
  const scoped = ctx.rt.namespaced ? namespace : CLUSTER_SCOPE;
  const cur = mustExist(ctx, scoped, name);
  checkPreconditions(ctx, cur, opts.resourceVersion, opts.uid);
  if ((cur.metadata.finalizers ?? []).length > 0) {
    // Already being deleted: nothing more to do until the finalizers are removed.
    if (cur.metadata.deletionTimestamp !== undefined) return { kind: 'noop', result: cur };
    const metadata: ObjectMeta = {
      ...cur.metadata,
      deletionTimestamp: ctx.now,
      generation: (cur.metadata.generation ?? 1) + 1,
      resourceVersion: ctx.rv,
    };
    return { kind: 'put', type: 'MODIFIED', namespace: scoped, name, object: { ...cur, metadata }, prev: cur };
  }
  const object = { ...cur, metadata: { ...cur.metadata, resourceVersion: ctx.rv } };
  return { kind: 'remove', namespace: scoped, name, object, prev: cur };
}

/** Decides one write; throws AsbError (NotFound, AlreadyExists, Conflict, Invalid) to refuse it. */
export function decide(ctx: DecideContext, req: WriteRequest): Decision {
  switch (req.op) {
    case 'create':
      return decideCreate(ctx, req.obj);
    case 'update':
      return decideUpdate(ctx, req.obj);
    case 'updateStatus':
      return decideUpdateStatus(ctx, req.obj);
    case 'delete':
      return decideDelete(ctx, req.namespace, req.name, req.opts);
  }
}
