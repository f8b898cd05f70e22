// The per-sandbox disk cap with REAL sandboxes: `ephemeral-storage` sizes a sparse ext4 image per
// pod that holds its writable layer, its volumes and its log; a write past it fails with ENOSPC and
// a pod whose disk stays full is evicted as the kubelet evicts it. Needs root (as in CI). Its own
// bridge and subnet (asbdk0, 10.230.0.0/16).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { chown, mkdir, readdir, readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { Container } from '../src/api/types.ts';
import { evictionMessage, podDisk } from '../src/runtime/local/disk.ts';
import { createLocalRuntime, type LocalRuntime } from '../src/runtime/local/local-runtime.ts';
import { podPaths } from '../src/runtime/local/rootfs.ts';
import type { PodRequest, PodState } from '../src/runtime/runtime.ts';
import { silentLogger } from '../src/base/log.ts';
import { testImageStore } from './support/test-images.ts';
import { waitForPodState } from './support/pod-state.ts';
import { startTestRuntime, stopTestRuntime, type TestRuntime } from './support/test-runtime.ts';

const waitForState = (id: string, pred: (s: PodState) => boolean, what: string): Promise<PodState> => waitForPodState(rt, id, pred, what);

const BRIDGE = 'asbdk0';
const SUBNET = '10.230.0.0/16';
const MiB = 2 ** 20;
let root = '';
let rt: LocalRuntime;

let fixture: TestRuntime;

before(async () => {
  fixture = await startTestRuntime('asb-disk-', BRIDGE, SUBNET, { pollIntervalMs: 100 });
  ({ root, rt } = fixture);
});

after(() => stopTestRuntime(fixture));

function pod(id: string, container: Partial<Container> = {}): PodRequest {
  return { id, uid: `uid-${id}`, namespace: 'default', hostname: id, spec: { containers: [{ name: 'main', image: 'agent-sandbox/base', ...container }] } };
}

const limit = (quantity: string): Partial<Container> => ({ resources: { limits: { 'ephemeral-storage': quantity } } });

async function sh(id: string, script: string, runtime: LocalRuntime = rt): Promise<{ exitCode: number; out: string; err: string }> {
  const r = await runtime.exec(id, { command: ['sh', '-c', script] });
  return { exitCode: r.exitCode, out: Buffer.from(r.stdout).toString(), err: Buffer.from(r.stderr).toString() };
}

/** `df -k` of paths in the pod: their filesystems' sizes in KiB. */
async function dfSizes(id: string, paths: string, runtime: LocalRuntime = rt): Promise<number[]> {
  const df = await sh(id, `df -Pk ${paths} | tail -n +2`, runtime);
  assert.equal(df.exitCode, 0, df.err);
  return df.out.trim().split('\n').map((line) => Number(line.split(/\s+/)[1]));
}


/** What `losetup -a` lists, from the sysfs it reads: loop devices whose file is under `under`. */
async function loopDevices(under: string): Promise<string[]> {
  const found: string[] = [];
  for (const dev of (await readdir('/sys/block')).filter((d) => d.startsWith('loop'))) {
    const file = await readFile(`/sys/block/${dev}/loop/backing_file`, 'utf8').catch(() => '');
    if (file.startsWith(`${under}/`)) found.push(`${dev}: ${file.trim()}`);
  }
  return found;
}

async function diskMounted(id: string): Promise<boolean> {
  const mountPoint = ` ${join(root, 'pods', id, 'disk')} `;
  return (await readFile('/proc/self/mountinfo', 'utf8')).split('\n').some((line) => line.includes(mountPoint));
}

/** Bytes the host's filesystem gives a file (a sparse image: what was written). */
async function allocated(path: string): Promise<number> {
  return (await stat(path)).blocks * 512;
}

/**
 * The pod's disk is gone from the host's mounts and its loop device is freed. AUTOCLEAR frees it
 * when the filesystem goes, which a mount namespace cloned meanwhile (any container being created
 * on this host) may delay by a few milliseconds: polled, for at most 5 s.
 */
async function assertReleased(id: string): Promise<void> {
  assert.equal(await diskMounted(id), false, 'the disk is unmounted');
  const dir = join(root, 'pods', id);
  let loops = await loopDevices(dir);
  for (let i = 0; i < 250 && loops.length > 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 20));
    loops = await loopDevices(dir);
  }
  assert.deepEqual(loops, [], 'no loop device of this pod is left');
}

