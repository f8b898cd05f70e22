// The system the soak drives: `make up` itself (src/assembly/up.ts: registry, hub, region-a and
// region-b each with worker, launcher, router and Envoy), on its own state dir, ports, bridges
// (asbs0, asbs1) and subnets (10.142.0.0/16 and the next), started in a process group of its own
// and stopped as a user does (SIGTERM to the group). Here too: finding its processes by kind (what
// the faults kill and the sampler watches), sampling each one's RSS and open fds, and counting what
// it leaves on the host (test/support/runtime-residue.ts per cluster, plus the state dir's pod
// dirs, image pins, network claims and processes).
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { countResidue, processArgvs } from '../../test/support/runtime-residue.ts';

const REPO = resolve(import.meta.dirname, '../..');
export const CLUSTERS = ['region-a', 'region-b'] as const;
export const BRIDGE_PREFIX = 'asbs';
const SUBNET = '10.142.0.0/16';

export interface Up {
  proc: ChildProcess;
  stateDir: string;
  env: Record<string, string>;
  output(): string;
  exited: Promise<number | string | null>;
}

/** Ports for the federation: base + offsets as up.ts lays them out (region-b: +1 or +100). */
function portEnv(base: number): Record<string, string> {
  return {
    ASB_REGISTRY_PORT: String(base),
    ASB_HUB_PORT: String(base + 10),
    ASB_API_PORT: String(base + 20),
    ASB_ENVOY_ADMIN_PORT: String(base + 30),
    ASB_ROUTER_PORT: String(base + 40),
    ASB_EDGE_PORT: String(base + 50),
    ASB_INGRESS_PORT: String(base + 51),
    ASB_EDGE_TLS_PORT: String(base + 52),
    ASB_EGRESS_PROXY_PORT: '0',
  };
}

