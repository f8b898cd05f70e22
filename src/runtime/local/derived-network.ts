// The local runtime's bridge and pod subnet when none is configured: derived from the state
// directory, so two checkouts (two `make up` runs) on one host get different ones. They shared
// asb0 and 10.213.0.0/16 before: the second run's pods took the first run's addresses and MACs
// and one system's edge reached the other's pods (security probe, "Two make up runs on one host
// collide"). A derivation cannot rule out a collision (128 subnets), so the runtime also refuses
// at start a bridge or subnet another live instance holds (src/runtime/local/network-claim.ts),
// naming it; ASB_SUBNET / --subnet (and ASB_BRIDGE / --bridge) then pick another.
import { createHash } from 'node:crypto';

/**
 * Derived subnets are 10.64.0.0/16 … 10.191.0.0/16: 10.0 and 10.1 are common home and office
 * LANs, and the tests give their own workers 10.200 and up, so a running `make up` never takes a
 * test's subnet.
 */
export const DERIVED_OCTETS = Object.freeze({ first: 64, count: 128 });

export interface LocalNetwork {
  /** Host bridge name: `asb` + 8 hex digits of the key's hash + the index (12 characters). */
  bridge: string;
  /** `10.<n>.0.0/16`. */
  subnet: string;
}

/**
 * The bridge and subnet for `key` (a state or data directory, absolute). Index i > 0 gives the
 * i-th of several instances sharing that key (the clusters of one federation): subnet n + i, so
 * they never collide with one another.
 */
export function derivedNetwork(key: string, index = 0): LocalNetwork {
  const hash = createHash('sha256').update(key).digest();
  const octet = DERIVED_OCTETS.first + ((hash.readUInt32BE(0) + index) % DERIVED_OCTETS.count);
  return { bridge: `asb${hash.toString('hex').slice(0, 8)}${index}`, subnet: `10.${octet}.0.0/16` };
}

/**
 * The i-th of several /16s starting at `first` (e.g. ASB_SUBNET for a federation's first
 * cluster): a.b.0.0/16 → a.(b+i).0.0/16, or undefined past a.255.
 */
export function nthSubnet(first: string, index: number): string | undefined {
  const m = /^(\d{1,3})\.(\d{1,3})\.0\.0\/16$/.exec(first);
  if (m === null) return undefined;
  const a = Number(m[1]);
  const b = Number(m[2]) + index;
  if (a > 255 || b > 255) return undefined;
  return `${a}.${b}.0.0/16`;
}
