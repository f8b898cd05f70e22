// The cluster registry: register, update, rotate the credential of and remove worker clusters
// in the hub's store, and the view of a cluster that leaves the hub (never its credential hash).
import { apiVersionOf } from '../api/meta.ts';
import { isClusterTag } from '../api/ids.ts';
import { dnsLabelProblem, labelProblem } from '../api/names.ts';
import { AsbError, invalid, isAsbError, type FieldProblem } from '../errors.ts';
import { CLUSTER_SCOPE, type ObjectStore } from '../store/store.ts';
import { ClusterType, type Cluster, type ClusterSpec, type ClusterStatus } from '../api/hub-contract.ts';
import { generateClusterCredential, hashClusterCredential } from './cluster-credential.ts';
import type { SyncView } from './hub-context.ts';

/** What a caller may set on a cluster; absent fields keep their current value on update. */
export interface ClusterInput {
  region?: string | undefined;
  ingressAddress?: string | undefined;
  apiUrl?: string | undefined;
  labels?: Record<string, string> | undefined;
  drain?: boolean | undefined;
  tag?: string | undefined;
}

/** A cluster as the admin API shows it: the spec without credentialHash, and its sync status. */
export interface ClusterView {
  apiVersion: string;
  kind: string;
  metadata: Cluster['metadata'];
  spec: Omit<ClusterSpec, 'credentialHash'>;
  status: ClusterStatus;
}

/**
 * The cluster without its credential hash. With `sync`, the status is made current: the stored
 * one is written in batches and only when a worker reports, so after a hub restart it may still
 * say connected, and its lag is as of the last ack. Connected means a live sync connection now,
 * and lag is the hub's version now minus the newest version the cluster acknowledged.
 */
export function clusterView(cluster: Cluster, sync?: SyncView): ClusterView {
  const spec: Omit<ClusterSpec, 'credentialHash'> & { credentialHash?: string } = { ...cluster.spec };
  delete spec.credentialHash;
  const status: ClusterStatus = { ...cluster.status };
  if (sync !== undefined) {
    const live = sync.connections().find((c) => c.cluster === cluster.metadata.name);
    status.connected = live !== undefined;
    const applied = Math.max(status.appliedVersion ?? 0, live?.appliedVersion ?? 0);
    if (applied > 0 || live !== undefined) {
      status.appliedVersion = applied;
      status.lag = Math.max(0, sync.version() - applied);
    }
  }
  return { apiVersion: cluster.apiVersion, kind: cluster.kind, metadata: cluster.metadata, spec, status };
}

/** host:port, with an IPv6 host in brackets; port 1-65535. */
export function hostPortProblem(text: string): string | undefined {
  const m = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$/.exec(text);
  const port = Number(m?.[2]);
  if (m === null || port < 1 || port > 65535) return `must be host:port such as 10.0.0.7:10001 or [::1]:10001, got ${JSON.stringify(text)}`;
  return undefined;
}

function urlProblem(text: string): string | undefined {
  if (!URL.canParse(text)) return `must be an http(s) URL, got ${JSON.stringify(text)}`;
  const url = new URL(text);
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return `must be an http(s) URL, got ${JSON.stringify(text)}`;
  if (url.username !== '' || url.password !== '') return 'must not carry credentials';
  return undefined;
}

/** Every problem with `input` for cluster `name`, as field problems; `creating` requires the core fields. */
export function clusterInputProblems(name: string, input: ClusterInput, creating: boolean): FieldProblem[] {
  const problems: FieldProblem[] = [];
  const nameProblem = dnsLabelProblem(name);
  if (nameProblem !== undefined) problems.push({ field: 'metadata.name', message: nameProblem });
  if (creating) {
    for (const field of ['region', 'ingressAddress', 'tag'] as const) {
      if (input[field] === undefined) problems.push({ field, message: 'is required when registering a cluster' });
    }
  }
  if (input.region !== undefined) {
    const p = dnsLabelProblem(input.region);
    if (p !== undefined) problems.push({ field: 'region', message: p });
  }
  if (input.ingressAddress !== undefined) {
    const p = hostPortProblem(input.ingressAddress);
    if (p !== undefined) problems.push({ field: 'ingressAddress', message: p });
  }
  if (input.apiUrl !== undefined) {
    const p = urlProblem(input.apiUrl);
    if (p !== undefined) problems.push({ field: 'apiUrl', message: p });
  }
  if (input.tag !== undefined && !isClusterTag(input.tag)) {
    problems.push({ field: 'tag', message: `must be 4 characters [a-z0-9] (the prefix of this cluster's sandbox ids), got ${JSON.stringify(input.tag)}` });
  }
  for (const [k, v] of Object.entries(input.labels ?? {})) {
    const p = labelProblem(k, v);
    if (p !== undefined) problems.push({ field: `labels.${k}`, message: p });
  }
  return problems;
}

