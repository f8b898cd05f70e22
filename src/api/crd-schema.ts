// OpenAPI v3 schema pieces for our CRDs, as the kube-apiserver wants them: structural (every
// node typed, `properties` and `additionalProperties` never together) so unknown fields are
// pruned or, with kubectl's default strict field validation, refused. Kubernetes types too big to
// enumerate (PodSpec, Container, PVC spec) keep unknown fields; the fields we read are typed
// with the rules src/api/validate-pod.ts applies, so an object our validator refuses for a
// reason a schema can express is refused by the API server too.
import { RESERVED_PREFIXES } from './names.ts';

/** apiextensions.k8s.io/v1 JSONSchemaProps: the subset our CRDs use. */
export interface JSONSchemaProps {
  type?: 'object' | 'array' | 'string' | 'integer' | 'number' | 'boolean';
  description?: string;
  properties?: Record<string, JSONSchemaProps>;
  additionalProperties?: JSONSchemaProps;
  items?: JSONSchemaProps;
  required?: string[];
  enum?: string[];
  default?: unknown;
  minimum?: number;
  maximum?: number;
  minLength?: number;
  maxLength?: number;
  pattern?: string;
  minItems?: number;
  format?: 'date-time';
  nullable?: boolean;
  oneOf?: JSONSchemaProps[];
  'x-kubernetes-preserve-unknown-fields'?: true;
  'x-kubernetes-int-or-string'?: true;
  'x-kubernetes-list-type'?: 'atomic' | 'map' | 'set';
  'x-kubernetes-list-map-keys'?: string[];
  'x-kubernetes-validations'?: ValidationRule[];
}

/** A CEL rule: for what plain OpenAPI cannot say across fields, with the message users see. */
export interface ValidationRule {
  rule: string;
  message: string;
  /** The field the error names (relative, e.g. `.lifecycle`); without it, the rule's own node. */
  fieldPath?: string;
  /** How the error reads: `<field>: Required value: <message>` for FieldValueRequired. */
  reason?: 'FieldValueRequired' | 'FieldValueInvalid' | 'FieldValueForbidden';
}

// RE2 and JavaScript read these the same way (apimachinery/pkg/util/validation).
export const DNS_LABEL_PATTERN = '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$';
export const DNS_SUBDOMAIN_PATTERN = '^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$';
const PORT_NAME_PATTERN = '^[a-z0-9]([a-z0-9-]*[a-z0-9])?$';
/** resource.Quantity as controller-gen writes it for int-or-string quantities. */
const QUANTITY_PATTERN = '^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$';
/** Label keys under the prefixes the controllers own, refused as validate-pod.ts refuses them. */
const RESERVED_LABEL_RULE: ValidationRule = {
  rule: `self.all(k, ${RESERVED_PREFIXES.map((p) => `!k.startsWith('${p}')`).join(' && ')})`,
  message: `label keys under ${RESERVED_PREFIXES.join(', ')} are reserved for the controller`,
};

export function string(extra: Omit<JSONSchemaProps, 'type'> = {}): JSONSchemaProps {
  return { type: 'string', ...extra };
}

/** A non-empty string: our validator treats "" as missing. */
export function name(description?: string): JSONSchemaProps {
  return string({ minLength: 1, ...(description === undefined ? {} : { description }) });
}

export function integer(min?: number, max?: number, description?: string): JSONSchemaProps {
  return {
    type: 'integer',
    ...(min === undefined ? {} : { minimum: min }),
    ...(max === undefined ? {} : { maximum: max }),
    ...(description === undefined ? {} : { description }),
  };
}

export function boolean(description?: string): JSONSchemaProps {
  return { type: 'boolean', ...(description === undefined ? {} : { description }) };
}

export function enumOf(values: readonly string[], description?: string): JSONSchemaProps {
  return string({ enum: [...values], ...(description === undefined ? {} : { description }) });
}

export function time(description?: string): JSONSchemaProps {
  return string({ format: 'date-time', ...(description === undefined ? {} : { description }) });
}

