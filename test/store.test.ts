// The embedded store's Kubernetes semantics, against a real SQLite file per test.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DatabaseSync } from 'node:sqlite';
import { test, type TestContext } from 'node:test';
import { Registry } from 'prom-client';
import type { KubeObject } from '../src/api/meta.ts';
import { ApiKeyType, SandboxType } from '../src/api/types.ts';
import { AsbError, isAsbError } from '../src/errors.ts';
import { createMetrics } from '../src/metrics/metrics.ts';
import type { Clock } from '../src/system/clock.ts';
import { openSqliteStore, type SqliteStore } from '../src/store/sqlite.ts';
import type { WatchEvent, WatchOptions } from '../src/store/store.ts';

interface Box extends KubeObject {
  spec?: { image?: string; n?: number };
  status?: { phase?: string };
}

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

function box(name: string, namespace = 'default', labels?: Record<string, string>): Box {
  return { apiVersion: '', kind: '', metadata: { name, namespace, ...(labels === undefined ? {} : { labels }) }, spec: { image: 'busybox' } };
}

/** Resolves with the error the promise rejected with; fails the test if it resolved. */
async function rejection(p: Promise<unknown>): Promise<AsbError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof AsbError, `expected an AsbError, got ${String(err)}`);
    return err;
  }
  assert.fail('expected the call to fail');
}

/** Polls `cond` across event-loop turns, failing after a bounded deadline. */
async function until(cond: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 5000;
  while (!cond()) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setImmediate(resolve));
  }
}

function recordWatch(t: TestContext, store: SqliteStore, opts: WatchOptions): { events: WatchEvent<Box>[]; errors: Error[] } {
  const events: WatchEvent<Box>[] = [];
  const errors: Error[] = [];
  const w = store.watch<Box>(SandboxType, opts, { onEvent: (e) => events.push(e), onError: (e) => errors.push(e) });
  t.after(() => w.close());
  return { events, errors };
}

const summary = (events: WatchEvent<Box>[]): string[] => events.map((e) => `${e.type} ${e.object.metadata.name}`);

test('create sets identity and versions; get returns a private copy', async (t) => {
  const store = await openStore(t);
  const created = await store.create(SandboxType, { ...box('sb-1'), status: { phase: 'Running' } });
  assert.equal(created.metadata.generation, 1);
  assert.match(created.metadata.uid ?? '', /^[0-9a-f-]{36}$/);
  assert.ok(Number(created.metadata.resourceVersion) > 0);
  assert.ok(!Number.isNaN(Date.parse(created.metadata.creationTimestamp ?? '')));
  assert.equal(created.apiVersion, 'agents.x-k8s.io/v1alpha1');
  assert.equal(created.kind, 'Sandbox');
  assert.equal(created.status, undefined, 'status is only set through updateStatus');

  const got = await store.get<Box>(SandboxType, 'default', 'sb-1');
  assert.deepEqual(got, created);
  got.spec = { image: 'mutated' };
  assert.equal((await store.get<Box>(SandboxType, 'default', 'sb-1')).spec?.image, 'busybox');

  assert.equal((await rejection(store.create(SandboxType, box('sb-1')))).code, 'AlreadyExists');
  const missing = await rejection(store.get(SandboxType, 'default', 'nope'));
  assert.equal(missing.code, 'NotFound');
  assert.match(missing.message, /default\/nope/);
  assert.equal(await store.tryGet(SandboxType, 'default', 'nope'), undefined);
  assert.equal(await store.exists(SandboxType, 'default', 'sb-1'), true);
  assert.equal(await store.exists(SandboxType, 'default', 'nope'), false);
  assert.equal(await store.exists(SandboxType, 'other', 'sb-1'), false);
  const noName = await rejection(store.create(SandboxType, { apiVersion: '', kind: '', metadata: { name: '', namespace: 'default' } }));
  assert.equal(noName.code, 'Invalid');
  assert.equal(noName.fields[0]?.field, 'metadata.name');
});

test('cluster-scoped kinds ignore the namespace', async (t) => {
  const store = await openStore(t);
  await store.create(ApiKeyType, { apiVersion: '', kind: '', metadata: { name: 'key-1', namespace: 'ignored' } });
  const got = await store.get(ApiKeyType, '', 'key-1');
  assert.equal(got.metadata.namespace, undefined);
  assert.equal((await store.list(ApiKeyType, { namespace: 'other' })).items.length, 1);
});

