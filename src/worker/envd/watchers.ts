// filesystem.Filesystem CreateWatcher / GetWatcherEvents / RemoveWatcher: the polled form of
// WatchDir, which the Python SDK's sync `files.watch_dir` uses (its WatchHandle calls
// get_new_events() when the user asks; the JS SDK and Python's AsyncSandbox stream WatchDir).
//
// envd keeps an inotify watch per watcher and hands out the events gathered since the last call.
// Here nothing runs between calls: a watcher holds the listing it last saw, and GetWatcherEvents
// lists again and answers with the difference (filesystem.ts), so it reports the net change
// since the last call: a file made and written in between is one CREATE, one made and removed
// in between is nothing. No poll loop means a watcher its client never removes costs memory only,
// and that is bounded: past MAX_WATCHERS watchers or MAX_WATCHED_ENTRIES listed entries in all,
// the least recently used watchers are dropped (their next call gets not_found, as for an id
// envd does not know).
import { randomUUID } from 'node:crypto';
import type { Logger } from '../../base/log.ts';
import { isPlainObject } from '../../http/body.ts';
import { ConnectError } from './connect.ts';
import type { FsTarget } from './entries.ts';
import { watchEvents, watchSnapshot, watchSpecOf, type FilesystemEvent, type WatchSnapshot, type WatchSpec } from './filesystem.ts';

/** Per worker. */
export const MAX_WATCHERS = 256;
/** Per worker: an EntryInfo held in a listing is ~0.5 KB, so ~100 MB at most. */
export const MAX_WATCHED_ENTRIES = 200_000;

interface Watcher {
  /** The sandbox it watches in: another sandbox's token cannot read it. */
  sandboxId: string;
  target: FsTarget;
  spec: WatchSpec;
  last: WatchSnapshot;
  /** Calls on one watcher run one at a time, so two concurrent polls cannot report the same change twice. */
  queue: Promise<unknown>;
}

function watcherIdOf(msg: unknown): string {
  const id = isPlainObject(msg) ? msg.watcherId : undefined;
  if (typeof id !== 'string' || id === '') throw new ConnectError('invalid_argument', 'watcherId is required: the id CreateWatcher returned');
  return id;
}

export class WatcherTable {
  /** In order of last use: the first one is the one to drop. */
  readonly #watchers = new Map<string, Watcher>();
  readonly #log: Logger;
  readonly #limits: { watchers: number; entries: number };
  #entries = 0;
  #dropped = 0;

  constructor(log: Logger, limits = { watchers: MAX_WATCHERS, entries: MAX_WATCHED_ENTRIES }) {
    this.#log = log;
    this.#limits = limits;
  }

  /** Watchers dropped to stay under the limit since start. */
  get dropped(): number {
    return this.#dropped;
  }

  async create(t: FsTarget, msg: unknown): Promise<{ watcherId: string }> {
    const spec = await watchSpecOf(t, msg);
    const last = await watchSnapshot(t, spec);
    if (last.size > this.#limits.entries) throw new ConnectError('resource_exhausted', `${spec.root} holds ${last.size} entries; a watcher can hold at most ${this.#limits.entries}`);
    const watcherId = randomUUID();
    this.#watchers.set(watcherId, { sandboxId: t.id, target: t, spec, last, queue: Promise.resolve() });
    this.#entries += last.size;
    this.#trim();
    return { watcherId };
  }

  async events(t: FsTarget, msg: unknown): Promise<{ events: FilesystemEvent[] }> {
    const [id, w] = this.#find(t, msg);
    // Most recently used goes last.
    this.#watchers.delete(id);
    this.#watchers.set(id, w);
    const run = w.queue.then(async () => {
      const next = await watchSnapshot(w.target, w.spec);
      const events = watchEvents(w.spec, w.last, next);
      if (this.#watchers.get(id) === w) {
        this.#entries += next.size - w.last.size;
        w.last = next;
        this.#trim();
      }
      return { events };
    });
    w.queue = run.catch(() => undefined);
    return run;
  }

  remove(t: FsTarget, msg: unknown): Record<string, never> {
    const [id, w] = this.#find(t, msg);
    this.#watchers.delete(id);
    this.#entries -= w.last.size;
    return {};
  }

  /** Drops least recently used watchers until both limits hold (the newest one always stays). */
  #trim(): void {
    for (const [id, w] of this.#watchers) {
      if (this.#watchers.size <= 1 || (this.#watchers.size <= this.#limits.watchers && this.#entries <= this.#limits.entries)) break;
      this.#watchers.delete(id);
      this.#entries -= w.last.size;
      this.#dropped += 1;
      this.#log.warn({ watcherId: id, sandbox: w.sandboxId, watchers: this.#watchers.size, entries: this.#entries, dropped: this.#dropped }, 'envd watcher dropped: this worker holds too many watchers or watched entries');
    }
  }

  #find(t: FsTarget, msg: unknown): [string, Watcher] {
    const id = watcherIdOf(msg);
    const w = this.#watchers.get(id);
    if (w === undefined || w.sandboxId !== t.id) throw new ConnectError('not_found', `watcher ${id} not found in sandbox ${t.id}`);
    return [id, w];
  }
}
