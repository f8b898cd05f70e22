// The kernel half of sandbox isolation and egress policy, pure: a worker's bridge and each pod on
// it → nftables scripts (`nft -f -` input, one atomic transaction each). pod-firewall.ts runs them.
//
// One `inet` and one `bridge` table per bridge, named after it (asb_<bridge>), so runtimes and
// test files on one host never touch each other's rules. Per pod, chains named after its address
// (inet) or its veth (bridge), reached through verdict maps keyed by the same:
//
// - bridge table, prerouting of each pod port (s_<veth>): frames must carry the pod's own MAC, and
//   IPv4/ARP the pod's own address, else they are dropped. IPv6 and other ethertypes are dropped:
//   pods have IPv4 only. This makes the source address trustworthy for the inet rules below. A
//   port in the `ports` set without a chain's rules is dropped whole. (`meta
//   ibrname` would name the bridge instead of a set of ports: this kernel answers "Operation not
//   supported".)
// - bridge table, forward: every frame from a pod's port to another port is dropped, so pod↔pod
//   at L2 is gone (bridged frames never reach the inet hooks without br_netfilter). The ports are
//   also `isolated on` (network.ts), which holds while the table is being rebuilt.
//   The bridge answers ARP for the whole subnet itself (proxy_arp_pvlan, pod-firewall.ts), so a
//   pod's packet to another pod goes to the host and is REJECTED in forward at once, instead of
//   hanging ~3 s on ARP.
// - inet input from the bridge (i_<key>): to the host itself, on any of its addresses, only the
//   DNS resolver (UDP/TCP 53) and the egress proxy port on the gateway, when configured, each
//   within the pod's bounds (connection-limits.ts: connections open at once, new ones a second).
//   Replies to connections the host opened to the pod (the data plane, probes, envd) are established.
// - inet forward from the bridge (f_<key>): to another pod (out the bridge again) rejected; then
//   the worker's floor (egress-floor.ts: cloud metadata, which no policy opens); then the pod's
//   bounds on forwarded flows (connection-limits.ts); then the policy
//   in decideEgress's order: allow CIDRs, deny CIDRs, the private ranges, the
//   catch-all deny, and the internet default. Each rule has a counter and a comment naming the
//   policy rule, the per-sandbox, per-rule counts the worker exports as metrics.
// - inet nat prerouting (n_<key>): with an egress proxy, outbound TCP that the address rules do
//   not already decide is DNAT'ed to gateway:port (SO_ORIGINAL_DST gives the proxy the target).
//   Host addresses, pods, the floor, allowed and denied CIDRs are left alone, so the filter decides them.
// - inet nat postrouting: the subnet is masqueraded when it leaves by another interface.
//
// Denied traffic is rejected, never dropped: TCP gets a reset (ECONNREFUSED at once), anything
// else ICMP admin-prohibited (EHOSTUNREACH). Established and related packets are accepted first,
// so a policy change applies to new connections.
import { DEFAULT_CONNECTION_LIMITS, egressLimitRules, gatewayLimitRules, limitSets, type ConnectionLimits, type LimitRule } from './connection-limits.ts';
import { DEFAULT_FLOOR, FLOOR_RULE, type EgressFloor } from './egress-floor.ts';
import { compileEgressPolicy, DEFAULT_RULES, PRIVATE_RANGES, type EgressPolicy } from './egress-policy.ts';

export interface BridgeNet {
  /** Host bridge name ([a-z0-9], ≤ 15 bytes). */
  bridge: string;
  /** The pods' IPv4 subnet, e.g. 10.236.0.0/16. */
  subnet: string;
  /** The bridge's own address in it. */
  gateway: string;
  /** The egress proxy's port on the gateway; absent: TCP goes direct. */
  egressProxyPort?: number;
  /** Whether pods may ask a DNS resolver on gateway:53. */
  dns?: boolean;
  /** Addresses no policy opens (egress-floor.ts). Default DEFAULT_FLOOR (cloud metadata). */
  floor?: EgressFloor;
  /** Each pod's share of the proxy, the resolver and the conntrack table (connection-limits.ts). Default DEFAULT_CONNECTION_LIMITS. */
  limits?: ConnectionLimits;
}

