// Sandbox id → namespace. The REST API addresses a sandbox by id alone, the store by
// (namespace, name); an id names one sandbox per cluster (sandbox-identity.ts), so a map fed by a
// watch on every namespace answers in O(1). Misses fall back to the store (a create the watch has
// not delivered yet). Objects that share a name are all kept, and lookups go to the holder, so
// a second object under a taken id never reaches the first one's pod, whatever the event order.
import { IdHolders } from '../api/sandbox-identity.ts';
import type { Sandbox } from '../api/types.ts';
import { SandboxType } from '../api/types.ts';
import type { ObjectStore, Watch } from '../store/store.ts';
import type { Clock, Timer } from '../system/clock.ts';
import type { Logger } from '../system/log.ts';

export class SandboxIndex {
  readonly #store: ObjectStore;
  readonly #log: Logger;
  readonly #clock: Clock;
  readonly #holders = new IdHolders();
  /** Ids an apply is creating right now: taken before its write, so two applies cannot both pass. */
  readonly #reserved = new Set<string>();
  #watch: Watch | undefined;
  #retry: Timer | undefined;
  #failures = 0;
  #closed = false;

  private constructor(store: ObjectStore, log: Logger, clock: Clock) {
    this.#store = store;
    this.#log = log;
    this.#clock = clock;
  }

  static async open(store: ObjectStore, log: Logger, clock: Clock): Promise<SandboxIndex> {
    const index = new SandboxIndex(store, log, clock);
    await index.#sync();
    return index;
  }

  /** The sandbox with this id, wherever it lives, or undefined. */
  async find(id: string, fallbackNamespaces: readonly string[]): Promise<Sandbox | undefined> {
    const known = this.#holders.holder(id);
    if (known !== undefined) return this.#store.tryGet<Sandbox>(SandboxType, known.namespace, id);
    for (const ns of fallbackNamespaces) {
      const found = await this.#store.tryGet<Sandbox>(SandboxType, ns, id);
      if (found !== undefined) {
        this.remember(found);
        return found;
      }
    }
    return undefined;
  }

  /** Whether a sandbox with this id exists, as far as the watch has seen (no store read). */
  has(id: string): boolean {
    return this.#holders.holder(id) !== undefined;
  }

  /**
   * Takes `id` for a create that is about to be written; undefined when a sandbox has it or
   * another create is taking it. Synchronous, so check and take are one step on this worker.
   * The returned function gives the reservation back (after the write, or when it failed).
   */
  reserve(id: string): (() => void) | undefined {
    if (this.has(id) || this.#reserved.has(id)) return undefined;
    this.#reserved.add(id);
    return () => this.#reserved.delete(id);
  }

  remember(sandbox: Sandbox): void {
    this.#holders.remember(sandbox);
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#watch?.close();
    this.#retry?.cancel();
  }

  async #sync(): Promise<void> {
    const listed = await this.#store.list<Sandbox>(SandboxType);
    this.#holders.clear();
    for (const s of listed.items) this.#holders.remember(s);
    if (this.#closed) return;
    this.#watch = this.#store.watch<Sandbox>(SandboxType, { resourceVersion: listed.resourceVersion }, {
      onEvent: (event) => {
        this.#failures = 0;
        if (event.type === 'DELETED') this.#holders.forget(event.object);
        else if (event.type !== 'BOOKMARK') this.#holders.remember(event.object);
      },
      onError: (err) => {
        this.#log.warn({ err }, 'sandbox watch ended; re-listing');
        this.#scheduleResync();
      },
    });
  }

  #scheduleResync(): void {
    if (this.#closed) return;
    // 100 ms doubling to 5 s, as for the key ring.
    const delay = Math.min(5000, 100 * 2 ** this.#failures);
    this.#failures += 1;
    this.#retry = this.#clock.after(delay, () => {
      this.#sync().catch((err: unknown) => {
        this.#log.warn({ err }, 'sandbox re-list failed');
        this.#scheduleResync();
      });
    });
  }
}
