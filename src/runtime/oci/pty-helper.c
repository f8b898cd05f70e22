// pty-helper: one small host process per open terminal into a runc container (src/runtime/oci/pty.ts).
//
// Usage: pty-helper GRACE_MS RUNTIME ARGS..., in a private working directory. It
//   1. becomes a child subreaper, listens on ./console.sock and runs RUNTIME (an absolute path)
//      with ARGS, which pty.ts makes `--root ROOT exec -d --console-socket console.sock
//      --pid-file pid --process process.json ID` (process.json: terminal:true, the user, no
//      capabilities, no_new_privs). runc starts the process in the container's namespaces, cgroup
//      and seccomp filter, writes its pid to ./pid and sends the pty master back over SCM_RIGHTS.
//      The process is detached from runc, so once runc's own processes exit it is re-parented to
//      us (the subreaper) and we get its exit status;
//   2. writes "ready PID\n" on fd 3 and closes it (on failure: nothing there, runc's message on
//      stderr, exit 125);
//   3. bridges the terminal: stdin carries frames (1 type byte, 4-byte big-endian length,
//      payload): 'd' bytes for the terminal, 'r' a resize (cols, rows as big-endian u16, applied
//      with TIOCSWINSZ, which also sends SIGWINCH). stdout carries the raw terminal output;
//   4. exits with the process's exit code (128+n when signal n ended it).
// Backpressure: the master is read only when the last output has been written to stdout, so a
// reader that stops reading fills the pty and blocks the program in it, as on a real terminal.
// Every fd is non-blocking, so a full stdout never keeps us from noticing a hangup on stdin.
// Hangup: when stdin closes (the session was closed, or the worker died) or stdout breaks, the
// master is closed, which hangs up the terminal (the kernel sends SIGHUP and SIGCONT to the
// session leader), and the process's group gets SIGHUP too. A process still alive GRACE_MS later
// gets SIGKILL, with its group. SIGTERM to us does the same.
//
// Why C and not the host's python3: one runs per open terminal for its whole life. This is a
// 22 KB binary with ~120 KiB of memory of its own; a python3 bridge is ~10 MB RSS and ~80 ms to
// start (figures in pty.ts).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#define SOCKET_NAME "console.sock" // names pty.ts passes to runc, relative to our cwd
#define PID_FILE "pid"
#define BUF 65536

extern char **environ;

static pid_t shell = -1;

// Before the terminal is up: nothing to clean up but runc's files, which pty.ts removes.
static void fail(const char *what) {
  dprintf(2, "pty-helper: %s: %s\n", what, strerror(errno));
  exit(125);
}

// After: the process must not outlive us unseen, so it goes with us.
static void die(const char *what) {
  dprintf(2, "pty-helper: %s: %s\n", what, strerror(errno));
  if (shell > 0) {
    kill(-shell, SIGKILL);
    kill(shell, SIGKILL);
  }
  exit(1);
}

static int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

static pid_t run_runtime(char **argv) {
  pid_t pid = fork();
  if (pid < 0) fail("fork");
  if (pid > 0) return pid;
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(2, 1) < 0) _exit(125);
  // Our fds 3+ (the ready pipe, the socket) are not runc's business: closed on exec.
  for (int fd = 3; fd < 1024; fd++) fcntl(fd, F_SETFD, FD_CLOEXEC);
  execve(argv[0], argv, environ);
  dprintf(2, "pty-helper: exec %s: %s\n", argv[0], strerror(errno));
  _exit(125);
}

// The pty master runc sent (with its name as data); -1 if none came.
static int receive_master(int listener) {
  int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (conn < 0) return -1;
  char name[4096];
  struct iovec iov = {name, sizeof name};
  union { struct cmsghdr align; char buf[CMSG_SPACE(sizeof(int) * 4)]; } control;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf, .msg_controllen = sizeof control.buf};
  ssize_t n;
  do n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
  close(conn);
  int master = -1;
  if (n < 0) return -1;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (master < 0) master = fd; else close(fd);
    }
  }
  return master;
}

