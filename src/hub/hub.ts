// The hub's composition root: store → key ring → admin API → HTTP server (+ the sync endpoint),
// started in that order and closed in the reverse order.
//
// The hub is the federation's source of truth for API keys (hashed), sandbox templates and the
// cluster registry. It keeps them in its own embedded store at <dataDir>/hub.db; workers dial
// GET /v1/sync on the same HTTP server and keep a copy (src/api/hub-contract.ts).
import { listen, packageVersion } from '../http/http-server.ts';
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { KeyRing } from '../auth/keyring.ts';
import { EXITING_OWNER_WAIT_MS, openSqliteStore } from '../store/sqlite.ts';
import type { ObjectStore } from '../store/store.ts';
import { systemClock, type Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { privateDir } from '../base/private-files.ts';
import { createHubApi } from './admin-api.ts';
import { ensureAdminKey } from '../auth/admin-key.ts';
import type { HubConfig } from './hub-config.ts';
import { createSyncMetrics, createSyncServer, SYNC_PATH, type SyncServer } from './sync-server.ts';
import { createTerminalProxy, terminalSandboxId } from './terminal-proxy.ts';

export interface HubDeps {
  log: Logger;
  clock?: Clock;
  registry?: Registry;
}

export interface RunningHub {
  /** Base URL of the admin API and the sync endpoint, e.g. http://127.0.0.1:7070 */
  readonly url: string;
  readonly store: ObjectStore;
  /** The admin key, when config.adminKeyFile asked for one. */
  readonly adminKey: string | undefined;
  /** The sync server: live connections, acks (benchmarks time propagation with onAck). */
  readonly sync: SyncServer;
  /** Idempotent. */
  close(): Promise<void>;
}

export async function startHub(config: HubConfig, deps: HubDeps): Promise<RunningHub> {
  const clock = deps.clock ?? systemClock;
  const registry = deps.registry ?? new Registry();
  const log = deps.log;
  privateDir(config.dataDir);

  const store = await openSqliteStore({ path: join(config.dataDir, 'hub.db'), ownerWaitMs: EXITING_OWNER_WAIT_MS, clock, log: log.child({ component: 'store' }) });
  const adminKey = config.adminKeyFile === undefined ? undefined : await ensureAdminKey(store, config.adminKeyFile, 'hub admin key (--admin-key-file)');
  const keyRing = await KeyRing.open({ store, log, clock });
  const sync = createSyncServer({ store, log, clock, metrics: createSyncMetrics(registry) });
  const api = createHubApi({ store, auth: keyRing, log, registry, clock, version: packageVersion(), sync });
  const terminals = createTerminalProxy({ store, sync, auth: keyRing, log });

  const server = createServer(api.handler);
  server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    const path = new URL(req.url ?? '/', 'http://hub.invalid').pathname;
    if (path === SYNC_PATH) {
      sync.upgrade(req, socket, head);
      return;
    }
    if (terminalSandboxId(path) !== undefined) {
      terminals.upgrade(req, socket, head);
      return;
    }
    socket.end('HTTP/1.1 404 Not Found\r\nconnection: close\r\ncontent-length: 0\r\n\r\n');
  });
  await listen(server, config.port, config.host);
  const { port } = server.address() as AddressInfo;
  const host = config.host.includes(':') ? `[${config.host}]` : config.host;
  const url = `http://${host}:${port}`;
  log.info({ url }, 'hub listening');

  let closing: Promise<void> | undefined;
  return {
    url,
    store,
    adminKey,
    sync,
    close() {
      closing ??= (async () => {
        // WebSockets first (terminals, then sync): an upgraded socket would keep server.close() waiting.
        await terminals.close();
        await sync.close();
        const closed = new Promise<void>((resolve) => server.close(() => resolve()));
        server.closeIdleConnections();
        await closed;
        api.close();
        keyRing.close();
        await store.close();
      })();
      return closing;
    },
  };
}


