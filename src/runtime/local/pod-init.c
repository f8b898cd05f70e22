// pod-init: starts one local sandbox pod, then stays as its pid 1 and reaps zombies.
//
// Why C: the warm pool must start 300 pods in 3 s on 2 cores, about 20 ms of CPU per pod in all.
// python3 with ctypes costs 25 ms just to start here and a shell doing the mounts costs ~2 ms per
// `mount` spawn (a dozen per pod). This binary does every namespace, mount and interface step
// with plain syscalls in well under 1 ms. The runtime compiles it once per state dir with `cc`.
//
// Usage (built by src/runtime/local/init-command.ts):
//   pod-init -d <podDir> -h <hostname> -u <uid> -g <gid> -w <cwd> [-n <ip> <prefix> <gw>] [-U]
//            [-o /usr]... [-v <src> <dst> ro|rw]... [-e K=V]... -- <argv>...
// Protocol on stdout, one line each: "pid <host pid of the pod's init>", then "ready" or
// "error <what>: <why>". With -n it reads "go\n" on stdin (the runtime has moved the veth peer
// into the pod's network namespace) before configuring eth0.
// The outer process stays as a tiny shim (no namespaces of its own beyond pid/net) that waits for
// the init and records its exit code in <podDir>/exit-status, so the code survives a worker restart.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/capability.h>
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_ITEMS 64
extern char **environ;

static const char *pod_dir, *hostname = "sandbox", *cwd = "/";
static const char *net_ip, *net_prefix, *net_gw;
static int userns; // degraded mode for non-root: a user namespace mapping only our own uid to 0
static uid_t uid = 1000;
static gid_t gid = 1000;
static const char *overlays[8];
static int n_overlays;
static const char *vol_src[MAX_ITEMS], *vol_dst[MAX_ITEMS];
static int vol_ro[MAX_ITEMS], n_vols;
static char *envs[256];
static int n_envs;
static char **cmd;

static void fail(const char *what, const char *arg) {
  dprintf(1, "error %s %s: %s\n", what, arg ? arg : "", strerror(errno));
  _exit(125);
}

static void path_join(char *out, const char *a, const char *b) {
  if (snprintf(out, PATH_MAX, "%s%s", a, b) >= PATH_MAX) { errno = ENAMETOOLONG; fail("path", b); }
}

// mkdir -p; returns 1 when the last component was created now.
static int mkdir_p(const char *path, mode_t mode) {
  char buf[PATH_MAX];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0755) < 0 && errno != EEXIST) fail("mkdir", buf);
    *p = '/';
  }
  if (mkdir(buf, mode) == 0) { chmod(buf, mode); return 1; }
  if (errno != EEXIST) fail("mkdir", buf);
  return 0;
}

static void mount_or_fail(const char *src, const char *dst, const char *type, unsigned long flags, const char *data) {
  if (mount(src, dst, type, flags, data) < 0) fail("mount", dst);
}

static void write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0 || write(fd, text, strlen(text)) < 0) fail("write", path);
  close(fd);
}

static void setup_dev(const char *root) {
  static const struct { const char *name; int major, minor; } nodes[] = {
    {"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0},
  };
  char dev[PATH_MAX], p[PATH_MAX], host[PATH_MAX];
  path_join(dev, root, "/dev");
  mount_or_fail("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=1024k");
  for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
    snprintf(p, sizeof p, "%s/%s", dev, nodes[i].name);
    if (!userns) {
      if (mknod(p, S_IFCHR | 0666, makedev(nodes[i].major, nodes[i].minor)) < 0) fail("mknod", p);
    } else { // a user namespace may not create device nodes; bind the host's instead
      snprintf(host, sizeof host, "/dev/%s", nodes[i].name);
      close(open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0666));
      mount_or_fail(host, p, NULL, MS_BIND, NULL);
    }
  }
  snprintf(p, sizeof p, "%s/pts", dev);
  mkdir_p(p, 0755);
  mount_or_fail("devpts", p, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
  snprintf(p, sizeof p, "%s/shm", dev);
  mkdir_p(p, 01777);
  mount_or_fail("tmpfs", p, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  static const char *links[][2] = {{"pts/ptmx", "ptmx"}, {"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"},
                                   {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}};
  for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
    snprintf(p, sizeof p, "%s/%s", dev, links[i][1]);
    if (symlink(links[i][0], p) < 0) fail("symlink", p);
  }
}

