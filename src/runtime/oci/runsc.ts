// gVisor (runsc) for pods whose runtimeClassName is gvisor, pure: the command lines the runtime runs
// and the changes spec.ts's config.json needs under runsc. Measured with runsc
// v0.0.0-20260905035102-160fafc42237 (runsc-binary.ts) on this host (kernel 6.18, cgroup v1, no
// KVM) by test/oci-runsc.test.ts; research/runtime.md §2c has the older Debian runsc's figures.
//
// The flags, and why:
// - --platform=systrap: no KVM here (nested virtualisation: --platform=kvm hung > 30 s with the
//   older runsc); systrap is gVisor's default and faster than ptrace.
// - --network=sandbox: gVisor's own network stack (netstack) in the pod's network namespace, the
//   isolation gVisor exists for (--network=host would hand the sentry's socket calls to the host
//   kernel). It works on this kernel since google/gvisor#10704's fix. runsc moves eth0's addresses
//   and routes into netstack and DELETES them from the namespace, and does not put them back when
//   the sandbox ends: the runtime must (re)address eth0 and add the default route in the netns
//   before every `run` (a wake on the same netns otherwise starts with no address).
// - --overlay2=none: the rootfs is the host overlay as given, so writes land in its upper dir and
//   survive hibernation (the default, root:self, keeps them in a file inside the sandbox).
// - --oci-seccomp: without it runsc ignores linux.seccomp (the sandbox shows Seccomp: 0); with it the
//   RuntimeDefault profile is enforced by gVisor on the sandbox's own processes.
// Left at their defaults: --file-access=exclusive (only the sandbox changes its rootfs: the files
// API acts through exec, never on the host tree), directfs, and cgroups (runsc applies
// linux.resources to the host cgroup holding the sentry, the gofer and the systrap stubs).
import type { SeccompRule } from './seccomp-profile.ts';
import type { OciMount, OciSpec } from './spec.ts';

export type RunscNetwork = 'sandbox' | 'host' | 'none';
export type RunscPlatform = 'systrap' | 'ptrace';

export interface RunscOptions {
  /**
   * runsc's state directory (--root), one per worker. runsc bind-mounts a shared empty network
   * namespace at `<root>/null-netns` for the gofers and never removes it: unmount it before removing
   * the directory (releaseRunscRoot in runsc-binary.ts).
   */
  root: string;
  network?: RunscNetwork;
  platform?: RunscPlatform;
  /** A directory for runsc's debug logs (--debug --debug-log=<dir>/); absent: none. */
  debugLogDir?: string;
}

/**
 * One runsc command. `run` detaches once the sandbox runs (pid-file: the sandbox process, the sentry).
 * `exec` takes an OCI process JSON file (runtime-spec "process": user, args, env, cwd,
 * capabilities, noNewPrivileges): pass the user every time. Stop is kill KILL, then wait, then
 * delete: see runscStopSequence.
 */
export type RunscCommand =
  | { op: 'run'; id: string; bundle: string; pidFile: string }
  | { op: 'exec'; id: string; processFile: string; detach?: boolean; pidFile?: string; consoleSocket?: string }
  | { op: 'kill'; id: string; signal?: string }
  | { op: 'wait'; id: string }
  | { op: 'delete'; id: string; force?: boolean }
  | { op: 'state'; id: string }
  | { op: 'pause'; id: string }
  | { op: 'resume'; id: string }
  /** Saves the sandbox to imagePath; with leaveRunning its kernel goes on afterwards (see checkpointSequence). */
  | { op: 'checkpoint'; id: string; imagePath: string; leaveRunning: boolean }
  /** Creates the container from the bundle (when it does not exist) and loads the image into it, as `run` starts it. */
  | { op: 'restore'; id: string; bundle: string; pidFile: string; imagePath: string };

