// Validation of the pod blueprint shared by Sandbox and SandboxTemplate: podTemplate and
// volumeClaimTemplates. PodSpec and Container are the Kubernetes types, too large to enumerate,
// so unknown keys there are kept; the fields the runtime honours are type-checked.
import { dnsLabelProblem, isReservedKey, labelProblem, portNameProblem, qualifiedNameProblem, RESERVED_PREFIXES } from './names.ts';
import { parseQuantity } from './quantity.ts';
import {
  join, noDuplicates, onlyKnown, optArray, optBoolean, optEnum, optInt, optObject, optString, optStringArray,
  optStringMap, report, reqObject, reqString, typeOf,
} from './shape.ts';
import type { Problems } from './shape.ts';

const PORT = { min: 1, max: 65535 } as const;
const ACCESS_MODES = ['ReadWriteOnce', 'ReadOnlyMany', 'ReadWriteMany', 'ReadWriteOncePod'] as const;
const PROBE_HANDLERS = ['exec', 'httpGet', 'tcpSocket', 'grpc'] as const;

/** labels/annotations of pod metadata; user objects may not set our reserved label keys. */
export function validatePodMetadata(problems: Problems, path: string, value: unknown): void {
  const meta = optObject(problems, path, value);
  if (meta === undefined) return;
  onlyKnown(problems, path, meta, ['labels', 'annotations']);
  optStringMap(problems, join(path, 'labels'), meta.labels, (key, v) => {
    if (isReservedKey(key)) return `label keys under ${RESERVED_PREFIXES.join(', ')} are reserved for the controller`;
    return labelProblem(key, v);
  });
  optStringMap(problems, join(path, 'annotations'), meta.annotations, (key) => qualifiedNameProblem(key));
}

/** Checks volumeClaimTemplates and returns the names they declare (pods may mount them). */
export function validateVolumeClaimTemplates(problems: Problems, path: string, value: unknown): string[] {
  const list = optArray(problems, path, value) ?? [];
  const named: { name: string; path: string }[] = [];
  list.forEach((item, i) => {
    const at = join(path, i);
    const vct = optObject(problems, at, item ?? {});
    if (vct === undefined) return;
    onlyKnown(problems, at, vct, ['metadata', 'spec']);
    const meta = reqObject(problems, join(at, 'metadata'), vct.metadata);
    if (meta !== undefined) {
      const metaPath = join(at, 'metadata');
      onlyKnown(problems, metaPath, meta, ['name', 'labels', 'annotations']);
      const name = reqString(problems, join(metaPath, 'name'), meta.name);
      // The name becomes a pod volume name, which Kubernetes requires to be a DNS label.
      if (name !== undefined) checkName(problems, join(metaPath, 'name'), name, named);
      optStringMap(problems, join(metaPath, 'labels'), meta.labels, labelProblem);
      optStringMap(problems, join(metaPath, 'annotations'), meta.annotations, (key) => qualifiedNameProblem(key));
    }
    validatePvcSpec(problems, join(at, 'spec'), vct.spec);
  });
  noDuplicates(problems, named);
  return named.map((n) => n.name);
}

function validatePvcSpec(problems: Problems, path: string, value: unknown): void {
  const spec = reqObject(problems, path, value);
  if (spec === undefined) return;
  const modes = optStringArray(problems, join(path, 'accessModes'), spec.accessModes) ?? [];
  modes.forEach((mode, i) => optEnum(problems, join(join(path, 'accessModes'), i), mode, ACCESS_MODES));
  optString(problems, join(path, 'storageClassName'), spec.storageClassName);
  const resourcesPath = join(path, 'resources');
  const resources = reqObject(problems, resourcesPath, spec.resources);
  if (resources === undefined) return;
  const requests = reqObject(problems, join(resourcesPath, 'requests'), resources.requests);
  if (requests === undefined) return;
  const storagePath = join(join(resourcesPath, 'requests'), 'storage');
  if (requests.storage === undefined) {
    report(problems, storagePath, 'is required: the size of the volume, e.g. 1Gi');
    return;
  }
  const size = checkQuantity(problems, storagePath, requests.storage);
  if (size !== undefined && size <= 0) report(problems, storagePath, `must be greater than zero, got ${JSON.stringify(requests.storage)}`);
}

