// Runs the kernel rules of src/network/nft-ruleset.ts for one bridge: the table pair at start, a
// pod's chains before its first process (the shim waits for "go" until they are in), again on
// every wake and policy change, emptied when the pod is removed; the table pair deleted when the
// runtime closes with no pod left running (a running pod keeps its rules: pods outlive the
// worker, and the next runtime rebuilds the table from the pods it adopts).
// Like the veth batcher, the scripts of concurrent starts go to ONE `nft -f -` run (a transaction
// each; a failed batch is retried one script at a time so one bad pod fails alone).
// A table found gone when a batch fails (deleted by another runtime closing on the same bridge, or
// by a host administrator's `nft flush ruleset`) is rebuilt with every live pod's rules before the
// batch is retried: otherwise no pod could start again, and the running ones would have lost their
// isolation until the worker restarted.
import { writeFile } from 'node:fs/promises';
import type { Logger } from '../../base/log.ts';
import { cutDestinations, parseConntrackFlows } from '../../network/conntrack-cut.ts';
import { DEFAULT_FLOOR } from '../../network/egress-floor.ts';
import { baseScript, deleteScript, parseCounters, podRemoveScript, podScript, tableName, type BridgeNet, type PodNet, type RuleCount } from '../../network/nft-ruleset.ts';

/** Runs argv with input on stdin: exit code and what it printed. */
export type CommandRunner = (argv: readonly string[], input: string) => Promise<{ code: number; output: string }>;

export class PodFirewall {
  readonly #net: BridgeNet;
  readonly #run: CommandRunner;
  readonly #log: Logger;
  #pending: { script: string; done: (err?: Error) => void }[] = [];
  #running = false;

  readonly #livePods: () => PodNet[];

  /** livePods: the pods whose rules must exist now (running or starting), for a rebuild. */
  constructor(net: BridgeNet, run: CommandRunner, log: Logger, livePods: () => PodNet[]) {
    this.#net = net;
    this.#run = run;
    this.#log = log;
    this.#livePods = livePods;
  }

  get table(): string {
    return tableName(this.#net.bridge);
  }

  /**
   * The bridge's sysctls and an empty table pair (replacing what a previous run left). The bridge
   * routes for its pods (forwarding on this interface only, not host-wide), answers ARP for the
   * whole subnet itself (proxy_arp + proxy_arp_pvlan: pods cannot ARP each other, their frames
   * are dropped, so the host must answer or a connect to another pod hangs on ARP ~3 s instead
   * of being rejected), and sends no ICMP redirects to one pod about another.
   */
  async setUp(): Promise<void> {
    const conf = `/proc/sys/net/ipv4/conf/${this.#net.bridge}`;
    await Promise.all([
      writeFile(`${conf}/forwarding`, '1\n'),
      writeFile(`${conf}/proxy_arp`, '1\n'),
      writeFile(`${conf}/proxy_arp_pvlan`, '1\n'),
      writeFile(`${conf}/send_redirects`, '0\n'),
      // Proxy ARP answers are delayed up to 0.8 s by default (proxy_delay 80 jiffies): the first
      // connect to another pod took 1.06 s to be refused.
      writeFile(`/proc/sys/net/ipv4/neigh/${this.#net.bridge}/proxy_delay`, '0\n'),
    ]);
    await this.#nft(baseScript(this.#net));
  }

  /** Installs (or replaces) a pod's rules; rejects when nft refused them: the pod must not start. */
  apply(pod: PodNet): Promise<void> {
    return this.#queue(podScript(this.#net, pod));
  }

  /**
   * Ends the pod's open forwarded flows its policy now forbids (conntrack-cut.ts says why the rules
   * alone do not): run after apply() of a policy change. The destinations cut, for the log.
   */
  async cutForbidden(pod: PodNet): Promise<string[]> {
    const listed = await this.#run(['conntrack', '-L', '-f', 'ipv4', '-s', pod.ip], '');
    if (listed.code !== 0) throw new Error(`conntrack -L -s ${pod.ip}: ${listed.output.trim().slice(0, 500)}`);
    const cut = cutDestinations(parseConntrackFlows(listed.output), pod.ip, pod.policy, { floor: this.#net.floor ?? DEFAULT_FLOOR, proxy: this.#net.egressProxyPort !== undefined });
    for (const dst of cut) {
      // Exit 1 with "0 flow entries" when the flow ended meanwhile: nothing left to cut.
      const deleted = await this.#run(['conntrack', '-D', '-f', 'ipv4', '-s', pod.ip, '-d', dst], '');
      if (deleted.code !== 0 && !deleted.output.includes('0 flow entries')) throw new Error(`conntrack -D -s ${pod.ip} -d ${dst}: ${deleted.output.trim().slice(0, 500)}`);
    }
    return cut;
  }

  /** Empties a pod's chains: its address and port then have no way through. */
  remove(pod: { ip: string; veth: string }): Promise<void> {
    return this.#queue(podRemoveScript(this.#net, pod));
  }

  /** Every pod chain's counters: per pod address and rule. */
  async counters(): Promise<RuleCount[]> {
    const r = await this.#run(['nft', '-j', 'list', 'table', 'inet', this.table], '');
    if (r.code !== 0) throw new Error(`nft list table inet ${this.table}: ${r.output.trim()}`);
    return parseCounters(r.output);
  }

  async destroy(): Promise<void> {
    await this.#nft(deleteScript(this.#net.bridge));
  }

  async #nft(script: string): Promise<void> {
    const r = await this.#run(['nft', '-f', '-'], script);
    if (r.code !== 0) throw new Error(`nft refused the rules of bridge ${this.#net.bridge}: ${r.output.trim().slice(0, 2000)}`);
  }

  /** When the tables are gone: recreates them with every live pod's rules; whether it did. */
  async #rebuiltLostTables(): Promise<boolean> {
    const [inet, bridge] = await Promise.all([
      this.#run(['nft', 'list', 'table', 'inet', this.table], ''),
      this.#run(['nft', 'list', 'table', 'bridge', this.table], ''),
    ]);
    if (inet.code === 0 && bridge.code === 0) return false;
    this.#log.warn({ table: this.table }, 'the firewall tables were gone: rebuilding them with every live pod\'s rules');
    await this.#nft(baseScript(this.#net) + this.#livePods().map((pod) => podScript(this.#net, pod)).join(''));
    return true;
  }

  #queue(script: string): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.#pending.length === 0 && !this.#running) setImmediate(() => void this.#flush());
      this.#pending.push({ script, done: (err) => (err === undefined ? resolve() : reject(err)) });
    });
  }

  async #flush(): Promise<void> {
    const batch = this.#pending;
    this.#pending = [];
    this.#running = true;
    try {
      try {
        await this.#nft(batch.map((b) => b.script).join(''));
        for (const b of batch) b.done();
      } catch (err) {
        if (await this.#rebuiltLostTables().catch(() => false)) {
          this.#pending = [...batch, ...this.#pending];
          return;
        }
        if (batch.length === 1) batch[0]?.done(err instanceof Error ? err : new Error(String(err)));
        else {
          this.#log.warn({ err, scripts: batch.length }, 'nft batch failed: applying one by one');
          for (const b of batch) {
            try {
              await this.#nft(b.script);
              b.done();
            } catch (one) {
              b.done(one instanceof Error ? one : new Error(String(one)));
            }
          }
        }
      }
    } finally {
      this.#running = false;
      if (this.#pending.length > 0) void this.#flush();
    }
  }
}
