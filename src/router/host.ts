// Where a request is going, from `:authority`, `:path` and E2B's routing headers alone (no
// table lookup): a sandbox port, a worker API, or a reason to refuse it.
//
//   <port>-<id>.<domain>   sandbox <id>, that port
//   <id>.<domain>          sandbox <id>, its template's default port
//   api.<domain>           the owning worker's REST/E2B API (owner from /sandboxes/<id> paths)
//   sandbox.<domain>, an IP address, localhost
//                          E2b-Sandbox-Id / E2b-Sandbox-Port headers (E2B SDK style), or
//                          X-Sandbox-ID / -Namespace / -Port / -Timeout (the kubernetes-sigs
//                          router contract: its Python SDK talks to the router's address), else API
//                          paths (/sandboxes…, /v2/sandboxes…, /v1/…) and the Kubernetes API's
//                          (/api…, /apis…, /version, /openapi/v3…: kubectl with .asb/kubeconfig)
//                          go to a worker API
import { isIP } from 'node:net';
import { AsbError } from '../errors.ts';
import { SIGS_DEFAULT_NAMESPACE, SIGS_DEFAULT_PORT } from './contract.ts';

export type Target =
  /** port undefined: the sandbox's default port (known only from its route entry); e2bHeaders: named by E2b-Sandbox-Id, not the host. */
  | { kind: 'sandbox'; id: string; port: number | undefined; e2bHeaders?: true; sigs?: SigsTarget }
  /** id: the sandbox the API path names, which decides the owning worker; undefined: any worker. */
  | { kind: 'api'; id: string | undefined };

/** What the kubernetes-sigs X-Sandbox-* headers add to a sandbox target (its port is always set). */
export interface SigsTarget {
  /** X-Sandbox-Namespace, default `default`: the worker answers 404 unless it is the sandbox's. */
  namespace: string;
  /** X-Sandbox-Timeout in seconds, capped at SIGS_MAX_TIMEOUT_S; undefined: not sent. */
  timeoutS: number | undefined;
}

/** The kubernetes-sigs routing headers as the client sent them (each undefined when absent). */
export interface SigsHeaders {
  id: string | undefined;
  namespace: string | undefined;
  port: string | undefined;
  timeout: string | undefined;
}

/** Upstream's Python router's proxy timeout, which X-Sandbox-Timeout may only lower: 180 s. */
export const SIGS_MAX_TIMEOUT_S = 180;

export interface RequestLine {
  /** `:authority` as Envoy sent it (may carry a port, any case). */
  authority: string;
  path: string;
  e2bSandboxId: string | undefined;
  e2bSandboxPort: string | undefined;
  /** Absent: none of X-Sandbox-ID / -Namespace / -Port / -Timeout was sent. */
  sigs?: SigsHeaders;
}

