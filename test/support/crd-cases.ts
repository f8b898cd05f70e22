// Objects for checking our CRDs, shared by test/crds.test.ts (ajv against the schemas) and the
// Kubernetes tier, test/k8s/crds.test.ts (a real kube-apiserver):
// - INVALID_OBJECTS: invalid for a reason a CRD schema can say, one reason each (the API server
//   stops at an unknown field, so each object has exactly one problem);
// - FULL_STATUS: a status with every field the controllers may write, which must not be pruned.
import type { Condition } from '../../src/api/meta.ts';
import { LABEL, type SandboxClaimStatus, type SandboxStatus, type SandboxWarmPoolStatus } from '../../src/api/types.ts';

export const NOW = '2026-01-02T03:04:05Z';
export const POD_TEMPLATE = { spec: { containers: [{ name: 'main', image: 'busybox' }] } };

export interface InvalidCase {
  what: string;
  obj: Record<string, unknown>;
  /** The field our validator, the schema and the API server all name. */
  field: string;
}

const sandbox = (spec: Record<string, unknown>, name = 'box'): Record<string, unknown> =>
  ({ apiVersion: 'agents.x-k8s.io/v1alpha1', kind: 'Sandbox', metadata: { name }, spec: { podTemplate: POD_TEMPLATE, ...spec } });
const pool = (spec: Record<string, unknown>): Record<string, unknown> =>
  ({ apiVersion: 'extensions.agents.x-k8s.io/v1beta1', kind: 'SandboxWarmPool', metadata: { name: 'pool' }, spec: { sandboxTemplateRef: { name: 't' }, ...spec } });
const claim = (spec: Record<string, unknown>): Record<string, unknown> =>
  ({ apiVersion: 'extensions.agents.x-k8s.io/v1beta1', kind: 'SandboxClaim', metadata: { name: 'c' }, spec });
const container = (fields: Record<string, unknown>): Record<string, unknown> => sandbox({ podTemplate: { spec: { containers: [{ name: 'main', ...fields }] } } });
const apiKey = (spec: Record<string, unknown>): Record<string, unknown> =>
  ({ apiVersion: 'asb.dev/v1alpha1', kind: 'ApiKey', metadata: { name: 'ab12cd34' }, spec: { team: 't', hash: 'a'.repeat(64), prefix: 'asb_ab12cd34', ...spec } });

