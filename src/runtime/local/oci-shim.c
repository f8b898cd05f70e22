// oci-shim: starts one sandbox pod's container with runc, then stays as its parent to record how it
// ended. One per running pod, like containerd's shim or conmon, but a few hundred KiB of C: a
// foreground `runc run` per pod would keep a ~10 MB Go process per sandbox.
//
// Usage (argv built by src/runtime/local/oci-pod.ts):
//   oci-shim -d <podDir> -r <runc> -R <runcRoot> -i <id> -b <bundle> [-c <cgroupsPath>]
//            [-o <lowerdir> <upperdir> <workdir> <rootfs>] [-n <ip> <prefix> <gw>] [-D <disk>]
//            [-N <netns file>] [-U <host id> <size> <tree id>] [-u <userns file>] [-l <nofile>]
//            [-C <checkpoint dir>] [-P] [-K <criu dir>] [-V <disk bind>] [-- <runc global flags>...]
// Protocol on stdout, one line each (the same as the runtime's launcher expects): "pid <host pid of
// the container's init>", then "ready" or "error <what>: <why>". With -n it reads "go\n" on stdin
// once the runtime has moved the veth peer into the container's network namespace, then
// configures eth0 there (ioctls, no `ip` spawn) before the container's process starts.
// Steps: mount the overlay rootfs (host mount namespace), `runc create` (namespaces, cgroups,
// mounts; the process waits), network, `runc start`.
// With -N (gVisor's runsc, whose netstack copies eth0's address and routes when the sandbox is
// created, so they must be there first): the shim makes the pod's network namespace itself, as a
// file the config.json names, before `create`: a child unshares it and the shim bind-mounts it at
// <netns file>. "pid <that child>" is for the veth (`ip ... netns <pid>`), eth0 is configured,
// the child exits (the mount keeps the namespace), then `run --detach` (create and start in one:
// nothing is left to do between them) and "init <host pid of the sandbox process>": the pod's
// init from then on. The namespace is made afresh at every start
// (runsc leaves eth0 without its address when a sandbox ends) and unmounted when the pod ends.
// With -C (and -N) the pod wakes from a memory checkpoint (src/runtime/local/checkpoint.ts):
// `restore --detach` (it creates the container from the bundle, as `run` does, then loads the
// image into it) instead of `run --detach`. When the restore fails the shim deletes what it made,
// configures eth0 again and starts the pod fresh with `run`: a pod never stays down because its
// memory could not come back. Either way it writes <podDir>/restore-status before "init": "restored",
// or "failed <runsc's reason>" for the runtime to report.
// With -C and no -N the pod is a runc one whose memory CRIU saved (`runc checkpoint`): the overlay
// is mounted as for a start, then `runc restore --detach` (CRIU, found first on the PATH -K names:
// runc runs `criu swrk` from its PATH) re-makes the container and its user namespace from the image
// into a new, empty network namespace, and "pid <restored init>" lets the runtime move the veth in
// again before eth0 is configured, as after `runc create` (no `runc start`: it runs already). When
// the restore fails the container is deleted and started fresh with `create`, as for runsc.
// With -P (runc pods that may keep their memory) the container's stdio is pipes, not the log file:
// CRIU cannot dump a host file outside the container's mounts, and runc hands back to a restored
// container pipes only. stdin is a pipe nobody writes (EOF, as /dev/null was), stdout and stderr
// one pipe a child of the shim copies into the log until every writer is gone.
// With -V the pod's disk (-D) is also bind-mounted at <disk bind> (under the pod's mount dir, which
// its own root can walk) for the volumes' sources: CRIU opens each bind mount's source from inside
// the pod's user namespace at restore, and the pod dir, where the disk is mounted, is private.
// The shim is PR_SET_CHILD_SUBREAPER, so when
// runc exits the container's init is re-parented to it: it waits for that init, `runc delete`s the
// container (its cgroups go), unmounts the rootfs, and then writes the init's exit code to
// <podDir>/exit-status (so it survives a worker restart, and says the clean-up is done), followed
// by " OOMKilled" when the kernel's OOM killer killed one of its processes.
// With -U the pod has a host id range of its own (host id.. host id+size-1) while the image's tree
// is shared and owned from <tree id>: the lower layer is an idmapped mount of the tree (tree id →
// host id), made detached and mounted at <rootfs>.lower only until the overlay holds its own
// private clone, so no tree is copied per sandbox. With -u (runc) the shim also makes the pod's
// user namespace, owned by <host id> instead of root, with container id 0 at <host id>, and
// bind-mounts it at <userns file> for runc to join: the kernel charges a namespace's per-user
// counts (inotify instances, message-queue bytes, pending signals) to its owner, so each sandbox
// spends its own allowance, not host root's, which every sandbox and the host shared before.
// With -l every runc process starts with RLIMIT_NOFILE <nofile> (soft and hard) and no core files,
// and so does the container: runc's own prlimit into a namespace root does not own needs
// CAP_SYS_RESOURCE (src/runtime/oci/inherited-rlimits.ts).
// With -D, <disk> is the pod's disk (pod-disk.c mounted it: the writable layer, volumes and this
// log live there, under the ephemeral-storage cap). While the container runs the shim checks once
// a second whether the disk is full, and when it stays full for two checks in a row it kills the
// container and writes "137 Evicted" (the kubelet evicts a pod past its ephemeral-storage limit; a
// second check lets the write that hit ENOSPC report it before its pod ends). After the container
// it closes its log there and unmounts the disk.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

