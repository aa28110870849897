/* test_stress.c — protocol stress for the CPU team (runs under ThreadSanitizer in CI).
 *
 * Part 1: a team of 8 ranks, one long-lived thread per rank, no groups, thousands of
 * forward+backward pairs back to back with a different shape every op: random C (1..16),
 * spatial (1..5), dtype, layout, options, and a random n per rank (zeros included,
 * sometimes every rank empty, sometimes M == 1). The ranks drift apart in time, so
 * the exchange sees every interleaving of early and late ranks.
 * Part 2: the same team driven by groups from one thread, forward and backward in
 * separate groups or queued together in one.
 *
 * Every rank must agree on each op's shape: it is derived from a per-op seed, so every
 * thread draws the same C/dtype/layout/parameters and all ranks' n (each thread then
 * uses its own n and regenerates every rank's data to run the double reference itself).
 * Checked per op: results against sbn_ref, and (after the threads join) bitwise rank
 * agreement of save_mean/save_invstd/running stats/nbt and of global-mode dweight/dbias.
 *
 * A failed check never stops a thread (the team would deadlock): it is counted and the
 * thread goes on. An op that times out aborts the team, after which every call fails
 * fast, so the threads finish. SBN_STRESS_OPS sets the number of pairs (default 3000),
 * SBN_STRESS_SEED the seed.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <time.h>

#include "harness.h"
#include "sbn_ref.h"

#define W 8
#define MAXC 16
#define MAXN 4
#define MAXS 5
#define MAXE (MAXN * MAXC * MAXS)
#define DEFAULT_OPS 3000
#define POISON 0xA5

/* ---- failures: counted atomically, the first few printed with op index and rank ------ */
static atomic_int g_fail;

static void failf(const char* part, long k, int r, const char* fmt, ...) {
  int n = atomic_fetch_add(&g_fail, 1);
  if (n >= 40) return; /* enough to diagnose */
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "FAILED [%s op %ld rank %d]: %s\n", part, k, r, msg);
}

static uint64_t mix(uint64_t a, uint64_t b) {
  sbn_rng_t r = {a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull)};
  return sbn_rng_u64(&r);
}

/* ---- the op: shape and parameters shared by all ranks ---------------------------------- */
typedef struct {
  long k;
  sbnDataType_t dt;
  sbnLayout_t lay;
  int64_t c, spatial, n[W], m;
  int affine, running, nbt_null, fwd_bwd_one_group;
  sbnParams_t p;
  float w[MAXC], b[MAXC], rm0[MAXC], rv0[MAXC], off[MAXC], scale[MAXC];
  int64_t nbt0;
} spec_t;

static void make_spec(uint64_t seed, long k, spec_t* s) {
  sbn_rng_t g = {mix(seed, (uint64_t)k)};
  memset(s, 0, sizeof *s);
  s->k = k;
  s->dt = (sbnDataType_t)sbn_rng_int(&g, 0, 2);
  s->lay = (sbnLayout_t)sbn_rng_int(&g, 0, 1);
  s->c = sbn_rng_int(&g, 1, MAXC);
  s->spatial = sbn_rng_int(&g, 1, MAXS);
  int shape = (int)sbn_rng_int(&g, 0, 99);
  for (int r = 0; r < W; r++) {
    if (shape < 8) s->n[r] = 0;                               /* everyone empty: M == 0 */
    else s->n[r] = sbn_rng_uniform(&g) < 0.3 ? 0 : sbn_rng_int(&g, 1, MAXN);
  }
  if (shape >= 8 && shape < 12) { /* M == 1: one rank has one element, the rest none */
    s->spatial = 1;
    for (int r = 0; r < W; r++) s->n[r] = 0;
    s->n[sbn_rng_int(&g, 0, W - 1)] = 1;
  }
  s->m = 0;
  for (int r = 0; r < W; r++) s->m += s->n[r] * s->spatial;
  s->affine = sbn_rng_uniform(&g) < 0.75;
  s->running = sbn_rng_uniform(&g) < 0.75;
  const float momenta[] = {0.1f, 0.0f, 1.0f, -1.0f};
  const float epss[] = {1e-5f, 1e-3f, 0.1f};
  s->p.momentum = momenta[sbn_rng_int(&g, 0, 3)];
  s->p.eps = epss[sbn_rng_int(&g, 0, 2)];
  s->p.grad_mode = sbn_rng_uniform(&g) < 0.5 ? sbnGradLocal : sbnGradGlobal;
  s->nbt_null = s->p.momentum >= 0.0f && sbn_rng_uniform(&g) < 0.2;
  s->nbt0 = sbn_rng_int(&g, 0, 10);
  s->fwd_bwd_one_group = sbn_rng_uniform(&g) < 0.5;
  for (int i = 0; i < MAXC; i++) {
    s->w[i] = (float)(0.5 + sbn_rng_uniform(&g)) * (i % 3 == 2 ? -1.0f : 1.0f);
    s->b[i] = (float)(sbn_rng_uniform(&g) - 0.5);
    s->rm0[i] = (float)(sbn_rng_uniform(&g) - 0.5);
    s->rv0[i] = (float)(0.5 + sbn_rng_uniform(&g));
    s->off[i] = (float)(2.0 * sbn_rng_uniform(&g) - 1.0);
    s->scale[i] = (float)(0.5 + 1.5 * sbn_rng_uniform(&g));
  }
}

