// The local runtime's stop with memory on runc, through CRIU (make criu): a runc pod started
// checkpointable (PodRequest.checkpointable, what a Sandbox with suspensionStrategy Hibernate asks)
// is saved by `runc checkpoint` and its next start restores it, so a process holding state only in
// memory goes on where it was, with its listening socket, its address and its writable layer, and
// so do processes started through the runtime (a background server, a terminal). An image that
// cannot be restored falls back to a fresh start from the pod's files, saying why; a save that
// cannot be made leaves the pod running; a runc pod in the shim's own user namespace refuses with
// NotImplemented saying how to get memory. Real runc pods: needs root, make runc and make criu.
// Its own bridge and subnet (asbrm0, 10.15.0.0/18).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readdir, readFile, stat, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';
import { isAsbError } from '../src/errors.ts';
import type { CheckpointMeta } from '../src/runtime/local/checkpoint.ts';
import { createLocalRuntime } from '../src/runtime/local/local-runtime.ts';
import { podPaths } from '../src/runtime/local/rootfs.ts';
import { silentLogger } from '../src/base/log.ts';
import { testImageStore } from './support/test-images.ts';
import { DEFAULT_CRIU_DIR, findCriuBinary } from '../src/runtime/oci/criu-binary.ts';
import type { PodRequest, PodState } from '../src/runtime/runtime.ts';
import { podSh, startedReady as startedReadyIn } from './support/counter-app.ts';
import { count, countedAndPaused as countedAndPausedIn, counterPod as counterPodOf, handlesSurviveAStop, readMeta as readMetaIn, saveOverItsDiskIsRefused, writeMeta as writeMetaIn, type CounterPodOptions } from './support/state-pods.ts';
import { startTestRuntime, stopTestRuntime, type TestRuntime } from './support/test-runtime.ts';

const BRIDGE = 'asbrm0';
const SUBNET = '10.15.0.0/18';
let fixture: TestRuntime;
let root = '';

before(async () => {
  fixture = await startTestRuntime('asb-ckpt-runc-', BRIDGE, SUBNET, { probeIntervalMs: 100, pollIntervalMs: 100, criu: findCriuBinary(process.env.ASB_CRIU_DIR ?? DEFAULT_CRIU_DIR) });
  ({ root } = fixture);
});

after(() => stopTestRuntime(fixture));

const counterPod = (id: string, opts: CounterPodOptions = {}): PodRequest => counterPodOf('runc', id, opts);
const startedReady = (req: PodRequest): Promise<PodState> => startedReadyIn(fixture.rt, req);
const sh = (id: string, script: string): Promise<string> => podSh(fixture.rt, id, script);
const readMeta = (id: string): Promise<CheckpointMeta> => readMetaIn(root, id);
const writeMeta = (id: string, meta: CheckpointMeta): Promise<void> => writeMetaIn(root, id, meta);
const countedAndPaused = (req: PodRequest): Promise<{ before: PodState; token: string }> => countedAndPausedIn(fixture.rt, req);

