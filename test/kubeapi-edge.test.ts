// kubectl through the edge, as a user of `make up` runs it: the whole local system (worker,
// router, Envoy with its HTTPS listener, real sandboxes), the kubeconfig `make up` writes
// (src/assembly/kubeconfig.ts), and the Kubernetes API paths the router sends to the worker
// (src/router/host.ts).
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { writeKubeconfig } from '../src/assembly/kubeconfig.ts';
import { KUBECTL } from './support/kubectl.ts';
import { startTestSystem } from './support/local-system.ts';

test('kubectl with make up\'s kubeconfig lists, claims, waits for Ready, watches, scales and deletes through the TLS edge', async (t) => {
  const system = await startTestSystem('kube', 193, 'local', 1, true);
  t.after(() => system.cleanup());
  assert.ok(system.edgeTlsUrl !== undefined && system.caCertPath !== undefined);
  const dir = mkdtempSync(join(tmpdir(), 'asb-kubeedge-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const kubeconfig = join(dir, 'kubeconfig');
  writeKubeconfig(kubeconfig, [{ name: 'local', server: system.edgeTlsUrl }], system.caCertPath, system.adminKey);
  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: dir, KUBECONFIG: kubeconfig, KUBECACHEDIR: join(dir, 'cache') };
  const kubectl = (args: string[], stdin = ''): Promise<string> => new Promise((resolve, reject) => {
    const child = execFile(KUBECTL, args, { env, timeout: 90_000 }, (err, stdout, stderr) => {
      if (err === null) resolve(stdout);
      else reject(new Error(`kubectl ${args.join(' ')}: ${err.message}\n${stderr}`));
    });
    child.stdin?.end(stdin);
  });

  assert.match(await kubectl(['version']), /Server Version: v1\.37\.0\+asb\./);
  assert.match(await kubectl(['get', 'sandboxtemplates']), /^NAME\s+AGE\nbase\s/);
  assert.match(await kubectl(['get', 'sandboxwarmpools']), /^NAME\s+READY\s+DESIRED\s+TEMPLATE\s+AGE\nbase\s+\d+\s+1\s+base\s/);
  await kubectl(['apply', '-f', '-'], `apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata: {name: edge-claim, namespace: default}
spec: {warmPoolRef: {name: base}}
`);
  assert.match(await kubectl(['wait', '--for=condition=Ready', '--timeout=60s', 'sandboxclaim/edge-claim']), /condition met/);
  const id = await kubectl(['get', 'sandboxclaim', 'edge-claim', '-o', 'jsonpath={.status.sandbox.name}']);
  assert.match(id, /^kube[a-z0-9]{16}$/);
  // A Sandbox's own path goes to its owning worker; the printer columns come back through Envoy.
  assert.match(await kubectl(['get', 'sandbox', id]), new RegExp(`^NAME\\s+PHASE\\s+READY\\s+REASON\\s+AGE\\n${id}\\s+Running\\s+True\\s`));
  // A watch through the edge sees the claim go away.
  const watcher = spawn(KUBECTL, ['get', 'sandboxclaims', '-w', '--output-watch-events'], { env });
  t.after(() => watcher.kill('SIGKILL'));
  let printed = '';
  const waiting: { re: RegExp; resolve: () => void }[] = [];
  watcher.stdout.on('data', (d: Buffer) => {
    printed += d.toString();
    for (const w of [...waiting]) if (w.re.test(printed)) {
      waiting.splice(waiting.indexOf(w), 1);
      w.resolve();
    }
  });
  const printedLine = (re: RegExp): Promise<void> => new Promise((resolve, reject) => {
    if (re.test(printed)) resolve();
    else waiting.push({ re, resolve });
    watcher.once('exit', (code) => reject(new Error(`kubectl get -w exited ${String(code)} before printing ${String(re)}; it printed:\n${printed}`)));
  });
  // The watch lists first: the claim is printed as ADDED, then DELETED once it is deleted.
  await printedLine(/ADDED\s+edge-claim/);
  assert.match(await kubectl(['delete', 'sandboxclaim', 'edge-claim', '--wait=true']), /"edge-claim" deleted/);
  await printedLine(/DELETED\s+edge-claim/);
  assert.equal(await kubectl(['get', 'sandboxclaims', '-o', 'name']), '');

  // kubectl scale of the built-in pool (its scale subresource), and delete by label and --all.
  assert.equal(await kubectl(['scale', 'sandboxwarmpool/base', '--replicas=2']), 'sandboxwarmpool.extensions.agents.x-k8s.io/base scaled\n');
  assert.equal(await kubectl(['get', 'swp', 'base', '--subresource=scale', '-o', 'jsonpath={.spec.replicas}']), '2');
  const claim = (name: string): string => `apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata: {name: ${name}, namespace: default, labels: {batch: "${name.slice(0, 1)}"}}
spec: {warmPoolRef: {name: base}}
`;
  await kubectl(['apply', '-f', '-'], [claim('a-1'), claim('a-2'), claim('b-1')].join('---\n'));
  assert.match(await kubectl(['delete', 'sandboxclaims', '-l', 'batch=a']), /"a-1" deleted[^]*"a-2" deleted/);
  assert.equal(await kubectl(['get', 'sandboxclaims', '-o', 'name']), 'sandboxclaim.extensions.agents.x-k8s.io/b-1\n');
  assert.match(await kubectl(['delete', 'sandboxclaims', '--all']), /"b-1" deleted/);
  assert.equal(await kubectl(['get', 'sandboxclaims', '-o', 'name']), '');
});
