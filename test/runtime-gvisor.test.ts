// The local runtime with `runtimeClassName: gvisor`: the pod runs under gVisor's runsc (make runsc)
// through the same shim, exec, files and terminal code as runc's pods. Needs root, like
// test/runtime-local.test.ts. Its own bridge and subnet (asbgv0, 10.207.0.0/16), so it never
// collides with a running worker or another test file.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { get } from 'node:http';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { Container } from '../src/api/types.ts';
import { podSecurityProblems } from '../src/api/pod-security.ts';
import { isAsbError } from '../src/errors.ts';
import { createLocalRuntime, type LocalRuntime } from '../src/runtime/local/local-runtime.ts';
import { podPaths } from '../src/runtime/local/rootfs.ts';
import type { PodRequest, PodState } from '../src/runtime/runtime.ts';
import { FIRST_HOST_ID } from '../src/runtime/local/id-ranges.ts';
import { silentLogger } from '../src/base/log.ts';
import { testImageStore } from './support/test-images.ts';
import { waitForPodState } from './support/pod-state.ts';
import { startTestRuntime, stopTestRuntime, type TestRuntime } from './support/test-runtime.ts';

const BRIDGE = 'asbgv0';
const SUBNET = '10.207.0.0/16';
let root = '';
let rt: LocalRuntime;

let fixture: TestRuntime;

before(async () => {
  fixture = await startTestRuntime('asb-gvisor-', BRIDGE, SUBNET, { probeIntervalMs: 100, pollIntervalMs: 100 });
  ({ root, rt } = fixture);
});

after(() => stopTestRuntime(fixture));

/** A pod of the base image, under gVisor unless runtimeClassName says otherwise (null: none, so runc). */
function pod(id: string, container: Partial<Container> = {}, runtimeClassName: string | null = 'gvisor'): PodRequest {
  return {
    id, uid: `uid-${id}`, namespace: 'default', hostname: `${id}-host`,
    spec: { ...(runtimeClassName === null ? {} : { runtimeClassName }), containers: [{ name: 'main', image: 'agent-sandbox/base', ...container }] },
  };
}

const text = (b: Uint8Array): string => Buffer.from(b).toString('utf8');

async function sh(id: string, script: string, stdin?: string): Promise<{ exitCode: number; out: string; err: string }> {
  const r = await rt.exec(id, stdin === undefined ? { command: ['sh', '-c', script] } : { command: ['sh', '-c', script], stdin });
  return { exitCode: r.exitCode, out: text(r.stdout), err: text(r.stderr) };
}

/** Starts the pod and checks, from the host, what runs it: gVisor's sandbox process (the sentry), or runc's init. */
async function started(req: PodRequest): Promise<PodState> {
  const state = await rt.start(req);
  assert.equal(state.phase, 'Running', `${req.id}: ${JSON.stringify(state)}`);
  const argv0 = (await readFile(`/proc/${String(state.pid)}/cmdline`, 'utf8')).split('\0')[0];
  assert.equal(argv0 === 'runsc-sandbox', req.spec.runtimeClassName === 'gvisor', `${req.id}'s init is ${String(argv0)}`);
  return state;
}


const waitForState = (id: string, pred: (s: PodState) => boolean, what: string): Promise<PodState> => waitForPodState(rt, id, pred, what);

function httpGet(url: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = get(url, { agent: false, timeout: 2000 }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (c: string) => (body += c)).on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('timeout', () => req.destroy(new Error(`GET ${url} timed out`)));
    req.on('error', reject);
  });
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;

