// The sandboxes' DNS resolver: UDP and TCP on the pods' gateway (port 53 in production; the
// kernel lets pods reach nothing else on the host). It knows each query's sandbox by source
// address, answers only what dns-answer.ts allows, and looks names up in a static table first
// (`hosts`: names the operator, or a test, pins to addresses) and then upstream (the node's own
// resolvers, via node:dns, or `servers`).
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { Resolver } from 'node:dns/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { Counter, type Registry } from 'prom-client';
import type { Logger } from '../base/log.ts';
import { filterAnswer, refuseName, wantsAddresses, type DnsAnswer, type Lookup } from './dns-answer.ts';
import { buildResponse, errorResponse, parseQuery, RCODE, UDP_LIMIT } from './dns-wire.ts';
import type { EgressPolicySource } from './egress-decision.ts';
import type { EgressFloor } from '../network/egress-floor.ts';

export interface DnsUpstream {
  lookup(name: string, family: 4 | 6): Promise<Lookup>;
}

/** node:dns toward the node's resolvers (or `servers`): 2 s per try, 2 tries. */
export function systemUpstream(servers?: readonly string[]): DnsUpstream {
  const resolver = new Resolver({ timeout: 2000, tries: 2 });
  if (servers !== undefined) resolver.setServers([...servers]);
  return {
    async lookup(name, family) {
      try {
        const records = family === 4 ? await resolver.resolve4(name, { ttl: true }) : await resolver.resolve6(name, { ttl: true });
        return { addresses: records.map((r) => r.address), ttlS: Math.min(...records.map((r) => r.ttl), 300) };
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'ENOTFOUND') return { addresses: 'nxdomain', ttlS: 0 };
        if (code === 'ENODATA') return { addresses: [], ttlS: 0 };
        throw err;
      }
    },
  };
}

/** A static table (exact names) in front of another upstream. */
export function withHosts(hosts: ReadonlyMap<string, readonly string[]>, next: DnsUpstream): DnsUpstream {
  return {
    lookup(name, family) {
      const pinned = hosts.get(name);
      if (pinned === undefined) return next.lookup(name, family);
      return Promise.resolve({ addresses: pinned.filter((ip) => (family === 4) === !ip.includes(':')), ttlS: 30 });
    },
  };
}

export interface DnsResolverOptions {
  source: EgressPolicySource;
  upstream: DnsUpstream;
  registry: Registry;
  log: Logger;
  /** Told every answer given (resolved-addresses.ts), so the proxy lets a name open only these addresses. */
  onAnswer?: (podIp: string, name: string, addresses: readonly string[], ttlS: number) => void;
  /** Lookups in flight at once; queries beyond are answered SERVFAIL (a flood must not queue without bound). Default 512. */
  maxInFlight?: number;
  /**
   * Lookups in flight at once for one sandbox (source address); beyond, SERVFAIL. Default 32: a
   * sandbox's flood of queries on one socket passes the kernel's per-flow bounds (connection-
   * limits.ts counts flows, not packets), and must not take the whole 512 from every other one.
   */
  maxInFlightPerSandbox?: number;
  /**
   * TCP connections open at once from all sandboxes; beyond, a new one is closed at once. Each
   * pod holds at most 32 (src/network/connection-limits.ts), but many pods at their bound must
   * still leave the worker its descriptors: 4,096 is a fifth of its 20,000. Default 4096.
   */
  maxTcpConnections?: number;
  /** Addresses never answered whatever the policy (src/network/egress-floor.ts). Default DEFAULT_FLOOR. */
  floor?: EgressFloor;
}

export class DnsResolver {
  readonly #opts: DnsResolverOptions;
  readonly #queries: Counter<'sandbox' | 'rule' | 'verdict'>;
  #udp: UdpSocket | undefined;
  #tcp: Server | undefined;
  readonly #conns = new Set<Socket>();
  #inFlight = 0;
  readonly #inFlightBySource = new Map<string, number>();
  #port = 0;

