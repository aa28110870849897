/* test_gpu_math.cu — the shared arithmetic (kernels/bn_math.h, kernels/bn_dtype.h) must
 * give BITWISE the same results on the GPU as on the host: the CPU team is the reference
 * every GPU path is checked against, and DESIGN.md promises they run the exact same
 * formulas. A kernel evaluates every function on many inputs, the host evaluates the same
 * functions on the same inputs, and every output bit is compared.
 *
 * Every output buffer is poisoned (0xcd bytes) before its launch, and before any value is
 * compared the test checks that the launch wrote every output (tests/gpu/unwritten.h): an
 * output the grid did not cover is reported as never written, not as a mismatch.
 *
 * nvcc contracts a*b+c into an FMA by default (-fmad=true). bn_math.h writes every
 * product as SBN_MUL (__fmul_rn on the device, never fused) and every fma it means as
 * SBN_FMA (correctly rounded on both: sbn_grad_term's exact term), so this test is built with
 * nvcc's defaults, like the library's kernels, and must still agree bitwise. The test
 * reports whether the device contracts plain a*b+c, to explain a failure if a product
 * without SBN_MUL slips into bn_math.h.
 *
 * Also checked: the conversions agree with CUDA's own __half2float / __float2half_rn /
 * __bfloat162float / __float2bfloat16_rn on every non-NaN input (bn_dtype.h promises it),
 * and every fp16/bf16 pattern survives widen+narrow.
 *
 * Without a GPU it prints why and exits 77 (skipped). Built by a host C++ compiler instead
 * of nvcc (test_gpu_math_host.cc, every build with CUDA headers), the same kernels run as
 * host loops over the same grid (launch_1d below): that says nothing about the GPU's
 * arithmetic, but runs the test's launches, poison and coverage checks in CI; built with
 * SBN_GPU_MATH_MUTANT_LAUNCH (the first GPU run's bug: blocks sized for kThreads threads,
 * launched with half as many) it must report outputs never written.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#ifdef __CUDACC__
#include <cuda_runtime.h>

#include "gpu_skip.h" /* the skip line without a device */
#endif

#include <float.h>
#include <stdlib.h>

#include <vector>

#include "bn_dtype.h"
#include "bn_math.h"
#include "harness.h"
#include "unwritten.h"

#ifdef __CUDACC__
#define CUDA_CHECK(call)                                                                \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      fprintf(stderr, "%s:%d: CUDA error: %s: %s (%s)\n", __FILE__, __LINE__, #call,    \
              cudaGetErrorName(e_), cudaGetErrorString(e_));                            \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)
/* Launch check: the launch itself, then the kernel's completion. */
#define CUDA_CHECK_LAUNCH()                 \
  do {                                      \
    CUDA_CHECK(cudaGetLastError());         \
    CUDA_CHECK(cudaDeviceSynchronize());    \
  } while (0)
#else
/* Host mode: "device" memory is host memory; the grid's indices are these variables. */
struct HostIdx {
  unsigned x, y, z;
};
static HostIdx blockIdx, threadIdx, blockDim, gridDim;
#endif

/* Every launch of this test is 1-D, kThreads threads per block, blocks_for(n) blocks:
   one definition, so the grid always covers the n cases (the kernels return for i >= n). */
static const unsigned kThreads = 256;
static unsigned blocks_for(size_t n) { return (unsigned)((n + kThreads - 1) / kThreads); }

template <typename... P, typename... A>
static void launch_1d(void (*kernel)(P...), size_t n, A... args) {
  unsigned threads = kThreads;
#ifdef SBN_GPU_MATH_MUTANT_LAUNCH
  threads = kThreads / 2; /* the first GPU run's launch: blocks for 256, 128 threads each */
#endif
#ifdef __CUDACC__
  kernel<<<blocks_for(n), threads>>>(args...);
  CUDA_CHECK_LAUNCH();
#else
  gridDim = HostIdx{blocks_for(n), 1, 1};
  blockDim = HostIdx{threads, 1, 1};
  for (unsigned b = 0; b < gridDim.x; b++)
    for (unsigned t = 0; t < threads; t++) {
      blockIdx = HostIdx{b, 0, 0};
      threadIdx = HostIdx{t, 0, 0};
      kernel(args...);
    }
#endif
}

static const unsigned char kPoison = 0xcd;

