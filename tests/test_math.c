/* test_math.c — unit tests of kernels/bn_math.h and kernels/bn_dtype.h (the arithmetic
 * shared by the CPU team and the GPU kernels), checked against the double-precision
 * reference (reference/sbn_ref.c), which converts fp16/bf16 with independent code.
 */
#include <float.h>

#include "bn_dtype.h"
#include "bn_math.h"
#include "harness.h"
#include "sbn_ref.h"

/* ---- helpers ------------------------------------------------------------------------ */
static double ref_widen(uint16_t h, sbnDataType_t dt) { return sbn_ref_load(&h, dt, 0); }
static uint16_t ref_narrow(float f, sbnDataType_t dt) {
  uint16_t h = 0;
  sbn_ref_store(&h, dt, 0, (double)f);
  return h;
}
static int is_nan16(uint16_t h, sbnDataType_t dt) {
  return dt == sbnFloat16 ? ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu))
                          : ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu));
}
static uint16_t lib_narrow(float f, sbnDataType_t dt) {
  return dt == sbnFloat16 ? sbn_f32_to_f16(f) : sbn_f32_to_bf16(f);
}
static float lib_widen(uint16_t h, sbnDataType_t dt) {
  return dt == sbnFloat16 ? sbn_f16_to_f32(h) : sbn_bf16_to_f32(h);
}
static float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Narrowing of f by the library == by the reference (NaN: both NaN, any payload). */
#define ASSERT_NARROW_AGREES(f, dt)                                                       \
  do {                                                                                    \
    float f_ = (f);                                                                       \
    uint16_t lib_ = lib_narrow(f_, dt), ref_ = ref_narrow(f_, dt);                        \
    if (isnan(f_) ? !(is_nan16(lib_, dt) && is_nan16(ref_, dt)) : lib_ != ref_) {         \
      SBN_FAIL_("narrow(%a = %.9g) to %s: library 0x%04x, reference 0x%04x", (double)f_,  \
                (double)f_, dt == sbnFloat16 ? "fp16" : "bf16", lib_, ref_);             \
      return;                                                                             \
    }                                                                                     \
  } while (0)

/* ---- conversions ------------------------------------------------------------------ */
static void widen_exhaustive(sbnDataType_t dt) {
  for (uint32_t u = 0; u < 65536u; u++) {
    uint16_t h = (uint16_t)u;
    float got = lib_widen(h, dt);
    double ref = ref_widen(h, dt);
    if (isnan(ref)) {
      if (!isnan(got)) { SBN_FAIL_("widen 0x%04x: got %g, expected NaN", u, (double)got); return; }
      continue;
    }
    if ((double)got != ref || !signbit(got) != !signbit(ref)) {
      SBN_FAIL_("widen 0x%04x: got %a, reference %a", u, (double)got, ref);
      return;
    }
    /* round trip: every non-NaN pattern narrows back to itself */
    if (lib_narrow(got, dt) != h) { SBN_FAIL_("round trip of 0x%04x", u); return; }
  }
}
static void test_f16_widen_exhaustive(void) { widen_exhaustive(sbnFloat16); }
static void test_bf16_widen_exhaustive(void) { widen_exhaustive(sbnBFloat16); }

/* Around every finite value v of the small format: v, the float midpoint to the next
   value (a tie), and the floats just either side of the midpoint. Covers every tie and
   every subnormal. Plus random float bit patterns and random values in range. */