test('the disk size: the containers\' limits added up (the kubelet\'s pod total), else 10Gi; whole 4 KiB blocks', () => {
  const spec = (...limits: (string | number | undefined)[]): PodRequest['spec'] => ({
    containers: limits.map((l, i) => ({ name: `c${String(i)}`, ...(l === undefined ? {} : { resources: { limits: { 'ephemeral-storage': l } } }) })),
  });
  assert.deepEqual(podDisk(spec(undefined)), { bytes: 10 * 2 ** 30, limit: '10Gi' });
  assert.deepEqual(podDisk(spec('64Mi')), { bytes: 64 * MiB, limit: '64Mi' });
  assert.deepEqual(podDisk(spec('1Gi', undefined, '512Mi')), { bytes: 1.5 * 2 ** 30, limit: '1536Mi' });
  assert.deepEqual(podDisk(spec('100M')), { bytes: 100_003_840, limit: '100M' });
  assert.deepEqual(podDisk(spec(2 ** 25)), { bytes: 32 * MiB, limit: String(2 ** 25) });
  assert.throws(() => podDisk(spec('15Mi')), /resources\.limits\.ephemeral-storage must be at least 16Mi/);
  assert.throws(() => podDisk(spec('1Gi', 'x')), /containers\[1\]\.resources\.limits\.ephemeral-storage must be a quantity/);
  assert.equal(evictionMessage(spec('1Gi')), 'Pod ephemeral local storage usage exceeds the total limit of containers 1Gi.');
});

test('a disk fill stops at ephemeral-storage: the writable layer and the volumes share one cap, and the host holds no more than it', async () => {
  const req = pod('cap1', { ...limit('64Mi'), command: ['sleep', 'infinity'], volumeMounts: [{ name: 'data', mountPath: '/data' }, { name: 'scratch', mountPath: '/scratch' }] });
  req.spec.volumes = [{ name: 'scratch', emptyDir: {} }];
  req.volumeClaimTemplates = [{ metadata: { name: 'data' }, spec: {} }];
  const started = await rt.start(req);
  assert.equal(started.phase, 'Running', started.message);
  for (const size of await dfSizes('cap1', '/ /data /scratch')) assert.ok(size > 40 * 1024 && size <= 64 * 1024, `each is the 64 MiB disk, df says ${String(size)} KiB`);
  assert.equal((await sh('cap1', 'dd if=/dev/zero of=/data/a bs=1M count=20 && dd if=/dev/zero of=/scratch/b bs=1M count=20')).exitCode, 0);
  // One exec: the pod is evicted a second or two after its disk fills (next test).
  const fill = await sh('cap1', 'dd if=/dev/zero of=/home/user/big bs=1M count=100; echo "dd=$?"; stat -c %s /data/a /scratch/b /home/user/big');
  assert.match(fill.err, /No space left on device/);
  const [ddLine = '', ...sizes] = fill.out.trim().split('\n');
  assert.equal(ddLine, 'dd=1');
  const total = sizes.reduce((sum, s) => sum + Number(s), 0);
  assert.ok(total > 40 * MiB && total <= 64 * MiB, `the volumes and the layer together hold at most 64 MiB, got ${String(total)} bytes`);
  const image = podPaths(root, 'cap1').disk?.image ?? '';
  assert.ok((await allocated(image)) <= 64 * MiB, 'the host gives the pod no more than its limit');
});

test('a pod whose disk stays full is evicted, with the kubelet\'s reason and message, and its disk is released', async () => {
  const evicted = await waitForState('cap1', (s) => s.phase === 'Failed', 'evicted');
  assert.deepEqual([evicted.reason, evicted.exitCode, evicted.message], ['Evicted', 137, 'Pod ephemeral local storage usage exceeds the total limit of containers 64Mi.']);
  await assertReleased('cap1');
  assert.ok((await allocated(podPaths(root, 'cap1').disk?.image ?? '')) <= 64 * MiB);
});

test('the container log is on the disk too: a pod that prints without end is evicted instead of filling the host', async () => {
  // Bounded (200 MB), so the same test on a runtime without the cap ends too: the pod then runs on.
  const started = await rt.start(pod('log1', { ...limit('32Mi'), command: ['sh', '-c', 'head -c 200000000 /dev/zero; sleep infinity'] }));
  assert.equal(started.phase, 'Running', started.message);
  const evicted = await waitForState('log1', (s) => s.phase === 'Failed', 'evicted');
  assert.equal(evicted.reason, 'Evicted');
  assert.equal(evicted.message, 'Pod ephemeral local storage usage exceeds the total limit of containers 32Mi.');
  let bytes = 0;
  for (const entry of await readdir(join(root, 'pods', 'log1'))) bytes += await allocated(join(root, 'pods', 'log1', entry)).catch(() => 0); // state.json.tmp comes and goes
  assert.ok(bytes <= 33 * MiB, `the pod dir holds ${String(bytes)} bytes`);
});

