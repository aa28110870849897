/* check.c — checking (#wrong): every output of a row against the double-precision reference
 * (reference/sbn_ref.h) at the tolerances of bench.h, and the bitwise guarantees (ranks
 * agree; NCHW == NHWC on the CPU team; the nccl path has the coop path's bits). */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "sbn_ref.h"

/* The library's dweight and dbias are held to the rounding bound alone (sum_tolerance). */
const bench_check_t kCheckLibrary = {TOL_STAT, TOL_F32, TOL_F16, TOL_BF16, 0.0, 1};
/* cuDNN rows (a baseline this project does not own) are checked on y, dx, save_mean,
   save_invstd, dweight and dbias, not on the running statistics (cuDNN's running-variance
   convention and update are its own business). Tolerance: 10x the library's for the
   statistics and the fp32 values (1e-4 and 1e-3): cuDNN's reduction order and variance
   algorithm are not ours (one-pass sums, atomics, or SPATIAL_PERSISTENT's scaled integer
   reduction), so our bound is not its contract; the check is there to prove the timed call
   did the right work (descriptor, layout, channel order, scale and bias), and any such
   mistake gives errors of order 1. fp16/bf16 outputs keep 1e-2 (their rounding dominates).
   dweight and dbias: 1e-3 on top of the library's rounding bound (cuDNN's order is not
   ours, so the bound alone is not its contract). */
const bench_check_t kCheckCudnn = {TOL_CUDNN_STAT, TOL_CUDNN_F32, TOL_CUDNN_HALF,
                                   TOL_CUDNN_HALF, TOL_CUDNN_F32, 0};

/* gamma(k) = k*u / (1 - k*u): a bound of the relative error of k roundings (Higham,
   "Accuracy and Stability of Numerical Algorithms", 2nd ed., lemma 3.1). */
static double gamma_k(double k, double u) {
  return k * u / (1.0 - k * u);
}

/* The tolerance of a per-channel gradient sum (dweight or dbias) of `terms` terms whose
   absolute values add up to abs_sum, summed through at most `depth` additions.

   The bound. The library computes dweight = fl(fl(sum of fl(dy * fl(x - mean)))) * invstd)
   and dbias = fl(sum of dy) in fp32 (u = 2^-24; x and dy widened exactly from any dtype;
   mean and invstd the fp32 save_mean and save_invstd it was given). Any evaluation order
   made of pairwise and sequential partial sums is a binary tree; a term that reaches the
   root through d additions comes out multiplied by at most d factors (1 + e), |e| <= u, so
   |computed - exact| <= gamma(d) * sum |term| whatever the order (Higham, section 4.2),
   d = the tree's depth. dweight's terms also carry x - mean, the product and the final
   * invstd: gamma(depth + 3) * sum |dy * (x - mean) * invstd|. dbias: gamma(depth) *
   sum |dy|. The reference takes the same fp32 mean and invstd (the row's own saved
   statistics, widened), so the statistics' rounding is not counted against the sums (as
   PyTorch's tests build theirs); its own error, a sequential double sum of exact products,
   is at most gamma_53(terms + 2) * sum |term| and is added.

   The depth, BENCH_SUM_DEPTH = 128 additions for a rank's sum, W more for the team's (the
   ranks' partials are merged one after the other, CPU and GPU alike). It covers:
   - the CPU team (src/cpu/cpu_reduce.c): 32-element sequential chunks, then a binary merge
     tree: at most 32 + ceil(log2(count / 32)) + 1 <= 59 for any int32 count;
   - the GPU kernels (kernels/coop_vec.cuh, coop_exchange.cuh) once a thread's run over its
     positions is a compensated sum (the kernel fix of the same issue; the run then counts as
     ~3 additions): <= 3 + 5 (warp shuffles) + 7 (the block's 8 warps in order) + ceil(P/8)
     + 7 (the P <= 264 slices: each warp its share in order, then the warps) <= 55.
   It does not cover, in the worst case where every rounding error has the same sign, the
   plain fp32 runs of a thread as the stream/onchip kernels had them (numel * W / (2048 * G)
   + 8 additions: ~140 on S1 at W = 8, ~600 on S8 at W = 8 with G = 33 blocks per rank on
   132 SMs) or the legacy kernel's (runs of 32 merged in order: ~120-230 at W = 8); their
   actual errors are orders below the bound (bench/notes/tolerances.md: S1 at W = 8).
   Strictness: on a channel whose terms do not cancel (sum |term| = |sum|), the bound is
   gamma(139) = 8.3e-6 relative at W = 8, so a sum off by 1e-4 relative is caught; where the
   terms cancel (random dy: sum |term| ~ 0.6 * count, |sum| ~ sqrt(count)) it is what fp32
   arithmetic allows, and a dropped or doubled rank, slice or channel is still off by
   ~sqrt(count / W), far beyond it. */
