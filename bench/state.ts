// Sandbox state on gVisor and on runc (CRIU), measured on the local runtime (make bench's `state`
// part): stop with memory and the start that restores it, for a python3 pod holding 64 MiB and
// 1 GiB of touched memory (seconds per GiB of its working set plus a fixed cost, fitted through the
// two); a snapshot of a pod holding 256 MiB and ×1 and ×10 pods started from it until every one
// answers (fork); the image's size against the working set. Each beside its floor, measured in the
// same run: the raw `runsc checkpoint` / `runsc restore` (gVisor) or `runc checkpoint` / `runc
// restore` (runc: CRIU's dump and restore) our own calls ran (timed by a wrapper in front of the
// runtime's binary), and a plain checkpoint of a twin pod (gVisor: no pause, no -leave-running;
// runc: no freeze first, the container killed by runc after the dump).
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { execFile } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { exists } from '../src/base/exists.ts';
import { findRunscBinary } from '../src/runtime/oci/runsc-binary.ts';
import { findRuncBinary } from '../src/runtime/oci/runc-binary.ts';
import { criuPath, DEFAULT_CRIU_DIR, findCriuBinary } from '../src/runtime/oci/criu-binary.ts';
import { runscContainerId, runscFlags } from '../src/runtime/oci/runsc.ts';
import type { PodRequest } from '../src/runtime/runtime.ts';
import { DURABLE_MARK } from '../src/runtime/local/checkpoint.ts';
import { podPaths } from '../src/runtime/local/rootfs.ts';
import { startTestRuntime, stopTestRuntime } from '../test/support/test-runtime.ts';
import { counterApp, httpGet } from '../test/support/counter-app.ts';

const run = promisify(execFile);

const COUNTER = counterApp(8000, { hold: true });

export type StateRuntime = 'gvisor' | 'runc';

function pod(kind: StateRuntime, id: string, mib: number, from?: string): PodRequest {
  return {
    id, uid: `uid-${id}`, namespace: 'default', hostname: id,
    ...(from === undefined ? {} : { from: { snapshot: from } }),
    // runc keeps memory only in a user namespace runc makes (PodRequest.checkpointable).
    ...(kind === 'runc' ? { checkpointable: true } : {}),
    spec: { ...(kind === 'gvisor' ? { runtimeClassName: 'gvisor' } : {}), containers: [{ name: 'main', image: 'agent-sandbox/base', command: ['python3', '-c', COUNTER, String(mib)], resources: { limits: { memory: `${String(mib + 256)}Mi` } }, readinessProbe: { tcpSocket: { port: 8000 }, periodSeconds: 1 } }] },
  };
}


