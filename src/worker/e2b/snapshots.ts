// E2B's snapshots and fork (the `e2b` SDK 2.63's create_snapshot, list_snapshots, delete_snapshot
// and fork; research e2b.md), on our SandboxSnapshot objects (src/worker/snapshots.ts):
//   POST   /sandboxes/{id}/snapshots   {name?, memory?}   201 {snapshotID, names}
//   GET    /snapshots?sandboxID&name&limit&nextToken     200 [{snapshotID, names}], X-Next-Token
//   DELETE /templates/{snapshotID}                        204 (404: the SDK's False); a built template's id deletes it (templates.ts)
//   POST   /sandboxes/{id}/fork        {timeout?, count?} 201 [{sandbox} | {error: {code, message}}]
// `Sandbox.create(snapshotID)` is a create whose templateID names a snapshot (routes.ts). `memory`
// unset keeps memory where the sandbox can (gVisor), else files only (routes-snapshots.ts says why).
import type { SandboxSnapshot } from '../../api/types.ts';
import { AsbError } from '../../errors.ts';
import { findSandbox, sandboxNotFound } from '../access.ts';
import { readJson } from '../../http/body.ts';
import { MAX_TIMEOUT_MS } from '../create-body.ts';
import type { WorkerContext } from '../deps.ts';
import type { Authenticator } from '../../auth/keyring.ts';
import { checkBody } from '../input.ts';
import { isPlainObject } from '../../http/body.ts';
import type { Reply, Route } from '../../http/router.ts';
import { keepsMemory } from '../routes-snapshots.ts';
import { deleteSnapshot, findSnapshot, forkSandbox, listSnapshots, MAX_FORKS, SNAPSHOT_NAME_ANNOTATION, takeSnapshot } from '../snapshots.ts';
import { e2bRoute, type AuthedContext } from './reply.ts';
import { deleteBuiltTemplate } from './templates.ts';
import { e2bSandbox } from './shape.ts';

const SNAPSHOT_BODY = { name: { kind: 'string', min: 1, max: 253 }, memory: { kind: 'boolean' } } as const;
const FORK_BODY = { timeout: { kind: 'integer', min: 1, max: MAX_TIMEOUT_MS / 1000 }, count: { kind: 'integer', min: 1, max: MAX_FORKS } } as const;
const DEFAULT_TIMEOUT_S = 300;
const PAGE = 100;

/** The fields of the body this API reads; the others the SDK may send are dropped. */
async function known<S extends Record<string, { kind: 'string' | 'boolean' | 'integer'; min?: number; max?: number }>>(w: WorkerContext, ctx: AuthedContext, spec: S): Promise<ReturnType<typeof checkBody<S>>> {
  const raw: unknown = await readJson(ctx.req, w.limits.jsonBytes);
  return checkBody(isPlainObject(raw) ? Object.fromEntries(Object.entries(raw).filter(([k]) => Object.hasOwn(spec, k))) : raw, spec);
}

function snapshotInfo(snap: SandboxSnapshot): { snapshotID: string; names: string[] } {
  const name = snap.metadata.annotations?.[SNAPSHOT_NAME_ANNOTATION];
  return { snapshotID: snap.metadata.name, names: name === undefined ? [] : [name] };
}

async function liveSandbox(w: WorkerContext, ctx: AuthedContext): ReturnType<typeof findSandbox> {
  const id = ctx.params.id ?? '';
  const sandbox = await findSandbox(w, ctx, id);
  if (sandbox.metadata.deletionTimestamp !== undefined) throw sandboxNotFound(id);
  return sandbox;
}

async function create(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const body = await known(w, ctx, SNAPSHOT_BODY);
  const sandbox = await liveSandbox(w, ctx);
  const snap = await takeSnapshot(w, ctx.principal, sandbox, { memory: body.memory ?? keepsMemory(w, sandbox), ...(body.name === undefined ? {} : { name: body.name }) });
  return { status: 201, json: snapshotInfo(snap) };
}

async function list(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const q = ctx.query;
  const sandboxId = q.get('sandboxID');
  const name = q.get('name');
  const limit = Math.min(Number(q.get('limit') ?? PAGE) || PAGE, 1000);
  const start = Number(q.get('nextToken') ?? '0');
  if (!Number.isInteger(start) || start < 0) throw new AsbError('BadRequest', 'query parameter nextToken is not a token this API returned in X-Next-Token');
  const all = (await listSnapshots(w, ctx.principal)).filter((s) =>
    (sandboxId === null || sandboxId === '' || s.spec.sandboxRef.name === sandboxId) &&
    (name === null || name === '' || s.metadata.name === name || s.metadata.annotations?.[SNAPSHOT_NAME_ANNOTATION] === name));
  const page = all.slice(start, start + limit);
  const headers: Record<string, string> = start + limit < all.length ? { 'x-next-token': String(start + limit) } : {};
  return { status: 200, json: page.map(snapshotInfo), headers };
}

async function remove(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  // E2B deletes templates and snapshots by the same path: a built template of the team's first.
  if (await deleteBuiltTemplate(w, ctx)) return { status: 204 };
  await deleteSnapshot(w, await findSnapshot(w, ctx.principal, ctx.params.id ?? ''));
  return { status: 204 };
}

async function fork(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const body = await known(w, ctx, FORK_BODY);
  const sandbox = await liveSandbox(w, ctx);
  const outcomes = await forkSandbox(w, ctx.principal, sandbox, {
    count: body.count ?? 1,
    shutdownTime: new Date(w.clock.now() + (body.timeout ?? DEFAULT_TIMEOUT_S) * 1000).toISOString(),
  });
  const results = outcomes.map((o) => ('sandbox' in o ? { sandbox: e2bSandbox(w, o.sandbox, ctx.req) } : { error: { code: o.error.status, message: o.error.message } }));
  return { status: 201, json: results };
}

export function e2bSnapshotRoutes(w: WorkerContext, auth: Authenticator): Route[] {
  const route = (method: Route['method'], pattern: string, handler: (ctx: AuthedContext) => Promise<Reply>): Route => e2bRoute(auth, method, pattern, handler);
  return [
    route('POST', '/sandboxes/{id}/snapshots', (ctx) => create(w, ctx)),
    route('GET', '/snapshots', (ctx) => list(w, ctx)),
    route('DELETE', '/templates/{id}', (ctx) => remove(w, ctx)),
    route('POST', '/sandboxes/{id}/fork', (ctx) => fork(w, ctx)),
  ];
}
