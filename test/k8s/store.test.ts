// The kube store (src/store/kube.ts) on a real kube-apiserver and etcd: the same contract tests
// the embedded store passes (test/support/store-suite.ts), then what only this store has to get
// right: the apiserver's Gone, a watch that outlives a broken connection, writes counted as
// apiserver writes, and the apiserver's refusals turned into our errors.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { KubeConfig } from '@kubernetes/client-node';
import { Registry } from 'prom-client';
import { SandboxType } from '../../src/api/types.ts';
import { isAsbError } from '../../src/errors.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { openKubeStore } from '../../src/store/kube.ts';
import { LIMITED_USER } from '../support/kube-apiserver.ts';
import { kubeStoreTier } from '../support/kube-store.ts';
import { box, recordWatch, rejection, storeSuite, summary, until, withImage } from '../support/store-suite.ts';

const tier = kubeStoreTier();

storeSuite((t, namespaces) => tier.fx.open(t, namespaces));

test('a watch from a version the apiserver no longer has ends with Gone, so the caller relists', async (t) => {
  const { store, ns } = await tier.fx.open(t, ['default']);
  const old = recordWatch(t, store, { namespace: ns('default'), resourceVersion: '1' });
  await until(() => old.errors.length === 1, 'Gone');
  assert.ok(isAsbError(old.errors[0], 'Gone'), String(old.errors[0]));
  assert.equal(old.errors[0].status, 410);
  assert.match(old.errors[0].message, /resourceVersion 1/);
  assert.deepEqual(old.events, []);
});

/** A TCP relay to the apiserver that a test can cut, and make refuse connections for a while. */
async function relay(target: URL): Promise<{ port: number; cut: () => void; refuse: (on: boolean) => void; refused: () => number; close: () => Promise<void> }> {
  const sockets = new Set<Socket>();
  let refusing = false;
  let refused = 0;
  const server = createServer((client) => {
    if (refusing) {
      refused++;
      client.destroy();
      return;
    }
    const upstream = connect(Number(target.port), target.hostname);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('relay: no port');
  return {
    port: address.port,
    cut: () => {
      for (const s of sockets) s.destroy();
    },
    refuse: (on) => (refusing = on),
    refused: () => refused,
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

test('a watch survives a broken connection: what changed while it was cut arrives once, in order', async (t) => {
  const { store, ns } = await tier.fx.open(t, ['default']);
  const d = ns('default');
  const proxy = await relay(new URL(tier.kube.url));
  t.after(() => proxy.close());
  const dir = mkdtempSync(join(tmpdir(), 'asb-kube-relay-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const kubeconfig = join(dir, 'kubeconfig');
  writeFileSync(kubeconfig, readFileSync(tier.kube.kubeconfigPath, 'utf8').replaceAll(tier.kube.url, `https://127.0.0.1:${proxy.port}`));
  const viaRelay = await openKubeStore({ kubeconfig });
  t.after(() => viaRelay.close());

  const start = (await store.list(SandboxType, { namespace: d })).resourceVersion;
  const watched = recordWatch(t, viaRelay, { namespace: d, resourceVersion: start });
  const a = await store.create(SandboxType, box('a', d));
  await until(() => watched.events.length === 1, 'the first event through the relay');

  proxy.refuse(true);
  proxy.cut();
  await store.create(SandboxType, box('b', d));
  await store.update(SandboxType, withImage(a, 'alpine'));
  await until(() => proxy.refused() >= 2, 'two reconnects refused');
  proxy.refuse(false);
  await until(() => watched.events.length === 3, 'the changes made while cut');
  await store.create(SandboxType, box('c', d));
  await until(() => watched.events.length >= 4, 'a change after the reconnect');
  assert.deepEqual(summary(watched.events), ['ADDED a', 'ADDED b', 'MODIFIED a', 'ADDED c']);
  assert.deepEqual(watched.errors, []);
});

test('every apiserver write is counted in the store metrics; a compare-and-swap update is one write', async (t) => {
  const registry = new Registry();
  const { store, ns, dispose } = await tier.fx.create(['default'], { metrics: createMetrics(registry) });
  t.after(dispose);
  const d = ns('default');
  const v1 = await store.create(SandboxType, box('sb-1', d));
  const v2 = await store.update(SandboxType, withImage(v1, 'alpine'));
  await store.updateStatus(SandboxType, { ...v2, status: { phase: 'Running' } });
  await rejection(store.update(SandboxType, withImage(v1, 'stale')));
  // Unconditional: a read for the version, then one write.
  const { resourceVersion: _drop, ...meta } = v1.metadata;
  await store.update(SandboxType, { ...withImage(v1, 'ubuntu'), metadata: meta });
  await store.delete(SandboxType, d, 'sb-1');

  const text = await registry.metrics();
  assert.match(text, /asb_store_write_seconds_count\{op="create"\} 1\n/);
  assert.match(text, /asb_store_write_seconds_count\{op="update"\} 3\n/, 'CAS, the refused CAS and the unconditional update');
  assert.match(text, /asb_store_write_seconds_count\{op="updateStatus"\} 1\n/);
  assert.match(text, /asb_store_write_seconds_count\{op="delete"\} 1\n/);
  assert.match(text, /asb_store_commit_batch_writes_count 6\n/);
});

test("the apiserver's refusals become our errors: the schema's field problems (Invalid) and RBAC (Forbidden)", async (t) => {
  const { store, ns } = await tier.fx.open(t, ['default']);
  const d = ns('default');
  const noTemplate = await rejection(store.create(SandboxType, { ...box('sb-1', d), spec: {} }));
  assert.equal(noTemplate.code, 'Invalid');
  assert.equal(noTemplate.status, 422);
  assert.ok(noTemplate.fields.some((f) => f.field === 'spec.podTemplate'), JSON.stringify(noTemplate.fields));
  assert.match(noTemplate.message, /Sandbox "sb-1" is invalid: .*spec\.podTemplate/);

  const kc = new KubeConfig();
  kc.loadFromFile(tier.kube.kubeconfigPath);
  kc.setCurrentContext(LIMITED_USER);
  const limited = await openKubeStore({ kubeconfig: kc });
  t.after(() => limited.close());
  const refused = await rejection(limited.list(SandboxType, { namespace: d }));
  assert.equal(refused.code, 'Forbidden');
  assert.equal(refused.status, 403);
  assert.match(refused.message, new RegExp(`${LIMITED_USER}.*cannot list`));
});
