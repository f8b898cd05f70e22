// A typed client for the worker REST API (docs/api-surface.md): one method per route. Every
// failure is converted here, once, into an AsbError subclass: ApiError when the server answered
// with a problem (its code, detail and field list kept as sent), ApiUnreachableError when no
// answer came at all. Callers switch on the class and `code`, never on messages.
import type { Delivery, LifecycleEvent, Webhook } from '../events/event-log.ts';
import { createReadStream, statSync } from 'node:fs';
import { Readable } from 'node:stream';
import { AsbError, ERRORS, type ErrorCode, type FieldProblem } from '../errors.ts';
import type { KubeObject } from '../api/meta.ts';
import type { SandboxClaim, SandboxPhase, SandboxTemplate, SandboxWarmPool } from '../api/types.ts';
import type { FileEntry } from '../runtime/runtime.ts';
import type { SandboxView } from '../api/views.ts';
import type { SnapshotView } from '../api/views.ts';
import type { BuiltTemplateView } from '../builds/contract.ts';
import type { BuildLogEntry, BuildPhase, BuildSpec, BuildStatus } from '../builds/contract.ts';

export type { BuildLogEntry, BuildPhase, BuildSpec, BuildStatus };

/** One page of a build's log (GET /v1/templates/{name}/builds/{id}/logs). */
export interface BuildLogPage {
  entries: BuildLogEntry[];
  /** The offset to ask for next. */
  offset: number;
  phase: BuildPhase;
  reason?: BuildStatus['reason'];
  image?: string;
}

export type { SnapshotView, BuiltTemplateView };

export type { FileEntry };

// The wire shape is defined once, by the server that produces it.
export type { SandboxView };

export interface StatusView {
  cluster: { name: string; tag: string };
  pools: { namespace: string; name: string; template: string; replicas: number; readyReplicas: number }[];
  sandboxes: Partial<Record<SandboxPhase, number>> & Record<string, number>;
  version: string;
}

export type ApplyAction = 'created' | 'configured' | 'unchanged';

export interface ApplyResult {
  kind: string;
  namespace: string;
  name: string;
  action: ApplyAction;
}

export interface CreateSandboxRequest {
  template?: string;
  namespace?: string;
  labels?: Record<string, string>;
  timeoutMs?: number;
  idleTimeoutMs?: number;
  wait?: boolean;
  coldStart?: boolean;
  /** At the hub or an edge: the preferred region (others are the failover). */
  region?: string;
  /** At the hub or an edge: the only cluster to try. */
  cluster?: string;
  /** Environment for every command run in the sandbox. */
  env?: Record<string, string>;
  /** Replaces the template's egress policy (src/network/egress-policy.ts). */
  network?: { internet?: boolean | undefined; allow?: string[] | undefined; deny?: string[] | undefined };
}

export interface ListSandboxesQuery {
  limit?: number;
  continue?: string;
  labelSelector?: string;
  template?: string;
  phase?: string;
}

export interface ExecRequest {
  /** An argv, or a string the sandbox runs with `sh -c`. */
  command: string[] | string;
  stdin?: string;
  env?: Record<string, string>;
  cwd?: string;
  timeoutMs?: number;
}

export interface ExecResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  /** Output passed the server's cap (8 MiB per stream) and was cut. */
  truncated?: boolean;
  /** The signal that ended the command, e.g. SIGKILL. */
  signal?: string;
}

/** A credential injection rule (src/egress/credentials.ts): the secret by name, never its value. */
export interface CredentialRuleView {
  id: string;
  host: string;
  pathPrefix?: string;
  header: string;
  secret: string;
}

export interface ApiClientOptions {
  /** Base URL of the worker API, e.g. http://127.0.0.1:8080 */
  url: string;
  /** API key, sent as `Authorization: Bearer <key>`. Omitted: requests go unauthenticated. */
  key?: string;
  /** Injected for tests; default the global fetch. */
  fetch?: typeof fetch;
}

/** The server answered with an error (problem+json, or anything else non-2xx). */
export class ApiError extends AsbError {
  /** The HTTP status the server sent (may differ from ERRORS[code].status for unknown codes). */
  readonly httpStatus: number;
  /** The server's `code` exactly as sent, even when it is not one we know. */
  readonly serverCode: string;
  readonly detail: string;

  constructor(httpStatus: number, serverCode: string, detail: string, fields: FieldProblem[]) {
    super(knownCode(serverCode, httpStatus), detail, { fields });
    this.name = 'ApiError';
    this.httpStatus = httpStatus;
    this.serverCode = serverCode;
    this.detail = detail;
  }
}

