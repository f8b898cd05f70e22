// The object store contract, with Kubernetes API semantics. Controllers and the worker API use
// only this interface; the embedded SQLite store and (later) the kube-apiserver adapter implement
// it, and one controller test suite runs against both.
//
// Semantics (the same as the kube-apiserver's):
// - resourceVersion is an opaque decimal string; every write gets a new, larger one.
// - update/updateStatus with a metadata.resourceVersion fail with Conflict when it is stale;
//   without one they are unconditional.
// - update ignores status; updateStatus changes only status.
// - generation goes up by one when spec changes.
// - delete of an object with finalizers only sets deletionTimestamp; the object goes away when
//   an update removes the last finalizer. Updates may not add finalizers once deleting.
// - watch from resourceVersion R delivers every change after R, in order, with no gap; if R is
//   older than what the store retains, the watch ends with a Gone error and the caller relists.
import type { KubeObject, ResourceType } from '../api/meta.ts';

export interface ListOptions {
  namespace?: string;
  /** Equality-based selector: `a=b,c!=d,e` (exists), `!f` (does not exist). */
  labelSelector?: string;
  /** Field selector limited to metadata.name and metadata.namespace. */
  limit?: number;
  /** Opaque token from a previous page's `continue`. */
  continue?: string;
}

export interface ListResult<T extends KubeObject> {
  items: T[];
  /** The store's resourceVersion at the time of the list: watch from here for no gap. */
  resourceVersion: string;
  /** Present when more items remain; pass it back as `continue`. */
  continue?: string;
}

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK';

export interface WatchEvent<T extends KubeObject> {
  type: WatchEventType;
  object: T;
}

export interface WatchOptions {
  namespace?: string;
  labelSelector?: string;
  /** Deliver changes after this version. Absent: start now (no replay). */
  resourceVersion?: string;
}

export interface Watch {
  /** Stops delivery; idempotent. */
  close(): void;
}

export interface WatchHandlers<T extends KubeObject> {
  onEvent(event: WatchEvent<T>): void;
  /** The watch ended by itself (Gone, store closed, connection lost). Not called after close(). */
  onError(err: Error): void;
}

export interface DeleteOptions {
  /** Delete only if the object still has this resourceVersion (Conflict otherwise). */
  resourceVersion?: string;
  uid?: string;
}

export interface ObjectStore {
  get<T extends KubeObject>(rt: ResourceType, namespace: string, name: string): Promise<T>;
  /** Like get, but undefined instead of NotFound. */
  tryGet<T extends KubeObject>(rt: ResourceType, namespace: string, name: string): Promise<T | undefined>;
  /** Whether the object exists: tryGet without the copy, for checks on a hot path. */
  exists(rt: ResourceType, namespace: string, name: string): Promise<boolean>;
  list<T extends KubeObject>(rt: ResourceType, opts?: ListOptions): Promise<ListResult<T>>;
  /** Sets uid, resourceVersion, generation 1, creationTimestamp; honours generateName. */
  create<T extends KubeObject>(rt: ResourceType, obj: T): Promise<T>;
  update<T extends KubeObject>(rt: ResourceType, obj: T): Promise<T>;
  updateStatus<T extends KubeObject>(rt: ResourceType, obj: T): Promise<T>;
  /** Returns the object as deleted, or with deletionTimestamp set if finalizers remain. */
  delete<T extends KubeObject>(rt: ResourceType, namespace: string, name: string, opts?: DeleteOptions): Promise<T>;
  watch<T extends KubeObject>(rt: ResourceType, opts: WatchOptions, handlers: WatchHandlers<T>): Watch;
  /** Flushes pending writes and releases the database; idempotent. */
  close(): Promise<void>;
}

/** Namespace used for cluster-scoped kinds inside stores that key by namespace. */
export const CLUSTER_SCOPE = '';
