// The local runtime's snapshots on gVisor: snapshot() keeps a running pod's files and memory, the
// pod goes on, and new pods start from the snapshot (PodRequest.from) with the source's in-memory
// state, each with its own address, files and host ids: one snapshot gives N forks. A snapshot of
// files only starts new pods fresh on the source's files; a snapshot outlives its source; a fork
// whose spec differs from the snapshot's starts from the files and says why. Real gVisor pods:
// needs root and `make runsc`. Its own bridge and subnet (asbsnp0, 10.27.0.0/16).
import assert from 'node:assert/strict';
import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { isAsbError } from '../src/errors.ts';
import type { LocalRuntime } from '../src/runtime/local/local-runtime.ts';
import type { PodRequest, PodState } from '../src/runtime/runtime.ts';
import { startTestRuntime, stopTestRuntime, type TestRuntime } from './support/test-runtime.ts';
import { counterApp, httpGet, podSh, startedReady as startedReadyIn } from './support/counter-app.ts';

let fixture: TestRuntime;
let rt: LocalRuntime;

before(async () => {
  fixture = await startTestRuntime('asb-snap-', 'asbsnp0', '10.27.0.0/16', { probeIntervalMs: 100, pollIntervalMs: 100 });
  ({ rt } = fixture);
});

after(() => stopTestRuntime(fixture));

const COUNTER = counterApp(8000);

function counterPod(id: string, from?: string, container: Record<string, unknown> = {}): PodRequest {
  return {
    id, uid: `uid-${id}`, namespace: 'default', hostname: `${id}-host`,
    ...(from === undefined ? {} : { from: { snapshot: from } }),
    spec: {
      runtimeClassName: 'gvisor',
      containers: [{ name: 'main', image: 'agent-sandbox/base', command: ['python3', '-c', COUNTER], readinessProbe: { tcpSocket: { port: 8000 }, periodSeconds: 1 }, ...container }],
    },
  };
}


async function count(state: PodState): Promise<string> {
  return httpGet(`http://${state.ip ?? ''}:8000/`);
}

function startedReady(req: PodRequest): Promise<PodState> {
  return startedReadyIn(rt, req);
}

function sh(id: string, script: string): Promise<string> {
  return podSh(rt, id, script);
}

test('a snapshot with memory gives forks that go on from the source\'s memory, each with its own address, files and ids; the source goes on too', async () => {
  const src = await startedReady(counterPod('snsrc'));
  const [token] = (await count(src)).split(' ');
  assert.equal(await count(src), `${token ?? ''} 2`);
  await sh('snsrc', 'echo from-source > /home/user/note.txt; echo tmp > /tmp/t.txt');
  // Written just before: its bytes are still in the disk's cache, and the snapshot's copy must hold them.
  const big = await sh('snsrc', 'head -c 8388608 /dev/urandom > /home/user/big.bin; sha256sum /home/user/big.bin');
  // A process started through the runtime, holding its state in memory too.
  await rt.spawn('snsrc', { command: ['sh', '-c', 'X=spawned-before; while true; do echo "$X" > /tmp/loop.txt; sleep 0.2; done'] });

  const info = await rt.snapshot('snsrc', 'snap-a', { memory: true });
  assert.equal(info.memory, true);
  assert.ok(info.memoryBytes > 2 ** 20 && info.bytes > info.memoryBytes, JSON.stringify(info));
  // The source was only paused: it answers from the same memory.
  assert.equal(await count(rt.state('snsrc')), `${token ?? ''} 3`);

  const forks = await Promise.all(['snf1', 'snf2', 'snf3'].map((id) => startedReady(counterPod(id, 'snap-a'))));
  const ips = new Set([src.ip, ...forks.map((f) => f.ip)]);
  assert.equal(ips.size, 4, 'each fork has its own address');
  for (const [i, fork] of forks.entries()) {
    const id = `snf${String(i + 1)}`;
    assert.equal(rt.state(id).restoreFailure, undefined, JSON.stringify(rt.state(id)));
    assert.equal(await count(fork), `${token ?? ''} 3`, `${id} goes on from the snapshot's count`);
    assert.equal(await sh(id, 'cat /home/user/note.txt /tmp/t.txt'), 'from-source\ntmp\n');
    assert.equal(await sh(id, 'sha256sum /home/user/big.bin'), big, `${id} has every byte the source wrote just before the snapshot`);
    assert.equal(await sh(id, 'sleep 0.5; cat /tmp/loop.txt'), 'spawned-before\n', 'the spawned loop runs on in the fork');
    // Its files are its own: the user can write where the source's user could.
    await sh(id, `echo ${id} > /home/user/own.txt; echo changed > /home/user/note.txt`);
  }
  // After the fork nothing is shared: memory, files.
  assert.equal(await count(forks[0] as PodState), `${token ?? ''} 4`);
  assert.equal(await count(forks[0] as PodState), `${token ?? ''} 5`);
  assert.equal(await count(forks[1] as PodState), `${token ?? ''} 4`);
  assert.equal(await count(rt.state('snsrc')), `${token ?? ''} 4`);
  assert.equal(await sh('snsrc', 'cat /home/user/note.txt; ls /home/user'), 'from-source\nbig.bin\nnote.txt\n');
  assert.equal(await sh('snf2', 'cat /home/user/own.txt'), 'snf2\n');
  // On the host, each pod's files belong to its own id range: the copied ones were shifted.
  const owners = new Set<number>();
  for (const id of ['snsrc', 'snf1', 'snf2', 'snf3']) owners.add((await stat(join(fixture.root, 'pods', id, 'disk', 'upper', 'home', 'user', 'note.txt'))).uid);
  assert.equal(owners.size, 4, `each pod's files have their own host owner: ${[...owners].join(' ')}`);

  // The snapshot outlives its source.
  await rt.remove('snsrc');
  const late = await startedReady(counterPod('snf4', 'snap-a'));
  assert.equal(await count(late), `${token ?? ''} 3`);
  await rt.deleteSnapshot('snap-a');
  assert.ok(!(await rt.snapshots()).includes('snap-a'));
  const gone = await rt.start(counterPod('snf5', 'snap-a'));
  assert.deepEqual([gone.phase, gone.reason], ['Failed', 'SnapshotUnavailable'], JSON.stringify(gone));
  for (const id of ['snf1', 'snf2', 'snf3', 'snf4', 'snf5']) await rt.remove(id);
});

