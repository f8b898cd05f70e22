// The federation as this router knows it, from the `clusters` messages of its feeds
// (contract.ts): which cluster owns a sandbox-id tag, and where that cluster's ingress listener
// is. With it the edge sends a request for another cluster's sandbox straight to that cluster's
// ingress (Envoy's `ingress` upstream, ORIGINAL_DST on x-asb-dst), with no lookup per request.
//
// Each feed's latest message replaces that feed's last one; the registry is their union (a
// router normally has one feed, its own cluster's worker). The hub counts as connected while
// some feed that is up says so: a worker whose feed dropped cannot vouch for its hub link.
//
// Ingress addresses are `host:port`. Envoy's ORIGINAL_DST needs an IP, so a DNS name is resolved
// here: at once when it first appears, then every 30 s (DNS changes of a cluster's load balancer
// take minutes; a lookup per request would put DNS on the hot path). The last good answer is kept
// through failed refreshes; a name that never resolved makes requests for that cluster a 503
// naming it. IP literals need no lookup.
import { lookup } from 'node:dns/promises';
import { isIP } from 'node:net';
import type { Clock, Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import type { ClusterRoute, ClustersMessage } from './contract.ts';

/** How often a DNS-named ingress address is looked up again. */
export const INGRESS_REFRESH_MS = 30_000;

export interface ClusterRegistryOptions {
  clock: Clock;
  log: Logger;
  /** Host name → one IP address. Default: node:dns lookup (getaddrinfo: /etc/hosts, then DNS). */
  resolve?: (host: string) => Promise<string>;
  /** Default INGRESS_REFRESH_MS. */
  refreshMs?: number;
  /** Every failed lookup (metrics). */
  onResolveError?: (address: string) => void;
}

/** Where to send a request for a cluster: its ingress as `ip:port` (IPv6 bracketed), or why not. */
export type IngressTarget = { ok: true; destination: string } | { ok: false; reason: string };

interface FeedView {
  message: ClustersMessage;
  /** The feed's connection is up (its hubConnected still holds). */
  up: boolean;
}

interface Resolution {
  host: string;
  port: string;
  /** Last good `ip:port`. */
  destination: string | undefined;
  /** Why the last lookup failed (cleared by a good one). */
  error: string | undefined;
  timer: Timer | undefined;
}

export class ClusterRegistry {
  readonly #opts: ClusterRegistryOptions;
  readonly #log: Logger;
  readonly #resolve: (host: string) => Promise<string>;
  readonly #feeds = new Map<string, FeedView>();
  #byName = new Map<string, ClusterRoute>();
  #byTag = new Map<string, string>();
  /** ingressAddress → its resolution; only addresses some known cluster uses. */
  readonly #ingress = new Map<string, Resolution>();
  #closed = false;

  constructor(opts: ClusterRegistryOptions) {
    this.#opts = opts;
    this.#log = opts.log;
    this.#resolve = opts.resolve ?? resolveHost;
  }

  /** Takes `feed`'s latest clusters message. 'foreign' (ignored) when it names another cluster as its own. */
  apply(feed: string, message: ClustersMessage): 'applied' | 'foreign' {
    if (message.self !== feed) return 'foreign';
    this.#feeds.set(feed, { message, up: true });
    this.#rebuild();
    return 'applied';
  }

  /** `feed`'s connection dropped: its clusters stay known, its word on the hub link does not. */
  feedDown(feed: string): void {
    const view = this.#feeds.get(feed);
    if (view !== undefined) view.up = false;
  }

  /** Some connected worker's sync link to the hub is up. */
  get hubConnected(): boolean {
    for (const view of this.#feeds.values()) if (view.up && view.message.hubConnected) return true;
    return false;
  }

  /** Some worker's last word, connected or not, was that its hub link is up: a hub exists and was reachable. */
  get hubLastSeen(): boolean {
    for (const view of this.#feeds.values()) if (view.message.hubConnected) return true;
    return false;
  }

  /** The cluster whose sandbox ids start with `tag`. */
  clusterOfTag(tag: string): string | undefined {
    return this.#byTag.get(tag);
  }

  cluster(name: string): ClusterRoute | undefined {
    return this.#byName.get(name);
  }

  clusters(): ClusterRoute[] {
    return [...this.#byName.values()];
  }

  /** Where requests for `name`'s sandboxes go: its ingress listener's address, resolved. */
  ingress(name: string): IngressTarget {
    const cluster = this.#byName.get(name);
    if (cluster === undefined) return { ok: false, reason: `cluster ${name} is not in the federation this edge knows` };
    if (cluster.ingressAddress === '') return { ok: false, reason: `cluster ${name} has no ingress address; set spec.ingressAddress on its Cluster object at the hub` };
    const res = this.#ingress.get(cluster.ingressAddress);
    if (res === undefined) return { ok: false, reason: `the ingress address "${cluster.ingressAddress}" of cluster ${name} is not host:port` };
    if (res.destination !== undefined) return { ok: true, destination: res.destination };
    if (res.error !== undefined) return { ok: false, reason: `the ingress address ${cluster.ingressAddress} of cluster ${name} does not resolve: ${res.error}` };
    return { ok: false, reason: `the ingress address ${cluster.ingressAddress} of cluster ${name} is still being resolved` };
  }

  /** Stops refreshing. Idempotent. */
  close(): void {
    this.#closed = true;
    for (const res of this.#ingress.values()) res.timer?.cancel();
    this.#ingress.clear();
  }

  #rebuild(): void {
    const byName = new Map<string, ClusterRoute>();
    for (const view of this.#feeds.values()) for (const c of view.message.clusters) byName.set(c.name, c);
    const byTag = new Map<string, string>();
    for (const c of byName.values()) if (c.tag !== '') byTag.set(c.tag, c.name);
    this.#byName = byName;
    this.#byTag = byTag;
    const wanted = new Set<string>();
    for (const c of byName.values()) if (c.ingressAddress !== '') wanted.add(c.ingressAddress);
    for (const [address, res] of this.#ingress) {
      if (wanted.has(address)) continue;
      res.timer?.cancel();
      this.#ingress.delete(address);
    }
    for (const address of wanted) if (!this.#ingress.has(address)) this.#track(address);
  }

  #track(address: string): void {
    const parsed = splitHostPort(address);
    if (parsed === undefined) {
      this.#log.warn({ address }, 'ingress address is not host:port; requests for its cluster will get 503');
      return;
    }
    const res: Resolution = { ...parsed, destination: undefined, error: undefined, timer: undefined };
    this.#ingress.set(address, res);
    if (isIP(parsed.host) !== 0) {
      res.destination = joinHostPort(parsed.host, parsed.port);
      return;
    }
    this.#lookup(address, res);
  }

  #lookup(address: string, res: Resolution): void {
    if (this.#closed) return;
    this.#resolve(res.host).then(
      (ip) => {
        if (this.#ingress.get(address) !== res) return;
        const destination = joinHostPort(ip, res.port);
        if (destination !== res.destination) this.#log.info({ address, destination }, 'ingress address resolved');
        res.destination = destination;
        res.error = undefined;
        this.#schedule(address, res);
      },
      (err: unknown) => {
        if (this.#ingress.get(address) !== res) return;
        res.error = err instanceof Error ? err.message : String(err);
        this.#opts.onResolveError?.(address);
        this.#log.warn({ address, err: res.error, keeping: res.destination ?? null }, 'ingress address lookup failed');
        this.#schedule(address, res);
      },
    );
  }

  #schedule(address: string, res: Resolution): void {
    if (this.#closed) return;
    res.timer = this.#opts.clock.after(this.#opts.refreshMs ?? INGRESS_REFRESH_MS, () => this.#lookup(address, res));
  }
}

async function resolveHost(host: string): Promise<string> {
  return (await lookup(host)).address;
}

/** `host:port` or `[v6]:port` → parts; undefined when there is no valid port. */
export function splitHostPort(address: string): { host: string; port: string } | undefined {
  const m = /^(?:\[([^\]]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(address);
  const host = m?.[1] ?? m?.[2];
  const port = m?.[3];
  if (host === undefined || port === undefined || Number(port) < 1 || Number(port) > 65535) return undefined;
  return { host, port };
}

/** `ip:port`, IPv6 bracketed: the form Envoy's ORIGINAL_DST reads from x-asb-dst. */
export function joinHostPort(ip: string, port: number | string): string {
  return ip.includes(':') ? `[${ip}]:${port}` : `${ip}:${port}`;
}