export const INVALID_OBJECTS: readonly InvalidCase[] = [
  { what: 'negative warm pool replicas', obj: pool({ replicas: -1 }), field: 'spec.replicas' },
  { what: 'a warm pool above the pod-storm cap', obj: pool({ replicas: 1001 }), field: 'spec.replicas' },
  { what: 'an unknown update strategy', obj: pool({ updateStrategy: { type: 'Rolling' } }), field: 'spec.updateStrategy.type' },
  { what: 'a warm pool without a template', obj: { ...pool({}), spec: { replicas: 1 } }, field: 'spec.sandboxTemplateRef' },
  { what: 'a template name that is no DNS name', obj: pool({ sandboxTemplateRef: { name: 'Not_A_Name' } }), field: 'spec.sandboxTemplateRef.name' },
  { what: 'a misspelt field', obj: pool({ replica: 2 }), field: 'spec.replica' },
  { what: 'an unknown operating mode', obj: sandbox({ operatingMode: 'Paused' }), field: 'spec.operatingMode' },
  { what: 'an unknown shutdown policy', obj: sandbox({ shutdownPolicy: 'Destroy' }), field: 'spec.shutdownPolicy' },
  { what: 'a shutdown time that is not RFC 3339', obj: sandbox({ shutdownTime: 'tomorrow' }), field: 'spec.shutdownTime' },
  { what: 'sandbox replicas above 1', obj: sandbox({ replicas: 2 }), field: 'spec.replicas' },
  { what: 'a negative idle timeout', obj: sandbox({ idleTimeoutMs: -5 }), field: 'spec.idleTimeoutMs' },
  { what: 'both lifecycle forms at once', obj: sandbox({ lifecycle: { shutdownPolicy: 'Delete' }, shutdownTime: NOW }), field: 'spec.lifecycle' },
  { what: 'a sandbox without a pod template', obj: { ...sandbox({}), spec: { service: true } }, field: 'spec.podTemplate' },
  { what: 'a pod without containers', obj: sandbox({ podTemplate: { spec: { containers: [] } } }), field: 'spec.podTemplate.spec.containers' },
  { what: 'a container without a name', obj: sandbox({ podTemplate: { spec: { containers: [{ image: 'busybox' }] } } }), field: 'spec.podTemplate.spec.containers[0].name' },
  { what: 'a port out of range', obj: container({ ports: [{ containerPort: 70000 }] }), field: 'spec.podTemplate.spec.containers[0].ports[0].containerPort' },
  { what: 'an unknown protocol', obj: container({ ports: [{ containerPort: 80, protocol: 'HTTP' }] }), field: 'spec.podTemplate.spec.containers[0].ports[0].protocol' },
  { what: 'a relative mount path', obj: container({ volumeMounts: [{ name: 'home', mountPath: 'home' }] }), field: 'spec.podTemplate.spec.containers[0].volumeMounts[0].mountPath' },
  { what: 'a probe with two handlers', obj: container({ readinessProbe: { exec: { command: ['true'] }, tcpSocket: { port: 80 } } }), field: 'spec.podTemplate.spec.containers[0].readinessProbe' },
  { what: 'a command that is not a list of strings', obj: container({ command: 'sleep infinity' }), field: 'spec.podTemplate.spec.containers[0].command' },
  { what: 'a reserved label in the pod template', obj: sandbox({ podTemplate: { metadata: { labels: { 'agents.x-k8s.io/claim-uid': 'x' } }, spec: POD_TEMPLATE.spec } }), field: 'spec.podTemplate.metadata.labels["agents.x-k8s.io/claim-uid"]' },
  { what: 'a volume claim without a size', obj: sandbox({ volumeClaimTemplates: [{ metadata: { name: 'home' }, spec: { resources: { requests: {} } } }] }), field: 'spec.volumeClaimTemplates[0].spec.resources.requests.storage' },
  { what: 'an unknown access mode', obj: sandbox({ volumeClaimTemplates: [{ metadata: { name: 'home' }, spec: { accessModes: ['ReadWriteSometimes'], resources: { requests: { storage: '1Gi' } } } }] }), field: 'spec.volumeClaimTemplates[0].spec.accessModes[0]' },
  { what: 'a size that is not a quantity', obj: sandbox({ volumeClaimTemplates: [{ metadata: { name: 'home' }, spec: { resources: { requests: { storage: 'big' } } } }] }), field: 'spec.volumeClaimTemplates[0].spec.resources.requests.storage' },
  { what: 'a sandbox name that is not a DNS label', obj: sandbox({}, 'my.sandbox'), field: 'metadata.name' },
  { what: 'a claim naming neither a pool nor a template', obj: claim({ lifecycle: { shutdownPolicy: 'Delete' } }), field: 'spec.warmPoolRef' },
  { what: 'an unknown claim shutdown policy', obj: claim({ warmPoolRef: { name: 'p' }, lifecycle: { shutdownPolicy: 'Foreground' } }), field: 'spec.lifecycle.shutdownPolicy' },
  { what: 'claim env without a value', obj: claim({ warmPoolRef: { name: 'p' }, env: [{ name: 'A' }] }), field: 'spec.env[0].value' },
  { what: 'an unknown env injection policy', obj: { apiVersion: 'extensions.agents.x-k8s.io/v1beta1', kind: 'SandboxTemplate', metadata: { name: 't' }, spec: { podTemplate: POD_TEMPLATE, envVarsInjectionPolicy: 'Sometimes' } }, field: 'spec.envVarsInjectionPolicy' },
  { what: 'an API key hash that is not SHA-256 hex', obj: apiKey({ hash: 'xyz' }), field: 'spec.hash' },
  { what: 'an API key without a team', obj: { ...apiKey({}), spec: { hash: 'a'.repeat(64), prefix: 'asb_ab12cd34' } }, field: 'spec.team' },
];

const CONDITION: Condition = { type: 'Ready', status: 'True', reason: 'DependenciesReady', message: 'ok', lastTransitionTime: NOW, observedGeneration: 2 };

// `Required<...>` makes TypeScript fail here when a field is added to a status type in
// src/api/types.ts and not to these objects; the schema check then fails until the CRD has it too.
export const FULL_STATUS = {
  Sandbox: {
    phase: 'Running', conditions: [CONDITION], podIPs: ['10.0.0.7'], nodeName: 'node-1', serviceFQDN: 'x.default.svc.cluster.local',
    service: 'x', selector: 'agents.x-k8s.io/sandbox-name-hash=ab12cd34', replicas: 1, readyTime: NOW, message: 'running',
  } satisfies Required<SandboxStatus>,
  SandboxWarmPool: { replicas: 3, readyReplicas: 2, selector: `${LABEL.pool}=base`, observedGeneration: 4, conditions: [CONDITION] } satisfies Required<SandboxWarmPoolStatus>,
  SandboxClaim: { conditions: [CONDITION], sandbox: { name: 'base-x7k2p', podIPs: ['10.0.0.7'] }, launchType: 'warm' } satisfies Required<SandboxClaimStatus>,
};
