// Sandbox id → namespace. The REST API addresses a sandbox by id alone, the store by
// (namespace, name); ids are unique per worker, so a map fed by a watch on every namespace
// answers in O(1). Misses fall back to the store (a create the watch has not delivered yet).
import type { Sandbox } from '../api/types.ts';
import { SandboxType } from '../api/types.ts';
import type { ObjectStore, Watch } from '../store/store.ts';
import type { Clock, Timer } from '../system/clock.ts';
import type { Logger } from '../system/log.ts';

export class SandboxIndex {
  readonly #store: ObjectStore;
  readonly #log: Logger;
  readonly #clock: Clock;
  #namespaces = new Map<string, string>();
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
    const known = this.#namespaces.get(id);
    const candidates = known === undefined ? fallbackNamespaces : [known];
    for (const ns of candidates) {
      const found = await this.#store.tryGet<Sandbox>(SandboxType, ns, id);
      if (found !== undefined) {
        this.#namespaces.set(id, ns);
        return found;
      }
    }
    return undefined;
  }

  /** Whether a sandbox with this id exists, as far as the watch has seen (no store read). */
  has(id: string): boolean {
    return this.#namespaces.has(id);
  }

  remember(id: string, namespace: string): void {
    this.#namespaces.set(id, namespace);
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#watch?.close();
    this.#retry?.cancel();
  }

  async #sync(): Promise<void> {
    const listed = await this.#store.list<Sandbox>(SandboxType);
    const next = new Map<string, string>();
    for (const s of listed.items) next.set(s.metadata.name, s.metadata.namespace ?? 'default');
    this.#namespaces = next;
    if (this.#closed) return;
    this.#watch = this.#store.watch<Sandbox>(SandboxType, { resourceVersion: listed.resourceVersion }, {
      onEvent: (event) => {
        this.#failures = 0;
        const { name, namespace } = event.object.metadata;
        if (event.type === 'DELETED') this.#namespaces.delete(name);
        else if (event.type !== 'BOOKMARK') this.#namespaces.set(name, namespace ?? 'default');
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
