/* bn_math.h — the per-channel arithmetic of SyncBN, shared by the CPU team and the GPU
 * kernels so that CI exercises on the CPU the exact formulas the GPU runs.
 *
 * All math is fp32 (IEEE, no fast-math: 1/sqrtf is correctly rounded on both sides).
 * Under nvcc every function is __host__ __device__; under a C compiler, static inline.
 * Every product is written SBN_MUL so that the GPU computes the same bits as the CPU:
 * nvcc fuses a*b+c into one fma by default, __fmul_rn is never fused; on the host,
 * ISO C mode (-std=c11, as built) does not contract either. Where a fused multiply-add is
 * meant (the exact error of a product), it is written SBN_FMA: correctly rounded on both.
 */
#ifndef SYNCBN_BN_MATH_H_
#define SYNCBN_BN_MATH_H_

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SBN_HD static __host__ __device__ __forceinline__
#else
#define SBN_HD static inline
#endif

#if defined(__CUDA_ARCH__)
#define SBN_MUL(a, b) __fmul_rn((a), (b))
#define SBN_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#else
#define SBN_MUL(a, b) ((a) * (b))
#define SBN_FMA(a, b, c) fmaf((a), (b), (c))
#endif

/* Running (count, mean, M2) of one channel. count is a float: exact up to 2^24, and past
   that only a weight in the merge (relative error 6e-8), never the reported M. */
typedef struct {
  float count;
  float mean;
  float m2; /* sum of squared deviations from mean */
} sbn_welford_t;

SBN_HD sbn_welford_t sbn_welford_empty(void) {
  sbn_welford_t w = {0.0f, 0.0f, 0.0f};
  return w;
}

/* Welford's update: one element. Stable for large offsets (x = 1e4 + N(0,1)) where
   E[x^2] - E[x]^2 in fp32 loses every significant digit. Feed it x - shift (see
   sbn_partial_from_shifted), keep the runs short (a chunk per thread) and combine runs
   with sbn_partial_merge: one very long fp32 run drifts. */
SBN_HD void sbn_welford_push(sbn_welford_t* w, float x) {
  w->count += 1.0f;
  float delta = x - w->mean;
  w->mean += delta / w->count;
  w->m2 += SBN_MUL(delta, x - w->mean);
}

/* Chan et al.'s parallel merge of two partials: the result describes the union.
   Either side may be empty. Not commutative bitwise: callers fix the order. */
SBN_HD sbn_welford_t sbn_welford_merge(sbn_welford_t a, sbn_welford_t b) {
  if (b.count == 0.0f) return a;
  if (a.count == 0.0f) return b;
  sbn_welford_t r;
  r.count = a.count + b.count;
  float delta = b.mean - a.mean;
  float wb = b.count / r.count;
  r.mean = a.mean + SBN_MUL(delta, wb);
  r.m2 = a.m2 + b.m2 + SBN_MUL(SBN_MUL(SBN_MUL(delta, delta), a.count), wb);
  return r;
}

/* A rank's partial of one channel as exchanged between ranks: count, the mean as an
   unevaluated sum hi + lo (|lo| <= ulp(hi)/2: a mean of 1e4 is held to ~1e-11, where
   fp32 rounds it by up to 5e-4), and M2. Merging ranks' partials with a plain fp32 mean
   would put that 5e-4 into every cross-rank delta and into y = x - mean. What hi + lo
   holds is within a few u (2^-24) of the elements' spread of the exact mean, not of the
   mean's size: each Welford run is short and shifted by its own first element
   (sbn_partial_from_shifted), and sbn_partial_merge's rounding is bounded by the spread. */
typedef struct {
  float count;
  float mean_hi;
  float mean_lo;
  float m2;
} sbn_partial_t;

/* s + err == a + b exactly (Knuth's TwoSum: no assumption on magnitudes, no multiply for
   a compiler to contract). */
SBN_HD float sbn_two_sum(float a, float b, float* err) {
  float s = a + b;
  float bb = s - a;
  *err = (a - (s - bb)) + (b - bb);
  return s;
}

/* Whether a count went past a power of two from a to b (0 <= a < b, exact integers):
   b's binary exponent is above a's (0 to anything counts). A run that re-centres its
   shift there (sbn_recentre) does so about log2(count) times. */
SBN_HD int sbn_count_doubled(float a, float b) {
#if defined(__CUDA_ARCH__)
  return (__float_as_uint(b) >> 23) != (__float_as_uint(a) >> 23);
#else
  uint32_t ua, ub;
  memcpy(&ua, &a, sizeof ua);
  memcpy(&ub, &b, sizeof ub);
  return (ub >> 23) != (ua >> 23);
#endif
}

