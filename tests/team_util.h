/* team_util.h — helpers shared by test_forward.c and test_backward.c: a CPU team of W
 * ranks with per-rank tensors, forward/backward driven in one group or one thread per
 * rank, and comparison with the double-precision reference (sbn_ref.h).
 *
 * Helpers that assert are void; callers follow them with CHECK_() to stop the test.
 */
#ifndef SYNCBN_TESTS_TEAM_UTIL_H_
#define SYNCBN_TESTS_TEAM_UTIL_H_

#include <pthread.h>

#include "bn_dtype.h"
#include "bn_math.h"
#include "harness.h"
#include "sbn_ref.h"

#define MAXW 8
#define CHECK_()                          \
  do {                                    \
    if (sbn_test_cur_failed_) return;     \
  } while (0)

/* ---- comms: one CPU team per size, created once --------------------------------------- */
static sbnComm_t g_comms[MAXW + 1][MAXW];
static inline sbnComm_t* team_comms(int W) {
  if (!g_comms[W][0]) {
    if (sbnCommInitCpu(g_comms[W], W, NULL) != sbnSuccess) {
      fprintf(stderr, "sbnCommInitCpu(%d) failed: %s\n", W, sbnGetLastError(NULL));
      exit(1);
    }
  }
  return g_comms[W];
}
static inline void team_comms_destroy(void) {
  for (int w = 1; w <= MAXW; w++)
    for (int r = 0; r < w; r++)
      if (g_comms[w][r]) sbnCommDestroy(g_comms[w][r]), g_comms[w][r] = NULL;
}

static inline size_t dt_size(sbnDataType_t dt) { return dt == sbnFloat32 ? 4 : 2; }

/* The fused backward as the tests call it: sbnBackwardEx, or sbnBackwardInPlaceEx where x is
   NULL and the forward's residual z is given (it takes (y, z) where sbnBackwardEx takes
   (x, y); every other argument alike). z is not passed to sbnBackwardEx (an x-based
   backward, or one without a residual, takes none). */
static inline sbnResult_t backward_ex(sbnComm_t comm, const sbnTensorDesc_t* d, const void* x, const void* z,
                                      const void* y, const void* dy, void* dx, void* dz, const float* w,
                                      const float* b, const float* smean, const float* sinv, float* dw, float* db,
                                      const sbnParams_t* p, const sbnEpilogue_t* e, sbnStream_t stream) {
  if (x == NULL && z != NULL)
    return sbnBackwardInPlaceEx(comm, d, y, z, dy, dx, dz, w, b, smean, sinv, dw, db, p, e, stream);
  return sbnBackwardEx(comm, d, x, y, dy, dx, dz, w, b, smean, sinv, dw, db, p, e, stream);
}

/* ---- input generators ----------------------------------------------------------------- */
typedef enum {
  GEN_NORMAL,    /* per-channel N(mu_c, sd_c), mu_c in [-2, 2], sd_c in [0.5, 2] */
  GEN_OFFSET,    /* 1e4 + N(0, 1) */
  GEN_F16HIGH,   /* 6.0e4 + U(-4000, 4000): near the top of fp16's range */
  GEN_F16SPREAD, /* U(-6e4, 6e4) */
} gen_t;

static inline double gen_value(sbn_rng_t* rng, gen_t g, double mu, double sd) {
  switch (g) {
    case GEN_NORMAL: return mu + sd * sbn_rng_normal(rng);
    case GEN_OFFSET: return 1.0e4 + sbn_rng_normal(rng);
    case GEN_F16HIGH: return 6.0e4 + (sbn_rng_uniform(rng) * 2.0 - 1.0) * 4000.0;
    case GEN_F16SPREAD: return (sbn_rng_uniform(rng) * 2.0 - 1.0) * 6.0e4;
  }
  return 0.0;
}

