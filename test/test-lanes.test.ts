// `make test` runs its files in two lanes at once (scripts/test-lanes.ts): the Kubernetes tier
// beside the rest. These run the real runner on two fixture files, one per lane
// (test/support/lane-fixture.ts), with its logs in a temporary directory.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { globSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test, type TestContext } from 'node:test';
import { ALONE, readTimes, splitLanes, TIMES_FILE, TOGETHER } from '../scripts/test-lanes.ts';

const repoRoot = resolve(import.meta.dirname, '..');
const LOCAL_FIXTURE = 'test/fixtures/lanes/local-lane.ts';
const K8S_FIXTURE = 'test/k8s/fixtures/k8s-lane.ts';
const NEXT_LOCAL_FIXTURE = 'test/fixtures/lanes/local-lane2.ts';

interface Run {
  code: number;
  out: string;
  err: string;
  logs: string;
}

function runLanes(t: TestContext, files: string[], env: Record<string, string> = {}): Promise<Run> {
  const logs = mkdtempSync(join(tmpdir(), 'asb-lanes-'));
  t.after(() => rmSync(logs, { recursive: true, force: true }));
  // Without this test runner's own context variable: a `node --test` that finds it runs no files (it
  // takes itself for a nested run); nor this run's bounds (CI's deadline), which each test sets as it needs.
  const { NODE_TEST_CONTEXT: _ours, ASB_TEST_DEADLINE: _deadline, ASB_TEST_FILE_LIMIT_S: _limit, ...outer } = process.env;
  return new Promise((res, rej) => {
    execFile(process.execPath, ['scripts/test-lanes.ts', '--logs', logs, ...files], { cwd: repoRoot, env: { ...outer, ASB_TEST_LOCAL_LANES: '2', ...env }, timeout: 120_000 }, (err, stdout, stderr) => {
      if (err !== null && typeof err.code !== 'number') {
        rej(new Error(`the lane runner did not run: ${err.message}`));
        return;
      }
      res({ code: err === null ? 0 : Number(err.code), out: stdout, err: stderr, logs });
    });
  });
}

test('by default (what make test and CI run) every test/k8s/ file is in the k8s lane and every other test file in one local lane, ALONE ones too', async (t) => {
  const lanes = splitLanes(['test/**/*.test.ts'], readTimes(TIMES_FILE), 1);
  assert.deepEqual(lanes.map((l) => [l.name, l.after]), [['k8s', undefined], ['local', undefined]]);
  assert.deepEqual(lanes.find((l) => l.name === 'local')?.files.sort(), globSync('test/**/*.test.ts').filter((f) => !f.startsWith('test/k8s/')).sort());
  const run = await runLanes(t, [LOCAL_FIXTURE], { ASB_TEST_LOCAL_LANES: '1' });
  assert.equal(run.code, 0, run.out);
  assert.match(run.out, /^lane local: 1 test files/m);
  const bad = await runLanes(t, [LOCAL_FIXTURE], { ASB_TEST_LOCAL_LANES: '3' });
  assert.equal(bad.code, 2);
});

test('with ASB_TEST_LOCAL_LANES=2 every test/k8s/ file is in the k8s lane and every other test file in one of two local lanes, none twice or lost', () => {
  const lanes = splitLanes(['test/**/*.test.ts']);
  const files = (name: string): string[] => lanes.find((l) => l.name === name)?.files ?? [];
  assert.deepEqual(lanes.map((l) => l.name), ['k8s', 'local-a', 'local-b', 'alone']);
  // The files that fail beside another local file run alone, after both local lanes.
  assert.deepEqual(files('alone'), [...ALONE].sort());
  assert.deepEqual(lanes.find((l) => l.name === 'alone')?.after, ['local-a', 'local-b']);
  assert.equal([...files('local-a'), ...files('local-b')].some((f) => ALONE.includes(f)), false);
  assert.deepEqual(files('k8s'), globSync('test/k8s/**/*.test.ts').sort());
  assert.equal([...files('local-a'), ...files('local-b')].some((f) => f.startsWith('test/k8s/')), false);
  assert.deepEqual(lanes.flatMap((l) => l.files).sort(), globSync('test/**/*.test.ts').sort());
  for (const group of TOGETHER.map((g) => g.filter((f) => !ALONE.includes(f)))) {
    const lane = lanes.find((l) => l.files.includes(group[0] ?? ''))?.name;
    for (const f of group) assert.ok(files(lane ?? '').includes(f), `${f} runs in ${String(lane)} with ${group.join(', ')}`);
  }
});

