// The generated OCI spec (src/runtime/oci/spec.ts), adjusted by runscSpec (src/runtime/oci/runsc.ts),
// under the real gVisor runsc that `make runsc` builds: busybox pulled from a loopback registry
// into the image cache, an overlay rootfs with its own upper dir, the runsc command lines
// runscArgs gives (--platform=systrap --network=sandbox --overlay2=none --oci-seccomp), as root.
// Each attack runs inside the sandbox and must fail. A worktree may point ASB_RUNSC_DIR and
// ASB_IMAGES_DIR elsewhere; if either is missing the test fails saying what to run.
// Network: the one test that needs it makes its own netns file, a bridge and a veth in an address
// range it checks nobody else uses, and deletes them. Timings are printed as diagnostics (the
// figures belong to make bench; the tests assert behaviour).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { chmodSync, closeSync, mkdirSync, openSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { get } from 'node:http';
import { join } from 'node:path';
import type { Container } from '../src/api/types.ts';
import type { CachedImage } from '../src/images/image-store.ts';
import { DEFAULT_RUNSC_DIR, findRunscBinary, releaseRunscRoot } from '../src/runtime/oci/runsc-binary.ts';
import { RUNSC_MEMORY_OVERHEAD_BYTES, runscArgs, runscSpec, runscStopSequence, type RunscOptions, type RunscSpecOptions } from '../src/runtime/oci/runsc.ts';
import { containerSpec, ROOT_ID_MAP, type RuntimeFacts } from '../src/runtime/oci/spec.ts';
import { buildProbe, fields, mountOverlay, onCleanup, overlayRootfs, pullBusybox, removeCgroups, run, tempDir, umountIfMounted, type OverlayRootfs } from './support/oci-fixture.ts';
import { waitFor } from './support/wait.ts';

interface Env { runsc: string; opts: RunscOptions; busybox: CachedImage; mapped: CachedImage; probeDir: string }

/** The built runsc, a runsc state root of the test's own, busybox (plain and id-mapped) and the syscall probe. */
async function setup(t: test.TestContext, network: RunscOptions['network'] = 'sandbox'): Promise<Env> {
  const runsc = findRunscBinary(process.env.ASB_RUNSC_DIR ?? DEFAULT_RUNSC_DIR);
  const root = tempDir(t, 'asb-runsc-root-');
  onCleanup(t, () => releaseRunscRoot(root));
  const { busybox, mapped } = await pullBusybox();
  return { runsc, opts: { root, network }, busybox, mapped, probeDir: await buildProbe(t) };
}

interface Exec { code: number | null; stdout: string; stderr: string }

/** Runs runsc with `args`, collecting its output; never rejects on a non-zero exit. */
function runsc(env: Env, args: string[], timeoutMs = 60_000): Promise<Exec> {
  return new Promise((done) => {
    execFile(env.runsc, args, { timeout: timeoutMs, maxBuffer: 4 * 2 ** 20 }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof err.code === 'number' ? err.code : null;
      done({ code, stdout, stderr });
    });
  });
}

interface Sandbox {
  id: string;
  fs: OverlayRootfs;
  cgroupsPath: string;
  /** The init's stdout and stderr (a file opened O_APPEND, see start). */
  log: string;
  /** `runsc run -detach`: milliseconds until it returned with the sandbox running. */
  start(): Promise<number>;
  /** Runs `script` with sh as uid:gid with no capabilities through `runsc exec -process`. */
  exec(script: string, user?: { uid: number; gid: number }): Promise<Exec>;
  /** runscStopSequence; milliseconds. */
  stop(): Promise<number>;
}

let sandboxes = 0;

/**
 * A sandbox of `image` under runscSpec(containerSpec(...)), not yet started. Cleans up the sandbox,
 * its cgroup and the overlay.
 */
