// What the APIs do with snapshots, shared by our /v1 routes (routes-snapshots.ts) and E2B's: take
// one (a SandboxSnapshot object; the operator's snapshot controller takes it and the call waits for
// the outcome), find, list and delete a team's, start a sandbox from one, and fork: one snapshot of
// memory and files, N sandboxes started from it, each succeeding or failing on its own, then the
// snapshot deleted.
//
// A snapshot lives on the worker that took it (in its runtime's state dir); sandboxes started from
// it are placed there too: placement follows the snapshot. Its id starts with the cluster's tag, as
// a sandbox id does, so the hub and the edges know where it is. Snapshots are a team's: another
// team's are 404, as its sandboxes are.
import type { Principal } from '../auth/keyring.ts';
import { POD_SECURITY_ANNOTATION } from '../api/pod-security.ts';
import { apiVersionOf } from '../api/meta.ts';
import { newSandboxId } from '../api/ids.ts';
import { ANNOTATION, LABEL, SandboxSnapshotType, SandboxType, type Sandbox, type SandboxSnapshot } from '../api/types.ts';
import { AsbError, isAsbError } from '../errors.ts';
import { RUNTIME_FINALIZER } from '../operator/blueprint.ts';
import type { EgressPolicy } from '../network/egress-policy.ts';
import { networkSpec } from '../api/sandbox-network.ts';
import { canSee } from './access.ts';
import { isObjectName } from '../api/names.ts';
import type { WorkerContext } from './deps.ts';
import { waitReady, watchObject } from './sandbox-lifecycle.ts';

/** On a SandboxSnapshot: the name its owner gave it (E2B's snapshot names), besides its id. */
export const SNAPSHOT_NAME_ANNOTATION = 'asb.dev/snapshot-name';
/** On a snapshot taken for a fork: deleted once the forks have started. */
export const FORK_LABEL = 'asb.dev/fork-of';
/** On a sandbox started from a snapshot: which one. */
export const FROM_SNAPSHOT_LABEL = 'asb.dev/from-snapshot';
/** E2B's limit, which its SDKs check too. */
export const MAX_FORKS = 20;

export function snapshotNotFound(id: string): AsbError {
  return new AsbError('NotFound', `snapshot "${id}" not found; list yours with GET /v1/snapshots`);
}

/** The error a failed snapshot's condition stands for. */
function snapshotFailure(snap: SandboxSnapshot): AsbError {
  const ready = snap.status?.conditions?.find((c) => c.type === 'Ready');
  const message = ready?.message ?? 'the snapshot failed';
  switch (ready?.reason) {
    case 'MemoryNotSupported': return new AsbError('NotImplemented', `${message}; take it with memory false (files only)`);
    case 'SandboxNotRunning': return new AsbError('SandboxNotRunning', message);
    case 'SandboxNotFound': return new AsbError('NotFound', message);
    case 'NotSupported': return new AsbError('NotImplemented', message);
    default: return new AsbError('CheckpointFailed', message);
  }
}

/** Resolves once the snapshot is Ready, rejects with its failure, or Timeout after waitReadyMs. */
function waitTaken(w: WorkerContext, created: SandboxSnapshot): Promise<SandboxSnapshot> {
  const settle = (snap: SandboxSnapshot): SandboxSnapshot | Error | undefined => (snap.status?.phase === 'Ready' ? snap : snap.status?.phase === 'Failed' ? snapshotFailure(snap) : undefined);
  return watchObject(w, SandboxSnapshotType, created, settle, () => snapshotNotFound(created.metadata.name), `snapshot "${created.metadata.name}" to be taken (it may still finish: GET /v1/snapshots/${created.metadata.name})`);
}

/**
 * Refuses a new snapshot for a team whose snapshots on this worker already reach its quota, in
 * count or bytes (WorkerLimits). Checked before each snapshot, so concurrent ones may pass it
 * together, and a snapshot's size is known only once taken: a team can go over by the snapshots it
 * takes at once, never further.
 */