static const char *pod_dir, *runc, *runc_root, *id, *bundle;
static const char *lower, *upper, *work, *rootfs;
static const char *net_ip, *net_prefix, *net_gw;
static const char *netns_file; // -N: the network namespace the shim makes before create (runsc)
static const char *checkpoint_dir; // -C: restore the sandbox from this image (runsc with -N; runc with CRIU)
static const char *criu_dir; // -K: the directory of the criu runc runs for restore
static int stdio_pipes; // -P: the container's stdio is pipes copied into the log
static const char *disk_bind; // -V: where the disk is bind-mounted for the volumes' sources
static int io_in = -1, io_out = -1; // -P: the container's stdin (read end) and stdout/stderr (write end)
static pid_t copier = -1; // -P: the child copying the container's output into the log
static const char *userns_file; // -u: the user namespace the shim makes for runc to join
static long id_host = -1, id_size, id_tree; // -U: the pod's host range and the tree's first id
static char lower_mnt[PATH_MAX]; // -U: where the idmapped tree is mounted while the overlay is
static long nofile_limit = -1; // -l: RLIMIT_NOFILE (soft = hard) every runc process, and so the container's, starts with
static const char *disk; // the pod's disk mount (-D), or NULL for a pod dir made before disks
static const char *cgroup_path; // the container's cgroupsPath: where the kernel counts its OOM kills
static char **runc_flags; // global flags for every runc call (runsc: --platform and the like)
static int n_runc_flags;
static int dir_fd = -1, log_fd = -1;

static void cleanup(int created);

static void fail_msg(int created, const char *what, const char *why) {
  dprintf(1, "error %s: %s\n", what, why);
  cleanup(created);
  _exit(125);
}

static void fail(int created, const char *what) { fail_msg(created, what, strerror(errno)); }

static int status_code(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

// Runs `runc <global flags> --root R --log <podDir>/runc.log <args...>` to its end; its stdio goes
// to the container log, or with `container_io` (-P: create and restore) to the container's pipes
// (runc hands that stdio on to the container's process). `criu`: CRIU's directory first on its PATH.
static int run_runc_io(const char *const *args, int container_io, int criu) {
  char *argv[64];
  char log_path[PATH_MAX];
  int n = 0;
  snprintf(log_path, sizeof log_path, "%s/runc.log", pod_dir);
  argv[n++] = (char *)runc;
  for (int i = 0; i < n_runc_flags && n < 40; i++) argv[n++] = runc_flags[i];
  argv[n++] = "--root";
  argv[n++] = (char *)runc_root;
  argv[n++] = "--log";
  argv[n++] = log_path;
  for (int i = 0; args[i] && n < 63; i++) argv[n++] = (char *)args[i];
  argv[n] = NULL;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL); // wait_init blocks SIGCHLD; runc delete must not inherit that
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    int in = container_io && io_in >= 0 ? io_in : null_fd, out = container_io && io_out >= 0 ? io_out : log_fd;
    dup2(in, 0);
    dup2(out, 1);
    dup2(out, 2);
    static char path_env[PATH_MAX + 80];
    snprintf(path_env, sizeof path_env, "PATH=%s%s/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", criu && criu_dir ? criu_dir : "", criu && criu_dir ? ":" : "");
    char *env[] = {path_env, NULL};
    execve(runc, argv, env);
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status_code(st);
}

static int run_runc(const char *const *args) { return run_runc_io(args, 0, 0); }

