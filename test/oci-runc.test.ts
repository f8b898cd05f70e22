// The generated OCI spec (src/runtime/oci/spec.ts) under the real runc: busybox pulled from a
// loopback registry into the image cache, an overlay rootfs on the cached tree (lowerdir) with its
// own upper and work dirs, the generated config.json, `runc run` as root in the foreground. Each
// attack is performed from inside the container and must fail. make test builds runc and the seed
// images first (a worktree may point ASB_RUNC_DIR and ASB_IMAGES_DIR elsewhere); if either is
// missing the test fails saying what to run. Network: no netns path, so a new, empty netns (lo only).
// The spec alone, without the local runtime's shim around it (test/runtime-local.test.ts runs that).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Container } from '../src/api/types.ts';
import type { CachedImage } from '../src/images/image-store.ts';
import { DEFAULT_RUNC_DIR, findRuncBinary } from '../src/runtime/oci/runc-binary.ts';
import { containerSpec, ROOT_ID_MAP, type RuntimeFacts } from '../src/runtime/oci/spec.ts';
import { buildProbe, fields, onCleanup, overlayRootfs, pullBusybox, removeCgroups, run, tempDir } from './support/oci-fixture.ts';

interface Ran { code: number | null; stdout: string; stderr: string; /** The overlay's upper dir: what the container wrote. */ upper: string }

let containers = 0;

/**
 * Runs `script` with busybox sh in a container of `image` under the spec containerSpec makes for
 * `container`; the rootfs is an overlay (lower: the cached tree). `owner` chowns the upper dir
 * (a root pod's mapped root must own it to write). Cleans up the container, mount and cgroup.
 */
async function runContainer(t: test.TestContext, runc: string, image: CachedImage, container: Omit<Container, 'name'>, facts: Partial<RuntimeFacts>, owner = 0): Promise<Ran> {
  const id = `oci-test-${String(process.pid)}-${String(++containers)}`;
  const { dir, upper, rootfs, bundle } = await overlayRootfs(t, image, owner);
  const cgroupsPath = `/asb-oci-test-${id}`;
  const state = join(dir, 'state');
  // The container (a foreground run deletes it on exit; this is for a run cut short) and its cgroups.
  onCleanup(t, async () => {
    await run(runc, ['--root', state, 'delete', '-f', id]).catch(() => undefined);
    removeCgroups(cgroupsPath);
  });
  const spec = containerSpec({ name: 'main', ...container }, image.config, { rootfs, hostname: 'sbx', cgroupsPath, ...facts });
  writeFileSync(join(bundle, 'config.json'), JSON.stringify(spec));
  const child = spawn(runc, ['--root', state, 'run', '--bundle', bundle, id], { stdio: ['ignore', 'pipe', 'pipe'], timeout: 60_000 });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (s: string) => (stdout += s));
  child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
  const code = await new Promise<number | null>((done) => child.on('close', done));
  return { code, stdout, stderr, upper };
}

/** The built runc, the busybox image (plain and id-mapped for a root pod), and the syscall probe. */
async function setup(t: test.TestContext): Promise<{ runc: string; busybox: CachedImage; mapped: CachedImage; probeDir: string }> {
  const runc = findRuncBinary(process.env.ASB_RUNC_DIR ?? DEFAULT_RUNC_DIR);
  const { busybox, mapped } = await pullBusybox();
  return { runc, busybox, mapped, probeDir: await buildProbe(t) };
}

// The attack writes back the value it read: if it ever succeeds (a weaker spec, a runc bug), the
// host's core_pattern is unchanged. The open for writing is what /proc/sys's read-only mount refuses.
const CORE_PATTERN_WRITE = 'p=$(cat /proc/sys/kernel/core_pattern); (echo "$p" > /proc/sys/kernel/core_pattern) 2>/dev/null; echo core_pattern=$?';
const STATUS = "grep -E '^(Seccomp|NoNewPrivs|CapEff|CapPrm|CapBnd|CapAmb):' /proc/self/status | sed 's/:\\s*/=/'";

