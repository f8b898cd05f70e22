// What the state tests of both runtime classes share (runtime-checkpoint and runtime-snapshot on
// gVisor, their -runc twins on CRIU): the counter pod of each class, its count, the checkpoint's
// metadata, and the scenarios that must hold alike on both, run against the caller's runtime.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Container } from '../../src/api/types.ts';
import { isAsbError } from '../../src/errors.ts';
import { CHECKPOINT_META, type CheckpointMeta } from '../../src/runtime/local/checkpoint.ts';
import type { LocalRuntime } from '../../src/runtime/local/local-runtime.ts';
import { podPaths } from '../../src/runtime/local/rootfs.ts';
import type { PodRequest, PodState } from '../../src/runtime/runtime.ts';
import { counterApp, httpGet, podSh, startedReady } from './counter-app.ts';

export type StateKind = 'gvisor' | 'runc';

const COUNTER = counterApp(8000, { hold: true });

export interface CounterPodOptions {
  /** MiB of touched memory the app keeps (its image is that big). */
  holdMiB?: number;
  /** runc: started so CRIU can save it (default true); false: in the shim's own user namespace. */
  checkpointable?: boolean;
  /** A new pod from this snapshot. */
  from?: string;
  container?: Partial<Container>;
}

/** The counter app on port 8000 as a pod of `kind`, ready once it listens. */
export function counterPod(kind: StateKind, id: string, opts: CounterPodOptions = {}): PodRequest {
  return {
    id, uid: `uid-${id}`, namespace: 'default', hostname: `${id}-host`,
    ...(opts.from === undefined ? {} : { from: { snapshot: opts.from } }),
    ...(kind === 'runc' && opts.checkpointable !== false ? { checkpointable: true } : {}),
    spec: {
      ...(kind === 'gvisor' ? { runtimeClassName: 'gvisor' } : {}),
      containers: [{
        name: 'main', image: 'agent-sandbox/base', command: ['python3', '-c', COUNTER, String(opts.holdMiB ?? 0)],
        readinessProbe: { tcpSocket: { port: 8000 }, periodSeconds: 1 },
        ...opts.container,
      }],
    },
  };
}

/** The counter's token and count, asked over the pod's own address from the host. */
export async function count(state: PodState): Promise<{ token: string; n: number }> {
  const [token = '', n = ''] = (await httpGet(`http://${state.ip ?? ''}:8000/`)).split(' ');
  return { token, n: Number(n) };
}

export async function readMeta(root: string, id: string): Promise<CheckpointMeta> {
  return JSON.parse(await readFile(join(podPaths(root, id).checkpoint, CHECKPOINT_META), 'utf8')) as CheckpointMeta;
}

export async function writeMeta(root: string, id: string, meta: CheckpointMeta): Promise<void> {
  await writeFile(join(podPaths(root, id).checkpoint, CHECKPOINT_META), JSON.stringify(meta));
}

/** Runs the counter to 3, writes a file in its writable layer and /tmp, and stops it with memory. */
export async function countedAndPaused(rt: LocalRuntime, req: PodRequest): Promise<{ before: PodState; token: string }> {
  const before = await startedReady(rt, req);
  let last = { token: '', n: 0 };
  for (let i = 0; i < 3; i++) last = await count(before);
  assert.equal(last.n, 3);
  await podSh(rt, req.id, 'echo kept > /home/user/kept.txt; echo tmp-kept > /tmp/kept.txt');
  await rt.stop(req.id, { memory: true });
  return { before, token: last.token };
}

/**
 * A background server and a terminal started through the runtime survive a stop with memory: their
 * handles attach to them again and still act on them. Stopped without memory, a process ends
 * with the pod and its handle says so.
 */
export async function handlesSurviveAStop(rt: LocalRuntime, req: PodRequest): Promise<void> {
  const id = req.id;
  const first = await startedReady(rt, req);
  // A second counter, started as E2B's background commands are (spawn), on port 8001.
  const server = await rt.spawn(id, { command: ['python3', '-c', counterApp(8001, { hold: true }), '0'] });
  let serverEnded = false;
  void server.exited.then(() => (serverEnded = true));
  const url = `http://${first.ip ?? ''}:8001/`;
  let before = '';
  for (let i = 0; i < 100 && before === ''; i++) before = await httpGet(url).catch(() => new Promise<string>((resolve) => setTimeout(() => resolve(''), 50)));
  const [token] = before.split(' ');
  assert.equal(await httpGet(url), `${token ?? ''} 2`);
  // A terminal whose shell keeps a variable in memory.
  const pty = await rt.openPty(id, { cols: 80, rows: 24, command: ['sh'] });
  const screen: string[] = [];
  const reading = (async () => {
    for await (const chunk of pty.output) screen.push(Buffer.from(chunk).toString());
  })();
  const shown = async (text: string): Promise<void> => {
    for (let i = 0; i < 100 && !screen.join('').includes(text); i++) await new Promise((resolve) => setTimeout(resolve, 50));
  };
  // Stopped only once the shell has run it: input still on its way when the save drops the
  // agent's connections is lost, as keystrokes typed into a terminal at a pause would be.
  await pty.write('X=kept-in-memory; echo "set-$((40 + 2))"\n');
  await shown('set-42');

  await rt.stop(id, { memory: true });
  assert.equal(rt.state(id).phase, 'Stopped');
  assert.equal(serverEnded, false, 'the handle of a process kept in the checkpoint does not end');
  const woken = await startedReady(rt, req);
  assert.equal(woken.restoreFailure, undefined);
  assert.equal(await httpGet(url), `${token ?? ''} 3`, 'the spawned server answers from its memory');
  await pty.write('echo "[$X]"\n');
  await shown('[kept-in-memory]');
  assert.match(screen.join(''), /\[kept-in-memory\]/, 'the terminal\'s shell kept its variable');
  // The handles still act on their processes.
  server.kill('SIGTERM');
  assert.equal((await server.exited).signal, 'SIGTERM');
  pty.close();
  await pty.exited;
  await reading;

  const again = await rt.spawn(id, { command: ['sleep', '1000'] });
  await rt.stop(id);
  assert.deepEqual(await again.exited, { exitCode: 137, signal: 'SIGKILL' });
  await rt.remove(id);
}

/** A save that would pass the pod's ephemeral-storage (96 MiB of memory, a 64 MiB disk) is refused: the pod keeps running, nothing of the image is left. */
export async function saveOverItsDiskIsRefused(rt: LocalRuntime, root: string, kind: StateKind, id: string): Promise<void> {
  const req = counterPod(kind, id, { holdMiB: 96, container: { resources: { limits: { 'ephemeral-storage': '64Mi', memory: '512Mi' } } } });
  const before = await startedReady(rt, req);
  assert.equal((await count(before)).n, 1);
  await assert.rejects(rt.stop(id, { memory: true }), (err) => isAsbError(err, 'CheckpointFailed') && /would pass its ephemeral-storage limit of 64\.0 MiB/.test(err.message) && /keeps running/.test(err.message));
  assert.equal(rt.state(id).phase, 'Running');
  assert.equal((await count(before)).n, 2, 'the same process answers');
  const paths = podPaths(root, id);
  assert.equal(existsSync(paths.checkpoint) || existsSync(paths.checkpointPartial), false);
  await rt.remove(id);
}