test('without a limit the disk is 10 GiB, sparse; files and volumes survive hibernation, and a hibernated pod holds no mount or loop device', async () => {
  const req = pod('hib1', { command: ['sleep', 'infinity'], volumeMounts: [{ name: 'data', mountPath: '/data' }, { name: 'scratch', mountPath: '/scratch' }] });
  req.spec.volumes = [{ name: 'scratch', emptyDir: {} }];
  req.volumeClaimTemplates = [{ metadata: { name: 'data' }, spec: {} }];
  assert.equal((await rt.start(req)).phase, 'Running');
  const [size = 0] = await dfSizes('hib1', '/');
  assert.ok(size > 9.5 * 2 ** 20 && size <= 10 * 2 ** 20, `df says ${String(size)} KiB`);
  assert.equal((await sh('hib1', 'echo home > ~/h && echo data > /data/d && echo scratch > /scratch/s && echo tmp > /tmp/t')).exitCode, 0);
  const image = podPaths(root, 'hib1').disk?.image ?? '';
  assert.ok((await allocated(image)) < 64 * MiB, `a new 10 GiB disk costs the host its metadata, here ${String(await allocated(image))} bytes`);
  await rt.stop('hib1');
  await assertReleased('hib1');
  assert.equal((await rt.start(req)).phase, 'Running');
  assert.equal((await sh('hib1', 'cat ~/h /data/d /scratch/s /tmp/t')).out, 'home\ndata\nscratch\ntmp\n');
});