static sbnTensorDesc_t rank_desc(const spec_t* s, int r) {
  sbnTensorDesc_t d = {s->dt, s->lay, s->n[r], s->c, s->spatial};
  return d;
}

/* Rank r's x and dy for op k, stored in the op's dtype (rounded): the same bits on every
   thread that generates them. */
static void gen_rank_data(uint64_t seed, const spec_t* s, int r, void* x, void* dy) {
  sbn_rng_t g = {mix(mix(seed, (uint64_t)s->k), 1000u + (uint64_t)r)};
  sbnTensorDesc_t d = rank_desc(s, r);
  for (int64_t ni = 0; ni < d.n; ni++)
    for (int64_t ci = 0; ci < d.c; ci++)
      for (int64_t si = 0; si < d.spatial; si++) {
        int64_t i = sbn_ref_index(&d, ni, ci, si);
        double u = 2.0 * sbn_rng_uniform(&g) - 1.0;
        sbn_ref_store(x, d.dtype, i, s->off[ci] + s->scale[ci] * 1.7 * u);
        sbn_ref_store(dy, d.dtype, i, 2.0 * sbn_rng_uniform(&g) - 1.0);
      }
}

/* ---- one rank's buffers for one op -------------------------------------------------------- */
typedef struct {
  sbnTensorDesc_t d;
  unsigned char x[MAXE * 4], dy[MAXE * 4], y[MAXE * 4], dx[MAXE * 4];
  float rm[MAXC], rv[MAXC], sm[MAXC], si[MAXC], dw[MAXC], db[MAXC];
  int64_t nbt;
  int inplace_fwd, inplace_bwd, dx_null, dw_null, db_null; /* this rank's own choices */
} rank_op_t;

/* Every rank's inputs, regenerated by whoever needs the reference. */
typedef struct {
  unsigned char x[W][MAXE * 4], dy[W][MAXE * 4];
} team_data_t;

static void prepare_rank(uint64_t seed, const spec_t* s, int r, const team_data_t* td,
                         rank_op_t* o, int allow_inplace_fwd) {
  memset(o, POISON, sizeof *o);
  o->d = rank_desc(s, r);
  size_t bytes = (size_t)sbn_ref_numel(&o->d) * (s->dt == sbnFloat32 ? 4 : 2);
  memcpy(o->x, td->x[r], bytes);
  memcpy(o->dy, td->dy[r], bytes);
  memcpy(o->rm, s->rm0, sizeof o->rm);
  memcpy(o->rv, s->rv0, sizeof o->rv);
  o->nbt = s->nbt0;
  sbn_rng_t g = {mix(mix(seed, (uint64_t)s->k), 2000u + (uint64_t)r)};
  o->inplace_fwd = allow_inplace_fwd && sbn_rng_uniform(&g) < 0.25;
  o->inplace_bwd = sbn_rng_uniform(&g) < 0.25;
  o->dx_null = sbn_rng_uniform(&g) < 0.15;
  o->dw_null = sbn_rng_uniform(&g) < 0.15;
  o->db_null = sbn_rng_uniform(&g) < 0.15;
}

