/* test_forward.c — sbnForwardTrain on CPU teams (and sbnForwardInference on host
 * memory) against the double-precision reference over the concatenated batch.
 * Tolerances: see tol_for() in team_util.h (DESIGN.md's) and the comments where a test
 * departs from them.
 */
#include "team_util.h"

static const int kW[] = {1, 2, 3, 4, 8};
#define NW ((int)(sizeof kW / sizeof kW[0]))

static sbnParams_t params(float eps, float momentum) {
  sbnParams_t p = SBN_PARAMS_DEFAULT;
  p.eps = eps;
  p.momentum = momentum;
  return p;
}

/* One forward of a team built from the arguments, checked against the reference. */
static void one_case(int W, sbnDataType_t dt, sbnLayout_t lay, int64_t c, int64_t sp,
                     const int64_t* n, int affine, int running, gen_t g, const sbnParams_t* p,
                     tol_t tol, uint64_t seed) {
  team_t t;
  team_make(&t, W, dt, lay, c, sp, n, affine, running, g, seed);
  forward_and_check(&t, MODE_GROUP, 0, p, tol);
  team_free(&t);
}

static void test_team_equals_concat_fp32(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  for (int lay = 0; lay < 2; lay++)
    for (int i = 0; i < NW; i++) {
      int64_t n[MAXW] = {2, 2, 2, 2, 2, 2, 2, 2};
      one_case(kW[i], sbnFloat32, (sbnLayout_t)lay, 3, 5, n, 1, 1, GEN_NORMAL, &p,
               tol_for(sbnFloat32), 100u + (uint64_t)(i * 2 + lay));
      CHECK_();
    }
}

/* A team of W ranks with batch b each against ONE rank holding the concatenated batch:
   equal to the statistics tolerance (different reduction trees, not bitwise). */
static void test_team_vs_single_rank(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  for (int i = 1; i < NW; i++) {
    int W = kW[i];
    int64_t n[MAXW] = {3, 3, 3, 3, 3, 3, 3, 3}, nc = 3 * (int64_t)W;
    team_t t, one;
    team_make(&t, W, sbnFloat32, sbnLayoutNCHW, 4, 6, n, 1, 1, GEN_NORMAL, 200u + (uint64_t)W);
    team_make(&one, 1, sbnFloat32, sbnLayoutNCHW, 4, 6, &nc, 1, 1, GEN_NORMAL, 1);
    /* NCHW: the concatenation along N is the ranks' buffers one after the other */
    size_t off = 0;
    for (int r = 0; r < W; r++) {
      memcpy((char*)one.x[0] + off, t.x0[r], team_bytes(&t, r));
      memcpy((char*)one.x0[0] + off, t.x0[r], team_bytes(&t, r));
      off += team_bytes(&t, r);
    }
    memcpy(one.w, t.w, 4 * sizeof(float));
    memcpy(one.b, t.b, 4 * sizeof(float));
    memcpy(one.rm0, t.rm0, 4 * sizeof(float));
    memcpy(one.rv0, t.rv0, 4 * sizeof(float));
    team_reset_running(&one);
    forward_and_check(&t, MODE_GROUP, 0, &p, tol_for(sbnFloat32));
    forward_and_check(&one, MODE_GROUP, 0, &p, tol_for(sbnFloat32));
    for (int64_t ci = 0; ci < 4 && !sbn_test_cur_failed_; ci++) {
      ASSERT_CLOSE(t.smean[0][ci], one.smean[0][ci], 1e-5, 1e-5);
      ASSERT_CLOSE(t.sinv[0][ci], one.sinv[0][ci], 1e-5, 1e-5);
      ASSERT_CLOSE(t.rv[0][ci], one.rv[0][ci], 1e-5, 1e-5);
    }
    team_free(&t);
    team_free(&one);
    CHECK_();
  }
}

static void test_uneven_and_empty_ranks(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  struct { int W; int64_t n[MAXW]; int64_t sp; } cases[] = {
      {4, {3, 0, 1, 5}, 7},
      {3, {0, 4, 0}, 3},
      {8, {0, 0, 0, 1, 0, 0, 0, 0}, 3},       /* one rank holds everything, M = 3 */
      {3, {0, 2, 0}, 1},                      /* M = 2: the smallest valid count */
      {2, {1, 1}, 1},                         /* M = 2 split across ranks */
      {8, {1, 0, 2, 0, 3, 0, 4, 0}, 2},
      {2, {0, 7}, 4},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int lay = 0; lay < 2; lay++) {
      one_case(cases[k].W, sbnFloat32, (sbnLayout_t)lay, 5, cases[k].sp, cases[k].n, 1, 1,
               GEN_NORMAL, &p, tol_for(sbnFloat32), 300u + k * 2 + (uint64_t)lay);
      CHECK_();
    }
}

/* M == 0: success, save_mean = 0, save_invstd = 1/sqrtf(eps), running stats unchanged
   (bitwise), num_batches_tracked still + 1; x and y NULL on every rank. */