static pid_t read_pid_file(void) {
  char text[32] = {0};
  int fd = open(PID_FILE, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return -1;
  char *end;
  long pid = strtol(text, &end, 10);
  return pid > 1 && (*end == '\0' || *end == '\n') ? (pid_t)pid : -1;
}

static void set_size(int master, unsigned cols, unsigned rows) {
  struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
  ioctl(master, TIOCSWINSZ, &ws);
}

// Input parser state: a frame header is collected, then its payload streams through.
static unsigned char in_buf[BUF];
static size_t in_len, in_off;
static unsigned char header[5], resize[4];
static size_t header_have, resize_have;
static uint32_t payload_left;

// Moves parsed stdin bytes to the terminal. Returns 1 if the terminal took no more (wait for POLLOUT).
static int pump_input(int master) {
  while (in_off < in_len) {
    if (header_have < 5) {
      header[header_have++] = in_buf[in_off++];
      if (header_have == 5) {
        payload_left = (uint32_t)header[1] << 24 | (uint32_t)header[2] << 16 | (uint32_t)header[3] << 8 | header[4];
        resize_have = 0;
        if (payload_left == 0) header_have = 0;
      }
      continue;
    }
    size_t n = in_len - in_off < payload_left ? in_len - in_off : payload_left;
    if (header[0] == 'd' && master >= 0) {
      ssize_t w = write(master, in_buf + in_off, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EAGAIN) return 1;
      if (w >= 0) n = (size_t)w; // else EIO: nobody holds the terminal any more; the bytes are dropped
    } else if (header[0] == 'r') {
      for (size_t i = 0; i < n && resize_have < 4; i++) resize[resize_have++] = in_buf[in_off + i];
    }
    in_off += n;
    payload_left -= (uint32_t)n;
    if (payload_left == 0) {
      if (header[0] == 'r' && resize_have == 4 && master >= 0) {
        set_size(master, (unsigned)resize[0] << 8 | resize[1], (unsigned)resize[2] << 8 | resize[3]);
      }
      header_have = 0;
    }
  }
  in_off = in_len = 0;
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3 || argv[2][0] != '/') {
    dprintf(2, "usage: pty-helper GRACE_MS /ABSOLUTE/RUNTIME ARGS...\n");
    return 125;
  }
  long grace_ms = strtol(argv[1], NULL, 10);
  if (grace_ms <= 0) grace_ms = 2000;

  if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) fail("PR_SET_CHILD_SUBREAPER");
  signal(SIGPIPE, SIG_IGN); // a broken stdout is a hangup, seen as EPIPE
  sigset_t handled;
  sigemptyset(&handled);
  sigaddset(&handled, SIGCHLD);
  sigaddset(&handled, SIGTERM);
  sigaddset(&handled, SIGINT);
  sigaddset(&handled, SIGHUP);
  if (sigprocmask(SIG_BLOCK, &handled, NULL) < 0) fail("sigprocmask");
  int sig_fd = signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  int timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (sig_fd < 0 || timer_fd < 0) fail("signalfd");

  // runc connects, sends the master and closes before it exits: the connection waits in the
  // backlog until we accept it after runc is done.
  int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX, .sun_path = SOCKET_NAME};
  if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(listener, 1) < 0) fail("console socket");
  pid_t runc_pid = run_runtime(argv + 2);
  int status;
  while (waitpid(runc_pid, &status, 0) < 0) if (errno != EINTR) fail("waitpid runc");
  if (status != 0) {
    dprintf(2, "pty-helper: runc exec exited with %d\n", exit_code(status));
    return 125;
  }
  int master = receive_master(listener);
  if (master < 0) fail("runc sent no terminal");
  close(listener);
  shell = read_pid_file();
  if (shell < 0) fail("runc wrote no pid file");
  // It must be ours now (re-parented from runc), or we could neither wait for it nor safely signal it.
  int shell_done = 0, code = 1;
  pid_t got = waitpid(shell, &status, WNOHANG);
  if (got < 0) {
    pid_t pid = shell;
    shell = -1; // not ours: never signal a pid we cannot hold
    dprintf(2, "pty-helper: process %d was not re-parented to us\n", (int)pid);
    return 125;
  }
  if (got == shell) { shell_done = 1; code = exit_code(status); }
  if (dprintf(3, "ready %d\n", (int)shell) < 0 && errno != EBADF) die("ready");
  close(3);

  if (fcntl(master, F_SETFL, O_NONBLOCK) < 0 || fcntl(0, F_SETFL, O_NONBLOCK) < 0 || fcntl(1, F_SETFL, O_NONBLOCK) < 0) die("O_NONBLOCK");
  static unsigned char out_buf[BUF];
  size_t out_len = 0, out_off = 0;
  int stdin_open = 1, master_eof = 0, input_blocked = 0, hung_up = 0;

  for (;;) {
    if (shell_done && (hung_up || master_eof) && out_len == 0) break;
    if (shell_done && !hung_up && out_len == 0) {
      // Gone: pass on what it wrote last (whatever is in the pty now), then exit.
      ssize_t n = read(master, out_buf, sizeof out_buf);
      if (n > 0) { out_len = (size_t)n; out_off = 0; }
      else if (n < 0 && errno == EINTR) continue;
      else master_eof = 1;
      continue;
    }
    struct pollfd p[6];
    int n_fds = 0, i_sig = n_fds++, i_timer = n_fds++, i_in = -1, i_master = -1, i_out = -1;
    p[i_sig] = (struct pollfd){.fd = sig_fd, .events = POLLIN};
    p[i_timer] = (struct pollfd){.fd = timer_fd, .events = POLLIN};
    // stdin is always watched for a hangup (POLLHUP is reported even when not asked for), and read
    // only when the last input has reached the terminal.
    int want_input = !input_blocked && in_len == 0;
    if (stdin_open && !hung_up) { i_in = n_fds++; p[i_in] = (struct pollfd){.fd = 0, .events = (short)(want_input ? POLLIN : 0)}; }
    if (!hung_up && !master_eof && (out_len == 0 || input_blocked)) {
      i_master = n_fds++;
      p[i_master] = (struct pollfd){.fd = master, .events = (short)((out_len == 0 ? POLLIN : 0) | (input_blocked ? POLLOUT : 0))};
    }
    if (!hung_up && out_len > 0) { i_out = n_fds++; p[i_out] = (struct pollfd){.fd = 1, .events = POLLOUT}; }
    if (poll(p, (nfds_t)n_fds, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    int hangup_now = 0;

    if (p[i_sig].revents & POLLIN) {
      struct signalfd_siginfo si;
      while (read(sig_fd, &si, sizeof si) == sizeof si) {
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT || si.ssi_signo == SIGHUP) hangup_now = 1;
      }
      pid_t pid;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (pid == shell && !shell_done) { shell_done = 1; code = exit_code(status); }
      }
    }
    if (p[i_timer].revents & POLLIN) {
      uint64_t ticks;
      if (read(timer_fd, &ticks, sizeof ticks) < 0 && errno != EAGAIN) die("timerfd");
      if (!shell_done) {
        kill(-shell, SIGKILL);
        kill(shell, SIGKILL);
      }
    }
    if (i_master >= 0 && (p[i_master].revents & (POLLIN | POLLHUP | POLLERR)) && out_len == 0) {
      ssize_t n = read(master, out_buf, sizeof out_buf);
      if (n > 0) { out_len = (size_t)n; out_off = 0; }
      else if (n == 0 || (errno != EAGAIN && errno != EINTR)) master_eof = 1; // EIO: no holder of the terminal left
    }
    if (i_master >= 0 && (p[i_master].revents & (POLLOUT | POLLERR | POLLHUP)) && input_blocked) {
      input_blocked = pump_input(master_eof ? -1 : master);
    }
    if (i_in >= 0 && !want_input && (p[i_in].revents & (POLLHUP | POLLERR))) {
      stdin_open = 0;
      hangup_now = 1;
    } else if (i_in >= 0 && (p[i_in].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = read(0, in_buf, sizeof in_buf);
      if (n > 0) {
        in_len = (size_t)n;
        in_off = 0;
        input_blocked = pump_input(master_eof ? -1 : master);
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        stdin_open = 0;
        hangup_now = 1;
      }
    }
    if (i_out >= 0 && (p[i_out].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t n = write(1, out_buf + out_off, out_len - out_off);
      if (n > 0) {
        out_off += (size_t)n;
        if (out_off == out_len) out_len = out_off = 0;
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        hangup_now = 1; // EPIPE: nobody reads the terminal any more
      }
    }
    if (hangup_now && !hung_up) {
      hung_up = 1;
      out_len = out_off = 0;
      if (!shell_done) {
        // The foreground job may be in a group of its own (a job-control shell puts it there).
        pid_t fg = tcgetpgrp(master);
        kill(-shell, SIGHUP);
        if (fg > 0 && fg != shell) kill(-fg, SIGHUP);
        struct itimerspec grace = {.it_value = {.tv_sec = grace_ms / 1000, .tv_nsec = (grace_ms % 1000) * 1000000}};
        if (timerfd_settime(timer_fd, 0, &grace, NULL) < 0) die("timerfd_settime");
      }
      close(master); // the last master: the kernel hangs the terminal up
      master = -1;
      master_eof = 1;
    }
  }
  return code;
}
