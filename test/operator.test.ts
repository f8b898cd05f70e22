// Operator behaviour against the real SQLite store and the fake runtime (the shared suite in
// test/support/controller-suite.ts, which test/k8s/controllers.test.ts runs against a real
// kube-apiserver), plus the work queue under the controllers, which needs no store.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Registry } from 'prom-client';
import { AsbError } from '../src/errors.ts';
import { createMetrics } from '../src/metrics/metrics.ts';
import { Controller, type Reconciler } from '../src/operator/controller.ts';
import { systemClock } from '../src/system/clock.ts';
import { silentLogger } from '../src/system/log.ts';
import { operatorSuite } from './support/controller-suite.ts';
import { eventually, sqliteHarnessStore } from './support/operator-harness.ts';

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
