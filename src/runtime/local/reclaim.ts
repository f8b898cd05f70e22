// The reclaim sweep a local runtime runs at start, after it has adopted the pods that still run:
// everything a killed worker (or a killed shim) left of pods that no longer run is removed, so a
// crash leaks nothing however often it happens. E2B's self-hosters found dozens of orphaned
// sandboxes with their sockets and firewall rules after orchestrator restarts, and containerd has
// open shim, cgroup and IP leaks under churn (shared/research/peers-2026-11.md §4): a sweep at
// start is their fix too.
//
// Only what is provably this runtime's is touched, never by a name pattern alone: mounts under its
// state dir's pods/ and its own mount root (/run/asb/rootfs/<hash of its root>), containers in its
// own runc and runsc roots, cgroups under its own parent (/asb-<hash>), ports of its own bridge,
// and the gVisor null-netns mount in its runsc root. Other runtimes on the host (other state dirs,
// other engineers' tests, `make up`) have other roots, hashes and bridges.
//
// reclaimPlan is pure (facts and the live pods in, actions out); readHostFacts reads the facts.
import { readdir, readFile, rm, rmdir, stat } from 'node:fs/promises';
import { join } from 'node:path';

export interface ReclaimScope {
  /** The state dir, resolved: pods live in <root>/pods/<id>. */
  root: string;
  runcRoot: string;
  runscRoot?: string;
  /** Parent of the pods' mount points, /run/asb/rootfs/<hash of root>. */
  mountRoot: string;
  /** The pods' cgroup parent, /asb-<hash of root>. */
  cgroupParent: string;
  bridge: string;
}

export interface HostFacts {
  /** Every mount point of the host, in mount order; a path mounted over itself appears once per mount. */
  mountPoints: string[];
  /** Container ids in the runc root. */
  runcContainers: string[];
  /** Container ids in the runsc root (from its `<sandbox>_sandbox:<container>.state` files). */
  runscContainers: string[];
  /** Cgroup directories (absolute) directly under the parent, in every hierarchy. */
  cgroups: string[];
  /** Interfaces enslaved to the bridge. */
  bridgePorts: string[];
  /** Entries of the mount root (one per pod that had a mount point). */
  mountDirs: string[];
  /** Attached loop devices and the files behind them (a pod's disk image lies in <root>/pods/<id>/). */
  loops: { device: string; backingFile: string }[];
}

/** The pods that run (adopted), which keep everything of theirs. */
export interface LivePods {
  ids: ReadonlySet<string>;
  /** Their host-side veth names. */
  veths: ReadonlySet<string>;
  /** Whether any of them runs under gVisor (it keeps the runsc root's null-netns mount). */
  gvisor: boolean;
}

export type ReclaimAction =
  | { kind: 'delete-container'; runtime: 'runc' | 'runsc'; id: string }
  | { kind: 'unmount'; path: string }
  | { kind: 'delete-veth'; name: string }
  | { kind: 'remove-cgroup'; path: string }
  | { kind: 'detach-loop'; device: string }
  | { kind: 'remove-mount-dir'; id: string };

/** The pod a path of its belongs to (under pods/<id>/ or the mount root's <id>/), or undefined. */
function podOf(scope: ReclaimScope, path: string): string | undefined {
  for (const parent of [join(scope.root, 'pods'), scope.mountRoot]) {
    if (path.startsWith(`${parent}/`)) return path.slice(parent.length + 1).split('/')[0];
  }
  return undefined;
}

/** A runsc container id → its pod's id (`<pod>.pod`, or the bare pod id of pods started before that). */
export function runscPod(containerId: string): string {
  return containerId.endsWith('.pod') ? containerId.slice(0, -'.pod'.length) : containerId;
}

/**
 * What to remove, in an order that works: containers first (their deletion kills what still runs
 * and frees their cgroups), then mounts deepest first (a mount inside another goes before it), the
 * loop devices of dead pods' disks, the bridge ports, the cgroups (only empty ones can go: a cgroup with a process is never forced), and
 * the mount-point directories last.
 */
