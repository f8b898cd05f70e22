// Get, list, create, update, patch, delete and deletecollection of our four kinds through the
// Kubernetes API, with the REST API's gate and tenancy (src/worker/routes-objects.ts, access.ts,
// pod-admission.ts):
// - objects pass prepare() (validation, defaults, the owner label from the key, reserved labels
//   and annotations refused for team keys) and, for a team key, the pod-security check;
// - a team key sees and writes only its team's Sandboxes and SandboxClaims; anything else of
//   those kinds is NotFound, exactly as if absent; it reads templates and pools and writes
//   neither (Forbidden);
// - a new Sandbox takes its id for the whole cluster first (index.reserve), as /v1/apply does;
// - status is the controllers': only an admin key writes the status subresource.
// Objects are stored in one version and served in the version the path asks for: both versions
// share one schema (src/api/crd.ts), so only apiVersion differs.
import type { KubeObject, ResourceType } from '../api/meta.ts';
import { LABEL, SandboxTemplateType, SandboxType, type Sandbox, type SandboxTemplate } from '../api/types.ts';
import type { Principal } from '../auth/keyring.ts';
import { AsbError, invalid, isAsbError } from '../errors.ts';
import { randomSuffix } from '../store/mutation.ts';
import type { ListOptions } from '../store/store.ts';
import { canSee } from '../worker/access.ts';
import { usableBy } from '../worker/team-templates.ts';
import type { WorkerContext } from '../worker/deps.ts';
import { tenantPodProblems } from '../worker/pod-admission.ts';
import { toAsbError } from '../http/problem.ts';
import { prepare, TEAM_KINDS, tellHub } from '../worker/routes-objects.ts';
import { jsonPatch, mergePatch } from './patch.ts';
import { intParam, matchesFields, parseFieldSelector, refuseDryRun, type ResourcePath } from './request.ts';
import { asVersion, qualifiedResource } from './resources.ts';
import { deletedStatus, notFoundError } from './status.ts';

export interface Answer {
  status: number;
  body: unknown;
}

export function isTeamKind(rt: ResourceType): boolean {
  return TEAM_KINDS.has(rt.kind);
}

export function visibleTo(p: Principal, rt: ResourceType, obj: KubeObject): boolean {
  // A template a team built is that team's; the admins' templates serve everyone.
  if (rt.kind === SandboxTemplateType.kind) return p.admin || usableBy(p, obj as SandboxTemplate);
  return !isTeamKind(rt) || canSee(p, obj);
}

/** The label selector a list or watch runs with: the caller's, narrowed to the team's own objects for a team key. */
export function scopedSelector(p: Principal, rt: ResourceType, selector: string | null): string | undefined {
  const user = selector === null || selector.trim() === '' ? undefined : selector;
  if (p.admin || !isTeamKind(rt)) return user;
  const own = `${LABEL.owner}=${p.team}`;
  return user === undefined ? own : `${user},${own}`;
}

function forbidden(p: Principal, rp: ResourcePath, verb: string, why: string): AsbError {
  const rt = rp.served.rt;
  const where = rp.namespace === undefined ? '' : ` in the namespace "${rp.namespace}"`;
  return new AsbError('Forbidden', `${qualifiedResource(rt)}${rp.name === undefined ? '' : ` "${rp.name}"`} is forbidden: key ${p.prefix} of team "${p.team}" cannot ${verb} resource "${rt.plural}${rp.subresource === undefined ? '' : `/${rp.subresource}`}" in API group "${rt.group}"${where}: ${why}`);
}

export function requireWrite(p: Principal, rp: ResourcePath, verb: string): void {
  if (p.admin) return;
  if (rp.subresource === 'status') throw forbidden(p, rp, verb, 'status is written by the controllers; it needs an admin API key');
  if (!isTeamKind(rp.served.rt)) throw forbidden(p, rp, verb, `writing a ${rp.served.rt.kind} needs an admin API key`);
}

export function nameOf(rp: ResourcePath): string {
  return rp.name ?? '';
}

function namespaceOf(rp: ResourcePath, w: WorkerContext): string {
  return rp.namespace ?? w.defaultNamespace;
}

/** The object if it exists and the key may see it; NotFound in the apiserver's words otherwise. */
export async function visible(w: WorkerContext, p: Principal, rp: ResourcePath): Promise<KubeObject> {
  const rt = rp.served.rt;
  const obj = await w.store.tryGet(rt, namespaceOf(rp, w), nameOf(rp));
  if (obj === undefined || !visibleTo(p, rt, obj)) throw notFoundError(rt, nameOf(rp));
  return obj;
}

export async function getObject(w: WorkerContext, p: Principal, rp: ResourcePath): Promise<Answer> {
  return { status: 200, body: asVersion(await visible(w, p, rp), rp.served.rt, rp.version) };
}

