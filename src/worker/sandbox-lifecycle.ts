// What the sandbox APIs do to a sandbox, shared by our /v1 routes (routes-sandboxes.ts) and the
// E2B-compatible routes (e2b/routes.ts), so both APIs claim, pause, resume, time out and delete
// the same way. Lifecycle changes are spec writes; the operator does the work.
import type { KubeObject, ResourceType } from '../api/meta.ts';
import type { Sandbox, SandboxShutdownPolicy, SuspendMemory, SuspensionStrategy } from '../api/types.ts';
import { ANNOTATION, sandboxLifecycle, SandboxType, wantsRunning } from '../api/types.ts';
import { SUSPENDED_REASON } from '../operator/suspension.ts';
import type { Principal } from '../auth/keyring.ts';
import { AsbError, isAsbError } from '../errors.ts';
import type { ClaimRequest, ClaimResult } from '../operator/claimer.ts';
import { sandboxNotFound } from './access.ts';
import { tokenGenerationOf } from './access-token.ts';
import type { Watch, WatchOptions } from '../store/store.ts';
import type { Timer } from '../base/clock.ts';
import type { EgressPolicy } from '../network/egress-policy.ts';
import { networkSpec } from '../api/sandbox-network.ts';
import type { WorkerContext } from './deps.ts';
import { resolveTemplate } from './team-templates.ts';
import { sandboxView } from './views.ts';

// Optimistic-concurrency retries for a lifecycle write racing the operator's status writes.
const UPDATE_ATTEMPTS = 5;

/** Read-modify-write with retry on Conflict; 404 if the sandbox went away meanwhile. */
export async function mutateSandbox(w: WorkerContext, current: Sandbox, change: (s: Sandbox) => Sandbox): Promise<Sandbox> {
  let latest = current;
  for (let attempt = 1; ; attempt++) {
    try {
      return await w.store.update<Sandbox>(SandboxType, change(structuredClone(latest)));
    } catch (err) {
      if (!isAsbError(err, 'Conflict') || attempt >= UPDATE_ATTEMPTS) throw err;
      const again = await w.store.tryGet<Sandbox>(SandboxType, latest.metadata.namespace ?? w.defaultNamespace, latest.metadata.name);
      if (again === undefined) throw sandboxNotFound(latest.metadata.name);
      latest = again;
    }
  }
}

export interface ClaimOptions {
  namespace: string;
  template: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  /** ISO time the sandbox is deleted at (or suspended, with shutdownPolicy Suspend). */
  shutdownTime?: string;
  shutdownPolicy?: SandboxShutdownPolicy;
  /** With shutdownPolicy Suspend: how long each run lasts. */
  runTimeoutMs?: number;
  /** Replaces the template's. */
  suspensionStrategy?: SuspensionStrategy;
  idleTimeoutMs?: number;
  /** Replaces the template's egress policy. */
  network?: EgressPolicy;
  coldStart: boolean;
  /** Wait until the sandbox is Ready before answering. */
  wait: boolean;
}

/** Claims a sandbox of `template` for the principal's team (warm if one is ready), 404 for an unknown template. */
export async function claimSandbox(w: WorkerContext, p: Principal, opts: ClaimOptions): Promise<ClaimResult> {
  const { namespace } = opts;
  // From the claimer's cache, so a warm claim reads nothing from the store (on Kubernetes a GET
  // per claim was a fifth of the API server's work on the claim path); the store answers only for
  // a template the cache has not seen, which may be one created a moment ago, or a team's name
  // for a template it built (team-templates.ts).
  const template = await resolveTemplate(w, p, namespace, opts.template);
  const req: ClaimRequest = { namespace, template, owner: p.team, coldStart: opts.coldStart };
  if (opts.labels !== undefined) req.labels = opts.labels;
  if (opts.annotations !== undefined) req.annotations = opts.annotations;
  if (opts.shutdownTime !== undefined) req.shutdownTime = opts.shutdownTime;
  if (opts.shutdownPolicy !== undefined) req.shutdownPolicy = opts.shutdownPolicy;
  if (opts.runTimeoutMs !== undefined) req.runTimeoutMs = opts.runTimeoutMs;
  if (opts.suspensionStrategy !== undefined) req.suspensionStrategy = opts.suspensionStrategy;
  if (opts.idleTimeoutMs !== undefined) req.idleTimeoutMs = opts.idleTimeoutMs;
  if (opts.network !== undefined) req.network = opts.network;
  const claimed = await w.operator.claimer.claim(req);
  let sandbox = claimed.sandbox;
  w.index.remember(sandbox);
  // A warm member runs with its template's policy: the create's replaces it before the caller
  // gets the sandbox (the reconciler would too, a moment later, after the first exec could run).
  if (opts.network !== undefined && claimed.launch === 'warm') await w.runtime.setEgressPolicy?.(sandbox.metadata.name, opts.network);
  if (opts.wait && !sandboxView(sandbox).ready) sandbox = await waitReady(w, sandbox);
  return { sandbox, launch: claimed.launch };
}