export function reclaimPlan(scope: ReclaimScope, facts: HostFacts, live: LivePods): ReclaimAction[] {
  const actions: ReclaimAction[] = [];
  const dead = (id: string | undefined): id is string => id !== undefined && !live.ids.has(id);
  for (const id of facts.runcContainers) if (dead(id)) actions.push({ kind: 'delete-container', runtime: 'runc', id });
  for (const id of facts.runscContainers) if (dead(runscPod(id))) actions.push({ kind: 'delete-container', runtime: 'runsc', id });
  const unmount = facts.mountPoints.filter((path) => dead(podOf(scope, path)));
  // runsc pins an empty namespace for its gofers there, and concurrent first starts stack one
  // mount per start (runsc's pinNullNetNS): a live gVisor pod keeps one, none is left otherwise.
  if (scope.runscRoot !== undefined) {
    const nullNetns = join(scope.runscRoot, 'null-netns');
    const stacked = facts.mountPoints.filter((path) => path === nullNetns).length;
    for (let i = live.gvisor ? 1 : 0; i < stacked; i++) unmount.push(nullNetns);
  }
  unmount.sort((a, b) => b.split('/').length - a.split('/').length);
  for (const path of unmount) actions.push({ kind: 'unmount', path });
  // A disk attached but never mounted (a worker killed between the two) is no mount to undo, and
  // one lazily unmounted above goes once released: detaching marks either to go when unused.
  for (const loop of facts.loops) if (dead(podOf(scope, loop.backingFile))) actions.push({ kind: 'detach-loop', device: loop.device });
  for (const name of facts.bridgePorts) if (!live.veths.has(name)) actions.push({ kind: 'delete-veth', name });
  for (const path of facts.cgroups) if (dead(path.split('/').pop())) actions.push({ kind: 'remove-cgroup', path });
  for (const id of facts.mountDirs) if (dead(id)) actions.push({ kind: 'remove-mount-dir', id });
  return actions;
}

async function names(dir: string): Promise<string[]> {
  return readdir(dir).catch(() => []);
}

async function isDir(path: string): Promise<boolean> {
  return (await stat(path).catch(() => undefined))?.isDirectory() === true;
}

/** mountinfo's escapes (\040 for a space and the like) undone. */
function unescapeMount(path: string): string {
  return path.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(Number.parseInt(octal, 8)));
}

/** Reads the facts reclaimPlan needs, for this scope only. */
export async function readHostFacts(scope: ReclaimScope): Promise<HostFacts> {
  const mountPoints = await readMountPoints();
  const runscContainers: string[] = [];
  if (scope.runscRoot !== undefined) {
    for (const name of await names(scope.runscRoot)) {
      const m = /^.+_sandbox:(.+)\.state$/.exec(name);
      if (m?.[1] !== undefined) runscContainers.push(m[1]);
    }
  }
  const runcContainers: string[] = [];
  for (const name of await names(scope.runcRoot)) if (await isDir(join(scope.runcRoot, name))) runcContainers.push(name);
  const cgroups: string[] = [];
  const hierarchies = ['/sys/fs/cgroup', ...(await names('/sys/fs/cgroup')).map((c) => join('/sys/fs/cgroup', c))];
  for (const hierarchy of hierarchies) {
    const parent = join(hierarchy, scope.cgroupParent);
    for (const name of await names(parent)) if (await isDir(join(parent, name))) cgroups.push(join(parent, name));
  }
  return {
    mountPoints,
    runcContainers,
    runscContainers,
    cgroups,
    bridgePorts: await names(`/sys/class/net/${scope.bridge}/brif`),
    mountDirs: await names(scope.mountRoot),
    loops: await attachedLoops(),
  };
}