/* Every output of a launch was written: 1, or 0 after saying which were not. expected:
   the host's values of the same outputs (an output whose right value is the poison
   pattern is not flagged). */
template <typename T>
static int all_written(const char* what, const std::vector<T>& dev, const std::vector<T>& expected) {
  return SBN_REPORT_UNWRITTEN(what, sbn_unwritten(dev.data(), expected.data(), dev.size(), sizeof(T), kPoison),
                              dev.size(), kPoison);
}

static bool g_fma_contracted = false; /* set by detect_fma_contraction() */

/* ---- device buffers ------------------------------------------------------------- */
#ifdef __CUDACC__
template <typename T>
static T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(T) + 1));
  if (!h.empty()) CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
static T* device_alloc(size_t n) {
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, n * sizeof(T) + 1));
  CUDA_CHECK(cudaMemset(d, kPoison, n * sizeof(T))); /* poison: an unwritten slot shows */
  return d;
}
template <typename T>
static std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  if (n) CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}
static void device_free(void* d) { CUDA_CHECK(cudaFree(d)); }
#else
template <typename T>
static T* to_device(const std::vector<T>& h) {
  T* d = static_cast<T*>(malloc(h.size() * sizeof(T) + 1));
  if (d == nullptr) abort();
  if (!h.empty()) memcpy(d, h.data(), h.size() * sizeof(T));
  return d;
}
template <typename T>
static T* device_alloc(size_t n) {
  T* d = static_cast<T*>(malloc(n * sizeof(T) + 1));
  if (d == nullptr) abort();
  memset(d, kPoison, n * sizeof(T));
  return d;
}
template <typename T>
static std::vector<T> to_host(const T* d, size_t n) {
  return std::vector<T>(d, d + n);
}
static void device_free(void* d) { free(d); }
#endif

static uint32_t fbits(float f) { return sbn_f32_bits(f); }

/* Compares two float arrays bitwise; prints the first few mismatches with `describe(i)`. */
template <typename Describe>
static size_t count_bit_mismatches(const char* what, const float* dev, const float* host,
                                   size_t n, Describe describe) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (fbits(dev[i]) == fbits(host[i])) continue;
    if (bad < 5) {
      fprintf(stderr, "  %s[%zu]: device %.9g (0x%08x) host %.9g (0x%08x); ", what, i,
              (double)dev[i], fbits(dev[i]), (double)host[i], fbits(host[i]));
      describe(i);
      fprintf(stderr, "\n");
    }
    bad++;
  }
  if (bad) {
    fprintf(stderr, "  %s: %zu of %zu differ bitwise%s\n", what, bad, n,
            g_fma_contracted ? " (device code contracts a*b+c into FMA: is a product in "
                               "bn_math.h not written with SBN_MUL?)"
                             : "");
  }
  return bad;
}
static void no_description(size_t) {}

/* ---- FMA contraction probe -------------------------------------------------------- */
/* a = b = 1 + 2^-12, c = -(1 + 2^-11): a*b rounds to 1 + 2^-11 (the 2^-24 term is a tie
   broken to even), so unfused a*b + c = 0 while fma(a, b, c) = 2^-24. */
__global__ void fma_probe_kernel(const float* in, float* out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = in[0] * in[1] + in[2];
}
static void detect_fma_contraction(void) {
  std::vector<float> in = {1.0f + 0x1p-12f, 1.0f + 0x1p-12f, -(1.0f + 0x1p-11f)};
  float* din = to_device(in);
  float* dout = device_alloc<float>(1);
  launch_1d(fma_probe_kernel, 1, (const float*)din, dout);
  std::vector<float> out = to_host(dout, 1);
  g_fma_contracted = out[0] != 0.0f;
  fprintf(stderr, "note: device code %s a*b+c (probe gave %g)\n",
          g_fma_contracted ? "CONTRACTS (fma, -fmad=true)" : "does not contract", (double)out[0]);
  device_free(din);
  device_free(dout);
}

/* ---- 1. widening: all 65536 fp16 and bf16 patterns ---------------------------------- */
__global__ void widen_kernel(float* f16, float* bf16, float* f16_cuda, float* bf16_cuda,
                             uint16_t* f16_round, uint16_t* bf16_round) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 65536u) return;
  uint16_t h = (uint16_t)i;
  f16[i] = sbn_f16_to_f32(h);
  bf16[i] = sbn_bf16_to_f32(h);
  f16_cuda[i] = __half2float(__ushort_as_half(h));
  bf16_cuda[i] = __bfloat162float(__ushort_as_bfloat16(h));
  f16_round[i] = sbn_f32_to_f16(f16[i]);
  bf16_round[i] = sbn_f32_to_bf16(bf16[i]);
}