/* A run's state shift + mean (mean: of x - shift) moved, exactly, to shift' + mean' with
   shift' = fl(shift + mean) and |mean'| <= ulp(shift')/2 (TwoSum: the same value). Each
   update of a run's fp32 mean rounds by ~u |mean|, the distance from the shift to the
   run's mean: with the shift its first element, an outlier there (a zero-padded row
   before constant values) made those roundings u |mean - first| each, all of one sign,
   up to ~400 u sigma in the channel's mean. Re-centred whenever the count doubles, the
   shift follows the run's mean, and the roundings are u times the distance from it
   (bench/notes/tolerances.md, "The forward's mean": below 1 u sigma there). */
SBN_HD void sbn_recentre(float* shift, float* mean) {
  float lo;
  *shift = sbn_two_sum(*shift, *mean, &lo);
  *mean = lo;
}

/* The partial of elements x = shift + x' from the Welford state of x'. Callers pick
   shift = one of the run's elements (its first), then re-centre it on the run's mean as the
   run grows (sbn_recentre): x - shift is exact when x is within a factor 2 of shift, and the
   Welford run sees small, centered values. The run's fp32
   mean of x' is good to ~u |mean - shift|, which a shift far from the rest (an outlier
   first) makes large: the run must be short, so that its share of the team's mean is
   small (one shift for 2^24 elements, an outlier 1000 among 1e4 + N(0, 1), put 6e-4 into
   the mean: test_forward's test_outlier_first). */
SBN_HD sbn_partial_t sbn_partial_from_shifted(sbn_welford_t w, float shift) {
  sbn_partial_t p;
  p.count = w.count;
  if (w.count == 0.0f) shift = 0.0f;
  p.mean_hi = sbn_two_sum(shift, w.mean, &p.mean_lo);
  p.m2 = w.m2;
  return p;
}

/* Chan merge of two partials with the mean kept as hi + lo. Either may be empty.
   The mean moves from the side with more elements (a on a tie), by delta times the other
   side's share w <= 1/2: that product's rounding, ~u |delta| w, is below u times the
   union's standard deviation, which is at least |delta| sqrt(w / 2). Moved from the
   smaller side (share near 1) the rounding is u |delta| whatever the spread: one element
   of 1e4 merged with 3e6 values of mean 0 put 1e-3 into the mean, 1e-4 of the standard
   deviation (test_forward: test_uneven_ranks_far_apart). M2's term delta^2 * big * ws is
   formed as (delta * ws) * delta * big: it overflows only where the term does (delta^2
   * big first overflowed for one value of 3e16 beside 2^20 values near 0). */
SBN_HD sbn_partial_t sbn_partial_merge(sbn_partial_t a, sbn_partial_t b) {
  if (b.count == 0.0f) return a;
  if (a.count == 0.0f) return b;
  const int swap = b.count > a.count;
  const sbn_partial_t big = swap ? b : a, small = swap ? a : b;
  sbn_partial_t r;
  r.count = a.count + b.count;
  float dlo;
  float dhi = sbn_two_sum(small.mean_hi, -big.mean_hi, &dlo);
  float delta = dhi + (dlo + (small.mean_lo - big.mean_lo));
  float ws = small.count / r.count;
  float dws = SBN_MUL(delta, ws);
  float lo;
  r.mean_hi = sbn_two_sum(big.mean_hi, big.mean_lo + dws, &lo);
  r.mean_lo = lo;
  r.m2 = a.m2 + b.m2 + SBN_MUL(SBN_MUL(dws, delta), big.count);
  return r;
}

/* 1 / sqrt(var + eps): inference (running_var); training's is sbn_batch_invstd. */
SBN_HD float sbn_invstd(float var, float eps) { return 1.0f / sqrtf(var + eps); }

/* Per-channel scale of the normalization, weight * invstd (weight 1 when affine=False). */
SBN_HD float sbn_scale(float weight, float invstd) { return SBN_MUL(weight, invstd); }

/* The team's statistics of one channel from the merged partial and the exact global
   count M. M == 0: mean 0, invstd 1/sqrt(eps) (inf for eps 0), var_unbiased 0 (callers
   leave running stats alone then). M == 1 is rejected before this is called. */
