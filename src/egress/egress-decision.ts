// The egress proxy's decision, pure: from what Envoy saw on a sandbox's outbound connection (or
// plain-HTTP request) and the sandbox's policy to allow/deny, the rule that decided, and the
// headers to inject. The policy semantics are decideEgress's (src/network/egress-policy.ts);
// this module only picks the name to judge by (the TLS SNI for HTTPS, the Host header for plain
// HTTP, none for anything else) and the credential headers. Wire: authz-service.ts.
import { isIP } from 'node:net';
import { DEFAULT_FLOOR, FLOOR_RULE, floorEntry, type EgressFloor } from '../network/egress-floor.ts';
import { decideEgress, normaliseDomain, type EgressPolicySource as PolicyByPodIp } from '../network/egress-policy.ts';
import type { CheckAttributes } from './authz-codec.ts';
import { credentialHeaders, type CredentialSource } from './credentials.ts';

/** pod IP → policy (NET-CONTRACT.md; the worker implements it), plus the sandbox id for metrics and logs. */
export interface EgressPolicySource extends PolicyByPodIp {
  sandboxForPodIp?(ip: string): string | undefined;
}

export type EgressProtocol = 'tls' | 'http' | 'tcp';

export interface EgressDecision {
  allowed: boolean;
  /** The policy entry that decided, decideEgress's default-*, or one of ours: unknown-source, sni-host-mismatch. */
  rule: string;
  /** Sandbox id, or the source IP when the source is not a known pod. */
  sandbox: string;
  protocol: EgressProtocol;
  /** The name judged (SNI or Host), lower case, without port or trailing dot. */
  domain?: string;
  /** Credential headers to set on the upstream request (HTTP only). */
  setHeaders?: readonly { name: string; value: string }[];
}

/** The DNS name in an SNI or Host header (port and trailing dot dropped), or undefined for IP literals and junk (judged by IP alone). */
export function nameOf(raw: string): string | undefined {
  let name = raw.trim();
  if (name.startsWith('[')) return undefined; // [v6]:port
  const colon = name.lastIndexOf(':');
  if (colon !== -1 && /^\d+$/.test(name.slice(colon + 1))) name = name.slice(0, colon);
  if (isIP(name) !== 0) return undefined;
  return normaliseDomain(name);
}

export interface DecisionInputs {
  source: EgressPolicySource;
  credentials?: CredentialSource;
  /**
   * Whether the sandbox resolver gave this pod `ip` for `name` (resolved-addresses.ts). When
   * given, a name opens only those addresses: a connection whose SNI/Host an allow entry names
   * but whose address did not come from our resolver is judged by its address alone (rule
   * `address-not-resolved` when that denies it). Without it names are taken at their word.
   */
  resolved?: (podIp: string, name: string, ip: string) => boolean;
  /** Addresses denied whatever the policy (src/network/egress-floor.ts). Default DEFAULT_FLOOR (cloud metadata). */
  floor?: EgressFloor;
}

/** Rules that are a domain entry (not a CIDR, not a default). */
function isDomainRule(rule: string): boolean {
  return !rule.startsWith('default-') && !rule.includes('/') && isIP(rule) === 0 && normaliseDomain(rule.replace(/^\*\./, '')) !== undefined;
}

export function decideConnection(check: CheckAttributes, inputs: DecisionInputs): EgressDecision {
  const { source, credentials, resolved } = inputs;
  const protocol: EgressProtocol = check.http !== undefined ? 'http' : check.sni !== undefined ? 'tls' : 'tcp';
  const policy = source.policyForPodIp(check.sourceIp);
  const sandbox = source.sandboxForPodIp?.(check.sourceIp) ?? check.sourceIp;
  // Only pods reach the egress listener (the kernel redirects their traffic here); anything else
  // is a misconfiguration or an attempt to use the proxy as an open relay.
  if (policy === undefined) return { allowed: false, rule: 'unknown-source', sandbox, protocol };
  const sni = check.sni === undefined ? undefined : nameOf(check.sni);
  const host = check.http === undefined ? undefined : nameOf(check.http.host);
  // The floor before the policy: no allow entry, CIDR or name, opens it.
  if (floorEntry(inputs.floor ?? DEFAULT_FLOOR, check.destinationIp) !== undefined) return { allowed: false, rule: FLOOR_RULE, sandbox, protocol };
  const target = { ip: check.destinationIp, port: check.destinationPort };
  const judge = (domain: string | undefined) => decideEgress(policy, domain === undefined ? target : { ...target, domain });
  const domain = host ?? sni;
  let verdict = judge(domain);
  const base = { sandbox, protocol, ...(domain === undefined ? {} : { domain }) };
  if (verdict.allowed && domain !== undefined && resolved !== undefined && isDomainRule(verdict.rule) && !resolved(check.sourceIp, domain, check.destinationIp)) {
    const byAddress = judge(undefined);
    verdict = byAddress.allowed ? byAddress : { allowed: false, rule: 'address-not-resolved' };
  }
  if (!verdict.allowed) return { allowed: false, rule: verdict.rule, ...base };
  // An HTTP request on a TLS connection we terminated (credential hosts only): the SNI chose the
  // certificate and the Host the upstream name and credential; they must be the same name, or an
  // allowed SNI could carry a request (and a credential) for a host the policy never judged.
  if (host !== undefined && sni !== undefined && sni !== host) return { allowed: false, rule: 'sni-host-mismatch', ...base };
  if (check.http === undefined || domain === undefined || credentials === undefined) return { allowed: true, rule: verdict.rule, ...base };
  const setHeaders = credentialHeaders(credentials, sandbox, domain, check.http.path);
  return { allowed: true, rule: verdict.rule, ...base, ...(setHeaders.length === 0 ? {} : { setHeaders }) };
}
