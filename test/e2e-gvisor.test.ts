// The whole local system with a gVisor template: a worker, the router and a real Envoy, and a
// template whose pod has `runtimeClassName: gvisor`, driven by the unmodified E2B SDK and by plain
// HTTP through the edge, as a user would. What works on runc must work here: commands with
// streaming output, the pty, files, envd's HTTP endpoints and metrics, idle hibernation and the
// wake on the first connection, with the writable layer and the volume kept. One system for the
// file (its own bridge asbgve1 and subnet 10.212.0.0/16), reused by every subtest.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as e2b from 'e2b';
import { baseTemplate } from '../src/api/builtin.ts';
import type { SandboxTemplate } from '../src/api/types.ts';
import { startTestSystem } from './support/local-system.ts';
import { checkPtyRoundTrip } from './support/e2b-pty.ts';
import { waitFor } from './support/wait.ts';
import { edgeGet } from './support/web-sandbox.ts';
import { openTerminal } from './support/terminal-client.ts';
import { api, type ExecOut } from './support/worker-process.ts';

const MiB = 2 ** 20;

interface View {
  id: string;
  phase: string;
  ready: boolean;
  accessToken: string;
}

/**
 * The built-in `base` template (its home directory a volume) under gVisor, its main process a web
 * server over `/` on 8080 so a plain GET through Envoy can read what the sandbox wrote, and wake it.
 */
function gvisorTemplate(name: string, idleTimeoutMs?: number): SandboxTemplate {
  const t = baseTemplate();
  const main = t.spec.podTemplate.spec.containers[0];
  assert.ok(main !== undefined);
  main.command = ['python3', '-m', 'http.server', '8080', '--directory', '/'];
  main.ports = [...(main.ports ?? []), { containerPort: 8080 }];
  main.readinessProbe = { tcpSocket: { port: 8080 }, periodSeconds: 1 };
  t.spec.podTemplate.spec.runtimeClassName = 'gvisor';
  t.metadata.name = name;
  if (idleTimeoutMs !== undefined) t.spec.idleTimeoutMs = idleTimeoutMs;
  return t;
}