// -P: the container's stdin (a pipe whose write end is closed at once: EOF, as /dev/null) and its
// stdout and stderr (one pipe), and the child that copies that pipe into the log. The copier ends
// when every writer is gone: the container's processes and the shim's own copy (closed once the
// container runs, or in cleanup).
static void make_stdio_pipes(void) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0) fail(0, "stdio pipes");
  close(in[1]);
  io_in = in[0];
  io_out = out[1];
  copier = fork();
  if (copier < 0) fail(0, "fork log copier");
  if (copier == 0) {
    close(io_out);
    close(io_in);
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    dup2(null_fd, 0);
    dup2(null_fd, 1); // never the launcher's pipe: it must see EOF when the shim ends
    dup2(null_fd, 2);
    static char buf[65536];
    for (;;) {
      ssize_t n = read(out[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) _exit(0);
      for (ssize_t done = 0; done < n;) {
        ssize_t w = write(log_fd, buf + done, (size_t)(n - done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break; // a full disk loses output, never blocks the container
        done += w;
      }
    }
  }
  close(out[0]);
}

// The copier has written everything once the container is gone: waited for (at most 2 s) before
// the log's disk is unmounted.
static void end_copier(void) {
  if (io_out >= 0) close(io_out);
  if (io_in >= 0) close(io_in);
  io_out = io_in = -1;
  for (int i = 0; copier > 0 && i < 200; i++) {
    pid_t p = waitpid(copier, NULL, WNOHANG);
    if (p == copier || (p < 0 && errno != EINTR)) copier = -1;
    else usleep(10000);
  }
}

// The last line runc logged (its error), without runc's "time=... level=error msg=" prefix.
static const char *runc_error(void) {
  static char buf[1024];
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/runc.log", pod_dir);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "runc failed and logged nothing";
  off_t size = lseek(fd, 0, SEEK_END);
  off_t from = size > (off_t)sizeof buf - 1 ? size - (off_t)sizeof buf + 1 : 0;
  ssize_t n = pread(fd, buf, sizeof buf - 1, from);
  close(fd);
  if (n <= 0) return "runc failed and logged nothing";
  buf[n] = 0;
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
  char *line = strrchr(buf, '\n');
  line = line ? line + 1 : buf;
  char *msg = strstr(line, "\"msg\":\""); // runsc: {"msg":"...","level":"error",...}
  if (msg) {
    line = msg + 7;
    char *end = line;
    while (*end && !(*end == '"' && end[-1] != '\\')) end++;
    *end = 0;
  } else if ((msg = strstr(line, "msg="))) {
    line = msg + 4;
  }
  for (char *p = line; *p; p++) if (*p == '\n') *p = ' ';
  return line;
}

// CRIU's first error line in <podDir>/restore-work/restore.log (its first 256 KiB) (runc's own says only "criu failed"),
// or NULL. The first: the later ones are CRIU unwinding.
static const char *criu_error(void) {
  static char buf[262144], line[512];
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/restore-work/restore.log", pod_dir);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return NULL;
  buf[n] = 0;
  // Every run logs "rlimit: Can't setup RLIMIT_NOFILE for self" (harmless, docs/criu.md): skipped.
  char *err = strstr(buf, "Error (");
  while (err) {
    char *end = err + strcspn(err, "\n");
    char *harmless = strstr(err, "RLIMIT_NOFILE for self");
    if (!harmless || harmless > end) break;
    err = strstr(end, "Error (");
  }
  if (!err) return NULL;
  size_t len = strcspn(err, "\n");
  if (len >= sizeof line) len = sizeof line - 1;
  memcpy(line, err, len);
  line[len] = 0;
  return line;
}

// runc (1.2 on) answers `delete --force` by killing, then sleeping 100 ms before it looks whether
// the init is gone, even when it has long gone: every stop of a runc pod paid it, and a wake right
// after a pause waited for it. A plain delete of a stopped container is at once, so runc gets
// --force only when that fails (the init still runs, or the container never started). runsc's
// forced delete does not wait so, and its plain one refuses a sandbox whose sentry is still
// writing back (-N: runsc).
static void cleanup(int created) {
  if (created) {
    const char *del[] = {"delete", id, NULL}, *forced[] = {"delete", "--force", id, NULL};
    if (netns_file || run_runc(del) != 0) run_runc(forced);
  }
  end_copier();
  if (rootfs) umount2(rootfs, MNT_DETACH);
  if (lower_mnt[0]) {
    umount2(lower_mnt, MNT_DETACH);
    rmdir(lower_mnt);
  }
  if (netns_file) umount2(netns_file, MNT_DETACH);
  if (userns_file) umount2(userns_file, MNT_DETACH);
  if (disk_bind) umount2(disk_bind, MNT_DETACH);
  if (disk) {
    // The log is the last file open there; unmounted at once, or lazily when still busy.
    if (log_fd >= 0) close(log_fd);
    log_fd = -1;
    if (umount2(disk, 0) < 0) umount2(disk, MNT_DETACH);
  }
}

static void ifreq_addr(struct ifreq *ifr, const char *name, in_addr_t addr) {
  memset(ifr, 0, sizeof *ifr);
  snprintf(ifr->ifr_name, IFNAMSIZ, "%s", name);
  struct sockaddr_in *sin = (struct sockaddr_in *)&ifr->ifr_addr;
  sin->sin_family = AF_INET;
  sin->sin_addr.s_addr = addr;
}

static int link_up(int sock, const char *name) {
  struct ifreq ifr;
  ifreq_addr(&ifr, name, 0);
  if (ioctl(sock, SIOCGIFFLAGS, &ifr) < 0) return -1;
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  return ioctl(sock, SIOCSIFFLAGS, &ifr);
}

// In a child that joined the container's network namespace (the file `ns`): lo up, eth0's address,
// default route (one already there is kept: a second configuration, after a failed restore).
// Plain ioctls: one `ip` spawn would cost more than this whole binary. Exit code: the failed step.
static int configure_net(const char *ns) {
  int ns_fd = open(ns, O_RDONLY | O_CLOEXEC);
  if (ns_fd < 0 || setns(ns_fd, CLONE_NEWNET) < 0) return 10;
  int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return 11;
  if (link_up(sock, "lo") < 0) return 12;
  struct ifreq ifr;
  ifreq_addr(&ifr, "eth0", inet_addr(net_ip));
  if (ioctl(sock, SIOCSIFADDR, &ifr) < 0) return 13;
  int prefix = atoi(net_prefix);
  ifreq_addr(&ifr, "eth0", htonl(prefix == 0 ? 0 : 0xffffffffu << (32 - prefix)));
  if (ioctl(sock, SIOCSIFNETMASK, &ifr) < 0) return 14;
  if (link_up(sock, "eth0") < 0) return 15;
  struct rtentry rt;
  memset(&rt, 0, sizeof rt);
  ((struct sockaddr_in *)&rt.rt_dst)->sin_family = AF_INET;
  ((struct sockaddr_in *)&rt.rt_genmask)->sin_family = AF_INET;
  struct sockaddr_in *gw = (struct sockaddr_in *)&rt.rt_gateway;
  gw->sin_family = AF_INET;
  gw->sin_addr.s_addr = inet_addr(net_gw);
  rt.rt_flags = RTF_UP | RTF_GATEWAY;
  if (ioctl(sock, SIOCADDRT, &rt) < 0 && errno != EEXIST) return 16;
  return 0;
}

// Configures the network namespace `ns` in a child (configure_net); fails the shim naming the step.
static void configure_net_in(const char *ns, int created) {
  pid_t child = fork();
  if (child < 0) fail(created, "fork");
  if (child == 0) _exit(configure_net(ns));
  int st;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {}
  static const char *steps[] = {"join the network namespace", "socket", "loopback up", "eth0 address", "eth0 netmask", "eth0 up", "default route"};
  int code = status_code(st);
  if (code >= 10 && code <= 16) fail_msg(created, "network", steps[code - 10]);
  if (code != 0) fail_msg(created, "network", "the configuring process failed");
}

static void setup_net(pid_t holder, int created) {
  char go[8] = {0};
  size_t n = 0;
  while (n < sizeof go - 1 && read(0, go + n, 1) == 1 && go[n] != '\n') n++;
  if (strncmp(go, "go", 2) != 0) fail_msg(created, "network", "not confirmed by the runtime");
  char ns[64];
  snprintf(ns, sizeof ns, "/proc/%d/ns/net", (int)holder);
  configure_net_in(ns, created);
}

// A child in a new namespace of `flags` (made as `owner` when not 0: dropping to that id drops
// every capability, as an unprivileged user would make it), held until the caller closes
// *release. Fails the shim with `what` when the child cannot make it.
static pid_t hold_new_ns(int flags, uid_t owner, const char *what, int *release) {
  int ready[2], hold[2];
  if (pipe2(ready, O_CLOEXEC) < 0 || pipe2(hold, O_CLOEXEC) < 0) fail(0, "pipe");
  pid_t child = fork();
  if (child < 0) fail(0, "fork");
  if (child == 0) {
    close(ready[0]);
    close(hold[1]); // else our own copy would keep the read below from ever seeing EOF
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    dup2(null_fd, 0);
    dup2(null_fd, 1); // never the launcher's pipe: it must see EOF when the shim ends
    char c = 'y';
    if (owner != 0 && (setgroups(0, NULL) < 0 || setresgid(owner, owner, owner) < 0 || setresuid(owner, owner, owner) < 0)) c = 'i';
    if (c == 'y' && unshare(flags) < 0) c = 'n';
    (void)!write(ready[1], &c, 1);
    while (read(hold[0], &c, 1) < 0 && errno == EINTR) {}
    _exit(0);
  }
  close(ready[1]);
  close(hold[0]);
  char c = 0;
  while (read(ready[0], &c, 1) < 0 && errno == EINTR) {}
  close(ready[0]);
  if (c == 'i') fail_msg(0, what, "cannot take the owner's id");
  if (c != 'y') fail_msg(0, what, "cannot unshare");
  *release = hold[1];
  return child;
}

// -N: a new network namespace, bind-mounted at netns_file, held by a child while the runtime
// attaches the veth (it names the namespace by that child's pid). Returns the child; the caller
// closes *release to let it exit.
static pid_t make_netns(int *release) {
  umount2(netns_file, MNT_DETACH); // a namespace left by a shim that died; EINVAL when none
  int fd = open(netns_file, O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) fail(0, "netns file");
  close(fd);
  pid_t child = hold_new_ns(CLONE_NEWNET, 0, "netns", release);
  char ns[64];
  snprintf(ns, sizeof ns, "/proc/%d/ns/net", (int)child);
  if (mount(ns, netns_file, NULL, MS_BIND, NULL) < 0) fail(0, "mount netns");
  return child;
}

// A child in a new user namespace, created as `owner` (its owner to the kernel), with ids
// inside..inside+size-1 mapped to outside..; returns an fd of that namespace and, with `file`,
// bind-mounts it there. The child exits at once: the fd and the mount keep the namespace.
static int make_userns(uid_t owner, long inside, long outside, long size, const char *file) {
  int release = -1;
  pid_t child = hold_new_ns(CLONE_NEWUSER, owner, "user namespace", &release);
  char path[64], map[96];
  int len = snprintf(map, sizeof map, "%ld %ld %ld\n", inside, outside, size);
  static const char *maps[] = {"uid_map", "gid_map"};
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "/proc/%d/%s", (int)child, maps[i]);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, map, (size_t)len) != len) fail(0, maps[i]);
    close(fd);
  }
  snprintf(path, sizeof path, "/proc/%d/ns/user", (int)child);
  int ns_fd = open(path, O_RDONLY | O_CLOEXEC);
  if (ns_fd < 0) fail(0, "user namespace fd");
  if (file) {
    umount2(file, MNT_DETACH); // a namespace left by a shim that died; EINVAL when none
    int fd = open(file, O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) fail(0, "userns file");
    close(fd);
    if (mount(path, file, NULL, MS_BIND, NULL) < 0) fail(0, "mount userns");
  }
  close(release);
  while (waitpid(child, NULL, 0) < 0 && errno == EINTR) {}
  return ns_fd;
}

