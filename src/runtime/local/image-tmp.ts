// A gVisor pod's /tmp is a directory of its disk (rootfs.ts disk/tmp) bound over the image's:
// runsc would otherwise mount a memory tmpfs over an empty /tmp, lost at hibernation. The bind
// hides what the image has in /tmp, which runc shows (its /tmp is the overlay's). So the
// directory starts as a copy of the image's /tmp, made when it is made (the pod's first start):
// a sandbox, and a build step, finds there what it would find under runc, and a template built
// on either runtime runs the same on both.
// The image tree is the tenant's (image-file.ts): /tmp is found with every link resolved inside
// the tree, each entry is lstat'ed and only directories, regular files and symlinks are copied
// (a link as a link, never followed; devices, FIFOs and sockets are skipped), into a directory
// made just now that no sandbox has seen. Trees are never written after they are unpacked, so
// nothing changes between the lstat and the copy. Owners move from the tree's id range to the
// pod's, as the shim's idmap shows the tree to the pod.
import { constants } from 'node:fs';
import { chmod, copyFile, lchown, lstat, mkdir, readdir, readlink, symlink } from 'node:fs/promises';
import { join } from 'node:path';
import { AsbError } from '../../errors.ts';
import type { IdRange } from '../oci/spec.ts';
import { resolveInTree } from './image-file.ts';

/** An image's /tmp is normally empty; a tree larger than this is refused rather than copied at every start. */
export const MAX_IMAGE_TMP_ENTRIES = 10_000;

/**
 * Copies the image tree's /tmp (its content, mode and owner) into `into`, a directory just made;
 * nothing when the image has no /tmp directory. `from` is the range the tree is owned by, `to` the pod's.
 */
export async function seedTmpFromImage(tree: string, into: string, from: IdRange, to: IdRange): Promise<void> {
  const source = await resolveInTree(tree, '/tmp');
  if (source === undefined) return;
  const top = await lstat(source);
  if (!top.isDirectory()) return;
  const shift = (id: number): number => (id >= from.hostId && id < from.hostId + Math.min(from.size, to.size) ? id - from.hostId + to.hostId : to.hostId);
  let entries = 0;
  const copy = async (src: string, dest: string): Promise<void> => {
    for (const name of (await readdir(src)).sort()) {
      if (++entries > MAX_IMAGE_TMP_ENTRIES) throw new AsbError('Invalid', `the image's /tmp holds more than ${String(MAX_IMAGE_TMP_ENTRIES)} entries, which a gVisor pod would copy at its start`);
      const s = join(src, name);
      const d = join(dest, name);
      const st = await lstat(s);
      if (st.isDirectory()) {
        await mkdir(d, { mode: 0o700 });
        await copy(s, d);
      } else if (st.isFile()) {
        await copyFile(s, d, constants.COPYFILE_EXCL);
      } else if (st.isSymbolicLink()) {
        await symlink(await readlink(s), d);
      } else {
        continue;
      }
      await lchown(d, shift(st.uid), shift(st.gid));
      // After the chown, which clears setuid and setgid bits; links have no mode of their own.
      if (!st.isSymbolicLink()) await chmod(d, st.mode & 0o7777);
    }
  };
  await copy(source, into);
  await lchown(into, shift(top.uid), shift(top.gid));
  await chmod(into, top.mode & 0o7777);
}