static sbnResult_t call_forward(sbnComm_t comm, const spec_t* s, rank_op_t* o) {
  void* y = o->inplace_fwd ? (void*)o->x : (void*)o->y;
  const int empty = o->d.n == 0;
  return sbnForwardTrain(comm, &o->d, empty ? NULL : o->x, empty ? NULL : y,
                         s->affine ? s->w : NULL, s->affine ? s->b : NULL,
                         s->running ? o->rm : NULL, s->running ? o->rv : NULL,
                         s->nbt_null ? NULL : &o->nbt, o->sm, o->si, &s->p, NULL);
}

static sbnResult_t call_backward(sbnComm_t comm, const spec_t* s, rank_op_t* o) {
  void* dx = o->dx_null ? NULL : o->inplace_bwd ? (void*)o->dy : (void*)o->dx;
  const int empty = o->d.n == 0;
  return sbnBackward(comm, &o->d, empty ? NULL : o->x, empty ? NULL : o->dy, dx,
                     s->affine ? s->w : NULL, o->sm, o->si, o->dw_null ? NULL : o->dw,
                     o->db_null ? NULL : o->db, &s->p, NULL);
}

/* After an in-place forward, y is in x: move it to y and restore x for the backward. */
static void after_forward(const team_data_t* td, int r, rank_op_t* o) {
  if (!o->inplace_fwd) return;
  size_t bytes = (size_t)sbn_ref_numel(&o->d) * (o->d.dtype == sbnFloat32 ? 4 : 2);
  memcpy(o->y, o->x, bytes);
  memcpy(o->x, td->x[r], bytes);
}
static const void* dx_result(const rank_op_t* o) {
  return o->inplace_bwd ? (const void*)o->dy : (const void*)o->dx;
}

/* ---- checks against the reference ------------------------------------------------------- */
/* Tolerances (DESIGN.md): statistics and running stats 1e-5/1e-5; fp32 y/dx and every
   dweight/dbias 1e-4/1e-4; fp16 y/dx 2e-3/2e-3 and bf16's 1e-2/1e-2 (a few half ulps of
   each: 2^-11 and 2^-8 relative) against the double reference of the rounded (stored)
   inputs. Statistics and grads accumulate in fp32 from exactly widened
   inputs, so they keep fp32 tolerances for every dtype. The mean's atol is scaled by
   (1 + sd): fp32 mean error is relative to the data's spread, and |mean| may be ~0. */
#define STAT_TOL 1e-5
#define OUT_TOL_F32 1e-4
#define OUT_TOL_F16 2e-3
#define OUT_TOL_BF16 1e-2
/* The outputs' (y, dx) tolerance of dtype dt. */
static double out_tol(sbnDataType_t dt) {
  return dt == sbnFloat32 ? OUT_TOL_F32 : dt == sbnFloat16 ? OUT_TOL_F16 : OUT_TOL_BF16;
}
#define GRAD_TOL 1e-4

typedef struct {
  double mean[MAXC], invstd[MAXC], varu[MAXC], rm[MAXC], rv[MAXC];
  double y[MAXE], dx[MAXE];
  double dwl[W][MAXC], dbl[W][MAXC], dwg[MAXC], dbg[MAXC];
  int64_t m;
} ref_t;

static int close1(double got, double ref, double atol, double rtol) {
  return sbn_close_(got, ref, atol, rtol);
}

