// A real worker API on port 0 over the real SQLite store and operator, with an in-memory pod
// runtime (pods are "running" at once; exec runs on the host's /bin/sh; files live in a Map), and
// three API keys: an admin, team-a and team-b.
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { Registry } from 'prom-client';
import type { SandboxTemplate } from '../../src/api/types.ts';
import { SandboxTemplateType } from '../../src/api/types.ts';
import { createApiKey } from '../../src/auth/keys.ts';
import { KeyRing } from '../../src/auth/keyring.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';
import type { EgressPolicy } from '../../src/network/egress-policy.ts';
import { startOperator } from '../../src/operator/operator.ts';
import { startLifecycleEvents, type LifecycleEvents, type LifecycleEventsOptions } from '../../src/events/lifecycle-events.ts';
import { EventLog } from '../../src/events/event-log.ts';
import type { ExecRequest, ExecResult, FileEntry, PodRequest, PodRuntime, PodProcess, PodState, PtySession } from '../../src/runtime/runtime.ts';
import { openSqliteStore } from '../../src/store/sqlite.ts';
import type { ObjectStore } from '../../src/store/store.ts';
import { CredentialStore } from '../../src/egress/credential-store.ts';
import { systemClock, type Clock } from '../../src/base/clock.ts';
import { silentLogger } from '../../src/base/log.ts';
import type { WorkerLimits } from '../../src/worker/deps.ts';
import type { SandboxCallLimits } from '../../src/worker/sandbox-calls.ts';
import { createWorkerServer, type WorkerServer } from '../../src/worker/server.ts';
import type { TemplateBuilds } from '../../src/builds/service.ts';

function enoent(path: string): Error {
  return Object.assign(new Error(`ENOENT: no such file or directory, '${path}'`), { code: 'ENOENT' });
}

export class MemoryRuntime implements PodRuntime {
  /** The egress policy each pod last got (start's request, or setEgressPolicy). */
  readonly egress = new Map<string, EgressPolicy>();
  readonly #pods = new Map<string, PodState>();
  readonly #files = new Map<string, Map<string, Uint8Array>>();
  readonly #listeners = new Set<(id: string) => void>();
  #nextIp = 2;

