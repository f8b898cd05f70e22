// The worker on Kubernetes end to end: a real kube-apiserver and etcd, our CRDs, a real node
// (test/support/kube-node.ts: the kubelet on containerd and runc, PVCs bound to local volumes)
// and real worker processes started with --store=kube --runtime=kube --kubeconfig, driven as a
// user would: kubectl apply of the seeds' YAML unchanged, claims through the worker's REST API,
// kubectl to look at what is in the cluster; the split roles run as clusters/base/rbac's
// ServiceAccounts, so the manifests' least privilege is shown to be enough. Each worker serves a namespace of its own
// (--namespace: its API's default, its Pods' home), and is stopped before the next starts: the
// controllers of every worker watch every namespace.
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test, type TestContext } from 'node:test';
import { LABEL } from '../../src/api/types.ts';
import { hubAdminKey, hubCall, startHubProcess, type Hub } from '../support/hub-process.ts';
import { installCrds } from '../support/kube-store.ts';
import { KubectlError, startKubeApiServer, type KubeApiServer } from '../support/kube-apiserver.ts';
import { startKubeNode, type KubeNode } from '../support/kube-node.ts';
import { waitFor } from '../support/wait.ts';
import { api, removeDataDir, startWorkerProcess, tempDataDir, type ExecOut, type View, type WorkerProcess } from '../support/worker-process.ts';

const root = new URL('../../', import.meta.url);
/** The namespace of clusters/base, where the worker's own ServiceAccounts and Lease live. */
const SYSTEM_NAMESPACE = 'agent-sandbox-system';
let kube: KubeApiServer;
let kubelet: KubeNode;

before(async () => {
  kube = await startKubeApiServer({ etcdUnsafeNoFsync: true });
  kubelet = await startKubeNode(kube);
  await installCrds(kube.kubeconfigPath);
});

after(async () => {
  await kubelet.stop();
  await kube.stop();
});

interface Meta {
  name: string;
  namespace?: string;
  uid: string;
  creationTimestamp?: string;
  labels?: Record<string, string>;
  ownerReferences?: { kind: string; name: string; uid: string }[];
}
interface Condition {
  type: string;
  status: string;
  reason?: string;
}
interface SandboxJson {
  metadata: Meta;
  spec: { lifecycle?: { shutdownTime?: string; shutdownPolicy?: string } };
  status?: { phase?: string; conditions?: Condition[]; podIPs?: string[] };
}
interface PodJson {
  metadata: Meta;
  spec: { nodeName?: string; volumes?: { name: string; persistentVolumeClaim?: { claimName: string } }[] };
  status?: { phase?: string; podIP?: string };
}
interface ClaimJson {
  metadata: Meta;
  status?: { conditions?: Condition[]; sandbox?: { name: string }; launchType?: string };
}

/** `kubectl get` as JSON; undefined when the object does not exist. */
async function get<T>(kind: string, name: string, namespace: string): Promise<T | undefined> {
  try {
    return JSON.parse(await kube.kubectl(['get', kind, name, '-n', namespace, '-o', 'json'])) as T;
  } catch (err) {
    if (err instanceof KubectlError && err.stderr.includes('NotFound')) return undefined;
    throw err;
  }
}

async function list<T>(kind: string, namespace: string): Promise<T[]> {
  return (JSON.parse(await kube.kubectl(['get', kind, '-n', namespace, '-o', 'json'])) as { items: T[] }).items;
}

function isReady(obj: { status?: { conditions?: Condition[] } } | undefined): boolean {
  return obj?.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') === true;
}

interface KubeWorkerOptions {
  /** 4 chars: the sandbox id prefix; also names the Lease (asb-operator-<tag>). */
  tag: string;
  namespace: string;
  role?: 'all' | 'operator' | 'api';
  basePool?: number;
  /** Reuse a data directory (the admin key, the cluster secret): a restart. */
  dataDir?: string;
  /** Default the admin's (system:masters). */
  kubeconfig?: string;
  extraArgs?: readonly string[];
}

/** A worker process on the kube store and runtime; stopped (and its directory removed) after the test. */
async function kubeWorker(t: TestContext | undefined, opts: KubeWorkerOptions): Promise<WorkerProcess> {
  const w = await startWorkerProcess({
    clusterTag: opts.tag,
    // Unused with --runtime=kube (no bridge, no pod subnet: the node's CNI gives the pod IPs).
    subnetOctet: 209,
    basePool: opts.basePool ?? 0,
    ...(opts.dataDir === undefined ? {} : { dataDir: opts.dataDir }),
    extraArgs: ['--store=kube', '--runtime=kube', '--kubeconfig', opts.kubeconfig ?? kube.kubeconfigPath, '--namespace', opts.namespace, `--role=${opts.role ?? 'all'}`, '--log-level', 'info', ...(opts.extraArgs ?? [])],
  });
  t?.after(async () => {
    await stopped(w);
    if (opts.dataDir === undefined) removeDataDir(w.dataDir);
  });
  return w;
}

