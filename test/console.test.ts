// The web console in a real browser: headless Debian Chromium (/usr/bin/chromium, installed by
// `make test` with apt-get) driven by playwright-core, against a real hub in this process and a
// real worker process synced to it (own bridge asbcnsl, subnet 10.252.0.0/16). Screenshots go to
// test-artifacts/console-*.png.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { chromium, type Page } from 'playwright-core';
import { startHub } from '../src/hub/hub.ts';
import { parseHubConfig } from '../src/hub/hub-config.ts';
import { silentLogger } from '../src/base/log.ts';
import { waitFor } from './support/wait.ts';
import { call, type ApiResponse } from './support/worker-fixture.ts';
import { removeDataDir, startWorkerProcess } from './support/worker-process.ts';

const CHROMIUM = '/usr/bin/chromium';
const artifacts = resolve(import.meta.dirname, '..', 'test-artifacts');

test('the web console: log in, see clusters, pools and sandboxes, use a terminal, pause and delete', { timeout: 240_000 }, async (t) => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: make test installs it (apt-get install chromium)`);
  mkdirSync(artifacts, { recursive: true });
  const dir = mkdtempSync(join(tmpdir(), 'asb-console-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const hub = await startHub(parseHubConfig(['--data-dir', join(dir, 'hub'), '--port', '0', '--admin-key-file', join(dir, 'admin.key')], {}), { log: silentLogger() });
  t.after(() => hub.close());
  const admin = hub.adminKey ?? '';
  const hubCall = (method: string, path: string, json?: unknown): Promise<ApiResponse> => call(hub, method, path, { key: admin, ...(json === undefined ? {} : { json }) });

  const registered = await hubCall('PUT', '/v1/clusters/console-east', { region: 'east', tag: 'cnsl', ingressAddress: '127.0.0.1:10253' });
  assert.equal(registered.status, 201, registered.text);
  writeFileSync(join(dir, 'cluster.credential'), `${(registered.json as { credential: string }).credential}\n`, { mode: 0o600 });
  const worker = await startWorkerProcess({ clusterTag: 'cnsl', subnetOctet: 252, basePool: 1, extraArgs: ['--cluster', 'console-east', '--hub-url', hub.url, '--hub-credential-file', join(dir, 'cluster.credential')] });
  t.after(async () => {
    await worker.stop();
    removeDataDir(worker.dataDir);
  });
  assert.equal((await hubCall('PUT', '/v1/clusters/console-east', { apiUrl: worker.apiUrl })).status, 200);
  // A team's own key, as a user would log in with (not the admin key).
  const key = await hubCall('POST', '/v1/keys', { team: 'console-team' });
  assert.equal(key.status, 201, key.text);
  const teamKey = (key.json as { key: string }).key;
  await waitFor('the cluster connected', async () => ((await hubCall('GET', '/v1/federation')).json as { clusters: { health: string }[] }).clusters[0]?.health === 'healthy' ? true : undefined);
  // The hub forwards the create below with this key, and a worker knows a key only once sync has
  // brought it there ("a key every cluster accepts within the sync bound", docs/federation.md; the bound is
  // test/sync.test.ts's to assert): as a user would, wait until the worker takes it.
  await waitFor('the team key accepted at the worker', async () => ((await call({ url: worker.apiUrl }, 'GET', '/v1/status', { key: teamKey })).status === 200 ? true : undefined), 30_000, 100);
  const created = await call(hub, 'POST', '/v1/sandboxes', { key: teamKey, json: { template: 'base' } });
  assert.equal(created.status, 201, created.text);
  const id = (created.json as { id: string }).id;

  const browser = await chromium.launch({ executablePath: CHROMIUM });
  t.after(() => browser.close());
  const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  const pageErrors: string[] = [];
  page.on('pageerror', (err) => pageErrors.push(err.message));
  const shots: string[] = [];
  const shot = async (p: Page, name: string): Promise<void> => {
    const path = join(artifacts, `console-${name}.png`);
    await p.screenshot({ path, fullPage: true });
    shots.push(path);
  };
  t.after(() => t.diagnostic(`screenshots: ${shots.join(' ')}`));

  await page.goto(`${hub.url}/console`);
  await page.fill('#key', 'asb_wrongkey_00000000000000000000000000000000');
  await page.click('#login-form button[type=submit]');
  const loginError = page.locator('#login-error');
  await loginError.waitFor({ state: 'visible', timeout: 10_000 });
  assert.match(await loginError.innerText(), /refused this API key/);
  assert.equal(await page.locator('#main').isHidden(), true, 'a wrong key does not get past the login form');
  await shot(page, 'login-error');

  await page.fill('#key', teamKey);
  await page.click('#login-form button[type=submit]');
  const health = page.locator('#clusters tr[data-cluster="console-east"] td.health');
  await health.waitFor({ timeout: 10_000 });
  await waitFor('the cluster shown healthy', async () => ((await health.innerText()) === 'healthy' ? true : undefined), 10_000, 100);
  const row = page.locator(`#sandboxes tr[data-sandbox="${id}"]`);
  await row.waitFor({ timeout: 10_000 });
  assert.match(await row.innerText(), /Running/);
  assert.match(await row.innerText(), /console-team/);
  assert.match(await row.innerText(), /console-east/);
  await waitFor('the base pool in the pools table', async () => ((await page.locator('#pools tbody').innerText()).includes('default/base') ? true : undefined), 15_000, 200);
  await shot(page, 'overview');

  await row.getByRole('button', { name: 'Terminal' }).click();
  await waitFor('the terminal connected', async () => ((await page.locator('#terminal-status').innerText()).includes('connected to') ? true : undefined), 20_000, 100);
  await page.locator('#terminal .xterm').click();
  await page.keyboard.type('echo console-$((6*7))');
  await page.keyboard.press('Enter');
  // The typed line shows `console-$((6*7))`; only the shell's answer shows console-42.
  await waitFor('console-42 in the terminal', async () => ((await page.locator('#terminal .xterm-rows').innerText()).includes('console-42') ? true : undefined), 20_000, 100);
  await shot(page, 'terminal');

  await row.getByRole('button', { name: 'Pause' }).click();
  await waitFor('the sandbox shown paused', async () => {
    const state = await row.locator('td.state').innerText();
    return state !== 'Running' ? state : undefined;
  }, 60_000, 200);
  await shot(page, 'paused');
  page.once('dialog', (d) => void d.accept());
  await row.getByRole('button', { name: 'Delete' }).click();
  await waitFor('the sandbox gone from the list', async () => ((await row.count()) === 0 ? true : undefined), 60_000, 200);
  assert.deepEqual(pageErrors, [], 'no script error in the page');
});
