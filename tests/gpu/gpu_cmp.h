/* gpu_cmp.h — GPU outputs (downloaded into a host mirror team_t, gpu_fixture.h) against
 * the CPU team on the same inputs, and two GPU runs against each other: the tolerances and
 * comparisons shared by test_gpu_team.c and test_nccl_team.c. Define GPU_CMP_WHO (the
 * GPU side's name in failure messages) before including. */
#ifndef SYNCBN_TESTS_GPU_CMP_H_
#define SYNCBN_TESTS_GPU_CMP_H_

#include <math.h>

#include "bn_dtype.h"
#include "gpu_fixture.h"
#include "team_util.h"
#include "unwritten.h"

static const char* dt_name(sbnDataType_t dt) {
  return dt == sbnFloat32 ? "fp32" : dt == sbnFloat16 ? "fp16" : "bf16";
}

#ifndef GPU_CMP_WHO
#define GPU_CMP_WHO "GPU"
#endif

/* Tolerances, GPU team vs CPU team on the same inputs (README: "GPU and CPU teams agree
   to the tolerances below, not bitwise"). Both run bn_math.h's fp32 formulas, products
   unfused, and differ only in the reduction trees (which partials merge in which order).

   Statistics (save_mean, save_invstd, running stats): 1e-5 absolute + 1e-5 relative,
   with save_mean's and running_mean's absolute part scaled by (1 + sd) as check_forward
   does (a Welford/Chan mean is accurate relative to the data's spread, not to |mean|,
   which may be ~0). Each side is already held to 1e-5 against the double reference; an
   fp32 Chan tree over M <= 1e7 elements has relative error ~log2(M) * 6e-8 ~ 1.4e-6 (and
   bn_math carries the mean as hi + lo), so the two trees differ by well under 1e-5. */
#define GC_STAT_ATOL 1e-5
#define GC_STAT_RTOL 1e-5
/* fp32 y, dx and every dtype's dweight/dbias: 1e-4 absolute + 1e-4 relative (DESIGN.md's
   output/gradient tolerance). y and dx are elementwise in the statistics (which differ by
   ~1e-6 relative, see above): their difference is ~1e-6 * |terms| <= 1e-5 for terms up to
   ~10 (6 sd * invstd * |w| + |b|). dweight/dbias are fp32 sums over a rank's (or the
   team's) elements, sum_i |term_i| <= ~1e4 here, with tree error ~1e-7 * sqrt(n) * that
   for random signs, i.e. below 1e-4 + 1e-4 * |sum|. */
#define GC_OUT_ATOL 1e-4
#define GC_OUT_RTOL 1e-4
#define GC_GRAD_ATOL 1e-4
#define GC_GRAD_RTOL 1e-4
/* fp16/bf16 y and dx: both sides compute the value in fp32 (differing by ~1e-6 relative,
   far below the dtype's half-ulp of 2.4e-4 (fp16) / 2e-3 (bf16) relative) and then round
   to the dtype, so they agree exactly or differ by one ulp where the fp32 values straddle
   a rounding boundary. Allowed: 2 ulps of the dtype at max(|gpu|, |cpu|) (1 ulp plus a
   margin of one), plus an absolute 1e-5: near y == 0 the dtype's ulp is tiny (fp16
   subnormals, 6e-8) while the fp32 value carries an absolute error of a few ulps of its
   largest term (~10 -> ~4e-6), which rounding cannot remove. This is 1-2 orders tighter
   than the 2e-3 (fp16) and 1e-2 (bf16) relative that the dtype outputs get against the
   double reference. */
#define GC_HALF_ULPS 2.0
#define GC_HALF_ATOL 1e-5
/* dweight and dbias are fp32 sums of a rank's (local) or the team's (global) terms
   dy*(x - mean)*invstd and dy. Where the terms cancel (|sum| << sum|terms|, the usual case
   for random dy) the rounding error of any fp32 summation scales with sum|terms|, not with
   |sum|: a tree of depth ~log2(n) is off by at most ~log2(n) * u * sum|terms| (u = 2^-24),
   typically far less. DESIGN.md's plain 1e-4 + 1e-4*|ref| ignores that and only holds for
   small per-channel counts: measured on the CPU team, bf16 W=8 C=64 spatial=1000 (9000
   elements per channel) misses it by 1.29x with an error of 0.45 u * sum|terms|. So the
   absolute part gets GRAD_COND_U * u * sum|terms| on top: 8u (a third of the worst case of
   a 24-deep tree, ~18x the measured 0.45u) per side, twice that for GPU vs CPU (two
   independent roundings). A real bug (a dropped rank or term, a wrong mean) is off by
   O(|term|) * sqrt(count), orders of magnitude above this. */
