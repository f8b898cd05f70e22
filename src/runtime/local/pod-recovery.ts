// A new runtime on a state dir a previous worker left (its pods outlive it: their shims run in their
// own session). In order, at start (createLocalRuntime): the memory saves that worker left running
// end (`endStraySaves`); every pod dir is loaded, and pods whose init still runs (same pid, same
// start time) are adopted and watched by polling (`recover`); adopted pods a killed save left paused
// run again, and what belongs to no running pod is reclaimed (`reclaim`, planned by reclaim.ts);
// then the id ranges of pods gone anywhere on the host go back to the pool (`sweepIdRanges`).
// `reclaimPod` is the same sweep kept to one removed pod whose shim was killed.
import { readdir } from 'node:fs/promises';
import { join, posix, resolve } from 'node:path';
import { isoNow } from '../../base/clock.ts';
import { discardCheckpoint, discardLeftovers, readCheckpointMeta } from './checkpoint.ts';
import { madeBeforeDisks } from './disk.ts';
import { keepIdRange, sweepStaleIdRanges } from './id-ranges.ts';
import { readIdentity } from './oci-pod.ts';
import { carryOut, planSummary, readHostFacts, readProcesses, reclaimPlan, runcFrozen, runscPaused, runscPod, shimsOf, straySaves, type ReclaimAction, type ReclaimScope } from './reclaim.ts';
import { podPaths, processStartTime, readPersisted } from './rootfs.ts';
import { listSnapshots } from './snapshots.ts';
import { dropCheckpoint, resumeOn } from './pod-memory.ts';
import { pollExit, podRunning } from './pod-run.ts';
import { EXIT_STATUS_WAIT_MS, lastLine, POD_ID, signal, type Pod, type RuntimeContext } from './runtime-context.ts';

/** Takes back the id ranges of pods that are gone (id-ranges.ts), here and in any other state dir on the host. */
export async function sweepIdRanges(ctx: RuntimeContext): Promise<void> {
  const swept = await sweepStaleIdRanges(ctx.idRangesDir);
  if (swept > 0) ctx.log.info({ swept, dir: ctx.idRangesDir }, 'took back the id ranges of pods that are gone');
}

/** What reclaim.ts may touch: this runtime's own roots, mount root, cgroup parent and bridge. */
function reclaimScope(ctx: RuntimeContext): ReclaimScope {
  return {
    root: resolve(ctx.opts.root),
    runcRoot: ctx.host.runcRoot,
    ...(ctx.host.runsc === undefined ? {} : { runscRoot: ctx.host.runsc.root }),
    mountRoot: ctx.host.mountRoot,
    cgroupParent: ctx.host.cgroupParent,
    bridge: ctx.net.bridge,
  };
}

/**
 * Ends the memory saves (runc/runsc pause and checkpoint) a killed worker left running on this
 * state dir: nobody will finish them. Before recover, which deletes their half-written images;
 * reclaim then resumes the sandboxes they paused.
 */
export async function endStraySaves(ctx: RuntimeContext): Promise<void> {
  if (ctx.unavailable !== undefined) return;
  const scope = reclaimScope(ctx);
  const pids = straySaves(await readProcesses(), [scope.runcRoot, ...(scope.runscRoot === undefined ? [] : [scope.runscRoot])]);
  if (pids.length === 0) return;
  for (const pid of pids) signal(pid, 'SIGKILL');
  await waitGone(ctx, pids, 5_000);
  ctx.log.warn({ pids }, 'ended the memory saves a previous worker left running');
}

/** Waits (polling every 20 ms, at most `ms`) until none of `pids` runs; whether they all ended. */
async function waitGone(ctx: RuntimeContext, pids: readonly number[], ms: number): Promise<boolean> {
  const starts = await Promise.all(pids.map((pid) => processStartTime(pid)));
  const until = ctx.clock.now() + ms;
  for (;;) {
    const left = await Promise.all(pids.map(async (pid, i) => starts[i] !== undefined && (await processStartTime(pid)) === starts[i]));
    if (!left.includes(true)) return true;
    if (ctx.clock.now() >= until) return false;
    await new Promise<void>((done) => ctx.clock.after(20, done));
  }
}

