// The data plane's shared contract: what a worker publishes about each sandbox on its route
// feed, how the router keeps it, and the headers the router and Envoy agree on. The worker
// (src/worker/route-feed/), the router (src/router/) and the Envoy configuration (envoy/)
// all follow this file.

/** What the router must know to send a request to a sandbox with no remote call. */
export interface RouteEntry {
  /** Sandbox id (metadata.name). */
  id: string;
  /** Owning cluster's name; the router sends requests for other clusters to their ingress. */
  cluster: string;
  /** Pod address while running; absent while hibernated or pending. */
  podIp?: string;
  /** running: ready for traffic; starting: pod coming up (waking or cold); hibernated: wake on demand; failed/expired: 503 */
  state: 'running' | 'starting' | 'hibernated' | 'failed' | 'expired';
  /** Port used for `<sandboxId>.<domain>` (no port prefix): the template's first declared port, else 49983. */
  defaultPort: number;
  /** Ports reachable without the access token (the template marks them public). */
  publicPorts: number[];
  /** hex sha256 of the sandbox's data-plane access token. */
  tokenHash: string;
  /** The team that owns the sandbox. */
  owner: string;
  /**
   * Set when the sandbox's image runs its own envd (pod template annotation `asb.dev/envd: pod`):
   * requests for port 49983 go to the pod. Otherwise the owning worker answers envd for it.
   */
  envdInPod?: true;
  /**
   * Ports whose container port declares HTTP/2 without TLS (`appProtocol: kubernetes.io/h2c`,
   * `h2c` or `grpc`): Envoy speaks HTTP/2 to them (cluster `sandbox-h2c`), HTTP/1.1 to all
   * others. Absent when there are none (and from workers that predate it: all HTTP/1.1).
   */
  h2cPorts?: number[];
  /**
   * false: traffic must not wake this hibernated sandbox; a request gets E2B's 502 "not found", as
   * E2B's proxy answers for a sandbox paused without auto-resume (an E2B sandbox created without
   * auto_resume, paused by its user or at its timeout; an idle hibernation still wakes). Absent:
   * traffic wakes it. Sent only while hibernated.
   */
  resumeOnTraffic?: false;
}

/**
 * Route feed, worker → router, one JSON message per WebSocket text frame at
 * `GET <worker API>/v1/routes/feed` (authenticated with an admin key).
 * - On every (re)connect the worker sends one `snapshot` (all entries, at `version`), then
 *   `upsert`/`delete` deltas, each with a strictly increasing `version` (the store's
 *   resourceVersion of the change). The router applies a delta only if its version is greater
 *   than the last applied one, so nothing is applied twice or out of order; a gap is impossible
 *   on one connection and a reconnect resyncs from a fresh snapshot.
 * - `ping` frames carry no route data (WebSocket pings are used for liveness as well).
 */
export type FeedMessage =
  | { type: 'snapshot'; version: number; cluster: string; entries: RouteEntry[] }
  | { type: 'upsert'; version: number; entry: RouteEntry }
  | { type: 'delete'; version: number; id: string }
  | ClustersMessage;

/**
 * The federation as the worker knows it (its copy of the hub's Cluster objects), so the router
 * can send a request for another cluster's sandbox to that cluster's ingress with zero lookups.
 * Sent right after every snapshot and again whenever the registry or `hubConnected` changes; each
 * one replaces the last in full (no version: it is not part of the route entries' ordering).
 * A worker that has no hub sends `clusters: []` (only itself is known, by its snapshot).
 */
export interface ClustersMessage {
  type: 'clusters';
  /** The worker's own cluster name (the same as its snapshot's `cluster`). */
  self: string;
  /** Whether the worker's sync link to the hub is up now (the edge sends creates to the hub only then). */
  hubConnected: boolean;
  clusters: ClusterRoute[];
}

/** One cluster of the federation, as the router needs it. */
export interface ClusterRoute {
  name: string;
  /** The 4-char prefix of its sandbox ids (src/api/ids.ts). */
  tag: string;
  region: string;
  /** `host:port` of its ingress listener (mutual TLS); '' when it has none. */
  ingressAddress: string;
  drain: boolean;
}

