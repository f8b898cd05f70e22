// A tenant's own image, built as an attacker would: the seed busybox with one more layer holding
// whatever entries the test names (links to host paths, FIFOs, plain files), appended with umoci
// and pushed with skopeo to the tests' registry (test-images.ts) as docker.io/library/<name>, so a
// pod names it like any other image.
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { SKOPEO, UMOCI } from '../../src/images/tool.ts';
import { testImages } from './test-images.ts';

const run = promisify(execFile);

export type LayerEntry =
  | { path: string; link: string }
  | { path: string; fifo: true }
  | { path: string; text: string };

/** Pushes busybox plus a layer of `entries` as `<name>:latest`; resolves with the name a pod uses. */
export async function pushTenantImage(name: string, entries: readonly LayerEntry[]): Promise<string> {
  const { address } = await testImages();
  const dir = await mkdtemp(join(tmpdir(), 'asb-tenant-image-'));
  try {
    const layout = join(dir, 'oci');
    await run(SKOPEO, ['copy', '--quiet', '--src-tls-verify=false', `docker://${address}/library/busybox:latest`, `oci:${layout}:base`]);
    const staging = join(dir, 'layer');
    for (const entry of entries) {
      const at = join(staging, entry.path);
      await mkdir(dirname(at), { recursive: true });
      if ('link' in entry) await symlink(entry.link, at);
      else if ('fifo' in entry) await run('mkfifo', [at]);
      else await writeFile(at, entry.text);
    }
    await run('tar', ['-C', staging, '--numeric-owner', '--owner=0', '--group=0', '-cf', join(dir, 'layer.tar'), '.']);
    await run(UMOCI, ['raw', 'add-layer', '--image', `${layout}:base`, '--tag', 'tenant', join(dir, 'layer.tar')]);
    await run(SKOPEO, ['copy', '--quiet', '--dest-tls-verify=false', `oci:${layout}:tenant`, `docker://${address}/library/${name}:latest`]);
    return name;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
