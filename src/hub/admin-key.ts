// The hub's bootstrap admin key: kept in a file (mode 0600) so `make up` and the CLI find it, and
// re-created only when the file's key is missing, malformed, revoked or no longer an admin key
// in the store, so restarts keep the same key.
import { readFileSync, writeFileSync } from 'node:fs';
import { ApiKeyType, type ApiKey } from '../api/types.ts';
import { createApiKey, hashApiKey, parseApiKey } from '../auth/keys.ts';
import { CLUSTER_SCOPE, type ObjectStore } from '../store/store.ts';

export async function ensureHubAdminKey(store: ObjectStore, file: string): Promise<string> {
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
  const { key } = await createApiKey(store, { team: 'admin', admin: true, description: 'hub admin key (--admin-key-file)' });
  writeFileSync(file, `${key}\n`, { mode: 0o600 });
  return key;
}
