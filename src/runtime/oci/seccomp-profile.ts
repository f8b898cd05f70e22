// The seccomp profile of `seccompProfile: RuntimeDefault`, as data: the allow-list of the
// Docker/containerd default profile (moby profiles/seccomp/default.json) for x86_64, with the
// default action ERRNO(EPERM), minus what a hostile sandbox should not reach even though Docker
// allows it:
// - io_uring_setup/enter/register: a large, often-patched kernel surface (host sysctl
//   io_uring_disabled=0 here, research/runtime.md §1b); containerd 2 and ChromeOS drop it too.
// - ptrace, process_vm_readv/writev: Docker allows them on kernels ≥ 4.8; inside one sandbox they
//   only reach the sandbox's own processes, but they are the usual first step of a sandbox-local
//   escalation and no agent workload we know needs a debugger.
// Never allowed (absent from the list, so EPERM): keyctl, add_key, request_key, bpf, unshare,
// setns, mount, umount2, kexec_*, init_module/finit_module, open_by_handle_at, perf_event_open,
// userfaultfd, and clone with any namespace flag (the masked rule below). Syscalls Docker allows
// only with a capability are allowed here only when the container is given that capability, and
// the capabilities a container may add (oci/spec.ts) include only CAP_SYS_CHROOT among them.
//
// Only the x86_64 ABI is listed: a 32-bit (int 0x80) or x32 syscall then matches no architecture
// and is killed. Docker also lists x86 and x32; we do not, since 32-bit compat syscalls are extra
// kernel surface and agent images are 64-bit.

export interface SeccompArg {
  index: number;
  value: number;
  valueTwo?: number;
  op: 'SCMP_CMP_EQ' | 'SCMP_CMP_NE' | 'SCMP_CMP_MASKED_EQ';
}

export interface SeccompRule {
  names: string[];
  /** SCMP_ACT_TRACE: only in runscSpec's profile (ENOSYS under gVisor, see runsc.ts). */
  action: 'SCMP_ACT_ALLOW' | 'SCMP_ACT_ERRNO' | 'SCMP_ACT_TRACE';
  errnoRet?: number;
  args?: SeccompArg[];
}

export interface SeccompProfile {
  defaultAction: 'SCMP_ACT_ERRNO';
  defaultErrnoRet: number;
  architectures: string[];
  syscalls: SeccompRule[];
}

const EPERM = 1;
const ENOSYS = 38;
/** CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET: clone must have none of them. */
const CLONE_NAMESPACE_FLAGS = 0x7e020000;
const AF_VSOCK = 40;
/** personality(2) values Docker allows: PER_LINUX, PER_LINUX32, UNAME26, PER_LINUX32|UNAME26, and the query 0xffffffff. */
const PERSONALITIES = [0x0, 0x8, 0x20000, 0x20008, 0xffffffff];

