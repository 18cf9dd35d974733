// bots.c: one reactor module with several behaviours for the runtime's
// tests, selected by a word in the event ("counter", "loop", "grow", ...).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT(name) __attribute__((export_name(name)))
#define IMPORT(name) __attribute__((import_module("sandbot"), import_name(name)))

IMPORT("log") void sandbot_log(int32_t level, const char *ptr, int32_t len);
IMPORT("fhir") uint64_t sandbot_fhir(const char *ptr, int32_t len);

EXPORT("sandbot_alloc") void *sandbot_alloc(int32_t size) { return malloc(size); }

static void *volatile hoard;
static int counter; // must be 1 in every execution: instances are fresh

static uint64_t answer(const char *s, size_t n) {
  char *out = malloc(n);
  memcpy(out, s, n);
  return ((uint64_t)(uintptr_t)out << 32) | (uint32_t)n;
}

static uint64_t answers(const char *s) { return answer(s, strlen(s)); }

static void logs(int level, const char *s) { sandbot_log(level, s, strlen(s)); }

EXPORT("sandbot_handle") uint64_t sandbot_handle(char *ptr, int32_t len) {
  char *ev = malloc(len + 1);
  memcpy(ev, ptr, len);
  ev[len] = 0;
  char buf[256];
  if (strstr(ev, "\"counter\"")) {
    counter++;
    snprintf(buf, sizeof buf, "{\"result\":%d}", counter);
    return answers(buf);
  }
  if (strstr(ev, "\"loop\"")) {
    volatile uint64_t x = 0;
    for (;;) x++;
  }
  if (strstr(ev, "\"grow\"")) {
    for (;;) {
      char *p = malloc(1 << 20);
      if (!p) __builtin_trap();
      memset(p, 1, 1 << 20);
      *(void **)p = hoard; // keep it reachable so the compiler cannot drop it
      hoard = p;
    }
  }
  if (strstr(ev, "\"bigout\"")) {
    size_t n = 9 << 20;
    char *out = malloc(n);
    memset(out, ' ', n);
    memcpy(out, "{\"result\":1}", 12);
    return ((uint64_t)(uintptr_t)out << 32) | (uint32_t)n;
  }
  if (strstr(ev, "\"log\"")) {
    for (int i = 0; i < 100; i++) {
      snprintf(buf, sizeof buf, "line %03d %0200d", i, 0);
      logs(i % 4, buf);
    }
    return answers("{}");
  }
  if (strstr(ev, "\"fhir\"")) {
    const char *req = "{\"method\":\"GET\",\"url\":\"Patient/123\"}";
    uint64_t r = sandbot_fhir(req, strlen(req));
    char *p = (char *)(uintptr_t)(r >> 32);
    size_t n = (uint32_t)r;
    char *out = malloc(n + 20);
    memcpy(out, "{\"result\":", 10);
    memcpy(out + 10, p, n);
    out[10 + n] = '}';
    return ((uint64_t)(uintptr_t)out << 32) | (uint32_t)(n + 11);
  }
  if (strstr(ev, "\"scribble\"")) { // dirty 12 MiB of heap and leave
    for (int i = 0; i < 12; i++) {
      char *p = malloc(1 << 20);
      memset(p, 0xAB, 1 << 20);
      *(void **)p = hoard;
      hoard = p;
    }
    return answers("{\"result\":\"dirty\"}");
  }
  if (strstr(ev, "\"peek\"")) { // grow as far, then look for the pattern
    hoard = malloc(12 << 20);
    extern unsigned char __heap_base;
    unsigned char *p = &__heap_base, *end = (unsigned char *)(__builtin_wasm_memory_size(0) * 65536);
    size_t dirty = 0;
    for (; p < end; p++) dirty += *p == 0xAB;
    snprintf(buf, sizeof buf, "{\"result\":%zu}", dirty);
    return answers(buf);
  }
  if (strstr(ev, "\"trap\"")) {
    logs(3, "about to trap");
    __builtin_trap();
  }
  if (strstr(ev, "\"exit\"")) {
    fprintf(stderr, "giving up\n");
    exit(7);
  }
  if (strstr(ev, "\"badjson\"")) return answers("{\"result\":");
  if (strstr(ev, "\"status\"")) return answers("{\"result\":\"made\",\"status\":201,\"contentType\":\"text/plain\"}");
  if (strstr(ev, "\"badstatus\"")) return answers("{\"result\":1,\"status\":500}");
  if (strstr(ev, "\"error\"")) return answers("{\"error\":\"no such thing\"}");
  if (strstr(ev, "\"stdout\"")) {
    printf("hello from stdout\n");
    fflush(stdout);
    return answers("{}");
  }
  return answers("{\"result\":\"unknown\"}");
}
