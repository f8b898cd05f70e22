// Federation through two real Envoys (1.40) built from envoy/edge.yaml, with ext_proc stand-ins
// in place of the routers: a client at cluster A's edge reaches a sandbox server behind cluster
// B, A's Envoy forwarding to B's ingress listener over mutual TLS and B's routing it again. Also:
// who B's ingress lets in, SAN pinning on both sides, the hub upstream, a request B holds past
// Envoy's default 15 s route timeout, and HTTP/2 kept end to end.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, mkdtempSync, rmSync } from 'node:fs';
import { Agent } from 'node:http';
import http2 from 'node:http2';
import { request as httpsRequest } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { checkServerIdentity } from 'node:tls';
import { WebSocket } from 'ws';
import type { EnvoyProcess } from '../src/edge/envoy-process.ts';
import { ensureFederationTls, INGRESS_SAN, type FederationTls } from '../src/edge/tls.ts';
import { clientKey } from '../src/router/client-address.ts';
import { HEADER, UPSTREAM } from '../src/router/contract.ts';
import { send, startTestEnvoy, startUpstream, type After, type Reply, type Upstream } from './support/dataplane-fixture.ts';
import { startExtProcStub, type Decision, type ExtProcStub, type SeenRequest } from './support/extproc-stub.ts';

/** Past Envoy's default route timeout (15 s): the first limit a careless config would bring back. */
const HOLD_MS = 16_000;

interface Fixture {
  a: EnvoyProcess;
  b: EnvoyProcess;
  /** A third cluster whose Envoy pins SANs nobody has: its ingress and its forwards must fail. */
  strict: EnvoyProcess;
  routerA: ExtProcStub;
  routerB: ExtProcStub;
  pod: Upstream;
  podH2Address: string;
  hub: Upstream;
  tls: Record<'a' | 'b' | 'strict', FederationTls>;
  otherCa: FederationTls;
}

const cleanups: (() => unknown)[] = [];
const later: After = (fn) => cleanups.push(fn);

async function startFixture(): Promise<Fixture> {
  const dir = mkdtempSync(join(tmpdir(), 'asb-fed-envoy-'));
  later(() => rmSync(dir, { recursive: true, force: true }));
  const files = await ensureFederationTls(join(dir, 'tls'), { names: ['a', 'b', 'strict'] });
  const tls = { a: files.envoys.a, b: files.envoys.b, strict: files.envoys.strict } as Record<'a' | 'b' | 'strict', FederationTls>;
  const otherCa = await ensureFederationTls(join(dir, 'other-ca'));

  const pod = await startUpstream(later, 'pod');
  const hub = await startUpstream(later, 'hub');
  const podH2 = http2.createServer((req, res) => res.end(`pod-h2 HTTP/${req.httpVersion} ${req.headers[':authority'] ?? '?'}`));
  await new Promise<void>((resolve) => podH2.listen(0, '127.0.0.1', resolve));
  later(() => podH2.close());
  const podH2Address = `127.0.0.1:${(podH2.address() as AddressInfo).port}`;

  // B's router: requests that came in on the ingress go to a local "sandbox"; /held after a hold.
  const routerB = await startExtProcStub(later, (req): Decision => {
    if (req.listener !== 'ingress') return { status: 404, body: 'not via the ingress' };
    // h2-*: a port its template declares h2c (a gRPC server), which the real router sends to sandbox-h2c.
    const h2 = authority(req).startsWith('h2-');
    const set = { [HEADER.upstream]: h2 ? UPSTREAM.sandboxH2c : UPSTREAM.sandbox, [HEADER.destination]: h2 ? podH2Address : `127.0.0.1:${pod.port}` };
    return path(req) === '/held' ? { set, holdMs: HOLD_MS } : { set };
  });
  const b = await startTestEnvoy(later, { listenPort: 0, adminPort: 0, routerAddress: routerB.address, workers: [], ingress: { listenPort: 0 }, tls: tls.b });
  const bIngress = b.endpoints.ingressAddress ?? '';

  // A's router: <x>.b.test lives in cluster B; api.hub.test is the hub's.
  const routeA = (req: SeenRequest): Decision => {
    if (authority(req) === 'api.hub.test') return { set: { [HEADER.upstream]: UPSTREAM.hub } };
    if (authority(req).endsWith('.b.test')) return { set: { [HEADER.upstream]: UPSTREAM.ingress, [HEADER.destination]: bIngress } };
    return { status: 404, body: 'unknown' };
  };
  const routerA = await startExtProcStub(later, routeA);
  const a = await startTestEnvoy(later, { listenPort: 0, adminPort: 0, routerAddress: routerA.address, workers: [], tls: tls.a, hubAddress: `127.0.0.1:${hub.port}` });

  const routerStrict = await startExtProcStub(later, routeA);
  const strict = await startTestEnvoy(later, {
    listenPort: 0,
    adminPort: 0,
    routerAddress: routerStrict.address,
    workers: [],
    ingress: { listenPort: 0 },
    tls: { ...tls.strict, edgeSan: 'asb-nobody', ingressSan: 'asb-nobody' },
  });
  return { a, b, strict, routerA, routerB, pod, podH2Address, hub, tls, otherCa };
}

