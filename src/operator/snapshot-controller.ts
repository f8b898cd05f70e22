// The SandboxSnapshot reconciler: takes each snapshot once, on the worker that runs its sandbox,
// and deletes the runtime's copy when the object goes.
// - new (no phase) → the finalizer is added, then runtime.snapshot(sandbox, uid, { memory: mode
//   Full }); status Ready with what was kept and the source's pod template (what a sandbox started
//   from it runs), or Failed with the runtime's reason (a runc sandbox's memory, a sandbox that is
//   gone or not running). A failed snapshot is not retried: the user deletes it and asks again.
// - deletionTimestamp → runtime.deleteSnapshot(uid), then the finalizer goes. Sandboxes started
//   from it keep running: their files are their own copies.
// The runtime's id for a snapshot is the object's uid, unique across namespaces and never reused.
import { isDeepStrictEqual } from 'node:util';
import type { Condition } from '../api/meta.ts';
import { POD_SECURITY_ANNOTATION } from '../api/pod-security.ts';
import { ANNOTATION, LABEL, SandboxSnapshotType, type Sandbox, type SandboxSnapshot, type SandboxSnapshotStatus } from '../api/types.ts';
import { isAsbError } from '../errors.ts';
import type { PodRuntime } from '../runtime/runtime.ts';
import type { ObjectStore } from '../store/store.ts';
import { isoNow, type Clock } from '../base/clock.ts';
import type { Reconciler } from './controller.ts';
import type { Informer } from '../store/informer.ts';

export const SNAPSHOT_FINALIZER = 'asb.dev/snapshot';

export interface SnapshotControllerDeps {
  store: ObjectStore;
  runtime: PodRuntime;
  snapshots: Informer<SandboxSnapshot>;
  sandboxes: Informer<Sandbox>;
  clock: Clock;
}

/** The Ready condition's reason for a runtime error, in the words kubectl shows. */
function failureReason(err: unknown): string {
  if (isAsbError(err, 'NotImplemented')) return 'MemoryNotSupported';
  if (isAsbError(err, 'SandboxNotRunning')) return 'SandboxNotRunning';
  if (isAsbError(err, 'CheckpointFailed')) return 'CheckpointFailed';
  if (isAsbError(err, 'NotFound')) return 'SandboxNotFound';
  return 'SnapshotFailed';
}

export function createSnapshotReconciler(deps: SnapshotControllerDeps): Reconciler {
  const { store, runtime, snapshots, sandboxes, clock } = deps;

  const condition = (status: Condition['status'], reason: string, message?: string): Condition => ({
    type: 'Ready', status, reason, ...(message === undefined ? {} : { message }), lastTransitionTime: isoNow(clock),
  });

  const writeStatus = async (snap: SandboxSnapshot, status: SandboxSnapshotStatus): Promise<void> => {
    if (isDeepStrictEqual(snap.status ?? {}, status)) return;
    await store.updateStatus<SandboxSnapshot>(SandboxSnapshotType, { ...snap, status });
  };

  return async (key) => {
    const snap = snapshots.get(key);
    if (snap === undefined) return undefined;
    const uid = snap.metadata.uid ?? '';
    const finalizers = snap.metadata.finalizers ?? [];
    if (snap.metadata.deletionTimestamp !== undefined) {
      if (!finalizers.includes(SNAPSHOT_FINALIZER)) return undefined;
      await runtime.deleteSnapshot?.(uid);
      await store.update<SandboxSnapshot>(SandboxSnapshotType, { ...snap, metadata: { ...snap.metadata, finalizers: finalizers.filter((f) => f !== SNAPSHOT_FINALIZER) } });
      return undefined;
    }
    const phase = snap.status?.phase;
    if (phase === 'Ready' || phase === 'Failed') return undefined;
    if (!finalizers.includes(SNAPSHOT_FINALIZER)) {
      // First the finalizer: a snapshot the runtime holds is never left behind by a deletion.
      await store.update<SandboxSnapshot>(SandboxSnapshotType, { ...snap, metadata: { ...snap.metadata, finalizers: [...finalizers, SNAPSHOT_FINALIZER] } });
      return undefined; // the write's watch event runs this again
    }
    const namespace = snap.metadata.namespace ?? 'default';
    const sandbox = sandboxes.get(`${namespace}/${snap.spec.sandboxRef.name}`);
    if (sandbox === undefined) {
      await writeStatus(snap, { phase: 'Failed', conditions: [condition('False', 'SandboxNotFound', `sandbox "${snap.spec.sandboxRef.name}" not found in namespace "${namespace}"`)] });
      return undefined;
    }
    if (runtime.snapshot === undefined) {
      await writeStatus(snap, { phase: 'Failed', conditions: [condition('False', 'NotSupported', 'this cluster\'s runtime keeps no snapshots (on the Kubernetes tier containerd\'s CRI restores no checkpoint, and Kubernetes keeps no writable layer): snapshots need the local runtime')] });
      return undefined;
    }
    const memory = (snap.spec.mode ?? 'Full') === 'Full';
    try {
      const info = await runtime.snapshot(sandbox.metadata.name, uid, { memory });
      const template = sandbox.metadata.labels?.[LABEL.template];
      const annotations = Object.fromEntries([ANNOTATION.publicPorts, POD_SECURITY_ANNOTATION].flatMap((k) => {
        const v = sandbox.metadata.annotations?.[k];
        return v === undefined ? [] : [[k, v]];
      }));
      await writeStatus(snap, {
        phase: 'Ready',
        conditions: [condition('True', 'SnapshotTaken', memory ? 'memory, processes and files kept' : 'files kept')],
        takenAt: info.at,
        memory: info.memory,
        bytes: info.bytes,
        memoryBytes: info.memoryBytes,
        source: {
          sandbox: sandbox.metadata.name,
          ...(template === undefined ? {} : { template }),
          podTemplate: sandbox.spec.podTemplate,
          ...(sandbox.spec.volumeClaimTemplates === undefined ? {} : { volumeClaimTemplates: sandbox.spec.volumeClaimTemplates }),
          ...(sandbox.spec.network === undefined ? {} : { network: sandbox.spec.network }),
          ...(Object.keys(annotations).length === 0 ? {} : { annotations }),
        },
      });
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      await writeStatus(snap, { phase: 'Failed', conditions: [condition('False', failureReason(err), message)] });
    }
    return undefined;
  };
}
