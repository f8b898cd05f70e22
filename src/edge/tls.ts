// The mutual TLS material of a federation's ingress hop: one CA, and one certificate per Envoy,
// signed by it, that serves the Envoy's ingress listener and is its client certificate toward
// other clusters' ingresses. envoy/edge.yaml trusts that CA alone and pins the role by DNS SAN:
// INGRESS_SAN on the serving side, EDGE_SAN on the connecting side. Every certificate carries
// both, because every cluster's Envoy plays both roles.
//
// Made with the `openssl` CLI (Debian package openssl, installed by `make deps`), ~7 ms per
// certificate. Files that exist are reused when they still fit together (checked in-process with
// node:crypto: no process per check), so a second call costs a few file reads. Production does
// not use this: there the files come from the operator's own PKI (cert-manager, a Vault
// issuer…) with the same SANs; envoy/README.md says how.
//
// Files under dir (0700): ca.crt, ca.key, openssl.cnf, and <name>.crt, <name>.key per Envoy name.
// Keys are mode 0600.
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AsbError } from '../errors.ts';
import { generateCertificate } from '../base/openssl-cert.ts';
import { privateDir } from '../base/private-files.ts';

/** DNS SAN an ingress listener presents; the connecting side checks it (and sends it as SNI). */
export const INGRESS_SAN = 'asb-ingress';
/** DNS SAN a connecting Envoy presents; the ingress listener lets in nothing else. */
export const EDGE_SAN = 'asb-edge';

/** What one Envoy needs for the ingress hop (EdgeConfigOptions.tls). */
export interface FederationTls {
  /** PEM file: the federation CA, the only issuer trusted on either side of the hop. */
  caCertPath: string;
  /** PEM file: this Envoy's certificate (and intermediates, if any), signed by that CA. */
  certChainPath: string;
  /** PEM file: its private key. */
  privateKeyPath: string;
  /** DNS SAN a connecting Envoy must present; default EDGE_SAN. */
  edgeSan?: string;
  /** DNS SAN an ingress must present; default INGRESS_SAN. */
  ingressSan?: string;
}

export interface FederationTlsFiles extends FederationTls {
  caKeyPath: string;
  /** Per Envoy name asked for. The top-level fields are the first name's, so a caller with one name can pass the whole result as EdgeConfigOptions.tls. */
  envoys: Readonly<Record<string, FederationTls>>;
}

export interface FederationTlsOptions {
  /** One certificate per name (DNS-label characters, not "ca"); default ["envoy"]. */
  names?: readonly string[];
  /** Validity of new certificates; default 825 days (the CA gets ten times that). */
  validDays?: number;
  /** For tests: the time that "still valid" is judged against. */
  now?: () => number;
  /** The openssl binary; default `openssl` on PATH. */
  openssl?: string;
}

/** A certificate expiring sooner than this is made again instead of reused. */
const RENEW_BEFORE_MS = 24 * 3600 * 1000;

// `prompt = no` and a [dn] section keep openssl from reading the system openssl.cnf or asking
// anything; -subj sets the real subject.
const CNF_HEAD = `[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder
[ca_ext]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
`;
const OPENSSL_CNF = `${CNF_HEAD}[envoy_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:${INGRESS_SAN}, DNS:${EDGE_SAN}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
`;

/** What the edge's TLS listener serves: a certificate for `*.<domain>` and `<domain>`, and the local CA that signed it. */
export interface EdgeTlsFiles {
  /** PEM file clients trust (NODE_EXTRA_CA_CERTS, SSL_CERT_FILE, curl --cacert). */
  caCertPath: string;
  certChainPath: string;
  privateKeyPath: string;
}

/**
 * A local CA and a serving certificate for the edge's HTTPS listener (E2B's host routing:
 * `https://49983-<id>.<domain>` over HTTP/2). Reused while it still fits (same domain, same CA,
 * not expiring), like the federation files. Production uses a real certificate instead.
 */
export async function ensureEdgeTls(dir: string, domain: string, opts: Pick<FederationTlsOptions, 'now' | 'openssl'> = {}): Promise<EdgeTlsFiles> {
  if (!/^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$/.test(domain) || !domain.includes('.')) {
    throw new AsbError('Invalid', `edge TLS: the domain must be a DNS name with at least two labels, got "${domain}"`);
  }
  const now = opts.now ?? Date.now;
  const openssl = opts.openssl ?? 'openssl';
  privateDir(dir);
  const cnf = writeCnf(dir, edgeOpensslCnf(domain));
  const caCertPath = join(dir, 'ca.crt');
  const caKeyPath = join(dir, 'ca.key');
  const ca = await ensureCa(openssl, cnf, caCertPath, caKeyPath, { subject: '/CN=asb local edge CA', days: 8250, now: now(), what: 'edge TLS' });
  const certChainPath = join(dir, 'edge.crt');
  const privateKeyPath = join(dir, 'edge.key');
  await ensureLeaf(openssl, cnf, { certPath: caCertPath, keyPath: caKeyPath, cert: ca }, certChainPath, privateKeyPath, {
    extensions: 'edge_ext', days: 825, subject: `/CN=${domain}`, now: now(), fits: (leaf) => leaf.checkHost(`x.${domain}`) !== undefined,
  });
  return { caCertPath, certChainPath, privateKeyPath };
}

