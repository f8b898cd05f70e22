// The controllers' behaviour (warm pools, lifecycle, finalizers, restart convergence, the claim
// hot path and SandboxClaim objects) as tests, run against every store: the embedded SQLite
// store (test/operator.test.ts, test/claims.test.ts) and the kube store on a real
// kube-apiserver (test/k8s/controllers.test.ts). Pods come from the fake runtime.
import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import type { Condition, KubeObject, ResourceType } from '../../src/api/meta.ts';
import { apiVersionOf } from '../../src/api/meta.ts';
import {
  ANNOTATION,
  LABEL,
  SandboxClaimType,
  SandboxTemplateType,
  SandboxType,
  SandboxWarmPoolType,
  type Sandbox,
  type SandboxClaim,
  type SandboxTemplate,
  type SandboxWarmPool,
} from '../../src/api/types.ts';
import { AsbError, isAsbError } from '../../src/errors.ts';
import type { ClaimResult } from '../../src/operator/claimer.ts';
import { Informer } from '../../src/store/informer.ts';
import type { WatchHandlers, WatchOptions } from '../../src/store/store.ts';
import { systemClock } from '../../src/base/clock.ts';
import { silentLogger } from '../../src/base/log.ts';
import { within } from './wait.ts';
import { eventually, startHarness, template, warmPool, writeRival, type Harness, type HarnessOptions, type HarnessStoreFactory } from './operator-harness.ts';

type Start = (t: TestContext, opts?: HarnessOptions) => Promise<Harness>;

// A watch event normally arrives within milliseconds of the write; the bound is for a 2-core
// machine running other test files beside this one, where an event behind a stalled stream can
// take seconds. Waiting longer costs nothing when it comes at once.
const WATCH_DELIVERY_BOUND_MS = 30_000;

function starter(openStore: HarnessStoreFactory): Start {
  return (t, opts = {}) => startHarness(t, opts, openStore);
}

async function members(h: Harness, pool: string): Promise<Sandbox[]> {
  return (await h.store.list<Sandbox>(SandboxType, { namespace: h.ns, labelSelector: `${LABEL.pool}=${pool}` })).items;
}

async function poolStatus(h: Harness, pool: string): Promise<SandboxWarmPool['status']> {
  return (await h.store.get<SandboxWarmPool>(SandboxWarmPoolType, h.ns, pool)).status;
}

async function sandbox(h: Harness, name: string): Promise<Sandbox | undefined> {
  return h.store.tryGet<Sandbox>(SandboxType, h.ns, name);
}

async function setMode(h: Harness, name: string, mode: 'Running' | 'Suspended'): Promise<void> {
  const sb = await h.store.get<Sandbox>(SandboxType, h.ns, name);
  await h.store.update(SandboxType, { ...sb, spec: { ...sb.spec, operatingMode: mode } });
}