async function sandbox(t: test.TestContext, env: Env, image: CachedImage, container: Omit<Container, 'name'>, facts: Partial<RuntimeFacts> = {}, adjust: RunscSpecOptions = {}, owner = 0): Promise<Sandbox> {
  const id = `runsc-test-${String(process.pid)}-${String(++sandboxes)}`;
  const fs = await overlayRootfs(t, image, owner);
  const cgroupsPath = `/asb-runsc-test-${id}`;
  const log = join(fs.dir, 'init.log');
  onCleanup(t, async () => {
    for (const step of runscStopSequence(env.opts, id)) await runsc(env, step.argv);
    removeCgroups(cgroupsPath);
  });
  const spec = runscSpec(containerSpec({ name: 'main', ...container }, image.config, { rootfs: fs.rootfs, hostname: 'sbx', cgroupsPath, ...facts }), adjust);
  writeFileSync(join(fs.bundle, 'config.json'), JSON.stringify(spec));
  let execs = 0;
  return {
    id, fs, cgroupsPath, log,
    async start() {
      // The sentry writes the init's stdio through the host fds it is given at its own offsets:
      // one file given as both stdout and stderr (2>&1) without O_APPEND gets stderr over stdout.
      const fd = openSync(log, 'a');
      const began = performance.now();
      const code = await new Promise<number | null>((done) => {
        const child = spawn(env.runsc, runscArgs(env.opts, { op: 'run', id, bundle: fs.bundle, pidFile: join(fs.dir, 'sandbox.pid') }), { stdio: ['ignore', fd, fd], timeout: 60_000 });
        child.on('close', done);
      });
      closeSync(fd);
      assert.equal(code, 0, `runsc run: ${readFileSync(log, 'utf8')}`);
      return performance.now() - began;
    },
    async exec(script, user = { uid: 1000, gid: 1000 }) {
      const processFile = join(fs.dir, `exec-${String(++execs)}.json`);
      writeFileSync(processFile, JSON.stringify({
        user: { ...user, additionalGids: [] }, args: ['/bin/sh', '-c', script], env: ['PATH=/usr/sbin:/usr/bin:/sbin:/bin', 'HOME=/home/user'],
        cwd: '/', noNewPrivileges: true, capabilities: { bounding: [], effective: [], permitted: [], inheritable: [], ambient: [] },
      }));
      return runsc(env, runscArgs(env.opts, { op: 'exec', id, processFile }));
    },
    async stop() {
      const began = performance.now();
      for (const step of runscStopSequence(env.opts, id)) {
        const result = await runsc(env, step.argv);
        if (step.exitCodeMatters) assert.equal(result.code, 0, `${step.argv.join(' ')}: ${result.stderr}`);
      }
      return performance.now() - began;
    },
  };
}

const STATUS = "grep -E '^(Seccomp|NoNewPrivs|CapEff|CapPrm|CapBnd|CapAmb):' /proc/self/status | sed 's/:\\s*/=/'";
const SLEEP = ['/bin/sleep', '1000000'];
const ms = (n: number): string => `${n.toFixed(0)} ms`;

/** Proportional set size (kB) of every process in the sandbox's memory cgroup: the sentry, the gofer, the systrap stubs. */
function cgroupPss(cgroupsPath: string): { processes: number; pssKb: number; rssKb: number } {
  const pids = readFileSync(join('/sys/fs/cgroup/memory', cgroupsPath, 'cgroup.procs'), 'utf8').split('\n').filter((l) => l !== '');
  let pssKb = 0;
  let rssKb = 0;
  for (const pid of pids) {
    const rollup = readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8');
    pssKb += Number(/^Pss:\s+(\d+)/m.exec(rollup)?.[1] ?? 0);
    rssKb += Number(/^Rss:\s+(\d+)/m.exec(rollup)?.[1] ?? 0);
  }
  return { processes: pids.length, pssKb, rssKb };
}

