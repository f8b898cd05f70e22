// What the worker API needs from the rest of the worker, as narrow interfaces: the operator's
// claimer and activity tracker, the store, the pod runtime, the key ring, metrics and a logger.
import type { Registry } from 'prom-client';
import type { Authenticator } from '../auth/keyring.ts';
import type { Sandbox, SandboxTemplate } from '../api/types.ts';
import type { ClaimRequest, ClaimResult } from '../operator/claimer.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { PodRuntime } from '../runtime/runtime.ts';
import type { ObjectStore } from '../store/store.ts';
import type { TemplateBuilds } from '../builds/service.ts';
import type { CredentialStore } from '../egress/credential-store.ts';
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import type { AccessTokens } from './access-token.ts';
import type { SandboxCallLimits } from './sandbox-calls.ts';
import type { SandboxIndex } from './sandbox-index.ts';
import type { EventLog } from '../events/event-log.ts';

/** The part of the operator the API drives (src/operator/operator.ts implements it). */
export interface WorkerOperator {
  claimer: {
    claim(req: ClaimRequest): Promise<ClaimResult>;
    waitReady(namespace: string, name: string, timeoutMs: number): Promise<Sandbox>;
    /** Whether the template is in the claimer's cache (false may only mean "not seen yet"). */
    hasTemplate(namespace: string, name: string): boolean;
    /** The cached template, for its owner label (undefined may only mean "not seen yet"). */
    cachedTemplate(namespace: string, name: string): SandboxTemplate | undefined;
  };
  activity: { touch(id: string): void };
}


export interface WorkerLimits {
  /** Largest JSON request body; default 1 MiB. */
  jsonBytes: number;
  /** Largest file upload (PUT /files, envd's POST /files), after gzip inflation; default 64 MiB. */
  uploadBytes: number;
  /** Uploads at once per key (API key prefix, or sandbox access token); default 8. More get 429 with Retry-After. */
  uploadsPerKey: number;
  /** Uploads at once on this worker, all keys together; default 32. */
  uploadsTotal: number;
  /** How long create/resume wait for Ready when asked to; default 60 s (a cold start pulls no image, so ~1 s is typical). */
  waitReadyMs: number;
  /** Cap on captured exec output per stream; default 8 MiB, so one exec cannot exhaust memory. */
  execOutputBytes: number;
  /** Snapshots one team may keep on this worker (forks' own count while they start); default 100. */
  snapshotsPerTeam: number;
  /** Bytes one team's snapshots may take on this worker's disk; default 100 GiB. */
  snapshotBytesPerTeam: number;
}

/** How users reach sandboxes through the edge: `<scheme>://<port>-<id>.<domain>[:<edge port>]`. */
export interface DataPlane {
  /** ASB_DOMAIN; default asb.localhost (every *.localhost name resolves to loopback). */
  domain: string;
  /** ASB_EDGE_URL; its scheme and port go into sandbox URLs. Default http://127.0.0.1:10000 */
  edgeUrl: string;
  /** The edge's HTTPS listener, when it has one: E2B calls that came in over it are told its port. */
  edgeTlsUrl?: string;
  /** Data-plane access tokens; default: a secret made for this process (tokens change on restart). */
  tokens: AccessTokens;
}

export interface RouteFeedLimits {
  /** Drop a router whose socket holds more than this beyond its snapshot; default 16 MiB. */
  maxBufferedBytes?: number;
  /** WebSocket ping interval on the feed; default 10 s. */
  pingIntervalMs?: number;
}

export interface TerminalLimits {
  /** Close a terminal session after this long with no frame either way; default 15 min (--terminal-idle-ms). */
  idleMs?: number;
  /** How long an unused terminal token is accepted; default TERMINAL_TOKEN_TTL_MS (60 s). */
  tokenTtlMs?: number;
}

export interface WorkerDeps {
  store: ObjectStore;
  runtime: PodRuntime;
  operator: WorkerOperator;
  auth: Authenticator;
  registry: Registry;
  metrics: Metrics;
  log: Logger;
  clock?: Clock;
  cluster: { name: string; tag: string };
  /** Reported by /v1/status. */
  version?: string;
  /** Namespace of sandboxes created without one. */
  defaultNamespace?: string;
  limits?: Partial<WorkerLimits>;
  /** Processes and terminals one sandbox's API callers hold at once and start a second, and all together (sandbox-calls.ts); default DEFAULT_SANDBOX_CALL_LIMITS. */
  sandboxCallLimits?: SandboxCallLimits;
  dataPlane?: Partial<DataPlane>;
  routeFeed?: RouteFeedLimits;
  terminal?: TerminalLimits;
  /** The hub sync agent's state, for /v1/status (absent when the worker runs without a hub). */
  sync?: () => { connected: boolean; appliedVersion: number };
  /** Tells the hub what this cluster holds now and waits (≤ timeoutMs) until it has (SyncAgent.reportNow). */
  reportToHub?: (timeoutMs: number) => Promise<boolean>;
  /** Egress secrets and credential rules (admin API under /v1/egress/); absent: those routes answer 404. */
  egressCredentials?: CredentialStore;
  /** Whether the egress proxy decides this cluster's domain entries; false (the default): a policy naming a domain is refused (egress-domains.ts). */
  egressProxy?: boolean;
  /** Template builds (src/builds/service.ts); absent: E2B's build API answers 501. Owned by the caller, which closes it. */
  builds?: TemplateBuilds;
  /**
   * Where the events API and webhooks answer from: this process's event log (owned by the
   * caller), or the operator an API process passes them on to; absent: those routes answer 404.
   */
  events?: EventsSource;
  /** --webhook-allow-private: webhooks may name private addresses and localhost; default false: such a URL is a 422. */
  webhookAllowPrivate?: boolean;
}

/**
 * Where a process's events API answers from: its own log (a worker, an operator), or, in an API
 * process (--role=api --events-url), the operator that keeps the cluster's log, which each request
 * is passed on to with the caller's key (routes-events.ts); undefined: it keeps none, and every
 * route answers 404.
 */
export type EventsSource = { log: EventLog } | { forwardTo: string } | undefined;

/** Everything a route handler may use, resolved once at start-up. */
export interface WorkerContext {
  store: ObjectStore;
  runtime: PodRuntime;
  operator: WorkerOperator;
  registry: Registry;
  log: Logger;
  clock: Clock;
  cluster: { name: string; tag: string };
  version: string;
  defaultNamespace: string;
  limits: WorkerLimits;
  index: SandboxIndex;
  dataPlane: DataPlane;
  sync: (() => { connected: boolean; appliedVersion: number }) | undefined;
  reportToHub: ((timeoutMs: number) => Promise<boolean>) | undefined;
  egressCredentials: CredentialStore | undefined;
  egressProxy: boolean;
  builds: TemplateBuilds | undefined;
  events: EventsSource;
  webhookAllowPrivate: boolean;
}
