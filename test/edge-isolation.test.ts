// What one sandbox's responses and one client's secrets can do at the edge, through a real Envoy
// 1.40 and the real router (tenant isolation at the edge, and "HTTP/2 to sandbox apps fails"):
// - a sandbox cannot set cookies for the parent domain, nor set asb_access (checked in Chromium:
//   before, sandbox A's `asb_access; Domain=<domain>` locked the browser out of sandbox B);
// - asb_access set over the HTTPS listener is Secure;
// - HTTP/2 clients (ALPN h2 on the HTTPS edge, h2c on the plain one) reach HTTP/1.1 sandbox apps,
//   and ports declared h2c (gRPC) get HTTP/2 whatever the client spoke;
// - Envoy's access log is 0600 and holds no query string, token or signature.
import assert from 'node:assert/strict';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect, createServer as createH2cServer, type ClientHttp2Session, type IncomingHttpHeaders as H2Headers } from 'node:http2';
import type { AddressInfo } from 'node:net';
import { test, type TestContext } from 'node:test';
import { chromium } from 'playwright-core';
import type { Sandbox } from '../src/api/types.ts';
import type { EnvoyProcess } from '../src/edge/envoy-process.ts';
import { ensureEdgeTls } from '../src/edge/tls.ts';
import { tokenHash } from '../src/router/access.ts';
import { ACCESS_COOKIE } from '../src/router/contract.ts';
import { h2cPortsOf } from '../src/worker/route-entry.ts';
import { DOMAIN, sandboxEntry, send, startFakeWorker, startTestEnvoy, startTestRouter, TOKEN, until } from './support/dataplane-fixture.ts';
import { removeDataDir, tempDataDir } from './support/worker-process.ts';

const CHROMIUM = '/usr/bin/chromium';
const A = 'sbxa';
const B = 'sbxb';
const H2 = 'sbxh';
const TOKEN_B = 'tok_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb';

/** What a hostile or careless sandbox app answers on /cookie. */
const SANDBOX_COOKIES = [
  `${ACCESS_COOKIE}=x; Domain=${DOMAIN}; Path=/app`,
  `theme=dark; Domain=.${DOMAIN}; Path=/`,
  'session=1; Path=/; HttpOnly',
  'ASB_ACCESS=y; Path=/',
];

interface Edge {
  envoy: EnvoyProcess;
  /** http://127.0.0.1:<port> */
  plain: string;
  /** https://127.0.0.1:<port> */
  tls: string;
  caPem: string;
  /** Port of the HTTP/1.1-only app (sandboxes A and B). */
  h1Port: number;
  /** Port of the HTTP/2-only (h2c) app, declared h2c in sandbox H2's entry. */
  h2cPort: number;
  /** HTTP versions the h1 app saw. */
  h1Versions: string[];
}

async function startEdge(t: TestContext): Promise<Edge> {
  const after = (fn: () => unknown): void => t.after(fn);
  const h1Versions: string[] = [];
  const h1: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    h1Versions.push(req.httpVersion);
    if (req.url === '/cookie') res.setHeader('set-cookie', SANDBOX_COOKIES);
    res.setHeader('content-type', 'text/plain');
    res.end(`h1 HTTP/${req.httpVersion} ${req.headers.host ?? ''} ${req.url ?? ''}`);
  });
  // Prior-knowledge HTTP/2 only: an HTTP/1.1 request to it fails, so a 200 proves h2 was spoken.
  // Trailers as a gRPC server sends them.
  const h2c = createH2cServer();
  h2c.on('stream', (stream, headers) => {
    stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
    stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0' }));
    stream.end(`h2c ${String(headers[':path'])}`);
  });
  for (const server of [h1, h2c]) {
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  }
  after(() => {
    h1.closeAllConnections();
    h1.close();
    h2c.close();
  });
  const h1Port = (h1.address() as AddressInfo).port;
  const h2cPort = (h2c.address() as AddressInfo).port;

  const worker = await startFakeWorker(after, 'c1');
  const router = await startTestRouter(after, { workers: [{ cluster: 'c1', url: worker.url }] });
  const dir = tempDataDir('edgetls');
  after(() => removeDataDir(dir));
  const tls = await ensureEdgeTls(dir, DOMAIN);
  const envoy = await startTestEnvoy(after, {
    listenPort: 0,
    adminPort: 0,
    routerAddress: router.address,
    workers: [{ cluster: 'c1', apiAddress: worker.address }],
    edgeTls: { listenPort: 0, certChainPath: tls.certChainPath, privateKeyPath: tls.privateKeyPath },
  });
  const version = worker.publish([
    sandboxEntry(A, 'c1', { defaultPort: h1Port }),
    sandboxEntry(B, 'c1', { defaultPort: h1Port, tokenHash: tokenHash(TOKEN_B) }),
    sandboxEntry(H2, 'c1', { defaultPort: h2cPort, h2cPorts: [h2cPort] }),
  ]);
  await until(() => router.table.version('c1') === version, 5_000, `route feed version ${version}`);
  return { envoy, plain: envoy.endpoints.edgeUrl, tls: envoy.endpoints.edgeTlsUrl ?? '', caPem: readFileSync(tls.caCertPath, 'utf8'), h1Port, h2cPort, h1Versions };
}

