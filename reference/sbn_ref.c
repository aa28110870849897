/* sbn_ref.c — the double-precision reference (see sbn_ref.h): the specification of
 * SyncBN in code. Plain loops, double everywhere, two passes (mean, then variance).
 * It deliberately shares nothing with src/ or kernels/: the fp16/bf16 conversions below
 * are written with frexp/ldexp arithmetic on values, not with bit tricks on floats.
 */
#include "sbn_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- small binary formats (fp16: p=11, emin=-14, emax=15; bf16: p=8, emin=-126,
   emax=127; p counts the implicit bit) ----------------------------------------------- */
typedef struct {
  int p, emin, emax, expbits;
} fmt_t;
static const fmt_t FMT_F16 = {11, -14, 15, 5};
static const fmt_t FMT_BF16 = {8, -126, 127, 8};

/* Value of a bit pattern, exactly. */
static double small_to_double(uint16_t h, fmt_t f) {
  int mbits = f.p - 1;
  int bias = f.emax;
  unsigned emask = (1u << f.expbits) - 1u;
  int sign = (h >> 15) & 1;
  unsigned e = (h >> mbits) & emask;
  unsigned m = h & ((1u << mbits) - 1u);
  double v;
  if (e == emask) {
    v = m ? NAN : INFINITY;
  } else if (e == 0) {
    v = ldexp((double)m, f.emin - mbits); /* subnormal or zero */
  } else {
    v = ldexp((double)(m + (1u << mbits)), (int)e - bias - mbits);
  }
  return sign ? -v : v;
}

/* Round v to the format, nearest with ties to even, overflow to infinity. */
static uint16_t double_to_small(double v, fmt_t f) {
  int mbits = f.p - 1;
  int bias = f.emax;
  unsigned emask = (1u << f.expbits) - 1u;
  uint16_t sign = signbit(v) ? 0x8000u : 0u;
  if (isnan(v)) return (uint16_t)(sign | (emask << mbits) | (1u << (mbits - 1))); /* quiet */
  double a = fabs(v);
  if (isinf(a)) return (uint16_t)(sign | (emask << mbits));
  if (a == 0.0) return sign;
  int e;
  (void)frexp(a, &e); /* a = fr * 2^e, fr in [0.5, 1): exponent of a is e - 1 */
  int ulp_exp = (e - 1 > f.emin ? e - 1 : f.emin) - mbits; /* weight of the last kept bit */
  double r = rint(ldexp(a, -ulp_exp)); /* exact scaling; rint: nearest, ties to even */
  double val = ldexp(r, ulp_exp);
  if (val >= ldexp(1.0, f.emax + 1)) return (uint16_t)(sign | (emask << mbits)); /* inf */
  if (val < ldexp(1.0, f.emin)) return (uint16_t)(sign | (unsigned)r); /* subnormal / 0 */
  double fr = frexp(val, &e);
  unsigned m = (unsigned)ldexp(fr, f.p); /* in [2^mbits, 2^p) */
  unsigned be = (unsigned)(e - 1 + bias);
  return (uint16_t)(sign | (be << mbits) | (m - (1u << mbits)));
}

double sbn_ref_load(const void* x, sbnDataType_t dt, int64_t i) {
  switch (dt) {
    case sbnFloat32: return (double)((const float*)x)[i];
    case sbnFloat16: return small_to_double(((const uint16_t*)x)[i], FMT_F16);
    case sbnBFloat16: return small_to_double(((const uint16_t*)x)[i], FMT_BF16);
  }
  abort();
}

void sbn_ref_store(void* x, sbnDataType_t dt, int64_t i, double v) {
  switch (dt) {
    case sbnFloat32: ((float*)x)[i] = (float)v; return;
    case sbnFloat16: ((uint16_t*)x)[i] = double_to_small(v, FMT_F16); return;
    case sbnBFloat16: ((uint16_t*)x)[i] = double_to_small(v, FMT_BF16); return;
  }
  abort();
}

int64_t sbn_ref_numel(const sbnTensorDesc_t* d) { return d->n * d->c * d->spatial; }

