// Template builds on the Kubernetes tier (make bench's `kube-build` part): the three-step build of
// bench/build.ts (one run, one copy, one env, from debian:12) through a worker with
// --store=kube --runtime=kube on a real kube-apiserver and node (test/support/kube-node.ts: the
// kubelet on containerd and runc), over our REST build API: from scratch (noCache) and fully
// cached, beside its floor (the same run command exec'd in a running debian:12 sandbox Pod), and
// from a build's end to the first sandbox of the new template Ready with a first exec (the node's
// pull of the new layers, the Pod's start). Each step runs in a build Pod that lists and archives
// its own changes over pods/exec (src/builds/pod-layers.ts), so the first build pays two listings
// and an archive per step that the local tier reads from its disk. Tag lbkb, subnet 10.141.0.0/16
// (unused with --runtime=kube).
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import type { BuildStatus, BuildStep } from '../src/builds/contract.ts';
import { installCrds } from '../test/support/kube-store.ts';
import { startKubeApiServer, type KubeApiServer } from '../test/support/kube-apiserver.ts';
import { startKubeNode } from '../test/support/kube-node.ts';
import { testImages } from '../test/support/test-images.ts';
import { api, removeDataDir, startWorkerProcess, type WorkerProcess } from '../test/support/worker-process.ts';

export interface KubeBuildFigures {
  firstMs: number[];
  cachedMs: number[];
  floorMs: number[];
  toSandboxMs: number[];
}

const RUN = 'seq 1 200000 > /opt/numbers && sha256sum /opt/numbers > /opt/numbers.sha256';
const BUILD_NAMESPACE = 'bench-build-steps';
const NAME = 'kbench';

function tarOf(files: Record<string, string>): Buffer {
  const dir = mkdtempSync(join(tmpdir(), 'asb-kbb-ctx-'));
  try {
    for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text);
    return execFileSync('tar', ['-cf', '-', '--owner=0', '--group=0', '--mtime=@0', '-C', dir, ...Object.keys(files)]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** POST a build and poll its status every 20 ms (10 min at most) until it ends; the time from the POST to ready. */
async function timedBuild(w: WorkerProcess, steps: BuildStep[], noCache: boolean): Promise<number> {
  const start = performance.now();
  const made = await api<{ buildId: string }>(w, 'POST', `/v1/templates/${NAME}/builds`, { from: { image: 'debian:12' }, steps, noCache });
  if (made.status !== 202) throw new Error(`build request: ${String(made.status)} ${JSON.stringify(made.body)}`);
  const deadline = start + 600_000;
  for (;;) {
    const s = await api<BuildStatus>(w, 'GET', `/v1/templates/${NAME}/builds/${made.body.buildId}`);
    if (s.body.phase === 'ready') return performance.now() - start;
    if (s.body.phase === 'error') throw new Error(`build failed: ${JSON.stringify(s.body.reason)}`);
    if (performance.now() > deadline) throw new Error('build took over 10 min');
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A sandbox of `template` Ready (create with wait) and `command` exec'd in it; removed after. */
async function sandboxExec(w: WorkerProcess, template: string, command: string[]): Promise<{ id: string; exitCode: number }> {
  const res = await api<{ id: string; ready?: boolean }>(w, 'POST', '/v1/sandboxes', { template, wait: true });
  if (res.status !== 201 || res.body.ready !== true) throw new Error(`sandbox of ${template}: ${String(res.status)} ${JSON.stringify(res.body)}`);
  const r = await api<{ exitCode: number }>(w, 'POST', `/v1/sandboxes/${res.body.id}/exec`, { command });
  return { id: res.body.id, exitCode: r.body.exitCode };
}

export async function benchKubeBuild(rounds = 3, cachedRounds = 10): Promise<KubeBuildFigures> {
  const kube: KubeApiServer = await startKubeApiServer({ etcdUnsafeNoFsync: true });
  try {
    const node = await startKubeNode(kube);
    try {
      await installCrds(kube.kubeconfigPath);
      await kube.kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: BUILD_NAMESPACE, labels: { 'pod-security.kubernetes.io/enforce': 'baseline' } } }));
      const registry = (await testImages()).address;
      const w = await startWorkerProcess({
        clusterTag: 'lbkb',
        subnetOctet: 141,
        basePool: 0,
        extraArgs: ['--store=kube', '--runtime=kube', '--kubeconfig', kube.kubeconfigPath, '--build-registry', registry, '--build-registry-pull', registry.replace(/^127\.0\.0\.1:/, 'localhost:'), '--build-pod-namespace', BUILD_NAMESPACE],
      });
      try {
        return await measure(w, rounds, cachedRounds);
      } finally {
        await w.stop();
        removeDataDir(w.dataDir);
      }
    } finally {
      await node.stop();
    }
  } finally {
    await kube.stop();
  }
}