const host = (port: number, id: string): string => `${port}-${id}.${DOMAIN}`;

interface H2Reply {
  status: number;
  headers: H2Headers;
  trailers: H2Headers;
  body: string;
  /** ALPN result on TLS ('h2'), undefined on h2c. */
  alpn: string | undefined;
}

/** One HTTP/2 request as a browser sends it (TLS with ALPN h2), or h2c with prior knowledge on http:. */
async function h2Request(t: TestContext, origin: string, authority: string, path: string, headers: Record<string, string>, caPem?: string): Promise<H2Reply> {
  const session: ClientHttp2Session = connect(origin, caPem === undefined ? {} : { ca: caPem, servername: authority });
  t.after(() => session.destroy());
  await new Promise<void>((resolve, reject) => {
    session.once('connect', () => resolve());
    session.once('error', reject);
  });
  const alpn = session.alpnProtocol;
  return new Promise((resolve, reject) => {
    const stream = session.request({ ':method': 'GET', ':path': path, ':authority': authority, ':scheme': origin.startsWith('https') ? 'https' : 'http', ...headers });
    let status = 0;
    let responseHeaders: H2Headers = {};
    let trailers: H2Headers = {};
    let body = '';
    stream.on('response', (h) => {
      status = Number(h[':status']);
      responseHeaders = h;
    });
    stream.on('trailers', (h: H2Headers) => {
      trailers = h;
    });
    stream.setEncoding('utf8');
    stream.on('data', (chunk: string) => (body += chunk));
    stream.on('end', () => {
      session.close();
      resolve({ status, headers: responseHeaders, trailers, body, alpn });
    });
    stream.on('error', reject);
  });
}

test('h2cPorts: container ports whose appProtocol is kubernetes.io/h2c, h2c or grpc (any container, any case); others stay HTTP/1.1', () => {
  const sandbox = {
    apiVersion: 'agents.x-k8s.io/v1alpha1',
    kind: 'Sandbox',
    metadata: { name: 'sbx', namespace: 'default' },
    spec: {
      podTemplate: {
        spec: {
          containers: [
            { name: 'main', ports: [{ containerPort: 8080 }, { containerPort: 50051, appProtocol: 'kubernetes.io/h2c' }, { containerPort: 9000, appProtocol: 'http' }] },
            { name: 'side', ports: [{ containerPort: 7000, appProtocol: 'GRPC' }, { containerPort: 7001, appProtocol: 'h2c' }, { containerPort: 443, appProtocol: 'kubernetes.io/wss' }] },
          ],
        },
      },
    },
  } as Sandbox;
  assert.deepEqual(h2cPortsOf(sandbox), [7000, 7001, 50051]);
});

const setCookies = (value: string | string[] | undefined): string[] => (value === undefined ? [] : Array.isArray(value) ? value : [value]);

