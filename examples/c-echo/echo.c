// c-echo: a reactor bot in C (clang + wasi-libc) that answers
// {"result": <event.input>}. It is the latency benchmark: no JSON library,
// only a scanner that finds the top-level "input" member of the event.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT(name) __attribute__((export_name(name)))

EXPORT("sandbot_alloc") void *sandbot_alloc(int32_t size) { return malloc(size); }

static const char *ws(const char *p, const char *e) {
  while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  return p;
}

static const char *str(const char *p, const char *e) { // p at '"'
  for (p++; p < e; p++) {
    if (*p == '\\') p++;
    else if (*p == '"') return p + 1;
  }
  return e;
}

static const char *value(const char *p, const char *e) { // skips one value
  if (p >= e) return e;
  if (*p == '"') return str(p, e);
  if (*p == '{' || *p == '[') {
    int depth = 0;
    for (; p < e; p++) {
      if (*p == '"') { p = str(p, e) - 1; continue; }
      if (*p == '{' || *p == '[') depth++;
      else if (*p == '}' || *p == ']') { if (--depth == 0) return p + 1; }
    }
    return e;
  }
  while (p < e && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\n' && *p != '\r' && *p != '\t') p++;
  return p;
}

EXPORT("sandbot_handle") uint64_t sandbot_handle(const char *ev, int32_t len) {
  const char *p = ws(ev, ev + len), *e = ev + len;
  const char *in = "null", *inEnd = in + 4;
  if (p < e && *p == '{') {
    p = ws(p + 1, e);
    while (p < e && *p == '"') {
      const char *k = p + 1, *ke = str(p, e) - 1;
      p = ws(ke + 1, e);
      if (p < e && *p == ':') p = ws(p + 1, e);
      const char *v = p;
      p = value(p, e);
      if (ke - k == 5 && memcmp(k, "input", 5) == 0) { in = v; inEnd = p; break; }
      p = ws(p, e);
      if (p < e && *p == ',') p = ws(p + 1, e);
    }
  }
  size_t n = (size_t)(inEnd - in);
  char *out = malloc(n + 11);
  memcpy(out, "{\"result\":", 10);
  memcpy(out + 10, in, n);
  out[10 + n] = '}';
  return ((uint64_t)(uintptr_t)out << 32) | (uint32_t)(n + 11);
}
