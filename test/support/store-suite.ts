// The ObjectStore contract (src/store/store.ts) as tests, run against every store: the embedded
// SQLite store (test/store.test.ts) and the kube store on a real kube-apiserver
// (test/k8s/store.test.ts). A test here asserts only what both must do; behaviour one store has
// and the other cannot (SQLite's restart, retention and group commit; the apiserver's Gone from
// its watch cache) is tested beside that store.
//
// Objects are valid Sandboxes and ApiKeys under our CRDs, since the apiserver validates them.
import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import type { KubeObject } from '../../src/api/meta.ts';
import { ApiKeyType, SandboxType } from '../../src/api/types.ts';
import { AsbError, isAsbError } from '../../src/errors.ts';
import type { ObjectStore, WatchEvent, WatchOptions } from '../../src/store/store.ts';

export interface BoxSpec {
  podTemplate: { spec: { containers: { name: string; image: string }[] } };
  idleTimeoutMs?: number;
}

export interface Box extends KubeObject {
  spec?: BoxSpec;
  status?: { phase?: string };
}

export interface StoreUnderTest {
  store: ObjectStore;
  /** The namespace a test's logical namespace ('default', 'a', ...) maps to in this store. */
  ns: (logical: string) => string;
}

/**
 * Opens a store for one test, its namespaces ready, closed and cleaned up in t.after. A store on
 * a shared apiserver gives each test namespaces of its own.
 */
export type StoreFactory = (t: TestContext, namespaces: readonly string[]) => Promise<StoreUnderTest>;

export function box(name: string, namespace: string, labels?: Record<string, string>, image = 'busybox'): Box {
  return {
    apiVersion: '',
    kind: '',
    metadata: { name, namespace, ...(labels === undefined ? {} : { labels }) },
    spec: { podTemplate: { spec: { containers: [{ name: 'main', image }] } } },
  };
}

export function withImage(b: Box, image: string, idleTimeoutMs?: number): Box & { spec: BoxSpec } {
  return { ...b, spec: { podTemplate: { spec: { containers: [{ name: 'main', image }] } }, ...(idleTimeoutMs === undefined ? {} : { idleTimeoutMs }) } };
}

export function imageOf(b: Box | undefined): string | undefined {
  return b?.spec?.podTemplate.spec.containers[0]?.image;
}

/** Resolves with the error the promise rejected with; fails the test if it resolved. */
export async function rejection(p: Promise<unknown>): Promise<AsbError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof AsbError, `expected an AsbError, got ${String(err)}`);
    return err;
  }
  assert.fail('expected the call to fail');
}

/** Polls `cond` across event-loop turns, failing after a bounded deadline. */
export async function until(cond: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!cond()) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
}

export function recordWatch(t: TestContext, store: ObjectStore, opts: WatchOptions): { events: WatchEvent<Box>[]; errors: Error[] } {
  const events: WatchEvent<Box>[] = [];
  const errors: Error[] = [];
  const w = store.watch<Box>(SandboxType, opts, { onEvent: (e) => events.push(e), onError: (e) => errors.push(e) });
  t.after(() => w.close());
  return { events, errors };
}

export const summary = (events: WatchEvent<Box>[]): string[] => events.map((e) => `${e.type} ${e.object.metadata.name}`);

const rvOf = (o: KubeObject): number => Number(o.metadata.resourceVersion);