/**
 * The sweep at start, after recover (reclaim.ts): the adopted pods a killed save left paused
 * run again, then everything of this state dir that belongs to no running pod goes: shims,
 * runc and gVisor containers, mounts (gVisor's stacked null-netns among them), veths, cgroups
 * and mount-point directories. The firewall table was rebuilt at start with the adopted pods'
 * chains only; half-written checkpoints and snapshots went in recover; id ranges go next
 * (sweepIdRanges). A failure is logged and the next start tries again: a worker never fails to
 * start because of what an earlier one left.
 */
export async function reclaim(ctx: RuntimeContext): Promise<void> {
  if (ctx.unavailable !== undefined) return;
  const live = [...ctx.pods.values()].filter((pod) => pod.target !== undefined);
  for (const pod of live) await unpause(ctx, pod).catch((err: unknown) => ctx.log.error({ err, id: pod.id }, 'cannot resume an adopted pod a killed save left paused'));
  const scope = reclaimScope(ctx);
  const ids = new Set(live.map((pod) => pod.id));
  // A shim of a pod that no longer runs is cleaning up after it (a stop the last worker began)
  // or waits for a "go" that will never come: it gets the time a shim needs, then ends.
  const shims = shimsOf(await readProcesses(), scope.root).filter((shim) => !ids.has(shim.id)).map((shim) => shim.pid);
  if (shims.length > 0 && !(await waitGone(ctx, shims, EXIT_STATUS_WAIT_MS))) {
    for (const pid of shims) signal(pid, 'SIGKILL');
    await waitGone(ctx, shims, 5_000);
  }
  const plan = reclaimPlan(scope, await readHostFacts(scope), {
    ids,
    veths: new Set(live.map((pod) => ctx.net.veth(pod.id))),
    gvisor: live.some((pod) => pod.target?.kind === 'runsc'),
  });
  if (plan.length === 0) return;
  const failed = await carryOutPlan(ctx, scope, plan);
  ctx.log.info({ removed: planSummary(plan), shimsEnded: shims.length }, 'reclaimed what a previous worker left of pods that no longer run');
  if (failed.length > 0) ctx.log.error({ failed }, 'could not reclaim everything a previous worker left; the next start tries again');
}

/** Carries out a reclaim plan (reclaim.ts) through the launcher; the actions that failed. */
function carryOutPlan(ctx: RuntimeContext, scope: ReclaimScope, plan: ReclaimAction[]): ReturnType<typeof carryOut> {
  const runsc = ctx.host.runsc;
  return carryOut(scope, plan, {
    run: (argv) => ctx.launcher.run(argv, ''),
    runc: { binary: ctx.host.runc, flags: ctx.host.runtimeFlags ?? [] },
    ...(runsc === undefined ? {} : { runsc: { binary: runsc.binary, flags: runsc.flags } }),
  });
}

/**
 * What a killed shim left of one removed pod (its runc container, rootfs mount, loop device,
 * veth, cgroups, mount dir): the start-up sweep's plan (reclaim.ts), kept to this pod's own
 * items, so pods starting or being removed meanwhile are never touched.
 */
export async function reclaimPod(ctx: RuntimeContext, id: string): Promise<void> {
  const scope = reclaimScope(ctx);
  const facts = await readHostFacts(scope);
  const others = new Set([...ctx.pods.keys()].filter((other) => other !== id));
  const within = (path: string): boolean => [join(scope.root, 'pods', id), join(scope.mountRoot, id)].some((dir) => path === dir || path.startsWith(`${dir}/`));
  const loops = new Set(facts.loops.filter((l) => within(l.backingFile)).map((l) => l.device));
  const plan = reclaimPlan(scope, facts, { ids: others, veths: new Set([...others].map((o) => ctx.net.veth(o))), gvisor: true }).filter((a) => {
    switch (a.kind) {
      case 'delete-container': return (a.runtime === 'runc' ? a.id : runscPod(a.id)) === id;
      case 'unmount': return within(a.path);
      case 'detach-loop': return loops.has(a.device);
      case 'delete-veth': return a.name === ctx.net.veth(id);
      case 'remove-cgroup': return a.path.split('/').pop() === id;
      case 'remove-mount-dir': return a.id === id;
    }
  });
  if (plan.length === 0) return;
  const failed = await carryOutPlan(ctx, scope, plan);
  ctx.log.info({ id, removed: planSummary(plan) }, 'removed what the pod\'s killed shim left');
  if (failed.length > 0) ctx.log.error({ id, failed }, 'could not remove everything the pod\'s killed shim left; the next start tries again');
}

