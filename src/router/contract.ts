// The data plane's shared contract: what a worker publishes about each sandbox on its route
// feed, how the router keeps it, and the headers the router and Envoy agree on. The worker
// (src/worker/route-feed.ts), the router (src/router/) and the Envoy configuration (envoy/)
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
  | { type: 'delete'; version: number; id: string };

/** Headers the router sets for Envoy. A client can never set them: the router removes every header with the internal prefix. */
export const INTERNAL_HEADER_PREFIX = 'x-asb-';
export const HEADER = {
  /** Envoy route: which upstream cluster (`cluster_header`): `sandbox` (ORIGINAL_DST), `api-<cluster>`, `ingress-<cluster>`. */
  upstream: 'x-asb-upstream',
  /** ORIGINAL_DST target `ip:port` for the `sandbox` cluster. */
  destination: 'x-asb-dst',
  /** Set toward the sandbox so servers inside know which sandbox and port they serve. */
  sandboxId: 'x-asb-sandbox-id',
  /** Data-plane access token, sent by clients (header form); stripped before the sandbox. */
  accessToken: 'x-access-token',
  /** E2B header routing (host is an IP, localhost or sandbox.<domain>). */
  e2bSandboxId: 'e2b-sandbox-id',
  e2bSandboxPort: 'e2b-sandbox-port',
} as const;

/** Cookie set on a token-bearing first request so browsers can follow links without the header. */
export const ACCESS_COOKIE = 'asb_access';

/** Port the E2B envd protocol uses; also our default port when a template declares none. */
export const DEFAULT_SANDBOX_PORT = 49983;
