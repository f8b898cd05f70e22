// Kubernetes-style object metadata, shared by every kind the store holds.

export interface OwnerReference {
  apiVersion: string;
  kind: string;
  name: string;
  uid: string;
  controller?: boolean;
  blockOwnerDeletion?: boolean;
}

export interface ObjectMeta {
  name: string;
  namespace?: string;
  generateName?: string;
  uid?: string;
  /** Decimal string, opaque to clients; the embedded store uses one global counter. */
  resourceVersion?: string;
  /** Bumped by the store when spec (or metadata other than status) changes. */
  generation?: number;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  finalizers?: string[];
  ownerReferences?: OwnerReference[];
}

export interface KubeObject {
  apiVersion: string;
  kind: string;
  metadata: ObjectMeta;
  spec?: unknown;
  status?: unknown;
}

export interface Condition {
  type: string;
  status: 'True' | 'False' | 'Unknown';
  reason: string;
  message?: string;
  lastTransitionTime: string;
  observedGeneration?: number;
}

/** Describes one kind to the store: how to address it and whether it is namespaced. */
export interface ResourceType {
  group: string;
  version: string;
  kind: string;
  /** Lower-case plural, as in the REST path and the CRD name. */
  plural: string;
  namespaced: boolean;
}

export function apiVersionOf(rt: ResourceType): string {
  return rt.group === '' ? rt.version : `${rt.group}/${rt.version}`;
}

/** Sets or replaces a condition, keeping lastTransitionTime when the status did not change. */
export function setCondition(conditions: Condition[] | undefined, next: Condition): Condition[] {
  const list = conditions ?? [];
  const prev = list.find((c) => c.type === next.type);
  const keepTime = prev !== undefined && prev.status === next.status;
  const merged: Condition = keepTime ? { ...next, lastTransitionTime: prev.lastTransitionTime } : next;
  return [...list.filter((c) => c.type !== next.type), merged];
}

export function findCondition(conditions: Condition[] | undefined, type: string): Condition | undefined {
  return conditions?.find((c) => c.type === type);
}
