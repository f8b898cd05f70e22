// A create at the hub, whichever API it came in by (our POST /v1/sandboxes, E2B's POST /sandboxes
// and /v2/sandboxes): the clusters are ordered by placement (src/hub/placement.ts) and the
// create is forwarded, as the caller sent it and with the caller's own key, to the first of them
// that takes it, on the same path of that cluster's worker API.
//
// Failover: a cluster that cannot be reached (connect error or timeout, a connection lost
// mid-call) or answers 502, 503 or 504 is skipped for the next one in the placement order. Any
// other answer (201, or a 4xx such as an unknown key or a bad label) is the caller's answer,
// passed through as it came, with `x-asb-cluster` naming the cluster that gave it. A worker that
// times out after it began a create may still finish it: failing over then can leave one extra
// sandbox in the first cluster, which its owner sees in lists and can delete; the alternative,
// refusing the create, fails the user for a fault of ours.
import { Counter, type Registry } from 'prom-client';
import { SandboxTemplateType } from '../api/types.ts';
import { AsbError } from '../errors.ts';
import { forwardedHeaders } from '../http/presented-key.ts';
import type { Reply, RequestContext } from '../http/router.ts';
import { candidatesFor, PlacedSinceHeartbeat, type HubTemplate } from './candidates.ts';
import { HEARTBEAT_MS, type Cluster, type PlacementRequest } from '../api/hub-contract.ts';
import { detailOf, EDGE_HEADERS, liveClusters, MAX_ANSWER_BYTES, passOn, workerUrl, type CallLimits } from './forward.ts';
import type { HubContext } from './hub-context.ts';
import { place } from './placement.ts';
import { WorkerCallError, type WorkerAgents, type WorkerAnswer } from './worker-call.ts';

/**
 * Longest a create waits for connected clusters to apply a template the hub holds (a template
 * applied at the hub and used at once): one heartbeat, after which the next heartbeat would have
 * said whether the cluster holds it anyway.
 */
const TEMPLATE_ACK_WAIT_MS = HEARTBEAT_MS;

/** Worker answers after which the next cluster is tried. */
const FAILOVER_STATUSES: ReadonlySet<number> = new Set([502, 503, 504]);

/** The create as it goes to the chosen worker, with the caller's key (forwardedHeaders). */
export interface ForwardedCreate {
  /** The worker API path: the one the caller used at the hub. */
  path: string;
  /** JSON. */
  body: Buffer;
}

export interface Placer {
  /**
   * The first answer of the clusters in placement order that is not a reason to fail over, passed
   * on; AsbError Unavailable naming every cluster's reason when none gave one.
   */
  create(ctx: RequestContext, clusters: readonly Cluster[], target: PlacementRequest, forward: ForwardedCreate): Promise<Reply>;
}

interface PlacementMetrics {
  placements: Counter<'result' | 'cluster'>;
  failovers: Counter<'cluster'>;
}

function createPlacementMetrics(registry: Registry): PlacementMetrics {
  return {
    placements: new Counter({
      name: 'asb_hub_placements_total',
      help: 'Creates placed by the hub (ours and E2B\'s), by result (created: 201; refused: another answer from the worker, passed on; unavailable: no cluster could take it, cluster="none") and cluster.',
      labelNames: ['result', 'cluster'],
      registers: [registry],
    }),
    failovers: new Counter({
      name: 'asb_hub_placement_failovers_total',
      help: 'Create attempts a cluster failed (unreachable, or answered 502/503/504) after which the next cluster was tried, by the cluster that failed.',
      labelNames: ['cluster'],
      registers: [registry],
    }),
  };
}

