/* test_xmask.c — the activation's mask from x (sbnEpilogue_t.no_residual; kernels/bn_math.h:
 * sbn_xmask_sign), on the CPU.
 *
 * 1. The rule against the forward itself, element by element: y = dtype(act(v)), v the
 *    forward's sbn_forward_y(x, mean_hi, mean_lo, scale, bias); wherever sbn_xmask_sign is
 *    sure, the gradient it gives (sbn_act_grad_sign) must be bitwise what y gives
 *    (sbn_act_grad), for every dtype, ReLU and leaky ReLU (slopes 0.01 and 0). The inputs
 *    are built to sit on the rule's edges: x at and around the zero of v (consecutive values
 *    of the dtype), means far from 0 (mean_lo matters), spreads down to 1e-3, weights 0
 *    (v = bias), 1e-3 and 7, biases of 2^-26 (an fp16 y rounds it to 0) and -1e-30. The
 *    test counts, and requires, elements where the naive mask (the sign of fma(x - mean,
 *    scale, bias), no band) is wrong, and fp16 elements whose v > 0 stores as 0: without
 *    them the check could not fail on a rule with a band too narrow or no floor (the two
 *    mutants below build it so, and must fail).
 * 2. The band is narrow on ordinary data: below 1e-3 of the elements (N(mu, sd) with
 *    mu / sd up to 30), so a kernel that reads y only where the rule is not sure reads
 *    a few bytes of y per thousand elements.
 * 3. CPU teams: sbnBackwardEx with no_residual = 1 gives bitwise the gradients of
 *    no_residual = 0, with y poisoned (its sign flipped) wherever the rule is sure: so y is
 *    read only where it is not. The same poisoned y with no_residual = 0 must change the
 *    gradients (the poisoning is visible: the check can fail).
 * 4. The API: the first sbnEpilogue_t (16 bytes) is still read; no_residual other than 0 or
 *    1, and a reserved field not 0, are refused; a forward (training or inference) with z
 *    and no_residual = 1 is refused and writes nothing.
 *
 *    And x given as y's memory (allowed where only dbias and dz are asked for): no mask
 *    from x there (those values are y's), dbias as with no_residual = 0.
 *
 * Mutants (tests/CMakeLists.txt, WILL_FAIL): SBN_XMASK_SCALE 2^40 (this file's rule with a
 * band 2^19 times too narrow) fails 1 (and 3, whose poisoning then disagrees with the
 * library's rule); SBN_XMASK_LEAST_FLOOR 0 (no fp16 floor) fails 1; the CPU team built to
 * ignore no_residual (src/cpu/cpu_reduce.c, a source mutant) fails 3.
 */
#include <float.h>

#include "bn_dtype.h"
#include "bn_math.h"
#include "team_util.h"

static float to_dt(float v, int dt) {
  uint16_t h;
  if (dt == sbnFloat16) return sbn_f16_put(&h, 0, v), sbn_f16_get(&h, 0);
  if (dt == sbnBFloat16) return sbn_bf16_put(&h, 0, v), sbn_bf16_get(&h, 0);
  return v;
}

/* The next value of the dtype above x (dir 1) or below it (dir -1); x a value of it. */
static float step_dt(float x, int dt, int dir) {
  if (dt == sbnFloat32) return nextafterf(x, dir > 0 ? INFINITY : -INFINITY);
  if (dir < 0) return -step_dt(-x, dt, 1);
  uint16_t h = dt == sbnFloat16 ? sbn_f32_to_f16(x) : sbn_f32_to_bf16(x);
  if (h & 0x8000u)
    h = (h & 0x7fffu) == 0 ? 0x0001u : (uint16_t)(h - 1u); /* toward 0 (-0 to the least) */
  else
    h = (uint16_t)(h + 1u);
  return dt == sbnFloat16 ? sbn_f16_to_f32(h) : sbn_bf16_to_f32(h);
}

typedef struct {
  long sure, unsure, naive_wrong, underflow, bad;
} counts_t;

typedef struct {
  int act;
  float slope;
} act_t;
static const act_t kActs[] = {{SBN_ACT_RELU, 0.0f}, {SBN_ACT_LEAKY, 0.01f}, {SBN_ACT_LEAKY, 0.0f}};
static const int kDts[] = {sbnFloat32, sbnFloat16, sbnBFloat16};