test('a snapshot of files only starts new pods fresh on the source\'s files; a paused pod\'s memory can be snapshotted too', async () => {
  await startedReady(counterPod('snfs'));
  await sh('snfs', 'echo kept > /home/user/f.txt');
  const [token] = (await count(rt.state('snfs'))).split(' ');
  const files = await rt.snapshot('snfs', 'snap-files', { memory: false });
  assert.deepEqual([files.memory, files.memoryBytes], [false, 0]);
  const fresh = await startedReady(counterPod('snfs2', 'snap-files'));
  const [freshToken, n] = (await count(fresh)).split(' ');
  assert.notEqual(freshToken, token, 'a new process');
  assert.equal(n, '1');
  assert.equal(await sh('snfs2', 'cat /home/user/f.txt'), 'kept\n');

  // Stopped with its memory, the pod's checkpoint becomes the snapshot's memory.
  await rt.stop('snfs', { memory: true });
  const paused = await rt.snapshot('snfs', 'snap-paused', { memory: true });
  assert.equal(paused.memory, true);
  const fromPaused = await startedReady(counterPod('snfs3', 'snap-paused'));
  assert.equal(await count(fromPaused), `${token ?? ''} 2`);
  // And the paused pod still wakes with its memory.
  assert.equal(await count(await startedReady(counterPod('snfs'))), `${token ?? ''} 2`);

  await assert.rejects(rt.snapshot('snfs', 'snap-files', { memory: false }), (err) => isAsbError(err, 'Conflict'));
  for (const id of ['snfs', 'snfs2', 'snfs3']) await rt.remove(id);
  for (const id of ['snap-files', 'snap-paused']) await rt.deleteSnapshot(id);
});

// Before #oneSaveAtATime, the stop got the snapshot's own promise and returned with the pod still running.
test('a stop with memory asked while a snapshot is taken waits for it, then stops with its memory; both are whole', async () => {
  await startedReady(counterPod('snrace'));
  const [token] = (await count(rt.state('snrace'))).split(' ');
  const snapping = rt.snapshot('snrace', 'snap-race', { memory: true });
  // Asked once the snapshot is under way (its save takes a few hundred ms).
  await new Promise((r) => setTimeout(r, 50));
  const stopping = rt.stop('snrace', { memory: true });
  const [snap] = await Promise.all([snapping, stopping]);
  assert.equal(snap.memory, true);
  const stopped = rt.state('snrace');
  assert.equal(stopped.phase, 'Stopped', 'the stop did stop the pod');
  assert.ok(stopped.checkpoint !== undefined, 'with its memory kept');
  // The snapshot holds the count after 1, the pause after 1 too: both go on to 2.
  assert.equal(await count(await startedReady(counterPod('snrace2', 'snap-race'))), `${token ?? ''} 2`);
  assert.equal(await count(await startedReady(counterPod('snrace'))), `${token ?? ''} 2`);
  for (const id of ['snrace', 'snrace2']) await rt.remove(id);
  await rt.deleteSnapshot('snap-race');
});

test('a fork whose spec differs from the snapshot\'s starts from the files and says why; a runc pod has no memory to snapshot', async () => {
  await startedReady(counterPod('sndf'));
  await rt.snapshot('sndf', 'snap-d', { memory: true });
  const other = await startedReady(counterPod('sndf2', 'snap-d', { workingDir: '/tmp' }));
  assert.match(rt.state('sndf2').restoreFailure ?? '', /process differs from the snapshot's/);
  assert.equal((await count(other)).split(' ')[1], '1');

  const runc = counterPod('snrc');
  delete runc.spec.runtimeClassName;
  await startedReady(runc);
  await assert.rejects(rt.snapshot('snrc', 'snap-r', { memory: true }), (err) => isAsbError(err, 'NotImplemented') && /CRIU/.test(err.message));
  assert.equal(rt.state('snrc').phase, 'Running');
  // Files only works on runc.
  await sh('snrc', 'echo runc-file > /home/user/r.txt');
  await rt.snapshot('snrc', 'snap-r', { memory: false });
  const r2 = counterPod('snrc2', 'snap-r');
  delete r2.spec.runtimeClassName;
  await startedReady(r2);
  assert.equal(await sh('snrc2', 'cat /home/user/r.txt'), 'runc-file\n');
  for (const id of ['sndf', 'sndf2', 'snrc', 'snrc2']) await rt.remove(id);
  for (const id of ['snap-d', 'snap-r']) await rt.deleteSnapshot(id);
});
