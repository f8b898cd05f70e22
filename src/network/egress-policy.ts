// A sandbox's egress policy and the one decision every enforcer makes from it, pure: the kernel
// rules (nft-ruleset.ts) enforce the address part, the egress proxy and the DNS resolver add the
// domain part, and all of them name the same deciding rule in their counters.
//
// The decision, in this order (the first that matches decides):
// 1. an `allow` CIDR containing the address: allowed. An explicit allow beats every deny and
//    the private default (E2B: allowOut takes precedence over denyOut);
// 2. a `deny` CIDR containing it (other than a catch-all /0, see 6): denied;
// 3. a private, link-local, loopback or otherwise non-public address (PRIVATE_RANGES): denied,
//    rule `default-private`. The host's own addresses are the kernel's to deny (the worker
//    knows them, this function does not);
// 4. the target's domain (TLS SNI, HTTP Host or DNS question) matching an `allow` domain:
//    allowed; matching a `deny` domain: denied. Steps 1–3 ran first, so a domain entry never
//    opens an address a CIDR entry or the private default denies ("a DNS answer never opens a
//    denied CIDR");
// 5. (no step: a domain only decides when the enforcer knows one);
// 6. a catch-all `deny` of the whole address family (`0.0.0.0/0`, `::/0`): denied. It comes after
//    the domains because E2B's documented allow-list is `denyOut: ['0.0.0.0/0'], allowOut:
//    ['api.example.com']`: the /0 means "nothing else", like `internet: false`;
// 7. otherwise `internet` decides: `default-internet` or `default-no-internet`.
//
// Domains: exact names, or `*.example.com` for every name below example.com (not example.com
// itself), compared case-insensitively without a trailing dot. Among matches the most specific
// names the rule: the longest CIDR prefix, an exact name before a wildcard, a longer wildcard
// before a shorter one. An IPv4-mapped (::ffff:a.b.c.d) or NAT64 (64:ff9b::a.b.c.d) IPv6
// address is decided as the IPv4 address it carries, so no spelling reaches 127.0.0.1 or
// 10.0.0.0/8 around a rule.
import { isIP } from 'node:net';
import { AsbError, type FieldProblem } from '../errors.ts';

export interface EgressPolicy {
  /** false: nothing outside the sandbox is reachable except what `allow` names (and the cluster DNS resolver). Default true. */
  readonly internet: boolean;
  /** CIDRs or IPs ("203.0.113.0/24", "2001:db8::1") and domains ("api.example.com", "*.example.com"). */
  readonly allow: readonly string[];
  /** Same forms. */
  readonly deny: readonly string[];
}

/** One outbound connection. domain = SNI, Host, or DNS question, when the enforcer knows one. */
export interface EgressTarget {
  ip: string;
  port: number;
  domain?: string;
}

export interface EgressVerdict {
  allowed: boolean;
  /** The entry that decided (as normalised by parseEgressPolicy), or one of DEFAULT_RULES. */
  rule: string;
}

/** Maps a sandbox's pod IP to its policy (the worker implements it, the egress proxy and DNS resolver consume it). */
export interface EgressPolicySource {
  policyForPodIp(ip: string): EgressPolicy | undefined;
  /**
   * Calls `listener` with the pod's address each time a running pod's policy changed, once
   * policyForPodIp answers the new one, and waits for it before the change is acknowledged (the
   * egress proxy closes what the new policy forbids: src/egress/proxy-cut.ts); and when the pod
   * is removed, before its address can go to another (policyForPodIp then answers undefined,
   * which denies everything). The unsubscribe.
   */
  onPolicyChange?(listener: (podIp: string) => Promise<void>): () => void;
}

export const DEFAULT_RULES = {
  internet: 'default-internet',
  private: 'default-private',
  noInternet: 'default-no-internet',
} as const;

export const DEFAULT_EGRESS_POLICY: EgressPolicy = Object.freeze({ internet: true, allow: Object.freeze([]), deny: Object.freeze([]) });

/** Per list. Each entry is a kernel set element and may be a counter label: 256 keeps both small. */
export const MAX_EGRESS_ENTRIES = 256;

