// Delivers queued lifecycle events to the teams' webhooks: POST of the event's JSON, signed
// (signature.ts), a 2xx answer within the timeout is delivered, anything else is retried with
// exponential backoff (base × 2^(attempt-1), capped) until the attempts run out, then failed.
// Every attempt is recorded on the delivery (listable through the API). Only public addresses
// are connected to unless allowPrivate (--webhook-allow-private); a refused one is an attempt
// that failed, naming why (webhook-target.ts).
//
// Nothing waits on a receiver: the recorder persists events and their deliveries and only kicks
// this loop, which runs at most `concurrency` requests at once, each bounded by its timeout. A
// receiver that is down costs one timed-out request per retry, never a slower claim or pause.
// The queue is the event log's table, so a worker killed mid-delivery sends what was pending
// when it comes back: at-least-once (a delivery whose 2xx arrived just before a kill -9, before
// it was recorded, is sent again; receivers deduplicate on the asb-event-id header / event id).
//
// Shutdown (close): no new attempts; requests in flight are aborted and stay pending.
import { Agent as HttpAgent, request as httpRequest, type ClientRequest } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import type { Metrics } from '../metrics/metrics.ts';
import type { Logger } from '../base/log.ts';
import type { AttemptOutcome, DeliveryAttempt, DueDelivery, EventLog } from './event-log.ts';
import { sign, SIGNATURE_HEADER, TIMESTAMP_HEADER } from './signature.ts';
import { privateLiteralRefusal, publicOnlyLookup } from './webhook-target.ts';

export interface WebhookSenderOptions {
  events: EventLog;
  log: Logger;
  now?: () => number;
  /** First retry delay; default 1 s. */
  backoffBaseMs?: number;
  /** Longest retry delay; default 10 min. */
  backoffMaxMs?: number;
  /** Attempts before a delivery is failed for good; default 12 (about 27 minutes of retries: 1+2+…+512 s, then 600 s). */
  maxAttempts?: number;
  /** Per-request timeout; default 10 s. */
  timeoutMs?: number;
  /** Requests in flight at once, across webhooks; default 8. */
  concurrency?: number;
  /** How long after new events their deliveries start (soon()); default 50 ms. */
  batchDelayMs?: number;
  metrics?: Pick<Metrics, 'webhookAttemptsTotal'>;
  /** Deliver to private, loopback and link-local addresses too (--webhook-allow-private); default false: public addresses only (webhook-target.ts). */
  allowPrivate?: boolean;
}

function describeError(err: Error): string {
  return err.cause instanceof Error ? `${err.message}: ${err.cause.message}` : err.message;
}

export class WebhookSender {
  readonly #o: Required<Omit<WebhookSenderOptions, 'events' | 'log' | 'metrics'>> & Pick<WebhookSenderOptions, 'events' | 'log' | 'metrics'>;
  readonly #inflight = new Map<string, AbortController>();
  #timer: ReturnType<typeof setTimeout> | undefined;
  /** When #timer fires (ms, the injected clock). */
  #timerAt = 0;
  #closed = false;
  /** Outcomes waiting to be written, in one transaction after this turn (one fsync per burst). */
  #outcomes: { id: string; attempt: DeliveryAttempt; outcome: AttemptOutcome }[] = [];
  /** Attempts made, by outcome (for metrics and tests). */
  readonly counts = { delivered: 0, retried: 0, failed: 0 };
  // Own agents (kept-alive connections, as fetch kept them), so close() ends their sockets.
  readonly #httpAgent = new HttpAgent({ keepAlive: true });
  readonly #httpsAgent = new HttpsAgent({ keepAlive: true });
  readonly #lookup = publicOnlyLookup();

