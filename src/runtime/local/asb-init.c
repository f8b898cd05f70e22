// asb-init: each container's pid 1 (in place of tini), bind-mounted read-only at /dev/.asb-init.
// It runs the container's command, passes SIGTERM and the other stop signals on to that command's
// process group and reaps orphans, as `tini -g` did. With ASB_AGENT=<port>:<token> in its
// environment it also starts processes on request: exec, background commands and terminals are
// its children, inside the container's init tree, so they live on through a checkpoint and a
// restore (runsc kills every process `runsc exec` made when it restores, and CRIU dumps only the
// init's tree: research/peers-2026-11.md §1.1, docs/criu.md).
//
// It runs with the sandbox's privileges only: container uid 0 in the pod's user namespace with
// CAP_SETUID, CAP_SETGID, CAP_SETPCAP, CAP_KILL and CAP_CHOWN besides the capabilities the pod was
// granted, under the pod's seccomp filter and no_new_privs. A child takes the user and capabilities
// it was asked for (the same as runc exec gave it) before it execs anything: the five are dropped from its
// bounding set, then its user is set, then its capability sets (src/runtime/local/agent-init.ts has the
// masks and says why each is needed).
//
// Usage: asb-init --user <uid>:<gid>[:<gid>,...] --caps <bounding>:<effective>:<permitted>:<inheritable>:<ambient> -- <command...>
//   (the masks in hex; the main command's user and capabilities, also every started process's
//   capabilities). The token is removed from the environment before anything else runs.
//
// The agent listens on TCP <port> in the pod's network namespace (the runtime connects from the
// host over the pod's bridge; netstack under gVisor). One connection per process; frames are
// [type u8][length u32 big-endian][payload]. The first frame from the host is 'Q', its payload
// NUL-terminated fields: token, op (exec | pty | attach), then for exec and pty: uid, gid, groups
// (comma list), cwd, cols, rows, argc, argv..., envc, env...; for attach: the pid. Then:
//   host → init: 'I' stdin bytes, 'E' end of stdin, 'K' signal (u8) to the process's group,
//                'W' window size (cols u16, rows u16);
//   init → host: 'P' started (pid u32), 'F' could not start (message, then close), 'O' stdout
//                (a terminal's output too), 'R' stderr, 'X' ended (code u32, signal u8, then close).
// A connection that goes away leaves its process running (a pause drops every connection from
// outside): its output is kept, up to KEEP_BYTES (the oldest dropped), and its end, until a new
// connection attaches to it by pid. Attached, output is read only as fast as the host takes it.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define MAX_FRAME (4 << 20)       // a request carries argv and env: 4 MiB is far beyond any real one
#define MAX_CONNS 512
#define MAX_PROCS 1024
#define KEEP_BYTES (256 << 10)    // output kept per detached process
#define HIGH_WATER (256 << 10)    // an attached connection's queue above this stops the reads
#define DRAIN_MS 1000             // after a process exits, how long its pipes may still deliver
#define AUTH_MS 10000             // a connection must send its request within this
#define KEEP_EXITED 64            // ended processes nobody attached to, kept for a later attach

struct buf { char *data; size_t start, len, cap; };

struct proc;
struct conn {
  int fd;
  struct buf in, out;
  struct proc *proc;
  int authed, closing;
  long long since;
};

struct proc {
  pid_t pid;
  int pty;
  int in_fd, out_fd, err_fd; // -1 once closed; a terminal's master is out_fd (and in_fd, dup'ed)
  int stdin_eof;             // 'E' seen: close in_fd once its queue is written
  struct buf stdin_q;
  struct buf kept;           // frames waiting for an attach
  struct conn *conn;
  int exited, code, sig;
  long long exited_at;
  int reported;
};

static struct conn *conns[MAX_CONNS];
static struct proc *procs[MAX_PROCS];
static int listen_fd = -1, sig_fd = -1;
static char token[128];
static pid_t main_pid;
static uid_t main_uid;
static gid_t main_gid;
static gid_t main_groups[64];
static int n_main_groups;
static uint64_t caps[5]; // bounding, effective, permitted, inheritable, ambient

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void die(const char *what) {
  dprintf(2, "asb-init: %s: %s\n", what, strerror(errno));
  _exit(127);
}

// ---- buffers

