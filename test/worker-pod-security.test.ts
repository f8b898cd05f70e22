// Pod security for tenants, through the worker's real HTTP API with a team key: a volume claim
// that names a path, and a pod spec that reaches the host, are refused with 422 naming every
// field, and nothing is created. Admin keys still may; a template (admin-written) relaxes the
// level for the sandboxes claimed from it, and a team may only narrow it.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { POD_SECURITY_ANNOTATION } from '../src/api/pod-security.ts';
import { SandboxType, type Sandbox } from '../src/api/types.ts';
import { BASE_TEMPLATE, call, startWorkerFixture, type ApiResponse, type WorkerFixture } from './support/worker-fixture.ts';

interface Problem { code: string; fields?: { field: string; message: string }[] }

const P = 'objects[0].spec.podTemplate.spec';

function sandbox(name: string, spec: Record<string, unknown>, extra: { volumeClaimTemplates?: unknown[]; annotations?: Record<string, string> } = {}): unknown {
  return {
    apiVersion: 'agents.x-k8s.io/v1alpha1',
    kind: 'Sandbox',
    metadata: { name, namespace: 'default', ...(extra.annotations === undefined ? {} : { annotations: extra.annotations }) },
    spec: {
      podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox', command: ['sleep', '3600'] }], ...spec } },
      ...(extra.volumeClaimTemplates === undefined ? {} : { volumeClaimTemplates: extra.volumeClaimTemplates }),
    },
  };
}

function apply(fx: WorkerFixture, key: string, ...objects: unknown[]): Promise<ApiResponse> {
  return call(fx, 'POST', '/v1/apply', { key, json: { objects } });
}

/** Re-applying a running sandbox can meet the operator's status write (409): retry, at most 20 times. */
async function reapply(fx: WorkerFixture, key: string, obj: unknown): Promise<ApiResponse> {
  for (let i = 0; ; i++) {
    const res = await apply(fx, key, obj);
    if (res.status !== 409 || i === 20) return res;
  }
}

function refused(res: ApiResponse): string[] {
  assert.equal(res.status, 422, res.text);
  const body = res.json as Problem;
  assert.equal(body.code, 'Invalid');
  return (body.fields ?? []).map((f) => f.field).sort();
}

async function absent(fx: WorkerFixture, name: string): Promise<void> {
  assert.equal(await fx.store.tryGet(SandboxType, 'default', name), undefined, `nothing was created for ${name}`);
  assert.deepEqual(fx.runtime.list(), [], 'no pod was started');
}

test('a volume claim naming a path (../<victim>/home, ../../<host dir>) is refused with 422, for every key, and nothing is created', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const mounts = { containers: [{ name: 'main', image: 'busybox', volumeMounts: [{ name: 'x', mountPath: '/stolen' }] }] };
  for (const claimName of ['../tst1victim0000000000/home', '../../../../../../../../etc', 'home/../../other', '..']) {
    for (const key of [fx.keys.teamA, fx.keys.admin]) {
      const res = await apply(fx, key, sandbox('volprobe', { ...mounts, volumes: [{ name: 'x', persistentVolumeClaim: { claimName } }] }, { volumeClaimTemplates: [{ metadata: { name: 'home' }, spec: { resources: { requests: { storage: '1Gi' } } } }] }));
      assert.deepEqual(refused(res), [`${P}.volumes[0].persistentVolumeClaim.claimName`], claimName);
      await absent(fx, 'volprobe');
    }
  }
  // A DNS label that is not one of the sandbox's own claims (another sandbox's PVC name) is refused too.
  const foreign = await apply(fx, fx.keys.teamA, sandbox('volprobe', { ...mounts, volumes: [{ name: 'x', persistentVolumeClaim: { claimName: 'tst1victim0000000000-home' } }] }));
  const [problem] = (foreign.json as Problem).fields ?? [];
  assert.equal(problem?.field, `${P}.volumes[0].persistentVolumeClaim.claimName`);
  assert.match(problem.message, /one of this sandbox's volumeClaimTemplates/);
  await absent(fx, 'volprobe');

  // Its own claim, by the volumeClaimTemplate's name, is fine.
  const own = await apply(fx, fx.keys.teamA, sandbox('volprobe', { ...mounts, volumes: [{ name: 'x', persistentVolumeClaim: { claimName: 'home' } }] }, { volumeClaimTemplates: [{ metadata: { name: 'home' }, spec: { resources: { requests: { storage: '1Gi' } } } }] }));
  assert.equal(own.status, 200, own.text);
});

