// One certificate with a new P-256 key, made with the `openssl` CLI (OpenSSL 3's `req -x509`,
// self-signed or signed with `-CA`): the federation and edge TLS (src/edge/tls.ts) and the egress
// CA (src/egress/egress-ca.ts) both make theirs here. The key is renamed into place first, then
// the certificate, so a reader that finds the certificate finds its key.
import { execFile } from 'node:child_process';
import { chmodSync, renameSync, rmSync } from 'node:fs';
import { AsbError } from '../errors.ts';

/** `what` names the caller in errors ("federation TLS", "egress CA"). */
export async function generateCertificate(what: string, openssl: string, certPath: string, keyPath: string, args: readonly string[]): Promise<void> {
  const tmpCert = `${certPath}.${process.pid}.tmp`;
  const tmpKey = `${keyPath}.${process.pid}.tmp`;
  try {
    await runOpenssl(what, openssl, ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', tmpKey, '-out', tmpCert, ...args]);
    chmodSync(tmpKey, 0o600);
    renameSync(tmpKey, keyPath);
    renameSync(tmpCert, certPath);
  } finally {
    rmSync(tmpCert, { force: true });
    rmSync(tmpKey, { force: true });
  }
}

export function runOpenssl(what: string, command: string, args: readonly string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(command, args, { timeout: 30_000 }, (err, _stdout, stderr) => {
      if (err === null) {
        resolve();
        return;
      }
      const missing = (err as NodeJS.ErrnoException).code === 'ENOENT';
      reject(
        missing
          ? new AsbError('Unavailable', `${what}: the "${command}" command was not found; install the openssl package (make deps does)`, { cause: err })
          : new AsbError('Internal', `${what}: ${command} ${args.slice(0, 2).join(' ')} failed: ${stderr.trim() || err.message}`, { cause: err }),
      );
    });
  });
}
