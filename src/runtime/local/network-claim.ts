// One bridge and one pod subnet per local runtime on a host. Two workers (two checkouts' `make up`)
// that shared asb0 and 10.213.0.0/16 gave their pods the same addresses and MACs, so one system's
// edge reached the other's pods (security probe, "Two make up runs on one host collide"). Now a
// runtime claims its bridge and subnet before it sets them up, and refuses to start, naming the
// holder, when another live instance holds either, or when the host already routes or addresses
// any part of the subnet on another interface (a VPN, docker, an older worker without a claim).
//
// Claims are files in a host-wide directory, /run/asb/networks/<bridge>.json (tmpfs: gone at
// reboot, like the bridges): the bridge, its subnet, the owner (the runtime's state dir) and the
// owner's pid with its start time. A claim counts while that process lives (same pid AND start
// time, so a reused pid does not hold a dead owner's bridge); a dead owner's claim is stale, but its bridge
// may still carry the subnet (the host check names it, with the command to delete it). The same
// state dir restarting is the same owner and reuses its bridge.
import { execFile } from 'node:child_process';
import { mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { AsbError } from '../../errors.ts';
import { processStartTime } from './rootfs.ts';

const execFileAsync = promisify(execFile);

/** Where claims live unless the runtime is told otherwise (tests use their own directory). */
export const DEFAULT_CLAIMS_DIR = '/run/asb/networks';

export interface NetworkClaim {
  bridge: string;
  /** IPv4 CIDR, e.g. 10.213.0.0/16. */
  subnet: string;
  /** The runtime's state dir. */
  owner: string;
  pid: number;
  /** The owner's start time (/proc/<pid>/stat field 22); absent in claims made without one. */
  pidStart?: string;
}

/** What the host already has, from `ip -j route` (main table) and `ip -j addr`. */
export interface HostNetwork {
  /** IPv4 routes: destination CIDR (a bare address is a /32) and device. */
  routes: { dst: string; dev: string }[];
  /** IPv4 addresses: `address/prefix` and device. */
  addrs: { cidr: string; dev: string }[];
}

/**
 * Why `want` may not be set up, or undefined. Pure: `claims` are the other claims on file,
 * `live` says whether a claim's owner still runs.
 */
export function networkConflict(want: NetworkClaim, claims: readonly NetworkClaim[], host: HostNetwork, live: (claim: NetworkClaim) => boolean): string | undefined {
  const ours = parseCidr(want.subnet);
  if (ours === undefined) return `subnet "${want.subnet}" is not an IPv4 CIDR`;
  const others = claims.filter((c) => c.owner !== want.owner);
  const holders = others.filter(live);
  const mine = claims.some((c) => c.owner === want.owner && c.bridge === want.bridge);
  const holderOf = (bridge: string): NetworkClaim | undefined => holders.find((c) => c.bridge === bridge);
  const who = (c: NetworkClaim): string => `the Agent Sandbox runtime of ${c.owner} (pid ${c.pid})`;
  const fix = 'stop that instance, or give this one another subnet (ASB_SUBNET / --subnet) and bridge (ASB_BRIDGE / --bridge)';

  const sameBridge = holderOf(want.bridge);
  if (sameBridge !== undefined) return `bridge ${want.bridge} is held by ${who(sameBridge)} with subnet ${sameBridge.subnet}; ${fix}`;
  for (const c of holders) {
    const theirs = parseCidr(c.subnet);
    if (theirs !== undefined && overlaps(ours, theirs)) return `subnet ${want.subnet} overlaps ${c.subnet} of bridge ${c.bridge}, held by ${who(c)}; ${fix}`;
  }
  // The host's own view catches holders without a claim: an older worker, docker, a VPN.
  for (const a of host.addrs) {
    const net = parseCidr(a.cidr);
    if (net === undefined) continue;
    if (a.dev === want.bridge) {
      // Our own bridge from a run with another subnet keeps working; anyone else's is not ours to re-address.
      if (!overlaps(ours, net) && !mine) return `bridge ${want.bridge} already exists with address ${a.cidr}, outside subnet ${want.subnet}: another instance may use it; ${fix}`;
      continue;
    }
    if (overlaps(ours, net)) return `subnet ${want.subnet} overlaps address ${a.cidr} on ${a.dev}${describeHolder(a.dev, others, live)}; ${fix}`;
  }
  for (const r of host.routes) {
    if (r.dev === want.bridge) continue;
    const net = parseCidr(r.dst);
    if (net === undefined || net.prefix === 0) continue;
    if (overlaps(ours, net)) return `subnet ${want.subnet} overlaps the host's route to ${r.dst} via ${r.dev}${describeHolder(r.dev, others, live)}; ${fix}`;
  }
  return undefined;
}

function describeHolder(dev: string, claims: readonly NetworkClaim[], live: (claim: NetworkClaim) => boolean): string {
  const claim = claims.find((c) => c.bridge === dev);
  if (claim === undefined) return '';
  if (live(claim)) return ` (a bridge held by the Agent Sandbox runtime of ${claim.owner}, pid ${claim.pid})`;
  return ` (the bridge of ${claim.owner}, whose runtime is not running: \`ip link del ${dev}\` removes it if no pod of it runs)`;
}

/**
 * Claims `want` for its owner, or throws AsbError Unavailable saying who holds the bridge or
 * subnet. Idempotent for the same owner. Call before creating the bridge. Resolves with warnings
 * for what could not be checked or recorded (the runtime logs them): neither stops a start, as
 * the bridge set-up itself fails when `ip` cannot run.
 */
export async function claimNetwork(want: NetworkClaim, opts: { claimsDir: string; host?: () => Promise<HostNetwork> }): Promise<string[]> {
  const warnings: string[] = [];
  const claims = await readClaims(opts.claimsDir);
  const alive = new Set<NetworkClaim>();
  await Promise.all(
    claims.map(async (c) => {
      const started = await processStartTime(c.pid);
      if (started !== undefined && (c.pidStart === undefined || c.pidStart === started)) alive.add(c);
    }),
  );
  let host: HostNetwork = { routes: [], addrs: [] };
  try {
    host = await (opts.host ?? readHostNetwork)();
  } catch (err) {
    warnings.push(`cannot read the host's routes and addresses, so only other runtimes' claims were checked: ${messageOf(err)}`);
  }
  const conflict = networkConflict(want, claims, host, (c) => alive.has(c));
  if (conflict !== undefined) throw new AsbError('Unavailable', `cannot set up pod networking: ${conflict}`);
  const pidStart = await processStartTime(want.pid);
  const record: NetworkClaim = pidStart === undefined ? want : { ...want, pidStart };
  const file = join(opts.claimsDir, `${want.bridge}.json`);
  try {
    await mkdir(opts.claimsDir, { recursive: true, mode: 0o755 });
    // Atomic: a reader never sees half a claim.
    await writeFile(`${file}.${process.pid}.tmp`, `${JSON.stringify(record)}\n`, { mode: 0o644 });
    await rename(`${file}.${process.pid}.tmp`, file);
  } catch (err) {
    warnings.push(`cannot record the claim on bridge ${want.bridge} in ${opts.claimsDir}; other runtimes will see it only through the host's routes: ${messageOf(err)}`);
  }
  return warnings;
}

function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Drops `owner`'s claim on `bridge` (when the runtime gave up its network). */
export async function releaseNetwork(claimsDir: string, bridge: string, owner: string): Promise<void> {
  const file = join(claimsDir, `${bridge}.json`);
  const claim = await readClaim(file);
  if (claim?.owner === owner) await rm(file, { force: true });
}

export async function readClaims(dir: string): Promise<NetworkClaim[]> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch {
    return [];
  }
  const claims = await Promise.all(names.filter((n) => n.endsWith('.json')).map((n) => readClaim(join(dir, n))));
  return claims.filter((c): c is NetworkClaim => c !== undefined);
}

