// Operator behaviour against the real SQLite store and the fake runtime (the shared suite in
// test/support/controller-suite.ts, which test/k8s/controllers.test.ts runs against a real
// kube-apiserver), plus the work queue under the controllers, which needs no store.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Registry } from 'prom-client';
import { AsbError, isAsbError } from '../src/errors.ts';
import { createMetrics } from '../src/metrics/metrics.ts';
import { Controller, type Reconciler } from '../src/operator/controller.ts';
import { failureEntered } from '../src/operator/sandbox-controller.ts';
import { systemClock } from '../src/base/clock.ts';
import { silentLogger } from '../src/base/log.ts';
import { operatorSuite } from './support/controller-suite.ts';
import { eventually, sqliteHarnessStore, startHarness, template, writeRival } from './support/operator-harness.ts';
import { holderAmong, NAME_CONFLICT } from '../src/api/sandbox-identity.ts';
import { SandboxTemplateType, SandboxType, type Sandbox, type SandboxPhase, type SandboxStatus } from '../src/api/types.ts';
import { within } from './support/wait.ts';

operatorSuite(sqliteHarnessStore);

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

test('the work queue runs a key ahead of a backlog of background keys, which never take more than their workers', async (t) => {
  const started: string[] = [];
  let release: () => void = () => undefined;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const c = new Controller({
    name: 'test',
    reconcile: async (key) => {
      started.push(key);
      if (key.startsWith('teardown-')) await gate;
      return undefined;
    },
    clock: systemClock,
    log: silentLogger(),
    metrics: createMetrics(new Registry()),
    workers: 8,
    background: (key) => key.startsWith('teardown-'),
    backgroundWorkers: 2,
  });
  t.after(() => {
    release();
    return c.close();
  });
  for (let i = 0; i < 50; i++) c.enqueue(`teardown-${i}`);
  c.enqueue('create');
  await eventually('the create ran', () => started.includes('create'));
  assert.deepEqual(started.filter((k) => k.startsWith('teardown-')), ['teardown-0', 'teardown-1'], 'two background workers, busy; the other 48 teardowns wait');
  release();
  await eventually('the backlog drained', () => c.depth === 0);
  assert.equal(started.length, 51, 'every teardown ran once');
});

// ---- teardowns and starts

test('a create starts while a bulk delete\'s teardowns are still running (a cold create never waits behind them)', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('py', h.ns));
  const doomed: string[] = [];
  for (let i = 0; i < 100; i++) doomed.push((await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'team' })).sandbox.metadata.name);
  await eventually('100 sandboxes ran', () => doomed.every((id) => h.runtime.state(id).phase === 'Running'));
  let release: () => void = () => undefined;
  h.runtime.removeGate = new Promise<void>((resolve) => (release = resolve));
  t.after(() => release());
  for (const id of doomed) await h.store.delete(SandboxType, h.ns, id);
  await eventually('teardowns under way', () => h.runtime.calls.some((c) => c.startsWith('remove ')));
  const created = (await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'team' })).sandbox.metadata.name;
  // Every teardown is stuck in remove(): on one FIFO queue the create would wait for all of them.
  const ready = await within('the new sandbox to be ready', h.op.claimer.waitReady(h.ns, created, 60_000), 5_000);
  assert.equal(ready.status?.phase, 'Running');
  const removing = h.runtime.calls.filter((c) => c.startsWith('remove ')).length;
  assert.ok(removing < doomed.length, `teardowns still wait (${removing} of ${doomed.length} began)`);
  release();
  await eventually('every deleted sandbox is gone', async () => (await h.store.list<Sandbox>(SandboxType, { namespace: h.ns })).items.length === 1);
});

// ---- waiting on a sandbox that failed

test('a wait for a sandbox that has already failed rejects at once, naming the reason and message', async (t) => {
  const h = await startHarness(t, { autoReady: false });
  await h.store.create(SandboxTemplateType, template('py', h.ns));
  const id = (await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'team' })).sandbox.metadata.name;
  await eventually('the pod started', () => h.runtime.state(id).phase === 'Pending');
  h.runtime.fail(id, 'the container exited with code 1');
  await eventually('the sandbox Failed', async () => (await h.store.get<Sandbox>(SandboxType, h.ns, id)).status?.phase === 'Failed');
  // The harness clock never reaches the wait's own timeout: only the failure can end it.
  await assert.rejects(within('the wait to end', h.op.claimer.waitReady(h.ns, id, 60_000), 5_000), (err: unknown) => {
    assert.ok(isAsbError(err, 'SandboxNotRunning'), String(err));
    assert.equal(err.message, `sandbox ${h.ns}/${id} is Failed: PodFailed: the container exited with code 1`);
    return true;
  });
});

// ---- who holds a sandbox id (src/api/sandbox-identity.ts), when two objects meet under one name

