// Writes the cluster ingress's Envoy configuration for each worker cluster under clusters/: the
// production template envoy/edge.yaml filled by src/edge/envoy-config.ts (what `make up` runs)
// with in-pod values and the cluster's own cluster.env (its name, and its hub when it has one).
// Run `node scripts/gen-envoy-configs.ts` after changing envoy/edge.yaml or a cluster.env;
// test/manifests.test.ts fails while a committed file differs from what this writes.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { edgeConfigYaml, type EdgeConfigOptions } from '../src/edge/envoy-config.ts';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');

/** Ports of the ingress pod (clusters/base/ingress/deployment.yaml and the federation component). */
export const INGRESS_POD = Object.freeze({
  edgePort: 10000,
  /** Other clusters' Envoys forward here, over mutual TLS. */
  federationPort: 10443,
  adminPort: 9901,
  /** The router container, on the pod's loopback. */
  routerAddress: '127.0.0.1:9002',
  /** The worker API Service (clusters/base/worker/worker-api.yaml), found through the pod's DNS search path. */
  workerApiAddress: 'worker-api:7080',
  /** Where the federation Secret (ca.crt, tls.crt, tls.key: cert-manager's layout) is mounted. */
  federationTlsDir: '/etc/asb/federation',
});

export interface EnvoyTarget {
  /** env files merged in order, as kustomize's configMapGenerator merges them. */
  envFiles: string[];
  /** The file to write, relative to the repository root. */
  out: string;
}

export const ENVOY_TARGETS: readonly EnvoyTarget[] = [
  { envFiles: ['clusters/base/cluster.env'], out: 'clusters/base/ingress/envoy.yaml' },
  { envFiles: ['clusters/base/cluster.env', 'clusters/overlays/region-a/cluster.env'], out: 'clusters/overlays/region-a/envoy.yaml' },
  { envFiles: ['clusters/base/cluster.env', 'clusters/overlays/region-b/cluster.env'], out: 'clusters/overlays/region-b/envoy.yaml' },
];

/** KEY=VALUE lines, `#` comments and blank lines skipped: kustomize's env file format. */
export function parseEnvFile(text: string, source: string): Map<string, string> {
  const values = new Map<string, string>();
  text.split('\n').forEach((line, i) => {
    const trimmed = line.trim();
    if (trimmed === '' || trimmed.startsWith('#')) return;
    const eq = trimmed.indexOf('=');
    if (eq <= 0) throw new Error(`${source}:${i + 1}: expected KEY=VALUE, got ${JSON.stringify(line)}`);
    values.set(trimmed.slice(0, eq), trimmed.slice(eq + 1));
  });
  return values;
}

export function readEnvFiles(paths: readonly string[]): Map<string, string> {
  const merged = new Map<string, string>();
  for (const path of paths) for (const [k, v] of parseEnvFile(readFileSync(join(repoRoot, path), 'utf8'), path)) merged.set(k, v);
  return merged;
}

/** The Envoy configuration for a cluster with these settings (ASB_* as in cluster.env): what a user's overlay with its own cluster.env carries. */
export function clusterEnvoyYaml(env: ReadonlyMap<string, string>): string {
  const cluster = env.get('ASB_CLUSTER_NAME');
  if (cluster === undefined) throw new Error('ASB_CLUSTER_NAME is not set');
  const hubUrl = env.get('ASB_HUB_URL');
  const opts: EdgeConfigOptions = {
    nodeId: `asb-edge-${cluster}`,
    listenAddress: '0.0.0.0',
    listenPort: INGRESS_POD.edgePort,
    // Loopback only: the admin API can stop Envoy.
    adminAddress: '127.0.0.1',
    adminPort: INGRESS_POD.adminPort,
    routerAddress: INGRESS_POD.routerAddress,
    workers: [{ cluster, apiAddress: INGRESS_POD.workerApiAddress }],
    accessLogPath: '/dev/stdout',
  };
  if (hubUrl === undefined) return edgeConfigYaml(opts);
  // envoy-config.ts checks the certificate files exist, as `make up` needs; here they are only
  // paths inside the pod. Stand-ins in a temporary directory pass the check, then the paths
  // are rewritten to the mounted Secret's.
  const stand = mkdtempSync(join(tmpdir(), 'asb-envoy-gen-'));
  try {
    for (const file of ['ca.crt', 'tls.crt', 'tls.key']) writeFileSync(join(stand, file), '');
    const url = new URL(hubUrl);
    const yaml = edgeConfigYaml({
      ...opts,
      ingress: { listenPort: INGRESS_POD.federationPort, listenAddress: '0.0.0.0' },
      tls: { caCertPath: join(stand, 'ca.crt'), certChainPath: join(stand, 'tls.crt'), privateKeyPath: join(stand, 'tls.key') },
      hubAddress: `${url.hostname}:${url.port === '' ? (url.protocol === 'https:' ? '443' : '80') : url.port}`,
    });
    return yaml.replaceAll(stand, INGRESS_POD.federationTlsDir);
  } finally {
    rmSync(stand, { recursive: true, force: true });
  }
}

/** Output path → content, for every target. */
export function renderEnvoyFiles(): Map<string, string> {
  const files = new Map<string, string>();
  for (const target of ENVOY_TARGETS) {
    const header = `# Generated by \`node scripts/gen-envoy-configs.ts\` from envoy/edge.yaml and ${target.envFiles.join(' + ')}; edit those, not this file.\n`;
    files.set(target.out, header + clusterEnvoyYaml(readEnvFiles(target.envFiles)));
  }
  return files;
}

function main(): void {
  const files = renderEnvoyFiles();
  for (const [path, text] of files) writeFileSync(join(repoRoot, path), text);
  console.log(`wrote ${[...files.keys()].join(', ')}`);
}

if (import.meta.main) main();
