// /v1/sandboxes: create (claim from a warm pool or cold start), get, list, delete, pause,
// resume and timeout. Lifecycle changes are spec writes; the operator does the work. Every view
// names this cluster; a create that names another cluster or region is refused here (the hub
// places, src/hub/routes-sandboxes.ts).
import type { Sandbox, SandboxPhase } from '../api/types.ts';
import { LABEL, SandboxType } from '../api/types.ts';
import { AsbError } from '../errors.ts';
import { parseEgressPolicy } from '../network/egress-policy.ts';
import { ClusterType, type Cluster } from '../api/hub-contract.ts';
import { CLUSTER_SCOPE } from '../store/store.ts';
import { requireProxyForDomains } from './egress-domains.ts';
import { findSandbox, principalOf, visibilitySelector } from './access.ts';
import { isObjectName } from '../api/names.ts';
import { readJson } from '../http/body.ts';
import { checkCreateBody, MAX_TIMEOUT_MS, type CreateBody } from './create-body.ts';
import type { WorkerContext } from './deps.ts';
import { checkBody, queryInt } from './input.ts';
import { isPlainObject } from '../http/body.ts';
import { checkSelector } from './labels.ts';
import type { Reply, RequestContext, Route } from '../http/router.ts';
import { claimSandbox, deleteSandbox, pauseSandbox, resumeSandbox, rotateAccessToken, setNetwork, setShutdownIn } from './sandbox-lifecycle.ts';
import { reachableView, sandboxView } from './views.ts';
import { type SandboxView } from '../api/views.ts';
import { E2B_ANNOTATION } from './e2b/shape.ts';

const PHASES: readonly SandboxPhase[] = ['Pending', 'Running', 'Hibernating', 'Hibernated', 'Waking', 'Failed', 'Expired', 'Terminating'];
const RESUME_BODY = { wait: { kind: 'boolean' } } as const;
const PAUSE_BODY = { memory: { kind: 'boolean' }, wait: { kind: 'boolean' } } as const;
const TIMEOUT_BODY = { timeoutMs: { kind: 'integer', required: true, min: 1, max: MAX_TIMEOUT_MS } } as const;

/** A reply about one sandbox: its view, the URL to reach it and (unless `withToken` is false) its access token. */
function viewReply(w: WorkerContext, status: number, sandbox: Sandbox, view: SandboxView = sandboxView(sandbox, w.cluster.name), withToken = true): Reply {
  return { status, json: reachableView(view, sandbox, w.dataPlane, withToken) };
}

/** A create here must not ask for another cluster or region: placing elsewhere is the hub's job. */
async function checkPlacement(w: WorkerContext, body: CreateBody): Promise<void> {
  const here = w.cluster.name;
  if (body.cluster !== undefined && body.cluster !== here) {
    const message = `this worker is cluster "${here}", not "${body.cluster}"; to place a sandbox in another cluster, create it at the hub or an edge`;
    throw new AsbError('BadRequest', message, { fields: [{ field: 'cluster', message }] });
  }
  if (body.region === undefined) return;
  // The worker's own Cluster object comes from the hub by sync; without it this cluster has no region.
  const own = await w.store.tryGet<Cluster>(ClusterType, CLUSTER_SCOPE, here);
  if (own === undefined) {
    const message = `cluster "${here}" has no region (it is not registered at a hub, or has not synced yet); leave region out, or create at the hub or an edge`;
    throw new AsbError('BadRequest', message, { fields: [{ field: 'region', message }] });
  }
  if (own.spec.region !== body.region) {
    const message = `cluster "${here}" is in region "${own.spec.region}", not "${body.region}"; to place a sandbox in another region, create it at the hub or an edge`;
    throw new AsbError('BadRequest', message, { fields: [{ field: 'region', message }] });
  }
}