/**
 * The runsc container id of a pod. runsc looks a container up by id PREFIX and refuses an id that
 * is the prefix of another's ("id "ab" is ambiguous and could refer to multiple containers":
 * runsc/container/state_file.go findContainerID), so pods "ab" and "abc" could not both be
 * stopped, checkpointed or exec'd into. A pod id never holds a dot: "<id>.pod" is the prefix of
 * no other pod's. A pod started before this keeps its bare id until it ends (legacy).
 */
export function runscContainerId(podId: string, legacy = false): string {
  return legacy ? podId : `${podId}.pod`;
}

/** The global flags every runsc command of one worker repeats (runsc reads its configuration from them each time). */
export function runscGlobalArgs(opts: RunscOptions): string[] {
  return ['--root', opts.root, ...runscFlags(opts)];
}

/** runscGlobalArgs without --root: for a caller that adds --root itself (oci-shim.c, exec). */
export function runscFlags(opts: Omit<RunscOptions, 'root'>): string[] {
  return [
    `--platform=${opts.platform ?? 'systrap'}`,
    `--network=${opts.network ?? 'sandbox'}`,
    '--overlay2=none',
    '--oci-seccomp',
    ...(opts.debugLogDir === undefined ? [] : ['--debug', `--debug-log=${opts.debugLogDir.replace(/\/?$/, '/')}`]),
  ];
}

/** argv (without the binary) for one command. */
export function runscArgs(opts: RunscOptions, cmd: RunscCommand): string[] {
  return [...runscGlobalArgs(opts), ...runscSubcommand(cmd)];
}

/** The subcommand and its arguments, for a caller that has the global flags already (the local runtime keeps them per worker). */
export function runscSubcommand(cmd: RunscCommand): string[] {
  switch (cmd.op) {
    // runsc's flag parser wants -detach (it has no -d, unlike runc).
    case 'run': return ['run', '-detach', '-pid-file', cmd.pidFile, '-bundle', cmd.bundle, cmd.id];
    case 'exec': return [
      'exec',
      ...(cmd.detach === true ? ['-detach'] : []),
      ...(cmd.pidFile === undefined ? [] : ['-pid-file', cmd.pidFile]),
      ...(cmd.consoleSocket === undefined ? [] : ['-console-socket', cmd.consoleSocket]),
      '-process', cmd.processFile, cmd.id,
    ];
    case 'kill': return ['kill', cmd.id, cmd.signal ?? 'KILL'];
    case 'wait': return ['wait', cmd.id];
    case 'delete': return ['delete', ...(cmd.force === false ? [] : ['-force']), cmd.id];
    case 'state': return ['state', cmd.id];
    case 'pause': return ['pause', cmd.id];
    case 'resume': return ['resume', cmd.id];
    case 'checkpoint': return ['checkpoint', ...(cmd.leaveRunning ? ['-leave-running'] : []), '-image-path', cmd.imagePath, cmd.id];
    case 'restore': return ['restore', '-detach', '-bundle', cmd.bundle, '-pid-file', cmd.pidFile, '-image-path', cmd.imagePath, cmd.id];
  }
}

/**
 * Saving a running sandbox so that a failed save leaves it running, in order. A plain `checkpoint`
 * kills the sandbox after the save whether it succeeded or not (pkg/sentry/state/state.go: "Save
 * failed: exiting..." then Kill), so the save runs with -leave-running (the kernel resumes in the
 * same sandbox process), inside a `pause`: the kernel's stops are counted, so the application stays
 * stopped after the save and never runs (writes files, answers a request) between the memory the
 * image holds and the end of the sandbox. After a good save the caller kills the sandbox; after a
 * failed one it sends `resume`.
 */
export function checkpointSequence(id: string, imagePath: string): { pause: RunscCommand; checkpoint: RunscCommand; resume: RunscCommand } {
  return { pause: { op: 'pause', id }, checkpoint: { op: 'checkpoint', id, imagePath, leaveRunning: true }, resume: { op: 'resume', id } };
}