static void narrow_sweep(sbnDataType_t dt, uint64_t seed) {
  for (uint32_t u = 0; u < 65536u; u++) {
    uint16_t h = (uint16_t)u, hn = (uint16_t)(u + 1u);
    float v = lib_widen(h, dt);
    if (!isfinite(v)) continue;
    ASSERT_NARROW_AGREES(v, dt);
    if ((h & 0x7fffu) == (dt == sbnFloat16 ? 0x7bffu : 0x7f7fu) || (hn & 0x7fffu) == 0) {
      /* largest finite: next is inf; the "midpoint" is the overflow threshold */
      double thr = (double)v * 2.0 - (double)lib_widen((uint16_t)(u - 1u), dt);
      thr = ((double)v + thr) / 2.0;
      float t = (float)thr;
      ASSERT_NARROW_AGREES(t, dt);
      ASSERT_NARROW_AGREES(nextafterf(t, 0.0f), dt);
      ASSERT_NARROW_AGREES(nextafterf(t, v > 0 ? INFINITY : -INFINITY), dt);
      continue;
    }
    float vn = lib_widen(hn, dt);
    float mid = (float)(((double)v + (double)vn) / 2.0); /* exact: 1 more bit */
    ASSERT_TRUE((double)mid == ((double)v + (double)vn) / 2.0);
    ASSERT_NARROW_AGREES(mid, dt);
    ASSERT_NARROW_AGREES(nextafterf(mid, 0.0f), dt);
    ASSERT_NARROW_AGREES(nextafterf(mid, mid > 0 ? INFINITY : -INFINITY), dt);
  }
  sbn_rng_t rng = {seed};
  for (int i = 0; i < 1000000; i++) {
    float f = f32_from_bits((uint32_t)sbn_rng_u64(&rng));
    ASSERT_NARROW_AGREES(f, dt);
    float g = (float)((sbn_rng_uniform(&rng) * 2.0 - 1.0) * 7.0e4);
    ASSERT_NARROW_AGREES(g, dt);
    float s = (float)ldexp(sbn_rng_uniform(&rng), -(int)sbn_rng_int(&rng, 0, 30));
    ASSERT_NARROW_AGREES(s, dt);
  }
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, FLT_MAX, -FLT_MAX,
                            FLT_MIN, FLT_TRUE_MIN, -FLT_TRUE_MIN, 65504.0f, 65519.99f,
                            65520.0f, -65520.0f, 1.0f, 1.0f + 0x1p-11f, 1.0f + 0x1p-8f};
  for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
    ASSERT_NARROW_AGREES(specials[i], dt);
}
static void test_f16_narrow(void) { narrow_sweep(sbnFloat16, 11); }
static void test_bf16_narrow(void) { narrow_sweep(sbnBFloat16, 12); }

/* Expected bit patterns written out by hand (checks the reference as much as the library). */
static void test_f16_narrow_edges(void) {
  struct { float f; uint16_t h; } e[] = {
      {0.0f, 0x0000},       {-0.0f, 0x8000},       {1.0f, 0x3c00},
      {-2.0f, 0xc000},      {65504.0f, 0x7bff},    {65519.99f, 0x7bff},
      {65520.0f, 0x7c00},   {-65520.0f, 0xfc00},   {1e6f, 0x7c00},
      {INFINITY, 0x7c00},   {-INFINITY, 0xfc00},   {0x1p-14f, 0x0400},
      {0x1p-24f, 0x0001},   {0x1p-25f, 0x0000},    {0x1.000002p-25f, 0x0001},
      {0x1.8p-24f, 0x0002}, {0x1.4p-24f, 0x0001},  {-0x1p-25f, 0x8000},
      {FLT_TRUE_MIN, 0x0000}, {1.0f + 0x1p-11f, 0x3c00}, /* tie: to even (down) */
      {1.0f + 0x3p-11f, 0x3c02},                         /* tie: to even (up) */
      {0x1.ffcp-15f, 0x0400}, /* just under 2^-14: rounds up into the normals */
      {2048.0f + 1.0f, 0x6800}, {2048.0f + 3.0f, 0x6802},
  };
  for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
    if (sbn_f32_to_f16(e[i].f) != e[i].h || ref_narrow(e[i].f, sbnFloat16) != e[i].h) {
      SBN_FAIL_("fp16(%a): library 0x%04x, reference 0x%04x, expected 0x%04x", (double)e[i].f,
                sbn_f32_to_f16(e[i].f), ref_narrow(e[i].f, sbnFloat16), e[i].h);
      return;
    }
  }
  ASSERT_TRUE(is_nan16(sbn_f32_to_f16(NAN), sbnFloat16));
  ASSERT_TRUE(is_nan16(sbn_f32_to_f16(-NAN), sbnFloat16));
  ASSERT_TRUE(is_nan16(sbn_f32_to_f16(f32_from_bits(0x7f800001u)), sbnFloat16)); /* sNaN */
  ASSERT_TRUE(isnan(sbn_f16_to_f32(0x7e00)) && isinf(sbn_f16_to_f32(0x7c00)));
  ASSERT_TRUE(sbn_f16_to_f32(0x7bff) == 65504.0f && sbn_f16_to_f32(0x0001) == 0x1p-24f);
}