/* One element: the rule against y. x is a value of the dtype. */
static void check_elem(int dt, act_t a, float x, float hi, float lo, float s, float b, counts_t* k) {
  const float v = sbn_forward_y(x, hi, lo, s, b);
  const float y = to_dt(sbn_act(a.act, a.slope, v), dt);
  const float gy = sbn_act_grad(a.act, a.slope, y, 1.0f);
  const float d = x - hi;
  const float naive = SBN_FMA(d, s, b);
  if (naive == naive && sbn_act_grad_sign(a.act, a.slope, naive > 0.0f ? 1 : -1, 1.0f) != gy) k->naive_wrong++;
  if (v > 0.0f && y == 0.0f) k->underflow++;
  const int sign = sbn_xmask_sign(d, s, b, hi, sbn_xmask_floor(sbn_dtype_least(dt)));
  if (sign == 0) {
    k->unsure++;
    return;
  }
  k->sure++;
  const float gs = sbn_act_grad_sign(a.act, a.slope, sign, 1.0f);
  if (memcmp(&gs, &gy, sizeof gs) != 0) {
    if (k->bad++ < 5)
      fprintf(stderr, "  %s act %d slope %g: x %.9g mean %.9g + %.3g scale %.9g bias %.9g: v %.9g y %.9g, "
              "the rule says %d (gradient %g, y's %g)\n", sbn_dtype_name(dt), a.act, (double)a.slope, (double)x,
              (double)hi, (double)lo, (double)s, (double)b, (double)v, (double)y, sign, (double)gs, (double)gy);
  }
}

/* 1. The edges: x around the zero of v for channels of every kind above. */
static void test_rule_against_y(void) {
  static const double means[] = {0.0, 1.5, 1000.1, -3.3e4 - 0.37, 1e6 + 0.3};
  static const double sds[] = {1.0, 1e-2, 1e-3};
  static const float ws[] = {1.0f, -0.5f, 1e-3f, 0.0f, 7.0f};
  static const float bs[] = {0.0f, 0.3f, -2.0f, 0x1p-26f, -1e-30f};
  for (int di = 0; di < 3; di++) {
    const int dt = kDts[di];
    for (int ai = 0; ai < 3; ai++) {
      counts_t k = {0, 0, 0, 0, 0};
      sbn_rng_t rng = {77u + (uint64_t)di * 3u + (uint64_t)ai};
      for (int mi = 0; mi < 5; mi++) {
        if (dt == sbnFloat16 && fabs(means[mi]) > 4e4) continue; /* fp16 holds at most 65504 */
        for (int si = 0; si < 3; si++)
          for (int wi = 0; wi < 5; wi++)
            for (int bi = 0; bi < 5; bi++) {
              const double mean = means[mi], sd = sds[si];
              /* the team's mean as the library carries it: hi + lo, lo a rounding's error */
              const float hi = (float)mean, lo = (float)(mean - (double)hi);
              const float s = sbn_scale(ws[wi], 1.0f / (float)sd), b = bs[bi];
              /* the zero of v, and consecutive values of the dtype around it */
              const double x0 = s != 0.0f ? mean - (double)b / (double)s : mean;
              float x = to_dt((float)x0, dt);
              for (int j = 0; j < 150 && isfinite(x); j++) x = step_dt(x, dt, -1);
              for (int j = 0; j < 300 && isfinite(x); j++) {
                check_elem(dt, kActs[ai], x, hi, lo, s, b, &k);
                x = step_dt(x, dt, 1);
              }
              /* and the channel's ordinary values */
              for (int j = 0; j < 200; j++)
                check_elem(dt, kActs[ai], to_dt((float)(mean + sd * sbn_rng_normal(&rng)), dt), hi, lo, s, b, &k);
            }
      }
      fprintf(stderr, "  %s act %d slope %g: %ld sure, %ld not (y read), %ld wrong without the band, "
              "%ld v > 0 stored as 0; %ld sure and wrong\n", sbn_dtype_name(dt), kActs[ai].act,
              (double)kActs[ai].slope, k.sure, k.unsure, k.naive_wrong, k.underflow, k.bad);
      ASSERT_TRUE(k.bad == 0);
      /* the inputs reach the edges the rule guards (else this test could not fail) */
      ASSERT_TRUE(k.naive_wrong > 0);
      if (dt == sbnFloat16) ASSERT_TRUE(k.underflow > 0);
      ASSERT_TRUE(k.sure > k.unsure);
    }
  }
}

