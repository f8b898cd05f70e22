// The data plane end to end, as `make up` runs it: a worker process with real sandboxes, the
// router process fed by the worker's route feed, and a real Envoy in front. Every request here
// goes through Envoy on the edge port, addressed by Host header like a browser or an SDK would.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { request } from 'node:http';
import { connect } from 'node:http2';
import { test, type TestContext } from 'node:test';
import WebSocket from 'ws';
import type { LocalSystem } from '../src/assembly/local-system.ts';
import { startTestSystem } from './support/local-system.ts';
import { edgeGet, slowListenTemplate, startWsEcho, WEB_TEMPLATE, webPool, type EdgeAnswer } from './support/web-sandbox.ts';
import { waitFor } from './support/wait.ts';
import { api } from './support/worker-process.ts';

interface View {
  id: string;
  phase: string;
  ready: boolean;
  accessToken: string;
}

const TAG = 'e2ed';

async function startSystem(t: TestContext): Promise<LocalSystem> {
  const system = await startTestSystem(TAG, 222);
  t.after(() => system.cleanup());
  return system;
}

function viaEdge(system: LocalSystem, host: string, headers: Record<string, string> = {}): Promise<EdgeAnswer> {
  return edgeGet(system.edgeUrl, host, { headers });
}

test('through Envoy: HTTP and WebSocket reach servers in real sandboxes, only with the token, and no client header can redirect', async (t) => {
  const system = await startSystem(t);
  const applied = await api(system, 'POST', '/v1/apply', { objects: [WEB_TEMPLATE, webPool(2)] });
  assert.equal(applied.status, 200, JSON.stringify(applied.body));
  const a = (await api<View>(system, 'POST', '/v1/sandboxes', { template: 'web' })).body;
  const b = (await api<View>(system, 'POST', '/v1/sandboxes', { template: 'web' })).body;
  assert.ok(a.ready && b.ready);

  const host = `8080-${a.id}.asb.localhost`;
  const ok = await viaEdge(system, host, { 'x-access-token': a.accessToken });
  assert.equal(ok.status, 200);
  assert.match(ok.body, /whoami\.txt/, 'the directory listing of the server inside the sandbox');
  const whoami = await viaEdge(system, host, { 'x-access-token': a.accessToken });
  assert.equal(whoami.status, 200);

  const noToken = await viaEdge(system, host);
  assert.equal(noToken.status, 401);
  assert.equal((JSON.parse(noToken.body) as { code: string }).code, 'Unauthorized');
  const wrongToken = await viaEdge(system, host, { 'x-access-token': b.accessToken });
  assert.ok(wrongToken.status === 401 || wrongToken.status === 403, `another sandbox's token is refused (${wrongToken.status})`);

  // Headers a client might forge to reach sandbox b through a's URL: the router strips them.
  const bIp = (await api<{ ip: string }>(system, 'GET', `/v1/sandboxes/${b.id}`)).body.ip;
  const forged = await new Promise<string>((resolve, reject) => {
    const req = request(`${system.edgeUrl}/whoami.txt`, {
      headers: { host, 'x-access-token': a.accessToken, 'x-asb-dst': `${bIp}:8080`, 'x-asb-upstream': 'sandbox', 'e2b-sandbox-id': b.id },
    }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve(body));
    });
    req.on('error', reject);
    req.end();
  });
  assert.equal(forged.trim(), a.id, 'sandbox a answered, not b');

  const unknown = await viaEdge(system, '8080-e2ednosuchsandbox0000.asb.localhost');
  assert.equal(unknown.status, 404);
  const badPort = await viaEdge(system, `99999-${a.id}.asb.localhost`);
  assert.equal(badPort.status, 400);

  // WebSocket: an echo server started inside sandbox a on port 8765.
  await startWsEcho(system, a.id, 8765);
  const ws = new WebSocket(`ws://127.0.0.1:${new URL(system.edgeUrl).port}/`, { headers: { host: `8765-${a.id}.asb.localhost`, 'x-access-token': a.accessToken } });
  t.after(() => ws.terminate());
  await new Promise<void>((resolve, reject) => {
    ws.once('open', () => resolve());
    ws.once('error', reject);
  });
  const echoed = new Promise<string>((resolve) => ws.once('message', (data: Buffer) => resolve(data.toString())));
  ws.send('hello through envoy');
  assert.equal(await echoed, 'hello through envoy');
});

