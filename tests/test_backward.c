/* test_backward.c — sbnBackward on CPU teams against the double-precision reference
 * (given the library's own saved statistics), grad modes, in-place and NULL outputs,
 * M == 0, determinism, and a finite-difference check of dx/dweight/dbias.
 * Tolerances: tol_for() in team_util.h (DESIGN.md) unless a comment says otherwise.
 */
#include <float.h>

#include "team_util.h"

static const int kW[] = {1, 2, 3, 4, 8};
#define NW ((int)(sizeof kW / sizeof kW[0]))

static sbnParams_t params(sbnGradMode_t gm) {
  sbnParams_t p = SBN_PARAMS_DEFAULT;
  p.grad_mode = gm;
  return p;
}

/* Checks dx / dweight / dbias of the last backward against the reference computed with
   the library's save_mean/save_invstd. */
static void check_backward(team_t* t, const sbnParams_t* p, int opts, tol_t tol) {
  int W = t->W;
  int64_t c = t->d[0].c;
  double *mean = dvec(c), *invstd = dvec(c), *dwg = dvec(c), *dbg = dvec(c);
  double *dxs[MAXW] = {0}, *dwl[MAXW] = {0}, *dbl[MAXW] = {0};
  const void *xs[MAXW] = {0}, *dys[MAXW] = {0};
  for (int64_t ci = 0; ci < c; ci++) mean[ci] = t->smean[0][ci], invstd[ci] = t->sinv[0][ci];
  for (int r = 0; r < W; r++) {
    xs[r] = t->x0[r];
    dys[r] = t->dy0[r];
    dxs[r] = dvec(sbn_ref_numel(&t->d[r]) + 1);
    dwl[r] = dvec(c);
    dbl[r] = dvec(c);
  }
  sbn_ref_backward(W, t->d, xs, dys, t->w, mean, invstd, dxs, dwl, dbl, dwg, dbg);
  int ok = 1;
  for (int r = 0; r < W && ok; r++) {
    int64_t ne = sbn_ref_numel(&t->d[r]);
    if (ne && !(opts & OPT_DX_NULL)) {
      float* f = widen_all(t->dx[r], t->d[r].dtype, ne);
      ok = sbn_check_close_array_("dx", f, dxs[r], (size_t)ne, tol.out_atol, tol.out_rtol,
                                  __FILE__, __LINE__);
      free(f);
      if (!ok) sbn_test_failures_++, sbn_test_cur_failed_++;
    }
    if (ok && !(opts & OPT_NO_DWDB)) {
      int global = p->grad_mode == sbnGradGlobal;
      ok = sbn_check_close_array_("dweight", t->dw[r], global ? dwg : dwl[r], (size_t)c,
                                  tol.grad_atol, tol.grad_rtol, __FILE__, __LINE__) &&
           sbn_check_close_array_("dbias", t->db[r], global ? dbg : dbl[r], (size_t)c,
                                  tol.grad_atol, tol.grad_rtol, __FILE__, __LINE__);
      if (!ok) {
        sbn_test_failures_++, sbn_test_cur_failed_++;
        fprintf(stderr, "  (rank %d of %d, grad_mode %s)\n", r, W, global ? "global" : "local");
      }
      if (ok && global && r > 0) { /* identical on every rank */
        if (memcmp(t->dw[r], t->dw[0], (size_t)c * 4) || memcmp(t->db[r], t->db[0], (size_t)c * 4)) {
          SBN_FAIL_("global dweight/dbias differ between rank 0 and rank %d", r);
          ok = 0;
        }
      }
    }
  }
  for (int r = 0; r < W; r++) free(dxs[r]), free(dwl[r]), free(dbl[r]);
  free(mean), free(invstd), free(dwg), free(dbg);
}

