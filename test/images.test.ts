// The local registry and the image cache, for real: Debian's docker-registry on a loopback port 0,
// seeded with the images scripts/build-images.sh built (make test builds them first; a worktree
// may point ASB_IMAGES_DIR elsewhere), pulled by Docker name through the docker.io mirror with
// skopeo, unpacked with umoci into the content-addressed cache, run once under the built runc
// (make runc), and collected (test/image-gc.test.ts: GC with real pods pinning their images).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { type AddressInfo } from 'node:net';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { isAsbError } from '../src/errors.ts';
import { ImageStore } from '../src/images/image-store.ts';
import { parseRegistriesConfig, type RegistriesConfig } from '../src/images/registries.ts';
import { RegistryProcess } from '../src/images/registry-process.ts';
import { readSeedImages, seedRegistry } from '../src/images/seed.ts';
import { DEFAULT_RUNC_DIR, findRuncBinary } from '../src/runtime/oci/runc-binary.ts';
import { silentLogger } from '../src/base/log.ts';

const SEED_DIR = process.env.ASB_IMAGES_DIR ?? resolve(import.meta.dirname, '../.tools/images');

function tempDir(t: test.TestContext, prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function startRegistry(t: test.TestContext): Promise<RegistryProcess> {
  const registry = new RegistryProcess({ stateDir: tempDir(t, 'asb-registry-'), logger: silentLogger() });
  t.after(() => registry.close());
  await registry.start();
  return registry;
}

/** The worker's view: docker.io is served by the local registry only (no way out from here). */
function mirrorOf(address: string): RegistriesConfig {
  return parseRegistriesConfig({ mirrors: { 'docker.io': { endpoints: [address], upstream: false } } });
}

/** Files and directories under dir (the cache's inode count). */
function countEntries(dir: string): number {
  // Walked by hand: a recursive readdir follows an image's absolute symlinks (base's /var/run →
  // /run) onto the host, and there into running sandboxes' root filesystems.
  let n = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    n++;
    if (entry.isDirectory()) n += countEntries(join(dir, entry.name));
  }
  return n;
}

let containers = 0;

/** Runs args in rootfs under the built runc (runc spec's defaults: new pid, net, ipc, uts and mount namespaces) as 1000:1000; resolves with stdout. */
async function runInRunc(t: test.TestContext, rootfs: string, args: string[]): Promise<string> {
  const runc = findRuncBinary(process.env.ASB_RUNC_DIR ?? DEFAULT_RUNC_DIR);
  const dir = tempDir(t, 'asb-runc-');
  const bundle = join(dir, 'bundle');
  const run = promisify(execFile);
  mkdirSync(bundle);
  await run(runc, ['spec', '--bundle', bundle]);
  const config = JSON.parse(readFileSync(join(bundle, 'config.json'), 'utf8')) as { root: unknown; process: Record<string, unknown>; linux: Record<string, unknown> };
  config.root = { path: rootfs, readonly: true };
  Object.assign(config.process, { terminal: false, args, user: { uid: 1000, gid: 1000 }, cwd: '/home/user', env: ['PATH=/usr/bin:/bin', 'HOME=/home/user'] });
  // One level, so runc removes it with the container.
  config.linux.cgroupsPath = `/asb-images-test-${process.pid}-${++containers}`;
  writeFileSync(join(bundle, 'config.json'), JSON.stringify(config));
  const { stdout } = await run(runc, ['--root', join(dir, 'state'), 'run', '--bundle', bundle, `images-test-${process.pid}-${containers}`], { timeout: 30_000 });
  return stdout;
}

test('the registry starts on a kernel-chosen loopback port, serves /v2/, and restarts on the same port', async (t) => {
  const registry = await startRegistry(t);
  assert.match(registry.address, /^127\.0\.0\.1:\d+$/);
  const res = await fetch(`http://${registry.address}/v2/`);
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('docker-distribution-api-version'), 'registry/2.0');
  await res.body?.cancel();
  // Loopback only: the config it was given says so.
  assert.match(readFileSync(registry.configPath, 'utf8'), /"addr": "127\.0\.0\.1:0"/);
  const before = registry.address;
  assert.equal(await registry.restart(), before);
  await registry.close();
  assert.equal(registry.running, false);
  await assert.rejects(fetch(`http://${before}/v2/`));
});