const char* const kSumsFormula =
    "gamma(D + 3) * sum|dy*(x-mean)*invstd| (dweight), gamma(D) * sum|dy| (dbias), gamma(k) = "
    "k*u/(1-k*u), u = 2^-24, D = 128 additions for a rank's sum, + W for the team's; the "
    "backward's reference (dx, dweight, dbias) from the row's own save_mean and save_invstd; "
    "the in-place epilogues: gamma(D + 10) * sum|g * (|act^-1(y)| + |z| + |bias|) / weight| "
    "(dweight), gamma(D + 1) * sum|g| (dbias), the reference from the row's own y (and z) and "
    "save_invstd";

static double sum_tolerance(double abs_sum, int64_t terms, int depth, int extra_roundings,
                            double atol_rtol, double ref) {
  const double u = 1.0 / 16777216.0, u53 = 1.0 / 9007199254740992.0;
  return (gamma_k(depth + extra_roundings, u) + gamma_k((double)terms + 2, u53)) * abs_sum +
         atol_rtol * (1.0 + fabs(ref));
}

/* What the in-place backward's recovery of x_hat from y (and z) rounds relative to, for
   sum_tolerance: (|act^-1(y)| + |z| + |bias|) / |weight| (leaky ReLU's inverse; 0 at a weight
   of 0, whose x_hat is 0 by the policy). */
static double recover_scale(double y, double slope, double z, float bias, float weight) {
  if (weight == 0.0f) return 0.0;
  return (fabs(y > 0.0 ? y : y / slope) + fabs(z) + fabs((double)bias)) / fabs((double)weight);
}

static void check_value(bench_row_t* row, const char* what, int rank, int64_t ci, int64_t i,
                        double got, double ref, double tol_abs, double tol_rel) {
  double err = fabs(got - ref);
  double tol = tol_abs + tol_rel * fabs(ref);
  double used = err / tol;
  row->checked++;
  if (!(err <= tol)) {
    if (isnan(used)) used = INFINITY;
    if (row->wrong++ < BENCH_MAX_WRONG_PRINTED) {
      char elem[32] = "", label[96];
      if (i >= 0) snprintf(elem, sizeof elem, " element %" PRId64, i);
      fprintf(stderr,
              "# WRONG %s: %s rank %d channel %" PRId64
              "%s: got %.9g ref %.9g "
              "(|diff| %.3g > tol %.3g)\n",
              row_label(row, label, sizeof label), what, rank, ci, elem, got, ref, err, tol);
    }
  }
  if (used > row->worst) {
    row->worst = used;
    if (i >= 0)
      snprintf(row->worst_what, sizeof row->worst_what, "%s r%d c%" PRId64 " i%" PRId64, what, rank,
               ci, i);
    else
      snprintf(row->worst_what, sizeof row->worst_what, "%s r%d c%" PRId64, what, rank, ci);
  }
}

