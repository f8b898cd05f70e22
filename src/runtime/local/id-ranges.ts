// Host id ranges for sandboxes' user namespaces, one 65,536-id range per sandbox, claimed from a
// pool every runtime on the host shares (a range a live pod holds, in any state dir, is never
// handed out again), kept for the pod's whole life (hibernation, a worker or machine restart: its
// files on disk are owned by that range) and released when it is removed.
// One range shared by every sandbox made them one host user to the kernel: its per-user counts
// (inotify instances, message-queue bytes, pending signals) ran out for every sandbox and for host
// root at once, and an escape from one sandbox's mounts would have owned every other's files.
//
// On disk: <dir>/<slot> holds the pod directory (an absolute path) that owns range <slot>, and
// <dir>/owner-<hash of it> the slot. Every claim, release and sweep runs under one lock, across
// processes (<dir>/pool.lock, the owner lock the stores use) and within one (a chain per
// directory), so a slot has one owner at a time. A claim whose pod directory is gone (ENOENT: a
// state dir deleted without removing its pods) is stale and swept when a runtime starts; any
// other failure to look counts as alive, so a live pod is never robbed.
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, readdir, readFile, rename, stat, unlink, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { AsbError } from '../../errors.ts';
import { acquireOwnerLockWaiting } from '../../store/owner-lock.ts';
import type { IdRange } from '../oci/spec.ts';

/** Shared by every runtime on the host; kept across reboots, as the pods' files are. */
export const DEFAULT_ID_RANGES_DIR = '/var/lib/asb/id-ranges';
export const ID_RANGE_SIZE = 65_536;
/**
 * Slot 0 starts at 2^20: above host accounts (UID_MAX 60000), Debian's subordinate ids
 * (100000-165535, the range every sandbox shared before) and nobody (65534).
 */
export const FIRST_HOST_ID = 2 ** 20;
/** Slots up to 2^32 - 2^16 (uid 2^32-1 is invalid): ~65,000 sandboxes per host. */
export const MAX_SLOTS = (2 ** 32 - FIRST_HOST_ID) / ID_RANGE_SIZE - 1;

export function rangeOfSlot(slot: number): IdRange {
  return { hostId: FIRST_HOST_ID + slot * ID_RANGE_SIZE, size: ID_RANGE_SIZE };
}

function slotOfRange(range: IdRange): number | undefined {
  const slot = (range.hostId - FIRST_HOST_ID) / ID_RANGE_SIZE;
  return Number.isInteger(slot) && slot >= 0 && slot < MAX_SLOTS ? slot : undefined;
}

/** How long a claim waits for another process's claim or release (each takes milliseconds). */
const LOCK_WAIT_MS = 30_000;
const chains = new Map<string, Promise<unknown>>();

/** Runs `step` holding the pool's lock: one claim or release at a time on the host. */
async function locked<T>(dir: string, step: () => Promise<T>): Promise<T> {
  const before = chains.get(dir) ?? Promise.resolve();
  const run = before.catch(() => undefined).then(async () => {
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const lock = await acquireOwnerLockWaiting(join(dir, 'pool'), LOCK_WAIT_MS);
    try {
      return await step();
    } finally {
      lock.release();
    }
  });
  chains.set(dir, run);
  return run;
}

/** Where the slot of `owner` is written too, so a claim or release never reads every claim. */
function indexOf(dir: string, owner: string): string {
  return join(dir, `owner-${createHash('sha256').update(owner).digest('hex').slice(0, 32)}`);
}

/** The slot the index names for `owner`, if that slot's claim is still `owner`'s. */
async function indexedSlot(dir: string, owner: string): Promise<number | undefined> {
  const text = await readFile(indexOf(dir, owner), 'utf8').catch(() => undefined);
  if (text === undefined || !/^\d+$/.test(text)) return undefined;
  const slot = Number(text);
  return (await readFile(join(dir, String(slot)), 'utf8').catch(() => undefined)) === owner ? slot : undefined;
}

