// Image GC for real: a cache of its own (never the tests' shared one under .tools/images/cache,
// which every other test file's sandboxes use), filled from the tests' registry, a real local
// runtime whose pods pin what they run, and GC run by ANOTHER ImageStore on the same cache (as the
// second worker of `make up` would): an unused image goes, blobs and tree; a running or hibernated
// pod's image stays and the pod keeps working and wakes; a deleted pod's image goes; a pin whose pod
// dir vanished (its worker killed before it unpinned) is reclaimed. Needs root, as the runtime.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, renameSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { after, before, test } from 'node:test';
import { Registry } from 'prom-client';
import { startImageGc } from '../src/images/gc-loop.ts';
import { collectGarbage } from '../src/images/image-gc.ts';
import { runTool, UMOCI } from '../src/images/tool.ts';
import { systemClock } from '../src/base/clock.ts';
import { ImageStore } from '../src/images/image-store.ts';
import { mirrorConfig } from '../src/images/local-registry.ts';
import { parseRegistriesConfig } from '../src/images/registries.ts';
import { createMetrics } from '../src/metrics/metrics.ts';
import { createLocalRuntime, type LocalRuntime } from '../src/runtime/local/local-runtime.ts';
import { podPaths, readPersisted } from '../src/runtime/local/rootfs.ts';
import type { PodRequest } from '../src/runtime/runtime.ts';
import { silentLogger } from '../src/base/log.ts';
import { testImages } from './support/test-images.ts';
import { startTestRuntime, stopTestRuntime, type TestRuntime } from './support/test-runtime.ts';

const BRIDGE = 'asbgc0';
const SUBNET = '10.218.0.0/16';
const BUSYBOX = 'docker.io/library/busybox:latest';
const DEBIAN = 'docker.io/library/debian:12';

let cache = '';
let registries: ReturnType<typeof parseRegistriesConfig>;
let store: ImageStore;
let fixture: TestRuntime;
let rt: LocalRuntime;

/** Another process's view of the same cache: nothing shared in memory with `store`. */
const otherWorker = (): ImageStore => new ImageStore({ root: cache, registries, logger: silentLogger() });

before(async () => {
  cache = mkdtempSync(join(tmpdir(), 'asb-gc-cache-'));
  registries = parseRegistriesConfig(mirrorConfig((await testImages()).address));
  store = new ImageStore({ root: cache, registries, logger: silentLogger() });
  fixture = await startTestRuntime('asb-gc-', BRIDGE, SUBNET, { images: store });
  rt = fixture.rt;
});

after(async () => {
  await stopTestRuntime(fixture);
  rmSync(cache, { recursive: true, force: true });
});

function pod(id: string): PodRequest {
  return { id, uid: `uid-${id}`, namespace: 'default', hostname: id, spec: { containers: [{ name: 'main', image: 'busybox', command: ['sleep', '3600'] }] } };
}

async function sh(id: string, script: string): Promise<string> {
  const r = await rt.exec(id, { command: ['sh', '-c', script] });
  assert.equal(r.exitCode, 0, Buffer.from(r.stderr).toString());
  return Buffer.from(r.stdout).toString();
}

const blobs = (): string[] => (existsSync(join(cache, 'oci/blobs/sha256')) ? readdirSync(join(cache, 'oci/blobs/sha256')) : []);
const trees = (): string[] => readdirSync(join(cache, 'rootfs')).sort();
const digestHex = (digest: string): string => digest.split(':')[1] ?? '';

