// API keys: `asb_<prefix>_<secret>`, prefix 8 and secret 32 characters of [a-z0-9]. Only a hash
// is stored, in an ApiKey object named after the prefix, so a leaked database leaks no key.
//
// The hash is a single sha256 of the whole key, not a slow password hash: a key carries
// 40 × log2(36) ≈ 207 bits of randomness (190 of them in the secret), so brute force is out of
// reach whatever the hash costs, and a fast hash lets every request be verified in ~1 µs.
import { createHash } from 'node:crypto';
import { randomString } from '../api/ids.ts';
import type { ApiKey } from '../api/types.ts';
import { ApiKeyType } from '../api/types.ts';
import { apiVersionOf } from '../api/meta.ts';
import { AsbError } from '../errors.ts';
import { CLUSTER_SCOPE, type ObjectStore } from '../store/store.ts';

const PREFIX_LENGTH = 8;
const SECRET_LENGTH = 32;
const KEY_PATTERN = /^asb_([a-z0-9]{8})_([a-z0-9]{32})$/;
// A team becomes the value of the asb.dev/owner label, so it must be a valid label value.
const TEAM_PATTERN = /^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$/;

export interface ParsedKey {
  prefix: string;
  secret: string;
}

/** Splits a presented key, or undefined when it does not have the key shape. */
export function parseApiKey(key: string): ParsedKey | undefined {
  const m = KEY_PATTERN.exec(key);
  if (m === null) return undefined;
  return { prefix: m[1] ?? '', secret: m[2] ?? '' };
}

/** Hex sha256 of the whole key, as stored in ApiKey spec.hash. */
export function hashApiKey(key: string): string {
  return createHash('sha256').update(key, 'utf8').digest('hex');
}

export function generateApiKey(): string {
  return `asb_${randomString(PREFIX_LENGTH)}_${randomString(SECRET_LENGTH)}`;
}

export function isValidTeam(team: string): boolean {
  return TEAM_PATTERN.test(team);
}

export interface NewApiKey {
  team: string;
  admin?: boolean;
  description?: string;
}

/**
 * Mints a key and stores its hash. The key itself is returned once and never stored: whoever
 * calls this must hand it to the user now.
 */
export async function createApiKey(store: ObjectStore, opts: NewApiKey): Promise<{ key: string; object: ApiKey }> {
  if (!isValidTeam(opts.team)) {
    throw new AsbError('Invalid', `team "${opts.team}" is not a valid name: use 1-63 letters, digits, '.', '_' or '-', starting and ending with a letter or digit`, {
      fields: [{ field: 'team', message: 'must be a valid label value' }],
    });
  }
  const key = generateApiKey();
  const parsed = parseApiKey(key);
  if (parsed === undefined) throw new AsbError('Internal', 'generated API key does not parse');
  const spec: ApiKey['spec'] = { team: opts.team, hash: hashApiKey(key), prefix: `asb_${parsed.prefix}`, admin: opts.admin ?? false, revoked: false };
  if (opts.description !== undefined) spec.description = opts.description;
  const object = await store.create<ApiKey>(ApiKeyType, {
    apiVersion: apiVersionOf(ApiKeyType),
    kind: ApiKeyType.kind,
    metadata: { name: parsed.prefix, labels: { 'asb.dev/team': opts.team } },
    spec,
  });
  return { key, object };
}

/** Marks a key revoked; the KeyRing drops it as soon as the watch delivers the change. */
export async function revokeApiKey(store: ObjectStore, prefix: string): Promise<ApiKey> {
  const name = prefix.startsWith('asb_') ? prefix.slice(4) : prefix;
  const current = await store.get<ApiKey>(ApiKeyType, CLUSTER_SCOPE, name);
  return store.update<ApiKey>(ApiKeyType, { ...current, spec: { ...current.spec, revoked: true } });
}
