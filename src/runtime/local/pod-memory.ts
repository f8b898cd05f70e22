// A pod's memory: saved (a stop with memory, a snapshot's) and restored at its next start.
// checkpoint.ts is the image's format (sealed, described, verified); this is the sequence on a live
// pod: the agent's connections dropped, the sandbox paused, `runsc checkpoint` or CRIU's `runc
// checkpoint` with -leave-running, the image checked and sealed, then the pod killed while paused
// (a stop) or resumed (a snapshot). One save at a time per pod (`oneSaveAtATime`); a pod stopped
// with its memory is Stopped at once and its end (`pod.teardown`) goes on after the stop returns.
import { chmod, chown, mkdir, readFile } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { AsbError, isAsbError } from '../../errors.ts';
import { isoNow } from '../../base/clock.ts';
import { checkpointRoom, discardCheckpoint, discardCheckpointSoon, freeBytes, imageBytes, makeDurable, MIN_FREE_AFTER_SAVE_BYTES, sealCheckpoint, verifyCheckpoint, type CheckpointCheck, type CheckpointMaker, type CheckpointMeta } from './checkpoint.ts';
import { madeBeforeDisks, podDisk } from './disk.ts';
import type { PodTarget } from './exec.ts';
import { cgroupUsage, mountedDiskUsage } from './pod-usage.ts';
import { runscVersion } from '../oci/runsc-binary.ts';
import { criuCheck, criuPath } from '../oci/criu-binary.ts';
import { checkpointSequence, runscSubcommand, type RunscCommand } from '../oci/runsc.ts';
import { ROOT_ID_MAP } from '../oci/spec.ts';
import { exists } from '../../base/exists.ts';
import { lastLine, signal, within, type Pod, type RuntimeContext } from './runtime-context.ts';

/**
 * Left free on the worker's disk after a memory checkpoint is written there: the store, the image
 * cache and every other pod's writable layer share it (checkpoint.ts says why the image is not on
 * the pod's own disk).
 */
const CHECKPOINT_HOST_RESERVE_BYTES = 256 * 2 ** 20;

/**
 * Whether this start restores the pod's memory checkpoint: `from` the image when it is whole and
 * made by this runsc, else the `failure` reason (the image is deleted then: it can never be restored).
 */
export async function restorePlan(ctx: RuntimeContext, pod: Pod, kind: 'runc' | 'runsc'): Promise<{ from?: string; failure?: string }> {
  if (!(await exists(pod.paths.checkpoint))) return {};
  const check = await checkImage(ctx, pod.paths.checkpoint, kind);
  if (check.ok) return { from: pod.paths.checkpoint };
  const failure = check.reason;
  await dropCheckpoint(ctx, pod);
  return { failure: `the memory checkpoint cannot be restored, so the pod started from its files: ${failure}` };
}

/** verifyCheckpoint of the image in `dir` against this worker's runsc (gVisor) or CRIU (runc). */
export function checkImage(ctx: RuntimeContext, dir: string, kind: 'runc' | 'runsc'): Promise<CheckpointCheck> {
  const maker: Promise<CheckpointMaker> = kind === 'runsc' ? workerRunscVersion(ctx).then((runsc) => ({ runsc })) : workerCriuVersion(ctx).then((criu) => ({ criu }));
  return maker.then((m) => verifyCheckpoint(dir, m), (err: unknown): CheckpointCheck => ({ ok: false, reason: `${kind === 'runsc' ? 'runsc does not say its version' : 'CRIU cannot run'}: ${err instanceof Error ? err.message : String(err)}` }));
}

/**
 * Runs a save of the pod's memory (a stop with memory, a snapshot) once every earlier one has
 * ended, whatever its outcome; pod.checkpointing is the last one, settled, for stop and remove to
 * wait on. A second stop with memory then finds the pod Stopped with its checkpoint: a no-op.
 */
export function oneSaveAtATime<T>(ctx: RuntimeContext, pod: Pod, save: () => Promise<T>): Promise<T> {
  const result = (pod.checkpointing ?? Promise.resolve()).then(save);
  const settled = result.then(() => undefined, () => undefined);
  pod.checkpointing = settled;
  void settled.then(() => {
    if (pod.checkpointing === settled) pod.checkpointing = undefined;
  });
  return result;
}

/**
 * Whether the pod's memory can be saved (a pause or a snapshot with memory): a gVisor pod always;
 * a runc pod when CRIU is built and the pod runs in a user namespace runc made
 * (PodRequest.checkpointable). NotImplemented saying how to get it otherwise.
 */
