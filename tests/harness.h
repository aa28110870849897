/* harness.h — the test harness: ASSERT macros that print the expression and the values,
 * independent of NDEBUG, and a tiny runner. One test executable = one main() that calls
 * SBN_RUN(fn) for each test function and returns sbn_test_exit().
 *
 * Tolerances follow DESIGN.md: |got - ref| <= atol + rtol*|ref|. ASSERT_CLOSE_ARRAY
 * prints the worst element and the fraction of the tolerance it used.
 */
#ifndef SYNCBN_TESTS_HARNESS_H_
#define SYNCBN_TESTS_HARNESS_H_

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn.h"

static int sbn_test_failures_;     /* assertions failed in the whole executable */
static int sbn_test_cur_failed_;   /* assertions failed in the current test */
static int sbn_test_count_[3];     /* passed, failed, tests run */

#define SBN_FAIL_(...)                                                  \
  do {                                                                  \
    fprintf(stderr, "%s:%d: FAILED: ", __FILE__, __LINE__);             \
    fprintf(stderr, __VA_ARGS__);                                       \
    fprintf(stderr, "\n");                                              \
    sbn_test_failures_++;                                               \
    sbn_test_cur_failed_++;                                             \
  } while (0)

/* Each ASSERT returns from the current function on failure (tests are void functions).
   EXPECT_ variants record the failure and go on. */
