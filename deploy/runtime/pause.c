/*
 * Minimal pod sandbox "pause" process, modelled on kubernetes' pause.c.
 *
 * - sleeps forever in pause()
 * - exits 0 on SIGINT / SIGTERM
 * - reaps zombie children on SIGCHLD (it is PID 1 of the pod's PID namespace
 *   when the pod shares its process namespace)
 *
 * Build: gcc -static -Os -o pause pause.c
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "nodeagent-pause-3.9"

static void sigdown(int signo) {
  psignal(signo, "Shutting down, got signal");
  exit(0);
}

static void sigreap(int signo) {
  (void)signo;
  int saved = errno;
  while (waitpid(-1, NULL, WNOHANG) > 0)
    ;
  errno = saved;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) {
    if (!strcasecmp(argv[i], "-v")) {
      printf("pause.c %s\n", VERSION);
      return 0;
    }
  }

  if (getpid() != 1)
    /* Not an error: pause is normally PID 1 of its namespace, but may not be. */
    fprintf(stderr, "Warning: pause should be the first process\n");

  struct sigaction down = {0};
  down.sa_handler = sigdown;
  sigemptyset(&down.sa_mask);
  if (sigaction(SIGINT, &down, NULL) < 0)
    return 1;
  if (sigaction(SIGTERM, &down, NULL) < 0)
    return 2;

  struct sigaction reap = {0};
  reap.sa_handler = sigreap;
  sigemptyset(&reap.sa_mask);
  reap.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  if (sigaction(SIGCHLD, &reap, NULL) < 0)
    return 3;

  for (;;)
    pause();
  fprintf(stderr, "Error: infinite loop terminated\n");
  return 42;
}