/** No HTTP answer at all: connection refused, DNS failure, reset. */
export class ApiUnreachableError extends AsbError {
  readonly url: string;

  constructor(url: string, cause: unknown) {
    super('Unavailable', `cannot reach the worker at ${url}: ${causeText(cause)}`, { cause });
    this.name = 'ApiUnreachableError';
    this.url = url;
  }
}

export interface ApiClient {
  readonly url: string;
  healthz(): Promise<{ ok: boolean }>;
  metrics(): Promise<string>;
  status(): Promise<StatusView>;
  apply(objects: KubeObject[]): Promise<{ results: ApplyResult[] }>;

  listTemplates(): Promise<{ items: SandboxTemplate[] }>;
  getTemplate(name: string, namespace?: string): Promise<SandboxTemplate>;
  putTemplate(template: SandboxTemplate): Promise<SandboxTemplate>;
  deleteTemplate(name: string, namespace?: string): Promise<SandboxTemplate>;

  listPools(): Promise<{ items: SandboxWarmPool[] }>;
  getPool(name: string, namespace?: string): Promise<SandboxWarmPool>;
  putPool(pool: SandboxWarmPool): Promise<SandboxWarmPool>;
  deletePool(name: string, namespace?: string): Promise<SandboxWarmPool>;

  createSandbox(req: CreateSandboxRequest, opts?: { signal?: AbortSignal }): Promise<SandboxView>;
  listSandboxes(query?: ListSandboxesQuery): Promise<{ items: SandboxView[]; continue?: string }>;
  getSandbox(id: string): Promise<SandboxView>;
  deleteSandbox(id: string): Promise<SandboxView>;
  exec(id: string, req: ExecRequest): Promise<ExecResult>;
  readFile(id: string, path: string): Promise<Uint8Array>;
  writeFile(id: string, path: string, data: Uint8Array): Promise<void>;
  listFiles(id: string, path: string): Promise<{ entries: FileEntry[] }>;
  /** memory: true keeps memory and processes or fails, false keeps files only; absent: the sandbox's suspensionStrategy. */
  pause(id: string, opts?: { memory?: boolean; wait?: boolean }): Promise<SandboxView>;
  resume(id: string, opts?: { wait?: boolean; signal?: AbortSignal }): Promise<SandboxView>;
  setTimeout(id: string, timeoutMs: number): Promise<SandboxView>;
  /** A new access token for the sandbox; every earlier one stops working. */
  rotateAccessToken(id: string): Promise<SandboxView>;

  /** Snapshots (src/worker/routes-snapshots.ts): `memory` absent keeps it where the sandbox can. */
  createSnapshot(id: string, req: { name?: string; memory?: boolean }): Promise<SnapshotView>;
  listSnapshots(): Promise<{ items: SnapshotView[] }>;
  getSnapshot(id: string): Promise<SnapshotView>;
  deleteSnapshot(id: string): Promise<SnapshotView>;
  startFromSnapshot(id: string, req: { timeoutMs?: number; labels?: Record<string, string>; wait?: boolean }): Promise<SandboxView>;
  fork(id: string, req: { count?: number; timeoutMs?: number }): Promise<{ forks: ForkView[] }>;

  /** The team's lifecycle events of one sandbox (oldest first) and its webhooks; a webhook's secret goes in and never comes back. */
  sandboxEvents(id: string, query?: { limit?: number; types?: string }): Promise<LifecycleEvent[]>;
  listWebhooks(): Promise<Webhook[]>;
  createWebhook(req: { url: string; signatureSecret: string; name?: string; events?: string[] }): Promise<Webhook>;
  deleteWebhook(id: string): Promise<void>;
  webhookDeliveries(id: string): Promise<Delivery[]>;

  /** Egress secrets (admin): names and times only; a value goes in and never comes back. */
  listEgressSecrets(): Promise<{ items: { name: string; updatedAt: string }[] }>;
  putEgressSecret(name: string, value: string): Promise<{ name: string; updatedAt: string }>;
  deleteEgressSecret(name: string): Promise<void>;
  listCredentialRules(): Promise<{ items: CredentialRuleView[] }>;
  putCredentialRule(id: string, rule: Omit<CredentialRuleView, 'id'>): Promise<CredentialRuleView>;
  deleteCredentialRule(id: string): Promise<void>;

