// A sandbox pod's disk cap: `resources.limits.ephemeral-storage` covers the writable layer, the
// volumes and the log, as the kubelet counts them. Each pod gets a sparse ext4 image of that size
// (<pod>/disk.img, a copy of an empty one), loop-mounted at <pod>/disk while the pod runs
// (pod-disk.c makes and mounts it; oci-shim.c unmounts it when the container ends). Writes past it
// fail with ENOSPC, and a pod whose disk stays full is evicted by its shim: phase Failed, reason
// Evicted, with the kubelet's message (evictionMessage).
//
// Why an image and not a quota: project quotas need the state dir's filesystem mounted with
// prjquota (the host's / here is not, and we do not remount a host's root); an image works on any
// filesystem, is one file to delete, and a loop mount costs 3-8 ms (research/runtime.md §2b).
// Sparse, so a 10 GiB disk costs the host what the sandbox writes (4.3 MiB of ext4 metadata when
// new), and mounted with `discard`, so deleting a file gives the blocks back to the host.
import { access, mkdir, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { parseQuantity } from '../../api/quantity.ts';
import type { PodSpec } from '../../api/types.ts';
import { AsbError } from '../../errors.ts';
import { ensureCBinary } from '../../base/c-binary.ts';

/**
 * The disk of a pod whose containers set no ephemeral-storage limit. Kubernetes sets none by
 * default (a pod may fill its node); here the cap is what keeps one sandbox from filling the disk
 * that holds every other sandbox and the store. 10 GiB is what E2B gives a sandbox on its Hobby
 * tier (20 GB on Pro), room for packages, a repository and its build; being sparse it costs
 * the host nothing until written. A template sets another through its pod template's limits.
 */
export const DEFAULT_EPHEMERAL_STORAGE = '10Gi';
/** The smallest disk: ext4's own metadata (journal, inode tables) takes ~8 MiB of a 64 MiB image. */
export const MIN_DISK_BYTES = 16 * 2 ** 20;

export interface PodDisk {
  /** Bytes of the image: the containers' limits added up (the kubelet's pod total), or the default. */
  bytes: number;
  /** That limit as a quantity, for messages: "64Mi". */
  limit: string;
}

/** The pod's disk size from its containers' `resources.limits.ephemeral-storage`; an `Invalid` AsbError naming the field when it cannot be one. */
export function podDisk(spec: PodSpec): PodDisk {
  let bytes = 0;
  const written: string[] = [];
  for (const [i, container] of spec.containers.entries()) {
    const value = container.resources?.limits?.['ephemeral-storage'];
    if (value === undefined) continue;
    const field = `containers[${String(i)}].resources.limits.ephemeral-storage`;
    const parsed = parseQuantity(value);
    if (parsed === undefined) throw new AsbError('Invalid', `${field} must be a quantity such as "10Gi", got ${JSON.stringify(value)}`, { fields: [{ field, message: 'must be a quantity such as "10Gi"' }] });
    bytes += parsed;
    written.push(String(value));
  }
  if (written.length === 0) return { bytes: parseQuantity(DEFAULT_EPHEMERAL_STORAGE) ?? 0, limit: DEFAULT_EPHEMERAL_STORAGE };
  const limit = written.length === 1 ? (written[0] ?? '') : formatBytes(bytes);
  if (bytes < MIN_DISK_BYTES) {
    const field = 'resources.limits.ephemeral-storage';
    const message = `must be at least 16Mi (the disk's filesystem needs a few MiB of its own), got ${limit}`;
    throw new AsbError('Invalid', `${field} ${message}`, { fields: [{ field, message }] });
  }
  // Whole 4 KiB blocks, rounded up as Kubernetes rounds quantities up to whole bytes.
  return { bytes: Math.ceil(bytes / 4096) * 4096, limit };
}

/** What the kubelet says when it evicts a pod past its limit (pkg/kubelet/eviction/helpers.go). */
export function evictionMessage(spec: PodSpec): string {
  let limit: string;
  try {
    limit = podDisk(spec).limit;
  } catch {
    limit = 'set'; // cannot happen: the pod started with this spec, so it was valid
  }
  return `Pod ephemeral local storage usage exceeds the total limit of containers ${limit}.`;
}

/** The largest binary unit that divides bytes: 67108864 → "64Mi". */
export function formatBytes(bytes: number): string {
  for (const [unit, scale] of [['Ti', 2 ** 40], ['Gi', 2 ** 30], ['Mi', 2 ** 20], ['Ki', 2 ** 10]] as const) {
    if (bytes >= scale && bytes % scale === 0) return `${String(bytes / scale)}${unit}`;
  }
  return String(Math.ceil(bytes));
}

/** How the runtime runs pod-disk: through its launcher, so the worker never forks per pod. */
export type RunHelper = (argv: readonly string[]) => Promise<{ code: number; output: string }>;

export interface DiskTool {
  /** Makes the image if it is missing and mounts it at dir (nothing when mounted already). */
  mount(image: string, dir: string, bytes: number): Promise<void>;
  /** Unmounts dir when something is mounted there. */
  unmount(dir: string): Promise<void>;
  /** Gives every file under dir owned by an id of `from` the id at the same offset in `to` (a disk copied from another sandbox). */
  shift(dir: string, from: number, to: number, size: number): Promise<void>;
  /** Freezes the filesystem mounted at dir (its image is consistent on the host) until thaw. */
  freeze(dir: string): Promise<void>;
  thaw(dir: string): Promise<void>;
  /**
   * A sparse copy of image to `to`. With `mounted`, the filesystem of the image mounted at its dir
   * is first frozen for the copy (its sandbox runs on), or synced (its sandbox is paused: pod-disk.c).
   */
  copy(image: string, to: string, mounted?: { dir: string; quiesce: 'freeze' | 'sync' }): Promise<void>;
}

/**
 * pod-disk.c, compiled into root/bin on first use. Each pod's image is a sparse copy of an empty
 * ext4 of its size, made once per size under root/disk-templates (pod-disk.c says why: a mkfs per
 * pod cost a process and a flush of the host disk each).
 */
export function diskTool(root: string, run: RunHelper): DiskTool {
  const templates = join(root, 'disk-templates');
  let binary: Promise<string> | undefined;
  const call = async (args: string[]): Promise<void> => {
    binary ??= ensureCBinary(root, new URL('./pod-disk.c', import.meta.url));
    const { code, output } = await run([await binary, ...args]);
    if (code !== 0) throw new Error(`pod disk: ${output.trim().replace(/^error /, '') || `exit code ${String(code)}`}`);
  };
  return {
    async mount(image, dir, bytes) {
      await mkdir(dir, { recursive: true, mode: 0o700 });
      await call(['mount', image, dir, String(bytes), templates]);
    },
    async unmount(dir) {
      if (await mountPoint(dir)) await call(['umount', dir]);
    },
    shift: (dir, from, to, size) => call(['shift', dir, String(from), String(to), String(size)]),
    freeze: (dir) => call(['freeze', dir]),
    thaw: (dir) => call(['thaw', dir]),
    async copy(image, to, mounted) {
      try {
        await call(['copy', image, to, ...(mounted === undefined ? [] : [mounted.dir, mounted.quiesce])]);
      } catch (err) {
        // pod-disk thaws after its copy, but not when it died before: a frozen disk stops its sandbox.
        if (mounted?.quiesce === 'freeze') await call(['thaw', mounted.dir]).catch(() => undefined);
        throw err;
      }
    },
  };
}

/** Whether a filesystem is mounted at dir (it has a device of its own); false when dir is missing. */
async function mountPoint(dir: string): Promise<boolean> {
  try {
    const [inner, outer] = await Promise.all([stat(dir), stat(dirname(dir))]);
    return inner.dev !== outer.dev;
  } catch {
    return false;
  }
}

/** A pod dir made before disks (its upper/ beside no disk.img) keeps its plain directories: rootfs.ts' legacyLayout. */
export async function madeBeforeDisks(dir: string): Promise<boolean> {
  const [image, upper] = await Promise.all([present(`${dir}/disk.img`), present(`${dir}/upper`)]);
  return !image && upper;
}

async function present(path: string): Promise<boolean> {
  try {
    await access(path);
    return true;
  } catch {
    return false;
  }
}
