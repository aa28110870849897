/* test_fused.c — batch norm + activation (+ residual) in one op on CPU teams:
 * sbnForwardTrainEx, sbnBackwardEx and sbnForwardInferenceEx against the double-precision
 * reference (sbn_ref_forward + sbn_ref_epilogue; sbn_ref_backward_ex with the library's
 * own y for the mask and its saved statistics), for identity, ReLU and leaky ReLU, with
 * and without a residual z, y in place of x or z, dz (also in place of dy), every dtype
 * and layout, teams of 1 to 8 with uneven and empty ranks; the in-place backward (x
 * recovered from y) against the x-based reference within its error bound (below); the
 * refusals (nothing written); ranks that disagree on the activation.
 *
 * Tolerances: tol_for() (team_util.h). The epilogue adds z (exact in fp32) and a
 * piecewise-linear activation to the normalized value, so y keeps the forward's
 * tolerance; g = dy * act'(y) is dy, 0 or slope * dy (one fp32 rounding), so dx, dz and
 * dweight/dbias keep the backward's.
 *
 * The in-place backward's bound (bench/notes/tolerances.md): y is the forward's output
 * rounded to the dtype (unit roundoff u: 2^-24 fp32, 2^-11 fp16, 2^-8 bf16; below the
 * normal range to half a subnormal, t: 2^-150, 2^-25, 2^-134), so v = act^-1(y) is off by
 * |v| u + t / s (s the slope on leaky ReLU's negative side, else 1; the product by 1 / slope
 * adds two fp32 roundings), and x_hat = (v - bias) * (1 / (weight invstd)) invstd by
 * e_i = (|v_i| u + t / s + |v_i - bias| 2^-22) / |weight| (four fp32 roundings: bn_math.h
 * sbn_xmu_from_y). Then
 * |d dweight| <= sum_i |g_i| e_i (over the rank's elements: local gradients) and
 * |d dx_i| <= |w| invstd (e_i |mean(g x_hat)| + |x_hat_i| mean(|g| e)) (over the team);
 * the test allows twice that plus the x-based tolerances (dx's scaled to the channel).
 */
#include "team_util.h"

typedef struct {
  int act;
  float slope;
} epi_t;

static sbnEpilogue_t epilogue(epi_t e) {
  sbnEpilogue_t s = SBN_EPILOGUE_INITIALIZER;
  s.activation = (sbnActivation_t)e.act;
  s.slope = e.slope;
  return s;
}

static const epi_t kEpis[] = {{sbnActivationIdentity, 0.01f}, {sbnActivationRelu, 0.01f},
                              {sbnActivationLeakyRelu, 0.01f}, {sbnActivationLeakyRelu, 0.2f}};
#define NEPI ((int)(sizeof kEpis / sizeof kEpis[0]))

enum { Y_SEPARATE = 0, Y_IN_X = 1, Y_IN_Z = 2 };

/* A team's tensors for the fused ops: team_t's, plus z and dz. */
typedef struct {
  team_t t;
  void* z[MAXW];
  void* z0[MAXW];
  void* dz[MAXW];
  epi_t e;
  const sbnParams_t* p; /* the calls' params: NULL, the defaults */
  unsigned keep_x;      /* the in-place backward (kind 2): ranks whose bit is set pass x
                           (the x-based backward) in the same op: a team mixing the two */
} fused_t;

static void fused_make(fused_t* f, int W, sbnDataType_t dt, sbnLayout_t lay, int64_t c, int64_t sp,
                       const int64_t* n, int affine, int with_z, epi_t e, uint64_t seed) {
  memset(f, 0, sizeof *f);
  team_make(&f->t, W, dt, lay, c, sp, n, affine, 1, GEN_NORMAL, seed);
  f->e = e;
  sbn_rng_t rng = {seed * 7 + 1};
  for (int r = 0; r < W; r++) {
    size_t bytes = team_bytes(&f->t, r);
    if (with_z && bytes) {
      f->z0[r] = gen_tensor(&f->t.d[r], &rng, GEN_NORMAL);
      f->z[r] = dup_mem(f->z0[r], bytes);
    }
    f->dz[r] = bytes ? malloc(bytes) : NULL;
  }
}

static void fused_free(fused_t* f) {
  for (int r = 0; r < f->t.W; r++) free(f->z[r]), free(f->z0[r]), free(f->dz[r]);
  team_free(&f->t);
}

/* ---- running the fused ops on one thread per rank ---------------------------------- */
typedef struct {
  sbnResult_t res; /* first: run_ranks reads it */
  fused_t* f;
  int r;
  int kind;     /* 0 forward, 1 backward, 2 backward from y (x NULL) */
  int where;    /* forward: Y_*; backward: 1 = dz in place of dy, 2 = no dz */
  epi_t e;      /* this rank's epilogue */
} call_t;

static void* fused_call(void* arg) {
  call_t* a = (call_t*)arg;
  team_t* t = &a->f->t;
  const int r = a->r;
  sbnComm_t comm = team_comms(t->W)[r];
  sbnEpilogue_t e = epilogue(a->e);
  if (a->kind == 0) {
    void* y = a->where == Y_IN_X ? t->x[r] : a->where == Y_IN_Z ? a->f->z[r] : t->y[r];
    a->res = sbnForwardTrainEx(comm, &t->d[r], t->x[r], a->f->z[r], y, t->w, t->b, t->rm[r], t->rv[r],
                               &t->nbt[r], t->smean[r], t->sinv[r], a->f->p, &e, NULL);
  } else {
    void* dz = a->where == 2 ? NULL : a->where == 1 ? t->dy[r] : a->f->dz[r];
    const int from_y = a->kind == 2 && !((a->f->keep_x >> r) & 1u);
    a->res = backward_ex(comm, &t->d[r], from_y ? NULL : t->x[r], a->f->z[r], t->y[r], t->dy[r], t->dx[r], dz,
                         t->w, t->b, t->smean[r], t->sinv[r], t->dw[r], t->db[r], a->f->p, &e, NULL);
  }
  return NULL;
}

/* Runs fn on one thread per rank of a team of W, rank r's on calls + r * stride, a struct
   whose first member is the call's sbnResult_t. Returns the first failure. */
static sbnResult_t run_ranks(int W, void* (*fn)(void*), void* calls, size_t stride) {
  pthread_t th[MAXW];
  (void)team_comms(W); /* made here, once: not by the rank threads at the same time */
  for (int r = 0; r < W; r++)
    if (pthread_create(&th[r], NULL, fn, (char*)calls + (size_t)r * stride) != 0) abort();
  sbnResult_t res = sbnSuccess;
  for (int r = 0; r < W; r++) {
    pthread_join(th[r], NULL);
    const sbnResult_t rr = *(const sbnResult_t*)((const char*)calls + (size_t)r * stride);
    if (rr != sbnSuccess && res == sbnSuccess) res = rr;
  }
  return res;
}

/* Runs kind over the team; rank r uses es[r] (NULL: f->e everywhere). In-place results
   are moved to y / dz and the inputs restored. Returns the first failure. */
static sbnResult_t fused_run(fused_t* f, int kind, int where, const epi_t* es) {
  team_t* t = &f->t;
  call_t a[MAXW];
  for (int r = 0; r < t->W; r++) {
    call_t ar = {sbnSuccess, f, r, kind, where, es ? es[r] : f->e};
    a[r] = ar;
  }
  const sbnResult_t res = run_ranks(t->W, fused_call, a, sizeof a[0]);
  for (int r = 0; r < t->W; r++) {
    size_t bytes = team_bytes(t, r);
    if (!bytes) continue;
    if (kind == 0 && where == Y_IN_X) memcpy(t->y[r], t->x[r], bytes), memcpy(t->x[r], t->x0[r], bytes);
    if (kind == 0 && where == Y_IN_Z) memcpy(t->y[r], f->z[r], bytes), memcpy(f->z[r], f->z0[r], bytes);
    if (kind != 0 && where == 1) memcpy(f->dz[r], t->dy[r], bytes), memcpy(t->dy[r], t->dy0[r], bytes);
  }
  return res;
}

/* ---- checks ----------------------------------------------------------------------- */
static int check_array(const char* what, const void* got, sbnDataType_t dt, const double* ref, int64_t n,
                       double atol, double rtol) {
  float* g = widen_all(got, dt, n);
  int ok = sbn_check_close_array_(what, g, ref, (size_t)n, atol, rtol, __FILE__, __LINE__);
  free(g);
  if (!ok) sbn_test_failures_++, sbn_test_cur_failed_++;
  return ok;
}

/* The forward's y against the reference act(bn(x) + z), and its statistics against the
   reference's (the epilogue changes none of them). */
static void check_fused_forward(fused_t* f, tol_t tol) {
  team_t* t = &f->t;
  const int W = t->W;
  const int64_t c = t->d[0].c;
  double *mean = dvec(c), *invstd = dvec(c), *varu = dvec(c), *ys[MAXW] = {0};
  const void* xs[MAXW] = {0};
  int64_t m = 0;
  for (int r = 0; r < W; r++) xs[r] = t->x0[r], ys[r] = dvec(sbn_ref_numel(&t->d[r]) + 1);
  sbn_ref_forward(W, t->d, xs, t->w, t->b, 1e-5, mean, invstd, varu, &m, ys);
  for (int r = 0; r < W; r++) {
    sbn_ref_epilogue(&t->d[r], f->z0[r], f->e.act, f->e.slope, ys[r]);
    int64_t ne = sbn_ref_numel(&t->d[r]);
    if (ne && !check_array("y", t->y[r], t->d[r].dtype, ys[r], ne, tol.out_atol, tol.out_rtol)) {
      fprintf(stderr, "  (rank %d of %d, activation %d, slope %g, z %s)\n", r, W, f->e.act,
              (double)f->e.slope, f->z0[r] ? "yes" : "no");
      break;
    }
    for (int64_t ci = 0; ci < c; ci++) {
      ASSERT_CLOSE(t->sinv[r][ci], invstd[ci], tol.stat_atol, tol.stat_rtol);
      ASSERT_CLOSE(t->smean[r][ci], mean[ci], tol.stat_atol / invstd[ci], tol.stat_rtol);
    }
  }
  for (int r = 0; r < W; r++) free(ys[r]);
  free(mean), free(invstd), free(varu);
}

/* The x-based reference backward of the last forward: dx, dz (g), local dweight/dbias. */
typedef struct {
  double *dx[MAXW], *dz[MAXW], *dw[MAXW], *db[MAXW];
} ref_bwd_t;