static void test_all_ranks_empty(void) {
  const float eps_list[] = {1e-5f, 1e-3f};
  const int ws[] = {1, 3, 8};
  for (int e = 0; e < 2; e++)
    for (int i = 0; i < 3; i++) {
      int64_t n[MAXW] = {0};
      sbnParams_t p = params(eps_list[e], e ? -1.0f : 0.1f);
      team_t t;
      team_make(&t, ws[i], sbnFloat32, sbnLayoutNHWC, 6, 4, n, 1, 1, GEN_NORMAL, 400u + (uint64_t)i);
      for (int call = 0; call < 2; call++) {
        ASSERT_OK(team_run(&t, 0, MODE_GROUP, 0, &p));
        for (int r = 0; r < t.W; r++) {
          ASSERT_EQ_INT(t.nbt[r], call + 1);
          ASSERT_MEMEQ(t.rm[r], t.rm0, 6 * sizeof(float));
          ASSERT_MEMEQ(t.rv[r], t.rv0, 6 * sizeof(float));
          for (int ci = 0; ci < 6; ci++) {
            ASSERT_BITEQ_F32(t.smean[r][ci], 0.0f);
            ASSERT_BITEQ_F32(t.sinv[r][ci], 1.0f / sqrtf(eps_list[e]));
          }
        }
      }
      team_free(&t);
    }
}

/* x = 1e4 + N(0,1): the statistics keep fp32 tolerance (var relative 1e-5 shows in
   invstd), and so does y: the library carries the mean as hi + lo (kernels/bn_math.h), so
   y = ((x - hi) - lo) * scale + b does not inherit fp32's 4.9e-4 resolution at 1e4 and
   meets the plain 1e-4/1e-4 output tolerance. save_mean itself is fp32: within 1 ulp. */
static void test_large_offset(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  tol_t tol = tol_for(sbnFloat32);
  for (int lay = 0; lay < 2; lay++) {
    int64_t n[MAXW] = {8, 3, 0, 9};
    team_t t;
    team_make(&t, 4, sbnFloat32, (sbnLayout_t)lay, 3, 100, n, 1, 1, GEN_OFFSET, 500u + (uint64_t)lay);
    forward_and_check(&t, MODE_GROUP, 0, &p, tol);
    const void* xs[MAXW] = {t.x0[0], t.x0[1], t.x0[2], t.x0[3]};
    double mean[3], invstd[3], varu[3];
    int64_t m;
    sbn_ref_forward(4, t.d, xs, NULL, NULL, 1e-5, mean, invstd, varu, &m, NULL);
    for (int ci = 0; ci < 3 && !sbn_test_cur_failed_; ci++) {
      EXPECT_TRUE(fabs(t.smean[0][ci] - mean[ci]) <= 9.8e-4); /* 1 ulp at 1e4 */
      ASSERT_CLOSE(t.sinv[0][ci], invstd[ci], 1e-5, 1e-5);
      ASSERT_CLOSE(t.rv[0][ci], 0.9 * t.rv0[ci] + 0.1 * varu[ci], 1e-5, 1e-5);
    }
    team_free(&t);
    CHECK_();
  }
}

/* fp16 input near the top of its range (6e4 +- 4000, and U(-6e4, 6e4)): statistics are
   accumulated in fp32, so nothing overflows (x^2 would overflow fp16 at 256); check_forward
   asserts y finite and everything within tolerance. */
static void test_fp16_large_values(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  const gen_t gens[] = {GEN_F16HIGH, GEN_F16SPREAD};
  for (int g = 0; g < 2; g++)
    for (int lay = 0; lay < 2; lay++) {
      int64_t n[MAXW] = {4, 2, 5};
      team_t t;
      team_make(&t, 3, sbnFloat16, (sbnLayout_t)lay, 3, 33, n, 1, 1, gens[g], 600u + (uint64_t)(g * 2 + lay));
      forward_and_check(&t, MODE_GROUP, 0, &p, tol_for(sbnFloat16));
      for (int ci = 0; ci < 3 && !sbn_test_cur_failed_; ci++) {
        EXPECT_TRUE(isfinite(t.smean[0][ci]) && isfinite(t.sinv[0][ci]) && t.sinv[0][ci] > 0.0f);
        EXPECT_TRUE(isfinite(t.rm[0][ci]) && isfinite(t.rv[0][ci]));
      }
      team_free(&t);
      CHECK_();
    }
}

static void test_dtypes(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  const sbnDataType_t dts[] = {sbnFloat16, sbnBFloat16};
  for (int d = 0; d < 2; d++)
    for (int lay = 0; lay < 2; lay++)
      for (int i = 0; i < NW; i += 2) { /* W = 1, 3, 8 */
        int64_t n[MAXW] = {2, 1, 3, 0, 2, 2, 1, 2};
        one_case(kW[i], dts[d], (sbnLayout_t)lay, 4, 9, n, (i + lay) % 2 == 0, 1, GEN_NORMAL, &p,
                 tol_for(dts[d]), 700u + (uint64_t)(d * 100 + lay * 10 + i));
        CHECK_();
      }
  /* bf16 with a wide spread */
  int64_t n[MAXW] = {3, 4};
  one_case(2, sbnBFloat16, sbnLayoutNHWC, 3, 16, n, 1, 1, GEN_F16SPREAD, &p,
           tol_for(sbnBFloat16), 750u);
}

/* NCHW and NHWC of the same data: bitwise-identical statistics and (element for element)
   outputs. */
