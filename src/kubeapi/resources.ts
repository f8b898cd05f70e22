// The resources the Kubernetes API serves: our four kinds of kubernetes-sigs/agent-sandbox, each
// in both groups' v1alpha1 and v1beta1 (one schema, no conversion: src/api/crd.ts), addressed as
// /apis/<group>/<version>/[namespaces/<ns>/]<plural>[/<name>[/status]].
//
// ApiKey, Cluster and SyncState are not served: keys are managed with `asb keys`, and the
// federation's kinds belong to the hub and the sync agent.
import { crdFor, type CustomResourceDefinition, type PrinterColumn, type ScaleSubresource } from '../api/crd.ts';
import { apiVersionOf, type KubeObject, type ResourceType } from '../api/meta.ts';
import { CORE_GROUP, EXT_GROUP, SandboxClaimType, SandboxSnapshotType, SandboxTemplateType, SandboxType, SandboxWarmPoolType } from '../api/types.ts';
import { servedVersions } from '../api/validate.ts';

export interface ServedResource {
  rt: ResourceType;
  crd: CustomResourceDefinition;
  versions: readonly string[];
  /** kubectl's preferred version: the newest (v1beta1), as the apiserver orders CRD versions. */
  preferred: string;
  columns: readonly PrinterColumn[];
}

export const SERVED_TYPES: readonly ResourceType[] = [SandboxType, SandboxTemplateType, SandboxClaimType, SandboxWarmPoolType, SandboxSnapshotType];
export const SERVED_GROUPS: readonly string[] = [CORE_GROUP, EXT_GROUP];

/** Versions newest first: what discovery lists and what a client prefers. */
function newestFirst(versions: readonly string[]): string[] {
  return [...versions].sort((a, b) => (a < b ? 1 : a > b ? -1 : 0));
}

// A CRD without printer columns gets this one from the apiserver (apiextensions defaulting).
const DEFAULT_COLUMNS: readonly PrinterColumn[] = [{ name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp' }];

export const SERVED: readonly ServedResource[] = SERVED_TYPES.map((rt) => {
  const crd = crdFor(rt);
  const versions = newestFirst(servedVersions(rt));
  return { rt, crd, versions, preferred: versions[0] ?? rt.version, columns: crd.spec.versions[0]?.additionalPrinterColumns ?? DEFAULT_COLUMNS };
});

/** Versions a group serves, newest first. */
export function groupVersions(group: string): string[] {
  return newestFirst([...new Set(SERVED.filter((s) => s.rt.group === group).flatMap((s) => s.versions))]);
}

export function resourcesOf(group: string, version: string): ServedResource[] {
  return SERVED.filter((s) => s.rt.group === group && s.versions.includes(version));
}

export function findResource(group: string, version: string, plural: string): ServedResource | undefined {
  return resourcesOf(group, version).find((s) => s.rt.plural === plural);
}

/** The object as served in `version`: the same fields under that version's apiVersion. */
export function asVersion<T extends KubeObject>(obj: T, rt: ResourceType, version: string): T {
  return { ...obj, apiVersion: apiVersionOf({ ...rt, version }) };
}

/** `sandboxes.agents.x-k8s.io`: how the apiserver names a resource in messages. */
export function qualifiedResource(rt: ResourceType): string {
  return `${rt.plural}.${rt.group}`;
}

/** The scale subresource the CRD declares for this version (SandboxWarmPool, Sandbox), if any. */
export function scaleSubresource(s: ServedResource, version: string): ScaleSubresource | undefined {
  return s.crd.spec.versions.find((v) => v.name === version)?.subresources.scale;
}
