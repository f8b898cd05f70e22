// What a real kubelet and containerd leave on the host, and how the node fixture (kube-node.ts)
// takes it all back: every item of real-node.md §4, measured by the probe of 2026-11-24.
// - Sysctls: the kubelet writes vm.overcommit_memory=1, kernel.panic=10, kernel.panic_on_oops=1
//   at start, and vm.panic_on_oom=0, kernel.keys.root_maxkeys=1000000 and root_maxbytes=25000000
//   where they differ (pkg/kubelet/cm setupKernelTunables). No setting stops that: with
//   protectKernelDefaults it refuses to start instead, and its third behaviour (warn) is never
//   chosen. The values before are saved in the node's directory and written back at teardown (or
//   by the next node's sweep after a crash). No other test depends on them: the memory bombs of the
//   local tests (256 MiB in a 64 MiB cgroup) are killed by their cgroup's OOM killer under either
//   overcommit mode, and security-runtime.test.ts only opens these files, never reads a value.
// - User namespaces: a `kubelet` user with subordinate ids at 2^31 while a node runs (kubelet-subids.ts).
// - Cgroups: the kubelet's cgroupRoot /<name> in every v1 hierarchy (and the pods' below it).
// - Mounts: the kubelet bind-mounts its root dir onto itself; containerd mounts each container's
//   rootfs, each pod's netns file (netns_mounts_under_state_dir) and runsc its null-netns, all
//   under the node's directory.
// - Processes: the shims (containerd-shim-runc-v2/-runsc-v1) outlive containerd by design, and a
//   pod's processes live in its cgroup.
// - kube-proxy's nftables tables (ip and ip6 `kube-proxy`) and our forwarding table, when the
//   node ran Services; a second node's network namespace and link (with its bridge and tables).
// - The bridge of the pod network, and a few fixed paths (/var/lib/kubelet/device-plugins,
//   /run/containerd/s, /var/lib/cni) that no setting moves: removed if the node made them.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** Runs a command, ignoring its failure (what is gone already is fine). */
function tryRun(cmd: string, args: readonly string[]): void {
  try {
    execFileSync(cmd, args, { stdio: 'ignore', timeout: 10_000 });
  } catch {
    // nothing to undo
  }
}

/** A bounded pause inside the synchronous teardown (it also runs from an 'exit' hook, where nothing async runs). */
function pauseMs(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/** The sysctls the kubelet changes (pkg/kubelet/cm setupKernelTunables). */
export const KUBELET_SYSCTLS = ['vm/overcommit_memory', 'kernel/panic', 'kernel/panic_on_oops', 'vm/panic_on_oom', 'kernel/keys/root_maxkeys', 'kernel/keys/root_maxbytes'] as const;
/** Paths the kubelet, containerd and go-cni write whatever root and state say. */
export const FIXED_HOST_PATHS = ['/var/lib/kubelet', '/run/containerd', '/var/lib/cni'] as const;

/** What the host had before the node started, saved as <dir>/host-before.json. */
export interface HostBefore {
  sysctls: Record<string, string>;
  /** Which FIXED_HOST_PATHS did not exist (the node's teardown removes those). */
  absentPaths: string[];
}

export function recordHost(dir: string): HostBefore {
  const before: HostBefore = {
    sysctls: Object.fromEntries(KUBELET_SYSCTLS.map((k) => [k, readFileSync(`/proc/sys/${k}`, 'utf8').trim()])),
    absentPaths: FIXED_HOST_PATHS.filter((p) => !existsSync(p)),
  };
  writeFileSync(join(dir, 'host-before.json'), JSON.stringify(before));
  return before;
}

/** The cgroup v1 hierarchies (and the v2 mount if it has controllers), as directories under /sys/fs/cgroup. */
export function cgroupHierarchies(): string[] {
  const out: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const [pre, post] = line.split(' - ');
    const fields = pre?.split(' ') ?? [];
    const type = post?.split(' ')[0];
    const mountPoint = fields[4];
    if (mountPoint === undefined || (type !== 'cgroup' && type !== 'cgroup2')) continue;
    if (type === 'cgroup2' && readFileSync(join(mountPoint, 'cgroup.controllers'), 'utf8').trim() === '') continue;
    out.push(mountPoint);
  }
  return out;
}

/** Every mount point under dir, deepest first (mountinfo escapes spaces as \040). */
function mountsUnder(dir: string): string[] {
  const prefix = dir.endsWith('/') ? dir : `${dir}/`;
  return readFileSync('/proc/self/mountinfo', 'utf8').split('\n')
    .map((line) => line.split(' ')[4]?.replace(/\\040/g, ' '))
    .filter((m): m is string => m !== undefined && (m === dir || m.startsWith(prefix)))
    .sort((a, b) => b.length - a.length);
}