test('a gVisor sandbox under the generated spec: the kernel is gVisor\'s, seccomp holds, an exec runs as the given uid with no capabilities, the host cgroup holds the limits', async (t) => {
  const env = await setup(t, 'none');
  const box = await sandbox(t, env, env.busybox, { command: SLEEP, resources: { limits: { memory: '256Mi', cpu: '500m' } } }, {
    pidsLimit: 100, mounts: [{ destination: '/probe', source: env.probeDir, readOnly: true }],
  });
  const startMs = await box.start();
  const script = [
    STATUS,
    'echo uid=$(id -u) gid=$(id -g)',
    'echo kernel=$(uname -r)',
    'cat /proc/kcore >/dev/null 2>&1; echo kcore=$?',
    'cat /proc/keys >/dev/null 2>&1; echo keys=$?',
    'echo firmware_entries=$(ls -A /sys/firmware | wc -l)',
    '(echo x > /proc/sys/kernel/core_pattern) 2>/dev/null; echo core_pattern=$?',
    'unshare -U true 2>/dev/null; echo unshare_U=$?',
    'echo tmp=$(grep " /tmp " /proc/mounts | cut -d" " -f3)',
    'echo touch_usr=$(touch /usr/x 2>/dev/null; echo $?) touch_home=$(touch /home/user/x && echo 0)',
    '/probe/probe',
  ].join('\n');
  const began = performance.now();
  const ran = await box.exec(script);
  const execMs = performance.now() - began;
  assert.equal(ran.code, 0, `${ran.stdout}\n${ran.stderr}`);
  const f = fields(ran.stdout);
  const show = ran.stdout;
  // gVisor's kernel answers, not the host's 6.18.
  assert.match(f.get('kernel') ?? '', /gvisor/, show);
  assert.equal(f.get('Seccomp'), '2', show);
  assert.equal(f.get('NoNewPrivs'), '1', show);
  for (const set of ['CapEff', 'CapPrm', 'CapBnd', 'CapAmb']) assert.equal(f.get(set), '0000000000000000', `${set}: ${show}`);
  assert.equal(f.get('uid'), '1000 gid=1000', show);
  for (const name of ['kcore', 'keys', 'core_pattern', 'unshare_U']) assert.notEqual(f.get(name), '0', `${name}: ${show}`);
  assert.equal(f.get('firmware_entries'), '0', show);
  // gVisor mounts its own tmpfs over an empty /tmp (runscSpec's tmpDir keeps /tmp on disk instead).
  assert.equal(f.get('tmp'), 'tmpfs', show);
  assert.equal(f.get('touch_usr'), '1 touch_home=0', show);
  // EPERM from the RuntimeDefault profile, enforced by gVisor because of --oci-seccomp.
  for (const call of ['keyctl', 'add_key', 'request_key', 'clone_newuser', 'unshare_user', 'io_uring_setup', 'perf_event_open', 'userfaultfd', 'ptrace', 'bpf', 'mount', 'setns', 'open_by_handle_at', 'kexec_load', 'init_module']) {
    assert.equal(f.get(call), '1', `${call} must fail with EPERM: ${show}`);
  }
  assert.equal(f.get('fork'), '0', show);

  // Another uid, as exec's process.user says, still with nothing.
  const other = await box.exec(`${STATUS}\necho uid=$(id -u)`, { uid: 2000, gid: 2000 });
  assert.equal(fields(other.stdout).get('uid'), '2000', other.stdout);
  assert.equal(fields(other.stdout).get('CapEff'), '0000000000000000', other.stdout);

  // On the host: the sentry, gofer and stubs sit in the pod's cgroup with the limits plus gVisor's overhead.
  const cg = (controller: string, file: string): string => readFileSync(join('/sys/fs/cgroup', controller, box.cgroupsPath, file), 'utf8').trim();
  assert.equal(cg('memory', 'memory.limit_in_bytes'), String(256 * 2 ** 20 + RUNSC_MEMORY_OVERHEAD_BYTES));
  assert.equal(cg('pids', 'pids.max'), String(100 * 2 + 64));
  assert.equal(cg('cpu', 'cpu.cfs_quota_us'), '50000');
  const memory = cgroupPss(box.cgroupsPath);
  t.diagnostic(`runsc run -detach ${ms(startMs)}, exec ${ms(execMs)}; idle sandbox: ${String(memory.processes)} host processes, PSS ${String(memory.pssKb)} kB, RSS ${String(memory.rssKb)} kB, cgroup usage ${cg('memory', 'memory.usage_in_bytes')} B`);
  t.diagnostic(`stop (kill, wait, delete) ${ms(await box.stop())}`);
});

