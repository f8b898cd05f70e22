// Template builds on the Kubernetes tier, on a real node (test/support/kube-node.ts: the kubelet on
// containerd and runc): a worker with --store=kube --runtime=kube builds a template through E2B's
// build API (a RUN and a COPY; each step in a build Pod on the cluster, its layer read from inside
// the Pod), pushes it to --build-registry, and names it as the node pulls it
// (--build-registry-pull: here the same loopback registry by another name, localhost, as a
// cluster's nodes often reach a registry by a name of their own). A sandbox of the template then
// runs on the node as a Pod of that image, with the built files; no build Pod is left behind. A
// template whose image the node cannot pull leaves its sandbox Pending with a condition naming the
// image.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { installCrds } from '../support/kube-store.ts';
import { startKubeApiServer, type KubeApiServer } from '../support/kube-apiserver.ts';
import { startKubeNode, type KubeNode } from '../support/kube-node.ts';
import { testImages } from '../support/test-images.ts';
import { waitFor } from '../support/wait.ts';
import { api, removeDataDir, startWorkerProcess, type ExecOut, type View, type WorkerProcess } from '../support/worker-process.ts';

const NAMESPACE = 'kube-builds';
/** Where build Pods run (--build-pod-namespace): Pod Security `baseline` enforced, as clusters/base/build-namespace.yaml has it. */
const BUILD_NAMESPACE = 'kube-builds-steps';
let kube: KubeApiServer;
let node: KubeNode;
let worker: WorkerProcess;
let pullRegistry: string;
/** What before() started, stopped in reverse order. */
const stops: (() => Promise<void>)[] = [];

before(async () => {
  kube = await startKubeApiServer({ etcdUnsafeNoFsync: true });
  stops.push(() => kube.stop());
  node = await startKubeNode(kube);
  stops.push(() => node.stop());
  await installCrds(kube.kubeconfigPath);
  await kube.kubectl(['create', 'namespace', NAMESPACE]);
  await kube.kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: BUILD_NAMESPACE, labels: { 'pod-security.kubernetes.io/enforce': 'baseline' } } }));
  const registry = (await testImages()).address;
  pullRegistry = registry.replace(/^127\.0\.0\.1:/, 'localhost:');
  worker = await startWorkerProcess({
    clusterTag: 'kb01',
    subnetOctet: 206,
    basePool: 0,
    extraArgs: ['--store=kube', '--runtime=kube', '--kubeconfig', kube.kubeconfigPath, '--namespace', NAMESPACE, '--build-registry', registry, '--build-registry-pull', pullRegistry, '--build-pod-namespace', BUILD_NAMESPACE, '--image-gc-interval-ms', '1000', '--log-level', 'info'],
  });
  stops.push(async () => {
    await worker.stop();
    removeDataDir(worker.dataDir);
  });
});

after(async () => {
  for (const stop of stops.reverse()) await stop();
});

