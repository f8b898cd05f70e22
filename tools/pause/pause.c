// The pod sandbox ("pause") process of the real test node: PID 1 of each pod's namespaces, which
// holds them while the pod's containers come and go. It waits for a signal, reaps any child
// re-parented to it, and exits 0 on SIGINT or SIGTERM, as Kubernetes' own pause does.
// Built static by scripts/kube-node-build.sh (gcc -static) into a one-layer OCI image.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

int main(void) {
  struct sigaction stop = {.sa_handler = quit}, child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 || sigaction(SIGCHLD, &child, NULL) < 0) return 2;
  for (;;) pause();
}