export function canSaveMemory(ctx: RuntimeContext, pod: Pod, target: PodTarget, what: 'pause' | 'snapshot'): void {
  if (target.kind === 'runsc') return;
  const instead = what === 'pause' ? 'pause it without memory' : 'snapshot its files only';
  if ('unavailable' in ctx.criu) throw new AsbError('NotImplemented', `pod ${pod.id} runs on runc, whose memory is kept with CRIU, which this worker lacks (${ctx.criu.unavailable}); it keeps running (${instead}, or run it with runtimeClassName gvisor)`);
  if (pod.persisted?.request.checkpointable !== true) {
    // Decided when the pod started: a warm pool member claimed with Hibernate started without it.
    throw new AsbError('NotImplemented', `pod ${pod.id} runs on runc in the user namespace its shim makes, which CRIU cannot checkpoint (docs/criu.md); it keeps running. To keep memory on runc, give its Sandbox suspensionStrategy: Hibernate before it starts (runc then makes its user namespace; a pod already running without it gets it at its next start), or run it with runtimeClassName gvisor; else ${instead}`);
  }
}

/**
 * Ends a runc pod savePaused left frozen, without letting it run again: SIGKILL is queued to
 * every process of its cgroup while frozen, and each dies on the thaw before it runs a single
 * instruction (killing only the init would let the others run until the kernel reaps them).
 */
async function killFrozen(ctx: RuntimeContext, pod: Pod, target: PodTarget): Promise<void> {
  const cgroup = posix.join(ctx.host.cgroupParent, pod.id);
  const procs = await readFile(`/sys/fs/cgroup/freezer${cgroup}/cgroup.procs`, 'utf8').catch(() => readFile(`/sys/fs/cgroup${cgroup}/cgroup.procs`, 'utf8')).catch(() => '');
  for (const pid of procs.split('\n').map(Number).filter((n) => n > 0)) signal(pid, 'SIGKILL');
  signal(target.pid, 'SIGKILL');
  const resumed = await resumeOn(ctx, target);
  if (resumed.code !== 0) ctx.log.warn({ id: pod.id, output: resumed.output }, 'a runc pod killed after its checkpoint could not be thawed');
}

/** One runc command on a runc pod, through the launcher; `criu`: with CRIU first on runc's PATH (checkpoint.ts). */
export function runcOn(ctx: RuntimeContext, target: PodTarget, args: readonly string[], criu = false): Promise<{ code: number; output: string }> {
  const argv = [target.runc, ...target.runtimeFlags, '--root', target.runcRoot, ...args];
  return ctx.launcher.run(criu && 'binary' in ctx.criu ? ['env', `PATH=${criuPath(ctx.criu.binary)}`, ...argv] : argv, '');
}

/** CRIU's version, once `criu check` passed on this worker (run once: ~0.1 s). */
function workerCriuVersion(ctx: RuntimeContext): Promise<string> {
  const criu = ctx.criu;
  if ('unavailable' in criu) return Promise.reject(new AsbError('Unavailable', criu.unavailable));
  ctx.versions.criu ??= criuCheck(criu.binary).then((check) => {
    if (!check.ok) throw new AsbError('Unavailable', `criu check fails on this worker: ${check.reason ?? ''}`);
    return check.version;
  }).catch((err: unknown) => {
    ctx.versions.criu = undefined;
    throw err;
  });
  return ctx.versions.criu;
}

/** One runsc command on a running gVisor pod, through the launcher. */
export function runscOn(ctx: RuntimeContext, target: PodTarget, cmd: RunscCommand): Promise<{ code: number; output: string }> {
  return ctx.launcher.run([target.runc, ...target.runtimeFlags, '--root', target.runcRoot, ...runscSubcommand(cmd)], '');
}

/**
 * The memory save both a stop with memory and a snapshot make: the agent's connections dropped
 * (a save drops every connection from outside), the sandbox paused, saved with -leave-running into
 * `partial` (runsc.ts' checkpointSequence says why), `check`ed, and sealed as `sealed`
 * (checkpoint.ts). On success the sandbox stays paused: the caller kills it or resumes it
 * (resumePaused). On any failure the image is deleted, the sandbox resumed, and `failed(why)`
 * (or a CheckpointFailed the check threw) is thrown. `beside` runs while the sandbox is paused and
 * its disk final: on runc beside CRIU's dump, on gVisor beside the image's check and seal; the save
 * fails when it does.
 */
