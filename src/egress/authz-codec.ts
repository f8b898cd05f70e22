// Envoy's ext_authz v3 messages (envoy.service.auth.v3) on the wire, for the fields the egress
// decision reads and writes; everything else is skipped by wire type. Field numbers from
// envoy/service/auth/v3/{external_auth,attribute_context}.proto and
// envoy/config/core/v3/{address,base}.proto; checked against what Envoy 1.40 sends
// (test/egress-authz.test.ts decodes a CheckRequest captured from it). Same hand-written wire
// code as the router's ext_proc codec, for the same reason (src/router/extproc-codec.ts).
import { readLen, reader, readVarint, skipField, WIRE, WireWriter, type WireReader } from '../router/protobuf-wire.ts';

/** What one CheckRequest says about a connection (network filter) or a request (HTTP filter). */
export interface CheckAttributes {
  /** The downstream peer: the sandbox's pod address. */
  sourceIp: string;
  /** The pod's source port: with sourceIp, Envoy's downstream socket (open-connections.ts); absent when Envoy sent none. */
  sourcePort?: number;
  /** The connection's local address: the original destination, restored by the original_dst listener filter. */
  destinationIp: string;
  destinationPort: number;
  /** TLS SNI (network filter with include_tls_session, or an HTTP request on a TLS connection). */
  sni?: string;
  /** The HTTP request, when the HTTP filter asks. */
  http?: { host: string; path: string; method: string };
}

interface Peer {
  ip: string;
  port: number;
}

function strOf(r: WireReader): string {
  const [start, end] = readLen(r);
  return r.buf.toString('utf8', start, end);
}

function sub(r: WireReader): WireReader {
  const [start, end] = readLen(r);
  return reader(r.buf, start, end);
}

/** Iterates a message's fields; `on` reads the field from `r` and returns true, or returns false to skip it. */
function fields(r: WireReader, on: (field: number, wireType: number, r: WireReader) => boolean): void {
  while (r.pos < r.end) {
    const tag = readVarint(r);
    const field = Math.floor(tag / 8);
    const wireType = tag & 7;
    if (!on(field, wireType, r)) skipField(r, wireType);
  }
}

// Peer.address(1) → Address.socket_address(1) → SocketAddress.address(2), port_value(3).
function decodePeer(peerReader: WireReader): Peer {
  const peer: Peer = { ip: '', port: 0 };
  fields(peerReader, (f, w, r) => {
    if (f !== 1 || w !== WIRE.len) return false;
    fields(sub(r), (af, aw, ar) => {
      if (af !== 1 || aw !== WIRE.len) return false;
      fields(sub(ar), (sf, sw, sr) => {
        if (sf === 2 && sw === WIRE.len) peer.ip = strOf(sr);
        else if (sf === 3 && sw === WIRE.varint) peer.port = readVarint(sr);
        else return false;
        return true;
      });
      return true;
    });
    return true;
  });
  return peer;
}

// Request.http(2) → HttpRequest: method(2), path(4), host(5).
function decodeRequest(requestReader: WireReader): CheckAttributes['http'] {
  let http: CheckAttributes['http'];
  fields(requestReader, (f, w, r) => {
    if (f !== 2 || w !== WIRE.len) return false;
    const h = { host: '', path: '', method: '' };
    fields(sub(r), (hf, hw, hr) => {
      if (hw !== WIRE.len) return false;
      if (hf === 2) h.method = strOf(hr);
      else if (hf === 4) h.path = strOf(hr);
      else if (hf === 5) h.host = strOf(hr);
      else return false;
      return true;
    });
    http = h;
    return true;
  });
  return http;
}

/** CheckRequest.attributes(1): source(1), destination(2), request(4), tls_session(12).sni(1). */
export function decodeCheckRequest(buf: Buffer): CheckAttributes {
  let source: Peer = { ip: '', port: 0 };
  let destination: Peer = { ip: '', port: 0 };
  let sni: string | undefined;
  let http: CheckAttributes['http'];
  fields(reader(buf), (f, w, r) => {
    if (f !== 1 || w !== WIRE.len) return false;
    fields(sub(r), (af, aw, ar) => {
      if (aw !== WIRE.len) return false;
      if (af === 1) source = decodePeer(sub(ar));
      else if (af === 2) destination = decodePeer(sub(ar));
      else if (af === 4) http = decodeRequest(sub(ar));
      else if (af === 12) {
        fields(sub(ar), (tf, tw, tr) => {
          if (tf !== 1 || tw !== WIRE.len) return false;
          const name = strOf(tr);
          if (name !== '') sni = name;
          return true;
        });
      } else return false;
      return true;
    });
    return true;
  });
  return {
    sourceIp: source.ip,
    ...(source.port === 0 ? {} : { sourcePort: source.port }),
    destinationIp: destination.ip,
    destinationPort: destination.port,
    ...(sni === undefined ? {} : { sni }),
    ...(http === undefined ? {} : { http }),
  };
}

/** google.rpc.Code values Envoy reads from CheckResponse.status. */
export const RPC_CODE = { ok: 0, permissionDenied: 7 } as const;

export interface CheckVerdict {
  allowed: boolean;
  /** OK only: headers set on the upstream request (HTTP filter), replacing any the sandbox sent. */
  setHeaders?: readonly { name: string; value: string }[];
  /** Denied only: the HTTP status, body and headers the HTTP filter answers with (the network filter just closes). */
  deniedStatus?: number;
  deniedBody?: string;
  deniedHeaders?: readonly { name: string; value: string }[];
}

// HeaderValueOption{header(1): HeaderValue{key(1), value(2)}}; `append` unset means overwrite.
function headerOption(name: string, value: string): WireWriter {
  return new WireWriter().message(1, new WireWriter().string(1, name).string(2, value));
}

/**
 * CheckResponse: status(1) = google.rpc.Status{code(1)}; ok_response(3) = OkHttpResponse{headers(2)};
 * denied_response(2) = DeniedHttpResponse{status(1) = HttpStatus{code(1)}, headers(2), body(3)}.
 */
export function encodeCheckResponse(v: CheckVerdict): Buffer {
  const w = new WireWriter();
  if (v.allowed) {
    w.message(1, new WireWriter());
    const ok = new WireWriter();
    for (const h of v.setHeaders ?? []) ok.message(2, headerOption(h.name, h.value));
    w.message(3, ok);
  } else {
    w.message(1, new WireWriter().uint(1, RPC_CODE.permissionDenied));
    const denied = new WireWriter().message(1, new WireWriter().uint(1, v.deniedStatus ?? 403));
    for (const h of v.deniedHeaders ?? []) denied.message(2, headerOption(h.name, h.value));
    if (v.deniedBody !== undefined) denied.string(3, v.deniedBody);
    w.message(2, denied);
  }
  return w.finish();
}
