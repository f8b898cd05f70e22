// The CustomResourceDefinitions of our kinds, built from one TypeScript source:
// `node scripts/gen-crds.ts` writes them to clusters/base/crds/, and test/crds.test.ts fails when
// the YAML there, the TypeScript types (src/api/types.ts) or the validators (validate*.ts) and
// these schemas disagree.
//
// Compatible with kubernetes-sigs/agent-sandbox: the same groups, kinds, plurals, scope and short
// names, their printer columns, a /scale subresource on SandboxWarmPool (HPA, KEDA, kubectl
// scale) and on Sandbox (replicas 0/1, hibernation). Both v1alpha1 and v1beta1 are served with ONE
// schema and no conversion webhook: our validator accepts either version's field names on
// either version, and so do these schemas, so an object reads back the same in both.
import type { ResourceType } from './meta.ts';
import {
  anyObject, array, boolean, conditions, DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN, integer, map, name, object, enumOf,
  podMetadata, podTemplate, string, strings, time, volumeClaimTemplates,
} from './crd-schema.ts';
import type { JSONSchemaProps, ValidationRule } from './crd-schema.ts';
import { ApiKeyType, ASB_GROUP, RESOURCE_TYPES, SandboxClaimType, SandboxSnapshotType, SandboxTemplateType, SandboxType, SandboxWarmPoolType } from './types.ts';
import { MAX_WARM_POOL_REPLICAS, servedVersions } from './validate.ts';

export type { JSONSchemaProps } from './crd-schema.ts';

export interface PrinterColumn {
  name: string;
  type: 'string' | 'integer' | 'date' | 'boolean' | 'number';
  jsonPath: string;
  description?: string;
  /** 1: only in `kubectl get -o wide`. */
  priority?: number;
}

export interface ScaleSubresource {
  specReplicasPath: string;
  statusReplicasPath: string;
  labelSelectorPath?: string;
}

export interface CrdVersion {
  name: string;
  served: boolean;
  storage: boolean;
  schema: { openAPIV3Schema: JSONSchemaProps };
  subresources: { status: Record<string, never>; scale?: ScaleSubresource };
  additionalPrinterColumns?: PrinterColumn[];
}

export interface CustomResourceDefinition {
  apiVersion: 'apiextensions.k8s.io/v1';
  kind: 'CustomResourceDefinition';
  metadata: { name: string; labels: Record<string, string> };
  spec: {
    group: string;
    names: { kind: string; listKind: string; plural: string; singular: string; shortNames?: string[]; categories: string[] };
    scope: 'Namespaced' | 'Cluster';
    versions: CrdVersion[];
  };
}

/** `kubectl get agent-sandbox` lists every kind of ours. */
const CRD_CATEGORY = 'agent-sandbox';

/** The CRD's name: `<plural>.<group>`. */
function crdName(rt: ResourceType): string {
  return `${rt.plural}.${rt.group}`;
}

/**
 * Kinds of ours that only the federation keeps in a worker cluster's store: the hub's cluster
 * registry (src/api/hub-contract.ts ClusterType, synced to every worker) and the sync agent's record
 * of what it applied (src/worker/sync/sync-apply.ts SyncStateType). Written here rather than imported
 * so the API layer does not depend on the hub or the worker; test/crds.test.ts checks they match.
 */
const ClusterCrdType: ResourceType = { group: ASB_GROUP, version: 'v1alpha1', kind: 'Cluster', plural: 'clusters', namespaced: false };
const SyncStateCrdType: ResourceType = { group: ASB_GROUP, version: 'v1alpha1', kind: 'SyncState', plural: 'syncstates', namespaced: false };
export const FEDERATION_TYPES: readonly ResourceType[] = [ClusterCrdType, SyncStateCrdType];

const kindKey = (rt: ResourceType): string => `${rt.group}/${rt.kind}`;