static void ifreq_addr(struct ifreq *ifr, const char *name, in_addr_t addr) {
  memset(ifr, 0, sizeof *ifr);
  snprintf(ifr->ifr_name, IFNAMSIZ, "%s", name);
  struct sockaddr_in *sin = (struct sockaddr_in *)&ifr->ifr_addr;
  sin->sin_family = AF_INET;
  sin->sin_addr.s_addr = addr;
}

static void link_up(int sock, const char *name) {
  struct ifreq ifr;
  ifreq_addr(&ifr, name, 0);
  if (ioctl(sock, SIOCGIFFLAGS, &ifr) < 0) fail("find interface", name);
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  if (ioctl(sock, SIOCSIFFLAGS, &ifr) < 0) fail("link up", name);
}

// Plain ioctls instead of spawning `ip` inside: one spawn would cost more than this whole binary.
static void setup_net(void) {
  char go[8] = {0};
  size_t n = 0;
  while (n < sizeof go - 1 && read(0, go + n, 1) == 1 && go[n] != '\n') n++;
  if (strncmp(go, "go", 2) != 0) { errno = ECANCELED; fail("network", "not confirmed by the runtime"); }
  int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (sock < 0) fail("socket", NULL);
  link_up(sock, "lo");
  struct ifreq ifr;
  ifreq_addr(&ifr, "eth0", inet_addr(net_ip));
  if (ioctl(sock, SIOCSIFADDR, &ifr) < 0) fail("address", net_ip);
  int prefix = atoi(net_prefix);
  ifreq_addr(&ifr, "eth0", htonl(prefix == 0 ? 0 : 0xffffffffu << (32 - prefix)));
  if (ioctl(sock, SIOCSIFNETMASK, &ifr) < 0) fail("netmask", net_prefix);
  link_up(sock, "eth0");
  struct rtentry rt;
  memset(&rt, 0, sizeof rt);
  ((struct sockaddr_in *)&rt.rt_dst)->sin_family = AF_INET;
  ((struct sockaddr_in *)&rt.rt_genmask)->sin_family = AF_INET;
  struct sockaddr_in *gw = (struct sockaddr_in *)&rt.rt_gateway;
  gw->sin_family = AF_INET;
  gw->sin_addr.s_addr = inet_addr(net_gw);
  rt.rt_flags = RTF_UP | RTF_GATEWAY;
  if (ioctl(sock, SIOCADDRT, &rt) < 0) fail("default route", net_gw);
  close(sock);
}