/* Checks rank r's forward outputs; returns the number of failures. */
static int check_forward(const char* part, const spec_t* s, int r, const team_data_t* td,
                         const rank_op_t* o, ref_t* ref) {
  sbnTensorDesc_t descs[W];
  const void* xs[W];
  double* ys[W] = {0};
  for (int q = 0; q < W; q++) {
    descs[q] = rank_desc(s, q);
    xs[q] = td->x[q];
  }
  ys[r] = ref->y;
  sbn_ref_forward(W, descs, xs, s->affine ? s->w : NULL, s->affine ? s->b : NULL,
                  (double)s->p.eps, ref->mean, ref->invstd, ref->varu, &ref->m, ys);
  int bad = 0;
  if (ref->m != s->m) { failf(part, s->k, r, "reference M %lld != %lld", (long long)ref->m, (long long)s->m); bad++; }
  for (int64_t c = 0; c < s->c; c++) {
    double sd = ref->m > 0 ? sqrt(ref->varu[c] * (double)(ref->m - 1) / (double)ref->m) : 0.0;
    if (!close1(o->sm[c], ref->mean[c], STAT_TOL * (1.0 + sd), STAT_TOL) ||
        !close1(o->si[c], ref->invstd[c], STAT_TOL, STAT_TOL)) {
      failf(part, s->k, r, "channel %lld: save_mean %.9g (ref %.9g), save_invstd %.9g (ref %.9g), M %lld",
            (long long)c, (double)o->sm[c], ref->mean[c], (double)o->si[c], ref->invstd[c], (long long)s->m);
      bad++;
      break;
    }
  }
  if (s->m == 0) {
    for (int64_t c = 0; c < s->c; c++)
      if (o->sm[c] != 0.0f || o->si[c] != 1.0f / sqrtf(s->p.eps)) {
        failf(part, s->k, r, "M == 0: save_mean %g, save_invstd %.9g", (double)o->sm[c], (double)o->si[c]);
        bad++;
        break;
      }
  }
  if (s->running) {
    for (int64_t c = 0; c < s->c; c++) ref->rm[c] = s->rm0[c], ref->rv[c] = s->rv0[c];
    sbn_ref_running(s->c, ref->m, ref->mean, ref->varu, (double)s->p.momentum, s->nbt0, ref->rm, ref->rv);
    for (int64_t c = 0; c < s->c; c++) {
      if (!close1(o->rm[c], ref->rm[c], STAT_TOL * (1.0 + sqrt(fabs(ref->rv[c]))), STAT_TOL) ||
          !close1(o->rv[c], ref->rv[c], STAT_TOL, STAT_TOL)) {
        failf(part, s->k, r, "channel %lld: running mean %.9g (ref %.9g) var %.9g (ref %.9g)",
              (long long)c, (double)o->rm[c], ref->rm[c], (double)o->rv[c], ref->rv[c]);
        bad++;
        break;
      }
    }
    if (s->m == 0 && (memcmp(o->rm, s->rm0, (size_t)s->c * 4) || memcmp(o->rv, s->rv0, (size_t)s->c * 4))) {
      failf(part, s->k, r, "M == 0 changed the running stats");
      bad++;
    }
  }
  if (!s->nbt_null && o->nbt != s->nbt0 + 1) {
    failf(part, s->k, r, "num_batches_tracked %lld, expected %lld", (long long)o->nbt, (long long)s->nbt0 + 1);
    bad++;
  }
  double tol = out_tol(s->dt);
  int64_t ne = sbn_ref_numel(&o->d);
  for (int64_t i = 0; i < ne; i++) {
    double got = sbn_ref_load(o->y, s->dt, i);
    if (!close1(got, ref->y[i], tol, tol)) {
      failf(part, s->k, r, "y[%lld] = %.9g, ref %.9g (dtype %d layout %d c %lld spatial %lld n %lld)",
            (long long)i, got, ref->y[i], (int)s->dt, (int)s->lay, (long long)s->c,
            (long long)s->spatial, (long long)o->d.n);
      bad++;
      break;
    }
  }
  return bad;
}

/* Checks rank r's backward outputs with the library's own saved statistics. */
static int check_backward(const char* part, const spec_t* s, int r, const team_data_t* td,
                          const rank_op_t* o, ref_t* ref) {
  sbnTensorDesc_t descs[W];
  const void *xs[W], *dys[W];
  double* dxs[W] = {0};
  double *dwl[W], *dbl[W];
  double mean[MAXC], invstd[MAXC];
  for (int q = 0; q < W; q++) {
    descs[q] = rank_desc(s, q);
    xs[q] = td->x[q];
    dys[q] = td->dy[q];
    dwl[q] = ref->dwl[q];
    dbl[q] = ref->dbl[q];
  }
  dxs[r] = ref->dx;
  for (int64_t c = 0; c < s->c; c++) mean[c] = o->sm[c], invstd[c] = o->si[c];
  sbn_ref_backward(W, descs, xs, dys, s->affine ? s->w : NULL, mean, invstd, dxs, dwl, dbl,
                   ref->dwg, ref->dbg);
  int bad = 0;
  const double* wref = s->p.grad_mode == sbnGradGlobal ? ref->dwg : ref->dwl[r];
  const double* bref = s->p.grad_mode == sbnGradGlobal ? ref->dbg : ref->dbl[r];
  for (int64_t c = 0; c < s->c; c++) {
    if ((!o->dw_null && !close1(o->dw[c], wref[c], GRAD_TOL, GRAD_TOL)) ||
        (!o->db_null && !close1(o->db[c], bref[c], GRAD_TOL, GRAD_TOL))) {
      failf(part, s->k, r, "channel %lld (%s): dweight %.9g (ref %.9g) dbias %.9g (ref %.9g)",
            (long long)c, s->p.grad_mode == sbnGradGlobal ? "global" : "local",
            o->dw_null ? 0.0 : (double)o->dw[c], wref[c], o->db_null ? 0.0 : (double)o->db[c], bref[c]);
      bad++;
      break;
    }
    if (s->m == 0 && ((!o->dw_null && o->dw[c] != 0.0f) || (!o->db_null && o->db[c] != 0.0f))) {
      failf(part, s->k, r, "M == 0: dweight/dbias not 0");
      bad++;
      break;
    }
  }
  if (!o->dx_null) {
    double tol = out_tol(s->dt);
    int64_t ne = sbn_ref_numel(&o->d);
    for (int64_t i = 0; i < ne; i++) {
      double got = sbn_ref_load(dx_result(o), s->dt, i);
      if (!close1(got, ref->dx[i], tol, tol)) {
        failf(part, s->k, r, "dx[%lld] = %.9g, ref %.9g", (long long)i, got, ref->dx[i]);
        bad++;
        break;
      }
    }
  }
  return bad;
}

