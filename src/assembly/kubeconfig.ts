// .asb/kubeconfig, which `make up` writes: one context per cluster, each pointing at that
// cluster's TLS edge (kubectl sends a bearer token only over TLS) with the edge's local CA, and
// the admin key as the token. `kubectl --kubeconfig .asb/kubeconfig get sandboxes` (or
// `export KUBECONFIG=$ASB_KUBECONFIG`) then talks to the worker's Kubernetes API (src/kubeapi/).
import { renameSync, writeFileSync } from 'node:fs';
import { stringify } from 'yaml';

export interface KubeCluster {
  name: string;
  /** The cluster's TLS edge, e.g. https://127.0.0.1:10002. */
  server: string;
}

/** The kubeconfig text; the first cluster's context is the current one. */
export function kubeconfigText(clusters: readonly KubeCluster[], caPath: string, token: string): string {
  const user = 'asb-admin';
  return stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: clusters.map((c) => ({ name: c.name, cluster: { server: c.server, 'certificate-authority': caPath } })),
    users: [{ name: user, user: { token } }],
    contexts: clusters.map((c) => ({ name: c.name, context: { cluster: c.name, user, namespace: 'default' } })),
    'current-context': clusters[0]?.name ?? '',
  });
}

/** Writes it atomically, readable by the owner only (it holds the admin key). */
export function writeKubeconfig(path: string, clusters: readonly KubeCluster[], caPath: string, token: string): void {
  writeFileSync(`${path}.tmp`, kubeconfigText(clusters, caPath, token), { mode: 0o600 });
  renameSync(`${path}.tmp`, path);
}
