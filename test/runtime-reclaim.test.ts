// A worker killed (kill -9 of the real process) in the middle of a create, a stop, a stop with
// memory or a delete leaves the host as it was once a new one has started on the same state dir:
// that start removes what belongs to no live pod and adopts what does, and the live pods keep
// working. Each kind of residue is counted against a fresh baseline (support/runtime-residue.ts).
// A pod whose shim alone is killed ends with it, and its removal leaves nothing either.
// And a runtime that closes with no pod running leaves nothing behind: no bridge, no claim on
// it, no mount-point directory. Own subnet 10.250.2.0/24 and bridge asbrcrc0; own claim and
// id-range dirs, so nothing here touches another test's state.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { deleteBridge } from '../src/runtime/local/network.ts';
import { processStartTime } from '../src/runtime/local/rootfs.ts';
import { RuntimeProcess, type RuntimeProcessOptions } from './support/runtime-process.ts';
import { countResidue, residueDifference, type Residue } from './support/runtime-residue.ts';

const BRIDGE = 'asbrcrc0';
const base = mkdtempSync(join(tmpdir(), 'asb-reclaim-'));
const opts: RuntimeProcessOptions = { root: join(base, 'runtime'), bridge: BRIDGE, subnet: '10.250.2.0/24', claimsDir: join(base, 'claims'), idRangesDir: join(base, 'id-ranges') };
const scope = { root: opts.root, bridge: BRIDGE, claimsDir: opts.claimsDir, idRangesDir: opts.idRangesDir };
const LIVE = [{ id: 'live-runc', gvisor: false }, { id: 'live-gvisor', gvisor: true }];

let worker: RuntimeProcess;
let fresh: Residue;
/** The counts with the live pods running and nothing else. */
let withLive: Residue;

async function startWorker(): Promise<RuntimeProcess> {
  const w = new RuntimeProcess(opts);
  await w.ready;
  return w;
}

/** Polls (every 2 ms, at most 60 s) until `ready` says so, then kills the worker at once. */
async function killWhen(what: string, ready: () => boolean | Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (!(await ready())) {
    assert.ok(Date.now() < deadline, `never saw ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
  await worker.kill();
}

const mounted = (path: string): boolean => readFileSync('/proc/self/mountinfo', 'utf8').split('\n').some((l) => l.split(' ')[4] === path);
const podDir = (id: string): string => join(opts.root, 'pods', id);

async function initPid(id: string): Promise<number> {
  const state = (await worker.send({ op: 'state', id })).state as { pid?: number };
  assert.ok(state.pid !== undefined, `${id} runs`);
  return state.pid;
}

/** Every live pod answers an exec. */
async function liveWork(ids: readonly string[]): Promise<void> {
  for (const id of ids) {
    const out = await worker.send({ op: 'exec', id, command: ['sh', '-c', 'echo alive; touch /tmp/x'] }, 30_000);
    assert.equal(out.stdout, 'alive\n', `${id} still works`);
  }
}

/** The counts equal `expected` but for the kinds in `ignore` (a stopped pod's own id-range claim). */
async function assertBackTo(expected: Residue, what: string, ignore: readonly string[] = []): Promise<void> {
  const without = (r: Residue): Residue => Object.fromEntries(Object.entries(r).filter(([k]) => !ignore.includes(k)));
  assert.deepEqual(residueDifference(without(expected), without(await countResidue(scope))), [], `after ${what}, the host has what it had before`);
}

before(async () => {
  fresh = await countResidue(scope);
  worker = await startWorker();
  for (const p of LIVE) await worker.send({ op: 'start', id: p.id, gvisor: p.gvisor });
  await liveWork(LIVE.map((p) => p.id));
  withLive = await countResidue(scope);
});

after(async () => {
  await worker.kill();
  // A last worker removes every pod this file made, whatever a failed test left.
  const last = new RuntimeProcess(opts);
  await last.ready;
  for (const id of readdirSync(join(opts.root, 'pods'))) await last.send({ op: 'remove', id }).catch(() => undefined);
  await last.send({ op: 'close' }).catch(() => undefined);
  await last.exited;
  await deleteBridge(BRIDGE);
  rmSync(base, { recursive: true, force: true });
});

for (const gvisor of [false, true]) {
  test(`a worker killed in the middle of a create (${gvisor ? 'gVisor' : 'runc'}): the next one removes the half-made pod's mounts, loop device and mount dirs`, async () => {
    const id = `create-${gvisor ? 'gv' : 'rc'}`;
    void worker.send({ op: 'start', id, gvisor }).catch(() => undefined);
    // The pod's disk is mounted before its shim starts: the worker dies with it mounted.
    await killWhen('the pod\'s disk mounted', () => mounted(join(podDir(id), 'disk')));
    worker = await startWorker();
    await liveWork(LIVE.map((p) => p.id));
    await assertBackTo(withLive, 'a restart', ['idRanges']);
    await worker.send({ op: 'remove', id });
    await assertBackTo(withLive, 'the half-made pod\'s removal');
  });
}

