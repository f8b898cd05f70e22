// The local runtime's stop with memory on gVisor: stop(id, { memory: true }) saves the sandbox with
// runsc checkpoint and the next start restores it, so a process holding state only in memory goes
// on where it was, with its listening socket and its address; an image that cannot be restored
// falls back to a fresh start from the pod's files, saying why; a save that cannot be made leaves
// the pod running. Real gVisor pods: needs root and `make runsc`, like test/runtime-gvisor.test.ts.
// Its own bridge and subnet (asbckp0, 10.16.0.0/16).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';
import { isAsbError } from '../src/errors.ts';
import { createLocalRuntime, type LocalRuntime } from '../src/runtime/local/local-runtime.ts';
import { CHECKPOINT_META, DURABLE_MARK, type CheckpointMeta } from '../src/runtime/local/checkpoint.ts';
import { podPaths } from '../src/runtime/local/rootfs.ts';
import type { PodRequest, PodState } from '../src/runtime/runtime.ts';
import { silentLogger } from '../src/base/log.ts';
import { testImageStore } from './support/test-images.ts';
import { waitFor } from './support/wait.ts';
import { podSh, startedReady as startedReadyIn } from './support/counter-app.ts';
import { count, countedAndPaused as countedAndPausedIn, counterPod as counterPodOf, handlesSurviveAStop, readMeta as readMetaIn, saveOverItsDiskIsRefused, writeMeta as writeMetaIn, type CounterPodOptions } from './support/state-pods.ts';
import { startTestRuntime, stopTestRuntime, type TestRuntime } from './support/test-runtime.ts';

const execFileAsync = promisify(execFile);
const BRIDGE = 'asbckp0';
const SUBNET = '10.16.0.0/16';
let fixture: TestRuntime;
let rt: LocalRuntime;
let root = '';

before(async () => {
  fixture = await startTestRuntime('asb-ckpt-', BRIDGE, SUBNET, { probeIntervalMs: 100, pollIntervalMs: 100 });
  ({ root, rt } = fixture);
});

after(() => stopTestRuntime(fixture));

/** The counter pod on gVisor, or on runc with `runtimeClassName: null`. */
function counterPod(id: string, opts: CounterPodOptions & { runtimeClassName?: null } = {}): PodRequest {
  return counterPodOf(opts.runtimeClassName === null ? 'runc' : 'gvisor', id, { ...opts, checkpointable: false });
}

const startedReady = (req: PodRequest): Promise<PodState> => startedReadyIn(rt, req);
const sh = (id: string, script: string): Promise<string> => podSh(rt, id, script);
const readMeta = (id: string): Promise<CheckpointMeta> => readMetaIn(root, id);
const writeMeta = (id: string, meta: CheckpointMeta): Promise<void> => writeMetaIn(root, id, meta);
const countedAndPaused = (req: PodRequest): Promise<{ before: PodState; token: string }> => countedAndPausedIn(rt, req);

test('a gVisor pod stopped with memory goes on where it was: its in-memory counter, its listening socket, its address and its files', async () => {
  const req = counterPod('mem1');
  const { before, token } = await countedAndPaused(req);
  const stopped = rt.state('mem1');
  assert.equal(stopped.phase, 'Stopped');
  assert.ok((stopped.checkpoint?.bytes ?? 0) > 1 << 20, `the state says memory is kept: ${JSON.stringify(stopped)}`);
  assert.ok(!Number.isNaN(Date.parse(stopped.checkpoint?.at ?? '')));
  const paths = podPaths(root, 'mem1');
  // In the pod's private state dir, never readable by anyone else.
  assert.equal((await stat(paths.dir)).mode & 0o777, 0o700);
  const meta = await readMeta('mem1');
  assert.equal(meta.bytes, stopped.checkpoint?.bytes);
  assert.ok(meta.files.some((f) => f.name === 'checkpoint.img' && typeof f.sha256 === 'string'), JSON.stringify(meta.files));

  const woken = await startedReady(req);
  assert.equal(woken.restoreFailure, undefined);
  assert.equal(woken.ip, before.ip, 'the pod keeps its address');
  assert.deepEqual(await count(woken), { token, n: 4 }, 'the same process, its memory as it was');
  assert.equal(await sh('mem1', 'cat /home/user/kept.txt /tmp/kept.txt'), 'kept\ntmp-kept\n');
  assert.equal(existsSync(paths.checkpoint), false, 'a restored image is deleted: it must never be restored twice');
  assert.equal(rt.state('mem1').checkpoint, undefined);

  // A plain stop after it keeps files only: the counter starts again.
  await rt.stop('mem1');
  assert.equal(rt.state('mem1').checkpoint, undefined);
  const fresh = await startedReady(req);
  const again = await count(fresh);
  assert.notEqual(again.token, token);
  assert.equal(again.n, 1);
});

