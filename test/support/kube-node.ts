// A real Kubernetes node for the Kubernetes test tier, registered with a KubeApiServer of
// kube-apiserver.ts: the kubelet on containerd (CRI) with runc, CNI bridge networking, a `gvisor`
// RuntimeClass on gVisor's shim, kube-scheduler and kube-controller-manager (a Pod of ours names no
// node, and PVC binding, garbage collection and namespace deletion are theirs), and static local
// PersistentVolumes. All built by scripts/kube-node-build.sh into .tools/kube-node; the exact
// configuration is the one real-node.md's probe measured on this machine.
//
// Pods pull the same images from the same loopback registry as the local runtime
// (test-images.ts): containerd's hosts.toml makes it docker.io's plain-HTTP mirror. The pause image
// is imported with ctr and pinned, so nothing is pulled for a sandbox and image GC keeps it.
//
// One node at a time on the machine (a lock under the temp dir): the kubelet writes host sysctls,
// a few fixed paths and the pod bridge, so a second node would fight over them; another test
// process waits for the first's teardown. The node takes everything back at stop(), or at exit
// (node-host.ts); a node whose test process was SIGKILLed is swept by the next one.
//
// ASB_KUBE_NODE=test-kubelet runs our test kubelet (test-kubelet.ts) instead, on a machine that
// cannot run a kubelet (no root, no cgroups): it binds and "runs" Pods as host directories.
import { spawn, type ChildProcess } from 'node:child_process';
import { Resolver } from 'node:dns/promises';
import { chmodSync, closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { connect, createServer, type AddressInfo, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { stringify } from 'yaml';
import { AsbError } from '../../src/errors.ts';
import { acquireOwnerLockWaiting, type OwnerLock } from '../../src/store/owner-lock.ts';
import { podMac } from '../../src/runtime/local/network.ts';
import { freePort } from '../../src/assembly/local-system.ts';
import { diesWithTest, KUBE_NODE_IP, KUBE_NODE_NAME, KUBERNETES_SERVICE_IP, logTail, startKubeApiServer, type KubeApiServer } from './kube-apiserver.ts';
import { cgroupHierarchies, forwardTableOf, isDir, recordHost, releaseNodeHost, type NodeHostState } from './node-host.ts';
import { ensureKubeletSubids, releaseKubeletSubids } from './kubelet-subids.ts';
import { startTestKubelet } from './test-kubelet.ts';
import { testImages } from './test-images.ts';

const repoRoot = resolve(import.meta.dirname, '../..');
/** Where scripts/kube-node-build.sh puts the node's binaries, CNI plugins and pause image. */
export const KUBE_NODE_DIR = join(repoRoot, '.tools/kube-node');
const RUNC = join(repoRoot, '.tools/runc/bin/runc');
const RUNSC = join(repoRoot, '.tools/runsc/bin/runsc');

/**
 * Where a node lives on the machine. The first slot is the host's own network: bridge asbkn0,
 * pod CIDR 10.246.0.0/16, the host at 10.246.0.1 (the node's InternalIP, where the kubelet
 * listens for the API server, and the Pods' gateway). No other test uses 10.246/16.
 */
export interface NodeSlot {
  readonly name: string;
  /** Under the temp dir: one node per slot at a time. */
  readonly lockName: string;
  readonly statePrefix: string;
  readonly bridge: string;
  /** The bridge's subnet, and the Pods' IPAM range. */
  readonly podCidr: string;
  /** The node's address on the bridge: its InternalIP and the Pods' gateway. */
  readonly nodeIp: string;
  /**
   * A second node has the network namespace of its own that a second machine would have, since
   * kube-proxy's nftables tables and the kubelet's node IP are per network: containerd, the
   * kubelet, kube-proxy and CoreDNS run in it (nsenter --net: the mounts stay the host's, which
   * containerd and the kubelet share). A veth pair joins it to the host (hostIp/30 ↔ nsIp/30);
   * the host routes the pod CIDR through it, and the node's API server listens on hostIp.
   */
  readonly netns?: { name: string; hostVeth: string; nsVeth: string; hostIp: string; nsIp: string };
}

export const NODE_SLOT_A: NodeSlot = { name: 'a', lockName: 'asb-kube-node', statePrefix: 'asb-node-', bridge: 'asbkn0', podCidr: '10.246.0.0/16', nodeIp: KUBE_NODE_IP };
/** A second node (a second cluster's): 10.210.0.0/17 for Pods, 10.210.255.0/30 for the link to the host. No other test uses 10.210/16. */
export const NODE_SLOT_B: NodeSlot = {
  name: 'b', lockName: 'asb-kube-node-b', statePrefix: 'asb-nodeb-', bridge: 'asbkn1', podCidr: '10.210.0.0/17', nodeIp: '10.210.0.1',
  netns: { name: 'asbknb', hostVeth: 'asbknb0', nsVeth: 'asbknb1', hostIp: '10.210.255.1', nsIp: '10.210.255.2' },
};
/** Every slot's state directory prefix: while a directory of one is in the temp dir, a node may be using the kubelet user (kubelet-subids.ts). */
const NODE_STATE_PREFIXES = [NODE_SLOT_A.statePrefix, NODE_SLOT_B.statePrefix];
/** Service names under startKubeCluster's CoreDNS: <service>.<namespace>.svc.cluster.local. */
export const CLUSTER_DOMAIN = 'cluster.local';
const PAUSE_IMAGE = 'localhost/asb-pause:1';
/**
 * Static local PersistentVolumes made at start, one directory each (mode 0777: the sandbox image
 * runs as uid 1000). Retain: a PVC's deletion leaves its PV Released, never reused, so this is
 * the most PVCs one test process may create; e2e.test.ts's restart test alone makes ~90 (a pool
 * of 20, refilled after ~40 claims, and the split roles' claims).
 */
const PV_COUNT = 200;
/**
 * The StorageClass kubernetes-sigs' warm-pool quick start claims its volume from
 * (examples/warmpool-quickstart/sandbox-claim.yaml: storageClassName dynamic-rwo). Here it is a
 * class with no provisioner over the first CLASSED_PVS static PVs, so the quick start binds as written.
 */
const QUICKSTART_CLASS = 'dynamic-rwo';
const CLASSED_PVS = 10;
/** A node's lock is waited for this long (another test process's node tearing down). */
const LOCK_WAIT_MS = 10 * 60_000;
/** containerd up, kubelet registered and Ready: ~2 s here; 90 s under a loaded 2-core machine. */
const READY_TIMEOUT_MS = 90_000;
/** Pods whose runtimeClassName is gvisor run under runsc through gVisor's containerd shim (handler runsc in containerd.toml). */
const GVISOR_RUNTIME_CLASS = { apiVersion: 'node.k8s.io/v1', kind: 'RuntimeClass', metadata: { name: 'gvisor' }, handler: 'runsc' };

export interface KubeNode {
  /** 'real' (the kubelet) or 'test-kubelet' (ASB_KUBE_NODE=test-kubelet). */
  readonly kind: 'real' | 'test-kubelet';
  readonly nodeName: string;
  /** Pod IPs are taken from here (the test kubelet hands out 127.77/16). */
  readonly podCidr: string;
  /** The node's InternalIP (real node only). */
  readonly nodeIp?: string;
  /** The pods' StorageClass-less PVCs bind to these static PVs (real node only; 0 on the test kubelet, which links claim dirs). */
  readonly persistentVolumes: number;
  /** Ends the node and takes back all it left on the host. Idempotent. */
  stop(): Promise<void>;
}

/** The node of the environment's choice: the real kubelet, or the test kubelet when ASB_KUBE_NODE=test-kubelet. */
export async function startKubeNode(kube: KubeApiServer): Promise<KubeNode> {
  const choice = process.env.ASB_KUBE_NODE ?? 'real';
  if (choice === 'test-kubelet') {
    const fake = await startTestKubelet(kube);
    // runtimeClassName must name a RuntimeClass (admission refuses the Pod otherwise); the test kubelet ignores the handler.
    await kube.kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [GVISOR_RUNTIME_CLASS, {
      apiVersion: 'storage.k8s.io/v1', kind: 'StorageClass', metadata: { name: QUICKSTART_CLASS },
      provisioner: 'kubernetes.io/no-provisioner', volumeBindingMode: 'Immediate', reclaimPolicy: 'Retain',
    }] }));
    return { kind: 'test-kubelet', nodeName: fake.nodeName, podCidr: '127.77.0.0/16', persistentVolumes: 0, stop: () => fake.stop() };
  }
  if (choice !== 'real') throw new AsbError('Invalid', `ASB_KUBE_NODE must be "real" or "test-kubelet", got ${JSON.stringify(choice)}`);
  return startRealNode(kube);
}

