// The E2B control-plane REST API (research e2b.md §2), so the unmodified `e2b` SDKs work against
// a worker: apiUrl = the worker's API URL, apiKey = one of our API keys. Create and connect are
// served at both /sandboxes… (SDK ≤ 2.50) and /v2/sandboxes… (2.51 on). The sandbox ids, tokens,
// templates and tenancy are ours: E2B's `sandboxID` is our id, `envdAccessToken` our data-plane
// access token, `templateID` one of our templates, and another team's sandbox is a 404.
//
//   POST   /sandboxes, /v2/sandboxes                   create: 201 Sandbox
//   GET    /sandboxes, /v2/sandboxes                   list: ListedSandbox[], X-Next-Token
//   GET    /sandboxes/{id}                             SandboxDetail (paused ones too)
//   DELETE /sandboxes/{id}                             kill: 204
//   POST   /sandboxes/{id}/connect, /v2/…/connect      200 running, 201 resumed from pause;
//                                                      {memory: false} (on_resume "reboot") asks for a start from its files
//   POST   /sandboxes/{id}/timeout                     204
//   POST   /sandboxes/{id}/pause                       204 once saved; 409 when already paused; see pause()
//   GET    /sandboxes/{id}/metrics                     one sample now, [] when not running
//   PUT    /sandboxes/{id}/network                     replaces the egress policy: 204
//
// `allow_internet_access` and `network.allowOut`/`denyOut` are the sandbox's egress policy
// (src/api/sandbox-network.ts e2bNetwork); network options we cannot honour (transform
// rules, an egress proxy) are refused with 422. Other fields the SDK sends (secure, mcp, iam…)
// are ignored, except those whose absence would surprise the caller (volumeMounts), which are
// refused with 400. `lifecycle` (autoPause, autoPauseMemory, autoResume) makes the sandbox pause
// at its timeout instead of being deleted: shutdownPolicy Suspend, with memory unless
// autoPauseMemory is false (suspensionStrategy Hibernate or Stop).
import type { IncomingHttpHeaders } from 'node:http';
import type { Sandbox } from '../../api/types.ts';
import { sandboxLifecycle, wantsRunning } from '../../api/types.ts';
import { describeFailure, sandboxFailure } from '../../api/sandbox-failure.ts';
import { AsbError } from '../../errors.ts';
import { e2bNetwork } from '../../api/sandbox-network.ts';
import { requireProxyForDomains } from '../egress-domains.ts';
import { findSandbox, sandboxNotFound } from '../access.ts';
import { readJson } from '../../http/body.ts';
import { MAX_TIMEOUT_MS } from '../create-body.ts';
import type { WorkerContext } from '../deps.ts';
import type { Authenticator } from '../../auth/keyring.ts';
import { checkBody, checkSpawnInput, type BodyOf, type BodySpec } from '../input.ts';
import { isPlainObject } from '../../http/body.ts';
import type { Reply, Route } from '../../http/router.ts';
import { sandboxView } from '../views.ts';
import { claimSandbox, deleteSandbox, pauseSandbox, resumeSandbox, setNetwork, setShutdownIn, waitReady } from '../sandbox-lifecycle.ts';
import { findSnapshot, startFromSnapshot } from '../snapshots.ts';
import { listE2bSandboxes } from './list.ts';
import { sampleMetrics } from './metrics.ts';
import { e2bRoute, type AuthedContext } from './reply.ts';
import { E2B_ANNOTATION, e2bSandbox, e2bSandboxDetail, stateOf } from './shape.ts';

/** E2B's default sandbox lifetime when create or connect names none: 5 minutes. */
const DEFAULT_TIMEOUT_S = 300;
const MAX_TIMEOUT_S = MAX_TIMEOUT_MS / 1000;

