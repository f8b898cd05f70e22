// The local runtime's snapshots on runc, through CRIU: snapshot() keeps a checkpointable runc pod's
// files and memory, the pod goes on, and new pods start from the snapshot (PodRequest.from) with the
// source's in-memory state, each with its own address, files and host ids (the image's user
// namespace map is moved to each fork's range, criu-userns.ts): one snapshot gives N forks that
// share nothing afterwards. A pod in its shim's own user namespace has no memory to snapshot, and
// says how to get it. Real runc pods: needs root, make runc and make criu. Its own bridge and
// subnet (asbrm1, 10.15.64.0/18).
import assert from 'node:assert/strict';
import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { isAsbError } from '../src/errors.ts';
import { DEFAULT_CRIU_DIR, findCriuBinary } from '../src/runtime/oci/criu-binary.ts';
import type { PodRequest, PodState } from '../src/runtime/runtime.ts';
import { startTestRuntime, stopTestRuntime, type TestRuntime } from './support/test-runtime.ts';
import { counterApp, httpGet, podSh, startedReady as startedReadyIn } from './support/counter-app.ts';

let fixture: TestRuntime;

before(async () => {
  fixture = await startTestRuntime('asb-snap-runc-', 'asbrm1', '10.15.64.0/18', { probeIntervalMs: 100, pollIntervalMs: 100, criu: findCriuBinary(process.env.ASB_CRIU_DIR ?? DEFAULT_CRIU_DIR) });
});

after(() => stopTestRuntime(fixture));

const COUNTER = counterApp(8000, { hold: true });

function counterPod(id: string, opts: { from?: string; checkpointable?: boolean } = {}): PodRequest {
  return {
    id, uid: `uid-${id}`, namespace: 'default', hostname: `${id}-host`,
    ...(opts.from === undefined ? {} : { from: { snapshot: opts.from } }),
    ...(opts.checkpointable === false ? {} : { checkpointable: true }),
    spec: {
      containers: [{ name: 'main', image: 'agent-sandbox/base', command: ['python3', '-c', COUNTER, '16'], readinessProbe: { tcpSocket: { port: 8000 }, periodSeconds: 1 } }],
    },
  };
}

const count = (state: PodState): Promise<string> => httpGet(`http://${state.ip ?? ''}:8000/`);
const startedReady = (req: PodRequest): Promise<PodState> => startedReadyIn(fixture.rt, req);
const sh = (id: string, script: string): Promise<string> => podSh(fixture.rt, id, script);

