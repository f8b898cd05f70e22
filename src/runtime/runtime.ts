// The pod runtime contract: what the kubelet does for a Sandbox's pod. The local runtime
// (src/runtime/local/) runs pods as isolated process trees on this machine; on Kubernetes the
// same interface is served by Pods plus `pods/exec`. Exec, files and PTY all go through here so
// no agent has to be baked into a sandbox image: a POSIX shell is enough.
import type { Readable, Writable } from 'node:stream';
import type { RootIsolation } from '../api/pod-security.ts';
import type { PodSpec, VolumeClaimTemplate } from '../api/types.ts';
import type { EgressCount } from '../network/egress-metrics.ts';
import type { EgressPolicy } from '../network/egress-policy.ts';

export interface PodRequest {
  /** The sandbox id ([a-z0-9-]+, unique on this worker); names the pod, its disk and its IP. */
  id: string;
  /**
   * The uid of the Sandbox this pod is for. The pod and its volumes carry it: a runtime never
   * starts a request on a pod or volumes made for another uid (an earlier sandbox of that name).
   */
  uid: string;
  namespace: string;
  hostname: string;
  spec: PodSpec;
  volumeClaimTemplates?: VolumeClaimTemplate[];
  labels?: Record<string, string>;
  /** Also make a headless Service named after the pod (Kubernetes runtime); the local runtime ignores it. */
  service?: boolean;
  /**
   * What the pod may reach outside itself (src/network/egress-policy.ts), enforced before its
   * first process runs. Absent: the policy the pod last had (kept across hibernation), else the
   * default (internet yes, private ranges, other pods and the host no).
   */
  egress?: EgressPolicy;
  /**
   * A new pod starts from this snapshot of another (snapshot()): its files, and its memory and
   * processes when the snapshot kept them. Ignored for a pod that exists already (a wake).
   */
  from?: { snapshot: string };
  /**
   * The pod may keep its memory (a stop or snapshot with memory) on runc too: runc makes its user
   * namespace from the id maps, which CRIU can checkpoint and restore, instead of the namespace the
   * shim makes owned by the pod's own host id (docs/criu.md): its per-user counts (inotify,
   * message queues, pending signals) are then charged to host root, shared with every such pod.
   * A gVisor pod keeps its memory either way. Set for Sandboxes whose suspensionStrategy is Hibernate.
   */
  checkpointable?: boolean;
}

/** What snapshot() made. */
export interface SnapshotInfo {
  id: string;
  /** Whether memory and processes were kept, or files only. */
  memory: boolean;
  /** Bytes the snapshot takes on the worker (disk copy and memory image). */
  bytes: number;
  memoryBytes: number;
  /** When it was taken (ISO 8601). */
  at: string;
}


/**
 * Absent: the runtime knows nothing of the id (never started, or removed).
 * Stopped: hibernated: no process, but the writable filesystem and volumes are kept.
 */
export type PodPhase = 'Absent' | 'Pending' | 'Running' | 'Stopped' | 'Succeeded' | 'Failed';

export interface PodState {
  phase: PodPhase;
  /** The uid of the Sandbox the pod (or its kept volumes) was made for; undefined when Absent or unknown. */
  uid?: string;
  /** True once every container is running and its readiness probe (if any) passed. */
  ready: boolean;
  ip?: string;
  /** Host-side pid of the pod's init process, when running. */
  pid?: number;
  startedAt?: string;
  exitCode?: number;
  /** Why a pod failed, in the kubelet's words: ErrImagePull, OOMKilled, Evicted, CreateContainerConfigError, ... */
  reason?: string;
  message?: string;
  /** A Stopped pod whose memory is kept (stop with memory): the image's size and when it was taken. The next start restores it. */
  checkpoint?: { bytes: number; at: string };
  /** The pod was to start from its memory checkpoint and could not (runsc changed, the image is damaged, the restore failed): it started from its files instead, and this says why. */
  restoreFailure?: string;
}

export interface StopOptions {
  /**
   * Keep every process and its memory (a checkpoint), not only the files: the next start resumes
   * them. A runtime or pod that cannot keep memory rejects (NotImplemented) and leaves the pod
   * running: never a silent filesystem-only stop. A save that fails rejects and leaves it running too.
   */
  memory?: boolean;
}