  /** Whether the caller's team has uploaded the build files (a tar) with this sha256. */
  hasBuildFiles(template: string, sha256: string): Promise<boolean>;
  /** Uploads a tar from a file on disk, streamed; the server stores it only if its sha256 is the one named. */
  uploadBuildFiles(template: string, sha256: string, file: string): Promise<{ sha256: string; bytes?: number }>;
  startBuild(template: string, spec: BuildSpec): Promise<{ templateId: string; buildId: string; phase: BuildPhase }>;
  getBuild(template: string, buildId: string): Promise<BuildStatus>;
  buildLogs(template: string, buildId: string, offset: number): Promise<BuildLogPage>;
  /** The caller's team's built templates (GET /v1/built-templates). */
  listBuiltTemplates(): Promise<{ items: BuiltTemplateView[] }>;

  listClaims(): Promise<{ items: SandboxClaim[] }>;
  getClaim(name: string, namespace?: string): Promise<SandboxClaim>;
  deleteClaim(name: string, namespace?: string): Promise<SandboxClaim>;
}

interface RequestSpec {
  method: 'GET' | 'POST' | 'PUT' | 'DELETE';
  path: string;
  query?: Record<string, string | number | undefined>;
  json?: unknown;
  bytes?: Uint8Array;
  /** A file on disk sent as the body, streamed (never read whole into memory). */
  file?: string;
  signal?: AbortSignal | undefined;
}

