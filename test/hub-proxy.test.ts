// The hub's proxy to the owning worker: per-sandbox REST calls (bodies and query strings both
// ways) and terminal WebSockets, through a real hub in front of a real worker process (own
// bridge asbhpxa, subnet 10.251.0.0/16), plus a registered cluster that never connects.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { WebSocket, WebSocketServer } from 'ws';
import { ClusterType } from '../src/api/hub-contract.ts';
import { startHub } from '../src/hub/hub.ts';
import { parseHubConfig } from '../src/hub/hub-config.ts';
import type { FederationView } from '../src/hub/routes-federation.ts';
import { proxiedSandboxId } from '../src/hub/sandbox-proxy.ts';
import { createTerminalProxy, terminalSandboxId } from '../src/hub/terminal-proxy.ts';
import { openSqliteStore } from '../src/store/sqlite.ts';
import { freePort } from '../src/assembly/local-system.ts';
import { silentLogger } from '../src/base/log.ts';
import { TERMINAL_CLOSE, TERMINAL_HIGH_WATER_BYTES, type TerminalServerControl, type TerminalTokenView } from '../src/terminal/contract.ts';
import { waitFor, within } from './support/wait.ts';
import { call, type ApiResponse } from './support/worker-fixture.ts';
import { removeDataDir, startWorkerProcess } from './support/worker-process.ts';

test('proxy paths: which hub paths go to a worker', () => {
  assert.equal(proxiedSandboxId('/v1/sandboxes/abcd0123456789abcdef'), 'abcd0123456789abcdef');
  assert.equal(proxiedSandboxId('/v1/sandboxes/abcd0123456789abcdef/files/list'), 'abcd0123456789abcdef');
  assert.equal(proxiedSandboxId('/v1/sandboxes'), undefined, 'the list and create stay at the hub');
  assert.equal(proxiedSandboxId('/v1/sandboxes/'), undefined);
  assert.equal(proxiedSandboxId('/v1/templates/x'), undefined);
  assert.equal(terminalSandboxId('/v1/sandboxes/abcd0123456789abcdef/terminal'), 'abcd0123456789abcdef');
  assert.equal(terminalSandboxId('/v1/sandboxes/abcd0123456789abcdef/terminal-tokens'), undefined);
  assert.equal(terminalSandboxId('/v1/sandboxes/abcd0123456789abcdef/terminal/x'), undefined);
});

interface Problem {
  code: string;
  detail: string;
}

interface Session {
  ws: WebSocket;
  /** Everything the PTY printed so far. */
  output: () => string;
  controls: TerminalServerControl[];
  closed: Promise<{ code: number; reason: string }>;
}

/** Opens a terminal at the hub; resolves with the session, or rejects with the refusal's status and body. */
function openTerminal(url: string, headers: Record<string, string> = {}): Promise<Session> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { headers });
    let out = '';
    const controls: TerminalServerControl[] = [];
    const closed = new Promise<{ code: number; reason: string }>((r) => ws.on('close', (code, reason) => r({ code, reason: reason.toString() })));
    ws.on('message', (data: Buffer, isBinary) => {
      if (isBinary) out += data.toString('utf8');
      else controls.push(JSON.parse(data.toString('utf8')) as TerminalServerControl);
    });
    ws.on('unexpected-response', (_req, res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => reject(Object.assign(new Error(`refused ${res.statusCode ?? 0}`), { status: res.statusCode, body, cluster: res.headers['x-asb-cluster'] })));
    });
    ws.on('error', reject);
    ws.on('open', () => resolve({ ws, output: () => out, controls, closed }));
  });
}

async function refusal(p: Promise<Session>): Promise<{ status: number; body: string; cluster?: string }> {
  try {
    const s = await p;
    s.ws.terminate();
  } catch (err) {
    return err as { status: number; body: string; cluster?: string };
  }
  throw new Error('the terminal opened; a refusal was expected');
}