test('GC removes the image no pod uses, keeps a running and a hibernated pod\'s image (the pod works and wakes), and removes it once the pod is deleted', async () => {
  const started = await rt.start(pod('gc1'));
  assert.equal(started.phase, 'Running', JSON.stringify(started));
  await sh('gc1', 'echo kept > /tmp/mark');
  const persisted = await readPersisted(podPaths(fixture.root, 'gc1'));
  const ran = persisted?.image;
  assert.ok(ran !== undefined);
  const busyTree = basename(dirname(ran.rootfs));
  const debian = await store.pull('debian:12');
  const debianTree = basename(dirname(debian.rootfs));
  assert.deepEqual(trees(), [busyTree, debianTree].sort());
  assert.ok(blobs().includes(digestHex(debian.manifestDigest)));

  // Just pulled: within the grace (1 h by default), an image not started yet is not collected.
  assert.deepEqual((await otherWorker().gc()).removedImages, []);
  assert.ok(existsSync(debian.rootfs));

  const registry = new Registry();
  const metrics = createMetrics(registry);
  const loop = startImageGc({ images: otherWorker(), log: silentLogger(), intervalMs: 0, graceMs: 0, diskUsage: () => Promise.resolve(10), metrics });
  const result = await loop.runNow();
  await loop.close();
  assert.deepEqual(result?.removedImages, [DEBIAN]);
  assert.equal(result.removedRootfs, 1);
  assert.deepEqual(trees(), [busyTree]);
  assert.ok(!blobs().includes(digestHex(debian.manifestDigest)) && !blobs().includes(digestHex(debian.configDigest)), 'debian\'s manifest and config are gone');
  assert.ok(blobs().includes(digestHex(ran.manifestDigest)), 'busybox\'s manifest stays');
  assert.ok(result.treeBytes > 50_000_000, `debian's tree is ~133 MB, freed ${String(result.treeBytes)}`);
  assert.ok(result.blobBytes > 10_000_000, `debian's layer is ~42 MB, freed ${String(result.blobBytes)}`);
  const exposed = await registry.metrics();
  assert.match(exposed, /asb_image_gc_removed_total\{kind="image"\} 1\n/);
  assert.match(exposed, /asb_image_gc_removed_total\{kind="rootfs"\} 1\n/);
  assert.match(exposed, new RegExp(`asb_image_gc_freed_bytes_total ${String(result.blobBytes + result.treeBytes)}\\n`));
  // The pod runs on: its image's files and its own.
  assert.equal(await sh('gc1', 'cat /tmp/mark; test -x /bin/busybox && echo ok'), 'kept\nok\n');
  assert.equal(otherWorker().get('busybox')?.manifestDigest, ran.manifestDigest);

  // Hibernated (stopped, not deleted): still pinned; it wakes on the same bytes, its disk kept.
  await rt.stop('gc1');
  assert.equal(rt.state('gc1').phase, 'Stopped');
  assert.deepEqual((await otherWorker().gc({ graceMs: 0 })).removedImages, []);
  assert.deepEqual(trees(), [busyTree]);
  const woke = await rt.start(pod('gc1'));
  assert.equal(woke.phase, 'Running', JSON.stringify(woke));
  assert.equal(await sh('gc1', 'cat /tmp/mark'), 'kept\n');
  assert.equal((await readPersisted(podPaths(fixture.root, 'gc1')))?.image?.manifestDigest, ran.manifestDigest);

  // Deleted: nothing uses it, and it goes whole.
  await rt.remove('gc1');
  const last = await otherWorker().gc({ graceMs: 0 });
  assert.deepEqual(last.removedImages, [BUSYBOX]);
  assert.deepEqual(trees(), []);
  assert.deepEqual(blobs(), []);
  assert.deepEqual(readdirSync(join(cache, 'pins')), []);
});

test('pods made before pins (or whose pins were lost) are pinned again when a runtime recovers them', async () => {
  assert.equal((await rt.start(pod('gc2'))).phase, 'Running');
  await rt.stop('gc2');
  for (const file of readdirSync(join(cache, 'pins'))) rmSync(join(cache, 'pins', file));
  const again = await createLocalRuntime({ root: fixture.root, log: silentLogger(), images: store, bridge: BRIDGE, subnet: SUBNET });
  await again.close();
  assert.deepEqual((await otherWorker().gc({ graceMs: 0 })).removedImages, []);
  const restarted = await rt.start(pod('gc2'));
  assert.equal(restarted.phase, 'Running', JSON.stringify(restarted));
  assert.match(await sh('gc2', 'busybox --help | head -1'), /BusyBox/);
  await rt.remove('gc2');
});

test('a pin whose pod dir is gone (its worker was killed before it unpinned) is reclaimed', async () => {
  const podDir = mkdtempSync(join(tmpdir(), 'asb-gc-pod-'));
  await store.pin(podDir, { reference: 'busybox' });
  const pulled = await store.pull('busybox');
  await store.pin(podDir, { reference: 'busybox', rootfs: pulled.rootfs });
  assert.equal(readdirSync(join(cache, 'pins')).length, 1, 'one pin file per pod, however often it pins');
  assert.deepEqual((await otherWorker().gc({ graceMs: 0 })).removedImages, []);
  // The pod dir goes with no unpin: what kill -9 between remove()'s two steps, or deleting a
  // dead worker's state dir, leaves.
  rmSync(podDir, { recursive: true });
  const result = await otherWorker().gc({ graceMs: 0 });
  assert.equal(result.stalePins, 1);
  assert.deepEqual(result.removedImages, [BUSYBOX]);
  assert.deepEqual(readdirSync(join(cache, 'pins')), []);
  assert.deepEqual(trees(), []);
});

