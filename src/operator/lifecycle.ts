// Time-based lifecycle decisions for one sandbox, as pure functions of the object and the time:
// scheduled shutdown (spec.lifecycle.shutdownTime with Delete, Retain or Suspend) and the idle timeout.
import { ANNOTATION, LABEL, type Sandbox, type SandboxShutdownPolicy } from '../api/types.ts';

/** Milliseconds since the epoch at which the sandbox expires, if it has a shutdown time. */
export function expiryOf(sandbox: Sandbox): number | undefined {
  const at = sandbox.spec.lifecycle?.shutdownTime;
  if (at === undefined) return undefined;
  const ms = Date.parse(at);
  return Number.isNaN(ms) ? undefined : ms;
}

export function shutdownPolicyOf(sandbox: Sandbox): SandboxShutdownPolicy {
  return sandbox.spec.lifecycle?.shutdownPolicy ?? 'Delete';
}

/** The idle timeout in ms (0: never): spec.idleTimeoutMs wins over the annotation. */
export function idleTimeoutOf(sandbox: Sandbox): number {
  const fromSpec = sandbox.spec.idleTimeoutMs;
  if (fromSpec !== undefined) return Math.max(0, fromSpec);
  const raw = sandbox.metadata.annotations?.[ANNOTATION.idleTimeoutMs];
  if (raw === undefined) return 0;
  const parsed = Number(raw);
  return Number.isFinite(parsed) && parsed > 0 ? parsed : 0;
}

/**
 * The last activity written on the sandbox (ANNOTATION.lastActivity) in ms since the epoch, 0 if
 * none: how activity seen by an API process reaches an operator in another (activity-recorder.ts);
 * a warm claim writes it too, as part of the bind.
 */
export function recordedActivity(sandbox: Sandbox): number {
  const at = Date.parse(sandbox.metadata.annotations?.[ANNOTATION.lastActivity] ?? '');
  return Number.isNaN(at) ? 0 : at;
}

/** Claimed by someone: it carries an owner and has left its warm pool. */
export function isClaimed(sandbox: Sandbox): boolean {
  const labels = sandbox.metadata.labels ?? {};
  return labels[LABEL.pool] === undefined && labels[LABEL.owner] !== undefined;
}

export interface IdleCheck {
  idle: boolean;
  /** When not idle yet: ms until it would be. */
  remainingMs?: number;
}

/**
 * Whether a running sandbox has been idle past its timeout. Unclaimed warm members never idle
 * out: the pool exists to keep them running. The idle clock starts at the later of the last
 * activity (a claim counts; after a restart, the restart does; so does activity recorded on the
 * sandbox by another process) and the last time the pod became ready (a wake counts). Only for
 * a pod that is ready now: one still starting is not idle, however long it takes.
 */
export function idleCheck(sandbox: Sandbox, now: number, lastActivity: number): IdleCheck {
  const timeout = idleTimeoutOf(sandbox);
  if (timeout <= 0 || !isClaimed(sandbox)) return { idle: false };
  // Called for a pod that is ready now. A status that does not say so yet (Pending, Waking, or
  // Running without a readyTime) is this reconcile's news: it became ready now. Reading only the
  // stored readyTime, a sandbox whose pod took longer than its timeout to become ready (a Python
  // server and a 1 s probe period: ~1.3 s, against a 1.5 s timeout) was hibernated as it got ready.
  const readyTime = sandbox.status?.phase === 'Running' ? sandbox.status.readyTime : undefined;
  const readyAt = readyTime === undefined ? now : Date.parse(readyTime);
  const since = Math.max(lastActivity, Number.isNaN(readyAt) ? 0 : readyAt, recordedActivity(sandbox));
  const remaining = since + timeout - now;
  return remaining <= 0 ? { idle: true } : { idle: false, remainingMs: remaining };
}
