// Runs the real kubectl (`make kube-tools` builds it into .tools/kube/bin) against a server of
// ours: a kubeconfig with the server URL and an API key as the bearer token, in a temp HOME with
// its own discovery cache, so runs never share state. kubectl sends no bearer token over plain
// HTTP, so the server is HTTPS: serveTls() puts the worker's handler behind a local CA.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensureEdgeTls } from '../../src/edge/tls.ts';
import { KUBE_BIN_DIR, KubectlError } from './kube-apiserver.ts';

export const KUBECTL = join(KUBE_BIN_DIR, 'kubectl');

export interface Kubectl {
  readonly kubeconfigPath: string;
  /** Resolves with stdout; rejects with KubectlError (exit code, stdout, stderr) on a non-zero exit. */
  run(args: readonly string[], opts?: { stdin?: string; key?: string; timeoutMs?: number }): Promise<string>;
  /** Starts kubectl and hands back the process, for `get -w`: the caller reads stdout and kills it. */
  start(args: readonly string[]): import('node:child_process').ChildProcessWithoutNullStreams;
}

/** kubectl sends a bearer token only over TLS: `server` is https, `caPath` the CA that signed it. */
export function kubeconfigYaml(server: string, caPath: string, token: string, namespace = 'default'): string {
  return [
    'apiVersion: v1', 'kind: Config',
    `clusters: [{name: asb, cluster: {server: ${JSON.stringify(server)}, certificate-authority: ${JSON.stringify(caPath)}}}]`,
    `users: [{name: asb, user: {token: ${JSON.stringify(token)}}}]`,
    `contexts: [{name: asb, context: {cluster: asb, user: asb, namespace: ${namespace}}}]`,
    'current-context: asb', '',
  ].join('\n');
}

export function kubectlFor(server: string, caPath: string, token: string, after: (fn: () => void) => void): Kubectl {
  const dir = mkdtempSync(join(tmpdir(), 'asb-kubectl-'));
  after(() => rmSync(dir, { recursive: true, force: true }));
  const kubeconfigPath = join(dir, 'kubeconfig');
  writeFileSync(kubeconfigPath, kubeconfigYaml(server, caPath, token), { mode: 0o600 });
  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: dir, KUBECONFIG: kubeconfigPath, KUBECACHEDIR: join(dir, 'cache') };
  const start = (args: readonly string[]): import('node:child_process').ChildProcessWithoutNullStreams => spawn(KUBECTL, [...args], { env });
  return {
    kubeconfigPath,
    start,
    run(args, opts = {}) {
      const full = opts.key === undefined ? [...args] : [...args, `--token=${opts.key}`];
      return new Promise((resolve, reject) => {
        const child = start(full);
        let stdout = '';
        let stderr = '';
        child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
        child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
        const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 60_000);
        child.on('close', (code) => {
          clearTimeout(timer);
          if (code === 0) resolve(stdout);
          else reject(new KubectlError(args, code, stdout, stderr));
        });
        child.stdin.end(opts.stdin ?? '');
      });
    },
  };
}

/** The worker's request handler on HTTPS (port 0) with a fresh local CA (src/edge/tls.ts), as `make up`'s TLS edge serves it. */
export async function serveTls(handler: (req: IncomingMessage, res: ServerResponse) => void, after: (fn: () => Promise<void>) => void): Promise<{ url: string; caPath: string }> {
  const dir = mkdtempSync(join(tmpdir(), 'asb-kubetls-'));
  const tls = await ensureEdgeTls(dir, 'asb.localhost');
  const server = createServer({ cert: readFileSync(tls.certChainPath), key: readFileSync(tls.privateKeyPath) }, handler);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  after(async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    rmSync(dir, { recursive: true, force: true });
  });
  return { url: `https://127.0.0.1:${(server.address() as AddressInfo).port}`, caPath: tls.caCertPath };
}