test('a memory bomb OOM-kills its gVisor sandbox only: the sentry goes, the cgroup counts the kill, and the sandbox beside it still answers', async (t) => {
  const env = await setup(t, 'none');
  const bomb = await sandbox(t, env, env.busybox, { command: SLEEP, resources: { limits: { memory: '32Mi' } } });
  const neighbour = await sandbox(t, env, env.busybox, { command: SLEEP, resources: { limits: { memory: '64Mi' } } });
  await bomb.start();
  await neighbour.start();
  // 64 MiB in one buffer, over the pod's 32 MiB (the cgroup has 32 MiB more for gVisor itself).
  const ran = await bomb.exec('dd if=/dev/zero of=/dev/null bs=64M count=1; echo survived=$?');
  assert.equal(fields(ran.stdout).get('survived'), undefined, `the bomb must not complete: ${ran.stdout}\n${ran.stderr}`);
  // The kernel's OOM killer took the sentry (oom_score_adj 1000): the sandbox is over. Read before the delete removes the cgroup.
  await runsc(env, runscArgs(env.opts, { op: 'wait', id: bomb.id }));
  const oom = readFileSync(join('/sys/fs/cgroup/memory', bomb.cgroupsPath, 'memory.oom_control'), 'utf8');
  assert.match(oom, /^oom_kill [1-9]\d*$/m, oom);
  const after = await bomb.exec('echo alive');
  assert.notEqual(after.code, 0, after.stdout);
  const alive = await neighbour.exec('echo alive=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)');
  assert.equal(alive.code, 0, alive.stderr);
  assert.match(alive.stdout, /^alive=\d+$/m);
});

test('writes land in the overlay upper dir and survive hibernation: kill, delete and unmount, then mount and run again on the same upper', async (t) => {
  const env = await setup(t, 'none');
  // A runtime-owned /tmp on disk (runscSpec tmpDir), beside the rootfs, never inside it.
  const tmpDir = join(tempDir(t, 'asb-runsc-tmp-'), 'tmp');
  mkdirSync(tmpDir);
  chmodSync(tmpDir, 0o1777);
  const box = await sandbox(t, env, env.busybox, { command: SLEEP }, {}, { tmpDir });
  await box.start();
  const wrote = await box.exec('echo kept-in-home > /home/user/kept && echo kept-in-tmp > /tmp/kept && echo tmp=$(grep " /tmp " /proc/mounts | cut -d" " -f3)');
  assert.equal(wrote.code, 0, wrote.stderr);
  assert.notEqual(fields(wrote.stdout).get('tmp'), 'tmpfs', wrote.stdout);
  const stopMs = await box.stop();
  await umountIfMounted(box.fs.rootfs);
  // On the host, as uid 1000 (no user namespace for a uid-1000 pod), in the upper dir and the tmp dir.
  const home = join(box.fs.upper, 'home/user/kept');
  assert.equal(readFileSync(home, 'utf8'), 'kept-in-home\n');
  assert.equal(statSync(home).uid, 1000);
  assert.equal(readFileSync(join(tmpDir, 'kept'), 'utf8'), 'kept-in-tmp\n');
  // Wake: the same upper under a new overlay, the same id.
  await mountOverlay(env.busybox, box.fs);
  const wakeMs = await box.start();
  const read = await box.exec('cat /home/user/kept /tmp/kept');
  assert.equal(read.stdout, 'kept-in-home\nkept-in-tmp\n', read.stderr);
  t.diagnostic(`hibernate (kill, wait, delete) ${ms(stopMs)}; wake (run -detach on the same upper) ${ms(wakeMs)}`);
});

/** An unused /29 in 10.253.0.0/16 for the test's bridge: no host address or route overlaps it. */
async function freeSubnet(): Promise<string> {
  const { stdout } = await run('ip', ['-4', '-o', 'addr']);
  const { stdout: routes } = await run('ip', ['-4', 'route']);
  const used = `${stdout}\n${routes}`;
  for (let i = 0; i < 32; i++) {
    const third = (process.pid + i * 7) % 250;
    if (!used.includes(`10.253.${String(third)}.`) && !/10\.253\.0\.0\/16|10\.0\.0\.0\/8/.test(used)) return `10.253.${String(third)}`;
  }
  throw new Error('no free 10.253.x.0/29 for the test bridge');
}

function httpGet(url: string): Promise<string> {
  return new Promise((done, fail) => {
    const req = get(url, { timeout: 2000 }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (s: string) => (body += s)).on('end', () => done(body));
    });
    req.on('timeout', () => req.destroy(new Error(`GET ${url} timed out`)));
    req.on('error', fail);
  });
}