/** A hub with this cluster registered: the worker flags that join it (and the hub, to stop). */
async function federated(t: TestContext, tag: string): Promise<string[] & { hub: Hub }> {
  const dir = mkdtempSync(join(tmpdir(), 'asb-k8s-hub-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const hub = await startHubProcess(dir);
  t.after(() => hub.stop());
  const view = { url: hub.ready.url, adminKey: hubAdminKey(dir) };
  const name = `k8s-${tag}`;
  const { credential } = await hubCall<{ credential: string }>(view, 'PUT', `/v1/clusters/${name}`, { region: 'k8s', ingressAddress: '127.0.0.1:10009', tag });
  const credentialFile = join(dir, 'credential');
  writeFileSync(credentialFile, `${credential}\n`, { mode: 0o600 });
  return Object.assign(['--cluster', name, '--hub-url', hub.ready.url, '--hub-credential-file', credentialFile], { hub });
}

/** SIGTERM and wait, unless it has already exited (killed by the test). */
async function stopped(w: WorkerProcess): Promise<void> {
  if (w.proc.exitCode === null && w.proc.signalCode === null) await w.stop();
}

/**
 * A kubeconfig for one of clusters/base/rbac's ServiceAccounts (a token from the TokenRequest
 * API), with its namespace as the context's, as the Pod would have it.
 */
async function serviceAccountKubeconfig(account: string): Promise<string> {
  const token = (await kube.kubectl(['create', 'token', account, '-n', SYSTEM_NAMESPACE])).trim();
  const path = join(kube.dir, `${account}.kubeconfig`);
  writeFileSync(path, JSON.stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'test', cluster: { server: kube.url, 'certificate-authority': kube.caPath } }],
    users: [{ name: account, user: { token } }],
    contexts: [{ name: account, context: { cluster: 'test', user: account, namespace: SYSTEM_NAMESPACE } }],
    'current-context': account,
  }), { mode: 0o600 });
  return path;
}

async function killed(proc: ChildProcess): Promise<void> {
  const exited = new Promise((resolve) => proc.once('exit', resolve));
  proc.kill('SIGKILL');
  await exited;
}

async function waitPoolReady(w: WorkerProcess, pool: string, want: number): Promise<void> {
  await waitFor(`pool ${pool} ${want} ready`, async () => {
    const res = await api<{ status?: { readyReplicas?: number } }>(w, 'GET', `/v1/pools/${pool}`);
    return (res.body.status?.readyReplicas ?? 0) >= want ? true : undefined;
  }, 60_000);
}

/** A template with a home volume (a PVC per sandbox) and a warm pool of it, through the worker API. */
async function applyPool(w: WorkerProcess, namespace: string, name: string, replicas: number): Promise<void> {
  const objects = [
    {
      apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
      kind: 'SandboxTemplate',
      metadata: { name, namespace },
      spec: {
        podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox', command: ['sleep', 'infinity'], volumeMounts: [{ name: 'home', mountPath: '/home/user' }] }] } },
        volumeClaimTemplates: [{ metadata: { name: 'home' }, spec: { accessModes: ['ReadWriteOnce'], resources: { requests: { storage: '1Gi' } } } }],
      },
    },
    { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxWarmPool', metadata: { name, namespace }, spec: { replicas, sandboxTemplateRef: { name } } },
  ];
  const res = await api(w, 'POST', '/v1/apply', { objects });
  assert.equal(res.status, 200, JSON.stringify(res.body));
}

async function writes(w: WorkerProcess, op: string): Promise<number> {
  const res = await fetch(`${w.apiUrl}/metrics`, { headers: { authorization: `Bearer ${w.adminKey}` } });
  const text = await res.text();
  const line = text.split('\n').find((l) => l.startsWith(`asb_store_write_seconds_count{op="${op}"}`));
  return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(' ') + 1));
}

