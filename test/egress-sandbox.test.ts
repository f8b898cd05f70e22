// The egress proxy end to end with real sandboxes: pods of the local runtime (runc) whose outbound
// TCP the kernel rules DNAT to the cluster Envoy's egress listener on the bridge gateway
// (LocalRuntimeOptions.egressProxy), decided by the egress decision service from the runtime's own
// pod → policy map, and whose DNS goes to the sandbox resolver on the gateway. curl and Python's
// urllib inside the sandbox; the "internet" is a namespace this file makes
// (test/support/egress-net.ts). On main there is no egress listener: every allowed name here was
// unreachable and nothing answered the sandbox's DNS.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { Registry } from 'prom-client';
import { EnvoyProcess } from '../src/edge/envoy-process.ts';
import { createEgressMetrics, EgressAuthzServer } from '../src/egress/authz-service.ts';
import { DnsResolver, withHosts } from '../src/egress/dns-resolver.ts';
import { ensureEgressCa, ensureHostCertificate } from '../src/egress/egress-ca.ts';
import type { CredentialRule } from '../src/egress/credentials.ts';
import type { EgressPolicySource } from '../src/egress/egress-decision.ts';
import { ResolvedAddresses } from '../src/egress/resolved-addresses.ts';
import { ensureBridge, parseSubnet } from '../src/runtime/local/network.ts';
import { DEFAULT_CLAIMS_DIR, releaseNetwork } from '../src/runtime/local/network-claim.ts';
import type { PodRequest } from '../src/runtime/runtime.ts';
import { systemClock } from '../src/base/clock.ts';
import { freePort } from '../src/assembly/local-system.ts';
import { silentLogger } from '../src/base/log.ts';
import { createApiClient } from '../src/client/api-client.ts';
import { startTestSystem } from './support/local-system.ts';
import { EgressNet } from './support/egress-net.ts';
import { PUBLIC_DOMAIN } from './support/egress-proxy-fixture.ts';
import { startTestRuntime, stopTestRuntime } from './support/test-runtime.ts';

// Subnets: 10.242/16 for the namespaces of test/support/egress-net.ts (egress-credentials,
// egress-cut, egress-proxy-cut and this file), 10.243/16 for this file's runtime.
const BRIDGE = 'asbegrt0';
const SUBNET = '10.243.0.0/16';
const GATEWAY = '10.243.0.1';
const GOOD = `good.${PUBLIC_DOMAIN}`;
const EVIL = `evil.${PUBLIC_DOMAIN}`;
const API = `api.${PUBLIC_DOMAIN}`;

