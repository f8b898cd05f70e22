// Operator behaviour against the real SQLite store and the fake runtime: warm pools, lifecycle
// (pause/resume, shutdownTime, idle timeout), finalizers and restart convergence.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { KubeObject, ResourceType } from '../src/api/meta.ts';
import { LABEL, SandboxTemplateType, SandboxType, SandboxWarmPoolType, type Sandbox, type SandboxTemplate, type SandboxWarmPool } from '../src/api/types.ts';
import { Registry } from 'prom-client';
import { AsbError } from '../src/errors.ts';
import { createMetrics } from '../src/metrics/metrics.ts';
import { Controller, type Reconciler } from '../src/operator/controller.ts';
import { Informer } from '../src/operator/informer.ts';
import type { ObjectStore, WatchHandlers, WatchOptions } from '../src/store/store.ts';
import { systemClock } from '../src/system/clock.ts';
import { silentLogger } from '../src/system/log.ts';
import { NS, eventually, startHarness, template, warmPool } from './support/operator-harness.ts';

async function members(store: ObjectStore, pool: string): Promise<Sandbox[]> {
  return (await store.list<Sandbox>(SandboxType, { namespace: NS, labelSelector: `${LABEL.pool}=${pool}` })).items;
}

async function poolStatus(store: ObjectStore, pool: string): Promise<SandboxWarmPool['status']> {
  return (await store.get<SandboxWarmPool>(SandboxWarmPoolType, NS, pool)).status;
}

async function sandbox(store: ObjectStore, name: string): Promise<Sandbox | undefined> {
  return store.tryGet<Sandbox>(SandboxType, NS, name);
}

async function setMode(store: ObjectStore, name: string, mode: 'Running' | 'Suspended'): Promise<void> {
  const sb = await store.get<Sandbox>(SandboxType, NS, name);
  await store.update(SandboxType, { ...sb, spec: { ...sb.spec, operatingMode: mode } });
}

test('a warm pool fills to replicas with ready members and reports ready/desired', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('py'));
  await h.store.create(SandboxWarmPoolType, warmPool('py-pool', 'py', 5));

  const status = await eventually('pool status 5/5', async () => {
    const s = await poolStatus(h.store, 'py-pool');
    return s?.readyReplicas === 5 ? s : undefined;
  });
  assert.equal(status.replicas, 5);
  assert.equal(status.selector, `${LABEL.pool}=py-pool`);
  assert.equal(status.conditions?.find((c) => c.type === 'Ready')?.status, 'True');

  const list = await members(h.store, 'py-pool');
  assert.equal(list.length, 5);
  for (const m of list) {
    assert.match(m.metadata.name, /^tst1[a-z0-9]{16}$/, 'member ids carry the cluster tag');
    assert.equal(m.metadata.ownerReferences?.[0]?.kind, 'SandboxWarmPool');
    assert.deepEqual(m.metadata.finalizers, ['asb.dev/runtime']);
    assert.equal(m.status?.phase, 'Running');
    assert.equal(h.runtime.state(m.metadata.name).phase, 'Running');
    assert.equal(h.runtime.request(m.metadata.name)?.volumeClaimTemplates?.[0]?.metadata.name, 'work');
  }
  const metrics = await h.registry.getSingleMetricAsString('asb_warm_pool_ready_replicas');
  assert.match(metrics, /pool="py-pool"} 5/);
});

