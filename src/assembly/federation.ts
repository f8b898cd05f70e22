// A whole federation on one machine, as `make up` runs it and the federation tests start it: a hub
// process, then per worker cluster a worker (its own store, runtime, bridge and subnet), a router
// and an Envoy whose edge listener takes clients and whose ingress listener (mutual TLS) takes
// what other clusters' edges forward. Every cluster is registered at the hub first, so its worker
// syncs keys, templates and the registry from the start. Stopped in the reverse order.
//
// State under <stateDir>: hub/ (store, admin.key), tls/ (federation CA and Envoy certificates),
// clusters/<name>/ (data, logs, envoy, admin.key, hub.credential), logs/hub.log.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { ensureEdgeTls, ensureFederationTls } from '../edge/tls.ts';
import { startChild, type ReadyChild } from '../base/child.ts';
import { freePort, startLocalSystem, supervisedBy, type LocalSystem } from './local-system.ts';
import type { SupervisorOptions } from './supervisor.ts';
import type { Logger } from '../base/log.ts';
import { privateDir } from '../base/private-files.ts';

const repoRoot = resolve(import.meta.dirname, '../..');

export interface FederatedClusterOptions {
  name: string;
  region: string;
  /** 4 chars [a-z0-9]: the prefix of its sandbox ids. */
  tag: string;
  /** Ports on 127.0.0.1; 0 picks a free one. */
  apiPort: number;
  edgePort: number;
  ingressPort: number;
  /** The edge's HTTPS listener (0: any free port); absent: none. */
  edgeTlsPort?: number;
  routerPort: number;
  envoyAdminPort: number;
  bridge: string;
  /** Pod addresses, a /16. */
  subnet: string;
  /** Extra worker flags, e.g. --base-pool 0. */
  workerArgs?: readonly string[];
}

export interface FederationOptions {
  stateDir: string;
  log: Logger;
  domain: string;
  /** The hub's port on 127.0.0.1; 0 picks a free one. */
  hubPort: number;
  clusters: readonly FederatedClusterOptions[];
  /** Restart crashed processes (make up); see src/assembly/supervisor.ts. */
  supervise?: SupervisorOptions;
}

export interface FederatedCluster extends LocalSystem {
  region: string;
  /** `127.0.0.1:<port>` of its ingress listener. */
  ingressAddress: string;
}

export interface Federation {
  hubUrl: string;
  /** Starts a cluster again on the same ports, data and credential (after a crash test killed it). */
  restart(name: string): Promise<FederatedCluster>;
  /** The hub's admin key: synced to every cluster, so it works at every edge and worker too. */
  adminKey: string;
  domain: string;
  /** The CA that signed the edges' HTTPS certificate (what clients trust), when a cluster has an edgeTlsPort. */
  edgeCaCertPath: string | undefined;
  /** The hub process now (another object after a supervised restart). */
  readonly hub: ReadyChild<{ ready: true; url: string }>;
  clusters: FederatedCluster[];
  /** Stops everything, clusters first (each: Envoy, router, worker), then the hub; idempotent. */
  stop(): Promise<void>;
  /** Kills everything at once and resolves when all have exited. */
  kill(): Promise<void>;
}

