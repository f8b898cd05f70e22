// What happened to an object, as a pure function of what the store said of it before and what it
// says now: the lifecycle facts every surface reports alike (Kubernetes Events, the events API,
// webhooks). Level-based like the controllers: the recorder keeps one small summary per object
// and hands the old and the new one here, so a restart that missed some writes still reports
// where each object ended up, and a write that changes nothing of note reports nothing.
//
// Reasons are kubernetes-sigs/agent-sandbox's where it has one (SandboxReady, SandboxSuspended,
// SandboxExpired, SandboxPodCreateFailed, SandboxResumed, SandboxFailed) and ours otherwise.
// Event types are E2B's (`sandbox.lifecycle.created|killed|paused|resumed|updated|checkpointed`)
// where E2B has the fact, and `sandbox.lifecycle.<ours>` where it does not.
import { findCondition, type KubeObject } from '../api/meta.ts';
import { ANNOTATION, LABEL, wantsRunning, type Sandbox, type SandboxClaim, type SandboxSnapshot } from '../api/types.ts';

export type WatchedKind = 'Sandbox' | 'SandboxClaim' | 'SandboxSnapshot';

/** What of an object the facts depend on; stored as JSON between runs. */
export interface Summary {
  uid: string;
  apiVersion: string;
  owner?: string;
  /** Sandbox: its warm pool while unclaimed. */
  pool?: string;
  template?: string;
  running?: boolean;
  phase?: string;
  /** Ready condition: `status/reason`. */
  ready?: string;
  readyMessage?: string;
  readyTime?: string;
  /** Suspended condition when True: its reason. */
  suspended?: string;
  suspendedMessage?: string;
  idle?: boolean;
  /** Suspended condition when False (a pause that could not keep memory): reason and message. */
  suspendFailed?: string;
  /** MemoryRestored condition: `status/reason`, and its message. */
  restored?: string;
  restoredMessage?: string;
  deleting?: boolean;
  deletedAt?: string;
  shutdownTime?: string;
  wakeCause?: string;
  fromSnapshot?: string;
  /** SandboxClaim: the sandbox it bound and how. SandboxSnapshot: the sandbox it was taken of. */
  sandbox?: string;
  launchType?: string;
  memory?: boolean;
}

export interface Involved {
  kind: string;
  apiVersion: string;
  name: string;
  namespace: string;
  uid: string;
}

export interface Fact {
  involved: Involved;
  reason: string;
  type: 'Normal' | 'Warning';
  message: string;
  /** The team's lifecycle event type, or undefined for a fact only Kubernetes Events show (warm pool upkeep). */
  event?: string;
  /** The team whose sandbox it is (events API, webhooks). */
  team?: string;
  /** The sandbox the fact is about (its id). */
  sandboxId?: string;
  template?: string;
  data?: Record<string, unknown>;
}

export const E2B_TYPES = {
  created: 'sandbox.lifecycle.created',
  killed: 'sandbox.lifecycle.killed',
  paused: 'sandbox.lifecycle.paused',
  resumed: 'sandbox.lifecycle.resumed',
  updated: 'sandbox.lifecycle.updated',
  checkpointed: 'sandbox.lifecycle.checkpointed',
} as const;

/** Every type the events API and webhooks carry: E2B's six, then ours. */
export const EVENT_TYPES: readonly string[] = [
  ...Object.values(E2B_TYPES),
  'sandbox.lifecycle.ready',
  'sandbox.lifecycle.forked',
  'sandbox.lifecycle.expired',
  'sandbox.lifecycle.pause_failed',
  'sandbox.lifecycle.oom_killed',
  'sandbox.lifecycle.evicted',
  'sandbox.lifecycle.failed',
  'sandbox.lifecycle.pull_failed',
  'sandbox.lifecycle.start_failed',
  'sandbox.lifecycle.restore_failed',
  'sandbox.lifecycle.snapshot_failed',
];

/** The kubelet's waiting reasons for an image it cannot get. */
const PULL_REASONS = new Set(['ErrImagePull', 'ImagePullBackOff', 'InvalidImageName', 'ErrImageNeverPull']);

