// Sandbox ids are [a-z0-9]+, globally unique, and carry their cluster: the first
// CLUSTER_TAG_LENGTH characters are the owning cluster's tag, so any router knows the cluster
// of any id with zero lookups. 16 random base-36 characters give 82 bits: at a million
// sandboxes the chance of any collision is about 1e-13.
import { randomBytes } from 'node:crypto';

export const CLUSTER_TAG_LENGTH = 4;
const RANDOM_LENGTH = 16;
const ALPHABET = 'abcdefghijklmnopqrstuvwxyz0123456789';
const TAG_PATTERN = /^[a-z0-9]{4}$/;
const ID_PATTERN = /^[a-z0-9]{20}$/;

export function isClusterTag(tag: string): boolean {
  return TAG_PATTERN.test(tag);
}

export function newSandboxId(clusterTag: string): string {
  if (!isClusterTag(clusterTag)) throw new Error(`cluster tag must be 4 characters [a-z0-9], got "${clusterTag}"`);
  return clusterTag + randomString(RANDOM_LENGTH);
}

/** The cluster tag of a generated id, or undefined for user-named sandboxes. */
export function clusterTagOf(id: string): string | undefined {
  return ID_PATTERN.test(id) ? id.slice(0, CLUSTER_TAG_LENGTH) : undefined;
}

export function randomString(length: number): string {
  // 252 is the largest multiple of 36 below 256: rejecting bytes ≥ 252 keeps it unbiased.
  let out = '';
  while (out.length < length) {
    for (const byte of randomBytes(length * 2)) {
      if (byte < 252 && out.length < length) out += ALPHABET.charAt(byte % 36);
    }
  }
  return out;
}
