// Who may call envd for a sandbox, and as which user.
//
// - Every call needs the sandbox's data-plane access token in X-Access-Token (the token the E2B
//   API hands out as envdAccessToken), compared in constant time; GET /health needs none (the
//   SDK's isRunning probe), and /files takes a signed URL instead (uploadUrl/downloadUrl).
// - A signature is `v1_` + base64(sha256("<path>:<read|write>:<user>:<token>[:<expiration>]"))
//   without padding, the E2B SDK's getSignature. An expired one is refused. One made without an
//   expiration never expires, as under E2B's envd: the SDK's uploadUrl()/downloadUrl() leave
//   signature_expiration out unless useSignatureExpiration is given, and such a URL carries no
//   time of issue to count a default lifetime from; it ends when the access token changes. The user in it is the
//   `username` query parameter; without one the SDK signs with its own rendering of no user, so
//   the empty name and "undefined" are both tried (every candidate still needs the token).
// - A signed URL runs as the user it was signed for (its `username`; none: the default user), and
//   a Basic auth header on it is ignored: the header is not signed, so anyone holding the URL
//   could otherwise add `root:` to it (security probe L1).
// - Otherwise the user comes from HTTP Basic auth (`<user>:`), envd's convention; users.ts turns
//   the name into a uid and a home.
import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { AsbError } from '../../errors.ts';

export function sameSecret(presented: string, expected: string): boolean {
  const a = createHash('sha256').update(presented, 'utf8').digest();
  const b = createHash('sha256').update(expected, 'utf8').digest();
  return timingSafeEqual(a, b);
}

/** Throws unless X-Access-Token carries the sandbox's token. */
export function requireToken(req: IncomingMessage, token: string, id: string): void {
  const presented = req.headers['x-access-token'];
  if (typeof presented !== 'string' || presented === '') {
    throw new AsbError('Unauthorized', `envd of sandbox ${id} needs its access token: send the X-Access-Token header (envdAccessToken from the E2B API)`);
  }
  if (!sameSecret(presented, token)) throw new AsbError('Unauthorized', `wrong access token for envd of sandbox ${id}`);
}

export function signatureOf(path: string, operation: 'read' | 'write', user: string, token: string, expiration: number | undefined): string {
  const raw = expiration === undefined ? `${path}:${operation}:${user}:${token}` : `${path}:${operation}:${user}:${token}:${expiration}`;
  return `v1_${createHash('sha256').update(raw, 'utf8').digest('base64').replace(/=+$/, '')}`;
}

export interface SignedQuery {
  path: string;
  signature: string;
  username: string | undefined;
  expiration: string | undefined;
}

/** Throws unless the signature matches the path, operation, user and (unexpired) expiration. */
export function checkSignature(q: SignedQuery, operation: 'read' | 'write', token: string, nowMs: number): void {
  let expiration: number | undefined;
  if (q.expiration !== undefined && q.expiration !== '') {
    if (!/^\d{1,12}$/.test(q.expiration)) throw new AsbError('BadRequest', `signature_expiration must be a unix time in seconds, got "${q.expiration.slice(0, 40)}"`);
    expiration = Number(q.expiration);
    if (expiration * 1000 < nowMs) throw new AsbError('Unauthorized', `the signed URL for ${q.path} expired at ${new Date(expiration * 1000).toISOString()}`);
  }
  const users = q.username === undefined ? ['', 'undefined'] : [q.username];
  for (const user of users) {
    if (sameSecret(q.signature, signatureOf(q.path, operation, user, token, expiration))) return;
  }
  throw new AsbError('Unauthorized', `the signature does not match ${operation} of ${q.path}${q.username === undefined ? '' : ` as ${q.username}`}`);
}

/** The user named by `Authorization: Basic base64(<user>:)`, if any. */
export function basicUser(req: IncomingMessage): string | undefined {
  const header = req.headers.authorization;
  if (header === undefined) return undefined;
  const m = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(header);
  if (m === null) throw new AsbError('BadRequest', 'the Authorization header must be Basic base64("<user>:") to choose the user');
  const decoded = Buffer.from(m[1] ?? '', 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  const user = colon === -1 ? decoded : decoded.slice(0, colon);
  return user === '' ? undefined : user;
}
