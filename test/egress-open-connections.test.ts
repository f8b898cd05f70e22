// Which proxied connections a new egress policy forbids (src/egress/open-connections.ts), and the
// sockets the worker destroys for them (src/egress/proxy-cut.ts): pure, no sockets. The real
// path, with pods, Envoy and servers, is test/egress-proxy-cut.test.ts.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { CheckAttributes } from '../src/egress/authz-codec.ts';
import type { DecisionInputs } from '../src/egress/egress-decision.ts';
import { MAX_CONNECTIONS_PER_POD, nameResolvedFor, OpenConnections, portsToCut } from '../src/egress/open-connections.ts';
import { parseSourcePorts, ProxyCut } from '../src/egress/proxy-cut.ts';
import type { EgressPolicy } from '../src/network/egress-policy.ts';
import { silentLogger } from '../src/base/log.ts';

const POD = '10.224.0.5';
const OTHER = '10.224.0.6';

function inputs(policy: EgressPolicy, resolved?: DecisionInputs['resolved']): DecisionInputs {
  return { source: { policyForPodIp: (ip) => (ip === POD || ip === OTHER ? policy : undefined) }, ...(resolved === undefined ? {} : { resolved }) };
}

const tls = (port: number, sni: string, ip = '203.0.113.7'): CheckAttributes => ({ sourceIp: POD, sourcePort: port, destinationIp: ip, destinationPort: 443, sni });
const tcp = (port: number, ip: string, sourceIp = POD): CheckAttributes => ({ sourceIp, sourcePort: port, destinationIp: ip, destinationPort: 7000 });
const http = (port: number, host: string): CheckAttributes => ({ sourceIp: POD, sourcePort: port, destinationIp: '203.0.113.7', destinationPort: 80, http: { host, path: '/', method: 'GET' } });

test('a shrunk policy cuts the proxied connections it denies, by name or by address, and no other', () => {
  const open = new OpenConnections();
  open.record(tls(40001, 'a.example'), true);
  open.record(tls(40002, 'b.example'), true);
  open.record(tcp(40003, '198.51.100.9'), true);
  open.record(tcp(40004, '203.0.113.9'), true);
  open.record(tcp(40001, '198.51.100.9', OTHER), true);
  const wide: EgressPolicy = { internet: false, allow: ['a.example', 'b.example', '198.51.100.0/24', '203.0.113.9/32'], deny: [] };
  assert.deepEqual(portsToCut(open, POD, inputs(wide)), [], 'nothing the policy still allows is cut');
  const narrow: EgressPolicy = { internet: false, allow: ['b.example', '203.0.113.9/32'], deny: [] };
  assert.deepEqual(portsToCut(open, POD, inputs(narrow)), [40001, 40003]);
  // Another pod's connections are its own policy's business, and they were never listed here.
  assert.deepEqual(portsToCut(open, OTHER, inputs({ internet: true, allow: [], deny: ['198.51.100.0/24'] })), [40001]);
  // A deny entry added to an open internet.
  assert.deepEqual(portsToCut(open, POD, inputs({ internet: true, allow: [], deny: ['a.example', '198.51.100.9/32'] })), [40001, 40003]);
});

test('plain HTTP: a kept-alive connection is cut when any host it carried is now denied', () => {
  const open = new OpenConnections();
  open.record(http(40010, 'a.example'), true);
  open.record(http(40010, 'b.example:80'), true);
  open.record(http(40010, 'a.example'), true); // the same host again is one entry
  open.record(http(40011, 'b.example'), true);
  assert.equal(open.get(POD, 40010)?.checks.length, 2);
  assert.deepEqual(portsToCut(open, POD, inputs({ internet: false, allow: ['b.example'], deny: [] })), [40010]);
  // A network-filter Check is a new connection on that port: what a closed one carried goes.
  open.record(tls(40010, 'b.example'), true);
  assert.deepEqual(portsToCut(open, POD, inputs({ internet: false, allow: ['b.example'], deny: [] })), []);
});