test('claiming a member takes it out of the pool and the pool refills', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('py'));
  await h.store.create(SandboxWarmPoolType, warmPool('py-pool', 'py', 3));
  await eventually('pool ready', async () => (await poolStatus(h.store, 'py-pool'))?.readyReplicas === 3);
  const before = new Set((await members(h.store, 'py-pool')).map((m) => m.metadata.name));

  const { sandbox: claimed, launch } = await h.op.claimer.claim({ namespace: NS, template: 'py', owner: 'team-a' });
  assert.equal(launch, 'warm');
  assert.ok(before.has(claimed.metadata.name), 'the claim bound an existing warm member');
  assert.equal(claimed.metadata.labels?.[LABEL.owner], 'team-a');
  assert.equal(claimed.metadata.labels[LABEL.launchType], 'warm');
  assert.equal(claimed.metadata.labels[LABEL.pool], undefined);
  assert.equal(claimed.metadata.ownerReferences?.some((o) => o.kind === 'SandboxWarmPool'), false);
  assert.equal(h.runtime.calls.filter((c) => c === `start ${claimed.metadata.name}`).length, 1, 'the warm pod was not restarted');

  const after = await eventually('pool refilled', async () => {
    const list = await members(h.store, 'py-pool');
    const s = await poolStatus(h.store, 'py-pool');
    return list.length === 3 && s?.readyReplicas === 3 ? list : undefined;
  });
  assert.equal(after.some((m) => m.metadata.name === claimed.metadata.name), false);
});

test('a member that never becomes ready is replaced', async (t) => {
  const h = await startHarness(t, { autoReady: false, notReadyReplaceMs: 60_000 });
  await h.store.create(SandboxTemplateType, template('py'));
  await h.store.create(SandboxWarmPoolType, warmPool('slow', 'py', 2));
  const first = await eventually('2 pending members', async () => {
    const list = await members(h.store, 'slow');
    return list.length === 2 && list.every((m) => h.runtime.state(m.metadata.name).phase === 'Pending') ? list : undefined;
  });
  await eventually('status 0/2 ready', async () => {
    const s = await poolStatus(h.store, 'slow');
    return s?.replicas === 2 && s.readyReplicas === 0;
  });

  h.runtime.autoReady = true;
  h.clock.advance(61_000);
  const second = await eventually('members replaced and ready', async () => {
    const list = await members(h.store, 'slow');
    const s = await poolStatus(h.store, 'slow');
    return list.length === 2 && s?.readyReplicas === 2 ? list : undefined;
  });
  const oldNames = first.map((m) => m.metadata.name);
  assert.equal(second.some((m) => oldNames.includes(m.metadata.name)), false, 'new members, not the stuck ones');
  for (const name of oldNames) {
    await eventually(`stuck member ${name} gone`, async () => (await sandbox(h.store, name)) === undefined);
    assert.equal(h.runtime.state(name).phase, 'Absent', 'the stuck pod was removed');
  }
});

test('scaling a pool down deletes surplus members and their pods', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('py'));
  await h.store.create(SandboxWarmPoolType, warmPool('py-pool', 'py', 4));
  await eventually('pool ready', async () => (await poolStatus(h.store, 'py-pool'))?.readyReplicas === 4);
  const pool = await h.store.get<SandboxWarmPool>(SandboxWarmPoolType, NS, 'py-pool');
  await h.store.update(SandboxWarmPoolType, { ...pool, spec: { ...pool.spec, replicas: 1 } });
  await eventually('scaled to 1', async () => {
    const s = await poolStatus(h.store, 'py-pool');
    return (await members(h.store, 'py-pool')).length === 1 && s?.replicas === 1 && s.readyReplicas === 1;
  });
  await eventually('surplus pods removed', () => h.runtime.list().length === 1);
});

test('a pool whose template is missing says so in status', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxWarmPoolType, warmPool('orphan', 'nope', 2));
  const s = await eventually('TemplateNotFound', async () => {
    const status = await poolStatus(h.store, 'orphan');
    return status?.conditions?.find((c) => c.reason === 'TemplateNotFound') !== undefined ? status : undefined;
  });
  assert.equal(s.replicas, 0);
  await h.store.create(SandboxTemplateType, template('nope'));
  await eventually('pool fills once the template exists', async () => (await poolStatus(h.store, 'orphan'))?.readyReplicas === 2);
});

