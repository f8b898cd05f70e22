// The router's hand-written ext_proc codec and gRPC framing, cross-checked against protobufjs
// through the proto-loader definition of proto/ (the schema Envoy speaks), and the node:http2
// gRPC server against a raw HTTP/2 client that frames messages the way Envoy may.
import assert from 'node:assert/strict';
import http2 from 'node:http2';
import { test } from 'node:test';
import type { MethodDefinition } from '@grpc/grpc-js';
import { decodeProcessingRequest, encodeProcessingResponse } from '../src/router/extproc-codec.ts';
import { EXT_PROC_SERVICE, loadRouterProtos, type ProcessingRequest, type ProcessingResponse } from '../src/router/proto.ts';
import { get } from './support/envoy-mimic.ts';
import { DOMAIN, entry, startRouterUnderTest, TOKEN } from './support/router-fixture.ts';

function processMethod(): MethodDefinition<ProcessingRequest, ProcessingResponse> {
  const m = loadRouterProtos().extProc.Process;
  assert.ok(m);
  return m as MethodDefinition<ProcessingRequest, ProcessingResponse>;
}

/** protobufjs's view of bytes we encoded, Buffers as latin1 text for comparison. */
function viaProtobufjs(bytes: Buffer): unknown {
  return JSON.parse(JSON.stringify(processMethod().responseDeserialize(bytes), (_k, v: unknown) => (isJsonBuffer(v) ? Buffer.from(v.data).toString('latin1') : v)));
}

function isJsonBuffer(v: unknown): v is { type: 'Buffer'; data: number[] } {
  return typeof v === 'object' && v !== null && (v as { type?: unknown }).type === 'Buffer';
}

test('request_headers as Envoy encodes them decode to the same headers, unknown fields skipped', () => {
  const m = processMethod();
  const bytes = m.requestSerialize({
    request_headers: {
      headers: {
        headers: [
          { key: ':authority', raw_value: Buffer.from(`8080-abc.${DOMAIN}:10000`) },
          { key: 'cookie', raw_value: Buffer.from('a=1') },
          { key: 'cookie', raw_value: Buffer.from('b=\xe9', 'latin1') },
          // The raw-value runtime guard off: Envoy sends `value` instead.
          { key: 'x-old', value: 'plain' },
        ],
      },
      end_of_stream: true,
    },
  });
  // Fields Envoy adds that the router never reads: protocol_config (11) and a future field 99.
  const extra = Buffer.from([0x5a, 0x02, 0x08, 0x01, 0x98, 0x06, 0x07]);
  const decoded = decodeProcessingRequest(Buffer.concat([bytes, extra]));
  assert.equal(decoded.request, 'request_headers');
  const msg = decoded.request_headers;
  assert.ok(msg);
  assert.equal(msg.end_of_stream, true);
  const headers = (msg.headers?.headers ?? []).map((h) => [h.key, h.raw_value === undefined ? h.value : h.raw_value.toString('latin1')]);
  assert.deepEqual(headers, [
    [':authority', `8080-abc.${DOMAIN}:10000`],
    ['cookie', 'a=1'],
    ['cookie', 'b=\xe9'],
    ['x-old', 'plain'],
  ]);
});

test('every other message kind decodes to its oneof case; observability_mode is read', () => {
  const m = processMethod();
  for (const kase of ['response_headers', 'request_body', 'response_body', 'request_trailers', 'response_trailers'] as const) {
    assert.equal(decodeProcessingRequest(m.requestSerialize({ [kase]: {} })).request, kase);
  }
  const obs = decodeProcessingRequest(m.requestSerialize({ ...get('x'), observability_mode: true }));
  assert.equal(obs.observability_mode, true);
  assert.throws(() => decodeProcessingRequest(Buffer.from([0x12, 0x05, 0x0a])), /malformed protobuf/);
});

test('every answer the router sends reads back identically through protobufjs', () => {
  const raw = (s: string): Buffer => Buffer.from(s, 'latin1');
  const answers: ProcessingResponse[] = [
    {
      request_headers: {
        response: {
          header_mutation: { set_headers: [{ header: { key: 'x-asb-upstream', raw_value: raw('sandbox') } }, { header: { key: 'x-asb-dst', raw_value: raw('[fd00::1]:8080') } }], remove_headers: ['x-access-token', 'x-asb-foo'] },
          clear_route_cache: true,
        },
      },
      mode_override: { response_header_mode: 1 },
    },
    { response_headers: { response: { header_mutation: { set_headers: [{ header: { key: 'set-cookie', raw_value: raw('asb_access=t\xff') }, append: { value: true } }] } } } },
    {
      immediate_response: {
        status: { code: 503 },
        headers: { set_headers: [{ header: { key: 'retry-after', raw_value: raw('2') } }] },
        body: Buffer.from('{"code":503,"message":"asleep ✓"}'),
        details: 'asb_Unavailable',
      },
    },
    { override_message_timeout: { seconds: 28, nanos: 500_000_000 } },
    { response_trailers: {} },
  ];
  for (const a of answers) {
    const expected = viaProtobufjs(processMethod().responseSerialize(a));
    assert.deepEqual(viaProtobufjs(encodeProcessingResponse(a)), expected);
  }
  // Checklist 4: the plain CONTINUE answer is the empty request_headers message, never an empty reply.
  assert.equal(encodeProcessingResponse({ request_headers: {} }).toString('hex'), '0a00');
});

test('a message split across HTTP/2 DATA frames is answered once; unknown methods get UNIMPLEMENTED', async (t) => {
  const r = await startRouterUnderTest(t);
  r.snapshot([entry('loc1aaaaaaaaaaaaaaaa')]);
  const session = http2.connect(`http://${r.server.address}`);
  t.after(() => session.close());

  const message = processMethod().requestSerialize(get(`8080-loc1aaaaaaaaaaaaaaaa.${DOMAIN}`, '/', { 'x-access-token': TOKEN }));
  const frame = Buffer.alloc(5 + message.length);
  frame.writeUInt32BE(message.length, 1);
  message.copy(frame, 5);
  const stream = session.request({ ':method': 'POST', ':path': `/${EXT_PROC_SERVICE}/Process`, 'content-type': 'application/grpc', te: 'trailers' });
  const chunks: Buffer[] = [];
  stream.on('data', (c: Buffer) => chunks.push(c));
  const trailers = new Promise<http2.IncomingHttpHeaders>((resolve) => stream.once('trailers', resolve));
  // Two writes in two event-loop turns: two DATA frames, the first ending mid-length-prefix.
  await new Promise<void>((resolve) => stream.write(frame.subarray(0, 3), () => resolve()));
  await new Promise<void>((resolve) => setImmediate(resolve));
  stream.end(frame.subarray(3));
  // Envoy's graceful close: half-close; the router then ends the call with OK.
  assert.equal((await trailers)['grpc-status'], '0');
  const body = Buffer.concat(chunks);
  assert.equal(body.readUInt32BE(1) + 5, body.length, 'exactly one framed reply');
  const answer = processMethod().responseDeserialize(body.subarray(5));
  assert.ok(answer.request_headers?.response?.clear_route_cache);

  const unknown = session.request({ ':method': 'POST', ':path': '/envoy.service.ext_proc.v3.ExternalProcessor/Nope', 'content-type': 'application/grpc' });
  const headers = await new Promise<http2.IncomingHttpHeaders>((resolve) => unknown.once('response', resolve));
  unknown.resume();
  assert.equal(headers['grpc-status'], '12');
});
