// ensureFederationTls (src/edge/tls.ts): the CA and per-Envoy certificates the ingress hop's
// mutual TLS runs on, made with the openssl CLI, reused when they still fit, remade when not.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isAsbError } from '../src/errors.ts';
import { EDGE_SAN, ensureEdgeTls, ensureFederationTls, INGRESS_SAN } from '../src/edge/tls.ts';

const SERVER_AUTH = '1.3.6.1.5.5.7.3.1';
const CLIENT_AUTH = '1.3.6.1.5.5.7.3.2';

function tempDir(t: test.TestContext): string {
  const dir = mkdtempSync(join(tmpdir(), 'asb-tls-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

function cert(path: string): X509Certificate {
  return new X509Certificate(readFileSync(path));
}

test('a CA and one certificate per Envoy name, signed by it, good for serving and connecting; keys 0600', async (t) => {
  const dir = join(tempDir(t), 'tls');
  const files = await ensureFederationTls(dir, { names: ['region-a', 'region-b'] });
  const ca = cert(files.caCertPath);
  assert.equal(ca.ca, true);
  assert.deepEqual(Object.keys(files.envoys), ['region-a', 'region-b']);
  // The first name's files are the top-level ones: one Envoy can take the whole result as its tls option.
  assert.equal(files.certChainPath, files.envoys['region-a']?.certChainPath);
  for (const [name, envoy] of Object.entries(files.envoys)) {
    const leaf = cert(envoy.certChainPath);
    assert.ok(leaf.verify(ca.publicKey), `${name} is signed by the CA`);
    assert.equal(leaf.ca, false);
    assert.match(leaf.subject, new RegExp(`CN=${name}`));
    assert.deepEqual((leaf.subjectAltName ?? '').split(', ').sort(), [`DNS:${EDGE_SAN}`, `DNS:${INGRESS_SAN}`].sort());
    assert.deepEqual([...leaf.keyUsage].sort(), [SERVER_AUTH, CLIENT_AUTH].sort());
    assert.equal(statSync(envoy.privateKeyPath).mode & 0o777, 0o600);
  }
  assert.equal(statSync(files.caKeyPath).mode & 0o777, 0o600);
  assert.equal(statSync(dir).mode & 0o777, 0o700);
  assert.notEqual(readFileSync(files.envoys['region-a']?.privateKeyPath ?? ''), readFileSync(files.envoys['region-b']?.privateKeyPath ?? ''));
});

test('a second call reuses every file; a missing or broken one is made again, and a new CA remakes every certificate', async (t) => {
  const dir = tempDir(t);
  const names = ['a', 'b'];
  const first = await ensureFederationTls(dir, { names });
  const snapshot = (): string[] => [first.caCertPath, first.caKeyPath, ...names.flatMap((n) => [join(dir, `${n}.crt`), join(dir, `${n}.key`)])].map((p) => readFileSync(p, 'utf8'));
  const before = snapshot();
  await ensureFederationTls(dir, { names });
  assert.deepEqual(snapshot(), before, 'nothing rewritten');

  // b's key lost: b is remade, a and the CA stay.
  rmSync(join(dir, 'b.key'));
  await ensureFederationTls(dir, { names });
  const afterB = snapshot();
  assert.deepEqual(afterB.slice(0, 4), before.slice(0, 4));
  assert.notEqual(afterB[4], before[4]);

  // A truncated certificate is remade, not passed to Envoy.
  writeFileSync(join(dir, 'a.crt'), '-----BEGIN CERTIFICATE-----\n');
  await ensureFederationTls(dir, { names });
  assert.ok(cert(join(dir, 'a.crt')).verify(cert(first.caCertPath).publicKey));

  // The CA's key lost: a new CA, and certificates of the old one no longer fit.
  rmSync(first.caKeyPath);
  await ensureFederationTls(dir, { names });
  const ca = cert(first.caCertPath);
  assert.notEqual(readFileSync(first.caCertPath, 'utf8'), before[0]);
  for (const n of names) assert.ok(cert(join(dir, `${n}.crt`)).verify(ca.publicKey), `${n} re-signed by the new CA`);
});

test('a certificate about to expire is made again', async (t) => {
  const dir = tempDir(t);
  const first = await ensureFederationTls(dir, { validDays: 30 });
  const leafBefore = readFileSync(first.certChainPath, 'utf8');
  const caBefore = readFileSync(first.caCertPath, 'utf8');
  // 29.5 days on: within a day of the leaf's end (30 days), far from the CA's (300 days).
  const later = Date.now() + 29.5 * 24 * 3600 * 1000;
  await ensureFederationTls(dir, { validDays: 30, now: () => later });
  assert.notEqual(readFileSync(first.certChainPath, 'utf8'), leafBefore);
  assert.equal(readFileSync(first.caCertPath, 'utf8'), caBefore);
});

test('bad names are refused, and a missing openssl says what to install', async (t) => {
  const dir = tempDir(t);
  for (const names of [[], ['ca'], ['Bad_Name'], ['a', 'a']]) {
    await assert.rejects(ensureFederationTls(dir, { names }), (err: unknown) => isAsbError(err, 'Invalid') && err.message.includes('Envoy names'), JSON.stringify(names));
  }
  await assert.rejects(ensureFederationTls(join(dir, 'x'), { openssl: '/nonexistent/openssl' }), (err: unknown) => isAsbError(err, 'Unavailable') && /openssl package/.test(err.message));
});

test('ensureEdgeTls: a serving certificate for *.<domain> and <domain> from a local CA, reused until the domain changes', async (t) => {
  const dir = join(tempDir(t), 'edge-tls');
  const files = await ensureEdgeTls(dir, 'asb.localhost');
  const ca = cert(files.caCertPath);
  const leaf = cert(files.certChainPath);
  assert.ok(leaf.verify(ca.publicKey));
  assert.equal(leaf.checkHost('49983-abc123.asb.localhost'), '*.asb.localhost', 'any sandbox host');
  assert.equal(leaf.checkHost('api.asb.localhost'), '*.asb.localhost');
  assert.equal(leaf.checkHost('asb.localhost'), 'asb.localhost');
  assert.equal(leaf.checkHost('x.other.example'), undefined);
  assert.deepEqual([...leaf.keyUsage], [SERVER_AUTH]);
  assert.equal(statSync(files.privateKeyPath).mode & 0o777, 0o600);

  const again = await ensureEdgeTls(dir, 'asb.localhost');
  assert.equal(readFileSync(again.certChainPath, 'utf8'), readFileSync(files.certChainPath, 'utf8'), 'reused');
  const moved = await ensureEdgeTls(dir, 'sandboxes.example.com');
  assert.equal(cert(moved.certChainPath).checkHost('8080-abc.sandboxes.example.com'), '*.sandboxes.example.com', 'a new domain, a new certificate');
  assert.equal(readFileSync(moved.caCertPath, 'utf8'), readFileSync(files.caCertPath, 'utf8'), 'from the same CA');
  await assert.rejects(ensureEdgeTls(dir, 'localhost'), (err: unknown) => isAsbError(err, 'Invalid') && /at least two labels/.test(err.message));
});