test('a wake while another mount namespace still holds the old mount reuses its loop device: never two ext4s over one image', async (t) => {
  assert.equal((await rt.start(pod('ns1', { command: ['sleep', 'infinity'] }))).phase, 'Running');
  await sh('ns1', 'echo before > ~/f');
  // A namespace cloned while the disk is mounted, as every `runc create` makes one until its pivot_root.
  const holder = spawn('unshare', ['-m', '--propagation', 'private', 'sh', '-c', 'echo ready; exec sleep 60'], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.after(() => holder.kill('SIGKILL'));
  await once(holder.stdout, 'data');
  await rt.stop('ns1');
  const dir = join(root, 'pods', 'ns1');
  const held = await loopDevices(dir);
  assert.equal(held.length, 1, 'the copy keeps the device bound');
  assert.equal((await rt.start(pod('ns1', { command: ['sleep', 'infinity'] }))).phase, 'Running');
  assert.deepEqual(await loopDevices(dir), held, 'the same device, not a second one');
  const appended = await sh('ns1', 'cat ~/f && echo after >> ~/f && cat ~/f');
  assert.equal(appended.out, 'before\nbefore\nafter\n', appended.err);
  holder.kill('SIGKILL');
  await once(holder, 'exit');
  await rt.stop('ns1');
  await assertReleased('ns1');
});

test('every pod\'s disk is its own copy of an empty one: what one pod wrote, and the space it used, is not on the next pod\'s disk of the same size', async () => {
  const size = limit('48Mi');
  assert.equal((await rt.start(pod('own1', { ...size, command: ['sleep', 'infinity'] }))).phase, 'Running');
  const wrote = await sh('own1', 'echo secret > /home/user/left && dd if=/dev/urandom of=/home/user/fill bs=1M count=24 2>/dev/null; df -Pk / | tail -1');
  assert.equal(wrote.exitCode, 0, wrote.err);
  assert.equal((await rt.start(pod('own2', { ...size, command: ['sleep', 'infinity'] }))).phase, 'Running');
  const seen = await sh('own2', 'ls /home/user; df -Pk / | tail -1');
  assert.doesNotMatch(seen.out, /left|fill/, 'the second pod sees none of the first pod\'s files');
  const used = (df: string): number => Number(df.trim().split('\n').at(-1)?.split(/\s+/)[2]);
  assert.ok(used(wrote.out) >= 24 * 1024, `the first pod used its 24 MiB, df says ${String(used(wrote.out))} KiB`);
  assert.ok(used(seen.out) < 4 * 1024, `the second pod's disk starts empty, df says ${String(used(seen.out))} KiB used`);
  // Writing on one disk (and rewriting on the next) leaves the empty disk they were copied from empty.
  for (const file of await readdir(join(root, 'disk-templates'))) assert.ok((await allocated(join(root, 'disk-templates', file))) < 8 * MiB, `${file} holds only mkfs's metadata`);
  await Promise.all([rt.remove('own1'), rt.remove('own2')]);
});

test('remove deletes the disk image and leaves no mount or loop device', async () => {
  assert.equal((await rt.start(pod('rm1', { command: ['sleep', 'infinity'] }))).phase, 'Running');
  assert.equal(await diskMounted('rm1'), true);
  await rt.remove('rm1');
  assert.equal(existsSync(join(root, 'pods', 'rm1')), false);
  await assertReleased('rm1');
});

test('a start that fails after the disk is mounted unmounts it again', async () => {
  const req = pod('bad1', { command: ['sleep', 'infinity'], volumeMounts: [{ name: 'x', mountPath: '/x' }] });
  req.spec.volumes = [{ name: 'x', persistentVolumeClaim: { claimName: 'not-mine' } }];
  const state = await rt.start(req);
  assert.equal(state.phase, 'Failed');
  await assertReleased('bad1');
  await rt.remove('bad1');
});

test('an ephemeral-storage that cannot be a disk fails the pod, naming the field, before anything is made', async () => {
  for (const [id, quantity] of [['small1', '1Mi'], ['junk1', 'lots']] as const) {
    const state = await rt.start(pod(id, limit(quantity)));
    assert.equal(state.phase, 'Failed');
    assert.equal(state.reason, 'CreateContainerConfigError');
    assert.match(state.message ?? '', /resources\.limits\.ephemeral-storage/);
    assert.equal(existsSync(join(root, 'pods', id, 'disk.img')), false);
    await rt.remove(id);
  }
});

test('a new runtime on the same root re-adopts a running pod with its disk, and releases the disk when the pod ends', async () => {
  assert.equal((await rt.start(pod('adopt1', { ...limit('128Mi'), command: ['sleep', 'infinity'] }))).phase, 'Running');
  await sh('adopt1', 'echo kept > ~/f');
  const rt2 = await createLocalRuntime({ root, log: silentLogger(), images: await testImageStore(), bridge: BRIDGE, subnet: SUBNET, pollIntervalMs: 100 });
  try {
    assert.equal(rt2.state('adopt1').phase, 'Running');
    assert.equal((await sh('adopt1', 'cat ~/f', rt2)).out, 'kept\n');
    const [size = 0] = await dfSizes('adopt1', '/', rt2);
    assert.ok(size > 100 * 1024 && size <= 128 * 1024, `still the 128 MiB disk, df says ${String(size)} KiB`);
    await rt2.stop('adopt1');
    assert.equal(rt2.state('adopt1').phase, 'Stopped');
    await assertReleased('adopt1');
  } finally {
    await rt2.close();
  }
});

test('a pod dir made before disks (upper/ and no disk.img) wakes with its plain directories and volumes', async () => {
  const id = 'old1';
  const dir = join(root, 'pods', id);
  // As the runtime made them before: the layer's root owned by the sandbox's root (host uid
  // 100000), its user's files by host uid 101000; claim volumes under <root>/volumes/<id>.
  await mkdir(join(dir, 'upper'), { recursive: true, mode: 0o755 });
  await chown(join(dir, 'upper'), 100_000, 100_000);
  await writeFile(join(dir, 'upper', 'old.txt'), 'from before\n');
  await chown(join(dir, 'upper', 'old.txt'), 101_000, 101_000);
  await mkdir(join(root, 'volumes', id, 'data'), { recursive: true });
  await writeFile(join(root, 'volumes', id, 'data', 'f'), 'old volume\n');
  await chown(join(root, 'volumes', id, 'data'), 101_000, 101_000);
  const req = pod(id, { command: ['sleep', 'infinity'], volumeMounts: [{ name: 'data', mountPath: '/data' }] });
  req.volumeClaimTemplates = [{ metadata: { name: 'data' }, spec: {} }];
  const state = await rt.start(req);
  assert.equal(state.phase, 'Running', state.message);
  assert.equal((await sh(id, 'cat /old.txt /data/f')).out, 'from before\nold volume\n');
  assert.equal(existsSync(join(dir, 'disk.img')), false, 'no disk is made under its files');
  await rt.remove(id);
  assert.equal(existsSync(join(root, 'volumes', id)), false, 'remove deletes its old volumes');
});

test('after remove of every pod, none of this runtime\'s loop devices is left', async () => {
  for (const id of rt.list()) await rt.remove(id);
  assert.deepEqual(await loopDevices(root), []);
});
