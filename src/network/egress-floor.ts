// The worker's egress floor: addresses no sandbox reaches whatever its policy says. A policy's
// `allow` CIDR beats everything else in decideEgress (E2B's allowOut semantics), so without a
// floor a tenant's create override `allow: ["169.254.0.0/16"]` reaches the node's cloud metadata
// service and with it the node's cloud credentials. The floor is checked before the policy by
// every enforcer: the kernel rules (nft-ruleset.ts, first in the forward chain and never DNAT'ed),
// the egress proxy's decision (src/egress/egress-decision.ts) and the DNS resolver's answers
// (src/egress/dns-answer.ts). Set per worker (--egress-floor), never per template or sandbox.
import { cidrContains, parseAddress, parseCidr, type Cidr } from './egress-policy.ts';

/**
 * Cloud metadata and credential endpoints: AWS, GCP, Azure, OpenStack and Oracle IMDS
 * (169.254.169.254, AWS's IPv6 fd00:ec2::254), the ECS task and EKS pod-identity credential
 * agents (169.254.170.2, 169.254.170.23, fd00:ec2::23) and Alibaba Cloud's (100.100.100.200).
 */
export const DEFAULT_EGRESS_FLOOR: readonly string[] = Object.freeze([
  '169.254.169.254/32',
  '169.254.170.2/32',
  '169.254.170.23/32',
  '100.100.100.200/32',
  'fd00:ec2::254/128',
  'fd00:ec2::23/128',
]);

/** The rule name the floor's denials are counted and logged under. */
export const FLOOR_RULE = 'floor';

export interface EgressFloor {
  readonly cidrs: readonly Cidr[];
}

/** Parses CIDRs or IPs; the entries that are neither are returned as problems (config.ts lists them all). */
export function parseEgressFloor(entries: readonly string[]): { floor: EgressFloor; bad: string[] } {
  const cidrs: Cidr[] = [];
  const bad: string[] = [];
  for (const entry of entries) {
    const cidr = parseCidr(entry.trim());
    if (cidr === undefined) bad.push(entry);
    else cidrs.push(cidr);
  }
  return { floor: Object.freeze({ cidrs: Object.freeze(cidrs) }), bad };
}

export const DEFAULT_FLOOR: EgressFloor = parseEgressFloor(DEFAULT_EGRESS_FLOOR).floor;

/** The floor entry containing `ip` (IPv4-mapped and NAT64 forms folded), or undefined. An unparseable address is not the floor's to judge (the policy denies it). */
export function floorEntry(floor: EgressFloor, ip: string): string | undefined {
  const address = parseAddress(ip);
  if (address === undefined) return undefined;
  return floor.cidrs.find((c) => cidrContains(c, address))?.text;
}
