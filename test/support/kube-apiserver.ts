// A real kube-apiserver on a real etcd for the Kubernetes test tier (test/k8s/), from the binaries
// `make kube-tools` builds into .tools/kube/bin (scripts/kube-tools.sh). Everything is loopback:
// etcd on two free ports of 127.0.0.1, the API server's secure port on a third (on a node's
// address instead with inClusterAt, for Pods), with a self-signed serving certificate made here
// for every name a client dials. Authentication is a static token file (no anonymous
// access, so a request without a token gets 401) and authorization is RBAC.
//
// It is ready for a real node (test/support/kube-node.ts): a token for the kubelet (user
// system:node:<KUBE_NODE_NAME> in group system:nodes), a client certificate the API server shows the
// kubelet for exec, attach, port-forward and logs, and the CA it checks the kubelet's serving
// certificate against (both made here, ~10 ms; the kubelet gets their counterparts).
//
// What does not run here (kube-node.ts starts them with the node), and what that means for a test:
// - No kubelet and no scheduler: a Pod stays Pending with no node; a test without a node plays
//   the kubelet by writing the Pod's status itself (PATCH pods/<name>/status).
// - No kube-controller-manager, so none of its controllers: namespace (a deleted namespace stays
//   Terminating: use a fresh namespace per test instead of deleting one), garbage collector
//   (ownerReferences do not cascade), ServiceAccount (no "default" ServiceAccount), ClusterRole
//   aggregation (the built-in view, edit and admin roles have no rules: bind a Role of your own),
//   PVC protection. Two admission plugins that count on those controllers are disabled:
//   ServiceAccount (it refuses a Pod whose ServiceAccount does not exist) and
//   StorageObjectInUseProtection (its PVC finalizer would keep a deleted PVC Terminating for
//   ever).
// The API server's own bootstrap controllers do run: the "default", "kube-system" and
// "kube-public" namespaces, the RBAC default roles, the "kubernetes" Service. Start waits for the
// "default" namespace, so a test can use it at once.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { Agent, request as httpsRequest } from 'node:https';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { stringify } from 'yaml';
import { ensureFederationTls } from '../../src/edge/tls.ts';
import { readAnswer, type HttpAnswer } from './http-answer.ts';
import { AsbError } from '../../src/errors.ts';
import { freePort } from '../../src/assembly/local-system.ts';

const repoRoot = resolve(import.meta.dirname, '../..');
/** Where scripts/kube-tools.sh puts kube-apiserver, kubectl and etcd. */
export const KUBE_BIN_DIR = join(repoRoot, '.tools/kube/bin');

/** The user of the second token: authenticated, in no group but system:authenticated, so RBAC grants it nothing until a test binds a role to it. */
export const LIMITED_USER = 'asb-limited';
/** The name of the one node a test cluster can have (its kubelet's token is for this name). */
export const KUBE_NODE_NAME = 'asb-node';
/**
 * The node's InternalIP, where the API server calls its kubelet: the host's address on the pod
 * bridge (kube-node.ts). The kubelet refuses a loopback node IP ("nodeIP can't be loopback
 * address"), and its serving certificate names this address.
 */
export const KUBE_NODE_IP = '10.246.0.1';

/** Service ClusterIPs are allocated from here; kube-proxy routes them only on a cluster of kube-node.ts's startKubeCluster. */
export const SERVICE_CIDR = '10.96.0.0/24';
/** The `kubernetes` Service's ClusterIP (the range's first address): KUBERNETES_SERVICE_HOST in every Pod. */
export const KUBERNETES_SERVICE_IP = '10.96.0.1';

export interface KubeApiServerOptions {
  /** etcd's --unsafe-no-fsync: faster on a busy disk, and a test's throw-away data never needs a crash-safe disk. Default false, so benchmarks measure the real write path. */
  etcdUnsafeNoFsync?: boolean;
  /**
   * Serve Pods as a cluster's API server does (kube-node.ts's startKubeCluster, which puts the
   * address on the host first): listen on this address instead of 127.0.0.1 (url names it),
   * advertise it as the `kubernetes` Service's endpoint, and admit Pods with the ServiceAccount
   * plugin, which mounts each Pod's token. Default: loopback only, and no ServiceAccount
   * admission (see the top of this file).
   */
  inClusterAt?: string;
  /** The node's InternalIP (its kubelet's serving certificate names it). Default KUBE_NODE_IP. */
  nodeIp?: string;
}