test('a name is trusted as it was when the connection opened', () => {
  const open = new OpenConnections();
  const resolvedNow = (_pod: string, name: string): boolean => name === 'a.example';
  const check = tls(40020, 'a.example');
  open.record(check, nameResolvedFor(check, { resolved: resolvedNow }));
  const fronted = tls(40021, 'b.example');
  open.record(fronted, nameResolvedFor(fronted, { resolved: resolvedNow }));
  // Both names still allowed; the resolver's answer for a.example has expired since (resolved
  // says no to everything now): a.example's connection stays, b.example's (never resolved, its
  // address not allowed) is judged by its address, as when it opened.
  const never = (): boolean => false;
  const policy: EgressPolicy = { internet: false, allow: ['a.example', 'b.example'], deny: [] };
  assert.deepEqual(portsToCut(open, POD, inputs(policy, never)), [40021]);
  assert.equal(nameResolvedFor(tcp(1, '198.51.100.9'), { resolved: never }), true, 'no name: nothing to trust');
});

test('what is remembered is bounded per pod: closed connections are pruned by the live list, and past the bound the oldest go', () => {
  const open = new OpenConnections();
  assert.equal(open.record({ sourceIp: POD, destinationIp: '203.0.113.7', destinationPort: 443 }, true), false, 'no source port: nothing to find the socket by');
  assert.deepEqual(open.ports(POD), []);
  let over = false;
  for (let port = 1; port <= MAX_CONNECTIONS_PER_POD + 1; port++) over = open.record(tcp(port, '203.0.113.9'), true);
  assert.equal(over, true);
  open.keepOnly(POD, new Set([2, 3, 99_999]));
  assert.deepEqual(open.ports(POD), [2, 3]);
  const all = new Set(Array.from({ length: MAX_CONNECTIONS_PER_POD + 10 }, (_, i) => i + 1));
  for (const port of all) open.record(tcp(port, '203.0.113.9'), true);
  open.keepOnly(POD, all);
  assert.equal(open.ports(POD).length, MAX_CONNECTIONS_PER_POD);
  open.forget(POD);
  assert.deepEqual(open.ports(POD), []);
});

test('ss output → the pod\'s source ports; another pod whose address starts the same is not read', () => {
  const text = [
    'ESTAB 0 0 10.224.0.1:15001 10.224.0.5:40001',
    'CLOSE-WAIT 1 0 10.224.0.1:15001 10.224.0.5:40002 ',
    '0 0 10.224.0.1:15001 10.224.0.50:40003',
    '',
  ].join('\n');
  assert.deepEqual([...parseSourcePorts(text, POD)], [40001, 40002]);
});

test('the cut destroys exactly the denied connections\' sockets, by both ends, after pruning closed ones; a removed pod\'s are all closed and forgotten', async () => {
  const calls: string[][] = [];
  let policy: EgressPolicy | undefined = { internet: true, allow: [], deny: [] };
  const cut = new ProxyCut({
    gateway: '10.224.0.1',
    proxyPort: 15001,
    inputs: { source: { policyForPodIp: (ip) => (ip === POD ? policy : undefined) } },
    log: silentLogger(),
    run: (argv) => {
      calls.push([...argv]);
      // Envoy holds 40031 and 40032; 40033 closed since.
      return Promise.resolve({ code: 0, output: argv.includes('-K') ? '' : 'ESTAB 0 0 10.224.0.1:15001 10.224.0.5:40031\nESTAB 0 0 10.224.0.1:15001 10.224.0.5:40032\n' });
    },
  });
  assert.deepEqual(await cut.cut(POD), [], 'nothing recorded: no command runs');
  assert.equal(calls.length, 0);
  cut.allowed(tcp(40031, '198.51.100.9'));
  cut.allowed(tcp(40032, '203.0.113.9'));
  cut.allowed(tcp(40033, '198.51.100.9'));
  policy = { internet: true, allow: [], deny: ['198.51.100.0/24'] };
  assert.deepEqual(await cut.cut(POD), [40031]);
  assert.deepEqual(calls, [
    ['ss', '-t', '-n', '-H', 'state', 'connected', 'src', '10.224.0.1:15001', 'dst', POD],
    ['ss', '-K', '-t', '-n', '-H', 'src', '10.224.0.1:15001', 'and', '(', 'dst', `${POD}:40031`, ')'],
  ]);
  calls.length = 0;
  assert.deepEqual(await cut.cut(POD), [], 'a closed connection is not cut twice');
  assert.deepEqual(calls.filter((c) => c.includes('-K')), []);
  // The pod removed (no policy): whatever Envoy still holds of it is closed, and nothing is kept.
  calls.length = 0;
  policy = undefined;
  assert.deepEqual(await cut.cut(POD), [40032]);
  assert.deepEqual(await cut.cut(POD), []);
  assert.equal(calls.length, 2, 'one listing and one ss -K, then nothing left to list');
});
