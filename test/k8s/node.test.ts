// What only a real node shows (test/support/kube-node.ts): a readiness probe run by the
// kubelet gates Ready, a sandbox's PVC is bound to a real PersistentVolume whose directory holds
// the data, a `gvisor` RuntimeClass Pod runs under gVisor's kernel while the default one runs on
// the host's, the host reaches a pod IP over the pod bridge (what the router dials), and the node
// takes back every change it made to the host when it stops.
//
// Not here: NetworkPolicy. The node's CNI is the reference bridge plugin, which does not enforce
// policy (a NetworkPolicy object is accepted and has no effect); the README says so.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test, type TestContext } from 'node:test';
import { createKubeRuntime, type KubePodRuntime } from '../../src/runtime/kube/kube-runtime.ts';
import type { PodRequest, PodState } from '../../src/runtime/runtime.ts';
import { silentLogger } from '../../src/base/log.ts';
import { startKubeApiServer, type KubeApiServer } from '../support/kube-apiserver.ts';
import { NODE_SLOT_B, startKubeCluster, startKubeNode, type KubeCluster, type KubeNode } from '../support/kube-node.ts';
import { cgroupHierarchies, KUBELET_SYSCTLS } from '../support/node-host.ts';
import { KUBELET_SUBIDS, kubeletSubidsSeen } from '../support/kubelet-subids.ts';
import { waitFor } from '../support/wait.ts';

const text = (bytes: Uint8Array): string => Buffer.from(bytes).toString('utf8');

