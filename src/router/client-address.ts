// Who sent a request, as Envoy saw it: the key the router's per-client limits count against.
//
// Envoy's listeners run with use_remote_address (envoy/edge.yaml), so before any filter runs the
// connection manager appends the address of the TCP peer to x-forwarded-for, and ext_proc
// receives the header with that entry last. Whatever a client puts in x-forwarded-for (or
// x-real-ip, Forwarded, x-envoy-external-address) stays to the LEFT of Envoy's entry, so reading
// from the right cannot be spoofed:
// - edge listener (xff_num_trusted_hops 0): the last entry is the client.
// - ingress listener (xff_num_trusted_hops 1): the last entry is the forwarding edge Envoy (mutual
//   TLS, one of ours), the one before it is the client that edge saw.
// Seen with Envoy 1.40 (test/envoy-federation.test.ts, test/dataplane-envoy.test.ts): a peer of
// exactly 127.0.0.1 is written as the machine's own address, other 127.x as themselves, and
// x-envoy-external-address is only trustworthy while Envoy treats the client as external, so it
// is not read here.
// IPv6 clients are counted per /64: one host commonly holds a whole /64, and counting each of
// its 2^64 addresses apart would give it as many budgets.
import { isIP } from 'node:net';
import type { Listener, RequestHeaders } from './decide.ts';

/** The key of a request whose client cannot be told (no x-forwarded-for): all such share one budget. */
export const UNKNOWN_CLIENT = 'unknown';

/** The client's address as Envoy saw it (IPv6 as its /64), or UNKNOWN_CLIENT. */
export function clientKey(headers: RequestHeaders, listener: Listener): string {
  const xff = headers.get('x-forwarded-for');
  if (xff === undefined) return UNKNOWN_CLIENT;
  const entries = xff.split(',');
  const fromRight = listener === 'ingress' && entries.length >= 2 ? 2 : 1;
  const entry = entries[entries.length - fromRight]?.trim() ?? '';
  return addressKey(entry) ?? UNKNOWN_CLIENT;
}

/** An IP address → its limit key: IPv4 (also IPv4-mapped IPv6) as is, IPv6 as its /64 prefix. */
function addressKey(address: string): string | undefined {
  const kind = isIP(address);
  if (kind === 4) return address;
  if (kind !== 6) return undefined;
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (mapped?.[1] !== undefined) return mapped[1];
  const groups = expandIpv6(address.toLowerCase());
  return `${groups.slice(0, 4).join(':')}::/64`;
}

/** The eight 16-bit groups of a valid IPv6 address, without leading zeros. */
function expandIpv6(address: string): string[] {
  const zone = address.indexOf('%');
  const bare = zone === -1 ? address : address.slice(0, zone);
  const [head = '', tail] = bare.split('::');
  const parse = (part: string): string[] => (part === '' ? [] : part.split(':'));
  let left = parse(head);
  let right = tail === undefined ? [] : parse(tail);
  // A trailing dotted quad (::1.2.3.4) is two groups.
  const toGroups = (list: string[]): string[] =>
    list.flatMap((g) => {
      if (!g.includes('.')) return [g];
      const [a = 0, b = 0, c = 0, d = 0] = g.split('.').map(Number);
      return [((a << 8) | b).toString(16), ((c << 8) | d).toString(16)];
    });
  left = toGroups(left);
  right = toGroups(right);
  const missing = 8 - left.length - right.length;
  const groups = tail === undefined ? left : [...left, ...Array.from({ length: missing }, () => '0'), ...right];
  return groups.map((g) => Number.parseInt(g, 16).toString(16));
}
