// The hub's cluster registry against its own status writes: every connected cluster's status is
// written every few seconds (src/hub/cluster-status.ts), which moves the object's version. An
// admin's change (asb cluster add/drain/rotate) read before such a write must still land; only a
// concurrent change of the spec itself is a 409. Found when `make test` failed a drain with
// "resourceVersion 14 is stale" under load.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { registerCluster, rotateClusterCredential } from '../src/hub/clusters.ts';
import { ClusterType, type Cluster } from '../src/api/hub-contract.ts';
import { hashClusterCredential } from '../src/hub/cluster-credential.ts';
import { CLUSTER_SCOPE, type ObjectStore } from '../src/store/store.ts';
import { hubStoreWithCluster } from './support/hub-unit.ts';

/** The store, with `meanwhile` run once against it between the caller's read and its first update. */
function racing(store: ObjectStore, meanwhile: (store: ObjectStore) => Promise<void>): ObjectStore {
  let raced = false;
  return new Proxy(store, {
    get(target, prop) {
      if (prop === 'update' && !raced) {
        return async (...args: Parameters<ObjectStore['update']>) => {
          raced = true;
          await meanwhile(target);
          return target.update(...args);
        };
      }
      const value: unknown = Reflect.get(target, prop);
      return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
}

async function c1(store: ObjectStore): Promise<Cluster> {
  const cluster = await store.tryGet<Cluster>(ClusterType, CLUSTER_SCOPE, 'c1');
  assert.ok(cluster !== undefined);
  return cluster;
}

/** What cluster-status.ts does on a heartbeat: an unconditional status write. */
async function heartbeat(store: ObjectStore): Promise<void> {
  const current = await c1(store);
  const { resourceVersion: _rv, ...metadata } = current.metadata;
  await store.updateStatus<Cluster>(ClusterType, { ...current, metadata, status: { ...current.status, lastSeen: new Date().toISOString() } });
}

test('a drain or a new address lands although the hub wrote the cluster\'s status between the read and the write', async (t) => {
  const { store } = await hubStoreWithCluster(t);
  const { cluster } = await registerCluster(racing(store, heartbeat), 'c1', { drain: true, ingressAddress: '127.0.0.1:2' });
  assert.equal(cluster.spec.drain, true);
  const stored = await c1(store);
  assert.deepEqual([stored.spec.drain, stored.spec.ingressAddress], [true, '127.0.0.1:2']);
  assert.ok(stored.status?.lastSeen !== undefined, 'and the status write stays');
});

test('a credential rotation lands although the hub wrote the cluster\'s status meanwhile', async (t) => {
  const { store } = await hubStoreWithCluster(t);
  const { credential } = await rotateClusterCredential(racing(store, heartbeat), 'c1');
  assert.equal((await c1(store)).spec.credentialHash, hashClusterCredential(credential));
});

test('a concurrent change of the spec itself is still a 409, never a lost update', async (t) => {
  const { store } = await hubStoreWithCluster(t);
  const otherAdmin = async (s: ObjectStore): Promise<void> => {
    const current = await c1(s);
    await s.update<Cluster>(ClusterType, { ...current, spec: { ...current.spec, region: 'elsewhere' } });
  };
  await assert.rejects(registerCluster(racing(store, otherAdmin), 'c1', { drain: true }), (err: Error & { code?: string }) => err.code === 'Conflict');
  const stored = await c1(store);
  assert.deepEqual([stored.spec.region, stored.spec.drain], ['elsewhere', undefined]);
});
