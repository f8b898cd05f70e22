// The per-cluster egress CA: the egress proxy terminates TLS for credential-injection hosts (and
// only those) with a certificate this CA signs, and sandboxes trust the CA (its certificate is
// added to the image's trust store when a sandbox starts). The CA key stays with the worker;
// sandboxes get the certificate alone, so one cannot mint certificates for other hosts.
//
// Made with the `openssl` CLI (OpenSSL 3's `req -x509 -CA`), like src/edge/tls.ts; ~10 ms per
// certificate. Files under dir (0700): ca.crt, ca.key, and hosts/<host>.crt/.key (a wildcard
// host `*.example.com` is stored as `_wildcard.example.com`). Keys are 0600.
import { X509Certificate } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { AsbError } from '../errors.ts';
import { generateCertificate } from '../base/openssl-cert.ts';
import { privateDir } from '../base/private-files.ts';

export interface EgressCa {
  caCertPath: string;
  caKeyPath: string;
  dir: string;
}

export interface HostCertificate {
  host: string;
  certChainPath: string;
  privateKeyPath: string;
}

/** A CA expiring within 30 days is made again (and every host certificate with it). */
const RENEW_BEFORE_MS = 30 * 24 * 3600 * 1000;


function usable(certPath: string, keyPath: string, now: number): X509Certificate | undefined {
  if (!existsSync(certPath) || !existsSync(keyPath)) return undefined;
  try {
    const cert = new X509Certificate(readFileSync(certPath));
    return Date.parse(cert.validTo) - now < RENEW_BEFORE_MS ? undefined : cert;
  } catch {
    return undefined;
  }
}


/** The CA in dir, made if missing or expiring. `name` goes into its subject. */
export async function ensureEgressCa(dir: string, name = 'asb egress CA', now: number = Date.now()): Promise<EgressCa> {
  privateDir(dir);
  const caCertPath = join(dir, 'ca.crt');
  const caKeyPath = join(dir, 'ca.key');
  if (usable(caCertPath, caKeyPath, now) === undefined) {
    await generateCertificate('egress CA', 'openssl', caCertPath, caKeyPath, ['-days', '3650', '-subj', `/CN=${name}`, '-addext', 'basicConstraints=critical,CA:TRUE,pathlen:0', '-addext', 'keyUsage=critical,keyCertSign,cRLSign']);
    rmSync(join(dir, 'hosts'), { recursive: true, force: true });
  }
  return { caCertPath, caKeyPath, dir };
}

function fileStem(host: string): string {
  return host.startsWith('*.') ? `_wildcard${host.slice(1)}` : host;
}

/** A serving certificate for `host` (a name or `*.name`), signed by the CA; reused while valid. */
export async function ensureHostCertificate(ca: EgressCa, host: string, now: number = Date.now()): Promise<HostCertificate> {
  if (!/^(\*\.)?[a-z0-9_]([a-z0-9_.-]{0,251}[a-z0-9])?$/.test(host)) throw new AsbError('Invalid', `egress CA: not a host name: "${host}"`);
  const dir = join(ca.dir, 'hosts');
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const certChainPath = join(dir, `${fileStem(host)}.crt`);
  const privateKeyPath = join(dir, `${fileStem(host)}.key`);
  const cert = usable(certChainPath, privateKeyPath, now);
  if (cert === undefined || !cert.checkIssued(new X509Certificate(readFileSync(ca.caCertPath)))) {
    await generateCertificate('egress CA', 'openssl', certChainPath, privateKeyPath, [
      '-CA', ca.caCertPath, '-CAkey', ca.caKeyPath, '-days', '397', '-subj', `/CN=${host}`,
      '-addext', 'basicConstraints=critical,CA:FALSE', '-addext', 'keyUsage=critical,digitalSignature', '-addext', 'extendedKeyUsage=serverAuth',
      '-addext', `subjectAltName=DNS:${host}`,
    ]);
  }
  return { host, certChainPath, privateKeyPath };
}
