// How the Sandbox controller suspends with memory (spec.suspensionStrategy, the per-pause
// asb.dev/suspend-memory annotation) and says what it kept, against the real SQLite store and the
// fake runtime: memory kept where the runtime can, a clear refusal (the sandbox back to Running)
// where a pause needed memory and could not have it, files only where the pause allowed that, and
// what a wake restored. The same behaviour on real gVisor and runc pods: test/e2b-pause.test.ts.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Counter } from 'prom-client';
import type { Condition } from '../src/api/meta.ts';
import { ANNOTATION, SandboxSnapshotType, SandboxTemplateType, SandboxType, type Sandbox, type SandboxSnapshot, type SuspendMemory } from '../src/api/types.ts';
import { validateObject } from '../src/api/validate.ts';
import { AsbError, isAsbError } from '../src/errors.ts';
import { createAccessTokens } from '../src/worker/access-token.ts';
import { E2B_ANNOTATION } from '../src/worker/e2b/shape.ts';
import { routeEntryOf } from '../src/worker/route-entry.ts';
import { eventually, startHarness, template, type Harness } from './support/operator-harness.ts';

const TOKENS = createAccessTokens(Buffer.alloc(32, 7));

/** Sets annotations on the sandbox as its owner would. */
async function mutate(h: Harness, name: string, annotations: Record<string, string>): Promise<void> {
  const s = await get(h, name);
  await h.store.update(SandboxType, { ...s, metadata: { ...s.metadata, annotations: { ...s.metadata.annotations, ...annotations } } });
}

async function get(h: Harness, name: string): Promise<Sandbox> {
  return h.store.get<Sandbox>(SandboxType, h.ns, name);
}

function cond(s: Sandbox, type: string): Condition | undefined {
  return s.status?.conditions?.find((c) => c.type === type);
}

/** Suspends as a pause API does: operatingMode Suspended, with the pause's own memory choice when it names one. */
async function suspend(h: Harness, name: string, memory?: SuspendMemory): Promise<Sandbox> {
  const sb = await get(h, name);
  const annotations = { ...sb.metadata.annotations };
  if (memory !== undefined) annotations[ANNOTATION.suspendMemory] = memory;
  return h.store.update<Sandbox>(SandboxType, { ...sb, metadata: { ...sb.metadata, annotations }, spec: { ...sb.spec, operatingMode: 'Suspended' } });
}

async function resume(h: Harness, name: string, discard = false): Promise<void> {
  const sb = await get(h, name);
  const annotations = { ...sb.metadata.annotations };
  if (discard) annotations[ANNOTATION.discardMemory] = 'true';
  await h.store.update<Sandbox>(SandboxType, { ...sb, metadata: { ...sb.metadata, annotations }, spec: { ...sb.spec, operatingMode: 'Running' } });
}

async function hibernated(h: Harness, name: string): Promise<Sandbox> {
  return eventually(`${name} hibernated`, async () => {
    const s = await get(h, name);
    return s.status?.phase === 'Hibernated' ? s : undefined;
  });
}

/** The counter's non-zero samples, by label values (an operator's view of /metrics; known values start at 0). */
async function counted(counter: Counter): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const v of (await counter.get()).values) if (v.value > 0) out[Object.values(v.labels).join(',')] = v.value;
  return out;
}

async function claimReady(h: Harness, tpl: string, extra: Partial<Parameters<Harness['op']['claimer']['claim']>[0]> = {}): Promise<string> {
  const name = (await h.op.claimer.claim({ namespace: h.ns, template: tpl, owner: 'team-a', ...extra })).sandbox.metadata.name;
  await h.op.claimer.waitReady(h.ns, name, 5_000);
  return name;
}

