// The embedded store's Kubernetes semantics, against a real SQLite file per test: the shared
// contract (test/support/store-suite.ts, also run against a real kube-apiserver by
// test/k8s/store.test.ts), then what only the embedded store does: restart, retention, group
// commit, close, the injected clock.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DatabaseSync } from 'node:sqlite';
import { test, type TestContext } from 'node:test';
import { Registry } from 'prom-client';
import { SandboxType } from '../src/api/types.ts';
import { isAsbError } from '../src/errors.ts';
import { createMetrics } from '../src/metrics/metrics.ts';
import type { Clock } from '../src/base/clock.ts';
import { openSqliteStore, type SqliteStore } from '../src/store/sqlite.ts';
import { box as sandboxBox, recordWatch, rejection, storeSuite, summary, until, withImage, type Box } from './support/store-suite.ts';

function tempPath(t: TestContext): string {
  const dir = mkdtempSync(join(tmpdir(), 'asb-store-test-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return join(dir, 'store.db');
}

async function openStore(t: TestContext, path = tempPath(t), eventRetention?: number): Promise<SqliteStore> {
  const store = await openSqliteStore(eventRetention === undefined ? { path } : { path, eventRetention });
  t.after(() => store.close());
  return store;
}

const box = (name: string, namespace = 'default', labels?: Record<string, string>): Box => sandboxBox(name, namespace, labels);

storeSuite(async (t) => ({ store: await openStore(t), ns: (logical) => logical }));

test('a Conflict names the version the object is at', async (t) => {
  const store = await openStore(t);
  const v1 = await store.create(SandboxType, box('sb-1'));
  const v2 = await store.update(SandboxType, withImage(v1, 'alpine'));
  const err = await rejection(store.update(SandboxType, withImage(v1, 'ubuntu')));
  assert.ok(err.message.includes(`is at ${v2.metadata.resourceVersion ?? '?'}`), err.message);
});

test('a watch resumed from an old version after a restart gets every change, in order; "0" replays the whole retained history', async (t) => {
  const path = tempPath(t);
  const first = await openSqliteStore({ path });
  const start = (await first.list(SandboxType)).resourceVersion;
  const a = await first.create(SandboxType, box('a'));
  await first.create(SandboxType, box('b', 'other'));
  const a2 = await first.update(SandboxType, withImage(a, 'alpine'));
  await first.updateStatus(SandboxType, { ...a2, status: { phase: 'Running' } });
  await first.delete(SandboxType, 'other', 'b');
  const endRv = (await first.list(SandboxType)).resourceVersion;
  await first.close();

  const store = await openStore(t, path);
  const all = recordWatch(t, store, { resourceVersion: start });
  const live = await store.create(SandboxType, box('c'));
  await until(() => all.events.length === 6, 'replay plus the live event');
  assert.deepEqual(summary(all.events), ['ADDED a', 'ADDED b', 'MODIFIED a', 'MODIFIED a', 'DELETED b', 'ADDED c']);
  const versions = all.events.map((e) => Number(e.object.metadata.resourceVersion));
  assert.equal(versions[4], Number(endRv), 'the list version is the last write');
  assert.equal(versions[5], Number(live.metadata.resourceVersion));
  assert.deepEqual(all.errors, []);

  // "0" (an empty store's list version) with the whole history retained: the full history, so
  // nothing between that list and this watch is lost.
  const zero = recordWatch(t, store, { resourceVersion: '0' });
  await store.create(SandboxType, box('d'));
  await until(() => zero.events.length === 7, 'the whole history then live');
  assert.deepEqual(summary(zero.events), ['ADDED a', 'ADDED b', 'MODIFIED a', 'MODIFIED a', 'DELETED b', 'ADDED c', 'ADDED d']);
});

test('a watch from a version older than the retained events ends with Gone', async (t) => {
  const store = await openStore(t, tempPath(t), 5);
  const first = await store.create(SandboxType, box('sb-0'));
  for (let i = 1; i < 10; i++) await store.create(SandboxType, box(`sb-${i}`));
  const old = recordWatch(t, store, { resourceVersion: first.metadata.resourceVersion ?? '' });
  await until(() => old.errors.length === 1, 'Gone');
  assert.ok(isAsbError(old.errors[0], 'Gone'), String(old.errors[0]));
  assert.equal(old.errors[0].status, 410);
  assert.deepEqual(old.events, []);

  // The last five changes are still there.
  const recent = recordWatch(t, store, { resourceVersion: String(Number(store.resourceVersion) - 5) });
  await until(() => recent.events.length === 5, 'the retained events');
  assert.deepEqual(recent.errors, []);

  // "0" (any version) once history is trimmed: the current state as ADDED events, then live.
  await store.delete(SandboxType, 'default', 'sb-0');
  const zero = recordWatch(t, store, { resourceVersion: '0' });
  await store.create(SandboxType, box('sb-10'));
  await until(() => zero.events.length === 10, 'current state then live');
  assert.deepEqual(zero.events.map((e) => e.type), Array<string>(10).fill('ADDED'));
  assert.deepEqual(zero.events.map((e) => e.object.metadata.name), [...Array.from({ length: 9 }, (_, i) => `sb-${i + 1}`), 'sb-10']);
});

test('close commits pending writes, then refuses new ones; reopening keeps versions increasing', async (t) => {
  const path = tempPath(t);
  const store = await openSqliteStore({ path });
  const pending = Promise.all([store.create(SandboxType, box('x')), store.create(SandboxType, box('y'))]);
  await store.close();
  const [x, y] = await pending;
  await store.close();
  assert.equal((await rejection(store.create(SandboxType, box('z')))).code, 'Unavailable');

  const reopened = await openStore(t, path);
  assert.deepEqual((await reopened.get(SandboxType, 'default', 'y')).metadata.uid, y.metadata.uid);
  const z = await reopened.create(SandboxType, box('z'));
  assert.ok(Number(z.metadata.resourceVersion) > Number(x.metadata.resourceVersion));
  assert.ok(Number(z.metadata.resourceVersion) > Number(y.metadata.resourceVersion));
});

test('a failed commit rejects every write in its batch and changes nothing', async (t) => {
  const path = tempPath(t);
  await (await openSqliteStore({ path })).close();
  // Stand-in for a full disk: SQLite itself refuses the batch that holds "poison".
  const raw = new DatabaseSync(path);
  raw.exec("CREATE TRIGGER poison BEFORE INSERT ON events WHEN NEW.name = 'poison' BEGIN SELECT RAISE(ABORT, 'disk on fire'); END");
  raw.close();
  const store = await openStore(t, path);
  const { events } = recordWatch(t, store, {});
  const before = store.resourceVersion;
  const batch = await Promise.allSettled([
    store.create(SandboxType, box('ok-1')),
    store.create(SandboxType, box('poison')),
    store.create(SandboxType, box('ok-2')),
  ]);
  for (const r of batch) {
    assert.equal(r.status, 'rejected');
    assert.ok(isAsbError(r.reason, 'Unavailable'), String(r.reason));
  }
  assert.equal(store.resourceVersion, before);
  assert.deepEqual((await store.list(SandboxType)).items, []);
  assert.deepEqual(events, []);

  const later = await store.create(SandboxType, box('ok-1'));
  assert.equal(Number(later.metadata.resourceVersion), Number(before) + 1);
  await until(() => events.length === 1, 'the later write\'s event');
  assert.deepEqual(summary(events), ['ADDED ok-1']);
});

test('a write decided on top of a batch whose commit fails never lands', async (t) => {
  const path = tempPath(t);
  await (await openSqliteStore({ path })).close();
  const raw = new DatabaseSync(path);
  // Only the create fails: were the update behind it committed, the object would exist on disk.
  raw.exec("CREATE TRIGGER poison BEFORE INSERT ON events WHEN NEW.name = 'poison' AND NEW.type = 'ADDED' BEGIN SELECT RAISE(ABORT, 'disk on fire'); END");
  raw.close();
  const store = await openSqliteStore({ path });
  t.after(() => store.close());
  const { events } = recordWatch(t, store, {});
  const created = store.create(SandboxType, box('poison'));
  // The create's batch is posted to the writer on the next turn; the update below is decided
  // against it while it commits (or, if the failure came back first, against nothing).
  await new Promise((resolve) => setImmediate(resolve));
  const updated = store.update(SandboxType, withImage(box('poison'), 'alpine'));
  const [c, u] = await Promise.allSettled([created, updated]);
  assert.equal(c.status, 'rejected');
  assert.equal(u.status, 'rejected');
  assert.ok(isAsbError(u.reason, 'Unavailable') || isAsbError(u.reason, 'NotFound'), String(u.reason));
  assert.deepEqual((await store.list(SandboxType)).items, []);
  assert.deepEqual(events, []);

  const later = await store.create(SandboxType, box('ok-1'));
  assert.equal(later.metadata.name, 'ok-1');
  await until(() => events.length === 1, "the later write's event");
  await store.close();
  const reopened = await openStore(t, path);
  assert.deepEqual((await reopened.list(SandboxType)).items.map((o) => o.metadata.name), ['ok-1']);
});

test('timestamps come from the injected clock; writes are counted in the store metrics', async (t) => {
  const clock: Clock = { now: () => Date.parse('2030-01-02T03:04:05.000Z'), after: () => ({ cancel: () => undefined }) };
  const registry = new Registry();
  const store = await openSqliteStore({ path: tempPath(t), clock, metrics: createMetrics(registry) });
  t.after(() => store.close());
  const created = await store.create(SandboxType, { ...box('sb-1'), metadata: { ...box('sb-1').metadata, finalizers: ['f'] } });
  assert.equal(created.metadata.creationTimestamp, '2030-01-02T03:04:05.000Z');
  const deleting = await store.delete(SandboxType, 'default', 'sb-1');
  assert.equal(deleting.metadata.deletionTimestamp, '2030-01-02T03:04:05.000Z');
  await Promise.all([store.create(SandboxType, box('a')), store.create(SandboxType, box('b'))]);

  const text = await registry.metrics();
  assert.match(text, /asb_store_write_seconds_count\{op="create"\} 3/);
  assert.match(text, /asb_store_write_seconds_count\{op="delete"\} 1/);
  assert.match(text, /asb_store_commit_batch_writes_count 3/);
  assert.match(text, /asb_store_commit_batch_writes_sum 4/);
});

test('a store whose owner is exiting is waited for; one that stays held is refused naming its process', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-owner-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'store.db');
  const first = await openSqliteStore({ path });
  // The old owner closes a moment after the new start began (as the previous `make up` exiting).
  const second = openSqliteStore({ path, ownerWaitMs: 10_000 });
  setTimeout(() => void first.close(), 200);
  const opened = await second;
  await opened.close();

  const held = await openSqliteStore({ path });
  t.after(() => held.close());
  await assert.rejects(openSqliteStore({ path, ownerWaitMs: 150 }), (err) => {
    assert.ok(isAsbError(err, 'Unavailable'));
    assert.match(err.message, new RegExp(`in use by process ${process.pid} \\(.*node.*\\), and it did not exit within 0.15 s`));
    return true;
  });
  await assert.rejects(openSqliteStore({ path }), /in use by process/, 'without a wait: refused at once');
});