static void setup_root(void) {
  char root[PATH_MAX], p[PATH_MAX], q[PATH_MAX];
  path_join(root, pod_dir, "/rootfs");
  if (unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC) < 0) fail("unshare", "mount,uts,ipc");
  mount_or_fail(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
  mkdir_p(root, 0755);
  mount_or_fail(root, root, NULL, MS_BIND, NULL);
  for (int i = 0; i < n_overlays; i++) {
    char upper[PATH_MAX], work[PATH_MAX], opts[3 * PATH_MAX + 64];
    snprintf(upper, sizeof upper, "%s/upper%s", pod_dir, overlays[i]);
    snprintf(work, sizeof work, "%s/work%s", pod_dir, overlays[i]);
    mkdir_p(upper, 0755);
    mkdir_p(work, 0700);
    path_join(p, root, overlays[i]);
    mkdir_p(p, 0755);
    snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s", overlays[i], upper, work);
    mount_or_fail("overlay", p, "overlay", 0, opts);
  }
  // Debian is merged-usr: these are symlinks on the host too.
  static const char *usr_links[] = {"bin", "sbin", "lib", "lib64", "lib32", "libx32"};
  for (size_t i = 0; i < sizeof usr_links / sizeof usr_links[0]; i++) {
    snprintf(q, sizeof q, "/usr/%s", usr_links[i]);
    if (access(q, F_OK) < 0) continue;
    snprintf(p, sizeof p, "%s/%s", root, usr_links[i]);
    snprintf(q, sizeof q, "usr/%s", usr_links[i]);
    if (symlink(q, p) < 0 && errno != EEXIST) fail("symlink", p);
  }
  static const struct { const char *dir; mode_t mode; } dirs[] = {
    {"/tmp", 01777}, {"/var/tmp", 01777}, {"/root", 0700}, {"/home", 0755}, {"/proc", 0555}, {"/sys", 0555},
    {"/dev", 0755}, {"/run", 0755}, {"/mnt", 0755}, {"/opt", 0755}, {"/srv", 0755},
  };
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
    path_join(p, root, dirs[i].dir);
    mkdir_p(p, dirs[i].mode);
  }
  path_join(p, root, "/home/user");
  if (mkdir_p(p, 0755) && chown(p, uid, gid) < 0) fail("chown", p);
  path_join(p, root, "/proc");
  mount_or_fail("proc", p, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  path_join(p, root, "/sys");
  mount("sysfs", p, "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL); // optional: tools cope without
  path_join(p, root, "/run");
  mount_or_fail("tmpfs", p, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=16m");
  setup_dev(root);
  // Volumes are bind-mounted in two steps: first onto a staging dir in the pod's fresh /run tmpfs
  // (no sandbox process has run there yet, so nothing in that path can be a planted symlink),
  // then, after pivot_root, onto their mount points, so that creating a mount point resolves
  // symlinks inside the sandbox and never on the host (the sandbox user owns its home). A bind
  // from an fd opened before pivot_root fails with EINVAL once the old root is detached.
  for (int i = 0; i < n_vols; i++) {
    char stage[PATH_MAX];
    snprintf(stage, sizeof stage, "%s/run/.asb-vol%d", root, i);
    if (mkdir(stage, 0700) < 0 && errno != EEXIST) fail("mkdir", stage);
    mount_or_fail(vol_src[i], stage, NULL, MS_BIND | MS_REC, NULL);
  }
  if (sethostname(hostname, strlen(hostname)) < 0) fail("sethostname", hostname);
  if (net_ip) setup_net();
  if (chdir(root) < 0) fail("chdir", root);
  if (syscall(SYS_pivot_root, ".", ".") < 0) fail("pivot_root", root);
  if (umount2(".", MNT_DETACH) < 0) fail("umount", "old root");
  if (chdir("/") < 0) fail("chdir", "/");
  for (int i = 0; i < n_vols; i++) {
    mkdir_p(vol_dst[i], 0755);
    snprintf(p, sizeof p, "/run/.asb-vol%d", i);
    mount_or_fail(p, vol_dst[i], NULL, MS_BIND | MS_REC, NULL);
    if (vol_ro[i]) mount_or_fail(NULL, vol_dst[i], NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL);
    if (umount2(p, MNT_DETACH) < 0) fail("umount", p);
    rmdir(p);
  }
}

static void drop_privileges(void) {
  for (int cap = 0; cap <= 63; cap++) {
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno == EINVAL) break;
  }
  if (setgroups(0, NULL) < 0 && !userns) fail("setgroups", NULL);
  if (setresgid(gid, gid, gid) < 0) fail("setgid", NULL);
  if (setresuid(uid, uid, uid) < 0) fail("setuid", NULL);
  prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) fail("no_new_privs", NULL);
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  if (syscall(SYS_capset, &hdr, data) < 0) fail("capset", NULL);
}