/** Loop devices with a file behind them (/sys/block/loopN/loop/backing_file). */
async function attachedLoops(): Promise<{ device: string; backingFile: string }[]> {
  const loops: { device: string; backingFile: string }[] = [];
  for (const name of (await names('/sys/block')).filter((n) => /^loop\d+$/.test(n))) {
    const backing = (await readFile(`/sys/block/${name}/loop/backing_file`, 'utf8').catch(() => '')).trim();
    if (backing !== '') loops.push({ device: `/dev/${name}`, backingFile: backing });
  }
  return loops;
}

/** Counts of a plan's actions by kind, for the log. */
export function planSummary(actions: readonly ReclaimAction[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const a of actions) counts[a.kind] = (counts[a.kind] ?? 0) + 1;
  return counts;
}

/** A host process: its pid and argv. */
export interface HostProcess {
  pid: number;
  argv: string[];
}

/** Every process's argv (kernel threads and processes gone meanwhile are skipped). */
export async function readProcesses(): Promise<HostProcess[]> {
  const out: HostProcess[] = [];
  for (const name of await names('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const cmdline = await readFile(`/proc/${name}/cmdline`, 'utf8').catch(() => '');
    if (cmdline !== '') out.push({ pid: Number(name), argv: cmdline.split('\0').filter((a, i, all) => a !== '' || i < all.length - 1) });
  }
  return out;
}

/** The subcommands of a memory save (pod-memory.ts' savePaused): nobody finishes one once its worker is gone. */
const SAVE_STEPS = new Set(['pause', 'checkpoint']);

/**
 * runc or runsc commands of a save the dead worker started on one of `roots` (its runc and runsc
 * roots): `<binary> [flags] --root <root> pause|checkpoint ...`. A sandbox's own runsc processes
 * (`--root=<root> ... boot|gofer`) are never among them.
 */
export function straySaves(procs: readonly HostProcess[], roots: readonly string[]): number[] {
  return procs.filter(({ argv }) => {
    const at = argv.indexOf('--root');
    return at >= 0 && roots.includes(argv[at + 1] ?? '') && SAVE_STEPS.has(argv[at + 2] ?? '');
  }).map((p) => p.pid);
}

/** Shims of this runtime (`<root>/bin/oci-shim-* -d <root>/pods/<id> ...`): pid and pod id. */
export function shimsOf(procs: readonly HostProcess[], root: string): { pid: number; id: string }[] {
  const out: { pid: number; id: string }[] = [];
  for (const { pid, argv } of procs) {
    if (!(argv[0] ?? '').startsWith(join(root, 'bin', 'oci-shim'))) continue;
    const dir = argv[argv.indexOf('-d') + 1] ?? '';
    const id = dir.startsWith(join(root, 'pods') + '/') ? dir.slice(join(root, 'pods').length + 1) : undefined;
    if (id !== undefined && !id.includes('/')) out.push({ pid, id });
  }
  return out;
}

/**
 * Whether a gVisor container is paused, from runsc's own state file (runsc saves its status there
 * at pause and resume): `<sandbox>_sandbox:<container>.state`, one sandbox per pod, so both ids are the container's.
 */
export async function runscPaused(runscRoot: string, containerId: string): Promise<boolean> {
  const text = await readFile(join(runscRoot, `${containerId}_sandbox:${containerId}.state`), 'utf8').catch(() => '{}');
  return (JSON.parse(text) as { status?: unknown }).status === 'paused';
}

/** Whether a runc container's cgroup is frozen (runc pause: the v1 freezer, or v2's cgroup.freeze). */
export async function runcFrozen(cgroup: string): Promise<boolean> {
  const v1 = await readFile(join('/sys/fs/cgroup/freezer', cgroup, 'freezer.state'), 'utf8').catch(() => undefined);
  if (v1 !== undefined) return v1.trim() !== 'THAWED';
  return (await readFile(join('/sys/fs/cgroup', cgroup, 'cgroup.freeze'), 'utf8').catch(() => '0')).trim() === '1';
}

export type Runner = (argv: readonly string[]) => Promise<{ code: number; output: string }>;

export interface ReclaimTools {
  run: Runner;
  runc: { binary: string; flags: readonly string[] };
  runsc?: { binary: string; flags: readonly string[] };
}

/** Removes a cgroup and the cgroups below it, deepest first; only empty ones can go (rmdir), never forced. */
async function removeCgroup(path: string): Promise<void> {
  for (const name of await names(path)) if (await isDir(join(path, name))) await removeCgroup(join(path, name));
  await rmdir(path);
}

/**
 * Carries out a plan; each action on its own (one that fails does not stop the others). Resolves
 * with what failed, each saying why, for the log: the next start tries again.
 */
export async function carryOut(scope: ReclaimScope, actions: readonly ReclaimAction[], tools: ReclaimTools): Promise<string[]> {
  const failed: string[] = [];
  const must = async (what: string, argv: readonly string[]): Promise<void> => {
    const r = await tools.run(argv);
    if (r.code !== 0) failed.push(`${what}: ${r.output.trim().split('\n').pop() ?? `exit code ${String(r.code)}`}`);
  };
  for (const a of actions) {
    switch (a.kind) {
      case 'delete-container': {
        const rt = a.runtime === 'runc' ? tools.runc : tools.runsc;
        const root = a.runtime === 'runc' ? scope.runcRoot : scope.runscRoot;
        if (rt === undefined || root === undefined) failed.push(`${a.runtime} container ${a.id}: no ${a.runtime} here`);
        else await must(`${a.runtime} delete ${a.id}`, [rt.binary, ...rt.flags, '--root', root, 'delete', '--force', a.id]);
        break;
      }
      case 'unmount':
        await must(`unmount ${a.path}`, ['umount', '--lazy', a.path]);
        break;
      case 'detach-loop':
        await must(`detach ${a.device}`, ['losetup', '--detach', a.device]);
        break;
      case 'delete-veth':
        await must(`delete ${a.name}`, ['ip', 'link', 'del', a.name]);
        break;
      case 'remove-cgroup':
        await removeCgroup(a.path).catch((err: unknown) => failed.push(`cgroup ${a.path}: ${err instanceof Error ? err.message : String(err)}`));
        break;
      case 'remove-mount-dir':
        await removeMountDir(scope.mountRoot, a.id).catch((err: unknown) => failed.push(`mount dir of ${a.id}: ${err instanceof Error ? err.message : String(err)}`));
        break;
    }
  }
  return failed;
}

/**
 * A pod's mount-point directory (<mount root>/<id>), once nothing is mounted in it: its empty
 * mount points (rootfs, rootfs.lower, disk), the /etc files a checkpointable runc pod has there
 * (oci-pod.ts), then the directory. rmdir only, but for etc/: a mount still there is never deleted through.
 */
export async function removeMountDir(mountRoot: string, id: string): Promise<void> {
  const dir = join(mountRoot, id);
  for (const name of ['rootfs', 'rootfs.lower', 'disk']) await rmdir(join(dir, name)).catch((err: unknown) => ignoreMissing(err));
  await rm(join(dir, 'etc'), { recursive: true, force: true });
  await rmdir(dir).catch((err: unknown) => ignoreMissing(err));
}

function ignoreMissing(err: unknown): void {
  if ((err as { code?: unknown }).code !== 'ENOENT') throw err;
}

/** How many mounts are stacked at `path` (0: none). */
export async function mountsAt(path: string): Promise<number> {
  return (await readMountPoints()).filter((p) => p === path).length;
}

/** Every mount point of the host, in mount order (mountinfo's fifth field, its escapes undone). */
async function readMountPoints(): Promise<string[]> {
  const mountinfo = await readFile('/proc/self/mountinfo', 'utf8');
  return mountinfo.split('\n').map((line) => line.split(' ')[4]).filter((p): p is string => p !== undefined && p !== '').map(unescapeMount);
}
