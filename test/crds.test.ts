// The CRDs under clusters/base/crds/ and the TypeScript side agree: the committed YAML is what
// src/api/crd.ts generates, every object our validator accepts (the seeds, examples, built-ins,
// what the operator writes) passes the schemas, and objects it refuses for a reason a schema can
// say are refused by the schemas too, at the same field.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { test } from 'node:test';
import { builtinObjects, baseTemplate } from '../src/api/builtin.ts';
import { allCrds, crdFor, FEDERATION_TYPES, type JSONSchemaProps } from '../src/api/crd.ts';
import { parseManifests } from '../src/api/manifest.ts';
import type { KubeObject } from '../src/api/meta.ts';
import {
  ApiKeyType, LABEL, RESOURCE_TYPES, SandboxClaimType, SandboxType, SandboxWarmPoolType,
  type ApiKeySpec, type SandboxClaimSpec, type SandboxSnapshotSpec, type SandboxSpec,
  type SandboxTemplateSpec, type SandboxWarmPoolSpec,
} from '../src/api/types.ts';
import { applyDefaults, validateObject } from '../src/api/validate.ts';
import { isAsbError } from '../src/errors.ts';
import { ClusterType, type ClusterSpec, type ClusterStatus } from '../src/api/hub-contract.ts';
import { sandboxFromTemplate } from '../src/operator/blueprint.ts';
import { SyncStateType, type SyncState } from '../src/worker/sync/sync-apply.ts';
import { CRD_DIR, renderCrdFiles } from '../scripts/gen-crds.ts';
import { CrdSchemas } from './support/crd-ajv.ts';
import { FULL_STATUS, INVALID_OBJECTS, NOW, POD_TEMPLATE } from './support/crd-cases.ts';

const root = new URL('../', import.meta.url);
const schemas = new CrdSchemas();

function yamlFiles(dir: string): { name: string; text: string }[] {
  const url = new URL(`${dir}/`, root);
  return readdirSync(url).filter((f) => f.endsWith('.yaml')).sort().map((name) => ({ name: `${dir}/${name}`, text: readFileSync(new URL(name, url), 'utf8') }));
}

test('clusters/base/crds holds exactly what scripts/gen-crds.ts generates', () => {
  const want = renderCrdFiles();
  const dir = new URL(`${CRD_DIR}/`, root);
  const have = readdirSync(dir).filter((f) => f.endsWith('.yaml')).sort();
  assert.deepEqual(have, [...want.keys()].sort(), `${CRD_DIR}/ has other files than the generator writes: run node scripts/gen-crds.ts`);
  for (const [name, text] of want) {
    assert.ok(readFileSync(new URL(name, dir), 'utf8') === text, `${CRD_DIR}/${name} differs from src/api/crd.ts: run node scripts/gen-crds.ts`);
  }
});

test('each kind\'s CRD is named, scoped and versioned as kubernetes-sigs/agent-sandbox serves it', () => {
  const crds = allCrds();
  assert.deepEqual(crds.map((c) => c.metadata.name), [
    'sandboxes.agents.x-k8s.io', 'sandboxtemplates.extensions.agents.x-k8s.io', 'sandboxclaims.extensions.agents.x-k8s.io',
    'sandboxwarmpools.extensions.agents.x-k8s.io', 'sandboxsnapshots.extensions.agents.x-k8s.io', 'apikeys.asb.dev', 'clusters.asb.dev', 'syncstates.asb.dev',
  ]);
  // The federation's kinds as the hub and the sync agent define them.
  assert.deepEqual(FEDERATION_TYPES, [ClusterType, SyncStateType]);
  for (const rt of [...RESOURCE_TYPES, ...FEDERATION_TYPES]) {
    const crd = crdFor(rt);
    assert.equal(crd.spec.group, rt.group);
    assert.equal(crd.spec.names.kind, rt.kind);
    assert.equal(crd.spec.names.plural, rt.plural);
    assert.equal(crd.spec.scope, rt.namespaced ? 'Namespaced' : 'Cluster');
    // One storage version, the one the store uses; every version has a status subresource.
    assert.deepEqual(crd.spec.versions.filter((v) => v.storage).map((v) => v.name), [rt.version], rt.kind);
    for (const v of crd.spec.versions) assert.deepEqual(v.subresources.status, {}, `${rt.kind} ${v.name}`);
  }
  const versions = (rt: typeof SandboxType): string[] => crdFor(rt).spec.versions.map((v) => v.name);
  assert.deepEqual(versions(SandboxType), ['v1alpha1', 'v1beta1']);
  assert.deepEqual(versions(SandboxClaimType), ['v1alpha1', 'v1beta1']);
  assert.deepEqual(versions(ApiKeyType), ['v1alpha1']);
  assert.deepEqual(crdFor(SandboxWarmPoolType).spec.names.shortNames, ['swp']);
});

