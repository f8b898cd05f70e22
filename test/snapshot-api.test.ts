// Snapshots and fork through the API, on the whole local system with a gVisor template: a team
// snapshots a sandbox whose server holds its state in memory, starts new sandboxes from the
// snapshot and forks the sandbox ×3; each goes on from the snapshot's memory and is a sandbox of
// its own. Another team sees none of it. kubectl's API shows the SandboxSnapshot object.
// Its own system (bridge from tag snap, subnet 10.29.0.0/16).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { baseTemplate } from '../src/api/builtin.ts';
import type { SandboxTemplate } from '../src/api/types.ts';
import { startTestSystem } from './support/local-system.ts';
import { api, type ExecOut } from './support/worker-process.ts';
import { counterApp } from './support/counter-app.ts';

const COUNTER = counterApp(8080);

function counterTemplate(name: string, gvisor: boolean): SandboxTemplate {
  const t = baseTemplate();
  const main = t.spec.podTemplate.spec.containers[0];
  assert.ok(main !== undefined);
  main.command = ['python3', '-c', COUNTER];
  main.ports = [{ containerPort: 8080 }];
  main.readinessProbe = { tcpSocket: { port: 8080 }, periodSeconds: 1 };
  if (gvisor) t.spec.podTemplate.spec.runtimeClassName = 'gvisor';
  t.metadata.name = name;
  return t;
}

interface View { id: string; phase: string; ready: boolean }
interface SnapView { id: string; name?: string; sandbox: string; phase: string; memory: boolean; bytes?: number; memoryBytes?: number; message?: string }

