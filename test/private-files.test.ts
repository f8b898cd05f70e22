// Secrets at rest and in logs: after the local system starts, its state directory, data directory,
// stores (store.db and its -wal and -shm, which hold E2B envVars), logs and Envoy files are
// readable only by the user running it; user `nobody` cannot read another team's envVars; and
// neither our logs nor Envoy's access log hold a token, signature, API key or cookie that clients
// sent.
import { testImages } from './support/test-images.ts';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, copyFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { test } from 'node:test';
import { createLogger, REDACTED } from '../src/base/log.ts';
import { startLocalSystem } from '../src/assembly/local-system.ts';
import { openSqliteStore } from '../src/store/sqlite.ts';
import { silentLogger } from '../src/base/log.ts';
import { send, until } from './support/dataplane-fixture.ts';
import { removeDataDir } from './support/worker-process.ts';

const TAG = 'prvf';

/** Every directory and regular file under root, except what skip names (paths relative to root). */
function walk(root: string, skip: (rel: string) => boolean): { path: string; dir: boolean; mode: number }[] {
  const out: { path: string; dir: boolean; mode: number }[] = [];
  const visit = (path: string): void => {
    const st = statSync(path);
    out.push({ path, dir: st.isDirectory(), mode: st.mode & 0o777 });
    if (!st.isDirectory()) return;
    for (const name of readdirSync(path)) {
      const child = join(path, name);
      if (!skip(relative(root, child))) visit(child);
    }
  };
  visit(root);
  return out;
}

/** Whether user nobody can read path (cat exits 0). */
function nobodyReads(path: string): boolean {
  return spawnSync('su', ['nobody', '-s', '/bin/sh', '-c', `cat '${path}' > /dev/null`], { stdio: 'ignore' }).status === 0;
}

test('after start, the state is 0700/0600, nobody cannot read the store, and no log holds a client secret', { timeout: 180_000 }, async (t) => {
  // The parent is world-readable, as a checkout in a home directory or /srv usually is: only
  // the modes asb sets stand between another local user and the files.
  const parent = mkdtempSync(join(tmpdir(), `asb-${TAG}-`));
  chmodSync(parent, 0o755);
  const stateDir = join(parent, '.asb');
  t.after(() => removeDataDir(parent));
  const system = await startLocalSystem({
    stateDir,
    log: silentLogger(),
    apiPort: 0,
    edgePort: 0,
    envoyAdminPort: 0,
    routerPort: 0,
    domain: 'asb.localhost',
    clusterName: 'local',
    workerArgs: [...(await testImages()).workerArgs, '--cluster-tag', TAG, '--bridge', `asb${TAG}`, '--subnet', '10.200.0.0/16', '--base-pool', '0', '--log-level', 'debug'],
    routerArgs: ['--log-level', 'debug'],
  });
  t.after(async () => {
    await system.stop();
    try {
      execFileSync('ip', ['link', 'del', `asb${TAG}`], { stdio: 'ignore' });
    } catch {
      // no bridge
    }
  });

  const envSecret = 'sk-envsecret-0123456789abcdef';
  const created = await fetch(`${system.apiUrl}/sandboxes`, {
    method: 'POST',
    headers: { 'x-api-key': system.adminKey, 'content-type': 'application/json' },
    body: JSON.stringify({ templateID: 'base', envVars: { OPENAI_API_KEY: envSecret } }),
  });
  assert.equal(created.status, 201, await created.clone().text());
  const { sandboxID } = (await created.json()) as { sandboxID: string };

  // Secrets a client sends in every place a request can carry them, to the edge and the API.
  const secrets = {
    query: 'tok_querysecret0123456789abcdefghij',
    signature: 'v1_signaturesecretAAAAAAAAAAAAAAAAAAAAAAAAAAA',
    header: 'tok_headersecret0123456789abcdefgh',
    cookie: 'tok_cookiesecret0123456789abcdefgh',
  };
  const edgeHost = `8080-${sandboxID}.asb.localhost`;
  await send(system.edgeUrl, edgeHost, `/?token=${secrets.query}`, { 'x-access-token': secrets.header });
  await send(system.edgeUrl, `49983-${sandboxID}.asb.localhost`, `/files?path=/etc/hostname&signature=${secrets.signature}&signature_expiration=99`);
  await send(system.edgeUrl, edgeHost, '/page', { cookie: `asb_access=${secrets.cookie}` });
  await send(system.edgeUrl, 'api.asb.localhost', `/v1/sandboxes?token=${secrets.query}`, { authorization: `Bearer ${secrets.header}` });
  await fetch(`${system.apiUrl}/v1/sandboxes/${sandboxID}/terminal?token=${secrets.query}`);

  // data/runtime holds the pods' trees and the runtime's executables, with the modes sandboxes
  // need (/tmp 1777, 0755 binaries); data/ itself being 0700 keeps other users out of it.
  // admin.address is Envoy's own file (written by --admin-address-path) and names a loopback port.
  const skip = (rel: string): boolean => rel === join('data', 'runtime') || rel === join('envoy', 'admin.address');
  const entries = walk(stateDir, skip);
  const open = entries.filter((e) => e.mode !== (e.dir ? 0o700 : 0o600)).map((e) => `${relative(parent, e.path)} ${e.mode.toString(8)}`);
  assert.deepEqual(open, [], 'every directory 0700 and every file 0600');
  const store = join(stateDir, 'data', 'store.db');
  for (const path of [stateDir, store, `${store}-wal`, `${store}-shm`, join(stateDir, 'logs', 'worker.log'), join(stateDir, 'envoy', 'access.log')]) {
    assert.ok(existsSync(path), `${relative(parent, path)} exists`);
  }
  // The probe's attack: the envVars are in the store's WAL, and nobody must not get at them.
  const stored = readFileSync(`${store}-wal`).includes(envSecret) || readFileSync(store).includes(envSecret);
  assert.ok(stored, 'the store holds the envVars (the attack below would find them)');
  for (const path of [store, `${store}-wal`, `${store}-shm`, join(stateDir, 'envoy', 'access.log'), join(stateDir, 'logs', 'worker.log')]) {
    assert.equal(nobodyReads(path), false, `user nobody can read ${relative(parent, path)}`);
  }

  // Envoy flushes its access log every second: wait for the five requests' lines.
  const accessLog = join(stateDir, 'envoy', 'access.log');
  await until(() => readFileSync(accessLog, 'utf8').trim().split('\n').length >= 4, 10_000, 'the access log lines');
  await system.stop();
  const logs = [accessLog, ...readdirSync(join(stateDir, 'logs')).map((name) => join(stateDir, 'logs', name))];
  for (const path of logs) {
    const text = readFileSync(path, 'utf8');
    for (const [where, secret] of Object.entries(secrets)) assert.ok(!text.includes(secret), `${relative(parent, path)} holds the ${where} secret`);
    assert.ok(!text.includes(system.adminKey), `${relative(parent, path)} holds the admin key`);
  }
});