export function waitReady(w: WorkerContext, sandbox: Sandbox): Promise<Sandbox> {
  return w.operator.claimer.waitReady(sandbox.metadata.namespace ?? w.defaultNamespace, sandbox.metadata.name, w.limits.waitReadyMs);
}

/**
 * Resolves with the sandbox once `done` holds for it, watching its changes after `from`; 404 if it
 * is deleted meanwhile, Timeout after waitReadyMs. For states the claimer's waitReady cannot
 * wait on (hibernated).
 */
export function waitUntil(w: WorkerContext, from: Sandbox, done: (s: Sandbox) => boolean, what: string): Promise<Sandbox> {
  return watchObject(w, SandboxType, from, (s) => (done(s) ? s : undefined), () => sandboxNotFound(from.metadata.name), `sandbox "${from.metadata.name}" to be ${what}`);
}

/**
 * Watches one object from `from` on until `settle` returns it (or an error to reject with); the
 * object's deletion rejects with `gone()`, and waitReadyMs with Timeout naming `what`.
 */
export function watchObject<T extends KubeObject>(w: WorkerContext, type: ResourceType, from: T, settle: (o: T) => T | Error | undefined, gone: () => AsbError, what: string): Promise<T> {
  const first = settle(from);
  if (first instanceof Error) return Promise.reject(first);
  if (first !== undefined) return Promise.resolve(first);
  const { name, namespace } = from.metadata;
  const timeoutMs = w.limits.waitReadyMs;
  return new Promise((resolve, reject) => {
    // The watch may deliver (replay) before store.watch returns, so both handles may be unset.
    const live: { settled: boolean; watch?: Watch; timer?: Timer } = { settled: false };
    const finish = (outcome: T | Error): void => {
      if (live.settled) return;
      live.settled = true;
      live.watch?.close();
      live.timer?.cancel();
      if (outcome instanceof Error) reject(outcome);
      else resolve(outcome);
    };
    const opts: WatchOptions = { namespace: namespace ?? w.defaultNamespace };
    if (from.metadata.resourceVersion !== undefined) opts.resourceVersion = from.metadata.resourceVersion;
    live.watch = w.store.watch<T>(type, opts, {
      onEvent: (event) => {
        if (event.object.metadata.name !== name) return;
        if (event.type === 'DELETED') {
          finish(gone());
          return;
        }
        const outcome = settle(event.object);
        if (outcome !== undefined) finish(outcome);
      },
      onError: (err) => {
        finish(new AsbError('Unavailable', `lost the store watch while waiting for ${what}; try again`, { cause: err }));
      },
    });
    if (live.settled) {
      live.watch.close();
      return;
    }
    live.timer = w.clock.after(timeoutMs, () => {
      finish(new AsbError('Timeout', `waited ${String(timeoutMs)} ms for ${what}`));
    });
  });
}

/**
 * Whether a pause has taken effect: the pod is stopped (or the sandbox expired, which stops it
 * too), or it no longer matters because someone asked for the sandbox to run again.
 */
