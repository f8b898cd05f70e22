// Watches over HTTP: newline-delimited JSON events ({"type", "object"}) on one chunked response,
// fed by the store's watch, with the apiserver's semantics:
// - resourceVersion absent or "0": the current objects as ADDED first (read by a list), then
//   every change after that list; sendInitialEvents=true adds the BOOKMARK annotated
//   k8s.io/initial-events-end once they are out (client-go's watch-list);
// - resourceVersion N: every change after N, or, when the store no longer keeps N, one ERROR
//   event holding a Status with reason Expired and code 410, and the end of the stream;
// - allowWatchBookmarks: a BOOKMARK with the last resourceVersion every BOOKMARK_MS, which also
//   keeps the edge's idle timer (300 s) from closing a quiet watch;
// - timeoutSeconds ends the stream (the SDK sets it; clients re-watch), capped at MAX_WATCH_MS;
// - field selectors (metadata.name/namespace) and, for a team key, its own objects only.
// A client that does not read its events is disconnected once BUFFER_LIMIT_BYTES wait for it,
// rather than held in memory; it re-watches from the last version it saw.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { KubeObject } from '../api/meta.ts';
import type { Principal } from '../auth/keyring.ts';
import { isAsbError } from '../errors.ts';
import type { Watch, WatchEvent } from '../store/store.ts';
import type { Timer } from '../base/clock.ts';
import type { WorkerContext } from '../worker/deps.ts';
import { listObjects, scopedSelector, visibleTo } from './objects.ts';
import { boolParam, intParam, matchesFields, parseFieldSelector, type ResourcePath } from './request.ts';
import { asVersion } from './resources.ts';
import { statusOf } from './status.ts';
import { toTable, type IncludeObject } from './table.ts';

// The apiserver sends a bookmark about once a minute; a shorter period costs one line per watch.
export const BOOKMARK_MS = 60_000;
// The apiserver ends watches after 30-60 minutes by default; clients re-watch from their last version.
export const MAX_WATCH_MS = 30 * 60_000;
// Far more than any burst of our objects' events (a few KiB each) a live client is behind by.
const BUFFER_LIMIT_BYTES = 8 * 1024 * 1024;

export interface WatchOptions {
  table: { include: IncludeObject } | undefined;
}

/** The open watches, so the server can end them when it closes. */
export class Watches {
  readonly #open = new Set<() => void>();

  add(stop: () => void): () => void {
    this.#open.add(stop);
    return () => this.#open.delete(stop);
  }

  get size(): number {
    return this.#open.size;
  }

  closeAll(): void {
    for (const stop of [...this.#open]) stop();
  }
}

export async function serveWatch(w: WorkerContext, p: Principal, rp: ResourcePath, query: URLSearchParams, req: IncomingMessage, res: ServerResponse, opts: WatchOptions, watches: Watches): Promise<void> {
  const rt = rp.served.rt;
  const fields = parseFieldSelector(query.get('fieldSelector'));
  const selector = scopedSelector(p, rt, query.get('labelSelector'));
  const bookmarks = boolParam(query, 'allowWatchBookmarks');
  const initialEvents = boolParam(query, 'sendInitialEvents');
  const timeoutMs = Math.min((intParam(query, 'timeoutSeconds') ?? MAX_WATCH_MS / 1000) * 1000, MAX_WATCH_MS);
  const from = query.get('resourceVersion') ?? '';
  const namespace = rp.namespace ?? (fields.namespace?.op === '=' ? fields.namespace.value : undefined);

  // The initial state is read before the response starts, so a bad selector is still a plain 400.
  let initial: KubeObject[] = [];
  let lastRv = from;
  if (from === '' || from === '0') {
    const listed = await listObjects(w, p, rp, new URLSearchParams([...query].filter(([k]) => k === 'fieldSelector' || k === 'labelSelector')));
    initial = listed.items;
    lastRv = listed.resourceVersion;
  }

  res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-cache, private', 'transfer-encoding': 'chunked' });
  res.flushHeaders();
  let headersSent = false;
  // Mutable state shared with the callbacks below.
  const live: { stopped: boolean; watch: Watch | undefined } = { stopped: false, watch: undefined };
  const timers: Timer[] = [];
  const stop = (): void => {
    if (live.stopped) return;
    live.stopped = true;
    forget();
    live.watch?.close();
    for (const t of timers) t.cancel();
    res.end();
  };
  const forget = watches.add(stop);
  req.once('close', stop);
  res.once('close', stop);

  const send = (type: string, object: unknown): void => {
    if (live.stopped) return;
    res.write(`${JSON.stringify({ type, object })}\n`);
    if (res.writableLength > BUFFER_LIMIT_BYTES) {
      w.log.warn({ kind: rt.kind, buffered: res.writableLength }, 'kubeapi: a watch client is not reading its events; disconnecting it');
      stop();
    }
  };
  const sendObject = (type: string, obj: KubeObject): void => {
    const served = asVersion(obj, rt, rp.version);
    if (opts.table === undefined) {
      send(type, served);
      return;
    }
    send(type, toTable([served], { columns: rp.served.columns, now: w.clock.now(), include: opts.table.include, noHeaders: headersSent }));
    headersSent = true;
  };
  const bookmark = (annotations?: Record<string, string>): void => {
    send('BOOKMARK', { kind: rt.kind, apiVersion: `${rp.group}/${rp.version}`, metadata: { resourceVersion: lastRv, ...(annotations === undefined ? {} : { annotations }) } });
  };

  for (const obj of initial) sendObject('ADDED', obj);
  if (initialEvents) bookmark({ 'k8s.io/initial-events-end': 'true' });

  timers.push(w.clock.after(timeoutMs, stop));
  if (bookmarks) {
    const tick = (): void => {
      if (live.stopped) return;
      bookmark();
      timers.push(w.clock.after(BOOKMARK_MS, tick));
    };
    timers.push(w.clock.after(BOOKMARK_MS, tick));
  }

  live.watch = w.store.watch(rt, { ...(namespace === undefined ? {} : { namespace }), ...(selector === undefined ? {} : { labelSelector: selector }), resourceVersion: lastRv }, {
    onEvent: (event: WatchEvent<KubeObject>) => {
      const obj = event.object;
      if (obj.metadata.resourceVersion !== undefined) lastRv = obj.metadata.resourceVersion;
      if (event.type === 'BOOKMARK') return;
      if (!visibleTo(p, rt, obj) && event.type !== 'DELETED') return;
      if (!matchesFields(fields, obj.metadata.namespace, obj.metadata.name)) return;
      sendObject(event.type, obj);
    },
    onError: (err: Error) => {
      if (isAsbError(err, 'Gone')) {
        send('ERROR', { ...statusOf(err), message: `too old resource version: ${from} (${err.message})` });
      } else {
        w.log.warn({ err, kind: rt.kind }, 'kubeapi: a watch ended');
      }
      stop();
    },
  });
  if (live.stopped) live.watch.close();
}
