/* Makes a rank late: every connect() of the process that preloads it waits
 * DELAY_CONNECT_MS first, so that a stranger reaches a port the job opened
 * before the job's own rank does (what a loaded node does by chance).
 * DELAY_CONNECT_COUNT=K delays only the first K (set-up's own connects).
 *
 *   cc -shared -fPIC -o delay_connect.so delay_connect.c -ldl
 *   LD_PRELOAD=./delay_connect.so DELAY_CONNECT_MS=300 [DELAY_CONNECT_COUNT=3] ...  */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

int connect(int fd, const struct sockaddr *address, socklen_t length) {
  static int (*real_connect)(int, const struct sockaddr *, socklen_t);
  if (real_connect == NULL) real_connect = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
  static int delayed;
  const char *delay = getenv("DELAY_CONNECT_MS"), *count = getenv("DELAY_CONNECT_COUNT");
  if (delay != NULL && address->sa_family != AF_UNIX && (count == NULL || delayed++ < atoi(count))) {
    const long ms = atol(delay);
    struct timespec wait = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&wait, NULL);
  }
  return real_connect(fd, address, length);
}