export function crdFor(rt: ResourceType): CustomResourceDefinition {
  const kind = KINDS.get(kindKey(rt));
  if (kind === undefined) throw new Error(`no CRD is defined for ${rt.kind}`);
  const schema = object({
    apiVersion: string(),
    kind: string(),
    metadata: kind.metadata ?? { type: 'object' },
    spec: kind.spec,
    status: kind.status,
  }, { required: ['spec'], description: kind.description });
  return {
    apiVersion: 'apiextensions.k8s.io/v1',
    kind: 'CustomResourceDefinition',
    metadata: { name: crdName(rt), labels: { 'app.kubernetes.io/part-of': 'agent-sandbox' } },
    spec: {
      group: rt.group,
      names: {
        kind: rt.kind,
        listKind: `${rt.kind}List`,
        plural: rt.plural,
        singular: rt.kind.toLowerCase(),
        ...(kind.shortNames === undefined ? {} : { shortNames: kind.shortNames }),
        categories: [CRD_CATEGORY],
      },
      scope: rt.namespaced ? 'Namespaced' : 'Cluster',
      versions: servedVersions(rt).map((version): CrdVersion => ({
        name: version,
        served: true,
        // Our ResourceType's version is the one the store reads and writes.
        storage: version === rt.version,
        schema: { openAPIV3Schema: structuredClone(schema) },
        subresources: { status: {}, ...(kind.scale === undefined ? {} : { scale: kind.scale }) },
        ...(kind.columns === undefined ? {} : { additionalPrinterColumns: kind.columns }),
      })),
    },
  };
}

/** Every CRD: RESOURCE_TYPES, then FEDERATION_TYPES. */
export function allCrds(): CustomResourceDefinition[] {
  return [...RESOURCE_TYPES, ...FEDERATION_TYPES].map(crdFor);
}

interface KindSchema {
  description: string;
  /** Restrictions on metadata.name (the only metadata a CRD schema may restrict). */
  metadata?: JSONSchemaProps;
  spec: JSONSchemaProps;
  status: JSONSchemaProps;
  shortNames?: string[];
  columns?: PrinterColumn[];
  /** On every served version: kubectl uses the preferred one (v1beta1), older clients v1alpha1. */
  scale?: ScaleSubresource;
}