interface Proc {
  proc: ChildProcess;
  name: string;
  logPath: string;
  exit?: string;
}

/** In network namespace netns when given (nsenter keeps the pid, so the process is still ours to signal), else the host's. */
function spawnLogged(netns: string | undefined, name: string, binary: string, args: string[], logPath: string, env?: NodeJS.ProcessEnv): Proc {
  const [command, argv] = netns === undefined ? diesWithTest(binary, args) : diesWithTest('/usr/bin/nsenter', [`--net=/run/netns/${netns}`, '--', binary, ...args]);
  const fd = openSync(logPath, 'a');
  let proc: ChildProcess;
  try {
    proc = spawn(command, argv, { stdio: ['ignore', fd, fd], ...(env === undefined ? {} : { env }) });
  } finally {
    closeSync(fd);
  }
  const p: Proc = { proc, name, logPath };
  proc.once('exit', (code, signal) => (p.exit = `exited ${String(code ?? signal)}`));
  proc.once('error', (err) => (p.exit = `could not start: ${err.message}`));
  return p;
}

async function stopProc(p: Proc, graceMs: number): Promise<void> {
  const { proc } = p;
  if (proc.exitCode !== null || proc.signalCode !== null || proc.pid === undefined) return;
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  proc.kill('SIGTERM');
  const timer = setTimeout(() => proc.kill('SIGKILL'), graceMs);
  await exited;
  clearTimeout(timer);
}

