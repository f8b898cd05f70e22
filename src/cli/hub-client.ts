// A typed client for the hub's admin API (src/hub/admin-api.ts), used by `asb cluster`, `asb key`
// and `asb template`. Failures are converted here, once: HubError when the hub answered with a
// problem (its code, detail and fields kept), HubUnreachableError when no answer came.
//
// Where the hub is: --hub-url / --hub-key flags, else ASB_HUB_URL / ASB_HUB_KEY in the
// environment, else the same env file the worker settings come from (.asb/env, see env-file.ts).
import { readFileSync } from 'node:fs';
import type { KubeObject } from '../api/meta.ts';
import type { SandboxTemplate } from '../api/types.ts';
import { AsbError, ERRORS, type ErrorCode, type FieldProblem } from '../errors.ts';
import type { ClusterInput, ClusterView } from '../hub/clusters.ts';
import type { KeyView } from '../hub/routes-keys.ts';
import type { FederationView } from '../hub/routes-federation.ts';
import type { HubStatusView } from '../hub/routes-system.ts';
import { ClientConfigError, findEnvFile, parseEnvFile } from './env-file.ts';

export type { ClusterView, FederationView, KeyView, HubStatusView };

export interface HubClientConfig {
  url: string;
  key: string | undefined;
}

export interface HubConfigSources {
  flags: { hubUrl?: string | undefined; hubKey?: string | undefined; envFile?: string | undefined };
  env: Readonly<Record<string, string | undefined>>;
  cwd: string;
  repoRoot?: string;
}

