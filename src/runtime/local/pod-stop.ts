// Stopping a pod (hibernation: its disk, address and image stay for the next start) and removing it
// (its files, address, id range, firewall chains and image pin go). A stop waits for whatever is
// still under way on the pod: its start, a save of its memory, the end of a stop with memory
// (`pod.teardown`); a stop with memory is pod-memory.ts'.
import { rm, rmdir } from 'node:fs/promises';
import { join } from 'node:path';
import { AsbError } from '../../errors.ts';
import type { StopOptions } from '../runtime.ts';
import { releaseIdRange } from './id-ranges.ts';
import { oneSaveAtATime, stopWithMemory } from './pod-memory.ts';
import { reclaimPod } from './pod-recovery.ts';
import { signal, within, type RuntimeContext } from './runtime-context.ts';

/** stop(): SIGTERM again this often while the grace lasts (stop() says why). */
const TERM_RESEND_MS = 200;

export async function stop(ctx: RuntimeContext, id: string, opts: StopOptions = {}): Promise<void> {
  const pod = ctx.pods.get(id);
  if (opts.memory === true) {
    if (pod === undefined) throw new AsbError('NotFound', `pod ${id} not found`);
    await pod.starting?.catch(() => undefined);
    return oneSaveAtATime(ctx, pod, () => stopWithMemory(ctx, pod));
  }
  if (pod === undefined) return;
  await pod.starting?.catch(() => undefined);
  await pod.checkpointing?.catch(() => undefined);
  await pod.teardown;
  const target = pod.target;
  if (target === undefined) {
    if (pod.state.phase !== 'Absent' && pod.state.phase !== 'Stopped') {
      pod.state = { phase: 'Stopped', ready: false };
      if (pod.persisted !== undefined) pod.state.ip = pod.persisted.ip;
      ctx.emit(id);
    }
    return;
  }
  pod.stopping = true;
  const exited = pod.exited ?? Promise.resolve();
  // The shim and clock timers are unref'd so running pods never hold the worker open; a stop in
  // progress must, or a shutdown that awaits it would exit half-way.
  const keepAlive = setInterval(() => undefined, 60_000);
  try {
    // The container's init (asb-init) passes SIGTERM on to the command's process group. Sent again
    // while the grace lasts: one sent in the instant the container's first process is replaced
    // by the init is lost (seen once in a few stops right after a start: a 2 s stop instead of 5 ms).
    signal(target.pid, 'SIGTERM');
    const resend = setInterval(() => signal(target.pid, 'SIGTERM'), TERM_RESEND_MS);
    const graceful = await within(ctx.clock, exited, ctx.opts.stopGraceMs ?? 2000);
    clearInterval(resend);
    if (!graceful) {
      signal(target.pid, 'SIGKILL'); // pid 1 of the namespace: the kernel kills all the rest
      if (!(await within(ctx.clock, exited, 10_000))) throw new AsbError('Timeout', `pod ${id} did not end after SIGKILL`);
    }
  } finally {
    clearInterval(keepAlive);
  }
}

export async function remove(ctx: RuntimeContext, id: string): Promise<void> {
  const pod = ctx.pods.get(id);
  if (pod === undefined) return;
  await stop(ctx, id);
  pod.generation++;
  ctx.pods.delete(id);
  pod.keptAgent?.end();
  pod.keptAgent = undefined;
  if (pod.persisted !== undefined) {
    // Before the address can go to another pod: an emptied chain lets nothing through.
    await ctx.net.firewall.remove({ ip: pod.persisted.ip, veth: ctx.net.veth(id) }).catch((err: unknown) => ctx.log.warn({ err, id }, 'cannot empty the pod\'s firewall chains'));
    // A pod gone has no policy (policyForPodIp answers undefined): the egress proxy forgets its
    // connections before the address can go to another pod, whose own must not be judged by them.
    await ctx.net.policyChanged(id, pod.persisted.ip);
    ctx.net.ips.release(pod.persisted.ip);
  }
  // Unmounted by the shim when the pod ended; still mounted when a shim was killed or a start failed.
  if (pod.paths.disk !== undefined) await ctx.host.disk.unmount(pod.paths.disk.mount);
  // The namespace files a killed shim left bound: the pod dir cannot be removed under them (EBUSY).
  const mountDir = join(ctx.host.mountRoot, id);
  // And a checkpointable runc pod's disk bound for its volumes (oci-shim.c -V), before the disk goes.
  for (const path of [pod.paths.userns, pod.paths.netns, join(mountDir, 'disk')]) await ctx.host.disk.unmount(path);
  await Promise.all([
    rm(pod.paths.dir, { recursive: true, force: true }),
    rm(pod.paths.legacyVolumes, { recursive: true, force: true }),
    // Empty once the shim unmounted it; a mount still there (a shim killed) is left, never deleted through.
    // etc/ and disk/: a checkpointable runc pod's /etc files and its disk's bind point (oci-pod.ts).
    Promise.all([rmdir(join(mountDir, 'rootfs')).catch(() => undefined), rmdir(join(mountDir, 'disk')).catch(() => undefined), rm(join(mountDir, 'etc'), { recursive: true, force: true })]).then(() => rmdir(mountDir)).catch(() => undefined),
  ]);
  if (pod.shimLost === true) await reclaimPod(ctx, id);
  // After its files are deleted, so a later pod given the range finds none of this one's.
  await releaseIdRange(ctx.idRangesDir, pod.paths.dir, pod.persisted?.idRange).catch((err: unknown) => ctx.log.warn({ err, id }, 'cannot release the pod\'s id range'));
  // After the dir: a worker killed in between leaves a pin whose dir is gone, which GC reclaims.
  await ctx.images.unpin(pod.paths.dir);
  ctx.emit(id);
}
