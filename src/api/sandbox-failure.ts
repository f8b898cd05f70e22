// Why a sandbox stopped for good, in the words the operator wrote on it: the reason and message
// of its Ready condition (ErrImagePull, OOMKilled, Evicted, NameConflict, RuntimeUnavailable,
// SandboxExpired, ...), as kubectl shows them. Every surface that shows such a sandbox (the REST
// view and so the CLI and the console, a create or resume that waited on it, E2B's errors) reads
// them here, so none of them can say only "Failed".
import { findCondition } from './meta.ts';
import type { Sandbox } from './types.ts';

export interface SandboxFailure {
  /** One CamelCase word, e.g. ErrImagePull. */
  reason: string;
  message: string;
}

/** The reason and message of a Failed or Expired sandbox; undefined in any other phase. */
export function sandboxFailure(sandbox: Sandbox): SandboxFailure | undefined {
  const phase = sandbox.status?.phase;
  if (phase !== 'Failed' && phase !== 'Expired') return undefined;
  const ready = findCondition(sandbox.status?.conditions, 'Ready');
  const reason = ready?.status === 'False' && ready.reason !== '' ? ready.reason : phase;
  const message = (ready?.status === 'False' ? ready.message : undefined) ?? sandbox.status?.message ?? `the sandbox is ${phase}`;
  return { reason, message };
}

/** `<reason>: <message>`, for one line of an error. */
export function describeFailure(failure: SandboxFailure): string {
  return `${failure.reason}: ${failure.message}`;
}