static void test_widen_all_patterns(void) {
  const size_t n = 65536;
  float* d_f16 = device_alloc<float>(n);
  float* d_bf16 = device_alloc<float>(n);
  float* d_f16c = device_alloc<float>(n);
  float* d_bf16c = device_alloc<float>(n);
  uint16_t* d_f16r = device_alloc<uint16_t>(n);
  uint16_t* d_bf16r = device_alloc<uint16_t>(n);
  launch_1d(widen_kernel, n, d_f16, d_bf16, d_f16c, d_bf16c, d_f16r, d_bf16r);
  std::vector<float> f16 = to_host(d_f16, n), bf16 = to_host(d_bf16, n);
  std::vector<float> f16c = to_host(d_f16c, n), bf16c = to_host(d_bf16c, n);
  std::vector<uint16_t> f16r = to_host(d_f16r, n), bf16r = to_host(d_bf16r, n);
  device_free(d_f16); device_free(d_bf16);
  device_free(d_f16c); device_free(d_bf16c);
  device_free(d_f16r); device_free(d_bf16r);

  std::vector<float> hf16(n), hbf16(n), hf16c(n), hbf16c(n);
  std::vector<uint16_t> identity(n);
  for (size_t i = 0; i < n; i++) {
    hf16[i] = sbn_f16_to_f32((uint16_t)i);
    hbf16[i] = sbn_bf16_to_f32((uint16_t)i);
    hf16c[i] = __half2float(__ushort_as_half((unsigned short)i));
    hbf16c[i] = __bfloat162float(__ushort_as_bfloat16((unsigned short)i));
    identity[i] = (uint16_t)i;
  }
  /* every output written, before any value is compared */
  ASSERT_TRUE(all_written("widen: f16_to_f32", f16, hf16) & all_written("widen: bf16_to_f32", bf16, hbf16) &
              all_written("widen: __half2float", f16c, hf16c) &
              all_written("widen: __bfloat162float", bf16c, hbf16c) &
              all_written("widen: f16 round trip", f16r, identity) &
              all_written("widen: bf16 round trip", bf16r, identity));
  auto pat = [](size_t i) { fprintf(stderr, "pattern 0x%04zx", i); };
  EXPECT_TRUE(count_bit_mismatches("f16_to_f32", f16.data(), hf16.data(), n, pat) == 0);
  EXPECT_TRUE(count_bit_mismatches("bf16_to_f32", bf16.data(), hbf16.data(), n, pat) == 0);

  /* Against CUDA's conversions: bitwise for non-NaN (widening is exact, so there is one
     right answer); NaN must stay NaN (payload canonicalization may differ). */
  size_t bad_cuda = 0, bad_round = 0;
  for (size_t i = 0; i < n; i++) {
    const float lib[2] = {f16[i], bf16[i]}, cu[2] = {f16c[i], bf16c[i]};
    for (int k = 0; k < 2; k++) {
      bool ok = isnan(cu[k]) ? isnan(lib[k]) : fbits(lib[k]) == fbits(cu[k]);
      if (!ok && bad_cuda++ < 5)
        fprintf(stderr, "  %s 0x%04zx: lib %.9g cuda %.9g\n", k ? "bf16" : "f16", i,
                (double)lib[k], (double)cu[k]);
    }
    /* widen then narrow is the identity on every non-NaN pattern; NaN stays NaN */
    const uint16_t rt[2] = {f16r[i], bf16r[i]};
    for (int k = 0; k < 2; k++) {
      bool nan_in = isnan(lib[k]);
      bool ok = nan_in ? isnan(k ? sbn_bf16_to_f32(rt[k]) : sbn_f16_to_f32(rt[k]))
                       : rt[k] == (uint16_t)i;
      if (!ok && bad_round++ < 5)
        fprintf(stderr, "  %s round trip 0x%04zx -> 0x%04x\n", k ? "bf16" : "f16", i,
                (unsigned)rt[k]);
    }
  }
  EXPECT_TRUE(bad_cuda == 0);
  EXPECT_TRUE(bad_round == 0);
}

