// Lifecycle events from real sandboxes: a worker process with the SQLite store and the local
// runtime running real runc containers (bridge asbvev1, subnet 10.145.0.0/16). A warm claim, a
// pause and a resume, a snapshot and a sandbox started from it, a delete; a pod the kernel's OOM killer ends; a pod evicted for its disk; an
// image the registry does not have; each told on the events API and as a Kubernetes Event, and the worker killed with -9 and
// started again on its data directory keeps every event and tells nothing twice.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { KubeEvent } from '../src/api/event.ts';
import { baseTemplate } from '../src/api/builtin.ts';
import type { SandboxTemplate } from '../src/api/types.ts';
import type { LifecycleEvent } from '../src/events/event-log.ts';
import { waitFor } from './support/wait.ts';
import { api, removeDataDir, startWorkerProcess, type View, type WorkerProcess } from './support/worker-process.ts';

function template(name: string, edit: (t: SandboxTemplate) => void): SandboxTemplate {
  const t = baseTemplate();
  t.metadata.name = name;
  edit(t);
  return t;
}

async function eventsOf(w: WorkerProcess, id: string): Promise<LifecycleEvent[]> {
  const res = await api<LifecycleEvent[]>(w, 'GET', `/v1/events/sandboxes/${id}?orderAsc=true&limit=100`);
  return res.status === 200 ? res.body : [];
}

async function waitForType(w: WorkerProcess, id: string, type: string): Promise<LifecycleEvent[]> {
  return waitFor(`${type} of ${id}`, async () => {
    const events = await eventsOf(w, id);
    return events.some((e) => e.type === type) ? events : undefined;
  }, 120_000, 200);
}

async function kubeEvents(w: WorkerProcess, id: string): Promise<KubeEvent[]> {
  const res = await fetch(`${w.apiUrl}/api/v1/namespaces/default/events?fieldSelector=involvedObject.name=${id}`, { headers: { authorization: `Bearer ${w.adminKey}` } });
  assert.equal(res.status, 200);
  return ((await res.json()) as { items: KubeEvent[] }).items;
}

