// Worker configuration: parsed once at the edge from flags and environment, every problem
// listed at once, then frozen and passed down. Nothing else reads the environment.
import { resolve } from 'node:path';
import { isClusterTag } from '../api/ids.ts';
import { AsbError } from '../errors.ts';
import { DEFAULT_EGRESS_FLOOR, parseEgressFloor, type EgressFloor } from '../network/egress-floor.ts';
import { DEFAULT_EGRESS_POLICY, parseCidr, parseEgressPolicy, type EgressPolicy } from '../network/egress-policy.ts';
import { ConfigError, parseFlags } from '../base/flags.ts';
import { derivedNetwork } from '../runtime/local/derived-network.ts';

export interface WorkerConfig {
  /** ASB_DATA_DIR / --data-dir: store, pod filesystems and volumes live here. Default .asb/data */
  readonly dataDir: string;
  /** ASB_API_HOST / --host: address the REST API binds. Default 127.0.0.1 */
  readonly apiHost: string;
  /** ASB_API_PORT / --port: REST API port; 0 picks a free one. Default 7080 */
  readonly apiPort: number;
  /** ASB_CLUSTER_NAME / --cluster: this worker cluster's name. Default local */
  readonly clusterName: string;
  /** ASB_CLUSTER_TAG / --cluster-tag: 4 chars [a-z0-9] prefixed to every sandbox id. Default loc1 */
  readonly clusterTag: string;
  /**
   * ASB_SUBNET / --subnet: pod addresses (a /16 to /24 network); the bridge takes its first address. Default: derived from
   * --data-dir, one of 10.64-10.191.0.0/16 (local-network.ts), so two checkouts differ.
   */
  readonly subnet: string;
  /** ASB_BRIDGE / --bridge: host bridge for pod veths. Default: derived from --data-dir, asb<8 hex>0 */
  readonly bridge: string;
  /** ASB_BASE_POOL_REPLICAS / --base-pool: warm members of the built-in base pool. Default 3 */
  readonly basePoolReplicas: number;
  /** ASB_ADMIN_KEY_FILE / --admin-key-file: keep (or create) an admin key here, mode 0600. */
  readonly adminKeyFile: string | undefined;
  /** ASB_LOG_LEVEL / --log-level. Default info */
  readonly logLevel: string;
  /** ASB_DOMAIN / --domain: sandboxes answer at <port>-<id>.<domain> through the edge. Default asb.localhost (resolves to loopback) */
  readonly domain: string;
  /** ASB_EDGE_URL / --edge-url: the edge (Envoy) base URL; its scheme and port go into sandbox URLs. Default http://127.0.0.1:10000 */
  readonly edgeUrl: string;
  /** ASB_EDGE_TLS_URL / --edge-tls-url: the edge's HTTPS listener, if any (E2B calls over it are told its port). */
  readonly edgeTlsUrl: string | undefined;
  /** ASB_HUB_URL / --hub-url: the hub's base URL (http(s)://host:port); when set the worker syncs keys, templates and clusters from it. */
  readonly hubUrl: string | undefined;
  /** ASB_HUB_CREDENTIAL_FILE / --hub-credential-file: file holding this cluster's sync credential (asbc_...); required with --hub-url. */
  readonly hubCredentialFile: string | undefined;
  /** ASB_TERMINAL_IDLE_MS / --terminal-idle-ms: close a terminal session after this long with no input or output. Default 900000 (15 min) */
  readonly terminalIdleMs: number;
  /** ASB_STORE / --store: where objects live: sqlite (a file under --data-dir, one process) or kube (a kube-apiserver, our CRDs installed). Default sqlite */
  readonly store: 'sqlite' | 'kube';
  /**
   * ASB_KUBECONFIG / --kubeconfig, else KUBECONFIG: the kubeconfig file for --store=kube. Unset:
   * the Pod's own service account (in-cluster), which start-up refuses outside a Pod.
   */
  readonly kubeconfig: string | undefined;
  /** ASB_NAMESPACE / --namespace: where API requests that name no namespace land and the built-in base template and pool live. Default default */
  readonly namespace: string;
  /**
   * ASB_POD_NAMESPACE / --pod-namespace: where the kube runtime makes sandbox Pods and PVCs,
   * whatever namespace their Sandbox is in. Label it for Pod Security Admission `restricted`
   * (clusters/base/sandbox-namespace.yaml). Default: --namespace
   */
  readonly podNamespace: string;
  /**
   * ASB_BUILD_POD_NAMESPACE / --build-pod-namespace: where the kube runtime makes template build
   * Pods. They run as root in a user namespace with Docker's default capabilities (what `apt-get
   * install` and `useradd` need), which Pod Security `restricted` refuses: label this namespace
   * `baseline` and keep the sandboxes' `restricted` (clusters/base/build-namespace.yaml).
   * Default: --pod-namespace
   */
  readonly buildPodNamespace: string;
  /**
   * ASB_EGRESS_PROXY_PORT / --egress-proxy-port: route sandboxes' outbound TCP through the egress
   * proxy: the local runtime DNATs it to <bridge gateway>:PORT (where the cluster Envoy's `egress`
   * listener must listen), and the worker runs the egress decision service and the sandboxes' DNS
   * resolver on <gateway>:53 (src/egress/). Unset or `off`: no proxy, only the policy's CIDRs
   * apply and the API refuses domain entries. `make up` sets it (15001, region-b 15002; up.ts).
   */
  readonly egressProxyPort: number | undefined;
  /**
   * ASB_EGRESS_FLOOR / --egress-floor: comma-separated CIDRs no sandbox reaches whatever its
   * template or its own policy allows (src/network/egress-floor.ts), enforced by the kernel rules,
   * the egress proxy and the DNS resolver. Replaces the default, the cloud metadata and credential
   * endpoints (169.254.169.254, 169.254.170.2, 169.254.170.23, 100.100.100.200, fd00:ec2::254,
   * fd00:ec2::23); `none` for an empty floor.
   */
  readonly egressFloor: EgressFloor;
  /**
   * ASB_BUILD_EGRESS / --build-egress: what a template build's RUN steps may reach (the build
   * sandbox's egress policy, src/network/egress-policy.ts). `internet` (the default): a sandbox's
   * default, the internet but no private range, other pod or the host; `none`: nothing; else a
   * comma-separated allow-list of CIDRs, IPs and domains (`pypi.org,*.debian.org,203.0.113.0/24`)
   * and nothing else. Domains need the egress proxy (--egress-proxy-port), as sandboxes' do. The
   * egress floor applies whatever this allows.
   */
  readonly buildEgress: EgressPolicy;
  /** ASB_RUNTIME / --runtime: what runs sandboxes: local (process trees on this machine) or kube (Pods, through the API server; needs --store=kube). Default local */
  readonly runtime: 'local' | 'kube';
  /**
   * ASB_ROLE / --role: which part of the worker this process is. all: everything (the default);
   * operator: the controllers and the pod runtime, behind a leader-election Lease, serving only
   * /healthz and /metrics; api: the REST, E2B, envd and terminal APIs, no controllers. operator
   * and api need --store=kube and --runtime=kube: only there can two processes share the state
   * and the pods.
   */
  readonly role: 'all' | 'operator' | 'api';
  /**
   * ASB_IMAGE_CACHE / --image-cache: where the local runtime pulls and unpacks images
   * (src/images/image-store.ts); several workers may share one. Default <data dir>/images
   */
  readonly imageCache: string;
  /**
   * ASB_REGISTRIES / --registries: a JSON file of registry mirrors, insecure (plain-HTTP)
   * registries and pull credentials (src/images/registries.ts). `make up` writes one that sends
   * docker.io to its loopback registry. Unset: every image is pulled from the registry its name says.
   */
  readonly registriesFile: string | undefined;
  /**
   * ASB_BUILD_REGISTRY / --build-registry: host:port of the registry template builds push to
   * (plain HTTP; this worker's pods pull the built images from it). Default: the first endpoint of
   * docker.io's mirror in --registries when it is a loopback registry (`make up`'s). Unset and no
   * such mirror: this worker builds no templates (the build API answers 503). With
   * --runtime=kube there is no default: the registry the cluster's nodes pull from must be named.
   */
  readonly buildRegistry: string | undefined;
  /**
   * ASB_BUILD_REGISTRY_PULL / --build-registry-pull: the same registry as the cluster's nodes
   * name it in a Pod's image (host[:port]), when they reach it by another name than this worker
   * pushes to (a registry Service the worker reaches, the nodes by a node port or a mirror
   * name). Default: --build-registry. Built templates' images are `<this>/templates/<id>@sha256:…`.
   */
  readonly buildRegistryPull: string | undefined;
  /**
   * ASB_IMAGE_GC_INTERVAL_MS / --image-gc-interval-ms: how often the local runtime collects
   * images no sandbox uses (src/images/gc-loop.ts); 0: only under disk pressure. Default 600000 (10 min)
   */
  readonly imageGcIntervalMs: number;
  /**
   * ASB_IMAGE_GC_GRACE_MS / --image-gc-grace-ms: an image no sandbox uses stays this long after
   * it was pulled or last used (at 85% disk usage: 2 min). Default 3600000 (1 h)
   */
  readonly imageGcGraceMs: number;
  /** ASB_SNAPSHOTS_PER_TEAM / --snapshots-per-team: how many snapshots one team may keep on this worker. Default 100 */
  readonly snapshotsPerTeam: number;
  /** ASB_EVENT_RETENTION_DAYS / --event-retention-days: how long lifecycle events (events API, webhook deliveries) are kept. Default 7 (E2B's) */
  readonly eventRetentionDays: number;
  /**
   * ASB_WEBHOOK_ALLOW_PRIVATE / --webhook-allow-private (a switch; `=true|false`, the variable
   * true/false/1/0): webhooks may be registered for, and delivered to, private, loopback and
   * link-local addresses and localhost. Default false: a team's webhook reaches only public
   * addresses, so it cannot make the worker call its own admin API, the cloud metadata endpoint
   * or the operator's network (src/events/webhook-target.ts). For a receiver on the operator's
   * own network, or tests.
   */
  readonly webhookAllowPrivate: boolean;
  /**
   * ASB_EVENTS_URL / --events-url (--role=api only): the operator's URL (http(s), no path) whose
   * event log answers this process's events API and webhooks; the API process passes those
   * requests on with the caller's key. Unset: an API process keeps no events and answers 404.
   * clusters/base sets it to the operator's Service.
   */
  readonly eventsUrl: string | undefined;
  /**
   * ASB_SNAPSHOT_GIB_PER_TEAM / --snapshot-gib-per-team: the bytes one team's snapshots may take on
   * this worker's disk, in GiB (files and memory images). A snapshot is refused once the team's
   * snapshots take this much. Default 100
   */
  readonly snapshotGibPerTeam: number;
  /**
   * ASB_CRIU / --criu: the CRIU binary runc runs to keep runc pods' memory (docs/criu.md). Default:
   * the one `make criu` builds, .tools/criu/bin/criu (a worktree sharing another checkout's .tools
   * points it at its own build: scripts/criu-build.sh with ASB_CRIU_DIR).
   */
  readonly criu: string | undefined;
}

