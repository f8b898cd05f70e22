// The egress proxy: a sandbox's outbound TCP, redirected by the kernel to the cluster Envoy's
// egress listener, is judged per connection by the egress decision service: HTTPS by its SNI
// (passed through unopened), plain HTTP by its Host, anything else by address. Real curl inside a
// network namespace, real public servers in another, the Envoy config production runs
// (envoy/edge.yaml). Denials fail fast and are counted per sandbox and rule.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { PUBLIC_DOMAIN, startEgressProxy, type EgressProxyFixture } from './support/egress-proxy-fixture.ts';

const GOOD = `good.${PUBLIC_DOMAIN}`;
const EVIL = `evil.${PUBLIC_DOMAIN}`;

interface Fetched {
  exit: number;
  status: number;
  body: string;
  ms: number;
  headers: string;
}

/** curl inside the sandbox namespace: the name through the sandbox resolver, or forced to `ip` (as a sandbox with its own /etc/hosts would). */
async function curl(f: EgressProxyFixture, url: string, ip?: string): Promise<Fetched> {
  const u = new URL(url);
  const port = u.port === '' ? (u.protocol === 'https:' ? '443' : '80') : u.port;
  const started = performance.now();
  const pin = ip === undefined ? [] : ['--resolve', `${u.hostname}:${port}:${ip}`];
  const r = await f.net.inClient('curl', ['-sS', '--max-time', '10', '--cacert', f.publicCa.caCertPath, ...pin, '-D', '-', '-w', '\n%{http_code}', url]);
  const ms = performance.now() - started;
  const lines = r.stdout.split('\n');
  const status = Number(lines.pop() ?? '0');
  const all = lines.join('\n');
  const split = all.indexOf('\r\n\r\n');
  const headers = split === -1 ? '' : all.slice(0, split);
  return { exit: r.code, status, body: split === -1 ? all : all.slice(split + 4), ms, headers: `${headers}\n${r.stderr}` };
}

/** A raw TCP exchange from the sandbox: connect, send a line, read until the peer closes. */
async function tcp(f: EgressProxyFixture, ip: string, port: number): Promise<{ exit: number; out: string; ms: number }> {
  const script = `import socket,sys
s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=8)
s.sendall(b"hello\\n")
out=b""
try:
  while True:
    b=s.recv(4096)
    if not b: break
    out+=b
except ConnectionResetError:
  pass
sys.stdout.write(out.decode())`;
  const started = performance.now();
  const r = await f.net.inClient('python3', ['-c', script, ip, String(port)]);
  return { exit: r.code, out: r.stdout, ms: performance.now() - started };
}