test('generateName appends five random characters and never collides', async (t) => {
  const store = await openStore(t);
  const made = await Promise.all(
    Array.from({ length: 40 }, () => store.create(SandboxType, { apiVersion: '', kind: '', metadata: { name: '', generateName: 'pool-', namespace: 'default' } })),
  );
  const names = made.map((o) => o.metadata.name);
  for (const name of names) assert.match(name, /^pool-[a-z0-9]{5}$/);
  assert.equal(new Set(names).size, 40);
});

test('list filters by namespace and pages with a continue token in namespace/name order', async (t) => {
  const store = await openStore(t);
  const expected: string[] = [];
  for (const ns of ['b', 'a']) {
    for (let i = 0; i < 12; i++) await store.create(SandboxType, box(`sb-${String(i).padStart(2, '0')}`, ns));
  }
  for (const ns of ['a', 'b']) for (let i = 0; i < 12; i++) expected.push(`${ns}/sb-${String(i).padStart(2, '0')}`);

  const seen: string[] = [];
  let token: string | undefined;
  let pages = 0;
  do {
    const page = await store.list<Box>(SandboxType, token === undefined ? { limit: 10 } : { limit: 10, continue: token });
    assert.ok(page.items.length <= 10);
    seen.push(...page.items.map((o) => `${o.metadata.namespace ?? ''}/${o.metadata.name}`));
    token = page.continue;
    pages++;
  } while (token !== undefined);
  assert.deepEqual(seen, expected);
  assert.equal(pages, 3);

  const onlyB = await store.list<Box>(SandboxType, { namespace: 'b' });
  assert.equal(onlyB.items.length, 12);
  assert.ok(onlyB.items.every((o) => o.metadata.namespace === 'b'));
  assert.equal(onlyB.continue, undefined);
  const exact = await store.list<Box>(SandboxType, { namespace: 'a', limit: 12 });
  assert.equal(exact.continue, undefined, 'no token when the page holds the last item');
  assert.equal((await rejection(store.list(SandboxType, { continue: 'garbage' }))).code, 'BadRequest');
});

test('label selectors: equality, inequality, existence and sets', async (t) => {
  const store = await openStore(t);
  await store.create(SandboxType, box('web', 'default', { app: 'web', tier: 'front' }));
  await store.create(SandboxType, box('api', 'default', { app: 'api', tier: 'back' }));
  await store.create(SandboxType, box('db', 'default', { app: 'db' }));
  await store.create(SandboxType, box('bare', 'default'));
  const names = async (labelSelector: string): Promise<string[]> =>
    (await store.list(SandboxType, { labelSelector })).items.map((o) => o.metadata.name).sort();

  assert.deepEqual(await names('app=web'), ['web']);
  assert.deepEqual(await names('app==api'), ['api']);
  assert.deepEqual(await names('app!=web'), ['api', 'bare', 'db']);
  assert.deepEqual(await names('tier'), ['api', 'web']);
  assert.deepEqual(await names('!tier'), ['bare', 'db']);
  assert.deepEqual(await names('app in (web, db)'), ['db', 'web']);
  assert.deepEqual(await names('app notin (web),app'), ['api', 'db']);
  assert.deepEqual(await names('app,tier=back'), ['api']);
  assert.deepEqual(await names(''), ['api', 'bare', 'db', 'web']);
  assert.equal((await rejection(store.list(SandboxType, { labelSelector: 'a=(' }))).code, 'BadRequest');
});

test('an update from a stale resourceVersion fails with Conflict naming the object and both versions', async (t) => {
  const store = await openStore(t);
  const v1 = await store.create(SandboxType, box('sb-1'));
  const v2 = await store.update(SandboxType, { ...v1, spec: { image: 'alpine' } });
  const err = await rejection(store.update(SandboxType, { ...v1, spec: { image: 'ubuntu' } }));
  assert.equal(err.code, 'Conflict');
  assert.equal(err.status, 409);
  assert.match(err.message, /Sandbox "default\/sb-1"/);
  assert.ok(err.message.includes(v1.metadata.resourceVersion ?? '?') && err.message.includes(v2.metadata.resourceVersion ?? '?'), err.message);
  assert.equal((await store.get<Box>(SandboxType, 'default', 'sb-1')).spec?.image, 'alpine');

  // Without a resourceVersion the update is unconditional.
  const { resourceVersion: _drop, ...meta } = v1.metadata;
  const forced = await store.update(SandboxType, { ...v1, metadata: meta, spec: { image: 'ubuntu' } });
  assert.equal(forced.spec.image, 'ubuntu');
  assert.equal((await rejection(store.update(SandboxType, box('ghost')))).code, 'NotFound');
});