static void ref_backward(fused_t* f, ref_bwd_t* o) {
  team_t* t = &f->t;
  const int64_t c = t->d[0].c;
  double *mean = dvec(c), *invstd = dvec(c);
  const void *xs[MAXW] = {0}, *ys[MAXW] = {0}, *dys[MAXW] = {0};
  for (int64_t ci = 0; ci < c; ci++) mean[ci] = t->smean[0][ci], invstd[ci] = t->sinv[0][ci];
  for (int r = 0; r < t->W; r++) {
    int64_t ne = sbn_ref_numel(&t->d[r]);
    xs[r] = t->x0[r], ys[r] = t->y[r], dys[r] = t->dy0[r];
    o->dx[r] = dvec(ne + 1), o->dz[r] = dvec(ne + 1), o->dw[r] = dvec(c), o->db[r] = dvec(c);
  }
  sbn_ref_backward_ex(t->W, t->d, xs, ys, dys, f->e.act, f->e.slope, t->w, mean, invstd, o->dx, o->dz, o->dw,
                      o->db, NULL, NULL);
  free(mean), free(invstd);
}

static void ref_free(ref_bwd_t* o, int W) {
  for (int r = 0; r < W; r++) free(o->dx[r]), free(o->dz[r]), free(o->dw[r]), free(o->db[r]);
}

static void check_fused_backward(fused_t* f, int with_dz, tol_t tol) {
  team_t* t = &f->t;
  ref_bwd_t o;
  ref_backward(f, &o);
  for (int r = 0; r < t->W; r++) {
    int64_t ne = sbn_ref_numel(&t->d[r]);
    int ok = !ne || check_array("dx", t->dx[r], t->d[r].dtype, o.dx[r], ne, tol.out_atol, tol.out_rtol);
    if (ok && ne && with_dz) ok = check_array("dz", f->dz[r], t->d[r].dtype, o.dz[r], ne, tol.out_atol, tol.out_rtol);
    if (ok) {
      ok = sbn_check_close_array_("dweight", t->dw[r], o.dw[r], (size_t)t->d[0].c, tol.grad_atol, tol.grad_rtol,
                                  __FILE__, __LINE__) &&
           sbn_check_close_array_("dbias", t->db[r], o.db[r], (size_t)t->d[0].c, tol.grad_atol, tol.grad_rtol,
                                  __FILE__, __LINE__);
      if (!ok) sbn_test_failures_++, sbn_test_cur_failed_++;
    }
    if (!ok) {
      fprintf(stderr, "  (rank %d of %d, activation %d, slope %g)\n", r, t->W, f->e.act, (double)f->e.slope);
      break;
    }
  }
  ref_free(&o, t->W);
}

/* ---- tests -------------------------------------------------------------------------- */
static void fused_case(int W, sbnDataType_t dt, sbnLayout_t lay, int64_t c, int64_t sp, const int64_t* n,
                       int affine, int with_z, epi_t e, int where, uint64_t seed) {
  fused_t f;
  fused_make(&f, W, dt, lay, c, sp, n, affine, with_z, e, seed);
  ASSERT_OK(fused_run(&f, 0, where, NULL));
  check_fused_forward(&f, tol_for(dt));
  CHECK_();
  /* backward: dz written apart, in place of dy, or not at all (no z) */
  const int dz_where = with_z ? (int)(seed % 2) : 2;
  ASSERT_OK(fused_run(&f, 1, dz_where, NULL));
  check_fused_backward(&f, dz_where != 2, tol_for(dt));
  fused_free(&f);
}

static void test_fused_vs_ref(void) {
  const sbnDataType_t dts[] = {sbnFloat32, sbnFloat16, sbnBFloat16};
  uint64_t seed = 5000;
  for (int d = 0; d < 3; d++)
    for (int lay = 0; lay < 2; lay++)
      for (int k = 0; k < NEPI; k++)
        for (int with_z = 0; with_z < 2; with_z++) {
          int64_t n[MAXW] = {2, 3, 1};
          const int where = with_z ? (int)(seed % 3) : (int)(seed % 2); /* y apart, in x, or in z */
          fused_case(3, dts[d], (sbnLayout_t)lay, 5, 6, n, (k + lay) % 2 == 0 || with_z, with_z, kEpis[k], where,
                     seed++);
          CHECK_();
        }
}

static void test_fused_uneven_empty_wide(void) {
  struct { int W; int64_t n[MAXW]; int64_t sp; } cases[] = {
      {1, {4}, 9}, {4, {3, 0, 1, 5}, 7}, {8, {1, 0, 2, 0, 3, 0, 4, 0}, 2}, {8, {0, 0, 0, 1, 0, 0, 0, 1}, 3},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int k = 1; k < NEPI; k++) {
      fused_case(cases[i].W, sbnFloat32, (sbnLayout_t)((i + (size_t)k) % 2), 4, cases[i].sp, cases[i].n, 1, 1,
                 kEpis[k], Y_SEPARATE, 5200u + i * 10 + (uint64_t)k);
      CHECK_();
    }
  /* runs longer than a buffer (256): C = 300 in NHWC, spatial 300 in NCHW */
  int64_t n2[MAXW] = {2, 1};
  fused_case(2, sbnFloat32, sbnLayoutNHWC, 300, 3, n2, 1, 1, kEpis[1], Y_SEPARATE, 5290);
  CHECK_();
  fused_case(2, sbnBFloat16, sbnLayoutNCHW, 3, 300, n2, 1, 1, kEpis[2], Y_IN_Z, 5291);
}

/* The identity epilogue without z is the plain op, bit for bit. */
static void test_identity_is_the_plain_op(void) {
  int64_t n[MAXW] = {3, 2};
  fused_t f;
  fused_make(&f, 2, sbnFloat16, sbnLayoutNHWC, 6, 5, n, 1, 0, kEpis[0], 5300);
  team_t plain;
  team_make(&plain, 2, sbnFloat16, sbnLayoutNHWC, 6, 5, n, 1, 1, GEN_NORMAL, 5300);
  sbnParams_t p = SBN_PARAMS_DEFAULT;
  ASSERT_OK(fused_run(&f, 0, Y_SEPARATE, NULL));
  ASSERT_OK(team_run(&plain, 0, MODE_THREADS, 0, &p));
  ASSERT_OK(fused_run(&f, 1, 2, NULL));
  ASSERT_OK(team_run(&plain, 1, MODE_THREADS, 0, &p));
  for (int r = 0; r < 2; r++) {
    size_t bytes = team_bytes(&plain, r);
    ASSERT_MEMEQ(f.t.y[r], plain.y[r], bytes);
    ASSERT_MEMEQ(f.t.dx[r], plain.dx[r], bytes);
    ASSERT_MEMEQ(f.t.dw[r], plain.dw[r], 6 * sizeof(float));
    ASSERT_MEMEQ(f.t.smean[r], plain.smean[r], 6 * sizeof(float));
  }
  team_free(&plain);
  fused_free(&f);
}

/* The in-place backward (x NULL, recovered from y) against the x-based reference, within
   the bound of the file's comment. */
static double unit_roundoff(sbnDataType_t dt) {
  return dt == sbnFloat32 ? ldexp(1.0, -24) : dt == sbnFloat16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
}
/* x_hat of rank r's element i (channel ci) from its input and the forward's saved
   statistics: what the x-based backward (and the reference) normalize with */
static double xhat_of(const team_t* t, int r, int64_t i, int64_t ci) {
  return (sbn_ref_load(t->x0[r], t->d[r].dtype, i) - t->smean[0][ci]) * t->sinv[0][ci];
}

/* half the dtype's smallest subnormal: y's rounding error where it is not relative (a y
   below the normal range, or rounded to 0) */
static double half_subnormal(sbnDataType_t dt) {
  return dt == sbnFloat32 ? ldexp(1.0, -150) : dt == sbnFloat16 ? ldexp(1.0, -25) : ldexp(1.0, -134);
}

/* e_i of the file's comment for the element whose stored output is y: v = act^-1(y) is off
   by |v| u plus y's absolute rounding (half a subnormal) divided by the slope on leaky
   ReLU's negative side. With a residual z (sbnBackwardInPlaceEx), v is bn(x) + z: the
   forward's fp32 sum rounds once more (|v| 2^-24), and so does the recovery's v - z
   (|v - z| 2^-24); then v - z takes v's place in the recovery's roundings. */
static double recover_err_z(sbnDataType_t dt, epi_t e, double y, double z, double b, double w,
                            double mean_lo_bound) {
  const int neg = y <= 0 && e.act != sbnActivationIdentity;
  const double v = neg ? y / e.slope : y;
  const double tiny = half_subnormal(dt) / (neg ? e.slope : 1.0);
  const double sums = z != 0.0 ? (fabs(v) + fabs(v - z)) * ldexp(1.0, -24) : 0.0;
  return (fabs(v) * unit_roundoff(dt) + tiny + sums + fabs(v - z - b) * ldexp(1.0, -22)) / w + mean_lo_bound;
}

/* wb: NULL, or each channel's weight and bias (in place of fused_make's). signs: x = +-1
   by the position's parity (every channel's x_hat +-1, each (sample, channel) half and
   half) and dy its sign, in place of gen's data: every element of a sign then has the
   same y and the same rounding error, which the sums add up without cancelling (the
   bound's sum of |g| e_i is reached). keep_x: ranks that run the x-based backward in the
   same op (their elements' e_i is 0: the bound's team sums take the others' only) */
/* with_z: the forward had a residual z (N(0, z_scale^2)), which the in-place backward
   takes (sbnBackwardInPlaceEx), and dz is asked for (checked against the reference's g) */
