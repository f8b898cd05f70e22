// Which directories of an overlayfs upper dir are opaque (xattr trusted.overlay.opaque = "y": the
// lower layers' entries under it are hidden). Node has no xattr call, hence this helper.
//   overlay-opaque <upper dir>   stdin: relative directory paths, each ended by a NUL byte
//   stdout: one line per path, in order: "1" opaque, "0" not, "E <errno>" when it cannot be opened
// The tree is a sandbox's: every path is opened with openat2 beneath the upper dir, refusing any
// symlink, magic link or mount crossing on the way, and as a directory only (never a FIFO).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

static int open_beneath(int root, const char *path) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  return (int)syscall(SYS_openat2, root, path, &how, sizeof how);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: overlay-opaque <upper dir> < NUL-separated relative paths\n");
    return 2;
  }
  int root = open(argv[1], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (root < 0) {
    perror("open upper dir");
    return 1;
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  while ((n = getdelim(&line, &cap, '\0', stdin)) > 0) {
    if (line[n - 1] == '\0') n--;
    line[n] = '\0';
    int fd = open_beneath(root, n == 0 ? "." : line);
    if (fd < 0) {
      printf("E %d\n", errno);
      continue;
    }
    char value[8];
    ssize_t got = fgetxattr(fd, "trusted.overlay.opaque", value, sizeof value);
    printf("%s\n", got == 1 && value[0] == 'y' ? "1" : "0");
    close(fd);
  }
  free(line);
  return fflush(stdout) == 0 ? 0 : 1;
}