/** Nodes of this process not yet stopped: released at exit if a test never called stop(). */
const live = new Set<NodeHostState>();
process.once('exit', () => {
  if (live.size === 0) return;
  // Newest first: a second node recorded the host's sysctls after the first node's kubelet had set them.
  for (const state of [...live].reverse()) releaseNodeHost(state);
  releaseKubeletSubids(NODE_STATE_PREFIXES);
});

/** Leftovers of a node whose test process died without its exit hook (SIGKILL): we hold the lock, so no live node owns them. */
function sweepLeftovers(slot: NodeSlot): void {
  for (const entry of readdirSync(tmpdir())) {
    const dir = join(tmpdir(), entry);
    if (!entry.startsWith(slot.statePrefix) || !isDir(dir)) continue;
    releaseNodeHost(hostState(slot, dir));
  }
}

function hostState(slot: NodeSlot, dir: string): NodeHostState {
  return { dir, cgroupName: basename(dir), bridge: slot.bridge, ...(slot.netns === undefined ? {} : { netns: slot.netns.name, hostVeth: slot.netns.hostVeth }) };
}

/** The prefix length of a CIDR. */
const bitsOf = (cidr: string): string => cidr.slice(cidr.indexOf('/') + 1);

/** A node slot of the machine, held: its lock, its state directory and the pod bridge with the node's address on it. */
interface HostReservation {
  slot: NodeSlot;
  lock: OwnerLock;
  state: NodeHostState;
  /** Takes back all the node left on the host and frees the slot. Idempotent. */
  release(): void;
}

const bin = (name: string): string => join(KUBE_NODE_DIR, 'bin', name);

/** Waits for the node slot, sweeps a crashed node's leftovers and brings up the pod bridge (and the slot's namespace and link). */
async function reserveHost(slot: NodeSlot): Promise<HostReservation> {
  for (const path of [bin('kubelet'), bin('containerd'), bin('kube-scheduler'), bin('kube-controller-manager'), bin('kube-proxy'), bin('coredns'), join(KUBE_NODE_DIR, 'pause.tar'), RUNC, RUNSC]) {
    if (!existsSync(path)) throw new AsbError('Unavailable', `kube node: ${path} is missing; run \`make kube-node runc runsc\` (make test does), or set ASB_KUBE_NODE=test-kubelet`);
  }
  const lock: OwnerLock = await acquireOwnerLockWaiting(join(tmpdir(), slot.lockName), LOCK_WAIT_MS);
  trace('lock');
  sweepLeftovers(slot);
  trace('sweep');
  const dir = mkdtempSync(join(tmpdir(), slot.statePrefix));
  const state = hostState(slot, dir);
  live.add(state);
  let released = false;
  const reservation: HostReservation = {
    slot, lock, state,
    release: () => {
      if (released) return;
      released = true;
      releaseNodeHost(state);
      live.delete(state);
      try {
        releaseKubeletSubids(NODE_STATE_PREFIXES);
      } finally {
        lock.release();
      }
    },
  };
  try {
    recordHost(dir);
    // After mkdtemp: another process's last node, released meanwhile, sees this directory and leaves the user.
    ensureKubeletSubids();
    for (const h of cgroupHierarchies()) mkdirSync(join(h, state.cgroupName), { recursive: true });
    // A bridge of that name is a crashed node's (only this fixture uses it, and we hold the lock).
    await ipLink(['link', 'del', slot.bridge]).catch(() => undefined);
    const ns = slot.netns;
    if (ns !== undefined) {
      await ipLink(['link', 'del', ns.hostVeth]).catch(() => undefined);
      await ipLink(['netns', 'del', ns.name]).catch(() => undefined);
      await ipLink(['netns', 'add', ns.name]);
      await ipLink(['link', 'add', ns.hostVeth, 'type', 'veth', 'peer', 'name', ns.nsVeth, 'netns', ns.name]);
      await ipLink(['addr', 'add', `${ns.hostIp}/30`, 'dev', ns.hostVeth]);
      await ipLink(['link', 'set', ns.hostVeth, 'up']);
      await ipLink(['route', 'add', slot.podCidr, 'via', ns.nsIp]);
      // Packets of the other node's Pods, DNATed by its kube-proxy (a NodePort there), leave through this link, and answers come back in.
      await limitForwarding(state, ns.hostVeth);
      writeFileSync(`/proc/sys/net/ipv4/conf/${ns.hostVeth}/forwarding`, '1');
      const inNs = (args: string[]): Promise<void> => ipLink(['-n', ns.name, ...args]);
      await inNs(['link', 'set', 'lo', 'up']);
      await inNs(['addr', 'add', `${ns.nsIp}/30`, 'dev', ns.nsVeth]);
      await inNs(['link', 'set', ns.nsVeth, 'up']);
      await inNs(['route', 'add', 'default', 'via', ns.hostIp]);
      // The namespace is a router between its Pods and the host, as a machine on a network is.
      await ipLink(['netns', 'exec', ns.name, 'sysctl', '-q', '-w', 'net.ipv4.ip_forward=1']);
    }
    // The pod bridge, in the node's network, with its MAC address set: one never set takes the
    // lowest of its ports', so Pods' veths joining and leaving moved the node's address under the
    // Pods on it (5 times in e2e.test.ts's restart test), whose packets to the node (probe
    // answers, calls to the API server) then went nowhere until their ARP entry was resolved
    // again (src/runtime/local/network.ts says more). The CNI bridge plugin sets it only with
    // isGateway, which is off here.
    const inNode = (args: string[]): Promise<void> => ipLink(ns === undefined ? args : ['-n', ns.name, ...args]);
    await inNode(['link', 'add', slot.bridge, 'address', podMac(slot.nodeIp), 'type', 'bridge']);
    await inNode(['addr', 'add', `${slot.nodeIp}/${bitsOf(slot.podCidr)}`, 'dev', slot.bridge]);
    await inNode(['link', 'set', slot.bridge, 'up']);
    return reservation;
  } catch (err) {
    reservation.release();
    throw err;
  }
}