  #set(id: string, state: PodState): void {
    this.#pods.set(id, state);
    queueMicrotask(() => {
      for (const l of this.#listeners) l(id);
    });
  }
  setEgressPolicy(id: string, policy: EgressPolicy): Promise<void> {
    this.egress.set(id, policy);
    return Promise.resolve();
  }
  start(pod: PodRequest): Promise<PodState> {
    if (pod.egress !== undefined) this.egress.set(pod.id, pod.egress);
    const prev = this.#pods.get(pod.id);
    if (prev !== undefined && prev.uid !== pod.uid) return Promise.reject(new Error(`memory runtime: pod ${pod.id} belongs to uid ${prev.uid ?? ''}, not ${pod.uid}`));
    if (prev?.phase === 'Running') return Promise.resolve(prev);
    const state: PodState = { phase: 'Running', ready: true, uid: pod.uid, ip: prev?.ip ?? `10.99.0.${this.#nextIp++}`, startedAt: new Date().toISOString() };
    if (!this.#files.has(pod.id)) this.#files.set(pod.id, new Map());
    this.#set(pod.id, state);
    return Promise.resolve(state);
  }
  stop(id: string): Promise<void> {
    const prev = this.#pods.get(id);
    if (prev !== undefined && prev.phase !== 'Stopped') this.#set(id, { phase: 'Stopped', ready: false, ...(prev.uid === undefined ? {} : { uid: prev.uid }), ...(prev.ip === undefined ? {} : { ip: prev.ip }) });
    return Promise.resolve();
  }
  remove(id: string): Promise<void> {
    this.#files.delete(id);
    if (this.#pods.delete(id)) queueMicrotask(() => { for (const l of this.#listeners) l(id); });
    return Promise.resolve();
  }
  state(id: string): PodState {
    return this.#pods.get(id) ?? { phase: 'Absent', ready: false };
  }
  list(): string[] {
    return [...this.#pods.keys()];
  }
  onChange(listener: (id: string) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }
  exec(_id: string, req: ExecRequest): Promise<ExecResult> {
    const [file, ...args] = req.command;
    return new Promise((resolve) => {
      const child = execFile(file ?? '/bin/true', args, { encoding: 'buffer', cwd: req.cwd ?? '/', env: { PATH: '/usr/bin:/bin', ...req.env }, ...(req.timeoutMs === undefined ? {} : { timeout: req.timeoutMs }) }, (err, stdout, stderr) => {
        const code = err === null ? 0 : typeof err.code === 'number' ? err.code : 1;
        resolve({ exitCode: code, stdout, stderr, timedOut: err?.killed === true, truncated: false });
      });
      // The command may exit without reading stdin; the broken pipe is not an exec failure.
      child.stdin?.on('error', () => undefined);
      child.stdin?.end(req.stdin ?? '');
    });
  }
  #fs(id: string): Map<string, Uint8Array> {
    const fs = this.#files.get(id);
    if (fs === undefined) throw new Error(`pod ${id} has no filesystem`);
    return fs;
  }
  readFile(id: string, path: string): Promise<Uint8Array> {
    const data = this.#fs(id).get(path);
    return data === undefined ? Promise.reject(enoent(path)) : Promise.resolve(data);
  }
  /** Like the real runtimes, the file is set only once the whole stream arrived; a failed stream leaves it as it was. */
  async writeFile(id: string, path: string, data: Uint8Array | AsyncIterable<Uint8Array>): Promise<void> {
    const fs = this.#fs(id);
    const chunks: Uint8Array[] = [];
    if (data instanceof Uint8Array) chunks.push(data);
    else for await (const chunk of data) chunks.push(chunk);
    fs.set(path, new Uint8Array(Buffer.concat(chunks)));
  }
  listDir(id: string, path: string): Promise<FileEntry[]> {
    const dir = path.endsWith('/') && path !== '/' ? path.slice(0, -1) : path;
    const entries: FileEntry[] = [];
    for (const [p, data] of this.#fs(id)) {
      if (dirname(p) === dir) entries.push({ name: p.slice(dir === '/' ? 1 : dir.length + 1), path: p, type: 'file', size: data.byteLength, mode: 0o644, mtime: new Date(0).toISOString() });
    }
    if (entries.length === 0 && dir !== '/') return Promise.reject(enoent(path));
    return Promise.resolve(entries);
  }
  openPty(): Promise<PtySession> {
    return Promise.reject(new Error('no pty in the memory runtime'));
  }
  spawn(): Promise<PodProcess> {
    return Promise.reject(new Error('no processes in the memory runtime'));
  }
  close(): Promise<void> {
    return Promise.resolve();
  }
}

export const BASE_TEMPLATE: SandboxTemplate = {
  apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
  kind: 'SandboxTemplate',
  metadata: { name: 'base', namespace: 'default' },
  spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox', command: ['sleep', 'infinity'] }] } } },
};

export interface WorkerFixture {
  url: string;
  store: ObjectStore;
  registry: Registry;
  runtime: MemoryRuntime;
  server: WorkerServer;
  /** With opts.events: the lifecycle events (recorder, webhook sender) and their log. opts.events.webhooks.allowPrivate is the worker's --webhook-allow-private, for both the sender and registration. */
  events?: LifecycleEvents;
  eventLog?: EventLog;
  keys: { admin: string; teamA: string; teamB: string };
}

/** Starts everything; registers cleanup with `after` (the test's t.after). */
/** `opts.eventRetention`: how many changes the store keeps for watches (older versions are Gone); `opts.clock`: the worker API's clock; `opts.sandboxCallLimits`: processes and terminals per sandbox. */
export async function startWorkerFixture(after: (fn: () => Promise<void>) => void, limits: Partial<WorkerLimits> = {}, opts: { eventRetention?: number; clock?: Clock; egressProxy?: boolean; sandboxCallLimits?: SandboxCallLimits; builds?: (store: ObjectStore, dir: string) => TemplateBuilds; events?: Omit<LifecycleEventsOptions, 'store' | 'log' | 'clock' | 'events' | 'instance'> & { retentionMs?: number } } = {}): Promise<WorkerFixture> {
  const dir = await mkdtemp(join(tmpdir(), 'asb-worker-'));
  const log = silentLogger();
  const registry = new Registry();
  const metrics = createMetrics(registry);
  const store = await openSqliteStore({ path: join(dir, 'store.db'), metrics, log, ...(opts.eventRetention === undefined ? {} : { eventRetention: opts.eventRetention }) });
  const runtime = new MemoryRuntime();
  const operator = await startOperator({ store, runtime, log, metrics, clusterTag: 'tst1' });
  await store.create(SandboxTemplateType, structuredClone(BASE_TEMPLATE));
  const admin = await createApiKey(store, { team: 'ops', admin: true });
  const teamA = await createApiKey(store, { team: 'team-a' });
  const teamB = await createApiKey(store, { team: 'team-b' });
  const auth = await KeyRing.open({ store, log });
  const egressCredentials = new CredentialStore(join(dir, 'egress'), opts.clock ?? systemClock);
  const builds = opts.builds?.(store, dir);
  const eventLog = opts.events === undefined ? undefined : new EventLog({ dir: join(dir, 'events'), now: () => (opts.clock ?? systemClock).now(), ...(opts.events.retentionMs === undefined ? {} : { retentionMs: opts.events.retentionMs }) });
  const events = opts.events === undefined || eventLog === undefined ? undefined : await startLifecycleEvents({ store, log, clock: opts.clock ?? systemClock, events: eventLog, instance: 'tst1', metrics, ...(opts.events.webhooks === undefined ? {} : { webhooks: opts.events.webhooks }) });
  const server = await createWorkerServer({ store, runtime, operator, auth, registry, metrics, log, egressCredentials, egressProxy: opts.egressProxy ?? true, cluster: { name: 'test', tag: 'tst1' }, version: '0.1.0-test', limits, ...(eventLog === undefined ? {} : { events: { log: eventLog } }), webhookAllowPrivate: opts.events?.webhooks?.allowPrivate ?? false, ...(builds === undefined ? {} : { builds }), ...(opts.clock === undefined ? {} : { clock: opts.clock }), ...(opts.sandboxCallLimits === undefined ? {} : { sandboxCallLimits: opts.sandboxCallLimits }) });
  const address = await server.listen(0, '127.0.0.1');
  after(async () => {
    await server.close();
    await events?.close();
    eventLog?.close();
    await builds?.close();
    auth.close();
    await operator.close();
    await runtime.close();
    await store.close();
    await rm(dir, { recursive: true, force: true });
  });
  return { url: `http://127.0.0.1:${address.port}`, store, registry, runtime, server, ...(events === undefined ? {} : { events }), ...(eventLog === undefined ? {} : { eventLog }), keys: { admin: admin.key, teamA: teamA.key, teamB: teamB.key } };
}

export interface ApiResponse {
  status: number;
  headers: Headers;
  json: unknown;
  text: string;
  bytes: Uint8Array;
}

export interface CallOptions {
  key?: string;
  json?: unknown;
  body?: string | Uint8Array;
  headers?: Record<string, string>;
}

export async function call(fx: { url: string }, method: string, path: string, opts: CallOptions = {}): Promise<ApiResponse> {
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.key !== undefined) headers.authorization = `Bearer ${opts.key}`;
  let body: string | Uint8Array | undefined = opts.body;
  if (opts.json !== undefined) {
    body = JSON.stringify(opts.json);
    headers['content-type'] ??= 'application/json';
  }
  const res = await fetch(fx.url + path, { method, headers, ...(body === undefined ? {} : { body }) });
  const bytes = new Uint8Array(await res.arrayBuffer());
  const text = new TextDecoder().decode(bytes);
  const type = res.headers.get('content-type') ?? '';
  const json: unknown = type.includes('json') && text !== '' ? JSON.parse(text) : undefined;
  return { status: res.status, headers: res.headers, json, text, bytes };
}