export interface PodNet {
  id: string;
  ip: string;
  mac: string;
  /** Host side of the pod's veth. */
  veth: string;
  policy: EgressPolicy;
}

/** Rule names of the kernel-only decisions (the rest are EgressVerdict rules). */
export const KERNEL_RULES = {
  /** Another sandbox on this worker. */
  sandboxes: 'sandboxes',
  /**
   * The internet of a policy that denies domains, with no egress proxy to judge them: the kernel
   * cannot tell evil.example from any other address, so it fails closed (the API refuses such a
   * policy without the proxy; a template may still carry one).
   */
  domainsNeedProxy: 'domains-need-proxy',
  /** Any address of the host itself. */
  host: 'host',
} as const;

export function tableName(bridge: string): string {
  return `asb_${bridge}`;
}

/** The per-pod inet chains' suffix: the pod's address, 10.236.0.5 → 10_236_0_5. */
export function addressKey(ip: string): string {
  return ip.replaceAll('.', '_');
}

const quote = (s: string): string => JSON.stringify(s);

/**
 * The whole table pair, empty of pods: replaces whatever a previous run left (an atomic delete
 * and re-create, so there is no instant without rules). Pods are added after with podScript.
 */
export function baseScript(net: BridgeNet): string {
  const t = tableName(net.bridge);
  const br = quote(net.bridge);
  return `table inet ${t} {}
delete table inet ${t}
table bridge ${t} {}
delete table bridge ${t}
table inet ${t} {
  map m_in { type ipv4_addr : verdict; }
  map m_out { type ipv4_addr : verdict; }
  map m_nat { type ipv4_addr : verdict; }
${limitSets().map((set) => `  ${set}\n`).join('')}  chain deny {
    meta l4proto tcp reject with tcp reset
    reject with icmpx admin-prohibited
  }
  chain input {
    type filter hook input priority filter - 10; policy accept;
    iifname ${br} jump from_pods_in
  }
  chain from_pods_in {
    ct state established,related accept
    meta nfproto ipv4 ip saddr vmap @m_in
    counter jump deny comment "unknown-source"
  }
  chain forward {
    type filter hook forward priority filter - 10; policy accept;
    iifname ${br} jump from_pods_fwd
    oifname ${br} ct state established,related accept
    oifname ${br} counter jump deny comment "inbound"
  }
  chain from_pods_fwd {
    ct state established,related accept
    meta nfproto ipv4 ip saddr vmap @m_out
    counter jump deny comment "unknown-source"
  }
  chain prerouting_nat {
    type nat hook prerouting priority dstnat - 10; policy accept;
    iifname ${br} meta nfproto ipv4 ip saddr vmap @m_nat
  }
  chain postrouting_nat {
    type nat hook postrouting priority srcnat - 10; policy accept;
    meta nfproto ipv4 ip saddr ${net.subnet} oifname != ${br} masquerade
  }
}
table bridge ${t} {
  set ports { type ifname; }
  map m_ports { type ifname : verdict; }
  chain prerouting {
    type filter hook prerouting priority -200; policy accept;
    iifname vmap @m_ports
    iifname @ports counter drop comment "removed-port"
  }
  chain forward {
    type filter hook forward priority -200; policy accept;
    iifname @ports counter drop comment "sandboxes"
  }
}
`;
}

/** Deletes the table pair (the runtime closed with no pod left). */
export function deleteScript(bridge: string): string {
  const t = tableName(bridge);
  return `table inet ${t} {}\ndelete table inet ${t}\ntable bridge ${t} {}\ndelete table bridge ${t}\n`;
}

/**
 * Adds or replaces one pod's chains and map entries: idempotent (a wake, a policy update and an
 * adopted pod all run the same script). Chains are flushed and refilled in the same transaction.
 */
