// The cluster manifests on a real kube-apiserver: a worker cluster's build (clusters/base, and a
// region with the federation component) applies as kubectl sends it, with the server validating
// every Deployment, Service and RBAC object; clusters/secrets.sh's output applies; and the RBAC
// grants what each component needs and nothing else, as `kubectl auth can-i` answers for its
// ServiceAccount. No kubelet or controller-manager runs here, so no pod starts: what runs in the
// pods is tested by test/manifests.test.ts (our parsers and Envoy on what each container sees).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { after, before, test } from 'node:test';
import { resolve } from 'node:path';
import { KubectlError, startKubeApiServer, type KubeApiServer } from '../support/kube-apiserver.ts';

const repoRoot = resolve(import.meta.dirname, '../..');
const NAMESPACE = 'agent-sandbox-system';
let kube: KubeApiServer;

before(async () => {
  kube = await startKubeApiServer({ etcdUnsafeNoFsync: true });
  await kube.kubectl(['apply', '-k', `${repoRoot}/clusters/base/crds`]);
  await kube.kubectl(['wait', '--for=condition=established', '--timeout=60s', 'crd', '--all']);
});

after(async () => {
  await kube.stop();
});

test('a worker cluster applies with kubectl apply -k, and a federated region passes the server\'s dry run', async () => {
  const out = await kube.kubectl(['apply', '-k', `${repoRoot}/clusters/base`]);
  for (const made of ['namespace/agent-sandbox-system', 'deployment.apps/operator', 'deployment.apps/worker-api', 'deployment.apps/ingress', 'service/edge', 'clusterrole.rbac.authorization.k8s.io/agent-sandbox-operator', 'networkpolicy.networking.k8s.io/sandbox-isolation']) {
    assert.ok(out.includes(made), `${made} in ${out}`);
  }
  const deployments = await kube.kubectl(['get', 'deployments', '-n', NAMESPACE, '-o', 'jsonpath={.items[*].metadata.name}']);
  assert.deepEqual(deployments.split(' ').sort(), ['ingress', 'operator', 'worker-api']);
  const region = await kube.kubectl(['apply', '-k', `${repoRoot}/clusters/overlays/region-a`, '--dry-run=server']);
  assert.match(region, /service\/federation-ingress created \(server dry run\)/);
});

test('clusters/secrets.sh\'s Secrets and admin ApiKey apply', async () => {
  const secrets = await new Promise<string>((resolvePromise, reject) => {
    execFile('bash', [`${repoRoot}/clusters/secrets.sh`], (err, stdout) => {
      if (err === null) resolvePromise(stdout);
      else reject(new Error(`clusters/secrets.sh failed: ${err.message}`));
    });
  });
  await kube.kubectl(['create', 'namespace', NAMESPACE]).catch((err: unknown) => {
    if (!(err instanceof KubectlError && /AlreadyExists/.test(err.stderr))) throw err;
  });
  const out = await kube.kubectl(['apply', '-f', '-'], secrets);
  assert.match(out, /secret\/asb-cluster-secret created/);
  assert.match(out, /secret\/asb-admin-key created/);
  assert.match(out, /apikey\.asb\.dev\/[a-z0-9]{8} created/);
});

test('RBAC grants each component what it needs and nothing more', async () => {
  await kube.kubectl(['apply', '-k', `${repoRoot}/clusters/base/rbac`, '-n', NAMESPACE]).catch(async (err: unknown) => {
    // The namespace comes with the base build; this test may run alone.
    if (!(err instanceof KubectlError && /not found/.test(err.stderr))) throw err;
    await kube.kubectl(['create', 'namespace', NAMESPACE]);
    await kube.kubectl(['apply', '-k', `${repoRoot}/clusters/base/rbac`, '-n', NAMESPACE]);
  });
  const can = async (account: string, verb: string, resource: string, namespace = 'default'): Promise<boolean> => {
    // can-i reads pods/exec as the pod named exec: a subresource goes in its own flag.
    const [type = '', subresource] = resource.split('/');
    const args = ['auth', 'can-i', verb, type, ...(subresource === undefined ? [] : [`--subresource=${subresource}`]), '-n', namespace, `--as=system:serviceaccount:${NAMESPACE}:${account}`];
    try {
      return (await kube.kubectl(args)).trim() === 'yes';
    } catch (err) {
      // can-i exits 1 for "no".
      if (err instanceof KubectlError && err.stdout.trim() === 'no') return false;
      throw err;
    }
  };
  const expect: [string, string, string, boolean, string?][] = [
    // The operator runs sandboxes: Pods, PVCs, Services in any namespace, status and finalizers.
    ['operator', 'create', 'pods', true],
    ['operator', 'delete', 'persistentvolumeclaims', true],
    ['operator', 'create', 'services', true],
    ['operator', 'update', 'sandboxes.agents.x-k8s.io/status', true],
    ['operator', 'update', 'sandboxwarmpools.extensions.agents.x-k8s.io/finalizers', true],
    ['operator', 'create', 'events', true],
    // Lifecycle Events are aggregated in place and the oldest dropped past the bound.
    ['operator', 'update', 'events', true],
    ['operator', 'delete', 'events', true],
    ['operator', 'update', 'leases.coordination.k8s.io', true, NAMESPACE],
    ['operator', 'update', 'leases.coordination.k8s.io', false],
    ['operator', 'create', 'pods/exec', false],
    ['operator', 'get', 'secrets', false],
    // Each sandbox's egress policy is a NetworkPolicy the runtime writes.
    ['operator', 'create', 'networkpolicies.networking.k8s.io', true],
    ['operator', 'delete', 'networkpolicies.networking.k8s.io', true],
    ['worker-api', 'update', 'networkpolicies.networking.k8s.io', true],
    ['worker-api', 'delete', 'networkpolicies.networking.k8s.io', false],
    ['ingress', 'get', 'networkpolicies.networking.k8s.io', false],
    // The worker API claims with one update, enters pods through exec, and creates no pods.
    ['worker-api', 'update', 'sandboxes.agents.x-k8s.io', true],
    ['worker-api', 'create', 'sandboxclaims.extensions.agents.x-k8s.io', true],
    ['worker-api', 'list', 'apikeys.asb.dev', true],
    ['worker-api', 'create', 'pods/exec', true],
    ['worker-api', 'get', 'pods', true],
    ['worker-api', 'create', 'pods', false],
    ['worker-api', 'update', 'sandboxes.agents.x-k8s.io/status', false],
    ['worker-api', 'get', 'secrets', false],
    // The router is fed by the worker API: no access at all.
    ['ingress', 'get', 'pods', false],
    ['ingress', 'list', 'sandboxes.agents.x-k8s.io', false],
    ['ingress', 'get', 'apikeys.asb.dev', false],
  ];
  const wrong: string[] = [];
  for (const [account, verb, resource, want, namespace] of expect) {
    if ((await can(account, verb, resource, namespace)) !== want) wrong.push(`${account} ${want ? 'cannot' : 'can'} ${verb} ${resource}${namespace === undefined ? '' : ` in ${namespace}`}`);
  }
  assert.deepEqual(wrong, []);
});
