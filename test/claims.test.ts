// The claim hot path (Claimer) and SandboxClaim objects, against the real SQLite store and the
// fake runtime: the shared suite in test/support/controller-suite.ts, which
// test/k8s/controllers.test.ts runs against a real kube-apiserver.
import { claimSuite } from './support/controller-suite.ts';
import { sqliteHarnessStore } from './support/operator-harness.ts';

claimSuite(sqliteHarnessStore);