static void test_nchw_equals_nhwc_bitwise(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  const sbnDataType_t dts[] = {sbnFloat32, sbnFloat16, sbnBFloat16};
  for (int d = 0; d < 3; d++) {
    int64_t n[MAXW] = {2, 0, 3};
    team_t a, b;
    team_make(&a, 3, dts[d], sbnLayoutNCHW, 5, 12, n, 1, 1, GEN_NORMAL, 800u + (uint64_t)d);
    team_make_transposed(&b, &a);
    forward_and_check(&a, MODE_GROUP, 0, &p, tol_for(dts[d]));
    forward_and_check(&b, MODE_GROUP, 0, &p, tol_for(dts[d]));
    size_t cb = 5 * sizeof(float), es = dt_size(dts[d]);
    for (int r = 0; r < 3 && !sbn_test_cur_failed_; r++) {
      ASSERT_MEMEQ(a.smean[r], b.smean[r], cb);
      ASSERT_MEMEQ(a.sinv[r], b.sinv[r], cb);
      ASSERT_MEMEQ(a.rm[r], b.rm[r], cb);
      ASSERT_MEMEQ(a.rv[r], b.rv[r], cb);
      for (int64_t ni = 0; ni < n[r]; ni++)
        for (int64_t ci = 0; ci < 5; ci++)
          for (int64_t si = 0; si < 12; si++) {
            int64_t ia = sbn_ref_index(&a.d[r], ni, ci, si), ib = sbn_ref_index(&b.d[r], ni, ci, si);
            if (memcmp((char*)a.y[r] + ia * es, (char*)b.y[r] + ib * es, es) != 0) {
              SBN_FAIL_("dtype %d: y differs between NCHW and NHWC at rank %d (%" PRId64
                        ",%" PRId64 ",%" PRId64 ")", d, r, ni, ci, si);
              goto out;
            }
          }
    }
  out:
    team_free(&a);
    team_free(&b);
    CHECK_();
  }
}

/* Several calls with fresh inputs: running stats follow the reference, num_batches_tracked
   counts 0 -> k. momentum < 0: cumulative average (factor 1/(nbt+1)). */
static void several_calls(float momentum, int W, uint64_t seed) {
  sbnParams_t p = params(1e-5f, momentum);
  int64_t n[MAXW] = {2, 3, 1, 2, 2, 2, 2, 2};
  team_t t;
  sbn_rng_t rng = {seed};
  team_make(&t, W, sbnFloat32, sbnLayoutNCHW, 3, 10, n, 1, 1, GEN_NORMAL, seed);
  for (int k = 0; k < 5 && !sbn_test_cur_failed_; k++) {
    if (k) team_new_inputs(&t, &rng, GEN_NORMAL);
    forward_and_check(&t, MODE_GROUP, 0, &p, tol_for(sbnFloat32));
    for (int r = 0; r < W && !sbn_test_cur_failed_; r++) ASSERT_EQ_INT(t.nbt[r], k + 1);
  }
  team_free(&t);
}
static void test_momentum_cumulative(void) {
  several_calls(-1.0f, 3, 900);
  CHECK_();
  several_calls(-0.5f, 1, 901);
}
static void test_momentum_several_calls(void) {
  several_calls(0.1f, 4, 910);
  CHECK_();
  several_calls(0.0f, 2, 911); /* running stats never move */
  CHECK_();
  several_calls(1.0f, 2, 912); /* running stats = this batch's */
}

/* momentum = 1: running = (1 - 1) * running + 1 * batch is the batch's statistic exactly,
   however far the old one was (1e8 here: a stale statistic). So running_mean is save_mean
   bit for bit on every rank, and running_var the reference's unbiased variance (the
   forward's check). An update computed as running + factor * (batch - running), equal in
   exact arithmetic, loses the batch's value to the 1e8 and fails both. */
static void test_momentum_one_forgets_the_old_stats(void) {
  sbnParams_t p = params(1e-5f, 1.0f);
  int64_t n[MAXW] = {2, 3};
  team_t t;
  team_make(&t, 2, sbnFloat32, sbnLayoutNCHW, 3, 10, n, 1, 1, GEN_NORMAL, 913);
  for (int64_t ci = 0; ci < 3; ci++) t.rm0[ci] = 1e8f, t.rv0[ci] = 1e8f;
  team_reset_running(&t);
  forward_and_check(&t, MODE_GROUP, 0, &p, tol_for(sbnFloat32));
  for (int r = 0; r < 2 && !sbn_test_cur_failed_; r++)
    for (int ci = 0; ci < 3; ci++) ASSERT_BITEQ_F32(t.rm[r][ci], t.smean[r][ci]);
  team_free(&t);
}

/* The params are each rank's own (syncbn.h, sbnParams_t): ranks that pass different eps
   and momentum share the team's mean and variance and each use their own eps for
   save_invstd and y, and their own momentum (a cumulative one included) for their running
   statistics, against the double reference over the concatenated batch. fp32 statistics of
   48 values per channel: 1e-5 relative covers their rounding (tol_for's). */