/* A tensor per desc filled with per-channel data (rounded to the dtype); NULL if empty. */
static inline void* gen_tensor(const sbnTensorDesc_t* d, sbn_rng_t* rng, gen_t g) {
  int64_t n = sbn_ref_numel(d);
  if (n == 0) return NULL;
  void* p = malloc((size_t)n * dt_size(d->dtype));
  for (int64_t ci = 0; ci < d->c; ci++) {
    /* channel parameters from a stream of their own, seeded by the state of rng: they
       differ per channel, per rank and per call (ranks' means differ, which exercises
       the between-rank term of the merge) */
    sbn_rng_t crng = {0x1234u + (uint64_t)ci * 7919u + rng->s % 1000u};
    double mu = (sbn_rng_uniform(&crng) * 4.0) - 2.0, sd = 0.5 + 1.5 * sbn_rng_uniform(&crng);
    for (int64_t ni = 0; ni < d->n; ni++)
      for (int64_t si = 0; si < d->spatial; si++)
        sbn_ref_store(p, d->dtype, sbn_ref_index(d, ni, ci, si), gen_value(rng, g, mu, sd));
  }
  return p;
}

static inline void* dup_mem(const void* p, size_t bytes) {
  if (!p) return NULL;
  void* q = malloc(bytes);
  memcpy(q, p, bytes);
  return q;
}

/* ---- a team's tensors ----------------------------------------------------------------- */
typedef struct {
  int W;
  sbnTensorDesc_t d[MAXW];
  void* x[MAXW];  /* input as passed (NULL when n == 0) */
  void* x0[MAXW]; /* pristine copy */
  void* y[MAXW];
  float* w; /* weight, bias: NULL for affine=False */
  float* b;
  int running;         /* running stats present */
  float* rm[MAXW];     /* running mean/var per rank (NULL if !running) */
  float* rv[MAXW];
  float* rm0; /* initial running stats, the same on every rank */
  float* rv0;
  int64_t nbt[MAXW];
  int nbt_null; /* pass num_batches_tracked = NULL */
  float* smean[MAXW];
  float* sinv[MAXW];
  /* reference running state (carried across calls) */
  double* rm_ref;
  double* rv_ref;
  int64_t nbt_ref;
  /* backward */
  void* dy[MAXW];
  void* dy0[MAXW];
  void* dx[MAXW];
  float* dw[MAXW];
  float* db[MAXW];
} team_t;

static inline size_t team_bytes(const team_t* t, int r) {
  return (size_t)sbn_ref_numel(&t->d[r]) * dt_size(t->d[r].dtype);
}
static inline float* fvec(int64_t c) { return (float*)calloc((size_t)c, sizeof(float)); }
static inline double* dvec(int64_t c) { return (double*)calloc((size_t)c, sizeof(double)); }

/* Fills outputs with a NaN pattern so that anything not written shows. */
static inline void team_poison(team_t* t) {
  int64_t c = t->d[0].c;
  for (int r = 0; r < t->W; r++) {
    if (t->y[r]) memset(t->y[r], 0xff, team_bytes(t, r));
    if (t->dx[r]) memset(t->dx[r], 0xff, team_bytes(t, r));
    memset(t->smean[r], 0xff, (size_t)c * sizeof(float));
    memset(t->sinv[r], 0xff, (size_t)c * sizeof(float));
    memset(t->dw[r], 0xff, (size_t)c * sizeof(float));
    memset(t->db[r], 0xff, (size_t)c * sizeof(float));
  }
}

/* Poisons only the backward's outputs (keeps the saved statistics). */
static inline void team_poison_bwd(team_t* t) {
  int64_t c = t->d[0].c;
  for (int r = 0; r < t->W; r++) {
    if (t->dx[r]) memset(t->dx[r], 0xff, team_bytes(t, r));
    memset(t->dw[r], 0xff, (size_t)c * sizeof(float));
    memset(t->db[r], 0xff, (size_t)c * sizeof(float));
  }
}

/* New random x (and dy) for the same shapes; keeps running state. */
static inline void team_new_inputs(team_t* t, sbn_rng_t* rng, gen_t g) {
  for (int r = 0; r < t->W; r++) {
    free(t->x[r]);
    free(t->x0[r]);
    free(t->dy[r]);
    free(t->dy0[r]);
    t->x[r] = gen_tensor(&t->d[r], rng, g);
    t->x0[r] = dup_mem(t->x[r], team_bytes(t, r));
    t->dy[r] = gen_tensor(&t->d[r], rng, GEN_NORMAL);
    t->dy0[r] = dup_mem(t->dy[r], team_bytes(t, r));
  }
  team_poison(t);
}

