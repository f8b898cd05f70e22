// The local runtime's own figures on runc (`node bench/run.ts runtime`), without the worker, store,
// router or Envoy in front: the LocalRuntime the worker uses, on its own state dir, bridge and
// subnet, its images pulled from the loopback registry `make up` runs (bench/images.ts).
// - first pull of agent-sandbox/base into an empty image cache (bench/images.ts);
// - cold start: start() of a new pod until Running, the image cached, one at a time; the floor is a
//   bare `runc run -d` of the same config.json on an overlay mounted beforehand (bench/runc-floor.ts);
// - refill: REFILL concurrent start()s of new pods until all are Running;
// - wake: stop() (hibernate) then start() of the same pod;
// - memory per idle sandbox outside its container: its oci-shim (the only host process a running
//   pod keeps: runc exits once the container runs; the launcher is one per worker), and the
//   kernel's unreclaimable memory that grows per pod, system-wide (an upper bound: it includes the
//   kernel memory of the pod's own processes; cgroup v1 charges a pod's cgroup its kmem, but that
//   includes reclaimable slab, so the two cannot be subtracted).
// coldStarts, refillPods and wakes take any PodRuntime: docs/benchmarks.md's before-runc figures are theirs,
// run against the home-made runtime of commit 35bfca9.
// gVisor (runtimeClassName: gvisor): the same cold start and wake, when runsc is built (make runsc).
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, rmdirSync } from 'node:fs';
import { mkdtemp, readFile, rm, rmdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, posix } from 'node:path';
import { performance } from 'node:perf_hooks';
import type { Container } from '../src/api/types.ts';
import { createLocalRuntime, type LocalRuntime } from '../src/runtime/local/local-runtime.ts';
import { MOUNT_ROOT } from '../src/runtime/local/runtime-context.ts';
import { deleteBridge } from '../src/runtime/local/network.ts';
import { DEFAULT_CLAIMS_DIR, releaseNetwork } from '../src/runtime/local/network-claim.ts';
import { podPaths } from '../src/runtime/local/rootfs.ts';
import { findRuncBinary } from '../src/runtime/oci/runc-binary.ts';
import { ROOT_ID_MAP, type OciSpec } from '../src/runtime/oci/spec.ts';
import type { PodRequest, PodRuntime, PodState } from '../src/runtime/runtime.ts';
import { silentLogger } from '../src/base/log.ts';
import { round, summarize, type LatencySummary } from './claims.ts';
import { BASE_IMAGE, benchFirstPull, startBenchRegistry, type FirstPull } from './images.ts';
import { benchRuncFloor } from './runc-floor.ts';
import { floorInputs, refillFloor as benchRefillFloorOf, type RefillFloor } from './refill-floor.ts';

const BRIDGE = 'asbbnrt0';
const SUBNET = '10.197.0.0/16';
const PULL_RUNS = 3;
const COLD_STARTS = 30;
export const REFILL = 300;
/** A refill that takes longer failed; every pod is removed either way. */
const REFILL_TIMEOUT_MS = 120_000;
const WAKES = 20;
/** Idle pods held at once for the memory figures, and how many times (the kernel's figure is system-wide, so other load moves it: the median is kept). */
const IDLE_PODS = 100;
const MEMORY_CYCLES = 3;
/** How long the idle pods settle before memory is read (their init and sleep are up within ms). */
const SETTLE_MS = 2000;

export interface MemoryFigures {
  pods: number;
  /** Mean per pod of its oci-shim's proportional set size and resident set size (smaps_rollup). */
  shimPssKb: number;
  shimRssKb: number;
  /** Mean PSS of the container's own processes (tini and sleep): for scale, not overhead. */
  containerPssKb: number;
  cycles: number;
  /** Growth per pod of SUnreclaim + KernelStack + PageTables + Percpu (/proc/meminfo), system-wide: median over the cycles. */
  kernelKb: number;
  /** Its lowest and highest over the cycles. */
  kernelSpreadKb: [number, number];
  /** For scale: the kernel memory charged to the pod's own cgroup (memory.kmem.usage_in_bytes, cgroup v1, reclaimable slab included), mean per pod. */
  kernelInCgroupKb: number;
  /** The launcher's RSS: one per worker, not per pod. */
  launcherRssKb: number;
}

export interface Refill {
  pods: number;
  /** From the first start() to the last one settled. */
  ms: number;
  notRunning: number;
  /** Pods not Running, by phase and message. */
  failures: Record<string, number>;
  removeMs: number;
}