/**
 * Addresses that are not the public internet, denied unless an `allow` CIDR names them. The
 * RFC 1918 and RFC 6598 ranges, loopback, link-local (the cloud metadata endpoint
 * 169.254.169.254), "this network" 0/8 (connecting to 0.0.0.0 reaches the local host on Linux),
 * IETF protocol assignments, benchmarking, multicast and reserved space; for IPv6 the
 * unspecified and loopback addresses and the IPv4-compatible block (::/96), unique-local,
 * link-local and multicast. The documentation ranges (TEST-NET 192.0.2/24, 198.51.100/24,
 * 203.0.113/24, 2001:db8::/32) stay "public": tests place their stand-in internet there.
 */
export const PRIVATE_RANGES: readonly string[] = Object.freeze([
  '0.0.0.0/8',
  '10.0.0.0/8',
  '100.64.0.0/10',
  '127.0.0.0/8',
  '169.254.0.0/16',
  '172.16.0.0/12',
  '192.0.0.0/24',
  '192.168.0.0/16',
  '198.18.0.0/15',
  '224.0.0.0/4',
  '240.0.0.0/4',
  '::/96',
  'fc00::/7',
  'fe80::/10',
  'ff00::/8',
]);

// ---------------------------------------------------------------- addresses

export interface Cidr {
  readonly family: 4 | 6;
  /** The network address (host bits cleared). */
  readonly base: bigint;
  readonly prefix: number;
  /** Canonical text: "10.0.0.0/8", "2001:db8::/32"; a single address keeps no suffix ("203.0.113.7"). */
  readonly text: string;
}

const BITS = { 4: 32, 6: 128 } as const;
const MAPPED_V4 = 0xffffn << 32n; // ::ffff:0:0/96
const NAT64_V4 = 0x0064ff9bn << 96n; // 64:ff9b::/96
const LOW32 = 0xffffffffn;

function parseV4(text: string): bigint {
  return text.split('.').reduce((acc, part) => (acc << 8n) | BigInt(Number(part)), 0n);
}

function parseV6(text: string): bigint {
  // An embedded IPv4 tail ("::ffff:1.2.3.4") becomes its two hex words first.
  let body = text;
  const lastColon = body.lastIndexOf(':');
  if (body.includes('.', lastColon)) {
    const v4 = parseV4(body.slice(lastColon + 1));
    body = `${body.slice(0, lastColon + 1)}${(v4 >> 16n).toString(16)}:${(v4 & 0xffffn).toString(16)}`;
  }
  const halves = body.split('::');
  const words = (s: string): bigint[] => (s === '' ? [] : s.split(':').map((w) => BigInt(parseInt(w, 16))));
  const head = words(halves[0] ?? '');
  const rest = halves.length > 1 ? words(halves[1] ?? '') : [];
  const full = [...head, ...new Array<bigint>(8 - head.length - rest.length).fill(0n), ...rest];
  return full.reduce((acc, w) => (acc << 16n) | w, 0n);
}

/** An address as family + value, IPv4-mapped and NAT64 IPv6 folded to the IPv4 they carry; undefined if not an IP. */
export function parseAddress(text: string): { family: 4 | 6; value: bigint } | undefined {
  const kind = isIP(text);
  if (kind === 4) return { family: 4, value: parseV4(text) };
  if (kind !== 6 || text.includes('%')) return undefined;
  const value = parseV6(text);
  if (value >> 32n === MAPPED_V4 >> 32n || value >> 32n === NAT64_V4 >> 32n) return { family: 4, value: value & LOW32 };
  return { family: 6, value };
}