const ALLOWED: readonly string[] = [
  'accept', 'accept4', 'access', 'adjtimex', 'alarm', 'arch_prctl', 'bind', 'brk', 'capget', 'capset',
  'chdir', 'chmod', 'chown', 'clock_adjtime', 'clock_getres', 'clock_gettime', 'clock_nanosleep',
  'close', 'close_range', 'connect', 'copy_file_range', 'creat', 'dup', 'dup2', 'dup3',
  'epoll_create', 'epoll_create1', 'epoll_ctl', 'epoll_ctl_old', 'epoll_pwait', 'epoll_pwait2',
  'epoll_wait', 'epoll_wait_old', 'eventfd', 'eventfd2', 'execve', 'execveat', 'exit', 'exit_group',
  'faccessat', 'faccessat2', 'fadvise64', 'fallocate', 'fanotify_mark', 'fchdir', 'fchmod',
  'fchmodat', 'fchown', 'fchownat', 'fcntl', 'fdatasync', 'fgetxattr', 'flistxattr', 'flock', 'fork',
  'fremovexattr', 'fsetxattr', 'fstat', 'fstatfs', 'fsync', 'ftruncate', 'futex', 'futex_waitv',
  'futimesat', 'getcpu', 'getcwd', 'getdents', 'getdents64', 'getegid', 'geteuid', 'getgid',
  'getgroups', 'getitimer', 'getpeername', 'getpgid', 'getpgrp', 'getpid', 'getppid', 'getpriority',
  'getrandom', 'getresgid', 'getresuid', 'getrlimit', 'get_robust_list', 'getrusage', 'getsid',
  'getsockname', 'getsockopt', 'get_thread_area', 'gettid', 'gettimeofday', 'getuid', 'getxattr',
  'inotify_add_watch', 'inotify_init', 'inotify_init1', 'inotify_rm_watch', 'io_cancel', 'ioctl',
  'io_destroy', 'io_getevents', 'io_pgetevents', 'ioprio_get', 'ioprio_set', 'io_setup', 'io_submit',
  'kill', 'landlock_add_rule', 'landlock_create_ruleset', 'landlock_restrict_self', 'lchown',
  'lgetxattr', 'link', 'linkat', 'listen', 'listxattr', 'llistxattr', 'lremovexattr', 'lseek',
  'lsetxattr', 'lstat', 'madvise', 'membarrier', 'memfd_create', 'memfd_secret', 'mincore', 'mkdir',
  'mkdirat', 'mknod', 'mknodat', 'mlock', 'mlock2', 'mlockall', 'mmap', 'modify_ldt', 'mprotect',
  'mq_getsetattr', 'mq_notify', 'mq_open', 'mq_timedreceive', 'mq_timedsend', 'mq_unlink', 'mremap',
  'msgctl', 'msgget', 'msgrcv', 'msgsnd', 'msync', 'munlock', 'munlockall', 'munmap',
  'name_to_handle_at', 'nanosleep', 'newfstatat', 'open', 'openat', 'openat2', 'pause', 'pidfd_open',
  'pidfd_send_signal', 'pipe', 'pipe2', 'pkey_alloc', 'pkey_free', 'pkey_mprotect', 'poll', 'ppoll',
  'prctl', 'pread64', 'preadv', 'preadv2', 'prlimit64', 'process_mrelease', 'pselect6', 'pwrite64',
  'pwritev', 'pwritev2', 'read', 'readahead', 'readlink', 'readlinkat', 'readv', 'recvfrom',
  'recvmmsg', 'recvmsg', 'remap_file_pages', 'removexattr', 'rename', 'renameat', 'renameat2',
  'restart_syscall', 'rmdir', 'rseq', 'rt_sigaction', 'rt_sigpending', 'rt_sigprocmask',
  'rt_sigqueueinfo', 'rt_sigreturn', 'rt_sigsuspend', 'rt_sigtimedwait', 'rt_tgsigqueueinfo',
  'sched_getaffinity', 'sched_getattr', 'sched_getparam', 'sched_get_priority_max',
  'sched_get_priority_min', 'sched_getscheduler', 'sched_rr_get_interval', 'sched_setaffinity',
  'sched_setattr', 'sched_setparam', 'sched_setscheduler', 'sched_yield', 'seccomp', 'select',
  'semctl', 'semget', 'semop', 'semtimedop', 'sendfile', 'sendmmsg', 'sendmsg', 'sendto', 'setfsgid',
  'setfsuid', 'setgid', 'setgroups', 'setitimer', 'setpgid', 'setpriority', 'setregid', 'setresgid',
  'setresuid', 'setreuid', 'setrlimit', 'set_robust_list', 'setsid', 'setsockopt', 'set_thread_area',
  'set_tid_address', 'setuid', 'setxattr', 'shmat', 'shmctl', 'shmdt', 'shmget', 'shutdown',
  'sigaltstack', 'signalfd', 'signalfd4', 'socketpair', 'splice', 'stat', 'statfs', 'statx',
  'symlink', 'symlinkat', 'sync', 'sync_file_range', 'syncfs', 'sysinfo', 'tee', 'tgkill', 'time',
  'timer_create', 'timer_delete', 'timer_getoverrun', 'timer_gettime', 'timer_settime',
  'timerfd_create', 'timerfd_gettime', 'timerfd_settime', 'times', 'tkill', 'truncate', 'umask',
  'uname', 'unlink', 'unlinkat', 'utime', 'utimensat', 'utimes', 'vfork', 'vmsplice', 'wait4',
  'waitid', 'write', 'writev',
];

/** Syscalls Docker's profile allows only with a capability, for the capabilities a sandbox may add. */
const BY_CAPABILITY: Readonly<Record<string, readonly string[]>> = {
  CAP_SYS_CHROOT: ['chroot'],
};

/** Never in the profile, whatever the capabilities a container may add: the unit tests check each is absent. */
export const ALWAYS_DENIED: readonly string[] = [
  'keyctl', 'add_key', 'request_key', 'bpf', 'unshare', 'setns', 'mount', 'umount2', 'mount_setattr',
  'move_mount', 'open_tree', 'fsopen', 'fsmount', 'fsconfig', 'fspick', 'ptrace', 'process_vm_readv',
  'process_vm_writev', 'io_uring_setup', 'io_uring_enter', 'io_uring_register', 'kexec_load',
  'kexec_file_load', 'open_by_handle_at', 'init_module', 'finit_module', 'delete_module',
  'perf_event_open', 'userfaultfd', 'pivot_root', 'reboot', 'swapon', 'swapoff', 'acct',
  'settimeofday', 'clock_settime', 'sethostname', 'setdomainname', 'syslog', 'iopl', 'ioperm',
  'lookup_dcookie', 'quotactl', 'fanotify_init', 'kcmp', 'pidfd_getfd', 'process_madvise',
];

/** The RuntimeDefault profile for a container holding `capabilities` (CAP_ names). */
export function runtimeDefaultProfile(capabilities: readonly string[]): SeccompProfile {
  const extra = capabilities.flatMap((cap) => BY_CAPABILITY[cap] ?? []);
  return {
    defaultAction: 'SCMP_ACT_ERRNO',
    defaultErrnoRet: EPERM,
    architectures: ['SCMP_ARCH_X86_64'],
    syscalls: [
      { names: [...ALLOWED, ...extra], action: 'SCMP_ACT_ALLOW' },
      // Threads and fork need clone; a new namespace must not come with it.
      { names: ['clone'], action: 'SCMP_ACT_ALLOW', args: [{ index: 0, value: CLONE_NAMESPACE_FLAGS, valueTwo: 0, op: 'SCMP_CMP_MASKED_EQ' }] },
      // clone3 passes its flags in memory, where seccomp cannot look: ENOSYS makes glibc fall back to clone.
      { names: ['clone3'], action: 'SCMP_ACT_ERRNO', errnoRet: ENOSYS },
      { names: ['socket'], action: 'SCMP_ACT_ALLOW', args: [{ index: 0, value: AF_VSOCK, op: 'SCMP_CMP_NE' }] },
      ...PERSONALITIES.map((value): SeccompRule => ({ names: ['personality'], action: 'SCMP_ACT_ALLOW', args: [{ index: 0, value, op: 'SCMP_CMP_EQ' }] })),
    ],
  };
}