test('update ignores status, updateStatus changes only status; generation follows the spec', async (t) => {
  const store = await openStore(t);
  const v1 = await store.create(SandboxType, box('sb-1'));
  const v2 = await store.update(SandboxType, { ...v1, spec: { image: 'alpine' }, status: { phase: 'Hacked' } });
  assert.equal(v2.status, undefined);
  assert.equal(v2.metadata.generation, 2);
  assert.equal(v2.metadata.uid, v1.metadata.uid);

  const v3 = await store.updateStatus(SandboxType, { ...v2, spec: { image: 'ignored' }, status: { phase: 'Running' } });
  assert.deepEqual(v3.status, { phase: 'Running' });
  assert.equal(v3.spec.image, 'alpine');
  assert.equal(v3.metadata.generation, 2, 'a status write does not bump generation');
  assert.ok(Number(v3.metadata.resourceVersion) > Number(v2.metadata.resourceVersion));

  const v4 = await store.update(SandboxType, { ...v3, status: { phase: 'Other' } });
  assert.equal(v4.metadata.resourceVersion, v3.metadata.resourceVersion, 'an update that changes nothing writes nothing');
  assert.deepEqual(v4.status, { phase: 'Running' });
  assert.equal((await rejection(store.updateStatus(SandboxType, { ...v1, status: { phase: 'Late' } }))).code, 'Conflict');
});

test('a write is taken as it was when called: changing the object afterwards changes nothing', async (t) => {
  const store = await openStore(t);
  const watched = recordWatch(t, store, {});
  const pending = box('sb-1', 'default', { team: 'a' });
  const created = store.create(SandboxType, pending);
  (pending.metadata.labels ?? {}).team = 'changed';
  (pending.spec ?? {}).image = 'changed';
  assert.deepEqual((await created).metadata.labels, { team: 'a' });
  assert.equal((await created).spec?.image, 'busybox');

  // A write built on a watched object (frozen, shared with every watcher) by spreading it, as
  // controllers do: the shared parts are not copied, the caller's own parts are.
  await until(() => watched.events.length === 1, 'the ADDED event');
  const seen = watched.events[0]?.object as Box;
  const next: Box = { ...seen, metadata: { ...seen.metadata, labels: { team: 'b' } } };
  const updated = store.update(SandboxType, next);
  (next.metadata.labels ?? {}).team = 'changed';
  const v2 = await updated;
  assert.deepEqual(v2.metadata.labels, { team: 'b' });
  assert.equal(v2.metadata.generation, 1, 'a label change does not move generation');
  assert.deepEqual((await store.get<Box>(SandboxType, 'default', 'sb-1')).metadata.labels, { team: 'b' });
  assert.deepEqual(seen.metadata.labels, { team: 'a' }, 'the watched object is unchanged');
  v2.spec = { image: 'mine' };
  assert.equal((await store.get<Box>(SandboxType, 'default', 'sb-1')).spec?.image, 'busybox', 'the writer gets its own copy');
});

test('finalizers hold deletion until the last one is removed', async (t) => {
  const store = await openStore(t);
  const { events } = recordWatch(t, store, {});
  const v1 = await store.create(SandboxType, { ...box('sb-1'), metadata: { ...box('sb-1').metadata, finalizers: ['asb.dev/volumes'] } });

  assert.equal((await rejection(store.delete(SandboxType, 'default', 'sb-1', { resourceVersion: '999' }))).code, 'Conflict');
  assert.equal((await rejection(store.delete(SandboxType, 'default', 'sb-1', { uid: 'other' }))).code, 'Conflict');
  const deleting = await store.delete<Box>(SandboxType, 'default', 'sb-1', { uid: v1.metadata.uid ?? '' });
  assert.ok(deleting.metadata.deletionTimestamp !== undefined);
  assert.equal(deleting.metadata.generation, 2);
  assert.ok((await store.get(SandboxType, 'default', 'sb-1')).metadata.deletionTimestamp !== undefined);

  const adding = await rejection(
    store.update(SandboxType, { ...deleting, metadata: { ...deleting.metadata, finalizers: ['asb.dev/volumes', 'new'] } }),
  );
  assert.equal(adding.code, 'Invalid');

  const gone = await store.update(SandboxType, { ...deleting, metadata: { ...deleting.metadata, finalizers: [] } });
  assert.ok(Number(gone.metadata.resourceVersion) > Number(deleting.metadata.resourceVersion));
  assert.equal(await store.tryGet(SandboxType, 'default', 'sb-1'), undefined);
  await until(() => events.length === 3, 'three events');
  assert.deepEqual(summary(events), ['ADDED sb-1', 'MODIFIED sb-1', 'DELETED sb-1']);

  await store.create(SandboxType, box('plain'));
  await store.delete(SandboxType, 'default', 'plain');
  assert.equal((await rejection(store.get(SandboxType, 'default', 'plain'))).code, 'NotFound');
});

