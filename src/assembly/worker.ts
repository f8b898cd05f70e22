// The worker's composition root: store → runtime → operator → API, started in that order and
// closed in the reverse order under one deadline. --role splits it across processes on the kube
// store: operator (controllers under a leader Lease, /healthz and /metrics only) and api (the
// APIs and a claim front of its own, no controllers); --role=all is the whole of it.
import { listen, packageVersion } from '../http/http-server.ts';
import { readFileSync } from 'node:fs';
import { TemplateBuilds } from '../builds/service.ts';
import { TeamFileStore } from '../builds/files.ts';
import { createKubeBuildEngine, createLocalBuildEngine, type SandboxBuildEngine } from '../builds/engine.ts';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { readFile } from 'node:fs/promises';
import { Registry } from 'prom-client';
import { builtinObjects } from '../api/builtin.ts';
import { resourceTypeFor } from '../api/validate.ts';
import { SandboxWarmPoolType, type SandboxWarmPool } from '../api/types.ts';
import { ensureAdminKey } from '../auth/admin-key.ts';
import { KeyRing } from '../auth/keyring.ts';
import { AsbError, isAsbError } from '../errors.ts';
import { createMetrics, type Metrics } from '../metrics/metrics.ts';
import { registerDiskMetrics } from '../metrics/disk-metrics.ts';
import { startClaimFront } from '../operator/claim-front.ts';
import { startOperator } from '../operator/operator.ts';
import { createLocalRuntime } from '../runtime/local/local-runtime.ts';
import { ImageStore } from '../images/image-store.ts';
import { startImageGc, type ImageGcLoop } from '../images/gc-loop.ts';
import { startLayerCacheGc } from '../builds/layer-cache-gc.ts';
import { EMPTY_REGISTRIES, parseRegistriesConfig, type RegistriesConfig } from '../images/registries.ts';
import type { PodRuntime } from '../runtime/runtime.ts';
import { registerEgressMetrics } from '../network/egress-metrics.ts';
import { EXITING_OWNER_WAIT_MS, openSqliteStore } from '../store/sqlite.ts';
import type { ObjectStore } from '../store/store.ts';
import { createAccessTokens, loadClusterSecret } from '../worker/access-token.ts';
import type { WorkerOperator } from '../worker/deps.ts';
import { createPipeline } from '../http/pipeline.ts';
import { createRouter, type Route } from '../http/router.ts';
import { e2bEventRoutes, eventRoutes, type EventsApi } from '../worker/routes-events.ts';
import { DEFAULT_JSON_LIMIT_BYTES } from '../http/body.ts';
import { createWorkerServer } from '../worker/server.ts';
import { watchHubLink } from '../worker/sync/hub-link.ts';
import { startSyncAgent, type SyncAgent } from '../worker/sync/sync-agent.ts';
import { systemClock, type Clock } from '../base/clock.ts';
import type { WorkerConfig } from './worker-config.ts';
import type { Logger } from '../base/log.ts';
import { CredentialStore } from '../egress/credential-store.ts';
import { EventLog } from '../events/event-log.ts';
import { startLifecycleEvents } from '../events/lifecycle-events.ts';
import { ensureEgressCa, type HostCertificate } from '../egress/egress-ca.ts';
import type { EgressPolicySource } from '../egress/egress-decision.ts';
import { startEgressServices } from '../egress/egress-services.ts';
import { parseSubnet } from '../runtime/local/network.ts';
import { privateDir } from '../base/private-files.ts';
import type { KubeConnection, LedControllers } from './worker-kube.ts';

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
  /** With --egress-proxy-port: what the cluster Envoy's `egress` listener needs (EdgeConfigOptions.egress). */
  readonly egress: { listenAddress: string; listenPort: number; authzAddress: string; intercept: HostCertificate[]; caCertPath: string; ldsPath?: string } | undefined;
  /** hibernate: stop every running sandbox (kept on disk; restarted on the next start). */
  close(opts?: { hibernate?: boolean }): Promise<void>;
}

