// The floor under the refill row: the same number of pods of the same cached image, all started at
// once as the refill's start()s are, by the raw tools with no Node in the loop: refill-floor.c once
// per pod under `xargs -P <pods>`. Each does a pod's whole work (its disk, overlay rootfs, the
// runtime's own config.json, `runc create`, a veth on a bridge, eth0's address, `runc start`);
// refill-floor.c lists the steps. The bench times it in the same run as the refill, so both see the
// same machine: a target below it blocks nothing by itself.
import { spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, posix } from 'node:path';
import { performance } from 'node:perf_hooks';
import { readFile } from 'node:fs/promises';
import { podDisk } from '../src/runtime/local/disk.ts';
import { ensureBridge, deleteBridge, parseSubnet } from '../src/runtime/local/network.ts';
import { podPaths } from '../src/runtime/local/rootfs.ts';
import { findRuncBinary } from '../src/runtime/oci/runc-binary.ts';
import type { PodRequest } from '../src/runtime/runtime.ts';
import { ROOT_ID_MAP, type OciSpec } from '../src/runtime/oci/spec.ts';
import { withRuncUserNamespace } from './runc-floor.ts';
import { ensureCBinary } from '../src/base/c-binary.ts';
import { round } from './claims.ts';

/** The floor's own bridge and addresses (10.222.0.0/16 is the refill's: tests use none of it). */
const BRIDGE = 'asbrf0';
const SUBNET = '10.222.0.0/17';

export interface RefillFloor {
  pods: number;
  /** From the first pod's start to the last one's `runc start` returning. */
  ms: number;
  /** Pods that did not start, and the first reason given. */
  failed: number;
  firstError?: string;
  /** All of them deleted (`runc delete -f`, unmounts, rm -rf), as many at once. */
  removeMs: number;
  /** CPU time charged to the pods' cgroups (cpuacct, cgroup v1): their runc init and processes. */
  podCpuMs?: number;
}

export interface FloorOptions {
  runc: string;
  /** A running pod's config.json (its pod dir, mount point and id are replaced per pod). */
  spec: OciSpec;
  /** Its pod dir and mount point, as written in spec. */
  podDir: string;
  mountPoint: string;
  /** The image's id-mapped tree (the overlay's lowerdir). */
  lower: string;
  pods: number;
  diskBytes: number;
  /** How each pod's disk is made: mkfs.ext4 as pod-disk.c does, or a sparse copy of one template. */
  disk: 'mkfs' | 'copy';
  /** How many pods at once (xargs -P); default all of them, as the refill starts them. */
  concurrency?: number;
}

export async function benchRefillFloor(opts: FloorOptions): Promise<RefillFloor> {
  const ctx = mkdtempSync(join(tmpdir(), 'asb-bench-refill-floor-'));
  // The user namespace's root walks to its rootfs under mnt/.
  chmodSync(ctx, 0o711);
  for (const [dir, mode] of [['pods', 0o700], ['mnt', 0o711], ['runc', 0o700]] as const) mkdirSync(join(ctx, dir), { mode });
  chmodSync(join(ctx, 'mnt'), 0o711);
  symlinkSync(opts.lower, join(ctx, 'lower'));
  const parent = `/asb-rf-floor-${process.pid}`;
  writeFileSync(join(ctx, 'config.tmpl'), configTemplate(opts, parent));
  const subnet = parseSubnet(SUBNET);
  try {
    const binary = await ensureCBinary(ctx, new URL('./refill-floor.c', import.meta.url));
    if (opts.disk === 'copy') {
      const made = await run('/usr/sbin/mkfs.ext4', ['-q', '-F', '-m', '0', '-E', 'lazy_journal_init=1,root_owner=0:0', join(ctx, 'template.img'), `${opts.diskBytes / 1024}k`]);
      if (made.code !== 0) throw new Error(`cannot make the template disk: ${made.output}`);
    }
    await ensureBridge(BRIDGE, subnet);
    const net = posix.basename(SUBNET.slice(0, SUBNET.indexOf('/')));
    const t0 = performance.now();
    const up = await xargs(opts.pods, opts.concurrency ?? opts.pods, [binary, 'up', ctx, opts.runc, BRIDGE, net, String(subnet.prefix), String(opts.diskBytes), opts.disk, String(ROOT_ID_MAP.hostId)]);
    const ms = performance.now() - t0;
    const errors = up.output.split('\n').filter((l) => l.startsWith('error '));
    const r0 = performance.now();
    await xargs(opts.pods, opts.pods, [binary, 'down', ctx, opts.runc]);
    const removeMs = performance.now() - r0;
    const figures: RefillFloor = { pods: opts.pods, ms: round(ms, 0), failed: errors.length, removeMs: round(removeMs, 0) };
    const podCpuMs = cpuUsageMs(parent);
    if (podCpuMs !== undefined) figures.podCpuMs = podCpuMs;
    if (errors[0] !== undefined) figures.firstError = errors[0].slice(6);
    return figures;
  } finally {
    await deleteBridge(BRIDGE);
    for (const controller of readdirSync('/sys/fs/cgroup')) {
      const dir = posix.join('/sys/fs/cgroup', controller, parent);
      if (existsSync(dir)) rmdirSync(dir);
    }
    rmSync(ctx, { recursive: true, force: true });
  }
}

