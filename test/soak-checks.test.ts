// The soak's checks (bench/soak/checks.ts) on synthetic data, no system: each must fail on what
// it is there to catch (a lost write, create or delete, a sandbox stuck in the wrong state, a
// leaking process, residue after the drain, a latency window gone bad) and pass on a clean run.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { expectedState, flatnessFailures, growthVerdicts, latencyWindows, residueRows, slopePerHour, verifyLedger, type LatencySample, type LedgerEvent, type Observed, type Sample } from '../bench/soak/checks.ts';

const MIN = 60_000;
const obs = (phase: string | undefined, files: Record<string, string | null> = {}): Observed => ({ phase, files: new Map(Object.entries(files)) });

test('the ledger passes what the system kept and names each acknowledged create, write and delete it lost, and a sandbox that never reached its asked state', () => {
  const events: LedgerEvent[] = [
    { kind: 'create', id: 'a', atMs: 0 },
    { kind: 'write', id: 'a', path: '/f', sha256: 'aaa111', atMs: 1 },
    { kind: 'write', id: 'a', path: '/f', sha256: 'bbb222', atMs: 2 },
    { kind: 'create', id: 'b', atMs: 0 },
    { kind: 'state', id: 'b', want: 'paused', atMs: 10 },
    { kind: 'create', id: 'c', atMs: 0 },
    { kind: 'delete', id: 'c', atMs: 20 },
    { kind: 'create', id: 'd', atMs: 0 },
    { kind: 'forfeit', id: 'd', atMs: 5 },
  ];
  const want = expectedState(events);
  assert.deepEqual([...want.live.keys()].sort(), ['a', 'b']);
  assert.equal(want.live.get('a')?.files.get('/f'), 'bbb222', 'the last write is the one that must stay');
  const good = new Map([['a', obs('Running', { '/f': 'bbb222' })], ['b', obs('Hibernated')], ['c', obs(undefined)], ['d', obs('Failed')]]);
  assert.deepEqual(verifyLedger(want, good, 10 * MIN, MIN), []);

  const bad = new Map([['a', obs('Running', { '/f': 'aaa111' })], ['b', obs('Running')], ['c', obs('Running')]]);
  const failures = verifyLedger(want, bad, 10 * MIN, MIN);
  assert.equal(failures.length, 3, failures.join('\n'));
  assert.match(failures[0] ?? '', /acknowledged write lost: a:\/f should hash bbb222/);
  assert.match(failures[1] ?? '', /sandbox b did not converge: asked to be paused/);
  assert.match(failures[2] ?? '', /acknowledged delete lost: sandbox c still exists/);
  assert.deepEqual(verifyLedger(want, new Map([['a', obs(undefined)]]), 10 * MIN, MIN), ['acknowledged create lost: sandbox a no longer exists']);
  assert.match(verifyLedger(want, new Map([['a', obs('Running', { '/f': null })]]), 10 * MIN, MIN)[0] ?? '', /reads as missing/);
  // Within the bound, a state or a delete on its way is no failure yet.
  assert.deepEqual(verifyLedger(want, bad, 30, MIN).filter((f) => !f.includes('write')), []);
});

test('the slope fit finds a leak of a few MB an hour through noise, passes a flat series, and starts each restarted process over', () => {
  const flat: Sample[] = [];
  const leak: Sample[] = [];
  for (let i = 0; i < 30; i++) {
    const noise = ((i * 7919) % 13) - 6; // ±6 MB, deterministic
    flat.push({ tMs: i * MIN, value: (100 + noise) * 1e6 });
    leak.push({ tMs: i * MIN, value: (100 + noise + i) * 1e6 }); // +1 MB a minute: 60 MB an hour
  }
  assert.ok(Math.abs((slopePerHour(leak) ?? 0) / 1e6 - 60) < 10, String(slopePerHour(leak)));
  assert.equal(slopePerHour([{ tMs: 5, value: 1 }]), undefined);
  const bound = { absPerHour: 32e6, fractionPerHour: 0.1 };
  const verdicts = growthVerdicts(new Map([['worker:1 rss', flat], ['worker:2 rss', leak], ['router:3 rss', flat.slice(0, 3)]]), bound, 2 * MIN, 5);
  assert.deepEqual(verdicts.map((v) => [v.series, v.ok]), [['worker:1 rss', true], ['worker:2 rss', false], ['router:3 rss', true]]);
  assert.equal(verdicts[2]?.slopePerHour, undefined, 'too short to fit: reported, not judged');
  // The warm-up is left out: a steep first minutes then flat is no leak.
  const warm = flat.map((s, i) => ({ tMs: s.tMs, value: i < 3 ? s.value / 4 : s.value }));
  assert.equal(growthVerdicts(new Map([['hub:4 rss', warm]]), bound, 3 * MIN, 5)[0]?.ok, true);
  assert.equal(growthVerdicts(new Map([['hub:4 rss', warm]]), bound, 0, 5)[0]?.ok, false);
});

test('the residue check fails on any kind left after the drain, and reports the most seen during', () => {
  const { rows, failures } = residueRows({ mounts: 0, veths: 0 }, [{ mounts: 4, veths: 3 }, { mounts: 9, veths: 1, loops: 2 }], { mounts: 1, veths: 0, loops: 0 });
  assert.deepEqual(rows.find((r) => r.kind === 'mounts'), { kind: 'mounts', before: 0, maxDuring: 9, after: 1 });
  assert.deepEqual(rows.find((r) => r.kind === 'loops'), { kind: 'loops', before: 0, maxDuring: 2, after: 0 });
  assert.deepEqual(failures, ['residue after the drain: mounts 0 before, 1 after']);
  assert.deepEqual(residueRows({ mounts: 2 }, [], { mounts: 2 }).failures, []);
});

test('latency windows give p50/p99 per window without fault-window samples, and a window far off the best one fails', () => {
  const samples: LatencySample[] = [];
  for (let w = 0; w < 3; w++) {
    for (let i = 0; i < 100; i++) samples.push({ metric: 'exec', atMs: w * 2 * MIN + i * 1000, ms: w === 2 ? 50 + i : 10 + (i % 10), inFault: false });
  }
  samples.push({ metric: 'exec', atMs: 10, ms: 99_999, inFault: true });
  const rows = latencyWindows(samples, 0, 2 * MIN);
  assert.deepEqual(rows.map((r) => [r.window, r.count, r.p50, r.p99]), [[0, 100, 15, 19], [1, 100, 15, 19], [2, 100, 100, 149]]);
  const failures = flatnessFailures(rows, { factor: 3, slackMs: 20, minCount: 5 });
  assert.deepEqual(failures.map((f) => /(p\d+) \d+ ms in window (\d)/.exec(f)?.slice(1).join(' ')), ['p50 2', 'p99 2']);
  assert.deepEqual(flatnessFailures(rows.slice(0, 2), { factor: 3, slackMs: 20, minCount: 5 }), []);
  assert.deepEqual(flatnessFailures(rows, { factor: 3, slackMs: 20, minCount: 500 }), [], 'thin windows are not judged');
});
