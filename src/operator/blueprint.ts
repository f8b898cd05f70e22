// How a Sandbox is built from a SandboxTemplate (warm pool members and cold starts alike), how a
// claim's env and volumes change the template first, and the few facts about a Sandbox that
// several controllers read.
import type { OwnerReference } from '../api/meta.ts';
import { findCondition } from '../api/meta.ts';
import {
  ANNOTATION,
  SandboxType,
  type ClaimEnvVar,
  type Lifecycle,
  type Sandbox,
  type SandboxTemplate,
  type SandboxTemplateSpec,
  type SuspensionStrategy,
  type VolumeClaimTemplate,
} from '../api/types.ts';
import { apiVersionOf } from '../api/meta.ts';
import { POD_SECURITY_ANNOTATION } from '../api/pod-security.ts';
import { sameEgressPolicy, DEFAULT_EGRESS_POLICY, type EgressPolicy } from '../network/egress-policy.ts';
import { networkSpec, templateEgress } from '../api/sandbox-network.ts';

/** Set by whoever creates a Sandbox (so no extra write); removed once the pod is gone. */
export const RUNTIME_FINALIZER = 'asb.dev/runtime';

export interface SandboxParams {
  name: string;
  namespace: string;
  labels: Record<string, string>;
  annotations?: Record<string, string>;
  ownerReferences?: OwnerReference[];
  lifecycle?: Lifecycle;
  idleTimeoutMs?: number;
  /** The create's egress policy, replacing the template's. */
  network?: EgressPolicy;
  /** The create's, replacing the template's. */
  suspensionStrategy?: SuspensionStrategy;
}

export function sandboxFromTemplate(template: SandboxTemplate, params: SandboxParams): Sandbox {
  const t = template.spec;
  const idleTimeoutMs = params.idleTimeoutMs ?? t.idleTimeoutMs;
  // Copied like idleTimeoutMs: how a sandbox suspends is fixed when it is made, and its own to change.
  const suspensionStrategy = params.suspensionStrategy ?? t.suspensionStrategy;
  // Copied, not looked up later: a sandbox keeps the policy it was made with when its template changes.
  const egress = params.network ?? templateEgress(t);
  const network = params.network === undefined && sameEgressPolicy(egress, DEFAULT_EGRESS_POLICY) ? undefined : networkSpec(egress);
  // The route feed reads public ports from the sandbox itself, so the router never needs the
  // template; the pod-security level a template grants stays with its sandboxes the same way, so
  // their owners may re-apply them (src/worker/pod-admission.ts).
  let annotations = params.annotations;
  for (const key of [ANNOTATION.publicPorts, POD_SECURITY_ANNOTATION]) {
    const value = template.metadata.annotations?.[key];
    if (value !== undefined) annotations = { ...annotations, [key]: value };
  }
  return {
    apiVersion: apiVersionOf(SandboxType),
    kind: SandboxType.kind,
    metadata: {
      name: params.name,
      namespace: params.namespace,
      labels: params.labels,
      ...(annotations === undefined ? {} : { annotations }),
      finalizers: [RUNTIME_FINALIZER],
      ...(params.ownerReferences === undefined ? {} : { ownerReferences: params.ownerReferences }),
    },
    spec: {
      podTemplate: structuredClone(t.podTemplate),
      ...(t.volumeClaimTemplates === undefined ? {} : { volumeClaimTemplates: structuredClone(t.volumeClaimTemplates) }),
      ...(t.service === undefined ? {} : { service: t.service }),
      operatingMode: 'Running',
      ...(params.lifecycle === undefined ? {} : { lifecycle: params.lifecycle }),
      ...(idleTimeoutMs === undefined ? {} : { idleTimeoutMs }),
      ...(network === undefined ? {} : { network }),
      ...(suspensionStrategy === undefined ? {} : { suspensionStrategy }),
    },
  };
}

/** What a claim adds to its template's blueprint (SandboxClaim spec.env and spec.volumeClaimTemplates). */
export interface ClaimChanges {
  env?: readonly ClaimEnvVar[];
  volumeClaimTemplates?: readonly VolumeClaimTemplate[];
}

/**
 * Whether a claim changes the blueprint. A warm member's pod already runs with the template's
 * env and volumes, so such a claim must cold-start (as in k8s-sigs). A property check: the warm
 * claim path stays free of reads.
 */
export function hasClaimChanges(changes: ClaimChanges): boolean {
  return (changes.env?.length ?? 0) > 0 || (changes.volumeClaimTemplates?.length ?? 0) > 0;
}

/** Why a template refuses a claim's changes, in k8s-sigs' Ready reasons (the SDK fails at once on both). */
export interface ClaimChangesRefused {
  reason: 'EnvVarsInjectionRejected' | 'VolumeClaimTemplatesError';
  message: string;
}

