// A team's snapshots outlive its sandboxes, so they are bounded per team on each worker, in count
// and in bytes (--snapshots-per-team, --snapshot-gib-per-team): past either, a new snapshot (or a
// fork, which takes one) is refused with 403 QuotaExceeded saying what is used and how to free it,
// before anything is paused or written; another team is not affected; deleting frees the quota.
// Against the worker API over the real store and operator, with the in-memory runtime (which takes
// no snapshot itself: a request that passes the quota then fails as NotImplemented, 501).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { apiVersionOf } from '../src/api/meta.ts';
import { LABEL, SandboxSnapshotType, type SandboxSnapshot } from '../src/api/types.ts';
import { call, startWorkerFixture, type WorkerFixture } from './support/worker-fixture.ts';

/** A snapshot the team already keeps, `gib` large, as the snapshot controller leaves a taken one. */
async function kept(fx: WorkerFixture, team: string, name: string, gib: number): Promise<void> {
  const created = await fx.store.create<SandboxSnapshot>(SandboxSnapshotType, {
    apiVersion: apiVersionOf(SandboxSnapshotType),
    kind: SandboxSnapshotType.kind,
    metadata: { name, namespace: 'default', labels: { [LABEL.owner]: team } },
    spec: { sandboxRef: { name: 'gone' }, mode: 'Filesystem' },
  });
  // The snapshot controller answers a new object at once (this runtime takes none): written over
  // until the taken status holds, which it then leaves alone.
  let current = created;
  for (let i = 0; i < 50 && current.status?.bytes !== gib * 2 ** 30; i++) {
    await fx.store.updateStatus<SandboxSnapshot>(SandboxSnapshotType, { ...current, status: { phase: 'Ready', memory: false, bytes: gib * 2 ** 30 } }).catch(() => undefined);
    current = await fx.store.get<SandboxSnapshot>(SandboxSnapshotType, 'default', name);
  }
  assert.equal(current.status?.phase, 'Ready');
}

async function sandboxOf(fx: WorkerFixture, key: string): Promise<string> {
  const made = await call(fx, 'POST', '/v1/sandboxes', { key, json: { template: 'base', wait: true } });
  assert.equal(made.status, 201, made.text);
  return (made.json as { id: string }).id;
}

test('a team at its snapshot count is refused a snapshot and a fork with 403 QuotaExceeded; another team is not; a delete frees it', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn), { snapshotsPerTeam: 2 });
  await kept(fx, 'team-a', 'snap-a1', 0);
  await kept(fx, 'team-a', 'snap-a2', 0);
  const a = await sandboxOf(fx, fx.keys.teamA);

  const refused = await call(fx, 'POST', `/v1/sandboxes/${a}/snapshots`, { key: fx.keys.teamA, json: { memory: false } });
  assert.equal(refused.status, 403, refused.text);
  assert.equal((refused.json as { code?: string }).code, 'QuotaExceeded');
  assert.match(refused.text, /keeps 2 snapshots on this worker, its quota is 2: delete snapshots/);
  const fork = await call(fx, 'POST', `/v1/sandboxes/${a}/fork`, { key: fx.keys.teamA, json: { count: 1 } });
  assert.equal(fork.status, 403, fork.text);
  assert.equal((await fx.store.list<SandboxSnapshot>(SandboxSnapshotType, {})).items.length, 2, 'no snapshot object was made for a refused request');

  // Team B has none: its request passes the quota (and fails only because this runtime takes no snapshots).
  const b = await sandboxOf(fx, fx.keys.teamB);
  const other = await call(fx, 'POST', `/v1/sandboxes/${b}/snapshots`, { key: fx.keys.teamB, json: { memory: false } });
  assert.notEqual(other.status, 403, other.text);

  assert.equal((await call(fx, 'DELETE', '/v1/snapshots/snap-a1', { key: fx.keys.teamA })).status, 202);
  const freed = await call(fx, 'POST', `/v1/sandboxes/${a}/snapshots`, { key: fx.keys.teamA, json: { memory: false } });
  assert.notEqual(freed.status, 403, `a delete freed the quota: ${freed.text}`);
});

test('a team whose snapshots take its bytes quota is refused the next one, naming the GiB used', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn), { snapshotBytesPerTeam: 2 * 2 ** 30 });
  await kept(fx, 'team-a', 'big-1', 1.5);
  const a = await sandboxOf(fx, fx.keys.teamA);
  const under = await call(fx, 'POST', `/v1/sandboxes/${a}/snapshots`, { key: fx.keys.teamA, json: { memory: false } });
  assert.notEqual(under.status, 403, `1.5 of 2 GiB used: ${under.text}`);
  await kept(fx, 'team-a', 'big-2', 0.5);
  const refused = await call(fx, 'POST', `/v1/sandboxes/${a}/snapshots`, { key: fx.keys.teamA, json: { memory: false } });
  assert.equal(refused.status, 403, refused.text);
  assert.match(refused.text, /snapshots take 2\.00 GiB on this worker, its quota is 2\.00 GiB/);
});