test('a runc snapshot with memory gives three forks that go on from the source\'s memory, each with its own address, files and host ids; the source goes on too', async () => {
  const rt = fixture.rt;
  const src = await startedReady(counterPod('rsnsrc'));
  const [token] = (await count(src)).split(' ');
  assert.equal(await count(src), `${token ?? ''} 2`);
  await sh('rsnsrc', 'echo from-source > /home/user/note.txt');
  // Written just before: its bytes are still in the disk's cache, and the snapshot's copy must hold them.
  const big = await sh('rsnsrc', 'head -c 8388608 /dev/urandom > /home/user/big.bin; sha256sum /home/user/big.bin');
  // A process started through the runtime, holding its state in memory too.
  await rt.spawn('rsnsrc', { command: ['sh', '-c', 'X=spawned-before; while true; do echo "$X" > /tmp/loop.txt; sleep 0.2; done'] });

  const info = await rt.snapshot('rsnsrc', 'rsnap-a', { memory: true });
  assert.equal(info.memory, true);
  assert.ok(info.memoryBytes > 16 * 2 ** 20 && info.bytes > info.memoryBytes, JSON.stringify(info));
  assert.equal(await count(rt.state('rsnsrc')), `${token ?? ''} 3`, 'the source was only frozen: it answers from the same memory');

  const forks = await Promise.all(['rsnf1', 'rsnf2', 'rsnf3'].map((id) => startedReady(counterPod(id, { from: 'rsnap-a', checkpointable: false }))));
  assert.equal(new Set([src.ip, ...forks.map((f) => f.ip)]).size, 4, 'each fork has its own address');
  const uidMaps = new Set<string>();
  for (const [i, fork] of forks.entries()) {
    const id = `rsnf${String(i + 1)}`;
    assert.equal(rt.state(id).restoreFailure, undefined, JSON.stringify(rt.state(id)));
    assert.equal(await count(fork), `${token ?? ''} 3`, `${id} goes on from the snapshot's count`);
    assert.equal(await sh(id, 'cat /home/user/note.txt'), 'from-source\n');
    assert.equal(await sh(id, 'sha256sum /home/user/big.bin'), big, `${id} has every byte the source wrote just before the snapshot`);
    assert.equal(await sh(id, 'sleep 0.5; cat /tmp/loop.txt'), 'spawned-before\n', 'the spawned loop runs on in the fork');
    await sh(id, `echo ${id} > /home/user/own.txt; echo changed > /home/user/note.txt`);
    uidMaps.add((await sh(id, 'cat /proc/self/uid_map')).trim().split(/\s+/).join(' '));
  }
  uidMaps.add((await sh('rsnsrc', 'cat /proc/self/uid_map')).trim().split(/\s+/).join(' '));
  assert.equal(uidMaps.size, 4, `each pod runs as its own host ids: ${[...uidMaps].join(', ')}`);
  // After the fork nothing is shared: memory, files.
  assert.equal(await count(forks[0] as PodState), `${token ?? ''} 4`);
  assert.equal(await count(forks[0] as PodState), `${token ?? ''} 5`);
  assert.equal(await count(forks[1] as PodState), `${token ?? ''} 4`);
  assert.equal(await count(rt.state('rsnsrc')), `${token ?? ''} 4`);
  assert.equal(await sh('rsnsrc', 'cat /home/user/note.txt; ls /home/user'), 'from-source\nbig.bin\nnote.txt\n');
  assert.equal(await sh('rsnf2', 'cat /home/user/own.txt'), 'rsnf2\n');
  const owners = new Set<number>();
  for (const id of ['rsnsrc', 'rsnf1', 'rsnf2', 'rsnf3']) owners.add((await stat(join(fixture.root, 'pods', id, 'disk', 'upper', 'home', 'user', 'note.txt'))).uid);
  assert.equal(owners.size, 4, `each pod's files have their own host owner: ${[...owners].join(' ')}`);

  // A fork keeps memory too: it pauses and resumes like any checkpointable pod.
  await rt.stop('rsnf3', { memory: true });
  assert.equal(await count(await startedReady(counterPod('rsnf3', { checkpointable: false }))), `${token ?? ''} 4`);

  // The snapshot outlives its source.
  await rt.remove('rsnsrc');
  assert.equal(await count(await startedReady(counterPod('rsnf4', { from: 'rsnap-a' }))), `${token ?? ''} 3`);
  await rt.deleteSnapshot('rsnap-a');
  for (const id of ['rsnf1', 'rsnf2', 'rsnf3', 'rsnf4']) await rt.remove(id);
});

test('a runc pod stopped with its memory gives its checkpoint to a snapshot; a pod in its shim\'s user namespace has no memory to snapshot, and says how to get it', async () => {
  const rt = fixture.rt;
  const [token] = (await count(await startedReady(counterPod('rsnp')))).split(' ');
  await rt.stop('rsnp', { memory: true });
  const paused = await rt.snapshot('rsnp', 'rsnap-p', { memory: true });
  assert.equal(paused.memory, true);
  assert.equal(await count(await startedReady(counterPod('rsnp2', { from: 'rsnap-p' }))), `${token ?? ''} 2`);
  assert.equal(await count(await startedReady(counterPod('rsnp'))), `${token ?? ''} 2`, 'the paused pod still wakes with its memory');

  await startedReady(counterPod('rsnplain', { checkpointable: false }));
  await assert.rejects(rt.snapshot('rsnplain', 'rsnap-x', { memory: true }), (err) => isAsbError(err, 'NotImplemented') && /suspensionStrategy: Hibernate/.test(err.message));
  assert.equal(rt.state('rsnplain').phase, 'Running');
  await rt.snapshot('rsnplain', 'rsnap-x', { memory: false });
  for (const id of ['rsnp', 'rsnp2', 'rsnplain']) await rt.remove(id);
  for (const id of ['rsnap-p', 'rsnap-x']) await rt.deleteSnapshot(id);
});
