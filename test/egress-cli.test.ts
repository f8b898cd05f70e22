// `asb egress`: secrets in through stdin (never argv), listed by name only, rules set and listed,
// against the real worker API; no output ever carries a secret's value.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runAsb } from './support/run-asb.ts';
import { startWorkerFixture } from './support/worker-fixture.ts';

test('asb egress: secret set from stdin, ls by name, rule set/ls/rm, secret rm; values never printed', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const env = { ASB_API_URL: fx.url, ASB_API_KEY: fx.keys.admin };
  const asb = (args: string[], input?: string) => runAsb(['egress', ...args], { env, ...(input === undefined ? {} : { input }) });
  const value = 'Bearer sk-cli-5a5a5a5a5a5a';

  const set = await asb(['secret', 'set', 'openai'], `${value}\n`);
  assert.equal(set.code, 0, set.stderr);
  assert.equal(set.stdout, 'secret/openai set\n');
  const ls = await asb(['secret', 'ls']);
  assert.equal(ls.code, 0, ls.stderr);
  assert.match(ls.stdout, /^NAME\s+UPDATED\nopenai\s+\d{4}-/);
  assert.doesNotMatch(ls.stdout, /sk-cli/);
  const empty = await asb(['secret', 'set', 'other'], '');
  assert.equal(empty.code, 2, 'an empty stdin is a usage error, not an empty secret');

  const rule = await asb(['rule', 'set', 'openai', '--host', 'api.openai.com', '--header', 'authorization', '--secret', 'openai', '--path-prefix', '/v1/']);
  assert.equal(rule.code, 0, rule.stderr);
  const rules = await asb(['rule', 'ls', '--json']);
  assert.deepEqual(JSON.parse(rules.stdout), { items: [{ id: 'openai', host: 'api.openai.com', pathPrefix: '/v1/', header: 'authorization', secret: 'openai' }] });
  const bad = await asb(['rule', 'set', 'x', '--host', 'not a host', '--header', 'authorization', '--secret', 'openai']);
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /host/);
  const inUse = await asb(['secret', 'rm', 'openai']);
  assert.equal(inUse.code, 1);
  assert.equal((await asb(['rule', 'rm', 'openai'])).code, 0);
  assert.equal((await asb(['secret', 'rm', 'openai'])).code, 0);
  const teamKey = await runAsb(['egress', 'secret', 'ls'], { env: { ...env, ASB_API_KEY: fx.keys.teamA } });
  assert.equal(teamKey.code, 1, 'team keys may not list secrets');
  for (const out of [set, ls, rule, rules, inUse]) assert.doesNotMatch(out.stdout + out.stderr, /sk-cli/);
});
