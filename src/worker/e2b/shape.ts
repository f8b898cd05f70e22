// Our Sandbox object as the E2B API shows it (`Sandbox`, `ListedSandbox`, `SandboxDetail`), and
// where the E2B-only settings live on it. Metadata and environment variables are annotations
// holding JSON: E2B metadata values are free text (spaces, `&`, `=`), which label values cannot
// hold, and annotations keep them off the label index.
import type { IncomingMessage } from 'node:http';
import { availableParallelism, totalmem } from 'node:os';
import type { Sandbox } from '../../api/types.ts';
import { LABEL, sandboxLifecycle, wantsRunning } from '../../api/types.ts';
import { parseQuantity } from '../../api/quantity.ts';
import type { WorkerContext } from '../deps.ts';
import { egressPolicyOf } from '../../api/sandbox-network.ts';
import { keptMemory } from '../../operator/suspension.ts';

/**
 * The envd version the E2B API reports for our sandboxes (version gates in the SDK; see shared
 * research e2b.md). Here, with the E2B API's shapes, so envd (which reads the E2B env vars from
 * this module) and this module do not import each other.
 */
export const ENVD_VERSION = '0.6.13';

export const E2B_ANNOTATION = {
  /** JSON object of string → string: the sandbox's E2B metadata (`metadata` at create). */
  metadata: 'e2b.dev/metadata',
  /** JSON object of string → string: environment for processes the E2B SDK starts (`envVars` at create). */
  envVars: 'e2b.dev/env-vars',
  /** ISO time the E2B create claimed it (a warm member was created earlier than that). */
  startedAt: 'e2b.dev/started-at',
  /** "true" | "false": create's autoResume, for getInfo's lifecycle; "false" keeps traffic from resuming a pause (route-entry.ts). */
  autoResume: 'e2b.dev/auto-resume',
} as const;

/** What no sandbox ends at: E2B's endAt is required, and a sandbox without a shutdown time never ends. */
const NO_END = '9999-12-31T23:59:59.999Z';
const MIB = 1024 * 1024;

export type E2bState = 'running' | 'paused';

/** `Sandbox`: what create and connect answer; the SDK reaches envd with the token and domain in it. */
export interface E2bSandbox {
  sandboxID: string;
  templateID: string;
  clientID: string;
  envdVersion: string;
  envdAccessToken: string;
  trafficAccessToken: string;
  domain: string;
}

/** `ListedSandbox`: one item of a list. */
export interface E2bListedSandbox {
  sandboxID: string;
  templateID: string;
  clientID: string;
  metadata: Record<string, string>;
  startedAt: string;
  endAt: string;
  state: E2bState;
  cpuCount: number;
  memoryMB: number;
  diskSizeMB: number;
  envdVersion: string;
}

/** `SandboxDetail`: what get answers. */
export interface E2bSandboxDetail extends E2bListedSandbox {
  envdAccessToken: string;
  domain: string;
  allowInternetAccess: boolean;
  /** The policy's lists; the domains and CIDRs together, as E2B's allowOut holds both. */
  network: { allowOut: string[]; denyOut: string[] };
  lifecycle: { onTimeout: 'kill' | 'pause'; autoResume: boolean };
  /** What the latest pause saved, once a paused sandbox's pause has finished. */
  pauseMode?: 'full' | 'filesystem';
}

function stringMapAnnotation(sandbox: Sandbox, key: string): Record<string, string> {
  const raw = sandbox.metadata.annotations?.[key];
  if (raw === undefined) return {};
  try {
    const parsed = JSON.parse(raw) as unknown;
    if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return {};
    return Object.fromEntries(Object.entries(parsed).filter((e): e is [string, string] => typeof e[1] === 'string'));
  } catch {
    // Written only by the E2B create; anything else in it (a hand edit) reads as empty.
    return {};
  }
}

export function metadataOf(sandbox: Sandbox): Record<string, string> {
  return stringMapAnnotation(sandbox, E2B_ANNOTATION.metadata);
}

/** The environment the sandbox was created with through the E2B API (for envd's processes). */
export function envVarsOf(sandbox: Sandbox): Record<string, string> {
  return stringMapAnnotation(sandbox, E2B_ANNOTATION.envVars);
}

/** Paused is what the spec asks for, so a pause shows at once, while the pod is still stopping. */
export function stateOf(sandbox: Sandbox): E2bState {
  return wantsRunning(sandbox.spec) ? 'running' : 'paused';
}