static void test_params_are_each_ranks(void) {
  enum { W = 3, N = 2, C = 3, SP = 8 };
  const float eps[W] = {1e-5f, 0.5f, 2.0f}, mom[W] = {0.1f, 0.9f, -1.0f};
  float x[W][N * C * SP], y[W][N * C * SP], sm[W][C], si[W][C], rm[W][C], rv[W][C];
  int64_t nbt[W] = {0, 0, 3};
  sbn_rng_t rng = {4242};
  for (int r = 0; r < W; r++) {
    for (int i = 0; i < N * C * SP; i++) x[r][i] = (float)(sbn_rng_normal(&rng) * (1.0 + r) + 0.5 * r);
    for (int c = 0; c < C; c++) rm[r][c] = 0.25f, rv[r][c] = 2.0f;
  }
  sbnComm_t* comms = team_comms(W);
  const sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, N, C, SP};
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < W; r++) {
    sbnParams_t p = params(eps[r], mom[r]);
    ASSERT_OK(sbnForwardTrain(comms[r], &d, x[r], y[r], NULL, NULL, rm[r], rv[r], &nbt[r], sm[r], si[r], &p, NULL));
  }
  ASSERT_OK(sbnGroupEnd());
  for (int c = 0; c < C; c++) {
    double s = 0.0, q = 0.0;
    const int M = W * N * SP;
    for (int r = 0; r < W; r++)
      for (int n = 0; n < N; n++)
        for (int i = 0; i < SP; i++) s += x[r][(n * C + c) * SP + i];
    const double mean = s / M;
    for (int r = 0; r < W; r++)
      for (int n = 0; n < N; n++)
        for (int i = 0; i < SP; i++) q += (x[r][(n * C + c) * SP + i] - mean) * (x[r][(n * C + c) * SP + i] - mean);
    const double var = q / M;
    for (int r = 0; r < W; r++) {
      const double inv = 1.0 / sqrt(var + eps[r]);
      const double f = mom[r] < 0.0f ? 1.0 / (3.0 + 1.0) : mom[r];
      const double want[4] = {mean, inv, (1 - f) * 0.25 + f * mean, (1 - f) * 2.0 + f * var * M / (M - 1)};
      const float got[4] = {sm[r][c], si[r][c], rm[r][c], rv[r][c]};
      ASSERT_CLOSE_ARRAY(got, want, 4, 1e-6, 1e-5);
      double yref[N * SP];
      float ygot[N * SP];
      for (int n = 0; n < N; n++)
        for (int i = 0; i < SP; i++) {
          yref[n * SP + i] = (x[r][(n * C + c) * SP + i] - mean) * inv;
          ygot[n * SP + i] = y[r][(n * C + c) * SP + i];
        }
      ASSERT_CLOSE_ARRAY(ygot, yref, N * SP, 1e-5, 1e-5);
    }
  }
  for (int r = 1; r < W; r++) ASSERT_MEMEQ(sm[r], sm[0], sizeof sm[0]); /* the team's mean, bitwise */
  EXPECT_TRUE(nbt[0] == 1 && nbt[1] == 1 && nbt[2] == 4);
}

/* affine=False (weight = bias = NULL) and no running stats (NULL), nbt NULL. */
static void test_no_affine_no_running(void) {
  sbnParams_t p = params(1e-3f, 0.1f);
  for (int d = 0; d < 3; d++) {
    int64_t n[MAXW] = {2, 1, 0, 4};
    team_t t;
    team_make(&t, 4, (sbnDataType_t)d, (sbnLayout_t)(d % 2), 6, 5, n, 0, 0, GEN_NORMAL, 1000u + (uint64_t)d);
    t.nbt_null = 1;
    forward_and_check(&t, MODE_GROUP, 0, &p, tol_for((sbnDataType_t)d));
    team_free(&t);
    CHECK_();
  }
  /* affine without running stats, running stats without affine */
  int64_t n[MAXW] = {3, 2};
  one_case(2, sbnFloat32, sbnLayoutNHWC, 3, 4, n, 1, 0, GEN_NORMAL, &p, tol_for(sbnFloat32), 1010);
  CHECK_();
  one_case(2, sbnFloat32, sbnLayoutNCHW, 3, 4, n, 0, 1, GEN_NORMAL, &p, tol_for(sbnFloat32), 1011);
}

/* y == x (in place) gives the same as out of place, bitwise. */
static void test_in_place(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  for (int d = 0; d < 3; d++) {
    int64_t n[MAXW] = {3, 0, 2};
    team_t a, b;
    team_make(&a, 3, (sbnDataType_t)d, sbnLayoutNHWC, 4, 7, n, 1, 1, GEN_NORMAL, 1100u + (uint64_t)d);
    team_make(&b, 3, (sbnDataType_t)d, sbnLayoutNHWC, 4, 7, n, 1, 1, GEN_NORMAL, 1100u + (uint64_t)d);
    forward_and_check(&a, MODE_GROUP, OPT_INPLACE, &p, tol_for((sbnDataType_t)d));
    forward_and_check(&b, MODE_GROUP, 0, &p, tol_for((sbnDataType_t)d));
    if (!sbn_test_cur_failed_) check_same_forward(&a, &b);
    team_free(&a);
    team_free(&b);
    CHECK_();
  }
}

/* Repeating a call on the same inputs: bitwise-identical outputs (rank agreement is
   checked by every forward_and_check). Thread-per-rank mode == group mode, bitwise. */
static void test_determinism_and_thread_mode(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  for (int i = 0; i < NW; i++) {
    int W = kW[i];
    int64_t n[MAXW] = {3, 1, 4, 0, 2, 5, 1, 2};
    team_t a, b;
    team_make(&a, W, sbnFloat32, (sbnLayout_t)(i % 2), 5, 11, n, 1, 1, GEN_NORMAL, 1200u + (uint64_t)i);
    team_make(&b, W, sbnFloat32, (sbnLayout_t)(i % 2), 5, 11, n, 1, 1, GEN_NORMAL, 1200u + (uint64_t)i);
    forward_and_check(&a, MODE_GROUP, 0, &p, tol_for(sbnFloat32));
    forward_and_check(&b, MODE_THREADS, 0, &p, tol_for(sbnFloat32));
    if (!sbn_test_cur_failed_) check_same_forward(&a, &b);
    /* again in group mode on the same inputs */
    team_reset_running(&b);
    team_poison(&b);
    forward_and_check(&b, MODE_GROUP, 0, &p, tol_for(sbnFloat32));
    if (!sbn_test_cur_failed_) check_same_forward(&a, &b);
    team_free(&a);
    team_free(&b);
    CHECK_();
  }
}