/** The counter's count once the pod listens (bounded: 60 s). */
async function answers(ip: string): Promise<string> {
  const until = Date.now() + 60_000;
  for (;;) {
    try {
      return (await httpGet(`http://${ip}:8000/`)).split(' ')[1] ?? '';
    } catch (err) {
      if (Date.now() > until) throw err;
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  }
}

/** Ms from the stop's return (`stopMs` ago) until `mark` exists (bounded: 30 s). */
async function untilDurable(mark: string, stopMs: number): Promise<number> {
  const since = performance.now() - stopMs;
  for (let i = 0; i < 30_000; i++) {
    if (await exists(mark)) return performance.now() - since - stopMs;
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
  throw new Error(`${mark} did not appear within 30 s`);
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;
const round = (x: number): number => Math.round(x);
const FORK_ROUNDS = 3;

export interface PauseFigures {
  heldMiB: number;
  workingSetBytes: number;
  imageBytes: number;
  /** Medians over the rounds, ms. */
  stopMs: number;
  /** From the stop's return until its image was on the disk (the durable mark), ms. */
  durableMs: number;
  rawCheckpointMs: number;
  plainCheckpointMs: number;
  startMs: number;
  rawRestoreMs: number;
  rounds: number;
}

/** One fork run: `count` pods started from one snapshot until every one answered. */
export interface ForkRun {
  count: number;
  heldMiB: number;
  /** Snapshot (pause, save, disk copy, resume) until it returned, ms. */
  snapshotMs: number;
  rawCheckpointMs: number;
  /** From the snapshot's return until every fork answered, ms. */
  forksMs: number;
  /** The slowest of the forks' raw restores, ms. */
  rawRestoreMaxMs: number;
  totalMs: number;
  /** Forks that failed. */
  failed: number;
}

/** The run with the median total, its `failed` counted over every run; `runs`: each run's total and floor, ms, in the order run. */
export interface ForkFigures extends ForkRun {
  runs: { totalMs: number; floorMs: number }[];
}

/** A fork's floor: the raw checkpoint, then the slowest of the raw restores its starts ran, ms. */
export function forkFloorMs(f: ForkRun): number {
  return f.rawCheckpointMs + f.rawRestoreMaxMs;
}

export interface StateFigures {
  pause: PauseFigures[];
  /** Fitted through the two sizes: seconds per GiB of working set and fixed ms, each way. */
  fit: { stopSPerGiB: number; stopFixedMs: number; startSPerGiB: number; startFixedMs: number; rawCheckpointSPerGiB: number; rawRestoreSPerGiB: number };
  fork: ForkFigures[];
  /** Snapshot bytes against the working set (memory image only, and with the disk copy). */
  snapshot: { workingSetBytes: number; memoryBytes: number; bytes: number };
}

/**
 * `criuDir`: runc's CRIU (default: make criu's). Each runtime class has its own bridge and subnet:
 * gVisor asbstb0 10.248.0.0/16, runc asbrmb0 10.236.192.0/18.
 */
export async function benchState(kind: StateRuntime = 'gvisor', sizes: readonly number[] = [64, 1024], forkMiB = 256, criuDir: string = DEFAULT_CRIU_DIR): Promise<StateFigures> {
  const real = kind === 'gvisor' ? findRunscBinary() : findRuncBinary();
  const criu = kind === 'runc' ? findCriuBinary(criuDir) : undefined;
  const scratch = await mkdtemp(join(tmpdir(), 'asb-state-bench-'));
  const times = join(scratch, 'runtime-times');
  const wrapper = join(scratch, kind === 'gvisor' ? 'runsc' : 'runc');
  await writeFile(wrapper, `#!/bin/sh\ncase " $* " in\n  *" checkpoint "*|*" restore "*)\n    s=$(date +%s%N); "${real}" "$@"; rc=$?; e=$(date +%s%N)\n    for a in "$@"; do case "$a" in checkpoint|restore) op=$a;; esac; done\n    echo "$op $(( (e - s) / 1000 ))" >> "${times}"; exit $rc;;\nesac\nexec "${real}" "$@"\n`);
  await chmod(wrapper, 0o755);
  await writeFile(times, '');
  const rawTimes = async (op: string): Promise<number[]> => (await readFile(times, 'utf8')).trim().split('\n').filter((l) => l.startsWith(`${op} `)).map((l) => Number(l.split(' ')[1]) / 1000);
  const fixture = kind === 'gvisor'
    ? await startTestRuntime('asb-state-bench-', 'asbstb0', '10.248.0.0/16', { runsc: wrapper, probeIntervalMs: 50 })
    : await startTestRuntime('asb-state-bench-', 'asbrmb0', '10.236.192.0/18', { runc: wrapper, ...(criu === undefined ? {} : { criu }), probeIntervalMs: 50 });
  const { rt, root } = fixture;
  try {
    const pause: PauseFigures[] = [];
    for (const mib of sizes) {
      const rounds = mib <= 256 ? 5 : 3;
      const id = `p${String(mib)}`;
      const req = pod(kind, id, mib);
      await answers((await rt.start(req)).ip ?? '');
      const workingSetBytes = (await rt.usage(id))?.memory?.workingSetBytes ?? 0;
      const stops: number[] = [];
      const durables: number[] = [];
      const starts: number[] = [];
      const rawCk: number[] = [];
      const rawRs: number[] = [];
      let imageBytes = 0;
      for (let i = 0; i < rounds; i++) {
        let t = performance.now();
        await rt.stop(id, { memory: true });
        stops.push(performance.now() - t);
        imageBytes = rt.state(id).checkpoint?.bytes ?? 0;
        rawCk.push((await rawTimes('checkpoint')).at(-1) ?? NaN);
        // The image reaches the disk after the stop returns; the start is timed once it has (a
        // start during that flush waits behind it in the filesystem's journal).
        durables.push(await untilDurable(join(podPaths(root, id).checkpoint, DURABLE_MARK), stops.at(-1) ?? 0));
        t = performance.now();
        const woken = await rt.start(req);
        const n = await answers(woken.ip ?? '');
        starts.push(performance.now() - t);
        rawRs.push((await rawTimes('restore')).at(-1) ?? NaN);
        if (woken.restoreFailure !== undefined || n !== String(i + 2)) throw new Error(`${id} was not restored: ${woken.restoreFailure ?? `count ${n}`}`);
      }
      // The floor of the save: a plain checkpoint of an identical twin pod (it ends that sandbox).
      const twin = `t${String(mib)}`;
      await answers((await rt.start(pod(kind, twin, mib))).ip ?? '');
      const image = join(scratch, twin);
      const t = performance.now();
      if (kind === 'gvisor') await run(real, [...runscFlags({}), '--root', join(root, 'runsc'), 'checkpoint', '-image-path', image, runscContainerId(twin)]);
      else await run(real, ['--root', join(root, 'runc'), 'checkpoint', '--image-path', image, '--work-path', image, twin], { env: { PATH: criuPath(criu ?? '') } });
      const plainCheckpointMs = performance.now() - t;
      await rm(image, { recursive: true, force: true });
      await rt.remove(twin);
      await rt.remove(id);
      pause.push({ heldMiB: mib, workingSetBytes, imageBytes, stopMs: round(median(stops)), durableMs: round(median(durables)), rawCheckpointMs: round(median(rawCk)), plainCheckpointMs: round(plainCheckpointMs), startMs: round(median(starts)), rawRestoreMs: round(median(rawRs)), rounds });
    }
    const [small, large] = [pause[0], pause.at(-1)];
    const slope = (f: (p: PauseFigures) => number): { perGiB: number; fixedMs: number } => {
      if (small === undefined || large === undefined || small === large) return { perGiB: NaN, fixedMs: NaN };
      const gib = (large.workingSetBytes - small.workingSetBytes) / 2 ** 30;
      const perGiB = (f(large) - f(small)) / 1000 / gib;
      return { perGiB: Math.round(perGiB * 1000) / 1000, fixedMs: round(f(small) - perGiB * 1000 * (small.workingSetBytes / 2 ** 30)) };
    };
    const stop = slope((p) => p.stopMs);
    const start = slope((p) => p.startMs);
    const fit = { stopSPerGiB: stop.perGiB, stopFixedMs: stop.fixedMs, startSPerGiB: start.perGiB, startFixedMs: start.fixedMs, rawCheckpointSPerGiB: slope((p) => p.rawCheckpointMs).perGiB, rawRestoreSPerGiB: slope((p) => p.rawRestoreMs).perGiB };

    const fork: ForkFigures[] = [];
    let snapshot = { workingSetBytes: 0, memoryBytes: 0, bytes: 0 };
    // Each count FORK_ROUNDS times; the round with the median total is reported (a fork's figure
    // moved by ~0.2 s from run to run here, its floor with it).
    for (const count of [1, 10]) {
      const rounds: ForkRun[] = [];
      for (let pass = 0; pass < FORK_ROUNDS; pass++) rounds.push(await forkRound(count, pass));
      const reported = [...rounds].sort((a, b) => a.totalMs - b.totalMs)[Math.floor(FORK_ROUNDS / 2)];
      if (reported === undefined) throw new Error('no fork round ran');
      fork.push({ ...reported, failed: rounds.reduce((n, r) => n + r.failed, 0), runs: rounds.map((r) => ({ totalMs: r.totalMs, floorMs: forkFloorMs(r) })) });
    }
    return { pause, fit, fork, snapshot };

    async function forkRound(count: number, pass: number): Promise<ForkRun> {
      const src = `fsrc${String(count)}-${String(pass)}`;
      await answers((await rt.start(pod(kind, src, forkMiB))).ip ?? '');
      // The pauses above leave ~2 GiB of images being written back and deleted: the fork is timed
      // once the disk has settled, not while it pays for them.
      await run('sync', []);
      const workingSetBytes = (await rt.usage(src))?.memory?.workingSetBytes ?? 0;
      const before = (await rawTimes('restore')).length;
      const t0 = performance.now();
      const info = await rt.snapshot(src, `snap-${src}`, { memory: true });
      const t1 = performance.now();
      const rawCheckpointMs = (await rawTimes('checkpoint')).at(-1) ?? NaN;
      const ids = Array.from({ length: count }, (_, i) => `fk${String(count)}-${String(pass)}-${String(i)}`);
      const outcomes = await Promise.allSettled(ids.map(async (id) => {
        const state = await rt.start(pod(kind, id, forkMiB, `snap-${src}`));
        if (state.restoreFailure !== undefined) throw new Error(state.restoreFailure);
        const n = await answers(state.ip ?? '');
        if (n !== '2') throw new Error(`fork ${id} answered ${n}, not from the snapshot's memory`);
      }));
      const t2 = performance.now();
      const restores = (await rawTimes('restore')).slice(before);
      snapshot = { workingSetBytes, memoryBytes: info.memoryBytes, bytes: info.bytes };
      for (const id of [src, ...ids]) await rt.remove(id);
      await rt.deleteSnapshot(`snap-${src}`);
      return { count, heldMiB: forkMiB, snapshotMs: round(t1 - t0), rawCheckpointMs: round(rawCheckpointMs), forksMs: round(t2 - t1), rawRestoreMaxMs: round(Math.max(...restores)), totalMs: round(t2 - t0), failed: outcomes.filter((o) => o.status === 'rejected').length };
    }
  } finally {
    await stopTestRuntime(fixture);
    await rm(scratch, { recursive: true, force: true });
  }
}
