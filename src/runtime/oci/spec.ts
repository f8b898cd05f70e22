// The OCI runtime spec (config.json, runtime-spec 1.x) for a sandbox's container, pure: the pod's
// container, the image's config and the runtime's facts → the object runc reads. Hardened by
// default (research/runtime.md §3a):
// - seccomp RuntimeDefault (seccomp-profile.ts), no_new_privs always, every capability dropped
//   unless `securityContext.capabilities.add` asks for one of the PSS baseline set;
// - runc's/containerd's masked and read-only /proc and /sys paths, /sys read-only;
// - a non-root user by default: runAsUser, else the image's user, else 1000. A container that runs
//   as uid 0, or holds a capability other than NET_BIND_SERVICE, gets a user namespace
//   (ROOT_ID_MAP): root and capabilities then refer to the sandbox's own namespace, never the host's
//   (a uid-1000 process with an ambient CAP_SETUID could otherwise become host uid 0);
// - cgroup limits: memory (swap = memory, so no swap), cpu quota, pids, devices deny-all;
// - /dev/shm sized (tmpfs pages are charged to the memory cgroup, but the size caps it first).
import { AsbError, type FieldProblem } from '../../errors.ts';
import type { Container } from '../../api/types.ts';
import { resolveExecUser } from './user-spec.ts';
import type { ImageConfig } from '../../images/image-store.ts';
import { parseQuantity } from '../../api/quantity.ts';
import { runtimeDefaultProfile, type SeccompProfile } from './seccomp-profile.ts';

export const OCI_VERSION = '1.2.0';
/** The user when neither the pod nor the image names one: the images' `user` (base and busybox have it). */
export const DEFAULT_UID = 1000;
/**
 * The range the image cache unpacks id-mapped trees into: container ids 0-65535 as host ids
 * 100000-165535 (Debian's SUB_UID_MIN and SUB_UID_COUNT; host accounts stop at UID_MAX 60000 and
 * 65536 covers nobody, 65534). The local runtime gives each sandbox a range of its own
 * (src/runtime/local/id-ranges.ts) and idmaps this one tree into it; a sandbox made before ranges
 * still runs in this one, and so does a caller that names no idMap.
 */
export const ROOT_ID_MAP: IdRange = { hostId: 100_000, size: 65_536 };
/** Memory when `limits.memory` is absent: a shell, a language server and a build fit; 8 of them fit in half of this 24 GiB host. */
export const DEFAULT_MEMORY_BYTES = 2 * 2 ** 30;
/**
 * pids (processes and threads) per sandbox. A `make -j` build or a Node/Python worker pool peaks
 * at a few hundred threads; 1024 leaves headroom. pid_max here is 32768, so a fork bomb in one
 * sandbox takes 1/32 of the host's pids, not all of them (RLIMIT_NPROC is per uid and shared by
 * every sandbox of the same uid, so it cannot be the limit).
 */
export const DEFAULT_PIDS_LIMIT = 1024;
/** /dev/shm: Docker's 64 MiB, not a tmpfs default of half the host's RAM (12 GiB here). */
export const DEFAULT_SHM_BYTES = 64 * 2 ** 20;
/** Open files: at most the worker's hard limit (20000 here), or runc refuses to start ("error setting rlimit type 7"). */
export const DEFAULT_NOFILE = 16_384;
/** cgroup v1 cfs period; the quota is cores × this. */
export const CPU_PERIOD_US = 100_000;
/** The smallest memory limit accepted: runc and the kernel need a few MiB to start a process at all. */
const MIN_MEMORY_BYTES = 6 * 2 ** 20;
/** Linux's minimum cfs quota. */
const MIN_CPU_QUOTA_US = 1000;

/** What a container may add: the PSS baseline set (src/api/pod-security.ts enforces a tenant's level on top). */
export const ADDABLE_CAPABILITIES: ReadonlySet<string> = new Set([
  'AUDIT_WRITE', 'CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL', 'MKNOD', 'NET_BIND_SERVICE',
  'SETFCAP', 'SETGID', 'SETPCAP', 'SETUID', 'SYS_CHROOT',
]);