/* BatchNorm1d on (N, C): spatial = 1. */
static void test_bn1d(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  for (int lay = 0; lay < 2; lay++) {
    int64_t n[MAXW] = {2, 3, 1, 4};
    one_case(4, sbnFloat32, (sbnLayout_t)lay, 7, 1, n, 1, 1, GEN_NORMAL, &p, tol_for(sbnFloat32),
             1300u + (uint64_t)lay);
    CHECK_();
    one_case(4, sbnBFloat16, (sbnLayout_t)lay, 7, 1, n, 0, 1, GEN_NORMAL, &p,
             tol_for(sbnBFloat16), 1310u + (uint64_t)lay);
    CHECK_();
  }
}

/* Shapes past the library's internal blocking (runs of 256 elements, channel blocks of
   64 and 256, chunks of 32): many channels in both layouts, long spatial rows. */
static void test_larger_shapes(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  const sbnDataType_t dts[] = {sbnFloat32, sbnBFloat16};
  for (int d = 0; d < 2; d++)
    for (int lay = 0; lay < 2; lay++) {
      int64_t n1[MAXW] = {2, 1, 3};
      one_case(3, dts[d], (sbnLayout_t)lay, 300, 3, n1, 1, 1, GEN_NORMAL, &p, tol_for(dts[d]),
               1500u + (uint64_t)(d * 2 + lay));
      CHECK_();
      int64_t n2[MAXW] = {2, 3};
      one_case(2, dts[d], (sbnLayout_t)lay, 3, 700, n2, 1, 1, GEN_NORMAL, &p, tol_for(dts[d]),
               1510u + (uint64_t)(d * 2 + lay));
      CHECK_();
      int64_t n3[MAXW] = {1, 0, 2, 1};
      one_case(4, dts[d], (sbnLayout_t)lay, 65, 257, n3, 1, 1, GEN_NORMAL, &p, tol_for(dts[d]),
               1520u + (uint64_t)(d * 2 + lay));
      CHECK_();
    }
}

/* A global count past 2^24 (where fp32 stops counting exactly): M = 2 * (2^23 + 5), one
   channel, x = 1e4 + N(0,1). Statistics to tolerance, running_var's unbiased factor from
   the exact integer M. */
static void test_count_past_2_24(void) {
  sbnParams_t p = params(1e-5f, 1.0f); /* running = this batch */
  int64_t n[MAXW] = {1, 1};
  team_t t;
  team_make(&t, 2, sbnFloat32, sbnLayoutNCHW, 1, (1 << 23) + 5, n, 1, 1, GEN_OFFSET, 1600);
  team_drop_backward(&t);
  forward_and_check(&t, MODE_GROUP, 0, &p, tol_for(sbnFloat32));
  team_free(&t);
}

/* Two ranks far apart and of very uneven size: one element of 1e4 (then 3e16) and 2^20
   of N(0, 1), in both orders. The cross-rank merge moved the mean from the first rank by
   delta times the second's share (~1): its rounding, ~u * 1e4 = 6e-4, was 3 times the
   mean's tolerance (1e-5 of the spread, ~9.8). It now moves from the larger rank. At
   3e16, M2's term formed as delta^2 * big * share overflowed (save_invstd 0, running_var
   inf); it is formed as (delta * share) * delta * big. */
static void test_uneven_ranks_far_apart(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  for (int k = 0; k < 4; k++) {
    const int big_first = k % 2;
    const int64_t big = (int64_t)1 << 20;
    int64_t n[MAXW] = {big_first ? big : 1, big_first ? 1 : big};
    team_t t;
    team_make(&t, 2, sbnFloat32, sbnLayoutNCHW, 1, 1, n, 1, 1, GEN_NORMAL, 1700u + (uint64_t)big_first);
    team_drop_backward(&t);
    const int one = big_first ? 1 : 0;
    ((float*)t.x[one])[0] = ((float*)t.x0[one])[0] = k < 2 ? 1.0e4f : 3.0e16f;
    forward_and_check(&t, MODE_GROUP, 0, &p, tol_tight_fp32());
    team_free(&t);
    CHECK_();
  }
}

/* An outlier as a rank's first element: 2^22 elements of 1e4 + N(0, 1) after a first
   one of 1000. The CPU team shifted the whole channel by its first element, so its fp32
   Welford mean carried u * 9000 (5e-4; y off by 1.3e-4, 13 times its tolerance); each
   chunk of 32 is shifted by its own first element now, as each GPU thread's run is. */
static void test_outlier_first(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  int64_t n[MAXW] = {1};
  team_t t;
  team_make(&t, 1, sbnFloat32, sbnLayoutNCHW, 1, (int64_t)1 << 22, n, 1, 1, GEN_OFFSET, 1710);
  team_drop_backward(&t);
  ((float*)t.x[0])[0] = ((float*)t.x0[0])[0] = 1000.0f;
  forward_and_check(&t, MODE_GROUP, 0, &p, tol_tight_fp32());
  team_free(&t);
}

/* An outlier at the start of every run: chunks of 32 values [0, D x 31] (D = 1.1046652:
   each Welford update of the chunk's mean rounds by u |mean - 0| of one sign), repeated
   over the channel (identical chunks merge exactly, so one chunk's error is the
   channel's), at W = 1 and over 8 uneven ranks: the mean y implies within 4 u sigma of
   the exact one (tolerances.md, "The forward's mean"; 0.4 measured). With the shift the
   chunk's first element for the whole chunk it was 38 u sigma (a review's case: y off by
   3e-6 at |y| <= 5.6, within y's tolerance, 1e-5, which this does not rely on). */