/* Forward (default params, checked) then backward with `p` and `opts`, checked. */
static void fwd_bwd(team_t* t, const sbnParams_t* p, int mode, int opts, tol_t tol) {
  sbnParams_t pf = SBN_PARAMS_DEFAULT;
  forward_and_check(t, MODE_GROUP, 0, &pf, tol);
  CHECK_();
  ASSERT_OK(team_run(t, 1, mode, opts, p));
  check_backward(t, p, opts, tol);
}

static void bwd_case(int W, sbnDataType_t dt, sbnLayout_t lay, int64_t c, int64_t sp,
                     const int64_t* n, int affine, sbnGradMode_t gm, int opts, gen_t g,
                     uint64_t seed) {
  team_t t;
  sbnParams_t p = params(gm);
  team_make(&t, W, dt, lay, c, sp, n, affine, 1, g, seed);
  fwd_bwd(&t, &p, MODE_GROUP, opts, tol_for(dt));
  team_free(&t);
}

static void test_backward_vs_ref_fp32(void) {
  for (int gm = 0; gm < 2; gm++)
    for (int lay = 0; lay < 2; lay++)
      for (int i = 0; i < NW; i++) {
        int64_t n[MAXW] = {2, 2, 2, 2, 2, 2, 2, 2};
        bwd_case(kW[i], sbnFloat32, (sbnLayout_t)lay, 3, 5, n, (i + lay) % 2 == 0,
                 (sbnGradMode_t)gm, 0, GEN_NORMAL, 2000u + (uint64_t)(gm * 100 + lay * 10 + i));
        CHECK_();
      }
}

static void test_backward_uneven_empty(void) {
  struct { int W; int64_t n[MAXW]; int64_t sp; } cases[] = {
      {4, {3, 0, 1, 5}, 7},
      {3, {0, 4, 0}, 3},
      {8, {0, 0, 0, 1, 0, 0, 0, 0}, 3},
      {3, {0, 2, 0}, 1},
      {8, {1, 0, 2, 0, 3, 0, 4, 0}, 2},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int gm = 0; gm < 2; gm++) {
      bwd_case(cases[k].W, sbnFloat32, (sbnLayout_t)(k % 2), 4, cases[k].sp, cases[k].n, 1,
               (sbnGradMode_t)gm, 0, GEN_NORMAL, 2100u + k * 2 + (uint64_t)gm);
      CHECK_();
    }
}

static void test_backward_dtypes(void) {
  const sbnDataType_t dts[] = {sbnFloat16, sbnBFloat16};
  for (int d = 0; d < 2; d++)
    for (int lay = 0; lay < 2; lay++)
      for (int affine = 0; affine < 2; affine++) {
        int64_t n[MAXW] = {2, 0, 3, 1};
        bwd_case(4, dts[d], (sbnLayout_t)lay, 3, 10, n, affine, (sbnGradMode_t)affine, 0,
                 GEN_NORMAL, 2200u + (uint64_t)(d * 100 + lay * 10 + affine));
        CHECK_();
      }
  /* fp16 near the top of its range: x - mean up to ~4000, still fine in fp32 sums */
  int64_t n[MAXW] = {3, 2, 4};
  bwd_case(3, sbnFloat16, sbnLayoutNHWC, 2, 20, n, 1, sbnGradGlobal, 0, GEN_F16HIGH, 2250);
  CHECK_();
  bwd_case(3, sbnFloat16, sbnLayoutNCHW, 2, 20, n, 1, sbnGradLocal, 0, GEN_F16SPREAD, 2251);
}

/* Global dweight/dbias == the sum over ranks of the local ones (to tolerance), and
   bitwise identical on every rank (check_backward). */