export function startedAtOf(sandbox: Sandbox): string {
  return sandbox.metadata.annotations?.[E2B_ANNOTATION.startedAt] ?? sandbox.metadata.creationTimestamp ?? '';
}

/**
 * `<domain>[:<edge port>]`: the SDK reaches port p of the sandbox at `<p>-<id>.<domain>`. A call
 * that came in over the edge's HTTPS listener (x-forwarded-proto, set by Envoy) is told that
 * listener's port: an SDK with no sandbox URL speaks https to the domain it is given.
 */
export function e2bDomain(w: WorkerContext, req: IncomingMessage): string {
  const overTls = req.headers['x-forwarded-proto'] === 'https' && w.dataPlane.edgeTlsUrl !== undefined;
  const port = new URL(overTls ? (w.dataPlane.edgeTlsUrl ?? '') : w.dataPlane.edgeUrl).port;
  return port === '' ? w.dataPlane.domain : `${w.dataPlane.domain}:${port}`;
}

/** Sum of a resource over the pod's containers, or undefined when no container sets it. */
function containerTotal(sandbox: Sandbox, resource: string): number | undefined {
  let total: number | undefined;
  for (const c of sandbox.spec.podTemplate.spec.containers) {
    const q = c.resources?.limits?.[resource] ?? c.resources?.requests?.[resource];
    const n = q === undefined ? undefined : parseQuantity(q);
    if (n !== undefined) total = (total ?? 0) + n;
  }
  return total;
}

/** Unlimited pods (the local runtime sets no limits) may use the whole machine: report that. */
export function sizeOf(sandbox: Sandbox): { cpuCount: number; memoryMB: number; diskSizeMB: number } {
  const cpu = containerTotal(sandbox, 'cpu');
  const memory = containerTotal(sandbox, 'memory');
  let disk = 0;
  for (const v of sandbox.spec.volumeClaimTemplates ?? []) {
    const q = v.spec.resources?.requests?.storage;
    disk += q === undefined ? 0 : parseQuantity(q) ?? 0;
  }
  return {
    cpuCount: cpu === undefined ? availableParallelism() : Math.max(1, Math.ceil(cpu)),
    memoryMB: Math.round((memory ?? totalmem()) / MIB),
    diskSizeMB: Math.round(disk / MIB),
  };
}

function templateOf(sandbox: Sandbox): string {
  return sandbox.metadata.labels?.[LABEL.template] ?? '';
}

export function e2bSandbox(w: WorkerContext, sandbox: Sandbox, req: IncomingMessage): E2bSandbox {
  const token = w.dataPlane.tokens.accessToken(sandbox);
  return {
    sandboxID: sandbox.metadata.name,
    templateID: templateOf(sandbox),
    clientID: w.cluster.name,
    envdVersion: ENVD_VERSION,
    envdAccessToken: token,
    // One token guards every port of a sandbox here, envd's and the others.
    trafficAccessToken: token,
    domain: e2bDomain(w, req),
  };
}

export function e2bListedSandbox(w: WorkerContext, sandbox: Sandbox): E2bListedSandbox {
  return {
    sandboxID: sandbox.metadata.name,
    templateID: templateOf(sandbox),
    clientID: w.cluster.name,
    metadata: metadataOf(sandbox),
    startedAt: startedAtOf(sandbox),
    endAt: sandboxLifecycle(sandbox.spec).shutdownTime ?? NO_END,
    state: stateOf(sandbox),
    ...sizeOf(sandbox),
    envdVersion: ENVD_VERSION,
  };
}

export function e2bSandboxDetail(w: WorkerContext, sandbox: Sandbox, req: IncomingMessage): E2bSandboxDetail {
  const policy = egressPolicyOf(sandbox.spec.network);
  return {
    ...e2bListedSandbox(w, sandbox),
    envdAccessToken: w.dataPlane.tokens.accessToken(sandbox),
    domain: e2bDomain(w, req),
    allowInternetAccess: policy.internet,
    network: { allowOut: [...policy.allow], denyOut: [...policy.deny] },
    lifecycle: {
      onTimeout: sandboxLifecycle(sandbox.spec).shutdownPolicy === 'Suspend' ? 'pause' : 'kill',
      autoResume: sandbox.metadata.annotations?.[E2B_ANNOTATION.autoResume] === 'true',
    },
    ...(stateOf(sandbox) === 'paused' && sandbox.status?.phase === 'Hibernated' ? { pauseMode: keptMemory(sandbox.status.conditions) ? 'full' as const : 'filesystem' as const } : {}),
  };
}
