// What a sandbox pod is on Kubernetes: the Pod, its PersistentVolumeClaims and its optional
// headless Service, built from a PodRequest; and the PodState a Pod's status amounts to.
// Pure functions: kube-runtime.ts does the I/O.
import type { KubeObject, ObjectMeta, ResourceType } from '../../api/meta.ts';
import type { Container, PodSpec, Volume, VolumeClaimTemplate } from '../../api/types.ts';
import { takesUserNamespace } from '../../api/pod-security.ts';
import { AsbError } from '../../errors.ts';
import type { PodRequest, PodState } from '../runtime.ts';
import { cidrContains, compileEgressPolicy, PRIVATE_RANGES, type Cidr, type EgressPolicy } from '../../network/egress-policy.ts';
import { DEFAULT_FLOOR, type EgressFloor } from '../../network/egress-floor.ts';

/** On every Pod, PVC and Service of a sandbox: its id. The runtime watches by this label. */
export const SANDBOX_LABEL = 'asb.dev/sandbox';
/** On a PVC: the volumeClaimTemplate it was made from. */
export const CLAIM_TEMPLATE_LABEL = 'asb.dev/claim-template';
/** On a Pod: the namespace of its Sandbox when that differs from the runtime's namespace. */
export const SANDBOX_NAMESPACE_ANNOTATION = 'asb.dev/sandbox-namespace';
/** On a Pod and its PVCs: the uid of the Sandbox they were made for (PodRequest.uid). */
export const SANDBOX_UID_ANNOTATION = 'asb.dev/sandbox-uid';

/** The Sandbox uid a Pod or PVC of ours was made for, when it says. */
export function sandboxUidOf(obj: KubeObject | undefined): string | undefined {
  return obj?.metadata.annotations?.[SANDBOX_UID_ANNOTATION];
}

export const PodType: ResourceType = { group: '', version: 'v1', kind: 'Pod', plural: 'pods', namespaced: true };
export const PvcType: ResourceType = { group: '', version: 'v1', kind: 'PersistentVolumeClaim', plural: 'persistentvolumeclaims', namespaced: true };
export const ServiceType: ResourceType = { group: '', version: 'v1', kind: 'Service', plural: 'services', namespaced: true };
export const NetworkPolicyType: ResourceType = { group: 'networking.k8s.io', version: 'v1', kind: 'NetworkPolicy', plural: 'networkpolicies', namespaced: true };

interface ContainerStatus {
  name: string;
  state?: {
    waiting?: { reason?: string; message?: string };
    terminated?: { exitCode?: number; reason?: string; message?: string };
  };
}

export interface PodStatus {
  phase?: string;
  conditions?: { type: string; status: string }[];
  podIP?: string;
  startTime?: string;
  reason?: string;
  message?: string;
  containerStatuses?: ContainerStatus[];
}

export interface KubePod extends KubeObject {
  spec: PodSpec & { terminationGracePeriodSeconds?: number; subdomain?: string };
  status?: PodStatus;
}

export interface KubePvc extends KubeObject {
  spec: VolumeClaimTemplate['spec'];
}

export function claimName(id: string, template: string): string {
  return `${id}-${template}`;
}

/** The id a Pod, PVC or Service of ours belongs to. */
export function sandboxOf(obj: KubeObject): string | undefined {
  return obj.metadata.labels?.[SANDBOX_LABEL];
}

export interface PodDefaults {
  namespace: string;
  /** terminationGracePeriodSeconds when the spec sets none. */
  graceSeconds: number;
}

/**
 * The Pod for a request: the spec as given (runtimeClassName, securityContext, resources pass
 * through), named after the sandbox, with its hostname, hardened where the spec is silent
 * (hardenedSpec), and each volumeClaimTemplate as a volume of that name bound to the claim
 * `<id>-<template>` (a volume of the same name in the spec is replaced, as k8s-sigs does).
 * Throws Invalid for a volume claiming a PVC that is not one of the sandbox's own: every
 * sandbox's PVCs share the namespace, and `<id>-<template>` is easy to guess (tenant isolation).
 */
