// What the sandbox resolver told each pod: name → addresses, per pod, until a while after the
// answer's TTL. The egress proxy lets an allowed NAME open only these addresses: otherwise a
// sandbox allowed to reach api.example.com could send "SNI: api.example.com" (or "Host:") to any
// address at all and carry data wherever it likes (domain fronting). An address reached without
// our resolver is judged by its address alone.
import type { Clock } from '../base/clock.ts';

/**
 * How long after an answer's TTL the address still counts (ms). Clients cache past the TTL
 * (browsers ~1 min, JVMs 30 s, connection pools for as long as a connection lives), and a
 * connection is judged once when it opens; 10 minutes covers those without keeping a name's
 * old addresses for hours.
 */
export const GRACE_MS = 10 * 60_000;
/** Names remembered per pod; the oldest go first (a pod resolving 10,000 names is unusual). */
export const MAX_NAMES_PER_POD = 4096;

export class ResolvedAddresses {
  readonly #clock: Clock;
  /** pod IP → name → address → expiry (ms). Map order is insertion order: oldest names first. */
  readonly #pods = new Map<string, Map<string, Map<string, number>>>();

  constructor(clock: Clock) {
    this.#clock = clock;
  }

  record(podIp: string, name: string, addresses: readonly string[], ttlS: number): void {
    if (addresses.length === 0) return;
    let names = this.#pods.get(podIp);
    if (names === undefined) {
      names = new Map();
      this.#pods.set(podIp, names);
    }
    const expiry = this.#clock.now() + ttlS * 1000 + GRACE_MS;
    const known = names.get(name) ?? new Map<string, number>();
    names.delete(name); // re-insert: now the newest
    for (const ip of addresses) known.set(ip, expiry);
    names.set(name, known);
    while (names.size > MAX_NAMES_PER_POD) {
      const oldest = names.keys().next().value;
      if (oldest === undefined) break;
      names.delete(oldest);
    }
  }

  /** Whether the resolver gave `ip` to this pod for `name`, recently enough. */
  has(podIp: string, name: string, ip: string): boolean {
    const expiry = this.#pods.get(podIp)?.get(name)?.get(ip);
    return expiry !== undefined && expiry > this.#clock.now();
  }

  /** A pod went away (its IP may be reused by another sandbox). */
  forget(podIp: string): void {
    this.#pods.delete(podIp);
  }
}