int64_t sbn_ref_index(const sbnTensorDesc_t* d, int64_t ni, int64_t ci, int64_t si) {
  if (d->layout == sbnLayoutNCHW) return (ni * d->c + ci) * d->spatial + si;
  return (ni * d->spatial + si) * d->c + ci;
}

/* ---- training forward ------------------------------------------------------------- */
void sbn_ref_forward(int nranks, const sbnTensorDesc_t* descs, const void* const* xs,
                     const float* weight, const float* bias, double eps, double* mean,
                     double* invstd, double* var_unbiased, int64_t* m, double* const* ys) {
  int64_t c = descs[0].c;
  int64_t total = 0;
  for (int r = 0; r < nranks; r++) total += descs[r].n * descs[r].spatial;
  *m = total;
  for (int64_t ci = 0; ci < c; ci++) {
    double sum = 0.0, ss = 0.0;
    for (int r = 0; r < nranks; r++) {
      const sbnTensorDesc_t* d = &descs[r];
      for (int64_t ni = 0; ni < d->n; ni++)
        for (int64_t si = 0; si < d->spatial; si++)
          sum += sbn_ref_load(xs[r], d->dtype, sbn_ref_index(d, ni, ci, si));
    }
    double mu = total > 0 ? sum / (double)total : 0.0;
    for (int r = 0; r < nranks; r++) {
      const sbnTensorDesc_t* d = &descs[r];
      for (int64_t ni = 0; ni < d->n; ni++)
        for (int64_t si = 0; si < d->spatial; si++) {
          double dev = sbn_ref_load(xs[r], d->dtype, sbn_ref_index(d, ni, ci, si)) - mu;
          ss += dev * dev;
        }
    }
    double var = total > 0 ? ss / (double)total : 0.0;
    /* PyTorch's InvStd: 0 for a batch whose var and eps are both 0 */
    double is = (total > 0 && var == 0.0 && eps == 0.0) ? 0.0 : 1.0 / sqrt(var + eps);
    mean[ci] = mu;
    invstd[ci] = is;
    var_unbiased[ci] = total > 1 ? ss / (double)(total - 1) : 0.0;
    if (!ys) continue;
    double w = weight ? (double)weight[ci] : 1.0;
    double b = bias ? (double)bias[ci] : 0.0;
    for (int r = 0; r < nranks; r++) {
      const sbnTensorDesc_t* d = &descs[r];
      if (!ys[r]) continue;
      for (int64_t ni = 0; ni < d->n; ni++)
        for (int64_t si = 0; si < d->spatial; si++) {
          int64_t i = sbn_ref_index(d, ni, ci, si);
          ys[r][i] = (sbn_ref_load(xs[r], d->dtype, i) - mu) * is * w + b;
        }
    }
  }
}

void sbn_ref_running(int64_t c, int64_t m, const double* mean, const double* var_unbiased,
                     double momentum, int64_t nbt_before, double* rm, double* rv) {
  if (m == 0) return;
  double f = momentum >= 0.0 ? momentum : 1.0 / (double)(nbt_before + 1);
  for (int64_t ci = 0; ci < c; ci++) {
    rm[ci] = (1.0 - f) * rm[ci] + f * mean[ci];
    rv[ci] = (1.0 - f) * rv[ci] + f * var_unbiased[ci];
  }
}

/* ---- backward --------------------------------------------------------------------- */
/* The gradient reaching the normalization: dy through the activation, from its output
   y, as PyTorch's backward of relu (0 where y <= 0; NaN passes dy) and leaky_relu (dy
   where y > 0, slope * dy elsewhere). */
static double ref_act_grad(int act, double slope, const void* y, sbnDataType_t dt, int64_t i, double dy) {
  if (act == sbnActivationIdentity || y == NULL) return dy;
  double yv = sbn_ref_load(y, dt, i);
  if (act == sbnActivationRelu) return yv <= 0.0 ? 0.0 : dy;
  return yv > 0.0 ? dy : slope * dy;
}

/* The unit roundoff of a dtype's values: 2^-24 fp32, 2^-11 fp16, 2^-8 bf16. */
static double ref_unit(sbnDataType_t dt) {
  return dt == sbnFloat16 ? 0x1p-11 : dt == sbnBFloat16 ? 0x1p-8 : 0x1p-24;
}

