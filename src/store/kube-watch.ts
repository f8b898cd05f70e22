// One watch on the apiserver, supervised here: the HTTP stream breaks (apiserver restart, a
// load balancer's idle timeout, the server's own timeoutSeconds) and is reopened from the last
// resourceVersion seen, so the caller sees one unbroken stream. Bookmarks move that resume point
// without an object change. Only what reconnecting cannot fix reaches onError: 410 Gone (the
// resume point was compacted away: the caller must relist), a refusal (400, 403, 404), or a
// server that stays unreachable through the whole backoff budget.
import type { KubeObject, ResourceType } from '../api/meta.ts';
import { AsbError } from '../errors.ts';
import type { Clock, Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { deepFreeze } from './frozen.ts';
import { asStatus, kubeError } from './kube-errors.ts';
import type { KubeHttp, Stream } from './kube-http.ts';
import type { Watch, WatchEventType, WatchHandlers } from './store.ts';

// Reconnect backoff: 50 ms doubling to 5 s. Ten failures in a row (~21 s of an unreachable
// server) end the watch with Unavailable: callers relist, and an informer reports unhealthy.
const BACKOFF_BASE_MS = 50;
const BACKOFF_MAX_MS = 5_000;
const MAX_FAILURES = 10;
// The server ends each watch after timeoutSeconds (we pick 5-6 min, spread so watches opened
// together do not all reconnect together); a stream still open 30 s past that is a dead
// connection nobody told us about, so we drop it.
const SERVER_TIMEOUT_MIN_S = 300;
const SERVER_TIMEOUT_SPREAD_S = 60;
const STALL_GRACE_MS = 30_000;

export interface KubeWatchOptions<T extends KubeObject> {
  http: KubeHttp;
  rt: ResourceType;
  /** The collection path (namespaced or cluster-wide), without a query. */
  path: string;
  labelSelector: string | undefined;
  /** Deliver changes after this version. */
  from: string;
  handlers: WatchHandlers<T>;
  /** Turns a received object into what handlers see (apiVersion/kind filled, managedFields dropped). */
  normalize: (obj: KubeObject) => KubeObject;
  clock: Clock;
  log: Logger;
  /** Called once when the watch stops, so the store forgets it. */
  onStop: (w: KubeWatch<T>) => void;
}

interface WireEvent {
  type?: string;
  object?: unknown;
}

const DELIVERED: ReadonlySet<string> = new Set<WatchEventType>(['ADDED', 'MODIFIED', 'DELETED']);

export class KubeWatch<T extends KubeObject> implements Watch {
  #opts: KubeWatchOptions<T>;
  #log: Logger;
  /** The resume point: the last version delivered or bookmarked. */
  #rv: string;
  #stream: Stream | undefined;
  #timer: Timer | undefined;
  #failures = 0;
  /** Streams in a row the server ended without sending anything. */
  #quietEnds = 0;
  #stopped = false;

  constructor(opts: KubeWatchOptions<T>) {
    this.#opts = opts;
    this.#rv = opts.from;
    this.#log = opts.log.child({ watch: opts.rt.kind });
  }

  /** Sets where the stream starts, when the caller found out only after construction. */
  setStart(rv: string): void {
    this.#rv = rv;
  }

  start(): void {
    this.#connect();
  }

  #connect(): void {
    if (this.#stopped) return;
    const timeoutSeconds = SERVER_TIMEOUT_MIN_S + Math.floor(Math.random() * SERVER_TIMEOUT_SPREAD_S);
    const query = new URLSearchParams({ watch: '1', allowWatchBookmarks: 'true', resourceVersion: this.#rv, timeoutSeconds: String(timeoutSeconds) });
    if (this.#opts.labelSelector !== undefined && this.#opts.labelSelector !== '') query.set('labelSelector', this.#opts.labelSelector);
    let status = 0;
    let lines = 0;
    const stream = this.#opts.http.stream(`${this.#opts.path}?${query.toString()}`, {
      onResponse: (s) => {
        status = s;
      },
      onLine: (line) => {
        lines++;
        this.#line(line);
      },
      onEnd: (err, errorBody) => {
        if (this.#stream !== stream) return;
        this.#stream = undefined;
        this.#timer?.cancel();
        if (err !== undefined) this.#retry(err);
        else if (status === 200) this.#reopen(lines > 0);
        else this.#refused(status, errorBody);
      },
    });
    this.#stream = stream;
    this.#timer = this.#opts.clock.after(timeoutSeconds * 1000 + STALL_GRACE_MS, () => {
      if (this.#stream !== stream) return;
      this.#log.warn({ resourceVersion: this.#rv }, 'watch stream silent past its timeout; reconnecting');
      stream.abort();
      this.#stream = undefined;
      this.#reopen(false);
    });
  }

  /**
   * The server ended the stream normally (its timeoutSeconds): resume at once. A stream that
   * ended without a single line resumes after a backoff, so a server that closes every watch
   * at once is not asked again in a tight loop; being quiet is no failure, so it never ends
   * the watch.
   */
  #reopen(heardSomething: boolean): void {
    this.#failures = 0;
    if (heardSomething) {
      this.#quietEnds = 0;
      this.#connect();
      return;
    }
    const delay = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** Math.min(this.#quietEnds, 20));
    this.#quietEnds++;
    this.#timer = this.#opts.clock.after(delay, () => this.#connect());
  }

  #retry(err: Error): void {
    if (this.#stopped) return;
    this.#failures += 1;
    if (this.#failures > MAX_FAILURES) {
      this.end(new AsbError('Unavailable', `watch on ${this.#opts.rt.kind} lost: ${MAX_FAILURES} reconnects failed; last: ${err.message}`, { cause: err }));
      return;
    }
    const delay = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** (this.#failures - 1));
    this.#log.warn({ err, delay, resourceVersion: this.#rv, failures: this.#failures }, 'watch stream broke; reconnecting');
    this.#timer = this.#opts.clock.after(delay, () => this.#connect());
  }

  /** The server answered the watch request with an error status. */
  #refused(status: number, body: unknown): void {
    const err = status === 410 ? this.#gone(body) : kubeError({ rt: this.#opts.rt, namespace: '', name: '' }, status, body);
    // 429 and 5xx pass (an apiserver starting up answers 503 for a while), and 401 once the
    // credentials are read again (kube-http.ts does on a 401); the rest will not.
    if (status === 401 || status === 429 || status >= 500) this.#retry(err);
    else this.end(err);
  }

  #gone(body: unknown): AsbError {
    const detail = asStatus(body).message ?? 'too old resource version';
    return new AsbError('Gone', `watch on ${this.#opts.rt.kind} from resourceVersion ${this.#rv}: ${detail}; list again and watch from the list's resourceVersion`);
  }

  #line(line: string): void {
    if (this.#stopped) return;
    let ev: WireEvent;
    try {
      ev = JSON.parse(line) as WireEvent;
    } catch (err) {
      // A stream we cannot read has lost events: drop it and resume from the last good version.
      this.#dropStream(new AsbError('Internal', `watch on ${this.#opts.rt.kind}: unreadable event: ${line.slice(0, 200)}`, { cause: err }));
      return;
    }
    const type = ev.type ?? '';
    if (type === 'ERROR') {
      const status = asStatus(ev.object);
      if (status.code === 410) {
        this.end(this.#gone(status));
        return;
      }
      this.#dropStream(kubeError({ rt: this.#opts.rt, namespace: '', name: '' }, status.code ?? 500, status));
      return;
    }
    const obj = ev.object as KubeObject | undefined;
    const rv = obj?.metadata.resourceVersion;
    if (obj === undefined || rv === undefined) return;
    this.#rv = rv;
    this.#failures = 0;
    if (!DELIVERED.has(type)) return; // BOOKMARK: only the resume point moves
    try {
      this.#opts.handlers.onEvent({ type: type as WatchEventType, object: deepFreeze(this.#opts.normalize(obj)) as T });
    } catch (err) {
      this.#log.error({ err, resourceVersion: rv }, 'watch handler threw; ending the watch');
      this.end(err instanceof Error ? err : new Error(String(err)));
    }
  }

  #dropStream(err: Error): void {
    this.#stream?.abort();
    this.#stream = undefined;
    this.#timer?.cancel();
    this.#retry(err);
  }

  /** Stops the watch and tells the handler why. */
  end(err: Error): void {
    if (this.#stopped) return;
    this.close();
    try {
      this.#opts.handlers.onError(err);
    } catch (handlerErr) {
      this.#log.error({ err: handlerErr }, 'watch onError handler threw');
    }
  }

  close(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    this.#timer?.cancel();
    this.#stream?.abort();
    this.#stream = undefined;
    this.#opts.onStop(this);
  }
}
