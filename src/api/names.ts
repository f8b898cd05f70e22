// Kubernetes name rules (apimachinery/pkg/util/validation), so that anything we accept the
// kube-apiserver accepts too and the same manifests work in both modes.

const LABEL_MAX = 63;
const SUBDOMAIN_MAX = 253;
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const QUALIFIED_NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
/** IANA service names: what a container port's `name` must be, and what probes refer to. */
const PORT_NAME = /^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/;
const PORT_NAME_MAX = 15;

/** Label and annotation key prefixes this system and kubernetes-sigs/agent-sandbox own. */
export const RESERVED_PREFIXES = ['agents.x-k8s.io/', 'extensions.agents.x-k8s.io/', 'asb.dev/'] as const;

/** Why `name` is not an RFC 1123 label (≤ 63, lower-case alphanumerics and '-'), or undefined. */
export function dnsLabelProblem(name: string): string | undefined {
  if (name.length > LABEL_MAX) return `must be at most ${LABEL_MAX} characters, got ${name.length}`;
  if (!DNS_LABEL.test(name)) {
    return `must be a DNS label: lower-case letters, digits and '-', starting and ending with a letter or digit, got ${JSON.stringify(name)}`;
  }
  return undefined;
}

/** Why `name` is not an RFC 1123 subdomain (≤ 253, dot-separated labels), or undefined. */
export function dnsSubdomainProblem(name: string): string | undefined {
  if (name.length > SUBDOMAIN_MAX) return `must be at most ${SUBDOMAIN_MAX} characters, got ${name.length}`;
  if (!DNS_SUBDOMAIN.test(name)) {
    return `must be a DNS subdomain: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit, got ${JSON.stringify(name)}`;
  }
  return undefined;
}

/** Label and annotation keys: `[prefix/]name`, prefix a DNS subdomain, name ≤ 63. */
export function qualifiedNameProblem(key: string): string | undefined {
  const slash = key.lastIndexOf('/');
  const prefix = slash === -1 ? undefined : key.slice(0, slash);
  const name = slash === -1 ? key : key.slice(slash + 1);
  if (prefix !== undefined) {
    const problem = prefix === '' ? 'must not be empty' : dnsSubdomainProblem(prefix);
    if (problem !== undefined) return `key prefix ${problem}`;
  }
  if (name === '') return 'key name must not be empty';
  if (name.length > LABEL_MAX) return `key name must be at most ${LABEL_MAX} characters, got ${name.length}`;
  if (!QUALIFIED_NAME.test(name)) {
    return `key name must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric, got ${JSON.stringify(name)}`;
  }
  return undefined;
}

/** Label values: empty, or ≤ 63 characters of the qualified-name alphabet. */
export function labelValueProblem(value: string): string | undefined {
  if (value === '') return undefined;
  if (value.length > LABEL_MAX) return `value must be at most ${LABEL_MAX} characters, got ${value.length}`;
  if (!QUALIFIED_NAME.test(value)) {
    return `value must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric, got ${JSON.stringify(value)}`;
  }
  return undefined;
}

export function labelProblem(key: string, value: string): string | undefined {
  return qualifiedNameProblem(key) ?? labelValueProblem(value);
}

export function isReservedKey(key: string): boolean {
  return RESERVED_PREFIXES.some((prefix) => key.startsWith(prefix));
}

export function portNameProblem(name: string): string | undefined {
  if (name.length > PORT_NAME_MAX) return `must be at most ${PORT_NAME_MAX} characters, got ${name.length}`;
  if (!PORT_NAME.test(name) || !/[a-z]/.test(name) || name.includes('--')) {
    return `must be an IANA service name: lower-case letters, digits and single '-', with at least one letter, got ${JSON.stringify(name)}`;
  }
  return undefined;
}

// RFC 3339 as Kubernetes writes metav1.Time: date, 'T', time, optional fraction, zone.
const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/;

/** Whether `text` is an RFC 3339 date-time with real calendar values (no 2025-02-30). */
export function isRfc3339(text: string): boolean {
  const m = RFC3339.exec(text);
  if (m === null) return false;
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map(Number) as [number, number, number, number, number, number];
  const daysInMonth = new Date(Date.UTC(year, month, 0)).getUTCDate();
  // Second 60 is a leap second, which RFC 3339 allows.
  return month >= 1 && month <= 12 && day >= 1 && day <= daysInMonth && hour <= 23 && minute <= 59 && second <= 60;
}

const OBJECT_NAME = /^[a-z0-9]([-a-z0-9]{0,251}[a-z0-9])?$/;

/** A name our objects (sandboxes, templates, snapshots) may take: lower-case letters, digits and inner hyphens, at most 253. */
export function isObjectName(name: string): boolean {
  return OBJECT_NAME.test(name);
}
