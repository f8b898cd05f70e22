// `asb template build` and our REST build routes (/v1/templates/{name}/files and /builds) on a real
// worker API over the real store, operator and build service, with the test engine that runs
// nothing (test/support/recording-engine.ts): these pin what the CLI sends and shows, uploads by
// sha256, bad input and tenancy. test/template-build-e2e.test.ts runs real builds.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { SandboxType, type Sandbox } from '../src/api/types.ts';
import { openContext, packSource } from '../src/builds/build-context.ts';
import { TemplateBuilds } from '../src/builds/service.ts';
import { parseEgressText } from '../src/builds/build-egress.ts';
import type { EgressPolicy } from '../src/network/egress-policy.ts';
import { OpenApiChecker } from './support/openapi-check.ts';
import { RecordingEngine, testBuildService } from './support/recording-engine.ts';
import { emptyDir, runAsb, type RunResult } from './support/run-asb.ts';
import { call, startWorkerFixture, type ApiResponse, type CallOptions, type WorkerFixture } from './support/worker-fixture.ts';

const checker = new OpenApiChecker(new URL('../docs/openapi.yaml', import.meta.url).pathname);

interface Fixture {
  fx: WorkerFixture;
  engine: RecordingEngine;
  builds: () => TemplateBuilds;
  api: (method: string, path: string, opts?: CallOptions) => Promise<ApiResponse>;
  asb: (args: string[], cwd: string, key?: string) => Promise<RunResult>;
}

async function fixture(t: { after: (fn: () => Promise<void>) => void }, buildEgress?: EgressPolicy): Promise<Fixture> {
  const engine = new RecordingEngine();
  let made: TemplateBuilds | undefined;
  const fx = await startWorkerFixture((fn) => t.after(fn), {}, {
    builds: (store, dir) => (made = testBuildService(store, dir, engine, undefined, buildEgress)),
  });
  return {
    fx,
    engine,
    builds: () => made ?? assert.fail('no build service'),
    async api(method, path, opts = {}) {
      const res = await call(fx, method, path, opts);
      checker.check(method, path, res);
      return res;
    },
    asb: (args, cwd, key = fx.keys.teamA) => runAsb(args, { cwd, env: { ASB_API_URL: fx.url, ASB_API_KEY: key } }),
  };
}

function project(): string {
  const dir = emptyDir();
  mkdirSync(join(dir, 'app'));
  writeFileSync(join(dir, 'app/main.py'), 'print("hi")\n');
  writeFileSync(join(dir, 'app/local.env'), 'SECRET=1\n');
  writeFileSync(join(dir, '.dockerignore'), '**/*.env\n');
  writeFileSync(join(dir, 'Dockerfile'), [
    'FROM agent-sandbox/base',
    'ARG V=1',
    'ENV APP_V=$V',
    'WORKDIR /srv',
    'COPY app/ ./app/',
    'RUN echo built $V',
    'USER user',
    'CMD ["python3", "app/main.py"]',
    'HEALTHCHECK CMD test -f /srv/app/main.py',
    '',
  ].join('\n'));
  return dir;
}

