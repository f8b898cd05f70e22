// A build's log and its step numbers as the caller knows them. E2B's build API runs steps of its
// own before the caller's (a prelude: its `user`), so the engine's step n is the caller's
// n - stepOffset: every entry and failure names the caller's number, and a prelude step is "the
// base step". A build keeps its newest MAX_LOG_ENTRIES entries; offsets stay absolute.
import type { BuildLogEntry } from './contract.ts';
import { MAX_LOG_ENTRIES, type BuildRecord } from './records.ts';

/** Adds an entry to the build's log, its step and message in the caller's numbers; the oldest entries past MAX_LOG_ENTRIES go. */
export function appendLog(build: BuildRecord, timestamp: string, entry: Omit<BuildLogEntry, 'timestamp'>): void {
  const { step, ...rest } = entry;
  const callers = callerStep(build, step);
  build.logs.push({ timestamp, ...rest, message: callerMessage(build, rest.message), ...(callers === undefined ? {} : { step: callers }) });
  if (build.logs.length > MAX_LOG_ENTRIES) {
    const drop = build.logs.length - MAX_LOG_ENTRIES;
    build.logs.splice(0, drop);
    build.logsDropped += drop;
  }
}

/** The caller's number of engine step `step` (undefined: the base, or a prelude step). */
export function callerStep(build: BuildRecord, step: number | undefined): number | undefined {
  if (step === undefined) return undefined;
  const n = step - (build.stepOffset ?? 0);
  return n >= 1 ? n : undefined;
}

/** A message that starts "step N" (the engine's numbering) with the caller's number. */
export function callerMessage(build: BuildRecord, message: string): string {
  const offset = build.stepOffset ?? 0;
  if (offset === 0) return message;
  return message.replace(/^step (\d+)\b/, (_m, n: string) => (Number(n) > offset ? `step ${String(Number(n) - offset)}` : 'the base step'));
}

export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** The step an engine error names: AsbError details `{step}` or a message starting "step N". */
export function stepOf(err: unknown): number | undefined {
  if (typeof err === 'object' && err !== null && 'step' in err && typeof err.step === 'number') return err.step;
  const m = err instanceof Error ? /^step (\d+)\b/.exec(err.message) : null;
  return m === null ? undefined : Number(m[1]);
}
