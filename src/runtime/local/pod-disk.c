// pod-disk: a sandbox pod's disk, a sparse ext4 image loop-mounted over its writable layer, its
// volumes and its log, so `resources.limits.ephemeral-storage` caps them all
// (src/runtime/local/disk.ts says why and what the runtime does around it).
//
// Usage (argv built by disk.ts, run through the runtime's launcher):
//   pod-disk mount <image> <dir> <bytes> <templates>
//                                          make <image> if it is missing (a sparse copy of the
//                                          template of that size in <templates>, made once with
//                                          mkfs.ext4), then loop-mount it at <dir> unless something
//                                          is mounted there
//   pod-disk umount <dir>                  unmount <dir> if something is mounted there
//   pod-disk shift <dir> <from> <to> <size>
//                                          every file under <dir> (not crossing into other
//                                          mounts) owned by an id in from..from+size-1 is given
//                                          the id at the same offset from <to>: a disk copied from
//                                          another sandbox (a snapshot, a fork) takes the new
//                                          sandbox's host id range (id-ranges.ts)
//   pod-disk freeze <dir> | thaw <dir>     FIFREEZE / FITHAW the filesystem mounted at <dir>: its
//                                          image is whole and consistent on the host while frozen
//   pod-disk copy <image> <to> [<dir> freeze|sync]
//                                          a sparse copy of <image> (its data extents) to <to>;
//                                          with <dir>, the filesystem of <image> mounted there is
//                                          first frozen (and thawed after the copy: its sandbox
//                                          runs on) or synced (syncfs: its sandbox is paused and
//                                          writes nothing, so its image is whole once its writes
//                                          and journal are on it; a mount of the copy replays
//                                          the journal, as after a crash)
// On failure: one line "error <what>: <why>" on stdout, exit 1.
//
// Measured on this machine (2 cores, Linux 6.18): mkfs.ext4 of a 10 GiB sparse image writes 4.3
// MiB (the inode tables are not written: mke2fs punches the file, so it knows they read as zeros,
// and the kernel's lazy init has nothing to do), but it is a process of its own (4.5 ms of CPU)
// and ends with an fsync: 54 ms of wall time each, one after another, most of it waiting for the
// host disk's flush. The sparse copy of a template made once copies the same 4.3 MiB (17 extents)
// in-process, without the flush: ~1 ms. The loop device and the mount take 3-8 ms here, against
// 29 ms for `mount -o loop` (util-linux scans every loop device and reads the mount table first,
// which grows with every pod).
// Every copy of a template is the same filesystem (UUID, directory hash seed) until the pod writes
// to it: nothing reads those across pods (a loop-mounted ext4 is not found by UUID, and only the
// sandbox's own directories hash with its seed, which it cannot read).
#define _GNU_SOURCE
#include <dirent.h>
#include <ftw.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <linux/loop.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int fail(const char *what, const char *why) {
  dprintf(1, "error %s: %s\n", what, why);
  return 1;
}

// Whether a filesystem other than its parent's is mounted at dir (a mount point has its own st_dev).
// Whether something is mounted at path: a directory or a file (a pod's userns and netns are
// namespace files bound onto files). The parent is path without its last component: "<path>/.."
// fails with ENOTDIR for a file, which read as "nothing mounted", so the namespace a killed shim
// left bound stayed, and the pod dir could not be removed under it (EBUSY; found by make soak).
static int mounted(const char *path) {
  char parent[PATH_MAX];
  struct stat a, b;
  if (snprintf(parent, sizeof parent, "%s", path) >= (int)sizeof parent) return 0;
  char *slash = strrchr(parent, '/');
  if (slash == NULL) return 0;
  slash[slash == parent ? 1 : 0] = '\0';
  if (stat(path, &a) < 0 || stat(parent, &b) < 0) return 0;
  return a.st_dev != b.st_dev;
}

