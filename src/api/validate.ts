// Validation and defaulting of user-written objects, the one gate every object passes on its
// way into the store (REST API, manifests, hub sync). It lists every problem at once, each with
// a field path such as `spec.podTemplate.spec.containers[0].image`, and throws a single
// Invalid AsbError. The object is stored as written: both v1alpha1 and v1beta1 are accepted.
import { invalid, isAsbError } from '../errors.ts';
import { parseEgressPolicy } from '../network/egress-policy.ts';
import { templateNetworkPolicy } from './sandbox-network.ts';
import type { KubeObject, ResourceType } from './meta.ts';
import { dnsSubdomainProblem, labelValueProblem } from './names.ts';
import {
  isFields, join, onlyKnown, optArray, optBoolean, optEnum, optInt, optObject, optString, report, reqObject, reqString, typeOf,
} from './shape.ts';
import type { Fields, Problems } from './shape.ts';
import {
  ApiKeyType, ASB_GROUP, RESOURCE_TYPES, SandboxClaimType, SandboxSnapshotType, SandboxTemplateType, SandboxType, SandboxWarmPoolType, SUSPENSION_STRATEGIES,
} from './types.ts';
import type { SandboxClaimSpec, SandboxSpec, SandboxWarmPoolSpec } from './types.ts';
import { checkTime, validateMetadata } from './validate-meta.ts';
import { validatePodMetadata, validatePodTemplate, validateVolumeClaimTemplates } from './validate-pod.ts';

/**
 * The most members one warm pool may ask for. k8s-sigs sets no maximum, and
 * kubernetes-sigs/agent-sandbox#251 shows anyone allowed to write a SandboxWarmPool can then start
 * an unbounded pod storm; 1000 is above every published pool size short of their 1050-member
 * scalability test.
 */
export const MAX_WARM_POOL_REPLICAS = 1000;

/** k8s-sigs serves its kinds as v1alpha1 (deprecated) and v1beta1; our ApiKey only as v1alpha1. The CRDs serve the same (src/api/crd.ts). */
export function servedVersions(rt: ResourceType): readonly string[] {
  return rt.group === ASB_GROUP ? ['v1alpha1'] : ['v1alpha1', 'v1beta1'];
}

export function resourceTypeFor(apiVersion: string, kind: string): ResourceType | undefined {
  return RESOURCE_TYPES.find((rt) => rt.kind === kind && servedVersions(rt).some((v) => `${rt.group}/${v}` === apiVersion));
}

const TOP_FIELDS = ['apiVersion', 'kind', 'metadata', 'spec', 'status'] as const;

/** Checks `raw` and returns it typed; throws one Invalid AsbError listing every problem. */
export function validateObject(raw: unknown, path = ''): KubeObject {
  const problems: Problems = [];
  if (!isFields(raw)) {
    report(problems, path === '' ? '(object)' : path, `must be an object, got ${typeOf(raw)}`);
    throw invalid('object', '', problems);
  }
  const apiVersion = reqString(problems, join(path, 'apiVersion'), raw.apiVersion);
  const kind = reqString(problems, join(path, 'kind'), raw.kind);
  const rt = apiVersion === undefined || kind === undefined ? undefined : resourceTypeFor(apiVersion, kind);
  if (apiVersion !== undefined && kind !== undefined && rt === undefined) reportUnknownKind(problems, path, apiVersion, kind);
  onlyKnown(problems, path, raw, TOP_FIELDS);
  const meta = validateMetadata(problems, join(path, 'metadata'), raw.metadata, rt);
  optObject(problems, join(path, 'status'), raw.status);
  if (rt !== undefined) {
    const spec = reqObject(problems, join(path, 'spec'), raw.spec);
    if (spec !== undefined) SPEC_CHECKS.get(rt)?.(problems, join(path, 'spec'), spec);
  }
  if (problems.length > 0) throw invalid(kind ?? 'object', meta.name ?? meta.generateName ?? '', problems);
  return raw as unknown as KubeObject;
}

function reportUnknownKind(problems: Problems, path: string, apiVersion: string, kind: string): void {
  const rt = RESOURCE_TYPES.find((t) => t.kind === kind);
  if (rt !== undefined) {
    const served = servedVersions(rt).map((v) => `${rt.group}/${v}`).join(' or ');
    report(problems, join(path, 'apiVersion'), `${kind} is served as ${served}, got ${JSON.stringify(apiVersion)}`);
  } else {
    const known = RESOURCE_TYPES.map((t) => t.kind).join(', ');
    report(problems, join(path, 'kind'), `unknown kind ${JSON.stringify(kind)}; known kinds: ${known}`);
  }
}

type SpecCheck = (problems: Problems, path: string, spec: Fields) => void;

