// /v1 snapshots and fork (snapshots.ts does the work):
//   POST   /v1/sandboxes/{id}/snapshots   {name?, memory?}  201 the snapshot, once taken
//   GET    /v1/snapshots                                     200 {items} (the team's)
//   GET    /v1/snapshots/{id}                                200 (by id, or by the name given)
//   DELETE /v1/snapshots/{id}                                202
//   POST   /v1/snapshots/{id}/sandboxes   {timeoutMs?, labels?, wait?}  201 a sandbox started from it
//   POST   /v1/sandboxes/{id}/fork        {count?, timeoutMs?}          200 {forks: [{sandbox} | {error}]}
// `memory` absent means: kept when the sandbox can keep it (gVisor; runc with suspensionStrategy
// Hibernate), else files only; the reply says which. Asked for where it cannot be kept (other runc
// pods, the Kubernetes tier): 501, and the sandbox runs on.
import { GVISOR_RUNTIME_CLASS, podKeepsMemory, type Sandbox, type SandboxSnapshot } from '../api/types.ts';
import type { SnapshotView } from '../api/views.ts';
import { findSandbox, principalOf } from './access.ts';
import { readJson } from '../http/body.ts';
import { MAX_TIMEOUT_MS } from './create-body.ts';
import type { WorkerContext } from './deps.ts';
import { checkBody } from './input.ts';
import { userLabelProblems } from './labels.ts';
import { AsbError } from '../errors.ts';
import type { Reply, RequestContext, Route } from '../http/router.ts';
import { deleteSnapshot, findSnapshot, forkSandbox, listSnapshots, MAX_FORKS, SNAPSHOT_NAME_ANNOTATION, startFromSnapshot, takeSnapshot } from './snapshots.ts';
import { reachableView, sandboxView } from './views.ts';

const SNAPSHOT_BODY = { name: { kind: 'string', min: 1, max: 253 }, memory: { kind: 'boolean' } } as const;
const START_BODY = { timeoutMs: { kind: 'integer', min: 1, max: MAX_TIMEOUT_MS }, labels: { kind: 'stringMap' }, wait: { kind: 'boolean' } } as const;
const FORK_BODY = { count: { kind: 'integer', min: 1, max: MAX_FORKS }, timeoutMs: { kind: 'integer', min: 1, max: MAX_TIMEOUT_MS } } as const;

export function snapshotView(snap: SandboxSnapshot): SnapshotView {
  const status = snap.status ?? {};
  const name = snap.metadata.annotations?.[SNAPSHOT_NAME_ANNOTATION];
  const template = status.source?.template;
  const message = status.conditions?.find((c) => c.type === 'Ready')?.message;
  return {
    id: snap.metadata.name,
    ...(name === undefined ? {} : { name }),
    sandbox: snap.spec.sandboxRef.name,
    ...(template === undefined ? {} : { template }),
    phase: status.phase ?? 'Pending',
    memory: status.memory ?? (snap.spec.mode ?? 'Full') === 'Full',
    ...(status.bytes === undefined ? {} : { bytes: status.bytes }),
    ...(status.memoryBytes === undefined ? {} : { memoryBytes: status.memoryBytes }),
    ...(status.takenAt === undefined ? {} : { takenAt: status.takenAt }),
    ...(snap.metadata.creationTimestamp === undefined ? {} : { createdAt: snap.metadata.creationTimestamp }),
    ...(message === undefined ? {} : { message }),
  };
}

/**
 * Whether the sandbox can keep its memory here, so a snapshot keeps it unless told otherwise:
 * gVisor pods, and runc pods of suspensionStrategy Hibernate (started so CRIU can save them).
 */
export function keepsMemory(w: WorkerContext, sandbox: Sandbox): boolean {
  const can = w.runtime.canKeepMemory;
  if (w.runtime.snapshot === undefined || can === undefined || !podKeepsMemory(sandbox.spec)) return false;
  return sandbox.spec.podTemplate.spec.runtimeClassName === GVISOR_RUNTIME_CLASS ? can.gvisor : can.runc;
}

async function take(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const sandbox = await findSandbox(w, ctx, ctx.params.id ?? '');
  const body = checkBody(await readJson(ctx.req, w.limits.jsonBytes), SNAPSHOT_BODY);
  const snap = await takeSnapshot(w, principalOf(ctx), sandbox, { memory: body.memory ?? keepsMemory(w, sandbox), ...(body.name === undefined ? {} : { name: body.name }) });
  return { status: 201, json: snapshotView(snap) };
}

async function list(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  return { status: 200, json: { items: (await listSnapshots(w, principalOf(ctx))).map(snapshotView) } };
}

async function get(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  return { status: 200, json: snapshotView(await findSnapshot(w, principalOf(ctx), ctx.params.id ?? '')) };
}

async function remove(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const snap = await findSnapshot(w, principalOf(ctx), ctx.params.id ?? '');
  await deleteSnapshot(w, snap);
  return { status: 202, json: { ...snapshotView(snap), phase: 'Terminating' } };
}

async function start(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const snap = await findSnapshot(w, principalOf(ctx), ctx.params.id ?? '');
  const body = checkBody(await readJson(ctx.req, w.limits.jsonBytes), START_BODY);
  const problems = userLabelProblems(body.labels ?? {}, 'labels');
  if (problems.length > 0) throw new AsbError('Invalid', `labels: ${problems.map((p) => `${p.field}: ${p.message}`).join('; ')}`, { fields: problems });
  const sandbox = await startFromSnapshot(w, snap, {
    wait: body.wait ?? true,
    ...(body.labels === undefined ? {} : { labels: body.labels }),
    ...(body.timeoutMs === undefined ? {} : { shutdownTime: new Date(w.clock.now() + body.timeoutMs).toISOString() }),
  });
  return { status: 201, json: reachableView(sandboxView(sandbox, w.cluster.name), sandbox, w.dataPlane, true) };
}

async function fork(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const sandbox = await findSandbox(w, ctx, ctx.params.id ?? '');
  const body = checkBody(await readJson(ctx.req, w.limits.jsonBytes), FORK_BODY);
  const outcomes = await forkSandbox(w, principalOf(ctx), sandbox, {
    count: body.count ?? 1,
    ...(body.timeoutMs === undefined ? {} : { shutdownTime: new Date(w.clock.now() + body.timeoutMs).toISOString() }),
  });
  const forks = outcomes.map((o) => ('sandbox' in o
    ? { sandbox: reachableView(sandboxView(o.sandbox, w.cluster.name), o.sandbox, w.dataPlane, true) }
    : { error: { code: o.error.code, status: o.error.status, message: o.error.message } }));
  return { status: 200, json: { forks } };
}

export function snapshotRoutes(w: WorkerContext): Route[] {
  return [
    { method: 'POST', pattern: '/v1/sandboxes/{id}/snapshots', handler: (ctx) => take(w, ctx) },
    { method: 'POST', pattern: '/v1/sandboxes/{id}/fork', handler: (ctx) => fork(w, ctx) },
    { method: 'GET', pattern: '/v1/snapshots', handler: (ctx) => list(w, ctx) },
    { method: 'GET', pattern: '/v1/snapshots/{id}', handler: (ctx) => get(w, ctx) },
    { method: 'DELETE', pattern: '/v1/snapshots/{id}', handler: (ctx) => remove(w, ctx) },
    { method: 'POST', pattern: '/v1/snapshots/{id}/sandboxes', handler: (ctx) => start(w, ctx) },
  ];
}