/* M == 1: both ranks' calls are rejected and nothing is written. */
static int check_untouched(const char* part, const spec_t* s, int r, const rank_op_t* now,
                           const rank_op_t* before) {
  if (memcmp(now, before, sizeof *now) == 0) return 0;
  failf(part, s->k, r, "M == 1: the rejected forward wrote to its buffers");
  return 1;
}

/* ---- results kept for the rank-agreement check ------------------------------------------ */
typedef struct {
  float sm[MAXC], si[MAXC], rm[MAXC], rv[MAXC], dw[MAXC], db[MAXC];
  int64_t nbt;
  int done, dw_null, db_null;
} slot_t;
static slot_t* g_slots; /* [op][rank] */

static void keep(long k, int r, const rank_op_t* o) {
  slot_t* sl = &g_slots[k * W + r];
  memcpy(sl->sm, o->sm, sizeof sl->sm);
  memcpy(sl->si, o->si, sizeof sl->si);
  memcpy(sl->rm, o->rm, sizeof sl->rm);
  memcpy(sl->rv, o->rv, sizeof sl->rv);
  memcpy(sl->dw, o->dw, sizeof sl->dw);
  memcpy(sl->db, o->db, sizeof sl->db);
  sl->nbt = o->nbt;
  sl->dw_null = o->dw_null;
  sl->db_null = o->db_null;
  sl->done = 1;
}

/* Every rank of op k holds bitwise the same statistics (and global grads). */
static int check_agreement(const char* part, uint64_t seed, long k) {
  spec_t s;
  make_spec(seed, k, &s);
  const slot_t* s0 = &g_slots[k * W];
  size_t cb = (size_t)s.c * sizeof(float);
  int bad = 0;
  for (int r = 1; r < W; r++) {
    const slot_t* sr = &g_slots[k * W + r];
    if (!s0->done || !sr->done) continue;
    int ok = !memcmp(sr->sm, s0->sm, cb) && !memcmp(sr->si, s0->si, cb);
    if (s.running) ok = ok && !memcmp(sr->rm, s0->rm, cb) && !memcmp(sr->rv, s0->rv, cb);
    if (!s.nbt_null) ok = ok && sr->nbt == s0->nbt;
    if (!ok) { failf(part, k, r, "statistics differ bitwise from rank 0's"); bad++; continue; }
    if (s.p.grad_mode == sbnGradGlobal) {
      /* compare against the first rank that returned each */
      for (int q = 0; q < r; q++) {
        const slot_t* sq = &g_slots[k * W + q];
        if ((!sr->dw_null && !sq->dw_null && memcmp(sr->dw, sq->dw, cb)) ||
            (!sr->db_null && !sq->db_null && memcmp(sr->db, sq->db, cb))) {
          failf(part, k, r, "global dweight/dbias differ bitwise from rank %d's", q);
          bad++;
          break;
        }
      }
    }
  }
  return bad;
}

/* ---- part 1: one thread per rank ----------------------------------------------------------- */
typedef struct {
  sbnComm_t comm;
  int r;
  long ops;
  uint64_t seed;
  long completed;
} worker_t;