const SANDBOX_POLICIES = ['Delete', 'Retain', 'Suspend'] as const;
const CLAIM_POLICIES = ['Delete', 'DeleteForeground', 'Retain'] as const;

function checkSandboxSpec(problems: Problems, path: string, spec: Fields): void {
  onlyKnown(problems, path, spec, [
    'podTemplate', 'volumeClaimTemplates', 'service', 'replicas', 'operatingMode', 'lifecycle', 'shutdownTime', 'shutdownPolicy', 'idleTimeoutMs', 'network',
    'suspensionStrategy', 'snapshotRef',
  ]);
  checkSuspensionStrategy(problems, join(path, 'suspensionStrategy'), spec.suspensionStrategy);
  checkNetwork(problems, join(path, 'network'), spec.network);
  checkRef(problems, join(path, 'snapshotRef'), spec.snapshotRef, false);
  checkBlueprint(problems, path, spec);
  // v1alpha1 `replicas` and v1beta1 `operatingMode` are both accepted on either version: the
  // operator writes whichever the object already uses when it hibernates or wakes a sandbox.
  if (spec.replicas !== undefined && (spec.replicas !== 0 && spec.replicas !== 1)) {
    report(problems, join(path, 'replicas'), `must be 0 (suspended) or 1 (running), got ${JSON.stringify(spec.replicas)}`);
  }
  optEnum(problems, join(path, 'operatingMode'), spec.operatingMode, ['Running', 'Suspended']);
  // k8s-sigs inlines the lifecycle fields in spec; our own form nests them under `lifecycle`.
  checkTime(problems, join(path, 'shutdownTime'), spec.shutdownTime);
  optEnum(problems, join(path, 'shutdownPolicy'), spec.shutdownPolicy, SANDBOX_POLICIES);
  const lifecycle = checkLifecycle(problems, join(path, 'lifecycle'), spec.lifecycle, SANDBOX_POLICIES, false);
  if (lifecycle !== undefined && (spec.shutdownTime !== undefined || spec.shutdownPolicy !== undefined)) {
    report(problems, join(path, 'lifecycle'), 'set either spec.lifecycle or spec.shutdownTime/spec.shutdownPolicy, not both');
  }
  optInt(problems, join(path, 'idleTimeoutMs'), spec.idleTimeoutMs, { min: 0 });
}

function checkTemplateSpec(problems: Problems, path: string, spec: Fields): void {
  onlyKnown(problems, path, spec, [
    'podTemplate', 'volumeClaimTemplates', 'service', 'networkPolicy', 'networkPolicyManagement',
    'envVarsInjectionPolicy', 'volumeClaimTemplatesPolicy', 'idleTimeoutMs', 'network', 'suspensionStrategy',
  ]);
  checkSuspensionStrategy(problems, join(path, 'suspensionStrategy'), spec.suspensionStrategy);
  checkNetwork(problems, join(path, 'network'), spec.network);
  checkBlueprint(problems, path, spec);
  const policy = optObject(problems, join(path, 'networkPolicy'), spec.networkPolicy);
  if (policy !== undefined) {
    onlyKnown(problems, join(path, 'networkPolicy'), policy, ['ingress', 'egress']);
    optArray(problems, join(join(path, 'networkPolicy'), 'ingress'), policy.ingress);
    optArray(problems, join(join(path, 'networkPolicy'), 'egress'), policy.egress);
    // Egress rules we cannot enforce are refused, never ignored.
    collect(problems, () => templateNetworkPolicy({ networkPolicy: policy, ...(spec.networkPolicyManagement === 'Unmanaged' ? { networkPolicyManagement: 'Unmanaged' } : {}) }, join(path, 'networkPolicy')));
  }
  optEnum(problems, join(path, 'networkPolicyManagement'), spec.networkPolicyManagement, ['Managed', 'Unmanaged']);
  optEnum(problems, join(path, 'envVarsInjectionPolicy'), spec.envVarsInjectionPolicy, ['Disallowed', 'Allowed', 'Overrides']);
  optEnum(problems, join(path, 'volumeClaimTemplatesPolicy'), spec.volumeClaimTemplatesPolicy, ['Disallowed', 'Allowed', 'Overrides']);
  optInt(problems, join(path, 'idleTimeoutMs'), spec.idleTimeoutMs, { min: 0 });
}

/** KEP-694 proposes Stop, Freeze and Hibernate; Freeze is refused by name, never taken as one of the others. */
function checkSuspensionStrategy(problems: Problems, path: string, value: unknown): void {
  if (value === undefined || (typeof value === 'string' && (SUSPENSION_STRATEGIES as readonly string[]).includes(value))) return;
  const why = value === 'Freeze' ? ' (Freeze, which KEP-694 proposes, is not offered: a frozen sandbox holds its memory and its slot, so use Hibernate)' : '';
  report(problems, path, `must be one of ${SUSPENSION_STRATEGIES.join(', ')}, got ${JSON.stringify(value)}${why}`);
}

