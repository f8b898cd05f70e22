// The OpenAPI v3 documents kubectl reads: /openapi/v3 (an index of group-versions, each with a
// content hash) and /openapi/v3/apis/<group>/<version>. From them kubectl
// - explains fields (`kubectl explain sandboxes.spec`), walking the kind's schema;
// - decides that the server validates fields itself: a PATCH operation with the kind's
//   x-kubernetes-group-version-kind and a `fieldValidation` parameter makes `kubectl apply` send
//   fieldValidation=Strict instead of validating against /openapi/v2, which we do not serve;
// - decides how `kubectl apply` patches: no application/strategic-merge-patch+json in the PATCH
//   request body means a JSON merge patch, as for every custom resource.
// The schemas are our CRDs' (src/api/crd.ts), laid out as kube-apiserver 1.37 lays out a CRD's.
import { createHash } from 'node:crypto';
import type { JSONSchemaProps } from '../api/crd.ts';
import { resourcesOf, scaleSubresource, SERVED_GROUPS, groupVersions, type ServedResource } from './resources.ts';

const META = 'io.k8s.apimachinery.pkg.apis.meta.v1';
const SCALE = 'io.k8s.api.autoscaling.v1.Scale';
const ref = (name: string): { $ref: string } => ({ $ref: `#/components/schemas/${name}` });

/** `agents.x-k8s.io` → `io.x-k8s.agents`: the apiserver's schema name prefix for a group. */
function schemaName(s: ServedResource, version: string, suffix = ''): string {
  return `${s.rt.group.split('.').reverse().join('.')}.${version}.${s.rt.kind}${suffix}`;
}

const query = (name: string, description: string, type = 'string'): unknown => ({ name, in: 'query', description, schema: { type, uniqueItems: true } });
const WRITE_PARAMS = [
  query('dryRun', 'Not supported: a request with dryRun is refused.'),
  query('fieldManager', 'Accepted and ignored: no managedFields are kept.'),
  query('fieldValidation', 'Strict, Warn or Ignore; unknown fields are always refused (Strict).'),
];

function operation(s: ServedResource, version: string, action: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  const gvk = { group: s.rt.group, version, kind: s.rt.kind };
  const body = { 'application/json': { schema: ref(schemaName(s, version)) } };
  return { description: `${action} ${s.rt.kind}`, responses: { 200: { description: 'OK', content: body }, 401: { description: 'Unauthorized' } }, 'x-kubernetes-action': action, 'x-kubernetes-group-version-kind': gvk, ...extra };
}

/** An operation of the scale subresource: it reads and writes an autoscaling/v1 Scale (scale.ts). */
function scaleOperation(s: ServedResource, action: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  const body = { 'application/json': { schema: ref(SCALE) } };
  return { description: `${action} scale of the ${s.rt.kind}`, responses: { 200: { description: 'OK', content: body }, 401: { description: 'Unauthorized' } }, 'x-kubernetes-action': action, 'x-kubernetes-group-version-kind': { group: 'autoscaling', version: 'v1', kind: 'Scale' }, ...extra };
}

function paths(s: ServedResource, version: string): Record<string, unknown> {
  const base = `/apis/${s.rt.group}/${version}/namespaces/{namespace}/${s.rt.plural}`;
  const patchBody = {
    requestBody: {
      content: Object.fromEntries(['application/apply-patch+yaml', 'application/json-patch+json', 'application/merge-patch+json'].map((t) => [t, { schema: ref(`${META}.Patch`) }])),
      required: true,
    },
    parameters: [...WRITE_PARAMS, query('force', 'Accepted: apply never reports field conflicts here.', 'boolean')],
  };
  const writeBody = { requestBody: { content: { 'application/json': { schema: ref(schemaName(s, version)) } }, required: true }, parameters: WRITE_PARAMS };
  return {
    [base]: { get: operation(s, version, 'list'), post: operation(s, version, 'post', writeBody), delete: operation(s, version, 'deletecollection') },
    [`${base}/{name}`]: {
      get: operation(s, version, 'get'), put: operation(s, version, 'put', writeBody), patch: operation(s, version, 'patch', patchBody), delete: operation(s, version, 'delete'),
    },
    [`${base}/{name}/status`]: { get: operation(s, version, 'get'), put: operation(s, version, 'put', writeBody), patch: operation(s, version, 'patch', patchBody) },
    ...(scaleSubresource(s, version) === undefined ? {} : {
      [`${base}/{name}/scale`]: {
        get: scaleOperation(s, 'get'),
        put: scaleOperation(s, 'put', { requestBody: { content: { 'application/json': { schema: ref(SCALE) } }, required: true }, parameters: WRITE_PARAMS }),
        patch: scaleOperation(s, 'patch', patchBody),
      },
    }),
    [`/apis/${s.rt.group}/${version}/${s.rt.plural}`]: { get: operation(s, version, 'list') },
  };
}

