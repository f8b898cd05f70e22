// The OCI spec generator (src/runtime/oci/spec.ts), without runc: every field a sandbox's
// isolation depends on, from a pod container, an image config and the runtime's facts.
// test/oci-runc.test.ts runs the same output under the real runc.
import { resolveExecUser } from '../src/runtime/oci/user-spec.ts';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Container } from '../src/api/types.ts';
import { isAsbError } from '../src/errors.ts';
import type { ImageConfig } from '../src/images/image-store.ts';
import { ALWAYS_DENIED, runtimeDefaultProfile } from '../src/runtime/oci/seccomp-profile.ts';
import {
  ADDABLE_CAPABILITIES, containerSpec, sandboxIdentity, DEFAULT_MEMORY_BYTES, DEFAULT_NOFILE, DEFAULT_PIDS_LIMIT, ROOT_ID_MAP, type OciSpec, type RuntimeFacts,
} from '../src/runtime/oci/spec.ts';

const BUSYBOX: ImageConfig = { user: undefined, env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'], entrypoint: [], cmd: ['/bin/sh'], workingDir: undefined };
const PYTHON: ImageConfig = { user: undefined, env: ['PATH=/usr/local/bin:/usr/bin:/bin', 'LANG=C.UTF-8'], entrypoint: ['python3'], cmd: ['-i'], workingDir: '/app' };
const FACTS: RuntimeFacts = { rootfs: '/var/lib/asb/pods/p1/rootfs', hostname: 'sbx-1', cgroupsPath: '/asb/c1/p1' };
const PASSWD = 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\napp:x:1500:1600::/app:/bin/sh\n';
const GROUP = 'root:x:0:\nuser:x:1000:\nstaff:x:50:\n';

function spec(container: Partial<Container> = {}, image: ImageConfig = BUSYBOX, facts: Partial<RuntimeFacts> = {}, pod = {}): OciSpec {
  return containerSpec({ name: 'main', ...container }, image, { ...FACTS, ...facts }, pod);
}

/** The Invalid error's field names, or a failure when it did not throw one. */
function refusedFields(fn: () => unknown): string[] {
  try {
    fn();
  } catch (err) {
    assert.ok(isAsbError(err, 'Invalid'), String(err));
    for (const f of err.fields) assert.ok(err.message.includes(f.field), `the message names ${f.field}: ${err.message}`);
    return err.fields.map((f) => f.field);
  }
  assert.fail('expected an Invalid error');
}

function allowedSyscalls(s: OciSpec): Set<string> {
  return new Set(s.linux.seccomp.syscalls.filter((r) => r.action === 'SCMP_ACT_ALLOW' && r.args === undefined).flatMap((r) => r.names));
}

test('defaults: hardened with nothing asked for', () => {
  const s = spec();
  assert.equal(s.ociVersion, '1.2.0');
  assert.deepEqual(s.process.args, ['/bin/sh']);
  assert.deepEqual(s.process.user, { uid: 1000, gid: 1000, additionalGids: [] });
  assert.equal(s.process.cwd, '/');
  assert.equal(s.process.terminal, false);
  assert.equal(s.process.noNewPrivileges, true);
  assert.deepEqual(s.process.capabilities, { bounding: [], effective: [], permitted: [], inheritable: [], ambient: [] });
  assert.deepEqual(s.process.rlimits, [{ type: 'RLIMIT_NOFILE', soft: DEFAULT_NOFILE, hard: DEFAULT_NOFILE }, { type: 'RLIMIT_CORE', soft: 0, hard: 0 }]);
  assert.deepEqual(s.root, { path: FACTS.rootfs, readonly: false });
  assert.equal(s.hostname, 'sbx-1');
  assert.deepEqual(s.linux.namespaces, [{ type: 'pid' }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }, { type: 'cgroup' }, { type: 'network' }]);
  assert.equal(s.linux.uidMappings, undefined);
  assert.equal(s.linux.gidMappings, undefined);
  assert.equal(s.linux.cgroupsPath, '/asb/c1/p1');
  assert.deepEqual(s.linux.resources, {
    devices: [{ allow: false, access: 'rwm' }],
    memory: { limit: DEFAULT_MEMORY_BYTES, swap: DEFAULT_MEMORY_BYTES },
    cpu: {},
    pids: { limit: DEFAULT_PIDS_LIMIT },
  });
  assert.equal(DEFAULT_PIDS_LIMIT, 1024);
  for (const path of ['/proc/kcore', '/proc/keys', '/proc/timer_list', '/proc/sched_debug', '/proc/acpi', '/sys/firmware']) assert.ok(s.linux.maskedPaths.includes(path), path);
  for (const path of ['/proc/sys', '/proc/sysrq-trigger', '/proc/irq', '/proc/bus', '/proc/fs']) assert.ok(s.linux.readonlyPaths.includes(path), path);
  const byDest = new Map(s.mounts.map((m) => [m.destination, m]));
  assert.deepEqual(byDest.get('/dev/shm')?.options, ['nosuid', 'noexec', 'nodev', 'mode=1777', 'size=65536k']);
  assert.deepEqual(byDest.get('/sys'), { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] });
  assert.ok(byDest.get('/sys/fs/cgroup')?.options.includes('ro'));
  assert.deepEqual(byDest.get('/proc')?.options, ['nosuid', 'noexec', 'nodev']);
  assert.deepEqual(s.process.env, ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'HOSTNAME=sbx-1']);
  // The whole spec is JSON: what is written to config.json is what the tests read.
  assert.deepEqual(JSON.parse(JSON.stringify(s)), s);
});

