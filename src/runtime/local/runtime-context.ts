// What the local runtime's parts share: the record of one pod (`Pod`) and the runtime's state they
// read and change (`RuntimeContext`). LocalRuntime (local-runtime.ts) makes one context and passes
// it to each part: pod-start.ts, pod-run.ts, pod-stop.ts, pod-memory.ts, snapshot-fork.ts,
// pod-recovery.ts and pod-egress.ts are functions of it, so none of them imports the runtime, and
// the state they share is here, named. Also the few host helpers several parts use (a signal, a
// bounded wait, a command's last line).
import type { Clock, Timer } from '../../base/clock.ts';
import type { Logger } from '../../base/log.ts';
import type { ImageStore } from '../../images/image-store.ts';
import type { PodState } from '../runtime.ts';
import type { AgentLink } from './agent-link.ts';
import type { CheckpointCheck, CheckpointMeta } from './checkpoint.ts';
import type { PodTarget } from './exec.ts';
import type { Launched, Launcher } from './launcher.ts';
import type { OciHost, PodIdentity } from './oci-pod.ts';
import type { PodNetwork } from './pod-network.ts';
import { writePersisted, type PersistedPod, type PodPaths } from './rootfs.ts';
import type { LocalRuntimeOptions } from './runtime-options.ts';

/** Parent of every runtime's mount points (one directory per state dir, by its hash). */
export const MOUNT_ROOT = '/run/asb/rootfs';
/** A pod id: a DNS label, as a Kubernetes pod name. */
export const POD_ID = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
/** How long an adopted pod's shim may take to clean up after its init ended (runc delete: ~0.1 s). */
export const EXIT_STATUS_WAIT_MS = 10_000;

export interface Pod {
  id: string;
  paths: PodPaths;
  persisted: PersistedPod | undefined;
  state: PodState;
  target?: PodTarget;
  identity?: PodIdentity;
  shim?: Launched;
  /** Its shim died before its init (a kill -9): what the shim undoes at a pod's end, remove() does. */
  shimLost?: boolean;
  /** Bumped on every start so events of an old process never touch a new one. */
  generation: number;
  stopping: boolean;
  starting?: Promise<PodState> | undefined;
  probe?: { cancel(): void } | undefined;
  poll?: Timer;
  exited?: Promise<void> | undefined;
  markExited?: () => void;
  /** An exit seen while start() was still waiting for the init: start() reports it. */
  pendingExit?: number | undefined;
  /** The launcher died while start() was still finishing: start() switches to polling. */
  lostLauncher?: boolean;
  /** Why its recorded id range is not its own (recover found another live pod holding it). */
  rangeConflict?: string;
  /** The last write of `persisted` (persist() chains them). */
  persisting?: Promise<void> | undefined;
  /** The memory checkpoint kept for the next start (checkpoint.ts), when stopped with memory. */
  checkpoint?: CheckpointMeta | undefined;
  /** The last save of its memory (a stop with memory, a snapshot), settled: another waits for it, and so do stop and remove. */
  checkpointing?: Promise<void> | undefined;
  /** Its checkpoint's bytes going to the disk after the stop returned (makeDurable): the next stop with memory waits for it. */
  settling?: Promise<void> | undefined;
  /**
   * The end of a pod stopped with its memory, after the stop returned (stopWithMemory): the
   * kernel freeing its killed processes' memory and the shim deleting the container and
   * unmounting its disk. Whatever needs the pod's files or a new shim (start, stop, remove,
   * snapshot) waits for it; it rejects with Timeout when the shim never reports the end.
   */
  teardown?: Promise<void> | undefined;
  /**
   * The agent link of a pod stopped with its memory: its processes' handles wait in it, and are
   * attached again when the checkpoint is restored, or end when it is not (agent-link.ts).
   */
  keptAgent?: AgentLink | undefined;
}

/** The local runtime's state, as its parts see it: one per LocalRuntime, made by its constructor. */
export interface RuntimeContext {
  readonly opts: LocalRuntimeOptions;
  readonly log: Logger;
  readonly clock: Clock;
  /** The compiled oci-shim binary. */
  readonly shim: string;
  readonly launcher: Launcher;
  readonly host: OciHost;
  readonly images: ImageStore;
  readonly net: PodNetwork;
  /** Why this runtime starts no pod (not root, no runc, no init); undefined when it does. */
  readonly unavailable: string | undefined;
  /** Why pods with runtimeClassName gvisor cannot run here (runsc not built); undefined: they can. */
  readonly runscUnavailable: string | undefined;
  /** CRIU for runc pods' memory, or why there is none. */
  readonly criu: { binary: string } | { unavailable: string };
  readonly idRangesDir: string;
  readonly pods: Map<string, Pod>;
  /** Set by close(): events and watchers of pods no longer act after it. */
  closed: boolean;
  /** Tells the onChange listeners that the pod's state changed. */
  emit(id: string): void;
  /** The mount points' parent, once made (pod-start.ts). */
  mountRootReady: Promise<void> | undefined;
  /** The null-netns mounts of runsc's root being unstacked, and whether a check found just one (pod-start.ts). */
  nullNetns: { unstacking: Promise<void>; single: boolean };
  /** The snapshot id and time → the check of its memory image, passed: forks of one snapshot check it once, not each (snapshot-fork.ts). */
  readonly snapshotsChecked: Map<string, Promise<CheckpointCheck>>;
  /** A snapshot id → its bytes going to the disk after it was taken (makeDurable, which never rejects): a delete waits for it. */
  readonly snapshotsSettling: Map<string, Promise<void>>;
  /** CRIU's version once `criu check` passed, and runsc's, each asked once (pod-memory.ts). */
  versions: { criu?: Promise<string> | undefined; runsc?: Promise<string> | undefined };
}

/**
 * Writes the pod's persisted state as it is when the write runs, one write per pod at a time:
 * two at once shared the temporary file, and the second rename failed with ENOENT (a PUT
 * .../network and the reconciler applying the same policy, 1 run in 4).
 */
export function persist(pod: Pod): Promise<void> {
  const write = (pod.persisting ?? Promise.resolve()).catch(() => undefined).then(() => (pod.persisted === undefined ? undefined : writePersisted(pod.paths, pod.persisted)));
  pod.persisting = write;
  return write;
}

/** Whether `p` settles within `ms` of `clock`. */
export function within(clock: Clock, p: Promise<void>, ms: number): Promise<boolean> {
  return new Promise((resolve) => {
    const timer = clock.after(ms, () => resolve(false));
    void p.then(() => {
      timer.cancel();
      resolve(true);
    });
  });
}

/** The last non-empty line a command printed (runsc's error), for a message. */
export function lastLine(output: string): string {
  return output.trim().split('\n').pop()?.trim() ?? 'no output';
}

export function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // already gone
  }
}
