// What the sandbox resolver answers, pure: a name the policy does not allow gets NXDOMAIN (the
// client stops at once, nothing is looked up upstream, so the name never leaves the node); an
// allowed name gets only the addresses the policy would let the sandbox connect to, so a DNS
// answer never opens a CIDR a rule or the private default denies (decideEgress with the name:
// addresses are judged before names). Record types other than A and AAAA get an empty answer:
// TXT, NULL and friends are how data is tunnelled out through DNS.
import { DEFAULT_FLOOR, FLOOR_RULE, floorEntry, type EgressFloor } from '../network/egress-floor.ts';
import { decideDomain, decideEgress, type EgressPolicy } from '../network/egress-policy.ts';
import { QTYPE, RCODE } from './dns-wire.ts';

export interface Lookup {
  /** 'nxdomain' when the name does not exist upstream. */
  addresses: readonly string[] | 'nxdomain';
  ttlS: number;
}

export interface DnsAnswer {
  rcode: number;
  addresses: readonly string[];
  ttlS: number;
  /** The rule that decided: the name's, or the one that removed the last address. */
  rule: string;
  /** answered: at least one address (or an empty answer for another type); refused: the name; filtered: every address removed. */
  verdict: 'answered' | 'refused' | 'filtered';
}

/** Negative answers are cached by clients this long (seconds): a policy update reaches them soon. */
export const NEGATIVE_TTL_S = 5;
/** A policy replaced while the sandbox runs takes effect on cached answers within this (seconds). */
export const MAX_TTL_S = 60;

/** Step 1: may the name be asked about at all? undefined: yes, go and look it up. */
export function refuseName(policy: EgressPolicy | undefined, name: string): DnsAnswer | undefined {
  if (policy === undefined) return { rcode: RCODE.refused, addresses: [], ttlS: 0, rule: 'unknown-source', verdict: 'refused' };
  const verdict = decideDomain(policy, name);
  if (!verdict.allowed) return { rcode: RCODE.nxDomain, addresses: [], ttlS: NEGATIVE_TTL_S, rule: verdict.rule, verdict: 'refused' };
  return undefined;
}

export function wantsAddresses(qtype: number): 4 | 6 | undefined {
  return qtype === QTYPE.a ? 4 : qtype === QTYPE.aaaa ? 6 : undefined;
}

/** Step 2: the lookup's addresses, filtered by the worker's floor (egress-floor.ts), then the policy. */
export function filterAnswer(policy: EgressPolicy, name: string, lookup: Lookup, floor: EgressFloor = DEFAULT_FLOOR): DnsAnswer {
  const allowRule = decideDomain(policy, name).rule;
  if (lookup.addresses === 'nxdomain') return { rcode: RCODE.nxDomain, addresses: [], ttlS: NEGATIVE_TTL_S, rule: allowRule, verdict: 'answered' };
  const kept: string[] = [];
  let deniedBy: string | undefined;
  for (const ip of lookup.addresses) {
    // Port 0: the resolver does not know the port; no rule names ports.
    const v = floorEntry(floor, ip) !== undefined ? { allowed: false, rule: FLOOR_RULE } : decideEgress(policy, { ip, port: 0, domain: name });
    if (v.allowed) kept.push(ip);
    else deniedBy ??= v.rule;
  }
  const ttlS = Math.min(lookup.ttlS, MAX_TTL_S);
  if (kept.length === 0 && deniedBy !== undefined) return { rcode: RCODE.noError, addresses: [], ttlS: NEGATIVE_TTL_S, rule: deniedBy, verdict: 'filtered' };
  return { rcode: RCODE.noError, addresses: kept, ttlS, rule: allowRule, verdict: 'answered' };
}