test('seccomp RuntimeDefault: an x86_64 allow-list with EPERM for the rest, and none of the escape syscalls', () => {
  const s = spec();
  const seccomp = s.linux.seccomp;
  assert.equal(seccomp.defaultAction, 'SCMP_ACT_ERRNO');
  assert.equal(seccomp.defaultErrnoRet, 1);
  assert.deepEqual(seccomp.architectures, ['SCMP_ARCH_X86_64']);
  const named = new Set(seccomp.syscalls.filter((r) => r.action === 'SCMP_ACT_ALLOW').flatMap((r) => r.names));
  for (const call of ['keyctl', 'add_key', 'request_key', 'bpf', 'unshare', 'setns', 'mount', 'umount2', 'ptrace', 'io_uring_setup', 'io_uring_enter', 'io_uring_register', 'kexec_load', 'kexec_file_load', 'open_by_handle_at', 'init_module', 'finit_module', 'perf_event_open', 'userfaultfd']) {
    assert.ok(ALWAYS_DENIED.includes(call), call);
  }
  for (const call of ALWAYS_DENIED) assert.equal(named.has(call), false, `${call} must not be allowed`);
  // Not even with every capability a container may add.
  const everything = spec({ securityContext: { capabilities: { add: [...ADDABLE_CAPABILITIES] } } });
  const withAll = new Set(everything.linux.seccomp.syscalls.filter((r) => r.action === 'SCMP_ACT_ALLOW').flatMap((r) => r.names));
  for (const call of ALWAYS_DENIED) assert.equal(withAll.has(call), false, `${call} must not be allowed with ${everything.process.capabilities.bounding.join(',')}`);
  assert.equal(named.has('chroot'), false);
  // What every program needs is there.
  for (const call of ['read', 'write', 'openat', 'execve', 'mmap', 'futex', 'epoll_wait', 'socket', 'connect', 'wait4', 'rt_sigreturn', 'exit_group', 'arch_prctl']) assert.ok(named.has(call), call);
  // clone only without namespace flags (mask 0x7e020000 must give 0); clone3 → ENOSYS so libc falls back to clone.
  assert.deepEqual(seccomp.syscalls.find((r) => r.names.includes('clone'))?.args, [{ index: 0, value: 0x7e020000, valueTwo: 0, op: 'SCMP_CMP_MASKED_EQ' }]);
  assert.deepEqual(seccomp.syscalls.find((r) => r.names.includes('clone3')), { names: ['clone3'], action: 'SCMP_ACT_ERRNO', errnoRet: 38 });
  assert.equal(allowedSyscalls(s).has('clone'), false);
  // socket, except AF_VSOCK (40): a host channel in VMs.
  assert.deepEqual(seccomp.syscalls.find((r) => r.names.includes('socket'))?.args, [{ index: 0, value: 40, op: 'SCMP_CMP_NE' }]);
  // The same profile whether or not the container has capabilities, except the syscalls those capabilities need.
  assert.deepEqual(runtimeDefaultProfile(['CAP_NET_BIND_SERVICE']), seccomp);
  assert.ok(runtimeDefaultProfile(['CAP_SYS_CHROOT']).syscalls[0]?.names.includes('chroot'));
  // An explicit RuntimeDefault is the same; anything else is refused.
  assert.deepEqual(spec({ securityContext: { seccompProfile: { type: 'RuntimeDefault' } } }).linux.seccomp, seccomp);
  assert.deepEqual(refusedFields(() => spec({ securityContext: { seccompProfile: { type: 'Unconfined' } } })), ['securityContext.seccompProfile.type']);
  assert.deepEqual(refusedFields(() => spec({}, BUSYBOX, {}, { securityContext: { seccompProfile: { type: 'Localhost', localhostProfile: 'x.json' } } })), ['securityContext.seccompProfile.type']);
});