/* ---- 2. narrowing: ties, neighbours of ties, boundaries, random bits ------------------ */
__global__ void narrow_kernel(const float* in, size_t n, uint16_t* f16, uint16_t* bf16,
                              uint16_t* f16_cuda, uint16_t* bf16_cuda) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  f16[i] = sbn_f32_to_f16(in[i]);
  bf16[i] = sbn_f32_to_bf16(in[i]);
  f16_cuda[i] = __half_as_ushort(__float2half_rn(in[i]));
  bf16_cuda[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
}

static void push_with_neighbours(std::vector<float>& v, float f) {
  uint32_t u = fbits(f);
  v.push_back(f);
  v.push_back(sbn_f32_from_bits(u + 1));
  v.push_back(sbn_f32_from_bits(u - 1));
  v.push_back(-f);
}

static std::vector<float> narrowing_inputs(void) {
  std::vector<float> v;
  /* every fp16/bf16 value and the midpoints between neighbours (the ties; both fit a
     float exactly), each with its float neighbours on either side */
  for (uint32_t h = 0; h < 0x7c00u; h++) {
    float a = sbn_f16_to_f32((uint16_t)h), b = sbn_f16_to_f32((uint16_t)(h + 1));
    v.push_back(a);
    v.push_back(-a);
    push_with_neighbours(v, (float)(((double)a + (double)b) / 2.0));
  }
  for (uint32_t h = 0; h < 0x7f80u; h += 3) { /* every third bf16: 11k ties, all exponents */
    float a = sbn_bf16_to_f32((uint16_t)h), b = sbn_bf16_to_f32((uint16_t)(h + 1));
    v.push_back(a);
    push_with_neighbours(v, (float)(((double)a + (double)b) / 2.0));
  }
  /* boundaries: fp16 max, overflow threshold, smallest subnormal and half of it, bf16
     overflow, float extremes, specials */
  const float special[] = {0.0f, 65504.0f, 65519.0f, 65520.0f, 65536.0f, 0x1p-24f, 0x1p-25f,
                           0x1.8p-25f, 0x1p-26f, 0x1p-14f, 0x1.ff8p-15f, FLT_MAX, FLT_MIN,
                           0x1p-149f, 3.3895314e38f, 0x1.fffffep127f, 1.0f, 1.5f, 3.1415927f,
                           INFINITY};
  for (float f : special) push_with_neighbours(v, f);
  v.push_back(NAN);
  v.push_back(-NAN);
  v.push_back(sbn_f32_from_bits(0x7f800001u)); /* signalling NaN, smallest payload */
  v.push_back(sbn_f32_from_bits(0xffc12345u));
  /* random bit patterns (every exponent), and random values in the fp16 range */
  sbn_rng_t rng = {12345};
  for (int i = 0; i < 200000; i++) v.push_back(sbn_f32_from_bits((uint32_t)sbn_rng_u64(&rng)));
  for (int i = 0; i < 200000; i++)
    v.push_back((float)(sbn_rng_normal(&rng) * pow(2.0, (double)sbn_rng_int(&rng, -26, 17))));
  return v;
}

