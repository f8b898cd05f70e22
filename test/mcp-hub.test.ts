// MCP at the hub (streamable HTTP, /mcp) on a real federation of one cluster: the SDK's client,
// with a team's key made at the hub as bearer, creates a sandbox the hub places on a worker and
// works in it through the hub; another team's key sees and touches none of it.
// Its own federation: bridge asbmcph, subnet 10.192.0.0/16.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { startTestFederation } from './support/federation.ts';
import { httpClient } from './support/mcp-client.ts';
import { waitFor } from './support/wait.ts';

async function teamKey(hubUrl: string, adminKey: string, team: string): Promise<string> {
  const res = await fetch(`${hubUrl}/v1/keys`, { method: 'POST', headers: { authorization: `Bearer ${adminKey}`, 'content-type': 'application/json' }, body: JSON.stringify({ team }) });
  assert.equal(res.status, 201);
  return ((await res.json()) as { key: string }).key;
}

test('MCP at the hub: a team creates and works in a sandbox placed on a worker; another team cannot see or touch it', async (t) => {
  const fed = await startTestFederation([['mcph', 'mcph', 192]]);
  t.after(() => fed.cleanup());
  const [cluster] = fed.clusters;
  assert.ok(cluster !== undefined);
  const keyA = await teamKey(fed.hubUrl, fed.adminKey, 'mcp-hub-a');
  const keyB = await teamKey(fed.hubUrl, fed.adminKey, 'mcp-hub-b');
  // Keys reach the worker by sync; the hub forwards each call with the caller's own key.
  for (const key of [keyA, keyB]) {
    await waitFor('the key to reach the worker', async () => {
      const r = await fetch(`${cluster.apiUrl}/v1/sandboxes`, { headers: { authorization: `Bearer ${key}` } });
      await r.body?.cancel();
      return r.status === 200 ? true : undefined;
    }, 30_000, 100);
  }

  const noKey = await fetch(`${fed.hubUrl}/mcp`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
  assert.equal(noKey.status, 401);
  assert.equal(((await noKey.json()) as { code: string }).code, 'Unauthorized');

  const a = await httpClient(t, fed.hubUrl, keyA);
  const { tools } = await a.client.listTools();
  assert.ok(tools.some((x) => x.name === 'run_command') && tools.some((x) => x.name === 'create_sandbox'));

  const sb = await a.ok('create_sandbox', { timeout_seconds: 600, env: { WHERE: 'via the hub' } });
  const id = String(sb.id);
  assert.equal(sb.cluster, 'mcph', 'placed on the worker cluster');
  assert.ok(id.startsWith('mcph'));
  await a.ok('write_file', { sandbox_id: id, path: '/tmp/hello.txt', content: 'hello' });
  const ran = await a.ok('run_command', { sandbox_id: id, command: 'cat /tmp/hello.txt; echo " $WHERE"' });
  assert.equal(ran.stdout, 'hello via the hub\n');
  const url = await a.ok('get_url', { sandbox_id: id, port: 8000 });
  assert.match(String(url.url), new RegExp(`^http://8000-${id}\\.asb\\.localhost:\\d+$`));
  const listed = await a.ok('list_sandboxes');
  assert.deepEqual((listed.sandboxes as { id: string }[]).map((s) => s.id), [id]);

  const b = await httpClient(t, fed.hubUrl, keyB);
  assert.deepEqual((await b.ok('list_sandboxes')).sandboxes, [], 'team B lists nothing');
  for (const [tool, args] of [['get_sandbox', {}], ['run_command', { command: 'touch /tmp/pwned' }], ['read_file', { path: '/tmp/hello.txt' }], ['kill_sandbox', {}]] as const) {
    const r = await b.call(tool, { sandbox_id: id, ...args });
    assert.ok(r.isError, `${tool} by team B is refused`);
    assert.match(r.text, /^NotFound: sandbox .* not found[\s\S]*list_sandboxes/, tool);
  }

  const snaps = await a.call('list_snapshots');
  assert.ok(snaps.isError, 'snapshots are listed at a worker, not at the hub');
  assert.match(snaps.text, /at a worker, not at the hub/);

  const gone = await a.ok('kill_sandbox', { sandbox_id: id });
  assert.equal(gone.killed, true);
  const after = await waitFor('the killed sandbox to be gone', async () => {
    const r = await a.call('get_sandbox', { sandbox_id: id });
    return r.isError ? r : undefined;
  }, 60_000, 250);
  assert.match(after.text, /^NotFound/);
});
