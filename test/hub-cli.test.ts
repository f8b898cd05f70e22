// The hub commands of the asb CLI (cluster, key, template) against a real hub process, run as a
// user runs them: a child process configured through ASB_HUB_URL/ASB_HUB_KEY, flags or an env
// file, checked on exit code, stdout and stderr.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { freePort } from '../src/assembly/local-system.ts';
import { hubAdminKey, startHubProcess } from './support/hub-process.ts';
import { runAsb, type RunResult } from './support/run-asb.ts';

function asb(args: string[], env: Record<string, string>, opts: { cwd?: string; input?: string } = {}): Promise<RunResult> {
  return runAsb(args, { ...opts, env });
}

/** A port nothing listens on: bind one, then close it. */
test('asb cluster / key / template against a real hub process', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-hub-cli-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const hub = await startHubProcess(dir);
  t.after(() => hub.stop());
  const admin = hubAdminKey(dir);
  const env = { ASB_HUB_URL: hub.ready.url, ASB_HUB_KEY: admin };

  await t.test('cluster add prints the credential once; ls shows the registry', async () => {
    const added = await asb(['cluster', 'add', 'region-a', '--region', 'region-a', '--ingress', '127.0.0.1:10001', '--tag', 'rga1', '--label', 'tier=gold'], env);
    assert.equal(added.code, 0, added.stderr);
    assert.match(added.stdout, /^cluster\/region-a registered\ncredential: asbc_[a-z0-9]{32}\n$/);
    assert.match(added.stderr, /shown only once/);

    const again = await asb(['cluster', 'add', 'region-a', '--api-url', 'http://127.0.0.1:7081'], env);
    assert.equal(again.code, 0, again.stderr);
    assert.equal(again.stdout, 'cluster/region-a configured\n', 'no credential on an update');

    assert.equal((await asb(['cluster', 'drain', 'region-a'], env)).code, 0);
    const ls = await asb(['cluster', 'ls'], env);
    assert.equal(ls.code, 0, ls.stderr);
    const lines = ls.stdout.trim().split('\n');
    assert.deepEqual(lines[0]?.split(/\s+/), ['NAME', 'REGION', 'CONNECTED', 'VERSION', 'LAG', 'DRAIN']);
    assert.deepEqual(lines[1]?.split(/\s+/), ['region-a', 'region-a', 'false', '-', '-', 'true']);

    assert.equal((await asb(['cluster', 'drain', 'region-a', '--off'], env)).code, 0);
    const json = await asb(['cluster', 'ls', '--json'], env);
    const items = (JSON.parse(json.stdout) as { items: { metadata: { name: string }; spec: Record<string, unknown> }[] }).items;
    const spec = items[0]?.spec;
    assert.deepEqual([spec?.drain, spec?.apiUrl], [false, 'http://127.0.0.1:7081']);
    assert.ok(!json.stdout.includes('credentialHash'));
  });

  await t.test('cluster mistakes: usage errors exit 2, refusals exit 1 naming the field', async () => {
    const badIngress = await asb(['cluster', 'add', 'x', '--region', 'r', '--ingress', 'nope', '--tag', 'abcd'], env);
    assert.equal(badIngress.code, 2);
    assert.match(badIngress.stderr, /--ingress must be host:port/);
    const clash = await asb(['cluster', 'add', 'region-b', '--region', 'region-b', '--ingress', '127.0.0.1:10002', '--tag', 'rga1'], env);
    assert.equal(clash.code, 1);
    assert.match(clash.stderr, /already used by cluster "region-a"/);
    const missing = await asb(['cluster', 'add', 'region-c'], env);
    assert.equal(missing.code, 1);
    assert.match(missing.stderr, /region: is required/);
    const wrongFlag = await asb(['cluster', 'ls', '--off'], env);
    assert.equal(wrongFlag.code, 2);
    assert.match(wrongFlag.stderr, /--off does not apply to "ls"/);
    const noSub = await asb(['cluster'], env);
    assert.equal(noSub.code, 2);
  });

  await t.test('key create prints the key once; it works; revoke refuses it', async () => {
    const created = await asb(['key', 'create', '--team', 'team-a'], env);
    assert.equal(created.code, 0, created.stderr);
    const key = created.stdout.trim();
    assert.match(key, /^asb_[a-z0-9]{8}_[a-z0-9]{32}$/);
    const prefix = key.slice(0, 12);

    const ls = await asb(['key', 'ls'], env);
    assert.equal(ls.code, 0);
    assert.match(ls.stdout, new RegExp(`^${prefix}\\s+team-a\\s+false\\s+false\\s+\\d+s$`, 'm'));
    assert.ok(!ls.stdout.includes(key));

    // A tenant key reads the hub's templates but cannot administer.
    const asTenant = await asb(['key', 'ls', '--hub-key', key], env);
    assert.equal(asTenant.code, 1);
    assert.match(asTenant.stderr, /needs an admin API key/);
    assert.equal((await asb(['template', 'ls', '--hub-key', key], env)).code, 0);

    const revoked = await asb(['key', 'revoke', prefix], env);
    assert.equal(revoked.code, 0, revoked.stderr);
    assert.equal(revoked.stdout, `key/${prefix} revoked\n`);
    const refused = await asb(['template', 'ls', '--hub-key', key], env);
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /unknown to the hub or revoked[\s\S]*ASB_HUB_KEY/);

    const json = await asb(['key', 'create', '--team', 'ops', '--admin', '--json'], env);
    const body = JSON.parse(json.stdout) as { key: string; team: string; admin: boolean };
    assert.deepEqual([body.team, body.admin], ['ops', true]);
  });

  await t.test('template apply validates locally, applies to the hub, refuses other kinds', async () => {
    const file = join(dir, 'tpl.yaml');
    writeFileSync(file, `apiVersion: extensions.agents.x-k8s.io/v1alpha1
kind: SandboxTemplate
metadata:
  name: python
spec:
  podTemplate:
    spec:
      containers:
        - name: main
          image: python:3.12
`);
    const applied = await asb(['template', 'apply', '-f', file], env);
    assert.equal(applied.code, 0, applied.stderr);
    assert.equal(applied.stdout, 'sandboxtemplate/python created\n');
    const again = await asb(['template', 'apply', '-f', '-'], env, { input: readFileSync(file, 'utf8') });
    assert.equal(again.stdout, 'sandboxtemplate/python unchanged\n');
    const ls = await asb(['template', 'ls'], env);
    assert.match(ls.stdout, /^default\s+python\s+\d+s$/m);

    writeFileSync(file, 'apiVersion: extensions.agents.x-k8s.io/v1alpha1\nkind: SandboxTemplate\nmetadata: {name: bad}\nspec: {podTemplate: {spec: {containers: [{name: main, image: 7}]}}}\n');
    const invalid = await asb(['template', 'apply', '-f', file], env);
    assert.equal(invalid.code, 1);
    assert.match(invalid.stderr, /containers\[0\]\.image/);
    writeFileSync(file, 'apiVersion: extensions.agents.x-k8s.io/v1alpha1\nkind: SandboxWarmPool\nmetadata: {name: p}\nspec: {replicas: 1, sandboxTemplateRef: {name: python}}\n');
    const pool = await asb(['template', 'apply', '-f', file], env);
    assert.equal(pool.code, 1);
    assert.match(pool.stderr, /SandboxTemplates only/);
  });

  await t.test('the hub is found through flags or an env file, and its absence is explained', async () => {
    const envDir = mkdtempSync(join(dir, 'state-'));
    writeFileSync(join(envDir, 'env'), `ASB_HUB_URL=${hub.ready.url}\nASB_HUB_KEY=${admin}\n`);
    const fromFile = await asb(['cluster', 'ls'], { ASB_STATE_DIR: envDir });
    assert.equal(fromFile.code, 0, fromFile.stderr);
    assert.match(fromFile.stdout, /region-a/);
    const fromFlags = await asb(['key', 'ls', '--hub-url', hub.ready.url, '--hub-key', admin], {});
    assert.equal(fromFlags.code, 0, fromFlags.stderr);
    const none = await asb(['cluster', 'ls'], {});
    assert.equal(none.code, 1);
    assert.match(none.stderr, /no hub URL.*ASB_HUB_URL/);
    const port = await freePort();
    const down = await asb(['cluster', 'ls', '--hub-url', `http://127.0.0.1:${port}`], { ASB_HUB_KEY: admin });
    assert.equal(down.code, 1);
    assert.match(down.stderr, new RegExp(`cannot reach the hub at http://127\\.0\\.0\\.1:${port} \\(ECONNREFUSED\\)`));
  });
});
