// The Kubernetes runtime's pure parts, without a cluster: what Pod, PVCs and Service a request
// becomes, what a Pod's status means as a PodState, and the exec wrapper's input checks.
// (test/k8s/runtime.test.ts runs the whole runtime against a real API server.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { PodRequest } from '../src/runtime/runtime.ts';
import { claimManifests, podManifest, podState, serviceManifest, userNamespaceDropped, SANDBOX_LABEL, SANDBOX_NAMESPACE_ANNOTATION, SANDBOX_UID_ANNOTATION, type KubePod } from '../src/runtime/kube/objects.ts';
import { wrapCommand } from '../src/runtime/kube/exec.ts';
import { isAsbError } from '../src/errors.ts';
import type { Sandbox } from '../src/api/types.ts';
import { podRequestFor } from '../src/operator/sandbox-controller.ts';

const request: PodRequest = {
  id: 'abc1',
  uid: 'uid-abc1',
  namespace: 'team-a',
  hostname: 'abc1',
  spec: {
    runtimeClassName: 'kata',
    containers: [{ name: 'main', image: 'img', ports: [{ containerPort: 8080 }, { containerPort: 8080 }], volumeMounts: [{ name: 'data', mountPath: '/data' }] }],
    volumes: [{ name: 'data', emptyDir: {} }, { name: 'cache', emptyDir: {} }],
    securityContext: { runAsUser: 1000 },
  },
  volumeClaimTemplates: [{ metadata: { name: 'data', labels: { tier: 'disk' } }, spec: { resources: { requests: { storage: '2Gi' } } } }],
  labels: { app: 'x' },
};

