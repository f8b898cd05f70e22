// `asb webhook` and `asb events` against the real worker API: a webhook added with its secret on
// stdin (never argv, never printed), listed, its deliveries shown, removed; a sandbox's events
// listed oldest first; a bad URL refused naming the field.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runAsb } from './support/run-asb.ts';
import { call, startWorkerFixture } from './support/worker-fixture.ts';
import { waitFor } from './support/wait.ts';

test('asb webhook add/ls/deliveries/rm and asb events; the secret is read from stdin and never printed', async (t) => {
  // The webhook names loopback (a closed port: its one delivery is attempted and fails), so the
  // worker runs with --webhook-allow-private (allowPrivate).
  const fx = await startWorkerFixture((fn) => t.after(fn), {}, { events: { webhooks: { allowPrivate: true } } });
  const env = { ASB_API_URL: fx.url, ASB_API_KEY: fx.keys.teamA };
  const asb = (args: string[], input?: string) => runAsb(args, { env, ...(input === undefined ? {} : { input }) });
  const secret = 'cli-secret-7a7a7a7a7a7a';

  const added = await asb(['webhook', 'add', 'http://127.0.0.1:9/hook', '--name', 'pager', '--events', 'sandbox.lifecycle.killed'], `${secret}\n`);
  assert.equal(added.code, 0, added.stderr);
  const id = /^webhook\/(\S+) added\n$/.exec(added.stdout)?.[1] ?? '';
  assert.notEqual(id, '');
  const ls = await asb(['webhook', 'ls']);
  assert.match(ls.stdout, new RegExp(`^ID\\s+NAME\\s+URL\\s+ENABLED\\s+EVENTS\\n${id}\\s+pager\\s+http://127\\.0\\.0\\.1:9/hook\\s+true\\s+sandbox\\.lifecycle\\.killed\\n$`));
  const bad = await asb(['webhook', 'add', 'gopher://x'], `${secret}\n`);
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /url: scheme gopher: is not supported/);
  assert.equal((await asb(['webhook', 'add', 'http://127.0.0.1:9/'], '')).code, 2, 'an empty stdin is a usage error');

  const created = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: {} });
  const sandbox = (created.json as { id: string }).id;
  assert.equal((await call(fx, 'DELETE', `/v1/sandboxes/${sandbox}`, { key: fx.keys.teamA })).status, 202);
  const events = await waitFor('killed', async () => {
    const out = await asb(['events', sandbox]);
    return out.stdout.includes('sandbox.lifecycle.killed') ? out : undefined;
  }, 20_000);
  assert.match(events.stdout, /^TIME\s+TYPE\s+REASON\s+MESSAGE\n\S+\s+sandbox\.lifecycle\.created\s+SandboxCreated\s+sandbox created\n\S+\s+sandbox\.lifecycle\.ready\s+SandboxReady\s+pod is ready\n/);
  const deliveries = await waitFor('a delivery attempted', async () => {
    const out = await asb(['webhook', 'deliveries', id, '--json']);
    const list = JSON.parse(out.stdout) as { eventType: string; attempts: unknown[] }[];
    return list.length === 1 && list[0]?.attempts.length !== 0 ? list : undefined;
  }, 20_000);
  assert.equal(deliveries[0]?.eventType, 'sandbox.lifecycle.killed', 'only the types it asked for');
  assert.equal((await asb(['webhook', 'rm', id])).stdout, `webhook/${id} deleted\n`);
  assert.equal((await asb(['events', sandbox], undefined)).code, 0);
  const other = await runAsb(['events', sandbox], { env: { ...env, ASB_API_KEY: fx.keys.teamB } });
  assert.equal(other.code, 1, 'another team\'s sandbox has no events for it');
  for (const out of [added, ls, bad, events]) assert.doesNotMatch(out.stdout + out.stderr, /cli-secret/);
});
