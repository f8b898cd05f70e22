// A runc sandbox's processes get their rlimits by inheritance, not from config.json. runc sets a
// new process's rlimits with prlimit(2) from outside its user namespace, which needs
// CAP_SYS_RESOURCE over that namespace; host root has it only through the namespace's owner rule
// when the namespace is root's. Each sandbox's namespace is owned by its own host id now
// (oci-shim.c -u), and root on this kind of machine runs without CAP_SYS_RESOURCE (CapBnd lacks
// bit 24), so runc's prlimit failed with EPERM. Instead every runc process the runtime starts for
// a pod (the shim's `runc create` with -l, `runc exec`, the terminal's) already carries the
// limits, and config.json names none. runsc sets rlimits inside its sentry: its specs keep them.
import { DEFAULT_NOFILE } from './spec.ts';

/** util-linux's prlimit: sets its own limits, then execs the command (same pid). */
export const PRLIMIT = '/usr/bin/prlimit';

/** Open files per process, soft and hard; no core files (a crash must not fill the sandbox's disk). */
export const POD_NOFILE = DEFAULT_NOFILE;

/** argv run with the pod's limits: `prlimit --nofile=N:N --core=0:0 -- argv...`. */
export function withPodRlimits(argv: readonly string[]): string[] {
  return [PRLIMIT, `--nofile=${String(POD_NOFILE)}:${String(POD_NOFILE)}`, '--core=0:0', '--', ...argv];
}
