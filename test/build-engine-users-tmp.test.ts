// What a build makes does not depend on where it ran, and who a USER step names is who runs: real
// runc and gVisor build sandboxes, the tests' registry for debian:12, a registry of this file's own.
// - USER name:group, uid:gid and name: RUN steps and the template's sandboxes get the gid, and for
//   a bare name the supplementary groups /etc/group lists it in (as Docker); an unknown user or
//   group fails its USER step.
// - /tmp: what a RUN step leaves there is in the image under gVisor as under runc (gVisor binds a
//   directory of the pod's disk over /tmp; the layer reads it).
// - The egress policy a RUN step ran under is in its cache key.
// Its own bridge and subnet: asbbg0, 10.208.0.0/16.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { gunzipSync } from 'node:zlib';
import { after, before, test } from 'node:test';
import { NO_EGRESS } from '../src/builds/build-egress.ts';
import type { BuildLogEntry, BuildStep, EngineResult } from '../src/builds/contract.ts';
import { isAsbError } from '../src/errors.ts';
import { request, startBuildFixture, type BuildFixture, inSandbox as inSandboxOf } from './support/build-fixture.ts';

let f: BuildFixture;

before(async () => {
  f = await startBuildFixture('asb-bg-', 'asbbg0', '10.208.0.0/16');
});

after(() => f.close());

type Log = Omit<BuildLogEntry, 'timestamp'>[];

const inSandbox = (image: string, script: string, runtimeClassName?: string): Promise<string> => inSandboxOf(f, image, script, runtimeClassName);

/** What a step printed, one line per log entry. */
function output(log: Log, step: number): string[] {
  return log.filter((e) => e.step === step && !/^(RUN|USER|CACHED) /.test(e.message)).map((e) => e.message);
}

/** The names in the image's layers after the base's (one layer), with owner and mode, sorted. */
async function layerEntries(result: EngineResult, repository: string): Promise<string[]> {
  const digest = result.image.split('@')[1] ?? '';
  const accept = { accept: 'application/vnd.oci.image.manifest.v1+json' };
  const manifest = await (await fetch(`http://${f.registry.address}/v2/${repository}/manifests/${digest}`, { headers: accept })).json() as { layers: { digest: string }[] };
  const out: string[] = [];
  for (const layer of manifest.layers.slice(1)) {
    const tar = gunzipSync(Buffer.from(await (await fetch(`http://${f.registry.address}/v2/${repository}/blobs/${layer.digest}`)).arrayBuffer()));
    for (const line of execFileSync('tar', ['-tv', '--numeric-owner'], { input: tar }).toString().trim().split('\n')) {
      const [mode = '', owner = ''] = line.split(/\s+/);
      out.push(`${line.slice(line.lastIndexOf(' ') + 1)} ${mode} ${owner}`);
    }
  }
  return out.sort();
}

const USERS = 'groupadd -g 2001 devs && groupadd -g 2002 extra && groupadd -g 2003 other && useradd -m -u 1600 -U -G extra,devs app';

test('USER name:group, uid:gid and a bare name: RUN steps get the group, and a bare name the groups /etc/group lists it in; so does the template\'s sandbox', async () => {
  const log: Log = [];
  const steps: BuildStep[] = [
    { type: 'RUN', args: [USERS] },
    { type: 'USER', args: ['app:devs'] },
    { type: 'RUN', args: ['id -u; id -g; id -G; touch /tmp/by-app-devs && stat -c %u:%g /tmp/by-app-devs'] },
    { type: 'USER', args: ['1600:2003'] },
    { type: 'RUN', args: ['id -u; id -g; id -G'] },
    { type: 'USER', args: ['app'] },
    { type: 'RUN', args: ['id -u; id -g; id -G'] },
    { type: 'COPY', args: ['f.txt', '/srv/owned/', '', ''], filesHash: f.files.add('team-a', { 'f.txt': 'x\n' }) },
  ];
  const result = await f.engine.build(request(f, { steps, repository: 'builds/team-a/users' }, log));
  assert.deepEqual(output(log, 3), ['1600', '2001', '2001', '1600:2001'], 'app:devs: the group devs, no supplementary groups');
  assert.deepEqual(output(log, 5), ['1600', '2003', '2003'], 'uid:gid');
  assert.deepEqual(output(log, 7), ['1600', '1600', '1600 2001 2002'], 'a bare name: its own group and the groups listing it');
  assert.equal(result.config.user, 'app');
  assert.equal(await inSandbox(result.image, 'id -u; id -g; id -G; stat -c %u:%g /srv/owned/f.txt'), '1600\n1600\n1600 2001 2002\n1600:1600\n', 'the sandbox\'s default user has the same groups; a COPY as the USER gives its files the user\'s group');
  const grouped = await f.engine.build(request(f, { steps: [...steps.slice(0, 1), { type: 'USER', args: ['app:other'] }], repository: 'builds/team-a/users', tag: 'v2' }));
  assert.equal(await inSandbox(grouped.image, 'id -u; id -g; id -G'), '1600\n2003\n2003\n', 'USER name:group as the sandbox\'s default user: that group only');
});

