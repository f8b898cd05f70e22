// Configuration objects: templates and warm pools (anyone reads, admins write), claims (scoped
// to the team like sandboxes), and /v1/apply, which validates and authorizes every object before
// it writes any, and undoes its own writes if a later one fails.
import { applyObject, type ApplyAction } from '../store/apply.ts';
import type { KubeObject, ResourceType } from '../api/meta.ts';
import { HEARTBEAT_MS } from '../api/hub-contract.ts';
import { isReservedKey } from '../api/names.ts';
import { POD_SECURITY_ANNOTATION } from '../api/pod-security.ts';
import { ANNOTATION, LABEL, type Sandbox, type SandboxTemplate, SandboxClaimType, SandboxTemplateType, SandboxType, SandboxWarmPoolType } from '../api/types.ts';
import { applyDefaults, validateObject } from '../api/validate.ts';
import type { Principal } from '../auth/keyring.ts';
import { AsbError, invalid, isAsbError, type FieldProblem } from '../errors.ts';
import { canSee, principalOf, requireAdmin, visibilitySelector } from './access.ts';
import { isObjectName } from '../api/names.ts';
import { readJson } from '../http/body.ts';
import type { WorkerContext } from './deps.ts';
import { tenantPodProblems } from './pod-admission.ts';
import { applyList, namespaceQuery } from './input.ts';
import { isPlainObject } from '../http/body.ts';
import { userLabelProblems } from './labels.ts';
import type { Reply, RequestContext, Route } from '../http/router.ts';
import { usableBy } from './team-templates.ts';

/** Kinds /v1/apply takes, in the order it writes them (a pool after its template). */
const APPLY_ORDER: readonly ResourceType[] = [SandboxTemplateType, SandboxWarmPoolType, SandboxType, SandboxClaimType];
/** Kinds the hub places by (its heartbeats list them): a write of one is told to the hub before it is answered. */
const PLACEMENT_KINDS: ReadonlySet<string> = new Set([SandboxTemplateType.kind, SandboxWarmPoolType.kind]);
// One heartbeat interval: the hub answers in a round trip; past this the next regular heartbeat carries it anyway.
const HUB_REPORT_MS = HEARTBEAT_MS;

/**
 * After a template or pool write, tells the hub (when this worker has one) what the cluster holds
 * now and waits until it has it, so a create at the hub or an edge right after the answer finds
 * the template instead of "no template" until the next heartbeat. A hub that is away delays
 * nothing past HUB_REPORT_MS: the write stands, and the heartbeat after reconnecting carries it.
 */
export async function tellHub(w: WorkerContext, kinds: Iterable<string>): Promise<void> {
  if (w.reportToHub === undefined || ![...kinds].some((k) => PLACEMENT_KINDS.has(k))) return;
  await w.reportToHub(HUB_REPORT_MS);
}

/** Kinds whose objects belong to a team (asb.dev/owner) rather than to the cluster's admins. */
export const TEAM_KINDS: ReadonlySet<string> = new Set([SandboxType.kind, SandboxClaimType.kind]);
// One apply writes at most this many objects: enough for any config file, bounded undo work.

type Action = ApplyAction;

function notFound(rt: ResourceType, namespace: string, name: string): AsbError {
  return new AsbError('NotFound', `${rt.kind} "${name}" not found in namespace "${namespace}"`);
}

/** Our annotations a team may set on its own objects; every other reserved key is the controller's. */
// The pod-security level only narrows from a team key: pod-admission.ts refuses a looser one.
const TENANT_ANNOTATIONS: ReadonlySet<string> = new Set([ANNOTATION.publicPorts, ANNOTATION.idleTimeoutMs, POD_SECURITY_ANNOTATION]);

/**
 * Keys under agents.x-k8s.io/ that kubernetes-sigs' own client puts on every claim it makes
 * (k8s-agent-sandbox 1.0.8: the label created-by=python-client and the annotation
 * client-first-requested-at). No controller of ours or upstream's reads them, so a team key may
 * set them on its SandboxClaims; every other key under the reserved prefixes (pool membership,
 * the claim's bound sandbox and uid, launch type, owner, template) stays the controller's.
 */
const CLIENT_CLAIM_LABELS: ReadonlySet<string> = new Set(['agents.x-k8s.io/created-by']);
const CLIENT_CLAIM_ANNOTATIONS: ReadonlySet<string> = new Set(['agents.x-k8s.io/client-first-requested-at']);