/** spec.network: an egress policy (src/network/egress-policy.ts). */
function checkNetwork(problems: Problems, path: string, value: unknown): void {
  if (value !== undefined) collect(problems, () => parseEgressPolicy(value, path));
}

/** Runs a parser that throws AsbError Invalid with fields, adding its fields to problems. */
function collect(problems: Problems, parse: () => unknown): void {
  try {
    parse();
  } catch (err) {
    if (!isAsbError(err, 'Invalid')) throw err;
    for (const f of err.fields) report(problems, f.field, f.message);
  }
}

/** podTemplate + volumeClaimTemplates + service, shared by Sandbox and SandboxTemplate. */
function checkBlueprint(problems: Problems, path: string, spec: Fields): void {
  const claimVolumes = validateVolumeClaimTemplates(problems, join(path, 'volumeClaimTemplates'), spec.volumeClaimTemplates);
  validatePodTemplate(problems, join(path, 'podTemplate'), spec.podTemplate, claimVolumes);
  optBoolean(problems, join(path, 'service'), spec.service);
}

function checkWarmPoolSpec(problems: Problems, path: string, spec: Fields): void {
  onlyKnown(problems, path, spec, ['replicas', 'sandboxTemplateRef', 'updateStrategy']);
  const replicas = optInt(problems, join(path, 'replicas'), spec.replicas, { min: 0 });
  if (replicas !== undefined && replicas > MAX_WARM_POOL_REPLICAS) {
    report(problems, join(path, 'replicas'),
      `must be at most ${MAX_WARM_POOL_REPLICAS}, got ${replicas}: every member is a running pod, so a huge pool is a pod storm (kubernetes-sigs/agent-sandbox#251)`);
  }
  checkRef(problems, join(path, 'sandboxTemplateRef'), spec.sandboxTemplateRef, true);
  const strategy = optObject(problems, join(path, 'updateStrategy'), spec.updateStrategy);
  if (strategy !== undefined) {
    onlyKnown(problems, join(path, 'updateStrategy'), strategy, ['type']);
    optEnum(problems, join(join(path, 'updateStrategy'), 'type'), strategy.type, ['Recreate', 'OnReplenish']);
  }
}

function checkClaimSpec(problems: Problems, path: string, spec: Fields): void {
  onlyKnown(problems, path, spec, ['warmPoolRef', 'sandboxTemplateRef', 'warmpool', 'lifecycle', 'additionalPodMetadata', 'env', 'volumeClaimTemplates']);
  // v1beta1 names a pool; v1alpha1 names a template (and optionally a pool policy).
  if (spec.warmPoolRef === undefined && spec.sandboxTemplateRef === undefined) {
    report(problems, join(path, 'warmPoolRef'), 'is required: set warmPoolRef.name (v1beta1) or sandboxTemplateRef.name (v1alpha1)');
  }
  checkRef(problems, join(path, 'warmPoolRef'), spec.warmPoolRef, false);
  checkRef(problems, join(path, 'sandboxTemplateRef'), spec.sandboxTemplateRef, false);
  const warmpool = optString(problems, join(path, 'warmpool'), spec.warmpool);
  if (warmpool !== undefined && warmpool !== 'none' && warmpool !== 'default') {
    const problem = dnsSubdomainProblem(warmpool);
    if (problem !== undefined) report(problems, join(path, 'warmpool'), `must be "none", "default" or a warm pool name; ${problem}`);
  }
  checkLifecycle(problems, join(path, 'lifecycle'), spec.lifecycle, CLAIM_POLICIES, true);
  validatePodMetadata(problems, join(path, 'additionalPodMetadata'), spec.additionalPodMetadata);
  (optArray(problems, join(path, 'env'), spec.env) ?? []).forEach((item, i) => {
    const at = join(join(path, 'env'), i);
    const env = optObject(problems, at, item);
    if (env === undefined) return;
    onlyKnown(problems, at, env, ['name', 'value', 'containerName']);
    reqString(problems, join(at, 'name'), env.name);
    if (env.value === undefined) report(problems, join(at, 'value'), 'is required');
    optString(problems, join(at, 'value'), env.value);
    optString(problems, join(at, 'containerName'), env.containerName);
  });
  validateVolumeClaimTemplates(problems, join(path, 'volumeClaimTemplates'), spec.volumeClaimTemplates);
}

