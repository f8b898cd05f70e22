// The worker's composition root: store → runtime → operator → API, started in that order and
// closed in the reverse order under one deadline.
import { listen, packageVersion } from './http-server.ts';
import { mkdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { builtinObjects } from '../api/builtin.ts';
import { resourceTypeFor } from '../api/validate.ts';
import { SandboxWarmPoolType, type SandboxWarmPool } from '../api/types.ts';
import { ensureAdminKey } from '../auth/admin-key.ts';
import { KeyRing } from '../auth/keyring.ts';
import { isAsbError } from '../errors.ts';
import { createMetrics } from '../metrics/metrics.ts';
import { startOperator } from '../operator/operator.ts';
import { createLocalRuntime } from '../runtime/local/local-runtime.ts';
import type { PodRuntime } from '../runtime/runtime.ts';
import { openSqliteStore } from '../store/sqlite.ts';
import type { ObjectStore } from '../store/store.ts';
import { createAccessTokens, loadClusterSecret } from '../worker/access-token.ts';
import { createWorkerServer } from '../worker/server.ts';
import { startSyncAgent, type SyncAgent } from '../worker/sync-agent.ts';
import { systemClock, type Clock } from './clock.ts';
import type { WorkerConfig } from './config.ts';
import type { Logger } from './log.ts';

export interface WorkerDeps {
  log: Logger;
  clock?: Clock;
  registry?: Registry;
  /** Replaces the local runtime (tests of API behaviour only). */
  runtime?: PodRuntime;
}

export interface RunningWorker {
  readonly apiUrl: string;
  readonly store: ObjectStore;
  readonly runtime: PodRuntime;
  /** The admin key, when this start created or verified one (config.adminKeyFile). */
  readonly adminKey: string | undefined;
  /** hibernate: stop every running sandbox (kept on disk; restarted on the next start). */
  close(opts?: { hibernate?: boolean }): Promise<void>;
}

export async function startWorker(config: WorkerConfig, deps: WorkerDeps): Promise<RunningWorker> {
  const clock = deps.clock ?? systemClock;
  const registry = deps.registry ?? new Registry();
  const metrics = createMetrics(registry);
  const log = deps.log;
  mkdirSync(config.dataDir, { recursive: true });
  // Read before anything opens, so a missing credential file fails the start cleanly.
  const hubCredential = config.hubCredentialFile === undefined ? undefined : readCredential(config.hubCredentialFile);

  const store = await openSqliteStore({ path: join(config.dataDir, 'store.db'), clock, metrics, log: log.child({ component: 'store' }) });
  const runtime =
    deps.runtime ??
    (await createLocalRuntime({ root: join(config.dataDir, 'runtime'), log: log.child({ component: 'runtime' }), clock, subnet: config.subnet, bridge: config.bridge }));
  await ensureBuiltins(store, config);
  const adminKey = config.adminKeyFile === undefined ? undefined : await ensureAdminKey(store, config.adminKeyFile, 'local admin key created by make up');

  const operator = await startOperator({ store, runtime, log: log.child({ component: 'operator' }), metrics, clock, clusterTag: config.clusterTag });
  const keyRing = await KeyRing.open({ store, log: log.child({ component: 'keyring' }), clock });
  // Keys, templates and peers from the hub land in this store; the key ring and the operator
  // read them from here, so they keep working while the hub is away.
  const sync: SyncAgent | undefined =
    config.hubUrl === undefined || hubCredential === undefined
      ? undefined
      : startSyncAgent({ hubUrl: config.hubUrl, credential: hubCredential, cluster: config.clusterName, store, log, clock });
  const api = await createWorkerServer({
    store,
    runtime,
    operator,
    auth: keyRing,
    log: log.child({ component: 'api' }),
    metrics,
    registry,
    clock,
    cluster: { name: config.clusterName, tag: config.clusterTag },
    version: packageVersion(),
    dataPlane: { domain: config.domain, edgeUrl: config.edgeUrl, ...(config.edgeTlsUrl === undefined ? {} : { edgeTlsUrl: config.edgeTlsUrl }), tokens: createAccessTokens(loadClusterSecret(config.dataDir)) },
    terminal: { idleMs: config.terminalIdleMs },
    ...(sync === undefined ? {} : { sync: () => sync.status() }),
  });
  const server = createServer(api.handler);
  server.on('upgrade', api.upgrade);
  // Claims come in bursts of many short requests: keep connections alive past the default 5 s.
  server.keepAliveTimeout = 65_000;
  await listen(server, config.apiPort, config.apiHost);
  const { port } = server.address() as AddressInfo;
  const host = config.apiHost.includes(':') ? `[${config.apiHost}]` : config.apiHost;
  const apiUrl = `http://${host}:${port}`;
  log.info({ apiUrl }, 'worker API listening');

  let closing: Promise<void> | undefined;
  return {
    apiUrl,
    store,
    runtime,
    adminKey,
    close(opts = {}) {
      closing ??= (async () => {
        // The hub link first: nothing synced after this point could be acknowledged anyway.
        await sync?.close();
        // Route feed WebSockets first: an upgraded socket would keep server.close() waiting.
        api.closeStreams();
        server.closeIdleConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
        server.closeAllConnections();
        await api.close();
        keyRing.close();
        await operator.close();
        if (opts.hibernate === true) {
          await Promise.all(runtime.list().map((id) => runtime.stop(id)));
        }
        await runtime.close();
        await store.close();
      })();
      return closing;
    },
  };
}

function readCredential(file: string): string {
  const credential = readFileSync(file, 'utf8').trim();
  if (credential === '') throw new Error(`hub credential file ${file} is empty`);
  return credential;
}



/** Creates the built-in base template and pool when absent; never overwrites a user's edit. */
async function ensureBuiltins(store: ObjectStore, config: WorkerConfig): Promise<void> {
  for (const obj of builtinObjects()) {
    const rt = resourceTypeFor(obj.apiVersion, obj.kind);
    if (rt === undefined) throw new Error(`builtin object of unknown kind ${obj.kind}`);
    if (rt === SandboxWarmPoolType) (obj as SandboxWarmPool).spec.replicas = config.basePoolReplicas;
    try {
      await store.create(rt, obj);
    } catch (err) {
      if (!isAsbError(err, 'AlreadyExists')) throw err;
    }
  }
}