static void test_bf16_narrow_edges(void) {
  struct { float f; uint16_t h; } e[] = {
      {0.0f, 0x0000},          {-0.0f, 0x8000},          {1.0f, 0x3f80},
      {1.0f + 0x1p-8f, 0x3f80}, /* tie to even (down) */  {1.0f + 0x3p-8f, 0x3f82},
      {FLT_MAX, 0x7f80},       {-FLT_MAX, 0xff80},       {0x1.fep127f, 0x7f7f},
      {INFINITY, 0x7f80},      {FLT_MIN, 0x0080},        {f32_from_bits(0x00008000u), 0x0000},
      {f32_from_bits(0x00018000u), 0x0002},              {f32_from_bits(0x00008001u), 0x0001},
      {65504.0f, 0x4780},      {6.0e4f, 0x476a},
  };
  for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
    if (sbn_f32_to_bf16(e[i].f) != e[i].h || ref_narrow(e[i].f, sbnBFloat16) != e[i].h) {
      SBN_FAIL_("bf16(%a): library 0x%04x, reference 0x%04x, expected 0x%04x", (double)e[i].f,
                sbn_f32_to_bf16(e[i].f), ref_narrow(e[i].f, sbnBFloat16), e[i].h);
      return;
    }
  }
  ASSERT_TRUE(is_nan16(sbn_f32_to_bf16(NAN), sbnBFloat16));
  ASSERT_TRUE(is_nan16(sbn_f32_to_bf16(f32_from_bits(0x7f800001u)), sbnBFloat16)); /* sNaN */
  ASSERT_TRUE(is_nan16(sbn_f32_to_bf16(f32_from_bits(0xffc00000u)), sbnBFloat16));
}

/* ---- Welford / Chan ----------------------------------------------------------------- */
static void ref_stats(const float* x, int64_t n, double* mean, double* m2) {
  double s = 0.0, q = 0.0;
  for (int64_t i = 0; i < n; i++) s += x[i];
  *mean = n ? s / (double)n : 0.0;
  for (int64_t i = 0; i < n; i++) q += ((double)x[i] - *mean) * ((double)x[i] - *mean);
  *m2 = q;
}
static sbn_welford_t run_of(const float* x, int64_t n) {
  sbn_welford_t w = sbn_welford_empty();
  for (int64_t i = 0; i < n; i++) sbn_welford_push(&w, x[i]);
  return w;
}
/* Pairwise (tree) merge of chunk partials, fixed order. */
static sbn_welford_t tree_merge(sbn_welford_t* p, int64_t k) {
  while (k > 1) {
    int64_t h = 0;
    for (int64_t i = 0; i < k; i += 2) p[h++] = i + 1 < k ? sbn_welford_merge(p[i], p[i + 1]) : p[i];
    k = h;
  }
  return k ? p[0] : sbn_welford_empty();
}
static sbn_welford_t chunked(const float* x, int64_t n, int64_t chunk, sbn_welford_t* scratch) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; i += chunk) scratch[k++] = run_of(x + i, n - i < chunk ? n - i : chunk);
  return tree_merge(scratch, k);
}

/* A partial as the library builds one: shift = the first element, Welford over x - shift. */
static sbn_partial_t partial_of(const float* x, int64_t n) {
  sbn_welford_t w = sbn_welford_empty();
  float shift = n ? x[0] : 0.0f;
  for (int64_t i = 0; i < n; i++) sbn_welford_push(&w, x[i] - shift);
  return sbn_partial_from_shifted(w, shift);
}
static double partial_mean(sbn_partial_t p) { return (double)p.mean_hi + (double)p.mean_lo; }

/* fp32 statistics tolerance (DESIGN.md): 1e-5 absolute + 1e-5 relative. */
#define STAT_ATOL 1e-5
#define STAT_RTOL 1e-5

static void test_welford_push_vs_double(void) {
  sbn_rng_t rng = {21};
  float x[257];
  for (int t = 0; t < 50; t++) {
    int64_t n = sbn_rng_int(&rng, 1, 257);
    double mu = (sbn_rng_uniform(&rng) - 0.5) * 20.0, sd = 0.1 + sbn_rng_uniform(&rng) * 3.0;
    for (int64_t i = 0; i < n; i++) x[i] = (float)(mu + sd * sbn_rng_normal(&rng));
    double rm, rm2;
    ref_stats(x, n, &rm, &rm2);
    sbn_welford_t w = run_of(x, n);
    ASSERT_EQ_INT((int64_t)w.count, n);
    ASSERT_CLOSE(w.mean, rm, STAT_ATOL, STAT_RTOL);
    ASSERT_CLOSE(w.m2 / (double)n, rm2 / (double)n, STAT_ATOL, STAT_RTOL);
  }
  /* one element: mean = x, m2 = 0 exactly */
  sbn_welford_t w = sbn_welford_empty();
  sbn_welford_push(&w, 3.25f);
  ASSERT_BITEQ_F32(w.mean, 3.25f);
  ASSERT_BITEQ_F32(w.m2, 0.0f);
}