static void check_bitwise(bench_row_t* row, const char* what, int64_t count, const void* got,
                          const void* want, size_t esize) {
  char label[96];
  for (int64_t i = 0; i < count; i++) {
    row->checked++;
    if (memcmp((const char*)got + (size_t)i * esize, (const char*)want + (size_t)i * esize,
               esize) != 0 &&
        row->wrong++ < BENCH_MAX_WRONG_PRINTED)
      fprintf(stderr, "# WRONG %s: %s differs bitwise at %" PRId64 "\n",
              row_label(row, label, sizeof label), what, i);
  }
}

void keep_free(bench_layout_keep_t* k) {
  free(k->save_mean);
  free(k->y);
  memset(k, 0, sizeof *k);
}

/* Copies channels chs[0..k) of tensor p (desc d) into out, packed (N, k, spatial). */
static void pack_channels(void* out, const void* p, const sbnTensorDesc_t* d, const int64_t* chs,
                          int64_t k) {
  size_t es = dtype_size(d->dtype);
  for (int64_t ni = 0; ni < d->n; ni++)
    for (int64_t j = 0; j < k; j++)
      for (int64_t si = 0; si < d->spatial; si++)
        memcpy((char*)out + (size_t)((ni * k + j) * d->spatial + si) * es,
               (const char*)p + (size_t)sbn_ref_index(d, ni, chs[j], si) * es, es);
}

/* Checks the outputs of the last calls (`calls` forwards, then as many backwards, on the
   same inputs; b: host memory) against sbn_ref on kmax channels spread over C (first and
   last included): the forward against the reference's statistics, the backward against a
   reference from the row's saved ones, dweight and dbias to sum_tolerance; and the bitwise
   guarantees: every rank has the same statistics (and,
   with sbnGradGlobal, the same dweight/dbias, the team sums); with keep != NULL (CPU team)
   the NHWC row of a shape x dtype has the bits of its NCHW row. The backward ran with
   grad_mode. `how`: the tolerances, and whether the running stats and num_batches_tracked
   are compared. Shared by both modes (GPU results are copied to the host first). Out of
   memory sets row->error. */
double check_bytes(int W, const sbnTensorDesc_t* d, int kmax, int keep) {
  const double k = (kmax <= 0 || kmax >= d->c) ? (double)d->c : (double)kmax;
  const double pn = (double)d->n * k * (double)d->spatial, es = (double)dtype_size(d->dtype);
  /* per rank: the packed x and dy, the reference's y and dx (doubles), its dweight and dbias;
     then the reference's statistics, the channel list and the packed affine parameters */
  double b = W * (2.0 * pn * es + 2.0 * pn * 8.0 + 2.0 * k * 8.0) +
             k * ((9.0 + 2.0 * (W + 1)) * 8 + 8 + 2 * 4);
  if (keep) b += 4.0 * (double)d->c * sizeof(float) + 2.0 * pn * es;
  return b;
}

