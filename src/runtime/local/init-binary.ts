// The pod shim (oci-shim.c) and the launcher (launcher.c), compiled on first use into the runtime's
// state dir by ensureCBinary (src/system/c-binary.ts).
import { ensureCBinary } from '../../system/c-binary.ts';

export function ensureShimBinary(root: string): Promise<string> {
  return ensureCBinary(root, new URL('./oci-shim.c', import.meta.url));
}

export function ensureLauncherBinary(root: string): Promise<string> {
  return ensureCBinary(root, new URL('./launcher.c', import.meta.url));
}