export function resolveHubClientConfig(src: HubConfigSources): HubClientConfig {
  const envFile = findEnvFile({ flags: src.flags.envFile === undefined ? {} : { envFile: src.flags.envFile }, env: src.env, cwd: src.cwd, ...(src.repoRoot === undefined ? {} : { repoRoot: src.repoRoot }) });
  const fromFile = envFile === undefined ? {} : parseEnvFile(readFileSync(envFile, 'utf8'));
  const pick = (flag: string | undefined, name: string): string | undefined => {
    const envValue = src.env[name];
    return flag ?? (envValue === undefined || envValue === '' ? undefined : envValue) ?? fromFile[name];
  };
  const url = pick(src.flags.hubUrl, 'ASB_HUB_URL');
  if (url === undefined || url === '') {
    const where = envFile === undefined ? 'no .asb/env was found' : `${envFile} has no ASB_HUB_URL`;
    throw new ClientConfigError(`no hub URL: ${where}. Set ASB_HUB_URL or pass --hub-url`);
  }
  if (!/^https?:\/\//.test(url)) throw new ClientConfigError(`hub URL must start with http:// or https://, got "${url}"`);
  return { url: url.replace(/\/+$/, ''), key: pick(src.flags.hubKey, 'ASB_HUB_KEY') };
}

/** The hub answered with an error. */
export class HubError extends AsbError {
  readonly httpStatus: number;
  constructor(httpStatus: number, code: ErrorCode, detail: string, fields: FieldProblem[]) {
    super(code, detail, { fields });
    this.name = 'HubError';
    this.httpStatus = httpStatus;
  }
}

/** No HTTP answer at all: connection refused, reset, DNS failure. */
export class HubUnreachableError extends AsbError {
  constructor(url: string, cause: unknown) {
    const inner = cause instanceof Error && cause.cause instanceof Error ? cause.cause : cause;
    const reason = typeof inner === 'object' && inner !== null && 'code' in inner && typeof inner.code === 'string' ? inner.code
      : inner instanceof Error ? inner.message
      : String(inner);
    super('Unavailable', `cannot reach the hub at ${url} (${reason}); is it running? Check ASB_HUB_URL or --hub-url`, { cause });
    this.name = 'HubUnreachableError';
  }
}

export interface ApplyResult { kind: string; namespace: string; name: string; action: 'created' | 'configured' | 'unchanged' }

export interface HubClient {
  readonly url: string;
  status(): Promise<HubStatusView>;
  listClusters(): Promise<{ items: ClusterView[] }>;
  /** Every cluster's health, drain, applied version and lag, as placement sees them (any key). */
  federation(): Promise<FederationView>;
  putCluster(name: string, input: ClusterInput): Promise<{ cluster: ClusterView; credential?: string }>;
  rotateCredential(name: string): Promise<{ cluster: ClusterView; credential: string }>;
  deleteCluster(name: string): Promise<ClusterView>;
  listKeys(): Promise<{ items: KeyView[] }>;
  createKey(req: { team: string; admin?: boolean; description?: string }): Promise<{ key: string; prefix: string; team: string; admin: boolean }>;
  revokeKey(prefix: string): Promise<KeyView>;
  listTemplates(): Promise<{ items: SandboxTemplate[] }>;
  apply(objects: KubeObject[]): Promise<{ results: ApplyResult[] }>;
}

export function createHubClient(config: HubClientConfig, doFetch: typeof fetch = fetch): HubClient {
  async function json<T>(method: string, path: string, body?: unknown): Promise<T> {
    const headers: Record<string, string> = { accept: 'application/json' };
    if (config.key !== undefined) headers.authorization = `Bearer ${config.key}`;
    if (body !== undefined) headers['content-type'] = 'application/json';
    let res: Response;
    try {
      res = await doFetch(config.url + path, { method, headers, ...(body === undefined ? {} : { body: JSON.stringify(body) }) });
    } catch (err) {
      throw new HubUnreachableError(config.url, err);
    }
    const text = await res.text();
    let parsed: unknown;
    try {
      parsed = text === '' ? undefined : JSON.parse(text);
    } catch {
      parsed = undefined;
    }
    if (!res.ok) throw hubError(res.status, parsed, text);
    if (parsed === undefined) throw new AsbError('Internal', `the hub sent a non-JSON answer to ${method} ${path} (HTTP ${res.status})`);
    return parsed as T;
  }
  const enc = encodeURIComponent;
  return {
    url: config.url,
    status: () => json('GET', '/v1/status'),
    listClusters: () => json('GET', '/v1/clusters'),
    federation: () => json('GET', '/v1/federation'),
    putCluster: (name, input) => json('PUT', `/v1/clusters/${enc(name)}`, input),
    rotateCredential: (name) => json('POST', `/v1/clusters/${enc(name)}/credential`),
    deleteCluster: (name) => json('DELETE', `/v1/clusters/${enc(name)}`),
    listKeys: () => json('GET', '/v1/keys'),
    createKey: (req) => json('POST', '/v1/keys', req),
    revokeKey: (prefix) => json('POST', `/v1/keys/${enc(prefix)}/revoke`),
    listTemplates: () => json('GET', '/v1/templates'),
    apply: (objects) => json('POST', '/v1/apply', { objects }),
  };
}

function hubError(status: number, parsed: unknown, text: string): HubError {
  const rec = typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed) ? (parsed as Record<string, unknown>) : {};
  const serverCode = typeof rec.code === 'string' ? rec.code : '';
  const code: ErrorCode = Object.hasOwn(ERRORS, serverCode) ? (serverCode as ErrorCode) : status >= 500 ? 'Internal' : 'BadRequest';
  let detail = typeof rec.detail === 'string' ? rec.detail : `HTTP ${status}${text.trim() === '' ? '' : `: ${text.trim().slice(0, 200)}`}`;
  if (code === 'Unauthorized') detail += '\nhint: set ASB_HUB_KEY or pass --hub-key (the hub writes its admin key to its --admin-key-file)';
  const fields: FieldProblem[] = [];
  if (Array.isArray(rec.fields)) {
    for (const f of rec.fields as unknown[]) {
      if (typeof f === 'object' && f !== null && 'field' in f && typeof f.field === 'string') {
        fields.push({ field: f.field, message: 'message' in f && typeof f.message === 'string' ? f.message : '' });
      }
    }
  }
  return new HubError(status, code, detail, fields);
}
