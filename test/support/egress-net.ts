// A small network of the egress tests' own, laid out as the local runtime lays out a node: the
// host is the sandboxes' gateway (bridge asbeg<id>, 10.242.N.1/24), a "sandbox" network namespace
// hangs off it (10.242.N.2, default route via the gateway, resolv.conf naming the gateway), and a
// "public" namespace holds the internet's servers (192.0.2.x, reached from the host over a veth
// with 10.242.(128+N).1/30 on the host side). The host does not forward: the sandbox reaches the public
// servers only through what listens on the gateway, after the DNAT `redirect` sets up (the
// kernel part netpol owns in production, written here so the proxy is tested on its own).
// Everything is removed in t.after, in reverse order.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { TestContext } from 'node:test';

/** Where clean-up steps go: a test's context, or the benchmark's own list. */
export type Cleanup = Pick<TestContext, 'after'>;

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

export function run(cmd: string, args: readonly string[], opts: { timeoutMs?: number; input?: string } = {}): Promise<RunResult> {
  return new Promise((resolve) => {
    const child = execFile(cmd, args, { timeout: opts.timeoutMs ?? 30_000, maxBuffer: 64 * 1024 * 1024 }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof err.code === 'number' ? err.code : 1;
      resolve({ code, stdout, stderr });
    });
    if (opts.input !== undefined) child.stdin?.end(opts.input);
  });
}