static int buf_reserve(struct buf *b, size_t more) {
  if (b->start > 0 && b->start + b->len + more > b->cap) {
    memmove(b->data, b->data + b->start, b->len);
    b->start = 0;
  }
  if (b->len + more <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + more) cap *= 2;
  char *d = realloc(b->data, cap);
  if (!d) return -1;
  b->data = d;
  b->cap = cap;
  return 0;
}

static int buf_put(struct buf *b, const void *p, size_t n) {
  if (buf_reserve(b, n) < 0) return -1;
  memcpy(b->data + b->start + b->len, p, n);
  b->len += n;
  return 0;
}

static void buf_drop(struct buf *b, size_t n) {
  b->start += n;
  b->len -= n;
  if (b->len == 0) b->start = 0;
}

static void buf_free(struct buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

static int frame(struct buf *b, char type, const void *p, uint32_t n) {
  unsigned char h[5] = {(unsigned char)type, n >> 24, n >> 16, n >> 8, n};
  if (buf_put(b, h, 5) < 0) return -1;
  return buf_put(b, p, n);
}

// Kept output over its bound loses whole frames from the front.
static void trim_kept(struct buf *b) {
  while (b->len > KEEP_BYTES && b->len >= 5) {
    const unsigned char *h = (const unsigned char *)b->data + b->start;
    uint32_t n = (uint32_t)h[1] << 24 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 8 | h[4];
    buf_drop(b, 5 + n);
  }
}

// ---- processes

// A frame for the process's host: queued on its connection, or kept until one attaches.
static void emit(struct proc *p, char type, const void *data, uint32_t n) {
  if (p->conn) {
    if (frame(&p->conn->out, type, data, n) < 0) p->conn->closing = 1;
    return;
  }
  frame(&p->kept, type, data, n);
  trim_kept(&p->kept);
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static void free_proc(struct proc *p) {
  for (int i = 0; i < MAX_PROCS; i++) if (procs[i] == p) procs[i] = NULL;
  if (p->conn) p->conn->proc = NULL;
  if (p->pty && p->in_fd == p->out_fd) p->in_fd = -1;
  close_fd(&p->in_fd);
  close_fd(&p->out_fd);
  close_fd(&p->err_fd);
  buf_free(&p->stdin_q);
  buf_free(&p->kept);
  free(p);
}

static struct proc *find_proc(pid_t pid) {
  for (int i = 0; i < MAX_PROCS; i++) if (procs[i] && procs[i]->pid == pid) return procs[i];
  return NULL;
}

// Ended processes nobody attached to are kept for an attach, the oldest dropped beyond KEEP_EXITED.
static void bound_exited(void) {
  int count = 0;
  struct proc *oldest = NULL;
  for (int i = 0; i < MAX_PROCS; i++) {
    struct proc *p = procs[i];
    if (!p || !p->reported || p->conn) continue;
    count++;
    if (!oldest || p->exited_at < oldest->exited_at) oldest = p;
  }
  if (count > KEEP_EXITED && oldest) free_proc(oldest);
}

// Once the process ended and its pipes are done (or DRAIN_MS passed): its end goes to the host.
static void maybe_report(struct proc *p, long long now) {
  if (!p->exited || p->reported) return;
  if ((p->out_fd >= 0 || p->err_fd >= 0) && now - p->exited_at < DRAIN_MS) return;
  if (p->pty && p->in_fd == p->out_fd) p->in_fd = -1;
  close_fd(&p->out_fd);
  close_fd(&p->err_fd);
  close_fd(&p->in_fd);
  unsigned char x[5] = {p->code >> 24, p->code >> 16, p->code >> 8, p->code, (unsigned char)p->sig};
  emit(p, 'X', x, 5);
  p->reported = 1;
  if (p->conn) p->conn->closing = 1;
  else bound_exited();
}

// ---- starting a process

static void set_caps(void) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  memset(d, 0, sizeof d);
  for (int i = 0; i < 2; i++) {
    d[i].effective = (uint32_t)(caps[1] >> (32 * i));
    d[i].permitted = (uint32_t)(caps[2] >> (32 * i));
    d[i].inheritable = (uint32_t)(caps[3] >> (32 * i));
  }
  if (syscall(SYS_capset, &h, d) < 0) die("capset");
  for (int c = 0; c < 64; c++) {
    if ((caps[4] >> c) & 1) {
      if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, c, 0, 0) < 0) die("ambient capability");
    }
  }
}

