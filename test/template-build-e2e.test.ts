// `asb template build` end to end, as a user runs it: a Dockerfile with FROM the local base image,
// ARG, ENV, WORKDIR, COPY of a context directory with a .dockerignore, USER, RUN and CMD is built by
// the real worker (build service, engine, runc build sandbox, local registry), then `asb create
// --template NAME` starts a sandbox from it whose files, env, cwd and user are the Dockerfile's. A
// rebuild is served from the cache; a refused instruction fails before anything is uploaded, naming
// its line; another team can neither read the build nor start the template. Every call goes
// through the edge (Envoy and the router), as a user's does. Its own bridge and subnet (asbbd01,
// 10.19.0.0/16).
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { startTestSystem, type TestSystem } from './support/local-system.ts';
import { emptyDir, runAsb, type RunResult } from './support/run-asb.ts';

let sys: TestSystem;
let context: string;
let buildId = '';

// The base image runs as `user`: the COPY, as in Docker, still writes as root (into the root-owned
// WORKDIR), and files it copies are root's.
const DOCKERFILE = `# A template the way a team writes one
FROM agent-sandbox/base
ARG GREETING=hello
ENV APP_GREETING=\${GREETING}-from-env PATH=/srv/app/bin:$PATH
WORKDIR /srv/app
COPY app/ ./
USER root
RUN echo "$GREETING at build" > built.txt && \\
    ls -d /srv/app
USER user
CMD echo "started as $(id -un)" > /tmp/cmd-ran
`;

function asb(args: string[], key: string, cwd = context): Promise<RunResult> {
  return runAsb(args, { cwd, env: { ASB_API_URL: sys.edgeUrl, ASB_API_KEY: key } });
}

before(async () => {
  sys = await startTestSystem('bd01', 19, 'local', 0, false, ['team-a', 'team-b']);
  context = emptyDir();
  mkdirSync(join(context, 'app/bin'), { recursive: true });
  writeFileSync(join(context, 'app/hello.txt'), 'hello from the context\n');
  writeFileSync(join(context, 'app/bin/greet'), '#!/bin/sh\necho "greet: $APP_GREETING"\n', { mode: 0o755 });
  writeFileSync(join(context, 'app/secret.env'), 'TOKEN=do-not-ship\n');
  writeFileSync(join(context, '.dockerignore'), '**/*.env\n');
  writeFileSync(join(context, 'Dockerfile'), DOCKERFILE);
});

after(async () => {
  await sys.cleanup();
});

const teamA = (): string => sys.teamKeys['team-a'] ?? '';
const teamB = (): string => sys.teamKeys['team-b'] ?? '';

test('asb template build runs the Dockerfile and a sandbox of the template has its files, env, workdir and user', async () => {
  const built = await asb(['template', 'build', 'web-app', '--build-arg', 'GREETING=bonjour', '.'], teamA());
  assert.equal(built.code, 0, built.stderr);
  assert.match(built.stderr, /\[\+\] Building template web-app from agent-sandbox\/base \(6 steps\)/);
  assert.match(built.stderr, /=> context app: .* uploaded/);
  assert.match(built.stderr, /#5 \[5\/6\] RUN echo "\$GREETING at build" > built\.txt && {5}ls -d \/srv\/app\n/, 'each step under its Dockerfile line');
  assert.match(built.stderr, /=> template web-app built/);
  assert.equal(built.stdout, 'web-app\n');
  buildId = /=> build (\S+)/.exec(built.stderr)?.[1] ?? '';

  const created = await asb(['create', '--template', 'web-app', '--json'], teamA());
  assert.equal(created.code, 0, created.stderr);
  const id = (JSON.parse(created.stdout) as { id: string }).id;
  const probe = await asb(['exec', id, '--', 'sh', '-c', 'cat hello.txt built.txt; echo "$APP_GREETING"; pwd; id -un; greet; ls; cat /tmp/cmd-ran; stat -c %U hello.txt'], teamA());
  assert.equal(probe.code, 0, probe.stderr);
  assert.deepEqual(probe.stdout.trim().split('\n'), [
    'hello from the context',
    'bonjour at build',
    'bonjour-from-env',
    '/srv/app',
    'user',
    'greet: bonjour-from-env',
    'bin',
    'built.txt',
    'hello.txt',
    'started as user',
    'root',
  ], 'the .dockerignore kept secret.env out; ENV PATH kept the base image\'s PATH after /srv/app/bin');
});

test('a rebuild of the same Dockerfile and context is served from the cache', async () => {
  const again = await asb(['template', 'build', 'web-app', '--build-arg', 'GREETING=bonjour', '.'], teamA());
  assert.equal(again.code, 0, again.stderr);
  assert.match(again.stderr, /already uploaded/);
  assert.match(again.stderr, /CACHED/i);
});

test('a refused instruction fails before anything is uploaded or run, naming its line', async () => {
  const dir = emptyDir();
  writeFileSync(join(dir, 'Dockerfile'), 'FROM agent-sandbox/base\nRUN echo should-not-run\nVOLUME /data\n');
  const r = await asb(['template', 'build', 'refused', dir], teamA());
  assert.equal(r.code, 1);
  assert.match(r.stderr, /error: Dockerfile line 3: VOLUME is not supported/);
  assert.doesNotMatch(r.stderr, /Building template/, 'nothing started');
});

test('a failing RUN exits 1 with its step, Dockerfile line and output', async () => {
  const dir = emptyDir();
  writeFileSync(join(dir, 'Dockerfile'), 'FROM agent-sandbox/base\nENV A=1\nRUN echo about-to-fail && exit 3\n');
  const r = await asb(['template', 'build', 'fails', dir], teamA());
  assert.equal(r.code, 1, r.stderr);
  assert.match(r.stderr, /#2 about-to-fail/);
  assert.match(r.stderr, /ERROR: build of template fails failed at step 2\/2 \(Dockerfile line 3: RUN echo about-to-fail && exit 3\)/);
});

test('another team can neither read the build nor start a sandbox from the template', async () => {
  const denied = await asb(['create', '--template', 'web-app'], teamB());
  assert.equal(denied.code, 1);
  assert.match(denied.stderr, /template "web-app" not found/);
  const get = (key: string, path: string): Promise<Response> => fetch(`${sys.edgeUrl}/v1/templates/web-app/builds/${buildId}${path}`, { headers: { authorization: `Bearer ${key}` } });
  assert.equal((await get(teamA(), '')).status, 200, 'the owner reads it');
  assert.equal((await get(teamB(), '')).status, 404, 'another team: as if absent');
  assert.equal((await get(teamB(), '/logs')).status, 404);
});