test('a worker killed in the middle of a stop: the stopped pod keeps no mount dir, no cgroup, no container', async () => {
  const id = 'stop-rc';
  await worker.send({ op: 'start', id });
  const pid = await initPid(id);
  void worker.send({ op: 'stop', id }).catch(() => undefined);
  await killWhen('the pod\'s init end', async () => (await processStartTime(pid)) === undefined);
  worker = await startWorker();
  await liveWork(LIVE.map((p) => p.id));
  await assertBackTo(withLive, 'a restart', ['idRanges']);
  assert.equal(((await worker.send({ op: 'state', id })).state as { phase: string }).phase, 'Stopped');
  await worker.send({ op: 'remove', id });
  await assertBackTo(withLive, 'the stopped pod\'s removal');
});

test('a worker killed in the middle of a stop with memory (gVisor): the next one resumes the paused sandbox, stops the save and deletes its half-written image', async () => {
  const id = 'ckpt-gv';
  await worker.send({ op: 'start', id, gvisor: true });
  await worker.send({ op: 'exec', id, command: ['sh', '-c', 'echo before > /tmp/mark'] });
  void worker.send({ op: 'stop', id, memory: true }).catch(() => undefined);
  await killWhen('the checkpoint being written', () => existsSync(join(podDir(id), 'checkpoint.partial')));
  worker = await startWorker();
  // The sandbox was paused for the save: it runs again, with its files and processes.
  await liveWork([...LIVE.map((p) => p.id), id]);
  const mark = await worker.send({ op: 'exec', id, command: ['cat', '/tmp/mark'] });
  assert.equal(mark.stdout, 'before\n');
  await worker.send({ op: 'remove', id });
  await assertBackTo(withLive, 'the sandbox\'s removal');
});

test('a worker killed in the middle of a delete: the next one leaves the half-deleted pod nothing but its dir, and its removal everything', async () => {
  const id = 'delete-gv';
  await worker.send({ op: 'start', id, gvisor: true });
  const pid = await initPid(id);
  void worker.send({ op: 'remove', id }).catch(() => undefined);
  await killWhen('the pod\'s init end', async () => (await processStartTime(pid)) === undefined);
  worker = await startWorker();
  await liveWork(LIVE.map((p) => p.id));
  await assertBackTo(withLive, 'a restart', ['idRanges']);
  await worker.send({ op: 'remove', id });
  await assertBackTo(withLive, 'the pod\'s removal');
});

/** The pid of the pod's oci-shim. */
function shimOf(id: string): number {
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      if ((argv[0] ?? '').includes('/bin/oci-shim-') && argv.includes(podDir(id))) return Number(pid);
    } catch {
      // gone meanwhile
    }
  }
  throw new Error(`no shim of ${id}`);
}

test('a pod whose shim is killed with -9 ends with it: its init and processes are gone, it says Failed, and its removal leaves the host as before', async () => {
  const id = 'shim-rc';
  await worker.send({ op: 'start', id });
  const pid = await initPid(id);
  process.kill(shimOf(id), 'SIGKILL');
  let phase = '';
  for (let i = 0; i < 300 && phase !== 'Failed'; i++) {
    phase = ((await worker.send({ op: 'state', id })).state as { phase: string }).phase;
    if (phase !== 'Failed') await new Promise((resolve) => setTimeout(resolve, 100));
  }
  assert.equal(phase, 'Failed', 'the pod says it ended');
  // It used to run on, reparented to the host's init, and its mounts made the removal fail (EBUSY).
  assert.equal(await processStartTime(pid), undefined, 'the pod\'s init ended with its shim');
  await worker.send({ op: 'remove', id });
  await liveWork(LIVE.map((p) => p.id));
  await assertBackTo(withLive, 'the pod\'s removal');
});

test('a runtime that closes with no pod running leaves no bridge, no claim on it and no mount-point dir', async () => {
  for (const p of LIVE) await worker.send({ op: 'remove', id: p.id });
  await worker.send({ op: 'close' });
  await worker.exited;
  await assertBackTo(fresh, 'the last pod\'s removal and a clean shutdown');
});

test('gVisor pods started at once on a fresh worker leave one null-netns mount, not one per start', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-reclaim-nn-'));
  const own: RuntimeProcessOptions = { root: join(dir, 'runtime'), bridge: 'asbrcrc1', subnet: '10.250.3.0/24', claimsDir: join(dir, 'claims'), idRangesDir: join(dir, 'id-ranges') };
  const w = new RuntimeProcess(own);
  const ids = ['nn1', 'nn2', 'nn3', 'nn4'];
  try {
    await w.ready;
    // runsc pins the namespace once per cold start that finds none pinned: concurrent ones stack.
    await Promise.all(ids.map((id) => w.send({ op: 'start', id, gvisor: true })));
    const stacked = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.split(' ')[4] === join(own.root, 'runsc', 'null-netns')).length;
    assert.equal(stacked, 1);
  } finally {
    for (const id of ids) await w.send({ op: 'remove', id }).catch(() => undefined);
    await w.send({ op: 'close' }).catch(() => undefined);
    await w.exited;
    await deleteBridge('asbrcrc1');
    rmSync(dir, { recursive: true, force: true });
  }
});
