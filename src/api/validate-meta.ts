// Validation of object metadata: names, namespace, labels, annotations and the fields the store
// sets (kept so that an object read back with kubectl can be applied again unchanged).
import type { ResourceType } from './meta.ts';
import { levelProblem, POD_SECURITY_ANNOTATION } from './pod-security.ts';
import { dnsLabelProblem, dnsSubdomainProblem, isRfc3339, labelProblem, qualifiedNameProblem } from './names.ts';
import { join, onlyKnown, optArray, optBoolean, optInt, optObject, optString, optStringArray, optStringMap, report, reqObject, reqString } from './shape.ts';
import type { Problems } from './shape.ts';
import { SandboxClaimType, SandboxType } from './types.ts';

const META_FIELDS = [
  'name', 'namespace', 'generateName', 'uid', 'resourceVersion', 'generation', 'creationTimestamp',
  'deletionTimestamp', 'labels', 'annotations', 'finalizers', 'ownerReferences',
] as const;

const GENERATED_SUFFIX = 5;

/** Kubernetes caps all annotations of one object at 256 KiB together. */
const ANNOTATIONS_MAX_BYTES = 256 * 1024;

/**
 * Sandbox names become pod names, hostnames and the `<sandboxId>` in `<port>-<sandboxId>.<domain>`,
 * each a single DNS label; a cold-started claim names its sandbox after itself. Every other kind
 * only needs the Kubernetes default, a DNS subdomain.
 */
export function nameProblem(rt: ResourceType, name: string): string | undefined {
  return rt === SandboxType || rt === SandboxClaimType ? dnsLabelProblem(name) : dnsSubdomainProblem(name);
}

export interface MetaSummary {
  name?: string;
  generateName?: string;
}

export function validateMetadata(problems: Problems, path: string, value: unknown, rt: ResourceType | undefined): MetaSummary {
  const meta = reqObject(problems, path, value);
  if (meta === undefined) return {};
  onlyKnown(problems, path, meta, META_FIELDS);
  const summary: MetaSummary = {};

  const name = optString(problems, join(path, 'name'), meta.name);
  const generateName = optString(problems, join(path, 'generateName'), meta.generateName);
  if (name !== undefined && name !== '') summary.name = name;
  if (generateName !== undefined && generateName !== '') summary.generateName = generateName;
  if (summary.name === undefined && summary.generateName === undefined && (meta.name === undefined || meta.name === '')) {
    report(problems, join(path, 'name'), 'is required (or set metadata.generateName)');
  }
  if (rt !== undefined && summary.name !== undefined) {
    const problem = nameProblem(rt, summary.name);
    if (problem !== undefined) report(problems, join(path, 'name'), problem);
  }
  if (rt !== undefined && summary.generateName !== undefined) {
    const problem = generateNameProblem(rt, summary.generateName);
    if (problem !== undefined) report(problems, join(path, 'generateName'), problem);
  }

  const namespace = optString(problems, join(path, 'namespace'), meta.namespace);
  if (namespace !== undefined && namespace !== '' && rt !== undefined) {
    const problem = rt.namespaced ? dnsLabelProblem(namespace) : `must not be set: ${rt.kind} is cluster-scoped`;
    if (problem !== undefined) report(problems, join(path, 'namespace'), problem);
  }

  optString(problems, join(path, 'uid'), meta.uid);
  optString(problems, join(path, 'resourceVersion'), meta.resourceVersion);
  optInt(problems, join(path, 'generation'), meta.generation, { min: 0 });
  for (const key of ['creationTimestamp', 'deletionTimestamp'] as const) {
    // `kubectl create --dry-run -o yaml` writes `creationTimestamp: null`.
    if (meta[key] !== null) checkTime(problems, join(path, key), meta[key]);
  }
  optStringMap(problems, join(path, 'labels'), meta.labels, labelProblem);
  const annotations = optStringMap(problems, join(path, 'annotations'), meta.annotations,
    (key, v) => qualifiedNameProblem(key) ?? (key === POD_SECURITY_ANNOTATION ? levelProblem(v) : undefined));
  if (annotations !== undefined) {
    const bytes = Object.entries(annotations).reduce((sum, [k, v]) => sum + Buffer.byteLength(k) + Buffer.byteLength(v), 0);
    if (bytes > ANNOTATIONS_MAX_BYTES) report(problems, join(path, 'annotations'), `must total at most ${ANNOTATIONS_MAX_BYTES} bytes, got ${bytes}`);
  }
  const finalizers = optStringArray(problems, join(path, 'finalizers'), meta.finalizers) ?? [];
  finalizers.forEach((f, i) => {
    const problem = qualifiedNameProblem(f);
    if (problem !== undefined) report(problems, join(join(path, 'finalizers'), i), problem.replace(/^key /, ''));
  });
  validateOwnerReferences(problems, join(path, 'ownerReferences'), meta.ownerReferences);
  return summary;
}

/** The store appends 5 random characters: the prefix may end in '-' and must leave room for them. */
function generateNameProblem(rt: ResourceType, prefix: string): string | undefined {
  const limit = (rt === SandboxType || rt === SandboxClaimType ? 63 : 253) - GENERATED_SUFFIX;
  if (prefix.length > limit) return `must be at most ${limit} characters to leave room for the generated suffix, got ${prefix.length}`;
  const base = prefix.replace(/-+$/, '');
  if (base === '') return `must start with a letter or digit, got ${JSON.stringify(prefix)}`;
  return nameProblem(rt, base);
}

/** An RFC 3339 time string, as metav1.Time is written. */
export function checkTime(problems: Problems, path: string, value: unknown): string | undefined {
  const text = optString(problems, path, value);
  if (text === undefined) return undefined;
  if (isRfc3339(text)) return text;
  report(problems, path, `must be an RFC 3339 time such as 2026-12-31T23:59:59Z, got ${JSON.stringify(text)}`);
  return undefined;
}

function validateOwnerReferences(problems: Problems, path: string, value: unknown): void {
  (optArray(problems, path, value) ?? []).forEach((item, i) => {
    const at = join(path, i);
    const ref = optObject(problems, at, item);
    if (ref === undefined) return;
    for (const key of ['apiVersion', 'kind', 'name', 'uid']) reqString(problems, join(at, key), ref[key]);
    optBoolean(problems, join(at, 'controller'), ref.controller);
    optBoolean(problems, join(at, 'blockOwnerDeletion'), ref.blockOwnerDeletion);
  });
}