static void test_narrow(void) {
  std::vector<float> in = narrowing_inputs();
  const size_t n = in.size();
  float* d_in = to_device(in);
  uint16_t* d_f16 = device_alloc<uint16_t>(n);
  uint16_t* d_bf16 = device_alloc<uint16_t>(n);
  uint16_t* d_f16c = device_alloc<uint16_t>(n);
  uint16_t* d_bf16c = device_alloc<uint16_t>(n);
  launch_1d(narrow_kernel, n, (const float*)d_in, n, d_f16, d_bf16, d_f16c, d_bf16c);
  std::vector<uint16_t> f16 = to_host(d_f16, n), bf16 = to_host(d_bf16, n);
  std::vector<uint16_t> f16c = to_host(d_f16c, n), bf16c = to_host(d_bf16c, n);
  device_free(d_in); device_free(d_f16); device_free(d_bf16);
  device_free(d_f16c); device_free(d_bf16c);

  std::vector<uint16_t> hf16(n), hbf16(n), hf16c(n), hbf16c(n);
  for (size_t i = 0; i < n; i++) {
    hf16[i] = sbn_f32_to_f16(in[i]);
    hbf16[i] = sbn_f32_to_bf16(in[i]);
    hf16c[i] = __half_as_ushort(__float2half_rn(in[i]));
    hbf16c[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
  }
  /* every output written, before any value is compared */
  ASSERT_TRUE(all_written("narrow: f32_to_f16", f16, hf16) & all_written("narrow: f32_to_bf16", bf16, hbf16) &
              all_written("narrow: __float2half_rn", f16c, hf16c) &
              all_written("narrow: __float2bfloat16_rn", bf16c, hbf16c));

  size_t bad_host = 0, bad_cuda = 0;
  for (size_t i = 0; i < n; i++) {
    const uint16_t host[2] = {hf16[i], hbf16[i]};
    const uint16_t dev[2] = {f16[i], bf16[i]}, cu[2] = {f16c[i], bf16c[i]};
    for (int k = 0; k < 2; k++) {
      if (dev[k] != host[k] && bad_host++ < 5)
        fprintf(stderr, "  %s(%.9g = 0x%08x): device 0x%04x host 0x%04x\n",
                k ? "f32_to_bf16" : "f32_to_f16", (double)in[i], fbits(in[i]),
                (unsigned)dev[k], (unsigned)host[k]);
      /* vs CUDA's round-to-nearest-even: identical bits except NaN payloads */
      bool ok = isnan(in[i]) ? isnan(k ? sbn_bf16_to_f32(cu[k]) : sbn_f16_to_f32(cu[k])) &&
                                   isnan(k ? sbn_bf16_to_f32(dev[k]) : sbn_f16_to_f32(dev[k]))
                             : dev[k] == cu[k];
      if (!ok && bad_cuda++ < 5)
        fprintf(stderr, "  %s(%.9g = 0x%08x): lib 0x%04x cuda 0x%04x\n",
                k ? "f32_to_bf16" : "f32_to_f16", (double)in[i], fbits(in[i]),
                (unsigned)dev[k], (unsigned)cu[k]);
    }
  }
  if (bad_host) fprintf(stderr, "  narrowing: %zu device/host mismatches of %zu\n", bad_host, 2 * n);
  if (bad_cuda) fprintf(stderr, "  narrowing: %zu lib/CUDA mismatches of %zu\n", bad_cuda, 2 * n);
  EXPECT_TRUE(bad_host == 0);
  EXPECT_TRUE(bad_cuda == 0);
}

/* ---- 3. Welford and partials: push over chunks, merge in order, finalize ----------- */
/* One case = one channel's data of length len, pushed in chunks of `chunk` elements
   (one partial per chunk, as one GPU thread would), partials merged left to right and
   pairwise (kernels reduce in trees), then finalized with the exact count. Both the
   plain Welford merge and the hi/lo partials (sbn_partial_from_shifted with the shift
   = the case's first element, or each chunk's first, + sbn_partial_merge) are covered. */
struct WelfordCase {
  int start, len, chunk;
  int shift_per_chunk;
  float eps;
};
struct WelfordOut {
  float seq[3];     /* one run of pushes: count, mean, m2 */
  float wchunk[3];  /* chunked pushes, sbn_welford_merge left to right */
  float pchunk[4];  /* chunked partials, sbn_partial_merge left to right: count, hi, lo, m2 */
  float ptree[4];   /* chunked partials, merged pairwise */
  float stats[4];   /* finalize(pchunk): mean, mean_lo, invstd, var_unbiased */
  float stats_tree[4];
};

#define SBN_MAX_CHUNKS 64

SBN_HD void welford_case(const float* data, WelfordCase c, WelfordOut* o) {
  const float* x = data + c.start;
  sbn_welford_t seq = sbn_welford_empty();
  for (int i = 0; i < c.len; i++) sbn_welford_push(&seq, x[i]);
  sbn_welford_t wparts[SBN_MAX_CHUNKS];
  sbn_partial_t parts[SBN_MAX_CHUNKS];
  int np = 0;
  for (int s = 0; s < c.len || np == 0; s += c.chunk) { /* len 0: one empty partial */
    float shift = c.len == 0 ? 0.0f : (c.shift_per_chunk ? x[s] : x[0]);
    sbn_welford_t w = sbn_welford_empty(), ws = sbn_welford_empty();
    for (int i = s; i < s + c.chunk && i < c.len; i++) {
      sbn_welford_push(&w, x[i]);
      sbn_welford_push(&ws, x[i] - shift);
    }
    wparts[np] = w;
    parts[np++] = sbn_partial_from_shifted(ws, shift);
  }
  sbn_welford_t wacc = sbn_welford_empty();
  sbn_partial_t pacc = sbn_partial_from_shifted(sbn_welford_empty(), 0.0f);
  for (int p = 0; p < np; p++) {
    wacc = sbn_welford_merge(wacc, wparts[p]);
    pacc = sbn_partial_merge(pacc, parts[p]);
  }
  for (int width = 1; width < np; width *= 2) /* pairwise, in place */
    for (int p = 0; p + width < np; p += 2 * width) parts[p] = sbn_partial_merge(parts[p], parts[p + width]);
  sbn_stats_t st = sbn_stats_finalize(pacc, c.len, c.eps);
  sbn_stats_t st2 = sbn_stats_finalize(parts[0], c.len, c.eps);
  o->seq[0] = seq.count; o->seq[1] = seq.mean; o->seq[2] = seq.m2;
  o->wchunk[0] = wacc.count; o->wchunk[1] = wacc.mean; o->wchunk[2] = wacc.m2;
  o->pchunk[0] = pacc.count; o->pchunk[1] = pacc.mean_hi; o->pchunk[2] = pacc.mean_lo; o->pchunk[3] = pacc.m2;
  o->ptree[0] = parts[0].count; o->ptree[1] = parts[0].mean_hi; o->ptree[2] = parts[0].mean_lo; o->ptree[3] = parts[0].m2;
  o->stats[0] = st.mean; o->stats[1] = st.mean_lo; o->stats[2] = st.invstd; o->stats[3] = st.var_unbiased;
  o->stats_tree[0] = st2.mean; o->stats_tree[1] = st2.mean_lo; o->stats_tree[2] = st2.invstd; o->stats_tree[3] = st2.var_unbiased;
}

__global__ void welford_kernel(const float* data, const WelfordCase* cases, int ncases,
                               WelfordOut* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < ncases) welford_case(data, cases[i], &out[i]);
}

