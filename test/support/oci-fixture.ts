// What the OCI runtime tests (oci-runc, oci-runsc) share: cleanup in reverse order, the busybox
// seed image pulled from a loopback registry into a fresh image cache (plain and id-mapped for a
// root pod), the static syscall probe, and an overlay rootfs on a cached tree with its own upper
// dir. make test builds the seed images first; a worktree may point ASB_IMAGES_DIR elsewhere.
import type { CachedImage } from '../../src/images/image-store.ts';
import { testImageStore } from './test-images.ts';
import type test from 'node:test';
import { execFile } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { ROOT_ID_MAP } from '../../src/runtime/oci/spec.ts';

export const run = promisify(execFile);

type Undo = () => unknown;
const undoStacks = new WeakMap<test.TestContext, Undo[]>();

/**
 * Runs `undo` after the test, last registered first (t.after hooks run first registered first,
 * which would remove a directory before the overlay on it is unmounted). Every step runs even if
 * one fails; the failures are reported together.
 */
export function onCleanup(t: test.TestContext, undo: Undo): void {
  let stack = undoStacks.get(t);
  if (stack === undefined) {
    const steps: Undo[] = [];
    stack = steps;
    undoStacks.set(t, steps);
    t.after(async () => {
      const errors: unknown[] = [];
      for (const step of steps.reverse()) {
        try {
          await step();
        } catch (err) {
          errors.push(err);
        }
      }
      if (errors.length > 0) throw new AggregateError(errors, `${String(errors.length)} cleanup step(s) failed`);
    });
  }
  stack.push(undo);
}

export function tempDir(t: test.TestContext, prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  onCleanup(t, () => {
    rmSync(dir, { recursive: true, force: true });
  });
  return dir;
}

/** `key=value` lines of the output. */
export function fields(out: string): Map<string, string> {
  return new Map(out.split('\n').filter((l) => l.includes('=')).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
}

/** busybox from the tests' loopback registry (test-images.ts): the plain tree and the one id-mapped for a root pod. */
export async function pullBusybox(): Promise<{ busybox: CachedImage; mapped: CachedImage }> {
  const store = await testImageStore();
  return { busybox: await store.pull('busybox'), mapped: await store.pull('busybox', { idMap: ROOT_ID_MAP }) };
}

/** test/fixtures/syscall-probe.c built static into a directory to bind-mount at /probe. */
export async function buildProbe(t: test.TestContext): Promise<string> {
  const probeDir = tempDir(t, 'asb-probe-');
  chmodSync(probeDir, 0o755);
  await run('cc', ['-static', '-O2', '-o', join(probeDir, 'probe'), resolve(import.meta.dirname, '../fixtures/syscall-probe.c')], { timeout: 60_000 });
  return probeDir;
}

export interface OverlayRootfs {
  /** The directory holding the others (mode 755: a root pod's root is host uid 100000 and must reach its rootfs). */
  dir: string;
  /** What the container wrote. */
  upper: string;
  work: string;
  /** The overlay mount point: lowerdir the cached tree, upperdir `upper`. */
  rootfs: string;
  /** The OCI bundle directory (config.json goes here). */
  bundle: string;
}

/** An overlay rootfs on `image`'s cached tree, unmounted after the test; `owner` chowns the upper dir (a root pod's mapped root must own it to write). */
export async function overlayRootfs(t: test.TestContext, image: CachedImage, owner = 0): Promise<OverlayRootfs> {
  const dir = tempDir(t, 'asb-oci-');
  chmodSync(dir, 0o755);
  const [upper, work, rootfs, bundle] = ['upper', 'work', 'rootfs', 'bundle'].map((d) => join(dir, d)) as [string, string, string, string];
  for (const d of [upper, work, rootfs, bundle]) mkdirSync(d);
  chownSync(upper, owner, owner);
  await mountOverlay(image, { upper, work, rootfs });
  onCleanup(t, () => umountIfMounted(rootfs));
  return { dir, upper, work, rootfs, bundle };
}

export async function mountOverlay(image: CachedImage, dirs: Pick<OverlayRootfs, 'upper' | 'work' | 'rootfs'>): Promise<void> {
  await run('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${image.rootfs},upperdir=${dirs.upper},workdir=${dirs.work}`, dirs.rootfs]);
}

export async function umountIfMounted(path: string): Promise<void> {
  const { stdout } = await run('findmnt', ['-n', '-o', 'TARGET', '--mountpoint', path]).catch(() => ({ stdout: '' }));
  if (stdout.trim() !== '') await run('umount', [path]);
}

/** Removes a container's cgroup directory under every v1 hierarchy (the runtime removes the leaf; this is for a run cut short). */
export function removeCgroups(cgroupsPath: string): void {
  for (const c of readdirSync('/sys/fs/cgroup')) {
    const path = join('/sys/fs/cgroup', c, cgroupsPath);
    if (existsSync(path)) rmdirSync(path);
  }
}