// In the child: the pod's bounding set, then the user, then its capabilities (the header says why in this order).
static void become(uid_t uid, gid_t gid, const gid_t *groups, int n_groups) {
  if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0) die("keepcaps");
  for (int c = 0; c <= 63; c++) {
    if (!((caps[0] >> c) & 1) && prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL) die("bounding set");
  }
  if (setgroups(n_groups, groups) < 0) die("setgroups");
  if (setresgid(gid, gid, gid) < 0) die("setgid");
  if (setresuid(uid, uid, uid) < 0) die("setuid");
  if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) < 0) die("keepcaps");
  set_caps();
}

static void child_defaults(void) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
}

struct spawn_req {
  uid_t uid;
  gid_t gid;
  gid_t groups[64];
  int n_groups;
  const char *cwd;
  int pty;
  unsigned short cols, rows;
  char **argv;
  char **envp;
};

// Starts the request's process; on failure writes why into `err` and returns NULL.
static struct proc *spawn_proc(const struct spawn_req *r, char *err, size_t err_len) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, errp[2] = {-1, -1}, report[2];
  int master = -1;
  char slave[128];
  if (pipe2(report, O_CLOEXEC) < 0) {
    snprintf(err, err_len, "pipe: %s", strerror(errno));
    return NULL;
  }
  if (r->pty) {
    master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0 || grantpt(master) < 0 || unlockpt(master) < 0 || ptsname_r(master, slave, sizeof slave) != 0) {
      snprintf(err, err_len, "cannot open a terminal: %s", strerror(errno));
      if (master >= 0) close(master);
      close(report[0]);
      close(report[1]);
      return NULL;
    }
    struct winsize ws = {r->rows ? r->rows : 24, r->cols ? r->cols : 80, 0, 0};
    ioctl(master, TIOCSWINSZ, &ws);
  } else if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0) {
    snprintf(err, err_len, "pipe: %s", strerror(errno));
    for (int i = 0; i < 2; i++) { if (in[i] >= 0) close(in[i]); if (out[i] >= 0) close(out[i]); if (errp[i] >= 0) close(errp[i]); }
    close(report[0]);
    close(report[1]);
    return NULL;
  }
  pid_t pid = fork();
  if (pid == 0) {
    child_defaults();
    setsid();
    int fail = report[1];
    if (r->pty) {
      int s = open(slave, O_RDWR);
      if (s < 0 || ioctl(s, TIOCSCTTY, 0) < 0) { dprintf(fail, "cannot open the terminal %s: %s", slave, strerror(errno)); _exit(127); }
      dup2(s, 0); dup2(s, 1); dup2(s, 2);
      if (s > 2) close(s);
    } else {
      dup2(in[0], 0); dup2(out[1], 1); dup2(errp[1], 2);
    }
    // The process's own stdio: a program that opens /dev/stdout (/proc/self/fd/1) must find its
    // pipe or terminal its user's, as it was under runc exec, not the init's root.
    for (int fd = 0; fd <= 2; fd++) (void)!fchown(fd, r->uid, r->gid);
    // become() says why it failed on stderr: pointed at the report meanwhile.
    int saved = dup(2);
    dup2(fail, 2);
    become(r->uid, r->gid, r->groups, r->n_groups);
    dup2(saved, 2);
    close(saved);
    if (r->cwd && r->cwd[0] && chdir(r->cwd) < 0) { dprintf(fail, "chdir to cwd (\"%s\"): %s", r->cwd, strerror(errno)); _exit(127); }
    environ = r->envp;
    execvp(r->argv[0], r->argv);
    // runc's words for it, which callers already know.
    int lookup = errno == ENOENT && !strchr(r->argv[0], '/');
    dprintf(fail, "exec: \"%s\": %s", r->argv[0], lookup ? "executable file not found in $PATH" : strerror(errno));
    _exit(127);
  }
  close(report[1]);
  if (!r->pty) { close(in[0]); close(out[1]); close(errp[1]); }
  if (pid < 0) {
    snprintf(err, err_len, "fork: %s", strerror(errno));
    close(report[0]);
    if (r->pty) close(master);
    else { close(in[1]); close(out[0]); close(errp[0]); }
    return NULL;
  }
  ssize_t n, got = 0;
  while ((n = read(report[0], err + got, err_len - 1 - got)) > 0 || (n < 0 && errno == EINTR)) if (n > 0) got += n;
  close(report[0]);
  err[got] = 0;
  struct proc *p = calloc(1, sizeof *p);
  if (!p) {
    snprintf(err, err_len, "out of memory");
    got = 1;
  }
  if (got > 0) {
    // It never ran the command: its exit is reaped (and ignored) with the orphans.
    if (p) free(p);
    if (r->pty) close(master);
    else { close(in[1]); close(out[0]); close(errp[0]); }
    return NULL;
  }
  p->pid = pid;
  p->pty = r->pty;
  if (r->pty) {
    p->out_fd = master;
    p->in_fd = master;
    p->err_fd = -1;
  } else {
    p->in_fd = in[1];
    p->out_fd = out[0];
    p->err_fd = errp[0];
  }
  fcntl(p->out_fd, F_SETFL, O_NONBLOCK);
  if (p->err_fd >= 0) fcntl(p->err_fd, F_SETFL, O_NONBLOCK);
  if (!r->pty) fcntl(p->in_fd, F_SETFL, O_NONBLOCK);
  return p;
}

