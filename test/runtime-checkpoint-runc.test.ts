// The local runtime's stop with memory on runc, through CRIU (make criu): a runc pod started
// checkpointable (PodRequest.checkpointable, what a Sandbox with suspensionStrategy Hibernate asks)
// is saved by `runc checkpoint` and its next start restores it, so a process holding state only in
// memory goes on where it was, with its listening socket, its address and its writable layer, and
// so do processes started through the runtime (a background server, a terminal). An image that
// cannot be restored falls back to a fresh start from the pod's files, saying why; a save that
// cannot be made leaves the pod running; a runc pod in the shim's own user namespace refuses with
// NotImplemented saying how to get memory. Real runc pods: needs root, make runc and make criu.
// Its own bridge and subnet (asbrm0, 10.236.0.0/16).
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { readdir, readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { isAsbError } from '../src/errors.ts';
import type { Container } from '../src/api/types.ts';
import { CHECKPOINT_META, type CheckpointMeta } from '../src/runtime/local/checkpoint.ts';
import { podPaths } from '../src/runtime/local/rootfs.ts';
import { DEFAULT_CRIU_DIR, findCriuBinary } from '../src/runtime/oci/criu-binary.ts';
import type { PodRequest, PodState } from '../src/runtime/runtime.ts';
import { counterApp, httpGet, podSh, startedReady as startedReadyIn } from './support/counter-app.ts';
import { startTestRuntime, stopTestRuntime, type TestRuntime } from './support/test-runtime.ts';

const BRIDGE = 'asbrm0';
const SUBNET = '10.236.0.0/16';
let fixture: TestRuntime;
let root = '';

before(async () => {
  fixture = await startTestRuntime('asb-ckpt-runc-', BRIDGE, SUBNET, { probeIntervalMs: 100, pollIntervalMs: 100, criu: findCriuBinary(process.env.ASB_CRIU_DIR ?? DEFAULT_CRIU_DIR) });
  ({ root } = fixture);
});

after(() => stopTestRuntime(fixture));

const COUNTER = counterApp(8000, { hold: true });

function counterPod(id: string, opts: { holdMiB?: number; checkpointable?: boolean; container?: Partial<Container> } = {}): PodRequest {
  return {
    id, uid: `uid-${id}`, namespace: 'default', hostname: `${id}-host`,
    ...(opts.checkpointable === false ? {} : { checkpointable: true }),
    spec: {
      containers: [{
        name: 'main', image: 'agent-sandbox/base', command: ['python3', '-c', COUNTER, String(opts.holdMiB ?? 0)],
        readinessProbe: { tcpSocket: { port: 8000 }, periodSeconds: 1 },
        ...opts.container,
      }],
    },
  };
}

async function count(state: PodState): Promise<{ token: string; n: number }> {
  const [token = '', n = ''] = (await httpGet(`http://${state.ip ?? ''}:8000/`)).split(' ');
  return { token, n: Number(n) };
}

const startedReady = (req: PodRequest): Promise<PodState> => startedReadyIn(fixture.rt, req);
const sh = (id: string, script: string): Promise<string> => podSh(fixture.rt, id, script);

async function readMeta(id: string): Promise<CheckpointMeta> {
  return JSON.parse(await readFile(join(podPaths(root, id).checkpoint, CHECKPOINT_META), 'utf8')) as CheckpointMeta;
}

async function writeMeta(id: string, meta: CheckpointMeta): Promise<void> {
  await writeFile(join(podPaths(root, id).checkpoint, CHECKPOINT_META), JSON.stringify(meta));
}

/** Runs the counter to 3, writes a file in its writable layer, and stops it with memory. */
async function countedAndPaused(req: PodRequest): Promise<{ before: PodState; token: string }> {
  const before = await startedReady(req);
  let last = { token: '', n: 0 };
  for (let i = 0; i < 3; i++) last = await count(before);
  assert.equal(last.n, 3);
  await sh(req.id, 'echo kept > /home/user/kept.txt');
  await fixture.rt.stop(req.id, { memory: true });
  return { before, token: last.token };
}

test('a checkpointable runc pod stopped with memory goes on where it was: its in-memory counter, its listening socket, its address and its files', async () => {
  const rt = fixture.rt;
  const req = counterPod('rmem1', { holdMiB: 32 });
  const { before, token } = await countedAndPaused(req);
  const stopped = rt.state('rmem1');
  assert.equal(stopped.phase, 'Stopped');
  assert.ok((stopped.checkpoint?.bytes ?? 0) > 32 << 20, `the state says memory is kept: ${JSON.stringify(stopped)}`);
  const paths = podPaths(root, 'rmem1');
  assert.equal((await stat(paths.dir)).mode & 0o777, 0o700, 'the pod dir keeps everyone out');
  const image = await stat(paths.checkpoint);
  assert.equal(image.mode & 0o777, 0o700);
  assert.equal(image.uid, rt.state('rmem1').phase === 'Stopped' ? image.uid : -1);
  const meta = await readMeta('rmem1');
  assert.equal(meta.criuVersion, '4.1.1');
  assert.equal(meta.runscVersion, undefined);
  assert.ok(meta.files.some((f) => /^pages-\d+\.img$/.test(f.name) && f.sha256 === undefined && f.bytes >= 32 << 20), JSON.stringify(meta.files));
  assert.ok(meta.files.some((f) => f.name === 'inventory.img' && typeof f.sha256 === 'string'), JSON.stringify(meta.files));

  const woken = await startedReady(req);
  assert.equal(woken.restoreFailure, undefined);
  assert.equal(woken.ip, before.ip, 'the pod keeps its address');
  assert.deepEqual(await count(woken), { token, n: 4 }, 'the same process, its memory as it was');
  assert.equal(await sh('rmem1', 'cat /home/user/kept.txt'), 'kept\n');
  assert.equal(existsSync(paths.checkpoint), false, 'a restored image is deleted: it must never be restored twice');
  // A restored pod is saved and restored again.
  await rt.stop('rmem1', { memory: true });
  assert.deepEqual(await count(await startedReady(req)), { token, n: 5 });
  // A plain stop keeps files only: the counter starts again.
  await rt.stop('rmem1');
  const fresh = await count(await startedReady(req));
  assert.notEqual(fresh.token, token);
  assert.equal(fresh.n, 1);
  await rt.remove('rmem1');
});