test('suspensionStrategy Hibernate, inherited from the template: memory kept (the condition says how much), and the wake says it was restored', async (t) => {
  const h = await startHarness(t);
  h.runtime.keepsMemory = true;
  await h.store.create(SandboxTemplateType, template('mem', h.ns, { suspensionStrategy: 'Hibernate' }));
  const name = await claimReady(h, 'mem');
  assert.equal((await get(h, name)).spec.suspensionStrategy, 'Hibernate', 'copied from the template');

  await suspend(h, name);
  const paused = await hibernated(h, name);
  assert.ok(h.runtime.calls.includes(`stop ${name} with-memory`));
  const suspended = cond(paused, 'Suspended');
  assert.equal(suspended?.status, 'True');
  assert.equal(suspended.reason, 'MemoryKept');
  assert.match(suspended.message ?? '', /42\.0 MiB checkpoint/);

  await resume(h, name);
  const woke = await eventually('restored', async () => {
    const s = await get(h, name);
    return s.status?.phase === 'Running' && cond(s, 'MemoryRestored') !== undefined ? s : undefined;
  });
  assert.deepEqual([cond(woke, 'MemoryRestored')?.status, cond(woke, 'MemoryRestored')?.reason], ['True', 'Restored']);
  assert.equal(cond(woke, 'Suspended'), undefined, 'a successful suspension leaves no Suspended condition on the running sandbox');
  assert.deepEqual(await counted(h.metrics.checkpointsTotal), { saved: 1 }, 'asb_checkpoints_total');
  assert.deepEqual(await counted(h.metrics.memoryRestoresTotal), { restored: 1 }, 'asb_memory_restores_total');
});

test('a restore that fails starts the pod from its files, and MemoryRestored False says why in the runtime\'s words', async (t) => {
  const h = await startHarness(t);
  h.runtime.keepsMemory = true;
  await h.store.create(SandboxTemplateType, template('mem', h.ns, { suspensionStrategy: 'Hibernate' }));
  const name = await claimReady(h, 'mem');
  await suspend(h, name);
  await hibernated(h, name);
  h.runtime.restoreFailure = 'the memory checkpoint cannot be restored, so the pod started from its files: made by another runsc';
  await resume(h, name);
  const woke = await eventually('woke from files', async () => {
    const s = await get(h, name);
    return s.status?.phase === 'Running' && cond(s, 'MemoryRestored') !== undefined ? s : undefined;
  });
  const restored = cond(woke, 'MemoryRestored');
  assert.deepEqual([restored?.status, restored?.reason], ['False', 'RestoreFailed']);
  assert.match(restored?.message ?? '', /made by another runsc/);
  assert.deepEqual(await counted(h.metrics.memoryRestoresTotal), { failed: 1 }, 'the failed restore is counted once, for an alert to page on');
});

test('discardMemory on resume starts the pod from its files (E2B\'s on_resume "reboot")', async (t) => {
  const h = await startHarness(t);
  h.runtime.keepsMemory = true;
  await h.store.create(SandboxTemplateType, template('mem', h.ns, { suspensionStrategy: 'Hibernate' }));
  const name = await claimReady(h, 'mem');
  await suspend(h, name);
  await hibernated(h, name);
  await resume(h, name, true);
  const woke = await eventually('woke', async () => {
    const s = await get(h, name);
    return s.status?.phase === 'Running' && cond(s, 'MemoryRestored') !== undefined ? s : undefined;
  });
  assert.ok(h.runtime.calls.includes(`start ${name} from-files`));
  assert.deepEqual([cond(woke, 'MemoryRestored')?.status, cond(woke, 'MemoryRestored')?.reason], ['False', 'Discarded']);
  assert.deepEqual(await counted(h.metrics.memoryRestoresTotal), { discarded: 1 });
});

test('Hibernate where the runtime cannot keep memory: never a silent files-only stop; the sandbox goes back to Running and says why', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('mem', h.ns, { suspensionStrategy: 'Hibernate' }));
  const name = await claimReady(h, 'mem');
  const asked = await suspend(h, name);
  const back = await eventually('back to Running with the reason', async () => {
    const s = await get(h, name);
    return s.spec.operatingMode === 'Running' && cond(s, 'Suspended')?.status === 'False' ? s : undefined;
  });
  const why = cond(back, 'Suspended');
  assert.equal(why?.reason, 'MemoryNotSupported');
  assert.match(why.message ?? '', /not suspended, it keeps running: .*CRIU/);
  assert.equal(why.observedGeneration, asked.metadata.generation, 'names the pause it answers');
  assert.equal(back.metadata.annotations?.[ANNOTATION.suspendMemory], undefined);
  assert.equal(h.runtime.state(name).phase, 'Running', 'the pod was never stopped');
  assert.deepEqual(h.runtime.calls.filter((c) => c.startsWith('stop')), [`stop ${name} with-memory`], 'no stop without memory');
  // Stays on the running sandbox's status, where kubectl describe shows it, and nothing retries.
  await eventually('settled', () => h.op.depth() === 0);
  const later = await get(h, name);
  assert.equal(later.status?.phase, 'Running');
  assert.equal(cond(later, 'Suspended')?.reason, 'MemoryNotSupported');
  assert.equal(h.runtime.calls.filter((c) => c.startsWith('stop')).length, 1);
});