static void recover_case_z(sbnDataType_t dt, sbnLayout_t lay, epi_t e, int affine, float w_scale,
                           const float (*wb)[2], gen_t gen, int signs, unsigned keep_x, int with_z, float z_scale,
                           uint64_t seed) {
  int64_t n[MAXW] = {3, 2, 0, 4};
  const int W = 4;
  const int64_t c = 5, sp = 6;
  fused_t f;
  fused_make(&f, W, dt, lay, c, sp, n, affine, with_z, e, seed);
  for (int r = 0; with_z && z_scale != 1.0f && r < W; r++)
    for (int64_t i = 0; i < sbn_ref_numel(&f.t.d[r]); i++) {
      const double v = sbn_ref_load(f.z0[r], dt, i) * z_scale;
      sbn_ref_store(f.z0[r], dt, i, v), sbn_ref_store(f.z[r], dt, i, v);
    }
  f.keep_x = keep_x;
  team_t* t = &f.t;
  if (gen != GEN_NORMAL) {
    sbn_rng_t rng = {seed + 99};
    team_new_inputs(t, &rng, gen);
  }
  for (int r = 0; signs && r < W; r++)
    for (int64_t ni = 0; ni < n[r]; ni++)
      for (int64_t ci = 0; ci < c; ci++)
        for (int64_t si = 0; si < sp; si++) {
          const int64_t i = sbn_ref_index(&t->d[r], ni, ci, si);
          const double v = si % 2 ? 1.0 : -1.0;
          sbn_ref_store(t->x[r], dt, i, v), sbn_ref_store(t->x0[r], dt, i, v);
          sbn_ref_store(t->dy[r], dt, i, v), sbn_ref_store(t->dy0[r], dt, i, v);
        }
  if (affine)
    for (int64_t ci = 0; ci < c; ci++) {
      t->w[ci] = wb ? wb[ci][0] : t->w[ci] * w_scale;
      if (wb) t->b[ci] = wb[ci][1];
    }
  ASSERT_OK(fused_run(&f, 0, Y_IN_X, NULL));
  ASSERT_OK(fused_run(&f, 2, with_z ? 0 : 2, NULL)); /* x NULL; dz apart where z */
  ref_bwd_t o;
  ref_backward(&f, &o);
  tol_t tol = tol_for(dt);
  for (int r = 0; with_z && r < W; r++) { /* dz = g, which needs no x */
    const int64_t ne = sbn_ref_numel(&t->d[r]);
    if (ne && !check_array("dz", f.dz[r], dt, o.dz[r], ne, tol.out_atol, tol.out_rtol)) break;
  }
#define ZAT(r, i) (f.z0[r] != NULL ? sbn_ref_load(f.z0[r], dt, i) : 0.0)
  for (int64_t ci = 0; ci < c; ci++) {
    const double w = affine ? fabs((double)t->w[ci]) : 1.0, b = affine ? (double)t->b[ci] : 0.0;
    const double is = t->sinv[0][ci];
    /* the forward subtracted mean + mean_lo (|mean_lo| <= ulp(save_mean) / 2), which the
       recovered x - mean keeps and the x-based backward (x - save_mean) does not */
    const double mean_lo_bound = fabs((double)t->smean[0][ci]) * ldexp(1.0, -24) * is;
    /* e_i, and the sums the bound needs: the team's (dx) and each rank's (dweight: fused_run
       passes the default params, sbnGradLocal, so a rank's dweight sums its own elements) */
    double sum_g_xhat = 0.0, sum_abs_g_e = 0.0, rank_abs_g_e[MAXW] = {0}, gmax = 0.0;
    int64_t m = 0;
    for (int r = 0; r < W; r++)
      for (int64_t ni = 0; ni < n[r]; ni++)
        for (int64_t si = 0; si < sp; si++) {
          int64_t i = sbn_ref_index(&t->d[r], ni, ci, si);
          double ei = (keep_x >> r) & 1u ? 0.0
                                         : recover_err_z(dt, e, sbn_ref_load(t->y[r], dt, i), ZAT(r, i), b, w,
                                                         mean_lo_bound);
          double g = o.dz[r][i], xhat = xhat_of(t, r, i, ci);
          sum_abs_g_e += fabs(g) * ei, rank_abs_g_e[r] += fabs(g) * ei, sum_g_xhat += g * xhat;
          gmax = fmax(gmax, fabs(g));
          m++;
        }
    /* dx's absolute tolerance: tol_for's out_atol is for outputs of order 1; dx = weight
       invstd (g - mean(g) - x_hat mean(g x_hat)) is of order |weight| invstd max|g|, so
       the tolerance scales with it where that is below 1 (weights near 1e-5: dx ~ 1e-5, a
       fixed 1e-2 could not fail), plus dx's own storage below the normal range (half a
       subnormal, in the library's dx and in the x-based one's) */
    const double wabs = affine ? fabs((double)t->w[ci]) : 1.0;
    const double dx_atol = tol.out_atol * fmin(1.0, wabs * is * gmax) + 2.0 * half_subnormal(dt);
    for (int r = 0; r < W; r++) {
      const double bound_dw = 2.0 * rank_abs_g_e[r];
      ASSERT_CLOSE(t->dw[r][ci], o.dw[r][ci], tol.grad_atol + bound_dw, tol.grad_rtol);
      ASSERT_CLOSE(t->db[r][ci], o.db[r][ci], tol.grad_atol, tol.grad_rtol); /* needs no x */
      for (int64_t ni = 0; ni < n[r]; ni++)
        for (int64_t si = 0; si < sp; si++) {
          int64_t i = sbn_ref_index(&t->d[r], ni, ci, si);
          double ei = (keep_x >> r) & 1u ? 0.0
                                         : recover_err_z(dt, e, sbn_ref_load(t->y[r], dt, i), ZAT(r, i), b, w,
                                                         mean_lo_bound);
          double xhat = xhat_of(t, r, i, ci);
          double bound = 2.0 * wabs * is * (ei * fabs(sum_g_xhat / (double)m) + fabs(xhat) * sum_abs_g_e / (double)m);
          ASSERT_CLOSE(sbn_ref_load(t->dx[r], dt, i), o.dx[r][i], dx_atol + bound, tol.out_rtol);
        }
    }
  }
#undef ZAT
  ref_free(&o, W);
  fused_free(&f);
}
static void recover_case(sbnDataType_t dt, sbnLayout_t lay, epi_t e, int affine, float w_scale,
                         const float (*wb)[2], gen_t gen, int signs, unsigned keep_x, uint64_t seed) {
  recover_case_z(dt, lay, e, affine, w_scale, wb, gen, signs, keep_x, 0, 1.0f, seed);
}

static void test_inplace_backward_within_bound(void) {
  const sbnDataType_t dts[] = {sbnFloat32, sbnFloat16, sbnBFloat16};
  const epi_t es[] = {{sbnActivationIdentity, 0.01f}, {sbnActivationLeakyRelu, 0.01f},
                      {sbnActivationLeakyRelu, 0.2f}};
  uint64_t seed = 5400;
  for (int d = 0; d < 3; d++)
    for (int k = 0; k < 3; k++)
      for (int affine = 0; affine < 2; affine++) {
        recover_case(dts[d], (sbnLayout_t)((d + k) % 2), es[k], affine, 1.0f, NULL, GEN_NORMAL, 0, 0u, seed++);
        CHECK_();
      }
  /* small weights: |weight| 1e-3 (x_hat's error grows as 1/|weight|, within the bound) */
  recover_case(sbnFloat32, sbnLayoutNCHW, es[1], 1, 1e-3f, NULL, GEN_NORMAL, 0, 0u, seed++);
  CHECK_();
  /* a mean far from 0 against the spread (x = 1e4 + N(0, 1)): the forward's mean_lo */
  recover_case(sbnFloat32, sbnLayoutNHWC, es[0], 1, 1.0f, NULL, GEN_OFFSET, 0, 0u, seed++);
  CHECK_();
  recover_case(sbnFloat32, sbnLayoutNCHW, es[2], 1, 1.0f, NULL, GEN_OFFSET, 0, 0u, seed++);
  CHECK_();
  /* y below the normal range, stored to half a subnormal, not to u |y|: fp16 with a bias of
     0 and weights just above SBN_RECOVER_MIN_WEIGHT (identity: |y| < 6.1e-5, recovered,
     x_hat off by up to 2^-25 / |weight|, 0.3 % at 1e-5), and leaky ReLU's negative side
     at a weight of 1e-3 (slope 0.01: slope * v ~ 1e-5, off by 2^-25 / 0.01 / |weight|) */
  static const float small_w[5][2] = {{1.0043e-5f, 0.0f}, {1.05e-5f, -0.0f}, {2e-5f, 0.0f},
                                      {4e-5f, 1e-9f}, {-1.5e-5f, 0.0f}};
  static const float leaky_w[5][2] = {{1e-3f, 0.0f}, {2e-3f, 0.0f}, {-1e-3f, 0.0f},
                                      {5e-4f, 1e-6f}, {1e-2f, 0.0f}};
  for (int k = 0; k < 4; k++) {
    recover_case(sbnFloat16, (sbnLayout_t)(k % 2), es[0], 1, 1.0f, small_w, GEN_NORMAL, k / 2, 0u, seed++);
    CHECK_();
    recover_case(sbnFloat16, (sbnLayout_t)(k % 2), es[1], 1, 1.0f, leaky_w, GEN_NORMAL, k / 2, 0u, seed++);
    CHECK_();
  }
  /* a team whose ranks choose: x-based ranks 1 (of ranks 0, 1, 3 with elements) or 0 and 3,
     in one op with the in-place others (the contract: each rank's choice on CPU teams);
     every rank within the bound, the x-based ranks' own elements exact */
  for (int d = 0; d < 3; d++) {
    recover_case(dts[d], (sbnLayout_t)(d % 2), es[d % 3], 1, 1.0f, NULL, GEN_NORMAL, 0, 0x2u, seed++);
    CHECK_();
    recover_case(dts[d], (sbnLayout_t)((d + 1) % 2), es[(d + 1) % 3], 1, 1.0f, NULL, GEN_NORMAL, 0, 0x9u, seed++);
    CHECK_();
  }
}

/* The in-place backward of a forward with a residual (sbnBackwardInPlaceEx: x_hat from y
   and z) against the x-based reference, within the bound of recover_err_z: every dtype,
   layout, identity and leaky ReLU, affine or not; a residual 8 times the normalized
   values (the bound grows with |bn(x) + z|); weights of 1e-3; ranks that choose x in the
   same op; dz checked. Then: with z NULL it is sbnBackwardEx with x NULL, bit for bit. */
