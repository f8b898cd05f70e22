// Credential injection: for a host a rule names, the egress proxy terminates the sandbox's TLS with
// a certificate from the cluster's egress CA (which the sandbox trusts), sets the rule's header to
// the secret, and connects to the real host over TLS, checking its real certificate. Every other
// host passes through unopened. The secret reaches the upstream and never the sandbox: not its
// environment, processes, files, nor any response.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { test } from 'node:test';
import type { CredentialRule } from '../src/egress/credentials.ts';
import { run } from './support/egress-net.ts';
import { PUBLIC_DOMAIN, startEgressProxy } from './support/egress-proxy-fixture.ts';

const API = `api.${PUBLIC_DOMAIN}`;
const GOOD = `good.${PUBLIC_DOMAIN}`;
const RULES: CredentialRule[] = [{ id: 'api-key', host: API, pathPrefix: '/v1/', header: 'authorization', secret: 'api-key' }];

test('credential injection: the header arrives upstream, the sandbox never holds the secret, other hosts stay unopened', async (t) => {
  const f = await startEgressProxy(t, { rules: RULES, hosts: ([a = '']) => ({ [API]: [a], [GOOD]: [a] }) });
  const secret = `Bearer sk-live-${randomBytes(16).toString('hex')}`;
  f.secrets.set('api-key', secret);
  const curl = (args: string[]) => f.net.inClient('curl', ['-sS', '--max-time', '10', ...args]);

  await t.test('a request to the rule\'s host and path reaches the upstream with the secret in place of the sandbox\'s own header', async () => {
    f.setPolicy({ internet: false, allow: [API, GOOD], deny: [] });
    const r = await curl(['--cacert', f.trustBundle, '-H', 'Authorization: Bearer placeholder', `https://${API}/v1/quiet`]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, 'ok\n');
    const seen = await f.net.lastRequest();
    assert.ok(seen !== null);
    assert.equal(seen.headers.authorization, secret);
    assert.equal(seen.sni, API, 'the proxy sends the real host name upstream');
    assert.equal(await f.decisions({ rule: API, verdict: 'allowed', protocol: 'http' }), 1);
  });

  await t.test('outside the path prefix nothing is injected', async () => {
    const r = await curl(['--cacert', f.trustBundle, `https://${API}/other/quiet`]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal((await f.net.lastRequest())?.headers.authorization, undefined);
  });

  await t.test('only rule hosts are opened: another host shows its own certificate, the rule host the egress CA\'s', async () => {
    const other = await curl(['--cacert', f.publicCa.caCertPath, `https://${GOOD}/quiet`]);
    assert.equal(other.code, 0, `${GOOD} must pass through with its real certificate: ${other.stderr}`);
    const api = await curl(['--cacert', f.publicCa.caCertPath, `https://${API}/v1/quiet`]);
    assert.equal(api.code, 60, 'the rule host is served with the egress CA\'s certificate (curl 60: not the public CA)');
    const issuer = await run('sh', ['-c', `ip netns exec ${f.net.clientNs} openssl s_client -connect ${API}:443 -servername ${API} </dev/null 2>/dev/null | openssl x509 -noout -issuer`]);
    assert.match(issuer.stdout, /egress test cluster CA/);
  });

  await t.test('the policy still decides, and a Host that differs from the SNI gets neither the upstream nor the secret', async () => {
    f.setPolicy({ internet: false, allow: [GOOD], deny: [] });
    // (Its resolver now refuses the name: the sandbox uses the address it resolved before.)
    const denied = await curl(['--cacert', f.trustBundle, '--resolve', `${API}:443:${f.net.publicIps[0] ?? ''}`, '-D', '-', '-o', '/dev/null', `https://${API}/v1/quiet`]);
    assert.match(denied.stdout, /^HTTP\/\S+ 403/);
    f.setPolicy({ internet: true, allow: [], deny: [] });
    const before = await f.net.lastRequest();
    const smuggled = await curl(['--cacert', f.trustBundle, '-D', '-', '-o', '/dev/null', '-H', `Host: ${GOOD}`, `https://${API}/v1/smuggle-quiet`]);
    assert.match(smuggled.stdout, /^HTTP\/\S+ 403/);
    assert.match(smuggled.stdout, /x-asb-egress-rule: sni-host-mismatch/i);
    assert.deepEqual(await f.net.lastRequest(), before, 'nothing reached any upstream');
  });

  await t.test('the secret is nowhere the sandbox can look: environment, process list, files, responses', async () => {
    f.setPolicy({ internet: true, allow: [], deny: [] });
    const needle = secret.slice('Bearer '.length);
    const looked = await f.net.inClient('sh', ['-c', 'env; ps -eo args; cat /proc/[0-9]*/environ 2>/dev/null | tr "\\0" "\\n"; true']);
    assert.equal(looked.code, 0);
    assert.ok(looked.stdout.length > 0);
    assert.doesNotMatch(looked.stdout, new RegExp(needle));
    // Envoy's config, logs and access log, the CA files: the secret travels in the decision
    // service's answer only, never through a file.
    const files = await run('grep', ['-r', '-l', needle, f.dir]);
    assert.equal(files.stdout, '', `files holding the secret: ${files.stdout}`);
    const echoed = await curl(['--cacert', f.trustBundle, `https://${API}/v1/echo`]);
    assert.equal(echoed.code, 0, echoed.stderr);
    // The upstream saw it (and echoes it back here: that is the upstream's doing, not ours).
    assert.match(echoed.stdout, new RegExp(needle));
    const noEcho = await curl(['--cacert', f.trustBundle, '-D', '-', `https://${API}/v1/quiet`]);
    assert.doesNotMatch(noEcho.stdout, new RegExp(needle), 'no response header of ours carries it');
  });
});

test('a credential rule for a new host takes effect without restarting Envoy: the rewritten LDS file swaps the egress listener, the next connection is intercepted', async (t) => {
  const f = await startEgressProxy(t, { lds: true, hosts: ([a = '']) => ({ [API]: [a] }) });
  const secret = `Bearer sk-new-${randomBytes(8).toString('hex')}`;
  f.secrets.set('api-key', secret);
  f.setPolicy({ internet: true, allow: [], deny: [] });
  const curl = (args: string[]) => f.net.inClient('curl', ['-sS', '--max-time', '10', ...args]);
  const pid = f.envoy.pid;
  const before = await curl(['--cacert', f.publicCa.caCertPath, `https://${API}/v1/quiet`]);
  assert.equal(before.code, 0, `no rule yet: ${API} passes through with its real certificate: ${before.stderr}`);
  assert.equal((await f.net.lastRequest())?.headers.authorization, undefined);

  await f.setRules(RULES);
  // Envoy picks the file up within milliseconds (inotify on the directory); bounded poll of its admin API.
  const dump = async (): Promise<string> => (await fetch(`${f.envoy.endpoints.adminUrl}/config_dump?resource=dynamic_listeners`)).text();
  for (let i = 0; i < 200 && !(await dump()).includes(`egress-intercept-${API}`); i++) await new Promise((r) => setTimeout(r, 25));
  const after = await curl(['--cacert', f.trustBundle, `https://${API}/v1/quiet`]);
  assert.equal(after.code, 0, after.stderr);
  assert.equal((await f.net.lastRequest())?.headers.authorization, secret, 'the new rule\'s secret arrives upstream');
  const issuer = await run('sh', ['-c', `ip netns exec ${f.net.clientNs} openssl s_client -connect ${API}:443 -servername ${API} </dev/null 2>/dev/null | openssl x509 -noout -issuer`]);
  assert.match(issuer.stdout, /egress test cluster CA/, 'served with the egress CA\'s certificate now');
  assert.equal(f.envoy.pid, pid, 'the same Envoy process');
});