function authority(req: SeenRequest): string {
  return req.headers[':authority'] ?? '';
}
function path(req: SeenRequest): string {
  return req.headers[':path'] ?? '';
}

/** A request straight to an ingress listener, as another cluster's Envoy would make it; `cert` is the client certificate, if any. */
function toIngress(address: string, cert: FederationTls | undefined, ca: string, reqPath: string): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = httpsRequest(
      `https://${address}${reqPath}`,
      {
        agent: false,
        headers: { host: '8080-direct.b.test' },
        ca: readFileSync(ca),
        servername: INGRESS_SAN,
        // The ingress is addressed by IP and identified by its role SAN, as Envoy's upstream does.
        checkServerIdentity: (_host, peer) => checkServerIdentity(INGRESS_SAN, peer),
        ...(cert === undefined ? {} : { cert: readFileSync(cert.certChainPath), key: readFileSync(cert.privateKeyPath) }),
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end();
  });
}

// The tests share one fixture and run at once: the held request takes HOLD_MS while the rest run.
describe('two clusters: edge A → ingress B over mutual TLS', { concurrency: true }, () => {
  let fx: Fixture;
  before(async () => {
    fx = await startFixture();
  });
  after(async () => {
    for (const fn of cleanups.reverse()) await fn();
  });

  it('a request at A reaches B’s sandbox with its Host, scheme and client address; B’s router knows it came in on the ingress', async () => {
    const res = await send(fx.a.endpoints.edgeUrl, '8080-sbx1.b.test', '/hello?x=1', { [HEADER.destination]: '10.9.9.9:1' });
    assert.equal(res.status, 200);
    assert.equal(res.body, 'pod GET /hello?x=1');
    const seen = fx.pod.seen.find((h) => h.host === '8080-sbx1.b.test');
    assert.ok(seen !== undefined, 'the sandbox server got the original Host');
    assert.equal(seen['x-forwarded-proto'], 'http', 'the scheme the client used, not the TLS of the hop between clusters');
    // The client's address as A saw it, then A's as B saw it. (Envoy writes a loopback peer as
    // the machine's own address, so both are the same here.)
    const xff = String(seen['x-forwarded-for'] ?? '');
    assert.equal(xff.split(',').length, 2, `x-forwarded-for: ${xff}`);
    assert.equal(seen[HEADER.destination], undefined);
    assert.equal(seen[HEADER.upstream], undefined);

    const atB = fx.routerB.seen.find((r) => path(r) === '/hello?x=1');
    assert.equal(atB?.listener, 'ingress');
    assert.equal(atB.headers[':authority'], '8080-sbx1.b.test');
    assert.equal(atB.headers[HEADER.destination], undefined, 'A sent no routing header to B');
    assert.equal(fx.routerA.seen.find((r) => path(r) === '/hello?x=1')?.listener, undefined, 'no listener metadata on the edge');
    assert.ok(((await fx.a.stats('cluster.ingress.ssl.handshake')).get('cluster.ingress.ssl.handshake') ?? 0) >= 1, 'A→B was TLS');
  });

  it('B’s router reads the client A saw, not one the client claims: the per-client lookup budget cannot be dodged through the federation', async () => {
    const agent = new Agent({ localAddress: '127.0.0.2' });
    try {
      const spoofed = { 'x-forwarded-for': '10.7.7.7, 10.8.8.8', 'x-envoy-external-address': '10.9.9.9', 'x-real-ip': '10.6.6.6' };
      const res = await send(fx.a.endpoints.edgeUrl, '8080-sbx1.b.test', '/who', spoofed, agent);
      assert.equal(res.status, 200);
    } finally {
      agent.destroy();
    }
    const atA = fx.routerA.seen.find((r) => path(r) === '/who');
    const atB = fx.routerB.seen.find((r) => path(r) === '/who');
    assert.ok(atA !== undefined && atB !== undefined);
    assert.equal(clientKey(new Map(Object.entries(atA.headers)), 'edge'), '127.0.0.2');
    assert.equal(clientKey(new Map(Object.entries(atB.headers)), 'ingress'), '127.0.0.2', `x-forwarded-for at B: ${atB.headers['x-forwarded-for'] ?? ''}`);
  });

  it('a WebSocket through A and B carries messages both ways', async () => {
    const ws = new WebSocket(`${fx.a.endpoints.edgeUrl.replace('http', 'ws')}/term`, { headers: { host: '8080-sbx1.b.test' } });
    try {
      await new Promise<void>((resolve, reject) => {
        ws.once('open', resolve);
        ws.once('error', reject);
      });
      for (const text of ['hi', 'again']) {
        const reply = new Promise<string>((resolve) => ws.once('message', (data: Buffer) => resolve(data.toString())));
        ws.send(text);
        assert.equal(await reply, `pod:${text}`);
      }
    } finally {
      ws.terminate();
    }
    assert.ok(fx.pod.seen.some((h) => h.upgrade === 'websocket' && h.host === '8080-sbx1.b.test'));
  });

  it('B’s ingress refuses plain HTTP, TLS without a client certificate and a certificate from another CA', async () => {
    const ca = fx.tls.b.caCertPath;
    await assert.rejects(send(`http://${fx.b.endpoints.ingressAddress ?? ''}`, '8080-direct.b.test', '/plain'));
    await assert.rejects(toIngress(fx.b.endpoints.ingressAddress ?? '', undefined, ca, '/no-cert'));
    await assert.rejects(toIngress(fx.b.endpoints.ingressAddress ?? '', fx.otherCa, ca, '/other-ca'));
    // The same client with a certificate of the federation's CA gets in: the refusals were about the certificate.
    const ok = await toIngress(fx.b.endpoints.ingressAddress ?? '', fx.tls.a, ca, '/with-cert');
    assert.equal(ok.body, 'pod GET /with-cert');
    const reachedRouter = fx.routerB.seen.map(path);
    for (const refused of ['/plain', '/no-cert', '/other-ca']) assert.ok(!reachedRouter.includes(refused), `${refused} reached B's router`);
  });

  it('the SANs are pinned on both sides: a CA-signed certificate without the expected SAN is refused', async () => {
    // strict's ingress wants a client SAN nobody has: A's certificate (right CA, asb-edge) is refused.
    await assert.rejects(toIngress(fx.strict.endpoints.ingressAddress ?? '', fx.tls.a, fx.tls.a.caCertPath, '/strict-in'));
    // strict's edge wants an ingress SAN B does not have: it does not send B the request.
    const res = await send(fx.strict.endpoints.edgeUrl, '8080-sbx1.b.test', '/strict-out');
    assert.equal(res.status, 503);
    assert.ok(!fx.routerB.seen.some((r) => path(r) === '/strict-out'), 'B never saw the request');
  });

  it('x-asb-upstream: hub reaches the hub’s API with the original Host', async () => {
    const res = await send(fx.a.endpoints.edgeUrl, 'api.hub.test', '/v1/sandboxes');
    assert.equal(res.body, 'hub GET /v1/sandboxes');
    const seen = fx.hub.seen.at(-1);
    assert.equal(seen?.host, 'api.hub.test');
    assert.equal(seen[HEADER.upstream], undefined);
  });

  it(`a request B’s router holds for ${HOLD_MS / 1000} s (a sandbox waking) is not cut on the way`, async () => {
    const res = await send(fx.a.endpoints.edgeUrl, '8080-sbx1.b.test', '/held');
    assert.equal(res.status, 200);
    assert.equal(res.body, 'pod GET /held');
  });

  it('an HTTP/2 client reaches an h2c-declared sandbox port in another cluster over HTTP/2 (gRPC works across clusters as within one)', async () => {
    const session = http2.connect(fx.a.endpoints.edgeUrl);
    try {
      const body = await new Promise<string>((resolve, reject) => {
        const stream = session.request({ ':authority': 'h2-sbx2.b.test', ':path': '/h2' });
        const chunks: Buffer[] = [];
        stream.on('data', (c: Buffer) => chunks.push(c));
        stream.on('end', () => resolve(Buffer.concat(chunks).toString()));
        stream.on('error', reject);
        stream.end();
      });
      assert.equal(body, 'pod-h2 HTTP/2.0 h2-sbx2.b.test');
    } finally {
      session.close();
    }
  });
});
