// Counted slots per key and on the whole worker: what one key (a tenant's key, a sandbox) may hold
// at once of something the worker has only so much of. Pure counting, no waiting: over a bound
// the caller is told which one, and refuses (429) rather than queues (a queue would hold the
// request's socket for an unknown time).

export interface SlotBounds {
  perKey: number;
  total: number;
}

export type Admission =
  | { kind: 'admitted'; release: () => void }
  | { kind: 'refused'; scope: 'key' | 'worker'; limit: number };

export class Slots {
  readonly #bounds: SlotBounds;
  readonly #byKey = new Map<string, number>();
  #total = 0;

  constructor(bounds: SlotBounds) {
    this.#bounds = bounds;
  }

  /** Slots held, for a key or (without one) in all. */
  inFlight(key?: string): number {
    return key === undefined ? this.#total : this.#byKey.get(key) ?? 0;
  }

  /** A slot for `key`, or which bound refused it. release() is idempotent. */
  admit(key: string): Admission {
    const held = this.#byKey.get(key) ?? 0;
    if (held >= this.#bounds.perKey) return { kind: 'refused', scope: 'key', limit: this.#bounds.perKey };
    if (this.#total >= this.#bounds.total) return { kind: 'refused', scope: 'worker', limit: this.#bounds.total };
    this.#byKey.set(key, held + 1);
    this.#total++;
    let released = false;
    return {
      kind: 'admitted',
      release: () => {
        if (released) return;
        released = true;
        this.#total--;
        const left = (this.#byKey.get(key) ?? 1) - 1;
        if (left === 0) this.#byKey.delete(key);
        else this.#byKey.set(key, left);
      },
    };
  }
}
