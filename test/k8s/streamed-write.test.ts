// Regression: a streamed writeFile into a runc Pod on the real node (test/support/kube-node.ts:
// kubelet, containerd 2.4, runc) lost data and reported success. The upload's staging command ran
// `exec cat > temp`, which closed the process's stdout; containerd's CRI exec ends a session's stdin
// once an output stream ends, so `cat` saw end-of-file wherever the copy was and exited 0: 1 MiB
// in 16 KiB chunks left 163 840 bytes, 300 000 bytes left 16 384. gVisor Pods kept it all, so this
// Pod names no RuntimeClass (runc). src/runtime/file-upload.ts keeps stdout open and checks the
// bytes received against the bytes sent.
import { randomBytes } from 'node:crypto';
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { createKubeRuntime } from '../../src/runtime/kube/kube-runtime.ts';
import { silentLogger } from '../../src/base/log.ts';
import { startKubeApiServer, type KubeApiServer } from '../support/kube-apiserver.ts';
import { startKubeNode, type KubeNode } from '../support/kube-node.ts';
import { waitFor } from '../support/wait.ts';

const CHUNK = 16 * 1024;

let kube: KubeApiServer;
let node: KubeNode;
before(async () => {
  kube = await startKubeApiServer({ etcdUnsafeNoFsync: true });
  node = await startKubeNode(kube);
});
after(async () => {
  await node.stop();
  await kube.stop();
});

/** `body` in CHUNK pieces, each on its own turn: a stream, as an upload arrives. */
async function* inChunks(body: Uint8Array): AsyncGenerator<Uint8Array> {
  for (let at = 0; at < body.length; at += CHUNK) {
    await Promise.resolve();
    yield body.subarray(at, at + CHUNK);
  }
}

test('a streamed writeFile into a runc Pod (1 MiB + 1234 bytes and 300 000 bytes, in 16 KiB chunks) reads back byte-identical (regression: the file held 163 840 bytes and the write reported success)', async (t) => {
  const ns = 'streamed-write';
  await kube.kubectl(['create', 'namespace', ns]);
  const runtime = await createKubeRuntime({ kubeconfig: kube.kubeconfigPath, namespace: ns, log: silentLogger() });
  t.after(() => runtime.close());
  const id = 'sw1';
  await runtime.start({ id, uid: `uid-${id}`, namespace: ns, hostname: id, spec: { containers: [{ name: 'main', image: 'agent-sandbox/base' }] } });
  await waitFor(`${id} Running and ready`, () => {
    const s = runtime.state(id);
    return Promise.resolve(s.phase === 'Running' && s.ready ? s : undefined);
  }, 60_000);

  for (const size of [1024 * 1024 + 1234, 300_000]) {
    const body = randomBytes(size);
    const path = `/tmp/streamed-${size}.bin`;
    await runtime.writeFile(id, path, inChunks(body));
    const back = await runtime.readFile(id, path);
    assert.equal(back.length, size, `${path}: the file holds every byte the write acknowledged`);
    assert.ok(Buffer.from(back).equals(body), `${path}: the bytes are the ones sent`);
  }
  // No temporary file is left behind.
  const left = await runtime.exec(id, { command: ['sh', '-c', 'ls -A /tmp | grep -c "^\\.asb-upload-" || true'] });
  assert.equal(Buffer.from(left.stdout).toString('utf8').trim(), '0');
});