/** A whole test cluster on the real node: the API server Pods reach, Services and cluster DNS. */
export interface KubeCluster {
  readonly kube: KubeApiServer;
  readonly node: KubeNode;
  /** The node first, then the API server. Idempotent. */
  stop(): Promise<void>;
}

/**
 * A cluster whose Pods use it as Pods do on any cluster (what a Deployment of ours needs, and
 * the other tests' nodes lack): the API server on the node's address, reached from a Pod as the
 * `kubernetes` Service with the Pod's own ServiceAccount token; kube-proxy (nftables mode)
 * routing every Service's ClusterIP; CoreDNS answering cluster.local names. The API server starts
 * after the node's slot is reserved, because it listens on the pod bridge the reservation makes.
 * The real node only: the test kubelet has no pod network.
 */
export async function startKubeCluster(opts: { etcdUnsafeNoFsync?: boolean; slot?: NodeSlot } = {}): Promise<KubeCluster> {
  if ((process.env.ASB_KUBE_NODE ?? 'real') !== 'real') throw new AsbError('Unavailable', 'a kube cluster with Services needs the real node; ASB_KUBE_NODE=test-kubelet has no pod network');
  const slot = opts.slot ?? NODE_SLOT_A;
  const reservation = await reserveHost(slot);
  let kube: KubeApiServer;
  try {
    kube = await startKubeApiServer({
      ...(opts.etcdUnsafeNoFsync === undefined ? {} : { etcdUnsafeNoFsync: opts.etcdUnsafeNoFsync }),
      inClusterAt: slot.netns?.hostIp ?? slot.nodeIp, nodeIp: slot.nodeIp,
    });
  } catch (err) {
    reservation.release();
    throw err;
  }
  let node: KubeNode;
  try {
    node = await startRealNode(kube, reservation, { clusterServices: true });
  } catch (err) {
    await kube.stop();
    reservation.release(); // startRealNode's own teardown releases it too, unless it failed before it had one
    throw err;
  }
  let stopping: Promise<void> | undefined;
  return { kube, node, stop: () => (stopping ??= node.stop().finally(() => kube.stop())) };
}