export async function startWorker(config: WorkerConfig, deps: WorkerDeps): Promise<RunningWorker> {
  const clock = deps.clock ?? systemClock;
  const registry = deps.registry ?? new Registry();
  const metrics = createMetrics(registry);
  const log = deps.log;
  privateDir(config.dataDir);
  // Read before anything opens, so a missing credential file fails the start cleanly.
  const hubCredential = config.hubCredentialFile === undefined ? undefined : readCredential(config.hubCredentialFile);

  const kube = config.store === 'kube' ? await (await import('./worker-kube.ts')).connectKube(config, { clock, metrics, log: log.child({ component: 'store' }) }) : undefined;
  const store: ObjectStore = kube?.store ?? (await openSqliteStore({ path: join(config.dataDir, 'store.db'), ownerWaitMs: EXITING_OWNER_WAIT_MS, clock, metrics, log: log.child({ component: 'store' }) }));
  // With the egress proxy, every pod trusts the cluster's egress CA (credential-injection hosts).
  const egressCa = config.egressProxyPort === undefined ? undefined : await ensureEgressCa(join(config.dataDir, 'egress', 'ca'));
  const { runtime, imageGc, buildEngine, closeAlso } = deps.runtime === undefined ? await createRuntime(config, kube, clock, log, metrics, egressCa?.caCertPath) : { runtime: deps.runtime, imageGc: undefined, buildEngine: undefined, closeAlso: undefined };
  const egressCounts = runtime.egressCounts?.bind(runtime);
  if (egressCounts !== undefined) registerEgressMetrics(registry, egressCounts, (err: unknown) => log.warn({ err }, 'cannot read the egress counters'));
  registerDiskMetrics(registry, config.dataDir, (err: unknown) => log.warn({ err }, 'cannot read the data disk\'s free space'));
  // The built-ins are the operator's to make; an API-only process finds them made.
  if (config.role !== 'api') await ensureBuiltins(store, config);
  const adminKey = config.adminKeyFile === undefined ? undefined : await ensureAdminKey(store, config.adminKeyFile, 'local admin key created by make up');

  // The controllers. SQLite: one process owns the store, so they simply run. Kube: only under
  // the operator Lease, so two processes (a rollout, a second replica) never both reconcile.
  const operator = config.store === 'sqlite' ? await startOperator({ store, runtime, log: log.child({ component: 'operator' }), metrics, clock, clusterTag: config.clusterTag }) : undefined;
  // Lifecycle events run with the controllers: the recorder fills this process's event log
  // (events.db under the data directory) and writes Kubernetes Events; on the kube store only
  // while this process holds the Lease, so one process per cluster counts each Event. An API-only
  // process (--role=api) keeps no log: it passes its events API on to the operator named by
  // --events-url (whose log is on its volume; clusters/base), or answers 404 without one.
  const eventLog = config.role === 'api' ? undefined : new EventLog({ dir: join(config.dataDir, 'events'), now: () => clock.now(), retentionMs: config.eventRetentionDays * 86_400_000 });
  const lifecycle = operator === undefined || eventLog === undefined ? undefined : await startLifecycleEvents({ store, log, clock, events: eventLog, instance: config.clusterTag, metrics, webhooks: { allowPrivate: config.webhookAllowPrivate } });
  const led =
    kube !== undefined && config.role !== 'api'
      ? await (await import('./worker-kube.ts')).startLedControllers({ config, kube, runtime, hubCredential, log, metrics, registry, clock, ...(eventLog === undefined ? {} : { eventLog }) })
      : undefined;
  // Claims on the kube store come from a claim front of this process's own, which claims whether
  // or not this process leads.
  const front = operator === undefined && config.role !== 'operator' ? await startClaimFront({ store, log, metrics, clock, clusterTag: config.clusterTag }) : undefined;
  const keyRing = await KeyRing.open({ store, log: log.child({ component: 'keyring' }), clock });
  // Keys, templates and peers from the hub land in this store; the key ring and the operator
  // read them from here, so they keep working while the hub is away. On the kube store the led
  // controllers run the agent (only the Lease holder may write what the hub sends).
  const sync: SyncAgent | undefined =
    operator === undefined || config.hubUrl === undefined || hubCredential === undefined
      ? undefined
      : startSyncAgent({ hubUrl: config.hubUrl, credential: hubCredential, cluster: config.clusterName, clusterTag: config.clusterTag, store, log, clock });
  // On the kube store the agent runs in whichever process holds the Lease (maybe another Pod):
  // every API process reads the link it records in the SyncState.
  const hubLink = sync === undefined && front !== undefined && config.hubUrl !== undefined ? await watchHubLink(store, clock, log) : undefined;
  const syncStatus = sync !== undefined ? () => sync.status() : hubLink !== undefined ? () => hubLink.status() : undefined;

  const apiOperator: WorkerOperator | undefined =
    operator ??
    (front === undefined
      ? undefined
      : {
          claimer: front.claimer,
          // Recorded on the sandbox for whichever process leads, and straight into the
          // controllers' own tracker while they run here.
          activity: {
            touch(id) {
              front.activity.touch(id);
              led?.current()?.activity.touch(id);
            },
          },
        });
  // Egress secrets and credential rules: a 0600 file in the data directory, which no sandbox mounts.
  const egressCredentials = new CredentialStore(join(config.dataDir, 'egress'), clock);
  // The egress proxy's worker half (--egress-proxy-port): the local runtime answers pod → policy.
  const egressPort = config.egressProxyPort;
  const egressServices =
    // A runtime that starts no pod (not root) has no bridge to listen on: no proxy, and the API
    // then refuses domain entries as with the proxy off.
    egressPort === undefined || !isPolicySource(runtime) || (runtime as { unavailable?: string }).unavailable !== undefined
      ? undefined
      : // The decision service takes the proxy's port number on loopback (the listener has it on
        // the gateway): fixed, so Envoy finds a restarted worker where it left it.
        await startEgressServices({ gateway: parseSubnet(config.subnet).gateway, authzPort: egressPort, source: runtime, floor: config.egressFloor, lds: { path: join(config.dataDir, 'egress', 'lds', 'egress.json'), listenPort: egressPort }, credentials: egressCredentials, caDir: join(config.dataDir, 'egress', 'ca'), registry, log, clock });
  const egress = egressServices === undefined || egressPort === undefined ? undefined : { listenAddress: parseSubnet(config.subnet).gateway, listenPort: egressPort, authzAddress: egressServices.authzAddress, intercept: egressServices.intercept, caCertPath: egressServices.caCertPath, ...(egressServices.ldsPath === undefined ? {} : { ldsPath: egressServices.ldsPath }) };
  // Template builds: records and uploaded files under the data directory (0700), so they survive
  // a restart; a build the restart interrupted ends as error (records.ts).
  let tellHubTemplates: () => void = () => undefined;
  const builds =
    apiOperator === undefined
      ? undefined
      : new TemplateBuilds({
          recordsDir: join(config.dataDir, 'builds', 'templates'),
          files: new TeamFileStore({ dir: join(config.dataDir, 'builds', 'files'), now: () => clock.now() }),
          store,
          // The runtime's engine: none without a registry to push to (builds then answer 503).
          engine: buildEngine,
          namespace: config.namespace,
          clusterTag: config.clusterTag,
          egress: config.buildEgress,
          clock,
          log: log.child({ component: 'builds' }),
          onTemplatesChanged: () => tellHubTemplates(),
        });
  // The layer cache keeps the steps of every template in use: the build service names them.
  if (builds !== undefined) buildEngine?.cache.keep(() => builds.liveCacheKeys());
  const api =
    apiOperator === undefined
      ? undefined
      : await createWorkerServer({
          store,
          runtime,
          operator: apiOperator,
          auth: keyRing,
          log: log.child({ component: 'api' }),
          metrics,
          registry,
          clock,
          cluster: { name: config.clusterName, tag: config.clusterTag },
          version: packageVersion(),
          defaultNamespace: config.namespace,
          dataPlane: { domain: config.domain, edgeUrl: config.edgeUrl, ...(config.edgeTlsUrl === undefined ? {} : { edgeTlsUrl: config.edgeTlsUrl }), tokens: createAccessTokens(loadClusterSecret(config.dataDir)) },
          terminal: { idleMs: config.terminalIdleMs },
          limits: { snapshotsPerTeam: config.snapshotsPerTeam, snapshotBytesPerTeam: config.snapshotGibPerTeam * 2 ** 30 },
          egressCredentials,
          egressProxy: egress !== undefined,
          ...(syncStatus === undefined ? {} : { sync: syncStatus }),
          ...(sync === undefined ? {} : { reportToHub: (timeoutMs: number) => sync.reportNow(timeoutMs) }),
          ...(builds === undefined ? {} : { builds }),
          ...(eventLog !== undefined ? { events: { log: eventLog } } : config.eventsUrl !== undefined ? { events: { forwardTo: config.eventsUrl } } : {}),
          webhookAllowPrivate: config.webhookAllowPrivate,
        });
  if (sync !== undefined) {
    tellHubTemplates = () => {
      sync.reportNow(2000).catch((err: unknown) => log.warn({ err }, 'cannot tell the hub about a built template'));
    };
  }
  const handler = api?.handler ?? operatorEndpoints({ auth: keyRing, registry, metrics, log, led, ...(eventLog === undefined ? {} : { events: { source: { log: eventLog }, jsonBytes: DEFAULT_JSON_LIMIT_BYTES, webhookAllowPrivate: config.webhookAllowPrivate } }) });
  const server = createServer(handler);
  if (api !== undefined) server.on('upgrade', api.upgrade);
  // Claims come in bursts of many short requests: keep connections alive past the default 5 s.
  server.keepAliveTimeout = 65_000;
  await listen(server, config.apiPort, config.apiHost);
  const { port } = server.address() as AddressInfo;
  const host = config.apiHost.includes(':') ? `[${config.apiHost}]` : config.apiHost;
  const apiUrl = `http://${host}:${port}`;
  log.info({ apiUrl, role: config.role, store: config.store, runtime: config.runtime }, config.role === 'operator' ? 'operator serving /healthz and /metrics' : 'worker API listening');

  let closing: Promise<void> | undefined;
  return {
    apiUrl,
    store,
    runtime,
    adminKey,
    egress,
    close(opts = {}) {
      closing ??= (async () => {
        // The hub link first: nothing synced after this point could be acknowledged anyway.
        await sync?.close();
        // Route feed WebSockets first: an upgraded socket would keep server.close() waiting.
        api?.closeStreams();
        server.closeIdleConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
        server.closeAllConnections();
        await api?.close();
        // Running builds end as "interrupted by a worker restart" before the store closes.
        await builds?.close();
        keyRing.close();
        front?.close();
        hubLink?.close();
        // Controllers before the Lease is released, so the next leader never overlaps them.
        await led?.close();
        await lifecycle?.close();
        await operator?.close();
        eventLog?.close();
        await egressServices?.close();
        // Pods of the kube runtime belong to Kubernetes and outlive this process (a rollout
        // must not hibernate every sandbox); only local pods are this process's to stop.
        if (opts.hibernate === true && config.runtime === 'local') {
          await Promise.all(runtime.list().map((id) => runtime.stop(id)));
        }
        await imageGc?.close();
        // The build Pods' runtime (--build-pod-namespace), after the builds it served.
        await closeAlso?.();
        await runtime.close();
        await store.close();
      })();
      return closing;
    },
  };
}