export interface StartOptions {
  /**
   * false: a kept memory checkpoint is discarded and the pod starts from its files (E2B's
   * connect with on_resume "reboot", the way out of an image whose processes hang). Absent or
   * true: a kept checkpoint is restored.
   */
  memory?: boolean;
}

export interface ExecRequest {
  command: string[];
  /** Written to the process's stdin, then stdin is closed. */
  stdin?: Uint8Array | string;
  env?: Record<string, string>;
  cwd?: string;
  /** Run as this uid inside the sandbox; default: the pod's user. */
  user?: number;
  /**
   * With `user`: its primary group and supplementary groups (a build's `USER name:group`, or the
   * groups /etc/group gives the name). Default: the pod's when `user` is the pod's uid, else the
   * uid as gid and none. The local runtime honours them; the Kubernetes runtime's exec does not.
   */
  group?: number;
  groups?: readonly number[];
  /** Kill the process group after this long; the result says timedOut. */
  timeoutMs?: number;
  /** Cap on captured bytes per stream; beyond it output is truncated and `truncated` set. */
  maxOutputBytes?: number;
}

export interface ExecResult {
  exitCode: number;
  stdout: Uint8Array;
  stderr: Uint8Array;
  timedOut: boolean;
  truncated: boolean;
  /** Signal name when the process died of one. */
  signal?: string;
}

export interface FileEntry {
  name: string;
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: number;
  mtime: string;
}

export interface PtyOptions {
  command?: string[];
  cols: number;
  rows: number;
  env?: Record<string, string>;
  cwd?: string;
  user?: number;
}

/** A terminal inside a sandbox. Output is pulled by the consumer so backpressure holds. */
export interface PtySession {
  /** Bytes typed by the user. Resolves when accepted by the pty (backpressure). */
  write(data: Uint8Array | string): Promise<void>;
  resize(cols: number, rows: number): void;
  /** Terminal output; ends when the session exits. Not reading it pauses the process. */
  readonly output: AsyncIterable<Uint8Array>;
  /** Resolves with the shell's exit code (128+n for signal n). */
  readonly exited: Promise<number>;
  /** Hangs up the terminal (SIGHUP), then kills it; idempotent. */
  close(): void;
}

export interface SpawnRequest {
  command: string[];
  env?: Record<string, string>;
  cwd?: string;
  /** Run as this uid inside the sandbox; default: the pod's user. */
  user?: number;
  /** As ExecRequest's. */
  group?: number;
  groups?: readonly number[];
}

/** A process inside a sandbox with its pipes, for callers that stream (envd's process.Start). */
export interface PodProcess {
  readonly stdin: Writable;
  readonly stdout: Readable;
  readonly stderr: Readable;
  /** Signals the process's whole group (a shell and what it started). Ignored once exited. */
  kill(signal: NodeJS.Signals): void;
  /** Resolves with the exit code (128+n for signal n) and the signal's name if it died of one. */
  readonly exited: Promise<{ exitCode: number; signal?: string }>;
}

export interface PodRuntime {
  /**
   * What the runtime does about root in a pod, which the pod-security policy reads to decide
   * whether a tenant may run as uid 0 (src/api/pod-security.ts). Absent: no isolation.
   */
  readonly rootIsolation?: RootIsolation;
  /**
   * Which pods can keep their memory (a stop or snapshot with memory): gVisor's (runtimeClassName
   * gvisor), and runc's started checkpointable (PodRequest.checkpointable). Absent: none.
   */
  readonly canKeepMemory?: { gvisor: boolean; runc: boolean };
  /**
   * Starts the pod if it is not running, reusing its writable filesystem and volumes when they
   * exist (wake after hibernation). Idempotent: resolves at once for a running pod.
   */
  start(pod: PodRequest, opts?: StartOptions): Promise<PodState>;
  /**
   * Hibernates: ends every process, keeps filesystem, volumes and IP reservation. Idempotent.
   * With `memory`, keeps the processes' memory too (StopOptions).
   */
  stop(id: string, opts?: StopOptions): Promise<void>;
  /** Ends every process and deletes the pod's filesystem and volumes. Idempotent. */
  remove(id: string): Promise<void>;
  /** The current state, from memory: no I/O. */
  state(id: string): PodState;
  /** Every pod id the runtime holds (running or stopped), e.g. for recovery after a restart. */
  list(): string[];
  /** Called with the id whenever a pod's state changes (started, ready, exited, removed). */
  onChange(listener: (id: string) => void): () => void;

