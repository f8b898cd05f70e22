// The Kubernetes pod runtime against a real kube-apiserver and etcd on a real node
// (test/support/kube-node.ts: the kubelet on containerd, every sandbox here under gVisor through
// the gvisor RuntimeClass): it schedules and runs the Pods the runtime creates, binds their PVCs to
// local PersistentVolumes, and serves the pods/exec the runtime's exec, spawn, PTY and files go
// through. Each test has a namespace of its own.
import { after, before, test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import type { PodRequest, PodState, PtySession } from '../../src/runtime/runtime.ts';
import { createKubeRuntime, type KubePodRuntime } from '../../src/runtime/kube/kube-runtime.ts';
import { LIST, parseListing } from '../../src/runtime/kube/files.ts';
import { SANDBOX_LABEL } from '../../src/runtime/kube/objects.ts';
import { isAsbError } from '../../src/errors.ts';
import { silentLogger } from '../../src/base/log.ts';
import { startKubeApiServer, KubectlError, type KubeApiServer } from '../support/kube-apiserver.ts';
import { startKubeNode, type KubeNode } from '../support/kube-node.ts';
import { KUBELET_SUBIDS } from '../support/kubelet-subids.ts';
import { waitFor } from '../support/wait.ts';
import { checkStreamedWrites } from '../support/streamed-writes.ts';

interface Pod {
  metadata: { name: string; uid: string; labels?: Record<string, string> };
  spec: { runtimeClassName?: string; hostUsers?: boolean; hostname?: string; subdomain?: string; nodeName?: string; volumes?: { name: string; persistentVolumeClaim?: { claimName: string } }[] };
}
interface Pvc {
  metadata: { name: string; labels?: Record<string, string> };
}
interface Service {
  spec: { clusterIP?: string; selector?: Record<string, string> };
}
interface NetworkPolicy {
  spec: { podSelector: { matchLabels?: Record<string, string> }; policyTypes: string[]; egress: { to: { ipBlock: { cidr: string; except?: string[] } }[] }[] };
}

let kube: KubeApiServer;
let kubelet: KubeNode;
before(async () => {
  kube = await startKubeApiServer({ etcdUnsafeNoFsync: true });
  kubelet = await startKubeNode(kube);
});
after(async () => {
  await kubelet.stop();
  await kube.stop();
});

let nsCount = 0;
async function runtimeIn(t: TestContext): Promise<{ runtime: KubePodRuntime; ns: string }> {
  const ns = `runtime-test-${++nsCount}`;
  await kube.kubectl(['create', 'namespace', ns]);
  const runtime = await createKubeRuntime({ kubeconfig: kube.kubeconfigPath, namespace: ns, log: silentLogger() });
  t.after(() => runtime.close());
  return { runtime, ns };
}

function sandbox(id: string, ns: string): PodRequest {
  return {
    id,
    uid: `uid-${id}`,
    namespace: ns,
    hostname: id,
    spec: {
      runtimeClassName: 'gvisor',
      containers: [{ name: 'main', image: 'agent-sandbox/base', env: [{ name: 'FROM_SPEC', value: 'spec-value' }], ports: [{ containerPort: 8080, name: 'http' }], volumeMounts: [{ name: 'workspace', mountPath: '/workspace' }] }],
    },
    volumeClaimTemplates: [{ metadata: { name: 'workspace' }, spec: { accessModes: ['ReadWriteOnce'], resources: { requests: { storage: '1Gi' } } } }],
    labels: { app: 'runtime-test' },
    service: true,
  };
}

async function get<T>(ns: string, kind: string, name: string): Promise<T | undefined> {
  try {
    return JSON.parse(await kube.kubectl(['get', '-n', ns, kind, name, '-o', 'json'])) as T;
  } catch (err) {
    if (err instanceof KubectlError && err.stderr.includes('NotFound')) return undefined;
    throw err;
  }
}

function stateOf(runtime: KubePodRuntime, id: string, want: (s: PodState) => boolean, what: string): Promise<PodState> {
  return waitFor(`${id}: ${what} (now ${JSON.stringify(runtime.state(id))})`, () => {
    const s = runtime.state(id);
    return Promise.resolve(want(s) ? s : undefined);
  }, 30_000);
}

const running = (s: PodState): boolean => s.phase === 'Running' && s.ready;

async function startedSandbox(t: TestContext, id: string): Promise<{ runtime: KubePodRuntime; ns: string }> {
  const env = await runtimeIn(t);
  await env.runtime.start(sandbox(id, env.ns));
  await stateOf(env.runtime, id, running, 'Running and ready');
  return env;
}

const text = (bytes: Uint8Array): string => Buffer.from(bytes).toString('utf8');

test('start makes the Pod (runtimeClassName passed through), its PVCs and headless Service; the state turns Running and ready with an IP; onChange fires', async (t) => {
  const { runtime, ns } = await runtimeIn(t);
  const changes: string[] = [];
  runtime.onChange((id) => changes.push(id));

  const first = await runtime.start(sandbox('sb1', ns));
  assert.notEqual(first.phase, 'Absent');
  const pod = await get<Pod>(ns, 'pod', 'sb1');
  assert.ok(pod, 'the Pod exists once start() resolves');
  assert.equal(pod.spec.runtimeClassName, 'gvisor');
  assert.equal(pod.spec.hostname, 'sb1');
  assert.equal(pod.spec.subdomain, 'sb1');
  assert.equal(pod.metadata.labels?.[SANDBOX_LABEL], 'sb1');
  assert.equal(pod.metadata.labels.app, 'runtime-test');
  assert.deepEqual(pod.spec.volumes?.find((v) => v.name === 'workspace')?.persistentVolumeClaim, { claimName: 'sb1-workspace' });
  const pvc = await get<Pvc>(ns, 'pvc', 'sb1-workspace');
  assert.equal(pvc?.metadata.labels?.[SANDBOX_LABEL], 'sb1');
  const service = await get<Service>(ns, 'service', 'sb1');
  assert.equal(service?.spec.clusterIP, 'None');
  assert.deepEqual(service.spec.selector, { [SANDBOX_LABEL]: 'sb1' });
  // The default egress policy: the internet without the private and link-local ranges.
  const np = await get<NetworkPolicy>(ns, 'networkpolicy', 'sb1');
  assert.deepEqual(np?.spec.podSelector.matchLabels, { [SANDBOX_LABEL]: 'sb1' });
  assert.deepEqual(np.spec.policyTypes, ['Egress']);
  const v4 = np.spec.egress[0]?.to.find((p) => p.ipBlock.cidr === '0.0.0.0/0');
  assert.ok(v4?.ipBlock.except?.includes('169.254.0.0/16') && v4.ipBlock.except.includes('10.0.0.0/8'), JSON.stringify(np.spec));
  // Replaced while it runs: internet off, one CIDR allowed.
  await runtime.setEgressPolicy('sb1', { internet: false, allow: ['203.0.113.0/24', 'api.example.com'], deny: [] });
  assert.deepEqual((await get<NetworkPolicy>(ns, 'networkpolicy', 'sb1'))?.spec.egress, [{ to: [{ ipBlock: { cidr: '203.0.113.0/24' } }] }]);

  const state = await stateOf(runtime, 'sb1', running, 'Running and ready');
  assert.match(state.ip ?? '', kubelet.kind === 'real' ? /^10\.246\.\d+\.\d+$/ : /^127\.77\.\d+\.\d+$/, `an IP of the pod network ${kubelet.podCidr}`);
  assert.ok(state.startedAt !== undefined);
  assert.ok(changes.includes('sb1'), 'onChange reported the new pod');
  assert.deepEqual(runtime.list(), ['sb1']);
  assert.equal((await get<Pod>(ns, 'pod', 'sb1'))?.spec.nodeName, kubelet.nodeName);

  const again = await runtime.start(sandbox('sb1', ns));
  assert.equal(again.phase, 'Running', 'start() of a running pod is a no-op');
  assert.equal((await get<Pod>(ns, 'pod', 'sb1'))?.metadata.uid, pod.metadata.uid);

  // A second runtime (a restarted worker) finds the pod from its list.
  const other = await createKubeRuntime({ kubeconfig: kube.kubeconfigPath, namespace: ns, log: silentLogger() });
  t.after(() => other.close());
  assert.deepEqual(other.list(), ['sb1']);
  assert.equal(other.state('sb1').phase, 'Running');
});

test('a runc sandbox Pod runs in a user namespace of its own (hostUsers: false): root in it is not root on the node, and two Pods are two host users', async (t) => {
  const { runtime, ns } = await runtimeIn(t);
  const runc = (id: string): PodRequest => ({ id, uid: `uid-${id}`, namespace: ns, hostname: id, spec: { containers: [{ name: 'main', image: 'agent-sandbox/base' }] } });
  const hosts: number[] = [];
  for (const id of ['us1', 'us2']) {
    await runtime.start(runc(id));
    await stateOf(runtime, id, running, 'Running and ready');
    assert.equal((await get<Pod>(ns, 'pod', id))?.spec.hostUsers, false);
    // The test kubelet runs no containers: what the node did with the field is the real node's to show.
    if (kubelet.kind !== 'real') continue;
    const map = text((await runtime.exec(id, { command: ['cat', '/proc/self/uid_map'] })).stdout).trim().split(/\s+/);
    assert.equal(map[0], '0');
    assert.equal(map[2], '65536');
    hosts.push(Number(map[1]));
  }
  if (kubelet.kind !== 'real') return;
  assert.ok(hosts.every((h) => h >= 65_536), `uid 0 in the pods is host uid ${hosts.join(' and ')}, not root`);
  assert.notEqual(hosts[0], hosts[1], 'each Pod has its own range');
  // From the node's own ids (the kubelet user's subordinate ids), never the local runtime's pool, which starts at 2^20 and fills from the bottom.
  const { start, count } = KUBELET_SUBIDS;
  assert.ok(hosts.every((h) => h >= start && h + 65_536 <= start + count), `host uids ${hosts.join(' and ')} are in the node's [${String(start)}, ${String(start + count)})`);
});

test('in a namespace enforcing Pod Security "restricted" (clusters/base/sandbox-namespace.yaml) the hardened Pod is admitted; a host-reaching one is refused by the API server', async (t) => {
  const { runtime, ns } = await runtimeIn(t);
  await kube.kubectl(['label', 'namespace', ns, 'pod-security.kubernetes.io/enforce=restricted', 'pod-security.kubernetes.io/enforce-version=latest']);
  await runtime.start(sandbox('psa1', ns));
  await stateOf(runtime, 'psa1', running, 'Running and ready');
  const hostile = sandbox('psa2', ns);
  hostile.spec = { ...hostile.spec, hostNetwork: true, containers: hostile.spec.containers.map((c) => ({ ...c, securityContext: { runAsUser: 0 } })) };
  await assert.rejects(runtime.start(hostile), (err: Error) => {
    assert.match(err.message, /violates PodSecurity "restricted:latest"/);
    assert.match(err.message, /hostNetwork/);
    assert.match(err.message, /runAsUser=0/);
    return true;
  });
  assert.equal(await get(ns, 'pod', 'psa2'), undefined);
});

test('exec: stdin in, stdout and stderr apart, the exit code; env, cwd and timeout through the wrapper', async (t) => {
  const { runtime } = await startedSandbox(t, 'sb2');

  const r = await runtime.exec('sb2', { command: ['sh', '-c', 'cat; echo oops >&2; exit 3'], stdin: 'hello from stdin' });
  assert.equal(text(r.stdout), 'hello from stdin');
  assert.equal(text(r.stderr), 'oops\n');
  assert.equal(r.exitCode, 3);
  assert.equal(r.timedOut, false);

  const env = await runtime.exec('sb2', { command: ['sh', '-c', 'echo "$GREETING $FROM_SPEC ${PWD##*/}"'], env: { GREETING: 'hi there' }, cwd: kubelet.kind === 'real' ? '/workspace' : 'workspace' });
  assert.equal(text(env.stdout), 'hi there spec-value workspace\n');
  assert.equal(env.exitCode, 0);

  assert.equal((await runtime.exec('sb2', { command: ['no-such-command-here'] })).exitCode, 127);
  assert.equal((await runtime.exec('sb2', { command: ['true'], cwd: 'no/such/dir' })).exitCode, 125);

  if (kubelet.kind === 'real') {
    // The image's user (uid 1000), with every capability dropped: its own uid runs, another is refused with the reason.
    assert.equal(text((await runtime.exec('sb2', { command: ['id', '-u'], user: 1000 })).stdout), '1000\n');
    await assert.rejects(runtime.exec('sb2', { command: ['id', '-u'], user: 65534 }),
      (err) => isAsbError(err, 'BadRequest') && err.message === 'the container runs as uid 1000, not root, and cannot switch to uid 65534');
  } else {
    // The test kubelet runs execs as root host processes: another uid through setpriv; refused with a reason where the image cannot.
    assert.equal(text((await runtime.exec('sb2', { command: ['id', '-u'], user: 65534 })).stdout), '65534\n');
    await assert.rejects(runtime.exec('sb2', { command: ['/usr/bin/id', '-u'], user: 65534, env: { PATH: '/nonexistent' } }),
      (err) => isAsbError(err, 'BadRequest') && err.message === 'cannot run as uid 65534: the image has no setpriv');
  }

  const slow = await runtime.exec('sb2', { command: ['sleep', '30'], timeoutMs: 300 });
  assert.equal(slow.timedOut, true);
  assert.equal(slow.exitCode, 137);

  const capped = await runtime.exec('sb2', { command: ['sh', '-c', 'head -c 100000 /dev/zero'], maxOutputBytes: 1000 });
  assert.equal(capped.stdout.length, 1000);
  assert.equal(capped.truncated, true);

  await assert.rejects(runtime.exec('nope', { command: ['true'] }), (err) => isAsbError(err, 'SandboxNotRunning'));
});

test('spawn: output streams as it comes, stdin reaches the process, kill signals it', async (t) => {
  const { runtime } = await startedSandbox(t, 'sb3');
  const proc = await runtime.spawn('sb3', { command: ['sh', '-c', 'echo ready; read line; echo "got $line"; echo done >&2'] });
  const out: string[] = [];
  let sawReady!: () => void;
  const ready = new Promise<void>((resolve) => (sawReady = resolve));
  proc.stdout.on('data', (c: Buffer) => {
    out.push(c.toString());
    if (out.join('').includes('ready\n')) sawReady();
  });
  const err: string[] = [];
  proc.stderr.on('data', (c: Buffer) => err.push(c.toString()));
  await ready; // printed before any input: it streamed, nothing waited for the end
  proc.stdin.end('typed\n');
  assert.deepEqual(await proc.exited, { exitCode: 0 });
  assert.equal(out.join(''), 'ready\ngot typed\n');
  assert.equal(err.join(''), 'done\n', 'the wrapper\'s pid line is not part of stderr');

  const sleeper = await runtime.spawn('sb3', { command: ['sleep', '30'] });
  sleeper.stdout.resume();
  sleeper.stderr.resume();
  await waitFor('the pid line of the spawned process', async () => {
    sleeper.kill('SIGTERM');
    const done = await Promise.race([sleeper.exited, new Promise<undefined>((r) => setTimeout(r, 200, undefined))]);
    return done;
  }, 10_000);
  assert.deepEqual(await sleeper.exited, { exitCode: 143, signal: 'SIGTERM' });
});

/** Reads the terminal until its output matches; sends `line` again every second (a few times) in case the shell was not reading yet. */
async function typeUntil(pty: PtySession, iterator: AsyncIterator<Uint8Array>, line: string, want: RegExp): Promise<string> {
  let seen = '';
  for (let attempt = 0; attempt < 10; attempt++) {
    await pty.write(line);
    const deadline = Date.now() + 1_000;
    while (Date.now() < deadline) {
      const next = await Promise.race([iterator.next(), new Promise<undefined>((r) => setTimeout(r, deadline - Date.now(), undefined))]);
      if (next === undefined) break;
      if (next.done === true) throw new Error(`terminal ended; output so far: ${JSON.stringify(seen)}`);
      seen += text(next.value);
      if (want.test(seen)) return seen;
    }
  }
  throw new Error(`no ${String(want)} in the terminal's output: ${JSON.stringify(seen)}`);
}

test('openPty: a terminal whose size follows resize; exit ends it with the code', async (t) => {
  const { runtime } = await startedSandbox(t, 'sb4');
  const pty = await runtime.openPty('sb4', { cols: 80, rows: 24, command: ['sh'] });
  t.after(() => pty.close());
  const output = pty.output[Symbol.asyncIterator]();
  await typeUntil(pty, output, 'stty size\n', /\b24 80\b/);
  pty.resize(132, 40);
  await typeUntil(pty, output, 'stty size\n', /\b40 132\b/);
  // Not `tty`: under gVisor the terminal is the sentry's, and ttyname() finds no /dev/pts entry for
  // it ("not a tty") although stdin is a terminal, as isatty() says.
  await typeUntil(pty, output, 'test -t 0 && test -t 1 && echo "on a ter""minal"\n', /on a terminal/);
  await pty.write('exit 5\n');
  assert.equal(await pty.exited, 5);
});

test('files: a streamed writeFile goes through spawn\'s stdin; the file changes only once the whole body arrived', async (t) => {
  const { runtime } = await startedSandbox(t, 'sb7');
  await runtime.exec('sb7', { command: ['mkdir', '-p', 'streams'] });
  await checkStreamedWrites(runtime, 'sb7', 'streams');
});

test('files: writeFile, readFile and listDir round trip through pods/exec', async (t) => {
  const { runtime } = await startedSandbox(t, 'sb5');
  const bytes = new Uint8Array(256 * 3).map((_, i) => i % 256);
  await runtime.writeFile('sb5', 'workspace/dir/blob.bin', bytes, 0o640);
  await runtime.writeFile('sb5', 'workspace/dir/with space\tand tab.txt', new TextEncoder().encode('odd name'));
  await runtime.writeFile('sb5', 'top.txt', new TextEncoder().encode('no parent dir'));
  assert.deepEqual(await runtime.readFile('sb5', 'workspace/dir/blob.bin'), bytes);
  assert.equal(text(await runtime.readFile('sb5', 'top.txt')), 'no parent dir');

  const entries = await runtime.listDir('sb5', 'workspace/dir');
  assert.deepEqual(entries.map((e) => [e.name, e.type, e.size]), [['blob.bin', 'file', 768], ['with space\tand tab.txt', 'file', 8]]);
  const blob = entries[0]!;
  assert.equal(blob.mode, 0o640);
  assert.ok(blob.path.startsWith('/') && blob.path.endsWith('/workspace/dir/blob.bin'), blob.path);
  assert.ok(Date.parse(blob.mtime) > Date.parse('2020-01-01'));
  assert.deepEqual((await runtime.listDir('sb5', 'workspace')).map((e) => [e.name, e.type]), [['dir', 'dir']]);

  await assert.rejects(runtime.readFile('sb5', 'workspace/missing'), (err) => isAsbError(err, 'NotFound'));
  await assert.rejects(runtime.readFile('sb5', 'workspace/dir'), (err) => isAsbError(err, 'BadRequest'));
  await assert.rejects(runtime.listDir('sb5', 'workspace/dir/blob.bin'), (err) => isAsbError(err, 'BadRequest'));
  await assert.rejects(runtime.listDir('sb5', 'nowhere'), (err) => isAsbError(err, 'NotFound'));

  // Where find has no -printf (busybox), the listing falls back to stat: same entries.
  await runtime.exec('sb5', { command: ['sh', '-c', 'mkdir -p bin-stat-only && ln -sf "$(command -v stat)" bin-stat-only/stat'] });
  const pwd = text((await runtime.exec('sb5', { command: ['pwd'] })).stdout).trim();
  const fallback = await runtime.exec('sb5', { command: ['/bin/sh', '-c', LIST, 'sh', 'workspace/dir'], env: { PATH: `${pwd}/bin-stat-only` } });
  assert.equal(fallback.exitCode, 0, text(fallback.stderr));
  assert.deepEqual(parseListing(fallback.stdout).map((e) => [e.name, e.type, e.size, e.mode, e.path]), entries.map((e) => [e.name, e.type, e.size, e.mode, e.path]));
});

test('stop deletes the Pod and keeps the PVCs (state Stopped); start again makes a new Pod on the same claims; remove deletes all', async (t) => {
  const { runtime, ns } = await startedSandbox(t, 'sb6');
  const before = await get<Pod>(ns, 'pod', 'sb6');
  await runtime.writeFile('sb6', '/workspace/kept.txt', new TextEncoder().encode('on the claim'));
  await runtime.writeFile('sb6', 'scratch.txt', new TextEncoder().encode('in the pod only'));
  const changes: string[] = [];
  runtime.onChange((id) => changes.push(id));

  await runtime.stop('sb6');
  assert.equal(await get<Pod>(ns, 'pod', 'sb6'), undefined, 'the Pod is gone');
  assert.ok(await get<Pvc>(ns, 'pvc', 'sb6-workspace'), 'the PVC is kept');
  assert.deepEqual(runtime.state('sb6'), { phase: 'Stopped', ready: false, uid: 'uid-sb6' }, 'the kept claims say whose sandbox they belong to');
  assert.deepEqual(runtime.list(), ['sb6']);
  assert.ok(changes.includes('sb6'), 'onChange reported the stop');
  await assert.rejects(runtime.exec('sb6', { command: ['true'] }), (err) => isAsbError(err, 'SandboxNotRunning'));
  await runtime.stop('sb6'); // idempotent

  await runtime.start(sandbox('sb6', ns));
  const woken = await get<Pod>(ns, 'pod', 'sb6');
  assert.ok(woken && woken.metadata.uid !== before?.metadata.uid, 'a new Pod');
  assert.deepEqual(woken.spec.volumes?.find((v) => v.name === 'workspace')?.persistentVolumeClaim, { claimName: 'sb6-workspace' });
  await stateOf(runtime, 'sb6', running, 'Running again');
  assert.equal(text(await runtime.readFile('sb6', '/workspace/kept.txt')), 'on the claim', 'the claim\'s data survived');
  await assert.rejects(runtime.readFile('sb6', 'scratch.txt'), (err) => isAsbError(err, 'NotFound'), 'outside the claims, nothing survives a stop on Kubernetes');

  changes.length = 0;
  await runtime.remove('sb6');
  assert.equal(await get<Pod>(ns, 'pod', 'sb6'), undefined);
  assert.equal(await get<Pvc>(ns, 'pvc', 'sb6-workspace'), undefined);
  assert.equal(await get<Service>(ns, 'service', 'sb6'), undefined);
  assert.equal(await get<NetworkPolicy>(ns, 'networkpolicy', 'sb6'), undefined);
  assert.deepEqual(runtime.state('sb6'), { phase: 'Absent', ready: false });
  assert.deepEqual(runtime.list(), []);
  assert.ok(changes.includes('sb6'), 'onChange reported the removal');
  await runtime.remove('sb6'); // idempotent
});
