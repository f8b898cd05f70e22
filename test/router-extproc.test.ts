// The router's ext_proc server against a harness that plays Envoy (grpc-js client): routing
// answers, conformance rules Envoy enforces, refusals, holds for a wake, and RST storms.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { ProcessingResponse } from '../src/router/proto.ts';
import { exchange, extProcClient, get, headerValue, healthClient, immediate } from './support/envoy-mimic.ts';
import { DOMAIN, entry, ManualClock, startRouterUnderTest, TOKEN, until } from './support/router-fixture.ts';

const ID = 'loc1aaaaaaaaaaaaaaaa';
const HOST = (port: number | undefined, id = ID): string => (port === undefined ? `${id}.${DOMAIN}` : `${port}-${id}.${DOMAIN}:10000`);

/** Checklist 4, 5, 9: one matching case, only raw_value, clear_route_cache with a mutation, CONTINUE. */
function assertRouteReply(answer: ProcessingResponse): void {
  const common = answer.request_headers?.response;
  assert.ok(common, `expected a request_headers reply, got ${JSON.stringify(answer)}`);
  assert.equal(answer.immediate_response, undefined);
  assert.equal(common.clear_route_cache, true);
  assert.ok(common.header_mutation, 'clear_route_cache needs a header_mutation in the same CommonResponse');
  assert.ok((common.status ?? 0) === 0, 'status CONTINUE');
  for (const s of common.header_mutation.set_headers ?? []) {
    assert.equal(s.header.value, undefined, `${s.header.key}: value must stay unset (Envoy 500s on both)`);
    assert.ok(s.header.raw_value !== undefined && s.header.raw_value.length > 0, `${s.header.key}: raw_value set`);
    assert.equal(s.append, undefined, 'append unset means overwrite');
  }
}

test('a running sandbox is routed to its pod ip:port through the sandbox upstream', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID)]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());

  const { answer, replies } = await exchange(client, get(HOST(8080), '/x', { 'x-access-token': TOKEN }));
  assert.equal(replies.length, 1, 'exactly one reply for one message');
  assertRouteReply(answer);
  assert.equal(headerValue(answer, 'x-asb-upstream'), 'sandbox');
  assert.equal(headerValue(answer, 'x-asb-dst'), '10.213.0.7:8080');
  assert.equal(headerValue(answer, 'x-asb-sandbox-id'), ID);
  assert.deepEqual(answer.request_headers?.response?.header_mutation?.remove_headers, ['x-access-token'], 'the token never reaches the sandbox');

  r.snapshot([entry(ID, { defaultPort: 3000 })]);
  const bare = await exchange(client, get(HOST(undefined), '/', { 'x-access-token': TOKEN }));
  assert.equal(headerValue(bare.answer, 'x-asb-dst'), '10.213.0.7:3000', 'no port prefix: the default port');
});

test('a port the template declares h2c goes through the sandbox-h2c upstream (HTTP/2 to the pod); every other port through sandbox (HTTP/1.1)', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID, { h2cPorts: [50051] })]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  const grpc = await exchange(client, get(HOST(50051), '/pkg.Svc/Call', { 'x-access-token': TOKEN }));
  assert.equal(headerValue(grpc.answer, 'x-asb-upstream'), 'sandbox-h2c');
  assert.equal(headerValue(grpc.answer, 'x-asb-dst'), '10.213.0.7:50051');
  const web = await exchange(client, get(HOST(8080), '/', { 'x-access-token': TOKEN }));
  assert.equal(headerValue(web.answer, 'x-asb-upstream'), 'sandbox');
});

