// The bootstrap admin key of a worker or the hub: kept in a file (mode 0600) so `make up` and
// the CLI find it, and re-created only when the file's key is missing, malformed, revoked or no
// longer an admin key in the store, so restarts keep the same key. Only its hash is stored.
import { readFileSync, writeFileSync } from 'node:fs';
import { ApiKeyType, type ApiKey } from '../api/types.ts';
import { createApiKey, hashApiKey, parseApiKey } from './keys.ts';
import { CLUSTER_SCOPE, type ObjectStore } from '../store/store.ts';

export async function ensureAdminKey(store: ObjectStore, file: string, description: string): Promise<string> {
  let existing: string | undefined;
  try {
    existing = readFileSync(file, 'utf8').trim();
  } catch {
    existing = undefined;
  }
  const parsed = existing === undefined ? undefined : parseApiKey(existing);
  if (existing !== undefined && parsed !== undefined) {
    const obj = await store.tryGet<ApiKey>(ApiKeyType, CLUSTER_SCOPE, parsed.prefix);
    if (obj !== undefined && obj.spec.revoked !== true && obj.spec.admin === true && obj.spec.hash === hashApiKey(existing)) return existing;
  }
  const { key } = await createApiKey(store, { team: 'admin', admin: true, description });
  writeFileSync(file, `${key}\n`, { mode: 0o600 });
  return key;
}