#define GRAD_COND_U 8.0
#define F32_U (1.0 / 16777216.0)

/* Unit in the last place of the dtype at |v| (subnormal spacing below the normals). */
static double dt_ulp(sbnDataType_t dt, double v) {
  int mant = dt == sbnFloat16 ? 10 : dt == sbnBFloat16 ? 7 : 23;
  int emin = dt == sbnFloat16 ? -14 : -126;
  int e = emin;
  v = fabs(v);
  if (v > 0.0) {
    (void)frexp(v, &e); /* v = m * 2^e, m in [0.5, 1) */
    e -= 1;
    if (e < emin) e = emin;
  }
  return ldexp(1.0, e - mant);
}

/* Every element of a GPU output was written: 1, or 0 after a failure that says which were
   not (still GPU_POISON, where the CPU team's value is not that pattern), before any
   comparison of values. */
static int gc_all_written(const char* what, int r, const void* g, const void* c, size_t n,
                          size_t size) {
  char name[128];
  snprintf(name, sizeof name, GPU_CMP_WHO " %s rank %d", what, r);
  if (SBN_REPORT_UNWRITTEN(name, sbn_unwritten(g, c, n, size, GPU_POISON), n, GPU_POISON))
    return 1;
  sbn_test_failures_++;
  sbn_test_cur_failed_++;
  return 0;
}

/* Every output of `what` (OUT_FWD: y, save_mean, save_invstd; OUT_BWD: dx unless
   OPT_DX_NULL, dweight and dbias unless OPT_NO_DWDB) of every rank of the GPU mirror g
   holds no item still all GPU_POISON (the all-ones NaN, which no output of these tests'
   finite inputs is): 1, or 0 after one failure per output naming what was never written.
   For the comparisons against the reference, which come first and know no CPU value. */
static inline int gc_outputs_written(const team_t* g, int what, int opts) {
  int ok = 1;
  const size_t cn = (size_t)g->d[0].c;
  for (int r = 0; r < g->W; r++) {
    const size_t ne = (size_t)sbn_ref_numel(&g->d[r]), es = (size_t)sbn_dtype_size(g->d[r].dtype);
    const struct {
      int on;
      const char* name;
      const void* p;
      size_t n, size;
    } outs[] = {{what & OUT_FWD, "y", g->y[r], ne, es},
                {what & OUT_FWD, "save_mean", g->smean[r], cn, sizeof(float)},
                {what & OUT_FWD, "save_invstd", g->sinv[r], cn, sizeof(float)},
                {(what & OUT_BWD) && !(opts & OPT_DX_NULL), "dx", g->dx[r], ne, es},
                {(what & OUT_BWD) && !(opts & OPT_NO_DWDB), "dweight", g->dw[r], cn, sizeof(float)},
                {(what & OUT_BWD) && !(opts & OPT_NO_DWDB), "dbias", g->db[r], cn, sizeof(float)}};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
      if (outs[i].on && outs[i].p != NULL && outs[i].n > 0)
        ok &= gc_all_written(outs[i].name, r, outs[i].p, NULL, outs[i].n, outs[i].size);
  }
  return ok;
}

/* gpu[i] vs cpu[i]: |g - c| <= atol_i + rtol * |c|, atol_i = atolv ? atolv[i] : atol.
   Prints the worst element. */
static int cmp_f32(const char* what, int r, const float* g, const float* c, size_t n,
                   const double* atolv, double atol, double rtol) {
  if (!gc_all_written(what, r, g, c, n, sizeof(float))) return 0;
  size_t bad = 0, worst = 0;
  double worst_frac = -1.0;
  for (size_t i = 0; i < n; i++) {
    double tol = (atolv ? atolv[i] : atol) + rtol * fabs((double)c[i]);
    double frac = fabs((double)g[i] - (double)c[i]) / tol;
    if (isnan(frac) || isnan((double)g[i]) || isnan((double)c[i])) frac = INFINITY;
    if (frac > 1.0) bad++;
    if (frac > worst_frac) worst_frac = frac, worst = i;
  }
  if (bad) {
    SBN_FAIL_(
        GPU_CMP_WHO " vs CPU team: %s rank %d: %zu of %zu elements out of tolerance; worst [%zu] "
        "gpu %.9g cpu %.9g (%.2fx tolerance)",
        what, r, bad, n, worst, (double)g[worst], (double)c[worst], worst_frac);
    return 0;
  }
  return 1;
}