test('pause stops the pod keeping its volumes; resume starts it again and status follows', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('py'));
  const { sandbox: sb } = await h.op.claimer.claim({ namespace: NS, template: 'py', owner: 'team-a' });
  const name = sb.metadata.name;
  const running = await h.op.claimer.waitReady(NS, name, 5_000);
  const ip = running.status?.podIPs?.[0];
  assert.ok(ip !== undefined);

  await setMode(h.store, name, 'Suspended');
  const paused = await eventually('hibernated', async () => {
    const s = await sandbox(h.store, name);
    return s?.status?.phase === 'Hibernated' ? s : undefined;
  });
  assert.equal(h.runtime.state(name).phase, 'Stopped');
  assert.ok(h.runtime.hasVolumes(name), 'hibernation keeps the volumes');
  assert.equal(paused.status?.conditions?.find((c) => c.type === 'Ready')?.reason, 'SandboxSuspended');
  assert.equal(paused.status.podIPs, undefined);

  await setMode(h.store, name, 'Running');
  const woke = await h.op.claimer.waitReady(NS, name, 5_000);
  assert.equal(woke.status?.phase, 'Running');
  assert.equal(woke.status.podIPs?.[0], ip, 'same identity after wake');
  assert.equal(h.runtime.calls.filter((c) => c === `remove ${name}`).length, 0, 'volumes were never removed');
  assert.match(await h.registry.getSingleMetricAsString('asb_wake_seconds'), /asb_wake_seconds_count 1/);
});

test('shutdownTime with Delete deletes the sandbox; with Retain keeps it Expired with the pod stopped', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('py'));
  const at = new Date(h.clock.now() + 3_600_000).toISOString();
  const del = (await h.op.claimer.claim({ namespace: NS, template: 'py', owner: 'a', shutdownTime: at })).sandbox.metadata.name;
  const keep = (await h.op.claimer.claim({ namespace: NS, template: 'py', owner: 'a', shutdownTime: at, shutdownPolicy: 'Retain' })).sandbox.metadata.name;
  await h.op.claimer.waitReady(NS, del, 5_000);
  await h.op.claimer.waitReady(NS, keep, 5_000);

  h.clock.advance(3_600_001);
  await eventually('Delete policy removed the object', async () => (await sandbox(h.store, del)) === undefined);
  assert.equal(h.runtime.state(del).phase, 'Absent');
  const kept = await eventually('Retain policy kept it Expired', async () => {
    const s = await sandbox(h.store, keep);
    return s?.status?.phase === 'Expired' ? s : undefined;
  });
  assert.equal(kept.status?.conditions?.find((c) => c.type === 'Ready')?.reason, 'SandboxExpired');
  assert.equal(h.runtime.state(keep).phase, 'Stopped');
  assert.ok(h.runtime.hasVolumes(keep));
});

test('idle timeout hibernates a claimed sandbox; activity and warm membership keep sandboxes running', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('py', { idleTimeoutMs: 30_000 }));
  await h.store.create(SandboxWarmPoolType, warmPool('py-pool', 'py', 2));
  await eventually('pool ready', async () => (await poolStatus(h.store, 'py-pool'))?.readyReplicas === 2);
  // Members sit warm for an hour: the claim, not the pod start, starts the idle clock.
  h.clock.advance(3_600_000);
  const idle = (await h.op.claimer.claim({ namespace: NS, template: 'py', owner: 'a' })).sandbox.metadata.name;
  const busy = (await h.op.claimer.claim({ namespace: NS, template: 'py', owner: 'a' })).sandbox.metadata.name;
  await eventually('pool refilled and settled', async () => (await poolStatus(h.store, 'py-pool'))?.readyReplicas === 2 && h.op.depth() === 0);
  assert.equal((await sandbox(h.store, idle))?.status?.phase, 'Running', 'a long-warm member does not idle out on claim');

  h.clock.advance(20_000);
  h.op.activity.touch(busy);
  h.clock.advance(15_000);
  const slept = await eventually('idle sandbox hibernated', async () => {
    const s = await sandbox(h.store, idle);
    return s?.status?.phase === 'Hibernated' ? s : undefined;
  });
  assert.equal(slept.spec.operatingMode, 'Suspended');
  assert.equal(h.runtime.state(idle).phase, 'Stopped');
  assert.equal((await sandbox(h.store, busy))?.status?.phase, 'Running', 'recent activity keeps it awake');
  for (const m of await members(h.store, 'py-pool')) assert.equal(h.runtime.state(m.metadata.name).phase, 'Running', 'warm members never idle out');
});

