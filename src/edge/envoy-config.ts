// The local Envoy configuration, generated from the production template envoy/edge.yaml so the
// two cannot drift: `make up` and the tests run the file production runs, with local values.
//
// The federation parts of the template (the `ingress` listener, the `ingress` and `hub` upstream
// clusters) are optional: each is dropped unless its options are given, so a single cluster runs
// the same file without certificates or a hub.
//
// A "static" listener can be added beside the edge: the same HTTP connection manager with the
// ext_proc filter taken out and one fixed upstream. The benchmark measures the router's cost as
// the ratio between the two listeners of one Envoy in one run.
import { existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { stringify } from 'yaml';
import { AsbError, type FieldProblem } from '../errors.ts';
import { UPSTREAM } from '../router/contract.ts';
import {
  arrayAt,
  fillTemplate,
  isConfigObject,
  namedEntry,
  objectAt,
  parseTemplate,
  type ConfigNode,
  type ConfigObject,
  type TemplateValue,
  type TemplateValues,
} from './envoy-template.ts';
import { EDGE_SAN, INGRESS_SAN, type FederationTls } from './tls.ts';
import { parseHostPort } from '../base/host-port.ts';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

/** envoy/edge.yaml in this checkout. */
export const EDGE_TEMPLATE_PATH = join(repoRoot, 'envoy', 'edge.yaml');

export const EDGE_DEFAULTS = Object.freeze({
  listenAddress: '127.0.0.1',
  listenPort: 10000,
  adminAddress: '127.0.0.1',
  adminPort: 9901,
  routerAddress: '127.0.0.1:9002',
  /** An ordinary router answer takes well under 1 ms; 1 s leaves room for a GC pause on a 1M-route heap. */
  messageTimeoutMs: 1000,
  /** Ceiling for the router's override_message_timeout: above its 25 s hold limit, so its 503 comes first. */
  maxMessageTimeoutMs: 30_000,
  accessLogPath: '/dev/stdout',
});

/** The cluster the router names in x-asb-upstream for a worker cluster's API. */
export function apiClusterName(cluster: string): string {
  return `api-${cluster}`;
}
/** The ORIGINAL_DST cluster for pods. */
export const SANDBOX_CLUSTER = UPSTREAM.sandbox;
/** The ORIGINAL_DST cluster (mutual TLS) for other clusters' ingress listeners. */
export const INGRESS_CLUSTER = UPSTREAM.ingress;
/** The hub's API. */
export const HUB_CLUSTER = UPSTREAM.hub;
/** The listener other clusters' Envoys forward to. */
export const INGRESS_LISTENER = 'ingress';
/** The HTTPS edge listener. */
export const EDGE_TLS_LISTENER = 'edge_tls';
export const STATIC_CLUSTER = 'static-upstream';
/** The egress listener and its clusters (src/egress/). */
export const EGRESS_LISTENER = 'egress';
export const EGRESS_AUTHZ_CLUSTER = 'asb-egress-authz';
export const EGRESS_ORIGINAL_CLUSTER = 'egress-original';
export const EGRESS_ORIGINAL_TLS_CLUSTER = 'egress-original-tls';
const INTERCEPT_PATTERN = 'egress-intercept-{{INTERCEPT_HOST}}';
/** Debian's CA bundle (package ca-certificates): what the proxy trusts toward credential hosts by default. */
export const SYSTEM_CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';

/** A host whose TLS the egress proxy terminates to inject credentials, and its certificate (src/egress/egress-ca.ts). */
export interface InterceptHost {
  host: string;
  certChainPath: string;
  privateKeyPath: string;
}

export interface EdgeWorker {
  /** Worker cluster name (lowercase letters, digits, dashes). */
  cluster: string;
  /** `host:port` of its REST API. */
  apiAddress: string;
}

export interface EdgeConfigOptions {
  /** Edge listener port; 0 lets the kernel choose (EnvoyProcess reads it back). */
  listenPort: number;
  listenAddress?: string;
  adminPort: number;
  adminAddress?: string;
  /** `host:port` of the router's gRPC server. */
  routerAddress: string;
  workers: readonly EdgeWorker[];
  /**
   * Federation: adds the `ingress` listener (mutual TLS; needs `tls`), where other clusters'
   * Envoys forward requests for this cluster. Port 0 lets the kernel choose (EnvoyProcess reads
   * it back). The address defaults to listenAddress's default, 127.0.0.1.
   */
  ingress?: { listenPort: number; listenAddress?: string };
  /**
   * Federation: the CA, certificate and key of the ingress hop (src/edge/tls.ts makes them
   * locally). Adds the `ingress` upstream cluster; the `ingress` listener needs it too.
   */
  tls?: FederationTls;
  /** Adds the HTTPS edge listener (edge_tls): same routes, TLS with h2 and http/1.1. Port 0 lets the kernel choose. */
  edgeTls?: { listenPort: number; listenAddress?: string; certChainPath: string; privateKeyPath: string };
  /** Federation: `host:port` of the hub's API; adds the `hub` upstream cluster. */
  hubAddress?: string;
  /**
   * Egress proxy: adds the `egress` listener on the pods' gateway address (port 0 lets the kernel
   * choose) and the clusters it uses; `authzAddress` is the worker's egress decision service.
   */
  egress?: {
    listenAddress: string;
    listenPort: number;
    authzAddress: string;
    /** Credential-injection hosts: the only ones whose TLS the proxy opens. */
    intercept?: readonly InterceptHost[];
    /** CA bundle for those hosts' real certificates; default SYSTEM_CA_BUNDLE. */
    upstreamCaPath?: string;
    /**
     * The egress listener comes from this file (LDS from a path, egressLdsJson) instead of the
     * static config, so a credential rule for a new host takes effect without restarting Envoy:
     * the file's owner (the worker) replaces it by rename and Envoy swaps the listener, draining
     * the old one's connections. `intercept` here only fills the first file. Needs a fixed
     * listenPort (a reload must bind the same port).
     */
    ldsPath?: string;
  };
  /** Adds the benchmark's comparison listener: no ext_proc, every request to upstreamAddress. */
  static?: { listenPort: number; upstreamAddress: string };
  /** Envoy half-closes ext_proc streams instead of resetting them (runtime guard; default false). */
  gracefulClose?: boolean;
  messageTimeoutMs?: number;
  maxMessageTimeoutMs?: number;
  /** Where Envoy writes one JSON line per request. */
  accessLogPath?: string;
  nodeId?: string;
  /** Template text to use instead of envoy/edge.yaml. */
  templateText?: string;
}

/** The edge configuration as an object (what Envoy reads), from the template and opts. */
export function edgeConfig(opts: EdgeConfigOptions): ConfigObject {
  const problems = validate(opts);
  if (problems.length > 0) {
    const detail = problems.map((p) => `${p.field}: ${p.message}`).join('; ');
    throw new AsbError('Invalid', `Envoy configuration options are invalid: ${detail}`, { fields: problems });
  }
  const router = parseHostPort(opts.routerAddress) ?? { host: '', port: 0 };
  const template = parseTemplate(opts.templateText ?? readFileSync(EDGE_TEMPLATE_PATH, 'utf8'), 'envoy/edge.yaml');
  const values: TemplateValues = {
    NODE_ID: opts.nodeId ?? 'asb-edge-local',
    LISTEN_ADDRESS: opts.listenAddress ?? EDGE_DEFAULTS.listenAddress,
    LISTEN_PORT: opts.listenPort,
    ADMIN_ADDRESS: opts.adminAddress ?? EDGE_DEFAULTS.adminAddress,
    ADMIN_PORT: opts.adminPort,
    ACCESS_LOG_PATH: opts.accessLogPath ?? EDGE_DEFAULTS.accessLogPath,
    ROUTER_HOST: router.host,
    ROUTER_PORT: router.port,
    MESSAGE_TIMEOUT: duration(opts.messageTimeoutMs ?? EDGE_DEFAULTS.messageTimeoutMs),
    MAX_MESSAGE_TIMEOUT: duration(opts.maxMessageTimeoutMs ?? EDGE_DEFAULTS.maxMessageTimeoutMs),
    EXT_PROC_GRACEFUL_CLOSE: opts.gracefulClose ?? false,
    ...federationValues(opts),
  };

  // The api-{{WORKER_CLUSTER}} entry is a pattern: taken out, filled once per worker.
  const resources = objectAt(template, 'static_resources', '');
  const clusters = arrayAt(resources, 'clusters', 'static_resources');
  const apiPattern = namedEntry(clusters, 'api-{{WORKER_CLUSTER}}', 'static_resources.clusters');
  clusters.splice(clusters.indexOf(apiPattern), 1);
  // Federation parts that are not configured go before filling: their placeholders have no value.
  keepIf(opts.edgeTls !== undefined, resources, 'listeners', EDGE_TLS_LISTENER);
  keepIf(opts.ingress !== undefined, resources, 'listeners', INGRESS_LISTENER);
  keepIf(opts.tls !== undefined, resources, 'clusters', INGRESS_CLUSTER);
  keepIf(opts.hubAddress !== undefined, resources, 'clusters', HUB_CLUSTER);
  keepIf(opts.egress !== undefined, resources, 'listeners', EGRESS_LISTENER);
  keepIf(opts.egress !== undefined, resources, 'clusters', EGRESS_AUTHZ_CLUSTER);
  keepIf(opts.egress !== undefined, resources, 'clusters', EGRESS_ORIGINAL_CLUSTER);
  const intercept = opts.egress?.intercept ?? [];
  const ldsPath = opts.egress?.ldsPath;
  // From a file, the listener may name credential hosts later: their upstream cluster is always there.
  keepIf(intercept.length > 0 || ldsPath !== undefined, resources, 'clusters', EGRESS_ORIGINAL_TLS_CLUSTER);
  // The egress-intercept chain is a pattern, like api-{{WORKER_CLUSTER}}: taken out, filled per host.
  let interceptPattern: ConfigObject | undefined;
  if (opts.egress !== undefined) {
    const chains = arrayAt(namedEntry(arrayAt(resources, 'listeners', 'static_resources'), EGRESS_LISTENER, 'static_resources.listeners'), 'filter_chains', 'egress');
    interceptPattern = namedEntry(chains, INTERCEPT_PATTERN, 'egress.filter_chains');
    chains.splice(chains.indexOf(interceptPattern), 1);
  }

  const filled = fillTemplate(template, values);
  if (!isConfigObject(filled)) throw new AsbError('Internal', 'filled Envoy template is not a mapping');
  const filledClusters = arrayAt(objectAt(filled, 'static_resources', ''), 'clusters', 'static_resources');
  for (const worker of opts.workers) {
    const api = parseHostPort(worker.apiAddress) ?? { host: '', port: 0 };
    filledClusters.push(fillTemplate(apiPattern, { ...values, WORKER_CLUSTER: worker.cluster, WORKER_API_HOST: api.host, WORKER_API_PORT: api.port }));
  }
  if (interceptPattern !== undefined && intercept.length > 0) {
    const egress = namedEntry(arrayAt(objectAt(filled, 'static_resources', ''), 'listeners', 'static_resources'), EGRESS_LISTENER, 'static_resources.listeners');
    const chains = arrayAt(egress, 'filter_chains', 'egress');
    // Before the passthrough chain, though Envoy prefers a server_names match anyway.
    chains.unshift(...intercept.map((h) => fillTemplate(interceptPattern, { ...values, INTERCEPT_HOST: h.host, INTERCEPT_CERT_CHAIN: h.certChainPath, INTERCEPT_PRIVATE_KEY: h.privateKeyPath })));
  }
  // An IP needs no resolver: STATIC spares a DNS timer per cluster and starts ready.
  for (const cluster of filledClusters) if (isConfigObject(cluster)) preferStatic(cluster);
  if (opts.static !== undefined) addStaticListener(filled, opts.static);
  if (ldsPath !== undefined) {
    const listeners = arrayAt(objectAt(filled, 'static_resources', ''), 'listeners', 'static_resources');
    listeners.splice(listeners.indexOf(namedEntry(listeners, EGRESS_LISTENER, 'static_resources.listeners')), 1);
    // Envoy watches the directory for a file moved over `path` (an atomic rename, writeEgressLds).
    filled.dynamic_resources = { lds_config: { resource_api_version: 'V3', path_config_source: { path: ldsPath, watched_directory: { path: dirname(ldsPath) } } } };
  }
  return filled;
}

export type EgressListenerOptions = NonNullable<EdgeConfigOptions['egress']>;

/** The `egress` listener alone, filled (intercept chains first), as LDS serves it. */
export function egressListener(egress: EgressListenerOptions, templateText?: string): ConfigObject {
  const template = parseTemplate(templateText ?? readFileSync(EDGE_TEMPLATE_PATH, 'utf8'), 'envoy/edge.yaml');
  const listener = namedEntry(arrayAt(objectAt(template, 'static_resources', ''), 'listeners', 'static_resources'), EGRESS_LISTENER, 'static_resources.listeners');
  const chains = arrayAt(listener, 'filter_chains', 'egress');
  const pattern = namedEntry(chains, INTERCEPT_PATTERN, 'egress.filter_chains');
  chains.splice(chains.indexOf(pattern), 1);
  const values = egressValues(egress);
  const filled = fillTemplate(listener, values);
  if (!isConfigObject(filled)) throw new AsbError('Internal', 'filled egress listener is not a mapping');
  const intercept = egress.intercept ?? [];
  arrayAt(filled, 'filter_chains', 'egress').unshift(...intercept.map((h) => fillTemplate(pattern, { ...values, INTERCEPT_HOST: h.host, INTERCEPT_CERT_CHAIN: h.certChainPath, INTERCEPT_PRIVATE_KEY: h.privateKeyPath })));
  return filled;
}

/** The LDS file for egress.ldsPath: a DiscoveryResponse holding the egress listener. */
export function egressLdsJson(egress: EgressListenerOptions, templateText?: string): string {
  return `${JSON.stringify({ version_info: String(Date.now()), resources: [{ '@type': 'type.googleapis.com/envoy.config.listener.v3.Listener', ...egressListener(egress, templateText) }] }, null, 1)}\n`;
}

/** Writes the LDS file by rename (Envoy never reads half a file; the rename is what it watches). */
export function writeEgressLds(path: string, egress: EgressListenerOptions): void {
  writeFileSync(`${path}.tmp`, egressLdsJson(egress), { mode: 0o600 });
  renameSync(`${path}.tmp`, path);
}

export function edgeConfigYaml(opts: EdgeConfigOptions): string {
  return `# Generated by src/edge/envoy-config.ts from envoy/edge.yaml; edits here are overwritten.\n${stringify(edgeConfig(opts), { lineWidth: 0 })}`;
}

/** Placeholder values of the federation parts that are configured. */
function federationValues(opts: EdgeConfigOptions): Record<string, TemplateValue> {
  const values: Record<string, TemplateValue> = {};
  if (opts.edgeTls !== undefined) {
    values.EDGE_TLS_ADDRESS = opts.edgeTls.listenAddress ?? EDGE_DEFAULTS.listenAddress;
    values.EDGE_TLS_PORT = opts.edgeTls.listenPort;
    values.EDGE_TLS_CERT_CHAIN = opts.edgeTls.certChainPath;
    values.EDGE_TLS_PRIVATE_KEY = opts.edgeTls.privateKeyPath;
  }
  if (opts.ingress !== undefined) {
    values.INGRESS_ADDRESS = opts.ingress.listenAddress ?? EDGE_DEFAULTS.listenAddress;
    values.INGRESS_PORT = opts.ingress.listenPort;
  }
  if (opts.tls !== undefined) {
    values.TLS_CA_CERT = opts.tls.caCertPath;
    values.TLS_CERT_CHAIN = opts.tls.certChainPath;
    values.TLS_PRIVATE_KEY = opts.tls.privateKeyPath;
    values.EDGE_SAN = opts.tls.edgeSan ?? EDGE_SAN;
    values.INGRESS_SAN = opts.tls.ingressSan ?? INGRESS_SAN;
  }
  if (opts.hubAddress !== undefined) {
    const hub = parseHostPort(opts.hubAddress) ?? { host: '', port: 0 };
    values.HUB_HOST = hub.host;
    values.HUB_PORT = hub.port;
  }
  if (opts.egress !== undefined) Object.assign(values, egressValues(opts.egress));
  return values;
}

function egressValues(egress: EgressListenerOptions): Record<string, TemplateValue> {
  const authz = parseHostPort(egress.authzAddress) ?? { host: '', port: 0 };
  return {
    EGRESS_ADDRESS: egress.listenAddress,
    EGRESS_PORT: egress.listenPort,
    EGRESS_AUTHZ_HOST: authz.host,
    EGRESS_AUTHZ_PORT: authz.port,
    EGRESS_UPSTREAM_CA: egress.upstreamCaPath ?? SYSTEM_CA_BUNDLE,
  };
}

/** Removes an optional part that is not wanted; one that is wanted must be in the template. */
function keepIf(wanted: boolean, resources: ConfigObject, key: 'listeners' | 'clusters', name: string): void {
  const list = resources[key];
  const entries = Array.isArray(list) ? list : [];
  const index = entries.findIndex((entry) => isConfigObject(entry) && entry.name === name);
  if (wanted && index === -1) throw new AsbError('Invalid', `Envoy template: static_resources.${key} has no entry named ${name}, which the options ask for`);
  if (!wanted && index !== -1) entries.splice(index, 1);
}

/** Envoy's Duration form: "1s", "0.25s". */
export function duration(ms: number): string {
  return `${ms / 1000}s`;
}

function validate(opts: EdgeConfigOptions): FieldProblem[] {
  const problems: FieldProblem[] = [];
  const port = (field: string, value: number): void => {
    if (!Number.isInteger(value) || value < 0 || value > 65535) problems.push({ field, message: `must be a port number 0-65535, got ${value}` });
  };
  const address = (field: string, value: string): void => {
    const hp = parseHostPort(value);
    if (hp === undefined || hp.port === 0) problems.push({ field, message: `must be host:port with a non-zero port, got "${value}"` });
  };
  port('listenPort', opts.listenPort);
  port('adminPort', opts.adminPort);
  address('routerAddress', opts.routerAddress);
  const seen = new Set<string>();
  opts.workers.forEach((w, i) => {
    // The name travels in a header value and a cluster name: keep it to a DNS label.
    if (!/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/.test(w.cluster)) problems.push({ field: `workers[${i}].cluster`, message: `must be a DNS label, got "${w.cluster}"` });
    if (seen.has(w.cluster)) problems.push({ field: `workers[${i}].cluster`, message: `duplicate cluster "${w.cluster}"` });
    seen.add(w.cluster);
    address(`workers[${i}].apiAddress`, w.apiAddress);
  });
  if (opts.static !== undefined) {
    port('static.listenPort', opts.static.listenPort);
    address('static.upstreamAddress', opts.static.upstreamAddress);
  }
  if (opts.ingress !== undefined) {
    port('ingress.listenPort', opts.ingress.listenPort);
    if (opts.ingress.listenPort !== 0 && opts.ingress.listenPort === opts.listenPort) problems.push({ field: 'ingress.listenPort', message: `must differ from listenPort (${opts.listenPort})` });
    const at = opts.ingress.listenAddress;
    if (at !== undefined && isIP(at) === 0) problems.push({ field: 'ingress.listenAddress', message: `must be an IP address, got "${at}"` });
    if (opts.tls === undefined) problems.push({ field: 'tls', message: 'is required with ingress: the ingress listener takes mutual TLS only' });
  }
  if (opts.edgeTls !== undefined) {
    port('edgeTls.listenPort', opts.edgeTls.listenPort);
    if (opts.edgeTls.listenPort !== 0 && opts.edgeTls.listenPort === opts.listenPort) problems.push({ field: 'edgeTls.listenPort', message: `must differ from listenPort (${opts.listenPort})` });
    for (const field of ['certChainPath', 'privateKeyPath'] as const) {
      if (!existsSync(opts.edgeTls[field])) problems.push({ field: `edgeTls.${field}`, message: `no such file "${opts.edgeTls[field]}"` });
    }
  }
  if (opts.tls !== undefined) {
    const tls = opts.tls;
    for (const field of ['caCertPath', 'certChainPath', 'privateKeyPath'] as const) {
      if (!existsSync(tls[field])) problems.push({ field: `tls.${field}`, message: `no such file "${tls[field]}"` });
    }
    for (const field of ['edgeSan', 'ingressSan'] as const) {
      const san = tls[field];
      if (san !== undefined && !/^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$/.test(san)) problems.push({ field: `tls.${field}`, message: `must be a DNS name, got "${san}"` });
    }
  }
  if (opts.hubAddress !== undefined) address('hubAddress', opts.hubAddress);
  if (opts.egress !== undefined) {
    port('egress.listenPort', opts.egress.listenPort);
    if (isIP(opts.egress.listenAddress) === 0) problems.push({ field: 'egress.listenAddress', message: `must be an IP address, got "${opts.egress.listenAddress}"` });
    address('egress.authzAddress', opts.egress.authzAddress);
    if (opts.egress.ldsPath !== undefined && opts.egress.listenPort === 0) problems.push({ field: 'egress.listenPort', message: 'must be fixed (not 0) with ldsPath: a reloaded listener binds the same port' });
    const hosts = new Set<string>();
    (opts.egress.intercept ?? []).forEach((h, i) => {
      if (!/^(\*\.)?[a-z0-9_]([a-z0-9_.-]{0,251}[a-z0-9])?$/.test(h.host)) problems.push({ field: `egress.intercept[${i}].host`, message: `must be a host name or *.name, got "${h.host}"` });
      if (hosts.has(h.host)) problems.push({ field: `egress.intercept[${i}].host`, message: `duplicate host "${h.host}"` });
      hosts.add(h.host);
      for (const field of ['certChainPath', 'privateKeyPath'] as const) {
        if (!existsSync(h[field])) problems.push({ field: `egress.intercept[${i}].${field}`, message: `no such file "${h[field]}"` });
      }
    });
  }
  const messageMs = opts.messageTimeoutMs ?? EDGE_DEFAULTS.messageTimeoutMs;
  const maxMs = opts.maxMessageTimeoutMs ?? EDGE_DEFAULTS.maxMessageTimeoutMs;
  if (!(messageMs >= 1)) problems.push({ field: 'messageTimeoutMs', message: `must be at least 1, got ${messageMs}` });
  // Envoy caps message timeouts at 3600 s.
  if (!(maxMs > messageMs && maxMs <= 3_600_000)) problems.push({ field: 'maxMessageTimeoutMs', message: `must be above messageTimeoutMs and at most 3600000, got ${maxMs}` });
  return problems;
}

function socketAddresses(cluster: ConfigObject): ConfigObject[] {
  const out: ConfigObject[] = [];
  const assignment = cluster.load_assignment;
  if (!isConfigObject(assignment) || !Array.isArray(assignment.endpoints)) return out;
  for (const locality of assignment.endpoints) {
    if (!isConfigObject(locality) || !Array.isArray(locality.lb_endpoints)) continue;
    for (const lb of locality.lb_endpoints) {
      if (!isConfigObject(lb) || !isConfigObject(lb.endpoint) || !isConfigObject(lb.endpoint.address)) continue;
      const sa = lb.endpoint.address.socket_address;
      if (isConfigObject(sa)) out.push(sa);
    }
  }
  return out;
}

function preferStatic(cluster: ConfigObject): void {
  if (cluster.type !== 'STRICT_DNS') return;
  const addresses = socketAddresses(cluster);
  if (addresses.length > 0 && addresses.every((sa) => typeof sa.address === 'string' && isIP(sa.address) !== 0)) cluster.type = 'STATIC';
}

function addStaticListener(config: ConfigObject, opts: { listenPort: number; upstreamAddress: string }): void {
  const resources = objectAt(config, 'static_resources', '');
  const listeners = arrayAt(resources, 'listeners', 'static_resources');
  const edge = namedEntry(listeners, 'edge', 'static_resources.listeners');
  const copy = structuredClone(edge);
  copy.name = 'static';
  objectAt(objectAt(copy, 'address', 'static'), 'socket_address', 'static.address').port_value = opts.listenPort;
  const hcm = httpConnectionManager(copy);
  hcm.stat_prefix = 'static';
  // Same connection manager, same router filter, same access log: only ext_proc is gone.
  hcm.http_filters = arrayAt(hcm, 'http_filters', 'hcm').filter((f) => !(isConfigObject(f) && f.name === 'envoy.filters.http.ext_proc'));
  hcm.route_config = {
    name: 'static',
    virtual_hosts: [{ name: 'static', domains: ['*'], routes: [{ match: { prefix: '/' }, route: { cluster: STATIC_CLUSTER, timeout: '0s' } }] }],
  };
  listeners.push(copy);
  const upstream = parseHostPort(opts.upstreamAddress) ?? { host: '', port: 0 };
  const cluster: ConfigObject = {
    name: STATIC_CLUSTER,
    type: 'STRICT_DNS',
    connect_timeout: '1s',
    load_assignment: {
      cluster_name: STATIC_CLUSTER,
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: upstream.host, port_value: upstream.port } } } }] }],
    },
    // Same limits as the sandbox cluster so the comparison measures the router, not a breaker.
    circuit_breakers: { thresholds: [{ priority: 'DEFAULT', max_connections: 100000, max_pending_requests: 100000, max_requests: 100000 }] },
  };
  preferStatic(cluster);
  arrayAt(resources, 'clusters', 'static_resources').push(cluster);
}

function httpConnectionManager(listener: ConfigObject): ConfigObject {
  const chains = arrayAt(listener, 'filter_chains', 'listener');
  const chain = chains[0];
  if (!isConfigObject(chain)) throw new AsbError('Invalid', 'Envoy template: the edge listener has no filter chain');
  const hcm = namedEntry(arrayAt(chain, 'filters', 'filter_chains[0]'), 'envoy.filters.network.http_connection_manager', 'filter_chains[0].filters');
  return objectAt(hcm, 'typed_config', 'http_connection_manager');
}

/** For tests and tools: a value somewhere in a config tree, by a path of keys and list indexes. */
export function configAt(node: ConfigNode, ...path: (string | number)[]): ConfigNode | undefined {
  let cur: ConfigNode | undefined = node;
  for (const key of path) {
    if (typeof key === 'number') cur = Array.isArray(cur) ? cur[key] : undefined;
    else cur = isConfigObject(cur) ? cur[key] : undefined;
    if (cur === undefined) return undefined;
  }
  return cur;
}