test('the seeds\' YAML applied unchanged with kubectl runs: the Concepts Sandbox gets a Pod and becomes Ready, the warm-pool quickstart\'s claim gets its own volume on a cold start', async (t) => {
  await kubeWorker(t, { tag: 'k5sa', namespace: 'default' });
  await kube.kubectl(['create', 'namespace', 'sandbox-ns']);
  const applySeed = async (seed: string): Promise<void> => {
    const out = await kube.kubectl(['apply', '-f', new URL(`test/fixtures/seeds/${seed}.yaml`, root).pathname]);
    assert.match(out, / created\n$/, seed);
  };
  for (const seed of ['sandbox-example', 'sandboxtemplate', 'sandboxwarmpool', 'getting-started']) await applySeed(seed);
  // The claim once the pool has its member: applied at once it could find the pool still empty and
  // (rightly) cold-start.
  const poolFull = async (): Promise<true | undefined> => ((await kube.kubectl(['get', 'swp', 'sandboxwarmpool-example'])).match(/sandboxwarmpool-example\s+1\s+1\s/) ? true : undefined);
  await waitFor('the pool ready', poolFull);
  await applySeed('sandboxclaim-v1beta1');

  // The Concepts page's Sandbox, in its own namespace: Ready, with its Pod (in the worker's
  // namespace, where every sandbox Pod lives) running on the node and its PVC bound to it.
  const example = await waitFor('sandbox-example Ready', async () => {
    const s = await get<SandboxJson>('sandbox', 'sandbox-example', 'sandbox-ns');
    return isReady(s) ? s : undefined;
  });
  assert.equal(example.status?.phase, 'Running');
  assert.match(await kube.kubectl(['get', 'sandbox', 'sandbox-example', '-n', 'sandbox-ns']), /sandbox-example\s+Running\s+True\s+DependenciesReady/);
  const pod = await get<PodJson>('pod', 'sandbox-example', 'default');
  assert.ok(pod !== undefined, 'the Sandbox has a Pod');
  assert.equal(pod.spec.nodeName, kubelet.nodeName);
  assert.equal(pod.status?.phase, 'Running');
  assert.deepEqual(example.status.podIPs, [pod.status.podIP]);
  // The podTemplate's labels reach the Pod; the volumeClaimTemplate became a PVC the Pod mounts.
  assert.equal(pod.metadata.labels?.sandbox, 'my-sandbox');
  assert.deepEqual(pod.spec.volumes?.find((v) => v.name === 'my-pvc')?.persistentVolumeClaim, { claimName: 'sandbox-example-my-pvc' });
  assert.ok((await get('pvc', 'sandbox-example-my-pvc', 'default')) !== undefined);

  // The warm-pool quickstart: template + pool + claim. The claim brings a volumeClaimTemplate of
  // its own (`workspace`, which the template's volumeClaimTemplatesPolicy: Overrides allows), and
  // no warm member can take a new volume: as upstream, the claim gets a sandbox of its own, cold,
  // with that volume, owned by the claim; the pool keeps its member.
  const claim = await waitFor('my-secure-sandbox Ready', async () => {
    const c = await get<ClaimJson>('sandboxclaim', 'my-secure-sandbox', 'default');
    return isReady(c) ? c : undefined;
  });
  assert.equal(claim.status?.launchType, 'cold');
  const boundName = claim.status.sandbox?.name ?? '';
  const bound = await get<SandboxJson>('sandbox', boundName, 'default');
  assert.ok(bound !== undefined && isReady(bound));
  assert.equal(bound.metadata.labels?.[LABEL.pool], undefined);
  assert.equal(bound.metadata.labels?.[LABEL.launchType], 'cold');
  assert.deepEqual(bound.metadata.ownerReferences?.map((o) => `${o.kind}/${o.name}`), ['SandboxClaim/my-secure-sandbox']);
  assert.ok((await get('pvc', `${boundName}-workspace`, 'default')) !== undefined, "the claim's own volume became a PVC");
  // kubectl exec into the claim's Pod: the template's user (uid 1000, fsGroup 2000) writes to that volume.
  const wrote = await kube.kubectl(['exec', boundName, '-n', 'default', '--', 'sh', '-c', 'id -u && echo kept > /workspace/note && cat /workspace/note']);
  assert.equal(wrote, '1000\nkept\n');
  assert.match(await kube.kubectl(['get', 'sandboxclaim', 'my-secure-sandbox']), new RegExp(`my-secure-sandbox\\s+True\\s+${boundName}\\s+SandboxReady`));
  await waitFor('the pool still full', poolFull);

  // The Getting Started Sandbox leaves `image:` for the reader to fill in: the CRD takes it, the
  // API server refuses a Pod without an image, so there is no Pod and the Sandbox is not Ready.
  const unready = await get<SandboxJson>('sandbox', 'my-sandbox', 'default');
  assert.ok(unready !== undefined && !isReady(unready));
  assert.equal(await get('pod', 'my-sandbox', 'default'), undefined);

  // Cleanup while the worker runs, so its finalizers are honoured: the Pods and PVCs go too.
  for (const seed of ['sandboxclaim-v1beta1', 'sandboxwarmpool', 'sandbox-example', 'getting-started']) {
    await kube.kubectl(['delete', '--wait=false', '-f', new URL(`test/fixtures/seeds/${seed}.yaml`, root).pathname]);
  }
  await waitFor('the seeds\' Pods gone', async () => ((await list<PodJson>('pods', 'default')).length === 0 ? true : undefined));
});