function isPolicySource(runtime: PodRuntime): runtime is PodRuntime & EgressPolicySource {
  return typeof (runtime as Partial<EgressPolicySource>).policyForPodIp === 'function';
}

async function createRuntime(config: WorkerConfig, kube: KubeConnection | undefined, clock: Clock, log: Logger, metrics: Metrics, extraCaPath: string | undefined): Promise<{ runtime: PodRuntime; imageGc?: ImageGcLoop; buildEngine?: SandboxBuildEngine; closeAlso?: () => Promise<void> }> {
  const registries = config.registriesFile === undefined ? EMPTY_REGISTRIES : parseRegistriesConfig(JSON.parse(await readFile(config.registriesFile, 'utf8')), config.registriesFile);
  if (config.runtime === 'kube') {
    // config.ts refuses --runtime=kube without --store=kube.
    if (kube === undefined) throw new AsbError('Internal', '--runtime=kube without a kube store');
    // Images there are the kubelet's, and so is their GC.
    const kubeParts = await import('./worker-kube.ts');
    const runtime = await kubeParts.createKubePodRuntime(config, kube, { clock, log: log.child({ component: 'runtime' }) });
    // Builds run in Pods of the cluster and push to the registry its nodes pull from (named: no
    // default here), in --build-pod-namespace (a runtime of its own when it is not the sandboxes').
    const buildRuntime = config.buildRegistry === undefined || config.buildPodNamespace === config.podNamespace ? runtime : await kubeParts.createKubePodRuntime(config, kube, { clock, log: log.child({ component: 'build-runtime' }), namespace: config.buildPodNamespace });
    const buildEngine = config.buildRegistry === undefined ? undefined : createKubeBuildEngine({ runtime: buildRuntime, registries, registry: config.buildRegistry, ...(config.buildRegistryPull === undefined ? {} : { pullRegistry: config.buildRegistryPull }), stateDir: join(config.dataDir, 'builds', 'engine') });
    // No image cache here to collect the layer cache with: its own loop, on the image cache's policy.
    const layerGc = buildEngine === undefined ? undefined : startLayerCacheGc({ cache: buildEngine.cache, log, clock, intervalMs: config.imageGcIntervalMs });
    if (buildRuntime === runtime && layerGc === undefined) return { runtime };
    const closeAlso = async (): Promise<void> => {
      await layerGc?.close();
      if (buildRuntime !== runtime) await buildRuntime.close();
    };
    return { runtime, ...(buildEngine === undefined ? {} : { buildEngine }), closeAlso };
  }
  const images = new ImageStore({ root: config.imageCache, registries, logger: log, clock });
  const runtime = await createLocalRuntime({
    root: join(config.dataDir, 'runtime'),
    log: log.child({ component: 'runtime' }),
    clock,
    subnet: config.subnet,
    bridge: config.bridge,
    images,
    ...(config.egressProxyPort === undefined ? {} : { egressProxy: { port: config.egressProxyPort }, podDns: true }),
    egressFloor: config.egressFloor,
    ...(extraCaPath === undefined ? {} : { extraCaPath }),
    ...(config.criu === undefined ? {} : { criu: config.criu }),
  });
  // Template builds on this runtime, pushed to the registry its pods pull from (none without one).
  const buildRegistry = config.buildRegistry ?? loopbackMirror(registries);
  const buildEngine = buildRegistry === undefined ? undefined : createLocalBuildEngine({ runtime, images, registry: buildRegistry, stateDir: join(config.dataDir, 'builds', 'engine') });
  // After the runtime: its recovery pins the images of pods made before pins existed. The build
  // layer cache is collected in the same passes.
  const imageGc = startImageGc({ images, log, clock, intervalMs: config.imageGcIntervalMs, graceMs: config.imageGcGraceMs, metrics, ...(buildEngine === undefined ? {} : { alsoCollect: [buildEngine.cache] }) });
  return { runtime, imageGc, ...(buildEngine === undefined ? {} : { buildEngine }) };
}

