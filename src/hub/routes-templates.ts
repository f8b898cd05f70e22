// Sandbox templates, held by the hub and synced to every cluster: any key reads them, admin keys
// write them. A team's built template (owned: LABEL.owner, taken in from the cluster that built it,
// src/hub/built-templates.ts) is read by that team and admins only; to another team it is absent. Every object passes the same validation as on a worker (src/api/validate.ts), so
// what the hub accepts every cluster accepts. /v1/apply takes SandboxTemplates only (pools,
// sandboxes and claims belong to a cluster) and validates every object before writing any.
import { applyObject, type ApplyAction } from '../store/apply.ts';
import { SandboxTemplateType, type SandboxTemplate } from '../api/types.ts';
import { applyDefaults, validateObject } from '../api/validate.ts';
import { AsbError, isAsbError, type FieldProblem } from '../errors.ts';
import { principalOf, requireAdmin } from '../worker/access.ts';
import { isObjectName } from '../api/names.ts';
import { usableBy } from '../worker/team-templates.ts';
import { readJson } from '../http/body.ts';
import { applyList, namespaceQuery } from '../worker/input.ts';
import { isPlainObject } from '../http/body.ts';
import type { RequestContext, Route } from '../http/router.ts';
import type { HubContext } from './hub-context.ts';

type Action = ApplyAction;

function notFound(namespace: string, name: string): AsbError {
  return new AsbError('NotFound', `SandboxTemplate "${name}" not found in namespace "${namespace}" on the hub`);
}

/** Validated and defaulted, with its namespace set; 422 naming every bad field under `path`. */
function prepare(h: HubContext, raw: unknown, path: string): SandboxTemplate {
  const obj = applyDefaults(validateObject(raw, path));
  if (obj.kind !== SandboxTemplateType.kind) {
    const field = path === '' ? 'kind' : `${path}.kind`;
    throw new AsbError('Invalid', `${field}: the hub holds SandboxTemplates only; apply ${obj.kind} objects to a cluster`, {
      fields: [{ field, message: `must be SandboxTemplate, got ${obj.kind}` }],
    });
  }
  obj.metadata.namespace ??= h.defaultNamespace;
  return obj as SandboxTemplate;
}

function upsert(h: HubContext, obj: SandboxTemplate, existing: SandboxTemplate | undefined): Promise<{ action: Action; object: SandboxTemplate }> {
  return applyObject(h.store, SandboxTemplateType, obj, existing);
}

async function putOne(h: HubContext, ctx: RequestContext): Promise<{ action: Action; object: SandboxTemplate }> {
  requireAdmin(ctx, 'writing a SandboxTemplate');
  const raw = await readJson(ctx.req, h.jsonBytes);
  if (raw === undefined) throw new AsbError('BadRequest', 'PUT needs a SandboxTemplate object as its JSON body');
  const name = ctx.params.name ?? '';
  const ns = namespaceQuery(ctx.query, h.defaultNamespace);
  if (isPlainObject(raw) && isPlainObject(raw.metadata) && raw.metadata.namespace === undefined) raw.metadata.namespace = ns;
  const obj = prepare(h, raw, '');
  const problems: FieldProblem[] = [];
  if (obj.metadata.name !== name) problems.push({ field: 'metadata.name', message: `must match the name in the path ("${name}"), got "${obj.metadata.name}"` });
  if (obj.metadata.namespace !== ns) problems.push({ field: 'metadata.namespace', message: `must match the namespace query parameter ("${ns}")` });
  if (problems.length > 0) throw new AsbError('Invalid', `SandboxTemplate "${name}" is invalid: ${problems.map((f) => `${f.field}: ${f.message}`).join('; ')}`, { fields: problems });
  const existing = await h.store.tryGet<SandboxTemplate>(SandboxTemplateType, ns, name);
  return upsert(h, obj, existing);
}