/**
 * The range `owner` (a pod directory) holds, or the lowest free one claimed for it now: one
 * readdir, no claim read (a refill of 300 pods read 45,000 claim files when every claim scanned
 * them all). Stale claims are taken back by sweepStaleIdRanges, at every runtime's start.
 */
export function claimIdRange(dir: string, podDir: string): Promise<IdRange> {
  const owner = resolve(podDir);
  return locked(dir, async () => {
    const mine = await indexedSlot(dir, owner);
    if (mine !== undefined) return rangeOfSlot(mine);
    const taken = new Set((await readdir(dir)).filter((name) => /^\d+$/.test(name)).map(Number));
    for (let slot = 0; slot < MAX_SLOTS; slot++) {
      if (taken.has(slot)) continue;
      await writeClaim(dir, slot, owner);
      return rangeOfSlot(slot);
    }
    throw new AsbError('Unavailable', `no free user-namespace id range on this host: all ${String(MAX_SLOTS)} are held (${dir})`);
  });
}

/**
 * Takes back every claim whose pod directory is gone (a state dir deleted without removing its
 * pods, a crash between a remove and its release). Only ENOENT makes a claim stale: any other
 * failure to look counts as alive, so a live pod is never robbed.
 */
export function sweepStaleIdRanges(dir: string): Promise<number> {
  return locked(dir, async () => {
    let swept = 0;
    for (const name of await readdir(dir)) {
      if (!/^\d+$/.test(name)) continue;
      const holder = await readFile(join(dir, name), 'utf8').catch(() => undefined);
      if (holder === undefined || !(await gone(holder))) continue;
      await unlink(join(dir, name));
      await unlink(indexOf(dir, holder)).catch(() => undefined);
      swept++;
    }
    return swept;
  });
}

/**
 * Checks at every start that the pod still holds the range it recorded: made again when its claim
 * is missing (a pool directory lost), refused (Conflict) when a live pod of another state dir holds it.
 */
export function keepIdRange(dir: string, podDir: string, range: IdRange): Promise<void> {
  const owner = resolve(podDir);
  const slot = slotOfRange(range);
  if (slot === undefined) return Promise.resolve(); // the shared range of a pod made before ranges
  return locked(dir, async () => {
    const holder = await readFile(join(dir, String(slot)), 'utf8').catch(() => undefined);
    if (holder === owner) return;
    if (holder !== undefined && !(await gone(holder))) throw new AsbError('Conflict', `pod ${owner} owns host id range ${String(range.hostId)}, which the pool gives to ${holder}; remove one of them`);
    await writeClaim(dir, slot, owner);
  });
}

/** Gives `owner`'s range back: its claim file goes, if it is still `owner`'s. */
export function releaseIdRange(dir: string, podDir: string, range?: IdRange): Promise<void> {
  const owner = resolve(podDir);
  return locked(dir, async () => {
    const slot = (range === undefined ? undefined : slotOfRange(range)) ?? (await indexedSlot(dir, owner));
    if (slot !== undefined && (await readFile(join(dir, String(slot)), 'utf8').catch(() => undefined)) === owner) await unlink(join(dir, String(slot)));
    await unlink(indexOf(dir, owner)).catch(() => undefined);
  });
}

/** Writes the claim and its index whole, then puts them in place (a reader never sees half of one). */
async function writeClaim(dir: string, slot: number, owner: string): Promise<void> {
  for (const [file, text] of [[join(dir, String(slot)), owner], [indexOf(dir, owner), String(slot)]] as const) {
    const tmp = join(dir, `.claim-${String(process.pid)}-${randomBytes(6).toString('hex')}`);
    await writeFile(tmp, text, { mode: 0o600 });
    await rename(tmp, file);
  }
}

/** Only a pod directory that is not there is gone: any other failure to look (EACCES, EIO) counts as alive. */
async function gone(path: string): Promise<boolean> {
  return stat(path).then(() => false, (err: unknown) => (err as NodeJS.ErrnoException).code === 'ENOENT');
}
