// The ext_proc v3 messages on the wire, decoded and encoded by hand for the fields the router
// uses (proto.ts describes them; proto/ holds the schema). Why not protobufjs: at 50 concurrent
// requests through Envoy the grpc-js + protobufjs router spent ~125 µs of CPU per request, a
// bare node:http2 server answering a fixed message ~40 µs; decoding ProcessingRequest into
// the header list is all the per-request work we need, and it is short. Fields we do not read
// are skipped by wire type, as protobuf requires (Envoy adds fields over time).
// test/router-codec.test.ts round-trips both directions through the proto-loader definition.
import { readLen, reader, readVarint, skipField, WIRE, WireWriter, type WireReader } from './protobuf-wire.ts';
import type { CommonResponse, HeaderMutation, HeaderValue, HttpHeaders, ImmediateResponse, ProcessingRequest, ProcessingResponse } from './proto.ts';

type RequestCase = NonNullable<ProcessingRequest['request']>;
// ProcessingRequest field numbers of the `request` oneof.
const REQUEST_CASES: readonly (RequestCase | undefined)[] = [undefined, undefined, 'request_headers', 'response_headers', 'request_body', 'response_body', 'request_trailers', 'response_trailers'];

export function decodeProcessingRequest(buf: Buffer): ProcessingRequest {
  const r = reader(buf);
  const msg: ProcessingRequest = {};
  while (r.pos < r.end) {
    const tag = readVarint(r);
    const field = Math.floor(tag / 8);
    const wireType = tag & 7;
    const kase = REQUEST_CASES[field];
    if (kase !== undefined && wireType === WIRE.len) {
      const [start, end] = readLen(r);
      msg.request = kase;
      if (kase === 'request_headers') msg.request_headers = decodeHttpHeaders(reader(buf, start, end));
      else if (kase === 'response_headers') msg.response_headers = decodeHttpHeaders(reader(buf, start, end));
    } else if (field === 10 && wireType === WIRE.varint) {
      msg.observability_mode = readVarint(r) !== 0;
    } else {
      skipField(r, wireType);
    }
  }
  return msg;
}

function decodeHttpHeaders(r: WireReader): HttpHeaders {
  const out: HttpHeaders = {};
  while (r.pos < r.end) {
    const tag = readVarint(r);
    if (tag === ((1 << 3) | WIRE.len)) {
      const [start, end] = readLen(r);
      out.headers = { headers: decodeHeaderMap(reader(r.buf, start, end)) };
    } else if (tag === ((3 << 3) | WIRE.varint)) {
      out.end_of_stream = readVarint(r) !== 0;
    } else {
      skipField(r, tag & 7);
    }
  }
  return out;
}

function decodeHeaderMap(r: WireReader): HeaderValue[] {
  const list: HeaderValue[] = [];
  while (r.pos < r.end) {
    const tag = readVarint(r);
    if (tag === ((1 << 3) | WIRE.len)) {
      const [start, end] = readLen(r);
      list.push(decodeHeaderValue(reader(r.buf, start, end)));
    } else {
      skipField(r, tag & 7);
    }
  }
  return list;
}

function decodeHeaderValue(r: WireReader): HeaderValue {
  const h: HeaderValue = { key: '' };
  while (r.pos < r.end) {
    const tag = readVarint(r);
    const wireType = tag & 7;
    if (wireType !== WIRE.len) {
      skipField(r, wireType);
      continue;
    }
    const [start, end] = readLen(r);
    const field = tag >>> 3;
    if (field === 1) h.key = r.buf.toString('utf8', start, end);
    else if (field === 2) h.value = r.buf.toString('utf8', start, end);
    // A view, not a copy: the frame it points into lives as long as this request's headers.
    else if (field === 3) h.raw_value = r.buf.subarray(start, end);
  }
  return h;
}

export function encodeProcessingResponse(msg: ProcessingResponse): Buffer {
  const w = new WireWriter();
  if (msg.request_headers !== undefined) w.message(1, commonHolder(msg.request_headers.response));
  if (msg.response_headers !== undefined) w.message(2, commonHolder(msg.response_headers.response));
  if (msg.request_body !== undefined) w.message(3, commonHolder(msg.request_body.response));
  if (msg.response_body !== undefined) w.message(4, commonHolder(msg.response_body.response));
  if (msg.request_trailers !== undefined) w.message(5, trailersResponse(msg.request_trailers.header_mutation));
  if (msg.response_trailers !== undefined) w.message(6, trailersResponse(msg.response_trailers.header_mutation));
  if (msg.immediate_response !== undefined) w.message(7, immediateResponse(msg.immediate_response));
  if (msg.mode_override !== undefined) {
    const m = new WireWriter().uint(1, msg.mode_override.request_header_mode ?? 0).uint(2, msg.mode_override.response_header_mode ?? 0);
    w.message(9, m);
  }
  if (msg.override_message_timeout !== undefined) {
    w.message(10, new WireWriter().uint(1, msg.override_message_timeout.seconds).uint(2, msg.override_message_timeout.nanos));
  }
  return w.finish();
}

/** HeadersResponse / BodyResponse: `response` (field 1) is the CommonResponse. */
function commonHolder(common: CommonResponse | undefined): WireWriter {
  const w = new WireWriter();
  if (common !== undefined) w.message(1, commonResponse(common));
  return w;
}

function commonResponse(c: CommonResponse): WireWriter {
  const w = new WireWriter().uint(1, c.status ?? 0);
  if (c.header_mutation !== undefined) w.message(2, headerMutation(c.header_mutation));
  return w.bool(5, c.clear_route_cache);
}

function trailersResponse(mutation: HeaderMutation | undefined): WireWriter {
  const w = new WireWriter();
  if (mutation !== undefined) w.message(1, headerMutation(mutation));
  return w;
}

function headerMutation(m: HeaderMutation): WireWriter {
  const w = new WireWriter();
  for (const opt of m.set_headers ?? []) {
    const option = new WireWriter().message(1, headerValue(opt.header));
    if (opt.append !== undefined) option.message(2, new WireWriter().bool(1, opt.append.value));
    w.message(1, option);
  }
  for (const name of m.remove_headers ?? []) w.string(2, name);
  return w;
}

function headerValue(h: HeaderValue): WireWriter {
  const w = new WireWriter().string(1, h.key);
  if (h.value !== undefined && h.value !== '') w.string(2, h.value);
  if (h.raw_value !== undefined && h.raw_value.length > 0) w.bytes(3, h.raw_value);
  return w;
}

function immediateResponse(ir: ImmediateResponse): WireWriter {
  const w = new WireWriter().message(1, new WireWriter().uint(1, ir.status.code));
  if (ir.headers !== undefined) w.message(2, headerMutation(ir.headers));
  if (ir.body !== undefined && ir.body.length > 0) w.bytes(3, ir.body);
  if (ir.details !== undefined && ir.details !== '') w.string(5, ir.details);
  return w;
}