export async function startUp(stateDir: string, basePort: number, extraEnv: Record<string, string> = {}): Promise<Up> {
  const env = { ...process.env, ...portEnv(basePort), ASB_STATE_DIR: stateDir, ASB_SUBNET: SUBNET, ASB_BRIDGE: BRIDGE_PREFIX, ASB_BASE_POOL_REPLICAS: '0', ...extraEnv };
  const proc = spawn(process.execPath, [join(REPO, 'src/assembly/up.ts')], { cwd: REPO, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let out = '';
  proc.stdout.on('data', (d: Buffer) => (out += d.toString()));
  proc.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | string | null>((res) => proc.once('exit', (code, signal) => res(code ?? signal)));
  const deadline = Date.now() + 180_000;
  while (!out.includes('Agent Sandbox is up')) {
    if (proc.exitCode !== null) throw new Error(`make up exited (${String(proc.exitCode)}):\n${out}`);
    if (Date.now() > deadline) throw new Error(`make up did not come up in 180 s:\n${out}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  const fileEnv = Object.fromEntries(readFileSync(join(stateDir, 'env'), 'utf8').trim().split('\n').map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
  return { proc, stateDir, env: fileEnv, output: () => out, exited };
}

/** SIGTERM to its group, as make forwards a Ctrl-C; a second (SIGKILL) after `graceMs`. */
export async function stopUp(up: Up, graceMs: number): Promise<number | string | null> {
  const pgid = up.proc.pid ?? 0;
  try {
    process.kill(-pgid, 'SIGTERM');
  } catch {
    // gone already
  }
  const timer = setTimeout(() => {
    try {
      process.kill(-pgid, 'SIGKILL');
    } catch {
      // gone
    }
  }, graceMs);
  const code = await up.exited;
  clearTimeout(timer);
  return code;
}

export type Kind = 'up' | 'registry' | 'hub' | 'worker' | 'router' | 'envoy' | 'launcher' | 'shim' | 'sentry';

export interface Proc {
  pid: number;
  kind: Kind;
  /** region-a / region-b, when the process belongs to one. */
  cluster: string;
  argv: string[];
}

function clusterOf(argv: readonly string[]): string {
  const text = argv.join(' ');
  return CLUSTERS.find((c) => text.includes(`/clusters/${c}/`) || text.includes(`=${c}=`) || text.includes(`${c}=http`)) ?? '';
}

function kindOf(argv: readonly string[]): Kind | undefined {
  const a0 = argv[0] ?? '';
  const text = argv.join(' ');
  if (text.includes('src/hub/hub-main.ts')) return 'hub';
  if (text.includes('src/assembly/worker-main.ts')) return 'worker';
  if (text.includes('src/router/router-main.ts')) return 'router';
  if (a0.endsWith('/envoy')) return 'envoy';
  if (a0.endsWith('docker-registry')) return 'registry';
  if (/\/bin\/launcher-/.test(a0)) return 'launcher';
  if (/\/bin\/oci-shim-/.test(a0)) return 'shim';
  if (a0 === 'runsc-sandbox' || (a0.endsWith('runsc') && text.includes(' boot '))) return 'sentry';
  return undefined;
}

/** Every process of this system, by kind: what names the state dir, and up.ts itself. */
export function processes(up: Up): Proc[] {
  const out: Proc[] = [];
  for (const p of processArgvs()) {
    const argv = p.argv.filter((a) => a !== '');
    if (p.pid === up.proc.pid) {
      out.push({ pid: p.pid, kind: 'up', cluster: '', argv });
      continue;
    }
    if (!argv.some((a) => a.includes(up.stateDir))) continue;
    const kind = kindOf(argv);
    if (kind !== undefined) out.push({ pid: p.pid, kind, cluster: clusterOf(argv), argv });
  }
  return out;
}

/** RSS in bytes and open fds of one process now; undefined once it is gone. */
export function usage(pid: number): { rss: number; fds: number } | undefined {
  try {
    const status = readFileSync(`/proc/${String(pid)}/status`, 'utf8');
    const rssKb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 'NaN');
    return { rss: rssKb * 1024, fds: readdirSync(`/proc/${String(pid)}/fd`).length };
  } catch {
    return undefined;
  }
}

/** Envoy's own heap (server.memory_allocated on its admin port), the one heap our processes expose. */
export async function envoyHeap(adminPort: number): Promise<number | undefined> {
  try {
    const res = await fetch(`http://127.0.0.1:${String(adminPort)}/stats?filter=^server.memory_allocated$`, { signal: AbortSignal.timeout(3000) });
    const m = /server\.memory_allocated: (\d+)/.exec(await res.text());
    return m === null ? undefined : Number(m[1]);
  } catch {
    return undefined;
  }
}

export function envoyAdminPort(basePort: number, cluster: string): number {
  return basePort + 30 + CLUSTERS.indexOf(cluster as (typeof CLUSTERS)[number]);
}

const count = (dir: string): number => {
  try {
    return readdirSync(dir).length;
  } catch {
    return 0;
  }
};

/** Processes in a cgroup and every cgroup below it. */
function cgroupProcesses(dir: string): number {
  let n = 0;
  try {
    n = readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n').filter((l) => l !== '').length;
    for (const e of readdirSync(dir, { withFileTypes: true })) if (e.isDirectory()) n += cgroupProcesses(join(dir, e.name));
  } catch {
    // no such cgroup
  }
  return n;
}

/** What this system has on the host, summed over both clusters, per kind. */
export async function residue(stateDir: string): Promise<Record<string, number>> {
  const total: Record<string, number> = {};
  const add = (k: string, n: number): void => {
    total[k] = (total[k] ?? 0) + n;
  };
  // One scan of /proc for every count that looks at processes.
  const processes = processArgvs();
  for (const [i, c] of CLUSTERS.entries()) {
    const root = join(stateDir, 'clusters', c, 'data', 'runtime');
    const bridge = `${BRIDGE_PREFIX}${String(i)}`;
    const r = await countResidue({ root, bridge, claimsDir: '/nonexistent', idRangesDir: '/var/lib/asb/id-ranges', processes });
    // countResidue's networkClaims counts a whole claims dir; ours are the two files naming our bridges.
    delete r.networkClaims;
    delete r.bridges;
    for (const [k, v] of Object.entries(r)) add(k, v);
    add('podDirs', count(join(root, 'pods')));
    // Processes inside the runtime's pod cgroups: a container whose shim died keeps running there,
    // reparented to init, with nothing in its argv naming the state dir.
    add('cgroupProcesses', cgroupProcesses(`/sys/fs/cgroup/pids/asb-${createHash('sha256').update(resolve(root)).digest('hex').slice(0, 12)}`));
    add('networkClaims', existsSync(`/run/asb/networks/${bridge}.json`) ? 1 : 0);
    let bridgeUp = 0;
    try {
      readlinkSync(`/sys/class/net/${bridge}`);
      bridgeUp = 1;
    } catch {
      bridgeUp = 0;
    }
    add('bridges', bridgeUp);
  }
  add('imagePins', count(join(stateDir, 'images', 'pins')));
  // Processes naming the state dir (the system's own while it runs; none once it stopped).
  add('systemProcesses', processes.filter((p) => p.argv.some((a) => a.includes(stateDir))).length);
  return total;
}
