// Every sandbox is its own host user: a user namespace of its own 65,536-id range
// (src/runtime/local/id-ranges.ts), owned by that range, over the one shared copy of its image.
// Before, every sandbox ran in one range (0 → 100000) in a namespace owned by host root, so the
// kernel charged all of them to root: one sandbox holding 126 inotify instances, 9 message queues
// or 96,281 queued real-time signals made inotify_init1, mq_open and sigqueue fail in every other
// sandbox and for root on the host.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { Attack, LabPod } from './support/attack-lab.ts';
import { AttackLab } from './support/attack-lab.ts';
import { DEFAULT_ID_RANGES_DIR, FIRST_HOST_ID, ID_RANGE_SIZE } from '../src/runtime/local/id-ranges.ts';
import { testImages } from './support/test-images.ts';

const run = promisify(execFile);

// Free on this host and in every other test (grep test/ for 10.2xx before taking another).
const lab = await AttackLab.create({ bridge: 'asbusr0', subnet: '10.222.0.0/16' });

/** The host id a pod's root is, from the host's view of its init's (runc) or sentry's (gVisor) namespace. */
async function hostRootOf(p: LabPod): Promise<number> {
  const map = (await readFile(`/proc/${String(p.state().pid)}/uid_map`, 'utf8')).trim().split(/\s+/);
  assert.equal(map.length, 3, `one line in ${p.id}'s uid_map: ${map.join(' ')}`);
  assert.equal(map[0], '0');
  assert.equal(map[2], String(ID_RANGE_SIZE));
  return Number(map[1]);
}

/** Whether a claim of the host-wide pool names this pod's directory. */
async function claimed(root: string, id: string): Promise<boolean> {
  const owner = join(root, 'pods', id);
  for (const name of await readdir(DEFAULT_ID_RANGES_DIR)) {
    if ((await readFile(join(DEFAULT_ID_RANGES_DIR, name), 'utf8').catch(() => '')) === owner) return true;
  }
  return false;
}

const rangesAttack: Attack = {
  name: 'two sandboxes run as two host users of their own ranges over one copy of the image; a wake keeps the range, a delete gives it back',
  run: async (a) => {
    const [one, two] = [await a.pod('range-a'), await a.pod('range-b')];
    const [hostA, hostB] = [await hostRootOf(one), await hostRootOf(two)];
    for (const host of [hostA, hostB]) assert.ok(host >= FIRST_HOST_ID && (host - FIRST_HOST_ID) % ID_RANGE_SIZE === 0, `${String(host)} is a range of the pool`);
    assert.notEqual(hostA, hostB, 'each sandbox has a range of its own');
    // Root's and the user's files on the host belong to the pod's own range.
    assert.equal((await one.sh('touch /by-root', { user: 0 })).exitCode, 0);
    assert.equal((await one.sh('echo kept > ~/mine')).exitCode, 0);
    const upper = join(a.root, 'pods', one.id, 'disk', 'upper');
    assert.equal((await stat(join(upper, 'by-root'))).uid, hostA);
    assert.equal((await stat(join(upper, 'home/user/mine'))).uid, hostA + 1000);
    // The image's files show as the sandbox's own (idmapped), from one shared tree: no copy per range.
    assert.equal((await one.sh('stat -c %u:%g /usr/bin/python3 /home/user')).out, '0:0\n1000:1000\n');
    const state = (id: string): Promise<{ image?: { rootfs: string } }> => readFile(join(a.root, 'pods', id, 'state.json'), 'utf8').then((t) => JSON.parse(t) as { image?: { rootfs: string } });
    const [treeA, treeB] = [(await state(one.id)).image?.rootfs, (await state(two.id)).image?.rootfs];
    assert.ok(treeA !== undefined && treeA === treeB, `both pods run the same cached tree: ${String(treeA)} and ${String(treeB)}`);
    const trees = await readdir(join((await testImages()).imageCache, 'rootfs'));
    assert.deepEqual(trees.filter((t) => t.includes(`_u${String(hostA)}-`) || t.includes(`_u${String(hostB)}-`)), [], 'no tree unpacked for a pod\'s range');
    // Hibernation and a wake: the same range, so the user's files are still the user's.
    await one.hibernate();
    assert.equal((await one.wake()).phase, 'Running');
    assert.equal(await hostRootOf(one), hostA);
    const after = await one.sh('stat -c %u ~/mine && echo more >> ~/mine && cat ~/mine');
    assert.equal(after.out, '1000\nkept\nmore\n', after.err);
    // Every process of a pod has its limits, inherited since runc cannot set them (inherited-rlimits.ts).
    assert.match((await one.sh('ulimit -n; ulimit -c; grep -E "open files|core file" /proc/1/limits')).out, /^16384\n0\nMax core file size\s+0\s+0\s+bytes\s*\nMax open files\s+16384\s+16384\s+files\s*\n$/);
    assert.equal(await claimed(a.root, one.id), true);
    await a.rt.remove(one.id);
    assert.equal(await claimed(a.root, one.id), false, 'the range went back to the pool');
  },
};