#define EXPECT_TRUE(cond)                                               \
  do {                                                                  \
    if (!(cond)) SBN_FAIL_("%s", #cond);                                \
  } while (0)
#define ASSERT_TRUE(cond)                                               \
  do {                                                                  \
    if (!(cond)) { SBN_FAIL_("%s", #cond); return; }                    \
  } while (0)

#define ASSERT_EQ_INT(a, b)                                                          \
  do {                                                                               \
    long long a_ = (long long)(a), b_ = (long long)(b);                              \
    if (a_ != b_) { SBN_FAIL_("%s == %s: %lld != %lld", #a, #b, a_, b_); return; }   \
  } while (0)

/* Result codes print with their names. */
#define ASSERT_RES(expr, expected)                                                   \
  do {                                                                               \
    sbnResult_t got_ = (expr), exp_ = (expected);                                    \
    if (got_ != exp_) {                                                              \
      SBN_FAIL_("%s returned %s, expected %s", #expr, sbnGetResultName(got_),        \
                sbnGetResultName(exp_));                                             \
      return;                                                                        \
    }                                                                                \
  } while (0)
#define ASSERT_OK(expr) ASSERT_RES(expr, sbnSuccess)

/* Bitwise float equality (NaN == NaN with the same bits; -0 != +0). */
#define ASSERT_BITEQ_F32(a, b)                                                       \
  do {                                                                               \
    float a_ = (a), b_ = (b);                                                        \
    if (memcmp(&a_, &b_, sizeof a_) != 0) {                                          \
      SBN_FAIL_("%s == %s bitwise: %.9g != %.9g", #a, #b, (double)a_, (double)b_);   \
      return;                                                                        \
    }                                                                                \
  } while (0)

/* (no bytes: equal, whatever the pointers; memcmp must not see NULL) */
#define ASSERT_MEMEQ(a, b, nbytes)                                                   \
  do {                                                                               \
    if ((nbytes) != 0 && memcmp((a), (b), (nbytes)) != 0) {                          \
      SBN_FAIL_("%s and %s differ (bitwise, %zu bytes)", #a, #b, (size_t)(nbytes));  \
      return;                                                                        \
    }                                                                                \
  } while (0)

static inline int sbn_close_(double got, double ref, double atol, double rtol) {
  if (isnan(got) || isnan(ref)) return 0;
  return fabs(got - ref) <= atol + rtol * fabs(ref);
}

#define ASSERT_CLOSE(got, ref, atol, rtol)                                           \
  do {                                                                               \
    double g_ = (double)(got), r_ = (double)(ref);                                   \
    if (!sbn_close_(g_, r_, (atol), (rtol))) {                                       \
      SBN_FAIL_("%s ~ %s: got %.9g, ref %.9g, |diff| %.3g > %.3g (atol %g, rtol %g)",\
                #got, #ref, g_, r_, fabs(g_ - r_), (atol) + (rtol) * fabs(r_),       \
                (double)(atol), (double)(rtol));                                     \
      return;                                                                        \
    }                                                                                \
  } while (0)

/* got: float[n], ref: double[n]. Checks every element; prints the worst one. */
static inline int sbn_check_close_array_(const char* what, const float* got, const double* ref,
                                         size_t n, double atol, double rtol, const char* file,
                                         int line) {
  size_t worst = 0, bad = 0;
  double worst_frac = -1.0;
  for (size_t i = 0; i < n; i++) {
    double tol = atol + rtol * fabs(ref[i]);
    double frac = fabs((double)got[i] - ref[i]) / tol;
    if (isnan(frac) || isnan((double)got[i])) frac = INFINITY;
    if (frac > 1.0) bad++;
    if (frac > worst_frac) { worst_frac = frac; worst = i; }
  }
  if (bad) {
    fprintf(stderr,
            "%s:%d: FAILED: %s: %zu of %zu elements out of tolerance (atol %g, rtol %g); "
            "worst [%zu] got %.9g ref %.9g (%.2fx tolerance)\n",
            file, line, what, bad, n, atol, rtol, worst, n ? (double)got[worst] : 0.0,
            n ? ref[worst] : 0.0, worst_frac);
    return 0;
  }
  if (getenv("SBN_TEST_VERBOSE"))
    fprintf(stderr, "  %s: %zu elements ok, worst used %.3f of the tolerance\n", what, n,
            worst_frac < 0 ? 0.0 : worst_frac);
  return 1;
}
#define ASSERT_CLOSE_ARRAY(got, ref, n, atol, rtol)                                  \
  do {                                                                               \
    if (!sbn_check_close_array_(#got, (got), (ref), (n), (atol), (rtol), __FILE__,   \
                                __LINE__)) {                                         \
      sbn_test_failures_++;                                                          \
      sbn_test_cur_failed_++;                                                        \
      return;                                                                        \
    }                                                                                \
  } while (0)

#define SBN_RUN(fn)                                                                  \
  do {                                                                               \
    sbn_test_cur_failed_ = 0;                                                        \
    fprintf(stderr, "[ RUN  ] %s\n", #fn);                                           \
    fn();                                                                            \
    sbn_test_count_[2]++;                                                            \
    if (sbn_test_cur_failed_) {                                                      \
      sbn_test_count_[1]++;                                                          \
      fprintf(stderr, "[ FAIL ] %s\n", #fn);                                         \
    } else {                                                                         \
      sbn_test_count_[0]++;                                                          \
      fprintf(stderr, "[  OK  ] %s\n", #fn);                                         \
    }                                                                                \
  } while (0)

/* Prints the summary; returns the process exit code (0 iff every test passed and at
   least one ran). */
static inline int sbn_test_exit(void) {
  fprintf(stderr, "%d passed, %d failed\n", sbn_test_count_[0], sbn_test_count_[1]);
  return (sbn_test_failures_ == 0 && sbn_test_count_[2] > 0) ? 0 : 1;
}

/* Exit code CTest reports as skipped (SKIP_RETURN_CODE). */
#define SBN_TEST_SKIP 77

/* ---- deterministic random numbers (splitmix64) ------------------------------------ */
typedef struct { uint64_t s; } sbn_rng_t;
static inline uint64_t sbn_rng_u64(sbn_rng_t* r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* uniform in [0, 1) */
static inline double sbn_rng_uniform(sbn_rng_t* r) {
  return (double)(sbn_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}
/* standard normal (Box-Muller) */
static inline double sbn_rng_normal(sbn_rng_t* r) {
  double u1 = sbn_rng_uniform(r), u2 = sbn_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
/* integer in [lo, hi] */
static inline int64_t sbn_rng_int(sbn_rng_t* r, int64_t lo, int64_t hi) {
  return lo + (int64_t)(sbn_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

#endif /* SYNCBN_TESTS_HARNESS_H_ */
