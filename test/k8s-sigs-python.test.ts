// kubernetes-sigs' own Python SDK (`k8s-agent-sandbox` 1.0.8 from PyPI, unmodified) end to end,
// in Direct mode: a worker with real sandboxes and a warm pool, the router and a real Envoy; the
// SDK makes its claims through the worker's Kubernetes API with the kubeconfig `make up` writes
// (over the edge's HTTPS listener), and its data plane (the python-runtime API on port 8888, by
// X-Sandbox-ID with the API key in extra_headers) goes through the edge's plain HTTP listener to
// the owning worker. Both carry a team's key, not the admin's: the labels and annotations the SDK
// itself puts on its claims (agents.x-k8s.io/created-by, …/client-first-requested-at) must pass
// the reserved-prefix rule a team key is held to. The scenarios are pytest tests
// (test/python/test_k8s_sigs_sdk.py), shared with the Kubernetes tier
// (test/k8s/k8s-sigs-python.test.ts) through test/support/k8s-sigs-sdk.ts.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { writeKubeconfig } from '../src/assembly/kubeconfig.ts';
import { runSdkSuite } from './support/k8s-sigs-sdk.ts';
import { startTestSystem } from './support/local-system.ts';

const TEAM = 'sdk-team';

test('k8s-agent-sandbox 1.0.8 in Direct mode with a team key: create from a warm pool, commands.run (output, exit code, timeout), files write/read/list/exists, terminate, the missing-pool error', async (t) => {
  const system = await startTestSystem('k8py', 164, 'local', 1, true, [TEAM]);
  t.after(() => system.cleanup());
  const teamKey = system.teamKeys[TEAM];
  assert.ok(system.edgeTlsUrl !== undefined && system.caCertPath !== undefined && teamKey !== undefined);
  const dir = mkdtempSync(join(tmpdir(), 'asb-k8spy-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const kubeconfig = join(dir, 'kubeconfig');
  writeKubeconfig(kubeconfig, [{ name: 'local', server: system.edgeTlsUrl }], system.caCertPath, teamKey);

  await runSdkSuite({ kubeconfig, apiKey: teamKey, edgeUrl: system.edgeUrl, pool: 'base', home: dir });
});