export interface ListAnswer {
  items: KubeObject[];
  resourceVersion: string;
  continue?: string;
}

export async function listObjects(w: WorkerContext, p: Principal, rp: ResourcePath, query: URLSearchParams): Promise<ListAnswer> {
  const rt = rp.served.rt;
  const fields = parseFieldSelector(query.get('fieldSelector'));
  if (query.get('resourceVersionMatch') === 'Exact') throw new AsbError('BadRequest', 'resourceVersionMatch=Exact is not supported: lists are served from the latest state');
  const opts: ListOptions = {};
  const namespace = rp.namespace ?? (fields.namespace?.op === '=' ? fields.namespace.value : undefined);
  if (namespace !== undefined) opts.namespace = namespace;
  const selector = scopedSelector(p, rt, query.get('labelSelector'));
  if (selector !== undefined) opts.labelSelector = selector;
  const limit = intParam(query, 'limit');
  if (limit !== undefined && limit > 0) opts.limit = limit;
  const token = query.get('continue');
  if (token !== null && token !== '') opts.continue = token;
  const listed = await w.store.list(rt, opts);
  // Field selectors filter the page the store returned; metadata.name= (the SDK's and kubectl
  // wait's form) selects at most one object, so its page is exact.
  const items = listed.items
    .filter((o) => visibleTo(p, rt, o) && matchesFields(fields, o.metadata.namespace, o.metadata.name))
    .map((o) => asVersion(o, rt, rp.version));
  return { items, resourceVersion: listed.resourceVersion, ...(listed.continue === undefined ? {} : { continue: listed.continue }) };
}

/**
 * The body as an object for this path: namespace from the path when absent, apiVersion and kind
 * of this resource, and the server-kept metadata clients echo back (managedFields) dropped.
 */
function bodyObject(rp: ResourcePath, raw: unknown, w: WorkerContext): Record<string, unknown> {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new AsbError('BadRequest', `the request body must be a ${rp.served.rt.kind} object`);
  const obj = raw as Record<string, unknown>;
  const rt = rp.served.rt;
  const apiVersion = `${rp.group}/${rp.version}`;
  if (obj.kind !== rt.kind || obj.apiVersion !== apiVersion) {
    throw new AsbError('BadRequest', `the API version in the data (${String(obj.apiVersion)}) and kind (${String(obj.kind)}) do not match the request's: ${apiVersion} ${rt.kind}`);
  }
  if (typeof obj.metadata === 'object' && obj.metadata !== null && !Array.isArray(obj.metadata)) {
    const meta = { ...(obj.metadata as Record<string, unknown>) };
    delete meta.managedFields;
    delete meta.selfLink;
    if (meta.creationTimestamp === null) delete meta.creationTimestamp;
    const ns = namespaceOf(rp, w);
    if (meta.namespace === undefined || meta.namespace === '') meta.namespace = ns;
    else if (meta.namespace !== ns) throw new AsbError('BadRequest', `the namespace of the provided object (${JSON.stringify(meta.namespace)}) does not match the namespace sent on the request (${ns})`);
    obj.metadata = meta;
  }
  return obj;
}

/** prepare() and, for a team key, the pod-security check: one Invalid naming every problem. */
async function admit(w: WorkerContext, p: Principal, rp: ResourcePath, raw: Record<string, unknown>, stored?: { existing: KubeObject | undefined }): Promise<KubeObject> {
  const { obj } = prepare(w, p, raw, '', stored?.existing);
  const problems = await tenantPodProblems(w, p, [{ obj, path: '', ...stored }]);
  if (problems.length > 0) throw invalid(`${rp.served.rt.kind}.${rp.group}`, obj.metadata.name, problems);
  return obj;
}

/** A write with a resourceVersion that is no longer the object's, in the apiserver's words. */
export function conflictError(rt: ResourceType, name: string): AsbError {
  return new AsbError('Conflict', `Operation cannot be fulfilled on ${qualifiedResource(rt)} "${name}": the object has been modified; please apply your changes to the latest version and try again`);
}

/** The apiserver's wording for AlreadyExists and Conflict, which clients show as is. */
function inKubeWords(err: unknown, rt: ResourceType, name: string): unknown {
  if (isAsbError(err, 'AlreadyExists')) return new AsbError('AlreadyExists', `${qualifiedResource(rt)} "${name}" already exists`);
  if (isAsbError(err, 'Conflict')) return conflictError(rt, name);
  if (isAsbError(err, 'NotFound')) return notFoundError(rt, name);
  return err;
}

