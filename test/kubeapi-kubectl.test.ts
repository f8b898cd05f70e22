// The real kubectl (1.37, built by `make test`) against the worker's Kubernetes API (src/kubeapi/)
// over HTTPS, as `make up`'s .asb/kubeconfig points it at the TLS edge: the seeds' YAML applied,
// printer columns, a watch that sees a change, wait for Ready, delete, explain, server-side
// apply and patches, scale, delete --all and -l, and a team key that cannot see another team's
// objects.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { startWorkerFixture } from './support/worker-fixture.ts';
import { kubectlFor, serveTls } from './support/kubectl.ts';
import { KubectlError } from './support/kube-apiserver.ts';
import { waitFor } from './support/wait.ts';

const SEEDS = new URL('./fixtures/seeds/', import.meta.url).pathname;
const seed = (name: string): string => `${SEEDS}${name}`;

async function setup(t: { after: (fn: () => Promise<void> | void) => void }) {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const tls = await serveTls(fx.server.handler, (fn) => t.after(fn));
  const kubectl = kubectlFor(tls.url, tls.caPath, fx.keys.admin, (fn) => t.after(fn));
  return { fx, kubectl };
}

async function failure(p: Promise<string>): Promise<KubectlError> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof KubectlError, `expected kubectl to fail, got ${String(err)}`);
  return err;
}

test('kubectl applies the seeds, prints the printer columns, waits for Ready, explains, patches and deletes', async (t) => {
  const { kubectl } = await setup(t);
  assert.match(await kubectl.run(['version']), /Server Version: v1\.37\.0\+asb\./);
  const resources = await kubectl.run(['api-resources', '--api-group=extensions.agents.x-k8s.io']);
  assert.match(resources, /sandboxwarmpools\s+swp\s+extensions\.agents\.x-k8s\.io\/v1beta1\s+true\s+SandboxWarmPool/);

  const applied = await kubectl.run(['apply', '-f', seed('sandboxtemplate.yaml'), '-f', seed('sandboxwarmpool.yaml')]);
  assert.match(applied, /sandboxtemplate\.extensions\.agents\.x-k8s\.io\/secure-datascience-template created/);
  assert.match(applied, /sandboxwarmpool\.extensions\.agents\.x-k8s\.io\/sandboxwarmpool-example created/);
  assert.match(await kubectl.run(['apply', '-f', seed('sandboxwarmpool.yaml')]), /sandboxwarmpool-example unchanged/);
  assert.match(await kubectl.run(['apply', '-f', seed('sandboxclaim-v1beta1.yaml')]), /sandboxclaim\.extensions\.agents\.x-k8s\.io\/my-secure-sandbox created/);
  assert.match(await kubectl.run(['wait', '--for=condition=Ready', '--timeout=60s', 'sandboxclaim/my-secure-sandbox']), /my-secure-sandbox condition met/);

  const claims = await kubectl.run(['get', 'sandboxclaims']);
  assert.match(claims, /^NAME\s+READY\s+SANDBOX\s+REASON\s+AGE\n/);
  const bound = /my-secure-sandbox\s+True\s+(\S+)\s+SandboxReady\s+\d+s/.exec(claims);
  assert.ok(bound !== null, claims);
  const sandboxes = await kubectl.run(['get', 'sandboxes', '-o', 'wide']);
  assert.match(sandboxes, /^NAME\s+PHASE\s+READY\s+REASON\s+AGE\s+POD IP\s+STRATEGY\s+SUSPENDED\n/);
  assert.match(sandboxes, new RegExp(`${bound[1] ?? ''}\\s+Running\\s+True\\s+\\S+\\s+\\d+s\\s+10\\.`));
  assert.match(await kubectl.run(['get', 'swp']), /sandboxwarmpool-example\s+\d+\s+1\s+secure-datascience-template/);

  const explained = await kubectl.run(['explain', 'sandboxclaims.spec.warmPoolRef']);
  assert.match(explained, /KIND:\s+SandboxClaim/);
  assert.match(explained, /name\s+<string> -required-/);

  assert.match(await kubectl.run(['apply', '--server-side', '-f', seed('sandboxwarmpool.yaml')]), /serverside-applied/);
  await kubectl.run(['patch', 'swp', 'sandboxwarmpool-example', '--type=json', '-p', '[{"op":"replace","path":"/spec/replicas","value":2}]']);
  await kubectl.run(['patch', 'sandboxtemplate', 'secure-datascience-template', '--type=merge', '-p', '{"metadata":{"labels":{"tier":"gold"}}}']);
  assert.equal(await kubectl.run(['get', 'swp', 'sandboxwarmpool-example', '-o', 'jsonpath={.spec.replicas}']), '2');
  assert.equal(await kubectl.run(['get', 'sandboxtemplates', '-l', 'tier=gold', '-o', 'name']), 'sandboxtemplate.extensions.agents.x-k8s.io/secure-datascience-template\n');

  const missing = await failure(kubectl.run(['get', 'sandbox', 'nope']));
  assert.match(missing.stderr, /Error from server \(NotFound\): sandboxes\.agents\.x-k8s\.io "nope" not found/);

  assert.match(await kubectl.run(['delete', '-f', seed('sandboxclaim-v1beta1.yaml')]), /"my-secure-sandbox" deleted/);
  assert.equal(await kubectl.run(['get', 'sandboxclaims', '-o', 'name']), '');
});

