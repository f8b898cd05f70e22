// The pod network of one local runtime: its bridge and subnet (claimed host-wide, network-claim.ts),
// the pods' addresses, the veth each pod's eth0 is moved in through (network.ts), the nftables
// firewall (pod-firewall.ts), and the listeners told when a pod's egress policy changes (the
// egress proxy closes what the new policy forbids). Knows nothing of pods but their id, address and
// policy: the runtime hands it the running ones (`running`).
import { readdir } from 'node:fs/promises';
import { resolve } from 'node:path';
import { AsbError } from '../../errors.ts';
import type { Logger } from '../../base/log.ts';
import { derivedNetwork } from './derived-network.ts';
import { DEFAULT_EGRESS_POLICY, type EgressPolicy } from '../../network/egress-policy.ts';
import type { PodNet } from '../../network/nft-ruleset.ts';
import type { Launcher } from './launcher.ts';
import { PodFirewall } from './pod-firewall.ts';
import { bridgeExists, createIpPool, createVethBatcher, deleteBridge, ensureBridge, parseSubnet, podMac, vethName, type IpPool, type Subnet } from './network.ts';
import { claimNetwork, DEFAULT_CLAIMS_DIR, releaseNetwork } from './network-claim.ts';
import type { LocalRuntimeOptions } from './runtime-options.ts';

export class PodNetwork {
  readonly #opts: LocalRuntimeOptions;
  readonly #log: Logger;
  readonly #unavailable: string | undefined;
  readonly subnet: Subnet;
  readonly bridge: string;
  readonly ips: IpPool;
  /** Moves a veth's peer into the namespace of `pid` as eth0 (batched `ip -batch` runs). */
  readonly attachVeth: (pid: number, hostIf: string, ip: string) => Promise<void>;
  readonly firewall: PodFirewall;
  readonly #policyListeners = new Set<(podIp: string) => Promise<void>>();
  #network: Promise<boolean> | undefined;

  constructor(opts: LocalRuntimeOptions, unavailable: string | undefined, launcher: Launcher, log: Logger, running: () => PodNet[]) {
    this.#opts = opts;
    this.#log = log;
    this.#unavailable = unavailable;
    const derived = derivedNetwork(resolve(opts.root));
    this.subnet = parseSubnet(opts.subnet ?? derived.subnet);
    this.bridge = opts.bridge ?? derived.bridge;
    this.ips = createIpPool(this.subnet);
    this.attachVeth = createVethBatcher(this.bridge, log, async (lines) => (await launcher.run(['ip', '-force', '-batch', '-'], lines.join('\n') + '\n')).output);
    this.firewall = new PodFirewall(
      {
        bridge: this.bridge,
        subnet: this.subnet.cidr,
        gateway: this.subnet.gateway,
        ...(opts.egressProxy === undefined ? {} : { egressProxyPort: opts.egressProxy.port }),
        dns: opts.podDns === true,
        ...(opts.egressFloor === undefined ? {} : { floor: opts.egressFloor }),
        ...(opts.connectionLimits === undefined ? {} : { limits: opts.connectionLimits }),
      },
      (argv, input) => launcher.run(argv, input),
      log,
      running,
    );
  }

  /** Sets up the bridge once; false when the runtime is unavailable (it starts no pod). */
  hasPodNetwork(): Promise<boolean> {
    this.#network ??= this.#setUpNetwork();
    return this.#network;
  }

  /**
   * The pod network for a start: set up again when the bridge is gone, which another runtime on the
   * same state dir deletes when it closes with no pod running (close()).
   */
  async forStart(): Promise<boolean> {
    const net = await this.hasPodNetwork();
    if (!net || (await bridgeExists(this.bridge))) return net;
    this.#log.warn({ bridge: this.bridge }, 'the pod bridge was gone: setting it up again');
    this.#network = undefined;
    return this.hasPodNetwork();
  }

  /** Rejects (AsbError Unavailable, naming the holder) when another instance holds the bridge or subnet. */
  async #setUpNetwork(): Promise<boolean> {
    if (this.#unavailable !== undefined) return false;
    const claimsDir = this.#opts.claimsDir ?? DEFAULT_CLAIMS_DIR;
    // Refused, never shared: the other instance's pods would receive our traffic.
    const warnings = await claimNetwork({ bridge: this.bridge, subnet: this.subnet.cidr, owner: resolve(this.#opts.root), pid: process.pid }, { claimsDir });
    for (const warning of warnings) this.#log.warn(warning);
    try {
      await ensureBridge(this.bridge, this.subnet);
      // No pod runs without its isolation: a host where nft cannot run starts none.
      await this.firewall.setUp();
      this.#log.info({ bridge: this.bridge, subnet: this.subnet.cidr, table: this.firewall.table }, 'pod network ready');
      return true;
    } catch (err) {
      await releaseNetwork(claimsDir, this.bridge, resolve(this.#opts.root));
      throw new AsbError('Unavailable', `cannot set up the pod bridge ${this.bridge} and its firewall (nftables): ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  /** The host end of the pod's veth on this bridge. */
  veth(id: string): string {
    return vethName(this.bridge, id);
  }

  podNet(id: string, ip: string, policy: EgressPolicy | undefined): PodNet {
    return { id, ip, mac: podMac(ip), veth: vethName(this.bridge, id), policy: policy ?? DEFAULT_EGRESS_POLICY };
  }

  policyChanged(id: string, ip: string): Promise<void> {
    return Promise.all(
      [...this.#policyListeners].map((listener) =>
        listener(ip).catch((err: unknown) => this.#log.error({ err, id }, 'cannot close the proxied connections the new egress policy forbids: they keep running until they end')),
      ),
    ).then(() => undefined);
  }

  onPolicyChange(listener: (podIp: string) => Promise<void>): () => void {
    this.#policyListeners.add(listener);
    return () => {
      this.#policyListeners.delete(listener);
    };
  }

  /**
   * At the runtime's close, with no pod running (`anyRuns` false): the firewall tables, the bridge
   * and the claim on it go (`make up` stopped left both behind). A running pod keeps its rules (the
   * next runtime re-adopts it).
   */
  async close(anyRuns: boolean): Promise<void> {
    const network = this.#network;
    if (anyRuns || network === undefined || !(await network.catch(() => false))) return;
    await this.firewall.destroy().catch((err: unknown) => this.#log.warn({ err }, 'cannot delete the firewall tables'));
    // Not while another runtime's pods hang off it (two runtimes on one state dir, in tests).
    const ports = await readdir(`/sys/class/net/${this.bridge}/brif`).catch(() => []);
    if (ports.length === 0) await deleteBridge(this.bridge).catch((err: unknown) => this.#log.warn({ err }, 'cannot delete the pod bridge'));
    await releaseNetwork(this.#opts.claimsDir ?? DEFAULT_CLAIMS_DIR, this.bridge, resolve(this.#opts.root)).catch((err: unknown) => this.#log.warn({ err }, 'cannot release the claim on the pod bridge'));
  }
}