// ---- requests

static const char *field(const char **cur, const char *end) {
  const char *s = *cur;
  const char *nul = memchr(s, 0, end - s);
  if (!nul) return NULL;
  *cur = nul + 1;
  return s;
}

static int parse_groups(const char *s, gid_t *out, int max) {
  int n = 0;
  while (*s && n < max) {
    char *e;
    unsigned long g = strtoul(s, &e, 10);
    if (e == s) return -1;
    out[n++] = (gid_t)g;
    if (*e == ',') e++;
    else if (*e) return -1;
    s = e;
  }
  return n;
}

static int token_ok(const char *given) {
  size_t a = strlen(given), b = strlen(token);
  unsigned char diff = a != b;
  for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(given[i] ^ token[i]);
  return diff == 0 && b > 0;
}

static void refuse(struct conn *c, const char *message) {
  frame(&c->out, 'F', message, strlen(message));
  c->closing = 1;
}

static void attach(struct conn *c, struct proc *p) {
  if (p->conn && p->conn != c) {
    p->conn->proc = NULL;
    p->conn->closing = 1;
  }
  p->conn = c;
  c->proc = p;
  uint32_t pid = (uint32_t)p->pid;
  unsigned char h[4] = {pid >> 24, pid >> 16, pid >> 8, pid};
  frame(&c->out, 'P', h, 4);
  if (p->kept.len > 0) buf_put(&c->out, p->kept.data + p->kept.start, p->kept.len);
  buf_free(&p->kept);
  if (p->reported) {
    // Its end was kept: the connection gets it and closes, and the record goes with it.
    c->closing = 1;
    p->conn = NULL;
    c->proc = NULL;
    free_proc(p);
  }
}