/* Resets the running stats (library and reference) to their initial values. */
static inline void team_reset_running(team_t* t) {
  int64_t c = t->d[0].c;
  for (int r = 0; r < t->W; r++) {
    if (t->running) {
      memcpy(t->rm[r], t->rm0, (size_t)c * sizeof(float));
      memcpy(t->rv[r], t->rv0, (size_t)c * sizeof(float));
    }
    t->nbt[r] = 0;
  }
  for (int64_t ci = 0; ci < c; ci++) t->rm_ref[ci] = t->rm0[ci], t->rv_ref[ci] = t->rv0[ci];
  t->nbt_ref = 0;
}

static inline void team_make(team_t* t, int W, sbnDataType_t dt, sbnLayout_t lay, int64_t c,
                      int64_t spatial, const int64_t* n, int affine, int running, gen_t g,
                      uint64_t seed) {
  memset(t, 0, sizeof *t);
  sbn_rng_t rng = {seed};
  t->W = W;
  t->running = running;
  for (int r = 0; r < W; r++) {
    sbnTensorDesc_t d = {dt, lay, n[r], c, spatial};
    t->d[r] = d;
    t->smean[r] = fvec(c);
    t->sinv[r] = fvec(c);
    t->dw[r] = fvec(c);
    t->db[r] = fvec(c);
    if (running) t->rm[r] = fvec(c), t->rv[r] = fvec(c);
  }
  if (affine) {
    t->w = fvec(c);
    t->b = fvec(c);
    for (int64_t ci = 0; ci < c; ci++) {
      t->w[ci] = (float)(0.5 + sbn_rng_uniform(&rng));
      if (ci % 3 == 2) t->w[ci] = -t->w[ci];
      t->b[ci] = (float)(sbn_rng_uniform(&rng) - 0.5);
    }
  }
  t->rm0 = fvec(c);
  t->rv0 = fvec(c);
  t->rm_ref = dvec(c);
  t->rv_ref = dvec(c);
  for (int64_t ci = 0; ci < c; ci++) {
    t->rm0[ci] = (float)(sbn_rng_uniform(&rng) - 0.5);
    t->rv0[ci] = (float)(0.5 + sbn_rng_uniform(&rng));
  }
  for (int r = 0; r < W; r++) {
    size_t bytes = (size_t)n[r] * (size_t)c * (size_t)spatial * dt_size(dt);
    t->y[r] = bytes ? malloc(bytes) : NULL;
    t->dx[r] = bytes ? malloc(bytes) : NULL;
  }
  team_new_inputs(t, &rng, g);
  team_reset_running(t);
}

/* dst: a copy of team src, every buffer its own (what team_make with src's arguments
   makes, before any op: the same bits, without generating them again; ~50-90 ns an
   element there, most of a GPU test case's host time). */
static inline void team_dup(team_t* dst, const team_t* src) {
  const int64_t c = src->d[0].c;
  const size_t cb = (size_t)c * sizeof(float), db = (size_t)c * sizeof(double);
  *dst = *src;
  for (int r = 0; r < src->W; r++) {
    const size_t tb = team_bytes(src, r);
    dst->x[r] = dup_mem(src->x[r], tb);
    dst->x0[r] = dup_mem(src->x0[r], tb);
    dst->y[r] = dup_mem(src->y[r], tb);
    dst->dy[r] = dup_mem(src->dy[r], tb);
    dst->dy0[r] = dup_mem(src->dy0[r], tb);
    dst->dx[r] = dup_mem(src->dx[r], tb);
    dst->rm[r] = (float*)dup_mem(src->rm[r], cb);
    dst->rv[r] = (float*)dup_mem(src->rv[r], cb);
    dst->smean[r] = (float*)dup_mem(src->smean[r], cb);
    dst->sinv[r] = (float*)dup_mem(src->sinv[r], cb);
    dst->dw[r] = (float*)dup_mem(src->dw[r], cb);
    dst->db[r] = (float*)dup_mem(src->db[r], cb);
  }
  dst->w = (float*)dup_mem(src->w, cb);
  dst->b = (float*)dup_mem(src->b, cb);
  dst->rm0 = (float*)dup_mem(src->rm0, cb);
  dst->rv0 = (float*)dup_mem(src->rv0, cb);
  dst->rm_ref = (double*)dup_mem(src->rm_ref, db);
  dst->rv_ref = (double*)dup_mem(src->rv_ref, db);
}