/** Warm pools, lifecycle, finalizers, restarts and the informer, on the stores `openStore` makes. */
export function operatorSuite(openStore: HarnessStoreFactory): void {
  const start = starter(openStore);

  test('a warm pool fills to replicas with ready members and reports ready/desired', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    await h.store.create(SandboxWarmPoolType, warmPool('py-pool', 'py', 5, h.ns));

    const status = await eventually('pool status 5/5', async () => {
      const s = await poolStatus(h, 'py-pool');
      return s?.readyReplicas === 5 ? s : undefined;
    });
    assert.equal(status.replicas, 5);
    assert.equal(status.selector, `${LABEL.pool}=py-pool`);
    assert.equal(status.conditions?.find((c) => c.type === 'Ready')?.status, 'True');

    const list = await members(h, 'py-pool');
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
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    await h.store.create(SandboxWarmPoolType, warmPool('py-pool', 'py', 3, h.ns));
    await eventually('pool ready', async () => (await poolStatus(h, 'py-pool'))?.readyReplicas === 3);
    const before = new Set((await members(h, 'py-pool')).map((m) => m.metadata.name));

    const { sandbox: claimed, launch } = await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'team-a' });
    assert.equal(launch, 'warm');
    assert.ok(before.has(claimed.metadata.name), 'the claim bound an existing warm member');
    assert.equal(claimed.metadata.labels?.[LABEL.owner], 'team-a');
    assert.equal(claimed.metadata.labels[LABEL.launchType], 'warm');
    assert.equal(claimed.metadata.labels[LABEL.pool], undefined);
    assert.equal((claimed.metadata.ownerReferences ?? []).some((o) => o.kind === 'SandboxWarmPool'), false, 'the pool no longer owns it (an empty list may be dropped)');
    assert.equal(h.runtime.calls.filter((c) => c === `start ${claimed.metadata.name}`).length, 1, 'the warm pod was not restarted');

    const after = await eventually('pool refilled', async () => {
      const list = await members(h, 'py-pool');
      const s = await poolStatus(h, 'py-pool');
      return list.length === 3 && s?.readyReplicas === 3 ? list : undefined;
    });
    assert.equal(after.some((m) => m.metadata.name === claimed.metadata.name), false);
  });

  test('a member that never becomes ready is replaced', async (t) => {
    const h = await start(t, { autoReady: false, notReadyReplaceMs: 60_000 });
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    await h.store.create(SandboxWarmPoolType, warmPool('slow', 'py', 2, h.ns));
    const first = await eventually('2 pending members', async () => {
      const list = await members(h, 'slow');
      return list.length === 2 && list.every((m) => h.runtime.state(m.metadata.name).phase === 'Pending') ? list : undefined;
    });
    await eventually('status 0/2 ready', async () => {
      const s = await poolStatus(h, 'slow');
      return s?.replicas === 2 && s.readyReplicas === 0;
    });

    h.runtime.autoReady = true;
    h.clock.advance(61_000);
    const second = await eventually('members replaced and ready', async () => {
      const list = await members(h, 'slow');
      const s = await poolStatus(h, 'slow');
      return list.length === 2 && s?.readyReplicas === 2 ? list : undefined;
    });
    const oldNames = first.map((m) => m.metadata.name);
    assert.equal(second.some((m) => oldNames.includes(m.metadata.name)), false, 'new members, not the stuck ones');
    for (const name of oldNames) {
      await eventually(`stuck member ${name} gone`, async () => (await sandbox(h, name)) === undefined);
      assert.equal(h.runtime.state(name).phase, 'Absent', 'the stuck pod was removed');
    }
  });

  test('scaling a pool down deletes surplus members and their pods', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    await h.store.create(SandboxWarmPoolType, warmPool('py-pool', 'py', 4, h.ns));
    await eventually('pool ready', async () => (await poolStatus(h, 'py-pool'))?.readyReplicas === 4);
    const pool = await h.store.get<SandboxWarmPool>(SandboxWarmPoolType, h.ns, 'py-pool');
    await h.store.update(SandboxWarmPoolType, { ...pool, spec: { ...pool.spec, replicas: 1 } });
    await eventually('scaled to 1', async () => {
      const s = await poolStatus(h, 'py-pool');
      return (await members(h, 'py-pool')).length === 1 && s?.replicas === 1 && s.readyReplicas === 1;
    });
    await eventually('surplus pods removed', () => h.runtime.list().length === 1);
  });

  test('a pool whose template is missing says so in status', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxWarmPoolType, warmPool('orphan', 'nope', 2, h.ns));
    const s = await eventually('TemplateNotFound', async () => {
      const status = await poolStatus(h, 'orphan');
      return status?.conditions?.find((c) => c.reason === 'TemplateNotFound') !== undefined ? status : undefined;
    });
    assert.equal(s.replicas, 0);
    await h.store.create(SandboxTemplateType, template('nope', h.ns));
    await eventually('pool fills once the template exists', async () => (await poolStatus(h, 'orphan'))?.readyReplicas === 2);
  });

  test('a pod the runtime cannot start is said on the sandbox, and the sandbox runs once it can', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    // Not Invalid: that one is terminal in the queue (a spec change reconciles again anyway).
    h.runtime.startError = new AsbError('Unavailable', 'pods "x" is forbidden: exceeded quota: pods=10');
    const { sandbox: sb } = await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'team-a' });
    const failed = await eventually('the start failure in status', async () => {
      const s = await sandbox(h, sb.metadata.name);
      return s?.status?.conditions?.find((c) => c.reason === 'PodStartFailed') !== undefined ? s : undefined;
    });
    assert.equal(failed.status?.phase, 'Pending');
    assert.match(failed.status.message ?? '', /could not be started: pods "x" is forbidden: exceeded quota/);
    h.runtime.startError = undefined;
    const running = await h.op.claimer.waitReady(h.ns, sb.metadata.name, 10_000);
    assert.equal(running.status?.phase, 'Running', 'retried with backoff');
  });

  test('pause stops the pod keeping its volumes; resume starts it again and status follows', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    const { sandbox: sb } = await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'team-a' });
    const name = sb.metadata.name;
    const running = await h.op.claimer.waitReady(h.ns, name, 5_000);
    const ip = running.status?.podIPs?.[0];
    assert.ok(ip !== undefined);

    await setMode(h, name, 'Suspended');
    const paused = await eventually('hibernated', async () => {
      const s = await sandbox(h, name);
      return s?.status?.phase === 'Hibernated' ? s : undefined;
    });
    assert.equal(h.runtime.state(name).phase, 'Stopped');
    assert.ok(h.runtime.hasVolumes(name), 'hibernation keeps the volumes');
    assert.equal(paused.status?.conditions?.find((c) => c.type === 'Ready')?.reason, 'SandboxSuspended');
    assert.equal(paused.status.podIPs, undefined);

    await setMode(h, name, 'Running');
    const woke = await h.op.claimer.waitReady(h.ns, name, 5_000);
    assert.equal(woke.status?.phase, 'Running');
    assert.equal(woke.status.podIPs?.[0], ip, 'same identity after wake');
    assert.equal(h.runtime.calls.filter((c) => c === `remove ${name}`).length, 0, 'volumes were never removed');
    assert.match(await h.registry.getSingleMetricAsString('asb_wake_seconds'), /asb_wake_seconds_count 1/);
  });

  test('shutdownTime with Delete deletes the sandbox; with Retain keeps it Expired with the pod stopped', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    const at = new Date(h.clock.now() + 3_600_000).toISOString();
    const del = (await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'a', shutdownTime: at })).sandbox.metadata.name;
    const keep = (await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'a', shutdownTime: at, shutdownPolicy: 'Retain' })).sandbox.metadata.name;
    await h.op.claimer.waitReady(h.ns, del, 5_000);
    await h.op.claimer.waitReady(h.ns, keep, 5_000);

    h.clock.advance(3_600_001);
    await eventually('Delete policy removed the object', async () => (await sandbox(h, del)) === undefined);
    assert.equal(h.runtime.state(del).phase, 'Absent');
    const kept = await eventually('Retain policy kept it Expired', async () => {
      const s = await sandbox(h, keep);
      return s?.status?.phase === 'Expired' ? s : undefined;
    });
    assert.equal(kept.status?.conditions?.find((c) => c.type === 'Ready')?.reason, 'SandboxExpired');
    assert.equal(h.runtime.state(keep).phase, 'Stopped');
    assert.ok(h.runtime.hasVolumes(keep));
  });

  test('idle timeout hibernates a claimed sandbox; activity and warm membership keep sandboxes running', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns, { idleTimeoutMs: 30_000 }));
    await h.store.create(SandboxWarmPoolType, warmPool('py-pool', 'py', 2, h.ns));
    await eventually('pool ready', async () => (await poolStatus(h, 'py-pool'))?.readyReplicas === 2);
    // Members sit warm for an hour: the claim, not the pod start, starts the idle clock.
    h.clock.advance(3_600_000);
    const idle = (await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'a' })).sandbox.metadata.name;
    const busy = (await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'a' })).sandbox.metadata.name;
    await eventually('pool refilled and settled', async () => (await poolStatus(h, 'py-pool'))?.readyReplicas === 2 && h.op.depth() === 0);
    assert.equal((await sandbox(h, idle))?.status?.phase, 'Running', 'a long-warm member does not idle out on claim');

    h.clock.advance(20_000);
    h.op.activity.touch(busy);
    h.clock.advance(15_000);
    const slept = await eventually('idle sandbox hibernated', async () => {
      const s = await sandbox(h, idle);
      return s?.status?.phase === 'Hibernated' ? s : undefined;
    });
    assert.equal(slept.spec.operatingMode, 'Suspended');
    assert.equal(h.runtime.state(idle).phase, 'Stopped');
    assert.equal((await sandbox(h, busy))?.status?.phase, 'Running', 'recent activity keeps it awake');
    for (const m of await members(h, 'py-pool')) assert.equal(h.runtime.state(m.metadata.name).phase, 'Running', 'warm members never idle out');
  });

  test('deleting a sandbox removes its pod, then the object (finalizer)', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    const name = (await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'a' })).sandbox.metadata.name;
    await h.op.claimer.waitReady(h.ns, name, 5_000);
    const deleting = await h.store.delete<Sandbox>(SandboxType, h.ns, name);
    assert.ok(deleting.metadata.deletionTimestamp !== undefined, 'the finalizer holds the object');
    await eventually('object gone', async () => (await sandbox(h, name)) === undefined);
    assert.equal(h.runtime.state(name).phase, 'Absent');
    assert.equal(h.runtime.hasVolumes(name), false);
    const order = h.runtime.calls.filter((c) => c.endsWith(name));
    assert.equal(order.at(-1), `remove ${name}`);
  });

  test('after a restart the operator removes orphan pods and restarts pods that should run', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    const name = (await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'a' })).sandbox.metadata.name;
    await h.op.claimer.waitReady(h.ns, name, 5_000);
    await h.op.close();

    // While the worker was down: the pod died, and a pod appeared for a sandbox that is gone.
    await h.runtime.stop(name);
    h.runtime.adopt({ id: 'ghost', uid: 'ghost-uid', namespace: h.ns, hostname: 'ghost', spec: { containers: [] } }, 'Running');

    const op2 = await h.restart();
    await eventually('pod restarted', () => h.runtime.state(name).phase === 'Running');
    await eventually('orphan removed', () => h.runtime.state('ghost').phase === 'Absent');
    const s = await op2.claimer.waitReady(h.ns, name, 5_000);
    assert.equal(s.status?.phase, 'Running');
  });

  test('security probe C1: a Sandbox under a taken id in another namespace never gets the pod; deleting it leaves the holder running', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    const holder = (await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'victim' })).sandbox;
    const id = holder.metadata.name;
    await h.op.claimer.waitReady(h.ns, id, 5_000);
    // As kubectl (or a second API replica) could write it: the same name in another namespace.
    const rival = await writeRival(h, holder);
    assert.equal(rival.status?.phase, 'Failed');
    assert.equal(h.runtime.state(id).uid, holder.metadata.uid, "the pod is still the holder's");
    await h.store.delete(SandboxType, h.otherNs, id);
    await eventually('the rival gone', async () => (await h.store.tryGet(SandboxType, h.otherNs, id)) === undefined);
    assert.equal(h.runtime.state(id).phase, 'Running', "the holder's pod was not removed");
    assert.ok(!h.runtime.calls.includes(`remove ${id}`), 'no remove of the id was asked');
  });

  test('security probe M1: sandboxes that only wear a pool\'s label are not its members, so the pool still refills', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    // Written past the API's label check (kubectl): labelled as members, owned by a team, no owner reference.
    for (const name of ['fake-a', 'fake-b']) {
      const fake = structuredClone(template('py', h.ns)) as unknown as Sandbox;
      await h.store.create(SandboxType, {
        apiVersion: 'agents.x-k8s.io/v1alpha1',
        kind: 'Sandbox',
        metadata: { name, namespace: h.ns, labels: { [LABEL.pool]: 'py-pool', [LABEL.owner]: 'attacker' } },
        spec: { podTemplate: fake.spec.podTemplate },
      });
    }
    await h.store.create(SandboxWarmPoolType, warmPool('py-pool', 'py', 2, h.ns));
    await eventually('pool ready with members of its own', async () => (await poolStatus(h, 'py-pool'))?.readyReplicas === 2);
    const own = (await members(h, 'py-pool')).filter((m) => !m.metadata.name.startsWith('fake-'));
    assert.equal(own.length, 2, 'the pool made its own two members beside the fakes');
    const claimed = await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'victim' });
    assert.equal(claimed.launch, 'warm', 'a claim gets a real member, not a cold start');
    assert.ok(!claimed.sandbox.metadata.name.startsWith('fake-'));
  });

  test('deleting a warm pool deletes its members and their pods', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    await h.store.create(SandboxWarmPoolType, warmPool('py-pool', 'py', 3, h.ns));
    await eventually('pool ready', async () => (await poolStatus(h, 'py-pool'))?.readyReplicas === 3);
    await h.store.delete(SandboxWarmPoolType, h.ns, 'py-pool');
    await eventually('members gone', async () => (await members(h, 'py-pool')).length === 0);
    await eventually('pods removed', () => h.runtime.list().length === 0);
  });

  test('a warm pool with updateStrategy Recreate replaces members when its template changes', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    const pool = warmPool('py-pool', 'py', 2, h.ns);
    await h.store.create(SandboxWarmPoolType, { ...pool, spec: { ...pool.spec, updateStrategy: { type: 'Recreate' } } });
    await eventually('pool ready', async () => (await poolStatus(h, 'py-pool'))?.readyReplicas === 2);
    const old = (await members(h, 'py-pool')).map((m) => m.metadata.name);

    const tpl = await h.store.get<SandboxTemplate>(SandboxTemplateType, h.ns, 'py');
    const image = 'python:3.13';
    const containers = tpl.spec.podTemplate.spec.containers.map((c) => ({ ...c, image }));
    await h.store.update(SandboxTemplateType, { ...tpl, spec: { ...tpl.spec, podTemplate: { spec: { ...tpl.spec.podTemplate.spec, containers } } } });
    const fresh = await eventually('members rebuilt from the new template', async () => {
      const list = await members(h, 'py-pool');
      const ready = (await poolStatus(h, 'py-pool'))?.readyReplicas === 2;
      return ready && list.length === 2 && list.every((m) => !old.includes(m.metadata.name)) ? list : undefined;
    });
    for (const m of fresh) assert.equal(m.spec.podTemplate.spec.containers[0]?.image, image);
  });

  test('the informer relists after its watch ends (Gone) and reports what changed in the gap', async (t) => {
    const h = await start(t);
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
    await h.store.create(SandboxTemplateType, template('a', h.ns));
    await informer.synced();
    await eventually('a cached', () => informer.getByName(h.ns, 'a') !== undefined);

    breakWatch?.();
    assert.equal(informer.healthy, false);
    await h.store.create(SandboxTemplateType, template('b', h.ns));
    await h.store.delete(SandboxTemplateType, h.ns, 'a');
    await eventually('relisted', () => informer.healthy && informer.getByName(h.ns, 'b') !== undefined);
    assert.equal(informer.getByName(h.ns, 'a'), undefined, 'the delete in the gap is seen');
    assert.ok(seen.includes(`${h.ns}/b`) && seen.filter((k) => k === `${h.ns}/a`).length >= 2, 'handlers heard both keys');
  });
}