test('warm pools and sandboxes (replicas 0 or 1) scale through /scale on every version kubectl may use', () => {
  for (const rt of [SandboxWarmPoolType, SandboxType]) {
    for (const v of crdFor(rt).spec.versions) {
      assert.deepEqual(v.subresources.scale, { specReplicasPath: '.spec.replicas', statusReplicasPath: '.status.replicas', labelSelectorPath: '.status.selector' }, `${rt.kind} ${v.name}`);
    }
  }
  assert.equal(crdFor(SandboxClaimType).spec.versions[0]?.subresources.scale, undefined);
  // kubectl get columns users see, k8s-sigs' where they have them.
  const columns = (rt: typeof SandboxType): string[] => crdFor(rt).spec.versions[0]?.additionalPrinterColumns?.filter((c) => c.priority === undefined).map((c) => c.name) ?? [];
  assert.deepEqual(columns(SandboxType), ['Phase', 'Ready', 'Reason', 'Age']);
  assert.deepEqual(columns(SandboxWarmPoolType), ['Ready', 'Desired', 'Template', 'Age']);
  assert.deepEqual(columns(SandboxClaimType), ['Ready', 'Sandbox', 'Reason', 'Age']);
});

test('the schemas are structural, as the kube-apiserver requires', () => {
  const problems: string[] = [];
  const visit = (node: JSONSchemaProps, path: string): void => {
    const open = node['x-kubernetes-preserve-unknown-fields'] === true || node['x-kubernetes-int-or-string'] === true;
    if (node.type === undefined && !open) problems.push(`${path}: no type`);
    if (node.properties !== undefined && node.additionalProperties !== undefined) problems.push(`${path}: both properties and additionalProperties`);
    if (node.type === 'array' && node.items === undefined) problems.push(`${path}: array without items`);
    for (const req of node.required ?? []) if (node.properties?.[req] === undefined && node.additionalProperties === undefined) problems.push(`${path}: requires unknown ${req}`);
    if (node.default !== undefined && node.type === 'object' && typeof node.default !== 'object') problems.push(`${path}: default of the wrong type`);
    for (const [key, child] of Object.entries(node.properties ?? {})) visit(child, `${path}.${key}`);
    if (node.items !== undefined) visit(node.items, `${path}[]`);
    if (node.additionalProperties !== undefined) visit(node.additionalProperties, `${path}{}`);
  };
  for (const crd of allCrds()) for (const v of crd.spec.versions) visit(v.schema.openAPIV3Schema, `${crd.metadata.name}/${v.name}`);
  assert.deepEqual(problems, []);
  // metadata may only narrow name and generateName.
  for (const crd of allCrds()) {
    const meta = crd.spec.versions[0]?.schema.openAPIV3Schema.properties?.metadata;
    assert.deepEqual(Object.keys(meta?.properties ?? {}).filter((k) => k !== 'name' && k !== 'generateName'), [], crd.metadata.name);
  }
});