test('the hub proxies sandbox calls and terminals to the owning worker', { timeout: 240_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-hub-proxy-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const hub = await startHub(parseHubConfig(['--data-dir', join(dir, 'hub'), '--port', '0', '--admin-key-file', join(dir, 'admin.key')], {}), { log: silentLogger() });
  t.after(() => hub.close());
  const admin = hub.adminKey ?? '';
  const hubCall = (method: string, path: string, opts: { json?: unknown; body?: string; key?: string; headers?: Record<string, string> } = {}): Promise<ApiResponse> => call(hub, method, path, { key: admin, ...opts });

  const registered = await hubCall('PUT', '/v1/clusters/hpx', { json: { region: 'east', tag: 'hpxa', ingressAddress: '127.0.0.1:10251' } });
  assert.equal(registered.status, 201, registered.text);
  writeFileSync(join(dir, 'hpx.credential'), `${(registered.json as { credential: string }).credential}\n`, { mode: 0o600 });
  // A cluster that is registered but never connects: its sandboxes are unreachable, not unknown.
  const away = await hubCall('PUT', '/v1/clusters/hpx-away', { json: { region: 'west', tag: 'hpxw', ingressAddress: '127.0.0.1:10252', apiUrl: `http://127.0.0.1:${await freePort()}` } });
  assert.equal(away.status, 201, away.text);

  const worker = await startWorkerProcess({ clusterTag: 'hpxa', subnetOctet: 251, basePool: 1, extraArgs: ['--cluster', 'hpx', '--hub-url', hub.url, '--hub-credential-file', join(dir, 'hpx.credential')] });
  t.after(async () => {
    await worker.stop();
    removeDataDir(worker.dataDir);
  });
  assert.equal((await hubCall('PUT', '/v1/clusters/hpx', { json: { apiUrl: worker.apiUrl } })).status, 200);

  // GET /v1/federation: health, lag and pools for any key, and no addresses.
  const fed = await waitFor('hpx healthy with its base pool ready in /v1/federation', async () => {
    const view = (await hubCall('GET', '/v1/federation')).json as FederationView;
    const c = view.clusters.find((x) => x.name === 'hpx');
    return c?.health === 'healthy' && c.pools['default/base']?.ready === 1 ? view : undefined;
  });
  const hpx = fed.clusters.find((c) => c.name === 'hpx');
  assert.deepEqual(hpx?.pools['default/base'], { ready: 1, desired: 1, template: 'base' });
  assert.equal(hpx.lag, 0, 'the worker applied everything');
  assert.equal(fed.clusters.find((c) => c.name === 'hpx-away')?.health, 'down');
  assert.doesNotMatch(JSON.stringify(fed), /apiUrl|ingress|credential|127\.0\.0\.1/, 'no addresses or credentials');
  assert.equal((await hubCall('GET', '/v1/federation', { key: 'asb_nothere_00000000000000000000000000000000' })).status, 401);

  const created = await hubCall('POST', '/v1/sandboxes', { json: { template: 'base' } });
  assert.equal(created.status, 201, created.text);
  const id = (created.json as { id: string }).id;
  assert.ok(id.startsWith('hpxa'), id);

  await t.test('a GET reaches the worker and its answer comes back as it is, naming the cluster', async () => {
    const res = await hubCall('GET', `/v1/sandboxes/${id}`);
    assert.equal(res.status, 200, res.text);
    assert.equal((res.json as { id: string }).id, id);
    assert.equal(res.headers.get('x-asb-cluster'), 'hpx');
  });

  await t.test('bodies and query strings go through both ways (a file written and read back)', async () => {
    const content = `through the hub ${'x'.repeat(100_000)}\n`;
    const put = await hubCall('PUT', `/v1/sandboxes/${id}/files?path=${encodeURIComponent('/tmp/hub.txt')}`, { body: content, headers: { 'content-type': 'application/octet-stream' } });
    assert.ok(put.status < 300, `${put.status} ${put.text}`);
    const got = await hubCall('GET', `/v1/sandboxes/${id}/files?path=${encodeURIComponent('/tmp/hub.txt')}`);
    assert.equal(got.status, 200, got.text);
    assert.equal(got.text, content);
    const exec = await hubCall('POST', `/v1/sandboxes/${id}/exec`, { json: { command: 'echo exec-$((6*7))' } });
    assert.equal(exec.status, 200, exec.text);
    assert.match(exec.text, /exec-42/);
  });

  await t.test("the worker's refusals pass through (404 for another team's or a missing id)", async () => {
    const res = await hubCall('GET', `/v1/sandboxes/hpxa0000000000000000`);
    assert.equal(res.status, 404);
    assert.equal(res.headers.get('x-asb-cluster'), 'hpx', 'the 404 came from the worker');
    assert.match((res.json as Problem).detail, /hpxa0000000000000000/);
  });

  await t.test('a bad key is refused at the hub with 401', async () => {
    const res = await hubCall('GET', `/v1/sandboxes/${id}`, { key: 'asb_nothere_00000000000000000000000000000000' });
    assert.equal(res.status, 401);
    assert.equal(res.headers.get('x-asb-cluster'), null, 'no worker was asked');
    assert.match((res.json as Problem).detail, /hub/);
  });

  await t.test('an id whose tag no cluster has is 404 naming the id; an id with no tag too', async () => {
    const unknown = await hubCall('GET', '/v1/sandboxes/zzzz0000000000000000');
    assert.equal(unknown.status, 404);
    assert.match((unknown.json as Problem).detail, /zzzz0000000000000000.*"zzzz"/);
    const untagged = await hubCall('POST', '/v1/sandboxes/my-box/pause');
    assert.equal(untagged.status, 404);
    assert.match((untagged.json as Problem).detail, /my-box/);
  });

  await t.test('a sandbox of a cluster that is not connected is 503 naming the cluster', async () => {
    const res = await hubCall('DELETE', '/v1/sandboxes/hpxw0000000000000000');
    assert.equal(res.status, 503);
    assert.match((res.json as Problem).detail, /"hpx-away"/);
    const term = await refusal(openTerminal(`${hub.url.replace('http', 'ws')}/v1/sandboxes/hpxw0000000000000000/terminal`, { authorization: `Bearer ${admin}` }));
    assert.equal(term.status, 503);
    assert.match(term.body, /hpx-away/);
  });

  const wsBase = hub.url.replace('http', 'ws');

  await t.test('a terminal through the hub: ready, echo, resize, exit code and close code', async () => {
    const s = await openTerminal(`${wsBase}/v1/sandboxes/${id}/terminal?cols=80&rows=24`, { authorization: `Bearer ${admin}` });
    await waitFor('the ready frame', () => Promise.resolve(s.controls.find((c) => c.type === 'ready')), 30_000, 20);
    assert.deepEqual(s.controls[0], { type: 'ready', sandboxId: id, cluster: 'hpx' });
    s.ws.send(Buffer.from('echo hub-$((6*7))\n'), { binary: true });
    await waitFor('hub-42 in the output', () => Promise.resolve(s.output().includes('hub-42') ? true : undefined), 30_000, 20);
    s.ws.send(JSON.stringify({ type: 'resize', cols: 91, rows: 33 }));
    s.ws.send(Buffer.from('stty size\n'), { binary: true });
    await waitFor('the new size in the output', () => Promise.resolve(s.output().includes('33 91') ? true : undefined), 30_000, 20);
    s.ws.send(Buffer.from('exit 7\n'), { binary: true });
    const { code } = await s.closed;
    assert.deepEqual(s.controls.at(-1), { type: 'exit', code: 7 });
    assert.equal(code, 1000, 'the worker closed with normal after exit, and the hub passed it on');
  });

  await t.test('a terminal token through the hub works once; the used token is refused with the same 401', async () => {
    const issued = await hubCall('POST', `/v1/sandboxes/${id}/terminal-tokens`, { json: {} });
    assert.equal(issued.status, 201, issued.text);
    const token = issued.json as TerminalTokenView;
    const url = `${wsBase}/v1/sandboxes/${id}/terminal?token=${encodeURIComponent(token.token)}`;
    const s = await openTerminal(url);
    await waitFor('the ready frame', () => Promise.resolve(s.controls.find((c) => c.type === 'ready')), 30_000, 20);
    s.ws.close(1000);
    await s.closed;
    const again = await refusal(openTerminal(url));
    assert.equal(again.status, 401, 'the worker refused the used token, and the client got its status');
    assert.equal(again.cluster, 'hpx');
    assert.equal((JSON.parse(again.body) as Problem).code, 'Unauthorized');
    const bad = await refusal(openTerminal(`${wsBase}/v1/sandboxes/${id}/terminal?token=nonsense`));
    assert.equal(bad.status, 401);
    const none = await refusal(openTerminal(`${wsBase}/v1/sandboxes/${id}/terminal`));
    assert.equal(none.status, 401, 'no key and no token: refused at the hub');
    const badSize = await refusal(openTerminal(`${wsBase}/v1/sandboxes/${id}/terminal?cols=0`, { authorization: `Bearer ${admin}` }));
    assert.equal(badSize.status, 400, "the worker's 400 for a bad size");
  });

  await t.test('pause and resume through the proxy; a paused sandbox refuses a terminal with 409', async () => {
    const paused = await hubCall('POST', `/v1/sandboxes/${id}/pause`);
    assert.ok(paused.status < 300, `${paused.status} ${paused.text}`);
    await waitFor('the sandbox paused', async () => {
      const phase = ((await hubCall('GET', `/v1/sandboxes/${id}`)).json as { phase: string }).phase;
      return phase === 'Running' ? undefined : phase;
    });
    const refused = await refusal(openTerminal(`${wsBase}/v1/sandboxes/${id}/terminal`, { authorization: `Bearer ${admin}` }));
    assert.equal(refused.status, 409, refused.body);
    const resumed = await hubCall('POST', `/v1/sandboxes/${id}/resume`);
    assert.ok(resumed.status < 300, `${resumed.status} ${resumed.text}`);
  });

  await t.test('a hub shutting down closes the terminals it relays with 1001 (going away)', async () => {
    await waitFor('the sandbox running again', async () => (((await hubCall('GET', `/v1/sandboxes/${id}`)).json as { phase: string }).phase === 'Running' ? true : undefined));
    const s = await openTerminal(`${wsBase}/v1/sandboxes/${id}/terminal`, { authorization: `Bearer ${admin}` });
    await waitFor('the ready frame', () => Promise.resolve(s.controls.find((c) => c.type === 'ready')), 30_000, 20);
    await hub.close();
    const closed = await s.closed;
    assert.equal(closed.code, 1001);
  });
});

