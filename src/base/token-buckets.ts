// Token buckets per key: `burst` at once, refilled continuously at `ratePerS`, for anything that
// bounds how often one client (an address, a sandbox) may start something. Pure given the clock:
// tests drive it with a manual one.
import { LRUCache } from 'lru-cache';
import type { Clock } from './clock.ts';

interface Bucket {
  tokens: number;
  /** clock.now() when tokens was computed. */
  at: number;
}

/** One token bucket per key, refilled continuously; the least recently used keys are forgotten past `maxKeys`. */
export class TokenBuckets {
  readonly #clock: Clock;
  readonly #burst: number;
  readonly #perMs: number;
  readonly #buckets: LRUCache<string, Bucket>;

  constructor(opts: { clock: Clock; burst: number; ratePerS: number; maxKeys: number }) {
    if (!(opts.burst >= 1) || !(opts.ratePerS > 0) || !(opts.maxKeys >= 1)) throw new RangeError(`token buckets need burst ≥ 1, ratePerS > 0 and maxKeys ≥ 1, got ${opts.burst}, ${opts.ratePerS}, ${opts.maxKeys}`);
    this.#clock = opts.clock;
    this.#burst = opts.burst;
    this.#perMs = opts.ratePerS / 1000;
    this.#buckets = new LRUCache<string, Bucket>({ max: opts.maxKeys });
  }

  /** Takes one token from `key`'s bucket: 0 when taken, else the milliseconds until one is there. */
  take(key: string): number {
    const now = this.#clock.now();
    const bucket = this.#buckets.get(key) ?? { tokens: this.#burst, at: now };
    // A clock that steps back refills nothing rather than draining.
    bucket.tokens = Math.min(this.#burst, bucket.tokens + Math.max(0, now - bucket.at) * this.#perMs);
    bucket.at = now;
    this.#buckets.set(key, bucket);
    if (bucket.tokens >= 1) {
      bucket.tokens -= 1;
      return 0;
    }
    // Less a nanosecond of float error: 0.002 tokens at 2/s is 1 ms, not 1.0000000000000009.
    return Math.max(1, Math.ceil((1 - bucket.tokens) / this.#perMs - 1e-6));
  }

  /** Keys with a bucket (bounded by maxKeys). */
  get size(): number {
    return this.#buckets.size;
  }
}