static void handle_request(struct conn *c, const char *payload, uint32_t n) {
  const char *cur = payload, *end = payload + n;
  const char *tok = field(&cur, end), *op = field(&cur, end);
  if (!tok || !op || !token_ok(tok)) {
    c->closing = 1; // said nothing: a wrong token learns nothing
    return;
  }
  c->authed = 1;
  if (!strcmp(op, "attach")) {
    const char *pid = field(&cur, end);
    struct proc *p = pid ? find_proc((pid_t)atoi(pid)) : NULL;
    if (!p) refuse(c, "no such process");
    else attach(c, p);
    return;
  }
  struct spawn_req r;
  memset(&r, 0, sizeof r);
  r.pty = !strcmp(op, "pty");
  if (!r.pty && strcmp(op, "exec")) { refuse(c, "unknown op"); return; }
  const char *uid = field(&cur, end), *gid = field(&cur, end), *groups = field(&cur, end);
  const char *cwd = field(&cur, end), *cols = field(&cur, end), *rows = field(&cur, end), *argc_s = field(&cur, end);
  if (!argc_s) { refuse(c, "malformed request"); return; }
  r.uid = (uid_t)strtoul(uid, NULL, 10);
  r.gid = (gid_t)strtoul(gid, NULL, 10);
  r.n_groups = parse_groups(groups, r.groups, 64);
  r.cwd = cwd;
  r.cols = (unsigned short)atoi(cols);
  r.rows = (unsigned short)atoi(rows);
  int argc = atoi(argc_s);
  if (argc <= 0 || argc > 65536 || r.n_groups < 0) { refuse(c, "malformed request"); return; }
  r.argv = calloc(argc + 1, sizeof(char *));
  int ok = r.argv != NULL;
  for (int i = 0; ok && i < argc; i++) ok = (r.argv[i] = (char *)field(&cur, end)) != NULL;
  const char *envc_s = ok ? field(&cur, end) : NULL;
  int envc = envc_s ? atoi(envc_s) : -1;
  ok = ok && envc >= 0 && envc <= 65536 && (r.envp = calloc(envc + 1, sizeof(char *))) != NULL;
  for (int i = 0; ok && i < envc; i++) ok = (r.envp[i] = (char *)field(&cur, end)) != NULL;
  int slot = -1;
  for (int i = 0; ok && i < MAX_PROCS && slot < 0; i++) if (!procs[i]) slot = i;
  if (!ok) refuse(c, "malformed request");
  else if (slot < 0) refuse(c, "too many processes started by the agent");
  else {
    char err[512];
    struct proc *p = spawn_proc(&r, err, sizeof err);
    if (!p) refuse(c, err);
    else {
      procs[slot] = p;
      attach(c, p);
    }
  }
  free(r.argv);
  free(r.envp);
}

static void handle_frame(struct conn *c, char type, const char *p, uint32_t n) {
  if (!c->authed) {
    if (type == 'Q') handle_request(c, p, n);
    else c->closing = 1;
    return;
  }
  struct proc *pr = c->proc;
  if (!pr) return;
  switch (type) {
  case 'I':
    if (pr->in_fd >= 0 && !pr->stdin_eof) buf_put(&pr->stdin_q, p, n);
    break;
  case 'E':
    pr->stdin_eof = 1;
    break;
  case 'K':
    if (n >= 1 && !pr->exited) kill(-pr->pid, (unsigned char)p[0]);
    break;
  case 'W':
    if (n >= 4 && pr->pty && pr->out_fd >= 0) {
      struct winsize ws = {(unsigned short)((unsigned char)p[2] << 8 | (unsigned char)p[3]), (unsigned short)((unsigned char)p[0] << 8 | (unsigned char)p[1]), 0, 0};
      ioctl(pr->out_fd, TIOCSWINSZ, &ws);
    }
    break;
  }
}

// ---- connections

static void close_conn(struct conn *c) {
  for (int i = 0; i < MAX_CONNS; i++) if (conns[i] == c) conns[i] = NULL;
  struct proc *p = c->proc;
  if (p) {
    p->conn = NULL; // the process runs on, detached, unless its end was delivered
    if (p->reported) free_proc(p);
  }
  close(c->fd);
  buf_free(&c->in);
  buf_free(&c->out);
  free(c);
}

static void read_conn(struct conn *c) {
  if (buf_reserve(&c->in, 65536) < 0) { c->closing = 1; return; }
  ssize_t n = read(c->fd, c->in.data + c->in.start + c->in.len, 65536);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
    c->closing = 1;
    c->out.len = 0; // nobody reads it any more
    return;
  }
  if (n < 0) return;
  c->in.len += n;
  while (c->in.len >= 5 && !c->closing) {
    const unsigned char *h = (const unsigned char *)c->in.data + c->in.start;
    uint32_t len = (uint32_t)h[1] << 24 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 8 | h[4];
    if (len > MAX_FRAME) { c->closing = 1; c->out.len = 0; return; }
    if (c->in.len < 5 + (size_t)len) break;
    handle_frame(c, (char)h[0], (const char *)h + 5, len);
    buf_drop(&c->in, 5 + len);
  }
}

// Every connection waiting, not one per wakeup: 200 terminals opened at once must not wait in the
// backlog (a full one drops SYNs, and the client's retransmit costs it a second or more).
static void accept_conns(void) {
  for (;;) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    int slot = -1;
    for (int i = 0; i < MAX_CONNS && slot < 0; i++) if (!conns[i]) slot = i;
    struct conn *c = slot < 0 ? NULL : calloc(1, sizeof *c);
    if (!c) { close(fd); continue; }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    c->since = now_ms();
    conns[slot] = c;
  }
}