test('command and args follow Kubernetes: command replaces Entrypoint (and drops Cmd), args replace Cmd', () => {
  assert.deepEqual(spec({}, PYTHON).process.args, ['python3', '-i']);
  assert.deepEqual(spec({ args: ['-c', 'print(1)'] }, PYTHON).process.args, ['python3', '-c', 'print(1)']);
  assert.deepEqual(spec({ command: ['/bin/bash'] }, PYTHON).process.args, ['/bin/bash']);
  assert.deepEqual(spec({ command: ['/bin/bash'], args: ['-lc', 'id'] }, PYTHON).process.args, ['/bin/bash', '-lc', 'id']);
  const empty: ImageConfig = { ...BUSYBOX, cmd: [] };
  assert.deepEqual(refusedFields(() => spec({}, empty)), ['command']);
});

test('env: the image\'s, then the container\'s by name; workingDir: the container\'s, then the image\'s', () => {
  const s = spec({ env: [{ name: 'LANG', value: 'en_US.UTF-8' }, { name: 'TOKEN' }, { name: 'A', value: 'x=y' }], workingDir: '/work' }, PYTHON);
  assert.deepEqual(s.process.env, ['PATH=/usr/local/bin:/usr/bin:/bin', 'HOSTNAME=sbx-1', 'LANG=en_US.UTF-8', 'TOKEN=', 'A=x=y']);
  assert.equal(s.process.cwd, '/work');
  assert.equal(spec({}, PYTHON).process.cwd, '/app');
});

test('user: runAsUser (container over pod), else the image user (numeric or by name), else 1000', () => {
  const facts = { passwd: PASSWD, group: GROUP };
  assert.deepEqual(spec({ securityContext: { runAsUser: 2000 } }, BUSYBOX, facts, { securityContext: { runAsUser: 3000, runAsGroup: 3001 } }).process.user, { uid: 2000, gid: 3001, additionalGids: [] });
  assert.deepEqual(spec({}, BUSYBOX, facts, { securityContext: { runAsUser: 3000 } }).process.user, { uid: 3000, gid: 3000, additionalGids: [] });
  assert.deepEqual(spec({}, { ...BUSYBOX, user: '1001:1002' }).process.user, { uid: 1001, gid: 1002, additionalGids: [] });
  // A named user: its passwd entry's uid and primary group; a named group from /etc/group.
  assert.deepEqual(spec({}, { ...BUSYBOX, user: 'app' }, facts).process.user, { uid: 1500, gid: 1600, additionalGids: [] });
  assert.deepEqual(spec({}, { ...BUSYBOX, user: 'user:staff' }, facts).process.user, { uid: 1000, gid: 50, additionalGids: [] });
  // runAsGroup beats the image's group; fsGroup becomes a supplementary group.
  assert.deepEqual(spec({ securityContext: { runAsGroup: 7 } }, { ...BUSYBOX, user: '1001:1002' }, {}, { securityContext: { fsGroup: 9 } }).process.user, { uid: 1001, gid: 7, additionalGids: [9] });
  assert.deepEqual(refusedFields(() => spec({}, { ...BUSYBOX, user: 'nobody-here' }, facts)), ['image.user']);
  assert.deepEqual(refusedFields(() => spec({}, { ...BUSYBOX, user: 'user:nogroup' }, facts)), ['image.user']);
  assert.deepEqual(refusedFields(() => spec({ securityContext: { runAsUser: 70_000 } })), ['securityContext.runAsUser']);
  assert.deepEqual(refusedFields(() => spec({ securityContext: { runAsUser: -1 } })), ['securityContext.runAsUser']);
  assert.deepEqual(refusedFields(() => spec({}, BUSYBOX, {}, { securityContext: { fsGroup: 100_000 } })), ['securityContext.fsGroup']);
});

