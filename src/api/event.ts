// core/v1 Event, as the kube-apiserver stores it and `kubectl get events` / `kubectl describe`
// read it: the fields kubectl prints (involvedObject, reason, message, type, count, first and
// last timestamps, source) and nothing of events.k8s.io/v1 that kubectl 1.3x does not read.
import type { ObjectMeta, ResourceType } from './meta.ts';

export const EventType: ResourceType = { group: '', version: 'v1', kind: 'Event', plural: 'events', namespaced: true };

export interface ObjectReference {
  apiVersion: string;
  kind: string;
  name: string;
  namespace: string;
  uid: string;
  resourceVersion?: string;
}

export interface KubeEvent {
  apiVersion: 'v1';
  kind: 'Event';
  metadata: ObjectMeta;
  involvedObject: ObjectReference;
  reason: string;
  message: string;
  type: 'Normal' | 'Warning';
  count: number;
  firstTimestamp: string;
  lastTimestamp: string;
  source: { component: string };
  reportingComponent: string;
  reportingInstance: string;
}
