// The set of valid API keys, held in memory and kept current by a watch on ApiKey objects, so a
// request is authenticated with one Map lookup and one constant-time compare: no store access.
//
// Revocation also reaches what a key already opened: a key that stops verifying (revoked, deleted,
// its hash replaced) or that now grants less (another team, no longer admin) is announced to the
// onRevoked listeners by prefix, so long-lived sessions it opened (terminals) can be closed. On a
// worker the ring follows its local store, which the hub sync agent writes (src/worker/sync/sync-apply.ts),
// so a revocation at the hub reaches the listeners within the sync bound.
import { timingSafeEqual } from 'node:crypto';
import type { ApiKey } from '../api/types.ts';
import { ApiKeyType } from '../api/types.ts';
import type { ObjectStore, Watch } from '../store/store.ts';
import type { Clock, Timer } from '../base/clock.ts';
import { systemClock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { hashApiKey, parseApiKey } from './keys.ts';

/** Who is calling: the team whose sandboxes the key may see, and whether it may change config. */
export interface Principal {
  team: string;
  admin: boolean;
  /** Public part of the key (asb_xxxxxxxx), safe to log. */
  prefix: string;
}

/** What a server needs of the key ring to authenticate a request and follow a key's revocation. */
export interface Authenticator {
  verify(presented: string): Principal | undefined;
  /** Whether the key with this prefix still verifies (a terminal token is good only while its key is). */
  live(prefix: string): boolean;
  /** Calls `listener` with a key's prefix once it is revoked (or grants less); returns the unsubscribe. */
  onRevoked(listener: (prefix: string) => void): () => void;
}

interface Entry {
  hash: Buffer;
  principal: Principal;
}

export interface KeyRingOptions {
  store: ObjectStore;
  log: Logger;
  clock?: Clock;
  /** First delay before re-listing after the watch ends; doubles up to maxBackoffMs. */
  backoffMs?: number;
  maxBackoffMs?: number;
}

export class KeyRing {
  readonly #store: ObjectStore;
  readonly #log: Logger;
  readonly #clock: Clock;
  readonly #backoffMs: number;
  readonly #maxBackoffMs: number;
  #entries = new Map<string, Entry>();
  #watch: Watch | undefined;
  #retry: Timer | undefined;
  #failures = 0;
  #closed = false;
  readonly #revokedListeners = new Set<(prefix: string) => void>();

  private constructor(opts: KeyRingOptions) {
    this.#store = opts.store;
    this.#log = opts.log.child({ component: 'keyring' });
    this.#clock = opts.clock ?? systemClock;
    // 100 ms first retry, capped at 5 s: a store hiccup heals fast; a long outage does not spin.
    this.#backoffMs = opts.backoffMs ?? 100;
    this.#maxBackoffMs = opts.maxBackoffMs ?? 5000;
  }

  /** Loads every key, then follows changes. Resolves once the first list is in memory. */
  static async open(opts: KeyRingOptions): Promise<KeyRing> {
    const ring = new KeyRing(opts);
    await ring.#sync();
    return ring;
  }

  /** The principal for a presented key, or undefined if it is malformed, unknown or revoked. */
  verify(presented: string): Principal | undefined {
    const parsed = parseApiKey(presented);
    if (parsed === undefined) return undefined;
    const entry = this.#entries.get(parsed.prefix);
    if (entry === undefined) return undefined;
    const hash = Buffer.from(hashApiKey(presented), 'hex');
    if (hash.length !== entry.hash.length || !timingSafeEqual(hash, entry.hash)) return undefined;
    return entry.principal;
  }

  /** Whether the key with this prefix still verifies: what it issued (a terminal token) is good only while it does. */
  live(prefix: string): boolean {
    // Entries are keyed by the object's name, the prefix without its `asb_`.
    const name = prefix.startsWith('asb_') ? prefix.slice(4) : prefix;
    return this.#entries.get(name)?.principal.prefix === prefix;
  }

  /**
   * Calls `listener` with a key's prefix each time a key that verified stops verifying or now
   * grants less (see the top of the file). Returns the unsubscribe.
   */
  onRevoked(listener: (prefix: string) => void): () => void {
    this.#revokedListeners.add(listener);
    return () => this.#revokedListeners.delete(listener);
  }

  /** Number of usable (not revoked) keys held. */
  get size(): number {
    return this.#entries.size;
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#watch?.close();
    this.#retry?.cancel();
  }

  async #sync(): Promise<void> {
    const listed = await this.#store.list<ApiKey>(ApiKeyType);
    const next = new Map<string, Entry>();
    for (const key of listed.items) this.#put(next, key);
    const before = this.#entries;
    this.#entries = next;
    // A re-list after the watch broke: changes the watch missed are announced here.
    for (const [name, entry] of before) this.#announce(entry, next.get(name));
    if (this.#closed) return;
    this.#watch = this.#store.watch<ApiKey>(ApiKeyType, { resourceVersion: listed.resourceVersion }, {
      onEvent: (event) => {
        this.#failures = 0;
        if (event.type === 'BOOKMARK') return;
        const name = event.object.metadata.name;
        const before = this.#entries.get(name);
        if (event.type === 'DELETED') this.#entries.delete(name);
        else this.#put(this.#entries, event.object);
        if (before !== undefined) this.#announce(before, this.#entries.get(name));
      },
      onError: (err) => {
        this.#log.warn({ err }, 'API key watch ended; re-listing');
        this.#scheduleResync();
      },
    });
  }

  /** Tells the listeners when `after` (undefined: gone) grants less than `before` did. */
  #announce(before: Entry, after: Entry | undefined): void {
    const less =
      after === undefined ||
      !after.hash.equals(before.hash) ||
      after.principal.team !== before.principal.team ||
      (before.principal.admin && !after.principal.admin);
    if (!less) return;
    for (const listener of this.#revokedListeners) {
      try {
        listener(before.principal.prefix);
      } catch (err) {
        this.#log.error({ err, prefix: before.principal.prefix }, 'a key revocation listener failed');
      }
    }
  }

  #scheduleResync(): void {
    if (this.#closed) return;
    const delay = Math.min(this.#maxBackoffMs, this.#backoffMs * 2 ** this.#failures);
    this.#failures += 1;
    this.#retry = this.#clock.after(delay, () => {
      this.#sync().catch((err: unknown) => {
        this.#log.warn({ err }, 'API key re-list failed');
        this.#scheduleResync();
      });
    });
  }

  #put(into: Map<string, Entry>, key: ApiKey): void {
    const name = key.metadata.name;
    const spec = key.spec;
    if (spec.revoked === true || key.metadata.deletionTimestamp !== undefined || !/^[0-9a-f]{64}$/.test(spec.hash)) {
      into.delete(name);
      return;
    }
    into.set(name, {
      hash: Buffer.from(spec.hash, 'hex'),
      principal: Object.freeze({ team: spec.team, admin: spec.admin === true, prefix: spec.prefix }),
    });
  }
}