export function podManifest(req: PodRequest, defaults: PodDefaults): KubePod {
  const templates = (req.volumeClaimTemplates ?? []).map((t) => t.metadata.name);
  const claims: Volume[] = templates.map((t) => ({ name: t, persistentVolumeClaim: { claimName: claimName(req.id, t) } }));
  const claimed = new Set(templates);
  const volumes = [...(req.spec.volumes ?? []).filter((v) => !claimed.has(v.name)).map((v) => ownClaimVolume(req.id, templates, v)), ...claims];
  const spec: KubePod['spec'] = {
    ...hardenedSpec(req.spec),
    hostname: req.hostname,
    terminationGracePeriodSeconds: (req.spec as KubePod['spec']).terminationGracePeriodSeconds ?? defaults.graceSeconds,
  };
  if (volumes.length > 0) spec.volumes = volumes;
  if (req.service === true) spec.subdomain = req.id; // <hostname>.<id>.<namespace>.svc resolves to the pod
  const metadata: ObjectMeta = { name: req.id, namespace: defaults.namespace, labels: { ...req.labels, [SANDBOX_LABEL]: req.id }, annotations: { [SANDBOX_UID_ANNOTATION]: req.uid } };
  if (req.namespace !== defaults.namespace) metadata.annotations = { ...metadata.annotations, [SANDBOX_NAMESPACE_ANNOTATION]: req.namespace };
  return { apiVersion: 'v1', kind: 'Pod', metadata, spec };
}

/** A spec volume's claim as the Pod names it: a template name becomes `<id>-<template>`; another sandbox's PVC is refused. */
function ownClaimVolume(id: string, templates: readonly string[], volume: Volume): Volume {
  const claim = volume.persistentVolumeClaim?.claimName;
  if (claim === undefined) return volume;
  if (templates.includes(claim)) return { ...volume, persistentVolumeClaim: { ...volume.persistentVolumeClaim, claimName: claimName(id, claim) } };
  if (templates.some((t) => claimName(id, t) === claim)) return volume;
  throw new AsbError('Invalid', `volume "${volume.name}" claims PVC ${JSON.stringify(claim)}, which is not one of sandbox ${id}'s own claims (${templates.length === 0 ? 'it has none' : templates.map((t) => claimName(id, t)).join(', ')})`);
}

/**
 * The uid a sandbox runs as when its spec names none: the local runtime's default for an image
 * without a user (runtime/oci/spec.ts DEFAULT_UID) and the user of the project's base image.
 */
export const DEFAULT_SANDBOX_UID = 1000;

/**
 * Secure defaults for what the spec leaves unset, so a pod the pod-security policy let through
 * also passes Pod Security Admission `restricted` on the sandbox namespace: no service account
 * token, the runtime's default seccomp profile, non-root unless the spec asks for root, and per
 * container no privilege escalation and every capability dropped. A value the spec sets (an
 * admin's template may relax the policy) is kept as written.
 * Non-root is runAsNonRoot plus runAsUser DEFAULT_SANDBOX_UID: with runAsNonRoot alone, a real
 * kubelet refuses to start an image whose user is root ("container has runAsNonRoot and image
 * will run as root": busybox, debian, the seeds' examples), where the local runtime runs it as 1000.
 */
