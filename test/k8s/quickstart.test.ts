// The seeds' quick start, step by step as a user runs it, on the real node
// (test/support/kube-node.ts: the kubelet on containerd and runc): install as our README's "Running
// on Kubernetes" says (the CRDs of clusters/base/crds, then the worker outside a Pod with
// --store=kube --runtime=kube --kubeconfig), then the kubernetes-sigs README's steps with the
// kubectl binary: `kubectl apply` of its Getting Started Sandbox and of the SandboxTemplate,
// SandboxWarmPool and SandboxClaim of extensions/examples it points to, `kubectl wait` for Ready,
// and `kubectl exec` into each Pod. The YAML is test/fixtures/quickstart, the files as the seeds'
// README had them (2026-04-26); only the image the README leaves to the reader is filled in.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { KubectlError, startKubeApiServer, type KubeApiServer } from '../support/kube-apiserver.ts';
import { startKubeNode, type KubeNode } from '../support/kube-node.ts';
import { removeDataDir, startWorkerProcess, type WorkerProcess } from '../support/worker-process.ts';

const root = new URL('../../', import.meta.url);
const fixture = (name: string): string => new URL(`test/fixtures/quickstart/${name}.yaml`, root).pathname;
/** A cold Pod on a loaded 2-core machine (a first pull of the image included) takes well under this. */
const READY_TIMEOUT_S = 240;
/** Each `kubectl wait` fits inside the fixture's 60 s kubectl timeout. */
const WAIT_STEP_S = 50;

let kube: KubeApiServer | undefined;
let node: KubeNode | undefined;
let worker: WorkerProcess | undefined;

before(async () => {
  kube = await startKubeApiServer({ etcdUnsafeNoFsync: true });
  node = await startKubeNode(kube);
  await kube.kubectl(['apply', '-k', new URL('clusters/base/crds', root).pathname]);
  await kube.kubectl(['wait', '--for=condition=established', 'crd', '--all', `--timeout=${String(WAIT_STEP_S)}s`]);
  // No built-in pool (--base-pool 0): the quick start's objects are all the node runs.
  worker = await startWorkerProcess({
    clusterTag: 'k5qs',
    // Unused with --runtime=kube: the node's CNI gives the pod IPs.
    subnetOctet: 209,
    basePool: 0,
    extraArgs: ['--store=kube', '--runtime=kube', '--kubeconfig', kube.kubeconfigPath],
  });
});

after(async () => {
  if (worker !== undefined) {
    await worker.stop();
    removeDataDir(worker.dataDir);
  }
  await node?.stop();
  await kube?.stop();
});

function kubectl(args: readonly string[], stdin?: string): Promise<string> {
  assert.ok(kube !== undefined);
  return kube.kubectl(args, stdin);
}

/** `kubectl wait ...` as the README has it, repeated in steps up to READY_TIMEOUT_S. */
async function kubectlWait(args: readonly string[]): Promise<void> {
  for (let waited = 0; ; waited += WAIT_STEP_S) {
    try {
      await kubectl(['wait', ...args, `--timeout=${String(WAIT_STEP_S)}s`]);
      return;
    } catch (err) {
      if (!(err instanceof KubectlError) || waited + WAIT_STEP_S >= READY_TIMEOUT_S) throw err;
    }
  }
}

test('the README\'s Getting Started Sandbox: kubectl apply, wait for Ready, and kubectl exec runs in its Pod on the node, at the Sandbox\'s stable hostname', async () => {
  assert.equal(await kubectl(['apply', '-f', fixture('sandbox')]), 'sandbox.agents.x-k8s.io/my-sandbox created\n');
  await kubectlWait(['--for=condition=Ready', 'sandbox/my-sandbox']);

  assert.equal(await kubectl(['get', 'pod', 'my-sandbox', '-o', 'jsonpath={.spec.nodeName}']), node?.nodeName);
  const out = await kubectl(['exec', 'my-sandbox', '--', 'sh', '-c', 'echo "$(hostname) $(id -u) $(cat /proc/1/cmdline | tr "\\0" " ")"']);
  // The image's own command (sleep infinity, as uid 1000) runs as the Pod's first process.
  assert.equal(out, 'my-sandbox 1000 sleep infinity \n');
  // `kubectl exec -i`: stdin reaches the shell through the kubelet, and its exit status comes back.
  const status = await kubectl(['exec', '-i', 'my-sandbox', '--', 'sh'], 'echo $((6 * 7))\nexit 3\n').then(
    () => assert.fail('exit 3 came back as success'),
    (err: unknown) => (err instanceof KubectlError ? err : assert.fail(String(err))),
  );
  assert.deepEqual([status.exitCode, status.stdout], [3, '42\n']);

  // The quick start's cleanup: deleting the Sandbox deletes its Pod.
  await kubectl(['delete', '-f', fixture('sandbox'), '--wait=false']);
  await kubectlWait(['--for=delete', 'pod/my-sandbox']);
});

test('the extensions\' examples: a SandboxTemplate and its SandboxWarmPool, then the SandboxClaim binds the warm member, and kubectl exec reaches its Pod', async () => {
  const applied = await kubectl(['apply', '-f', fixture('sandboxtemplate'), '-f', fixture('sandboxwarmpool')]);
  assert.equal(applied, 'sandboxtemplate.extensions.agents.x-k8s.io/secure-datascience-template created\nsandboxwarmpool.extensions.agents.x-k8s.io/sandboxwarmpool-example created\n');
  await kubectlWait(['--for=jsonpath={.status.readyReplicas}=1', 'swp/sandboxwarmpool-example']);
  // The pool's member, running before there is a claim.
  const warm = JSON.parse(await kubectl(['get', 'pods', '-o', 'json'])) as { items: { metadata: { name: string; uid: string } }[] };
  const warmPods = new Map(warm.items.map((p) => [p.metadata.name, p.metadata.uid]));

  assert.equal(await kubectl(['apply', '-f', fixture('sandboxclaim')]), 'sandboxclaim.extensions.agents.x-k8s.io/my-secure-sandbox created\n');
  await kubectlWait(['--for=condition=Ready', 'sandboxclaim/my-secure-sandbox']);
  const name = await kubectl(['get', 'sandboxclaim', 'my-secure-sandbox', '-o', 'jsonpath={.status.sandbox.name}']);
  assert.ok(warmPods.has(name), `the claim bound ${name}, not one of the pool's members ${JSON.stringify([...warmPods.keys()])}`);
  assert.equal(await kubectl(['get', 'pod', name, '-o', 'jsonpath={.metadata.uid}']), warmPods.get(name), 'the warm member\'s Pod itself, not a new one');

  // Into the claimed Pod: the template's securityContext (uid 1000, gid 3000) holds there.
  const out = await kubectl(['exec', name, '--', 'sh', '-c', 'echo "$(id -u):$(id -g) $(hostname)"']);
  assert.equal(out, `1000:3000 ${name}\n`);

  // Deleting the claim deletes the sandbox it bound, and its Pod.
  await kubectl(['delete', '-f', fixture('sandboxclaim'), '--wait=false']);
  await kubectlWait(['--for=delete', `pod/${name}`]);
});