async function create(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const p = principalOf(ctx);
  const body = checkCreateBody(await readJson(ctx.req, w.limits.jsonBytes));
  const network = body.network === undefined ? undefined : parseEgressPolicy(body.network, 'network');
  if (network !== undefined) requireProxyForDomains(w.egressProxy, network, { allow: 'network.allow', deny: 'network.deny' });
  await checkPlacement(w, body);
  const claimed = await claimSandbox(w, p, {
    namespace: body.namespace ?? w.defaultNamespace,
    template: body.template ?? 'base',
    ...(body.labels === undefined ? {} : { labels: body.labels }),
    ...(body.timeoutMs === undefined ? {} : { shutdownTime: new Date(w.clock.now() + body.timeoutMs).toISOString() }),
    ...(body.idleTimeoutMs === undefined ? {} : { idleTimeoutMs: body.idleTimeoutMs }),
    ...(network === undefined ? {} : { network }),
    // The same annotation E2B's envVars use: every command the API runs in the sandbox gets it.
    ...(body.env === undefined ? {} : { annotations: { [E2B_ANNOTATION.envVars]: JSON.stringify(body.env) } }),
    coldStart: body.coldStart ?? true,
    wait: body.wait ?? true,
  });
  const sandbox = claimed.sandbox;
  return viewReply(w, 201, sandbox, { ...sandboxView(sandbox, w.cluster.name), launchType: claimed.launch });
}

async function list(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const p = principalOf(ctx);
  const q = ctx.query;
  const selectors = [visibilitySelector(p)];
  const userSelector = q.get('labelSelector');
  if (userSelector !== null && userSelector !== '') {
    checkSelector(userSelector, 'labelSelector');
    selectors.push(userSelector);
  }
  const template = q.get('template');
  if (template !== null && template !== '') {
    if (!isObjectName(template)) throw new AsbError('BadRequest', `query parameter template must be a template name, got "${template}"`, { fields: [{ field: 'template', message: 'not a valid name' }] });
    selectors.push(`${LABEL.template}=${template}`);
  }
  const phase = q.get('phase');
  if (phase !== null && phase !== '' && !(PHASES as readonly string[]).includes(phase)) {
    throw new AsbError('BadRequest', `query parameter phase must be one of ${PHASES.join(', ')}, got "${phase}"`, { fields: [{ field: 'phase', message: 'unknown phase' }] });
  }
  const namespace = q.get('namespace');
  if (namespace !== null && namespace !== '' && !isObjectName(namespace)) {
    throw new AsbError('BadRequest', `query parameter namespace must be a DNS label, got "${namespace}"`, { fields: [{ field: 'namespace', message: 'not a valid name' }] });
  }
  const limit = queryInt(q, 'limit', 1, 1000);
  const cont = q.get('continue');
  const opts: Parameters<typeof w.store.list>[1] = { labelSelector: selectors.join(',') };
  if (namespace !== null && namespace !== '') opts.namespace = namespace;
  if (limit !== undefined) opts.limit = limit;
  if (cont !== null && cont !== '') opts.continue = cont;
  const page = await w.store.list<Sandbox>(SandboxType, opts);
  // phase is status, not a label: filtered per page, so a page may hold fewer than `limit`.
  // Lists carry no tokens: a page of 1,000 tokens is one log line away from a leak.
  const items = page.items.map((s) => reachableView(sandboxView(s, w.cluster.name), s, w.dataPlane, false)).filter((v) => phase === null || phase === '' || v.phase === phase);
  return { status: 200, json: page.continue === undefined ? { items } : { items, continue: page.continue } };
}

async function get(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  return viewReply(w, 200, await findSandbox(w, ctx, ctx.params.id ?? ''));
}

async function remove(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const sandbox = await findSandbox(w, ctx, ctx.params.id ?? '');
  const deleted = await deleteSandbox(w, sandbox);
  return viewReply(w, 202, deleted, { ...sandboxView(deleted, w.cluster.name), phase: 'Terminating', ready: false }, false);
}

/**
 * POST /v1/sandboxes/{id}/pause {memory?, wait?}. memory true: keep memory and processes or do
 * not pause (400 where the runtime cannot keep memory, 500 CheckpointFailed when the save fails;
 * the sandbox keeps running either way); false: files only; absent: the sandbox's
 * suspensionStrategy. wait (default: true when memory is set, else false, as before) answers once
 * the pod has stopped; only a waiting pause can say why a pause with memory failed.
 */