/** Whether a team may write `key` itself: not under a reserved prefix, or one of the few it may set. */
function isTenantKey(key: string, claim: boolean, kind: 'label' | 'annotation'): boolean {
  if (!isReservedKey(key)) return true;
  if (kind === 'label') return claim && CLIENT_CLAIM_LABELS.has(key);
  return TENANT_ANNOTATIONS.has(key) || (claim && CLIENT_CLAIM_ANNOTATIONS.has(key));
}

/**
 * What a team key may not write into an object's metadata: labels and annotations under our
 * reserved prefixes (pool membership, claim binding, token generation, template), and owner
 * references (a pool or claim owns its sandboxes). The owner label is not refused: it is set
 * from the key whatever was sent, so re-applying an object read from the API still works. For
 * the same reason, on an update a reserved key or owner reference the stored object already
 * has, sent back unchanged, is not the team setting it: every read-modify-write (kubectl patch,
 * scale, label, edit) of a sandbox the controller labelled sends them back.
 */
function tenantMetadataProblems(obj: KubeObject, path: string, existing: KubeObject | undefined): FieldProblem[] {
  const at = path === '' ? 'metadata' : `${path}.metadata`;
  const claim = obj.kind === SandboxClaimType.kind;
  const stored = existing?.metadata;
  const { [LABEL.owner]: _owner, ...labels } = obj.metadata.labels ?? {};
  const sent = Object.fromEntries(Object.entries(labels).filter(([k, v]) => !isReservedKey(k) || stored?.labels?.[k] !== v));
  const problems = userLabelProblems(sent, `${at}.labels`, claim ? CLIENT_CLAIM_LABELS : undefined);
  for (const [key, value] of Object.entries(obj.metadata.annotations ?? {})) {
    if (!isTenantKey(key, claim, 'annotation') && stored?.annotations?.[key] !== value) problems.push({ field: `${at}.annotations.${key}`, message: `is reserved for the controller (a team key may set only ${[...TENANT_ANNOTATIONS].join(', ')} of its prefixes)` });
  }
  const refs = obj.metadata.ownerReferences ?? [];
  if (refs.length > 0 && JSON.stringify(refs) !== JSON.stringify(stored?.ownerReferences ?? [])) problems.push({ field: `${at}.ownerReferences`, message: 'can be set only with an admin API key' });
  return problems;
}

/**
 * The controller's part of the stored object's metadata, put back where a team's update left it
 * out: a team key neither sets, changes nor drops a reserved key or an owner reference (a
 * dropped claim-uid label would unbind the sandbox from its claim).
 */
function keepControllerMetadata(obj: KubeObject, existing: KubeObject): void {
  const claim = obj.kind === SandboxClaimType.kind;
  const controllers = (from: Record<string, string> | undefined, kind: 'label' | 'annotation'): Record<string, string> => Object.fromEntries(Object.entries(from ?? {}).filter(([k]) => !isTenantKey(k, claim, kind)));
  const labels = controllers(existing.metadata.labels, 'label');
  const annotations = controllers(existing.metadata.annotations, 'annotation');
  if (Object.keys(labels).length > 0) obj.metadata.labels = { ...obj.metadata.labels, ...labels };
  if (Object.keys(annotations).length > 0) obj.metadata.annotations = { ...obj.metadata.annotations, ...annotations };
  const owners = existing.metadata.ownerReferences ?? [];
  if (owners.length > 0) obj.metadata.ownerReferences = owners;
}

/**
 * Validated, defaulted, namespaced and owned, ready to write; 422 naming every bad field. Also the
 * Kubernetes API's gate (src/kubeapi/), which passes the stored object its update replaces.
 */
export function prepare(w: WorkerContext, p: Principal, raw: unknown, path: string, existing?: KubeObject): { rt: ResourceType; obj: KubeObject } {
  const obj = applyDefaults(validateObject(raw, path));
  const rt = APPLY_ORDER.find((t) => t.kind === obj.kind);
  if (rt === undefined) {
    throw new AsbError('Invalid', `${path}.kind: ${obj.kind} cannot be applied through the API; apply ${APPLY_ORDER.map((t) => t.kind).join(', ')}`, {
      fields: [{ field: `${path}.kind`, message: `must be one of ${APPLY_ORDER.map((t) => t.kind).join(', ')}` }],
    });
  }
  obj.metadata.namespace ??= w.defaultNamespace;
  if (TEAM_KINDS.has(rt.kind) && !p.admin) {
    const problems = tenantMetadataProblems(obj, path, existing);
    if (problems.length > 0) throw invalid(obj.kind, obj.metadata.name, problems);
    if (existing !== undefined) keepControllerMetadata(obj, existing);
  }
  if (TEAM_KINDS.has(rt.kind)) obj.metadata.labels = { ...obj.metadata.labels, [LABEL.owner]: p.team };
  return { rt, obj };
}

