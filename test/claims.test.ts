// The claim hot path (Claimer) and SandboxClaim objects, against the real SQLite store and the
// fake runtime.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { apiVersionOf } from '../src/api/meta.ts';
import {
  ANNOTATION,
  LABEL,
  SandboxClaimType,
  SandboxTemplateType,
  SandboxType,
  SandboxWarmPoolType,
  type Sandbox,
  type SandboxClaim,
  type SandboxWarmPool,
} from '../src/api/types.ts';
import { isAsbError } from '../src/errors.ts';
import type { ClaimResult } from '../src/operator/claimer.ts';
import type { ObjectStore } from '../src/store/store.ts';
import { NS, eventually, startHarness, template, warmPool, type Harness } from './support/operator-harness.ts';

async function fillPool(h: Harness, name: string, replicas: number): Promise<void> {
  await h.store.create(SandboxTemplateType, template('py'));
  await h.store.create(SandboxWarmPoolType, warmPool(name, 'py', replicas));
  await eventually(`pool ${name} ready`, async () => {
    const pool = await h.store.get<SandboxWarmPool>(SandboxWarmPoolType, NS, name);
    return pool.status?.readyReplicas === replicas && h.op.claimer.available(NS, name) === replicas;
  }, 30_000);
}

function claimObject(name: string, spec: SandboxClaim['spec']): SandboxClaim {
  return { apiVersion: apiVersionOf(SandboxClaimType), kind: 'SandboxClaim', metadata: { name, namespace: NS }, spec };
}

async function claimStatus(store: ObjectStore, name: string): Promise<SandboxClaim | undefined> {
  const c = await store.tryGet<SandboxClaim>(SandboxClaimType, NS, name);
  return c?.status?.conditions?.find((x) => x.type === 'Ready')?.status === 'True' ? c : undefined;
}

test('a claim with no warm member cold-starts from the template and says so', async (t) => {
  const h = await startHarness(t);
  await h.store.create(SandboxTemplateType, template('py'));
  const { sandbox, launch } = await h.op.claimer.claim({ namespace: NS, template: 'py', owner: 'team-a', labels: { app: 'demo' } });
  assert.equal(launch, 'cold');
  assert.match(sandbox.metadata.name, /^tst1[a-z0-9]{16}$/);
  assert.equal(sandbox.metadata.labels?.[LABEL.launchType], 'cold');
  assert.equal(sandbox.metadata.labels[LABEL.owner], 'team-a');
  assert.equal(sandbox.metadata.labels.app, 'demo');
  const ready = await h.op.claimer.waitReady(NS, sandbox.metadata.name, 5_000);
  assert.equal(ready.status?.phase, 'Running');
  assert.match(await h.registry.getSingleMetricAsString('asb_claims_total'), /launch="cold",result="bound"} 1/);
});

test('a claim naming an unknown template fails with NotFound; reserved labels are refused', async (t) => {
  const h = await startHarness(t);
  await assert.rejects(h.op.claimer.claim({ namespace: NS, template: 'nope', owner: 'a' }), (err) => isAsbError(err, 'NotFound'));
  await h.store.create(SandboxTemplateType, template('py'));
  await assert.rejects(
    h.op.claimer.claim({ namespace: NS, template: 'py', owner: 'a', labels: { [LABEL.owner]: 'someone-else' } }),
    (err) => isAsbError(err, 'Invalid'),
  );
});

test('500 concurrent claims against a 200-member pool: 200 warm, 300 cold, no member bound twice', async (t) => {
  const h = await startHarness(t);
  await fillPool(h, 'big', 200);
  const warmNames = new Set((await h.store.list<Sandbox>(SandboxType, { labelSelector: `${LABEL.pool}=big` })).items.map((s) => s.metadata.name));
  // Refills from here on stay Pending, so only the 200 members above can be claimed warm.
  h.runtime.autoReady = false;

  const results = await Promise.all(Array.from({ length: 500 }, (_, i) => h.op.claimer.claim({ namespace: NS, pool: 'big', owner: `team-${i % 7}` })));
  const warm = results.filter((r) => r.launch === 'warm');
  const cold = results.filter((r) => r.launch === 'cold');
  assert.equal(warm.length, 200);
  assert.equal(cold.length, 300);
  const names = results.map((r) => r.sandbox.metadata.name);
  assert.equal(new Set(names).size, 500, 'every claim got its own sandbox');
  assert.ok(warm.every((r) => warmNames.has(r.sandbox.metadata.name)), 'warm claims got pool members');

  // The store agrees: each bound sandbox carries the owner of exactly the claim that got it.
  for (const [i, r] of results.entries()) {
    const stored = await h.store.get<Sandbox>(SandboxType, NS, r.sandbox.metadata.name);
    assert.equal(stored.metadata.labels?.[LABEL.owner], `team-${i % 7}`);
  }
});