static int status_code(int st) {
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// pid 1 of the pod: start the container command, forward termination, reap every orphan.
static int run_init(sigset_t *sigs, int log_fd) {
  pid_t main_pid = fork();
  if (main_pid < 0) fail("fork", NULL);
  if (main_pid == 0) {
    setsid();
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    dup2(null_fd, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    umask(022);
    drop_privileges();
    if (chdir(cwd) < 0 && chdir("/") < 0) _exit(126);
    envs[n_envs] = NULL;
    environ = envs;
    sigprocmask(SIG_UNBLOCK, sigs, NULL);
    execvp(cmd[0], cmd);
    dprintf(2, "pod-init: exec %s: %s\n", cmd[0], strerror(errno));
    _exit(127);
  }
  // Nobody read "ready" (the launcher or the worker died during the start): nobody will track this
  // pod, so end it rather than leave it running untracked. As the namespace's pid 1 we get no
  // SIGPIPE for this (the kernel drops default-action signals to it), only EPIPE.
  if (dprintf(1, "ready\n") < 0) _exit(125);
  int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  dup2(null_fd, 0);
  dup2(null_fd, 1);
  for (;;) {
    siginfo_t info;
    int sig = sigwaitinfo(sigs, &info);
    if (sig == SIGCHLD) {
      int st;
      pid_t p;
      while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
        if (p == main_pid) return status_code(st); // the kernel kills the rest of the pid namespace
      }
    } else if (sig > 0) {
      kill(-1, SIGTERM); // everyone in the pod but pid 1; they exit and are reaped above
    }
  }
}

static void parse_args(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int left = argc - i - 1;
    if (!strcmp(a, "--")) { cmd = argv + i + 1; break; }
    if (!strcmp(a, "-U")) { userns = 1; continue; }
    if (left < 1) break;
    if (!strcmp(a, "-d")) pod_dir = argv[++i];
    else if (!strcmp(a, "-h")) hostname = argv[++i];
    else if (!strcmp(a, "-u")) uid = (uid_t)atoi(argv[++i]);
    else if (!strcmp(a, "-g")) gid = (gid_t)atoi(argv[++i]);
    else if (!strcmp(a, "-w")) cwd = argv[++i];
    else if (!strcmp(a, "-o") && n_overlays < 8) overlays[n_overlays++] = argv[++i];
    else if (!strcmp(a, "-e") && n_envs < 255) envs[n_envs++] = argv[++i];
    else if (!strcmp(a, "-n") && left >= 3) { net_ip = argv[++i]; net_prefix = argv[++i]; net_gw = argv[++i]; }
    else if (!strcmp(a, "-v") && left >= 3 && n_vols < MAX_ITEMS) {
      vol_src[n_vols] = argv[++i];
      vol_dst[n_vols] = argv[++i];
      vol_ro[n_vols++] = !strcmp(argv[++i], "ro");
    } else { errno = EINVAL; fail("argument", a); }
  }
  if (!pod_dir || !cmd || !cmd[0]) { errno = EINVAL; fail("usage", "-d <podDir> ... -- <argv>"); }
}

static void map_self(void) {
  char map[64];
  snprintf(map, sizeof map, "0 %d 1", (int)getuid());
  uid_t host_uid = getuid();
  gid_t host_gid = getgid();
  if (unshare(CLONE_NEWUSER) < 0) fail("unshare", "user");
  write_file("/proc/self/setgroups", "deny");
  snprintf(map, sizeof map, "0 %d 1", (int)host_uid);
  write_file("/proc/self/uid_map", map);
  snprintf(map, sizeof map, "0 %d 1", (int)host_gid);
  write_file("/proc/self/gid_map", map);
  uid = 0;
  gid = 0;
}

int main(int argc, char **argv) {
  parse_args(argc, argv);
  umask(0);
  int dir_fd = open(pod_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) fail("pod dir", pod_dir);
  int log_fd = openat(dir_fd, "container.log", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (log_fd < 0) fail("log", pod_dir);
  // A previous run's code must not be read as this run's (done here: one fs call less in the worker).
  if (unlinkat(dir_fd, "exit-status", 0) < 0 && errno != ENOENT) fail("unlink", "exit-status");
  if (userns) map_self();
  if (unshare(CLONE_NEWPID | (net_ip ? CLONE_NEWNET : 0)) < 0) fail("unshare", "pid,net");
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGCHLD);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGHUP);
  sigprocmask(SIG_BLOCK, &sigs, NULL);
  pid_t child = fork();
  if (child < 0) fail("fork", NULL);
  if (child == 0) {
    setup_root();
    _exit(run_init(&sigs, log_fd));
  }
  dprintf(1, "pid %d\n", (int)child);
  int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  dup2(null_fd, 0);
  dup2(null_fd, 1);
  int st;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {}
  int code = status_code(st);
  char text[16];
  snprintf(text, sizeof text, "%d\n", code);
  int fd = openat(dir_fd, "exit-status", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) { (void)!write(fd, text, strlen(text)); close(fd); }
  return code;
}