test('a team key\'s pod spec that reaches the host is refused with 422 naming each field at once; an admin key may', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const attack = {
    hostNetwork: true,
    hostPID: true,
    serviceAccountName: 'operator',
    securityContext: { runAsUser: 0 },
    volumes: [{ name: 'root', hostPath: { path: '/' } }],
    containers: [{
      name: 'main',
      image: 'busybox',
      ports: [{ containerPort: 22, hostPort: 22 }],
      securityContext: { privileged: true, capabilities: { add: ['SYS_ADMIN'] } },
      volumeMounts: [{ name: 'root', mountPath: '/host' }],
    }],
  };
  const res = await apply(fx, fx.keys.teamA, sandbox('hostprobe', attack));
  assert.deepEqual(refused(res), [
    `${P}.containers[0].ports[0].hostPort`,
    `${P}.containers[0].securityContext.capabilities.add[0]`,
    `${P}.containers[0].securityContext.privileged`,
    `${P}.hostNetwork`,
    `${P}.hostPID`,
    `${P}.securityContext.runAsUser`,
    `${P}.serviceAccountName`,
    `${P}.volumes[0].hostPath`,
  ]);
  assert.match(res.text, /nothing was applied/);
  await absent(fx, 'hostprobe');

  // One field at a time, the way the probe found them.
  for (const [spec, field] of [
    [{ securityContext: { runAsUser: 0 } }, `${P}.securityContext.runAsUser`],
    [{ containers: [{ name: 'main', securityContext: { runAsUser: 0 } }] }, `${P}.containers[0].securityContext.runAsUser`],
    [{ hostIPC: true }, `${P}.hostIPC`],
    [{ automountServiceAccountToken: true }, `${P}.automountServiceAccountToken`],
  ] as const) {
    assert.deepEqual(refused(await apply(fx, fx.keys.teamA, sandbox('oneprobe', spec))), [field]);
    await absent(fx, 'oneprobe');
  }

  // Admin keys are trusted: they write the templates.
  const admin = await apply(fx, fx.keys.admin, sandbox('hostprobe', attack));
  assert.equal(admin.status, 200, admin.text);
});

test('a template relaxes the level for the sandboxes claimed from it; a team may narrow it, never loosen it', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const rootSpec = { containers: [{ name: 'main', image: 'busybox', command: ['sleep', 'infinity'], securityContext: { runAsUser: 0 } }] };

  // A team cannot grant itself a looser level on its own Sandbox.
  const self = await apply(fx, fx.keys.teamA, sandbox('selfgrant', rootSpec, { annotations: { [POD_SECURITY_ANNOTATION]: 'privileged' } }));
  assert.deepEqual(refused(self), [`objects[0].metadata.annotations["${POD_SECURITY_ANNOTATION}"]`]);
  assert.deepEqual(refused(await apply(fx, fx.keys.teamA, sandbox('selfgrant', rootSpec, { annotations: { [POD_SECURITY_ANNOTATION]: 'lax' } }))), [
    `objects[0].metadata.annotations["${POD_SECURITY_ANNOTATION}"]`,
  ]);
  await absent(fx, 'selfgrant');

  // The admin's template runs its tools as root: baseline.
  const tools = { ...structuredClone(BASE_TEMPLATE), metadata: { name: 'tools', namespace: 'default', annotations: { [POD_SECURITY_ANNOTATION]: 'baseline' } } };
  tools.spec.podTemplate.spec = structuredClone(rootSpec);
  const put = await call(fx, 'PUT', '/v1/templates/tools', { key: fx.keys.admin, json: tools });
  assert.equal(put.status, 201, put.text);
  const created = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: { template: 'tools' } });
  assert.equal(created.status, 201, created.text);
  const id = (created.json as { id: string }).id;
  const stored = await fx.store.get<Sandbox>(SandboxType, 'default', id);
  assert.equal(stored.metadata.annotations?.[POD_SECURITY_ANNOTATION], 'baseline', 'the template\'s level is copied to its sandbox');

  // Its owner may re-apply it as it is (root passes baseline), but not beyond baseline.
  const reapplied = await reapply(fx, fx.keys.teamA, sandbox(id, rootSpec));
  assert.equal(reapplied.status, 200, reapplied.text);
  assert.equal((await fx.store.get<Sandbox>(SandboxType, 'default', id)).metadata.annotations?.[POD_SECURITY_ANNOTATION], 'baseline', 'the level stays with the sandbox');
  assert.deepEqual(refused(await apply(fx, fx.keys.teamA, sandbox(id, { ...rootSpec, hostNetwork: true }))), [`${P}.hostNetwork`]);
  assert.deepEqual(refused(await apply(fx, fx.keys.teamA, sandbox(id, rootSpec, { annotations: { [POD_SECURITY_ANNOTATION]: 'privileged' } }))), [
    `objects[0].metadata.annotations["${POD_SECURITY_ANNOTATION}"]`,
  ]);
  // Narrowed to restricted, root is refused; the other team's key changes nothing of it.
  assert.deepEqual(refused(await apply(fx, fx.keys.teamA, sandbox(id, rootSpec, { annotations: { [POD_SECURITY_ANNOTATION]: 'restricted' } }))), [`${P}.containers[0].securityContext.runAsUser`]);
  const narrowed = await reapply(fx, fx.keys.teamA, sandbox(id, { containers: [{ name: 'main', image: 'busybox' }] }, { annotations: { [POD_SECURITY_ANNOTATION]: 'restricted' } }));
  assert.equal(narrowed.status, 200, narrowed.text);
  assert.deepEqual(refused(await apply(fx, fx.keys.teamA, sandbox(id, rootSpec))), [`${P}.containers[0].securityContext.runAsUser`], 'once narrowed, the sandbox stays restricted');

  // Another team's same-named apply gets no relaxation from this sandbox's level.
  assert.deepEqual(refused(await apply(fx, fx.keys.teamB, sandbox(id, { ...rootSpec, hostNetwork: true }))), [`${P}.containers[0].securityContext.runAsUser`, `${P}.hostNetwork`]);
});
