// The claim hot path the REST API calls. A claim of a warm sandbox is one compare-and-swap
// store.update of a member the informer already showed Ready: no list, no read, no pod start.
// - Ready unclaimed members wait in an in-memory FIFO per (namespace, pool), fed by the Sandbox
//   informer. A popped member is out of the FIFO, so two callers never race for it; if its CAS
//   fails (someone else changed it), it is skipped, and the watch puts it back if it still
//   qualifies. The CAS on resourceVersion is what makes a double bind impossible; the FIFO only
//   makes conflicts rare.
// - FIFO (oldest ready first) rather than k8s-sigs' node spreading: one worker is one node.
// - An empty pool cold-starts a new Sandbox from the template (launch 'cold') unless the caller
//   refused that (PoolExhausted).
// - A claim that sets env or volumeClaimTemplates always cold-starts: a warm member's pod already
//   runs without them. The check is on the request alone, so other claims read nothing more.
// - What cannot be bound as asked (no such pool or template, a template refusing the claim's env
//   or volumes) is a ClaimRefused carrying k8s-sigs' Ready reason, for the claim controller to say.
import { newSandboxId } from '../api/ids.ts';
import type { OwnerReference } from '../api/meta.ts';
import { apiVersionOf } from '../api/meta.ts';
import { isReservedKey, RESERVED_PREFIXES } from '../api/names.ts';
import { describeFailure, sandboxFailure } from '../api/sandbox-failure.ts';
import {
  ANNOTATION,
  LABEL,
  podKeepsMemory,
  SandboxClaimType,
  SandboxTemplateType,
  SandboxType,
  SandboxWarmPoolType,
  type ClaimEnvVar,
  type Lifecycle,
  type Sandbox,
  type SandboxTemplate,
  type SandboxWarmPool,
  type SandboxShutdownPolicy,
  type SuspensionStrategy,
  type VolumeClaimTemplate,
} from '../api/types.ts';
import { AsbError, invalid, isAsbError, type ErrorCode } from '../errors.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { ObjectStore } from '../store/store.ts';
import { isoNow, type Clock, type Timer } from '../base/clock.ts';
import { applyClaimChanges, hasClaimChanges, isDeleting, isSandboxReady, sandboxFromTemplate } from './blueprint.ts';
import type { EgressPolicy } from '../network/egress-policy.ts';
import { networkSpec } from '../api/sandbox-network.ts';
import type { Activity } from './activity.ts';
import type { Informer } from '../store/informer.ts';

export interface ClaimRequest {
  namespace: string;
  template?: string;
  pool?: string;
  /** The team that owns the sandbox (label asb.dev/owner). */
  owner: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  shutdownTime?: string;
  shutdownPolicy?: SandboxShutdownPolicy;
  /** With shutdownPolicy Suspend: how long each run lasts (ANNOTATION.runTimeoutMs). */
  runTimeoutMs?: number;
  idleTimeoutMs?: number;
  /** Replaces the template's suspensionStrategy. */
  suspensionStrategy?: SuspensionStrategy;
  /** Replaces the template's egress policy (a create's `network`). */
  network?: EgressPolicy;
  /** Default true: take a warm pool member when one is ready; false always cold-starts. */
  warm?: boolean;
  /** Default true: cold-start when the pool is empty; false fails with PoolExhausted. */
  coldStart?: boolean;
  /** The SandboxClaim this binds for, if any: becomes the sandbox's owner and claim-uid label. */
  claimRef?: { name: string; uid: string };
  /** Added to the pod as the template's envVarsInjectionPolicy allows; forces a cold start. */
  env?: ClaimEnvVar[];
  /** Added to the sandbox as the template's volumeClaimTemplatesPolicy allows; forces a cold start. */
  volumeClaimTemplates?: VolumeClaimTemplate[];
}

/** k8s-sigs' SandboxClaim Ready reasons for a claim that cannot be bound as asked. */
export type RefusalReason = 'WarmPoolNotFound' | 'TemplateNotFound' | 'EnvVarsInjectionRejected' | 'VolumeClaimTemplatesError';

