// How one suspension of a sandbox treats its memory, and what its status says afterwards, as pure
// functions of the object and the runtime's answer. The controller (sandbox-controller.ts) does
// the work; the pause APIs read the outcome from the conditions written here.
import type { Condition } from '../api/meta.ts';
import { ANNOTATION, SUSPEND_MEMORY_VALUES, suspensionStrategyOf, type Sandbox, type SuspendMemory } from '../api/types.ts';
import { isAsbError } from '../errors.ts';
import type { PodState } from '../runtime/runtime.ts';

/** The Suspended condition's reasons: the first three with status True, CheckpointFailed with False (the sandbox runs on). */
export const SUSPENDED_REASON = {
  /** Memory, processes and files kept: the next wake restores them. */
  memoryKept: 'MemoryKept',
  /** Files and volumes kept, as the sandbox's strategy (Stop) or the pause asked. */
  filesKept: 'FilesKept',
  /** Memory was asked for where it could fall back; only files were kept, and the message says why. */
  memoryNotKept: 'MemoryNotKept',
  /** The suspension needed memory and it could not be saved: the sandbox was put back to Running. */
  checkpointFailed: 'CheckpointFailed',
} as const;

/** After a wake from a memory checkpoint: True Restored, or False RestoreFailed when the pod started from its files. */
export const MEMORY_RESTORED = 'MemoryRestored';

/** What this suspension asks of memory: the pause's own choice (the annotation), else the sandbox's strategy. */
export function suspendMemoryOf(sandbox: Sandbox): SuspendMemory {
  const asked = sandbox.metadata.annotations?.[ANNOTATION.suspendMemory];
  if (asked !== undefined && (SUSPEND_MEMORY_VALUES as readonly string[]).includes(asked)) return asked as SuspendMemory;
  return suspensionStrategyOf(sandbox.spec) === 'Hibernate' ? 'required' : 'none';
}

/** For the suspensions the operator starts itself (idle, shutdownTime): they must happen, so memory falls back to files. */
export function automaticSuspendMemory(sandbox: Sandbox): SuspendMemory {
  return suspensionStrategyOf(sandbox.spec) === 'Hibernate' ? 'fallback' : 'none';
}

export type StopDecision = { outcome: 'fallback'; why: string } | { outcome: 'fail'; reason: string; why: string };

/**
 * What to do when a stop with memory rejected with `err`: keep the files instead (saying why), or
 * give up the suspension. Errors other than a runtime that cannot (NotImplemented) or a save that
 * failed (CheckpointFailed) are not decided here: the caller rethrows them.
 */
export function decideStopFailure(memory: SuspendMemory, err: unknown): StopDecision | undefined {
  const why = err instanceof Error ? err.message : String(err);
  // A pod that is not running (it exited, or never started) has no memory to keep: its files are all there is.
  if (isAsbError(err, 'SandboxNotRunning')) return { outcome: 'fallback', why };
  const cannot = isAsbError(err, 'NotImplemented');
  if (!cannot && !isAsbError(err, 'CheckpointFailed')) return undefined;
  if (memory === 'fallback' || (memory === 'preferred' && cannot)) return { outcome: 'fallback', why };
  return { outcome: 'fail', reason: cannot ? 'MemoryNotSupported' : SUSPENDED_REASON.checkpointFailed, why };
}

const MiB = 1024 * 1024;

/** The Suspended condition's reason and message once the pod stopped. */
export function suspendedSummary(state: PodState, fallbackWhy: string | undefined): { reason: string; message: string } {
  if (state.checkpoint !== undefined) {
    const mib = (state.checkpoint.bytes / MiB).toFixed(1);
    return { reason: SUSPENDED_REASON.memoryKept, message: `memory, processes and files kept: a ${mib} MiB checkpoint taken at ${state.checkpoint.at}; the next wake restores it` };
  }
  if (fallbackWhy !== undefined) return { reason: SUSPENDED_REASON.memoryNotKept, message: `memory not kept, files and volumes kept (the next wake starts the pod again): ${fallbackWhy}` };
  return { reason: SUSPENDED_REASON.filesKept, message: 'files and volumes kept; processes ended (the next wake starts the pod again)' };
}

/** A Suspended condition saying the sandbox's last pause kept its memory: E2B's pauseMode "full". */
export function keptMemory(conditions: readonly Condition[] | undefined): boolean {
  return conditions?.find((c) => c.type === 'Suspended')?.reason === SUSPENDED_REASON.memoryKept;
}
