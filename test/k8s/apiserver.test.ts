// The Kubernetes test tier is real: a kube-apiserver on etcd (built by `make kube-tools`), driven
// by the real kubectl and by plain HTTPS. What kubectl writes is what the API serves and what a
// watch streams; requests without a valid token are refused with 401; RBAC is enforced; a test
// can play the kubelet through the Pod status subresource; stop() leaves nothing running.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { request as httpsRequest } from 'node:https';
import { waitFor } from '../support/wait.ts';
import { LIMITED_USER, KubectlError, startKubeApiServer, type KubeApiServer } from '../support/kube-apiserver.ts';

interface ConfigMap {
  metadata: { name: string; namespace: string; resourceVersion: string };
  data?: Record<string, string>;
}
interface WatchEvent {
  type: string;
  object: ConfigMap;
}

let kube: KubeApiServer;
before(async () => {
  kube = await startKubeApiServer();
});
after(() => kube.stop());

/** Pids whose command line names this directory. */
function processesUsing(dir: string): string[] {
  return readdirSync('/proc').filter((pid) => {
    if (!/^\d+$/.test(pid)) return false;
    try {
      return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(dir);
    } catch {
      return false; // exited while we looked
    }
  });
}

let nsCount = 0;
/** A fresh namespace per test: nothing here deletes one (no namespace controller runs). */
async function namespace(): Promise<string> {
  const ns = `apiserver-test-${++nsCount}`;
  await kube.kubectl(['create', 'namespace', ns]);
  return ns;
}

/** Opens a watch and resolves with the first event that `match` accepts; rejects after timeoutMs. */
function watchFor(path: string, match: (e: WatchEvent) => boolean, timeoutMs = 30_000): { opened: Promise<void>; event: Promise<WatchEvent> } {
  let resolveOpened: () => void = () => undefined;
  const opened = new Promise<void>((r) => (resolveOpened = r));
  const event = new Promise<WatchEvent>((resolveEvent, reject) => {
    const req = httpsRequest(`${kube.url}${path}`, { headers: { authorization: `Bearer ${kube.token}` }, ca: readFileSync(kube.caPath) }, (res) => {
      if (res.statusCode !== 200) {
        reject(new Error(`watch ${path} answered ${String(res.statusCode)}`));
        return;
      }
      resolveOpened();
      let buffered = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        buffered += chunk;
        for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
          const e = JSON.parse(buffered.slice(0, nl)) as WatchEvent;
          buffered = buffered.slice(nl + 1);
          if (match(e)) {
            clearTimeout(timer);
            req.destroy();
            resolveEvent(e);
            return;
          }
        }
      });
    });
    const timer = setTimeout(() => {
      req.destroy();
      reject(new Error(`no matching watch event on ${path} within ${timeoutMs} ms`));
    }, timeoutMs);
    req.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    req.end();
  });
  return { opened, event };
}

test('the default namespace exists when start resolves', async () => {
  const res = await kube.request<{ status: { phase: string } }>('GET', '/api/v1/namespaces/default');
  assert.equal(res.status, 200);
  assert.equal(res.body.status.phase, 'Active');
  assert.match(await kube.kubectl(['version', '-o', 'json']), /"gitVersion": "v1\.\d+\.\d+"/);
});

