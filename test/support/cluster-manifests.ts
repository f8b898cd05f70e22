// Helpers for checking the Kubernetes manifests under clusters/ without a cluster: build a
// kustomization with kubectl's built-in kustomize, and lay out what one container of a built
// Deployment would see (its command line with $(VAR) expanded, its environment from env and
// envFrom, and its mounted ConfigMaps, Secrets and volumes as directories under a temp root), so a
// test can run our real configuration parsers and Envoy on exactly that.
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { parseAllDocuments } from 'yaml';

const repoRoot = resolve(import.meta.dirname, '../..');
/** kubectl from `make kube-tools` (scripts/kube-tools.sh); its kustomize is built in. */
export const KUBECTL = join(repoRoot, '.tools/kube/bin/kubectl');

export interface Manifest {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  [field: string]: unknown;
}

export interface VolumeMount { name: string; mountPath: string; subPath?: string; readOnly?: boolean }
export interface ContainerSpec {
  name: string;
  image: string;
  command?: string[];
  args?: string[];
  env?: { name: string; value?: string }[];
  envFrom?: { configMapRef?: { name: string }; secretRef?: { name: string } }[];
  ports?: { name?: string; containerPort: number }[];
  volumeMounts?: VolumeMount[];
  securityContext?: Record<string, unknown>;
}
export interface Volume {
  name: string;
  configMap?: { name: string };
  secret?: { secretName: string };
  emptyDir?: Record<string, unknown>;
  persistentVolumeClaim?: { claimName: string };
}
export interface PodSpec {
  serviceAccountName?: string;
  automountServiceAccountToken?: boolean;
  securityContext?: Record<string, unknown>;
  containers: ContainerSpec[];
  volumes?: Volume[];
}
export interface Deployment extends Manifest {
  spec: { selector: { matchLabels: Record<string, string> }; template: { metadata: { labels: Record<string, string> }; spec: PodSpec } };
}

/** `kubectl kustomize <dir>`, parsed. */
export async function kustomize(dir: string): Promise<Manifest[]> {
  if (!existsSync(KUBECTL)) throw new Error(`${KUBECTL} is missing: run \`make kube-tools\` (make test does)`);
  const out = await new Promise<string>((resolvePromise, reject) => {
    execFile(KUBECTL, ['kustomize', join(repoRoot, dir)], { maxBuffer: 64 * 1024 * 1024, timeout: 60_000 }, (err, stdout, stderr) => {
      if (err !== null) reject(new Error(`kubectl kustomize ${dir} failed: ${stderr.trim() || err.message}`));
      else resolvePromise(stdout);
    });
  });
  return parseAllDocuments(out).map((doc) => doc.toJS() as Manifest).filter((m) => (m as unknown) !== null);
}

export function ofKind<T extends Manifest>(manifests: readonly Manifest[], kind: string): T[] {
  return manifests.filter((m) => m.kind === kind) as T[];
}

/** The data of a ConfigMap or Secret (Secret data decoded, stringData as is). */
export function dataOf(obj: Manifest): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries((obj.data ?? {}) as Record<string, string>)) out[k] = obj.kind === 'Secret' ? Buffer.from(v, 'base64').toString('utf8') : v;
  for (const [k, v] of Object.entries((obj.stringData ?? {}) as Record<string, string>)) out[k] = v;
  return out;
}

export interface ContainerView {
  /** command + args with every $(VAR) of the container's environment expanded and mounted paths mapped into root. */
  argv: string[];
  /** The environment from env and envFrom, as written: map a value with path() once it is read. */
  env: Record<string, string>;
  /** Problems a kubelet would have: a missing ConfigMap, a Secret the test was not given, an unknown $(VAR), a file path on no volume. */
  problems: string[];
  /**
   * Maps a value naming absolute paths inside the container (whole, or after a flag's `=`) to
   * where they are laid out under root; a path on no volume is added to problems.
   */
  path(inContainer: string): string;
}

/**
 * What `container` of `pod` sees, its volumes laid out under `root`: ConfigMaps from the build,
 * Secrets from `secrets` (name → key → content), empty directories for emptyDir and PVCs.
 */
export function viewContainer(build: readonly Manifest[], pod: PodSpec, container: ContainerSpec, secrets: Readonly<Record<string, Record<string, string>>>, root: string): ContainerView {
  const problems: string[] = [];
  const configMaps = new Map(ofKind(build, 'ConfigMap').map((cm) => [cm.metadata.name, dataOf(cm)]));
  const env: Record<string, string> = {};
  for (const from of container.envFrom ?? []) {
    const name = from.configMapRef?.name ?? from.secretRef?.name ?? '';
    const data = from.configMapRef !== undefined ? configMaps.get(name) : secrets[name];
    if (data === undefined) problems.push(`envFrom ${name}: no such ${from.configMapRef !== undefined ? 'ConfigMap' : 'Secret'}`);
    Object.assign(env, data ?? {});
  }
  for (const e of container.env ?? []) env[e.name] = e.value ?? '';

  // Mount points, longest first so a file mounted inside a directory mount maps to its own file.
  const mounts: { at: string; to: string }[] = [];
  for (const mount of container.volumeMounts ?? []) {
    const volume = pod.volumes?.find((v) => v.name === mount.name);
    if (volume === undefined) {
      problems.push(`volumeMount ${mount.name}: no such volume`);
      continue;
    }
    const dir = join(root, container.name, volume.name);
    mkdirSync(dir, { recursive: true });
    let files: Record<string, string> | undefined = {};
    if (volume.configMap !== undefined) files = configMaps.get(volume.configMap.name);
    if (volume.secret !== undefined) files = secrets[volume.secret.secretName];
    if (files === undefined) problems.push(`volume ${volume.name}: ${volume.configMap !== undefined ? 'ConfigMap' : 'Secret'} ${volume.configMap?.name ?? volume.secret?.secretName ?? ''} is not there`);
    for (const [file, text] of Object.entries(files ?? {})) writeFileSync(join(dir, file), text);
    if (mount.subPath !== undefined && !existsSync(join(dir, mount.subPath))) problems.push(`volumeMount ${mount.mountPath}: ${volume.name} has no ${mount.subPath}`);
    mounts.push({ at: mount.mountPath, to: mount.subPath === undefined ? dir : join(dir, mount.subPath) });
  }
  mounts.sort((a, b) => b.at.length - a.at.length);

  const mapPath = (value: string): string => {
    // Every absolute path our processes read (after a flag's `=` or whole) must be on a volume.
    return value.replace(/(^|=)(\/(?:etc|var)\/[^\s]*)/g, (_m, lead: string, path: string) => {
      const mount = mounts.find((m) => path === m.at || path.startsWith(`${m.at}/`));
      if (mount === undefined) {
        problems.push(`${path} is on no mounted volume`);
        return `${lead}${path}`;
      }
      const mapped = mount.to + path.slice(mount.at.length);
      mkdirSync(dirname(mapped), { recursive: true });
      return `${lead}${mapped}`;
    });
  };
  const expand = (value: string): string => value.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (whole, name: string) => {
    const v = env[name];
    if (v === undefined) problems.push(`${whole} is not in the container's environment`);
    return v ?? whole;
  });
  const argv = [...(container.command ?? []), ...(container.args ?? [])].map((a) => mapPath(expand(a)));
  return { argv, env, problems, path: mapPath };
}