test('a sandbox response cannot set a cookie for the parent domain nor asb_access: its own cookies stay host-only', async (t) => {
  const edge = await startEdge(t);
  const res = await send(edge.plain, host(edge.h1Port, A), '/cookie', { 'x-access-token': TOKEN });
  assert.equal(res.status, 200, res.body);
  const cookies = setCookies(res.headers['set-cookie']);
  // The router's own asb_access (the token came in the header) is the only one.
  assert.deepEqual(
    cookies.filter((c) => c.toLowerCase().startsWith(`${ACCESS_COOKIE}=`)),
    [`${ACCESS_COOKIE}=${TOKEN}; HttpOnly; Path=/; SameSite=Lax`],
  );
  assert.deepEqual(cookies.filter((c) => !c.toLowerCase().startsWith(`${ACCESS_COOKIE}=`)), ['theme=dark; Path=/', 'session=1; Path=/; HttpOnly']);
});

test('in Chromium: sandbox A setting asb_access for the parent domain does not lock the browser out of sandbox B', { timeout: 120_000 }, async (t) => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: make test installs it (apt-get install chromium)`);
  const edge = await startEdge(t);
  const port = new URL(edge.plain).port;
  const browser = await chromium.launch({ executablePath: CHROMIUM, args: [`--host-resolver-rules=MAP *.${DOMAIN} 127.0.0.1`] });
  t.after(() => browser.close());
  const context = await browser.newContext();
  // The user holds both sandboxes' tokens as cookies, as after opening each with its token.
  await context.addCookies([
    { name: ACCESS_COOKIE, value: TOKEN, domain: host(edge.h1Port, A), path: '/', httpOnly: true, sameSite: 'Lax' },
    { name: ACCESS_COOKIE, value: TOKEN_B, domain: host(edge.h1Port, B), path: '/', httpOnly: true, sameSite: 'Lax' },
  ]);
  const page = await context.newPage();
  const a = await page.goto(`http://${host(edge.h1Port, A)}:${port}/cookie`);
  assert.equal(a?.status(), 200);
  const b = await page.goto(`http://${host(edge.h1Port, B)}:${port}/app/page`);
  const bText = (await b?.text()) ?? '';
  assert.equal(b?.status(), 200, `sandbox B after visiting A: ${bText}`);
  assert.match(bText, new RegExp(`^h1 HTTP/1.1 ${host(edge.h1Port, B)}`));
  // What the browser holds for B: only B's token, and A's host-only app cookies never reach it.
  const forB = await context.cookies(`http://${host(edge.h1Port, B)}:${port}/app/page`);
  assert.deepEqual(
    forB.map((c) => `${c.name}=${c.value}`),
    [`${ACCESS_COOKIE}=${TOKEN_B}`],
  );
});

test('asb_access set over the HTTPS listener is Secure; over plain HTTP it is not', async (t) => {
  const edge = await startEdge(t);
  const secure = await h2Request(t, edge.tls, host(edge.h1Port, A), '/page', { 'x-access-token': TOKEN }, edge.caPem);
  assert.equal(secure.status, 200, secure.body);
  assert.deepEqual(setCookies(secure.headers['set-cookie']), [`${ACCESS_COOKIE}=${TOKEN}; HttpOnly; Path=/; SameSite=Lax; Secure`]);
  const plain = await send(edge.plain, host(edge.h1Port, A), '/page', { 'x-access-token': TOKEN });
  assert.deepEqual(setCookies(plain.headers['set-cookie']), [`${ACCESS_COOKIE}=${TOKEN}; HttpOnly; Path=/; SameSite=Lax`]);
  // A client's own x-forwarded-proto does not make the plain edge say Secure (Envoy overwrites it).
  const spoofed = await send(edge.plain, host(edge.h1Port, A), '/page', { 'x-access-token': TOKEN, 'x-forwarded-proto': 'https' });
  assert.deepEqual(setCookies(spoofed.headers['set-cookie']), [`${ACCESS_COOKIE}=${TOKEN}; HttpOnly; Path=/; SameSite=Lax`]);
});