export function array(items: JSONSchemaProps, extra: Omit<JSONSchemaProps, 'type' | 'items'> = {}): JSONSchemaProps {
  return { type: 'array', items, ...extra };
}

export function strings(description?: string): JSONSchemaProps {
  return array(string(), description === undefined ? {} : { description });
}

export function map(values: JSONSchemaProps, description?: string): JSONSchemaProps {
  return { type: 'object', additionalProperties: values, ...(description === undefined ? {} : { description }) };
}

export interface ObjectOptions {
  required?: string[];
  /** Keep fields the schema does not list (Kubernetes types we only partly read). */
  open?: boolean;
  description?: string;
  rules?: ValidationRule[];
}

export function object(properties: Record<string, JSONSchemaProps>, opts: ObjectOptions = {}): JSONSchemaProps {
  return {
    type: 'object',
    ...(opts.description === undefined ? {} : { description: opts.description }),
    properties,
    ...(opts.required === undefined ? {} : { required: opts.required }),
    ...(opts.open === true ? { 'x-kubernetes-preserve-unknown-fields': true as const } : {}),
    ...(opts.rules === undefined ? {} : { 'x-kubernetes-validations': opts.rules }),
  };
}

/** An object of any shape: status of kinds without one of their own, network policy rules. */
export function anyObject(description?: string): JSONSchemaProps {
  return { type: 'object', 'x-kubernetes-preserve-unknown-fields': true, ...(description === undefined ? {} : { description }) };
}

export function quantity(description?: string): JSONSchemaProps {
  return { 'x-kubernetes-int-or-string': true, pattern: QUANTITY_PATTERN, ...(description === undefined ? {} : { description }) };
}

function intOrString(description: string): JSONSchemaProps {
  return { 'x-kubernetes-int-or-string': true, description };
}

const port = (description: string): JSONSchemaProps => integer(1, 65535, description);

// ---- metadata

export function podMetadata(description: string): JSONSchemaProps {
  return object({
    labels: { ...map(string()), 'x-kubernetes-validations': [RESERVED_LABEL_RULE] },
    annotations: map(string()),
  }, { description });
}

// ---- Pod blueprint: podTemplate and volumeClaimTemplates (validate-pod.ts)

const ACCESS_MODES = ['ReadWriteOnce', 'ReadOnlyMany', 'ReadWriteMany', 'ReadWriteOncePod'] as const;

export function volumeClaimTemplates(description: string): JSONSchemaProps {
  const claim = object({
    metadata: object({
      name: string({ maxLength: 63, pattern: DNS_LABEL_PATTERN, description: 'The volume name pods mount; the PVC is <name>-<sandbox>.' }),
      labels: map(string()),
      annotations: map(string()),
    }, { required: ['name'] }),
    spec: object({
      accessModes: array(enumOf(ACCESS_MODES)),
      storageClassName: string(),
      resources: object({
        requests: { ...map(quantity()), required: ['storage'] },
        limits: map(quantity()),
      }, { required: ['requests'], open: true }),
    }, { required: ['resources'], open: true, description: 'A PersistentVolumeClaimSpec.' }),
  }, { required: ['metadata', 'spec'] });
  return array(claim, { description, 'x-kubernetes-list-type': 'atomic' });
}

export function podTemplate(description: string): JSONSchemaProps {
  return object({
    metadata: podMetadata('Labels and annotations for the pod.'),
    spec: podSpec(),
  }, { required: ['spec'], description });
}

