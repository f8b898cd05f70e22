// The lifecycle event recorder: watches Sandboxes, SandboxClaims and SandboxSnapshots in the
// store, turns each change into facts (facts.ts, a pure function of the summary it kept and the
// summary now), persists them to the event log with the new summary in one transaction, then
// writes them as Kubernetes Events and wakes the webhook sender.
//
// Level-based: on start, and after any watch ends, it lists every kind and compares each object
// with the summary it persisted, so writes made while it was down (or a kill -9 between the
// store's write and ours) still produce their facts, once. Changes are handled one at a time, in
// the order the store delivered them, in batches: every change the store delivered by the time a
// batch starts is persisted in one transaction (one fsync for a burst of claims).
//
// Shutdown (close): stop the watches, then wait for the change in hand.
import { isDeepStrictEqual } from 'node:util';
import type { KubeObject, ResourceType } from '../api/meta.ts';
import { SandboxClaimType, SandboxSnapshotType, SandboxType, SandboxWarmPoolType } from '../api/types.ts';
import type { ObjectStore, Watch } from '../store/store.ts';
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
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
/** How long a change waits to be recorded with the others of its burst. */
const RECORD_DELAY_MS = 20;
/** How long Kubernetes Event writes wait after the change that made them, so they join no claim burst's commits. */
const KUBE_WRITE_DELAY_MS = 100;
/** Kubernetes Event writes per round: a burst's in one group commit, and an API server not flooded. */
const KUBE_WRITES_AT_ONCE = 64;

export interface RecorderOptions {
  store: ObjectStore;
  log: Logger;
  clock: Clock;
  events: EventLog;
  kube: KubeEventWriter;
  /** Called after team events were persisted (the webhook sender's kick). */
  onRecorded?: (events: readonly LifecycleEvent[]) => void;
  /** Called after each Kubernetes Event write, with whether it was written. */
  onKubeEvent?: (ok: boolean) => void;
}

function keyOf(kind: WatchedKind, obj: KubeObject): string {
  return `${kind}/${obj.metadata.namespace ?? ''}/${obj.metadata.name}`;
}