/* 2. Ordinary data: the band is narrow. */
static void test_band_is_narrow(void) {
  static const double ratio[] = {0.0, 3.0, 30.0};
  for (int di = 0; di < 3; di++) {
    const int dt = kDts[di];
    for (int ri = 0; ri < 3; ri++) {
      counts_t k = {0, 0, 0, 0, 0};
      sbn_rng_t rng = {1234u + (uint64_t)ri};
      for (int c = 0; c < 64; c++) {
        const double sd = 0.5 + sbn_rng_uniform(&rng), mu = ratio[ri] * sd;
        const float w = (float)(0.5 + sbn_rng_uniform(&rng)), b = (float)(sbn_rng_uniform(&rng) - 0.5);
        enum { N = 4096 };
        static float xs[N];
        double sum = 0.0, sq = 0.0;
        for (int j = 0; j < N; j++) xs[j] = to_dt((float)(mu + sd * sbn_rng_normal(&rng)), dt), sum += xs[j];
        const double mean = sum / N;
        for (int j = 0; j < N; j++) sq += ((double)xs[j] - mean) * ((double)xs[j] - mean);
        const float hi = (float)mean, lo = (float)(mean - (double)hi);
        const float s = sbn_scale(w, sbn_invstd((float)(sq / N), 1e-5f));
        for (int j = 0; j < N; j++) check_elem(dt, kActs[c % 3], xs[j], hi, lo, s, b, &k);
      }
      const double frac = (double)k.unsure / (double)(k.sure + k.unsure);
      fprintf(stderr, "  %s, mean / sd %g: %.2e of the elements not sure (y read)\n", sbn_dtype_name(dt),
              ratio[ri], frac);
      ASSERT_TRUE(k.bad == 0);
      ASSERT_TRUE(frac < 1e-3);
    }
  }
}

/* ---- 3. CPU teams ---------------------------------------------------------------------- */
typedef struct {
  sbnResult_t res;
  team_t* t;
  int r, bwd, no_residual;
  act_t a;
} xcall_t;

static void* xcall(void* arg) {
  xcall_t* c = (xcall_t*)arg;
  team_t* t = c->t;
  const int r = c->r;
  sbnEpilogue_t e = SBN_EPILOGUE_INITIALIZER;
  e.activation = (sbnActivation_t)c->a.act;
  e.slope = c->a.slope;
  e.no_residual = c->no_residual;
  sbnComm_t comm = team_comms(t->W)[r];
  if (!c->bwd)
    c->res = sbnForwardTrainEx(comm, &t->d[r], t->x[r], NULL, t->y[r], t->w, t->b, t->rm[r], t->rv[r], &t->nbt[r],
                               t->smean[r], t->sinv[r], NULL, &e, NULL);
  else
    c->res = sbnBackwardEx(comm, &t->d[r], t->x[r], t->y[r], t->dy[r], t->dx[r], NULL, t->w, t->b, t->smean[r],
                           t->sinv[r], t->dw[r], t->db[r], NULL, &e, NULL);
  return NULL;
}

static sbnResult_t xrun(team_t* t, int bwd, int no_residual, act_t a) {
  pthread_t th[MAXW];
  xcall_t c[MAXW];
  (void)team_comms(t->W);
  for (int r = 0; r < t->W; r++) {
    xcall_t cr = {sbnSuccess, t, r, bwd, no_residual, a};
    c[r] = cr;
    if (pthread_create(&th[r], NULL, xcall, &c[r]) != 0) abort();
  }
  sbnResult_t res = sbnSuccess;
  for (int r = 0; r < t->W; r++) {
    pthread_join(th[r], NULL);
    if (c[r].res != sbnSuccess && res == sbnSuccess) res = c[r].res;
  }
  return res;
}

/* tiny: channel 0's weight 1e-6 and bias 0 over planes of 1031 (a zero-initialised weight
   a few steps on): |bn(x)| below fp16's least subnormal on ~2 % of its elements, y stored
   0 there, where only the dtype's own floor keeps the rule unsure */
