// A hub (src/hub/hub-main.ts) in its own process for tests that need a real one, and its admin
// API. Its data, admin key and log live under the directory the test gives.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { startChild, type ReadyChild } from '../../src/base/child.ts';
import { api } from './worker-process.ts';

const repoRoot = resolve(import.meta.dirname, '../..');

export type Hub = ReadyChild<{ ready: true; url: string }>;

export function startHubProcess(dir: string): Promise<Hub> {
  return startChild({
    name: 'hub',
    entry: join(repoRoot, 'src/hub/hub-main.ts'),
    args: ['--data-dir', join(dir, 'hub'), '--port', '0', '--admin-key-file', join(dir, 'hub-admin.key'), '--log-level', 'warn'],
    logPath: join(dir, 'hub.log'),
  });
}

/** The admin key the hub of `dir` made on its first start (the same across its restarts). */
export function hubAdminKey(dir: string): string {
  return readFileSync(join(dir, 'hub-admin.key'), 'utf8').trim();
}

export interface HubView {
  url: string;
  adminKey: string;
}

/** A call to the hub's admin API that must succeed; resolves with the body. */
export async function hubCall<T>(hub: HubView, method: string, path: string, body?: unknown): Promise<T> {
  const res = await api<T>({ apiUrl: hub.url, adminKey: hub.adminKey }, method, path, body);
  assert.ok(res.status < 300, `hub ${method} ${path}: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body;
}