test('the local files are balanced by their committed times: the two local lanes differ by no more than the longest file', () => {
  const times = readTimes(TIMES_FILE);
  const local = globSync('test/**/*.test.ts').filter((f) => !f.startsWith('test/k8s/') && !ALONE.includes(f));
  // The table covers today's local files (a file added since counts as the median).
  assert.ok(local.filter((f) => times.has(f)).length >= local.length * 0.9, 'the times table is missing most files: refresh it from a full run');
  const lanes = splitLanes(local, times);
  const sum = (name: string): number => (lanes.find((l) => l.name === name)?.files ?? []).reduce((s, f) => s + (times.get(f) ?? 0), 0);
  const longest = Math.max(...local.map((f) => times.get(f) ?? 0));
  assert.ok(Math.abs(sum('local-a') - sum('local-b')) <= longest, `local-a ${String(sum('local-a'))} s, local-b ${String(sum('local-b'))} s`);
  // Made-up times, longest first to the lane with less: 100 → a, 90 → b, 10 → b (100 > 90), 5 → a (100 = 100), 5 → b.
  const made = new Map([['test/x1.test.ts', 100], ['test/x2.test.ts', 90], ['test/x3.test.ts', 10], ['test/x4.test.ts', 5], ['test/x5.test.ts', 5]]);
  assert.deepEqual(splitLanes([...made.keys()], made).map((l) => [l.name, l.files]), [
    ['local-a', ['test/x1.test.ts', 'test/x4.test.ts']],
    ['local-b', ['test/x2.test.ts', 'test/x3.test.ts', 'test/x5.test.ts']],
  ]);
});