/**
 * runsc's reason for a failed command, from a --debug-log file (its last "FATAL ERROR: ..." line,
 * logged at warning level, so without --debug too), or a plain one when there is none. Needed for
 * exec: runsc hands its stdio to the sentry, which shuts the sockets down when the process cannot
 * start, so runsc then dies of SIGPIPE writing the message to stderr.
 */
export function runscFailure(log: string): string {
  const fatal = [...log.matchAll(/FATAL ERROR: (.*)$/gm)].pop()?.[1];
  return fatal ?? 'runsc exec failed and logged no reason';
}

/**
 * Stopping a sandbox (hibernate or delete), in order. `kill KILL` ends the container's init; the
 * sentry then writes back and exits by itself (~20 ms), which a forced delete alone would cut
 * short. `wait` returns when it has: with status 0-255 when the sandbox still answered, or fails
 * with "sandbox no longer running and its exit status is unavailable" when it had already gone;
 * both mean stopped, so its exit code is not an error. `delete -force` then removes the state and
 * the container's cgroup even though the sandbox process may still be an unreaped zombie (it
 * is reparented to the nearest subreaper, here PID 1, which reaps it 1-2 s later; `state` says
 * "running" until then). Read memory.oom_control (oom_kill) from the cgroup BEFORE the delete to
 * report OOMKilled: under gVisor the kernel's OOM killer takes the sentry, so the whole sandbox
 * ends with 137.
 */
export function runscStopSequence(opts: RunscOptions, id: string): { argv: string[]; exitCodeMatters: boolean }[] {
  return [
    { argv: runscArgs(opts, { op: 'kill', id, signal: 'KILL' }), exitCodeMatters: false },
    { argv: runscArgs(opts, { op: 'wait', id }), exitCodeMatters: false },
    { argv: runscArgs(opts, { op: 'delete', id, force: true }), exitCodeMatters: true },
  ];
}

/**
 * What the sentry, the gofer and the systrap stubs of an idle sandbox take in its memory cgroup
 * beyond the pod's own processes: 16.4-17.7 MB (memory.max_usage_in_bytes after start and one exec,
 * busybox). Added to the limit, as a Kubernetes RuntimeClass `overhead` would, so the pod keeps
 * the memory it asked for and a small limit still starts (24 MiB starts; the older runsc died on its
 * first exec at 64 MiB).
 */
export const RUNSC_MEMORY_OVERHEAD_BYTES = 32 * 2 ** 20;
/**
 * The host pids cgroup counts the sandbox's host tasks, not its processes: 19 for an idle sandbox
 * (sentry and gofer threads, stubs), 432 with 201 processes inside. So ~2 per process plus the
 * sentry's own; at the limit the sentry cannot clone and the whole sandbox ends (a fork bomb is
 * held either way). gVisor's own cgroupfs enforces no pids limit (pids.max reads "max" inside).
 */
export const RUNSC_PIDS_PER_PROCESS = 2;
export const RUNSC_PIDS_OVERHEAD = 64;

const ENOSYS = 38;

export interface RunscSpecOptions {
  /**
   * A runtime-owned host directory (mode 1777) to bind at /tmp. gVisor mounts its own tmpfs over an
   * empty /tmp (busybox's, base's): memory-backed and lost at hibernation, where runc keeps /tmp in
   * the upper dir. With this, /tmp is on disk and survives like the rest of the writable layer.
   * Never a path inside the rootfs: the sandbox could have made it a symlink to a host path.
   */
  tmpDir?: string;
}

