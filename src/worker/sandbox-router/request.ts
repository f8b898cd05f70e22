// What the owning worker reads from a request the router sent by the kubernetes-sigs X-Sandbox-*
// headers (src/router/host.ts, decide.ts toWorkerSigs), and what of it may go on to the pod. Pure.
//
// The router validated the client's headers and handed them on as x-asb-sandbox-id, -port,
// -namespace and -timeout, which no client can set through it (every client x-asb-* header is
// removed). Anyone reaching the worker port directly can set them, so they grant nothing: the
// worker serves such a request only to the API key of the sandbox's team.
import type { IncomingHttpHeaders } from 'node:http';
import { AsbError } from '../../errors.ts';
import { ACCESS_COOKIE, HEADER, INTERNAL_HEADER_PREFIX, SIGS_HEADER_PREFIX, SIGS_DEFAULT_PORT } from '../../router/contract.ts';

/**
 * Pod template annotation `asb.dev/python-runtime: pod`: the image itself serves the
 * python-runtime API on 8888 (upstream's examples/python-runtime-sandbox), so requests for port
 * 8888 go to the pod like any other port. Otherwise the worker answers that protocol itself
 * (src/worker/python-runtime/), as it answers envd: no agent runs in our images.
 */
export const PYTHON_RUNTIME_ANNOTATION = 'asb.dev/python-runtime';

/** The python-runtime's port: the SDK's server_port default. */
export const PYTHON_RUNTIME_PORT = SIGS_DEFAULT_PORT;

/** Upstream's Python router's proxy timeout, when the client sent no X-Sandbox-Timeout: 180 s. */
export const DEFAULT_SIGS_TIMEOUT_MS = 180_000;

export interface SigsCall {
  id: string;
  port: number;
  namespace: string;
  /** How long the pod may take to start its answer. */
  timeoutMs: number;
}

/** Whether the router sent this request by the X-Sandbox-* headers (it alone sets x-asb-sandbox-port). */
export function isSigsRequest(headers: IncomingHttpHeaders): boolean {
  return headers[HEADER.sandboxId] !== undefined && headers[HEADER.sandboxPort] !== undefined;
}

/** The call the router's headers describe; BadRequest for values the router never sends. */
export function sigsCallOf(headers: IncomingHttpHeaders): SigsCall {
  const id = one(headers[HEADER.sandboxId]);
  const portText = one(headers[HEADER.sandboxPort]);
  const port = /^\d{1,5}$/.test(portText) ? Number(portText) : NaN;
  if (!(port >= 1 && port <= 65535)) throw new AsbError('BadRequest', `malformed ${HEADER.sandboxPort} header "${portText}"`);
  const namespace = one(headers[HEADER.sandboxNamespace]);
  if (namespace === '') throw new AsbError('BadRequest', `missing ${HEADER.sandboxNamespace} header`);
  const timeoutText = headers[HEADER.sandboxTimeout];
  let timeoutMs = DEFAULT_SIGS_TIMEOUT_MS;
  if (timeoutText !== undefined) {
    const s = Number(one(timeoutText));
    if (!(s > 0)) throw new AsbError('BadRequest', `malformed ${HEADER.sandboxTimeout} header`);
    timeoutMs = Math.min(Math.ceil(s * 1000), DEFAULT_SIGS_TIMEOUT_MS);
  }
  return { id, port, namespace, timeoutMs };
}

function one(value: string | string[] | undefined): string {
  return (Array.isArray(value) ? value[0] : value)?.trim() ?? '';
}

// RFC 9110 §7.6.1 hop-by-hop headers, and the ones Node sets itself for the new connection.
const HOP_BY_HOP: ReadonlySet<string> = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

/**
 * The request headers the pod gets: the client's, minus hop-by-hop ones, minus every credential
 * and routing header of ours or upstream's: the API key (Authorization, X-API-Key), the access
 * token and its cookie, x-asb-*, x-sandbox-* (X-Sandbox-Pod-IP included), E2B's. Plus
 * x-asb-sandbox-id, which every sandbox port gets from the edge.
 */
export function podRequestHeaders(headers: IncomingHttpHeaders, id: string): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  const named = connectionTokens(headers.connection);
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || HOP_BY_HOP.has(name) || named.has(name)) continue;
    if (name === 'authorization' || name === 'x-api-key' || name === HEADER.accessToken) continue;
    if (name.startsWith(INTERNAL_HEADER_PREFIX) || name.startsWith(SIGS_HEADER_PREFIX) || name.startsWith('e2b-sandbox-')) continue;
    if (name === 'cookie') {
      const rest = withoutAccessCookie(Array.isArray(value) ? value.join('; ') : value);
      if (rest !== '') out[name] = rest;
      continue;
    }
    out[name] = value;
  }
  out[HEADER.sandboxId] = id;
  return out;
}

/**
 * The response headers the client gets: the pod's minus hop-by-hop ones, and Set-Cookie cleaned
 * as the edge's Lua filter cleans the sandbox upstream's (envoy/edge.yaml), which these responses
 * (from a worker upstream) never pass: sandbox.<domain> is under <domain> too, so a cookie set
 * with Domain=<domain> would reach every sandbox host and could shadow its asb_access. Domain
 * attributes are removed, and a cookie named asb_access (only the router sets it) is dropped.
 */
export function clientResponseHeaders(headers: IncomingHttpHeaders): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  const named = connectionTokens(headers.connection);
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || HOP_BY_HOP.has(name) || named.has(name)) continue;
    if (name === 'set-cookie') {
      const kept = (Array.isArray(value) ? value : [value]).map(hostOnlyCookie).filter((c) => c !== undefined);
      if (kept.length > 0) out[name] = kept;
      continue;
    }
    out[name] = value;
  }
  return out;
}

/** undefined: drop it (asb_access); otherwise the Set-Cookie value without Domain attributes. */
function hostOnlyCookie(value: string): string | undefined {
  const [first = '', ...attributes] = value.split(';').map((p) => p.trim());
  if (attrName(first) === ACCESS_COOKIE) return undefined;
  return [first, ...attributes.filter((a) => a !== '' && attrName(a) !== 'domain')].join('; ');
}

function attrName(part: string): string {
  const eq = part.indexOf('=');
  return (eq === -1 ? part : part.slice(0, eq)).trim().toLowerCase();
}

function connectionTokens(value: string | undefined): Set<string> {
  return new Set((value ?? '').split(',').map((t) => t.trim().toLowerCase()).filter((t) => t !== ''));
}

function withoutAccessCookie(header: string): string {
  return header
    .split(';')
    .map((p) => p.trim())
    .filter((p) => p !== '' && !p.startsWith(`${ACCESS_COOKIE}=`))
    .join('; ');
}