/** containerd's and runc's lists. */
export const MASKED_PATHS: readonly string[] = [
  '/proc/acpi', '/proc/asound', '/proc/kcore', '/proc/keys', '/proc/latency_stats', '/proc/timer_list',
  '/proc/timer_stats', '/proc/sched_debug', '/proc/scsi', '/sys/firmware', '/sys/devices/virtual/powercap',
];
export const READONLY_PATHS: readonly string[] = ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys', '/proc/sysrq-trigger'];

export interface IdRange {
  readonly hostId: number;
  readonly size: number;
}

export interface BindMount {
  /** Absolute path inside the container. */
  destination: string;
  /** Absolute host path (a volume's directory, a runtime-owned /etc/hosts, ...). */
  source: string;
  readOnly?: boolean;
}

/** What the runtime decided and prepared; the spec only describes it. */
export interface RuntimeFacts {
  /** The rootfs (an overlay on the cached tree; for a root pod, on the id-mapped tree). */
  rootfs: string;
  hostname: string;
  /** A network namespace file to join; absent: a new, empty one (loopback only). */
  netnsPath?: string;
  /** `/asb/<cluster>/<id>`: cgroupfs paths, one directory per controller on v1. */
  cgroupsPath: string;
  mounts?: readonly BindMount[];
  shmBytes?: number;
  pidsLimit?: number;
  nofile?: number;
  /** The host range for a root pod's user namespace; ROOT_ID_MAP when absent. */
  idMap?: IdRange;
  /**
   * A user namespace to join, made by the caller with idMap's mapping (oci-shim.c -u: owned by the
   * range's first host id, not root); the spec then names no mappings (runc reads them from it).
   */
  userNamespacePath?: string;
  /**
   * 'always': every container gets the user namespace, whoever it runs as (the local runtime: an
   * exec as root, E2B's `user: "root"`, is then root of the sandbox's namespace only). Default
   * 'when-needed': only a container that runs as root or holds a namespaced capability.
   */
  userNamespace?: 'always' | 'when-needed';
  /** The image's /etc/passwd and /etc/group, read by the caller, to resolve a named image user. */
  passwd?: string;
  group?: string;
}

export interface PodLevel {
  securityContext?: { runAsUser?: number; runAsGroup?: number; fsGroup?: number; runAsNonRoot?: boolean; [other: string]: unknown };
}

export interface OciMount { destination: string; type: string; source: string; options: string[] }
export interface OciIdMapping { containerID: number; hostID: number; size: number }
export interface OciCapabilities { bounding: string[]; effective: string[]; permitted: string[]; inheritable: string[]; ambient: string[] }

export interface OciSpec {
  ociVersion: string;
  process: {
    terminal: false;
    /** additionalGids absent: none (runscSpec leaves an empty list out). */
    user: { uid: number; gid: number; additionalGids?: number[] };
    args: string[];
    env: string[];
    cwd: string;
    capabilities: OciCapabilities;
    rlimits: { type: string; hard: number; soft: number }[];
    noNewPrivileges: true;
    oomScoreAdj: number;
  };
  root: { path: string; readonly: boolean };
  hostname: string;
  /** runc reads `org.criu.config` (a CRIU configuration file for its checkpoint and restore). */
  annotations?: Record<string, string>;
  mounts: OciMount[];
  linux: {
    namespaces: { type: string; path?: string }[];
    uidMappings?: OciIdMapping[];
    gidMappings?: OciIdMapping[];
    cgroupsPath: string;
    resources: {
      devices: { allow: boolean; access: string }[];
      memory: { limit: number; swap: number };
      cpu: { shares?: number; quota?: number; period?: number };
      pids: { limit: number };
    };
    seccomp: SeccompProfile;
    maskedPaths: string[];
    readonlyPaths: string[];
  };
}

