// What the pod's main process is: its argv (Kubernetes semantics for command/args, with no image
// entrypoint to fall back on), user, environment, working dir and volume mounts, and the
// pod-init argv that starts it.
import { chown, mkdir, realpath } from 'node:fs/promises';
import { join, posix } from 'node:path';
import type { Container, PodSpec } from '../../api/types.ts';
import type { PodRequest } from '../runtime.ts';
import type { PodPaths } from './rootfs.ts';

export const SANDBOX_UID = 1000;
export const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** The host directories a pod sees through a private writable overlay; the rest of `/` is its own. */
export const OVERLAY_DIRS = ['/usr', '/etc'] as const;

export interface PodMount {
  src: string;
  dst: string;
  readOnly: boolean;
}

export interface PodProcess {
  uid: number;
  gid: number;
  env: Record<string, string>;
  cwd: string;
  argv: string[];
  mounts: PodMount[];
}

export function mainContainer(spec: PodSpec): Container {
  const container = spec.containers[0];
  if (container === undefined) throw new Error('the pod has no containers');
  return container;
}

export function podUser(spec: PodSpec, container: Container): { uid: number; gid: number } {
  const uid = container.securityContext?.runAsUser ?? spec.securityContext?.runAsUser ?? SANDBOX_UID;
  const gid = container.securityContext?.runAsGroup ?? spec.securityContext?.runAsGroup ?? (uid === 0 ? 0 : SANDBOX_UID);
  return { uid, gid };
}

export function podEnv(req: PodRequest, container: Container, uid: number): Record<string, string> {
  const env: Record<string, string> = {
    PATH: DEFAULT_PATH,
    HOME: uid === 0 ? '/root' : '/home/user',
    USER: uid === 0 ? 'root' : 'user',
    HOSTNAME: req.hostname,
    LANG: 'C.UTF-8',
    TERM: 'xterm-256color',
  };
  for (const v of container.env ?? []) env[v.name] = v.value ?? '';
  return env;
}

/** command + args as Kubernetes runs them; with neither, the pod idles (the image has no entrypoint). */
export function containerArgv(container: Container): string[] {
  const command = container.command ?? [];
  const args = container.args ?? [];
  const argv = [...command, ...args];
  return argv.length > 0 ? argv : ['sleep', 'infinity'];
}

/** Host directories for the container's volumeMounts, created on first use and owned by the pod user. */
export async function resolveMounts(req: PodRequest, container: Container, paths: PodPaths, owner: { uid: number; gid: number }): Promise<PodMount[]> {
  const claims = new Set((req.volumeClaimTemplates ?? []).map((t) => t.metadata.name));
  const mounts: PodMount[] = [];
  for (const m of container.volumeMounts ?? []) {
    const volume = req.spec.volumes?.find((v) => v.name === m.name);
    const claim = volume?.persistentVolumeClaim?.claimName;
    const dir = claims.has(m.name) ? join(paths.volumes, m.name)
      : claim !== undefined ? join(paths.volumes, claim)
      : join(paths.emptyDirs, m.name);
    if (await mkdir(dir, { recursive: true }) !== undefined) await chown(dir, owner.uid, owner.gid);
    let src = dir;
    if (m.subPath !== undefined && m.subPath !== '') {
      src = join(dir, posix.normalize(m.subPath));
      if (await mkdir(src, { recursive: true }) !== undefined) await chown(src, owner.uid, owner.gid);
      // The volume's content is the sandbox's: a symlink in it must not lead the bind outside.
      const real = await realpath(src);
      if (real !== dir && !real.startsWith(`${await realpath(dir)}/`)) throw new Error(`subPath "${m.subPath}" of volume "${m.name}" leaves the volume`);
    }
    mounts.push({ src, dst: posix.resolve('/', m.mountPath), readOnly: m.readOnly ?? false });
  }
  return mounts;
}

export interface InitNetwork {
  ip: string;
  prefix: number;
  gateway: string;
}

export function initArgs(paths: PodPaths, hostname: string, proc: PodProcess, net: InitNetwork | undefined, userns: boolean): string[] {
  const args = ['-d', paths.dir, '-h', hostname, '-u', String(proc.uid), '-g', String(proc.gid), '-w', proc.cwd];
  if (net !== undefined) args.push('-n', net.ip, String(net.prefix), net.gateway);
  if (userns) args.push('-U');
  for (const dir of OVERLAY_DIRS) args.push('-o', dir);
  for (const m of proc.mounts) args.push('-v', m.src, m.dst, m.readOnly ? 'ro' : 'rw');
  for (const [k, v] of Object.entries(proc.env)) args.push('-e', `${k}=${v}`);
  args.push('--', ...proc.argv);
  return args;
}
