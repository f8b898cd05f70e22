// The REST API's response shapes for sandboxes and snapshots, as servers send them and clients
// (src/client/, the CLI, MCP) read them. The servers fill them (src/worker/views.ts,
// src/worker/routes-snapshots.ts); they live here so a client need not import a server.
import type { SandboxPhase, SuspensionStrategy } from './types.ts';

/** A sandbox as the REST API shows it: flat, from the Sandbox object, plus how to reach it through the edge. */
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

/** A snapshot as the REST API shows it. */
export interface SnapshotView {
  id: string;
  name?: string;
  sandbox: string;
  template?: string;
  phase: string;
  memory: boolean;
  bytes?: number;
  memoryBytes?: number;
  takenAt?: string;
  createdAt?: string;
  message?: string;
}