function formatAddress(family: 4 | 6, value: bigint): string {
  if (family === 4) return [24n, 16n, 8n, 0n].map((s) => String((value >> s) & 0xffn)).join('.');
  const words = Array.from({ length: 8 }, (_, i) => Number((value >> BigInt(112 - 16 * i)) & 0xffffn));
  // RFC 5952: compress the longest run (≥ 2) of zero words, the first if tied.
  let best = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    let j = i;
    while (j < 8 && words[j] === 0) j++;
    if (j - i > bestLen) {
      best = i;
      bestLen = j - i;
    }
    i = j === i ? i + 1 : j;
  }
  const hex = words.map((w) => w.toString(16));
  if (best < 0) return hex.join(':');
  return `${hex.slice(0, best).join(':')}::${hex.slice(best + bestLen).join(':')}`;
}

function mask(family: 4 | 6, prefix: number): bigint {
  const bits = BigInt(BITS[family]);
  return ((1n << bits) - 1n) ^ ((1n << (bits - BigInt(prefix))) - 1n);
}

/** "10.1.2.3/8" → 10.0.0.0/8 (host bits cleared); "2001:db8::1" → /128; undefined if not a CIDR or IP. */
export function parseCidr(text: string): Cidr | undefined {
  const slash = text.indexOf('/');
  const addrText = slash < 0 ? text : text.slice(0, slash);
  const prefixText = slash < 0 ? undefined : text.slice(slash + 1);
  const kind = isIP(addrText);
  if (kind === 0 || addrText.includes('%')) return undefined;
  let prefix = kind === 4 ? 32 : 128;
  if (prefixText !== undefined) {
    if (!/^\d{1,3}$/.test(prefixText)) return undefined;
    prefix = Number(prefixText);
    if (prefix > (kind === 4 ? 32 : 128)) return undefined;
  }
  let family: 4 | 6 = kind === 4 ? 4 : 6;
  let value = kind === 4 ? parseV4(addrText) : parseV6(addrText);
  // ::ffff:10.0.0.0/104 is 10.0.0.0/8: entries are compared with folded addresses.
  if (family === 6 && prefix >= 96 && (value >> 32n === MAPPED_V4 >> 32n || value >> 32n === NAT64_V4 >> 32n)) {
    family = 4;
    value &= LOW32;
    prefix -= 96;
  }
  const base = value & mask(family, prefix);
  const single = prefix === BITS[family];
  return Object.freeze({ family, base, prefix, text: single ? formatAddress(family, base) : `${formatAddress(family, base)}/${String(prefix)}` });
}

export function cidrContains(cidr: Cidr, address: { family: 4 | 6; value: bigint }): boolean {
  return cidr.family === address.family && (address.value & mask(cidr.family, cidr.prefix)) === cidr.base;
}

const PRIVATE_CIDRS: readonly Cidr[] = PRIVATE_RANGES.map((text) => parseCidr(text) as Cidr);

/** True for an address in PRIVATE_RANGES (after folding IPv4-mapped and NAT64 forms); true for a non-address too. */
export function isPrivateAddress(ip: string): boolean {
  const address = parseAddress(ip);
  return address === undefined || PRIVATE_CIDRS.some((c) => cidrContains(c, address));
}

// ---------------------------------------------------------------- domains

const LABEL = /^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$/;

/** Lower-case, no trailing dot; undefined if not a host name (a last label of digits only is an address typo, not a name). */
export function normaliseDomain(text: string): string | undefined {
  const name = text.toLowerCase().replace(/\.$/, '');
  if (name.length === 0 || name.length > 253) return undefined;
  const labels = name.split('.');
  if (!labels.every((l) => LABEL.test(l))) return undefined;
  if (/^\d+$/.test(labels[labels.length - 1] ?? '')) return undefined;
  return name;
}

function domainEntry(text: string): string | undefined {
  if (text.startsWith('*.')) {
    const rest = normaliseDomain(text.slice(2));
    return rest === undefined ? undefined : `*.${rest}`;
  }
  return normaliseDomain(text);
}

/** How specific a matching domain entry is (higher wins): exact names beat wildcards, longer beats shorter. */
function domainMatch(entry: string, name: string): number {
  if (entry.startsWith('*.')) return name.endsWith(entry.slice(1)) ? entry.length : -1;
  return entry === name ? 1000 + entry.length : -1;
}

// ---------------------------------------------------------------- the policy