typedef struct {
  float mean;         /* fp32 mean: save_mean, running_mean */
  float mean_lo;      /* mean_hi + mean_lo: the mean to a few u of the spread, for y */
  float invstd;       /* 1 / sqrt(var_biased + eps); 0 where both are 0 (PyTorch's) */
  float var_unbiased; /* var_biased * M / (M - 1), for the running stats */
} sbn_stats_t;

/* The batch's invstd: 1 / sqrt(var + eps), and 0 where var and eps are both 0 (a constant
   channel with eps = 0), as PyTorch's batch norm: y is then the bias and dx 0, where
   1 / sqrt(0) made y, dx and dweight NaN. Inference keeps sbn_invstd, as PyTorch's
   evaluated batch norm does. */
SBN_HD float sbn_batch_invstd(float var, float eps) {
  return (var == 0.0f && eps == 0.0f) ? 0.0f : sbn_invstd(var, eps);
}

SBN_HD sbn_stats_t sbn_stats_finalize(sbn_partial_t g, int64_t m, float eps) {
  sbn_stats_t s;
  if (m <= 0) {
    s.mean = 0.0f;
    s.mean_lo = 0.0f;
    s.invstd = sbn_invstd(0.0f, eps);
    s.var_unbiased = 0.0f;
    return s;
  }
  /* Rounding can leave -0 or a tiny negative: 0. A NaN (a NaN or an infinity among the
     channel's values) stays NaN, in invstd and var_unbiased, as PyTorch's variance is NaN
     there: the running variance must not look healthy. */
  float m2 = (g.m2 > 0.0f || g.m2 != g.m2) ? g.m2 : 0.0f;
  float var = m2 / (float)m;
  s.mean = g.mean_hi;
  s.mean_lo = g.mean_lo;
  s.invstd = sbn_batch_invstd(var, eps);
  s.var_unbiased = m > 1 ? m2 / (float)(m - 1) : 0.0f;
  return s;
}

/* Weight of this batch in the running stats: momentum, or for momentum < 0 the
   cumulative average 1 / (num_batches_tracked + 1), num_batches_tracked counted before
   this call (PyTorch: increments first, then uses 1 / num_batches_tracked). */
SBN_HD float sbn_momentum_factor(float momentum, int64_t num_batches_tracked_before) {
  if (momentum >= 0.0f) return momentum;
  return (float)(1.0 / ((double)num_batches_tracked_before + 1.0)); /* no int64 overflow */
}

/* num_batches_tracked after this call: + 1, wrapping at INT64_MAX as PyTorch's int64 add
   does, without signed overflow. */
SBN_HD int64_t sbn_nbt_next(int64_t num_batches_tracked_before) {
  return (int64_t)((uint64_t)num_batches_tracked_before + 1u);
}

/* running = (1 - factor) * running + factor * batch. */
SBN_HD float sbn_running_update(float running, float batch, float factor) {
  return SBN_MUL(1.0f - factor, running) + SBN_MUL(factor, batch);
}

/* Forward normalization of one element; scale = weight * invstd, mean = mean + mean_lo.
   x - mean first (exact when x is near the mean) keeps large offsets exact, where
   x*scale + shift would cancel catastrophically. Inference passes mean_lo = 0. */
SBN_HD float sbn_forward_y(float x, float mean, float mean_lo, float scale, float bias) {
  return SBN_MUL((x - mean) - mean_lo, scale) + bias;
}

/* Backward per channel, PyTorch's formulas with the team's sums and count M:
   dx = w * invstd * (dy - sum_dy/M - (x - mean) * invstd^2 * sum_dy_xmu/M). */
typedef struct {
  float mean;      /* save_mean */
  float mean_dy;   /* sum_dy / M */
  float xmu_scale; /* invstd^2 * sum_dy_xmu / M (as invstd * (invstd * (sum_dy_xmu / M))) */
  float scale;     /* weight * invstd */
} sbn_bwd_coef_t;