/** Registers the contract's tests against the stores `open` makes. */
export function storeSuite(open: StoreFactory): void {
  test('create sets identity and versions; get returns a private copy', async (t) => {
    const { store, ns } = await open(t, ['default', 'other']);
    const d = ns('default');
    const created = await store.create(SandboxType, { ...box('sb-1', d), status: { phase: 'Running' } });
    assert.equal(created.metadata.generation, 1);
    assert.match(created.metadata.uid ?? '', /^[0-9a-f-]{36}$/);
    assert.ok(rvOf(created) > 0);
    assert.ok(!Number.isNaN(Date.parse(created.metadata.creationTimestamp ?? '')));
    assert.equal(created.apiVersion, 'agents.x-k8s.io/v1alpha1');
    assert.equal(created.kind, 'Sandbox');
    assert.equal(created.status, undefined, 'status is only set through updateStatus');

    const got = await store.get<Box>(SandboxType, d, 'sb-1');
    assert.deepEqual(got, created);
    got.spec = withImage(got, 'mutated').spec;
    assert.equal(imageOf(await store.get<Box>(SandboxType, d, 'sb-1')), 'busybox');

    assert.equal((await rejection(store.create(SandboxType, box('sb-1', d)))).code, 'AlreadyExists');
    const missing = await rejection(store.get(SandboxType, d, 'nope'));
    assert.equal(missing.code, 'NotFound');
    assert.ok(missing.message.includes(`${d}/nope`), missing.message);
    assert.equal(await store.tryGet(SandboxType, d, 'nope'), undefined);
    assert.equal(await store.exists(SandboxType, d, 'sb-1'), true);
    assert.equal(await store.exists(SandboxType, d, 'nope'), false);
    assert.equal(await store.exists(SandboxType, ns('other'), 'sb-1'), false);
    const noName = await rejection(store.create(SandboxType, box('', d)));
    assert.equal(noName.code, 'Invalid');
    assert.equal(noName.fields[0]?.field, 'metadata.name');
  });

  test('cluster-scoped kinds ignore the namespace', async (t) => {
    const { store } = await open(t, []);
    const spec = { team: 'team-a', hash: 'a'.repeat(64), prefix: 'asb_key1' };
    await store.create(ApiKeyType, { apiVersion: '', kind: '', metadata: { name: 'key-1', namespace: 'ignored' }, spec });
    const got = await store.get(ApiKeyType, '', 'key-1');
    assert.equal(got.metadata.namespace, undefined);
    assert.equal((await store.list(ApiKeyType, { namespace: 'other' })).items.length, 1);
  });

  test('generateName appends five random characters and never collides', async (t) => {
    const { store, ns } = await open(t, ['default']);
    const made = await Promise.all(
      Array.from({ length: 40 }, () => store.create(SandboxType, { ...box('', ns('default')), metadata: { name: '', generateName: 'pool-', namespace: ns('default') } })),
    );
    const names = made.map((o) => o.metadata.name);
    for (const name of names) assert.match(name, /^pool-[a-z0-9]{5}$/);
    assert.equal(new Set(names).size, 40);
  });

  test('list filters by namespace and pages with a continue token in namespace/name order', async (t) => {
    const { store, ns } = await open(t, ['a', 'b']);
    const expected: string[] = [];
    for (const logical of ['b', 'a']) {
      for (let i = 0; i < 12; i++) await store.create(SandboxType, box(`sb-${String(i).padStart(2, '0')}`, ns(logical)));
    }
    for (const logical of ['a', 'b']) for (let i = 0; i < 12; i++) expected.push(`${ns(logical)}/sb-${String(i).padStart(2, '0')}`);

    const seen: string[] = [];
    let token: string | undefined;
    let pages = 0;
    do {
      const page = await store.list<Box>(SandboxType, token === undefined ? { limit: 10 } : { limit: 10, continue: token });
      assert.ok(page.items.length <= 10);
      seen.push(...page.items.map((o) => `${o.metadata.namespace ?? ''}/${o.metadata.name}`));
      token = page.continue;
      pages++;
    } while (token !== undefined && pages < 10);
    assert.deepEqual(seen, expected);
    assert.equal(pages, 3);

    const onlyB = await store.list<Box>(SandboxType, { namespace: ns('b') });
    assert.equal(onlyB.items.length, 12);
    assert.ok(onlyB.items.every((o) => o.metadata.namespace === ns('b')));
    assert.equal(onlyB.continue, undefined);
    const exact = await store.list<Box>(SandboxType, { namespace: ns('a'), limit: 12 });
    assert.equal(exact.continue, undefined, 'no token when the page holds the last item');
    assert.equal((await rejection(store.list(SandboxType, { continue: 'garbage' }))).code, 'BadRequest');
  });

  test('label selectors: equality, inequality, existence and sets', async (t) => {
    const { store, ns } = await open(t, ['default']);
    const d = ns('default');
    await store.create(SandboxType, box('web', d, { app: 'web', tier: 'front' }));
    await store.create(SandboxType, box('api', d, { app: 'api', tier: 'back' }));
    await store.create(SandboxType, box('db', d, { app: 'db' }));
    await store.create(SandboxType, box('bare', d));
    const names = async (labelSelector: string): Promise<string[]> =>
      (await store.list(SandboxType, { namespace: d, labelSelector })).items.map((o) => o.metadata.name).sort();

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

  test('an update from a stale resourceVersion fails with Conflict naming the object and the stale version', async (t) => {
    const { store, ns } = await open(t, ['default']);
    const d = ns('default');
    const v1 = await store.create(SandboxType, box('sb-1', d));
    await store.update(SandboxType, withImage(v1, 'alpine'));
    const err = await rejection(store.update(SandboxType, withImage(v1, 'ubuntu')));
    assert.equal(err.code, 'Conflict');
    assert.equal(err.status, 409);
    assert.ok(err.message.includes(`Sandbox "${d}/sb-1"`), err.message);
    assert.ok(err.message.includes(v1.metadata.resourceVersion ?? '?'), err.message);
    assert.equal(imageOf(await store.get<Box>(SandboxType, d, 'sb-1')), 'alpine');

    // Without a resourceVersion the update is unconditional.
    const { resourceVersion: _drop, ...meta } = v1.metadata;
    const forced = await store.update(SandboxType, { ...withImage(v1, 'ubuntu'), metadata: meta });
    assert.equal(imageOf(forced), 'ubuntu');
    assert.equal((await rejection(store.update(SandboxType, box('ghost', d)))).code, 'NotFound');
  });

  test('update ignores status, updateStatus changes only status; generation follows the spec', async (t) => {
    const { store, ns } = await open(t, ['default']);
    const v1 = await store.create(SandboxType, box('sb-1', ns('default')));
    const v2 = await store.update(SandboxType, { ...withImage(v1, 'alpine'), status: { phase: 'Failed' } });
    assert.equal(v2.status, undefined);
    assert.equal(v2.metadata.generation, 2);
    assert.equal(v2.metadata.uid, v1.metadata.uid);

    const v3 = await store.updateStatus(SandboxType, { ...withImage(v2, 'ignored'), status: { phase: 'Running' } });
    assert.deepEqual(v3.status, { phase: 'Running' });
    assert.equal(imageOf(v3), 'alpine');
    assert.equal(v3.metadata.generation, 2, 'a status write does not bump generation');
    assert.ok(rvOf(v3) > rvOf(v2));

    const v4 = await store.update(SandboxType, { ...v3, status: { phase: 'Expired' } });
    assert.equal(v4.metadata.resourceVersion, v3.metadata.resourceVersion, 'an update that changes nothing writes nothing');
    assert.deepEqual(v4.status, { phase: 'Running' });
    assert.equal((await rejection(store.updateStatus(SandboxType, { ...v1, status: { phase: 'Pending' } }))).code, 'Conflict');
  });

  test('a write is taken as it was when called: changing the object afterwards changes nothing', async (t) => {
    const { store, ns } = await open(t, ['default']);
    const d = ns('default');
    const watched = recordWatch(t, store, { namespace: d });
    const pending = box('sb-1', d, { team: 'a' });
    const created = store.create(SandboxType, pending);
    (pending.metadata.labels ?? {}).team = 'changed';
    const container = pending.spec?.podTemplate.spec.containers[0];
    if (container !== undefined) container.image = 'changed';
    assert.deepEqual((await created).metadata.labels, { team: 'a' });
    assert.equal(imageOf(await created), 'busybox');

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
    assert.deepEqual((await store.get<Box>(SandboxType, d, 'sb-1')).metadata.labels, { team: 'b' });
    assert.deepEqual(seen.metadata.labels, { team: 'a' }, 'the watched object is unchanged');
    v2.spec = withImage(v2, 'mine').spec;
    assert.equal(imageOf(await store.get<Box>(SandboxType, d, 'sb-1')), 'busybox', 'the writer gets its own copy');
  });

  test('finalizers hold deletion until the last one is removed', async (t) => {
    const { store, ns } = await open(t, ['default']);
    const d = ns('default');
    const { events } = recordWatch(t, store, { namespace: d });
    const v1 = await store.create(SandboxType, { ...box('sb-1', d), metadata: { ...box('sb-1', d).metadata, finalizers: ['asb.dev/volumes'] } });

    assert.equal((await rejection(store.delete(SandboxType, d, 'sb-1', { resourceVersion: '999' }))).code, 'Conflict');
    assert.equal((await rejection(store.delete(SandboxType, d, 'sb-1', { uid: 'other' }))).code, 'Conflict');
    const deleting = await store.delete<Box>(SandboxType, d, 'sb-1', { uid: v1.metadata.uid ?? '' });
    assert.ok(deleting.metadata.deletionTimestamp !== undefined);
    assert.equal(deleting.metadata.generation, 2);
    assert.ok((await store.get(SandboxType, d, 'sb-1')).metadata.deletionTimestamp !== undefined);

    const adding = await rejection(
      store.update(SandboxType, { ...deleting, metadata: { ...deleting.metadata, finalizers: ['asb.dev/volumes', 'asb.dev/new'] } }),
    );
    assert.equal(adding.code, 'Invalid');

    // The write that drops the last finalizer removes the object. (Its answer is the object
    // without finalizers; the apiserver gives it the version it had before, not the deletion's.)
    const gone = await store.update<Box>(SandboxType, { ...deleting, metadata: { ...deleting.metadata, finalizers: [] } });
    assert.deepEqual(gone.metadata.finalizers ?? [], []);
    assert.equal(await store.tryGet(SandboxType, d, 'sb-1'), undefined);
    await until(() => events.length === 3, 'three events');
    assert.deepEqual(summary(events), ['ADDED sb-1', 'MODIFIED sb-1', 'DELETED sb-1']);

    await store.create(SandboxType, box('plain', d));
    await store.delete(SandboxType, d, 'plain');
    assert.equal((await rejection(store.get(SandboxType, d, 'plain'))).code, 'NotFound');
  });

  test('a watch from an earlier version gets every change after it, in order, with no gap', async (t) => {
    const { store, ns } = await open(t, ['default', 'other']);
    const d = ns('default');
    const start = (await store.list(SandboxType)).resourceVersion;
    const a = await store.create(SandboxType, box('a', d));
    await store.create(SandboxType, box('b', ns('other')));
    const a2 = await store.update(SandboxType, withImage(a, 'alpine'));
    await store.updateStatus(SandboxType, { ...a2, status: { phase: 'Running' } });
    await store.delete(SandboxType, ns('other'), 'b');

    const all = recordWatch(t, store, { resourceVersion: start });
    const inDefault = recordWatch(t, store, { resourceVersion: start, namespace: d });
    await until(() => all.events.length === 5 && inDefault.events.length === 3, 'the replay');
    const live = await store.create(SandboxType, box('c', d));
    await until(() => all.events.length === 6, 'replay plus the live event');
    assert.deepEqual(summary(all.events), ['ADDED a', 'ADDED b', 'MODIFIED a', 'MODIFIED a', 'DELETED b', 'ADDED c']);
    const versions = all.events.map((e) => rvOf(e.object));
    assert.deepEqual(versions, [...versions].sort((x, y) => x - y));
    assert.equal(versions[5], rvOf(live));
    assert.deepEqual(all.events[3]?.object.status, { phase: 'Running' });
    await until(() => inDefault.events.length === 4, 'the live event in the namespace');
    assert.deepEqual(summary(inDefault.events), ['ADDED a', 'MODIFIED a', 'MODIFIED a', 'ADDED c']);
    assert.deepEqual(all.errors, []);

    const fromMiddle = recordWatch(t, store, { resourceVersion: String(versions[2]) });
    await until(() => fromMiddle.events.length === 3, 'replay from the middle');
    assert.deepEqual(summary(fromMiddle.events), ['MODIFIED a', 'DELETED b', 'ADDED c']);

    // No version: changes from now on only.
    const now = recordWatch(t, store, { namespace: d });
    await store.create(SandboxType, box('d', d));
    await until(() => now.events.length === 1, 'the live event');
    assert.deepEqual(summary(now.events), ['ADDED d']);
  });

  test('selector watches see objects enter and leave the selection as ADDED and DELETED', async (t) => {
    const { store, ns } = await open(t, ['default']);
    const d = ns('default');
    const { events } = recordWatch(t, store, { namespace: d, labelSelector: 'pool=warm' });
    const v1 = await store.create(SandboxType, box('sb-1', d, { pool: 'warm' }));
    await store.create(SandboxType, box('cold', d, { pool: 'cold' }));
    const v2 = await store.update(SandboxType, { ...v1, metadata: { ...v1.metadata, labels: { pool: 'claimed' } } });
    await store.update(SandboxType, { ...v2, metadata: { ...v2.metadata, labels: { pool: 'warm' } } });
    await until(() => events.length === 3, 'three events');
    assert.deepEqual(summary(events), ['ADDED sb-1', 'DELETED sb-1', 'ADDED sb-1']);
  });

  test('50 concurrent compare-and-swap updates from one version: exactly one wins', async (t) => {
    const { store, ns } = await open(t, ['default']);
    const d = ns('default');
    const base = await store.create(SandboxType, box('contended', d));
    const results = await Promise.allSettled(Array.from({ length: 50 }, (_, i) => store.update(SandboxType, withImage(base, 'x', i + 1))));
    const won = results.filter((r) => r.status === 'fulfilled');
    const lost = results.filter((r) => r.status === 'rejected');
    assert.equal(won.length, 1);
    assert.equal(lost.length, 49);
    for (const r of lost) assert.ok(isAsbError(r.reason, 'Conflict'), String(r.reason));
    const stored = await store.get<Box>(SandboxType, d, 'contended');
    assert.equal(stored.spec?.idleTimeoutMs, won[0]?.value.spec.idleTimeoutMs);
  });
}
