// A pod while it runs, until it ends: `podRunning` makes its target (how exec, files and terminals
// reach it: runc or runsc, and asb-init's agent), starts its readiness probe and says Running;
// `podExited` records its end (Succeeded, Failed with the OOM killer's or the disk's eviction reason,
// or Stopped). Exit events come from its shim through the launcher (pod-start.ts); a pod adopted
// after a restart, or one whose launcher died, is watched by polling its init (`pollExit`).
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { AgentLink } from './agent-link.ts';
import { evictionMessage } from './disk.ts';
import { execInPod } from './exec.ts';
import { ociRuntime } from './oci-pod.ts';
import { mainContainer } from './pod-process.ts';
import { startProbeLoop } from './probes.ts';
import { processStartTime, readExitStatus } from './rootfs.ts';
import { decideRuntimeClass } from './runtime-class.ts';
import { runscContainerId } from '../oci/runsc.ts';
import { EXIT_STATUS_WAIT_MS, persist, signal, type Pod, type RuntimeContext } from './runtime-context.ts';

/**
 * The launcher died: running pods keep running but their exit events are gone, so they are
 * watched by polling, like adopted pods. A pod still starting is finished by start().
 */
export function onLauncherLost(ctx: RuntimeContext, pod: Pod): void {
  pod.lostLauncher = true;
  const { pid, pidStart } = pod.persisted ?? {};
  if (ctx.closed || pod.state.phase !== 'Running' || pid === undefined || pidStart === undefined) return;
  pollExit(ctx, pod, pid, pidStart);
}

/** The pod's init runs as `pid`: its target, its agent link (kept from a stop with memory, or new), its probe, and Running. */
export function podRunning(ctx: RuntimeContext, pod: Pod, pid: number, startedAt: string): void {
  const request = pod.persisted?.request;
  const identity = pod.identity;
  if (request === undefined || identity === undefined) return;
  const container = mainContainer(request.spec);
  const runtimeClass = decideRuntimeClass(request.spec.runtimeClassName, ctx.runscUnavailable);
  if (!runtimeClass.ok) {
    // Only an adopted gVisor pod whose runsc went away since: it runs on, untouched, until it ends.
    ctx.log.error({ id: pod.id }, runtimeClass.message);
    return;
  }
  const runtime = ociRuntime(ctx.host, runtimeClass.kind);
  const ip = pod.persisted?.ip ?? '127.0.0.1';
  const { agent, ...who } = identity;
  // A gVisor pod's container id (runscContainerId), or its bare id when it was started before that.
  const legacy = runtime.kind === 'runsc' && existsSync(join(runtime.root, `${pod.id}_sandbox:${pod.id}.state`));
  const containerId = runtime.kind === 'runsc' ? runscContainerId(pod.id, legacy) : pod.id;
  pod.target = { kind: runtime.kind, runc: runtime.binary, runcRoot: runtime.root, runtimeFlags: runtime.flags, id: containerId, pid, execDir: pod.paths.exec, ...who };
  if (agent !== undefined) {
    const address = { host: ip, port: agent.port, token: agent.token };
    const kept = pod.keptAgent;
    pod.keptAgent = undefined;
    // Restored with its memory: the handles of its processes attach to them again.
    pod.target.agent = kept ?? new AgentLink(address);
    if (kept !== undefined) void kept.resume(address);
  }
  const probe = container.readinessProbe;
  pod.state = { phase: 'Running', ready: probe === undefined, ip, pid, startedAt };
  pod.exited ??= new Promise((resolve) => (pod.markExited = resolve));
  if (probe !== undefined && !ctx.closed) {
    const target = pod.target;
    pod.probe = startProbeLoop({
      probe,
      clock: ctx.clock,
      defaultPeriodMs: ctx.opts.probeIntervalMs ?? 1000,
      target: { host: pod.state.ip ?? '127.0.0.1', ports: container.ports ?? [], exec: (command, timeoutMs) => execInPod(target, { command, timeoutMs }) },
      onChange: (ready) => {
        if (pod.state.phase !== 'Running') return;
        pod.state = { ...pod.state, ready };
        ctx.emit(pod.id);
      },
      onError: (err) => ctx.log.warn({ err, id: pod.id }, 'readiness probe failed to run'),
    });
  }
  ctx.emit(pod.id);
}