static void test_global_is_sum_of_local(void) {
  for (int i = 1; i < NW; i++) {
    int W = kW[i];
    int64_t n[MAXW] = {3, 1, 0, 2, 4, 1, 2, 3};
    team_t t;
    team_make(&t, W, sbnFloat32, sbnLayoutNCHW, 5, 6, n, 1, 1, GEN_NORMAL, 2300u + (uint64_t)W);
    sbnParams_t pl = params(sbnGradLocal), pg = params(sbnGradGlobal);
    fwd_bwd(&t, &pl, MODE_GROUP, 0, tol_for(sbnFloat32));
    CHECK_();
    double sw[5] = {0}, sb[5] = {0};
    for (int r = 0; r < W; r++)
      for (int ci = 0; ci < 5; ci++) sw[ci] += t.dw[r][ci], sb[ci] += t.db[r][ci];
    float dx_local[MAXW][200];
    for (int r = 0; r < W; r++)
      if (team_bytes(&t, r)) memcpy(dx_local[r], t.dx[r], team_bytes(&t, r));
    ASSERT_OK(team_run(&t, 1, MODE_GROUP, 0, &pg));
    check_backward(&t, &pg, 0, tol_for(sbnFloat32));
    for (int ci = 0; ci < 5 && !sbn_test_cur_failed_; ci++) {
      ASSERT_CLOSE(t.dw[0][ci], sw[ci], 1e-4, 1e-4);
      ASSERT_CLOSE(t.db[0][ci], sb[ci], 1e-4, 1e-4);
    }
    /* dx does not depend on the grad mode */
    for (int r = 0; r < W && !sbn_test_cur_failed_; r++)
      if (team_bytes(&t, r)) ASSERT_MEMEQ(dx_local[r], t.dx[r], team_bytes(&t, r));
    team_free(&t);
    CHECK_();
  }
}

/* dx NULL: dweight/dbias still right. dweight/dbias NULL: dx still right. */
static void test_null_outputs(void) {
  for (int gm = 0; gm < 2; gm++) {
    int64_t n[MAXW] = {2, 3, 0};
    bwd_case(3, sbnFloat32, sbnLayoutNHWC, 4, 5, n, 1, (sbnGradMode_t)gm, OPT_DX_NULL,
             GEN_NORMAL, 2400u + (uint64_t)gm);
    CHECK_();
    bwd_case(3, sbnBFloat16, sbnLayoutNCHW, 4, 5, n, 0, (sbnGradMode_t)gm, OPT_DX_NULL,
             GEN_NORMAL, 2410u + (uint64_t)gm);
    CHECK_();
    bwd_case(3, sbnFloat32, sbnLayoutNCHW, 4, 5, n, 1, (sbnGradMode_t)gm, OPT_NO_DWDB,
             GEN_NORMAL, 2420u + (uint64_t)gm);
    CHECK_();
  }
}

/* dx == dy (in place) == out of place, bitwise. */
static void test_dx_in_place(void) {
  for (int d = 0; d < 3; d++) {
    int64_t n[MAXW] = {1, 4};
    team_t a, b;
    sbnParams_t p = params(sbnGradGlobal);
    team_make(&a, 2, (sbnDataType_t)d, sbnLayoutNCHW, 3, 8, n, 1, 1, GEN_NORMAL, 2500u + (uint64_t)d);
    team_make(&b, 2, (sbnDataType_t)d, sbnLayoutNCHW, 3, 8, n, 1, 1, GEN_NORMAL, 2500u + (uint64_t)d);
    fwd_bwd(&a, &p, MODE_GROUP, OPT_INPLACE, tol_for((sbnDataType_t)d));
    fwd_bwd(&b, &p, MODE_GROUP, 0, tol_for((sbnDataType_t)d));
    for (int r = 0; r < 2 && !sbn_test_cur_failed_; r++) {
      ASSERT_MEMEQ(a.dx[r], b.dx[r], team_bytes(&a, r));
      ASSERT_MEMEQ(a.dw[r], b.dw[r], 3 * sizeof(float));
      ASSERT_MEMEQ(a.db[r], b.db[r], 3 * sizeof(float));
    }
    team_free(&a);
    team_free(&b);
    CHECK_();
  }
}