/** podTemplate: `{metadata?, spec}`; `claimVolumes` are the volumeClaimTemplates' names. */
export function validatePodTemplate(problems: Problems, path: string, value: unknown, claimVolumes: readonly string[]): void {
  const template = reqObject(problems, path, value);
  if (template === undefined) return;
  onlyKnown(problems, path, template, ['metadata', 'spec']);
  validatePodMetadata(problems, join(path, 'metadata'), template.metadata);
  validatePodSpec(problems, join(path, 'spec'), template.spec, claimVolumes);
}

function validatePodSpec(problems: Problems, path: string, value: unknown, claimVolumes: readonly string[]): void {
  const spec = reqObject(problems, path, value);
  if (spec === undefined) return;
  const volumeNames = validateVolumes(problems, join(path, 'volumes'), spec.volumes, claimVolumes);
  const mountable = new Set([...volumeNames, ...claimVolumes]);

  const containersPath = join(path, 'containers');
  const containers = optArray(problems, containersPath, spec.containers);
  if (containers === undefined && spec.containers === undefined) report(problems, containersPath, 'is required: at least one container');
  else if (containers?.length === 0) report(problems, containersPath, 'must list at least one container');
  const initContainers = optArray(problems, join(path, 'initContainers'), spec.initContainers) ?? [];
  // Container names are unique across containers and initContainers, as in Kubernetes.
  const named: { name: string; path: string }[] = [];
  for (const [list, listPath] of [[containers ?? [], containersPath], [initContainers, join(path, 'initContainers')]] as const) {
    list.forEach((c, i) => validateContainer(problems, join(listPath, i), c, mountable, named));
  }
  noDuplicates(problems, named);

  optString(problems, join(path, 'runtimeClassName'), spec.runtimeClassName);
  optString(problems, join(path, 'serviceAccountName'), spec.serviceAccountName);
  optBoolean(problems, join(path, 'automountServiceAccountToken'), spec.automountServiceAccountToken);
  const hostname = optString(problems, join(path, 'hostname'), spec.hostname);
  if (hostname !== undefined) reportProblem(problems, join(path, 'hostname'), dnsLabelProblem(hostname));
  optEnum(problems, join(path, 'restartPolicy'), spec.restartPolicy, ['Always', 'OnFailure', 'Never']);
  optInt(problems, join(path, 'terminationGracePeriodSeconds'), spec.terminationGracePeriodSeconds, { min: 0 });
  validateSecurityContext(problems, join(path, 'securityContext'), spec.securityContext, ['runAsUser', 'runAsGroup', 'fsGroup']);
}

function validateVolumes(problems: Problems, path: string, value: unknown, claimVolumes: readonly string[]): string[] {
  const list = optArray(problems, path, value) ?? [];
  const named = claimVolumes.map((name) => ({ name, path: 'a volumeClaimTemplate' }));
  list.forEach((item, i) => {
    const at = join(path, i);
    const volume = optObject(problems, at, item);
    if (volume === undefined) return;
    const name = reqString(problems, join(at, 'name'), volume.name);
    if (name !== undefined) checkName(problems, join(at, 'name'), name, named);
    optObject(problems, join(at, 'emptyDir'), volume.emptyDir);
    const pvc = optObject(problems, join(at, 'persistentVolumeClaim'), volume.persistentVolumeClaim);
    if (pvc !== undefined) checkClaimName(problems, join(join(at, 'persistentVolumeClaim'), 'claimName'), pvc.claimName, claimVolumes);
  });
  noDuplicates(problems, named);
  return named.slice(claimVolumes.length).map((n) => n.name);
}

/**
 * A pod may claim only its own sandbox's volumes: the runtimes make a directory (local) or a PVC
 * `<id>-<name>` (Kubernetes) of that name, so the name must be a DNS label (no '/', no '..': it
 * becomes a path) and one of the volumeClaimTemplates. Tenant isolation: `../<id>/home` once
 * mounted another tenant's volume, and a longer `../..` path a host directory.
 */
function checkClaimName(problems: Problems, path: string, value: unknown, claimVolumes: readonly string[]): void {
  const claim = reqString(problems, path, value);
  if (claim === undefined) return;
  const problem = dnsLabelProblem(claim);
  if (problem !== undefined) report(problems, path, problem);
  else if (!claimVolumes.includes(claim)) {
    const known = claimVolumes.length === 0 ? 'none are declared' : `declared: ${claimVolumes.join(', ')}`;
    report(problems, path, `must name one of this sandbox's volumeClaimTemplates, got ${JSON.stringify(claim)} (${known})`);
  }
}

