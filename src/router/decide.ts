// The routing decision for one request, pure: request headers + route table → route it (with
// the header mutation Envoy needs), answer it here, hold it while the sandbox wakes, or look
// the id up at its worker first. extproc-server.ts turns decisions into ext_proc messages.
//
// Across clusters (the registry, from the feeds' clusters messages):
// - A sandbox (or an API path naming one) whose owner is a cluster this router has a feed for is
//   routed here, on either listener.
// - One owned by another cluster of the federation (known by its id's tag), asked on the edge
//   listener, goes to that cluster's ingress (`x-asb-upstream: ingress`, `x-asb-dst: ip:port`).
//   Only the client's x-asb-* headers are removed: the access token, the cookie and the E2B
//   headers travel on, because the owning cluster's router checks them and routes by them. No
//   cookie is set and no activity reported here; the owning cluster's router does both.
// - The same asked on the ingress listener is refused (404), never forwarded again: whatever the
//   registries say, a request crosses at most one edge → ingress hop, so it cannot loop.
// - Creates and lists (`POST`/`GET` on `/v1/sandboxes`, and E2B's `/sandboxes` and
//   `/v2/sandboxes`; `GET` of E2B's `/templates` and `/v2/templates`) on the edge listener go to the hub when the router runs with --hub-upstream
//   on and a worker reports its hub link up (or reported it before it went down), so placement
//   picks the cluster and a list covers every cluster; otherwise, and for every other path, to
//   the default cluster's worker API.
// - Drained clusters are routed to like any other: drain only stops placement of new sandboxes.
//
// envd (port 49983, the E2B SDK's in-sandbox API) is answered by the owning worker, not by the
// pod: no agent runs in sandbox images. Such requests go to `api-<cluster>` with
// x-asb-sandbox-id set (clients cannot send it: every client x-asb-* header is removed) and keep
// X-Access-Token, which the worker checks itself. Only a sandbox whose image runs a real envd
// (pod template annotation `asb.dev/envd: pod`, the entry's envdInPod) has port 49983 routed to
// the pod like any other port. Declaring the port is not enough: the base template declares it.
// The router still checks the token first, so nothing wakes a sandbox without it; the two envd
// calls that carry none, GET /health and a signed /files URL, pass only to a running sandbox.
//
// The kubernetes-sigs router contract (X-Sandbox-ID, -Namespace, -Port, -Timeout on the edge's
// address; host.ts) carries the team's API key, not an access token: such requests go to the
// owning worker (toWorkerSigs), which checks key, team and namespace and proxies to the pod
// (src/worker/sandbox-router/). An unknown id is a plain 404. X-Sandbox-Pod-IP, which upstream's
// routers dial, is removed with every other x-sandbox-* header and never read.
import { clusterTagOf } from '../api/ids.ts';
import { AsbError } from '../errors.ts';
import { accessCookie, checkAccess, type AccessGranted } from './access.ts';
import { AGENT_PORT, DEFAULT_SANDBOX_PORT, HEADER, INTERNAL_HEADER_PREFIX, SIGS_HEADER_PREFIX, UPSTREAM, type RouteEntry } from './contract.ts';
import { parseTarget, type SigsHeaders, type SigsTarget } from './host.ts';
import { joinHostPort, type ClusterRegistry } from './registry.ts';
import type { RouteTable } from './route-table.ts';

/** Lower-case header name → value; repeated headers joined (cookies with '; ', others with ','). */
export type RequestHeaders = ReadonlyMap<string, string>;

export interface DecideContext {
  table: RouteTable;
  domain: string;
  /** Worker clusters this router can reach (configured with --worker). */
  clusters: ReadonlySet<string>;
  /** Cluster for API requests that name no sandbox (create, list). */
  defaultCluster: string;
  /** The federation from the feeds' clusters messages. Absent: only `clusters` exist. */
  federation?: ClusterRegistry;
  /** Send creates and lists on the edge listener to the `hub` upstream while the hub is connected (--hub-upstream on). */
  hubUpstream?: boolean;
}

/** Which Envoy listener the request came in on (the ext_proc stream's x-asb-listener metadata). */
export type Listener = 'edge' | 'ingress';

