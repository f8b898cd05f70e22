// Data-plane access tokens: a sandbox's ports answer only requests that carry its token.
//
// token = base64url(HMAC-SHA256(clusterSecret, "<uid>/<generation>")) cut to 32 characters (192 bits).
// Deriving the token instead of storing it lets the worker hand it out again at any time (the E2B
// connect call needs it) with nothing secret per sandbox on disk, and the route feed carries only
// sha256(token), so routers can check a token without ever being able to mint one.
// The input is the object's uid, not its name: names are chosen by users and come back (team A
// deletes `my-sandbox`, team B creates its own), and a token derived from the name opened the
// new one too. The generation (annotation asb.dev/token-generation, 0 when absent) is bumped by
// POST /v1/sandboxes/{id}/token, which makes every token handed out before it stop working.
//
// The cluster secret is 32 random bytes in <dataDir>/cluster.secret, mode 0600, created on the
// first start and read on every later one. Deleting it rotates every token of the cluster.
import { createHash, createHmac, createSecretKey, randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ANNOTATION, type Sandbox } from '../api/types.ts';
import { AsbError } from '../errors.ts';

export const CLUSTER_SECRET_FILE = 'cluster.secret';
const SECRET_BYTES = 32;
/** 32 base64url characters = 192 bits: far past guessing, short enough to paste into a URL or header. */
const TOKEN_CHARS = 32;
// Tokens and their hashes are remembered per uid and generation: a claim needs both (the route feed's
// entry and the response), and deriving them was 30 of the ~540 ms of worker CPU in a probe of
// 5 bursts of 64 claims (bench/claim-probe.ts), mostly createHmac re-importing the raw key.
// 100,000 sandboxes × ~200 B = ~20 MB at most; past that the memo starts over (a cache, not state).
const MEMO_LIMIT = 100_000;

/** What a token is derived from: the object's uid and its token generation annotation. */
export type TokenSubject = Pick<Sandbox, 'metadata'>;

export interface AccessTokens {
  /** The sandbox's data-plane access token: the same until its generation is bumped or it is deleted. */
  accessToken(sandbox: TokenSubject): string;
  /** hex sha256 of the sandbox's token, as the route feed publishes it. */
  tokenHashOf(sandbox: TokenSubject): string;
  /** A secret for another purpose (e.g. the terminal token key), derived from the cluster secret and `label`. */
  derive(label: string): string;
}

/** The sandbox's token generation: the annotation's non-negative integer, 0 when absent or malformed. */
export function tokenGenerationOf(sandbox: TokenSubject): number {
  const raw = sandbox.metadata.annotations?.[ANNOTATION.tokenGeneration];
  const n = raw === undefined ? 0 : Number(raw);
  return Number.isSafeInteger(n) && n >= 0 ? n : 0;
}

function tokenInput(sandbox: TokenSubject): string {
  const { uid } = sandbox.metadata;
  // Every stored object has a uid; one without it (never written) must not get a token shared by all such objects.
  if (uid === undefined || uid === '') throw new AsbError('Internal', `sandbox "${sandbox.metadata.name}" has no uid; it has no access token before it is stored`);
  return `${uid}/${tokenGenerationOf(sandbox)}`;
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
  const derive = (input: string): string => createHmac('sha256', key).update(input, 'utf8').digest('base64url').slice(0, TOKEN_CHARS);
  const remembered = (sandbox: TokenSubject): { token: string; hash: string | undefined } => {
    const input = tokenInput(sandbox);
    let found = memo.get(input);
    if (found === undefined) {
      if (memo.size >= MEMO_LIMIT) memo.clear();
      found = { token: derive(input), hash: undefined };
      memo.set(input, found);
    }
    return found;
  };
  return {
    accessToken: (sandbox) => remembered(sandbox).token,
    tokenHashOf: (sandbox) => {
      const found = remembered(sandbox);
      found.hash ??= tokenHash(found.token);
      return found.hash;
    },
    // Labels and token inputs cannot meet: an input is "<uid>/<n>", and labels are chosen by us.
    derive,
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
