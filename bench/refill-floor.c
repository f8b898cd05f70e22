// refill-floor: the floor under the runtime's refill (bench/refill.ts). One pod's work done by the
// raw tools and syscalls, with no Node, no launcher and no shim in the loop; the bench runs it once
// per pod under `xargs -P <pods>`, so all of them start at once as the refill's start()s do.
//
// The work is what a pod of the local runtime needs before it runs (src/runtime/local/oci-pod.ts,
// pod-disk.c, oci-shim.c), each step done the cheapest way known:
//   its disk: a sparse ext4 image of the pod's ephemeral-storage size (mode `copy`: a sparse copy
//     of one template made with pod-disk.c's mkfs.ext4 flags, as pod-disk.c does now; mode `mkfs`:
//     mkfs.ext4 per pod, as it did before), on a loop device (LOOP_CONFIGURE), mounted;
//   upper/ and work/ on it, its /etc/hosts and /etc/hostname, its config.json (the runtime's own
//     spec: user namespace, seccomp, cgroup limits, masked paths), an overlay rootfs;
//   `runc create`, a veth on the bridge whose peer is the container's eth0 (one netlink message),
//     eth0's address and default route (ioctls in the container's network namespace), `runc start`.
// Usage:
//   refill-floor up   <ctx> <runc> <bridge> <net> <prefix> <disk bytes> <mkfs|copy> <uid> <i>
//   refill-floor down <ctx> <runc> <i>
// <ctx> holds config.tmpl (the spec with @D@, @M@ and @ID@ for the pod dir, its mount point and
// its id), lower (a symlink to the image's id-mapped tree), template.img (mode copy), and gets
// pods/<i>/, mnt/<i>/ and runc/. <net> is the pods' network's first address (a.b.c.d): pod i gets
// net + 2 + i, the gateway is net + 1. Failure: "error <what>: <why>" on stdout, exit 1.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_link.h>
#include <linux/loop.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <limits.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef VETH_INFO_PEER
#define VETH_INFO_PEER 1
#endif

static const char *ctx, *runc;
static char pod[PATH_MAX], mnt[PATH_MAX], id[64], runc_root[PATH_MAX];

static void die(const char *what, const char *why) {
  printf("error %s: %s\n", what, why);
  exit(1);
}

static void die_errno(const char *what) { die(what, strerror(errno)); }

// Runs argv to its end with stdio on /dev/null (or fd out); its exit code.
static int run(char *const argv[], int out) {
  pid_t pid = fork();
  if (pid < 0) die_errno("fork");
  if (pid == 0) {
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    dup2(null_fd, 0);
    dup2(out >= 0 ? out : null_fd, 1);
    dup2(out >= 0 ? out : null_fd, 2);
    char *env[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL};
    execve(argv[0], argv, env);
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) die_errno("wait");
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void make_image(const char *image, long long bytes, const char *mode) {
  if (!strcmp(mode, "copy")) {
    // A sparse copy of the template: only its data extents (the ext4 metadata) are read and written.
    char template[PATH_MAX];
    snprintf(template, sizeof template, "%s/template.img", ctx);
    int in = open(template, O_RDONLY | O_CLOEXEC);
    int out = open(image, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (in < 0 || out < 0) die_errno("open image");
    struct stat st;
    if (fstat(in, &st) < 0 || ftruncate(out, st.st_size) < 0) die_errno("size image");
    off_t at = 0;
    for (;;) {
      off_t data = lseek(in, at, SEEK_DATA);
      if (data < 0) break; // ENXIO: no data past at
      off_t hole = lseek(in, data, SEEK_HOLE);
      off_t from = data, to = data;
      while (from < hole) {
        ssize_t n = copy_file_range(in, &from, out, &to, (size_t)(hole - from), 0);
        if (n <= 0) die_errno("copy image");
      }
      at = hole;
    }
    close(in);
    close(out);
    return;
  }
  int fd = open(image, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0) die_errno("image");
  close(fd);
  char *argv[] = {"/usr/sbin/mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_journal_init=1,root_owner=0:0", (char *)image, NULL};
  if (run(argv, -1) != 0) die("mkfs.ext4", "failed");
}

// As pod-disk.c: a free loop device bound to the image (autoclear, direct I/O), mounted at dir.
static void mount_image(const char *image, const char *dir) {
  int image_fd = open(image, O_RDWR | O_CLOEXEC);
  int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (image_fd < 0 || ctl < 0) die_errno("open loop");
  srand((unsigned)getpid());
  char dev[64];
  int loop_fd = -1;
  for (int attempt = 0; attempt < 1000 && loop_fd < 0; attempt++) {
    int n = ioctl(ctl, LOOP_CTL_GET_FREE);
    if (n < 0) die_errno("loop-control");
    snprintf(dev, sizeof dev, "/dev/loop%d", n);
    int fd = open(dev, O_RDWR | O_CLOEXEC);
    if (fd < 0) continue;
    struct loop_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.fd = (unsigned)image_fd;
    cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
    if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0) loop_fd = fd;
    else {
      if (errno != EBUSY) die_errno("loop configure");
      close(fd);
      usleep((useconds_t)(rand() % 2000));
    }
  }
  if (loop_fd < 0) die("loop", "no free device");
  if (mount(dev, dir, "ext4", MS_NOSUID | MS_NODEV, "discard") < 0) die_errno("mount disk");
  close(loop_fd);
  close(image_fd);
  close(ctl);
}

static void write_file(const char *path, const char *text, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) die_errno(path);
  close(fd);
}