function tarOf(files: Record<string, string>): Buffer {
  const dir = mkdtempSync(join(tmpdir(), 'asb-kb-ctx-'));
  try {
    for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text);
    return execFileSync('tar', ['-cf', '-', '--owner=0', '--group=0', '--mtime=@0', '-C', dir, ...Object.keys(files)]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

interface StatusJson { status: string; reason?: { message: string }; logEntries?: { message: string }[] }

/** E2B's build API on the worker, as the SDK calls it: a template, its files, the build, its status until it ends. */
async function build(name: string, steps: (files: string) => unknown[], fromImage = 'debian:12'): Promise<{ templateID: string; status: StatusJson; logs: string[] }> {
  const made = await api<{ templateID: string; buildID: string }>(worker, 'POST', '/v3/templates', { name, cpuCount: 1, memoryMB: 512 });
  assert.equal(made.status, 202, JSON.stringify(made.body));
  const { templateID, buildID } = made.body;
  const tar = tarOf({ 'hello.txt': 'copied into a kube build\n' });
  const hash = createHash('sha256').update(tar).digest('hex');
  const link = await api<{ present: boolean; url?: string }>(worker, 'GET', `/templates/${templateID}/files/${hash}`);
  assert.equal(link.status, 201, JSON.stringify(link.body));
  if (link.body.url !== undefined) {
    const put = await fetch(link.body.url, { method: 'PUT', body: tar });
    assert.equal(put.status, 200, await put.text());
  }
  const start = await api(worker, 'POST', `/v2/templates/${templateID}/builds/${buildID}`, { fromImage, steps: steps(hash), startCmd: '', force: false });
  assert.equal(start.status, 202, JSON.stringify(start.body));
  const logs: string[] = [];
  const status = await waitFor(`build ${name}`, async () => {
    const res = await api<StatusJson>(worker, 'GET', `/templates/${templateID}/builds/${buildID}/status?logsOffset=${String(logs.length)}`);
    assert.equal(res.status, 200, JSON.stringify(res.body));
    logs.push(...(res.body.logEntries ?? []).map((e) => e.message));
    return res.body.status === 'ready' || res.body.status === 'error' ? res.body : undefined;
  }, 240_000, 500);
  return { templateID, status, logs };
}

async function pods(namespace = NAMESPACE): Promise<{ metadata: { name: string }; spec: { nodeName?: string; containers: { image: string }[] } }[]> {
  return (JSON.parse(await kube.kubectl(['get', 'pods', '-n', namespace, '-o', 'json'])) as { items: [] }).items;
}

/** Build Pods left in either namespace. */
async function buildPods(): Promise<string[]> {
  return [...await pods(NAMESPACE), ...await pods(BUILD_NAMESPACE)].map((p) => p.metadata.name).filter((n) => n.startsWith('build-'));
}

test('a template built on the Kubernetes tier (a RUN and a COPY in build Pods) runs on the node as a Pod of the built image, with the built files', { timeout: 600_000 }, async (t) => {
  let at = Date.now();
  const built = await build('kube-env', (hash) => [
    { type: 'RUN', args: ['echo "built in a Pod as $(id -u)" > /built.txt && cat /proc/self/uid_map > /build-uid-map && rm -f /etc/debian_version', 'root'] },
    { type: 'COPY', args: ['hello.txt', '/data/'], filesHash: hash },
  ]);
  t.diagnostic(`first build: ${String(Date.now() - at)} ms`);
  assert.equal(built.status.status, 'ready', `${JSON.stringify(built.status.reason)}\n${built.logs.join('\n')}`);
  // The steps ran in build Pods of the build namespace, scheduled on the node; none stays.
  const events = (JSON.parse(await kube.kubectl(['get', 'events', '-n', BUILD_NAMESPACE, '-o', 'json'])) as { items: { involvedObject: { kind: string; name: string }; reason: string }[] }).items;
  assert.ok(events.some((e) => e.involvedObject.kind === 'Pod' && e.involvedObject.name.startsWith('build-') && e.reason === 'Scheduled'), 'a build Pod was scheduled in the build namespace');
  assert.deepEqual(await buildPods(), []);

  const res = await api<View>(worker, 'POST', '/v1/sandboxes', { template: 'kube-env' });
  assert.equal(res.status, 201, JSON.stringify(res.body));
  const id = res.body.id;
  const pod = (await pods()).find((p) => p.metadata.name === id) ?? assert.fail(`no Pod ${id}`);
  assert.equal(pod.spec.nodeName, node.nodeName, 'the sandbox runs on the real node');
  const image = pod.spec.containers[0]?.image ?? '';
  assert.ok(image.startsWith(`${pullRegistry}/templates/${built.templateID}@sha256:`), `the Pod runs the built image as the node names its registry: ${image}`);
  const read = await api<ExecOut>(worker, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['sh', '-c', 'cat /built.txt /data/hello.txt; test -e /etc/debian_version && echo still-there || echo removed'] });
  assert.equal(read.status, 200, JSON.stringify(read.body));
  assert.equal(read.body.stdout, 'built in a Pod as 0\ncopied into a kube build\nremoved\n');
  // The step's root was root of a user namespace of its own, never the node's root (as in every sandbox Pod there).
  const map = await api<ExecOut>(worker, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['cat', '/build-uid-map'] });
  const [inside, outside] = map.body.stdout.trim().split(/\s+/).map(Number);
  assert.ok(inside === 0 && outside !== undefined && outside > 0, `the build step's uid 0 is a user namespace's: ${map.body.stdout}`);
  assert.ok([200, 202].includes((await api(worker, 'DELETE', `/v1/sandboxes/${id}`)).status));

  // The same steps again: every one from the team's layer cache, no build Pod, the same image.
  at = Date.now();
  const again = await build('kube-env', (hash) => [
    { type: 'RUN', args: ['echo "built in a Pod as $(id -u)" > /built.txt && cat /proc/self/uid_map > /build-uid-map && rm -f /etc/debian_version', 'root'] },
    { type: 'COPY', args: ['hello.txt', '/data/'], filesHash: hash },
  ]);
  t.diagnostic(`cached rebuild: ${String(Date.now() - at)} ms`);
  assert.equal(again.status.status, 'ready', again.logs.join('\n'));
  assert.equal(again.logs.filter((l) => l.startsWith('CACHED ')).length, 3, again.logs.join('\n'));
});

