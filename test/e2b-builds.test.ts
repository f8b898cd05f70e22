// Template builds end to end: the unmodified E2B SDKs against the whole local system (Envoy, the
// router, a worker with the real build engine pushing to the tests' loopback registry): the
// Python SDK's scenarios (test/python/test_e2b_builds.py, tags pinning builds among them;
// pytest's summary is read, so a skipped or uncollected scenario fails here), then the JS SDK's.
// Its own system: tag bt01, bridge asbbt01, subnet 10.23.0.0/16.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import * as e2b from 'e2b';
import { startTestSystem } from './support/local-system.ts';
import { outcomes, REPO_ROOT, runPytest, VENV_PYTHON } from './support/pytest.ts';

const suite = join('test', 'python', 'test_e2b_builds.py');

test('the E2B SDKs build templates from steps and a Dockerfile with the real engine, and start sandboxes from them by name', async (t) => {
  assert.ok(existsSync(VENV_PYTHON), `${VENV_PYTHON} is missing: make test installs e2b and pytest into .venv`);
  const defined = [...readFileSync(join(REPO_ROOT, suite), 'utf8').matchAll(/^def test_/gm)].length;
  const system = await startTestSystem('bt01', 23, 'local', 0, false, ['team-a', 'team-b']);
  t.after(() => system.cleanup());
  const keyA = system.teamKeys['team-a'] ?? assert.fail('no team-a key');
  const keyB = system.teamKeys['team-b'] ?? assert.fail('no team-b key');

  await t.test('the Python SDK', async () => {
    const env = { PATH: process.env.PATH, HOME: process.env.HOME, PYTHONDONTWRITEBYTECODE: '1', E2B_API_URL: system.edgeUrl, E2B_SANDBOX_URL: system.edgeUrl, E2B_DOMAIN: `asb.localhost:${new URL(system.edgeUrl).port}`, KEY_A: keyA, KEY_B: keyB };
    const run = await runPytest(suite, env, 600_000);
    const failure = `pytest exited ${String(run.code)}${run.signal === null ? '' : ` (${run.signal})`}:\n${run.output}`;
    assert.deepEqual(outcomes(run.output), { passed: defined }, failure);
  });

  await t.test('the JS SDK', async () => {
    const { Sandbox, Template } = e2b;
    const opts = { apiUrl: system.edgeUrl, sandboxUrl: system.edgeUrl, apiKey: keyA };
    const ctx = mkdtempSync(join(tmpdir(), 'asb-js-build-'));
    t.after(() => rmSync(ctx, { recursive: true, force: true }));
    writeFileSync(join(ctx, 'data.txt'), 'from the JS SDK\n');
    const template = Template({ fileContextPath: ctx })
      .fromImage('debian:12')
      .copy('data.txt', '/data/data.txt')
      .setEnvs({ FROM_JS: 'yes' })
      .setWorkdir('/data')
      .setStartCmd('touch /tmp/js-started; exec sleep infinity', 'test -f /tmp/js-started');
    const lines: string[] = [];
    const info = await Template.build(template, 'js-env', { ...opts, onBuildLogs: (entry) => lines.push(entry.message) });
    assert.ok(info.templateId !== '');
    const sbx = await Sandbox.create('js-env', opts);
    try {
      assert.equal((await sbx.commands.run('cat /data/data.txt')).stdout, 'from the JS SDK\n');
      assert.equal((await sbx.commands.run('echo "$FROM_JS"')).stdout.trim(), 'yes');
      assert.equal((await sbx.commands.run('test -f /tmp/js-started && echo started')).stdout.trim(), 'started');
    } finally {
      await sbx.kill();
    }
    await assert.rejects(Sandbox.create('js-env', { ...opts, apiKey: keyB }), /not found/i);
  });
});