test('a gvisor pod runs on gVisor\'s kernel, not the host\'s; a pod without a runtimeClassName stays on runc', async () => {
  await started(pod('kern1'));
  await started(pod('kern0', {}, null));
  const gvisor = await sh('kern1', 'uname -r; cat /proc/version');
  assert.equal(gvisor.exitCode, 0, gvisor.err);
  assert.match(gvisor.out, /^\S*gvisor\n^Linux version \S*gvisor /m, gvisor.out);
  // The kernel log is refused, as under Docker's RuntimeDefault (syslog needs CAP_SYSLOG): gVisor enforces the profile.
  assert.match((await sh('kern1', 'dmesg; echo "exit=$?"')).out, /exit=[1-9]/);
  const runc = await sh('kern0', 'uname -r');
  assert.doesNotMatch(runc.out, /gvisor/);
  assert.equal(runc.out.trim(), (await readFile('/proc/sys/kernel/osrelease', 'utf8')).trim(), 'runc: the host kernel');
  // Hardened as runc's pods are: no capabilities, no_new_privs, seccomp (enforced by gVisor), a user namespace.
  assert.match((await sh('kern1', 'grep -E "^(CapEff|CapBnd|NoNewPrivs|Seccomp):" /proc/self/status')).out, /CapEff:\t0{16}\nCapBnd:\t0{16}\nNoNewPrivs:\t1\nSeccomp:\t2/);
  // The sentry runs in the pod's user namespace on the host: root in the sandbox is the first host uid of the pod's own range.
  const sandboxPid = rt.state('kern1').pid ?? 0;
  const host = Number(/^\s*0\s+(\d+)\s+65536\s*$/.exec(await readFile(`/proc/${String(sandboxPid)}/uid_map`, 'utf8'))?.[1]);
  assert.ok(host >= FIRST_HOST_ID, `uid 0 is host uid ${String(host)}`);
  const byRoot = await rt.exec('kern1', { command: ['touch', '/by-root'], user: 0 });
  assert.equal(byRoot.exitCode, 0, text(byRoot.stderr));
  assert.equal((await stat(join(podPaths(root, 'kern1').upper, 'by-root'))).uid, host);
  assert.equal(rt.rootIsolation.gvisor, true);
  // So pod security lets a root pod through with gVisor, as it does on Kubernetes with a gvisor RuntimeClass.
  assert.deepEqual(podSecurityProblems({ runtimeClassName: 'gvisor', securityContext: { runAsUser: 0 }, containers: [{ name: 'main' }] }, 'baseline', 'spec', { userNamespace: 'never', gvisor: rt.rootIsolation.gvisor }), []);
});

test('exec under gVisor: the pod\'s user and environment, output, exit codes, stdin; a timeout kills the command and its children, and the sandbox still answers', async () => {
  await started(pod('exec1', { env: [{ name: 'GREETING', value: 'hi there' }] }));
  const who = await sh('exec1', 'id -u; id -g; echo "$HOME|$GREETING|$PWD"; grep -E "^CapEff" /proc/self/status');
  // $PWD: the container's working directory (the base image's WorkingDir), as runc exec gives it.
  assert.equal(who.out, '1000\n1000\n/home/user|hi there|/home/user\nCapEff:\t0000000000000000\n', who.err);
  assert.equal((await sh('exec1', 'exit 3')).exitCode, 3);
  assert.equal((await sh('exec1', 'tr a-z A-Z', 'piped in')).out, 'PIPED IN');
  const err = await sh('exec1', 'echo oops >&2; exit 1');
  assert.deepEqual([err.exitCode, err.err], [1, 'oops\n']);
  // A command that cannot start: runc's exit code and words, from the pod's init (agent.ts).
  const missing = await rt.exec('exec1', { command: ['no-such-command'] });
  assert.equal(missing.exitCode, 255);
  assert.match(text(missing.stderr), /exec: "no-such-command": executable file not found in \$PATH/);
  const badCwd = await rt.exec('exec1', { command: ['true'], cwd: '/nope' });
  assert.deepEqual([badCwd.exitCode, /chdir to cwd \("\/nope"\): No such file or directory/.test(text(badCwd.stderr))], [255, true], text(badCwd.stderr));
  // Another user, as E2B's `user: "root"` asks: root of the sandbox's user namespace, with nothing more.
  const root0 = await rt.exec('exec1', { command: ['sh', '-c', 'id -u; echo $HOME; grep -E "^CapEff" /proc/self/status'], user: 0 });
  assert.equal(text(root0.stdout), '0\n/root\nCapEff:\t0000000000000000\n');

  const began = performance.now();
  const slow = await rt.exec('exec1', { command: ['sh', '-c', 'sleep 60 & echo $! > /tmp/child; sleep 60'], timeoutMs: 300 });
  assert.equal(slow.timedOut, true);
  assert.equal(slow.signal, 'SIGKILL');
  assert.ok(performance.now() - began < 10_000, 'the exec returned once killed');
  const child = (await sh('exec1', 'cat /tmp/child')).out.trim();
  assert.match(child, /^\d+$/);
  assert.notEqual((await sh('exec1', `kill -0 ${child}`)).exitCode, 0, 'the command\'s background child went with it');
  assert.equal((await sh('exec1', 'ps -eo args | grep -c "^sleep 60"')).out.trim(), '0', 'nothing of it is left in the sandbox');

  // spawn(): a streaming process, killed through the same path.
  const proc = await rt.spawn('exec1', { command: ['sh', '-c', 'echo started; exec sleep 60'] });
  const first = await new Promise<string>((resolve) => proc.stdout.once('data', (c: Buffer) => resolve(c.toString())));
  assert.equal(first, 'started\n');
  proc.kill('SIGTERM');
  assert.deepEqual(await proc.exited, { exitCode: 143, signal: 'SIGTERM' });
  assert.equal((await sh('exec1', 'echo still here')).out, 'still here\n');
});