/* Drops a team's backward buffers (forward-only tests of large tensors). */
static inline void team_drop_backward(team_t* t) {
  for (int r = 0; r < t->W; r++) {
    free(t->dy[r]), free(t->dy0[r]), free(t->dx[r]);
    t->dy[r] = t->dy0[r] = t->dx[r] = NULL;
  }
}

static inline void team_free(team_t* t) {
  for (int r = 0; r < t->W; r++) {
    free(t->x[r]), free(t->x0[r]), free(t->y[r]), free(t->dy[r]), free(t->dy0[r]);
    free(t->dx[r]), free(t->dw[r]), free(t->db[r]);
    free(t->rm[r]), free(t->rv[r]), free(t->smean[r]), free(t->sinv[r]);
  }
  free(t->w), free(t->b), free(t->rm0), free(t->rv0), free(t->rm_ref), free(t->rv_ref);
  memset(t, 0, sizeof *t);
}

/* The same data in the other layout (x, dy transposed; weights and state copied). */
static inline void team_make_transposed(team_t* dst, const team_t* src) {
  sbnLayout_t other = src->d[0].layout == sbnLayoutNCHW ? sbnLayoutNHWC : sbnLayoutNCHW;
  int64_t n[MAXW];
  for (int r = 0; r < src->W; r++) n[r] = src->d[r].n;
  team_make(dst, src->W, src->d[0].dtype, other, src->d[0].c, src->d[0].spatial, n,
            src->w != NULL, src->running, GEN_NORMAL, 1);
  int64_t c = src->d[0].c;
  if (src->w) {
    memcpy(dst->w, src->w, (size_t)c * sizeof(float));
    memcpy(dst->b, src->b, (size_t)c * sizeof(float));
  }
  memcpy(dst->rm0, src->rm0, (size_t)c * sizeof(float));
  memcpy(dst->rv0, src->rv0, (size_t)c * sizeof(float));
  team_reset_running(dst);
  size_t es = dt_size(src->d[0].dtype);
  for (int r = 0; r < src->W; r++) {
    const sbnTensorDesc_t* a = &src->d[r];
    const sbnTensorDesc_t* b = &dst->d[r];
    for (int64_t ni = 0; ni < a->n; ni++)
      for (int64_t ci = 0; ci < c; ci++)
        for (int64_t si = 0; si < a->spatial; si++) {
          int64_t ia = sbn_ref_index(a, ni, ci, si), ib = sbn_ref_index(b, ni, ci, si);
          memcpy((char*)dst->x[r] + ib * es, (const char*)src->x0[r] + ia * es, es);
          memcpy((char*)dst->x0[r] + ib * es, (const char*)src->x0[r] + ia * es, es);
          memcpy((char*)dst->dy[r] + ib * es, (const char*)src->dy0[r] + ia * es, es);
          memcpy((char*)dst->dy0[r] + ib * es, (const char*)src->dy0[r] + ia * es, es);
        }
  }
}

/* ---- running ops ---------------------------------------------------------------------- */
enum { MODE_GROUP = 0, MODE_THREADS = 1 };
enum { OPT_INPLACE = 1, OPT_DX_NULL = 2, OPT_NO_DWDB = 4 };

typedef struct {
  team_t* t;
  int r;
  int bwd;
  int opts;
  const sbnParams_t* p;
  sbnResult_t res;
} rank_call_t;