async function checkSnapshotQuota(w: WorkerContext, team: string): Promise<void> {
  const page = await w.store.list<SandboxSnapshot>(SandboxSnapshotType, { labelSelector: `${LABEL.owner}=${team}` });
  const kept = page.items.filter((s) => s.metadata.deletionTimestamp === undefined);
  const bytes = kept.reduce((sum, s) => sum + (s.status?.bytes ?? 0), 0);
  const { snapshotsPerTeam: count, snapshotBytesPerTeam: limit } = w.limits;
  const free = 'delete snapshots you no longer need (GET /v1/snapshots, asb snapshot ls / rm, E2B delete_snapshot)';
  if (kept.length >= count) throw new AsbError('QuotaExceeded', `team "${team}" keeps ${String(kept.length)} snapshots on this worker, its quota is ${String(count)}: ${free}`);
  if (bytes >= limit) throw new AsbError('QuotaExceeded', `team "${team}"'s snapshots take ${gib(bytes)} on this worker, its quota is ${gib(limit)}: ${free}`);
}

const gib = (bytes: number): string => `${(bytes / 2 ** 30).toFixed(2)} GiB`;

/** Takes a snapshot of the sandbox for the principal's team and waits until it is taken (or failed). */
export async function takeSnapshot(w: WorkerContext, p: Principal, sandbox: Sandbox, opts: { memory: boolean; name?: string; forkOf?: string }): Promise<SandboxSnapshot> {
  await checkSnapshotQuota(w, sandbox.metadata.labels?.[LABEL.owner] ?? p.team);
  const created = await w.store.create<SandboxSnapshot>(SandboxSnapshotType, {
    apiVersion: apiVersionOf(SandboxSnapshotType),
    kind: SandboxSnapshotType.kind,
    metadata: {
      name: newSandboxId(w.cluster.tag),
      namespace: sandbox.metadata.namespace ?? w.defaultNamespace,
      labels: { [LABEL.owner]: sandbox.metadata.labels?.[LABEL.owner] ?? p.team, ...(opts.forkOf === undefined ? {} : { [FORK_LABEL]: opts.forkOf }) },
      ...(opts.name === undefined ? {} : { annotations: { [SNAPSHOT_NAME_ANNOTATION]: opts.name } }),
    },
    spec: { sandboxRef: { name: sandbox.metadata.name }, mode: opts.memory ? 'Full' : 'Filesystem' },
  });
  try {
    return await waitTaken(w, created);
  } catch (err) {
    // A failed snapshot is not kept: the caller got the reason, and nothing is left to delete.
    if (!isAsbError(err, 'Timeout') && !isAsbError(err, 'Unavailable')) await w.store.delete(SandboxSnapshotType, created.metadata.namespace ?? w.defaultNamespace, created.metadata.name).catch(() => undefined);
    throw err;
  }
}

/** The principal's snapshots, newest first. */
export async function listSnapshots(w: WorkerContext, p: Principal): Promise<SandboxSnapshot[]> {
  const page = await w.store.list<SandboxSnapshot>(SandboxSnapshotType, { labelSelector: p.admin ? LABEL.owner : `${LABEL.owner}=${p.team}` });
  return page.items.filter((s) => s.metadata.deletionTimestamp === undefined).sort((a, b) => (b.metadata.creationTimestamp ?? '').localeCompare(a.metadata.creationTimestamp ?? ''));
}

/** A snapshot of the principal's team by id, or by the name its owner gave it; 404 otherwise (another team's too). */
export async function findSnapshot(w: WorkerContext, p: Principal, id: string): Promise<SandboxSnapshot> {
  if (isObjectName(id)) {
    const snap = await w.store.tryGet<SandboxSnapshot>(SandboxSnapshotType, w.defaultNamespace, id);
    if (snap !== undefined && canSee(p, snap) && snap.metadata.deletionTimestamp === undefined) return snap;
  }
  const named = (await listSnapshots(w, p)).find((s) => s.metadata.annotations?.[SNAPSHOT_NAME_ANNOTATION] === id);
  if (named === undefined) throw snapshotNotFound(id);
  return named;
}

export async function deleteSnapshot(w: WorkerContext, snap: SandboxSnapshot): Promise<void> {
  await w.store.delete(SandboxSnapshotType, snap.metadata.namespace ?? w.defaultNamespace, snap.metadata.name);
}

