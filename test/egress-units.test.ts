// The egress proxy's pure parts, without sockets: the ext_authz wire (a CheckRequest built with
// the field numbers Envoy uses), the decision, credential rules, DNS messages and answers, and the
// memory of resolved addresses.
import assert from 'node:assert/strict';
import { createSocket } from 'node:dgram';
import { once } from 'node:events';
import { connect, type Socket } from 'node:net';
import { test } from 'node:test';
import { Registry } from 'prom-client';
import { decodeCheckRequest, encodeCheckResponse } from '../src/egress/authz-codec.ts';
import { credentialHeaders, hostMatches, interceptedHosts, type CredentialRule } from '../src/egress/credentials.ts';
import { filterAnswer, refuseName } from '../src/egress/dns-answer.ts';
import { DnsResolver } from '../src/egress/dns-resolver.ts';
import { buildResponse, parseQuery, QTYPE, RCODE } from '../src/egress/dns-wire.ts';
import { decideConnection, nameOf } from '../src/egress/egress-decision.ts';
import { GRACE_MS, ResolvedAddresses } from '../src/egress/resolved-addresses.ts';
import { parseEgressFloor } from '../src/network/egress-floor.ts';
import { parseEgressPolicy, type EgressPolicy } from '../src/network/egress-policy.ts';
import { WireWriter } from '../src/router/protobuf-wire.ts';
import type { Clock } from '../src/base/clock.ts';
import { silentLogger } from '../src/base/log.ts';

function peer(ip: string, port: number): WireWriter {
  return new WireWriter().message(1, new WireWriter().message(1, new WireWriter().string(2, ip).uint(3, port)));
}

test('CheckRequest: source, original destination, SNI and the HTTP request are read; unknown fields skipped', () => {
  const attrs = new WireWriter()
    .message(1, peer('10.213.0.7', 40000))
    .message(2, peer('192.0.2.5', 443))
    .message(4, new WireWriter().message(2, new WireWriter().string(1, '7').string(2, 'GET').string(4, '/v1/x').string(5, 'api.example.com:443')))
    .message(11, new WireWriter())
    .message(12, new WireWriter().string(1, 'api.example.com'))
    .string(99, 'future field');
  const got = decodeCheckRequest(new WireWriter().message(1, attrs).finish());
  assert.deepEqual(got, { sourceIp: '10.213.0.7', sourcePort: 40000, destinationIp: '192.0.2.5', destinationPort: 443, sni: 'api.example.com', http: { method: 'GET', path: '/v1/x', host: 'api.example.com:443' } });
  assert.throws(() => decodeCheckRequest(Buffer.from([0x0a, 0x05, 0x0a])), /malformed protobuf/);
});

test('CheckResponse: OK is status{} + ok_response with headers; a denial carries PERMISSION_DENIED, 403 and the body', () => {
  assert.deepEqual([...encodeCheckResponse({ allowed: true })], [0x0a, 0x00, 0x1a, 0x00]);
  const denied = encodeCheckResponse({ allowed: false, deniedStatus: 403, deniedBody: 'no' });
  assert.deepEqual([...denied.subarray(0, 4)], [0x0a, 0x02, 0x08, 0x07]);
  assert.ok(denied.includes(Buffer.from('no')));
});

const open: EgressPolicy = { internet: true, allow: [], deny: [] };
const only = (allow: string[]): EgressPolicy => ({ internet: false, allow, deny: [] });

