// The build service (src/builds/service.ts) and E2B's build API (src/worker/e2b/templates.ts) on
// a real worker API over the real store and operator, with the unmodified Python SDK building
// templates (test/python/test_e2b_build_api.py). The engine is a test engine that runs nothing
// (test/support/recording-engine.ts): these tests pin names, tenancy, uploads, bad input, logs,
// limits and restarts; test/e2b-builds.test.ts runs real builds and starts real sandboxes.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { LABEL, SandboxTemplateType, SandboxType, type Sandbox, type SandboxTemplate } from '../src/api/types.ts';
import { startBuildPod } from '../src/builds/build-pod.ts';
import { TeamFileStore } from '../src/builds/files.ts';
import { INTERRUPTED } from '../src/builds/records.ts';
import { TemplateBuilds } from '../src/builds/service.ts';
import { pinTags, TEMPLATE_NAME_LABEL, TEMPLATE_TAGS_ANNOTATION } from '../src/builds/template-object.ts';
import { E2B_USER_STEP } from '../src/worker/e2b/templates.ts';
import { systemClock } from '../src/base/clock.ts';
import { parseBuildEgress } from '../src/assembly/worker-config.ts';
import { silentLogger } from '../src/base/log.ts';
import { RecordingEngine, testBuildService, testBuildServiceOptions as serviceOptions } from './support/recording-engine.ts';
import { outcomes, runPytest, VENV_PYTHON } from './support/pytest.ts';
import { call, startWorkerFixture, type WorkerFixture } from './support/worker-fixture.ts';

const BASE_IMAGE = 'localhost:5000/agent-sandbox/base:latest';

const service = testBuildService;

async function fixture(t: { after: (fn: () => Promise<void>) => void }, engine = new RecordingEngine()): Promise<{ fx: WorkerFixture; engine: RecordingEngine; builds: () => TemplateBuilds }> {
  let made: TemplateBuilds | undefined;
  const fx = await startWorkerFixture((fn) => t.after(fn), {}, { builds: (store, dir) => (made = service(store, dir, engine)) });
  return { fx, engine, builds: () => made ?? assert.fail('no build service') };
}

/** Polls a build's status until it leaves waiting/building (bounded: 100 polls). */
async function finished(fx: WorkerFixture, key: string, templateId: string, buildId: string): Promise<Record<string, unknown>> {
  for (let i = 0; i < 100; i++) {
    const res = await call(fx, 'GET', `/templates/${templateId}/builds/${buildId}/status`, { key });
    assert.equal(res.status, 200, res.text);
    const body = res.json as Record<string, unknown>;
    if (body.status === 'ready' || body.status === 'error') return body;
    await new Promise((r) => setImmediate(r));
  }
  return assert.fail('the build did not finish');
}

async function requestBuild(fx: WorkerFixture, key: string, name: string): Promise<{ templateID: string; buildID: string }> {
  const res = await call(fx, 'POST', '/v3/templates', { key, json: { name, cpuCount: 1, memoryMB: 512 } });
  assert.equal(res.status, 202, res.text);
  return res.json as { templateID: string; buildID: string };
}