test('asb template build sends the Dockerfile\'s steps, uploads the context once, and shows each step under its line', async (t) => {
  const f = await fixture(t);
  const dir = project();
  const r = await f.asb(['template', 'build', 'web', '--build-arg', 'V=2'], dir);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout, 'web\n');
  const req = f.engine.requests[0] ?? assert.fail('the engine got no build');
  assert.deepEqual(req.steps.map((s) => [s.type, ...s.args]), [
    ['ENV', 'APP_V', '2'],
    ['WORKDIR', '/srv'],
    ['COPY', 'app', '/srv/app/', 'root', ''],
    ['RUN', 'export V=2\necho built $V'],
    ['USER', 'user'],
  ]);
  const expected = packSource(openContext(dir), 'app');
  t.after(() => expected.remove());
  assert.equal(req.steps[2]?.filesHash, expected.sha256, 'the COPY names the deterministic tar of app/');
  const stored = f.builds().files.path('team-a', expected.sha256) ?? assert.fail('the tar was not stored');
  assert.equal(createHash('sha256').update(readFileSync(stored)).digest('hex'), expected.sha256);
  assert.doesNotMatch(readFileSync(stored).toString('latin1'), /local\.env/, '.dockerignore kept it out');
  assert.match(r.stderr, /\[\+\] Building template web from agent-sandbox\/base \(5 steps\)/);
  assert.match(r.stderr, /=> context app: 2 entries, .* uploaded/);
  assert.match(r.stderr, /#4 \[4\/5\] RUN echo built \$V\n#4 .*RUN export V=2\n/);
  assert.match(r.stderr, /=> template web built in /);

  const again = await f.asb(['template', 'build', 'web', '--build-arg', 'V=2', '--no-cache'], dir);
  assert.equal(again.code, 0, again.stderr);
  assert.match(again.stderr, /=> context app: .*\(already uploaded\)/);
  assert.equal(f.engine.requests[1]?.noCache, true);
});

test('a failing step exits 1 naming the step and its Dockerfile line; a refused instruction fails before anything is sent', async (t) => {
  const f = await fixture(t);
  const dir = emptyDir();
  writeFileSync(join(dir, 'Dockerfile'), 'FROM agent-sandbox/base\nENV A=1\n\nRUN exit 3\n');
  const failed = await f.asb(['template', 'build', 'broken', '.'], dir);
  assert.equal(failed.code, 1, failed.stderr);
  assert.match(failed.stderr, /ERROR: build of template broken failed at step 2\/2 \(Dockerfile line 4: RUN exit 3\)/);

  writeFileSync(join(dir, 'Dockerfile'), 'FROM agent-sandbox/base\nRUN echo no\nFROM debian:12\n');
  const refused = await f.asb(['template', 'build', 'multi'], dir);
  assert.equal(refused.code, 1);
  assert.equal(refused.stderr, 'error: Dockerfile line 3: a second FROM: multi-stage Dockerfiles are not supported (one FROM per file)\n');
  assert.equal(f.engine.requests.length, 1, 'only the first build reached the engine');
  assert.equal(f.builds().find('team-a', 'multi'), undefined, 'no template was made');
});