test('envd (port 49983) goes to the owning worker with x-asb-sandbox-id and the token; an image with its own envd (envdInPod) keeps it in the pod', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID)]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  const toWorker = (answer: ProcessingResponse, what: string): void => {
    assertRouteReply(answer);
    assert.equal(headerValue(answer, 'x-asb-upstream'), 'api-c1', what);
    assert.equal(headerValue(answer, 'x-asb-sandbox-id'), ID, what);
    assert.equal(headerValue(answer, 'x-asb-dst'), undefined, what);
    assert.ok(!(answer.request_headers?.response?.header_mutation?.remove_headers ?? []).includes('x-access-token'), `${what}: the worker checks the token itself`);
  };
  toWorker((await exchange(client, get(HOST(49983), '/process.Process/Start', { 'x-access-token': TOKEN }))).answer, 'port-prefixed host');
  toWorker((await exchange(client, get(HOST(undefined), '/health', { 'x-access-token': TOKEN }))).answer, 'bare host, default port 49983');
  const e2b = await exchange(client, get('127.0.0.1:10000', '/files?path=/a', { 'e2b-sandbox-id': ID, 'e2b-sandbox-port': '49983', 'x-access-token': TOKEN, 'x-asb-sandbox-id': 'forged', 'x-asb-other': '1' }));
  toWorker(e2b.answer, 'E2B headers');
  assert.deepEqual([...(e2b.answer.request_headers?.response?.header_mutation?.remove_headers ?? [])].sort(), ['e2b-sandbox-id', 'e2b-sandbox-port', 'x-asb-other']);

  // Without a token only the health probe and signed /files URLs pass (the worker checks the signature).
  toWorker((await exchange(client, get(HOST(49983), '/health'))).answer, 'health without a token');
  toWorker((await exchange(client, get(HOST(49983), '/files?path=/a&signature=v1_abc'))).answer, 'signed URL without a token');
  assert.equal(immediate((await exchange(client, get(HOST(49983), '/files?path=/a'))).answer)?.status, 401);
  assert.equal(immediate((await exchange(client, get(HOST(49983), '/process.Process/List'))).answer)?.status, 401);
  assert.equal(immediate((await exchange(client, get(HOST(49983), '/health', { 'x-access-token': 'wrong' }))).answer)?.status, 403);

  // A hibernated sandbox is not woken by a tokenless call.
  r.snapshot([entry(ID, { state: 'hibernated', podIp: undefined })]);
  assert.equal(immediate((await exchange(client, get(HOST(49983), '/health'))).answer)?.status, 401);
  assert.equal(r.worker.resumes.get(ID), undefined);

  r.snapshot([entry(ID, { envdInPod: true })]);
  const inPod = await exchange(client, get(HOST(49983), '/health', { 'x-access-token': TOKEN }));
  assertRouteReply(inPod.answer);
  assert.equal(headerValue(inPod.answer, 'x-asb-upstream'), 'sandbox');
  assert.equal(headerValue(inPod.answer, 'x-asb-dst'), '10.213.0.7:49983');
  assert.deepEqual(inPod.answer.request_headers?.response?.header_mutation?.remove_headers, ['x-access-token']);
});

test('E2B headers route when the host is an IP, localhost or sandbox.<domain>, and are stripped', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID)]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  for (const host of ['127.0.0.1:10000', 'localhost', `sandbox.${DOMAIN}`, '[::1]:10000']) {
    const { answer } = await exchange(client, get(host, '/files', { 'e2b-sandbox-id': ID, 'e2b-sandbox-port': '3000', 'x-access-token': TOKEN }), 'half-close');
    assertRouteReply(answer);
    assert.equal(headerValue(answer, 'x-asb-dst'), '10.213.0.7:3000', host);
    assert.deepEqual([...(answer.request_headers?.response?.header_mutation?.remove_headers ?? [])].sort(), ['e2b-sandbox-id', 'e2b-sandbox-port', 'x-access-token']);
  }
});

test('a client-sent routing header can never redirect a request', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID, { publicPorts: [8080] })]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  const evil = { 'x-asb-upstream': 'api-c1', 'x-asb-dst': '169.254.169.254:80', 'x-asb-sandbox-id': 'someoneelse', 'x-asb-other': '1', 'X-Asb-Mixed': '2' };

  const { answer } = await exchange(client, get(HOST(8080), '/', evil));
  assertRouteReply(answer);
  assert.equal(headerValue(answer, 'x-asb-upstream'), 'sandbox');
  assert.equal(headerValue(answer, 'x-asb-dst'), '10.213.0.7:8080');
  assert.equal(headerValue(answer, 'x-asb-sandbox-id'), ID);
  assert.deepEqual([...(answer.request_headers?.response?.header_mutation?.remove_headers ?? [])].sort(), ['x-asb-mixed', 'x-asb-other']);

  // To the API: the destination a client tried to set is removed, the upstream overwritten.
  const api = await exchange(client, get(`api.${DOMAIN}`, `/sandboxes/${ID}`, evil));
  assertRouteReply(api.answer);
  assert.equal(headerValue(api.answer, 'x-asb-upstream'), 'api-c1');
  assert.ok(api.answer.request_headers?.response?.header_mutation?.remove_headers?.includes('x-asb-dst'));

  // An unknown host with routing headers is still refused, not routed.
  const refused = await exchange(client, get('evil.example.com', '/', evil));
  assert.equal(immediate(refused.answer)?.status, 404);
});