describe('one worker (--role=all) on the kube store and runtime', () => {
  const ns = 'e2e-claims';
  let w: WorkerProcess;
  before(async () => {
    await kube.kubectl(['create', 'namespace', ns]);
    w = await kubeWorker(undefined, { tag: 'k5sb', namespace: ns });
    await applyPool(w, ns, 'box', 3);
    await waitPoolReady(w, 'box', 3);
  });
  after(async () => {
    await stopped(w);
    removeDataDir(w.dataDir);
  });

  test('a claim through the worker API binds a warm member with one API-server write: its Pod stays the same, no Pod is made for it', async () => {
    const podsBefore = new Map((await list<PodJson>('pods', ns)).map((p) => [p.metadata.name, p.metadata.uid]));
    const updatesBefore = await writes(w, 'update');
    const res = await api<View>(w, 'POST', '/v1/sandboxes', { template: 'box' });
    const updatesAfter = await writes(w, 'update');
    assert.equal(res.status, 201, JSON.stringify(res.body));
    assert.equal(res.body.launchType, 'warm');
    assert.equal(res.body.ready, true);
    // The bind is one compare-and-swap update (refills are creates and status writes).
    assert.equal(updatesAfter - updatesBefore, 1);
    const id = res.body.id;
    assert.ok(podsBefore.has(id), 'the claimed sandbox was a running pool member');
    const pod = await get<PodJson>('pod', id, ns);
    assert.equal(pod?.metadata.uid, podsBefore.get(id), 'the same Pod, not a new one');
    // Every Pod made since is a replacement member, still in the pool.
    await waitPoolReady(w, 'box', 3);
    for (const p of await list<PodJson>('pods', ns)) {
      if (podsBefore.has(p.metadata.name)) continue;
      const s = await get<SandboxJson>('sandbox', p.metadata.name, ns);
      assert.equal(s?.metadata.labels?.[LABEL.pool], 'box', `new Pod ${p.metadata.name} belongs to a pool member`);
    }
    const sandbox = await get<SandboxJson>('sandbox', id, ns);
    assert.equal(sandbox?.metadata.labels?.[LABEL.owner], res.body.owner);
    const echo = await api<ExecOut>(w, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['echo', 'hello from a Pod'] });
    assert.deepEqual([echo.status, echo.body.stdout], [200, 'hello from a Pod\n']);
  });

  test('hibernate deletes the Pod and keeps the PVC; wake makes a new Pod on the same PVC, and the volume\'s file is there', async () => {
    const res = await api<View>(w, 'POST', '/v1/sandboxes', { template: 'box' });
    assert.equal(res.status, 201, JSON.stringify(res.body));
    const id = res.body.id;
    // Relative to the container's working directory, /: the PVC mounted at /home/user.
    const wrote = await api<ExecOut>(w, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['sh', '-c', 'echo kept > home/user/note'] });
    assert.equal(wrote.body.exitCode, 0, wrote.body.stderr);
    const podBefore = await get<PodJson>('pod', id, ns);
    const pvcBefore = await get<{ metadata: Meta }>('pvc', `${id}-home`, ns);
    assert.ok(podBefore !== undefined && pvcBefore !== undefined);

    const paused = await api<View>(w, 'POST', `/v1/sandboxes/${id}/pause`);
    assert.equal(paused.status, 200, JSON.stringify(paused.body));
    await waitFor('the Pod deleted', async () => ((await get('pod', id, ns)) === undefined ? true : undefined));
    await waitFor('Hibernated', async () => ((await get<SandboxJson>('sandbox', id, ns))?.status?.phase === 'Hibernated' ? true : undefined));
    assert.match(await kube.kubectl(['get', 'sandbox', id, '-n', ns]), new RegExp(`${id}\\s+Hibernated\\s+False\\s+SandboxSuspended`));
    assert.equal((await get<{ metadata: Meta }>('pvc', `${id}-home`, ns))?.metadata.uid, pvcBefore.metadata.uid, 'the PVC is kept');
    const whilePaused = await api<{ code: string }>(w, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['true'] });
    assert.equal(whilePaused.status, 409);

    const resumed = await api<View>(w, 'POST', `/v1/sandboxes/${id}/resume`, { wait: true });
    assert.equal(resumed.status, 200, JSON.stringify(resumed.body));
    assert.equal(resumed.body.ready, true);
    const podAfter = await get<PodJson>('pod', id, ns);
    assert.ok(podAfter !== undefined);
    assert.notEqual(podAfter.metadata.uid, podBefore.metadata.uid, 'a new Pod');
    assert.deepEqual(podAfter.spec.volumes?.find((v) => v.name === 'home')?.persistentVolumeClaim, { claimName: `${id}-home` });
    assert.equal((await get<{ metadata: Meta }>('pvc', `${id}-home`, ns))?.metadata.uid, pvcBefore.metadata.uid, 'on the same PVC');
    const read = await api<ExecOut>(w, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['cat', 'home/user/note'] });
    assert.deepEqual([read.status, read.body.stdout], [200, 'kept\n']);
  });

  test('a pause with memory is refused with 400 naming why (containerd\'s CRI restores no checkpoint), on runc and on gVisor, and the sandbox runs on: same Pod, no restart, its shell still counting in memory; a snapshot is refused with 501', async () => {
    // The count lives in the shell's variable; /tmp/n only shows it. A Pod made again (a pause
    // that fell back to files) would have neither the file nor the count.
    const counter = 'n=0; while :; do n=$((n+1)); echo $n > /tmp/n; sleep 0.2; done';
    const kinds = ['runc', 'gvisor'] as const;
    const objects = kinds.map((kind) => ({
      apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxTemplate', metadata: { name: `count-${kind}`, namespace: ns },
      spec: { podTemplate: { spec: { ...(kind === 'gvisor' ? { runtimeClassName: 'gvisor' } : {}), containers: [{ name: 'main', image: 'busybox', command: ['sh', '-c', counter] }] } } },
    }));
    const applied = await api(w, 'POST', '/v1/apply', { objects });
    assert.equal(applied.status, 200, JSON.stringify(applied.body));
    const count = async (id: string): Promise<number | undefined> => {
      const out = await api<ExecOut>(w, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['cat', '/tmp/n'] });
      return out.status === 200 && out.body.exitCode === 0 ? Number(out.body.stdout.trim()) : undefined;
    };
    await Promise.all(kinds.map(async (kind) => {
      const made = await api<View>(w, 'POST', '/v1/sandboxes', { template: `count-${kind}` });
      assert.equal(made.status, 201, JSON.stringify(made.body));
      const id = made.body.id;
      const before = await waitFor(`${kind}: ${id} counting`, () => count(id), 120_000);
      const podBefore = await get<PodJson & { status?: { containerStatuses?: { restartCount: number }[] } }>('pod', id, ns);

      const paused = await api<{ code: string; detail: string }>(w, 'POST', `/v1/sandboxes/${id}/pause`, { memory: true });
      assert.equal(paused.status, 400, `${kind}: ${JSON.stringify(paused.body)}`);
      assert.match(paused.body.detail, /cannot be paused with its memory, so it was not paused and keeps running/, kind);
      assert.match(paused.body.detail, new RegExp(`the Kubernetes tier cannot keep the memory of pod ${id} \\(left running\\): containerd's CRI \\(2\\.4\\) restores no checkpoint`), kind);
      assert.match(paused.body.detail, /gVisor's containerd shim implements neither checkpoint nor restore/, kind);
      assert.match(paused.body.detail, /mode="filesystem"/, kind);
      // gVisor keeps no memory here either, so the answer does not send the user there.
      assert.doesNotMatch(paused.body.detail, /run it on gVisor/, kind);

      const view = await api<View>(w, 'GET', `/v1/sandboxes/${id}`);
      assert.deepEqual([view.body.phase, view.body.ready], ['Running', true], `${kind}: ${JSON.stringify(view.body)}`);
      const podAfter = await get<PodJson & { status?: { containerStatuses?: { restartCount: number }[] } }>('pod', id, ns);
      assert.equal(podAfter?.metadata.uid, podBefore?.metadata.uid, `${kind}: the same Pod`);
      assert.equal(podAfter?.status?.containerStatuses?.[0]?.restartCount, 0, `${kind}: its container never restarted`);
      const after = await waitFor(`${kind}: ${id} counting on past ${before}`, async () => {
        const n = await count(id);
        return n !== undefined && n > before ? n : undefined;
      });
      assert.ok(after > before);

      const snap = await api<{ code: string; detail: string }>(w, 'POST', `/v1/sandboxes/${id}/snapshots`, { memory: true });
      assert.equal(snap.status, 501, `${kind}: ${JSON.stringify(snap.body)}`);
      assert.match(snap.body.detail, /keeps no snapshots \(on the Kubernetes tier containerd's CRI restores no checkpoint/, kind);
      assert.ok((await count(id) ?? 0) >= after, `${kind}: still counting after the refused snapshot`);
      assert.equal((await api(w, 'DELETE', `/v1/sandboxes/${id}`)).status < 300, true);
    }));
  });

  test('shutdownTime: with Delete the Sandbox, its Pod and its PVC go when the time comes; with Retain the Sandbox stays, Expired, without a Pod', async () => {
    const res = await api<View>(w, 'POST', '/v1/sandboxes', { template: 'box', timeoutMs: 1_500 });
    assert.equal(res.status, 201, JSON.stringify(res.body));
    const id = res.body.id;
    // No policy named: Delete, as in k8s-sigs.
    const sandbox = await get<SandboxJson>('sandbox', id, ns);
    assert.ok(sandbox?.spec.lifecycle?.shutdownTime !== undefined);
    assert.equal(sandbox.spec.lifecycle.shutdownPolicy, undefined);
    await waitFor('the Sandbox deleted', async () => ((await get('sandbox', id, ns)) === undefined ? true : undefined), 30_000);
    await waitFor('its Pod and PVC deleted', async () => ((await get('pod', id, ns)) === undefined && (await get('pvc', `${id}-home`, ns)) === undefined ? true : undefined), 30_000);

    // Retain, set with kubectl as a user would: the object stays as a record.
    const kept = await api<View>(w, 'POST', '/v1/sandboxes', { template: 'box' });
    const keptId = kept.body.id;
    const soon = new Date(Date.now() + 1_000).toISOString();
    await kube.kubectl(['patch', 'sandbox', keptId, '-n', ns, '--type=merge', '-p', JSON.stringify({ spec: { lifecycle: { shutdownTime: soon, shutdownPolicy: 'Retain' } } })]);
    await waitFor('Expired', async () => ((await get<SandboxJson>('sandbox', keptId, ns))?.status?.phase === 'Expired' ? true : undefined), 30_000);
    await waitFor('its Pod deleted', async () => ((await get('pod', keptId, ns)) === undefined ? true : undefined), 30_000);
    assert.ok((await get('sandbox', keptId, ns)) !== undefined);
  });
});