export interface RegisterResult {
  cluster: Cluster;
  /** Present only when this call created the cluster: shown once, never stored. */
  credential?: string;
  created: boolean;
}

/**
 * Registers the cluster or updates its configuration. The tag is fixed once registered (it is
 * baked into every sandbox id the cluster has made) and unique across clusters (a router finds a
 * sandbox's cluster by it alone).
 */
export async function registerCluster(store: ObjectStore, name: string, input: ClusterInput): Promise<RegisterResult> {
  const existing = await store.tryGet<Cluster>(ClusterType, CLUSTER_SCOPE, name);
  const problems = clusterInputProblems(name, input, existing === undefined);
  if (existing !== undefined && input.tag !== undefined && input.tag !== existing.spec.tag) {
    problems.push({ field: 'tag', message: `cannot change once registered (it is "${existing.spec.tag}"): sandbox ids already carry it; remove and re-register the cluster instead` });
  }
  if (problems.length > 0) throw invalid('Cluster', name, problems);

  const tag = input.tag ?? existing?.spec.tag ?? '';
  const all = await store.list<Cluster>(ClusterType);
  const clash = all.items.find((c) => c.spec.tag === tag && c.metadata.name !== name);
  if (clash !== undefined) throw new AsbError('AlreadyExists', `cluster tag "${tag}" is already used by cluster "${clash.metadata.name}"; every cluster needs its own tag`);

  const spec = mergedSpec(existing?.spec, input, tag);
  if (existing === undefined) {
    const credential = generateClusterCredential();
    const cluster = await store.create<Cluster>(ClusterType, {
      apiVersion: apiVersionOf(ClusterType),
      kind: ClusterType.kind,
      metadata: { name },
      spec: { ...spec, credentialHash: hashClusterCredential(credential) },
    });
    return { cluster, credential, created: true };
  }
  if (JSON.stringify(spec) === JSON.stringify(existing.spec)) return { cluster: existing, created: false };
  const cluster = await updateSpec(store, existing, () => spec);
  return { cluster, created: false };
}

/** How often a spec write is tried again while only the cluster's status moves under it. */
const SPEC_WRITE_TRIES = 5;

/**
 * Writes the spec change(spec) made, conditional on the version read. The hub writes each
 * connected cluster's status every few seconds (cluster-status.ts), which moves the version without
 * touching the spec: that is tried again on the object as it now is. A concurrent edit of the
 * spec itself stays a 409, never a lost update.
 */
async function updateSpec(store: ObjectStore, read: Cluster, change: (spec: ClusterSpec) => ClusterSpec): Promise<Cluster> {
  let current = read;
  for (let attempt = 1; ; attempt++) {
    try {
      return await store.update<Cluster>(ClusterType, { ...current, spec: change(current.spec) });
    } catch (err) {
      if (!isAsbError(err, 'Conflict') || attempt >= SPEC_WRITE_TRIES) throw err;
      const now = await store.tryGet<Cluster>(ClusterType, CLUSTER_SCOPE, read.metadata.name);
      if (now === undefined) throw clusterNotFound(read.metadata.name);
      if (JSON.stringify(now.spec) !== JSON.stringify(read.spec)) throw err;
      current = now;
    }
  }
}

function mergedSpec(current: ClusterSpec | undefined, input: ClusterInput, tag: string): ClusterSpec {
  const spec: ClusterSpec = {
    region: input.region ?? current?.region ?? '',
    ingressAddress: input.ingressAddress ?? current?.ingressAddress ?? '',
    tag,
    credentialHash: current?.credentialHash ?? '',
  };
  const apiUrl = input.apiUrl ?? current?.apiUrl;
  if (apiUrl !== undefined) spec.apiUrl = apiUrl;
  const labels = input.labels ?? current?.labels;
  if (labels !== undefined) spec.labels = labels;
  const drain = input.drain ?? current?.drain;
  if (drain !== undefined) spec.drain = drain;
  return spec;
}

/** Replaces the cluster's credential; the old one stops working at once. Returns the new one (shown once). */
export async function rotateClusterCredential(store: ObjectStore, name: string): Promise<{ cluster: Cluster; credential: string }> {
  const existing = await store.tryGet<Cluster>(ClusterType, CLUSTER_SCOPE, name);
  if (existing === undefined) throw clusterNotFound(name);
  const credential = generateClusterCredential();
  const cluster = await updateSpec(store, existing, (spec) => ({ ...spec, credentialHash: hashClusterCredential(credential) }));
  return { cluster, credential };
}

export function clusterNotFound(name: string): AsbError {
  return new AsbError('NotFound', `cluster "${name}" is not registered (see GET /v1/clusters)`);
}
