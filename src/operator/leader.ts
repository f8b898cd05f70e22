// Leader election over a coordination.k8s.io/v1 Lease, so that of several operator processes
// on one cluster (a Deployment rollout, a second replica) only one runs the controllers.
//
// The protocol is client-go's (tools/leaderelection), which other operators on the same cluster
// already follow:
// - The holder renews the Lease every renewIntervalMs (2 s) with a compare-and-swap PUT on its
//   resourceVersion, so two candidates can never both take it. It writes on the Lease its last
//   renewal returned, without reading it first (client-go's fast path: one request per renewal,
//   not two), and reads it only when that write fails (another writer: 409).
// - A candidate takes the Lease when it is free (no holder: released) or when its record has not
//   changed for leaseDurationSeconds (10 s) as measured on the candidate's own clock from when it
//   first saw that record: no comparison of clocks across machines.
// - The holder gives up when no renewal has succeeded for renewDeadlineMs (7 s), counted from
//   when the last successful renewal was sent. 7 s < 10 s: it stops before any candidate can see
//   the Lease expire, with 3 s to stop its controllers (every write they make is still a
//   compare-and-swap, so one that overlaps the next leader fails rather than corrupts).
// - close() stops leading, then releases the Lease (holder cleared), so a graceful restart hands
//   over at the next candidate's try instead of after 10 s.
// After losing the Lease the process goes back to being a candidate (it does not exit: with
// --role=all the API in the same process keeps serving).
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import { Gauge, type Registry } from 'prom-client';
import { AsbError } from '../errors.ts';
import type { ResourceType } from '../api/meta.ts';
import { kubeError } from '../store/kube-errors.ts';
import type { KubeResponse } from '../store/kube-http.ts';
import type { Clock, Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';

/** The part of the kube store's transport (KubeHttp) the elector uses. */
export interface LeaseTransport {
  request(method: string, path: string, body?: string): Promise<KubeResponse>;
}

export interface LeaderElectionOptions {
  http: LeaseTransport;
  /** Where the Lease lives; the operator's ServiceAccount may write Leases only there. */
  namespace: string;
  /** The Lease's name; every candidate for the same job must use the same one. */
  name: string;
  /** This candidate's name in spec.holderIdentity; default <hostname>_<random>. */
  identity?: string;
  /** Default 10 s. */
  leaseDurationMs?: number;
  /** How often the holder renews and a candidate retries; default 2 s. */
  renewIntervalMs?: number;
  /** The holder stops leading when it could not renew for this long; default 7 s, below leaseDurationMs. */
  renewDeadlineMs?: number;
  clock: Clock;
  log: Logger;
  registry?: Registry;
  /** Called on taking the Lease; leadership counts from its start (it is not awaited before renewing). */
  onStartedLeading(): Promise<void>;
  /** Called on losing or releasing it; the Lease is released only after this resolves. */
  onStoppedLeading(): Promise<void>;
}

interface LeaseSpec {
  holderIdentity?: string;
  leaseDurationSeconds?: number;
  acquireTime?: string;
  renewTime?: string;
  leaseTransitions?: number;
}

interface Lease {
  apiVersion: 'coordination.k8s.io/v1';
  kind: 'Lease';
  metadata: { name: string; namespace: string; resourceVersion?: string };
  spec?: LeaseSpec;
}

const LeaseType: ResourceType = { group: 'coordination.k8s.io', version: 'v1', kind: 'Lease', plural: 'leases', namespaced: true };

const DEFAULT_LEASE_MS = 10_000;
const DEFAULT_RENEW_INTERVAL_MS = 2_000;
const DEFAULT_RENEW_DEADLINE_MS = 7_000;
// Candidates retry at the renew interval plus up to this share of it, so two that started
// together do not keep colliding on the same PUT (client-go's JitterFactor is 1.2; ours keeps
// takeover quicker).
const RETRY_JITTER = 0.5;

/** metav1.MicroTime: RFC 3339 with exactly six fractional digits. */
function microTime(ms: number): string {
  return new Date(ms).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
}

function defaultIdentity(): string {
  return `${hostname()}_${randomBytes(4).toString('hex')}`;
}

export class LeaderElector {
  readonly identity: string;
  #o: LeaderElectionOptions;
  #path: string;
  #leaseMs: number;
  #intervalMs: number;
  #deadlineMs: number;
  #log: Logger;
  #gauge: Gauge | undefined;
  #leading = false;
  /** The holder as last read, for /healthz and tests; '' when free. */
  #holder = '';
  /** The record as last seen and when (our clock), for judging expiry without comparing clocks. */
  #observed: { json: string; at: number; durationMs: number } | undefined;
  /** When the last successful renewal was sent; the deadline counts from here. */
  #renewedAt = 0;
  /** The Lease as our last successful write returned it, while we lead: the next renewal's base. */
  #held: Lease | undefined;
  #tick: Timer | undefined;
  #deadline: Timer | undefined;
  #attempt: Promise<void> | undefined;
  /** Leadership changes run one after another: a stop never overtakes the start it undoes. */
  #transitions: Promise<void> = Promise.resolve();
  #closed = false;
  #closing: Promise<void> | undefined;

  constructor(opts: LeaderElectionOptions) {
    this.#o = opts;
    this.identity = opts.identity ?? defaultIdentity();
    this.#leaseMs = opts.leaseDurationMs ?? DEFAULT_LEASE_MS;
    this.#intervalMs = opts.renewIntervalMs ?? DEFAULT_RENEW_INTERVAL_MS;
    this.#deadlineMs = opts.renewDeadlineMs ?? DEFAULT_RENEW_DEADLINE_MS;
    if (this.#deadlineMs >= this.#leaseMs) {
      throw new AsbError('BadRequest', `leader election: renewDeadlineMs (${this.#deadlineMs}) must be below leaseDurationMs (${this.#leaseMs}), or two leaders could overlap`);
    }
    this.#path = `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(opts.namespace)}/leases/${encodeURIComponent(opts.name)}`;
    this.#log = opts.log.child({ component: 'leader-election', lease: `${opts.namespace}/${opts.name}`, identity: this.identity });
    if (opts.registry !== undefined) {
      this.#gauge = new Gauge({ name: 'asb_operator_leader', help: '1 while this process holds the operator Lease and runs the controllers', registers: [opts.registry] });
      this.#gauge.set(0);
    }
  }

  /** Starts campaigning; the first try is immediate. */
  start(): void {
    if (this.#closed || this.#tick !== undefined || this.#attempt !== undefined) return;
    this.#run();
  }

  isLeader(): boolean {
    return this.#leading;
  }

  /** The holder as last read ('' when the Lease is free or not read yet). */
  holder(): string {
    return this.#holder;
  }

  #run(): void {
    if (this.#closed) return;
    const attempt = this.#tryAcquireOrRenew().catch((err: unknown) => {
      this.#log.warn({ err }, this.#leading ? 'could not renew the Lease' : 'could not read or take the Lease');
    });
    this.#attempt = attempt;
    void attempt.finally(() => {
      this.#attempt = undefined;
      if (this.#closed) return;
      const wait = this.#leading ? this.#intervalMs : this.#intervalMs * (1 + Math.random() * RETRY_JITTER);
      this.#tick = this.#o.clock.after(wait, () => {
        this.#tick = undefined;
        this.#run();
      });
    });
  }

  async #tryAcquireOrRenew(): Promise<void> {
    const sentAt = this.#o.clock.now();
    const held = this.#held;
    if (this.#leading && held !== undefined) {
      const renewed = await this.#o.http.request('PUT', this.#path, JSON.stringify(this.#lease(held, held.spec)));
      if (renewed.status === 200) {
        this.#won(renewed.body as Lease, sentAt);
        return;
      }
      // Written by someone else since (or refused): read it and decide as a candidate would.
      if (this.#closed) return;
    }
    const got = await this.#o.http.request('GET', this.#path);
    if (this.#closed) return;
    if (got.status === 404) {
      const created = await this.#o.http.request('POST', this.#path.slice(0, this.#path.lastIndexOf('/')), JSON.stringify(this.#lease(undefined, undefined)));
      if (created.status === 201 || created.status === 200) this.#won(created.body as Lease, sentAt);
      else if (created.status !== 409) throw this.#error(created);
      return;
    }
    if (got.status !== 200) throw this.#error(got);
    const lease = got.body as Lease;
    const spec = lease.spec ?? {};
    this.#observe(spec);
    const holder = spec.holderIdentity ?? '';
    if (holder !== '' && holder !== this.identity) {
      const seen = this.#observed;
      if (seen !== undefined && seen.at + seen.durationMs > this.#o.clock.now()) {
        // Someone else holds a Lease that is still fresh.
        if (this.#leading) this.#lost(`the Lease is held by ${holder}`);
        return;
      }
      this.#log.info({ previous: holder }, 'the Lease expired; taking it');
    }
    const put = await this.#o.http.request('PUT', this.#path, JSON.stringify(this.#lease(lease, spec)));
    if (put.status === 200) this.#won(put.body as Lease, sentAt);
    // 409: someone else wrote it between our read and write; the next try reads theirs.
    else if (put.status !== 409) throw this.#error(put);
    else if (this.#leading) this.#log.warn('lost a race renewing the Lease; retrying');
  }

  /** The API server's refusal, converted as the kube store converts its own (kube-errors.ts). */
  #error(res: KubeResponse): AsbError {
    return kubeError({ rt: LeaseType, namespace: this.#o.namespace, name: this.#o.name }, res.status, res.body);
  }

  /** The Lease with us as the holder: a renewal keeps acquireTime and the transition count. */
  #lease(current: Lease | undefined, spec: LeaseSpec | undefined): Lease {
    const now = microTime(this.#o.clock.now());
    const ours = spec?.holderIdentity === this.identity;
    return {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: {
        name: this.#o.name,
        namespace: this.#o.namespace,
        ...(current?.metadata.resourceVersion === undefined ? {} : { resourceVersion: current.metadata.resourceVersion }),
      },
      spec: {
        holderIdentity: this.identity,
        leaseDurationSeconds: Math.ceil(this.#leaseMs / 1000),
        acquireTime: ours && spec.acquireTime !== undefined ? spec.acquireTime : now,
        renewTime: now,
        leaseTransitions: (spec?.leaseTransitions ?? 0) + (spec === undefined || ours ? 0 : 1),
      },
    };
  }

  #observe(spec: LeaseSpec): void {
    this.#holder = spec.holderIdentity ?? '';
    const json = JSON.stringify(spec);
    if (this.#observed?.json === json) return;
    this.#observed = { json, at: this.#o.clock.now(), durationMs: (spec.leaseDurationSeconds ?? Math.ceil(this.#leaseMs / 1000)) * 1000 };
  }

  #won(lease: Lease, sentAt: number): void {
    this.#observe(lease.spec ?? {});
    this.#held = lease;
    this.#renewedAt = sentAt;
    this.#deadline?.cancel();
    this.#deadline = this.#o.clock.after(Math.max(0, sentAt + this.#deadlineMs - this.#o.clock.now()), () => {
      this.#deadline = undefined;
      this.#lost(`no renewal succeeded for ${this.#deadlineMs} ms`);
    });
    if (this.#leading || this.#closed) return;
    this.#leading = true;
    this.#gauge?.set(1);
    this.#log.info('took the Lease: leading');
    this.#transition(() => this.#o.onStartedLeading());
  }

  #lost(why: string): void {
    this.#deadline?.cancel();
    this.#deadline = undefined;
    this.#held = undefined;
    if (!this.#leading) return;
    this.#leading = false;
    this.#gauge?.set(0);
    if (this.#closed) this.#log.info('closing: no longer leading');
    else this.#log.warn({ why, renewedAt: new Date(this.#renewedAt).toISOString() }, 'lost the Lease: stopping the controllers');
    this.#transition(() => this.#o.onStoppedLeading());
  }

  #transition(fn: () => Promise<void>): void {
    this.#transitions = this.#transitions.then(fn).catch((err: unknown) => {
      this.#log.error({ err }, 'leadership change failed');
    });
  }

  /** Stops campaigning; a leader stops leading, then releases the Lease. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#closed = true;
      this.#tick?.cancel();
      await this.#attempt;
      const wasLeading = this.#leading;
      this.#lost('closing');
      await this.#transitions;
      if (wasLeading) await this.#release();
    })();
    return this.#closing;
  }

  /** Clears the holder if it is still us, so the next candidate need not wait out the Lease. */
  async #release(): Promise<void> {
    try {
      const got = await this.#o.http.request('GET', this.#path);
      if (got.status !== 200) return;
      const lease = got.body as Lease;
      if (lease.spec?.holderIdentity !== this.identity) return;
      const now = microTime(this.#o.clock.now());
      const released: Lease = { ...lease, spec: { ...lease.spec, holderIdentity: '', leaseDurationSeconds: 1, acquireTime: now, renewTime: now } };
      const put = await this.#o.http.request('PUT', this.#path, JSON.stringify(released));
      if (put.status === 200) this.#log.info('released the Lease');
    } catch (err) {
      // The Lease simply expires in leaseDurationMs instead.
      this.#log.warn({ err }, 'could not release the Lease');
    }
  }
}