/** Headers the router sets for Envoy. A client can never set them: the router removes every header with the internal prefix. */
export const INTERNAL_HEADER_PREFIX = 'x-asb-';
export const HEADER = {
  /**
   * Envoy route: which upstream cluster (`cluster_header`): `sandbox` (ORIGINAL_DST to a pod),
   * `api-<cluster>` (a worker API this Envoy reaches directly), `ingress` (ORIGINAL_DST over
   * mutual TLS to another cluster's ingress listener, which routes the request again) or `hub`
   * (the hub's API: placement of creates and lists across clusters).
   */
  upstream: 'x-asb-upstream',
  /** ORIGINAL_DST target `ip:port` for the `sandbox` and `ingress` clusters. */
  destination: 'x-asb-dst',
  /**
   * gRPC metadata (not an HTTP header) on the ext_proc stream: `ingress` when the request came in
   * on the ingress listener (from another cluster's edge), absent on the edge listener. The
   * router never forwards an ingress request to a third cluster, so a request cannot loop.
   */
  listener: 'x-asb-listener',
  /** Set toward the sandbox so servers inside know which sandbox and port they serve. */
  sandboxId: 'x-asb-sandbox-id',
  /** Data-plane access token, sent by clients (header form); stripped before the sandbox. */
  accessToken: 'x-access-token',
  /** E2B header routing (host is an IP, localhost or sandbox.<domain>). */
  e2bSandboxId: 'e2b-sandbox-id',
  e2bSandboxPort: 'e2b-sandbox-port',
  /**
   * The kubernetes-sigs sandbox-router contract (its Python SDK's Direct, Gateway and Tunnel modes;
   * host is an IP, localhost or sandbox.<domain>): the sandbox, its namespace (default `default`),
   * the port (default 8888) and the seconds the client waits (caps the worker's wait for the pod).
   */
  sigsSandboxId: 'x-sandbox-id',
  sigsSandboxNamespace: 'x-sandbox-namespace',
  sigsSandboxPort: 'x-sandbox-port',
  sigsSandboxTimeout: 'x-sandbox-timeout',
  /**
   * What the router hands the owning worker for a request routed by the X-Sandbox-* headers
   * (besides sandboxId): the validated port, namespace and timeout. A client cannot send them
   * (x-asb-* is removed); the worker serves such a request only with the team's API key.
   */
  sandboxPort: 'x-asb-sandbox-port',
  sandboxNamespace: 'x-asb-sandbox-namespace',
  sandboxTimeout: 'x-asb-sandbox-timeout',
} as const;

/**
 * Every header of the kubernetes-sigs router contract starts so (X-Sandbox-Pod-IP and
 * X-Sandbox-UID too, which upstream's routers dial or read): the router removes all of them, so
 * none reaches a pod and only the four above steer routing, and only as this router reads them.
 */
export const SIGS_HEADER_PREFIX = 'x-sandbox-';

/** The port X-Sandbox-ID requests go to without X-Sandbox-Port: the python-runtime's, the SDK's server_port default. */
export const SIGS_DEFAULT_PORT = 8888;
/** The namespace X-Sandbox-ID requests name without X-Sandbox-Namespace (upstream's routers' default). */
export const SIGS_DEFAULT_NAMESPACE = 'default';

/** Cookie set on a token-bearing first request so browsers can follow links without the header. */
export const ACCESS_COOKIE = 'asb_access';

/** Port the E2B envd protocol uses; also our default port when a template declares none. */
export const DEFAULT_SANDBOX_PORT = 49983;
/**
 * The port of the agent in every local pod's init (src/runtime/local/agent.ts): the worker's own
 * way in. Never routed from outside, whatever a template declares (the agent also wants its token).
 */
export const AGENT_PORT = 49982;

/**
 * The body of E2B's proxy answer (status 502) for a sandbox it does not know, which the SDKs read
 * as SandboxNotFoundError: the router sends it for an unknown id, the worker's envd for a sandbox
 * it no longer has.
 */
export function e2bSandboxNotFoundJson(id: string): string {
  return JSON.stringify({ sandboxId: id, message: 'The sandbox was not found', code: 502 });
}

/** Upstream names the router puts in HEADER.upstream besides `api-<cluster>`. */
export const UPSTREAM = { sandbox: 'sandbox', sandboxH2c: 'sandbox-h2c', ingress: 'ingress', hub: 'hub' } as const;
