// Our CRDs on a real kube-apiserver, driven with kubectl as a user would: clusters/base/crds
// applies with `kubectl apply -k`, the seeds' YAML applies unchanged and reads back as written,
// `kubectl scale` works on warm pools and sandboxes, `kubectl get` prints our columns, a status
// with every field the controllers write is kept whole, and invalid objects are refused with the
// field named.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, test } from 'node:test';
import { parseAllDocuments } from 'yaml';
import { builtinObjects } from '../../src/api/builtin.ts';
import { allCrds } from '../../src/api/crd.ts';
import { FULL_STATUS, INVALID_OBJECTS } from '../support/crd-cases.ts';
import { KubectlError, startKubeApiServer, type KubeApiServer } from '../support/kube-apiserver.ts';

const root = new URL('../../', import.meta.url);
let kube: KubeApiServer;

before(async () => {
  kube = await startKubeApiServer({ etcdUnsafeNoFsync: true });
  await kube.kubectl(['apply', '-k', new URL('clusters/base/crds', root).pathname]);
  await kube.kubectl(['wait', '--for=condition=established', '--timeout=60s', ...allCrds().map((c) => `crd/${c.metadata.name}`)]);
});

after(async () => {
  await kube.stop();
});

type Json = Record<string, unknown>;

async function getJson(args: readonly string[]): Promise<Json> {
  return JSON.parse(await kube.kubectl([...args, '-o', 'json'])) as Json;
}

/** kubectl drops null fields before it sends an object (`image:` left empty in a seed). */
function withoutNulls(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withoutNulls);
  if (typeof value !== 'object' || value === null) return value;
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== null).map(([k, v]) => [k, withoutNulls(v)]));
}

/** Why kubectl failed: its stderr, or a failure when it did not. */
async function refusal(args: readonly string[], stdin?: string): Promise<string> {
  try {
    await kube.kubectl(args, stdin);
  } catch (err) {
    if (err instanceof KubectlError) return err.stderr;
    throw err;
  }
  assert.fail(`kubectl ${args.join(' ')} succeeded`);
}

test('the seeds\' YAML applies unchanged with kubectl and reads back as written', async () => {
  // The Concepts example lives in its own namespace; kubectl does not create it.
  await kube.kubectl(['create', 'namespace', 'sandbox-ns']);
  const seeds = ['getting-started', 'sandbox-example', 'sandboxtemplate', 'sandboxwarmpool', 'sandboxclaim-v1beta1', 'sandboxclaim-v1alpha1'];
  for (const seed of seeds) {
    const file = new URL(`test/fixtures/seeds/${seed}.yaml`, root);
    const applied = await kube.kubectl(['apply', '-f', file.pathname]);
    const written = parseAllDocuments(readFileSync(file, 'utf8'))[0]?.toJS() as { apiVersion: string; kind: string; metadata: { name: string; namespace?: string }; spec: unknown };
    assert.match(applied, / (created|configured)\n$/, seed);
    // Read back in the version it was written in: nothing pruned, nothing added.
    const [group] = written.apiVersion.split('/');
    const read = await getJson(['get', `${written.kind.toLowerCase()}.${written.apiVersion.split('/')[1]}.${group}/${written.metadata.name}`, '-n', written.metadata.namespace ?? 'default']);
    assert.deepEqual(read.spec, withoutNulls(written.spec), seed);
  }
});

test('the examples and the built-in template and pool apply, and get the CRD defaults', async () => {
  await kube.kubectl(['apply', '-f', new URL('examples/sandbox.yaml', root).pathname]);
  const list = builtinObjects().map((obj) => ({ ...obj, metadata: { ...obj.metadata, namespace: 'default' } }));
  await kube.kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: list }));
  // The example pool leaves updateStrategy out: the CRD fills in k8s-sigs' default.
  const pool = await getJson(['get', 'sandboxwarmpool/python']);
  assert.deepEqual((pool.spec as Json).updateStrategy, { type: 'OnReplenish' });
  const base = await getJson(['get', 'sandboxtemplate/base']);
  assert.deepEqual(base.spec, builtinObjects()[0]?.spec);
});