export interface FromSnapshotOptions {
  /** ISO time the sandbox is deleted at. */
  shutdownTime?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  /** Replaces the source's egress policy. */
  network?: EgressPolicy;
  wait: boolean;
}

/**
 * Starts a sandbox from the snapshot, for the snapshot's team: the source's pod template,
 * template label, egress policy and annotations, and spec.snapshotRef; the worker's operator
 * restores it. With `wait`, resolves once it is Ready.
 */
export async function startFromSnapshot(w: WorkerContext, snap: SandboxSnapshot, opts: FromSnapshotOptions): Promise<Sandbox> {
  const source = snap.status?.source;
  if (snap.status?.phase !== 'Ready' || source === undefined) throw new AsbError('Conflict', `snapshot "${snap.metadata.name}" is not ready (${snap.status?.phase ?? 'Pending'})`);
  const owner = snap.metadata.labels?.[LABEL.owner] ?? '';
  const annotations: Record<string, string> = { ...opts.annotations };
  for (const key of [ANNOTATION.publicPorts, POD_SECURITY_ANNOTATION]) {
    const value = source.annotations?.[key];
    if (value !== undefined) annotations[key] = value;
  }
  const sandbox: Sandbox = {
    apiVersion: apiVersionOf(SandboxType),
    kind: SandboxType.kind,
    metadata: {
      name: newSandboxId(w.cluster.tag),
      namespace: snap.metadata.namespace ?? w.defaultNamespace,
      labels: {
        ...opts.labels,
        [LABEL.owner]: owner,
        [LABEL.launchType]: 'cold',
        [FROM_SNAPSHOT_LABEL]: snap.metadata.name,
        ...(source.template === undefined ? {} : { [LABEL.template]: source.template }),
      },
      ...(Object.keys(annotations).length === 0 ? {} : { annotations }),
      finalizers: [RUNTIME_FINALIZER],
    },
    spec: {
      podTemplate: structuredClone(source.podTemplate),
      ...(source.volumeClaimTemplates === undefined ? {} : { volumeClaimTemplates: structuredClone(source.volumeClaimTemplates) }),
      operatingMode: 'Running',
      ...(opts.shutdownTime === undefined ? {} : { lifecycle: { shutdownTime: opts.shutdownTime, shutdownPolicy: 'Delete' } }),
      ...(opts.network !== undefined ? { network: networkSpec(opts.network) } : source.network === undefined ? {} : { network: structuredClone(source.network) }),
      snapshotRef: { name: snap.metadata.name },
    },
  };
  const created = await w.store.create<Sandbox>(SandboxType, sandbox);
  w.index.remember(created);
  return opts.wait ? waitReady(w, created) : created;
}

export type ForkOutcome = { sandbox: Sandbox } | { error: AsbError };

/**
 * Fork ×count: one snapshot of the sandbox's memory and files (the source pauses for it and goes
 * on), then `count` sandboxes started from it at once, each Ready or failed on its own, then the
 * snapshot is deleted (each fork has its own copy of the files by then).
 */
export async function forkSandbox(w: WorkerContext, p: Principal, sandbox: Sandbox, opts: { count: number; shutdownTime?: string }): Promise<ForkOutcome[]> {
  const snap = await takeSnapshot(w, p, sandbox, { memory: true, forkOf: sandbox.metadata.name });
  try {
    const settled = await Promise.allSettled(Array.from({ length: opts.count }, () => startFromSnapshot(w, snap, { wait: true, ...(opts.shutdownTime === undefined ? {} : { shutdownTime: opts.shutdownTime }) })));
    return settled.map((s): ForkOutcome => (s.status === 'fulfilled' ? { sandbox: s.value } : { error: s.reason instanceof AsbError ? s.reason : new AsbError('Internal', String(s.reason)) }));
  } finally {
    await deleteSnapshot(w, snap).catch((err: unknown) => w.log.warn({ err, snapshot: snap.metadata.name }, 'cannot delete a fork\'s snapshot'));
  }
}
