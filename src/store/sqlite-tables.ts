// The embedded store's SQLite file: schema, pragmas and the prepared statements the store uses.
// Only sqlite.ts talks to this module; nothing here knows about batching or watches.
import { DatabaseSync, type StatementSync } from 'node:sqlite';
import { AsbError } from '../errors.ts';

const SCHEMA_VERSION = 1;
// A second process that opens the same file waits this long for the lock, then fails loudly
// instead of serving from a cache that the first process keeps changing.
const BUSY_TIMEOUT_MS = 2000;

const SCHEMA = `
CREATE TABLE IF NOT EXISTS meta (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS objects (
  gk TEXT NOT NULL,
  namespace TEXT NOT NULL,
  name TEXT NOT NULL,
  rv INTEGER NOT NULL,
  json TEXT NOT NULL,
  PRIMARY KEY (gk, namespace, name)
) STRICT, WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
  rv INTEGER PRIMARY KEY,
  type TEXT NOT NULL,
  gk TEXT NOT NULL,
  namespace TEXT NOT NULL,
  name TEXT NOT NULL,
  json TEXT NOT NULL,
  prev_labels TEXT
) STRICT;
CREATE INDEX IF NOT EXISTS events_by_kind ON events (gk, rv);
`;

export interface ObjectRow {
  gk: string;
  namespace: string;
  name: string;
  json: string;
}

export interface EventRow {
  rv: number;
  type: string;
  namespace: string;
  json: string;
  prev_labels: string | null;
}

export interface Tables {
  db: DatabaseSync;
  upsertObject: StatementSync;
  deleteObject: StatementSync;
  insertEvent: StatementSync;
  setMeta: StatementSync;
  trimEvents: StatementSync;
  eventsAfter: StatementSync;
}

function configure(db: DatabaseSync, path: string): void {
  // Two connections share the file: the writer thread's (every write) and the main thread's
  // (the initial load and watch replay, read-only). WAL lets them run at once; only one process
  // may own the store, which the owner lock (owner-lock.ts) enforces, because every reader is
  // served from that process's memory.
  db.exec(`PRAGMA busy_timeout = ${BUSY_TIMEOUT_MS}`);
  const mode = db.prepare('PRAGMA journal_mode = WAL').get();
  if (mode?.journal_mode !== 'wal') throw new AsbError('Internal', `store ${path}: SQLite refused WAL mode (got ${String(mode?.journal_mode)})`);
  // FULL: every COMMIT fsyncs the WAL, so an acknowledged write survives power loss, not only
  // kill -9. Group commit (sqlite-commit.ts) pays that fsync once per batch, not once per write.
  db.exec('PRAGMA synchronous = FULL');
}

function migrate(db: DatabaseSync, path: string): void {
  db.exec('BEGIN IMMEDIATE');
  try {
    db.exec(SCHEMA);
    const row = db.prepare("SELECT value FROM meta WHERE key = 'schema'").get();
    if (row === undefined) {
      db.prepare("INSERT INTO meta (key, value) VALUES ('schema', ?), ('rv', '0')").run(String(SCHEMA_VERSION));
    } else if (row.value !== String(SCHEMA_VERSION)) {
      throw new AsbError('Internal', `store ${path}: schema version ${String(row.value)}, this build reads ${SCHEMA_VERSION}`);
    }
    db.exec('COMMIT');
  } catch (err) {
    db.exec('ROLLBACK');
    throw err;
  }
}

/**
 * Opens (creating if needed) the store file. The main thread opens it first (schema and
 * migrations), the writer thread second with `writer: true`.
 */
export function openTables(path: string, opts: { writer?: boolean } = {}): Tables {
  let db: DatabaseSync;
  try {
    db = new DatabaseSync(path);
  } catch (err) {
    throw new AsbError('Unavailable', `store ${path}: cannot open: ${String(err)}`, { cause: err });
  }
  try {
    configure(db, path);
    if (opts.writer !== true) migrate(db, path);
  } catch (err) {
    db.close();
    if (err instanceof AsbError) throw err;
    throw new AsbError('Unavailable', `store ${path}: cannot open (is another process using it?): ${String(err)}`, { cause: err });
  }
  return {
    db,
    upsertObject: db.prepare('INSERT OR REPLACE INTO objects (gk, namespace, name, rv, json) VALUES (?, ?, ?, ?, ?)'),
    deleteObject: db.prepare('DELETE FROM objects WHERE gk = ? AND namespace = ? AND name = ?'),
    insertEvent: db.prepare('INSERT INTO events (rv, type, gk, namespace, name, json, prev_labels) VALUES (?, ?, ?, ?, ?, ?, ?)'),
    setMeta: db.prepare('INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)'),
    trimEvents: db.prepare('DELETE FROM events WHERE rv <= ?'),
    eventsAfter: db.prepare('SELECT rv, type, namespace, json, prev_labels FROM events WHERE gk = ? AND rv > ? ORDER BY rv'),
  };
}

/** The last resourceVersion handed out. */
export function readVersion(t: Tables): number {
  const row = t.db.prepare("SELECT value FROM meta WHERE key = 'rv'").get();
  return Number(row?.value ?? 0);
}

/** The oldest event still retained, or undefined when the table is empty. */
export function readOldestEvent(t: Tables): number | undefined {
  const row = t.db.prepare('SELECT min(rv) AS rv FROM events').get();
  return typeof row?.rv === 'number' ? row.rv : undefined;
}

export function readObjects(t: Tables): ObjectRow[] {
  return t.db.prepare('SELECT gk, namespace, name, json FROM objects').all() as unknown as ObjectRow[];
}

export function readEventsAfter(t: Tables, gk: string, rv: number): EventRow[] {
  return t.eventsAfter.all(gk, rv) as unknown as EventRow[];
}
