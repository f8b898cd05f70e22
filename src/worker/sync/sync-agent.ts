// The worker end of sync (protocol in src/api/hub-contract.ts): dials the hub (outbound only, so a
// cluster behind NAT needs no inbound port), says which hub version it last applied, and applies
// the snapshot or deltas it gets to the worker's own store (src/worker/sync/sync-apply.ts), persisting
// the version before acknowledging it.
//
// Messages are applied one batch at a time, in arrival order; a delta at or below the applied
// version is a replay and is skipped, so nothing is applied twice or out of order. A hub silent
// for 3 heartbeat intervals is taken for dead and the socket is dropped. Reconnects back off
// exponentially (250 ms doubling to 10 s) with jitter: after a hub restart 100 workers spread
// over the window instead of arriving in one burst. Everything applied stays in the worker's
// store, so keys, templates and pools keep working while the hub is away.
//
// Heartbeats (every 2 s, and one right after hello so the hub can place here at once) carry
// what placement needs: every template this cluster holds with its ready warm sandboxes. They
// are counted from two in-memory store lists, tens of microseconds for tens of templates.
import { WebSocket, type RawData } from 'ws';
import type { SandboxTemplate, SandboxWarmPool } from '../../api/types.ts';
import { SandboxTemplateType, SandboxWarmPoolType } from '../../api/types.ts';
import { TEMPLATE_ID_LABEL, TEMPLATE_NAME_LABEL } from '../../builds/template-object.ts';
import { clusterTagOf } from '../../api/ids.ts';
import { HEARTBEAT_MS, type HubToWorker, type PoolReport, type SyncItem, type WorkerToHub } from '../../api/hub-contract.ts';
import type { ObjectStore } from '../../store/store.ts';
import type { Clock, Timer } from '../../base/clock.ts';
import type { Logger } from '../../base/log.ts';
import { publishHubLink, type SyncStatus } from './hub-link.ts';
import { advanceTo, applyDeltas, applySnapshot, loadAppliedVersion } from './sync-apply.ts';

const SILENT_INTERVALS = 3;
const DEFAULT_BACKOFF = { baseMs: 250, maxMs: 10_000 };
// Snapshots of a large federation (10,000 keys and templates at ~1 KB) fit well under this.
const MAX_INBOUND_FRAME_BYTES = 256 * 1024 * 1024;

export interface SyncAgentOptions {
  /** The hub's base URL (http(s)://host:port); the agent dials <hubUrl>/v1/sync as ws(s). */
  hubUrl: string;
  credential: string;
  /** This worker cluster's name, as registered at the hub. */
  cluster: string;
  /**
   * This cluster's tag: the SandboxTemplates its builds made (named by ids starting with it) are
   * sent to the hub, which syncs them to every cluster. Absent: none are sent.
   */
  clusterTag?: string;
  /** The worker's own store. */
  store: ObjectStore;
  log: Logger;
  clock: Clock;
  backoff?: { baseMs?: number; maxMs?: number };
  heartbeatMs?: number;
  /** [0, 1): the jitter source; injected so tests can pin it. */
  random?: () => number;
}

export interface SyncAgent {
  status(): SyncStatus;
  /**
   * Sends a heartbeat now and resolves true once the hub has taken it in (placement sees what
   * this cluster holds as of now), false when not connected or after `timeoutMs`. Called after a
   * local template or pool write, so a create at the hub right after it finds the template.
   */
  reportNow(timeoutMs: number): Promise<boolean>;
  /** Closes the connection and stops reconnecting; waits for a batch being applied. Idempotent. */
  close(): Promise<void>;
}

type Incoming = { type: 'snapshot'; version: number; items: SyncItem[] } | { type: 'delta'; version: number; item: SyncItem } | { type: 'heartbeat'; version: number; seq?: number };

