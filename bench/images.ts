// The image side of the runtime bench (`node bench/run.ts runtime`): the loopback registry `make up`
// runs (src/images/local-registry.ts, seeded with the images `make images` built), and the first
// pull of agent-sandbox/base from it into an empty image cache, split into skopeo's copy and
// umoci's unpacks as the image store logs them.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { pino } from 'pino';
import { ImageStore } from '../src/images/image-store.ts';
import { mirrorConfig, startLocalRegistry, type LocalRegistry } from '../src/images/local-registry.ts';
import { parseRegistriesConfig } from '../src/images/registries.ts';
import { defaultSeedDir } from '../src/images/seed.ts';
import { ROOT_ID_MAP } from '../src/runtime/oci/spec.ts';
import { acquireOwnerLockWaiting } from '../src/store/owner-lock.ts';
import { silentLogger, type Logger } from '../src/base/log.ts';
import { round } from './claims.ts';

export const BASE_IMAGE = 'agent-sandbox/base';
/** Seeding pushes ~130 MB the first time (a few seconds); another process seeding the same data waits. */
const SEED_WAIT_MS = 5 * 60_000;

export interface BenchRegistry {
  registry: LocalRegistry;
  /** An image store on `root` that pulls from this registry as docker.io's mirror. */
  store(root: string, log?: Logger): ImageStore;
  close(): Promise<void>;
}

/**
 * The registry `make up` starts, on its own port and state dir, serving the seeded data the tests
 * share (<seed dir>/registry-data; the same lock as test/support/test-images.ts while it seeds),
 * so a bench run does not push 130 MB again.
 */
export async function startBenchRegistry(): Promise<BenchRegistry> {
  const seedDir = defaultSeedDir();
  const stateDir = mkdtempSync(join(tmpdir(), 'asb-bench-registry-'));
  const lock = await acquireOwnerLockWaiting(join(seedDir, 'registry-seed'), SEED_WAIT_MS);
  let registry: LocalRegistry;
  try {
    registry = await startLocalRegistry({ stateDir, dataDir: join(seedDir, 'registry-data'), seedDir, log: silentLogger() });
  } catch (err) {
    rmSync(stateDir, { recursive: true, force: true });
    throw err;
  } finally {
    lock.release();
  }
  const registries = parseRegistriesConfig(mirrorConfig(registry.address));
  return {
    registry,
    store: (root, log) => new ImageStore({ root, registries, logger: log ?? silentLogger() }),
    async close() {
      await registry.process.close();
      rmSync(stateDir, { recursive: true, force: true });
    },
  };
}

export interface FirstPull {
  runs: number;
  /** pull(base) on an empty cache, all of it: skopeo copy, then the plain unpack (median of the runs, ms). */
  pullMs: number;
  /** Its two steps, as the image store logs them. */
  copyMs: number;
  unpackMs: number;
  /** pull(base, { idMap: ROOT_ID_MAP }) after it: only the id-mapped unpack the runtime uses. */
  idMappedUnpackMs: number;
  /** What the first start of a pod pays on an empty cache: copy + id-mapped unpack. */
  runtimeFirstPullMs: number;
}

/** `runs` times: an empty cache, pull(base), then pull(base, { idMap }); the cache is removed after each. */
export async function benchFirstPull(registry: BenchRegistry, runs: number): Promise<FirstPull> {
  const copies: number[] = [];
  const unpacks: number[] = [];
  const mapped: number[] = [];
  const firsts: number[] = [];
  const walls: number[] = [];
  for (let i = 0; i < runs; i++) {
    const root = mkdtempSync(join(tmpdir(), 'asb-bench-cache-'));
    try {
      const timings = capture();
      const store = registry.store(root, timings.log);
      const t0 = performance.now();
      await store.pull(BASE_IMAGE);
      const t1 = performance.now();
      // `Never`: the record and blobs are there, so this only unpacks (base's :latest would copy again under Always).
      await store.pull(BASE_IMAGE, { idMap: ROOT_ID_MAP, policy: 'Never' });
      const t2 = performance.now();
      const copy = timings.ms('skopeo copy')[0] ?? Number.NaN;
      copies.push(copy);
      unpacks.push(timings.ms('image unpacked')[0] ?? Number.NaN);
      walls.push(t1 - t0);
      mapped.push(t2 - t1);
      firsts.push(copy + (t2 - t1));
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  }
  return { runs, pullMs: median(walls), copyMs: median(copies), unpackMs: median(unpacks), idMappedUnpackMs: median(mapped), runtimeFirstPullMs: median(firsts) };
}

/** A debug logger that keeps the `ms` of each message (the image store logs its copy and unpack times). */
function capture(): { log: Logger; ms(msg: string): number[] } {
  const seen: { msg: string; ms: number }[] = [];
  const log = pino({ level: 'debug', base: null }, {
    write(line: string) {
      const entry = JSON.parse(line) as { msg?: string; ms?: number };
      if (entry.msg !== undefined && typeof entry.ms === 'number') seen.push({ msg: entry.msg, ms: entry.ms });
    },
  });
  return { log, ms: (msg) => seen.filter((s) => s.msg === msg).map((s) => s.ms) };
}

function median(xs: readonly number[]): number {
  const sorted = [...xs].sort((a, b) => a - b);
  return round(sorted[Math.floor((sorted.length - 1) / 2)] ?? Number.NaN, 0);
}