function edgeOpensslCnf(domain: string): string {
  return `${CNF_HEAD}[edge_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:*.${domain}, DNS:${domain}, DNS:localhost, IP:127.0.0.1, IP:::1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
`;
}

/** Creates what is missing or no longer fits (expiring, another CA's, key mismatch) and returns the paths. */
export async function ensureFederationTls(dir: string, opts: FederationTlsOptions = {}): Promise<FederationTlsFiles> {
  const names = opts.names ?? ['envoy'];
  const first = names[0];
  const bad = names.filter((n) => !/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/.test(n) || n === 'ca');
  if (first === undefined || bad.length > 0 || new Set(names).size !== names.length) {
    throw new AsbError('Invalid', `federation TLS: Envoy names must be distinct DNS labels other than "ca", at least one; got ${JSON.stringify(names)}`);
  }
  const validDays = opts.validDays ?? 825;
  if (!Number.isInteger(validDays) || validDays < 1) throw new AsbError('Invalid', `federation TLS: validDays must be a whole number of days >= 1, got ${validDays}`);
  const now = opts.now ?? Date.now;
  const openssl = opts.openssl ?? 'openssl';

  privateDir(dir);
  const cnf = writeCnf(dir, OPENSSL_CNF);

  const caCertPath = join(dir, 'ca.crt');
  const caKeyPath = join(dir, 'ca.key');
  const ca = await ensureCa(openssl, cnf, caCertPath, caKeyPath, { subject: '/CN=asb federation CA', days: validDays * 10, now: now(), what: 'federation TLS' });

  const envoys: Record<string, FederationTls> = {};
  for (const name of names) {
    const certChainPath = join(dir, `${name}.crt`);
    const privateKeyPath = join(dir, `${name}.key`);
    await ensureLeaf(openssl, cnf, { certPath: caCertPath, keyPath: caKeyPath, cert: ca }, certChainPath, privateKeyPath, {
      extensions: 'envoy_ext', days: validDays, subject: `/CN=${name}`, now: now(), fits: hasBothSans,
    });
    envoys[name] = { caCertPath, certChainPath, privateKeyPath };
  }
  const mine = envoys[first] ?? { caCertPath, certChainPath: '', privateKeyPath: '' };
  return { ...mine, caKeyPath, envoys };
}

/** The CA in these files, made again when missing, not a CA, or expiring. */
async function ensureCa(openssl: string, cnf: string, certPath: string, keyPath: string, o: { subject: string; days: number; now: number; what: string }): Promise<X509Certificate> {
  const ca = loadPair(certPath, keyPath);
  if (ca !== undefined && ca.ca && !expiring(ca, o.now)) return ca;
  await generateCertificate('federation TLS', openssl, certPath, keyPath, ['-config', cnf, '-extensions', 'ca_ext', '-days', String(o.days), '-subj', o.subject]);
  const made = loadPair(certPath, keyPath);
  if (made === undefined) throw new AsbError('Internal', `${o.what}: openssl wrote a CA at ${certPath} that does not load`);
  return made;
}

/** A certificate signed by `ca`, made again when missing, expiring, another CA's, or not what `fits` wants. */
async function ensureLeaf(
  openssl: string, cnf: string, ca: { certPath: string; keyPath: string; cert: X509Certificate }, certPath: string, keyPath: string,
  o: { extensions: string; days: number; subject: string; now: number; fits: (leaf: X509Certificate) => boolean },
): Promise<void> {
  const leaf = loadPair(certPath, keyPath);
  if (leaf !== undefined && !expiring(leaf, o.now) && leaf.verify(ca.cert.publicKey) && o.fits(leaf)) return;
  await generateCertificate('federation TLS', openssl, certPath, keyPath, ['-config', cnf, '-extensions', o.extensions, '-CA', ca.certPath, '-CAkey', ca.keyPath, '-days', String(o.days), '-subj', o.subject]);
}

/** `<dir>/openssl.cnf` with this text, written only when it differs; its path. */
function writeCnf(dir: string, text: string): string {
  const cnf = join(dir, 'openssl.cnf');
  if (!existsSync(cnf) || readFileSync(cnf, 'utf8') !== text) writeFileSync(cnf, text);
  return cnf;
}

/** The certificate, if both files exist, parse, and the key is the certificate's. */
function loadPair(certPath: string, keyPath: string): X509Certificate | undefined {
  if (!existsSync(certPath) || !existsSync(keyPath)) return undefined;
  try {
    const cert = new X509Certificate(readFileSync(certPath));
    return cert.checkPrivateKey(createPrivateKey(readFileSync(keyPath))) ? cert : undefined;
  } catch {
    // Truncated or foreign files are made again, which is what a caller of ensure… wants.
    return undefined;
  }
}

function expiring(cert: X509Certificate, nowMs: number): boolean {
  return Date.parse(cert.validTo) - nowMs < RENEW_BEFORE_MS || Date.parse(cert.validFrom) > nowMs;
}

function hasBothSans(cert: X509Certificate): boolean {
  const sans = (cert.subjectAltName ?? '').split(', ');
  return sans.includes(`DNS:${INGRESS_SAN}`) && sans.includes(`DNS:${EDGE_SAN}`);
}