test('the image user\'s groups as Docker gives them: a bare name gets the groups /etc/group lists it in, an explicit group none; runAsGroup drops them', () => {
  const group = `${GROUP}devs:x:2001:app,user\nextra:x:2002:app\nnoone:x:2003:\n`;
  const facts = { passwd: PASSWD, group };
  assert.deepEqual(spec({}, { ...BUSYBOX, user: 'app' }, facts).process.user, { uid: 1500, gid: 1600, additionalGids: [2001, 2002] });
  assert.deepEqual(spec({}, { ...BUSYBOX, user: '1500' }, facts).process.user, { uid: 1500, gid: 1600, additionalGids: [2001, 2002] }, 'a uid with a passwd entry: that entry\'s groups');
  assert.deepEqual(spec({}, { ...BUSYBOX, user: 'app:devs' }, facts).process.user, { uid: 1500, gid: 2001, additionalGids: [] });
  assert.deepEqual(spec({}, { ...BUSYBOX, user: 'app:2003' }, facts).process.user, { uid: 1500, gid: 2003, additionalGids: [] });
  assert.deepEqual(spec({ securityContext: { runAsGroup: 7 } }, { ...BUSYBOX, user: 'app' }, facts).process.user, { uid: 1500, gid: 7, additionalGids: [] });
  assert.deepEqual(spec({}, { ...BUSYBOX, user: 'app' }, facts, { securityContext: { fsGroup: 9 } }).process.user, { uid: 1500, gid: 1600, additionalGids: [2001, 2002, 9] });
});

test('resolveExecUser: USER values against passwd and group text, with a clear error for what the image lacks', () => {
  const group = `${GROUP}devs:x:2001:app\n`;
  assert.deepEqual(resolveExecUser('app', PASSWD, group), { uid: 1500, gid: 1600, groups: [2001], home: '/app' });
  assert.deepEqual(resolveExecUser('root', '', ''), { uid: 0, gid: 0, groups: [], home: '/root' }, 'root without a passwd');
  assert.deepEqual(resolveExecUser('4242:4343', '', ''), { uid: 4242, gid: 4343, groups: [] }, 'numbers need no entries');
  assert.deepEqual(resolveExecUser('ghost', PASSWD, group), { error: 'no user "ghost" in the image\'s /etc/passwd' });
  assert.deepEqual(resolveExecUser('app:ghosts', PASSWD, group), { error: 'no group "ghosts" in the image\'s /etc/group' });
  assert.match((resolveExecUser('70000', PASSWD, group) as { error: string }).error, /uid 70000 is past 65535/);
});

