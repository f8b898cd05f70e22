// The Sandbox reconciler: plays the kubelet-facing half of the k8s-sigs sandbox controller.
// Level-based: every run reads the cached Sandbox and the runtime's in-memory pod state and
// drives the pod toward the spec, then mirrors the pod into status, writing only on change.
// - wantsRunning → runtime.start (idempotent; a Stopped pod wakes on its kept volumes, and on
//   its memory when it was stopped with it: MemoryRestored says whether that worked).
// - not wantsRunning → runtime.stop: hibernated, volumes and identity kept; with memory too when
//   the suspension asks for it (suspension.ts). The Suspended condition says what was kept. A
//   suspension that needed memory and could not have it puts the spec back to Running and says
//   why on the Suspended condition (status False), so the pause that asked can answer with it.
// - shutdownTime reached → Ready=False SandboxExpired, pod stopped; Delete deletes the object,
//   Retain keeps it with phase Expired; Suspend suspends it (E2B's on_timeout "pause").
// - idle past its timeout (claimed sandboxes only) → spec.operatingMode=Suspended.
// - deletionTimestamp → runtime.remove, then drop the finalizer so the store deletes the object.
// A failed pod is not restarted (as in k8s-sigs): it reports PodFailed until the user acts.
// The runtime addresses pods by sandbox id, and an id belongs to one Sandbox per cluster, its
// holder (src/api/sandbox-identity.ts). Another object that has the same name in another
// namespace is never given the pod: it reports NameConflict and its deletion touches nothing.
// Pods and volumes carry the uid of the Sandbox they were made for, so one left over from an
// earlier object of that name is removed before the holder's starts, never reused.
import { isDeepStrictEqual } from 'node:util';
import type { Condition } from '../api/meta.ts';
import { holderAmong, NAME_CONFLICT } from '../api/sandbox-identity.ts';
import { ANNOTATION, SandboxSnapshotType, SandboxType, suspensionStrategyOf, wantsRunning, type Sandbox, type SandboxSnapshot, type SandboxStatus } from '../api/types.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { PodRequest, PodRuntime, PodState } from '../runtime/runtime.ts';
import type { ObjectStore } from '../store/store.ts';
import { isoNow, type Clock } from '../base/clock.ts';
import type { Activity } from './activity.ts';
import { RUNTIME_FINALIZER } from './blueprint.ts';
import type { Reconciler, ReconcileResult } from './controller.ts';
import { splitKey, type Informer } from '../store/informer.ts';
import { expiryOf, idleCheck, shutdownPolicyOf } from './lifecycle.ts';
import { automaticSuspendMemory, decideStopFailure, MEMORY_RESTORED, suspendedSummary, suspendMemoryOf } from './suspension.ts';
import { egressPolicyOf } from '../api/sandbox-network.ts';

export interface SandboxControllerDeps {
  store: ObjectStore;
  runtime: PodRuntime;
  sandboxes: Informer<Sandbox>;
  activity: Activity;
  clock: Clock;
  metrics: Metrics;
}

/** Informer index of sandboxes by name, across namespaces: the objects that claim one id. */
export const NAME_INDEX = 'name';
export function nameIndexValues(sandbox: Sandbox): string[] {
  return [sandbox.metadata.name];
}

/**
 * The Sandbox that holds `id` among those the informer has (src/api/sandbox-identity.ts), or
 * undefined when none has that name. `podUid`: whose pod or volumes the runtime has for the id.
 */
export function holderOfId(sandboxes: Informer<Sandbox>, id: string, podUid?: string): Sandbox | undefined {
  return holderAmong(sandboxes.byIndex(NAME_INDEX, id), podUid);
}

/** A sandbox being deleted, or gone: its reconcile only tears its pod down, and nobody waits on it. */
export function isTeardown(sandbox: Sandbox | undefined): boolean {
  return sandbox === undefined || sandbox.metadata.deletionTimestamp !== undefined;
}