test('seeded images pull by Docker name, unpack once, share layers, and are collected when unused', async (t) => {
  const registry = await startRegistry(t);
  const seed = readSeedImages(SEED_DIR);
  const pushed = await seedRegistry(registry.address, seed, { tmpDir: tempDir(t, 'asb-seed-') });
  assert.ok(pushed.includes('agent-sandbox/base:latest') && pushed.includes('library/busybox:latest'), pushed.join(' '));

  const root = tempDir(t, 'asb-images-');
  const store = new ImageStore({ root, registries: mirrorOf(registry.address), logger: silentLogger() });

  // base: the built-in template's image, pulled by the name the template uses.
  const base = await store.pull('agent-sandbox/base');
  assert.equal(base.reference, 'docker.io/agent-sandbox/base:latest');
  assert.equal(base.source, registry.address);
  assert.equal(base.config.user, '1000:1000');
  assert.equal(base.config.workingDir, '/home/user');
  const rootfs = base.rootfs;
  for (const path of ['usr/bin/bash', 'usr/bin/python3', 'usr/bin/pip3', 'usr/bin/git', 'usr/bin/curl', 'usr/bin/ps', 'etc/ssl/certs/ca-certificates.crt']) {
    assert.ok(statSync(join(rootfs, path)).isFile(), `${path} in base`);
  }
  assert.match(readFileSync(join(rootfs, 'etc/debian_version'), 'utf8'), /^12\./);
  assert.match(readFileSync(join(rootfs, 'etc/passwd'), 'utf8'), /^user:x:1000:1000:/m);
  assert.equal(statSync(join(rootfs, 'home/user')).uid, 1000);

  // It runs: the built runc starts it from the cache (read-only root, no network), as the image's user.
  const ran = await runInRunc(t, base.rootfs, ['sh', '-c', 'id -u; python3 -c "import sys, pip; print(sys.version.split()[0])"; git --version; curl --version | head -1; cat /etc/debian_version']);
  assert.match(ran, /^1000\n3\.11\.\d+\ngit version 2\.\d+.*\ncurl 7\.\d+.*\n12\.\d+\n$/);

  // The same image again: nothing new on disk.
  const blobs = join(root, 'oci/blobs/sha256');
  const blobCount = readdirSync(blobs).length;
  const entries = countEntries(root);
  const again = await store.pull('docker.io/agent-sandbox/base:latest', { policy: 'Always' });
  assert.equal(again.manifestDigest, base.manifestDigest);
  assert.equal(readdirSync(blobs).length, blobCount);
  // Nothing new on disk; a temporary entry of the first pull may be gone by now (seen once, in a
  // fresh clone's first run: one entry fewer), which is not something the second pull added.
  const after = countEntries(root);
  assert.ok(after <= entries, `the second pull added ${after - entries} entries`);

  // python:3.11 is the same layer with Docker's root configuration: a new manifest and config
  // (2 blobs), the layer not fetched again, and no second unpacked tree.
  const python = await store.pull('python:3.11');
  assert.equal(python.reference, 'docker.io/library/python:3.11');
  assert.equal(python.config.user, undefined);
  assert.deepEqual(python.diffIds, base.diffIds);
  assert.equal(python.rootfs, base.rootfs);
  assert.equal(readdirSync(blobs).length, blobCount + 2);
  assert.equal(readdirSync(join(root, 'rootfs')).length, 1);
  // Same inode: one tree on disk, not a copy.
  assert.equal(statSync(join(python.rootfs, 'usr/bin/python3')).ino, statSync(join(base.rootfs, 'usr/bin/python3')).ino);

  // The small one.
  const busybox = await store.pull('busybox');
  assert.ok(statSync(join(busybox.rootfs, 'bin/busybox')).size > 500_000);
  assert.equal(readlinkSync(join(busybox.rootfs, 'bin/sh')), '/bin/busybox');
  assert.match(readFileSync(join(busybox.rootfs, 'etc/passwd'), 'utf8'), /^user:x:1000:1000:/m);
  assert.equal(busybox.config.user, undefined);
  assert.deepEqual(busybox.config.cmd, ['/bin/sh']);
  assert.equal(store.get('docker.io/library/busybox:latest')?.manifestDigest, busybox.manifestDigest);
  // The registry's own name for it: another reference, the same blobs and tree.
  const local = `localhost:${registry.address.split(':')[1] ?? ''}/library/busybox:latest`;
  const direct = await store.pull(local);
  assert.equal(direct.manifestDigest, busybox.manifestDigest);
  assert.equal(direct.rootfs, busybox.rootfs);
  assert.equal(readdirSync(join(root, 'rootfs')).length, 2);

  // For a sandbox that is root in a user namespace: a tree owned through the id map (its uid 0
  // is host uid 100000), beside the plain one; the blobs are not fetched again.
  const mapped = await store.pull('busybox', { idMap: { hostId: 100_000, size: 65_536 } });
  assert.notEqual(mapped.rootfs, busybox.rootfs);
  assert.equal(statSync(join(mapped.rootfs, 'bin/busybox')).uid, 100_000);
  assert.equal(statSync(join(mapped.rootfs, 'home/user')).uid, 101_000);
  assert.equal(statSync(join(busybox.rootfs, 'bin/busybox')).uid, 0);
  assert.equal(store.get('busybox', { hostId: 100_000, size: 65_536 })?.rootfs, mapped.rootfs);
  await assert.rejects(store.pull('busybox', { idMap: { hostId: 0, size: 65_536 } }), (err: unknown) => isAsbError(err, 'Invalid'));
  assert.equal(readdirSync(join(root, 'rootfs')).length, 3);

  // GC keeps what sandboxes use (base, by its short name) and removes the rest: python:3.11's
  // manifest and config go, its tree stays (base uses it), busybox goes whole (both its trees).
  const result = await store.gc({ keep: ['agent-sandbox/base'], graceMs: 0 });
  assert.deepEqual([...result.removedImages].sort(), ['docker.io/library/busybox:latest', 'docker.io/library/python:3.11', local]);
  assert.equal(result.removedRootfs, 2);
  assert.deepEqual(store.list().map((i) => i.reference), ['docker.io/agent-sandbox/base:latest']);
  assert.equal(readdirSync(blobs).length, blobCount);
  assert.ok(statSync(join(base.rootfs, 'usr/bin/python3')).isFile());
  assert.equal(store.get('busybox'), undefined);
  // Everything gone when nothing is kept.
  await store.gc({ graceMs: 0 });
  assert.equal(readdirSync(blobs).length, 0);
  assert.equal(readdirSync(join(root, 'rootfs')).length, 0);
});

