// Real runc containers for tests: the seed busybox image pulled from a loopback registry into the
// image cache, an overlay rootfs on the cached tree (lowerdir) with its own upper and work dirs,
// and the config.json src/runtime/oci/spec.ts generates. make test builds runc and the seed images
// first (a worktree may point ASB_RUNC_DIR and ASB_IMAGES_DIR elsewhere); if either is missing the
// test fails saying what to run. Network: no netns path unless given, so a new, empty netns (lo only).
import { testImageStore } from './test-images.ts';
import type { test } from 'node:test';
import { chmodSync, chownSync, existsSync, mkdirSync, readdirSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Container } from '../../src/api/types.ts';
import type { CachedImage } from '../../src/images/image-store.ts';
import { DEFAULT_RUNC_DIR, findRuncBinary } from '../../src/runtime/oci/runc-binary.ts';
import { containerSpec, ROOT_ID_MAP, type OciSpec, type RuntimeFacts } from '../../src/runtime/oci/spec.ts';

import { onCleanup, run, tempDir } from './oci-fixture.ts';

export { onCleanup, run, tempDir };

/** The built runc and the seed busybox image, plain and (with `mapped`) id-mapped for a root pod. */
export async function busyboxImages(mapped = false): Promise<{ runc: string; busybox: CachedImage; mapped?: CachedImage }> {
  const runc = findRuncBinary(process.env.ASB_RUNC_DIR ?? DEFAULT_RUNC_DIR);
  const store = await testImageStore();
  const busybox = await store.pull('busybox');
  if (!mapped) return { runc, busybox };
  return { runc, busybox, mapped: await store.pull('busybox', { idMap: ROOT_ID_MAP }) };
}

export interface Bundle {
  id: string;
  /** runc's --root for this container. */
  state: string;
  bundle: string;
  /** The overlay's upper dir: what the container wrote. */
  upper: string;
  spec: OciSpec;
}

let containers = 0;

/**
 * A bundle for `container` of `image` under the spec containerSpec makes; the rootfs is an overlay
 * (lower: the cached tree). `owner` chowns the upper dir (a root pod's mapped root must own it to
 * write). Cleans up the container (if one was run), the mount and the cgroups.
 */
export async function prepareBundle(t: test.TestContext, runc: string, image: CachedImage, container: Omit<Container, 'name'>, facts: Partial<RuntimeFacts>, owner = 0): Promise<Bundle> {
  const id = `oci-test-${String(process.pid)}-${String(++containers)}`;
  const dir = tempDir(t, 'asb-oci-');
  // A root pod's root is host uid 100000: it must be able to reach its rootfs.
  chmodSync(dir, 0o755);
  const [upper, work, rootfs, bundle] = ['upper', 'work', 'rootfs', 'bundle'].map((d) => join(dir, d)) as [string, string, string, string];
  for (const d of [upper, work, rootfs, bundle]) mkdirSync(d);
  chownSync(upper, owner, owner);
  const cgroupsPath = `/asb-oci-test-${id}`;
  const state = join(dir, 'state');
  await run('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${image.rootfs},upperdir=${upper},workdir=${work}`, rootfs]);
  onCleanup(t, () => run('umount', [rootfs]));
  // The container (a foreground run deletes it on exit; this is for a run cut short or detached) and its cgroups.
  onCleanup(t, async () => {
    await run(runc, ['--root', state, 'delete', '-f', id]).catch(() => undefined);
    for (const c of readdirSync('/sys/fs/cgroup')) {
      const path = join('/sys/fs/cgroup', c, cgroupsPath);
      if (existsSync(path)) rmdirSync(path);
    }
  });
  const spec = containerSpec({ name: 'main', ...container }, image.config, { rootfs, hostname: 'sbx', cgroupsPath, ...facts });
  writeFileSync(join(bundle, 'config.json'), JSON.stringify(spec));
  return { id, state, bundle, upper, spec };
}
