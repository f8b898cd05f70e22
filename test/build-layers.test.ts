// The build engine's pure parts, without sandboxes: a step's changes between two walks of an upper
// dir (new, changed, deleted, whiteouts and opacity), tar headers a real tar reads back, and the
// layer cache's collection by age.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { chmodSync, chownSync, linkSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, utimesSync, existsSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { diffUpper, opaqueReader, walkUpper, type UpperNode, type UpperState } from '../src/builds/layer-diff.ts';
import { writeLayer } from '../src/builds/layer-writer.ts';
import { ensureCBinary } from '../src/base/c-binary.ts';
import { LayerCache } from '../src/builds/layer-cache.ts';
import { startLayerCacheGc } from '../src/builds/layer-cache-gc.ts';
import { startImageGc } from '../src/images/gc-loop.ts';
import { ImageStore } from '../src/images/image-store.ts';
import { EMPTY_REGISTRIES } from '../src/images/registries.ts';
import { silentLogger } from '../src/base/log.ts';
import { padding, tarEnd, tarHeader } from '../src/builds/tar-header.ts';
import { ManualClock } from './support/operator-harness.ts';

function node(type: UpperNode['type'], ino: number, ctime = 1, opaque = false): UpperNode {
  return { type, ino, nlink: 1, uid: 0, gid: 0, mode: 0o755, size: 0, mtime: 0, sig: `${type}:${String(ino)}:${String(ctime)}`, opaque };
}

function state(entries: [string, UpperNode][]): UpperState {
  return new Map(entries);
}

function summary(before: UpperState, after: UpperState): string[] {
  return diffUpper(before, after).map((c) => (c.kind === 'entry' ? `+${c.path}` : c.kind === 'whiteout' ? `-${c.path}` : `opq ${c.dir}`));
}

test('a step\'s layer holds what it made or changed, with the unchanged parents, and whiteouts for what it removed', () => {
  const before = state([['opt', node('dir', 1)], ['opt/a', node('file', 2)], ['opt/gone', node('file', 3)], ['opt/olddir', node('dir', 4)], ['opt/olddir/x', node('file', 5)], ['etc', node('dir', 6)], ['etc/kept', node('file', 7)]]);
  const after = state([['opt', node('dir', 1, 2)], ['opt/a', node('file', 2)], ['opt/new', node('file', 8)], ['etc', node('dir', 6)], ['etc/kept', node('file', 7, 5)], ['etc/base-file', node('whiteout', 9)]]);
  assert.deepEqual(summary(before, after), ['+opt', '+opt/new', '+etc', '+etc/kept', '-etc/base-file', '-opt/gone', '-opt/olddir']);
  assert.deepEqual(summary(after, after), [], 'a step that changed nothing has no layer');
});

test('a directory made opaque says so once: a later step adding to it does not hide the earlier layers\' entries', () => {
  const s0 = state([]);
  const s1 = state([['usr', node('dir', 1)], ['usr/doc', node('dir', 2, 1, true)], ['usr/doc/a', node('file', 3)]]);
  assert.deepEqual(summary(s0, s1), ['+usr', '+usr/doc', 'opq usr/doc', '+usr/doc/a']);
  const s2 = state([['usr', node('dir', 1)], ['usr/doc', node('dir', 2, 2, true)], ['usr/doc/a', node('file', 3)], ['usr/doc/b', node('file', 4)]]);
  assert.deepEqual(summary(s1, s2), ['+usr', '+usr/doc', '+usr/doc/b']);
  // Made again (a new inode): opaque again, and its old entries are whiteouts.
  const s3 = state([['usr', node('dir', 1, 2)], ['usr/doc', node('dir', 9, 3, true)]]);
  assert.deepEqual(summary(s2, s3), ['+usr', '+usr/doc', 'opq usr/doc', '-usr/doc/a', '-usr/doc/b']);
});