static void test_chan_merge(void) {
  sbn_rng_t rng = {22};
  enum { N = 4000 };
  static float x[N];
  static sbn_welford_t scratch[N];
  for (int t = 0; t < 20; t++) {
    double mu = (sbn_rng_uniform(&rng) - 0.5) * 100.0, sd = 0.01 + sbn_rng_uniform(&rng) * 5.0;
    int64_t n = sbn_rng_int(&rng, 2, N);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(mu + sd * sbn_rng_normal(&rng));
    double rm, rm2;
    ref_stats(x, n, &rm, &rm2);
    double rvar = rm2 / (double)n;
    /* 1. a tree over chunks of several sizes */
    const int64_t chunks[] = {1, 7, 32, 100, n};
    for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
      sbn_welford_t g = chunked(x, n, chunks[k], scratch);
      ASSERT_EQ_INT((int64_t)g.count, n);
      ASSERT_CLOSE(g.mean, rm, STAT_ATOL, STAT_RTOL);
      ASSERT_CLOSE(g.m2 / (double)n, rvar, STAT_ATOL, STAT_RTOL);
    }
    /* 2. merge order: left fold, right fold, a split into two uneven halves merged both
       ways: all agree with double to tolerance; each repeated is bitwise identical. */
    int64_t k = 0;
    for (int64_t i = 0; i < n; i += 50) scratch[k++] = run_of(x + i, n - i < 50 ? n - i : 50);
    sbn_welford_t left = sbn_welford_empty(), right = sbn_welford_empty();
    for (int64_t i = 0; i < k; i++) left = sbn_welford_merge(left, scratch[i]);
    for (int64_t i = k - 1; i >= 0; i--) right = sbn_welford_merge(scratch[i], right);
    int64_t cut = sbn_rng_int(&rng, 1, n - 1);
    sbn_welford_t a = run_of(x, cut), b = run_of(x + cut, n - cut);
    sbn_welford_t ab = sbn_welford_merge(a, b), ba = sbn_welford_merge(b, a);
    sbn_welford_t ab2 = sbn_welford_merge(a, b);
    const sbn_welford_t* all[] = {&left, &right, &ab, &ba};
    for (int j = 0; j < 4; j++) {
      ASSERT_EQ_INT((int64_t)all[j]->count, n);
      ASSERT_CLOSE(all[j]->mean, rm, STAT_ATOL, STAT_RTOL);
      ASSERT_CLOSE(all[j]->m2 / (double)n, rvar, STAT_ATOL, STAT_RTOL);
    }
    ASSERT_MEMEQ(&ab, &ab2, sizeof ab);
  }
  /* empty sides return the other operand bitwise */
  sbn_welford_t p = run_of(x, 9), e = sbn_welford_empty();
  sbn_welford_t pe = sbn_welford_merge(p, e), ep = sbn_welford_merge(e, p);
  sbn_welford_t ee = sbn_welford_merge(e, e);
  ASSERT_MEMEQ(&pe, &p, sizeof p);
  ASSERT_MEMEQ(&ep, &p, sizeof p);
  ASSERT_TRUE(ee.count == 0.0f && ee.mean == 0.0f && ee.m2 == 0.0f);
}