test('deleting a sandbox removes its pod, then the object (finalizer)', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('py'));
  const name = (await h.op.claimer.claim({ namespace: NS, template: 'py', owner: 'a' })).sandbox.metadata.name;
  await h.op.claimer.waitReady(NS, name, 5_000);
  const deleting = await h.store.delete<Sandbox>(SandboxType, NS, name);
  assert.ok(deleting.metadata.deletionTimestamp !== undefined, 'the finalizer holds the object');
  await eventually('object gone', async () => (await sandbox(h.store, name)) === undefined);
  assert.equal(h.runtime.state(name).phase, 'Absent');
  assert.equal(h.runtime.hasVolumes(name), false);
  const order = h.runtime.calls.filter((c) => c.endsWith(name));
  assert.equal(order.at(-1), `remove ${name}`);
});

test('after a restart the operator removes orphan pods and restarts pods that should run', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('py'));
  const name = (await h.op.claimer.claim({ namespace: NS, template: 'py', owner: 'a' })).sandbox.metadata.name;
  await h.op.claimer.waitReady(NS, name, 5_000);
  await h.op.close();

  // While the worker was down: the pod died, and a pod appeared for a sandbox that is gone.
  await h.runtime.stop(name);
  h.runtime.adopt({ id: 'ghost', namespace: NS, hostname: 'ghost', spec: { containers: [] } }, 'Running');

  const op2 = await h.restart();
  await eventually('pod restarted', () => h.runtime.state(name).phase === 'Running');
  await eventually('orphan removed', () => h.runtime.state('ghost').phase === 'Absent');
  const s = await op2.claimer.waitReady(NS, name, 5_000);
  assert.equal(s.status?.phase, 'Running');
});

test('deleting a warm pool deletes its members and their pods', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('py'));
  await h.store.create(SandboxWarmPoolType, warmPool('py-pool', 'py', 3));
  await eventually('pool ready', async () => (await poolStatus(h.store, 'py-pool'))?.readyReplicas === 3);
  await h.store.delete(SandboxWarmPoolType, NS, 'py-pool');
  await eventually('members gone', async () => (await members(h.store, 'py-pool')).length === 0);
  await eventually('pods removed', () => h.runtime.list().length === 0);
});

// ---- the work queue under the controllers

function queueFixture(reconcile: Reconciler): Controller {
  return new Controller({ name: 'test', reconcile, clock: systemClock, log: silentLogger(), metrics: createMetrics(new Registry()), workers: 4 });
}

test('the work queue dedups keys and never runs one key twice at once', async (t) => {
  let running = 0;
  let maxRunning = 0;
  const runs: string[] = [];
  let release: () => void = () => undefined;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const c = queueFixture(async (key) => {
    running++;
    maxRunning = Math.max(maxRunning, running);
    runs.push(key);
    if (runs.length === 1) await gate;
    running--;
    return undefined;
  });
  t.after(() => c.close());
  c.enqueue('a');
  for (let i = 0; i < 10; i++) c.enqueue('a');
  release();
  await eventually('queue drained', () => c.depth === 0 && runs.length >= 2);
  assert.equal(maxRunning, 1, 'key a never ran concurrently');
  assert.deepEqual(runs, ['a', 'a'], '11 enqueues while running collapse into one rerun');
});