export type Decision =
  | {
      kind: 'route';
      /** Headers to set (overwrite), values as they go on the wire. */
      set: [string, string][];
      /** Client-sent headers to remove. */
      remove: string[];
      /** Set-Cookie value (asb_access) to add to the response. */
      setCookie: string | undefined;
      /** Sandbox served (for activity), if the upstream is a sandbox. */
      sandboxId: string | undefined;
      /** Owning cluster of that sandbox. */
      cluster: string | undefined;
      /** The other cluster whose ingress the request is forwarded to (metrics). */
      ingress: string | undefined;
      /** The pod address and port, when the upstream is the sandbox itself: a request held for a wake waits until it accepts connections. */
      pod?: { host: string; port: number };
    }
  /** e2bSandboxId: answer as E2B's proxy does for a sandbox it cannot find (502 and its JSON), which the SDKs read as "sandbox not running". */
  | { kind: 'reject'; error: AsbError; retryAfterS: number | undefined; e2bSandboxId?: string }
  /** Sandbox not running yet: hold until the table shows it running (wake: ask its worker to resume it). */
  | { kind: 'hold'; entry: RouteEntry; wake: boolean }
  /** Id not in the table: ask its worker whether it exists before answering 404. */
  | { kind: 'lookup'; id: string; cluster: string; e2b: boolean }
  /**
   * The table says paused and not resumable by traffic, but a connect may have resumed it a moment
   * before the feed said so: ask its worker, and answer `paused` only if the worker agrees.
   */
  | { kind: 'confirm'; entry: RouteEntry; paused: Decision };

/** Seconds a client should wait before retrying a 503: a wake takes ~0.2-2 s. */
export const RETRY_AFTER_S = 2;
const E2B_HEADERS: readonly string[] = [HEADER.e2bSandboxId, HEADER.e2bSandboxPort];
/** The grant of an envd call that needs no token at the router (the worker checks its signature). */
const TOKENLESS: AccessGranted = Object.freeze({ setCookie: undefined, cookieWithoutToken: undefined });

