// How much of the host's shared network services one sandbox may hold, pure: the numbers, why
// they are what they are, and the nftables statements that enforce them per pod (nft-ruleset.ts
// puts them in each pod's own chains; every count and bucket is keyed by the pod's address).
//
// What one sandbox could exhaust before these bounds (measured on this 2-core VM, kernel 6.18):
// 24,000 connections to the egress proxy took Envoy to 20,000 of 20,000 descriptors (its edge for
// every tenant stopped answering); 18,000 TCP connections to the DNS resolver from each of two
// sandboxes took the worker to 20,000 descriptors (another team's exec failed: spawn EMFILE); one
// process added 16–24k connection-tracking entries a second with UDP flows to the gateway.
//
// The budgets the numbers are chosen against:
// - Descriptors: Envoy and the worker run under this host's limit of 20,000 (`ulimit -Hn`).
//   A proxied connection holds 2 of Envoy's (the sandbox's side and the upstream), a DNS TCP
//   connection 1 of the worker's.
// - The conntrack table: nf_conntrack_max is 262,144 here. An accepted flow holds an entry while
//   open (UDP: 30 s after its last packet, nf_conntrack_udp_timeout), and a closed TCP connection
//   120 s more in TIME_WAIT (nf_conntrack_tcp_timeout_time_wait), so the new-connection rate
//   bounds that part: rate × 120 s. A rejected flow is never confirmed and holds no entry.
// - A worker runs up to ~300 sandboxes (the warm-pool refill the runtime is sized for).
//
// Over a bound the connection is rejected, never dropped: TCP gets a reset and UDP ICMP
// admin-prohibited, so a client learns at once (ECONNREFUSED / EHOSTUNREACH) instead of waiting
// out a retransmission timer. `ct count` counts a pod's connections that are open now (the
// kernel forgets closed and timed-out ones); `limit rate` is a token bucket per pod and bound.
// Both live in a set element per pod address (limitSets), reached from the pod's own chains.

export interface ConnectionLimits {
  /**
   * TCP connections open at once to the egress proxy (direct, or redirected there by the NAT
   * rules). 256 is Chrome's whole-profile socket limit and far above what pip, npm (15 sockets)
   * or git hold; 256 × 2 = 512 of Envoy's 20,000 descriptors (2.6 %).
   */
  proxyConnections: number;
  /** New connections a second to the egress proxy (and the burst allowed above it). */
  proxyRate: Rate;
  /**
   * TCP connections open at once to the DNS resolver. A stub resolver uses TCP only when a UDP
   * answer was truncated, one connection per query; 32 is 0.16 % of the worker's 20,000
   * descriptors, and the resolver itself takes 4,096 from all sandboxes together (dns-resolver.ts).
   */
  dnsTcpConnections: number;
  /**
   * UDP flows (source ports) to the DNS resolver tracked at once. glibc opens a new socket per
   * lookup and each flow lives 30 s in the table, so 1,024 allows ~34 new lookups a second
   * sustained, with bursts of 1,024. The resolver holds one socket for all of them: the bound is
   * for the conntrack table (0.4 % of it).
   */
  dnsUdpFlows: number;
  /** New flows a second to the DNS resolver, UDP and TCP together. */
  dnsRate: Rate;
  /**
   * Flows the host forwards for the sandbox (straight to an allowed address: UDP, and TCP when
   * there is no egress proxy or a CIDR opens it) open at once.
   */
  egressFlows: number;
  /** New forwarded flows a second. */
  egressRate: Rate;
}

export interface Rate {
  perSecond: number;
  /** Connections allowed at once above the rate, after a quiet period (the bucket's size). */
  burst: number;
}

/**
 * The defaults. One sandbox at its every bound holds at most 256 + 32 + 1,024 + 256 open entries
 * and (50 + 50 + 100) × 120 s of TIME_WAIT: ~25,600 of 262,144 conntrack entries (under 10 %),
 * 512 of Envoy's descriptors and 32 of the worker's. 50 new connections a second each way, with
 * a burst of 250, is above what an agent's package installs and fetches open (they keep
 * connections alive) and 300 times under the measured flood.
 */
export const DEFAULT_CONNECTION_LIMITS: Readonly<ConnectionLimits> = Object.freeze({
  proxyConnections: 256,
  proxyRate: { perSecond: 50, burst: 250 },
  dnsTcpConnections: 32,
  dnsUdpFlows: 1024,
  dnsRate: { perSecond: 100, burst: 500 },
  egressFlows: 256,
  egressRate: { perSecond: 50, burst: 250 },
});

