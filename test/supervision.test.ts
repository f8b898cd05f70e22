// `make up` supervises its processes: a crashed hub, worker, router or Envoy comes back on its
// ports and data while the rest keeps serving, and one that keeps crashing is given up on with a
// clear message. The policy is tested with a manual clock; the processes for real, each killed with
// SIGKILL under a running federation.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { restartDelay, supervise, type Run } from '../src/assembly/supervisor.ts';
import { ManualClock } from './support/operator-harness.ts';
import { startTestFederation } from './support/federation.ts';
import { waitFor } from './support/wait.ts';
import { edgeGet } from './support/web-sandbox.ts';

interface FakeRun extends Run {
  crash(): void;
  stopped: boolean;
}

function fakeRun(): FakeRun {
  let exit: (code: string) => void = () => undefined;
  const run: FakeRun = {
    exited: new Promise<string>((resolve) => (exit = resolve)),
    stopped: false,
    crash: () => exit('SIGKILL'),
    stop: () => {
      run.stopped = true;
      exit('stopped');
      return Promise.resolve();
    },
    kill: () => {
      exit('killed');
      return Promise.resolve();
    },
  };
  return run;
}

test('restart delays double from the base up to the cap', () => {
  assert.deepEqual([1, 2, 3, 4, 5, 6, 7].map((n) => restartDelay(n, 500, 10_000)), [500, 1000, 2000, 4000, 8000, 10_000, 10_000]);
});

test('a crashed process is started again after the backoff, and the supervisor says so', async () => {
  const clock = new ManualClock();
  const said: string[] = [];
  const runs: FakeRun[] = [fakeRun()];
  const unit = supervise('region-a worker', runs[0] as FakeRun, () => {
    const next = fakeRun();
    runs.push(next);
    return Promise.resolve(next);
  }, { clock, say: (l) => said.push(l), baseMs: 60_000, maxMs: 60_000 }, 'its log is /x/worker.log');
  runs[0]?.crash();
  await waitFor('the crash to be seen', () => Promise.resolve(said.length > 0 ? true : undefined), 2_000, 5);
  assert.match(said[0] ?? '', /^region-a worker exited unexpectedly \(SIGKILL\); restarting it in 60000 ms; its log is \/x\/worker\.log$/);
  assert.equal(runs.length, 1, 'not before the backoff');
  clock.advance(60_000);
  await waitFor('the restart', () => Promise.resolve(unit.current === runs[1] ? true : undefined), 2_000, 5);
  assert.equal(said[1], 'region-a worker is running again');
  await unit.stop();
  assert.equal(runs[1]?.stopped, true, 'stop() ends the current run');
});

test('one that keeps crashing is given up on after 5 crashes in a minute; a stop during a backoff starts nothing', async () => {
  const clock = new ManualClock();
  const said: string[] = [];
  let current = fakeRun();
  let starts = 0;
  const unit = supervise('hub', current, () => {
    starts++;
    current = fakeRun();
    return Promise.resolve(current);
  }, { clock, say: (l) => said.push(l), baseMs: 1_000, maxMs: 1_000 });
  for (let crash = 1; crash <= 5; crash++) {
    current.crash();
    await waitFor(`crash ${crash} seen`, () => Promise.resolve(said.length >= (crash === 1 ? 1 : 2 * crash - 1) ? true : undefined), 2_000, 5);
    if (crash < 5) {
      clock.advance(1_000);
      await waitFor(`restart ${crash}`, () => Promise.resolve(starts === crash && unit.current === current ? true : undefined), 2_000, 5);
    }
  }
  assert.equal(unit.failed, true);
  assert.match(said.at(-1) ?? '', /^hub exited unexpectedly \(SIGKILL\); it crashed 5 times within 60 s, so it is not restarted again/);
  clock.advance(60_000);
  assert.equal(starts, 4, 'no restart after giving up');

  const other = fakeRun();
  let restarted = false;
  const stopped = supervise('router', other, () => {
    restarted = true;
    return Promise.resolve(fakeRun());
  }, { clock, say: () => undefined });
  other.crash();
  await new Promise((r) => setImmediate(r));
  await stopped.stop();
  clock.advance(60_000);
  assert.equal(restarted, false, 'a stop cancels the pending restart');
});