function upsert(w: WorkerContext, rt: ResourceType, obj: KubeObject, existing: KubeObject | undefined): Promise<{ action: Action; object: KubeObject }> {
  return applyObject(w.store, rt, obj, existing);
}

async function listKind(w: WorkerContext, ctx: RequestContext, rt: ResourceType): Promise<Reply> {
  const p = principalOf(ctx);
  const ns = ctx.query.get('namespace');
  const opts: { namespace?: string; labelSelector?: string } = {};
  if (ns !== null && ns !== '') opts.namespace = namespaceQuery(ctx.query, w.defaultNamespace);
  if (TEAM_KINDS.has(rt.kind)) opts.labelSelector = visibilitySelector(p);
  const listed = await w.store.list(rt, opts);
  // A template a team built is that team's (team-templates.ts); the admins' serve everyone.
  const items = rt.kind === SandboxTemplateType.kind && !p.admin ? listed.items.filter((t) => usableBy(p, t as SandboxTemplate)) : listed.items;
  return { status: 200, json: { items } };
}

async function getVisible(w: WorkerContext, ctx: RequestContext, rt: ResourceType): Promise<KubeObject> {
  const p = principalOf(ctx);
  const ns = namespaceQuery(ctx.query, w.defaultNamespace);
  const name = ctx.params.name ?? '';
  if (!isObjectName(name)) throw notFound(rt, ns, name);
  const obj = await w.store.tryGet(rt, ns, name);
  if (obj === undefined || (TEAM_KINDS.has(rt.kind) && !canSee(p, obj)) || (rt.kind === SandboxTemplateType.kind && !p.admin && !usableBy(p, obj as SandboxTemplate))) throw notFound(rt, ns, name);
  return obj;
}

async function putOne(w: WorkerContext, ctx: RequestContext, rt: ResourceType): Promise<Reply> {
  const p = requireAdmin(ctx, `writing a ${rt.kind}`);
  const raw = await readJson(ctx.req, w.limits.jsonBytes);
  if (raw === undefined) throw new AsbError('BadRequest', `PUT needs a ${rt.kind} object as its JSON body`);
  const name = ctx.params.name ?? '';
  const queryNs = namespaceQuery(ctx.query, w.defaultNamespace);
  if (isPlainObject(raw) && isPlainObject(raw.metadata) && raw.metadata.namespace === undefined) raw.metadata.namespace = queryNs;
  const { rt: bodyRt, obj } = prepare(w, p, raw, '');
  const problems: FieldProblem[] = [];
  if (bodyRt !== rt) problems.push({ field: 'kind', message: `must be ${rt.kind} on this route, got ${obj.kind}` });
  if (obj.metadata.name !== name) problems.push({ field: 'metadata.name', message: `must match the name in the path ("${name}"), got "${obj.metadata.name}"` });
  if (obj.metadata.namespace !== queryNs) problems.push({ field: 'metadata.namespace', message: `must match the namespace query parameter ("${queryNs}")` });
  if (problems.length > 0) throw invalid(rt.kind, name, problems);
  const existing = await w.store.tryGet(rt, queryNs, name);
  const result = await upsert(w, rt, obj, existing);
  await tellHub(w, [rt.kind]);
  return { status: result.action === 'created' ? 201 : 200, json: result.object };
}

async function deleteOne(w: WorkerContext, ctx: RequestContext, rt: ResourceType): Promise<Reply> {
  if (!TEAM_KINDS.has(rt.kind)) requireAdmin(ctx, `deleting a ${rt.kind}`);
  const obj = await getVisible(w, ctx, rt);
  const ns = obj.metadata.namespace ?? w.defaultNamespace;
  try {
    const deleted = await w.store.delete(rt, ns, obj.metadata.name);
    await tellHub(w, [rt.kind]);
    return { status: 200, json: deleted };
  } catch (err) {
    if (isAsbError(err, 'NotFound')) throw notFound(rt, ns, obj.metadata.name);
    throw err;
  }
}