test('the host reaches a server in a gVisor sandbox over a veth on a bridge: the pre-made netns file is joined and gVisor\'s netstack answers; a wake needs eth0 addressed again', async (t) => {
  const env = await setup(t, 'sandbox');
  const net = String(process.pid % 100_000);
  const bridge = `rgv${net}b`;
  const veth = `rgv${net}v`;
  const prefix = await freeSubnet();
  const [gateway, address] = [`${prefix}.1`, `${prefix}.2`];
  const netns = join(tempDir(t, 'asb-netns-'), 'net');
  writeFileSync(netns, '');
  await run('unshare', [`--net=${netns}`, 'true']);
  onCleanup(t, () => run('umount', [netns]));
  await run('ip', ['link', 'add', bridge, 'type', 'bridge']);
  onCleanup(t, () => run('ip', ['link', 'del', bridge]));
  await run('ip', ['addr', 'add', `${gateway}/29`, 'dev', bridge]);
  await run('ip', ['link', 'set', bridge, 'up']);
  await run('ip', ['link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', netns]);
  onCleanup(t, () => run('ip', ['link', 'del', veth]).catch(() => undefined));
  await run('ip', ['link', 'set', veth, 'master', bridge, 'up']);
  // What the runtime does before every start under --network=sandbox (runsc takes the addresses away).
  const addressPod = (): Promise<unknown> => run('nsenter', [`--net=${netns}`, 'sh', '-c', `ip addr replace ${address}/29 dev eth0 && ip link set eth0 up && ip link set lo up && ip route replace default via ${gateway}`]);
  await addressPod();

  const www = 'mkdir -p /home/user/www && echo "served-by=$(uname -r)" > /home/user/www/index.html && exec httpd -f -p 8080 -h /home/user/www';
  const box = await sandbox(t, env, env.busybox, { command: ['/bin/sh', '-c', www] }, { netnsPath: netns });
  await box.start();
  const url = `http://${address}:8080/`;
  // httpd binds a few ms after the start returns.
  const body = await waitFor('the sandbox\'s httpd', () => httpGet(url).catch(() => undefined), 10_000, 20);
  assert.match(body, /^served-by=.*gvisor/m);
  // The sandbox sees the netns's eth0 (in netstack), and the host's own view of the netns lost the address.
  const inside = await box.exec('ip -o -4 addr show eth0');
  assert.match(inside.stdout, new RegExp(`inet ${address.replaceAll('.', '\\.')}/29`), inside.stdout + inside.stderr);
  const { stdout: hostView } = await run('nsenter', [`--net=${netns}`, 'ip', '-o', '-4', 'addr', 'show', 'eth0']);
  assert.equal(hostView.trim(), '', 'runsc moves eth0\'s address into netstack');

  // Hibernate and wake on the same netns: it comes back only once eth0 is addressed again.
  await box.stop();
  await addressPod();
  await box.start();
  const again = await waitFor('the woken sandbox\'s httpd', () => httpGet(url).catch(() => undefined), 10_000, 20);
  assert.match(again, /^served-by=.*gvisor/m);
});

test('a root pod in a joined netns sees gVisor\'s own /sys, not the host\'s: no firmware tables, no host interfaces; root writes its tree as host uid 100000', async (t) => {
  const env = await setup(t, 'none');
  const netns = join(tempDir(t, 'asb-netns-'), 'net');
  writeFileSync(netns, '');
  await run('unshare', [`--net=${netns}`, 'true']);
  onCleanup(t, () => run('umount', [netns]));
  const script = [
    STATUS,
    'echo uid=$(id -u)',
    'echo firmware_entries=$(ls -A /sys/firmware | wc -l)',
    '[ -e /sys/class/net ]; echo class_net=$?',
    'touch /etc/written-by-root; echo etc=$?',
  ].join('\n');
  const box = await sandbox(t, env, env.mapped, { command: SLEEP, securityContext: { runAsUser: 0 } }, { netnsPath: netns }, {}, ROOT_ID_MAP.hostId);
  await box.start();
  const ran = await box.exec(script, { uid: 0, gid: 0 });
  assert.equal(ran.code, 0, `${ran.stdout}\n${ran.stderr}`);
  const f = fields(ran.stdout);
  assert.equal(f.get('uid'), '0', ran.stdout);
  assert.equal(f.get('CapEff'), '0000000000000000', ran.stdout);
  // A bind of the host's /sys (what runc gets here) would show ACPI tables and the host's interfaces through the gofer.
  assert.equal(f.get('firmware_entries'), '0', ran.stdout);
  assert.equal(f.get('class_net'), '1', ran.stdout);
  assert.equal(f.get('etc'), '0', ran.stdout);
  const written = statSync(join(box.fs.upper, 'etc/written-by-root'));
  assert.equal(written.uid, ROOT_ID_MAP.hostId);
  assert.equal(written.gid, ROOT_ID_MAP.hostId);
});