/* M == 0: dweight = dbias = 0 in both modes; x, dy, dx NULL everywhere; also with eps = 0,
   where save_invstd is 1/sqrt(0) = inf and sum * invstd would be 0 * inf = NaN. */
static void test_backward_all_empty(void) {
  for (int gm = 0; gm < 4; gm++)
    for (int i = 0; i < 3; i++) {
      int W = kW[i * 2];
      int64_t n[MAXW] = {0};
      team_t t;
      sbnParams_t p = params((sbnGradMode_t)(gm % 2)), pf = SBN_PARAMS_DEFAULT;
      if (gm >= 2) p.eps = pf.eps = 0.0f;
      team_make(&t, W, sbnFloat32, sbnLayoutNCHW, 3, 4, n, gm % 2 == 0, 1, GEN_NORMAL, 2600u + (uint64_t)i);
      ASSERT_OK(team_run(&t, 0, MODE_GROUP, 0, &pf));
      ASSERT_OK(team_run(&t, 1, MODE_GROUP, 0, &p));
      for (int r = 0; r < W; r++)
        for (int ci = 0; ci < 3; ci++) {
          ASSERT_TRUE(gm < 2 || isinf(t.sinv[r][ci]));
          ASSERT_TRUE(t.dw[r][ci] == 0.0f);
          ASSERT_TRUE(t.db[r][ci] == 0.0f);
        }
      team_free(&t);
    }
}

/* Repeating a backward gives bitwise the same; thread-per-rank == group; NCHW == NHWC
   (element for element, and dweight/dbias). */
static void test_backward_determinism(void) {
  for (int i = 0; i < NW; i++) {
    int W = kW[i];
    int64_t n[MAXW] = {2, 3, 0, 1, 2, 2, 1, 3};
    sbnParams_t p = params((sbnGradMode_t)(i % 2));
    team_t a, b;
    team_make(&a, W, sbnFloat32, sbnLayoutNCHW, 4, 9, n, 1, 1, GEN_NORMAL, 2700u + (uint64_t)i);
    team_make_transposed(&b, &a);
    fwd_bwd(&a, &p, MODE_GROUP, 0, tol_for(sbnFloat32));
    fwd_bwd(&b, &p, MODE_THREADS, 0, tol_for(sbnFloat32));
    size_t cb = 4 * sizeof(float);
    for (int r = 0; r < W && !sbn_test_cur_failed_; r++) {
      ASSERT_MEMEQ(a.dw[r], b.dw[r], cb);
      ASSERT_MEMEQ(a.db[r], b.db[r], cb);
      for (int64_t ni = 0; ni < n[r]; ni++)
        for (int64_t ci = 0; ci < 4; ci++)
          for (int64_t si = 0; si < 9; si++) {
            int64_t ia = sbn_ref_index(&a.d[r], ni, ci, si), ib = sbn_ref_index(&b.d[r], ni, ci, si);
            ASSERT_BITEQ_F32(((float*)a.dx[r])[ia], ((float*)b.dx[r])[ib]);
          }
    }
    /* the same backward again (thread mode this time) on a */
    float dx0[MAXW][128], dw0[MAXW][4], db0[MAXW][4];
    for (int r = 0; r < W; r++) {
      if (team_bytes(&a, r)) memcpy(dx0[r], a.dx[r], team_bytes(&a, r));
      memcpy(dw0[r], a.dw[r], cb);
      memcpy(db0[r], a.db[r], cb);
    }
    team_poison_bwd(&a);
    if (!sbn_test_cur_failed_) {
      sbnResult_t res = team_run(&a, 1, MODE_THREADS, 0, &p);
      EXPECT_TRUE(res == sbnSuccess);
    }
    for (int r = 0; r < W && !sbn_test_cur_failed_; r++) {
      if (team_bytes(&a, r)) ASSERT_MEMEQ(dx0[r], a.dx[r], team_bytes(&a, r));
      ASSERT_MEMEQ(dw0[r], a.dw[r], cb);
      ASSERT_MEMEQ(db0[r], a.db[r], cb);
    }
    team_free(&a);
    team_free(&b);
    CHECK_();
  }
}