export function startSyncAgent(opts: SyncAgentOptions): SyncAgent {
  const log = opts.log.child({ component: 'sync-agent', hub: opts.hubUrl });
  const { clock, store } = opts;
  const heartbeatMs = opts.heartbeatMs ?? HEARTBEAT_MS;
  const baseMs = opts.backoff?.baseMs ?? DEFAULT_BACKOFF.baseMs;
  const maxMs = opts.backoff?.maxMs ?? DEFAULT_BACKOFF.maxMs;
  const random = opts.random ?? Math.random;
  const url = syncUrl(opts.hubUrl);

  let applied = 0;
  let hubVersion: number | undefined;
  let ws: WebSocket | undefined;
  let connected = false;
  let failures = 0;
  let retry: Timer | undefined;
  let beatTimer: Timer | undefined;
  let lastHeard = 0;
  let queue: Incoming[] = [];
  let applying: Promise<void> | undefined;
  let closed = false;
  /** Heartbeats sent with a seq and not answered yet: seq → resolve. */
  const awaiting = new Map<number, (taken: boolean) => void>();
  let nextSeq = 1;
  const settleAwaiting = (upTo: number, taken: boolean): void => {
    for (const [seq, resolve] of awaiting) {
      if (seq > upTo) continue;
      awaiting.delete(seq);
      resolve(taken);
    }
  };
  // The cluster's other processes (the API Deployment's route feed) read the link from the store.
  const link = publishHubLink(store, clock, log);

  const sendTo = (socket: WebSocket, msg: WorkerToHub): void => {
    if (socket.readyState === socket.OPEN) socket.send(JSON.stringify(msg));
  };

  /** Applies everything queued, in order, then acks; one batch at a time. */
  const drain = (socket: WebSocket): void => {
    if (applying !== undefined || queue.length === 0) return;
    const batch = queue;
    queue = [];
    applying = applyBatch(batch)
      .then(
        (changed) => {
          // A batch that outlived its socket is acked on the new one.
          const current = ws ?? socket;
          if (changed) sendTo(current, { type: 'ack', version: applied });
        },
        (err: unknown) => {
          // The version was not persisted: drop the link and resume from what was.
          log.error({ err }, 'applying sync messages failed; reconnecting');
          queue = [];
          socket.terminate();
        },
      )
      .finally(() => {
        applying = undefined;
        if (ws !== undefined) drain(ws);
      });
  };

  const applyBatch = async (batch: Incoming[]): Promise<boolean> => {
    const start = applied;
    let deltas: { version: number; item: SyncItem }[] = [];
    const flushDeltas = async (): Promise<void> => {
      if (deltas.length === 0) return;
      const written = await applyDeltas(store, deltas);
      applied = deltas.at(-1)?.version ?? applied;
      log.debug({ deltas: deltas.length, written, version: applied }, 'applied sync deltas');
      deltas = [];
    };
    for (const msg of batch) {
      if (msg.type === 'delta') {
        // A replay (at or below what is applied) is skipped: never twice, never backwards.
        if (msg.version > (deltas.at(-1)?.version ?? applied)) deltas.push({ version: msg.version, item: msg.item });
      } else if (msg.type === 'snapshot') {
        deltas = [];
        if (msg.version === applied) continue;
        if (msg.version < applied) log.warn({ applied, version: msg.version }, 'hub snapshot is older than what was applied (hub store reset?); taking it as the truth');
        const written = await applySnapshot(store, msg.version, msg.items);
        applied = msg.version;
        log.info({ items: msg.items.length, written, version: applied }, 'applied sync snapshot');
      } else {
        await flushDeltas();
        // Every change up to a heartbeat's version came before it on this socket: if none was
        // for us, we are current at that version all the same.
        if (msg.version > applied) {
          await advanceTo(store, msg.version);
          applied = msg.version;
        }
      }
    }
    await flushDeltas();
    return applied !== start;
  };

  const scheduleReconnect = (): void => {
    if (closed || retry !== undefined) return;
    const ceiling = Math.min(maxMs, baseMs * 2 ** Math.min(failures, 16));
    failures += 1;
    // Jitter over the upper half of the window: never zero, never all at once.
    const delay = Math.round(ceiling / 2 + (random() * ceiling) / 2);
    log.info({ delayMs: delay, failures }, 'reconnecting to the hub');
    retry = clock.after(delay, () => {
      retry = undefined;
      connect();
    });
  };

  const beat = (socket: WebSocket): void => {
    beatTimer = clock.after(heartbeatMs, () => {
      if (socket !== ws || socket.readyState !== socket.OPEN) return;
      if (clock.now() - lastHeard > SILENT_INTERVALS * heartbeatMs) {
        log.warn(`hub silent for ${SILENT_INTERVALS} heartbeat intervals; dropping the connection`);
        socket.terminate();
        return;
      }
      void reportBuilt(socket, true);
      sendHeartbeat(socket);
      beat(socket);
    });
  };

  const sendHeartbeat = (socket: WebSocket, seq?: number): void => {
    heartbeatCounts(store).then(
      ({ warm, templates, pools }) => sendTo(socket, { type: 'heartbeat', warm, healthy: true, templates, pools, ...(seq === undefined ? {} : { seq }) }),
      (err: unknown) => log.warn({ err }, 'could not count warm sandboxes for the heartbeat'),
    );
  };

  /**
   * Every SandboxTemplate this cluster's builds made, to the hub (src/hub/built-templates.ts):
   * when connected, after a local change (reportNow), and at each heartbeat when the set differs
   * from what this socket last sent (a build in another process of the cluster: the API
   * Deployment on Kubernetes, whose changes this process sees only in the store).
   */
  let lastBuilt: { socket: WebSocket; text: string } | undefined;
  const sendBuilt = async (socket: WebSocket, onlyIfChanged: boolean): Promise<void> => {
    const tag = opts.clusterTag;
    if (tag === undefined) return;
    const held = await store.list<SandboxTemplate>(SandboxTemplateType, { labelSelector: TEMPLATE_ID_LABEL });
    const items = held.items
      .filter((t) => clusterTagOf(t.metadata.labels?.[TEMPLATE_ID_LABEL] ?? '') === tag && t.metadata.deletionTimestamp === undefined)
      .map((t) => ({ apiVersion: t.apiVersion, kind: t.kind, metadata: { name: t.metadata.name, namespace: t.metadata.namespace ?? 'default', labels: t.metadata.labels ?? {}, annotations: t.metadata.annotations ?? {} }, spec: t.spec }))
      .sort((a, b) => a.metadata.name.localeCompare(b.metadata.name));
    const msg: WorkerToHub = { type: 'built', items };
    const text = JSON.stringify(msg);
    if (onlyIfChanged && lastBuilt?.socket === socket && lastBuilt.text === text) return;
    lastBuilt = { socket, text };
    if (socket.readyState === socket.OPEN) socket.send(text);
  };
  const reportBuilt = (socket: WebSocket, onlyIfChanged = false): Promise<void> => sendBuilt(socket, onlyIfChanged).catch((err: unknown) => log.warn({ err }, 'could not send the built templates to the hub'));

  const connect = (): void => {
    if (closed) return;
    const socket = new WebSocket(url, {
      headers: { authorization: `Bearer ${opts.credential}` },
      handshakeTimeout: SILENT_INTERVALS * heartbeatMs,
      maxPayload: MAX_INBOUND_FRAME_BYTES,
    });
    ws = socket;
    socket.on('open', () => {
      connected = true;
      link.set(true);
      lastHeard = clock.now();
      sendTo(socket, { type: 'hello', cluster: opts.cluster, lastVersion: applied });
      log.info({ lastVersion: applied }, 'connected to the hub');
      void reportBuilt(socket);
      sendHeartbeat(socket);
      beat(socket);
    });
    socket.on('message', (data: RawData) => {
      lastHeard = clock.now();
      let msg: Incoming;
      try {
        msg = parseMessage(data);
      } catch (err) {
        log.warn({ err }, 'bad frame from the hub; reconnecting');
        socket.terminate();
        return;
      }
      failures = 0;
      if (msg.type === 'heartbeat' && msg.seq !== undefined) settleAwaiting(msg.seq, true);
      hubVersion = Math.max(hubVersion ?? 0, msg.version);
      queue.push(msg);
      drain(socket);
    });
    socket.on('unexpected-response', (_req, res) => {
      log.error({ status: res.statusCode }, 'the hub refused this cluster (check --hub-credential-file and the cluster name)');
      res.resume();
      socket.terminate();
    });
    socket.on('error', (err) => log.debug({ err }, 'hub socket error'));
    socket.on('close', () => {
      if (socket !== ws) return;
      beatTimer?.cancel();
      connected = false;
      link.set(false);
      ws = undefined;
      queue = [];
      settleAwaiting(Infinity, false);
      scheduleReconnect();
    });
  };

  const started = loadAppliedVersion(store).then(
    (v) => {
      applied = v;
      connect();
    },
    (err: unknown) => {
      log.error({ err }, 'could not read the applied sync version; starting from a snapshot');
      connect();
    },
  );

  let closing: Promise<void> | undefined;
  return {
    status: () => ({ connected, appliedVersion: applied, ...(hubVersion === undefined ? {} : { hubVersion }) }),
    reportNow(timeoutMs) {
      const socket = ws;
      if (socket === undefined || !connected) return Promise.resolve(false);
      const seq = nextSeq++;
      return new Promise((resolve) => {
        const timer = clock.after(timeoutMs, () => {
          if (awaiting.delete(seq)) resolve(false);
        });
        awaiting.set(seq, (taken) => {
          timer.cancel();
          resolve(taken);
        });
        // The built templates first: the hub answers the heartbeat once it holds them.
        void reportBuilt(socket).then(() => sendHeartbeat(socket, seq));
      });
    },
    close() {
      closing ??= (async () => {
        closed = true;
        await started;
        retry?.cancel();
        beatTimer?.cancel();
        const socket = ws;
        ws = undefined;
        connected = false;
        if (socket !== undefined) {
          const gone = new Promise<void>((resolve) => socket.once('close', () => resolve()));
          socket.close(1001, 'worker shutting down');
          const timer = clock.after(1000, () => socket.terminate());
          await gone;
          timer.cancel();
        }
        await applying;
        settleAwaiting(Infinity, false);
        await link.close();
      })();
      return closing;
    },
  };
}