// Regression: runsc answers EPERM for every refused syscall, ignoring the profile's errnoRet
// (google/gvisor#14688), so clone3's ENOSYS never reached glibc, which then does not fall back to
// clone: python3 said "can't start new thread" and http.server served nothing.
test('programs start threads under gVisor: clone3 answers ENOSYS so glibc falls back to clone; clone3 and unshare stay refused', async () => {
  await started(pod('thread1'));
  const threads = await sh('thread1', 'python3 -c "import threading; t = threading.Thread(target=lambda: print(\'in a thread\')); t.start(); t.join()"');
  assert.deepEqual([threads.exitCode, threads.out], [0, 'in a thread\n'], threads.err);
  const clone3 = await sh('thread1', 'python3 -c "import ctypes; libc = ctypes.CDLL(None, use_errno=True); print(libc.syscall(435, 0, 0), ctypes.get_errno())"');
  assert.equal(clone3.out, '-1 38\n', 'clone3 is refused with ENOSYS, never run');
  assert.match((await sh('thread1', 'unshare -U true 2>&1; echo "exit=$?"')).out, /Operation not permitted\nexit=1/);
});

test('files API under gVisor: write, read and list inside the sandbox, as its user', async () => {
  await started(pod('files1'));
  await rt.writeFile('files1', '/home/user/deep/dir/a.txt', Buffer.from('alpha'), 0o600);
  assert.equal(text(await rt.readFile('files1', '/home/user/deep/dir/a.txt')), 'alpha');
  assert.equal((await sh('files1', 'stat -c %a:%U ~/deep/dir/a.txt')).out.trim(), '600:user');
  const entries = await rt.listDir('files1', '/home/user/deep/dir');
  assert.deepEqual(entries.map((e) => [e.name, e.type, e.size, e.mode]), [['a.txt', 'file', 5, 0o600]]);
  await assert.rejects(rt.readFile('files1', '/home/user/missing'), (err) => isAsbError(err, 'NotFound'));
  await assert.rejects(rt.writeFile('files1', '/usr/bin/evil', Buffer.from('x')), (err) => isAsbError(err, 'Forbidden'));
  await sh('files1', 'ln -s /etc/hostname ~/link');
  assert.equal(text(await rt.readFile('files1', '/home/user/link')), 'files1-host\n', 'a symlink resolves inside the sandbox');
});