/** A policy's entries sorted by kind, as decideEgress and the kernel rules use them. */
export interface CompiledEgressPolicy {
  readonly internet: boolean;
  readonly allowCidrs: readonly Cidr[];
  /** Deny CIDRs narrower than a whole family. */
  readonly denyCidrs: readonly Cidr[];
  /** `0.0.0.0/0` / `::/0` entries in `deny`: "nothing else" for that family (step 6). */
  readonly denyAll: readonly Cidr[];
  readonly allowDomains: readonly string[];
  readonly denyDomains: readonly string[];
}

const compiled = new WeakMap<EgressPolicy, CompiledEgressPolicy>();

export function compileEgressPolicy(policy: EgressPolicy): CompiledEgressPolicy {
  const cached = compiled.get(policy);
  if (cached !== undefined) return cached;
  const split = (entries: readonly string[]): { cidrs: Cidr[]; domains: string[] } => {
    const cidrs: Cidr[] = [];
    const domains: string[] = [];
    for (const entry of entries) {
      const cidr = parseCidr(entry);
      if (cidr !== undefined) cidrs.push(cidr);
      else {
        const domain = domainEntry(entry);
        if (domain !== undefined) domains.push(domain);
      }
    }
    return { cidrs, domains };
  };
  const allow = split(policy.allow);
  const deny = split(policy.deny);
  const result: CompiledEgressPolicy = Object.freeze({
    internet: policy.internet,
    allowCidrs: allow.cidrs,
    denyCidrs: deny.cidrs.filter((c) => c.prefix > 0),
    denyAll: deny.cidrs.filter((c) => c.prefix === 0),
    allowDomains: allow.domains,
    denyDomains: deny.domains,
  });
  compiled.set(policy, result);
  return result;
}

function longestCidr(cidrs: readonly Cidr[], address: { family: 4 | 6; value: bigint }): Cidr | undefined {
  let best: Cidr | undefined;
  for (const c of cidrs) if (cidrContains(c, address) && (best === undefined || c.prefix > best.prefix)) best = c;
  return best;
}

function bestDomain(entries: readonly string[], name: string): string | undefined {
  let best: string | undefined;
  let bestScore = -1;
  for (const e of entries) {
    const score = domainMatch(e, name);
    if (score > bestScore) {
      best = e;
      bestScore = score;
    }
  }
  return best;
}

/** Whether one outbound connection may go, and the rule that decided (see the top of this file). An unparseable address is denied as `default-private`. */
export function decideEgress(policy: EgressPolicy, target: EgressTarget): EgressVerdict {
  const p = compileEgressPolicy(policy);
  const address = parseAddress(target.ip);
  if (address === undefined) return { allowed: false, rule: DEFAULT_RULES.private };
  const allowCidr = longestCidr(p.allowCidrs, address);
  if (allowCidr !== undefined) return { allowed: true, rule: allowCidr.text };
  const denyCidr = longestCidr(p.denyCidrs, address);
  if (denyCidr !== undefined) return { allowed: false, rule: denyCidr.text };
  if (PRIVATE_CIDRS.some((c) => cidrContains(c, address))) return { allowed: false, rule: DEFAULT_RULES.private };
  const name = target.domain === undefined ? undefined : normaliseDomain(target.domain);
  if (name !== undefined) {
    const allowDomain = bestDomain(p.allowDomains, name);
    if (allowDomain !== undefined) return { allowed: true, rule: allowDomain };
    const denyDomain = bestDomain(p.denyDomains, name);
    if (denyDomain !== undefined) return { allowed: false, rule: denyDomain };
  }
  const all = p.denyAll.find((c) => c.family === address.family);
  if (all !== undefined) return { allowed: false, rule: all.text };
  return p.internet ? { allowed: true, rule: DEFAULT_RULES.internet } : { allowed: false, rule: DEFAULT_RULES.noInternet };
}