test('real sandboxes: the kernel sends their TCP to the egress proxy, which decides by SNI and Host; their DNS answers by policy', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-egress-rt-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const net = await EgressNet.create(t);
  const publicCa = await ensureEgressCa(join(dir, 'public-ca'), 'egress test public CA');
  await net.startUpstream(await ensureHostCertificate(publicCa, `*.${PUBLIC_DOMAIN}`));
  const [pubA = ''] = net.publicIps;

  // The cluster's egress CA: the runtime adds it to every pod's trust store.
  const egressCa = await ensureEgressCa(join(dir, 'egress-ca'), 'egress test cluster CA');
  const port = await freePort();
  const runtime = await startTestRuntime('asb-egress-rt-', BRIDGE, SUBNET, { egressProxy: { port }, podDns: true, extraCaPath: egressCa.caCertPath, probeIntervalMs: 100, pollIntervalMs: 100 });
  t.after(() => stopTestRuntime(runtime));
  // Its claim on 10.243/16 goes with it: the next test's worker takes the same subnet.
  t.after(() => releaseNetwork(DEFAULT_CLAIMS_DIR, BRIDGE, resolve(runtime.root)));
  // The listener binds the gateway address, which the bridge carries.
  await ensureBridge(BRIDGE, parseSubnet(SUBNET));

  const registry = new Registry();
  const resolved = new ResolvedAddresses(systemClock);
  const source: EgressPolicySource = { policyForPodIp: (ip) => runtime.rt.policyForPodIp(ip) };
  const secret = `Bearer sk-live-${randomBytes(16).toString('hex')}`;
  const rules: CredentialRule[] = [{ id: 'api', host: API, header: 'authorization', secret: 'api-key' }];
  const credentials = { rulesFor: () => rules, secretValue: (name: string) => (name === 'api-key' ? secret : undefined) };
  const authz = await EgressAuthzServer.start({ host: '127.0.0.1', port: 0, source, credentials, metrics: createEgressMetrics(registry), log: silentLogger(), resolved: (pod, name, ip) => resolved.has(pod, name, ip) });
  t.after(() => authz.close());
  const hosts = new Map([[GOOD, [pubA]], [EVIL, [pubA]], [API, [pubA]]]);
  const dns = new DnsResolver({ source, registry, log: silentLogger(), upstream: withHosts(hosts, { lookup: () => Promise.resolve({ addresses: 'nxdomain', ttlS: 0 }) }), onAnswer: (pod, name, ips, ttl) => resolved.record(pod, name, ips, ttl) });
  t.after(() => dns.close());
  await dns.listen(GATEWAY, 53);
  const envoy = new EnvoyProcess({
    stateDir: join(dir, 'envoy'),
    logger: silentLogger(),
    concurrency: 1,
    config: {
      listenPort: 0,
      adminPort: 0,
      routerAddress: '127.0.0.1:9',
      workers: [],
      egress: { listenAddress: GATEWAY, listenPort: port, authzAddress: `127.0.0.1:${authz.port}`, intercept: [await ensureHostCertificate(egressCa, API)], upstreamCaPath: publicCa.caCertPath },
    },
  });
  t.after(() => envoy.close());
  await envoy.start();

  const request: PodRequest = {
    id: 'egress-e2e',
    uid: 'uid-egress-e2e',
    namespace: 'default',
    hostname: 'egress-e2e',
    spec: { containers: [{ name: 'main', image: 'agent-sandbox/base', command: ['sleep', 'infinity'] }] },
    egress: { internet: false, allow: [GOOD, API], deny: [] },
  };
  t.after(() => runtime.rt.remove(request.id));
  assert.equal((await runtime.rt.start(request)).phase, 'Running');
  const sh = async (script: string): Promise<string> => {
    const r = await runtime.rt.exec(request.id, { command: ['sh', '-c', script], timeoutMs: 60_000 });
    return Buffer.from(r.stdout).toString('utf8') + Buffer.from(r.stderr).toString('utf8');
  };
  // The stand-in internet's roots, which a real image would carry; the egress CA the runtime added.
  await runtime.rt.exec(request.id, { command: ['sh', '-c', 'cat > /tmp/ca.pem'], stdin: readFileSync(publicCa.caCertPath), timeoutMs: 30_000 });

  await t.test('the runtime points the sandbox\'s resolver at the gateway and adds the egress CA to its trust store', async () => {
    const out = await sh('cat /etc/resolv.conf; grep -c "BEGIN CERTIFICATE" /etc/ssl/certs/ca-certificates.crt');
    assert.match(out, new RegExp(`nameserver ${GATEWAY.replaceAll('.', '\\.')}`));
    const bundle = await sh('cat /etc/ssl/certs/ca-certificates.crt');
    assert.ok(bundle.includes(readFileSync(egressCa.caCertPath, 'utf8').trim()), 'the egress CA is in the bundle');
    assert.ok(Number(/\n(\d+)\s*$/.exec(out)?.[1] ?? 0) > 1, 'and the image\'s own roots are still there');
  });

  await t.test('an allowed name: resolved by the gateway, HTTPS passes through to the real server, plain HTTP by Host', async () => {
    const out = await sh(`python3 -c 'import socket; print("addr=" + socket.gethostbyname("${GOOD}"))'
curl -sS --max-time 10 --cacert /tmp/ca.pem https://${GOOD}/tls; echo
python3 -c 'import urllib.request; print("py=%d" % urllib.request.urlopen("http://${GOOD}/py", timeout=10).status)'`);
    assert.match(out, new RegExp(`addr=${pubA.replaceAll('.', '\\.')}`));
    assert.match(out, new RegExp(`"sni":"${GOOD}"`), out);
    assert.match(out, /py=200/);
  });

  await t.test('a name the policy does not allow: no answer from DNS, and an address pinned by hand is cut by SNI and Host, fast', async () => {
    const out = await sh(`python3 -c 'import socket
try: socket.gethostbyname("${EVIL}"); print("resolved")
except OSError: print("nxdomain")'
start=$(date +%s%N); curl -sS --max-time 10 --cacert /tmp/ca.pem --resolve ${EVIL}:443:${pubA} https://${EVIL}/ >/dev/null 2>&1; echo "tls_exit=$? ms=$(( ($(date +%s%N) - start) / 1000000 ))"
curl -sS --max-time 10 --resolve ${EVIL}:80:${pubA} -o /dev/null -w 'http_code=%{http_code}\\n' http://${EVIL}/`);
    assert.match(out, /nxdomain/);
    const tls = /tls_exit=(\d+) ms=(\d+)/.exec(out);
    assert.ok(tls !== null, out);
    assert.notEqual(tls[1], '0');
    assert.ok(Number(tls[2]) < 3000, out);
    assert.match(out, /http_code=403/);
    assert.equal((await net.accepted())[`${pubA}:443`] ?? 0, 1, 'only the allowed connection reached the server');
  });

  await t.test('credential injection: the sandbox calls the API with no key, trusting only its own store; the key arrives upstream and is nowhere in the sandbox', async () => {
    const out = await sh(`curl -sS --max-time 10 https://${API}/v1/quiet; python3 -c 'import urllib.request; print("py=%d" % urllib.request.urlopen("https://${API}/v1/quiet-py", timeout=10).status)'`);
    assert.match(out, /^ok\n/, out);
    assert.match(out, /py=200/);
    assert.equal((await net.lastRequest())?.headers.authorization, secret);
    const needle = secret.slice('Bearer '.length);
    // Its environment, every process's command line and environment, and every writable or
    // configuration directory (the image's /usr is the image's, read through the overlay). The needle
    // comes in on stdin, so no command line of the search itself carries it.
    const search = `read -r n; env; ps -eo args; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; grep -rlsF -- "$n" /etc /home /root /tmp /var /run /opt /srv; grep -rlsF -- nameserver /etc | grep -c resolv.conf; echo done`;
    const looked = await runtime.rt.exec(request.id, { command: ['sh', '-c', search], user: 0, stdin: Buffer.from(`${needle}\n`), timeoutMs: 120_000 });
    const text = Buffer.from(looked.stdout).toString('utf8');
    assert.match(text, /\n1\ndone\n$/, 'the search ran to the end and finds what is there (control: resolv.conf)');
    assert.ok(!text.includes(needle), 'the secret is visible inside the sandbox');
  });

  await t.test('a policy replaced while the sandbox runs decides its next connection', async () => {
    await runtime.rt.setEgressPolicy(request.id, { internet: false, allow: [EVIL], deny: [] });
    const out = await sh(`curl -sS --max-time 10 --cacert /tmp/ca.pem https://${EVIL}/ -o /dev/null -w 'evil=%{http_code}\\n'; curl -sS --max-time 10 --resolve ${GOOD}:80:${pubA} -o /dev/null -w 'good=%{http_code}\\n' http://${GOOD}/`);
    assert.match(out, /evil=200/);
    assert.match(out, /good=403/);
  });
});