test('terminal proxy backpressure: a client that stops reading stops the hub reading the worker; all bytes arrive once it reads again', { timeout: 60_000 }, async (t) => {
  // A worker stand-in that floods the terminal with output as fast as its socket takes it.
  const total = 64 * 1024 * 1024;
  const chunk = Buffer.alloc(64 * 1024, 0x61);
  // Sent = handed to the kernel: the next chunk goes only when the last one was written.
  let sent = 0;
  const hubPort = await startProxyRig(t, 'bp', { verify: () => ({ team: 't', admin: true, prefix: 'asb_x' }), live: () => true, onRevoked: () => () => undefined }, (ws) => {
    const next = (): void => {
      if (sent >= total || ws.readyState !== WebSocket.OPEN) return;
      ws.send(chunk, { binary: true }, (err) => {
        if (err instanceof Error) return; // node passes null on success, not undefined
        sent += chunk.byteLength;
        next();
      });
    };
    next();
  });
  const client = new WebSocket(`ws://127.0.0.1:${hubPort}/v1/sandboxes/bpbp0000000000000000/terminal`, { headers: { authorization: 'Bearer asb_x_y' } });
  let received = 0;
  client.on('message', (data: Buffer) => (received += data.byteLength));
  await new Promise<void>((r) => client.once('open', () => r()));
  client.pause();
  // The hub stops reading the worker once the client's buffer is over the mark, so the worker
  // stalls after the high-water mark plus what the kernel's socket buffers hold (a few MiB on
  // loopback); without backpressure the hub would read all 64 MiB into its own memory.
  let last = -1;
  let still = 0;
  await waitFor('the worker to stop making progress', () => {
    still = sent === last ? still + 1 : 0;
    last = sent;
    return Promise.resolve(still >= 25 || sent >= total ? true : undefined);
  }, 30_000, 20);
  assert.ok(sent < total / 2, `the worker got ${sent} of ${total} bytes out while the client read nothing`);
  assert.ok(received < TERMINAL_HIGH_WATER_BYTES * 4, `the paused client got ${received} bytes`);
  client.resume();
  await waitFor('every byte at the client', () => Promise.resolve(received === total ? true : undefined), 30_000, 20);
  client.close();
});