test('a steps file (YAML) is the other way in: its COPY sources are packed and uploaded like a Dockerfile\'s', async (t) => {
  const f = await fixture(t);
  const dir = project();
  writeFileSync(join(dir, 'steps.yaml'), [
    'from: { image: agent-sandbox/base }',
    'steps:',
    '  - { type: COPY, args: [app, /srv/app/] }',
    '  - { type: ENV, args: [MODE, production] }',
    '  - { type: RUN, args: ["exit 4"] }',
    'startCmd: python3 /srv/app/main.py',
    '',
  ].join('\n'));
  const r = await f.asb(['template', 'build', 'from-yaml', '-f', 'steps.yaml'], dir);
  assert.equal(r.code, 1, r.stderr);
  const req = f.engine.requests[0] ?? assert.fail('the engine got no build');
  const expected = packSource(openContext(dir), 'app');
  t.after(() => expected.remove());
  assert.deepEqual(req.steps.map((s) => [s.type, s.args[0], s.filesHash]), [['COPY', 'app', expected.sha256], ['ENV', 'MODE', undefined], ['RUN', 'exit 4', undefined]]);
  assert.match(r.stderr, /#3 \[3\/3\] RUN exit 4\n/);
  assert.match(r.stderr, /ERROR: build of template from-yaml failed at step 3\/3 \(RUN exit 4\)/);
  const refused = await f.asb(['template', 'build', 'from-yaml', '-f', 'steps.yaml', '--build-arg', 'A=1'], dir);
  assert.equal(refused.code, 2, 'a usage error');
  assert.match(refused.stderr, /--build-arg applies to a Dockerfile, not to a steps file/);
});

test('the build routes: files by sha256, bad input named by field, and another team\'s builds and files answer 404', async (t) => {
  const f = await fixture(t);
  const { teamA, teamB } = f.fx.keys;
  const dir = project();
  const packed = packSource(openContext(dir), 'app');
  t.after(() => packed.remove());
  const tar = readFileSync(packed.path);
  const files = `/v1/templates/web/files/${packed.sha256}`;

  assert.equal((await f.api('GET', files, { key: teamA })).status, 404, 'not uploaded yet');
  const wrong = await f.api('PUT', `/v1/templates/web/files/${'0'.repeat(64)}`, { key: teamA, body: tar, headers: { 'content-type': 'application/x-tar' } });
  assert.equal(wrong.status, 400);
  assert.match((wrong.json as { detail: string }).detail, /not 0{64} as the path names; nothing was stored/);
  assert.equal((await f.api('PUT', files, { key: teamA, body: tar, headers: { 'content-type': 'application/x-tar' } })).status, 201);
  assert.equal((await f.api('PUT', files, { key: teamA, body: tar, headers: { 'content-type': 'application/x-tar' } })).status, 200, 'already there');
  assert.equal((await f.api('GET', files, { key: teamA })).status, 200);
  assert.equal((await f.api('GET', files, { key: teamB })).status, 404, 'files are the team\'s');
  assert.equal((await f.api('GET', '/v1/templates/Not_A_Name/files/' + packed.sha256, { key: teamA })).status, 400);

  const bad = await f.api('POST', '/v1/templates/web/builds', { key: teamA, json: { from: { image: 'agent-sandbox/base' }, steps: [{ type: 'APT', args: ['vim'] }, { type: 'COPY', args: ['app', '/app/'], filesHash: 'f'.repeat(64) }] } });
  assert.equal(bad.status, 422);
  assert.deepEqual((bad.json as { fields: { field: string }[] }).fields.map((x) => x.field), ['steps[0].type', 'steps[1].filesHash']);
  const copyB = await f.api('POST', '/v1/templates/web/builds', { key: teamB, json: { from: { image: 'agent-sandbox/base' }, steps: [{ type: 'COPY', args: ['app', '/app/'], filesHash: packed.sha256 }] } });
  assert.equal(copyB.status, 422, 'team-b cannot build with team-a\'s upload');
  assert.equal(f.engine.requests.length, 0, 'nothing ran');

  const started = await f.api('POST', '/v1/templates/web/builds', { key: teamA, json: { from: { image: 'agent-sandbox/base' }, steps: [{ type: 'COPY', args: ['app', '/app/'], filesHash: packed.sha256 }], startCmd: 'python3 /app/main.py' } });
  assert.equal(started.status, 202, started.text);
  const { buildId } = started.json as { buildId: string };
  let logs: { entries: { message: string }[]; offset: number; phase: string } = { entries: [], offset: 0, phase: 'waiting' };
  for (let i = 0; i < 100 && logs.phase !== 'ready' && logs.phase !== 'error'; i++) {
    logs = (await f.api('GET', `/v1/templates/web/builds/${buildId}/logs?offset=0`, { key: teamA })).json as typeof logs;
    await new Promise((r) => setImmediate(r));
  }
  assert.equal(logs.phase, 'ready', JSON.stringify(logs));
  assert.ok(logs.entries.some((e) => e.message.includes('COPY app /app/')), JSON.stringify(logs.entries));
  const tail = (await f.api('GET', `/v1/templates/web/builds/${buildId}/logs?offset=${String(logs.offset)}`, { key: teamA })).json as typeof logs;
  assert.deepEqual([tail.entries, tail.offset], [[], logs.offset], 'from the offset given on: nothing new once ended');
  assert.equal(((await f.api('GET', `/v1/templates/web/builds/${buildId}`, { key: teamA })).json as { phase: string }).phase, 'ready');
  assert.equal((await f.api('GET', `/v1/templates/web/builds/${buildId}`, { key: teamB })).status, 404, 'another team: as if absent');
  assert.equal((await f.api('GET', `/v1/templates/web/builds/${buildId}/logs`, { key: teamB })).status, 404);
  assert.equal((await f.api('GET', `/v1/templates/web/builds/${buildId}/logs?offset=-1`, { key: teamA })).status, 400);
});

test('a worker without a build service answers the build routes 501', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const res = await call(fx, 'POST', '/v1/templates/web/builds', { key: fx.keys.teamA, json: { from: { image: 'x' } } });
  checker.check('POST', '/v1/templates/web/builds', res);
  assert.equal(res.status, 501);
  assert.match((res.json as { detail: string }).detail, /template builds are not enabled on this worker/);
});