/** Who the container runs as, with which capabilities, and in which user namespace (if any). */
export interface SandboxIdentity {
  uid: number;
  gid: number;
  additionalGids: number[];
  capabilities: OciCapabilities;
  /** The host range a user namespace maps container ids 0.. to; undefined: no user namespace. */
  userNamespace: IdRange | undefined;
}

type IdFacts = Pick<RuntimeFacts, 'passwd' | 'group' | 'idMap' | 'userNamespace'>;

/**
 * The identity containerSpec will use, for the runtime to call first: a user namespace needs the
 * rootfs unpacked through its id map (ImageStore.pull with `idMap`). An `Invalid` AsbError when the
 * user or capabilities cannot be honoured.
 */
export function sandboxIdentity(container: Container, image: ImageConfig, facts: IdFacts, pod: PodLevel = {}): SandboxIdentity {
  const problems: FieldProblem[] = [];
  const identity = resolveIdentity(container, image, facts, pod, (field, message) => void problems.push({ field, message }));
  throwIfAny(container, problems);
  return identity;
}

/** The container's config.json; an `Invalid` AsbError listing every field it cannot honour. */
export function containerSpec(container: Container, image: ImageConfig, facts: RuntimeFacts, pod: PodLevel = {}): OciSpec {
  const problems: FieldProblem[] = [];
  const refuse = (field: string, message: string): void => void problems.push({ field, message });
  const ctx = container.securityContext ?? {};

  const args = [...(container.command ?? image.entrypoint), ...(container.args ?? (container.command === undefined ? image.cmd : []))];
  if (args.length === 0) refuse('command', 'neither the container (command, args) nor the image (Entrypoint, Cmd) says what to run');

  const identity = resolveIdentity(container, image, facts, pod, refuse);
  const caps = identity.capabilities;
  const limits = resourceLimits(container.resources?.limits ?? {}, container.resources?.requests ?? {}, refuse);
  if (ctx.privileged !== undefined && ctx.privileged !== false) refuse('securityContext.privileged', 'must be false or absent: this runtime runs no privileged containers');
  if (ctx.procMount !== undefined && ctx.procMount !== 'Default') refuse('securityContext.procMount', `must be Default or absent: /proc is always masked, got ${JSON.stringify(ctx.procMount)}`);
  const seccompType = seccompTypeOf(ctx) ?? seccompTypeOf(pod.securityContext ?? {});
  if (seccompType !== undefined && seccompType !== 'RuntimeDefault') refuse('securityContext.seccompProfile.type', `must be RuntimeDefault or absent, got ${JSON.stringify(seccompType)}`);
  for (const m of facts.mounts ?? []) if (!m.destination.startsWith('/') || !m.source.startsWith('/')) refuse('volumeMounts', `mount ${m.source} → ${m.destination}: both paths must be absolute`);

  throwIfAny(container, problems);

  const idMap = identity.userNamespace;
  const namespaces: { type: string; path?: string }[] = [
    { type: 'pid' }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }, { type: 'cgroup' },
    facts.netnsPath === undefined ? { type: 'network' } : { type: 'network', path: facts.netnsPath },
    ...(idMap === undefined ? [] : [facts.userNamespacePath === undefined ? { type: 'user' } : { type: 'user', path: facts.userNamespacePath }]),
  ];
  const mapping = idMap === undefined || facts.userNamespacePath !== undefined ? undefined : [{ containerID: 0, hostID: idMap.hostId, size: idMap.size }];
  const nofile = facts.nofile ?? DEFAULT_NOFILE;

  return {
    ociVersion: OCI_VERSION,
    process: {
      terminal: false,
      user: { uid: identity.uid, gid: identity.gid, additionalGids: identity.additionalGids },
      args,
      env: environment(image.env, container.env ?? [], facts.hostname),
      cwd: container.workingDir ?? image.workingDir ?? '/',
      capabilities: caps,
      rlimits: [
        { type: 'RLIMIT_NOFILE', soft: nofile, hard: nofile },
        // No core files: a crash must not fill the sandbox's disk (the host core_pattern is a file name here).
        { type: 'RLIMIT_CORE', soft: 0, hard: 0 },
      ],
      noNewPrivileges: true,
      // The OOM killer takes a sandbox's process before the worker's (0) when the host runs short.
      oomScoreAdj: 1000,
    },
    root: { path: facts.rootfs, readonly: ctx.readOnlyRootFilesystem === true },
    hostname: facts.hostname,
    mounts: systemMounts(facts.shmBytes ?? DEFAULT_SHM_BYTES, idMap !== undefined && facts.netnsPath !== undefined)
      .concat((facts.mounts ?? []).map((m) => ({
        destination: m.destination, type: 'bind', source: m.source,
        options: ['rbind', 'nosuid', 'nodev', m.readOnly === true ? 'ro' : 'rw'],
      }))),
    linux: {
      namespaces,
      ...(mapping === undefined ? {} : { uidMappings: mapping, gidMappings: mapping }),
      cgroupsPath: facts.cgroupsPath,
      resources: {
        // Deny every device node; runc adds its defaults (null, zero, full, random, urandom, tty, ptmx, pts).
        devices: [{ allow: false, access: 'rwm' }],
        memory: { limit: limits.memory, swap: limits.memory },
        cpu: limits.cpu,
        pids: { limit: facts.pidsLimit ?? DEFAULT_PIDS_LIMIT },
      },
      seccomp: runtimeDefaultProfile(caps.bounding),
      maskedPaths: [...MASKED_PATHS],
      readonlyPaths: [...READONLY_PATHS],
    },
  };
}