test('a sandbox container under the generated spec: seccomp, no privileges, masked /proc, a user that is not root, limits that hold', async (t) => {
  const { runc, busybox, probeDir } = await setup(t);
  const script = [
    STATUS,
    'echo uid=$(id -u) gid=$(id -g)',
    'cat /proc/kcore >/dev/null 2>&1; echo kcore=$?',
    'echo keys_bytes=$(wc -c < /proc/keys) timer_list_bytes=$(wc -c < /proc/timer_list) firmware_entries=$(ls -A /sys/firmware | wc -l)',
    'unshare -U true 2>/dev/null; echo unshare_U=$?',
    CORE_PATTERN_WRITE,
    'touch /sys/kernel/x 2>/dev/null; echo sys_write=$?',
    'echo shm=$(grep " /dev/shm " /proc/mounts | grep -o "size=[0-9]*k")',
    'echo netdevs=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " " | tr "\\n" ,)',
    'echo memory_limit=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes) pids_max=$(cat /sys/fs/cgroup/pids/pids.max) cfs_quota=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)',
    'echo touch_usr=$(touch /usr/x 2>/dev/null; echo $?) touch_home=$(touch /home/user/x && echo 0)',
    '/probe/probe',
    // A memory hog: dd's 64 MiB buffer is over the 32 MiB limit; the kernel kills dd (SIGKILL: 137), the shell lives.
    'dd if=/dev/zero of=/dev/null bs=64M count=1 2>/dev/null; echo hog=$?',
    'echo oom_kills=$(grep "^oom_kill " /sys/fs/cgroup/memory/memory.oom_control | cut -d" " -f2)',
    // 60 background sleeps against a pids limit of 24. The shell is pid 1, so `kill -9 -1` (a
    // builtin, no fork) ends every sleep; the count is a glob, also without a fork.
    // A failed fork ends a non-interactive busybox sh (exit 2), so the loop runs in a subshell.
    '(i=0; while [ $i -lt 60 ]; do sleep 60 & i=$((i+1)); done; echo started=$i) 2>/tmp/fork-errors',
    'set -- /proc/[0-9]*; n=$#; kill -9 -1; wait',
    'echo procs_at_limit=$n fork_error=$(grep -c "can.t fork" /tmp/fork-errors) after=$(echo forks-again)',
  ].join('\n');
  const ran = await runContainer(t, runc, busybox, {
    command: ['/bin/sh', '-c', script],
    workingDir: '/home/user',
    resources: { limits: { memory: '32Mi', cpu: '500m' } },
  }, { pidsLimit: 24, mounts: [{ destination: '/probe', source: probeDir, readOnly: true }] });
  assert.equal(ran.code, 0, `${ran.stdout}\n${ran.stderr}`);
  const f = fields(ran.stdout);
  const show = ran.stdout;
  assert.equal(f.get('Seccomp'), '2', show);
  assert.equal(f.get('NoNewPrivs'), '1', show);
  for (const set of ['CapEff', 'CapPrm', 'CapBnd', 'CapAmb']) assert.equal(f.get(set), '0000000000000000', `${set}: ${show}`);
  assert.equal(f.get('uid'), '1000 gid=1000', show);
  assert.notEqual(f.get('kcore'), '0', show);
  // Masked: /proc/keys and /proc/timer_list read empty (they have content on the host), /sys/firmware is empty.
  assert.equal(f.get('keys_bytes'), '0 timer_list_bytes=0 firmware_entries=0', show);
  assert.notEqual(f.get('unshare_U'), '0', show);
  assert.notEqual(f.get('core_pattern'), '0', show);
  assert.notEqual(f.get('sys_write'), '0', show);
  assert.equal(f.get('shm'), 'size=65536k', show);
  assert.equal(f.get('netdevs'), 'lo,', show);
  assert.equal(f.get('memory_limit'), `${String(32 * 2 ** 20)} pids_max=24 cfs_quota=50000`, show);
  // The image's tree is read-only to uid 1000; the sandbox's home is its own.
  assert.equal(f.get('touch_usr'), '1 touch_home=0', show);
  // Every one of them EPERM from the seccomp filter (they all succeed on the host as root, and
  // keyctl, add_key, unshare, io_uring, perf, userfaultfd and ptrace for any user).
  for (const call of ['keyctl', 'add_key', 'request_key', 'clone_newuser', 'unshare_user', 'io_uring_setup', 'perf_event_open', 'userfaultfd', 'ptrace', 'bpf', 'mount', 'setns', 'open_by_handle_at', 'kexec_load', 'init_module']) {
    assert.equal(f.get(call), '1', `${call} must fail with EPERM: ${show}`);
  }
  assert.equal(f.get('fork'), '0', show);
  assert.equal(f.get('hog'), '137', show);
  assert.equal(f.get('oom_kills'), '1', show);
  // The loop never got to 60: a fork failed at the limit, with 24 processes (or fewer) alive; once they are gone, forks work again.
  assert.equal(f.get('started'), undefined, show);
  const pids = /^procs_at_limit=(\d+) fork_error=1 after=forks-again$/m.exec(show);
  assert.ok(pids !== null, show);
  assert.ok(Number(pids[1]) <= 24 && Number(pids[1]) >= 20, show);
});