// The image's tree as the pod's own range sees it: an idmapped clone of it (tree ids → the pod's),
// mounted at lower_mnt for the overlay to take as its lower layer.
static void mount_idmapped_lower(void) {
  if (snprintf(lower_mnt, sizeof lower_mnt, "%s.lower", rootfs) >= (int)sizeof lower_mnt) fail_msg(0, "overlay", "paths too long");
  umount2(lower_mnt, MNT_DETACH); // left by a shim that died; EINVAL when none
  if (mkdir(lower_mnt, 0700) < 0 && errno != EEXIST) fail(0, "lower mount point");
  int ns_fd = make_userns(0, id_tree, id_host, id_size, NULL);
  int tree = open_tree(AT_FDCWD, lower, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (tree < 0) fail(0, "open_tree lower");
  struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP, .userns_fd = (unsigned long long)ns_fd};
  if (mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0) fail(0, "idmap lower");
  if (move_mount(tree, "", AT_FDCWD, lower_mnt, MOVE_MOUNT_F_EMPTY_PATH) < 0) fail(0, "mount lower");
  close(tree);
  close(ns_fd);
}

static void parse_args(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int left = argc - i - 1;
    if (!strcmp(a, "--")) { runc_flags = argv + i + 1; n_runc_flags = left; break; }
    if (!strcmp(a, "-P")) { stdio_pipes = 1; continue; }
    if (left < 1) break;
    if (!strcmp(a, "-d")) pod_dir = argv[++i];
    else if (!strcmp(a, "-r")) runc = argv[++i];
    else if (!strcmp(a, "-R")) runc_root = argv[++i];
    else if (!strcmp(a, "-i")) id = argv[++i];
    else if (!strcmp(a, "-b")) bundle = argv[++i];
    else if (!strcmp(a, "-c")) cgroup_path = argv[++i];
    else if (!strcmp(a, "-o") && left >= 4) { lower = argv[++i]; upper = argv[++i]; work = argv[++i]; rootfs = argv[++i]; }
    else if (!strcmp(a, "-n") && left >= 3) { net_ip = argv[++i]; net_prefix = argv[++i]; net_gw = argv[++i]; }
    else if (!strcmp(a, "-N")) netns_file = argv[++i];
    else if (!strcmp(a, "-C")) checkpoint_dir = argv[++i];
    else if (!strcmp(a, "-K")) criu_dir = argv[++i];
    else if (!strcmp(a, "-V")) disk_bind = argv[++i];
    else if (!strcmp(a, "-D")) disk = argv[++i];
    else if (!strcmp(a, "-u")) userns_file = argv[++i];
    else if (!strcmp(a, "-l")) nofile_limit = atol(argv[++i]);
    else if (!strcmp(a, "-U") && left >= 3) { id_host = atol(argv[++i]); id_size = atol(argv[++i]); id_tree = atol(argv[++i]); }
    else { dprintf(1, "error argument: %s\n", a); _exit(125); }
  }
  if (!pod_dir || !runc || !runc_root || !id || !bundle) { dprintf(1, "error usage: -d -r -R -i -b are required\n"); _exit(125); }
  if (checkpoint_dir && !netns_file && !stdio_pipes) { dprintf(1, "error usage: -C needs -N (runsc) or -P (runc, whose restore hands back pipes only)\n"); _exit(125); }
  if ((id_host >= 0 || userns_file) && (id_host <= 0 || id_size <= 0 || id_tree < 0 || !rootfs)) { dprintf(1, "error usage: -U needs a host id, a size, a tree id and -o; -u needs -U\n"); _exit(125); }
}

