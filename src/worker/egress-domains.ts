// Domain entries of an egress policy are decided only by the egress proxy and its DNS resolver
// (src/egress/); the kernel rules know CIDRs alone. With the proxy off (ASB_EGRESS_PROXY_PORT=off,
// the Kubernetes runtime, a worker that starts no pod) a domain entry would decide nothing: a
// `deny: ["evil.example"]` beside the internet would let evil.example through, an `allow` would
// silently open nothing. So the API refuses such a policy, naming each entry, before anything is
// stored or applied.
import { AsbError, type FieldProblem } from '../errors.ts';
import { parseCidr, type EgressPolicy } from '../network/egress-policy.ts';

/** Where the request put each list: `network.allow` (REST), `network.allowOut` (E2B). */
export interface PolicyFields {
  allow: string;
  deny: string;
}

/** Throws Invalid (422) naming every domain entry, when the egress proxy is off. */
export function requireProxyForDomains(proxyOn: boolean, policy: EgressPolicy, fields: PolicyFields): void {
  if (proxyOn) return;
  const problems: FieldProblem[] = [];
  const check = (entries: readonly string[], field: string): void => {
    entries.forEach((entry, i) => {
      if (parseCidr(entry) === undefined) problems.push({ field: `${field}[${i}]`, message: `"${entry}" is a domain, and the egress proxy is off on this cluster (worker --egress-proxy-port / ASB_EGRESS_PROXY_PORT): only CIDRs can be enforced; use CIDRs or turn the proxy on` });
    });
  };
  check(policy.allow, fields.allow);
  check(policy.deny, fields.deny);
  if (problems.length > 0) throw new AsbError('Invalid', `request body is invalid: ${problems.map((f) => `${f.field}: ${f.message}`).join('; ')}`, { fields: problems });
}