/* y or dx of one rank, GPU vs CPU team, by dtype (see the tolerances above). */
static int cmp_out(const char* what, int r, sbnDataType_t dt, const void* g, const void* c,
                   int64_t n) {
  if (n == 0) return 1;
  if (dt == sbnFloat32)
    return cmp_f32(what, r, (const float*)g, (const float*)c, (size_t)n, NULL, GC_OUT_ATOL,
                   GC_OUT_RTOL);
  if (!gc_all_written(what, r, g, c, (size_t)n, (size_t)sbn_dtype_size(dt))) return 0;
  int64_t bad = 0, worst = 0;
  double worst_frac = -1.0;
  for (int64_t i = 0; i < n; i++) {
    double gv = sbn_ref_load(g, dt, i), cv = sbn_ref_load(c, dt, i);
    double big = fabs(gv) > fabs(cv) ? fabs(gv) : fabs(cv);
    double tol = GC_HALF_ULPS * dt_ulp(dt, big) + GC_HALF_ATOL;
    double frac = fabs(gv - cv) / tol;
    if (isnan(frac) || isnan(gv) || isnan(cv)) frac = INFINITY;
    if (frac > 1.0) bad++;
    if (frac > worst_frac) worst_frac = frac, worst = i;
  }
  if (bad) {
    SBN_FAIL_(GPU_CMP_WHO " vs CPU team: %s (%s) rank %d: %" PRId64 " of %" PRId64
              " elements beyond 2 ulps; worst [%" PRId64 "] gpu %.9g cpu %.9g (%.2fx tolerance)",
              what, dt_name(dt), r, bad, n, worst, sbn_ref_load(g, dt, worst),
              sbn_ref_load(c, dt, worst), worst_frac);
    return 0;
  }
  return 1;
}

static int64_t team_count(const team_t* t) {
  int64_t m = 0;
  for (int r = 0; r < t->W; r++) m += t->d[r].n * t->d[r].spatial;
  return m;
}

/* Rank r's forward outputs, GPU (g) vs CPU team (c): 1 if within the tolerances above. */
static int cmp_forward_rank(const team_t* g, const team_t* c, int r) {
  int64_t ch = g->d[0].c, m = team_count(g);
  double* atol = dvec(ch);
  for (int64_t i = 0; i < ch; i++)
    atol[i] = GC_STAT_ATOL * (1.0 + (m > 0 ? 1.0 / (double)c->sinv[r][i] : 0.0));
  int ok = cmp_f32("save_mean", r, g->smean[r], c->smean[r], (size_t)ch, atol, 0, GC_STAT_RTOL) &&
           cmp_f32("save_invstd", r, g->sinv[r], c->sinv[r], (size_t)ch, NULL, GC_STAT_ATOL,
                   GC_STAT_RTOL);
  if (ok && g->running) {
    for (int64_t i = 0; i < ch; i++)
      atol[i] = GC_STAT_ATOL * (1.0 + sqrt(fabs((double)c->rv[r][i])));
    ok = cmp_f32("running_mean", r, g->rm[r], c->rm[r], (size_t)ch, atol, 0, GC_STAT_RTOL) &&
         cmp_f32("running_var", r, g->rv[r], c->rv[r], (size_t)ch, NULL, GC_STAT_ATOL,
                 GC_STAT_RTOL);
  }
  if (ok && !g->nbt_null && g->nbt[r] != c->nbt[r]) {
    SBN_FAIL_("rank %d: num_batches_tracked gpu %" PRId64 " cpu %" PRId64, r, g->nbt[r],
              c->nbt[r]);
    ok = 0;
  }
  ok = ok && cmp_out("y", r, g->d[r].dtype, g->y[r], c->y[r], sbn_ref_numel(&g->d[r]));
  free(atol);
  return ok;
}

/* Per-channel sums of |dy*(x - mean)*invstd| (aw) and |dy| (ab), exactly in double: per
   rank (aw[r], ab[r]) and over the team (awg, abg). mean/invstd: each rank's own saved
   statistics (stat_rank < 0), or rank stat_rank's for every rank (a process that
   downloaded only that rank's: the ranks' saved statistics are the same bits). */
static void grad_abs_sums(const team_t* t, int stat_rank, double* const* aw, double* const* ab,
                          double* awg, double* abg) {
  int64_t c = t->d[0].c;
  for (int64_t ci = 0; ci < c; ci++) awg[ci] = abg[ci] = 0.0;
  for (int r = 0; r < t->W; r++) {
    const sbnTensorDesc_t* d = &t->d[r];
    int sr = stat_rank < 0 ? r : stat_rank;
    for (int64_t ci = 0; ci < c; ci++) aw[r][ci] = ab[r][ci] = 0.0;
    for (int64_t ni = 0; ni < d->n; ni++)
      for (int64_t ci = 0; ci < c; ci++)
        for (int64_t si = 0; si < d->spatial; si++) {
          int64_t i = sbn_ref_index(d, ni, ci, si);
          double dyv = sbn_ref_load(t->dy0[r], d->dtype, i);
          double xmu = sbn_ref_load(t->x0[r], d->dtype, i) - (double)t->smean[sr][ci];
          aw[r][ci] += fabs(dyv * xmu * (double)t->sinv[sr][ci]);
          ab[r][ci] += fabs(dyv);
        }
    for (int64_t ci = 0; ci < c; ci++) awg[ci] += aw[r][ci], abg[ci] += ab[r][ci];
  }
}

