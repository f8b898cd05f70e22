// The forms that map onto an egress policy (E2B's create and updateNetwork fields, the
// kubernetes-sigs SandboxTemplate networkPolicy), their validation on objects, and the rules the
// policy becomes (nft counters, the kube runtime's NetworkPolicy), without sockets.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { validateObject } from '../src/api/validate.ts';
import { isAsbError } from '../src/errors.ts';
import { parseEgressPolicy } from '../src/network/egress-policy.ts';
import { parseEgressFloor } from '../src/network/egress-floor.ts';
import { DEFAULT_CONNECTION_LIMITS } from '../src/network/connection-limits.ts';
import { baseScript, parseCounters, podScript } from '../src/network/nft-ruleset.ts';
import { e2bNetwork, templateEgress, templateNetworkPolicy } from '../src/api/sandbox-network.ts';
import { networkPolicyManifest } from '../src/runtime/kube/objects.ts';

const fieldsOf = (fn: () => unknown): string[] => {
  try {
    fn();
  } catch (err) {
    assert.ok(isAsbError(err, 'Invalid'), String(err));
    return err.fields.map((f) => f.field);
  }
  assert.fail('no error');
};

test('E2B fields: allow_internet_access false is internet off; allowOut/denyOut are allow/deny; create keeps the template for a bare true; unsupported options refused', () => {
  assert.equal(e2bNetwork(undefined, undefined), undefined);
  assert.equal(e2bNetwork(true, { allowPublicTraffic: true }), undefined, 'SDK ≤ 2.50 always sends true');
  assert.deepEqual(e2bNetwork(false, undefined), { internet: false, allow: [], deny: [] });
  assert.deepEqual(e2bNetwork(undefined, { allowOut: ['*.PyPI.org', '1.2.3.4'], denyOut: ['0.0.0.0/0'] }), { internet: true, allow: ['*.pypi.org', '1.2.3.4'], deny: ['0.0.0.0/0'] });
  assert.deepEqual(e2bNetwork(undefined, {}, 'network', true), { internet: true, allow: [], deny: [] }, 'a PUT with nothing clears the policy');
  assert.deepEqual(fieldsOf(() => e2bNetwork(undefined, { allowOut: ['x y'] })), ['network.allowOut[0]']);
  assert.deepEqual(fieldsOf(() => e2bNetwork('no', { rules: { 'a.com': {} }, egressProxy: { address: 'socks5://p:1080' }, allowPublicTraffic: false })), ['allow_internet_access', 'network.rules', 'network.egressProxy', 'network.allowPublicTraffic']);
  assert.equal(e2bNetwork(undefined, { rules: {} }), undefined, 'empty rules change nothing');
});

test('kubernetes-sigs networkPolicy.egress: 0.0.0.0/0 with except is the internet minus those; other ipBlocks are allowed; selectors and ports open nothing; Unmanaged or no egress says nothing', () => {
  const sigsDefault = { networkPolicy: { egress: [{ to: [{ ipBlock: { cidr: '0.0.0.0/0', except: ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '169.254.0.0/16'] } }] }] } };
  assert.deepEqual(templateNetworkPolicy(sigsDefault), { internet: true, allow: [], deny: ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '169.254.0.0/16'] });
  const listed = { networkPolicy: { egress: [{ to: [{ ipBlock: { cidr: '203.0.113.0/24' } }, { namespaceSelector: {} }], ports: [{ port: 443 }] }, { to: [{ podSelector: { matchLabels: { k8s: 'dns' } } }] }] } };
  assert.deepEqual(templateNetworkPolicy(listed), { internet: false, allow: ['203.0.113.0/24'], deny: [] });
  assert.deepEqual(templateNetworkPolicy({ networkPolicy: { egress: [] } }), { internet: false, allow: [], deny: [] }, 'an empty egress list allows nothing');
  assert.deepEqual(templateNetworkPolicy({ networkPolicy: { egress: [{}] } }), { internet: true, allow: [], deny: [] }, 'a rule with no `to` allows every destination');
  assert.equal(templateNetworkPolicy({ networkPolicy: { ingress: [] } }), undefined);
  assert.equal(templateNetworkPolicy({ networkPolicy: { egress: [] }, networkPolicyManagement: 'Unmanaged' }), undefined);
  assert.deepEqual(fieldsOf(() => templateNetworkPolicy({ networkPolicy: { egress: [{ to: [{ ipBlock: { cidr: '10.0.0.0/8', except: ['10.1.0.0/16'] } }] }] } })), ['spec.networkPolicy.egress[0].to[0].ipBlock.except']);
  assert.deepEqual(templateEgress({ network: { internet: false }, ...sigsDefault }), { internet: false, allow: [], deny: [] }, 'spec.network wins');
});