// ---- signals and children

static void reap(void) {
  int st;
  pid_t pid;
  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (pid == main_pid) _exit(code); // the pod ends with its command; the kernel ends the rest
    struct proc *p = find_proc(pid);
    if (!p) continue; // an orphan
    p->exited = 1;
    p->code = code;
    p->sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    p->exited_at = now_ms();
  }
}

static void on_signal(void) {
  struct signalfd_siginfo si;
  while (read(sig_fd, &si, sizeof si) == sizeof si) {
    if (si.ssi_signo == SIGCHLD) reap();
    else if (main_pid > 0) kill(-main_pid, (int)si.ssi_signo);
  }
}

// ---- output of processes

static void pump_output(struct proc *p, int *fd, char type) {
  char data[65536];
  ssize_t n = read(*fd, data, sizeof data);
  if (n > 0) emit(p, type, data, (uint32_t)n);
  else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    // EIO: a terminal whose every process has closed it.
    if (p->pty && p->in_fd == *fd) p->in_fd = -1;
    close_fd(fd);
  }
}

static void pump_stdin(struct proc *p) {
  while (p->stdin_q.len > 0) {
    ssize_t n = write(p->in_fd, p->stdin_q.data + p->stdin_q.start, p->stdin_q.len);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      buf_free(&p->stdin_q); // EPIPE: the process closed its stdin
      break;
    }
    buf_drop(&p->stdin_q, n);
  }
  if (p->stdin_eof && !p->pty) close_fd(&p->in_fd);
}

// ---- start-up

static void parse_args(int argc, char **argv, char ***command) {
  int i = 1;
  for (; i < argc; i++) {
    if (!strcmp(argv[i], "--")) { i++; break; }
    if (!strcmp(argv[i], "--user") && i + 1 < argc) {
      char *s = argv[++i], *e;
      main_uid = (uid_t)strtoul(s, &e, 10);
      if (*e != ':') break;
      main_gid = (gid_t)strtoul(e + 1, &e, 10);
      if (*e == ':') n_main_groups = parse_groups(e + 1, main_groups, 64);
    } else if (!strcmp(argv[i], "--caps") && i + 1 < argc) {
      char *s = argv[++i];
      for (int k = 0; k < 5; k++) {
        caps[k] = strtoull(s, &s, 16);
        if (*s == ':') s++;
      }
    }
  }
  if (i >= argc || n_main_groups < 0) {
    dprintf(2, "asb-init: usage: asb-init --user <uid>:<gid>[:<gids>] --caps <b>:<e>:<p>:<i>:<a> -- <command...>\n");
    _exit(127);
  }
  *command = argv + i;
}

// ASB_AGENT=<port>:<token>: read, then blanked in place (so /proc/1/environ no longer shows it) and removed.
static int take_agent(void) {
  const char *value = getenv("ASB_AGENT");
  if (!value) return 0;
  char *e;
  long port = strtol(value, &e, 10);
  if (*e == ':') snprintf(token, sizeof token, "%s", e + 1);
  memset((char *)value, 0, strlen(value));
  unsetenv("ASB_AGENT");
  return port > 0 && port < 65536 && token[0] ? (int)port : 0;
}

static void listen_on(int port) {
  listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr = {htonl(INADDR_ANY)}};
  if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(listen_fd, MAX_CONNS) < 0) {
    // The command still runs: the runtime sees the agent missing and says so on each exec.
    dprintf(2, "asb-init: cannot listen on port %d: %s\n", port, strerror(errno));
    if (listen_fd >= 0) close(listen_fd);
    listen_fd = -1;
  }
}