/* Backward outputs, GPU (g) vs CPU team (c; run with every output and the GPU's saved
   statistics): every rank's (rank < 0), or only rank `rank`'s (a process that downloaded
   only that rank's; the sums of |terms| then use its saved statistics for every rank).
   opts: the outputs not written (OPT_DX_NULL, OPT_NO_DWDB). dweight/dbias: see
   GRAD_COND_U. */
static void cmp_backward(const team_t* g, const team_t* c, const sbnParams_t* p, int opts,
                         int rank) {
  int64_t ch = g->d[0].c;
  int global = p->grad_mode == sbnGradGlobal;
  double *aw[MAXW] = {0}, *ab[MAXW] = {0}, *awg = dvec(ch), *abg = dvec(ch), *atol = dvec(ch);
  for (int r = 0; r < g->W; r++) aw[r] = dvec(ch), ab[r] = dvec(ch);
  if (!(opts & OPT_NO_DWDB)) grad_abs_sums(g, rank, aw, ab, awg, abg);
  for (int r = rank < 0 ? 0 : rank; r < (rank < 0 ? g->W : rank + 1); r++) {
    if (!(opts & OPT_DX_NULL) &&
        !cmp_out("dx", r, g->d[r].dtype, g->dx[r], c->dx[r], sbn_ref_numel(&g->d[r])))
      break;
    if (opts & OPT_NO_DWDB) continue;
    for (int64_t i = 0; i < ch; i++)
      atol[i] = GC_GRAD_ATOL + 2.0 * GRAD_COND_U * F32_U * (global ? awg[i] : aw[r][i]);
    if (!cmp_f32("dweight", r, g->dw[r], c->dw[r], (size_t)ch, atol, 0, GC_GRAD_RTOL)) break;
    for (int64_t i = 0; i < ch; i++)
      atol[i] = GC_GRAD_ATOL + 2.0 * GRAD_COND_U * F32_U * (global ? abg[i] : ab[r][i]);
    if (!cmp_f32("dbias", r, g->db[r], c->db[r], (size_t)ch, atol, 0, GC_GRAD_RTOL)) break;
  }
  for (int r = 0; r < g->W; r++) free(aw[r]), free(ab[r]);
  free(awg), free(abg), free(atol);
}

/* Rank r's outputs of two GPU runs a and b, bitwise: those of `what` (OUT_FWD, OUT_BWD)
   that were written (opts: OPT_DX_NULL, OPT_NO_DWDB). 1 if equal; else fails naming the
   first output that differs, after `names` (the two runs). */
static int same_rank(const team_t* a, const team_t* b, int r, int what, int opts,
                     const char* names) {
  size_t cb = chan_bytes(a), tb = team_bytes(a, r);
  const char* bad = NULL;
  if (what & OUT_FWD) {
    if (tb && memcmp(a->y[r], b->y[r], tb))
      bad = "y";
    else if (memcmp(a->smean[r], b->smean[r], cb))
      bad = "save_mean";
    else if (memcmp(a->sinv[r], b->sinv[r], cb))
      bad = "save_invstd";
    else if (a->running && memcmp(a->rm[r], b->rm[r], cb))
      bad = "running_mean";
    else if (a->running && memcmp(a->rv[r], b->rv[r], cb))
      bad = "running_var";
    else if (!a->nbt_null && a->nbt[r] != b->nbt[r]) {
      SBN_FAIL_("%s: rank %d's num_batches_tracked: %" PRId64 " vs %" PRId64, names, r, a->nbt[r],
                b->nbt[r]);
      return 0;
    }
  }
  if (!bad && (what & OUT_BWD)) {
    if (tb && !(opts & OPT_DX_NULL) && memcmp(a->dx[r], b->dx[r], tb))
      bad = "dx";
    else if (!(opts & OPT_NO_DWDB) && memcmp(a->dw[r], b->dw[r], cb))
      bad = "dweight";
    else if (!(opts & OPT_NO_DWDB) && memcmp(a->db[r], b->db[r], cb))
      bad = "dbias";
  }
  if (bad) SBN_FAIL_("%s: rank %d's %s differs (bitwise)", names, r, bad);
  return bad == NULL;
}

#endif /* SYNCBN_TESTS_GPU_CMP_H_ */