export function decide(headers: RequestHeaders, ctx: DecideContext, listener: Listener = 'edge'): Decision {
  let target;
  try {
    target = parseTarget(
      {
        authority: headers.get(':authority') ?? headers.get('host') ?? '',
        path: headers.get(':path') ?? '/',
        e2bSandboxId: headers.get(HEADER.e2bSandboxId),
        e2bSandboxPort: headers.get(HEADER.e2bSandboxPort),
        ...sigsHeaders(headers),
      },
      ctx.domain,
    );
  } catch (err) {
    return rejectFrom(err);
  }
  const { table } = ctx;

  if (target.kind === 'api') {
    const id = target.id;
    if (id === undefined && listener === 'edge' && ctx.hubUpstream === true && viaHub(ctx) && isHubRequest(headers)) {
      return route(headers, [[HEADER.upstream, UPSTREAM.hub]], undefined, undefined, undefined);
    }
    const owner = id === undefined ? undefined : ownerOf(id, ctx);
    if (id !== undefined && owner !== undefined && isElsewhere(owner, ctx)) return toOtherCluster(headers, id, owner, ctx, listener);
    const cluster = owner ?? ctx.defaultCluster;
    const down = unreachable(cluster, ctx);
    if (down !== undefined) return down;
    return route(headers, [[HEADER.upstream, `api-${cluster}`]], undefined, undefined, undefined);
  }

  // The kubernetes-sigs SDK's Direct mode can carry only client-wide static headers, so these
  // requests bear the team's API key instead of a sandbox's access token. The router cannot check
  // a key; it refuses a request with none before anything else (nothing is looked up or woken for
  // it), and the owning worker checks the key and the team before anything reaches the pod.
  if (target.sigs !== undefined && !hasApiKey(headers)) {
    return { kind: 'reject', error: new AsbError('Unauthorized', 'X-Sandbox-ID requests need an API key of the sandbox\'s team: send "Authorization: Bearer asb_…" or "X-API-Key: asb_…" (the SDK\'s extra_headers)'), retryAfterS: undefined };
  }
  const entry = table.get(target.id);
  if (entry === undefined) {
    // E2B's SDKs take only its proxy's 502 for "this sandbox is gone": a 404 from envd's port
    // would surface as an unexplained error instead of SandboxNotFoundError.
    const e2b = target.sigs === undefined && (target.port === DEFAULT_SANDBOX_PORT || target.e2bHeaders === true);
    if (table.isKnownMissing(target.id)) return notFound(target.id, e2b);
    const owner = ownerOf(target.id, ctx);
    if (owner !== undefined && isElsewhere(owner, ctx)) return toOtherCluster(headers, target.id, owner, ctx, listener);
    const cluster = owner ?? (ctx.clusters.size === 1 ? ctx.defaultCluster : undefined);
    if (cluster === undefined) return notFound(target.id, e2b);
    return unreachable(cluster, ctx) ?? { kind: 'lookup', id: target.id, cluster, e2b };
  }

  const port = target.port ?? entry.defaultPort;
  if (port === AGENT_PORT) {
    return { kind: 'reject', error: new AsbError('Forbidden', `port ${String(AGENT_PORT)} of a sandbox is its init's, for the worker only: it is never reachable from outside; serve your app on another port`), retryAfterS: undefined };
  }
  if (target.sigs !== undefined) return toWorkerSigs(headers, entry, port, target.sigs, ctx);

  const envdOnWorker = port === DEFAULT_SANDBOX_PORT && entry.envdInPod !== true;
  let granted;
  try {
    // Before any wake: a request without the token must not be able to wake a sandbox.
    if (envdOnWorker && entry.state === 'running' && headers.get(HEADER.accessToken) === undefined && isTokenlessEnvdCall(headers)) granted = TOKENLESS;
    else granted = checkAccess(entry, port, { header: headers.get(HEADER.accessToken), cookie: headers.get('cookie') });
  } catch (err) {
    return rejectFrom(err);
  }

  switch (entry.state) {
    case 'failed':
    case 'expired':
      return { kind: 'reject', error: new AsbError('Unavailable', `sandbox ${entry.id} is ${entry.state}`), retryAfterS: undefined };
    case 'hibernated':
      // Paused without auto-resume (E2B): what E2B's proxy answers, and nothing wakes.
      if (entry.resumeOnTraffic === false) {
        const paused: Decision = { kind: 'reject', error: new AsbError('NotFound', `sandbox ${entry.id} is paused and resumes only through connect (created without auto_resume)`), retryAfterS: undefined, e2bSandboxId: entry.id };
        // A worker this edge cannot reach cannot be asked: the table's word stands.
        return unreachable(entry.cluster, ctx) === undefined ? { kind: 'confirm', entry, paused } : paused;
      }
      return unreachable(entry.cluster, ctx) ?? { kind: 'hold', entry, wake: true };
    case 'starting':
    case 'running':
      if (entry.state === 'starting' || entry.podIp === undefined) return { kind: 'hold', entry, wake: false };
  }
  if (envdOnWorker) return toWorkerEnvd(headers, entry, ctx);
  const set: [string, string][] = [
    // HTTP/1.1 unless the template declares the port HTTP/2 (envoy/edge.yaml, sandbox-h2c).
    [HEADER.upstream, entry.h2cPorts?.includes(port) === true ? UPSTREAM.sandboxH2c : UPSTREAM.sandbox],
    [HEADER.destination, joinHostPort(entry.podIp, port)],
    [HEADER.sandboxId, entry.id],
  ];
  let removeCookie = false;
  if (granted.cookieWithoutToken !== undefined) {
    if (granted.cookieWithoutToken === '') removeCookie = true;
    else set.push(['cookie', granted.cookieWithoutToken]);
  }
  const setCookie = granted.setCookie === undefined ? undefined : accessCookie(granted.setCookie, isHttps(headers));
  const decision = route(headers, set, setCookie, entry.id, entry.cluster);
  if (decision.kind === 'route') {
    if (removeCookie) decision.remove.push('cookie');
    decision.pod = { host: entry.podIp, port };
  }
  return decision;
}

function route(headers: RequestHeaders, set: [string, string][], setCookie: string | undefined, sandboxId: string | undefined, cluster: string | undefined): Decision {
  return { kind: 'route', set, remove: clientHeaders(headers, set, isClientRoutingHeader), setCookie, sandboxId, cluster, ingress: undefined };
}

/** Client headers matching `strip`, except those `set` overwrites anyway (append unset): removing them as well is pointless. */
function clientHeaders(headers: RequestHeaders, set: [string, string][], strip: (name: string) => boolean): string[] {
  const remove: string[] = [];
  for (const name of headers.keys()) {
    if (!strip(name)) continue;
    if (set.some(([key]) => key === name)) continue;
    remove.push(name);
  }
  return remove;
}

