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
import { execFile } from 'node:child_process';
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AsbError } from '../errors.ts';

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
const OPENSSL_CNF = `[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder
[ca_ext]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[envoy_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:${INGRESS_SAN}, DNS:${EDGE_SAN}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
`;

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

  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const cnf = join(dir, 'openssl.cnf');
  if (!existsSync(cnf) || readFileSync(cnf, 'utf8') !== OPENSSL_CNF) writeFileSync(cnf, OPENSSL_CNF);

  const caCertPath = join(dir, 'ca.crt');
  const caKeyPath = join(dir, 'ca.key');
  let ca = loadPair(caCertPath, caKeyPath);
  if (ca === undefined || !ca.ca || expiring(ca, now())) {
    await generate(openssl, caCertPath, caKeyPath, ['-config', cnf, '-extensions', 'ca_ext', '-days', String(validDays * 10), '-subj', '/CN=asb federation CA']);
    ca = loadPair(caCertPath, caKeyPath);
    if (ca === undefined) throw new AsbError('Internal', `federation TLS: openssl wrote a CA in ${dir} that does not load`);
  }

  const envoys: Record<string, FederationTls> = {};
  for (const name of names) {
    const certChainPath = join(dir, `${name}.crt`);
    const privateKeyPath = join(dir, `${name}.key`);
    const leaf = loadPair(certChainPath, privateKeyPath);
    const fits = leaf !== undefined && !expiring(leaf, now()) && leaf.verify(ca.publicKey) && hasBothSans(leaf);
    if (!fits) {
      await generate(openssl, certChainPath, privateKeyPath, [
        '-config', cnf, '-extensions', 'envoy_ext', '-CA', caCertPath, '-CAkey', caKeyPath, '-days', String(validDays), '-subj', `/CN=${name}`,
      ]);
    }
    envoys[name] = { caCertPath, certChainPath, privateKeyPath };
  }
  const mine = envoys[first] ?? { caCertPath, certChainPath: '', privateKeyPath: '' };
  return { ...mine, caKeyPath, envoys };
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

/** One self-signed or CA-signed certificate with a new P-256 key; the key is renamed into place first, then the certificate. */
async function generate(openssl: string, certPath: string, keyPath: string, args: string[]): Promise<void> {
  const tmpCert = `${certPath}.${process.pid}.tmp`;
  const tmpKey = `${keyPath}.${process.pid}.tmp`;
  try {
    await run(openssl, ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', tmpKey, '-out', tmpCert, ...args]);
    chmodSync(tmpKey, 0o600);
    renameSync(tmpKey, keyPath);
    renameSync(tmpCert, certPath);
  } finally {
    rmSync(tmpCert, { force: true });
    rmSync(tmpKey, { force: true });
  }
}

function run(command: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(command, args, { timeout: 30_000 }, (err, _stdout, stderr) => {
      if (err === null) {
        resolve();
        return;
      }
      const missing = (err as NodeJS.ErrnoException).code === 'ENOENT';
      reject(
        missing
          ? new AsbError('Unavailable', `federation TLS: the "${command}" command was not found; install the openssl package (make deps does)`, { cause: err })
          : new AsbError('Internal', `federation TLS: ${command} ${args.slice(0, 2).join(' ')} failed: ${stderr.trim() || err.message}`, { cause: err }),
      );
    });
  });
}
