// The host's processes as /proc shows them, for scripts/test-lanes.ts: a test file's process tree,
// who still holds its output open, killing them, and what keeps the machine busy. Linux only.
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { loadavg } from 'node:os';

export interface Proc {
  pid: number;
  ppid: number;
  /** R, S, D, Z, ... (/proc/<pid>/stat's third field). */
  state: string;
  /** How long it has run. */
  ageMs: number;
}

/** Clock ticks per second of /proc's times (USER_HZ: 100 on Linux). */
const USER_HZ = 100;

const pids = (): number[] => readdirSync('/proc').filter((name) => /^\d+$/.test(name)).map(Number);

/** Every process now (one that ends while it is read is left out). */
export function processes(): Proc[] {
  const all: Proc[] = [];
  const uptimeS = Number(readFileSync('/proc/uptime', 'utf8').split(' ')[0]);
  for (const pid of pids()) {
    let stat: string;
    try {
      stat = readFileSync(`/proc/${String(pid)}/stat`, 'utf8');
    } catch {
      continue; // It ended between the listing and the read.
    }
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so the fields are read
    // after the last ')': the third field (state) first, the 22nd (starttime, in ticks since boot) at 19.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    all.push({ pid, ppid: Number(fields[1]), state: fields[0] ?? '?', ageMs: (uptimeS - Number(fields[19]) / USER_HZ) * 1000 });
  }
  return all;
}

/** A process's children now, from its threads' children lists (cheaper than reading every process). */
export function childrenOf(pid: number): number[] {
  const children: number[] = [];
  try {
    for (const tid of readdirSync(`/proc/${String(pid)}/task`)) {
      const list = readFileSync(`/proc/${String(pid)}/task/${tid}/children`, 'utf8').trim();
      if (list !== '') children.push(...list.split(' ').map(Number));
    }
  } catch {
    // Gone.
  }
  return children;
}

/** A process's command line (none once it has ended). */
export function argsOf(pid: number): string[] {
  try {
    return readFileSync(`/proc/${String(pid)}/cmdline`, 'utf8').split('\0').filter((a) => a !== '');
  } catch {
    return [];
  }
}

/** One line for a process: pid, state, command line. */
export const describe = (p: Proc): string => `${String(p.pid)} ${p.state} ${argsOf(p.pid).join(' ').slice(0, 240)}`;

/** A process and every process below it, parents first. */
export function treeOf(pid: number, all: readonly Proc[]): Proc[] {
  const tree = all.filter((p) => p.pid === pid);
  for (let i = 0; i < tree.length; i++) tree.push(...all.filter((p) => p.ppid === tree[i]?.pid));
  return tree;
}

/** What a process's fds name that a reader can wait on: pipe:[inode] and socket:[inode]; of these fds (1 and 2: its output), or of all. */
export function streamsOf(pid: number, fds?: readonly string[]): string[] {
  const streams: string[] = [];
  let open: readonly string[];
  try {
    open = fds ?? readdirSync(`/proc/${String(pid)}/fd`);
  } catch {
    return streams; // Gone.
  }
  for (const fd of open) {
    try {
      const target = readlinkSync(`/proc/${String(pid)}/fd/${fd}`);
      if (target.startsWith('pipe:') || target.startsWith('socket:')) streams.push(target);
    } catch {
      // Gone, or that fd is closed.
    }
  }
  return streams;
}

/** Every process but `except` holding one of these very streams (a pipe, or this end of a socket pair). */
export function sharing(streams: readonly string[], except: ReadonlySet<number>, all: readonly Proc[]): Proc[] {
  if (streams.length === 0) return [];
  return all.filter((p) => !except.has(p.pid) && streamsOf(p.pid).some((s) => streams.includes(s)));
}

/**
 * The far ends of these streams: a pipe is one inode at both ends; a socket pair's two ends are
 * two, told apart by `ss` (Node gives a child's stdio as socket pairs). What a process reading
 * these waits on is whoever holds the far ends.
 */
export function farEnds(streams: readonly string[]): string[] {
  const far = streams.filter((s) => s.startsWith('pipe:'));
  const sockets = new Set(streams.filter((s) => s.startsWith('socket:')).map((s) => s.slice('socket:['.length, -1)));
  if (sockets.size === 0) return far;
  let table: string;
  try {
    table = execFileSync('ss', ['-x', '-a', '-H'], { encoding: 'utf8' });
  } catch {
    return far;
  }
  // "u_str ESTAB 0 0 * <inode> * <peer inode> ...": an unnamed socket shows `*` and its inode.
  for (const m of table.matchAll(/^\S+\s+\S+\s+\d+\s+\d+\s+\S+\s+(\d+)\s+\S+\s+(\d+)/gm)) {
    if (sockets.has(m[1] ?? '')) far.push(`socket:[${m[2] ?? ''}]`);
  }
  return far;
}

/** SIGKILLs the processes in this order; says the ones it could not kill (not one already gone). */
export function killAll(procs: readonly Proc[], say: (line: string) => void): void {
  for (const p of procs) {
    try {
      process.kill(p.pid, 'SIGKILL');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ESRCH') say(`could not kill ${String(p.pid)}: ${String(err)}`);
    }
  }
}

/** The machine's load and what is busy now (top's second frame: CPU over its last second). */
export function machineNow(): string {
  const [one = 0, five = 0, fifteen = 0] = loadavg();
  let busiest: string;
  try {
    const frames = execFileSync('top', ['-b', '-c', '-n', '2', '-d', '1', '-o', '%CPU', '-w', '200'], { encoding: 'utf8' });
    const last = frames.slice(frames.lastIndexOf('\ntop - ') + 1).split('\n');
    const header = last.findIndex((l) => /^\s*PID\b/.test(l));
    busiest = last.slice(Math.max(0, header), Math.max(0, header) + 11).join('\n');
  } catch (err) {
    busiest = `(top failed: ${String(err)})`;
  }
  return `load average ${one.toFixed(2)} ${five.toFixed(2)} ${fifteen.toFixed(2)}; the busiest processes:\n${busiest}\n`;
}