int main(int argc, char **argv) {
  char **command;
  parse_args(argc, argv, &command);
  int port = take_agent();
  signal(SIGPIPE, SIG_IGN);
  sigset_t set;
  sigemptyset(&set);
  int forwarded[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH, SIGCONT, SIGALRM};
  for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++) sigaddset(&set, forwarded[i]);
  sigprocmask(SIG_BLOCK, &set, NULL);
  sig_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sig_fd < 0) die("signalfd");
  if (port) listen_on(port);

  main_pid = fork();
  if (main_pid < 0) die("fork");
  if (main_pid == 0) {
    child_defaults();
    setpgid(0, 0);
    become(main_uid, main_gid, main_groups, n_main_groups);
    execvp(command[0], command);
    // runc's words for it, as the kubelet shows them.
    dprintf(2, "exec: \"%s\": %s\n", command[0], strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
  }
  setpgid(main_pid, main_pid);

  struct pollfd fds[2 + MAX_CONNS + 3 * MAX_PROCS];
  struct conn *fd_conn[2 + MAX_CONNS + 3 * MAX_PROCS];
  struct proc *fd_proc[2 + MAX_CONNS + 3 * MAX_PROCS];
  char fd_kind[2 + MAX_CONNS + 3 * MAX_PROCS];
  for (;;) {
    long long now = now_ms();
    int n = 0, timeout = -1;
    fds[n] = (struct pollfd){sig_fd, POLLIN, 0};
    fd_kind[n++] = 's';
    if (listen_fd >= 0) { fds[n] = (struct pollfd){listen_fd, POLLIN, 0}; fd_kind[n++] = 'l'; }
    for (int i = 0; i < MAX_PROCS; i++) {
      struct proc *p = procs[i];
      if (!p) continue;
      maybe_report(p, now);
      if (p->exited && !p->reported) timeout = 50;
      if (!procs[i]) continue;
      int paused = p->conn && p->conn->out.len > HIGH_WATER;
      if (!paused && p->out_fd >= 0) { fds[n] = (struct pollfd){p->out_fd, POLLIN, 0}; fd_proc[n] = p; fd_kind[n++] = 'o'; }
      if (!paused && p->err_fd >= 0) { fds[n] = (struct pollfd){p->err_fd, POLLIN, 0}; fd_proc[n] = p; fd_kind[n++] = 'e'; }
      if (p->in_fd >= 0 && (p->stdin_q.len > 0 || (p->stdin_eof && !p->pty))) {
        if (p->stdin_q.len == 0) pump_stdin(p);
        else { fds[n] = (struct pollfd){p->in_fd, POLLOUT, 0}; fd_proc[n] = p; fd_kind[n++] = 'i'; }
      }
    }
    for (int i = 0; i < MAX_CONNS; i++) {
      struct conn *c = conns[i];
      if (!c) continue;
      if (!c->authed && now - c->since > AUTH_MS) c->closing = 1;
      if (c->closing && c->out.len == 0) { close_conn(c); continue; }
      if (!c->authed) timeout = timeout < 0 || timeout > 1000 ? 1000 : timeout;
      short ev = 0;
      // A stdin queue above the mark stops reading the host: backpressure on the writer.
      if (!c->closing && !(c->proc && c->proc->stdin_q.len > HIGH_WATER)) ev |= POLLIN;
      if (c->out.len > 0) ev |= POLLOUT;
      fds[n] = (struct pollfd){c->fd, ev, 0};
      fd_conn[n] = c;
      fd_kind[n++] = 'c';
    }
    if (poll(fds, n, timeout) < 0 && errno != EINTR) die("poll");
    for (int i = 0; i < n; i++) {
      short re = fds[i].revents;
      if (!re) continue;
      switch (fd_kind[i]) {
      case 's': on_signal(); break;
      case 'l': accept_conns(); break;
      case 'o': if (find_proc(fd_proc[i]->pid) == fd_proc[i]) pump_output(fd_proc[i], &fd_proc[i]->out_fd, 'O'); break;
      case 'e': if (find_proc(fd_proc[i]->pid) == fd_proc[i]) pump_output(fd_proc[i], &fd_proc[i]->err_fd, 'R'); break;
      case 'i': if (find_proc(fd_proc[i]->pid) == fd_proc[i]) pump_stdin(fd_proc[i]); break;
      case 'c': {
        struct conn *c = fd_conn[i];
        int live = 0;
        for (int k = 0; k < MAX_CONNS; k++) if (conns[k] == c) live = 1;
        if (!live) break;
        if (re & (POLLIN | POLLHUP | POLLERR)) read_conn(c);
        if ((re & POLLOUT) && c->out.len > 0) {
          ssize_t w = write(c->fd, c->out.data + c->out.start, c->out.len);
          if (w > 0) buf_drop(&c->out, w);
          else if (w < 0 && errno != EAGAIN && errno != EINTR) { c->out.len = 0; c->closing = 1; }
        }
        break;
      }
      }
    }
  }
}