export async function savePaused(ctx: RuntimeContext, pod: Pod, target: PodTarget, partial: string, sealed: string, failed: (why: string) => AsbError, check?: () => Promise<void>, beside?: () => Promise<void>): Promise<CheckpointMeta> {
  const runc = target.kind === 'runc';
  const maker: CheckpointMaker = await (runc ? workerCriuVersion(ctx).then((criu) => ({ criu })) : workerRunscVersion(ctx).then((runsc) => ({ runsc }))).catch((err: unknown) => {
    throw failed(err instanceof Error ? err.message : String(err));
  });
  await discardCheckpoint(partial);
  if (runc) {
    // root:<pod's root group> 0750: CRIU reads part of the image from inside the pod's user
    // namespace at restore, before and after its tasks take the namespace's root (checkpoint.ts);
    // the pod dir (0700, root's) keeps everyone else out.
    const root = pod.persisted?.idRange?.hostId ?? ROOT_ID_MAP.hostId;
    await mkdir(partial, { mode: 0o750 }).then(() => chown(partial, 0, root)).then(() => chmod(partial, 0o750)).catch((err: unknown) => {
      throw failed(`cannot make the image's directory: ${err instanceof Error ? err.message : String(err)}`);
    });
  }
  const steps = checkpointSequence(target.id, partial);
  target.agent?.suspend();
  const paused = runc ? await runcOn(ctx, target, ['pause', target.id]) : await runscOn(ctx, target, steps.pause);
  if (paused.code !== 0) {
    void target.agent?.resume();
    await discardCheckpoint(partial);
    throw failed(`${target.kind} pause: ${lastLine(paused.output)}`);
  }
  try {
    // runc: the cgroup is frozen already, and CRIU leaves it frozen after the dump (--leave-running).
    // `beside` settles before anything goes on, a failure's resume included; its handler is
    // attached at once, so that a failure meanwhile is no unhandled rejection.
    const besides = runc ? beside?.() : undefined;
    const besidesSettled = besides?.catch(() => undefined);
    const saved = await (runc ? runcOn(ctx, target, runcCheckpoint(target.id, partial), true) : runscOn(ctx, target, steps.checkpoint)).finally(() => besidesSettled);
    await besides;
    if (saved.code !== 0) throw failed(`${target.kind} checkpoint: ${runc ? await criuDumpError(partial, saved.output) : lastLine(saved.output)}`);
    // gVisor: only once runsc's save has written the sentry's cached file data back.
    const after = runc ? undefined : beside?.();
    const afterSettled = after?.catch(() => undefined);
    try {
      // gvisor#14229: near ENOSPC runsc truncated the pages file and still exited 0.
      if ((await freeBytes(partial)) < MIN_FREE_AFTER_SAVE_BYTES) throw failed('the worker\'s disk filled up during the save, so the image may be truncated');
      await check?.();
      const meta = await sealCheckpoint(partial, sealed, maker, isoNow(ctx.clock));
      await after;
      return meta;
    } finally {
      await afterSettled;
    }
  } catch (err) {
    await discardCheckpoint(partial);
    await resumePaused(ctx, pod, target);
    throw isAsbError(err, 'CheckpointFailed') ? err : failed(err instanceof Error ? err.message : String(err));
  }
}

/** `runc resume` (its cgroup thawed) or `runsc resume` of a paused or frozen pod. */
export function resumeOn(ctx: RuntimeContext, target: PodTarget): Promise<{ code: number; output: string }> {
  return target.kind === 'runc' ? runcOn(ctx, target, ['resume', target.id]) : runscOn(ctx, target, { op: 'resume', id: target.id });
}

/** Resumes a sandbox savePaused left paused, and attaches its agent's processes again. */
export async function resumePaused(ctx: RuntimeContext, pod: Pod, target: PodTarget): Promise<void> {
  const resumed = await resumeOn(ctx, target);
  if (resumed.code !== 0) ctx.log.error({ id: pod.id, output: resumed.output }, 'a sandbox paused for a checkpoint could not be resumed');
  void target.agent?.resume();
}

export async function dropCheckpoint(ctx: RuntimeContext, pod: Pod): Promise<void> {
  pod.checkpoint = undefined;
  await discardCheckpointSoon(pod.paths.checkpoint);
}

/** What the runsc binary says it is (runsc checks an image against its own version, not against the pin). */
function workerRunscVersion(ctx: RuntimeContext): Promise<string> {
  const binary = ctx.host.runsc?.binary;
  if (binary === undefined) return Promise.reject(new AsbError('Unavailable', 'gVisor (runsc) is not available on this worker'));
  ctx.versions.runsc ??= runscVersion(binary).catch((err: unknown) => {
    ctx.versions.runsc = undefined;
    throw err;
  });
  return ctx.versions.runsc;
}

/**
 * Stop with memory (gVisor): the sandbox is paused, saved with -leave-running (runsc.ts'
 * checkpointSequence says why), the image sealed (checkpoint.ts), and only then is the sandbox
 * killed; the shim sees its init end and cleans up as for any stop, and the pod is Stopped with
 * its checkpoint. Any failure before the kill resumes the sandbox, deletes what was written and
 * rejects with CheckpointFailed saying why.
 */