/** Claims through the API at once; the acknowledged ones (201) by id, the rest as the error each got. */
async function burst(w: WorkerProcess, template: string, n: number): Promise<{ ids: string[]; failed: number }> {
  const results = await Promise.all(
    Array.from({ length: n }, () => api<View>(w, 'POST', '/v1/sandboxes', { template, wait: false }).then(
      (r) => (r.status === 201 ? r.body.id : undefined),
      () => undefined, // the connection died with the worker: not acknowledged
    )),
  );
  const ids = results.filter((id) => id !== undefined);
  return { ids, failed: n - ids.length };
}

async function healthz(w: WorkerProcess): Promise<{ leader: boolean; identity: string; holder: string }> {
  return (await (await fetch(`${w.apiUrl}/healthz`)).json()) as { leader: boolean; identity: string; holder: string };
}

async function lease(name: string, namespace: string): Promise<{ holder: string; transitions: number }> {
  const l = await get<{ spec: { holderIdentity?: string; leaseTransitions?: number } }>('lease', name, namespace);
  return { holder: l?.spec.holderIdentity ?? '', transitions: l?.spec.leaseTransitions ?? 0 };
}

test('operator restart: kill -9 during a burst of claims, start again: every acknowledged claim is bound exactly once, no sandbox twice; of two operator processes one leads, and when it is killed the other takes over', async (t) => {
  const ns = 'e2e-restart';
  const tag = 'k5se';
  await kube.kubectl(['create', 'namespace', ns]);
  const dataDir = tempDataDir(tag);
  t.after(() => removeDataDir(dataDir));
  const first = await kubeWorker(t, { tag, namespace: ns, dataDir });
  await applyPool(first, ns, 'burst', 20);
  await waitPoolReady(first, 'burst', 20);

  // SandboxClaims too (the claim controller's path), applied with kubectl around the kill.
  const claimNames = Array.from({ length: 8 }, (_, i) => `restart-claim-${i}`);
  const claimObjects = claimNames.map((name) => ({ apiVersion: 'extensions.agents.x-k8s.io/v1beta1', kind: 'SandboxClaim', metadata: { name, namespace: ns }, spec: { warmPoolRef: { name: 'burst' } } }));
  const applyClaims = kube.kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: claimObjects }));
  // Four clients claim one after another until the worker dies under them: killed once five
  // claims are answered, with the next ones in flight.
  const before1 = { ids: [] as string[], failed: 0 };
  let killing = false;
  // A call, not the variable: its value changes across the awaits below.
  const dying = (): boolean => killing;
  const client = async (): Promise<void> => {
    for (let i = 0; i < 25 && !dying(); i++) {
      try {
        const r = await api<View>(first, 'POST', '/v1/sandboxes', { template: 'burst', wait: false });
        assert.equal(r.status, 201, JSON.stringify(r.body));
        before1.ids.push(r.body.id);
      } catch (err) {
        if (!dying()) throw err;
        before1.failed++; // the connection died with the worker: not acknowledged
        return;
      }
    }
  };
  const clients = Promise.all(Array.from({ length: 4 }, client));
  await waitFor('five claims answered', () => Promise.resolve(before1.ids.length >= 5 ? true : undefined), 30_000, 1);
  killing = true;
  await killed(first.proc);
  await clients;
  await applyClaims;

  const second = await kubeWorker(t, { tag, namespace: ns, dataDir });
  const after1 = await burst(second, 'burst', 10);
  assert.equal(after1.failed, 0);
  const acknowledged = [...before1.ids, ...after1.ids];
  t.diagnostic(`${before1.ids.length} claims acknowledged before the kill, ${before1.failed} lost with it, ${after1.ids.length} after the restart`);

  // Every SandboxClaim is bound, to a sandbox of its own.
  const claims = await waitFor('every SandboxClaim Ready', async () => {
    const all = await list<ClaimJson>('sandboxclaims', ns);
    return all.length === claimNames.length && all.every(isReady) ? all : undefined;
  }, 60_000);
  const sandboxes = new Map((await list<SandboxJson>('sandboxes', ns)).map((s) => [s.metadata.name, s]));
  const claimed = claims.map((c) => c.status?.sandbox?.name ?? '');
  const all = [...acknowledged, ...claimed];
  assert.equal(new Set(all).size, all.length, `a sandbox answered twice: ${JSON.stringify(all)}`);
  for (const id of acknowledged) {
    const s = sandboxes.get(id);
    assert.ok(s !== undefined, `acknowledged ${id} exists`);
    assert.equal(s.metadata.labels?.[LABEL.pool], undefined, `${id} left the pool`);
    assert.ok(s.metadata.labels?.[LABEL.owner] !== undefined, `${id} has an owner`);
    assert.equal(s.metadata.ownerReferences?.some((o) => o.kind === 'SandboxClaim') ?? false, false, `${id} is no SandboxClaim's`);
  }
  for (const c of claims) {
    const s = sandboxes.get(c.status?.sandbox?.name ?? '');
    assert.deepEqual(s?.metadata.ownerReferences?.filter((o) => o.kind === 'SandboxClaim').map((o) => o.uid), [c.metadata.uid], `${c.metadata.name}'s sandbox is its alone`);
  }
  await stopped(second);

  // The deployment's split: two operator processes and an API process, one cluster (one tag),
  // each with its ServiceAccount from clusters/base/rbac: the least privilege they get is enough.
  await kube.kubectl(['create', 'namespace', SYSTEM_NAMESPACE]);
  await kube.kubectl(['apply', '-k', new URL('clusters/base/rbac', root).pathname, '-n', SYSTEM_NAMESPACE]);
  const [operatorAccount, apiAccount] = [await serviceAccountKubeconfig('operator'), await serviceAccountKubeconfig('worker-api')];
  // In a federation: the Lease holder's sync agent links to the hub, and the API process, whose
  // route feed tells the routers whether to send creates to the hub, follows that link.
  const hubArgs = await federated(t, tag);
  const ops = [await kubeWorker(t, { tag, namespace: ns, role: 'operator', kubeconfig: operatorAccount, extraArgs: hubArgs }), await kubeWorker(t, { tag, namespace: ns, role: 'operator', kubeconfig: operatorAccount, extraArgs: hubArgs })];
  const apiOnly = await kubeWorker(t, { tag, namespace: ns, role: 'api', kubeconfig: apiAccount, extraArgs: hubArgs });
  // The Lease lives in the kubeconfig context's namespace (in a Pod: the Pod's own).
  const leaseName = `asb-operator-${tag}`;
  const leaderOf = async (): Promise<WorkerProcess | undefined> => {
    const states = await Promise.all(ops.map(healthz));
    const leading = ops.filter((_, i) => states[i]?.leader === true);
    assert.ok(leading.length <= 1, `two operators lead at once: ${JSON.stringify(states)}`);
    return leading[0];
  };
  const leader = await waitFor('one operator leads', leaderOf, 30_000);
  const other = ops.find((o) => o !== leader) as WorkerProcess;
  const [leaderState, otherState] = [await healthz(leader), await healthz(other)];
  assert.equal((await lease(leaseName, SYSTEM_NAMESPACE)).holder, leaderState.identity);
  assert.equal(otherState.leader, false);
  assert.equal(otherState.holder, leaderState.identity);
  // The API process claims; the leader's controllers refill.
  const viaApi = await api<View>(apiOnly, 'POST', '/v1/sandboxes', { template: 'burst' });
  assert.deepEqual([viaApi.status, viaApi.body.launchType], [201, 'warm']);
  await waitPoolReady(apiOnly, 'burst', 20);
  // The API process serves no controllers and the operators no API.
  assert.equal((await api(leader, 'GET', '/v1/sandboxes')).status, 404);
  // The hub link is the leader's, seen by the API process through the SyncState, up and down.
  const hubLink = async (want: boolean): Promise<true | undefined> => ((await api<{ sync?: { connected: boolean } }>(apiOnly, 'GET', '/v1/status')).body.sync?.connected === want ? true : undefined);
  await waitFor('the API process sees the hub link up', () => hubLink(true), 30_000, 100);
  await hubArgs.hub.stop();
  await waitFor('the API process sees the hub link down', () => hubLink(false), 30_000, 100);

  const transitions = (await lease(leaseName, SYSTEM_NAMESPACE)).transitions;
  await killed(leader.proc);
  await waitFor('the other operator leads', async () => ((await healthz(other)).leader ? true : undefined), 60_000, 200);
  const taken = await lease(leaseName, SYSTEM_NAMESPACE);
  assert.equal(taken.holder, otherState.identity);
  assert.equal(taken.transitions, transitions + 1);
  // Its controllers run: a claim's member is replaced again.
  const afterTakeover = await api<View>(apiOnly, 'POST', '/v1/sandboxes', { template: 'burst' });
  assert.deepEqual([afterTakeover.status, afterTakeover.body.launchType], [201, 'warm']);
  await waitPoolReady(apiOnly, 'burst', 20);

  // The idle clock is the operator's, the activity the API process's: it reaches the operator
  // through the sandbox (the bind, then the activity annotation). A member ready for a while,
  // claimed with a 4 s idle timeout and used through the API for 8 s, keeps running; left alone
  // it hibernates.
  const idle = await api<View>(apiOnly, 'POST', '/v1/sandboxes', { template: 'burst', idleTimeoutMs: 4_000 });
  assert.deepEqual([idle.status, idle.body.launchType], [201, 'warm']);
  for (let i = 0; i < 8; i++) {
    const out = await api<ExecOut>(apiOnly, 'POST', `/v1/sandboxes/${idle.body.id}/exec`, { command: ['true'] });
    assert.equal(out.status, 200, `exec ${i}: ${JSON.stringify(out.body)}`);
    await new Promise((r) => setTimeout(r, 1_000));
  }
  assert.equal((await get<SandboxJson>('sandbox', idle.body.id, ns))?.status?.phase, 'Running');
  await waitFor('idle: Hibernated', async () => ((await get<SandboxJson>('sandbox', idle.body.id, ns))?.status?.phase === 'Hibernated' ? true : undefined), 30_000, 200);

  // The cluster's lifecycle events are the leading operator's log (its volume in clusters/base):
  // an API process with --events-url passes its events API on there, in both shapes, with the
  // caller's key; the log outlives a kill -9 of the operator that keeps it.
  const front = await kubeWorker(t, { tag, namespace: ns, role: 'api', kubeconfig: apiAccount, extraArgs: ['--events-url', other.apiUrl] });
  const idleEvents = async (): Promise<string[] | undefined> => {
    const res = await api<{ type: string }[]>(front, 'GET', `/v1/events/sandboxes/${idle.body.id}?orderAsc=true&limit=100`);
    return res.status === 200 ? res.body.map((e) => e.type) : undefined;
  };
  const told = await waitFor('the idle sandbox\'s events through the API process', async () => ((await idleEvents())?.includes('sandbox.lifecycle.paused') === true ? idleEvents() : undefined), 30_000, 200);
  assert.deepEqual(told.slice(0, 1), ['sandbox.lifecycle.created'], told.join(', '));
  const e2bEvents = await fetch(`${front.apiUrl}/events/sandboxes/${idle.body.id}?types=sandbox.lifecycle.paused`, { headers: { 'x-api-key': front.adminKey } });
  assert.equal(e2bEvents.status, 200);
  assert.deepEqual(((await e2bEvents.json()) as { type: string; sandboxId: string }[]).map((e) => [e.type, e.sandboxId]), [['sandbox.lifecycle.paused', idle.body.id]]);
  // Disabled: registered and listed, never delivered (its URL is nowhere this test may reach).
  const hook = await api<{ id: string }>(front, 'POST', '/v1/events/webhooks', { name: 'ops', url: 'https://hooks.example.com/asb', signatureSecret: 'whsec-0123456789abcdef', enabled: false });
  assert.equal(hook.status, 201, JSON.stringify(hook.body));
  const otherPort = new URL(other.apiUrl).port;
  await killed(other.proc);
  const down = await api(front, 'GET', `/v1/events/sandboxes/${idle.body.id}`);
  assert.equal(down.status, 503, 'the operator is away: 503, not an empty answer');
  // Back on the same volume (a Pod's PVC) and address (its Service), it leads again.
  const back = await kubeWorker(t, { tag, namespace: ns, role: 'operator', kubeconfig: operatorAccount, dataDir: other.dataDir, extraArgs: ['--port', otherPort] });
  await waitFor('the restarted operator leads', async () => ((await healthz(back)).leader ? true : undefined), 60_000, 200);
  assert.deepEqual((await idleEvents())?.slice(0, told.length), told, 'every event kept');
  const hooks = await api<{ id: string; enabled: boolean }[]>(front, 'GET', '/v1/events/webhooks');
  assert.deepEqual(hooks.body.map((h) => [h.id, h.enabled]), [[hook.body.id, false]]);
});
