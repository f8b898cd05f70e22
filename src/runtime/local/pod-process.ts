// A pod's main container and the host directories behind its volumeMounts.
import { chown, lstat, mkdir, realpath } from 'node:fs/promises';
import { basename, dirname, join, posix, resolve } from 'node:path';
import type { Container, PodSpec } from '../../api/types.ts';
import type { PodRequest } from '../runtime.ts';
import type { PodPaths } from './rootfs.ts';

export interface PodMount {
  src: string;
  dst: string;
  readOnly: boolean;
}

export function mainContainer(spec: PodSpec): Container {
  const container = spec.containers[0];
  if (container === undefined) throw new Error('the pod has no containers');
  return container;
}

/** A volume's directory name: a DNS label (as the API requires), so never '/', '.' or '..'. */
const VOLUME_NAME = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

/**
 * The host directory behind one volumeMount, always a child of the pod's volumes root (claims)
 * or emptyDir root. A persistentVolumeClaim may name only one of the pod's own
 * volumeClaimTemplates. The API refuses anything else with 422 (validate-pod.ts); this is the
 * runtime's own guard for a request that did not pass there (tenant isolation: a claimName of
 * `../<id>/home` bound another tenant's volume, and `../../..` a host directory).
 */
export function volumeDir(req: PodRequest, mountName: string, paths: PodPaths): string {
  const claims = new Set((req.volumeClaimTemplates ?? []).map((t) => t.metadata.name));
  const claim = req.spec.volumes?.find((v) => v.name === mountName)?.persistentVolumeClaim?.claimName;
  let root = paths.emptyDirs;
  let name = mountName;
  if (claims.has(mountName)) {
    root = paths.volumes;
  } else if (claim !== undefined) {
    if (!claims.has(claim)) throw new Error(`volume "${mountName}" claims ${JSON.stringify(claim)}, which is not one of this pod's volumeClaimTemplates`);
    root = paths.volumes;
    name = claim;
  }
  const dir = resolve(root, name);
  if (!VOLUME_NAME.test(name) || dirname(dir) !== resolve(root)) throw new Error(`volume "${mountName}" resolves to ${JSON.stringify(name)}, outside the pod's volumes`);
  return dir;
}

/** Host directories for the container's volumeMounts, created on first use and owned by the pod user. */
export async function resolveMounts(req: PodRequest, container: Container, paths: PodPaths, owner: { uid: number; gid: number }): Promise<PodMount[]> {
  const mounts: PodMount[] = [];
  for (const m of container.volumeMounts ?? []) {
    const dir = volumeDir(req, m.name, paths);
    if (await mkdir(dir, { recursive: true }) !== undefined) await chown(dir, owner.uid, owner.gid);
    // The pod cannot reach its volumes' parent, but a symlink put there must not lead the bind out either.
    const realDir = await realpath(dir);
    if (realDir !== join(await realpath(dirname(dir)), basename(dir))) throw new Error(`volume "${m.name}" leads outside the pod's volumes`);
    let src = dir;
    if (m.subPath !== undefined && m.subPath !== '') {
      src = await makeSubPath(dir, m.subPath, m.name, owner);
      // The volume's content is the sandbox's: a symlink in it must not lead the bind outside.
      const real = await realpath(src);
      if (real !== realDir && !real.startsWith(`${realDir}/`)) throw new Error(`subPath "${m.subPath}" of volume "${m.name}" leaves the volume`);
    }
    mounts.push({ src, dst: posix.resolve('/', m.mountPath), readOnly: m.readOnly ?? false });
  }
  return mounts;
}

/**
 * The subPath's directory under a volume, made one component at a time and never through a
 * symlink: the volume's content is the sandbox's, and `mkdir -p` plus `chown` as host root followed
 * a symlink the sandbox planted there, making a sandbox-owned directory anywhere on the host
 * (test/security-runtime.test.ts). The sandbox is not running while its pod starts, so nothing
 * changes the path between the check and the use.
 */
async function makeSubPath(volume: string, subPath: string, name: string, owner: { uid: number; gid: number }): Promise<string> {
  let at = volume;
  for (const part of posix.normalize(subPath).split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') throw new Error(`subPath "${subPath}" of volume "${name}" leaves the volume`);
    at = join(at, part);
    const found = await lstat(at).catch((err: unknown) => {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw err;
    });
    if (found === undefined) {
      await mkdir(at);
      await chown(at, owner.uid, owner.gid);
    } else if (!found.isDirectory()) {
      throw new Error(`subPath "${subPath}" of volume "${name}" goes through ${found.isSymbolicLink() ? 'a symlink' : 'a file'} at ${JSON.stringify(part)}`);
    }
  }
  return at;
}
