// The facts each change of an object tells (src/events/facts.ts), pinned without sockets: the
// failures a user must hear of (OOM kill, eviction for disk, an image that cannot be pulled, a
// memory checkpoint that did not come back), a warm claim, a fork, a snapshot, expiry under
// each policy, and a write that changes nothing of note telling nothing.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Condition } from '../src/api/meta.ts';
import type { Sandbox, SandboxClaim, SandboxSnapshot, SandboxStatus } from '../src/api/types.ts';
import { factsOf, summarize, type Fact, type Summary } from '../src/events/facts.ts';

const T0 = '2026-11-29T10:00:00.000Z';

function sandbox(opts: { owner?: string; pool?: string; running?: boolean; status?: SandboxStatus; deleting?: string; shutdownTime?: string; snapshot?: string; annotations?: Record<string, string> } = {}): Sandbox {
  return {
    apiVersion: 'agents.x-k8s.io/v1alpha1',
    kind: 'Sandbox',
    metadata: {
      name: 'sb1', namespace: 'default', uid: 'u1',
      labels: { ...(opts.owner === undefined ? {} : { 'asb.dev/owner': opts.owner }), ...(opts.pool === undefined ? {} : { 'agents.x-k8s.io/warm-pool-sandbox': opts.pool }), 'asb.dev/template': 'base' },
      ...(opts.annotations === undefined ? {} : { annotations: opts.annotations }),
      ...(opts.deleting === undefined ? {} : { deletionTimestamp: opts.deleting }),
    },
    spec: {
      podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox' }] } },
      operatingMode: opts.running === false ? 'Suspended' : 'Running',
      ...(opts.shutdownTime === undefined ? {} : { lifecycle: { shutdownTime: opts.shutdownTime, shutdownPolicy: 'Delete' } }),
      ...(opts.snapshot === undefined ? {} : { snapshotRef: { name: opts.snapshot } }),
    },
    ...(opts.status === undefined ? {} : { status: opts.status }),
  };
}

const ready = (status: Condition['status'], reason: string, message?: string): Condition => ({ type: 'Ready', status, reason, lastTransitionTime: T0, ...(message === undefined ? {} : { message }) });
const running: SandboxStatus = { phase: 'Running', readyTime: T0, conditions: [ready('True', 'DependenciesReady')] };
const subject = { kind: 'Sandbox' as const, name: 'sb1', namespace: 'default' };
const noSandbox = (): Summary | undefined => undefined;

function change(before: Sandbox | undefined, after: Sandbox | undefined): Fact[] {
  return factsOf(subject, before === undefined ? undefined : summarize('Sandbox', before), after === undefined ? undefined : summarize('Sandbox', after), noSandbox);
}

const said = (facts: Fact[]): string[] => facts.map((f) => `${f.type} ${f.reason} ${f.event ?? '-'}`);

test('failures are Warnings with their own types: OOM kill, eviction for disk, an image pull, a pod start, a memory restore', () => {
  const before = sandbox({ owner: 'a', status: running });
  assert.deepEqual(said(change(before, sandbox({ owner: 'a', status: { phase: 'Failed', conditions: [ready('False', 'OOMKilled', 'the kernel killed the pod: out of memory')] } }))), ['Warning SandboxOOMKilled sandbox.lifecycle.oom_killed']);
  assert.deepEqual(said(change(before, sandbox({ owner: 'a', status: { phase: 'Failed', conditions: [ready('False', 'Evicted', 'ephemeral storage over its limit')] } }))), ['Warning SandboxEvicted sandbox.lifecycle.evicted']);
  const pull = change(sandbox({ owner: 'a' }), sandbox({ owner: 'a', status: { phase: 'Pending', conditions: [ready('False', 'ErrImagePull', 'image "nope" cannot be pulled by the node: not found')] } }));
  assert.deepEqual(said(pull), ['Warning ImagePullFailed sandbox.lifecycle.pull_failed']);
  assert.match(pull[0]?.message ?? '', /image "nope" cannot be pulled/);
  assert.deepEqual(said(change(sandbox({ owner: 'a' }), sandbox({ owner: 'a', status: { phase: 'Pending', conditions: [ready('False', 'PodStartFailed', 'the pod could not be started: x')] } }))), ['Warning SandboxPodCreateFailed sandbox.lifecycle.start_failed']);
  const restoreFailed: SandboxStatus = { ...running, readyTime: '2026-11-29T10:05:00.000Z', conditions: [ready('True', 'DependenciesReady'), { type: 'MemoryRestored', status: 'False', reason: 'RestoreFailed', message: 'the checkpoint\'s pages.img is damaged', lastTransitionTime: T0 }] };
  assert.deepEqual(said(change(before, sandbox({ owner: 'a', status: restoreFailed }))), ['Normal SandboxReady sandbox.lifecycle.ready', 'Warning RestoreFailed sandbox.lifecycle.restore_failed']);
});

