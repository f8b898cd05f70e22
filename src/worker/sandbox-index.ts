// Sandbox id → namespace. The REST API addresses a sandbox by id alone, the store by
// (namespace, name); an id names one sandbox per cluster (sandbox-identity.ts), so a map fed by a
// watch on every namespace answers in O(1). Misses fall back to the store (a create the watch has
// not delivered yet). Objects that share a name are all kept, and lookups go to the holder, so
// a second object under a taken id never reaches the first one's pod, whatever the event order:
// when the runtime has a pod (or kept volumes) for the id, the lookup answers the object it was
// made for, or nothing, never another object that would reach it (sandbox-identity.ts rule 1).
import { IdHolders } from '../api/sandbox-identity.ts';
import type { Sandbox } from '../api/types.ts';
import { SandboxType } from '../api/types.ts';
import type { ObjectStore, Watch } from '../store/store.ts';
import type { Clock, Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';

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

  readonly #podUidOf: (id: string) => string | undefined;

  private constructor(store: ObjectStore, log: Logger, clock: Clock, podUidOf: (id: string) => string | undefined) {
    this.#store = store;
    this.#log = log;
    this.#clock = clock;
    this.#podUidOf = podUidOf;
  }

  /** `podUidOf`: the uid the runtime's pod or kept volumes for an id were made for (PodState.uid). */
  static async open(store: ObjectStore, log: Logger, clock: Clock, podUidOf: (id: string) => string | undefined): Promise<SandboxIndex> {
    const index = new SandboxIndex(store, log, clock, podUidOf);
    await index.#sync();
    return index;
  }

  /** The sandbox with this id, wherever it lives, or undefined. */
  async find(id: string, fallbackNamespaces: readonly string[]): Promise<Sandbox | undefined> {
    const podUid = this.#podUidOf(id);
    const known = this.#holders.holderFor(id, podUid);
    const found = known !== undefined ? await this.#store.tryGet<Sandbox>(SandboxType, known.namespace, id) : await this.#fromStore(id, fallbackNamespaces);
    // Never an object whose id reaches a pod made for another one.
    return found === undefined || (podUid !== undefined && found.metadata.uid !== podUid) ? undefined : found;
  }

  async #fromStore(id: string, namespaces: readonly string[]): Promise<Sandbox | undefined> {
    for (const ns of namespaces) {
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
