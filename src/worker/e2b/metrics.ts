// GET /sandboxes/{id}/metrics: one sample taken now. E2B keeps a time series; we keep nothing, so
// `start`/`end` are accepted and the answer is this one sample, or [] when the pod is not running
// (paused) or the runtime does not run it on this host.
//
// The local runtime reads the pod on the host (PodRuntime.usage, runtime/local/pod-usage.ts):
// memory is its cgroup's working set, CPU its cgroup's time, disk its own disk image, the same
// under runc and gVisor. Without that, from /proc: the pod's init and its descendants (which
// misses runc exec's processes), and the file system of its root.
//
// cpuUsedPct is the average since the pod started (one sample cannot give a rate): CPU seconds
// over wall time, over cpuCount.
import { readdir, readFile, statfs } from 'node:fs/promises';
import type { Sandbox } from '../../api/types.ts';
import type { DiskUsage } from '../../runtime/runtime.ts';
import type { WorkerContext } from '../deps.ts';
import { sizeOf } from './shape.ts';

/** `SandboxMetric` as the SDK reads it. */
export interface E2bMetric {
  timestamp: string;
  timestampUnix: number;
  cpuUsedPct: number;
  cpuCount: number;
  memUsed: number;
  memTotal: number;
  memCache: number;
  diskUsed: number;
  diskTotal: number;
}

/** Kernel clock ticks per second for /proc/<pid>/stat times: 100 on every Linux build we run on. */
const CLK_TCK = 100;
const MIB = 1024 * 1024;

interface ProcStat {
  pid: number;
  ppid: number;
  /** utime + stime, and cutime + cstime (reaped children), in ticks. */
  cpuTicks: number;
  childTicks: number;
  /** Ticks after boot when the process started. */
  startTicks: number;
}

/** Fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses). */
function parseStat(pid: number, text: string): ProcStat | undefined {
  const close = text.lastIndexOf(')');
  if (close === -1) return undefined;
  const f = text.slice(close + 2).split(' ');
  // f[0] is field 3 (state): field n is f[n - 3].
  const num = (n: number): number => Number(f[n - 3] ?? 'NaN');
  const stat = { pid, ppid: num(4), cpuTicks: num(14) + num(15), childTicks: num(16) + num(17), startTicks: num(22) };
  return Object.values(stat).every(Number.isFinite) ? stat : undefined;
}

async function readStat(pid: number): Promise<ProcStat | undefined> {
  try {
    return parseStat(pid, await readFile(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    // The process exited while we looked.
    return undefined;
  }
}

async function rssBytes(pid: number): Promise<number> {
  try {
    const m = /^VmRSS:\s+(\d+) kB$/m.exec(await readFile(`/proc/${pid}/status`, 'utf8'));
    return m?.[1] === undefined ? 0 : Number(m[1]) * 1024;
  } catch {
    return 0;
  }
}

/** The pod's processes: `root` and every process whose parent chain reaches it. */
async function podProcesses(root: number): Promise<ProcStat[]> {
  const pids = (await readdir('/proc')).filter((n) => /^\d+$/.test(n)).map(Number);
  const stats = (await Promise.all(pids.map(readStat))).filter((s): s is ProcStat => s !== undefined);
  const children = new Map<number, ProcStat[]>();
  for (const s of stats) {
    const list = children.get(s.ppid);
    if (list === undefined) children.set(s.ppid, [s]);
    else list.push(s);
  }
  const rootStat = stats.find((s) => s.pid === root);
  if (rootStat === undefined) return [];
  const out: ProcStat[] = [];
  const queue = [rootStat];
  // Bounded by the process count: each process is queued once (the parent relation is a tree).
  for (let s = queue.shift(); s !== undefined && out.length < stats.length; s = queue.shift()) {
    out.push(s);
    queue.push(...(children.get(s.pid) ?? []));
  }
  return out;
}

async function uptimeSeconds(): Promise<number> {
  return Number((await readFile('/proc/uptime', 'utf8')).split(' ')[0]);
}

/**
 * The file system of the pod's root through /proc, for a runtime that has no host-side view
 * (PodRuntime.usage): right under runc (the overlay reports its upper layer's disk), not under
 * gVisor. Undefined when the pod stopped while we looked: no sample now.
 */
async function procRootDisk(pid: number): Promise<DiskUsage | undefined> {
  try {
    const fs = await statfs(`/proc/${pid}/root`);
    return { usedBytes: (fs.blocks - fs.bfree) * fs.bsize, totalBytes: fs.blocks * fs.bsize };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT' || (err as NodeJS.ErrnoException).code === 'ESRCH') return undefined;
    throw err;
  }
}

export async function sampleMetrics(w: WorkerContext, sandbox: Sandbox): Promise<E2bMetric[]> {
  const id = sandbox.metadata.name;
  const pid = w.runtime.state(id).pid;
  if (pid === undefined) return [];
  const procs = await podProcesses(pid);
  const root = procs[0];
  if (root === undefined) return [];
  // The runtime's host-side figures where it has them (the local runtime: the pod's disk and cgroup).
  const host = await w.runtime.usage?.(id);
  const disk = host?.disk ?? (await procRootDisk(pid));
  if (disk === undefined) return [];
  const [uptime, rss] = await Promise.all([uptimeSeconds(), host?.memory === undefined ? Promise.all(procs.map((p) => rssBytes(p.pid))) : []]);
  const { cpuCount, memoryMB } = sizeOf(sandbox);
  const cpuSeconds = host?.cpuSeconds ?? (procs.reduce((sum, p) => sum + p.cpuTicks, 0) + root.childTicks) / CLK_TCK;
  const elapsed = uptime - root.startTicks / CLK_TCK;
  const now = w.clock.now();
  return [{
    timestamp: new Date(now).toISOString(),
    timestampUnix: Math.floor(now / 1000),
    cpuUsedPct: elapsed > 0 ? Math.round((cpuSeconds / elapsed / cpuCount) * 10000) / 100 : 0,
    cpuCount,
    memUsed: host?.memory?.workingSetBytes ?? rss.reduce((a, b) => a + b, 0),
    memTotal: memoryMB * MIB,
    memCache: host?.memory?.cacheBytes ?? 0,
    diskUsed: disk.usedBytes,
    diskTotal: disk.totalBytes,
  }];
}