/* Shapes past the library's internal blocking (see test_forward.c). */
static void test_backward_larger_shapes(void) {
  for (int d = 0; d < 3; d += 2)
    for (int lay = 0; lay < 2; lay++) {
      int64_t n1[MAXW] = {2, 1, 3};
      bwd_case(3, (sbnDataType_t)d, (sbnLayout_t)lay, 300, 3, n1, 1, (sbnGradMode_t)lay, 0,
               GEN_NORMAL, 2900u + (uint64_t)(d * 2 + lay));
      CHECK_();
      int64_t n2[MAXW] = {1, 0, 2, 1};
      bwd_case(4, (sbnDataType_t)d, (sbnLayout_t)lay, 65, 257, n2, lay, (sbnGradMode_t)(1 - lay),
               0, GEN_NORMAL, 2910u + (uint64_t)(d * 2 + lay));
      CHECK_();
    }
}

/* ---- finite differences ------------------------------------------------------------- */
/* L = sum over ranks and elements of y * g, y from the double reference forward. */
static double fd_loss(team_t* t, const float* w, const float* b, void* const* g) {
  double mean[8], invstd[8], varu[8];
  double* ys[MAXW] = {0};
  const void* xs[MAXW];
  int64_t m;
  for (int r = 0; r < t->W; r++) {
    xs[r] = t->x[r];
    ys[r] = dvec(sbn_ref_numel(&t->d[r]) + 1);
  }
  sbn_ref_forward(t->W, t->d, xs, w, b, (double)1e-5f, mean, invstd, varu, &m, ys);
  double l = 0.0;
  for (int r = 0; r < t->W; r++) {
    for (int64_t i = 0; i < sbn_ref_numel(&t->d[r]); i++) l += ys[r][i] * ((const float*)g[r])[i];
    free(ys[r]);
  }
  return l;
}

/* Central differences of the reference forward, h = 2^-10 (x + h, w + h are exact in
   fp32 for these magnitudes, so the perturbation is exactly h). Error budget: truncation
   h^2/6 * |L'''| with unit-scale data and M = 9 per channel is ~1e-5; double rounding
   ~1e-16 * |L| / h ~ 1e-12; the library's fp32 gradients ~1e-6. A tolerance of 1e-3
   absolute + 1e-3 relative keeps a ~50x margin, while a wrong or missing term of the
   backward formula (mean_dy, the xmu projection, invstd power) is off by O(0.01-1)
   (checked: dropping one invstd factor from the reference's dx fails here). Measured:
   the worst element uses ~1e-4 of this tolerance. */
