// The unmodified `e2b` SDK end to end through the real data plane: a worker with real sandboxes,
// the router and a real Envoy. Recipe A of research e2b.md: apiUrl and sandboxUrl are both the
// edge's address, so the control plane goes to the worker's API through Envoy, and envd traffic
// carries E2b-Sandbox-Id / E2b-Sandbox-Port, which the router turns into the owning worker.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import * as e2bLatest from 'e2b';
import * as e2b250 from 'e2b-2-50';
import { startTestSystem } from './support/local-system.ts';
import { checkPtyRoundTrip } from './support/e2b-pty.ts';
import { waitFor } from './support/wait.ts';

type Sdk = typeof e2bLatest;

test('the E2B SDK through Envoy and the router: commands, pty, files, watch, signed URLs, pause and connect, kill', async (t) => {
  const system = await startTestSystem('e2be', 220, 'local', 2);
  t.after(() => system.cleanup());
  const { Sandbox, CommandExitError, SandboxNotFoundError, NotFoundError } = e2bLatest;
  const opts = { apiUrl: system.edgeUrl, sandboxUrl: system.edgeUrl, apiKey: system.adminKey };

  const sbx = await Sandbox.create('base', { ...opts, envs: { GREETING: 'hello from envs' }, metadata: { suite: 'e2b-sdk' } });
  t.after(() => Sandbox.kill(sbx.sandboxId, opts).catch(() => false));

  await t.test('commands.run in the foreground: stdout, stderr, exit code, the create envs and per-command envs, cwd', async () => {
    const out = await sbx.commands.run('echo "$GREETING"; echo "$ONE" >&2; pwd', { envs: { ONE: 'one' }, cwd: '/tmp' });
    assert.equal(out.exitCode, 0);
    assert.equal(out.stdout, 'hello from envs\n/tmp\n');
    assert.equal(out.stderr, 'one\n');
    const seen: string[] = [];
    await sbx.commands.run('for i in 1 2 3; do echo line$i; done', { onStdout: (d) => { seen.push(d); } });
    assert.equal(seen.join(''), 'line1\nline2\nline3\n', 'onStdout sees every line as it streams');
  });

  await t.test('a non-zero exit raises CommandExitError with the code and output', async () => {
    const err = await sbx.commands.run('echo partial; exit 7').then(() => undefined, (e: unknown) => e);
    assert.ok(err instanceof CommandExitError, `got ${String(err)}`);
    assert.equal(err.exitCode, 7);
    assert.equal(err.stdout, 'partial\n');
  });

  await t.test('a background command outlives its call, is listed, takes stdin, and is killed', async () => {
    const handle = await sbx.commands.run('read line; echo "got:$line"; sleep 600', { background: true, stdin: true });
    assert.ok(handle.pid > 0);
    const listed = await sbx.commands.list();
    assert.ok(listed.some((p) => p.pid === handle.pid), `pid ${String(handle.pid)} in ${JSON.stringify(listed.map((p) => p.pid))}`);
    await sbx.commands.sendStdin(handle.pid, 'ping\n');
    await waitFor('the echo of stdin', () => Promise.resolve(handle.stdout.includes('got:ping') ? true : undefined), 10_000);
    assert.equal(await sbx.commands.kill(handle.pid), true);
    const end = await handle.wait().then(() => undefined, (e: unknown) => e);
    assert.ok(end instanceof CommandExitError, 'a killed command ends with an error');
    assert.equal((await sbx.commands.list()).some((p) => p.pid === handle.pid), false, 'gone from the list');
    assert.equal(await sbx.commands.kill(handle.pid), false, 'killing it again: false');
  });

  await t.test('pty: create with a size, input, resize', async () => {
    await checkPtyRoundTrip(sbx.pty);
  });

  await t.test('files: write, read, list, exists, makeDir, rename, remove, getInfo', async () => {
    const info = await sbx.files.write('/home/user/project/a.txt', 'alpha');
    assert.equal(info.path, '/home/user/project/a.txt');
    assert.equal(await sbx.files.read('/home/user/project/a.txt'), 'alpha');
    const bytes = await sbx.files.read('/home/user/project/a.txt', { format: 'bytes' });
    assert.deepEqual(Buffer.from(bytes), Buffer.from('alpha'));
    await sbx.files.write([{ path: '/home/user/project/b.bin', data: new Uint8Array([0, 1, 2, 255]).buffer }]);
    assert.deepEqual([...await sbx.files.read('/home/user/project/b.bin', { format: 'bytes' })], [0, 1, 2, 255]);
    assert.equal(await sbx.files.makeDir('/home/user/project/sub'), true);
    assert.equal(await sbx.files.makeDir('/home/user/project/sub'), false, 'already there');
    const names = (await sbx.files.list('/home/user/project')).map((e) => `${e.name}:${e.type}`).sort();
    assert.deepEqual(names, ['a.txt:file', 'b.bin:file', 'sub:dir']);
    assert.equal(await sbx.files.exists('/home/user/project/a.txt'), true);
    assert.equal(await sbx.files.exists('/home/user/project/nope'), false);
    const moved = await sbx.files.rename('/home/user/project/a.txt', '/home/user/project/sub/c.txt');
    assert.equal(moved.path, '/home/user/project/sub/c.txt');
    assert.equal((await sbx.files.getInfo('/home/user/project/sub/c.txt')).size, 5);
    await sbx.files.remove('/home/user/project/sub');
    assert.equal(await sbx.files.exists('/home/user/project/sub/c.txt'), false);
    await assert.rejects(sbx.files.read('/home/user/project/nope'), NotFoundError);
  });

  // Regression: a relative path was taken from /, so `files.write('notes/a.txt')` answered 403
  // "mkdir: cannot create directory '/notes'". envd takes relative paths and ~ from the home of
  // the request's user.
  await t.test('relative and ~ paths are the user\'s home: write, read, list, exists, getInfo, makeDir, rename, watchDir, remove, cwd', async () => {
    const info = await sbx.files.write('notes/a.txt', 'x');
    assert.equal(info.path, '/home/user/notes/a.txt');
    assert.equal(await sbx.files.read('/home/user/notes/a.txt'), 'x');
    assert.equal((await sbx.commands.run('cat ~/notes/a.txt')).stdout, 'x');
    assert.equal(await sbx.files.read('notes/a.txt'), 'x');
    assert.equal(await sbx.files.read('~/notes/a.txt'), 'x');
    assert.deepEqual((await sbx.files.list('notes')).map((e) => e.path), ['/home/user/notes/a.txt']);
    assert.deepEqual((await sbx.files.list('~/notes')).map((e) => e.name), ['a.txt']);
    assert.equal(await sbx.files.exists('~/notes/a.txt'), true);
    assert.equal(await sbx.files.exists('notes/nope'), false);
    assert.equal((await sbx.files.getInfo('notes/a.txt')).path, '/home/user/notes/a.txt');
    assert.equal((await sbx.files.getInfo('~')).path, '/home/user');
    assert.equal(await sbx.files.makeDir('~/notes/sub'), true);
    assert.equal((await sbx.files.getInfo('/home/user/notes/sub')).type, 'dir');
    const moved = await sbx.files.rename('notes/a.txt', '~/notes/sub/b.txt');
    assert.equal(moved.path, '/home/user/notes/sub/b.txt');
    assert.equal((await sbx.commands.run('cat /home/user/notes/sub/b.txt')).stdout, 'x');
    assert.equal((await sbx.commands.run('pwd', { cwd: 'notes/sub' })).stdout, '/home/user/notes/sub\n');
    const events: string[] = [];
    const watcher = await sbx.files.watchDir('notes', (e) => { events.push(`${e.type}:${e.name}`); });
    await sbx.commands.run('touch /home/user/notes/seen.txt');
    await waitFor('a create event for seen.txt', () => Promise.resolve(events.includes('create:seen.txt') ? true : undefined), 10_000);
    await watcher.stop();
    await sbx.files.remove('notes');
    assert.equal(await sbx.files.exists('/home/user/notes'), false);
    // As root, the same relative path is root's home.
    const asRoot = await sbx.files.write('notes/r.txt', 'r', { user: 'root' });
    assert.equal(asRoot.path, '/root/notes/r.txt');
    assert.equal((await sbx.commands.run('cat /root/notes/r.txt', { user: 'root' })).stdout, 'r');
    assert.equal((await sbx.commands.run('echo "$HOME $USER"; cat ~/notes/r.txt', { user: 'root' })).stdout, '/root root\nr', 'a command as root has root\'s home, as under envd');
    assert.equal(await sbx.files.read('~/notes/r.txt', { user: 'root' }), 'r');
    assert.equal(await sbx.files.exists('/home/user/notes/r.txt'), false);
    // ~name is refused, as envd refuses it.
    await assert.rejects(sbx.files.read('~root/notes/r.txt', { user: 'root' }), e2bLatest.InvalidArgumentError);
  });

  await t.test('watchDir sees a file created and written by a command', async () => {
    await sbx.files.makeDir('/tmp/watched');
    const events: string[] = [];
    const watcher = await sbx.files.watchDir('/tmp/watched', (e) => { events.push(`${e.type}:${e.name}`); });
    await sbx.commands.run('echo x > /tmp/watched/new.txt');
    await waitFor('a create event for new.txt', () => Promise.resolve(events.some((e) => e.endsWith(':new.txt')) ? true : undefined), 10_000);
    await watcher.stop();
    assert.ok(events.includes('create:new.txt'), events.join(','));
  });

  await t.test('signed upload and download URLs work with plain fetch', async () => {
    const up = await sbx.uploadUrl('/tmp/up.txt');
    const form = new FormData();
    form.append('file', new Blob(['uploaded by url']), 'up.txt');
    const posted = await fetch(viaEdge(up, system.edgeUrl, sbx.sandboxId), { method: 'POST', body: form, headers: e2bHeaders(sbx.sandboxId) });
    assert.equal(posted.status, 200, await posted.text());
    const down = await sbx.downloadUrl('/tmp/up.txt');
    const got = await fetch(viaEdge(down, system.edgeUrl, sbx.sandboxId), { headers: e2bHeaders(sbx.sandboxId) });
    assert.equal(await got.text(), 'uploaded by url');
  });

  await t.test('pause hibernates; connect wakes it, and with auto_resume so does the next command, with files intact', async () => {
    await sbx.files.write('/home/user/kept.txt', 'survives pause');
    assert.equal(await sbx.pause(), true);
    assert.equal((await Sandbox.getInfo(sbx.sandboxId, opts)).state, 'paused');
    // Created without auto_resume: as on E2B, a command does not wake it (502, "not running").
    await assert.rejects(sbx.commands.run('true'));
    assert.equal((await Sandbox.getInfo(sbx.sandboxId, opts)).state, 'paused');
    const again = await Sandbox.connect(sbx.sandboxId, opts);
    assert.equal((await Sandbox.getInfo(sbx.sandboxId, opts)).state, 'running');
    assert.equal(await again.files.read('/home/user/kept.txt'), 'survives pause');
    assert.equal((await again.commands.run('cat /home/user/kept.txt')).stdout, 'survives pause');
    // Auto-resume: a sandbox created with it, paused, is woken by the next envd call through the router's hold.
    const auto = await Sandbox.create('base', { ...opts, lifecycle: { onTimeout: 'pause', autoResume: true } });
    t.after(() => Sandbox.kill(auto.sandboxId, opts).catch(() => false));
    await auto.files.write('/home/user/kept.txt', 'survives pause');
    assert.equal(await auto.pause(), true);
    assert.equal((await Sandbox.getInfo(auto.sandboxId, opts)).state, 'paused');
    assert.equal((await auto.commands.run('cat /home/user/kept.txt')).stdout, 'survives pause', 'the first call after a pause is held until the sandbox runs');
    assert.equal((await Sandbox.getInfo(auto.sandboxId, opts)).state, 'running');
  });

  await t.test('kill, then every call names the sandbox as not found', async () => {
    assert.equal(await sbx.kill(), true);
    assert.equal(await Sandbox.kill(sbx.sandboxId, opts), false);
    await assert.rejects(Sandbox.connect(sbx.sandboxId, opts), SandboxNotFoundError);
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId, opts), SandboxNotFoundError);
    await assert.rejects(sbx.commands.run('true'), SandboxNotFoundError);
    assert.equal(await sbx.isRunning(), false);
  });
});

