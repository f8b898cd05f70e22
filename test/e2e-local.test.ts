// End to end with real parts: a worker process, the SQLite store, the local runtime running real
// sandboxes in namespaces, the REST API. What a user does, and what they must never see.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { test } from 'node:test';
import { waitFor } from './support/wait.ts';
import { api, removeDataDir, startWorkerProcess, tempDataDir, type ExecOut, type View, type WorkerProcess } from './support/worker-process.ts';


function cleanupBridge(tag: string): void {
  try {
    execFileSync('ip', ['link', 'del', `asb${tag}`], { stdio: 'ignore' });
  } catch {
    // already gone
  }
}

test('a real sandbox: claim, exec, write, pause, resume, the file is still there, delete', async (t) => {
  const w = await startWorkerProcess({ clusterTag: 'e2ea', subnetOctet: 215, basePool: 2 });
  t.after(async () => {
    await w.stop();
    removeDataDir(w.dataDir);
    cleanupBridge('e2ea');
  });

  const created = await api<View>(w, 'POST', '/v1/sandboxes', { template: 'base' });
  assert.equal(created.status, 201, JSON.stringify(created.body));
  const id = created.body.id;
  assert.match(id, /^e2ea[a-z0-9]{16}$/, 'the id carries the cluster tag');
  assert.equal(created.body.ready, true);

  const echo = await api<ExecOut>(w, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['echo', 'hello from the sandbox'] });
  assert.equal(echo.status, 200);
  assert.equal(echo.body.stdout, 'hello from the sandbox\n');
  assert.equal(echo.body.exitCode, 0);

  const failing = await api<ExecOut>(w, 'POST', `/v1/sandboxes/${id}/exec`, { command: 'echo oops >&2; exit 3' });
  assert.equal(failing.body.exitCode, 3);
  assert.equal(failing.body.stderr, 'oops\n');

  const put = await fetch(`${w.apiUrl}/v1/sandboxes/${id}/files?path=/home/user/notes.txt`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${w.adminKey}`, 'content-type': 'application/octet-stream' },
    body: 'state that must survive hibernation',
  });
  assert.equal(put.status, 204);
  await api(w, 'POST', `/v1/sandboxes/${id}/exec`, { command: 'echo scratch > /tmp/scratch.txt' });

  const paused = await api<View>(w, 'POST', `/v1/sandboxes/${id}/pause`);
  assert.equal(paused.status, 200);
  await waitFor('hibernation', async () => {
    const got = await api<View>(w, 'GET', `/v1/sandboxes/${id}`);
    return got.body.phase === 'Hibernated' ? got.body : undefined;
  });
  const whilePaused = await api(w, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['true'] });
  assert.equal(whilePaused.status, 409, 'exec on a hibernated sandbox is refused, not hung');

  const resumed = await api<View>(w, 'POST', `/v1/sandboxes/${id}/resume`, { wait: true });
  assert.equal(resumed.status, 200);
  assert.equal(resumed.body.ready, true);

  const file = await fetch(`${w.apiUrl}/v1/sandboxes/${id}/files?path=/home/user/notes.txt`, { headers: { authorization: `Bearer ${w.adminKey}` } });
  assert.equal(await file.text(), 'state that must survive hibernation');
  const scratch = await api<ExecOut>(w, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['cat', '/tmp/scratch.txt'] });
  assert.equal(scratch.body.stdout, 'scratch\n', 'the whole writable filesystem survives, not only volumes');

  const del = await api(w, 'DELETE', `/v1/sandboxes/${id}`);
  assert.equal(del.status, 202);
  await waitFor('deletion', async () => ((await api(w, 'GET', `/v1/sandboxes/${id}`)).status === 404 ? true : undefined));
});

test('kill -9 the worker in the middle of a burst of claims: no sandbox lost, none bound twice', async (t) => {
  const dataDir = tempDataDir('e2eb');
  let w: WorkerProcess = await startWorkerProcess({ dataDir, clusterTag: 'e2eb', subnetOctet: 216, basePool: 20 });
  t.after(async () => {
    await w.stop();
    removeDataDir(dataDir);
    cleanupBridge('e2eb');
  });
  await waitFor('a full pool', async () => {
    const status = await api<{ pools: { name: string; readyReplicas: number }[] }>(w, 'GET', '/v1/status');
    return status.body.pools.find((p) => p.name === 'base' && p.readyReplicas >= 20);
  });

  // 40 claims in flight; the worker dies after the 10th acknowledgement.
  const acked: string[] = [];
  const first = w;
  const burst = Array.from({ length: 40 }, async () => {
    try {
      const res = await api<View>(first, 'POST', '/v1/sandboxes', { template: 'base', wait: false });
      if (res.status === 201) {
        acked.push(res.body.id);
        if (acked.length === 10) first.proc.kill('SIGKILL');
      }
    } catch {
      // connection reset by the kill: not acknowledged, so nothing is owed
    }
  });
  await Promise.all(burst);
  await first.exited;
  assert.ok(acked.length >= 10, `at least 10 claims were acknowledged (${acked.length})`);
  assert.equal(new Set(acked).size, acked.length, 'no sandbox was handed to two claims');

  w = await startWorkerProcess({ dataDir, clusterTag: 'e2eb', subnetOctet: 216, basePool: 20 });
  const all = await api<{ items: View[] }>(w, 'GET', '/v1/sandboxes?limit=500');
  const ids = new Set(all.body.items.map((s) => s.id));
  for (const id of acked) assert.ok(ids.has(id), `acknowledged sandbox ${id} survived the crash`);
  // Every acknowledged sandbox still works after the restart.
  for (const id of acked.slice(0, 3)) {
    const ready = await waitFor(`sandbox ${id} ready`, async () => {
      const got = await api<View>(w, 'GET', `/v1/sandboxes/${id}`);
      return got.body.ready ? got.body : undefined;
    });
    assert.equal(ready.owner, 'admin');
    const out = await api<ExecOut>(w, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['echo', 'alive'] });
    assert.equal(out.body.stdout, 'alive\n');
  }
});
