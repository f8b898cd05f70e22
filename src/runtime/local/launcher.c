// launcher: one small long-lived process per local runtime that fork()s and execs the pod shims (and
// helpers such as `ip -batch`) on behalf of the Node worker.
//
// Why: Node's child_process.spawn forks the whole (large) Node process and blocks its event loop
// until the child execs, 6-20 ms per spawn on 2 cores. A warm-pool refill of 300 pods spent 44% of
// the worker's CPU in spawn, took ~5.4 s instead of <= 3 s, and held REST claims (1-5 ms of work)
// 20-60 ms behind it. This process is a few hundred KiB, so its fork costs well under 0.1 ms.
//
// Protocol: records on stdin (requests) and stdout (events), each a 9-byte header
//   u32 payload length (little endian) | u8 type | u32 child id (chosen by Node) | payload
// Requests:
//   'S' start:  u8 flags (bit 0: the child's stderr joins its stdout), then argv as NUL-terminated
//               strings; argv[0] is looked up on PATH. The child runs in its own session (setsid).
//   'W' write:  bytes for the child's stdin.      'C' close: close the child's stdin.
//   'K' kill:   u8 signal number.
// Events:
//   'P' u32 pid of the started child.   'O' bytes the child wrote.   'Z' its output ended (EOF).
//   'X' i32 exit: the exit code, or minus the signal that killed it. Always after its 'Z'.
// A failed exec is reported like the pod shim reports errors: an "error ..." line, then exit 127.
//
// When stdin closes (the worker exited or closed the runtime), the launcher just exits: children
// are never killed. Pods are in their own sessions and keep running; the next runtime re-adopts
// them by pid and start time. The shim has replaced its pipes with /dev/null once "ready" is
// written, so our pipes closing cannot hurt a running pod.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define HEADER 9
#define MAX_PAYLOAD (16u << 20) // argv of a pod is a few KiB; anything near this is a bug in Node

// epoll tags: the low 2 bits say which kind of fd, the rest is the child id.
enum { TAG_REQUESTS = 0, TAG_SIGNALS = 1, TAG_OUT = 2, TAG_IN = 3 };

struct child {
  uint32_t id;
  pid_t pid;
  int in_fd;       // write end of the child's stdin, -1 once closed
  int out_fd;      // read end of its stdout, -1 after EOF
  char *queue;     // stdin bytes the pipe did not take yet (written on EPOLLOUT)
  size_t queued, sent;
  int close_when_sent;
};

static struct child *kids;
static size_t n_kids, cap_kids;
static int ep, null_fd;

static void die(const char *what) {
  dprintf(2, "launcher: %s: %s\n", what, strerror(errno));
  exit(1);
}

static void put_u32(unsigned char *p, uint32_t v) {
  p[0] = v & 255; p[1] = (v >> 8) & 255; p[2] = (v >> 16) & 255; p[3] = v >> 24;
}

static uint32_t get_u32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// Events are written blocking: Node drains its pipe, and a full pipe only slows pod starts.
// A failed write means Node is gone, and then there is nobody left to serve.
static void send_event(char type, uint32_t id, const void *data, size_t len) {
  unsigned char head[HEADER];
  put_u32(head, (uint32_t)len);
  head[4] = (unsigned char)type;
  put_u32(head + 5, id);
  struct iovec iov[2] = {{head, HEADER}, {(void *)data, len}};
  size_t left = HEADER + len;
  while (left > 0) {
    ssize_t n = writev(1, iov, 2);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) exit(0);
    left -= (size_t)n;
    for (int i = 0; i < 2; i++) {
      size_t step = (size_t)n < iov[i].iov_len ? (size_t)n : iov[i].iov_len;
      iov[i].iov_base = (char *)iov[i].iov_base + step;
      iov[i].iov_len -= step;
      n -= (ssize_t)step;
    }
  }
}

static void send_exit(uint32_t id, int code) {
  unsigned char p[4];
  put_u32(p, (uint32_t)code);
  send_event('X', id, p, 4);
}