async function fillPool(h: Harness, name: string, replicas: number): Promise<void> {
  await h.store.create(SandboxTemplateType, template('py', h.ns));
  await h.store.create(SandboxWarmPoolType, warmPool(name, 'py', replicas, h.ns));
  await eventually(`pool ${name} ready`, async () => {
    const pool = await h.store.get<SandboxWarmPool>(SandboxWarmPoolType, h.ns, name);
    return pool.status?.readyReplicas === replicas && h.op.claimer.available(h.ns, name) === replicas;
  }, 60_000);
}

function claimObject(h: Harness, name: string, spec: SandboxClaim['spec']): SandboxClaim {
  return { apiVersion: apiVersionOf(SandboxClaimType), kind: 'SandboxClaim', metadata: { name, namespace: h.ns }, spec };
}

async function claimStatus(h: Harness, name: string): Promise<SandboxClaim | undefined> {
  const c = await h.store.tryGet<SandboxClaim>(SandboxClaimType, h.ns, name);
  return c?.status?.conditions?.find((x) => x.type === 'Ready')?.status === 'True' ? c : undefined;
}

async function readyCondition(h: Harness, name: string): Promise<Condition | undefined> {
  return (await h.store.tryGet<SandboxClaim>(SandboxClaimType, h.ns, name))?.status?.conditions?.find((x) => x.type === 'Ready');
}