function validateContainer(
  problems: Problems,
  path: string,
  value: unknown,
  mountable: ReadonlySet<string>,
  named: { name: string; path: string }[],
): void {
  const c = optObject(problems, path, value ?? {});
  if (c === undefined) return;
  const name = reqString(problems, join(path, 'name'), c.name);
  if (name !== undefined) checkName(problems, join(path, 'name'), name, named);
  // `image:` left empty is null in YAML; the k8s-sigs getting-started example does exactly that.
  if (c.image !== null) optString(problems, join(path, 'image'), c.image);
  optStringArray(problems, join(path, 'command'), c.command);
  optStringArray(problems, join(path, 'args'), c.args);
  optString(problems, join(path, 'workingDir'), c.workingDir);
  validateEnv(problems, join(path, 'env'), c.env);
  validatePorts(problems, join(path, 'ports'), c.ports);
  validateMounts(problems, join(path, 'volumeMounts'), c.volumeMounts, mountable);
  validateProbe(problems, join(path, 'readinessProbe'), c.readinessProbe, true);
  validateProbe(problems, join(path, 'livenessProbe'), c.livenessProbe, false);
  validateProbe(problems, join(path, 'startupProbe'), c.startupProbe, false);
  validateResources(problems, join(path, 'resources'), c.resources);
  validateSecurityContext(problems, join(path, 'securityContext'), c.securityContext, ['runAsUser', 'runAsGroup']);
}

function validateEnv(problems: Problems, path: string, value: unknown): void {
  (optArray(problems, path, value) ?? []).forEach((item, i) => {
    const at = join(path, i);
    const env = optObject(problems, at, item);
    if (env === undefined) return;
    reqString(problems, join(at, 'name'), env.name);
    optString(problems, join(at, 'value'), env.value);
    optObject(problems, join(at, 'valueFrom'), env.valueFrom);
  });
}

function validatePorts(problems: Problems, path: string, value: unknown): void {
  (optArray(problems, path, value) ?? []).forEach((item, i) => {
    const at = join(path, i);
    const port = optObject(problems, at, item);
    if (port === undefined) return;
    if (port.containerPort === undefined) report(problems, join(at, 'containerPort'), 'is required');
    optInt(problems, join(at, 'containerPort'), port.containerPort, PORT);
    optInt(problems, join(at, 'hostPort'), port.hostPort, PORT);
    const name = optString(problems, join(at, 'name'), port.name);
    if (name !== undefined) reportProblem(problems, join(at, 'name'), portNameProblem(name));
    optEnum(problems, join(at, 'protocol'), port.protocol, ['TCP', 'UDP', 'SCTP']);
    optString(problems, join(at, 'appProtocol'), port.appProtocol);
  });
}

function validateMounts(problems: Problems, path: string, value: unknown, mountable: ReadonlySet<string>): void {
  (optArray(problems, path, value) ?? []).forEach((item, i) => {
    const at = join(path, i);
    const mount = optObject(problems, at, item);
    if (mount === undefined) return;
    const name = reqString(problems, join(at, 'name'), mount.name);
    if (name !== undefined && !mountable.has(name)) {
      const known = mountable.size === 0 ? 'none are declared' : `declared: ${[...mountable].join(', ')}`;
      report(problems, join(at, 'name'), `must name a volume or volumeClaimTemplate of this pod, got ${JSON.stringify(name)} (${known})`);
    }
    const mountPath = reqString(problems, join(at, 'mountPath'), mount.mountPath);
    if (mountPath !== undefined && !mountPath.startsWith('/')) report(problems, join(at, 'mountPath'), `must be an absolute path, got ${JSON.stringify(mountPath)}`);
    optBoolean(problems, join(at, 'readOnly'), mount.readOnly);
    const subPath = optString(problems, join(at, 'subPath'), mount.subPath);
    if (subPath !== undefined && (subPath.startsWith('/') || subPath.split('/').includes('..'))) {
      report(problems, join(at, 'subPath'), `must be a relative path without '..', got ${JSON.stringify(subPath)}`);
    }
  });
}

