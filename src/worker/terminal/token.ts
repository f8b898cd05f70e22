// Terminal tokens: how a browser opens a terminal WebSocket, since it cannot set an Authorization
// header on one. POST /v1/sandboxes/{id}/terminal-tokens (API key) issues a token; the terminal
// endpoint accepts it once, for that sandbox only, until it expires.
//
// token = base64url(JSON {s: sandbox id, t: owner team, k: issuing key's prefix, e: expiry ms, n: nonce}) "." base64url(HMAC-SHA256)
//
// The issuing key's prefix rides along so a session the token opens closes when that key is
// revoked, and a token whose key was revoked before it was used opens nothing (terminal.ts).
//
// Signed rather than stored, so issuing costs no write and a worker restart loses nothing but the
// list of used nonces (a token used before a restart could then be used once more within its TTL,
// at most 60 s; acceptable for a credential the same caller could mint again with its key).
// Single use: a redeemed nonce is remembered until its token expires. Every token lives the same
// TTL, so nonces expire in the order they were issued and are pruned from the front of one Map:
// memory is bounded by the tokens redeemed in the last TTL.
import { createHmac, randomBytes, timingSafeEqual, type KeyObject } from 'node:crypto';
import { AsbError } from '../../errors.ts';
import type { Clock } from '../../base/clock.ts';

export interface TerminalTokenClaims {
  sandboxId: string;
  /** The sandbox's owner team when the token was issued. */
  team: string;
  /** The prefix of the API key that asked for the token. */
  keyPrefix: string;
  /** Epoch ms after which the token is refused. */
  expiresAt: number;
}

export interface TerminalTokens {
  issue(sandboxId: string, team: string, keyPrefix: string): { token: string; expiresAt: number };
  /** The token's claims if it is genuine, unexpired, unused and for this sandbox; marks it used. 401 otherwise. */
  redeem(token: string, sandboxId: string): TerminalTokenClaims;
}

export interface TerminalTokenOptions {
  key: KeyObject;
  clock: Clock;
  ttlMs: number;
}

const NONCE_BYTES = 16;
// A token is ~150 characters; anything far longer is not one of ours and is not parsed.
const MAX_TOKEN_CHARS = 1024;

export function createTerminalTokens(opts: TerminalTokenOptions): TerminalTokens {
  const { key, clock, ttlMs } = opts;
  /** nonce → expiry, in issue order (= expiry order). */
  const used = new Map<string, number>();
  const sign = (body: string): Buffer => createHmac('sha256', key).update(body, 'utf8').digest();
  const prune = (now: number): void => {
    for (const [nonce, expiry] of used) {
      if (expiry > now) break;
      used.delete(nonce);
    }
  };
  const refuse = (why: string): AsbError => new AsbError('Unauthorized', `terminal token refused: ${why}; get a new one with POST /v1/sandboxes/{id}/terminal-tokens`);

  return {
    issue(sandboxId, team, keyPrefix) {
      const expiresAt = clock.now() + ttlMs;
      const body = Buffer.from(JSON.stringify({ s: sandboxId, t: team, k: keyPrefix, e: expiresAt, n: randomBytes(NONCE_BYTES).toString('base64url') }), 'utf8').toString('base64url');
      return { token: `${body}.${sign(body).toString('base64url')}`, expiresAt };
    },
    redeem(token, sandboxId) {
      if (token.length > MAX_TOKEN_CHARS) throw refuse('not a terminal token');
      const [body, mac, extra] = token.split('.');
      if (body === undefined || mac === undefined || extra !== undefined) throw refuse('not a terminal token');
      const expected = sign(body);
      const presented = Buffer.from(mac, 'base64url');
      if (presented.length !== expected.length || !timingSafeEqual(presented, expected)) throw refuse('bad signature (not issued by this cluster)');
      const claims = parseBody(body);
      if (claims === undefined) throw refuse('not a terminal token');
      const now = clock.now();
      prune(now);
      if (claims.expiresAt <= now) throw refuse('expired');
      if (claims.sandboxId !== sandboxId) throw refuse(`issued for another sandbox, not "${sandboxId}"`);
      if (used.has(claims.nonce)) throw refuse('already used (a token opens one session)');
      used.set(claims.nonce, claims.expiresAt);
      return { sandboxId: claims.sandboxId, team: claims.team, keyPrefix: claims.keyPrefix, expiresAt: claims.expiresAt };
    },
  };
}

function parseBody(body: string): (TerminalTokenClaims & { nonce: string }) | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(body, 'base64url').toString('utf8'));
  } catch {
    return undefined;
  }
  if (typeof parsed !== 'object' || parsed === null) return undefined;
  const { s, t, k, e, n } = parsed as Record<string, unknown>;
  // A token without k (issued before keys were carried, at most one TTL ago) is refused: it could not be revoked.
  if (typeof s !== 'string' || typeof t !== 'string' || typeof k !== 'string' || typeof e !== 'number' || typeof n !== 'string') return undefined;
  return { sandboxId: s, team: t, keyPrefix: k, expiresAt: e, nonce: n };
}