static void* worker_main(void* arg) {
  worker_t* wk = (worker_t*)arg;
  const int r = wk->r;
  team_data_t* td = (team_data_t*)malloc(sizeof *td);
  rank_op_t* o = (rank_op_t*)malloc(sizeof *o);
  rank_op_t* before = (rank_op_t*)malloc(sizeof *before);
  ref_t* ref = (ref_t*)malloc(sizeof *ref);
  if (!td || !o || !before || !ref) abort();
  for (long k = 0; k < wk->ops; k++) {
    spec_t s;
    make_spec(wk->seed, k, &s);
    for (int q = 0; q < W; q++) gen_rank_data(wk->seed, &s, q, td->x[q], td->dy[q]);
    prepare_rank(wk->seed, &s, r, td, o, 1);
    memcpy(before, o, sizeof *o);

    sbnResult_t res = call_forward(wk->comm, &s, o);
    sbnResult_t want = s.m == 1 ? sbnInvalidArgument : sbnSuccess;
    if (res != want) {
      failf("threads", k, r, "forward returned %s, expected %s (%s)", sbnGetResultName(res),
            sbnGetResultName(want), sbnGetLastError(wk->comm));
      if (res == sbnTimeout || res == sbnAborted) break; /* the team is gone */
      continue;
    }
    if (s.m == 1) {
      check_untouched("threads", &s, r, o, before);
      wk->completed++;
      continue; /* every rank knows M, so every rank skips the backward */
    }
    after_forward(td, r, o);
    check_forward("threads", &s, r, td, o, ref);

    res = call_backward(wk->comm, &s, o);
    if (res != sbnSuccess) {
      failf("threads", k, r, "backward returned %s (%s)", sbnGetResultName(res),
            sbnGetLastError(wk->comm));
      if (res == sbnTimeout || res == sbnAborted) break;
      continue;
    }
    check_backward("threads", &s, r, td, o, ref);
    keep(k, r, o);
    wk->completed++;
  }
  free(td), free(o), free(before), free(ref);
  return NULL;
}