  constructor(opts: DnsResolverOptions) {
    this.#opts = opts;
    this.#queries = new Counter({
      name: 'asb_egress_dns_queries_total',
      help: 'Queries to the sandbox DNS resolver by sandbox, deciding rule and verdict (answered; refused: the name is not allowed; filtered: every address was denied; error).',
      labelNames: ['sandbox', 'rule', 'verdict'],
      registers: [opts.registry],
    });
  }

  get port(): number {
    return this.#port;
  }

  /** Binds UDP and TCP on host:port; port 0 picks a port free for both. */
  async listen(host: string, port: number): Promise<number> {
    for (let attempt = 0; ; attempt++) {
      const udp = createSocket({ type: host.includes(':') ? 'udp6' : 'udp4' });
      const bound = await new Promise<number>((resolve, reject) => {
        udp.once('error', reject);
        udp.bind(port, host, () => resolve(udp.address().port));
      });
      const tcp = createServer((s) => this.#onTcp(s));
      tcp.maxConnections = this.#opts.maxTcpConnections ?? 4096;
      try {
        await new Promise<void>((resolve, reject) => {
          tcp.once('error', reject);
          tcp.listen(bound, host, resolve);
        });
      } catch (err) {
        udp.close();
        // The kernel gave UDP a port TCP has in use: try another (port 0 only).
        if (port !== 0 || attempt >= 8) throw err;
        continue;
      }
      udp.on('message', (msg, rinfo) => {
        void this.#answer(msg, rinfo.address, UDP_LIMIT).then((res) => {
          if (res !== undefined) udp.send(res, rinfo.port, rinfo.address);
        });
      });
      udp.on('error', (err) => this.#opts.log.warn({ err }, 'DNS UDP socket error'));
      this.#udp = udp;
      this.#tcp = tcp;
      this.#port = bound;
      return bound;
    }
  }

  #onTcp(socket: Socket): void {
    this.#conns.add(socket);
    socket.on('close', () => this.#conns.delete(socket));
    socket.on('error', () => undefined);
    // A client that connects and says nothing is dropped after 10 s.
    socket.setTimeout(10_000, () => socket.destroy());
    let buf = Buffer.alloc(0);
    socket.on('data', (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      while (buf.length >= 2) {
        const len = buf.readUInt16BE(0);
        if (buf.length < 2 + len) break;
        const msg = buf.subarray(2, 2 + len);
        buf = buf.subarray(2 + len);
        void this.#answer(msg, socket.remoteAddress ?? '', undefined).then((res) => {
          if (res === undefined || socket.destroyed) return;
          const framed = Buffer.alloc(2 + res.length);
          framed.writeUInt16BE(res.length, 0);
          res.copy(framed, 2);
          socket.write(framed);
        });
      }
    });
  }

  async #answer(msg: Buffer, from: string, limit: number | undefined): Promise<Buffer | undefined> {
    const parsed = parseQuery(msg);
    if (parsed === undefined) return undefined;
    if (!parsed.ok) return errorResponse(parsed.id, parsed.rcode);
    const q = parsed.question;
    const ip = from.startsWith('::ffff:') ? from.slice(7) : from;
    const policy = this.#opts.source.policyForPodIp(ip);
    const sandbox = this.#opts.source.sandboxForPodIp?.(ip) ?? ip;
    const count = (a: Pick<DnsAnswer, 'rule' | 'verdict'> | { rule: string; verdict: 'error' }): void => this.#queries.inc({ sandbox, rule: a.rule, verdict: a.verdict });
    const refused = refuseName(policy, q.name);
    if (refused !== undefined || policy === undefined) {
      const a = refused ?? { rcode: RCODE.refused, addresses: [], ttlS: 0, rule: 'unknown-source', verdict: 'refused' as const };
      count(a);
      return buildResponse(q, a.rcode, [], 0, limit);
    }
    const family = wantsAddresses(q.qtype);
    if (family === undefined || q.qclass !== 1) {
      count({ rule: 'non-address-type', verdict: 'answered' });
      return buildResponse(q, RCODE.noError, [], 0, limit);
    }
    if (this.#inFlight >= (this.#opts.maxInFlight ?? 512)) {
      count({ rule: 'overloaded', verdict: 'error' });
      return buildResponse(q, RCODE.servFail, [], 0, limit);
    }
    const mine = this.#inFlightBySource.get(ip) ?? 0;
    if (mine >= (this.#opts.maxInFlightPerSandbox ?? 32)) {
      count({ rule: 'sandbox-overloaded', verdict: 'error' });
      return buildResponse(q, RCODE.servFail, [], 0, limit);
    }
    this.#inFlight++;
    this.#inFlightBySource.set(ip, mine + 1);
    try {
      const a = filterAnswer(policy, q.name, await this.#opts.upstream.lookup(q.name, family), this.#opts.floor);
      count(a);
      this.#opts.onAnswer?.(ip, q.name, a.addresses, a.ttlS);
      return buildResponse(q, a.rcode, a.addresses, a.ttlS, limit);
    } catch (err) {
      this.#opts.log.debug({ err, name: q.name }, 'upstream DNS lookup failed');
      count({ rule: 'upstream-error', verdict: 'error' });
      return buildResponse(q, RCODE.servFail, [], 0, limit);
    } finally {
      this.#inFlight--;
      const left = (this.#inFlightBySource.get(ip) ?? 1) - 1;
      if (left === 0) this.#inFlightBySource.delete(ip);
      else this.#inFlightBySource.set(ip, left);
    }
  }

  /** Idempotent. */
  async close(): Promise<void> {
    const udp = this.#udp;
    const tcp = this.#tcp;
    this.#udp = undefined;
    this.#tcp = undefined;
    udp?.close();
    for (const s of this.#conns) s.destroy();
    if (tcp !== undefined) await new Promise<void>((resolve) => tcp.close(() => resolve()));
  }
}