/* What a backward takes for x: x itself (xs), or the forward's output y and residual z from
   which the in-place backward recovers x_hat (ys, zs, bias). */
typedef struct {
  const void* const* xs; /* NULL: the in-place backward */
  const void* const* zs; /* in place: NULL or per rank (NULL entries: no z) */
  const float* bias;     /* in place: NULL is 0 */
} ref_bwd_src_t;

/* The backward's term of element i of rank r, channel ci: x - mean from x, whose sums take
   * invstd (*ts = invstd); in place x_hat itself (*ts = 1): x_hat = (act^-1(y) - z - bias) /
   weight, and 0 on a channel below the weight threshold of sbnBackwardEx's policy
   (|weight| < max(SBN_RECOVER_MIN_WEIGHT, u |bias|)), or of invstd 0 (a constant channel
   with eps 0: y is the bias, and the x-based backward's terms are 0 there too). */
static double ref_bwd_term(const ref_bwd_src_t* src, int r, const sbnTensorDesc_t* d, int64_t ci,
                           int64_t i, const void* y, int act, double slope, double w, double mu,
                           double is) {
  if (src->xs) return sbn_ref_load(src->xs[r], d->dtype, i) - mu;
  const double b = src->bias ? (double)src->bias[ci] : 0.0;
  if (fabs(w) < fmax((double)SBN_RECOVER_MIN_WEIGHT, ref_unit(d->dtype) * fabs(b)) || w * is == 0.0)
    return 0.0;
  double a = sbn_ref_load(y, d->dtype, i);
  if (act == sbnActivationLeakyRelu && !(a > 0.0)) a /= slope;
  const double z = src->zs && src->zs[r] ? sbn_ref_load(src->zs[r], d->dtype, i) : 0.0;
  return (a - z - b) / w;
}

/* sbn_ref_backward_ex's formulas on a term t per element (ref_bwd_term) and a per-channel
   scale ts of it: dweight = ts * sum(g t), dx = w invstd (g - mean(g) - t ts^2 mean(g t)). */
static void ref_backward(int nranks, const sbnTensorDesc_t* descs, const ref_bwd_src_t* src,
                         const void* const* ys, const void* const* dys, int act, double slope,
                         const float* weight, const double* mean, const double* invstd,
                         double* const* dxs, double* const* dzs, double* const* dweight_local,
                         double* const* dbias_local, double* dweight_global, double* dbias_global) {
  int64_t c = descs[0].c;
  int64_t total = 0;
  for (int r = 0; r < nranks; r++) total += descs[r].n * descs[r].spatial;
  for (int64_t ci = 0; ci < c; ci++) {
    const double w = weight ? (double)weight[ci] : 1.0;
    double mu = src->xs ? mean[ci] : 0.0, is = invstd[ci], ts = src->xs ? is : 1.0;
    double g_dy = 0.0, g_dyxmu = 0.0;
    for (int r = 0; r < nranks; r++) {
      const sbnTensorDesc_t* d = &descs[r];
      const void* y = ys ? ys[r] : NULL;
      double l_dy = 0.0, l_dyxmu = 0.0;
      for (int64_t ni = 0; ni < d->n; ni++)
        for (int64_t si = 0; si < d->spatial; si++) {
          int64_t i = sbn_ref_index(d, ni, ci, si);
          double g = ref_act_grad(act, slope, y, d->dtype, i, sbn_ref_load(dys[r], d->dtype, i));
          if (dzs && dzs[r]) dzs[r][i] = g;
          l_dy += g;
          l_dyxmu += g * ref_bwd_term(src, r, d, ci, i, y, act, slope, w, mu, is);
        }
      if (dweight_local && dweight_local[r]) dweight_local[r][ci] = l_dyxmu * ts;
      if (dbias_local && dbias_local[r]) dbias_local[r][ci] = l_dy;
      g_dy += l_dy;
      g_dyxmu += l_dyxmu;
    }
    if (dweight_global) dweight_global[ci] = g_dyxmu * ts;
    if (dbias_global) dbias_global[ci] = g_dy;
    if (!dxs || total == 0) continue;
    double mdy = g_dy / (double)total, mdyxmu = g_dyxmu / (double)total;
    for (int r = 0; r < nranks; r++) {
      const sbnTensorDesc_t* d = &descs[r];
      const void* y = ys ? ys[r] : NULL;
      if (!dxs[r]) continue;
      for (int64_t ni = 0; ni < d->n; ni++)
        for (int64_t si = 0; si < d->spatial; si++) {
          int64_t i = sbn_ref_index(d, ni, ci, si);
          double g = ref_act_grad(act, slope, y, d->dtype, i, sbn_ref_load(dys[r], d->dtype, i));
          double xm = ref_bwd_term(src, r, d, ci, i, y, act, slope, w, mu, is);
          dxs[r][i] = w * is * (g - mdy - xm * ts * ts * mdyxmu);
        }
    }
  }
}