/* The reason for Welford: x = 1e4 + N(0,1) in fp32, ~100k elements. */
static void test_naive_variance_fails_welford_passes(void) {
  enum { N = 100000 };
  static float x[N];
  static sbn_welford_t scratch[N / 32 + 1];
  sbn_rng_t rng = {23};
  for (int i = 0; i < N; i++) x[i] = (float)(1.0e4 + sbn_rng_normal(&rng));
  double rm, rm2;
  ref_stats(x, N, &rm, &rm2);
  double rvar = rm2 / N; /* ~1 */
  /* naive fp32: E[x^2] - E[x]^2 with fp32 accumulators */
  float s = 0.0f, q = 0.0f;
  for (int i = 0; i < N; i++) {
    s += x[i];
    q += x[i] * x[i];
  }
  float em = s / (float)N;
  float naive = q / (float)N - em * em;
  if (getenv("SBN_TEST_VERBOSE"))
    fprintf(stderr, "  var ref %.9g, naive fp32 %.9g\n", rvar, (double)naive);
  /* must be far outside the statistics tolerance (it is off by O(1) or more) */
  ASSERT_TRUE(!sbn_close_((double)naive, rvar, STAT_ATOL, STAT_RTOL));
  ASSERT_TRUE(!(fabs((double)naive - rvar) < 0.1)); /* NaN-safe: NaN also "fails" */
  /* chunks of 32 pushed with Welford, merged pairwise with Chan: within tolerance */
  sbn_welford_t g = chunked(x, N, 32, scratch);
  ASSERT_EQ_INT((int64_t)g.count, N);
  ASSERT_CLOSE(g.m2 / (double)N, rvar, STAT_ATOL, STAT_RTOL);
  ASSERT_CLOSE(g.mean, rm, 0.0, 1e-7); /* mean within ~1 ulp of fp32 at 1e4 */
  sbn_stats_t st = sbn_stats_finalize(sbn_partial_from_shifted(g, 0.0f), N, 1e-5f);
  ASSERT_CLOSE(st.invstd, 1.0 / sqrt(rvar + 1e-5), STAT_ATOL, STAT_RTOL);
  ASSERT_CLOSE(st.var_unbiased, rm2 / (N - 1), STAT_ATOL, STAT_RTOL);
}

/* TwoSum: s + err == a + b exactly (exponents kept close enough for double to be exact). */
static void test_two_sum(void) {
  sbn_rng_t rng = {26};
  for (int i = 0; i < 200000; i++) {
    float a = (float)ldexp(sbn_rng_normal(&rng), (int)sbn_rng_int(&rng, -12, 12));
    float b = (float)ldexp(sbn_rng_normal(&rng), (int)sbn_rng_int(&rng, -12, 12));
    float err;
    float s = sbn_two_sum(a, b, &err);
    ASSERT_BITEQ_F32(s, a + b);
    if ((double)s + (double)err != (double)a + (double)b) {
      SBN_FAIL_("two_sum(%a, %a) = %a + %a", (double)a, (double)b, (double)s, (double)err);
      return;
    }
  }
}

/* Partials with the mean as hi + lo: at x = 1e4 + N(0,1) the merged mean is accurate far
   beyond fp32's 4.9e-4 resolution at 1e4, in every merge order; M2 to the statistics
   tolerance. */
static void test_partial_merge_large_offset(void) {
  enum { N = 20000 };
  static float x[N];
  static sbn_partial_t p[N];
  sbn_rng_t rng = {27};
  for (int t = 0; t < 6; t++) {
    double off = t < 3 ? 1.0e4 : -3.0e3 * t;
    for (int i = 0; i < N; i++) x[i] = (float)(off + sbn_rng_normal(&rng));
    double rm, rm2;
    ref_stats(x, N, &rm, &rm2);
    /* random chunk sizes 1..300 (like uneven ranks), merged left to right and as a tree */
    int64_t k = 0;
    for (int64_t i = 0; i < N;) {
      int64_t len = sbn_rng_int(&rng, 1, 300);
      if (len > N - i) len = N - i;
      p[k++] = partial_of(x + i, len);
      i += len;
    }
    sbn_partial_t left = p[0];
    for (int64_t i = 1; i < k; i++) left = sbn_partial_merge(left, p[i]);
    while (k > 1) {
      int64_t h = 0;
      for (int64_t i = 0; i < k; i += 2) p[h++] = i + 1 < k ? sbn_partial_merge(p[i], p[i + 1]) : p[i];
      k = h;
    }
    const sbn_partial_t* both[] = {&left, &p[0]};
    for (int j = 0; j < 2; j++) {
      ASSERT_EQ_INT((int64_t)both[j]->count, N);
      /* |lo| <= ulp(hi)/2 */
      ASSERT_TRUE(fabs((double)both[j]->mean_lo) <= ldexp(1.0, ilogb(both[j]->mean_hi) - 24));
      ASSERT_CLOSE(partial_mean(*both[j]), rm, 1e-6, 0.0);
      ASSERT_CLOSE(both[j]->m2 / (double)N, rm2 / N, STAT_ATOL, STAT_RTOL);
      sbn_stats_t st = sbn_stats_finalize(*both[j], N, 1e-5f);
      ASSERT_CLOSE(st.invstd, 1.0 / sqrt(rm2 / N + 1e-5), STAT_ATOL, STAT_RTOL);
      ASSERT_CLOSE((double)st.mean + st.mean_lo, rm, 1e-6, 0.0);
      ASSERT_TRUE(fabs((double)st.mean - rm) <= ldexp(1.0, ilogb(st.mean) - 23)); /* 1 ulp */
    }
  }
  /* empty sides */
  sbn_partial_t a = partial_of(x, 5), e = partial_of(x, 0);
  sbn_partial_t ae = sbn_partial_merge(a, e), ea = sbn_partial_merge(e, a);
  ASSERT_MEMEQ(&ae, &a, sizeof a);
  ASSERT_MEMEQ(&ea, &a, sizeof a);
}

