// The registry `make up` and the tests pull from: a real one (registry-process.ts) on loopback,
// seeded with the images scripts/build-images.sh built (seed.ts), named as docker.io's mirror in
// a registries file the workers read (--registries), so `busybox` or `agent-sandbox/base` pull as
// they would from Docker Hub. Users push their own images to it too (`skopeo copy ...
// docker://127.0.0.1:<port>/...`): its data outlives restarts.
// Seeding is skipped when the data already holds this build of the seed images (a marker names
// the build's index digest), so a second `make up` starts it in well under a second.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from '../base/log.ts';
import { RegistryProcess } from './registry-process.ts';
import { readSeedImages, seedRegistry } from './seed.ts';

export interface LocalRegistryOptions {
  /** Its own files: registry.yml, registry.log, registries.json. */
  stateDir: string;
  /** Blobs and manifests (default <stateDir>/data); may be shared by several registries. */
  dataDir?: string;
  /** Where scripts/build-images.sh wrote the seed images (.tools/images). */
  seedDir: string;
  log: Logger;
  /** Fixed port (make up keeps it across restarts); 0: any. */
  port?: number;
  ownGroup?: boolean;
  onUnexpectedExit?: (code: number | null, signal: NodeJS.Signals | null) => void;
}

export interface LocalRegistry {
  readonly process: RegistryProcess;
  /** 127.0.0.1:<port> */
  readonly address: string;
  /** The workers' --registries file: docker.io → this registry. */
  readonly registriesFile: string;
}

/** The registries file that makes this registry docker.io's only source (no public registry is reachable). */
export function mirrorConfig(address: string): { mirrors: Record<string, { endpoints: string[]; upstream: boolean }> } {
  return { mirrors: { 'docker.io': { endpoints: [address], upstream: false } } };
}

export async function startLocalRegistry(opts: LocalRegistryOptions): Promise<LocalRegistry> {
  const seed = readSeedImages(opts.seedDir);
  const dataDir = opts.dataDir ?? join(opts.stateDir, 'data');
  const registry = new RegistryProcess({
    stateDir: opts.stateDir,
    dataDir,
    logger: opts.log,
    ...(opts.port === undefined ? {} : { port: opts.port }),
    ...(opts.ownGroup === undefined ? {} : { ownGroup: opts.ownGroup }),
    ...(opts.onUnexpectedExit === undefined ? {} : { onUnexpectedExit: opts.onUnexpectedExit }),
  });
  const address = await registry.start();
  try {
    const build = createHash('sha256').update(readFileSync(join(seed.layout, 'index.json'))).update(JSON.stringify(seed.tags)).digest('hex').slice(0, 16);
    const marker = join(dataDir, '.seeded');
    if (!existsSync(marker) || readFileSync(marker, 'utf8').trim() !== build) {
      const tmpDir = join(opts.stateDir, 'seed-tmp');
      const pushed = await seedRegistry(address, seed, { tmpDir });
      rmSync(tmpDir, { recursive: true, force: true });
      writeFileSync(`${marker}.tmp`, `${build}\n`);
      renameSync(`${marker}.tmp`, marker);
      opts.log.info({ address, images: pushed }, 'registry seeded');
    }
    mkdirSync(opts.stateDir, { recursive: true });
    const registriesFile = join(opts.stateDir, 'registries.json');
    writeFileSync(`${registriesFile}.tmp`, `${JSON.stringify(mirrorConfig(address), null, 2)}\n`, { mode: 0o600 });
    renameSync(`${registriesFile}.tmp`, registriesFile);
    return { process: registry, address, registriesFile };
  } catch (err) {
    await registry.close();
    throw err;
  }
}