/** Rule names (nft comments, egress counter labels) of connections refused by a bound. */
export const LIMIT_RULES = {
  proxyConnections: 'limit-proxy-connections',
  proxyRate: 'limit-proxy-rate',
  dnsTcpConnections: 'limit-dns-tcp-connections',
  dnsUdpFlows: 'limit-dns-udp-flows',
  dnsRate: 'limit-dns-rate',
  egressFlows: 'limit-egress-flows',
  egressRate: 'limit-egress-rate',
} as const;

/** What one bound matches before its statement, and how it counts. */
export interface LimitRule {
  /** nft match expression (empty: every packet the chain sees). */
  match: string;
  /**
   * nft statement that is true over the bound, keyed by the pod's address in a set of the
   * table's (limitSets): `add @set { ip saddr ct count over N }` or `update @set { ip saddr
   * limit rate over … }`. The count and the bucket live in the set's element, not in the rule,
   * so refilling the pod's chain (every policy change and wake) does not start them again: a
   * tenant could otherwise gain a fresh bound with each policy update.
   */
  over: string;
  /** The LIMIT_RULES name. */
  rule: string;
}

type LimitName = keyof typeof LIMIT_RULES;
const KIND: Record<LimitName, 'count' | 'rate'> = {
  proxyConnections: 'count',
  proxyRate: 'rate',
  dnsTcpConnections: 'count',
  dnsUdpFlows: 'count',
  dnsRate: 'rate',
  egressFlows: 'count',
  egressRate: 'rate',
};

/** The set holding one bound's state per pod address: lim_proxy_connections, … */
const setName = (name: LimitName): string => `lim_${LIMIT_RULES[name].slice('limit-'.length).replaceAll('-', '_')}`;

/**
 * The table's sets for the bounds, one per bound, keyed by pod address (a /16 has at most
 * 65,534). An element goes when it holds nothing: a count's when its last connection ends (the
 * kernel's garbage collection), a bucket's a minute after its last use (full again by then).
 */
export function limitSets(): string[] {
  return (Object.keys(LIMIT_RULES) as LimitName[]).map((name) =>
    KIND[name] === 'count' ? `set ${setName(name)} { type ipv4_addr; size 65536; flags dynamic; }` : `set ${setName(name)} { type ipv4_addr; size 65536; flags dynamic,timeout; timeout 1m; }`,
  );
}

const bound = (name: LimitName, match: string, limits: ConnectionLimits): LimitRule => {
  const value = limits[name];
  const over = typeof value === 'number' ? `add @${setName(name)} { ip saddr ct count over ${String(value)} }` : `update @${setName(name)} { ip saddr limit rate over ${String(value.perSecond)}/second burst ${String(value.burst)} packets }`;
  return { match, over, rule: LIMIT_RULES[name] };
};

/**
 * The bounds of a pod's connections to the host's services on its gateway, in the order they
 * go before the rules that accept those services. Only services the worker runs get theirs.
 */
export function gatewayLimitRules(gateway: string, services: { egressProxyPort?: number; dns?: boolean }, limits: ConnectionLimits = DEFAULT_CONNECTION_LIMITS): LimitRule[] {
  const rules: LimitRule[] = [];
  if (services.egressProxyPort !== undefined) {
    const to = `ip daddr ${gateway} tcp dport ${String(services.egressProxyPort)}`;
    rules.push(bound('proxyConnections', to, limits), bound('proxyRate', to, limits));
  }
  if (services.dns === true) {
    rules.push(
      bound('dnsTcpConnections', `ip daddr ${gateway} tcp dport 53`, limits),
      bound('dnsUdpFlows', `ip daddr ${gateway} udp dport 53`, limits),
      bound('dnsRate', `ip daddr ${gateway} meta l4proto { tcp, udp } th dport 53`, limits),
    );
  }
  return rules;
}

/**
 * The bounds of the flows the host forwards for a pod. They come before the policy's own
 * rules, so a flood of denied connections spends the pod's own bucket too: it slows only itself.
 */
export function egressLimitRules(limits: ConnectionLimits = DEFAULT_CONNECTION_LIMITS): LimitRule[] {
  return [bound('egressFlows', '', limits), bound('egressRate', '', limits)];
}
