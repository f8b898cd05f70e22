// Pod networking when root: a host bridge with the subnet's first address, and per pod a veth pair
// whose peer is created straight inside the pod's network namespace (`netns <pid>`) as eth0. The
// pod's init configures eth0 itself with ioctls. Because the namespace belongs to the pod's
// processes, the kernel deletes the veth when the pod ends: stop() has nothing to clean up and a
// crashed worker leaks nothing.
// Host-side commands of concurrent starts are batched into ONE `ip -force -batch -` run: at 300
// concurrent starts that is a handful of processes instead of 300 (each spawn costs ~2 ms of CPU
// here). The runtime runs them through its launcher, so the worker itself never forks for them.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { access, readFile, readlink } from 'node:fs/promises';
import { basename } from 'node:path';
import type { Logger } from '../../base/log.ts';

export interface Subnet {
  cidr: string;
  /** Network address as an unsigned 32-bit number. */
  base: number;
  prefix: number;
  /** The bridge's address, the pods' default route: the first host address. */
  gateway: string;
}

export function parseSubnet(cidr: string): Subnet {
  const match = /^(\d+)\.(\d+)\.(\d+)\.(\d+)\/(\d+)$/.exec(cidr);
  const octets = match?.slice(1, 5).map(Number) ?? [];
  const prefix = Number(match?.[5]);
  if (octets.length !== 4 || octets.some((o) => o > 255) || !(prefix >= 8 && prefix <= 30)) {
    throw new Error(`subnet "${cidr}" is not an IPv4 CIDR with a prefix between /8 and /30`);
  }
  const mask = prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
  const base = (octets.reduce((acc, o) => acc * 256 + o, 0) & mask) >>> 0;
  return { cidr, base, prefix, gateway: ipToString(base + 1) };
}

