// A built template's tags across a federation of two clusters, with the unmodified JS SDK and
// `asb`: `name:tag` built at one cluster's edge starts the build the tag names on the other
// cluster too (the tags travel with the tagged builds' SandboxTemplates through the hub), follows
// the tag when it is removed or moved, and is absent to another team; removing the building
// cluster at the hub removes its built templates from every cluster. Own tags and bridges
// (lb01/lb02: asblb01, asblb02), subnet 10.141.0.0/16.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as e2b from 'e2b';
import { startTestFederation } from './support/federation.ts';
import { runAsb } from './support/run-asb.ts';
import { waitFor } from './support/wait.ts';

async function hubKey(hubUrl: string, adminKey: string, team: string): Promise<string> {
  const res = await fetch(`${hubUrl}/v1/keys`, { method: 'POST', headers: { authorization: `Bearer ${adminKey}`, 'content-type': 'application/json' }, body: JSON.stringify({ team }), signal: AbortSignal.timeout(20_000) });
  const text = await res.text();
  assert.equal(res.status, 201, text);
  return (JSON.parse(text) as { key: string }).key;
}

test('name:tag built at one cluster starts its build on the other cluster, follows tag changes, and goes with the building cluster', { timeout: 295_000 }, async (t) => {
  const fed = await startTestFederation([['bl-east', 'lb01', '10.141.0.0/17'], ['bl-west', 'lb02', '10.141.128.0/17']], 0);
  t.after(() => fed.cleanup());
  const [east, west] = [fed.clusters[0] ?? assert.fail('no east'), fed.clusters[1] ?? assert.fail('no west')];
  const keyA = await hubKey(fed.hubUrl, fed.adminKey, 'tag-team-a');
  const keyB = await hubKey(fed.hubUrl, fed.adminKey, 'tag-team-b');
  for (const c of [east, west]) {
    await waitFor(`team a's key at ${c.apiUrl}`, async () => ((await fetch(`${c.apiUrl}/v1/sandboxes`, { headers: { authorization: `Bearer ${keyA}` } })).status === 200 ? true : undefined));
  }
  const { Sandbox, Template } = e2b;
  const atEast = { apiUrl: east.edgeUrl, apiKey: keyA };
  // Two builds at the east edge: v1 names the first, the name alone (default) the second.
  const first = await Template.build(Template().fromImage('debian:12').runCmd('echo one > /which.txt'), 'tagged-env:v1', atEast);
  assert.ok(first.templateId.startsWith('lb01'), first.templateId);
  await Template.build(Template().fromImage('debian:12').runCmd('echo two > /which.txt'), 'tagged-env', atEast);

  /** A create of `template` at the west cluster's worker: what /which.txt holds in it, or the status when not 201. */
  const onWest = async (template: string, key = keyA): Promise<string | number> => {
    const res = await fetch(`${west.apiUrl}/v1/sandboxes`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify({ template }) });
    const body = (await res.json()) as { id?: string };
    if (res.status !== 201) return res.status;
    const id = body.id ?? assert.fail('no id');
    assert.ok(id.startsWith('lb02'), `started on the west cluster: ${id}`);
    const exec = await fetch(`${west.apiUrl}/v1/sandboxes/${id}/exec`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify({ command: ['cat', '/which.txt'] }) });
    const out = ((await exec.json()) as { stdout: string }).stdout;
    await fetch(`${west.apiUrl}/v1/sandboxes/${id}`, { method: 'DELETE', headers: { authorization: `Bearer ${key}` } });
    return out;
  };
  /** Waits (bounded: 60 s, 500 ms apart) until a create of `template` at west gives `want`. */
  const westGives = (template: string, want: string | number): Promise<true> => waitFor(`${template} at the west cluster to give ${String(want)}`, async () => ((await onWest(template)) === want ? true : undefined), 60_000, 500);

  await westGives('tagged-env:v1', 'one\n');
  assert.equal(await onWest('tagged-env'), 'two\n');
  assert.equal(await onWest('tagged-env:v9'), 404);
  assert.equal(await onWest('tagged-env:v1', keyB), 404, 'another team');

  // asb at the west cluster's API, and the SDK at the west edge (placed by the hub on either cluster).
  const cli = await runAsb(['create', '--template', 'tagged-env:v1', '--json'], { env: { ASB_API_URL: west.apiUrl, ASB_API_KEY: keyA } });
  assert.equal(cli.code, 0, cli.stderr);
  const created = JSON.parse(cli.stdout) as { id: string; ready: boolean };
  assert.ok(created.id.startsWith('lb02') && created.ready, cli.stdout);
  const sbx = await Sandbox.create('tagged-env:v1', { apiUrl: west.edgeUrl, sandboxUrl: west.edgeUrl, apiKey: keyA });
  try {
    assert.equal((await sbx.commands.run('cat /which.txt')).stdout, 'one\n');
  } finally {
    await sbx.kill();
  }

  // The tag moves at the building cluster: the west cluster follows.
  await Template.assignTags('tagged-env', 'v1', atEast);
  await westGives('tagged-env:v1', 'two\n');
  await Template.removeTags('tagged-env', 'v1', atEast);
  await westGives('tagged-env:v1', 404);
  assert.equal(await onWest('tagged-env'), 'two\n');

  // The building cluster is removed at the hub: its templates go from the hub and the west cluster.
  const removed = await fetch(`${fed.hubUrl}/v1/clusters/bl-east`, { method: 'DELETE', headers: { authorization: `Bearer ${fed.adminKey}` } });
  assert.equal(removed.status, 200, await removed.text());
  const atHub = await fetch(`${fed.hubUrl}/v1/templates`, { headers: { authorization: `Bearer ${fed.adminKey}` } });
  const names = ((await atHub.json()) as { items: { metadata: { name: string } }[] }).items.map((i) => i.metadata.name);
  assert.ok(!names.some((n) => n.startsWith('lb01')), `no template of the removed cluster at the hub: ${names.join(', ')}`);
  await westGives('tagged-env', 404);
});
