// Where a sandbox's egress policy comes from, pure: `spec.network` on the Sandbox (copied from its
// template when it is made, replaced by a create's or a PUT's `network`), else the template's
// kubernetes-sigs `networkPolicy.egress`, else the default. And the two foreign forms that map
// onto it: E2B's create/PUT fields and kubernetes-sigs' NetworkPolicy egress rules.
import { AsbError, type FieldProblem } from '../errors.ts';
import type { SandboxNetwork, SandboxTemplateSpec } from '../api/types.ts';
import { DEFAULT_EGRESS_POLICY, parseEgressPolicy, type EgressPolicy } from '../network/egress-policy.ts';

/** A sandbox's policy from its spec.network (validated when written); absent: the default. */
export function egressPolicyOf(network: SandboxNetwork | undefined): EgressPolicy {
  if (network === undefined) return DEFAULT_EGRESS_POLICY;
  try {
    return parseEgressPolicy(network, 'spec.network');
  } catch {
    // Unreachable for objects written through validation; fail closed for any that were not.
    return { internet: false, allow: [], deny: [] };
  }
}

/** The policy as stored on a Sandbox: only the fields that differ from the default. */
export function networkSpec(policy: EgressPolicy): SandboxNetwork {
  return { internet: policy.internet, ...(policy.allow.length > 0 ? { allow: [...policy.allow] } : {}), ...(policy.deny.length > 0 ? { deny: [...policy.deny] } : {}) };
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * The kubernetes-sigs SandboxTemplate `networkPolicy` (Managed) as our policy, or undefined when it
 * says nothing about egress (no networkPolicy, Unmanaged, or no `egress` list).
 * NetworkPolicy semantics: listed egress rules are the only ones allowed. A rule with no `to`, or
 * an ipBlock of 0.0.0.0/0 or ::/0, is the internet (its `except` CIDRs become deny entries);
 * other ipBlocks are allow entries. Pod and namespace selectors open nothing (sandboxes never
 * reach pods; the cluster DNS resolver is always reachable) and ports are not narrowed: an
 * ipBlock opens every port. An `except` inside a narrower ipBlock cannot be expressed (an allow
 * beats a deny) and is refused, naming the field.
 */
export function templateNetworkPolicy(spec: Pick<SandboxTemplateSpec, 'networkPolicy' | 'networkPolicyManagement'>, path = 'spec.networkPolicy'): EgressPolicy | undefined {
  if (spec.networkPolicyManagement === 'Unmanaged' || !isObject(spec.networkPolicy)) return undefined;
  const egress = spec.networkPolicy.egress;
  if (!Array.isArray(egress)) return undefined;
  let internet = false;
  const allow: string[] = [];
  const deny: string[] = [];
  const problems: FieldProblem[] = [];
  egress.forEach((rule: unknown, i) => {
    const rulePath = `${path}.egress[${String(i)}]`;
    if (!isObject(rule)) {
      problems.push({ field: rulePath, message: 'must be a NetworkPolicyEgressRule object' });
      return;
    }
    if (rule.to === undefined || (Array.isArray(rule.to) && rule.to.length === 0)) {
      internet = true;
      return;
    }
    if (!Array.isArray(rule.to)) {
      problems.push({ field: `${rulePath}.to`, message: 'must be a list of peers' });
      return;
    }
    rule.to.forEach((peer: unknown, j) => {
      const peerPath = `${rulePath}.to[${String(j)}]`;
      if (!isObject(peer) || !isObject(peer.ipBlock)) return;
      const { cidr, except } = peer.ipBlock;
      if (typeof cidr !== 'string') {
        problems.push({ field: `${peerPath}.ipBlock.cidr`, message: 'must be a CIDR' });
        return;
      }
      const excepts = Array.isArray(except) ? except : [];
      if (cidr === '0.0.0.0/0' || cidr === '::/0') {
        internet = true;
        for (const e of excepts) if (typeof e === 'string') deny.push(e);
      } else {
        allow.push(cidr);
        if (excepts.length > 0) problems.push({ field: `${peerPath}.ipBlock.except`, message: 'is supported only inside 0.0.0.0/0 or ::/0 (an allowed CIDR beats a denied one)' });
      }
    });
  });
  if (problems.length > 0) throw new AsbError('Invalid', `${path} cannot be enforced: ${problems.map((f) => `${f.field}: ${f.message}`).join('; ')}`, { fields: problems });
  return parseEgressPolicy({ internet, allow, deny }, `${path}.egress`);
}

/** A template's policy for its new sandboxes: its `network`, else its networkPolicy, else the default. */
export function templateEgress(spec: Pick<SandboxTemplateSpec, 'network' | 'networkPolicy' | 'networkPolicyManagement'>): EgressPolicy {
  if (spec.network !== undefined) return egressPolicyOf(spec.network);
  try {
    return templateNetworkPolicy(spec) ?? DEFAULT_EGRESS_POLICY;
  } catch {
    return { internet: false, allow: [], deny: [] };
  }
}

/**
 * E2B's create and `PUT /sandboxes/{id}/network` (replace = true) fields → our policy, or a 422 naming the field:
 * `allow_internet_access` (create; false is `internet: false`), `network.allowOut` (CIDRs, IPs,
 * domains) and `network.denyOut` (E2B takes CIDRs only there; we also take domains). Undefined
 * when the body sets none of them. Other `network` fields (rules, egressProxy, ...) are refused:
 * accepting them silently would let a user believe they hold.
 */
export function e2bNetwork(allowInternet: unknown, network: unknown, path = 'network', replace = false): EgressPolicy | undefined {
  const problems: FieldProblem[] = [];
  if (allowInternet !== undefined && typeof allowInternet !== 'boolean') problems.push({ field: 'allow_internet_access', message: 'must be true or false' });
  let allowOut: unknown;
  let denyOut: unknown;
  if (network !== undefined && network !== null) {
    if (!isObject(network)) problems.push({ field: path, message: 'must be an object {allowOut?, denyOut?}' });
    else {
      for (const key of Object.keys(network)) {
        if (key === 'allowOut' || key === 'denyOut') continue;
        // Sent with values that change nothing here: public traffic on (our ports need the token
        // unless the template makes them public), and no transform rules.
        const value = network[key];
        if ((key === 'allowPublicTraffic' && value !== false) || value === undefined || value === null) continue;
        if (key === 'rules' && isObject(value) && Object.keys(value).length === 0) continue;
        problems.push({ field: `${path}.${key}`, message: 'is not supported here (only allowOut and denyOut)' });
      }
      ({ allowOut, denyOut } = network);
    }
  }
  if (problems.length > 0) throw new AsbError('Invalid', `request body is invalid: ${problems.map((f) => `${f.field}: ${f.message}`).join('; ')}`, { fields: problems });
  // At create, allow_internet_access true (SDK ≤ 2.50 always sends it) with no lists keeps the
  // template's policy; a PUT replaces the whole policy, so there the same body is the default.
  if (!replace && allowInternet !== false && allowOut === undefined && denyOut === undefined) return undefined;
  let parsed: EgressPolicy;
  try {
    parsed = parseEgressPolicy({ ...(allowOut === undefined ? {} : { allow: allowOut }), ...(denyOut === undefined ? {} : { deny: denyOut }) }, path);
  } catch (err) {
    if (!(err instanceof AsbError)) throw err;
    // Named as the SDK names them: network.allowOut[0], not network.allow[0].
    const rename = (f: string): string => f.replace(`${path}.allow`, `${path}.allowOut`).replace(`${path}.deny`, `${path}.denyOut`);
    const fields = err.fields.map((f) => ({ field: rename(f.field), message: f.message }));
    throw new AsbError('Invalid', `request body is invalid: ${fields.map((f) => `${f.field}: ${f.message}`).join('; ')}`, { fields });
  }
  return Object.freeze({ internet: allowInternet !== false, allow: parsed.allow, deny: parsed.deny });
}
