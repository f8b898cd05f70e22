// The whole local system, as `make up` runs it and end-to-end tests start it: a worker process
// (store, runtime, operator, REST API), a router process (ExtProc) fed by the worker, and a real
// Envoy in front. Started in that order; stopped in the reverse one (Envoy stops taking
// traffic, the router closes, the worker hibernates its sandboxes and closes the store).
// With `supervise` (make up), a process that crashes is started again on the same ports and
// data (src/assembly/supervisor.ts); ports asked as 0 are fixed before the first start for that.
import { randomInt } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join, resolve } from 'node:path';
import type { EdgeConfigOptions } from '../edge/envoy-config.ts';
import { EnvoyProcess } from '../edge/envoy-process.ts';
import type { EdgeTlsFiles } from '../edge/tls.ts';
import type { Logger } from '../base/log.ts';
import { privateDir } from '../base/private-files.ts';
import { startChild, type ReadyChild } from '../base/child.ts';
import { supervise, unsupervised, type Run, type Supervised, type SupervisorOptions } from './supervisor.ts';

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
  /** Extra worker flags (src/assembly/worker-config.ts), e.g. --cluster-tag, --bridge, --subnet, --base-pool. */
  workerArgs?: readonly string[];
  /** Extra router flags (src/router/router-config.ts). */
  routerArgs?: readonly string[];
  /** The HTTPS edge listener (port 0: any) and its certificate (src/edge/tls.ts ensureEdgeTls). */
  edgeTls?: { port: number; files: Pick<EdgeTlsFiles, 'certChainPath' | 'privateKeyPath'> };
  /** Extra Envoy settings (federation: the ingress listener, TLS files, the hub upstream). */
  envoy?: Partial<Pick<EdgeConfigOptions, 'ingress' | 'tls' | 'hubAddress'>>;
  /** Restart crashed processes (make up); absent: a crashed process stays down (tests that crash one). */
  supervise?: SupervisorOptions;
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
  /** The worker process now (another object after a supervised restart). */
  readonly worker: ReadyChild<WorkerReady>;
  readonly router: ReadyChild<RouterReady>;
  envoy: EnvoyProcess;
  /** Whether the supervisor gave up on any of its processes. */
  readonly failed: string[];
  /** Stops everything, in order; idempotent. */
  stop(): Promise<void>;
  /** Kills everything at once (a second Ctrl-C) and resolves when all have exited. */
  kill(): Promise<void>;
}

interface WorkerReady {
  ready: true;
  apiUrl: string;
  clusterName: string;
  clusterTag: string;
  /** With --egress-proxy-port: the Envoy egress listener's settings. */
  egress?: NonNullable<EdgeConfigOptions['egress']>;
}

interface RouterReady {
  ready: true;
  listen: string;
  /** host:port of the router's GET /metrics (the admin key as bearer). */
  metrics?: string;
}

/** The first port the kernel lends to outgoing connections (net.ipv4.ip_local_port_range). */
function ephemeralLow(): number {
  try {
    const low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    return Number.isInteger(low) ? low : 32768;
  } catch {
    return 32768;
  }
}

/** Whether 127.0.0.1:port can be bound right now; 0 asks the kernel and answers the port it gave. */
function bindable(port: number): Promise<number | undefined> {
  return new Promise((res) => {
    const server = createServer();
    server.once('error', () => res(undefined));
    server.listen(port, '127.0.0.1', () => {
      const address = server.address();
      const bound = typeof address === 'object' && address !== null ? address.port : undefined;
      server.close(() => res(bound));
    });
  });
}

/** Where freePort looks: above the fixed ports we use (Envoy's 10000-10002, the egress proxy's 15001-15002). */
const FREE_PORTS_FROM = 20_000;

/**
 * A free loopback port right now, for a server whose port another part must know before it
 * binds (Envoy's edge: the worker names it in the URLs it returns). It is taken at random below
 * the kernel's ephemeral range: a port in that range can be lent as the source of any outgoing
 * connection in the seconds before the server binds it, and the server then fails with "Address
 * already in use" (seen with two test lanes connecting at once). Below it, only another listener
 * could take it. The kernel's pick when that range is too small.
 */
export async function freePort(): Promise<number> {
  const below = ephemeralLow();
  for (let tries = 0; below - FREE_PORTS_FROM >= 1000 && tries < 50; tries++) {
    const port = await bindable(FREE_PORTS_FROM + randomInt(below - FREE_PORTS_FROM));
    if (port !== undefined) return port;
  }
  const port = await bindable(0);
  if (port === undefined) throw new Error('no free loopback port: binding 127.0.0.1:0 failed');
  return port;
}

/** Puts a process under the policy, or leaves it unsupervised without one. */
export function supervisedBy<R extends Run>(policy: SupervisorOptions | undefined, name: string, first: R, start: () => Promise<R>, hint: string): Supervised<R> {
  return policy === undefined ? unsupervised(name, first) : supervise(name, first, start, policy, hint);
}

