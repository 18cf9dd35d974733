// event.c: a reactor bot for the $execute tests. It answers with its whole
// event, so the tests can check what the host sends, or with one of a few
// envelopes chosen by a text input:
//   "oo"         {"error": <OperationOutcome>, "status": 422}
//   "string"     {"result": "hello"}
//   "null"       {"result": null}
//   "html"       {"result": "<b>hi</b>", "contentType": "text/html"}
//   "fail-text"  {"error": "it went wrong"}
// Rebuild: make (needs Debian's clang, lld and wasi-libc).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT(name) __attribute__((export_name(name)))

EXPORT("sandbot_alloc") void *sandbot_alloc(int32_t size) { return malloc(size); }

static uint64_t answer(const char *s, size_t n) {
  char *out = malloc(n);
  memcpy(out, s, n);
  return ((uint64_t)(uintptr_t)out << 32) | (uint32_t)n;
}

static int has(const char *ev, int32_t len, const char *needle) {
  size_t n = strlen(needle);
  for (int32_t i = 0; i + (int32_t)n <= len; i++)
    if (memcmp(ev + i, needle, n) == 0) return 1;
  return 0;
}

#define ANSWER(lit) return answer(lit, sizeof(lit) - 1)

EXPORT("sandbot_handle") uint64_t sandbot_handle(const char *ev, int32_t len) {
  if (has(ev, len, "\"input\":\"oo\""))
    ANSWER("{\"error\":{\"resourceType\":\"OperationOutcome\",\"issue\":[{\"severity\":\"error\",\"code\":\"business-rule\",\"details\":{\"text\":\"custom\"}}]},\"status\":422}");
  if (has(ev, len, "\"input\":\"string\"")) ANSWER("{\"result\":\"hello\"}");
  if (has(ev, len, "\"input\":\"null\"")) ANSWER("{\"result\":null}");
  if (has(ev, len, "\"input\":\"html\"")) ANSWER("{\"result\":\"<b>hi</b>\",\"contentType\":\"text/html\"}");
  if (has(ev, len, "\"input\":\"fail-text\"")) ANSWER("{\"error\":\"it went wrong\"}");
  char *out = malloc(len + 11);
  memcpy(out, "{\"result\":", 10);
  memcpy(out + 10, ev, len);
  out[10 + len] = '}';
  return ((uint64_t)(uintptr_t)out << 32) | (uint32_t)(len + 11);
}