// mkfs.ext4 on a sparse file of `bytes`, made under a temporary name (of this process: pods of
// the same size race to make their template) and renamed into place, so a crash half-way never
// leaves an image that is not a filesystem.
//   -m 0: no blocks reserved for root (the sandbox's root is no host root; all of it is the pod's);
//   lazy_journal_init: the journal is not zeroed, as the file reads as zeros already (a 10 GiB
//   image otherwise writes its 64 MiB journal at once).
static int make_image(const char *image, long long bytes) {
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s.%d.tmp", image, (int)getpid()) >= (int)sizeof tmp) return fail("image", "path too long");
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return fail("create image", strerror(errno));
  if (ftruncate(fd, (off_t)bytes) < 0) {
    int err = errno;
    close(fd);
    unlink(tmp);
    return fail("size image", strerror(err));
  }
  close(fd);
  pid_t pid = fork();
  if (pid < 0) return fail("fork", strerror(errno));
  if (pid == 0) {
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    dup2(null_fd, 0);
    dup2(null_fd, 1); // -q: it prints only errors, on stderr, which the runtime reads
    char *argv[] = {"mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_journal_init=1,root_owner=0:0", tmp, NULL};
    char *env[] = {"PATH=/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin", NULL};
    execve("/usr/sbin/mkfs.ext4", argv, env);
    execve("/sbin/mkfs.ext4", argv, env);
    execvpe("mkfs.ext4", argv, env);
    dprintf(1, "error mkfs.ext4: %s (install Debian's e2fsprogs)\n", strerror(errno));
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) return fail("wait for mkfs.ext4", strerror(errno));
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    unlink(tmp);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127) return 1; // the child said why
    return fail("mkfs.ext4", "failed");
  }
  if (rename(tmp, image) < 0) return fail("rename image", strerror(errno));
  return 0;
}

// Copies the template's data extents into out (already of its size): only the ext4 metadata mkfs
// wrote is read and written, the rest stays a hole. A clone (FICLONE) shares the extents instead
// where the state dir's filesystem can (btrfs, XFS); this host's ext4 cannot.
static int copy_extents(int in, int out, off_t size) {
  if (ioctl(out, FICLONE, in) == 0) return 0;
  off_t at = 0;
  while (at < size) {
    off_t data = lseek(in, at, SEEK_DATA);
    if (data < 0) return errno == ENXIO ? 0 : -1; // ENXIO: no data past at
    off_t hole = lseek(in, data, SEEK_HOLE);
    if (hole < 0) return -1;
    off_t from = data, to = data;
    while (from < hole) {
      ssize_t n = copy_file_range(in, &from, out, &to, (size_t)(hole - from), 0);
      if (n < 0) return -1;
      if (n == 0) break; // the template is shorter than it said: cannot happen, it is never written
    }
    at = hole;
  }
  return 0;
}

// A new file `to` of `size` holding in's data extents (copy_extents); on failure it is removed,
// -1 with errno set.
static int copy_into(int in, off_t size, const char *to) {
  int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (out < 0) return -1;
  int rc = ftruncate(out, size) < 0 ? -1 : copy_extents(in, out, size);
  int err = errno;
  close(out);
  if (rc < 0) {
    unlink(to);
    errno = err;
  }
  return rc;
}

