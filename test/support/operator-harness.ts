// Shared fixture for operator and claim tests (test/support/controller-suite.ts): a store (by
// default a real SQLite store in a temp dir; test/k8s/ passes a kube store on a real
// kube-apiserver), the fake runtime, a fresh metrics registry, and a clock the test can move
// forward.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';
import { Registry } from 'prom-client';
import { apiVersionOf } from '../../src/api/meta.ts';
import { NAME_CONFLICT } from '../../src/api/sandbox-identity.ts';
import { LABEL, SandboxTemplateType, SandboxType, SandboxWarmPoolType, type Sandbox, type SandboxTemplate, type SandboxWarmPool } from '../../src/api/types.ts';
import { createMetrics, type Metrics } from '../../src/metrics/metrics.ts';
import { startOperator, type Operator } from '../../src/operator/operator.ts';
import { openSqliteStore } from '../../src/store/sqlite.ts';
import type { ObjectStore } from '../../src/store/store.ts';
import type { Clock, Timer } from '../../src/base/clock.ts';
import { silentLogger } from '../../src/base/log.ts';
import { FakeRuntime } from './fake-runtime.ts';

/**
 * Real time plus an offset the test advances. Short timers (backoff, 5 ms) fire on their own in
 * real time; advance(ms) jumps the clock and fires every timer that is now due, so a 60 s idle
 * timeout or shutdownTime is reached without waiting.
 */
export class ManualClock implements Clock {
  #offset = 0;
  #timers = new Set<{ due: number; fire: () => void }>();

  now(): number {
    return Date.now() + this.#offset;
  }

  after(ms: number, fn: () => void): Timer {
    let done = false;
    const entry = {
      due: this.now() + ms,
      fire: () => {
        if (done) return;
        done = true;
        clearTimeout(handle);
        this.#timers.delete(entry);
        fn();
      },
    };
    const handle = setTimeout(entry.fire, ms);
    handle.unref();
    this.#timers.add(entry);
    return {
      cancel: () => {
        done = true;
        clearTimeout(handle);
        this.#timers.delete(entry);
      },
    };
  }

  advance(ms: number): void {
    this.#offset += ms;
    const now = this.now();
    for (const entry of [...this.#timers]) if (entry.due <= now) entry.fire();
  }
}

export interface Harness {
  store: ObjectStore;
  /** The namespace this test's objects live in. */
  ns: string;
  /** A second namespace of this test's (objects that meet the first's under one name). */
  otherNs: string;
  runtime: FakeRuntime;
  metrics: Metrics;
  registry: Registry;
  clock: ManualClock;
  op: Operator;
  /** Starts a second operator on the same store and runtime (after op.close()): a restart. */
  restart(): Promise<Operator>;
}

/** The SQLite store's namespace: each test has a store of its own. */
const NS = 'default';
export const CLUSTER_TAG = 'tst1';

/** One test's store: empty, with a namespace of its own. */
export interface HarnessStore {
  store: ObjectStore;
  ns: string;
  otherNs: string;
  /** Called after the test's operators have stopped: empties and closes the store. */
  dispose: () => Promise<void>;
}

/** Opens a store for one test; `clock` is the test's clock (the SQLite store stamps times with it). */
export type HarnessStoreFactory = (clock: ManualClock) => Promise<HarnessStore>;

export interface HarnessOptions {
  autoReady?: boolean;
  notReadyReplaceMs?: number;
}

export const sqliteHarnessStore: HarnessStoreFactory = async (clock) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-operator-'));
  const store = await openSqliteStore({ path: join(dir, 'store.db'), clock });
  return {
    store,
    ns: NS,
    otherNs: 'other',
    dispose: async () => {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
};

export async function startHarness(t: TestContext, opts: HarnessOptions = {}, openStore: HarnessStoreFactory = sqliteHarnessStore): Promise<Harness> {
  const clock = new ManualClock();
  const { store, ns, otherNs, dispose } = await openStore(clock);
  const runtime = new FakeRuntime({ autoReady: opts.autoReady ?? true });
  const registry = new Registry();
  const metrics = createMetrics(registry);
  const operators: Operator[] = [];
  // One hook, in this order: the operators stop before the store is emptied under them.
  t.after(async () => {
    for (const o of operators) await o.close();
    await dispose();
  });
  const start = async (): Promise<Operator> => {
    const op = await startOperator({
      store,
      runtime,
      log: silentLogger(),
      metrics,
      clock,
      clusterTag: CLUSTER_TAG,
      ...(opts.notReadyReplaceMs === undefined ? {} : { notReadyReplaceMs: opts.notReadyReplaceMs }),
    });
    operators.push(op);
    await op.ready();
    return op;
  };
  const op = await start();
  return { store, ns, otherNs, runtime, metrics, registry, clock, op, restart: start };
}

/** Polls until check() returns a value other than undefined/false; fails after timeoutMs. */
export async function eventually<T>(what: string, check: () => T | undefined | false | Promise<T | undefined | false>, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** A template in `namespace`: each test's own (Harness.ns), never a default a kube test would share. */
export function template(name: string, namespace: string, extra: Partial<SandboxTemplate['spec']> = {}): SandboxTemplate {
  return {
    apiVersion: apiVersionOf(SandboxTemplateType),
    kind: 'SandboxTemplate',
    metadata: { name, namespace },
    spec: {
      podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox', command: ['sleep', 'infinity'] }] } },
      volumeClaimTemplates: [{ metadata: { name: 'work' }, spec: { resources: { requests: { storage: '1Gi' } } } }],
      ...extra,
    },
  };
}

export function warmPool(name: string, templateName: string, replicas: number, namespace: string): SandboxWarmPool {
  return {
    apiVersion: apiVersionOf(SandboxWarmPoolType),
    kind: 'SandboxWarmPool',
    metadata: { name, namespace },
    spec: { replicas, sandboxTemplateRef: { name: templateName } },
  };
}

/**
 * Writes a Sandbox named like `holder` into the test's other namespace, as kubectl or a second API
 * replica could (past the API's id check), and resolves once its controller has marked it
 * NameConflict: the rival of security probe C1.
 */
export async function writeRival(h: Harness, holder: Sandbox): Promise<Sandbox> {
  const id = holder.metadata.name;
  await h.store.create(SandboxType, {
    apiVersion: 'agents.x-k8s.io/v1alpha1',
    kind: 'Sandbox',
    metadata: { name: id, namespace: h.otherNs, labels: { [LABEL.owner]: 'attacker' } },
    spec: { podTemplate: holder.spec.podTemplate },
  });
  return eventually('the rival to report NameConflict', async () => {
    const s = await h.store.tryGet<Sandbox>(SandboxType, h.otherNs, id);
    return s?.status?.conditions?.some((c) => c.reason === NAME_CONFLICT) === true ? s : undefined;
  });
}