test('a gVisor template end to end: the E2B SDK, envd, metrics, idle hibernation and wake through Envoy, with the writable layer and the volume kept', async (t) => {
  const system = await startTestSystem('gve1', 212);
  t.after(() => system.cleanup());
  // gv: no idle timeout (the SDK subtests must not see it hibernate under them); gvidle: 1.5 s.
  const applied = await api(system, 'POST', '/v1/apply', { objects: [gvisorTemplate('gv'), gvisorTemplate('gvidle', 1500)] });
  assert.equal(applied.status, 200, JSON.stringify(applied.body));
  const { Sandbox, CommandExitError } = e2b;
  const opts = { apiUrl: system.edgeUrl, sandboxUrl: system.edgeUrl, apiKey: system.adminKey };

  const sbx = await Sandbox.create('gv', { ...opts, envs: { GREETING: 'hello from gVisor' } });
  t.after(() => Sandbox.kill(sbx.sandboxId, opts).catch(() => false));

  await t.test('the sandbox runs on gVisor\'s kernel', async () => {
    const out = await sbx.commands.run('uname -r');
    assert.match(out.stdout, /gvisor/, 'gVisor\'s kernel, not the host\'s');
  });

  await t.test('commands: output streams as it is written, stderr, exit codes, envs, a background command with stdin', async () => {
    const out = await sbx.commands.run('echo "$GREETING"; echo "$ONE" >&2; pwd', { envs: { ONE: 'one' }, cwd: '/tmp' });
    assert.deepEqual([out.exitCode, out.stdout, out.stderr], [0, 'hello from gVisor\n/tmp\n', 'one\n']);
    // Streaming: the first line reaches onStdout while the command still runs (it waits on a file
    // this test writes only after seeing that line).
    const seen: string[] = [];
    const running = sbx.commands.run('echo first; for i in $(seq 600); do [ -e /tmp/go ] && break; sleep 0.05; done; echo second', { onStdout: (d) => { seen.push(d); } });
    await waitFor('the first line before the command ends', () => Promise.resolve(seen.join('').includes('first') ? true : undefined), 10_000);
    assert.equal(seen.join(''), 'first\n', 'the second line is not written yet');
    await sbx.files.write('/tmp/go', '');
    assert.equal((await running).stdout, 'first\nsecond\n');
    const err = await sbx.commands.run('echo partial; exit 7').then(() => undefined, (e: unknown) => e);
    assert.ok(err instanceof CommandExitError, `got ${String(err)}`);
    assert.deepEqual([err.exitCode, err.stdout], [7, 'partial\n']);
    const handle = await sbx.commands.run('read line; echo "got:$line"; sleep 600', { background: true, stdin: true });
    await sbx.commands.sendStdin(handle.pid, 'ping\n');
    await waitFor('the echo of stdin', () => Promise.resolve(handle.stdout.includes('got:ping') ? true : undefined), 10_000);
    assert.equal(await sbx.commands.kill(handle.pid), true);
    assert.ok(await handle.wait().then(() => undefined, (e: unknown) => e) instanceof CommandExitError, 'a killed command ends with an error');
    assert.equal((await sbx.commands.list()).some((p) => p.pid === handle.pid), false, 'gone from the list');
  });

  await t.test('pty: a terminal with a size, input and resize', async () => {
    await checkPtyRoundTrip(sbx.pty);
  });

  await t.test('files: write, read, list, rename, remove, watchDir', async () => {
    await sbx.files.write('/home/user/project/a.txt', 'alpha');
    assert.equal(await sbx.files.read('/home/user/project/a.txt'), 'alpha');
    await sbx.files.write([{ path: '/home/user/project/b.bin', data: new Uint8Array([0, 1, 2, 255]).buffer }]);
    assert.deepEqual([...await sbx.files.read('/home/user/project/b.bin', { format: 'bytes' })], [0, 1, 2, 255]);
    assert.deepEqual((await sbx.files.list('/home/user/project')).map((e) => e.name).sort(), ['a.txt', 'b.bin']);
    assert.equal((await sbx.files.rename('/home/user/project/a.txt', '/home/user/project/c.txt')).path, '/home/user/project/c.txt');
    assert.equal((await sbx.files.getInfo('/home/user/project/c.txt')).size, 5);
    const events: string[] = [];
    const watcher = await sbx.files.watchDir('/home/user/project', (e) => { events.push(`${e.type}:${e.name}`); });
    await sbx.commands.run('echo x > /home/user/project/new.txt');
    await waitFor('a create event for new.txt', () => Promise.resolve(events.includes('create:new.txt') ? true : undefined), 10_000);
    await watcher.stop();
    await sbx.files.remove('/home/user/project');
    assert.equal(await sbx.files.exists('/home/user/project'), false);
  });

  await t.test('envd over HTTP: /health, and /files by signed URLs with plain fetch', async () => {
    const headers = { 'e2b-sandbox-id': sbx.sandboxId, 'e2b-sandbox-port': '49983' };
    assert.equal((await fetch(`${system.edgeUrl}/health`, { headers })).status, 204);
    assert.equal(await sbx.isRunning(), true);
    const form = new FormData();
    form.append('file', new Blob(['uploaded by url']), 'up.txt');
    const posted = await fetch(await sbx.uploadUrl('/tmp/up.txt'), { method: 'POST', body: form, headers });
    assert.equal(posted.status, 200, await posted.text());
    assert.equal(await (await fetch(await sbx.downloadUrl('/tmp/up.txt'), { headers })).text(), 'uploaded by url');
  });

  await t.test('the REST API through the edge: exec, the files API, and a terminal', async () => {
    const viaEdge = { apiUrl: system.edgeUrl, adminKey: system.adminKey };
    const out = await api<ExecOut>(viaEdge, 'POST', `/v1/sandboxes/${sbx.sandboxId}/exec`, { command: 'echo out; echo err >&2; exit 4' });
    assert.deepEqual([out.status, out.body.stdout, out.body.stderr, out.body.exitCode], [200, 'out\n', 'err\n', 4]);
    const auth = { authorization: `Bearer ${system.adminKey}` };
    const file = `${system.edgeUrl}/v1/sandboxes/${sbx.sandboxId}/files?path=/home/user/rest.txt`;
    const put = await fetch(file, { method: 'PUT', headers: { ...auth, 'content-type': 'application/octet-stream' }, body: 'by the files API' });
    assert.equal(put.status, 204);
    assert.equal(await (await fetch(file, { headers: auth })).text(), 'by the files API');
    const term = await openTerminal(system.edgeUrl, sbx.sandboxId, { key: system.adminKey, cols: 90, rows: 20 });
    term.send('stty size; uname -r; exit 6\r');
    await term.waitFor(/20 90\r?\n[^\n]*gvisor/);
    assert.equal((await term.closed).exitCode, 6);
  });

  // Known wrong before, found here: under gVisor the disk was the host's (/proc/<pid>/root is the
  // sentry's own empty root: 12.6 GB, not the pod's 10 GiB disk) and memory counted twice (the
  // sentry's RSS and its systrap stubs'); under runc memory missed every exec'd process (runc
  // exec's processes are not the init's children: 200 MiB held showed as 2.1 MiB).
  await t.test('getMetrics on both runtime classes: the pod\'s own disk and what it writes there, and the memory its commands hold', async () => {
    const check = async (s: e2b.Sandbox, what: string): Promise<void> => {
      const sample = async (): Promise<e2b.SandboxMetrics> => {
        const got = (await s.getMetrics())[0];
        assert.ok(got !== undefined, `${what}: one sample of the running pod`);
        return got;
      };
      const before = await sample();
      assert.ok(before.diskTotal > 9.5 * 1024 * MiB && before.diskTotal <= 10 * 1024 * MiB, `${what}: the pod's 10 GiB disk, got ${String(before.diskTotal)}`);
      assert.ok(before.memUsed > 0 && before.cpuUsedPct >= 0, `${what}: ${JSON.stringify(before)}`);
      await s.commands.run('head -c 33554432 /dev/urandom > /tmp/big && sync');
      const held = await s.commands.run('python3 -c "import os, time; b = b\'\\x01\' * (200 << 20); open(\'/tmp/held\', \'w\').close(); time.sleep(600)"', { background: true });
      await waitFor(`${what}: 200 MiB held`, async () => ((await s.files.exists('/tmp/held')) ? true : undefined), 20_000, 100);
      const after = await sample();
      await held.kill();
      await s.commands.run('rm /tmp/big /tmp/held');
      assert.ok(after.diskUsed - before.diskUsed >= 30 * MiB, `${what}: 32 MiB written show on its disk: ${String(before.diskUsed)} -> ${String(after.diskUsed)}`);
      const grew = (after.memUsed - before.memUsed) / MiB;
      assert.ok(grew >= 180 && grew <= 300, `${what}: 200 MiB held by a command show once, grew by ${grew.toFixed(1)} MiB`);
    };
    await check(sbx, 'gVisor');
    const runc = await Sandbox.create('base', opts);
    try {
      assert.doesNotMatch((await runc.commands.run('uname -r')).stdout, /gvisor/);
      await check(runc, 'runc');
    } finally {
      await runc.kill();
    }
  });

  await t.test('idle detection hibernates it; the first GET through Envoy wakes it; the writable layer and the volume survive; so does the SDK\'s auto-resume', async () => {
    const created = await api<View>(system, 'POST', '/v1/sandboxes', { template: 'gvidle', wait: true });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const idle = created.body;
    const token = { 'x-access-token': idle.accessToken };
    const host = `8080-${idle.id}.asb.localhost`;
    const idleSbx = await Sandbox.connect(idle.id, opts);
    await idleSbx.files.write('/home/user/kept.txt', 'in the volume');
    await idleSbx.commands.run('echo in the writable layer > /tmp/layer.txt');
    assert.equal((await edgeGet(system.edgeUrl, host, { headers: token, path: '/tmp/layer.txt' })).body, 'in the writable layer\n');

    const hibernated = async (): Promise<void> => {
      await waitFor('idle hibernation', async () => ((await api<View>(system, 'GET', `/v1/sandboxes/${idle.id}`)).body.phase === 'Hibernated' ? true : undefined), 30_000, 100);
    };
    await hibernated();
    const [layer, volume] = await Promise.all([
      edgeGet(system.edgeUrl, host, { headers: token, path: '/tmp/layer.txt', timeoutMs: 28_000 }),
      edgeGet(system.edgeUrl, host, { headers: token, path: '/home/user/kept.txt', timeoutMs: 28_000 }),
    ]);
    assert.deepEqual([layer.status, layer.body], [200, 'in the writable layer\n'], 'the woken server answers, from the kept writable layer');
    assert.deepEqual([volume.status, volume.body], [200, 'in the volume'], 'and from the kept volume');
    assert.match((await idleSbx.commands.run('uname -r')).stdout, /gvisor/, 'woken under gVisor again');

    await hibernated();
    const resumed = await idleSbx.commands.run('cat /tmp/layer.txt /home/user/kept.txt');
    assert.equal(resumed.stdout, 'in the writable layer\nin the volume', 'an envd call wakes it too, through the router\'s hold');
  });
});