static void test_welford(void) {
  sbn_rng_t rng = {777};
  std::vector<float> data;
  std::vector<WelfordCase> cases;
  const float eps_choices[] = {1e-5f, 0.0f, 1e-3f, 0.1f};
  for (int k = 0; k < 2000; k++) {
    WelfordCase c;
    c.len = (int)(k < 8 ? k : sbn_rng_int(&rng, 0, 600)); /* 0..7 first: edge counts */
    c.chunk = (int)sbn_rng_int(&rng, 1, 64);
    if ((c.len + c.chunk - 1) / c.chunk > SBN_MAX_CHUNKS) c.chunk = (c.len + SBN_MAX_CHUNKS - 1) / SBN_MAX_CHUNKS;
    c.shift_per_chunk = (k / 4) % 2;
    c.eps = eps_choices[k % 4];
    c.start = (int)data.size();
    /* distributions the library must handle: standard, large offset (1e4 + N(0,1)),
       tiny, fp16-range magnitudes, constant (variance exactly 0), integers */
    int kind = k % 6;
    double off = kind == 1 ? 1e4 : 0.0;
    double scale = kind == 2 ? 1e-6 : (kind == 3 ? 3e4 : 1.0);
    for (int i = 0; i < c.len; i++) {
      double v = kind == 4 ? 2.5 : off + scale * sbn_rng_normal(&rng);
      if (kind == 5) v = (double)sbn_rng_int(&rng, -100, 100);
      data.push_back((float)v);
    }
    cases.push_back(c);
  }
  float* d_data = to_device(data);
  WelfordCase* d_cases = to_device(cases);
  WelfordOut* d_out = device_alloc<WelfordOut>(cases.size());
  launch_1d(welford_kernel, cases.size(), (const float*)d_data, (const WelfordCase*)d_cases,
            (int)cases.size(), d_out);
  std::vector<WelfordOut> dev = to_host(d_out, cases.size());
  device_free(d_data); device_free(d_cases); device_free(d_out);

  std::vector<WelfordOut> host(cases.size());
  for (size_t i = 0; i < cases.size(); i++) welford_case(data.data(), cases[i], &host[i]);
  ASSERT_TRUE(all_written("welford: cases", dev, host)); /* before any value is compared */
  const size_t nf = sizeof(WelfordOut) / sizeof(float);
  const char* field[] = {"seq.count", "seq.mean", "seq.m2",
                         "wchunk.count", "wchunk.mean", "wchunk.m2",
                         "pchunk.count", "pchunk.mean_hi", "pchunk.mean_lo", "pchunk.m2",
                         "ptree.count", "ptree.mean_hi", "ptree.mean_lo", "ptree.m2",
                         "mean", "mean_lo", "invstd", "var_unbiased",
                         "tree mean", "tree mean_lo", "tree invstd", "tree var_unbiased"};
  static_assert(sizeof(WelfordOut) == 22 * sizeof(float), "field names");
  auto describe = [&](size_t j) {
    const WelfordCase& c = cases[j / nf];
    fprintf(stderr, "case %zu (%s): len %d chunk %d shift_per_chunk %d eps %g", j / nf,
            field[j % nf], c.len, c.chunk, c.shift_per_chunk, (double)c.eps);
  };
  EXPECT_TRUE(count_bit_mismatches("welford", (const float*)dev.data(),
                                   (const float*)host.data(), cases.size() * nf, describe) == 0);
}