test('the decision: the name judged is the Host for HTTP, the SNI for TLS, none for raw TCP; unknown sources and SNI/Host mismatches are refused', () => {
  const source = (p: EgressPolicy | undefined) => ({ policyForPodIp: () => p, sandboxForPodIp: () => 'sbx' });
  const base = { sourceIp: '10.0.0.2', destinationIp: '192.0.2.5', destinationPort: 443 };
  assert.deepEqual(decideConnection({ ...base, sni: 'API.example.com.' }, { source: source(only(['api.example.com'])) }), { allowed: true, rule: 'api.example.com', sandbox: 'sbx', protocol: 'tls', domain: 'api.example.com' });
  assert.equal(decideConnection({ ...base }, { source: source(only(['api.example.com'])) }).rule, 'default-no-internet');
  assert.equal(decideConnection({ ...base, http: { host: 'evil.com', path: '/', method: 'GET' } }, { source: source(only(['api.example.com'])) }).allowed, false);
  assert.equal(decideConnection({ ...base, sni: 'api.example.com' }, { source: source(undefined) }).rule, 'unknown-source');
  assert.equal(decideConnection({ ...base, sni: 'api.example.com', http: { host: 'other.example.com', path: '/', method: 'GET' } }, { source: source(open) }).rule, 'sni-host-mismatch');
  // Not from our resolver: judged by address alone.
  const notResolved = { source: source(only(['api.example.com'])), resolved: () => false };
  assert.equal(decideConnection({ ...base, sni: 'api.example.com' }, notResolved).rule, 'address-not-resolved');
  assert.equal(decideConnection({ ...base, sni: 'api.example.com' }, { ...notResolved, source: source({ internet: true, allow: ['api.example.com'], deny: [] }) }).allowed, true);
  assert.equal(nameOf('[2001:db8::1]:443'), undefined);
  assert.equal(nameOf('192.0.2.1:80'), undefined);
  assert.equal(nameOf('Example.COM:8080'), 'example.com');
});

test('credential rules: wildcards cover subdomains only, the longest path prefix wins per header, a deleted secret sets nothing', () => {
  const rules: CredentialRule[] = [
    { id: 'a', host: 'api.example.com', header: 'authorization', secret: 'one' },
    { id: 'b', host: 'api.example.com', pathPrefix: '/v2/', header: 'authorization', secret: 'two' },
    { id: 'c', host: '*.example.com', header: 'x-key', secret: 'gone' },
  ];
  const src = { rulesFor: () => rules, secretValue: (n: string) => ({ one: 'S1', two: 'S2' })[n] };
  assert.deepEqual(credentialHeaders(src, 's', 'api.example.com', '/v2/models'), [{ name: 'authorization', value: 'S2' }]);
  assert.deepEqual(credentialHeaders(src, 's', 'api.example.com', '/v1/models'), [{ name: 'authorization', value: 'S1' }]);
  assert.deepEqual(credentialHeaders(src, 's', 'other.example.com', '/'), []);
  assert.equal(hostMatches('*.example.com', 'example.com'), false);
  assert.equal(hostMatches('*.example.com', 'a.b.example.com'), true);
  assert.deepEqual(interceptedHosts(rules), ['*.example.com', 'api.example.com']);
});