function tarOf(content: string): Uint8Array {
  const dir = mkdtempSync(join(tmpdir(), 'asb-tar-'));
  try {
    writeFileSync(join(dir, 'f.txt'), content);
    return new Uint8Array(execFileSync('tar', ['-cf', '-', '-C', dir, 'f.txt']));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('the unmodified Python SDK builds a template; the team starts it by name, another team cannot see, use or delete it', async (t) => {
  assert.ok(existsSync(VENV_PYTHON), `${VENV_PYTHON} is missing: make test installs e2b and pytest into .venv`);
  const { fx, engine } = await fixture(t);
  const env = { PATH: process.env.PATH, HOME: process.env.HOME, PYTHONDONTWRITEBYTECODE: '1', E2B_API_URL: fx.url, E2B_DOMAIN: 'asb.localhost', KEY_A: fx.keys.teamA, KEY_B: fx.keys.teamB, BASE_IMAGE };
  const run = await runPytest(join('test', 'python', 'test_e2b_build_api.py'), env, 120_000);
  assert.deepEqual(outcomes(run.output), { passed: 3 }, run.output);

  // The build of my-env: the image the engine made, the env, workdir, start and ready commands.
  const mine = await fx.store.list<SandboxTemplate>(SandboxTemplateType, { labelSelector: `${TEMPLATE_NAME_LABEL}=my-env,!asb.dev/template-pin` });
  assert.equal(mine.items.length, 1);
  // The tag the SDK assigned ("stable") pins its build: a SandboxTemplate of that build alone.
  const pins = await fx.store.list<SandboxTemplate>(SandboxTemplateType, { labelSelector: `${TEMPLATE_NAME_LABEL}=my-env,asb.dev/template-pin` });
  assert.equal(pins.items.length, 1);
  const tpl = mine.items[0] ?? assert.fail();
  assert.equal(tpl.metadata.labels?.[LABEL.owner], 'team-a');
  const main = tpl.spec.podTemplate.spec.containers[0] ?? assert.fail();
  assert.match(String(main.image), /^localhost:5000\/agent-sandbox\/base:latest@sha256:[0-9a-f]{64}$/);
  assert.ok(main.env?.some((e) => e.name === 'GREETING' && e.value === 'hi there'));
  assert.equal(main.workingDir, '/app');
  assert.deepEqual(main.command?.slice(0, 2), ['/bin/sh', '-c']);
  assert.match(main.command[2] ?? '', /echo started > \/tmp\/started; sleep infinity/);
  assert.deepEqual(main.readinessProbe?.exec?.command, ['/bin/sh', '-c', 'test -f /tmp/started']);
  assert.deepEqual(main.resources?.limits, { cpu: '2', memory: '1024Mi' });
  // The COPY reached the engine with its uploaded tar, readable through the FileStore.
  const copyReq = engine.requests.find((r) => r.steps.some((s) => s.type === 'COPY')) ?? assert.fail();
  const copy = copyReq.steps.find((s) => s.type === 'COPY') ?? assert.fail();
  // E2B's user `user` is made first (as root, when the image lacks it); the SDK's step 1 is the engine's 2.
  assert.deepEqual(copyReq.steps[0], E2B_USER_STEP);
  assert.equal(copyReq.steps[1], copy);
  assert.ok(copyReq.files.path('team-a', copy.filesHash ?? '') !== undefined);
  assert.equal(copyReq.files.path('team-b', copy.filesHash ?? ''), undefined, 'another team does not have the file');

  // Our API and E2B's create resolve the team's name; another team gets 404 by name and by id.
  const ours = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: { template: 'my-env' } });
  assert.equal(ours.status, 201, ours.text);
  const e2b = await call(fx, 'POST', '/sandboxes', { key: fx.keys.teamA, json: { templateID: 'my-env' } });
  assert.equal(e2b.status, 201, e2b.text);
  for (const template of ['my-env', tpl.metadata.name]) {
    const other = await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamB, json: { template } });
    assert.equal(other.status, 404, other.text);
    const otherE2b = await call(fx, 'POST', '/sandboxes', { key: fx.keys.teamB, json: { templateID: template } });
    assert.equal(otherE2b.status, 404, otherE2b.text);
  }
  const listedB = await call(fx, 'GET', '/v1/templates', { key: fx.keys.teamB });
  assert.deepEqual((listedB.json as { items: SandboxTemplate[] }).items.map((i) => i.metadata.name), ['base'], 'team B sees only the shared template');
  assert.equal((await call(fx, 'GET', `/v1/templates/${tpl.metadata.name}`, { key: fx.keys.teamB })).status, 404);
  assert.equal((await call(fx, 'GET', `/v1/templates/${tpl.metadata.name}`, { key: fx.keys.teamA })).status, 200);
  // Team B's list holds only its own request (the "stolen" build that could not start).
  const e2bListB = await call(fx, 'GET', '/templates', { key: fx.keys.teamB });
  assert.deepEqual((e2bListB.json as { names: string[]; buildStatus: string }[]).map((x) => [x.names[0], x.buildStatus]), [['stolen', 'waiting']]);
  // The Kubernetes API (kubectl) shows the same: team B lists only base and cannot get A's.
  const kubePath = '/apis/extensions.agents.x-k8s.io/v1alpha1/namespaces/default/sandboxtemplates';
  const kubeB = await call(fx, 'GET', kubePath, { key: fx.keys.teamB });
  assert.deepEqual((kubeB.json as { items: SandboxTemplate[] }).items.map((i) => i.metadata.name), ['base']);
  assert.equal((await call(fx, 'GET', `${kubePath}/${tpl.metadata.name}`, { key: fx.keys.teamB })).status, 404);
  assert.equal((await call(fx, 'GET', `${kubePath}/${tpl.metadata.name}`, { key: fx.keys.teamA })).status, 200);
  const e2bListA = await call(fx, 'GET', '/templates', { key: fx.keys.teamA });
  assert.deepEqual((e2bListA.json as { names: string[] }[]).map((x) => x.names[0]).sort(), ['failing', 'my-env', 'private-env']);
  assert.equal((await call(fx, 'GET', `/templates/${tpl.metadata.name}`, { key: fx.keys.teamB })).status, 404);
  assert.equal((await call(fx, 'GET', `/templates/${tpl.metadata.name}/files/${copy.filesHash ?? ''}`, { key: fx.keys.teamB })).status, 404);

  // Delete: another team's is a 404 that leaves it; the team's own removes the SandboxTemplate.
  assert.equal((await call(fx, 'DELETE', `/templates/${tpl.metadata.name}`, { key: fx.keys.teamB })).status, 404);
  assert.equal((await call(fx, 'DELETE', `/templates/${tpl.metadata.name}`, { key: fx.keys.teamA })).status, 204);
  assert.equal(await fx.store.tryGet(SandboxTemplateType, 'default', tpl.metadata.name), undefined);
  assert.equal((await call(fx, 'POST', '/v1/sandboxes', { key: fx.keys.teamA, json: { template: 'my-env' } })).status, 404);
});