test('API paths on api.<domain> and the bare edge go to the owning worker API', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID)]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  for (const [host, path] of [
    [`api.${DOMAIN}`, '/sandboxes'],
    [`api.${DOMAIN}`, `/sandboxes/${ID}/pause`],
    ['127.0.0.1:10000', `/v2/sandboxes/${ID}`],
    ['localhost:10000', '/v1/sandboxes'],
  ] as const) {
    const { answer } = await exchange(client, get(host, path));
    assertRouteReply(answer);
    assert.equal(headerValue(answer, 'x-asb-upstream'), 'api-c1', `${host}${path}`);
    assert.equal(headerValue(answer, 'x-asb-dst'), undefined);
  }
});

test('refusals are immediate responses with a status, JSON body and no-space details', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID), entry('loc1bbbbbbbbbbbbbbbb', { state: 'failed', podIp: undefined })]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  const cases: [string, Record<string, string>, number, string][] = [
    [HOST(8080, 'loc1zzzzzzzzzzzzzzzz'), { 'x-access-token': TOKEN }, 404, 'NotFound'],
    [`99999-${ID}.${DOMAIN}`, {}, 400, 'BadRequest'],
    [`0-${ID}.${DOMAIN}`, {}, 400, 'BadRequest'],
    [`a.b.${DOMAIN}`, {}, 400, 'BadRequest'],
    [`Bad_Id.${DOMAIN}`, {}, 400, 'BadRequest'],
    ['127.0.0.1', { 'e2b-sandbox-id': ID, 'e2b-sandbox-port': 'http' }, 400, 'BadRequest'],
    [HOST(8080), {}, 401, 'Unauthorized'],
    [HOST(8080), { 'x-access-token': 'wrong' }, 403, 'Forbidden'],
    [HOST(8080), { cookie: 'asb_access=wrong' }, 403, 'Forbidden'],
    [HOST(8080, 'loc1bbbbbbbbbbbbbbbb'), { 'x-access-token': TOKEN }, 503, 'Unavailable'],
    // The port of the pod's init (its agent, src/runtime/local/agent.ts): even with the token.
    [HOST(49982), { 'x-access-token': TOKEN }, 403, 'Forbidden'],
    ['127.0.0.1', { 'e2b-sandbox-id': ID, 'e2b-sandbox-port': '49982', 'x-access-token': TOKEN }, 403, 'Forbidden'],
  ];
  for (const [host, extra, status, code] of cases) {
    const { answer, replies } = await exchange(client, get(host, '/', extra));
    // An id missing from the table is looked up at its worker first: a hold, then the answer.
    assert.equal(replies.length, code === 'NotFound' ? 2 : 1);
    const ir = immediate(answer);
    assert.ok(ir, `${host}: immediate response`);
    assert.equal(ir.status, status, `${host} ${JSON.stringify(extra)}`);
    assert.equal(ir.body.code, code);
    assert.equal(ir.headers['content-type'], 'application/json');
    assert.doesNotMatch(answer.immediate_response?.details ?? '', /\s/);
  }
  // The unknown id was asked about once; the negative cache answers the second time.
  await exchange(client, get(HOST(8080, 'loc1zzzzzzzzzzzzzzzz'), '/'));
  assert.equal(r.worker.lookups.get('loc1zzzzzzzzzzzzzzzz'), 1);
});

test("an unknown sandbox asked for E2B's way (its headers, or envd's port) gets E2B proxy's 502, which the SDKs read as not found", async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID)]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  const gone = 'loc1yyyyyyyyyyyyyyyy';
  const cases: [string, Record<string, string>, number][] = [
    ['127.0.0.1:10000', { 'e2b-sandbox-id': gone, 'e2b-sandbox-port': '49983' }, 502],
    [`sandbox.${DOMAIN}`, { 'e2b-sandbox-id': gone, 'e2b-sandbox-port': '8080' }, 502],
    [HOST(49983, gone), {}, 502],
    // Named by the host on another port: our own 404, whatever E2B headers ride along.
    [HOST(8080, gone), { 'e2b-sandbox-id': gone }, 404],
  ];
  for (const [host, extra, status] of cases) {
    const ir = immediate((await exchange(client, get(host, '/health', extra))).answer);
    assert.equal(ir?.status, status, `${host} ${JSON.stringify(extra)}`);
    if (status === 502) assert.deepEqual(ir.body, { sandboxId: gone, message: 'The sandbox was not found', code: 502 });
  }
});

