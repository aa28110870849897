/* unwritten.h — which outputs of a GPU test were never written. The GPU tests poison their
 * output buffers before a launch and, before any comparison of values, count the items that
 * still hold the poison: an output the launch never covered is reported as such, first,
 * not as a wrong value to be explained by rounding, FMA contraction or a kernel bug (the
 * first GPU run lost a day to cases 1024-1999 of test_gpu_math, which a launch of 128
 * threads per block sized for 256 never wrote, reported as bit mismatches "(FMA?)").
 *
 * An item is `size` bytes (an element, or one case's output record). It counts as unwritten
 * when every byte is the poison byte and it differs from the same item of `ref` (the value
 * the test expects, NULL: none): an output whose right value happens to be the poison
 * pattern is not flagged. Plain C, for the C and the CUDA C++ tests. */
#ifndef SYNCBN_TESTS_GPU_UNWRITTEN_H_
#define SYNCBN_TESTS_GPU_UNWRITTEN_H_

#include <stdio.h>
#include <string.h>

typedef struct {
  size_t count;       /* items never written */
  size_t first, last; /* the first and last of them (count > 0) */
  size_t ranges;      /* maximal runs of consecutive unwritten items */
} sbn_unwritten_t;

static inline sbn_unwritten_t sbn_unwritten(const void* out, const void* ref, size_t n,
                                            size_t size, unsigned char poison) {
  sbn_unwritten_t u = {0, 0, 0, 0};
  const unsigned char* o = (const unsigned char*)out;
  const unsigned char* r = (const unsigned char*)ref;
  for (size_t i = 0; i < n; i++) {
    const unsigned char* it = o + i * size;
    size_t b = 0;
    while (b < size && it[b] == poison) b++;
    if (b < size || (r != NULL && memcmp(it, r + i * size, size) == 0)) continue;
    if (u.count == 0 || u.last + 1 != i) u.ranges++;
    if (u.count == 0) u.first = i;
    u.last = i;
    u.count++;
  }
  return u;
}

/* Prints what was never written (to stderr, as a FAILED line of `file`:`line`) and returns
   0; returns 1 when everything was written. */
static inline int sbn_report_unwritten_(const char* what, sbn_unwritten_t u, size_t n,
                                        unsigned char poison, const char* file, int line) {
  if (u.count == 0) return 1;
  fprintf(stderr,
          "%s:%d: FAILED: %s: %zu of %zu outputs were NEVER WRITTEN (still the 0x%02x poison), "
          "%s %zu..%zu in %zu run(s): the launch did not cover them (check the grid and "
          "block sizes) — their values say nothing about the arithmetic\n",
          file, line, what, u.count, n, (unsigned)poison, u.count == 1 ? "item" : "items",
          u.first, u.last, u.ranges);
  return 0;
}
#define SBN_REPORT_UNWRITTEN(what, u, n, poison) \
  sbn_report_unwritten_((what), (u), (n), (poison), __FILE__, __LINE__)

#endif /* SYNCBN_TESTS_GPU_UNWRITTEN_H_ */