/** Pids whose command line mentions dir (the shims are started with -address <dir>/…/containerd.sock). */
function pidsMentioning(dir: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${entry}/cmdline`, 'utf8').includes(dir)) pids.push(Number(entry));
    } catch {
      // exited meanwhile
    }
  }
  return pids;
}

/** Pids in a cgroup tree of one hierarchy. */
function pidsInCgroup(root: string): number[] {
  if (!existsSync(root)) return [];
  const pids: number[] = [];
  const walk = (d: string): void => {
    try {
      for (const p of readFileSync(join(d, 'cgroup.procs'), 'utf8').split('\n')) if (p !== '') pids.push(Number(p));
      for (const e of readdirSync(d, { withFileTypes: true })) if (e.isDirectory()) walk(join(d, e.name));
    } catch {
      // removed meanwhile
    }
  };
  walk(root);
  return pids;
}

function kill(pids: readonly number[]): void {
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone already
    }
  }
}

/** rmdir of a cgroup tree, leaves first; a cgroup whose last task is still exiting is retried by the caller. */
function removeCgroupTree(d: string): void {
  if (!existsSync(d)) return;
  for (const e of readdirSync(d, { withFileTypes: true })) if (e.isDirectory()) removeCgroupTree(join(d, e.name));
  try {
    rmdirSync(d);
  } catch {
    // busy: a task still exiting; the caller's next round removes it
  }
}

export interface NodeHostState {
  /** The node's directory (state of containerd, kubelet, CNI, PVs). */
  dir: string;
  /** The kubelet's cgroupRoot, without the leading slash. */
  cgroupName: string;
  bridge: string;
  /** The node's own network namespace (kube-node.ts NODE_SLOT_B): deleted with all it holds. */
  netns?: string;
  /** The host end of that namespace's link, deleted first: a namespace's own links go only when the kernel gets to it. */
  hostVeth?: string;
}

/** The nftables table (inet) that keeps a node's forwarding to its pod networks (kube-node.ts). */
export function forwardTableOf(state: Pick<NodeHostState, 'bridge' | 'hostVeth'>): string {
  return `asb-fwd-${state.hostVeth ?? state.bridge}`;
}

/**
 * Takes back everything the node put on the host (the list at the top). Run after the kubelet and
 * containerd were asked to stop; safe to run again and after a crash (it reads only the host and
 * <dir>/host-before.json). Kills processes by cgroup and by command line, 5 rounds at most.
 * Synchronous (under a second when the kubelet already drained its pods), so the 'exit' hook of
 * a test process that never called stop() runs it too.
 */
export function releaseNodeHost(state: NodeHostState): void {
  const hierarchies = cgroupHierarchies();
  for (let round = 0; round < 5; round++) {
    const pids = [...pidsMentioning(state.dir), ...hierarchies.flatMap((h) => pidsInCgroup(join(h, state.cgroupName)))];
    if (pids.length === 0) break;
    kill(pids);
    pauseMs(100 * (round + 1));
  }
  for (const m of mountsUnder(state.dir)) tryRun('umount', ['-l', m]);
  for (let round = 0; round < 5; round++) {
    for (const h of hierarchies) removeCgroupTree(join(h, state.cgroupName));
    if (hierarchies.every((h) => !existsSync(join(h, state.cgroupName)))) break;
    pauseMs(100 * (round + 1));
  }
  tryRun('nft', ['delete', 'table', 'inet', forwardTableOf(state)]);
  if (state.netns !== undefined) {
    // The link (and the host's route through it) at once; its bridge and kube-proxy's tables go with the namespace.
    if (state.hostVeth !== undefined) tryRun('ip', ['link', 'del', state.hostVeth]);
    tryRun('ip', ['netns', 'del', state.netns]);
  } else {
    tryRun('ip', ['link', 'del', state.bridge]); // veths went with their netns
    // kube-proxy's tables (a cluster with Services: kube-node.ts startKubeCluster); absent otherwise.
    for (const family of ['ip', 'ip6']) tryRun('nft', ['delete', 'table', family, 'kube-proxy']);
  }
  const beforePath = join(state.dir, 'host-before.json');
  if (existsSync(beforePath)) {
    const before = JSON.parse(readFileSync(beforePath, 'utf8')) as HostBefore;
    for (const [key, value] of Object.entries(before.sysctls)) writeFileSync(`/proc/sys/${key}`, value);
    for (const p of before.absentPaths) {
      // Only what is now empty of mounts: a crashed node's leftovers were unmounted above if under dir;
      // under a fixed path nothing of ours stays mounted.
      rmSync(p, { recursive: true, force: true });
    }
  }
  rmSync(state.dir, { recursive: true, force: true });
}

/** Is path a directory that exists (a node's leftover state dir)? */
export function isDir(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}