test('an image that cannot be pulled fails fast with the image and the registry answer', async (t) => {
  const registry = await startRegistry(t);
  const store = new ImageStore({ root: tempDir(t, 'asb-images-'), registries: mirrorOf(registry.address), logger: silentLogger() });
  const started = Date.now();
  await assert.rejects(store.pull('python:3.12'), (err: unknown) => {
    assert.ok(isAsbError(err, 'NotFound'), String(err));
    assert.match(err.message, /image "python:3\.12" \(docker\.io\/library\/python:3\.12\) could not be pulled/);
    assert.ok(err.message.includes(`${registry.address} (mirror)`), err.message);
    assert.match(err.message, /manifest unknown|name unknown/);
    return true;
  });
  await assert.rejects(store.pull('no-such/image:v9'), (err: unknown) => {
    assert.ok(isAsbError(err, 'NotFound'));
    assert.ok(err.message.includes('no-such/image:v9') && err.message.includes('v9'), err.message);
    return true;
  });
  await assert.rejects(store.pull('Bad Name'), (err: unknown) => isAsbError(err, 'Invalid') && err.message.includes('"Bad Name"'));
  assert.ok(Date.now() - started < 15_000, 'a missing image is reported in seconds');

  // A registry that is not there: refused at once, named.
  await registry.close();
  await assert.rejects(store.pull('busybox:1'), (err: unknown) => {
    assert.ok(isAsbError(err, 'Unavailable'), String(err));
    assert.ok(err.message.includes(registry.address) && /connection refused/.test(err.message), err.message);
    return true;
  });
});