static void team_case(int W, sbnDataType_t dt, sbnLayout_t lay, gen_t gen, act_t a, int affine,
                      uint64_t seed, int tiny) {
  const int64_t n[MAXW] = {3, 2, 0, 4};
  team_t t;
  team_make(&t, W, dt, lay, 5, tiny ? 1031 : 37, n, affine, 1, gen, seed);
  if (tiny) {
    t.w[0] = 1e-6f;
    t.b[0] = 0.0f;
  }
  ASSERT_OK(xrun(&t, 0, 0, a));
  ASSERT_OK(xrun(&t, 1, 0, a));
  team_grads_t g;
  team_grads_keep(&t, &g);
  ASSERT_OK(xrun(&t, 1, 1, a)); /* the mask from x, y as the forward wrote it */
  ASSERT_TRUE(team_grads_equal(&t, &g));
  const long poisoned = team_xmask_poison(&t, 1);
  ASSERT_TRUE(poisoned > 0);
  ASSERT_OK(xrun(&t, 1, 1, a)); /* y read only where the rule is not sure */
  if (!team_grads_equal(&t, &g)) {
    fprintf(stderr, "  %s %s act %d slope %g W %d gen %d: the mask from x read a poisoned y\n", sbn_dtype_name(dt),
            lay == sbnLayoutNHWC ? "NHWC" : "NCHW", a.act, (double)a.slope, W, (int)gen);
    ASSERT_TRUE(0);
  }
  ASSERT_OK(xrun(&t, 1, 0, a)); /* the mask from y sees the poison: the check above can fail */
  ASSERT_TRUE(!team_grads_equal(&t, &g));
  team_grads_free(&t, &g);
  team_free(&t);
}

static void test_team_gradients_bitwise(void) {
  uint64_t seed = 11;
  for (int di = 0; di < 3; di++)
    for (int ai = 0; ai < 3; ai++)
      for (int li = 0; li < 2; li++) {
        const sbnLayout_t lay = li ? sbnLayoutNHWC : sbnLayoutNCHW;
        team_case(2, (sbnDataType_t)kDts[di], lay, GEN_NORMAL, kActs[ai], 1, seed++, 0);
        /* far from 0 (1e4 + N(0, 1)) in fp32; not in fp16 and bf16, whose values there are 8
           and 64 apart: their channels come out constant (invstd 1 / sqrt(eps)), where the
           mean's low part decides the sign and no element is sure */
        team_case(4, (sbnDataType_t)kDts[di], lay, kDts[di] == sbnFloat32 ? GEN_OFFSET : GEN_NORMAL,
                  kActs[ai], 1, seed++, 0);
        team_case(1, (sbnDataType_t)kDts[di], lay, GEN_NORMAL, kActs[ai], 0, seed++, 0);
        if (kDts[di] == sbnFloat16)
          team_case(1, sbnFloat16, lay, GEN_NORMAL, kActs[ai], 1, seed++, 1);
        CHECK_();
      }
}

