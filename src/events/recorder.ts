// The lifecycle event recorder: watches Sandboxes, SandboxClaims and SandboxSnapshots in the
// store, turns each change into facts (facts.ts, a pure function of the summary it kept and the
// summary now), persists them to the event log with the new summary in one transaction, then
// writes them as Kubernetes Events and wakes the webhook sender.
//
// Level-based: on start, and after any watch ends, it lists every kind and compares each object
// with the summary it persisted, so writes made while it was down (or a kill -9 between the
// store's write and ours) still produce their facts, once. Changes are handled one at a time, in
// the order the store delivered them.
//
// Shutdown (close): stop the watches, then wait for the change in hand.
import { isDeepStrictEqual } from 'node:util';
import type { KubeObject, ResourceType } from '../api/meta.ts';
import { SandboxClaimType, SandboxSnapshotType, SandboxType, SandboxWarmPoolType } from '../api/types.ts';
import type { ObjectStore, Watch } from '../store/store.ts';
import type { Clock } from '../system/clock.ts';
import type { Logger } from '../system/log.ts';
import type { EventLog, LifecycleEvent } from './event-log.ts';
import { factsOf, summarize, type Fact, type Summary, type WatchedKind } from './facts.ts';
import type { KubeEventWriter } from './kube-events.ts';

const WATCHED: readonly { kind: WatchedKind; rt: ResourceType }[] = [
  { kind: 'Sandbox', rt: SandboxType },
  { kind: 'SandboxClaim', rt: SandboxClaimType },
  { kind: 'SandboxSnapshot', rt: SandboxSnapshotType },
];
/** A relist after a watch ended waits this long, doubling to the cap, so a sick store is not hammered. */
const RELIST_BASE_MS = 200;
const RELIST_MAX_MS = 10_000;

export interface RecorderOptions {
  store: ObjectStore;
  log: Logger;
  clock: Clock;
  events: EventLog;
  kube: KubeEventWriter;
  /** Called after team events were persisted (the webhook sender's kick). */
  onRecorded?: (events: readonly LifecycleEvent[]) => void;
}

function keyOf(kind: WatchedKind, obj: KubeObject): string {
  return `${kind}/${obj.metadata.namespace ?? ''}/${obj.metadata.name}`;
}

export class EventRecorder {
  readonly #o: RecorderOptions;
  readonly #summaries: Map<string, Summary>;
  readonly #watches: Watch[] = [];
  #queue: Promise<void> = Promise.resolve();
  #closed = false;
  #relistDelay = RELIST_BASE_MS;
  #relistTimer: ReturnType<typeof setTimeout> | undefined;
  /** Facts that could not be written as Kubernetes Events (counted, logged, not retried: Events are best-effort, as in Kubernetes). */
  kubeWriteFailures = 0;

  private constructor(opts: RecorderOptions) {
    this.#o = opts;
    this.#summaries = opts.events.summaries();
  }

  static async start(opts: RecorderOptions): Promise<EventRecorder> {
    const r = new EventRecorder(opts);
    await r.#sync();
    return r;
  }

  /** Resolves once every change delivered so far has been handled (tests, shutdown). */
  settled(): Promise<void> {
    return this.#queue;
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#relistTimer !== undefined) clearTimeout(this.#relistTimer);
    for (const w of this.#watches.splice(0)) w.close();
    await this.#queue;
  }

  /** Lists every kind, reconciles it against the summaries, and watches from the list. */
  async #sync(): Promise<void> {
    for (const w of this.#watches.splice(0)) w.close();
    for (const { kind, rt } of WATCHED) {
      const listed = await this.#o.store.list(rt);
      const present = new Set<string>();
      for (const obj of listed.items) {
        present.add(keyOf(kind, obj));
        this.#enqueue(kind, keyOf(kind, obj), obj);
      }
      for (const key of [...this.#summaries.keys()]) {
        if (key.startsWith(`${kind}/`) && !present.has(key)) this.#enqueue(kind, key, undefined);
      }
      this.#watches.push(this.#o.store.watch(rt, { resourceVersion: listed.resourceVersion }, {
        onEvent: (ev) => {
          if (ev.type === 'BOOKMARK') return;
          this.#enqueue(kind, keyOf(kind, ev.object), ev.type === 'DELETED' ? undefined : ev.object);
        },
        onError: (err) => this.#relist(err),
      }));
    }
    await this.#queue;
    this.#relistDelay = RELIST_BASE_MS;
  }

  #relist(err: Error): void {
    if (this.#closed || this.#relistTimer !== undefined) return;
    this.#o.log.warn({ err }, 'events: a watch ended; relisting');
    const delay = this.#relistDelay;
    this.#relistDelay = Math.min(delay * 2, RELIST_MAX_MS);
    this.#relistTimer = setTimeout(() => {
      this.#relistTimer = undefined;
      if (this.#closed) return;
      this.#sync().catch((e: unknown) => this.#relist(e instanceof Error ? e : new Error(String(e))));
    }, delay);
  }

  #enqueue(kind: WatchedKind, key: string, obj: KubeObject | undefined): void {
    this.#queue = this.#queue.then(() => this.#handle(kind, key, obj)).catch((err: unknown) => {
      this.#o.log.error({ err, key }, 'events: a change could not be recorded');
    });
  }

  async #handle(kind: WatchedKind, key: string, obj: KubeObject | undefined): Promise<void> {
    if (this.#closed) return;
    const before = this.#summaries.get(key);
    const after = obj === undefined ? undefined : summarize(kind, obj);
    if (isDeepStrictEqual(before, after)) return;
    const [, namespace = '', name = ''] = key.split('/');
    const subject = { kind, namespace, name };
    const lookup = (n: string): Summary | undefined => this.#summaries.get(`Sandbox/${namespace}/${n}`);
    // A new object under an old name (deleted and made again while we were away): the old one is gone first.
    const facts: Fact[] = before !== undefined && after !== undefined && before.uid !== after.uid
      ? [...factsOf(subject, before, undefined, lookup), ...factsOf(subject, undefined, after, lookup)]
      : factsOf(subject, before, after, lookup);
    const written = this.#o.events.record(key, after, facts);
    if (after === undefined) this.#summaries.delete(key);
    else this.#summaries.set(key, after);
    for (const fact of facts) await this.#kubeEvent(fact);
    if (written.length > 0) this.#o.onRecorded?.(written);
  }

  async #kubeEvent(fact: Fact): Promise<void> {
    try {
      let f = fact;
      if (f.involved.uid === '' && f.involved.kind === SandboxWarmPoolType.kind) {
        const pool = await this.#o.store.tryGet(SandboxWarmPoolType, f.involved.namespace, f.involved.name);
        f = { ...f, involved: { ...f.involved, uid: pool?.metadata.uid ?? '', apiVersion: pool?.apiVersion ?? f.involved.apiVersion } };
      }
      await this.#o.kube.write(f);
    } catch (err) {
      this.kubeWriteFailures++;
      this.#o.log.warn({ err, reason: fact.reason, object: fact.involved.name }, 'events: a Kubernetes Event could not be written');
    }
  }
}
