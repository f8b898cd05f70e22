// How a Sandbox is built from a SandboxTemplate (warm pool members and cold starts alike), and
// the few facts about a Sandbox that several controllers read.
import type { OwnerReference } from '../api/meta.ts';
import { findCondition } from '../api/meta.ts';
import { ANNOTATION, SandboxType, type Lifecycle, type Sandbox, type SandboxTemplate } from '../api/types.ts';
import { apiVersionOf } from '../api/meta.ts';
import { POD_SECURITY_ANNOTATION } from '../api/pod-security.ts';

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
}

export function sandboxFromTemplate(template: SandboxTemplate, params: SandboxParams): Sandbox {
  const t = template.spec;
  const idleTimeoutMs = params.idleTimeoutMs ?? t.idleTimeoutMs;
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
    },
  };
}

export function isSandboxReady(sandbox: Sandbox): boolean {
  return findCondition(sandbox.status?.conditions, 'Ready')?.status === 'True';
}

export function isDeleting(sandbox: { metadata: { deletionTimestamp?: string } }): boolean {
  return sandbox.metadata.deletionTimestamp !== undefined;
}