const DEFAULTS = {
  dataDir: '.asb/data',
  apiHost: '127.0.0.1',
  apiPort: '7080',
  clusterName: 'local',
  clusterTag: 'loc1',
  basePoolReplicas: '3',
  logLevel: 'info',
  domain: 'asb.localhost',
  edgeUrl: 'http://127.0.0.1:10000',
  terminalIdleMs: '900000',
  imageGcIntervalMs: '600000',
  imageGcGraceMs: '3600000',
  snapshotsPerTeam: '100',
  eventRetentionDays: '7',
  webhookAllowPrivate: 'false',
  snapshotGibPerTeam: '100',
  store: 'sqlite',
  namespace: 'default',
  runtime: 'local',
  role: 'all',
} as const;

type OptionalKey = 'adminKeyFile' | 'hubUrl' | 'eventsUrl' | 'hubCredentialFile' | 'edgeTlsUrl' | 'kubeconfig' | 'podNamespace' | 'buildPodNamespace' | 'subnet' | 'bridge' | 'imageCache' | 'registriesFile' | 'buildRegistry' | 'buildRegistryPull' | 'buildEgress' | 'egressProxyPort' | 'egressFloor' | 'criu';
type Key = keyof typeof DEFAULTS | OptionalKey;

const SOURCES: Record<Key, { env: string; flag: string }> = {
  dataDir: { env: 'ASB_DATA_DIR', flag: 'data-dir' },
  apiHost: { env: 'ASB_API_HOST', flag: 'host' },
  apiPort: { env: 'ASB_API_PORT', flag: 'port' },
  clusterName: { env: 'ASB_CLUSTER_NAME', flag: 'cluster' },
  clusterTag: { env: 'ASB_CLUSTER_TAG', flag: 'cluster-tag' },
  subnet: { env: 'ASB_SUBNET', flag: 'subnet' },
  bridge: { env: 'ASB_BRIDGE', flag: 'bridge' },
  basePoolReplicas: { env: 'ASB_BASE_POOL_REPLICAS', flag: 'base-pool' },
  adminKeyFile: { env: 'ASB_ADMIN_KEY_FILE', flag: 'admin-key-file' },
  logLevel: { env: 'ASB_LOG_LEVEL', flag: 'log-level' },
  domain: { env: 'ASB_DOMAIN', flag: 'domain' },
  edgeUrl: { env: 'ASB_EDGE_URL', flag: 'edge-url' },
  edgeTlsUrl: { env: 'ASB_EDGE_TLS_URL', flag: 'edge-tls-url' },
  hubUrl: { env: 'ASB_HUB_URL', flag: 'hub-url' },
  hubCredentialFile: { env: 'ASB_HUB_CREDENTIAL_FILE', flag: 'hub-credential-file' },
  terminalIdleMs: { env: 'ASB_TERMINAL_IDLE_MS', flag: 'terminal-idle-ms' },
  store: { env: 'ASB_STORE', flag: 'store' },
  kubeconfig: { env: 'ASB_KUBECONFIG', flag: 'kubeconfig' },
  namespace: { env: 'ASB_NAMESPACE', flag: 'namespace' },
  podNamespace: { env: 'ASB_POD_NAMESPACE', flag: 'pod-namespace' },
  buildPodNamespace: { env: 'ASB_BUILD_POD_NAMESPACE', flag: 'build-pod-namespace' },
  runtime: { env: 'ASB_RUNTIME', flag: 'runtime' },
  role: { env: 'ASB_ROLE', flag: 'role' },
  imageCache: { env: 'ASB_IMAGE_CACHE', flag: 'image-cache' },
  registriesFile: { env: 'ASB_REGISTRIES', flag: 'registries' },
  buildRegistry: { env: 'ASB_BUILD_REGISTRY', flag: 'build-registry' },
  buildRegistryPull: { env: 'ASB_BUILD_REGISTRY_PULL', flag: 'build-registry-pull' },
  buildEgress: { env: 'ASB_BUILD_EGRESS', flag: 'build-egress' },
  egressProxyPort: { env: 'ASB_EGRESS_PROXY_PORT', flag: 'egress-proxy-port' },
  egressFloor: { env: 'ASB_EGRESS_FLOOR', flag: 'egress-floor' },
  imageGcIntervalMs: { env: 'ASB_IMAGE_GC_INTERVAL_MS', flag: 'image-gc-interval-ms' },
  imageGcGraceMs: { env: 'ASB_IMAGE_GC_GRACE_MS', flag: 'image-gc-grace-ms' },
  snapshotsPerTeam: { env: 'ASB_SNAPSHOTS_PER_TEAM', flag: 'snapshots-per-team' },
  eventRetentionDays: { env: 'ASB_EVENT_RETENTION_DAYS', flag: 'event-retention-days' },
  webhookAllowPrivate: { env: 'ASB_WEBHOOK_ALLOW_PRIVATE', flag: 'webhook-allow-private' },
  eventsUrl: { env: 'ASB_EVENTS_URL', flag: 'events-url' },
  snapshotGibPerTeam: { env: 'ASB_SNAPSHOT_GIB_PER_TEAM', flag: 'snapshot-gib-per-team' },
  criu: { env: 'ASB_CRIU', flag: 'criu' },
};

