// Activity that has to reach controllers in another process: on the kube store the API may run
// apart from the operator (--role=api, or a --role=all replica that does not hold the Lease), and
// the operator's idle clock (activity.ts) is in memory. Touches here are kept in memory too and
// written to the sandbox as its asb.dev/last-activity annotation, which the idle check
// (lifecycle.ts) reads besides the operator's own tracker.
//
// Only sandboxes with an idle timeout are written, each at most once per quarter of its timeout
// (30 s at most), always with the latest touch: the write rate follows the number of active
// sandboxes, not their traffic (a sandbox busy all day with a 10-minute timeout costs one write
// per 30 s), and the last touch before a pause is written within a quarter of the timeout, so
// the sandbox never hibernates early. A touch costs a Map write on the request path.
import { ANNOTATION, SandboxType, type Sandbox } from '../api/types.ts';
import { isAsbError } from '../errors.ts';
import type { ObjectStore } from '../store/store.ts';
import type { Clock, Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { idleTimeoutOf, recordedActivity } from './lifecycle.ts';

const MAX_INTERVAL_MS = 30_000;
const SWEEP_MS = 1_000;

export interface ActivityRecorderOptions {
  store: ObjectStore;
  /** The sandbox with this id, from a cache (the claim front's). */
  sandbox(id: string): Sandbox | undefined;
  clock: Clock;
  log: Logger;
}

export interface ActivityRecorder {
  touch(id: string): void;
  close(): void;
}

export function createActivityRecorder(opts: ActivityRecorderOptions): ActivityRecorder {
  const { store, clock } = opts;
  const log = opts.log.child({ component: 'activity-recorder' });
  /** id → latest touch not yet written (or found not worth writing) */
  const touched = new Map<string, number>();
  /** id → when we last wrote it (our clock); pruned once older than any interval */
  const writtenAt = new Map<string, number>();
  let timer: Timer | undefined;
  let sweeping = false;
  let closed = false;

  const write = async (id: string, at: number): Promise<void> => {
    const sandbox = opts.sandbox(id);
    const timeout = sandbox === undefined ? 0 : idleTimeoutOf(sandbox);
    // Gone (or not cached yet), no idle timeout, or the annotation already says as much.
    if (sandbox === undefined || timeout <= 0 || recordedActivity(sandbox) >= at) {
      if (touched.get(id) === at) touched.delete(id);
      return;
    }
    if (clock.now() - (writtenAt.get(id) ?? 0) < Math.min(MAX_INTERVAL_MS, timeout / 4)) return;
    if (touched.get(id) === at) touched.delete(id);
    writtenAt.set(id, clock.now());
    const annotations = { ...sandbox.metadata.annotations, [ANNOTATION.lastActivity]: new Date(at).toISOString() };
    try {
      await store.update<Sandbox>(SandboxType, { ...sandbox, metadata: { ...sandbox.metadata, annotations } });
    } catch (err) {
      if (isAsbError(err, 'NotFound')) return;
      // Changed since the cache saw it (a status write): the next sweep writes from the newer copy.
      if (!touched.has(id)) touched.set(id, at);
      writtenAt.delete(id);
      if (!isAsbError(err, 'Conflict')) log.warn({ err, id }, 'could not record activity; retrying');
    }
  };

  const sweep = async (): Promise<void> => {
    if (sweeping) return;
    sweeping = true;
    try {
      const now = clock.now();
      for (const [id, at] of writtenAt) if (now - at >= MAX_INTERVAL_MS) writtenAt.delete(id);
      await Promise.all([...touched].map(([id, at]) => write(id, at)));
    } finally {
      sweeping = false;
    }
  };

  const schedule = (): void => {
    if (closed || timer !== undefined || touched.size === 0) return;
    timer = clock.after(SWEEP_MS, () => {
      timer = undefined;
      void sweep().finally(schedule);
    });
  };

  return {
    touch(id) {
      touched.set(id, clock.now());
      schedule();
    },
    close() {
      closed = true;
      timer?.cancel();
    },
  };
}
