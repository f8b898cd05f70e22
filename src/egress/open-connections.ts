// What the egress proxy let through and may still be open, per pod, and which of it a new policy
// forbids, pure. The kernel's conntrack cut (src/network/conntrack-cut.ts) ends forwarded flows
// only: a proxied connection is two sockets of Envoy's (the pod's, accepted on gateway:port, and
// the upstream's), judged once by the decision service when it opened, and a policy that shrank
// left it running for its whole life. The decision service records every allowed Check here,
// keyed by the pod's address and source port (what Envoy's downstream socket is to the kernel);
// on a policy change the worker re-decides them with the new policy and closes the sockets of
// the denied ones (proxy-sockets.ts), and only those.
import { nameOf, decideConnection, type DecisionInputs } from './egress-decision.ts';
import type { CheckAttributes } from './authz-codec.ts';

/**
 * Connections remembered per pod. The kernel holds a pod to 256 open proxy connections
 * (connection-limits.ts proxyConnections); closed ones are pruned on every cut and whenever a pod
 * passes this bound, so 1,024 leaves room for 768 closed ones between prunes.
 */
export const MAX_CONNECTIONS_PER_POD = 1024;

export interface OpenConnection {
  /** Every allowed Check of the connection: one for TCP/TLS (network filter), one per plain-HTTP request. */
  checks: CheckAttributes[];
  /** Per check: whether its name came from the sandbox resolver when it was judged (DecisionInputs.resolved). */
  resolved: boolean[];
}

export class OpenConnections {
  /** pod IP → pod source port → connection. Map order is insertion order: oldest first. */
  readonly #pods = new Map<string, Map<number, OpenConnection>>();

  /**
   * An allowed Check. A network-filter Check (no `http`) is the first of a new connection: it
   * replaces what a closed connection on the same port left. Whether the pod is now over the
   * bound (the caller then prunes it).
   */
  record(check: CheckAttributes, resolvedName: boolean): boolean {
    const port = check.sourcePort;
    if (port === undefined) return false;
    let ports = this.#pods.get(check.sourceIp);
    if (ports === undefined) {
      ports = new Map();
      this.#pods.set(check.sourceIp, ports);
    }
    const known = check.http === undefined ? undefined : ports.get(port);
    if (known === undefined) {
      ports.delete(port);
      ports.set(port, { checks: [check], resolved: [resolvedName] });
    } else if (!known.checks.some((c) => c.http?.host === check.http?.host && c.destinationIp === check.destinationIp && c.destinationPort === check.destinationPort)) {
      // Requests on one kept-alive connection: each new name once (a connection reused for the
      // same host a thousand times is one entry).
      known.checks.push(check);
      known.resolved.push(resolvedName);
    }
    return ports.size > MAX_CONNECTIONS_PER_POD;
  }

  /** Keeps only the connections of `podIp` whose port is in `live`; past the bound, the oldest go too. */
  keepOnly(podIp: string, live: ReadonlySet<number>): void {
    const ports = this.#pods.get(podIp);
    if (ports === undefined) return;
    for (const port of [...ports.keys()]) if (!live.has(port)) ports.delete(port);
    for (const port of ports.keys()) {
      if (ports.size <= MAX_CONNECTIONS_PER_POD) break;
      ports.delete(port);
    }
    if (ports.size === 0) this.#pods.delete(podIp);
  }

  ports(podIp: string): number[] {
    return [...(this.#pods.get(podIp)?.keys() ?? [])];
  }

  get(podIp: string, port: number): OpenConnection | undefined {
    return this.#pods.get(podIp)?.get(port);
  }

  forget(podIp: string, port?: number): void {
    const ports = this.#pods.get(podIp);
    if (port !== undefined) ports?.delete(port);
    if (port === undefined || ports?.size === 0) this.#pods.delete(podIp);
  }
}

/** Whether the sandbox resolver gave the pod the address of the check's name (true when there is no name or no resolver check). */
export function nameResolvedFor(check: CheckAttributes, inputs: Pick<DecisionInputs, 'resolved'>): boolean {
  const raw = check.http?.host ?? check.sni;
  const name = raw === undefined ? undefined : nameOf(raw);
  if (name === undefined || inputs.resolved === undefined) return true;
  return inputs.resolved(check.sourceIp, name, check.destinationIp);
}

/**
 * The source ports of `podIp`'s open connections that the decision inputs (the new policy, read
 * through inputs.source) now deny: a connection goes when any of its checks would be denied now.
 * A name is trusted as it was when the connection opened (an answer that expired since does not
 * cut it; one that never came from the resolver is still judged by address).
 */
export function portsToCut(open: OpenConnections, podIp: string, inputs: DecisionInputs): number[] {
  const cut: number[] = [];
  for (const port of open.ports(podIp)) {
    const conn = open.get(podIp, port);
    if (conn === undefined) continue;
    const denied = conn.checks.some((check, i) => !decideConnection(check, { ...inputs, resolved: () => conn.resolved[i] ?? false }).allowed);
    if (denied) cut.push(port);
  }
  return cut;
}