static void test_inplace_backward_residual(void) {
  const sbnDataType_t dts[] = {sbnFloat32, sbnFloat16, sbnBFloat16};
  const epi_t es[] = {{sbnActivationIdentity, 0.01f}, {sbnActivationLeakyRelu, 0.01f},
                      {sbnActivationLeakyRelu, 0.2f}};
  uint64_t seed = 5700;
  for (int d = 0; d < 3; d++)
    for (int k = 0; k < 3; k++)
      for (int affine = 0; affine < 2; affine++) {
        recover_case_z(dts[d], (sbnLayout_t)((d + k + affine) % 2), es[k], affine, 1.0f, NULL, GEN_NORMAL, 0, 0u,
                       1, 1.0f, seed++);
        CHECK_();
      }
  for (int d = 0; d < 3; d++) {
    recover_case_z(dts[d], (sbnLayout_t)(d % 2), es[1 + d % 2], 1, 1.0f, NULL, GEN_NORMAL, 0, 0u, 1, 8.0f, seed++);
    CHECK_();
    recover_case_z(dts[d], (sbnLayout_t)((d + 1) % 2), es[d], 1, 1.0f, NULL, GEN_NORMAL, 0, 0x9u, 1, 1.0f, seed++);
    CHECK_();
  }
  recover_case_z(sbnFloat32, sbnLayoutNCHW, es[1], 1, 1e-3f, NULL, GEN_NORMAL, 0, 0u, 1, 1.0f, seed++);
  CHECK_();
  recover_case_z(sbnFloat32, sbnLayoutNHWC, es[2], 1, 1.0f, NULL, GEN_OFFSET, 0, 0u, 1, 1.0f, seed++);
  CHECK_();

  /* z NULL: sbnBackwardInPlaceEx runs the op sbnBackwardEx with x NULL runs (the same code
     in the library: this checks the entry point's arguments, which a pair passed in the
     wrong order would change) */
  int64_t n[MAXW] = {3};
  for (int d = 0; d < 3; d++) {
    fused_t f;
    fused_make(&f, 1, dts[d], (sbnLayout_t)(d % 2), 4, 5, n, 1, 0, es[1], seed++);
    ASSERT_OK(fused_run(&f, 0, Y_IN_X, NULL));
    ASSERT_OK(fused_run(&f, 2, 2, NULL)); /* sbnBackwardEx, x NULL */
    team_t* t = &f.t;
    const size_t bytes = team_bytes(t, 0);
    void* dx = malloc(bytes);
    float dw[4], db[4];
    sbnEpilogue_t e = epilogue(es[1]);
    ASSERT_OK(sbnBackwardInPlaceEx(team_comms(1)[0], &t->d[0], t->y[0], NULL, t->dy[0], dx, NULL, t->w, t->b,
                                   t->smean[0], t->sinv[0], dw, db, NULL, &e, NULL));
    ASSERT_MEMEQ(dx, t->dx[0], bytes);
    ASSERT_MEMEQ(dw, t->dw[0], sizeof dw);
    ASSERT_MEMEQ(db, t->db[0], sizeof db);
    free(dx);
    fused_free(&f);
  }
}

/* Channels whose |weight| < max(SBN_RECOVER_MIN_WEIGHT, u |bias|), u the dtype's unit
   roundoff: y keeps no x there (weight 0: y is the bias rounded to the dtype; above it,
   y's rounding makes an error of x_hat of up to u |bias| / |weight|, beyond 1), so the
   in-place backward takes x_hat = 0: dweight exactly 0 (the x-based one is not: what is
   lost, as documented), and dx = weight * invstd * (g - mean(g)), g = dy * act'(y)
   (exactly 0 for weight 0). Every dtype, identity and leaky ReLU (slope 3: v = y / slope
   rounds), biases whose rounding to fp16/bf16 is not exact: dividing y - bias by the
   weight would give a dweight of order |bias| u / |weight| (hundreds in bf16). Channel 2's
   weight is 2e-4 in fp16 and bf16 (above 1e-5, below u |bias|: 5.4e-4 and 4.3e-3; with
   the threshold at 1e-5 alone its dweight was ~1e2), -5e-6 in fp32. Channel 0 is
   unaffected. Then the same with rank 1 x-based in the op (each rank's choice): rank 0 as
   above, rank 1 its x-based dweight, and a dx whose team sum of g x_hat is rank 1's part
   only (rank 0 adds 0), weight invstd (g - mean(g) - x_hat S1 / M): what the header says
   differs from an all-x-based team's dx. */
static void test_inplace_backward_zero_weight(void) {
  const sbnDataType_t dts[] = {sbnFloat32, sbnFloat16, sbnBFloat16};
  const epi_t es[] = {{sbnActivationIdentity, 0.01f}, {sbnActivationLeakyRelu, 3.0f}};
  int64_t n[MAXW] = {4, 3};
  uint64_t seed = 5450;
  for (int mixed = 0; mixed < 2; mixed++)
  for (int d = 0; d < 3; d++)
    for (int k = 0; k < 2; k++) {
      fused_t f;
      fused_make(&f, 2, dts[d], (sbnLayout_t)(k % 2), 3, 5, n, 1, 0, es[k], seed++);
      f.keep_x = mixed ? 0x2u : 0u;
      team_t* t = &f.t;
      t->w[1] = 0.0f;
      t->w[2] = dts[d] == sbnFloat32 ? -5e-6f : 2e-4f;
      t->b[1] = 0.3f;
      t->b[2] = -1.1f;
      ASSERT_OK(fused_run(&f, 0, Y_SEPARATE, NULL));
      ASSERT_OK(fused_run(&f, 2, 2, NULL));
      ref_bwd_t o;
      ref_backward(&f, &o);
      const double u = unit_roundoff(dts[d]);
      tol_t tol = tol_for(dts[d]);
      for (int64_t ci = 1; ci < 3; ci++) {
        double sum_g = 0.0, s1 = 0.0, gmax = 0.0; /* s1: rank 1's sum of g x_hat */
        int64_t m = 0;
        const double is = t->sinv[0][ci];
        for (int r = 0; r < 2; r++)
          for (int64_t i = 0; i < n[r] * 5; i++) {
            const int64_t at = sbn_ref_index(&t->d[r], i / 5, ci, i % 5);
            sum_g += o.dz[r][at], m++, gmax = fmax(gmax, fabs(o.dz[r][at]));
            if (r == 1) s1 += o.dz[r][at] * xhat_of(t, r, at, ci);
          }
        if (mixed) { /* rank 1, x-based */
          const double k_dx = (double)t->w[ci] * is;
          ASSERT_CLOSE(t->dw[1][ci], o.dw[1][ci], tol.grad_atol, tol.grad_rtol);
          int apart = 0; /* elements where the all-x-based dx is outside the tolerance */
          for (int64_t i = 0; i < n[1] * 5; i++) {
            const int64_t at = sbn_ref_index(&t->d[1], i / 5, ci, i % 5);
            const double xhat = xhat_of(t, 1, at, ci);
            const double want = k_dx * (o.dz[1][at] - sum_g / (double)m - xhat * s1 / (double)m);
            /* fp32 roundings of the terms (a few 2^-24 each, 2^-20 with margin), dx's storage */
            const double atol = fabs(k_dx) * (2.0 * gmax + fabs(xhat * s1) / (double)m) * ldexp(1.0, -20) +
                                ldexp(1.0, -24);
            ASSERT_CLOSE(sbn_ref_load(t->dx[1], dts[d], at), want, atol, 4.0 * u);
            apart += fabs(o.dx[1][at] - want) > atol + 4.0 * u * fabs(want);
          }
          if (ci == 2) EXPECT_TRUE(apart > 0);
          else EXPECT_TRUE(apart == 0); /* weight 0: every dx is 0 */
        }
        for (int r = 0; r < (mixed ? 1 : 2); r++) {
          EXPECT_TRUE(t->dw[r][ci] == 0.0f);
          EXPECT_TRUE(fabs(o.dw[r][ci]) > 1e-3); /* what the x-based backward has */
          ASSERT_CLOSE(t->db[r][ci], o.db[r][ci], tol.grad_atol, tol.grad_rtol);
          const double k_dx = (double)t->w[ci] * t->sinv[0][ci];
          for (int64_t i = 0; i < n[r] * 5; i++) {
            const int64_t at = sbn_ref_index(&t->d[r], i / 5, ci, i % 5);
            const double got = sbn_ref_load(t->dx[r], dts[d], at);
            if (ci == 1) {
              EXPECT_TRUE(got == 0.0);
            } else { /* fp32's -5e-6: fp16 would hold it as a subnormal, to 2^-25 */
              ASSERT_CLOSE(got, k_dx * (o.dz[r][at] - sum_g / (double)m), ldexp(1.0, -24), 4.0 * u);
            }
          }
        }
      }
      if (dts[d] == sbnFloat32)
        for (int r = 0; r < 2; r++) ASSERT_CLOSE(t->dw[r][0], o.dw[r][0], 1e-4, 1e-4);
      else if (mixed)
        ASSERT_CLOSE(t->dw[1][0], o.dw[1][0], tol.grad_atol, tol.grad_rtol);
      ref_free(&o, 2);
      fused_free(&f);
      CHECK_();
    }
}

/* eps = 0 and a constant channel: save_invstd 0 (PyTorch's rule), y the bias, and the
   in-place backward (x NULL) gives what the x-based one gives there, dx and dweight 0,
   where its factor 1 / (weight * 0) made them NaN (fp32: (y - bias) * inf with y the bias)
   or inf (fp16, bf16). The other channel: finite, and in fp32 within the x-based
   tolerances of the x-based backward (fp16 and bf16 recover x to their own rounding:
   test_inplace_backward_within_bound's bound). */
