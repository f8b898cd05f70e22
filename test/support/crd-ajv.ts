// Checks objects against our CRDs' schemas (src/api/crd.ts) with ajv, the way `kubectl apply`
// against a kube-apiserver would: unknown fields are refused (kubectl's default is strict field
// validation) except where a schema keeps them (x-kubernetes-preserve-unknown-fields), int-or-
// string means either, and the CEL rules run through JSON Schema equivalents kept in a table
// here, so a new CEL rule fails the test until someone writes its equivalent down.
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import { allCrds, type CustomResourceDefinition, type JSONSchemaProps } from '../../src/api/crd.ts';
import type { KubeObject } from '../../src/api/meta.ts';
import { isRfc3339 } from '../../src/api/names.ts';
import { join } from '../../src/api/shape.ts';

type Schema = Record<string, unknown>;

const RESERVED = '^(agents\\.x-k8s\\.io/|extensions\\.agents\\.x-k8s\\.io/|asb\\.dev/)';

/** Each CEL rule our CRDs use and what it says in JSON Schema, failing at the rule's fieldPath. */
const CEL_AS_JSON_SCHEMA: ReadonlyMap<string, Schema> = new Map<string, Schema>([
  ['!has(self.lifecycle) || !(has(self.shutdownTime) || has(self.shutdownPolicy))',
    { if: { anyOf: [{ required: ['shutdownTime'] }, { required: ['shutdownPolicy'] }] }, then: { properties: { lifecycle: false } } }],
  ['has(self.warmPoolRef) || has(self.sandboxTemplateRef)',
    { if: { not: { required: ['sandboxTemplateRef'] } }, then: { required: ['warmPoolRef'] } }],
  ["self.all(k, !k.startsWith('agents.x-k8s.io/') && !k.startsWith('extensions.agents.x-k8s.io/') && !k.startsWith('asb.dev/'))",
    { propertyNames: { not: { pattern: RESERVED } } }],
]);

/** The JSON Schema ajv checks for one CRD schema node; `open` keeps unknown fields (metadata). */
export function toAjvSchema(node: JSONSchemaProps, open = false): Schema {
  const out: Schema = {};
  const rules: Schema[] = [];
  for (const [key, value] of Object.entries(node) as [keyof JSONSchemaProps, unknown][]) {
    switch (key) {
      case 'properties':
        out.properties = Object.fromEntries(Object.entries(node.properties ?? {}).map(([k, v]) => [k, toAjvSchema(v)]));
        break;
      case 'oneOf':
        out.oneOf = (node.oneOf ?? []).map((branch) => toAjvSchema(branch));
        break;
      case 'items':
      case 'additionalProperties':
        out[key] = toAjvSchema(value as JSONSchemaProps);
        break;
      case 'x-kubernetes-validations':
        for (const { rule } of node['x-kubernetes-validations'] ?? []) {
          const equivalent = CEL_AS_JSON_SCHEMA.get(rule);
          if (equivalent === undefined) throw new Error(`no JSON Schema equivalent for the CEL rule ${JSON.stringify(rule)}: add one to CEL_AS_JSON_SCHEMA in test/support/crd-ajv.ts`);
          rules.push(equivalent);
        }
        break;
      case 'x-kubernetes-preserve-unknown-fields':
      case 'x-kubernetes-list-type':
      case 'x-kubernetes-list-map-keys':
      case 'x-kubernetes-int-or-string':
      case 'pattern':
        break;
      default:
        out[key] = value;
    }
  }
  if (node['x-kubernetes-int-or-string'] === true) {
    out.anyOf = [{ type: 'integer' }, { type: 'string', ...(node.pattern === undefined ? {} : { pattern: node.pattern }) }];
  } else if (node.pattern !== undefined) {
    out.pattern = node.pattern;
  }
  if (node.properties !== undefined && node['x-kubernetes-preserve-unknown-fields'] !== true && !open) out.additionalProperties = false;
  if (rules.length > 0) out.allOf = rules;
  return out;
}

export interface SchemaProblem {
  /** e.g. spec.replicas, or spec when the problem is about the object as a whole. */
  field: string;
  message: string;
}

/** Validates objects of our kinds against the CRD of their group, kind and version. */
export class CrdSchemas {
  readonly #validators = new Map<string, ValidateFunction>();

  constructor(crds: readonly CustomResourceDefinition[] = allCrds()) {
    const ajv = new Ajv({ allErrors: true, strict: true, strictTypes: false, strictRequired: false, formats: { 'date-time': isRfc3339 } });
    for (const crd of crds) {
      for (const version of crd.spec.versions) {
        const root = toAjvSchema(version.schema.openAPIV3Schema);
        // ObjectMeta is the API server's: the CRD may only narrow name and generateName.
        const properties = root.properties as Record<string, Schema>;
        properties.metadata = toAjvSchema(version.schema.openAPIV3Schema.properties?.metadata ?? { type: 'object' }, true);
        this.#validators.set(`${crd.spec.group}/${version.name}/${crd.spec.names.kind}`, ajv.compile(root));
      }
    }
  }

  /** The schema's problems with obj ([] when it passes); throws for a kind no CRD serves. */
  problems(obj: KubeObject | Record<string, unknown>): SchemaProblem[] {
    const key = `${String(obj.apiVersion)}/${String(obj.kind)}`;
    const validate = this.#validators.get(key);
    if (validate === undefined) throw new Error(`no CRD serves ${key}`);
    if (validate(obj)) return [];
    return (validate.errors ?? []).map(describe);
  }
}

/** The field path as our validator writes it (join in src/api/shape.ts), so the two compare. */
function describe(error: ErrorObject): SchemaProblem {
  // /spec/podTemplate/spec/containers/0/name → spec.podTemplate.spec.containers[0].name
  let field = error.instancePath.split('/').slice(1)
    .map((part) => part.replaceAll('~1', '/').replaceAll('~0', '~'))
    .reduce<string>((path, part) => join(path, /^\d+$/.test(part) ? Number(part) : part), '');
  const params = error.params as { additionalProperty?: string; missingProperty?: string; propertyName?: string };
  const child = params.additionalProperty ?? params.missingProperty ?? params.propertyName;
  if (child !== undefined && error.keyword !== 'pattern') field = join(field, child);
  return { field, message: error.message ?? error.keyword };
}