export function createApiClient(opts: ApiClientOptions): ApiClient {
  const base = opts.url.replace(/\/+$/, '');
  const doFetch = opts.fetch ?? fetch;

  async function send(spec: RequestSpec): Promise<Response> {
    const url = new URL(base + spec.path);
    for (const [k, v] of Object.entries(spec.query ?? {})) {
      if (v !== undefined) url.searchParams.set(k, String(v));
    }
    const headers: Record<string, string> = { accept: 'application/json' };
    if (opts.key !== undefined) headers.authorization = `Bearer ${opts.key}`;
    let body: string | Uint8Array | ReadableStream | undefined;
    if (spec.json !== undefined) {
      headers['content-type'] = 'application/json';
      body = JSON.stringify(spec.json);
    } else if (spec.bytes !== undefined) {
      headers['content-type'] = 'application/octet-stream';
      body = spec.bytes;
    } else if (spec.file !== undefined) {
      headers['content-type'] = 'application/octet-stream';
      headers['content-length'] = String(statSync(spec.file).size);
      body = Readable.toWeb(createReadStream(spec.file)) as ReadableStream;
    }
    let res: Response;
    try {
      res = await doFetch(url, {
        method: spec.method,
        headers,
        ...(body === undefined ? {} : { body }),
        ...(body instanceof ReadableStream ? { duplex: 'half' } : {}),
        ...(spec.signal === undefined ? {} : { signal: spec.signal }),
      });
    } catch (err) {
      if (spec.signal?.aborted === true) throw err;
      throw new ApiUnreachableError(base, err);
    }
    if (!res.ok) throw await problemOf(res);
    return res;
  }

  async function json<T>(spec: RequestSpec): Promise<T> {
    const res = await send(spec);
    const text = await res.text();
    try {
      return JSON.parse(text) as T;
    } catch (err) {
      throw new AsbError('Internal', `the worker sent a non-JSON answer to ${spec.method} ${spec.path} (HTTP ${res.status})`, { cause: err });
    }
  }

  const enc = encodeURIComponent;
  const nsQuery = (namespace: string | undefined): Record<string, string | undefined> => ({ namespace });
  const objNs = (o: KubeObject): string => o.metadata.namespace ?? 'default';

  return {
    url: base,
    healthz: () => json({ method: 'GET', path: '/healthz' }),
    metrics: async () => (await send({ method: 'GET', path: '/metrics' })).text(),
    status: () => json({ method: 'GET', path: '/v1/status' }),
    apply: (objects) => json({ method: 'POST', path: '/v1/apply', json: { objects } }),

    listTemplates: () => json({ method: 'GET', path: '/v1/templates' }),
    getTemplate: (name, namespace) => json({ method: 'GET', path: `/v1/templates/${enc(name)}`, query: nsQuery(namespace) }),
    putTemplate: (t) => json({ method: 'PUT', path: `/v1/templates/${enc(t.metadata.name)}`, query: { namespace: objNs(t) }, json: t }),
    deleteTemplate: (name, namespace) => json({ method: 'DELETE', path: `/v1/templates/${enc(name)}`, query: nsQuery(namespace) }),

    listPools: () => json({ method: 'GET', path: '/v1/pools' }),
    getPool: (name, namespace) => json({ method: 'GET', path: `/v1/pools/${enc(name)}`, query: nsQuery(namespace) }),
    putPool: (p) => json({ method: 'PUT', path: `/v1/pools/${enc(p.metadata.name)}`, query: { namespace: objNs(p) }, json: p }),
    deletePool: (name, namespace) => json({ method: 'DELETE', path: `/v1/pools/${enc(name)}`, query: nsQuery(namespace) }),

    createSandbox: (req, o) => json({ method: 'POST', path: '/v1/sandboxes', json: req, signal: o?.signal }),
    listSandboxes: (q) => json({ method: 'GET', path: '/v1/sandboxes', query: { ...q } }),
    getSandbox: (id) => json({ method: 'GET', path: `/v1/sandboxes/${enc(id)}` }),
    deleteSandbox: (id) => json({ method: 'DELETE', path: `/v1/sandboxes/${enc(id)}` }),
    exec: (id, req) => json({ method: 'POST', path: `/v1/sandboxes/${enc(id)}/exec`, json: req }),
    readFile: async (id, path) => {
      const res = await send({ method: 'GET', path: `/v1/sandboxes/${enc(id)}/files`, query: { path } });
      return new Uint8Array(await res.arrayBuffer());
    },
    writeFile: async (id, path, data) => {
      const res = await send({ method: 'PUT', path: `/v1/sandboxes/${enc(id)}/files`, query: { path }, bytes: data });
      await res.body?.cancel();
    },
    listFiles: (id, path) => json({ method: 'GET', path: `/v1/sandboxes/${enc(id)}/files/list`, query: { path } }),
    pause: (id, o) => json({ method: 'POST', path: `/v1/sandboxes/${enc(id)}/pause`, ...(o === undefined ? {} : { json: o }) }),
    resume: (id, o) => json({ method: 'POST', path: `/v1/sandboxes/${enc(id)}/resume`, json: o?.wait === undefined ? {} : { wait: o.wait }, signal: o?.signal }),
    setTimeout: (id, timeoutMs) => json({ method: 'POST', path: `/v1/sandboxes/${enc(id)}/timeout`, json: { timeoutMs } }),
    rotateAccessToken: (id) => json({ method: 'POST', path: `/v1/sandboxes/${enc(id)}/access-token`, json: {} }),
    createSnapshot: (id, req) => json({ method: 'POST', path: `/v1/sandboxes/${enc(id)}/snapshots`, json: req }),
    listSnapshots: () => json({ method: 'GET', path: '/v1/snapshots' }),
    getSnapshot: (id) => json({ method: 'GET', path: `/v1/snapshots/${enc(id)}` }),
    deleteSnapshot: (id) => json({ method: 'DELETE', path: `/v1/snapshots/${enc(id)}` }),
    startFromSnapshot: (id, req) => json({ method: 'POST', path: `/v1/snapshots/${enc(id)}/sandboxes`, json: req }),
    fork: (id, req) => json({ method: 'POST', path: `/v1/sandboxes/${enc(id)}/fork`, json: req }),

    sandboxEvents: (id, q) => json({ method: 'GET', path: `/v1/events/sandboxes/${enc(id)}`, query: { orderAsc: 'true', limit: q?.limit ?? 100, ...(q?.types === undefined ? {} : { types: q.types }) } }),
    listWebhooks: () => json({ method: 'GET', path: '/v1/events/webhooks' }),
    createWebhook: (req) => json({ method: 'POST', path: '/v1/events/webhooks', json: req }),
    deleteWebhook: async (id) => {
      await (await send({ method: 'DELETE', path: `/v1/events/webhooks/${enc(id)}` })).body?.cancel();
    },
    webhookDeliveries: (id) => json({ method: 'GET', path: `/v1/events/webhooks/${enc(id)}/deliveries` }),
    listEgressSecrets: () => json({ method: 'GET', path: '/v1/egress/secrets' }),
    putEgressSecret: (name, value) => json({ method: 'PUT', path: `/v1/egress/secrets/${enc(name)}`, json: { value } }),
    deleteEgressSecret: async (name) => {
      await (await send({ method: 'DELETE', path: `/v1/egress/secrets/${enc(name)}` })).body?.cancel();
    },
    listCredentialRules: () => json({ method: 'GET', path: '/v1/egress/credentials' }),
    putCredentialRule: (id, rule) => json({ method: 'PUT', path: `/v1/egress/credentials/${enc(id)}`, json: rule }),
    deleteCredentialRule: async (id) => {
      await (await send({ method: 'DELETE', path: `/v1/egress/credentials/${enc(id)}` })).body?.cancel();
    },

    hasBuildFiles: async (template, sha256) => {
      try {
        await json({ method: 'GET', path: `/v1/templates/${enc(template)}/files/${enc(sha256)}` });
        return true;
      } catch (err) {
        if (err instanceof ApiError && err.httpStatus === 404) return false;
        throw err;
      }
    },
    uploadBuildFiles: (template, sha256, file) => json({ method: 'PUT', path: `/v1/templates/${enc(template)}/files/${enc(sha256)}`, file }),
    startBuild: (template, spec) => json({ method: 'POST', path: `/v1/templates/${enc(template)}/builds`, json: spec }),
    getBuild: (template, buildId) => json({ method: 'GET', path: `/v1/templates/${enc(template)}/builds/${enc(buildId)}` }),
    buildLogs: (template, buildId, offset) => json({ method: 'GET', path: `/v1/templates/${enc(template)}/builds/${enc(buildId)}/logs`, query: { offset } }),
    listBuiltTemplates: () => json({ method: 'GET', path: '/v1/built-templates' }),

    listClaims: () => json({ method: 'GET', path: '/v1/claims' }),
    getClaim: (name, namespace) => json({ method: 'GET', path: `/v1/claims/${enc(name)}`, query: nsQuery(namespace) }),
    deleteClaim: (name, namespace) => json({ method: 'DELETE', path: `/v1/claims/${enc(name)}`, query: nsQuery(namespace) }),
  };
}