export function podScript(net: BridgeNet, pod: PodNet): string {
  const t = tableName(net.bridge);
  const k = addressKey(pod.ip);
  const p = compileEgressPolicy(pod.policy);
  const gw = net.gateway;
  const lines: string[] = [];
  const chain = (family: 'inet' | 'bridge', name: string, rules: string[]): void => {
    lines.push(`add chain ${family} ${t} ${name}`, `flush chain ${family} ${t} ${name}`);
    for (const r of rules) lines.push(`add rule ${family} ${t} ${name} ${r}`);
  };
  const c = (rule: string): string => `comment ${quote(rule)}`;
  const v4 = <T extends { family: 4 | 6 }>(xs: readonly T[]): T[] => xs.filter((x) => x.family === 4);

  chain('bridge', `s_${pod.veth}`, [
    `ether saddr != ${pod.mac} counter drop comment "spoof"`,
    `ether type arp arp saddr ip != ${pod.ip} counter drop comment "spoof"`,
    `ether type ip ip saddr != ${pod.ip} counter drop comment "spoof"`,
    `ether type != { ip, arp } counter drop comment "not-ipv4"`,
    'accept',
  ]);

  // The bounds first: each count and bucket is this pod's own, kept by address in the table's sets.
  const limits = net.limits ?? DEFAULT_CONNECTION_LIMITS;
  const bound = (l: LimitRule): string => `${l.match === '' ? '' : `${l.match} `}${l.over} counter jump deny ${c(l.rule)}`;
  const input: string[] = gatewayLimitRules(gw, net, limits).map(bound);
  if (net.dns === true) input.push(`ip daddr ${gw} meta l4proto { tcp, udp } th dport 53 accept`);
  if (net.egressProxyPort !== undefined) input.push(`ip daddr ${gw} tcp dport ${String(net.egressProxyPort)} accept`);
  input.push(`counter jump deny ${c(KERNEL_RULES.host)}`);
  chain('inet', `i_${k}`, input);

  const forward: string[] = [`oifname ${quote(net.bridge)} counter jump deny ${c(KERNEL_RULES.sandboxes)}`];
  // Pods have IPv4 only (the bridge drops other ethertypes): the floor's IPv6 entries are the proxy's and resolver's.
  const floor = v4((net.floor ?? DEFAULT_FLOOR).cidrs).map((x) => x.text);
  if (floor.length > 0) forward.push(`ip daddr { ${floor.join(', ')} } counter jump deny ${c(FLOOR_RULE)}`);
  forward.push(...egressLimitRules(limits).map(bound));
  for (const cidr of v4(p.allowCidrs)) forward.push(`ip daddr ${cidr.text} counter accept ${c(cidr.text)}`);
  for (const cidr of v4(p.denyCidrs)) forward.push(`ip daddr ${cidr.text} counter jump deny ${c(cidr.text)}`);
  const privateV4 = PRIVATE_RANGES.filter((r) => !r.includes(':'));
  forward.push(`ip daddr { ${privateV4.join(', ')} } counter jump deny ${c(DEFAULT_RULES.private)}`);
  const all = v4(p.denyAll)[0];
  if (all !== undefined) forward.push(`counter jump deny ${c(all.text)}`);
  else if (p.internet && p.denyDomains.length > 0 && net.egressProxyPort === undefined) forward.push(`counter jump deny ${c(KERNEL_RULES.domainsNeedProxy)}`);
  else if (p.internet) forward.push(`counter accept ${c(DEFAULT_RULES.internet)}`);
  else forward.push(`counter jump deny ${c(DEFAULT_RULES.noInternet)}`);
  chain('inet', `f_${k}`, forward);

  // To the proxy only what a domain could still decide: with no domain entries and no internet,
  // the kernel's own reject above is the answer (fast, and counted here).
  const viaProxy = net.egressProxyPort !== undefined && (p.allowDomains.length > 0 || p.denyDomains.length > 0 || (p.internet && all === undefined));
  const nat: string[] = [];
  if (viaProxy) {
    nat.push('fib daddr type local return', `ip daddr ${net.subnet} return`);
    const untouched = [...floor, ...[...v4(p.allowCidrs), ...v4(p.denyCidrs)].map((x) => x.text)];
    if (untouched.length > 0) nat.push(`ip daddr { ${untouched.join(', ')} } return`);
    nat.push(`ip daddr { ${privateV4.join(', ')} } return`, `meta l4proto tcp dnat ip to ${gw}:${String(net.egressProxyPort)}`);
  }
  chain('inet', `n_${k}`, nat);

  // Map entries always point at the chains of that address (or veth): adding one that exists is
  // a no-op, so the script never needs to delete an element (nft 1.0.6 has no `destroy`).
  for (const [map, name] of [['m_in', 'i'], ['m_out', 'f'], ['m_nat', 'n']] as const) lines.push(`add element inet ${t} ${map} { ${pod.ip} : jump ${name}_${k} }`);
  lines.push(`add element bridge ${t} ports { ${quote(pod.veth)} }`, `add element bridge ${t} m_ports { ${quote(pod.veth)} : jump s_${pod.veth} }`);
  return lines.join('\n') + '\n';
}

