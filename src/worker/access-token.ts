// Data-plane access tokens: a sandbox's ports answer only requests that carry its token.
//
// token = base64url(HMAC-SHA256(clusterSecret, sandboxId)) cut to 32 characters (192 bits).
// Deriving the token instead of storing it lets the worker hand it out again at any time (the E2B
// connect call needs it) with nothing per sandbox on disk, and the route feed carries only
// sha256(token), so routers can check a token without ever being able to mint one.
//
// The cluster secret is 32 random bytes in <dataDir>/cluster.secret, mode 0600, created on the
// first start and read on every later one. Deleting it rotates every token of the cluster.
import { createHash, createHmac, createSecretKey, randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AsbError } from '../errors.ts';

export const CLUSTER_SECRET_FILE = 'cluster.secret';
const SECRET_BYTES = 32;
/** 32 base64url characters = 192 bits: far past guessing, short enough to paste into a URL or header. */
const TOKEN_CHARS = 32;
// Tokens and their hashes are remembered per sandbox id: a claim needs both (the route feed's
// entry and the response), and deriving them was 30 of the ~540 ms of worker CPU in a probe of
// 5 bursts of 64 claims (bench/claim-probe.ts), mostly createHmac re-importing the raw key.
// 100,000 ids × ~200 B = ~20 MB at most; past that the memo starts over (a cache, not state).
const MEMO_LIMIT = 100_000;

export interface AccessTokens {
  /** The sandbox's data-plane access token; the same for the sandbox's whole life. */
  accessToken(id: string): string;
  /** hex sha256 of the sandbox's token, as the route feed publishes it. */
  tokenHashOf(id: string): string;
}

/** hex sha256 of a token: what routers compare a presented token against. */
export function tokenHash(token: string): string {
  return createHash('sha256').update(token, 'utf8').digest('hex');
}

/** Constant-time check of a presented token against a feed entry's tokenHash. */
export function tokenMatches(presented: string, expectedHash: string): boolean {
  const a = Buffer.from(tokenHash(presented), 'hex');
  const b = Buffer.from(expectedHash, 'hex');
  return a.length === b.length && timingSafeEqual(a, b);
}

export function createAccessTokens(secret: Uint8Array): AccessTokens {
  if (secret.byteLength < SECRET_BYTES) throw new AsbError('Internal', `cluster secret must be at least ${SECRET_BYTES} bytes, got ${secret.byteLength}`);
  // A KeyObject is imported once; a raw Buffer key is re-imported by every createHmac.
  const key = createSecretKey(Buffer.from(secret));
  const memo = new Map<string, { token: string; hash: string | undefined }>();
  const remembered = (id: string): { token: string; hash: string | undefined } => {
    let found = memo.get(id);
    if (found === undefined) {
      if (memo.size >= MEMO_LIMIT) memo.clear();
      found = { token: createHmac('sha256', key).update(id, 'utf8').digest('base64url').slice(0, TOKEN_CHARS), hash: undefined };
      memo.set(id, found);
    }
    return found;
  };
  return {
    accessToken: (id) => remembered(id).token,
    tokenHashOf: (id) => {
      const found = remembered(id);
      found.hash ??= tokenHash(found.token);
      return found.hash;
    },
  };
}

/**
 * Reads `<dataDir>/cluster.secret`, creating it (32 random bytes, mode 0600) if absent. The
 * exclusive create ('wx') means two processes starting on one data dir agree on one secret.
 */
export function loadClusterSecret(dataDir: string): Buffer {
  const file = join(dataDir, CLUSTER_SECRET_FILE);
  try {
    writeFileSync(file, randomBytes(SECRET_BYTES), { mode: 0o600, flag: 'wx' });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  const secret = readFileSync(file);
  if (secret.byteLength !== SECRET_BYTES) {
    throw new AsbError('Internal', `${file} holds ${secret.byteLength} bytes, expected ${SECRET_BYTES}; delete it to create a new secret (this changes every sandbox's access token)`);
  }
  return secret;
}