test('a token in the header sets the access cookie on the response; the cookie alone then works and is stripped', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID, { publicPorts: [3000] })]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());

  const first = await exchange(client, get(HOST(8080), '/', { 'x-access-token': TOKEN }), 'rst', [{ response_headers: { headers: { headers: [{ key: ':status', raw_value: Buffer.from('200') }] } } }]);
  assert.equal(first.replies[0]?.mode_override?.response_header_mode, 1, 'SEND response headers for this request only');
  const cookie = first.answer.response_headers?.response?.header_mutation?.set_headers?.[0];
  assert.equal(cookie?.header.key, 'set-cookie');
  assert.equal(Buffer.from(cookie.header.raw_value ?? []).toString(), `asb_access=${TOKEN}; HttpOnly; Path=/; SameSite=Lax`);
  assert.equal(cookie.append?.value, true, 'append, so the sandbox’s own Set-Cookie survives');

  const withCookie = await exchange(client, get(HOST(8080), '/', { cookie: `a=1; asb_access=${TOKEN}; b=2` }));
  assertRouteReply(withCookie.answer);
  assert.equal(withCookie.answer.mode_override, undefined, 'no cookie to set: response headers stay skipped');
  assert.equal(headerValue(withCookie.answer, 'cookie'), 'a=1; b=2');

  const onlyCookie = await exchange(client, get(HOST(8080), '/', { cookie: `asb_access=${TOKEN}` }));
  assert.ok(onlyCookie.answer.request_headers?.response?.header_mutation?.remove_headers?.includes('cookie'));

  const open = await exchange(client, get(HOST(3000), '/'));
  assertRouteReply(open.answer);
  assert.equal(headerValue(open.answer, 'x-asb-dst'), '10.213.0.7:3000', 'a public port needs no token');
});

test('worker unreachable: API and wake requests get 503 with Retry-After at once; running pods still route', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID), entry('loc1hhhhhhhhhhhhhhhh', { state: 'hibernated', podIp: undefined })]);
  r.table.setConnected('c1', false);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  for (const req of [get(`api.${DOMAIN}`, '/sandboxes'), get(HOST(8080, 'loc1hhhhhhhhhhhhhhhh'), '/', { 'x-access-token': TOKEN })]) {
    const { answer, replies } = await exchange(client, req);
    assert.equal(replies.length, 1, 'no hold');
    assert.equal(immediate(answer)?.status, 503);
    assert.equal(immediate(answer)?.headers['retry-after'], '2');
  }
  const running = await exchange(client, get(HOST(8080), '/', { 'x-access-token': TOKEN }));
  assertRouteReply(running.answer);
});

