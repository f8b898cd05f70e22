// State that only the user running asb may read: the stores (store.db holds every sandbox's
// spec, E2B envVars included, e.g. OPENAI_API_KEY; hub.db the key hashes), the logs (Envoy's
// access log names every sandbox host), keys and secrets. With the process umask (022 on most
// systems) they came out 0644 in 0755 directories: the security probe (row M4) read another
// team's envVars as user `nobody`. Directories are made 0700 and files 0600, both when created and
// when an older run left them open (mkdir and open with a mode do not change an existing one).
//
// Not the pods' own files: a sandbox's rootfs keeps the modes its processes expect (/tmp 1777);
// it sits under a data directory that is 0700, so no other host user reaches it.
import { chmodSync, closeSync, existsSync, mkdirSync, openSync, statSync } from 'node:fs';

const PRIVATE_DIR_MODE = 0o700;
const PRIVATE_FILE_MODE = 0o600;

/**
 * `mkdir -p` with mode 0700, and the last directory made 0700 if it already existed and is ours.
 * One owned by another user is left as it is: on Kubernetes the data dir is a volume's mount
 * point (root's, group fsGroup) and the worker runs as uid 1000, which may not chmod it; the
 * pod is the boundary there, and the files made inside are 0600 all the same.
 */
export function privateDir(path: string): void {
  mkdirSync(path, { recursive: true, mode: PRIVATE_DIR_MODE });
  if (statSync(path).uid === process.getuid?.()) chmodSync(path, PRIVATE_DIR_MODE);
}

/** Opens path for appending (a child's log), created 0600 or made 0600. The caller closes the fd. */
export function openPrivateLog(path: string): number {
  const fd = openSync(path, 'a', PRIVATE_FILE_MODE);
  try {
    chmodSync(path, PRIVATE_FILE_MODE);
  } catch (err) {
    closeSync(fd);
    throw err;
  }
  return fd;
}

/** Creates path empty with mode 0600 if it does not exist (for a file another program opens: SQLite, Envoy), else makes it 0600. */
export function privateFile(path: string): void {
  closeSync(openPrivateLog(path));
}

/** Makes each of paths that exists 0600 (SQLite's -wal and -shm from an older run). */
export function restrictExisting(paths: readonly string[]): void {
  for (const path of paths) if (existsSync(path)) chmodSync(path, PRIVATE_FILE_MODE);
}
