// The runtime reads an image's files on the host (the CA bundle it extends, /etc/passwd and
// /etc/group) as the container sees them: a tenant's image whose CA bundle was a link to a host
// path handed that host file to the sandbox. Links resolve inside the tree, only regular files are
// read, and only up to a size.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { AsbError } from '../src/errors.ts';
import { readImageFile, resolveInTree } from '../src/runtime/local/image-file.ts';

const BUNDLE = '/etc/ssl/certs/ca-certificates.crt';

interface Fixture { tree: string; canary: string; canaryText: string }

/** An image tree with /etc/ssl/certs, and a host file outside it that no read may return. */
async function fixture(t: { after(fn: () => Promise<void>): void }): Promise<Fixture> {
  const dir = await mkdtemp(join(tmpdir(), 'asb-image-file-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const tree = join(dir, 'rootfs');
  await mkdir(join(tree, 'etc/ssl/certs'), { recursive: true });
  await mkdir(join(tree, 'proc'));
  const canaryText = `host canary ${String(process.pid)}\n`;
  const canary = join(dir, 'host-canary');
  await writeFile(canary, canaryText);
  return { tree, canary, canaryText };
}

const isInvalid = (what: string) => (err: unknown): boolean => err instanceof AsbError && err.code === 'Invalid' && err.message.includes(what);

test('an absolute link in the image resolves inside the image, never to the host file it names', async (t) => {
  const f = await fixture(t);
  await symlink(f.canary, join(f.tree, BUNDLE.slice(1)));
  assert.equal(await readImageFile(f.tree, BUNDLE), undefined, 'the host path does not exist inside the image');
  // The same path inside the image is what the container would read.
  await mkdir(join(f.tree, f.canary, '..'), { recursive: true });
  await writeFile(join(f.tree, f.canary), 'the image\'s own file\n');
  assert.equal(await readImageFile(f.tree, BUNDLE), 'the image\'s own file\n');
});

test('a relative ../ link cannot climb out of the image', async (t) => {
  const f = await fixture(t);
  const up = '../'.repeat(f.tree.split('/').length + 4);
  await symlink(`${up}${f.canary.slice(1)}`, join(f.tree, BUNDLE.slice(1)));
  assert.equal(await readImageFile(f.tree, BUNDLE), undefined);
  // A link through a directory link climbs from where the link is, inside the image.
  await symlink('../..', join(f.tree, 'etc/ssl/up'));
  await writeFile(join(f.tree, 'bundle.pem'), 'PEM\n');
  await rm(join(f.tree, BUNDLE.slice(1)));
  await symlink('../up/bundle.pem', join(f.tree, BUNDLE.slice(1)));
  assert.equal(await readImageFile(f.tree, BUNDLE), 'PEM\n');
});

test('a link to /proc/self/root reads nothing of the host', async (t) => {
  const f = await fixture(t);
  await symlink(`/proc/self/root${f.canary}`, join(f.tree, BUNDLE.slice(1)));
  assert.equal(await readImageFile(f.tree, BUNDLE), undefined);
  await rm(join(f.tree, 'etc/passwd'), { force: true });
  await symlink('/proc/self/root/etc/passwd', join(f.tree, 'etc/passwd'));
  assert.equal(await readImageFile(f.tree, '/etc/passwd'), undefined);
  // A directory of the path that is itself a link is resolved the same way.
  await rm(join(f.tree, 'etc/ssl/certs'), { recursive: true });
  await symlink(`/proc/self/root${join(f.canary, '..')}`, join(f.tree, 'etc/ssl/certs'));
  assert.equal(await resolveInTree(f.tree, BUNDLE), undefined);
});

test('a FIFO, a device node, a socket or a directory is refused by name before it is opened, and a FIFO never blocks', async (t) => {
  const f = await fixture(t);
  execFileSync('mkfifo', [join(f.tree, BUNDLE.slice(1))]);
  await assert.rejects(readImageFile(f.tree, BUNDLE), isInvalid(`${BUNDLE} is a FIFO`));
  // Major 240 is for local, experimental use: no driver here, so an open would fail ENXIO
  // instead; the refusal by type shows the device was never opened (a watchdog arms on open).
  execFileSync('mknod', [join(f.tree, 'etc/passwd'), 'c', '240', '0']);
  await assert.rejects(readImageFile(f.tree, '/etc/passwd'), isInvalid('/etc/passwd is a character device'));
  execFileSync('python3', ['-c', 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])', join(f.tree, 'etc/shadow')]);
  await assert.rejects(readImageFile(f.tree, '/etc/shadow'), isInvalid('/etc/shadow is a socket'));
  await mkdir(join(f.tree, 'etc/group'));
  await assert.rejects(readImageFile(f.tree, '/etc/group'), isInvalid('/etc/group is a directory'));
});

test('a file larger than the bound, and a loop of links, are refused by name', async (t) => {
  const f = await fixture(t);
  await writeFile(join(f.tree, BUNDLE.slice(1)), 'x'.repeat(2048));
  await assert.rejects(readImageFile(f.tree, BUNDLE, 1024), isInvalid(`${BUNDLE} is 2048 bytes`));
  assert.equal((await readImageFile(f.tree, BUNDLE))?.length, 2048);
  await symlink('/etc/b', join(f.tree, 'etc/a'));
  await symlink('/etc/a', join(f.tree, 'etc/b'));
  await assert.rejects(readImageFile(f.tree, '/etc/a'), isInvalid('/etc/a has more than 40 symbolic links'));
});