test('snapshots and fork through the API: memory carried into new sandboxes, each its own; another team sees nothing', async (t) => {
  const system = await startTestSystem('snap', 29, 'local', 0, false, ['snap-team-a', 'snap-team-b']);
  t.after(() => system.cleanup());
  const keyA = system.teamKeys['snap-team-a'] ?? '';
  const keyB = system.teamKeys['snap-team-b'] ?? '';
  const applied = await api(system, 'POST', '/v1/apply', { objects: [counterTemplate('gvc', true), counterTemplate('rcc', false)] });
  assert.equal(applied.status, 200, JSON.stringify(applied.body));

  const counter = async (id: string): Promise<string> => {
    const r = await api<ExecOut>(system, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['python3', '-c', 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:8080/").read().decode())'] }, keyA);
    assert.equal(r.status, 200, JSON.stringify(r.body));
    return r.body.stdout.trim();
  };
  const created = await api<View>(system, 'POST', '/v1/sandboxes', { template: 'gvc' }, keyA);
  assert.equal(created.status, 201, JSON.stringify(created.body));
  const src = created.body.id;
  const [token] = (await counter(src)).split(' ');
  assert.equal(await counter(src), `${token ?? ''} 2`);

  // Snapshot: memory kept by default on gVisor, named.
  const snapped = await api<SnapView>(system, 'POST', `/v1/sandboxes/${src}/snapshots`, { name: 'after-two' }, keyA);
  assert.equal(snapped.status, 201, JSON.stringify(snapped.body));
  assert.deepEqual([snapped.body.phase, snapped.body.memory, snapped.body.name, snapped.body.sandbox], ['Ready', true, 'after-two', src]);
  assert.ok((snapped.body.memoryBytes ?? 0) > 0 && (snapped.body.bytes ?? 0) >= (snapped.body.memoryBytes ?? 0), JSON.stringify(snapped.body));
  const snapId = snapped.body.id;
  assert.equal(await counter(src), `${token ?? ''} 3`, 'the source runs on after its snapshot');

  // Another team: 404 everywhere, and an empty list.
  assert.equal((await api(system, 'GET', `/v1/snapshots/${snapId}`, undefined, keyB)).status, 404);
  assert.equal((await api(system, 'GET', '/v1/snapshots/after-two', undefined, keyB)).status, 404);
  assert.equal((await api(system, 'POST', `/v1/snapshots/${snapId}/sandboxes`, {}, keyB)).status, 404);
  assert.equal((await api(system, 'DELETE', `/v1/snapshots/${snapId}`, undefined, keyB)).status, 404);
  assert.deepEqual((await api<{ items: SnapView[] }>(system, 'GET', '/v1/snapshots', undefined, keyB)).body.items, []);
  assert.equal((await api(system, 'POST', `/v1/sandboxes/${src}/fork`, { count: 2 }, keyB)).status, 404);

  // A new sandbox from the snapshot, by its name: the counter goes on from 2.
  const fromSnap = await api<View>(system, 'POST', '/v1/snapshots/after-two/sandboxes', {}, keyA);
  assert.equal(fromSnap.status, 201, JSON.stringify(fromSnap.body));
  assert.equal(fromSnap.body.ready, true);
  assert.equal(await counter(fromSnap.body.id), `${token ?? ''} 3`);

  // Fork ×3: each succeeds on its own, goes on from the source's memory now, and is its own sandbox.
  const forked = await api<{ forks: { sandbox?: View; error?: { message: string } }[] }>(system, 'POST', `/v1/sandboxes/${src}/fork`, { count: 3 }, keyA);
  assert.equal(forked.status, 200, JSON.stringify(forked.body));
  const forks = forked.body.forks.map((f) => f.sandbox?.id ?? assert.fail(f.error?.message ?? 'no sandbox'));
  assert.equal(new Set([src, fromSnap.body.id, ...forks]).size, 5);
  for (const id of forks) assert.equal(await counter(id), `${token ?? ''} 4`, id);
  assert.equal(await counter(forks[0] ?? ''), `${token ?? ''} 5`);
  assert.equal(await counter(src), `${token ?? ''} 4`, 'forks share no memory with the source');
  // The fork's own snapshot is gone; the named one stays, and kubectl's API shows it.
  const listed = await api<{ items: SnapView[] }>(system, 'GET', '/v1/snapshots', undefined, keyA);
  assert.deepEqual(listed.body.items.map((s) => s.id), [snapId]);
  const kube = await api<{ items: { metadata: { name: string }; spec: { sandboxRef: { name: string } }; status: { phase: string } }[] }>(system, 'GET', '/apis/extensions.agents.x-k8s.io/v1alpha1/namespaces/default/sandboxsnapshots');
  assert.equal(kube.status, 200, JSON.stringify(kube.body));
  assert.deepEqual(kube.body.items.map((s) => [s.metadata.name, s.spec.sandboxRef.name, s.status.phase]), [[snapId, src, 'Ready']]);

  // The snapshot outlives its source.
  assert.equal((await api(system, 'DELETE', `/v1/sandboxes/${src}`, undefined, keyA)).status, 202);
  const late = await api<View>(system, 'POST', `/v1/snapshots/${snapId}/sandboxes`, {}, keyA);
  assert.equal(late.status, 201, JSON.stringify(late.body));
  assert.equal(await counter(late.body.id), `${token ?? ''} 3`);

  // A runc sandbox: memory asked for is a clear 501 and the sandbox runs on; files only works.
  const runc = (await api<View>(system, 'POST', '/v1/sandboxes', { template: 'rcc' }, keyA)).body.id;
  const refused = await api(system, 'POST', `/v1/sandboxes/${runc}/snapshots`, { memory: true }, keyA);
  assert.equal(refused.status, 501, JSON.stringify(refused.body));
  assert.match(JSON.stringify(refused.body), /CRIU/);
  assert.equal((await api<View>(system, 'GET', `/v1/sandboxes/${runc}`, undefined, keyA)).body.phase, 'Running');
  const filesOnly = await api<SnapView>(system, 'POST', `/v1/sandboxes/${runc}/snapshots`, {}, keyA);
  assert.deepEqual([filesOnly.status, filesOnly.body.memory], [201, false], JSON.stringify(filesOnly.body));

  // Deleted: gone for its team too.
  assert.equal((await api(system, 'DELETE', `/v1/snapshots/${snapId}`, undefined, keyA)).status, 202);
  assert.equal((await api(system, 'GET', `/v1/snapshots/${snapId}`, undefined, keyA)).status, 404);
  assert.equal((await api(system, 'POST', `/v1/snapshots/${snapId}/sandboxes`, {}, keyA)).status, 404);
});