async function startRealNode(kube: KubeApiServer, reserved?: HostReservation, opts: { clusterServices?: boolean } = {}): Promise<KubeNode> {
  const images = await testImages();
  trace('images');
  const reservation = reserved ?? await reserveHost(NODE_SLOT_A);
  const { state, slot } = reservation;
  const { dir } = state;
  const procs: Proc[] = [];
  // The namespace's loopback is not the host's: its containerd reaches the registry through a
  // forwarder on the link's host end, which takes connections from the namespace's own address
  // only (its Pods' addresses are not masqueraded on the way, so they are refused).
  const registry = slot.netns === undefined ? undefined : await forwardTcp(slot.netns.hostIp, images.address, slot.netns.nsIp);
  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      trace('stopping');
      registry?.close();
      await drainPods(kube, procs, join(dir, 'ctrd/containerd.sock')).catch(() => undefined);
      trace('pods drained');
      // The kubelet first (it would restart what containerd loses), containerd last.
      for (const p of [...procs].reverse()) await stopProc(p, 5_000);
      trace('processes stopped');
      reservation.release();
      trace('host released');
    })();
    return stopping;
  };

  try {
    const deadline = Date.now() + READY_TIMEOUT_MS;
    const sock = join(dir, 'ctrd/containerd.sock');
    writeConfigs(dir, slot, registry?.address ?? images.address);
    const env = { PATH: `${join(KUBE_NODE_DIR, 'bin')}:/usr/sbin:/usr/bin:/sbin:/bin`, HOME: dir };
    const containerd = spawnLogged(slot.netns?.name, 'containerd', bin('containerd'), ['--config', join(dir, 'containerd.toml')], join(dir, 'containerd.log'), env);
    procs.push(containerd);
    trace('host prepared');
    await pollUntil('containerd', deadline, procs, async () => (await ctr(sock, ['version']).then(() => true, () => undefined)));
    await ctr(sock, ['-n', 'k8s.io', 'images', 'import', '--no-unpack=false', join(KUBE_NODE_DIR, 'pause.tar')]);

    trace('containerd up, pause imported');
    const [kubeletPort, healthzPort] = [await freePort(), await freePort()];
    const services = opts.clusterServices === true;
    writeKubeletConfig(dir, slot, kube, sock, kubeletPort, healthzPort, state.cgroupName, services);
    // What a kubelet may do (RBAC's system:node role; the Node authorizer is not enabled here).
    await kube.kubectl(['create', 'clusterrolebinding', 'asb-nodes', '--clusterrole', 'system:node', '--group', 'system:nodes']);
    const clusterServices = services ? await startClusterServices(slot, kube, dir, env) : undefined;
    procs.push(...clusterServices?.procs ?? []);
    for (const [name, args] of [
      ['kube-scheduler', ['--kubeconfig', kube.kubeconfigPath, '--leader-elect=false', '--secure-port=0']],
      ['kube-controller-manager', ['--kubeconfig', kube.kubeconfigPath, '--leader-elect=false', '--secure-port=0',
        // Fast for a test: a terminating namespace and a deleted owner's dependents go within a second.
        '--concurrent-namespace-syncs=4', '--concurrent-gc-syncs=8',
        // The CA a Pod's token volume carries (the kube-root-ca.crt ConfigMap in every namespace).
        ...(services ? ['--root-ca-file', kube.caPath] : [])]],
      ['kubelet', ['--config', join(dir, 'kubelet-config.yaml'), '--root-dir', join(dir, 'kubelet'), '--cert-dir', join(dir, 'kubelet/pki'),
        '--kubeconfig', join(dir, 'kubelet.kubeconfig'), '--hostname-override', KUBE_NODE_NAME, '--node-ip', slot.nodeIp, '--v=1']],
    ] as const) {
      // The scheduler and controller-manager only talk to the API server: the host's network.
      procs.push(spawnLogged(name === 'kubelet' ? slot.netns?.name : undefined, name, bin(name), [...args], join(dir, `${name}.log`), env));
    }
    await pollUntil(`node ${KUBE_NODE_NAME} Ready`, deadline, procs, async () => {
      const res = await kube.request<{ status?: { conditions?: { type: string; status: string }[] } }>('GET', `/api/v1/nodes/${KUBE_NODE_NAME}`).catch(() => undefined);
      return res?.status === 200 && res.body.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') === true ? true : undefined;
    });
    trace('node Ready');
    await clusterServices?.ready(deadline);
    await kube.kubectl(['apply', '-f', '-'], JSON.stringify(GVISOR_RUNTIME_CLASS));
    await createPersistentVolumes(kube, dir);
    trace('RuntimeClass and PVs');
    return { kind: 'real', nodeName: KUBE_NODE_NAME, podCidr: slot.podCidr, nodeIp: slot.nodeIp, persistentVolumes: PV_COUNT, stop };
  } catch (err) {
    const logs = procs.map((p) => `--- ${p.name} (${p.exit ?? 'running'}) ${p.logPath}:\n${logTail(p.logPath)}`).join('\n');
    await stop();
    throw new AsbError(err instanceof AsbError ? err.code : 'Unavailable', `${err instanceof Error ? err.message : String(err)}\n${logs}`);
  }
}

/**
 * kube-proxy and CoreDNS for startKubeCluster, as host processes beside the kubelet (the control
 * plane here is host processes too), and IPv4 forwarding for packets that come in on the pod
 * bridge, where a Pod's packet to a ClusterIP, DNATed to another Pod, goes back out (the bridge
 * and its setting go at teardown; the host's own ip_forward is not touched).
 * - kube-proxy, nftables mode: its tables `ip kube-proxy` and `ip6 kube-proxy` (node-host.ts
 *   deletes them at teardown); masqueradeAll, so a reply from a Pod on the same bridge comes back
 *   through the host's conntrack; conntrack limits and timeouts left as the host has them (0);
 *   NodePorts only on the node's address; healthz and metrics on free ports of the node's address.
 * - CoreDNS on the node's address, port 53: cluster.local from the API server (kubernetes
 *   plugin); nothing is forwarded, so every other name fails at once.
 */
