// The controllers on the kube store and a real kube-apiserver: the same operator and claim tests
// the embedded store passes (test/support/controller-suite.ts), each in a namespace of its own,
// with the fake runtime playing the pods.
import { claimSuite, operatorSuite } from '../support/controller-suite.ts';
import type { HarnessStoreFactory } from '../support/operator-harness.ts';
import { kubeStoreTier } from '../support/kube-store.ts';

const tier = kubeStoreTier();

// The fixture exists only once before() has run; the suites call this per test.
const kubeStore: HarnessStoreFactory = (clock) => tier.fx.harnessStore(clock);

operatorSuite(kubeStore);
claimSuite(kubeStore);