async function must(cmd: string, args: readonly string[]): Promise<string> {
  const r = await run(cmd, args);
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${r.code}): ${r.stderr.trim()}`);
  return r.stdout;
}

export class EgressNet {
  readonly id: string;
  readonly n: number;
  readonly bridge: string;
  readonly gateway: string;
  readonly clientIp: string;
  readonly clientNs: string;
  readonly publicNs: string;
  /** Three public addresses in the public namespace. */
  readonly publicIps: readonly string[];
  /** A fourth, reached from the sandbox over a direct link once addDirectLink() ran: egress without the proxy, for the benchmark. */
  readonly directIp: string;
  readonly #chain: string;
  #direct = false;
  #upstream: ChildProcess | undefined;

  private constructor() {
    // 10.242.N.0/24 for the bridge, 10.242.(128+N).0/30 for the public link: 10.243/16 stays free
    // for the tests that run a real runtime (test/egress-sandbox.test.ts).
    this.n = randomInt(0, 128);
    this.id = randomInt(0, 0xffff).toString(16).padStart(4, '0');
    this.bridge = `asbeg${this.id}`;
    this.gateway = `10.242.${this.n}.1`;
    this.clientIp = `10.242.${this.n}.2`;
    this.clientNs = `asbeg-${this.id}-c`;
    this.publicNs = `asbeg-${this.id}-p`;
    const base = 1 + (this.n % 60) * 4;
    this.publicIps = [0, 1, 2].map((i) => `192.0.2.${base + i}`);
    this.directIp = `192.0.2.${base + 3}`;
    this.#chain = `ASBEG-${this.id}`;
  }

  static async create(t: Cleanup, opts: { directLink?: boolean } = {}): Promise<EgressNet> {
    const net = new EgressNet();
    t.after(() => net.destroy());
    await net.#build();
    if (opts.directLink === true) await net.addDirectLink();
    return net;
  }

  async #build(): Promise<void> {
    const { bridge, clientNs, publicNs, n } = this;
    const hostC = `${bridge}c`;
    const hostP = `${bridge}p`;
    await must('ip', ['netns', 'add', clientNs]);
    await must('ip', ['netns', 'add', publicNs]);
    await must('ip', ['link', 'add', bridge, 'type', 'bridge']);
    await must('ip', ['addr', 'add', `${this.gateway}/24`, 'dev', bridge]);
    await must('ip', ['link', 'set', bridge, 'up']);
    // sandbox ↔ bridge
    await must('ip', ['link', 'add', hostC, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', clientNs]);
    await must('ip', ['link', 'set', hostC, 'master', bridge, 'up']);
    await must('ip', ['-n', clientNs, 'addr', 'add', `${this.clientIp}/24`, 'dev', 'eth0']);
    await must('ip', ['-n', clientNs, 'link', 'set', 'eth0', 'up']);
    await must('ip', ['-n', clientNs, 'link', 'set', 'lo', 'up']);
    await must('ip', ['-n', clientNs, 'route', 'add', 'default', 'via', this.gateway]);
    // host ↔ public
    await must('ip', ['link', 'add', hostP, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', publicNs]);
    await must('ip', ['addr', 'add', `10.242.${128 + n}.1/30`, 'dev', hostP]);
    await must('ip', ['link', 'set', hostP, 'up']);
    for (const ip of this.publicIps) {
      await must('ip', ['-n', publicNs, 'addr', 'add', `${ip}/32`, 'dev', 'eth0']);
      await must('ip', ['route', 'add', `${ip}/32`, 'dev', hostP]);
    }
    await must('ip', ['-n', publicNs, 'link', 'set', 'eth0', 'up']);
    await must('ip', ['-n', publicNs, 'link', 'set', 'lo', 'up']);
    await must('ip', ['-n', publicNs, 'route', 'add', `10.242.${128 + n}.1`, 'dev', 'eth0']);
    await must('ip', ['-n', publicNs, 'route', 'add', 'default', 'via', `10.242.${128 + n}.1`]);
    // `ip netns exec` bind-mounts /etc/netns/<ns>/resolv.conf over /etc/resolv.conf.
    mkdirSync(join('/etc/netns', clientNs), { recursive: true });
    writeFileSync(join('/etc/netns', clientNs, 'resolv.conf'), `nameserver ${this.gateway}\noptions timeout:2 attempts:1\n`);
  }

  /**
   * The kernel part: every TCP connection from the sandbox (except to the gateway itself) is
   * DNAT'ed to gateway:tcpPort, keeping its original destination for SO_ORIGINAL_DST; DNS to
   * the gateway goes to dnsPort.
   */
  async redirect(opts: { tcpPort: number; dnsPort?: number }): Promise<void> {
    const chain = this.#chain;
    await must('iptables', ['-w', '-t', 'nat', '-N', chain]);
    if (opts.dnsPort !== undefined) {
      for (const proto of ['udp', 'tcp']) {
        await must('iptables', ['-w', '-t', 'nat', '-A', chain, '-p', proto, '-d', this.gateway, '--dport', '53', '-j', 'DNAT', '--to-destination', `${this.gateway}:${opts.dnsPort}`]);
      }
    }
    await must('iptables', ['-w', '-t', 'nat', '-A', chain, '-p', 'tcp', '-d', this.gateway, '-j', 'RETURN']);
    await must('iptables', ['-w', '-t', 'nat', '-A', chain, '-p', 'tcp', '-j', 'DNAT', '--to-destination', `${this.gateway}:${opts.tcpPort}`]);
    await must('iptables', ['-w', '-t', 'nat', '-I', 'PREROUTING', '-i', this.bridge, '-j', chain]);
  }

  /**
   * A veth straight from the sandbox namespace to the public one, carrying only directIp: the
   * "direct egress" a benchmark compares the proxy with (one hop, no NAT, no host: a lower bound
   * on what direct egress through a node costs, so the ratio it gives is conservative).
   */
  async addDirectLink(): Promise<void> {
    const { clientNs, publicNs, n } = this;
    await must('ip', ['-n', clientNs, 'link', 'add', 'direct0', 'type', 'veth', 'peer', 'name', 'direct0', 'netns', publicNs]);
    await must('ip', ['-n', clientNs, 'addr', 'add', `10.242.${128 + n}.5/30`, 'dev', 'direct0']);
    await must('ip', ['-n', clientNs, 'link', 'set', 'direct0', 'up']);
    await must('ip', ['-n', clientNs, 'route', 'add', `${this.directIp}/32`, 'via', `10.242.${128 + n}.6`]);
    await must('ip', ['-n', publicNs, 'addr', 'add', `10.242.${128 + n}.6/30`, 'dev', 'direct0']);
    await must('ip', ['-n', publicNs, 'addr', 'add', `${this.directIp}/32`, 'dev', 'direct0']);
    await must('ip', ['-n', publicNs, 'link', 'set', 'direct0', 'up']);
    this.#direct = true;
  }

  /** A command inside the sandbox namespace. */
  inClient(cmd: string, args: readonly string[], opts: { timeoutMs?: number } = {}): Promise<RunResult> {
    return run('ip', ['netns', 'exec', this.clientNs, cmd, ...args], opts);
  }

  /** Starts egress-upstream.ts in the public namespace on every public address. */
  async startUpstream(tls: { certChainPath: string; privateKeyPath: string }): Promise<void> {
    const script = join(import.meta.dirname, 'egress-upstream.ts');
    const addresses = this.#direct ? [...this.publicIps, this.directIp] : this.publicIps;
    const child = spawn('ip', ['netns', 'exec', this.publicNs, process.execPath, script, JSON.stringify({ addresses, ...tls })], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.#upstream = child;
    let stderr = '';
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    await new Promise<void>((resolve, reject) => {
      let out = '';
      child.stdout.on('data', (c: Buffer) => {
        out += c.toString();
        if (out.includes('ready')) resolve();
      });
      child.once('exit', (code) => reject(new Error(`egress-upstream exited (${code}): ${stderr}`)));
    });
  }

  /** Connections each public port accepted ("192.0.2.5:443" → n), from the control port. */
  async accepted(): Promise<Record<string, number>> {
    const res = await fetch(`http://${this.publicIps[0] ?? ''}:9000/`);
    return (await res.json()) as Record<string, number>;
  }

  /** The last request a public server received (headers included), from the control port. */
  async lastRequest(): Promise<{ host: string; path: string; sni?: string; headers: Record<string, string> } | null> {
    const res = await fetch(`http://${this.publicIps[0] ?? ''}:9000/last`);
    return (await res.json()) as { host: string; path: string; sni?: string; headers: Record<string, string> } | null;
  }

  async destroy(): Promise<void> {
    const up = this.#upstream;
    if (up !== undefined && up.exitCode === null) {
      const exited = new Promise((resolve) => up.once('exit', resolve));
      up.kill('SIGTERM');
      await exited;
    }
    await run('iptables', ['-w', '-t', 'nat', '-D', 'PREROUTING', '-i', this.bridge, '-j', this.#chain]);
    await run('iptables', ['-w', '-t', 'nat', '-F', this.#chain]);
    await run('iptables', ['-w', '-t', 'nat', '-X', this.#chain]);
    await run('ip', ['netns', 'del', this.clientNs]);
    await run('ip', ['netns', 'del', this.publicNs]);
    await run('ip', ['link', 'del', `${this.bridge}p`]);
    await run('ip', ['link', 'del', this.bridge]);
    rmSync(join('/etc/netns', this.clientNs), { recursive: true, force: true });
  }
}
