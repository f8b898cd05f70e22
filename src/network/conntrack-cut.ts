// Which of a pod's open forwarded flows a new egress policy forbids, pure: the kernel rules
// (nft-ruleset.ts) accept established packets before a pod's chain, so a policy that shrinks only
// stops new connections; a connection opened under the old policy kept running for its whole life.
// The runtime lists the pod's flows (`conntrack -L -s <pod ip>`), asks cutDestinations which
// destinations the new policy denies, and deletes those entries (`conntrack -D -s <pod ip> -d
// <destination>`): the next packet of such a flow, from either side, is a new one, decided by the
// new rules and rejected with a TCP reset, so both ends see the connection end.
//
// Only forwarded flows are the kernel's to cut: the subnet is masqueraded when it leaves by another
// interface, so a forwarded flow's reply goes to another address than the pod's. A flow whose
// reply comes back to the pod's own address ends on the host: the egress proxy (DNAT'ed to the
// gateway, decided by name there), the resolver, or the host's own services, never cut here.
import { floorEntry, type EgressFloor } from './egress-floor.ts';
import { compileEgressPolicy, decideEgress, DEFAULT_RULES, type EgressPolicy } from './egress-policy.ts';

export interface ConntrackFlow {
  /** tcp, udp, icmp, ... as conntrack prints it. */
  proto: string;
  /** The original direction's source and destination. */
  src: string;
  dst: string;
  /** The reply direction's destination: the pod's address unless the flow was masqueraded. */
  replyDst: string;
}

/** `conntrack -L` lines (its default text format) → flows; lines it cannot read are skipped. */
export function parseConntrackFlows(text: string): ConntrackFlow[] {
  const flows: ConntrackFlow[] = [];
  for (const line of text.split('\n')) {
    const proto = /^\s*(\S+)/.exec(line)?.[1];
    const src = [...line.matchAll(/\bsrc=(\S+)/g)].map((m) => m[1]);
    const dst = [...line.matchAll(/\bdst=(\S+)/g)].map((m) => m[1]);
    const [origSrc, replySrc] = src;
    const [origDst, replyDst] = dst;
    if (proto === undefined || origSrc === undefined || origDst === undefined || replySrc === undefined || replyDst === undefined) continue;
    flows.push({ proto, src: origSrc, dst: origDst, replyDst });
  }
  return flows;
}

export interface ForwardContext {
  /** The worker's floor (egress-floor.ts): never reachable, whatever the policy. */
  floor: EgressFloor;
  /** Whether an egress proxy judges domains (without one, a policy denying domains fails closed on the internet). */
  proxy: boolean;
}

/**
 * Whether the kernel's forward chain of a pod with `policy` lets a new flow to `ip` through: the
 * same order as podScript's f_ chain (floor, allowed CIDRs, denied CIDRs, private ranges, deny-all,
 * the internet default), which is decideEgress's order for an address without a name.
 */
export function forwardAllowed(policy: EgressPolicy, ip: string, ctx: ForwardContext): boolean {
  if (floorEntry(ctx.floor, ip) !== undefined) return false;
  const verdict = decideEgress(policy, { ip, port: 0 }); // ports decide nothing in a policy
  if (!verdict.allowed) return false;
  if (verdict.rule === DEFAULT_RULES.internet && !ctx.proxy && compileEgressPolicy(policy).denyDomains.length > 0) return false;
  return true;
}

/** The destinations of `podIp`'s forwarded flows that `policy` now forbids, each once. */
export function cutDestinations(flows: readonly ConntrackFlow[], podIp: string, policy: EgressPolicy, ctx: ForwardContext): string[] {
  const cut = new Set<string>();
  for (const flow of flows) {
    if (flow.src !== podIp || flow.replyDst === podIp || cut.has(flow.dst)) continue;
    if (!forwardAllowed(policy, flow.dst, ctx)) cut.add(flow.dst);
  }
  return [...cut];
}