test('HTTP/2 clients reach an HTTP/1.1 sandbox app: a browser-like h2 client on the HTTPS edge and h2c on the plain one get 200', async (t) => {
  const edge = await startEdge(t);
  const viaTls = await h2Request(t, edge.tls, host(edge.h1Port, A), '/over-tls', { 'x-access-token': TOKEN }, edge.caPem);
  assert.equal(viaTls.alpn, 'h2', 'the client negotiated HTTP/2, as browsers do');
  assert.equal(viaTls.status, 200, viaTls.body);
  assert.equal(viaTls.body, `h1 HTTP/1.1 ${host(edge.h1Port, A)} /over-tls`);
  const viaH2c = await h2Request(t, edge.plain, host(edge.h1Port, A), '/over-h2c', { 'x-access-token': TOKEN });
  assert.equal(viaH2c.status, 200, viaH2c.body);
  assert.equal(viaH2c.body, `h1 HTTP/1.1 ${host(edge.h1Port, A)} /over-h2c`);
  assert.deepEqual(edge.h1Versions, ['1.1', '1.1']);
});

test('a port declared h2c (gRPC) gets HTTP/2 from every client, trailers included', async (t) => {
  const edge = await startEdge(t);
  const fromH1 = await send(edge.plain, host(edge.h2cPort, H2), '/from-h1', { 'x-access-token': TOKEN });
  assert.equal(fromH1.status, 200, fromH1.body);
  assert.equal(fromH1.body, 'h2c /from-h1');
  for (const [origin, ca] of [[edge.plain, undefined], [edge.tls, edge.caPem]] as const) {
    const grpc = await h2Request(t, origin, host(edge.h2cPort, H2), '/pkg.Service/Call', { 'x-access-token': TOKEN, 'content-type': 'application/grpc', te: 'trailers' }, ca);
    assert.equal(grpc.status, 200, `${origin}: ${grpc.body}`);
    assert.equal(grpc.body, 'h2c /pkg.Service/Call');
    assert.equal(grpc.trailers['grpc-status'], '0', `${origin}: the gRPC status trailer comes through`);
  }
});

test("Envoy's access log is 0600 and holds no query string, token, signature, key or cookie", async (t) => {
  const edge = await startEdge(t);
  const secrets = ['tok_querysecret0123456789abcdefghij', 'v1_signaturesecretAAAAAAAAAAAAAAAAAAAAAAAAAAAA', 'asb_apikeysecret0123456789', TOKEN];
  const requests: [string, string, Record<string, string>][] = [
    [host(edge.h1Port, A), `/term?token=${secrets[0] ?? ''}`, { 'x-access-token': TOKEN }],
    [host(49983, A), `/files?path=/etc/hostname&signature=${secrets[1] ?? ''}&signature_expiration=99`, {}],
    [`api.${DOMAIN}`, `/v1/sandboxes?token=${secrets[0] ?? ''}`, { authorization: `Bearer ${secrets[2] ?? ''}` }],
    [host(edge.h1Port, A), '/page', { cookie: `${ACCESS_COOKIE}=${TOKEN}` }],
  ];
  for (const [h, path, headers] of requests) await send(edge.plain, h, path, headers);
  await h2Request(t, edge.tls, host(edge.h1Port, A), `/tls?token=${secrets[0] ?? ''}`, { 'x-access-token': TOKEN }, edge.caPem);
  const logPath = edge.envoy.accessLogPath;
  // Envoy flushes its file logs every second (envoy-process.ts): poll until every line is in.
  await until(() => existsSync(logPath) && readFileSync(logPath, 'utf8').trim().split('\n').length >= requests.length + 1, 10_000, 'the access log lines');
  const log = readFileSync(logPath, 'utf8');
  for (const secret of secrets) assert.ok(!log.includes(secret), `the access log holds ${secret}:\n${log}`);
  assert.ok(!log.includes('?'), `the access log holds a query string:\n${log}`);
  const paths = log.trim().split('\n').map((line) => (JSON.parse(line) as { path: string }).path);
  assert.deepEqual(paths, ['/term', '/files', '/v1/sandboxes', '/page', '/tls']);
  assert.equal(statSync(logPath).mode & 0o777, 0o600);
});
