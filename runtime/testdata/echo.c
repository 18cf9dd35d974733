// echo.c: the smallest useful reactor bot. It answers {"result": <event>}.
// Build: see Makefile.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT(name) __attribute__((export_name(name)))

static const char prefix[] = "{\"result\":";

EXPORT("sandbot_alloc") void *sandbot_alloc(int32_t size) { return malloc(size); }

EXPORT("sandbot_handle") uint64_t sandbot_handle(char *ptr, int32_t len) {
  size_t n = sizeof(prefix) - 1;
  char *out = malloc(n + len + 1);
  memcpy(out, prefix, n);
  memcpy(out + n, ptr, len);
  out[n + len] = '}';
  free(ptr);
  return ((uint64_t)(uintptr_t)out << 32) | (uint32_t)(n + len + 1);
}