function syncUrl(hubUrl: string): string {
  const url = new URL(hubUrl);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  url.pathname = `${url.pathname.replace(/\/$/, '')}/v1/sync`;
  return url.toString();
}

/**
 * `warm`: ready members per pool. `templates`: every template held here, with the ready members
 * of all the pools built from it (0 when none).
 */
async function heartbeatCounts(store: ObjectStore): Promise<{ warm: Record<string, number>; templates: Record<string, number>; pools: Record<string, PoolReport> }> {
  const [poolList, held] = await Promise.all([store.list<SandboxWarmPool>(SandboxWarmPoolType), store.list<SandboxTemplate>(SandboxTemplateType)]);
  const warm: Record<string, number> = {};
  const templates: Record<string, number> = {};
  const pools: Record<string, PoolReport> = {};
  for (const t of held.items) templates[`${t.metadata.namespace ?? 'default'}/${t.metadata.name}`] = 0;
  // A team's built template is also created by its name (E2B's alias): the hub places such a
  // create on a cluster that holds the name, whose worker then resolves it for the team.
  for (const t of held.items) {
    const alias = t.metadata.labels?.[TEMPLATE_NAME_LABEL];
    const key = `${t.metadata.namespace ?? 'default'}/${alias ?? ''}`;
    if (alias !== undefined && !Object.hasOwn(templates, key)) templates[key] = 0;
  }
  for (const p of poolList.items) {
    const ns = p.metadata.namespace ?? 'default';
    const ready = p.status?.readyReplicas ?? 0;
    warm[`${ns}/${p.metadata.name}`] = ready;
    pools[`${ns}/${p.metadata.name}`] = { ready, desired: p.spec.replicas, template: p.spec.sandboxTemplateRef.name };
    const template = `${ns}/${p.spec.sandboxTemplateRef.name}`;
    // A pool of a template that is not here (deleted under it) makes nothing placeable.
    if (Object.hasOwn(templates, template)) templates[template] = (templates[template] ?? 0) + ready;
  }
  return { warm, templates, pools };
}

function parseMessage(data: RawData): Incoming {
  const text = Array.isArray(data) ? Buffer.concat(data).toString('utf8') : Buffer.from(data as ArrayBuffer).toString('utf8');
  const msg = JSON.parse(text) as HubToWorker;
  if (typeof msg !== 'object' || !Number.isSafeInteger(msg.version)) throw new Error('frame lacks a version');
  if (msg.type === 'snapshot' && Array.isArray(msg.items)) return msg;
  if (msg.type === 'delta' && typeof msg.item === 'object') return msg;
  if (msg.type === 'heartbeat') return msg.seq === undefined || Number.isSafeInteger(msg.seq) ? msg : { type: 'heartbeat', version: msg.version };
  throw new Error('unknown frame type');
}