/**
 * A claim the claimer cannot bind as asked, with the reason a SandboxClaim's Ready condition
 * gives (the SDK fails at once on each). The code stays NotFound or Invalid for the REST API.
 */
export class ClaimRefused extends AsbError {
  readonly reason: RefusalReason;
  constructor(reason: RefusalReason, code: ErrorCode, message: string) {
    super(code, message);
    this.reason = reason;
  }
}

export interface ClaimResult {
  sandbox: Sandbox;
  launch: 'warm' | 'cold';
}

export interface ClaimerDeps {
  store: ObjectStore;
  sandboxes: Informer<Sandbox>;
  pools: Informer<SandboxWarmPool>;
  templates: Informer<SandboxTemplate>;
  clock: Clock;
  metrics: Metrics;
  clusterTag: string;
  /** Binding counts as activity: a member warm for an hour must not idle out on claim. */
  activity?: Activity;
}

/** Index on the pool informer: `<namespace>/<template>` → pools that keep that template warm. */
export const POOL_BY_TEMPLATE_INDEX = 'template';
export function poolTemplateIndexValues(pool: SandboxWarmPool): string[] {
  return [`${pool.metadata.namespace ?? ''}/${pool.spec.sandboxTemplateRef.name}`];
}

/**
 * The error for a waiter on a sandbox that will not become ready (Failed, Expired or being
 * deleted), naming why as its status says; undefined while it may still.
 */
function notRunning(key: string, sandbox: Sandbox): AsbError | undefined {
  const failure = sandboxFailure(sandbox);
  if (failure !== undefined) return new AsbError('SandboxNotRunning', `sandbox ${key} is ${sandbox.status?.phase ?? ''}: ${describeFailure(failure)}`);
  if (isDeleting(sandbox)) return new AsbError('SandboxNotRunning', `sandbox ${key} is being deleted`);
  return undefined;
}

/** A warm candidate: Ready, still in its pool, not deleting, not owned by anyone yet. */
export function isWarmCandidate(sandbox: Sandbox): boolean {
  const labels = sandbox.metadata.labels ?? {};
  return labels[LABEL.pool] !== undefined && labels[LABEL.owner] === undefined && !isDeleting(sandbox) && isSandboxReady(sandbox);
}

/** A queue with O(1) push and shift; the consumed head is dropped once it is half the array. */
class Fifo {
  #items: string[] = [];
  #head = 0;
  push(item: string): void {
    this.#items.push(item);
  }
  shift(): string | undefined {
    if (this.#head >= this.#items.length) return undefined;
    const item = this.#items[this.#head++];
    if (this.#head > 1024 && this.#head * 2 > this.#items.length) {
      this.#items = this.#items.slice(this.#head);
      this.#head = 0;
    }
    return item;
  }
}

interface Waiter {
  resolve: (sandbox: Sandbox) => void;
  reject: (err: Error) => void;
  timer: Timer;
}

export class Claimer {
  #deps: ClaimerDeps;
  /** pool key → FIFO of sandbox keys; entries not in #queued are stale and skipped. */
  #fifos = new Map<string, Fifo>();
  #queued = new Set<string>();
  #waiters = new Map<string, Set<Waiter>>();
  #closed = false;

  constructor(deps: ClaimerDeps) {
    this.#deps = deps;
  }

  /** Sandbox informer handler: keeps the FIFOs and resolves waitReady callers. */
  observe(key: string, current: Sandbox | undefined, previous: Sandbox | undefined): void {
    if (current !== undefined && isWarmCandidate(current)) {
      if (!this.#queued.has(key)) {
        this.#queued.add(key);
        const poolKey = `${current.metadata.namespace ?? ''}/${current.metadata.labels?.[LABEL.pool] ?? ''}`;
        let fifo = this.#fifos.get(poolKey);
        if (fifo === undefined) this.#fifos.set(poolKey, (fifo = new Fifo()));
        fifo.push(key);
      }
    } else {
      this.#queued.delete(key);
    }
    const waiters = this.#waiters.get(key);
    if (waiters === undefined) return;
    if (current === undefined) {
      if (previous !== undefined) this.#settle(key, new AsbError('NotFound', `sandbox ${key} was deleted`));
    } else if (isSandboxReady(current)) {
      this.#settle(key, current);
    } else {
      const stopped = notRunning(key, current);
      if (stopped !== undefined) this.#settle(key, stopped);
    }
  }