/**
 * For pods we did not spawn (adopted): no exit event, so check the init's pid and start time,
 * then wait for the exit status its shim writes once it has deleted the container and unmounted
 * its rootfs (a shim that was killed never writes it: 137 after EXIT_STATUS_WAIT_MS).
 */
export function pollExit(ctx: RuntimeContext, pod: Pod, pid: number, pidStart: string): void {
  const generation = pod.generation;
  let goneAt: number | undefined;
  const check = (): void => {
    void processStartTime(pid).then(async (start) => {
      if (pod.generation !== generation || ctx.closed) return;
      const status = start === pidStart ? undefined : await readExitStatus(pod.paths);
      goneAt ??= start === pidStart ? undefined : ctx.clock.now();
      if (status === undefined && (goneAt === undefined || ctx.clock.now() - goneAt < EXIT_STATUS_WAIT_MS)) {
        pod.poll = ctx.clock.after(goneAt === undefined ? ctx.opts.pollIntervalMs ?? 500 : 20, check);
        return;
      }
      podExited(ctx, pod, status?.code ?? 137, status?.reason);
    });
  };
  pod.poll = ctx.clock.after(ctx.opts.pollIntervalMs ?? 500, check);
}

/** SIGKILL to the pod's init if it still runs (the same process: its start time matches). */
export async function endOrphanedInit(ctx: RuntimeContext, pod: Pod): Promise<void> {
  const { pid, pidStart } = pod.persisted ?? {};
  if (pid === undefined || pidStart === undefined || (await processStartTime(pid)) !== pidStart) return;
  ctx.log.warn({ id: pod.id, pid }, 'the pod\'s shim died before its init: ending the init');
  pod.shimLost = true;
  signal(pid, 'SIGKILL');
}

/** The pod's init ended with `code` (and the shim's `reason`, when it gave one): its target and probe go, and its phase says how it ended. */
export function podExited(ctx: RuntimeContext, pod: Pod, code: number, reason?: string): void {
  pod.probe?.cancel();
  pod.poll?.cancel();
  pod.probe = undefined;
  // Its processes ended with it, unless it was stopped with its memory: their handles wait for the restore.
  if (pod.checkpoint !== undefined && pod.target?.agent !== undefined) pod.keptAgent = pod.target.agent;
  else pod.target?.agent?.end();
  delete pod.target;
  pod.markExited?.();
  pod.exited = undefined;
  const ip = pod.persisted?.ip;
  if (pod.persisted !== undefined) {
    // What the next start needs (request, address, image, id range), without the ended process.
    const { pid: _pid, pidStart: _pidStart, startedAt: _startedAt, restoreFailure: _restoreFailure, ...kept } = pod.persisted;
    pod.persisted = kept;
    persist(pod).catch((err: unknown) => ctx.log.warn({ err, id: pod.id }, 'cannot persist pod state'));
  }
  if (pod.state.phase === 'Pending') {
    pod.pendingExit = code; // start() reports it, with the shim's message when there is one
    return;
  }
  if (pod.stopping) pod.state = { phase: 'Stopped', ready: false };
  else if (reason === 'Evicted' && pod.persisted !== undefined) pod.state = { phase: 'Failed', ready: false, exitCode: code, reason, message: evictionMessage(pod.persisted.request.spec) };
  else if (reason === 'OOMKilled') pod.state = { phase: 'Failed', ready: false, exitCode: code, reason, message: `the container was killed for using more memory than its limit (OOMKilled, exit code ${code})` };
  else pod.state = { phase: code === 0 ? 'Succeeded' : 'Failed', ready: false, exitCode: code, message: `the container exited with code ${code}` };
  if (ip !== undefined) pod.state.ip = ip;
  if (!ctx.closed) ctx.emit(pod.id);
}