SBN_HD sbn_bwd_coef_t sbn_backward_coefficients(float sum_dy, float sum_dy_xmu, int64_t m,
                                                float mean, float invstd, float weight) {
  sbn_bwd_coef_t k;
  float inv_m = m > 0 ? 1.0f / (float)m : 0.0f;
  k.mean = mean;
  k.mean_dy = SBN_MUL(sum_dy, inv_m);
  /* invstd * (invstd * (sum_dy_xmu / M)), not invstd^2 first: var + eps below ~3e-39 (a
     channel of values ~1e-20 with eps 1e-44) has a finite invstd whose square overflows
     fp32, which made every dx of the channel inf where the exact one fits
     (test_backward: test_backward_tiny_variance) */
  /* invstd 0 (a channel whose sum of squared deviations overflowed fp32, or a constant one
     with eps = 0): y did not depend on x, so the term is 0, where 0 * sum_dy_xmu was NaN
     once that sum overflowed too (dy * (x - mean) of values ~1e19: test_forward's
     test_m2_overflow) */
  k.xmu_scale =
      invstd != 0.0f ? SBN_MUL(invstd, SBN_MUL(invstd, SBN_MUL(sum_dy_xmu, inv_m))) : 0.0f;
  k.scale = sbn_scale(weight, invstd);
  return k;
}

/* dweight of a channel from its (local or team) sum dy * (x - mean), the team's count m:
   0 for m == 0 (no values anywhere: an empty sum, also where eps = 0 made invstd inf), and
   for invstd 0 (y the bias: sbn_backward_coefficients), whatever the sum (inf or NaN once
   it overflowed). */
SBN_HD float sbn_dweight(float sum_dy_xmu, float invstd, int64_t m) {
  return m > 0 && invstd != 0.0f ? SBN_MUL(sum_dy_xmu, invstd) : 0.0f;
}

/* dx from x - mean (xmu) and the gradient dy reaching the normalization. */
SBN_HD float sbn_backward_dx_xmu(sbn_bwd_coef_t k, float xmu, float dy) {
  return SBN_MUL(dy - k.mean_dy - SBN_MUL(xmu, k.xmu_scale), k.scale);
}

SBN_HD float sbn_backward_dx(sbn_bwd_coef_t k, float x, float dy) {
  return sbn_backward_dx_xmu(k, x - k.mean, dy);
}

/* Per-channel backward partial: the two sums the team reduces (the CPU team: plain fp32
   sums in a chunked pairwise tree, src/cpu/cpu_reduce.c). */
typedef struct {
  float sum_dy;
  float sum_dy_xmu;
} sbn_bwd_sums_t;

SBN_HD sbn_bwd_sums_t sbn_bwd_sums_merge(sbn_bwd_sums_t a, sbn_bwd_sums_t b) {
  sbn_bwd_sums_t r;
  r.sum_dy = a.sum_dy + b.sum_dy;
  r.sum_dy_xmu = a.sum_dy_xmu + b.sum_dy_xmu;
  return r;
}

/* A compensated sum: hi the fp32 sum of the terms, lo the sum of its additions' rounding
   errors (each exact by TwoSum), so hi + lo is the exact sum up to lo's own roundings
   (of order u^2 of the partial sums). The kernels sum a channel's dy and dy (x - mean)
   this way, term by term, through every merge: a thread runs over a thousand terms in a
   row, and over millions of values a channel's sum can be 10^7 times smaller than its
   terms (S1 at W = 8), where a plain fp32 sum loses it (bench/notes/
   tolerances.md). */
typedef struct {
  float hi, lo;
} sbn_csum_t;

SBN_HD void sbn_csum_add(sbn_csum_t* s, float t) {
  float e;
  s->hi = sbn_two_sum(s->hi, t, &e);
  s->lo += e;
}

/* Adds a term given as t + t_err (sbn_grad_term's). */
SBN_HD void sbn_csum_add2(sbn_csum_t* s, float t, float t_err) {
  float e;
  s->hi = sbn_two_sum(s->hi, t, &e);
  s->lo += e + t_err;
}

SBN_HD sbn_csum_t sbn_csum_merge(sbn_csum_t a, sbn_csum_t b) {
  sbn_csum_t r;
  float e;
  r.hi = sbn_two_sum(a.hi, b.hi, &e);
  r.lo = (a.lo + b.lo) + e;
  return r;
}

/* The sum, rounded once. Where the sum is not finite, hi is what a plain fp32 sum gives
   (+-inf, NaN) while lo holds TwoSum's inf - inf = NaN: hi then, so that a channel whose
   terms overflow reads +-inf, as the CPU team's plain sums do, not NaN. */
SBN_HD float sbn_csum_value(sbn_csum_t s) { return isfinite(s.hi) ? s.hi + s.lo : s.hi; }

/* The backward's term dy * (x - mean) as p + *err, exact but for the rounding of *err (of
   order u^2 |p|): the difference's rounding by TwoSum, the product's by an fma. p is the
   plain fp32 term; the kernels sum both parts (the roundings of the terms, as large as
   the plain sum's own on a channel that cancels, would otherwise remain). */