const AGE: PrinterColumn = { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp' };
const READY_CONDITION = '.status.conditions[?(@.type=="Ready")]';

// Sandbox names become pod names, hostnames and the <sandboxId> of <port>-<sandboxId>.<domain>;
// a cold-started claim names its sandbox after itself (nameProblem in validate-meta.ts).
const DNS_LABEL_NAME = object({ name: string({ maxLength: 63, pattern: DNS_LABEL_PATTERN }) });

const SANDBOX_LIFECYCLE: Record<string, JSONSchemaProps> = {
  shutdownTime: time('When the sandbox is shut down (RFC 3339). Absent: never.'),
  shutdownPolicy: enumOf(['Delete', 'Retain', 'Suspend'], 'At shutdownTime: Delete removes the object, Retain keeps it with the pod gone, Suspend (ours) suspends it with its suspensionStrategy. Default Retain.'),
};

function ref(what: string): JSONSchemaProps {
  return object({ name: string({ minLength: 1, maxLength: 253, pattern: DNS_SUBDOMAIN_PATTERN, description: `The ${what}'s name, in the same namespace.` }) }, { required: ['name'] });
}

const idleTimeoutMs = integer(0, undefined, 'Ours: hibernate after this many milliseconds without activity (0 or absent: never).');
const suspensionStrategy = enumOf(['Stop', 'Hibernate'], 'How the sandbox suspends (KEP-694): Stop keeps its files and volumes; Hibernate keeps its memory and processes too (gVisor pods; runc needs CRIU, not wired yet). Default Stop.');
const SUSPENDED_CONDITION = '.status.conditions[?(@.type=="Suspended")]';
const network = object({
  internet: boolean('false: nothing outside the sandbox is reachable except what allow names. Default true.'),
  allow: strings('CIDRs, IPs, domains (api.example.com) and wildcard domains (*.example.com) the sandbox may reach; an allow beats a deny and the private-range default.'),
  deny: strings('CIDRs, IPs and domains the sandbox may not reach.'),
}, { description: 'Ours: the egress policy. Absent: the internet yes; other sandboxes, the host, private and link-local ranges no.' });

function blueprint(): Record<string, JSONSchemaProps> {
  return {
    podTemplate: podTemplate('The pod to run: metadata (labels, annotations) and a PodSpec.'),
    volumeClaimTemplates: volumeClaimTemplates('Persistent volumes, one PVC per sandbox each; they outlive hibernation.'),
    service: boolean('Create a headless Service for the sandbox.'),
  };
}

const SANDBOX_LIFECYCLE_RULE: ValidationRule = {
  rule: '!has(self.lifecycle) || !(has(self.shutdownTime) || has(self.shutdownPolicy))',
  message: 'set either spec.lifecycle or spec.shutdownTime/spec.shutdownPolicy, not both',
  fieldPath: '.lifecycle',
  reason: 'FieldValueForbidden',
};

const sandbox: KindSchema = {
  description: 'An isolated, stateful, singleton environment: one pod, its volumes and an optional headless Service.',
  metadata: DNS_LABEL_NAME,
  shortNames: ['sandbox'],
  spec: object({
    ...blueprint(),
    replicas: integer(0, 1, 'v1alpha1: 1 runs the pod, 0 hibernates it (volumes kept).'),
    operatingMode: enumOf(['Running', 'Suspended'], 'v1beta1: Running, or Suspended (hibernated, volumes kept).'),
    lifecycle: object(SANDBOX_LIFECYCLE, { description: 'Scheduled shutdown (our form; k8s-sigs writes the same fields directly in spec).' }),
    ...SANDBOX_LIFECYCLE,
    idleTimeoutMs,
    network,
    snapshotRef: { ...ref('SandboxSnapshot'), description: 'Ours: start from this snapshot\'s files, and its memory and processes when it kept them (read when the pod is first made).' },
    suspensionStrategy,
  }, { required: ['podTemplate'], rules: [SANDBOX_LIFECYCLE_RULE] }),
  status: object({
    phase: enumOf(['Pending', 'Running', 'Hibernating', 'Hibernated', 'Waking', 'Failed', 'Expired', 'Terminating']),
    conditions: conditions(),
    podIPs: strings(),
    nodeName: string(),
    serviceFQDN: string(),
    service: string(),
    selector: string(),
    replicas: integer(0),
    readyTime: time('When the pod last became ready.'),
    message: string(),
  }),
  columns: [
    { name: 'Phase', type: 'string', jsonPath: '.status.phase' },
    { name: 'Ready', type: 'string', jsonPath: `${READY_CONDITION}.status` },
    { name: 'Reason', type: 'string', jsonPath: `${READY_CONDITION}.reason` },
    AGE,
    { name: 'Pod IP', type: 'string', jsonPath: '.status.podIPs[0]', priority: 1 },
    { name: 'Strategy', type: 'string', jsonPath: '.spec.suspensionStrategy', priority: 1 },
    // MemoryKept, FilesKept, MemoryNotKept (files kept, it says why), CheckpointFailed (still running).
    { name: 'Suspended', type: 'string', jsonPath: `${SUSPENDED_CONDITION}.reason`, priority: 1 },
  ],
  // k8s-sigs v1alpha1 scales a Sandbox between 0 and 1 (v1beta1 replaced replicas with
  // operatingMode). We keep replicas on both versions, and kubectl talks v1beta1 (the preferred
  // version), so both get /scale: `kubectl scale sandbox/x --replicas=0` hibernates.
  scale: { specReplicasPath: '.spec.replicas', statusReplicasPath: '.status.replicas', labelSelectorPath: '.status.selector' },
};

const POLICY_VALUES = ['Disallowed', 'Allowed', 'Overrides'];

const template: KindSchema = {
  description: 'A reusable sandbox blueprint that warm pools and claims refer to.',
  shortNames: ['sandboxtemplate'],
  spec: object({
    ...blueprint(),
    networkPolicy: object({ ingress: array(anyObject()), egress: array(anyObject()) }, { description: 'NetworkPolicy ingress and egress rules for sandboxes of this template.' }),
    networkPolicyManagement: enumOf(['Managed', 'Unmanaged']),
    envVarsInjectionPolicy: enumOf(POLICY_VALUES, 'Whether claims may add or override env.'),
    volumeClaimTemplatesPolicy: enumOf(POLICY_VALUES, 'Whether claims may add or override volumeClaimTemplates.'),
    idleTimeoutMs,
    network,
    suspensionStrategy,
  }, { required: ['podTemplate'] }),
  status: anyObject(),
};

const warmPool: KindSchema = {
  description: 'Keeps replicas sandboxes of a template running and unclaimed, so a claim binds in milliseconds.',
  shortNames: ['swp'],
  spec: object({
    replicas: { ...integer(0, MAX_WARM_POOL_REPLICAS, 'Warm members to keep. At most 1000: each is a running pod (kubernetes-sigs/agent-sandbox#251).'), default: 1 },
    sandboxTemplateRef: ref('SandboxTemplate'),
    updateStrategy: {
      ...object({ type: { ...enumOf(['Recreate', 'OnReplenish'], 'Recreate replaces members when the template changes; OnReplenish only new ones.'), default: 'OnReplenish' } }),
      default: {},
    },
  }, { required: ['sandboxTemplateRef'] }),
  status: object({
    replicas: integer(0),
    readyReplicas: integer(0),
    selector: string(),
    observedGeneration: integer(0),
    conditions: conditions(),
  }),
  columns: [
    { name: 'Ready', type: 'integer', jsonPath: '.status.readyReplicas' },
    { name: 'Desired', type: 'integer', jsonPath: '.spec.replicas' },
    { name: 'Template', type: 'string', jsonPath: '.spec.sandboxTemplateRef.name' },
    AGE,
  ],
  // kubectl scale writes specReplicasPath. statusReplicasPath is the members that exist, as for a
  // Deployment (.status.replicas); HPA reads it as the current size and finds members through
  // the selector.
  scale: { specReplicasPath: '.spec.replicas', statusReplicasPath: '.status.replicas', labelSelectorPath: '.status.selector' },
};

const CLAIM_REF_RULE: ValidationRule = {
  rule: 'has(self.warmPoolRef) || has(self.sandboxTemplateRef)',
  message: 'set warmPoolRef.name (v1beta1) or sandboxTemplateRef.name (v1alpha1)',
  fieldPath: '.warmPoolRef',
  reason: 'FieldValueRequired',
};

const claim: KindSchema = {
  description: 'A request for a sandbox, bound to a warm member of a pool (or cold-started) by the controller.',
  metadata: DNS_LABEL_NAME,
  shortNames: ['sandboxclaim'],
  spec: object({
    warmPoolRef: ref('SandboxWarmPool'),
    sandboxTemplateRef: ref('SandboxTemplate'),
    warmpool: string({ maxLength: 253, pattern: DNS_SUBDOMAIN_PATTERN, description: 'v1alpha1: none, default or a warm pool name.' }),
    lifecycle: object({
      shutdownTime: time('When the claim and its sandbox are shut down (RFC 3339). Absent: never.'),
      // As in k8s-sigs (and applyDefaults): only a claim that has a lifecycle gets the default.
      shutdownPolicy: { ...enumOf(['Delete', 'DeleteForeground', 'Retain'], 'DeleteForeground: the claim goes after its sandbox.'), default: 'Retain' },
      ttlSecondsAfterFinished: integer(0),
    }),
    additionalPodMetadata: podMetadata('Labels and annotations added to the bound sandbox\'s pod.'),
    env: array(object({ name: name(), value: string(), containerName: string() }, { required: ['name', 'value'] })),
    volumeClaimTemplates: volumeClaimTemplates('Volumes added to the sandbox (forces a cold start).'),
  }, { rules: [CLAIM_REF_RULE] }),
  status: object({
    conditions: conditions(),
    sandbox: object({ name: name(), podIPs: strings() }, { required: ['name'] }),
    launchType: enumOf(['warm', 'cold']),
  }),
  columns: [
    { name: 'Ready', type: 'string', jsonPath: `${READY_CONDITION}.status` },
    { name: 'Sandbox', type: 'string', jsonPath: '.status.sandbox.name' },
    { name: 'Reason', type: 'string', jsonPath: `${READY_CONDITION}.reason` },
    AGE,
  ],
};

const snapshot: KindSchema = {
  description: 'Ours: a sandbox\'s files, and with mode Full its memory and processes, kept on its worker; sandboxes start from it with spec.snapshotRef. It outlives the sandbox.',
  shortNames: ['sbsnap'],
  spec: object({
    sandboxRef: ref('Sandbox'),
    mode: enumOf(['Full', 'Filesystem'], 'Full (default): memory, processes and files (gVisor sandboxes); Filesystem: files only.'),
  }, { required: ['sandboxRef'] }),
  status: object({
    phase: enumOf(['Pending', 'Ready', 'Failed']),
    conditions: conditions(),
    takenAt: time('When it was taken.'),
    memory: boolean('Whether memory and processes were kept.'),
    bytes: integer(0, undefined, 'Bytes it takes on the worker.'),
    memoryBytes: integer(0),
    source: anyObject(),
  }),
  columns: [
    { name: 'Sandbox', type: 'string', jsonPath: '.spec.sandboxRef.name' },
    { name: 'Phase', type: 'string', jsonPath: '.status.phase' },
    { name: 'Memory', type: 'boolean', jsonPath: '.status.memory' },
    { name: 'Bytes', type: 'integer', jsonPath: '.status.bytes' },
    { name: 'Reason', type: 'string', jsonPath: `${READY_CONDITION}.reason` },
    AGE,
  ],
};

const apiKey: KindSchema = {
  description: 'An API key: only its SHA-256 is stored. Named after the key\'s 8-character prefix.',
  spec: object({
    team: string({ minLength: 1, maxLength: 63, pattern: '^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$', description: 'The team (tenant) whose sandboxes the key sees.' }),
    hash: string({ pattern: '^[0-9a-f]{64}$', description: 'Hex SHA-256 of the whole key.' }),
    prefix: name('The public prefix shown in listings, e.g. asb_ab12cd34.'),
    admin: boolean(),
    revoked: boolean(),
    description: string(),
  }, { required: ['team', 'hash', 'prefix'] }),
  status: anyObject(),
  columns: [
    { name: 'Team', type: 'string', jsonPath: '.spec.team' },
    { name: 'Prefix', type: 'string', jsonPath: '.spec.prefix' },
    { name: 'Admin', type: 'boolean', jsonPath: '.spec.admin' },
    { name: 'Revoked', type: 'boolean', jsonPath: '.spec.revoked' },
    AGE,
  ],
};

const cluster: KindSchema = {
  description: 'A worker cluster of the federation, as the hub registers it; the hub syncs it to every worker without its credential hash.',
  spec: object({
    region: name(),
    ingressAddress: name('host:port of the cluster\'s Envoy ingress listener, where other edges send its traffic.'),
    apiUrl: string({ description: 'Base URL of its worker API, for the hub\'s own calls.' }),
    labels: map(string()),
    drain: boolean('Drained clusters keep their sandboxes but get no new ones.'),
    tag: string({ pattern: '^[a-z0-9]{4}$', description: 'The prefix of this cluster\'s sandbox ids.' }),
    credentialHash: string({ pattern: '^[0-9a-f]{64}$', description: 'Hex SHA-256 of the sync credential (hub only).' }),
  }, { required: ['region', 'ingressAddress', 'tag'] }),
  status: object({
    connected: boolean(),
    appliedVersion: integer(0),
    lag: integer(),
    lastSeen: time(),
    warm: map(integer(0)),
    healthy: boolean(),
  }),
  columns: [
    { name: 'Region', type: 'string', jsonPath: '.spec.region' },
    { name: 'Tag', type: 'string', jsonPath: '.spec.tag' },
    { name: 'Ingress', type: 'string', jsonPath: '.spec.ingressAddress' },
    AGE,
  ],
};

const syncState: KindSchema = {
  description: 'The worker\'s record of its sync with the hub: the last hub version it applied, and whether the sync agent\'s link to the hub is up.',
  spec: object({ appliedVersion: integer(0) }, { required: ['appliedVersion'] }),
  status: object({ hubConnected: boolean(), lastTransitionTime: time() }),
};

const KINDS: ReadonlyMap<string, KindSchema> = new Map(([
  [SandboxType, sandbox],
  [SandboxTemplateType, template],
  [SandboxWarmPoolType, warmPool],
  [SandboxClaimType, claim],
  [SandboxSnapshotType, snapshot],
  [ApiKeyType, apiKey],
  [ClusterCrdType, cluster],
  [SyncStateCrdType, syncState],
] as const).map(([rt, schema]) => [kindKey(rt), schema]));
