// The pod-security policy for pod specs a tenant (a non-admin API key) sends, pure: a pod spec, a
// level and what the runtime isolates → every field that breaks the level. Modelled on the
// Kubernetes Pod Security Standards (https://kubernetes.io/docs/concepts/security/pod-security-standards/):
//
// - `privileged`: nothing is checked. Only a template (admin-written) can grant it.
// - `baseline`: no host namespaces (hostNetwork, hostPID, hostIPC), no privileged containers, no
//   hostPath volumes, no host ports, capabilities added only from the baseline set, no unmasked
//   /proc, no Unconfined seccomp or AppArmor, no custom SELinux user or role, only safe sysctls.
// - `restricted` (the default for tenants): baseline, plus only NET_BIND_SERVICE may be added,
//   allowPrivilegeEscalation may not be true, and no root (runAsUser 0, runAsNonRoot false)
//   unless the pod runs in a user namespace or under gVisor, as far as the runtime provides one.
//
// Ours, beyond PSS, at both tenant levels: sandboxes of every team share a namespace on
// Kubernetes, so a tenant may not name a service account (serviceAccountName, or
// automountServiceAccountToken: true) nor read the namespace's Secrets and ConfigMaps (secret,
// configMap, projected and csi volumes; env valueFrom secretKeyRef/configMapKeyRef; envFrom).
// Volumes are limited to emptyDir, persistentVolumeClaim (validate-pod.ts keeps a claim to the
// sandbox's own claims), downwardAPI and ephemeral.
//
// A boolean that must be off is refused unless it is absent or false, and a host port unless it
// is absent or 0, so a value of the wrong type ("true", 1) never slips through as "not true".
import type { FieldProblem } from '../errors.ts';
import { isFields, join, type Fields } from './shape.ts';

/** On a SandboxTemplate (copied to its sandboxes) or a Sandbox: the level its pod specs are held to. */
export const POD_SECURITY_ANNOTATION = 'asb.dev/pod-security';

/** Strictest first. */
export const POD_SECURITY_LEVELS = ['restricted', 'baseline', 'privileged'] as const;
export type PodSecurityLevel = (typeof POD_SECURITY_LEVELS)[number];

/** What the pod runtime does about root in a pod (PodRuntime.rootIsolation in src/runtime/runtime.ts). */
export interface RootIsolation {
  /**
   * always: every pod runs in a user namespace (the local runtime when not root);
   * unless-host-users: a pod does unless it sets `hostUsers: true` or shares a host namespace
   * (Kubernetes 1.33+: the Kubernetes runtime sets `hostUsers: false` on every other pod);
   * never: uid 0 in the pod is uid 0 on the host (the local runtime as root).
   */
  userNamespace: 'always' | 'unless-host-users' | 'never';
  /** Whether `runtimeClassName: gvisor` really runs the pod under gVisor (Kubernetes: a RuntimeClass of that name). */
  gvisor: boolean;
}

/** What a runtime that says nothing is assumed to give: no user namespace, no gVisor. */
export const NO_ROOT_ISOLATION: RootIsolation = { userNamespace: 'never', gvisor: false };

/** PSS baseline: capabilities a container may add (the container runtime's defaults). */
const BASELINE_CAPABILITIES: ReadonlySet<string> = new Set([
  'AUDIT_WRITE', 'CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL', 'MKNOD', 'NET_BIND_SERVICE',
  'SETFCAP', 'SETGID', 'SETPCAP', 'SETUID', 'SYS_CHROOT',
]);
const RESTRICTED_CAPABILITIES: ReadonlySet<string> = new Set(['NET_BIND_SERVICE']);
/** PSS baseline: the namespaced sysctls a pod may set (Kubernetes 1.32 list). */
const SAFE_SYSCTLS: ReadonlySet<string> = new Set([
  'kernel.shm_rmid_forced', 'net.ipv4.ip_local_port_range', 'net.ipv4.ip_unprivileged_port_start',
  'net.ipv4.tcp_syncookies', 'net.ipv4.ping_group_range', 'net.ipv4.ip_local_reserved_ports',
  'net.ipv4.tcp_keepalive_time', 'net.ipv4.tcp_fin_timeout', 'net.ipv4.tcp_keepalive_intvl',
  'net.ipv4.tcp_keepalive_probes', 'net.ipv4.tcp_rmem', 'net.ipv4.tcp_wmem',
]);
const SELINUX_TYPES: ReadonlySet<string> = new Set(['', 'container_t', 'container_init_t', 'container_kvm_t', 'container_engine_t']);
/** Volume sources a tenant may use; the key of each volume other than `name` is its source. */
const TENANT_VOLUMES: ReadonlySet<string> = new Set(['emptyDir', 'persistentVolumeClaim', 'downwardAPI', 'ephemeral']);
const HOST_NAMESPACES = ['hostNetwork', 'hostPID', 'hostIPC'] as const;
const CONTAINER_LISTS = ['initContainers', 'containers', 'ephemeralContainers'] as const;

