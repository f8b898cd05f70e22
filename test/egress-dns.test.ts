// The sandbox DNS resolver: real glibc (Python's getaddrinfo) and curl inside a sandbox namespace
// whose resolv.conf names the gateway. Only names the policy allows are answered, an answer never
// carries an address the policy denies (private ranges, link-local, denied CIDRs), other record
// types carry nothing, and each refusal is counted per rule.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { PUBLIC_DOMAIN, startEgressProxy, type EgressProxyFixture } from './support/egress-proxy-fixture.ts';

const GOOD = `good.${PUBLIC_DOMAIN}`;
const EVIL = `evil.${PUBLIC_DOMAIN}`;
const INTERNAL = `internal.${PUBLIC_DOMAIN}`;
const MIXED = `mixed.${PUBLIC_DOMAIN}`;

/** getaddrinfo in the sandbox: the sorted addresses, or the error. */
async function resolve(f: EgressProxyFixture, name: string): Promise<{ addresses: string[]; error?: string; ms: number }> {
  const script = `import socket,sys
try:
  print(" ".join(sorted({a[4][0] for a in socket.getaddrinfo(sys.argv[1], 80, proto=socket.IPPROTO_TCP)})))
except socket.gaierror as e:
  print("ERR", e.args[1])`;
  const started = performance.now();
  const r = await f.net.inClient('python3', ['-c', script, name]);
  const ms = performance.now() - started;
  const out = r.stdout.trim();
  if (out.startsWith('ERR')) return { addresses: [], error: out.slice(4), ms };
  return { addresses: out === '' ? [] : out.split(' '), ms };
}

/** One raw UDP query from the sandbox: [rcode, answer count]. */
async function rawQuery(f: EgressProxyFixture, name: string, qtype: number): Promise<[number, number]> {
  const script = `import socket,struct,sys
name,qtype,server=sys.argv[1],int(sys.argv[2]),sys.argv[3]
q=struct.pack(">HHHHHH",0x1234,0x0100,1,0,0,0)+b"".join(bytes([len(l)])+l.encode() for l in name.split("."))+b"\\0"+struct.pack(">HH",qtype,1)
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(3); s.sendto(q,(server,53))
r=s.recv(4096); print(r[3]&15, struct.unpack(">H",r[6:8])[0])`;
  const r = await f.net.inClient('python3', ['-c', script, name, String(qtype), f.net.gateway]);
  const [rcode = '-1', count = '-1'] = r.stdout.trim().split(' ');
  return [Number(rcode), Number(count)];
}

test('sandbox DNS: only allowed names, never a denied address, nothing but addresses', async (t) => {
  const f = await startEgressProxy(t, {
    hosts: ([a = '', b = '']) => ({ [GOOD]: [a], [EVIL]: [a], [INTERNAL]: ['10.1.2.3'], [MIXED]: [b, '169.254.169.254', a] }),
  });
  const [pubA = '', pubB = ''] = f.net.publicIps;

  await t.test('an allowed name resolves to its public address; curl and urllib reach it through the proxy by name', async () => {
    f.setPolicy({ internet: false, allow: [GOOD], deny: [] });
    assert.deepEqual((await resolve(f, GOOD)).addresses, [pubA]);
    const https = await f.net.inClient('curl', ['-sS', '--max-time', '10', '--cacert', f.publicCa.caCertPath, `https://${GOOD}/dns`]);
    assert.equal(https.code, 0, https.stderr);
    assert.equal((JSON.parse(https.stdout) as { sni: string }).sni, GOOD);
    const py = await f.net.inClient('python3', ['-c', `import urllib.request; print(urllib.request.urlopen("http://${GOOD}/py", timeout=10).status)`]);
    assert.equal(py.stdout.trim(), '200', py.stderr);
  });

  await t.test('a name the policy does not allow gets NXDOMAIN at once, and is counted', async () => {
    f.setPolicy({ internet: false, allow: [GOOD], deny: [] });
    const r = await resolve(f, EVIL);
    assert.deepEqual(r.addresses, []);
    assert.match(r.error ?? '', /not known|No address|Name or service/i);
    assert.ok(r.ms < 2000, `took ${Math.round(r.ms)} ms`);
    const curl = await f.net.inClient('curl', ['-sS', '--max-time', '10', `http://${EVIL}/`]);
    assert.equal(curl.code, 6, 'curl: could not resolve host');
    assert.ok((await f.dnsQueries({ rule: 'default-no-internet', verdict: 'refused' })) >= 2);
    f.setPolicy({ internet: true, allow: [], deny: [EVIL] });
    assert.deepEqual((await resolve(f, EVIL)).addresses, []);
    assert.ok((await f.dnsQueries({ rule: EVIL, verdict: 'refused' })) >= 1);
  });

  await t.test('an answer never opens a private, link-local or denied address (DNS rebinding), even for an allowed name', async () => {
    f.setPolicy({ internet: true, allow: [INTERNAL, MIXED], deny: [pubB] });
    assert.deepEqual((await resolve(f, INTERNAL)).addresses, [], 'a private address is never handed out');
    assert.ok((await f.dnsQueries({ rule: 'default-private', verdict: 'filtered' })) >= 1);
    assert.deepEqual((await resolve(f, MIXED)).addresses, [pubA], 'only the addresses the policy allows survive');
    // An allow CIDR opens it, as it would open a direct connection.
    f.setPolicy({ internet: true, allow: ['10.1.2.0/24'], deny: [] });
    assert.deepEqual((await resolve(f, INTERNAL)).addresses, ['10.1.2.3']);
  });

  await t.test('record types other than A/AAAA carry nothing (no TXT tunnel); unknown sources are refused', async () => {
    f.setPolicy({ internet: true, allow: [], deny: [] });
    assert.deepEqual(await rawQuery(f, GOOD, 16), [0, 0]);
    assert.deepEqual(await rawQuery(f, GOOD, 1), [0, 1]);
    f.setPolicy(undefined);
    assert.deepEqual(await rawQuery(f, GOOD, 1), [5, 0]);
  });
});