async function startClusterServices(slot: NodeSlot, kube: KubeApiServer, dir: string, env: NodeJS.ProcessEnv): Promise<{ procs: Proc[]; ready: (deadline: number) => Promise<void> }> {
  // In a slot's own namespace, forwarding is on for the whole namespace already (reserveHost).
  if (slot.netns === undefined) {
    await limitForwarding(hostState(slot, dir), slot.bridge);
    writeFileSync(`/proc/sys/net/ipv4/conf/${slot.bridge}/forwarding`, '1');
  }
  const [healthzPort, metricsPort] = [await freePort(), await freePort()];
  writeFileSync(join(dir, 'kube-proxy.yaml'), stringify({
    apiVersion: 'kubeproxy.config.k8s.io/v1alpha1',
    kind: 'KubeProxyConfiguration',
    mode: 'nftables',
    bindAddress: slot.nodeIp,
    hostnameOverride: KUBE_NODE_NAME,
    clusterCIDR: slot.podCidr,
    clientConnection: { kubeconfig: kube.kubeconfigPath },
    // On the node's address: a namespace's loopback is out of the test's reach.
    healthzBindAddress: `${slot.nodeIp}:${healthzPort}`,
    metricsBindAddress: `${slot.nodeIp}:${metricsPort}`,
    nodePortAddresses: [`${slot.nodeIp}/32`],
    // Its default -999 needs CAP_SYS_RESOURCE, which root lacks here (real-node.md §3): keep ours.
    oomScoreAdj: Number(readFileSync('/proc/self/oom_score_adj', 'utf8').trim()),
    conntrack: { maxPerCore: 0, min: 0, tcpEstablishedTimeout: '0s', tcpCloseWaitTimeout: '0s' },
    nftables: { masqueradeAll: true, syncPeriod: '30s', minSyncPeriod: '0s' },
  }));
  writeFileSync(join(dir, 'Corefile'), `.:53 {
    bind ${slot.nodeIp}
    errors
    kubernetes ${CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {
        kubeconfig ${kube.kubeconfigPath} asb-admin
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
`);
  const procs = [
    spawnLogged(slot.netns?.name, 'kube-proxy', bin('kube-proxy'), ['--config', join(dir, 'kube-proxy.yaml')], join(dir, 'kube-proxy.log'), env),
    spawnLogged(slot.netns?.name, 'coredns', bin('coredns'), ['-conf', join(dir, 'Corefile')], join(dir, 'coredns.log'), env),
  ];
  const resolver = new Resolver({ timeout: 1000, tries: 1 });
  resolver.setServers([slot.nodeIp]);
  const ready = async (deadline: number): Promise<void> => {
    // CoreDNS answers from the API server's Services, and kube-proxy has written its rules.
    await pollUntil('CoreDNS', deadline, procs, async () => (await resolver.resolve4(`kubernetes.default.svc.${CLUSTER_DOMAIN}`).catch((): string[] => [])).includes(KUBERNETES_SERVICE_IP) ? true : undefined);
    await pollUntil('kube-proxy', deadline, procs, async () => {
      const res = await fetch(`http://${slot.nodeIp}:${healthzPort}/healthz`).catch(() => undefined);
      await res?.body?.cancel();
      return res?.status === 200 ? true : undefined;
    });
  };
  return { procs, ready };
}

/** Every node's pod-side interface on the host: its bridge, or the host end of its namespace's link. */
const POD_SIDE = [NODE_SLOT_A, NODE_SLOT_B].map((s) => s.netns?.hostVeth ?? s.bridge);

/**
 * Turning forwarding on for an interface forwards whatever comes in on it, to any network the
 * host routes: Pods (sandboxes) would reach the host's uplink and every other test's network. So
 * before it is turned on, a table of ours (node-host.ts deletes it) lets what comes in there go
 * only to the nodes' pod networks, or back as an answer; the rest is dropped.
 */
async function limitForwarding(state: NodeHostState, iface: string): Promise<void> {
  const table = forwardTableOf(state);
  const rules = `table inet ${table} {
  chain forward {
    type filter hook forward priority filter; policy accept;
    iifname "${iface}" oifname { ${POD_SIDE.map((i) => `"${i}"`).join(', ')} } accept
    iifname "${iface}" ct state established,related accept
    iifname "${iface}" counter drop
  }
}
`;
  await run('nft', ['-f', '-'], rules);
}

/** A TCP forwarder on host:<free port> to target (host:port) for connections from `from` only (others are closed), until close(). */
async function forwardTcp(host: string, target: string, from: string): Promise<{ address: string; close(): void }> {
  const colon = target.lastIndexOf(':');
  const [targetHost, targetPort] = [target.slice(0, colon), Number(target.slice(colon + 1))];
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    if (client.remoteAddress !== from) {
      client.destroy();
      return;
    }
    const upstream = connect(targetPort, targetHost);
    for (const sock of [client, upstream]) {
      sockets.add(sock);
      sock.once('close', () => sockets.delete(sock));
      sock.on('error', () => { client.destroy(); upstream.destroy(); });
    }
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((res, rej) => { server.once('error', rej); server.listen(0, host, () => res()); });
  const { port } = server.address() as AddressInfo;
  return {
    address: `${host}:${port}`,
    close: () => {
      server.close();
      for (const sock of sockets) sock.destroy();
    },
  };
}

let traced = Date.now();
/** ASB_KUBE_NODE_TRACE=1: each phase of start and stop with its milliseconds, on stderr. */
function trace(what: string): void {
  if (process.env.ASB_KUBE_NODE_TRACE === undefined) return;
  process.stderr.write(`kube-node: ${what} ${Date.now() - traced} ms\n`);
  traced = Date.now();
}