test('a damaged checkpoint is not restored: the pod starts fresh from its files and says why', async () => {
  const req = counterPod('bad1');
  const { token } = await countedAndPaused(req);
  const image = join(podPaths(root, 'bad1').checkpoint, 'checkpoint.img');
  const bytes = await readFile(image);
  bytes[bytes.length >> 1] = (bytes[bytes.length >> 1] ?? 0) ^ 0xff;
  await writeFile(image, bytes);
  const woken = await startedReady(req);
  assert.match(woken.restoreFailure ?? '', /cannot be restored.*checkpoint\.img is damaged/);
  const now = await count(woken);
  assert.notEqual(now.token, token);
  assert.equal(now.n, 1);
  assert.equal(await sh('bad1', 'cat /home/user/kept.txt'), 'kept\n', 'the files are as they were');
  assert.equal(existsSync(podPaths(root, 'bad1').checkpoint), false);
  // Said for this start only: the next stop and start have nothing to say.
  await rt.stop('bad1');
  assert.equal((await startedReady(req)).restoreFailure, undefined);
});

test('a truncated checkpoint is not restored', async () => {
  const req = counterPod('trunc1', { holdMiB: 8 });
  await countedAndPaused(req);
  const pages = join(podPaths(root, 'trunc1').checkpoint, 'pages.img');
  const size = (await stat(pages)).size;
  await writeFile(pages, (await readFile(pages)).subarray(0, size >> 1));
  const woken = await startedReady(req);
  assert.match(woken.restoreFailure ?? '', new RegExp(`pages\\.img has ${String(size >> 1)} bytes, ${String(size)} were written`));
  assert.equal((await count(woken)).n, 1);
});

test('a checkpoint made by another runsc version is not restored', async () => {
  const req = counterPod('ver1');
  await countedAndPaused(req);
  await writeMeta('ver1', { ...(await readMeta('ver1')), runscVersion: 'v0.0.0-20200101000000-000000000000' });
  const woken = await startedReady(req);
  assert.match(woken.restoreFailure ?? '', /made by runsc v0\.0\.0-20200101000000-000000000000, this worker runs v0\.0\.0-/);
  assert.equal((await count(woken)).n, 1);
  assert.equal(existsSync(podPaths(root, 'ver1').checkpoint), false);
});

test('an image runsc itself refuses to restore: the shim starts the pod fresh, with its network, and runsc\'s reason is the restore failure', async () => {
  const req = counterPod('rfail1');
  const { before } = await countedAndPaused(req);
  // Damaged in a way our checks cannot see: the metadata is made to agree with the bad bytes.
  const dir = podPaths(root, 'rfail1').checkpoint;
  await writeFile(join(dir, 'checkpoint.img'), 'not a gVisor state file');
  const meta = await readMeta('rfail1');
  meta.files = meta.files.map((f) => (f.name === 'checkpoint.img' ? { name: f.name, bytes: 23, sha256: createHash('sha256').update('not a gVisor state file').digest('hex') } : f));
  await writeMeta('rfail1', meta);
  const woken = await startedReady(req);
  assert.match(woken.restoreFailure ?? '', /^runsc could not restore the memory checkpoint, so the pod started from its files: ./);
  assert.equal(woken.ip, before.ip);
  assert.equal((await count(woken)).n, 1, 'a fresh process, reachable at its address');
  assert.equal(existsSync(dir), false);
});

test('a save that would pass the pod\'s ephemeral-storage is refused: the pod keeps running and nothing of the image is left', () => saveOverItsDiskIsRefused(rt, root, 'gvisor', 'full1'));

test('a save runsc fails leaves the sandbox running, resumed, with no image left', async (t) => {
  const req = counterPod('rsfail1');
  const before = await startedReady(req);
  assert.equal((await count(before)).n, 1);
  // runsc cannot make the image's directory: the pod dir is immutable (even to root) for the save.
  const paths = podPaths(root, 'rsfail1');
  await execFileAsync('chattr', ['+i', paths.dir]);
  t.after(() => execFileAsync('chattr', ['-i', paths.dir]));
  await assert.rejects(rt.stop('rsfail1', { memory: true }), (err) => isAsbError(err, 'CheckpointFailed') && /runsc checkpoint: .*making directories at path provided/.test(err.message) && /keeps running/.test(err.message));
  await execFileAsync('chattr', ['-i', paths.dir]);
  assert.equal(rt.state('rsfail1').phase, 'Running');
  assert.equal((await count(before)).n, 2, 'resumed: the same process answers');
  assert.equal(existsSync(paths.checkpoint) || existsSync(paths.checkpointPartial), false);
  // And a save after it works.
  await rt.stop('rsfail1', { memory: true });
  assert.equal(rt.state('rsfail1').phase, 'Stopped');
  assert.equal((await count(await startedReady(req))).n, 3);
});