static void test_outlier_first_in_every_chunk(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  const float D = 0x1.1acb56p+0f;
  for (int W = 1; W <= 8; W += 7) {
    int64_t n[MAXW] = {0};
    for (int r = 0; r < W; r++) n[r] = W == 1 ? 8 : 1 + (r % 3 == 0);
    team_t t;
    team_make(&t, W, sbnFloat32, sbnLayoutNCHW, 1, 32 * 512, n, 0, 1, GEN_NORMAL, 1715);
    team_drop_backward(&t);
    for (int r = 0; r < W; r++)
      for (int64_t k = 0; k < n[r] * 32 * 512; k++)
        ((float*)t.x[r])[k] = ((float*)t.x0[r])[k] = k % 32 == 0 ? 0.0f : D;
    forward_and_check(&t, MODE_GROUP, 0, &p, tol_tight_fp32());
    double e;
    implied_mean_errors_u(&t, &p, &e);
    if (fabs(e) > 4.0) SBN_FAIL_("W = %d: the mean y implies is %.2f u sigma off (at most 4)", W, e);
    team_free(&t);
    if (sbn_test_cur_failed_) return;
  }
}

/* The backward (team gradient sums) of a team of two channels whose channel 0 has
   save_invstd 0 (nothing to normalize by) and channel 1 a finite one: channel 0's dx and
   dweight are 0 and its dbias finite, channel 1's dx and dweight finite. */
static void check_zero_invstd_backward(const team_t* t) {
  for (int r = 0; r < t->W; r++) {
    ASSERT_TRUE(t->dw[r][0] == 0.0f && isfinite(t->db[r][0]) && isfinite(t->dw[r][1]));
    for (int64_t i = 0; i < t->d[r].n; i++)
      for (int64_t s = 0; s < t->d[r].spatial; s++) {
        ASSERT_TRUE(((const float*)t->dx[r])[sbn_ref_index(&t->d[r], i, 0, s)] == 0.0f);
        ASSERT_TRUE(isfinite(((const float*)t->dx[r])[sbn_ref_index(&t->d[r], i, 1, s)]));
      }
  }
}

/* eps = 0 and a constant channel (var 0), beside a varying one: save_invstd 0 and y the
   bias, as PyTorch's batch norm (its invstd is 0 where var and eps are both 0), where
   1 / sqrt(0) made save_invstd inf and y, and the backward's dx and dweight, NaN. The
   backward then gives dx 0 and dweight 0 for that channel. */
static void test_eps0_constant_channel(void) {
  sbnParams_t p = params(0.0f, 0.1f), pb = p;
  pb.grad_mode = sbnGradGlobal;
  int64_t n[MAXW] = {2, 3};
  team_t t;
  team_make(&t, 2, sbnFloat32, sbnLayoutNCHW, 2, 4, n, 1, 1, GEN_NORMAL, 1720);
  for (int r = 0; r < 2; r++)
    for (int64_t i = 0; i < n[r]; i++)
      for (int64_t s = 0; s < 4; s++) /* channel 0 of every element: 3 */
        ((float*)t.x[r])[i * 8 + s] = ((float*)t.x0[r])[i * 8 + s] = 3.0f;
  forward_and_check(&t, MODE_GROUP, 0, &p, tol_for(sbnFloat32));
  CHECK_();
  ASSERT_TRUE(t.sinv[0][0] == 0.0f && t.sinv[1][0] == 0.0f);
  ASSERT_TRUE(isfinite(t.sinv[0][1]) && t.sinv[0][1] > 0.0f);
  ASSERT_TRUE(t.rv[0][0] == 0.9f * t.rv0[0]); /* + 0.1 * an unbiased variance of 0 */
  for (int r = 0; r < 2; r++)
    for (int64_t i = 0; i < n[r]; i++)
      for (int64_t s = 0; s < 4; s++) ASSERT_TRUE(((float*)t.y[r])[i * 8 + s] == t.b[0]);
  ASSERT_OK(team_run(&t, 1, MODE_GROUP, 0, &pb));
  check_zero_invstd_backward(&t);
  team_free(&t);
}

/* A channel whose variance fits in fp32 but whose sum of squared deviations does not
   (docs/API.md, "Accuracy"): +-1.5e19 on each of two ranks (mean 0, biased variance
   2.25e38 < FLT_MAX, the sum 8 * 2.25e38 > FLT_MAX): save_invstd 0, y the bias, running_var
   +inf, the backward's dx and dweight 0 (also where dy * (x - mean) overflows), the call a
   success, no NaN anywhere; the other channel bit for bit what the same team gives without
   it. */