/** Create's fields this API acts on (the hub reads templateID from it to place a create). */
export const CREATE_BODY = {
  templateID: { kind: 'string', min: 1, max: 253 },
  metadata: { kind: 'stringMap' },
  envVars: { kind: 'stringMap' },
  timeout: { kind: 'integer', min: 1, max: MAX_TIMEOUT_S },
  autoPause: { kind: 'boolean' },
  autoPauseMemory: { kind: 'boolean' },
} as const;
const CONNECT_BODY = { timeout: { kind: 'integer', min: 1, max: MAX_TIMEOUT_S }, memory: { kind: 'boolean' } } as const;
const PAUSE_BODY = { memory: { kind: 'boolean' } } as const;
const TIMEOUT_BODY = { timeout: { kind: 'integer', required: true, min: 0, max: MAX_TIMEOUT_S } } as const;

/** The body's fields this API knows, checked; the other fields the SDK may send are dropped. */
export function checkKnown<S extends BodySpec>(raw: unknown, spec: S): BodyOf<S> {
  return checkBody(isPlainObject(raw) ? Object.fromEntries(Object.entries(raw).filter(([k]) => Object.hasOwn(spec, k))) : raw, spec);
}

async function readKnown<S extends BodySpec>(w: WorkerContext, ctx: AuthedContext, spec: S): Promise<BodyOf<S>> {
  return checkKnown(await readJson(ctx.req, w.limits.jsonBytes), spec);
}

/** The caller's sandbox with this id; one being deleted is gone as far as E2B is concerned. */
async function findLive(w: WorkerContext, ctx: AuthedContext): Promise<Sandbox> {
  const id = ctx.params.id ?? '';
  const sandbox = await findSandbox(w, ctx, id);
  if (sandbox.metadata.deletionTimestamp !== undefined) throw sandboxNotFound(id);
  return sandbox;
}

/** create's autoResume: {enabled: boolean} (a bare boolean read the same way); absent: off, as E2B's default. */
function autoResumeOf(raw: unknown): boolean {
  const value = isPlainObject(raw) ? raw.autoResume : undefined;
  if (value === undefined || value === null) return false;
  if (typeof value === 'boolean') return value;
  if (isPlainObject(value) && typeof value.enabled === 'boolean') return value.enabled;
  throw new AsbError('Invalid', 'autoResume must be {"enabled": true|false}', { fields: [{ field: 'autoResume', message: 'must be {"enabled": boolean}' }] });
}

/** Named as the SDK names them. */
const E2B_FIELDS = { allow: 'network.allowOut', deny: 'network.denyOut' } as const;