test('the Pod: spec passed through (runtimeClassName, securityContext), claim volumes replace spec volumes of the same name, a default grace', () => {
  const pod = podManifest(request, { namespace: 'sandboxes', graceSeconds: 2 });
  assert.equal(pod.metadata.name, 'abc1');
  assert.equal(pod.metadata.namespace, 'sandboxes');
  assert.deepEqual(pod.metadata.labels, { app: 'x', [SANDBOX_LABEL]: 'abc1' });
  assert.deepEqual(pod.metadata.annotations, { [SANDBOX_NAMESPACE_ANNOTATION]: 'team-a', [SANDBOX_UID_ANNOTATION]: 'uid-abc1' }, 'the pod says which Sandbox object it was made for');
  assert.equal(pod.spec.runtimeClassName, 'kata');
  assert.deepEqual(pod.spec.securityContext, { runAsUser: 1000, runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' } });
  assert.equal(pod.spec.hostname, 'abc1');
  assert.equal(pod.spec.terminationGracePeriodSeconds, 2);
  assert.equal(pod.spec.subdomain, undefined);
  assert.deepEqual(pod.spec.volumes, [{ name: 'cache', emptyDir: {} }, { name: 'data', persistentVolumeClaim: { claimName: 'abc1-data' } }]);

  const own = podManifest({ ...request, namespace: 'sandboxes', service: true, spec: { ...request.spec, terminationGracePeriodSeconds: 30 } }, { namespace: 'sandboxes', graceSeconds: 2 });
  assert.equal(own.spec.terminationGracePeriodSeconds, 30, 'the spec\'s own grace wins');
  assert.equal(own.spec.subdomain, 'abc1');
  assert.deepEqual(own.metadata.annotations, { [SANDBOX_UID_ANNOTATION]: 'uid-abc1' }, 'no namespace annotation when the sandbox is in the runtime\'s namespace');
});

test('a volume may claim only the sandbox\'s own PVCs: another sandbox\'s <id>-<template> or any other PVC is refused', () => {
  const mount = (claimName: string): PodRequest => ({ ...request, spec: { ...request.spec, volumes: [{ name: 'x', persistentVolumeClaim: { claimName } }] } });
  for (const claimName of ['victim1-home', 'abc2-data', 'hub-data', '../abc1-data']) {
    assert.throws(() => podManifest(mount(claimName), { namespace: 'sandboxes', graceSeconds: 2 }), (err: unknown) => {
      assert.ok(isAsbError(err, 'Invalid'), String(err));
      assert.match(err.message, new RegExp(`claims PVC "${claimName.replace(/\./g, '\\.')}", which is not one of sandbox abc1's own claims \\(abc1-data\\)`));
      return true;
    }, claimName);
  }
  // Its own claim, by the template's name (as the local runtime reads it) or by the PVC's name.
  for (const claimName of ['data', 'abc1-data']) {
    const pod = podManifest(mount(claimName), { namespace: 'sandboxes', graceSeconds: 2 });
    assert.deepEqual(pod.spec.volumes?.find((v) => v.name === 'x'), { name: 'x', persistentVolumeClaim: { claimName: 'abc1-data' } });
  }
});

test('the Pod is hardened where the spec is silent, so Pod Security Admission "restricted" admits it; what the spec sets is kept', () => {
  const pod = podManifest({ ...request, spec: { containers: [{ name: 'main', image: 'img' }], initContainers: [{ name: 'init' }] } }, { namespace: 'sandboxes', graceSeconds: 2 });
  assert.equal(pod.spec.automountServiceAccountToken, false);
  // runAsUser too: a real kubelet refuses runAsNonRoot alone for an image whose user is root (busybox).
  assert.deepEqual(pod.spec.securityContext, { runAsNonRoot: true, runAsUser: 1000, seccompProfile: { type: 'RuntimeDefault' } });
  for (const c of [...pod.spec.containers, ...(pod.spec.initContainers ?? [])]) {
    assert.deepEqual(c.securityContext, { allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } }, c.name);
  }
  // A template's explicit choices (an admin relaxed the level) pass through as written.
  const relaxed = podManifest({
    ...request,
    spec: {
      automountServiceAccountToken: true,
      securityContext: { runAsUser: 0, seccompProfile: { type: 'Localhost', localhostProfile: 'p.json' } },
      containers: [{ name: 'main', securityContext: { privileged: true } }, { name: 'side', securityContext: { allowPrivilegeEscalation: true, capabilities: { add: ['NET_ADMIN'] } } }],
    },
  }, { namespace: 'sandboxes', graceSeconds: 2 });
  assert.equal(relaxed.spec.automountServiceAccountToken, true);
  assert.deepEqual(relaxed.spec.securityContext, { runAsUser: 0, seccompProfile: { type: 'Localhost', localhostProfile: 'p.json' } });
  assert.deepEqual(relaxed.spec.containers[0]?.securityContext, { privileged: true });
  assert.deepEqual(relaxed.spec.containers[1]?.securityContext, { allowPrivilegeEscalation: true, capabilities: { add: ['NET_ADMIN'] } });
});

test('PVCs: one per template, named <id>-<template>, labelled, ReadWriteOnce by default; the Service is headless with each port once', () => {
  const [pvc, ...rest] = claimManifests(request, 'sandboxes');
  assert.equal(rest.length, 0);
  assert.equal(pvc?.metadata.name, 'abc1-data');
  assert.equal(pvc.metadata.labels?.[SANDBOX_LABEL], 'abc1');
  assert.equal(pvc.metadata.labels.tier, 'disk');
  assert.deepEqual(pvc.spec, { resources: { requests: { storage: '2Gi' } }, accessModes: ['ReadWriteOnce'] });
  const svc = serviceManifest(request, 'sandboxes') as { spec: { clusterIP: string; ports: unknown[]; selector: unknown } };
  assert.equal(svc.spec.clusterIP, 'None');
  assert.deepEqual(svc.spec.selector, { [SANDBOX_LABEL]: 'abc1' });
  assert.deepEqual(svc.spec.ports, [{ name: 'port-8080', port: 8080, targetPort: 8080, protocol: 'TCP' }]);
});

function pod(status: KubePod['status'], deleting = false): KubePod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name: 'abc1', ...(deleting ? { deletionTimestamp: '2026-01-01T00:00:00Z' } : {}) },
    spec: { containers: [{ name: 'main' }] },
    ...(status === undefined ? {} : { status }),
  };
}