static void test_m2_overflow(void) {
  sbnParams_t p = params(1e-5f, 0.1f), pb = p;
  pb.grad_mode = sbnGradGlobal;
  int64_t n[MAXW] = {2, 2};
  team_t t, clean;
  team_make(&t, 2, sbnFloat32, sbnLayoutNCHW, 2, 2, n, 1, 1, GEN_NORMAL, 1730);
  team_make(&clean, 2, sbnFloat32, sbnLayoutNCHW, 2, 2, n, 1, 1, GEN_NORMAL, 1730);
  for (int r = 0; r < 2; r++)
    for (int64_t i = 0; i < 2; i++)
      for (int64_t s = 0; s < 2; s++) {
        const int64_t k = sbn_ref_index(&t.d[r], i, 0, s);
        ((float*)t.x[r])[k] = ((float*)t.x0[r])[k] = (i + s) % 2 ? -1.5e19f : 1.5e19f;
      }
  ASSERT_OK(team_run(&t, 0, MODE_GROUP, 0, &p));
  ASSERT_OK(team_run(&clean, 0, MODE_GROUP, 0, &p));
  for (int r = 0; r < 2; r++) {
    ASSERT_TRUE(isfinite(t.smean[r][0]) && t.sinv[r][0] == 0.0f);
    ASSERT_TRUE(isinf(t.rv[r][0]) && t.rv[r][0] > 0.0f && isfinite(t.rm[r][0]));
    ASSERT_BITEQ_F32(t.sinv[r][1], clean.sinv[r][1]);
    ASSERT_BITEQ_F32(t.rv[r][1], clean.rv[r][1]);
    for (int64_t i = 0; i < 2; i++)
      for (int64_t s = 0; s < 2; s++) {
        ASSERT_TRUE(((const float*)t.y[r])[sbn_ref_index(&t.d[r], i, 0, s)] == t.b[0]);
        const int64_t k = sbn_ref_index(&t.d[r], i, 1, s);
        ASSERT_BITEQ_F32(((const float*)t.y[r])[k], ((const float*)clean.y[r])[k]);
      }
  }
  ASSERT_OK(team_run(&t, 1, MODE_GROUP, 0, &pb));
  check_zero_invstd_backward(&t);
  /* and dy of 2^65 (~3.7e19) on that channel, whose dy * (x - mean) of ~5.5e38 overflow too: its
     sum is inf - inf = NaN, which 0 * made every dx and dweight NaN (sum_dy 2^68 fits, exactly) */
  for (int r = 0; r < 2; r++)
    for (int64_t i = 0; i < 2; i++)
      for (int64_t s = 0; s < 2; s++) {
        const int64_t k = sbn_ref_index(&t.d[r], i, 0, s);
        ((float*)t.dy[r])[k] = ((float*)t.dy0[r])[k] = 0x1p65f;
      }
  ASSERT_OK(team_run(&t, 1, MODE_GROUP, 0, &pb));
  check_zero_invstd_backward(&t);
  for (int r = 0; r < 2; r++) ASSERT_TRUE(t.db[r][0] == 0x1p68f);
  team_free(&t);
  team_free(&clean);
}

/* API.md's examples of an infinity among a channel's values (a CPU team, one rank, one
   channel, in both layouts): 1, 2, inf gives save_mean +inf, as PyTorch's mean (the
   infinity the last of a run of at most three); 1, inf, 2 (a value after it: the sum's
   correction is inf - inf) and 1, 2, 3, inf (the run re-centred at its fourth value) give
   NaN. save_invstd is NaN in every case, as PyTorch's variance. API.md said 1, 2, 3, inf
   gave +inf, which no test checked. */
static void test_infinity_in_a_short_run(void) {
  sbnComm_t c = NULL;
  ASSERT_OK(sbnCommInitCpu(&c, 1, NULL));
  const float runs[3][4] = {{1.0f, 2.0f, INFINITY}, {1.0f, INFINITY, 2.0f},
                            {1.0f, 2.0f, 3.0f, INFINITY}};
  const int64_t len[3] = {3, 3, 4};
  for (int k = 0; k < 3 && !sbn_test_cur_failed_; k++)
    for (int lay = 0; lay < 2 && !sbn_test_cur_failed_; lay++) {
      /* one channel: NCHW (1, 1, len) and NHWC (len, 1, 1) hold the values in this order */
      const sbnTensorDesc_t d = {sbnFloat32, (sbnLayout_t)lay, lay ? len[k] : 1, 1,
                                 lay ? 1 : len[k]};
      float y[4], sm = 0.0f, si = 0.0f;
      ASSERT_OK(sbnForwardTrain(c, &d, runs[k], y, NULL, NULL, NULL, NULL, NULL, &sm, &si, NULL, NULL));
      if (k == 0)
        EXPECT_TRUE(isinf(sm) && sm > 0.0f);
      else
        EXPECT_TRUE(isnan(sm));
      EXPECT_TRUE(isnan(si));
    }
  ASSERT_OK(sbnCommDestroy(c));
}

/* A NaN in one channel (on one rank) and an infinity in another: those channels' save_invstd,
   running_var and y are NaN on every rank, as PyTorch's batch norm gives NaN variances there
   (a running_var that stayed finite would hide the corruption: the clamp of a rounded m2 took
   a NaN to 0 until 2026-11-29); running_mean is not finite; the other channel is bit for bit
   what the same team gives without them, and num_batches_tracked counts the call. */
static void test_non_finite_values(void) {
  sbnParams_t p = params(1e-5f, 0.1f);
  for (int lay = 0; lay < 2; lay++) {
    int64_t n[MAXW] = {2, 3};
    team_t t, clean;
    team_make(&t, 2, sbnFloat32, (sbnLayout_t)lay, 3, 4, n, 1, 1, GEN_NORMAL, 650u + (uint64_t)lay);
    team_make(&clean, 2, sbnFloat32, (sbnLayout_t)lay, 3, 4, n, 1, 1, GEN_NORMAL, 650u + (uint64_t)lay);
    ((float*)t.x[1])[sbn_ref_index(&t.d[1], 2, 0, 1)] = NAN;
    ((float*)t.x[0])[sbn_ref_index(&t.d[0], 1, 1, 3)] = INFINITY;
    ASSERT_OK(team_run(&t, 0, MODE_GROUP, 0, &p));
    ASSERT_OK(team_run(&clean, 0, MODE_GROUP, 0, &p));
    for (int r = 0; r < 2; r++) {
      ASSERT_EQ_INT(t.nbt[r], 1);
      for (int ci = 0; ci < 2; ci++) {
        ASSERT_TRUE(isnan(t.sinv[r][ci]) && isnan(t.rv[r][ci]));
        ASSERT_TRUE(!isfinite(t.rm[r][ci]));
      }
      ASSERT_BITEQ_F32(t.smean[r][2], clean.smean[r][2]);
      ASSERT_BITEQ_F32(t.sinv[r][2], clean.sinv[r][2]);
      ASSERT_BITEQ_F32(t.rm[r][2], clean.rm[r][2]);
      ASSERT_BITEQ_F32(t.rv[r][2], clean.rv[r][2]);
      for (int64_t ni = 0; ni < n[r]; ni++)
        for (int64_t si = 0; si < 4; si++) {
          const float* y = (const float*)t.y[r];
          ASSERT_TRUE(isnan(y[sbn_ref_index(&t.d[r], ni, 0, si)]));
          ASSERT_TRUE(isnan(y[sbn_ref_index(&t.d[r], ni, 1, si)]));
          int64_t i = sbn_ref_index(&t.d[r], ni, 2, si);
          ASSERT_BITEQ_F32(y[i], ((const float*)clean.y[r])[i]);
        }
    }
    team_free(&t);
    team_free(&clean);
    CHECK_();
  }
}