test('a watch resumed from an old version after a restart gets every change, in order, with no gap', async (t) => {
  const path = tempPath(t);
  const first = await openSqliteStore({ path });
  const start = (await first.list(SandboxType)).resourceVersion;
  const a = await first.create(SandboxType, box('a'));
  await first.create(SandboxType, box('b', 'other'));
  const a2 = await first.update(SandboxType, { ...a, spec: { image: 'alpine' } });
  await first.updateStatus(SandboxType, { ...a2, status: { phase: 'Running' } });
  await first.delete(SandboxType, 'other', 'b');
  const endRv = (await first.list(SandboxType)).resourceVersion;
  await first.close();

  const store = await openStore(t, path);
  const all = recordWatch(t, store, { resourceVersion: start });
  const inDefault = recordWatch(t, store, { resourceVersion: start, namespace: 'default' });
  const live = await store.create(SandboxType, box('c'));
  await until(() => all.events.length === 6, 'replay plus the live event');
  assert.deepEqual(summary(all.events), ['ADDED a', 'ADDED b', 'MODIFIED a', 'MODIFIED a', 'DELETED b', 'ADDED c']);
  const versions = all.events.map((e) => Number(e.object.metadata.resourceVersion));
  assert.deepEqual(versions, [...versions].sort((x, y) => x - y));
  assert.equal(versions[4], Number(endRv));
  assert.equal(versions[5], Number(live.metadata.resourceVersion));
  assert.deepEqual(all.events[3]?.object.status, { phase: 'Running' });
  assert.deepEqual(summary(inDefault.events), ['ADDED a', 'MODIFIED a', 'MODIFIED a', 'ADDED c']);
  assert.deepEqual(all.errors, []);

  const fromMiddle = recordWatch(t, store, { resourceVersion: String(versions[2]) });
  await until(() => fromMiddle.events.length === 3, 'replay from the middle');
  assert.deepEqual(summary(fromMiddle.events), ['MODIFIED a', 'DELETED b', 'ADDED c']);

  // No version: live changes only. "0" (an empty store's list version) with the whole history
  // retained: the full history, so nothing between that list and this watch is lost.
  const now = recordWatch(t, store, {});
  const zero = recordWatch(t, store, { resourceVersion: '0' });
  await store.create(SandboxType, box('d'));
  await until(() => zero.events.length === 7, 'the whole history then live');
  assert.deepEqual(summary(now.events), ['ADDED d']);
  assert.deepEqual(summary(zero.events), summary(all.events));
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

test('selector watches see objects enter and leave the selection as ADDED and DELETED', async (t) => {
  const store = await openStore(t);
  const { events } = recordWatch(t, store, { labelSelector: 'pool=warm' });
  const v1 = await store.create(SandboxType, box('sb-1', 'default', { pool: 'warm' }));
  await store.create(SandboxType, box('cold', 'default', { pool: 'cold' }));
  const v2 = await store.update(SandboxType, { ...v1, metadata: { ...v1.metadata, labels: { pool: 'claimed' } } });
  await store.update(SandboxType, { ...v2, metadata: { ...v2.metadata, labels: { pool: 'warm' } } });
  await until(() => events.length === 3, 'three events');
  assert.deepEqual(summary(events), ['ADDED sb-1', 'DELETED sb-1', 'ADDED sb-1']);
});

test('50 concurrent compare-and-swap updates from one version: exactly one wins', async (t) => {
  const store = await openStore(t);
  const base = await store.create(SandboxType, box('contended'));
  const results = await Promise.allSettled(
    Array.from({ length: 50 }, (_, i) => store.update(SandboxType, { ...base, spec: { image: 'x', n: i } })),
  );
  const won = results.filter((r) => r.status === 'fulfilled');
  const lost = results.filter((r) => r.status === 'rejected');
  assert.equal(won.length, 1);
  assert.equal(lost.length, 49);
  for (const r of lost) assert.ok(isAsbError(r.reason, 'Conflict'));
  const stored = await store.get<Box>(SandboxType, 'default', 'contended');
  assert.equal(stored.spec?.n, won[0]?.value.spec.n);
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
  const updated = store.update(SandboxType, { ...box('poison'), spec: { image: 'alpine' } });
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