test('kubectl scale writes a pool\'s replicas through the scale subresource; kubectl delete --all and -l delete what they select', async (t) => {
  const { kubectl } = await setup(t);
  await kubectl.run(['apply', '-f', seed('sandboxtemplate.yaml'), '-f', seed('sandboxwarmpool.yaml')]);
  assert.equal(await kubectl.run(['scale', 'swp', 'sandboxwarmpool-example', '--replicas=3']), 'sandboxwarmpool.extensions.agents.x-k8s.io/sandboxwarmpool-example scaled\n');
  assert.equal(await kubectl.run(['get', 'swp', 'sandboxwarmpool-example', '-o', 'jsonpath={.spec.replicas}']), '3');
  assert.equal(await kubectl.run(['get', 'swp', 'sandboxwarmpool-example', '--subresource=scale', '-o', 'jsonpath={.apiVersion} {.kind} {.spec.replicas}']), 'autoscaling/v1 Scale 3');
  // With --current-replicas kubectl reads the Scale and PUTs it back with its resourceVersion.
  assert.match(await kubectl.run(['scale', 'sandboxwarmpool/sandboxwarmpool-example', '--current-replicas=3', '--replicas=1']), /scaled/);
  const wrong = await failure(kubectl.run(['scale', 'swp', 'sandboxwarmpool-example', '--current-replicas=7', '--replicas=2']));
  assert.match(wrong.stderr, /Expected replicas to be 7, was 1/);
  assert.equal(await kubectl.run(['get', 'swp', 'sandboxwarmpool-example', '-o', 'jsonpath={.spec.replicas}']), '1');
  // The pool follows: one ready member.
  await waitFor('one ready member', async () => (/sandboxwarmpool-example\s+1\s+1\s/.test(await kubectl.run(['get', 'swp'])) ? true : undefined), 10_000);

  const claim = (name: string, tier: string): string => `apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata: {name: ${name}, namespace: default, labels: {tier: ${tier}}}
spec: {warmPoolRef: {name: sandboxwarmpool-example}}
`;
  await kubectl.run(['apply', '-f', '-'], { stdin: [claim('gold-1', 'gold'), claim('gold-2', 'gold'), claim('plain-1', 'plain'), claim('plain-2', 'plain')].join('---\n') });
  const deletedGold = await kubectl.run(['delete', 'sandboxclaims', '-l', 'tier=gold']);
  assert.match(deletedGold, /"gold-1" deleted/);
  assert.match(deletedGold, /"gold-2" deleted/);
  assert.equal(await kubectl.run(['get', 'sandboxclaims', '-o', 'name']), 'sandboxclaim.extensions.agents.x-k8s.io/plain-1\nsandboxclaim.extensions.agents.x-k8s.io/plain-2\n');
  assert.match(await kubectl.run(['delete', 'sandboxclaims', '--all']), /"plain-2" deleted/);
  assert.equal(await kubectl.run(['get', 'sandboxclaims', '-o', 'name']), '');
  // Every Sandbox there is (the pool's members; the claims' went with them) with --all: each one
  // it names is gone once kubectl returns (the pool then makes a new member, under a new name).
  const before = (await kubectl.run(['get', 'sandboxes', '-o', 'name'])).trim().split('\n');
  assert.ok(before.length >= 1 && before[0] !== '', 'the pool has a member');
  const deleted = await kubectl.run(['delete', 'sandboxes', '--all']);
  for (const name of before) {
    assert.match(deleted, new RegExp(`"${name.split('/')[1] ?? ''}" deleted`));
    assert.match((await failure(kubectl.run(['get', name]))).stderr, /\(NotFound\)/);
  }
});