test('every seed, quick-start fixture, example and built-in object passes its CRD schema unchanged', () => {
  const sources = [...yamlFiles('test/fixtures/seeds'), ...yamlFiles('test/fixtures/quickstart'), ...yamlFiles('examples')];
  assert.ok(sources.length >= 7, 'the seeds and examples were found');
  const objects: [string, KubeObject][] = [];
  for (const { name, text } of sources) for (const obj of parseManifests(text, name)) objects.push([name, obj]);
  for (const obj of builtinObjects()) objects.push(['src/api/builtin.ts', obj]);
  const kinds = new Set(objects.map(([, o]) => `${o.apiVersion} ${o.kind}`));
  // Both versions of the k8s-sigs kinds are among them.
  assert.ok(kinds.has('agents.x-k8s.io/v1alpha1 Sandbox') && kinds.has('extensions.agents.x-k8s.io/v1beta1 SandboxClaim') && kinds.has('extensions.agents.x-k8s.io/v1alpha1 SandboxClaim'), [...kinds].join(', '));
  for (const [source, obj] of objects) {
    assert.deepEqual(schemas.problems(obj), [], `${source}: ${obj.kind}/${obj.metadata.name}`);
    // What the REST API stores (defaults applied) passes too.
    assert.deepEqual(schemas.problems(applyDefaults(obj)), [], `${source}: ${obj.kind}/${obj.metadata.name} with defaults`);
  }
});

