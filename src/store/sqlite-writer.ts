// The embedded store's writer thread. It owns the only writing SQLite connection and commits
// one transaction at a time: BEGIN IMMEDIATE, the rows, COMMIT (one fsync of the WAL), then one
// reply per batch. Batches that queued up while the last COMMIT ran go in one transaction: the
// fsync took 3-12 ms on a busy shared disk, and a fsync per batch made the later batches of a
// burst wait for each earlier one's.
//
// Why a thread: a COMMIT with synchronous=FULL costs ~1 ms of fsync here, and on the main
// thread that blocked every HTTP request behind every commit (12.8% of the worker's time in a
// claim profile). Here the main thread keeps parsing requests and deciding the next batch while
// the disk works, and the batch that queued up meanwhile becomes the next group commit.
import { parentPort, receiveMessageOnPort, workerData, type MessagePort } from 'node:worker_threads';
import { openTables, type Tables } from './sqlite-tables.ts';

export interface WriterRow {
  gk: string;
  namespace: string;
  name: string;
  rv: number;
  type: 'ADDED' | 'MODIFIED' | 'DELETED';
  json: string;
  prevLabels: string | null;
}

export interface WriterBatch {
  id: number;
  /**
   * Batches are decided on top of the ones before them, still uncommitted; once one fails, the
   * rest of its epoch must fail too. The main thread moves to a new epoch after a failure.
   */
  epoch: number;
  rows: WriterRow[];
  /** The new last resourceVersion. */
  rv: number;
  /** Events at or below this version are trimmed. */
  trimAtOrBelow: number;
}

/** `rowsMs` and `commitMs`: the writer's time for its transaction's rows and for COMMIT (for probes). */
export type WriterReply = { id: number; ok: true; rowsMs: number; commitMs: number } | { id: number; ok: false; error: string };

export interface WriterData {
  path: string;
}

/** Commits batches (in order, each decided on the ones before it) in one transaction. */
function commit(t: Tables, batches: readonly WriterBatch[]): { rowsMs: number; commitMs: number } {
  const last = batches.at(-1);
  if (last === undefined) return { rowsMs: 0, commitMs: 0 };
  const started = performance.now();
  t.db.exec('BEGIN IMMEDIATE');
  try {
    for (const batch of batches) {
      for (const row of batch.rows) {
        if (row.type === 'DELETED') t.deleteObject.run(row.gk, row.namespace, row.name);
        else t.upsertObject.run(row.gk, row.namespace, row.name, row.rv, row.json);
        t.insertEvent.run(row.rv, row.type, row.gk, row.namespace, row.name, row.json, row.prevLabels);
      }
    }
    t.setMeta.run('rv', String(last.rv));
    // Versions are dense (one per write), so "keep the last N" is a range delete on the key.
    t.trimEvents.run(last.trimAtOrBelow);
    const rowsDone = performance.now();
    t.db.exec('COMMIT');
    return { rowsMs: rowsDone - started, commitMs: performance.now() - rowsDone };
  } catch (err) {
    if (t.db.isTransaction) t.db.exec('ROLLBACK');
    throw err;
  }
}

function main(): void {
  const port = parentPort;
  if (port === null) throw new Error('sqlite-writer runs as a worker thread');
  const { path } = workerData as WriterData;
  const tables = openTables(path, { writer: true });
  let failedEpoch: number | undefined;
  const reply = (r: WriterReply): void => port.postMessage(r);
  port.on('message', (first: WriterBatch | 'close') => {
    // The close request comes only after every batch was acknowledged: nothing follows it.
    const { batches, closing } = drain(port, first);
    const live: WriterBatch[] = [];
    for (const b of batches) {
      if (b.epoch === failedEpoch) reply({ id: b.id, ok: false, error: 'an earlier batch it was decided on failed' });
      else live.push(b);
    }
    try {
      const times = commit(tables, live);
      for (const b of live) reply({ id: b.id, ok: true, ...times });
    } catch (err) {
      const error = err instanceof Error ? err.message : String(err);
      for (const b of live) {
        failedEpoch = b.epoch;
        reply({ id: b.id, ok: false, error });
      }
    }
    if (closing) {
      tables.db.close();
      port.close();
    }
  });
}

/** `first` and every message already queued behind it. */
function drain(port: MessagePort, first: WriterBatch | 'close'): { batches: WriterBatch[]; closing: boolean } {
  const batches: WriterBatch[] = [];
  let msg: WriterBatch | 'close' | undefined = first;
  while (msg !== undefined) {
    if (msg === 'close') return { batches, closing: true };
    batches.push(msg);
    msg = receiveMessageOnPort(port)?.message as WriterBatch | 'close' | undefined;
  }
  return { batches, closing: false };
}

main();