void check_row(bench_row_t* row, const bench_team_bufs_t* b, int calls, int kmax,
               bench_layout_keep_t* keep, sbnGradMode_t grad_mode, const bench_check_t* how) {
  const sbnTensorDesc_t* d = &b->desc;
  const int W = b->W;
  const int64_t C = d->c, S = d->spatial, n = d->n;
  const int64_t k = (kmax <= 0 || kmax >= C) ? C : kmax;
  const size_t es = dtype_size(d->dtype);
  const double tol_out = bench_tol_out(how, d->dtype);
  const int64_t pn = n * k * S; /* packed elements per rank */
  const sbnParams_t params = SBN_PARAMS_DEFAULT;
  int ok = 1;

  int64_t* chs = malloc((size_t)k * sizeof *chs);
  float* wk = malloc((size_t)k * 2 * sizeof(float));
  /* mean, invstd, varu, rm, rv, team dweight, team dbias, the row's mean and invstd, then
     the sums of |term| of dweight and of dbias, [W + 1][k] each */
  double* stat = malloc((size_t)k * (9 + 2 * ((size_t)W + 1)) * sizeof(double));
  /* --epilogue (relu; add-relu: z and dz): y = relu(bn(x) + z), the backward's mask from the
     row's own y (as the ops take it), dz = relu'(y) dy. The in-place epilogues: leaky ReLU,
     and the backward's reference is the in-place backward's definition on the row's own y
     (and z): x_hat = (act^-1(y) - z - bias) / weight in double, where the library recovers it
     in fp32 (sbn_ref_backward_inplace); its accuracy against the x-based backward is the
     tests' (bench/notes/tolerances.md), not the bench's */
  const int epi = b->epilogue != BENCH_EPI_NONE, add = epi_has_z(b->epilogue),
            inplace = epi_inplace(b->epilogue);
  const int act = inplace ? sbnActivationLeakyRelu : sbnActivationRelu;
  const double slope = inplace ? (double)BENCH_LEAKY_SLOPE : 0.0;
  void** xs = calloc((size_t)W * 4, sizeof(void*));         /* x, dy, z, y packed */
  double** outs = calloc((size_t)W * 5, sizeof(double*)); /* y, dx, dweight, dbias, dz */
  sbnTensorDesc_t* descs = malloc((size_t)W * sizeof *descs);
  ok = chs && wk && stat && xs && outs && descs;
  for (int r = 0; ok && r < W; r++) {
    ok = (xs[r] = bmalloc((size_t)pn * es)) && (xs[W + r] = bmalloc((size_t)pn * es)) &&
         (outs[r] = bmalloc((size_t)pn * sizeof(double))) &&
         (outs[W + r] = bmalloc((size_t)pn * sizeof(double))) &&
         (outs[2 * W + r] = malloc((size_t)k * sizeof(double))) &&
         (outs[3 * W + r] = malloc((size_t)k * sizeof(double)));
    if (ok && epi)
      ok = (!add || (xs[2 * W + r] = bmalloc((size_t)pn * es))) && (xs[3 * W + r] = bmalloc((size_t)pn * es)) &&
           (!add || (outs[4 * W + r] = bmalloc((size_t)pn * sizeof(double))));
  }
  if (!ok) {
    snprintf(row->error, sizeof row->error, "out of memory for the check");
    goto done;
  }
  for (int64_t j = 0; j < k; j++) chs[j] = k == 1 ? 0 : j * (C - 1) / (k - 1);
  float *wk_w = wk, *wk_b = wk + k;
  for (int64_t j = 0; j < k; j++) {
    wk_w[j] = b->weight[chs[j]];
    wk_b[j] = b->bias[chs[j]];
  }
  for (int r = 0; r < W; r++) {
    descs[r] = *d;
    descs[r].layout = sbnLayoutNCHW;
    descs[r].c = k;
    pack_channels(xs[r], b->x[r], d, chs, k);
    pack_channels(xs[W + r], b->dy[r], d, chs, k);
    if (add) pack_channels(xs[2 * W + r], b->z[r], d, chs, k);
    if (epi) pack_channels(xs[3 * W + r], b->y[r], d, chs, k);
  }
  double *mean = stat, *invstd = stat + k, *varu = stat + 2 * k, *rm = stat + 3 * k,
         *rv = stat + 4 * k, *gdw = stat + 5 * k, *gdb = stat + 6 * k;
  double *lmean = stat + 7 * k, *linvstd = stat + 8 * k;           /* the row's own, widened */
  double *absw = stat + 9 * k, *absb = absw + (size_t)(W + 1) * k; /* [W + 1][k]: ranks, team */
  int64_t m = 0;
  sbn_ref_forward(W, descs, (const void* const*)xs, wk_w, wk_b, params.eps, mean, invstd, varu, &m,
                  outs);
  for (int r = 0; epi && r < W; r++)
    sbn_ref_epilogue(&descs[r], xs[2 * W + r], act, slope, outs[r]);
  for (int64_t j = 0; j < k; j++) {
    rm[j] = 0.0;
    rv[j] = 1.0;
  }
  for (int call = 0; call < calls; call++)
    sbn_ref_running(k, m, mean, varu, params.momentum, call, rm, rv);
  /* The backward's reference from the statistics the backward was given, the row's own
     (rank 0's: the ranks' bits are compared below; the forward's check holds them to the
     reference's): the library can only use the fp32 save_mean, whose rounding (half an ulp
     of the mean) moves dweight by sum(dy) * invstd * that, and dx with it. */
  for (int64_t j = 0; j < k; j++) {
    lmean[j] = b->save_mean[0][chs[j]];
    linvstd[j] = b->save_invstd[0][chs[j]];
  }
  if (inplace)
    sbn_ref_backward_inplace(
        W, descs, (const void* const*)(xs + 3 * W), add ? (const void* const*)(xs + 2 * W) : NULL,
        (const void* const*)(xs + W), act, slope, wk_w, wk_b, linvstd, outs + W,
        add ? outs + 4 * W : NULL, outs + 2 * W, outs + 3 * W, gdw, gdb);
  else if (epi)
    sbn_ref_backward_ex(W, descs, (const void* const*)xs, (const void* const*)(xs + 3 * W),
                        (const void* const*)(xs + W), act, slope, wk_w, lmean, linvstd, outs + W,
                        add ? outs + 4 * W : NULL, outs + 2 * W, outs + 3 * W, gdw, gdb);
  else
    sbn_ref_backward(W, descs, (const void* const*)xs, (const void* const*)(xs + W), wk_w, lmean,
                     linvstd, outs + W, outs + 2 * W, outs + 3 * W, gdw, gdb);
  /* sum |dy * (x - mean) * invstd| and sum |dy| per rank and channel, and over the team (dy:
     g = dy act'(y) after an activation); the in-place backward's terms g x_hat, whose
     recovery's roundings are relative to |act^-1(y)| + |z| + |bias| over |weight|: those */
  for (int64_t q = 0; q < (W + 1) * k; q++) absw[q] = absb[q] = 0.0;
  for (int r = 0; r < W; r++)
    for (int64_t ni = 0; ni < n; ni++)
      for (int64_t j = 0; j < k; j++)
        for (int64_t si = 0; si < S; si++) {
          const int64_t pi = (ni * k + j) * S + si;
          double dyv = sbn_ref_load(xs[W + r], d->dtype, pi);
          const double yv = epi ? sbn_ref_load(xs[3 * W + r], d->dtype, pi) : 0.0;
          if (epi) dyv = yv > 0.0 ? dyv : slope * dyv; /* g */
          const double term =
              inplace
                  ? recover_scale(yv, slope, add ? sbn_ref_load(xs[2 * W + r], d->dtype, pi) : 0.0,
                                  wk_b[j], wk_w[j])
                  : (sbn_ref_load(xs[r], d->dtype, pi) - lmean[j]) * linvstd[j];
          absw[r * k + j] += fabs(dyv * term);
          absb[r * k + j] += fabs(dyv);
        }
  for (int r = 0; r < W; r++)
    for (int64_t j = 0; j < k; j++) {
      absw[W * k + j] += absw[r * k + j];
      absb[W * k + j] += absb[r * k + j];
    }
  const int global = grad_mode == sbnGradGlobal;
  const int depth = BENCH_SUM_DEPTH + (global ? W : 0);
  const int64_t terms = global ? m : n * S;

  for (int r = 0; r < W; r++) {
    for (int64_t j = 0; j < k; j++) {
      int64_t ci = chs[j];
      check_value(row, "save_mean", r, ci, -1, b->save_mean[r][ci], mean[j], how->stat, how->stat);
      check_value(row, "save_invstd", r, ci, -1, b->save_invstd[r][ci], invstd[j], how->stat,
                  how->stat);
      if (how->running) {
        check_value(row, "running_mean", r, ci, -1, b->rm[r][ci], rm[j], how->stat, how->stat);
        check_value(row, "running_var", r, ci, -1, b->rv[r][ci], rv[j], how->stat, how->stat);
      }
      const int64_t a = (global ? W : r) * k + j;
      const double rw = global ? gdw[j] : outs[2 * W + r][j];
      const double rb = global ? gdb[j] : outs[3 * W + r][j];
      /* the roundings of a term: x - mean, the product, * invstd; in place (bn_math.h
         sbn_xmu_from_y, sbn_recover_rcp), the recovery's y * (1 / slope) (two), - z,
         - bias, * 1 / (weight * invstd) (three), leaky's g = slope * dy, the product and
         * invstd: 10. dbias: leaky's g, one (ReLU's g is dy or 0, exact) */
      check_value(row, "dweight", r, ci, -1, b->dweight[r][ci], rw,
                  sum_tolerance(absw[a], terms, depth, inplace ? 10 : 3, how->sums, rw), 0.0);
      check_value(row, "dbias", r, ci, -1, b->dbias[r][ci], rb,
                  sum_tolerance(absb[a], terms, depth, inplace ? 1 : 0, how->sums, rb), 0.0);
      for (int64_t ni = 0; ni < n; ni++)
        for (int64_t si = 0; si < S; si++) {
          int64_t i = sbn_ref_index(d, ni, ci, si), pi = (ni * k + j) * S + si;
          check_value(row, "y", r, ci, i, sbn_ref_load(b->y[r], d->dtype, i), outs[r][pi], tol_out,
                      tol_out);
          check_value(row, "dx", r, ci, i, sbn_ref_load(b->dx[r], d->dtype, i), outs[W + r][pi],
                      tol_out, tol_out);
          if (add)
            check_value(row, "dz", r, ci, i, sbn_ref_load(b->dz[r], d->dtype, i), outs[4 * W + r][pi], tol_out,
                        tol_out);
        }
    }
    if (how->running) {
      row->checked++;
      if (b->nbt[r] != calls && row->wrong++ < BENCH_MAX_WRONG_PRINTED) {
        char label[96];
        fprintf(stderr, "# WRONG %s: rank %d num_batches_tracked %" PRId64 ", expected %d\n",
                row_label(row, label, sizeof label), r, b->nbt[r], calls);
      }
    }
    /* Every rank holds bitwise-identical statistics. */
    if (r > 0) {
      check_bitwise(row, "save_mean (rank vs rank 0)", C, b->save_mean[r], b->save_mean[0], 4);
      check_bitwise(row, "save_invstd (rank vs rank 0)", C, b->save_invstd[r], b->save_invstd[0],
                    4);
      check_bitwise(row, "running_mean (rank vs rank 0)", C, b->rm[r], b->rm[0], 4);
      check_bitwise(row, "running_var (rank vs rank 0)", C, b->rv[r], b->rv[0], 4);
      if (global) {
        check_bitwise(row, "dweight (rank vs rank 0)", C, b->dweight[r], b->dweight[0], 4);
        check_bitwise(row, "dbias (rank vs rank 0)", C, b->dbias[r], b->dbias[0], 4);
      }
    }
  }

  /* NCHW and NHWC of the same data: the same bits. The NCHW row keeps, the NHWC row compares. */
  if (!keep) goto done;
  if (keep->valid && keep->shape == row->shape && keep->dtype == d->dtype && keep->c == C &&
      keep->packed_numel == pn && d->layout == sbnLayoutNHWC) {
    check_bitwise(row, "save_mean (NHWC vs NCHW)", C, b->save_mean[0], keep->save_mean, 4);
    check_bitwise(row, "save_invstd (NHWC vs NCHW)", C, b->save_invstd[0], keep->save_invstd, 4);
    check_bitwise(row, "dweight (NHWC vs NCHW)", C, b->dweight[0], keep->dweight, 4);
    check_bitwise(row, "dbias (NHWC vs NCHW)", C, b->dbias[0], keep->dbias, 4);
    pack_channels(xs[0], b->y[0], d, chs, k);
    check_bitwise(row, "y (NHWC vs NCHW)", pn, xs[0], keep->y, es);
    pack_channels(xs[0], b->dx[0], d, chs, k);
    check_bitwise(row, "dx (NHWC vs NCHW)", pn, xs[0], keep->dx, es);
  }
  keep_free(keep);
  if (d->layout == sbnLayoutNCHW) {
    size_t cb = (size_t)C * sizeof(float);
    keep->save_mean = malloc(cb * 4);
    keep->y = malloc((size_t)pn * es * 2);
    if (keep->save_mean && keep->y) {
      keep->valid = 1;
      keep->shape = row->shape;
      keep->dtype = d->dtype;
      keep->c = C;
      keep->packed_numel = pn;
      keep->save_invstd = keep->save_mean + C;
      keep->dweight = keep->save_mean + 2 * C;
      keep->dbias = keep->save_mean + 3 * C;
      keep->dx = keep->y + (size_t)pn * es;
      memcpy(keep->save_mean, b->save_mean[0], cb);
      memcpy(keep->save_invstd, b->save_invstd[0], cb);
      memcpy(keep->dweight, b->dweight[0], cb);
      memcpy(keep->dbias, b->dbias[0], cb);
      pack_channels(keep->y, b->y[0], d, chs, k);
      pack_channels(keep->dx, b->dx[0], d, chs, k);
    } else {
      keep_free(keep);
    }
  }

done:
  for (int r = 0; xs && outs && r < W; r++) {
    for (int q = 0; q < 4; q++) free(xs[q * W + r]);
    for (int q = 0; q < 5; q++) free(outs[q * W + r]);
  }
  free(xs);
  free(outs);
  free(descs);
  free(stat);
  free(wk);
  free(chs);
}

