// The local runtime with REAL sandboxes: namespaces, overlay root, bridge networking, exec, files,
// PTY, probes, hibernation and re-adoption. Needs root (as in CI). Its own subnet and bridge so it
// never collides with a running worker (10.213.0.0/16 on asb0).
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { get } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { Container } from '../src/api/types.ts';
import { isAsbError } from '../src/errors.ts';
import { checkStreamedWrites, chunks } from './support/streamed-writes.ts';
import { createLocalRuntime, type LocalRuntime } from '../src/runtime/local/local-runtime.ts';
import { volumeDir } from '../src/runtime/local/pod-process.ts';
import { podPaths } from '../src/runtime/local/rootfs.ts';
import type { PodRequest, PodState } from '../src/runtime/runtime.ts';
import { silentLogger } from '../src/base/log.ts';
import { FIRST_HOST_ID } from '../src/runtime/local/id-ranges.ts';
import { testImages, testImageStore } from './support/test-images.ts';
import { waitForPodState } from './support/pod-state.ts';
import { startTestRuntime, stopTestRuntime, type TestRuntime } from './support/test-runtime.ts';

const BRIDGE = 'asbt0';
const SUBNET = '10.214.0.0/16';
let root = '';
let rt: LocalRuntime;

let fixture: TestRuntime;

before(async () => {
  // pollIntervalMs: pods started before the launcher-kill test are watched by polling afterwards.
  fixture = await startTestRuntime('asb-runtime-', BRIDGE, SUBNET, { probeIntervalMs: 100, pollIntervalMs: 100 });
  ({ root, rt } = fixture);
});

after(() => stopTestRuntime(fixture));

function pod(id: string, container: Partial<Container> = {}): PodRequest {
  return { id, uid: `uid-${id}`, namespace: 'default', hostname: `${id}-host`, spec: { containers: [{ name: 'main', image: 'agent-sandbox/base', ...container }] } };
}

const text = (b: Uint8Array): string => Buffer.from(b).toString('utf8');

async function sh(id: string, script: string, stdin?: string): Promise<{ exitCode: number; out: string; err: string }> {
  const r = await rt.exec(id, stdin === undefined ? { command: ['sh', '-c', script] } : { command: ['sh', '-c', script], stdin });
  return { exitCode: r.exitCode, out: text(r.stdout), err: text(r.stderr) };
}


const waitForState = (id: string, pred: (s: PodState) => boolean, what: string): Promise<PodState> => waitForPodState(rt, id, pred, what);

function httpGet(url: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    get(url, { agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (c: string) => (body += c)).on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    }).on('error', reject);
  });
}

test('exec runs inside the pod: stdout, exit codes, stdin', async () => {
  const state = await rt.start(pod('exec1'));
  assert.equal(state.phase, 'Running');
  assert.equal(state.ready, true, 'a pod without a probe is ready once its command runs');
  const hello = await rt.exec('exec1', { command: ['echo', 'hello'] });
  assert.equal(text(hello.stdout), 'hello\n');
  assert.equal(hello.exitCode, 0);
  assert.equal((await sh('exec1', 'exit 3')).exitCode, 3);
  assert.equal((await sh('exec1', 'tr a-z A-Z', 'piped in')).out, 'PIPED IN');
  const err = await sh('exec1', 'echo oops >&2; exit 1');
  assert.deepEqual([err.exitCode, err.err], [1, 'oops\n']);
  const slow = await rt.exec('exec1', { command: ['sleep', '30'], timeoutMs: 200 });
  assert.equal(slow.timedOut, true);
  const big = await rt.exec('exec1', { command: ['head', '-c', '100000', '/dev/zero'], maxOutputBytes: 1000 });
  assert.deepEqual([big.stdout.length, big.truncated], [1000, true]);
});