test('a root pod gets a user namespace: uid 0 inside is an unprivileged host uid', () => {
  const s = spec({ securityContext: { runAsUser: 0 } });
  assert.deepEqual(s.process.user, { uid: 0, gid: 0, additionalGids: [] });
  assert.deepEqual(s.linux.namespaces.at(-1), { type: 'user' });
  assert.deepEqual(s.linux.uidMappings, [{ containerID: 0, hostID: 100_000, size: 65_536 }]);
  assert.deepEqual(s.linux.gidMappings, s.linux.uidMappings);
  assert.deepEqual(ROOT_ID_MAP, { hostId: 100_000, size: 65_536 });
  // Still no capabilities, still seccomp and masked paths.
  assert.deepEqual(s.process.capabilities.effective, []);
  assert.ok(s.linux.readonlyPaths.includes('/proc/sys'));
  // The image's user root (by name or number) counts the same; the runtime may give another range.
  const byName = spec({}, { ...BUSYBOX, user: 'root' }, { passwd: PASSWD, idMap: { hostId: 200_000, size: 65_536 } });
  assert.deepEqual(byName.linux.uidMappings, [{ containerID: 0, hostID: 200_000, size: 65_536 }]);
  assert.ok(spec({}, { ...BUSYBOX, user: '0' }).linux.namespaces.some((n) => n.type === 'user'));
  // A netns the runtime made outside the user namespace: sysfs cannot be mounted, /sys is a read-only bind.
  const joined = spec({ securityContext: { runAsUser: 0 } }, BUSYBOX, { netnsPath: '/run/asb/netns/p1' });
  assert.deepEqual(joined.mounts.find((m) => m.destination === '/sys'), { destination: '/sys', type: 'none', source: '/sys', options: ['rbind', 'nosuid', 'noexec', 'nodev', 'ro'] });
  // Not root: no user namespace.
  assert.equal(spec({ securityContext: { runAsUser: 1 } }).linux.namespaces.some((n) => n.type === 'user'), false);
  // runAsNonRoot with a root user is a contradiction, refused.
  assert.deepEqual(refusedFields(() => spec({ securityContext: { runAsUser: 0, runAsNonRoot: true } })), ['securityContext.runAsNonRoot']);
  assert.deepEqual(refusedFields(() => spec({}, { ...BUSYBOX, user: '0' }, {}, { securityContext: { runAsNonRoot: true } })), ['securityContext.runAsNonRoot']);
});

test('capabilities: none unless added, only from the baseline set, drop wins', () => {
  const bind = spec({ securityContext: { capabilities: { add: ['NET_BIND_SERVICE'] } } });
  // A non-root process keeps it across execve only as an ambient capability (which must be inheritable).
  assert.deepEqual(bind.process.capabilities, {
    bounding: ['CAP_NET_BIND_SERVICE'], effective: ['CAP_NET_BIND_SERVICE'], permitted: ['CAP_NET_BIND_SERVICE'], inheritable: ['CAP_NET_BIND_SERVICE'], ambient: ['CAP_NET_BIND_SERVICE'],
  });
  // Root (in its user namespace) has it from the permitted set: nothing inheritable or ambient.
  const root = spec({ securityContext: { runAsUser: 0, capabilities: { add: ['cap_chown', 'CHOWN', 'SYS_CHROOT'] } } });
  assert.deepEqual(root.process.capabilities, { bounding: ['CAP_CHOWN', 'CAP_SYS_CHROOT'], effective: ['CAP_CHOWN', 'CAP_SYS_CHROOT'], permitted: ['CAP_CHOWN', 'CAP_SYS_CHROOT'], inheritable: [], ambient: [] });
  assert.ok(allowedSyscalls(root).has('chroot'), 'CAP_SYS_CHROOT brings chroot(2) with it');
  assert.equal(allowedSyscalls(bind).has('chroot'), false);
  assert.deepEqual(spec({ securityContext: { capabilities: { add: ['CHOWN', 'KILL'], drop: ['KILL'] } } }).process.capabilities.effective, ['CAP_CHOWN']);
  assert.deepEqual(spec({ securityContext: { capabilities: { add: ['CHOWN'], drop: ['ALL'] } } }).process.capabilities.effective, []);
  // Outside the set: refused, each named, at once.
  assert.deepEqual(refusedFields(() => spec({ securityContext: { capabilities: { add: ['NET_BIND_SERVICE', 'SYS_ADMIN', 'CAP_NET_ADMIN', 7] } } })), [
    'securityContext.capabilities.add[1]', 'securityContext.capabilities.add[2]', 'securityContext.capabilities.add[3]',
  ]);
  assert.deepEqual(refusedFields(() => spec({ securityContext: { capabilities: { add: 'SYS_ADMIN' } } })), ['securityContext.capabilities.add']);
  assert.deepEqual(refusedFields(() => spec({ securityContext: { privileged: true } })), ['securityContext.privileged']);
  assert.deepEqual(refusedFields(() => spec({ securityContext: { procMount: 'Unmasked' } })), ['securityContext.procMount']);
  assert.equal(spec({ securityContext: { privileged: false } }).process.noNewPrivileges, true);
  // allowPrivilegeEscalation does not turn no_new_privs off: setuid binaries never gain anything in a sandbox.
  assert.equal(spec({ securityContext: { allowPrivilegeEscalation: true } }).process.noNewPrivileges, true);
});