SBN_HD float sbn_grad_term(float dy, float x, float mean, float* err) {
  float dlo;
  const float d = sbn_two_sum(x, -mean, &dlo);
  const float p = SBN_MUL(dy, d);
  *err = SBN_FMA(dy, dlo, SBN_FMA(dy, d, -p));
  return p;
}

/* sbn_grad_term for an x - mean given as one float (the in-place backward's, recovered
   from y: sbn_xmu_from_y): p + *err with the product's rounding by an fma. */
SBN_HD float sbn_grad_term_xmu(float dy, float xmu, float* err) {
  const float p = SBN_MUL(dy, xmu);
  *err = SBN_FMA(dy, xmu, -p);
  return p;
}

/* The kernels' per-channel backward partial: both sums compensated. */
typedef struct {
  sbn_csum_t dy, dy_xmu;
} sbn_bwd_csums_t;

SBN_HD sbn_bwd_csums_t sbn_bwd_csums_merge(sbn_bwd_csums_t a, sbn_bwd_csums_t b) {
  sbn_bwd_csums_t r;
  r.dy = sbn_csum_merge(a.dy, b.dy);
  r.dy_xmu = sbn_csum_merge(a.dy_xmu, b.dy_xmu);
  return r;
}

/* ---- the epilogue: activation after the normalization (sbnForwardTrainEx) ----------
   act: sbnActivation_t's values (0 identity, 1 ReLU, 2 leaky ReLU). */
#define SBN_ACT_IDENTITY 0
#define SBN_ACT_RELU 1
#define SBN_ACT_LEAKY 2

/* act(v). NaN stays NaN (as PyTorch's relu and leaky_relu). */
SBN_HD float sbn_act(int act, float slope, float v) {
  if (act == SBN_ACT_RELU) return v < 0.0f ? 0.0f : v;
  if (act == SBN_ACT_LEAKY) return v > 0.0f ? v : SBN_MUL(slope, v);
  return v;
}

/* The gradient through the activation from its OUTPUT y (what the backward keeps), as
   PyTorch's threshold_backward and leaky_relu_backward: ReLU gives 0 where y <= 0 and g
   elsewhere (a NaN y passes g), leaky ReLU g where y > 0 and slope * g elsewhere. */
SBN_HD float sbn_act_grad(int act, float slope, float y, float g) {
  if (act == SBN_ACT_RELU) return y <= 0.0f ? 0.0f : g;
  if (act == SBN_ACT_LEAKY) return y > 0.0f ? g : SBN_MUL(slope, g);
  return g;
}

/* ---- the activation's mask from x (sbnEpilogue_t.no_residual) ------------------------
   A backward of ReLU or leaky ReLU (slope >= 0) whose forward had no z can take the mask
   from x: y > 0 exactly where the forward's v = sbn_forward_y(x, mean, mean_lo, scale,
   bias) > 0, but where v rounds to 0 in the dtype. The backward has no mean_lo (no output
   holds it), so it computes v' = fma(d, s, b), d = x - mean, s = sbn_scale(weight,
   invstd), the forward's mean, scale and bias. |v - v'| <= 2u|v'| + u|s||mean| + 2u|s||d|
   + 2^-148 to first order (u = 2^-24: mean_lo is a two-sum's error, |mean_lo| <=
   u|mean|; one rounding each for d - mean_lo, the product, the sum and the fma; 2^-148
   the products' underflow; bench/notes/fused-epilogue.md, "The mask from x"). Where
   |v'| > t, t = 2^-21 (|s| (|mean| + |d|) + floor 2^21) (over 2.6x each term of that
   bound, and floor >= the dtype's least subnormal, so that v also rounds to a nonzero
   y), v has v''s sign, and so does y: the mask is sure. Elsewhere (a band ~t wide around
   0; NaN v', s or x, and where t overflows) the caller reads y. floor: sbn_xmask_floor(dtype's
   least subnormal). Returns 1 (v > 0: y > 0), -1 (v < 0: y <= 0) or 0 (read y). */