function podSpec(): JSONSchemaProps {
  const securityContext = object({
    runAsUser: integer(0),
    runAsGroup: integer(0),
    fsGroup: integer(0),
    runAsNonRoot: boolean(),
  }, { open: true });
  return object({
    containers: array(container(), { minItems: 1 }),
    initContainers: array(container()),
    volumes: array(object({
      name: string({ maxLength: 63, pattern: DNS_LABEL_PATTERN }),
      emptyDir: anyObject(),
      persistentVolumeClaim: object({ claimName: name(), readOnly: boolean() }, { required: ['claimName'] }),
    }, { required: ['name'], open: true })),
    runtimeClassName: string({ description: 'Passed through to the Pod: gvisor or kata for a stronger boundary.' }),
    serviceAccountName: string(),
    automountServiceAccountToken: boolean(),
    hostname: string({ maxLength: 63, pattern: DNS_LABEL_PATTERN }),
    restartPolicy: enumOf(['Always', 'OnFailure', 'Never']),
    terminationGracePeriodSeconds: integer(0),
    securityContext,
  }, { required: ['containers'], open: true, description: 'A PodSpec; the fields listed here are checked, the rest kept as written.' });
}

function container(): JSONSchemaProps {
  return object({
    name: string({ maxLength: 63, pattern: DNS_LABEL_PATTERN }),
    // `image:` left empty is null in YAML: the k8s-sigs getting-started Sandbox does exactly that.
    image: string({ nullable: true }),
    command: strings(),
    args: strings(),
    workingDir: string(),
    env: array(object({ name: name(), value: string(), valueFrom: anyObject() }, { required: ['name'], open: true })),
    ports: array(object({
      containerPort: port('The port the container listens on.'),
      hostPort: port('The host port, if any.'),
      name: string({ maxLength: 15, pattern: PORT_NAME_PATTERN }),
      protocol: enumOf(['TCP', 'UDP', 'SCTP']),
      appProtocol: string({ maxLength: 253 }),
    }, { required: ['containerPort'], open: true })),
    volumeMounts: array(object({
      name: name(),
      mountPath: string({ pattern: '^/' }),
      readOnly: boolean(),
      // Relative: '..' segments are refused by our validator, which a pattern in RE2 cannot say.
      subPath: string({ pattern: '^($|[^/])' }),
    }, { required: ['name', 'mountPath'], open: true })),
    readinessProbe: probe(),
    livenessProbe: probe(),
    startupProbe: probe(),
    resources: object({ limits: map(quantity()), requests: map(quantity()) }, { open: true }),
    securityContext: object({ runAsUser: integer(0), runAsGroup: integer(0), runAsNonRoot: boolean() }, { open: true }),
  }, { required: ['name'], open: true });
}

function probe(): JSONSchemaProps {
  const probePort = intOrString('A port number or a container port name.');
  const handlers = ['exec', 'httpGet', 'tcpSocket', 'grpc'];
  return {
    ...object({
      exec: object({ command: array(string(), { minItems: 1 }) }, { required: ['command'] }),
      httpGet: object({ path: string(), port: probePort, scheme: enumOf(['HTTP', 'HTTPS']) }, { required: ['port'], open: true }),
      tcpSocket: object({ port: probePort }, { required: ['port'], open: true }),
      grpc: object({ port: port('The gRPC health port.') }, { required: ['port'], open: true }),
      initialDelaySeconds: integer(0),
      periodSeconds: integer(1),
      timeoutSeconds: integer(1),
      failureThreshold: integer(1),
      successThreshold: integer(1),
    }, { open: true, description: `Set exactly one of ${handlers.join(', ')}.` }),
    // Not a CEL rule, though its message would be clearer: under unbounded container lists its
    // estimated cost is 8.7 times the API server's budget, which refuses the whole CRD.
    oneOf: handlers.map((h) => ({ required: [h] })),
  };
}

// ---- status pieces

/** metav1.Condition. */
export function conditions(): JSONSchemaProps {
  return array(object({
    type: name(),
    status: enumOf(['True', 'False', 'Unknown']),
    reason: name(),
    message: string(),
    lastTransitionTime: time(),
    observedGeneration: integer(0),
  }, { required: ['type', 'status', 'reason', 'lastTransitionTime'] }), {
    'x-kubernetes-list-type': 'map',
    'x-kubernetes-list-map-keys': ['type'],
  });
}
