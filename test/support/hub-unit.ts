// Pieces of a hub for unit tests of its sync and proxy parts: a store in a temporary directory
// holding one registered cluster, and an HTTP server on a kernel-chosen loopback port that hands
// every upgrade to the part under test. Both are cleaned up when the test ends.
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import type { TestContext } from 'node:test';
import { generateClusterCredential, hashClusterCredential } from '../../src/hub/cluster-credential.ts';
import { ClusterType, type ClusterSpec } from '../../src/api/hub-contract.ts';
import { openSqliteStore } from '../../src/store/sqlite.ts';
import type { ObjectStore } from '../../src/store/store.ts';

/** A hub store with cluster `c1` (tag cccc) registered; `spec` overrides its fields. */
export async function hubStoreWithCluster(t: TestContext, spec: Partial<ClusterSpec> = {}): Promise<{ store: ObjectStore; credential: string }> {
  const dir = mkdtempSync(join(tmpdir(), 'asb-hub-unit-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const store = await openSqliteStore({ path: join(dir, 'hub.db') });
  t.after(() => store.close());
  const credential = generateClusterCredential();
  await store.create(ClusterType, {
    apiVersion: 'asb.dev/v1alpha1',
    kind: 'Cluster',
    metadata: { name: 'c1' },
    spec: { region: 'r', ingressAddress: '127.0.0.1:1', tag: 'cccc', credentialHash: hashClusterCredential(credential), ...spec },
  });
  return { store, credential };
}

/** Serves upgrades with `part` on 127.0.0.1; returns the port. `part.close()` runs first at the end. */
export async function serveUpgrades(t: TestContext, part: { upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void; close(): Promise<void> }): Promise<number> {
  const server = createServer((_req, res) => res.end());
  server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => part.upgrade(req, socket, head));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(async () => {
    await part.close();
    server.closeAllConnections();
    server.close();
  });
  return (server.address() as AddressInfo).port;
}