async function readClaim(file: string): Promise<NetworkClaim | undefined> {
  try {
    const value: unknown = JSON.parse(await readFile(file, 'utf8'));
    if (typeof value !== 'object' || value === null) return undefined;
    const c = value as Record<string, unknown>;
    if (typeof c.bridge !== 'string' || typeof c.subnet !== 'string' || typeof c.owner !== 'string' || typeof c.pid !== 'number') return undefined;
    const claim: NetworkClaim = { bridge: c.bridge, subnet: c.subnet, owner: c.owner, pid: c.pid };
    if (typeof c.pidStart === 'string') claim.pidStart = c.pidStart;
    return claim;
  } catch {
    // Unreadable or half-written by an older writer: no claim.
    return undefined;
  }
}

/** The host's IPv4 routes (main table) and addresses. */
export async function readHostNetwork(): Promise<HostNetwork> {
  const [routes, addrs] = await Promise.all([ipJson(['-4', '-j', 'route', 'show', 'table', 'main']), ipJson(['-4', '-j', 'addr', 'show'])]);
  const out: HostNetwork = { routes: [], addrs: [] };
  for (const r of routes) {
    if (typeof r !== 'object' || r === null) continue;
    const { dst, dev } = r as { dst?: unknown; dev?: unknown };
    if (typeof dst === 'string' && typeof dev === 'string') out.routes.push({ dst, dev });
  }
  for (const link of addrs) {
    if (typeof link !== 'object' || link === null) continue;
    const { ifname, addr_info } = link as { ifname?: unknown; addr_info?: unknown };
    if (typeof ifname !== 'string' || !Array.isArray(addr_info)) continue;
    for (const a of addr_info as unknown[]) {
      const { local, prefixlen, family } = (a ?? {}) as { local?: unknown; prefixlen?: unknown; family?: unknown };
      if (family === 'inet' && typeof local === 'string' && typeof prefixlen === 'number') out.addrs.push({ cidr: `${local}/${prefixlen}`, dev: ifname });
    }
  }
  return out;
}

async function ipJson(args: string[]): Promise<unknown[]> {
  try {
    const { stdout } = await execFileAsync('ip', args, { timeout: 5_000 });
    const value: unknown = JSON.parse(stdout.trim() === '' ? '[]' : stdout);
    return Array.isArray(value) ? (value as unknown[]) : [];
  } catch (err) {
    throw new AsbError('Unavailable', `cannot read the host's network (ip ${args.join(' ')}): ${messageOf(err)}`, { cause: err });
  }
}

interface Cidr {
  base: number;
  prefix: number;
}

/** `a.b.c.d/n` (n 0-32) or a bare address (/32); undefined otherwise. */
export function parseCidr(text: string): Cidr | undefined {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?:\/(\d{1,2}))?$/.exec(text);
  if (m === null) return undefined;
  const octets = m.slice(1, 5).map(Number);
  const prefix = m[5] === undefined ? 32 : Number(m[5]);
  if (octets.some((o) => o > 255) || prefix > 32) return undefined;
  const ip = octets.reduce((acc, o) => acc * 256 + o, 0);
  return { base: (ip & mask(prefix)) >>> 0, prefix };
}

export function overlaps(a: Cidr, b: Cidr): boolean {
  const m = mask(Math.min(a.prefix, b.prefix));
  return ((a.base & m) >>> 0) === ((b.base & m) >>> 0);
}

function mask(prefix: number): number {
  return prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
}