test('the E2B SDK 2.50 runs commands and moves files through the edge', async (t) => {
  const system = await startTestSystem('e2bo', 194, 'local', 1);
  t.after(() => system.cleanup());
  const { Sandbox } = e2b250 as unknown as Sdk;
  const opts = { apiUrl: system.edgeUrl, sandboxUrl: system.edgeUrl, apiKey: system.adminKey };
  const sbx = await Sandbox.create('base', opts);
  t.after(() => sbx.kill().catch(() => false));
  assert.equal((await sbx.commands.run('echo old-sdk')).stdout, 'old-sdk\n');
  await sbx.files.write('/tmp/f.txt', 'from 2.50');
  assert.equal(await sbx.files.read('/tmp/f.txt'), 'from 2.50');
});

test('the E2B SDK with only E2B_DOMAIN and a test CA: the API at https://api.<domain>, envd at https://49983-<id>.<domain> over HTTP/2', async (t) => {
  const system = await startTestSystem('e2bt', 219, 'local', 1, true);
  t.after(() => system.cleanup());
  const tlsPort = new URL(system.edgeTlsUrl ?? '').port;
  const child = spawnSync(process.execPath, [join(import.meta.dirname, 'support', 'e2b-https-client.ts')], {
    env: { ...process.env, NODE_EXTRA_CA_CERTS: system.caCertPath, E2B_API_KEY: system.adminKey, E2B_DOMAIN: `asb.localhost:${tlsPort}`, E2B_API_URL: '', E2B_SANDBOX_URL: '' },
    encoding: 'utf8',
    timeout: 60_000,
  });
  assert.equal(child.status, 0, `client failed:\n${child.stderr}`);
  const seen = JSON.parse(child.stdout) as { id: string; stdout: string; read: string; host: string; listed: string[]; killed: boolean };
  assert.equal(seen.stdout, `https ${seen.id}\n`, 'the create envs and the sandbox hostname');
  assert.equal(seen.read, 'h2 host routing');
  assert.equal(seen.host, `49983-${seen.id}.asb.localhost:${tlsPort}`);
  assert.ok(seen.listed.includes(seen.id));
  assert.equal(seen.killed, true);
  // Envoy's access log: the API by api.<domain>, envd by host routing, envd calls over HTTP/2.
  type Line = { authority: string; protocol: string; path: string; status: number };
  const log = await waitFor('the DELETE in the access log', () => {
    const lines = readFileSync(system.envoy.accessLogPath, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Line);
    return Promise.resolve(lines.some((l) => l.path === `/sandboxes/${seen.id}`) ? lines : undefined);
  }, 10_000);
  assert.ok(log.some((l) => l.authority === `api.asb.localhost:${tlsPort}` && l.path === '/v2/sandboxes' && l.status === 201), 'create at api.<domain>');
  const envd = log.filter((l) => l.authority === `49983-${seen.id}.asb.localhost:${tlsPort}`);
  assert.ok(envd.some((l) => l.path === '/process.Process/Start' && l.status === 200), 'commands.run by host');
  assert.ok(envd.length > 0 && envd.every((l) => l.protocol === 'HTTP/2'), `HTTP/2: ${JSON.stringify(envd.map((l) => l.protocol))}`);
});

/** With sandboxUrl set, the SDK signs URLs on that address: the edge, reached with E2B's headers. */
function viaEdge(url: string, edgeUrl: string, id: string): string {
  const u = new URL(url);
  assert.equal(u.origin, edgeUrl, `the signed URL is on the edge (for ${id})`);
  assert.ok(u.searchParams.get('signature')?.startsWith('v1_'), 'signed');
  return url;
}

function e2bHeaders(id: string): Record<string, string> {
  return { 'e2b-sandbox-id': id, 'e2b-sandbox-port': '49983' };
}