test('real sandboxes: a warm claim\'s life with a snapshot and a sandbox started from it, an OOM kill, an eviction for disk and a failed pull are told on the events API and as Kubernetes Events, and survive kill -9 of the worker', { timeout: 600_000 }, async (t) => {
  let w = await startWorkerProcess({ clusterTag: 'vev1', subnetOctet: 145, basePool: 1 });
  const dataDir = w.dataDir;
  t.after(async () => {
    await w.stop();
    removeDataDir(dataDir);
  });
  const applied = await api(w, 'POST', '/v1/apply', {
    objects: [
      // The main process itself outgrows a 24 MiB limit: the kernel kills it, and the pod with it.
      template('oomer', (tt) => {
        const main = tt.spec.podTemplate.spec.containers[0];
        if (main === undefined) throw new Error('base template has no container');
        main.command = ['sh', '-c', 'x=aaaaaaaaaaaaaaaa; while true; do x="$x$x"; done'];
        main.resources = { limits: { memory: '24Mi' } };
      }),
      // The main process prints without end: the log fills its 32 MiB of ephemeral storage and the pod is evicted.
      template('filler', (tt) => {
        const main = tt.spec.podTemplate.spec.containers[0];
        if (main === undefined) throw new Error('base template has no container');
        main.command = ['sh', '-c', 'head -c 200000000 /dev/zero; sleep infinity'];
        main.resources = { limits: { 'ephemeral-storage': '32Mi' } };
      }),
      // An image the registry does not have.
      template('nopull', (tt) => {
        const main = tt.spec.podTemplate.spec.containers[0];
        if (main === undefined) throw new Error('base template has no container');
        main.image = 'python:3.12';
      }),
    ],
  });
  assert.equal(applied.status, 200, JSON.stringify(applied.body));

  // A warm claim: the team's "created" says warm; pause, resume and delete follow.
  await waitFor('a ready warm member', async () => {
    const res = await fetch(`${w.apiUrl}/apis/extensions.agents.x-k8s.io/v1alpha1/namespaces/default/sandboxwarmpools/base`, { headers: { authorization: `Bearer ${w.adminKey}` } });
    const pool = (await res.json()) as { status?: { readyReplicas?: number } };
    return (pool.status?.readyReplicas ?? 0) >= 1 ? true : undefined;
  }, 120_000, 200);
  const claimed = await api<View>(w, 'POST', '/v1/sandboxes', { template: 'base' });
  assert.equal(claimed.status, 201, JSON.stringify(claimed.body));
  const id = claimed.body.id;
  assert.equal(claimed.body.launchType, 'warm');
  assert.equal((await api(w, 'POST', `/v1/sandboxes/${id}/pause`)).status, 200);
  await waitForType(w, id, 'sandbox.lifecycle.paused');
  assert.equal((await api(w, 'POST', `/v1/sandboxes/${id}/resume`, { wait: true })).status, 200);
  await waitForType(w, id, 'sandbox.lifecycle.ready');
  // A snapshot (files only: this runc sandbox keeps no memory, so fork ×N, which needs memory,
  // is refused), then a sandbox started from it.
  const snap = await api<{ id: string }>(w, 'POST', `/v1/sandboxes/${id}/snapshots`, { name: 'keep1', memory: false });
  assert.equal(snap.status, 201, JSON.stringify(snap.body));
  const started = await api<View>(w, 'POST', `/v1/snapshots/${snap.body.id}/sandboxes`, { wait: false });
  assert.equal(started.status, 201, JSON.stringify(started.body));
  const forkId = started.body.id;
  const forkEvents = await waitForType(w, forkId, 'sandbox.lifecycle.ready');
  assert.deepEqual(forkEvents.map((e) => e.type), ['sandbox.lifecycle.created', 'sandbox.lifecycle.forked', 'sandbox.lifecycle.ready']);
  assert.equal(forkEvents[1]?.eventData?.snapshot, snap.body.id);

  const oom = await api<View>(w, 'POST', '/v1/sandboxes', { template: 'oomer', wait: false });
  assert.equal(oom.status, 201, JSON.stringify(oom.body));
  const bad = await api<View>(w, 'POST', '/v1/sandboxes', { template: 'nopull', wait: false });
  assert.equal(bad.status, 201, JSON.stringify(bad.body));
  const full = await api<View>(w, 'POST', '/v1/sandboxes', { template: 'filler', wait: false });
  assert.equal(full.status, 201, JSON.stringify(full.body));
  const oomEvents = await waitForType(w, oom.body.id, 'sandbox.lifecycle.oom_killed');
  const evicted = await waitForType(w, full.body.id, 'sandbox.lifecycle.evicted');
  assert.equal(evicted.find((e) => e.type === 'sandbox.lifecycle.evicted')?.eventData?.message, 'Pod ephemeral local storage usage exceeds the total limit of containers 32Mi.');
  const pullEvents = await waitForType(w, bad.body.id, 'sandbox.lifecycle.pull_failed');
  assert.match(String(pullEvents.find((e) => e.type === 'sandbox.lifecycle.pull_failed')?.eventData?.message), /python:3\.12/);

  // kill -9 mid-life, then the same data directory: the log is whole and nothing is told twice.
  const before = await eventsOf(w, id);
  w.proc.kill('SIGKILL');
  await w.exited;
  w = await startWorkerProcess({ clusterTag: 'vev1', subnetOctet: 145, basePool: 1, dataDir });
  assert.deepEqual((await eventsOf(w, id)).map((e) => e.id), before.map((e) => e.id));
  assert.equal((await api(w, 'DELETE', `/v1/sandboxes/${id}`)).status, 202);
  const life = await waitForType(w, id, 'sandbox.lifecycle.killed');
  assert.deepEqual(life.map((e) => e.type), ['sandbox.lifecycle.created', 'sandbox.lifecycle.paused', 'sandbox.lifecycle.resumed', 'sandbox.lifecycle.ready', 'sandbox.lifecycle.checkpointed', 'sandbox.lifecycle.killed']);
  assert.deepEqual([life[4]?.eventData?.memory, life[4]?.eventData?.snapshot], [false, snap.body.id]);
  assert.equal(life[0]?.eventData?.launchType, 'warm');
  assert.equal(life[1]?.eventData?.memory, false);
  // The OOM-killed sandbox's events are all still there. (Its pod may start again after the
  // worker's restart, which the runtime does for a pod it finds gone: that is told as a new ready.)
  const oomAfter = await eventsOf(w, oom.body.id);
  assert.deepEqual(oomAfter.slice(0, oomEvents.length).map((e) => e.id), oomEvents.map((e) => e.id), JSON.stringify(oomAfter.map((e) => [e.type, e.eventData?.reason])));

  // The same facts as Kubernetes Events on the sandboxes.
  const oomKube = await kubeEvents(w, oom.body.id);
  assert.ok(oomKube.some((e) => e.type === 'Warning' && e.reason === 'SandboxOOMKilled'), JSON.stringify(oomKube));
  const pullKube = await kubeEvents(w, bad.body.id);
  assert.ok(pullKube.some((e) => e.type === 'Warning' && e.reason === 'ImagePullFailed' && e.message.includes('python:3.12')), JSON.stringify(pullKube));
  // Kubernetes Events are written a moment after the change that made them.
  const wanted = ['SandboxClaimed', 'SandboxSuspended', 'SandboxResumed', 'SandboxReady', 'SandboxSnapshotted', 'SandboxDeleted'];
  const lifeKube = await waitFor('the life as Kubernetes Events', async () => {
    const reasons = (await kubeEvents(w, id)).map((e) => e.reason);
    return wanted.every((r) => reasons.includes(r)) ? reasons : undefined;
  }, 20_000);
  for (const reason of wanted) assert.ok(lifeKube.includes(reason), `${reason} in ${lifeKube.join(', ')}`);
});