void sbn_ref_backward_ex(int nranks, const sbnTensorDesc_t* descs, const void* const* xs,
                         const void* const* ys, const void* const* dys, int act, double slope,
                         const float* weight, const double* mean, const double* invstd,
                         double* const* dxs, double* const* dzs, double* const* dweight_local,
                         double* const* dbias_local, double* dweight_global, double* dbias_global) {
  const ref_bwd_src_t src = {xs, NULL, NULL};
  ref_backward(nranks, descs, &src, ys, dys, act, slope, weight, mean, invstd, dxs, dzs,
               dweight_local, dbias_local, dweight_global, dbias_global);
}

void sbn_ref_backward_inplace(int nranks, const sbnTensorDesc_t* descs, const void* const* ys,
                              const void* const* zs, const void* const* dys, int act, double slope,
                              const float* weight, const float* bias, const double* invstd,
                              double* const* dxs, double* const* dzs, double* const* dweight_local,
                              double* const* dbias_local, double* dweight_global,
                              double* dbias_global) {
  const ref_bwd_src_t src = {NULL, zs, bias};
  ref_backward(nranks, descs, &src, ys, dys, act, slope, weight, NULL, invstd, dxs, dzs,
               dweight_local, dbias_local, dweight_global, dbias_global);
}

void sbn_ref_backward(int nranks, const sbnTensorDesc_t* descs, const void* const* xs,
                      const void* const* dys, const float* weight, const double* mean,
                      const double* invstd, double* const* dxs, double* const* dweight_local,
                      double* const* dbias_local, double* dweight_global,
                      double* dbias_global) {
  sbn_ref_backward_ex(nranks, descs, xs, NULL, dys, sbnActivationIdentity, 0.0, weight, mean, invstd,
                      dxs, NULL, dweight_local, dbias_local, dweight_global, dbias_global);
}

void sbn_ref_epilogue(const sbnTensorDesc_t* d, const void* z, int act, double slope, double* y) {
  int64_t numel = sbn_ref_numel(d);
  for (int64_t i = 0; i < numel; i++) {
    double v = y[i] + (z ? sbn_ref_load(z, d->dtype, i) : 0.0);
    if (act == sbnActivationRelu) v = v > 0.0 ? v : 0.0;
    if (act == sbnActivationLeakyRelu) v = v > 0.0 ? v : slope * v;
    y[i] = v;
  }
}

/* ---- eval-mode forward ------------------------------------------------------------ */
void sbn_ref_inference(const sbnTensorDesc_t* d, const void* x, const float* weight,
                       const float* bias, const float* running_mean, const float* running_var,
                       double eps, double* y) {
  for (int64_t ci = 0; ci < d->c; ci++) {
    double is = 1.0 / sqrt((double)running_var[ci] + eps);
    double w = weight ? (double)weight[ci] : 1.0;
    double b = bias ? (double)bias[ci] : 0.0;
    for (int64_t ni = 0; ni < d->n; ni++)
      for (int64_t si = 0; si < d->spatial; si++) {
        int64_t i = sbn_ref_index(d, ni, ci, si);
        y[i] = (sbn_ref_load(x, d->dtype, i) - (double)running_mean[ci]) * is * w + b;
      }
  }
}