export class EventRecorder {
  readonly #o: RecorderOptions;
  readonly #summaries: Map<string, Summary>;
  readonly #watches: Watch[] = [];
  #pending: { kind: WatchedKind; key: string; obj: KubeObject | undefined }[] = [];
  #draining: Promise<void> | undefined;
  /** Kubernetes Event writes, in order, apart from the log's batches: a slow API server never holds the log back. */
  #kubeQueue: Promise<void> = Promise.resolve();
  #kubeArmed = false;
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
    // Facts a kill -9 left unwritten as Kubernetes Events.
    r.#flushKube();
    return r;
  }

  /** Resolves once every change delivered so far has been handled (tests, shutdown). */
  async settled(): Promise<void> {
    while (this.#draining !== undefined) await this.#draining;
    await this.#kubeQueue;
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#relistTimer !== undefined) clearTimeout(this.#relistTimer);
    for (const w of this.#watches.splice(0)) w.close();
    await this.settled();
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
    await this.settled();
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
    this.#pending.push({ kind, key, obj });
    this.#schedule();
  }

  /**
   * Drains a moment later: a burst's store flushes (several, each with many changes) become one
   * batch and one transaction, written after the burst's own work rather than between its claims.
   */
  #schedule(): void {
    if (this.#draining !== undefined || this.#closed) return;
    this.#draining = new Promise<void>((resolve) => setTimeout(resolve, RECORD_DELAY_MS)).then(() => {
      this.#drain();
    }).finally(() => {
      this.#draining = undefined;
      if (this.#pending.length > 0) this.#schedule();
    });
  }

  #drain(): void {
    while (this.#pending.length > 0 && !this.#closed) {
      const batch = this.#pending.splice(0);
      try {
        this.#handle(batch);
      } catch (err) {
        // Nothing of the batch was persisted (one transaction) and the summaries are as they
        // were: a relist compares every object again and tells what this batch would have.
        this.#o.log.error({ err, changes: batch.length }, 'events: changes could not be recorded');
        this.#relist(err instanceof Error ? err : new Error(String(err)));
        return;
      }
    }
  }

  #handle(batch: readonly { kind: WatchedKind; key: string; obj: KubeObject | undefined }[]): void {
    const changes: { key: string; summary: Summary | undefined; facts: Fact[] }[] = [];
    const next = new Map<string, Summary | undefined>();
    const current = (key: string): Summary | undefined => (next.has(key) ? next.get(key) : this.#summaries.get(key));
    for (const { kind, key, obj } of batch) {
      const before = current(key);
      const after = obj === undefined ? undefined : summarize(kind, obj);
      if (isDeepStrictEqual(before, after)) continue;
      const [, namespace = '', name = ''] = key.split('/');
      const subject = { kind, namespace, name };
      const lookup = (n: string): Summary | undefined => current(`Sandbox/${namespace}/${n}`);
      // A new object under an old name (deleted and made again while we were away): the old one is gone first.
      const facts: Fact[] = before !== undefined && after !== undefined && before.uid !== after.uid
        ? [...factsOf(subject, before, undefined, lookup), ...factsOf(subject, undefined, after, lookup)]
        : factsOf(subject, before, after, lookup);
      changes.push({ key, summary: after, facts });
      next.set(key, after);
    }
    if (changes.length === 0) return;
    // Persisted before anything is told: a kill -9 from here on loses nothing acknowledged.
    const written = this.#o.events.recordAll(changes);
    for (const [key, summary] of next) {
      if (summary === undefined) this.#summaries.delete(key);
      else this.#summaries.set(key, summary);
    }
    if (written.length > 0) this.#o.onRecorded?.(written);
    this.#flushKube();
  }

  /**
   * Writes the facts waiting in the log's outbox as Kubernetes Events, a moment after the change
   * that made them (Events are for people; this keeps them out of a burst of claims' commits).
   * A batch is written together, so the embedded store commits it in one group commit; facts that
   * land on one Event (same object, reason and message) are written one after another, as they
   * aggregate. A write that fails is counted and given up on: Events are best-effort, as in
   * Kubernetes; the log and the webhooks have the fact.
   */
  #flushKube(): void {
    // A flush that has not started yet takes these facts too.
    if (this.#kubeArmed) return;
    this.#kubeArmed = true;
    this.#kubeQueue = this.#kubeQueue.then(async () => {
      await new Promise((resolve) => setTimeout(resolve, KUBE_WRITE_DELAY_MS));
      this.#kubeArmed = false;
      for (let round = 0; round < 1000 && !this.#closed; round++) {
        const pending = this.#o.events.kubePending(KUBE_WRITES_AT_ONCE);
        if (pending.length === 0) return;
        const groups = new Map<string, Fact[]>();
        for (const { fact } of pending) {
          const key = `${fact.involved.kind}/${fact.involved.namespace}/${fact.involved.name}/${fact.reason}/${fact.message}`;
          groups.set(key, [...(groups.get(key) ?? []), fact]);
        }
        await Promise.all([...groups.values()].map(async (group) => {
          for (const fact of group) await this.#kubeEvent(fact);
        }));
        this.#o.events.kubeDone(pending.map((p) => p.seq));
      }
    }).catch((err: unknown) => {
      this.#o.log.error({ err }, 'events: the Kubernetes Event outbox could not be read');
    });
  }

  async #kubeEvent(fact: Fact): Promise<void> {
    try {
      let f = fact;
      if (f.involved.uid === '' && f.involved.kind === SandboxWarmPoolType.kind) {
        const pool = await this.#o.store.tryGet(SandboxWarmPoolType, f.involved.namespace, f.involved.name);
        f = { ...f, involved: { ...f.involved, uid: pool?.metadata.uid ?? '', apiVersion: pool?.apiVersion ?? f.involved.apiVersion } };
      }
      await this.#o.kube.write(f);
      this.#o.onKubeEvent?.(true);
    } catch (err) {
      this.kubeWriteFailures++;
      this.#o.onKubeEvent?.(false);
      this.#o.log.warn({ err, reason: fact.reason, object: fact.involved.name }, 'events: a Kubernetes Event could not be written');
    }
  }
}