type ProcessMemory = Pick<MemoryFigures, 'shimPssKb' | 'shimRssKb' | 'containerPssKb' | 'kernelInCgroupKb' | 'launcherRssKb'>;

export interface RuntimeBench {
  firstPull: FirstPull;
  /** start() of a new pod until Running, imagePullPolicy IfNotPresent: no registry call. */
  coldStart: LatencySummary;
  /** The same with the image named as the built-in template names it (`agent-sandbox/base`, :latest, so pull policy Always: a registry round trip per start). */
  coldStartAlways: LatencySummary;
  /** `runc run -d` of the same config.json, no network, overlay mounted beforehand. */
  runcFloor: LatencySummary;
  /** New pods, imagePullPolicy IfNotPresent. */
  refill: Refill;
  /** The same as the built-in template names the image (pull policy Always), as a warm pool's refill does. */
  refillAlways: Refill;
  /** The refill's floor: as many pods of the same spec and image by the raw tools, all at once (bench/refill-floor.ts). */
  refillFloor: RefillFloor;
  wake: { start: LatencySummary; stop: LatencySummary };
  memory: MemoryFigures;
  /** The same cold start and wake with `runtimeClassName: gvisor` (runsc); absent when runsc is not built. */
  gvisor?: { coldStart: LatencySummary; wake: { start: LatencySummary; stop: LatencySummary } };
}

function podRequest(id: string, container: Partial<Container> = {}, runtimeClassName?: string): PodRequest {
  const spec = { containers: [{ name: 'main', image: BASE_IMAGE, command: ['sleep', 'infinity'], ...container }] };
  return { id, uid: `uid-${id}`, namespace: 'default', hostname: id, spec: runtimeClassName === undefined ? spec : { ...spec, runtimeClassName } };
}

export const cached: Partial<Container> = { imagePullPolicy: 'IfNotPresent' };

export async function benchRuntime(): Promise<RuntimeBench> {
  const registry = await startBenchRegistry();
  const root = await mkdtemp(join(tmpdir(), 'asb-bench-runtime-'));
  let rt: LocalRuntime | undefined;
  let result: RuntimeBench | undefined;
  let failure: unknown;
  try {
    const firstPull = await benchFirstPull(registry, PULL_RUNS);
    const images = registry.store(join(root, 'images'));
    rt = await createLocalRuntime({ root: join(root, 'runtime'), log: silentLogger(), images, bridge: BRIDGE, subnet: SUBNET });
    if (rt.unavailable !== undefined) throw new Error(`the local runtime starts no pod here: ${rt.unavailable}`);
    // The first start pulls base into this runtime's cache (not timed: that is the first-pull row).
    await startRunning(rt, podRequest('bn-warmup'));
    const coldStart = await coldStarts(rt, 'bn-cold', cached);
    const coldStartAlways = await coldStarts(rt, 'bn-always', {});
    const spec = JSON.parse(await readFile(join(podPaths(join(root, 'runtime'), 'bn-warmup').dir, 'config.json'), 'utf8')) as OciSpec;
    const lower = images.get(BASE_IMAGE, ROOT_ID_MAP)?.rootfs ?? '';
    const runcFloor = await benchRuncFloor(findRuncBinary(), spec, lower, COLD_STARTS);
    const floorOf = await floorInputs(join(root, 'runtime'), 'bn-warmup', podRequest('bn-warmup'), lower);
    await rt.remove('bn-warmup');
    const refillFloor = await benchRefillFloorOf(floorOf, REFILL);
    const refill = await refillPods(rt, 'bn-refill', cached);
    const refillAlways = await refillPods(rt, 'bn-refill-always', {});
    const wake = await wakes(rt);
    const memory = await idleMemory(rt);
    result = { firstPull, coldStart, coldStartAlways, runcFloor, refill, refillAlways, refillFloor, wake, memory };
    if (rt.rootIsolation.gvisor) result.gvisor = { coldStart: await coldStarts(rt, 'bn-gcold', cached, 'gvisor'), wake: await wakes(rt, 'gvisor') };
  } catch (err) {
    failure = err;
  }
  // Clean-up runs either way, and its own failure (a pod, cgroup or mount left) is reported with the bench's.
  try {
    await cleanupRuntime(rt, join(root, 'runtime'));
    await rm(root, { recursive: true, force: true });
  } catch (err) {
    failure = failure === undefined ? err : new AggregateError([failure, err], 'the runtime bench failed, and so did its clean-up');
  } finally {
    await registry.close();
  }
  if (failure !== undefined) throw failure instanceof Error ? failure : new Error('the runtime bench failed', { cause: failure });
  if (result === undefined) throw new Error('the runtime bench ended without figures');
  return result;
}