export function hardenedSpec(spec: PodSpec): PodSpec {
  const lists = (['initContainers', 'containers', 'ephemeralContainers'] as const).filter((k) => Array.isArray(spec[k]));
  const all = lists.flatMap((k) => spec[k] as Container[]);
  const podCtx = { ...spec.securityContext };
  // A spec that chose root, or chose either way about it, keeps its choice.
  const chose = [podCtx, ...all.map((c) => c.securityContext ?? {})].some((ctx) => ctx.runAsUser === 0 || ctx.runAsNonRoot !== undefined);
  if (!chose) {
    podCtx.runAsNonRoot = true;
    podCtx.runAsUser ??= DEFAULT_SANDBOX_UID; // a container's own runAsUser still wins over the pod's
  }
  podCtx.seccompProfile ??= { type: 'RuntimeDefault' };
  const out: PodSpec = { ...spec, automountServiceAccountToken: spec.automountServiceAccountToken ?? false, securityContext: podCtx };
  // A user namespace of its own (Kubernetes 1.33+; the kubelet gives each pod its own 65,536
  // host ids): root in the sandbox is not root on the node, and a tenant's per-user kernel counts
  // are its own. A spec that sets hostUsers keeps it (Pod Security then wants gVisor for root).
  // Not for gVisor, which keeps those counts in its own kernel: on the test node (containerd
  // 2.4.2, gVisor's shim) runsc failed to start the pod in containerd's namespace ("cannot create
  // gofer process: gofer: error setting namespace of type user").
  if (spec.hostUsers === undefined && takesUserNamespace(spec) && spec.runtimeClassName !== 'gvisor') out.hostUsers = false;
  for (const k of lists) out[k] = (spec[k] as Container[]).map(hardenedContainer);
  return out;
}

/**
 * Whether the API server dropped the user namespace the Pod was sent with: before Kubernetes
 * 1.33, or with UserNamespacesSupport off, `hostUsers` is cleared on create and the Pod would run
 * in the node's user ids, where Pod Security let root in only because of it. (From 1.37 the gate
 * is locked on: no API server here can show this.)
 */
export function userNamespaceDropped(sent: { spec: PodSpec }, made: { spec: PodSpec }): boolean {
  return sent.spec.hostUsers === false && made.spec.hostUsers !== false;
}

function hardenedContainer(c: Container): Container {
  const ctx = { ...c.securityContext };
  if (ctx.privileged === true) return c; // Kubernetes refuses allowPrivilegeEscalation: false with privileged
  ctx.allowPrivilegeEscalation ??= false;
  ctx.capabilities ??= { drop: ['ALL'] };
  return { ...c, securityContext: ctx };
}

/** One PVC per volumeClaimTemplate; ReadWriteOnce unless the template says otherwise. */
export function claimManifests(req: PodRequest, namespace: string): KubePvc[] {
  return (req.volumeClaimTemplates ?? []).map((t) => ({
    apiVersion: 'v1',
    kind: 'PersistentVolumeClaim',
    metadata: {
      name: claimName(req.id, t.metadata.name),
      namespace,
      labels: { ...t.metadata.labels, [SANDBOX_LABEL]: req.id, [CLAIM_TEMPLATE_LABEL]: t.metadata.name },
      annotations: { ...t.metadata.annotations, [SANDBOX_UID_ANNOTATION]: req.uid },
    },
    spec: { ...t.spec, accessModes: t.spec.accessModes ?? ['ReadWriteOnce'] },
  }));
}

/** A headless Service selecting the pod, with the container ports named. */
export function serviceManifest(req: PodRequest, namespace: string): KubeObject {
  const byPort = new Map<string, { name: string; port: number; targetPort: number; protocol: string }>();
  for (const p of req.spec.containers.flatMap((c) => c.ports ?? [])) {
    const protocol = p.protocol ?? 'TCP';
    const key = `${p.containerPort}/${protocol}`;
    if (!byPort.has(key)) byPort.set(key, { name: p.name ?? `port-${p.containerPort}${protocol === 'TCP' ? '' : `-${protocol.toLowerCase()}`}`, port: p.containerPort, targetPort: p.containerPort, protocol });
  }
  const ports = [...byPort.values()];
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: req.id, namespace, labels: { [SANDBOX_LABEL]: req.id } },
    spec: { clusterIP: 'None', selector: { [SANDBOX_LABEL]: req.id }, ...(ports.length > 0 ? { ports } : {}) },
  };
}

/**
 * A sandbox's egress policy as a NetworkPolicy selecting its Pod. NetworkPolicies add up, so the
 * namespace's own policy (clusters/base/sandbox-network-policy.yaml) grants only DNS and ingress
 * from our ingress and worker, and this one grants what the policy allows: each allow CIDR, and
 * with the internet on, 0.0.0.0/0 and ::/0 except the private ranges and the deny CIDRs. Domain
 * entries need the egress proxy; a NetworkPolicy cannot name them, so they open nothing here.
 * The worker's floor (egress-floor.ts) is cut out of every allow CIDR (`except`), and an allow
 * CIDR inside the floor is left out: no policy opens cloud metadata here either. A policy that
 * denies a domain gets no internet (fail closed: the deny could not be enforced).
 */