export function isPodSecurityLevel(value: unknown): value is PodSecurityLevel {
  return typeof value === 'string' && (POD_SECURITY_LEVELS as readonly string[]).includes(value);
}

/** Whether `a` allows more than `b`. */
export function isLooser(a: PodSecurityLevel, b: PodSecurityLevel): boolean {
  return POD_SECURITY_LEVELS.indexOf(a) > POD_SECURITY_LEVELS.indexOf(b);
}

/** The problem with an `asb.dev/pod-security` annotation value, if any. */
export function levelProblem(value: string): string | undefined {
  return isPodSecurityLevel(value) ? undefined : `must be one of ${POD_SECURITY_LEVELS.join(', ')}, got ${JSON.stringify(value)}`;
}

/** The level an object's annotations grant, or `fallback` when it has none (or a bad one). */
export function levelOf(annotations: Readonly<Record<string, string>> | undefined, fallback: PodSecurityLevel): PodSecurityLevel {
  const value = annotations?.[POD_SECURITY_ANNOTATION];
  return isPodSecurityLevel(value) ? value : fallback;
}

/** Every field of `spec` (at `path`) that `level` refuses; empty when the spec meets it. */
export function podSecurityProblems(spec: unknown, level: PodSecurityLevel, path: string, isolation: RootIsolation): FieldProblem[] {
  const problems: FieldProblem[] = [];
  if (level === 'privileged' || !isFields(spec)) return problems;
  const restricted = level === 'restricted';
  const refuse = (field: string, message: string): void => {
    problems.push({ field, message: `${message} (pod security level ${level})` });
  };

  for (const key of HOST_NAMESPACES) {
    if (isOn(spec[key])) refuse(join(path, key), 'must not be set: a host namespace gives the pod the host\'s network, processes or IPC');
  }
  if (spec.serviceAccountName !== undefined) refuse(join(path, 'serviceAccountName'), 'must not be set: a sandbox runs with no service account; a template may name one');
  if (isOn(spec.automountServiceAccountToken)) refuse(join(path, 'automountServiceAccountToken'), 'must be false or absent: a sandbox gets no service account token');
  checkVolumes(spec.volumes, join(path, 'volumes'), refuse);
  const root = rootProblem(spec, isolation);
  checkSecurityContext(spec.securityContext, join(path, 'securityContext'), restricted, root, refuse);
  for (const list of CONTAINER_LISTS) {
    const containers = spec[list];
    if (!Array.isArray(containers)) continue;
    containers.forEach((c: unknown, i) => {
      if (isFields(c)) checkContainer(c, join(join(path, list), i), restricted, root, refuse);
    });
  }
  return problems;
}

type Refuse = (field: string, message: string) => void;

/**
 * Whether a Kubernetes pod can run in a user namespace of its own: Kubernetes refuses
 * `hostUsers: false` together with the host's network, PID or IPC namespace.
 */
export function takesUserNamespace(spec: Readonly<Record<string, unknown>>): boolean {
  return spec.hostUsers !== true && spec.hostNetwork !== true && spec.hostPID !== true && spec.hostIPC !== true;
}

/** Why root is refused for this pod, or undefined when the runtime isolates it. */
function rootProblem(spec: Fields, isolation: RootIsolation): string | undefined {
  if (isolation.userNamespace === 'always') return undefined;
  if (isolation.userNamespace === 'unless-host-users' && takesUserNamespace(spec)) return undefined;
  if (isolation.gvisor && spec.runtimeClassName === 'gvisor') return undefined;
  const ways = [
    ...(isolation.userNamespace === 'unless-host-users' ? ['a user namespace (hostUsers unset or false, and no host network, PID or IPC namespace)'] : []),
    ...(isolation.gvisor ? ['gVisor (runtimeClassName: gvisor)'] : []),
  ];
  const offer = ways.length === 0 ? 'this runtime offers neither a user namespace nor gVisor' : `this runtime allows it with ${ways.join(' or ')}`;
  return `would run as root (uid 0) on the host: root needs a user namespace or gVisor, and ${offer}`;
}

function checkVolumes(value: unknown, path: string, refuse: Refuse): void {
  if (!Array.isArray(value)) return;
  value.forEach((volume: unknown, i) => {
    if (!isFields(volume)) return;
    for (const source of Object.keys(volume)) {
      if (source === 'name' || TENANT_VOLUMES.has(source)) continue;
      const at = join(join(path, i), source);
      if (source === 'hostPath') refuse(at, 'must not be set: a hostPath volume mounts a directory of the host');
      else refuse(at, `must not be set: a sandbox's volumes are ${[...TENANT_VOLUMES].join(', ')}; other sources read objects of a namespace other teams share`);
    }
  });
}

