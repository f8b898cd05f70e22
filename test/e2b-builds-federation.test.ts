// Template builds behind the hub, as `make up` runs it: the unmodified JS SDK at a cluster's edge
// builds a template (the build calls go to that edge's cluster, the template's id carries its
// tag), and Sandbox.create by the template's name at the edge is placed by the hub on the
// cluster that holds the name, where the worker resolves it for the team; another team's create
// by that name is a 404. Own tag and bridge (bsf1, asbbsf1), subnet 10.241.0.0/16.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as e2b from 'e2b';
import { startTestFederation } from './support/federation.ts';
import { waitFor } from './support/wait.ts';

async function hubKey(hubUrl: string, adminKey: string, team: string): Promise<string> {
  const res = await fetch(`${hubUrl}/v1/keys`, { method: 'POST', headers: { authorization: `Bearer ${adminKey}`, 'content-type': 'application/json' }, body: JSON.stringify({ team }), signal: AbortSignal.timeout(20_000) });
  const text = await res.text();
  assert.equal(res.status, 201, text);
  return (JSON.parse(text) as { key: string }).key;
}

test('a template built at one edge of a federation is created by name through the hub, for its team only', { timeout: 280_000 }, async (t) => {
  const fed = await startTestFederation([['bs-fed', 'bsf1', 241]], 0);
  t.after(() => fed.cleanup());
  const cluster = fed.clusters[0] ?? assert.fail('no cluster');
  const keyA = await hubKey(fed.hubUrl, fed.adminKey, 'fed-team-a');
  const keyB = await hubKey(fed.hubUrl, fed.adminKey, 'fed-team-b');
  const { Sandbox, Template } = e2b;
  const opts = { apiUrl: cluster.edgeUrl, sandboxUrl: cluster.edgeUrl, apiKey: keyA };
  // The keys reach the worker through the hub's sync.
  await waitFor('team a\'s key at the worker', async () => ((await fetch(`${cluster.apiUrl}/v1/sandboxes`, { headers: { authorization: `Bearer ${keyA}` } })).status === 200 ? true : undefined));

  const info = await Template.build(Template().fromImage('debian:12').runCmd('echo federated > /fed.txt'), 'fed-env', opts);
  assert.ok(info.templateId.startsWith('bsf1'), `the template id carries the cluster's tag: ${info.templateId}`);
  // Placed by the hub once the cluster's heartbeat names the template (reportNow after the build).
  const sbx = await waitFor('a create by name through the hub', async () => {
    try {
      return await Sandbox.create('fed-env', opts);
    } catch (err) {
      if (err instanceof Error && /no cluster|Unavailable|503/i.test(err.message)) return undefined;
      throw err;
    }
  });
  try {
    assert.equal((await sbx.commands.run('cat /fed.txt')).stdout, 'federated\n');
  } finally {
    await sbx.kill();
  }
  await assert.rejects(Sandbox.create('fed-env', { ...opts, apiKey: keyB }), /not found/i);
});