/* ---- 4. momentum factor, running update, forward_y, backward ----------------------- */
struct ElemIn {
  float momentum;
  int64_t nbt;
  float running, batch;
  float x, mean, mean_lo, scale, bias, dy;
  float ts_a, ts_b; /* sbn_two_sum operands */
  float sum_dy, sum_dy_xmu, invstd, weight;
  int64_t m;
  float a_dy, a_xmu, b_dy, b_xmu; /* bwd sums to merge */
};
struct ElemOut {
  float factor, running, y;
  float coef[4]; /* mean, mean_dy, xmu_scale, scale */
  float dx;
  float sums[2];
  float two_sum[2]; /* s, err */
  float grad_term[2]; /* sbn_grad_term(dy, x, mean): p, err (uses SBN_FMA) */
  float csum[2];      /* a compensated sum of p, err and the a/b values, merged: hi, lo */
};

SBN_HD void elem_case(const ElemIn* in, ElemOut* o) {
  o->factor = sbn_momentum_factor(in->momentum, in->nbt);
  o->running = sbn_running_update(in->running, in->batch, o->factor);
  o->y = sbn_forward_y(in->x, in->mean, in->mean_lo, in->scale, in->bias);
  o->two_sum[0] = sbn_two_sum(in->ts_a, in->ts_b, &o->two_sum[1]);
  sbn_bwd_coef_t k = sbn_backward_coefficients(in->sum_dy, in->sum_dy_xmu, in->m, in->mean,
                                               in->invstd, in->weight);
  o->coef[0] = k.mean; o->coef[1] = k.mean_dy; o->coef[2] = k.xmu_scale; o->coef[3] = k.scale;
  o->dx = sbn_backward_dx(k, in->x, in->dy);
  sbn_bwd_sums_t a = {in->a_dy, in->a_xmu}, b = {in->b_dy, in->b_xmu};
  sbn_bwd_sums_t r = sbn_bwd_sums_merge(a, b);
  o->sums[0] = r.sum_dy; o->sums[1] = r.sum_dy_xmu;
  float terr = 0.0f;
  o->grad_term[0] = sbn_grad_term(in->dy, in->x, in->mean, &terr);
  o->grad_term[1] = terr;
  sbn_csum_t c1 = {in->a_dy, 0.0f}, c2 = {in->b_dy, in->b_xmu * 0x1p-30f};
  sbn_csum_add2(&c1, o->grad_term[0], terr);
  sbn_csum_add(&c2, in->a_xmu);
  c1 = sbn_csum_merge(c1, c2);
  o->csum[0] = c1.hi; o->csum[1] = c1.lo;
}

__global__ void elem_kernel(const ElemIn* in, int n, ElemOut* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) elem_case(&in[i], &out[i]);
}

