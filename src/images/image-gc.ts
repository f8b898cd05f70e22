// Carries out image GC on the cache's disk, under the cache's lock (image-store.ts gc()): gathers
// what gc-decision.ts needs, moves the candidates out of reach, reads the pins again and puts back
// anything a pod pinned meanwhile, then removes the rest and counts the bytes.
//
// Why twice: a runtime pins (pins.ts) and THEN looks its image up, without this lock (a lock per
// start would queue 300 starts of a refill behind any pull). GC moves a candidate and THEN reads
// the pins. Either the pin was there for the second read (the candidate is put back, and a start
// that missed it meanwhile pulls again, behind this lock, and finds it back), or it was written
// after, and the start's lookup, later still, misses it and pulls. A pinned tree is never deleted.
import { randomBytes } from 'node:crypto';
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { chainDirOf, decideGc, type GcRecord, type GcTree } from './gc-decision.ts';
import { removePinFile, scanPins } from './pins.ts';

/**
 * How long an image nobody pins stays after it was pulled or last used: 1 hour. Long enough that
 * a pool scaled to zero and back, or a template used once an hour, does not pull again (base:
 * 4.5 s from the loopback registry, minutes from a remote one); short enough that a worker
 * cycling through task images (SWE-bench: one per task) holds about an hour of them.
 */
export const DEFAULT_GC_GRACE_MS = 60 * 60_000;

export interface GcOptions {
  /** References kept whatever the pins say. */
  keep?: Iterable<string>;
  /** Nothing pulled or used more recently than this is removed. Default DEFAULT_GC_GRACE_MS. */
  graceMs?: number;
}

export interface GcResult {
  readonly removedImages: readonly string[];
  readonly removedRootfs: number;
  /** Pins of pods whose directory is gone (a worker killed before it unpinned). */
  readonly stalePins: number;
  /** Disk space given back by the blobs `umoci gc` removed, and by the trees. */
  readonly blobBytes: number;
  readonly treeBytes: number;
}

export interface CacheAccess {
  root: string;
  /** The OCI layout (root/oci). */
  layout: string;
  clock: Clock;
  log: Logger;
  umoci(args: string[], what: string): Promise<void>;
  /** Tests only: runs in the instant between the two reads of the pins, where a start may pin. */
  betweenScans?: () => Promise<void>;
}

/** One GC pass; the caller holds the cache's lock. `keep`: normalised references. */
export async function collectGarbage(cache: CacheAccess, keep: ReadonlySet<string>, graceMs: number): Promise<GcResult> {
  const { root } = cache;
  restoreTrash(root, cache.log);
  const records = scanRecords(root);
  const trees = scanTrees(root);
  const first = decideGc({ now: cache.clock.now(), graceMs, keep, records, trees, pins: scanPins(root) });
  const trash = join(root, 'tmp', `gc-${String(process.pid)}-${randomBytes(4).toString('hex')}`);
  mkdirSync(join(trash, 'images'), { recursive: true });
  mkdirSync(join(trash, 'rootfs'));
  const record = (tag: string): string => join(root, 'images', `${tag}.json`);
  for (const tag of first.records) renameSync(record(tag), join(trash, 'images', `${tag}.json`));
  for (const dir of first.trees) renameSync(join(root, 'rootfs', dir), join(trash, 'rootfs', dir));

  await cache.betweenScans?.();
  const second = decideGc({ now: cache.clock.now(), graceMs, keep, records, trees, pins: scanPins(root) });
  const stillRecords = new Set(second.records);
  const stillTrees = new Set(second.trees);
  for (const tag of first.records) if (!stillRecords.has(tag)) renameSync(join(trash, 'images', `${tag}.json`), record(tag));
  for (const dir of first.trees) if (!stillTrees.has(dir)) renameSync(join(trash, 'rootfs', dir), join(root, 'rootfs', dir));
  for (const file of second.stalePins) removePinFile(root, file);
  const removedTags = first.records.filter((tag) => stillRecords.has(tag));
  const removedTrees = first.trees.filter((dir) => stillTrees.has(dir));

  const byTag = new Map(records.map((r) => [r.tag, r.reference]));
  for (const tag of removedTags) {
    // The tag leaves the layout so `umoci gc` may collect its manifest, config and layers.
    await cache.umoci(['rm', '--image', `${cache.layout}:${tag}`], `remove ${byTag.get(tag) ?? tag}`).catch((err: unknown) => cache.log.warn({ err, tag }, 'image gc: the layout had no such tag'));
  }
  const blobs = join(cache.layout, 'blobs');
  const blobsBefore = diskBytes(blobs);
  if (existsSync(join(cache.layout, 'index.json'))) await cache.umoci(['gc', '--layout', cache.layout], 'collect unused blobs');
  const blobBytes = Math.max(0, blobsBefore - diskBytes(blobs));
  const treeBytes = diskBytes(join(trash, 'rootfs'));
  // The trash, and whatever else is in tmp/: a pull or unpack cut off by a crash (every pull
  // holds the lock this pass holds, so none is in progress).
  rmSync(join(root, 'tmp'), { recursive: true, force: true });
  mkdirSync(join(root, 'tmp'));
  const result: GcResult = { removedImages: removedTags.map((tag) => byTag.get(tag) ?? tag), removedRootfs: removedTrees.length, stalePins: second.stalePins.length, blobBytes, treeBytes };
  if (removedTags.length > 0 || removedTrees.length > 0 || second.stalePins.length > 0) cache.log.info(result, 'image gc');
  return result;
}

