// The parent cgroup of one runtime's pods (`/asb-<hash of its root>`; runc makes each pod's below
// it). Each pod has its own pids limit (spec.ts, 1024), but 32 sandboxes each at their limit would
// take every pid of this host (pid_max 32768): the parent's limit keeps half of pid_max for the
// host, however many sandboxes run a fork bomb at once. cgroup v1 (this host: the pids controller
// at /sys/fs/cgroup/pids) and v2 (one tree, when pids is enabled there).
import { mkdir, readdir, readFile, rmdir, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

const CGROUP_ROOT = '/sys/fs/cgroup';

/** Every pod of the runtime together: half of the host's pids. */
export async function parentPidsLimit(): Promise<number> {
  const pidMax = Number.parseInt(await readFile('/proc/sys/kernel/pid_max', 'utf8'), 10);
  return Math.floor((Number.isFinite(pidMax) ? pidMax : 32_768) / 2);
}

/** The directory of the pids controller for `parent` (v1 or v2), or undefined when neither has one. */
async function pidsDir(parent: string): Promise<string | undefined> {
  const v1 = join(CGROUP_ROOT, 'pids');
  if (await isDir(v1)) return join(v1, parent);
  const controllers = await readFile(join(CGROUP_ROOT, 'cgroup.controllers'), 'utf8').catch(() => '');
  return controllers.split(/\s+/).includes('pids') ? join(CGROUP_ROOT, parent) : undefined;
}

/** Makes the parent and sets its pids.max; false when this host has no pids controller. */
export async function limitParentPids(parent: string, max: number): Promise<boolean> {
  const dir = await pidsDir(parent);
  if (dir === undefined) return false;
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'pids.max'), `${String(max)}\n`);
  return true;
}

/** Removes the parent from every hierarchy where it is empty (best effort: a pod left running keeps it). */
export async function removeParent(parent: string): Promise<void> {
  const dirs = [join(CGROUP_ROOT, parent)];
  for (const controller of await readdir(CGROUP_ROOT).catch(() => [])) dirs.push(join(CGROUP_ROOT, controller, parent));
  await Promise.all(dirs.map((dir) => rmdir(dir).catch(() => undefined)));
}

async function isDir(path: string): Promise<boolean> {
  return (await stat(path).catch(() => undefined))?.isDirectory() === true;
}