test('objects: a Sandbox or SandboxTemplate with a bad network or an unenforceable networkPolicy is refused naming the field', () => {
  const pod = { spec: { containers: [{ name: 'main', image: 'busybox' }] } };
  const problems = (obj: unknown): string[] => {
    try {
      validateObject(obj);
      return [];
    } catch (err) {
      assert.ok(isAsbError(err, 'Invalid'), String(err));
      return err.fields.map((f) => f.field);
    }
  };
  assert.deepEqual(problems({ apiVersion: 'agents.x-k8s.io/v1alpha1', kind: 'Sandbox', metadata: { name: 's' }, spec: { podTemplate: pod, network: { allow: ['10.0.0.0/8'], internet: false } } }), []);
  assert.deepEqual(problems({ apiVersion: 'agents.x-k8s.io/v1alpha1', kind: 'Sandbox', metadata: { name: 's' }, spec: { podTemplate: pod, network: { allow: ['10.0.0.0/99'], ports: [] } } }), ['spec.network.ports', 'spec.network.allow[0]']);
  assert.deepEqual(problems({ apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxTemplate', metadata: { name: 't' }, spec: { podTemplate: pod, network: { deny: [1] }, networkPolicy: { egress: [{ to: [{ ipBlock: { cidr: '10.0.0.0/8', except: ['10.1.0.0/16'] } }] }] } } }), ['spec.network.deny[0]', 'spec.networkPolicy.egress[0].to[0].ipBlock.except']);
});

test('the kube runtime\'s NetworkPolicy: allow CIDRs, and the internet as 0.0.0.0/0 and ::/0 minus the private ranges and deny CIDRs', () => {
  const np = networkPolicyManifest('sb', 'ns', parseEgressPolicy({ allow: ['10.1.0.0/16', '203.0.113.7'], deny: ['198.51.100.0/24', '::/0'] }, 'p')) as { spec: { egress: { to: { ipBlock: { cidr: string; except?: string[] } }[] }[] } };
  const to = np.spec.egress[0]?.to ?? [];
  assert.deepEqual(to.slice(0, 2), [{ ipBlock: { cidr: '10.1.0.0/16' } }, { ipBlock: { cidr: '203.0.113.7/32' } }]);
  const v4 = to[2]?.ipBlock;
  assert.equal(v4?.cidr, '0.0.0.0/0');
  assert.ok(v4.except?.includes('169.254.0.0/16') && v4.except.includes('198.51.100.0/24'));
  assert.equal(to.length, 3, '::/0 denied: no IPv6 block');
  assert.deepEqual((networkPolicyManifest('sb', 'ns', parseEgressPolicy({ internet: false }, 'p')) as { spec: { egress: unknown[] } }).spec.egress, []);
});

test('nft: a pod\'s rules name their policy entries; the counters come back per address and rule', () => {
  const script = podScript({ bridge: 'asbnpx', subnet: '10.236.0.0/16', gateway: '10.236.0.1' }, { id: 'a', ip: '10.236.0.5', mac: '02:42:0a:ec:00:05', veth: 'vxabc', policy: parseEgressPolicy({ internet: false, allow: ['203.0.113.0/24', '2001:db8::/32', 'x.example.com'] }, 'p') });
  assert.match(script, /add rule inet asb_asbnpx f_10_236_0_5 ip daddr 203\.0\.113\.0\/24 counter accept comment "203\.0\.113\.0\/24"/);
  assert.match(script, /counter jump deny comment "default-no-internet"/);
  assert.doesNotMatch(script, /2001:db8|dnat/, 'no IPv6 rules for an IPv4 pod; no proxy configured');
  assert.match(script, /ip saddr != 10\.236\.0\.5 counter drop comment "spoof"/);
  const json = JSON.stringify({
    nftables: [
      { rule: { chain: 'f_10_236_0_5', comment: '203.0.113.0/24', expr: [{ match: {} }, { counter: { packets: 3, bytes: 180 } }, { accept: null }] } },
      { rule: { chain: 'i_10_236_0_5', comment: 'host', expr: [{ counter: { packets: 2, bytes: 120 } }, { jump: { target: 'deny' } }] } },
      { rule: { chain: 'from_pods_in', comment: 'unknown-source', expr: [{ counter: { packets: 9, bytes: 1 } }, { jump: { target: 'deny' } }] } },
    ],
  });
  assert.deepEqual(parseCounters(json), [
    { ip: '10.236.0.5', rule: '203.0.113.0/24', verdict: 'allowed', packets: 3 },
    { ip: '10.236.0.5', rule: 'host', verdict: 'denied', packets: 2 },
  ]);
  assert.deepEqual(parseCounters('not json'), []);
});

test('kube NetworkPolicy: the floor is cut out of allow CIDRs (except) and an allow inside it is dropped', () => {
  const blocks = (m: unknown): unknown[] => ((m as { spec: { egress: { to: unknown[] }[] } }).spec.egress[0]?.to ?? []);
  const m = networkPolicyManifest('sb', 'ns', parseEgressPolicy({ internet: false, allow: ['169.254.0.0/16', '169.254.169.254', '198.51.100.0/24', '0.0.0.0/0'] }, 'p'));
  assert.deepEqual(blocks(m), [
    { ipBlock: { cidr: '169.254.0.0/16', except: ['169.254.169.254/32', '169.254.170.2/32', '169.254.170.23/32'] } },
    { ipBlock: { cidr: '198.51.100.0/24' } },
    { ipBlock: { cidr: '0.0.0.0/0', except: ['169.254.169.254/32', '169.254.170.2/32', '169.254.170.23/32', '100.100.100.200/32'] } },
  ]);
  assert.deepEqual(blocks(networkPolicyManifest('sb', 'ns', parseEgressPolicy({ internet: false, allow: ['169.254.0.0/16'] }, 'p'), parseEgressFloor([]).floor)), [{ ipBlock: { cidr: '169.254.0.0/16' } }]);
  assert.deepEqual(blocks(networkPolicyManifest('sb', 'ns', parseEgressPolicy({ deny: ['evil.example'], allow: ['198.51.100.0/24'] }, 'p'))), [{ ipBlock: { cidr: '198.51.100.0/24' } }], 'a deny domain: no internet (fail closed)');
});

test('nft: with no egress proxy, a policy denying a domain has no internet (fail closed); with the proxy the internet stays and the proxy judges the name', () => {
  const pod = { id: 'a', ip: '10.236.0.5', mac: '02:42:0a:ec:00:05', veth: 'vxabc', policy: parseEgressPolicy({ deny: ['evil.example'], allow: ['198.51.100.0/24'] }, 'p') };
  const net = { bridge: 'asbnpx', subnet: '10.236.0.0/16', gateway: '10.236.0.1' };
  const direct = podScript(net, pod);
  assert.match(direct, /counter jump deny comment "domains-need-proxy"/);
  assert.doesNotMatch(direct, /default-internet/);
  assert.match(direct, /198\.51\.100\.0\/24 counter accept/, 'allowed CIDRs still go');
  const proxied = podScript({ ...net, egressProxyPort: 15001 }, pod);
  assert.match(proxied, /counter accept comment "default-internet"/);
  assert.doesNotMatch(proxied, /domains-need-proxy/);
});

test('nft: the worker\'s floor is rejected before any allow CIDR and never sent to the proxy', () => {
  const net = { bridge: 'asbnpx', subnet: '10.236.0.0/16', gateway: '10.236.0.1', egressProxyPort: 15001 };
  const script = podScript(net, { id: 'a', ip: '10.236.0.5', mac: '02:42:0a:ec:00:05', veth: 'vxabc', policy: parseEgressPolicy({ allow: ['169.254.0.0/16', 'x.example.com'] }, 'p') });
  const forward = script.split('\n').filter((l) => l.includes(' f_10_236_0_5 '));
  const floorAt = forward.findIndex((l) => l.includes('comment "floor"'));
  assert.ok(floorAt > 0 && floorAt < forward.findIndex((l) => l.includes('169.254.0.0/16')), forward.join('\n'));
  assert.match(forward[floorAt] ?? '', /ip daddr \{ 169\.254\.169\.254, 169\.254\.170\.2, 169\.254\.170\.23, 100\.100\.100\.200 \} counter jump deny/);
  assert.match(script, /n_10_236_0_5 ip daddr \{ 169\.254\.169\.254, [^}]*169\.254\.0\.0\/16 \} return/);
  const none = podScript({ ...net, floor: parseEgressFloor(['fd00:ec2::254']).floor }, { id: 'a', ip: '10.236.0.5', mac: '02:42:0a:ec:00:05', veth: 'vxabc', policy: parseEgressPolicy({}, 'p') });
  assert.doesNotMatch(none, /floor/, 'an IPv6-only floor has no IPv4 rule');
});

test('nft: every service on the gateway is bounded per pod before it is accepted, and so are forwarded flows; a service the worker does not run has no bound', () => {
  const pod = { id: 'a', ip: '10.236.0.5', mac: '02:42:0a:ec:00:05', veth: 'vxabc', policy: parseEgressPolicy({}, 'p') };
  const script = podScript({ bridge: 'asbnpx', subnet: '10.236.0.0/16', gateway: '10.236.0.1', egressProxyPort: 15001, dns: true }, pod);
  const chain = (name: string): string[] => script.split('\n').filter((l) => l.includes(` ${name} `));
  const input = chain('i_10_236_0_5');
  const at = (rule: string): number => input.findIndex((l) => l.includes(`comment "${rule}"`));
  const accepts = (what: RegExp): number => input.findIndex((l) => what.test(l) && l.endsWith(' accept'));
  assert.match(input[at('limit-proxy-connections')] ?? '', /ip daddr 10\.236\.0\.1 tcp dport 15001 add @lim_proxy_connections \{ ip saddr ct count over 256 \} counter jump deny/);
  assert.match(input[at('limit-proxy-rate')] ?? '', /tcp dport 15001 update @lim_proxy_rate \{ ip saddr limit rate over 50\/second burst 250 packets \} counter jump deny/);
  assert.match(input[at('limit-dns-tcp-connections')] ?? '', /tcp dport 53 add @lim_dns_tcp_connections \{ ip saddr ct count over 32 \} /);
  assert.match(input[at('limit-dns-udp-flows')] ?? '', /udp dport 53 add @lim_dns_udp_flows \{ ip saddr ct count over 1024 \} /);
  assert.match(input[at('limit-dns-rate')] ?? '', /th dport 53 update @lim_dns_rate \{ ip saddr limit rate over 100\/second burst 500 packets \} /);
  for (const rule of ['limit-proxy-connections', 'limit-proxy-rate']) assert.ok(at(rule) < accepts(/dport 15001/), `${rule} after the proxy's accept:\n${input.join('\n')}`);
  for (const rule of ['limit-dns-tcp-connections', 'limit-dns-udp-flows', 'limit-dns-rate']) assert.ok(at(rule) < accepts(/dport 53/), `${rule} after DNS's accept:\n${input.join('\n')}`);
  const forward = chain('f_10_236_0_5');
  const flows = forward.findIndex((l) => l.includes('comment "limit-egress-flows"'));
  assert.ok(flows > 0 && flows < forward.findIndex((l) => l.includes('comment "default-internet"')), forward.join('\n'));
  assert.match(forward[flows] ?? '', /add @lim_egress_flows \{ ip saddr ct count over 256 \} counter jump deny/);
  const plain = podScript({ bridge: 'asbnpx', subnet: '10.236.0.0/16', gateway: '10.236.0.1' }, pod);
  assert.doesNotMatch(plain, /limit-(proxy|dns)/, 'no proxy or resolver: no port to bound');
  const lower = podScript({ bridge: 'asbnpx', subnet: '10.236.0.0/16', gateway: '10.236.0.1', egressProxyPort: 15001, limits: { ...DEFAULT_CONNECTION_LIMITS, proxyConnections: 8 } }, pod);
  assert.match(lower, /tcp dport 15001 add @lim_proxy_connections \{ ip saddr ct count over 8 \} /, 'the runtime\'s own limits replace the defaults');
  // The counts and buckets live in the table's sets, keyed by address: a refilled chain (a policy change, a wake) keeps them.
  const base = baseScript({ bridge: 'asbnpx', subnet: '10.236.0.0/16', gateway: '10.236.0.1' });
  for (const set of ['lim_proxy_connections', 'lim_dns_tcp_connections', 'lim_dns_udp_flows', 'lim_egress_flows']) assert.match(base, new RegExp(`set ${set} \\{ type ipv4_addr; size 65536; flags dynamic; \\}`));
  for (const set of ['lim_proxy_rate', 'lim_dns_rate', 'lim_egress_rate']) assert.match(base, new RegExp(`set ${set} \\{ type ipv4_addr; size 65536; flags dynamic,timeout; timeout 1m; \\}`));
});
