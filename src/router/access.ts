// Data-plane authentication: a sandbox port answers only requests that carry the sandbox's
// access token, in the X-Access-Token header or in the asb_access cookie, unless its template
// marks the port public. The feed carries only sha256(token), so a router never holds a token
// it did not receive from the client itself.
import { createHash, timingSafeEqual } from 'node:crypto';
import { AsbError } from '../errors.ts';
import { ACCESS_COOKIE, type RouteEntry } from './contract.ts';

export interface Credentials {
  /** X-Access-Token header value. */
  header: string | undefined;
  /** The raw Cookie header(s), joined with '; '. */
  cookie: string | undefined;
}

export interface AccessGranted {
  /**
   * Set when the token came in the header and the browser does not hold it as a cookie yet:
   * the response gets `Set-Cookie` so later requests (links, sub-resources, WebSocket
   * upgrades from a page) need no header, which browsers cannot add to navigations.
   */
  setCookie: string | undefined;
  /** The Cookie header to send on with asb_access removed; undefined: leave it as it is. */
  cookieWithoutToken: string | undefined;
}

const OPEN: AccessGranted = Object.freeze({ setCookie: undefined, cookieWithoutToken: undefined });

/** Grants access to `port` of `entry`, or throws Unauthorized (no token) / Forbidden (wrong token). */
export function checkAccess(entry: RouteEntry, port: number, creds: Credentials): AccessGranted {
  const cookies = creds.cookie === undefined ? undefined : splitCookie(creds.cookie);
  const fromCookie = cookies?.token;
  const cookieWithoutToken = cookies !== undefined && fromCookie !== undefined ? cookies.rest : undefined;
  if (entry.publicPorts.includes(port)) return cookieWithoutToken === undefined ? OPEN : { setCookie: undefined, cookieWithoutToken };
  const header = creds.header?.trim();
  if (header !== undefined && header !== '') {
    if (!tokenMatches(header, entry.tokenHash)) throw new AsbError('Forbidden', `wrong access token for sandbox ${entry.id}`);
    return { setCookie: fromCookie === header ? undefined : header, cookieWithoutToken };
  }
  if (fromCookie !== undefined) {
    if (!tokenMatches(fromCookie, entry.tokenHash)) throw new AsbError('Forbidden', `wrong access token for sandbox ${entry.id} (cookie ${ACCESS_COOKIE})`);
    return { setCookie: undefined, cookieWithoutToken };
  }
  throw new AsbError('Unauthorized', `sandbox ${entry.id} port ${port} needs its access token: send the X-Access-Token header`);
}

export function tokenHash(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

/** Constant-time in the token: both sides are 32-byte digests. */
function tokenMatches(token: string, expectedHex: string): boolean {
  const expected = Buffer.from(expectedHex, 'hex');
  const actual = createHash('sha256').update(token).digest();
  return expected.length === actual.length && timingSafeEqual(expected, actual);
}

/**
 * `Set-Cookie` value for a token: HttpOnly so page scripts cannot read it; Lax so links work;
 * Secure when it was asked over HTTPS, so the browser never sends it to the plain-HTTP edge
 * (cookies are not port-scoped: the one set by :10002 went to :10000 in clear text).
 */
export function accessCookie(token: string, secure = false): string {
  return `${ACCESS_COOKIE}=${token}; HttpOnly; Path=/; SameSite=Lax${secure ? '; Secure' : ''}`;
}

/** The asb_access token and the other cookies. The first asb_access wins: browsers send longer paths first (RFC 6265 §5.4) and we only ever set Path=/. */
function splitCookie(header: string): { token: string | undefined; rest: string } {
  let token: string | undefined;
  const rest: string[] = [];
  for (const part of header.split(';')) {
    const pair = part.trim();
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    const name = eq === -1 ? pair : pair.slice(0, eq);
    if (name === ACCESS_COOKIE) token ??= pair.slice(eq + 1);
    else rest.push(pair);
  }
  return { token, rest: rest.join('; ') };
}
