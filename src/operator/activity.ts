// Last-activity times per sandbox, in memory only. The API calls touch(id) on every exec, file
// operation, terminal byte batch or proxied request; writing each touch to the store would turn
// a busy sandbox into hundreds of writes a second for a value only the idle check reads. After
// a worker restart the times are gone, so the idle clock restarts from the restart (a sandbox
// gets at most one extra idle period, never hibernates early).
import type { Clock } from '../base/clock.ts';

export interface Activity {
  touch(id: string): void;
  /** Milliseconds since the epoch of the last touch; the tracker's creation time if none since. */
  last(id: string): number;
  forget(id: string): void;
}

export function createActivity(clock: Clock): Activity {
  const times = new Map<string, number>();
  const startedAt = clock.now();
  return {
    touch: (id) => void times.set(id, clock.now()),
    last: (id) => times.get(id) ?? startedAt,
    forget: (id) => void times.delete(id),
  };
}