static void test_inplace_backward_eps0(void) {
  const sbnDataType_t dts[] = {sbnFloat32, sbnFloat16, sbnBFloat16};
  const epi_t es[] = {{sbnActivationIdentity, 0.01f}, {sbnActivationLeakyRelu, 0.2f}};
  sbnParams_t p = SBN_PARAMS_DEFAULT;
  p.eps = 0.0f;
  int64_t n[MAXW] = {3, 2};
  for (int d = 0; d < 3; d++)
    for (int k = 0; k < 2; k++) {
      fused_t f;
      fused_make(&f, 2, dts[d], (sbnLayout_t)k, 2, 4, n, 1, 0, es[k], 5500u + (uint64_t)(d * 2 + k));
      f.p = &p;
      team_t* t = &f.t;
      for (int r = 0; r < 2; r++)
        for (int64_t i = 0; i < n[r]; i++)
          for (int64_t s = 0; s < 4; s++) {
            const int64_t at = sbn_ref_index(&t->d[r], i, 0, s);
            sbn_ref_store(t->x[r], dts[d], at, 3.0);
            sbn_ref_store(t->x0[r], dts[d], at, 3.0);
          }
      ASSERT_OK(fused_run(&f, 0, Y_SEPARATE, NULL));
      ASSERT_TRUE(t->sinv[0][0] == 0.0f && t->sinv[1][0] == 0.0f);
      float dw_x[MAXW][2], db_x[MAXW][2];
      void* dx_x[MAXW];
      ASSERT_OK(fused_run(&f, 1, 2, NULL));
      for (int r = 0; r < 2; r++) {
        memcpy(dw_x[r], t->dw[r], sizeof dw_x[r]), memcpy(db_x[r], t->db[r], sizeof db_x[r]);
        dx_x[r] = dup_mem(t->dx[r], team_bytes(t, r));
      }
      ASSERT_OK(fused_run(&f, 2, 2, NULL));
      const tol_t tol = tol_for(dts[d]);
      for (int r = 0; r < 2; r++) {
        EXPECT_TRUE(t->dw[r][0] == 0.0f && dw_x[r][0] == 0.0f && isfinite(t->dw[r][1]));
        if (dts[d] == sbnFloat32) ASSERT_CLOSE(t->dw[r][1], dw_x[r][1], tol.grad_atol, tol.grad_rtol);
        ASSERT_CLOSE(t->db[r][0], db_x[r][0], tol.grad_atol, tol.grad_rtol);
        for (int64_t i = 0; i < n[r]; i++)
          for (int64_t s = 0; s < 4; s++) {
            const int64_t a0 = sbn_ref_index(&t->d[r], i, 0, s), a1 = sbn_ref_index(&t->d[r], i, 1, s);
            EXPECT_TRUE(sbn_ref_load(t->dx[r], dts[d], a0) == 0.0 && sbn_ref_load(dx_x[r], dts[d], a0) == 0.0);
            ASSERT_TRUE(isfinite(sbn_ref_load(t->dx[r], dts[d], a1)));
            if (dts[d] == sbnFloat32)
              ASSERT_CLOSE(sbn_ref_load(t->dx[r], dts[d], a1), sbn_ref_load(dx_x[r], dts[d], a1), tol.out_atol,
                           tol.out_rtol);
          }
        free(dx_x[r]);
      }
      fused_free(&f);
      CHECK_();
    }
}

/* What is refused, with nothing written: ReLU (not invertible) or a dz in the in-place
   backward, an activation without y, a bad epilogue; ranks whose activations differ. */
static void test_refusals(void) {
  int64_t n[MAXW] = {3};
  fused_t f;
  fused_make(&f, 1, sbnFloat32, sbnLayoutNCHW, 4, 5, n, 1, 0, kEpis[1], 5500);
  team_t* t = &f.t;
  sbnComm_t comm = team_comms(1)[0];
  ASSERT_OK(fused_run(&f, 0, Y_SEPARATE, NULL));
  const size_t bytes = team_bytes(t, 0);
  memset(t->dx[0], 0x7f, bytes);
  void* before = dup_mem(t->dx[0], bytes);
  sbnEpilogue_t relu = epilogue(kEpis[1]), leaky0 = epilogue((epi_t){sbnActivationLeakyRelu, 0.0f}),
                leaky = epilogue(kEpis[2]);
  ASSERT_RES(sbnBackwardEx(comm, &t->d[0], NULL, t->y[0], t->dy[0], t->dx[0], NULL, t->w, t->b, t->smean[0],
                           t->sinv[0], t->dw[0], t->db[0], NULL, &relu, NULL), sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(comm), "invertible") != NULL);
  ASSERT_RES(sbnBackwardEx(comm, &t->d[0], NULL, t->y[0], t->dy[0], t->dx[0], NULL, t->w, t->b, t->smean[0],
                           t->sinv[0], t->dw[0], t->db[0], NULL, &leaky0, NULL), sbnInvalidArgument);
  sbnEpilogue_t leaky_sub = epilogue((epi_t){sbnActivationLeakyRelu, 1e-39f}); /* subnormal: 1 / slope = inf */
  ASSERT_RES(sbnBackwardEx(comm, &t->d[0], NULL, t->y[0], t->dy[0], t->dx[0], NULL, t->w, t->b, t->smean[0],
                           t->sinv[0], t->dw[0], t->db[0], NULL, &leaky_sub, NULL), sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(comm), "leaky ReLU with slope 1e-39 is not") != NULL);
  ASSERT_RES(sbnBackwardEx(comm, &t->d[0], NULL, t->y[0], t->dy[0], t->dx[0], f.dz[0], t->w, t->b, t->smean[0],
                           t->sinv[0], t->dw[0], t->db[0], NULL, &leaky, NULL), sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(comm), "residual") != NULL);
  EXPECT_TRUE(strstr(sbnGetLastError(comm), "sbnBackwardInPlaceEx") != NULL);
  /* sbnBackwardInPlaceEx: ReLU; z under dx or dz (z is read in both passes); y NULL;
     no_residual = 1 with a z; z over y; dz without z */
  {
    void* z = f.dz[0]; /* any tensor: refused before it is read */
    ASSERT_RES(sbnBackwardInPlaceEx(comm, &t->d[0], t->y[0], z, t->dy[0], t->dx[0], NULL, t->w, t->b, t->smean[0],
                                    t->sinv[0], t->dw[0], t->db[0], NULL, &relu, NULL), sbnInvalidArgument);
    EXPECT_TRUE(strstr(sbnGetLastError(comm), "invertible") != NULL);
    ASSERT_RES(sbnBackwardInPlaceEx(comm, &t->d[0], t->y[0], z, t->dy[0], z, NULL, t->w, t->b, t->smean[0],
                                    t->sinv[0], t->dw[0], t->db[0], NULL, &leaky, NULL), sbnInvalidArgument);
    EXPECT_TRUE(strstr(sbnGetLastError(comm), "dx and z are the same memory") != NULL);
    ASSERT_RES(sbnBackwardInPlaceEx(comm, &t->d[0], t->y[0], z, t->dy[0], t->dx[0], z, t->w, t->b, t->smean[0],
                                    t->sinv[0], t->dw[0], t->db[0], NULL, &leaky, NULL), sbnInvalidArgument);
    EXPECT_TRUE(strstr(sbnGetLastError(comm), "dz and z are the same memory") != NULL);
    ASSERT_RES(sbnBackwardInPlaceEx(comm, &t->d[0], NULL, z, t->dy[0], t->dx[0], NULL, t->w, t->b, t->smean[0],
                                    t->sinv[0], t->dw[0], t->db[0], NULL, &leaky, NULL), sbnInvalidArgument);
    EXPECT_TRUE(strstr(sbnGetLastError(comm), "sbnBackwardInPlaceEx: y and dy must be non-NULL") != NULL);
    sbnEpilogue_t nores = leaky;
    nores.no_residual = 1;
    ASSERT_RES(sbnBackwardInPlaceEx(comm, &t->d[0], t->y[0], z, t->dy[0], t->dx[0], NULL, t->w, t->b, t->smean[0],
                                    t->sinv[0], t->dw[0], t->db[0], NULL, &nores, NULL), sbnInvalidArgument);
    EXPECT_TRUE(strstr(sbnGetLastError(comm), "no_residual is 1 and z is given") != NULL);
    /* z over y, whole or in part: a forward that wrote y over z left no z (the recovery
       would take y for it) */
    ASSERT_RES(sbnBackwardInPlaceEx(comm, &t->d[0], t->y[0], t->y[0], t->dy[0], t->dx[0], NULL, t->w, t->b,
                                    t->smean[0], t->sinv[0], t->dw[0], t->db[0], NULL, &leaky, NULL),
               sbnInvalidArgument);
    EXPECT_TRUE(strstr(sbnGetLastError(comm), "z and y are the same memory: a forward that wrote y over z") != NULL);
    ASSERT_RES(sbnBackwardInPlaceEx(comm, &t->d[0], t->y[0], (const char*)t->y[0] + 4, t->dy[0], t->dx[0], NULL,
                                    t->w, t->b, t->smean[0], t->sinv[0], t->dw[0], t->db[0], NULL, &leaky, NULL),
               sbnInvalidArgument);
    EXPECT_TRUE(strstr(sbnGetLastError(comm), "z and y overlap") != NULL);
    /* dz asked for without z */
    ASSERT_RES(sbnBackwardInPlaceEx(comm, &t->d[0], t->y[0], NULL, t->dy[0], t->dx[0], f.dz[0], t->w, t->b,
                                    t->smean[0], t->sinv[0], t->dw[0], t->db[0], NULL, &leaky, NULL),
               sbnInvalidArgument);
    EXPECT_TRUE(strstr(sbnGetLastError(comm), "pass the forward's z") != NULL);
  }
  ASSERT_RES(sbnBackwardEx(comm, &t->d[0], t->x[0], NULL, t->dy[0], t->dx[0], NULL, t->w, t->b, t->smean[0],
                           t->sinv[0], t->dw[0], t->db[0], NULL, &relu, NULL), sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(comm), "y (the forward's output) is required") != NULL);
  sbnEpilogue_t bad = relu;
  bad.size = sizeof(sbnEpilogue_t) - 1;
  ASSERT_RES(sbnBackwardEx(comm, &t->d[0], t->x[0], t->y[0], t->dy[0], t->dx[0], NULL, t->w, t->b, t->smean[0],
                           t->sinv[0], t->dw[0], t->db[0], NULL, &bad, NULL), sbnInvalidArgument);
  /* a caller built against a later header (a larger struct): taken while its added fields
     are 0, refused once one is set (a field this library does not know, never ignored) */
  struct {
    sbnEpilogue_t e;
    float more[3];
  } later;
  memset(&later, 0, sizeof later);
  later.e = relu;
  later.e.size = sizeof later;
  ASSERT_OK(sbnBackwardEx(comm, &t->d[0], t->x[0], t->y[0], t->dy[0], t->dx[0], NULL, t->w, t->b, t->smean[0],
                          t->sinv[0], t->dw[0], t->db[0], NULL, &later.e, NULL));
  memcpy(t->dx[0], before, bytes);
  /* a later field set: each byte past the struct is looked at, the last one too */
  for (size_t at = sizeof(sbnEpilogue_t); at < sizeof later; at++) {
    unsigned char* tail = (unsigned char*)&later + sizeof(sbnEpilogue_t); /* (padding too) */
    memset(tail, 0, sizeof later - sizeof(sbnEpilogue_t));
    ((unsigned char*)&later)[at] = 1;
    ASSERT_RES(sbnBackwardEx(comm, &t->d[0], t->x[0], t->y[0], t->dy[0], t->dx[0], NULL, t->w, t->b,
                             t->smean[0], t->sinv[0], t->dw[0], t->db[0], NULL, &later.e, NULL),
               sbnUnsupported);
    EXPECT_TRUE(strstr(sbnGetLastError(comm), "does not know") != NULL);
    ASSERT_TRUE(memcmp(t->dx[0], before, bytes) == 0);
  }
  later.more[2] = 1.0f;
  later.e.size = (size_t)SBN_EPILOGUE_MAX_SIZE + 1; /* garbage: refused before any byte past the struct is read */
  ASSERT_RES(sbnBackwardEx(comm, &t->d[0], t->x[0], t->y[0], t->dy[0], t->dx[0], NULL, t->w, t->b, t->smean[0],
                           t->sinv[0], t->dw[0], t->db[0], NULL, &later.e, NULL), sbnInvalidArgument);
  bad = relu;
  bad.activation = (sbnActivation_t)7;
  ASSERT_RES(sbnForwardTrainEx(comm, &t->d[0], t->x[0], NULL, t->dx[0], t->w, t->b, NULL, NULL, NULL, t->smean[0],
                               t->sinv[0], NULL, &bad, NULL), sbnInvalidArgument);
  /* a leaky slope must be finite and >= 0: -0.1, NaN, +-inf refused, y untouched */
  const float bad_slopes[] = {-0.1f, NAN, INFINITY, -INFINITY};
  void* y_before = dup_mem(t->dx[0], team_bytes(t, 0));
  for (int i = 0; i < 4; i++) {
    bad = leaky;
    bad.slope = bad_slopes[i];
    ASSERT_RES(sbnForwardTrainEx(comm, &t->d[0], t->x[0], NULL, t->dx[0], t->w, t->b, NULL, NULL, NULL, t->smean[0],
                                 t->sinv[0], NULL, &bad, NULL), sbnInvalidArgument);
    EXPECT_TRUE(strstr(sbnGetLastError(comm), "slope must be finite and >= 0") != NULL);
    ASSERT_MEMEQ(t->dx[0], y_before, team_bytes(t, 0));
  }
  /* the slope is read for leaky ReLU only: a ReLU's of any slope (NaN, inf, -1) is ReLU's,
     bitwise, as is identity's (dx, the y here, put back after: the calls below are refused) */
  void* dx_kept = dup_mem(t->dx[0], team_bytes(t, 0));
  for (int k = 0; k < 2; k++) {
    sbnEpilogue_t plain = k ? relu : epilogue(kEpis[0]);
    ASSERT_OK(sbnForwardTrainEx(comm, &t->d[0], t->x[0], NULL, t->dx[0], t->w, t->b, NULL, NULL, NULL, t->smean[0],
                                t->sinv[0], NULL, &plain, NULL));
    memcpy(y_before, t->dx[0], team_bytes(t, 0));
    for (int i = 0; i < 4; i++) {
      bad = plain;
      bad.slope = bad_slopes[i];
      memset(t->dx[0], 0x5a, team_bytes(t, 0));
      ASSERT_OK(sbnForwardTrainEx(comm, &t->d[0], t->x[0], NULL, t->dx[0], t->w, t->b, NULL, NULL, NULL,
                                  t->smean[0], t->sinv[0], NULL, &bad, NULL));
      ASSERT_MEMEQ(t->dx[0], y_before, team_bytes(t, 0));
    }
  }
  memcpy(t->dx[0], dx_kept, team_bytes(t, 0));
  free(dx_kept);
  free(y_before);
  /* a bias without a weight (the x-based backward took it as affine=False without a word),
     and dweight or dbias on a per-channel input the backward reads after writing them (the
     in-place dx read the bias dbias had overwritten: dx off by 0.5) */
  const size_t cb = (size_t)t->d[0].c * sizeof(float);
  float* w0 = dup_mem(t->w, cb);
  float* b0 = dup_mem(t->b, cb);
  float* si0 = dup_mem(t->sinv[0], cb);
  ASSERT_RES(sbnBackwardEx(comm, &t->d[0], t->x[0], t->y[0], t->dy[0], t->dx[0], NULL, NULL, t->b, t->smean[0],
                           t->sinv[0], t->dw[0], t->db[0], NULL, &leaky, NULL), sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(comm), "a bias without a weight") != NULL);
  /* the in-place backward given a weight and no bias (it would recover x as if the bias
     were 0): refused, nothing written */
  void* dx_now = dup_mem(t->dx[0], team_bytes(t, 0));
  ASSERT_RES(sbnBackwardEx(comm, &t->d[0], NULL, t->y[0], t->dy[0], t->dx[0], NULL, t->w, NULL,
                           t->smean[0], t->sinv[0], t->dw[0], t->db[0], NULL, &leaky, NULL),
             sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(comm), "the in-place backward reads weight and bias") != NULL);
  ASSERT_MEMEQ(t->dx[0], dx_now, team_bytes(t, 0));
  free(dx_now);
  ASSERT_RES(sbnBackwardEx(comm, &t->d[0], t->x[0], t->y[0], t->dy[0], t->dx[0], NULL, t->w, t->b, t->smean[0],
                           t->sinv[0], t->w, t->db[0], NULL, &leaky, NULL), sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(comm), "dweight and weight are the same memory") != NULL);
  ASSERT_RES(sbnBackwardEx(comm, &t->d[0], NULL, t->y[0], t->dy[0], t->dx[0], NULL, t->w, t->b, t->smean[0],
                           t->sinv[0], t->dw[0], t->b, NULL, &leaky, NULL), sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(comm), "dbias and bias are the same memory") != NULL);
  ASSERT_RES(sbnBackward(comm, &t->d[0], t->x[0], t->dy[0], t->dx[0], t->w, t->smean[0], t->sinv[0], t->dw[0],
                         t->sinv[0], NULL, NULL), sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(comm), "dbias and save_invstd are the same memory") != NULL);
  ASSERT_RES(sbnBackward(comm, &t->d[0], t->x[0], t->dy[0], t->dx[0], t->w, t->smean[0], t->sinv[0], t->dw[0],
                         t->dw[0], NULL, NULL), sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(comm), "dbias and dweight are the same memory: one would be lost") != NULL);
  /* a per-channel output at a tensor's address: the same start, not the same memory */
  ASSERT_RES(sbnBackward(comm, &t->d[0], t->x[0], t->dy[0], t->dx[0], t->w, t->smean[0], t->sinv[0],
                         t->dx[0], t->db[0], NULL, NULL),
             sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(comm),
                     "dweight and dx start at the same address: one would be lost") != NULL);
  EXPECT_TRUE(memcmp(w0, t->w, cb) == 0 && memcmp(b0, t->b, cb) == 0 && memcmp(si0, t->sinv[0], cb) == 0);
  free(w0);
  free(b0);
  free(si0);
  ASSERT_MEMEQ(t->dx[0], before, bytes);
  free(before);
  fused_free(&f);

  /* two ranks, two activations: the op's signature differs, both refuse */
  int64_t n2[MAXW] = {2, 2};
  fused_make(&f, 2, sbnFloat32, sbnLayoutNHWC, 3, 4, n2, 1, 0, kEpis[1], 5501);
  const epi_t mixed[2] = {kEpis[1], kEpis[0]};
  ASSERT_RES(fused_run(&f, 0, Y_SEPARATE, mixed), sbnInvalidUsage);
  EXPECT_TRUE(strstr(sbnGetLastError(team_comms(2)[0]), "ReLU") != NULL);
  /* refused by every rank, nothing run: the team is not aborted (USAGE.md), and the next
     op that agrees runs */
  for (int r = 0; r < 2; r++) {
    sbnResult_t async = sbnInvalidArgument;
    ASSERT_OK(sbnCommGetAsyncError(team_comms(2)[r], &async));
    ASSERT_RES(async, sbnSuccess);
  }
  ASSERT_OK(fused_run(&f, 0, Y_SEPARATE, NULL));
  check_fused_forward(&f, tol_for(sbnFloat32));
  fused_free(&f);
  team_comms_destroy();
}