#ifndef SBN_XMASK_SCALE /* 2^21: a test's mutant may set it (tests/test_xmask.c) */
#define SBN_XMASK_SCALE 2097152.0f
#endif
#ifndef SBN_XMASK_LEAST_FLOOR /* 1; a test's mutant sets 0 (no fp16 floor) */
#define SBN_XMASK_LEAST_FLOOR 1
#endif
SBN_HD float sbn_xmask_floor(float least_subnormal) {
  return SBN_XMASK_LEAST_FLOOR && least_subnormal > 0x1p-126f ? least_subnormal : 0x1p-126f;
}
SBN_HD int sbn_xmask_sign(float d, float s, float b, float mean, float floor) {
  const float v = SBN_FMA(d, s, b);
  const float t = SBN_FMA(fabsf(s), fabsf(mean) + fabsf(d), floor * SBN_XMASK_SCALE);
  if (!(SBN_MUL(fabsf(v), SBN_XMASK_SCALE) > t)) return 0;
  return v > 0.0f ? 1 : -1;
}
/* Whether a backward takes the mask from x: no_residual, an activation, x and y given and
   not the same memory (x == y, allowed where dx and dweight are not asked for, is y: its
   values are no x), no dz (a dz says the forward had a z). One rule for the CPU team, the
   GPU launches (gpu_launch.c) and the emulation's (test_coop_emu.c). */
SBN_HD int sbn_xmask_applies(int no_residual, int act, const void* x, const void* y, const void* dz) {
  return no_residual && act != SBN_ACT_IDENTITY && x != 0 && y != 0 && x != y && dz == 0;
}
/* The gradient through the activation where sbn_xmask_sign was sure (sign != 0): what
   sbn_act_grad gives from a y of that sign. */
SBN_HD float sbn_act_grad_sign(int act, float slope, int sign, float g) {
  return sign > 0 ? g : act == SBN_ACT_LEAKY ? SBN_MUL(slope, g) : 0.0f;
}

/* v = act^-1(y) for the invertible activations (identity; leaky ReLU with slope > 0),
   given inv_slope = sbn_inv_slope's: a product per element, no division. */
SBN_HD float sbn_act_inverse(int act, float inv_slope, float y) {
  if (act == SBN_ACT_LEAKY) return y > 0.0f ? y : SBN_MUL(y, inv_slope);
  return y;
}
SBN_HD float sbn_inv_slope(int act, float slope) { return act == SBN_ACT_LEAKY ? 1.0f / slope : 1.0f; }

/* The per-channel factor of the recovery: 1 / (weight * invstd); by policy 0 where
   |weight| < max(min_weight (SBN_RECOVER_MIN_WEIGHT), unit * |bias|), unit the dtype's
   unit roundoff (sbn_dtype_unit): x_hat is taken as 0 there, dweight 0, dx weight *
   invstd * (g - mean(g)). y = weight x_hat + bias is stored with an error of up to unit
   * |y|, which dividing by the weight makes an error of x_hat of up to unit * |bias| /
   |weight| (weight 0: y is the bias rounded, and keeps no x): beyond 1 below that line,
   where x_hat itself (mean 0, variance 1) is a better guess than what y gives (the bias's
   own rounding divided by 1e-5 gave a bf16 dweight of 790 for an exact -2.2). Also 0
   where weight * invstd is 0 (invstd 0: a constant channel with eps = 0, whose y is the
   bias and keeps no x; 1 / 0 made (y - bias) * inf NaN), as the x-based backward gives
   there. A NaN weight stays NaN. */
SBN_HD float sbn_recover_rcp(float weight, float bias, float unit, float min_weight, float invstd) {
  const float least = fmaxf(min_weight, SBN_MUL(unit, fabsf(bias)));
  const float s = SBN_MUL(weight, invstd);
  return (fabsf(weight) < least || s == 0.0f) ? 0.0f : 1.0f / s;
}

/* x - mean recovered from the forward's output: ((act^-1(y) - z) - bias) * rcp, rcp =
   sbn_recover_rcp's, z the forward's residual at the element (sbnBackwardInPlaceEx), 0
   without one (a - 0 is a, -0 and NaN included: then the bits of (act^-1(y) - bias) * rcp):
   two products and two differences per element, no division (each rounding is one ulp of
   the result at most: bench/notes/tolerances.md, "The in-place backward"). z's difference
   is the one rounding more: with the rounding y kept of act(bn(x) + z), x_hat is off by
   about (|bn(x) + z| u_y + |bn(x)| 2^-24) / |weight| (tolerances.md, "The in-place
   backward with a residual"). The backward's sums and dx take x - mean, so this is all
   they need of x. */
SBN_HD float sbn_xmu_from_y(int act, float inv_slope, float y, float z, float bias, float rcp) {
  return SBN_MUL((sbn_act_inverse(act, inv_slope, y) - z) - bias, rcp);
}

#endif /* SYNCBN_BN_MATH_H_ */
