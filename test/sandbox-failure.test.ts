// A sandbox that fails says why on every surface a user looks at: the REST view, `asb create`,
// `asb get` and `asb ls`, the E2B SDK's error, and the web console. The failure is a real one: a
// template whose image (python:3.12) the test registry does not have, so the worker's pull fails
// with the registry's own answer, as on a machine whose seed images cannot provide it. A real hub
// in this process and a real worker process synced to it (own bridge asbfail, subnet
// 10.203.0.0/16), as `make up` runs them; the console in headless Chromium, as test/console.test.ts.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { chromium } from 'playwright-core';
import * as e2b from 'e2b';
import type { Condition } from '../src/api/meta.ts';
import type { Sandbox, SandboxStatus } from '../src/api/types.ts';
import { startHub } from '../src/hub/hub.ts';
import { parseHubConfig } from '../src/hub/hub-config.ts';
import { silentLogger } from '../src/base/log.ts';
import { sandboxView } from '../src/worker/views.ts';
import { OpenApiChecker } from './support/openapi-check.ts';
import { runAsb } from './support/run-asb.ts';
import { waitFor } from './support/wait.ts';
import { call, type ApiResponse } from './support/worker-fixture.ts';
import { removeDataDir, startWorkerProcess } from './support/worker-process.ts';

const CHROMIUM = '/usr/bin/chromium';
const openapi = new OpenApiChecker(new URL('../docs/openapi.yaml', import.meta.url).pathname);

/** What the registry's refusal looks like once the worker has said it: the image, its full name and the registry's answer. */
const PULL_FAILED = /image "python:3\.12" \(docker\.io\/library\/python:3\.12\) could not be pulled: .*manifest unknown/;