test('with coldStart false an exhausted pool answers PoolExhausted', async (t) => {
  const h = await startHarness(t);
  await fillPool(h, 'small', 20);
  h.runtime.autoReady = false;
  const settled = await Promise.allSettled(Array.from({ length: 50 }, () => h.op.claimer.claim({ namespace: NS, pool: 'small', owner: 'a', coldStart: false })));
  const bound = settled.filter((s): s is PromiseFulfilledResult<ClaimResult> => s.status === 'fulfilled');
  const refused = settled.filter((s) => s.status === 'rejected' && isAsbError(s.reason, 'PoolExhausted'));
  assert.equal(bound.length, 20);
  assert.equal(refused.length, 30);
  assert.equal(new Set(bound.map((b) => b.value.sandbox.metadata.name)).size, 20);
  assert.ok(bound.every((b) => b.value.launch === 'warm'));
});

test('waitReady times out with Timeout for a sandbox that never becomes ready, and resolves when it does', async (t) => {
  const h = await startHarness(t, { autoReady: false });
  await h.store.create(SandboxTemplateType, template('py'));
  const { sandbox } = await h.op.claimer.claim({ namespace: NS, template: 'py', owner: 'a' });
  const name = sandbox.metadata.name;
  const waiting = h.op.claimer.waitReady(NS, name, 60_000);
  await assert.rejects(
    (async () => {
      const w = h.op.claimer.waitReady(NS, name, 30_000);
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
  const h = await startHarness(t);
  await fillPool(h, 'py-pool', 2);
  await h.store.create(SandboxClaimType, claimObject('c1', { warmPoolRef: { name: 'py-pool' }, lifecycle: { shutdownTime: '2999-01-01T00:00:00Z' } }));
  await h.store.create(SandboxClaimType, claimObject('c2', { sandboxTemplateRef: { name: 'py' }, warmpool: 'none' }));

  const c1 = await eventually('c1 ready', () => claimStatus(h.store, 'c1'));
  const name1 = c1.status?.sandbox?.name ?? '';
  assert.equal(c1.metadata.annotations?.[ANNOTATION.sandboxName], name1);
  assert.equal(c1.status?.launchType, 'warm');
  const sb1 = await h.store.get<Sandbox>(SandboxType, NS, name1);
  assert.equal(sb1.metadata.labels?.[LABEL.claimUid], c1.metadata.uid);
  assert.equal(sb1.metadata.ownerReferences?.find((o) => o.kind === 'SandboxClaim')?.name, 'c1');
  assert.equal(sb1.spec.lifecycle?.shutdownTime, '2999-01-01T00:00:00Z');

  const c2 = await eventually('c2 ready', () => claimStatus(h.store, 'c2'));
  assert.equal(c2.status?.launchType, 'cold', 'warmpool: none cold-starts');

  await h.store.delete(SandboxClaimType, NS, 'c1');
  await eventually('claimed sandbox deleted with its claim', async () => (await h.store.tryGet(SandboxType, NS, name1)) === undefined);
  assert.equal(h.runtime.state(name1).phase, 'Absent');
  assert.ok(await h.store.tryGet(SandboxType, NS, c2.status.sandbox?.name ?? ''), "the other claim's sandbox stays");
});

test('after an operator restart claims keep their sandbox and nothing is bound twice', async (t) => {
  const h = await startHarness(t);
  await fillPool(h, 'py-pool', 3);
  for (const n of ['a', 'b', 'c', 'd']) await h.store.create(SandboxClaimType, claimObject(n, { warmPoolRef: { name: 'py-pool' } }));
  const before = new Map<string, string>();
  for (const n of ['a', 'b', 'c', 'd']) {
    const c = await eventually(`claim ${n} ready`, () => claimStatus(h.store, n));
    before.set(n, c.status?.sandbox?.name ?? '');
  }
  await h.op.close();

  const op2 = await h.restart();
  await eventually('restarted operator settled', async () => {
    const pool = await h.store.get<SandboxWarmPool>(SandboxWarmPoolType, NS, 'py-pool');
    return op2.depth() === 0 && pool.status?.readyReplicas === 3;
  });
  for (const n of ['a', 'b', 'c', 'd']) {
    const c = await h.store.get<SandboxClaim>(SandboxClaimType, NS, n);
    assert.equal(c.status?.sandbox?.name, before.get(n), `claim ${n} kept its sandbox`);
    const bound = (await h.store.list<Sandbox>(SandboxType, { labelSelector: `${LABEL.claimUid}=${c.metadata.uid ?? ''}` })).items;
    assert.equal(bound.length, 1, `claim ${n} has exactly one sandbox`);
  }
});
