// What every host-side process that reaches into a container shares: runc/runsc and the terminal
// helper run by absolute path with a fixed environment (never the pod's: research/runtime.md §1a
// escape 1), in a process group of their own that a kill takes down whole; and the process they
// start in the container runs with no capabilities and no_new_privs.
import type { ChildProcess } from 'node:child_process';

/** The host side's whole environment: nothing from the pod reaches it. */
export const HOST_ENV: Readonly<Record<string, string>> = Object.freeze({ PATH: '/usr/sbin:/usr/bin:/sbin:/bin', LC_ALL: 'C' });

/** runtime-spec's process, as `runc exec --process` and `runsc exec -process` read it, with nothing granted. */
export interface UnprivilegedProcess {
  user: { uid: number; gid: number; additionalGids: number[] };
  args: string[];
  env: string[];
  cwd: string;
  capabilities: { bounding: never[]; effective: never[]; permitted: never[]; inheritable: never[]; ambient: never[] };
  noNewPrivileges: true;
}

export function noCapabilities(): UnprivilegedProcess['capabilities'] {
  return { bounding: [], effective: [], permitted: [], inheritable: [], ambient: [] };
}

/** Signals a detached child's whole process group; nothing once it has exited. */
export function killGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    // already gone
  }
}
