// The unmodified E2B SDK against one edge of a federation (a hub and two clusters, each with its
// worker, router and Envoy, as `make up` runs them): apiUrl and sandboxUrl are region a's edge
// only (Recipe A of research e2b.md). Its creates are placed by the hub, so with region a drained
// they land in region b; its commands reach region b's sandbox through region a's edge; its lists
// cover both regions, paged across them. Own tags, bridges and subnets (e2fa: 10.227/16, e2fb:
// 10.228/16), so neither other test files nor `make up` collide.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as e2bLatest from 'e2b';
import * as e2b250 from 'e2b-2-50';
import type { FederatedCluster } from '../src/assembly/federation.ts';
import { startTestFederation, type TestFederation } from './support/federation.ts';
import { waitFor } from './support/wait.ts';

type Sdk = typeof e2bLatest;

function clusterNamed(fed: TestFederation, name: string): FederatedCluster {
  const c = fed.clusters.find((x) => x.clusterName === name);
  assert.ok(c !== undefined, `cluster ${name} is running`);
  return c;
}

async function drain(fed: TestFederation, cluster: string, on: boolean): Promise<void> {
  const res = await fetch(`${fed.hubUrl}/v1/clusters/${cluster}`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${fed.adminKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({ drain: on }),
    signal: AbortSignal.timeout(20_000),
  });
  assert.equal(res.status, 200, await res.text());
}

test('the E2B SDK at one edge of a federation: the hub places its creates, any region runs its commands, its lists cover every region', { timeout: 280_000 }, async (t) => {
  const fed = await startTestFederation([
    ['e2f-a', 'e2fa', 227],
    ['e2f-b', 'e2fb', 228],
  ], 1);
  t.after(() => fed.cleanup());
  const a = clusterNamed(fed, 'e2f-a');
  const b = clusterNamed(fed, 'e2f-b');
  const { Sandbox } = e2bLatest;
  const viaA = { apiUrl: a.edgeUrl, sandboxUrl: a.edgeUrl, apiKey: fed.adminKey };
  const metadata = { suite: 'e2b-federation' };
  const listedViaA = async (): Promise<string[]> => (await Sandbox.list({ ...viaA, query: { metadata } }).nextItems()).map((s) => s.sandboxId);

  // One sandbox in each region, made at that region's own worker API.
  const inA = await Sandbox.create('base', { apiUrl: a.apiUrl, sandboxUrl: a.edgeUrl, apiKey: fed.adminKey, metadata });
  const inB = await Sandbox.create('base', { apiUrl: b.apiUrl, sandboxUrl: b.edgeUrl, apiKey: fed.adminKey, metadata });
  assert.ok(inA.sandboxId.startsWith('e2fa') && inB.sandboxId.startsWith('e2fb'), `${inA.sandboxId} ${inB.sandboxId}`);
  // Region a's router sends creates and lists to the hub once its worker reports the hub link up.
  await waitFor('a list at region a\'s edge to include region b\'s sandbox', async () => ((await listedViaA()).includes(inB.sandboxId) ? true : undefined));

  const placed: string[] = [];
  await t.test('with region a drained, a create at region a\'s edge lands in region b and runs commands through region a\'s edge', async (st) => {
    await drain(fed, 'e2f-a', true);
    st.after(() => drain(fed, 'e2f-a', false));
    const sbx = await Sandbox.create('base', { ...viaA, metadata, envs: { WHERE: 'placed by the hub' } });
    placed.push(sbx.sandboxId);
    assert.ok(sbx.sandboxId.startsWith('e2fb'), `the id carries region b's tag: ${sbx.sandboxId}`);
    const out = await sbx.commands.run('echo "$WHERE"; echo ok');
    assert.equal(out.exitCode, 0);
    assert.equal(out.stdout, 'placed by the hub\nok\n');
    await sbx.files.write('/tmp/across.txt', 'written through region a');
    assert.equal((await sbx.commands.run('cat /tmp/across.txt')).stdout, 'written through region a');
    assert.equal((await Sandbox.getInfo(sbx.sandboxId, viaA)).state, 'running', 'getInfo through region a\'s edge reaches region b');

    // SDK 2.50 creates at /sandboxes: placed by the hub too.
    const { Sandbox: Sandbox250 } = e2b250 as unknown as Sdk;
    const old = await Sandbox250.create('base', { ...viaA, metadata });
    placed.push(old.sandboxId);
    assert.ok(old.sandboxId.startsWith('e2fb'), `2.50's create lands in region b too: ${old.sandboxId}`);
    assert.equal((await old.commands.run('echo from 2.50')).stdout, 'from 2.50\n');
  });

  await t.test('a list at region a\'s edge covers both regions, whole and in pages of one', async () => {
    const all = [inA.sandboxId, inB.sandboxId, ...placed].sort();
    assert.deepEqual((await listedViaA()).sort(), all);
    const paginator = Sandbox.list({ ...viaA, query: { metadata }, limit: 1 });
    const pages: string[][] = [];
    for (let i = 0; i < 10 && paginator.hasNext; i++) pages.push((await paginator.nextItems()).map((s) => s.sandboxId));
    assert.ok(pages.every((p) => p.length <= 1), `pages of at most one: ${JSON.stringify(pages)}`);
    assert.deepEqual(pages.flat().sort(), all, 'every sandbox of both regions once');
    // A list at region b's worker alone sees region b only: the merge is the hub's.
    const atB = { apiUrl: b.apiUrl, apiKey: fed.adminKey };
    const bOnly = (await Sandbox.list({ ...atB, query: { metadata } }).nextItems()).map((s) => s.sandboxId);
    assert.ok(bOnly.every((id) => id.startsWith('e2fb')), bOnly.join(','));
  });

  await t.test('kill through region a\'s edge reaches either region', async () => {
    for (const id of [inB.sandboxId, ...placed]) assert.equal(await Sandbox.kill(id, viaA), true, id);
    assert.deepEqual(await listedViaA(), [inA.sandboxId]);
  });
});