test('a terminal under gVisor: echo, its size from the start, resize, exit code', async () => {
  await started(pod('pty1'));
  const session = await rt.openPty('pty1', { cols: 100, rows: 30, command: ['bash', '--norc', '--noprofile'] });
  const reader = session.output[Symbol.asyncIterator]();
  let seen = '';
  const waitOutput = async (needle: string): Promise<void> => {
    while (!seen.includes(needle)) {
      const next = await reader.next();
      if (next.done === true) throw new Error(`terminal ended before "${needle}"; saw ${JSON.stringify(seen)}`);
      seen += text(next.value);
    }
  };
  await session.write('stty size; id -u; uname -r; echo "mark-$((40+2))"\n');
  await waitOutput('mark-42');
  assert.match(seen, /30 100/);
  assert.match(seen, /\b1000\b/);
  assert.match(seen, /gvisor/);
  session.resize(132, 50);
  // gVisor's terminal takes the new size a moment later (runc's at once): asked until it shows.
  for (let attempt = 1; ; attempt++) {
    seen = '';
    // The mark is computed, so the echo of the typed line never matches it.
    await session.write(`stty size; echo "done-$((${String(attempt)}+1000))"\n`);
    await waitOutput(`done-${String(attempt + 1000)}`);
    if (/50 132/.test(seen) || attempt === 50) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  assert.match(seen, /50 132/);
  await session.write('exit 7\n');
  assert.equal(await session.exited, 7);
  session.close();
  await assert.rejects(rt.openPty('pty1', { cols: 80, rows: 24, command: ['zsh'] }), (err) => isAsbError(err, 'BadRequest') && /"zsh": executable file not found/.test(err.message));
  // Closing a terminal hangs up its shell inside the sandbox: nothing of it is left running there.
  const second = await rt.openPty('pty1', { cols: 80, rows: 24, command: ['bash', '--norc', '--noprofile'] });
  assert.equal((await sh('pty1', 'ps -eo args | grep -c "^bash --norc"')).out.trim(), '1');
  second.close();
  await second.exited;
  assert.equal((await sh('pty1', 'ps -eo args | grep -c "^bash --norc"')).out.trim(), '0');
});

test('the host reaches a server in a gvisor pod by its IP, before and after hibernation; hibernation keeps home, /tmp and the IP', async () => {
  const req = pod('net1', {
    command: ['python3', '-m', 'http.server', '8080', '--bind', '0.0.0.0', '--directory', '/home/user'],
    readinessProbe: { tcpSocket: { port: 8080 } },
  });
  const first = await started(req);
  assert.match(first.ip ?? '', /^10\.207\./);
  await rt.writeFile('net1', '/home/user/index.html', Buffer.from('served from gVisor'));
  await sh('net1', 'echo kept-too > /tmp/tmp.txt');
  await waitForState('net1', (s) => s.ready, 'ready');
  assert.deepEqual(await httpGet(`http://${first.ip ?? ''}:8080/index.html`), { status: 200, body: 'served from gVisor' });

  await rt.stop('net1');
  assert.equal(rt.state('net1').phase, 'Stopped');
  assert.equal(existsSync(join(root, 'pods', 'net1', 'netns')) && (await readFile('/proc/mounts', 'utf8')).includes(join(root, 'pods', 'net1', 'netns')), false, 'the pod\'s network namespace is gone with it');
  await assert.rejects(rt.exec('net1', { command: ['true'] }), (err) => isAsbError(err, 'SandboxNotRunning'));
  const again = await started(req);
  assert.equal(again.ip, first.ip);
  assert.notEqual(again.pid, first.pid);
  assert.equal((await sh('net1', 'cat ~/index.html /tmp/tmp.txt')).out, 'served from gVisorkept-too\n');
  await waitForState('net1', (s) => s.ready, 'ready after the wake');
  assert.deepEqual(await httpGet(`http://${again.ip ?? ''}:8080/index.html`), { status: 200, body: 'served from gVisor' });
});

test('stop() reaches the command inside gVisor with SIGTERM: it exits on its own terms, well within the grace', async () => {
  const trap = 'trap "echo terminated > /home/user/bye; exit 0" TERM; touch /tmp/trapped; while :; do sleep 0.05; done';
  await started(pod('term1', { command: ['bash', '-c', trap], readinessProbe: { exec: { command: ['test', '-f', '/tmp/trapped'] } } }));
  // Ready once the trap is set: a SIGTERM before that would end bash without it.
  await waitForState('term1', (s) => s.ready, 'ready');
  const began = performance.now();
  await rt.stop('term1');
  const stopMs = performance.now() - began;
  assert.ok(stopMs < 1500, `stopped gracefully, not by the SIGKILL after the 2 s grace: ${stopMs.toFixed(0)} ms`);
  await started(pod('term1', { command: ['sleep', 'infinity'] }));
  assert.equal((await sh('term1', 'cat /home/user/bye')).out, 'terminated\n');
});

test('a gvisor container that exits reports its code; a memory bomb is OOMKilled', async () => {
  await started(pod('exit1', { command: ['sh', '-c', 'sleep 0.2; exit 4'] }));
  assert.equal((await waitForState('exit1', (s) => s.phase === 'Failed', 'failed')).exitCode, 4);
  await started(pod('oom1', { command: ['sleep', 'infinity'], resources: { limits: { memory: '64Mi' } } }));
  await sh('oom1', 'python3 -c "b = bytearray(256 * 2**20); b[::4096] = b\'x\' * (len(b) // 4096)"').catch(() => undefined);
  const oom = await waitForState('oom1', (s) => s.phase === 'Failed', 'failed');
  assert.equal(oom.reason, 'OOMKilled', JSON.stringify(oom));
});

test('a new runtime on the same root re-adopts a running gvisor pod and execs into it under gVisor', async () => {
  const state = await started(pod('adopt1'));
  const rt2 = await createLocalRuntime({ root, log: silentLogger(), images: await testImageStore(), bridge: BRIDGE, subnet: SUBNET, pollIntervalMs: 100 });
  try {
    const adopted = rt2.state('adopt1');
    assert.deepEqual([adopted.phase, adopted.pid, adopted.ip], ['Running', state.pid, state.ip]);
    assert.match(text((await rt2.exec('adopt1', { command: ['uname', '-r'] })).stdout), /gvisor/);
    const ended = new Promise<void>((resolve) => rt2.onChange((id) => id === 'adopt1' && rt2.state('adopt1').phase !== 'Running' && resolve()));
    await rt.stop('adopt1');
    await ended;
  } finally {
    await rt2.close();
  }
});

test('an unknown runtimeClassName fails the pod clearly, and nothing is made for it', async () => {
  for (const name of ['kata', 'runc', 'gVisor']) {
    const id = `cls-${name.toLowerCase()}`;
    const state = await rt.start(pod(id, {}, name));
    assert.equal(state.phase, 'Failed', JSON.stringify(state));
    assert.equal(state.reason, 'RuntimeClassNotFound');
    assert.match(state.message ?? '', new RegExp(`RuntimeClass "${name}" not found.*gvisor`));
    assert.equal(existsSync(join(root, 'pods', id)), false, 'no pod dir, no image pulled into it');
    await rt.remove(id);
  }
});

test('start and wake under gVisor and under runc, p50 over a few rounds (printed; make bench holds the targets)', async (t) => {
  const ROUNDS = 7;
  const figures: string[] = [];
  for (const [name, cls] of [['runc', null], ['gvisor', 'gvisor']] as const) {
    const starts: number[] = [];
    const wakes: number[] = [];
    const stops: number[] = [];
    for (let i = 0; i < ROUNDS; i++) {
      const req = pod(`bench-${name}-${String(i)}`, { command: ['sleep', 'infinity'] }, cls);
      let began = performance.now();
      await started(req);
      starts.push(performance.now() - began);
      began = performance.now();
      await rt.stop(req.id);
      stops.push(performance.now() - began);
      began = performance.now();
      await started(req);
      wakes.push(performance.now() - began);
      await rt.remove(req.id);
    }
    figures.push(`${name}: start p50 ${median(starts).toFixed(0)} ms, hibernate p50 ${median(stops).toFixed(0)} ms, wake p50 ${median(wakes).toFixed(0)} ms`);
  }
  for (const line of figures) t.diagnostic(line);
});