/** The cluster owning `id`: its route entry's, else its tag's (the federation's registry first, then tags the feeds showed). */
function ownerOf(id: string, ctx: DecideContext): string | undefined {
  const entry = ctx.table.get(id);
  if (entry !== undefined) return entry.cluster;
  const tag = clusterTagOf(id);
  if (tag === undefined) return undefined;
  return ctx.federation?.clusterOfTag(tag) ?? ctx.table.clusterOfId(id);
}

/** A cluster of the federation that this router has no feed for: reached through its ingress. */
function isElsewhere(cluster: string, ctx: DecideContext): boolean {
  return !ctx.clusters.has(cluster) && ctx.federation?.cluster(cluster) !== undefined;
}

function toOtherCluster(headers: RequestHeaders, id: string, owner: string, ctx: DecideContext, listener: Listener): Decision {
  if (listener === 'ingress') {
    // Forwarding again could bounce between two edges whose registries disagree.
    const served = [...ctx.clusters].join(', ');
    return { kind: 'reject', error: new AsbError('NotFound', `sandbox ${id} belongs to cluster ${owner}; this ingress serves ${served}`), retryAfterS: undefined };
  }
  const target = ctx.federation?.ingress(owner) ?? { ok: false, reason: `cluster ${owner} is not in the federation this edge knows` };
  if (!target.ok) return { kind: 'reject', error: new AsbError('Unavailable', target.reason), retryAfterS: RETRY_AFTER_S };
  const set: [string, string][] = [
    [HEADER.upstream, UPSTREAM.ingress],
    [HEADER.destination, target.destination],
  ];
  // Only our own prefix: the token, cookie and E2B headers are for the owning cluster's router.
  const remove = clientHeaders(headers, set, (name) => name.startsWith(INTERNAL_HEADER_PREFIX));
  return { kind: 'route', set, remove, setCookie: undefined, sandboxId: undefined, cluster: undefined, ingress: owner };
}

/** envd on the owning worker: its API upstream, the sandbox named in x-asb-sandbox-id, the token kept for the worker to check. */
function toWorkerEnvd(headers: RequestHeaders, entry: RouteEntry, ctx: DecideContext): Decision {
  const down = unreachable(entry.cluster, ctx);
  if (down !== undefined) return down;
  const set: [string, string][] = [
    [HEADER.upstream, `api-${entry.cluster}`],
    [HEADER.sandboxId, entry.id],
  ];
  const remove = clientHeaders(headers, set, (name) => name !== HEADER.accessToken && isClientRoutingHeader(name));
  return { kind: 'route', set, remove, setCookie: undefined, sandboxId: entry.id, cluster: entry.cluster, ingress: undefined };
}

/**
 * A request routed by the X-Sandbox-* headers: to the owning worker's API in every state but
 * failed/expired, with the validated port, namespace and timeout in x-asb-* headers. It is not
 * held here: the worker wakes or waits for the sandbox only after the key and team check, so a
 * request with a made-up key cannot wake anyone's sandbox. The API key travels on for the worker
 * (which strips it before the pod); every x-sandbox-*, E2B, access-token and x-asb-* header the
 * client sent is removed.
 */
function toWorkerSigs(headers: RequestHeaders, entry: RouteEntry, port: number, sigs: SigsTarget, ctx: DecideContext): Decision {
  if (entry.state === 'failed' || entry.state === 'expired') {
    return { kind: 'reject', error: new AsbError('Unavailable', `sandbox ${entry.id} is ${entry.state}`), retryAfterS: undefined };
  }
  const down = unreachable(entry.cluster, ctx);
  if (down !== undefined) return down;
  const set: [string, string][] = [
    [HEADER.upstream, `api-${entry.cluster}`],
    [HEADER.sandboxId, entry.id],
    [HEADER.sandboxPort, String(port)],
    [HEADER.sandboxNamespace, sigs.namespace],
  ];
  if (sigs.timeoutS !== undefined) set.push([HEADER.sandboxTimeout, String(sigs.timeoutS)]);
  const remove = clientHeaders(headers, set, isClientRoutingHeader);
  return { kind: 'route', set, remove, setCookie: undefined, sandboxId: entry.id, cluster: entry.cluster, ingress: undefined };
}

/** The client's X-Sandbox-* routing headers, if it sent any of them. */
function sigsHeaders(headers: RequestHeaders): { sigs?: SigsHeaders } {
  const sigs: SigsHeaders = {
    id: headers.get(HEADER.sigsSandboxId),
    namespace: headers.get(HEADER.sigsSandboxNamespace),
    port: headers.get(HEADER.sigsSandboxPort),
    timeout: headers.get(HEADER.sigsSandboxTimeout),
  };
  return Object.values(sigs).every((v) => v === undefined) ? {} : { sigs };
}