// The pod's image: a sparse copy of <templates>/ext4-<bytes>.img, which is made first if missing.
// Under a temporary name and renamed into place, as the template. No fsync: the copy is 4.3 MiB in
// the host's page cache, and the pod's own ext4 flushes it when its journal first commits (the loop
// device passes the flush on to the image file, as an fsync); a crash before that loses a disk that
// held nothing yet. mkfs.ext4's own fsync per pod was most of its 54 ms.
static int make_pod_image(const char *image, const char *bytes_text, const char *templates) {
  char *end;
  errno = 0;
  long long bytes = strtoll(bytes_text, &end, 10);
  if (errno != 0 || *end != 0 || bytes <= 0) return fail("image size", bytes_text);
  char template[PATH_MAX], tmp[PATH_MAX];
  if (snprintf(template, sizeof template, "%s/ext4-%lld.img", templates, bytes) >= (int)sizeof template) return fail("template", "path too long");
  if (snprintf(tmp, sizeof tmp, "%s.tmp", image) >= (int)sizeof tmp) return fail("image", "path too long");
  if (mkdir(templates, 0700) < 0 && errno != EEXIST) return fail("templates", strerror(errno));
  int in = open(template, O_RDONLY | O_CLOEXEC);
  if (in < 0 && errno == ENOENT) {
    // One maker per template: the first refill of a new worker starts its pods at once, and each
    // would run its own mkfs.ext4 (and flush) of the same template. The others wait on the lock
    // (~50 ms), then copy it.
    char lock[PATH_MAX];
    if (snprintf(lock, sizeof lock, "%s.lock", template) >= (int)sizeof lock) return fail("template", "path too long");
    int lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd < 0) return fail("template lock", strerror(errno));
    while (flock(lock_fd, LOCK_EX) < 0) {
      if (errno != EINTR) return fail("template lock", strerror(errno));
    }
    in = open(template, O_RDONLY | O_CLOEXEC);
    if (in < 0 && errno == ENOENT) {
      if (make_image(template, bytes) != 0) return 1;
      in = open(template, O_RDONLY | O_CLOEXEC);
    }
    int err = errno;
    close(lock_fd); // releases the lock
    errno = err;
  }
  if (in < 0) return fail("open template", strerror(errno));
  struct stat st;
  if (fstat(in, &st) < 0 || st.st_size != (off_t)bytes) {
    close(in);
    return fail("template", "not of the disk's size");
  }
  int rc = copy_into(in, st.st_size, tmp);
  int err = errno;
  close(in);
  if (rc < 0) return fail("copy template", strerror(err));
  if (rename(tmp, image) < 0) return fail("rename image", strerror(errno));
  return 0;
}

// A free loop device bound to image: LOOP_CONFIGURE sets the file and its flags in one ioctl.
// AUTOCLEAR frees the device when the mount (its last user) goes, so no unmount path, even a lazy
// one, leaves a device behind. DIRECT_IO: the image's pages are cached once, by the ext4 inside,
// not a second time in the host's cache of the image file. Returns the open device or -1.
static int attach_loop(int image_fd, char *dev, size_t dev_size) {
  int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (ctl < 0) return -1;
  // Another process may take the free device between GET_FREE and CONFIGURE (EBUSY): ask again,
  // after a short random pause. GET_FREE gives every racer the same lowest free device, and 300
  // concurrent starts (a pool refill) once ran 12 of them out of 64 back-to-back attempts.
  srand((unsigned)getpid());
  for (int attempt = 0; attempt < 1000; attempt++) {
    int n = ioctl(ctl, LOOP_CTL_GET_FREE);
    if (n < 0) break;
    snprintf(dev, dev_size, "/dev/loop%d", n);
    int fd = open(dev, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) continue; // udev/devtmpfs has not made the node yet
      break;
    }
    struct loop_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.fd = (unsigned)image_fd;
    cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
    if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0) {
      close(ctl);
      return fd;
    }
    int err = errno;
    close(fd);
    if (err != EBUSY) {
      errno = err;
      break;
    }
    usleep((useconds_t)(rand() % 2000));
  }
  int err = errno;
  close(ctl);
  errno = err;
  return -1;
}