// Whether the kernel's OOM killer killed a process of the container: "oom_kill N" with N > 0 in
// memory.oom_control (cgroup v1) or memory.events (v2). Read before `runc delete` removes the cgroup.
static int oom_killed(void) {
  if (!cgroup_path) return 0;
  static const char *files[] = {"/sys/fs/cgroup/memory%s/memory.oom_control", "/sys/fs/cgroup%s/memory.events"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[PATH_MAX], line[128];
    snprintf(path, sizeof path, files[i], cgroup_path);
    FILE *f = fopen(path, "re");
    if (!f) continue;
    long kills = 0;
    while (fgets(line, sizeof line, f)) {
      if (sscanf(line, "oom_kill %ld", &kills) == 1) break;
    }
    fclose(f);
    return kills > 0;
  }
  return 0;
}

/** Fewer free bytes than this is a full disk: when dd met ENOSPC on a 64 MiB image, 439 KiB were left (ext4 keeps a few clusters back for its own metadata). */
#define DISK_FULL_BYTES (1 << 20)
#define DISK_CHECK_SECONDS 1

static int disk_full(void) {
  struct statfs fs;
  if (statfs(disk, &fs) < 0) return 0;
  return (unsigned long long)fs.f_bavail * (unsigned long long)fs.f_bsize < DISK_FULL_BYTES;
}