async function create(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const raw: unknown = await readJson(ctx.req, w.limits.jsonBytes);
  if (isPlainObject(raw) && Array.isArray(raw.volumeMounts) && raw.volumeMounts.length > 0) {
    throw new AsbError('BadRequest', 'volumeMounts are not supported by this server: a sandbox keeps its template\'s volumes; leave volumeMounts out');
  }
  const body = checkKnown(raw, CREATE_BODY);
  // Every process the sandbox runs gets envVars: one a program cannot be given would fail each of them.
  if (body.envVars !== undefined) checkSpawnInput({ env: { field: 'envVars', vars: body.envVars } });
  const autoResume = autoResumeOf(raw);
  if (autoResume && body.autoPause !== true) throw new AsbError('BadRequest', 'autoResume needs autoPause: only a sandbox that pauses at its timeout can resume (lifecycle on_timeout "pause")');
  if (autoResume && body.autoPauseMemory === false) throw new AsbError('BadRequest', 'autoResume cannot be combined with autoPauseMemory false: a filesystem-only pause is resumed with connect, not by traffic');
  const network = isPlainObject(raw) ? e2bNetwork(raw.allow_internet_access, raw.network) : undefined;
  if (network !== undefined) requireProxyForDomains(w.egressProxy, network, E2B_FIELDS);
  const now = w.clock.now();
  const annotations: Record<string, string> = { [E2B_ANNOTATION.startedAt]: new Date(now).toISOString() };
  if (body.metadata !== undefined) annotations[E2B_ANNOTATION.metadata] = JSON.stringify(body.metadata);
  if (body.envVars !== undefined) annotations[E2B_ANNOTATION.envVars] = JSON.stringify(body.envVars);
  const timeoutMs = (body.timeout ?? DEFAULT_TIMEOUT_S) * 1000;
  const shutdownTime = new Date(now + timeoutMs).toISOString();
  // Always written: "false" also tells the router that traffic must not resume this sandbox's pauses (route-entry.ts).
  annotations[E2B_ANNOTATION.autoResume] = String(autoResume);
  // Sandbox.create(snapshotID): a snapshot of the caller's team (by id or name) before a template of that name.
  const snapshot = body.templateID === undefined ? undefined : await findSnapshot(w, ctx.principal, body.templateID).catch(() => undefined);
  if (snapshot !== undefined) {
    const started = await startFromSnapshot(w, snapshot, { wait: true, annotations, shutdownTime, ...(network === undefined ? {} : { network }) });
    return { status: 201, json: e2bSandbox(w, started, ctx.req) };
  }
  const { sandbox } = await claimSandbox(w, ctx.principal, {
    namespace: w.defaultNamespace,
    template: body.templateID ?? 'base',
    annotations,
    shutdownTime,
    // Paused at the timeout, with memory unless autoPauseMemory is false (E2B's default is a full
    // pause); each run after a resume lasts the create's timeout again.
    ...(body.autoPause === true ? { shutdownPolicy: 'Suspend' as const, runTimeoutMs: timeoutMs, suspensionStrategy: body.autoPauseMemory === false ? 'Stop' as const : 'Hibernate' as const } : {}),
    ...(network === undefined ? {} : { network }),
    coldStart: true,
    wait: true,
  });
  return { status: 201, json: e2bSandbox(w, sandbox, ctx.req) };
}

/**
 * Connect: the sandbox's TTL is extended to at least `timeout` from now (never shortened, as in
 * E2B), and a paused sandbox is resumed: 201 once it runs again, 200 if it was running.
 */
async function connect(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const body = await readKnown(w, ctx, CONNECT_BODY);
  let sandbox = await findLive(w, ctx);
  const until = w.clock.now() + (body.timeout ?? DEFAULT_TIMEOUT_S) * 1000;
  const current = sandboxLifecycle(sandbox.spec).shutdownTime;
  if (current !== undefined && Date.parse(current) < until) sandbox = await setShutdownIn(w, sandbox, until - w.clock.now());
  // memory false is the SDK's on_resume "reboot": the runtime is asked to discard the kept memory and start from the files (StartOptions.memory; the local runtime does not honour it yet).
  if (!wantsRunning(sandbox.spec)) return { status: 201, json: e2bSandbox(w, await resumeSandbox(w, sandbox, true, { discardMemory: body.memory === false }), ctx.req) };
  if (!sandboxView(sandbox).ready) {
    const failure = sandbox.status?.phase === 'Failed' ? sandboxFailure(sandbox) : undefined;
    if (failure !== undefined) throw new AsbError('SandboxNotRunning', `sandbox "${sandbox.metadata.name}" failed: ${describeFailure(failure)}; kill it and create another`);
    sandbox = await waitReady(w, sandbox);
  }
  return { status: 200, json: e2bSandbox(w, sandbox, ctx.req) };
}

/**
 * Pause, answered once the pod has stopped and its memory, when kept, is saved (as E2B's, once
 * its snapshot is taken). `memory` (the SDK's mode):
 * - true ("full"): memory or nothing. Where the runtime cannot keep memory (runc pods of a
 *   template without suspensionStrategy Hibernate, whose user namespace CRIU cannot checkpoint;
 *   the Kubernetes tier) the answer is 400 naming mode="filesystem" and gVisor, and the sandbox
 *   keeps running; a save that fails is a 500 with its reason, and it keeps running too.
 * - unset (the SDK's default, E2B's "full"): memory where the runtime can keep it, else the files,
 *   and the Suspended condition (getInfo's pauseMode "filesystem") says memory was not kept and
 *   why. A choice: refusing there would break every default pause on the default runc template,
 *   which paused with its files before memory could be kept at all.
 * - false ("filesystem"): the files only.
 */