test('a ConfigMap applied with kubectl is read back through the HTTP API with the token', async () => {
  const ns = await namespace();
  const out = await kube.kubectl(['apply', '-n', ns, '-f', '-'], 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  color: red\n  size: "3"\n');
  assert.match(out, /configmap\/settings created/);

  const res = await kube.request<ConfigMap>('GET', `/api/v1/namespaces/${ns}/configmaps/settings`);
  assert.equal(res.status, 200);
  assert.deepEqual(res.body.data, { color: 'red', size: '3' });
  assert.equal(res.body.metadata.namespace, ns);
});

test('a watch from the read resourceVersion sees the update kubectl makes', async () => {
  const ns = await namespace();
  await kube.kubectl(['create', 'configmap', 'settings', '-n', ns, '--from-literal=color=red']);
  const read = await kube.request<ConfigMap>('GET', `/api/v1/namespaces/${ns}/configmaps/settings`);
  const rv = read.body.metadata.resourceVersion;

  const watch = watchFor(`/api/v1/namespaces/${ns}/configmaps?watch=1&resourceVersion=${rv}&fieldSelector=metadata.name%3Dsettings`, (e) => e.type === 'MODIFIED');
  await watch.opened;
  await kube.kubectl(['patch', 'configmap', 'settings', '-n', ns, '--type', 'merge', '-p', '{"data":{"color":"blue"}}']);
  const e = await watch.event;
  assert.equal(e.object.data?.color, 'blue');
  assert.ok(BigInt(e.object.metadata.resourceVersion) > BigInt(rv), 'the update has a newer resourceVersion');
});

test('a request without a token, or with a wrong one, gets 401', async () => {
  const none = await kube.request<{ kind: string; reason: string }>('GET', '/api/v1/namespaces/default/configmaps', { token: null });
  assert.equal(none.status, 401);
  assert.equal(none.body.reason, 'Unauthorized');
  const wrong = await kube.request('GET', '/api/v1/namespaces/default/configmaps', { token: 'not-a-token' });
  assert.equal(wrong.status, 401);
  const viaKubectl = await kube.kubectl(['get', 'configmaps', '--token', 'not-a-token']).then(
    () => undefined,
    (err: unknown) => err,
  );
  assert.ok(viaKubectl instanceof KubectlError);
  assert.match(viaKubectl.stderr, /Unauthorized|must be logged in/);
});

test('RBAC: the limited user is forbidden until a RoleBinding grants it a Role', async () => {
  const ns = await namespace();
  await kube.kubectl(['create', 'configmap', 'visible', '-n', ns, '--from-literal=a=b']);
  const path = `/api/v1/namespaces/${ns}/configmaps`;
  assert.equal((await kube.request('GET', path, { token: kube.limitedToken })).status, 403);

  // A Role of our own: the built-in view/edit/admin are aggregated roles, and the controller that
  // fills in their rules runs in kube-controller-manager, which does not run here.
  await kube.kubectl(['create', 'role', 'configmap-reader', '-n', ns, '--verb=get,list,watch', '--resource=configmaps']);
  await kube.kubectl(['create', 'rolebinding', 'limited-reads', '-n', ns, '--role=configmap-reader', `--user=${LIMITED_USER}`]);
  // The authorizer reads bindings from an informer: the grant holds once that has seen it.
  const allowed = await waitFor('the RoleBinding to take effect', async () => {
    const res = await kube.request<{ items: ConfigMap[] }>('GET', path, { token: kube.limitedToken });
    return res.status === 403 ? undefined : res;
  }, 10_000);
  assert.equal(allowed.status, 200);
  // Only ours: kube-root-ca.crt is published by kube-controller-manager, which does not run here.
  assert.deepEqual(allowed.body.items.map((c) => c.metadata.name), ['visible']);
  // The Role grants no writes, and nothing in another namespace.
  const write = await kube.request('POST', path, { token: kube.limitedToken, body: { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'nope' } } });
  assert.equal(write.status, 403);
  assert.equal((await kube.request('GET', '/api/v1/namespaces/default/configmaps', { token: kube.limitedToken })).status, 403);
  assert.equal((await kube.kubectl(['auth', 'can-i', 'list', 'configmaps', '-n', ns, '--context', LIMITED_USER])).trim(), 'yes');
});

test('a Pod stays Pending with no kubelet, and a test playing the kubelet makes it Running with an IP', async () => {
  const ns = await namespace();
  await kube.kubectl(['run', 'shell', '-n', ns, '--image=busybox', '--restart=Never', '--', 'sleep', '3600']);
  const created = await kube.request<{ status: { phase: string } }>('GET', `/api/v1/namespaces/${ns}/pods/shell`);
  assert.equal(created.body.status.phase, 'Pending');

  const status = { status: { phase: 'Running', podIP: '10.244.0.7', podIPs: [{ ip: '10.244.0.7' }], conditions: [{ type: 'Ready', status: 'True' }] } };
  const res = await kube.request('PATCH', `/api/v1/namespaces/${ns}/pods/shell/status`, { body: status, contentType: 'application/merge-patch+json' });
  assert.equal(res.status, 200);
  const shown = await kube.kubectl(['get', 'pod', 'shell', '-n', ns, '-o', 'jsonpath={.status.phase} {.status.podIP}']);
  assert.equal(shown, 'Running 10.244.0.7');
});

test('stop() ends etcd and the API server and removes their directory', async () => {
  const other = await startKubeApiServer();
  const running = (): string[] => processesUsing(other.dir);
  assert.equal(running().length, 2, 'etcd and kube-apiserver run');
  await other.stop();
  assert.deepEqual(running(), []);
  assert.equal(existsSync(other.dir), false);
  const after = await fetch(`${other.etcdUrl}/health`).then(
    () => 'answered',
    () => 'refused',
  );
  assert.equal(after, 'refused');
  await other.stop(); // idempotent
});