test('a pod is isolated: own hostname, processes, user and filesystem', async () => {
  await rt.start(pod('iso1'));
  assert.equal((await sh('iso1', 'hostname')).out.trim(), 'iso1-host');
  assert.equal((await sh('iso1', 'id -u')).out.trim(), '1000');
  assert.equal((await sh('iso1', 'id -un')).out.trim(), 'user');
  assert.equal((await sh('iso1', 'echo $HOME')).out.trim(), '/home/user');
  const pids = (await sh('iso1', 'ls /proc | grep -E "^[0-9]+$"')).out.trim().split('\n');
  assert.ok(pids.length <= 5, `only the pod's few processes are visible, saw ${pids.join(' ')}`);
  assert.ok(pids.includes('1'));
  assert.notEqual((await sh('iso1', 'test -e /work')).exitCode, 0, '/work of the host is not visible');
  assert.equal((await sh('iso1', 'ls /home')).out.trim(), 'user');
  assert.equal((await sh('iso1', 'ls /root 2>&1; echo $?')).out.trim().endsWith('2'), true, '/root is not readable by the user');
  assert.equal((await sh('iso1', 'for c in bash python3 ls; do command -v $c; done | wc -l')).out.trim(), '3');
  // Host paths a write could reach must stay untouched: /usr writes land in the pod's own layer.
  assert.notEqual((await sh('iso1', 'touch /usr/bin/x 2>&1')).exitCode, 0, 'the user cannot write /usr');
  // The runtime's guarantees for every process (research/runtime.md §1b): none of them was held by a sandbox before runc.
  assert.match((await sh('iso1', 'grep -E "^(CapEff|CapBnd|NoNewPrivs|Seccomp):" /proc/self/status')).out, /CapEff:\t0{16}\nCapBnd:\t0{16}\nNoNewPrivs:\t1\nSeccomp:\t2/);
  // A user namespace of its own range: uid 0 in the sandbox is a host uid of the pool, nobody else's.
  const host = Number(/^\s*0\s+(\d+)\s+65536\s*$/.exec((await sh('iso1', 'cat /proc/self/uid_map')).out)?.[1]);
  assert.ok(host >= FIRST_HOST_ID && (host - FIRST_HOST_ID) % 65_536 === 0, `uid 0 is host uid ${String(host)}`);
});

test('the pod has its own IP, reachable from the host', async () => {
  const state = await rt.start(pod('net1', {
    command: ['python3', '-m', 'http.server', '8080', '--bind', '0.0.0.0', '--directory', '/home/user'],
    readinessProbe: { tcpSocket: { port: 8080 } },
  }));
  assert.match(state.ip ?? '', /^10\.214\./);
  await rt.writeFile('net1', '/home/user/index.html', Buffer.from('served from the sandbox'));
  await waitForState('net1', (s) => s.ready, 'ready');
  const res = await httpGet(`http://${state.ip ?? ''}:8080/index.html`);
  assert.deepEqual(res, { status: 200, body: 'served from the sandbox' });
});

test('hibernation keeps home, /tmp and the IP; exec refuses a stopped pod', async () => {
  const first = await rt.start(pod('hib1'));
  await sh('hib1', 'echo kept > ~/home.txt && echo kept-too > /tmp/tmp.txt && mkdir -p ~/.cache && echo x > ~/.cache/c');
  await rt.stop('hib1');
  assert.equal(rt.state('hib1').phase, 'Stopped');
  await assert.rejects(rt.exec('hib1', { command: ['true'] }), (err) => isAsbError(err, 'SandboxNotRunning'));
  const again = await rt.start(pod('hib1'));
  assert.equal(again.phase, 'Running');
  assert.equal(again.ip, first.ip);
  assert.notEqual(again.pid, first.pid);
  assert.equal((await sh('hib1', 'cat ~/home.txt /tmp/tmp.txt ~/.cache/c')).out, 'kept\nkept-too\nx\n');
});

test('security probe C1: a pod and its kept disk are never started for another sandbox uid of the same id', async () => {
  const holder = pod('uid1');
  assert.equal((await rt.start(holder)).uid, holder.uid);
  await sh('uid1', 'echo secret > ~/mine.txt');
  await rt.stop('uid1');
  assert.equal(rt.state('uid1').uid, holder.uid, 'a hibernated pod still says whose disk it keeps');
  await assert.rejects(rt.start({ ...holder, uid: 'someone-else' }), (err) => isAsbError(err, 'Conflict'));
  assert.equal(rt.state('uid1').phase, 'Stopped', 'the refused start did not wake the holder\'s pod');
  await rt.start(holder);
  assert.equal((await sh('uid1', 'cat ~/mine.txt')).out, 'secret\n');
});