test('concurrent first requests to a hibernated sandbox cause exactly one wake and all proceed once it runs', async (t) => {
  const r = await startRouterUnderTest(t);
  const sleeping = entry(ID, { state: 'hibernated', podIp: undefined });
  r.snapshot([sleeping]);
  // The worker resumes; the feed then reports starting, then running with a new pod IP.
  r.worker.onResume = (id) => {
    setTimeout(() => r.upsert(entry(id, { state: 'starting', podIp: undefined })), 20);
    setTimeout(() => r.upsert(entry(id, { podIp: '10.213.0.9' })), 60);
  };
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  const results = await Promise.all(Array.from({ length: 25 }, (_, i) => exchange(client, get(HOST(8080), `/${i}`, { 'x-access-token': TOKEN }), i % 2 === 0 ? 'rst' : 'half-close')));
  assert.equal(r.worker.resumes.get(ID), 1, 'one resume call for 25 held requests');
  for (const { replies, answer } of results) {
    assert.equal(replies.length, 2, 'override_message_timeout, then the answer');
    const override = replies[0]?.override_message_timeout;
    assert.ok(override !== undefined && override.seconds >= 25, 'the hold outlasts the 25 s hold limit');
    assert.deepEqual(Object.keys(replies[0] ?? {}), ['override_message_timeout'], 'the timeout message carries nothing else');
    assertRouteReply(answer);
    assert.equal(headerValue(answer, 'x-asb-dst'), '10.213.0.9:8080');
  }
  // The wake is forgotten once running: a later hibernation wakes again.
  r.upsert(sleeping);
  r.worker.onResume = (id) => setTimeout(() => r.upsert(entry(id)), 10);
  const again = await exchange(client, get(HOST(8080), '/app?session=s3cr3t', { 'x-access-token': TOKEN }));
  assertRouteReply(again.answer);
  assert.equal(r.worker.resumes.get(ID), 2);
  // Each wake tells the worker which request caused it (for the sandbox's lifecycle event), without the query.
  const [first, second] = r.worker.resumeBodies.get(ID) ?? [];
  assert.match(JSON.stringify(first), new RegExp(`^\\{"wait":false,"cause":\\{"host":"${HOST(8080).replaceAll('.', '\\.')}","path":"/\\d+"\\}\\}$`));
  assert.deepEqual(second, { wait: false, cause: { host: HOST(8080), path: '/app' } });
});

test("a sandbox paused without auto_resume: traffic gets E2B's 502 while its worker says paused, and is routed once a connect has resumed it, though the feed said so later", async (t) => {
  const r = await startRouterUnderTest(t, { lookupLimits: { burst: 3, ratePerS: 0.001 } });
  r.snapshot([entry(ID, { state: 'hibernated', podIp: undefined, resumeOnTraffic: false })]);
  r.worker.existing.add(ID);
  r.worker.phases.set(ID, 'Hibernated');
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  const envd = (): ReturnType<typeof get> => get('127.0.0.1:10000', '/files?path=/a', { 'e2b-sandbox-id': ID, 'e2b-sandbox-port': '49983', 'x-access-token': TOKEN });
  const E2B_GONE = { sandboxId: ID, message: 'The sandbox was not found', code: 502 };

  const paused = await exchange(client, envd());
  assert.deepEqual(immediate(paused.answer)?.body, E2B_GONE);
  assert.equal(r.worker.lookups.get(ID), 1, 'its worker was asked');
  assert.equal(r.worker.resumes.get(ID), undefined, 'traffic does not resume it');

  // A connect resumed it: its worker says Running; the feed says so only after the router asked.
  r.worker.phases.set(ID, 'Running');
  const pending = exchange(client, envd());
  await until(() => r.worker.lookups.get(ID) === 2, 5_000, 'the router asking the worker again');
  r.upsert(entry(ID, { podIp: '10.213.0.9' }));
  const resumed = await pending;
  assertRouteReply(resumed.answer);
  assert.equal(resumed.replies.length, 2, 'held until the feed showed it running');
  assert.equal(r.worker.resumes.get(ID), undefined, 'the router itself never resumed it');

  // Paused again: past the client's lookup budget the table's answer stands (E2B's 502, not a 429).
  r.worker.phases.set(ID, 'Hibernated');
  r.upsert(entry(ID, { state: 'hibernated', podIp: undefined, resumeOnTraffic: false }));
  for (let i = 0; i < 3; i++) assert.deepEqual(immediate((await exchange(client, envd())).answer)?.body, E2B_GONE, `request ${String(i)}`);
  assert.equal(r.worker.lookups.get(ID), 3, 'asked while its budget lasted, then not');
  assert.equal(r.worker.resumes.get(ID), undefined);
});

test('a request without the token cannot wake a sandbox', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID, { state: 'hibernated', podIp: undefined })]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  const { answer } = await exchange(client, get(HOST(8080), '/'));
  assert.equal(immediate(answer)?.status, 401);
  assert.equal(r.worker.resumes.get(ID), undefined);
});

