// Which worker answers for a sandbox: the cluster whose tag starts the id (src/api/ids.ts), so the
// hub needs no lookup table of sandboxes. Shared by the HTTP proxy (src/hub/sandbox-proxy.ts) and
// the terminal proxy (src/hub/terminal-proxy.ts), so both refuse the same way:
//   404 when the id carries no tag, or no registered cluster has that tag (the sandbox cannot exist);
//   503 when the cluster exists but the hub cannot reach it now (not connected, no apiUrl).
import { clusterTagOf } from '../api/ids.ts';
import { AsbError } from '../errors.ts';
import type { ObjectStore } from '../store/store.ts';
import { ClusterType, type Cluster } from '../api/hub-contract.ts';
import type { SyncView } from './hub-context.ts';

export interface SandboxOwner {
  cluster: string;
  /** The worker API's base URL, without a trailing slash. */
  apiUrl: string;
}

export async function ownerOf(store: ObjectStore, sync: SyncView | undefined, id: string): Promise<SandboxOwner> {
  const tag = clusterTagOf(id);
  if (tag === undefined) {
    throw new AsbError('NotFound', `sandbox "${id}" not found: its id does not start with a cluster tag (ids are 20 characters [a-z0-9]); list yours with GET /v1/sandboxes`);
  }
  const clusters = (await store.list<Cluster>(ClusterType)).items;
  const cluster = clusters.find((c) => c.spec.tag === tag && c.metadata.deletionTimestamp === undefined);
  if (cluster === undefined) {
    throw new AsbError('NotFound', `sandbox "${id}" not found: no registered cluster has the tag "${tag}" its id starts with; list yours with GET /v1/sandboxes`);
  }
  const name = cluster.metadata.name;
  if (cluster.spec.apiUrl === undefined) {
    throw new AsbError('Unavailable', `cluster "${name}", which holds sandbox "${id}", has no apiUrl registered (set it with PUT /v1/clusters/${name})`);
  }
  if (sync?.live().has(name) !== true) {
    throw new AsbError('Unavailable', `cluster "${name}", which holds sandbox "${id}", is not connected to the hub; try again when it is back (GET /v1/federation shows its health)`);
  }
  return { cluster: name, apiUrl: cluster.spec.apiUrl.replace(/\/$/, '') };
}
