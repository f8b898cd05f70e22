// The on-disk layout of a local pod. Everything a pod writes lives under <root>/pods/<id>/, so
// hibernation (stop) and a worker or machine restart keep the whole writable filesystem:
//   disk.img             a sparse ext4 image of the pod's ephemeral-storage limit (disk.ts), the
//                        only place the sandbox writes to; mounted at disk/ while the pod runs:
//     disk/upper/        the container's writable layer over its image (overlayfs upper dir)
//     disk/work/         overlayfs work dir
//     disk/empty/<name>  emptyDir volumes (they survive hibernation too, unlike on Kubernetes)
//     disk/volumes/<claim>  the pod's volumeClaimTemplates' volumes
//     disk/container.log the container's stdout and stderr (the kubelet counts logs too)
//     disk/tmp/          gVisor pods only: their /tmp (runscSpec's tmpDir; runc keeps /tmp in upper/)
//   etc/                 the runtime's /etc/hostname and /etc/hosts, bind-mounted read-only
//   exec/                runc exec's pid files, one per running process
//   netns                gVisor pods only, while running: the network namespace the shim made
//   userns               runc pods with a range of their own, while running: their user namespace
//   config.json          the OCI bundle's config (the pod dir is the bundle)
//   state.json           the request, ip, init pid and its start time (guards against pid reuse)
//   runc.log             what runc said
//   exit-status          the init's exit code, written by the shim (oci-shim.c) when the pod ends
//   checkpoint/          gVisor pods paused with memory: runsc's image and its metadata (checkpoint.ts
//                        says why here and not on the pod's disk); checkpoint.partial/ while it is written
//   restore-status       written by the shim at a start from a checkpoint: "restored" or "failed <why>"
// A pod dir made before disks has upper/, work/, empty/ and container.log in the pod dir itself
// and its claim volumes in <root>/volumes/<id>/ (legacyLayout): it wakes as it was, uncapped.
import { readFile, writeFile, rename } from 'node:fs/promises';
import { join } from 'node:path';
import type { ImageConfig } from '../../images/image-store.ts';
import type { IdRange } from '../oci/spec.ts';
import type { PodRequest } from '../runtime.ts';

export interface PodPaths {
  dir: string;
  /** The pod's disk: its image and mount point; undefined in a pod dir made before disks. */
  disk: { image: string; mount: string } | undefined;
  upper: string;
  work: string;
  etc: string;
  /** runc exec's pid files. */
  exec: string;
  /** gVisor pods' /tmp, bound by runscSpec (gVisor would put a memory tmpfs there, lost at hibernation). */
  tmp: string;
  /** gVisor pods' network namespace file (oci-shim.c -N). */
  netns: string;
  /** runc pods' user namespace file, owned by the pod's own host range (oci-shim.c -u). */
  userns: string;
  /** gVisor pods' memory checkpoint (checkpoint.ts), and where one is written before it is sealed. */
  checkpoint: string;
  checkpointPartial: string;
  /** What the shim says of a restore (oci-shim.c -C). */
  restoreStatus: string;
  state: string;
  exitStatus: string;
  log: string;
  emptyDirs: string;
  volumes: string;
  /** Where a pod dir made before disks keeps its claim volumes: remove() deletes it too. */
  legacyVolumes: string;
}

export function podPaths(root: string, id: string): PodPaths {
  const dir = join(root, 'pods', id);
  const mount = join(dir, 'disk');
  return {
    dir,
    disk: { image: join(dir, 'disk.img'), mount },
    upper: join(mount, 'upper'),
    work: join(mount, 'work'),
    etc: join(dir, 'etc'),
    exec: join(dir, 'exec'),
    tmp: join(mount, 'tmp'),
    netns: join(dir, 'netns'),
    userns: join(dir, 'userns'),
    checkpoint: join(dir, 'checkpoint'),
    checkpointPartial: join(dir, 'checkpoint.partial'),
    restoreStatus: join(dir, 'restore-status'),
    state: join(dir, 'state.json'),
    exitStatus: join(dir, 'exit-status'),
    log: join(mount, 'container.log'),
    emptyDirs: join(mount, 'empty'),
    volumes: join(mount, 'volumes'),
    legacyVolumes: join(root, 'volumes', id),
  };
}

/** The layout of a pod dir made before disks: no image, its files in plain directories on the host's disk. */
export function legacyLayout(paths: PodPaths): PodPaths {
  const { dir } = paths;
  return { ...paths, disk: undefined, upper: join(dir, 'upper'), work: join(dir, 'work'), tmp: join(dir, 'tmp'), log: join(dir, 'container.log'), emptyDirs: join(dir, 'empty'), volumes: paths.legacyVolumes };
}

/** The image bytes a pod runs: a wake uses them again even if the tag moved since. */
export interface PersistedImage {
  /** As the pod names it. */
  reference: string;
  manifestDigest: string;
  /** The cached (id-mapped) tree: the overlay's lowerdir. */
  rootfs: string;
  config: ImageConfig;
}

export interface PersistedPod {
  request: PodRequest;
  ip: string;
  /**
   * The pod's own host id range (id-ranges.ts), kept for its whole life: its files are owned by
   * it. Absent in a pod made before ranges: it keeps the range every sandbox shared (ROOT_ID_MAP).
   */
  idRange?: IdRange;
  image?: PersistedImage;
  /** Host pid of the pod's init while it runs. */
  pid?: number;
  /** Field 22 of /proc/<pid>/stat when the init started: a reused pid has another value. */
  pidStart?: string;
  startedAt?: string;
  /** Why the checkpoint this run was to start from was not restored (it started from its files instead). */
  restoreFailure?: string;
}

export async function readPersisted(paths: PodPaths): Promise<PersistedPod | undefined> {
  try {
    return JSON.parse(await readFile(paths.state, 'utf8')) as PersistedPod;
  } catch {
    return undefined;
  }
}

export async function writePersisted(paths: PodPaths, pod: PersistedPod): Promise<void> {
  const tmp = `${paths.state}.tmp`;
  await writeFile(tmp, JSON.stringify(pod));
  await rename(tmp, paths.state);
}

/** The init's exit code and, when the kernel's OOM killer struck, reason OOMKilled (oci-shim.c writes "137 OOMKilled"). */
export async function readExitStatus(paths: PodPaths): Promise<{ code: number; reason?: string } | undefined> {
  try {
    const [codeText = '', reason] = (await readFile(paths.exitStatus, 'utf8')).trim().split(' ');
    const code = Number.parseInt(codeText, 10);
    if (Number.isNaN(code)) return undefined;
    return reason === undefined ? { code } : { code, reason };
  } catch {
    return undefined;
  }
}

/** The start time of a live process, or undefined when it is gone. */
export async function processStartTime(pid: number): Promise<string | undefined> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    // The command name (field 2) may hold spaces and parens: fields after the last ')' are fixed.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (fields[0] === 'Z' || fields[0] === 'X') return undefined;
    return fields[19];
  } catch {
    return undefined;
  }
}
