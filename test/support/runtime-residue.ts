// Counts, per kind, what one local runtime's state dir has on the host: its processes, mounts,
// runc and runsc containers, cgroups, loop devices, veths, nft chains, mount-point dirs, partial
// checkpoint images, id-range claims and network claims. Only what is provably that runtime's
// (under its root, its mount root, its cgroup parent, its bridge and table, its claim dirs), so
// other test files' pods on the same host never count.
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { run } from './egress-net.ts';

export interface ResidueScope {
  root: string;
  bridge: string;
  claimsDir: string;
  idRangesDir: string;
  /** The host's processes, when the caller scanned /proc already (processArgvs); default: scan now. */
  processes?: readonly ProcessArgv[];
}

export interface ProcessArgv {
  pid: number;
  argv: string[];
}

export type Residue = Record<string, number>;

const list = (dir: string): string[] => {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
};

const isDir = (path: string): boolean => {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
};

/** Every process's argv now, from one scan of /proc (a process gone meanwhile is left out). */
export function processArgvs(): ProcessArgv[] {
  const out: ProcessArgv[] = [];
  for (const pid of list('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      out.push({ pid: Number(pid), argv: readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0') });
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

export async function countResidue(scope: ResidueScope): Promise<Residue> {
  const root = resolve(scope.root);
  const tag = createHash('sha256').update(root).digest('hex').slice(0, 12);
  const mountRoot = `/run/asb/rootfs/${tag}`;
  const cgroupParent = `asb-${tag}`;
  const processes = (scope.processes ?? processArgvs()).filter((p) => p.pid !== process.pid && p.argv.some((a) => a.includes(`${root}/`) || a === root)).length;
  const mountPoints = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4] ?? '');
  const mounts = mountPoints.filter((m) => m.startsWith(`${root}/`) || m.startsWith(`${mountRoot}/`)).length;
  let cgroups = 0;
  for (const hierarchy of ['', ...list('/sys/fs/cgroup')]) {
    const dir = join('/sys/fs/cgroup', hierarchy, cgroupParent);
    cgroups += list(dir).filter((name) => isDir(join(dir, name))).length;
  }
  let loops = 0;
  for (const dev of list('/sys/block').filter((d) => d.startsWith('loop'))) {
    try {
      if (readFileSync(`/sys/block/${dev}/loop/backing_file`, 'utf8').startsWith(`${root}/`)) loops++;
    } catch {
      // not attached
    }
  }
  const veths = list(`/sys/class/net/${scope.bridge}/brif`).length;
  const table = `asb_${scope.bridge}`;
  const chainsOf = async (family: string): Promise<number> => {
    const r = await run('nft', ['list', 'table', family, table]);
    return r.code === 0 ? [...r.stdout.matchAll(/^\s*chain ([a-z]_\S+) \{/gm)].length : 0;
  };
  const nftChains = (await chainsOf('inet')) + (await chainsOf('bridge'));
  const pods = list(join(root, 'pods'));
  const partialCheckpoints = pods.filter((id) => existsSync(join(root, 'pods', id, 'checkpoint.partial'))).length;
  const runscState = list(join(root, 'runsc')).filter((n) => n !== 'null-netns').length;
  const nullNetns = mountPoints.filter((m) => m === join(root, 'runsc', 'null-netns')).length;
  const idRanges = list(scope.idRangesDir).filter((n) => {
    try {
      return readFileSync(join(scope.idRangesDir, n), 'utf8').includes(root);
    } catch {
      return false;
    }
  }).length;
  let bridgeLinks = 0;
  try {
    readlinkSync(`/sys/class/net/${scope.bridge}`);
    bridgeLinks = 1;
  } catch {
    bridgeLinks = 0;
  }
  return {
    processes, mounts, nullNetns, cgroups, loops, veths, nftChains, partialCheckpoints,
    runcContainers: list(join(root, 'runc')).length, runscState,
    mountDirs: list(mountRoot).length, idRanges, networkClaims: list(scope.claimsDir).length, bridges: bridgeLinks,
  };
}

/** What differs between two counts ("mounts 3 → 5"), empty when none. */
export function residueDifference(before: Residue, after: Residue): string[] {
  return Object.keys({ ...before, ...after }).filter((k) => before[k] !== after[k]).map((k) => `${k} ${String(before[k] ?? 0)} → ${String(after[k] ?? 0)}`);
}
