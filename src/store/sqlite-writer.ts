// The embedded store's writer thread. It owns the only writing SQLite connection and commits
// one batch at a time: BEGIN IMMEDIATE, the rows, COMMIT (one fsync of the WAL), then replies.
//
// Why a thread: a COMMIT with synchronous=FULL costs ~1 ms of fsync here, and on the main
// thread that blocked every HTTP request behind every commit (12.8% of the worker's time in a
// claim profile). Here the main thread keeps parsing requests and deciding the next batch while
// the disk works, and the batch that queued up meanwhile becomes the next group commit.
import { parentPort, workerData } from 'node:worker_threads';
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

export type WriterReply = { id: number; ok: true } | { id: number; ok: false; error: string };

export interface WriterData {
  path: string;
}

function commit(t: Tables, batch: WriterBatch): void {
  t.db.exec('BEGIN IMMEDIATE');
  try {
    for (const row of batch.rows) {
      if (row.type === 'DELETED') t.deleteObject.run(row.gk, row.namespace, row.name);
      else t.upsertObject.run(row.gk, row.namespace, row.name, row.rv, row.json);
      t.insertEvent.run(row.rv, row.type, row.gk, row.namespace, row.name, row.json, row.prevLabels);
    }
    t.setMeta.run('rv', String(batch.rv));
    // Versions are dense (one per write), so "keep the last N" is a range delete on the key.
    t.trimEvents.run(batch.trimAtOrBelow);
    t.db.exec('COMMIT');
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
  port.on('message', (msg: WriterBatch | 'close') => {
    if (msg === 'close') {
      tables.db.close();
      port.close();
      return;
    }
    let reply: WriterReply;
    if (msg.epoch === failedEpoch) {
      port.postMessage({ id: msg.id, ok: false, error: 'an earlier batch it was decided on failed' } satisfies WriterReply);
      return;
    }
    try {
      commit(tables, msg);
      reply = { id: msg.id, ok: true };
    } catch (err) {
      failedEpoch = msg.epoch;
      reply = { id: msg.id, ok: false, error: err instanceof Error ? err.message : String(err) };
    }
    port.postMessage(reply);
  });
}

main();