/** How long etcd plus the API server may take to be ready (cold start on 2 busy cores is ~5-15 s). */
const READY_TIMEOUT_MS = 120_000;

/** The status, and the body parsed when it is JSON, else its raw text. */
export type KubeResponse<T> = HttpAnswer<T>;

export interface KubeRequestOptions {
  /** Bearer token; default the admin token; null sends none. */
  token?: string | null;
  /** Sent as JSON unless it is a string. */
  body?: unknown;
  /** Default application/json (merge patches need application/merge-patch+json). */
  contentType?: string;
}

export interface KubeApiServer {
  /** https://127.0.0.1:<port> (https://<inClusterAt>:<port> with inClusterAt) */
  readonly url: string;
  /** Bearer token of user "asb-admin" in group system:masters (every permission). */
  readonly token: string;
  /** Bearer token of LIMITED_USER, for RBAC tests. */
  readonly limitedToken: string;
  /** PEM file of the CA that signed the serving certificate. */
  readonly caPath: string;
  /** kubeconfig: current context "asb-admin"; context "asb-limited" uses the limited token. */
  readonly kubeconfigPath: string;
  /** http://127.0.0.1:<port>, the API server's etcd. */
  readonly etcdUrl: string;
  /** Bearer token of user system:node:KUBE_NODE_NAME in group system:nodes, for the kubelet. */
  readonly nodeToken: string;
  /** What the kubelet needs to trust the API server's calls and to be trusted by it. */
  readonly kubeletTls: {
    /** PEM: the CA of the API server's kubelet client certificate (the kubelet's authentication.x509.clientCAFile). */
    clientCaPath: string;
    /** PEM files of the kubelet's serving certificate (127.0.0.1), signed by the CA the API server checks it against. */
    servingCertPath: string;
    servingKeyPath: string;
  };
  /** Temp directory with etcd.log and kube-apiserver.log (removed by stop()). */
  readonly dir: string;
  /** Milliseconds from starting etcd to the API server ready with its "default" namespace. */
  readonly readyMs: number;
  /** Runs kubectl with this kubeconfig; resolves with stdout, rejects with KubectlError on a non-zero exit. */
  kubectl(args: readonly string[], stdin?: string): Promise<string>;
  /** One HTTPS request to the API server (path like /api/v1/namespaces/default/configmaps). */
  request<T = unknown>(method: string, path: string, opts?: KubeRequestOptions): Promise<KubeResponse<T>>;
  /** Kills the API server and etcd and removes the temp directory. Idempotent. */
  stop(): Promise<void>;
}

export class KubectlError extends Error {
  readonly exitCode: number | null;
  readonly stdout: string;
  readonly stderr: string;
  constructor(args: readonly string[], exitCode: number | null, stdout: string, stderr: string) {
    super(`kubectl ${args.join(' ')} exited ${String(exitCode)}: ${stderr.trim()}`);
    this.name = 'KubectlError';
    this.exitCode = exitCode;
    this.stdout = stdout;
    this.stderr = stderr;
  }
}

/** Processes started here and not yet stopped; killed if the test process exits without stop(). */
const live = new Set<{ procs: ChildProcess[]; dir: string }>();
process.once('exit', () => {
  for (const server of live) {
    for (const proc of server.procs) proc.kill('SIGKILL');
    rmSync(server.dir, { recursive: true, force: true });
  }
});

/** Starts etcd and kube-apiserver; a free port taken by someone else between choosing and binding is retried with new ports (3 tries). */
export async function startKubeApiServer(opts: KubeApiServerOptions = {}): Promise<KubeApiServer> {
  for (const bin of ['etcd', 'kube-apiserver', 'kubectl']) {
    if (!existsSync(join(KUBE_BIN_DIR, bin))) {
      throw new AsbError('Unavailable', `kube-apiserver fixture: ${join(KUBE_BIN_DIR, bin)} is missing; run \`make kube-tools\` (make test does) to build it`);
    }
  }
  for (let attempt = 1; ; attempt++) {
    try {
      return await startOnce(opts);
    } catch (err) {
      if (!(err instanceof PortTaken) || attempt >= 3) throw err;
    }
  }
}

/** A child exited before it was ready because its port was taken after freePort chose it. */
class PortTaken extends Error {}

