// The federation part of the route feed (feed.ts): the `clusters` message, sent after every
// snapshot and again whenever the worker's copies of the hub's Cluster objects change or its hub
// link goes up or down (the whole registry; it replaces the last one). Clusters are listed and
// watched on their own, and a broken Cluster watch only relists them: a clusters message carries
// no version, so no router has to resync its route entries for it. The hub link is polled once per
// second (a SyncAgent status read is a few property reads), and a message goes out only when its
// text changed, so an idle worker sends nothing.
import { ClusterType, type Cluster, type ClusterSpec } from '../../api/hub-contract.ts';
import type { ClusterRoute, ClustersMessage } from '../../router/contract.ts';
import type { ObjectStore, Watch } from '../../store/store.ts';
import type { Clock, Timer } from '../../base/clock.ts';
import type { Logger } from '../../base/log.ts';

const RELIST_BASE_MS = 100;
const RELIST_MAX_MS = 5000;
const DEFAULT_HUB_POLL_MS = 1000;

export interface ClustersFeedOptions {
  store: ObjectStore;
  /** This worker cluster's name (the message's `self`). */
  cluster: string;
  log: Logger;
  clock: Clock;
  /** Whether the worker's sync link to the hub is up now. Absent: the worker has no hub (always false). */
  hubConnected?: (() => boolean) | undefined;
  /** How often hubConnected is read. Default 1 000 ms: the edge stops sending creates to a lost hub within ~1 s. */
  hubPollMs?: number | undefined;
  /** Called with the clusters message's text each time it changes: the feed sends it to every router. */
  onChange: (text: string) => void;
}

/** The clusters message as routers get it now, kept up to date from the store and the hub link. */
export class ClustersFeed {
  readonly #opts: ClustersFeedOptions;
  /** name → the cluster as routers need it, from the Cluster objects in the store. */
  #clusters = new Map<string, ClusterRoute>();
  #watch: Watch | undefined;
  #retry: Timer | undefined;
  #failures = 0;
  #hubConnected = false;
  #hubPoll: Timer | undefined;
  /** The clusters message as last sent (sent again only when this text changes). */
  #text = '';
  #closed = false;

  constructor(opts: ClustersFeedOptions) {
    this.#opts = opts;
  }

  /** Lists and starts watching the Cluster objects, reads the hub link and starts polling it. */
  async start(): Promise<void> {
    await this.#sync();
    this.#hubConnected = this.#opts.hubConnected?.() ?? false;
    this.#text = JSON.stringify(this.message());
    this.#pollHub();
  }

  /** The clusters message as last sent. */
  get text(): string {
    return this.#text;
  }

  /** The federation as routers get it now. */
  message(): ClustersMessage {
    const clusters = [...this.#clusters.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    return { type: 'clusters', self: this.#opts.cluster, hubConnected: this.#hubConnected, clusters };
  }

  /** Idempotent: stops the watch, its relist and the hub poll. */
  close(): void {
    this.#closed = true;
    this.#watch?.close();
    this.#retry?.cancel();
    this.#hubPoll?.cancel();
  }

  async #sync(): Promise<void> {
    const items: Cluster[] = [];
    let resourceVersion = '';
    let token: string | undefined;
    do {
      const page = await this.#opts.store.list<Cluster>(ClusterType, token === undefined ? {} : { continue: token });
      items.push(...page.items);
      resourceVersion = page.resourceVersion;
      token = page.continue;
    } while (token !== undefined);
    if (this.#closed) return;
    this.#clusters = new Map(items.map((c) => [c.metadata.name, clusterRouteOf(c)]));
    this.#publish();
    this.#watch = this.#opts.store.watch<Cluster>(ClusterType, { resourceVersion }, {
      onEvent: (event) => {
        this.#failures = 0;
        if (event.type === 'BOOKMARK') return;
        if (event.type === 'DELETED') this.#clusters.delete(event.object.metadata.name);
        else this.#clusters.set(event.object.metadata.name, clusterRouteOf(event.object));
        this.#publish();
      },
      onError: (err) => {
        this.#watch = undefined;
        this.#opts.log.warn({ err }, 'cluster watch ended; relisting');
        this.#scheduleRelist();
      },
    });
  }

  #scheduleRelist(): void {
    if (this.#closed) return;
    const delay = Math.min(RELIST_MAX_MS, RELIST_BASE_MS * 2 ** Math.min(this.#failures, 16));
    this.#failures += 1;
    this.#retry = this.#opts.clock.after(delay, () => {
      this.#sync().catch((err: unknown) => {
        this.#opts.log.warn({ err }, 'cluster relist failed');
        this.#scheduleRelist();
      });
    });
  }

  #pollHub(): void {
    const read = this.#opts.hubConnected;
    if (read === undefined || this.#closed) return;
    this.#hubPoll = this.#opts.clock.after(this.#opts.hubPollMs ?? DEFAULT_HUB_POLL_MS, () => {
      const connected = read();
      if (connected !== this.#hubConnected) {
        this.#hubConnected = connected;
        this.#opts.log.info({ hubConnected: connected }, 'hub link changed; telling the routers');
        this.#publish();
      }
      this.#pollHub();
    });
  }

  /** Hands the clusters message to the feed if it differs from the last one sent. */
  #publish(): void {
    const text = JSON.stringify(this.message());
    if (text === this.#text) return;
    this.#text = text;
    this.#opts.onChange(text);
  }
}

/** A Cluster object as routers need it; fields a synced copy lacks get their neutral value. */
function clusterRouteOf(c: Cluster): ClusterRoute {
  const spec = (c.spec as Partial<ClusterSpec> | undefined) ?? {};
  return { name: c.metadata.name, tag: spec.tag ?? '', region: spec.region ?? '', ingressAddress: spec.ingressAddress ?? '', drain: spec.drain ?? false };
}