test('a pause that prefers memory keeps files where the runtime cannot keep memory, and says so (MemoryNotKept)', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('files', h.ns));
  const name = await claimReady(h, 'files');
  await suspend(h, name, 'preferred');
  const paused = await hibernated(h, name);
  const suspended = cond(paused, 'Suspended');
  assert.deepEqual([suspended?.status, suspended?.reason], ['True', 'MemoryNotKept']);
  assert.match(suspended?.message ?? '', /memory not kept.*CRIU/);
  assert.deepEqual(h.runtime.calls.filter((c) => c.startsWith('stop')), [`stop ${name} with-memory`, `stop ${name}`]);
});

test('a save that fails: a required pause is refused (CheckpointFailed, still running); a preferred one too; the default Stop never asks for memory', async (t) => {
  const h = await startHarness(t);
  h.runtime.keepsMemory = true;
  h.runtime.checkpointError = new AsbError('CheckpointFailed', 'pod x\'s memory was not saved, it keeps running: the disk is full');
  await h.store.create(SandboxTemplateType, template('files', h.ns));
  const a = await claimReady(h, 'files');
  const b = await claimReady(h, 'files');
  const c = await claimReady(h, 'files');
  await suspend(h, a, 'required');
  await suspend(h, b, 'preferred');
  await suspend(h, c);
  for (const name of [a, b]) {
    const back = await eventually(`${name} back to Running`, async () => {
      const s = await get(h, name);
      return s.spec.operatingMode === 'Running' && cond(s, 'Suspended')?.status === 'False' ? s : undefined;
    });
    assert.equal(cond(back, 'Suspended')?.reason, 'CheckpointFailed');
    assert.match(cond(back, 'Suspended')?.message ?? '', /the disk is full/);
    assert.equal(h.runtime.state(name).phase, 'Running');
  }
  const stopped = await hibernated(h, c);
  assert.equal(cond(stopped, 'Suspended')?.reason, 'FilesKept');
  assert.deepEqual(h.runtime.calls.filter((x) => x.startsWith(`stop ${c}`)), [`stop ${c}`]);
  assert.deepEqual(await counted(h.metrics.checkpointsTotal), { failed: 2 }, 'two refused pauses; the default Stop asked for no memory');
});

test('the operator\'s own suspensions fall back to files when the save fails: an idle Hibernate sandbox still suspends, saying why', async (t) => {
  const h = await startHarness(t);
  h.runtime.keepsMemory = true;
  h.runtime.checkpointError = new AsbError('CheckpointFailed', 'the disk is full');
  await h.store.create(SandboxTemplateType, template('mem', h.ns, { suspensionStrategy: 'Hibernate', idleTimeoutMs: 30_000 }));
  const name = await claimReady(h, 'mem');
  h.clock.advance(31_000);
  const paused = await hibernated(h, name);
  assert.equal(paused.metadata.annotations?.[ANNOTATION.suspendMemory], 'fallback');
  assert.deepEqual([cond(paused, 'Suspended')?.reason, h.runtime.state(name).phase], ['MemoryNotKept', 'Stopped']);
  assert.match(cond(paused, 'Suspended')?.message ?? '', /the disk is full/);
  assert.deepEqual(await counted(h.metrics.checkpointsTotal), { fell_back: 1 });
});

test('an idle suspension is marked so traffic wakes it even when E2B\'s auto_resume is off; a suspension at the shutdown time is not', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('idle', h.ns, { idleTimeoutMs: 30_000 }));
  const idle = await claimReady(h, 'idle');
  await mutate(h, idle, { [E2B_ANNOTATION.autoResume]: 'false' });
  h.clock.advance(31_000);
  const slept = await hibernated(h, idle);
  assert.equal(slept.metadata.annotations?.[ANNOTATION.suspendedIdle], 'true');
  assert.equal(routeEntryOf(slept, 'c1', TOKENS)?.resumeOnTraffic, undefined, 'traffic wakes an idle hibernation');
  await resume(h, idle);
  // However it was resumed (here as kubectl does, a spec write), the operator clears the mark.
  await eventually('the idle mark cleared', async () => ((await get(h, idle)).metadata.annotations?.[ANNOTATION.suspendedIdle] === undefined ? true : undefined));
  await h.op.claimer.waitReady(h.ns, idle, 5_000);

  const at = new Date(h.clock.now() + 60_000).toISOString();
  const timed = await claimReady(h, 'idle', { shutdownTime: at, shutdownPolicy: 'Suspend', runTimeoutMs: 60_000 });
  await mutate(h, timed, { [E2B_ANNOTATION.autoResume]: 'false' });
  h.clock.advance(60_001);
  const paused = await hibernated(h, timed);
  assert.equal(paused.metadata.annotations?.[ANNOTATION.suspendedIdle], undefined);
  assert.equal(routeEntryOf(paused, 'c1', TOKENS)?.resumeOnTraffic, false, 'E2B\'s pause at the timeout without auto_resume is not woken by traffic');
  await mutate(h, timed, { [E2B_ANNOTATION.autoResume]: 'true' });
  assert.equal(routeEntryOf(await get(h, timed), 'c1', TOKENS)?.resumeOnTraffic, undefined, 'with auto_resume traffic wakes it');
});

