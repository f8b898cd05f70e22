// SandboxView: the flat shape the REST API and the CLI show for a sandbox, derived from the
// Sandbox object (labels, spec, status) so it never disagrees with what the operator wrote, plus
// how to reach it through the edge (URL, ports, and for its owner the data-plane access token).
import { findCondition } from '../api/meta.ts';
import { sandboxFailure } from '../api/sandbox-failure.ts';
import type { Sandbox, SandboxPhase, SuspensionStrategy } from '../api/types.ts';
import { ANNOTATION, LABEL, suspensionStrategyOf } from '../api/types.ts';
import { keptMemory, MEMORY_RESTORED } from '../operator/suspension.ts';
import type { DataPlane } from './deps.ts';
import { egressPolicyOf } from '../network/sandbox-network.ts';
import { defaultPortOf, publicPortsOf } from './route-entry.ts';

export interface SandboxView {
  id: string;
  /** The worker cluster that holds it (absent only from a worker older than federation). */
  cluster?: string;
  namespace: string;
  template: string;
  phase: SandboxPhase;
  ready: boolean;
  launchType: 'warm' | 'cold';
  owner: string;
  labels: Record<string, string>;
  ip?: string;
  createdAt: string;
  shutdownTime?: string;
  idleTimeoutMs?: number;
  /** The egress policy in force (spec.network, else the default): what the sandbox may reach. */
  network?: { internet: boolean; allow: string[]; deny: string[] };
  /** Why a Failed or Expired sandbox stopped (its Ready condition's reason): ErrImagePull, OOMKilled, ... */
  reason?: string;
  /** What went wrong, for a Failed or Expired sandbox in the words of its Ready condition; else status.message. */
  message?: string;
  /** Data-plane access token (X-Access-Token header or the asb_access cookie); single-sandbox responses only. */
  accessToken?: string;
  /** Sandbox hosts are `<port>-<id>.<domain>`. */
  domain?: string;
  /** The port `<id>.<domain>` and `url` reach. */
  defaultPort?: number;
  /** Ports that answer without the access token. */
  publicPorts?: number[];
  /** The sandbox's URL for defaultPort through the edge. */
  url?: string;
  /** How it suspends (spec.suspensionStrategy): Stop keeps files, Hibernate memory too. */
  suspensionStrategy?: SuspensionStrategy;
  /** A Hibernated sandbox: whether its memory and processes were kept (the next wake restores them). */
  memory?: 'kept' | 'not kept';
  /** Its Suspended condition: what its last suspension kept, or why one failed (status False: it runs on). */
  suspension?: { suspended: boolean; reason: string; message: string };
  /** After a wake from a memory checkpoint: whether the memory came back (MemoryRestored), and if not why. */
  memoryRestored?: { restored: boolean; reason: string; message: string };
}

// The edge URL of the last call, parsed: one worker has one edge, and parsing it for every
// sandbox view was a URL parse per claim response.
let lastEdge: { url: string; scheme: string; port: string } | undefined;

function parsedEdge(edgeUrl: string): { scheme: string; port: string } {
  if (lastEdge?.url !== edgeUrl) {
    const edge = new URL(edgeUrl);
    lastEdge = { url: edgeUrl, scheme: edge.protocol, port: edge.port === '' ? '' : `:${edge.port}` };
  }
  return lastEdge;
}

/** `<scheme>://<port>-<id>.<domain>[:<edge port>]`: the edge's scheme and port, the sandbox's host name. */
export function sandboxUrl(dp: Pick<DataPlane, 'domain' | 'edgeUrl'>, id: string, port: number): string {
  const edge = parsedEdge(dp.edgeUrl);
  return `${edge.scheme}//${port}-${id}.${dp.domain}${edge.port}`;
}

/** The view with how to reach the sandbox; `withToken` only for responses about one sandbox to its owner or an admin. */
export function reachableView(view: SandboxView, sandbox: Sandbox, dp: DataPlane, withToken: boolean): SandboxView {
  const defaultPort = defaultPortOf(sandbox);
  return {
    ...view,
    ...(withToken ? { accessToken: dp.tokens.accessToken(sandbox) } : {}),
    domain: dp.domain,
    defaultPort,
    publicPorts: publicPortsOf(sandbox),
    url: sandboxUrl(dp, sandbox.metadata.name, defaultPort),
  };
}

function idleTimeoutOf(sandbox: Sandbox): number | undefined {
  if (sandbox.spec.idleTimeoutMs !== undefined) return sandbox.spec.idleTimeoutMs;
  const annotated = sandbox.metadata.annotations?.[ANNOTATION.idleTimeoutMs];
  if (annotated === undefined) return undefined;
  const n = Number(annotated);
  return Number.isSafeInteger(n) && n >= 0 ? n : undefined;
}

/** The view of `sandbox`; `cluster` is the worker cluster that holds it (every API view names it). */
export function sandboxView(sandbox: Sandbox, cluster?: string): SandboxView {
  const labels = sandbox.metadata.labels ?? {};
  const status = sandbox.status ?? {};
  const deleting = sandbox.metadata.deletionTimestamp !== undefined;
  const phase: SandboxPhase = deleting ? 'Terminating' : status.phase ?? 'Pending';
  const view: SandboxView = {
    id: sandbox.metadata.name,
    ...(cluster === undefined ? {} : { cluster }),
    namespace: sandbox.metadata.namespace ?? 'default',
    template: labels[LABEL.template] ?? '',
    phase,
    ready: !deleting && findCondition(status.conditions, 'Ready')?.status === 'True',
    launchType: labels[LABEL.launchType] === 'warm' ? 'warm' : 'cold',
    owner: labels[LABEL.owner] ?? '',
    labels: { ...labels },
    createdAt: sandbox.metadata.creationTimestamp ?? '',
    network: (({ internet, allow, deny }) => ({ internet, allow: [...allow], deny: [...deny] }))(egressPolicyOf(sandbox.spec.network)),
    suspensionStrategy: suspensionStrategyOf(sandbox.spec),
  };
  const ip = status.podIPs?.[0];
  if (ip !== undefined) view.ip = ip;
  const shutdownTime = sandbox.spec.lifecycle?.shutdownTime;
  if (shutdownTime !== undefined) view.shutdownTime = shutdownTime;
  const idle = idleTimeoutOf(sandbox);
  if (idle !== undefined) view.idleTimeoutMs = idle;
  const suspended = findCondition(status.conditions, 'Suspended');
  if (suspended !== undefined) view.suspension = { suspended: suspended.status === 'True', reason: suspended.reason, message: suspended.message ?? '' };
  if (phase === 'Hibernated') view.memory = keptMemory(status.conditions) ? 'kept' : 'not kept';
  const restored = findCondition(status.conditions, MEMORY_RESTORED);
  if (restored !== undefined) view.memoryRestored = { restored: restored.status === 'True', reason: restored.reason, message: restored.message ?? '' };
  const failure = sandboxFailure(sandbox);
  if (failure !== undefined) {
    view.reason = failure.reason;
    view.message = failure.message;
  } else if (status.message !== undefined) view.message = status.message;
  return view;
}