/* Leaky ReLU's slope is each rank's own (not compared, not exchanged: it acts on the rank's
   elements only): ranks of slopes 0.1 and 0.3 in one op have the statistics of the
   identity op, bitwise, and each rank's y is its own slope's leaky ReLU of the identity
   op's y (fp32: the same fp32 product), and its backward's dz = dy * act'(y) with that slope. */
static void test_slope_per_rank(void) {
  int64_t n[MAXW] = {3, 2};
  fused_t f;
  fused_make(&f, 2, sbnFloat32, sbnLayoutNCHW, 3, 4, n, 1, 0, kEpis[0], 5520);
  team_t* t = &f.t;
  ASSERT_OK(fused_run(&f, 0, Y_SEPARATE, NULL)); /* identity */
  void* v[MAXW];
  float sm[MAXW][3], si[MAXW][3];
  for (int r = 0; r < 2; r++) {
    v[r] = dup_mem(t->y[r], team_bytes(t, r));
    memcpy(sm[r], t->smean[r], sizeof sm[r]), memcpy(si[r], t->sinv[r], sizeof si[r]);
  }
  const epi_t slopes[2] = {{sbnActivationLeakyRelu, 0.1f}, {sbnActivationLeakyRelu, 0.3f}};
  team_reset_running(t);
  ASSERT_OK(fused_run(&f, 0, Y_SEPARATE, slopes));
  for (int r = 0; r < 2; r++) {
    ASSERT_MEMEQ(t->smean[r], sm[r], sizeof sm[r]);
    ASSERT_MEMEQ(t->sinv[r], si[r], sizeof si[r]);
    const float* vr = (const float*)v[r];
    const float* yr = (const float*)t->y[r];
    for (int64_t i = 0; i < n[r] * 3 * 4; i++) {
      const float want = vr[i] > 0.0f ? vr[i] : slopes[r].slope * vr[i];
      ASSERT_BITEQ_F32(yr[i], want);
    }
  }
  ASSERT_OK(fused_run(&f, 1, 0, slopes)); /* dz separate */
  for (int r = 0; r < 2; r++) {
    const float* yr = (const float*)t->y[r];
    const float* dy = (const float*)t->dy0[r];
    const float* dz = (const float*)f.dz[r];
    for (int64_t i = 0; i < n[r] * 3 * 4; i++) {
      const float want = yr[i] > 0.0f ? dy[i] : slopes[r].slope * dy[i];
      ASSERT_BITEQ_F32(dz[i], want);
    }
    free(v[r]);
  }
  fused_free(&f);
}

