// The on-disk layout of a local pod. Everything a pod writes lives under <root>/pods/<id>/ and its
// claim volumes under <root>/volumes/<id>/, so hibernation (stop) and a worker or machine restart
// keep the whole writable filesystem:
//   rootfs/              the pod's `/`: tmp, root, home/user, var, ... are plain persistent dirs
//   upper/usr, upper/etc the private writable layers over the host's /usr and /etc (overlayfs)
//   work/...             overlayfs work dirs
//   empty/<name>         emptyDir volumes (they survive hibernation too, unlike on Kubernetes)
//   state.json           the request, ip, init pid and its start time (guards against pid reuse)
//   container.log        the container's stdout and stderr
//   exit-status          the init's exit code, written by the shim when the pod ends
import { readFile, writeFile, mkdir, rename } from 'node:fs/promises';
import { join } from 'node:path';
import type { PodRequest } from '../runtime.ts';

export interface PodPaths {
  dir: string;
  rootfs: string;
  upperEtc: string;
  state: string;
  exitStatus: string;
  log: string;
  emptyDirs: string;
  volumes: string;
}

export function podPaths(root: string, id: string): PodPaths {
  const dir = join(root, 'pods', id);
  return {
    dir,
    rootfs: join(dir, 'rootfs'),
    upperEtc: join(dir, 'upper', 'etc'),
    state: join(dir, 'state.json'),
    exitStatus: join(dir, 'exit-status'),
    log: join(dir, 'container.log'),
    emptyDirs: join(dir, 'empty'),
    volumes: join(root, 'volumes', id),
  };
}

export interface PersistedPod {
  request: PodRequest;
  ip: string;
  /** Host pid of the pod's init while it runs. */
  pid?: number;
  /** Field 22 of /proc/<pid>/stat when the init started: a reused pid has another value. */
  pidStart?: string;
  startedAt?: string;
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

export async function readExitStatus(paths: PodPaths): Promise<number | undefined> {
  try {
    const code = Number.parseInt(await readFile(paths.exitStatus, 'utf8'), 10);
    return Number.isNaN(code) ? undefined : code;
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

let hostAccounts: Promise<{ passwd: string; group: string }> | undefined;

async function readHostAccounts(): Promise<{ passwd: string; group: string }> {
  const [passwd, group] = await Promise.all([readFile('/etc/passwd', 'utf8'), readFile('/etc/group', 'utf8')]);
  return { passwd, group };
}

/** The host's account files with uid/gid 1000 replaced by the sandbox user `user`. */
function sandboxAccounts(host: { passwd: string; group: string }): { passwd: string; group: string } {
  const keep = (text: string, idField: number): string[] =>
    text.split('\n').filter((line) => line !== '' && line.split(':')[idField] !== '1000' && !line.startsWith('user:'));
  return {
    passwd: [...keep(host.passwd, 2), 'user:x:1000:1000:Sandbox user:/home/user:/bin/bash', ''].join('\n'),
    group: [...keep(host.group, 2), 'user:x:1000:', ''].join('\n'),
  };
}

/**
 * Writes the pod's own /etc files into its /etc layer: hostname and hosts on every start (cheap,
 * and a renamed pod gets its new name), passwd and group once, so the sandbox user exists.
 */
export async function prepareEtc(paths: PodPaths, hostname: string, ip: string, firstStart: boolean): Promise<void> {
  await mkdir(paths.upperEtc, { recursive: true });
  const writes = [
    writeFile(join(paths.upperEtc, 'hostname'), `${hostname}\n`),
    writeFile(join(paths.upperEtc, 'hosts'), `127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n${ip}\t${hostname}\n`),
  ];
  if (firstStart) {
    hostAccounts ??= readHostAccounts();
    const accounts = sandboxAccounts(await hostAccounts);
    writes.push(writeFile(join(paths.upperEtc, 'passwd'), accounts.passwd), writeFile(join(paths.upperEtc, 'group'), accounts.group));
  }
  await Promise.all(writes);
}