test('terminal proxy: a key revoked at the hub closes the sessions it opened at once (4003), cutting the worker side, before any worker hears of it', async (t) => {
  // A worker stand-in that never closes a session itself and records what reaches it.
  const workerSides: { ws: WebSocket; closed: Promise<void>; input: string[] }[] = [];
  // Keys asb_aaaaaaaa_… and asb_bbbbbbbb_…, each its own prefix; a revocation is announced by hand.
  const revoked = new Set<string>();
  let announce: (prefix: string) => void = () => undefined;
  const auth = {
    verify: (presented: string) => ({ team: 't', admin: true, prefix: presented.slice(0, 12) }),
    live: (prefix: string) => !revoked.has(prefix),
    onRevoked: (listener: (prefix: string) => void) => {
      announce = listener;
      return () => undefined;
    },
  };
  const hubPort = await startProxyRig(t, 'rv', auth, (ws) => {
    const input: string[] = [];
    ws.on('message', (data: Buffer) => input.push(data.toString('utf8')));
    workerSides.push({ ws, input, closed: new Promise((resolve) => ws.once('close', () => resolve())) });
  });
  const open = async (key: string): Promise<{ ws: WebSocket; closed: Promise<{ code: number; reason: string }> }> => {
    const ws = new WebSocket(`ws://127.0.0.1:${hubPort}/v1/sandboxes/rvrv0000000000000000/terminal`, { headers: { authorization: `Bearer ${key}` } });
    const closed = new Promise<{ code: number; reason: string }>((resolve) => ws.once('close', (code, reason) => resolve({ code, reason: reason.toString() })));
    await new Promise<void>((r) => ws.once('open', () => r()));
    return { ws, closed };
  };
  const doomed = await open('asb_aaaaaaaa_secret');
  const kept = await open('asb_bbbbbbbb_secret');
  await waitFor('both worker sides', () => Promise.resolve(workerSides.length === 2 ? true : undefined), 10_000, 10);
  revoked.add('asb_aaaaaaaa');
  announce('asb_aaaaaaaa');
  const closed = await within('the revoked session to close', doomed.closed, 5_000);
  assert.deepEqual([closed.code, /revoked/.test(closed.reason)], [TERMINAL_CLOSE.keyRevoked, true], JSON.stringify(closed));
  await within("the revoked session's worker side to be cut", workerSides[0]?.closed ?? Promise.reject(new Error('no worker side')), 5_000);
  // The other key's session still relays.
  kept.ws.send(Buffer.from('typed'), { binary: true });
  await waitFor('input from the other session', () => Promise.resolve(workerSides[1]?.input.includes('typed') === true ? true : undefined), 5_000, 10);
  assert.equal(kept.ws.readyState, WebSocket.OPEN);
  // A key revoked while the worker was answering: the session is closed as soon as it opens.
  revoked.add('asb_bbbbbbbb');
  const late = await open('asb_bbbbbbbb_secret');
  assert.equal((await within('the late session to close', late.closed, 5_000)).code, TERMINAL_CLOSE.keyRevoked);
  kept.ws.close();
});