async function startRunning(rt: PodRuntime, req: PodRequest): Promise<void> {
  const state = await rt.start(req);
  if (state.phase !== 'Running') throw new Error(`pod ${req.id} did not start: ${JSON.stringify(state)}`);
}

export async function coldStarts(rt: PodRuntime, prefix: string, container: Partial<Container>, runtimeClassName?: string): Promise<LatencySummary> {
  const times: number[] = [];
  for (let i = 0; i < COLD_STARTS; i++) {
    const id = `${prefix}-${i}`;
    const t0 = performance.now();
    await startRunning(rt, podRequest(id, container, runtimeClassName));
    times.push(performance.now() - t0);
    await rt.remove(id);
  }
  return summarize(times);
}

export async function refillPods(rt: PodRuntime, prefix: string, container: Partial<Container>): Promise<Refill> {
  const ids = Array.from({ length: REFILL }, (_, i) => `${prefix}-${i}`);
  const t0 = performance.now();
  // What each start() answered: a pod's state later may hold a later event instead of why it failed.
  const all = Promise.all(ids.map((id) => rt.start(podRequest(id, container)).catch((err: unknown): PodState => ({ phase: 'Failed', ready: false, message: err instanceof Error ? err.message : 'start() threw' }))));
  // Past the deadline the bench fails; the caller's clean-up removes whatever started.
  const states = await within(all, REFILL_TIMEOUT_MS, `refill of ${REFILL} pods did not settle within ${REFILL_TIMEOUT_MS} ms`);
  const ms = performance.now() - t0;
  const failures: Record<string, number> = {};
  for (const [i, state] of states.entries()) {
    if (state.phase === 'Running') continue;
    const why = `${state.phase}: ${(state.message ?? '').replaceAll(ids[i] ?? '', '<id>')}`;
    failures[why] = (failures[why] ?? 0) + 1;
  }
  const notRunning = Object.values(failures).reduce((a, b) => a + b, 0);
  const r0 = performance.now();
  await within(Promise.all(ids.map((id) => rt.remove(id))), REFILL_TIMEOUT_MS, `removing ${REFILL} pods took over ${REFILL_TIMEOUT_MS} ms`);
  const removeMs = performance.now() - r0;
  return { pods: REFILL, ms: round(ms, 0), notRunning, failures, removeMs: round(removeMs, 0) };
}

