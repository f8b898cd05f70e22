// The one test of the lane runner's fixture files (test/fixtures/lanes/local-lane.ts and
// test/k8s/fixtures/k8s-lane.ts; not named *.test.ts, so only test/test-lanes.test.ts runs them).
// With ASB_LANE_FIXTURE_DIR set, each marks that it runs and waits, at most 60 s, for the other
// lane's mark: it passes only when both lanes run at once. It fails when ASB_LANE_FIXTURE_FAIL
// names its lane. When ASB_LANE_FIXTURE_HANG names its lane, its test passes but its process never
// ends: it starts a `sleep` it keeps a pipe to, as a file that forgets a child process does. When
// ASB_LANE_FIXTURE_ORPHAN names it, its process ends but leaves a `sleep` outside its tree holding
// its output, as a daemon started by a test and never stopped would.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

const WAIT_MS = 60_000;

export function laneFixture(mine: string, other: string): void {
  test(`the ${mine} lane's fixture runs`, async () => {
    const dir = process.env.ASB_LANE_FIXTURE_DIR;
    if (dir !== undefined) {
      writeFileSync(join(dir, mine), '');
      const deadline = Date.now() + WAIT_MS;
      while (!existsSync(join(dir, other))) {
        assert.ok(Date.now() < deadline, `the ${other} lane did not run while the ${mine} lane did`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    assert.notEqual(process.env.ASB_LANE_FIXTURE_FAIL, mine, `the ${mine} lane was asked to fail`);
    if (process.env.ASB_LANE_FIXTURE_HANG === mine) spawn('sleep', ['3600'], { stdio: ['ignore', 'pipe', 'ignore'] });
    if (process.env.ASB_LANE_FIXTURE_ORPHAN === mine) spawn('sh', ['-c', 'sleep 3601 &'], { stdio: ['ignore', 'inherit', 'ignore'] });
  });
}