type Refuse = (field: string, message: string) => void;

function throwIfAny(container: Container, problems: FieldProblem[]): void {
  if (problems.length > 0) {
    throw new AsbError('Invalid', `container "${container.name}": ${problems.map((p) => `${p.field} ${p.message}`).join('; ')}`, { fields: problems });
  }
}

/** Capabilities that do not call for a user namespace: binding a port below 1024 in the sandbox's own netns. */
const HOST_NAMESPACE_CAPABILITIES: ReadonlySet<string> = new Set(['CAP_NET_BIND_SERVICE']);

function resolveIdentity(container: Container, image: ImageConfig, facts: IdFacts, pod: PodLevel, refuse: Refuse): SandboxIdentity {
  const user = resolveUser(container, pod, image, facts, refuse);
  const caps = capabilities(container.securityContext ?? {}, user.uid, refuse);
  // Root, or a capability that acts on what the namespace owns, only ever in a user namespace of its own.
  const namespaced = facts.userNamespace === 'always' || user.uid === 0 || caps.bounding.some((c) => !HOST_NAMESPACE_CAPABILITIES.has(c));
  return { ...user, capabilities: caps, userNamespace: namespaced ? facts.idMap ?? ROOT_ID_MAP : undefined };
}

interface User { uid: number; gid: number; additionalGids: number[] }

/**
 * runAsUser (container, then pod), else the image's user, else DEFAULT_UID; runAsGroup likewise,
 * else the passwd entry's group, else the uid. The image's user is read as Docker reads it
 * (user-spec.ts): `name:group` sets the group, `name` alone adds the groups /etc/group lists it in.
 */