/**
 * Deletes one pod's chains and map entries (the pod was removed): its address then matches no
 * entry of the maps, so the base chains' "unknown-source" rule rejects everything from it until
 * podScript adds it again. Each chain and entry is added first in the same transaction, so the
 * script deletes what is there whether or not it was (a pod not running since the worker started
 * has none: the table was rebuilt), and nothing of a removed pod stays in the table under churn.
 */
export function podRemoveScript(net: BridgeNet, pod: { ip: string; veth: string }): string {
  const t = tableName(net.bridge);
  const k = addressKey(pod.ip);
  const lines: string[] = [];
  for (const [map, name] of [['m_in', 'i'], ['m_out', 'f'], ['m_nat', 'n']] as const) {
    lines.push(`add chain inet ${t} ${name}_${k}`, `flush chain inet ${t} ${name}_${k}`);
    lines.push(`add element inet ${t} ${map} { ${pod.ip} : jump ${name}_${k} }`, `delete element inet ${t} ${map} { ${pod.ip} }`, `delete chain inet ${t} ${name}_${k}`);
  }
  const port = quote(pod.veth);
  lines.push(`add chain bridge ${t} s_${pod.veth}`, `flush chain bridge ${t} s_${pod.veth}`);
  lines.push(`add element bridge ${t} ports { ${port} }`, `add element bridge ${t} m_ports { ${port} : jump s_${pod.veth} }`);
  lines.push(`delete element bridge ${t} m_ports { ${port} }`, `delete element bridge ${t} ports { ${port} }`, `delete chain bridge ${t} s_${pod.veth}`);
  return lines.join('\n') + '\n';
}

/** One counter of a pod's chains: the policy rule it stands for and what it decided. */
export interface RuleCount {
  /** The pod's address. */
  ip: string;
  rule: string;
  verdict: 'allowed' | 'denied';
  packets: number;
}

/**
 * The per-pod counters from `nft -j list table inet <table>`: the first packets of connections
 * (established ones are accepted before the pod's chain), so about one per connection attempt.
 */
export function parseCounters(json: string): RuleCount[] {
  const out: RuleCount[] = [];
  let doc: unknown;
  try {
    doc = JSON.parse(json);
  } catch {
    return out;
  }
  const items = (doc as { nftables?: unknown }).nftables;
  if (!Array.isArray(items)) return out;
  for (const item of items as unknown[]) {
    const rule = (item as { rule?: { chain?: unknown; comment?: unknown; expr?: unknown } }).rule;
    if (rule === undefined || typeof rule.chain !== 'string' || typeof rule.comment !== 'string' || !Array.isArray(rule.expr)) continue;
    const m = /^[if]_(\d+_\d+_\d+_\d+)$/.exec(rule.chain);
    if (m?.[1] === undefined) continue;
    let packets = 0;
    let verdict: RuleCount['verdict'] | undefined;
    for (const e of rule.expr as unknown[]) {
      const expr = e as { counter?: { packets?: unknown }; accept?: unknown; jump?: { target?: unknown } };
      if (typeof expr.counter?.packets === 'number') packets = expr.counter.packets;
      if ('accept' in expr) verdict = 'allowed';
      if (expr.jump?.target === 'deny') verdict = 'denied';
    }
    if (verdict !== undefined) out.push({ ip: m[1].replaceAll('_', '.'), rule: rule.comment, verdict, packets });
  }
  return out;
}