export function ipToString(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

/** Whether an IPv4 address lies in the subnet. */
export function inSubnet(ip: string, subnet: Subnet): boolean {
  const mask = (0xffffffff << (32 - subnet.prefix)) >>> 0;
  return ((ipToNumber(ip) & mask) >>> 0) === subnet.base;
}

function ipToNumber(ip: string): number {
  return ip.split('.').reduce((acc, o) => acc * 256 + Number(o), 0);
}

/** Hands out pod addresses from .2 up; reservations are rebuilt from pod dirs on start-up. */
export interface IpPool {
  reserve(ip: string): void;
  allocate(): string;
  release(ip: string): void;
}

export function createIpPool(subnet: Subnet): IpPool {
  const used = new Set<number>();
  const size = 2 ** (32 - subnet.prefix);
  let cursor = 2;
  return {
    reserve: (ip) => used.add(ipToNumber(ip)),
    release: (ip) => used.delete(ipToNumber(ip)),
    allocate() {
      for (let tries = 0; tries < size; tries++) {
        const offset = cursor;
        cursor = cursor + 1 >= size - 1 ? 2 : cursor + 1;
        const ip = subnet.base + offset;
        if (!used.has(ip)) {
          used.add(ip);
          return ipToString(ip);
        }
      }
      throw new Error(`no free address left in ${subnet.cidr}`);
    },
  };
}

/** Host-side veth name: interface names are limited to 15 bytes, so a hash of bridge and pod id. */
export function vethName(bridge: string, id: string): string {
  return `vx${createHash('sha1').update(`${bridge}/${id}`).digest('hex').slice(0, 11)}`;
}

/** Runs `ip -force -batch -` with the given lines; resolves with its stderr (empty when all passed). */
export function ipBatch(lines: readonly string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn('ip', ['-force', '-batch', '-'], { stdio: ['pipe', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    child.on('error', reject);
    child.on('close', () => resolve(stderr));
    child.stdin.end(lines.join('\n') + '\n');
  });
}

export async function bridgeExists(bridge: string): Promise<boolean> {
  try {
    await access(`/sys/class/net/${bridge}`);
    return true;
  } catch {
    return false;
  }
}

/**
 * Creates (or re-addresses) the bridge, with its MAC address set; throws with ip's message when
 * that is impossible.
 *
 * The MAC is set because the kernel gives a bridge whose address was never set the lowest of its
 * ports' addresses, again each time a port joins or leaves: a pod starting (the warm pool
 * refilling) or ending changed the gateway's MAC under every other pod. Their ARP entries then
 * named an address no port answers (the ports are isolated), so what the pods sent to the host
 * was dropped until each entry was resolved again: 200 terminals opened while a new pod joined
 * all waited ~53 s for their connection to the pod's agent, its SYN-ACKs lost and the host's SYN
 * retransmitted (test/runtime-network.test.ts pins it). A new bridge takes podMac of the gateway
 * (no pod has that address); an existing one keeps the address its pods have cached, now set.
 */
export async function ensureBridge(bridge: string, subnet: Subnet): Promise<void> {
  const exists = await bridgeExists(bridge);
  const mac = exists ? (await readFile(`/sys/class/net/${bridge}/address`, 'utf8')).trim() : podMac(subnet.gateway);
  const lines = exists ? [] : [`link add ${bridge} type bridge`];
  lines.push(`link set ${bridge} address ${mac}`, `addr replace ${subnet.gateway}/${subnet.prefix} dev ${bridge}`, `link set ${bridge} up`);
  const stderr = await ipBatch(lines);
  if (!(await bridgeExists(bridge)) || stderr.includes('rror')) throw new Error(`cannot set up bridge ${bridge}: ${stderr.trim()}`);
}

export async function deleteBridge(bridge: string): Promise<void> {
  if (await bridgeExists(bridge)) await ipBatch([`link del ${bridge}`]);
}

/** Runs one `ip -force -batch -` with these lines; resolves with what ip printed (errors). */
export type IpBatchRunner = (lines: readonly string[]) => Promise<string>;

/**
 * Collects veth requests and runs them in one ip process. One batch runs at a time and the next
 * one collects every request made meanwhile: with a launcher, pods report their pids spread over
 * many ticks, and a batch per tick would be an ip process per pod again.
 */
/**
 * The pod side's MAC address, derived from its IP: a pod keeps its IP across hibernation, and a
 * new random MAC on wake left the host's ARP entry pointing at the old one, so the host could
 * not reach the woken pod until that entry went stale (~30-45 s, seen as wakes that took that
 * long). 02: is a locally administered, unicast prefix.
 */
export function podMac(ip: string): string {
  return ['02', '42', ...ip.split('.').map((octet) => Number(octet).toString(16).padStart(2, '0'))].join(':');
}

export function createVethBatcher(bridge: string, log: Logger, run: IpBatchRunner = ipBatch): (pid: number, hostIf: string, ip: string) => Promise<void> {
  interface Request { pid: number; hostIf: string; ip: string; attempt: number; done: () => void }
  let pending: Request[] = [];
  let running = false;
  const flush = (): void => {
    const batch = pending;
    pending = [];
    running = true;
    let retrying = false;
    // A veth of a just-ended pod may still exist while the kernel tears its namespace down.
    const lines = batch.flatMap(({ pid, hostIf, ip }) => [
      `link del ${hostIf}`,
      `link add ${hostIf} type veth peer name eth0 address ${podMac(ip)} netns ${pid}`,
      `link set ${hostIf} master ${bridge} up`,
      // Isolated ports forward only to the bridge itself, never to each other: pod↔pod at L2 is
      // gone even while the firewall's table is rebuilt (a worker restart), not only by its rules.
      `link set dev ${hostIf} type bridge_slave isolated on`,
    ]);
    void run(lines)
      .then(
        (stderr) => {
          const real = stderr.split('\n').filter((l) => l.trim() !== '' && !l.includes('Cannot find device') && !l.includes('Command failed -:'));
          if (real.length > 0) log.warn({ stderr: real.join('\n') }, 'ip batch reported errors');
        },
        (err: unknown) => log.error({ err }, 'ip batch failed to run'),
      )
      .then(async () => {
        // Verify: about once in 60 quick hibernate/wake cycles the batch failed with "No such
        // device" while the kernel was still tearing down the pod's previous namespace, and
        // the woken pod had no link to the bridge (its wake hung). Such a pod is set up again.
        for (const b of batch) {
          if (await attached(b.hostIf, bridge)) b.done();
          else if (b.attempt >= VETH_ATTEMPTS) {
            log.error({ hostIf: b.hostIf, pid: b.pid }, 'could not attach the pod to the bridge');
            b.done();
          } else {
            retrying = true;
            pending.push({ ...b, attempt: b.attempt + 1 });
          }
        }
      })
      .finally(() => {
        running = false;
        if (pending.length > 0) {
          if (retrying) setTimeout(flush, VETH_RETRY_MS);
          else flush();
        }
      });
  };
  return (pid, hostIf, ip) =>
    new Promise<void>((resolve) => {
      if (pending.length === 0 && !running) setImmediate(flush);
      pending.push({ pid, hostIf, ip, attempt: 1, done: resolve });
    });
}

const VETH_ATTEMPTS = 3;
const VETH_RETRY_MS = 20;

/** Whether the host side of a pod's veth exists and is enslaved to the bridge. */
async function attached(hostIf: string, bridge: string): Promise<boolean> {
  try {
    return basename(await readlink(`/sys/class/net/${hostIf}/master`)) === bridge;
  } catch {
    return false;
  }
}
