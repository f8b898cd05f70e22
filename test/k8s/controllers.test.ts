// The controllers on the kube store and a real kube-apiserver: the same operator and claim tests
// the embedded store passes (test/support/controller-suite.ts), each in a namespace of its own,
// with the fake runtime playing the pods.
import { after, before } from 'node:test';
import { startKubeApiServer, type KubeApiServer } from '../support/kube-apiserver.ts';
import { claimSuite, operatorSuite } from '../support/controller-suite.ts';
import type { HarnessStoreFactory } from '../support/operator-harness.ts';
import { installCrds, kubeStoreFixture, type KubeStoreFixture } from '../support/kube-store.ts';

let kube: KubeApiServer;
let fx: KubeStoreFixture;
before(async () => {
  kube = await startKubeApiServer({ etcdUnsafeNoFsync: true });
  await installCrds(kube.kubeconfigPath);
  fx = kubeStoreFixture(kube.kubeconfigPath);
});
after(() => kube.stop());

// The fixture exists only once before() has run; the suites call this per test.
const kubeStore: HarnessStoreFactory = (clock) => fx.harnessStore(clock);

operatorSuite(kubeStore);
claimSuite(kubeStore);