test('past the hold limit, or when the wake fails, the client gets 503 with Retry-After', async (t) => {
  const clock = new ManualClock();
  const r = await startRouterUnderTest(t, { clock, holdLimitMs: 25_000 });
  r.snapshot([entry(ID, { state: 'hibernated', podIp: undefined }), entry('loc1ffffffffffffffff', { state: 'hibernated', podIp: undefined })]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());

  const held = exchange(client, get(HOST(8080), '/', { 'x-access-token': TOKEN }));
  await until(() => r.worker.resumes.get(ID) === 1, 5_000, 'the resume call');
  clock.advance(25_000);
  const { answer, replies } = await held;
  assert.equal(replies.length, 2);
  assert.equal(immediate(answer)?.status, 503);
  assert.equal(immediate(answer)?.headers['retry-after'], '2');

  r.worker.resumeStatus = 500;
  const failed = await exchange(client, get(HOST(8080, 'loc1ffffffffffffffff'), '/', { 'x-access-token': TOKEN }));
  assert.equal(immediate(failed.answer)?.status, 503);
  assert.equal(immediate(failed.answer)?.headers['retry-after'], '2');
});

test('Envoy going away during a hold (reset or half-close) releases the stream', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID, { state: 'starting', podIp: undefined })]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  for (const mode of ['rst', 'half-close'] as const) {
    const call = client.Process();
    call.on('error', () => undefined);
    const ended = new Promise<void>((resolve) => {
      call.on('status', () => resolve());
    });
    const first = new Promise<ProcessingResponse>((resolve) => call.once('data', resolve));
    call.write(get(HOST(8080), '/', { 'x-access-token': TOKEN }));
    const override = await first;
    assert.ok(override.override_message_timeout);
    await until(() => r.server.openStreams === 1, 5_000, 'the held stream');
    if (mode === 'rst') call.cancel();
    else call.end();
    await until(() => r.server.openStreams === 0, 5_000, `release after ${mode}`);
    if (mode === 'half-close') await ended;
  }
});

test('observability_mode messages get no reply; unknown host types still get exactly one', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID)]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  const call = client.Process();
  const got: ProcessingResponse[] = [];
  call.on('data', (m: ProcessingResponse) => got.push(m));
  const status = new Promise<number>((resolve) => call.on('status', (s: { code: number }) => resolve(s.code)));
  call.write({ ...get(HOST(8080), '/'), observability_mode: true });
  call.end();
  assert.equal(await status, 0);
  assert.equal(got.length, 0);
});

test('survives Envoy’s RST-per-stream default: 6000 reset streams, 50 at a time, none fail', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID, { publicPorts: [8080] })]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  let ok = 0;
  let next = 0;
  const total = 6_000;
  const worker = async (): Promise<void> => {
    while (next < total) {
      next += 1;
      const { answer } = await exchange(client, get(HOST(8080), '/'), next % 10 === 0 ? 'half-close' : 'rst');
      if (headerValue(answer, 'x-asb-upstream') === 'sandbox') ok += 1;
    }
  };
  await Promise.all(Array.from({ length: 50 }, worker));
  assert.equal(ok, total);
  await until(() => r.server.openStreams === 0, 5_000, 'all streams released');
});

test('gRPC health: SERVING for the ext_proc service, NOT_SERVING once closing', async (t) => {
  const r = await startRouterUnderTest(t);
  const health = healthClient(r.server.address);
  t.after(() => health.close());
  const check = (service: string): Promise<{ status?: number; code?: number }> =>
    new Promise((resolve) => {
      (health.Check as (req: unknown, cb: (err: { code: number } | null, res?: { status?: number }) => void) => void)({ service }, (err, res) => resolve(err === null ? (res ?? {}) : { code: err.code }));
    });
  assert.equal((await check('')).status, 1);
  assert.equal((await check('envoy.service.ext_proc.v3.ExternalProcessor')).status, 1);
  assert.equal((await check('other.Service')).code, 5);
  r.server.setServing(false);
  assert.deepEqual(await check(''), { status: 2 });
});

test('activity: routed requests are reported to the owning worker in one batch', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry(ID, { publicPorts: [8080] }), entry('loc1cccccccccccccccc', { publicPorts: [8080] })]);
  const client = extProcClient(r.server.address);
  t.after(() => client.close());
  for (let i = 0; i < 5; i++) await exchange(client, get(HOST(8080), '/'));
  await exchange(client, get(HOST(8080, 'loc1cccccccccccccccc'), '/'));
  await until(() => r.server.openStreams === 0);
  await r.activity.flush();
  assert.deepEqual(r.worker.activity.map((ids) => [...ids].sort()), [[ID, 'loc1cccccccccccccccc'].sort()]);
});