test('USER naming a user or group the image lacks fails that step, naming it', async () => {
  for (const [user, message] of [['ghost', /step 2 \(USER\): USER "ghost": no user "ghost" in the image's \/etc\/passwd/], ['root:nosuchgroup', /step 2 \(USER\): USER "root:nosuchgroup": no group "nosuchgroup" in the image's \/etc\/group/]] as const) {
    await assert.rejects(f.engine.build(request(f, { steps: [{ type: 'RUN', args: ['true'] }, { type: 'USER', args: [user] }, { type: 'ENV', args: ['A', '1'] }], repository: 'builds/team-a/bad-user' })), (err: unknown) => {
      assert.ok(isAsbError(err, 'BuildFailed'), String(err));
      assert.match(err.message, message);
      return true;
    });
  }
});

test('what a RUN step leaves in /tmp is in the image under gVisor as under runc: the same layers, and a sandbox of either finds it', async () => {
  const steps: BuildStep[] = [
    { type: 'RUN', args: ['mkdir -p /tmp/keep && echo kept > /tmp/keep/f && echo gone > /tmp/gone && useradd -u 1700 tmpuser && install -o 1700 -m 0600 /dev/null /tmp/keep/owned'] },
    { type: 'RUN', args: ['rm /tmp/gone && echo second > /tmp/second'] },
  ];
  // noCache: the runtime class is not in the cache key (the layers are the same), so a cached runc layer would serve gVisor's build.
  const runc = await f.engine.build(request(f, { steps, repository: 'builds/team-a/tmp-runc', noCache: true }));
  const gvisor = await f.engine.build(request(f, { steps, repository: 'builds/team-a/tmp-gvisor', runtimeClassName: 'gvisor', noCache: true }));
  const tmpEntries = async (r: EngineResult, repo: string): Promise<string[]> => (await layerEntries(r, repo)).filter((e) => e.startsWith('tmp/'));
  const fromGvisor = await tmpEntries(gvisor, 'builds/team-a/tmp-gvisor');
  assert.ok(fromGvisor.includes('tmp/keep/f -rw-r--r-- 0/0'), fromGvisor.join('\n'));
  assert.ok(fromGvisor.includes('tmp/keep/owned -rw------- 1700/0'), fromGvisor.join('\n'));
  assert.ok(fromGvisor.includes('tmp/.wh.gone ---------- 0/0') || fromGvisor.some((e) => e.startsWith('tmp/.wh.gone ')), 'the second step\'s deletion is a whiteout');
  assert.deepEqual(fromGvisor, await tmpEntries(runc, 'builds/team-a/tmp-runc'), 'gVisor\'s layers hold what runc\'s do under /tmp');
  const check = 'cat /tmp/keep/f /tmp/second; stat -c %u /tmp/keep/owned; test -e /tmp/gone || echo no-gone';
  assert.equal(await inSandbox(gvisor.image, check), 'kept\nsecond\n1700\nno-gone\n', 'a runc sandbox of the gVisor-built image');
  assert.equal(await inSandbox(runc.image, check), 'kept\nsecond\n1700\nno-gone\n');
  assert.equal(await inSandbox(runc.image, `${check}; stat -c %a /tmp`, 'gvisor'), 'kept\nsecond\n1700\nno-gone\n1777\n', 'a gVisor sandbox finds the image\'s /tmp too');
});

test('a gVisor build going on from cached steps finds their /tmp and can delete from it, as under runc', async () => {
  const first: BuildStep[] = [{ type: 'RUN', args: ['mkdir -p /tmp/cached && echo from-cache > /tmp/cached/f && echo stays > /tmp/stays'] }];
  for (const runtimeClassName of [undefined, 'gvisor']) {
    // The runtime in the command: the cache key has no runtime class, and this step must run on each.
    const next: BuildStep[] = [...first, { type: 'RUN', args: [`cat /tmp/cached/f && rm -r /tmp/cached # on ${runtimeClassName ?? 'runc'}`] }];
    const repository = `builds/team-a/tmp-cache-${runtimeClassName ?? 'runc'}`;
    await f.engine.build(request(f, { steps: first, repository, noCache: true, ...(runtimeClassName === undefined ? {} : { runtimeClassName }) }));
    const log: Log = [];
    const result = await f.engine.build(request(f, { steps: next, repository, tag: 'v2', ...(runtimeClassName === undefined ? {} : { runtimeClassName }) }, log));
    assert.equal(result.cachedSteps, 1);
    assert.deepEqual(output(log, 2), ['from-cache'], `${runtimeClassName ?? 'runc'}: the second step, in a sandbox of the first step's image, reads its /tmp`);
    assert.equal(await inSandbox(result.image, 'cat /tmp/stays; test -e /tmp/cached || echo deleted'), 'stays\ndeleted\n', `${runtimeClassName ?? 'runc'}: the deletion is in the image`);
  }
});

test('a RUN step built without network is not served from the cache to a build with the internet, nor the reverse', async () => {
  const steps: BuildStep[] = [{ type: 'RUN', args: ['echo fetched > /fetched'] }];
  const first: Log = [];
  await f.engine.build(request(f, { steps, repository: 'builds/team-a/net', egress: NO_EGRESS }, first));
  const open: Log = [];
  await f.engine.build(request(f, { steps, repository: 'builds/team-a/net', tag: 'v2' }, open));
  assert.ok(!open.some((e) => e.message.startsWith('CACHED')), `ran again with the internet: ${JSON.stringify(open)}`);
  const again: Log = [];
  await f.engine.build(request(f, { steps, repository: 'builds/team-a/net', tag: 'v3', egress: NO_EGRESS }, again));
  assert.ok(again.some((e) => e.step === 1 && e.message.startsWith('CACHED')), `the same policy again: cached: ${JSON.stringify(again)}`);
});