/** `p`, or a rejection with `message` after `ms`. */
async function within<T>(p: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(message)), ms)));
  try {
    return await Promise.race([p, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

export async function wakes(rt: PodRuntime, runtimeClassName?: string): Promise<RuntimeBench['wake']> {
  const req = podRequest(runtimeClassName === undefined ? 'bn-wake' : `bn-wake-${runtimeClassName}`, cached, runtimeClassName);
  await startRunning(rt, req);
  const starts: number[] = [];
  const stops: number[] = [];
  for (let i = 0; i < WAKES; i++) {
    const s0 = performance.now();
    await rt.stop(req.id);
    stops.push(performance.now() - s0);
    if (rt.state(req.id).phase !== 'Stopped') throw new Error(`pod ${req.id} did not hibernate: ${JSON.stringify(rt.state(req.id))}`);
    const t0 = performance.now();
    await startRunning(rt, req);
    starts.push(performance.now() - t0);
  }
  await rt.remove(req.id);
  return { start: summarize(starts), stop: summarize(stops) };
}

async function idleMemory(rt: LocalRuntime): Promise<MemoryFigures> {
  const ids = Array.from({ length: IDLE_PODS }, (_, i) => `bn-idle-${i}`);
  const kernel: number[] = [];
  let processes: ProcessMemory | undefined;
  for (let cycle = 0; cycle < MEMORY_CYCLES; cycle++) {
    const before = kernelKb();
    try {
      for (const id of ids) await startRunning(rt, podRequest(id, cached));
      await new Promise((r) => setTimeout(r, SETTLE_MS));
      kernel.push((kernelKb() - before) / IDLE_PODS);
      processes ??= processMemory(rt, ids);
    } finally {
      await Promise.all(ids.map((id) => rt.remove(id)));
    }
  }
  if (processes === undefined) throw new Error('no memory cycle ran');
  const sorted = kernel.sort((a, b) => a - b);
  const kernelKbMedian = Math.round(sorted[Math.floor(sorted.length / 2)] ?? Number.NaN);
  return { pods: IDLE_PODS, cycles: MEMORY_CYCLES, ...processes, kernelKb: kernelKbMedian, kernelSpreadKb: [Math.round(sorted[0] ?? Number.NaN), Math.round(sorted.at(-1) ?? Number.NaN)] };
}

/** Per pod, the mean of its shim's memory, its container's processes' PSS and its cgroup's kmem; and the launcher's RSS. */
function processMemory(rt: LocalRuntime, ids: readonly string[]): ProcessMemory {
  let shimPss = 0;
  let shimRss = 0;
  let containerPss = 0;
  let kmem = 0;
  for (const id of ids) {
    const init = rt.state(id).pid;
    if (init === undefined) throw new Error(`pod ${id} has no pid`);
    const shim = smapsRollup(parentPid(init));
    shimPss += shim.pss;
    shimRss += shim.rss;
    const cgroup = memoryCgroup(init);
    for (const pid of readFileSync(join(cgroup, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean)) containerPss += smapsRollup(Number(pid)).pss;
    kmem += Number(readFileSync(join(cgroup, 'memory.kmem.usage_in_bytes'), 'utf8')) / 1024;
  }
  const per = (kb: number): number => Math.round(kb / ids.length);
  const launcher = rt.launcherPid === undefined ? Number.NaN : smapsRollup(rt.launcherPid).rss;
  return { shimPssKb: per(shimPss), shimRssKb: per(shimRss), containerPssKb: per(containerPss), kernelInCgroupKb: per(kmem), launcherRssKb: launcher };
}

/** Unreclaimable kernel memory in KB: the slab that cannot be dropped, stacks, page tables, per-cpu. */
function kernelKb(): number {
  const info = new Map(readFileSync('/proc/meminfo', 'utf8').split('\n').map((l) => [l.slice(0, l.indexOf(':')), Number.parseInt(l.slice(l.indexOf(':') + 1), 10)]));
  return ['SUnreclaim', 'KernelStack', 'PageTables', 'Percpu'].reduce((sum, k) => sum + (info.get(k) ?? 0), 0);
}

function smapsRollup(pid: number): { rss: number; pss: number } {
  const text = readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8');
  const field = (name: string): number => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? Number.NaN);
  return { rss: field('Rss'), pss: field('Pss') };
}

function parentPid(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
}

/** The cgroup v1 memory directory a process is in. */
function memoryCgroup(pid: number): string {
  const line = readFileSync(`/proc/${pid}/cgroup`, 'utf8').split('\n').find((l) => /^\d+:([^:]*,)?memory(,[^:]*)?:/.test(l));
  if (line === undefined) throw new Error(`process ${pid} is in no memory cgroup (cgroup v1)`);
  return join('/sys/fs/cgroup/memory', line.slice(line.indexOf(':', line.indexOf(':') + 1) + 1));
}

/** Removes every pod, closes the runtime, then its bridge, claim, cgroup parents and mount root. */
export async function cleanupRuntime(rt: LocalRuntime | undefined, root: string, bridge = BRIDGE): Promise<void> {
  if (rt !== undefined) {
    await within(Promise.all(rt.list().map((id) => rt.remove(id))), REFILL_TIMEOUT_MS, `clean-up: pods ${rt.list().join(', ')} still there after ${REFILL_TIMEOUT_MS} ms`);
    await rt.close();
  }
  await deleteBridge(bridge);
  await releaseNetwork(DEFAULT_CLAIMS_DIR, bridge, root);
  // The runtime names them by the hash of its root (local-runtime.ts): /asb-<tag> and MOUNT_ROOT/<tag>.
  const tag = createHash('sha256').update(root).digest('hex').slice(0, 12);
  for (const controller of readdirSync('/sys/fs/cgroup')) {
    const dir = posix.join('/sys/fs/cgroup', controller, `asb-${tag}`);
    if (existsSync(dir)) rmdirSync(dir);
  }
  await rmdir(join(MOUNT_ROOT, tag)).catch(() => undefined); // absent when no pod started
}
