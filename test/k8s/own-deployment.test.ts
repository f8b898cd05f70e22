// Our own deployment, for real (issue 19, point 6): the image `make own-image` built, pushed to
// the tests' registry, and clusters/overlays/hub applied with `kubectl apply -k` (through an
// overlay whose `images:` names that build) onto the real node: the kubelet pulls it through
// containerd, the scheduler places the Pod, its PVC binds to one of the node's PVs, and the hub
// runs as the manifests say (non-root, read-only root, no capabilities). Then what
// clusters/README.md tells a user to do: read the admin key with `kubectl exec deploy/hub`, and
// use it against the hub's API.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { startKubeApiServer, type KubeApiServer } from '../support/kube-apiserver.ts';
import { startKubeNode, type KubeNode } from '../support/kube-node.ts';
import { pushOwnImage, writeImageOverlay, type OwnImage } from '../support/own-image.ts';
import { testImages } from '../support/test-images.ts';

const NS = 'agent-sandbox-system';
/** Pull (~140 MB through containerd from loopback) and unpack, then the hub's start: ~10 s idle, minutes on a loaded 2-core machine. */
const AVAILABLE_TIMEOUT_S = 300;
/** Each kubectl wait within the fixture's 60 s kubectl timeout. */
const WAIT_STEP_S = 50;

async function waitAvailable(kube: KubeApiServer, what: string): Promise<void> {
  for (let waited = 0; ; waited += WAIT_STEP_S) {
    try {
      await kube.kubectl(['-n', NS, 'wait', '--for=condition=Available', what, `--timeout=${String(WAIT_STEP_S)}s`]);
      return;
    } catch (err) {
      if (waited + WAIT_STEP_S >= AVAILABLE_TIMEOUT_S) throw err;
    }
  }
}

let kube: KubeApiServer | undefined;
let node: KubeNode | undefined;
let image: OwnImage;
const scratch = mkdtempSync(join(tmpdir(), 'asb-own-deploy-'));

const timings: string[] = [];
const timed = async <T>(what: string, run: () => Promise<T>): Promise<T> => {
  const t0 = Date.now();
  const result = await run();
  timings.push(`${what} ${String(Date.now() - t0)} ms`);
  return result;
};

before(async () => {
  image = await timed('push', async () => pushOwnImage((await testImages()).address));
  kube = await timed('kube-apiserver', () => startKubeApiServer({ etcdUnsafeNoFsync: true }));
  node = await timed('node (waits for another test process\'s node)', () => startKubeNode(kube as KubeApiServer));
});

after(async () => {
  await node?.stop();
  await kube?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

test('kubectl apply -k of clusters/overlays/hub runs the hub from our image on the real node; its admin key works', async (t) => {
  assert.ok(kube !== undefined && node !== undefined);
  // The node's containerd has the tests' registry as docker.io's mirror: `agent-sandbox:<tag>`
  // is docker.io/library/agent-sandbox:<tag>, which pushOwnImage pushed there.
  // The node's static PVs are 10Gi each (kube-node.ts); the hub overlay asks 20Gi. A local PV's
  // capacity is a label (nothing enforces it), so the claim asks what the node has.
  const claim = { apiVersion: 'v1', kind: 'PersistentVolumeClaim', metadata: { name: 'hub-data', namespace: NS }, spec: { resources: { requests: { storage: '10Gi' } } } };
  const overlay = writeImageOverlay(join(scratch, 'hub'), 'clusters/overlays/hub', { name: 'agent-sandbox', tag: image.tag }, [claim]);
  await kube.kubectl(['apply', '-k', join(import.meta.dirname, '../..', overlay)]);
  try {
    await timed('apply to Available', () => waitAvailable(kube as KubeApiServer, 'deploy/hub'));
  } catch (err) {
    const pods = await kube.kubectl(['-n', NS, 'get', 'pods,pvc,pv', '-o', 'wide']).catch((e: unknown) => String(e));
    const events = await kube.kubectl(['-n', NS, 'get', 'events', '--sort-by=.lastTimestamp']).catch((e: unknown) => String(e));
    throw new Error(`deploy/hub never became Available: ${(err as Error).message}\n${pods}\n${events}`);
  }
  const pod = JSON.parse(await kube.kubectl(['-n', NS, 'get', 'pods', '-l', 'app.kubernetes.io/component=hub', '-o', 'json'])) as {
    items: { status: { podIP?: string; containerStatuses?: { image: string; ready: boolean }[] } }[];
  };
  const [hub] = pod.items;
  assert.ok(hub !== undefined);
  assert.equal(pod.items.length, 1, 'one replica');
  assert.match(hub.status.containerStatuses?.[0]?.image ?? '', new RegExp(`agent-sandbox:${image.tag}$`));
  const podIp = hub.status.podIP ?? '';
  assert.ok(podIp.startsWith(node.podCidr.split('.').slice(0, 2).join('.')), `pod IP ${podIp} in ${node.podCidr}`);

  // clusters/README.md: "Its admin key is created on first start: kubectl exec deploy/hub -- cat ..."
  const key = (await kube.kubectl(['-n', NS, 'exec', 'deploy/hub', '--', 'cat', '/var/lib/asb/hub/admin.key'])).trim();
  assert.match(key, /^asb_/);
  assert.equal((await kube.kubectl(['-n', NS, 'exec', 'deploy/hub', '--', 'id', '-u'])).trim(), '1000');

  const health = await fetch(`http://${podIp}:7070/healthz`, { signal: AbortSignal.timeout(5000) });
  assert.equal(health.status, 200);
  await health.body?.cancel();
  const refused = await fetch(`http://${podIp}:7070/v1/clusters`, { signal: AbortSignal.timeout(5000) });
  assert.equal(refused.status, 401);
  await refused.body?.cancel();
  const clusters = await fetch(`http://${podIp}:7070/v1/clusters`, { headers: { authorization: `Bearer ${key}` }, signal: AbortSignal.timeout(5000) });
  assert.equal(clusters.status, 200, await clusters.clone().text());
  await clusters.body?.cancel();
  t.diagnostic(timings.join(', '));
});
