// Our own deployment, for real: the image `make own-image` built, pushed to the tests' registry,
// and clusters/ applied with `kubectl apply -k` onto clusters of real nodes with Services and
// cluster DNS (kube-node.ts startKubeCluster), in the order clusters/README.md tells a user: the
// hub (clusters/overlays/hub), then a region (clusters/overlays/region-a, through an overlay of the
// user's own: the image, the hub's address, one replica each for a 2-core node), its Secrets
// (secrets.sh, the federation certificate, the sync credential `asb cluster add` prints). Then,
// through that region's edge Service only, what a user does: a key and a template made at the hub,
// a sandbox created, exec'd into, hibernated and woken by the first request to its port, and the
// unmodified E2B SDK. Last, region-b (clusters/overlays/region-b) in a second cluster on a second
// node in a network of its own, reached across clusters at NodePorts, and cross-region routing both
// ways.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Sandbox } from 'e2b';
import { baseTemplate } from '../../src/api/builtin.ts';
import { ensureFederationTls } from '../../src/edge/tls.ts';
import { readAnswer, type HttpAnswer } from '../support/http-answer.ts';
import { hubCall } from '../support/hub-process.ts';
import { NODE_SLOT_A, NODE_SLOT_B, startKubeCluster, type KubeCluster } from '../support/kube-node.ts';
import type { KubeApiServer } from '../support/kube-apiserver.ts';
import { pushOwnImage, writeImageOverlay, type OwnImage } from '../support/own-image.ts';
import { clusterReport, replicasPatch, SYSTEM_NS, waitAvailable, writeRegionOverlay } from '../support/own-deployment.ts';
import { runAsb } from '../support/run-asb.ts';
import { testImages } from '../support/test-images.ts';
import { waitFor } from '../support/wait.ts';

const repoRoot = join(import.meta.dirname, '../..');
/** clusters/base/cluster.env's domain, which the region keeps. */
const DOMAIN = 'sandbox.example.com';
/** Where sandbox Pods run (clusters/base/cluster.env ASB_POD_NAMESPACE). */
const POD_NS = 'agent-sandboxes';
const REGION = { name: 'region-a', tag: 'rga1', region: 'europe-west' };
/** The second region, clusters/overlays/region-b, in a second cluster on a second node (kube-node.ts NODE_SLOT_B). */
const REGION_B = { name: 'region-b', tag: 'rgb1', region: 'us-east' };

let cluster: KubeCluster | undefined;
let image: OwnImage;
const scratch = mkdtempSync(join(tmpdir(), 'asb-own-deploy-'));
/** The hub as the host reaches it (its Service's ClusterIP, through kube-proxy), and its admin key. */
let hub: { url: string; adminKey: string } | undefined;

const timings: string[] = [];
const timed = async <T>(what: string, run: () => Promise<T>): Promise<T> => {
  const t0 = Date.now();
  const result = await run();
  timings.push(`${what} ${String(Date.now() - t0)} ms`);
  return result;
};

before(async () => {
  image = await timed('push', async () => pushOwnImage((await testImages()).address));
  cluster = await timed('cluster (waits for another test process\'s node)', () => startKubeCluster({ etcdUnsafeNoFsync: true }));
});

let clusterB: KubeCluster | undefined;