/* Eval mode on host memory vs sbn_ref_inference. */
static void test_inference_host(void) {
  sbn_rng_t rng = {1400};
  for (int d = 0; d < 3; d++)
    for (int lay = 0; lay < 2; lay++)
      for (int affine = 0; affine < 2; affine++) {
        sbnTensorDesc_t desc = {(sbnDataType_t)d, (sbnLayout_t)lay, 3, 5, 6};
        int64_t ne = sbn_ref_numel(&desc);
        void* x = gen_tensor(&desc, &rng, GEN_NORMAL);
        void* y = malloc((size_t)ne * dt_size(desc.dtype));
        float w[5], b[5], rm[5], rv[5];
        for (int ci = 0; ci < 5; ci++) {
          w[ci] = (float)(sbn_rng_normal(&rng));
          b[ci] = (float)(sbn_rng_normal(&rng));
          rm[ci] = (float)(sbn_rng_normal(&rng));
          rv[ci] = (float)(0.3 + 2.0 * sbn_rng_uniform(&rng));
        }
        float eps = affine ? 1e-5f : 1e-2f;
        double* ref = dvec(ne);
        sbn_ref_inference(&desc, x, affine ? w : NULL, affine ? b : NULL, rm, rv, (double)eps, ref);
        sbnResult_t res = sbnForwardInference(&desc, x, y, affine ? w : NULL, affine ? b : NULL,
                                              rm, rv, eps, NULL);
        float* yf = widen_all(y, desc.dtype, ne);
        tol_t tol = tol_for(desc.dtype);
        int ok = res == sbnSuccess;
        if (!ok) SBN_FAIL_("sbnForwardInference: %s (%s)", sbnGetResultName(res), sbnGetLastError(NULL));
        else if (!sbn_check_close_array_("inference y", yf, ref, (size_t)ne, tol.out_atol,
                                         tol.out_rtol, __FILE__, __LINE__))
          sbn_test_failures_++, sbn_test_cur_failed_++;
        free(x), free(y), free(yf), free(ref);
        CHECK_();
      }
}

/* Inference keeps 1 / sqrt(running_var + eps) as PyTorch's eval does (API.md,
   "Semantics"): with running_var 0 and eps 0 that is infinite, so x - running_mean of 0
   gives NaN, of one sign +-inf; not the training rule's invstd of 0 for a variance of 0
   (which would give the bias everywhere). */
static void test_inference_zero_variance(void) {
  const sbnTensorDesc_t desc = {sbnFloat32, sbnLayoutNCHW, 1, 1, 4};
  const float x[4] = {1.0f, 2.0f, 0.5f, 1.0f}, w[1] = {1.0f}, b[1] = {0.25f}, rm[1] = {1.0f},
              rv[1] = {0.0f};
  float y[4] = {0};
  ASSERT_OK(sbnForwardInference(&desc, x, y, w, b, rm, rv, 0.0f, NULL));
  ASSERT_TRUE(isnan(y[0]) && isnan(y[3]));
  ASSERT_TRUE(isinf(y[1]) && y[1] > 0);
  ASSERT_TRUE(isinf(y[2]) && y[2] < 0);
}

int main(void) {
  SBN_RUN(test_team_equals_concat_fp32);
  SBN_RUN(test_team_vs_single_rank);
  SBN_RUN(test_uneven_and_empty_ranks);
  SBN_RUN(test_all_ranks_empty);
  SBN_RUN(test_large_offset);
  SBN_RUN(test_fp16_large_values);
  SBN_RUN(test_dtypes);
  SBN_RUN(test_nchw_equals_nhwc_bitwise);
  SBN_RUN(test_momentum_cumulative);
  SBN_RUN(test_momentum_several_calls);
  SBN_RUN(test_momentum_one_forgets_the_old_stats);
  SBN_RUN(test_infinity_in_a_short_run);
  SBN_RUN(test_params_are_each_ranks);
  SBN_RUN(test_no_affine_no_running);
  SBN_RUN(test_in_place);
  SBN_RUN(test_determinism_and_thread_mode);
  SBN_RUN(test_bn1d);
  SBN_RUN(test_non_finite_values);
  SBN_RUN(test_inference_host);
  SBN_RUN(test_inference_zero_variance);
  SBN_RUN(test_larger_shapes);
  SBN_RUN(test_count_past_2_24);
  SBN_RUN(test_uneven_ranks_far_apart);
  SBN_RUN(test_outlier_first);
  SBN_RUN(test_outlier_first_in_every_chunk);
  SBN_RUN(test_eps0_constant_channel);
  SBN_RUN(test_m2_overflow);
  team_comms_destroy();
  return sbn_test_exit();
}