  constructor(opts: WebhookSenderOptions) {
    this.#o = {
      events: opts.events,
      log: opts.log,
      ...(opts.metrics === undefined ? {} : { metrics: opts.metrics }),
      now: opts.now ?? Date.now,
      backoffBaseMs: opts.backoffBaseMs ?? 1000,
      backoffMaxMs: opts.backoffMaxMs ?? 600_000,
      maxAttempts: opts.maxAttempts ?? 12,
      timeoutMs: opts.timeoutMs ?? 10_000,
      concurrency: opts.concurrency ?? 8,
      batchDelayMs: opts.batchDelayMs ?? 50,
      allowPrivate: opts.allowPrivate ?? false,
    };
  }

  /**
   * New events were recorded: deliveries start a moment later, so they do not compete with the
   * burst of claims that made them for the worker's thread (8 requests at once cost a claim burst
   * its p50, measured by bench/events.ts). Kicks within the moment coalesce.
   */
  soon(): void {
    if (this.#closed) return;
    // A timer already set to fire sooner (an earlier soon()) takes these too; a later one (a retry's backoff) is brought forward.
    if (this.#timer !== undefined && this.#timerAt <= this.#o.now() + this.#o.batchDelayMs) return;
    this.#schedule(this.#o.batchDelayMs);
  }

  /** Looks for due deliveries now. */
  kick(): void {
    if (this.#closed) return;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    let due: DueDelivery[];
    try {
      due = this.#o.events.due(this.#o.concurrency - this.#inflight.size, new Set(this.#inflight.keys()));
    } catch (err) {
      this.#o.log.error({ err }, 'webhooks: the delivery queue could not be read');
      this.#schedule(this.#o.backoffBaseMs);
      return;
    }
    for (const d of due) this.#send(d);
    const next = this.#o.events.nextDue();
    if (next !== undefined && this.#inflight.size < this.#o.concurrency) this.#schedule(Math.max(0, next - this.#o.now()));
  }

  #schedule(ms: number): void {
    if (this.#closed) return;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    // Capped so a clock step or a missed kick is noticed within a minute.
    this.#timerAt = this.#o.now() + Math.min(ms, 60_000);
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.kick();
    }, Math.min(ms, 60_000));
  }

  #send(d: DueDelivery): void {
    const abort = new AbortController();
    this.#inflight.set(d.id, abort);
    const body = JSON.stringify(d.event);
    const ts = Math.floor(this.#o.now() / 1000);
    const timeout = setTimeout(() => abort.abort(new Error(`no answer within ${String(this.#o.timeoutMs)} ms`)), this.#o.timeoutMs);
    const at = new Date(this.#o.now()).toISOString();
    this.#post(d.webhook.url, body, abort.signal, () => clearTimeout(timeout), {
      'content-type': 'application/json',
      'user-agent': 'agent-sandbox-webhooks/1',
      [SIGNATURE_HEADER]: sign(d.webhook.secret, ts, body),
      [TIMESTAMP_HEADER]: String(ts),
      'asb-webhook-id': d.webhook.id,
      'asb-delivery-id': d.id,
      'asb-event-id': d.event.id,
      'asb-event-type': d.event.type,
      'asb-delivery-attempt': String(d.attempt),
    }).then((r) => {
      if (this.#closed) return;
      const ok = 'status' in r && r.status >= 200 && r.status < 300;
      const attempt: DeliveryAttempt = 'status' in r ? { at, status: r.status } : { at, error: r.error };
      let outcome: AttemptOutcome = { ok: true };
      if (ok) {
        this.counts.delivered++;
        this.#o.metrics?.webhookAttemptsTotal.inc({ outcome: 'delivered' });
      } else {
        // A refused private address is retried like any failure: the name may resolve elsewhere later.
        const retryAt = d.attempt >= this.#o.maxAttempts ? undefined : this.#o.now() + Math.min(this.#o.backoffBaseMs * 2 ** (d.attempt - 1), this.#o.backoffMaxMs);
        if (retryAt === undefined) this.counts.failed++;
        else this.counts.retried++;
        this.#o.metrics?.webhookAttemptsTotal.inc({ outcome: retryAt === undefined ? 'failed' : 'retried' });
        outcome = { ok: false, retryAt };
        this.#o.log.info({ delivery: d.id, webhook: d.webhook.id, attempt: d.attempt, ...attempt, retryAt }, 'webhooks: delivery not accepted');
      }
      if (this.#outcomes.push({ id: d.id, attempt, outcome }) === 1) setImmediate(() => this.#flushOutcomes());
    })
      .catch((err: unknown) => this.#o.log.error({ err, delivery: d.id }, 'webhooks: an attempt could not be recorded'));
  }

  /**
   * One POST: the receiver's status, or why none came. node:http rather than fetch, for its
   * `lookup`: the address checked is the address connected to (webhook-target.ts). Redirects are
   * not followed (a 3xx is an answer, and not a 2xx). The answer's body is read and dropped; the
   * timeout covers it too, so a receiver trickling one holds no socket past the timeout.
   */
  #post(target: string, body: string, signal: AbortSignal, finished: () => void, headers: Record<string, string>): Promise<{ status: number } | { error: string }> {
    let url: URL;
    try {
      url = new URL(target);
    } catch {
      finished();
      return Promise.resolve({ error: `"${target}" is not an absolute URL` });
    }
    const refusal = this.#o.allowPrivate ? undefined : privateLiteralRefusal(url);
    if (refusal !== undefined) {
      finished();
      return Promise.resolve({ error: refusal });
    }
    const https = url.protocol === 'https:';
    return new Promise((resolve) => {
      let req: ClientRequest;
      try {
        req = (https ? httpsRequest : httpRequest)(url, {
          method: 'POST',
          agent: https ? this.#httpsAgent : this.#httpAgent,
          signal,
          headers: { ...headers, 'content-length': String(Buffer.byteLength(body)) },
          ...(this.#o.allowPrivate ? {} : { lookup: this.#lookup }),
        });
      } catch (err) {
        // A URL node:http will not send to (registration checked it; an older row might not be): a failed attempt like any other.
        finished();
        resolve({ error: err instanceof Error ? describeError(err) : String(err) });
        return;
      }
      req.on('response', (res) => {
        resolve({ status: res.statusCode ?? 0 });
        // The body cut short after its status (the timeout, close()): the status is the outcome, already taken.
        res.on('error', () => undefined);
        res.resume();
      });
      req.on('error', (err: Error) => {
        // After a response this is its body cut short (the timeout, or close()): the status stands.
        const reason: unknown = signal.reason;
        resolve({ error: signal.aborted && reason instanceof Error ? reason.message : describeError(err) });
      });
      // The answer read to its end, or the connection gone: the timeout has nothing left to bound.
      req.on('close', finished);
      req.end(body);
    });
  }

  /** Writes the outcomes gathered this turn; only then are their deliveries out of flight (due() must not pick one again). */
  #flushOutcomes(): void {
    const list = this.#outcomes.splice(0);
    if (this.#closed || list.length === 0) return;
    try {
      this.#o.events.attemptedAll(list);
    } catch (err) {
      // Left pending in the log: sent again (at-least-once), after the next kick.
      this.#o.log.error({ err, deliveries: list.length }, 'webhooks: attempts could not be recorded');
    }
    for (const o of list) this.#inflight.delete(o.id);
    this.kick();
  }

  /** Idempotent. */
  close(): void {
    this.#closed = true;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    for (const a of this.#inflight.values()) a.abort(new Error('the worker is shutting down'));
    this.#inflight.clear();
    this.#httpAgent.destroy();
    this.#httpsAgent.destroy();
  }
}