function sandboxWith(status: SandboxStatus): Sandbox {
  return { apiVersion: 'agents.x-k8s.io/v1alpha1', kind: 'Sandbox', metadata: { name: 'loc1abc', namespace: 'default' }, spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox' }] } } }, status };
}

function notReady(reason: string, message: string): Condition[] {
  return [{ type: 'Ready', status: 'False', reason, message, lastTransitionTime: '2025-01-01T00:00:00Z' }];
}

test('the view of a Failed or Expired sandbox names its Ready condition\'s reason and message, whatever the reason', () => {
  for (const [reason, message] of [
    ['OOMKilled', 'the container was killed for using more memory than its limit (OOMKilled, exit code 137)'],
    ['Evicted', 'the sandbox used more disk than its ephemeral-storage limit'],
    ['NameConflict', 'sandbox id "loc1abc" belongs to another Sandbox in this cluster'],
    ['PodFailed', 'the container exited with code 3'],
  ] as const) {
    const view = sandboxView(sandboxWith({ phase: 'Failed', conditions: notReady(reason, message) }));
    assert.deepEqual([view.phase, view.reason, view.message], ['Failed', reason, message]);
  }
  const expired = sandboxView(sandboxWith({ phase: 'Expired', conditions: notReady('SandboxExpired', 'shutdownTime 2025-01-01T00:00:00Z reached') }));
  assert.deepEqual([expired.reason, expired.message], ['SandboxExpired', 'shutdownTime 2025-01-01T00:00:00Z reached']);
  // With no condition (written by another controller), the phase is the reason.
  assert.deepEqual([sandboxView(sandboxWith({ phase: 'Failed' })).reason, sandboxView(sandboxWith({ phase: 'Failed' })).message], ['Failed', 'the sandbox is Failed']);
  // Not failed: no reason; a start that is being retried keeps its status message.
  const retrying = sandboxView(sandboxWith({ phase: 'Pending', message: 'the pod could not be started: quota', conditions: notReady('PodStartFailed', 'the pod could not be started: quota') }));
  assert.deepEqual([retrying.reason, retrying.message], [undefined, 'the pod could not be started: quota']);
  assert.equal(sandboxView(sandboxWith({ phase: 'Hibernated', conditions: notReady('SandboxSuspended', 'operatingMode is Suspended') })).reason, undefined);
});

test('a sandbox whose image cannot be pulled shows ErrImagePull and the registry answer on every surface', { timeout: 240_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-failure-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const hub = await startHub(parseHubConfig(['--data-dir', join(dir, 'hub'), '--port', '0', '--admin-key-file', join(dir, 'admin.key')], {}), { log: silentLogger() });
  t.after(() => hub.close());
  const admin = hub.adminKey ?? '';
  const hubCall = (method: string, path: string, json?: unknown, key = admin): Promise<ApiResponse> => call(hub, method, path, { key, ...(json === undefined ? {} : { json }) });

  const registered = await hubCall('PUT', '/v1/clusters/fail-east', { region: 'east', tag: 'fail', ingressAddress: '127.0.0.1:10203' });
  assert.equal(registered.status, 201, registered.text);
  writeFileSync(join(dir, 'cluster.credential'), `${(registered.json as { credential: string }).credential}\n`, { mode: 0o600 });
  // An image cache of its own: the pull fails at the manifest, so it needs none of the shared
  // cache's images, and never waits behind another test process's unpack for that cache's lock.
  const worker = await startWorkerProcess({
    clusterTag: 'fail',
    subnetOctet: 203,
    basePool: 0,
    extraArgs: ['--cluster', 'fail-east', '--hub-url', hub.url, '--hub-credential-file', join(dir, 'cluster.credential'), '--image-cache', join(dir, 'images')],
  });
  t.after(async () => {
    await worker.stop();
    removeDataDir(worker.dataDir);
  });
  assert.equal((await hubCall('PUT', '/v1/clusters/fail-east', { apiUrl: worker.apiUrl })).status, 200);
  const template = {
    apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
    kind: 'SandboxTemplate',
    metadata: { name: 'unpullable' },
    spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'python:3.12' }] } } },
  };
  const put = await hubCall('PUT', '/v1/templates/unpullable', template);
  assert.equal(put.status, 201, put.text);
  const made = await hubCall('POST', '/v1/keys', { team: 'failure-team' });
  assert.equal(made.status, 201, made.text);
  const key = (made.json as { key: string }).key;
  // Keys and templates reach the worker by sync: wait, as a user would, until it has both.
  await waitFor('the team key and the template at the worker', async () => ((await call({ url: worker.apiUrl }, 'GET', '/v1/templates/unpullable', { key })).status === 200 ? true : undefined), 30_000, 100);

  // The CLI as `make up` points it: at the API that places creates (here the hub).
  const cli = (args: string[]): ReturnType<typeof runAsb> => runAsb(args, { env: { ASB_API_URL: hub.url, ASB_API_KEY: key } });
  let id = '';

  await t.test('asb create exits 1 and names the sandbox, the reason and the message', async () => {
    const created = await cli(['create', '--template', 'unpullable']);
    assert.equal(created.code, 1, created.stdout);
    const said = /^error: sandbox default\/(fail[a-z0-9]+) is Failed: ErrImagePull: (.*)$/m.exec(created.stderr);
    assert.ok(said !== null, created.stderr);
    assert.match(said[2] ?? '', PULL_FAILED);
    id = said[1] ?? '';
  });

  await t.test('the REST view carries reason and message, as the API document says', async () => {
    for (const api of [{ url: worker.apiUrl }, hub]) {
      const path = `/v1/sandboxes/${id}`;
      const got = await call(api, 'GET', path, { key });
      assert.equal(got.status, 200, got.text);
      openapi.check('GET', path, got);
      const view = got.json as { phase: string; ready: boolean; reason?: string; message?: string };
      assert.deepEqual([view.phase, view.ready, view.reason], ['Failed', false, 'ErrImagePull']);
      assert.match(view.message ?? '', PULL_FAILED);
    }
    // A create that waits answers 409 with the reason in its detail, not just "Failed".
    const again = await call(hub, 'POST', '/v1/sandboxes', { key, json: { template: 'unpullable' } });
    assert.equal(again.status, 409, again.text);
    openapi.check('POST', '/v1/sandboxes', again);
    const problem = again.json as { code: string; detail: string };
    assert.equal(problem.code, 'SandboxNotRunning');
    assert.match(problem.detail, /is Failed: ErrImagePull: image "python:3\.12"/);
  });

  await t.test('asb get shows reason and message; asb ls has a REASON column', async () => {
    const got = await cli(['get', id]);
    assert.equal(got.code, 0, got.stderr);
    assert.match(got.stdout, /^phase: +Failed$/m);
    assert.match(got.stdout, /^reason: +ErrImagePull$/m);
    assert.match(got.stdout, new RegExp(`^message: +${PULL_FAILED.source}`, 'm'));
    const listed = await cli(['ls']);
    assert.equal(listed.code, 0, listed.stderr);
    assert.match(listed.stdout, /^ID\s+TEMPLATE\s+PHASE\s+READY\s+MEMORY\s+AGE\s+OWNER\s+REASON$/m);
    assert.match(listed.stdout, new RegExp(`^${id}\\s+unpullable\\s+Failed\\s+false\\s+-\\s+\\S+\\s+failure-team\\s+ErrImagePull$`, 'm'));
  });

  await t.test('the E2B SDK\'s create and connect reject with the reason and the registry answer in their message', async () => {
    const failed = await e2b.Sandbox.create('unpullable', { apiUrl: hub.url, sandboxUrl: hub.url, apiKey: key }).then(
      () => undefined,
      (err: unknown) => err,
    );
    assert.ok(failed instanceof Error, 'create rejects');
    assert.match(failed.message, /ErrImagePull: image "python:3\.12" \(docker\.io\/library\/python:3\.12\) could not be pulled/);
    // Connecting to the failed sandbox says the same (at its worker, where the edge sends a sandbox's own E2B paths).
    const connected = await e2b.Sandbox.connect(id, { apiUrl: worker.apiUrl, sandboxUrl: worker.apiUrl, apiKey: key }).then(
      () => undefined,
      (err: unknown) => err,
    );
    assert.ok(connected instanceof Error, 'connect rejects');
    assert.match(connected.message, new RegExp(`sandbox "${id}" failed: ErrImagePull: ${PULL_FAILED.source}`));
    // The body unmodified SDKs read: {code, message}, the status as a number in code.
    const raw = await call(hub, 'POST', '/v2/sandboxes', { headers: { 'x-api-key': key }, json: { templateID: 'unpullable' } });
    assert.equal(raw.status, 409, raw.text);
    const body = raw.json as { code: number; message: string };
    assert.equal(body.code, 409);
    assert.match(body.message, /is Failed: ErrImagePull: /);
    assert.match(body.message, PULL_FAILED);
  });

  await t.test('the console shows the reason and message beside the Failed state', async () => {
    assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: make test installs it (apt-get install chromium)`);
    const browser = await chromium.launch({ executablePath: CHROMIUM });
    t.after(() => browser.close());
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const pageErrors: string[] = [];
    page.on('pageerror', (err) => pageErrors.push(err.message));
    await page.goto(`${hub.url}/console`);
    await page.fill('#key', key);
    await page.click('#login-form button[type=submit]');
    const row = page.locator(`#sandboxes tr[data-sandbox="${id}"]`);
    await row.waitFor({ timeout: 10_000 });
    assert.equal(await row.locator('td.state').innerText(), 'Failed');
    const reason = await row.locator('td.reason').innerText();
    assert.match(reason, /^ErrImagePull: /);
    assert.match(reason, PULL_FAILED);
    assert.deepEqual(pageErrors, [], 'no script error in the page');
  });
});