function isPauseSettled(s: Sandbox): boolean {
  return s.status?.phase === 'Hibernated' || s.status?.phase === 'Expired' || wantsRunning(s.spec);
}

/** Annotations without `drop`, then with `set`. */
function withAnnotations(s: Sandbox, drop: readonly string[], set: Record<string, string> = {}): Sandbox['metadata'] {
  const annotations = Object.fromEntries(Object.entries(s.metadata.annotations ?? {}).filter(([k]) => !drop.includes(k)));
  return { ...s.metadata, annotations: { ...annotations, ...set } };
}

/**
 * Asks the operator to hibernate the sandbox and, with `wait`, resolves once its pod has stopped.
 * `memory`: this pause's own choice (suspension.ts SuspendMemory); absent, the sandbox's
 * suspensionStrategy decides. A waiting pause that needed memory and could not have it rejects
 * with why, and the sandbox runs on (the operator put it back to Running).
 */
export async function pauseSandbox(w: WorkerContext, sandbox: Sandbox, wait = false, memory?: SuspendMemory): Promise<Sandbox> {
  const updated = await mutateSandbox(w, sandbox, (s) => ({
    ...s,
    metadata: withAnnotations(s, [ANNOTATION.suspendMemory, ANNOTATION.discardMemory, ANNOTATION.suspendedIdle], memory === undefined ? {} : { [ANNOTATION.suspendMemory]: memory }),
    spec: { ...s.spec, operatingMode: 'Suspended', replicas: 0 },
  }));
  if (!wait) return updated;
  const settled = await waitUntil(w, updated, isPauseSettled, 'paused');
  const refused = settled.status?.conditions?.find((c) => c.type === 'Suspended' && c.status === 'False' && c.observedGeneration === updated.metadata.generation);
  if (wantsRunning(settled.spec) && refused !== undefined) throw pauseRefused(settled.metadata.name, refused.reason, refused.message ?? '', w.runtime.canKeepMemory?.gvisor === true);
  return settled;
}

/** `gvisorKeepsMemory`: this worker's runtime keeps gVisor pods' memory, so moving there is advice worth giving (not on the Kubernetes tier). */
function pauseRefused(name: string, reason: string, message: string, gvisorKeepsMemory: boolean): AsbError {
  if (reason === SUSPENDED_REASON.checkpointFailed) return new AsbError('CheckpointFailed', `sandbox "${name}" was not paused: ${message}`);
  // The caller can fix it: ask for no memory, or run the sandbox where memory can be kept. Not a
  // 409, which E2B's SDKs read as "already paused".
  const elsewhere = gvisorKeepsMemory ? ', or run it on gVisor (a template with runtimeClassName: gvisor) to keep memory' : '';
  return new AsbError('BadRequest', `sandbox "${name}" cannot be paused with its memory, so it was not paused and keeps running (${message}); pause it with its files only (E2B: mode="filesystem"; asb pause --filesystem; memory: false)${elsewhere}`);
}

/**
 * Asks the operator to run the sandbox again; with `wait`, resolves once it is Ready. A pause the
 * operator has not carried out yet still shows Ready from before it, so a waiting resume first
 * lets that pause settle: otherwise it would answer at once while the pod goes on to stop.
 */
export async function resumeSandbox(w: WorkerContext, sandbox: Sandbox, wait: boolean, opts: { discardMemory?: boolean; wakeCause?: { host: string; path: string } } = {}): Promise<Sandbox> {
  if (wait) sandbox = await waitUntil(w, sandbox, isPauseSettled, 'paused');
  const now = w.clock.now();
  const updated = await mutateSandbox(w, sandbox, (s) => ({
    ...s,
    metadata: withAnnotations(s, [ANNOTATION.suspendMemory, ANNOTATION.discardMemory, ANNOTATION.suspendedIdle, ANNOTATION.wakeCause], {
      ...(opts.discardMemory === true ? { [ANNOTATION.discardMemory]: 'true' } : {}),
      // Said only on the resume it caused: a later resume through the API carries none.
      ...(opts.wakeCause === undefined ? {} : { [ANNOTATION.wakeCause]: JSON.stringify(opts.wakeCause) }),
    }),
    spec: { ...s.spec, operatingMode: 'Running', replicas: 1, ...nextRun(s, now) },
  }));
  w.operator.activity.touch(updated.metadata.name);
  return wait && !sandboxView(updated).ready ? waitReady(w, updated) : updated;
}