async function pause(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const sandbox = await findSandbox(w, ctx, ctx.params.id ?? '');
  const body = checkBody(await readJson(ctx.req, w.limits.jsonBytes), PAUSE_BODY);
  const memory = body.memory === undefined ? undefined : body.memory ? 'required' as const : 'none' as const;
  return viewReply(w, 200, await pauseSandbox(w, sandbox, body.wait ?? memory !== undefined, memory));
}

async function resume(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const sandbox = await findSandbox(w, ctx, ctx.params.id ?? '');
  const raw = await readJson(ctx.req, w.limits.jsonBytes);
  // cause: the request that woke the sandbox, which the router tells (admin key) for the lifecycle event.
  const { cause, ...rest }: Record<string, unknown> = isPlainObject(raw) ? raw : {};
  const body = checkBody(isPlainObject(raw) ? rest : raw, RESUME_BODY);
  const wakeCause = cause === undefined ? undefined : parseWakeCause(cause);
  return viewReply(w, 200, await resumeSandbox(w, sandbox, body.wait ?? true, wakeCause === undefined ? {} : { wakeCause }));
}

async function timeout(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const sandbox = await findSandbox(w, ctx, ctx.params.id ?? '');
  const body = checkBody(await readJson(ctx.req, w.limits.jsonBytes), TIMEOUT_BODY);
  return viewReply(w, 200, await setShutdownIn(w, sandbox, body.timeoutMs));
}

/** PUT /v1/sandboxes/{id}/network: replaces the whole egress policy; a running sandbox follows it at once. */
async function network(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const sandbox = await findSandbox(w, ctx, ctx.params.id ?? '');
  const body = (await readJson(ctx.req, w.limits.jsonBytes)) ?? {};
  const policy = parseEgressPolicy(body, 'body');
  requireProxyForDomains(w.egressProxy, policy, { allow: 'body.allow', deny: 'body.deny' });
  return viewReply(w, 200, await setNetwork(w, sandbox, policy));
}

async function rotateToken(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const sandbox = await findSandbox(w, ctx, ctx.params.id ?? '');
  checkBody(await readJson(ctx.req, w.limits.jsonBytes), {});
  return viewReply(w, 200, await rotateAccessToken(w, sandbox));
}

export function sandboxRoutes(w: WorkerContext): Route[] {
  return [
    { method: 'POST', pattern: '/v1/sandboxes', handler: (ctx) => create(w, ctx) },
    { method: 'GET', pattern: '/v1/sandboxes', handler: (ctx) => list(w, ctx) },
    { method: 'GET', pattern: '/v1/sandboxes/{id}', handler: (ctx) => get(w, ctx) },
    { method: 'DELETE', pattern: '/v1/sandboxes/{id}', handler: (ctx) => remove(w, ctx) },
    { method: 'POST', pattern: '/v1/sandboxes/{id}/pause', handler: (ctx) => pause(w, ctx) },
    { method: 'POST', pattern: '/v1/sandboxes/{id}/resume', handler: (ctx) => resume(w, ctx) },
    { method: 'POST', pattern: '/v1/sandboxes/{id}/timeout', handler: (ctx) => timeout(w, ctx) },
    { method: 'POST', pattern: '/v1/sandboxes/{id}/access-token', handler: (ctx) => rotateToken(w, ctx) },
    { method: 'PUT', pattern: '/v1/sandboxes/{id}/network', handler: (ctx) => network(w, ctx) },
  ];
}

function parseWakeCause(cause: unknown): { host: string; path: string } {
  if (isPlainObject(cause) && Object.keys(cause).length === 2) {
    const { host, path } = cause;
    if (typeof host === 'string' && typeof path === 'string' && host.length <= 253 && path.length <= 512) return { host, path };
  }
  throw new AsbError('Invalid', 'request body is invalid: cause: must be {host, path}, strings of at most 253 and 512 characters', { fields: [{ field: 'cause', message: 'must be {host, path}' }] });
}
