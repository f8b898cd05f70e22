// The pure half of gVisor support (src/runtime/oci/runsc.ts): the runsc command lines and the
// changes spec.ts's config.json gets under runsc. test/oci-runsc.test.ts runs them for real.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RUNSC_MEMORY_OVERHEAD_BYTES, runscArgs, runscFailure, runscFlags, runscSpec, runscStopSequence } from '../src/runtime/oci/runsc.ts';
import { containerSpec, DEFAULT_PIDS_LIMIT, ROOT_ID_MAP } from '../src/runtime/oci/spec.ts';

const image = { user: undefined, env: [], entrypoint: [], cmd: ['sh'], workingDir: undefined };
const facts = { rootfs: '/r', hostname: 'sbx', cgroupsPath: '/asb/c/x' };
const opts = { root: '/run/asb/runsc' };

test('every runsc command carries the worker\'s flags: systrap, netstack, no in-sandbox overlay, the OCI seccomp profile', () => {
  const global = ['--root', '/run/asb/runsc', '--platform=systrap', '--network=sandbox', '--overlay2=none', '--oci-seccomp'];
  assert.deepEqual(runscArgs(opts, { op: 'run', id: 'x', bundle: '/b', pidFile: '/p' }), [...global, 'run', '-detach', '-pid-file', '/p', '-bundle', '/b', 'x']);
  assert.deepEqual(runscArgs(opts, { op: 'exec', id: 'x', processFile: '/proc.json' }), [...global, 'exec', '-process', '/proc.json', 'x']);
  assert.deepEqual(runscArgs(opts, { op: 'exec', id: 'x', processFile: '/p.json', detach: true, pidFile: '/e.pid', consoleSocket: '/s' }),
    [...global, 'exec', '-detach', '-pid-file', '/e.pid', '-console-socket', '/s', '-process', '/p.json', 'x']);
  assert.deepEqual(runscArgs(opts, { op: 'state', id: 'x' }), [...global, 'state', 'x']);
  assert.deepEqual(runscStopSequence(opts, 'x').map((s) => s.argv.slice(global.length)), [['kill', 'x', 'KILL'], ['wait', 'x'], ['delete', '-force', 'x']]);
  assert.deepEqual(runscArgs({ ...opts, network: 'host', platform: 'ptrace', debugLogDir: '/logs' }, { op: 'delete', id: 'x', force: false }),
    ['--root', '/run/asb/runsc', '--platform=ptrace', '--network=host', '--overlay2=none', '--oci-seccomp', '--debug', '--debug-log=/logs/', 'delete', 'x']);
});

test('runscSpec: gVisor\'s own /sys instead of a bind of the host\'s, limits raised by the sandbox\'s overhead, the input untouched', () => {
  const root = containerSpec({ name: 'main', command: ['sh'], securityContext: { runAsUser: 0 }, resources: { limits: { memory: '100Mi' } } }, image, { ...facts, netnsPath: '/n' });
  const before = JSON.stringify(root);
  assert.equal(root.mounts.find((m) => m.destination === '/sys')?.source, '/sys', 'runc binds the host /sys for a root pod in a joined netns');
  const adjusted = runscSpec(root);
  assert.equal(JSON.stringify(root), before);
  assert.deepEqual(adjusted.mounts.find((m) => m.destination === '/sys'), { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] });
  assert.equal(adjusted.mounts.length, root.mounts.length);
  assert.deepEqual(adjusted.linux.resources.memory, { limit: 100 * 2 ** 20 + RUNSC_MEMORY_OVERHEAD_BYTES, swap: 100 * 2 ** 20 + RUNSC_MEMORY_OVERHEAD_BYTES });
  assert.equal(adjusted.linux.resources.pids.limit, DEFAULT_PIDS_LIMIT * 2 + 64);
  // What runsc accepts as it is stays as it is, but for clone3's ENOSYS (below).
  assert.deepEqual(adjusted.linux.seccomp.syscalls.filter((r) => !r.names.includes('clone3')), root.linux.seccomp.syscalls.filter((r) => !r.names.includes('clone3')));
  assert.deepEqual(adjusted.linux.uidMappings, [{ containerID: 0, hostID: ROOT_ID_MAP.hostId, size: ROOT_ID_MAP.size }]);
  // The same process, but an empty list of supplementary groups is left out (runsc's restore compares it with an absent one).
  const { additionalGids: _none, ...user } = root.process.user;
  assert.deepEqual(adjusted.process, { ...root.process, user });
  assert.deepEqual(adjusted.linux.maskedPaths, root.linux.maskedPaths);
});