async function startOnce(opts: KubeApiServerOptions): Promise<KubeApiServer> {
  const started = Date.now();
  const dir = mkdtempSync(join(tmpdir(), 'asb-kube-'));
  const entry = { procs: [] as ChildProcess[], dir };
  live.add(entry);
  const agent = new Agent({ keepAlive: true, maxSockets: 64 });
  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      agent.destroy();
      await Promise.all(entry.procs.map(killAndWait));
      live.delete(entry);
      rmSync(dir, { recursive: true, force: true });
    })();
    return stopping;
  };

  try {
    const deadline = started + READY_TIMEOUT_MS;
    const [clientPort, peerPort, securePort] = [await freePort(), await freePort(), await freePort()];
    const etcdUrl = `http://127.0.0.1:${clientPort}`;
    const peerUrl = `http://127.0.0.1:${peerPort}`;
    const etcd = spawnLogged(join(KUBE_BIN_DIR, 'etcd'), [
      '--name', 'asb-test',
      '--data-dir', join(dir, 'etcd'),
      '--listen-client-urls', etcdUrl, '--advertise-client-urls', etcdUrl,
      '--listen-peer-urls', peerUrl, '--initial-advertise-peer-urls', peerUrl,
      '--initial-cluster', `asb-test=${peerUrl}`,
      '--log-level', 'warn',
      ...(opts.etcdUnsafeNoFsync === true ? ['--unsafe-no-fsync'] : []),
    ], join(dir, 'etcd.log'));
    entry.procs.push(etcd.proc);
    await pollUntil('etcd /health', deadline, [etcd], async () => {
      const res = await fetch(`${etcdUrl}/health`).catch(() => undefined);
      return res?.status === 200 ? true : undefined;
    });

    const token = randomBytes(24).toString('hex');
    const limitedToken = randomBytes(24).toString('hex');
    const nodeToken = randomBytes(24).toString('hex');
    // token,user,uid,"groups"
    writeFileSync(join(dir, 'tokens.csv'), [
      `${token},asb-admin,asb-admin,"system:masters"`,
      `${limitedToken},${LIMITED_USER},${LIMITED_USER}`,
      `${nodeToken},system:node:${KUBE_NODE_NAME},${KUBE_NODE_NAME},"system:nodes"`,
    ].join('\n') + '\n', { mode: 0o600 });
    const sa = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
    writeFileSync(join(dir, 'sa.key'), sa.privateKey.export({ type: 'sec1', format: 'pem' }), { mode: 0o600 });
    writeFileSync(join(dir, 'sa.pub'), sa.publicKey.export({ type: 'spki', format: 'pem' }));
    const nodeIp = opts.nodeIp ?? KUBE_NODE_IP;
    // A self-signed serving certificate (its own trust anchor) for every name a client may dial:
    // loopback, the node's address, the `kubernetes` Service's ClusterIP and DNS names.
    const tls = await selfSignedServing(join(dir, 'pki'), 'kube-apiserver', [
      'IP:127.0.0.1', `IP:${nodeIp}`, ...(opts.inClusterAt === undefined ? [] : [`IP:${opts.inClusterAt}`]), `IP:${KUBERNETES_SERVICE_IP}`, 'DNS:localhost',
      ...['kubernetes', 'kubernetes.default', 'kubernetes.default.svc', 'kubernetes.default.svc.cluster.local'].map((n) => `DNS:${n}`),
    ]);
    const caPem = readFileSync(tls.certPath);
    const host = opts.inClusterAt ?? '127.0.0.1';
    // The kubelet's side: it serves 127.0.0.1 with a certificate of its own CA, and lets in the
    // holder of a client certificate of another (clientAuth), which only the API server has.
    const kubeletServing = await selfSignedServing(join(dir, 'kubelet-serving'), KUBE_NODE_NAME, [`IP:${nodeIp}`, 'IP:127.0.0.1']);
    const kubeletClient = await ensureFederationTls(join(dir, 'kubelet-client'), { names: ['kube-apiserver'] });

    const apiserver = spawnLogged(join(KUBE_BIN_DIR, 'kube-apiserver'), [
      '--etcd-servers', etcdUrl,
      '--bind-address', host,
      '--advertise-address', host,
      // The endpoint reconciler refuses a loopback advertise address; with it off, the
      // "kubernetes" Service simply has no endpoints (nothing in a loopback-only test dials it).
      ...(opts.inClusterAt !== undefined ? [] : ['--endpoint-reconciler-type', 'none']),
      '--secure-port', String(securePort),
      '--tls-cert-file', tls.certPath,
      '--tls-private-key-file', tls.keyPath,
      '--cert-dir', join(dir, 'certs'),
      '--token-auth-file', join(dir, 'tokens.csv'),
      '--anonymous-auth=false',
      '--authorization-mode', 'RBAC',
      '--service-account-issuer', 'https://kubernetes.default.svc.cluster.local',
      '--service-account-key-file', join(dir, 'sa.pub'),
      '--service-account-signing-key-file', join(dir, 'sa.key'),
      // Service ClusterIPs; only startKubeCluster's kube-proxy routes them.
      '--service-cluster-ip-range', SERVICE_CIDR,
      '--disable-admission-plugins', opts.inClusterAt !== undefined ? 'StorageObjectInUseProtection' : 'ServiceAccount,StorageObjectInUseProtection',
      // A node's addresses are its Hostname (asb-node: no DNS has it) and InternalIP 127.0.0.1.
      '--kubelet-preferred-address-types', 'InternalIP',
      // The test kubelet (ASB_KUBE_NODE=test-kubelet, kube-node.ts) serves a certificate it made
      // itself, which the API server then does not check, as before the real node.
      ...(process.env.ASB_KUBE_NODE === 'test-kubelet' ? [] : ['--kubelet-certificate-authority', kubeletServing.certPath]),
      '--kubelet-client-certificate', kubeletClient.certChainPath,
      '--kubelet-client-key', kubeletClient.privateKeyPath,
      '--profiling=false',
    ], join(dir, 'kube-apiserver.log'));
    entry.procs.push(apiserver.proc);

    const url = `https://${host}:${securePort}`;
    const request = <T>(method: string, path: string, o: KubeRequestOptions = {}): Promise<KubeResponse<T>> =>
      kubeRequest<T>(agent, caPem, url, method, path, o.token === undefined ? token : o.token, o);
    await pollUntil('kube-apiserver /readyz', deadline, [etcd, apiserver], async () => {
      const res = await request('GET', '/readyz').catch(() => undefined);
      return res?.status === 200 ? true : undefined;
    });
    await pollUntil('the "default" namespace', deadline, [etcd, apiserver], async () => {
      const res = await request('GET', '/api/v1/namespaces/default').catch(() => undefined);
      return res?.status === 200 ? true : undefined;
    });

    const kubeconfigPath = join(dir, 'kubeconfig');
    writeFileSync(kubeconfigPath, kubeconfig(url, tls.certPath, token, limitedToken), { mode: 0o600 });
    const kubectlEnv = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: dir, KUBECONFIG: kubeconfigPath, KUBECACHEDIR: join(dir, 'kubectl-cache') };
    return {
      url,
      token,
      limitedToken,
      nodeToken,
      kubeletTls: { clientCaPath: kubeletClient.caCertPath, servingCertPath: kubeletServing.certPath, servingKeyPath: kubeletServing.keyPath },
      caPath: tls.certPath,
      kubeconfigPath,
      etcdUrl,
      dir,
      readyMs: Date.now() - started,
      kubectl: (args, stdin) => runKubectl(join(KUBE_BIN_DIR, 'kubectl'), args, kubectlEnv, stdin),
      request,
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** A self-signed serving certificate (its own trust anchor) for these subject alternative names (`IP:…`, `DNS:…`), with openssl (~10 ms). */
async function selfSignedServing(dir: string, name: string, names: readonly string[]): Promise<{ certPath: string; keyPath: string }> {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const certPath = join(dir, 'tls.crt');
  const keyPath = join(dir, 'tls.key');
  await new Promise<void>((resolveRun, reject) => {
    execFile('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', keyPath, '-out', certPath,
      '-days', '30', '-subj', `/CN=${name}`, '-addext', `subjectAltName=${names.join(',')}`,
      '-addext', 'extendedKeyUsage=serverAuth'], (err) => { if (err === null) resolveRun(); else reject(new Error(`openssl req for ${name}'s certificate: ${err.message}`)); });
  });
  return { certPath, keyPath };
}