test('both lanes run at once, each line prefixed with its lane and whole in its own log; both passing exits 0', async (t) => {
  const marks = mkdtempSync(join(tmpdir(), 'asb-lane-marks-'));
  t.after(() => rmSync(marks, { recursive: true, force: true }));
  // Each fixture waits for the other lane's to run: a runner that ran the lanes one after the other fails here.
  const run = await runLanes(t, [LOCAL_FIXTURE, K8S_FIXTURE], { ASB_LANE_FIXTURE_DIR: marks });
  assert.equal(run.code, 0, run.out);
  assert.match(run.out, /^k8s {5}│ ✔ the k8s lane's fixture runs/m);
  assert.match(run.out, /^local-a │ ✔ the local lane's fixture runs/m);
  assert.match(run.out, /^lane k8s: passed: 1 tests, 1 passed, 0 failed/m);
  assert.match(run.out, /^lane local-a: passed: 1 tests, 1 passed, 0 failed/m);
  const k8sLog = readFileSync(join(run.logs, 'k8s.log'), 'utf8');
  assert.match(k8sLog, /^✔ the k8s lane's fixture runs/m);
  assert.doesNotMatch(k8sLog, /local lane/);
  assert.match(readFileSync(join(run.logs, 'local-a.log'), 'utf8'), /^✔ the local lane's fixture runs/m);
  // Each lane's per-file timings: a header, then one row per file with its wall and its time before the first test.
  for (const [lane, file] of [['k8s', K8S_FIXTURE], ['local-a', LOCAL_FIXTURE]] as const) {
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
  assert.match(run.out, /^lane local-a: passed/m);
  assert.match(run.out, /── lane k8s failed [^\n]*\n✖ failing tests:\n[\s\S]*the k8s lane's fixture runs[\s\S]*the k8s lane was asked to fail/);
  assert.match(run.out, /^make test: lane k8s failed$/m);
});

test('a test file whose process never ends is killed past the limit with what it started, named in the summary, and its lane goes on to the next file', async (t) => {
  // The fixture's test passes, then its process lives on (a child `sleep` holds a pipe to it): without
  // the limit the lane, and CI's whole run, would wait for it for ever.
  const run = await runLanes(t, [LOCAL_FIXTURE, NEXT_LOCAL_FIXTURE], { ASB_TEST_LOCAL_LANES: '1', ASB_LANE_FIXTURE_HANG: 'local', ASB_TEST_FILE_LIMIT_S: '10' });
  assert.equal(run.code, 1, run.out);
  assert.match(run.out, /^local │ ⏱ test\/fixtures\/lanes\/local-lane\.ts has run 0 min \d+ s, past a test file's limit \(0 min 10 s\): killing it and what it started:$/m);
  const sleeper = /^local │ ⏱ {3}(\d+) \S sleep 3600$/m.exec(run.out);
  assert.ok(sleeper !== null, `the killed file's process tree names its sleep:\n${run.out}`);
  // Gone, or dead and not yet reaped by whoever inherited it.
  const state = ((): string => {
    try {
      const stat = readFileSync(`/proc/${sleeper[1] ?? ''}/stat`, 'utf8');
      return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    } catch {
      return 'gone';
    }
  })();
  assert.ok(state === 'gone' || state === 'Z', `the file's sleep outlived it (state ${state})`);
  // The next file ran after the killed one, in the same lane.
  assert.ok(run.out.indexOf('✔ the next local lane\'s fixture runs') > run.out.indexOf('killing it'), run.out);
  assert.match(run.out, /^lane local: FAILED \(exit 1\): 3 tests, 2 passed, 1 failed/m);
  assert.match(run.out, /^killed: test\/fixtures\/lanes\/local-lane\.ts: its process ran past a test file's limit \(0 min 10 s\)/m);
  assert.match(readFileSync(join(run.logs, 'local.log'), 'utf8'), /^⏱ test\/fixtures\/lanes\/local-lane\.ts has run/m);
});

test('at the run\'s deadline (ASB_TEST_DEADLINE, which CI sets) every lane says what it was running and stops, and the summary says so with the machine\'s load', async (t) => {
  const deadline = Math.ceil(Date.now() / 1000) + 10;
  const run = await runLanes(t, [LOCAL_FIXTURE, NEXT_LOCAL_FIXTURE], { ASB_TEST_LOCAL_LANES: '1', ASB_LANE_FIXTURE_HANG: 'local', ASB_TEST_DEADLINE: String(deadline) });
  assert.equal(run.code, 1, run.out);
  assert.ok(Date.now() >= deadline * 1000, 'the run ended before its deadline');
  assert.match(run.out, /^make test: the tests begin 0 min \d+ s before the run's deadline$/m);
  assert.match(run.out, /^local │ ⏱ the run's deadline \(ASB_TEST_DEADLINE\) has come: stopping this lane$/m);
  assert.match(run.out, /^local │ ⏱ running: test\/fixtures\/lanes\/local-lane\.ts, for 0 min \d+ s; its processes:$/m);
  assert.match(run.out, /^local │ ⏱ {3}\d+ \S sleep 3600$/m);
  assert.match(run.out, /^make test: the run's deadline has come; load average [\d.]+ [\d.]+ [\d.]+; the busiest processes:\n\s*PID/m);
  assert.match(run.out, /^lane local: STOPPED at the run's deadline: /m);
  // The lane stopped: the file after the stuck one never ran.
  assert.doesNotMatch(run.out, /next local lane's fixture/);
});

test('a file that ends leaving a process outside its tree holding its output (the runner waits on it) has that process killed and fails; its lane goes on', async (t) => {
  const run = await runLanes(t, [LOCAL_FIXTURE, NEXT_LOCAL_FIXTURE], { ASB_TEST_LOCAL_LANES: '1', ASB_LANE_FIXTURE_ORPHAN: 'local', ASB_TEST_FILE_LIMIT_S: '10' });
  assert.equal(run.code, 1, run.out);
  assert.match(run.out, /^local │ ⏱ test\/fixtures\/lanes\/local-lane\.ts has ended, but processes it started hold its output open \(the runner waits for its end\): killing them:$/m);
  assert.match(run.out, /^local │ ⏱ {3}\d+ \S sleep 3601$/m);
  assert.ok(run.out.indexOf('✔ the next local lane\'s fixture runs') > run.out.indexOf('killing them'), run.out);
  // Its tests passed; the lane fails for what it left behind, and says so.
  assert.match(run.out, /^lane local: FAILED \(exit 1\): 2 tests, 2 passed, 0 failed/m);
  assert.match(run.out, /^killed: test\/fixtures\/lanes\/local-lane\.ts: processes it started held its output open after it ended/m);
});

test('a run bound that is not a positive number of seconds is refused, naming it', async (t) => {
  for (const [name, value] of [['ASB_TEST_DEADLINE', 'soon'], ['ASB_TEST_DEADLINE', String(Date.now())], ['ASB_TEST_FILE_LIMIT_S', '-5']] as const) {
    const run = await runLanes(t, [LOCAL_FIXTURE], { ASB_TEST_LOCAL_LANES: '1', [name]: value });
    assert.equal(run.code, 2, `${name}=${value}: ${run.out}`);
    assert.match(run.err, new RegExp(`^${name} must be `), `${name}=${value}`);
  }
  // Empty is unset (a shell's `VAR= make test`).
  const unset = await runLanes(t, [LOCAL_FIXTURE], { ASB_TEST_LOCAL_LANES: '1', ASB_TEST_DEADLINE: '' });
  assert.equal(unset.code, 0, unset.out);
});

test('TEST_FILES naming one file runs that file alone, in its lane', async (t) => {
  const run = await runLanes(t, [LOCAL_FIXTURE]);
  assert.equal(run.code, 0, run.out);
  assert.match(run.out, /^lane local-a: 1 test files/m);
  assert.doesNotMatch(run.out, /^lane k8s/m);
  assert.doesNotMatch(run.out, /k8s lane's fixture/);
});

/** Every pod network and cluster tag a test file declares for the sandboxes it runs on this host, in the forms test/support takes them. */
function networksOf(text: string): { tags: string[]; cidrs: string[] } {
  const tags: string[] = [];
  const cidrs: string[] = [];
  const octet = (o: string): string => (o.includes('.') ? o.replaceAll("'", '') : `10.${o}.0.0/16`);
  const forms: [RegExp, (m: RegExpMatchArray) => void][] = [
    [/startTestSystem\(\s*'([a-z0-9]{4})',\s*(\d+)/g, (m) => tags.push(m[1] ?? '') && cidrs.push(octet(m[2] ?? ''))],
    [/\[\s*'[a-z0-9-]+',\s*'([a-z0-9]{4})',\s*(\d+|'[\d./]+')\s*\]/g, (m) => tags.push(m[1] ?? '') && cidrs.push(octet(m[2] ?? ''))],
    [/(?:clusterTag|tag): '([a-z0-9]{4})',\s*(?:subnetOctet|octet): (\d+)/g, (m) => tags.push(m[1] ?? '') && cidrs.push(octet(m[2] ?? ''))],
    [/(?:startTestRuntime\([^,]+,\s*'\w+',|subnet:|'--subnet',|ASB_SUBNET:|SUBNET =|link:)\s*'(10\.[\d.]+\/\d+)'/g, (m) => cidrs.push(m[1] ?? '')],
  ];
  for (const [form, take] of forms) for (const m of text.matchAll(form)) take(m);
  return { tags, cidrs };
}

const range = (cidr: string): [number, number] => {
  const [ip = '', bits = '32'] = cidr.split('/');
  const base = ip.split('.').reduce((n, o) => n * 256 + Number(o), 0);
  const size = 2 ** (32 - Number(bits));
  const start = base - (base % size);
  return [start, start + size - 1];
};

test('no two test files run sandboxes on one pod subnet or cluster tag (bridge), so any two can run at once in two lanes', () => {
  const files = globSync('test/**/*.test.ts').sort();
  // A unit test's pod subnets are strings only: the files that start a runtime, a worker, a system or a world are the ones that count.
  const runs = /startTestSystem|startTestFederation|startWorkerProcess|startTestRuntime|AttackLab\.create|createLocalRuntime|startWorld|ASB_SUBNET/;
  const declared = files.map((f) => ({ f, text: readFileSync(f, 'utf8') })).filter(({ text }) => runs.test(text)).map(({ f, text }) => ({ f, ...networksOf(text) }));
  const clashes = new Set<string>();
  for (const [i, a] of declared.entries()) {
    for (const b of declared.slice(i + 1)) {
      for (const tag of a.tags) if (b.tags.includes(tag)) clashes.add(`${a.f} and ${b.f}: tag ${tag}`);
      for (const x of a.cidrs) {
        for (const y of b.cidrs) {
          const [[x0, x1], [y0, y1]] = [range(x), range(y)];
          if (x0 <= y1 && y0 <= x1) clashes.add(`${a.f} ${x} and ${b.f} ${y}`);
        }
      }
    }
  }
  assert.ok(declared.filter((d) => d.cidrs.length > 0).length > 50, 'the declarations were found');
  assert.deepEqual([...clashes], []);
});
