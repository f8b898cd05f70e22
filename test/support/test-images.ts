// The images every test's sandboxes run, as `make up` serves them: a real registry on loopback
// (src/images/local-registry.ts), seeded with the images `make images` built, as docker.io's
// mirror. One registry process per test process, all serving one data directory that is seeded
// once per build of the images (under .tools/images, like the build), and one image cache shared
// by every test (an image is pulled and unpacked once per machine, not once per test file; the
// cache's own lock keeps two test processes from unpacking into it at once).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ImageStore } from '../../src/images/image-store.ts';
import { mirrorConfig, startLocalRegistry } from '../../src/images/local-registry.ts';
import { parseRegistriesConfig } from '../../src/images/registries.ts';
import { defaultSeedDir } from '../../src/images/seed.ts';
import { acquireOwnerLockWaiting } from '../../src/store/owner-lock.ts';
import { silentLogger } from '../../src/base/log.ts';

export interface TestImages {
  /** 127.0.0.1:<port> of this process's registry. */
  address: string;
  registriesFile: string;
  imageCache: string;
  /** Worker flags: --registries and --image-cache. */
  workerArgs: string[];
}

/** Seeding pushes ~130 MB the first time (a few seconds); another test process waits for it. */
const SEED_WAIT_MS = 5 * 60_000;

let started: Promise<TestImages> | undefined;

/** An image store on the shared cache that pulls from this process's registry (for a runtime a test makes itself). */
export async function testImageStore(): Promise<ImageStore> {
  const images = await testImages();
  return new ImageStore({ root: images.imageCache, registries: parseRegistriesConfig(mirrorConfig(images.address)), logger: silentLogger() });
}

export function testImages(): Promise<TestImages> {
  started ??= (async () => {
    const seedDir = defaultSeedDir();
    const stateDir = mkdtempSync(join(tmpdir(), 'asb-test-registry-'));
    process.once('exit', () => rmSync(stateDir, { recursive: true, force: true }));
    const lock = await acquireOwnerLockWaiting(join(seedDir, 'registry-seed'), SEED_WAIT_MS);
    try {
      // The registry dies with this process (registry-process.ts: pdeathsig).
      const registry = await startLocalRegistry({ stateDir, dataDir: join(seedDir, 'registry-data'), seedDir, log: silentLogger() });
      registry.process.unref();
      const imageCache = join(seedDir, 'cache');
      return { address: registry.address, registriesFile: registry.registriesFile, imageCache, workerArgs: ['--registries', registry.registriesFile, '--image-cache', imageCache] };
    } finally {
      lock.release();
    }
  })();
  return started;
}
