// The lifecycle event log: one SQLite file (events.db, 0600 in a 0700 directory of the worker's
// state) holding the teams' events (the events API reads them), the webhooks the teams
// registered, the delivery queue, the facts waiting to be written as Kubernetes Events, and the
// recorder's summary of every object it watches.
//
// Why a file of its own and not store objects: the log is append-only, kept 7 days, read by
// team and sandbox, and a delivery queue changes each row several times; in the object store
// every one of those writes would be a watch event every informer replays. And why synchronous
// node:sqlite: an event and its deliveries and the summary that produced them are written in ONE
// transaction (WAL, synchronous=FULL) before anything is sent, so kill -9 at any moment either
// loses the whole change (the recorder sees it again on restart, as its summary is old) or keeps
// all of it: an acknowledged event is never lost and never recorded twice.
//
// Webhook secrets: the signature needs the raw secret, so it cannot be stored hashed. It is
// stored as given, in this 0600 file that no sandbox mounts (as the egress secrets are,
// src/egress/credential-store.ts), and no API returns it: a listing shows that one is set, never
// what it is. Encrypting it with a key kept beside it in the same directory would protect nothing
// more against whoever can read that directory.
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { DatabaseSync, type StatementSync } from 'node:sqlite';
import { privateDir, privateFile, restrictExisting } from '../base/private-files.ts';
import type { Fact, Summary } from './facts.ts';

/** E2B's lifecycle event, as its events API and webhooks carry it (plus our reason and message in eventData). */
export interface LifecycleEvent {
  version: 'v1';
  id: string;
  type: string;
  eventData: Record<string, unknown> | null;
  sandboxBuildId: string;
  sandboxExecutionId: string;
  sandboxId: string;
  sandboxTeamId: string;
  sandboxTemplateId: string;
  timestamp: string;
}

export interface Webhook {
  id: string;
  teamID: string;
  name: string;
  url: string;
  enabled: boolean;
  events: string[];
  createdAt: string;
  /** Always true: a webhook has a secret; its value is never shown. */
  signatureSecretSet: true;
}

export interface DeliveryAttempt {
  at: string;
  /** The receiver's HTTP status, absent when no answer came. */
  status?: number;
  error?: string;
}

export interface Delivery {
  id: string;
  webhookId: string;
  eventId: string;
  eventType: string;
  sandboxId: string;
  state: 'pending' | 'delivered' | 'failed';
  attempts: DeliveryAttempt[];
  nextAttemptAt?: string;
  deliveredAt?: string;
}

export interface DueDelivery {
  id: string;
  attempt: number;
  webhook: { id: string; url: string; secret: string };
  event: LifecycleEvent;
}

export type AttemptOutcome = { ok: true } | { ok: false; retryAt: number | undefined };

export interface ListQuery {
  offset: number;
  limit: number;
  orderAsc: boolean;
  types: readonly string[];
}

export interface EventLogOptions {
  dir: string;
  /** How long events and finished deliveries are kept; default 7 days (E2B's). */
  retentionMs?: number;
  now?: () => number;
}

export const DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000;
/** Attempts kept per delivery in its record (the count is kept whole). */
const MAX_ATTEMPTS_SHOWN = 20;

const SCHEMA = `
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  team TEXT NOT NULL,
  sandbox TEXT NOT NULL,
  type TEXT NOT NULL,
  at INTEGER NOT NULL,
  json TEXT NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS events_by_sandbox ON events (team, sandbox, seq);
CREATE INDEX IF NOT EXISTS events_by_time ON events (at);
CREATE TABLE IF NOT EXISTS seen (
  key TEXT PRIMARY KEY,
  json TEXT NOT NULL
) STRICT, WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS webhooks (
  id TEXT PRIMARY KEY,
  team TEXT NOT NULL,
  name TEXT NOT NULL,
  url TEXT NOT NULL,
  secret TEXT NOT NULL,
  events TEXT NOT NULL,
  enabled INTEGER NOT NULL,
  created TEXT NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS deliveries (
  id TEXT PRIMARY KEY,
  webhook TEXT NOT NULL,
  event TEXT NOT NULL,
  seq INTEGER NOT NULL,
  state TEXT NOT NULL,
  attempts INTEGER NOT NULL,
  history TEXT NOT NULL,
  next_at INTEGER,
  done_at INTEGER
) STRICT;
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (state, next_at);
CREATE TABLE IF NOT EXISTS kube_outbox (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  json TEXT NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS deliveries_by_webhook ON deliveries (webhook, seq);
`;

interface WebhookRow { id: string; team: string; name: string; url: string; secret: string; events: string; enabled: number; created: string }
interface DeliveryRow { id: string; webhook: string; event: string; seq: number; state: string; attempts: number; history: string; next_at: number | null; done_at: number | null }

