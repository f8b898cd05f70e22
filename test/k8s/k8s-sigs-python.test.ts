// kubernetes-sigs' own Python SDK (`k8s-agent-sandbox` 1.0.8 from PyPI, unmodified) on the
// Kubernetes tier: the SDK makes its claims through a real kube-apiserver (etcd, our CRDs, the
// real node of test/support/kube-node.ts: kubelet, containerd, runc) with that apiserver's kubeconfig, as a user of a cluster would;
// our worker runs there with --store=kube --runtime=kube (its controllers bind the claims to
// Pods), and the SDK's data plane (Direct mode: the python-runtime API by X-Sandbox-ID, the API
// key in extra_headers) goes through our router and Envoy to that worker, which execs in the Pod
// through pods/exec. The scenarios are the embedded tier's (test/k8s-sigs-python.test.ts), run
// by test/support/k8s-sigs-sdk.ts.
//
// The suite's 1 MiB streamed `files.write` goes into a runc Pod here: it once lost data there and
// reported success (the staging command closed its stdout and containerd then ended its stdin;
// src/runtime/file-upload.ts, test/k8s/streamed-write.test.ts).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { silentLogger } from '../../src/base/log.ts';
import { startLocalSystem } from '../../src/assembly/local-system.ts';
import { runSdkSuite } from '../support/k8s-sigs-sdk.ts';
import { startKubeApiServer } from '../support/kube-apiserver.ts';
import { installCrds } from '../support/kube-store.ts';
import { startKubeNode } from '../support/kube-node.ts';
import { waitFor } from '../support/wait.ts';
import { removeDataDir, tempDataDir } from '../support/worker-process.ts';

const POOL = 'python';
/** Two claims in the suite (its module sandbox and test_terminate's), both warm. */
const REPLICAS = 2;

// The template names no HOME and no SANDBOX_BASE_DIR: the python-runtime's base directory is the
// pod user's home, inside the Pod. No RuntimeClass: runc. The image is agent-sandbox/base, not
// busybox: the listing (src/worker/envd/entries.ts) needs GNU find's -printf, which busybox's
// find lacks (the test kubelet ran execs on the host, with the host's find).
const POOL_YAML = `apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: ${POOL}, namespace: default}
spec:
  podTemplate:
    spec:
      containers: [{name: main, image: agent-sandbox/base}]
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: ${POOL}, namespace: default}
spec: {replicas: ${REPLICAS}, sandboxTemplateRef: {name: ${POOL}}}
`;

test('k8s-agent-sandbox 1.0.8 in Direct mode against a real kube-apiserver: create from a warm pool, commands.run (output, exit code, timeout), files write/read/list/exists, terminate, the missing-pool error', async (t) => {
  const kube = await startKubeApiServer({ etcdUnsafeNoFsync: true });
  const stateDir = tempDataDir('k8sp');
  const home = mkdtempSync(join(tmpdir(), 'asb-k8sp-home-'));
  const stops: (() => Promise<void>)[] = [];
  // In this order: the worker finishes its Pods' finalizers while the apiserver and kubelet still run.
  t.after(async () => {
    for (const stop of stops.reverse()) await stop();
    removeDataDir(stateDir);
    rmSync(home, { recursive: true, force: true });
  });
  stops.push(() => kube.stop());
  const node = await startKubeNode(kube);
  stops.push(() => node.stop());
  await installCrds(kube.kubeconfigPath);

  const system = await startLocalSystem({
    stateDir,
    log: silentLogger(),
    apiPort: 0,
    edgePort: 0,
    envoyAdminPort: 0,
    routerPort: 0,
    domain: 'asb.localhost',
    clusterName: 'k8s',
    workerArgs: ['--cluster-tag', 'k8sp', '--store=kube', '--runtime=kube', '--kubeconfig', kube.kubeconfigPath, '--namespace', 'default', '--base-pool', '0', '--log-level', 'warn'],
  });
  stops.push(() => system.stop());

  // The pool as a cluster user makes it: kubectl against the apiserver.
  assert.match(await kube.kubectl(['apply', '-f', '-'], POOL_YAML), /sandboxwarmpool\.extensions\.agents\.x-k8s\.io\/python created/);
  await waitFor('the pool ready', async () => ((await kube.kubectl(['get', 'swp', POOL, '-o', 'jsonpath={.status.readyReplicas}'])) === String(REPLICAS) ? true : undefined), 60_000, 200);

  await runSdkSuite({ kubeconfig: kube.kubeconfigPath, apiKey: system.adminKey, edgeUrl: system.edgeUrl, pool: POOL, home });
});