test('wake on first connection: a request to a hibernated sandbox wakes it and gets the answer', async (t) => {
  const system = await startSystem(t);
  await api(system, 'POST', '/v1/apply', { objects: [WEB_TEMPLATE, webPool(1)] });
  const sb = (await api<View>(system, 'POST', '/v1/sandboxes', { template: 'web' })).body;
  const host = `8080-${sb.id}.asb.localhost`;
  assert.equal((await viaEdge(system, host, { 'x-access-token': sb.accessToken })).status, 200);

  await api(system, 'POST', `/v1/sandboxes/${sb.id}/pause`);
  await waitFor('hibernation', async () => {
    const got = await api<View>(system, 'GET', `/v1/sandboxes/${sb.id}`);
    return got.body.phase === 'Hibernated' ? true : undefined;
  });

  // Three requests at once: one wake, all three answered by the woken server.
  const answers = await Promise.all([1, 2, 3].map(() => viaEdge(system, host, { 'x-access-token': sb.accessToken })));
  for (const answer of answers) assert.equal(answer.status, 200, answer.body);
  const after = await api<View>(system, 'GET', `/v1/sandboxes/${sb.id}`);
  assert.equal(after.body.phase, 'Running');
  // The sandbox's lifecycle event says what woke it: the request's host and path.
  const events = await waitFor('the wake\'s event', async () => {
    const got = await api<{ type: string; eventData: Record<string, unknown> | null }[]>(system, 'GET', `/v1/events/sandboxes/${sb.id}?types=sandbox.lifecycle.resumed`);
    return got.status === 200 && got.body.length > 0 ? got.body : undefined;
  });
  assert.equal(events.length, 1, 'three requests, one wake');
  const { trigger, host: wokenBy, path } = events[0]?.eventData ?? {};
  assert.deepEqual([trigger, path], ['request', '/']);
  assert.match(String(wokenBy), new RegExp(`^8080-${sb.id}\\.asb\\.localhost(:\\d+)?$`));
});

// Regression: the router released held requests as soon as the woken pod ran, before its server
// listened, so the first request after a pause got Envoy's 503 "upstream connect error"
// (remote connection failure) and so did every retry for the next ~2 s.
test('wake on first connection, server slower than its pod: each held request gets one 200, never a 503', async (t) => {
  const system = await startSystem(t);
  const applied = await api(system, 'POST', '/v1/apply', { objects: [slowListenTemplate('slow', 1.5)] });
  assert.equal(applied.status, 200, JSON.stringify(applied.body));
  const created = await api<View>(system, 'POST', '/v1/sandboxes', { template: 'slow', wait: true });
  assert.equal(created.status, 201, JSON.stringify(created.body));
  const sb = created.body;
  const host = `8000-${sb.id}.asb.localhost`;
  const get = (): Promise<EdgeAnswer> => viaEdge(system, host, { 'x-access-token': sb.accessToken });
  // A sandbox created a moment ago is not held (it was never hibernated): wait for its server once.
  await waitFor('the server to listen after create', async () => ((await get()).status === 200 ? true : undefined), 30_000, 100);

  for (const concurrent of [1, 4]) {
    assert.equal((await api(system, 'POST', `/v1/sandboxes/${sb.id}/pause`)).status, 200);
    await waitFor('hibernation', async () => {
      const got = await api<View>(system, 'GET', `/v1/sandboxes/${sb.id}`);
      return got.body.phase === 'Hibernated' ? true : undefined;
    });
    const answers = await Promise.all(Array.from({ length: concurrent }, () => edgeGet(system.edgeUrl, host, { headers: { 'x-access-token': sb.accessToken }, path: '/whoami.txt', timeoutMs: 28_000 })));
    for (const answer of answers) {
      assert.equal(answer.status, 200, `${concurrent} at once: ${answer.body}`);
      assert.equal(answer.body.trim(), sb.id, 'the woken server answered');
    }
  }
});

// Probe finding "HTTP/2 to sandbox apps fails": browsers speak h2 on the HTTPS edge, and Envoy
// passed that on to HTTP/1.1 servers in sandboxes (502 "protocol error").
test('HTTPS edge: a browser-like HTTP/2 client (ALPN h2) reaches a plain HTTP/1.1 server in a real sandbox, and gets a Secure cookie', async (t) => {
  const system = await startTestSystem('e2eh', 195, 'local', 0, true);
  t.after(() => system.cleanup());
  assert.equal((await api(system, 'POST', '/v1/apply', { objects: [WEB_TEMPLATE, webPool(1)] })).status, 200);
  const sb = (await api<View>(system, 'POST', '/v1/sandboxes', { template: 'web' })).body;
  assert.ok(sb.ready);
  const authority = `8080-${sb.id}.asb.localhost`;
  const session = connect(system.edgeTlsUrl ?? '', { ca: readFileSync(system.caCertPath ?? ''), servername: authority });
  t.after(() => session.destroy());
  const reply = await new Promise<{ status: number; cookie: string[]; body: string; alpn: string | undefined }>((resolve, reject) => {
    const stream = session.request({ ':authority': authority, ':path': '/whoami.txt', 'x-access-token': sb.accessToken });
    let status = 0;
    let cookie: string[] = [];
    let body = '';
    stream.on('response', (headers) => {
      status = Number(headers[':status']);
      cookie = headers['set-cookie'] ?? [];
    });
    stream.setEncoding('utf8');
    stream.on('data', (chunk: string) => (body += chunk));
    stream.on('end', () => resolve({ status, cookie, body, alpn: session.alpnProtocol }));
    stream.on('error', reject);
  });
  session.close();
  assert.equal(reply.alpn, 'h2');
  assert.equal(reply.status, 200, reply.body);
  assert.equal(reply.body.trim(), sb.id, 'the server inside the sandbox answered');
  assert.match(reply.cookie.join('\n'), /^asb_access=.*; Secure$/m);
});