  /** Whether the template is cached: a claim's existence check with no read. */
  hasTemplate(namespace: string, name: string): boolean {
    return this.#deps.templates.getByName(namespace, name) !== undefined;
  }

  /** The cached template (a claim reads its owner from it with no store read), undefined if not cached. */
  cachedTemplate(namespace: string, name: string): SandboxTemplate | undefined {
    return this.#deps.templates.getByName(namespace, name);
  }

  /** Warm members ready to be claimed right now, for a pool. */
  available(namespace: string, pool: string): number {
    let n = 0;
    for (const key of this.#queued) {
      const sb = this.#deps.sandboxes.get(key);
      if (sb?.metadata.namespace === namespace && sb.metadata.labels?.[LABEL.pool] === pool) n++;
    }
    return n;
  }

  async claim(req: ClaimRequest): Promise<ClaimResult> {
    const started = performance.now();
    try {
      const result = await this.#claim(req);
      // performance.now, not the injected clock: this is a latency measurement, not behaviour.
      this.#deps.metrics.claimSeconds.observe({ launch: result.launch }, (performance.now() - started) / 1000);
      this.#deps.metrics.claimsTotal.inc({ launch: result.launch, result: 'bound' });
      return result;
    } catch (err) {
      this.#deps.metrics.claimsTotal.inc({ launch: 'none', result: 'failed' });
      throw err;
    }
  }

  /** Resolves once the sandbox is Ready (from the informer: no polling), or fails after timeoutMs. */
  waitReady(namespace: string, name: string, timeoutMs: number): Promise<Sandbox> {
    const key = `${namespace}/${name}`;
    const cached = this.#deps.sandboxes.get(key);
    if (cached !== undefined && isSandboxReady(cached)) return Promise.resolve(cached);
    // One that failed before the caller waited (a cold start whose image pull failed at once)
    // would otherwise be waited on until the timeout.
    const stopped = cached === undefined ? undefined : notRunning(key, cached);
    if (stopped !== undefined) return Promise.reject(stopped);
    if (this.#closed) return Promise.reject(new AsbError('Unavailable', 'claimer is closed'));
    return new Promise((resolve, reject) => {
      let set = this.#waiters.get(key);
      if (set === undefined) this.#waiters.set(key, (set = new Set()));
      const waiter: Waiter = {
        resolve,
        reject,
        // Clamped to the largest timer Node honours (2^31-1 ms); longer would fire at once.
        timer: this.#deps.clock.after(Math.min(timeoutMs, 2_147_483_647), () => {
          set.delete(waiter);
          if (set.size === 0) this.#waiters.delete(key);
          reject(new AsbError('Timeout', `sandbox ${key} not ready within ${timeoutMs} ms`));
        }),
      };
      set.add(waiter);
    });
  }

