// Image references by Docker's rules, and where the worker pulls them from (mirrors, plain HTTP,
// credentials). Pure: no registry here; test/images.test.ts pulls for real.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isAsbError } from '../src/errors.ts';
import { familiarReference, formatReference, manifestSelector, parseImageReference } from '../src/images/reference.ts';
import { authFileJson, EMPTY_REGISTRIES, isLoopbackHost, parseRegistriesConfig, pullSources } from '../src/images/registries.ts';
import { chainIdOf, layoutTag } from '../src/images/image-store.ts';

const HEX = 'a'.repeat(64);

test('Docker names normalise as Docker does', () => {
  const cases: [string, string, string][] = [
    ['python:3.12', 'docker.io/library/python:3.12', 'python:3.12'],
    ['python', 'docker.io/library/python:latest', 'python:latest'],
    ['library/python', 'docker.io/library/python:latest', 'python:latest'],
    ['docker.io/library/python:3.12', 'docker.io/library/python:3.12', 'python:3.12'],
    ['index.docker.io/library/busybox', 'docker.io/library/busybox:latest', 'busybox:latest'],
    ['agent-sandbox/base', 'docker.io/agent-sandbox/base:latest', 'agent-sandbox/base:latest'],
    ['debian:12', 'docker.io/library/debian:12', 'debian:12'],
    [`ghcr.io/x/y:1@sha256:${HEX}`, `ghcr.io/x/y:1@sha256:${HEX}`, `ghcr.io/x/y:1@sha256:${HEX}`],
    [`busybox@sha256:${HEX}`, `docker.io/library/busybox@sha256:${HEX}`, `busybox@sha256:${HEX}`],
    ['localhost:5000/agent-sandbox/base:v1', 'localhost:5000/agent-sandbox/base:v1', 'localhost:5000/agent-sandbox/base:v1'],
    ['localhost/x', 'localhost/x:latest', 'localhost/x:latest'],
    ['127.0.0.1:5000/a/b/c:t_1.2-3', '127.0.0.1:5000/a/b/c:t_1.2-3', '127.0.0.1:5000/a/b/c:t_1.2-3'],
    ['[::1]:5000/x:1', '[::1]:5000/x:1', '[::1]:5000/x:1'],
    ['quay.io/acme/private-thing:9', 'quay.io/acme/private-thing:9', 'quay.io/acme/private-thing:9'],
    ['my_org/my__repo-x.y', 'docker.io/my_org/my__repo-x.y:latest', 'my_org/my__repo-x.y:latest'],
  ];
  for (const [input, full, familiar] of cases) {
    const ref = parseImageReference(input);
    assert.equal(formatReference(ref), full, input);
    assert.equal(familiarReference(ref), familiar, input);
  }
  const pinned = parseImageReference(`ghcr.io/x/y:1@sha256:${HEX}`);
  assert.deepEqual({ ...pinned }, { registry: 'ghcr.io', repository: 'x/y', tag: '1', digest: `sha256:${HEX}` });
  // A pinned image is fetched by its digest; the tag only names it.
  assert.equal(manifestSelector(pinned), `sha256:${HEX}`);
  assert.equal(manifestSelector(parseImageReference('python:3.12')), '3.12');
  // An upper-case first component is a registry host, as in distribution/reference.
  assert.equal(parseImageReference('Foo/bar').registry, 'Foo');
});

test('bad references are refused with the reason, naming the image', () => {
  const bad: [string, RegExp][] = [
    ['', /empty/],
    [' python', /white space/],
    ['Python', /lower case/],
    ['python:', /not a valid tag/],
    ['python:-x', /not a valid tag/],
    [`python:${'a'.repeat(129)}`, /not a valid tag/],
    ['python@sha256:abc', /64 lower-case hex/],
    ['python@md5:0123456789abcdef0123456789abcdef', /not supported/],
    ['python@', /not a digest/],
    ['a//b', /path component/],
    ['-a/b', /path component/],
    ['a/b-', /path component/],
    ['a/.b', /path component/],
    ['ghcr.io/', /empty/],
    ['bad_host:5000/x', /registry host/],
    [HEX, /image ID/],
    [`x/${'a'.repeat(260)}`, /longer than 255/],
  ];
  for (const [input, why] of bad) {
    assert.throws(() => parseImageReference(input), (err: unknown) => {
      assert.ok(isAsbError(err, 'Invalid'), input);
      assert.match(err.message, why, input);
      assert.ok(err.message.includes(`"${input}"`), `the message names the image: ${err.message}`);
      assert.equal(err.fields[0]?.field, 'image');
      return true;
    });
  }
});