/**
 * The template as a claim's env and volumeClaimTemplates change it, under the template's
 * envVarsInjectionPolicy and volumeClaimTemplatesPolicy (both Disallowed when unset), merged as
 * k8s-sigs' claim controller merges them when it cold-starts:
 * - env: Allowed adds variables and refuses one the container already sets (or any at all when
 *   the container has envFrom, whose names it cannot see); Overrides also replaces. A variable
 *   goes to the container or init container it names, else to the first container.
 * - volumeClaimTemplates: Allowed appends and refuses a name the template has; Overrides replaces
 *   by name and appends the rest.
 * Pure: a changed copy, or why not. Never a silent drop.
 */
export function applyClaimChanges(template: SandboxTemplate, changes: ClaimChanges): { template: SandboxTemplate } | { refused: ClaimChangesRefused } {
  if (!hasClaimChanges(changes)) return { template };
  const spec = structuredClone(template.spec);
  const name = template.metadata.name;
  if (changes.env !== undefined && changes.env.length > 0) {
    const problem = injectEnv(spec, changes.env, name);
    if (problem !== undefined) return { refused: { reason: 'EnvVarsInjectionRejected', message: problem } };
  }
  if (changes.volumeClaimTemplates !== undefined && changes.volumeClaimTemplates.length > 0) {
    const merged = mergeVolumeClaimTemplates(spec, changes.volumeClaimTemplates, name);
    if (typeof merged === 'string') return { refused: { reason: 'VolumeClaimTemplatesError', message: merged } };
    spec.volumeClaimTemplates = merged;
  }
  return { template: { ...template, spec } };
}

/** Adds `env` to the pod of `spec` in place; the problem if the template's policy refuses. */
function injectEnv(spec: SandboxTemplateSpec, env: readonly ClaimEnvVar[], templateName: string): string | undefined {
  const policy = spec.envVarsInjectionPolicy ?? 'Disallowed';
  if (policy === 'Disallowed') {
    return `SandboxTemplate "${templateName}" does not let claims set env: its envVarsInjectionPolicy is Disallowed (Allowed or Overrides would)`;
  }
  const pod = spec.podTemplate.spec;
  const all = [...(pod.initContainers ?? []), ...pod.containers];
  for (const v of env) {
    const target = v.containerName === undefined ? pod.containers[0] : all.find((c) => c.name === v.containerName);
    if (target === undefined) {
      return `env ${v.name}: SandboxTemplate "${templateName}" has no container ${v.containerName === undefined ? 'to put it in' : `named "${v.containerName}"`}`;
    }
    if (policy === 'Allowed' && Array.isArray(target.envFrom) && target.envFrom.length > 0) {
      return `env ${v.name}: container "${target.name}" of SandboxTemplate "${templateName}" takes env from envFrom, whose names Allowed cannot check; only envVarsInjectionPolicy Overrides may add to it`;
    }
    const list = (target.env ??= []);
    const at = list.findIndex((e) => e.name === v.name);
    if (at < 0) {
      list.push({ name: v.name, value: v.value });
    } else if (policy === 'Overrides') {
      list[at] = { name: v.name, value: v.value };
    } else {
      return `env ${v.name}: container "${target.name}" of SandboxTemplate "${templateName}" already sets it, and envVarsInjectionPolicy Allowed does not override (Overrides would)`;
    }
  }
  return undefined;
}

/** The template's volume claim templates with the claim's merged in, or the problem. */
function mergeVolumeClaimTemplates(spec: SandboxTemplateSpec, mine: readonly VolumeClaimTemplate[], templateName: string): VolumeClaimTemplate[] | string {
  const policy = spec.volumeClaimTemplatesPolicy ?? 'Disallowed';
  if (policy === 'Disallowed') {
    return `SandboxTemplate "${templateName}" does not let claims add volumeClaimTemplates: its volumeClaimTemplatesPolicy is Disallowed (Allowed or Overrides would)`;
  }
  const theirs = spec.volumeClaimTemplates ?? [];
  const has = (name: string): boolean => theirs.some((t) => t.metadata.name === name);
  // A claim volume becomes a pod volume of its name; two volumes of one name would be ambiguous.
  const podVolume = mine.find((m) => (spec.podTemplate.spec.volumes ?? []).some((v) => v.name === m.metadata.name));
  if (podVolume !== undefined) {
    return `volumeClaimTemplates "${podVolume.metadata.name}": the pod of SandboxTemplate "${templateName}" already has a volume of that name`;
  }
  if (policy === 'Allowed') {
    const clash = mine.find((m) => has(m.metadata.name));
    if (clash !== undefined) {
      return `volumeClaimTemplates "${clash.metadata.name}": SandboxTemplate "${templateName}" has one of that name, and volumeClaimTemplatesPolicy Allowed does not override (Overrides would)`;
    }
    return [...theirs, ...structuredClone(mine)];
  }
  const byName = new Map(mine.map((m) => [m.metadata.name, m]));
  return structuredClone([...theirs.map((t) => byName.get(t.metadata.name) ?? t), ...mine.filter((m) => !has(m.metadata.name))]);
}

export function isSandboxReady(sandbox: Sandbox): boolean {
  return findCondition(sandbox.status?.conditions, 'Ready')?.status === 'True';
}

export function isDeleting(sandbox: { metadata: { deletionTimestamp?: string } }): boolean {
  return sandbox.metadata.deletionTimestamp !== undefined;
}