test('resources: cpu quota and shares, memory with no swap, from Kubernetes quantities', () => {
  const s = spec({ resources: { limits: { cpu: '500m', memory: '512Mi' }, requests: { cpu: '250m' } } });
  assert.deepEqual(s.linux.resources.cpu, { shares: 256, quota: 50_000, period: 100_000 });
  assert.deepEqual(s.linux.resources.memory, { limit: 512 * 2 ** 20, swap: 512 * 2 ** 20 });
  assert.deepEqual(spec({ resources: { limits: { cpu: 2, memory: '1G' } } }).linux.resources, {
    ...spec().linux.resources, cpu: { quota: 200_000, period: 100_000 }, memory: { limit: 1e9, swap: 1e9 },
  });
  // A tiny cpu limit is Linux's minimum quota (1 ms per 100 ms), not zero.
  assert.deepEqual(spec({ resources: { limits: { cpu: '1m' } } }).linux.resources.cpu, { quota: 1000, period: 100_000 });
  // Fractional bytes round up.
  assert.equal(spec({ resources: { limits: { memory: '100.5Mi' } } }).linux.resources.memory.limit, Math.ceil(100.5 * 2 ** 20));
  // Other resources (ephemeral-storage is the runtime's disk image; extended resources) do not change the spec.
  assert.deepEqual(spec({ resources: { limits: { 'ephemeral-storage': '10Gi', 'example.com/gpu': 1 } } }).linux.resources, spec().linux.resources);
});

test('bad quantities are refused with the field and the value, all at once', () => {
  let message = '';
  const fields = refusedFields(() => {
    try {
      return spec({ resources: { limits: { cpu: 'lots', memory: '1Qi' }, requests: { cpu: '-1', memory: 'x' } } });
    } catch (err) {
      message = String(err);
      throw err;
    }
  });
  assert.deepEqual(fields, ['resources.limits.memory', 'resources.limits.cpu', 'resources.requests.cpu', 'resources.requests.memory']);
  assert.ok(message.includes('"lots"') && message.includes('"1Qi"') && message.includes('"-1"'), message);
  assert.ok(message.includes('container "main"'), message);
  assert.deepEqual(refusedFields(() => spec({ resources: { limits: { memory: '1Mi' } } })), ['resources.limits.memory']);
  assert.deepEqual(refusedFields(() => spec({ resources: { limits: { cpu: 0 } } })), ['resources.limits.cpu']);
  assert.deepEqual(refusedFields(() => spec({ resources: { limits: { memory: ' 1Gi' } } })), ['resources.limits.memory']);
});