test('bad build input is a 400 naming the step, and leaves the build waiting to be started right', async (t) => {
  const { fx } = await fixture(t);
  const key = fx.keys.teamA;
  const { templateID, buildID } = await requestBuild(fx, key, 'bad-input');
  const path = `/v2/templates/${templateID}/builds/${buildID}`;
  const cases: [unknown[], RegExp][] = [
    [[{ type: 'RUN', args: ['true'] }, { type: 'FROB', args: [] }], /step 2: unknown step type "FROB"/],
    [[{ type: 'COPY', args: ['a.txt', '/a.txt'], filesHash: 'a'.repeat(64) }], /step 1: COPY a\.txt: files hash a{64} was never uploaded/],
    [[{ type: 'ENV', args: ['ONLY_KEY'] }], /step 1: ENV takes \[key1, value1/],
    [[{ type: 'WORKDIR', args: [7] }], /step 1: WORKDIR args must be an array of strings/],
  ];
  for (const [steps, message] of cases) {
    const res = await call(fx, 'POST', path, { key, json: { fromImage: BASE_IMAGE, steps, force: false } });
    assert.equal(res.status, 400, res.text);
    assert.match((res.json as { message: string }).message, message);
    const status = await call(fx, 'GET', `/templates/${templateID}/builds/${buildID}/status`, { key });
    assert.equal((status.json as { status: string }).status, 'waiting');
  }
  const both = await call(fx, 'POST', path, { key, json: { fromImage: BASE_IMAGE, fromTemplate: 'base', steps: [] } });
  assert.equal(both.status, 400);
  const creds = await call(fx, 'POST', path, { key, json: { fromImage: BASE_IMAGE, fromImageRegistry: { type: 'registry', username: 'u', password: 'p' }, steps: [] } });
  assert.match((creds.json as { message: string }).message, /fromImageRegistry/);
  assert.equal((await call(fx, 'POST', '/v3/templates', { key, json: { name: 'Bad Name!' } })).status, 400);
  assert.equal((await call(fx, 'POST', '/v3/templates', { key, json: { name: 'ok', cpuCount: 0 } })).status, 400);
  // The same build, started right, runs.
  const ok = await call(fx, 'POST', path, { key, json: { fromImage: BASE_IMAGE, steps: [{ type: 'RUN', args: ['true'] }] } });
  assert.equal(ok.status, 202, ok.text);
  assert.equal((await finished(fx, key, templateID, buildID)).status, 'ready');
  assert.equal((await call(fx, 'POST', path, { key, json: { fromImage: BASE_IMAGE, steps: [] } })).status, 409, 'a build starts once');
  // Starting another team's build is a 404.
  assert.equal((await call(fx, 'POST', path, { key: fx.keys.teamB, json: { fromImage: BASE_IMAGE, steps: [] } })).status, 404);
});

test('uploads go only through a signed URL for that template and hash, and must be tars', async (t) => {
  const { fx, builds } = await fixture(t);
  const key = fx.keys.teamA;
  const { templateID } = await requestBuild(fx, key, 'uploads');
  const hash = 'b'.repeat(64);
  const link = await call(fx, 'GET', `/templates/${templateID}/files/${hash}`, { key });
  assert.equal(link.status, 201);
  const { present, url } = link.json as { present: boolean; url: string };
  assert.equal(present, false);
  const u = new URL(url);
  assert.equal(u.origin, fx.url);
  const put = (path: string, body: Uint8Array): Promise<Response> => fetch(fx.url + path, { method: 'PUT', body });
  assert.equal((await put(u.pathname, tarOf('x'))).status, 401, 'no token');
  assert.equal((await put(`/templates/${templateID}/files/${'c'.repeat(64)}${u.search}`, tarOf('x'))).status, 401, 'the token is for another hash');
  assert.equal((await put(`${u.pathname}?token=${encodeURIComponent('1.x')}`, tarOf('x'))).status, 401, 'a forged token');
  const notTar = await put(u.pathname + u.search, new TextEncoder().encode('not a tar'));
  assert.equal(notTar.status, 400);
  assert.equal(builds().files.has('team-a', hash), false, 'nothing kept of a refused upload');
  assert.equal((await put(u.pathname + u.search, tarOf('hello'))).status, 200);
  assert.equal(builds().files.has('team-a', hash), true);
  assert.equal(builds().files.has('team-b', hash), false);
  const again = await call(fx, 'GET', `/templates/${templateID}/files/${hash}`, { key });
  assert.deepEqual(again.json, { present: true });
  // The team's files go with its last template.
  assert.equal((await call(fx, 'DELETE', `/templates/${templateID}`, { key })).status, 204);
  assert.equal(builds().files.has('team-a', hash), false);
});

test('a failing step and a build past its time limit end as error naming why, and leave no template', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-builds-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const fx = await startWorkerFixture((fn) => t.after(fn), {}, { builds: (store) => service(store, dir, new RecordingEngine(), 200) });
  const key = fx.keys.teamA;
  const slow = await requestBuild(fx, key, 'slow');
  const res = await call(fx, 'POST', `/v2/templates/${slow.templateID}/builds/${slow.buildID}`, { key, json: { fromImage: BASE_IMAGE, steps: [{ type: 'RUN', args: ['sleep forever'] }] } });
  assert.equal(res.status, 202);
  let body: Record<string, unknown> = {};
  for (let i = 0; i < 50; i++) {
    body = (await call(fx, 'GET', `/templates/${slow.templateID}/builds/${slow.buildID}/status`, { key })).json as Record<string, unknown>;
    if (body.status === 'error') break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(body.status, 'error');
  assert.match((body.reason as { message: string }).message, /exceeded its time limit/);
  assert.equal(await fx.store.tryGet(SandboxTemplateType, 'default', slow.templateID), undefined);

  const failing = await requestBuild(fx, key, 'failing');
  await call(fx, 'POST', `/v2/templates/${failing.templateID}/builds/${failing.buildID}`, { key, json: { fromImage: BASE_IMAGE, steps: [{ type: 'RUN', args: ['true'] }, { type: 'RUN', args: ['exit 3'] }] } });
  const failed = await finished(fx, key, failing.templateID, failing.buildID);
  assert.deepEqual(failed.reason, { message: 'step 2: RUN exit 3 exited with 3', step: '2' });
  const entries = failed.logEntries as { message: string; step?: string }[];
  assert.ok(entries.some((e) => e.step === '2' && e.message.startsWith('Build failed')), JSON.stringify(entries));
  assert.equal(await fx.store.tryGet(SandboxTemplateType, 'default', failing.templateID), undefined);
  const logs = await call(fx, 'GET', `/templates/${failing.templateID}/builds/${failing.buildID}/logs`, { key });
  assert.ok((logs.json as { logs: { message: string }[] }).logs.some((e) => e.message.startsWith('step 1: the test engine ran')));
});

test('a build running when the worker stops ends as error "interrupted by a worker restart"; templates and logs survive the restart', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-builds-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const first = service(fx.store, dir, new RecordingEngine());
  const done = first.createTemplate('team-a', { name: 'kept' });
  await first.start('team-a', done.template.templateId, done.build.buildId, { from: { image: BASE_IMAGE }, steps: [{ type: 'RUN', args: ['true'] }] });
  for (let i = 0; i < 100 && first.status('team-a', done.template.templateId, done.build.buildId)?.phase !== 'ready'; i++) await new Promise((r) => setImmediate(r));
  const running = first.createTemplate('team-a', { name: 'running' });
  await first.start('team-a', running.template.templateId, running.build.buildId, { from: { image: BASE_IMAGE }, steps: [{ type: 'RUN', args: ['sleep forever'] }] });
  await first.close();

  const second = service(fx.store, dir, new RecordingEngine());
  assert.equal(second.status('team-a', done.template.templateId, done.build.buildId)?.phase, 'ready');
  assert.ok(second.logs('team-a', done.template.templateId, done.build.buildId, 0).some((e) => e.message.startsWith('step 1: the test engine ran')));
  const after = second.status('team-a', running.template.templateId, running.build.buildId);
  assert.deepEqual([after?.phase, after?.reason?.message], ['error', INTERRUPTED]);
  assert.equal(second.find('team-b', 'kept'), undefined);
  assert.equal(second.find('team-a', 'kept')?.templateId, done.template.templateId, 'the name still names the same template');
  // Records are private: 0700 directory.
  const mode = (await import('node:fs')).statSync(join(dir, 'builds', 'templates')).mode & 0o777;
  assert.equal(mode, 0o700);
  assert.ok(readdirSync(join(dir, 'builds', 'templates')).length >= 2);
  await second.close();
});

