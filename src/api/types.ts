// The API objects, compatible with kubernetes-sigs/agent-sandbox: `agents.x-k8s.io` Sandbox and
// `extensions.agents.x-k8s.io` SandboxTemplate, SandboxClaim and SandboxWarmPool. Both v1alpha1
// (replicas, sandboxTemplateRef) and v1beta1 (operatingMode, warmPoolRef) field names are
// accepted; the store keeps what the user wrote, controllers read both.
import type { Condition, KubeObject, ObjectMeta, ResourceType } from './meta.ts';

export const CORE_GROUP = 'agents.x-k8s.io';
export const EXT_GROUP = 'extensions.agents.x-k8s.io';
/** Our own kinds (API keys) live in this group. */
export const ASB_GROUP = 'asb.dev';

export const SandboxType: ResourceType = { group: CORE_GROUP, version: 'v1alpha1', kind: 'Sandbox', plural: 'sandboxes', namespaced: true };
export const SandboxTemplateType: ResourceType = { group: EXT_GROUP, version: 'v1alpha1', kind: 'SandboxTemplate', plural: 'sandboxtemplates', namespaced: true };
export const SandboxClaimType: ResourceType = { group: EXT_GROUP, version: 'v1alpha1', kind: 'SandboxClaim', plural: 'sandboxclaims', namespaced: true };
export const SandboxWarmPoolType: ResourceType = { group: EXT_GROUP, version: 'v1alpha1', kind: 'SandboxWarmPool', plural: 'sandboxwarmpools', namespaced: true };
export const ApiKeyType: ResourceType = { group: ASB_GROUP, version: 'v1alpha1', kind: 'ApiKey', plural: 'apikeys', namespaced: false };
/** Ours, after kubernetes-sigs KEP-694's snapshot proposal: a sandbox's files (and memory) kept as an object of their own. */
export const SandboxSnapshotType: ResourceType = { group: EXT_GROUP, version: 'v1alpha1', kind: 'SandboxSnapshot', plural: 'sandboxsnapshots', namespaced: true };

export const RESOURCE_TYPES: readonly ResourceType[] = [SandboxType, SandboxTemplateType, SandboxClaimType, SandboxWarmPoolType, SandboxSnapshotType, ApiKeyType];

/** Labels and annotations we own. User templates may not set keys under these prefixes. */
export const LABEL = {
  /** Which warm pool a sandbox belongs to while it is unclaimed. */
  pool: 'agents.x-k8s.io/warm-pool-sandbox',
  /** cold | warm */
  launchType: 'agents.x-k8s.io/launch-type',
  claimUid: 'agents.x-k8s.io/claim-uid',
  template: 'asb.dev/template',
  /** The team (tenant) that owns a claimed sandbox. Unclaimed warm members have none. */
  owner: 'asb.dev/owner',
} as const;

export const ANNOTATION = {
  /** On a claim: the sandbox it bound. */
  sandboxName: 'agents.x-k8s.io/sandbox-name',
  /** Idle timeout in milliseconds; the sandbox hibernates after this long without activity. */
  idleTimeoutMs: 'asb.dev/idle-timeout-ms',
  /** ISO time of the last activity seen (exec, files, API, data plane). */
  lastActivity: 'asb.dev/last-activity',
  /** On a SandboxTemplate (copied to its sandboxes): ports reachable without the access token, e.g. "8080,3000". */
  publicPorts: 'asb.dev/public-ports',
  /** On a Sandbox: bumped to rotate its access token (access-token.ts); set only by the worker. */
  tokenGeneration: 'asb.dev/token-generation',
  /**
   * On a Sandbox, written with operatingMode Suspended by whoever suspends it: how this one
   * suspension treats memory (a SuspendMemory), overriding spec.suspensionStrategy. The pause APIs
   * write it for a pause that names a mode; the operator for the suspensions it starts itself.
   */
  suspendMemory: 'asb.dev/suspend-memory',
  /** On a Sandbox, written with operatingMode Running: "true" discards a kept memory checkpoint, so the pod starts from its files (E2B's on_resume "reboot"). */
  discardMemory: 'asb.dev/discard-memory',
  /**
   * On a Sandbox whose lifecycle suspends it at its shutdownTime (shutdownPolicy Suspend): how long
   * each run lasts, in ms. A resume after the shutdown time passed moves it this far from now (E2B
   * create sets it from its timeout); absent, such a resume clears the shutdown time.
   */
  runTimeoutMs: 'asb.dev/run-timeout-ms',
  /**
   * On a Sandbox, "true" while the operator holds it suspended because it was idle (written with
   * that suspension, removed by any resume or pause): traffic always wakes such a sandbox, even one
   * whose owner asked that traffic not resume its pauses (E2B's auto_resume off).
   */
  suspendedIdle: 'asb.dev/suspended-idle',
  /**
   * On a Sandbox, written with operatingMode Running by a resume that a request caused (the
   * router's wake): JSON {host, path} of that request, so the lifecycle event says what woke it.
   */
  wakeCause: 'asb.dev/wake-cause',
} as const;

