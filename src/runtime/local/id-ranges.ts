// Host id ranges for sandboxes' user namespaces, one 65,536-id range per sandbox, claimed from a
// pool every runtime on the host shares (a range a live pod holds, in any state dir, is never
// handed out again), kept for the pod's whole life (hibernation, a worker or machine restart: its
// files on disk are owned by that range) and released when it is removed.
// One range shared by every sandbox made them one host user to the kernel: its per-user counts
// (inotify instances, message-queue bytes, pending signals) ran out for every sandbox and for host
// root at once, and an escape from one sandbox's mounts would have owned every other's files.
//
// On disk: <dir>/<slot> holds the pod directory (an absolute path) that owns range <slot>. Every
// claim and release runs under one lock, across processes (<dir>/pool.lock, the owner lock the
// stores use) and within one (a chain per directory), so a slot has one owner at a time. A claim
// whose pod directory is gone (ENOENT: a state dir deleted without removing its pods) is stale
// and taken over; any other failure to look counts as alive, so a live pod is never robbed.
import { randomBytes } from 'node:crypto';
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

/** Who holds each slot now: slot → owner, read under the lock. */
async function holders(dir: string): Promise<Map<number, string>> {
  const found = new Map<number, string>();
  for (const name of await readdir(dir)) {
    if (!/^\d+$/.test(name)) continue;
    const holder = await readFile(join(dir, name), 'utf8').catch(() => undefined);
    if (holder !== undefined) found.set(Number(name), holder);
  }
  return found;
}

/** The range `owner` (a pod directory) holds, or a free one claimed for it now. */
export function claimIdRange(dir: string, podDir: string): Promise<IdRange> {
  const owner = resolve(podDir);
  return locked(dir, async () => {
    const held = await holders(dir);
    for (const [slot, holder] of held) if (holder === owner) return rangeOfSlot(slot);
    // The lowest slot not held by a live pod, so the pool stays as small as the host's pods.
    for (let slot = 0; slot < MAX_SLOTS; slot++) {
      const holder = held.get(slot);
      if (holder !== undefined && !(await gone(holder))) continue;
      await writeClaim(dir, slot, owner);
      return rangeOfSlot(slot);
    }
    throw new AsbError('Unavailable', `no free user-namespace id range on this host: all ${String(MAX_SLOTS)} are held (${dir})`);
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
    const slot = range === undefined ? undefined : slotOfRange(range);
    const names = slot === undefined ? await readdir(dir) : [String(slot)];
    for (const name of names) {
      const file = join(dir, name);
      if (/^\d+$/.test(name) && (await readFile(file, 'utf8').catch(() => undefined)) === owner) await unlink(file);
    }
  });
}

/** Writes the claim whole, then puts it in place (a reader never sees half of it). */
async function writeClaim(dir: string, slot: number, owner: string): Promise<void> {
  const tmp = join(dir, `.claim-${String(process.pid)}-${randomBytes(6).toString('hex')}`);
  await writeFile(tmp, owner, { mode: 0o600 });
  await rename(tmp, join(dir, String(slot)));
}

/** Only a pod directory that is not there is gone: any other failure to look (EACCES, EIO) counts as alive. */
async function gone(path: string): Promise<boolean> {
  return stat(path).then(() => false, (err: unknown) => (err as NodeJS.ErrnoException).code === 'ENOENT');
}