test('uploaded files unused for their age are swept; a build using one keeps it', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-files-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  let now = Date.now();
  const files = new TeamFileStore({ dir, maxAgeMs: 1000, now: () => now });
  const { Readable } = await import('node:stream');
  await files.put('team-a', 'e'.repeat(64), Readable.from([Buffer.from(tarOf('old'))]));
  await files.put('team-a', 'f'.repeat(64), Readable.from([Buffer.from(tarOf('used'))]));
  now += 5000;
  files.touch('team-a', 'f'.repeat(64));
  assert.equal(files.sweep(), 1);
  assert.equal(files.has('team-a', 'e'.repeat(64)), false);
  assert.equal(files.has('team-a', 'f'.repeat(64)), true);
  await assert.rejects(files.put('team-a', 'a'.repeat(64), Readable.from([Buffer.alloc(600_000)])), /not a tar/);
  const small = new TeamFileStore({ dir: join(dir, 'small'), maxBytes: 1024, now: () => now });
  await assert.rejects(small.put('team-a', 'a'.repeat(64), Readable.from([Buffer.from(tarOf('x'.repeat(4096)))])), /larger than 1024 bytes/);
  assert.equal(small.has('team-a', 'a'.repeat(64)), false);
});

test('tags pin builds: name:v1 starts v1\'s build after v2 is built, name and name:v2 start v2\'s; moving a tag moves what creates start; another team can use none of it', async (t) => {
  const { fx, builds, engine } = await fixture(t);
  const key = fx.keys.teamA;
  const built = async (name: string, marker: string): Promise<{ templateID: string; buildID: string; image: string }> => {
    const req = await requestBuild(fx, key, name);
    const res = await call(fx, 'POST', `/v2/templates/${req.templateID}/builds/${req.buildID}`, { key, json: { fromImage: BASE_IMAGE, steps: [{ type: 'RUN', args: [`echo ${marker} > /marker`] }] } });
    assert.equal(res.status, 202, res.text);
    // Bounded: 200 polls 10 ms apart (a build here writes two SandboxTemplates and a record).
    for (let i = 0; i < 200 && builds().status('team-a', req.templateID, req.buildID)?.phase === 'building'; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(builds().status('team-a', req.templateID, req.buildID)?.phase, 'ready');
    return { ...req, image: builds().status('team-a', req.templateID, req.buildID)?.image ?? assert.fail('no image') };
  };
  const v1 = await built('tagged:v1', 'one');
  const v2 = await built('tagged:v2', 'two');
  assert.equal(v1.templateID, v2.templateID, 'one template, two builds');
  assert.notEqual(v1.image, v2.image);
  /** The image of the sandbox a create of `template` starts, over our API and E2B's (undefined: the status when not 201). */
  const imageOf = async (template: string, as = key): Promise<string | number> => {
    const ours = await call(fx, 'POST', '/v1/sandboxes', { key: as, json: { template } });
    const e2b = await call(fx, 'POST', '/sandboxes', { key: as, json: { templateID: template } });
    if (ours.status !== 201 || e2b.status !== 201) {
      assert.equal(ours.status, e2b.status, `${ours.text} / ${e2b.text}`);
      return ours.status;
    }
    const images = await Promise.all([(ours.json as { id: string }).id, (e2b.json as { sandboxID: string }).sandboxID].map(async (id) => {
      const sbx = await fx.store.get<Sandbox>(SandboxType, 'default', id);
      return sbx.spec.podTemplate.spec.containers[0]?.image ?? '';
    }));
    assert.equal(images[0], images[1], `our API and E2B's start the same build of ${template}`);
    return images[0] ?? '';
  };
  assert.equal(await imageOf('tagged:v1'), v1.image);
  assert.equal(await imageOf('tagged:v2'), v2.image);
  assert.equal(await imageOf('tagged'), v2.image, 'the name alone is the newest build (default)');
  assert.equal(await imageOf('tagged:default'), v2.image);
  assert.equal(await imageOf(`${v1.templateID}:v1`), v1.image, 'the template id takes a tag too');
  // A build from the template `tagged:v1` builds on v1's image, from `tagged` on the default's.
  for (const [from, image] of [['tagged:v1', v1.image], ['tagged', v2.image]] as const) {
    const child = await requestBuild(fx, key, 'child');
    const res = await call(fx, 'POST', `/v2/templates/${child.templateID}/builds/${child.buildID}`, { key, json: { fromTemplate: from, steps: [] } });
    assert.equal(res.status, 202, res.text);
    assert.equal(engine.requests.at(-1)?.baseImage, image, from);
  }
  const unknown = await call(fx, 'POST', '/v1/sandboxes', { key, json: { template: 'tagged:v9' } });
  assert.equal(unknown.status, 404);
  assert.match(unknown.text, /has the tag \\"v9\\"/);
  assert.equal((await call(fx, 'POST', '/v1/sandboxes', { key, json: { template: 'tagged:bad tag' } })).status, 422);
  // Another team: 404 by name:tag, by the pinned object's name, and it lists none of them.
  const pin1 = `${v1.templateID}-${v1.buildID}`;
  for (const template of ['tagged:v1', 'tagged:v2', pin1]) assert.equal(await imageOf(template, fx.keys.teamB), 404, template);
  const listedB = await call(fx, 'GET', '/v1/templates', { key: fx.keys.teamB });
  assert.deepEqual((listedB.json as { items: SandboxTemplate[] }).items.map((i) => i.metadata.name), ['base']);
  assert.equal((await call(fx, 'POST', '/templates/tags', { key: fx.keys.teamB, json: { target: 'tagged:v2', tags: ['v1'] } })).status, 404);

  // E2B's assign moves v1 to the v2 build: creates of tagged:v1 start v2's, and v1's pin goes.
  const moved = await call(fx, 'POST', '/templates/tags', { key, json: { target: 'tagged:v2', tags: ['v1'] } });
  assert.equal(moved.status, 201, moved.text);
  assert.deepEqual(moved.json, { tags: ['v1'], buildID: v2.buildID });
  assert.equal(await imageOf('tagged:v1'), v2.image);
  assert.equal(await fx.store.tryGet(SandboxTemplateType, 'default', pin1), undefined, 'no tag names the v1 build: its SandboxTemplate is gone');
  // `default` moves what the name starts (a rollback), and back.
  const v3 = await built('tagged:v3', 'three');
  assert.equal(await imageOf('tagged'), v3.image);
  assert.equal((await call(fx, 'POST', '/templates/tags', { key, json: { target: 'tagged:v2', tags: ['default'] } })).status, 201);
  assert.equal(await imageOf('tagged'), v2.image);
  assert.equal(await imageOf('tagged:v3'), v3.image);
  // Removing a tag: it starts nothing; default cannot be removed.
  assert.equal((await call(fx, 'DELETE', '/templates/tags', { key, json: { name: 'tagged', tags: ['v3'] } })).status, 204);
  assert.equal(await imageOf('tagged:v3'), 404);
  assert.equal(await fx.store.tryGet(SandboxTemplateType, 'default', `${v3.templateID}-${v3.buildID}`), undefined);
  assert.equal((await call(fx, 'DELETE', '/templates/tags', { key, json: { name: 'tagged', tags: ['default'] } })).status, 400);
  const tags = await call(fx, 'GET', `/templates/${v1.templateID}/tags`, { key });
  assert.deepEqual(Object.fromEntries((tags.json as { tag: string; buildID: string }[]).map((x) => [x.tag, x.buildID])), { default: v2.buildID, v1: v2.buildID, v2: v2.buildID });

  // Deleting the template deletes its pins too.
  assert.equal((await call(fx, 'DELETE', `/templates/${v1.templateID}`, { key })).status, 204);
  const left = await fx.store.list<SandboxTemplate>(SandboxTemplateType, { labelSelector: `${TEMPLATE_NAME_LABEL}=tagged` });
  assert.deepEqual(left.items.map((i) => i.metadata.name), []);
});

test('the worker\'s build egress reaches the engine\'s request and the build sandbox\'s pod', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-builds-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const policy = parseBuildEgress('203.0.113.0/24', false, (p) => assert.fail(p));
  const engine = new RecordingEngine();
  const svc = new TemplateBuilds({ recordsDir: join(dir, 'records'), files: new TeamFileStore({ dir: join(dir, 'files'), now: () => Date.now() }), store: fx.store, engine, namespace: 'default', clusterTag: 'tst1', clock: systemClock, log: silentLogger(), egress: policy });
  t.after(() => svc.close());
  const { template, build } = svc.createTemplate('team-a', { name: 'walled' });
  await svc.start('team-a', template.templateId, build.buildId, { from: { image: BASE_IMAGE }, steps: [{ type: 'RUN', args: ['true'] }] });
  assert.deepEqual(engine.requests[0]?.egress, { internet: false, allow: ['203.0.113.0/24'], deny: [] });
  for (let i = 0; i < 200 && svc.status('team-a', template.templateId, build.buildId)?.phase === 'building'; i++) await new Promise((r) => setTimeout(r, 10));
  assert.equal(svc.status('team-a', template.templateId, build.buildId)?.phase, 'ready');
  // The engine's build sandbox is started with it: the runtime enforces it before the first step runs.
  const pod = await startBuildPod(fx.runtime, BASE_IMAGE, undefined, { cpu: 1, memoryBytes: 2 ** 28, diskBytes: 2 ** 30 }, policy);
  assert.deepEqual(fx.runtime.egress.get(pod), policy);
  const open = await startBuildPod(fx.runtime, BASE_IMAGE, undefined, { cpu: 1, memoryBytes: 2 ** 28, diskBytes: 2 ** 30 });
  assert.equal(fx.runtime.egress.get(open), undefined, 'no policy given: the runtime\'s default');
});

