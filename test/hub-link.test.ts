// The hub link as the other processes of a cluster see it: the sync agent's side records each
// change of its link in the SyncState's status; a watcher (an API process's route feed) reads it.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { openSqliteStore } from '../src/store/sqlite.ts';
import { CLUSTER_SCOPE } from '../src/store/store.ts';
import { systemClock } from '../src/base/clock.ts';
import { silentLogger } from '../src/base/log.ts';
import { publishHubLink, watchHubLink } from '../src/worker/sync/hub-link.ts';
import { newSyncState, STATE_NAME, SyncStateType, type SyncState } from '../src/worker/sync/sync-apply.ts';
import { waitFor } from './support/wait.ts';

/** Waits until the watcher's view of the link is `connected`. */
function linkIs(watch: { status(): { connected: boolean } }, connected: boolean, what: string): Promise<true> {
  return waitFor(what, () => Promise.resolve(watch.status().connected === connected ? true : undefined), 5_000, 5);
}

test('the sync agent\'s link reaches a watcher through the SyncState; saving the applied version keeps it; closing records the link down', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-hub-link-'));
  const store = await openSqliteStore({ path: join(dir, 'store.db') });
  t.after(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const log = silentLogger();
  const watch = await watchHubLink(store, systemClock, log);
  t.after(() => watch.close());
  assert.deepEqual(watch.status(), { connected: false, appliedVersion: 0 }, 'no SyncState yet: no link');

  // No SyncState yet: the publisher creates it.
  const link = publishHubLink(store, systemClock, log);
  link.set(true);
  await linkIs(watch, true, 'the watcher sees the link up');

  // The agent saves applied versions as plain updates of the spec: the status stays.
  await store.update(SyncStateType, newSyncState(7));
  await waitFor('the watcher sees version 7', () => Promise.resolve(watch.status().appliedVersion === 7 ? true : undefined), 5_000, 5);
  assert.deepEqual(watch.status(), { connected: true, appliedVersion: 7 });

  // Flapping: the last value wins and is what is stored.
  link.set(false);
  link.set(true);
  link.set(false);
  await linkIs(watch, false, 'the watcher sees the link down');
  link.set(true);
  await linkIs(watch, true, 'the watcher sees the link up again');

  // A watcher started now (a new API Pod) reads the current state at once.
  const late = await watchHubLink(store, systemClock, log);
  t.after(() => late.close());
  assert.deepEqual(late.status(), { connected: true, appliedVersion: 7 });

  await link.close();
  const stored = await store.get<SyncState>(SyncStateType, CLUSTER_SCOPE, STATE_NAME);
  assert.equal(stored.status?.hubConnected, false, 'an agent that closes records the link down');
  assert.equal(stored.spec.appliedVersion, 7);
  await linkIs(watch, false, 'the watcher sees the agent gone');
});