test('runtime facts: netns by path, volumes as bind mounts, /dev/shm and pids sized, read-only root', () => {
  const s = spec({ securityContext: { readOnlyRootFilesystem: true } }, BUSYBOX, {
    netnsPath: '/run/asb/netns/p1',
    mounts: [{ destination: '/home/user/data', source: '/var/lib/asb/volumes/v1' }, { destination: '/etc/hosts', source: '/var/lib/asb/pods/p1/hosts', readOnly: true }],
    shmBytes: 256 * 2 ** 20,
    pidsLimit: 64,
    nofile: 4096,
  });
  assert.deepEqual(s.linux.namespaces.find((n) => n.type === 'network'), { type: 'network', path: '/run/asb/netns/p1' });
  assert.deepEqual(s.mounts.slice(-2), [
    { destination: '/home/user/data', type: 'bind', source: '/var/lib/asb/volumes/v1', options: ['rbind', 'nosuid', 'nodev', 'rw'] },
    { destination: '/etc/hosts', type: 'bind', source: '/var/lib/asb/pods/p1/hosts', options: ['rbind', 'nosuid', 'nodev', 'ro'] },
  ]);
  assert.ok(s.mounts.find((m) => m.destination === '/dev/shm')?.options.includes('size=262144k'));
  assert.equal(s.linux.resources.pids.limit, 64);
  assert.deepEqual(s.process.rlimits[0], { type: 'RLIMIT_NOFILE', soft: 4096, hard: 4096 });
  assert.equal(s.root.readonly, true);
  // A non-root pod with a joined netns still mounts its own sysfs (it needs no user namespace to).
  assert.equal(s.mounts.find((m) => m.destination === '/sys')?.type, 'sysfs');
  assert.deepEqual(refusedFields(() => spec({}, BUSYBOX, { mounts: [{ destination: 'data', source: '/v' }] })), ['volumeMounts']);
});

test('a capability that acts on what a namespace owns comes with a user namespace; NET_BIND_SERVICE alone does not', () => {
  const identity = (c: Partial<Container>, image: ImageConfig = BUSYBOX) => sandboxIdentity({ name: 'main', ...c }, image, {});
  assert.equal(identity({}).userNamespace, undefined);
  assert.equal(identity({ securityContext: { capabilities: { add: ['NET_BIND_SERVICE'] } } }).userNamespace, undefined);
  assert.deepEqual(identity({ securityContext: { runAsUser: 0 } }).userNamespace, ROOT_ID_MAP);
  assert.deepEqual(identity({}, { ...BUSYBOX, user: '0:0' }).userNamespace, ROOT_ID_MAP);
  // uid 1000 with an ambient CAP_SETUID could setuid(0): that must be root of its own namespace, not the host's.
  for (const cap of ['SETUID', 'SETGID', 'CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'KILL', 'MKNOD']) {
    const id = identity({ securityContext: { capabilities: { add: [cap, 'NET_BIND_SERVICE'] } } });
    assert.deepEqual(id.userNamespace, ROOT_ID_MAP, cap);
    assert.equal(id.uid, 1000);
    const s = spec({ securityContext: { capabilities: { add: [cap] } } });
    assert.ok(s.linux.namespaces.some((n) => n.type === 'user'), cap);
    assert.deepEqual(s.linux.uidMappings, [{ containerID: 0, hostID: ROOT_ID_MAP.hostId, size: ROOT_ID_MAP.size }]);
  }
  // The runtime asks first (to pick the id-mapped tree), then builds the spec: the same answer.
  const asked = sandboxIdentity({ name: 'main', securityContext: { runAsUser: 0 } }, BUSYBOX, { idMap: { hostId: 300_000, size: 65_536 } });
  const built = spec({ securityContext: { runAsUser: 0 } }, BUSYBOX, { idMap: { hostId: 300_000, size: 65_536 } });
  assert.deepEqual(built.linux.uidMappings, [{ containerID: 0, hostID: asked.userNamespace?.hostId, size: asked.userNamespace?.size }]);
  assert.deepEqual(built.process.user, { uid: asked.uid, gid: asked.gid, additionalGids: asked.additionalGids });
  assert.deepEqual(built.process.capabilities, asked.capabilities);
  assert.deepEqual(refusedFields(() => identity({ securityContext: { capabilities: { add: ['SYS_ADMIN'] } } })), ['securityContext.capabilities.add[0]']);
});