/** Flags (`--name value` or `--name=value`) win over environment variables, which win over defaults. */
export function parseWorkerConfig(argv: readonly string[], env: Readonly<Record<string, string | undefined>>): WorkerConfig {
  const problems: string[] = [];
  const flags = new Map([...parseFlags(argv, problems, new Set([SOURCES.webhookAllowPrivate.flag]))].map(([name, values]) => [name, values.at(-1) ?? '']));
  const raw = (key: Key): string | undefined => flags.get(SOURCES[key].flag) ?? env[SOURCES[key].env] ?? (hasDefault(key) ? DEFAULTS[key] : undefined);
  const str = (key: Exclude<Key, OptionalKey>): string => raw(key) ?? DEFAULTS[key];
  const int = (key: 'apiPort' | 'basePoolReplicas' | 'terminalIdleMs' | 'imageGcIntervalMs' | 'imageGcGraceMs' | 'snapshotsPerTeam' | 'snapshotGibPerTeam' | 'eventRetentionDays', min: number, max: number): number => {
    const text = str(key);
    const value = Number(text);
    if (!Number.isInteger(value) || value < min || value > max) {
      problems.push(`${describe(key)} must be an integer from ${min} to ${max}, got "${text}"`);
      return Number(DEFAULTS[key]);
    }
    return value;
  };
  const bool = (key: 'webhookAllowPrivate'): boolean => {
    const text = str(key);
    if (text === 'true' || text === '1') return true;
    if (text === 'false' || text === '0') return false;
    problems.push(`${describe(key)} must be true or false (1 or 0), got "${text}"`);
    return false;
  };
  const oneOf = <const V extends string>(key: 'store' | 'runtime' | 'role', allowed: readonly V[]): V => {
    const text = str(key);
    if ((allowed as readonly string[]).includes(text)) return text as V;
    problems.push(`${describe(key)} must be one of ${allowed.join(', ')}, got "${text}"`);
    return DEFAULTS[key] as V;
  };

  const known = new Set(Object.values(SOURCES).map((s) => s.flag));
  for (const flag of flags.keys()) if (!known.has(flag)) problems.push(`unknown flag --${flag}`);

  const clusterTag = str('clusterTag');
  if (!isClusterTag(clusterTag)) problems.push(`${describe('clusterTag')} must be 4 characters [a-z0-9], got "${clusterTag}"`);
  const dataDir = resolve(str('dataDir'));
  // Per data dir, so a second checkout's worker does not take this one's bridge and addresses.
  const derived = derivedNetwork(dataDir);
  const subnet = raw('subnet') ?? derived.subnet;
  if (!isPodSubnet(subnet)) problems.push(`${describe('subnet')} must be an IPv4 network from /16 to /24 like 10.213.0.0/16 or 10.213.128.0/17, got "${subnet}"`);
  const bridge = raw('bridge') ?? derived.bridge;
  if (!/^[a-z][a-z0-9]{0,11}$/.test(bridge)) problems.push(`${describe('bridge')} must be 1-12 characters [a-z0-9] starting with a letter, got "${bridge}"`);

  const domain = str('domain');
  if (!/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)+$/.test(domain)) {
    problems.push(`${describe('domain')} must be a lower-case DNS name with at least two labels such as asb.localhost, got "${domain}"`);
  }
  const edgeUrl = str('edgeUrl');
  if (!isEdgeUrl(edgeUrl)) problems.push(`${describe('edgeUrl')} must be an http(s) URL with no path, such as http://127.0.0.1:10000, got "${edgeUrl}"`);

  const edgeTlsUrl = raw('edgeTlsUrl');
  if (edgeTlsUrl !== undefined && !(isEdgeUrl(edgeTlsUrl) && edgeTlsUrl.startsWith('https://'))) {
    problems.push(`${describe('edgeTlsUrl')} must be an https URL with no path, such as https://127.0.0.1:10002, got "${edgeTlsUrl}"`);
  }
  const adminKeyFile = raw('adminKeyFile');
  const hubUrl = raw('hubUrl');
  const hubCredentialFile = raw('hubCredentialFile');
  const store = oneOf('store', ['sqlite', 'kube'] as const);
  const runtime = oneOf('runtime', ['local', 'kube'] as const);
  const role = oneOf('role', ['all', 'operator', 'api'] as const);
  const namespace = str('namespace');
  const podNamespace = raw('podNamespace');
  const buildPodNamespace = raw('buildPodNamespace');
  const namespaces = [['namespace', namespace] as const, ...(podNamespace === undefined ? [] : [['podNamespace', podNamespace] as const]), ...(buildPodNamespace === undefined ? [] : [['buildPodNamespace', buildPodNamespace] as const])];
  for (const [key, value] of namespaces) {
    if (!/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(value)) problems.push(`${describe(key)} must be a namespace name (lower-case letters, digits and '-', at most 63), got "${value}"`);
  }
  // Ours first; KUBECONFIG is what kubectl reads, so a shell set up for kubectl just works.
  const kubeconfig = raw('kubeconfig') ?? env.KUBECONFIG;
  if (store === 'sqlite') {
    if (raw('kubeconfig') !== undefined) problems.push(`${describe('kubeconfig')} is read only with --store=kube, and ${describe('store')} is sqlite`);
    if (runtime === 'kube') problems.push(`${describe('runtime')} kube needs ${describe('store')} kube: the runtime makes Pods through the API server the store talks to`);
    if (role !== 'all') problems.push(`${describe('role')} ${role} needs ${describe('store')} kube: the SQLite store belongs to one process, so that process must be the whole worker (--role=all)`);
  } else if (role !== 'all' && runtime !== 'kube') {
    problems.push(`${describe('role')} ${role} needs ${describe('runtime')} kube: the API's exec and terminals reach pods the operator started only when both are Pods`);
  }
  if (hubUrl !== undefined && !isEdgeUrl(hubUrl)) problems.push(`${describe('hubUrl')} must be an http(s) URL with no path, such as http://127.0.0.1:7090, got "${hubUrl}"`);
  if ((hubUrl === undefined) !== (hubCredentialFile === undefined)) problems.push(`${describe('hubUrl')} and ${describe('hubCredentialFile')} go together: set both or neither`);
  const eventsUrl = raw('eventsUrl');
  if (eventsUrl !== undefined) {
    if (!isEdgeUrl(eventsUrl)) problems.push(`${describe('eventsUrl')} must be an http(s) URL with no path, such as http://operator:7080, got "${eventsUrl}"`);
    if (role !== 'api') problems.push(`${describe('eventsUrl')} is read only with ${describe('role')} api: a process with controllers keeps its own event log, and ${describe('role')} is ${role}`);
  }
  const egressText = raw('egressProxyPort');
  const egressProxyPort = egressText === undefined || egressText === '' || egressText === 'off' ? undefined : Number(egressText);
  if (egressProxyPort !== undefined && (!Number.isInteger(egressProxyPort) || egressProxyPort < 1 || egressProxyPort > 65535)) problems.push(`${describe('egressProxyPort')} must be a port from 1 to 65535 or off, got "${egressText ?? ''}"`);
  if (egressProxyPort !== undefined && runtime !== 'local') problems.push(`${describe('egressProxyPort')} needs ${describe('runtime')} local: on Kubernetes the CNI routes pods`);
  const floorText = raw('egressFloor');
  const floorEntries = floorText === undefined || floorText === '' ? DEFAULT_EGRESS_FLOOR : floorText === 'none' ? [] : floorText.split(',');
  const { floor: egressFloor, bad: badFloor } = parseEgressFloor(floorEntries);
  if (badFloor.length > 0) problems.push(`${describe('egressFloor')} must be comma-separated CIDRs or IPs (or none), got ${badFloor.map((b) => `"${b}"`).join(', ')}`);
  const buildEgress = parseBuildEgress(raw('buildEgress'), egressProxyPort !== undefined, (problem) => problems.push(`${describe('buildEgress')} ${problem}`));
  const config: WorkerConfig = {
    dataDir,
    apiHost: str('apiHost'),
    apiPort: int('apiPort', 0, 65535),
    clusterName: str('clusterName'),
    clusterTag,
    subnet,
    bridge,
    basePoolReplicas: int('basePoolReplicas', 0, 1000),
    adminKeyFile: adminKeyFile === undefined ? undefined : resolve(adminKeyFile),
    logLevel: str('logLevel'),
    domain,
    edgeUrl: edgeUrl.replace(/\/$/, ''),
    edgeTlsUrl: edgeTlsUrl?.replace(/\/$/, ''),
    hubUrl: hubUrl?.replace(/\/$/, ''),
    eventsUrl: eventsUrl?.replace(/\/$/, ''),
    hubCredentialFile: hubCredentialFile === undefined ? undefined : resolve(hubCredentialFile),
    // Up to a day: a terminal left open longer is forgotten, and it holds the sandbox awake.
    terminalIdleMs: int('terminalIdleMs', 100, 86_400_000),
    store,
    // A kubeconfig's relative paths are its own business; the file itself resolves from here.
    kubeconfig: kubeconfig === undefined || kubeconfig === '' ? undefined : resolve(kubeconfig),
    namespace,
    podNamespace: podNamespace ?? namespace,
    buildPodNamespace: buildPodNamespace ?? podNamespace ?? namespace,
    runtime,
    role,
    imageCache: resolve(raw('imageCache') ?? resolve(dataDir, 'images')),
    registriesFile: raw('registriesFile') === undefined ? undefined : resolve(raw('registriesFile') ?? ''),
    buildRegistry: raw('buildRegistry'),
    buildRegistryPull: raw('buildRegistryPull'),
    egressProxyPort,
    egressFloor,
    buildEgress,
    imageGcIntervalMs: int('imageGcIntervalMs', 0, 86_400_000),
    imageGcGraceMs: int('imageGcGraceMs', 0, 30 * 86_400_000),
    snapshotsPerTeam: int('snapshotsPerTeam', 0, 100_000),
    eventRetentionDays: int('eventRetentionDays', 1, 365),
    webhookAllowPrivate: bool('webhookAllowPrivate'),
    snapshotGibPerTeam: int('snapshotGibPerTeam', 0, 1_000_000),
    criu: raw('criu') === undefined ? undefined : resolve(raw('criu') ?? ''),
  };
  if (problems.length > 0) throw new ConfigError(problems);
  return Object.freeze(config);
}

