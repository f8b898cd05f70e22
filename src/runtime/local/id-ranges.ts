// Host id ranges for sandboxes' user namespaces, one 65,536-id range per sandbox, claimed from a
// pool every runtime on the host shares (a range in use by a pod of another state dir is never
// handed out again), kept for the pod's whole life (hibernation, a worker or machine restart: its
// files on disk are owned by that range) and released when it is removed.
// One range shared by every sandbox made them one host user to the kernel: its per-user counts
// (inotify instances, message-queue bytes, pending signals) ran out for every sandbox and for host
// root at once, and an escape from one sandbox's mounts would have owned every other's files.
//
// On disk: <dir>/<slot> holds the pod directory that owns range <slot>, made with link(2) of a
// complete file, so two processes claiming at once never both get a slot. A claim whose pod
// directory is gone (a state dir deleted without removing its pods) is stale and taken over.
import { randomBytes } from 'node:crypto';
import { link, mkdir, readdir, readFile, rename, stat, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { AsbError } from '../../errors.ts';
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

/** The range `owner` (a pod directory) holds, or a free one claimed for it now. */
export async function claimIdRange(dir: string, owner: string): Promise<IdRange> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const taken = new Set<number>();
  const stale: number[] = [];
  for (const name of await readdir(dir)) {
    if (!/^\d+$/.test(name)) continue;
    const slot = Number(name);
    const holder = await readFile(join(dir, name), 'utf8').catch(() => undefined);
    if (holder === owner) return rangeOfSlot(slot);
    if (holder !== undefined && !(await exists(holder))) stale.push(slot);
    else taken.add(slot);
  }
  const claim = join(dir, `.claim-${String(process.pid)}-${randomBytes(6).toString('hex')}`);
  await writeFile(claim, owner, { mode: 0o600 });
  try {
    // The lowest slot not held by a live pod, so the pool stays as small as the host's pods.
    for (let slot = 0; slot < MAX_SLOTS; slot++) {
      if (taken.has(slot)) continue;
      if (stale.includes(slot)) {
        // Only one taker's rename moves the stale claim away; a later one finds the slot taken.
        const trash = `${claim}.stale`;
        if (!(await rename(join(dir, String(slot)), trash).then(() => true, () => false))) continue;
        await unlink(trash);
      }
      if (await linked(claim, join(dir, String(slot)))) return rangeOfSlot(slot);
    }
  } finally {
    await unlink(claim).catch(() => undefined);
  }
  throw new AsbError('Unavailable', `no free user-namespace id range on this host: all ${String(MAX_SLOTS)} are held (${dir})`);
}

/** Gives `owner`'s range back: its claim file goes, if it is still `owner`'s. */
export async function releaseIdRange(dir: string, owner: string, range?: IdRange): Promise<void> {
  const slot = range === undefined ? undefined : slotOfRange(range);
  const names = slot === undefined ? await readdir(dir).catch(() => []) : [String(slot)];
  for (const name of names) {
    const file = join(dir, name);
    if (/^\d+$/.test(name) && (await readFile(file, 'utf8').catch(() => undefined)) === owner) await unlink(file).catch(() => undefined);
  }
}

async function linked(from: string, to: string): Promise<boolean> {
  try {
    await link(from, to);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw err;
  }
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(() => true, () => false);
}