/** Whether a DNS name may be resolved at all (the resolver's question check): a domain entry or the defaults decide, addresses come later. */
export function decideDomain(policy: EgressPolicy, domain: string): EgressVerdict {
  const p = compileEgressPolicy(policy);
  const name = normaliseDomain(domain);
  if (name !== undefined) {
    const allowDomain = bestDomain(p.allowDomains, name);
    if (allowDomain !== undefined) return { allowed: true, rule: allowDomain };
    const denyDomain = bestDomain(p.denyDomains, name);
    if (denyDomain !== undefined) return { allowed: false, rule: denyDomain };
  }
  // Names with no entry resolve when their answers could be reachable at all: with the internet
  // on, or when some allow CIDR might hold the answer (checked per answer with decideEgress).
  if (p.denyAll.length > 0 && p.allowCidrs.length === 0) return { allowed: false, rule: p.denyAll[0]?.text ?? DEFAULT_RULES.noInternet };
  if (p.internet || p.allowCidrs.length > 0) return { allowed: true, rule: p.internet ? DEFAULT_RULES.internet : DEFAULT_RULES.noInternet };
  return { allowed: false, rule: DEFAULT_RULES.noInternet };
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Normalises one list's entries (canonical CIDRs, lower-case domains, duplicates removed), pushing a problem for each bad one. */
function parseEntries(raw: unknown, path: string, problems: FieldProblem[]): string[] {
  if (raw === undefined) return [];
  if (!Array.isArray(raw)) {
    problems.push({ field: path, message: 'must be an array of CIDRs, IP addresses or domain names' });
    return [];
  }
  if (raw.length > MAX_EGRESS_ENTRIES) {
    problems.push({ field: path, message: `at most ${String(MAX_EGRESS_ENTRIES)} entries, got ${String(raw.length)}` });
    return [];
  }
  const out: string[] = [];
  raw.forEach((entry: unknown, i) => {
    const field = `${path}[${String(i)}]`;
    if (typeof entry !== 'string') {
      problems.push({ field, message: 'must be a string' });
      return;
    }
    const text = entry.trim();
    const normal = parseCidr(text)?.text ?? (text.includes('/') || text.includes(':') ? undefined : domainEntry(text));
    if (normal === undefined) {
      problems.push({ field, message: `"${entry.slice(0, 100)}" is not a CIDR ("203.0.113.0/24"), an IP address, a domain ("api.example.com") or a wildcard domain ("*.example.com")` });
      return;
    }
    if (!out.includes(normal)) out.push(normal);
  });
  return out;
}

/**
 * `{internet?, allow?, deny?}` → a frozen, normalised policy (internet defaults to true), or an
 * AsbError `Invalid` (422) naming every bad field under `path` ("spec.network.allow[2]").
 */
export function parseEgressPolicy(input: unknown, path: string): EgressPolicy {
  const problems: FieldProblem[] = [];
  if (!isPlainObject(input)) {
    problems.push({ field: path, message: 'must be an object {internet?, allow?, deny?}' });
  } else {
    for (const key of Object.keys(input)) {
      if (key !== 'internet' && key !== 'allow' && key !== 'deny') problems.push({ field: `${path}.${key}`, message: 'unknown field (expected internet, allow, deny)' });
    }
    if (input.internet !== undefined && typeof input.internet !== 'boolean') problems.push({ field: `${path}.internet`, message: 'must be true or false' });
    const allow = parseEntries(input.allow, `${path}.allow`, problems);
    const deny = parseEntries(input.deny, `${path}.deny`, problems);
    if (problems.length === 0) {
      return Object.freeze({ internet: input.internet !== false, allow: Object.freeze(allow), deny: Object.freeze(deny) });
    }
  }
  throw new AsbError('Invalid', `${path} is invalid: ${problems.map((f) => `${f.field}: ${f.message}`).join('; ')}`, { fields: problems });
}

/** Two policies with the same normalised entries (order ignored) are the same policy. */
export function sameEgressPolicy(a: EgressPolicy, b: EgressPolicy): boolean {
  const same = (x: readonly string[], y: readonly string[]): boolean => x.length === y.length && x.every((e) => y.includes(e));
  return a.internet === b.internet && same(a.allow, b.allow) && same(a.deny, b.deny);
}