const SCALE_SCHEMA = {
  type: 'object',
  description: 'Scale represents a scaling request for a resource.',
  properties: {
    apiVersion: { type: 'string' },
    kind: { type: 'string' },
    metadata: { allOf: [ref(`${META}.ObjectMeta`)] },
    spec: { type: 'object', properties: { replicas: { type: 'integer', format: 'int32', description: 'The desired number of instances.' } } },
    status: { type: 'object', required: ['replicas'], properties: { replicas: { type: 'integer', format: 'int32', description: 'The actual number of observed instances.' }, selector: { type: 'string', description: 'The label query over the instances.' } } },
  },
  'x-kubernetes-group-version-kind': [{ group: 'autoscaling', kind: 'Scale', version: 'v1' }],
};

function kindSchema(s: ServedResource, version: string): JSONSchemaProps {
  const crdVersion = s.crd.spec.versions.find((v) => v.name === version) ?? s.crd.spec.versions[0];
  const schema = structuredClone(crdVersion?.schema.openAPIV3Schema ?? { type: 'object' }) as JSONSchemaProps & Record<string, unknown>;
  const properties = { ...(schema.properties ?? {}) } as Record<string, unknown>;
  properties.apiVersion = { type: 'string', description: 'APIVersion defines the versioned schema of this representation of an object.' };
  properties.kind = { type: 'string', description: 'Kind is a string value representing the REST resource this object represents.' };
  properties.metadata = { description: "Standard object's metadata.", allOf: [ref(`${META}.ObjectMeta`)] };
  return { ...schema, properties, 'x-kubernetes-group-version-kind': [{ group: s.rt.group, kind: s.rt.kind, version }] } as JSONSchemaProps;
}

const str = (description: string): unknown => ({ type: 'string', description });
const OBJECT_META = {
  type: 'object',
  description: 'ObjectMeta is metadata that all persisted resources must have.',
  properties: {
    name: str('Name must be unique within a namespace.'),
    generateName: str('Optional prefix, used by the server to generate a unique name if name is not provided.'),
    namespace: str('The namespace the object lives in.'),
    uid: str('Unique in time and space; set by the server.'),
    resourceVersion: str('Opaque version of the object, for optimistic concurrency and watches.'),
    generation: { type: 'integer', format: 'int64', description: 'A sequence number of the desired state.' },
    creationTimestamp: { type: 'string', format: 'date-time', description: 'When the object was created.' },
    deletionTimestamp: { type: 'string', format: 'date-time', description: 'When the object will be deleted (set while finalizers run).' },
    labels: { type: 'object', additionalProperties: { type: 'string', default: '' }, description: 'Map of string keys and values to organize and select objects.' },
    annotations: { type: 'object', additionalProperties: { type: 'string', default: '' }, description: 'Unstructured key value map stored with a resource.' },
    finalizers: { type: 'array', items: { type: 'string', default: '' }, description: 'Must be empty before the object is deleted from the registry.' },
    ownerReferences: { type: 'array', items: { type: 'object' }, description: 'Objects depended on by this object.' },
  },
};

/** The document for one group-version. */
export function groupVersionDocument(group: string, version: string): unknown {
  const served = resourcesOf(group, version);
  const schemas: Record<string, unknown> = { [`${META}.ObjectMeta`]: OBJECT_META, [`${META}.Patch`]: { type: 'object', description: 'The body of a PATCH request.' } };
  for (const s of served) schemas[schemaName(s, version)] = kindSchema(s, version);
  if (served.some((s) => scaleSubresource(s, version) !== undefined)) schemas[SCALE] = SCALE_SCHEMA;
  return {
    openapi: '3.0.0',
    info: { title: 'Agent Sandbox Kubernetes API', version: 'v0.1.0' },
    paths: Object.assign({}, ...served.map((s) => paths(s, version))) as Record<string, unknown>,
    components: { schemas },
  };
}

export interface OpenApiDocs {
  index: unknown;
  /** By `<group>/<version>`: the serialized document and its hash (the ETag and ?hash=). */
  documents: ReadonlyMap<string, { body: string; hash: string }>;
}

/** Built once: the documents only change with the code. */
export function buildOpenApi(): OpenApiDocs {
  const documents = new Map<string, { body: string; hash: string }>();
  const index: Record<string, { serverRelativeURL: string }> = {};
  for (const group of SERVED_GROUPS) {
    for (const version of groupVersions(group)) {
      const body = JSON.stringify(groupVersionDocument(group, version));
      const hash = createHash('sha512').update(body).digest('hex').toUpperCase();
      documents.set(`${group}/${version}`, { body, hash });
      index[`apis/${group}/${version}`] = { serverRelativeURL: `/openapi/v3/apis/${group}/${version}?hash=${hash}` };
    }
  }
  return { index: { paths: index }, documents };
}