/** Waits until the claim's Ready condition is False with `reason`; returns the claim. */
async function claimSays(h: Harness, name: string, reason: string): Promise<SandboxClaim> {
  return eventually(`claim ${name} Ready=False ${reason}`, async () => {
    const c = await h.store.tryGet<SandboxClaim>(SandboxClaimType, h.ns, name);
    const ready = c?.status?.conditions?.find((x) => x.type === 'Ready');
    return ready?.status === 'False' && ready.reason === reason ? c : undefined;
  }, 5_000);
}

/** Claim reconciles that failed (and so were retried with backoff) so far. */
async function claimReconcileErrors(h: Harness): Promise<number> {
  const metric = await h.registry.getSingleMetric('asb_reconcile_total')?.get();
  return metric?.values.find((v) => v.labels.controller === 'claim' && v.labels.result === 'error')?.value ?? 0;
}

/** The claim hot path (Claimer) and SandboxClaim objects, on the stores `openStore` makes. */
export function claimSuite(openStore: HarnessStoreFactory): void {
  const start = starter(openStore);

  test('a claim with no warm member cold-starts from the template and says so', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    const { sandbox, launch } = await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'team-a', labels: { app: 'demo' } });
    assert.equal(launch, 'cold');
    assert.match(sandbox.metadata.name, /^tst1[a-z0-9]{16}$/);
    assert.equal(sandbox.metadata.labels?.[LABEL.launchType], 'cold');
    assert.equal(sandbox.metadata.labels[LABEL.owner], 'team-a');
    assert.equal(sandbox.metadata.labels.app, 'demo');
    const ready = await h.op.claimer.waitReady(h.ns, sandbox.metadata.name, 5_000);
    assert.equal(ready.status?.phase, 'Running');
    assert.match(await h.registry.getSingleMetricAsString('asb_claims_total'), /launch="cold",result="bound"} 1/);
  });

  test('a claim naming an unknown template fails with NotFound; reserved labels are refused', async (t) => {
    const h = await start(t);
    await assert.rejects(h.op.claimer.claim({ namespace: h.ns, template: 'nope', owner: 'a' }), (err) => isAsbError(err, 'NotFound'));
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    await assert.rejects(
      h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'a', labels: { [LABEL.owner]: 'someone-else' } }),
      (err) => isAsbError(err, 'Invalid'),
    );
    // Every prefix the CRD reserves, on both stores: the API server would refuse the Sandbox.
    await assert.rejects(
      h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'a', annotations: { 'extensions.agents.x-k8s.io/mine': 'x' } }),
      (err) => isAsbError(err, 'Invalid') && /extensions\.agents\.x-k8s\.io\/mine/.test(JSON.stringify(err.fields)),
    );
    assert.equal((await h.store.list<Sandbox>(SandboxType, { namespace: h.ns })).items.length, 0, 'a refused claim creates nothing');
  });

  test('500 concurrent claims against a 200-member pool: 200 warm, 300 cold, no member bound twice', async (t) => {
    const h = await start(t);
    await fillPool(h, 'big', 200);
    const warmNames = new Set((await h.store.list<Sandbox>(SandboxType, { labelSelector: `${LABEL.pool}=big` })).items.map((s) => s.metadata.name));
    // Refills from here on stay Pending, so only the 200 members above can be claimed warm.
    h.runtime.autoReady = false;

    const results = await Promise.all(Array.from({ length: 500 }, (_, i) => h.op.claimer.claim({ namespace: h.ns, pool: 'big', owner: `team-${i % 7}` })));
    const warm = results.filter((r) => r.launch === 'warm');
    const cold = results.filter((r) => r.launch === 'cold');
    assert.equal(warm.length, 200);
    assert.equal(cold.length, 300);
    const names = results.map((r) => r.sandbox.metadata.name);
    assert.equal(new Set(names).size, 500, 'every claim got its own sandbox');
    assert.ok(warm.every((r) => warmNames.has(r.sandbox.metadata.name)), 'warm claims got pool members');

    // The store agrees: each bound sandbox carries the owner of exactly the claim that got it.
    for (const [i, r] of results.entries()) {
      const stored = await h.store.get<Sandbox>(SandboxType, h.ns, r.sandbox.metadata.name);
      assert.equal(stored.metadata.labels?.[LABEL.owner], `team-${i % 7}`);
    }
  });

  test('with coldStart false an exhausted pool answers PoolExhausted', async (t) => {
    const h = await start(t);
    await fillPool(h, 'small', 20);
    h.runtime.autoReady = false;
    const settled = await Promise.allSettled(Array.from({ length: 50 }, () => h.op.claimer.claim({ namespace: h.ns, pool: 'small', owner: 'a', coldStart: false })));
    const bound = settled.filter((s): s is PromiseFulfilledResult<ClaimResult> => s.status === 'fulfilled');
    const refused = settled.filter((s) => s.status === 'rejected' && isAsbError(s.reason, 'PoolExhausted'));
    assert.equal(bound.length, 20);
    assert.equal(refused.length, 30);
    assert.equal(new Set(bound.map((b) => b.value.sandbox.metadata.name)).size, 20);
    assert.ok(bound.every((b) => b.value.launch === 'warm'));
  });

  test('waitReady times out with Timeout for a sandbox that never becomes ready, and resolves when it does', async (t) => {
    const h = await start(t, { autoReady: false });
    await h.store.create(SandboxTemplateType, template('py', h.ns));
    const { sandbox } = await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'a' });
    const name = sandbox.metadata.name;
    const waiting = h.op.claimer.waitReady(h.ns, name, 60_000);
    await assert.rejects(
      (async () => {
        const w = h.op.claimer.waitReady(h.ns, name, 30_000);
        h.clock.advance(30_001);
        return w;
      })(),
      (err) => isAsbError(err, 'Timeout'),
    );
    await eventually('pod started', () => h.runtime.state(name).phase === 'Pending');
    h.runtime.makeReady(name);
    const ready = await waiting;
    assert.equal(ready.status?.phase, 'Running');
  });

  test('SandboxClaim objects bind a warm sandbox; status and annotation name it; deleting the claim deletes the sandbox', async (t) => {
    const h = await start(t);
    await fillPool(h, 'py-pool', 2);
    await h.store.create(SandboxClaimType, claimObject(h, 'c1', { warmPoolRef: { name: 'py-pool' }, lifecycle: { shutdownTime: '2999-01-01T00:00:00Z' } }));
    await h.store.create(SandboxClaimType, claimObject(h, 'c2', { sandboxTemplateRef: { name: 'py' }, warmpool: 'none' }));

    const c1 = await eventually('c1 ready', () => claimStatus(h, 'c1'));
    const name1 = c1.status?.sandbox?.name ?? '';
    assert.equal(c1.metadata.annotations?.[ANNOTATION.sandboxName], name1);
    assert.equal(c1.status?.launchType, 'warm');
    const sb1 = await h.store.get<Sandbox>(SandboxType, h.ns, name1);
    assert.equal(sb1.metadata.labels?.[LABEL.claimUid], c1.metadata.uid);
    assert.equal(sb1.metadata.ownerReferences?.find((o) => o.kind === 'SandboxClaim')?.name, 'c1');
    assert.equal(sb1.spec.lifecycle?.shutdownTime, '2999-01-01T00:00:00Z');

    const c2 = await eventually('c2 ready', () => claimStatus(h, 'c2'));
    assert.equal(c2.status?.launchType, 'cold', 'warmpool: none cold-starts');

    await h.store.delete(SandboxClaimType, h.ns, 'c1');
    await eventually('claimed sandbox deleted with its claim', async () => (await h.store.tryGet(SandboxType, h.ns, name1)) === undefined);
    assert.equal(h.runtime.state(name1).phase, 'Absent');
    assert.ok(await h.store.tryGet(SandboxType, h.ns, c2.status.sandbox?.name ?? ''), "the other claim's sandbox stays");
  });

  test('after an operator restart claims keep their sandbox and nothing is bound twice', async (t) => {
    const h = await start(t);
    await fillPool(h, 'py-pool', 3);
    for (const n of ['a', 'b', 'c', 'd']) await h.store.create(SandboxClaimType, claimObject(h, n, { warmPoolRef: { name: 'py-pool' } }));
    const before = new Map<string, string>();
    for (const n of ['a', 'b', 'c', 'd']) {
      const c = await eventually(`claim ${n} ready`, () => claimStatus(h, n));
      before.set(n, c.status?.sandbox?.name ?? '');
    }
    await h.op.close();

    const op2 = await h.restart();
    await eventually('restarted operator settled', async () => {
      const pool = await h.store.get<SandboxWarmPool>(SandboxWarmPoolType, h.ns, 'py-pool');
      return op2.depth() === 0 && pool.status?.readyReplicas === 3;
    });
    for (const n of ['a', 'b', 'c', 'd']) {
      const c = await h.store.get<SandboxClaim>(SandboxClaimType, h.ns, n);
      assert.equal(c.status?.sandbox?.name, before.get(n), `claim ${n} kept its sandbox`);
      const bound = (await h.store.list<Sandbox>(SandboxType, { labelSelector: `${LABEL.claimUid}=${c.metadata.uid ?? ''}` })).items;
      assert.equal(bound.length, 1, `claim ${n} has exactly one sandbox`);
    }
  });

  test('a SandboxClaim for a missing warm pool says Ready=False WarmPoolNotFound in its first reconcile, and binds once the pool appears', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxClaimType, claimObject(h, 'early', { warmPoolRef: { name: 'later' } }));
    const waiting = await claimSays(h, 'early', 'WarmPoolNotFound');
    assert.match(waiting.status?.conditions?.[0]?.message ?? '', /SandboxWarmPool "later" not found/);
    assert.equal(waiting.status?.sandbox, undefined);
    assert.equal(await claimReconcileErrors(h), 0, 'said in the first reconcile, not after failed retries');
    assert.equal((await h.store.list<Sandbox>(SandboxType, { namespace: h.ns })).items.length, 0);

    await h.store.create(SandboxTemplateType, template('py', h.ns));
    await h.store.create(SandboxWarmPoolType, warmPool('later', 'py', 1, h.ns));
    const bound = await eventually('bound once the pool exists', () => claimStatus(h, 'early'));
    const sb = await h.store.get<Sandbox>(SandboxType, h.ns, bound.status?.sandbox?.name ?? '');
    assert.equal(sb.metadata.labels?.[LABEL.claimUid], bound.metadata.uid);
  });

  test('a SandboxClaim whose pool names a missing template says Ready=False TemplateNotFound, and binds once the template appears', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxWarmPoolType, warmPool('py-pool', 'py', 1, h.ns));
    await h.store.create(SandboxClaimType, claimObject(h, 'c', { warmPoolRef: { name: 'py-pool' } }));
    const waiting = await claimSays(h, 'c', 'TemplateNotFound');
    assert.match(waiting.status?.conditions?.[0]?.message ?? '', /SandboxTemplate "py" not found/);
    assert.equal(await claimReconcileErrors(h), 0);

    await h.store.create(SandboxTemplateType, template('py', h.ns));
    const bound = await eventually('bound once the template exists', () => claimStatus(h, 'c'));
    assert.ok(bound.status?.sandbox?.name);
  });

  test('a SandboxClaim with env cold-starts a sandbox whose pod has the env; a template that disallows env refuses the claim', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('open', h.ns, { envVarsInjectionPolicy: 'Allowed' }));
    await h.store.create(SandboxTemplateType, template('closed', h.ns));
    await h.store.create(SandboxWarmPoolType, warmPool('open-pool', 'open', 1, h.ns));
    await h.store.create(SandboxWarmPoolType, warmPool('closed-pool', 'closed', 1, h.ns));
    await eventually('both pools warm', () => h.op.claimer.available(h.ns, 'open-pool') === 1 && h.op.claimer.available(h.ns, 'closed-pool') === 1);
    const env = [{ name: 'GREETING', value: 'hello' }, { name: 'TARGET', value: 'world', containerName: 'main' }];
    await h.store.create(SandboxClaimType, claimObject(h, 'with-env', { warmPoolRef: { name: 'open-pool' }, env }));
    await h.store.create(SandboxClaimType, claimObject(h, 'refused', { warmPoolRef: { name: 'closed-pool' }, env }));

    const ready = await eventually('with-env ready', () => claimStatus(h, 'with-env'));
    assert.equal(ready.status?.launchType, 'cold', 'a warm member\'s pod cannot take env');
    const name = ready.status.sandbox?.name ?? '';
    const pod = h.runtime.request(name);
    assert.deepEqual(pod?.spec.containers[0]?.env, env.map((e) => ({ name: e.name, value: e.value })));
    assert.equal(h.op.claimer.available(h.ns, 'open-pool'), 1, 'the warm member stays in its pool');

    const refused = await claimSays(h, 'refused', 'EnvVarsInjectionRejected');
    assert.match(refused.status?.conditions?.[0]?.message ?? '', /envVarsInjectionPolicy is Disallowed/);
    const owned = (await h.store.list<Sandbox>(SandboxType, { labelSelector: `${LABEL.claimUid}=${refused.metadata.uid ?? ''}` })).items;
    assert.equal(owned.length, 0, 'never bound without its env');
  });

  test('a SandboxClaim with volumeClaimTemplates cold-starts a sandbox with those volumes; a template that disallows them refuses the claim', async (t) => {
    const h = await start(t);
    await h.store.create(SandboxTemplateType, template('open', h.ns, { volumeClaimTemplatesPolicy: 'Allowed' }));
    await h.store.create(SandboxTemplateType, template('closed', h.ns));
    await h.store.create(SandboxWarmPoolType, warmPool('open-pool', 'open', 1, h.ns));
    await h.store.create(SandboxWarmPoolType, warmPool('closed-pool', 'closed', 1, h.ns));
    await eventually('both pools warm', () => h.op.claimer.available(h.ns, 'open-pool') === 1 && h.op.claimer.available(h.ns, 'closed-pool') === 1);
    const volumeClaimTemplates = [{ metadata: { name: 'data' }, spec: { accessModes: ['ReadWriteOnce'], resources: { requests: { storage: '2Gi' } } } }];
    await h.store.create(SandboxClaimType, claimObject(h, 'with-volume', { warmPoolRef: { name: 'open-pool' }, volumeClaimTemplates }));
    await h.store.create(SandboxClaimType, claimObject(h, 'refused', { warmPoolRef: { name: 'closed-pool' }, volumeClaimTemplates }));

    const ready = await eventually('with-volume ready', () => claimStatus(h, 'with-volume'));
    assert.equal(ready.status?.launchType, 'cold');
    const pod = h.runtime.request(ready.status.sandbox?.name ?? '');
    const storage = pod?.volumeClaimTemplates?.find((v) => v.metadata.name === 'data')?.spec.resources?.requests?.storage;
    assert.deepEqual(pod?.volumeClaimTemplates?.map((v) => v.metadata.name), ['work', 'data'], "the template's volume and the claim's");
    assert.equal(storage, '2Gi');

    const refused = await claimSays(h, 'refused', 'VolumeClaimTemplatesError');
    assert.match(refused.status?.conditions?.[0]?.message ?? '', /volumeClaimTemplatesPolicy is Disallowed/);
  });

  test('at shutdownTime a claim says ClaimExpired; Delete and DeleteForeground delete claim and sandbox, Retain keeps the claim alone', async (t) => {
    const h = await start(t);
    await fillPool(h, 'py-pool', 3);
    const shutdownTime = new Date(h.clock.now() + 3_600_000).toISOString().replace(/\.\d+Z$/, 'Z');
    const policies = { 'c-delete': 'Delete', 'c-foreground': 'DeleteForeground', 'c-retain': 'Retain' } as const;
    const sandboxOf = new Map<string, string>();
    for (const [name, shutdownPolicy] of Object.entries(policies)) {
      await h.store.create(SandboxClaimType, claimObject(h, name, { warmPoolRef: { name: 'py-pool' }, lifecycle: { shutdownTime, shutdownPolicy } }));
    }
    for (const name of Object.keys(policies)) sandboxOf.set(name, (await eventually(`${name} ready`, () => claimStatus(h, name))).status?.sandbox?.name ?? '');
    // What the SDK's watch sees: the reason, then the deletion. The watch is its own stream (on
    // the kube tier an HTTP watch beside the GETs below), so a GET can find the claim gone before
    // the watch has delivered its DELETED: wait for that event itself, not for the store.
    const seen: string[] = [];
    const deletedSeen = new Map(['c-delete', 'c-foreground'].map((name) => [name, Promise.withResolvers<true>()]));
    for (const d of deletedSeen.values()) d.promise.catch(() => undefined); // a watch error is reported by the await below
    const watch = h.store.watch<SandboxClaim>(SandboxClaimType, { namespace: h.ns }, {
      onEvent: (e) => {
        seen.push(`${e.object.metadata.name} ${e.type === 'DELETED' ? 'DELETED' : e.object.status?.conditions?.find((c) => c.type === 'Ready')?.reason ?? ''}`);
        if (e.type === 'DELETED') deletedSeen.get(e.object.metadata.name)?.resolve(true);
      },
      onError: (err) => {
        for (const d of deletedSeen.values()) d.reject(err);
      },
    });
    t.after(() => watch.close());

    h.clock.advance(Math.ceil(Date.parse(shutdownTime) - h.clock.now()) + 1_000);
    for (const [name, deleted] of deletedSeen) {
      await eventually(`${name} deleted`, async () => (await h.store.tryGet(SandboxClaimType, h.ns, name)) === undefined);
      await eventually(`${name}'s sandbox deleted`, async () => (await h.store.tryGet(SandboxType, h.ns, sandboxOf.get(name) ?? '')) === undefined);
      await within(`the watch to deliver ${name}'s DELETED`, deleted.promise, WATCH_DELIVERY_BOUND_MS).catch((err: unknown) => assert.fail(`${String(err)}; the watch saw: ${seen.join(', ')}`));
      const mine = seen.filter((s) => s.startsWith(`${name} `));
      assert.ok(mine.indexOf(`${name} ClaimExpired`) >= 0 && mine.indexOf(`${name} ClaimExpired`) < mine.indexOf(`${name} DELETED`), `${name}: ClaimExpired before DELETED, saw ${mine.join(', ')}`);
    }
    await eventually("c-retain's sandbox deleted", async () => (await h.store.tryGet(SandboxType, h.ns, sandboxOf.get('c-retain') ?? '')) === undefined);
    const kept = await eventually('c-retain names no sandbox', async () => {
      const c = await h.store.tryGet<SandboxClaim>(SandboxClaimType, h.ns, 'c-retain');
      return c?.status?.sandbox === undefined ? c : undefined;
    });
    assert.equal((await readyCondition(h, 'c-retain'))?.reason, 'ClaimExpired');
    assert.equal(kept.status?.conditions?.[0]?.status, 'False');
    for (const name of sandboxOf.values()) assert.equal(h.runtime.state(name).phase, 'Absent', 'every expired claim\'s pod is gone');
  });
}
