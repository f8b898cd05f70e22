// The idle decision (src/operator/lifecycle.ts idleCheck), pure: when the idle clock starts.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { LABEL, type Sandbox, type SandboxStatus } from '../src/api/types.ts';
import { idleCheck } from '../src/operator/lifecycle.ts';

const T0 = Date.parse('2026-01-01T00:00:00Z');

function claimed(status: SandboxStatus | undefined): Sandbox {
  return {
    apiVersion: 'agents.x-k8s.io/v1alpha1',
    kind: 'Sandbox',
    metadata: { name: 'sb', namespace: 'default', labels: { [LABEL.owner]: 'team-a' } },
    spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'agent-sandbox/base' }] } }, idleTimeoutMs: 1500 },
    ...(status === undefined ? {} : { status }),
  };
}

// Found by test/e2e-gvisor.test.ts: a server that took ~1.3 s to listen, with a 1.5 s idle timeout,
// was hibernated by the reconcile that first saw its pod ready (the claim was 1.5 s old, and the
// stored status had no readyTime yet), so `wait: true` never saw it ready.
test('a pod that just became ready is not idle, however long it took: the clock starts now', () => {
  const now = T0 + 5000;
  for (const status of [undefined, { phase: 'Pending' }, { phase: 'Waking' }, { phase: 'Running' }] as const) {
    assert.deepEqual(idleCheck(claimed(status), now, T0), { idle: false, remainingMs: 1500 }, `status ${JSON.stringify(status)}`);
  }
});

test('a pod ready since a stored readyTime idles out from the later of that and the last activity', () => {
  const running = claimed({ phase: 'Running', readyTime: new Date(T0).toISOString() });
  assert.deepEqual(idleCheck(running, T0 + 1000, 0), { idle: false, remainingMs: 500 });
  assert.deepEqual(idleCheck(running, T0 + 1500, 0), { idle: true });
  assert.deepEqual(idleCheck(running, T0 + 1500, T0 + 1000), { idle: false, remainingMs: 1000 }, 'activity after ready restarts the clock');
});