test('the GC loop passes on its interval, and after a pull that leaves the disk over its threshold, with the short grace then', async (t) => {
  const podDir = mkdtempSync(join(tmpdir(), 'asb-gc-pod-'));
  await store.pin(podDir, { reference: 'busybox' });
  await store.pull('busybox');
  await store.pull('debian:12');
  const timers: { ms: number; fn: () => void }[] = [];
  const clock = { now: () => Date.now(), after: (ms: number, fn: () => void) => (timers.push({ ms, fn }), { cancel: () => undefined }) };
  let usage = 10;
  const registry = new Registry();
  const loop = startImageGc({ images: store, log: silentLogger(), clock, diskUsage: () => Promise.resolve(usage), pressureGraceMs: 0, metrics: createMetrics(registry) });
  t.after(() => loop.close());
  assert.deepEqual(timers.map((x) => x.ms), [600_000], 'every 10 min by default');
  timers.shift()?.fn();
  // Chained after the timer's pass: debian was just pulled, the 1 h grace keeps it.
  assert.deepEqual((await loop.runNow())?.removedImages, []);
  assert.match(await registry.metrics(), /asb_image_gc_runs_total\{result="ok"\} 2\n/);
  assert.deepEqual(timers.map((x) => x.ms), [600_000], 'the next pass is scheduled');
  // 90% full: the next pull triggers a pass that takes every unpinned image past the short grace.
  usage = 90;
  await store.pull('debian:bookworm');
  for (let i = 0; i < 250 && store.list().length > 1; i++) await new Promise((resolve) => setTimeout(resolve, 20));
  assert.deepEqual(store.list().map((x) => x.reference), [BUSYBOX]);
  rmSync(podDir, { recursive: true });
  await loop.close();
  assert.equal(await loop.runNow(), undefined, 'closed: no pass');
  await otherWorker().gc({ graceMs: 0 });
  assert.deepEqual(trees(), []);
});

test('a pod that pins while GC has its image out of reach gets it back whole; GC removes nothing it pinned', async () => {
  const pulled = await store.pull('busybox');
  const podDir = mkdtempSync(join(tmpdir(), 'asb-gc-pod-'));
  let seenDuring: unknown = 'not run';
  const result = await collectGarbage({
    root: cache, layout: join(cache, 'oci'), clock: systemClock, log: silentLogger(),
    umoci: async (args) => {
      await runTool(UMOCI, args, { timeoutMs: 60_000, clock: systemClock });
    },
    betweenScans: async () => {
      // The start's order (pod-start.ts, podImage): pin, then look the image up.
      await store.pin(podDir, { reference: 'busybox' });
      seenDuring = store.get('busybox');
    },
  }, new Set(), 0);
  assert.equal(seenDuring, undefined, 'out of reach while GC decided: a start then pulls again, behind the lock');
  assert.deepEqual(result.removedImages, []);
  assert.equal(store.get('busybox')?.manifestDigest, pulled.manifestDigest);
  assert.ok(existsSync(join(pulled.rootfs, 'bin/busybox')));
  // The start that missed it pulls, and finds it in place (no second unpack).
  assert.equal((await store.pull('busybox')).rootfs, pulled.rootfs);
  rmSync(podDir, { recursive: true });
  await otherWorker().gc({ graceMs: 0 });
  assert.deepEqual(trees(), []);
});

test('a GC killed mid-pass leaves what it had moved out of reach; the next pass puts it back before deciding, so a pinned tree survives', async () => {
  const podDir = mkdtempSync(join(tmpdir(), 'asb-gc-pod-'));
  await store.pin(podDir, { reference: 'busybox' });
  const pulled = await store.pull('busybox');
  const tree = basename(dirname(pulled.rootfs));
  const record = readdirSync(join(cache, 'images'))[0] ?? '';
  // What a pass killed between its move and its second read of the pins leaves behind.
  const dead = join(cache, 'tmp', 'gc-99999-dead');
  mkdirSync(join(dead, 'images'), { recursive: true });
  mkdirSync(join(dead, 'rootfs'));
  renameSync(join(cache, 'images', record), join(dead, 'images', record));
  renameSync(join(cache, 'rootfs', tree), join(dead, 'rootfs', tree));
  assert.deepEqual((await otherWorker().gc({ graceMs: 0 })).removedImages, []);
  assert.equal(store.get('busybox')?.manifestDigest, pulled.manifestDigest);
  assert.ok(existsSync(join(pulled.rootfs, 'bin/busybox')));
  assert.deepEqual(readdirSync(join(cache, 'tmp')), []);
  rmSync(podDir, { recursive: true });
  assert.deepEqual((await otherWorker().gc({ graceMs: 0 })).removedImages, [BUSYBOX]);
});