test('each pinned build names its tags through every build, assign and remove, and a cluster that did not build the template starts name:tag from the synced pins', async (t) => {
  const { fx, builds } = await fixture(t);
  const key = fx.keys.teamA;
  const built = async (name: string, marker: string): Promise<{ templateID: string; buildID: string }> => {
    const req = await requestBuild(fx, key, name);
    const res = await call(fx, 'POST', `/v2/templates/${req.templateID}/builds/${req.buildID}`, { key, json: { fromImage: BASE_IMAGE, steps: [{ type: 'RUN', args: [`echo ${marker} > /marker`] }] } });
    assert.equal(res.status, 202, res.text);
    for (let i = 0; i < 200 && builds().status('team-a', req.templateID, req.buildID)?.phase === 'building'; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(builds().status('team-a', req.templateID, req.buildID)?.phase, 'ready');
    return req;
  };
  /** Pin object name → the tags it carries. */
  const pinned = async (): Promise<Record<string, string[]>> => {
    const pins = await fx.store.list<SandboxTemplate>(SandboxTemplateType, { labelSelector: `${TEMPLATE_NAME_LABEL}=carried,asb.dev/template-pin` });
    return Object.fromEntries(pins.items.map((p) => [p.metadata.name, pinTags(p)]));
  };
  const v1 = await built('carried:v1', 'one');
  const pin1 = `${v1.templateID}-${v1.buildID}`;
  assert.deepEqual(await pinned(), { [pin1]: ['v1'] });
  assert.equal((await call(fx, 'POST', '/templates/tags', { key, json: { target: 'carried:v1', tags: ['stable'] } })).status, 201);
  assert.deepEqual(await pinned(), { [pin1]: ['stable', 'v1'] });
  const v2 = await built('carried:v2', 'two');
  const pin2 = `${v2.templateID}-${v2.buildID}`;
  assert.equal((await call(fx, 'POST', '/templates/tags', { key, json: { target: 'carried:v2', tags: ['v1'] } })).status, 201);
  assert.deepEqual(await pinned(), { [pin1]: ['stable'], [pin2]: ['v1', 'v2'] }, 'v1 moved: the old pin no longer names it');

  // Another cluster's worker: no build records of this template, only the objects the hub synced.
  const other = await startWorkerFixture((fn) => t.after(fn));
  const synced = await fx.store.list<SandboxTemplate>(SandboxTemplateType, { labelSelector: `${TEMPLATE_NAME_LABEL}=carried` });
  for (const obj of synced.items) {
    await other.store.create(SandboxTemplateType, { apiVersion: obj.apiVersion, kind: obj.kind, metadata: { name: obj.metadata.name, namespace: 'default', labels: obj.metadata.labels ?? {}, annotations: obj.metadata.annotations ?? {} }, spec: obj.spec });
  }
  const imageOfPin = (name: string): string => String(synced.items.find((o) => o.metadata.name === name)?.spec.podTemplate.spec.containers[0]?.image);
  const imageOn = async (template: string, as = other.keys.teamA): Promise<string | number> => {
    const res = await call(other, 'POST', '/v1/sandboxes', { key: as, json: { template } });
    if (res.status !== 201) return res.status;
    const sbx = await other.store.get<Sandbox>(SandboxType, 'default', (res.json as { id: string }).id);
    return sbx.spec.podTemplate.spec.containers[0]?.image ?? '';
  };
  assert.equal(await imageOn('carried:v1'), imageOfPin(pin2));
  assert.equal(await imageOn('carried:v2'), imageOfPin(pin2));
  assert.equal(await imageOn('carried:stable'), imageOfPin(pin1));
  assert.equal(await imageOn(`${v1.templateID}:stable`), imageOfPin(pin1), 'the template id takes a tag there too');
  assert.equal(await imageOn('carried:v9'), 404);
  assert.equal(await imageOn('carried:v1', other.keys.teamB), 404, 'another team');

  // Removing the last tag of a build removes its pin; the pins left name only their tags.
  assert.equal((await call(fx, 'DELETE', '/templates/tags', { key, json: { name: 'carried', tags: ['stable', 'v2'] } })).status, 204);
  assert.deepEqual(await pinned(), { [pin2]: ['v1'] });
});

test('pins made before they named their tags name them after a restart, so their tags travel too', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-builds-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const first = service(fx.store, dir, new RecordingEngine());
  const made = first.createTemplate('team-a', { name: 'older:v1' });
  await first.start('team-a', made.template.templateId, made.build.buildId, { from: { image: BASE_IMAGE }, steps: [{ type: 'RUN', args: ['true'] }] });
  for (let i = 0; i < 100 && first.status('team-a', made.template.templateId, made.build.buildId)?.phase !== 'ready'; i++) await new Promise((r) => setImmediate(r));
  await first.close();
  // The pin as an earlier version wrote it: no tags on it.
  const name = `${made.template.templateId}-${made.build.buildId}`;
  const pin = await fx.store.get<SandboxTemplate>(SandboxTemplateType, 'default', name);
  const { [TEMPLATE_TAGS_ANNOTATION]: _tags, ...rest } = pin.metadata.annotations ?? {};
  await fx.store.update(SandboxTemplateType, { ...pin, metadata: { ...pin.metadata, annotations: rest } });
  assert.deepEqual(pinTags(await fx.store.get<SandboxTemplate>(SandboxTemplateType, 'default', name)), []);

  let told = 0;
  const restart = async (): Promise<void> => {
    const builds = new TemplateBuilds({ ...serviceOptions(fx.store, dir, new RecordingEngine()), onTemplatesChanged: () => told++ });
    await builds.close();
  };
  await restart();
  assert.deepEqual(pinTags(await fx.store.get<SandboxTemplate>(SandboxTemplateType, 'default', name)), ['v1']);
  assert.equal(told, 1, 'the hub is sent the pins that changed');
  const version = (await fx.store.get<SandboxTemplate>(SandboxTemplateType, 'default', name)).metadata.resourceVersion;
  await restart();
  assert.equal(told, 1, 'a restart with every pin in step sends the hub nothing');
  assert.equal((await fx.store.get<SandboxTemplate>(SandboxTemplateType, 'default', name)).metadata.resourceVersion, version, 'and writes nothing');
});