/* ---- finalize, momentum, running update --------------------------------------------- */
static void test_stats_finalize(void) {
  const float eps_list[] = {1e-5f, 1e-3f, 0.1f, 1.0f};
  for (int i = 0; i < 4; i++) {
    float eps = eps_list[i];
    sbn_partial_t e = sbn_partial_from_shifted(sbn_welford_empty(), 5.0f);
    ASSERT_TRUE(e.count == 0.0f && e.mean_hi == 0.0f && e.mean_lo == 0.0f && e.m2 == 0.0f);
    sbn_stats_t s = sbn_stats_finalize(e, 0, eps);
    ASSERT_BITEQ_F32(s.mean, 0.0f);
    ASSERT_BITEQ_F32(s.mean_lo, 0.0f);
    ASSERT_BITEQ_F32(s.invstd, 1.0f / sqrtf(eps));
    ASSERT_BITEQ_F32(s.var_unbiased, 0.0f);
    ASSERT_CLOSE(s.invstd, 1.0 / sqrt((double)eps), 0.0, 1e-7);
  }
  sbn_rng_t rng = {24};
  float x[300];
  for (int t = 0; t < 40; t++) {
    int64_t n = sbn_rng_int(&rng, 2, 300);
    float eps = t % 2 ? 1e-5f : 1e-3f;
    double sd = 0.05 + 4.0 * sbn_rng_uniform(&rng);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(sbn_rng_normal(&rng) * sd - 1.5);
    double rm, rm2;
    ref_stats(x, n, &rm, &rm2);
    sbn_stats_t s = sbn_stats_finalize(partial_of(x, n), n, eps);
    ASSERT_CLOSE(s.mean, rm, STAT_ATOL, STAT_RTOL);
    ASSERT_CLOSE(s.invstd, 1.0 / sqrt(rm2 / n + (double)eps), STAT_ATOL, STAT_RTOL);
    ASSERT_CLOSE(s.var_unbiased, rm2 / (n - 1), STAT_ATOL, STAT_RTOL);
  }
  /* constant input: var 0, invstd 1/sqrt(eps); a tiny negative m2 is clamped */
  sbn_partial_t c = {4.0f, 2.5f, 0.0f, -1e-7f};
  sbn_stats_t s = sbn_stats_finalize(c, 4, 1e-5f);
  ASSERT_BITEQ_F32(s.invstd, 1.0f / sqrtf(1e-5f));
  ASSERT_BITEQ_F32(s.var_unbiased, 0.0f);
  ASSERT_BITEQ_F32(s.mean, 2.5f);
  sbn_partial_t z = {4.0f, 2.5f, 0.0f, -0.0f}; /* -0: +0, bit for bit */
  s = sbn_stats_finalize(z, 4, 1e-5f);
  ASSERT_BITEQ_F32(s.invstd, 1.0f / sqrtf(1e-5f));
  ASSERT_BITEQ_F32(s.var_unbiased, 0.0f);
  /* a NaN m2 (a NaN or an infinity among the values) stays NaN, as PyTorch's variance:
     a clamp written m2 > 0 ? m2 : 0 (or fmaxf) made it 0, a finite running_var */
  sbn_partial_t q = {4.0f, 2.5f, 0.0f, NAN};
  s = sbn_stats_finalize(q, 4, 1e-5f);
  ASSERT_TRUE(isnan(s.invstd) && isnan(s.var_unbiased));
  /* from the values: one NaN, or an infinity, in a channel */
  const float bad[2] = {NAN, INFINITY};
  for (int k = 0; k < 2; k++) {
    float v[5] = {1.0f, 2.0f, bad[k], 4.0f, 5.0f};
    s = sbn_stats_finalize(partial_of(v, 5), 5, 1e-5f);
    ASSERT_TRUE(isnan(s.invstd) && isnan(s.var_unbiased));
  }
  /* exactly two elements {1, 3}: mean 2, biased var 1, unbiased 2 */
  sbn_welford_t w = sbn_welford_empty();
  sbn_welford_push(&w, 1.0f);
  sbn_welford_push(&w, 3.0f);
  s = sbn_stats_finalize(sbn_partial_from_shifted(w, 0.0f), 2, 0.0f);
  ASSERT_BITEQ_F32(s.mean, 2.0f);
  ASSERT_BITEQ_F32(s.invstd, 1.0f);
  ASSERT_BITEQ_F32(s.var_unbiased, 2.0f);
}