after(async () => {
  // The second node first: it recorded the host's sysctls after the first node's kubelet set them.
  await clusterB?.stop();
  await cluster?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

function kubeOf(): KubeApiServer {
  assert.ok(cluster !== undefined, 'the cluster started');
  return cluster.kube;
}

async function clusterIp(service: string): Promise<string> {
  return (await kubeOf().kubectl(['-n', SYSTEM_NS, 'get', 'svc', service, '-o', 'jsonpath={.spec.clusterIP}'])).trim();
}

test('kubectl apply -k of clusters/overlays/hub runs the hub from our image on the real node; its admin key works at its Service', async (t) => {
  const kube = kubeOf();
  // The node's containerd has the tests' registry as docker.io's mirror: `agent-sandbox:<tag>`
  // is docker.io/library/agent-sandbox:<tag>, which pushOwnImage pushed there.
  // The node's static PVs are 10Gi each (kube-node.ts); the hub overlay asks 20Gi. A local PV's
  // capacity is a label (nothing enforces it), so the claim asks what the node has.
  const claim = { apiVersion: 'v1', kind: 'PersistentVolumeClaim', metadata: { name: 'hub-data', namespace: SYSTEM_NS }, spec: { resources: { requests: { storage: '10Gi' } } } };
  const overlay = writeImageOverlay(join(scratch, 'hub'), 'clusters/overlays/hub', { name: 'agent-sandbox', tag: image.tag }, [claim]);
  await kube.kubectl(['apply', '-k', join(repoRoot, overlay)]);
  await timed('hub applied to Available', () => waitAvailable(kube, ['hub']));
  const pod = JSON.parse(await kube.kubectl(['-n', SYSTEM_NS, 'get', 'pods', '-l', 'app.kubernetes.io/component=hub', '-o', 'json'])) as {
    items: { status: { podIP?: string; containerStatuses?: { image: string; ready: boolean }[] } }[];
  };
  const [hubPod] = pod.items;
  assert.ok(hubPod !== undefined);
  assert.equal(pod.items.length, 1, 'one replica');
  assert.match(hubPod.status.containerStatuses?.[0]?.image ?? '', new RegExp(`agent-sandbox:${image.tag}$`));

  // clusters/README.md: "Its admin key is created on first start: kubectl exec deploy/hub -- cat ..."
  const key = (await kube.kubectl(['-n', SYSTEM_NS, 'exec', 'deploy/hub', '--', 'cat', '/var/lib/asb/hub/admin.key'])).trim();
  assert.match(key, /^asb_/);
  assert.equal((await kube.kubectl(['-n', SYSTEM_NS, 'exec', 'deploy/hub', '--', 'id', '-u'])).trim(), '1000');

  // "Note the hub Service's address: it is ASB_HUB_URL for the regions."
  const url = `http://${await clusterIp('hub')}:7070`;
  // The Service answers once the EndpointSlice controller has seen the Pod ready and kube-proxy
  // has written the endpoint (until then kube-proxy rejects the ClusterIP: ECONNREFUSED).
  await waitFor('the hub Service routes to its Pod', async () => {
    const health = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(5000) }).catch(() => undefined);
    await health?.body?.cancel();
    return health?.status === 200 ? true : undefined;
  }, 30_000, 200);
  const refused = await fetch(`${url}/v1/clusters`, { signal: AbortSignal.timeout(5000) });
  assert.equal(refused.status, 401);
  await refused.body?.cancel();
  const clusters = await fetch(`${url}/v1/clusters`, { headers: { authorization: `Bearer ${key}` }, signal: AbortSignal.timeout(5000) });
  assert.equal(clusters.status, 200, await clusters.clone().text());
  await clusters.body?.cancel();
  hub = { url, adminKey: key };
  t.diagnostic(timings.join(', '));
});

/** What the region test made, for the cross-region test: its edge, a user's key, and a web sandbox of region-a whose home has `note`. */
let createdA: { edge: string; userKey: string; id?: string; accessToken?: string } | undefined;

/** One request to the region's edge Service, with the Host a client's DNS name would give it. */
function edgeCall<T = unknown>(edge: string, method: string, path: string, o: { host?: string; key?: string; body?: unknown; headers?: Record<string, string> } = {}): Promise<HttpAnswer<T>> {
  const payload = o.body === undefined ? undefined : JSON.stringify(o.body);
  return new Promise((resolveCall, reject) => {
    const req = httpRequest(`http://${edge}${path}`, {
      method,
      headers: {
        ...(o.host === undefined ? {} : { host: o.host }),
        ...(o.key === undefined ? {} : { authorization: `Bearer ${o.key}` }),
        ...(payload === undefined ? {} : { 'content-type': 'application/json' }),
        ...o.headers,
      },
      timeout: 120_000,
    }, (res) => {
      readAnswer<T>(res).then(resolveCall, reject);
    });
    req.on('timeout', () => req.destroy(new Error(`${method} ${path} through the edge: no answer in 120 s`)));
    req.on('error', reject);
    req.end(payload);
  });
}

