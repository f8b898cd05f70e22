// What a request for an id the route table lacks may cost. Such a request, unauthenticated,
// makes the router ask the owning worker (GET /v1/sandboxes/{id}) before answering 404: that
// lookup exists for feed lag (a sandbox created a moment ago), but a client asking for random ids
// turned each request into a worker API call (the probe's L5: 300 requests, 300 lookups in
// 1.6 s). Confirmed misses are remembered by the route table (negative cache); fresh random ids
// never hit it, so two limits bound the rest:
// - per client (client-address.ts: the address Envoy saw), a token bucket: `burst` lookups at
//   once, refilled at `ratePerS`. Past it the router answers 429 itself, without a lookup.
// - in total, at most `maxInFlight` distinct ids being looked up at once (many addresses, or a
//   slow worker); past it 503. Requests for an id already being looked up join that lookup
//   (single flight, waker.ts) and cost nothing.
// Decisions are pure given the clock: tests drive the buckets with a manual one.
import { AsbError } from '../errors.ts';
import type { Clock } from '../base/clock.ts';
import { TokenBuckets } from '../base/token-buckets.ts';
import type { Decision } from './decide.ts';

export interface LookupLimits {
  /** Lookups a client may make at once. */
  burst: number;
  /** Lookups per second a client regains, up to burst. */
  ratePerS: number;
  /** Distinct ids being looked up at once, across all clients. */
  maxInFlight: number;
  /** Clients whose buckets are kept (least recently seen dropped first: a dropped client starts full). */
  maxClients: number;
}

/**
 * Defaults. A legitimate client looks an id up only when it asks for a sandbox in the moment
 * between its create and the route feed's upsert (milliseconds), so 20 at once and 5/s cover an
 * SDK creating and connecting to many sandboxes in parallel; the 300 random ids of the probe
 * cost at most 20 + 5/s. 64 in flight: a worker answers a lookup in ~1 ms, so that is thousands
 * per second at most, yet a burst from many addresses cannot queue unbounded calls. 100,000
 * buckets are ~10 MB.
 */
export const DEFAULT_LOOKUP_LIMITS: Readonly<LookupLimits> = Object.freeze({ burst: 20, ratePerS: 5, maxInFlight: 64, maxClients: 100_000 });

export type LookupRefusal =
  /** The client spent its budget: 429, retry after this many seconds. */
  | { reason: 'rate_limited'; retryAfterS: number }
  /** Too many lookups in flight in total: 503. */
  | { reason: 'busy'; retryAfterS: number };

export class LookupLimiter {
  readonly #buckets: TokenBuckets;
  readonly #maxInFlight: number;

  constructor(opts: { clock: Clock; limits?: Partial<LookupLimits> }) {
    const limits = { ...DEFAULT_LOOKUP_LIMITS, ...opts.limits };
    this.#buckets = new TokenBuckets({ clock: opts.clock, burst: limits.burst, ratePerS: limits.ratePerS, maxKeys: limits.maxClients });
    this.#maxInFlight = limits.maxInFlight;
  }

  /**
   * Whether `client` may start a new lookup while `inFlight` distinct ids are being looked up:
   * undefined (and one token spent) when it may, else why not. Call it only for a lookup that
   * would really go to a worker, not for one joining a lookup already in flight.
   */
  admit(client: string, inFlight: number): LookupRefusal | undefined {
    // The shared limit first: a refusal for everyone's sake must not spend this client's token.
    if (inFlight >= this.#maxInFlight) return { reason: 'busy', retryAfterS: 1 };
    const waitMs = this.#buckets.take(client);
    if (waitMs === 0) return undefined;
    return { reason: 'rate_limited', retryAfterS: Math.max(1, Math.ceil(waitMs / 1000)) };
  }
}

/** The router's own answer to a refused lookup: 429 or 503 with Retry-After, naming the id. */
export function lookupRefused(id: string, refusal: LookupRefusal): Decision {
  const error =
    refusal.reason === 'rate_limited'
      ? new AsbError('TooManyRequests', `too many requests for unknown sandboxes from this address; sandbox ${id} was not looked up, retry in ${refusal.retryAfterS} s`)
      : new AsbError('Unavailable', `too many sandbox lookups in flight; sandbox ${id} was not looked up, retry in ${refusal.retryAfterS} s`);
  return { kind: 'reject', error, retryAfterS: refusal.retryAfterS };
}