export function networkPolicyManifest(id: string, namespace: string, policy: EgressPolicy, floor: EgressFloor = DEFAULT_FLOOR): KubeObject {
  const p = compileEgressPolicy(policy);
  const full = (c: Cidr): string => (c.text.includes('/') ? c.text : `${c.text}/${c.family === 4 ? '32' : '128'}`);
  const inside = (inner: Cidr, outer: Cidr): boolean => inner.family === outer.family && inner.prefix >= outer.prefix && cidrContains(outer, { family: inner.family, value: inner.base });
  const to = p.allowCidrs
    .filter((c) => !floor.cidrs.some((f) => inside(c, f)))
    .map((c) => {
      const except = floor.cidrs.filter((f) => inside(f, c)).map(full);
      return { ipBlock: { cidr: full(c), ...(except.length === 0 ? {} : { except }) } };
    });
  // A deny domain cannot be enforced here (no egress proxy on Kubernetes): fail closed, no internet.
  if (p.internet && p.denyDomains.length === 0) {
    for (const family of [4, 6] as const) {
      if (p.denyAll.some((c) => c.family === family)) continue;
      const except = [...PRIVATE_RANGES.filter((r) => r.includes(':') === (family === 6)), ...p.denyCidrs.filter((c) => c.family === family).map((c) => (c.text.includes('/') ? c.text : `${c.text}/${family === 4 ? '32' : '128'}`))];
      to.push({ ipBlock: { cidr: family === 4 ? '0.0.0.0/0' : '::/0', except } });
    }
  }
  return {
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    metadata: { name: id, namespace, labels: { [SANDBOX_LABEL]: id } },
    spec: { podSelector: { matchLabels: { [SANDBOX_LABEL]: id } }, policyTypes: ['Egress'], egress: to.length === 0 ? [] : [{ to }] },
  };
}

/**
 * The PodState of a sandbox from what the cluster holds. No Pod: Stopped when its claims remain
 * or it was stopped here (hibernated; on Kubernetes only the volumes persist), else Absent. A
 * Pod being deleted is Stopped: it is on its way out and a start() waits for it to go.
 */
export function podState(pod: KubePod | undefined, hibernated: boolean): PodState {
  if (pod === undefined) return { phase: hibernated ? 'Stopped' : 'Absent', ready: false };
  const status = pod.status ?? {};
  const state: PodState = { phase: 'Pending', ready: false };
  if (status.podIP !== undefined && status.podIP !== '') state.ip = status.podIP;
  if (pod.metadata.deletionTimestamp !== undefined) return { ...state, phase: 'Stopped', message: 'the pod is being deleted' };
  const main = status.containerStatuses?.find((c) => c.name === pod.spec.containers[0]?.name);
  const terminated = main?.state?.terminated;
  switch (status.phase) {
    case 'Running':
      state.phase = 'Running';
      state.ready = status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') === true;
      if (status.startTime !== undefined) state.startedAt = status.startTime;
      return state;
    case 'Succeeded':
      return { ...state, phase: 'Succeeded', exitCode: terminated?.exitCode ?? 0 };
    case 'Failed': {
      const failed: PodState = { ...state, phase: 'Failed' };
      if (terminated?.exitCode !== undefined) failed.exitCode = terminated.exitCode;
      const message = status.message ?? terminated?.message ?? status.reason ?? terminated?.reason;
      if (message !== undefined) failed.message = message;
      return failed;
    }
    default: {
      // Pending (or Unknown): say why when the kubelet said (ImagePullBackOff, Unschedulable...).
      const waiting = main?.state?.waiting;
      const why = waiting?.reason === undefined ? status.message : `${waiting.reason}${waiting.message === undefined ? '' : `: ${waiting.message}`}`;
      if (why !== undefined) state.message = why;
      return state;
    }
  }
}