export async function createObject(w: WorkerContext, p: Principal, rp: ResourcePath, raw: unknown, query: URLSearchParams): Promise<Answer> {
  refuseDryRun(query);
  requireWrite(p, rp, 'create');
  const rt = rp.served.rt;
  const body = bodyObject(rp, raw, w);
  const meta = body.metadata as Record<string, unknown> | undefined;
  // A Sandbox's id is taken for the whole cluster before it is written, so its name is chosen
  // here rather than by the store's generateName.
  if (rt === SandboxType && meta !== undefined && (meta.name === undefined || meta.name === '') && typeof meta.generateName === 'string' && meta.generateName !== '') {
    meta.name = `${meta.generateName}${randomSuffix()}`;
  }
  const obj = await admit(w, p, rp, body);
  const name = obj.metadata.name;
  let release: (() => void) | undefined;
  if (rt === SandboxType) {
    release = w.index.reserve(name);
    if (release === undefined) throw new AsbError('AlreadyExists', `${qualifiedResource(rt)} "${name}" already exists`);
  }
  try {
    const created = await w.store.create(rt, obj);
    if (rt === SandboxType) w.index.remember(created as Sandbox);
    await tellHub(w, [rt.kind]);
    return { status: 201, body: asVersion(created, rt, rp.version) };
  } catch (err) {
    throw inKubeWords(err, rt, name);
  } finally {
    release?.();
  }
}

/**
 * Writes `next` over `existing` (which the key may see): status through the status subresource,
 * everything else (the scale subresource's writes too) through update. A team's objects keep
 * their owner whoever writes them.
 */
export async function replace(w: WorkerContext, p: Principal, rp: ResourcePath, existing: KubeObject, next: unknown): Promise<Answer> {
  const rt = rp.served.rt;
  const name = nameOf(rp);
  const body = bodyObject(rp, next, w);
  const meta = body.metadata as Record<string, unknown> | undefined;
  if (meta !== undefined && meta.name !== undefined && meta.name !== name) {
    throw new AsbError('BadRequest', `the name of the object (${JSON.stringify(meta.name)}) does not match the name on the URL (${name})`);
  }
  try {
    if (rp.subresource === 'status') {
      const updated = await w.store.updateStatus(rt, { ...existing, status: body.status, metadata: { ...existing.metadata, resourceVersion: typeof meta?.resourceVersion === 'string' ? meta.resourceVersion : '' } });
      return { status: 200, body: asVersion(updated, rt, rp.version) };
    }
    const obj = await admit(w, p, rp, body, { existing });
    const owner = existing.metadata.labels?.[LABEL.owner];
    if (isTeamKind(rt) && owner !== undefined) obj.metadata.labels = { ...obj.metadata.labels, [LABEL.owner]: owner };
    const updated = await w.store.update(rt, obj);
    await tellHub(w, [rt.kind]);
    return { status: 200, body: asVersion(updated, rt, rp.version) };
  } catch (err) {
    throw inKubeWords(err, rt, name);
  }
}

export async function updateObject(w: WorkerContext, p: Principal, rp: ResourcePath, raw: unknown, query: URLSearchParams): Promise<Answer> {
  refuseDryRun(query);
  const existing = await visible(w, p, rp);
  requireWrite(p, rp, 'update');
  return replace(w, p, rp, existing, raw);
}

export type PatchType = 'merge' | 'json' | 'apply';

export function patchTypeOf(contentType: string | undefined): PatchType {
  const media = (contentType ?? '').split(';')[0]?.trim().toLowerCase() ?? '';
  if (media === 'application/merge-patch+json') return 'merge';
  if (media === 'application/json-patch+json') return 'json';
  if (media === 'application/apply-patch+yaml' || media === 'application/apply-patch+cbor') {
    if (media.endsWith('cbor')) throw new AsbError('UnsupportedMediaType', 'apply patches are taken as YAML or JSON (application/apply-patch+yaml), not CBOR');
    return 'apply';
  }
  throw new AsbError('UnsupportedMediaType', `the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (strategic merge patches do not apply to custom resources), got ${JSON.stringify(contentType ?? '')}`);
}

// A patch is applied to the object as read and written with that read's resourceVersion; when
// another write lands in between, it is re-read and re-applied, as the apiserver does.
const PATCH_ATTEMPTS = 5;

