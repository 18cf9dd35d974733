// sandbox.c: a reactor that tries to reach what a bot must not (files,
// preopened directories or sockets, the environment) and what it may (a real
// clock, a cryptographic random source), and reports what it got.
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT(name) __attribute__((export_name(name)))

extern char **environ;

EXPORT("sandbot_alloc") void *sandbot_alloc(int32_t size) { return malloc(size); }

EXPORT("sandbot_handle") uint64_t sandbot_handle(char *ptr, int32_t len) {
  int files = 0;
  const char *paths[] = {"/etc/passwd", "/", ".", "/proc/self/environ", "sandbot.db"};
  for (int i = 0; i < 5; i++) {
    FILE *f = fopen(paths[i], "r");
    if (f) { files++; fclose(f); }
  }
  DIR *d = opendir("/");
  if (d) { files++; closedir(d); }
  int fds = 0; // preopened directories or sockets would be fds 3 and up
  struct stat st;
  for (int fd = 3; fd < 16; fd++) if (fstat(fd, &st) == 0) fds++;
  int env = 0;
  for (char **e = environ; e && *e; e++) env++;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned char rnd[16];
  int rok = getentropy(rnd, sizeof rnd) == 0;
  char hex[33];
  for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
  char *out = malloc(256);
  int n = snprintf(out, 256, "{\"result\":{\"files\":%d,\"fds\":%d,\"env\":%d,\"time\":%lld,\"random\":\"%s\",\"randomOK\":%d}}",
                   files, fds, env, (long long)ts.tv_sec, hex, rok);
  return ((uint64_t)(uintptr_t)out << 32) | (uint32_t)n;
}