test('PodState from a Pod: Running/ready from the Ready condition, why a Pod is Pending, exit codes of a finished Pod, deleting is Stopped', () => {
  assert.deepEqual(podState(undefined, false), { phase: 'Absent', ready: false });
  assert.deepEqual(podState(undefined, true), { phase: 'Stopped', ready: false });
  assert.deepEqual(podState(pod(undefined), false), { phase: 'Pending', ready: false });
  const running = { phase: 'Running', podIP: '10.1.2.3', startTime: '2026-01-01T00:00:00Z', conditions: [{ type: 'Ready', status: 'False' }] };
  assert.deepEqual(podState(pod(running), false), { phase: 'Running', ready: false, ip: '10.1.2.3', startedAt: '2026-01-01T00:00:00Z' });
  assert.equal(podState(pod({ ...running, conditions: [{ type: 'Ready', status: 'True' }] }), false).ready, true);
  assert.deepEqual(podState(pod({ phase: 'Pending', containerStatuses: [{ name: 'main', state: { waiting: { reason: 'ImagePullBackOff', message: 'no such image' } } }] }), false), { phase: 'Pending', ready: false, message: 'ImagePullBackOff: no such image' });
  assert.deepEqual(podState(pod({ phase: 'Failed', reason: 'Evicted', containerStatuses: [{ name: 'main', state: { terminated: { exitCode: 137, reason: 'OOMKilled' } } }] }), false), { phase: 'Failed', ready: false, exitCode: 137, message: 'Evicted' });
  assert.deepEqual(podState(pod({ phase: 'Succeeded' }), false), { phase: 'Succeeded', ready: false, exitCode: 0 });
  assert.deepEqual(podState(pod(running, true), false), { phase: 'Stopped', ready: false, ip: '10.1.2.3', message: 'the pod is being deleted' });
});

test('the exec wrapper refuses what it cannot pass to a shell', () => {
  assert.throws(() => wrapCommand([], {}), (err) => isAsbError(err, 'BadRequest'));
  assert.throws(() => wrapCommand(['true'], { env: { 'BAD-NAME': 'x' } }), (err) => isAsbError(err, 'BadRequest') && err.message.includes('BAD-NAME'));
  assert.throws(() => wrapCommand(['true'], { user: -1 }), (err) => isAsbError(err, 'BadRequest'));
  assert.throws(() => wrapCommand(['true'], { timeoutMs: 0 }), (err) => isAsbError(err, 'BadRequest'));
  const argv = wrapCommand(['echo', 'a b'], { cwd: '/w', user: 1000, env: { A: '1 2' }, timeoutMs: 1500 });
  assert.deepEqual(argv.slice(3), ['sh', '/w', '1000', '1.5', '', 'A=1 2', '--', 'echo', 'a b']);
});

test("a Sandbox's spec.service reaches the runtime: the operator's pod request asks for the headless Service only then", () => {
  const sandbox = (service: boolean | undefined): Sandbox => ({
    apiVersion: 'agents.x-k8s.io/v1alpha1',
    kind: 'Sandbox',
    metadata: { name: 'svc1', namespace: 'team-a' },
    spec: { podTemplate: { spec: request.spec }, ...(service === undefined ? {} : { service }) },
  });
  assert.equal(podRequestFor(sandbox(true)).service, true);
  assert.equal(podRequestFor(sandbox(false)).service, undefined);
  assert.equal(podRequestFor(sandbox(undefined)).service, undefined);
  assert.equal(podManifest(podRequestFor(sandbox(true)), { namespace: 'sandboxes', graceSeconds: 2 }).spec.subdomain, 'svc1', 'the Pod joins its Service');
});

test('a sandbox Pod asks for a user namespace of its own unless it chose, shares a host namespace or runs gVisor; a create that comes back without it is caught', () => {
  const req = (spec: Record<string, unknown>): PodRequest => ({ id: 'u1', uid: 'uid-u1', namespace: 'default', hostname: 'u1', spec: { containers: [{ name: 'main', image: 'busybox' }], ...spec } });
  assert.equal(podManifest(req({}), { namespace: 'sbx', graceSeconds: 2 }).spec.hostUsers, false);
  assert.equal(podManifest(req({ hostUsers: true }), { namespace: 'sbx', graceSeconds: 2 }).spec.hostUsers, true);
  assert.equal(podManifest(req({ hostNetwork: true }), { namespace: 'sbx', graceSeconds: 2 }).spec.hostUsers, undefined);
  assert.equal(podManifest(req({ runtimeClassName: 'gvisor' }), { namespace: 'sbx', graceSeconds: 2 }).spec.hostUsers, undefined);
  const sent = podManifest(req({}), { namespace: 'sbx', graceSeconds: 2 });
  const { hostUsers: _dropped, ...olderServers } = sent.spec;
  assert.equal(userNamespaceDropped(sent, { spec: olderServers }), true, 'an API server before 1.33 clears the field');
  assert.equal(userNamespaceDropped(sent, sent), false);
  assert.equal(userNamespaceDropped(podManifest(req({ runtimeClassName: 'gvisor' }), { namespace: 'sbx', graceSeconds: 2 }), { spec: olderServers }), false);
});