test('a sandbox of a template whose image the node cannot pull stays Pending with a condition naming the image', { timeout: 300_000 }, async () => {
  const image = `${pullRegistry}/templates/never-pushed:absent`;
  const applied = await api(worker, 'POST', '/v1/apply', { objects: [{
    apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxTemplate', metadata: { name: 'unpullable', namespace: NAMESPACE },
    spec: { podTemplate: { spec: { containers: [{ name: 'main', image, command: ['sleep', 'infinity'] }] } } },
  }] });
  assert.equal(applied.status, 200, JSON.stringify(applied.body));
  const res = await api<View>(worker, 'POST', '/v1/sandboxes', { template: 'unpullable', wait: false });
  assert.ok(res.status === 201 || res.status === 202, JSON.stringify(res.body));
  const id = res.body.id;
  const condition = await waitFor('the image condition', async () => {
    const got = JSON.parse(await kube.kubectl(['get', 'sandboxes.agents.x-k8s.io', id, '-n', NAMESPACE, '-o', 'json'])) as { status?: { conditions?: { type: string; status: string; reason?: string; message?: string }[] } };
    const ready = got.status?.conditions?.find((c) => c.type === 'Ready');
    return ready !== undefined && /ImagePull/.test(ready.reason ?? '') ? ready : undefined;
  }, 120_000, 1000);
  assert.equal(condition.status, 'False');
  assert.ok(condition.message?.includes(image), `the condition names the image: ${condition.message ?? ''}`);
  await api(worker, 'DELETE', `/v1/sandboxes/${id}`);
});

test('a build from a base image no registry has fails, naming the image', { timeout: 120_000 }, async () => {
  const missing = `${pullRegistry}/never/pushed:1`;
  const failed = await build('kube-missing-base', () => [{ type: 'RUN', args: ['true'] }], missing);
  assert.equal(failed.status.status, 'error');
  assert.ok(failed.status.reason?.message.includes(missing), JSON.stringify(failed.status.reason));
  assert.deepEqual(await buildPods(), [], 'no build Pod was left');
});

test('the build layer cache on the Kubernetes tier is collected on the image cache\'s policy: entries unused past the age bound go, the steps of a template in use stay', { timeout: 300_000 }, async () => {
  const live = await build('kube-gc-live', () => [{ type: 'ENV', args: ['WHICH', 'live'] }]);
  assert.equal(live.status.status, 'ready', live.logs.join('\n'));
  const gone = await build('kube-gc-gone', () => [{ type: 'ENV', args: ['WHICH', 'gone'] }]);
  assert.equal(gone.status.status, 'ready', gone.logs.join('\n'));
  assert.equal((await api(worker, 'DELETE', `/templates/${gone.templateID}`)).status, 204);
  // The worker's state: its cache's entries, and the steps of the builds its templates' tags name.
  const cacheRoot = join(worker.dataDir, 'data', 'builds', 'engine', 'layer-cache');
  const entries = (): string[] => readdirSync(cacheRoot).flatMap((team) => {
    const dir = join(cacheRoot, team, 'entries');
    return existsSync(dir) ? readdirSync(dir).filter((n) => n.endsWith('.json')).map((n) => join(dir, n)) : [];
  });
  const recordsDir = join(worker.dataDir, 'data', 'builds', 'templates');
  const inUse = new Set(readdirSync(recordsDir).filter((n) => n.endsWith('.json')).flatMap((n) => {
    const rec = JSON.parse(readFileSync(join(recordsDir, n), 'utf8')) as { tags: Record<string, string>; builds: { buildId: string; cacheKeys?: string[] }[] };
    const tagged = new Set(Object.values(rec.tags));
    return rec.builds.filter((b) => tagged.has(b.buildId)).flatMap((b) => b.cacheKeys ?? []);
  }));
  const keyOf = (path: string): string => path.slice(path.lastIndexOf('/') + 1, -'.json'.length);
  const before = entries();
  const unused = before.filter((p) => !inUse.has(keyOf(p)));
  const kept = before.filter((p) => inUse.has(keyOf(p)));
  assert.ok(unused.length > 0, 'the deleted template\'s ENV step is an entry no live template uses');
  assert.ok(kept.length > 0, `the live template's steps are entries: ${[...inUse].join(', ')}`);
  // A month unused, all of them: the next pass (every second here) collects what no template uses.
  const month = new Date(Date.now() - 30 * 24 * 3600_000);
  for (const p of before) utimesSync(p, month, month);
  await waitFor('the unused entries collected', () => Promise.resolve(unused.every((p) => !existsSync(p)) ? true : undefined), 30_000, 500);
  assert.deepEqual(kept.filter((p) => !existsSync(p)), [], 'no step of a template in use was collected');
  // And the live template still rebuilds from the cache alone.
  const again = await build('kube-gc-live', () => [{ type: 'ENV', args: ['WHICH', 'live'] }]);
  assert.equal(again.status.status, 'ready', again.logs.join('\n'));
  assert.ok(again.logs.filter((l) => l.startsWith('CACHED ')).length >= 1, again.logs.join('\n'));
  assert.deepEqual(await buildPods(), []);
});