/**
 * A sandbox that suspends at its shutdown time (shutdownPolicy Suspend) and is resumed after it:
 * its next run lasts its run timeout (ANNOTATION.runTimeoutMs) from now, or has no end when it has
 * none; otherwise the operator would suspend it again at once. Nothing changes for the others.
 */
function nextRun(s: Sandbox, now: number): Pick<Sandbox['spec'], 'lifecycle'> {
  const lifecycle = s.spec.lifecycle;
  const at = Date.parse(lifecycle?.shutdownTime ?? '');
  if (lifecycle?.shutdownPolicy !== 'Suspend' || Number.isNaN(at) || at > now) return {};
  const runMs = Number(s.metadata.annotations?.[ANNOTATION.runTimeoutMs]);
  if (!(runMs > 0)) {
    const { shutdownTime: _passed, ...rest } = lifecycle;
    return { lifecycle: rest };
  }
  return { lifecycle: { ...lifecycle, shutdownTime: new Date(now + runMs).toISOString() } };
}

/**
 * Ends the sandbox `timeoutMs` from now, replacing any earlier shutdown time: deleted then, or
 * suspended when its lifecycle says Suspend (E2B's on_timeout "pause", which a new timeout keeps).
 */
export function setShutdownIn(w: WorkerContext, sandbox: Sandbox, timeoutMs: number): Promise<Sandbox> {
  const shutdownTime = new Date(w.clock.now() + timeoutMs).toISOString();
  return mutateSandbox(w, sandbox, (s) => ({
    ...s,
    spec: { ...s.spec, lifecycle: { ...s.spec.lifecycle, shutdownTime, shutdownPolicy: sandboxLifecycle(s.spec).shutdownPolicy === 'Suspend' ? 'Suspend' : 'Delete' } },
  }));
}

/**
 * Replaces the sandbox's egress policy (spec.network, so it outlives hibernation and worker
 * restarts) and gives it to the runtime at once when the pod exists, so the caller's next
 * request already runs under it; the reconciler would apply it too, a moment later.
 */
export async function setNetwork(w: WorkerContext, sandbox: Sandbox, policy: EgressPolicy): Promise<Sandbox> {
  const updated = await mutateSandbox(w, sandbox, (s) => ({ ...s, spec: { ...s.spec, network: networkSpec(policy) } }));
  if (w.runtime.state(sandbox.metadata.name).phase !== 'Absent') await w.runtime.setEgressPolicy?.(sandbox.metadata.name, policy);
  return updated;
}

/** Deletes the sandbox; 404 if it is already gone. */
export async function deleteSandbox(w: WorkerContext, sandbox: Sandbox): Promise<Sandbox> {
  try {
    return await w.store.delete<Sandbox>(SandboxType, sandbox.metadata.namespace ?? w.defaultNamespace, sandbox.metadata.name);
  } catch (err) {
    if (isAsbError(err, 'NotFound')) throw sandboxNotFound(sandbox.metadata.name);
    throw err;
  }
}

/**
 * Gives the sandbox a new access token: bumps its token generation (access-token.ts), so every
 * token handed out before stops opening it: at envd at once, at the edge once the route feed has
 * carried the new hash (milliseconds). Open terminal sessions are not tokens and stay open.
 */
export function rotateAccessToken(w: WorkerContext, sandbox: Sandbox): Promise<Sandbox> {
  return mutateSandbox(w, sandbox, (s) => ({
    ...s,
    metadata: { ...s.metadata, annotations: { ...s.metadata.annotations, [ANNOTATION.tokenGeneration]: String(tokenGenerationOf(s) + 1) } },
  }));
}
