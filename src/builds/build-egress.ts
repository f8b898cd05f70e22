// What a template build's RUN steps may reach, pure: the worker's --build-egress bounds every
// build, and a build request may carry its own policy inside that bound (a template that only
// needs pypi.org asks for pypi.org). A request may narrow, never widen: each `allow` entry must be
// one the worker's policy already lets through, and `internet` needs the worker's internet. The
// effective policy keeps the worker's deny entries besides the request's. It goes into each RUN
// step's cache key (steps.ts), so a layer built under one policy never serves another.
//
// "Lets through", against the decision order of egress-policy.ts:
// - an entry covered by a worker `allow` entry (a CIDR inside one of its CIDRs, a name its name or
//   wildcard covers) is allowed by the worker too;
// - else, when the worker allows the internet: a CIDR is, unless it reaches a private range
//   (`default-private`) or a worker `deny` CIDR (an allow beats a deny, so it would open it); a
//   domain is, unless a worker `deny` domain covers it;
// - else the worker's `default-no-internet` denies it.
import { AsbError, type FieldProblem } from '../errors.ts';
import { cidrContains, DEFAULT_EGRESS_POLICY, DEFAULT_RULES, parseCidr, parseEgressPolicy, PRIVATE_RANGES, type Cidr, type EgressPolicy } from '../network/egress-policy.ts';

export const NO_EGRESS: EgressPolicy = Object.freeze({ internet: false, allow: Object.freeze([]), deny: Object.freeze([]) });

/**
 * A policy as `--build-egress` and `asb template build --egress` spell it: `internet` (a
 * sandbox's default), `none`, or a comma-separated allow-list of CIDRs, IPs and domains and
 * nothing else. Invalid (422) naming `field` when an entry is none of those.
 */
export function parseEgressText(text: string, field: string): EgressPolicy {
  const value = text.trim();
  if (value === '' || value === 'internet') return DEFAULT_EGRESS_POLICY;
  if (value === 'none') return NO_EGRESS;
  return parseEgressPolicy({ internet: false, allow: value.split(',').map((e) => e.trim()).filter((e) => e !== '') }, field);
}

/** A request's `egress`: the text form, or the object form `{internet?, allow?, deny?}` sandboxes take. */
export function parseBuildEgressInput(input: unknown, field: string): EgressPolicy {
  return typeof input === 'string' ? parseEgressText(input, field) : parseEgressPolicy(input, field);
}

const PRIVATE_CIDRS: readonly Cidr[] = PRIVATE_RANGES.map((text) => parseCidr(text) as Cidr);

function cidrWithin(inner: Cidr, outer: Cidr): boolean {
  return outer.prefix <= inner.prefix && cidrContains(outer, { family: inner.family, value: inner.base });
}

function cidrsOverlap(a: Cidr, b: Cidr): boolean {
  return cidrWithin(a, b) || cidrWithin(b, a);
}

/** Whether domain entry `outer` matches every name `inner` matches. */
function domainWithin(inner: string, outer: string): boolean {
  if (!outer.startsWith('*.')) return inner === outer;
  const suffix = outer.slice(1); // ".example.com": names below example.com, not example.com itself
  return (inner.startsWith('*.') ? inner.slice(1) : inner).endsWith(suffix);
}

function entryWithin(inner: string, outer: string): boolean {
  const a = parseCidr(inner);
  const b = parseCidr(outer);
  if (a !== undefined || b !== undefined) return a !== undefined && b !== undefined && cidrWithin(a, b);
  return domainWithin(inner, outer);
}

/** The worker rule that would keep `entry` out, or undefined when the worker lets it through. */
function blockingRule(entry: string, worker: EgressPolicy): string | undefined {
  if (worker.allow.some((w) => entryWithin(entry, w))) return undefined;
  if (!worker.internet) return DEFAULT_RULES.noInternet;
  const cidr = parseCidr(entry);
  if (cidr !== undefined) {
    const denied = worker.deny.find((d) => {
      const c = parseCidr(d);
      return c !== undefined && cidrsOverlap(cidr, c);
    });
    if (denied !== undefined) return `deny ${denied}`;
    return PRIVATE_CIDRS.some((p) => cidrsOverlap(cidr, p)) ? DEFAULT_RULES.private : undefined;
  }
  const denied = worker.deny.find((d) => parseCidr(d) === undefined && domainWithin(entry, d));
  return denied === undefined ? undefined : `deny ${denied}`;
}

/**
 * The policy a build runs under: `requested` when it stays within `worker` (plus the worker's
 * deny entries), else Forbidden (403) naming each entry that would widen it and the worker rule
 * it would get past. `field` names the request's field (`egress`).
 */
export function narrowEgress(requested: EgressPolicy, worker: EgressPolicy, field: string): EgressPolicy {
  const problems: FieldProblem[] = [];
  if (requested.internet && !worker.internet) {
    problems.push({ field: `${field}.internet`, message: `the internet is closed to builds on this worker (rule ${DEFAULT_RULES.noInternet} of its --build-egress); name the hosts the build needs instead` });
  }
  for (const [i, entry] of requested.allow.entries()) {
    const rule = blockingRule(entry, worker);
    if (rule !== undefined) problems.push({ field: `${field}.allow[${String(i)}]`, message: `"${entry}" is not allowed by this worker's --build-egress (rule ${rule}): a template may narrow what the worker allows, never widen it` });
  }
  if (problems.length > 0) throw new AsbError('Forbidden', `the build's egress widens the worker's: ${problems.map((p) => `${p.field}: ${p.message}`).join('; ')}`, { fields: problems });
  const deny = [...worker.deny, ...requested.deny.filter((d) => !worker.deny.includes(d))];
  return Object.freeze({ internet: requested.internet && worker.internet, allow: Object.freeze([...requested.allow]), deny: Object.freeze(deny) });
}
