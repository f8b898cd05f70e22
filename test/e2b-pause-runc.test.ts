// Pause with memory on runc end to end, with the unmodified E2B JS SDK through the real data plane
// (a worker, the router, a real Envoy): a runc template with suspensionStrategy Hibernate keeps a
// background command's memory across pause and connect (CRIU), as E2B's full pause does; a sandbox
// of a runc template without it keeps running and is told how to get memory. Bridge asbrmem,
// subnet 10.12.0.0/16. ASB_CRIU_DIR points the worker at a CRIU build of its own (make criu).
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { test } from 'node:test';
import * as e2b from 'e2b';
import { baseTemplate } from '../src/api/builtin.ts';
import type { SandboxTemplate } from '../src/api/types.ts';
import { startTestSystem } from './support/local-system.ts';
import { api } from './support/worker-process.ts';
import { waitForFile } from './support/e2b-wait.ts';
import { waitFor } from './support/wait.ts';

function template(name: string, hibernate: boolean): SandboxTemplate {
  const t = baseTemplate();
  t.metadata.name = name;
  if (hibernate) t.spec.suspensionStrategy = 'Hibernate';
  return t;
}

/** A process whose only state is in memory: it writes the secret it was started with, again and again. */
const MEMORY_LOOP = 'secret=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d " \\n"); echo "$secret" > /tmp/first; while true; do echo "$secret" > /tmp/now; sleep 0.2; done';

test('E2B pause with memory on runc: a Hibernate template keeps a background command\'s memory across pause and connect; another runc template says how to get it; a snapshot keeps it; an on_timeout pause claim of a warm runc pool starts a pod that keeps it', async (t) => {
  const criuDir = process.env.ASB_CRIU_DIR;
  const system = await startTestSystem('rmem', 12, 'local', 0, false, [], criuDir === undefined ? [] : ['--criu', join(criuDir, 'bin', 'criu')]);
  t.after(() => system.cleanup());
  // runcpool: a runc template without Hibernate, kept warm by a pool of one.
  const pool = { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxWarmPool', metadata: { name: 'runcpool', namespace: 'default' }, spec: { replicas: 1, sandboxTemplateRef: { name: 'runcpool' } } };
  const applied = await api(system, 'POST', '/v1/apply', { objects: [template('runchib', true), template('runcstop', false), template('runcpool', false), pool] });
  assert.equal(applied.status, 200, JSON.stringify(applied.body));
  const opts = { apiUrl: system.edgeUrl, sandboxUrl: system.edgeUrl, apiKey: system.adminKey };

  const sbx = await e2b.Sandbox.create('runchib', { ...opts, timeoutMs: 600_000 });
  t.after(() => e2b.Sandbox.kill(sbx.sandboxId, opts).catch(() => false));
  await sbx.commands.run(MEMORY_LOOP, { background: true });
  const first = await waitForFile(sbx, '/tmp/first');
  assert.equal(await sbx.pause({ keepMemory: true }), true);
  assert.equal((await e2b.Sandbox.getInfo(sbx.sandboxId, opts)).state, 'paused');
  const view = (await api<{ memory?: string }>(system, 'GET', `/v1/sandboxes/${sbx.sandboxId}`)).body;
  assert.equal(view.memory, 'kept', JSON.stringify(view));
  const again = await e2b.Sandbox.connect(sbx.sandboxId, opts);
  await again.files.remove('/tmp/now');
  assert.equal(await waitForFile(again, '/tmp/now'), first, 'the loop runs on with the secret it held in memory');
  // A snapshot with no mode keeps the memory of a sandbox that can keep it, as E2B's does.
  const snap = await again.createSnapshot();
  t.after(() => e2b.Sandbox.deleteSnapshot(snap.snapshotId, opts).catch(() => false));
  const copy = await e2b.Sandbox.create(snap.snapshotId, { ...opts, timeoutMs: 600_000 });
  t.after(() => e2b.Sandbox.kill(copy.sandboxId, opts).catch(() => false));
  await copy.files.remove('/tmp/now');
  assert.equal(await waitForFile(copy, '/tmp/now'), first, 'a sandbox from the snapshot runs the loop on with the secret');

  const plain = await e2b.Sandbox.create('runcstop', { ...opts, timeoutMs: 600_000 });
  t.after(() => e2b.Sandbox.kill(plain.sandboxId, opts).catch(() => false));
  await assert.rejects(plain.pause({ keepMemory: true }), (err: unknown) => err instanceof Error && /suspensionStrategy: Hibernate/.test(err.message));
  assert.equal((await e2b.Sandbox.getInfo(plain.sandboxId, opts)).state, 'running');

  // E2B's on_timeout pause asks Hibernate of a template that does not say it. Its pool's warm
  // member runs in a user namespace CRIU cannot save, so the claim must start one that can.
  await waitFor('the runcpool member ready', async () => {
    const status = await api<{ pools: { name: string; readyReplicas: number }[] }>(system, 'GET', '/v1/status');
    return status.body.pools.find((p) => p.name === 'runcpool' && p.readyReplicas >= 1);
  });
  const pausing = await e2b.Sandbox.create('runcpool', { ...opts, timeoutMs: 600_000, lifecycle: { onTimeout: 'pause', autoResume: true } });
  t.after(() => e2b.Sandbox.kill(pausing.sandboxId, opts).catch(() => false));
  await pausing.commands.run(MEMORY_LOOP, { background: true });
  const held = await waitForFile(pausing, '/tmp/first');
  assert.equal(await pausing.pause({ keepMemory: true }), true);
  const resumed = await e2b.Sandbox.connect(pausing.sandboxId, opts);
  await resumed.files.remove('/tmp/now');
  assert.equal(await waitForFile(resumed, '/tmp/now'), held, 'a sandbox created to pause on timeout keeps its memory although its template has a warm pool');
});
