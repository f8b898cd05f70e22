// Where a webhook may be delivered: public addresses only, unless the worker runs with
// --webhook-allow-private. A team's URL is otherwise a request the worker makes on the team's
// behalf from inside the operator's network: to loopback (the worker's own admin API), a private
// range, or link-local (the cloud metadata endpoint 169.254.169.254), with the answer's status
// recorded for the team to read (a server-side request forgery and a port scanner).
//
// Two checks, one rule (src/network/egress-policy.ts isPrivateAddress, the sandboxes' own list):
// - at registration, a host that is plainly private: a literal address in a private range, or
//   `localhost` and its `*.localhost` names (RFC 6761: loopback); a name is not resolved there,
//   as what it resolves to may change;
// - at delivery, the address actually connected to: a literal is checked before connecting, a
//   name through the connection's own lookup, so a name that resolves to a private address, or
//   is rebound to one after registration, is refused at the moment it would be used. Answers are
//   filtered, not refused whole: a name with public and private addresses is reached on its
//   public ones only.
import { lookup as dnsLookup, type LookupAddress, type LookupAllOptions } from 'node:dns';
import { isIP, type LookupFunction } from 'node:net';
import { isPrivateAddress } from '../network/egress-policy.ts';

export const ALLOW_PRIVATE_HINT = 'webhooks are delivered to public addresses only unless the worker runs with --webhook-allow-private (ASB_WEBHOOK_ALLOW_PRIVATE)';

/** A URL's host as an address or a name: brackets off an IPv6 literal, a name lower-case without its trailing dot. */
function hostOf(hostname: string): string {
  if (hostname.startsWith('[') && hostname.endsWith(']')) return hostname.slice(1, -1);
  return hostname.toLowerCase().replace(/\.$/, '');
}

/** Why a webhook URL's host may not be registered without the flag (a private literal address, or localhost); undefined if it may. */
export function privateHostProblem(url: URL): string | undefined {
  const host = hostOf(url.hostname);
  if (isIP(host) !== 0) return isPrivateAddress(host) ? `${host} is a private, loopback or link-local address: ${ALLOW_PRIVATE_HINT}` : undefined;
  if (host === 'localhost' || host.endsWith('.localhost')) return `${host} is the loopback host: ${ALLOW_PRIVATE_HINT}`;
  return undefined;
}

/** The delivery's refusal when its URL's host is a private literal address (connecting to a literal asks no lookup); undefined otherwise. */
export function privateLiteralRefusal(url: URL): string | undefined {
  const host = hostOf(url.hostname);
  return isIP(host) !== 0 && isPrivateAddress(host) ? `refused: ${host} is a private address; ${ALLOW_PRIVATE_HINT}` : undefined;
}

/** A webhook delivery refused before connecting; `code` is what the error is switched on. */
export class PrivateAddressError extends Error {
  readonly code = 'EWEBHOOKPRIVATE';
  constructor(message: string) {
    super(message);
    this.name = 'PrivateAddressError';
  }
}

type AllLookup = (hostname: string, options: LookupAllOptions, callback: (err: NodeJS.ErrnoException | null, addresses: LookupAddress[]) => void) => void;

/**
 * A connection's lookup (node:net's `lookup` option) that answers only public addresses: the
 * private ones of a name's answer are dropped, and a name with no public one fails with a
 * PrivateAddressError naming what it resolved to. `resolve` is the system's (getaddrinfo) unless
 * a test gives another.
 */
export function publicOnlyLookup(resolve: AllLookup = dnsLookup): LookupFunction {
  return (hostname, options, callback) => {
    resolve(hostname, { ...options, all: true }, (err, addresses) => {
      if (err !== null) {
        callback(err, '', 0);
        return;
      }
      const open = addresses.filter((a) => !isPrivateAddress(a.address));
      const first = open[0];
      if (first === undefined) {
        const seen = addresses.map((a) => a.address).join(', ');
        callback(new PrivateAddressError(`refused: ${hostname} resolves to ${seen === '' ? 'no address' : seen}, no public address; ${ALLOW_PRIVATE_HINT}`), '', 0);
        return;
      }
      if (options.all === true) callback(null, open);
      else callback(null, first.address, first.family);
    });
  };
}