describe('on the real node', () => {
  let kube: KubeApiServer;
  let node: KubeNode;
  before(async () => {
    kube = await startKubeApiServer({ etcdUnsafeNoFsync: true });
    node = await startKubeNode(kube);
  });
  after(async () => {
    await node.stop();
    await kube.stop();
  });

  let nsCount = 0;
  async function runtimeIn(t: TestContext): Promise<KubePodRuntime> {
    const ns = `node-test-${++nsCount}`;
    await kube.kubectl(['create', 'namespace', ns]);
    const runtime = await createKubeRuntime({ kubeconfig: kube.kubeconfigPath, namespace: ns, log: silentLogger() });
    t.after(() => runtime.close());
    return runtime;
  }

  function request(id: string, ns: string, spec: Partial<PodRequest['spec']> & { containers?: PodRequest['spec']['containers'] } = {}): PodRequest {
    return {
      id, uid: `uid-${id}`, namespace: ns, hostname: id,
      spec: { containers: [{ name: 'main', image: 'agent-sandbox/base' }], ...spec },
    };
  }

  const stateOf = (runtime: KubePodRuntime, id: string, want: (s: PodState) => boolean, what: string, timeoutMs = 60_000): Promise<PodState> =>
    waitFor(`${id}: ${what} (now ${JSON.stringify(runtime.state(id))})`, () => Promise.resolve(want(runtime.state(id)) ? runtime.state(id) : undefined), timeoutMs, 100);

  test('a readiness probe gates Ready: Running but not ready until the probe passes, then ready', async (t) => {
    const runtime = await runtimeIn(t);
    const probe = { exec: { command: ['test', '-f', '/tmp/ready'] }, periodSeconds: 1, failureThreshold: 1 };
    await runtime.start(request('rp1', runtime.namespace, { containers: [{ name: 'main', image: 'agent-sandbox/base', readinessProbe: probe }] }));
    await stateOf(runtime, 'rp1', (s) => s.phase === 'Running', 'Running');
    // Three probe periods later it is still not ready: the kubelet ran the probe and it failed.
    for (let i = 0; i < 3; i++) {
      await runtime.exec('rp1', { command: ['sleep', '1'] });
      assert.equal(runtime.state('rp1').ready, false, `not ready while /tmp/ready is missing (${i + 1} s)`);
    }
    await runtime.exec('rp1', { command: ['touch', '/tmp/ready'] });
    await stateOf(runtime, 'rp1', (s) => s.phase === 'Running' && s.ready, 'ready once the probe passes', 30_000);
  });

  test('a sandbox\'s PVC is bound to a local PersistentVolume: what the Pod writes is in that volume\'s directory on the node, and stays there when the Pod is deleted', async (t) => {
    const runtime = await runtimeIn(t);
    const req: PodRequest = {
      ...request('pv1', runtime.namespace, { containers: [{ name: 'main', image: 'agent-sandbox/base', volumeMounts: [{ name: 'data', mountPath: '/data' }] }] }),
      volumeClaimTemplates: [{ metadata: { name: 'data' }, spec: { accessModes: ['ReadWriteOnce'], resources: { requests: { storage: '1Gi' } } } }],
    };
    await runtime.start(req);
    await stateOf(runtime, 'pv1', (s) => s.phase === 'Running' && s.ready, 'Running and ready');
    await runtime.writeFile('pv1', '/data/note.txt', new TextEncoder().encode('on the volume'));

    const pvc = JSON.parse(await kube.kubectl(['get', 'pvc', 'pv1-data', '-n', runtime.namespace, '-o', 'json'])) as { spec: { volumeName?: string }; status: { phase: string } };
    assert.equal(pvc.status.phase, 'Bound');
    assert.match(pvc.spec.volumeName ?? '', /^asb-local-\d+$/);
    const pv = JSON.parse(await kube.kubectl(['get', 'pv', pvc.spec.volumeName ?? '', '-o', 'json'])) as { spec: { local: { path: string } }; status: { phase: string } };
    assert.equal(pv.status.phase, 'Bound');
    assert.equal(readFileSync(join(pv.spec.local.path, 'note.txt'), 'utf8'), 'on the volume');

    await runtime.stop('pv1');
    assert.equal(readFileSync(join(pv.spec.local.path, 'note.txt'), 'utf8'), 'on the volume', 'the data outlives the Pod');
  });

  test('runtimeClassName gvisor runs the Pod under gVisor\'s kernel (runsc through its containerd shim); without it the Pod runs on the host kernel (runc)', async (t) => {
    const runtime = await runtimeIn(t);
    await runtime.start(request('gv1', runtime.namespace, { runtimeClassName: 'gvisor' }));
    await runtime.start(request('rc1', runtime.namespace));
    await stateOf(runtime, 'gv1', (s) => s.phase === 'Running' && s.ready, 'Running and ready');
    await stateOf(runtime, 'rc1', (s) => s.phase === 'Running' && s.ready, 'Running and ready');
    const hostKernel = readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim();
    const kernelOf = async (id: string): Promise<string> => text((await runtime.exec(id, { command: ['cat', '/proc/sys/kernel/osrelease'] })).stdout).trim();
    assert.equal(await kernelOf('rc1'), hostKernel);
    const gvisorKernel = await kernelOf('gv1');
    assert.notEqual(gvisorKernel, hostKernel);
    // gVisor's sentry writes its own boot log; no host kernel does.
    assert.match(text((await runtime.exec('gv1', { command: ['dmesg'] })).stdout), /Starting gVisor/);
  });

  test('the host reaches a pod by its IP over the pod bridge (what the router dials): an HTTP server in the Pod answers', async (t) => {
    const runtime = await runtimeIn(t);
    const server = ['python3', '-c', 'import http.server as h; h.HTTPServer(("0.0.0.0", 8080), type("H", (h.BaseHTTPRequestHandler,), {"do_GET": lambda s: (s.send_response(200), s.end_headers(), s.wfile.write(b"from the pod"))})).serve_forever()'];
    await runtime.start(request('ip1', runtime.namespace, { containers: [{ name: 'main', image: 'python:3.11', command: server, ports: [{ containerPort: 8080 }] }] }));
    const state = await stateOf(runtime, 'ip1', (s) => s.phase === 'Running' && s.ready && s.ip !== undefined, 'Running with an IP');
    assert.match(state.ip ?? '', /^10\.246\./);
    const body = await waitFor('the pod\'s server', async () => {
      const res = await fetch(`http://${state.ip ?? ''}:8080/`).catch(() => undefined);
      return res?.status === 200 ? res.text() : undefined;
    }, 30_000, 200);
    assert.equal(body, 'from the pod');
  });
});