test('a checkpointable runc pod stopped with memory goes on where it was: its in-memory counter, its listening socket, its address and its files', async () => {
  const rt = fixture.rt;
  const req = counterPod('rmem1', { holdMiB: 32 });
  const { before, token } = await countedAndPaused(req);
  const stopped = rt.state('rmem1');
  assert.equal(stopped.phase, 'Stopped');
  assert.ok((stopped.checkpoint?.bytes ?? 0) > 32 << 20, `the state says memory is kept: ${JSON.stringify(stopped)}`);
  const paths = podPaths(root, 'rmem1');
  assert.equal((await stat(paths.dir)).mode & 0o777, 0o700, 'the pod dir keeps everyone out');
  const image = await stat(paths.checkpoint);
  assert.equal(image.mode & 0o777, 0o750, 'the memory image: root\'s, readable by the pod\'s own root group only');
  assert.equal(image.uid, 0);
  assert.ok(image.gid >= 1 << 20, `the group is the pod's root, in its own id range: ${String(image.gid)}`);
  const meta = await readMeta('rmem1');
  assert.equal(meta.criuVersion, '4.1.1');
  assert.equal(meta.runscVersion, undefined);
  assert.ok(meta.files.some((f) => /^pages-\d+\.img$/.test(f.name) && f.sha256 === undefined && f.bytes >= 32 << 20), JSON.stringify(meta.files));
  assert.ok(meta.files.some((f) => f.name === 'inventory.img' && typeof f.sha256 === 'string'), JSON.stringify(meta.files));

  const woken = await startedReady(req);
  assert.equal(woken.restoreFailure, undefined);
  assert.equal(woken.ip, before.ip, 'the pod keeps its address');
  assert.deepEqual(await count(woken), { token, n: 4 }, 'the same process, its memory as it was');
  assert.equal(await sh('rmem1', 'cat /home/user/kept.txt'), 'kept\n');
  assert.equal(existsSync(paths.checkpoint), false, 'a restored image is deleted: it must never be restored twice');
  // A restored pod is saved and restored again.
  await rt.stop('rmem1', { memory: true });
  assert.deepEqual(await count(await startedReady(req)), { token, n: 5 });
  // A plain stop keeps files only: the counter starts again.
  await rt.stop('rmem1');
  const fresh = await count(await startedReady(req));
  assert.notEqual(fresh.token, token);
  assert.equal(fresh.n, 1);
  await rt.remove('rmem1');
});

test('processes started through the runtime (a background server, a terminal) survive a stop with memory on runc: their handles attach to them again', () => handlesSurviveAStop(fixture.rt, counterPod('rckagent')));

test('a damaged runc checkpoint is not restored: the pod starts fresh from its files and says why', async () => {
  const rt = fixture.rt;
  const req = counterPod('rbad1');
  const { token } = await countedAndPaused(req);
  const image = join(podPaths(root, 'rbad1').checkpoint, 'inventory.img');
  const bytes = await readFile(image);
  bytes[bytes.length >> 1] = (bytes[bytes.length >> 1] ?? 0) ^ 0xff;
  await writeFile(image, bytes);
  const woken = await startedReady(req);
  assert.match(woken.restoreFailure ?? '', /cannot be restored.*inventory\.img is damaged/);
  const now = await count(woken);
  assert.notEqual(now.token, token);
  assert.equal(now.n, 1);
  assert.equal(await sh('rbad1', 'cat /home/user/kept.txt'), 'kept\n', 'the files are as they were');
  assert.equal(existsSync(podPaths(root, 'rbad1').checkpoint), false);
  await rt.stop('rbad1');
  assert.equal((await startedReady(req)).restoreFailure, undefined, 'said for that start only');
  await rt.remove('rbad1');
});