// Reaps everything re-parented to us (the init, and runc's helpers) until the init ends: its status
// is the pod's. Meanwhile, with a disk, evicts the pod whose disk stays full (see the top).
static int wait_init(pid_t init, int *evicted) {
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL); // pending from here on, for sigtimedwait
  int full_checks = 0;
  for (;;) {
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
      if (p == copier) copier = -1;
      if (p == init) return st;
    }
    if (p < 0 && errno == ECHILD) return 137 << 8; // never ours (cannot happen once re-parented)
    struct timespec wait = {disk && !*evicted ? DISK_CHECK_SECONDS : 3600, 0};
    if (sigtimedwait(&chld, NULL, &wait) >= 0 || errno != EAGAIN || !disk || *evicted) continue;
    full_checks = disk_full() ? full_checks + 1 : 0;
    if (full_checks >= 2) {
      *evicted = 1;
      kill(init, SIGKILL); // pid 1 of the container's namespace: the kernel kills all the rest
    }
  }
}

int main(int argc, char **argv) {
  parse_args(argc, argv);
  signal(SIGPIPE, SIG_IGN); // a vanished reader shows as EPIPE on the "ready" line, handled below
  umask(022);
  dir_fd = open(pod_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) fail(0, "pod dir");
  if (disk) {
    // Never the bare mount point: the log (and the rootfs' layer) would land on the host's disk.
    char parent[PATH_MAX];
    struct stat a, b;
    snprintf(parent, sizeof parent, "%s/..", disk);
    if (stat(disk, &a) < 0 || stat(parent, &b) < 0 || a.st_dev == b.st_dev) fail_msg(0, "disk", "not mounted");
    int disk_fd = open(disk, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (disk_fd < 0) fail(0, "disk");
    log_fd = openat(disk_fd, "container.log", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    close(disk_fd);
  } else {
    log_fd = openat(dir_fd, "container.log", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  }
  if (log_fd < 0) fail(0, "container log");
  // A previous run's code must not be read as this run's.
  if (unlinkat(dir_fd, "exit-status", 0) < 0 && errno != ENOENT) fail(0, "unlink exit-status");
  unlinkat(dir_fd, "runc.log", 0);
  unlinkat(dir_fd, "restore-status", 0);
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) fail(0, "subreaper");
  if (nofile_limit > 0) {
    // Every runc process, and so the container, inherits these (src/runtime/oci/inherited-rlimits.ts
    // says why not config.json). Root here cannot raise a hard limit: a lower one fails the start by name.
    struct rlimit nofile = {(rlim_t)nofile_limit, (rlim_t)nofile_limit}, core = {0, 0};
    if (setrlimit(RLIMIT_NOFILE, &nofile) < 0) fail(0, "RLIMIT_NOFILE for the container (the worker's hard limit is lower?)");
    if (setrlimit(RLIMIT_CORE, &core) < 0) fail(0, "RLIMIT_CORE");
  }

  // A container left by a shim that died (the machine did not reboot) holds the id: remove it.
  // runc keeps <root>/<id>/, runsc <root>/<id>_sandbox:<id>.state.
  char state[PATH_MAX], runsc_state[PATH_MAX];
  snprintf(state, sizeof state, "%s/%s", runc_root, id);
  snprintf(runsc_state, sizeof runsc_state, "%s/%s_sandbox:%s.state", runc_root, id, id);
  if (access(state, F_OK) == 0 || access(runsc_state, F_OK) == 0) {
    const char *del[] = {"delete", "--force", id, NULL};
    run_runc(del);
  }
  if (rootfs) {
    char opts[3 * PATH_MAX + 64];
    umount2(rootfs, MNT_DETACH); // a stale mount of a shim that died; EINVAL when none
    if (id_host > 0) mount_idmapped_lower();
    if (snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s", id_host > 0 ? lower_mnt : lower, upper, work) >= (int)sizeof opts) fail_msg(0, "overlay", "paths too long");
    if (mount("overlay", rootfs, "overlay", 0, opts) < 0) fail(0, "mount rootfs");
    if (lower_mnt[0]) {
      // The overlay took a private clone of its lower layer: the mount point is not needed any more.
      umount2(lower_mnt, MNT_DETACH);
      rmdir(lower_mnt);
      lower_mnt[0] = 0;
    }
  }
  if (userns_file) close(make_userns((uid_t)id_host, 0, id_host, id_size, userns_file));
  if (disk_bind && disk) {
    umount2(disk_bind, MNT_DETACH); // left by a shim that died; EINVAL when none
    if (mkdir(disk_bind, 0700) < 0 && errno != EEXIST) fail(0, "disk bind point");
    if (mount(disk, disk_bind, NULL, MS_BIND, NULL) < 0) fail(0, "bind the disk for the volumes");
  }

  if (netns_file) {
    int release = -1;
    pid_t holder = make_netns(&release);
    dprintf(1, "pid %d\n", (int)holder);
    if (net_ip) setup_net(holder, 0);
    close(release);
    while (waitpid(holder, NULL, 0) < 0 && errno == EINTR) {}
  }

  char pid_path[PATH_MAX];
  snprintf(pid_path, sizeof pid_path, "%s/init.pid", pod_dir);
  unlink(pid_path);
  // No session keyring per container: when every sandbox's user was the same host uid (one shared
  // id map, as a pod made before ranges still has), the kernel's per-uid key quota (200) was shared
  // and runc's keyring per container and per exec ran out at ~200 open terminals. Seccomp denies
  // keyctl, add_key and request_key in the sandbox, so it cannot use any keyring anyway.
  // With -N (runsc, whose sandbox has its own kernel and no host keyring) the network is ready
  // before the container exists, so nothing needs doing between create and start: one
  // `run --detach` (~120 ms for create + start here, ~35 ms less as one).
  const char *create[] = {"create", "--no-new-keyring", "--bundle", bundle, "--pid-file", pid_path, id, NULL};
  const char *run[] = {"run", "--detach", "--bundle", bundle, "--pid-file", pid_path, id, NULL};
  int code, restored = 0;
  if (stdio_pipes) make_stdio_pipes();
  if (checkpoint_dir) {
    const char *restore_runsc[] = {"restore", "--detach", "--background", "--bundle", bundle, "--pid-file", pid_path, "--image-path", checkpoint_dir, id, NULL};
    // CRIU's own log goes beside the pod's runc.log, not into the image (deleted after the restore).
    char work[PATH_MAX];
    snprintf(work, sizeof work, "%s/restore-work", pod_dir);
    mkdir(work, 0700);
    char work_log[PATH_MAX + 16];
    snprintf(work_log, sizeof work_log, "%s/restore.log", work);
    unlink(work_log); // a previous restore's log must not be read as this one's
    const char *restore_runc[] = {"restore", "--detach", "--bundle", bundle, "--pid-file", pid_path, "--image-path", checkpoint_dir, "--work-path", work, id, NULL};
    code = netns_file ? run_runc(restore_runsc) : run_runc_io(restore_runc, 1, 1);
    restored = code == 0;
    char status[1600];
    if (code == 0) {
      snprintf(status, sizeof status, "restored\n");
    } else {
      // runsc destroys a container whose restore failed; a forced delete covers one it left.
      const char *criu = netns_file ? NULL : criu_error();
      snprintf(status, sizeof status, "failed %s%s%s\n", runc_error(), criu ? ": " : "", criu ? criu : "");
      const char *del[] = {"delete", "--force", id, NULL};
      run_runc(del);
      unlink(pid_path);
      if (netns_file) {
        if (net_ip) configure_net_in(netns_file, 0);
        code = run_runc(run);
      } else {
        code = run_runc_io(create, 1, 0);
      }
    }
    int fd = openat(dir_fd, "restore-status", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
      (void)!write(fd, status, strlen(status));
      close(fd);
    }
  } else {
    code = run_runc_io(netns_file ? run : create, 1, 0);
  }
  if (code != 0) fail_msg(1, netns_file ? "runc run" : "runc create", runc_error());
  FILE *pf = fopen(pid_path, "re");
  int init = 0;
  if (!pf || fscanf(pf, "%d", &init) != 1 || init <= 0) fail_msg(1, "runc create", "no pid file");
  fclose(pf);
  if (netns_file) {
    dprintf(1, "init %d\n", init);
  } else {
    dprintf(1, "pid %d\n", init);
    if (net_ip) setup_net((pid_t)init, 1);
    const char *start[] = {"start", id, NULL};
    if (!restored && run_runc(start) != 0) fail_msg(1, "runc start", runc_error());
  }
  // Nobody read "ready" (the launcher or the worker died during the start): nobody will track this
  // pod, so end it rather than leave it running untracked.
  if (dprintf(1, "ready\n") < 0) {
    kill(init, SIGKILL);
    fail(1, "report ready");
  }
  int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  dup2(null_fd, 0);
  dup2(null_fd, 1);
  dup2(null_fd, 2);
  // The container holds its pipes now: the copier ends when its processes do.
  if (io_out >= 0) close(io_out);
  if (io_in >= 0) close(io_in);
  io_out = io_in = -1;

  int evicted = 0;
  int st = wait_init((pid_t)init, &evicted);
  code = status_code(st);
  int oom = oom_killed();
  // Cleaned up first: the exit status is what tells a runtime that polls (an adopted pod) that the
  // pod is over, and a wake or remove must not race our `runc delete` and unmount.
  cleanup(1);
  char text[32];
  snprintf(text, sizeof text, "%d%s\n", code, evicted ? " Evicted" : oom ? " OOMKilled" : "");
  int fd = openat(dir_fd, "exit-status.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    (void)!write(fd, text, strlen(text));
    close(fd);
    renameat(dir_fd, "exit-status.tmp", dir_fd, "exit-status");
  }
  return code;
}
