// The build layer cache, on disk under the worker's state dir so it survives a restart: one 0700
// directory per team (a team never reuses another's layers), named by a hash of the team:
//   <root>/<team hash>/entries/<key>.json  what a step made (its layer, or none) and the config it left
//   <root>/<team hash>/blobs/<hex>         the layers, gzip'ed tars named by their digest
// The cache owns its blobs (the image cache's GC never sees them), so they are never collected
// while an entry names them; gc() removes the entries unused for longer than an age bound (a hit
// refreshes an entry's mtime), then the blobs no entry names. An entry a live template's build
// was made of (`keep`: the build service's liveCacheKeys, the steps of every build a tag names)
// is never collected, whatever its age, as the image cache never collects a pinned image: a
// rebuild of a template in use stays cached. The worker's image GC loop runs it in each of its
// passes (gc-loop.ts alsoCollect), with a shorter bound when the disk is full; a worker with no
// image cache (Kubernetes) runs the same policy in a loop of its own (layer-cache-gc.ts).
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, readdir, readFile, rename, rm, stat, utimes, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { exists } from '../base/exists.ts';
import type { BuildConfig } from './steps.ts';
import type { LayerBlob } from './layer-writer.ts';

/** Unused entries go after 7 days: a team's weekly rebuild still hits; a disk is not held for ever. */
export const DEFAULT_LAYER_CACHE_AGE_MS = 7 * 24 * 3600_000;
/** Under disk pressure (the image GC's threshold): entries unused for an hour go. */
export const PRESSURE_LAYER_CACHE_AGE_MS = 3600_000;
/** A blob younger than this is kept even if no entry names it yet (a build writing it now). */
const BLOB_GRACE_MS = 3600_000;

export interface CacheEntry {
  /** undefined: the step changed no file (it has no layer). */
  layer?: LayerBlob;
  config: BuildConfig;
}

export class LayerCache {
  readonly #root: string;
  #keep: () => ReadonlySet<string> = () => new Set();

  constructor(root: string) {
    this.#root = root;
  }

  /** The entry keys no pass collects (the live templates' steps), named by the build service made after the cache. */
  keep(live: () => ReadonlySet<string>): void {
    this.#keep = live;
  }

  /** The directory the cache lives in (the filesystem whose usage is its pressure). */
  get root(): string {
    return this.#root;
  }

  /** The team's directory of blobs (made 0700 on first use). */
  async blobsDir(team: string): Promise<string> {
    const dir = join(this.#teamDir(team), 'blobs');
    await mkdir(this.#teamDir(team), { recursive: true, mode: 0o700 });
    await mkdir(dir, { recursive: true, mode: 0o700 });
    return dir;
  }

  blobPath(team: string, digest: string): string {
    return join(this.#teamDir(team), 'blobs', digest.replace(/^sha256:/, ''));
  }

  /** The entry of `key`, when it and its blob are there; a hit marks it used now. */
  async get(team: string, key: string): Promise<CacheEntry | undefined> {
    const path = this.#entryPath(team, key);
    let entry: CacheEntry;
    try {
      entry = JSON.parse(await readFile(path, 'utf8')) as CacheEntry;
    } catch {
      return undefined;
    }
    if (entry.layer !== undefined && !(await exists(this.blobPath(team, entry.layer.digest)))) return undefined;
    const now = new Date();
    await utimes(path, now, now).catch(() => undefined);
    return entry;
  }

  async put(team: string, key: string, entry: CacheEntry): Promise<void> {
    const dir = join(this.#teamDir(team), 'entries');
    await mkdir(this.#teamDir(team), { recursive: true, mode: 0o700 });
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const tmp = join(dir, `.${key}.${randomBytes(4).toString('hex')}.tmp`);
    await writeFile(tmp, JSON.stringify(entry), { mode: 0o600 });
    await rename(tmp, this.#entryPath(team, key));
  }

  /** One pass of the image GC loop (gc-loop.ts alsoCollect): the age bound, shorter under disk pressure. */
  collect(pressure: boolean): Promise<{ entries: number; blobs: number }> {
    return this.gc(pressure ? PRESSURE_LAYER_CACHE_AGE_MS : DEFAULT_LAYER_CACHE_AGE_MS);
  }

  /** Removes entries unused for `maxAgeMs` (but those `keep` names), then blobs no entry names; returns how many of each. */
  async gc(maxAgeMs = DEFAULT_LAYER_CACHE_AGE_MS, now = Date.now()): Promise<{ entries: number; blobs: number }> {
    const keep = this.#keep();
    let entries = 0;
    let blobs = 0;
    for (const team of await list(this.#root)) {
      const entriesDir = join(this.#root, team, 'entries');
      const named = new Set<string>();
      for (const name of await list(entriesDir)) {
        const path = join(entriesDir, name);
        const st = await stat(path).catch(() => undefined);
        if (st === undefined) continue;
        if (now - st.mtimeMs > maxAgeMs && !keep.has(name.slice(0, -'.json'.length))) {
          await rm(path, { force: true });
          entries++;
          continue;
        }
        const entry = JSON.parse(await readFile(path, 'utf8').catch(() => '{}')) as Partial<CacheEntry>;
        if (entry.layer !== undefined) named.add(entry.layer.digest.replace(/^sha256:/, ''));
      }
      const blobsDir = join(this.#root, team, 'blobs');
      for (const name of await list(blobsDir)) {
        if (named.has(name)) continue;
        const st = await stat(join(blobsDir, name)).catch(() => undefined);
        if (st === undefined || now - st.mtimeMs < BLOB_GRACE_MS) continue;
        await rm(join(blobsDir, name), { force: true });
        blobs++;
      }
    }
    return { entries, blobs };
  }

  #teamDir(team: string): string {
    return join(this.#root, createHash('sha256').update(team).digest('hex').slice(0, 32));
  }

  #entryPath(team: string, key: string): string {
    return join(this.#teamDir(team), 'entries', `${key}.json`);
  }
}

async function list(dir: string): Promise<string[]> {
  return readdir(dir).catch(() => []);
}