  exec(id: string, req: ExecRequest): Promise<ExecResult>;
  readFile(id: string, path: string): Promise<Uint8Array>;
  /**
   * Writes the file as its bytes arrive (a Readable is an AsyncIterable): piped into a process in
   * the sandbox with backpressure, never held whole. The file is replaced only once all of the
   * data arrived; if the stream fails, the file is as it was and the stream's error is thrown.
   */
  writeFile(id: string, path: string, data: Uint8Array | AsyncIterable<Uint8Array>, mode?: number): Promise<void>;
  listDir(id: string, path: string): Promise<FileEntry[]>;
  openPty(id: string, opts: PtyOptions): Promise<PtySession>;
  /** Starts a process with its pipes open; nothing is buffered: read stdout and stderr. */
  spawn(id: string, req: SpawnRequest): Promise<PodProcess>;

  /**
   * Replaces a pod's egress policy: new connections follow it at once when the pod runs, and it
   * is kept for the next wake. Absent on runtimes that enforce no policy.
   */
  setEgressPolicy?(id: string, policy: EgressPolicy): Promise<void>;
  /** The kernel's per-pod, per-rule counts (metrics). */
  egressCounts?(): Promise<EgressCount[]>;
  /**
   * What a running pod uses, read on the host (E2B's metrics); undefined when it is not running.
   * Absent: the runtime has no such view (callers fall back to what /proc shows).
   */
  usage?(id: string): Promise<PodUsage | undefined>;

  /**
   * Keeps the pod's files (and with `memory`, its memory and processes: gVisor only) as a snapshot
   * that outlives the pod; a new pod starts from it with PodRequest.from. A running pod is paused
   * for the time of the copy and goes on afterwards; connections from outside are dropped when
   * memory is kept. Absent on runtimes that cannot.
   */
  snapshot?(id: string, snapshotId: string, opts: { memory: boolean }): Promise<SnapshotInfo>;
  /** Deletes a snapshot; pods started from it are not affected. Idempotent. */
  deleteSnapshot?(snapshotId: string): Promise<void>;

  /**
   * Calls `read` with what a running pod wrote to its root filesystem (its overlay's upper dir on
   * the host) while nothing in the pod can write to it (its disk frozen), for a template build to
   * turn into an image layer. Absent on runtimes that cannot.
   */
  readWritableLayer?<T>(id: string, read: (layer: WritableLayer) => Promise<T>): Promise<T>;

  /** Stops watching; leaves pods as they are (they survive a worker restart). Idempotent. */
  close(): Promise<void>;
}

/** A pod's writable layer as readWritableLayer shows it. */
export interface WritableLayer {
  /**
   * The overlay upper dir on the host: overlayfs whiteouts (char device 0:0) and opaque dirs
   * (xattr trusted.overlay.opaque) included. The pod controls every name and link in it: read it
   * without following a symlink.
   */
  dir: string;
  /** The host ids the pod's ids 0..size-1 are: a file's container uid is its host uid - hostId. */
  idRange: { hostId: number; size: number };
  /**
   * Directories of the pod's disk the runtime binds over the image's, which hold what the
   * sandbox writes there instead of `dir` (gVisor's /tmp: `path` "tmp"). Plain directories (no
   * whiteouts); as the pod controls every name in them, read them without following a link too.
   */
  mounts?: readonly { path: string; dir: string }[];
}

export interface DiskUsage {
  usedBytes: number;
  totalBytes: number;
}

/** Each field absent where the runtime cannot tell (no disk of its own, no cgroup controller). */
export interface PodUsage {
  /** The file system that holds the pod's writable layer and volumes. */
  disk?: DiskUsage;
  /** The pod's memory working set (what the kernel cannot take back at once) and page cache. */
  memory?: { workingSetBytes: number; cacheBytes: number };
  /** CPU time of every process of the pod since it started. */
  cpuSeconds?: number;
}