// config.tmpl with @D@, @M@ and @ID@ replaced.
static void write_config(void) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/config.tmpl", ctx);
  FILE *f = fopen(path, "re");
  if (!f) die_errno("config.tmpl");
  static char tmpl[1 << 20], out[1 << 20];
  size_t n = fread(tmpl, 1, sizeof tmpl - 1, f);
  fclose(f);
  tmpl[n] = 0;
  size_t o = 0;
  for (const char *p = tmpl; *p && o < sizeof out - PATH_MAX;) {
    const char *with = NULL;
    size_t skip = 0;
    if (!strncmp(p, "@D@", 3)) with = pod, skip = 3;
    else if (!strncmp(p, "@M@", 3)) with = mnt, skip = 3;
    else if (!strncmp(p, "@ID@", 4)) with = id, skip = 4;
    if (with) {
      o += (size_t)snprintf(out + o, sizeof out - o, "%s", with);
      p += skip;
    } else {
      out[o++] = *p++;
    }
  }
  out[o] = 0;
  snprintf(path, sizeof path, "%s/config.json", pod);
  write_file(path, out, 0600);
}

static void addattr(struct nlmsghdr *nh, int type, const void *data, size_t len) {
  struct rtattr *rta = (struct rtattr *)((char *)nh + NLMSG_ALIGN(nh->nlmsg_len));
  rta->rta_type = (unsigned short)type;
  rta->rta_len = (unsigned short)RTA_LENGTH(len);
  if (len) memcpy(RTA_DATA(rta), data, len);
  nh->nlmsg_len = NLMSG_ALIGN(nh->nlmsg_len) + RTA_ALIGN(rta->rta_len);
}

static struct rtattr *nest(struct nlmsghdr *nh, int type) {
  struct rtattr *rta = (struct rtattr *)((char *)nh + NLMSG_ALIGN(nh->nlmsg_len));
  addattr(nh, type, NULL, 0);
  return rta;
}

static void end_nest(struct nlmsghdr *nh, struct rtattr *rta) { rta->rta_len = (unsigned short)((char *)nh + nh->nlmsg_len - (char *)rta); }

