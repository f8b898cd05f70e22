// Kube stores for the shared store and controller suites: our CRDs installed on a real
// kube-apiserver (test/support/kube-apiserver.ts starts one per test file), and per test a
// KubeStore with namespaces of its own, emptied afterwards so the next test's operator (which
// watches every namespace) finds nothing left over.
import { after, before, type TestContext } from 'node:test';
import { allCrds } from '../../src/api/crd.ts';
import type { KubeObject, ResourceType } from '../../src/api/meta.ts';
import { RESOURCE_TYPES } from '../../src/api/types.ts';
import { AsbError, isAsbError } from '../../src/errors.ts';
import { openKubeStore, type KubeStore, type KubeStoreOptions } from '../../src/store/kube.ts';
import { KubeHttp, loadKubeConfig } from '../../src/store/kube-http.ts';
import type { HarnessStoreFactory } from './operator-harness.ts';
import type { StoreUnderTest } from './store-suite.ts';
import { startKubeApiServer, type KubeApiServer } from './kube-apiserver.ts';
import { waitFor } from './wait.ts';

const CRD_PATH = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions';

interface Crd {
  metadata: { name: string };
  status?: { conditions?: { type: string; status: string }[] };
}

function ok(res: { status: number; body: unknown }, what: string): unknown {
  if (res.status >= 200 && res.status < 300) return res.body;
  throw new Error(`${what}: HTTP ${res.status}: ${JSON.stringify(res.body)}`);
}

/** Creates our CRDs from allCrds() through the API and waits until each is Established. */
export async function installCrds(kubeconfig: string): Promise<void> {
  const http = await KubeHttp.open(loadKubeConfig(kubeconfig));
  try {
    for (const crd of allCrds()) {
      const res = await http.request('POST', CRD_PATH, JSON.stringify(crd));
      if (res.status !== 409) ok(res, `create CRD ${crd.metadata.name}`);
    }
    for (const crd of allCrds()) {
      await waitFor(`CRD ${crd.metadata.name} Established`, async () => {
        const got = ok(await http.request('GET', `${CRD_PATH}/${crd.metadata.name}`), 'read CRD') as Crd;
        return got.status?.conditions?.some((c) => c.type === 'Established' && c.status === 'True') === true ? true : undefined;
      });
    }
    // Established means served; the first request for a new group can still 404 for a moment
    // while discovery catches up, so wait until every kind lists.
    for (const rt of RESOURCE_TYPES) {
      const path = `/apis/${rt.group}/${rt.version}/${rt.plural}?limit=1`;
      await waitFor(`${rt.plural} served`, async () => ((await http.request('GET', path)).status === 200 ? true : undefined));
    }
  } finally {
    http.close();
  }
}

let nextTest = 0;

/** Removes every object of ours in `namespaces` (and every cluster-scoped one), finalizers first. */
export async function emptyNamespaces(store: KubeStore, namespaces: readonly string[]): Promise<void> {
  const scopes = (rt: ResourceType): readonly string[] => (rt.namespaced ? namespaces : ['']);
  const lists = RESOURCE_TYPES.flatMap((rt) => scopes(rt).map(async (namespace) => ({ rt, items: (await store.list<KubeObject>(rt, { namespace })).items })));
  for (const { rt, items } of await Promise.all(lists)) {
    await Promise.all(items.map(async (obj) => {
      try {
        // The test's operators have stopped: nobody else writes, so the listed version holds.
        if ((obj.metadata.finalizers ?? []).length > 0) await store.update(rt, { ...obj, metadata: { ...obj.metadata, finalizers: [] } });
        await store.delete(rt, obj.metadata.namespace ?? '', obj.metadata.name);
      } catch (err) {
        if (!isAsbError(err, 'NotFound')) throw err;
      }
    }));
  }
}

export interface KubeTestStore extends StoreUnderTest {
  store: KubeStore;
  /** Empties the test's namespaces and closes the store. */
  dispose: () => Promise<void>;
}

export interface KubeStoreFixture {
  /** A store with fresh namespaces for the logical names given; the caller disposes of it. */
  create(logical: readonly string[], opts?: Omit<KubeStoreOptions, 'kubeconfig'>): Promise<KubeTestStore>;
  /** create(), disposed of in t.after: the shared store suite's factory. */
  open(t: TestContext, logical: readonly string[]): Promise<StoreUnderTest>;
  /** The controller suite's factory: one namespace per test. */
  harnessStore: HarnessStoreFactory;
}

export function kubeStoreFixture(kubeconfig: string): KubeStoreFixture {
  const create = async (logical: readonly string[], opts: Omit<KubeStoreOptions, 'kubeconfig'> = {}): Promise<KubeTestStore> => {
    const prefix = `t${++nextTest}-${Math.random().toString(36).slice(2, 6)}`;
    const ns = (name: string): string => {
      if (!logical.includes(name)) throw new AsbError('Internal', `test asked for namespace "${name}" it did not declare`);
      return `${prefix}-${name}`;
    };
    const namespaces = logical.map(ns);
    const http = await KubeHttp.open(loadKubeConfig(kubeconfig));
    try {
      for (const name of namespaces) ok(await http.request('POST', '/api/v1/namespaces', JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name } })), `create namespace ${name}`);
    } finally {
      http.close();
    }
    const store = await openKubeStore({ ...opts, kubeconfig });
    const dispose = async (): Promise<void> => {
      try {
        await emptyNamespaces(store, namespaces);
      } finally {
        await store.close();
      }
    };
    return { store, ns, dispose };
  };
  return {
    create,
    async open(t, logical) {
      const made = await create(logical);
      t.after(made.dispose);
      return made;
    },
    harnessStore: async () => {
      const made = await create(['default', 'other']);
      return { store: made.store, ns: made.ns('default'), otherNs: made.ns('other'), dispose: made.dispose };
    },
  };
}

/**
 * One API server with our CRDs for a whole test file (its before/after hooks), and the store
 * fixture on it. Read `kube` and `fx` inside tests: they exist once before() has run.
 */
export function kubeStoreTier(): { readonly kube: KubeApiServer; readonly fx: KubeStoreFixture } {
  let kube: KubeApiServer | undefined;
  let fx: KubeStoreFixture | undefined;
  before(async () => {
    kube = await startKubeApiServer({ etcdUnsafeNoFsync: true });
    await installCrds(kube.kubeconfigPath);
    fx = kubeStoreFixture(kube.kubeconfigPath);
  });
  after(() => kube?.stop());
  const ready = <T>(value: T | undefined): T => {
    if (value === undefined) throw new Error('the kube tier is used before its before() hook ran');
    return value;
  };
  return {
    get kube() {
      return ready(kube);
    },
    get fx() {
      return ready(fx);
    },
  };
}
