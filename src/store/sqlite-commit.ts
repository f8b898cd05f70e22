// Group commit for the embedded store (sqlite.ts): how its writes become durable.
//
// A write call only enqueues; a flush scheduled with setImmediate decides every queued write in
// order against the state the writes before it left (so 50 compare-and-swaps from one version give
// one winner and 49 Conflicts) and hands all of them to the writer thread (sqlite-writer.ts), which
// persists them in ONE transaction (one fsync of the WAL, synchronous=FULL). Only after COMMIT
// returns does this thread update the memory, deliver watch events and settle the promises.
// Several batches may be in flight: while one commits, the writes that arrived meanwhile are
// decided against the state it will leave and posted behind it, and the writer commits everything
// queued in its next transaction the moment the last one is durable, instead of waiting a round
// trip for this thread (a lone claim's 2-6 ms fsync held the other 63 of a burst that long).
// Nothing is acknowledged before it is durable, so kill -9 at any moment loses no acknowledged
// write. If COMMIT fails, every write in its transaction, and in the batches decided behind them,
// is rejected and memory is untouched.
//
// Watch handlers run synchronously inside the flush, in commit order, before the writers'
// promises resolve: a writer that awaits its write finds its own event already delivered.
import { channel } from 'node:diagnostics_channel';
import { Worker } from 'node:worker_threads';
import type { KubeObject, ResourceType } from '../api/meta.ts';
import { AsbError } from '../errors.ts';
import type { Metrics } from '../metrics/metrics.ts';
import { isoNow, type Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { deepFreeze } from './frozen.ts';
import { objectKey } from './list-page.ts';
import { decide, type Decision, type WriteOp, type WriteRequest } from './mutation.ts';
import type { StoredEvent } from './watch-stream.ts';
import type { WriterBatch, WriterData, WriterReply, WriterRow } from './sqlite-writer.ts';

/**
 * Probes (bench/claim-probe.ts) subscribe here to see each group commit: publishing costs
 * nothing while nobody listens.
 */
export const commitChannel = channel('asb:store:commit');

/** What commitChannel carries per batch; times are performance.now() values. */
export interface CommitReport {
  writes: number;
  changes: number;
  flushedAt: number;
  postedAt: number;
  committedAt: number;
  publishedAt: number;
  ok: boolean;
  /** The writer thread's time for the rows and the COMMIT of the transaction that held this batch. */
  rowsMs?: number;
  commitMs?: number;
}

// One transaction holds at most this many writes, so a burst cannot stall the event loop for
// long in one synchronous flush; the rest go in the next flush, one setImmediate later.
const MAX_BATCH = 1024;
// Batches decided and not yet acknowledged. The writer commits the ones queued behind a COMMIT
// together, so more in flight does not mean more fsyncs; the bound keeps a stalled disk from
// piling up decided-but-unacknowledged state.
const MAX_IN_FLIGHT = 4;

interface PendingWrite {
  rt: ResourceType;
  req: WriteRequest;
  startedAt: number;
  resolve: (obj: KubeObject) => void;
  reject: (err: Error) => void;
}

/** `json`: the committed object as the writer thread stores it, when the write changed it. */
type Outcome = { ok: true; object: KubeObject; json?: string } | { ok: false; err: AsbError };

/** One kind's committed objects: what the store's reads answer from. */
export interface KindState {
  objects: Map<string, KubeObject>;
  /** Keys in list order; rebuilt lazily after a create or delete. */
  sorted: string[] | undefined;
}

interface StagedEvent {
  gk: string;
  ev: StoredEvent;
  name: string;
  json: string;
}

/** Kind → object key → the object a decided write leaves (null: deleted). */
type Staged = Map<string, Map<string, KubeObject | null>>;

/** Writes decided together and committed in one transaction (none if they changed nothing). */
interface Batch {
  id: number;
  writes: PendingWrite[];
  outcomes: Outcome[];
  events: StagedEvent[];
  staged: Staged;
  /** The last resourceVersion once this batch is committed. */
  rv: number;
  flushedAt: number;
  postedAt: number;
}

export function kindKey(rt: ResourceType): string {
  return `${rt.group}/${rt.kind}`;
}

export function toAsbError(err: unknown): AsbError {
  if (err instanceof AsbError) return err;
  return new AsbError('Internal', `store: unexpected failure: ${String(err)}`, { cause: err });
}

// Durations for metrics only; behaviour never depends on them, so they need no injected clock.
function monotonicMs(): number {
  return performance.now();
}

/** The kind's state in `kinds`, made empty when the kind has none yet. */
export function kindOf(kinds: Map<string, KindState>, gk: string): KindState {
  let state = kinds.get(gk);
  if (state === undefined) {
    state = { objects: new Map(), sorted: undefined };
    kinds.set(gk, state);
  }
  return state;
}

export interface GroupCommitOptions {
  /** The database file; the writer thread opens its own connection to it. */
  path: string;
  /** The committed objects the store reads from: changed here only once a batch is durable. */
  kinds: Map<string, KindState>;
  /** The last resourceVersion committed. */
  rv: number;
  /** The oldest event kept (a watch can resume from the version before it). */
  oldestEvent: number;
  /** Events kept for watch resumption. */
  retention: number;
  clock: Clock;
  metrics: Metrics | undefined;
  log: Logger;
  /** Delivers a committed change to the kind's watches, in commit order, before its writer's promise settles. */
  publish: (gk: string, ev: StoredEvent) => void;
}

/** The store's writes: queued, decided in batches and committed by the writer thread. */
export class GroupCommit {
  readonly #kinds: Map<string, KindState>;
  readonly #clock: Clock;
  readonly #metrics: Metrics | undefined;
  readonly #log: Logger;
  readonly #retention: number;
  readonly #publish: (gk: string, ev: StoredEvent) => void;
  #queue: PendingWrite[] = [];
  #flushScheduled = false;
  #writer: Worker;
  /** Batches decided and not yet acknowledged, in commit order (at most MAX_IN_FLIGHT). */
  #inFlight: Batch[] = [];
  #nextBatchId = 1;
  /** Sent with every batch; moved on after a failed commit (see sqlite-writer.ts). */
  #epoch = 0;
  /** Resolves finish()'s wait for a batch in flight. */
  #drained: (() => void) | undefined;
  #closed = false;
  /** Set when the writer thread died: every later write fails. */
  #broken: AsbError | undefined;
  /** The last resourceVersion handed out (and committed). */
  #rv: number;
  /** The oldest version a watch can resume from is #oldestEvent - 1. */
  #oldestEvent: number;

  constructor(opts: GroupCommitOptions) {
    this.#kinds = opts.kinds;
    this.#clock = opts.clock;
    this.#metrics = opts.metrics;
    this.#log = opts.log;
    this.#retention = opts.retention;
    this.#publish = opts.publish;
    this.#rv = opts.rv;
    this.#oldestEvent = opts.oldestEvent;
    const data: WriterData = { path: opts.path };
    const writer = new Worker(new URL('./sqlite-writer.ts', import.meta.url), { workerData: data });
    this.#writer = writer;
    // A reply for a batch no longer at the head was already failed with the one before it.
    writer.on('message', (reply: WriterReply) => {
      if (this.#inFlight[0]?.id === reply.id) this.#done(reply);
    });
    writer.on('error', (err: unknown) => this.#writerDied(err instanceof Error ? err : new Error(String(err))));
    writer.on('exit', (code) => this.#writerDied(new Error(`writer thread exited with code ${code}`)));
  }

  /** The last resourceVersion committed. */
  get rv(): number {
    return this.#rv;
  }

  /** The oldest event kept: a watch can resume from the version before it. */
  get oldestEvent(): number {
    return this.#oldestEvent;
  }

  #writerDied(err: Error): void {
    if (this.#closed || this.#broken !== undefined) return;
    this.#broken = new AsbError('Unavailable', `store writer failed: ${err.message}`, { cause: err });
    this.#log.error({ err }, 'store writer thread died; the store refuses writes');
    const head = this.#inFlight[0];
    if (head !== undefined) this.#done({ id: head.id, ok: false, error: err.message });
  }

  /** Queues a write; it settles once its batch is durable (or refused). */
  enqueue<T extends KubeObject>(rt: ResourceType, req: WriteRequest): Promise<T> {
    if (this.#broken !== undefined) return Promise.reject(this.#broken);
    return new Promise<T>((resolve, reject) => {
      this.#queue.push({ rt, req, startedAt: monotonicMs(), resolve: (o) => resolve(o as T), reject });
      this.#scheduleFlush();
    });
  }

  #scheduleFlush(): void {
    if (this.#flushScheduled || this.#inFlight.length >= MAX_IN_FLIGHT) return;
    this.#flushScheduled = true;
    setImmediate(() => {
      this.#flushScheduled = false;
      this.#flush();
    });
  }

  /** Decides up to MAX_BATCH queued writes and posts them to the writer thread. */
  #flush(): void {
    if (this.#inFlight.length >= MAX_IN_FLIGHT) return;
    const writes = this.#queue.splice(0, MAX_BATCH);
    if (writes.length === 0) return;
    const flushedAt = monotonicMs();
    // Writes in this batch see each other's effects through `staged`, and those of the batches
    // still in flight through theirs (newest first), before the committed state.
    const staged: Staged = new Map();
    const outcomes: Outcome[] = [];
    const events: StagedEvent[] = [];
    const now = isoNow(this.#clock);
    // The last version handed to a decided write: the newest batch in flight's, else the committed one.
    let rv = this.#inFlight.at(-1)?.rv ?? this.#rv;
    for (const w of writes) {
      const gk = kindKey(w.rt);
      const stagedKind = staged.get(gk) ?? new Map<string, KubeObject | null>();
      staged.set(gk, stagedKind);
      const lookup = (ns: string, name: string): KubeObject | undefined => this.#lookup(gk, stagedKind, objectKey(ns, name));
      let d: Decision;
      try {
        d = decide({ rt: w.rt, lookup, rv: String(rv + 1), now }, w.req);
      } catch (err) {
        outcomes.push({ ok: false, err: toAsbError(err) });
        continue;
      }
      if (d.kind === 'noop') {
        outcomes.push({ ok: true, object: d.result });
        continue;
      }
      rv++;
      deepFreeze(d.object);
      stagedKind.set(objectKey(d.namespace, d.name), d.kind === 'put' ? d.object : null);
      const type = d.kind === 'put' ? d.type : 'DELETED';
      const prevLabels = d.prev?.metadata.labels ?? (d.prev === undefined ? undefined : {});
      const json = JSON.stringify(d.object);
      events.push({ gk, name: d.name, json, ev: { rv, type, namespace: d.namespace, object: d.object, prevLabels } });
      outcomes.push({ ok: true, object: d.object, json });
    }
    const batch: Batch = { id: this.#nextBatchId++, writes, outcomes, events, staged, rv, flushedAt, postedAt: flushedAt };
    if (events.length === 0) {
      // Nothing to commit; but a result read from a batch in flight is only true once it is.
      if (this.#inFlight.length === 0) this.#settle(writes, outcomes, events);
      else this.#inFlight.push(batch);
      return;
    }
    const rows: WriterRow[] = events.map(({ gk, name, ev, json }) => ({
      gk,
      namespace: ev.namespace,
      name,
      rv: ev.rv,
      type: ev.type === 'DELETED' ? 'DELETED' : ev.type === 'ADDED' ? 'ADDED' : 'MODIFIED',
      json,
      prevLabels: ev.prevLabels === undefined ? null : JSON.stringify(ev.prevLabels),
    }));
    const message: WriterBatch = { id: batch.id, epoch: this.#epoch, rows, rv, trimAtOrBelow: rv - this.#retention };
    this.#inFlight.push(batch);
    this.#writer.postMessage(message);
    batch.postedAt = monotonicMs();
  }

  /** The object as the writes decided so far leave it: this batch, the batches in flight, then the committed state. */
  #lookup(gk: string, stagedKind: Map<string, KubeObject | null>, key: string): KubeObject | undefined {
    let found = stagedKind.get(key);
    for (let i = this.#inFlight.length - 1; found === undefined && i >= 0; i--) found = this.#inFlight[i]?.staged.get(gk)?.get(key);
    if (found === undefined) found = this.#kinds.get(gk)?.objects.get(key);
    return found ?? undefined;
  }

  /** The writer's reply for the batch at the head of #inFlight. */
  #done(reply: WriterReply): void {
    const committedAt = monotonicMs();
    const head = this.#inFlight[0];
    if (head === undefined) return;
    if (reply.ok) {
      this.#inFlight.shift();
      this.#rv = head.rv;
      this.#oldestEvent = Math.max(this.#oldestEvent, head.rv - this.#retention + 1);
      this.#apply(head.staged);
      this.#settle(head.writes, head.outcomes, head.events);
      // Batches that changed nothing were waiting only for the ones ahead of them.
      while (this.#inFlight[0]?.events.length === 0) {
        const next = this.#inFlight.shift();
        if (next !== undefined) this.#settle(next.writes, next.outcomes, next.events);
      }
    } else {
      // Everything behind the failed batch was decided against the state it would have left;
      // the writer refuses those batches too (same epoch), and later ones start afresh.
      const failed = this.#inFlight.splice(0);
      this.#epoch++;
      const writes = failed.reduce((n, b) => n + b.writes.length, 0);
      const failure = new AsbError('Unavailable', `store commit failed; ${writes} writes rejected: ${reply.error}`);
      this.#log.error({ error: reply.error, writes }, 'store commit failed');
      for (const b of failed) for (const w of b.writes) w.reject(failure);
    }
    if (commitChannel.hasSubscribers) {
      const writerTimes = reply.ok ? { rowsMs: reply.rowsMs, commitMs: reply.commitMs } : {};
      const report: CommitReport = { writes: head.writes.length, changes: head.events.length, flushedAt: head.flushedAt, postedAt: head.postedAt, committedAt, publishedAt: monotonicMs(), ok: reply.ok, ...writerTimes };
      commitChannel.publish(report);
    }
    if (this.#queue.length > 0 && this.#broken === undefined) this.#scheduleFlush();
    else if (this.#broken !== undefined) for (const w of this.#queue.splice(0)) w.reject(this.#broken);
    const drained = this.#drained;
    this.#drained = undefined;
    drained?.();
  }

  #settle(batch: PendingWrite[], outcomes: Outcome[], events: StagedEvent[]): void {
    this.#metrics?.storeCommitBatch.observe(batch.length);
    const done = monotonicMs();
    for (const [i, w] of batch.entries()) {
      this.#metrics?.storeWriteSeconds.observe({ op: w.req.op satisfies WriteOp }, (done - w.startedAt) / 1000);
      const outcome = outcomes[i];
      if (outcome === undefined) w.reject(new AsbError('Internal', 'store: write lost its outcome'));
      // Each writer gets its own mutable copy. Parsing the JSON already made for the writer
      // thread costs half of a structuredClone (3 vs 6.5 µs for a claimed Sandbox).
      else if (outcome.ok) w.resolve(outcome.json === undefined ? structuredClone(outcome.object) : (JSON.parse(outcome.json) as KubeObject));
      else w.reject(outcome.err);
    }
    for (const { gk, ev } of events) this.#publish(gk, ev);
  }

  #apply(staged: Map<string, Map<string, KubeObject | null>>): void {
    for (const [gk, changes] of staged) {
      const state = kindOf(this.#kinds, gk);
      for (const [key, obj] of changes) {
        const existed = state.objects.has(key);
        if (obj === null) state.objects.delete(key);
        else state.objects.set(key, obj);
        if (existed !== (obj !== null)) state.sorted = undefined;
      }
    }
  }

  /** Commits (or rejects) every queued write and every batch in flight, never dropping one; the writer's exit is expected after. */
  async finish(): Promise<void> {
    while (this.#inFlight.length > 0 || this.#queue.length > 0) {
      this.#flush();
      if (this.#inFlight.length > 0) await new Promise<void>((resolve) => (this.#drained = resolve));
    }
    this.#closed = true;
  }

  /** Stops the writer thread and waits for it to exit. */
  async stopWriter(): Promise<void> {
    const exited = new Promise<void>((resolve) => this.#writer.once('exit', () => resolve()));
    this.#writer.postMessage('close');
    await exited;
  }
}
