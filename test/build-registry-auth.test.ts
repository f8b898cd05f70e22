// The Kubernetes tier's build engine reads base images and pushes what it builds with the
// worker's registry credentials (--registries `auths`: a pull secret's .dockerconfigjson is such a
// file as it is), against a real registry that requires them (Debian's docker-registry with
// htpasswd basic auth). The builds here are ENV steps only, which need no build Pod: the engine's
// runtime is a test double that must see no call, and everything else is real (the registry
// reads, the push, the image in the registry).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import type { BuildStep, EngineRequest } from '../src/builds/contract.ts';
import { createKubeBuildEngine } from '../src/builds/engine.ts';
import { isAsbError } from '../src/errors.ts';
import { parseRegistriesConfig } from '../src/images/registries.ts';
import { RegistryProcess } from '../src/images/registry-process.ts';
import { defaultSeedDir, readSeedImages, seedRegistry } from '../src/images/seed.ts';
import { silentLogger } from '../src/base/log.ts';
import { FakeRuntime } from './support/fake-runtime.ts';
import { testImages } from './support/test-images.ts';

function tempDir(t: TestContext, prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

const ALICE = { username: 'alice', password: 's3cret' };

function request(baseImage: string, tag: string): EngineRequest {
  const steps: BuildStep[] = [{ type: 'ENV', args: ['BUILT_WITH', 'credentials'] }];
  return {
    team: 'team-a', baseImage, steps, noCache: false,
    target: { repository: 'templates/private', tag },
    limits: { cpu: 1, memoryBytes: 2 ** 28, diskBytes: 2 ** 30, timeoutMs: 60_000 },
    files: { has: () => false, path: () => undefined },
    log: () => undefined,
    signal: new AbortController().signal,
  };
}

test('a Kubernetes-tier build reads a private base image and pushes to a private registry with the worker\'s credentials; without them it fails naming the image and the registry\'s answer', async (t) => {
  const dir = tempDir(t, 'asb-build-auth-');
  // bcrypt (cost 4) of "s3cret", as test/images.test.ts has it.
  writeFileSync(join(dir, 'htpasswd'), 'alice:$2b$04$MiUs0h.C6Sv3eLH7S3jmYuhB6Z9WBdXbSYXoOFNE/ZE4sbFFt74ZS\n');
  const registry = new RegistryProcess({ stateDir: join(dir, 'state'), logger: silentLogger(), htpasswdPath: join(dir, 'htpasswd') });
  t.after(() => registry.close());
  await registry.start();
  await seedRegistry(registry.address, readSeedImages(defaultSeedDir()), { tmpDir: join(dir, 'seed'), only: ['docker.io/library/busybox:latest'], credentials: ALICE });
  const privateBase = `${registry.address}/library/busybox:latest`;
  const runtime = new FakeRuntime();
  const engine = (auths: Record<string, unknown>) => createKubeBuildEngine({ runtime, registries: parseRegistriesConfig({ auths }), registry: registry.address, stateDir: join(dir, `engine-${String(Object.keys(auths).length)}`) });
  const withAuth = engine({ [registry.address]: ALICE });
  const without = engine({});
  const basic = `Basic ${Buffer.from('alice:s3cret').toString('base64')}`;

  const built = await withAuth.build(request(privateBase, 'v1'));
  assert.match(built.image, new RegExp(`^${registry.address.replace(/\./g, '\\.')}/templates/private@sha256:[0-9a-f]{64}$`));
  assert.ok(built.config.env.includes('BUILT_WITH=credentials'), built.config.env.join(' '));
  const digest = built.image.slice(built.image.indexOf('@') + 1);
  const manifest = `http://${registry.address}/v2/templates/private/manifests/${digest}`;
  const accept = 'application/vnd.oci.image.manifest.v1+json';
  assert.equal((await fetch(manifest, { headers: { accept, authorization: basic } })).status, 200, 'the built image is in the private registry');
  assert.equal((await fetch(manifest, { headers: { accept } })).status, 401, 'which refuses anonymous reads');

  // No credentials for the base's registry: the build fails naming the image and the answer.
  await assert.rejects(without.build(request(privateBase, 'v2')), (err: unknown) => {
    assert.ok(isAsbError(err, 'BuildFailed'), String(err));
    assert.ok(err.message.includes(privateBase) && err.message.includes(`${registry.address}: HTTP 401`), err.message);
    return true;
  });
  // A public base, but no credentials for the registry it pushes to: the push fails, saying so.
  const publicBase = `${(await testImages()).address}/library/busybox:latest`;
  await assert.rejects(without.build(request(publicBase, 'v3')), (err: unknown) => {
    assert.ok(err instanceof Error && /the registry refused to .*HTTP 401/.test(err.message), String(err));
    return true;
  });
  assert.deepEqual(runtime.calls, [], 'no build Pod was needed');
});