/**
 * How one suspension treats the sandbox's memory (ANNOTATION.suspendMemory):
 * - required: keep it or do not suspend (the sandbox goes back to Running, a condition says why);
 * - preferred: keep it where the runtime can; where it cannot (NotImplemented: runc until CRIU is
 *   wired, the Kubernetes tier) keep the files and say so; a save that fails still fails;
 * - fallback: keep it if the save works, else keep the files and say why (the operator's own
 *   suspensions at an idle timeout or shutdownTime: failing them would leave the sandbox running
 *   past its timeout, and retrying would never end);
 * - none: files only.
 */
export type SuspendMemory = 'required' | 'preferred' | 'fallback' | 'none';
export const SUSPEND_MEMORY_VALUES: readonly SuspendMemory[] = ['required', 'preferred', 'fallback', 'none'];

// ---- Pod spec: the subset of corev1.PodSpec the local runtime honours; the rest is kept as-is.

export interface EnvVar { name: string; value?: string }
/** appProtocol as on a Service port (corev1 has it there only): `kubernetes.io/h2c`, `h2c` or `grpc` make the edge speak HTTP/2 to the port. */
export interface ContainerPort { containerPort: number; name?: string; protocol?: string; appProtocol?: string }
export interface VolumeMount { name: string; mountPath: string; readOnly?: boolean; subPath?: string }

export interface Probe {
  exec?: { command: string[] };
  httpGet?: { path?: string; port: number | string; scheme?: string };
  tcpSocket?: { port: number | string };
  initialDelaySeconds?: number;
  periodSeconds?: number;
  timeoutSeconds?: number;
  failureThreshold?: number;
  successThreshold?: number;
}

export interface Container {
  name: string;
  image?: string | null;
  command?: string[];
  args?: string[];
  workingDir?: string;
  env?: EnvVar[];
  ports?: ContainerPort[];
  volumeMounts?: VolumeMount[];
  readinessProbe?: Probe;
  resources?: { limits?: Record<string, string | number>; requests?: Record<string, string | number> };
  /** Kept as written; the pod-security policy reads the rest (privileged, capabilities, ...). */
  securityContext?: { runAsUser?: number; runAsGroup?: number; runAsNonRoot?: boolean; [other: string]: unknown };
  [other: string]: unknown;
}

export interface Volume {
  name: string;
  emptyDir?: Record<string, unknown>;
  persistentVolumeClaim?: { claimName: string };
  [other: string]: unknown;
}

export interface PodSpec {
  containers: Container[];
  initContainers?: Container[];
  volumes?: Volume[];
  runtimeClassName?: string;
  serviceAccountName?: string;
  automountServiceAccountToken?: boolean;
  hostname?: string;
  securityContext?: { runAsUser?: number; runAsGroup?: number; fsGroup?: number; runAsNonRoot?: boolean; [other: string]: unknown };
  [other: string]: unknown;
}

export interface PodTemplate {
  metadata?: { labels?: Record<string, string>; annotations?: Record<string, string> };
  spec: PodSpec;
}