test('shutdownPolicy Suspend: at its shutdownTime the sandbox is suspended with its strategy, not deleted', async (t) => {
  const h = await startHarness(t);
  h.runtime.keepsMemory = true;
  await h.store.create(SandboxTemplateType, template('mem', h.ns));
  const at = new Date(h.clock.now() + 60_000).toISOString();
  const name = await claimReady(h, 'mem', { shutdownTime: at, shutdownPolicy: 'Suspend', suspensionStrategy: 'Hibernate', runTimeoutMs: 60_000 });
  const made = await get(h, name);
  assert.equal(made.metadata.annotations?.[ANNOTATION.runTimeoutMs], '60000');
  h.clock.advance(60_001);
  const paused = await hibernated(h, name);
  assert.equal(paused.spec.operatingMode, 'Suspended');
  assert.equal(cond(paused, 'Suspended')?.reason, 'MemoryKept');
  assert.equal(h.runtime.state(name).phase, 'Stopped');
  await eventually('settled', () => h.op.depth() === 0);
  assert.ok((await h.store.tryGet(SandboxType, h.ns, name)) !== undefined, 'not deleted');
});

test('suspensionStrategy accepts Stop and Hibernate and refuses KEP-694\'s Freeze by name', () => {
  const sandbox = (strategy: unknown): unknown => ({
    apiVersion: 'agents.x-k8s.io/v1alpha1',
    kind: 'Sandbox',
    metadata: { name: 'a' },
    spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox' }] } }, suspensionStrategy: strategy },
  });
  validateObject(sandbox('Hibernate'));
  validateObject(sandbox('Stop'));
  for (const bad of ['Freeze', 'hibernate', 3]) {
    const err = (() => {
      try {
        validateObject(sandbox(bad));
        return undefined;
      } catch (e) {
        return e;
      }
    })();
    assert.ok(isAsbError(err, 'Invalid'), `${String(bad)} refused`);
    assert.match(err.message, /spec\.suspensionStrategy: must be one of Stop, Hibernate/);
  }
});

test('a SandboxSnapshot on a runtime that keeps none (the Kubernetes tier) fails at once, saying why; a sandbox from it reports the snapshot is not ready', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('plain', h.ns));
  const name = await claimReady(h, 'plain');
  await h.store.create<SandboxSnapshot>(SandboxSnapshotType, { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxSnapshot', metadata: { name: 'snap', namespace: h.ns }, spec: { sandboxRef: { name } } });
  const failed = await eventually('the snapshot failed', async () => {
    const s = await h.store.get<SandboxSnapshot>(SandboxSnapshotType, h.ns, 'snap');
    return s.status?.phase === 'Failed' ? s : undefined;
  });
  const ready = failed.status?.conditions?.find((c) => c.type === 'Ready');
  assert.equal(ready?.reason, 'NotSupported');
  assert.match(ready.message ?? '', /Kubernetes tier/);
  assert.equal((await get(h, name)).status?.phase, 'Running', 'the sandbox runs on');
  const sb = await get(h, name);
  await h.store.create<Sandbox>(SandboxType, { ...sb, metadata: { name: 'from-snap', namespace: h.ns, labels: sb.metadata.labels ?? {} }, spec: { ...sb.spec, snapshotRef: { name: 'snap' } }, status: {} });
  const refused = await eventually('the sandbox from it failed', async () => {
    const s = await get(h, 'from-snap');
    return s.status?.phase === 'Failed' ? s : undefined;
  });
  assert.equal(cond(refused, 'Ready')?.reason, 'SnapshotNotReady');
  assert.ok(!h.runtime.calls.some((c) => c.startsWith('start from-snap')), 'no pod was started for it');
});
