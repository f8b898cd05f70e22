// The project's own image, run for real without Kubernetes. `make own-image` builds the
// Dockerfile with buildah (scripts/build-own-image.sh); here it is pushed to the tests' registry,
// clusters/hub is built with an overlay that points `agent-sandbox` at it, and the hub's pod, as
// kustomize writes it (command, environment from its ConfigMap, readiness probe, PVC, emptyDir,
// non-root user, read-only root filesystem, no capabilities), is started from that image by the
// local runtime under runc. What a user deploying clusters/ would notice if the image were
// broken: the hub never turns Ready, /healthz does not answer, Node, Envoy or a production
// dependency is missing, or the program could rewrite itself.
// Own bridge and subnet: asbim0, 10.232.0.0/16.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { Container, PodSpec as ApiPodSpec, VolumeClaimTemplate } from '../src/api/types.ts';
import type { PodRequest } from '../src/runtime/runtime.ts';
import { dataOf, kustomize, ofKind, type Deployment, type Manifest } from './support/cluster-manifests.ts';
import { pushOwnImage, writeImageOverlay, type OwnImage } from './support/own-image.ts';
import { waitForPodState } from './support/pod-state.ts';
import { testImages } from './support/test-images.ts';
import { startTestRuntime, stopTestRuntime, type TestRuntime } from './support/test-runtime.ts';

const BRIDGE = 'asbim0';
const SUBNET = '10.232.0.0/16';

let fixture: TestRuntime | undefined;
let image: OwnImage;
let build: Manifest[];
const scratch = mkdtempSync(join(tmpdir(), 'asb-own-image-'));

before(async () => {
  const registry = await testImages();
  image = await pushOwnImage(registry.address);
  build = await kustomize(writeImageOverlay(join(scratch, 'hub'), 'clusters/hub', image));
  fixture = await startTestRuntime('asb-ownimage-', BRIDGE, SUBNET, { probeIntervalMs: 100 });
});

after(async () => {
  if (fixture !== undefined) await stopTestRuntime(fixture);
  rmSync(scratch, { recursive: true, force: true });
});

/**
 * The pod a kubelet would run for `deployment`, as a runtime request: envFrom resolved from the
 * build's ConfigMaps (the runtime takes env only), PVCs from the build's claims.
 */
function podFor(deployment: Deployment, id: string): PodRequest {
  const configMaps = new Map(ofKind(build, 'ConfigMap').map((cm) => [cm.metadata.name, dataOf(cm)]));
  type WithEnvFrom = Container & { envFrom?: { configMapRef?: { name: string } }[] };
  const template = deployment.spec.template.spec as unknown as ApiPodSpec & { containers: WithEnvFrom[] };
  const containers = template.containers.map(({ envFrom, ...c }: WithEnvFrom): Container => {
    const fromMaps: Record<string, string> = {};
    for (const f of envFrom ?? []) {
      const data = configMaps.get(f.configMapRef?.name ?? '');
      assert.ok(data !== undefined, `envFrom ${JSON.stringify(f)} names a ConfigMap the build has`);
      Object.assign(fromMaps, data);
    }
    return { ...c, env: [...Object.entries(fromMaps).map(([name, value]) => ({ name, value })), ...(c.env ?? [])] };
  });
  const claims = new Set((template.volumes ?? []).flatMap((v) => (v.persistentVolumeClaim === undefined ? [] : [v.persistentVolumeClaim.claimName])));
  const volumeClaimTemplates = ofKind(build, 'PersistentVolumeClaim')
    .filter((pvc) => claims.has(pvc.metadata.name))
    .map((pvc) => ({ metadata: { name: pvc.metadata.name }, spec: pvc.spec }) as VolumeClaimTemplate);
  return { id, uid: `uid-${id}`, namespace: 'agent-sandbox-system', hostname: id, spec: { ...template, containers }, volumeClaimTemplates };
}

const text = (b: Uint8Array): string => Buffer.from(b).toString('utf8').trim();

test('the overlay points every container of clusters/hub at the built image', () => {
  const images = ofKind<Deployment>(build, 'Deployment').flatMap((d) => d.spec.template.spec.containers.map((c) => c.image));
  assert.ok(images.length > 0);
  assert.deepEqual([...new Set(images)], [image.reference]);
});

test('the hub pod of clusters/hub runs from our image: Ready through its probe, /healthz answers, uid 1000 on a read-only root; its Envoy takes clusters/base\'s config', async () => {
  const [hub] = ofKind<Deployment>(build, 'Deployment').filter((d) => d.metadata.name === 'hub');
  assert.ok(hub !== undefined, 'clusters/hub has the hub Deployment');
  assert.ok(fixture !== undefined);
  const { rt } = fixture;
  const started = await rt.start(podFor(hub, 'hub'));
  assert.match(started.ip ?? '', /^10\.232\./);
  // The manifest's readiness probe (GET /healthz on port http) turns it Ready: Node ran our
  // TypeScript with the production dependencies, and the hub opened its store on the claim.
  const ready = await waitForPodState(rt, 'hub', (s) => s.ready || s.phase === 'Failed' || s.phase === 'Succeeded', 'Ready (or exited)', 60_000);
  assert.equal(ready.phase, 'Running', `the hub exited: ${JSON.stringify(ready)}`);
  assert.equal(ready.ready, true);

  const res = await fetch(`http://${started.ip ?? ''}:7070/healthz`, { signal: AbortSignal.timeout(5000) });
  assert.equal(res.status, 200);
  await res.body?.cancel();

  const sh = async (script: string): Promise<{ exitCode: number; out: string; err: string }> => {
    const r = await rt.exec('hub', { command: ['sh', '-c', script] });
    return { exitCode: r.exitCode, out: text(r.stdout), err: text(r.stderr) };
  };
  // The user the manifests expect, and the first start's admin key on the claim.
  assert.deepEqual(await sh('id -u; id -g; test -s /var/lib/asb/hub/admin.key && echo key'), { exitCode: 0, out: '1000\n1000\nkey', err: '' });
  // The program cannot be rewritten from inside: its files are root's (the Dockerfile copies them
  // as root), and the manifest's readOnlyRootFilesystem holds even in /app, uid 1000's home.
  assert.match((await sh('echo x >> /app/src/hub/hub-main.ts')).err, /Permission denied/);
  assert.deepEqual(await sh('stat -c %u /app; touch /app/new'), { exitCode: 1, out: '1000', err: "touch: cannot touch '/app/new': Read-only file system" });
  // Node and Envoy are the versions make deps installs.
  assert.deepEqual(await sh('node --version'), { exitCode: 0, out: 'v24.21.0', err: '' });
  assert.match((await sh('envoy --version')).out, /\/1\.40\.0\//);
  // The ingress pod's first container: this image's Envoy accepts the Envoy configuration
  // clusters/base mounts (written to the pod's /tmp, an emptyDir, as a ConfigMap would be mounted).
  await rt.writeFile('hub', '/tmp/envoy.yaml', readFileSync(join(import.meta.dirname, '../clusters/base/ingress/envoy.yaml')));
  const validate = await sh('envoy --mode validate -c /tmp/envoy.yaml --log-level warn');
  assert.equal(validate.exitCode, 0, validate.err);
  assert.equal(validate.out, "configuration '/tmp/envoy.yaml' OK");
  // Production dependencies only: the dev tools are not in the image.
  assert.deepEqual(await sh('ls /app/node_modules/ws/package.json; test -e /app/node_modules/typescript || echo no-dev'), { exitCode: 0, out: '/app/node_modules/ws/package.json\nno-dev', err: '' });
});
