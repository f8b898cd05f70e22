// The whole local system, as `make up` runs it and end-to-end tests start it: a worker process
// (store, runtime, operator, REST API), a router process (ExtProc) fed by the worker, and a real
// Envoy in front. Started in that order; stopped in the reverse one (Envoy stops taking
// traffic, the router closes, the worker hibernates its sandboxes and closes the store).
import { mkdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join, resolve } from 'node:path';
import type { EdgeConfigOptions } from '../edge/envoy-config.ts';
import { EnvoyProcess } from '../edge/envoy-process.ts';
import type { EdgeTlsFiles } from '../edge/tls.ts';
import type { Logger } from './log.ts';
import { startChild, type ReadyChild } from './child.ts';

const repoRoot = resolve(import.meta.dirname, '../..');

export interface LocalSystemOptions {
  /** `.asb/` for make up: data/, logs/, envoy/, admin.key live here. */
  stateDir: string;
  log: Logger;
  /** Worker REST API port (0: any). */
  apiPort: number;
  /** Envoy's HTTP listener (0: any free port, picked before the worker starts). */
  edgePort: number;
  /** Envoy admin port, bound to 127.0.0.1 (0: any). */
  envoyAdminPort: number;
  /** Router gRPC port on 127.0.0.1 (0: any). */
  routerPort: number;
  domain: string;
  clusterName: string;
  /** Extra worker flags (src/system/config.ts), e.g. --cluster-tag, --bridge, --subnet, --base-pool. */
  workerArgs?: readonly string[];
  /** Extra router flags (src/router/router-config.ts). */
  routerArgs?: readonly string[];
  /** The HTTPS edge listener (port 0: any) and its certificate (src/edge/tls.ts ensureEdgeTls). */
  edgeTls?: { port: number; files: Pick<EdgeTlsFiles, 'certChainPath' | 'privateKeyPath'> };
  /** Extra Envoy settings (federation: the ingress listener, TLS files, the hub upstream). */
  envoy?: Partial<Pick<EdgeConfigOptions, 'ingress' | 'tls' | 'hubAddress'>>;
}

export interface LocalSystem {
  apiUrl: string;
  edgeUrl: string;
  /** https://127.0.0.1:<port>, when edgeTls was asked for. */
  edgeTlsUrl: string | undefined;
  domain: string;
  adminKey: string;
  clusterName: string;
  clusterTag: string;
  worker: ReadyChild<WorkerReady>;
  router: ReadyChild<RouterReady>;
  envoy: EnvoyProcess;
  /** Stops everything, in order; idempotent. */
  stop(): Promise<void>;
}

interface WorkerReady {
  ready: true;
  apiUrl: string;
  clusterName: string;
  clusterTag: string;
}

interface RouterReady {
  ready: true;
  listen: string;
}

/** A free loopback port right now (for Envoy, whose port the worker must know first). */
export function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const server = createServer();
    server.once('error', rej);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      server.close(() => res(port));
    });
  });
}

export async function startLocalSystem(opts: LocalSystemOptions): Promise<LocalSystem> {
  const logs = join(opts.stateDir, 'logs');
  mkdirSync(logs, { recursive: true });
  const edgePort = opts.edgePort === 0 ? await freePort() : opts.edgePort;
  const edgeUrl = `http://127.0.0.1:${edgePort}`;
  const tlsPort = opts.edgeTls === undefined ? undefined : opts.edgeTls.port === 0 ? await freePort() : opts.edgeTls.port;
  const edgeTlsUrl = tlsPort === undefined ? undefined : `https://127.0.0.1:${tlsPort}`;
  const keyFile = join(opts.stateDir, 'admin.key');
  const started: { stop(): Promise<void> }[] = [];
  const stopAll = async (): Promise<void> => {
    for (const part of started.reverse()) await part.stop();
  };
  try {
    const worker = await startChild<WorkerReady>({
      name: 'worker',
      entry: join(repoRoot, 'src/system/worker-main.ts'),
      args: [
        '--data-dir', join(opts.stateDir, 'data'),
        '--admin-key-file', keyFile,
        '--port', String(opts.apiPort),
        '--cluster', opts.clusterName,
        '--domain', opts.domain,
        '--edge-url', edgeUrl,
        ...(edgeTlsUrl === undefined ? [] : ['--edge-tls-url', edgeTlsUrl]),
        ...(opts.workerArgs ?? []),
      ],
      logPath: join(logs, 'worker.log'),
    });
    started.push(worker);
    const apiAddress = new URL(worker.ready.apiUrl).host;

    const router = await startChild<RouterReady>({
      name: 'router',
      entry: join(repoRoot, 'src/router/router-main.ts'),
      args: [
        '--listen', `127.0.0.1:${opts.routerPort}`,
        '--domain', opts.domain,
        '--worker', `${opts.clusterName}=${worker.ready.apiUrl}`,
        '--worker-key-file', keyFile,
        ...(opts.routerArgs ?? []),
      ],
      logPath: join(logs, 'router.log'),
    });
    started.push(router);

    const envoy = new EnvoyProcess({
      stateDir: join(opts.stateDir, 'envoy'),
      logger: opts.log,
      config: {
        listenPort: edgePort,
        adminPort: opts.envoyAdminPort,
        routerAddress: router.ready.listen,
        workers: [{ cluster: opts.clusterName, apiAddress }],
        ...(opts.edgeTls === undefined || tlsPort === undefined ? {} : { edgeTls: { listenPort: tlsPort, ...opts.edgeTls.files } }),
        ...opts.envoy,
      },
    });
    mkdirSync(join(opts.stateDir, 'envoy'), { recursive: true });
    await envoy.start();
    started.push({ stop: () => envoy.close() });

    let stopping: Promise<void> | undefined;
    return {
      apiUrl: worker.ready.apiUrl,
      edgeUrl,
      edgeTlsUrl,
      domain: opts.domain,
      adminKey: readFileSync(keyFile, 'utf8').trim(),
      clusterName: worker.ready.clusterName,
      clusterTag: worker.ready.clusterTag,
      worker,
      router,
      envoy,
      stop() {
        stopping ??= stopAll();
        return stopping;
      },
    };
  } catch (err) {
    await stopAll();
    throw err;
  }
}