/** `internet` (or unset), `none`, or an allow-list of CIDRs, IPs and domains; a domain needs the egress proxy. */
export function parseBuildEgress(text: string | undefined, proxyOn: boolean, problem: (text: string) => void): EgressPolicy {
  const value = text?.trim() ?? '';
  if (value === '' || value === 'internet') return DEFAULT_EGRESS_POLICY;
  if (value === 'none') return Object.freeze({ internet: false, allow: Object.freeze([]), deny: Object.freeze([]) });
  const entries = value.split(',').map((e) => e.trim()).filter((e) => e !== '');
  let policy: EgressPolicy;
  try {
    policy = parseEgressPolicy({ internet: false, allow: entries }, 'build egress');
  } catch (err) {
    const fields = err instanceof AsbError ? err.fields : [];
    problem(`must be internet, none or comma-separated CIDRs, IPs and domains: ${fields.map((f) => f.message).join('; ')}`);
    return DEFAULT_EGRESS_POLICY;
  }
  const domains = policy.allow.filter((e) => parseCidr(e) === undefined);
  if (domains.length > 0 && !proxyOn) {
    problem(`names domains (${domains.join(', ')}), which only the egress proxy can decide, and the proxy is off (--egress-proxy-port): use CIDRs, or turn the proxy on`);
    return DEFAULT_EGRESS_POLICY;
  }
  return policy;
}

/** Whether a key has a default (DEFAULTS); the optional ones have none, so they may stay unset. */
function hasDefault(key: Key): key is keyof typeof DEFAULTS {
  return Object.hasOwn(DEFAULTS, key);
}

function isEdgeUrl(text: string): boolean {
  try {
    const url = new URL(text);
    return (url.protocol === 'http:' || url.protocol === 'https:') && url.pathname === '/' && url.search === '' && url.username === '';
  } catch {
    return false;
  }
}

function describe(key: Key): string {
  return `--${SOURCES[key].flag} (${SOURCES[key].env})`;
}

/**
 * A pod subnet: an IPv4 network address with a prefix from /16 (65,534 pods) to /24 (253), so two
 * systems can split one /16 (the local runtime allocates in any prefix; network.ts).
 */
function isPodSubnet(cidr: string): boolean {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})\/(\d{2})$/.exec(cidr);
  if (m === null) return false;
  const octets = m.slice(1, 5).map(Number);
  const prefix = Number(m[5]);
  if (octets.some((o) => o > 255) || prefix < 16 || prefix > 24) return false;
  const address = octets.reduce((a, o) => a * 256 + o, 0);
  return address % 2 ** (32 - prefix) === 0;
}