static void test_finite_differences(void) {
  const double h = 1.0 / 1024.0, fatol = 1e-3, frtol = 1e-3;
  for (int lay = 0; lay < 2; lay++) {
    int64_t n[MAXW] = {2, 1};
    team_t t;
    sbnParams_t p = params(sbnGradGlobal);
    team_make(&t, 2, sbnFloat32, (sbnLayout_t)lay, 2, 3, n, 1, 1, GEN_NORMAL, 2800u + (uint64_t)lay);
    fwd_bwd(&t, &p, MODE_GROUP, 0, tol_for(sbnFloat32)); /* dy = g */
    CHECK_();
    /* the reference's own dx, to check the reference against differences too */
    double *rdx[MAXW] = {dvec(18), dvec(18)}, mean[2], invstd[2], dwg[2], dbg[2];
    double rmean[2], rinv[2], rvar[2];
    int64_t m;
    const void* xs[MAXW] = {t.x0[0], t.x0[1]};
    const void* gs[MAXW] = {t.dy0[0], t.dy0[1]};
    sbn_ref_forward(2, t.d, xs, NULL, NULL, (double)1e-5f, rmean, rinv, rvar, &m, NULL);
    for (int ci = 0; ci < 2; ci++) mean[ci] = rmean[ci], invstd[ci] = rinv[ci];
    sbn_ref_backward(2, t.d, xs, gs, t.w, mean, invstd, rdx, NULL, NULL, dwg, dbg);
    for (int r = 0; r < 2; r++)
      for (int64_t i = 0; i < sbn_ref_numel(&t.d[r]); i++) {
        float* xr = (float*)t.x[r];
        float x0 = xr[i];
        xr[i] = (float)(x0 + h);
        double lp = fd_loss(&t, t.w, t.b, t.dy0);
        xr[i] = (float)(x0 - h);
        double lm = fd_loss(&t, t.w, t.b, t.dy0);
        xr[i] = x0;
        double fd = (lp - lm) / (2.0 * h);
        ASSERT_CLOSE(((float*)t.dx[r])[i], fd, fatol, frtol);
        ASSERT_CLOSE(rdx[r][i], fd, fatol, frtol);
      }
    for (int ci = 0; ci < 2; ci++) {
      float w0 = t.w[ci], b0 = t.b[ci];
      t.w[ci] = (float)(w0 + h);
      double lp = fd_loss(&t, t.w, t.b, t.dy0);
      t.w[ci] = (float)(w0 - h);
      double lm = fd_loss(&t, t.w, t.b, t.dy0);
      t.w[ci] = w0;
      ASSERT_CLOSE(t.dw[0][ci], (lp - lm) / (2.0 * h), fatol, frtol);
      ASSERT_CLOSE(t.dw[1][ci], (lp - lm) / (2.0 * h), fatol, frtol);
      t.b[ci] = (float)(b0 + h);
      lp = fd_loss(&t, t.w, t.b, t.dy0);
      t.b[ci] = (float)(b0 - h);
      lm = fd_loss(&t, t.w, t.b, t.dy0);
      t.b[ci] = b0;
      ASSERT_CLOSE(t.db[0][ci], (lp - lm) / (2.0 * h), fatol, frtol);
      ASSERT_CLOSE(t.db[1][ci], (lp - lm) / (2.0 * h), fatol, frtol);
    }
    free(rdx[0]), free(rdx[1]);
    team_free(&t);
  }
}

/* A channel of values of standard deviation ~4e-20 with eps = 1e-44: var + eps ~ 1.6e-39
   is below FLT_MIN, invstd ~ 2.5e19 is finite but its square is beyond FLT_MAX. dx (~1e20,
   within fp32's range) must be finite and within the fp32 tolerance of the float64
   reference (computed, as check_backward's, from the library's saved statistics), on the
   scale of the channel's dx: the same data at standard deviation 1 is held to 1e-4 / 1e-4,
   every term scales with invstd, and none is subnormal once the coefficient is computed as
   invstd * (invstd * sum(dy (x - mean)) / M). With invstd^2 computed first every dx was inf.
   A one-rank CPU team: the arithmetic is kernels/bn_math.h's, which every path runs. */
