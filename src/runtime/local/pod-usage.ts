// What a running pod uses, read on the host (E2B's getMetrics): its disk image's file system and
// its cgroup's memory and CPU. The same on both runtime classes, because both leave the same
// host-side traces, where a look through /proc does not:
// - a process tree from the pod's init misses every exec'd process under runc (runc exec's
//   processes are children of runc, not of the init): a 200 MiB Python started by E2B's
//   commands.run showed as 2.1 MiB;
// - under gVisor the init is the sentry: /proc/<pid>/root is its own empty root (the host's disk,
//   12.6 GB here, not the pod's 10 GiB), and the sentry's RSS plus its systrap stubs' count the
//   application's memory twice (the same 200 MiB showed as 468 MiB).
// runc puts the container, and runsc the sentry, its gofer and its stubs, in the pod's cgroup.
import { readFile, stat, statfs } from 'node:fs/promises';
import { join } from 'node:path';
import type { DiskUsage, PodUsage } from '../runtime.ts';

const CGROUP_ROOT = '/sys/fs/cgroup';

/** `key value` lines (memory.stat, cpu.stat) as numbers. */
export function parseFlatKeyed(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    const [key, value] = line.trim().split(/\s+/);
    if (key !== undefined && value !== undefined && /^\d+$/.test(value)) out.set(key, Number(value));
  }
  return out;
}

/**
 * The working set, as the kubelet counts it (container_memory_working_set_bytes): usage less the
 * inactive page cache, which the kernel takes back first. gVisor's application memory is a
 * memfd (shmem, on the anon lists), so it counts, as anonymous memory does under runc. cgroup v1
 * names the hierarchical counter total_inactive_file; v2 inactive_file.
 */
export function workingSet(usageBytes: number, memoryStat: Map<string, number>): { workingSetBytes: number; cacheBytes: number } {
  const inactive = memoryStat.get('total_inactive_file') ?? memoryStat.get('inactive_file') ?? 0;
  const cache = memoryStat.get('total_cache') ?? memoryStat.get('file') ?? 0;
  return { workingSetBytes: Math.max(0, usageBytes - inactive), cacheBytes: cache };
}

async function readOptional(path: string): Promise<string | undefined> {
  try {
    return await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}

/** Memory and CPU of the cgroup at `path` (`/asb-<hash>/<id>`), v1 or v2; undefined fields where it has none. */
export async function cgroupUsage(path: string): Promise<Pick<PodUsage, 'memory' | 'cpuSeconds'>> {
  const [v1Usage, v1Stat, v1Cpu] = await Promise.all([
    readOptional(join(CGROUP_ROOT, 'memory', path, 'memory.usage_in_bytes')),
    readOptional(join(CGROUP_ROOT, 'memory', path, 'memory.stat')),
    readOptional(join(CGROUP_ROOT, 'cpuacct', path, 'cpuacct.usage')),
  ]);
  if (v1Usage !== undefined || v1Cpu !== undefined) {
    return {
      ...(v1Usage === undefined ? {} : { memory: workingSet(Number(v1Usage), parseFlatKeyed(v1Stat ?? '')) }),
      ...(v1Cpu === undefined ? {} : { cpuSeconds: Number(v1Cpu) / 1e9 }),
    };
  }
  const [current, memoryStat, cpuStat] = await Promise.all([
    readOptional(join(CGROUP_ROOT, path, 'memory.current')),
    readOptional(join(CGROUP_ROOT, path, 'memory.stat')),
    readOptional(join(CGROUP_ROOT, path, 'cpu.stat')),
  ]);
  const usec = cpuStat === undefined ? undefined : parseFlatKeyed(cpuStat).get('usage_usec');
  return {
    ...(current === undefined ? {} : { memory: workingSet(Number(current), parseFlatKeyed(memoryStat ?? '')) }),
    ...(usec === undefined ? {} : { cpuSeconds: usec / 1e6 }),
  };
}

/** The file system mounted at `mount` (the pod's disk), or undefined when nothing is mounted there (a pod made before disks). */
export async function mountedDiskUsage(mount: string, parent: string): Promise<DiskUsage | undefined> {
  try {
    const [m, p] = await Promise.all([stat(mount), stat(parent)]);
    // A mount point has its own device; the bare directory does not.
    if (m.dev === p.dev) return undefined;
    const fs = await statfs(mount);
    return { usedBytes: (fs.blocks - fs.bfree) * fs.bsize, totalBytes: fs.blocks * fs.bsize };
  } catch (err) {
    // Removed or unmounted while we looked (a pause racing this call).
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}