function checkContainer(c: Fields, path: string, restricted: boolean, root: string | undefined, refuse: Refuse): void {
  if (Array.isArray(c.ports)) {
    c.ports.forEach((port: unknown, i) => {
      if (isFields(port) && port.hostPort !== undefined && port.hostPort !== 0) {
        refuse(join(join(join(path, 'ports'), i), 'hostPort'), 'must not be set: a host port opens a port on the host');
      }
    });
  }
  if (Array.isArray(c.env)) {
    c.env.forEach((env: unknown, i) => {
      const from = isFields(env) && isFields(env.valueFrom) ? env.valueFrom : undefined;
      for (const ref of ['secretKeyRef', 'configMapKeyRef']) {
        if (from?.[ref] !== undefined) refuse(join(join(join(join(path, 'env'), i), 'valueFrom'), ref), 'must not be set: it reads an object of a namespace other teams share');
      }
    });
  }
  if (c.envFrom !== undefined) refuse(join(path, 'envFrom'), 'must not be set: it reads objects of a namespace other teams share');
  const ctxPath = join(path, 'securityContext');
  checkSecurityContext(c.securityContext, ctxPath, restricted, root, refuse);
  const ctx = isFields(c.securityContext) ? c.securityContext : {};
  if (isOn(ctx.privileged)) refuse(join(ctxPath, 'privileged'), 'must be false or absent: a privileged container has every capability and the host\'s devices');
  if (restricted && isOn(ctx.allowPrivilegeEscalation)) refuse(join(ctxPath, 'allowPrivilegeEscalation'), 'must be false or absent');
  if (ctx.procMount !== undefined && ctx.procMount !== 'Default') refuse(join(ctxPath, 'procMount'), 'must be Default or absent: an unmasked /proc exposes the host\'s kernel settings');
  const add = isFields(ctx.capabilities) ? ctx.capabilities.add : undefined;
  if (Array.isArray(add)) {
    const allowed = restricted ? RESTRICTED_CAPABILITIES : BASELINE_CAPABILITIES;
    add.forEach((cap: unknown, i) => {
      const name = typeof cap === 'string' ? cap.toUpperCase().replace(/^CAP_/, '') : '';
      if (!allowed.has(name)) refuse(join(join(join(ctxPath, 'capabilities'), 'add'), i), `must be one of ${[...allowed].join(', ')}, got ${JSON.stringify(cap)}`);
    });
  }
}

/** The checks a pod's and a container's securityContext share. */
function checkSecurityContext(value: unknown, path: string, restricted: boolean, root: string | undefined, refuse: Refuse): void {
  if (!isFields(value)) return;
  if (restricted && root !== undefined) {
    if (value.runAsUser === 0) refuse(join(path, 'runAsUser'), `must not be 0: it ${root}`);
    if (value.runAsNonRoot === false) refuse(join(path, 'runAsNonRoot'), `must be true or absent: false ${root}`);
  }
  const seccomp = isFields(value.seccompProfile) ? value.seccompProfile.type : undefined;
  if (seccomp === 'Unconfined') refuse(join(join(path, 'seccompProfile'), 'type'), 'must be RuntimeDefault or Localhost, got "Unconfined"');
  const apparmor = isFields(value.appArmorProfile) ? value.appArmorProfile.type : undefined;
  if (apparmor === 'Unconfined') refuse(join(join(path, 'appArmorProfile'), 'type'), 'must be RuntimeDefault or Localhost, got "Unconfined"');
  if (isFields(value.seLinuxOptions)) {
    const se = value.seLinuxOptions;
    const at = join(path, 'seLinuxOptions');
    if (se.type !== undefined && (typeof se.type !== 'string' || !SELINUX_TYPES.has(se.type))) refuse(join(at, 'type'), `must be one of ${[...SELINUX_TYPES].filter((t) => t !== '').join(', ')}`);
    for (const key of ['user', 'role']) if (se[key] !== undefined && se[key] !== '') refuse(join(at, key), 'must not be set');
  }
  if (isFields(value.windowsOptions) && isOn(value.windowsOptions.hostProcess)) refuse(join(join(path, 'windowsOptions'), 'hostProcess'), 'must be false or absent');
  if (Array.isArray(value.sysctls)) {
    value.sysctls.forEach((s: unknown, i) => {
      const name = isFields(s) ? s.name : undefined;
      if (typeof name !== 'string' || !SAFE_SYSCTLS.has(name)) refuse(join(join(join(path, 'sysctls'), i), 'name'), `must be a safe sysctl (${[...SAFE_SYSCTLS].join(', ')}), got ${JSON.stringify(name)}`);
    });
  }
}

/** Set to anything but false (a string "true" or 1 counts as on). */
function isOn(value: unknown): boolean {
  return value !== undefined && value !== false;
}