static struct child *find_id(uint32_t id) {
  for (size_t i = 0; i < n_kids; i++) if (kids[i].id == id) return &kids[i];
  return NULL;
}

static void watch(int fd, uint32_t events, uint32_t id, int tag) {
  struct epoll_event ev = {.events = events, .data.u64 = (uint64_t)id << 2 | (uint64_t)tag};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl");
}

static void close_in(struct child *c) {
  if (c->in_fd >= 0) close(c->in_fd); // closing also drops it from epoll
  c->in_fd = -1;
  free(c->queue);
  c->queue = NULL;
  c->queued = c->sent = 0;
}

// Reads what the child wrote; on EOF (or when draining after its exit) reports 'Z' once.
static void relay_output(struct child *c, int draining) {
  char buf[65536];
  while (c->out_fd >= 0) {
    ssize_t n = read(c->out_fd, buf, sizeof buf);
    if (n > 0) { send_event('O', c->id, buf, (size_t)n); continue; }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN && !draining) return;
    close(c->out_fd); // EOF, an error, or a grandchild still holding the pipe after the exit
    c->out_fd = -1;
    send_event('Z', c->id, NULL, 0);
  }
}

static void start(uint32_t id, const unsigned char *p, size_t len) {
  if (len < 2 || p[len - 1] != 0) {
    static const char msg[] = "error launcher: malformed start request\n";
    send_event('O', id, msg, sizeof msg - 1);
    send_event('Z', id, NULL, 0);
    send_exit(id, 125);
    return;
  }
  int flags = p[0];
  size_t argc = 0;
  for (size_t i = 1; i < len; i++) argc += p[i] == 0;
  char **argv = calloc(argc + 1, sizeof *argv);
  if (!argv) die("calloc");
  char *s = (char *)p + 1;
  for (size_t i = 0; i < argc; i++) { argv[i] = s; s += strlen(s) + 1; }
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0) die("pipe2");
  pid_t pid = fork();
  if (pid == 0) {
    // Undo what only the launcher wants: a container must see default SIGPIPE and no blocked signals.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    setsid();
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(flags & 1 ? out[1] : null_fd, 2);
    execvp(argv[0], argv); // every other fd is O_CLOEXEC
    dprintf(1, "error exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  free(argv);
  close(in[0]);
  close(out[1]);
  if (pid < 0) {
    char msg[128];
    int n = snprintf(msg, sizeof msg, "error launcher: fork: %s\n", strerror(errno));
    close(in[1]);
    close(out[0]);
    send_event('O', id, msg, (size_t)n);
    send_event('Z', id, NULL, 0);
    send_exit(id, 125);
    return;
  }
  fcntl(in[1], F_SETFL, O_NONBLOCK);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  if (n_kids == cap_kids) {
    cap_kids = cap_kids ? cap_kids * 2 : 64;
    kids = realloc(kids, cap_kids * sizeof *kids);
    if (!kids) die("realloc");
  }
  kids[n_kids++] = (struct child){.id = id, .pid = pid, .in_fd = in[1], .out_fd = out[0]};
  watch(out[0], EPOLLIN, id, TAG_OUT);
  unsigned char pid_bytes[4];
  put_u32(pid_bytes, (uint32_t)pid);
  send_event('P', id, pid_bytes, 4);
}

// Writes queued stdin bytes; what the pipe does not take waits for EPOLLOUT.
static void flush_in(struct child *c) {
  while (c->in_fd >= 0 && c->sent < c->queued) {
    ssize_t n = write(c->in_fd, c->queue + c->sent, c->queued - c->sent);
    if (n > 0) { c->sent += (size_t)n; continue; }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    close_in(c); // EPIPE: the child closed its stdin or ended; Node learns of it from 'X'
    return;
  }
  if (c->in_fd < 0) return;
  free(c->queue);
  c->queue = NULL;
  c->queued = c->sent = 0;
  epoll_ctl(ep, EPOLL_CTL_DEL, c->in_fd, NULL); // ENOENT when it was never waiting: harmless
  if (c->close_when_sent) close_in(c);
}

static void write_in(struct child *c, const unsigned char *p, size_t len) {
  if (c->in_fd < 0 || c->close_when_sent) return;
  int was_waiting = c->queued > c->sent;
  char *grown = realloc(c->queue, c->queued + len);
  if (!grown) die("realloc");
  c->queue = grown;
  memcpy(c->queue + c->queued, p, len);
  c->queued += len;
  if (was_waiting) return;
  flush_in(c);
  if (c->in_fd >= 0 && c->queued > c->sent) watch(c->in_fd, EPOLLOUT, c->id, TAG_IN);
}

static void handle_request(char type, uint32_t id, const unsigned char *p, size_t len) {
  if (type == 'S') { start(id, p, len); return; }
  struct child *c = find_id(id);
  if (!c) return; // it already exited: Node learns that from 'X'
  if (type == 'W') write_in(c, p, len);
  else if (type == 'C') { if (c->queued > c->sent) c->close_when_sent = 1; else close_in(c); }
  else if (type == 'K' && len == 1 && c->pid > 0) kill(c->pid, p[0]);
}

// Reads requests; returns 0 once Node closed our stdin.
static int read_requests(void) {
  static unsigned char *buf;
  static size_t have, cap;
  if (cap - have < 65536) {
    cap = cap ? cap * 2 : 131072;
    buf = realloc(buf, cap);
    if (!buf) die("realloc");
  }
  ssize_t n = read(0, buf + have, cap - have);
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return 0;
  have += (size_t)n;
  size_t at = 0;
  while (have - at >= HEADER) {
    uint32_t len = get_u32(buf + at);
    if (len > MAX_PAYLOAD) { errno = EMSGSIZE; die("request"); }
    if (have - at < HEADER + len) {
      if (cap < HEADER + len) { cap = HEADER + len; buf = realloc(buf, cap); if (!buf) die("realloc"); }
      break;
    }
    handle_request((char)buf[at + 4], get_u32(buf + at + 5), buf + at + HEADER, len);
    at += HEADER + len;
  }
  memmove(buf, buf + at, have - at);
  have -= at;
  return 1;
}

static int exit_code(int st) {
  return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

static void reap(int sig_fd) {
  struct signalfd_siginfo info;
  while (read(sig_fd, &info, sizeof info) == sizeof info) {} // SIGCHLDs coalesce; waitpid counts
  int st;
  pid_t pid;
  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    for (size_t i = 0; i < n_kids; i++) {
      struct child *c = &kids[i];
      if (c->pid != pid) continue;
      relay_output(c, 1); // its writers are gone: what is left in the pipe comes before 'X'
      close_in(c);
      send_exit(c->id, exit_code(st));
      kids[i] = kids[--n_kids];
      break;
    }
  }
}

int main(void) {
  signal(SIGPIPE, SIG_IGN); // a child that closed its stdin must not kill us; EPIPE is handled
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sig_fd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
  null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  ep = epoll_create1(EPOLL_CLOEXEC);
  if (sig_fd < 0 || null_fd < 0 || ep < 0) die("setup");
  fcntl(0, F_SETFD, FD_CLOEXEC);
  fcntl(1, F_SETFD, FD_CLOEXEC);
  watch(0, EPOLLIN, 0, TAG_REQUESTS);
  watch(sig_fd, EPOLLIN, 0, TAG_SIGNALS);
  struct epoll_event events[64];
  for (;;) {
    int n = epoll_wait(ep, events, 64, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die("epoll_wait");
    for (int i = 0; i < n; i++) {
      uint64_t tag = events[i].data.u64 & 3;
      uint32_t id = (uint32_t)(events[i].data.u64 >> 2);
      if (tag == TAG_REQUESTS) { if (!read_requests()) return 0; continue; }
      if (tag == TAG_SIGNALS) { reap(sig_fd); continue; }
      struct child *c = find_id(id); // NULL when an earlier event in this batch freed it
      if (c && tag == TAG_OUT) relay_output(c, 0);
      if (c && tag == TAG_IN) flush_in(c);
    }
  }
}