/** The object without its undefined fields (summaries are compared after a JSON round trip, which drops them). */
function defined<R>(o: { [K in keyof R]?: R[K] | undefined }): R {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as R;
}

export function summarize(kind: WatchedKind, obj: KubeObject): Summary {
  const meta = obj.metadata;
  const base = { uid: meta.uid ?? '', apiVersion: obj.apiVersion, owner: meta.labels?.[LABEL.owner], template: meta.labels?.[LABEL.template] };
  if (kind === 'Sandbox') {
    const s = obj as Sandbox;
    const ready = findCondition(s.status?.conditions, 'Ready');
    const suspended = findCondition(s.status?.conditions, 'Suspended');
    const restored = findCondition(s.status?.conditions, 'MemoryRestored');
    return defined<Summary>({
      ...base,
      pool: meta.labels?.[LABEL.pool],
      running: wantsRunning(s.spec),
      phase: s.status?.phase,
      ready: ready === undefined ? undefined : `${ready.status}/${ready.reason}`,
      readyMessage: ready?.message,
      readyTime: s.status?.readyTime,
      suspended: suspended?.status === 'True' ? suspended.reason : undefined,
      suspendedMessage: suspended?.status === 'True' ? suspended.message : undefined,
      idle: meta.annotations?.[ANNOTATION.suspendedIdle] === undefined ? undefined : true,
      suspendFailed: suspended?.status === 'False' ? `${suspended.reason}: ${suspended.message ?? ''}` : undefined,
      restored: restored === undefined ? undefined : `${restored.status}/${restored.reason}`,
      restoredMessage: restored?.message,
      deleting: meta.deletionTimestamp === undefined ? undefined : true,
      deletedAt: meta.deletionTimestamp,
      shutdownTime: s.spec.lifecycle?.shutdownTime,
      wakeCause: meta.annotations?.[ANNOTATION.wakeCause],
      fromSnapshot: s.spec.snapshotRef?.name,
    });
  }
  if (kind === 'SandboxClaim') {
    const c = obj as SandboxClaim;
    return defined<Summary>({ ...base, sandbox: c.status?.sandbox?.name, launchType: c.status?.launchType, deleting: meta.deletionTimestamp === undefined ? undefined : true });
  }
  const snap = obj as SandboxSnapshot;
  const ready = findCondition(snap.status?.conditions, 'Ready');
  return defined<Summary>({ ...base, sandbox: snap.spec.sandboxRef.name, phase: snap.status?.phase, readyMessage: ready?.message, memory: snap.status?.memory });
}

interface Subject {
  kind: WatchedKind;
  name: string;
  namespace: string;
}

/**
 * The facts between two summaries of one object: `before` undefined is an object seen for the
 * first time, `after` undefined one that is gone. `sandboxUid` finds a sandbox's uid by name
 * (a snapshot's facts are told on its sandbox).
 */
export function factsOf(subject: Subject, before: Summary | undefined, after: Summary | undefined, sandboxUid: (name: string) => Summary | undefined): Fact[] {
  if (subject.kind === 'Sandbox') return sandboxFacts(subject, before, after);
  if (subject.kind === 'SandboxClaim') return claimFacts(subject, before, after);
  return snapshotFacts(subject, before, after, sandboxUid);
}

function involvedOf(kind: string, s: Subject, sum: Summary): Involved {
  return { kind, apiVersion: sum.apiVersion, name: s.name, namespace: s.namespace, uid: sum.uid };
}