/**
 * Holds what a user can take of the three per-user counts until told to stop: inotify instances
 * until EMFILE, message queues until mq_open fails, real-time signals queued to itself until
 * EAGAIN (each bounded), then prints them and waits. `probe` takes one of each and says which work.
 */
const PER_USER = String.raw`
import ctypes, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mq_open.restype = ctypes.c_int
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
class sigval(ctypes.Union):
    _fields_ = [('sival_int', ctypes.c_int), ('sival_ptr', ctypes.c_void_p)]
libc.sigqueue.argtypes = [ctypes.c_int, ctypes.c_int, sigval]
O_CREAT, O_RDWR = 0o100, 0o2
tag = sys.argv[2]
def inotify():
    fd = libc.inotify_init1(0)
    return fd, ctypes.get_errno()
def mq(i):
    fd = libc.mq_open(('/asb-%s-%d' % (tag, i)).encode(), O_CREAT | O_RDWR, 0o600, None)
    return fd, ctypes.get_errno()
def sig():
    return libc.sigqueue(os.getpid(), signal.SIGRTMIN, sigval(1)), ctypes.get_errno()
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
if sys.argv[1] == 'probe':
    results = {'inotify': inotify(), 'mq': mq(0), 'sigqueue': sig()}
    libc.mq_unlink(('/asb-%s-0' % tag).encode())
    print(' '.join('%s=%s' % (k, 'ok' if r >= 0 else os.strerror(e)) for k, (r, e) in results.items()), flush=True)
    sys.exit(0)
held = {'inotify': 0, 'mq': 0, 'sigqueue': 0}
for _ in range(4096):
    if inotify()[0] < 0: break
    held['inotify'] += 1
for i in range(1024):
    if mq(i)[0] < 0: break
    held['mq'] += 1
for _ in range(400000):
    if sig()[0] < 0: break
    held['sigqueue'] += 1
print('holding ' + ' '.join('%s=%d' % kv for kv in held.items()), flush=True)
deadline = time.time() + 120
while time.time() < deadline and not os.path.exists('/tmp/release-' + tag):
    time.sleep(0.1)
for i in range(held['mq']):
    libc.mq_unlink(('/asb-%s-%d' % (tag, i)).encode())
`;

/** Starts the hog in `p` as its root, in the background, and resolves with what it holds once it holds it. */
async function hog(p: LabPod, tag: string): Promise<string> {
  // The hog runs on in the background; this exec returns once it says what it holds, or ended.
  const out = `/tmp/hog-${tag}.out`;
  const started = await p.sh(`cat > /tmp/per-user.py && (python3 /tmp/per-user.py hog ${tag} > ${out} 2>&1 & echo $! > ${out}.pid) && while kill -0 "$(cat ${out}.pid)" 2>/dev/null && ! grep -q holding ${out}; do sleep 0.05; done; cat ${out}`, { user: 0, stdin: PER_USER, timeoutMs: 60_000 });
  assert.match(started.out, /^holding /, `the hog in ${p.id} held nothing: ${started.out}${started.err}`);
  return started.out.trim();
}

async function probeIn(p: LabPod, tag: string): Promise<string> {
  const r = await p.sh(`cat > /tmp/probe.py && python3 /tmp/probe.py probe ${tag}`, { stdin: PER_USER });
  return r.out.trim() || r.err;
}

async function probeOnHost(tag: string): Promise<string> {
  const { stdout } = await run('python3', ['-c', PER_USER, 'probe', `host-${tag}`]);
  return stdout.trim();
}

const ALL_OK = 'inotify=ok mq=ok sigqueue=ok';

const perUserCountsAttack: Attack = {
  name: 'a sandbox holding all the inotify instances, message queues and queued signals it can leaves another sandbox and host root theirs, both ways',
  timeoutMs: 240_000,
  run: async (a) => {
    const [one, two] = [await a.pod('hog-a'), await a.pod('hog-b')];
    for (const [holder, other, tag] of [[one, two, 'a'], [two, one, 'b']] as const) {
      const held = await hog(holder, tag);
      // The hog really took what a user may take (on runc the host's per-user limits, 128 instances
      // and 819200 bytes of queues; gVisor's sentry keeps its own).
      assert.match(held, /inotify=[1-9]\d* mq=[1-9]\d* sigqueue=[1-9]\d*/);
      assert.equal(await probeIn(other, tag), ALL_OK, `${other.id} while ${holder.id} holds ${held}`);
      assert.equal(await probeOnHost(tag), ALL_OK, `host root while ${holder.id} holds ${held}`);
      // The holder itself is at its limit (runc): its own next instance fails, so the bound is real.
      if (a.cls === 'runc') assert.match(await probeIn(holder, `${tag}2`), /inotify=Too many open files/);
      await holder.sh(`touch /tmp/release-${tag}`, { user: 0 });
    }
  },
};

lab.register([rangesAttack, perUserCountsAttack]);