test('an image CRIU itself refuses to restore: the shim starts the pod fresh, with its network, and CRIU\'s reason is the restore failure', async () => {
  const rt = fixture.rt;
  const req = counterPod('rfail1');
  const { before } = await countedAndPaused(req);
  // Damaged in a way our checks cannot see: the metadata is made to agree with the missing process image.
  const dir = podPaths(root, 'rfail1').checkpoint;
  const meta = await readMeta('rfail1');
  const core = meta.files.find((f) => /^core-\d+\.img$/.test(f.name));
  assert.ok(core !== undefined, JSON.stringify(meta.files));
  await writeFile(join(dir, core.name), '');
  meta.files = meta.files.map((f) => (f.name === core.name ? { name: f.name, bytes: 0, sha256: 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855' } : f));
  await writeMeta('rfail1', meta);
  const woken = await startedReady(req);
  assert.match(woken.restoreFailure ?? '', /^CRIU could not restore the memory checkpoint, so the pod started from its files: .*criu failed: type RESTORE.*Error \(/);
  assert.equal(woken.ip, before.ip);
  assert.equal((await count(woken)).n, 1, 'a fresh process, reachable at its address');
  assert.equal(existsSync(dir), false);
  await rt.remove('rfail1');
});

test('a save CRIU refuses (a process holds a file lock) leaves the runc pod running, thawed, with no image left; a save after it works', async () => {
  const rt = fixture.rt;
  const req = counterPod('rlock1');
  const before = await startedReady(req);
  assert.equal((await count(before)).n, 1);
  const locker = await rt.spawn('rlock1', { command: ['python3', '-c', 'import fcntl, sys, time\nf = open("/tmp/lock", "w")\nfcntl.flock(f, fcntl.LOCK_EX)\nprint("locked", flush=True)\ntime.sleep(1000)'] });
  const reader = locker.stdout[Symbol.asyncIterator]();
  assert.match(Buffer.from((await reader.next()).value as Uint8Array).toString(), /locked/);
  await assert.rejects(rt.stop('rlock1', { memory: true }), (err) => isAsbError(err, 'CheckpointFailed') && /runc checkpoint: .*criu failed.*file locks|runc checkpoint: .*Some file locks/.test(err.message) && /keeps running/.test(err.message));
  assert.equal(rt.state('rlock1').phase, 'Running');
  assert.equal((await count(before)).n, 2, 'thawed: the same process answers');
  const paths = podPaths(root, 'rlock1');
  assert.equal(existsSync(paths.checkpoint) || existsSync(paths.checkpointPartial), false);
  locker.kill('SIGKILL');
  await locker.exited;
  await rt.stop('rlock1', { memory: true });
  assert.equal((await count(await startedReady(req))).n, 3);
  await rt.remove('rlock1');
});

test('a save that would pass the runc pod\'s ephemeral-storage is refused: the pod keeps running and nothing of the image is left', () => saveOverItsDiskIsRefused(fixture.rt, root, 'runc', 'rfull1'));

/** The host uid owning the user namespace of a host pid (ioctl NS_GET_OWNER_UID). */
async function usernsOwner(pid: number): Promise<number> {
  const { stdout } = await promisify(execFile)('python3', ['-c', `import fcntl, os, struct\nfd = os.open("/proc/${String(pid)}/ns/user", os.O_RDONLY)\nb = bytearray(4)\nfcntl.ioctl(fd, 0xb704, b)\nprint(struct.unpack("I", b)[0])`]);
  return Number(stdout.trim());
}

test('a runc pod in its shim\'s own user namespace refuses a stop with memory, saying how to get it, and keeps running; a checkpointable one runs in a namespace runc made', async () => {
  const rt = fixture.rt;
  const req = counterPod('rplain1', { checkpointable: false });
  const before = await startedReady(req);
  assert.equal((await count(before)).n, 1);
  const uidMap = (await readFile(`/proc/${String(before.pid ?? 0)}/uid_map`, 'utf8')).trim().split(/\s+/);
  assert.equal(await usernsOwner(before.pid ?? 0), Number(uidMap[1]), 'owned by the range\'s first host id: per-user counts are the sandbox\'s own');
  await assert.rejects(rt.stop('rplain1', { memory: true }), (err) => isAsbError(err, 'NotImplemented') && /suspensionStrategy: Hibernate/.test(err.message) && /keeps running/.test(err.message));
  assert.equal(rt.state('rplain1').phase, 'Running');
  assert.equal((await count(before)).n, 2, 'the same process answers');
  await rt.stop('rplain1');
  await assert.rejects(rt.stop('rplain1', { memory: true }), (err) => isAsbError(err, 'SandboxNotRunning'));
  await rt.remove('rplain1');

  const kept = await startedReady(counterPod('rckpt1'));
  assert.equal(await usernsOwner(kept.pid ?? 0), 0, 'runc made it: CRIU can checkpoint it (its per-user counts are host root\'s)');
  await rt.remove('rckpt1');
});

test('a stop with memory answers once every process is killed, while the pod\'s end goes on: a snapshot and a remove made at once wait for it, and nothing is left', async () => {
  const rt = fixture.rt;
  const req = counterPod('rnow1');
  await countedAndPaused(req);
  assert.equal(rt.state('rnow1').phase, 'Stopped');
  // At once, with no wait: the snapshot copies the memory image and the disk the shim leaves.
  const snap = await rt.snapshot('rnow1', 'rnow-snap', { memory: true });
  assert.equal(snap.memory, true);
  assert.ok(snap.memoryBytes > 0);
  await rt.remove('rnow1');
  const paths = podPaths(root, 'rnow1');
  assert.equal(existsSync(paths.dir), false, 'the pod dir went, after its shim unmounted the disk');
  const mounts = await readFile('/proc/self/mountinfo', 'utf8');
  assert.deepEqual(mounts.split('\n').filter((l) => l.includes('/rnow1/') || l.endsWith('/rnow1')), [], 'no mount of the pod is left');
  await rt.deleteSnapshot('rnow-snap');
});

test('in a process held open by nothing but the runtime, a start right after a stop with memory waits for the teardown and restores the pod, with no other handle keeping the process up', async () => {
  const child = join(import.meta.dirname, 'fixtures', 'memory-stop-child.ts');
  const { stdout } = await promisify(execFile)(process.execPath, [child, 'asbrx0', '10.236.64.0/18'], { timeout: 120_000 });
  const { first, second } = JSON.parse(stdout) as { first: { token: string; n: number }; second: { token: string; n: number } };
  assert.deepEqual(second, { token: first.token, n: first.n + 1 }, 'the same process, its memory as it was');
});

test('a kept runc checkpoint outlives the worker: a new runtime on the same root restores it; remove() deletes it with the pod', async () => {
  const req = counterPod('ragain1');
  const { token } = await countedAndPaused(req);
  const rt2 = await createLocalRuntime({ root, log: silentLogger(), images: await testImageStore(), bridge: BRIDGE, subnet: SUBNET, pollIntervalMs: 100, criu: findCriuBinary(process.env.ASB_CRIU_DIR ?? DEFAULT_CRIU_DIR) });
  try {
    assert.deepEqual(rt2.state('ragain1').checkpoint, fixture.rt.state('ragain1').checkpoint);
    const woken = await rt2.start(req);
    assert.equal(woken.phase, 'Running', JSON.stringify(woken));
    assert.equal(woken.restoreFailure, undefined);
    for (let i = 0; i < 200 && !rt2.state('ragain1').ready; i++) await new Promise((resolve) => setTimeout(resolve, 50));
    assert.deepEqual(await count(woken), { token, n: 4 });
    await rt2.stop('ragain1', { memory: true });
    const paths = podPaths(root, 'ragain1');
    assert.ok((await readdir(paths.checkpoint)).length > 0);
    await rt2.remove('ragain1');
    assert.equal(existsSync(paths.dir), false);
  } finally {
    await rt2.close();
  }
});

test('a checkpointable runc pod with a volume keeps its memory and the volume\'s files', async () => {
  const rt = fixture.rt;
  const req = counterPod('rvol1', { container: { volumeMounts: [{ name: 'data', mountPath: '/data' }] } });
  req.spec.volumes = [{ name: 'data', emptyDir: {} }];
  const before = await startedReady(req);
  const first = await count(before);
  await sh('rvol1', 'echo in-volume > /data/v.txt');
  await rt.stop('rvol1', { memory: true });
  const woken = await startedReady(req);
  assert.equal(woken.restoreFailure, undefined);
  assert.deepEqual(await count(woken), { token: first.token, n: 2 });
  assert.equal(await sh('rvol1', 'cat /data/v.txt; echo more >> /data/v.txt; cat /data/v.txt | wc -l'), 'in-volume\n2\n');
  // Its /etc files and the disk's bind for the volume lie under its mount dir: gone with it.
  const mountDir = join('/run/asb/rootfs', createHash('sha256').update(resolve(root)).digest('hex').slice(0, 12), 'rvol1');
  assert.equal(existsSync(join(mountDir, 'etc', 'hostname')), true);
  await rt.remove('rvol1');
  assert.equal(existsSync(mountDir), false);
});
