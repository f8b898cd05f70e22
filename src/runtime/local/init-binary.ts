// pod-init (pod-init.c) and the launcher (launcher.c), compiled on first use into the runtime's
// state dir by ensureCBinary (src/system/c-binary.ts).
import { ensureCBinary } from '../../system/c-binary.ts';

export function ensureInitBinary(root: string): Promise<string> {
  return ensureCBinary(root, new URL('./pod-init.c', import.meta.url));
}

export function ensureLauncherBinary(root: string): Promise<string> {
  return ensureCBinary(root, new URL('./launcher.c', import.meta.url));
}