export interface VolumeClaimTemplate {
  metadata: { name: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  spec: { accessModes?: string[]; resources?: { requests?: Record<string, string | number> }; storageClassName?: string; [other: string]: unknown };
}

export type ShutdownPolicy = 'Delete' | 'Retain';
/** Ours, on a Sandbox only: at shutdownTime the sandbox is suspended (E2B's on_timeout "pause"), not deleted. */
export type SandboxShutdownPolicy = ShutdownPolicy | 'Suspend';
/** Claims may also ask for foreground deletion (the claim goes after its sandbox). */
export type ClaimShutdownPolicy = ShutdownPolicy | 'DeleteForeground';

/**
 * How a sandbox suspends (kubernetes-sigs KEP-694's proposed field): Stop keeps its files and
 * volumes and ends every process; Hibernate keeps its memory and processes too (a checkpoint the
 * next wake restores). KEP-694's Freeze (processes frozen in place, memory held) is not offered.
 */
export type SuspensionStrategy = 'Stop' | 'Hibernate';
export const SUSPENSION_STRATEGIES: readonly SuspensionStrategy[] = ['Stop', 'Hibernate'];

export interface Lifecycle {
  shutdownTime?: string;
  shutdownPolicy?: SandboxShutdownPolicy;
}

// ---- Sandbox

export type OperatingMode = 'Running' | 'Suspended';

export interface SandboxSpec {
  podTemplate: PodTemplate;
  volumeClaimTemplates?: VolumeClaimTemplate[];
  service?: boolean;
  /** v1alpha1: 1 runs the pod, 0 hibernates it. */
  replicas?: number;
  /** v1beta1 equivalent of replicas. */
  operatingMode?: OperatingMode;
  lifecycle?: Lifecycle;
  /** k8s-sigs inlines Lifecycle into the Sandbox spec; read both forms with sandboxLifecycle(). */
  shutdownTime?: string;
  shutdownPolicy?: SandboxShutdownPolicy;
  /** Ours: hibernate after this many ms without activity (0 or absent: never). */
  idleTimeoutMs?: number;
  /** Ours: what the sandbox may reach (src/network/egress-policy.ts). Absent: the default policy. */
  network?: SandboxNetwork;
  /**
   * Ours: a SandboxSnapshot (same namespace) the sandbox starts from: its files, and its memory and
   * processes when the snapshot kept them. Read only when the sandbox's pod is first made.
   */
  snapshotRef?: { name: string };
  /** How it suspends (KEP-694); absent: Stop (suspensionStrategyOf says why). */
  suspensionStrategy?: SuspensionStrategy;
}

/** An egress policy as written on a Sandbox or SandboxTemplate (parseEgressPolicy reads it). */
export interface SandboxNetwork {
  /** false: only what `allow` names. Default true. */
  internet?: boolean;
  /** CIDRs, IPs, domains and `*.` wildcard domains. */
  allow?: string[];
  deny?: string[];
}

/** Phases users see; `Hibernated` keeps volumes and the writable filesystem. */
export type SandboxPhase = 'Pending' | 'Running' | 'Hibernating' | 'Hibernated' | 'Waking' | 'Failed' | 'Expired' | 'Terminating';

export interface SandboxStatus {
  phase?: SandboxPhase;
  conditions?: Condition[];
  podIPs?: string[];
  nodeName?: string;
  serviceFQDN?: string;
  service?: string;
  selector?: string;
  replicas?: number;
  /** ISO time the pod last became ready. */
  readyTime?: string;
  message?: string;
}

export interface Sandbox extends KubeObject {
  metadata: ObjectMeta;
  spec: SandboxSpec;
  status?: SandboxStatus;
}

// ---- SandboxTemplate

export interface SandboxTemplateSpec {
  podTemplate: PodTemplate;
  volumeClaimTemplates?: VolumeClaimTemplate[];
  service?: boolean;
  networkPolicy?: unknown;
  networkPolicyManagement?: 'Managed' | 'Unmanaged';
  envVarsInjectionPolicy?: 'Disallowed' | 'Allowed' | 'Overrides';
  volumeClaimTemplatesPolicy?: 'Disallowed' | 'Allowed' | 'Overrides';
  /** Ours: idle timeout copied onto sandboxes made from this template. */
  idleTimeoutMs?: number;
  /** Ours: the egress policy copied onto sandboxes made from this template; wins over networkPolicy. */
  network?: SandboxNetwork;
  /** Copied onto sandboxes made from this template (KEP-694's field). */
  suspensionStrategy?: SuspensionStrategy;
}

export interface SandboxTemplate extends KubeObject {
  metadata: ObjectMeta;
  spec: SandboxTemplateSpec;
}

// ---- SandboxSnapshot

export type SnapshotMode = 'Full' | 'Filesystem';

export interface SandboxSnapshotSpec {
  /** The sandbox to snapshot, in the same namespace. Taken once; the snapshot outlives it. */
  sandboxRef: { name: string };
  /** Full: memory, processes and files (gVisor sandboxes); Filesystem: files only. Default Full. */
  mode?: SnapshotMode;
}

export interface SandboxSnapshotStatus {
  phase?: 'Pending' | 'Ready' | 'Failed';
  conditions?: Condition[];
  /** When it was taken (ISO 8601). */
  takenAt?: string;
  /** Whether memory and processes were kept. */
  memory?: boolean;
  /** Bytes it takes on the worker (the disk copy and the memory image). */
  bytes?: number;
  memoryBytes?: number;
  /** What a sandbox started from it runs: the source's pod template, template and egress policy. */
  source?: {
    sandbox: string;
    template?: string;
    podTemplate: PodTemplate;
    volumeClaimTemplates?: VolumeClaimTemplate[];
    network?: SandboxNetwork;
    /** The source's annotations that sandboxes keep from their template (public ports, pod-security level). */
    annotations?: Record<string, string>;
  };
}

export interface SandboxSnapshot extends KubeObject {
  metadata: ObjectMeta;
  spec: SandboxSnapshotSpec;
  status?: SandboxSnapshotStatus;
}

// ---- SandboxWarmPool

export interface SandboxWarmPoolSpec {
  replicas: number;
  sandboxTemplateRef: { name: string };
  updateStrategy?: { type: 'Recreate' | 'OnReplenish' };
}

export interface SandboxWarmPoolStatus {
  replicas?: number;
  readyReplicas?: number;
  selector?: string;
  observedGeneration?: number;
  conditions?: Condition[];
}

export interface SandboxWarmPool extends KubeObject {
  metadata: ObjectMeta;
  spec: SandboxWarmPoolSpec;
  status?: SandboxWarmPoolStatus;
}

// ---- SandboxClaim

export interface SandboxClaimSpec {
  /** v1beta1 */
  warmPoolRef?: { name: string };
  /** v1alpha1 */
  sandboxTemplateRef?: { name: string };
  /** v1alpha1: none | default | <pool name> */
  warmpool?: string;
  lifecycle?: { shutdownTime?: string; shutdownPolicy?: ClaimShutdownPolicy; ttlSecondsAfterFinished?: number };
  additionalPodMetadata?: { labels?: Record<string, string>; annotations?: Record<string, string> };
  /** Forces a cold start; applied as the template's envVarsInjectionPolicy allows. */
  env?: ClaimEnvVar[];
  /** Forces a cold start; applied as the template's volumeClaimTemplatesPolicy allows. */
  volumeClaimTemplates?: VolumeClaimTemplate[];
}

/** An env var a claim adds: to `containerName`, else to the first container. */
export interface ClaimEnvVar { name: string; value: string; containerName?: string }

export interface SandboxClaimStatus {
  conditions?: Condition[];
  sandbox?: { name: string; podIPs?: string[] };
  /** warm | cold: how the claim was satisfied. */
  launchType?: 'warm' | 'cold';
}

export interface SandboxClaim extends KubeObject {
  metadata: ObjectMeta;
  spec: SandboxClaimSpec;
  status?: SandboxClaimStatus;
}

// ---- ApiKey (ours): only the hash is stored.

export interface ApiKeySpec {
  team: string;
  /** hex sha256 of the secret part of the key */
  hash: string;
  /** The public prefix shown in listings, e.g. asb_ab12cd34 */
  prefix: string;
  admin?: boolean;
  revoked?: boolean;
  description?: string;
}

export interface ApiKey extends KubeObject {
  metadata: ObjectMeta;
  spec: ApiKeySpec;
}

/** Whether a sandbox should be running: v1beta1 operatingMode wins over v1alpha1 replicas. */
export function wantsRunning(spec: SandboxSpec): boolean {
  if (spec.operatingMode !== undefined) return spec.operatingMode === 'Running';
  return (spec.replicas ?? 1) > 0;
}

/**
 * The sandbox's lifecycle whichever way it was written: k8s-sigs YAML puts shutdownTime and
 * shutdownPolicy directly in spec, our own form nests them in spec.lifecycle. Validation
 * refuses objects that use both, so at most one side is set.
 */
export function sandboxLifecycle(spec: SandboxSpec): Lifecycle {
  const lifecycle: Lifecycle = { ...spec.lifecycle };
  if (spec.shutdownTime !== undefined) lifecycle.shutdownTime = spec.shutdownTime;
  if (spec.shutdownPolicy !== undefined) lifecycle.shutdownPolicy = spec.shutdownPolicy;
  return lifecycle;
}

/**
 * How the sandbox suspends. The default is Stop, not Hibernate: a memory image costs disk the
 * size of the sandbox's resident memory (a 256 MiB python3 made a 259 MB image), and restoring it
 * (~0.2-0.3 s on gVisor, more per GiB) is slower than today's wake of a small app from its files
 * (~80 ms on runc). Sandboxes that keep state in memory (a REPL, a kernel, a dev server) opt in.
 */
/** The runtimeClassName that runs a pod under gVisor (as kubernetes-sigs/agent-sandbox's examples and GKE Sandbox name it). */
export const GVISOR_RUNTIME_CLASS = 'gvisor';

/**
 * Whether a pod of this Sandbox or template can keep its memory, on a runtime that keeps any:
 * gVisor's always; runc's only when started for Hibernate (PodRequest.checkpointable: CRIU cannot
 * save the user namespace other runc pods run in, docs/criu.md).
 */
export function podKeepsMemory(spec: Pick<SandboxSpec, 'podTemplate' | 'suspensionStrategy'>): boolean {
  return spec.podTemplate.spec.runtimeClassName === GVISOR_RUNTIME_CLASS || suspensionStrategyOf(spec) === 'Hibernate';
}

export function suspensionStrategyOf(spec: Pick<SandboxSpec, 'suspensionStrategy'>): SuspensionStrategy {
  return spec.suspensionStrategy ?? 'Stop';
}