test('a region from clusters/overlays/region-a, federated to that hub: through its edge Service, create, exec, wake on the first request, and the E2B SDK', async (t) => {
  const kube = kubeOf();
  assert.ok(hub !== undefined, 'the hub test ran first');
  const h = hub;
  const hubHost = `hub.${SYSTEM_NS}.svc.cluster.local`;
  const overlay = writeRegionOverlay(join(scratch, 'region-a'), {
    base: 'clusters/overlays/region-a',
    image,
    baseEnvFiles: ['clusters/base/cluster.env', 'clusters/overlays/region-a/cluster.env'],
    // The hub's Service by its cluster DNS name (the README's step 2).
    env: { ASB_HUB_URL: `http://${hubHost}:7070` },
    // Room on a 2-core node: the base asks 2.7 cores.
    patches: [replicasPatch('worker-api', 1), replicasPatch('ingress', 1)],
  });
  // Step 3: the federation certificate, in cert-manager's layout.
  const tls = await ensureFederationTls(join(scratch, 'federation-tls'));
  await kube.kubectl(['-n', SYSTEM_NS, 'create', 'secret', 'generic', 'asb-federation-tls',
    `--from-file=ca.crt=${tls.caCertPath}`, `--from-file=tls.crt=${tls.certChainPath}`, `--from-file=tls.key=${tls.privateKeyPath}`]);
  // Step 4: apply, then the cluster's Secrets and admin ApiKey (the CRDs come with the apply).
  await kube.kubectl(['apply', '-k', overlay]);
  await kube.kubectl(['wait', '--for=condition=established', 'crd/apikeys.asb.dev']);
  await kube.kubectl(['apply', '-f', '-'], execFileSync(join(repoRoot, 'clusters/secrets.sh'), { encoding: 'utf8' }));
  // Step 5: register the region at the hub with the CLI; its credential becomes the Secret.
  const ingress = `${await clusterIp('federation-ingress')}:10443`;
  // The hub places creates by calling the region's worker API: here, its Service by cluster DNS.
  const apiUrl = `http://worker-api.${SYSTEM_NS}.svc.cluster.local:7080`;
  const added = await runAsb(['cluster', 'add', REGION.name, '--region', REGION.region, '--tag', REGION.tag, '--ingress', ingress, '--api-url', apiUrl, '--hub-url', h.url, '--hub-key', h.adminKey]);
  assert.equal(added.code, 0, added.stderr);
  const credential = /credential: (\S+)/.exec(added.stdout)?.[1];
  assert.ok(credential !== undefined, added.stdout);
  await kube.kubectl(['-n', SYSTEM_NS, 'create', 'secret', 'generic', 'asb-hub-credential', `--from-literal=credential=${credential}`]);
  await timed('region Available', () => waitAvailable(kube, ['operator', 'worker-api', 'ingress']));

  // Where a user's DNS would point *.<domain>: the edge Service (no LoadBalancer here: its ClusterIP).
  const edge = await clusterIp('edge');
  const user = await hubCall<{ key: string }>(h, 'POST', '/v1/keys', { team: 'deployed' });
  const web = baseTemplate();
  web.metadata.name = 'web';
  const main = web.spec.podTemplate.spec.containers[0];
  assert.ok(main !== undefined);
  // Its main process serves the home volume on 8080, so a plain GET reads what the sandbox wrote.
  main.command = ['python3', '-m', 'http.server', '8080', '--directory', '/home/user'];
  main.ports = [...(main.ports ?? []), { containerPort: 8080 }];
  main.readinessProbe = { tcpSocket: { port: 8080 }, periodSeconds: 1 };
  await hubCall(h, 'PUT', '/v1/templates/web', web);

  // The key and the template reach the region through the hub's sync; the hub places the create.
  let last: HttpAnswer<unknown> | undefined;
  createdA = { edge, userKey: user.key };
  const created = await timed('first create through the edge', () => waitFor('the region takes a create with the hub\'s key', async () => {
    const res = await edgeCall<{ id?: string; accessToken?: string }>(edge, 'POST', '/v1/sandboxes', { key: user.key, body: { template: 'web', wait: true } });
    last = res;
    return res.status === 201 ? res.body : undefined;
  }, 180_000, 1000).catch(async (err: unknown) => {
    throw new Error(`${String(err)}; the last answer: ${JSON.stringify(last)}\n${await clusterReport(kube)}`);
  }));
  const id = created.id ?? '';
  assert.ok(id.startsWith(REGION.tag), `the sandbox id ${id} carries the region's tag`);
  createdA = { ...createdA, id, accessToken: created.accessToken ?? '' };

  await t.test('exec through the edge runs in the sandbox\'s Pod, on the node', async () => {
    const out = await edgeCall<{ stdout: string; exitCode: number }>(edge, 'POST', `/v1/sandboxes/${id}/exec`, {
      key: user.key, body: { command: ['sh', '-c', 'echo kept > /home/user/note; id -u; hostname'] },
    });
    assert.equal(out.status, 200, JSON.stringify(out.body));
    assert.equal(out.body.exitCode, 0);
    assert.deepEqual(out.body.stdout.split('\n').slice(0, 2), ['1000', id]);
    const pod = JSON.parse(await kube.kubectl(['-n', POD_NS, 'get', 'pod', id, '-o', 'json'])) as { spec: { nodeName?: string } };
    assert.equal(pod.spec.nodeName, 'asb-node');
    const other = await edgeCall(edge, 'POST', `/v1/sandboxes/${id}/exec`, { key: h.adminKey.replace(/.$/, (c) => (c === 'a' ? 'b' : 'a')), body: { command: ['true'] } });
    assert.equal(other.status, 401, 'a wrong key is refused at the edge');
  });

  await t.test('hibernated, its Pod goes; the first request to its port wakes it, and the volume\'s file is there', async () => {
    const paused = await edgeCall(edge, 'POST', `/v1/sandboxes/${id}/pause`, { key: user.key });
    assert.equal(paused.status, 200, JSON.stringify(paused.body));
    await waitFor('the Pod deleted', async () => {
      const pods = await kube.kubectl(['-n', POD_NS, 'get', 'pods', '-o', 'name']);
      return pods.includes(`pod/${id}`) ? undefined : true;
    }, 60_000, 200);
    const phase = async (): Promise<string | undefined> => (await edgeCall<{ phase?: string }>(edge, 'GET', `/v1/sandboxes/${id}`, { key: user.key })).body.phase;
    await waitFor('Hibernated', async () => ((await phase()) === 'Hibernated' ? true : undefined), 60_000, 200);
    const host = `8080-${id}.${DOMAIN}`;
    const stranger = await edgeCall(edge, 'GET', '/note', { host });
    assert.equal(stranger.status, 401, 'a request without the sandbox\'s access token is refused');
    // A wake marks the sandbox Waking before its answer; a refused request leaves it Hibernated.
    assert.equal(await phase(), 'Hibernated', 'and wakes nothing');
    const woken = await edgeCall<string>(edge, 'GET', '/note', { host, headers: { 'x-access-token': created.accessToken ?? '' } });
    assert.deepEqual([woken.status, woken.body], [200, 'kept\n']);
    const pod = await kube.kubectl(['-n', POD_NS, 'get', 'pod', id, '-o', 'jsonpath={.status.phase}']);
    assert.equal(pod, 'Running');
  });

  await t.test('its lifecycle events through the edge: the worker-api Pods pass them on to the operator, whose log is on its volume', async () => {
    const types = await waitFor('the wake in the events API', async () => {
      const res = await edgeCall<{ type: string }[]>(edge, 'GET', `/v1/events/sandboxes/${id}?orderAsc=true&limit=100`, { key: user.key });
      const got = res.status === 200 ? res.body.map((e) => e.type) : [];
      return got.filter((type) => type === 'sandbox.lifecycle.ready').length >= 2 ? got : undefined;
    }, 30_000, 500);
    assert.deepEqual(types.slice(0, 4), ['sandbox.lifecycle.created', 'sandbox.lifecycle.ready', 'sandbox.lifecycle.paused', 'sandbox.lifecycle.resumed'], types.join(', '));
    const e2b = await edgeCall<{ code?: number }>(edge, 'GET', `/events/sandboxes/${id}`, { headers: { 'x-api-key': h.adminKey } });
    assert.equal(e2b.status, 404, 'another team (the hub admin\'s) sees none of them');
    const claim = JSON.parse(await kube.kubectl(['-n', SYSTEM_NS, 'get', 'pvc', 'operator-data', '-o', 'json'])) as { status: { phase?: string } };
    assert.equal(claim.status.phase, 'Bound');
  });

  await t.test('the unmodified E2B SDK through the edge: create in the region, run a command, write and read a file, kill', async () => {
    const opts = { apiUrl: `http://${edge}`, sandboxUrl: `http://${edge}`, apiKey: user.key };
    const sbx = await Sandbox.create('base', { ...opts, envs: { WHERE: 'deployed' } });
    try {
      assert.ok(sbx.sandboxId.startsWith(REGION.tag), sbx.sandboxId);
      const run = await sbx.commands.run('echo "$WHERE $(id -u)"');
      assert.equal(run.stdout, 'deployed 1000\n');
      await sbx.files.write('/home/user/e2b.txt', 'through the edge');
      assert.equal(await sbx.files.read('/home/user/e2b.txt'), 'through the edge');
    } finally {
      assert.equal(await sbx.kill(), true);
    }
  });
  t.diagnostic(timings.join(', '));
});