test('tar headers, long names and links included, read back by GNU tar', () => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-tar-'));
  try {
    const long = `${'d'.repeat(120)}/${'f'.repeat(130)}`;
    const body = Buffer.from('content\n');
    const parts = [
      tarHeader({ path: 'opt', type: 'dir', mode: 0o755, uid: 0, gid: 0, size: 0, mtime: 1 }),
      tarHeader({ path: 'opt/file', type: 'file', mode: 0o4755, uid: 1000, gid: 1000, size: body.length, mtime: 1 }), body, padding(body.length),
      tarHeader({ path: long, type: 'file', mode: 0o644, uid: 0, gid: 0, size: 0, mtime: 1 }),
      tarHeader({ path: 'opt/link', type: 'symlink', mode: 0o777, uid: 0, gid: 0, size: 0, mtime: 1, linkname: `/${'t'.repeat(150)}` }),
      tarHeader({ path: 'opt/hard', type: 'hardlink', mode: 0o644, uid: 0, gid: 0, size: 0, mtime: 1, linkname: 'opt/file' }),
      tarHeader({ path: 'opt/fifo', type: 'fifo', mode: 0o600, uid: 0, gid: 0, size: 0, mtime: 1 }),
      tarEnd(),
    ];
    writeFileSync(join(dir, 'l.tar'), Buffer.concat(parts));
    const out = execFileSync('tar', ['-tvf', join(dir, 'l.tar'), '--numeric-owner']).toString().split('\n').filter(Boolean);
    assert.equal(out.length, 6);
    assert.match(out[0] ?? '', /^drwxr-xr-x 0\/0 .* opt\/$/);
    assert.match(out[1] ?? '', /^-rwsr-xr-x 1000\/1000 +8 .* opt\/file$/);
    assert.ok((out[2] ?? '').endsWith(` ${long}`), out[2]);
    assert.ok((out[3] ?? '').endsWith(`opt/link -> /${'t'.repeat(150)}`), out[3]);
    assert.match(out[4] ?? '', /^h.* opt\/hard link to opt\/file$/);
    assert.match(out[5] ?? '', /^prw------- .* opt\/fifo$/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the layer cache collects entries unused past its age bound and the blobs no entry names; a used entry and its blob stay', async () => {
  const root = mkdtempSync(join(tmpdir(), 'asb-lc-'));
  try {
    const cache = new LayerCache(root);
    const blobs = await cache.blobsDir('t');
    const layer = (hex: string) => ({ digest: `sha256:${hex}`, diffId: `sha256:${hex}`, size: 1 });
    writeFileSync(join(blobs, 'a'.repeat(64)), 'x');
    writeFileSync(join(blobs, 'b'.repeat(64)), 'y');
    await cache.put('t', 'old', { layer: layer('a'.repeat(64)), config: { env: [] } });
    await cache.put('t', 'new', { layer: layer('b'.repeat(64)), config: { env: [] } });
    const long = new Date(Date.now() - 10 * 24 * 3600_000);
    utimesSync(join(blobs, '..', 'entries', 'old.json'), long, long);
    utimesSync(join(blobs, 'a'.repeat(64)), long, long);
    assert.equal((await cache.get('t', 'old'))?.layer?.digest, `sha256:${'a'.repeat(64)}`, 'readable before');
    utimesSync(join(blobs, '..', 'entries', 'old.json'), long, long);
    assert.equal(await cache.get('other-team', 'new'), undefined, 'another team sees nothing');
    assert.deepEqual(await cache.collect(false), { entries: 1, blobs: 1 });
    assert.equal(await cache.get('t', 'old'), undefined);
    assert.equal(existsSync(join(blobs, 'a'.repeat(64))), false);
    assert.ok(await cache.get('t', 'new'));
    assert.equal(existsSync(join(blobs, 'b'.repeat(64))), true);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test('an upper dir becomes a layer: owners mapped back from the pod\'s host range (outside it: root, without setuid), whiteouts, opaque dirs, links kept as links, a FIFO never opened', async () => {
  // Needs root (as every sandbox test): files of other owners, a whiteout device, a trusted xattr.
  const dir = mkdtempSync(join(tmpdir(), 'asb-upper-'));
  try {
    const upper = join(dir, 'upper');
    const hostId = 3_000_000;
    mkdirSync(join(upper, 'opt', 'doc'), { recursive: true });
    writeFileSync(join(upper, 'opt', 'mine'), 'mine\n');
    chownSync(join(upper, 'opt', 'mine'), hostId + 1500, hostId + 1500);
    chmodSync(join(upper, 'opt', 'mine'), 0o4755);
    writeFileSync(join(upper, 'opt', 'foreign'), 'foreign\n');
    chownSync(join(upper, 'opt', 'foreign'), 12345, 12345);
    chmodSync(join(upper, 'opt', 'foreign'), 0o6755);
    linkSync(join(upper, 'opt', 'mine'), join(upper, 'opt', 'mine-too'));
    symlinkSync('/etc/shadow', join(upper, 'opt', 'shadow'));
    execFileSync('mkfifo', [join(upper, 'opt', 'fifo')]);
    execFileSync('mknod', [join(upper, 'opt', 'removed'), 'c', '0', '0']);
    execFileSync('python3', ['-c', `import os; os.setxattr(${JSON.stringify(join(upper, 'opt', 'doc'))}, 'trusted.overlay.opaque', b'y')`]);
    for (const p of ['opt', 'opt/doc']) chownSync(join(upper, p), hostId, hostId);
    const helper = await ensureCBinary(join(dir, 'state'), new URL('../src/builds/overlay-opaque.c', import.meta.url));
    const state = await walkUpper(upper, opaqueReader(helper, upper));
    const blob = await writeLayer(diffUpper(new Map(), state), upper, { hostId, size: 65_536 }, join(dir, 'blobs'), new AbortController().signal);
    const tar = execFileSync('tar', ['-tvz', '--numeric-owner', '-f', join(dir, 'blobs', blob.digest.slice(7))]).toString();
    assert.match(tar, /^drwxr-xr-x 0\/0 .* opt\/$/m);
    assert.match(tar, /^-rwsr-xr-x 1500\/1500 .* opt\/mine$/m);
    assert.match(tar, /^h.* opt\/mine-too link to opt\/mine$/m);
    assert.match(tar, /^-rwxr-xr-x 0\/0 .* opt\/foreign$/m, 'an owner outside the range becomes root and loses setuid/setgid');
    assert.match(tar, /^l.* opt\/shadow -> \/etc\/shadow$/m);
    assert.match(tar, /^p.* opt\/fifo$/m);
    assert.match(tar, / opt\/\.wh\.removed$/m);
    assert.match(tar, / opt\/doc\/\.wh\.\.wh\.\.opq$/m);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('each pass of the image GC loop collects the layer cache too, with the short bound when the disk is full', async () => {
  const root = mkdtempSync(join(tmpdir(), 'asb-lcgc-'));
  try {
    const cache = new LayerCache(join(root, 'layers'));
    const blobs = await cache.blobsDir('t');
    writeFileSync(join(blobs, 'c'.repeat(64)), 'z');
    await cache.put('t', 'twohours', { layer: { digest: `sha256:${'c'.repeat(64)}`, diffId: 'sha256:x', size: 1 }, config: { env: [] } });
    const twoHours = new Date(Date.now() - 2 * 3600_000);
    utimesSync(join(blobs, '..', 'entries', 'twohours.json'), twoHours, twoHours);
    utimesSync(join(blobs, 'c'.repeat(64)), twoHours, twoHours);
    let usage = 10;
    const images = new ImageStore({ root: join(root, 'images'), registries: EMPTY_REGISTRIES, logger: silentLogger() });
    const loop = startImageGc({ images, log: silentLogger(), intervalMs: 0, diskUsage: () => Promise.resolve(usage), alsoCollect: [cache] });
    await loop.runNow();
    assert.equal(existsSync(join(blobs, '..', 'entries', 'twohours.json')), true, 'two hours unused: kept while the disk has room');
    usage = 95;
    await loop.runNow();
    await loop.close();
    assert.equal(existsSync(join(blobs, '..', 'entries', 'twohours.json')), false, 'collected under pressure');
    assert.equal(existsSync(join(blobs, 'c'.repeat(64))), false);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test('where no image cache runs (Kubernetes) the layer cache is collected by a loop of its own on the image cache\'s policy, and an entry a live template was built from is never collected', async () => {
  const root = mkdtempSync(join(tmpdir(), 'asb-lckube-'));
  try {
    let live: ReadonlySet<string> = new Set(['live']);
    const cache = new LayerCache(join(root, 'layers'));
    cache.keep(() => live);
    const blobs = await cache.blobsDir('t');
    const entry = (name: string): string => join(blobs, '..', 'entries', `${name}.json`);
    const put = async (name: string, hex: string, ageMs: number): Promise<void> => {
      writeFileSync(join(blobs, hex.repeat(64)), hex);
      await cache.put('t', name, { layer: { digest: `sha256:${hex.repeat(64)}`, diffId: 'sha256:x', size: 1 }, config: { env: [] } });
      const then = new Date(Date.now() - ageMs);
      utimesSync(entry(name), then, then);
      utimesSync(join(blobs, hex.repeat(64)), then, then);
    };
    await put('live', 'd', 30 * 24 * 3600_000);
    await put('unused', 'e', 30 * 24 * 3600_000);
    await put('recent', 'f', 2 * 3600_000);
    let usage = 10;
    const clock = new ManualClock();
    const loop = startLayerCacheGc({ cache, log: silentLogger(), clock, intervalMs: 600_000, diskUsage: () => Promise.resolve(usage) });
    // Nothing before the first interval; then a pass by the timer.
    clock.advance(600_000);
    await loop.runNow();
    assert.equal(existsSync(entry('unused')), false, 'a month unused: collected');
    assert.equal(existsSync(join(blobs, 'e'.repeat(64))), false, 'and its blob');
    assert.equal(existsSync(entry('live')), true, 'a month unused but a live template\'s step: kept');
    assert.equal(existsSync(join(blobs, 'd'.repeat(64))), true);
    assert.equal(existsSync(entry('recent')), true, 'two hours unused: kept while the disk has room');
    usage = 95;
    assert.deepEqual(await loop.runNow(), { entries: 1, blobs: 1, pressure: true });
    assert.equal(existsSync(entry('recent')), false, 'collected under pressure');
    assert.equal(existsSync(entry('live')), true, 'a live template\'s step stays under pressure too');
    // The template is gone (deleted or retagged): its steps age out as any other.
    live = new Set();
    assert.deepEqual(await loop.runNow(), { entries: 1, blobs: 1, pressure: true });
    assert.equal(existsSync(join(blobs, 'd'.repeat(64))), false);
    await loop.close();
    await loop.close();
    assert.equal(await loop.runNow(), undefined, 'closed: no pass');
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});