export function podRequestFor(sandbox: Sandbox, snapshotUid?: string): PodRequest {
  const { name, uid } = sandbox.metadata;
  return {
    ...(snapshotUid === undefined ? {} : { from: { snapshot: snapshotUid } }),
    // Always explicit, so a wake runs with the policy the Sandbox says now.
    egress: egressPolicyOf(sandbox.spec.network),
    id: name,
    uid: uid ?? '',
    namespace: sandbox.metadata.namespace ?? 'default',
    hostname: sandbox.spec.podTemplate.spec.hostname ?? name,
    spec: sandbox.spec.podTemplate.spec,
    ...(sandbox.spec.volumeClaimTemplates === undefined ? {} : { volumeClaimTemplates: sandbox.spec.volumeClaimTemplates }),
    // A headless Service on Kubernetes; the local runtime has no Services and ignores it.
    ...(sandbox.spec.service === true ? { service: true } : {}),
    labels: { ...sandbox.spec.podTemplate.metadata?.labels, ...sandbox.metadata.labels },
    // A runc pod keeps its memory only in a user namespace CRIU can checkpoint (PodRequest.checkpointable).
    ...(suspensionStrategyOf(sandbox.spec) === 'Hibernate' ? { checkpointable: true } : {}),
  };
}

/**
 * A sandbox with no status yet is reported Pending only once its pod has taken this long to be
 * ready. Most pods are ready sooner (a warm member's on Kubernetes: ~0.5 s), and writing Pending
 * first cost a status write plus, when the pod turned ready before the watch delivered that
 * write, a Conflict on the Ready write: 2 of the 6 API-server writes a claim and its refill made
 * (bench/kube.ts). kubectl shows the sandbox with no phase meanwhile, which the API reads as
 * Pending.
 */
const FIRST_STATUS_GRACE_MS = 1_000;

/** The kubelet's waiting reasons for an image it cannot get, at the start of a Pending pod's message (kube runtime). */
const IMAGE_PULL_FAILURE = /^(ErrImagePull|ImagePullBackOff|InvalidImageName|ErrImageNeverPull)\b/;

/** The condition's message: the pod's image first (the kubelet's own words name it too, but not always first). */
function imagePullMessage(sandbox: Sandbox, said: string): string {
  const image = sandbox.spec.podTemplate.spec.containers[0]?.image ?? '';
  return `image "${image}" cannot be pulled by the node: ${said}`;
}

/** Ready reasons that are a wait or a choice, not a failure: a sandbox starting, paused or past its time. */
const NOT_FAILURES = new Set(['DependenciesReady', 'DependenciesNotReady', 'SandboxSuspended', 'SandboxExpired']);

/**
 * The reason of a failure this status write enters (asb_sandbox_failures_total), or undefined: the
 * Ready condition turned False with a reason it did not have before. A snapshot still being taken
 * is a wait (phase Pending), a missing or failed one a failure (phase Failed).
 */
export function failureEntered(before: SandboxStatus | undefined, after: SandboxStatus): string | undefined {
  const ready = after.conditions?.find((c) => c.type === 'Ready');
  if (ready === undefined || ready.status !== 'False' || NOT_FAILURES.has(ready.reason)) return undefined;
  if (ready.reason === 'SnapshotNotReady' && after.phase !== 'Failed') return undefined;
  const was = before?.conditions?.find((c) => c.type === 'Ready');
  if (was?.status === 'False' && was.reason === ready.reason && before?.phase === after.phase) return undefined;
  return ready.reason;
}