/**
 * A hub terminal proxy in front of a worker stand-in: cluster `name` (tag `<name><name>`) at the
 * stand-in's address, every session reaching `onSession`. Returns the hub's port.
 */
async function startProxyRig(t: TestContext, name: string, auth: Parameters<typeof createTerminalProxy>[0]['auth'], onSession: (ws: WebSocket) => void): Promise<number> {
  const dir = mkdtempSync(join(tmpdir(), `asb-hub-proxy-${name}-`));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const workerServer = createHttpServer();
  const workerWss = new WebSocketServer({ server: workerServer });
  workerWss.on('connection', onSession);
  await new Promise<void>((r) => workerServer.listen(0, '127.0.0.1', r));
  t.after(() => {
    workerWss.close();
    workerServer.closeAllConnections();
    workerServer.close();
  });
  const store = await openSqliteStore({ path: join(dir, 'hub.db') });
  t.after(() => store.close());
  const apiUrl = `http://127.0.0.1:${(workerServer.address() as AddressInfo).port}`;
  await store.create(ClusterType, { apiVersion: 'asb.dev/v1alpha1', kind: 'Cluster', metadata: { name }, spec: { region: 'r', ingressAddress: '127.0.0.1:1', tag: `${name}${name}`, credentialHash: 'x', apiUrl } });
  const sync = { version: () => 0, connections: () => [], live: () => new Map([[name, { healthy: true, templates: {}, heartbeatAt: 0, pools: {} }]]), onAck: () => () => undefined };
  const proxy = createTerminalProxy({ store, sync, auth, log: silentLogger() });
  const hubServer = createHttpServer();
  hubServer.on('upgrade', (req, socket, head) => proxy.upgrade(req, socket, head));
  await new Promise<void>((r) => hubServer.listen(0, '127.0.0.1', r));
  t.after(async () => {
    await proxy.close();
    hubServer.closeAllConnections();
    hubServer.close();
  });
  return (hubServer.address() as AddressInfo).port;
}