static const char* const kDigestNames[DIG_COUNT] = {
    "y",           "dx",      "save_mean", "save_invstd",        "running_mean",
    "running_var", "dweight", "dbias",     "num_batches_tracked", "dz"};

/* Four independent splitmix64 chains over 8-byte words (one chain would be latency-bound). */
static uint64_t digest_bytes(const void* p, size_t bytes) {
  const unsigned char* b = p;
  uint64_t h[4] = {1, 2, 3, 4};
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    for (int k = 0; k < 4; k++) {
      uint64_t w;
      memcpy(&w, b + i + 8 * (size_t)k, 8);
      h[k] = splitmix64(h[k] ^ w);
    }
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h[0] = splitmix64(h[0] ^ w);
  }
  uint64_t tail = 0;
  for (; i < bytes; i++) tail = tail << 8 | b[i];
  return splitmix64(
      h[0] ^ splitmix64(h[1] ^ splitmix64(h[2] ^ splitmix64(h[3] ^ tail ^ (uint64_t)bytes))));
}

void digest_team(bench_digest_t* dg, const bench_team_bufs_t* b) {
  const sbnTensorDesc_t* d = &b->desc;
  const size_t bytes = tensor_bytes(d);
  const size_t cbytes = (size_t)d->c * sizeof(float);
  for (int r = 0; r < b->W; r++) {
    dg->d[r][DIG_Y] = digest_bytes(b->y[r], bytes);
    dg->d[r][DIG_DX] = digest_bytes(b->dx[r], bytes);
    dg->d[r][DIG_SAVE_MEAN] = digest_bytes(b->save_mean[r], cbytes);
    dg->d[r][DIG_SAVE_INVSTD] = digest_bytes(b->save_invstd[r], cbytes);
    dg->d[r][DIG_RM] = digest_bytes(b->rm[r], cbytes);
    dg->d[r][DIG_RV] = digest_bytes(b->rv[r], cbytes);
    dg->d[r][DIG_DWEIGHT] = digest_bytes(b->dweight[r], cbytes);
    dg->d[r][DIG_DBIAS] = digest_bytes(b->dbias[r], cbytes);
    dg->d[r][DIG_NBT] = digest_bytes(&b->nbt[r], sizeof b->nbt[r]);
    /* dz where the op writes it (add-relu; the relu split path's g is not an output) */
    dg->d[r][DIG_DZ] = epi_has_z(b->epilogue) ? digest_bytes(b->dz[r], bytes) : 0;
  }
  dg->W = b->W;
  dg->valid = 1;
}