test('asb template build NAME:TAG pins the build: create --template NAME:TAG starts it after a newer build, and template ls shows the team\'s built templates with their tags', async (t) => {
  const f = await fixture(t);
  const dir = emptyDir();
  writeFileSync(join(dir, 'Dockerfile'), 'FROM agent-sandbox/base\nRUN echo one > /version\n');
  const v1 = await f.asb(['template', 'build', 'tagged:v1', '.'], dir);
  assert.equal(v1.code, 0, v1.stderr);
  assert.match(v1.stderr, /asb create --template tagged:v1/);
  writeFileSync(join(dir, 'Dockerfile'), 'FROM agent-sandbox/base\nRUN echo two > /version\n');
  const v2 = await f.asb(['template', 'build', 'tagged:v2', '.'], dir);
  assert.equal(v2.code, 0, v2.stderr);
  const [id1, id2] = [v1, v2].map((r) => /=> build (\S+)/.exec(r.stderr)?.[1] ?? assert.fail(r.stderr));
  const templateId = f.builds().find('team-a', 'tagged')?.templateId ?? assert.fail('no template');
  const imageOf = (buildId: string): string => f.builds().status('team-a', templateId, buildId)?.image ?? assert.fail('no image');

  /** The image of the sandbox `asb create --template T` starts. */
  const created = async (template: string): Promise<string> => {
    const r = await f.asb(['create', '--template', template, '--json'], dir);
    assert.equal(r.code, 0, r.stderr);
    const id = (JSON.parse(r.stdout) as { id: string }).id;
    const res = await f.api('GET', `/v1/sandboxes/${id}`, { key: f.fx.keys.teamA });
    assert.equal((res.json as { template: string }).template, f.builds().templateObjectFor('team-a', template));
    const sbx = await f.fx.store.get<Sandbox>(SandboxType, 'default', id);
    return sbx.spec.podTemplate.spec.containers[0]?.image ?? '';
  };
  assert.equal(await created('tagged:v1'), imageOf(id1 ?? ''));
  assert.equal(await created('tagged:v2'), imageOf(id2 ?? ''));
  assert.equal(await created('tagged'), imageOf(id2 ?? ''));
  const missing = await f.asb(['create', '--template', 'tagged:v3'], dir);
  assert.equal(missing.code, 1);
  assert.match(missing.stderr, /no template of your team named "tagged" has the tag "v3"/);

  // template ls: the team's built templates, each with its tags grouped by the build they name.
  const ls = await f.asb(['template', 'ls'], dir);
  assert.equal(ls.code, 0, ls.stderr);
  const [header, row, more] = ls.stdout.trimEnd().split('\n');
  assert.match(header ?? '', /^NAME\s+ID\s+TAGS\s+LATEST BUILD\s+STATUS\s+UPDATED$/);
  assert.match(row ?? '', new RegExp(`^tagged\\s+${templateId}\\s+default,v2=${(id2 ?? '').slice(0, 8)} v1=${(id1 ?? '').slice(0, 8)}\\s+${(id2 ?? '').slice(0, 8)}\\s+ready\\s+\\d+s$`));
  assert.equal(more, undefined, 'one template, and no hub configured: no hub part');
  const json = await f.asb(['template', 'ls', '--json'], dir);
  assert.equal(json.code, 0, json.stderr);
  const body = JSON.parse(json.stdout) as { built: { name: string; templateId: string; tags: Record<string, string>; latestBuild: { buildId: string; phase: string }; status: string }[]; items?: unknown };
  assert.equal(body.items, undefined);
  assert.deepEqual(body.built.map((b) => [b.name, b.templateId, b.tags, b.latestBuild.buildId, b.latestBuild.phase, b.status]), [['tagged', templateId, { default: id2, v1: id1, v2: id2 }, id2, 'ready', 'ready']]);
  const listed = await f.api('GET', '/v1/built-templates', { key: f.fx.keys.teamA });
  assert.equal((listed.json as { items: unknown[] }).items.length, 1);
  // Another team sees none of it.
  const other = await f.asb(['template', 'ls'], dir, f.fx.keys.teamB);
  assert.equal(other.code, 0, other.stderr);
  assert.equal(other.stdout, 'No templates built by your team.\n');
  assert.deepEqual((await f.api('GET', '/v1/built-templates', { key: f.fx.keys.teamB })).json, { items: [] });
  const denied = await f.asb(['create', '--template', 'tagged:v1'], dir, f.fx.keys.teamB);
  assert.equal(denied.code, 1);
});