static inline sbnResult_t rank_call(team_t* t, int r, int bwd, int opts, const sbnParams_t* p) {
  sbnComm_t comm = team_comms(t->W)[r];
  if (!bwd) {
    void* y = (opts & OPT_INPLACE) ? t->x[r] : t->y[r];
    return sbnForwardTrain(comm, &t->d[r], t->x[r], y, t->w, t->b, t->rm[r], t->rv[r],
                           t->nbt_null ? NULL : &t->nbt[r], t->smean[r], t->sinv[r], p, NULL);
  }
  void* dx = (opts & OPT_DX_NULL) ? NULL : (opts & OPT_INPLACE) ? t->dy[r] : t->dx[r];
  int nodw = opts & OPT_NO_DWDB;
  return sbnBackward(comm, &t->d[r], t->x[r], t->dy[r], dx, t->w, t->smean[r], t->sinv[r],
                     nodw ? NULL : t->dw[r], nodw ? NULL : t->db[r], p, NULL);
}

static inline void* rank_thread(void* arg) {
  rank_call_t* a = (rank_call_t*)arg;
  a->res = rank_call(a->t, a->r, a->bwd, a->opts, a->p);
  return NULL;
}

/* Runs one forward (bwd = 0) or backward (bwd = 1) over the whole team. In-place results
   are moved to y / dx afterwards and x / dy restored, so checks look at y / dx. */
static inline sbnResult_t team_run(team_t* t, int bwd, int mode, int opts, const sbnParams_t* p) {
  sbnResult_t res = sbnSuccess;
  if (mode == MODE_GROUP) {
    if (sbnGroupStart() != sbnSuccess) return sbnInvalidUsage;
    for (int r = 0; r < t->W; r++) {
      sbnResult_t e = rank_call(t, r, bwd, opts, p);
      if (e != sbnSuccess && res == sbnSuccess) res = e;
    }
    sbnResult_t e = sbnGroupEnd();
    if (res == sbnSuccess) res = e;
  } else {
    pthread_t th[MAXW];
    rank_call_t a[MAXW];
    for (int r = 0; r < t->W; r++) {
      rank_call_t ar = {t, r, bwd, opts, p, sbnSuccess};
      a[r] = ar;
      if (pthread_create(&th[r], NULL, rank_thread, &a[r]) != 0) abort();
    }
    for (int r = 0; r < t->W; r++) {
      pthread_join(th[r], NULL);
      if (a[r].res != sbnSuccess && res == sbnSuccess) res = a[r].res;
    }
  }
  if (opts & OPT_INPLACE) {
    for (int r = 0; r < t->W; r++) {
      size_t bytes = team_bytes(t, r);
      if (!bytes) continue;
      if (!bwd) {
        memcpy(t->y[r], t->x[r], bytes);
        memcpy(t->x[r], t->x0[r], bytes);
      } else if (!(opts & OPT_DX_NULL)) {
        memcpy(t->dx[r], t->dy[r], bytes);
        memcpy(t->dy[r], t->dy0[r], bytes);
      }
    }
  }
  return res;
}

/* ---- checks --------------------------------------------------------------------------- */
typedef struct {
  double stat_atol, stat_rtol; /* save_mean (scaled by the channel's sd), save_invstd, running */
  double out_atol, out_rtol;   /* y, dx */
  double grad_atol, grad_rtol; /* dweight, dbias */
} tol_t;

/* DESIGN.md: statistics 1e-5/1e-5; fp32 outputs and grads 1e-4/1e-4; fp16 outputs
   2e-3/2e-3 and bf16 outputs 1e-2/1e-2 (a few half ulps of each: 2^-11 and 2^-8
   relative; fp16's had bf16's 1e-2, ~20 of its ulps) against the reference of the rounded
   input. Statistics and dweight/dbias are
   accumulated in fp32 from exactly widened inputs, so they keep fp32 tolerances for every
   dtype. */
static inline tol_t tol_for(sbnDataType_t dt) {
  tol_t t = {1e-5, 1e-5, 1e-4, 1e-4, 1e-4, 1e-4};
  if (dt != sbnFloat32) t.out_atol = t.out_rtol = dt == sbnFloat16 ? 2e-3 : 1e-2;
  return t;
}

/* fp32 with the outputs' tolerance at 1e-5: the mean carried as hi + lo is good to a few
   u (2^-24) of the channel's spread, so y = ((x - hi) - lo) * scale + b is within a few u
   of |y| + |b| plus that error times |scale|, about 1e-6 for the N(0, 1)-scaled channels
   of the tests that take it (ten times that; the default 1e-4 lets an error of 1e-4 of
   the spread pass). */
