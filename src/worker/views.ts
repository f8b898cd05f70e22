// SandboxView: the flat shape the REST API and the CLI show for a sandbox, derived from the
// Sandbox object (labels, spec, status) so it never disagrees with what the operator wrote, plus
// how to reach it through the edge (URL, ports, and for its owner the data-plane access token).
import { findCondition } from '../api/meta.ts';
import { sandboxFailure } from '../api/sandbox-failure.ts';
import type { Sandbox, SandboxPhase } from '../api/types.ts';
import type { SandboxView } from '../api/views.ts';
import { ANNOTATION, LABEL, suspensionStrategyOf } from '../api/types.ts';
import { keptMemory, MEMORY_RESTORED } from '../operator/suspension.ts';
import type { DataPlane } from './deps.ts';
import { egressPolicyOf } from '../api/sandbox-network.ts';
import { defaultPortOf, publicPortsOf } from './route-entry.ts';

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