interface Logged {
  proc: ChildProcess;
  name: string;
  logPath: string;
  /** Set once the process has exited. */
  exit?: string;
}

/**
 * The command and argv that run binary so it dies with the test process: setpriv --pdeathsig
 * covers a SIGKILLed test process, which no 'exit' hook can; without setpriv (not Linux), the
 * callers' exit hooks are all there is.
 */
export function diesWithTest(binary: string, args: readonly string[]): [string, string[]] {
  return existsSync('/usr/bin/setpriv') ? ['/usr/bin/setpriv', ['--pdeathsig', 'SIGKILL', '--', binary, ...args]] : [binary, [...args]];
}

function spawnLogged(binary: string, args: string[], logPath: string): Logged {
  const [command, argv] = diesWithTest(binary, args);
  const fd = openSync(logPath, 'a');
  let proc: ChildProcess;
  try {
    proc = spawn(command, argv, { stdio: ['ignore', fd, fd], detached: false });
  } finally {
    closeSync(fd);
  }
  const logged: Logged = { proc, name: binary.slice(binary.lastIndexOf('/') + 1), logPath };
  proc.once('exit', (code, signal) => (logged.exit = `exited ${String(code ?? signal)}`));
  proc.once('error', (err) => (logged.exit = `could not start: ${err.message}`));
  return logged;
}