static inline tol_t tol_tight_fp32(void) {
  tol_t tol = tol_for(sbnFloat32);
  tol.out_atol = tol.out_rtol = 1e-5;
  return tol;
}

static inline float* widen_all(const void* p, sbnDataType_t dt, int64_t n) {
  float* f = (float*)malloc((size_t)(n ? n : 1) * sizeof(float));
  for (int64_t i = 0; i < n; i++) f[i] = (float)sbn_ref_load(p, dt, i);
  return f;
}

/* got[c] vs ref[c] with per-element atol. */
static inline int close_vec_(const char* what, const float* got, const double* ref, const double* atol,
                      int64_t c, double rtol) {
  for (int64_t i = 0; i < c; i++) {
    if (!sbn_close_((double)got[i], ref[i], atol[i], rtol)) {
      SBN_FAIL_("%s[%" PRId64 "]: got %.9g, ref %.9g, |diff| %.3g > %.3g", what, i,
                (double)got[i], ref[i], fabs((double)got[i] - ref[i]),
                atol[i] + rtol * fabs(ref[i]));
      return 0;
    }
  }
  return 1;
}

/* Bitwise agreement of save_mean/save_invstd/running stats/nbt across ranks. */
static inline void check_rank_agreement(const team_t* t) {
  size_t cb = (size_t)t->d[0].c * sizeof(float);
  for (int r = 1; r < t->W; r++) {
    ASSERT_MEMEQ(t->smean[r], t->smean[0], cb);
    ASSERT_MEMEQ(t->sinv[r], t->sinv[0], cb);
    if (t->running) {
      ASSERT_MEMEQ(t->rm[r], t->rm[0], cb);
      ASSERT_MEMEQ(t->rv[r], t->rv[0], cb);
    }
    ASSERT_EQ_INT(t->nbt[r], t->nbt[0]);
  }
}

/* After one successful forward: compares everything with the reference over x0 and
   advances the reference running state. */
static inline void check_forward(team_t* t, const sbnParams_t* p, tol_t tol) {
  int W = t->W;
  int64_t c = t->d[0].c;
  double *mean = dvec(c), *invstd = dvec(c), *varu = dvec(c), *atol = dvec(c);
  double* ys[MAXW] = {0};
  for (int r = 0; r < W; r++) ys[r] = (double*)malloc((size_t)(sbn_ref_numel(&t->d[r]) + 1) * sizeof(double));
  int64_t m = 0;
  const void* xs[MAXW];
  for (int r = 0; r < W; r++) xs[r] = t->x0[r];
  sbn_ref_forward(W, t->d, xs, t->w, t->b, (double)p->eps, mean, invstd, varu, &m, ys);
  int ok = 1;
  /* mean: an fp32 Welford/Chan mean is accurate relative to the data's spread and
     magnitude, not to |mean| (which may be ~0): atol scaled by sd + |mean|. */
  for (int64_t ci = 0; ci < c && ok; ci++) {
    double sd = m > 0 ? 1.0 / invstd[ci] : 0.0;
    atol[ci] = tol.stat_atol * (1.0 + sd);
  }
  ok = ok && close_vec_("save_mean", t->smean[0], mean, atol, c, tol.stat_rtol);
  for (int64_t ci = 0; ci < c; ci++) atol[ci] = tol.stat_atol;
  ok = ok && close_vec_("save_invstd", t->sinv[0], invstd, atol, c, tol.stat_rtol);
  if (ok && m == 0) {
    for (int64_t ci = 0; ci < c && ok; ci++) {
      if (memcmp(&t->smean[0][ci], &(float){0.0f}, 4) != 0 ||
          t->sinv[0][ci] != 1.0f / sqrtf(p->eps)) {
        SBN_FAIL_("M == 0: save_mean %g (want 0), save_invstd %.9g (want 1/sqrtf(eps) %.9g)",
                  (double)t->smean[0][ci], (double)t->sinv[0][ci], (double)(1.0f / sqrtf(p->eps)));
        ok = 0;
      }
    }
  }
  /* running stats and num_batches_tracked */
  if (ok && t->running) {
    sbn_ref_running(c, m, mean, varu, (double)p->momentum, t->nbt_ref, t->rm_ref, t->rv_ref);
    /* running_mean: like save_mean, atol scaled by the spread (sqrt of running_var) */
    for (int64_t ci = 0; ci < c; ci++) atol[ci] = tol.stat_atol * (1.0 + sqrt(fabs(t->rv_ref[ci])));
    ok = close_vec_("running_mean", t->rm[0], t->rm_ref, atol, c, tol.stat_rtol);
    for (int64_t ci = 0; ci < c; ci++) atol[ci] = tol.stat_atol;
    ok = ok && close_vec_("running_var", t->rv[0], t->rv_ref, atol, c, tol.stat_rtol);
  }
  t->nbt_ref++;
  if (ok && !t->nbt_null && t->nbt[0] != t->nbt_ref) {
    SBN_FAIL_("num_batches_tracked %" PRId64 ", expected %" PRId64, t->nbt[0], t->nbt_ref);
    ok = 0;
  }
  /* y */
  for (int r = 0; r < W && ok; r++) {
    int64_t ne = sbn_ref_numel(&t->d[r]);
    if (!ne) continue;
    float* yf = widen_all(t->y[r], t->d[r].dtype, ne);
    ok = sbn_check_close_array_("y", yf, ys[r], (size_t)ne, tol.out_atol, tol.out_rtol,
                                __FILE__, __LINE__);
    if (!ok) sbn_test_failures_++, sbn_test_cur_failed_++;
    for (int64_t i = 0; i < ne && ok; i++)
      if (!isfinite(yf[i])) {
        SBN_FAIL_("y[%d][%" PRId64 "] not finite", r, i);
        ok = 0;
      }
    free(yf);
  }
  for (int r = 0; r < W; r++) free(ys[r]);
  free(mean), free(invstd), free(varu), free(atol);
  if (ok) check_rank_agreement(t);
}