/**
 * An adopted pod as a killed worker may have left it in the middle of a save: paused (a stop with
 * memory, a snapshot) or its disk frozen (a snapshot's copy, a template build's read). It runs
 * again; a sealed checkpoint of a pod that runs on is stale (its memory moved on) and goes.
 */
async function unpause(ctx: RuntimeContext, pod: Pod): Promise<void> {
  const target = pod.target;
  if (target === undefined) return;
  if (target.kind === 'runsc' ? await runscPaused(target.runcRoot, target.id) : await runcFrozen(posix.join(ctx.host.cgroupParent, pod.id))) {
    const resumed = await resumeOn(ctx, target);
    if (resumed.code !== 0) throw new Error(`${target.kind} resume: ${lastLine(resumed.output)}`);
    ctx.log.warn({ id: pod.id }, 'resumed a pod the last worker paused for a save it never finished');
  }
  if (pod.checkpoint !== undefined) await dropCheckpoint(ctx, pod);
  const disk = pod.paths.disk;
  if (disk !== undefined && !(await madeBeforeDisks(pod.paths.dir))) await ctx.host.disk.thaw(disk.mount);
}

/** Loads every pod dir: pods whose init still runs are adopted, the others are Stopped. */
export async function recover(ctx: RuntimeContext): Promise<void> {
  let ids: string[] = [];
  try {
    ids = await readdir(join(ctx.opts.root, 'pods'));
  } catch {
    return;
  }
  // Snapshots a worker died in the middle of writing are deleted; whole ones stay.
  await listSnapshots(ctx.opts.root);
  await Promise.all(ids.filter((id) => POD_ID.test(id)).map(async (id) => {
    const paths = podPaths(ctx.opts.root, id);
    const persisted = await readPersisted(paths);
    const pod: Pod = { id, paths, persisted, state: { phase: 'Stopped', ready: false }, generation: 0, stopping: false };
    ctx.pods.set(id, pod);
    // A save the worker died in the middle of is no checkpoint; a sealed one is kept for the next start.
    await discardCheckpoint(paths.checkpointPartial);
    await discardLeftovers(paths.dir);
    pod.checkpoint = await readCheckpointMeta(paths.checkpoint);
    if (persisted === undefined) return;
    // Pods made before the cache kept pins (or whose pin was lost) are pinned now; a no-op otherwise.
    const image = persisted.image;
    if (image !== undefined) await ctx.images.pin(paths.dir, { reference: image.reference, rootfs: image.rootfs }).catch((err: unknown) => ctx.log.warn({ err, id }, 'cannot pin the image of a recovered pod'));
    ctx.net.ips.reserve(persisted.ip);
    // Once per pod at start-up, not at every wake (a host-wide lock): the range it recorded must
    // still be its own in the pool. A lost claim is made again; another live pod's is a Conflict,
    // which fails the pod's next start.
    const range = persisted.idRange;
    if (range !== undefined) {
      await keepIdRange(ctx.idRangesDir, paths.dir, range).catch((err: unknown) => {
        ctx.log.error({ err, id }, 'the pod\'s id range is held by another pod: it will not start');
        pod.rangeConflict = err instanceof Error ? err.message : String(err);
      });
    }
    pod.state.ip = persisted.ip;
    const { pid, pidStart } = persisted;
    if (pid === undefined || pidStart === undefined || (await processStartTime(pid)) !== pidStart) return;
    const identity = await readIdentity(paths);
    if (identity === undefined) return;
    pod.identity = identity;
    // The table was rebuilt empty at start: an adopted pod reaches nothing until this runs.
    await ctx.net.firewall.apply(ctx.net.podNet(id, persisted.ip, persisted.request.egress)).catch((err: unknown) => ctx.log.error({ err, id }, 'cannot restore the adopted pod\'s firewall rules: it reaches nothing'));
    podRunning(ctx, pod, pid, persisted.startedAt ?? isoNow(ctx.clock));
    pollExit(ctx, pod, pid, pidStart);
    ctx.log.info({ id, pid }, 'adopted running pod');
  }));
}
