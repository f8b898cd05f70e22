// Lifecycle events on the Kubernetes tier: the recorder writes core/v1 Events to the real
// kube-apiserver, where the real kubectl reads them as it reads the kubelet's (`describe
// sandbox`, `get events`), aggregated as client-go's recorder aggregates (count, last seen).
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { SandboxType, type Sandbox } from '../../src/api/types.ts';
import { EventLog } from '../../src/events/event-log.ts';
import { startLifecycleEvents } from '../../src/events/lifecycle-events.ts';
import { systemClock } from '../../src/base/clock.ts';
import { silentLogger } from '../../src/base/log.ts';
import { kubeStoreTier } from '../support/kube-store.ts';
import { eventually, startHarness } from '../support/operator-harness.ts';

const tier = kubeStoreTier();

test('Events of a sandbox\'s life are written to the API server: kubectl describe and get events show them', async (t) => {
  const h = await startHarness(t, {}, (clock) => tier.fx.harnessStore(clock));
  const dir = await mkdtemp(join(tmpdir(), 'asb-k8s-events-'));
  const log = new EventLog({ dir });
  const events = await startLifecycleEvents({ store: h.store, log: silentLogger(), clock: systemClock, events: log, instance: 'tst1' });
  t.after(async () => {
    await events.close();
    log.close();
    await rm(dir, { recursive: true, force: true });
  });
  const sandbox: Sandbox = {
    apiVersion: 'agents.x-k8s.io/v1alpha1', kind: 'Sandbox',
    metadata: { name: 'evsb1', namespace: h.ns, labels: { 'asb.dev/owner': 'team-a' } },
    spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox', command: ['sleep', 'infinity'] }] } }, operatingMode: 'Running' },
  };
  await h.store.create<Sandbox>(SandboxType, sandbox);
  await eventually('ready', async () => (await h.store.get<Sandbox>(SandboxType, h.ns, 'evsb1')).status?.phase === 'Running');
  const got = await h.store.get<Sandbox>(SandboxType, h.ns, 'evsb1');
  await h.store.update<Sandbox>(SandboxType, { ...got, spec: { ...got.spec, operatingMode: 'Suspended' } });
  await eventually('hibernated', async () => (await h.store.get<Sandbox>(SandboxType, h.ns, 'evsb1')).status?.phase === 'Hibernated');
  await events.recorder.settled();

  const described = await eventually('describe shows the suspension', async () => {
    const out = await tier.kube.kubectl(['describe', 'sandbox', 'evsb1', '-n', h.ns]);
    return /SandboxSuspended/.test(out) ? out : undefined;
  }, 20_000);
  const section = described.slice(described.indexOf('Events:'));
  assert.match(section, /Normal\s+SandboxCreated\s+\S+\s+agent-sandbox-controller\s+sandbox created/);
  assert.match(section, /Normal\s+SandboxReady\s+\S+\s+agent-sandbox-controller\s+pod is ready/);
  assert.match(section, /Normal\s+SandboxSuspended\s+\S+\s+agent-sandbox-controller\s+files and volumes kept/);
  const listed = await tier.kube.kubectl(['get', 'events', '-n', h.ns]);
  assert.match(listed, /Normal\s+SandboxReady\s+sandbox\/evsb1\s+pod is ready/);
  assert.equal(events.recorder.kubeWriteFailures, 0);

  // Resumed and ready again: the one SandboxReady Event counts twice.
  const paused = await h.store.get<Sandbox>(SandboxType, h.ns, 'evsb1');
  await h.store.update<Sandbox>(SandboxType, { ...paused, spec: { ...paused.spec, operatingMode: 'Running' } });
  const count = await eventually('SandboxReady counted twice', async () => {
    const out = await tier.kube.kubectl(['get', 'events', '-n', h.ns, '--field-selector', 'reason=SandboxReady,involvedObject.name=evsb1', '-o', 'jsonpath={.items[*].count}']);
    return out.trim() === '2' ? out : undefined;
  }, 20_000);
  assert.equal(count.trim(), '2');
});