function checkApiKeySpec(problems: Problems, path: string, spec: Fields): void {
  onlyKnown(problems, path, spec, ['team', 'hash', 'prefix', 'admin', 'revoked', 'description']);
  // The team is written into the asb.dev/owner label of the sandboxes it claims.
  const team = reqString(problems, join(path, 'team'), spec.team);
  const teamProblem = team === undefined ? undefined : labelValueProblem(team);
  if (teamProblem !== undefined) report(problems, join(path, 'team'), teamProblem.replace(/^value /, ''));
  const hash = reqString(problems, join(path, 'hash'), spec.hash);
  if (hash !== undefined && !/^[0-9a-f]{64}$/.test(hash)) report(problems, join(path, 'hash'), 'must be a hex SHA-256 digest: 64 lower-case hex characters');
  reqString(problems, join(path, 'prefix'), spec.prefix);
  optBoolean(problems, join(path, 'admin'), spec.admin);
  optBoolean(problems, join(path, 'revoked'), spec.revoked);
  optString(problems, join(path, 'description'), spec.description);
}

function checkRef(problems: Problems, path: string, value: unknown, required: boolean): void {
  const ref = required ? reqObject(problems, path, value) : optObject(problems, path, value);
  if (ref === undefined) return;
  onlyKnown(problems, path, ref, ['name']);
  const name = reqString(problems, join(path, 'name'), ref.name);
  const problem = name === undefined ? undefined : dnsSubdomainProblem(name);
  if (problem !== undefined) report(problems, join(path, 'name'), problem);
}

function checkLifecycle(problems: Problems, path: string, value: unknown, policies: readonly string[], claim: boolean): Fields | undefined {
  const lifecycle = optObject(problems, path, value);
  if (lifecycle === undefined) return undefined;
  onlyKnown(problems, path, lifecycle, claim ? ['shutdownTime', 'shutdownPolicy', 'ttlSecondsAfterFinished'] : ['shutdownTime', 'shutdownPolicy']);
  checkTime(problems, join(path, 'shutdownTime'), lifecycle.shutdownTime);
  optEnum(problems, join(path, 'shutdownPolicy'), lifecycle.shutdownPolicy, policies);
  if (claim) optInt(problems, join(path, 'ttlSecondsAfterFinished'), lifecycle.ttlSecondsAfterFinished, { min: 0 });
  return lifecycle;
}

const SPEC_CHECKS: ReadonlyMap<ResourceType, SpecCheck> = new Map<ResourceType, SpecCheck>([
  [SandboxType, checkSandboxSpec],
  [SandboxTemplateType, checkTemplateSpec],
  [SandboxWarmPoolType, checkWarmPoolSpec],
  [SandboxClaimType, checkClaimSpec],
  [SandboxSnapshotType, checkSnapshotSpec],
  [ApiKeyType, checkApiKeySpec],
]);

function checkSnapshotSpec(problems: Problems, path: string, spec: Fields): void {
  onlyKnown(problems, path, spec, ['sandboxRef', 'mode']);
  checkRef(problems, join(path, 'sandboxRef'), spec.sandboxRef, true);
  optEnum(problems, join(path, 'mode'), spec.mode, ['Full', 'Filesystem']);
}

/**
 * A copy of a valid object with the defaults k8s-sigs' CRDs apply: shutdownPolicy Retain,
 * warm pool replicas 1 and updateStrategy OnReplenish, and namespace "default".
 */
export function applyDefaults<T extends KubeObject>(obj: T): T {
  const out = structuredClone(obj);
  const rt = resourceTypeFor(out.apiVersion, out.kind);
  if (rt?.namespaced === true && (out.metadata.namespace ?? '') === '') out.metadata.namespace = 'default';
  if (rt === SandboxType) defaultSandbox(out.spec as SandboxSpec);
  if (rt === SandboxWarmPoolType) {
    const spec = out.spec as Partial<SandboxWarmPoolSpec>;
    spec.replicas ??= 1;
    spec.updateStrategy = { ...spec.updateStrategy, type: spec.updateStrategy?.type ?? 'OnReplenish' };
  }
  if (rt === SandboxClaimType) {
    // As in the CRD: the default lives inside lifecycle, so only a claim that has one gets it.
    const spec = out.spec as SandboxClaimSpec;
    if (spec.lifecycle !== undefined) spec.lifecycle.shutdownPolicy ??= 'Retain';
  }
  return out;
}

// Default the policy where the user wrote the lifecycle: inline (k8s-sigs YAML) or nested (ours,
// and where a sandbox without any lifecycle gets it).
function defaultSandbox(spec: SandboxSpec): void {
  if (spec.shutdownTime !== undefined || spec.shutdownPolicy !== undefined) spec.shutdownPolicy ??= 'Retain';
  else spec.lifecycle = { ...spec.lifecycle, shutdownPolicy: spec.lifecycle?.shutdownPolicy ?? 'Retain' };
}
