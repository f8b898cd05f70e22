// A `node --test` reporter that times each test file of a lane (scripts/test-lanes.ts gives it
// test-artifacts/lanes/<lane>.files.tsv as its destination): how the next engineer finds the slow
// files, and where a file's time goes outside its tests. One row per file as it ends (so a run
// cut short still has the rows so far), in run order:
//   file             the path as the runner names it
//   wall_s           from the runner taking the file up to its process having exited
//   before_first_s   from then to its first test starting: process start, imports, module-level
//                    fixtures (a file with no test counts its whole wall here)
//   tests_s          the top-level tests' own durations, added up (what the spec reporter shows)
//   after_last_s     from its last top-level test ending to the file's end: after hooks, handles
//                    left open, the process exiting
//   tests            how many top-level tests it ran
// The runner names a file by its path in a nesting-0 `test:dequeue` when it starts the file and a
// nesting-0 `test:complete` when it ends; the file's own top-level tests come between, also at
// nesting 0 (one file at a time: --test-concurrency=1).
import { writeFileSync } from 'node:fs';

/**
 * Where the lane runner (scripts/test-lanes.ts) reads which file its `node --test` took up last: a
 * file that ended quickly but left processes holding its output is named by it.
 */
const CURRENT_FILE = process.env.ASB_LANE_CURRENT_FILE;

interface Event {
  type: string;
  data?: { name?: string; nesting?: number; file?: string; details?: { duration_ms?: number } };
}

interface FileTiming {
  started: number;
  firstTest?: number;
  lastTestEnd?: number;
  testsMs: number;
  tests: number;
}

const secs = (ms: number): string => (ms / 1000).toFixed(2);

export const HEADER = 'file\twall_s\tbefore_first_s\ttests_s\tafter_last_s\ttests\n';

export default async function* laneFilesReporter(source: AsyncIterable<Event>): AsyncGenerator<string> {
  yield HEADER;
  const open = new Map<string, FileTiming>();
  // The file being run (one at a time), and its top-level tests' events in between.
  let current: FileTiming | undefined;
  for await (const event of source) {
    const { name, nesting } = event.data ?? {};
    if (name === undefined || nesting !== 0) continue;
    const now = Date.now();
    if (event.type === 'test:dequeue') {
      if (current === undefined && isFileName(name, event.data?.file)) {
        current = { started: now, testsMs: 0, tests: 0 };
        open.set(name, current);
        if (CURRENT_FILE !== undefined) writeFileSync(CURRENT_FILE, `${name}\n`);
      } else if (current !== undefined) {
        current.firstTest ??= now;
      }
    } else if (event.type === 'test:complete') {
      const file = open.get(name);
      if (file !== undefined) {
        open.delete(name);
        if (current === file) current = undefined;
        const wall = now - file.started;
        const before = (file.firstTest ?? now) - file.started;
        const after = file.lastTestEnd === undefined ? 0 : now - file.lastTestEnd;
        yield `${name}\t${secs(wall)}\t${secs(before)}\t${secs(file.testsMs)}\t${secs(after)}\t${String(file.tests)}\n`;
      } else if (current !== undefined) {
        current.tests += 1;
        current.testsMs += event.data?.details?.duration_ms ?? 0;
        current.lastTestEnd = now;
      }
    }
  }
}

/** The runner's event for a whole file carries the file's own path as both its name and its file. */
function isFileName(name: string, file: string | undefined): boolean {
  return file !== undefined && (file === name || file.endsWith(`/${name}`));
}