/* ---- 4. The API ------------------------------------------------------------------------ */
static void test_api(void) {
  const int64_t n[MAXW] = {4};
  team_t t;
  team_make(&t, 1, sbnFloat32, sbnLayoutNCHW, 3, 5, n, 1, 1, GEN_NORMAL, 5);
  sbnComm_t comm = team_comms(1)[0];
  const act_t relu = {SBN_ACT_RELU, 0.0f};
  ASSERT_OK(xrun(&t, 0, 0, relu));
  ASSERT_OK(xrun(&t, 1, 0, relu));
  team_grads_t g;
  team_grads_keep(&t, &g);
  /* the first sbnEpilogue_t: 16 bytes, the fields after it not read (here: not 0) */
  sbnEpilogue_t e = SBN_EPILOGUE_INITIALIZER;
  e.activation = sbnActivationRelu;
  e.size = 16;
  e.no_residual = 7, e.reserved = 9;
  memset(t.dx[0], 0, team_bytes(&t, 0));
  ASSERT_OK(sbnBackwardEx(comm, &t.d[0], t.x[0], t.y[0], t.dy[0], t.dx[0], NULL, t.w, t.b, t.smean[0],
                          t.sinv[0], t.dw[0], t.db[0], NULL, &e, NULL));
  ASSERT_TRUE(team_grads_equal(&t, &g));
  /* sizes between the two, and the new fields' values, refused; nothing written */
  e.size = 20;
  memset(t.dx[0], 0x5a, team_bytes(&t, 0));
  void* before = dup_mem(t.dx[0], team_bytes(&t, 0));
  ASSERT_RES(sbnBackwardEx(comm, &t.d[0], t.x[0], t.y[0], t.dy[0], t.dx[0], NULL, t.w, t.b, t.smean[0], t.sinv[0],
                          t.dw[0], t.db[0], NULL, &e, NULL),
                 sbnInvalidArgument);
  e.size = sizeof e;
  e.no_residual = 2, e.reserved = 0;
  ASSERT_RES(sbnBackwardEx(comm, &t.d[0], t.x[0], t.y[0], t.dy[0], t.dx[0], NULL, t.w, t.b, t.smean[0], t.sinv[0],
                          t.dw[0], t.db[0], NULL, &e, NULL),
                 sbnInvalidArgument);
  ASSERT_TRUE(strstr(sbnGetLastError(comm), "no_residual") != NULL);
  e.no_residual = 1, e.reserved = 1;
  ASSERT_RES(sbnBackwardEx(comm, &t.d[0], t.x[0], t.y[0], t.dy[0], t.dx[0], NULL, t.w, t.b, t.smean[0], t.sinv[0],
                          t.dw[0], t.db[0], NULL, &e, NULL),
                 sbnInvalidArgument);
  ASSERT_TRUE(strstr(sbnGetLastError(comm), "reserved") != NULL);
  ASSERT_TRUE(memcmp(before, t.dx[0], team_bytes(&t, 0)) == 0);
  ASSERT_TRUE(memcmp(g.dw[0], t.dw[0], 3 * sizeof(float)) == 0 && memcmp(g.db[0], t.db[0], 3 * sizeof(float)) == 0);
  /* x given as y's memory, dbias alone asked for: y's values are no x, so no mask from x
     (it would take y - mean for x - mean): dbias as with no_residual = 0 */
  {
    const size_t tb = team_bytes(&t, 0);
    void* yx = dup_mem(t.y[0], tb);
    float db0[3], db1[3];
    e.reserved = 0;
    for (int nr = 0; nr < 2; nr++) {
      e.no_residual = nr;
      const sbnResult_t rr = sbnBackwardEx(comm, &t.d[0], yx, yx, t.dy[0], NULL, NULL, t.w, t.b, t.smean[0],
                                           t.sinv[0], NULL, nr ? db1 : db0, NULL, &e, NULL);
      if (rr != sbnSuccess) fprintf(stderr, "  %s\n", sbnGetLastError(comm));
      ASSERT_OK(rr);
    }
    ASSERT_TRUE(memcmp(db0, g.db[0], sizeof db0) == 0);
    ASSERT_TRUE(memcmp(db1, db0, sizeof db0) == 0);
    free(yx);
  }
  /* a forward with z and no_residual = 1: refused, y and the statistics untouched */
  e.reserved = 0;
  void* z = dup_mem(t.x[0], team_bytes(&t, 0));
  memset(t.y[0], 0x5a, team_bytes(&t, 0));
  void* y0 = dup_mem(t.y[0], team_bytes(&t, 0));
  const float m0 = t.smean[0][0], rm0 = t.rm[0][0];
  const int64_t nbt0 = t.nbt[0];
  ASSERT_RES(sbnForwardTrainEx(comm, &t.d[0], t.x[0], z, t.y[0], t.w, t.b, t.rm[0], t.rv[0], &t.nbt[0], t.smean[0],
                              t.sinv[0], NULL, &e, NULL),
                 sbnInvalidArgument);
  ASSERT_TRUE(strstr(sbnGetLastError(comm), "no_residual") != NULL);
  ASSERT_TRUE(memcmp(y0, t.y[0], team_bytes(&t, 0)) == 0);
  ASSERT_TRUE(t.smean[0][0] == m0 && t.rm[0][0] == rm0 && t.nbt[0] == nbt0);
  ASSERT_RES(sbnForwardInferenceEx(&t.d[0], t.x[0], z, t.y[0], t.w, t.b, t.rm[0], t.rv[0], 1e-5f, &e, NULL),
                 sbnInvalidArgument);
  ASSERT_TRUE(memcmp(y0, t.y[0], team_bytes(&t, 0)) == 0);
  /* without z the forwards take it (it changes nothing there) */
  ASSERT_OK(sbnForwardInferenceEx(&t.d[0], t.x[0], NULL, t.y[0], t.w, t.b, t.rm[0], t.rv[0], 1e-5f, &e, NULL));
  free(z), free(y0), free(before);
  team_grads_free(&t, &g);
  team_free(&t);
}

int main(void) {
  SBN_RUN(test_rule_against_y);
  SBN_RUN(test_band_is_narrow);
  SBN_RUN(test_team_gradients_bitwise);
  SBN_RUN(test_api);
  team_comms_destroy();
  return sbn_test_exit();
}
