// The pod-security policy for tenants' pod specs (src/api/pod-security.ts), without sockets: each
// level refuses what the Kubernetes Pod Security Standards refuse at that level, names every
// field at once, and lets root through only where the runtime isolates it.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isLooser, levelOf, levelProblem, NO_ROOT_ISOLATION, podSecurityProblems, POD_SECURITY_ANNOTATION, takesUserNamespace, type RootIsolation } from '../src/api/pod-security.ts';

const KUBE: RootIsolation = { userNamespace: 'unless-host-users', gvisor: true };
const P = 'spec.podTemplate.spec';

function fields(spec: unknown, level: 'restricted' | 'baseline' | 'privileged' = 'restricted', isolation: RootIsolation = NO_ROOT_ISOLATION): string[] {
  return podSecurityProblems(spec, level, P, isolation).map((p) => p.field);
}

const plain = { containers: [{ name: 'main', image: 'busybox', ports: [{ containerPort: 8080 }], securityContext: { runAsUser: 1000 } }], volumes: [{ name: 'tmp', emptyDir: {} }] };

test('an ordinary pod spec passes every level', () => {
  for (const level of ['restricted', 'baseline', 'privileged'] as const) assert.deepEqual(fields(plain, level), []);
  const careful = {
    hostUsers: false,
    automountServiceAccountToken: false,
    securityContext: { runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' }, sysctls: [{ name: 'net.ipv4.ping_group_range', value: '0 1000' }] },
    containers: [{ name: 'main', securityContext: { allowPrivilegeEscalation: false, privileged: false, capabilities: { drop: ['ALL'], add: ['NET_BIND_SERVICE'] } }, ports: [{ containerPort: 80, hostPort: 0 }] }],
    volumes: [{ name: 'home', persistentVolumeClaim: { claimName: 'home' } }, { name: 'info', downwardAPI: { items: [] } }],
  };
  assert.deepEqual(fields(careful), []);
});

test('restricted names every host-reaching field of one spec at once', () => {
  const attack = {
    hostNetwork: true,
    hostPID: true,
    hostIPC: true,
    serviceAccountName: 'operator',
    automountServiceAccountToken: true,
    securityContext: { runAsUser: 0 },
    volumes: [{ name: 'host', hostPath: { path: '/' } }, { name: 'keys', secret: { secretName: 'asb-hub' } }],
    initContainers: [{ name: 'init', securityContext: { privileged: true } }],
    containers: [{
      name: 'main',
      ports: [{ containerPort: 80, hostPort: 80 }],
      env: [{ name: 'K', valueFrom: { secretKeyRef: { name: 'x', key: 'k' } } }],
      envFrom: [{ configMapRef: { name: 'x' } }],
      securityContext: { runAsNonRoot: false, allowPrivilegeEscalation: true, procMount: 'Unmasked', capabilities: { add: ['SYS_ADMIN', 'NET_BIND_SERVICE', 'CHOWN'] }, seccompProfile: { type: 'Unconfined' } },
    }],
  };
  assert.deepEqual(fields(attack).sort(), [
    `${P}.automountServiceAccountToken`,
    `${P}.containers[0].env[0].valueFrom.secretKeyRef`,
    `${P}.containers[0].envFrom`,
    `${P}.containers[0].ports[0].hostPort`,
    `${P}.containers[0].securityContext.allowPrivilegeEscalation`,
    `${P}.containers[0].securityContext.capabilities.add[0]`,
    `${P}.containers[0].securityContext.capabilities.add[2]`,
    `${P}.containers[0].securityContext.procMount`,
    `${P}.containers[0].securityContext.runAsNonRoot`,
    `${P}.containers[0].securityContext.seccompProfile.type`,
    `${P}.hostIPC`,
    `${P}.hostNetwork`,
    `${P}.hostPID`,
    `${P}.initContainers[0].securityContext.privileged`,
    `${P}.securityContext.runAsUser`,
    `${P}.serviceAccountName`,
    `${P}.volumes[0].hostPath`,
    `${P}.volumes[1].secret`,
  ].sort());
  // baseline: root, allowPrivilegeEscalation and the baseline capability CHOWN pass; the rest does not.
  const baseline = fields(attack, 'baseline');
  assert.ok(baseline.includes(`${P}.containers[0].securityContext.capabilities.add[0]`), 'SYS_ADMIN is beyond baseline');
  for (const f of ['securityContext.runAsUser', 'containers[0].securityContext.runAsNonRoot', 'containers[0].securityContext.allowPrivilegeEscalation', 'containers[0].securityContext.capabilities.add[2]']) {
    assert.ok(!baseline.includes(`${P}.${f}`), `${f} passes baseline`);
  }
  assert.ok(baseline.includes(`${P}.volumes[0].hostPath`) && baseline.includes(`${P}.hostNetwork`));
  assert.deepEqual(fields(attack, 'privileged'), []);
});

test('a value of the wrong type never passes as "off"', () => {
  const sly = { hostNetwork: 'true', containers: [{ name: 'm', securityContext: { privileged: 1 }, ports: [{ containerPort: 1, hostPort: '80' }] }] };
  assert.deepEqual(fields(sly).sort(), [`${P}.containers[0].ports[0].hostPort`, `${P}.containers[0].securityContext.privileged`, `${P}.hostNetwork`]);
});

test('root: refused without isolation, allowed in a user namespace or under gVisor where the runtime gives one', () => {
  const root = { securityContext: { runAsUser: 0 }, containers: [{ name: 'main' }] };
  const [problem] = podSecurityProblems(root, 'restricted', P, NO_ROOT_ISOLATION);
  assert.equal(problem?.field, `${P}.securityContext.runAsUser`);
  assert.match(problem.message, /neither a user namespace nor gVisor/);
  // Local runtime as root: runtimeClassName and hostUsers change nothing, so root stays refused.
  assert.deepEqual(fields({ ...root, runtimeClassName: 'gvisor', hostUsers: false }), [`${P}.securityContext.runAsUser`]);
  // Local runtime not as root: every pod is in a user namespace.
  assert.deepEqual(fields(root, 'restricted', { userNamespace: 'always', gvisor: false }), []);
  // Kubernetes: every pod gets hostUsers: false unless it says otherwise or shares a host
  // namespace (then root needs gVisor).
  assert.deepEqual(fields(root, 'restricted', KUBE), []);
  assert.deepEqual(fields({ ...root, hostUsers: false }, 'restricted', KUBE), []);
  assert.deepEqual(fields({ ...root, hostUsers: true }, 'restricted', KUBE), [`${P}.securityContext.runAsUser`]);
  assert.match(podSecurityProblems({ ...root, hostUsers: true }, 'restricted', P, KUBE)[0]?.message ?? '', /hostUsers unset or false.*gvisor/);
  assert.deepEqual(fields({ ...root, hostUsers: true, runtimeClassName: 'gvisor' }, 'restricted', KUBE), []);
  assert.deepEqual(fields({ ...root, hostUsers: true, runtimeClassName: 'kata' }, 'restricted', KUBE), [`${P}.securityContext.runAsUser`]);
  for (const host of ['hostNetwork', 'hostPID', 'hostIPC']) assert.equal(takesUserNamespace({ [host]: true }), false, `${host}: Kubernetes refuses hostUsers: false with it`);
  assert.equal(takesUserNamespace({}), true);
});

test('levels: order, annotation values', () => {
  assert.ok(isLooser('privileged', 'baseline') && isLooser('baseline', 'restricted'));
  assert.ok(!isLooser('restricted', 'baseline') && !isLooser('baseline', 'baseline'));
  assert.equal(levelOf(undefined, 'restricted'), 'restricted');
  assert.equal(levelOf({ [POD_SECURITY_ANNOTATION]: 'baseline' }, 'restricted'), 'baseline');
  assert.equal(levelOf({ [POD_SECURITY_ANNOTATION]: 'root' }, 'restricted'), 'restricted');
  assert.equal(levelProblem('baseline'), undefined);
  assert.match(levelProblem('Privileged') ?? '', /must be one of restricted, baseline, privileged/);
});
