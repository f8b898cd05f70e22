// `make test` runs its files in two lanes at once (scripts/test-lanes.ts): the Kubernetes tier
// beside the rest. These run the real runner on two fixture files, one per lane
// (test/support/lane-fixture.ts), with its logs in a temporary directory.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { globSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test, type TestContext } from 'node:test';
import { splitLanes } from '../scripts/test-lanes.ts';

const repoRoot = resolve(import.meta.dirname, '..');
const LOCAL_FIXTURE = 'test/fixtures/lanes/local-lane.ts';
const K8S_FIXTURE = 'test/k8s/fixtures/k8s-lane.ts';

interface Run {
  code: number;
  out: string;
  logs: string;
}

function runLanes(t: TestContext, files: string[], env: Record<string, string> = {}): Promise<Run> {
  const logs = mkdtempSync(join(tmpdir(), 'asb-lanes-'));
  t.after(() => rmSync(logs, { recursive: true, force: true }));
  // Without this test runner's own context variable: a `node --test` that finds it runs no files (it takes itself for a nested run).
  const { NODE_TEST_CONTEXT: _ours, ...outer } = process.env;
  return new Promise((res, rej) => {
    execFile(process.execPath, ['scripts/test-lanes.ts', '--logs', logs, ...files], { cwd: repoRoot, env: { ...outer, ...env }, timeout: 120_000 }, (err, stdout) => {
      if (err !== null && typeof err.code !== 'number') {
        rej(new Error(`the lane runner did not run: ${err.message}`));
        return;
      }
      res({ code: err === null ? 0 : Number(err.code), out: stdout, logs });
    });
  });
}

test('the default TEST_FILES glob puts every test/k8s/ file in the k8s lane and every other test file in the local lane, none twice or lost', () => {
  const lanes = splitLanes(['test/**/*.test.ts']);
  const files = (name: string): string[] => lanes.find((l) => l.name === name)?.files ?? [];
  assert.deepEqual(files('k8s'), globSync('test/k8s/**/*.test.ts').sort());
  assert.ok(files('local').includes('test/runtime-local.test.ts'));
  assert.equal(files('local').some((f) => f.startsWith('test/k8s/')), false);
  assert.deepEqual([...files('k8s'), ...files('local')].sort(), globSync('test/**/*.test.ts').sort());
});

test('both lanes run at once, each line prefixed with its lane and whole in its own log; both passing exits 0', async (t) => {
  const marks = mkdtempSync(join(tmpdir(), 'asb-lane-marks-'));
  t.after(() => rmSync(marks, { recursive: true, force: true }));
  // Each fixture waits for the other lane's to run: a runner that ran the lanes one after the other fails here.
  const run = await runLanes(t, [LOCAL_FIXTURE, K8S_FIXTURE], { ASB_LANE_FIXTURE_DIR: marks });
  assert.equal(run.code, 0, run.out);
  assert.match(run.out, /^k8s {3}│ ✔ the k8s lane's fixture runs/m);
  assert.match(run.out, /^local │ ✔ the local lane's fixture runs/m);
  assert.match(run.out, /^lane k8s: passed: 1 tests, 1 passed, 0 failed/m);
  assert.match(run.out, /^lane local: passed: 1 tests, 1 passed, 0 failed/m);
  const k8sLog = readFileSync(join(run.logs, 'k8s.log'), 'utf8');
  assert.match(k8sLog, /^✔ the k8s lane's fixture runs/m);
  assert.doesNotMatch(k8sLog, /local lane/);
  assert.match(readFileSync(join(run.logs, 'local.log'), 'utf8'), /^✔ the local lane's fixture runs/m);
  // Each lane's per-file timings: a header, then one row per file with its wall and its time before the first test.
  for (const [lane, file] of [['k8s', K8S_FIXTURE], ['local', LOCAL_FIXTURE]] as const) {
    const [header, ...rows] = readFileSync(join(run.logs, `${lane}.files.tsv`), 'utf8').trimEnd().split('\n');
    assert.equal(header, 'file\twall_s\tbefore_first_s\ttests_s\tafter_last_s\ttests');
    assert.equal(rows.length, 1, `${lane}: ${rows.join(' | ')}`);
    const [name, wall, before, , , tests] = (rows[0] ?? '').split('\t');
    assert.equal(name, file);
    assert.equal(tests, '1');
    // The fixture waits for the other lane's before its test ends: its wall is more than nothing, and holds its time before the test.
    assert.ok(Number(wall) >= Number(before) && Number(before) > 0, rows[0]);
  }
});

test('a failing lane makes the run exit 1, naming that lane and its failing test; the other lane still runs to its end', async (t) => {
  const run = await runLanes(t, [LOCAL_FIXTURE, K8S_FIXTURE], { ASB_LANE_FIXTURE_FAIL: 'k8s' });
  assert.equal(run.code, 1, run.out);
  assert.match(run.out, /^lane k8s: FAILED \(exit 1\): 1 tests, 0 passed, 1 failed/m);
  assert.match(run.out, /^lane local: passed/m);
  assert.match(run.out, /── lane k8s failed [^\n]*\n✖ failing tests:\n[\s\S]*the k8s lane's fixture runs[\s\S]*the k8s lane was asked to fail/);
  assert.match(run.out, /^make test: lane k8s failed$/m);
});

test('TEST_FILES naming one file runs that file alone, in its lane', async (t) => {
  const run = await runLanes(t, [LOCAL_FIXTURE]);
  assert.equal(run.code, 0, run.out);
  assert.match(run.out, /^lane local: 1 test files/m);
  assert.doesNotMatch(run.out, /^lane k8s/m);
  assert.doesNotMatch(run.out, /k8s lane's fixture/);
});