test('a build carries its own egress allow-list within the worker\'s --build-egress (asb template build --egress, REST egress); one that would widen it is 403 naming the entry and the rule, and leaves no template', async (t) => {
  const f = await fixture(t, parseEgressText('203.0.113.0/24,*.debian.org', 'build egress'));
  const dir = emptyDir();
  writeFileSync(join(dir, 'Dockerfile'), 'FROM agent-sandbox/base\nRUN apt-get update\n');
  const narrow = await f.asb(['template', 'build', 'narrow', '--egress', '203.0.113.7,deb.debian.org', '.'], dir);
  assert.equal(narrow.code, 0, narrow.stderr);
  assert.deepEqual(f.engine.requests[0]?.egress, { internet: false, allow: ['203.0.113.7', 'deb.debian.org'], deny: [] }, 'the engine runs the build under the narrower policy');
  const none = await f.asb(['template', 'build', 'offline', '--egress', 'none', '.'], dir);
  assert.equal(none.code, 0, none.stderr);
  assert.deepEqual(f.engine.requests[1]?.egress, { internet: false, allow: [], deny: [] });
  const plain = await f.asb(['template', 'build', 'plain', '.'], dir);
  assert.equal(plain.code, 0, plain.stderr);
  assert.deepEqual(f.engine.requests[2]?.egress, { internet: false, allow: ['203.0.113.0/24', '*.debian.org'], deny: [] }, 'no --egress: the worker\'s');

  const wide = await f.asb(['template', 'build', 'wide', '--egress', '198.51.100.0/24', '.'], dir);
  assert.equal(wide.code, 1);
  assert.match(wide.stderr, /"198\.51\.100\.0\/24" is not allowed by this worker's --build-egress \(rule default-no-internet\)/);
  const open = await f.api('POST', '/v1/templates/open/builds', { key: f.fx.keys.teamA, json: { from: { image: 'agent-sandbox/base' }, steps: [{ type: 'RUN', args: ['true'] }], egress: { internet: true } } });
  assert.equal(open.status, 403, open.text);
  assert.match(open.text, /egress\.internet: the internet is closed to builds on this worker \(rule default-no-internet/);
  const bad = await f.api('POST', '/v1/templates/bad/builds', { key: f.fx.keys.teamA, json: { from: { image: 'agent-sandbox/base' }, egress: 'not a host!' } });
  assert.equal(bad.status, 422, bad.text);
  assert.match(bad.text, /egress\.allow\[0\]/);
  assert.equal(f.engine.requests.length, 3, 'a refused build runs nothing');
  assert.deepEqual(f.builds().list('team-a').map((r) => r.name).sort(), ['narrow', 'offline', 'plain'], 'and leaves no template');
});