async function measure(w: WorkerProcess, rounds: number, cachedRounds: number): Promise<KubeBuildFigures> {
  const tar = tarOf({ 'main.py': 'print("hello")\n' });
  const hash = createHash('sha256').update(tar).digest('hex');
  const put = await fetch(`${w.apiUrl}/v1/templates/${NAME}/files/${hash}`, { method: 'PUT', headers: { authorization: `Bearer ${w.adminKey}` }, body: tar });
  if (put.status !== 201 && put.status !== 200) throw new Error(`upload: ${String(put.status)} ${await put.text()}`);
  const steps: BuildStep[] = [
    { type: 'RUN', args: [RUN] },
    { type: 'COPY', args: ['main.py', '/opt/app/', '', ''], filesHash: hash },
    { type: 'ENV', args: ['APP_HOME', '/opt/app'] },
  ];
  const figures: KubeBuildFigures = { firstMs: [], cachedMs: [], floorMs: [], toSandboxMs: [] };
  // The floor: the same command in a running sandbox Pod of debian:12 (the node has the image after the first start).
  const applied = await api(w, 'POST', '/v1/apply', { objects: [{ apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxTemplate', metadata: { name: 'kbfloor' }, spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'debian:12', command: ['sleep', 'infinity'] }] } } } }] });
  if (applied.status !== 200) throw new Error(`apply: ${JSON.stringify(applied.body)}`);
  const floor = await sandboxExec(w, 'kbfloor', ['true']);
  for (let i = 0; i < rounds; i++) {
    const t = performance.now();
    // Sandbox Pods here run as a non-root user: the same work, written under /tmp.
    const r = await api<{ exitCode: number }>(w, 'POST', `/v1/sandboxes/${floor.id}/exec`, { command: ['sh', '-c', RUN.replaceAll('/opt/', '/tmp/')] });
    figures.floorMs.push(performance.now() - t);
    if (r.body.exitCode !== 0) throw new Error(`floor command: ${JSON.stringify(r.body)}`);
  }
  await api(w, 'DELETE', `/v1/sandboxes/${floor.id}`);
  // A warm-up build: the node has debian:12, the engine its first connections.
  await timedBuild(w, steps, true);
  for (let i = 0; i < rounds; i++) {
    figures.firstMs.push(await timedBuild(w, steps, true));
    const t = performance.now();
    const s = await sandboxExec(w, NAME, ['cat', '/opt/app/main.py']);
    figures.toSandboxMs.push(performance.now() - t);
    if (s.exitCode !== 0) throw new Error('the new template\'s sandbox lacks the copied file');
    await api(w, 'DELETE', `/v1/sandboxes/${s.id}`);
  }
  for (let i = 0; i < cachedRounds; i++) figures.cachedMs.push(await timedBuild(w, steps, false));
  return figures;
}

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? NaN;
}

if (import.meta.main) {
  const f = await benchKubeBuild();
  console.log(JSON.stringify({ ...f, median: { firstMs: median(f.firstMs), cachedMs: median(f.cachedMs), floorMs: median(f.floorMs), toSandboxMs: median(f.toSandboxMs) } }, null, 2));
}