/**
 * Puts back what a GC killed mid-pass (kill -9 of its worker) had moved out of reach: it may hold a
 * tree a pod pinned in that instant, which must not go with the rest of tmp/. This pass decides
 * about it afresh. A copy whose place was filled since (a start pulled it again) is dropped.
 */
function restoreTrash(root: string, log: Logger): void {
  const tmp = join(root, 'tmp');
  for (const gc of readdirSync(tmp).filter((name) => name.startsWith('gc-'))) {
    for (const kind of ['images', 'rootfs']) {
      const from = join(tmp, gc, kind);
      if (!existsSync(from)) continue;
      for (const name of readdirSync(from)) {
        if (existsSync(join(root, kind, name))) continue;
        renameSync(join(from, name), join(root, kind, name));
        log.warn({ name }, 'image gc: put back what an interrupted gc had moved');
      }
    }
    rmSync(join(tmp, gc), { recursive: true, force: true });
  }
}

/** Each images/<tag>.json; its mtime is its last use (written at pull, touched at pin and unpin). */
function scanRecords(root: string): GcRecord[] {
  const dir = join(root, 'images');
  const records: GcRecord[] = [];
  for (const file of readdirSync(dir)) {
    if (!file.endsWith('.json')) continue;
    const path = join(dir, file);
    const stored = JSON.parse(readFileSync(path, 'utf8')) as { reference: string; chainId: string };
    records.push({ tag: file.slice(0, -'.json'.length), reference: stored.reference, chainDir: chainDirOf(stored.chainId), usedAt: statSync(path).mtimeMs });
  }
  return records;
}

function scanTrees(root: string): GcTree[] {
  const dir = join(root, 'rootfs');
  return readdirSync(dir).map((name) => ({ dir: name, usedAt: statSync(join(dir, name)).mtimeMs }));
}

/**
 * Disk blocks under path (as `du` counts them: st_blocks, each hard-linked inode once), never
 * following a symlink (an image's absolute links point onto the host). base's tree: ~0.2-1.5 s.
 */
export function diskBytes(path: string): number {
  const seen = new Set<number>();
  const walk = (p: string): number => {
    let st;
    try {
      st = lstatSync(p);
    } catch {
      return 0;
    }
    if (seen.has(st.ino)) return 0;
    seen.add(st.ino);
    let bytes = st.blocks * 512;
    if (st.isDirectory()) for (const name of readdirSync(p)) bytes += walk(join(p, name));
    return bytes;
  };
  return walk(path);
}