test('security probe C1: a rival stamped earlier than a running sandbox (API servers whose clocks differ) still never takes its pod', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('py', h.ns));
  const holder = (await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'victim' })).sandbox;
  const id = holder.metadata.name;
  await h.op.claimer.waitReady(h.ns, id, 5_000);
  // The store stamps creation with the harness clock: set back an hour, the rival is "older".
  h.clock.advance(-3_600_000);
  const rival = await writeRival(h, holder);
  assert.ok(Date.parse(rival.metadata.creationTimestamp ?? '') < Date.parse(holder.metadata.creationTimestamp ?? ''), 'the rival is stamped first');
  const kept = await h.store.get<Sandbox>(SandboxType, h.ns, id);
  assert.equal(kept.status?.phase, 'Running', 'the running sandbox keeps its id');
  assert.equal(h.runtime.state(id).uid, holder.metadata.uid);
  assert.ok(!h.runtime.calls.includes(`remove ${id}`), 'its pod was never removed');
});

test('the holder of an id: the pod\'s object first, then one not marked NameConflict, then the first created, then the smaller uid', () => {
  const at = (uid: string, created: string, conflicted = false): Sandbox => ({
    apiVersion: 'agents.x-k8s.io/v1alpha1',
    kind: 'Sandbox',
    metadata: { name: 'x', namespace: uid, uid, creationTimestamp: created },
    spec: { podTemplate: { spec: { containers: [] } } },
    ...(conflicted ? { status: { conditions: [{ type: 'Ready', status: 'False', reason: NAME_CONFLICT, lastTransitionTime: created }] } } : {}),
  });
  const early = at('b', '2026-11-24T10:00:00Z');
  const late = at('a', '2026-11-24T10:00:00.500Z');
  const tie = at('a', '2026-11-24T10:00:00Z');
  assert.equal(holderAmong([late, early])?.metadata.uid, 'b', 'created first, fractions compared as time');
  assert.equal(holderAmong([early, tie])?.metadata.uid, 'a', 'a tie on the second: the smaller uid');
  assert.equal(holderAmong([early, tie], 'b')?.metadata.uid, 'b', 'the object whose pod the runtime has, whatever the rest says');
  assert.equal(holderAmong([at('b', '2026-11-24T10:00:00Z'), at('a', '2026-11-24T10:00:00Z', true)])?.metadata.uid, 'b', 'one its controller marked NameConflict holds nothing');
  assert.equal(holderAmong([]), undefined);
});

// ---- what an operator pages on: sandboxes entering a failure, counted once by reason

test('a sandbox entering a failure is counted once by its reason (asb_sandbox_failures_total); waits and pauses are not failures', async (t) => {
  const h = await startHarness(t, { autoReady: false });
  await h.store.create(SandboxTemplateType, template('py', h.ns));
  const failing = (await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'team' })).sandbox.metadata.name;
  await eventually('the pod started', () => h.runtime.state(failing).phase === 'Pending');
  h.runtime.fail(failing, 'the container exited with code 1');
  await eventually('the sandbox Failed', async () => (await h.store.get<Sandbox>(SandboxType, h.ns, failing)).status?.phase === 'Failed');
  const pending = (await h.op.claimer.claim({ namespace: h.ns, template: 'py', owner: 'team' })).sandbox.metadata.name;
  await eventually('the second pod started', () => h.runtime.state(pending).phase === 'Pending');
  const failures = async (): Promise<Record<string, number>> => Object.fromEntries((await h.metrics.sandboxFailuresTotal.get()).values.filter((v) => v.value > 0).map((v) => [String(v.labels.reason), v.value]));
  assert.deepEqual(await failures(), { PodFailed: 1 }, 'the failed pod once; the one still starting is no failure');

  const ready = (reason: string, phase: SandboxPhase): SandboxStatus => ({ phase, conditions: [{ type: 'Ready', status: 'False', reason, lastTransitionTime: '2026-11-29T00:00:00Z' }] });
  assert.equal(failureEntered(ready('DependenciesNotReady', 'Pending'), ready('PodStartFailed', 'Pending')), 'PodStartFailed');
  assert.equal(failureEntered(ready('PodStartFailed', 'Pending'), ready('PodStartFailed', 'Pending')), undefined, 'a retry that fails the same way is the same failure');
  assert.equal(failureEntered(undefined, ready('SnapshotNotReady', 'Pending')), undefined, 'a snapshot still being taken is a wait');
  assert.equal(failureEntered(undefined, ready('SnapshotNotReady', 'Failed')), 'SnapshotNotReady');
  for (const wait of ['SandboxSuspended', 'SandboxExpired', 'DependenciesNotReady']) assert.equal(failureEntered(undefined, ready(wait, 'Pending')), undefined, wait);
});
