// Closes the egress proxy's connections that a sandbox's new policy forbids (open-connections.ts
// says which and why): the socket Envoy accepted from the pod, found by the kernel by its two
// ends (gateway:proxyPort, podIp:sourcePort), is destroyed with `ss -K` (SOCK_DESTROY,
// CONFIG_INET_DIAG_DESTROY). The kernel sends the pod a reset (through the DNAT's conntrack entry,
// so it comes from the address the pod dialled: ECONNRESET in the sandbox, on runc and on gVisor
// alike, whose traffic leaves through the same veth), and Envoy sees its socket fail
// (ECONNABORTED) and closes the upstream half itself.
//
// Why this and not another way to close one: Envoy's admin API closes connections only by
// draining a whole listener (every sandbox's connections, allowed or not); the ext_authz network
// filter's Check is one unary call per connection, so there is no stream left to end; deleting
// the conntrack entry leaves both of Envoy's sockets open, and the pod's next packet, NAT'ed
// again to the proxy's port, meets no socket there and the upstream stays open. SOCK_DESTROY
// names exactly one socket by its four-tuple, so nothing else is touched.
import { execFile } from 'node:child_process';
import type { Logger } from '../base/log.ts';
import type { CheckAttributes } from './authz-codec.ts';
import type { DecisionInputs } from './egress-decision.ts';
import { nameResolvedFor, OpenConnections, portsToCut } from './open-connections.ts';

/** Runs argv: exit code and what it printed (stdout and stderr). */
export type SocketCommand = (argv: readonly string[]) => Promise<{ code: number; output: string }>;

/** `ss` on the host, bounded to 10 s. */
export const hostCommand: SocketCommand = (argv) =>
  new Promise((resolve) => {
    const [cmd = '', ...args] = argv;
    execFile(cmd, args, { timeout: 10_000, maxBuffer: 16 * 1024 * 1024 }, (err, stdout, stderr) => {
      resolve({ code: err === null ? 0 : typeof err.code === 'number' ? err.code : 1, output: stdout + stderr });
    });
  });

/** Ports per `ss -K` run: each is a `dst a:p or` term; 64 keeps the argument list short. */
const PORTS_PER_RUN = 64;

export interface ProxyCutOptions {
  /** The egress listener's address (the pods' gateway) and port: the local end of every socket Envoy accepts from a pod. */
  gateway: string;
  proxyPort: number;
  inputs: DecisionInputs;
  log: Logger;
  run?: SocketCommand;
}

export class ProxyCut {
  readonly #o: ProxyCutOptions;
  readonly #run: SocketCommand;
  readonly #open = new OpenConnections();
  readonly #pruning = new Set<string>();

  constructor(o: ProxyCutOptions) {
    this.#o = o;
    this.#run = o.run ?? hostCommand;
  }

  /** An allowed Check (the decision service calls it): remembered until its connection closes and a prune sees it gone. */
  allowed(check: CheckAttributes): void {
    if (this.#open.record(check, nameResolvedFor(check, this.#o.inputs))) this.#prune(check.sourceIp);
  }

  /**
   * Closes the pod's proxied connections that its policy (as the inputs' source reads it now)
   * denies; the source ports closed. Run after the new policy is in place.
   */
  async cut(podIp: string): Promise<number[]> {
    if (this.#open.ports(podIp).length === 0) return [];
    this.#open.keepOnly(podIp, await this.#livePorts(podIp));
    const ports = portsToCut(this.#open, podIp, this.#o.inputs);
    for (let i = 0; i < ports.length; i += PORTS_PER_RUN) {
      const some = ports.slice(i, i + PORTS_PER_RUN);
      const r = await this.#run(['ss', '-K', '-t', '-n', '-H', 'src', this.#local(), 'and', '(', ...some.flatMap((p, j) => [...(j === 0 ? [] : ['or']), 'dst', `${podIp}:${String(p)}`]), ')']);
      if (r.code !== 0) throw new Error(`ss -K for ${podIp}: ${r.output.trim().slice(0, 500)}`);
    }
    for (const port of ports) this.#open.forget(podIp, port);
    return ports;
  }

  #local(): string {
    return `${this.#o.gateway}:${String(this.#o.proxyPort)}`;
  }

  /** The source ports of the pod's sockets Envoy holds now, in any state but listening. */
  async #livePorts(podIp: string): Promise<Set<number>> {
    const r = await this.#run(['ss', '-t', '-n', '-H', 'state', 'connected', 'src', this.#local(), 'dst', podIp]);
    if (r.code !== 0) throw new Error(`ss for ${podIp}: ${r.output.trim().slice(0, 500)}`);
    return parseSourcePorts(r.output, podIp);
  }

  #prune(podIp: string): void {
    if (this.#pruning.has(podIp)) return;
    this.#pruning.add(podIp);
    this.#livePorts(podIp)
      .then((live) => this.#open.keepOnly(podIp, live))
      // Without a listing the oldest are forgotten (keepOnly's bound): a connection older than
      // 1,024 others of the same pod then escapes a cut.
      .catch((err: unknown) => {
        this.#o.log.warn({ err, podIp }, 'cannot list the egress proxy\'s connections: forgetting the oldest');
        this.#open.keepOnly(podIp, new Set(this.#open.ports(podIp)));
      })
      .finally(() => this.#pruning.delete(podIp));
  }
}

/** `ss -tnH` lines → the ports of the peer `podIp` (the last column but the process one, `podIp:port`). */
export function parseSourcePorts(text: string, podIp: string): Set<number> {
  const ports = new Set<number>();
  const prefix = `${podIp}:`;
  for (const line of text.split('\n')) {
    for (const field of line.trim().split(/\s+/)) {
      if (!field.startsWith(prefix)) continue;
      const port = Number(field.slice(prefix.length));
      if (Number.isInteger(port) && port > 0 && port < 65536) ports.add(port);
    }
  }
  return ports;
}