function resolveUser(c: Container, pod: PodLevel, image: ImageConfig, facts: IdFacts, refuse: Refuse): User {
  const ctx = c.securityContext ?? {};
  const podCtx = pod.securityContext ?? {};
  const passwd = parseIdFile(facts.passwd ?? '', 2, 3);
  let uid = ctx.runAsUser ?? podCtx.runAsUser;
  let gid = ctx.runAsGroup ?? podCtx.runAsGroup;
  let imageGroups: number[] = [];
  if (uid === undefined && image.user !== undefined && image.user !== '') {
    const who = resolveExecUser(image.user, facts.passwd ?? '', facts.group ?? '');
    if ('error' in who) refuse('image.user', `${JSON.stringify(image.user)}: ${who.error}`);
    else {
      uid = who.uid;
      // runAsGroup, when set, wins over the image's group (and then its supplementary groups go too).
      if (gid === undefined) {
        gid = who.gid;
        imageGroups = who.groups;
      }
    }
  }
  uid ??= DEFAULT_UID;
  const checked: [string, number][] = gid === undefined ? [['runAsUser', uid]] : [['runAsUser', uid], ['runAsGroup', gid]];
  gid ??= [...passwd.values()].find((e) => e.id === uid)?.gid ?? uid;
  const fsGroup = podCtx.fsGroup;
  if (fsGroup !== undefined) checked.push(['fsGroup', fsGroup]);
  // Below the user-namespace range (ROOT_ID_MAP), so no sandbox without one shares a host id with a
  // root sandbox's mapped ids, and within what a user namespace maps.
  for (const [field, id] of checked) {
    if (!Number.isInteger(id) || id < 0 || id > 65_535) refuse(`securityContext.${field}`, `must be an integer from 0 to 65535, got ${String(id)}`);
  }
  if (uid === 0 && (ctx.runAsNonRoot === true || (ctx.runAsNonRoot === undefined && podCtx.runAsNonRoot === true))) {
    refuse('securityContext.runAsNonRoot', 'is true, but the container would run as uid 0');
  }
  const additionalGids = imageGroups.filter((g) => g !== gid);
  if (fsGroup !== undefined && fsGroup !== gid && !additionalGids.includes(fsGroup)) additionalGids.push(fsGroup);
  return { uid, gid, additionalGids };
}

/** name → id (and the passwd group) from /etc/passwd or /etc/group text. */
function parseIdFile(text: string, idField: number, gidField: number): Map<string, { id: number; gid: number }> {
  const entries = new Map<string, { id: number; gid: number }>();
  for (const line of text.split('\n')) {
    const f = line.split(':');
    const name = f[0] ?? '';
    const id = Number(f[idField]);
    const gid = Number(f[gidField]);
    if (name !== '' && !name.startsWith('#') && Number.isInteger(id) && Number.isInteger(gid)) entries.set(name, { id, gid });
  }
  return entries;
}

/** Empty unless `capabilities.add` names some of ADDABLE_CAPABILITIES; `drop` wins. */
function capabilities(ctx: NonNullable<Container['securityContext']>, uid: number, refuse: Refuse): OciCapabilities {
  const requested = isRecord(ctx.capabilities) ? ctx.capabilities : {};
  const names = (list: unknown, field: string): string[] => {
    if (list === undefined) return [];
    if (!Array.isArray(list)) {
      refuse(field, 'must be a list of capability names');
      return [];
    }
    return list.map((cap: unknown) => (typeof cap === 'string' ? cap.toUpperCase().replace(/^CAP_/, '') : ''));
  };
  const add = names(requested.add, 'securityContext.capabilities.add');
  const drop = new Set(names(requested.drop, 'securityContext.capabilities.drop'));
  add.forEach((cap, i) => {
    if (!ADDABLE_CAPABILITIES.has(cap)) refuse(`securityContext.capabilities.add[${i}]`, `must be one of ${[...ADDABLE_CAPABILITIES].join(', ')}, got ${JSON.stringify(cap === '' ? (requested.add as unknown[])[i] : cap)}`);
  });
  const granted = drop.has('ALL') ? [] : [...new Set(add)].filter((c) => ADDABLE_CAPABILITIES.has(c) && !drop.has(c)).map((c) => `CAP_${c}`);
  // A non-root process keeps a capability across execve only as an ambient one (which must also be
  // inheritable); root gets it from its permitted set.
  const ambient = uid === 0 ? [] : granted;
  return { bounding: granted, effective: granted, permitted: granted, inheritable: ambient, ambient };
}

interface Limits { memory: number; cpu: { shares?: number; quota?: number; period?: number } }

