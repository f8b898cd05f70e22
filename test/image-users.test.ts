// The local runtime reads an image's /etc/passwd and /etc/group once per image tree (oci-pod.ts
// imageUsersCache), not twice per pod start: a refill of 300 pods read them 600 times.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { AsbError } from '../src/errors.ts';
import { readImageFile } from '../src/runtime/local/image-file.ts';
import { imageUsersCache } from '../src/runtime/local/oci-pod.ts';

async function tree(t: { after(fn: () => Promise<void>): void }, passwd?: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'asb-image-users-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await mkdir(join(dir, 'etc'));
  if (passwd !== undefined) await writeFile(join(dir, 'etc', 'passwd'), passwd);
  return dir;
}

test('an image tree\'s users are read once: a later start gets the same answer without reading again', async (t) => {
  const rootfs = await tree(t, 'user:x:1000:1000::/home/user:/bin/sh\n');
  await writeFile(join(rootfs, 'etc', 'group'), 'user:x:1000:\n');
  const users = imageUsersCache();
  assert.deepEqual(await users(rootfs), { passwd: 'user:x:1000:1000::/home/user:/bin/sh\n', group: 'user:x:1000:\n' });
  // Trees never change once unpacked: a changed file proves the second answer came from the cache.
  await writeFile(join(rootfs, 'etc', 'passwd'), 'changed\n');
  assert.equal((await users(rootfs)).passwd, 'user:x:1000:1000::/home/user:/bin/sh\n');
});

test('a missing file is an empty one and is kept; a file that could not be read is read again next time', async (t) => {
  const rootfs = await tree(t, 'user:x:1000:1000::/home/user:/bin/sh\n');
  const users = imageUsersCache();
  assert.deepEqual(await users(rootfs), { passwd: 'user:x:1000:1000::/home/user:/bin/sh\n', group: '' });
  // EMFILE under a burst of starts, once.
  let failures = 1;
  const flaky: typeof readImageFile = (root, path) => (failures-- > 0 ? Promise.reject(Object.assign(new Error('too many open files'), { code: 'EMFILE' })) : readImageFile(root, path));
  const other = await tree(t, 'root:x:0:0::/root:/bin/sh\n');
  const again = imageUsersCache(32, flaky);
  assert.equal((await again(other)).passwd, '');
  assert.equal((await again(other)).passwd, 'root:x:0:0::/root:/bin/sh\n');
});

test('an image whose /etc/passwd is no regular file fails the start naming it, and is read again next time', async (t) => {
  const rootfs = await tree(t);
  await mkdir(join(rootfs, 'etc', 'passwd'));
  const users = imageUsersCache();
  await assert.rejects(users(rootfs), (err: unknown) => err instanceof AsbError && err.code === 'Invalid' && err.message.includes('/etc/passwd is a directory'));
  await rm(join(rootfs, 'etc', 'passwd'), { recursive: true });
  await writeFile(join(rootfs, 'etc', 'passwd'), 'root:x:0:0::/root:/bin/sh\n');
  assert.equal((await users(rootfs)).passwd, 'root:x:0:0::/root:/bin/sh\n');
});

test('only the last trees are kept', async (t) => {
  const users = imageUsersCache(1);
  const [a, b] = [await tree(t, 'a\n'), await tree(t, 'b\n')];
  assert.equal((await users(a)).passwd, 'a\n');
  assert.equal((await users(b)).passwd, 'b\n');
  await writeFile(join(a, 'etc', 'passwd'), 'a2\n');
  assert.equal((await users(a)).passwd, 'a2\n', 'a was dropped when b came, so it is read again');
});