test('DNS: a query is read and answered with its id, question and A records; a response or junk gets nothing; UDP answers truncate', () => {
  const q = Buffer.concat([Buffer.from([0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]), Buffer.from('\x03api\x07example\x03com\x00', 'latin1'), Buffer.from([0, 1, 0, 1])]);
  const parsed = parseQuery(q);
  assert.ok(parsed?.ok === true);
  assert.deepEqual([parsed.question.name, parsed.question.qtype, parsed.question.id], ['api.example.com', QTYPE.a, 0x1234]);
  const res = buildResponse(parsed.question, RCODE.noError, ['192.0.2.5'], 30);
  assert.equal(res.readUInt16BE(0), 0x1234);
  assert.equal(res.readUInt16BE(6), 1);
  assert.deepEqual([...res.subarray(-4)], [192, 0, 2, 5]);
  const many = buildResponse(parsed.question, RCODE.noError, Array.from({ length: 100 }, (_, i) => `192.0.2.${i}`), 30, 512);
  assert.ok(many.length <= 512 && (many.readUInt16BE(2) & 0x0200) !== 0, 'TC set');
  assert.equal(parseQuery(Buffer.from([0x12, 0x34, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0])), undefined, 'a response is never answered');
  assert.equal(parseQuery(Buffer.alloc(5)), undefined);
  const v6 = buildResponse(parsed.question, RCODE.noError, ['2001:db8::1'], 30);
  assert.deepEqual([...v6.subarray(-16)], [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
});

test('DNS answers: denied names NXDOMAIN, denied addresses removed, TTLs capped', () => {
  assert.equal(refuseName(only(['a.example.com']), 'b.example.com')?.rcode, RCODE.nxDomain);
  assert.equal(refuseName(undefined, 'a.example.com')?.rcode, RCODE.refused);
  assert.equal(refuseName(only(['a.example.com']), 'a.example.com'), undefined);
  const a = filterAnswer(open, 'x.example.com', { addresses: ['10.0.0.1', '192.0.2.9', '169.254.169.254'], ttlS: 3600 });
  assert.deepEqual([a.addresses, a.ttlS], [['192.0.2.9'], 60]);
  const none = filterAnswer(open, 'x.example.com', { addresses: ['10.0.0.1'], ttlS: 30 });
  assert.deepEqual([none.verdict, none.rule, none.addresses], ['filtered', 'default-private', []]);
});

test('resolved addresses: kept for TTL + grace, per pod and name', () => {
  let now = 0;
  const clock: Clock = { now: () => now, setTimeout: () => ({ cancel: () => undefined }) } as unknown as Clock;
  const r = new ResolvedAddresses(clock);
  r.record('10.0.0.2', 'a.example.com', ['192.0.2.5'], 30);
  assert.equal(r.has('10.0.0.2', 'a.example.com', '192.0.2.5'), true);
  assert.equal(r.has('10.0.0.3', 'a.example.com', '192.0.2.5'), false, 'another pod');
  assert.equal(r.has('10.0.0.2', 'b.example.com', '192.0.2.5'), false, 'another name');
  now = 30_000 + GRACE_MS + 1;
  assert.equal(r.has('10.0.0.2', 'a.example.com', '192.0.2.5'), false, 'expired');
});

test('the egress floor: no allow entry (CIDR, 0.0.0.0/0 or a name) opens the cloud metadata address, in the proxy\'s decision (mapped IPv6 too) or a DNS answer', () => {
  const source = (p: EgressPolicy) => ({ policyForPodIp: () => p, sandboxForPodIp: () => 'sbx' });
  const wide: EgressPolicy = { internet: true, allow: ['169.254.0.0/16', '0.0.0.0/0', 'metadata.example.com'], deny: [] };
  const check = (ip: string, extra = {}) => decideConnection({ sourceIp: '10.0.0.2', destinationIp: ip, destinationPort: 80, ...extra }, { source: source(wide) });
  assert.deepEqual(check('169.254.169.254', { http: { host: 'metadata.example.com', path: '/', method: 'GET' } }), { allowed: false, rule: 'floor', sandbox: 'sbx', protocol: 'http' });
  assert.equal(check('::ffff:169.254.169.254').rule, 'floor');
  assert.equal(check('fd00:ec2::254').rule, 'floor');
  assert.deepEqual(check('169.254.1.1'), { allowed: true, rule: '169.254.0.0/16', sandbox: 'sbx', protocol: 'tcp' }, 'the rest of the allowed CIDR is open');
  const custom = parseEgressFloor(['203.0.113.0/24']).floor;
  assert.equal(decideConnection({ sourceIp: '10.0.0.2', destinationIp: '203.0.113.7', destinationPort: 443 }, { source: source(open), floor: custom }).rule, 'floor');
  assert.equal(decideConnection({ sourceIp: '10.0.0.2', destinationIp: '169.254.169.254', destinationPort: 80 }, { source: source(wide), floor: parseEgressFloor([]).floor }).allowed, true, 'an empty floor leaves the policy');
  const a = filterAnswer(wide, 'metadata.example.com', { addresses: ['169.254.169.254', '192.0.2.9'], ttlS: 30 });
  assert.deepEqual(a.addresses, ['192.0.2.9']);
  const only = filterAnswer(wide, 'metadata.example.com', { addresses: ['169.254.169.254'], ttlS: 30 });
  assert.deepEqual([only.addresses, only.rule, only.verdict], [[], 'floor', 'filtered']);
});

test('DNS resolver: one sandbox flooding queries on one socket gets SERVFAIL past its share of lookups in flight; another sandbox is still answered', async (t) => {
  const held: (() => void)[] = [];
  const upstream = {
    lookup: (name: string): Promise<{ addresses: string[]; ttlS: number }> =>
      name.startsWith('slow') ? new Promise((resolve) => held.push(() => resolve({ addresses: ['192.0.2.1'], ttlS: 30 }))) : Promise.resolve({ addresses: ['192.0.2.2'], ttlS: 30 }),
  };
  const policy = parseEgressPolicy({}, 'p');
  const dns = new DnsResolver({ source: { policyForPodIp: () => policy }, upstream, registry: new Registry(), log: silentLogger(), maxInFlightPerSandbox: 4 });
  t.after(() => dns.close());
  const port = await dns.listen('127.0.0.1', 0);
  const query = (id: number, name: string): Buffer => Buffer.concat([Buffer.from([id >> 8, id & 0xff, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]), ...name.split('.').map((l) => Buffer.from(`${String.fromCharCode(l.length)}${l}`, 'latin1')), Buffer.from([0, 0, 1, 0, 1])]);
  const client = async (address: string): Promise<{ ask: (id: number, name: string) => void; answer: (id: number) => Promise<number> }> => {
    const s = createSocket('udp4');
    t.after(() => s.close());
    await new Promise<void>((resolve) => s.bind(0, address, resolve));
    const waiting = new Map<number, (rcode: number) => void>();
    s.on('message', (m) => waiting.get(m.readUInt16BE(0))?.(m.readUInt8(3) & 0x0f));
    return {
      ask: (id, name) => s.send(query(id, name), port, '127.0.0.1'),
      answer: (id) => new Promise((resolve) => waiting.set(id, resolve)),
    };
  };
  const flooder = await client('127.0.0.2');
  const other = await client('127.0.0.3');
  const refused = Array.from({ length: 3 }, (_, i) => flooder.answer(100 + i));
  for (let i = 0; i < 4; i++) flooder.ask(i, `slow${String(i)}.example.com`);
  for (let i = 0; i < 3; i++) flooder.ask(100 + i, `slow${String(100 + i)}.example.com`);
  assert.deepEqual(await Promise.all(refused), [RCODE.servFail, RCODE.servFail, RCODE.servFail], 'past its 4 lookups in flight');
  const answered = other.answer(7);
  other.ask(7, 'fast.example.com');
  assert.equal(await answered, RCODE.noError, 'another sandbox is answered meanwhile');
  const next = flooder.answer(200);
  for (const release of held.splice(0)) release();
  flooder.ask(200, 'fast.example.com');
  assert.equal(await next, RCODE.noError, 'once its lookups end, the flooder is answered again');
});

test('DNS resolver: past its TCP connections from all sandboxes together a new one is closed at once; those open still answer', async (t) => {
  const policy = parseEgressPolicy({}, 'p');
  const dns = new DnsResolver({ source: { policyForPodIp: () => policy }, upstream: { lookup: () => Promise.resolve({ addresses: ['192.0.2.2'], ttlS: 30 }) }, registry: new Registry(), log: silentLogger(), maxTcpConnections: 2 });
  t.after(() => dns.close());
  const port = await dns.listen('127.0.0.1', 0);
  const open = async (): Promise<Socket> => {
    const s = connect(port, '127.0.0.1');
    t.after(() => s.destroy());
    await once(s, 'connect');
    return s;
  };
  const first = await open();
  await open();
  const third = await open();
  await once(third, 'close');
  const q = Buffer.concat([Buffer.from([0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]), Buffer.from('\x03api\x07example\x03com\x00', 'latin1'), Buffer.from([0, 1, 0, 1])]);
  const framed = Buffer.alloc(2 + q.length);
  framed.writeUInt16BE(q.length, 0);
  q.copy(framed, 2);
  first.write(framed);
  const [reply] = (await once(first, 'data')) as [Buffer];
  assert.equal(reply.readUInt16BE(2), 0x1234, 'the first connection is answered');
});
