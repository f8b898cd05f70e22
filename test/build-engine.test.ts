// The template build engine on the local runtime, end to end: real runc and gVisor sandboxes run
// the steps, the base images come from the tests' registry, the built images go to a registry of
// this file's own, and sandboxes start from them. Its own bridge and subnet (asbbe0, 10.240.0.0/16).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gunzipSync } from 'node:zlib';
import { after, before, test } from 'node:test';
import type { BuildLogEntry, BuildStep, EngineResult } from '../src/builds/contract.ts';
import { isAsbError } from '../src/errors.ts';
import { request, startBuildFixture, type BuildFixture, inSandbox as inSandboxOf } from './support/build-fixture.ts';

let f: BuildFixture;
let hash: string;

before(async () => {
  f = await startBuildFixture('asb-be-', 'asbbe0', '10.240.0.0/16');
  hash = f.files.add('team-a', { 'ctx/hello.txt': 'hello file\n', 'ctx/dir/inner.txt': 'inner\n' });
});

after(() => f.close());

type Log = Omit<BuildLogEntry, 'timestamp'>[];

function mainSteps(filesHash: string): BuildStep[] {
  return [
    // Root in a step may chown and add users (in the build sandbox's own user namespace).
    { type: 'RUN', args: ['echo ran-step-1; mkdir -p /opt/app && echo built > /opt/app/built.txt && rm /etc/debian_version && useradd -m -u 1500 builder && chown 1500:1500 /opt/app/built.txt'] },
    { type: 'COPY', args: ['ctx', '/opt/app/ctx', '', ''], filesHash },
    { type: 'ENV', args: ['GREETING', 'hello', 'PATH', '/opt/app/bin:$PATH'] },
    { type: 'WORKDIR', args: ['/opt/app/work'] },
    { type: 'USER', args: ['nobody'] },
    { type: 'RUN', args: ['echo "saw $GREETING in $(pwd) as $(id -u)"'] },
    { type: 'RUN', args: ['echo "$GREETING" > /opt/app/work/by-root.txt', 'root'] },
    { type: 'RUN', args: ['echo "home $HOME"; echo mine > $HOME/by-builder.txt', 'builder'] },
    // A COPY for a user lands where that user could not write (Docker's --chown): root copies, the user owns.
    { type: 'COPY', args: ['ctx/hello.txt', '/srv/for-builder/', 'builder', ''], filesHash },
  ];
}

const inSandbox = (image: string, script: string, runtimeClassName?: string): Promise<string> => inSandboxOf(f, image, script, runtimeClassName);

function buildPods(): string[] {
  return f.runtime.rt.list().filter((id) => id.startsWith('build-'));
}

async function tagExists(repository: string, tag: string): Promise<boolean> {
  const res = await fetch(`http://${f.registry.address}/v2/${repository}/manifests/${tag}`, { method: 'HEAD', headers: { accept: 'application/vnd.oci.image.manifest.v1+json' } });
  return res.ok;
}

/** The image's new layers (after the base's `skip`), decompressed. */
async function layersOf(result: EngineResult, repository: string, skip: number): Promise<Buffer[]> {
  const digest = result.image.split('@')[1] ?? '';
  const manifest = await (await fetch(`http://${f.registry.address}/v2/${repository}/manifests/${digest}`, { headers: { accept: 'application/vnd.oci.image.manifest.v1+json' } })).json() as { layers: { digest: string }[] };
  const out: Buffer[] = [];
  for (const layer of manifest.layers.slice(skip)) out.push(gunzipSync(Buffer.from(await (await fetch(`http://${f.registry.address}/v2/${repository}/blobs/${layer.digest}`)).arrayBuffer())));
  return out;
}

function listing(tar: Buffer): string {
  return execFileSync('tar', ['-tv', '--numeric-owner'], { input: tar }).toString();
}

let first: EngineResult;