static void test_momentum_factor(void) {
  ASSERT_BITEQ_F32(sbn_momentum_factor(0.1f, 0), 0.1f);
  ASSERT_BITEQ_F32(sbn_momentum_factor(0.1f, 1000), 0.1f);
  ASSERT_BITEQ_F32(sbn_momentum_factor(0.0f, 5), 0.0f);
  ASSERT_BITEQ_F32(sbn_momentum_factor(1.0f, 5), 1.0f);
  /* momentum < 0: cumulative average, 1/(nbt_before + 1) */
  ASSERT_BITEQ_F32(sbn_momentum_factor(-1.0f, 0), 1.0f);
  ASSERT_BITEQ_F32(sbn_momentum_factor(-1.0f, 1), 0.5f);
  ASSERT_BITEQ_F32(sbn_momentum_factor(-0.5f, 3), 0.25f);
  ASSERT_BITEQ_F32(sbn_momentum_factor(-1.0f, 9), 0.1f);
  ASSERT_BITEQ_F32(sbn_momentum_factor(-1.0f, 2), (float)(1.0 / 3.0));
  ASSERT_CLOSE(sbn_momentum_factor(-1.0f, 123456788), 1.0 / 123456789.0, 0.0, 1e-7);
  /* a sequence of cumulative updates gives the plain average of the batches */
  float r = 7.0f; /* PyTorch's initial value is overwritten by factor 1 */
  double sum = 0.0;
  for (int64_t k = 0; k < 10; k++) {
    float batch = (float)(k * k) * 0.5f;
    sum += batch;
    r = sbn_running_update(r, batch, sbn_momentum_factor(-1.0f, k));
    ASSERT_CLOSE(r, sum / (double)(k + 1), 1e-6, 1e-6);
  }
  ASSERT_CLOSE(sbn_running_update(1.0f, 3.0f, 0.1f), 0.9 * 1.0 + 0.1 * 3.0, 0.0, 1e-7);
  ASSERT_BITEQ_F32(sbn_running_update(1.0f, 3.0f, 0.0f), 1.0f);
  ASSERT_BITEQ_F32(sbn_running_update(1.0f, 3.0f, 1.0f), 3.0f);
}

static void test_forward_y(void) {
  /* (x - mean) * scale + bias keeps large offsets: exact here */
  ASSERT_BITEQ_F32(sbn_forward_y(10001.0f, 10000.0f, 0.0f, 2.0f, 0.5f), 2.5f);
  ASSERT_BITEQ_F32(sbn_forward_y(-3.0f, -3.0f, 0.0f, 5.0f, 0.0f), 0.0f);
  /* the low part of the mean is subtracted after the exact x - mean_hi */
  ASSERT_BITEQ_F32(sbn_forward_y(10001.0f, 10000.0f, 0.25f, 2.0f, 0.5f), 2.0f);
  ASSERT_BITEQ_F32(sbn_forward_y(10000.0f, 10000.0f, 1e-4f, 1.0f, 0.0f), -1e-4f);
}