async function apply(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const p = principalOf(ctx);
  const list = applyList(await readJson(ctx.req, w.limits.jsonBytes));

  // 1. Validate everything, reporting every problem of every object at once.
  const problems: FieldProblem[] = [];
  const prepared: { rt: ResourceType; obj: KubeObject; index: number }[] = [];
  for (const [i, item] of list.entries()) {
    try {
      prepared.push({ ...prepare(w, p, item, `objects[${i}]`), index: i });
    } catch (err) {
      if (!isAsbError(err, 'Invalid')) throw err;
      problems.push(...(err.fields.length > 0 ? err.fields : [{ field: `objects[${i}]`, message: err.message }]));
    }
  }
  // Pod security: what a team key may put in a pod spec (admins are not checked).
  problems.push(...await tenantPodProblems(w, p, prepared.map(({ obj, index }) => ({ obj, path: `objects[${index}]` }))));
  if (problems.length > 0) throw new AsbError('Invalid', `nothing was applied: ${problems.map((f) => `${f.field}: ${f.message}`).join('; ')}`, { fields: problems });

  // 2. Authorize everything and read what exists, still without writing. A new Sandbox takes its
  // id for the cluster here (ids are unique across namespaces: sandbox-identity.ts) and gives it
  // back once written or refused.
  const plan: { rt: ResourceType; obj: KubeObject; existing: KubeObject | undefined }[] = [];
  const releases: (() => void)[] = [];
  const ordered = prepared.sort((a, b) => APPLY_ORDER.indexOf(a.rt) - APPLY_ORDER.indexOf(b.rt) || a.index - b.index);
  try {
    for (const { rt, obj, index } of ordered) {
      if (!TEAM_KINDS.has(rt.kind) && !p.admin) throw new AsbError('Forbidden', `nothing was applied: objects[${index}] is a ${rt.kind}, and writing one needs an admin API key`);
      const ns = obj.metadata.namespace ?? w.defaultNamespace;
      const existing = await w.store.tryGet(rt, ns, obj.metadata.name);
      const taken = (): AsbError => new AsbError('AlreadyExists', `nothing was applied: objects[${index}]: the name ${rt.kind} "${obj.metadata.name}" is taken; choose another`);
      if (existing !== undefined && TEAM_KINDS.has(rt.kind) && !canSee(p, existing)) throw taken();
      if (existing === undefined && rt === SandboxType) {
        // The same answer as for a name taken in this namespace: whose it is stays unsaid.
        const release = w.index.reserve(obj.metadata.name);
        if (release === undefined) throw taken();
        releases.push(release);
      }
      plan.push({ rt, obj, existing });
    }
    return await write(w, ctx, plan);
  } finally {
    for (const release of releases) release();
  }
}

/** Step 3 of apply: write the plan in order, undoing this request's earlier writes if one fails. */
async function write(w: WorkerContext, ctx: RequestContext, plan: readonly { rt: ResourceType; obj: KubeObject; existing: KubeObject | undefined }[]): Promise<Reply> {
  const results: { kind: string; namespace: string; name: string; action: Action }[] = [];
  const undo: (() => Promise<unknown>)[] = [];
  try {
    for (const { rt, obj, existing } of plan) {
      const { action, object } = await upsert(w, rt, obj, existing);
      if (rt === SandboxType) w.index.remember(object as Sandbox);
      const ns = object.metadata.namespace ?? w.defaultNamespace;
      if (action === 'created') undo.push(() => w.store.delete(rt, ns, object.metadata.name));
      if (action === 'configured' && existing !== undefined) undo.push(() => w.store.update(rt, { ...existing, metadata: { ...existing.metadata, resourceVersion: object.metadata.resourceVersion ?? '' } }));
      results.push({ kind: rt.kind, namespace: ns, name: object.metadata.name, action });
    }
  } catch (err) {
    for (const step of undo.reverse()) {
      await step().catch((undoErr: unknown) => ctx.log.error({ err: undoErr }, 'apply: undoing a write failed'));
    }
    throw err;
  }
  await tellHub(w, results.filter((r) => r.action !== 'unchanged').map((r) => r.kind));
  return { status: 200, json: { results } };
}

export function objectRoutes(w: WorkerContext): Route[] {
  const crud = (base: string, rt: ResourceType, writable: boolean): Route[] => [
    { method: 'GET', pattern: base, handler: (ctx) => listKind(w, ctx, rt) },
    { method: 'GET', pattern: `${base}/{name}`, handler: async (ctx) => ({ status: 200, json: await getVisible(w, ctx, rt) }) },
    ...(writable ? [{ method: 'PUT' as const, pattern: `${base}/{name}`, handler: (ctx: RequestContext) => putOne(w, ctx, rt) }] : []),
    { method: 'DELETE', pattern: `${base}/{name}`, handler: (ctx) => deleteOne(w, ctx, rt) },
  ];
  return [
    { method: 'POST', pattern: '/v1/apply', handler: (ctx) => apply(w, ctx) },
    ...crud('/v1/templates', SandboxTemplateType, true),
    ...crud('/v1/pools', SandboxWarmPoolType, true),
    ...crud('/v1/claims', SandboxClaimType, false),
  ];
}