export class EventLog {
  readonly #db: DatabaseSync;
  /** Each statement prepared once, by its text: a burst of claims records hundreds of rows. */
  readonly #statements = new Map<string, StatementSync>();
  readonly #now: () => number;
  readonly retentionMs: number;
  #closed = false;

  constructor(opts: EventLogOptions) {
    privateDir(opts.dir);
    const path = join(opts.dir, 'events.db');
    privateFile(path);
    restrictExisting([`${path}-wal`, `${path}-shm`]);
    this.#db = new DatabaseSync(path);
    this.#db.exec('PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=2000;');
    this.#db.exec(SCHEMA);
    this.#now = opts.now ?? Date.now;
    this.retentionMs = opts.retentionMs ?? DEFAULT_RETENTION_MS;
  }

  #q(sql: string): StatementSync {
    let statement = this.#statements.get(sql);
    if (statement === undefined) {
      statement = this.#db.prepare(sql);
      this.#statements.set(sql, statement);
    }
    return statement;
  }

  /** Every summary the recorder kept, by key (`Kind/namespace/name`). */
  summaries(): Map<string, Summary> {
    const rows = this.#q('SELECT key, json FROM seen').all() as unknown as { key: string; json: string }[];
    return new Map(rows.map((r) => [r.key, JSON.parse(r.json) as Summary]));
  }

  /**
   * Persists, in one transaction, the facts of one change and the summary it leaves (undefined:
   * the object is gone). Returns the team events it wrote; their deliveries are queued with them.
   */
  record(key: string, summary: Summary | undefined, facts: readonly Fact[]): LifecycleEvent[] {
    return this.recordAll([{ key, summary, facts }]);
  }

  /**
   * record() for many changes in ONE transaction, in order: a burst of claims costs one fsync,
   * not one per claim (each is 2-6 ms on this machine, spent on the thread that serves the API).
   */
  recordAll(changes: readonly { key: string; summary: Summary | undefined; facts: readonly Fact[] }[]): LifecycleEvent[] {
    const now = this.#now();
    const written: LifecycleEvent[] = [];
    // Each team's enabled webhooks, read once per batch (a burst is mostly one team's claims).
    const hooksOf = new Map<string, { id: string; events: string[] }[]>();
    const hooksFor = (team: string): { id: string; events: string[] }[] => {
      let hooks = hooksOf.get(team);
      if (hooks === undefined) {
        const rows = this.#q('SELECT id, events FROM webhooks WHERE team = ? AND enabled = 1').all(team) as unknown as { id: string; events: string }[];
        hooks = rows.map((r) => ({ id: r.id, events: JSON.parse(r.events) as string[] }));
        hooksOf.set(team, hooks);
      }
      return hooks;
    };
    this.#db.exec('BEGIN IMMEDIATE');
    try {
      for (const { key, summary, facts } of changes) {
        for (const fact of facts) {
          if (fact.event === undefined || fact.team === undefined || fact.sandboxId === undefined) continue;
          const event: LifecycleEvent = {
            version: 'v1',
            id: randomUUID(),
            type: fact.event,
            eventData: { reason: fact.reason, message: fact.message, ...fact.data },
            sandboxBuildId: '',
            sandboxExecutionId: fact.involved.uid,
            sandboxId: fact.sandboxId,
            sandboxTeamId: fact.team,
            sandboxTemplateId: fact.template ?? '',
            timestamp: new Date(now).toISOString(),
          };
          const res = this.#q('INSERT INTO events (id, team, sandbox, type, at, json) VALUES (?, ?, ?, ?, ?, ?)').run(event.id, event.sandboxTeamId, event.sandboxId, event.type, now, JSON.stringify(event));
          const seq = Number(res.lastInsertRowid);
          for (const hook of hooksFor(event.sandboxTeamId)) {
            if (hook.events.length > 0 && !hook.events.includes(event.type)) continue;
            this.#q('INSERT INTO deliveries (id, webhook, event, seq, state, attempts, history, next_at) VALUES (?, ?, ?, ?, \'pending\', 0, \'[]\', ?)').run(randomUUID(), hook.id, event.id, seq, now);
          }
          written.push(event);
        }
        for (const fact of facts) this.#q('INSERT INTO kube_outbox (json) VALUES (?)').run(JSON.stringify(fact));
        if (summary === undefined) this.#q('DELETE FROM seen WHERE key = ?').run(key);
        else this.#q('INSERT INTO seen (key, json) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET json = excluded.json').run(key, JSON.stringify(summary));
      }
      this.#db.exec('COMMIT');
    } catch (err) {
      this.#db.exec('ROLLBACK');
      throw err;
    }
    return written;
  }

  /** Facts not yet written as Kubernetes Events, oldest first (written with their change, so a kill -9 before the write loses none). */
  kubePending(limit: number): { seq: number; fact: Fact }[] {
    const rows = this.#q('SELECT seq, json FROM kube_outbox ORDER BY seq LIMIT ?').all(limit) as unknown as { seq: number; json: string }[];
    return rows.map((r) => ({ seq: r.seq, fact: JSON.parse(r.json) as Fact }));
  }

  /** Forgets facts written as Kubernetes Events (or given up on). */
  kubeDone(seqs: readonly number[]): void {
    if (seqs.length === 0) return;
    this.#db.prepare(`DELETE FROM kube_outbox WHERE seq IN (${seqs.map(() => '?').join(', ')})`).run(...seqs);
  }

  /** A sandbox's events, or undefined when the team has none for it (another team's sandbox, or none such). */
  sandboxEvents(team: string, sandbox: string, q: ListQuery): LifecycleEvent[] | undefined {
    const any = this.#q('SELECT 1 FROM events WHERE team = ? AND sandbox = ? LIMIT 1').get(team, sandbox);
    if (any === undefined) return undefined;
    return this.#list('team = ? AND sandbox = ?', [team, sandbox], q);
  }

  teamEvents(team: string, q: ListQuery): LifecycleEvent[] {
    return this.#list('team = ?', [team], q);
  }

  #list(where: string, args: string[], q: ListQuery): LifecycleEvent[] {
    const types = q.types.length === 0 ? '' : ` AND type IN (${q.types.map(() => '?').join(', ')})`;
    const sql = `SELECT json FROM events WHERE ${where}${types} ORDER BY seq ${q.orderAsc ? 'ASC' : 'DESC'} LIMIT ? OFFSET ?`;
    const rows = this.#db.prepare(sql).all(...args, ...q.types, q.limit, q.offset) as unknown as { json: string }[];
    return rows.map((r) => JSON.parse(r.json) as LifecycleEvent);
  }

  addWebhook(team: string, w: { name: string; url: string; secret: string; events: string[]; enabled: boolean }): Webhook {
    const id = randomUUID();
    const created = new Date(this.#now()).toISOString();
    this.#q('INSERT INTO webhooks (id, team, name, url, secret, events, enabled, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)').run(id, team, w.name, w.url, w.secret, JSON.stringify(w.events), w.enabled ? 1 : 0, created);
    return { id, teamID: team, name: w.name, url: w.url, enabled: w.enabled, events: w.events, createdAt: created, signatureSecretSet: true };
  }

  webhooks(team: string): Webhook[] {
    const rows = this.#q('SELECT * FROM webhooks WHERE team = ? ORDER BY created, id').all(team) as unknown as WebhookRow[];
    return rows.map(webhookOf);
  }

  webhook(team: string, id: string): Webhook | undefined {
    const row = this.#q('SELECT * FROM webhooks WHERE team = ? AND id = ?').get(team, id) as unknown as WebhookRow | undefined;
    return row === undefined ? undefined : webhookOf(row);
  }

  /** Changes the fields given; false when the team has no such webhook. */
  updateWebhook(team: string, id: string, w: Partial<{ name: string; url: string; secret: string; events: string[]; enabled: boolean }>): boolean {
    const cur = this.#q('SELECT * FROM webhooks WHERE team = ? AND id = ?').get(team, id) as unknown as WebhookRow | undefined;
    if (cur === undefined) return false;
    this.#q('UPDATE webhooks SET name = ?, url = ?, secret = ?, events = ?, enabled = ? WHERE id = ?').run(
      w.name ?? cur.name, w.url ?? cur.url, w.secret ?? cur.secret, w.events === undefined ? cur.events : JSON.stringify(w.events), w.enabled === undefined ? cur.enabled : (w.enabled ? 1 : 0), id);
    return true;
  }

  /** Deletes the webhook and its queue; false when the team has no such webhook. */
  deleteWebhook(team: string, id: string): boolean {
    this.#db.exec('BEGIN IMMEDIATE');
    try {
      const res = this.#q('DELETE FROM webhooks WHERE team = ? AND id = ?').run(team, id);
      if (res.changes > 0) this.#q('DELETE FROM deliveries WHERE webhook = ?').run(id);
      this.#db.exec('COMMIT');
      return res.changes > 0;
    } catch (err) {
      this.#db.exec('ROLLBACK');
      throw err;
    }
  }

  deliveries(team: string, webhookId: string, q: { offset: number; limit: number }): Delivery[] | undefined {
    if (this.webhook(team, webhookId) === undefined) return undefined;
    const rows = this.#q('SELECT d.*, e.type AS etype, e.sandbox AS esandbox FROM deliveries d JOIN events e ON e.id = d.event WHERE d.webhook = ? ORDER BY d.seq ASC LIMIT ? OFFSET ?').all(webhookId, q.limit, q.offset) as unknown as (DeliveryRow & { etype: string; esandbox: string })[];
    return rows.map((r) => ({
      id: r.id,
      webhookId: r.webhook,
      eventId: r.event,
      eventType: r.etype,
      sandboxId: r.esandbox,
      state: r.state as Delivery['state'],
      attempts: JSON.parse(r.history) as DeliveryAttempt[],
      ...(r.state === 'pending' && r.next_at !== null ? { nextAttemptAt: new Date(r.next_at).toISOString() } : {}),
      ...(r.state === 'delivered' && r.done_at !== null ? { deliveredAt: new Date(r.done_at).toISOString() } : {}),
    }));
  }

  /** Pending deliveries whose time has come, oldest event first, at most one per webhook in flight order. */
  due(limit: number, exclude: ReadonlySet<string>): DueDelivery[] {
    const rows = this.#q('SELECT d.id, d.attempts, w.id AS wid, w.url, w.secret, e.json FROM deliveries d JOIN webhooks w ON w.id = d.webhook JOIN events e ON e.id = d.event WHERE d.state = \'pending\' AND d.next_at <= ? ORDER BY d.next_at, d.seq LIMIT ?')
      .all(this.#now(), limit + exclude.size) as unknown as { id: string; attempts: number; wid: string; url: string; secret: string; json: string }[];
    return rows.filter((r) => !exclude.has(r.id)).slice(0, limit).map((r) => ({ id: r.id, attempt: r.attempts + 1, webhook: { id: r.wid, url: r.url, secret: r.secret }, event: JSON.parse(r.json) as LifecycleEvent }));
  }

  /** When the next pending delivery is due (ms epoch), or undefined when none is pending. */
  nextDue(): number | undefined {
    const row = this.#q('SELECT MIN(next_at) AS at FROM deliveries WHERE state = \'pending\'').get() as { at: number | null } | undefined;
    return row?.at ?? undefined;
  }

  /** Records one attempt: delivered, retried at `retryAt`, or failed for good (retryAt undefined and not ok). */
  attempted(id: string, attempt: DeliveryAttempt, outcome: AttemptOutcome): void {
    this.attemptedAll([{ id, attempt, outcome }]);
  }

  /** attempted() for many, in one transaction: one fsync for a burst of deliveries, not one each. */
  attemptedAll(list: readonly { id: string; attempt: DeliveryAttempt; outcome: AttemptOutcome }[]): void {
    const now = this.#now();
    this.#db.exec('BEGIN IMMEDIATE');
    try {
      for (const { id, attempt, outcome } of list) {
        const row = this.#q('SELECT history, attempts FROM deliveries WHERE id = ?').get(id) as { history: string; attempts: number } | undefined;
        if (row === undefined) continue; // its webhook was deleted meanwhile
        const history = [...(JSON.parse(row.history) as DeliveryAttempt[]), attempt].slice(-MAX_ATTEMPTS_SHOWN);
        const state = outcome.ok ? 'delivered' : outcome.retryAt === undefined ? 'failed' : 'pending';
        const nextAt = outcome.ok ? null : outcome.retryAt ?? null;
        this.#q('UPDATE deliveries SET state = ?, attempts = ?, history = ?, next_at = ?, done_at = ? WHERE id = ?').run(state, row.attempts + 1, JSON.stringify(history), nextAt, state === 'pending' ? null : now, id);
      }
      this.#db.exec('COMMIT');
    } catch (err) {
      this.#db.exec('ROLLBACK');
      throw err;
    }
  }

  /** Drops events, and finished deliveries, older than the retention. */
  prune(): { events: number } {
    const before = this.#now() - this.retentionMs;
    this.#db.exec('BEGIN IMMEDIATE');
    try {
      const old = this.#q('DELETE FROM events WHERE at < ?').run(before);
      this.#q('DELETE FROM deliveries WHERE event NOT IN (SELECT id FROM events)').run();
      this.#db.exec('COMMIT');
      return { events: Number(old.changes) };
    } catch (err) {
      this.#db.exec('ROLLBACK');
      throw err;
    }
  }

  /** Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#statements.clear();
    this.#db.close();
  }
}

function webhookOf(r: WebhookRow): Webhook {
  return { id: r.id, teamID: r.team, name: r.name, url: r.url, enabled: r.enabled === 1, events: JSON.parse(r.events) as string[], createdAt: r.created, signatureSecretSet: true };
}