async function apply(h: HubContext, ctx: RequestContext): Promise<{ results: { kind: string; namespace: string; name: string; action: Action }[] }> {
  requireAdmin(ctx, 'applying templates');
  const list = applyList(await readJson(ctx.req, h.jsonBytes));

  // 1. Validate everything, reporting every problem of every object at once.
  const problems: FieldProblem[] = [];
  const prepared: SandboxTemplate[] = [];
  for (const [i, item] of list.entries()) {
    try {
      prepared.push(prepare(h, item, `objects[${i}]`));
    } catch (err) {
      if (!isAsbError(err, 'Invalid')) throw err;
      problems.push(...(err.fields.length > 0 ? err.fields : [{ field: `objects[${i}]`, message: err.message }]));
    }
  }
  if (problems.length > 0) throw new AsbError('Invalid', `nothing was applied: ${problems.map((f) => `${f.field}: ${f.message}`).join('; ')}`, { fields: problems });

  // 2. Write, undoing this request's earlier writes if one fails.
  const results: { kind: string; namespace: string; name: string; action: Action }[] = [];
  const undo: (() => Promise<unknown>)[] = [];
  try {
    for (const obj of prepared) {
      const ns = obj.metadata.namespace ?? h.defaultNamespace;
      const existing = await h.store.tryGet<SandboxTemplate>(SandboxTemplateType, ns, obj.metadata.name);
      const { action, object } = await upsert(h, obj, existing);
      if (action === 'created') undo.push(() => h.store.delete(SandboxTemplateType, ns, object.metadata.name));
      if (action === 'configured' && existing !== undefined) {
        undo.push(() => h.store.update(SandboxTemplateType, { ...existing, metadata: { ...existing.metadata, resourceVersion: object.metadata.resourceVersion ?? '' } }));
      }
      results.push({ kind: SandboxTemplateType.kind, namespace: ns, name: object.metadata.name, action });
    }
  } catch (err) {
    for (const step of undo.reverse()) {
      await step().catch((undoErr: unknown) => ctx.log.error({ err: undoErr }, 'apply: undoing a write failed'));
    }
    throw err;
  }
  return { results };
}

export function templateRoutes(h: HubContext): Route[] {
  return [
    { method: 'POST', pattern: '/v1/apply', handler: async (ctx) => ({ status: 200, json: await apply(h, ctx) }) },
    {
      method: 'GET',
      pattern: '/v1/templates',
      async handler(ctx) {
        const ns = ctx.query.get('namespace');
        const listed = await h.store.list<SandboxTemplate>(SandboxTemplateType, ns === null || ns === '' ? {} : { namespace: namespaceQuery(ctx.query, h.defaultNamespace) });
        const p = principalOf(ctx);
        return { status: 200, json: { items: p.admin ? listed.items : listed.items.filter((t) => usableBy(p, t)) } };
      },
    },
    {
      method: 'GET',
      pattern: '/v1/templates/{name}',
      async handler(ctx) {
        const ns = namespaceQuery(ctx.query, h.defaultNamespace);
        const name = ctx.params.name ?? '';
        const obj = isObjectName(name) ? await h.store.tryGet<SandboxTemplate>(SandboxTemplateType, ns, name) : undefined;
        const p = principalOf(ctx);
        if (obj === undefined || !(p.admin || usableBy(p, obj))) throw notFound(ns, name);
        return { status: 200, json: obj };
      },
    },
    {
      method: 'PUT',
      pattern: '/v1/templates/{name}',
      async handler(ctx) {
        const { action, object } = await putOne(h, ctx);
        return { status: action === 'created' ? 201 : 200, json: object };
      },
    },
    {
      method: 'DELETE',
      pattern: '/v1/templates/{name}',
      async handler(ctx) {
        requireAdmin(ctx, 'deleting a SandboxTemplate');
        const ns = namespaceQuery(ctx.query, h.defaultNamespace);
        const name = ctx.params.name ?? '';
        if (!isObjectName(name)) throw notFound(ns, name);
        try {
          return { status: 200, json: await h.store.delete(SandboxTemplateType, ns, name) };
        } catch (err) {
          if (isAsbError(err, 'NotFound')) throw notFound(ns, name);
          throw err;
        }
      },
    },
  ];
}