test('a sandbox the operator builds from a template passes the schema (the API server would take the write)', () => {
  const sandbox = sandboxFromTemplate(baseTemplate(), {
    name: 'base-x7k2p', namespace: 'default', labels: { [LABEL.pool]: 'base', [LABEL.launchType]: 'warm', [LABEL.template]: 'base' },
    ownerReferences: [{ apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxWarmPool', name: 'base', uid: 'u1', controller: true, blockOwnerDeletion: true }],
    lifecycle: { shutdownTime: '2030-01-01T00:00:00Z', shutdownPolicy: 'Delete' }, idleTimeoutMs: 600_000,
  });
  assert.deepEqual(schemas.problems(sandbox), []);
});

const VCT = [{ metadata: { name: 'home' }, spec: { resources: { requests: { storage: '1Gi' } } } }];
const FULL_SPEC = {
  Sandbox: {
    podTemplate: POD_TEMPLATE, volumeClaimTemplates: VCT, service: true, replicas: 1, operatingMode: 'Running',
    lifecycle: { shutdownTime: NOW, shutdownPolicy: 'Delete' }, shutdownTime: NOW, shutdownPolicy: 'Retain', idleTimeoutMs: 1000,
    network: { internet: false, allow: ['203.0.113.0/24', '*.example.com'], deny: ['198.51.100.7'] }, suspensionStrategy: 'Hibernate',
    snapshotRef: { name: 'snap-1' },
  } satisfies Required<SandboxSpec>,
  SandboxTemplate: {
    podTemplate: POD_TEMPLATE, volumeClaimTemplates: VCT, service: false, networkPolicy: { ingress: [{ from: [] }], egress: [] },
    networkPolicyManagement: 'Managed', envVarsInjectionPolicy: 'Allowed', volumeClaimTemplatesPolicy: 'Overrides', idleTimeoutMs: 0,
    network: { internet: true, deny: ['203.0.113.0/24'] }, suspensionStrategy: 'Stop',
  } satisfies Required<SandboxTemplateSpec>,
  SandboxWarmPool: { replicas: 2, sandboxTemplateRef: { name: 't' }, updateStrategy: { type: 'Recreate' } } satisfies Required<SandboxWarmPoolSpec>,
  SandboxClaim: {
    warmPoolRef: { name: 'p' }, sandboxTemplateRef: { name: 't' }, warmpool: 'default',
    lifecycle: { shutdownTime: NOW, shutdownPolicy: 'DeleteForeground', ttlSecondsAfterFinished: 60 },
    additionalPodMetadata: { labels: { team: 'a' }, annotations: { note: 'x' } }, env: [{ name: 'A', value: '1', containerName: 'main' }], volumeClaimTemplates: VCT,
  } satisfies Required<SandboxClaimSpec>,
  SandboxSnapshot: { sandboxRef: { name: 's' }, mode: 'Filesystem' } satisfies Required<SandboxSnapshotSpec>,
  ApiKey: { team: 'team-a', hash: 'a'.repeat(64), prefix: 'asb_ab12cd34', admin: false, revoked: false, description: 'ci' } satisfies Required<ApiKeySpec>,
  Cluster: {
    region: 'eu-west', ingressAddress: '203.0.113.7:10443', apiUrl: 'http://worker-api:7080', labels: { tier: 'gpu' }, drain: false, tag: 'rga1', credentialHash: 'b'.repeat(64),
  } satisfies Required<ClusterSpec>,
  SyncState: { appliedVersion: 42 } satisfies Required<SyncState['spec']>,
};

const FEDERATION_STATUS = {
  Cluster: { connected: true, appliedVersion: 42, lag: 0, lastSeen: NOW, warm: { 'default/base': 3 }, healthy: true } satisfies Required<ClusterStatus>,
};

/** Fields of value the schema does not declare (and would prune), by path. */
function undeclared(schema: JSONSchemaProps, value: unknown, path: string): string[] {
  if (typeof value !== 'object' || value === null) return [];
  if (Array.isArray(value)) return schema.items === undefined ? [] : value.flatMap((v, i) => undeclared(schema.items!, v, `${path}[${i}]`));
  if (schema['x-kubernetes-preserve-unknown-fields'] === true && schema.properties === undefined) return [];
  return Object.entries(value).flatMap(([key, v]) => {
    const child = schema.properties?.[key] ?? schema.additionalProperties;
    if (child === undefined) return schema['x-kubernetes-preserve-unknown-fields'] === true ? [] : [`${path}.${key}`];
    return undeclared(child, v, `${path}.${key}`);
  });
}

test('every field of the TypeScript spec and status types is declared in the CRD (none is pruned)', () => {
  for (const rt of [...RESOURCE_TYPES, ...FEDERATION_TYPES]) {
    const schema = crdFor(rt).spec.versions[0]!.schema.openAPIV3Schema;
    const spec = FULL_SPEC[rt.kind as keyof typeof FULL_SPEC];
    assert.deepEqual(undeclared(schema.properties!.spec!, spec, 'spec'), [], rt.kind);
    const status = ({ ...FULL_STATUS, ...FEDERATION_STATUS } as Record<string, object>)[rt.kind];
    if (status === undefined) continue;
    assert.deepEqual(undeclared(schema.properties!.status!, status, 'status'), [], rt.kind);
    // The status the controllers write is valid as a whole, too.
    const obj = { apiVersion: `${rt.group}/${rt.version}`, kind: rt.kind, metadata: { name: 'x' }, spec: rt === SandboxType ? { podTemplate: POD_TEMPLATE } : spec, status };
    assert.deepEqual(schemas.problems(obj), [], `${rt.kind} status`);
  }
});

test('objects our validator refuses, the CRD schemas refuse too, at the same field', () => {
  for (const { what, obj, field } of INVALID_OBJECTS) {
    let fields: string[] = [];
    try {
      validateObject(obj);
      assert.fail(`${what}: our validator accepted it`);
    } catch (err) {
      if (!isAsbError(err, 'Invalid')) throw err;
      fields = err.fields.map((f) => f.field);
    }
    assert.ok(fields.includes(field), `${what}: our validator named ${fields.join(', ')}, not ${field}`);
    const problems = schemas.problems(obj);
    assert.ok(problems.some((p) => p.field === field), `${what}: the schema named ${JSON.stringify(problems)}, not ${field}`);
  }
});

test('both served versions take either version\'s field names (one schema, no conversion webhook)', () => {
  const alpha = { apiVersion: 'agents.x-k8s.io/v1alpha1', kind: 'Sandbox', metadata: { name: 'a' }, spec: { podTemplate: POD_TEMPLATE, operatingMode: 'Suspended' } };
  const beta = { ...alpha, apiVersion: 'agents.x-k8s.io/v1beta1', spec: { podTemplate: POD_TEMPLATE, replicas: 0 } };
  assert.deepEqual(schemas.problems(alpha), []);
  assert.deepEqual(schemas.problems(beta), []);
  const v1alpha1Claim = { apiVersion: 'extensions.agents.x-k8s.io/v1beta1', kind: 'SandboxClaim', metadata: { name: 'c' }, spec: { sandboxTemplateRef: { name: 't' }, warmpool: 'none' } };
  assert.deepEqual(schemas.problems(v1alpha1Claim), []);
  assert.throws(() => schemas.problems({ ...alpha, apiVersion: 'agents.x-k8s.io/v1' }), /no CRD serves agents.x-k8s.io\/v1\/Sandbox/);
});