export function createPlacer(h: HubContext, agents: WorkerAgents, limits: CallLimits): Placer {
  const metrics = createPlacementMetrics(h.registry);
  const placed = new PlacedSinceHeartbeat();

  /** The asked-for template as the hub holds it, so clusters that acked its version count as holding it. */
  async function hubTemplate(namespace: string, template: string): Promise<HubTemplate | undefined> {
    const fromHub = await h.store.tryGet(SandboxTemplateType, namespace, template);
    if (fromHub === undefined) return undefined;
    return { key: `${namespace}/${template}`, version: Number(fromHub.metadata.resourceVersion), applied: appliedVersions() };
  }

  function appliedVersions(): Map<string, number> {
    return new Map((h.sync?.connections() ?? []).map((c) => [c.cluster, c.appliedVersion]));
  }

  /**
   * Waits (at most TEMPLATE_ACK_WAIT_MS) until every connected cluster that could take the create
   * has acked the hub version that wrote its template, so the create is placed on what the hub
   * sent and not on a heartbeat from before it. Returns at once when none is behind.
   */
  async function awaitTemplateAcks(clusters: readonly Cluster[], target: PlacementRequest, held: HubTemplate | undefined): Promise<void> {
    const sync = h.sync;
    if (held === undefined || sync === undefined) return;
    const eligible = new Set(clusters.filter((c) => target.cluster === undefined || c.metadata.name === target.cluster).map((c) => c.metadata.name));
    const behind = new Set([...held.applied].filter(([name, version]) => eligible.has(name) && version < held.version).map(([name]) => name));
    if (behind.size === 0) return;
    await new Promise<void>((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        off();
        resolve();
      };
      const timer = setTimeout(done, TEMPLATE_ACK_WAIT_MS);
      const off = sync.onAck((cluster, version) => {
        if (version >= held.version) behind.delete(cluster);
        if (behind.size === 0) done();
      });
    });
  }

  async function create(ctx: RequestContext, clusters: readonly Cluster[], target: PlacementRequest, forward: ForwardedCreate): Promise<Reply> {
    const { namespace, template } = target;
    const held = await hubTemplate(namespace, template);
    await awaitTemplateAcks(clusters, target, held);
    const { candidates, unusable } = candidatesFor(clusters, liveClusters(h), placed, held === undefined ? undefined : { ...held, applied: appliedVersions() });
    const plan = place(target, candidates);
    const apiUrls = new Map(clusters.map((c) => [c.metadata.name, c.spec.apiUrl ?? '']));
    const headers = { ...forwardedHeaders(ctx.req, EDGE_HEADERS), 'content-type': 'application/json' };
    const failed: { cluster: string; reason: string }[] = [];

    for (const [i, name] of plan.order.entries()) {
      const failover = (reason: string): void => {
        failed.push({ cluster: name, reason });
        if (i < plan.order.length - 1) metrics.failovers.inc({ cluster: name });
      };
      let answer: WorkerAnswer;
      try {
        answer = await agents.call({
          method: 'POST',
          url: workerUrl(apiUrls.get(name) ?? '', forward.path),
          headers,
          body: forward.body,
          connectTimeoutMs: limits.connectTimeoutMs,
          timeoutMs: limits.createTimeoutMs,
          maxBytes: MAX_ANSWER_BYTES,
        });
      } catch (err) {
        if (!(err instanceof WorkerCallError)) throw err;
        ctx.log.warn({ cluster: name, failure: err.kind, err: err.message }, 'placement: cluster unreachable; trying the next');
        failover(`unreachable: ${err.message}`);
        continue;
      }
      if (FAILOVER_STATUSES.has(answer.status)) {
        ctx.log.info({ cluster: name, status: answer.status }, 'placement: cluster could not create; trying the next');
        failover(`answered ${answer.status}: ${detailOf(answer)}`);
        continue;
      }
      if (answer.status === 201) {
        const now = liveClusters(h).get(name);
        if (now !== undefined) placed.record(name, now.heartbeatAt, `${namespace}/${template}`);
        metrics.placements.inc({ result: 'created', cluster: name });
      } else {
        metrics.placements.inc({ result: 'refused', cluster: name });
      }
      return passOn(answer, name);
    }

    metrics.placements.inc({ result: 'unavailable', cluster: 'none' });
    // For a named cluster, only its own story: every other was skipped for not being it.
    const why = [...plan.skipped, ...unusable, ...failed].filter((s) => target.cluster === undefined || s.cluster === target.cluster).map((s) => `${s.cluster}: ${s.reason}`);
    const what = target.cluster === undefined ? 'no cluster could take' : `cluster "${target.cluster}" could not take`;
    throw new AsbError('Unavailable', `${what} a sandbox of template ${namespace}/${template}; ${why.length === 0 ? 'no cluster is registered' : why.join('; ')}`);
  }

  return { create };
}