/** Whether the client presented an API key at all (the worker verifies it). */
function hasApiKey(headers: RequestHeaders): boolean {
  const auth = headers.get('authorization');
  if (auth !== undefined) return /^Bearer\s+\S+\s*$/i.test(auth);
  return (headers.get('x-api-key') ?? '').trim() !== '';
}

/** envd calls that carry no access token: the SDK's isRunning probe, and /files with a signed URL (the worker checks the signature). */
function isTokenlessEnvdCall(headers: RequestHeaders): boolean {
  const path = headers.get(':path') ?? '';
  const pathname = pathnameOf(path);
  if (pathname === '/health') return headers.get(':method') === 'GET';
  return pathname === '/files' && new URLSearchParams(path.slice(pathname.length + 1)).has('signature');
}

/**
 * Whether creates and lists go to the hub: while a worker says its hub link is up, and also while
 * this edge's own worker is down after one said so (a crashed worker, being restarted): then only
 * the hub can place the create on another cluster. A hub that is down too answers 503 at Envoy,
 * as the own worker's absence would have.
 */
function viaHub(ctx: DecideContext): boolean {
  const federation = ctx.federation;
  if (federation === undefined) return false;
  return federation.hubConnected || (federation.hubLastSeen && !ctx.table.isConnected(ctx.defaultCluster));
}

/** Ours, E2B SDK ≤ 2.50's and E2B SDK 2.51's create and list paths: exact, never a sandbox's own path. */
const HUB_PATHS: ReadonlySet<string> = new Set(['/v1/sandboxes', '/sandboxes', '/v2/sandboxes']);

/** E2B's template lists: `GET` only (a `POST /templates` is a build, run by this edge's cluster). */
const HUB_LIST_PATHS: ReadonlySet<string> = new Set(['/templates', '/v2/templates']);

/** `POST` (create, placed by the hub) or `GET` (list across clusters) on a HUB_PATHS path, or a `GET` of HUB_LIST_PATHS; any query string. */
function isHubRequest(headers: RequestHeaders): boolean {
  const method = headers.get(':method');
  const pathname = pathnameOf(headers.get(':path') ?? '');
  if (method === 'GET' && HUB_LIST_PATHS.has(pathname)) return true;
  if (method !== 'POST' && method !== 'GET') return false;
  return HUB_PATHS.has(pathname);
}

/**
 * Whether the client spoke HTTPS: Envoy overwrites x-forwarded-proto on the edge listeners
 * (use_remote_address, no trusted hops) and trusts the forwarding edge's on the ingress one.
 */
function isHttps(headers: RequestHeaders): boolean {
  return headers.get('x-forwarded-proto') === 'https';
}

/** `:path` without its query string. */
function pathnameOf(path: string): string {
  const query = path.indexOf('?');
  return query === -1 ? path : path.slice(0, query);
}

/** Routing or internal headers a client may send but must never reach Envoy's routing or a sandbox. */
export function isClientRoutingHeader(name: string): boolean {
  return name.startsWith(INTERNAL_HEADER_PREFIX) || name.startsWith(SIGS_HEADER_PREFIX) || name === HEADER.accessToken || E2B_HEADERS.includes(name);
}

function unreachable(cluster: string, ctx: DecideContext): Decision | undefined {
  if (!ctx.clusters.has(cluster)) {
    return { kind: 'reject', error: new AsbError('Unavailable', `cluster ${cluster} is not reachable from this edge`), retryAfterS: RETRY_AFTER_S };
  }
  if (!ctx.table.isConnected(cluster)) {
    return { kind: 'reject', error: new AsbError('Unavailable', `cluster ${cluster} is unreachable (its worker API is down)`), retryAfterS: RETRY_AFTER_S };
  }
  return undefined;
}

export function notFound(id: string, e2b: boolean): Decision {
  const decision: Decision = { kind: 'reject', error: new AsbError('NotFound', `sandbox ${id} not found`), retryAfterS: undefined };
  if (e2b) decision.e2bSandboxId = id;
  return decision;
}

function rejectFrom(err: unknown): Decision {
  if (err instanceof AsbError) return { kind: 'reject', error: err, retryAfterS: undefined };
  throw err;
}