static void test_backward_tiny_variance(void) {
  enum { N = 4, C = 2, SP = 25, E = N * C * SP };
  const sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, N, C, SP};
  float x[E], dy[E], y[E], dx[E], w[C] = {1.0f, 0.5f}, b[C] = {0.0f, 0.25f};
  float mean[C], invstd[C], dw[C], db[C];
  sbn_rng_t rng = {77};
  for (int i = 0; i < E; i++) {
    x[i] = (float)(sbn_rng_normal(&rng) * 4e-20);
    dy[i] = (float)sbn_rng_normal(&rng);
  }
  sbnParams_t p = SBN_PARAMS_DEFAULT;
  p.eps = 1e-44f; /* a subnormal: 1.0e-44 as a float */
  sbnComm_t comm;
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  ASSERT_OK(sbnCommInitCpu(&comm, 1, &cfg));
  ASSERT_OK(sbnForwardTrain(comm, &d, x, y, w, b, NULL, NULL, NULL, mean, invstd, &p, NULL));
  ASSERT_OK(sbnBackward(comm, &d, x, dy, dx, w, mean, invstd, dw, db, &p, NULL));
  ASSERT_OK(sbnCommDestroy(comm));
  for (int c = 0; c < C; c++) {
    double s = 0.0, q = 0.0, sdy = 0.0, sdyx = 0.0, big = 0.0;
    const double m = N * SP;
    for (int n = 0; n < N; n++)
      for (int i = 0; i < SP; i++) s += x[(n * C + c) * SP + i];
    const double mu = s / m;
    for (int n = 0; n < N; n++)
      for (int i = 0; i < SP; i++) {
        const int at = (n * C + c) * SP + i;
        q += (x[at] - mu) * (x[at] - mu);
        sdy += dy[at];
        sdyx += dy[at] * (x[at] - mu);
      }
    /* the statistics against float64 (var ~1.6e-39 is subnormal in fp32: ulp 1.4e-45,
       ~1e-6 of it), then the reference dx from the library's own */
    EXPECT_TRUE(fabs(mean[c] - mu) <= 1e-5 * sqrt(q / m));
    EXPECT_TRUE(fabs(invstd[c] - 1.0 / sqrt(q / m + (double)p.eps)) <= 1e-5 / sqrt(q / m + (double)p.eps));
    const double inv = invstd[c];
    EXPECT_TRUE(inv > 1e19 && inv * inv > (double)FLT_MAX); /* the case: invstd^2 overflows */
    const double mu_lib = mean[c];
    sdyx = 0.0;
    for (int n = 0; n < N; n++)
      for (int i = 0; i < SP; i++) sdyx += dy[(n * C + c) * SP + i] * (x[(n * C + c) * SP + i] - mu_lib);
    double ref[N * SP];
    for (int n = 0; n < N; n++)
      for (int i = 0; i < SP; i++) {
        const int at = (n * C + c) * SP + i;
        ref[n * SP + i] = w[c] * inv * (dy[at] - sdy / m - (x[at] - mu_lib) * inv * inv * sdyx / m);
        if (fabs(ref[n * SP + i]) > big) big = fabs(ref[n * SP + i]);
      }
    EXPECT_TRUE(big > 1e18 && big < 1e37);
    int bad = 0;
    for (int n = 0; n < N; n++)
      for (int i = 0; i < SP; i++) {
        const double got = dx[(n * C + c) * SP + i], want = ref[n * SP + i];
        if (!(fabs(got - want) <= 1e-4 * big + 1e-4 * fabs(want))) {
          if (bad++ < 3) fprintf(stderr, "  channel %d, dx[%d] = %g, float64 %g\n", c, n * SP + i, got, want);
        }
      }
    EXPECT_TRUE(bad == 0);
    /* dbias = sum dy; dweight = sum dy (x - mean) invstd: ~1 in magnitude */
    EXPECT_TRUE(fabs(db[c] - sdy) <= 1e-4 + 1e-4 * fabs(sdy));
    EXPECT_TRUE(fabs(dw[c] - sdyx * inv) <= 1e-4 + 1e-4 * fabs(sdyx * inv));
  }
}

int main(void) {
  SBN_RUN(test_backward_vs_ref_fp32);
  SBN_RUN(test_backward_uneven_empty);
  SBN_RUN(test_backward_dtypes);
  SBN_RUN(test_global_is_sum_of_local);
  SBN_RUN(test_null_outputs);
  SBN_RUN(test_dx_in_place);
  SBN_RUN(test_backward_all_empty);
  SBN_RUN(test_backward_determinism);
  SBN_RUN(test_backward_larger_shapes);
  SBN_RUN(test_finite_differences);
  SBN_RUN(test_backward_tiny_variance);
  team_comms_destroy();
  return sbn_test_exit();
}
