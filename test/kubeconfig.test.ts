// .asb/kubeconfig as `make up` writes it (src/assembly/kubeconfig.ts): one context per cluster at
// its TLS edge with the edge CA and the admin key; the real kubectl reads it and reaches the
// worker's Kubernetes API through each context.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { writeKubeconfig } from '../src/assembly/kubeconfig.ts';
import { KUBECTL, serveTls } from './support/kubectl.ts';
import { startWorkerFixture } from './support/worker-fixture.ts';

test('make up\'s kubeconfig has a context per cluster and kubectl reaches the API with it', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn));
  const tls = await serveTls(fx.server.handler, (fn) => t.after(fn));
  const dir = mkdtempSync(join(tmpdir(), 'asb-kubeconfig-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'kubeconfig');
  // Two "clusters" on the same worker stand for region-a and region-b.
  writeKubeconfig(path, [{ name: 'region-a', server: tls.url }, { name: 'region-b', server: tls.url }], tls.caPath, fx.keys.admin);
  assert.equal(statSync(path).mode & 0o777, 0o600, 'the file holds the admin key');
  // Asynchronous: the worker answers from this process.
  const kubectl = (args: string[]): Promise<{ status: number; stdout: string; stderr: string }> => new Promise((resolve) => {
    execFile(KUBECTL, args, { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: dir, KUBECONFIG: path, KUBECACHEDIR: join(dir, 'cache') }, timeout: 30_000 }, (err, stdout, stderr) => {
      resolve({ status: err === null ? 0 : typeof err.code === 'number' ? err.code : 1, stdout, stderr });
    });
  });
  const contexts = await kubectl(['config', 'get-contexts', '-o', 'name']);
  assert.equal(contexts.stdout, 'region-a\nregion-b\n', contexts.stderr);
  assert.equal((await kubectl(['config', 'current-context'])).stdout, 'region-a\n');
  for (const context of ['region-a', 'region-b']) {
    const got = await kubectl(['--context', context, 'get', 'sandboxtemplates']);
    assert.equal(got.status, 0, got.stderr);
    assert.match(got.stdout, /^NAME\s+AGE\nbase\s+\d+s\n$/);
  }
});
