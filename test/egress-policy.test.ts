// The egress decision, without sockets: which rule decides each connection, that an explicit
// allow beats deny, that no domain and no address spelling opens what a CIDR or the private
// default denies, and the 422 a bad policy gets.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isAsbError } from '../src/errors.ts';
import { decideDomain, decideEgress, isPrivateAddress, parseCidr, parseEgressPolicy, type EgressPolicy, type EgressTarget } from '../src/network/egress-policy.ts';

const policy = (p: Partial<EgressPolicy>): EgressPolicy => parseEgressPolicy(p, 'network');
const to = (ip: string, domain?: string, port = 443): EgressTarget => (domain === undefined ? { ip, port } : { ip, port, domain });

test('the default policy: internet yes; private, link-local, loopback and their IPv6 spellings no', () => {
  const p = policy({});
  const cases: [string, boolean, string][] = [
    ['203.0.113.7', true, 'default-internet'],
    ['198.51.100.1', true, 'default-internet'],
    ['2001:db8::1', true, 'default-internet'],
    ['10.213.0.3', false, 'default-private'],
    ['172.20.1.1', false, 'default-private'],
    ['192.168.1.1', false, 'default-private'],
    ['100.64.0.1', false, 'default-private'],
    ['169.254.169.254', false, 'default-private'],
    ['127.0.0.1', false, 'default-private'],
    ['127.1.2.3', false, 'default-private'],
    ['0.0.0.0', false, 'default-private'],
    ['224.0.0.1', false, 'default-private'],
    ['255.255.255.255', false, 'default-private'],
    ['::1', false, 'default-private'],
    ['::', false, 'default-private'],
    ['::ffff:127.0.0.1', false, 'default-private'],
    ['::ffff:7f00:1', false, 'default-private'],
    ['::ffff:169.254.169.254', false, 'default-private'],
    ['64:ff9b::10.0.0.1', false, 'default-private'],
    ['::127.0.0.1', false, 'default-private'],
    ['fd00::1', false, 'default-private'],
    ['fe80::1', false, 'default-private'],
    ['ff02::1', false, 'default-private'],
    ['::ffff:203.0.113.7', true, 'default-internet'],
    ['not-an-ip', false, 'default-private'],
    ['fe80::1%eth0', false, 'default-private'],
  ];
  for (const [ip, allowed, rule] of cases) assert.deepEqual(decideEgress(p, to(ip)), { allowed, rule }, ip);
});

test('internet off: only what allow names', () => {
  const p = policy({ internet: false, allow: ['198.51.100.0/24', 'api.example.com'] });
  assert.deepEqual(decideEgress(p, to('203.0.113.7')), { allowed: false, rule: 'default-no-internet' });
  assert.deepEqual(decideEgress(p, to('198.51.100.9')), { allowed: true, rule: '198.51.100.0/24' });
  assert.deepEqual(decideEgress(p, to('203.0.113.7', 'api.example.com')), { allowed: true, rule: 'api.example.com' });
  assert.deepEqual(decideEgress(p, to('203.0.113.7', 'other.example.com')), { allowed: false, rule: 'default-no-internet' });
});

test('an explicit allow beats deny and the private default; the most specific entry names the rule', () => {
  const p = policy({ allow: ['10.236.5.0/24', '203.0.113.8'], deny: ['203.0.113.0/24', '10.0.0.0/8', '203.0.113.0/25'] });
  assert.deepEqual(decideEgress(p, to('10.236.5.1')), { allowed: true, rule: '10.236.5.0/24' });
  assert.deepEqual(decideEgress(p, to('10.236.6.1')), { allowed: false, rule: '10.0.0.0/8' });
  assert.deepEqual(decideEgress(p, to('203.0.113.8')), { allowed: true, rule: '203.0.113.8' });
  assert.deepEqual(decideEgress(p, to('203.0.113.9')), { allowed: false, rule: '203.0.113.0/25' });
  assert.deepEqual(decideEgress(p, to('203.0.113.200')), { allowed: false, rule: '203.0.113.0/24' });
  // An allow written as an IPv4-mapped IPv6 CIDR opens the IPv4 range, and the reverse.
  const mapped = policy({ allow: ['::ffff:169.254.169.254'] });
  assert.deepEqual(decideEgress(mapped, to('169.254.169.254')), { allowed: true, rule: '169.254.169.254' });
});

test('a domain never opens an address that a CIDR or the private default denies', () => {
  const p = policy({ allow: ['*.example.com', 'internal.corp'], deny: ['203.0.113.0/24'] });
  assert.deepEqual(decideEgress(p, to('203.0.113.7', 'api.example.com')), { allowed: false, rule: '203.0.113.0/24' });
  assert.deepEqual(decideEgress(p, to('10.0.0.5', 'internal.corp')), { allowed: false, rule: 'default-private' });
  assert.deepEqual(decideEgress(p, to('::ffff:127.0.0.1', 'api.example.com')), { allowed: false, rule: 'default-private' });
  assert.deepEqual(decideEgress(p, to('198.51.100.1', 'API.Example.COM.')), { allowed: true, rule: '*.example.com' });
});