/* Every output of this row's check run (b) against the digests of the coop row's: the
   library promises the nccl path the same bits. Whole buffers: each adds its element count
   to `checked`, and one `wrong` when its bits differ. */
void digest_compare(bench_row_t* row, const bench_digest_t* ref, const bench_team_bufs_t* b) {
  bench_digest_t got;
  digest_team(&got, b);
  const int64_t numel = b->desc.n * b->desc.c * b->desc.spatial;
  char label[96];
  for (int r = 0; r < b->W; r++)
    for (int k = 0; k < DIG_COUNT; k++) {
      if (k == DIG_DZ && !epi_has_z(b->epilogue)) continue; /* no dz */
      row->checked += k <= DIG_DX || k == DIG_DZ ? numel : k == DIG_NBT ? 1 : b->desc.c;
      if (got.d[r][k] != ref->d[r][k] && row->wrong++ < BENCH_MAX_WRONG_PRINTED)
        fprintf(stderr,
                "# WRONG %s: %s of rank %d differs bitwise from the coop row's (same inputs; "
                "the two paths must give the same bits)\n",
                row_label(row, label, sizeof label), kDigestNames[k], r);
    }
}

/* An inference row: rank 0's y after one call against sbn_ref_inference on the checked
   channels (packed, as check_row packs them), from the running statistics infer_stats_fill
   gives (not the buffers': a call that wrote into them would be checked against what it
   wrote), and the buffers' running statistics bitwise those (the call only reads them). */