test('a warm member is told on its pool; its claim is the team\'s "created"; a fork says its snapshot', () => {
  const member = change(undefined, sandbox({ pool: 'base' }));
  assert.deepEqual(member.map((f) => `${f.involved.kind} ${f.reason} ${f.event ?? '-'}`), ['Sandbox SandboxCreated -', 'SandboxWarmPool SandboxCreated -']);
  const claimed = change(sandbox({ pool: 'base', status: running }), sandbox({ owner: 'a', status: running }));
  assert.deepEqual(said(claimed), ['Normal SandboxClaimed sandbox.lifecycle.created']);
  assert.deepEqual(claimed[0]?.data, { launchType: 'warm', pool: 'base' });
  assert.deepEqual(claimed.map((f) => f.team), ['a']);
  const fork = change(undefined, sandbox({ owner: 'a', snapshot: 'snap1' }));
  assert.deepEqual(said(fork), ['Normal SandboxCreated sandbox.lifecycle.created', 'Normal SandboxForked sandbox.lifecycle.forked']);
  const claim: SandboxClaim = { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxClaim', metadata: { name: 'c1', namespace: 'default', uid: 'c' }, spec: {}, status: { sandbox: { name: 'sb1' }, launchType: 'warm' } };
  const bound = factsOf({ kind: 'SandboxClaim', name: 'c1', namespace: 'default' }, summarize('SandboxClaim', { ...claim, status: {} }), summarize('SandboxClaim', claim), noSandbox);
  assert.deepEqual(bound.map((f) => `${f.involved.kind} ${f.reason} ${f.message}`), ['SandboxClaim SandboxClaimed bound sandbox sb1 (warm start)']);
});

test('a snapshot is told on its sandbox as E2B\'s checkpointed; a failed one as a Warning', () => {
  const snap = (phase: 'Pending' | 'Ready' | 'Failed'): SandboxSnapshot => ({ apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxSnapshot', metadata: { name: 's1', namespace: 'default', uid: 's', labels: { 'asb.dev/owner': 'a' } }, spec: { sandboxRef: { name: 'sb1' } }, status: { phase, memory: true } });
  const source = summarize('Sandbox', sandbox({ owner: 'a', status: running }));
  const taken = factsOf({ kind: 'SandboxSnapshot', name: 's1', namespace: 'default' }, summarize('SandboxSnapshot', snap('Pending')), summarize('SandboxSnapshot', snap('Ready')), () => source);
  assert.deepEqual(taken.map((f) => `${f.involved.kind}/${f.involved.name}/${f.involved.uid} ${f.reason} ${f.event ?? '-'}`), ['Sandbox/sb1/u1 SandboxSnapshotted sandbox.lifecycle.checkpointed']);
  assert.deepEqual(taken[0]?.data, { snapshot: 's1', memory: true });
  const failed = factsOf({ kind: 'SandboxSnapshot', name: 's1', namespace: 'default' }, summarize('SandboxSnapshot', snap('Pending')), summarize('SandboxSnapshot', snap('Failed')), () => source);
  assert.deepEqual(said(failed), ['Warning SnapshotFailed sandbox.lifecycle.snapshot_failed']);
});

test('expiry: Delete tells expired then killed; Retain tells expired and keeps the object; a plain delete is killed only', () => {
  const live = sandbox({ owner: 'a', status: running, shutdownTime: T0 });
  assert.deepEqual(said(change(live, sandbox({ owner: 'a', status: running, shutdownTime: T0, deleting: '2026-11-29T10:00:01.000Z' }))), ['Normal SandboxExpired sandbox.lifecycle.expired', 'Normal SandboxDeleted sandbox.lifecycle.killed']);
  assert.deepEqual(said(change(live, sandbox({ owner: 'a', shutdownTime: T0, status: { phase: 'Expired', conditions: [ready('False', 'SandboxExpired')] } }))), ['Normal SandboxExpired sandbox.lifecycle.expired']);
  assert.deepEqual(said(change(sandbox({ owner: 'a', status: running }), sandbox({ owner: 'a', status: running, deleting: T0 }))), ['Normal SandboxDeleted sandbox.lifecycle.killed']);
  // Gone without a deletionTimestamp seen (the recorder was down): still killed, once.
  assert.deepEqual(said(change(sandbox({ owner: 'a', status: running }), undefined)), ['Normal SandboxDeleted sandbox.lifecycle.killed']);
  assert.deepEqual(said(change(sandbox({ owner: 'a', status: running, deleting: T0 }), undefined)), []);
});

test('a pause says whether memory was kept; a resume says what woke it; an unchanged summary says nothing', () => {
  const paused = (reason: string): Sandbox => sandbox({ owner: 'a', running: false, status: { phase: 'Hibernated', conditions: [ready('False', 'SandboxSuspended'), { type: 'Suspended', status: 'True', reason, lastTransitionTime: T0 }] } });
  const kept = change(sandbox({ owner: 'a', running: false, status: running }), paused('MemoryKept'));
  assert.deepEqual(kept.map((f) => [f.event, f.data?.memory]), [['sandbox.lifecycle.paused', true]]);
  const files = change(sandbox({ owner: 'a', running: false, status: running }), paused('FilesKept'));
  assert.deepEqual(files.map((f) => [f.event, f.data?.memory]), [['sandbox.lifecycle.paused', false]]);
  const woke = change(paused('MemoryKept'), sandbox({ owner: 'a', status: paused('MemoryKept').status ?? {}, annotations: { 'asb.dev/wake-cause': JSON.stringify({ host: '3000-sb1.asb.localhost', path: '/' }) } }));
  assert.deepEqual(woke.map((f) => f.data), [{ trigger: 'request', host: '3000-sb1.asb.localhost', path: '/' }]);
  assert.deepEqual(change(sandbox({ owner: 'a', status: running }), sandbox({ owner: 'a', status: running, annotations: { 'asb.dev/last-activity': T0 } })), []);
});
