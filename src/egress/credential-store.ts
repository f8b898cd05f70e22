// Egress secrets and credential rules, stored at the worker (one JSON file, 0600, written whole
// and renamed into place) and served to the egress decision service. Secret values are
// write-only: they go in through the API and out only into the upstream request the proxy
// forwards (authz-service.ts); every listing shows names and times, never a value. The file
// lives under the worker's state directory, which no sandbox mounts.
import { chmodSync, existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AsbError, type FieldProblem } from '../errors.ts';
import type { Clock } from '../base/clock.ts';
import { privateDir } from '../base/private-files.ts';
import type { CredentialRule, CredentialSource } from './credentials.ts';

/** What a listing shows of a secret. */
export interface SecretInfo {
  name: string;
  updatedAt: string;
}

interface StoredSecret {
  value: string;
  updatedAt: string;
}

interface FileShape {
  secrets: Record<string, StoredSecret>;
  rules: Record<string, CredentialRule>;
}

const NAME = /^[a-z0-9]([-a-z0-9._]{0,61}[a-z0-9])?$/;
const HOST = /^(\*\.)?[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*$/;
// RFC 9110 token characters; lower case (HTTP/2 requires it, Envoy lower-cases anyway).
const HEADER = /^[a-z0-9!#$%&'*+.^_`|~-]{1,100}$/;
/** Headers the proxy must never set from a rule: they steer routing or framing, not credentials. */
const RESERVED_HEADERS = new Set(['host', ':authority', ':path', ':method', ':scheme', 'content-length', 'transfer-encoding', 'connection', 'upgrade', 'te']);
/** A secret is a token or key, not a file: 8 KiB is above any API key or JWT in use. */
export const MAX_SECRET_BYTES = 8192;

export function checkSecretName(name: string, field = 'name'): void {
  if (!NAME.test(name)) throw new AsbError('Invalid', `${field}: must be 1-63 lower-case letters, digits, '-', '.', '_', starting and ending with a letter or digit; got "${name}"`, { fields: [{ field, message: 'not a valid secret name' }] });
}

/** The secret value of a PUT body ({ value }), or 422 naming the field. */
export function parseSecretValue(body: unknown): string {
  const value = typeof body === 'object' && body !== null && !Array.isArray(body) ? (body as Record<string, unknown>).value : undefined;
  const extra = typeof body === 'object' && body !== null ? Object.keys(body).filter((k) => k !== 'value') : [];
  const problems: FieldProblem[] = extra.map((k) => ({ field: k, message: 'unknown field; allowed fields are value' }));
  if (typeof value !== 'string') problems.push({ field: 'value', message: 'is required: a string' });
  else if (value.length === 0 || Buffer.byteLength(value) > MAX_SECRET_BYTES) problems.push({ field: 'value', message: `must be 1 to ${MAX_SECRET_BYTES} bytes` });
  // It becomes an HTTP header value: CR, LF and NUL would split or end the header.
  else if (/[\r\n\0]/.test(value)) problems.push({ field: 'value', message: 'must not contain CR, LF or NUL (it is sent as a header value)' });
  if (problems.length > 0 || typeof value !== 'string') throw new AsbError('Invalid', `invalid secret: ${problems.map((p) => `${p.field} ${p.message}`).join('; ')}`, { fields: problems });
  return value;
}

/** A rule from a PUT body ({ host, pathPrefix?, header, secret }) and the id in the path, or 422 naming every bad field. */
export function parseCredentialRule(id: string, body: unknown): CredentialRule {
  const problems: FieldProblem[] = [];
  if (!NAME.test(id)) problems.push({ field: 'id', message: 'must be 1-63 lower-case letters, digits, "-", ".", "_"' });
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new AsbError('BadRequest', 'request body must be a JSON object');
  const b = body as Record<string, unknown>;
  for (const k of Object.keys(b)) if (!['host', 'pathPrefix', 'header', 'secret'].includes(k)) problems.push({ field: k, message: 'unknown field; allowed fields are host, pathPrefix, header, secret' });
  const host = typeof b.host === 'string' ? b.host.toLowerCase().replace(/\.$/, '') : undefined;
  if (host === undefined || !HOST.test(host) || host.length > 253) problems.push({ field: 'host', message: 'must be a host name ("api.example.com") or a wildcard ("*.example.com")' });
  const header = typeof b.header === 'string' ? b.header.toLowerCase() : undefined;
  if (header === undefined || !HEADER.test(header)) problems.push({ field: 'header', message: 'must be an HTTP header name ("authorization", "x-api-key")' });
  else if (RESERVED_HEADERS.has(header)) problems.push({ field: 'header', message: `"${header}" steers the request, not its credentials; it cannot be set` });
  if (typeof b.secret !== 'string' || !NAME.test(b.secret)) problems.push({ field: 'secret', message: 'must name a secret (PUT /v1/egress/secrets/{name})' });
  if (b.pathPrefix !== undefined && (typeof b.pathPrefix !== 'string' || !b.pathPrefix.startsWith('/') || b.pathPrefix.length > 1024)) problems.push({ field: 'pathPrefix', message: 'must be a path starting with "/"' });
  if (problems.length > 0) throw new AsbError('Invalid', `invalid credential rule: ${problems.map((p) => `${p.field} ${p.message}`).join('; ')}`, { fields: problems });
  return Object.freeze({
    id,
    host: host ?? '',
    header: header ?? '',
    secret: b.secret as string,
    ...(typeof b.pathPrefix === 'string' ? { pathPrefix: b.pathPrefix } : {}),
  });
}

export class CredentialStore implements CredentialSource {
  readonly #path: string;
  readonly #clock: Clock;
  #data: FileShape;
  readonly #listeners = new Set<() => void>();

  /** Loads `<dir>/egress-credentials.json` (made 0700/0600 if missing). */
  constructor(dir: string, clock: Clock) {
    privateDir(dir);
    this.#path = join(dir, 'egress-credentials.json');
    this.#clock = clock;
    this.#data = existsSync(this.#path) ? (JSON.parse(readFileSync(this.#path, 'utf8')) as FileShape) : { secrets: {}, rules: {} };
  }

  /** Called after every change (the worker regenerates the proxy's intercepted hosts). Returns the unsubscribe. */
  onChange(listener: () => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  rulesFor(): readonly CredentialRule[] {
    return Object.values(this.#data.rules);
  }

  secretValue(name: string): string | undefined {
    return this.#data.secrets[name]?.value;
  }

  listSecrets(): SecretInfo[] {
    return Object.entries(this.#data.secrets)
      .map(([name, s]) => ({ name, updatedAt: s.updatedAt }))
      .sort((a, b) => a.name.localeCompare(b.name));
  }

  setSecret(name: string, value: string): SecretInfo {
    checkSecretName(name);
    const updatedAt = new Date(this.#clock.now()).toISOString();
    this.#write({ ...this.#data, secrets: { ...this.#data.secrets, [name]: { value, updatedAt } } });
    return { name, updatedAt };
  }

  deleteSecret(name: string): void {
    if (this.#data.secrets[name] === undefined) throw new AsbError('NotFound', `no egress secret named "${name}"`);
    const inUse = Object.values(this.#data.rules).filter((r) => r.secret === name).map((r) => r.id);
    if (inUse.length > 0) throw new AsbError('Conflict', `egress secret "${name}" is used by credential rule(s) ${inUse.join(', ')}; delete or change them first`);
    this.#write({ ...this.#data, secrets: Object.fromEntries(Object.entries(this.#data.secrets).filter(([n]) => n !== name)) });
  }

  listRules(): CredentialRule[] {
    return Object.values(this.#data.rules).sort((a, b) => a.id.localeCompare(b.id));
  }

  setRule(rule: CredentialRule): CredentialRule {
    if (this.#data.secrets[rule.secret] === undefined) throw new AsbError('Invalid', `secret: no egress secret named "${rule.secret}"; PUT /v1/egress/secrets/${rule.secret} first`, { fields: [{ field: 'secret', message: 'no such secret' }] });
    this.#write({ ...this.#data, rules: { ...this.#data.rules, [rule.id]: rule } });
    return rule;
  }

  deleteRule(id: string): void {
    if (this.#data.rules[id] === undefined) throw new AsbError('NotFound', `no credential rule "${id}"`);
    this.#write({ ...this.#data, rules: Object.fromEntries(Object.entries(this.#data.rules).filter(([n]) => n !== id)) });
  }

  #write(next: FileShape): void {
    const tmp = `${this.#path}.${process.pid}.tmp`;
    writeFileSync(tmp, JSON.stringify(next), { mode: 0o600 });
    chmodSync(tmp, 0o600);
    renameSync(tmp, this.#path);
    this.#data = next;
    for (const l of this.#listeners) l();
  }
}
