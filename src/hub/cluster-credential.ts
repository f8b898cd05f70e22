// A cluster's sync credential: `asbc_<32 chars [a-z0-9]>`, shown once when the cluster is
// registered (or the credential rotated). The hub stores only its hex sha256 in
// Cluster spec.credentialHash, so a leaked hub database leaks no credential. As with API keys
// (src/auth/keys.ts), 32 base-36 characters carry ~165 bits, far past brute force, so one fast
// hash is enough and lets the sync endpoint verify in microseconds.
import { createHash, timingSafeEqual } from 'node:crypto';
import { randomString } from '../api/ids.ts';

const CREDENTIAL_PATTERN = /^asbc_[a-z0-9]{32}$/;

export function generateClusterCredential(): string {
  return `asbc_${randomString(32)}`;
}

export function isClusterCredential(text: string): boolean {
  return CREDENTIAL_PATTERN.test(text);
}

/** Hex sha256 of the whole credential, as stored in Cluster spec.credentialHash. */
export function hashClusterCredential(credential: string): string {
  return createHash('sha256').update(credential, 'utf8').digest('hex');
}

/** Whether `presented` is the credential whose hash is `storedHash`, compared in constant time. */
export function credentialMatches(presented: string, storedHash: string): boolean {
  if (!isClusterCredential(presented) || !/^[0-9a-f]{64}$/.test(storedHash)) return false;
  return timingSafeEqual(Buffer.from(hashClusterCredential(presented), 'hex'), Buffer.from(storedHash, 'hex'));
}