  /** Rejects pending waitReady callers; idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const key of [...this.#waiters.keys()]) this.#settle(key, new AsbError('Unavailable', 'claimer closed'));
  }

  #settle(key: string, outcome: Sandbox | Error): void {
    const waiters = this.#waiters.get(key);
    if (waiters === undefined) return;
    this.#waiters.delete(key);
    for (const w of waiters) {
      w.timer.cancel();
      if (outcome instanceof Error) w.reject(outcome);
      else w.resolve(outcome);
    }
  }

  #resolvePool(req: ClaimRequest): { pool?: SandboxWarmPool; template?: string } {
    const { pools } = this.#deps;
    if (req.pool !== undefined) {
      const pool = pools.getByName(req.namespace, req.pool);
      if (pool === undefined) {
        if (req.template === undefined) throw new ClaimRefused('WarmPoolNotFound', 'NotFound', `SandboxWarmPool "${req.pool}" not found in namespace "${req.namespace}"`);
        return { template: req.template };
      }
      return { pool, template: pool.spec.sandboxTemplateRef.name };
    }
    if (req.template === undefined) {
      throw invalid('SandboxClaim', '', [{ field: 'template', message: 'a template or a pool is required' }]);
    }
    const candidates = pools.byIndex(POOL_BY_TEMPLATE_INDEX, `${req.namespace}/${req.template}`).filter((p) => !isDeleting(p));
    // Several pools for one template: the oldest pool is the template's default.
    candidates.sort((a, b) => (a.metadata.creationTimestamp ?? '').localeCompare(b.metadata.creationTimestamp ?? ''));
    const pool = candidates[0];
    return pool === undefined ? { template: req.template } : { pool, template: req.template };
  }

  async #claim(req: ClaimRequest): Promise<ClaimResult> {
    checkLabels(req);
    const { pool, template } = req.warm === false ? { pool: undefined, template: req.template } : this.#resolvePool(req);
    if (pool !== undefined && !hasClaimChanges(req) && this.#membersKeepWhatIsAsked(req, pool)) {
      const warm = await this.#claimWarm(req, `${req.namespace}/${pool.metadata.name}`);
      if (warm !== undefined) return { sandbox: warm, launch: 'warm' };
    }
    if (req.coldStart === false) {
      throw new AsbError('PoolExhausted', `no warm sandbox ready for ${pool === undefined ? `template "${template ?? ''}"` : `pool "${pool.metadata.name}"`} and cold start refused`);
    }
    return { sandbox: await this.#coldStart(req, template ?? ''), launch: 'cold' };
  }

  /**
   * Whether a warm member of `pool` can give what `req` asks of suspension: a claim asking
   * Hibernate needs a pod that can keep its memory (podKeepsMemory), and a running runc pod cannot
   * be made so. Else it starts cold, or its pause with memory would be refused.
   */
  #membersKeepWhatIsAsked(req: ClaimRequest, pool: SandboxWarmPool): boolean {
    if (req.suspensionStrategy !== 'Hibernate') return true;
    const template = this.#deps.templates.getByName(req.namespace, pool.spec.sandboxTemplateRef.name);
    return template !== undefined && podKeepsMemory(template.spec);
  }

  async #claimWarm(req: ClaimRequest, poolKey: string): Promise<Sandbox | undefined> {
    const fifo = this.#fifos.get(poolKey);
    if (fifo === undefined) return undefined;
    for (let key = fifo.shift(); key !== undefined; key = fifo.shift()) {
      if (!this.#queued.delete(key)) continue;
      const member = this.#deps.sandboxes.get(key);
      if (member === undefined || !isWarmCandidate(member)) continue;
      try {
        // Touch first: the watch event of this write reaches the sandbox controller before our
        // await resumes. A touch on a member whose CAS then fails is harmless (pool members
        // never idle out).
        this.#deps.activity?.touch(member.metadata.name);
        return await this.#deps.store.update<Sandbox>(SandboxType, bindWarm(member, req, isoNow(this.#deps.clock)));
      } catch (err) {
        // Taken or changed since the cache saw it: skip it; the watch re-queues it if still free.
        if (isAsbError(err, 'Conflict') || isAsbError(err, 'NotFound')) continue;
        throw err;
      }
    }
    return undefined;
  }

  async #coldStart(req: ClaimRequest, templateName: string): Promise<Sandbox> {
    const { templates, store, clusterTag } = this.#deps;
    const template =
      templates.getByName(req.namespace, templateName) ??
      (await store.tryGet<SandboxTemplate>(SandboxTemplateType, req.namespace, templateName));
    if (template === undefined) throw new ClaimRefused('TemplateNotFound', 'NotFound', `SandboxTemplate "${templateName}" not found in namespace "${req.namespace}"`);
    const changed = applyClaimChanges(template, req);
    if ('refused' in changed) throw new ClaimRefused(changed.refused.reason, 'Invalid', changed.refused.message);
    const sandbox = sandboxFromTemplate(changed.template, {
      name: newSandboxId(clusterTag),
      namespace: req.namespace,
      labels: { ...req.labels, ...systemLabels(req, 'cold'), [LABEL.template]: templateName },
      ...(req.annotations === undefined && req.runTimeoutMs === undefined ? {} : { annotations: { ...req.annotations, ...runTimeoutOf(req) } }),
      ...(req.claimRef === undefined ? {} : { ownerReferences: [claimOwner(req.claimRef)] }),
      ...lifecycleOf(req),
      ...(req.idleTimeoutMs === undefined ? {} : { idleTimeoutMs: req.idleTimeoutMs }),
      ...(req.suspensionStrategy === undefined ? {} : { suspensionStrategy: req.suspensionStrategy }),
      ...(req.network === undefined ? {} : { network: req.network }),
    });
    return store.create(SandboxType, sandbox);
  }
}