function resourceLimits(limits: Record<string, string | number>, requests: Record<string, string | number>, refuse: Refuse): Limits {
  const quantity = (value: string | number | undefined, field: string, min: number, unit: string): number | undefined => {
    if (value === undefined) return undefined;
    const parsed = parseQuantity(value);
    if (parsed === undefined) refuse(field, `must be a quantity such as ${unit === 'bytes' ? '"512Mi" or "2Gi"' : '"500m" or "2"'}, got ${JSON.stringify(value)}`);
    else if (parsed < min) refuse(field, `must be at least ${String(min)} ${unit}, got ${JSON.stringify(value)}`);
    else return parsed;
    return undefined;
  };
  const memory = quantity(limits.memory, 'resources.limits.memory', MIN_MEMORY_BYTES, 'bytes');
  const cpuLimit = quantity(limits.cpu, 'resources.limits.cpu', 0.001, 'cores');
  const cpuRequest = quantity(requests.cpu, 'resources.requests.cpu', 0.001, 'cores');
  quantity(requests.memory, 'resources.requests.memory', 0, 'bytes');
  const cpu: Limits['cpu'] = {};
  // Kubernetes' conversions: shares = millicores × 1024 / 1000 (at least 2), quota = cores × period.
  if (cpuRequest !== undefined) cpu.shares = Math.max(2, Math.floor(cpuRequest * 1024));
  if (cpuLimit !== undefined) {
    cpu.quota = Math.max(MIN_CPU_QUOTA_US, Math.ceil(cpuLimit * CPU_PERIOD_US));
    cpu.period = CPU_PERIOD_US;
  }
  // Whole bytes, rounded up as Kubernetes does; memory limits are page-granular in the kernel anyway.
  return { memory: Math.ceil(memory ?? DEFAULT_MEMORY_BYTES), cpu };
}

/** Image env, then the container's (by name, the container wins), PATH and HOSTNAME when missing. */
function environment(imageEnv: readonly string[], env: NonNullable<Container['env']>, hostname: string): string[] {
  const vars = new Map<string, string>([['PATH', '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'], ['HOSTNAME', hostname]]);
  for (const entry of imageEnv) {
    const eq = entry.indexOf('=');
    if (eq > 0) vars.set(entry.slice(0, eq), entry.slice(eq + 1));
  }
  for (const e of env) vars.set(e.name, e.value ?? '');
  return [...vars].map(([k, v]) => `${k}=${v}`);
}

/**
 * /proc, /dev, /dev/pts, /dev/shm (sized), /dev/mqueue, /sys (read-only) and the container's own
 * cgroup (read-only). A user namespace may mount sysfs only when it also owns the network
 * namespace, so with a joined netns /sys is a read-only bind of the host's instead (runc's rootless
 * spec does the same); masked paths still apply.
 */
function systemMounts(shmBytes: number, bindSys: boolean): OciMount[] {
  return [
    { destination: '/proc', type: 'proc', source: 'proc', options: ['nosuid', 'noexec', 'nodev'] },
    { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] },
    { destination: '/dev/pts', type: 'devpts', source: 'devpts', options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620', 'gid=5'] },
    { destination: '/dev/shm', type: 'tmpfs', source: 'shm', options: ['nosuid', 'noexec', 'nodev', 'mode=1777', `size=${String(Math.ceil(shmBytes / 1024))}k`] },
    { destination: '/dev/mqueue', type: 'mqueue', source: 'mqueue', options: ['nosuid', 'noexec', 'nodev'] },
    bindSys
      ? { destination: '/sys', type: 'none', source: '/sys', options: ['rbind', 'nosuid', 'noexec', 'nodev', 'ro'] }
      : { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] },
    { destination: '/sys/fs/cgroup', type: 'cgroup', source: 'cgroup', options: ['nosuid', 'noexec', 'nodev', 'relatime', 'ro'] },
  ];
}

function seccompTypeOf(ctx: Record<string, unknown>): unknown {
  return isRecord(ctx.seccompProfile) ? ctx.seccompProfile.type : undefined;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