/* Whole-buffer aliases the contract allows give the separate buffers' bits: the backward's
   dx over x or over y, dz over x or over y, and the in-place pattern (x NULL, dx over y);
   the forward's y over x or over z; inference's y over x or over z. Every dtype and
   layout, identity, ReLU and leaky ReLU, with and without z, a team of 2 with uneven n:
   a library that wrote an output before it had read all of an input it overwrites
   would differ here (the other tests give every output its own buffer). */
typedef struct {
  sbnResult_t res; /* first: run_ranks reads it */
  fused_t* f;
  int r;
  int mode; /* ALIAS_* */
  void* dx; /* the results, in buffers of their own */
  void* dz;
} alias_call_t;
/* ..._FROM_Y: the in-place backward (x NULL; with the forward's z: sbnBackwardInPlaceEx,
   whose dz, where there is a z, goes over dy with dx over y, and over y with dx over dy) */
enum {
  ALIAS_NONE, ALIAS_DX_X, ALIAS_DX_Y, ALIAS_DZ_X, ALIAS_DZ_Y, ALIAS_NONE_FROM_Y, ALIAS_DX_Y_FROM_Y, ALIAS_DX_DY_FROM_Y
};

static void* alias_call(void* arg) {
  alias_call_t* a = (alias_call_t*)arg;
  team_t* t = &a->f->t;
  const int r = a->r;
  const size_t bytes = team_bytes(t, r);
  void* x = bytes ? dup_mem(t->x0[r], bytes) : NULL;
  void* y = bytes ? dup_mem(t->y[r], bytes) : NULL;
  void* dy = bytes ? dup_mem(t->dy0[r], bytes) : NULL;
  void* dx = bytes ? malloc(bytes) : NULL;
  void* dz = bytes ? malloc(bytes) : NULL;
  const int from_y = a->mode >= ALIAS_NONE_FROM_Y;
  void* z = from_y && bytes && a->f->z0[r] ? dup_mem(a->f->z0[r], bytes) : NULL;
  void* dx_at = a->mode == ALIAS_DX_X ? x
                : a->mode == ALIAS_DX_Y || a->mode == ALIAS_DX_Y_FROM_Y ? y
                : a->mode == ALIAS_DX_DY_FROM_Y ? dy
                                                : dx;
  void* dz_at = from_y ? (z == NULL ? NULL : a->mode == ALIAS_DX_Y_FROM_Y ? dy : a->mode == ALIAS_DX_DY_FROM_Y ? y : dz)
                : a->mode == ALIAS_DZ_X ? x
                : a->mode == ALIAS_DZ_Y ? y
                                        : dz;
  sbnEpilogue_t e = epilogue(a->f->e);
  a->res = backward_ex(team_comms(t->W)[r], &t->d[r], from_y ? NULL : x, z, y, dy, dx_at, dz_at, t->w, t->b,
                       t->smean[r], t->sinv[r], t->dw[r], t->db[r], a->f->p, &e, NULL);
  if (bytes) {
    memcpy(a->dx, dx_at, bytes);
    if (dz_at) memcpy(a->dz, dz_at, bytes);
  }
  free(x), free(y), free(dy), free(dx), free(dz), free(z);
  return NULL;
}

/* Runs the backward of mode over the team; the results into dx[r], dz[r], t->dw, t->db. */
static sbnResult_t alias_run(fused_t* f, int mode, void** dx, void** dz) {
  alias_call_t a[MAXW];
  for (int r = 0; r < f->t.W; r++) {
    alias_call_t ar = {sbnSuccess, f, r, mode, dx[r], dz[r]};
    a[r] = ar;
  }
  return run_ranks(f->t.W, alias_call, a, sizeof a[0]);
}

static void test_whole_aliases_equal_separate(void) {
  const sbnDataType_t dts[] = {sbnFloat32, sbnFloat16, sbnBFloat16};
  const epi_t es[] = {{sbnActivationIdentity, 0.01f}, {sbnActivationRelu, 0.01f}, {sbnActivationLeakyRelu, 0.2f}};
  int64_t n[MAXW] = {3, 2};
  uint64_t seed = 6100;
  for (int d = 0; d < 3; d++)
    for (int lay = 0; lay < 2; lay++)
      for (int k = 0; k < 3; k++)
        for (int with_z = 0; with_z < 2; with_z++) {
          fused_t f;
          fused_make(&f, 2, dts[d], (sbnLayout_t)lay, 4, 5, n, 1, with_z, es[k], seed++);
          team_t* t = &f.t;
          const size_t cb = 4 * sizeof(float);
          void* y_ref[MAXW];
          float sm_ref[MAXW][4], si_ref[MAXW][4];
          /* the forward: y separate, then over x, then over z (fused_run moves it to t->y) */
          ASSERT_OK(fused_run(&f, 0, Y_SEPARATE, NULL));
          for (int r = 0; r < 2; r++) {
            y_ref[r] = dup_mem(t->y[r], team_bytes(t, r));
            memcpy(sm_ref[r], t->smean[r], cb), memcpy(si_ref[r], t->sinv[r], cb);
          }
          for (int where = Y_IN_X; where <= (with_z ? Y_IN_Z : Y_IN_X); where++) {
            ASSERT_OK(fused_run(&f, 0, where, NULL));
            for (int r = 0; r < 2; r++) {
              ASSERT_MEMEQ(t->y[r], y_ref[r], team_bytes(t, r));
              ASSERT_MEMEQ(t->smean[r], sm_ref[r], cb);
              ASSERT_MEMEQ(t->sinv[r], si_ref[r], cb);
            }
          }
          /* inference (no comm, each rank alone): y over x, over z */
          const sbnEpilogue_t e = epilogue(es[k]);
          for (int r = 0; r < 2; r++) {
            const size_t bytes = team_bytes(t, r);
            void* xi = dup_mem(t->x0[r], bytes);
            void* zi = with_z ? dup_mem(f.z0[r], bytes) : NULL;
            void* yi = malloc(bytes);
            ASSERT_TRUE(xi != NULL && yi != NULL);
            ASSERT_OK(sbnForwardInferenceEx(&t->d[r], xi, zi, yi, t->w, t->b, t->rm[r], t->rv[r], 1e-5f, &e, NULL));
            ASSERT_OK(sbnForwardInferenceEx(&t->d[r], xi, zi, xi, t->w, t->b, t->rm[r], t->rv[r], 1e-5f, &e, NULL));
            ASSERT_MEMEQ(xi, yi, bytes);
            if (with_z) {
              memcpy(xi, t->x0[r], bytes);
              ASSERT_OK(sbnForwardInferenceEx(&t->d[r], xi, zi, zi, t->w, t->b, t->rm[r], t->rv[r], 1e-5f, &e, NULL));
              ASSERT_MEMEQ(zi, yi, bytes);
            }
            free(xi), free(zi), free(yi);
          }
          /* the backward from the forward's y: each alias against separate buffers */
          void *dx[MAXW], *dz[MAXW], *dx_ref[MAXW], *dz_ref[MAXW];
          float dw_ref[MAXW][4], db_ref[MAXW][4];
          for (int r = 0; r < 2; r++) {
            const size_t bytes = team_bytes(t, r);
            dx[r] = malloc(bytes), dz[r] = malloc(bytes), dx_ref[r] = malloc(bytes), dz_ref[r] = malloc(bytes);
            ASSERT_TRUE(dx[r] && dz[r] && dx_ref[r] && dz_ref[r]);
          }
          /* the in-place backward takes identity or leaky ReLU (with z: sbnBackwardInPlaceEx) */
          const int from_y_ok = es[k].act != sbnActivationRelu;
          for (int base = ALIAS_NONE; base <= (from_y_ok ? ALIAS_NONE_FROM_Y : ALIAS_NONE); base += ALIAS_NONE_FROM_Y) {
            ASSERT_OK(alias_run(&f, base, dx_ref, dz_ref));
            for (int r = 0; r < 2; r++) memcpy(dw_ref[r], t->dw[r], cb), memcpy(db_ref[r], t->db[r], cb);
            const int lo = base == ALIAS_NONE ? ALIAS_DX_X : ALIAS_DX_Y_FROM_Y;
            const int hi = base == ALIAS_NONE ? ALIAS_DZ_Y : ALIAS_DX_DY_FROM_Y;
            for (int mode = lo; mode <= hi; mode++) {
              ASSERT_OK(alias_run(&f, mode, dx, dz));
              for (int r = 0; r < 2; r++) {
                const size_t bytes = team_bytes(t, r);
                ASSERT_MEMEQ(dx[r], dx_ref[r], bytes);
                if (base == ALIAS_NONE || with_z) ASSERT_MEMEQ(dz[r], dz_ref[r], bytes);
                ASSERT_MEMEQ(t->dw[r], dw_ref[r], cb);
                ASSERT_MEMEQ(t->db[r], db_ref[r], cb);
              }
            }
          }
          for (int r = 0; r < 2; r++) free(y_ref[r]), free(dx[r]), free(dz[r]), free(dx_ref[r]), free(dz_ref[r]);
          fused_free(&f);
          CHECK_();
        }
}

/* ReLU's gradient where y is NaN (a NaN in z): passed on, as PyTorch's threshold_backward
   (only y <= 0 stops it); and dx == dz refused (one would be lost). */
static void test_relu_nan_and_aliasing(void) {
  int64_t n[MAXW] = {4};
  fused_t f;
  fused_make(&f, 1, sbnFloat32, sbnLayoutNCHW, 2, 3, n, 1, 1, kEpis[1], 5700);
  ((float*)f.z[0])[0] = NAN;
  ((float*)f.z0[0])[0] = NAN;
  ASSERT_OK(fused_run(&f, 0, Y_SEPARATE, NULL));
  EXPECT_TRUE(isnan(((float*)f.t.y[0])[0]));
  ASSERT_OK(fused_run(&f, 1, 0, NULL));
  ASSERT_BITEQ_F32(((float*)f.dz[0])[0], ((float*)f.t.dy0[0])[0]);
  team_t* t = &f.t;
  sbnEpilogue_t e = epilogue(kEpis[1]);
  sbnComm_t comm = team_comms(1)[0];
  ASSERT_RES(sbnBackwardEx(comm, &t->d[0], t->x[0], t->y[0], t->dy[0], t->dx[0], t->dx[0], t->w, t->b, t->smean[0],
                           t->sinv[0], t->dw[0], t->db[0], NULL, &e, NULL), sbnInvalidArgument);
  fused_free(&f);
}

