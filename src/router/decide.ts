// The routing decision for one request, pure: request headers + route table → route it (with
// the header mutation Envoy needs), answer it here, hold it while the sandbox wakes, or look
// the id up at its worker first. extproc-server.ts turns decisions into ext_proc messages.
import { AsbError } from '../errors.ts';
import { checkAccess } from './access.ts';
import { HEADER, INTERNAL_HEADER_PREFIX, type RouteEntry } from './contract.ts';
import { parseTarget } from './host.ts';
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
}

export type Decision =
  | {
      kind: 'route';
      /** Headers to set (overwrite), values as they go on the wire. */
      set: [string, string][];
      /** Client-sent headers to remove. */
      remove: string[];
      /** Token to hand back as a cookie on the response. */
      setCookie: string | undefined;
      /** Sandbox served (for activity), if the upstream is a sandbox. */
      sandboxId: string | undefined;
      /** Owning cluster of that sandbox. */
      cluster: string | undefined;
    }
  | { kind: 'reject'; error: AsbError; retryAfterS: number | undefined }
  /** Sandbox not running yet: hold until the table shows it running (wake: ask its worker to resume it). */
  | { kind: 'hold'; entry: RouteEntry; wake: boolean }
  /** Id not in the table: ask its worker whether it exists before answering 404. */
  | { kind: 'lookup'; id: string; cluster: string };

/** Seconds a client should wait before retrying a 503: a wake takes ~0.2-2 s. */
export const RETRY_AFTER_S = 2;
const E2B_HEADERS: readonly string[] = [HEADER.e2bSandboxId, HEADER.e2bSandboxPort];

export function decide(headers: RequestHeaders, ctx: DecideContext): Decision {
  let target;
  try {
    target = parseTarget(
      {
        authority: headers.get(':authority') ?? headers.get('host') ?? '',
        path: headers.get(':path') ?? '/',
        e2bSandboxId: headers.get(HEADER.e2bSandboxId),
        e2bSandboxPort: headers.get(HEADER.e2bSandboxPort),
      },
      ctx.domain,
    );
  } catch (err) {
    return rejectFrom(err);
  }
  const { table } = ctx;

  if (target.kind === 'api') {
    const id = target.id;
    const cluster = (id === undefined ? undefined : (table.get(id)?.cluster ?? table.clusterOfId(id))) ?? ctx.defaultCluster;
    const down = unreachable(cluster, ctx);
    if (down !== undefined) return down;
    return route(headers, [[HEADER.upstream, `api-${cluster}`]], undefined, undefined, undefined);
  }

  const entry = table.get(target.id);
  if (entry === undefined) {
    if (table.isKnownMissing(target.id)) return notFound(target.id);
    const cluster = table.clusterOfId(target.id) ?? (ctx.clusters.size === 1 ? ctx.defaultCluster : undefined);
    if (cluster === undefined) return notFound(target.id);
    return unreachable(cluster, ctx) ?? { kind: 'lookup', id: target.id, cluster };
  }

  const port = target.port ?? entry.defaultPort;
  let granted;
  try {
    // Before any wake: a request without the token must not be able to wake a sandbox.
    granted = checkAccess(entry, port, { header: headers.get(HEADER.accessToken), cookie: headers.get('cookie') });
  } catch (err) {
    return rejectFrom(err);
  }

  switch (entry.state) {
    case 'failed':
    case 'expired':
      return { kind: 'reject', error: new AsbError('Unavailable', `sandbox ${entry.id} is ${entry.state}`), retryAfterS: undefined };
    case 'hibernated':
      return unreachable(entry.cluster, ctx) ?? { kind: 'hold', entry, wake: true };
    case 'starting':
    case 'running':
      if (entry.state === 'starting' || entry.podIp === undefined) return { kind: 'hold', entry, wake: false };
  }
  const podIp = entry.podIp;
  const set: [string, string][] = [
    [HEADER.upstream, 'sandbox'],
    [HEADER.destination, podIp.includes(':') ? `[${podIp}]:${port}` : `${podIp}:${port}`],
    [HEADER.sandboxId, entry.id],
  ];
  let removeCookie = false;
  if (granted.cookieWithoutToken !== undefined) {
    if (granted.cookieWithoutToken === '') removeCookie = true;
    else set.push(['cookie', granted.cookieWithoutToken]);
  }
  const decision = route(headers, set, granted.setCookie, entry.id, entry.cluster);
  if (removeCookie && decision.kind === 'route') decision.remove.push('cookie');
  return decision;
}

function route(headers: RequestHeaders, set: [string, string][], setCookie: string | undefined, sandboxId: string | undefined, cluster: string | undefined): Decision {
  const remove: string[] = [];
  for (const name of headers.keys()) {
    if (!isClientRoutingHeader(name)) continue;
    // Headers we set are overwritten anyway (append unset); removing them as well is pointless.
    if (set.some(([key]) => key === name)) continue;
    remove.push(name);
  }
  return { kind: 'route', set, remove, setCookie, sandboxId, cluster };
}

/** Routing or internal headers a client may send but must never reach Envoy's routing or a sandbox. */
export function isClientRoutingHeader(name: string): boolean {
  return name.startsWith(INTERNAL_HEADER_PREFIX) || name === HEADER.accessToken || E2B_HEADERS.includes(name);
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

export function notFound(id: string): Decision {
  return { kind: 'reject', error: new AsbError('NotFound', `sandbox ${id} not found`), retryAfterS: undefined };
}

function rejectFrom(err: unknown): Decision {
  if (err instanceof AsbError) return { kind: 'reject', error: err, retryAfterS: undefined };
  throw err;
}
