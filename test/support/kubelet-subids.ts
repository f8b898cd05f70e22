// The host ids a test node's kubelet gives its user-namespaced Pods (hostUsers: false), kept
// apart from the local runtime's pool (src/runtime/local/id-ranges.ts: 65,536-id ranges from
// 2^20 up, lowest free first). With no subordinate ids for a `kubelet` user, the kubelet picks a
// random 65,536-id range of all 2^32 for each Pod (pkg/kubelet/userns: AllocateNext of a random
// allocation map over [65536, 2^32)), so a Pod of the Kubernetes tier could be given host ids a
// local sandbox holds while both lanes of `make test` run. The kubelet takes its ids from
// `getsubids kubelet` when a `kubelet` user exists (pkg/kubelet/kubelet_pods.go
// getKubeletMappings, read once at its start): so while a node runs, the host has a system user
// `kubelet` (marked as ours in its comment field) with subordinate uids and gids
// [2^31, 2^32 - 2^16): 32,767 ranges for the node's maxPods 250, which the local pool reaches
// only after 32,752 sandboxes at once. Its last range is left out: it would hold uid 2^32 - 1,
// which is no uid. Two node slots share the one user and draw from it at random, as they drew
// from all 2^32 before.
//
// Written when a node reserves its slot (idempotent) and removed, under a lock across processes,
// when the last node's directory on the machine is gone; a user of that name that is not ours is
// never touched. The subordinate ids go in before the user exists and with it (userdel writes
// passwd first): a kubelet starting meanwhile either finds no user (and its own default) or a
// user with its ids, never a user without them, which would keep it from starting.
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ID_RANGE_SIZE } from '../../src/runtime/local/id-ranges.ts';
import { acquireOwnerLock, OwnerLockHeld, type OwnerLock } from '../../src/store/owner-lock.ts';

/** The user whose subordinate ids the kubelet reads (a fixed name in the kubelet). */
export const KUBELET_USER = 'kubelet';
/** [start, start + count): the node's Pods' host ids. */
export const KUBELET_SUBIDS = { start: 2 ** 31, count: 2 ** 31 - ID_RANGE_SIZE } as const;
/** The comment field of the user we add: only a user with it is ours to change or delete. */
const OURS = 'asb test node (test/support/kubelet-subids.ts)';
const SUBID_FILES = ['/etc/subuid', '/etc/subgid'] as const;
const LOCK = join(tmpdir(), 'asb-kubelet-subids');
const LOCK_TRIES = 200;
const LOCK_POLL_MS = 50;

const line = `${KUBELET_USER}:${String(KUBELET_SUBIDS.start)}:${String(KUBELET_SUBIDS.count)}`;

function pauseMs(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/** Synchronous (the release runs from an exit hook too): up to 10 s for another process's few milliseconds. */
function locked(step: () => void): void {
  let lock: OwnerLock | undefined;
  for (let i = 0; lock === undefined; i++) {
    try {
      lock = acquireOwnerLock(LOCK, 'the test kubelet user\'s subordinate ids');
    } catch (err) {
      if (!(err instanceof OwnerLockHeld) || i >= LOCK_TRIES) throw err;
      pauseMs(LOCK_POLL_MS);
    }
  }
  try {
    step();
  } finally {
    lock.release();
  }
}

/** The passwd entry's comment field of the kubelet user, or undefined when there is no such user. */
function kubeletComment(): string | undefined {
  const entry = readFileSync('/etc/passwd', 'utf8').split('\n').find((l) => l.startsWith(`${KUBELET_USER}:`));
  return entry?.split(':')[4];
}

/** Rewrites a subid file without the lines `drop` picks, plus `add` (whole, then renamed into place). */
function rewriteSubids(path: string, drop: (l: string) => boolean, add?: string): void {
  const kept = readFileSync(path, 'utf8').split('\n').filter((l) => l !== '' && !drop(l));
  const text = [...kept, ...(add === undefined ? [] : [add])].map((l) => `${l}\n`).join('');
  const tmp = `${path}.asb-${String(process.pid)}`;
  writeFileSync(tmp, text, { mode: 0o644 });
  renameSync(tmp, path);
}

/** The kubelet user and its subordinate ids as KUBELET_SUBIDS says; nothing is changed when they are there, or when the user is not ours. */
export function ensureKubeletSubids(): void {
  locked(() => {
    const comment = kubeletComment();
    if (comment !== undefined && comment !== OURS) return;
    for (const path of SUBID_FILES) {
      const lines = readFileSync(path, 'utf8').split('\n').filter((l) => l.startsWith(`${KUBELET_USER}:`));
      if (lines.length !== 1 || lines[0] !== line) rewriteSubids(path, (l) => l.startsWith(`${KUBELET_USER}:`), line);
    }
    if (comment === undefined) {
      execFileSync('useradd', ['--system', '--no-create-home', '--home-dir', '/nonexistent', '--shell', '/usr/sbin/nologin', '--comment', OURS, KUBELET_USER], { stdio: 'pipe' });
    }
  });
}

/** Removes our kubelet user and its ids, unless a node directory (a name with one of nodePrefixes, in the temp dir) is still there. */
export function releaseKubeletSubids(nodePrefixes: readonly string[]): void {
  locked(() => {
    if (readdirSync(tmpdir()).some((e) => nodePrefixes.some((p) => e.startsWith(p)))) return;
    const comment = kubeletComment();
    if (comment !== undefined && comment !== OURS) return;
    // userdel takes the ids with the user; an ensure cut short (ids written, no user yet) leaves only ours.
    if (comment === OURS) execFileSync('userdel', [KUBELET_USER], { stdio: 'pipe' });
    for (const path of SUBID_FILES) {
      if (readFileSync(path, 'utf8').split('\n').includes(line)) rewriteSubids(path, (l) => l === line);
    }
  });
}

/** What `getsubids kubelet` answers (the kubelet's own question), or undefined when it fails. */
export function kubeletSubidsSeen(): string | undefined {
  try {
    return execFileSync('getsubids', [KUBELET_USER], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return undefined;
  }
}