test('stopping the node takes back what it changed on the host: no pod processes, mounts, cgroups or bridge are left, and the kubelet\'s sysctls are restored', async () => {
  const sysctls = (): Record<string, string> => Object.fromEntries(KUBELET_SYSCTLS.map((k) => [k, readFileSync(`/proc/sys/${k}`, 'utf8').trim()]));
  const before = sysctls();
  const kube = await startKubeApiServer({ etcdUnsafeNoFsync: true });
  try {
    const node = await startKubeNode(kube);
    const runtime = await createKubeRuntime({ kubeconfig: kube.kubeconfigPath, namespace: 'default', log: silentLogger() });
    try {
      await runtime.start({ id: 'td1', uid: 'uid-td1', namespace: 'default', hostname: 'td1', spec: { runtimeClassName: 'gvisor', containers: [{ name: 'main', image: 'agent-sandbox/base' }] } });
      await runtime.start({ id: 'td2', uid: 'uid-td2', namespace: 'default', hostname: 'td2', spec: { containers: [{ name: 'main', image: 'agent-sandbox/base' }] } });
      await waitFor('both pods running', () => Promise.resolve(['td1', 'td2'].every((id) => runtime.state(id).phase === 'Running') ? true : undefined), 60_000, 100);
    } finally {
      await runtime.close();
    }
    // While it runs, the kubelet has changed the sysctls (real-node.md §4) and made its cgroups.
    assert.equal(sysctls()['vm/overcommit_memory'], '1');
    // Its Pods' user namespaces come from the kubelet user's ids at 2^31, apart from the local runtime's pool.
    assert.equal(kubeletSubidsSeen(), `0: kubelet ${String(KUBELET_SUBIDS.start)} ${String(KUBELET_SUBIDS.count)}`);
    const stateDirs = readdirSync('/tmp').filter((e) => e.startsWith('asb-node-'));
    assert.equal(stateDirs.length, 1);
    const name = stateDirs[0] ?? '';
    assert.ok(cgroupHierarchies().some((h) => existsSync(join(h, name, 'kubepods'))), 'the pods\' cgroups are under the node\'s cgroupRoot');
    await node.stop();

    assert.deepEqual(sysctls(), before, 'the sysctls are back');
    // The kubelet user goes with the last node on the machine (another test process's node on the other slot keeps it).
    const otherNodes = readdirSync('/tmp').filter((e) => e.startsWith('asb-node-') || e.startsWith('asb-nodeb-'));
    if (otherNodes.length === 0) assert.equal(kubeletSubidsSeen(), undefined, 'the kubelet user and its ids are gone');
    assert.equal(existsSync(join('/tmp', name)), false, 'the node\'s directory is gone');
    assert.deepEqual(cgroupHierarchies().filter((h) => existsSync(join(h, name))), [], 'no cgroup is left');
    assert.equal(readFileSync('/proc/self/mountinfo', 'utf8').includes(name), false, 'no mount is left');
    assert.throws(() => execFileSync('ip', ['link', 'show', 'asbkn0'], { stdio: 'pipe' }), 'the bridge is gone');
    const leftovers = readdirSync('/proc').filter((p) => /^\d+$/.test(p)).filter((p) => {
      try {
        return readFileSync(`/proc/${p}/cmdline`, 'utf8').includes(name);
      } catch {
        return false;
      }
    });
    assert.deepEqual(leftovers, [], 'no shim or pod process is left');
  } finally {
    await kube.stop();
  }
});

test('clusters with Services on both node slots: each kube-proxy has tables of its own, forwarding is fenced to the pod networks, and stopping them takes back those tables, the namespace, its link and route, and leaves ip_forward as it was', async () => {
  const forwarding = readFileSync('/proc/sys/net/ipv4/ip_forward', 'utf8');
  const nft = (args: string[]): string => execFileSync('nft', args, { encoding: 'utf8' });
  const first = await startKubeCluster({ etcdUnsafeNoFsync: true });
  let second: KubeCluster | undefined;
  try {
    second = await startKubeCluster({ etcdUnsafeNoFsync: true, slot: NODE_SLOT_B });
    assert.match(nft(['list', 'tables']), /table ip kube-proxy/, 'the first node\'s kube-proxy writes the host\'s tables');
    // What comes in on a pod-side interface may go only to the pod networks: the drop rule is there before forwarding is on.
    for (const table of ['asb-fwd-asbkn0', 'asb-fwd-asbknb0']) assert.match(nft(['list', 'table', 'inet', table]), /counter packets \d+ bytes \d+ drop/, table);
    const inB = execFileSync('ip', ['netns', 'exec', 'asbknb', 'nft', 'list', 'tables'], { encoding: 'utf8' });
    assert.match(inB, /table ip kube-proxy/, 'the second node\'s kube-proxy has tables of its own, in its namespace');
    assert.equal(second.node.nodeIp, NODE_SLOT_B.nodeIp);
    // Each API server serves Pods at the address its node reaches, with the `kubernetes` Service pointing there.
    const endpoints = JSON.parse(await second.kube.kubectl(['get', 'endpointslices', '-l', 'kubernetes.io/service-name=kubernetes', '-o', 'json'])) as { items: { endpoints: { addresses: string[] }[] }[] };
    assert.deepEqual(endpoints.items[0]?.endpoints[0]?.addresses, [NODE_SLOT_B.netns?.hostIp]);
    assert.equal(readFileSync('/proc/sys/net/ipv4/ip_forward', 'utf8'), forwarding, 'the host\'s ip_forward is untouched while they run');
  } finally {
    await second?.stop();
    await first.stop();
  }
  assert.doesNotMatch(nft(['list', 'tables']), /kube-proxy|asb-fwd-/, 'kube-proxy\'s tables and ours are gone');
  assert.doesNotMatch(execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' }), /asbknb/, 'the namespace is gone');
  assert.doesNotMatch(execFileSync('ip', ['route'], { encoding: 'utf8' }), /10\.210\./, 'the route to its Pods is gone');
  for (const link of ['asbkn0', 'asbknb0']) assert.throws(() => execFileSync('ip', ['link', 'show', link], { stdio: 'pipe' }), `${link} is gone`);
  assert.equal(readFileSync('/proc/sys/net/ipv4/ip_forward', 'utf8'), forwarding);
});