static void test_elementwise(void) {
  sbn_rng_t rng = {4242};
  std::vector<ElemIn> in;
  const float momenta[] = {0.1f, 0.0f, 1.0f, 0.01f, 0.9f, -1.0f, -0.5f};
  const int64_t nbts[] = {0, 1, 2, 6, 99, 12345, (int64_t)1 << 40};
  for (int k = 0; k < 100000; k++) {
    ElemIn e;
    double offset = (k % 5 == 0) ? 1e4 : 0.0; /* large offsets: x - mean must stay exact */
    e.momentum = (k % 8 == 7) ? (float)sbn_rng_uniform(&rng) : momenta[k % 7];
    e.nbt = (k % 9 == 8) ? sbn_rng_int(&rng, 0, 1000000) : nbts[(k / 7) % 7];
    e.running = (float)sbn_rng_normal(&rng);
    e.batch = (float)(sbn_rng_normal(&rng) * 3.0);
    e.x = (float)(offset + sbn_rng_normal(&rng) * 2.0);
    /* mean_lo: the rounding residue of a double mean, |mean_lo| <= ulp(mean)/2 */
    double mean_d = offset + sbn_rng_normal(&rng);
    e.mean = (float)mean_d;
    e.mean_lo = (k % 3 == 0) ? 0.0f : (float)(mean_d - (double)e.mean);
    /* two_sum: operands of very different and of equal magnitudes, both signs */
    e.ts_a = (float)(sbn_rng_normal(&rng) * pow(2.0, (double)sbn_rng_int(&rng, -30, 30)));
    e.ts_b = (float)(sbn_rng_normal(&rng) * pow(2.0, (double)sbn_rng_int(&rng, -30, 30)));
    if (k % 7 == 0) e.ts_b = -e.ts_a * (1.0f + 0x1p-20f);
    e.invstd = (float)(0.01 + 10.0 * sbn_rng_uniform(&rng));
    e.weight = (float)sbn_rng_normal(&rng);
    e.scale = e.weight * e.invstd;
    e.bias = (float)sbn_rng_normal(&rng);
    e.dy = (float)sbn_rng_normal(&rng);
    e.m = (k % 11 == 0) ? 0 : sbn_rng_int(&rng, 2, (int64_t)1 << 30); /* m = 0: inv_m = 0 */
    e.sum_dy = (float)(sbn_rng_normal(&rng) * 100.0);
    e.sum_dy_xmu = (float)(sbn_rng_normal(&rng) * 100.0);
    e.a_dy = (float)sbn_rng_normal(&rng); e.a_xmu = (float)sbn_rng_normal(&rng);
    e.b_dy = (float)sbn_rng_normal(&rng); e.b_xmu = (float)sbn_rng_normal(&rng);
    in.push_back(e);
  }
  ElemIn* d_in = to_device(in);
  ElemOut* d_out = device_alloc<ElemOut>(in.size());
  launch_1d(elem_kernel, in.size(), (const ElemIn*)d_in, (int)in.size(), d_out);
  std::vector<ElemOut> dev = to_host(d_out, in.size());
  device_free(d_in); device_free(d_out);

  std::vector<ElemOut> host(in.size());
  for (size_t i = 0; i < in.size(); i++) elem_case(&in[i], &host[i]);
  ASSERT_TRUE(all_written("elementwise: cases", dev, host)); /* before any value is compared */
  const size_t nf = sizeof(ElemOut) / sizeof(float);
  static_assert(sizeof(ElemOut) == 16 * sizeof(float), "field names");
  const char* field[] = {"momentum_factor", "running_update", "forward_y", "coef.mean",
                         "coef.mean_dy", "coef.xmu_scale", "coef.scale", "backward_dx",
                         "sums.sum_dy", "sums.sum_dy_xmu", "two_sum.s", "two_sum.err",
                         "grad_term.p", "grad_term.err", "csum.hi", "csum.lo"};
  auto describe = [&](size_t j) {
    const ElemIn& e = in[j / nf];
    fprintf(stderr, "case %zu (%s): momentum %g nbt %lld x %.9g mean %.9g dy %.9g m %lld",
            j / nf, field[j % nf], (double)e.momentum, (long long)e.nbt, (double)e.x,
            (double)e.mean, (double)e.dy, (long long)e.m);
  };
  EXPECT_TRUE(count_bit_mismatches("elementwise", (const float*)dev.data(),
                                   (const float*)host.data(), in.size() * nf, describe) == 0);
}

int main(void) {
#ifndef __CUDACC__
  fprintf(stderr, "test_gpu_math (host build): the kernels run as host loops over the same "
                  "grid; this checks the launches and the coverage checks, not a GPU\n");
#else
  char why[320];
  if (gpu_count_devices(why, sizeof why) == 0) return gpu_skip_no_device("test_gpu_math", why);
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  fprintf(stderr, "device 0: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
#endif
  detect_fma_contraction();
  (void)no_description;
  SBN_RUN(test_widen_all_patterns);
  SBN_RUN(test_narrow);
  SBN_RUN(test_welford);
  SBN_RUN(test_elementwise);
  return sbn_test_exit();
}
