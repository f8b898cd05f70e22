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
// - Otherwise the user comes from HTTP Basic auth (`<user>:`), envd's convention: `root` runs as uid 0, a
//   missing user or `user` (E2B's default user) as the pod's own user, any other name as the uid
//   `id -u` gives inside the sandbox (asked once per name while the pod runs).
import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { AsbError } from '../../errors.ts';
import type { PodRuntime } from '../../runtime/runtime.ts';

/** E2B's name for the sandbox's default (non-root) user. */
export const DEFAULT_USER = 'user';

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

const USER_NAME = /^[a-z_][a-z0-9_.-]{0,31}\$?$/i;

/** Named users whose uids are kept per sandbox; past it, each call for another name runs `id -u`. */
const MAX_KEPT_USERS = 64;

/**
 * The uid to run as for a user name (undefined: the pod's own user). A named user's uid comes from
 * `id -u` inside the sandbox, an exec (nsenter locally, a pods/exec round trip on Kubernetes), so
 * it is kept for as long as the pod runs: a pod started again may hold other users.
 */
export class UserIds {
  readonly #runtime: PodRuntime;
  /** sandbox id → the uids found while the pod that started at `startedAt` ran. */
  readonly #bySandbox = new Map<string, { startedAt: string | undefined; uids: Map<string, number> }>();

  constructor(runtime: PodRuntime) {
    this.#runtime = runtime;
  }

  async uidOf(id: string, user: string | undefined): Promise<number | undefined> {
    if (user === undefined || user === DEFAULT_USER) return undefined;
    if (user === 'root') return 0;
    if (!USER_NAME.test(user)) throw new AsbError('BadRequest', `"${user.slice(0, 40)}" is not a user name`);
    const startedAt = this.#runtime.state(id).startedAt;
    let kept = this.#bySandbox.get(id);
    if (kept === undefined || kept.startedAt !== startedAt) this.#bySandbox.set(id, (kept = { startedAt, uids: new Map() }));
    const known = kept.uids.get(user);
    if (known !== undefined) return known;
    const result = await this.#runtime.exec(id, { command: ['id', '-u', '--', user], timeoutMs: 10_000 });
    const uid = Buffer.from(result.stdout).toString('utf8').trim();
    if (result.exitCode !== 0 || !/^\d+$/.test(uid)) throw new AsbError('BadRequest', `sandbox ${id} has no user "${user}"`);
    if (kept.uids.size < MAX_KEPT_USERS) kept.uids.set(user, Number(uid));
    return Number(uid);
  }

  /** Drops what is kept for a sandbox whose pod is gone. */
  forget(id: string): void {
    this.#bySandbox.delete(id);
  }
}