/* fp32 output/grad tolerance (DESIGN.md): 1e-4 absolute + 1e-4 relative. */
static void test_backward_coefficients(void) {
  sbn_rng_t rng = {25};
  for (int t = 0; t < 2000; t++) {
    int64_t m = sbn_rng_int(&rng, 2, 100000);
    float sum_dy = (float)(sbn_rng_normal(&rng) * 30.0);
    float sum_dy_xmu = (float)(sbn_rng_normal(&rng) * 30.0);
    float mean = (float)(sbn_rng_normal(&rng) * 3.0);
    float invstd = (float)(0.2 + 3.0 * sbn_rng_uniform(&rng));
    float weight = (float)(sbn_rng_normal(&rng));
    sbn_bwd_coef_t k = sbn_backward_coefficients(sum_dy, sum_dy_xmu, m, mean, invstd, weight);
    ASSERT_BITEQ_F32(k.mean, mean);
    ASSERT_CLOSE(k.mean_dy, (double)sum_dy / m, 1e-7, 1e-6);
    ASSERT_CLOSE(k.xmu_scale, (double)invstd * invstd * sum_dy_xmu / m, 1e-7, 1e-6);
    ASSERT_CLOSE(k.scale, (double)weight * invstd, 0.0, 1e-6);
    for (int j = 0; j < 5; j++) {
      float x = (float)(mean + sbn_rng_normal(&rng) / invstd);
      float dy = (float)sbn_rng_normal(&rng);
      double ref = (double)weight * invstd *
                   ((double)dy - (double)sum_dy / m -
                    ((double)x - mean) * invstd * invstd * sum_dy_xmu / m);
      ASSERT_CLOSE(sbn_backward_dx(k, x, dy), ref, 1e-4, 1e-4);
    }
  }
  /* m == 0: no NaN, the mean terms vanish */
  sbn_bwd_coef_t z = sbn_backward_coefficients(0.0f, 0.0f, 0, 0.0f, 316.0f, 1.0f);
  ASSERT_BITEQ_F32(z.mean_dy, 0.0f);
  ASSERT_BITEQ_F32(z.xmu_scale, 0.0f);
  sbn_bwd_sums_t a = {1.5f, -2.0f}, b = {0.25f, 4.0f};
  sbn_bwd_sums_t ab = sbn_bwd_sums_merge(a, b);
  ASSERT_BITEQ_F32(ab.sum_dy, 1.75f);
  ASSERT_BITEQ_F32(ab.sum_dy_xmu, 2.0f);
}

/* The kernels' compensated sums where the terms overflow: +-inf as a plain fp32 sum
   (and the CPU team) gives, not the NaN of TwoSum's inf - inf in the low part. */
static void test_csum_not_finite(void) {
  const float dy[3] = {1.0f, INFINITY, 2.0f};
  sbn_csum_t s = {0.0f, 0.0f};
  for (int i = 0; i < 3; i++) sbn_csum_add(&s, dy[i]);
  ASSERT_TRUE(isinf(sbn_csum_value(s)) && sbn_csum_value(s) > 0);
  sbn_csum_t a = {3e38f, 0.0f}, b = {3e38f, 0.0f};
  ASSERT_TRUE(isinf(sbn_csum_value(sbn_csum_merge(a, b))));
  sbn_csum_t c = {-3e38f, 0.0f}, d = {-3e38f, 0.0f};
  ASSERT_TRUE(isinf(sbn_csum_value(sbn_csum_merge(c, d))) && sbn_csum_value(sbn_csum_merge(c, d)) < 0);
  float err = 0.0f;
  const float p = sbn_grad_term(1e30f, 1e10f, 0.0f, &err); /* the product overflows */
  sbn_csum_t g = {0.0f, 0.0f};
  sbn_csum_add2(&g, p, err);
  ASSERT_TRUE(isinf(sbn_csum_value(g)) && sbn_csum_value(g) > 0);
  /* a NaN term stays NaN */
  sbn_csum_t n = {1.0f, 0.0f};
  sbn_csum_add(&n, NAN);
  ASSERT_TRUE(isnan(sbn_csum_value(n)));
  /* finite sums keep their low part: 1 + 2^-30 held as hi + lo */
  sbn_csum_t f = {0.0f, 0.0f};
  sbn_csum_add(&f, 1.0f);
  sbn_csum_add(&f, 0x1p-30f);
  ASSERT_TRUE(f.lo == 0x1p-30f && sbn_csum_value(f) == 1.0f);
}

int main(void) {
  SBN_RUN(test_f16_widen_exhaustive);
  SBN_RUN(test_bf16_widen_exhaustive);
  SBN_RUN(test_f16_narrow_edges);
  SBN_RUN(test_bf16_narrow_edges);
  SBN_RUN(test_f16_narrow);
  SBN_RUN(test_bf16_narrow);
  SBN_RUN(test_welford_push_vs_double);
  SBN_RUN(test_chan_merge);
  SBN_RUN(test_naive_variance_fails_welford_passes);
  SBN_RUN(test_two_sum);
  SBN_RUN(test_partial_merge_large_offset);
  SBN_RUN(test_stats_finalize);
  SBN_RUN(test_momentum_factor);
  SBN_RUN(test_forward_y);
  SBN_RUN(test_backward_coefficients);
  SBN_RUN(test_csum_not_finite);
  return sbn_test_exit();
}