/* err[ch]: the error of channel ch's mean that a team's forward output y implies, in
   units of 2^-24 times the channel's standard deviation (tolerances.md, "The forward's
   mean"): y - y_exact is -(mean' - mean) invstd weight at every element, so the average
   of y - y_exact over the channel's elements (sbn_ref_forward's float64 y) over invstd
   weight is the mean the library normalized with less the exact one (the rounding of
   invstd averages out: the x - mean sum to 0). fp32 teams, weights not 0. */
static inline void implied_mean_errors_u(const team_t* t, const sbnParams_t* p, double* err) {
  const int W = t->W;
  const int64_t c = t->d[0].c;
  double *mean = dvec(c), *invstd = dvec(c), *varu = dvec(c);
  double* ys[MAXW] = {0};
  const void* xs[MAXW];
  int64_t m = 0;
  for (int r = 0; r < W; r++) {
    ys[r] = (double*)malloc((size_t)(sbn_ref_numel(&t->d[r]) + 1) * sizeof(double));
    xs[r] = t->x0[r];
  }
  sbn_ref_forward(W, t->d, xs, t->w, t->b, (double)p->eps, mean, invstd, varu, &m, ys);
  for (int64_t ch = 0; ch < c; ch++) {
    double sum = 0.0;
    for (int r = 0; r < W; r++)
      for (int64_t i = 0; i < t->d[r].n; i++)
        for (int64_t s = 0; s < t->d[r].spatial; s++) {
          const int64_t k = sbn_ref_index(&t->d[r], i, ch, s);
          sum += (double)((const float*)t->y[r])[k] - ys[r][k];
        }
    const double w = t->w ? (double)t->w[ch] : 1.0;
    const double sd = sqrt(varu[ch] * (double)(m - 1) / (double)m);
    err[ch] = -(sum / (double)m) / (invstd[ch] * w) / sd / ldexp(1.0, -24);
  }
  for (int r = 0; r < W; r++) free(ys[r]);
  free(mean), free(invstd), free(varu);
}

/* Runs a forward in `mode` and checks it. */
static inline void forward_and_check(team_t* t, int mode, int opts, const sbnParams_t* p, tol_t tol) {
  ASSERT_OK(team_run(t, 0, mode, opts, p));
  check_forward(t, p, tol);
}