test('kubectl scale sets a warm pool\'s replicas, within the pod-storm cap; a sandbox scales between 0 and 1', async () => {
  await kube.kubectl(['apply', '-f', new URL('test/fixtures/seeds/sandboxwarmpool.yaml', root).pathname]);
  assert.match(await kube.kubectl(['scale', 'sandboxwarmpool/sandboxwarmpool-example', '--replicas=5']), /scaled/);
  assert.equal(await kube.kubectl(['get', 'swp/sandboxwarmpool-example', '-o', 'jsonpath={.spec.replicas}']), '5');
  assert.match(await refusal(['scale', 'swp/sandboxwarmpool-example', '--replicas=5000']), /spec\.replicas: Invalid value: 5000: .*less than or equal to 1000/);

  await kube.kubectl(['apply', '-f', new URL('test/fixtures/seeds/getting-started.yaml', root).pathname]);
  await kube.kubectl(['scale', 'sandbox/my-sandbox', '--replicas=0']);
  assert.equal(await kube.kubectl(['get', 'sandbox/my-sandbox', '-o', 'jsonpath={.spec.replicas}']), '0');
  assert.match(await refusal(['scale', 'sandbox/my-sandbox', '--replicas=2']), /spec\.replicas: Invalid value: 2/);
});

test('a status with every field the controllers write is kept whole, and kubectl get prints it in our columns', async () => {
  await kube.kubectl(['apply', '-f', new URL('test/fixtures/seeds/sandboxwarmpool.yaml', root).pathname]);
  await kube.kubectl(['apply', '-f', new URL('test/fixtures/seeds/sandboxclaim-v1beta1.yaml', root).pathname]);
  await kube.kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'agents.x-k8s.io/v1beta1', kind: 'Sandbox', metadata: { name: 'status-box', namespace: 'default' }, spec: { podTemplate: { spec: { containers: [{ name: 'main' }] } } } }));
  const targets = [
    ['sandbox/status-box', FULL_STATUS.Sandbox],
    ['sandboxwarmpool/sandboxwarmpool-example', FULL_STATUS.SandboxWarmPool],
    ['sandboxclaim/my-secure-sandbox', FULL_STATUS.SandboxClaim],
  ] as const;
  for (const [target, status] of targets) {
    await kube.kubectl(['patch', target, '--subresource=status', '--type=merge', '-p', JSON.stringify({ status })]);
    assert.deepEqual((await getJson(['get', target])).status, status, target);
  }

  const table = (text: string): string[][] => text.trim().split('\n').map((line) => line.trim().split(/\s{2,}/));
  const sandboxes = table(await kube.kubectl(['get', 'sandboxes', 'status-box']));
  assert.deepEqual(sandboxes[0], ['NAME', 'PHASE', 'READY', 'REASON', 'AGE']);
  assert.deepEqual(sandboxes[1]?.slice(0, 4), ['status-box', 'Running', 'True', 'DependenciesReady']);
  const wide = table(await kube.kubectl(['get', 'sandboxes', 'status-box', '-o', 'wide']));
  assert.equal(wide[1]?.[wide[0]?.indexOf('POD IP') ?? -1], '10.0.0.7');
  const pools = table(await kube.kubectl(['get', 'swp', 'sandboxwarmpool-example']));
  assert.deepEqual(pools[0], ['NAME', 'READY', 'DESIRED', 'TEMPLATE', 'AGE']);
  assert.deepEqual(pools[1]?.slice(0, 4), ['sandboxwarmpool-example', '2', '1', 'secure-datascience-template']);
  const claims = table(await kube.kubectl(['get', 'sandboxclaims', 'my-secure-sandbox']));
  assert.deepEqual(claims[0], ['NAME', 'READY', 'SANDBOX', 'REASON', 'AGE']);
  assert.deepEqual(claims[1]?.slice(0, 4), ['my-secure-sandbox', 'True', 'base-x7k2p', 'DependenciesReady']);
  // One category lists every kind of ours.
  const all = await kube.kubectl(['get', 'agent-sandbox', '-o', 'name']);
  for (const kind of ['sandbox.agents.x-k8s.io/status-box', 'sandboxwarmpool.extensions.agents.x-k8s.io/sandboxwarmpool-example', 'sandboxclaim.extensions.agents.x-k8s.io/my-secure-sandbox']) {
    assert.ok(all.includes(kind), `${kind} in ${all}`);
  }
});

test('the API server refuses what our validator refuses, naming the field', async () => {
  for (const { what, obj, field } of INVALID_OBJECTS) {
    const stderr = await refusal(['apply', '-f', '-'], JSON.stringify(obj));
    // The server names a map entry by the map: spec.podTemplate.metadata.labels.
    const named = field.replace(/\["[^"]*"\]$/, '');
    assert.ok(stderr.includes(named), `${what}: kubectl said ${stderr.trim()}, not naming ${named}`);
  }
});