/** The worker's URL is <scheme>://<defaultPort>-<id>.<domain>[:<edge port>]; another port swaps the leading label's port. */
export function sandboxUrlFor(defaultUrl: string, defaultPort: number, port: number): string {
  return defaultUrl.replace(`//${defaultPort}-`, `//${port}-`);
}

/** Reads an error response: problem+json when the server sent it, else the status and body text. */
async function problemOf(res: Response): Promise<ApiError> {
  const text = await res.text().catch(() => '');
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  if (isRecord(parsed)) {
    const code = typeof parsed.code === 'string' ? parsed.code : '';
    const detail = typeof parsed.detail === 'string' ? parsed.detail
      : typeof parsed.message === 'string' ? parsed.message
      : typeof parsed.title === 'string' ? parsed.title
      : `HTTP ${res.status}`;
    return new ApiError(res.status, code, detail, fieldsOf(parsed.fields));
  }
  const snippet = text.trim().slice(0, 200);
  return new ApiError(res.status, '', snippet === '' ? `HTTP ${res.status} ${res.statusText}` : `HTTP ${res.status}: ${snippet}`, []);
}

function fieldsOf(raw: unknown): FieldProblem[] {
  if (!Array.isArray(raw)) return [];
  const out: FieldProblem[] = [];
  for (const f of raw as unknown[]) {
    if (isRecord(f) && typeof f.field === 'string') out.push({ field: f.field, message: typeof f.message === 'string' ? f.message : '' });
  }
  return out;
}

/** Maps the server's code onto our catalogue; an unknown one falls back on the HTTP status. */
function knownCode(code: string, status: number): ErrorCode {
  if (Object.hasOwn(ERRORS, code)) return code as ErrorCode;
  if (status === 401) return 'Unauthorized';
  if (status === 403) return 'Forbidden';
  if (status === 404) return 'NotFound';
  if (status === 409) return 'Conflict';
  if (status === 422) return 'Invalid';
  if (status === 503) return 'Unavailable';
  if (status === 504) return 'Timeout';
  if (status >= 400 && status < 500) return 'BadRequest';
  return 'Internal';
}

function causeText(err: unknown): string {
  // undici wraps the socket error: fetch failed -> cause ECONNREFUSED.
  const inner = err instanceof Error && err.cause instanceof Error ? err.cause : err;
  if (isRecord(inner) && typeof inner.code === 'string') return inner.code;
  return inner instanceof Error ? inner.message : String(inner);
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
/** One fork's outcome: its sandbox, or why it did not start. */
export type ForkView = { sandbox: SandboxView } | { error: { code: string; status: number; message: string } };