/** A Service's nodePort (its first port, or the named one): how another cluster reaches it here, with no LoadBalancer. */
async function nodePort(kube: KubeApiServer, service: string): Promise<number> {
  const port = Number((await kube.kubectl(['-n', SYSTEM_NS, 'get', 'svc', service, '-o', 'jsonpath={.spec.ports[0].nodePort}'])).trim());
  assert.ok(port > 0, `Service ${service} has a nodePort`);
  return port;
}

test('two regions, two clusters: region-b from clusters/overlays/region-b on a second node, and each region\'s edge reaches the other\'s sandboxes', async (t) => {
  const kubeA = kubeOf();
  assert.ok(hub !== undefined && createdA?.id !== undefined && createdA.accessToken !== undefined, 'the region test ran first');
  const h = hub;
  const a = { ...createdA, id: createdA.id, accessToken: createdA.accessToken };
  clusterB = await timed('second cluster', () => startKubeCluster({ etcdUnsafeNoFsync: true, slot: NODE_SLOT_B }));
  const kubeB = clusterB.kube;
  const [nodeA, nodeB] = [NODE_SLOT_A.nodeIp, NODE_SLOT_B.nodeIp];
  // Across clusters there is no ClusterIP and no LoadBalancer here: each Service's NodePort on its node's address.
  const hubUrl = `http://${nodeA}:${await nodePort(kubeA, 'hub')}`;
  const ingressA = `${nodeA}:${await nodePort(kubeA, 'federation-ingress')}`;
  // region-a's ingress as region-b's edge reaches it (asb cluster add changes a registered cluster).
  const changed = await runAsb(['cluster', 'add', REGION.name, '--ingress', ingressA, '--hub-url', h.url, '--hub-key', h.adminKey]);
  assert.equal(changed.code, 0, changed.stderr);

  // The hub places creates through the region's worker API, which clusters/README.md says to expose to the hub's network.
  const hubFacing = {
    apiVersion: 'v1', kind: 'Service', metadata: { name: 'worker-api-hub', namespace: SYSTEM_NS },
    spec: { type: 'NodePort', selector: { 'app.kubernetes.io/name': 'agent-sandbox', 'app.kubernetes.io/component': 'worker-api' }, ports: [{ name: 'http', port: 7080, targetPort: 'http' }] },
  };
  const overlay = writeRegionOverlay(join(scratch, 'region-b'), {
    base: 'clusters/overlays/region-b',
    // docker.io/library/agent-sandbox through the node's registry mirror (its containerd is in its own network).
    image: { name: 'agent-sandbox', tag: image.tag },
    baseEnvFiles: ['clusters/base/cluster.env', 'clusters/overlays/region-b/cluster.env'],
    env: { ASB_HUB_URL: hubUrl },
    patches: [replicasPatch('worker-api', 1), replicasPatch('ingress', 1)],
    resources: [hubFacing],
  });
  const tls = await ensureFederationTls(join(scratch, 'federation-tls'));
  await kubeB.kubectl(['create', 'namespace', SYSTEM_NS]);
  await kubeB.kubectl(['-n', SYSTEM_NS, 'create', 'secret', 'generic', 'asb-federation-tls',
    `--from-file=ca.crt=${tls.caCertPath}`, `--from-file=tls.crt=${tls.certChainPath}`, `--from-file=tls.key=${tls.privateKeyPath}`]);
  await kubeB.kubectl(['apply', '-k', overlay]);
  await kubeB.kubectl(['wait', '--for=condition=established', 'crd/apikeys.asb.dev']);
  await kubeB.kubectl(['apply', '-f', '-'], execFileSync(join(repoRoot, 'clusters/secrets.sh'), { encoding: 'utf8' }));
  const added = await runAsb(['cluster', 'add', REGION_B.name, '--region', REGION_B.region, '--tag', REGION_B.tag,
    '--ingress', `${nodeB}:${await nodePort(kubeB, 'federation-ingress')}`, '--api-url', `http://${nodeB}:${await nodePort(kubeB, 'worker-api-hub')}`,
    '--hub-url', h.url, '--hub-key', h.adminKey]);
  assert.equal(added.code, 0, added.stderr);
  const credential = /credential: (\S+)/.exec(added.stdout)?.[1];
  assert.ok(credential !== undefined, added.stdout);
  await kubeB.kubectl(['-n', SYSTEM_NS, 'create', 'secret', 'generic', 'asb-hub-credential', `--from-literal=credential=${credential}`]);
  await timed('region-b Available', () => waitAvailable(kubeB, ['operator', 'worker-api', 'ingress']));
  const edgeB = `${nodeB}:${await nodePort(kubeB, 'edge')}`;

  // Through region-a's edge: a create the hub places in region-b, then exec and a port of it.
  let last: HttpAnswer<unknown> | undefined;
  const created = await timed('first create in region-b', () => waitFor('the hub places a create in region-b', async () => {
    const res = await edgeCall<{ id?: string; accessToken?: string }>(a.edge, 'POST', '/v1/sandboxes', { key: a.userKey, body: { template: 'web', cluster: REGION_B.name, wait: true } });
    last = res;
    return res.status === 201 ? res.body : undefined;
  }, 180_000, 1000).catch(async (err: unknown) => {
    throw new Error(`${String(err)}; the last answer: ${JSON.stringify(last)}\n${await clusterReport(kubeB)}`);
  }));
  const idB = created.id ?? '';
  assert.ok(idB.startsWith(REGION_B.tag), idB);
  assert.equal((await kubeB.kubectl(['-n', POD_NS, 'get', 'pod', idB, '-o', 'jsonpath={.status.podIP}'])).split('.').slice(0, 2).join('.'), '10.210', 'a Pod on the second node');
  // Region-a's router follows region-b's route feed from when it learns of the new cluster: until
  // that feed is up it answers 503 with Retry-After ("unreachable"), as a client should retry.
  // A full make test once got there before the feed did.
  const wrote = await waitFor('region-a\'s edge reaches region-b', async () => {
    const res = await edgeCall<{ exitCode: number; stderr: string }>(a.edge, 'POST', `/v1/sandboxes/${idB}/exec`, { key: a.userKey, body: { command: ['sh', '-c', 'echo from region-b > /home/user/note'] } });
    return res.status === 503 ? undefined : res;
  }, 60_000, 500);
  assert.deepEqual([wrote.status, wrote.body.exitCode], [200, 0], JSON.stringify(wrote.body));
  const viaA = await edgeCall<string>(a.edge, 'GET', '/note', { host: `8080-${idB}.${DOMAIN}`, headers: { 'x-access-token': created.accessToken ?? '' } });
  assert.deepEqual([viaA.status, viaA.body], [200, 'from region-b\n'], 'region-a\'s edge forwards to region-b over mutual TLS');
  assert.equal((await edgeCall(a.edge, 'GET', '/note', { host: `8080-${idB}.${DOMAIN}` })).status, 401, 'still only with the access token');

  // Through region-b's edge: region-a's sandbox, a Pod of the first cluster.
  const viaB = await edgeCall<string>(edgeB, 'GET', '/note', { host: `8080-${a.id}.${DOMAIN}`, headers: { 'x-access-token': a.accessToken } });
  assert.deepEqual([viaB.status, viaB.body], [200, 'kept\n'], 'region-b\'s edge forwards to region-a');
  const execB = await edgeCall<{ stdout: string }>(edgeB, 'POST', `/v1/sandboxes/${a.id}/exec`, { key: a.userKey, body: { command: ['hostname'] } });
  assert.deepEqual([execB.status, execB.body.stdout], [200, `${a.id}\n`]);
  t.diagnostic(timings.join(', '));
});