export function createSandboxReconciler(deps: SandboxControllerDeps): Reconciler {
  const { store, runtime, sandboxes, activity, clock, metrics } = deps;
  /** Sandboxes waking from hibernation: name → time the wake began, for asb_wake_seconds. */
  const wakes = new Map<string, number>();
  /** Sandboxes with no status yet: name → when this process first saw their pod not ready. */
  const unreported = new Map<string, number>();
  /** The egress policy (JSON) last given to the runtime per running sandbox: a change is applied once. */
  const applied = new Map<string, string>();
  /** Sandboxes whose last start restored (true) or, as asked, discarded (false) a memory checkpoint, until their next suspension. */
  const restored = new Map<string, boolean>();
  /** Why a suspension kept files only although memory was asked for, until its status is written. */
  const fellBack = new Map<string, string>();

  const writeStatus = async (sandbox: Sandbox, status: SandboxStatus): Promise<void> => {
    if (isDeepStrictEqual(sandbox.status ?? {}, status)) return;
    await store.updateStatus<Sandbox>(SandboxType, { ...sandbox, status });
    const failure = failureEntered(sandbox.status, status);
    if (failure !== undefined) metrics.sandboxFailuresTotal.inc({ reason: failure });
  };

  const condition = (sandbox: Sandbox, type: string, status: Condition['status'], reason: string, message?: string): Condition => {
    const prev = sandbox.status?.conditions?.find((c) => c.type === type);
    const keep = prev !== undefined && prev.status === status;
    return {
      type,
      status,
      reason,
      ...(message === undefined ? {} : { message }),
      lastTransitionTime: keep ? prev.lastTransitionTime : isoNow(clock),
      ...(sandbox.metadata.generation === undefined ? {} : { observedGeneration: sandbox.metadata.generation }),
    };
  };

  const runningStatus = (sandbox: Sandbox, state: PodState): SandboxStatus => {
    const name = sandbox.metadata.name;
    if (state.phase === 'Failed' || state.phase === 'Succeeded') {
      return {
        phase: 'Failed',
        conditions: [condition(sandbox, 'Ready', 'False', state.reason ?? 'PodFailed', state.message ?? `pod exited with code ${state.exitCode ?? 'unknown'}`)],
      };
    }
    if (state.ready) {
      const wasReady = sandbox.status?.phase === 'Running' && sandbox.status.readyTime !== undefined;
      return {
        phase: 'Running',
        conditions: [condition(sandbox, 'Ready', 'True', 'DependenciesReady'), ...memoryConditions(sandbox, state)],
        ...(state.ip === undefined ? {} : { podIPs: [state.ip] }),
        readyTime: wasReady && sandbox.status?.readyTime !== undefined ? sandbox.status.readyTime : isoNow(clock),
      };
    }
    // An image the node cannot pull (the kubelet's waiting reason starts the message, which names
    // the image): said as it is, not as a plain "pending", so a user sees which image and why.
    const pull = state.phase === 'Pending' ? IMAGE_PULL_FAILURE.exec(state.message ?? '') : null;
    return {
      phase: wakes.has(name) ? 'Waking' : 'Pending',
      conditions: [
        pull === null ? condition(sandbox, 'Ready', 'False', 'DependenciesNotReady', `pod is ${state.phase}`) : condition(sandbox, 'Ready', 'False', pull[1] ?? 'ErrImagePull', imagePullMessage(sandbox, state.message ?? '')),
        ...memoryConditions(sandbox, state),
      ],
      ...(state.ip === undefined ? {} : { podIPs: [state.ip] }),
    };
  };

  /**
   * What a running sandbox's status says of its memory: how its last wake went (MemoryRestored),
   * and a suspension that failed (Suspended False), kept until the next suspension replaces them.
   */
  const memoryConditions = (sandbox: Sandbox, state: PodState): Condition[] => {
    const name = sandbox.metadata.name;
    const prev = sandbox.status?.conditions ?? [];
    const out: Condition[] = [];
    const failedSuspension = prev.find((c) => c.type === 'Suspended' && c.status === 'False');
    if (failedSuspension !== undefined) out.push(failedSuspension);
    const wake = restored.get(name);
    if (state.restoreFailure !== undefined) out.push(condition(sandbox, MEMORY_RESTORED, 'False', 'RestoreFailed', state.restoreFailure));
    else if (wake === true) out.push(condition(sandbox, MEMORY_RESTORED, 'True', 'Restored', 'memory, processes and files restored from the checkpoint'));
    else if (wake === false) out.push(condition(sandbox, MEMORY_RESTORED, 'False', 'Discarded', 'the memory checkpoint was discarded as asked; the pod started from its files'));
    else {
      const before = prev.find((c) => c.type === MEMORY_RESTORED);
      if (before !== undefined) out.push(before);
    }
    return out;
  };

  /** The operator suspends the sandbox itself (idle, shutdownTime with Suspend): a spec write the user sees and can flip back. */
  const suspendItself = async (sandbox: Sandbox, why: 'idle' | 'shutdown'): Promise<void> => {
    const { [ANNOTATION.suspendMemory]: _asked, [ANNOTATION.discardMemory]: _discard, [ANNOTATION.suspendedIdle]: _idle, ...annotations } = sandbox.metadata.annotations ?? {};
    const memory = automaticSuspendMemory(sandbox);
    if (memory !== 'none') annotations[ANNOTATION.suspendMemory] = memory;
    if (why === 'idle') annotations[ANNOTATION.suspendedIdle] = 'true';
    await store.update<Sandbox>(SandboxType, {
      ...sandbox,
      metadata: { ...sandbox.metadata, annotations },
      spec: { ...sandbox.spec, operatingMode: 'Suspended', ...(sandbox.spec.replicas === undefined ? {} : { replicas: 0 }) },
    });
  };

  /**
   * A suspension that needed memory and could not have it: the pod still runs, so the spec goes
   * back to Running. The status is written first, so whoever waits on the pause sees why as soon as
   * it sees the spec run again (the condition's observedGeneration is the pause's generation). The
   * idle clock starts again: an idle sandbox whose save failed is tried once per idle timeout.
   */
  const revertSuspension = async (sandbox: Sandbox, reason: string, why: string): Promise<void> => {
    const name = sandbox.metadata.name;
    const state = runtime.state(name);
    const base = runningStatus(sandbox, state);
    const message = `not suspended, it keeps running: ${why}`;
    const status: SandboxStatus = { ...base, conditions: [...(base.conditions ?? []).filter((c) => c.type !== 'Suspended'), condition(sandbox, 'Suspended', 'False', reason, message)] };
    const written = await store.updateStatus<Sandbox>(SandboxType, { ...sandbox, status });
    const { [ANNOTATION.suspendMemory]: _asked, [ANNOTATION.suspendedIdle]: _idle, ...annotations } = written.metadata.annotations ?? {};
    await store.update<Sandbox>(SandboxType, {
      ...written,
      metadata: { ...written.metadata, annotations },
      spec: { ...written.spec, operatingMode: 'Running', ...(written.spec.replicas === undefined ? {} : { replicas: 1 }) },
    });
    activity.touch(name);
  };

  /** Stops a running pod as the suspension asks; false when it did not stop (the suspension was reverted). */
  const suspendPod = async (sandbox: Sandbox): Promise<boolean> => {
    const name = sandbox.metadata.name;
    const memory = suspendMemoryOf(sandbox);
    if (memory === 'none') {
      await runtime.stop(name);
      return true;
    }
    try {
      await runtime.stop(name, { memory: true });
      metrics.checkpointsTotal.inc({ result: 'saved' });
      return true;
    } catch (err) {
      const decision = decideStopFailure(memory, err);
      if (decision === undefined) throw err;
      metrics.checkpointsTotal.inc({ result: decision.outcome === 'fail' ? 'failed' : 'fell_back' });
      if (decision.outcome === 'fail') {
        await revertSuspension(sandbox, decision.reason, decision.why);
        return false;
      }
      fellBack.set(name, decision.why);
      await runtime.stop(name);
      return true;
    }
  };

  const expire = async (sandbox: Sandbox): Promise<undefined> => {
    const { name, namespace } = sandbox.metadata;
    await runtime.stop(name);
    wakes.delete(name);
    if (shutdownPolicyOf(sandbox) === 'Delete') {
      // The finalizer holds the object until the next run has removed the pod and its volumes.
      await store.delete(SandboxType, namespace ?? '', name);
      return undefined;
    }
    await writeStatus(sandbox, {
      phase: 'Expired',
      conditions: [condition(sandbox, 'Ready', 'False', 'SandboxExpired', `shutdownTime ${sandbox.spec.lifecycle?.shutdownTime ?? ''} reached`)],
    });
    return undefined;
  };

  /** Whether the runtime's pod and volumes for the sandbox's id, if any, were made for this object. */
  const ownsPod = (sandbox: Sandbox): boolean => {
    const uid = runtime.state(sandbox.metadata.name).uid;
    return uid === undefined || uid === sandbox.metadata.uid;
  };

  const finalize = async (sandbox: Sandbox, holds: boolean): Promise<void> => {
    const { name } = sandbox.metadata;
    // A conflicting object's deletion must not remove the holder's pod and volumes.
    if (holds && ownsPod(sandbox)) {
      await runtime.remove(name);
      wakes.delete(name);
      unreported.delete(name);
      applied.delete(name);
      restored.delete(name);
      fellBack.delete(name);
      activity.forget(name);
    }
    const finalizers = sandbox.metadata.finalizers ?? [];
    if (!finalizers.includes(RUNTIME_FINALIZER)) return;
    await store.update<Sandbox>(SandboxType, {
      ...sandbox,
      metadata: { ...sandbox.metadata, finalizers: finalizers.filter((f) => f !== RUNTIME_FINALIZER) },
    });
  };

  return async (key): Promise<ReconcileResult | undefined> => {
    const sandbox = sandboxes.get(key);
    if (sandbox === undefined) {
      // Gone without our finalizer (created by someone who did not set it): still free the pod,
      // unless it is the pod of another object of that name that still holds the id.
      const { name } = splitKey(key);
      if (holderOfId(sandboxes, name) !== undefined) return undefined;
      wakes.delete(name);
      unreported.delete(name);
      applied.delete(name);
      restored.delete(name);
      fellBack.delete(name);
      activity.forget(name);
      if (runtime.state(name).phase !== 'Absent') await runtime.remove(name);
      return undefined;
    }
    const name = sandbox.metadata.name;
    const holds = holderOfId(sandboxes, name, runtime.state(name).uid)?.metadata.uid === sandbox.metadata.uid;
    if (sandbox.metadata.deletionTimestamp !== undefined) {
      await finalize(sandbox, holds);
      return undefined;
    }
    if (!holds) {
      // Said without naming the holder's namespace or team: the id is all this object's owner knew.
      await writeStatus(sandbox, {
        phase: 'Failed',
        conditions: [condition(sandbox, 'Ready', 'False', NAME_CONFLICT, `sandbox id "${name}" belongs to another Sandbox in this cluster; ids are unique across namespaces, so this one never runs: delete it and choose another name`)],
      });
      return undefined;
    }
    if (!ownsPod(sandbox)) {
      // Left by an earlier object of this name (deleted without our finalizer): never reused.
      await runtime.remove(name);
    }
    const now = clock.now();
    const expiry = expiryOf(sandbox);
    const suspendsAtExpiry = shutdownPolicyOf(sandbox) === 'Suspend';
    if (expiry !== undefined && now >= expiry) {
      if (!suspendsAtExpiry) return expire(sandbox);
      // E2B's on_timeout "pause": suspended, not deleted. A resume moves the shutdown time on
      // (src/worker/sandbox-lifecycle.ts resumeSandbox); while suspended the past time does nothing.
      if (wantsRunning(sandbox.spec)) {
        await suspendItself(sandbox, 'shutdown');
        return undefined;
      }
    }
    // k8s-sigs requeues at max(remaining, 2 s) because each check costs an apiserver read; ours
    // reads memory, so the recheck lands at the exact shutdown time.
    let requeueAfterMs = expiry === undefined || now >= expiry ? undefined : expiry - now;

    if (!wantsRunning(sandbox.spec)) {
      wakes.delete(name);
      restored.delete(name);
      const phase = runtime.state(name).phase;
      if (phase !== 'Absent' && phase !== 'Stopped' && !(await suspendPod(sandbox))) return undefined;
      // What this suspension kept is said once, by the run that stopped the pod; later runs keep it.
      const said = sandbox.status?.phase === 'Hibernated' ? sandbox.status.conditions?.find((c) => c.type === 'Suspended' && c.status === 'True') : undefined;
      const why = fellBack.get(name);
      const summary = why === undefined && said !== undefined ? { reason: said.reason, message: said.message ?? '' } : suspendedSummary(runtime.state(name), why);
      await writeStatus(sandbox, {
        phase: 'Hibernated',
        conditions: [
          condition(sandbox, 'Ready', 'False', 'SandboxSuspended', 'operatingMode is Suspended'),
          condition(sandbox, 'Suspended', 'True', summary.reason, summary.message),
        ],
      });
      fellBack.delete(name);
      return requeueAfterMs === undefined ? undefined : { requeueAfterMs };
    }

    if (sandbox.metadata.annotations?.[ANNOTATION.suspendedIdle] !== undefined) {
      // Running again, however it was resumed (kubectl too): the idle mark is gone before the wake,
      // so a later pause is judged as its own. The write brings this sandbox back at once.
      const { [ANNOTATION.suspendedIdle]: _idle, ...annotations } = sandbox.metadata.annotations;
      await store.update<Sandbox>(SandboxType, { ...sandbox, metadata: { ...sandbox.metadata, annotations } });
      return undefined;
    }
    let state = runtime.state(name);
    if (state.phase === 'Absent' || state.phase === 'Stopped') {
      if (state.phase === 'Stopped' && !wakes.has(name)) wakes.set(name, now);
      const discard = sandbox.metadata.annotations?.[ANNOTATION.discardMemory] === 'true';
      const fromCheckpoint = state.checkpoint !== undefined;
      if (fromCheckpoint) restored.set(name, !discard);
      try {
        // A new pod from a snapshot: the snapshot must be there and taken (a wake needs it no more).
        let snapshotUid: string | undefined;
        const ref = sandbox.spec.snapshotRef;
        if (ref !== undefined && state.phase === 'Absent') {
          const snap = await store.tryGet<SandboxSnapshot>(SandboxSnapshotType, sandbox.metadata.namespace ?? 'default', ref.name);
          if (snap?.status?.phase !== 'Ready') {
            const message = snap === undefined ? `SandboxSnapshot "${ref.name}" not found` : `SandboxSnapshot "${ref.name}" is ${snap.status?.phase ?? 'Pending'}${snap.status?.phase === 'Failed' ? '' : ': waiting for it'}`;
            await writeStatus(sandbox, { phase: snap?.status?.phase === 'Failed' || snap === undefined ? 'Failed' : 'Pending', conditions: [condition(sandbox, 'Ready', 'False', 'SnapshotNotReady', message)] });
            return snap === undefined || snap.status?.phase === 'Failed' ? undefined : { requeueAfterMs: 500 };
          }
          snapshotUid = snap.metadata.uid;
        }
        state = await runtime.start(podRequestFor(sandbox, snapshotUid), discard ? { memory: false } : {});
      } catch (err) {
        // Said on the Sandbox, where kubectl and the API show it (on Kubernetes: the API server
        // refusing the Pod, e.g. an empty image), then retried with the queue's backoff.
        const message = `the pod could not be started: ${err instanceof Error ? err.message : String(err)}`;
        await writeStatus(sandbox, { ...sandbox.status, phase: 'Pending', message, conditions: [condition(sandbox, 'Ready', 'False', 'PodStartFailed', message)] });
        throw err;
      }
      // start() may return before the runtime's own state settles; the in-memory read is current.
      state = runtime.state(name);
      if (fromCheckpoint) metrics.memoryRestoresTotal.inc({ result: state.restoreFailure !== undefined ? 'failed' : discard ? 'discarded' : 'restored' });
      applied.set(name, JSON.stringify(egressPolicyOf(sandbox.spec.network)));
    } else if (runtime.setEgressPolicy !== undefined && (state.phase === 'Running' || state.phase === 'Pending')) {
      // spec.network changed while the pod runs (PUT .../network, kubectl edit, a warm claim), or
      // this worker restarted: the runtime gets the policy again (idempotent, one nft run).
      const policy = egressPolicyOf(sandbox.spec.network);
      const key = JSON.stringify(policy);
      if (applied.get(name) !== key) {
        await runtime.setEgressPolicy(name, policy);
        applied.set(name, key);
      }
    }
    if (state.ready) {
      const woke = wakes.get(name);
      if (woke !== undefined) {
        metrics.wakeSeconds.observe((clock.now() - woke) / 1000);
        wakes.delete(name);
      }
      const idle = idleCheck(sandbox, now, activity.last(name));
      if (idle.idle) {
        // A spec change, not a status one: the user sees (and can flip back) why it stopped.
        await suspendItself(sandbox, 'idle');
        return undefined;
      }
      if (idle.remainingMs !== undefined) requeueAfterMs = Math.min(requeueAfterMs ?? Infinity, idle.remainingMs);
    } else if (sandbox.status === undefined && state.phase !== 'Failed' && state.phase !== 'Succeeded') {
      const since = unreported.get(name) ?? now;
      unreported.set(name, since);
      const left = since + FIRST_STATUS_GRACE_MS - now;
      // The pod's readiness requeues this sooner (runtime.onChange).
      if (left > 0) return { requeueAfterMs: Math.min(left, requeueAfterMs ?? Infinity) };
    }
    unreported.delete(name);
    await writeStatus(sandbox, runningStatus(sandbox, state));
    return requeueAfterMs === undefined ? undefined : { requeueAfterMs };
  };
}