test('a build of RUN, COPY, ENV, WORKDIR and USER gives an image a sandbox starts from with the files, env, workdir and user; a later RUN sees them; each step\'s output is logged', async () => {
  const log: Log = [];
  first = await f.engine.build(request(f, { steps: mainSteps(hash) }, log));
  assert.equal(first.cachedSteps, 0);
  assert.match(first.image, new RegExp(`^${f.registry.address}/builds/team-a/app@sha256:[a-f0-9]{64}$`));
  assert.deepEqual(first.config, { env: ['PATH=/opt/app/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'GREETING=hello'], workingDir: '/opt/app/work', user: 'nobody' });
  assert.ok(log.some((e) => e.step === 1 && e.message === 'ran-step-1'), JSON.stringify(log));
  assert.ok(log.some((e) => e.step === 6 && e.message === 'saw hello in /opt/app/work as 65534'), JSON.stringify(log));
  assert.ok(log.every((e) => e.level === 'info'));
  assert.deepEqual(buildPods(), [], 'the build sandbox is removed');
  assert.equal(await tagExists('builds/team-a/app', 'v1'), true);

  assert.ok(log.some((e) => e.step === 8 && e.message === 'home /home/builder'), JSON.stringify(log));
  const out = await inSandbox(first.image, 'cat /opt/app/built.txt /opt/app/ctx/hello.txt /opt/app/ctx/dir/inner.txt /opt/app/work/by-root.txt; echo "$GREETING $PATH"; pwd; id -u; test -e /etc/debian_version && echo still-there; stat -c %u /opt/app/work/by-root.txt; stat -c %u:%g /opt/app/built.txt /home/builder/by-builder.txt /srv/for-builder/hello.txt /srv/for-builder; id -u builder');
  // Owners are the container's ids in the image (not the build sandbox's host ids).
  assert.equal(out, 'built\nhello file\ninner\nhello\nhello /opt/app/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n/opt/app/work\n65534\n0\n1500:1500\n1500:1500\n1500:1500\n0:0\n1500\n');
});

test('the same build again is served from the cache, by this engine or a restarted one: no sandbox starts, every step says CACHED, and the image is the same digest', async () => {
  const startsBefore = f.starts();
  const log: Log = [];
  const again = await f.engine.build(request(f, { steps: mainSteps(hash) }, log));
  assert.equal(again.cachedSteps, 9);
  assert.equal(again.image, first.image);
  assert.equal(f.starts(), startsBefore, 'no sandbox was started');
  assert.deepEqual(log.map((e) => [e.step, e.message.split(' ')[0]]), [1, 2, 3, 4, 5, 6, 7, 8, 9].map((s) => [s, 'CACHED']));
  // The cache is on disk, private to the worker, and a restarted worker's engine finds it.
  assert.equal(statSync(join(f.dir, 'engine', 'layer-cache')).mode & 0o777, 0o700);
  const restarted = await f.restartedEngine().build(request(f, { steps: mainSteps(hash) }));
  assert.deepEqual([restarted.cachedSteps, restarted.image, f.starts()], [9, first.image, startsBefore]);
});

test('changing step 2 reruns steps 2..n only, in a sandbox of the image of step 1; force and noCache rebuild from where they are', async () => {
  const other = f.files.add('team-a', { 'ctx/hello.txt': 'changed file\n', 'ctx/dir/inner.txt': 'inner\n' }, true); // gzip'ed, as the SDK may send it
  const log: Log = [];
  const changed = await f.engine.build(request(f, { steps: mainSteps(other), tag: 'v2' }, log));
  assert.equal(changed.cachedSteps, 1);
  assert.notEqual(changed.image, first.image);
  assert.ok(!log.some((e) => e.message === 'ran-step-1'), 'step 1 did not run again');
  assert.ok(log.some((e) => e.step === 6 && e.message === 'saw hello in /opt/app/work as 65534'));
  assert.equal(await inSandbox(changed.image, 'cat /opt/app/built.txt /opt/app/ctx/hello.txt; test -e /etc/debian_version || echo gone'), 'built\nchanged file\ngone\n');

  const forced = mainSteps(hash).map((s, i) => (i === 3 ? { ...s, force: true } : s));
  const forceLog: Log = [];
  assert.equal((await f.engine.build(request(f, { steps: forced, tag: 'v3' }, forceLog))).cachedSteps, 3);
  assert.ok(forceLog.some((e) => e.step === 6 && e.message.startsWith('saw hello')), 'the steps after the forced one ran');
  const noCacheLog: Log = [];
  assert.equal((await f.engine.build(request(f, { steps: mainSteps(hash), tag: 'v4', noCache: true }, noCacheLog))).cachedSteps, 0);
  assert.ok(noCacheLog.some((e) => e.message === 'ran-step-1'));
});

test('a failing RUN rejects with BuildFailed naming the step, its exit code and output; no tag, no build sandbox and no cache entry are left', async () => {
  const steps: BuildStep[] = [{ type: 'ENV', args: ['A', '1'] }, { type: 'RUN', args: ['echo oops-output; echo to-stderr >&2; exit 3'] }];
  await assert.rejects(f.engine.build(request(f, { steps, repository: 'builds/team-a/failing' })), (err) => {
    assert.ok(isAsbError(err, 'BuildFailed'), String(err));
    assert.match(err.message, /^step 2 \(RUN\) failed: its command exited with code 3/);
    assert.match(err.message, /oops-output/);
    assert.match(err.message, /to-stderr/);
    return true;
  });
  assert.equal(await tagExists('builds/team-a/failing', 'v1'), false);
  assert.deepEqual(buildPods(), []);
  const log: Log = [];
  await assert.rejects(f.engine.build(request(f, { steps, repository: 'builds/team-a/failing' }, log)), (err) => isAsbError(err, 'BuildFailed'));
  assert.deepEqual(log.filter((e) => e.message.startsWith('CACHED')).map((e) => e.step), [1], 'the failed step was not cached');
  assert.ok(log.some((e) => e.step === 2 && e.message === 'oops-output'));
  // A step that kills every process it can (the sandbox's own too) fails as its step.
  await assert.rejects(f.engine.build(request(f, { steps: [{ type: 'RUN', args: ['kill -9 -1; sleep 1'] }], repository: 'builds/team-a/failing', noCache: true })), (err) => isAsbError(err, 'BuildFailed') && /^step 1 \(RUN\) (failed: it )?ended the build sandbox/.test(err.message));
  assert.deepEqual(buildPods(), []);
  assert.equal(await tagExists('builds/team-a/failing', 'v1'), false);
});

test('a deletion of a base-image directory\'s contents and a new directory in its place are whiteouts in the layer: the result holds only the new entries', async () => {
  const steps: BuildStep[] = [{ type: 'RUN', args: ['rm -rf /usr/share/doc /etc/apt && mkdir /usr/share/doc && echo new > /usr/share/doc/only.txt'] }];
  const result = await f.engine.build(request(f, { steps, repository: 'builds/team-a/whiteout' }));
  const [layer] = await layersOf(result, 'builds/team-a/whiteout', 1);
  const names = listing(layer ?? Buffer.alloc(0));
  assert.match(names, /usr\/share\/doc\/\.wh\.\.wh\.\.opq/);
  assert.match(names, /etc\/\.wh\.apt/);
  assert.equal(await inSandbox(result.image, 'ls -A /usr/share/doc; test -e /etc/apt || echo no-apt'), 'only.txt\nno-apt\n');
});

test('one team never gets another team\'s cached layers', async () => {
  f.files.share('team-a', hash, 'team-b');
  const log: Log = [];
  const b = await f.engine.build(request(f, { team: 'team-b', steps: mainSteps(hash), repository: 'builds/team-b/app' }, log));
  assert.equal(b.cachedSteps, 0);
  assert.ok(log.some((e) => e.message === 'ran-step-1'));
});

test('bad input is refused with BadRequest naming the step before anything runs', async () => {
  const startsBefore = f.starts();
  await assert.rejects(f.engine.build(request(f, { steps: [{ type: 'RUN', args: ['true'] }, { type: 'FROB' as 'RUN', args: [] }] })), (err) => isAsbError(err, 'BadRequest') && /step 2: unknown step type "FROB"/.test(err.message));
  await assert.rejects(f.engine.build(request(f, { steps: [{ type: 'COPY', args: ['a', '/a'], filesHash: 'f'.repeat(64) }] })), (err) => isAsbError(err, 'BadRequest') && /step 1: COPY files f{64} were never uploaded/.test(err.message));
  await assert.rejects(f.engine.build(request(f, { team: 'team-b', steps: [{ type: 'COPY', args: ['ctx', '/a'], filesHash: f.files.add('team-a', { 'x/y': 'z' }) }] })), (err) => isAsbError(err, 'BadRequest') && /never uploaded/.test(err.message), 'another team\'s upload is not this team\'s');
  await assert.rejects(f.engine.build(request(f, { steps: [{ type: 'ENV', args: ['ODD'] }] })), (err) => isAsbError(err, 'BadRequest') && /step 1: ENV takes/.test(err.message));
  assert.equal(f.starts(), startsBefore);
});

test('a step past the build\'s disk, memory or time limit, or a cancelled build, fails with BuildFailed naming the step and the limit, and leaves no sandbox and no tag', async () => {
  const cases: { steps: BuildStep[]; limits?: Record<string, number>; abortAfterMs?: number; want: RegExp }[] = [
    { steps: [{ type: 'ENV', args: ['A', '1'] }, { type: 'RUN', args: ['head -c 200000000 /dev/zero > /big'] }], limits: { diskBytes: 64 * 2 ** 20 }, want: /^step 2 \(RUN\) failed: it passed the build's disk limit of 64 MiB/ },
    { steps: [{ type: 'RUN', args: ['x=$(head -c 300000000 /dev/zero | tr "\\0" a); echo ${#x}'] }], limits: { memoryBytes: 64 * 2 ** 20 }, want: /^step 1 \(RUN\) failed: it was killed \(SIGKILL\), most likely for passing the build's memory limit of 64 MiB/ },
    { steps: [{ type: 'RUN', args: ['true'] }, { type: 'RUN', args: ['sleep 60'] }], limits: { timeoutMs: 15_000 }, want: /^step 2 \(RUN\): the build passed its time limit of 15 s/ },
    { steps: [{ type: 'RUN', args: ['sleep 60'] }], abortAfterMs: 6000, want: /^step 1 \(RUN\): the build was cancelled/ },
  ];
  for (const [i, c] of cases.entries()) {
    const controller = new AbortController();
    const timer = c.abortAfterMs === undefined ? undefined : setTimeout(() => controller.abort(), c.abortAfterMs);
    const repository = `builds/team-a/limits${String(i)}`;
    await assert.rejects(f.engine.build(request(f, { steps: c.steps, repository, noCache: true, signal: controller.signal, ...(c.limits === undefined ? {} : { limits: c.limits }) })), (err) => {
      assert.ok(isAsbError(err, 'BuildFailed'), String(err));
      assert.match(err.message, c.want);
      return true;
    });
    clearTimeout(timer);
    assert.deepEqual(buildPods(), [], `case ${String(i)}: no build sandbox left`);
    assert.equal(await tagExists(repository, 'v1'), false);
  }
});

test('a hostile RUN step (symlinks to host files, a directory swapped for a link while the layer is read, a FIFO, hardlinks, setuid) makes the host neither read nor write a host file', async () => {
  const token = randomBytes(16).toString('hex');
  const canary = `/tmp/asb-be-canary-${token.slice(0, 8)}`;
  writeFileSync(canary, `host secret ${token}\n`);
  try {
    const script = [
      `ln -s ${canary} /opt/canary-link`, 'ln -s /etc/shadow /opt/shadow-link', 'ln -s / /opt/root-link', 'mkfifo /opt/fifo',
      'cp /bin/true /opt/suid && chmod 4755 /opt/suid && ln /opt/suid /opt/suid-hard',
      'mkdir -p /opt/flip',
      // Swaps a directory for a link to the host's /tmp while the engine may be reading it (bounded: 20,000 turns).
      `(i=0; while [ $i -lt 20000 ]; do rm -rf /opt/flip; ln -s /tmp /opt/flip; rm -f /opt/flip; mkdir /opt/flip; echo x > /opt/flip/f; i=$((i+1)); done) >/dev/null 2>&1 &`,
      'sleep 0.5',
    ].join('\n');
    const result = await f.engine.build(request(f, { steps: [{ type: 'RUN', args: [script] }, { type: 'ENV', args: ['B', '2'] }], repository: 'builds/team-a/hostile', noCache: true }));
    const layers = await layersOf(result, 'builds/team-a/hostile', 1);
    const all = Buffer.concat(layers);
    assert.ok(!all.includes(token), 'no host content in the layer');
    const names = listing(layers[0] ?? Buffer.alloc(0));
    assert.match(names, new RegExp(`^l.* opt/canary-link -> ${canary}$`, 'm'));
    assert.match(names, /^l.* opt\/shadow-link -> \/etc\/shadow$/m);
    assert.match(names, /^p.* opt\/fifo$/m);
    assert.match(names, /^-rwsr-xr-x 0\/0 .* opt\/suid$/m);
    assert.match(names, /^h.* opt\/suid-hard link to opt\/suid$/m);
    for (const line of names.split('\n')) assert.ok(!/ opt\/flip\/(?!f$|$)/.test(line), `only the sandbox's own file under the swapped dir: ${line}`);
    assert.equal(readFileSync(canary, 'utf8'), `host secret ${token}\n`, 'the host file is unchanged');
    assert.equal(await inSandbox(result.image, `cat /opt/canary-link 2>&1 | grep -c ${token}; readlink /opt/shadow-link`), '0\n/etc/shadow\n');
  } finally {
    rmSync(canary, { force: true });
  }
});

test('on gVisor: the build runs under runsc and a gVisor sandbox starts from its image', async () => {
  const log: Log = [];
  const steps: BuildStep[] = [
    // gVisor's own kernel names itself (4.19.0-gvisor here), whatever the host's is.
    { type: 'RUN', args: ['uname -r'] },
    { type: 'COPY', args: ['ctx/hello.txt', '/opt/hello.txt', '', '0604'], filesHash: hash },
    { type: 'ENV', args: ['WHERE', 'gvisor'] },
  ];
  const result = await f.engine.build(request(f, { steps, repository: 'builds/team-a/gvisor', runtimeClassName: 'gvisor' }, log));
  assert.ok(log.some((e) => e.step === 1 && /gvisor/i.test(e.message)), `step 1 ran under gVisor: ${JSON.stringify(log)}`);
  assert.equal(await inSandbox(result.image, 'cat /opt/hello.txt; stat -c %a /opt/hello.txt; echo $WHERE', 'gvisor'), 'hello file\n604\ngvisor\n');
});