/** Runs a command to its end (stdin from input, if any); resolves with its stdout, rejects naming the command and its stderr. */
function run(command: string, args: readonly string[], input?: string): Promise<string> {
  return new Promise((res, rej) => {
    const child = spawn(command, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    // A command that reads no stdin may exit before it is written: that EPIPE is not its failure.
    child.stdin.on('error', () => undefined);
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    child.once('error', rej);
    child.once('exit', (code) => (code === 0 ? res(out) : rej(new Error(`${basename(command)} ${args.join(' ')}: ${err.trim()}`))));
    child.stdin.end(input ?? '');
  });
}

/** Runs `ip` (link, addr, route, netns) with these arguments. */
async function ipLink(args: string[]): Promise<void> {
  await run('ip', args);
}

function ctr(sock: string, args: string[]): Promise<string> {
  return run(join(KUBE_NODE_DIR, 'bin/ctr'), ['--address', sock, ...args]);
}

/** Polls every 100 ms until check() holds; fails at once, naming the log, when a process exits. */
async function pollUntil(what: string, deadline: number, procs: readonly Proc[], check: () => Promise<true | undefined>): Promise<void> {
  for (;;) {
    const dead = procs.find((p) => p.exit !== undefined);
    if (dead !== undefined) throw new AsbError('Unavailable', `kube node: ${dead.name} ${dead.exit ?? ''} while waiting for ${what}; ${dead.logPath} ends:\n${logTail(dead.logPath)}`);
    if ((await check()) === true) return;
    if (Date.now() > deadline) throw new AsbError('Timeout', `kube node: timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * Deletes every Pod (grace 0) and waits, at most 20 s, for the kubelet to have stopped their
 * containers and sandboxes through the CRI (each sandbox's CNI DEL frees its IP and veth). What it
 * misses, releaseNodeHost kills.
 */
async function drainPods(kube: KubeApiServer, procs: readonly Proc[], sock: string): Promise<void> {
  if (procs.some((p) => p.name === 'kubelet' && p.exit !== undefined) || !procs.some((p) => p.name === 'kubelet')) return;
  const namespaces = await kube.request<{ items?: { metadata: { name: string } }[] }>('GET', '/api/v1/namespaces');
  for (const ns of namespaces.body.items ?? []) {
    await kube.request('DELETE', `/api/v1/namespaces/${ns.metadata.name}/pods?gracePeriodSeconds=0`);
  }
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    const sandboxes = await ctr(sock, ['-n', 'k8s.io', 'tasks', 'ls', '-q']).catch(() => '');
    if (sandboxes.trim() === '') return;
    await new Promise((r) => setTimeout(r, 200));
  }
}

function writeConfigs(dir: string, slot: NodeSlot, registry: string): void {
  for (const d of ['ctrd', 'certs.d/docker.io', 'cni/net.d', 'cni/ipam', 'kubelet', 'pod-logs', 'runsc', 'runc', 'pv']) mkdirSync(join(dir, d), { recursive: true });
  // Traversable (not readable) down to containerd's state, as /run/containerd is: a Pod with
  // hostUsers: false has runc's init walk to its rootfs there as the Pod's own host uid, and
  // mkdtemp's 0700 made that EACCES ("remount-propagation ... rootfs: permission denied").
  for (const d of [dir, join(dir, 'ctrd')]) chmodSync(d, 0o711);
  // docker.io's only host is the loopback registry, over plain HTTP: nothing leaves the machine.
  writeFileSync(join(dir, 'certs.d/docker.io/hosts.toml'), `server = "http://${registry}"\n[host."http://${registry}"]\n  capabilities = ["pull", "resolve"]\n`);
  writeFileSync(join(dir, 'runsc.toml'), `binary_name = "${RUNSC}"\nroot = "${join(dir, 'runsc')}"\n[runsc_config]\n  platform = "systrap"\n`);
  const cri = "plugins.'io.containerd.cri.v1.runtime'";
  writeFileSync(join(dir, 'containerd.toml'), `version = 3
root = '${join(dir, 'ctrd/root')}'
state = '${join(dir, 'ctrd/state')}'
# NRI would open /var/run/nri/nri.sock, a fixed host path; nothing here uses it.
disabled_plugins = ['io.containerd.nri.v1.nri']
[grpc]
  address = '${join(dir, 'ctrd/containerd.sock')}'
[ttrpc]
  address = '${join(dir, 'ctrd/containerd.sock.ttrpc')}'
[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = '${join(dir, 'ctrd/opt')}'
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '${PAUSE_IMAGE}'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '${join(dir, 'certs.d')}'
  [${cri}]
    # Required here: root lacks CAP_SYS_RESOURCE, so runc cannot lower oom_score_adj to the
    # kubelet's -998 for the sandbox (real-node.md §3); capped at containerd's own instead.
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = []
    [${cri}.containerd]
      default_runtime_name = 'runc'
      [${cri}.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [${cri}.containerd.runtimes.runc.options]
          BinaryName = '${RUNC}'
          Root = '${join(dir, 'runc')}'
          SystemdCgroup = false
      [${cri}.containerd.runtimes.runsc]
        runtime_type = 'io.containerd.runsc.v1'
        [${cri}.containerd.runtimes.runsc.options]
          TypeUrl = 'io.containerd.runsc.v1.options'
          ConfigPath = '${join(dir, 'runsc.toml')}'
    [${cri}.cni]
      bin_dirs = ['${join(KUBE_NODE_DIR, 'cni')}']
      conf_dir = '${join(dir, 'cni/net.d')}'
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
`);
  // isGateway false and ipMasq false: the plugin touches neither ip_forward nor iptables; the host
  // side of the bridge got its address above, and pods reach it on-link. Their default route is
  // the host (from the IPAM result), which forwards nothing unless startKubeCluster's Services
  // (a ClusterIP, DNATed to a Pod) turn forwarding on for this bridge.
  writeFileSync(join(dir, 'cni/net.d/10-asb.conflist'), JSON.stringify({
    cniVersion: '1.0.0', name: 'asb-node', plugins: [{
      type: 'bridge', bridge: slot.bridge, isGateway: false, ipMasq: false, hairpinMode: true,
      ipam: { type: 'host-local', dataDir: join(dir, 'cni/ipam'), ranges: [[{ subnet: slot.podCidr, gateway: slot.nodeIp }]], routes: [{ dst: '0.0.0.0/0', gw: slot.nodeIp }] },
    }],
  }));
}

function writeKubeletConfig(dir: string, slot: NodeSlot, kube: KubeApiServer, sock: string, port: number, healthzPort: number, cgroupName: string, clusterDns: boolean): void {
  writeFileSync(join(dir, 'kubelet-config.yaml'), stringify({
    // Pods resolve <service>.<namespace>.svc.cluster.local (and the short names, by search path) at CoreDNS on the node's address.
    ...(clusterDns ? { clusterDNS: [slot.nodeIp], clusterDomain: CLUSTER_DOMAIN } : {}),
    apiVersion: 'kubelet.config.k8s.io/v1beta1',
    kind: 'KubeletConfiguration',
    // The kubelet API on the node IP (the bridge's host address): reachable from pods on-link, but
    // it answers only the API server's client certificate.
    address: slot.nodeIp,
    port,
    readOnlyPort: 0,
    healthzBindAddress: '127.0.0.1',
    healthzPort,
    cgroupDriver: 'cgroupfs',
    cgroupRoot: `/${cgroupName}`,
    failCgroupV1: false,
    failSwapOn: false,
    containerRuntimeEndpoint: `unix://${sock}`,
    podLogsDir: join(dir, 'pod-logs'),
    tlsCertFile: kube.kubeletTls.servingCertPath,
    tlsPrivateKeyFile: kube.kubeletTls.servingKeyPath,
    // Only the API server (its client certificate) may call the kubelet; anyone else gets 401.
    authentication: { anonymous: { enabled: false }, webhook: { enabled: false }, x509: { clientCAFile: kube.kubeletTls.clientCaPath } },
    authorization: { mode: 'AlwaysAllow' },
    serializeImagePulls: false,
    // The bench's Kubernetes part keeps ~130 Pods running (40 pool members, 90 claimed); the default is 110.
    maxPods: 250,
    // A shared test machine's disk and memory are not this node's to guard: evict only near the end.
    evictionHard: { 'memory.available': '100Mi', 'nodefs.available': '2%', 'imagefs.available': '2%', 'nodefs.inodesFree': '2%' },
    imageGCHighThresholdPercent: 99,
    imageGCLowThresholdPercent: 98,
  }));
  writeFileSync(join(dir, 'kubelet.kubeconfig'), stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'asb-test', cluster: { server: kube.url, 'certificate-authority': kube.caPath } }],
    users: [{ name: 'kubelet', user: { token: kube.nodeToken } }],
    contexts: [{ name: 'kubelet', context: { cluster: 'asb-test', user: 'kubelet' } }],
    'current-context': 'kubelet',
  }), { mode: 0o600 });
}