// `ip link add <host> master <bridge> up type veth peer name eth0 address <mac> netns <pid>`, as one message.
static void add_veth(const char *host, const char *bridge, int pid, const unsigned char mac[6]) {
  static char buf[1024];
  memset(buf, 0, sizeof buf);
  struct nlmsghdr *nh = (struct nlmsghdr *)buf;
  nh->nlmsg_len = NLMSG_LENGTH(sizeof(struct ifinfomsg));
  nh->nlmsg_type = RTM_NEWLINK;
  nh->nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK;
  struct ifinfomsg *ifi = NLMSG_DATA(nh);
  ifi->ifi_family = AF_UNSPEC;
  ifi->ifi_flags = IFF_UP;
  ifi->ifi_change = IFF_UP;
  addattr(nh, IFLA_IFNAME, host, strlen(host) + 1);
  unsigned master = if_nametoindex(bridge);
  if (master == 0) die_errno("bridge");
  addattr(nh, IFLA_MASTER, &master, sizeof master);
  struct rtattr *info = nest(nh, IFLA_LINKINFO);
  addattr(nh, IFLA_INFO_KIND, "veth", 4);
  struct rtattr *data = nest(nh, IFLA_INFO_DATA);
  struct rtattr *peer = nest(nh, VETH_INFO_PEER);
  nh->nlmsg_len += sizeof(struct ifinfomsg); // the peer's own ifinfomsg, zeroed
  addattr(nh, IFLA_IFNAME, "eth0", 5);
  addattr(nh, IFLA_ADDRESS, mac, 6);
  addattr(nh, IFLA_NET_NS_PID, &pid, sizeof pid);
  end_nest(nh, peer);
  end_nest(nh, data);
  end_nest(nh, info);
  int sock = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (sock < 0) die_errno("netlink");
  struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
  if (sendto(sock, buf, nh->nlmsg_len, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0) die_errno("netlink send");
  char reply[1024];
  ssize_t n = recv(sock, reply, sizeof reply, 0);
  if (n < 0) die_errno("netlink recv");
  struct nlmsghdr *r = (struct nlmsghdr *)reply;
  if (r->nlmsg_type == NLMSG_ERROR) {
    struct nlmsgerr *err = NLMSG_DATA(r);
    if (err->error != 0) die("veth", strerror(-err->error));
  }
  close(sock);
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

// In a child in the container's network namespace: lo up, eth0's address, up, default route (as oci-shim.c).
static void configure_net(int pid, in_addr_t ip, int prefix, in_addr_t gw) {
  pid_t child = fork();
  if (child < 0) die_errno("fork");
  if (child == 0) {
    char ns[64];
    snprintf(ns, sizeof ns, "/proc/%d/ns/net", pid);
    int fd = open(ns, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) _exit(10);
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr;
    if (sock < 0 || link_up(sock, "lo") < 0) _exit(11);
    ifreq_addr(&ifr, "eth0", ip);
    if (ioctl(sock, SIOCSIFADDR, &ifr) < 0) _exit(12);
    ifreq_addr(&ifr, "eth0", htonl(0xffffffffu << (32 - prefix)));
    if (ioctl(sock, SIOCSIFNETMASK, &ifr) < 0 || link_up(sock, "eth0") < 0) _exit(13);
    struct rtentry rt;
    memset(&rt, 0, sizeof rt);
    ((struct sockaddr_in *)&rt.rt_dst)->sin_family = AF_INET;
    ((struct sockaddr_in *)&rt.rt_genmask)->sin_family = AF_INET;
    ((struct sockaddr_in *)&rt.rt_gateway)->sin_family = AF_INET;
    ((struct sockaddr_in *)&rt.rt_gateway)->sin_addr.s_addr = gw;
    rt.rt_flags = RTF_UP | RTF_GATEWAY;
    _exit(ioctl(sock, SIOCADDRT, &rt) < 0 ? 14 : 0);
  }
  int st;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {}
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("network", "cannot configure eth0");
}

static int up(char **argv) {
  const char *bridge = argv[0], *net = argv[1], *mode = argv[4];
  int prefix = atoi(argv[2]);
  long long bytes = atoll(argv[3]);
  unsigned uid = (unsigned)atoi(argv[5]);
  int i = atoi(argv[6]);
  char disk[PATH_MAX], path[PATH_MAX], lower[PATH_MAX], text[512];
  snprintf(disk, sizeof disk, "%s/disk", pod);
  if (mkdir(pod, 0700) < 0 || mkdir(disk, 0700) < 0) die_errno("pod dir");
  snprintf(path, sizeof path, "%s/disk.img", pod);
  make_image(path, bytes, mode);
  mount_image(path, disk);
  snprintf(path, sizeof path, "%s/upper", disk);
  if (mkdir(path, 0755) < 0 || chown(path, uid, uid) < 0) die_errno("upper");
  snprintf(path, sizeof path, "%s/work", disk);
  if (mkdir(path, 0700) < 0) die_errno("work");
  snprintf(path, sizeof path, "%s/etc", pod);
  if (mkdir(path, 0700) < 0) die_errno("etc");
  in_addr_t base = ntohl(inet_addr(net));
  struct in_addr ip = {htonl(base + 2 + (unsigned)i)}, gw = {htonl(base + 1)};
  char ip_text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &ip, ip_text, sizeof ip_text);
  snprintf(path, sizeof path, "%s/etc/hostname", pod);
  snprintf(text, sizeof text, "%s\n", id);
  write_file(path, text, 0644);
  snprintf(path, sizeof path, "%s/etc/hosts", pod);
  snprintf(text, sizeof text, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", ip_text, id);
  write_file(path, text, 0644);
  write_config();
  if (mkdir(mnt, 0755) < 0) die_errno("mount point");
  snprintf(lower, sizeof lower, "%s/lower", ctx);
  char real_lower[PATH_MAX];
  if (!realpath(lower, real_lower)) die_errno("lower");
  snprintf(text, sizeof text, "lowerdir=%s,upperdir=%s/upper,workdir=%s/work", real_lower, disk, disk);
  if (mount("overlay", mnt, "overlay", 0, text) < 0) die_errno("mount rootfs");
  snprintf(path, sizeof path, "%s/container.log", disk);
  int log = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  char pid_file[PATH_MAX];
  snprintf(pid_file, sizeof pid_file, "%s/init.pid", pod);
  char *create[] = {(char *)runc, "--root", runc_root, "create", "--no-new-keyring", "--bundle", pod, "--pid-file", pid_file, id, NULL};
  if (run(create, log) != 0) die("runc create", "failed (see container.log)");
  FILE *pf = fopen(pid_file, "re");
  int pid = 0;
  if (!pf || fscanf(pf, "%d", &pid) != 1) die("runc create", "no pid file");
  fclose(pf);
  char host_if[IFNAMSIZ];
  snprintf(host_if, sizeof host_if, "vf%s", id + strlen(id) - (strlen(id) > 12 ? 12 : strlen(id)));
  in_addr_t a = ntohl(ip.s_addr);
  unsigned char mac[6] = {0x02, 0x42, (unsigned char)(a >> 24), (unsigned char)(a >> 16), (unsigned char)(a >> 8), (unsigned char)a};
  add_veth(host_if, bridge, pid, mac);
  configure_net(pid, ip.s_addr, prefix, gw.s_addr);
  char *start[] = {(char *)runc, "--root", runc_root, "start", id, NULL};
  if (run(start, log) != 0) die("runc start", "failed (see container.log)");
  close(log);
  return 0;
}

static int down(void) {
  char *del[] = {(char *)runc, "--root", runc_root, "delete", "--force", id, NULL};
  run(del, -1);
  char disk[PATH_MAX];
  snprintf(disk, sizeof disk, "%s/disk", pod);
  umount2(mnt, MNT_DETACH);
  if (umount2(disk, 0) < 0) umount2(disk, MNT_DETACH);
  rmdir(mnt);
  char *rm[] = {"/bin/rm", "-rf", pod, NULL};
  return run(rm, -1);
}

int main(int argc, char **argv) {
  if (argc < 5) die("usage", "refill-floor up|down <ctx> <runc> ... <i>");
  ctx = argv[2];
  runc = argv[3];
  const char *i = argv[argc - 1];
  snprintf(id, sizeof id, "rf-floor-%s", i);
  snprintf(pod, sizeof pod, "%s/pods/%s", ctx, i);
  snprintf(mnt, sizeof mnt, "%s/mnt/%s", ctx, i);
  snprintf(runc_root, sizeof runc_root, "%s/runc", ctx);
  if (!strcmp(argv[1], "up") && argc == 11) return up(argv + 4);
  if (!strcmp(argv[1], "down") && argc == 5) return down();
  die("usage", "refill-floor up <ctx> <runc> <bridge> <net> <prefix> <bytes> <mkfs|copy> <uid> <i> | down <ctx> <runc> <i>");
  return 1;
}