export async function patchObject(w: WorkerContext, p: Principal, rp: ResourcePath, type: PatchType, patch: unknown, query: URLSearchParams): Promise<Answer> {
  refuseDryRun(query);
  const rt = rp.served.rt;
  if (type === 'apply' && rp.subresource === undefined) {
    // Server-side apply of an object that does not exist yet creates it (201).
    const found = await w.store.tryGet(rt, namespaceOf(rp, w), nameOf(rp));
    if (found === undefined || !visibleTo(p, rt, found)) {
      if (found !== undefined) throw new AsbError('AlreadyExists', `${qualifiedResource(rt)} "${nameOf(rp)}" already exists`);
      return createObject(w, p, rp, patch, query);
    }
  }
  for (let attempt = 1; ; attempt++) {
    const existing = await visible(w, p, rp);
    requireWrite(p, rp, 'patch');
    const current = asVersion(structuredClone(existing), rt, rp.version);
    const next = type === 'json' ? jsonPatch(current, patch) : mergePatch(current, patch);
    const sentVersion = (next as { metadata?: { resourceVersion?: unknown } } | null)?.metadata?.resourceVersion !== existing.metadata.resourceVersion;
    try {
      return await replace(w, p, rp, existing, next);
    } catch (err) {
      // A patch that named its own resourceVersion asked for that exact version: no retry.
      if (!isAsbError(err, 'Conflict') || sentVersion || attempt >= PATCH_ATTEMPTS) throw err;
    }
  }
}

interface DeleteBody {
  preconditions?: { uid?: string; resourceVersion?: string };
  dryRun?: unknown[];
}

/** The preconditions of a DeleteOptions body (the rest of it, propagation and grace, does not apply here). */
function deletePreconditions(raw: unknown): { uid?: string; resourceVersion?: string } {
  const body = (typeof raw === 'object' && raw !== null ? raw : {}) as DeleteBody;
  if (Array.isArray(body.dryRun) && body.dryRun.length > 0) throw new AsbError('BadRequest', 'dryRun is not supported by this server; nothing was deleted');
  const opts: { uid?: string; resourceVersion?: string } = {};
  if (typeof body.preconditions?.uid === 'string') opts.uid = body.preconditions.uid;
  if (typeof body.preconditions?.resourceVersion === 'string') opts.resourceVersion = body.preconditions.resourceVersion;
  return opts;
}

/** A failed delete in the apiserver's words. */
function deleteError(err: unknown, rt: ResourceType, name: string): unknown {
  if (isAsbError(err, 'Conflict')) return new AsbError('Conflict', `Operation cannot be fulfilled on ${qualifiedResource(rt)} "${name}": ${err.message.replace(/^[^:]*: /, '')}`);
  return inKubeWords(err, rt, name);
}

export async function deleteObject(w: WorkerContext, p: Principal, rp: ResourcePath, raw: unknown, query: URLSearchParams): Promise<Answer> {
  refuseDryRun(query);
  const rt = rp.served.rt;
  const existing = await visible(w, p, rp);
  requireWrite(p, rp, 'delete');
  const opts = deletePreconditions(raw);
  const name = nameOf(rp);
  try {
    const deleted = await w.store.delete(rt, namespaceOf(rp, w), name, opts);
    await tellHub(w, [rt.kind]);
    // Finalizers still to run: the object stays, marked for deletion, and is what the answer holds.
    if (deleted.metadata.deletionTimestamp !== undefined && (deleted.metadata.finalizers ?? []).length > 0) return { status: 200, body: asVersion(deleted, rt, rp.version) };
    return { status: 200, body: deletedStatus(rt, name, existing.metadata.uid) };
  } catch (err) {
    throw deleteError(err, rt, name);
  }
}

/**
 * DELETE on a namespace's collection (the deletecollection verb: client libraries'
 * delete_collection; kubectl itself deletes `--all` and `-l` one object at a time): every object
 * the same list returns (label and field selectors; a team key's own only), all pages of it,
 * deleted one by one as the apiserver does (not atomically), with the body's preconditions
 * applied to each. The answer is that list as it was read, as kube-apiserver 1.37 answers. An
 * object gone meanwhile is skipped; any other failure is the answer once every object was tried.
 */
export async function deleteCollection(w: WorkerContext, p: Principal, rp: ResourcePath, raw: unknown, query: URLSearchParams): Promise<Answer> {
  refuseDryRun(query);
  requireWrite(p, rp, 'deletecollection');
  const rt = rp.served.rt;
  const opts = deletePreconditions(raw);
  const everything = new URLSearchParams(query);
  everything.delete('limit');
  everything.delete('continue');
  const listed = await listObjects(w, p, rp, everything);
  let failure: AsbError | undefined;
  for (const obj of listed.items) {
    const name = obj.metadata.name;
    try {
      await w.store.delete(rt, obj.metadata.namespace ?? namespaceOf(rp, w), name, opts);
    } catch (err) {
      if (!isAsbError(err, 'NotFound')) failure ??= toAsbError(deleteError(err, rt, name));
    }
  }
  if (listed.items.length > 0) await tellHub(w, [rt.kind]);
  if (failure !== undefined) throw failure;
  return { status: 200, body: { apiVersion: `${rp.group}/${rp.version}`, items: listed.items, kind: `${rt.kind}List`, metadata: { continue: '', resourceVersion: listed.resourceVersion } } };
}
