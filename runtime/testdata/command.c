// command.c: a WASI command bot. Reads the event on stdin, writes
// {"result": <event>} on stdout, logs on stderr. The words "fail",
// "flood" and "loop" in the event select failure behaviours.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
  size_t cap = 1 << 16, n = 0;
  char *ev = malloc(cap);
  size_t r;
  while ((r = fread(ev + n, 1, cap - n, stdin)) > 0) {
    n += r;
    if (n == cap) ev = realloc(ev, cap *= 2);
  }
  ev[n] = 0;
  fprintf(stderr, "read %zu bytes\n", n);
  if (strstr(ev, "\"fail\"")) {
    fprintf(stderr, "first complaint\n");
    fprintf(stderr, "cannot do that\n");
    return 3;
  }
  if (strstr(ev, "\"flood\"")) {
    for (;;) fputs("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n", stdout);
  }
  if (strstr(ev, "\"loop\"")) {
    volatile unsigned long x = 0;
    for (;;) x++;
  }
  printf("{\"result\":%.*s}", (int)n, ev);
  return 0;
}
