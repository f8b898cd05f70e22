// A local pod's snapshots on disk: what snapshot() keeps and what a new pod starts from (a snapshot
// of its own, or one taken for a fork). Each is a directory of the runtime's state dir (0700), kept
// until deleted, whatever happens to the pod it was taken from:
//   <root>/snapshots/<id>/disk.img       a sparse copy of the pod's disk image (its writable layer,
//                                        volumes, /tmp), taken while the pod was paused (synced
//                                        first) or, for files only, its disk frozen
//   <root>/snapshots/<id>/memory/        the sealed runsc image (checkpoint.ts), when memory was kept
//   <root>/snapshots/<id>/config.json    the pod's bundle config: a new pod's must match it where
//                                        runsc compares (sameSandboxSpec), and it carries the token
//                                        of the init's agent, which the restored init has in memory
//   <root>/snapshots/<id>/snapshot.json  what a start needs (SnapshotMeta)
// A snapshot is written under <id>.partial/ and renamed into place once whole; recover() deletes a
// partial one. The files on the copied disk are owned by the source pod's host id range; a new pod
// shifts them to its own (pod-disk.c shift) before it starts.
import { mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { AsbError } from '../../errors.ts';
import type { IdRange, OciSpec } from '../oci/spec.ts';
import type { PodRequest } from '../runtime.ts';
import type { PersistedImage } from './rootfs.ts';

export const SNAPSHOT_META = 'snapshot.json';
const ID = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

export interface SnapshotMeta {
  id: string;
  /** The pod it was taken from (its id; the pod may be gone since). */
  source: string;
  /** The source pod's request: a pod started from the snapshot runs the same spec. */
  request: PodRequest;
  image: PersistedImage;
  /** The host id range the disk's files are owned by (the source pod's). */
  idRange: IdRange;
  /** Whether memory and processes were kept (memory/), or files only. */
  memory: boolean;
  /** Bytes on the host: the disk copy's allocated blocks plus the memory image. */
  bytes: number;
  /** The memory image's bytes (0 without memory). */
  memoryBytes: number;
  at: string;
}

export interface SnapshotPaths {
  dir: string;
  partial: string;
  disk: string;
  memory: string;
  memoryPartial: string;
  config: string;
  meta: string;
}

export function snapshotPaths(root: string, id: string): SnapshotPaths {
  if (!ID.test(id)) throw new AsbError('BadRequest', `snapshot id "${id}" must match ${ID.source}`);
  const dir = join(root, 'snapshots', id);
  const partial = `${dir}.partial`;
  return { dir, partial, disk: join(dir, 'disk.img'), memory: join(dir, 'memory'), memoryPartial: join(partial, 'memory.partial'), config: join(dir, 'config.json'), meta: join(dir, SNAPSHOT_META) };
}

/** The snapshot's description, or NotFound. */
export async function readSnapshot(root: string, id: string): Promise<SnapshotMeta> {
  const paths = snapshotPaths(root, id);
  let text: string;
  try {
    text = await readFile(paths.meta, 'utf8');
  } catch {
    throw new AsbError('NotFound', `snapshot "${id}" not found on this worker`);
  }
  return JSON.parse(text) as SnapshotMeta;
}

/** Writes the description into the partial dir and renames it into place: from here on the snapshot exists. */
export async function sealSnapshot(paths: SnapshotPaths, meta: SnapshotMeta): Promise<void> {
  await writeFile(join(paths.partial, SNAPSHOT_META), JSON.stringify(meta), { mode: 0o600 });
  await rename(paths.partial, paths.dir);
}

export async function makePartial(paths: SnapshotPaths): Promise<void> {
  await mkdir(join(paths.dir, '..'), { recursive: true, mode: 0o700 });
  await rm(paths.partial, { recursive: true, force: true });
  await mkdir(paths.partial, { mode: 0o700 });
}

/** Every whole snapshot's id; partial ones (a worker that died while writing) are deleted. */
export async function listSnapshots(root: string): Promise<string[]> {
  let names: string[];
  try {
    names = await readdir(join(root, 'snapshots'));
  } catch {
    return [];
  }
  await Promise.all(names.filter((n) => n.endsWith('.partial')).map((n) => rm(join(root, 'snapshots', n), { recursive: true, force: true })));
  return names.filter((n) => ID.test(n));
}

/**
 * Whether a new pod's config.json matches the snapshot's wherever runsc's restore compares (research
 * peers-2026-11.md §1.1) except the host id maps, which differ by design (each pod has its own
 * range): the runtime checks the rest here and runsc is told to only warn (oci-shim's global flags),
 * so nothing else may differ silently. Returns what differs, or undefined.
 */
export function specDifference(saved: OciSpec, fresh: OciSpec): string | undefined {
  const comparable = (s: OciSpec): Record<string, unknown> => ({
    ociVersion: s.ociVersion,
    readonly: s.root.readonly,
    mounts: s.mounts.map((m) => ({ destination: m.destination, type: m.type, options: m.options })),
    process: { ...s.process, env: undefined },
    seccomp: s.linux.seccomp,
    namespaces: s.linux.namespaces.map((n) => n.type),
    maskedPaths: s.linux.maskedPaths,
    readonlyPaths: s.linux.readonlyPaths,
  });
  const a = comparable(saved);
  const b = comparable(fresh);
  for (const key of Object.keys(a)) {
    if (JSON.stringify(a[key]) !== JSON.stringify(b[key])) return key;
  }
  return undefined;
}