function sandboxFacts(s: Subject, before: Summary | undefined, after: Summary | undefined): Fact[] {
  const now = after ?? before;
  if (now === undefined) return [];
  const involved = involvedOf('Sandbox', s, now);
  const out: Fact[] = [];
  const team = now.owner;
  const fact = (reason: string, message: string, event: string | undefined, data?: Record<string, unknown>, type: Fact['type'] = 'Normal'): void => {
    out.push(defined<Fact>({ involved, reason, type, message, event: team === undefined ? undefined : event, team, sandboxId: s.name, template: now.template, data }));
  };
  if (before === undefined && after !== undefined) {
    if (after.owner === undefined && after.pool !== undefined) {
      fact('SandboxCreated', `created as a warm member of pool ${after.pool}`, undefined);
      out.push({ involved: { kind: 'SandboxWarmPool', apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', name: after.pool, namespace: s.namespace, uid: '' }, reason: 'SandboxCreated', type: 'Normal', message: `created warm sandbox ${s.name}` });
    } else {
      fact('SandboxCreated', after.fromSnapshot === undefined ? 'sandbox created' : `sandbox created from snapshot ${after.fromSnapshot}`, E2B_TYPES.created, defined<Record<string, unknown>>({ launchType: 'cold', fromSnapshot: after.fromSnapshot }));
      if (after.fromSnapshot !== undefined) fact('SandboxForked', `started from snapshot ${after.fromSnapshot}`, 'sandbox.lifecycle.forked', { snapshot: after.fromSnapshot });
    }
  } else if (before !== undefined && after !== undefined && before.owner === undefined && after.owner !== undefined) {
    fact('SandboxClaimed', `claimed from warm pool ${before.pool ?? ''} by team ${after.owner}`, E2B_TYPES.created, { launchType: 'warm', pool: before.pool ?? '' });
  }
  if (after === undefined) {
    // Gone without our seeing it being deleted (no finalizer, or the recorder was away).
    if (before?.deleting !== true) fact('SandboxDeleted', 'sandbox deleted', E2B_TYPES.killed);
    return out;
  }
  const prev: Summary = before ?? { uid: after.uid, apiVersion: after.apiVersion };
  if (before !== undefined && prev.running === false && after.running === true) {
    const cause = parseCause(after.wakeCause);
    if (cause !== undefined) fact('SandboxResumed', `woken by a request to ${cause.host}${cause.path}`, E2B_TYPES.resumed, { trigger: 'request', host: cause.host, path: cause.path });
    else fact('SandboxResumed', 'resumed', E2B_TYPES.resumed, { trigger: 'api' });
  } else if (before !== undefined && prev.running === after.running && prev.shutdownTime !== after.shutdownTime && after.deleting !== true) {
    fact('SandboxUpdated', after.shutdownTime === undefined ? 'timeout cleared' : `timeout set: ends at ${after.shutdownTime}`, E2B_TYPES.updated, defined<Record<string, unknown>>({ endAt: after.shutdownTime }));
  }
  if (after.readyTime !== undefined && after.readyTime !== prev.readyTime && after.ready === 'True/DependenciesReady') {
    fact('SandboxReady', 'pod is ready', 'sandbox.lifecycle.ready');
  }
  if (after.suspended !== undefined && prev.suspended === undefined) {
    const memory = after.suspended === 'MemoryKept';
    fact('SandboxSuspended', after.suspendedMessage ?? after.suspended, E2B_TYPES.paused, { memory, reason: after.suspended, idle: after.idle === true });
  }
  if (after.suspendFailed !== undefined && after.suspendFailed !== prev.suspendFailed) {
    fact('SandboxSuspendFailed', after.suspendFailed, 'sandbox.lifecycle.pause_failed', undefined, 'Warning');
  }
  const readyReason = after.ready?.split('/')[1];
  if (after.ready !== prev.ready && readyReason !== undefined) {
    const msg = after.readyMessage ?? readyReason;
    if (after.phase === 'Failed' && readyReason === 'OOMKilled') fact('SandboxOOMKilled', msg, 'sandbox.lifecycle.oom_killed', undefined, 'Warning');
    else if (after.phase === 'Failed' && readyReason === 'Evicted') fact('SandboxEvicted', msg, 'sandbox.lifecycle.evicted', undefined, 'Warning');
    else if (PULL_REASONS.has(readyReason)) fact('ImagePullFailed', msg, 'sandbox.lifecycle.pull_failed', { reason: readyReason }, 'Warning');
    else if (readyReason === 'PodStartFailed') fact('SandboxPodCreateFailed', msg, 'sandbox.lifecycle.start_failed', undefined, 'Warning');
    else if (after.phase === 'Failed' && readyReason !== 'NameConflict' && readyReason !== 'SnapshotNotReady') fact('SandboxFailed', msg, 'sandbox.lifecycle.failed', { reason: readyReason }, 'Warning');
  }
  if (after.restored === 'False/RestoreFailed' && prev.restored !== after.restored) {
    fact('RestoreFailed', after.restoredMessage ?? 'the memory checkpoint was not restored', 'sandbox.lifecycle.restore_failed', undefined, 'Warning');
  }
  const expiredNow = after.phase === 'Expired' && prev.phase !== 'Expired';
  const expiredByDelete = after.deleting === true && prev.deleting !== true && after.shutdownTime !== undefined && after.deletedAt !== undefined && Date.parse(after.deletedAt) >= Date.parse(after.shutdownTime);
  if (expiredNow || expiredByDelete) fact('SandboxExpired', `shutdownTime ${after.shutdownTime ?? ''} reached`, 'sandbox.lifecycle.expired', defined<Record<string, unknown>>({ endAt: after.shutdownTime }));
  if (after.deleting === true && prev.deleting !== true) fact('SandboxDeleted', expiredByDelete ? 'deleted at its shutdownTime' : 'sandbox deleted', E2B_TYPES.killed);
  return out;
}

function claimFacts(s: Subject, before: Summary | undefined, after: Summary | undefined): Fact[] {
  if (after?.sandbox === undefined || after.sandbox === before?.sandbox) return [];
  // The team's own claim: its Event carries the team (kubectl shows it to that team), but the team's log has the sandbox's fact.
  return [{ involved: involvedOf('SandboxClaim', s, after), reason: 'SandboxClaimed', type: 'Normal', message: `bound sandbox ${after.sandbox} (${after.launchType ?? 'warm'} start)`, ...(after.owner === undefined ? {} : { team: after.owner }) }];
}

function snapshotFacts(s: Subject, before: Summary | undefined, after: Summary | undefined, sandbox: (name: string) => Summary | undefined): Fact[] {
  if (after?.sandbox === undefined || after.phase === before?.phase) return [];
  if (after.phase !== 'Ready' && after.phase !== 'Failed') return [];
  const source = sandbox(after.sandbox);
  const involved: Involved = { kind: 'Sandbox', apiVersion: source?.apiVersion ?? 'agents.x-k8s.io/v1alpha1', name: after.sandbox, namespace: s.namespace, uid: source?.uid ?? '' };
  const base = defined<Pick<Fact, 'involved' | 'team' | 'sandboxId' | 'template'>>({ involved, team: after.owner, sandboxId: after.sandbox, template: source?.template });
  if (after.phase === 'Ready') {
    return [{ ...base, reason: 'SandboxSnapshotted', type: 'Normal', message: `snapshot ${s.name} taken (${after.memory === true ? 'memory and files' : 'files'})`, ...(after.owner === undefined ? {} : { event: E2B_TYPES.checkpointed }), data: { snapshot: s.name, memory: after.memory === true } }];
  }
  return [{ ...base, reason: 'SnapshotFailed', type: 'Warning', message: `snapshot ${s.name} failed: ${after.readyMessage ?? ''}`, ...(after.owner === undefined ? {} : { event: 'sandbox.lifecycle.snapshot_failed' }), data: { snapshot: s.name } }];
}

function parseCause(raw: string | undefined): { host: string; path: string } | undefined {
  if (raw === undefined) return undefined;
  try {
    const v = JSON.parse(raw) as unknown;
    if (typeof v === 'object' && v !== null && typeof (v as { host?: unknown }).host === 'string' && typeof (v as { path?: unknown }).path === 'string') {
      return { host: (v as { host: string }).host, path: (v as { path: string }).path };
    }
  } catch {
    return undefined;
  }
  return undefined;
}