test('the local system with --egress-proxy-port: the worker runs the decision service and resolver, Envoy the egress listener, sandboxes go through them', async (t) => {
  const net = await EgressNet.create(t);
  const dir = mkdtempSync(join(tmpdir(), 'asb-egress-sys-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const publicCa = await ensureEgressCa(join(dir, 'public-ca'), 'egress test public CA');
  await net.startUpstream(await ensureHostCertificate(publicCa, `*.${PUBLIC_DOMAIN}`));
  const [pubA = ''] = net.publicIps;
  const system = await startTestSystem('egst', 243, 'local', 0, false, [], ['--egress-proxy-port', String(await freePort())]);
  t.after(() => system.cleanup());
  const api = createApiClient({ url: system.apiUrl, key: system.adminKey });
  const sbx = await api.createSandbox({ template: 'base', network: { internet: true, allow: [], deny: [EVIL] } });
  await api.writeFile(sbx.id, '/tmp/ca.pem', readFileSync(publicCa.caCertPath));
  const run = async (cmd: string): Promise<string> => {
    const r = await api.exec(sbx.id, { command: cmd, timeoutMs: 30_000 });
    return `${r.stdout}${r.stderr}`;
  };
  const good = await run(`curl -sS --max-time 10 --cacert /tmp/ca.pem --resolve ${GOOD}:443:${pubA} https://${GOOD}/sys`);
  assert.match(good, new RegExp(`"sni":"${GOOD}"`), good);
  const evil = await run(`curl -sS --max-time 10 --resolve ${EVIL}:80:${pubA} -o /dev/null -w 'code=%{http_code}' http://${EVIL}/`);
  assert.match(evil, /code=403/);
  const metrics = await api.metrics();
  assert.match(metrics, new RegExp(`asb_egress_decisions_total\\{sandbox="${sbx.id}",rule="${EVIL.replaceAll('.', '\\.')}",verdict="denied",protocol="http"\\} 1`));

  // A credential rule for a host no rule named when Envoy started: the worker rewrites the egress
  // listener's LDS file and the same Envoy serves the sandbox that host's certificate from the
  // cluster's egress CA on the next connection (before: the host's own, passed through).
  const envoyPid = system.envoy.pid;
  const issuer = async (): Promise<string> => run(`curl -skv --max-time 10 -o /dev/null --resolve ${API}:443:${pubA} https://${API}/ 2>&1 | grep -i 'issuer:' || true`);
  assert.match(await issuer(), /egress test public CA/, 'no rule yet: passed through');
  await api.putEgressSecret('api-key', 'Bearer sk-sys');
  await api.putCredentialRule('api-key', { host: API, header: 'authorization', secret: 'api-key' });
  let seen = '';
  for (let i = 0; i < 100 && !/asb egress CA/.test(seen); i++) seen = await issuer();
  assert.match(seen, /asb egress CA/, 'the rule host is intercepted with no Envoy restart');
  assert.equal(system.envoy.pid, envoyPid, 'the same Envoy process');
});