test('a root pod runs in a user namespace: root inside is host uid 100000, with no capabilities and no way into /proc/sys', async (t) => {
  const { runc, mapped } = await setup(t);
  const script = [
    STATUS,
    'echo uid=$(id -u) uid_map=$(cat /proc/self/uid_map | tr -s " " | sed "s/^ //")',
    CORE_PATTERN_WRITE,
    'touch /etc/written-by-root; echo etc=$?',
    'cat /proc/kcore >/dev/null 2>&1; echo kcore=$?',
    'unshare -U true 2>/dev/null; echo unshare_U=$?',
  ].join('\n');
  const ran = await runContainer(t, runc, mapped, { command: ['/bin/sh', '-c', script], securityContext: { runAsUser: 0 } }, {}, ROOT_ID_MAP.hostId);
  assert.equal(ran.code, 0, `${ran.stdout}\n${ran.stderr}`);
  const f = fields(ran.stdout);
  const show = ran.stdout;
  assert.equal(f.get('uid'), '0 uid_map=0 100000 65536', show);
  assert.equal(f.get('Seccomp'), '2', show);
  assert.equal(f.get('NoNewPrivs'), '1', show);
  assert.equal(f.get('CapEff'), '0000000000000000', show);
  assert.notEqual(f.get('core_pattern'), '0', show);
  assert.notEqual(f.get('kcore'), '0', show);
  assert.notEqual(f.get('unshare_U'), '0', show);
  // Root in the container writes its own tree (the overlay upper), as host uid 100000.
  assert.equal(f.get('etc'), '0', show);
  const written = statSync(join(ran.upper, 'etc/written-by-root'));
  assert.equal(written.uid, ROOT_ID_MAP.hostId);
  assert.equal(written.gid, ROOT_ID_MAP.hostId);
});

test('an added capability is the only one held: NET_BIND_SERVICE lets uid 1000 bind port 80, and without it the bind is refused', async (t) => {
  const { runc, busybox } = await setup(t);
  // httpd forks into the background once it has bound (exit 0) or exits 1; `kill -9 -1` from pid 1 ends it.
  const script = [STATUS, 'httpd -p 80 -h /tmp 2>/dev/null; echo bind80=$?', 'kill -9 -1; wait'].join('\n');
  const granted = await runContainer(t, runc, busybox, { command: ['/bin/sh', '-c', script], securityContext: { capabilities: { add: ['NET_BIND_SERVICE'] } } }, {});
  assert.equal(granted.code, 0, `${granted.stdout}\n${granted.stderr}`);
  const f = fields(granted.stdout);
  // Bit 10 is CAP_NET_BIND_SERVICE; ambient, so the non-root shell's children keep it.
  for (const set of ['CapEff', 'CapPrm', 'CapBnd', 'CapAmb']) assert.equal(f.get(set), '0000000000000400', `${set}: ${granted.stdout}`);
  assert.equal(f.get('NoNewPrivs'), '1', granted.stdout);
  assert.equal(f.get('bind80'), '0', granted.stdout);
  const plain = await runContainer(t, runc, busybox, { command: ['/bin/sh', '-c', script] }, {});
  assert.equal(fields(plain.stdout).get('bind80'), '1', plain.stdout);
});

test('a root pod in a network namespace the runtime made: it joins that netns, and /sys is a read-only bind with its masks', async (t) => {
  const { runc, mapped } = await setup(t);
  // As the runtime will: a netns kept by a bind mount on a file (here with only lo, down).
  const netns = join(tempDir(t, 'asb-netns-'), 'net');
  writeFileSync(netns, '');
  await run('unshare', [`--net=${netns}`, 'true']);
  onCleanup(t, () => run('umount', [netns]));
  const script = [
    'echo uid=$(id -u) net=$(readlink /proc/self/ns/net)',
    'echo sys_entries=$(ls /sys | wc -l) firmware_entries=$(ls -A /sys/firmware | wc -l)',
    'touch /sys/kernel/x 2>/dev/null; echo sys_write=$?',
  ].join('\n');
  const ran = await runContainer(t, runc, mapped, { command: ['/bin/sh', '-c', script], securityContext: { runAsUser: 0 } }, { netnsPath: netns }, ROOT_ID_MAP.hostId);
  assert.equal(ran.code, 0, `${ran.stdout}\n${ran.stderr}`);
  const f = fields(ran.stdout);
  assert.equal(f.get('uid'), `0 net=net:[${String(statSync(netns).ino)}]`, ran.stdout);
  assert.match(f.get('sys_entries') ?? '', /^([5-9]|\d\d+) firmware_entries=0$/, ran.stdout);
  assert.notEqual(f.get('sys_write'), '0', ran.stdout);
});

test('uid 1000 given CAP_SETUID runs in a user namespace: setuid(0) makes it root of that namespace, host uid 100000, not host root', async (t) => {
  const { runc, mapped, probeDir } = await setup(t);
  const ran = await runContainer(t, runc, mapped, {
    command: ['/bin/sh', '-c', `${STATUS}\necho uid=$(id -u)\n/probe/probe setuid0`],
    securityContext: { capabilities: { add: ['SETUID'] } },
  }, { mounts: [{ destination: '/probe', source: probeDir, readOnly: true }] }, ROOT_ID_MAP.hostId);
  assert.equal(ran.code, 0, `${ran.stdout}\n${ran.stderr}`);
  const f = fields(ran.stdout);
  // Bit 7: CAP_SETUID, and nothing else.
  assert.equal(f.get('CapEff'), '0000000000000080', ran.stdout);
  assert.equal(f.get('uid'), '1000', ran.stdout);
  assert.equal(f.get('setuid0'), '0', ran.stdout);
  assert.equal(f.get('uid_after'), '0', ran.stdout);
  assert.equal(f.get('uid_map'), '0 100000 65536', ran.stdout);
});