static long stress_ops(void) {
  const char* e = getenv("SBN_STRESS_OPS");
  if (!e || !*e) return DEFAULT_OPS;
  char* end = NULL;
  long v = strtol(e, &end, 10);
  return (*end == '\0' && v > 0) ? v : DEFAULT_OPS;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static sbnComm_t g_comms[W];
static uint64_t kSeed = 0x5eed5bull; /* SBN_STRESS_SEED overrides (to explore) */

static void test_stress_threads(void) {
  const long ops = stress_ops();
  g_slots = (slot_t*)calloc((size_t)ops * W, sizeof(slot_t));
  ASSERT_TRUE(g_slots != NULL);
  atomic_store(&g_fail, 0);
  worker_t wk[W];
  pthread_t th[W];
  double t0 = now_s();
  for (int r = 0; r < W; r++) {
    worker_t w = {g_comms[r], r, ops, kSeed, 0};
    wk[r] = w;
    ASSERT_TRUE(pthread_create(&th[r], NULL, worker_main, &wk[r]) == 0);
  }
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  double dt = now_s() - t0;
  for (long k = 0; k < ops; k++) check_agreement("threads", kSeed, k);
  fprintf(stderr, "  %ld forward+backward pairs on %d threads in %.2f s (%.0f us per pair)\n",
          ops, W, dt, dt * 1e6 / (double)ops);
  for (int r = 0; r < W; r++)
    if (wk[r].completed != ops) SBN_FAIL_("rank %d completed %ld of %ld ops", r, wk[r].completed, ops);
  free(g_slots);
  g_slots = NULL;
  int f = atomic_load(&g_fail);
  if (f) SBN_FAIL_("%d failed checks (the first ones are printed above)", f);
  sbnResult_t async = sbnSuccess;
  ASSERT_OK(sbnCommGetAsyncError(g_comms[0], &async));
  ASSERT_RES(async, sbnSuccess);
}

/* ---- part 2: groups ------------------------------------------------------------------------ */
static void test_stress_groups(void) {
  const long ops = stress_ops() / 4 + 1;
  const uint64_t seed = kSeed + 1;
  g_slots = (slot_t*)calloc((size_t)ops * W, sizeof(slot_t));
  team_data_t* td = (team_data_t*)malloc(sizeof *td);
  rank_op_t* o = (rank_op_t*)malloc(W * sizeof *o);
  rank_op_t* before = (rank_op_t*)malloc(W * sizeof *before);
  ref_t* ref = (ref_t*)malloc(sizeof *ref);
  ASSERT_TRUE(g_slots && td && o && before && ref);
  atomic_store(&g_fail, 0);
  double t0 = now_s();
  long k;
  for (k = 0; k < ops; k++) {
    spec_t s;
    make_spec(seed, k, &s);
    for (int q = 0; q < W; q++) gen_rank_data(seed, &s, q, td->x[q], td->dy[q]);
    /* forward and backward in one group: the backward reads x after the forward ran, so
       no in-place forward there */
    const int one = s.fwd_bwd_one_group && s.m != 1;
    for (int r = 0; r < W; r++) prepare_rank(seed, &s, r, td, &o[r], !one);
    memcpy(before, o, W * sizeof *o);
    sbnResult_t res = sbnGroupStart();
    for (int r = 0; r < W && res == sbnSuccess; r++) {
      res = call_forward(g_comms[r], &s, &o[r]);
      if (res == sbnSuccess && one) res = call_backward(g_comms[r], &s, &o[r]);
    }
    if (res != sbnSuccess) failf("groups", k, -1, "a call in the group returned %s", sbnGetResultName(res));
    res = sbnGroupEnd();
    sbnResult_t want = s.m == 1 ? sbnInvalidArgument : sbnSuccess;
    if (res != want) {
      failf("groups", k, -1, "sbnGroupEnd returned %s, expected %s (%s)", sbnGetResultName(res),
            sbnGetResultName(want), sbnGetLastError(NULL));
      if (res == sbnTimeout || res == sbnAborted) break;
      continue;
    }
    if (s.m == 1) {
      for (int r = 0; r < W; r++) check_untouched("groups", &s, r, &o[r], &before[r]);
      continue;
    }
    if (!one) {
      for (int r = 0; r < W; r++) after_forward(td, r, &o[r]);
      res = sbnGroupStart();
      for (int r = 0; r < W && res == sbnSuccess; r++) res = call_backward(g_comms[r], &s, &o[r]);
      sbnResult_t e = sbnGroupEnd();
      if (res == sbnSuccess) res = e;
      if (res != sbnSuccess) {
        failf("groups", k, -1, "backward group returned %s", sbnGetResultName(res));
        if (res == sbnTimeout || res == sbnAborted) break;
        continue;
      }
    }
    for (int r = 0; r < W; r++) {
      check_forward("groups", &s, r, td, &o[r], ref);
      check_backward("groups", &s, r, td, &o[r], ref);
      keep(k, r, &o[r]);
    }
  }
  double dt = now_s() - t0;
  for (long q = 0; q < ops; q++) check_agreement("groups", seed, q);
  fprintf(stderr, "  %ld ops in groups in %.2f s\n", ops, dt);
  if (k != ops) SBN_FAIL_("stopped at op %ld of %ld", k, ops);
  free(g_slots), free(td), free(o), free(before), free(ref);
  g_slots = NULL;
  int f = atomic_load(&g_fail);
  if (f) SBN_FAIL_("%d failed checks (the first ones are printed above)", f);
}

int main(void) {
  /* 60 s: far longer than any op needs even under TSan; a protocol bug that loses a
     rank turns into sbnTimeout (then sbnAborted everywhere) instead of a hang */
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  cfg.timeout_ms = 60000;
  cfg.max_channels = MAXC;
  unsetenv("SBN_TIMEOUT_MS");
  const char* seed_env = getenv("SBN_STRESS_SEED");
  if (seed_env && *seed_env) kSeed = strtoull(seed_env, NULL, 0);
  fprintf(stderr, "seed 0x%llx, %ld ops\n", (unsigned long long)kSeed, stress_ops());
  if (sbnCommInitCpu(g_comms, W, &cfg) != sbnSuccess) {
    fprintf(stderr, "sbnCommInitCpu failed: %s\n", sbnGetLastError(NULL));
    return 1;
  }
  SBN_RUN(test_stress_threads);
  SBN_RUN(test_stress_groups);
  for (int r = 0; r < W; r++) sbnCommDestroy(g_comms[r]);
  return sbn_test_exit();
}