test('the work queue retries errors with backoff and does not retry Invalid', async (t) => {
  const attempts = new Map<string, number>();
  const c = queueFixture((key) => {
    const n = (attempts.get(key) ?? 0) + 1;
    attempts.set(key, n);
    if (key === 'bad') return Promise.reject(new AsbError('Invalid', 'cannot be fixed by retrying'));
    if (n < 4) return Promise.reject(new Error('transient'));
    return Promise.resolve(undefined);
  });
  t.after(() => c.close());
  c.enqueue('flaky');
  c.enqueue('bad');
  await eventually('flaky succeeded', () => attempts.get('flaky') === 4 && c.depth === 0);
  assert.equal(attempts.get('bad'), 1, 'a terminal error is not retried');
});

test('a warm pool with updateStrategy Recreate replaces members when its template changes', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('py'));
  const pool = warmPool('py-pool', 'py', 2);
  await h.store.create(SandboxWarmPoolType, { ...pool, spec: { ...pool.spec, updateStrategy: { type: 'Recreate' } } });
  await eventually('pool ready', async () => (await poolStatus(h.store, 'py-pool'))?.readyReplicas === 2);
  const old = (await members(h.store, 'py-pool')).map((m) => m.metadata.name);

  const tpl = await h.store.get<SandboxTemplate>(SandboxTemplateType, NS, 'py');
  const image = 'python:3.13';
  const containers = tpl.spec.podTemplate.spec.containers.map((c) => ({ ...c, image }));
  await h.store.update(SandboxTemplateType, { ...tpl, spec: { ...tpl.spec, podTemplate: { spec: { ...tpl.spec.podTemplate.spec, containers } } } });
  const fresh = await eventually('members rebuilt from the new template', async () => {
    const list = await members(h.store, 'py-pool');
    const ready = (await poolStatus(h.store, 'py-pool'))?.readyReplicas === 2;
    return ready && list.length === 2 && list.every((m) => !old.includes(m.metadata.name)) ? list : undefined;
  });
  for (const m of fresh) assert.equal(m.spec.podTemplate.spec.containers[0]?.image, image);
});

test('the informer relists after its watch ends (Gone) and reports what changed in the gap', async (t) => {
  const h = await startHarness(t);
  let breakWatch: (() => void) | undefined;
  const flaky = new Proxy(h.store, {
    get(target, prop, receiver) {
      if (prop === 'watch') {
        return (rt: ResourceType, opts: WatchOptions, handlers: WatchHandlers<KubeObject>) => {
          const inner = target.watch(rt, opts, handlers);
          breakWatch = () => {
            inner.close();
            handlers.onError(new AsbError('Gone', 'resource version too old'));
          };
          return inner;
        };
      }
      const value: unknown = Reflect.get(target, prop, receiver);
      return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
  const informer = new Informer<SandboxTemplate>({ store: flaky, type: SandboxTemplateType, clock: systemClock, log: silentLogger() });
  const seen: string[] = [];
  informer.onChange((key) => seen.push(key));
  informer.start();
  t.after(() => informer.close());
  await h.store.create(SandboxTemplateType, template('a'));
  await informer.synced();
  await eventually('a cached', () => informer.getByName(NS, 'a') !== undefined);

  breakWatch?.();
  assert.equal(informer.healthy, false);
  await h.store.create(SandboxTemplateType, template('b'));
  await h.store.delete(SandboxTemplateType, NS, 'a');
  await eventually('relisted', () => informer.healthy && informer.getByName(NS, 'b') !== undefined);
  assert.equal(informer.getByName(NS, 'a'), undefined, 'the delete in the gap is seen');
  assert.ok(seen.includes(`${NS}/b`) && seen.filter((k) => k === `${NS}/a`).length >= 2, 'handlers heard both keys');
});