test('under a running federation, kill -9 of each kind of process: service goes on and the process comes back', { timeout: 280_000 }, async (t) => {
  const said: string[] = [];
  const fed = await startTestFederation([
    ['sup-a', 'supa', 17],
    ['sup-b', 'supb', 18],
  ], 1, { say: (l) => said.push(l), baseMs: 3_000, maxMs: 3_000 });
  t.after(() => fed.cleanup());
  const [a, b] = fed.clusters;
  assert.ok(a !== undefined && b !== undefined);
  const key = fed.adminKey;
  const api = async (url: string, method: string, path: string, json?: unknown): Promise<{ status: number; body: Record<string, unknown> }> => {
    const res = await fetch(`${url}${path}`, { method, headers: { authorization: `Bearer ${key}`, ...(json === undefined ? {} : { 'content-type': 'application/json' }) }, ...(json === undefined ? {} : { body: JSON.stringify(json) }) });
    const text = await res.text();
    return { status: res.status, body: text === '' ? {} : (JSON.parse(text) as Record<string, unknown>) };
  };
  const created = await api(b.edgeUrl, 'POST', '/v1/sandboxes', { template: 'base', cluster: 'sup-b' });
  assert.equal(created.status, 201, JSON.stringify(created.body));
  const inB = { id: String(created.body.id), token: String(created.body.accessToken) };
  /** fed-b's sandbox through a's edge: its envd health answers 204 while the data plane works. */
  const reachable = async (): Promise<boolean> => {
    try {
      return (await edgeGet(a.edgeUrl, `49983-${inB.id}.asb.localhost`, { path: '/health', timeoutMs: 5_000 })).status === 204;
    } catch {
      return false;
    }
  };
  assert.ok(await reachable());
  const back = (name: string): Promise<true> => waitFor(`${name} to be running again`, () => Promise.resolve(said.includes(`${name} is running again`) ? true : undefined), 60_000);

  await t.test("a's worker: creates at a's edge fail over to b through the hub, b's sandbox stays reachable, and the worker returns", async () => {
    const before = a.worker.proc.pid;
    process.kill(before ?? 0, 'SIGKILL');
    const placed = await waitFor('a create at a\'s edge to be placed on sup-b', async () => {
      const r = await api(a.edgeUrl, 'POST', '/v1/sandboxes', { template: 'base', wait: false });
      return r.status === 201 ? r : undefined;
    }, 30_000);
    assert.equal(placed.body.cluster, 'sup-b');
    assert.ok(await reachable(), "b's sandbox through a's edge");
    await back('sup-a worker');
    assert.notEqual(a.worker.proc.pid, before);
    await waitFor("a's worker to answer again", async () => ((await api(a.apiUrl, 'GET', '/v1/status')).status === 200 ? true : undefined), 30_000);
  });

  await t.test("a's router: the edge serves again once it is back", async () => {
    const before = a.router.proc.pid;
    process.kill(before ?? 0, 'SIGKILL');
    await back('sup-a router');
    assert.notEqual(a.router.proc.pid, before);
    await waitFor("b's sandbox through a's edge", async () => ((await reachable()) ? true : undefined), 30_000);
  });

  await t.test("a's Envoy: the edge answers again on the same port", async () => {
    const before = a.envoy.pid;
    process.kill(before ?? 0, 'SIGKILL');
    await back('sup-a Envoy');
    assert.notEqual(a.envoy.pid, before);
    await waitFor("b's sandbox through a's edge", async () => ((await reachable()) ? true : undefined), 30_000);
  });

  await t.test('the hub: the data plane does not notice, and the hub returns on its port', async () => {
    const before = fed.hub.proc.pid;
    process.kill(before ?? 0, 'SIGKILL');
    assert.ok(await reachable(), 'sandboxes stay reachable without the hub');
    await back('hub');
    assert.notEqual(fed.hub.proc.pid, before);
    await waitFor('the hub to answer', async () => ((await api(fed.hubUrl, 'GET', '/v1/status')).status === 200 ? true : undefined), 30_000);
  });
  assert.deepEqual(said.filter((l) => l.includes('not restarted again')), [], 'nothing was given up on');
});
