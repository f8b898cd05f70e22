// envd's polled watchers (CreateWatcher / GetWatcherEvents / RemoveWatcher, the Python SDK's sync
// watch_dir) against a stand-in sandbox filesystem: what each poll reports, that a watcher is
// its sandbox's alone, and that the table stays within its limits by dropping the least recently
// used watcher. test/e2b-python.test.ts runs them against real sandboxes.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { ExecResult, PodRuntime } from '../src/runtime/runtime.ts';
import { silentLogger } from '../src/base/log.ts';
import { ConnectError } from '../src/worker/envd/connect.ts';
import type { FsTarget } from '../src/worker/envd/entries.ts';
import { WatcherTable } from '../src/worker/envd/watchers.ts';

interface File {
  size: number;
  mtime: number;
}

/** A runtime whose exec answers envd's `find -printf` listing from a map of path → file, per sandbox. */
function fakeFs(trees: Record<string, Map<string, File>>): PodRuntime {
  const exec = (id: string, opts: { command: string[] }): Promise<ExecResult> => {
    const dir = opts.command[4] ?? '';
    const tree = trees[id];
    if (tree === undefined) throw new Error(`no sandbox ${id}`);
    const records = [...tree].filter(([path]) => path.startsWith(`${dir}/`)).map(([path, f]) => `f\t${String(f.size)}\t644\tuser\tuser\t${String(f.mtime)}\t\t${path}\0`);
    return Promise.resolve({ exitCode: 0, stdout: Buffer.from(records.join('')), stderr: new Uint8Array(), timedOut: false, truncated: false });
  };
  return { exec } as unknown as PodRuntime;
}

function target(runtime: PodRuntime, id: string): FsTarget {
  return { runtime, id, uid: undefined, home: () => Promise.resolve('/home/user') };
}

async function notFound(p: Promise<unknown>): Promise<void> {
  await assert.rejects(p, (err: unknown) => err instanceof ConnectError && err.code === 'not_found');
}

test('each poll reports the net change since the last one: create, write, remove', async () => {
  const tree = new Map<string, File>([['/w/a', { size: 1, mtime: 1 }]]);
  const t = target(fakeFs({ s1: tree }), 's1');
  const table = new WatcherTable(silentLogger());
  const { watcherId } = await table.create(t, { path: '/w' });
  assert.deepEqual(await table.events(t, { watcherId }), { events: [] });
  tree.set('/w/b', { size: 2, mtime: 2 });
  tree.set('/w/a', { size: 5, mtime: 3 });
  const second = await table.events(t, { watcherId });
  assert.deepEqual(second.events.map((e) => `${e.type}:${e.name}`).sort(), ['EVENT_TYPE_CREATE:b', 'EVENT_TYPE_WRITE:a']);
  tree.delete('/w/a');
  assert.deepEqual((await table.events(t, { watcherId })).events.map((e) => `${e.type}:${e.name}`), ['EVENT_TYPE_REMOVE:a']);
  assert.deepEqual(await table.events(t, { watcherId }), { events: [] }, 'reported once');
  assert.deepEqual(table.remove(t, { watcherId }), {});
  await notFound(table.events(t, { watcherId }));
});

test('a watcher is found only through the sandbox it watches', async () => {
  const runtime = fakeFs({ s1: new Map(), s2: new Map() });
  const table = new WatcherTable(silentLogger());
  const { watcherId } = await table.create(target(runtime, 's1'), { path: '/w' });
  await notFound(table.events(target(runtime, 's2'), { watcherId }));
  assert.throws(() => table.remove(target(runtime, 's2'), { watcherId }), (err: unknown) => err instanceof ConnectError && err.code === 'not_found');
  assert.deepEqual(await table.events(target(runtime, 's1'), { watcherId }), { events: [] });
  await assert.rejects(table.events(target(runtime, 's1'), {}), (err: unknown) => err instanceof ConnectError && err.code === 'invalid_argument');
});

test('past the watcher limit the least recently used watcher is dropped', async () => {
  const t = target(fakeFs({ s1: new Map() }), 's1');
  const table = new WatcherTable(silentLogger(), { watchers: 2, entries: 1000 });
  const first = await table.create(t, { path: '/w' });
  const second = await table.create(t, { path: '/w' });
  await table.events(t, first);
  await table.create(t, { path: '/w' });
  await notFound(table.events(t, second));
  assert.deepEqual(await table.events(t, first), { events: [] }, 'used since, so kept');
  assert.equal(table.dropped, 1);
});

test('past the entry limit watchers are dropped, and one listing over it alone is refused', async () => {
  const big = new Map<string, File>(Array.from({ length: 6 }, (_, i) => [`/big/f${String(i)}`, { size: 1, mtime: 1 }]));
  const small = new Map<string, File>(Array.from({ length: 3 }, (_, i) => [`/small/f${String(i)}`, { size: 1, mtime: 1 }]));
  const t = target(fakeFs({ s1: new Map([...big, ...small]) }), 's1');
  const table = new WatcherTable(silentLogger(), { watchers: 10, entries: 8 });
  const a = await table.create(t, { path: '/small' });
  const b = await table.create(t, { path: '/big' });
  await notFound(table.events(t, a));
  assert.deepEqual(await table.events(t, b), { events: [] });
  await assert.rejects(new WatcherTable(silentLogger(), { watchers: 10, entries: 5 }).create(t, { path: '/big' }), (err: unknown) => err instanceof ConnectError && err.code === 'resource_exhausted');
});