/** `make up`'s registry: docker.io's first mirror endpoint when it is on loopback (where builds push). */
function loopbackMirror(registries: RegistriesConfig): string | undefined {
  const endpoint = registries.mirrors['docker.io']?.endpoints[0];
  return endpoint !== undefined && /^(?:127(?:\.\d{1,3}){3}|localhost|\[::1\]):\d+$/.test(endpoint) ? endpoint : undefined;
}

interface OperatorEndpointsOptions {
  auth: KeyRing;
  registry: Registry;
  metrics: Metrics;
  log: Logger;
  led: LedControllers | undefined;
  /** The cluster's lifecycle events, which the API processes pass their events API on to. */
  events?: EventsApi;
}

/**
 * --role=operator serves no sandbox API, only what Kubernetes and Prometheus ask of it: /healthz
 * (no key; also says whether this process leads, and as whom the Lease names it) and /metrics (a
 * key, as on the worker API); and, since the cluster's event log is this process's, the events
 * API and webhooks in both shapes (a key; the API processes pass theirs on here, --events-url).
 */
function operatorEndpoints(opts: OperatorEndpointsOptions): (req: IncomingMessage, res: ServerResponse) => void {
  const routes: Route[] = [
    {
      method: 'GET',
      pattern: '/healthz',
      auth: false,
      handler: () => Promise.resolve({ status: 200, json: { ok: true, role: 'operator', leader: opts.led?.elector.isLeader() ?? false, identity: opts.led?.elector.identity, holder: opts.led?.elector.holder() } }),
    },
    {
      method: 'GET',
      pattern: '/metrics',
      handler: async () => ({ status: 200, bytes: Buffer.from(await opts.registry.metrics(), 'utf8'), contentType: opts.registry.contentType }),
    },
    ...(opts.events === undefined ? [] : [...eventRoutes(opts.events), ...e2bEventRoutes(opts.events, opts.auth)]),
  ];
  return createPipeline({ router: createRouter(routes), auth: opts.auth, log: opts.log.child({ component: 'operator-endpoints' }), requests: opts.metrics.httpRequestsTotal, server: 'the operator', realm: 'asb' });
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
    obj.metadata.namespace = config.namespace;
    try {
      await store.create(rt, obj);
    } catch (err) {
      if (!isAsbError(err, 'AlreadyExists')) throw err;
    }
  }
}
