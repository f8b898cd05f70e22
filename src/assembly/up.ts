// `make up`: runs the local federation in the foreground (src/assembly/federation.ts: a hub and two
// worker clusters, region-a and region-b, each with its worker, router and Envoy), writes
// `.asb/env` when it is ready, prints the endpoints, restarts a process that crashes (with
// backoff, giving up on one that keeps crashing: src/assembly/supervisor.ts), and on Ctrl-C or
// SIGTERM stops everything it started, in order, and exits after the last. A second signal kills
// everything at once and still waits for it to be gone.
//
// It holds the state dir while it runs (<state dir>/up.lock, src/store/owner-lock.ts): a second
// `make up` on it says which process holds it and exits 1 before starting anything.
//
// Settings (environment; the worker's own ASB_* variables in config.ts apply too, except those
// `.asb/env` sets for clients, which no process make up starts ever sees: client-settings.ts):
//   ASB_STATE_DIR          where .asb lives (default <repo>/.asb)
//   ASB_FEDERATION         off: one cluster and no hub (the ports below are then its own)
//   ASB_HUB_PORT           the hub's port (default 7070)
//   ASB_API_PORT           region-a's worker REST API port (default 7080; region-b: +1)
//   ASB_EDGE_PORT          region-a's edge listener on 127.0.0.1 (default 10000; region-b: +100)
//   ASB_INGRESS_PORT       region-a's ingress listener, mutual TLS (default 10001; region-b: +100)
//   ASB_EDGE_TLS_PORT      region-a's HTTPS edge listener, local CA in .asb/edge-tls (default 10002; region-b: +100)
//   ASB_ENVOY_ADMIN_PORT   region-a's Envoy admin port (default 9901; region-b: +1)
//   ASB_ROUTER_PORT        region-a's router gRPC port (default 9002; region-b: +1)
//   ASB_DOMAIN             sandbox domain: <port>-<id>.<domain> (default asb.localhost)
//   ASB_CLUSTER_NAME       the cluster's name when ASB_FEDERATION=off (default local)
//   ASB_SUBNET, ASB_BRIDGE pod subnet (a /16) and bridge; default derived from the state dir, so
//                          two checkouts differ (local-network.ts). With the federation, region-a
//                          takes ASB_SUBNET and region-b the next /16; the bridges are ASB_BRIDGE0, 1
//   ASB_EGRESS_PROXY_PORT  region-a's egress proxy (default 15001; region-b: +1; 0 picks a free one; off: none).
//                          Sandboxes' outbound TCP goes through it (the Envoy `egress` listener on the
//                          pods' gateway; the worker's decision service on 127.0.0.1 at the same
//                          port); without it domain entries of a policy are refused (docs/networking.md, "Egress proxy")
//   ASB_REGISTRY_PORT      the image registry on 127.0.0.1 (default 5050), docker.io's mirror for
//                          every worker; its data in .asb/registry, the image cache in .asb/images
import { renameSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { acquireOwnerLock, OwnerLockHeld } from '../store/owner-lock.ts';
import { dropClientSettings, type EnvFileKey } from './client-settings.ts';
import { privateDir } from '../base/private-files.ts';
import { createLogger } from '../base/log.ts';
import { derivedNetwork, nthSubnet } from '../runtime/local/derived-network.ts';
import { startFederation, type Federation } from './federation.ts';
import { ensureEdgeTls } from '../edge/tls.ts';
import { freePort, startLocalSystem, type LocalSystem } from './local-system.ts';
import { writeKubeconfig, type KubeCluster } from './kubeconfig.ts';
import { systemClock } from '../base/clock.ts';
import { startLocalRegistry, type LocalRegistry } from '../images/local-registry.ts';
import { defaultSeedDir } from '../images/seed.ts';
import { restartDelay, type SupervisorOptions } from './supervisor.ts';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

function port(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const text = env[name];
  if (text === undefined || text === '') return fallback;
  const value = Number(text);
  if (!Number.isInteger(value) || value < 0 || value > 65535) {
    console.error(`${name} must be a port number from 0 to 65535, got "${text}"`);
    process.exit(2);
  }
  return value;
}

/** The product default: every sandbox's domain entries are decided (docs/networking.md, "Egress proxy"). */
const DEFAULT_EGRESS_PROXY_PORT = 15001;

/** `--egress-proxy-port` for the cluster at `step` (region-b: +1), or none when ASB_EGRESS_PROXY_PORT=off. */
async function egressArgs(env: NodeJS.ProcessEnv, step: number): Promise<string[]> {
  if (env.ASB_EGRESS_PROXY_PORT === 'off') return ['--egress-proxy-port', 'off'];
  const base = port(env, 'ASB_EGRESS_PROXY_PORT', DEFAULT_EGRESS_PROXY_PORT);
  // 0: a free port now, fixed before the first start (the decision service and Envoy must agree on it).
  return ['--egress-proxy-port', String(base === 0 ? await freePort() : base + step)];
}

function egressLine(args: readonly string[]): string {
  const port = args.at(-1) ?? 'off';
  return port === 'off' ? 'egress proxy off (ASB_EGRESS_PROXY_PORT=off): policies may name CIDRs only' : `egress proxy on <pods' gateway>:${port}, decides policies' domains (ASB_EGRESS_PROXY_PORT=off turns it off)`;
}

/** What `make up` started, whichever mode: enough to write .asb/env, announce and stop it. */
interface Running {
  /** What .asb/env gets: only keys client-settings.ts keeps from every process make up starts. */
  env: Partial<Record<EnvFileKey, string>>;
  banner: string;
  /** One kubeconfig context per cluster (its TLS edge), for .asb/kubeconfig. */
  kubeClusters: KubeCluster[];
  /** Kills every process at once; resolves when all have exited. */
  kill(): Promise<void>;
  stop(): Promise<void>;
}

/** As supervisor.ts gives up on a process: this many crashes within the window. */
const REGISTRY_CRASH_LIMIT = 5;
const REGISTRY_CRASH_WINDOW_MS = 60_000;

/** A signal this soon after the first is its echo (make forwarding it), not a second Ctrl-C. */
const ECHO_WINDOW_MS = 1000;

/** How make up supervises its processes (src/assembly/supervisor.ts): said on the console. */
function supervisorPolicy(): SupervisorOptions {
  return { clock: systemClock, say: (line) => console.error(`supervisor: ${line}`) };
}

/**
 * Holds the state dir for this process's life, or says who does and exits 1: a second make up
 * on it would otherwise get as far as the registry's port before failing on it.
 */
function holdStateDir(stateDir: string): void {
  try {
    privateDir(stateDir);
    const lock = acquireOwnerLock(join(stateDir, 'up'), `state directory ${stateDir}`);
    process.on('exit', () => lock.release());
  } catch (err) {
    if (err instanceof OwnerLockHeld) {
      console.error(`make up: another make up is running on this state directory: ${err.message}.\nStop that one (Ctrl-C in its terminal); a second system needs its own ASB_STATE_DIR and ports.`);
    } else {
      console.error(`make up failed: the state directory ${stateDir}: ${err instanceof Error ? err.message : String(err)}`);
    }
    process.exit(1);
  }
}

async function main(): Promise<void> {
  const env = process.env;
  const stateDir = resolve(env.ASB_STATE_DIR ?? join(repoRoot, '.asb'));
  holdStateDir(stateDir);
  // Before anything starts: every process below inherits this environment.
  const dropped = dropClientSettings(env);
  if (dropped.length > 0) console.log(`ignoring client settings in the environment (from a sourced .asb/env; make up's servers never read them): ${dropped.join(' ')}`);
  if (process.getuid?.() !== 0) {
    console.warn('warning: not running as root: the workers will start NO sandbox (containers need root: runc, user namespaces, cgroups, a bridge). See README "Requirements".');
  }
  const federated = (env.ASB_FEDERATION ?? 'on') !== 'off';
  console.log(federated ? 'starting: the image registry, the hub, then region-a and region-b (worker, router, Envoy each)…' : 'starting: the image registry, then worker, router, Envoy…');
  let running: Running;
  let registry: LocalRegistry;
  try {
    registry = await startLocalRegistry({
      stateDir: join(stateDir, 'registry'),
      seedDir: defaultSeedDir(),
      log: createLogger({ level: env.ASB_LOG_LEVEL ?? 'warn' }),
      port: port(env, 'ASB_REGISTRY_PORT', 5050),
      ownGroup: true,
      // Restarted like the other processes (supervisor.ts's backoff and crash limit): a registry
      // that stayed down failed every later start of an image named by tag (pull policy Always,
      // as the built-in templates have) until make up was restarted.
      onUnexpectedExit: (code, sig) => restartRegistry(sig ?? `code ${String(code)}`),
    });
  } catch (err) {
    console.error(`make up failed: the image registry: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(1);
  }
  const registryLog = join(stateDir, 'registry', 'registry.log');
  const crashes: number[] = [];
  let restartTimer: NodeJS.Timeout | undefined;
  let registryStopping = false;
  function restartRegistry(how: string): void {
    if (registryStopping) return;
    const now = Date.now();
    crashes.splice(0, crashes.length, ...crashes.filter((t) => now - t < REGISTRY_CRASH_WINDOW_MS), now);
    if (crashes.length >= REGISTRY_CRASH_LIMIT) {
      console.error(`supervisor: the image registry exited (${how}) ${String(crashes.length)} times within a minute; giving up on it: sandboxes whose image is not cached cannot start; see ${registryLog}`);
      return;
    }
    const delay = restartDelay(crashes.length, 500, 10_000);
    console.error(`supervisor: the image registry exited (${how}); restarting it in ${String(delay)} ms (its log is ${registryLog})`);
    restartTimer = setTimeout(() => {
      restartTimer = undefined;
      registry.process.restart().then(
        (address) => console.error(`supervisor: the image registry is back on ${address}`),
        // A start that fails counts as a crash, as the supervisor counts one (the limit still holds).
        (err: unknown) => restartRegistry(`its restart failed: ${err instanceof Error ? err.message : String(err)}`),
      );
    }, delay);
  }
  const imageArgs = ['--registries', registry.registriesFile, '--image-cache', join(stateDir, 'images')];
  try {
    running = federated ? await upFederation(env, stateDir, imageArgs) : await upSingle(env, stateDir, imageArgs);
  } catch (err) {
    console.error(`make up failed: ${err instanceof Error ? err.message : String(err)}`);
    await registry.process.close();
    process.exit(1);
  }
  const system = running;
  const endRegistry = (): void => {
    registryStopping = true;
    clearTimeout(restartTimer);
  };
  running = { ...system, stop: async () => { endRegistry(); await system.stop(); await registry.process.close(); }, kill: async () => { endRegistry(); await system.kill(); registry.process.destroy(); } };
  const kubeconfig = join(stateDir, 'kubeconfig');
  const withKube = running.kubeClusters.length > 0 && running.env.ASB_CA_CERT !== undefined && running.env.ASB_CA_CERT !== '';
  if (withKube) writeKubeconfig(kubeconfig, running.kubeClusters, running.env.ASB_CA_CERT ?? '', running.env.ASB_API_KEY ?? '');
  writeEnv(stateDir, withKube ? { ...running.env, ASB_KUBECONFIG: kubeconfig } : running.env);
  console.log(`${running.banner}
  images       registry ${registry.address} (docker.io's mirror: busybox, debian:12, python:3.11, agent-sandbox/base; push your own), cache ${join(stateDir, 'images')}
  env file     ${join(stateDir, 'env')}   (source it, or just run: npx asb status)${withKube ? `
  kubectl      KUBECONFIG=${kubeconfig} kubectl get sandboxes   (the Kubernetes API, no cluster; contexts: ${running.kubeClusters.map((c) => c.name).join(', ')})` : ''}
  logs         ${join(stateDir, 'logs')}${federated ? ` and ${join(stateDir, 'clusters', '<name>', 'logs')}` : ''}
Try:  npx asb create --template base${federated ? ' --region region-b' : ''}   then   npx asb exec <id> -- echo hello   or   npx asb shell <id>
Ctrl-C stops everything.`);

  // Every process runs in a group of its own (child.ts ownGroup): a Ctrl-C or a SIGTERM to ours
  // reaches only this supervisor, which stops them in order and exits after the last one, so a
  // `make up` right after finds nothing of the old one still running.
  let stopping = false;
  let firstSignalAt = 0;
  const stop = (sig: NodeJS.Signals): void => {
    if (stopping) {
      // make forwards a SIGTERM it got to us, so a SIGTERM to the process group arrives twice
      // within milliseconds: that echo must not turn a stop (which hibernates) into a kill.
      if (Date.now() - firstSignalAt < ECHO_WINDOW_MS) return;
      console.error('second signal: killing everything now');
      running.kill().then(
        () => process.exit(1),
        () => process.exit(1),
      );
      return;
    }
    stopping = true;
    firstSignalAt = Date.now();
    console.log(`\n${sig}: stopping (Envoy, router, then each worker hibernates its sandboxes; Ctrl-C again to force)…`);
    running.stop().then(
      () => process.exit(0),
      (err: unknown) => {
        console.error('stop failed:', err);
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}

/**
 * What an unmodified E2B program needs after `source .asb/env`: the API and envd through the edge
 * (header routing, plain HTTP), our key, and the domain for getHost(). Over HTTPS instead: unset
 * E2B_API_URL and E2B_SANDBOX_URL, set E2B_DOMAIN to the TLS port and trust ASB_CA_CERT (docs/compatibility.md).
 */
function e2bEnv(edgeUrl: string, key: string, domain: string): Record<string, string> {
  return { E2B_API_URL: edgeUrl, E2B_SANDBOX_URL: edgeUrl, E2B_API_KEY: key, E2B_DOMAIN: `${domain}:${new URL(edgeUrl).port}` };
}

async function upSingle(env: NodeJS.ProcessEnv, stateDir: string, workerArgs: readonly string[]): Promise<Running> {
  const domain = env.ASB_DOMAIN ?? 'asb.localhost';
  const edgeTls = await ensureEdgeTls(join(stateDir, 'edge-tls'), domain);
  const egress = await egressArgs(env, 0);
  const system: LocalSystem = await startLocalSystem({
    stateDir,
    log: createLogger({ level: env.ASB_LOG_LEVEL ?? 'warn' }),
    apiPort: port(env, 'ASB_API_PORT', 7080),
    edgePort: port(env, 'ASB_EDGE_PORT', 10000),
    envoyAdminPort: port(env, 'ASB_ENVOY_ADMIN_PORT', 9901),
    routerPort: port(env, 'ASB_ROUTER_PORT', 9002),
    edgeTls: { port: port(env, 'ASB_EDGE_TLS_PORT', 10002), files: edgeTls },
    domain,
    clusterName: env.ASB_CLUSTER_NAME ?? 'local',
    workerArgs: [...workerArgs, ...egress],
    supervise: supervisorPolicy(),
  });
  const edgeTlsUrl = system.edgeTlsUrl ?? '';
  return {
    env: {
      ASB_API_URL: system.apiUrl,
      ASB_API_KEY: system.adminKey,
      ASB_CLUSTER: system.clusterName,
      ASB_EDGE_URL: system.edgeUrl,
      ASB_EDGE_TLS_URL: edgeTlsUrl,
      ASB_CA_CERT: edgeTls.caCertPath,
      ASB_DOMAIN: system.domain,
      ...e2bEnv(system.edgeUrl, system.adminKey, system.domain),
    },
    kubeClusters: edgeTlsUrl === '' ? [] : [{ name: system.clusterName, server: edgeTlsUrl }],
    banner: `Agent Sandbox is up (cluster ${system.clusterName}, id tag ${system.clusterTag})
  worker API   ${system.apiUrl}
  edge         ${system.edgeUrl}   sandboxes at http://<port>-<id>.${system.domain}:${new URL(system.edgeUrl).port}
  edge (TLS)   ${edgeTlsUrl}   HTTP/2; trust ${edgeTls.caCertPath}
  E2B SDKs     source ${join(stateDir, 'env')}: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, E2B_DOMAIN are set
  metrics      ${system.apiUrl}/metrics  (needs the API key)
  ${egressLine(egress)}`,
    kill: () => system.kill(),
    stop: () => system.stop(),
  };
}

/** region-a on the base ports, region-b on offsets from them (see the header). */
async function upFederation(env: NodeJS.ProcessEnv, stateDir: string, workerArgs: readonly string[]): Promise<Running> {
  // Bridges and subnets per checkout (local-network.ts): a second `make up` elsewhere on this
  // host gets its own, and the runtime refuses one another instance holds.
  const regions = [
    { name: 'region-a', tag: 'rgna', step: 0 },
    { name: 'region-b', tag: 'rgnb', step: 1 },
  ].map((r) => ({ ...r, ...regionNetwork(env, stateDir, r.step) }));
  const egress = [await egressArgs(env, 0), await egressArgs(env, 1)];
  const fed: Federation = await startFederation({
    stateDir,
    log: createLogger({ level: env.ASB_LOG_LEVEL ?? 'warn' }),
    domain: env.ASB_DOMAIN ?? 'asb.localhost',
    hubPort: port(env, 'ASB_HUB_PORT', 7070),
    clusters: regions.map((r) => ({
      name: r.name,
      region: r.name,
      tag: r.tag,
      apiPort: port(env, 'ASB_API_PORT', 7080) + r.step,
      edgePort: port(env, 'ASB_EDGE_PORT', 10000) + 100 * r.step,
      ingressPort: port(env, 'ASB_INGRESS_PORT', 10001) + 100 * r.step,
      edgeTlsPort: port(env, 'ASB_EDGE_TLS_PORT', 10002) + 100 * r.step,
      envoyAdminPort: port(env, 'ASB_ENVOY_ADMIN_PORT', 9901) + r.step,
      routerPort: port(env, 'ASB_ROUTER_PORT', 9002) + r.step,
      bridge: r.bridge,
      subnet: r.subnet,
      workerArgs: [...workerArgs, ...(egress[r.step] ?? [])],
    })),
    supervise: supervisorPolicy(),
  });
  const first = fed.clusters[0];
  if (first === undefined) throw new Error('no cluster started');
  const rows = fed.clusters.map(
    (c) => `  ${c.clusterName.padEnd(12)} edge ${c.edgeUrl}   https ${c.edgeTlsUrl ?? ''}   ingress ${c.ingressAddress} (mTLS)   worker API ${c.apiUrl}   id tag ${c.clusterTag}`,
  );
  return {
    env: {
      ASB_API_URL: first.edgeUrl,
      ASB_API_KEY: fed.adminKey,
      ASB_HUB_URL: fed.hubUrl,
      ASB_HUB_KEY: fed.adminKey,
      ASB_CLUSTER: first.clusterName,
      ASB_EDGE_URL: first.edgeUrl,
      ASB_EDGE_TLS_URL: first.edgeTlsUrl ?? '',
      ASB_CA_CERT: fed.edgeCaCertPath ?? '',
      ASB_DOMAIN: fed.domain,
      ...e2bEnv(first.edgeUrl, fed.adminKey, fed.domain),
    },
    kubeClusters: fed.clusters.flatMap((c) => (c.edgeTlsUrl === undefined ? [] : [{ name: c.clusterName, server: c.edgeTlsUrl }])),
    banner: `Agent Sandbox is up: a federation of ${fed.clusters.length} clusters
  hub          ${fed.hubUrl}   (asb cluster ls, asb key …, asb template …)
  console      ${fed.hubUrl}/console/   (log in with ASB_API_KEY from the env file)
${rows.join('\n')}
  ${egress.map(egressLine).join('; ')}
  API          ${first.edgeUrl}/v1/…  through the edge: creates are placed by the hub, any edge reaches any sandbox
  sandboxes    http://<port>-<id>.${fed.domain}:<edge port>  (any cluster's edge); HTTPS: trust ${fed.edgeCaCertPath ?? ''}
  E2B SDKs     source ${join(stateDir, 'env')}: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, E2B_DOMAIN are set`,
    kill: () => fed.kill(),
    stop: () => fed.stop(),
  };
}

/** Region i's bridge and subnet: derived from the state dir, or from ASB_SUBNET (region i takes its /16 + i) and ASB_BRIDGE (+ i). */
function regionNetwork(env: NodeJS.ProcessEnv, stateDir: string, step: number): { bridge: string; subnet: string } {
  const derived = derivedNetwork(stateDir, step);
  const first = env.ASB_SUBNET;
  let subnet = derived.subnet;
  if (first !== undefined && first !== '') {
    const nth = nthSubnet(first, step);
    if (nth === undefined) {
      console.error(`ASB_SUBNET must be a /16 like 10.100.0.0/16 with room for ${step + 1} clusters after it, got "${first}"`);
      process.exit(2);
    }
    subnet = nth;
  }
  const prefix = env.ASB_BRIDGE;
  const bridge = prefix !== undefined && prefix !== '' ? `${prefix}${step}` : derived.bridge;
  return { bridge, subnet };
}

function writeEnv(stateDir: string, env: Partial<Record<EnvFileKey, string>>): void {
  const envPath = join(stateDir, 'env');
  const text = `${Object.entries(env).map(([k, v]) => `${k}=${v}`).join('\n')}\n`;
  // Written atomically so a reader never sees half a file.
  writeFileSync(`${envPath}.tmp`, text, { mode: 0o600 });
  renameSync(`${envPath}.tmp`, envPath);
}

void main();