test('runscFlags: the global flags without --root, for the shim and exec, which add the --root of their own', () => {
  assert.deepEqual(runscFlags({}), ['--platform=systrap', '--network=sandbox', '--overlay2=none', '--oci-seccomp']);
  assert.deepEqual(runscArgs(opts, { op: 'state', id: 'x' }), ['--root', opts.root, ...runscFlags({}), 'state', 'x']);
});

// runsc answers EPERM for every SCMP_ACT_ERRNO whatever its errnoRet (google/gvisor#14688): glibc
// then never falls back from clone3 to clone and no thread starts (test/runtime-gvisor.test.ts).
test('runscSpec: clone3\'s ENOSYS rule becomes SCMP_ACT_TRACE, which gVisor answers with ENOSYS when no tracer is attached (ptrace stays denied)', () => {
  const spec = containerSpec({ name: 'main', command: ['sh'] }, image, facts);
  const clone3 = spec.linux.seccomp.syscalls.filter((r) => r.names.includes('clone3'));
  assert.deepEqual(clone3, [{ names: ['clone3'], action: 'SCMP_ACT_ERRNO', errnoRet: 38 }], 'runc keeps the errno rule');
  const adjusted = runscSpec(spec).linux.seccomp.syscalls;
  assert.deepEqual(adjusted.filter((r) => r.names.includes('clone3')), [{ names: ['clone3'], action: 'SCMP_ACT_TRACE' }]);
  assert.equal(adjusted.some((r) => r.names.includes('ptrace')), false, 'no tracer can attach: ptrace is not allowed');
  assert.equal(adjusted.filter((r) => r.errnoRet !== undefined).length, 0, 'no errnoRet is left for runsc to ignore');
});

test('runscFailure: the last FATAL ERROR runsc logged, else a plain reason', () => {
  const log = 'I1124 13:39:56.599775   24250 cli.go:275] **** gVisor ****\nW1124 13:39:56.627620   24250 util.go:107] FATAL ERROR: executing processes for container: executing command "/x" in sandbox: failed to load /x: no such file or directory\n';
  assert.equal(runscFailure(log), 'executing processes for container: executing command "/x" in sandbox: failed to load /x: no such file or directory');
  assert.equal(runscFailure(''), 'runsc exec failed and logged no reason');
});

test('runscSpec: a tmpDir is bound at /tmp, replacing any /tmp mount, so /tmp is on disk like the rest of the writable layer', () => {
  const spec = containerSpec({ name: 'main', command: ['sh'] }, image, { ...facts, mounts: [{ destination: '/tmp', source: '/volume' }] });
  const tmp = runscSpec(spec, { tmpDir: '/sbx/tmp' }).mounts.filter((m) => m.destination === '/tmp');
  assert.deepEqual(tmp, [{ destination: '/tmp', type: 'bind', source: '/sbx/tmp', options: ['rbind', 'nosuid', 'nodev', 'rw'] }]);
  assert.deepEqual(runscSpec(spec).mounts.filter((m) => m.destination === '/tmp').map((m) => m.source), ['/volume']);
});

test('runscSpec: /dev is read-only (runsc sizes its own /dev at half the host\'s memory); /dev/shm keeps its size and stays writable', () => {
  const spec = runscSpec(containerSpec({ name: 'main', command: ['sh'] }, image, facts));
  assert.deepEqual(spec.mounts.find((m) => m.destination === '/dev')?.options.includes('ro'), true);
  const shm = spec.mounts.find((m) => m.destination === '/dev/shm');
  assert.ok(shm !== undefined && !shm.options.includes('ro') && shm.options.includes('size=65536k'), JSON.stringify(shm));
});