/* Buffers that overlap where the API allows no alias, or only a whole one: refused, naming
   both, with nothing written (y one element into x or half into z, save_invstd on
   save_mean, running_var on running_mean, save_mean one float into the weight; in the
   backward x == y, dz one element into dx, dweight into weight, dbias into dweight; y one
   element into x in inference). The whole aliases still run: y == x, dx == x, dz == dy. */
static void test_overlaps(void) {
  int64_t n[MAXW] = {3};
  fused_t f;
  fused_make(&f, 1, sbnFloat32, sbnLayoutNCHW, 4, 5, n, 1, 1, kEpis[2], 5800);
  team_t* t = &f.t;
  const sbnTensorDesc_t* d = &t->d[0];
  sbnComm_t comm = team_comms(1)[0];
  sbnEpilogue_t e = epilogue(kEpis[2]);
  ASSERT_OK(fused_run(&f, 0, Y_SEPARATE, NULL));
  const size_t bytes = team_bytes(t, 0), cb = (size_t)d->c * sizeof(float);
  unsigned char* buf = malloc(2 * bytes);
  float* chan = malloc(4 * cb); /* per-channel arrays, packed: [0, c) and [c, 2c) */
  float* run = malloc(2 * cb);
  ASSERT_TRUE(buf != NULL && chan != NULL && run != NULL);
  memcpy(buf, t->x[0], bytes);
  memcpy(buf + bytes, t->x[0], bytes);
  memcpy(chan, t->w, cb);
  memcpy(chan + d->c, t->w, cb);
  memcpy(run, t->w, cb);
  memcpy(run + d->c, t->w, cb);
  void* buf0 = dup_mem(buf, 2 * bytes);
  void* chan0 = dup_mem(chan, 4 * cb);
  void* run0 = dup_mem(run, 2 * cb);
  void* y0 = dup_mem(t->y[0], bytes);
  float* sm0 = dup_mem(t->smean[0], cb);
  float* si0 = dup_mem(t->sinv[0], cb);
  float* w0 = dup_mem(t->w, cb);
  const char* err = NULL;
#define REFUSED(call, text)                                 \
  do {                                                      \
    ASSERT_RES(call, sbnInvalidArgument);                   \
    err = sbnGetLastError(comm);                            \
    EXPECT_TRUE(err != NULL && strstr(err, text) != NULL);  \
  } while (0)
  REFUSED(sbnForwardTrainEx(comm, d, buf, NULL, buf + 4, t->w, t->b, NULL, NULL, NULL, t->smean[0], t->sinv[0],
                            NULL, &e, NULL),
          "y and x overlap: y starts 4 bytes into x");
  REFUSED(sbnForwardTrainEx(comm, d, t->x[0], buf, buf + bytes / 2, t->w, t->b, NULL, NULL, NULL, t->smean[0],
                            t->sinv[0], NULL, &e, NULL),
          "y and z overlap");
  REFUSED(sbnForwardTrainEx(comm, d, t->x[0], NULL, t->y[0], t->w, t->b, NULL, NULL, NULL, t->smean[0],
                            t->smean[0], NULL, &e, NULL),
          "save_invstd and save_mean are the same memory: one would be lost");
  REFUSED(sbnForwardTrain(comm, d, t->x[0], t->y[0], t->w, t->b, run, run, NULL, t->smean[0], t->sinv[0], NULL,
                          NULL),
          "running_var and running_mean are the same memory");
  REFUSED(sbnForwardTrain(comm, d, t->x[0], t->y[0], chan, t->b, NULL, NULL, NULL, chan + 1, t->sinv[0], NULL,
                          NULL),
          "save_mean and weight overlap: save_mean starts 4 bytes into weight");
  REFUSED(sbnBackwardEx(comm, d, t->y[0], t->y[0], t->dy[0], t->dx[0], NULL, t->w, t->b, t->smean[0],
                        t->sinv[0], t->dw[0], t->db[0], NULL, &e, NULL),
          "x and y are the same memory");
  REFUSED(sbnBackwardEx(comm, d, t->y[0], t->y[0], t->dy[0], NULL, NULL, t->w, t->b, t->smean[0], t->sinv[0],
                        t->dw[0], NULL, NULL, &e, NULL),
          "x and y are the same memory");
  REFUSED(sbnBackwardEx(comm, d, t->x[0], t->y[0], t->dy[0], buf, buf + 4, t->w, t->b, t->smean[0], t->sinv[0],
                        t->dw[0], t->db[0], NULL, &e, NULL),
          "dx and dz overlap: dz starts 4 bytes into dx");
  REFUSED(sbnBackward(comm, d, t->x[0], t->dy[0], t->dx[0], chan, t->smean[0], t->sinv[0], chan + 1, t->db[0],
                      NULL, NULL),
          "dweight and weight overlap");
  REFUSED(sbnBackward(comm, d, t->x[0], t->dy[0], t->dx[0], t->w, t->smean[0], t->sinv[0], chan, chan + 2, NULL,
                      NULL),
          "dbias and dweight overlap: dbias starts 8 bytes into dweight");
#undef REFUSED
  ASSERT_RES(sbnForwardInferenceEx(d, buf, NULL, buf + 4, t->w, t->b, run, run + d->c, 1e-5f, &e, NULL),
             sbnInvalidArgument); /* no comm: the thread's message */
  err = sbnGetLastError(NULL);
  EXPECT_TRUE(err != NULL && strstr(err, "sbnForwardInferenceEx: y and x overlap") != NULL);
  ASSERT_MEMEQ(buf, buf0, 2 * bytes);
  ASSERT_MEMEQ(chan, chan0, 4 * cb);
  ASSERT_MEMEQ(run, run0, 2 * cb);
  ASSERT_MEMEQ(t->y[0], y0, bytes);
  ASSERT_MEMEQ(t->smean[0], sm0, cb);
  ASSERT_MEMEQ(t->sinv[0], si0, cb);
  ASSERT_MEMEQ(t->w, w0, cb);
  /* x == y with neither dx nor dweight asked for: dz and dbias need dy and y alone, and are
     the separate buffers' (ReLU and a residual, which the in-place backward cannot take) */
  sbnEpilogue_t relu = epilogue(kEpis[1]);
  ASSERT_OK(sbnForwardTrainEx(comm, d, t->x[0], f.z[0], t->y[0], t->w, t->b, NULL, NULL, NULL, t->smean[0],
                              t->sinv[0], NULL, &relu, NULL));
  float* db1 = malloc(cb);
  void* dz1 = malloc(bytes);
  ASSERT_TRUE(db1 != NULL && dz1 != NULL);
  ASSERT_OK(sbnBackwardEx(comm, d, t->x[0], t->y[0], t->dy[0], t->dx[0], f.dz[0], t->w, t->b, t->smean[0],
                          t->sinv[0], t->dw[0], t->db[0], NULL, &relu, NULL));
  ASSERT_OK(sbnBackwardEx(comm, d, t->y[0], t->y[0], t->dy[0], NULL, dz1, t->w, t->b, t->smean[0], t->sinv[0],
                          NULL, db1, NULL, &relu, NULL));
  ASSERT_MEMEQ(dz1, f.dz[0], bytes);
  ASSERT_MEMEQ(db1, t->db[0], cb);
  free(db1);
  free(dz1);
  /* whole aliases: y over x, then dx over x and dz over dy */
  ASSERT_OK(sbnForwardTrainEx(comm, d, buf, NULL, buf, t->w, t->b, NULL, NULL, NULL, t->smean[0], t->sinv[0], NULL,
                              NULL, NULL));
  memcpy(buf, t->x[0], bytes);
  memcpy(buf + bytes, t->dy[0], bytes);
  ASSERT_OK(sbnBackwardEx(comm, d, buf, t->y[0], buf + bytes, buf, buf + bytes, t->w, t->b, t->smean[0], t->sinv[0],
                          t->dw[0], t->db[0], NULL, &e, NULL));
  free(buf);
  free(chan);
  free(run);
  free(buf0);
  free(chan0);
  free(run0);
  free(y0);
  free(sm0);
  free(si0);
  free(w0);
  fused_free(&f);
}

/* Inference: act(bn_eval(x) + z), the training formula with the running statistics. */
static void test_inference_ex(void) {
  const sbnDataType_t dts[] = {sbnFloat32, sbnBFloat16};
  for (int d = 0; d < 3; d++)
    for (int k = 0; k < NEPI; k++) {
      int64_t n[MAXW] = {3};
      /* d == 2: C = 300 (channel blocks of 256: the second starts at c0 = 256) */
      const int64_t c = d == 2 ? 300 : 5, sp = d == 2 ? 3 : 7;
      fused_t f;
      fused_make(&f, 1, dts[d % 2], (sbnLayout_t)(k % 2), c, sp, n, 1, 1, kEpis[k], 5600u + (uint64_t)(d * 10 + k));
      team_t* t = &f.t;
      sbnEpilogue_t e = epilogue(kEpis[k]);
      ASSERT_OK(sbnForwardInferenceEx(&t->d[0], t->x[0], f.z[0], t->y[0], t->w, t->b, t->rm0, t->rv0, 1e-5f, &e,
                                      NULL));
      int64_t ne = sbn_ref_numel(&t->d[0]);
      double* ref = dvec(ne);
      sbn_ref_inference(&t->d[0], t->x0[0], t->w, t->b, t->rm0, t->rv0, 1e-5, ref);
      sbn_ref_epilogue(&t->d[0], f.z0[0], kEpis[k].act, kEpis[k].slope, ref);
      tol_t tol = tol_for(dts[d % 2]);
      check_array("y (inference)", t->y[0], dts[d % 2], ref, ne, tol.out_atol, tol.out_rtol);
      free(ref);
      fused_free(&f);
      CHECK_();
    }
}

int main(void) {
  SBN_RUN(test_fused_vs_ref);
  SBN_RUN(test_fused_uneven_empty_wide);
  SBN_RUN(test_identity_is_the_plain_op);
  SBN_RUN(test_inplace_backward_within_bound);
  SBN_RUN(test_inplace_backward_residual);
  SBN_RUN(test_inplace_backward_zero_weight);
  SBN_RUN(test_inplace_backward_eps0);
  SBN_RUN(test_refusals);
  SBN_RUN(test_slope_per_rank);
  SBN_RUN(test_overlaps);
  SBN_RUN(test_whole_aliases_equal_separate);
  SBN_RUN(test_relu_nan_and_aliasing);
  SBN_RUN(test_inference_ex);
  team_comms_destroy();
  return sbn_test_exit();
}