test('kubectl get -w prints a change as it happens', async (t) => {
  const { kubectl } = await setup(t);
  await kubectl.run(['apply', '-f', seed('sandboxtemplate.yaml'), '-f', seed('sandboxwarmpool.yaml')]);
  const watcher = kubectl.start(['get', 'sandboxclaims', '-w']);
  t.after(() => watcher.kill('SIGKILL'));
  let out = '';
  const seen = (re: RegExp): Promise<void> => new Promise((resolve, reject) => {
    const check = (): void => {
      if (re.test(out)) {
        watcher.stdout.off('data', onData);
        resolve();
      }
    };
    const onData = (d: Buffer): void => {
      out += d.toString();
      check();
    };
    watcher.stdout.on('data', onData);
    watcher.once('exit', (code) => reject(new Error(`kubectl get -w exited ${String(code)} before printing ${String(re)}; it printed:\n${out}`)));
    check();
  });
  // Nothing exists yet: kubectl prints nothing until the claim appears.
  await kubectl.run(['apply', '-f', seed('sandboxclaim-v1beta1.yaml')]);
  await seen(/my-secure-sandbox\s+True\s+\S+\s+SandboxReady/);
  assert.match(out, /^NAME\s+READY\s+SANDBOX\s+REASON\s+AGE\n/);
});

test('a team key sees and writes only its own team\'s claims and sandboxes through kubectl', async (t) => {
  const { fx, kubectl } = await setup(t);
  await kubectl.run(['apply', '-f', seed('sandboxtemplate.yaml'), '-f', seed('sandboxwarmpool.yaml')]);
  const claim = (name: string): string => `apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata: {name: ${name}, namespace: default}
spec: {warmPoolRef: {name: sandboxwarmpool-example}}
`;
  await kubectl.run(['apply', '-f', '-'], { stdin: claim('team-a-claim'), key: fx.keys.teamA });
  await kubectl.run(['wait', '--for=condition=Ready', '--timeout=60s', 'sandboxclaim/team-a-claim'], { key: fx.keys.teamA });
  const sandboxA = await kubectl.run(['get', 'sandboxclaim', 'team-a-claim', '-o', 'jsonpath={.status.sandbox.name}'], { key: fx.keys.teamA });
  assert.notEqual(sandboxA, '');

  // Team B: nothing of team A's is there, by list, by name, by watch, for writes or deletes.
  assert.equal(await kubectl.run(['get', 'sandboxclaims,sandboxes', '-o', 'name'], { key: fx.keys.teamB }), '');
  const hidden = await failure(kubectl.run(['get', 'sandboxclaim', 'team-a-claim'], { key: fx.keys.teamB }));
  assert.match(hidden.stderr, /\(NotFound\): sandboxclaims\.extensions\.agents\.x-k8s\.io "team-a-claim" not found/);
  const hiddenSandbox = await failure(kubectl.run(['get', 'sandbox', sandboxA], { key: fx.keys.teamB }));
  assert.match(hiddenSandbox.stderr, /\(NotFound\)/);
  const del = await failure(kubectl.run(['delete', 'sandboxclaim', 'team-a-claim'], { key: fx.keys.teamB }));
  assert.match(del.stderr, /\(NotFound\)/);
  const patch = await failure(kubectl.run(['patch', 'sandboxclaim', 'team-a-claim', '--type=merge', '-p', '{"metadata":{"labels":{"x":"y"}}}'], { key: fx.keys.teamB }));
  assert.match(patch.stderr, /\(NotFound\)/);
  const taken = await failure(kubectl.run(['create', '-f', '-'], { stdin: claim('team-a-claim'), key: fx.keys.teamB }));
  assert.match(taken.stderr, /\(AlreadyExists\)/);
  // Templates and pools: readable, not writable, by a team key.
  assert.match(await kubectl.run(['get', 'swp', '-o', 'name'], { key: fx.keys.teamB }), /sandboxwarmpool-example/);
  const forbidden = await failure(kubectl.run(['scale', 'swp', 'sandboxwarmpool-example', '--replicas=5'], { key: fx.keys.teamB }));
  assert.match(forbidden.stderr, /Error from server \(Forbidden\): .*cannot patch resource "sandboxwarmpools\/scale" .*needs an admin API key/);
  const forbiddenDelete = await failure(kubectl.run(['delete', 'swp', 'sandboxwarmpool-example'], { key: fx.keys.teamB }));
  assert.match(forbiddenDelete.stderr, /Error from server \(Forbidden\): .*needs an admin API key/);
  // Reserved labels are refused for a team key, as in /v1/apply.
  const reserved = await failure(kubectl.run(['apply', '-f', '-'], { stdin: claim('team-b-claim').replace('namespace: default}', 'namespace: default, labels: {asb.dev/template: x}}'), key: fx.keys.teamB }));
  assert.match(reserved.stderr, /The SandboxClaim "team-b-claim" is invalid: .*metadata\.labels\.asb\.dev\/template: uses a reserved prefix/);
  // Team A still sees its own.
  assert.match(await kubectl.run(['get', 'sandboxclaims', '-o', 'name'], { key: fx.keys.teamA }), /team-a-claim/);
  // An unknown key is Unauthorized.
  const unknown = await failure(kubectl.run(['get', 'sandboxclaims'], { key: 'asb_00000000_00000000000000000000000000000000' }));
  assert.match(unknown.stderr, /You must be logged in to the server/);
});
