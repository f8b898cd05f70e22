// What the data plane needs to know about one sandbox, derived from the Sandbox object alone
// (so the route feed never reads a template): its state for routing, the pod address, the port
// behind `<sandboxId>.<domain>`, the ports open without a token, and its token hash.
import type { Sandbox } from '../api/types.ts';
import { ANNOTATION, LABEL } from '../api/types.ts';
import { DEFAULT_SANDBOX_PORT, type RouteEntry } from '../router/contract.ts';
import type { AccessTokens } from './access-token.ts';
import { E2B_ANNOTATION } from './e2b/shape.ts';

/**
 * `asb.dev/envd: pod` on a template's spec.podTemplate.metadata.annotations: the image runs its own
 * envd on port 49983, so the router sends that port to the pod. Without it the worker answers
 * envd for the sandbox. Declaring port 49983 is not the signal: the built-in base template
 * declares it (so URLs name the envd port) and runs no envd.
 */
export const ENVD_ANNOTATION = 'asb.dev/envd';

/** The port `<sandboxId>.<domain>` reaches: the main (first) container's first declared port, else 49983 (envd's). */
export function defaultPortOf(sandbox: Sandbox): number {
  return sandbox.spec.podTemplate.spec.containers[0]?.ports?.[0]?.containerPort ?? DEFAULT_SANDBOX_PORT;
}

/** appProtocol values that mean HTTP/2 without TLS: Kubernetes' standard name (Gateway API GEP-1911), and the short names Istio and Linkerd read the same way. */
const H2C_APP_PROTOCOLS: ReadonlySet<string> = new Set(['kubernetes.io/h2c', 'h2c', 'grpc']);

/** Container ports (any container) whose appProtocol declares HTTP/2 without TLS, sorted; the edge speaks HTTP/1.1 to every other port. */
export function h2cPortsOf(sandbox: Sandbox): number[] {
  const ports = new Set<number>();
  for (const container of sandbox.spec.podTemplate.spec.containers) {
    for (const port of container.ports ?? []) {
      if (port.appProtocol !== undefined && H2C_APP_PROTOCOLS.has(port.appProtocol.toLowerCase())) ports.add(port.containerPort);
    }
  }
  return [...ports].sort((a, b) => a - b);
}

/**
 * Ports from the `asb.dev/public-ports` annotation ("8080, 3000"), sorted, without duplicates.
 * Items that are not a port number are skipped: a typo must never make a private port public,
 * and skipping can only make fewer ports public.
 */
export function publicPortsOf(sandbox: Pick<Sandbox, 'metadata'>): number[] {
  const raw = sandbox.metadata.annotations?.[ANNOTATION.publicPorts];
  if (raw === undefined) return [];
  const ports = new Set<number>();
  for (const item of raw.split(',')) {
    const text = item.trim();
    const port = Number(text);
    if (/^\d{1,5}$/.test(text) && port >= 1 && port <= 65535) ports.add(port);
  }
  return [...ports].sort((a, b) => a - b);
}

/** The routing state of a sandbox; a request to a `hibernated` one wakes it. */
export function routeStateOf(sandbox: Sandbox): RouteEntry['state'] {
  switch (sandbox.status?.phase) {
    case 'Running':
      // The operator writes Running only with the Ready condition; without an address there is nowhere to send traffic yet.
      return sandbox.status.podIPs?.[0] === undefined ? 'starting' : 'running';
    case 'Hibernating':
    case 'Hibernated':
      return 'hibernated';
    case 'Failed':
      return 'failed';
    case 'Expired':
      return 'expired';
    default:
      return 'starting';
  }
}

/**
 * Whether traffic may wake the sandbox while it is suspended: not when it was made through E2B's
 * API without auto_resume (e2b.dev/auto-resume "false") and suspended by its user or at its timeout,
 * which E2B resumes only through connect. An idle hibernation is ours, not the user's: it wakes.
 */
export function resumesOnTraffic(sandbox: Sandbox): boolean {
  const annotations = sandbox.metadata.annotations ?? {};
  return annotations[E2B_ANNOTATION.autoResume] !== 'false' || annotations[ANNOTATION.suspendedIdle] === 'true';
}

/**
 * The route entry of a sandbox, or undefined when it must not be routable: an unclaimed warm pool
 * member (no owner yet, so no user can hold its token) or one being deleted (it stops answering
 * at once rather than when its finalizer is gone).
 */
export function routeEntryOf(sandbox: Sandbox, cluster: string, tokens: AccessTokens): RouteEntry | undefined {
  const owner = sandbox.metadata.labels?.[LABEL.owner];
  if (owner === undefined || owner === '' || sandbox.metadata.deletionTimestamp !== undefined) return undefined;
  const id = sandbox.metadata.name;
  const state = routeStateOf(sandbox);
  const podIp = sandbox.status?.podIPs?.[0];
  const entry: RouteEntry = {
    id,
    cluster,
    state,
    defaultPort: defaultPortOf(sandbox),
    publicPorts: publicPortsOf(sandbox),
    tokenHash: tokens.tokenHashOf(sandbox),
    owner,
  };
  if (state === 'running' && podIp !== undefined) entry.podIp = podIp;
  if (sandbox.spec.podTemplate.metadata?.annotations?.[ENVD_ANNOTATION] === 'pod') entry.envdInPod = true;
  if (state === 'hibernated' && !resumesOnTraffic(sandbox)) entry.resumeOnTraffic = false;
  const h2cPorts = h2cPortsOf(sandbox);
  if (h2cPorts.length > 0) entry.h2cPorts = h2cPorts;
  return entry;
}

/** Field-by-field equality: the feed sends a delta only when the entry really changed. */
export function sameEntry(a: RouteEntry, b: RouteEntry): boolean {
  return (
    a.id === b.id &&
    a.cluster === b.cluster &&
    a.podIp === b.podIp &&
    a.state === b.state &&
    a.defaultPort === b.defaultPort &&
    a.tokenHash === b.tokenHash &&
    a.owner === b.owner &&
    a.envdInPod === b.envdInPod &&
    a.resumeOnTraffic === b.resumeOnTraffic &&
    a.publicPorts.length === b.publicPorts.length &&
    a.publicPorts.every((p, i) => p === b.publicPorts[i]) &&
    (a.h2cPorts ?? []).length === (b.h2cPorts ?? []).length &&
    (a.h2cPorts ?? []).every((p, i) => p === b.h2cPorts?.[i])
  );
}