function validateProbe(problems: Problems, path: string, value: unknown, readiness: boolean): void {
  const probe = optObject(problems, path, value);
  if (probe === undefined) return;
  const handlers = PROBE_HANDLERS.filter((h) => probe[h] !== undefined);
  if (handlers.length !== 1) {
    const got = handlers.length === 0 ? 'none' : handlers.join(' and ');
    report(problems, path, `must set exactly one of ${PROBE_HANDLERS.join(', ')}, got ${got}`);
  }
  const exec = optObject(problems, join(path, 'exec'), probe.exec);
  if (exec !== undefined) {
    const commandPath = join(join(path, 'exec'), 'command');
    if (exec.command === undefined) report(problems, commandPath, 'is required');
    else if (optStringArray(problems, commandPath, exec.command)?.length === 0) report(problems, commandPath, 'must list the command to run');
  }
  const httpGet = optObject(problems, join(path, 'httpGet'), probe.httpGet);
  if (httpGet !== undefined) {
    checkProbePort(problems, join(join(path, 'httpGet'), 'port'), httpGet.port);
    optString(problems, join(join(path, 'httpGet'), 'path'), httpGet.path);
    optEnum(problems, join(join(path, 'httpGet'), 'scheme'), httpGet.scheme, ['HTTP', 'HTTPS']);
  }
  const tcp = optObject(problems, join(path, 'tcpSocket'), probe.tcpSocket);
  if (tcp !== undefined) checkProbePort(problems, join(join(path, 'tcpSocket'), 'port'), tcp.port);
  const grpc = optObject(problems, join(path, 'grpc'), probe.grpc);
  if (grpc !== undefined) {
    if (grpc.port === undefined) report(problems, join(join(path, 'grpc'), 'port'), 'is required');
    optInt(problems, join(join(path, 'grpc'), 'port'), grpc.port, PORT);
  }
  optInt(problems, join(path, 'initialDelaySeconds'), probe.initialDelaySeconds, { min: 0 });
  for (const key of ['periodSeconds', 'timeoutSeconds', 'failureThreshold']) optInt(problems, join(path, key), probe[key], { min: 1 });
  // Kubernetes: liveness and startup probes stop at the first success, so it must be 1.
  optInt(problems, join(path, 'successThreshold'), probe.successThreshold, readiness ? { min: 1 } : { min: 1, max: 1 });
}

function checkProbePort(problems: Problems, path: string, value: unknown): void {
  if (value === undefined) {
    report(problems, path, 'is required');
  } else if (typeof value === 'string') {
    reportProblem(problems, path, portNameProblem(value));
  } else if (typeof value === 'number') {
    optInt(problems, path, value, PORT);
  } else {
    report(problems, path, `must be a port number or a port name, got ${typeOf(value)}`);
  }
}

function validateResources(problems: Problems, path: string, value: unknown): void {
  const resources = optObject(problems, path, value);
  if (resources === undefined) return;
  for (const key of ['limits', 'requests']) {
    const map = optObject(problems, join(path, key), resources[key]);
    for (const [resource, quantity] of Object.entries(map ?? {})) checkQuantity(problems, join(join(path, key), resource), quantity);
  }
}

function validateSecurityContext(problems: Problems, path: string, value: unknown, ids: readonly string[]): void {
  const ctx = optObject(problems, path, value);
  if (ctx === undefined) return;
  for (const key of ids) optInt(problems, join(path, key), ctx[key], { min: 0 });
  optBoolean(problems, join(path, 'runAsNonRoot'), ctx.runAsNonRoot);
}

function checkQuantity(problems: Problems, path: string, value: unknown): number | undefined {
  const parsed = typeof value === 'string' || typeof value === 'number' ? parseQuantity(value) : undefined;
  if (parsed === undefined) report(problems, path, `must be a quantity such as 1Gi, 500Mi or 0.5, got ${typeof value === 'string' ? JSON.stringify(value) : typeOf(value)}`);
  return parsed;
}

function checkName(problems: Problems, path: string, name: string, named: { name: string; path: string }[]): void {
  const problem = dnsLabelProblem(name);
  if (problem === undefined) named.push({ name, path });
  else report(problems, path, problem);
}

function reportProblem(problems: Problems, path: string, problem: string | undefined): void {
  if (problem !== undefined) report(problems, path, problem);
}