async function pause(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const body = await readKnown(w, ctx, PAUSE_BODY);
  const sandbox = await findLive(w, ctx);
  if (stateOf(sandbox) === 'paused') throw new AsbError('SandboxNotRunning', `sandbox "${sandbox.metadata.name}" is already paused; resume it with connect`);
  const memory = sdkDefaultsMemory(ctx.req.headers) && body.memory === true ? undefined : body.memory;
  await pauseSandbox(w, sandbox, true, memory === undefined ? 'preferred' : memory ? 'required' : 'none');
  return { status: 204 };
}

/**
 * Whether the caller is a JS SDK before 2.51, whose pause() with no options sends memory: true
 * (`keepMemory ?? true`): there a true is the SDK's default, not the caller's choice, and is read
 * as unset. 2.51 and the Python SDK leave memory out unless asked. The SDK names itself in its
 * `lang` and `package_version` headers.
 */
export function sdkDefaultsMemory(headers: IncomingHttpHeaders): boolean {
  if (headers.lang !== 'js') return false;
  const version = /^(\d+)\.(\d+)\./.exec(String(headers.package_version ?? ''));
  if (version === null) return false;
  const [major, minor] = [Number(version[1]), Number(version[2])];
  return major < 2 || (major === 2 && minor < 51);
}

async function setSandboxTimeout(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const body = await readKnown(w, ctx, TIMEOUT_BODY);
  await setShutdownIn(w, await findLive(w, ctx), body.timeout * 1000);
  return { status: 204 };
}

/** updateNetwork: the body replaces the whole policy (omitted fields are cleared, as in E2B). */
async function updateNetwork(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const raw: unknown = await readJson(ctx.req, w.limits.jsonBytes);
  const body = isPlainObject(raw) ? raw : {};
  const { allow_internet_access: allowInternet, ...network } = body;
  const policy = e2bNetwork(allowInternet, network, 'network', true);
  if (policy !== undefined) requireProxyForDomains(w.egressProxy, policy, E2B_FIELDS);
  if (policy !== undefined) await setNetwork(w, await findLive(w, ctx), policy);
  return { status: 204 };
}

async function kill(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  await deleteSandbox(w, await findLive(w, ctx));
  return { status: 204 };
}

export function e2bRoutes(w: WorkerContext, auth: Authenticator): Route[] {
  const route = (method: Route['method'], pattern: string, handler: (ctx: AuthedContext) => Promise<Reply>): Route => e2bRoute(auth, method, pattern, handler);
  const routes: Route[] = [];
  for (const prefix of ['', '/v2']) {
    routes.push(
      route('POST', `${prefix}/sandboxes`, (ctx) => create(w, ctx)),
      route('GET', `${prefix}/sandboxes`, (ctx) => listE2bSandboxes(w, ctx.principal, ctx.query)),
      route('POST', `${prefix}/sandboxes/{id}/connect`, (ctx) => connect(w, ctx)),
    );
  }
  routes.push(
    route('GET', '/sandboxes/{id}', async (ctx) => ({ status: 200, json: e2bSandboxDetail(w, await findLive(w, ctx), ctx.req) })),
    route('DELETE', '/sandboxes/{id}', (ctx) => kill(w, ctx)),
    route('POST', '/sandboxes/{id}/timeout', (ctx) => setSandboxTimeout(w, ctx)),
    route('POST', '/sandboxes/{id}/pause', (ctx) => pause(w, ctx)),
    route('PUT', '/sandboxes/{id}/network', (ctx) => updateNetwork(w, ctx)),
    route('GET', '/sandboxes/{id}/metrics', async (ctx) => ({ status: 200, json: await sampleMetrics(w, await findLive(w, ctx)) })),
  );
  return routes;
}