test('a kept checkpoint outlives the worker: a new runtime on the same root says so and restores it; a half-written one is deleted', async () => {
  const req = counterPod('again1');
  const { token } = await countedAndPaused(req);
  const paths = podPaths(root, 'again1');
  // What a worker killed in the middle of a save leaves, and in the middle of deleting a restored image.
  await mkdir(paths.checkpointPartial);
  await writeFile(join(paths.checkpointPartial, 'checkpoint.img'), 'half');
  const discarded = `${paths.checkpoint}.discarded-0a1b2c`;
  await mkdir(discarded);
  await writeFile(join(discarded, 'pages.img'), 'old memory');
  const rt2 = await createLocalRuntime({ root, log: silentLogger(), images: await testImageStore(), bridge: BRIDGE, subnet: SUBNET, pollIntervalMs: 100 });
  try {
    const kept = rt2.state('again1');
    assert.equal(kept.phase, 'Stopped');
    assert.deepEqual(kept.checkpoint, rt.state('again1').checkpoint);
    assert.equal(existsSync(paths.checkpointPartial), false);
    assert.equal(existsSync(discarded), false, 'an image left half-deleted is deleted');
    const woken = await rt2.start(req);
    assert.equal(woken.phase, 'Running', JSON.stringify(woken));
    assert.equal(woken.restoreFailure, undefined);
    assert.deepEqual(await count(woken), { token, n: 4 });
    await rt2.stop('again1');
  } finally {
    await rt2.close();
  }
});

test('a checkpoint reaches the disk after the stop returns; after a host restart one that had not is not restored, and one that had is', async () => {
  const req = counterPod('dur1');
  const { token } = await countedAndPaused(req);
  const paths = podPaths(root, 'dur1');
  const mark = join(paths.checkpoint, DURABLE_MARK);
  await waitFor('the checkpoint\'s durable mark', () => Promise.resolve(existsSync(mark) ? true : undefined), 30_000);
  // A host restart: another boot id. The mark says every byte was on the disk before it.
  await writeMeta('dur1', { ...(await readMeta('dur1')), bootId: 'a-boot-before-this-one' });
  const woken = await startedReady(req);
  assert.equal(woken.restoreFailure, undefined);
  assert.deepEqual(await count(woken), { token, n: 4 });

  await rt.stop('dur1', { memory: true });
  await waitFor('the second checkpoint\'s durable mark', () => Promise.resolve(existsSync(mark) ? true : undefined), 30_000);
  // The host went down before the bytes reached the disk: no mark.
  await rm(mark);
  await writeMeta('dur1', { ...(await readMeta('dur1')), bootId: 'a-boot-before-this-one' });
  const fresh = await startedReady(req);
  assert.match(fresh.restoreFailure ?? '', /cannot be restored.*the host restarted before the checkpoint reached its disk/);
  assert.equal((await count(fresh)).n, 1, 'it started from its files');
  assert.equal(await sh('dur1', 'cat /home/user/kept.txt'), 'kept\n');
});

test('remove() deletes a kept checkpoint with the pod', async () => {
  const req = counterPod('rm1');
  await countedAndPaused(req);
  const paths = podPaths(root, 'rm1');
  assert.equal(existsSync(join(paths.checkpoint, CHECKPOINT_META)), true);
  await rt.remove('rm1');
  assert.equal(existsSync(paths.checkpoint), false);
  assert.equal(existsSync(paths.dir), false);
  assert.equal(rt.state('rm1').phase, 'Absent');
});

test('a runc pod in its shim\'s user namespace refuses a stop with memory (saying how to get it) and keeps running; a stopped pod has no memory to keep', async () => {
  const req = counterPod('runc1', { runtimeClassName: null });
  const before = await startedReady(req);
  assert.equal((await count(before)).n, 1);
  await assert.rejects(rt.stop('runc1', { memory: true }), (err) => isAsbError(err, 'NotImplemented') && /suspensionStrategy: Hibernate/.test(err.message) && /keeps running/.test(err.message));
  assert.equal(rt.state('runc1').phase, 'Running');
  assert.equal((await count(before)).n, 2, 'the same process answers');
  await rt.stop('runc1');
  await assert.rejects(rt.stop('runc1', { memory: true }), (err) => isAsbError(err, 'SandboxNotRunning'));
  await assert.rejects(rt.stop('nosuchpod', { memory: true }), (err) => isAsbError(err, 'NotFound'));
});

test('processes started through the runtime (a background server, a terminal) survive a stop with memory: their handles attach to them again', () => handlesSurviveAStop(rt, counterPod('ckagent')));

test('a start that discards the memory (E2B\'s on_resume "reboot") deletes the checkpoint and starts from the files', async () => {
  const id = 'ckreboot';
  const req = counterPod(id);
  const first = await startedReady(req);
  const before = await count(first);
  await sh(id, 'echo kept > /home/user/f.txt');
  await rt.stop(id, { memory: true });
  assert.ok(rt.state(id).checkpoint !== undefined);
  const rebooted = await rt.start(req, { memory: false });
  for (let i = 0; i < 200 && !rt.state(id).ready; i++) await new Promise((resolve) => setTimeout(resolve, 50));
  const after = await count(rebooted);
  assert.notEqual(after.token, before.token, 'a new process');
  assert.equal(after.n, 1);
  assert.equal(rt.state(id).restoreFailure, undefined, 'nothing failed: it was asked for');
  assert.equal(await sh(id, 'cat /home/user/f.txt'), 'kept\n');
  assert.equal(existsSync(join(podPaths(root, id).dir, 'checkpoint')), false);
  await rt.remove(id);
});