// A loop device still bound to image, open, or -1. Our unmount ends the mount in the host's mount
// namespace, but a namespace cloned from it meanwhile (every `runc create`, until its pivot_root)
// holds a copy, and with it the filesystem and its device, a little longer. A second device on the
// same image would be a second ext4 over the same blocks, so the wake mounts the one still bound:
// the kernel hands back the same filesystem. The path names the candidates (sysfs, as losetup
// reads it); the device and inode (LOOP_GET_STATUS64) prove it is this very file.
static int bound_loop(const char *image, const struct stat *img, char *dev, size_t dev_size) {
  char real[PATH_MAX];
  if (!realpath(image, real)) return -1;
  DIR *d = opendir("/sys/block");
  if (!d) return -1;
  int found = -1;
  struct dirent *e;
  while (found < 0 && (e = readdir(d))) {
    if (strncmp(e->d_name, "loop", 4) != 0) continue;
    char path[PATH_MAX], backing[PATH_MAX];
    snprintf(path, sizeof path, "/sys/block/%s/loop/backing_file", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue; // not bound
    ssize_t n = read(fd, backing, sizeof backing - 1);
    close(fd);
    if (n <= 0) continue;
    backing[n] = 0;
    if (backing[n - 1] == '\n') backing[n - 1] = 0;
    if (strcmp(backing, real) != 0) continue;
    snprintf(dev, dev_size, "/dev/%s", e->d_name);
    int loop_fd = open(dev, O_RDWR | O_CLOEXEC);
    if (loop_fd < 0) continue;
    struct loop_info64 info;
    if (ioctl(loop_fd, LOOP_GET_STATUS64, &info) == 0 && info.lo_inode == img->st_ino && info.lo_device == img->st_dev) found = loop_fd;
    else close(loop_fd);
  }
  closedir(d);
  return found;
}

static int mount_disk(const char *image, const char *dir, const char *bytes, const char *templates) {
  if (mounted(dir)) return 0; // still mounted: a shim that died before unmounting it
  int made = 0;
  if (access(image, F_OK) < 0) {
    if (errno != ENOENT) return fail("image", strerror(errno));
    if (make_pod_image(image, bytes, templates) != 0) return 1;
    made = 1;
  }
  int image_fd = open(image, O_RDWR | O_CLOEXEC);
  if (image_fd < 0) return fail("open image", strerror(errno));
  struct stat img;
  if (fstat(image_fd, &img) < 0) return fail("stat image", strerror(errno));
  char dev[sizeof "/dev/" + NAME_MAX];
  // Only an image that was mounted before can still be bound: a new one skips the scan of every
  // loop device, which a refill of 300 pods made 300 times over ~300 devices (2.6 s of its CPU).
  int loop_fd = made ? -1 : bound_loop(image, &img, dev, sizeof dev);
  if (loop_fd < 0) loop_fd = attach_loop(image_fd, dev, sizeof dev);
  int err = errno;
  close(image_fd);
  if (loop_fd < 0) return fail("loop device", strerror(err));
  // discard: a file the sandbox deletes gives its blocks back to the host (the loop device punches
  // holes in the image), so the image costs what the sandbox holds now, not the most it ever held.
  int rc = mount(dev, dir, "ext4", MS_NOSUID | MS_NODEV, "discard");
  err = errno;
  close(loop_fd); // the mount holds the device now; on a failed mount this frees it (AUTOCLEAR)
  if (rc < 0) return fail("mount disk", strerror(err));
  return 0;
}

static long shift_from, shift_to, shift_size;
static int shift_failed;

static long shifted(long id) {
  return id >= shift_from && id < shift_from + shift_size ? id - shift_from + shift_to : id;
}

static int shift_one(const char *path, const struct stat *st, int type, struct FTW *ftw) {
  (void)type;
  (void)ftw;
  uid_t uid = (uid_t)shifted((long)st->st_uid);
  gid_t gid = (gid_t)shifted((long)st->st_gid);
  if (uid == st->st_uid && gid == st->st_gid) return 0;
  // lchown clears set-id bits: they are put back, as they were.
  if (lchown(path, uid, gid) < 0) {
    shift_failed = errno;
    return 0;
  }
  if (!S_ISLNK(st->st_mode) && (st->st_mode & (S_ISUID | S_ISGID))) chmod(path, st->st_mode & 07777);
  return 0;
}

static int shift_ids(const char *dir, const char *from, const char *to, const char *size) {
  shift_from = atol(from);
  shift_to = atol(to);
  shift_size = atol(size);
  if (shift_from <= 0 || shift_to <= 0 || shift_size <= 0) return fail("shift", "ids must be positive");
  if (nftw(dir, shift_one, 64, FTW_PHYS | FTW_MOUNT) < 0) return fail("shift", strerror(errno));
  if (shift_failed) return fail("shift", strerror(shift_failed));
  return 0;
}

static int freeze(const char *dir, unsigned long request) {
  if (!mounted(dir)) return fail(request == FIFREEZE ? "freeze" : "thaw", "not mounted");
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fail(request == FIFREEZE ? "freeze" : "thaw", strerror(errno));
  int rc = ioctl(fd, request, 0);
  int err = errno;
  close(fd);
  // Thawing a filesystem that is not frozen is no failure (a thaw after a failed freeze).
  if (rc < 0 && !(request == FITHAW && err == EINVAL)) return fail(request == FIFREEZE ? "freeze" : "thaw", strerror(err));
  return 0;
}

// A freeze (FIFREEZE) also writes the ext4 journal into place, with flushes of the loop device
// (fsyncs of the image on the host): 34-104 ms here after 256 MiB had been written to the host's
// disk, against 1-3 ms for syncfs, which commits. A snapshot of a paused gVisor pod holding 256 MiB
// (make bench) went from 330 to 237 ms with a sync, and the copy beside the image's seal.
static int copy_image(const char *image, const char *to, const char *dir, const char *how) {
  int frozen = 0;
  if (dir != NULL) {
    if (!mounted(dir)) return fail("copy", "the disk is not mounted");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return fail("copy", strerror(errno));
    int rc = !strcmp(how, "freeze") ? ioctl(fd, FIFREEZE, 0) : syncfs(fd);
    int err = errno;
    close(fd);
    if (rc < 0) return fail(!strcmp(how, "freeze") ? "freeze" : "sync", strerror(err));
    frozen = !strcmp(how, "freeze");
  }
  int rc = 0, err = 0;
  int in = open(image, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (in < 0 || fstat(in, &st) < 0 || copy_into(in, st.st_size, to) < 0) {
    rc = -1;
    err = errno;
  }
  if (in >= 0) close(in);
  if (frozen && freeze(dir, FITHAW) != 0) return 1;
  return rc < 0 ? fail("copy image", strerror(err)) : 0;
}

int main(int argc, char **argv) {
  if (argc == 6 && !strcmp(argv[1], "shift")) return shift_ids(argv[2], argv[3], argv[4], argv[5]);
  if (argc == 3 && !strcmp(argv[1], "freeze")) return freeze(argv[2], FIFREEZE);
  if (argc == 3 && !strcmp(argv[1], "thaw")) return freeze(argv[2], FITHAW);
  if (argc == 4 && !strcmp(argv[1], "copy")) return copy_image(argv[2], argv[3], NULL, NULL);
  if (argc == 6 && !strcmp(argv[1], "copy") && (!strcmp(argv[5], "freeze") || !strcmp(argv[5], "sync"))) return copy_image(argv[2], argv[3], argv[4], argv[5]);
  if (argc == 6 && !strcmp(argv[1], "mount")) return mount_disk(argv[2], argv[3], argv[4], argv[5]);
  if (argc == 3 && !strcmp(argv[1], "umount")) {
    if (!mounted(argv[2])) return 0;
    // Lazily when busy: the mount goes from the tree at once, the device when its last user does.
    if (umount2(argv[2], 0) < 0 && umount2(argv[2], MNT_DETACH) < 0) return fail("unmount disk", strerror(errno));
    return 0;
  }
  return fail("usage", "pod-disk mount <image> <dir> <bytes> <templates> | umount <dir> | shift <dir> <from> <to> <size> | freeze <dir> | thaw <dir> | copy <image> <to> [<dir> freeze|sync]");
}