export async function stopWithMemory(ctx: RuntimeContext, pod: Pod): Promise<void> {
  const target = pod.target;
  if (target === undefined) {
    if (pod.state.phase === 'Stopped' && pod.checkpoint !== undefined) return;
    throw new AsbError('SandboxNotRunning', `pod ${pod.id} is not running: there is no memory to keep`);
  }
  canSaveMemory(ctx, pod, target, 'pause');
  // The last checkpoint's mark must not land in this one (makeDurable writes it by path).
  await pod.settling;
  const request = pod.persisted?.request;
  if (request === undefined) throw new AsbError('Internal', `pod ${pod.id} runs without a recorded request`);
  const failed = (why: string): AsbError => new AsbError('CheckpointFailed', `pod ${pod.id}'s memory was not saved, it keeps running: ${why}`);
  const { paths } = pod;
  // Counted against the pod's ephemeral-storage with its files, and against the worker's disk.
  const room = async (bytes: number, reserve: number): Promise<void> => {
    const disk = paths.disk === undefined || (await madeBeforeDisks(paths.dir)) ? undefined : await mountedDiskUsage(paths.disk.mount, paths.dir);
    const fits = checkpointRoom({
      limitBytes: disk === undefined ? undefined : podDisk(request.spec).bytes,
      diskUsedBytes: disk?.usedBytes ?? 0,
      imageBytes: bytes,
      hostFreeBytes: await freeBytes(paths.dir),
      hostReserveBytes: reserve,
    });
    if (!fits.ok) throw failed(fits.reason);
  };
  try {
    const memory = (await cgroupUsage(posix.join(ctx.host.cgroupParent, pod.id))).memory?.workingSetBytes ?? 0;
    await room(memory, CHECKPOINT_HOST_RESERVE_BYTES);
  } catch (err) {
    throw isAsbError(err, 'CheckpointFailed') ? err : failed(err instanceof Error ? err.message : String(err));
  }
  const meta = await savePaused(ctx, pod, target, paths.checkpointPartial, paths.checkpoint, failed, async () => room(await imageBytes(paths.checkpointPartial), MIN_FREE_AFTER_SAVE_BYTES - 1));
  pod.checkpoint = meta;
  pod.stopping = true;
  const exited = pod.exited ?? Promise.resolve();
  // Paused, its memory saved: nothing in it may run again, so no SIGTERM and no grace.
  if (target.kind === 'runc') await killFrozen(ctx, pod, target);
  else signal(target.pid, 'SIGKILL');
  // Every process is killed and none runs another instruction: the pause is done, and the pod
  // is Stopped now. Its teardown goes on (the kernel frees its memory, ~0.1 s per GiB; the shim
  // deletes the container and unmounts its disk), and whatever needs the pod next waits for it.
  // The shim and clock timers are unref'd (see stop()): while the teardown goes on, something
  // must hold the process open, or a caller awaiting it (a start) would see the process exit.
  const keepAlive = setInterval(() => undefined, 60_000);
  const ended = within(ctx.clock, exited, 10_000).then((ok) => {
    if (!ok) throw new AsbError('Timeout', `pod ${pod.id} did not end after its checkpoint`);
  });
  const teardown: Promise<void> = ended.finally(() => {
    clearInterval(keepAlive);
    if (pod.teardown === teardown) pod.teardown = undefined;
  });
  pod.teardown = teardown;
  teardown.catch((err: unknown) => ctx.log.warn({ err, id: pod.id }, 'a pod stopped with its memory did not end'));
  pod.probe?.cancel();
  pod.probe = undefined;
  // Its processes' handles wait for the restore (podExited, when it comes, finds no target).
  if (target.agent !== undefined) pod.keptAgent = target.agent;
  delete pod.target;
  pod.state = { phase: 'Stopped', ready: false, ...(pod.persisted === undefined ? {} : { ip: pod.persisted.ip }) };
  ctx.emit(pod.id);
  pod.settling = makeDurable(paths.checkpoint);
  ctx.log.info({ id: pod.id, bytes: meta.bytes }, 'pod stopped with its memory');
}

/** `runc checkpoint` of a frozen container into `dir`, CRIU's dump.log with it; the container is left as it was (frozen). */
function runcCheckpoint(id: string, dir: string): string[] {
  return ['checkpoint', '--leave-running', '--image-path', dir, '--work-path', dir, id];
}

/** Why `runc checkpoint` failed: CRIU's first error in its dump.log (runc says only "criu failed"), else runc's last line. */
async function criuDumpError(dir: string, output: string): Promise<string> {
  const log = await readFile(join(dir, 'dump.log'), 'utf8').catch(() => '');
  // Every run logs "rlimit: Can't setup RLIMIT_NOFILE for self" (harmless, docs/criu.md): not the reason.
  const first = log.split('\n').find((line) => line.includes('Error (') && !line.includes('RLIMIT_NOFILE for self'))?.trim();
  return first === undefined ? lastLine(output) : `${lastLine(output)}: ${first}`;
}