/** PV_COUNT local PVs on this node, each a 0777 directory under <dir>/pv; no StorageClass, so a PVC naming none binds to one. 16 POSTs at a time: ~1 s for 200. */
async function createPersistentVolumes(kube: KubeApiServer, dir: string): Promise<void> {
  const pvs = Array.from({ length: PV_COUNT }, (_, i) => {
    const path = join(dir, 'pv', `pv-${i}`);
    mkdirSync(path);
    chmodSync(path, 0o777); // not mkdir's mode, which the umask trims: the sandbox image's uid 1000 writes here
    return {
      apiVersion: 'v1', kind: 'PersistentVolume',
      metadata: { name: `asb-local-${i}` },
      spec: {
        capacity: { storage: '10Gi' }, accessModes: ['ReadWriteOnce'], persistentVolumeReclaimPolicy: 'Retain',
        ...(i < CLASSED_PVS ? { storageClassName: QUICKSTART_CLASS } : {}),
        local: { path },
        nodeAffinity: { required: { nodeSelectorTerms: [{ matchExpressions: [{ key: 'kubernetes.io/hostname', operator: 'In', values: [KUBE_NODE_NAME] }] }] } },
      },
    };
  });
  for (let i = 0; i < pvs.length; i += 16) {
    await Promise.all(pvs.slice(i, i + 16).map(async (pv) => {
      const res = await kube.request('POST', '/api/v1/persistentvolumes', { body: pv });
      if (res.status !== 201) throw new AsbError('Unavailable', `kube node: creating a PersistentVolume answered ${res.status}: ${JSON.stringify(res.body)}`);
    }));
  }
}
