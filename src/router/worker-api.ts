// The three calls a router makes to a worker's REST API, all with the admin key: resume a
// hibernated sandbox (wake on connect), ask for a sandbox's phase (does an id the table lacks
// exist; is one the table says paused still paused), and report data-plane activity. None is on
// the hot path of a request to a known, running sandbox.
import { AsbError } from '../errors.ts';

export interface WorkerEndpoint {
  /** The worker cluster's name, as in its route feed snapshot and `api-<cluster>` upstreams. */
  cluster: string;
  /** Base URL of its REST API, e.g. http://127.0.0.1:7080 */
  url: string;
  /** Admin API key (--worker-key / ASB_ROUTER_WORKER_KEY). */
  key: string;
}

/** A resume or lookup that takes longer than this is treated as a failure (the worker is sick). */
const CALL_TIMEOUT_MS = 5_000;

/** POST /v1/sandboxes/{id}/resume {wait:false, cause?:{host,path}} (the request that woke it, for its lifecycle event): the router waits on the route feed, not the call. */
export async function resumeSandbox(worker: WorkerEndpoint, id: string, cause?: { host: string; path: string }): Promise<void> {
  const res = await call(worker, 'POST', `/v1/sandboxes/${encodeURIComponent(id)}/resume`, { wait: false, ...(cause === undefined ? {} : { cause }) });
  if (res.status === 404) throw new AsbError('NotFound', `sandbox ${id} not found`);
  if (res.status !== 200) throw new AsbError('Unavailable', `worker ${worker.cluster} refused to wake sandbox ${id}: HTTP ${res.status} ${await brief(res)}`);
  await res.body?.cancel();
}

/** GET /v1/sandboxes/{id}: the sandbox's phase as its worker sees it now (Running, Hibernated, …), undefined on 404. */
export async function sandboxPhase(worker: WorkerEndpoint, id: string): Promise<string | undefined> {
  const res = await call(worker, 'GET', `/v1/sandboxes/${encodeURIComponent(id)}`, undefined);
  if (res.status === 404) {
    await res.body?.cancel();
    return undefined;
  }
  if (res.status !== 200) {
    await res.body?.cancel();
    throw new AsbError('Unavailable', `worker ${worker.cluster} answered HTTP ${res.status} looking up sandbox ${id}`);
  }
  const view: unknown = await res.json().catch(() => undefined);
  const phase = typeof view === 'object' && view !== null ? (view as { phase?: unknown }).phase : undefined;
  if (typeof phase !== 'string') throw new AsbError('Unavailable', `worker ${worker.cluster} answered sandbox ${id} without a phase`);
  return phase;
}

/** POST /v1/activity {ids}. */
export async function reportActivity(worker: WorkerEndpoint, ids: readonly string[]): Promise<void> {
  const res = await call(worker, 'POST', '/v1/activity', { ids });
  if (res.status !== 200) throw new AsbError('Unavailable', `worker ${worker.cluster} refused an activity report: HTTP ${res.status} ${await brief(res)}`);
  await res.body?.cancel();
}

async function call(worker: WorkerEndpoint, method: string, path: string, body: unknown): Promise<Response> {
  try {
    const init: RequestInit = {
      method,
      headers: { authorization: `Bearer ${worker.key}`, 'content-type': 'application/json' },
      signal: AbortSignal.timeout(CALL_TIMEOUT_MS),
    };
    if (body !== undefined) init.body = JSON.stringify(body);
    return await fetch(new URL(path, worker.url), init);
  } catch (err) {
    throw new AsbError('Unavailable', `worker ${worker.cluster} (${worker.url}) is unreachable: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  }
}

async function brief(res: Response): Promise<string> {
  const text = await res.text().catch(() => '');
  return text.slice(0, 200);
}