test('mirrors are tried first, the registry itself unless upstream is off; loopback and listed hosts are plain HTTP', () => {
  const config = parseRegistriesConfig({
    mirrors: { 'docker.io': { endpoints: ['127.0.0.1:5000', 'mirror.corp:443'], upstream: false }, 'ghcr.io': { endpoints: ['cache.corp'] } },
    insecure: ['mirror.corp', 'plain.corp:8080'],
    auths: { 'cache.corp': { username: 'u', password: 'p' }, 'ghcr.io': { auth: Buffer.from('g:h').toString('base64') } },
  });
  assert.deepEqual(pullSources(parseImageReference('python:3.12'), config), [
    { host: '127.0.0.1:5000', repository: 'library/python', insecure: true, auth: undefined, mirror: true },
    { host: 'mirror.corp:443', repository: 'library/python', insecure: true, auth: undefined, mirror: true },
  ]);
  const ghcr = pullSources(parseImageReference('ghcr.io/x/y:1'), config);
  assert.deepEqual(ghcr.map((s) => [s.host, s.insecure, s.auth?.username ?? s.auth?.auth]), [['cache.corp', false, 'u'], ['ghcr.io', false, 'Zzpo']]);
  // No mirror: the registry itself; Docker Hub's API host for docker.io.
  assert.deepEqual(pullSources(parseImageReference('busybox'), EMPTY_REGISTRIES).map((s) => s.host), ['registry-1.docker.io']);
  assert.equal(pullSources(parseImageReference('plain.corp:8080/a'), config)[0]?.insecure, true);
  assert.equal(pullSources(parseImageReference('other.corp:8080/a'), config)[0]?.insecure, false);
  // A pod's imagePullSecrets come before the worker's.
  const withPod = pullSources(parseImageReference('ghcr.io/x/y:1'), config, [{ 'ghcr.io': { username: 'pod', password: 's' } }]);
  assert.equal(withPod[1]?.auth?.username, 'pod');
  assert.deepEqual(JSON.parse(authFileJson('ghcr.io', { username: 'a', password: 'b' })), { auths: { 'ghcr.io': { auth: Buffer.from('a:b').toString('base64') } } });
  for (const host of ['localhost', 'localhost:5000', '127.0.0.1:1', '127.9.9.9', '[::1]:5000']) assert.ok(isLoopbackHost(host), host);
  for (const host of ['10.0.0.1:5000', 'localhost.evil.com', '[::2]:1']) assert.ok(!isLoopbackHost(host), host);
});

test('registry configuration: every problem is listed at once', () => {
  assert.throws(() => parseRegistriesConfig({
    mirrors: { 'docker.io': { endpoints: [] }, 'x.io': { endpoints: ['ok.io'], upstream: 'no' } },
    insecure: ['not a host'],
    auths: { 'a.io': { password: 'only' } },
    extra: 1,
  }), (err: unknown) => {
    assert.ok(isAsbError(err, 'Invalid'));
    assert.deepEqual(err.fields.map((f) => f.field), [
      'registries.extra', 'registries.mirrors["docker.io"].endpoints', 'registries.mirrors["x.io"].upstream', 'registries.insecure', 'registries.auths["a.io"]',
    ]);
    return true;
  });
  assert.equal(parseRegistriesConfig(undefined), EMPTY_REGISTRIES);
  assert.ok(Object.isFrozen(parseRegistriesConfig({ insecure: ['a.io'] })));
});

test('chain IDs follow Docker; layout tags are one per reference and safe for umoci', () => {
  const a = `sha256:${'1'.repeat(64)}`;
  const b = `sha256:${'2'.repeat(64)}`;
  assert.equal(chainIdOf([a]), a);
  // sha256("sha256:111… sha256:222…") (computed with Python's hashlib).
  assert.equal(chainIdOf([a, b]), 'sha256:9932074217c35353d2e03a3f5a86549f7c67bfeb0ba53e23d69f4d4c8f7958f5');
  assert.notEqual(chainIdOf([a, b]), chainIdOf([b, a]));
  assert.match(layoutTag('docker.io/library/python:3.12'), /^r[0-9a-f]{32}$/);
  assert.notEqual(layoutTag('docker.io/library/python:3.12'), layoutTag('docker.io/library/python:3.11'));
});