test('volumes from claim templates survive remove of the process and are mounted for the user', async () => {
  const req = pod('vol1', { volumeMounts: [{ name: 'workspace', mountPath: '/workspace' }] });
  req.volumeClaimTemplates = [{ metadata: { name: 'workspace' }, spec: {} }];
  const started = await rt.start(req);
  assert.equal(started.phase, 'Running', started.message);
  assert.equal((await sh('vol1', 'echo data > /workspace/f && cat /workspace/f')).out, 'data\n');
  await rt.stop('vol1');
  await rt.start(req);
  assert.equal((await sh('vol1', 'cat /workspace/f')).out, 'data\n');
  assert.ok(existsSync(join(root, 'pods', 'vol1', 'disk', 'volumes', 'workspace', 'f')), 'on the pod\'s disk (runtime-disk.test.ts)');
});

test('a claimName escaping the volumes root is refused at start, even past the API\'s validation', async () => {
  // The victim's volume and a host directory the attacker's claimName aims at.
  const victim = pod('victim1', { volumeMounts: [{ name: 'home', mountPath: '/home/user' }] });
  victim.volumeClaimTemplates = [{ metadata: { name: 'home' }, spec: {} }];
  assert.equal((await rt.start(victim)).phase, 'Running');
  assert.equal((await sh('victim1', 'echo secret > /home/user/secret.txt')).exitCode, 0);
  const hostDir = await mkdtemp(join(tmpdir(), 'asb-hostdir-'));
  const climb = '../'.repeat(join(root, 'volumes', 'x').split('/').length);
  for (const [i, claimName] of ['../victim1/home', `${climb}${hostDir.slice(1)}`, 'home/../../victim1/home', 'other'].entries()) {
    const id = `esc${i}`;
    const req = pod(id, { command: ['sleep', 'infinity'], volumeMounts: [{ name: 'x', mountPath: '/stolen' }] });
    req.spec.volumes = [{ name: 'x', persistentVolumeClaim: { claimName } }];
    req.volumeClaimTemplates = [{ metadata: { name: 'home' }, spec: {} }];
    const state = await rt.start(req);
    assert.equal(state.phase, 'Failed', `${claimName}: ${JSON.stringify(state)}`);
    assert.match(state.message ?? '', /not one of this pod's volumeClaimTemplates/);
    assert.deepEqual(await readdir(hostDir), [], 'nothing is made in the host directory');
    await rt.remove(id);
  }
  assert.deepEqual(await readdir(join(root, 'pods', 'victim1', 'disk', 'volumes')), ['home'], 'nothing is made beside the victim\'s volume');
  await rm(hostDir, { recursive: true, force: true });
});

test('volume directories stay inside their roots whatever the request says (volumeDir)', () => {
  const paths = podPaths(root, 'p1');
  const base: PodRequest = { ...pod('p1'), volumeClaimTemplates: [{ metadata: { name: 'data' }, spec: {} }, { metadata: { name: '..' }, spec: {} }] };
  assert.equal(volumeDir(base, 'data', paths), join(paths.volumes, 'data'));
  assert.equal(volumeDir({ ...base, spec: { ...base.spec, volumes: [{ name: 'x', persistentVolumeClaim: { claimName: 'data' } }] } }, 'x', paths), join(paths.volumes, 'data'));
  assert.equal(volumeDir(base, 'scratch', paths), join(paths.emptyDirs, 'scratch'));
  // A volumeClaimTemplate named '..' (never valid at the API) still does not leave the root.
  assert.throws(() => volumeDir(base, '..', paths), /outside the pod's volumes/);
  assert.throws(() => volumeDir({ ...base, spec: { ...base.spec, volumes: [{ name: 'x', persistentVolumeClaim: { claimName: '..' } }] } }, 'x', paths), /outside the pod's volumes/);
  assert.throws(() => volumeDir(base, '../../etc', paths), /outside the pod's volumes/);
});

test('writeFile streams: the file changes only once the whole body arrived; a failed stream leaves it and no temporary file', async () => {
  await rt.start(pod('stream1'));
  await sh('stream1', 'mkdir -p /home/user/streams');
  await checkStreamedWrites(rt, 'stream1', '/home/user/streams');
  await assert.rejects(rt.writeFile('stream1', '/usr/bin/evil', chunks(2)), (err) => isAsbError(err, 'Forbidden'));
  await rt.remove('stream1');
});

test('files API reads, writes and lists inside the sandbox', async () => {
  await rt.start(pod('files1'));
  await rt.writeFile('files1', '/home/user/deep/dir/a.txt', Buffer.from('alpha'), 0o600);
  assert.equal(text(await rt.readFile('files1', '/home/user/deep/dir/a.txt')), 'alpha');
  assert.equal((await sh('files1', 'stat -c %a:%U ~/deep/dir/a.txt')).out.trim(), '600:user');
  const entries = await rt.listDir('files1', '/home/user/deep/dir');
  assert.deepEqual(entries.map((e) => [e.name, e.path, e.type, e.size, e.mode]), [['a.txt', '/home/user/deep/dir/a.txt', 'file', 5, 0o600]]);
  await assert.rejects(rt.readFile('files1', '/home/user/missing'), (err) => isAsbError(err, 'NotFound') && err.message.includes('/home/user/missing'));
  await assert.rejects(rt.listDir('files1', '/nope'), (err) => isAsbError(err, 'NotFound'));
  await assert.rejects(rt.readFile('files1', '/home/user'), (err) => isAsbError(err, 'BadRequest'));
  await assert.rejects(rt.writeFile('files1', '/usr/bin/evil', Buffer.from('x')), (err) => isAsbError(err, 'Forbidden'));
  // A symlink made inside the sandbox resolves inside it: the pod's /etc/hostname, not the host's.
  await sh('files1', 'ln -s /etc/hostname ~/link');
  assert.equal(text(await rt.readFile('files1', '/home/user/link')), 'files1-host\n');
  const listed = await rt.listDir('files1', '/home/user');
  assert.equal(listed.find((e) => e.name === 'link')?.type, 'symlink');
});

test('readiness probes: exec, tcp and http turn ready only when their condition holds', async () => {
  await rt.start(pod('probe-exec', { readinessProbe: { exec: { command: ['test', '-f', '/tmp/ready'] } } }));
  await rt.start(pod('probe-tcp', { readinessProbe: { tcpSocket: { port: 'web' } }, ports: [{ containerPort: 9000, name: 'web' }] }));
  await rt.start(pod('probe-http', {
    command: ['python3', '-m', 'http.server', '9001', '--directory', '/tmp'],
    readinessProbe: { httpGet: { path: '/ok', port: 9001 } },
  }));
  // The http server answers 404 for /ok until the file exists.
  for (let i = 0; i < 100 && (await sh('probe-http', 'python3 -c "import socket; socket.create_connection((\'127.0.0.1\', 9001))"')).exitCode !== 0; i++);
  assert.equal(rt.state('probe-exec').ready, false);
  assert.equal(rt.state('probe-tcp').ready, false);
  assert.equal(rt.state('probe-http').ready, false);
  await rt.writeFile('probe-exec', '/tmp/ready', Buffer.from(''));
  await waitForState('probe-exec', (s) => s.ready, 'exec probe ready');
  await sh('probe-tcp', 'nohup python3 -m http.server 9000 >/dev/null 2>&1 &');
  await waitForState('probe-tcp', (s) => s.ready, 'tcp probe ready');
  await rt.writeFile('probe-http', '/tmp/ok', Buffer.from('ok'));
  await waitForState('probe-http', (s) => s.ready, 'http probe ready');
  await sh('probe-exec', 'rm /tmp/ready');
  await waitForState('probe-exec', (s) => !s.ready, 'exec probe unready after failures');
});

test('pty: a real terminal with resize and echo', async () => {
  await rt.start(pod('pty1'));
  const session = await rt.openPty('pty1', { cols: 80, rows: 24, command: ['bash', '--norc', '--noprofile'] });
  const reader = session.output[Symbol.asyncIterator]();
  let seen = '';
  const waitOutput = async (needle: string): Promise<void> => {
    while (!seen.includes(needle)) {
      const next = await reader.next();
      if (next.done === true) throw new Error(`terminal ended before "${needle}"; saw ${JSON.stringify(seen)}`);
      seen += text(next.value);
    }
  };
  await session.write('stty size; echo "mark-$((40+2))"\n');
  await waitOutput('mark-42');
  assert.match(seen, /24 80/);
  session.resize(132, 50);
  seen = '';
  await session.write('stty size; tty; echo "done-$((1+1))"\n');
  await waitOutput('done-2');
  assert.match(seen, /50 132/);
  assert.match(seen, /\/dev\/pts\/\d+/);
  await session.write('exit 7\n');
  assert.equal(await session.exited, 7);
  session.close();
});

test('a new runtime on the same root re-adopts running pods', async () => {
  const state = await rt.start(pod('adopt1'));
  const rt2 = await createLocalRuntime({ root, log: silentLogger(), images: await testImageStore(), bridge: BRIDGE, subnet: SUBNET, probeIntervalMs: 100 });
  try {
    const adopted = rt2.state('adopt1');
    assert.deepEqual([adopted.phase, adopted.pid, adopted.ip], ['Running', state.pid, state.ip]);
    assert.equal(rt2.state('hib1').phase === 'Running' || rt2.state('hib1').phase === 'Stopped', true);
    assert.equal(text((await rt2.exec('adopt1', { command: ['hostname'] })).stdout), 'adopt1-host\n');
    // The new runtime notices when the adopted pod ends.
    const ended = new Promise<void>((resolve) => rt2.onChange((id) => id === 'adopt1' && rt2.state('adopt1').phase !== 'Running' && resolve()));
    await rt.stop('adopt1');
    await ended;
  } finally {
    await rt2.close();
  }
});

test('a container that exits reports its code; an unknown image fails clearly', async () => {
  await rt.start(pod('exit1', { command: ['sh', '-c', 'exit 4'] }));
  const done = await waitForState('exit1', (s) => s.phase === 'Failed', 'failed');
  assert.equal(done.exitCode, 4);
  // Loopback registries only: this test process's registry, which has no such image.
  const missing = `${(await testImages()).address}/acme/private-thing:9`;
  const bad = await rt.start(pod('bad1', { image: missing }));
  assert.equal(bad.phase, 'Failed');
  assert.equal(bad.reason, 'ErrImagePull');
  assert.ok(bad.message?.includes(missing), bad.message);
  assert.match(bad.message ?? '', /manifest unknown/, 'the registry\'s answer');
});

test('remove deletes the pod dir and volumes', async () => {
  await rt.start(pod('rm1'));
  assert.ok(existsSync(join(root, 'pods', 'rm1')));
  await rt.remove('rm1');
  assert.equal(rt.state('rm1').phase, 'Absent');
  assert.equal(existsSync(join(root, 'pods', 'rm1')), false);
  assert.equal(rt.list().includes('rm1'), false);
});

test('killing the launcher (kill -9) leaves running pods alone; it restarts and starts new pods', async () => {
  const running = await rt.start(pod('lch1'));
  const launcher = rt.launcherPid;
  assert.ok(launcher !== undefined && running.pid !== undefined);
  process.kill(launcher, 'SIGKILL');
  // Started at once, racing the launcher's death: it must land on the restarted launcher.
  const fresh = await rt.start(pod('lch2'));
  assert.equal(fresh.phase, 'Running', fresh.message);
  assert.equal(text((await rt.exec('lch2', { command: ['hostname'] })).stdout), 'lch2-host\n');
  assert.notEqual(rt.launcherPid, launcher, 'a new launcher runs');
  assert.equal(rt.state('lch1').phase, 'Running');
  assert.equal(text((await rt.exec('lch1', { command: ['hostname'] })).stdout), 'lch1-host\n', 'the pod outlived its launcher');
  assert.equal(processAlive(running.pid), true);
  // Its exit is still noticed (by polling now): stop() completes and the pod is Stopped.
  await rt.stop('lch1');
  assert.equal(rt.state('lch1').phase, 'Stopped');
  assert.equal(processAlive(running.pid), false);
});

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

test('a running container that exits later reports its exit code; 0 is Succeeded, a signal is 128+n', async () => {
  // The pause after the file appears lets the exec that wrote it leave the pod first: when the
  // pod's init exits, everything still in its PID namespace is killed, that exec included.
  const waitForFile = 'while [ ! -f /tmp/go ]; do sleep 0.05; done; sleep 0.3';
  await rt.start(pod('code9', { command: ['sh', '-c', `${waitForFile}; exit 9`] }));
  await rt.start(pod('code0', { command: ['sh', '-c', `${waitForFile}; exit 0`] }));
  await rt.start(pod('killed', { command: ['sh', '-c', `${waitForFile}; kill -KILL $$`] }));
  for (const id of ['code9', 'code0', 'killed']) {
    assert.equal(rt.state(id).phase, 'Running');
    await rt.writeFile(id, '/tmp/go', Buffer.from(''));
  }
  assert.equal((await waitForState('code9', (s) => s.phase === 'Failed', 'failed')).exitCode, 9);
  assert.equal((await waitForState('code0', (s) => s.phase === 'Succeeded', 'succeeded')).exitCode, 0);
  assert.equal((await waitForState('killed', (s) => s.phase === 'Failed', 'failed')).exitCode, 137);
});

test('argv and env reach the container byte for byte: spaces, quotes, newlines, UTF-8, empty', async () => {
  const args = ['two  spaces', `"double" 'single' \\back`, 'line1\nline2\n', 'ünïcødé ✓ 沙箱', '', '$HOME `id` $(id) ;|&*'];
  await rt.start(pod('argv1', {
    command: ['sh', '-c', 'i=0; for a in "$@"; do printf %s "$a" > /tmp/arg$i; i=$((i+1)); done; printf %s "$#" > /tmp/argc; printf %s "$WEIRD" > /tmp/env; exec sleep infinity', 'sh'],
    args,
    env: [{ name: 'WEIRD', value: 'a=b\nc "d" ✓' }],
    readinessProbe: { exec: { command: ['test', '-f', '/tmp/env'] } }, // ready once the files are written
  }));
  await waitForState('argv1', (s) => s.ready, 'ready');
  assert.equal(text(await rt.readFile('argv1', '/tmp/argc')), String(args.length));
  for (const [i, arg] of args.entries()) assert.equal(text(await rt.readFile('argv1', `/tmp/arg${i}`)), arg);
  assert.equal(text(await rt.readFile('argv1', '/tmp/env')), 'a=b\nc "d" ✓');
});

/** Pids whose command line names this pod's dir: its shim (oci-shim -d <dir>). */
async function podProcesses(id: string): Promise<number[]> {
  const pids: number[] = [];
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const cmdline = await readFile(`/proc/${entry}/cmdline`, 'utf8').catch(() => '');
    if (cmdline.includes(`\0${join(root, 'pods', id)}\0`)) pids.push(Number(entry));
  }
  return pids;
}

// Regression: a launcher started by a launch() was sent that first start twice, so a fresh
// runtime's first pod ran twice and one copy was left behind, untracked, after stop().
test('the first pod of a fresh runtime starts once and leaves nothing behind when stopped', async () => {
  const rt3 = await createLocalRuntime({ root, log: silentLogger(), images: await testImageStore(), bridge: BRIDGE, subnet: SUBNET });
  try {
    const state = await rt3.start(pod('once1'));
    assert.equal(state.phase, 'Running', state.message);
    assert.equal((await podProcesses('once1')).length, 1, 'one shim');
    assert.ok(state.pid !== undefined && processAlive(state.pid), 'and the container\'s init');
    await rt3.stop('once1');
    assert.deepEqual(await podProcesses('once1'), []);
    assert.equal(processAlive(state.pid), false);
  } finally {
    await rt3.close();
  }
});
