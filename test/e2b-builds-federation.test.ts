// Template builds behind the hub, as `make up` runs it: the unmodified JS SDK at a cluster's edge
// builds a template (the build calls go to that edge's cluster, the template's id carries its
// tag), and Sandbox.create by the template's name at the edge is placed by the hub on the
// cluster that holds the name, where the worker resolves it for the team; another team's create
// by that name is a 404, with the SDK and with `asb create --template`. Own tag and bridge (bsf1, asbbsf1), subnet 10.22.0.0/16.
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

test('a template built at one edge of a federation is created by name through the hub, for its team only', { timeout: 280_000 }, async (t) => {
  const fed = await startTestFederation([['bs-fed', 'bsf1', 22]], 0);
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

  // asb create --template <name>, as the team's user runs it.
  const asbEnv = (key: string): Record<string, string> => ({ ASB_API_URL: cluster.edgeUrl, ASB_API_KEY: key, ASB_HUB_URL: fed.hubUrl, ASB_HUB_KEY: key });
  const cli = await runAsb(['create', '--template', 'fed-env', '--json'], { env: asbEnv(keyA) });
  assert.equal(cli.code, 0, cli.stderr);
  const created = JSON.parse(cli.stdout) as { id: string; ready: boolean };
  assert.ok(created.id.startsWith('bsf1') && created.ready, cli.stdout);
  const other = await runAsb(['create', '--template', 'fed-env', '--json'], { env: asbEnv(keyB) });
  assert.notEqual(other.code, 0);
  assert.match(other.stderr, /not found/i);
});

test('with two clusters, a template built at one edge starts on the other cluster too, and either edge lists and gets the team\'s templates of both', { timeout: 290_000 }, async (t) => {
  const fed = await startTestFederation([['kb-east', 'kf01', '10.211.0.0/17'], ['kb-west', 'kf02', '10.211.128.0/17']], 0);
  t.after(() => fed.cleanup());
  const [east, west] = [fed.clusters[0] ?? assert.fail('no east'), fed.clusters[1] ?? assert.fail('no west')];
  const keyA = await hubKey(fed.hubUrl, fed.adminKey, 'two-team-a');
  const keyB = await hubKey(fed.hubUrl, fed.adminKey, 'two-team-b');
  for (const c of [east, west]) {
    await waitFor(`team a's key at ${c.apiUrl}`, async () => ((await fetch(`${c.apiUrl}/v1/sandboxes`, { headers: { authorization: `Bearer ${keyA}` } })).status === 200 ? true : undefined));
  }
  const { Template } = e2b;
  // A build at each edge runs on that edge's cluster: its id carries that cluster's tag.
  const built = await Template.build(Template().fromImage('debian:12').runCmd('echo built-in-east > /where.txt'), 'east-env', { apiUrl: east.edgeUrl, apiKey: keyA });
  assert.ok(built.templateId.startsWith('kf01'), built.templateId);
  const other = await Template.build(Template().fromImage('debian:12').runCmd('echo built-in-west > /where.txt'), 'west-env', { apiUrl: west.edgeUrl, apiKey: keyA });
  assert.ok(other.templateId.startsWith('kf02'), other.templateId);

  // The east build, synced through the hub, starts on the west cluster (the image is in the registry both pull from).
  const onWest = await waitFor('east-env usable on the west cluster', async () => {
    const res = await fetch(`${west.apiUrl}/v1/sandboxes`, { method: 'POST', headers: { authorization: `Bearer ${keyA}`, 'content-type': 'application/json' }, body: JSON.stringify({ template: 'east-env' }) });
    const body = (await res.json()) as { id?: string };
    return res.status === 201 ? body : undefined;
  }, 60_000, 500);
  const id = onWest.id ?? assert.fail('no id');
  assert.ok(id.startsWith('kf02'), `started on the west cluster: ${id}`);
  const exec = await fetch(`${west.apiUrl}/v1/sandboxes/${id}/exec`, { method: 'POST', headers: { authorization: `Bearer ${keyA}`, 'content-type': 'application/json' }, body: JSON.stringify({ command: ['cat', '/where.txt'] }) });
  assert.equal(((await exec.json()) as { stdout: string }).stdout, 'built-in-east\n');
  // Another team cannot start it on either cluster.
  for (const c of [east, west]) {
    const res = await fetch(`${c.apiUrl}/v1/sandboxes`, { method: 'POST', headers: { authorization: `Bearer ${keyB}`, 'content-type': 'application/json' }, body: JSON.stringify({ template: 'east-env' }) });
    assert.equal(res.status, 404, `team b at ${c.apiUrl}`);
  }

  // E2B's template list and get, through either edge: the team's templates of both clusters.
  const e2bGet = async (edge: string, path: string, key: string): Promise<{ status: number; body: unknown }> => {
    const res = await fetch(`${edge}${path}`, { headers: { 'x-api-key': key } });
    return { status: res.status, body: await res.json() };
  };
  for (const edge of [east.edgeUrl, west.edgeUrl]) {
    const listed = await e2bGet(edge, '/templates', keyA);
    assert.equal(listed.status, 200, JSON.stringify(listed.body));
    assert.deepEqual((listed.body as { aliases: string[] }[]).map((x) => x.aliases[0]).sort(), ['east-env', 'west-env'], `GET /templates at ${edge}`);
    for (const tpl of [built, other]) {
      const got = await e2bGet(edge, `/templates/${tpl.templateId}`, keyA);
      assert.equal(got.status, 200, `GET /templates/${tpl.templateId} at ${edge}: ${JSON.stringify(got.body)}`);
      assert.equal((got.body as { templateID: string }).templateID, tpl.templateId);
    }
    assert.deepEqual((await e2bGet(edge, '/templates', keyB)).body, [], 'another team lists none of them');
    // The SDK's exists (GET /templates/aliases/{name}) at either edge, for the team only.
    for (const name of ['east-env', 'west-env']) {
      assert.equal(await Template.exists(name, { apiUrl: edge, apiKey: keyA }), true, `${name} at ${edge}`);
      assert.equal(await Template.exists(name, { apiUrl: edge, apiKey: keyB }), false, `${name} at ${edge} for another team`);
    }
  }
  // The hub holds the built templates for the team that built them; to another team they are absent.
  const names = async (url: string, key: string): Promise<string[]> => {
    const res = await fetch(url, { headers: { authorization: `Bearer ${key}` } });
    assert.equal(res.status, 200);
    return ((await res.json()) as { items: { metadata: { name: string } }[] }).items.map((i) => i.metadata.name);
  };
  assert.ok((await names(`${fed.hubUrl}/v1/templates`, keyA)).includes(built.templateId));
  for (const url of [`${fed.hubUrl}/v1/templates`, `${west.apiUrl}/v1/templates`]) assert.ok(!(await names(url, keyB)).includes(built.templateId), url);
  assert.equal((await fetch(`${fed.hubUrl}/v1/templates/${built.templateId}`, { headers: { authorization: `Bearer ${keyB}` } })).status, 404);
});