/** The floor's pods do what a pod of the runtime does: the same spec, image and disk size. */
export interface FloorInputs {
  spec: OciSpec;
  podDir: string;
  mountPoint: string;
  lower: string;
  diskBytes: number;
}

/** What the floor needs from a running pod `id` of the runtime on runtimeRoot (its config.json, image tree and disk). */
export async function floorInputs(runtimeRoot: string, id: string, req: PodRequest, lower: string): Promise<FloorInputs> {
  const podDir = podPaths(runtimeRoot, id).dir;
  const spec = withRuncUserNamespace(JSON.parse(await readFile(join(podDir, 'config.json'), 'utf8')) as OciSpec);
  return { spec, podDir, mountPoint: spec.root.path, lower, diskBytes: podDisk(req.spec).bytes };
}

export async function refillFloor(inputs: FloorInputs, pods: number, extra: Partial<Pick<FloorOptions, 'disk' | 'concurrency'>> = {}): Promise<RefillFloor> {
  return benchRefillFloor({ runc: findRuncBinary(), pods, disk: 'copy', ...inputs, ...extra });
}

/** CPU time of a cgroup and its children so far (cgroup v1 cpuacct), undefined without one. */
export function cpuUsageMs(cgroup: string): number | undefined {
  try {
    return round(Number(readFileSync(posix.join('/sys/fs/cgroup/cpuacct', cgroup, 'cpuacct.usage'), 'utf8')) / 1e6, 0);
  } catch {
    return undefined;
  }
}

/** The pod's spec with its own dir, mount point and id as the placeholders refill-floor.c fills. */
function configTemplate(opts: FloorOptions, parent: string): string {
  const spec: OciSpec = {
    ...opts.spec,
    root: { ...opts.spec.root, path: '@M@' },
    hostname: '@ID@',
    process: { ...opts.spec.process, env: opts.spec.process.env.map((e) => (e.startsWith('HOSTNAME=') ? 'HOSTNAME=@ID@' : e)) },
    linux: { ...opts.spec.linux, cgroupsPath: posix.join(parent, '@ID@') },
  };
  return JSON.stringify(spec).replaceAll(opts.podDir, '@D@').replaceAll(opts.mountPoint, '@M@');
}

/** `seq 0 pods-1 | xargs -P concurrency -n 1 argv...`: one process per pod. */
function xargs(pods: number, concurrency: number, argv: readonly string[]): Promise<{ code: number; output: string }> {
  const input = Array.from({ length: pods }, (_, i) => String(i)).join('\n') + '\n';
  return run('xargs', ['-P', String(concurrency), '-n', '1', ...argv], input);
}

function run(command: string, args: readonly string[], input = ''): Promise<{ code: number; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (output += chunk));
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (output += chunk));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code: code ?? 1, output }));
    child.stdin.end(input);
  });
}
