// The host-wide pool of user-namespace id ranges (src/runtime/local/id-ranges.ts): every sandbox
// on the host gets a range no other live sandbox holds, keeps it, and gives it back on delete.
// The last test runs a real local runtime over a pool of its own.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { AsbError } from '../src/errors.ts';
import type { PodRequest } from '../src/runtime/runtime.ts';
import { startTestRuntime, stopTestRuntime } from './support/test-runtime.ts';
import { claimIdRange, FIRST_HOST_ID, ID_RANGE_SIZE, keepIdRange, rangeOfSlot, releaseIdRange, sweepStaleIdRanges } from '../src/runtime/local/id-ranges.ts';

async function fixture(t: { after(fn: () => Promise<void>): void }): Promise<{ pool: string; pod(name: string): Promise<string> }> {
  const dir = await mkdtemp(join(tmpdir(), 'asb-id-ranges-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  return {
    pool: join(dir, 'pool'),
    pod: async (name) => {
      const at = join(dir, 'pods', name);
      await mkdir(at, { recursive: true });
      return at;
    },
  };
}

test('pods get distinct ranges above the shared one, even when they claim at once; a pod asking again gets its own back', async (t) => {
  const f = await fixture(t);
  const pods = await Promise.all(Array.from({ length: 12 }, (_, i) => f.pod(`p${String(i)}`)));
  const ranges = await Promise.all(pods.map((p) => claimIdRange(f.pool, p)));
  assert.equal(new Set(ranges.map((r) => r.hostId)).size, 12, 'no two pods share a range');
  for (const r of ranges) assert.ok(r.hostId >= FIRST_HOST_ID && r.size === ID_RANGE_SIZE);
  assert.deepEqual(await claimIdRange(f.pool, pods[3] ?? ''), ranges[3], 'the same pod asking again (a start after a crash) keeps its range');
});

test('a released range is handed out again; a release by another owner leaves it held', async (t) => {
  const f = await fixture(t);
  const [a, b] = [await f.pod('a'), await f.pod('b')];
  const ra = await claimIdRange(f.pool, a);
  await releaseIdRange(f.pool, b, ra);
  assert.notDeepEqual(await claimIdRange(f.pool, b), ra, 'b could not release a\'s range');
  await releaseIdRange(f.pool, a, ra);
  const c = await f.pod('c');
  assert.deepEqual(await claimIdRange(f.pool, c), ra, 'a\'s range is free again');
  // A release without the range (a crash before it was recorded) finds the owner's claim.
  await releaseIdRange(f.pool, c);
  assert.deepEqual((await readdir(f.pool)).filter((n) => /^\d+$/.test(n)).length, 1, 'only b still holds one');
});

test('a claim whose pod directory is gone (a state dir deleted without its pods) is swept, and its range handed out again; live ones stay', async (t) => {
  const f = await fixture(t);
  const gone = await f.pod('gone');
  assert.deepEqual(await claimIdRange(f.pool, gone), rangeOfSlot(0));
  const live = await claimIdRange(f.pool, await f.pod('live'));
  assert.deepEqual(live, rangeOfSlot(1));
  await rm(gone, { recursive: true });
  assert.equal(await sweepStaleIdRanges(f.pool), 1);
  const next = await Promise.all([claimIdRange(f.pool, await f.pod('n1')), claimIdRange(f.pool, await f.pod('n2'))]);
  assert.deepEqual(next.map((r) => r.hostId).sort(), [rangeOfSlot(0).hostId, rangeOfSlot(2).hostId], 'slot 0 went to one of them, never twice, and the live slot 1 to neither');
  assert.equal(await sweepStaleIdRanges(f.pool), 0);
});

test('a pod keeps its recorded range: a lost claim is made again, one a live pod of another state dir holds is refused', async (t) => {
  const f = await fixture(t);
  const [a, b] = [await f.pod('a'), await f.pod('b')];
  const ra = await claimIdRange(f.pool, a);
  await rm(join(f.pool, String((ra.hostId - FIRST_HOST_ID) / ID_RANGE_SIZE)));
  await keepIdRange(f.pool, a, ra);
  assert.notDeepEqual(await claimIdRange(f.pool, b), ra, 'the claim is back: b gets another range');
  await assert.rejects(keepIdRange(f.pool, b, ra), (err: unknown) => err instanceof AsbError && err.code === 'Conflict' && err.message.includes(a));
});

test('a runtime that finds a pod\'s recorded range held by another live pod refuses to start it, naming both', async (t) => {
  const pool = await mkdtemp(join(tmpdir(), 'asb-id-pool-'));
  t.after(() => rm(pool, { recursive: true, force: true }));
  const first = await startTestRuntime('asb-id-rt-', 'asbidr0', '10.28.0.0/16', { idRangesDir: pool });
  t.after(() => rm(first.root, { recursive: true, force: true }));
  const req: PodRequest = { id: 'held1', uid: 'uid-held1', namespace: 'default', hostname: 'held1', spec: { containers: [{ name: 'main', image: 'agent-sandbox/base', command: ['sleep', 'infinity'] }] } };
  assert.equal((await first.rt.start(req)).phase, 'Running');
  await first.rt.stop('held1');
  await first.rt.close();
  // Another state dir's live pod now holds that slot (a pool restored from elsewhere, say).
  const other = await mkdtemp(join(tmpdir(), 'asb-id-other-'));
  t.after(() => rm(other, { recursive: true, force: true }));
  for (const name of await readdir(pool)) if (/^\d+$/.test(name)) await writeFile(join(pool, name), other);
  const second = await startTestRuntime('asb-id-rt-', 'asbidr0', '10.28.0.0/16', { idRangesDir: pool, root: first.root });
  t.after(() => stopTestRuntime(second));
  const state = await second.rt.start(req);
  assert.equal(state.phase, 'Failed');
  assert.equal(state.reason, 'CreateContainerConfigError');
  assert.ok((state.message ?? '').includes(other), state.message);
});