export async function startFederation(opts: FederationOptions): Promise<Federation> {
  // Private: stores, logs and keys live below (src/base/private-files.ts).
  privateDir(opts.stateDir);
  const logs = join(opts.stateDir, 'logs');
  privateDir(logs);
  const tls = await ensureFederationTls(join(opts.stateDir, 'tls'));
  const edgeTls = opts.clusters.some((c) => c.edgeTlsPort !== undefined) ? await ensureEdgeTls(join(opts.stateDir, 'edge-tls'), opts.domain) : undefined;
  const started: { stop(): Promise<void> }[] = [];
  const stopAll = async (): Promise<void> => {
    for (const part of started.reverse()) await part.stop();
  };
  try {
    const hubKeyFile = join(opts.stateDir, 'hub', 'admin.key');
    // A restarted hub must come back on the port the workers and Envoys were given.
    const hubPort = opts.hubPort === 0 && opts.supervise !== undefined ? await freePort() : opts.hubPort;
    const startHub = (): Promise<ReadyChild<{ ready: true; url: string }>> => startChild<{ ready: true; url: string }>({
      name: 'hub',
      entry: join(repoRoot, 'src/hub/hub-main.ts'),
      args: ['--data-dir', join(opts.stateDir, 'hub'), '--admin-key-file', hubKeyFile, '--port', String(hubPort)],
      logPath: join(logs, 'hub.log'),
      ownGroup: opts.supervise !== undefined,
    });
    const hub = supervisedBy(opts.supervise, 'hub', await startHub(), startHub, `its log is ${join(logs, 'hub.log')}`);
    started.push(hub);
    const adminKey = readFileSync(hubKeyFile, 'utf8').trim();
    const hubUrl = hub.current.ready.url;
    const hubAddress = new URL(hubUrl).host;

    const clusters: FederatedCluster[] = [];
    const fixed = new Map<string, FederatedClusterOptions>();
    const startOne = async (c: FederatedClusterOptions): Promise<FederatedCluster> => {
      const dir = join(opts.stateDir, 'clusters', c.name);
      privateDir(dir);
      const ingressAddress = `127.0.0.1:${c.ingressPort}`;
      const credentialFile = join(dir, 'hub.credential');
      await registerCluster(hubUrl, adminKey, c, { apiUrl: `http://127.0.0.1:${c.apiPort}`, ingressAddress, credentialFile });
      const system = await startLocalSystem({
        stateDir: dir,
        log: opts.log,
        apiPort: c.apiPort,
        edgePort: c.edgePort,
        envoyAdminPort: c.envoyAdminPort,
        routerPort: c.routerPort,
        domain: opts.domain,
        clusterName: c.name,
        workerArgs: [
          '--cluster-tag', c.tag,
          '--bridge', c.bridge,
          '--subnet', c.subnet,
          '--hub-url', hubUrl,
          '--hub-credential-file', credentialFile,
          ...(c.workerArgs ?? []),
        ],
        ...(c.edgeTlsPort === undefined || edgeTls === undefined ? {} : { edgeTls: { port: c.edgeTlsPort, files: edgeTls } }),
        routerArgs: ['--hub-upstream', 'on'],
        envoy: { ingress: { listenPort: c.ingressPort }, tls, hubAddress },
        ...(opts.supervise === undefined ? {} : { supervise: opts.supervise }),
      });
      started.push(system);
      return Object.assign(system, { region: c.region, ingressAddress });
    };
    for (const requested of opts.clusters) {
      // Ports are fixed before the first start: the hub registers them, and a restart reuses them.
      const c = { ...requested };
      for (const key of ['apiPort', 'edgePort', 'ingressPort', 'routerPort', 'envoyAdminPort', 'edgeTlsPort'] as const) if (c[key] === 0) c[key] = await freePort();
      fixed.set(c.name, c);
      clusters.push(await startOne(c));
    }
    // The hub's admin key reaches each worker by sync; wait for it, so the key in .asb/env works
    // everywhere the moment we say we are up.
    for (const c of clusters) await untilKeyWorks(c.apiUrl, adminKey, c.clusterName);

    let stopping: Promise<void> | undefined;
    return {
      hubUrl,
      adminKey,
      domain: opts.domain,
      edgeCaCertPath: edgeTls?.caCertPath,
      get hub() {
        return hub.current;
      },
      clusters,
      async restart(name) {
        const c = fixed.get(name);
        const index = clusters.findIndex((x) => x.clusterName === name);
        if (c === undefined || index === -1) throw new Error(`no cluster ${name} in this federation`);
        await clusters[index]?.stop();
        const again = await startOne(c);
        clusters[index] = again;
        return again;
      },
      stop() {
        stopping ??= stopAll();
        return stopping;
      },
      async kill() {
        await Promise.all([hub.kill(), ...clusters.map((c) => c.kill())]);
      },
    };
  } catch (err) {
    await stopAll();
    throw err;
  }
}

interface Registration {
  apiUrl: string;
  ingressAddress: string;
  credentialFile: string;
}

/**
 * Registers (or updates) the cluster at the hub. Its sync credential is shown once, at
 * registration: it is kept in credentialFile, and rotated when that file is gone.
 */
async function registerCluster(hubUrl: string, adminKey: string, c: FederatedClusterOptions, reg: Registration): Promise<void> {
  const body = { region: c.region, tag: c.tag, apiUrl: reg.apiUrl, ingressAddress: reg.ingressAddress };
  const put = await hubCall<{ credential?: string }>(hubUrl, adminKey, 'PUT', `/v1/clusters/${c.name}`, body);
  let credential = put.credential;
  if (credential === undefined && !existsSync(reg.credentialFile)) {
    credential = (await hubCall<{ credential?: string }>(hubUrl, adminKey, 'POST', `/v1/clusters/${c.name}/credential`)).credential;
  }
  if (credential !== undefined) writeFileSync(reg.credentialFile, `${credential}\n`, { mode: 0o600 });
}

async function hubCall<T>(hubUrl: string, key: string, method: string, path: string, body?: unknown): Promise<T> {
  const res = await fetch(`${hubUrl}${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`hub ${method} ${path}: HTTP ${res.status}: ${text.slice(0, 300)}`);
  return JSON.parse(text) as T;
}

const KEY_SYNC_DEADLINE_MS = 30_000;

async function untilKeyWorks(apiUrl: string, key: string, cluster: string): Promise<void> {
  const deadline = Date.now() + KEY_SYNC_DEADLINE_MS;
  for (;;) {
    const res = await fetch(`${apiUrl}/v1/status`, { headers: { authorization: `Bearer ${key}` } });
    await res.body?.cancel();
    if (res.status === 200) return;
    if (Date.now() > deadline) throw new Error(`cluster ${cluster} did not receive the hub's admin key within ${KEY_SYNC_DEADLINE_MS / 1000} s (last answer HTTP ${res.status}); see its worker log`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