test('a registry that accepts but never answers is given up at the deadline, not waited on', async (t) => {
  // A loopback server that reads the request and never replies.
  const silent: Server = createServer(() => undefined);
  await new Promise<void>((done) => silent.listen(0, '127.0.0.1', done));
  t.after(() => {
    silent.closeAllConnections();
    silent.close();
  });
  const address = `127.0.0.1:${(silent.address() as AddressInfo).port}`;
  const store = new ImageStore({ root: tempDir(t, 'asb-images-'), registries: mirrorOf(address), logger: silentLogger(), pullTimeoutMs: 1000 });
  const started = Date.now();
  await assert.rejects(store.pull('busybox:1'), (err: unknown) => {
    assert.ok(isAsbError(err, 'Timeout'), String(err));
    assert.ok(err.message.includes('busybox:1') && err.message.includes(address), err.message);
    return true;
  });
  assert.ok(Date.now() - started < 8000);
});

test('mirrors are tried in order: the first that has the image serves it, and the answers of the others are kept for errors', async (t) => {
  const empty = await startRegistry(t);
  const seeded = await startRegistry(t);
  await seedRegistry(seeded.address, readSeedImages(SEED_DIR), { tmpDir: tempDir(t, 'asb-seed-'), only: ['docker.io/library/busybox:latest'] });
  const registries = parseRegistriesConfig({ mirrors: { 'docker.io': { endpoints: [empty.address, seeded.address], upstream: false } } });
  const store = new ImageStore({ root: tempDir(t, 'asb-images-'), registries, logger: silentLogger() });
  const busybox = await store.pull('busybox:latest');
  assert.equal(busybox.source, seeded.address);
  await assert.rejects(store.pull('debian:12'), (err: unknown) => {
    assert.ok(isAsbError(err, 'NotFound'));
    assert.ok(err.message.includes(`${empty.address} (mirror)`) && err.message.includes(`${seeded.address} (mirror)`), err.message);
    return true;
  });
});

test('pull credentials: refused without them, used from worker configuration, and a pod secret wins over the worker', async (t) => {
  // bcrypt (cost 4, so each request checks fast) of "s3cret", made with Python's crypt module.
  const dir = tempDir(t, 'asb-private-registry-');
  writeFileSync(join(dir, 'htpasswd'), 'alice:$2b$04$MiUs0h.C6Sv3eLH7S3jmYuhB6Z9WBdXbSYXoOFNE/ZE4sbFFt74ZS\n');
  const registry = new RegistryProcess({ stateDir: join(dir, 'state'), logger: silentLogger(), htpasswdPath: join(dir, 'htpasswd') });
  t.after(() => registry.close());
  await registry.start();
  await seedRegistry(registry.address, readSeedImages(SEED_DIR), {
    tmpDir: tempDir(t, 'asb-seed-'), only: ['docker.io/library/busybox:latest'], credentials: { username: 'alice', password: 's3cret' },
  });
  const mirrors = { 'docker.io': { endpoints: [registry.address], upstream: false } };

  const anonymous = new ImageStore({ root: tempDir(t, 'asb-images-'), registries: parseRegistriesConfig({ mirrors }), logger: silentLogger() });
  await assert.rejects(anonymous.pull('busybox'), (err: unknown) => {
    assert.ok(isAsbError(err, 'Forbidden'), String(err));
    assert.ok(err.message.includes('"busybox"') && err.message.includes(registry.address), err.message);
    assert.match(err.message, /unauthorized|authentication required/i);
    return true;
  });

  const worker = new ImageStore({
    root: tempDir(t, 'asb-images-'),
    registries: parseRegistriesConfig({ mirrors, auths: { [registry.address]: { username: 'alice', password: 's3cret' } } }),
    logger: silentLogger(),
  });
  assert.equal((await worker.pull('busybox')).source, registry.address);

  const wrongWorker = new ImageStore({
    root: tempDir(t, 'asb-images-'),
    registries: parseRegistriesConfig({ mirrors, auths: { [registry.address]: { username: 'alice', password: 'wrong' } } }),
    logger: silentLogger(),
  });
  await assert.rejects(wrongWorker.pull('busybox'), (err: unknown) => isAsbError(err, 'Forbidden'));
  const podSecret = { [registry.address]: { auth: Buffer.from('alice:s3cret').toString('base64') } };
  assert.equal((await wrongWorker.pull('busybox', { auths: [podSecret] })).source, registry.address);
  // The credentials never stay on disk.
  assert.deepEqual(readdirSync(join(wrongWorker.root, 'tmp')).filter((f) => f.startsWith('auth-')), []);
});