test('egress proxy: HTTPS by SNI (unopened), HTTP by Host, other TCP by address; denials fail fast and are counted', async (t) => {
  const f = await startEgressProxy(t, { hosts: ([a = '']) => ({ [GOOD]: [a], [EVIL]: [a] }) });
  const [pubA = '', pubB = '', pubC = ''] = f.net.publicIps;

  await t.test('an allowed HTTPS name passes through unopened: the sandbox sees the server\'s own certificate', async () => {
    f.setPolicy({ internet: false, allow: [GOOD], deny: [] });
    const r = await curl(f, `https://${GOOD}/hello`);
    assert.equal(r.exit, 0, r.headers);
    assert.equal(r.status, 200);
    const seen = JSON.parse(r.body) as { served: string; sni: string; scheme: string };
    assert.deepEqual([seen.served, seen.sni, seen.scheme], [pubA, GOOD, 'https']);
    assert.equal(await f.decisions({ rule: GOOD, verdict: 'allowed', protocol: 'tls' }), 1);
  });

  await t.test('an HTTPS name the policy does not allow is cut before any byte reaches the server', async () => {
    f.setPolicy({ internet: false, allow: [GOOD], deny: [] });
    const before = (await f.net.accepted())[`${pubA}:443`] ?? 0;
    const r = await curl(f, `https://${EVIL}/`, pubA);
    assert.notEqual(r.exit, 0, 'the TLS handshake must fail');
    assert.ok(r.ms < 3000, `denied connection took ${Math.round(r.ms)} ms: it must fail fast, not hang`);
    assert.equal((await f.net.accepted())[`${pubA}:443`] ?? 0, before, 'the public server must not even see a connection');
    assert.equal(await f.decisions({ rule: 'default-no-internet', verdict: 'denied', protocol: 'tls' }), 1);
  });

  await t.test('a deny-listed domain is refused while the internet is otherwise open', async () => {
    f.setPolicy({ internet: true, allow: [], deny: [`*.${PUBLIC_DOMAIN}`] });
    const r = await curl(f, `https://${EVIL}/`, pubA);
    assert.notEqual(r.exit, 0);
    assert.equal(await f.decisions({ rule: `*.${PUBLIC_DOMAIN}`, verdict: 'denied', protocol: 'tls' }), 1);
  });

  await t.test('plain HTTP is judged by each request\'s Host: allowed → the server, denied → 403 naming the rule', async () => {
    f.setPolicy({ internet: false, allow: [GOOD], deny: [] });
    const ok = await curl(f, `http://${GOOD}/path?q=1`);
    assert.equal(ok.status, 200, ok.headers);
    const seen = JSON.parse(ok.body) as { served: string; host: string; path: string; headers: Record<string, string> };
    assert.deepEqual([seen.served, seen.host, seen.path], [pubA, GOOD, '/path?q=1']);
    // A transparent hop: nothing of Envoy's reaches the server.
    assert.deepEqual(Object.keys(seen.headers).filter((h) => h.startsWith('x-envoy') || h === 'x-request-id' || h === 'x-forwarded-for'), []);
    const before = (await f.net.accepted())[`${pubA}:80`] ?? 0;
    const denied = await curl(f, `http://${EVIL}/`, pubA);
    assert.equal(denied.status, 403);
    assert.match(denied.headers, /x-asb-egress-rule: default-no-internet/i);
    assert.match(denied.body, /denied by this sandbox's network policy/);
    assert.equal((await f.net.accepted())[`${pubA}:80`] ?? 0, before);
    assert.equal(await f.decisions({ rule: 'default-no-internet', verdict: 'denied', protocol: 'http' }), 1);
  });

  await t.test('an allowed name never opens an address a CIDR rule denies (SNI or Host pointing at it)', async () => {
    f.setPolicy({ internet: false, allow: [GOOD], deny: [pubB] });
    const https = await curl(f, `https://${GOOD}/`, pubB);
    assert.notEqual(https.exit, 0);
    const http = await curl(f, `http://${GOOD}/`, pubB);
    assert.equal(http.status, 403);
    assert.equal(await f.decisions({ rule: pubB, verdict: 'denied' }), 2);
  });

  await t.test('an allowed name opens only the addresses the sandbox resolver gave for it (no domain fronting)', async () => {
    f.setPolicy({ internet: false, allow: [GOOD], deny: [] });
    // pubC is public and no rule denies it, but it is not GOOD's address: an allowed SNI or Host
    // must not carry the sandbox there.
    const https = await curl(f, `https://${GOOD}/`, pubC);
    assert.notEqual(https.exit, 0);
    const http = await curl(f, `http://${GOOD}/`, pubC);
    assert.equal(http.status, 403);
    assert.match(http.headers, /x-asb-egress-rule: address-not-resolved/i);
    const seen = await f.net.accepted();
    assert.equal((seen[`${pubC}:443`] ?? 0) + (seen[`${pubC}:80`] ?? 0), 0);
    // With the internet open the address is judged as any other: allowed.
    f.setPolicy({ internet: true, allow: [GOOD], deny: [] });
    assert.equal((await curl(f, `http://${GOOD}/`, pubC)).status, 200);
  });

  await t.test('TCP without a name is judged by address; a server that speaks first tells a denied sandbox nothing', async () => {
    f.setPolicy({ internet: false, allow: [GOOD], deny: [] });
    const denied = await tcp(f, pubA, 2222);
    assert.doesNotMatch(denied.out, /SSH-2.0/);
    assert.ok(denied.ms < 3000, `took ${Math.round(denied.ms)} ms`);
    assert.equal((await f.net.accepted())[`${pubA}:2222`] ?? 0, 0, 'no connection may reach a denied address');
    assert.equal(await f.decisions({ rule: 'default-no-internet', verdict: 'denied', protocol: 'tcp' }), 1);
    f.setPolicy({ internet: false, allow: [`${pubA}/32`], deny: [] });
    const allowed = await tcp(f, pubA, 2222);
    assert.match(allowed.out, /SSH-2.0-egress-test/);
  });

  await t.test('a policy replaced while the sandbox runs decides its next connection', async () => {
    f.setPolicy({ internet: true, allow: [], deny: [] });
    assert.equal((await curl(f, `http://${EVIL}/`, pubA)).status, 200);
    f.setPolicy({ internet: true, allow: [], deny: [EVIL] });
    assert.equal((await curl(f, `http://${EVIL}/`, pubA)).status, 403);
  });

  await t.test('a source that is no known sandbox is refused (the proxy is no open relay)', async () => {
    f.setPolicy(undefined);
    const r = await curl(f, `http://${GOOD}/`, pubA);
    assert.equal(r.status, 403);
    assert.match(r.headers, /x-asb-egress-rule: unknown-source/i);
  });
});