/**
 * spec.ts's config.json adjusted for runsc (a new object; the input is not changed):
 * - /sys: a root pod with a joined netns gets a bind of the host's /sys under runc (a user
 *   namespace may not mount sysfs for a netns it does not own). runsc serves a bind through its
 *   gofer from the HOST, unmasked: the sandbox saw /sys/firmware/acpi and the host's interfaces in
 *   /sys/class/net. gVisor's own sysfs has neither restriction nor content, so it is used always.
 * - memory and pids limits: raised by the sandbox's own overhead (constants above).
 * - /tmp: see RunscSpecOptions.tmpDir.
 * - /dev: read-only. runsc replaces the spec's /dev tmpfs with its own device filesystem and drops
 *   its options (runsc/boot/vfs.go: no `size`), a tmpfs sized at half the host's memory: root
 *   filled 200 MiB there and more, until the sentry's memory cgroup killed the whole sandbox.
 *   Read-only, a write there fails with EROFS instead; /dev/shm (sized), /dev/pts and the init's
 *   mount under /dev are mounts of their own and unchanged. runc's /dev is a 64 MiB tmpfs.
 * - seccomp: runsc ignores a rule's errnoRet and answers EPERM for every SCMP_ACT_ERRNO
 *   (google/gvisor#14688, open; fix proposed in google/gvisor#14721). clone3's ENOSYS, the one
 *   errnoRet of the profile, is what makes glibc ≥ 2.34 fall back to clone: with EPERM no thread
 *   starts (python3's threading: "can't start new thread", so no http.server either). Such a rule
 *   becomes SCMP_ACT_TRACE, which gVisor answers with ENOSYS when no ptrace tracer is attached
 *   (pkg/sentry/kernel/seccomp.go, as Linux does), and none can be: ptrace is denied. clone3 stays
 *   refused, so namespace flags still cannot pass through it.
 * - process.user.additionalGids: left out when empty. runsc keeps the spec in a checkpoint through
 *   Go's JSON, whose omitempty turns an empty list into an absent one, and its restore compares
 *   process.user with reflect.DeepEqual, where [] is not absent: every restore of a pod without
 *   supplementary groups failed with '"User" does not match across checkpoint restore'. (The
 *   other empty lists, the capability sets, are compared by length.)
 * Everything else is accepted as is: seccomp (with --oci-seccomp), the user namespace and its id
 * maps (a root pod's files land in the upper dir as host uid 100000, as under runc), capabilities,
 * no_new_privs, rlimits, oomScoreAdj (the sentry gets 1000), cpu quota, devices, and the masked
 * and read-only paths (gVisor's /proc has no kcore, keys, timer_list or sysrq; /sys/firmware is empty).
 */
export function runscSpec(spec: OciSpec, opts: RunscSpecOptions = {}): OciSpec {
  const mounts: OciMount[] = spec.mounts
    .filter((m) => !(opts.tmpDir !== undefined && m.destination === '/tmp'))
    .map((m) => (m.destination === '/sys' ? { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] } : m.destination === '/dev' ? { ...m, options: [...m.options, 'ro'] } : { ...m, options: [...m.options] }));
  if (opts.tmpDir !== undefined) {
    mounts.push({ destination: '/tmp', type: 'bind', source: opts.tmpDir, options: ['rbind', 'nosuid', 'nodev', 'rw'] });
  }
  const { memory, pids } = spec.linux.resources;
  const memoryLimit = memory.limit + RUNSC_MEMORY_OVERHEAD_BYTES;
  const syscalls = spec.linux.seccomp.syscalls.map((rule): SeccompRule => {
    if (rule.action !== 'SCMP_ACT_ERRNO' || rule.errnoRet !== ENOSYS) return rule;
    const { errnoRet: _enosys, ...rest } = rule;
    return { ...rest, action: 'SCMP_ACT_TRACE' };
  });
  const { additionalGids, ...user } = spec.process.user;
  return {
    ...spec,
    process: { ...spec.process, user: additionalGids === undefined || additionalGids.length === 0 ? user : { ...user, additionalGids: [...additionalGids] } },
    root: { ...spec.root },
    mounts,
    linux: {
      ...spec.linux,
      seccomp: { ...spec.linux.seccomp, syscalls },
      resources: {
        ...spec.linux.resources,
        memory: { limit: memoryLimit, swap: Math.max(memory.swap + RUNSC_MEMORY_OVERHEAD_BYTES, memoryLimit) },
        pids: { limit: pids.limit * RUNSC_PIDS_PER_PROCESS + RUNSC_PIDS_OVERHEAD },
      },
    },
  };
}