/* Bitwise equality of two teams' forward outputs (same layout). */
static inline void check_same_forward(const team_t* a, const team_t* b) {
  size_t cb = (size_t)a->d[0].c * sizeof(float);
  for (int r = 0; r < a->W; r++) {
    ASSERT_MEMEQ(a->smean[r], b->smean[r], cb);
    ASSERT_MEMEQ(a->sinv[r], b->sinv[r], cb);
    if (a->running) {
      ASSERT_MEMEQ(a->rm[r], b->rm[r], cb);
      ASSERT_MEMEQ(a->rv[r], b->rv[r], cb);
    }
    if (team_bytes(a, r)) ASSERT_MEMEQ(a->y[r], b->y[r], team_bytes(a, r));
  }
}

/* A team's gradients of its last backward, kept: dx of every rank, dweight and dbias;
   team_grads_equal: the team's now bitwise those. */
typedef struct {
  void* dx[MAXW];
  float* dw[MAXW];
  float* db[MAXW];
} team_grads_t;

static inline void team_grads_keep(const team_t* t, team_grads_t* g) {
  for (int r = 0; r < t->W; r++) {
    g->dx[r] = dup_mem(t->dx[r], team_bytes(t, r));
    g->dw[r] = (float*)dup_mem(t->dw[r], (size_t)t->d[r].c * sizeof(float));
    g->db[r] = (float*)dup_mem(t->db[r], (size_t)t->d[r].c * sizeof(float));
  }
}
static inline int team_grads_equal(const team_t* t, const team_grads_t* g) {
  for (int r = 0; r < t->W; r++) {
    const size_t cb = (size_t)t->d[r].c * sizeof(float);
    if ((team_bytes(t, r) && memcmp(g->dx[r], t->dx[r], team_bytes(t, r)) != 0) ||
        memcmp(g->dw[r], t->dw[r], cb) != 0 || memcmp(g->db[r], t->db[r], cb) != 0)
      return 0;
  }
  return 1;
}
static inline void team_grads_free(const team_t* t, team_grads_t* g) {
  for (int r = 0; r < t->W; r++) free(g->dx[r]), free(g->dw[r]), free(g->db[r]);
}

/* ---- the backward's mask from x (kernels/bn_math.h: sbn_xmask_sign) --------------------- */
/* y's sign flipped where a backward that takes the mask from x does not read it: elements
   the rule is sure of whose group of V elements (the 16-byte vector the kernels read
   whole where one of its elements is not sure; V = 1: element by element, the CPU team
   and the scalar kernels) has every element of the same plane sure too. The number
   flipped. test_xmask.c, test_coop_emu.c. */
static inline long team_xmask_poison(team_t* t, int64_t V) {
  long n = 0;
  for (int r = 0; r < t->W; r++) {
    const sbnTensorDesc_t* d = &t->d[r];
    const int64_t ne = sbn_ref_numel(d);
    const float floor = sbn_xmask_floor(sbn_dtype_least(d->dtype));
    signed char* sg = (signed char*)malloc((size_t)ne + 1);
    for (int64_t i = 0; i < ne; i++) {
      const int64_t c = d->layout == sbnLayoutNHWC ? i % d->c : (i / d->spatial) % d->c;
      const float x = (float)sbn_ref_load(t->x[r], d->dtype, i);
      const float s = sbn_scale(t->w ? t->w[c] : 1.0f, t->sinv[r][c]);
      sg[i] = (signed char)sbn_xmask_sign(x - t->smean[r][c], s, t->b ? t->b[c] : 0.0f, t->smean[r][c], floor);
    }
    for (int64_t i = 0; i < ne; i++) {
      int all = 1;
      for (int64_t j = i / V * V; j < i / V * V + V && j < ne; j++)
        all &= (d->layout == sbnLayoutNCHW && j / d->spatial != i / d->spatial) || sg[j] != 0;
      if (all) sbn_ref_store(t->y[r], d->dtype, i, sg[i] > 0 ? -1.0 : 1.0), n++;
    }
    free(sg);
  }
  return n;
}

#endif /* SYNCBN_TESTS_TEAM_UTIL_H_ */
