// Our C programs of the local runtime, compiled on first use into the runtime's state dir by
// ensureCBinary (src/base/c-binary.ts): the pod shim (oci-shim.c), the launcher (launcher.c) and
// the containers' init (asb-init.c).
import { chmod, copyFile, mkdir, rename } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { ensureCBinary } from '../../base/c-binary.ts';
import { exists } from '../../base/exists.ts';

export function ensureShimBinary(root: string): Promise<string> {
  return ensureCBinary(root, new URL('./oci-shim.c', import.meta.url));
}

export function ensureLauncherBinary(root: string): Promise<string> {
  return ensureCBinary(root, new URL('./launcher.c', import.meta.url));
}

/** Where the containers' init is installed for every runtime on the host: a path a pod's user namespace may reach. */
export const INIT_DIR = '/run/asb/bin';

/**
 * asb-init, static (it runs in images without a libc), compiled into the state dir, which is
 * private (0700), then installed under INIT_DIR by the name its hash gives (0755, owned by root):
 * runc and runsc bind-mount it into each container read-only. The state dir itself is never made
 * reachable by a pod.
 */
export async function ensureInitBinary(root: string, dir = INIT_DIR): Promise<string> {
  const built = await ensureCBinary(root, new URL('./asb-init.c', import.meta.url), ['-O2', '-Wall', '-static']);
  const installed = join(dir, basename(built));
  if (await exists(installed)) return installed;
  await mkdir(dir, { recursive: true, mode: 0o755 });
  await chmod(dir, 0o755);
  const tmp = `${installed}.${String(process.pid)}.tmp`;
  await copyFile(built, tmp);
  await chmod(tmp, 0o755);
  await rename(tmp, installed);
  return installed;
}
