// Regression: requests to a sandbox whose app is not listening (restarting) got Envoy's instant
// 503 "upstream connect error … remote connection failure". The sandbox routes now retry a
// refused connect with backoff, and only failures before the request left Envoy: a request
// that reached the app is never sent a second time. Real Envoy 1.40, the real router.
import assert from 'node:assert/strict';
import { createServer as createHttpServer, request, type Server as HttpServer } from 'node:http';
import { createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { test, type TestContext } from 'node:test';
import { freePort } from '../src/assembly/local-system.ts';
import type { EnvoyProcess } from '../src/edge/envoy-process.ts';
import { DOMAIN, sandboxEntry, startFakeWorker, startTestEnvoy, startTestRouter, TOKEN, until } from './support/dataplane-fixture.ts';
import { waitFor } from './support/wait.ts';

const RESTARTING = 'sbxr';
const RESETTING = 'sbxx';

interface Edge {
  envoy: EnvoyProcess;
  /** Port of the restarting app: nobody listens on it until the test says so. */
  restartPort: number;
  /** Requests the resetting app read before it reset the connection. */
  resetRequests: string[];
}

async function startEdge(t: TestContext): Promise<Edge> {
  const after = (fn: () => unknown): void => t.after(fn);
  // Reads a whole request (headers and its small body), then resets the connection: an app
  // that crashed while handling it. Envoy must not send the request again.
  const resetRequests: string[] = [];
  const resetting: Server = createServer((socket: Socket) => {
    let text = '';
    socket.on('data', (chunk: Buffer) => {
      text += chunk.toString('latin1');
      const end = text.indexOf('\r\n\r\n');
      const length = Number(/content-length: *(\d+)/i.exec(text)?.[1] ?? 0);
      if (end === -1 || text.length < end + 4 + length) return;
      resetRequests.push(text.slice(0, text.indexOf('\r\n')));
      socket.resetAndDestroy();
    });
    socket.on('error', () => undefined);
  });
  await new Promise<void>((resolve) => resetting.listen(0, '127.0.0.1', resolve));
  after(() => resetting.close());
  const restartPort = await freePort();

  const worker = await startFakeWorker(after, 'c1');
  const router = await startTestRouter(after, { workers: [{ cluster: 'c1', url: worker.url }] });
  const envoy = await startTestEnvoy(after, { listenPort: 0, adminPort: 0, routerAddress: router.address, workers: [{ cluster: 'c1', apiAddress: worker.address }] });
  const version = worker.publish([
    sandboxEntry(RESTARTING, 'c1', { defaultPort: restartPort }),
    sandboxEntry(RESETTING, 'c1', { defaultPort: (resetting.address() as AddressInfo).port }),
  ]);
  await until(() => router.table.version('c1') === version, 5_000, `route feed version ${version}`);
  return { envoy, restartPort, resetRequests };
}

interface Reply {
  status: number;
  body: string;
}

function send(edgeUrl: string, id: string, method: string, body?: string): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { host: `${id}.${DOMAIN}`, 'x-access-token': TOKEN };
    if (body !== undefined) headers['content-type'] = 'application/x-www-form-urlencoded';
    const req = request(`${edgeUrl}/order`, { method, headers, agent: false, timeout: 20_000 }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
    });
    req.on('timeout', () => req.destroy(new Error('no answer within 20 s')));
    req.on('error', reject);
    req.end(body);
  });
}

/** Envoy's count of retries to the sandbox cluster so far. */
async function sandboxRetries(envoy: EnvoyProcess): Promise<number> {
  const text = await (await fetch(`${envoy.endpoints.adminUrl}/stats?filter=^cluster\\.sandbox\\.upstream_rq_retry$`)).text();
  return Number(/^cluster\.sandbox\.upstream_rq_retry: (\d+)$/m.exec(text)?.[1] ?? 0);
}

test('a sandbox app that is restarting: Envoy retries the refused connect and the request is served once the app listens, not an instant 503', async (t) => {
  const edge = await startEdge(t);
  const edgeUrl = edge.envoy.endpoints.edgeUrl;
  let answered: Reply | undefined;
  const reply = send(edgeUrl, RESTARTING, 'POST', 'item=1').then((r) => (answered = r));
  // The app comes back after Envoy's first refused attempt: a retry has to be under way. The
  // 5 retries' backoff (0.1 s doubling to 0.4 s, jittered) leaves ~1 s for this poll to see it.
  await waitFor('a retry or an answer', async () => (answered !== undefined || (await sandboxRetries(edge.envoy)) > 0 ? true : undefined), 10_000, 5);
  assert.equal(answered, undefined, `answered before any retry: ${answered?.status ?? 0} ${answered?.body ?? ''}`);
  const seen: string[] = [];
  const app: HttpServer = createHttpServer((req, res) => {
    seen.push(`${req.method ?? ''} ${req.url ?? ''}`);
    res.end('back');
  });
  await new Promise<void>((resolve) => app.listen(edge.restartPort, '127.0.0.1', resolve));
  t.after(() => {
    app.closeAllConnections();
    app.close();
  });
  const got = await reply;
  assert.equal(got.status, 200, got.body);
  assert.equal(got.body, 'back');
  assert.deepEqual(seen, ['POST /order'], 'the app got the request once');
});

test('a request that reached the app is never sent twice: the app resets the connection after reading a POST, the client gets one 503', async (t) => {
  const edge = await startEdge(t);
  const before = await sandboxRetries(edge.envoy);
  for (const method of ['POST', 'GET']) {
    const got = await send(edge.envoy.endpoints.edgeUrl, RESETTING, method, method === 'POST' ? 'item=1' : undefined);
    assert.equal(got.status, 503, got.body);
  }
  assert.deepEqual(edge.resetRequests, ['POST /order HTTP/1.1', 'GET /order HTTP/1.1'], 'each request reached the app once');
  assert.equal(await sandboxRetries(edge.envoy), before, 'no retry after the request was sent');
});