function checkLabels(req: ClaimRequest): void {
  const problems = Object.keys({ ...req.labels, ...req.annotations })
    .filter(isReservedKey)
    .map((k) => ({ field: `labels[${k}]`, message: `keys under ${RESERVED_PREFIXES.join(', ')} are reserved` }));
  if (problems.length > 0) throw invalid('Sandbox', '', problems);
}

function systemLabels(req: ClaimRequest, launch: 'warm' | 'cold'): Record<string, string> {
  return {
    [LABEL.owner]: req.owner,
    [LABEL.launchType]: launch,
    ...(req.claimRef === undefined ? {} : { [LABEL.claimUid]: req.claimRef.uid }),
  };
}

function claimOwner(ref: { name: string; uid: string }): OwnerReference {
  return { apiVersion: apiVersionOf(SandboxClaimType), kind: SandboxClaimType.kind, name: ref.name, uid: ref.uid, controller: true, blockOwnerDeletion: true };
}

function runTimeoutOf(req: ClaimRequest): Record<string, string> {
  return req.runTimeoutMs === undefined ? {} : { [ANNOTATION.runTimeoutMs]: String(req.runTimeoutMs) };
}

function lifecycleOf(req: ClaimRequest): { lifecycle?: Lifecycle } {
  if (req.shutdownTime === undefined) return {};
  return { lifecycle: { shutdownTime: req.shutdownTime, ...(req.shutdownPolicy === undefined ? {} : { shutdownPolicy: req.shutdownPolicy }) } };
}

/**
 * The one write of a warm claim: leave the pool, take the owner, carry the claim's settings, and
 * say when it was claimed (ANNOTATION.lastActivity), so the idle clock of an operator in another
 * process starts from the claim, not from when the member became ready.
 */
export function bindWarm(member: Sandbox, req: ClaimRequest, claimedAt: string): Sandbox {
  const { [LABEL.pool]: _pool, ...labels } = { ...member.metadata.labels, ...req.labels, ...systemLabels(req, 'warm') };
  const owners = (member.metadata.ownerReferences ?? []).filter((o) => o.kind !== SandboxWarmPoolType.kind);
  if (req.claimRef !== undefined) owners.push(claimOwner(req.claimRef));
  const { lifecycle } = lifecycleOf(req);
  return {
    ...member,
    metadata: {
      ...member.metadata,
      labels,
      annotations: { ...member.metadata.annotations, ...req.annotations, ...runTimeoutOf(req), [ANNOTATION.lastActivity]: claimedAt },
      ownerReferences: owners,
    },
    spec: {
      ...member.spec,
      ...(lifecycle === undefined ? {} : { lifecycle }),
      ...(req.idleTimeoutMs === undefined ? {} : { idleTimeoutMs: req.idleTimeoutMs }),
      ...(req.suspensionStrategy === undefined ? {} : { suspensionStrategy: req.suspensionStrategy }),
      // The runtime applies it to the running member at its next reconcile (sandbox-controller).
      ...(req.network === undefined ? {} : { network: networkSpec(req.network) }),
    },
  };
}