test("E2B's allow-list: denyOut 0.0.0.0/0 with allowOut domains lets only those domains (and allowed CIDRs) out", () => {
  const p = policy({ allow: ['api.example.com', '*.pypi.org', '198.51.100.7'], deny: ['0.0.0.0/0'] });
  assert.deepEqual(decideEgress(p, to('203.0.113.7', 'api.example.com')), { allowed: true, rule: 'api.example.com' });
  assert.deepEqual(decideEgress(p, to('203.0.113.7', 'files.pypi.org')), { allowed: true, rule: '*.pypi.org' });
  assert.deepEqual(decideEgress(p, to('203.0.113.7', 'pypi.org')), { allowed: false, rule: '0.0.0.0/0' });
  assert.deepEqual(decideEgress(p, to('203.0.113.7')), { allowed: false, rule: '0.0.0.0/0' });
  assert.deepEqual(decideEgress(p, to('198.51.100.7')), { allowed: true, rule: '198.51.100.7' });
  // ::/0 was not denied: IPv6 falls to the internet default.
  assert.deepEqual(decideEgress(p, to('2001:db8::1')), { allowed: true, rule: 'default-internet' });
});

test('domain matching: exact before wildcard, longer wildcard first, wildcard not the bare name; allow beats deny', () => {
  const p = policy({ allow: ['good.bad.example.com', '*.ok.bad.example.com'], deny: ['*.example.com', '*.bad.example.com'] });
  assert.deepEqual(decideEgress(p, to('203.0.113.1', 'good.bad.example.com')), { allowed: true, rule: 'good.bad.example.com' });
  assert.deepEqual(decideEgress(p, to('203.0.113.1', 'x.ok.bad.example.com')), { allowed: true, rule: '*.ok.bad.example.com' });
  assert.deepEqual(decideEgress(p, to('203.0.113.1', 'evil.bad.example.com')), { allowed: false, rule: '*.bad.example.com' });
  assert.deepEqual(decideEgress(p, to('203.0.113.1', 'www.example.com')), { allowed: false, rule: '*.example.com' });
  assert.deepEqual(decideEgress(p, to('203.0.113.1', 'example.com')), { allowed: true, rule: 'default-internet' });
  assert.deepEqual(decideEgress(p, to('203.0.113.1', 'notexample.com')), { allowed: true, rule: 'default-internet' });
});

test('decideDomain: which DNS questions the resolver answers', () => {
  assert.deepEqual(decideDomain(policy({}), 'any.example.org'), { allowed: true, rule: 'default-internet' });
  assert.deepEqual(decideDomain(policy({ deny: ['*.example.org'] }), 'a.example.org'), { allowed: false, rule: '*.example.org' });
  assert.deepEqual(decideDomain(policy({ deny: ['0.0.0.0/0'], allow: ['a.example.org'] }), 'a.example.org'), { allowed: true, rule: 'a.example.org' });
  assert.deepEqual(decideDomain(policy({ deny: ['0.0.0.0/0'], allow: ['a.example.org'] }), 'b.example.org'), { allowed: false, rule: '0.0.0.0/0' });
  assert.deepEqual(decideDomain(policy({ internet: false }), 'b.example.org'), { allowed: false, rule: 'default-no-internet' });
});

test('parseEgressPolicy normalises entries and rejects bad ones with a 422 naming each field', () => {
  const p = parseEgressPolicy({ internet: false, allow: [' 203.0.113.9/24 ', 'API.example.com.', '*.Example.org', '2001:DB8:0:0::1', '2001:db8::1'], deny: ['::ffff:10.0.0.0/104'] }, 'spec.network');
  assert.deepEqual(p, { internet: false, allow: ['203.0.113.0/24', 'api.example.com', '*.example.org', '2001:db8::1'], deny: ['10.0.0.0/8'] });
  assert.ok(Object.isFrozen(p) && Object.isFrozen(p.allow));
  assert.deepEqual(parseEgressPolicy({}, 'x'), { internet: true, allow: [], deny: [] });

  const bad: [unknown, string[]][] = [
    [null, ['spec.network']],
    [[], ['spec.network']],
    [{ internet: 'yes' }, ['spec.network.internet']],
    [{ allow: 'example.com' }, ['spec.network.allow']],
    [{ allow: ['10.0.0.0/33', 'exa mple.com', 7, '*', '*.', '10.0.0.256', '::1/129', 'a..b', '-a.com', 'x'.repeat(64) + '.com'] }, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9].map((i) => `spec.network.allow[${String(i)}]`)],
    [{ deny: ['1.2.3.4/x'], egress: [] }, ['spec.network.egress', 'spec.network.deny[0]']],
    [{ allow: new Array(257).fill('203.0.113.1') }, ['spec.network.allow']],
  ];
  for (const [input, fields] of bad) {
    assert.throws(
      () => parseEgressPolicy(input, 'spec.network'),
      (err: unknown) => {
        assert.ok(isAsbError(err, 'Invalid'), String(err));
        assert.equal(err.status, 422);
        assert.deepEqual(
          err.fields.map((f) => f.field),
          fields,
          JSON.stringify(input).slice(0, 80),
        );
        return true;
      },
    );
  }
});

test('parseCidr and isPrivateAddress on the edge spellings', () => {
  assert.equal(parseCidr('0.0.0.0/0')?.text, '0.0.0.0/0');
  assert.equal(parseCidr('::/0')?.text, '::/0');
  assert.equal(parseCidr('fe80::1:2/64')?.text, 'fe80::/64');
  assert.equal(parseCidr('1:0:0:1:0:0:0:1')?.text, '1:0:0:1::1');
  assert.equal(parseCidr('10.1.2.3/8')?.text, '10.0.0.0/8');
  assert.equal(parseCidr('10.1.2.3/')?.text, undefined);
  assert.equal(isPrivateAddress('::ffff:10.1.1.1'), true);
  assert.equal(isPrivateAddress('203.0.113.1'), false);
});