// Sandbox ids are DNS labels: generated ones are [a-z0-9]{20}, user-named ones may hold '-'.
const ID = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
// Any leading digits and '-' are a port prefix, so `123456-x` is a bad port (400), not an id
// (user-named ids that start that way are reached as <port>-<id>).
const PORT_PREFIXED = /^(\d+)-(.*)$/;
const PORT = /^\d{1,5}$/;
// Seconds as the SDK sends them: str() of an int or a float (`60`, `70.5`).
const SECONDS = /^\d{1,9}(\.\d{1,9})?$/;
// /sandboxes, /sandboxes/<id>…, /v2/sandboxes…, /v1/sandboxes/<id>… (E2B control plane and ours).
const API_SANDBOX_PATH = /^\/(?:v[12]\/)?sandboxes(?:\/([^/?#]*))?(?:[/?#]|$)/;
// E2B's snapshot list and its templates (a snapshot is deleted as /templates/<snapshotID>: a
// snapshot id starts with its cluster's tag, like a sandbox id, and names the owner the same way).
// The build API's /v2/templates/<id>/builds/… and /v3/templates go the same way: a built
// template's id starts with its cluster's tag too.
const API_TEMPLATE_PATH = /^\/(?:v[23]\/)?(?:snapshots|templates)(?:\/([^/?#]*))?(?:[/?#]|$)/;

// A sandbox's lifecycle events (E2B's /events/sandboxes/<id>, ours under /v1): kept by its worker.
const API_EVENTS_PATH = /^\/(?:v1\/)?events\/sandboxes\/([^/?#]*)(?:[/?#]|$)/;
// The rest of E2B's events API (the team's events, its webhooks): the worker behind this edge.
const API_EVENTS_ANY = /^\/events\/(?:sandboxes|webhooks)(?:[/?#]|$)/;

// The worker's Kubernetes API (src/kubeapi/): discovery, /version, OpenAPI v3 and /apis/… objects.
const KUBE_API_PATH = /^\/(?:api|apis|version|openapi\/v3)(?:[/?#]|$)/;
// A Sandbox object's path names the sandbox whose worker owns it, like /v1/sandboxes/<id>.
const KUBE_SANDBOX_PATH = /^\/apis\/agents\.x-k8s\.io\/v1(?:alpha|beta)1\/namespaces\/[^/?#]+\/sandboxes\/([^/?#]*)(?:[/?#]|$)/;

/** Resolves the target, or throws AsbError BadRequest (malformed host/port/id) or NotFound. */
export function parseTarget(line: RequestLine, domain: string): Target {
  const host = hostOf(line.authority);
  if (host === `sandbox.${domain}` || host === 'localhost' || isIP(host) !== 0) return bareTarget(line, host === `sandbox.${domain}`);
  // Any other host names its target itself; X-Sandbox-* naming one too would be two answers, and
  // picking either silently could send a request to a sandbox its client did not mean.
  if (line.sigs !== undefined && (line.sigs.id !== undefined || line.sigs.port !== undefined || line.sigs.namespace !== undefined)) {
    throw new AsbError('BadRequest', `X-Sandbox-ID/-Namespace/-Port route requests sent to the edge's address (an IP, localhost or sandbox.${domain}), not to host "${host}", which names its own target: drop them or address the edge`);
  }
  if (host === `api.${domain}`) return { kind: 'api', id: apiSandboxId(line.path) };
  const suffix = `.${domain}`;
  if (!host.endsWith(suffix)) throw new AsbError('NotFound', `host "${host}" is not served here (expected <port>-<sandboxId>.${domain})`);
  const label = host.slice(0, -suffix.length);
  if (label.includes('.')) throw new AsbError('BadRequest', `malformed host "${host}": expected <port>-<sandboxId>.${domain} or <sandboxId>.${domain}`);
  const prefixed = PORT_PREFIXED.exec(label);
  if (prefixed !== null) return { kind: 'sandbox', id: sandboxId(prefixed[2] ?? '', host), port: portNumber(prefixed[1] ?? '', host) };
  return { kind: 'sandbox', id: sandboxId(label, host), port: undefined };
}

/** Lower-cased host without its port; `[v6]:p` → `v6`. */
export function hostOf(authority: string): string {
  const a = authority.toLowerCase();
  if (a.startsWith('[')) {
    const end = a.indexOf(']');
    return end === -1 ? a : a.slice(1, end);
  }
  const colon = a.indexOf(':');
  // Two colons: a bare IPv6 address without brackets (no port can be told apart).
  if (colon === -1 || a.indexOf(':', colon + 1) !== -1) return a;
  return a.slice(0, colon);
}

function bareTarget(line: RequestLine, sandboxHost: boolean): Target {
  const sigs = line.sigs;
  if (sigs !== undefined && (sigs.id !== undefined || sigs.port !== undefined || sigs.namespace !== undefined)) {
    if (line.e2bSandboxId !== undefined || line.e2bSandboxPort !== undefined) {
      throw new AsbError('BadRequest', 'both E2b-Sandbox-* and X-Sandbox-* routing headers: send one set (E2B SDK or kubernetes-sigs SDK), not both');
    }
    return sigsTarget(sigs);
  }
  if (line.e2bSandboxId !== undefined) {
    const id = line.e2bSandboxId.trim().toLowerCase();
    if (!ID.test(id)) throw new AsbError('BadRequest', `malformed E2b-Sandbox-Id header ${JSON.stringify(line.e2bSandboxId)}`);
    const port = line.e2bSandboxPort === undefined ? undefined : portNumber(line.e2bSandboxPort.trim(), 'E2b-Sandbox-Port header');
    return { kind: 'sandbox', id, port, e2bHeaders: true };
  }
  if (line.e2bSandboxPort !== undefined) throw new AsbError('BadRequest', 'E2b-Sandbox-Port header without E2b-Sandbox-Id');
  if (line.path.startsWith('/v1/') || API_SANDBOX_PATH.test(line.path) || API_TEMPLATE_PATH.test(line.path) || API_EVENTS_ANY.test(line.path) || KUBE_API_PATH.test(line.path)) return { kind: 'api', id: apiSandboxId(line.path) };
  if (sandboxHost) throw new AsbError('BadRequest', 'requests to sandbox.<domain> need the E2b-Sandbox-Id header');
  throw new AsbError('NotFound', 'no sandbox named: use <port>-<sandboxId>.<domain>, the E2b-Sandbox-Id header, or an API path');
}

/** A sandbox named by the kubernetes-sigs headers: id required, port default 8888, namespace default `default`. */
function sigsTarget(sigs: SigsHeaders): Target {
  if (sigs.id === undefined) throw new AsbError('BadRequest', 'X-Sandbox-Namespace or X-Sandbox-Port header without X-Sandbox-ID');
  const id = sigs.id.trim();
  // Upstream's routers refuse anything but a DNS-1123 label (400); so do we, case included.
  if (!ID.test(id)) throw new AsbError('BadRequest', `malformed X-Sandbox-ID header ${JSON.stringify(sigs.id)}: expected a sandbox id (a DNS-1123 label)`);
  const namespace = sigs.namespace?.trim() ?? SIGS_DEFAULT_NAMESPACE;
  if (!ID.test(namespace)) throw new AsbError('BadRequest', `malformed X-Sandbox-Namespace header ${JSON.stringify(sigs.namespace)}: expected a namespace (a DNS-1123 label)`);
  const port = sigs.port === undefined ? SIGS_DEFAULT_PORT : portNumber(sigs.port.trim(), 'X-Sandbox-Port header');
  return { kind: 'sandbox', id, port, sigs: { namespace, timeoutS: sigs.timeout === undefined ? undefined : seconds(sigs.timeout) } };
}

function seconds(text: string): number {
  const value = SECONDS.test(text.trim()) ? Number(text.trim()) : NaN;
  if (!(value > 0)) throw new AsbError('BadRequest', `malformed X-Sandbox-Timeout header ${JSON.stringify(text)}: expected seconds > 0`);
  return Math.min(value, SIGS_MAX_TIMEOUT_S);
}

/** The sandbox id an API path names, if any: `/sandboxes/<id>…`, `/v2/sandboxes/<id>…`, `/v1/sandboxes/<id>…`, `/apis/agents.x-k8s.io/<v>/namespaces/<ns>/sandboxes/<id>…`, `[/v1]/events/sandboxes/<id>`. */
export function apiSandboxId(path: string): string | undefined {
  const m = API_SANDBOX_PATH.exec(path) ?? KUBE_SANDBOX_PATH.exec(path) ?? API_TEMPLATE_PATH.exec(path) ?? API_EVENTS_PATH.exec(path);
  const id = m?.[1];
  return id !== undefined && ID.test(id) ? id : undefined;
}

function sandboxId(text: string, where: string): string {
  if (!ID.test(text)) throw new AsbError('BadRequest', `malformed sandbox id "${text}" in ${where}`);
  return text;
}

function portNumber(text: string, where: string): number {
  const port = PORT.test(text) ? Number(text) : NaN;
  if (!(port >= 1 && port <= 65535)) throw new AsbError('BadRequest', `malformed port "${text}" in ${where}: expected 1-65535`);
  return port;
}