/** Envoy as a supervised run: EnvoyProcess restarts in place, on the ports of its first start. */
function envoyRuns(stateDir: string, log: Logger, config: EdgeConfigOptions, ownGroup: boolean): { envoy: EnvoyProcess; start(): Promise<Run> } {
  let unexpected: ((why: string) => void) | undefined;
  const envoy = new EnvoyProcess({ stateDir, logger: log, config, ownGroup, onUnexpectedExit: (code, signal) => unexpected?.(signal ?? `code ${String(code)}`) });
  return {
    envoy,
    async start() {
      const exited = new Promise<string>((resolve) => (unexpected = resolve));
      await envoy.start();
      // stop()/kill() end it on purpose: EnvoyProcess then reports no exit, so the run resolves here.
      let ended: () => void = () => undefined;
      const asked = new Promise<string>((resolve) => (ended = () => resolve('stopped')));
      return {
        exited: Promise.race([exited, asked]),
        stop: () => envoy.close().finally(ended),
        kill: () => envoy.kill().finally(ended),
      };
    },
  };
}

export async function startLocalSystem(opts: LocalSystemOptions): Promise<LocalSystem> {
  // Private: stores, logs and keys live below (src/base/private-files.ts).
  privateDir(opts.stateDir);
  const logs = join(opts.stateDir, 'logs');
  privateDir(logs);
  const policy = opts.supervise;
  // A restart must come back where the others expect it: fix ports asked as 0 now.
  const apiPort = opts.apiPort === 0 && policy !== undefined ? await freePort() : opts.apiPort;
  const routerPort = opts.routerPort === 0 && policy !== undefined ? await freePort() : opts.routerPort;
  const routerMetricsPort = policy !== undefined ? await freePort() : 0;
  const edgePort = opts.edgePort === 0 ? await freePort() : opts.edgePort;
  const edgeUrl = `http://127.0.0.1:${edgePort}`;
  const tlsPort = opts.edgeTls === undefined ? undefined : opts.edgeTls.port === 0 ? await freePort() : opts.edgeTls.port;
  const edgeTlsUrl = tlsPort === undefined ? undefined : `https://127.0.0.1:${tlsPort}`;
  const keyFile = join(opts.stateDir, 'admin.key');
  const started: { stop(): Promise<void> }[] = [];
  const stopAll = async (): Promise<void> => {
    for (const part of started.reverse()) await part.stop();
  };
  const ownGroup = policy !== undefined;
  const name = (part: string): string => `${opts.clusterName} ${part}`;
  try {
    const startWorker = (): Promise<ReadyChild<WorkerReady>> => startChild<WorkerReady>({
      name: 'worker',
      ownGroup,
      entry: join(repoRoot, 'src/assembly/worker-main.ts'),
      args: [
        '--data-dir', join(opts.stateDir, 'data'),
        '--admin-key-file', keyFile,
        '--port', String(apiPort),
        '--cluster', opts.clusterName,
        '--domain', opts.domain,
        '--edge-url', edgeUrl,
        ...(edgeTlsUrl === undefined ? [] : ['--edge-tls-url', edgeTlsUrl]),
        ...(opts.workerArgs ?? []),
      ],
      logPath: join(logs, 'worker.log'),
    });
    const worker = supervisedBy(policy, name('worker'), await startWorker(), startWorker, `its log is ${join(logs, 'worker.log')}`);
    started.push(worker);
    const firstWorker = worker.current.ready;
    const apiAddress = new URL(firstWorker.apiUrl).host;

    const startRouter = (): Promise<ReadyChild<RouterReady>> => startChild<RouterReady>({
      name: 'router',
      ownGroup,
      entry: join(repoRoot, 'src/router/router-main.ts'),
      args: [
        '--listen', `127.0.0.1:${routerPort}`,
        '--domain', opts.domain,
        '--worker', `${opts.clusterName}=${firstWorker.apiUrl}`,
        '--worker-key-file', keyFile,
        // Prometheus scrapes it (docs/operations.md, "Dashboards and alerts"); the ready line says its port.
        '--metrics-listen', `127.0.0.1:${routerMetricsPort}`,
        ...(opts.routerArgs ?? []),
      ],
      logPath: join(logs, 'router.log'),
    });
    const router = supervisedBy(policy, name('router'), await startRouter(), startRouter, `its log is ${join(logs, 'router.log')}`);
    started.push(router);

    const runs = envoyRuns(join(opts.stateDir, 'envoy'), opts.log, {
      listenPort: edgePort,
      adminPort: opts.envoyAdminPort,
      routerAddress: router.current.ready.listen,
      workers: [{ cluster: opts.clusterName, apiAddress }],
      ...(firstWorker.egress === undefined ? {} : { egress: firstWorker.egress }),
      ...(opts.edgeTls === undefined || tlsPort === undefined ? {} : { edgeTls: { listenPort: tlsPort, ...opts.edgeTls.files } }),
      ...opts.envoy,
    }, ownGroup);
    const envoy = supervisedBy(policy, name('Envoy'), await runs.start(), () => runs.start(), `its log is ${runs.envoy.logPath}`);
    started.push(envoy);
    const units = [worker, router, envoy];

    let stopping: Promise<void> | undefined;
    return {
      apiUrl: firstWorker.apiUrl,
      edgeUrl,
      edgeTlsUrl,
      domain: opts.domain,
      adminKey: readFileSync(keyFile, 'utf8').trim(),
      clusterName: firstWorker.clusterName,
      clusterTag: firstWorker.clusterTag,
      get worker() {
        return worker.current;
      },
      get router() {
        return router.current;
      },
      envoy: runs.envoy,
      get failed() {
        return units.filter((u) => u.failed).map((u) => u.name);
      },
      stop() {
        stopping ??= stopAll();
        return stopping;
      },
      async kill() {
        await Promise.all(units.map((u) => u.kill()));
      },
    };
  } catch (err) {
    await stopAll();
    throw err;
  }
}
