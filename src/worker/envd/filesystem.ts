// filesystem.Filesystem: Stat, ListDir, MakeDir, Move, Remove (unary) and WatchDir (stream).
//
// WatchDir polls: envd inside a sandbox uses inotify, but from outside the sandbox we would need
// an inotify instance inside its mount namespace (a helper process per watch). Listing the
// directory every 200 ms through the runtime (~4 ms of nsenter + find per poll) and diffing the
// listings gives the same events a little later: CREATE for new paths, REMOVE for gone ones,
// WRITE when size or mtime changed, CHMOD when only the mode did. A rename shows as REMOVE of the
// old name and CREATE of the new one; changes that cancel out within one poll are not seen.
//
// The Python SDK's sync watch_dir uses the polled watcher RPCs instead (watchers.ts), built on the
// same snapshots and diff.
import { posix } from 'node:path';
import { AsbError } from '../../errors.ts';
import { isUploadTemp } from '../../runtime/file-upload.ts';
import { ConnectError, record, type ServerStream } from './connect.ts';
import { listDir, makeDir, move, remove, stat, type EntryInfo, type FsTarget } from './entries.ts';
import { userPath } from './paths.ts';

export const WATCH_POLL_MS = 200;
/** Recursive watches stop at this depth, so a watch of / cannot list the whole disk every poll. */
const WATCH_MAX_DEPTH = 32;

function depthOf(value: unknown): number {
  if (value === undefined || value === null || value === 0) return 1;
  const n = typeof value === 'string' ? Number(value) : value;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > 4096) throw new AsbError('BadRequest', `depth must be a whole number, got ${JSON.stringify(value)}`);
  return n;
}

export type UnaryMethod = (t: FsTarget, msg: unknown) => Promise<unknown>;

/** A request's path for its user: absolute as it is, relative and ~ from the user's home (paths.ts). */
function pathIn(t: FsTarget, value: unknown, field = 'path'): Promise<string> {
  return userPath(t.home, value, field);
}

export const FILESYSTEM_UNARY: Readonly<Record<string, UnaryMethod>> = {
  Stat: async (t, msg) => ({ entry: await stat(t, await pathIn(t, record(msg).path)) }),
  ListDir: async (t, msg) => {
    const m = record(msg);
    return { entries: await listDir(t, await pathIn(t, m.path), depthOf(m.depth)) };
  },
  MakeDir: async (t, msg) => ({ entry: await makeDir(t, await pathIn(t, record(msg).path)) }),
  Move: async (t, msg) => {
    const m = record(msg);
    return { entry: await move(t, await pathIn(t, m.source, 'source'), await pathIn(t, m.destination, 'destination')) };
  },
  Remove: async (t, msg) => {
    await remove(t, await pathIn(t, record(msg).path));
    return {};
  },
};

type EventType = 'EVENT_TYPE_CREATE' | 'EVENT_TYPE_WRITE' | 'EVENT_TYPE_REMOVE' | 'EVENT_TYPE_CHMOD';

/** filesystem.FilesystemEvent in its JSON form; name is relative to the watched directory. */
export interface FilesystemEvent {
  name: string;
  type: EventType;
  entry?: EntryInfo;
}

/** What a watch (WatchDir or CreateWatcher) looks at: its request's path, recursive and includeEntry. */
export interface WatchSpec {
  root: string;
  depth: number;
  includeEntry: boolean;
}

export async function watchSpecOf(t: FsTarget, msg: unknown): Promise<WatchSpec> {
  const m = record(msg);
  return { root: await pathIn(t, m.path), depth: m.recursive === true ? WATCH_MAX_DEPTH : 1, includeEntry: m.includeEntry === true };
}

export type WatchSnapshot = ReadonlyMap<string, EntryInfo>;

/** The watched tree now; a removed watched directory is envd's not_found. */
export async function watchSnapshot(t: FsTarget, spec: WatchSpec): Promise<WatchSnapshot> {
  try {
    return new Map((await listDir(t, spec.root, spec.depth)).map((e) => [e.path, e]));
  } catch (err) {
    if (err instanceof AsbError && err.code === 'NotFound') throw new ConnectError('not_found', `the watched directory ${spec.root} was removed`);
    throw err;
  }
}

/** The events that turn one snapshot into the next. */
export function watchEvents(spec: WatchSpec, before: WatchSnapshot, after: WatchSnapshot): FilesystemEvent[] {
  return changes(before, after).map((c) => {
    const event: FilesystemEvent = { name: posix.relative(spec.root, c.path), type: c.type };
    if (spec.includeEntry && c.entry !== undefined) event.entry = c.entry;
    return event;
  });
}

function changes(before: WatchSnapshot, after: WatchSnapshot): { path: string; type: EventType; entry: EntryInfo | undefined }[] {
  const out: { path: string; type: EventType; entry: EntryInfo | undefined }[] = [];
  for (const [path, entry] of after) {
    const old = before.get(path);
    if (old === undefined) out.push({ path, type: 'EVENT_TYPE_CREATE', entry });
    else if (old.size !== entry.size || old.modifiedTime !== entry.modifiedTime) out.push({ path, type: 'EVENT_TYPE_WRITE', entry });
    else if (old.mode !== entry.mode) out.push({ path, type: 'EVENT_TYPE_CHMOD', entry });
  }
  for (const path of before.keys()) if (!after.has(path)) out.push({ path, type: 'EVENT_TYPE_REMOVE', entry: undefined });
  // A directory's mtime changes with every entry made in it: its own WRITE would only be noise next to the entry's CREATE.
  // An upload in flight is a temporary file renamed over its target at the end (file-upload.ts):
  // the target's CREATE or WRITE is the event; the temporary file's own would only be noise.
  return out.filter((c) => !(c.type === 'EVENT_TYPE_WRITE' && c.entry?.type === 'FILE_TYPE_DIRECTORY') && !isUploadTemp(c.path));
}

/** Runs a watch until the stream closes; the first message is `{start:{}}`. */
export async function watchDir(t: FsTarget, msg: unknown, stream: ServerStream, sleep: (ms: number) => Promise<void>): Promise<void> {
  const spec = await watchSpecOf(t, msg);
  let last = await watchSnapshot(t, spec);
  stream.send({ start: {} });
  while (!stream.ended) {
    await sleep(WATCH_POLL_MS);
    const next = await watchSnapshot(t, spec);
    for (const event of watchEvents(spec, last, next)) stream.send({ filesystem: event });
    last = next;
  }
}