async function killAndWait(proc: ChildProcess): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null || proc.pid === undefined) return;
  const exited = new Promise<void>((resolveExit) => proc.once('exit', () => resolveExit()));
  // The data is thrown away, so there is nothing for a graceful shutdown to save.
  proc.kill('SIGKILL');
  await exited;
}

/** Polls every 100 ms until check() gives a value; fails at once, with the log's tail, if a process exits. */
async function pollUntil(what: string, deadline: number, procs: Logged[], check: () => Promise<true | undefined>): Promise<void> {
  for (;;) {
    const dead = procs.find((p) => p.exit !== undefined);
    if (dead !== undefined) {
      const tail = logTail(dead.logPath);
      if (/address already in use/.test(tail)) throw new PortTaken(`${dead.name}: port taken`);
      throw new AsbError('Unavailable', `kube-apiserver fixture: ${dead.name} ${dead.exit ?? ''} while waiting for ${what}; ${dead.logPath} ends:\n${tail}`);
    }
    if ((await check()) === true) return;
    if (Date.now() > deadline) {
      throw new AsbError('Timeout', `kube-apiserver fixture: timed out waiting for ${what}; logs:\n${procs.map((p) => `--- ${p.logPath}\n${logTail(p.logPath)}`).join('\n')}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** The last 30 lines of a log, for an error message. */
export function logTail(path: string): string {
  try {
    return readFileSync(path, 'utf8').split('\n').slice(-30).join('\n');
  } catch {
    return '(no log)';
  }
}

function kubeconfig(url: string, caPath: string, token: string, limitedToken: string): string {
  return stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'asb-test', cluster: { server: url, 'certificate-authority': caPath } }],
    users: [
      { name: 'asb-admin', user: { token } },
      { name: LIMITED_USER, user: { token: limitedToken } },
    ],
    contexts: [
      { name: 'asb-admin', context: { cluster: 'asb-test', user: 'asb-admin', namespace: 'default' } },
      { name: LIMITED_USER, context: { cluster: 'asb-test', user: LIMITED_USER, namespace: 'default' } },
    ],
    'current-context': 'asb-admin',
  });
}

function runKubectl(binary: string, args: readonly string[], env: NodeJS.ProcessEnv, stdin?: string): Promise<string> {
  return new Promise((resolveRun, reject) => {
    const child = execFile(binary, args, { env, timeout: 60_000, maxBuffer: 64 * 1024 * 1024 }, (err, stdout, stderr) => {
      if (err === null) resolveRun(stdout);
      else reject(new KubectlError(args, child.exitCode, stdout, stderr || err.message));
    });
    // kubectl may exit before it reads its stdin (a `get` never reads it): the write then fails
    // with EPIPE, which without a listener failed the test; the exit status says what happened.
    child.stdin?.on('error', () => undefined);
    child.stdin?.end(stdin ?? '');
  });
}

function kubeRequest<T>(agent: Agent, ca: Buffer, base: string, method: string, path: string, token: string | null, o: KubeRequestOptions): Promise<KubeResponse<T>> {
  const payload = o.body === undefined ? undefined : typeof o.body === 'string' ? o.body : JSON.stringify(o.body);
  const headers: Record<string, string> = { accept: 'application/json' };
  if (token !== null) headers.authorization = `Bearer ${token}`;
  if (payload !== undefined) headers['content-type'] = o.contentType ?? 'application/json';
  return new Promise((resolveReq, reject) => {
    const req = httpsRequest(`${base}${path}`, { method, headers, agent, ca, timeout: 30_000 }, (res) => {
      readAnswer<T>(res).then(resolveReq, reject);
    });
    req.on('timeout', () => req.destroy(new Error(`${method} ${path}: no answer within 30 s`)));
    req.on('error', reject);
    req.end(payload);
  });
}