test('a store made by an older version (0644 files) is made 0600 on open', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-prvs-'));
  t.after(() => removeDataDir(dir));
  const path = join(dir, 'store.db');
  for (const file of [path, `${path}-wal`, `${path}-shm`]) writeFileSync(file, '', { mode: 0o644 });
  chmodSync(path, 0o644);
  const store = await openSqliteStore({ path, log: silentLogger() });
  t.after(() => store.close());
  for (const file of [path, `${path}-wal`, `${path}-shm`]) assert.equal(statSync(file).mode & 0o777, 0o600, file);
});

test('our logger drops query strings and redacts credential headers wherever a log call puts them', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-prvl-'));
  t.after(() => removeDataDir(dir));
  const file = join(dir, 'x.log');
  const log = createLogger({ destination: file, level: 'debug' });
  const secret = 'tok_logsecret0123456789abcdefghijk';
  const headers = { authorization: `Bearer ${secret}`, 'x-access-token': secret, cookie: `asb_access=${secret}`, 'user-agent': 'probe' };
  log.error({ url: `/files?path=/x&signature=${secret}`, method: 'GET' }, 'request failed');
  log.child({ component: 'worker' }).warn({ url: `http://127.0.0.1:1/terminal?token=${secret}`, headers }, 'upgrade failed');
  log.info({ req: { url: '/plain', headers } }, 'nested');
  await new Promise<void>((resolve, reject) => log.flush((err) => (err ? reject(err) : resolve())));
  await until(() => existsSync(file) && readFileSync(file, 'utf8').split('\n').length > 3, 5_000, 'three log lines');
  const text = readFileSync(file, 'utf8');
  assert.ok(!text.includes(secret), text);
  const lines = text.trim().split('\n').map((l) => JSON.parse(l) as { url?: string; headers?: Record<string, string>; req?: { headers: Record<string, string> } | undefined });
  const [first, second, third] = lines;
  assert.equal(first?.url, `/files?${REDACTED}`, 'the path stays, the query goes');
  assert.equal(second?.url, `http://127.0.0.1:1/terminal?${REDACTED}`);
  assert.equal(second.headers?.['user-agent'], 'probe', 'other headers stay');
  assert.equal(third?.req?.headers.authorization, REDACTED);
});

test("a data dir owned by another user (a Kubernetes volume's mount point) is used as it is, and the files made in it are still 0600", (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-prvk-'));
  t.after(() => removeDataDir(dir));
  chmodSync(dir, 0o777);
  // The mount point: root's, 0775, writable by the group the pod runs in (here: nogroup).
  const mount = join(dir, 'var-lib-asb');
  execFileSync('install', ['-d', '-m', '0775', '-o', 'root', '-g', 'nogroup', mount]);
  const node = process.execPath;
  // nobody may not read the checkout (a fresh clone under a 0700 temp dir, as CI makes): it runs a
  // copy of the module (it imports only node:fs) from the test's own world-readable dir.
  const module = join(dir, 'private-files.ts');
  copyFileSync(new URL('../src/base/private-files.ts', import.meta.url), module);
  chmodSync(module, 0o644);
  const script = `
    import { privateDir, privateFile } from ${JSON.stringify(module)};
    privateDir(${JSON.stringify(mount)});
    privateFile(${JSON.stringify(join(mount, 'hub.db'))});
  `;
  const run = spawnSync('setpriv', ['--reuid', 'nobody', '--regid', 'nogroup', '--clear-groups', node, '--input-type=module', '-e', script], { encoding: 'utf8' });
  assert.equal(run.status, 0, run.stderr);
  assert.equal(statSync(mount).mode & 0o777, 0o775, 'the volume keeps its mode');
  assert.equal(statSync(join(mount, 'hub.db')).mode & 0o777, 0o600);
});