void check_inference(bench_row_t* row, const bench_team_bufs_t* b, int kmax, const bench_check_t* how) {
  const sbnTensorDesc_t* d = &b->desc;
  const int64_t C = d->c, S = d->spatial, n = d->n;
  const int64_t k = (kmax <= 0 || kmax >= C) ? C : kmax;
  const size_t es = dtype_size(d->dtype);
  const double tol = bench_tol_out(how, d->dtype);
  const int64_t pn = n * k * S;
  const sbnParams_t params = SBN_PARAMS_DEFAULT;
  int64_t* chs = malloc((size_t)k * sizeof *chs);
  float* per = malloc((size_t)(2 * C + 4 * k) * sizeof(float)); /* rm, rv [C]; w, b, rm, rv [k] */
  void* xp = bmalloc((size_t)pn * es);
  double* ref = bmalloc((size_t)pn * sizeof(double));
  if (!chs || !per || !xp || !ref) {
    snprintf(row->error, sizeof row->error, "out of memory for the check");
    goto done;
  }
  float *rm = per, *rv = per + C, *wk = per + 2 * C, *bk = wk + k, *rmk = bk + k, *rvk = rmk + k;
  infer_stats_fill(rm, rv, C);
  for (int64_t j = 0; j < k; j++) {
    chs[j] = k == 1 ? 0 : j * (C - 1) / (k - 1);
    wk[j] = b->weight[chs[j]];
    bk[j] = b->bias[chs[j]];
    rmk[j] = rm[chs[j]];
    rvk[j] = rv[chs[j]];
  }
  sbnTensorDesc_t pd = *d; /* the packed channels, NCHW */
  pd.layout = sbnLayoutNCHW;
  pd.c = k;
  pack_channels(xp, b->x[0], d, chs, k);
  sbn_ref_inference(&pd, xp, wk, bk, rmk, rvk, params.eps, ref);
  for (int64_t ni = 0; ni < n; ni++)
    for (int64_t j = 0; j < k; j++)
      for (int64_t si = 0; si < S; si++) {
        const int64_t i = sbn_ref_index(d, ni, chs[j], si), pi = (ni * k + j) * S + si;
        check_value(row, "y", 0, chs[j], i, sbn_ref_load(b->y[0], d->dtype, i), ref[pi], tol, tol);
      }
  check_bitwise(row, "running_mean (read only)", C, b->rm[0], rm, 4);
  check_bitwise(row, "running_var (read only)", C, b->rv[0], rv, 4);
done:
  free(ref);
  free(xp);
  free(per);
  free(chs);
}
