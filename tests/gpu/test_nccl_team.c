/* test_nccl_team.c — NCCL teams (sbnCommInitNccl): one process per rank, one GPU per
 * process, launched by tests/mp_launch.h (rank 0 makes the ncclUniqueIds and pipes them to
 * the others). Each child process (rank r of W):
 *   - cudaSetDevice(r), ncclCommInitRank, sbnCommInitNccl; checks sbnCommRank/Count and the
 *     transport (sbnCommGetTransport), then destroys its own NCCL comm (the library keeps a
 *     duplicate);
 *   - generates EVERY rank's inputs with team_util.h's generators (same seeds in every
 *     process) and runs, in-process, the CPU team of W ranks (sbnCommInitCpu, one group)
 *     as the reference for its own rank, a virtual team of W ranks on its own GPU
 *     (sbnCommInitVirtual) with the same per-rank inputs, and, unless the NCCL comm is
 *     already host-driven, a second NCCL comm made with SBN_NCCL_TRANSPORT=host;
 *   - cases fp32/fp16/bf16 x NCHW/NHWC x shapes (C not a multiple of 32, spatial 1 and > 1,
 *     uneven n per rank, a rank with n = 0, every rank empty, x = 1e4 + N(0,1), fp16 near
 *     its top), affine or not, running stats or not, momentum 0.1 (1 call) or cumulative
 *     (< 0, 3 calls, num_batches_tracked), both grad modes; the op issued directly or as a
 *     group of the one local rank (alternating). Its rank's outputs:
 *       forward (y, save_mean, save_invstd, running stats, num_batches_tracked) and backward
 *       (dx, dweight, dbias) vs the CPU team within test_gpu_team.c's GC_* tolerances;
 *       bitwise equal to the virtual team's rank r and to the host-path comm's;
 *   - rank agreement: every process logs hashes of its save_mean/save_invstd/running
 *     stats/num_batches_tracked (and global dweight/dbias) per call; the parent compares
 *     the logs of all ranks: bitwise equal;
 *   - sbnCommSplit: two colours (W >= 2, inside a group; key = -rank reverses the order) and
 *     a NOCOLOR split (no group; rank 0 out: newcomm NULL); an op on each sub-comm vs a CPU
 *     team of its size; SBN_NCCL_TRANSPORT=bogus at init: sbnInvalidArgument everywhere;
 *   - argument errors: a host pointer as x, dy or save_mean -> sbnInvalidArgument, nothing
 *     written (device and host outputs keep their poison); inside a group the group fails
 *     with sbnInvalidUsage; the comm stays usable (an op afterwards vs the CPU team);
 *   - W >= 2, stuck peer: on a comm with timeout_ms = 2000 only rank 0 calls a forward;
 *     sbnCommGetAsyncError reports sbnTimeout (not before the timeout), the stream
 *     finishes without a CUDA error, nothing is written, later ops return sbnAborted.
 *     No wall-clock upper bounds: a wait the library fails to end is the launcher's
 *     timeout.
 *
 * Team sizes: arguments (test_nccl_team 1 2 4) or SBN_TEST_NCCL_W=1,2,4; default W = 1,
 * then every W in 2..8 up to the device count (mp_probe_devices: asked in a child, the
 * parent never touches CUDA before forking). Prints which W are skipped for lack of GPUs;
 * exits 77 when there is no GPU at all.
 *
 * Transport: SBN_NCCL_TRANSPORT (read by the library at init) is inherited by every rank.
 * =host: the comm must say "nccl-host"; =lsa: "nccl-lsa"; unset/auto: a team of one GPU
 * (W = 1) must say "nccl-lsa" unless SBN_TEST_ALLOW_NCCL_HOST=1; larger teams may say
 * either. SBN_TEST_NCCL_TIMEOUT_S: the per-W limit (default 300 s). SBN_TEST_QUICK=1:
 * fewer cases.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv, mkdtemp, nanosleep, clock_gettime */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mp_cuda.h"
#include "mp_launch.h"
#include "team_util.h"

#define GPU_CMP_WHO "NCCL team" /* in failure messages */
#include "gpu_cmp.h"
#include "gpu_fixture.h" /* CUDA_OK, dteam_t: this rank's device tensors */

/* ---- globals of a child (rank g_rank of g_W) --------------------------------------------- */
static int g_rank, g_W;
static int g_quick;
static int g_fatal;            /* an op on an NCCL comm failed: the ranks' op sequences diverged */
static char g_case[512];       /* the current case, printed when it fails */
static FILE* g_log;            /* rank agreement: "label hash" lines, compared by the parent */
static sbnComm_t g_comm;       /* the NCCL comm under test (transport per the environment) */
static sbnComm_t g_comm_host;  /* a second one with SBN_NCCL_TRANSPORT=host (NULL if g_comm is) */
static sbnComm_t g_stuck;      /* W >= 2: timeout_ms = 2000, for the stuck-peer test */
static sbnComm_t g_virt[MAXW]; /* a virtual team of W ranks on this rank's GPU */

/* Inherited by the children: set by the parent before mp_run. */
typedef struct {
  char dir[256];      /* per-W scratch: agreement logs, the stuck-peer handshake */
  char transport[32]; /* SBN_NCCL_TRANSPORT as set ("" when unset) */
  int allow_host;     /* SBN_TEST_ALLOW_NCCL_HOST=1 */
} run_ctx_t;
static const run_ctx_t* g_ctx;

/* Team timeout for the correctness ops: a protocol bug fails within 60 s, not 300 s. */
#define TEAM_TIMEOUT_MS 60000
#define STUCK_TIMEOUT_MS 2000

/* ---- NCCL checks: a failed call fails the current test (CUDA_OK: gpu_fixture.h) ------- */
static int nccl_ok_(ncclResult_t e, const char* expr, const char* file, int line) {
  if (e == ncclSuccess) return 1;
  fprintf(stderr, "%s:%d: FAILED: %s: %s\n", file, line, expr, ncclGetErrorString(e));
  sbn_test_failures_++;
  sbn_test_cur_failed_++;
  return 0;
}
#define NCCL_OK(call) nccl_ok_((call), #call, __FILE__, __LINE__)

/* An op on an NCCL comm that was refused or failed: the other ranks have made (or will
   make) theirs, so this rank's sequence of collectives no longer matches theirs. Stop
   this process (its peers then fail at their team timeout; mp_run's fail-fast ends them). */
#define OP_OK(expr, comm)                                                             \
  do {                                                                                \
    sbnResult_t e_ = (expr);                                                          \
    if (e_ != sbnSuccess) {                                                           \
      SBN_FAIL_("%s returned %s (%s; group/global: %s)", #expr, sbnGetResultName(e_), \
                sbnGetLastError(comm), sbnGetLastError(NULL));                        \
      g_fatal = 1;                                                                    \
      return;                                                                         \
    }                                                                                 \
  } while (0)

/* ---- rank agreement log ------------------------------------------------------------------ */
static uint64_t fnv1a(uint64_t h, const void* p, size_t n) {
  const unsigned char* c = (const unsigned char*)p;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
  return h;
}
static void log_hash(const char* label, const void* a, size_t na, const void* b, size_t nb) {
  if (!g_log) return;
  uint64_t h = fnv1a(0xcbf29ce484222325ull, a, na);
  if (b) h = fnv1a(h, b, nb);
  fprintf(g_log, "%s %016llx\n", label, (unsigned long long)h);
}

/* ---- this rank's device tensors (dteam_t: gpu_fixture.h) -------------------------------- */
/* A case's slots are on this rank's GPU, each on a stream of its own (dteam_make_own with
   device g_rank); these add what an NCCL rank does differently from test_gpu_team.c. */

/* Every slot's op inside one group (group = 1), or slot 0's op directly (one slot). */
static sbnResult_t dset_run(dteam_t* d, const team_t* h, int bwd, int group, const sbnParams_t* p) {
  return group ? gpu_group(d, h, bwd, 0, p) : gpu_call(d, h, 0, bwd, 0, p);
}

/* Fresh inputs (new_inputs) and poisoned outputs of `what` uploaded, waited for. */
static void dset_refresh(dteam_t* d, const team_t* h, int new_inputs, int what) {
  if (new_inputs) dteam_upload_inputs(d, h);
  dteam_poison(d, h, what);
  dteam_sync(d);
}

/* After ops of `what`: waits for every slot's stream (the team's timeout bounds the work),
   downloads the outputs into h's rank rk[s], requires async error sbnSuccess. A stream
   that finishes with a CUDA error, or an async error, is fatal (the team is gone). */
static void dset_finish(dteam_t* d, team_t* h, int what) {
  for (int s = d->ns - 1; s >= 0; s--) {
    cudaError_t err = cudaSuccess;
    (void)wait_stream_done(d->st[s], d->comm[s], now_ms(), &err);
    if (!CUDA_OK(err)) {
      g_fatal = 1;
      return;
    }
    dteam_download(d, h, s, what, 0);
  }
  for (int s = 0; s < d->ns; s++) {
    sbnResult_t e = sbnSuccess;
    sbnResult_t q = sbnCommGetAsyncError(d->comm[s], &e);
    if (q != sbnSuccess || e != sbnSuccess) {
      SBN_FAIL_("slot %d (rank %d): asynchronous error %s after a valid op (%s)", s, d->rk[s],
                sbnGetResultName(q != sbnSuccess ? q : e), sbnGetLastError(d->comm[s]));
      g_fatal = 1;
      return;
    }
  }
}

/* ---- comparisons: gpu_cmp.h (test_gpu_team.c's tolerances and comparisons) ------------ */
/* Rank r's backward outputs are compared with cmp_backward(g, c, p, 0, r): the CPU team
   ran with rank r's GPU saved statistics on every rank (they are the same bits on every
   rank, checked by the logs), and the sums of |terms| use those statistics too. */

/* ---- cases ---------------------------------------------------------------------------- */
typedef struct {
  int64_t c, sp;
  int64_t n[MAXW];
  gen_t gen;
  int only_dt; /* -1, or the one dtype this shape runs in */
} shape_t;

/* C not a multiple of 32 (1, 3, 37, 300) and 64; spatial 1 (BatchNorm1d), 7, 64, 1000;
   uneven n with empty ranks (rank 1 empty at W = 2); every rank empty (M == 0); x = 1e4 +
   N(0,1) (fp32); fp16 x = 6e4 +- 4000. A team of W uses n[0..W-1] (M != 1 for every W). */
static const shape_t kShapes[] = {
    {1, 1000, {2, 1, 0, 3, 1, 0, 2, 1}, GEN_NORMAL, -1},
    {3, 7, {3, 0, 1, 5, 2, 2, 0, 1}, GEN_NORMAL, -1},
    {37, 64, {1, 2, 0, 1, 2, 1, 0, 3}, GEN_NORMAL, -1},
    {64, 1, {5, 3, 0, 7, 2, 4, 1, 0}, GEN_NORMAL, -1},
    {300, 7, {2, 0, 3, 1, 0, 2, 1, 1}, GEN_NORMAL, -1},
    {37, 7, {0, 0, 0, 0, 0, 0, 0, 0}, GEN_NORMAL, -1},
    {3, 64, {4, 2, 0, 3, 1, 5, 0, 2}, GEN_OFFSET, sbnFloat32},
    {5, 33, {4, 2, 5, 0, 1, 3, 2, 2}, GEN_F16HIGH, sbnFloat16},
};
#define NSHAPES ((int)(sizeof kShapes / sizeof kShapes[0]))

typedef struct {
  int idx;
  shape_t s;
  sbnDataType_t dt;
  sbnLayout_t lay;
  int affine, running, nbt_null, nfwd, group;
  float eps, momentum;
  uint64_t seed;
} case_t;

/* The knobs cycle with the case counter i (as in test_gpu_team.c): affine 2/3, running
   stats 3/4 (nbt NULL in some of the others), momentum 0.1 (1 call) or cumulative < 0
   (3 calls), eps 1e-5 or 1e-3, the op issued directly or as a group of one (i % 2). */
static case_t make_case(int s, sbnDataType_t dt, sbnLayout_t lay, int i) {
  case_t k;
  memset(&k, 0, sizeof k);
  k.idx = i;
  k.s = kShapes[s];
  k.dt = dt;
  k.lay = lay;
  k.affine = i % 3 != 1;
  k.running = i % 4 != 3;
  k.nbt_null = !k.running && i % 8 == 7;
  k.momentum = ((i / 2) % 2 && !k.nbt_null) ? -1.0f : 0.1f;
  k.nfwd = k.momentum < 0.0f ? 3 : 1;
  k.eps = i % 5 == 4 ? 1e-3f : 1e-5f;
  k.group = i % 2;
  k.seed = 20000u + (uint64_t)i * 7919u + (uint64_t)s;
  return k;
}

static void describe_case(const case_t* k) {
  char ns[64];
  int off = 0;
  for (int r = 0; r < g_W && off < (int)sizeof ns - 8; r++)
    off += snprintf(ns + off, sizeof ns - (size_t)off, r ? ",%lld" : "%lld", (long long)k->s.n[r]);
  snprintf(g_case, sizeof g_case,
           "case %d: NCCL W=%d rank %d %s %s c=%lld spatial=%lld n={%s} gen=%d affine=%d "
           "running=%d nbt_null=%d momentum=%g x%d eps=%g %s seed=%llu",
           k->idx, g_W, g_rank, dt_name(k->dt), k->lay == sbnLayoutNCHW ? "NCHW" : "NHWC",
           (long long)k->s.c, (long long)k->s.sp, ns, (int)k->s.gen, k->affine, k->running,
           k->nbt_null, (double)k->momentum, k->nfwd, (double)k->eps, k->group ? "group" : "direct",
           (unsigned long long)k->seed);
}

/* One forward (bwd = 0) or backward on every team of the case: the CPU team (reference,
   all W ranks, one group), this rank's NCCL op(s), the virtual team of W (one group).
   Ops are issued even after a comparison failed: the ranks' collectives stay in step. */
typedef struct {
  team_t c, g, gh, v; /* CPU team; mirrors of the NCCL comm, the host-path comm, virtual */
  dteam_t dg, dh, dv;
  int have_host;
} case_teams_t;

#define CASE_LABEL_LEN 96 /* a case step's label, with its terminating NUL */

static void case_step(case_teams_t* T, const case_t* k, int bwd, const sbnParams_t* p,
                      const char* label) {
  int r = g_rank, what = bwd ? OUT_BWD : OUT_FWD;
  sbnResult_t rc = team_run(&T->c, bwd, MODE_GROUP, 0, p);
  if (rc != sbnSuccess)
    SBN_FAIL_("CPU team %s: %s (%s)", bwd ? "backward" : "forward", sbnGetResultName(rc),
              sbnGetLastError(NULL));
  /* One team at a time, each waited for before the next is issued: kernels of two
     collectives in flight on different streams could each hold SMs another GPU's
     counterpart needs (a cross-GPU deadlock NCCL warns about for concurrent comms). */
  OP_OK(dset_run(&T->dg, &T->g, bwd, k->group, p), g_comm);
  dset_finish(&T->dg, &T->g, what);
  if (g_fatal) return;
  if (T->have_host) {
    OP_OK(dset_run(&T->dh, &T->gh, bwd, !k->group, p), g_comm_host);
    dset_finish(&T->dh, &T->gh, what);
    if (g_fatal) return;
  }
  /* the virtual team is this process's own: its failure fails the case, not the run */
  sbnResult_t rv = dset_run(&T->dv, &T->v, bwd, 1, p);
  if (rv == sbnSuccess) {
    dset_finish(&T->dv, &T->v, what);
    g_fatal = 0;
  } else {
    SBN_FAIL_("virtual team of %d: %s (%s)", g_W, sbnGetResultName(rv), sbnGetLastError(NULL));
  }
  CHECK_();
  if (!bwd) {
    cmp_forward_rank(&T->g, &T->c, r);
    log_hash(label, T->g.smean[r], chan_bytes(&T->g), T->g.sinv[r], chan_bytes(&T->g));
    if (T->g.running) {
      char l2[CASE_LABEL_LEN + sizeof ".running"]; /* no truncation (-Wformat-truncation) */
      snprintf(l2, sizeof l2, "%s.running", label);
      log_hash(l2, T->g.rm[r], chan_bytes(&T->g), T->g.rv[r], chan_bytes(&T->g));
    }
    if (!T->g.nbt_null) {
      char l3[CASE_LABEL_LEN + sizeof ".nbt"];
      snprintf(l3, sizeof l3, "%s.nbt", label);
      log_hash(l3, &T->g.nbt[r], sizeof(int64_t), NULL, 0);
    }
  } else {
    cmp_backward(&T->g, &T->c, p, 0, r);
    if (p->grad_mode == sbnGradGlobal)
      log_hash(label, T->g.dw[r], chan_bytes(&T->g), T->g.db[r], chan_bytes(&T->g));
  }
  same_rank(&T->g, &T->v, r, what, 0, "NCCL comm vs virtual team");
  if (T->have_host) same_rank(&T->g, &T->gh, r, what, 0, "NCCL comm vs host-path NCCL comm");
}

static void case_body(case_teams_t* T, const case_t* k) {
  sbnParams_t p = SBN_PARAMS_DEFAULT;
  p.eps = k->eps;
  p.momentum = k->momentum;
  sbn_rng_t rc = {k->seed * 31u + 7u}, rg = rc, rh = rc, rv = rc;
  char label[CASE_LABEL_LEN];
  for (int call = 0; call < k->nfwd && !g_fatal; call++) {
    if (call) { /* fresh inputs, the same on every team; running state carries on */
      team_new_inputs(&T->c, &rc, k->s.gen);
      team_new_inputs(&T->g, &rg, k->s.gen);
      team_new_inputs(&T->gh, &rh, k->s.gen);
      team_new_inputs(&T->v, &rv, k->s.gen);
      dset_refresh(&T->dg, &T->g, 1, OUT_FWD | OUT_BWD);
      if (T->have_host) dset_refresh(&T->dh, &T->gh, 1, OUT_FWD | OUT_BWD);
      dset_refresh(&T->dv, &T->v, 1, OUT_FWD | OUT_BWD);
    }
    snprintf(label, sizeof label, "case%d.call%d.fwd", k->idx, call);
    case_step(T, k, 0, &p, label);
  }
  for (int gm = 0; gm < 2 && !g_fatal; gm++) {
    sbnParams_t pb = p;
    pb.grad_mode = (sbnGradMode_t)gm;
    /* The CPU backward gets this rank's GPU save_mean/save_invstd on every rank (the
       ranks' saved statistics are the same bits), so both backward ops see identical
       inputs (test_gpu_team.c: at x ~ 1e4 the teams' means may differ by an fp32 ulp). */
    for (int q = 0; q < T->c.W; q++) {
      memcpy(T->c.smean[q], T->g.smean[g_rank], chan_bytes(&T->c));
      memcpy(T->c.sinv[q], T->g.sinv[g_rank], chan_bytes(&T->c));
    }
    team_poison_bwd(&T->c);
    team_poison_bwd(&T->g);
    team_poison_bwd(&T->gh);
    team_poison_bwd(&T->v);
    dset_refresh(&T->dg, &T->g, 0, OUT_BWD);
    if (T->have_host) dset_refresh(&T->dh, &T->gh, 0, OUT_BWD);
    dset_refresh(&T->dv, &T->v, 0, OUT_BWD);
    snprintf(label, sizeof label, "case%d.bwd%s", k->idx, gm ? "global" : "local");
    case_step(T, k, 1, &pb, label);
  }
}

/* Runs case k isolated (test_gpu_team.c's case_begin/case_end): CHECK_() inside sees only
   this case's failures, and a failing case prints its description. */
static void run_case(const case_t* k) {
  const int saved_failed = sbn_test_cur_failed_;
  sbn_test_cur_failed_ = 0;
  case_teams_t T;
  memset(&T, 0, sizeof T);
  int W = g_W, r = g_rank;
  describe_case(k);
  team_t* mirrors[] = {&T.c, &T.g, &T.gh, &T.v};
  for (int i = 0; i < 4; i++) {
    team_make(mirrors[i], W, k->dt, k->lay, k->s.c, k->s.sp, k->s.n, k->affine, k->running,
              k->s.gen, k->seed);
    mirrors[i]->nbt_null = k->nbt_null;
  }
  T.have_host = g_comm_host != NULL;
  int all[MAXW];
  for (int q = 0; q < W; q++) all[q] = q;
  dteam_make_own(&T.dg, &T.g, 1, &r, &g_comm, g_rank);
  if (T.have_host) dteam_make_own(&T.dh, &T.gh, 1, &r, &g_comm_host, g_rank);
  dteam_make_own(&T.dv, &T.v, W, all, g_virt, g_rank);
  if (sbn_test_cur_failed_) g_fatal = 1; /* could not set up: the op sequence breaks */
  if (!g_fatal) case_body(&T, k);
  dteam_free(&T.dg);
  dteam_free(&T.dh);
  dteam_free(&T.dv);
  for (int i = 0; i < 4; i++) team_free(mirrors[i]);
  if (sbn_test_cur_failed_) fprintf(stderr, "  ^ in %s\n", g_case);
  sbn_test_cur_failed_ += saved_failed;
}

/* ---- tests ------------------------------------------------------------------------------- */
static const char* transport_of(sbnComm_t comm) {
  const char* name = NULL;
  sbnResult_t e = sbnCommGetTransport(comm, &name);
  if (e != sbnSuccess) {
    SBN_FAIL_("sbnCommGetTransport: %s (%s)", sbnGetResultName(e), sbnGetLastError(comm));
    return NULL;
  }
  if (name == NULL) SBN_FAIL_("sbnCommGetTransport gave a NULL name");
  return name;
}

/* sbnCommInitNccl on `nc` with SBN_NCCL_TRANSPORT temporarily set to `transport` (NULL:
   as inherited). */
static sbnResult_t init_nccl(sbnComm_t* comm, ncclComm_t nc, int64_t timeout_ms,
                             const char* transport) {
  sbnConfig_t cfg = config_ms(timeout_ms);
  const char* old = getenv("SBN_NCCL_TRANSPORT");
  char saved[64];
  int had = old != NULL;
  if (had) snprintf(saved, sizeof saved, "%s", old);
  if (transport) setenv("SBN_NCCL_TRANSPORT", transport, 1);
  sbnResult_t e = sbnCommInitNccl(comm, nc, &cfg);
  if (transport) {
    if (had)
      setenv("SBN_NCCL_TRANSPORT", saved, 1);
    else
      unsetenv("SBN_NCCL_TRANSPORT");
  }
  return e;
}

/* Every rank: the NCCL comms (collective, in the same order on every rank) and the
   virtual team; checks rank, count, device and transport. */
static ncclComm_t g_nc, g_nc_stuck;
static void test_init(void) {
  int r = g_rank, W = g_W;
  g_fatal = 1; /* until every collective init is done */
  OP_OK(init_nccl(&g_comm, g_nc, TEAM_TIMEOUT_MS, NULL), NULL);
  int rank = -1, count = -1;
  ASSERT_OK(sbnCommRank(g_comm, &rank));
  ASSERT_OK(sbnCommCount(g_comm, &count));
  ASSERT_EQ_INT(rank, r);
  ASSERT_EQ_INT(count, W);
  const char* want = NULL;
  const char* env = g_ctx->transport;
  const char* name = transport_of(g_comm);
  if (strcmp(env, "host") == 0)
    want = "nccl-host";
  else if (strcmp(env, "lsa") == 0)
    want = "nccl-lsa";
  else if (W == 1 && !g_ctx->allow_host)
    want = "nccl-lsa"; /* one GPU is one NVLink/LSA domain */
  printf("rank %d of %d: device %d, transport %s (SBN_NCCL_TRANSPORT=%s)\n", r, W, r,
         name ? name : "?", env[0] ? env : "(unset)");
  if (name && want && strcmp(name, want) != 0)
    SBN_FAIL_("transport %s, expected %s (SBN_NCCL_TRANSPORT=%s%s)", name, want,
              env[0] ? env : "(unset)",
              !env[0] ? "; SBN_TEST_ALLOW_NCCL_HOST=1 accepts nccl-host" : "");
  if (name && !want && strcmp(name, "nccl-lsa") != 0 && strcmp(name, "nccl-host") != 0)
    SBN_FAIL_("transport %s, expected nccl-lsa or nccl-host", name);
  /* the host-driven path beside it, from the same NCCL comm (the library duplicates it) */
  if (!name || strcmp(name, "nccl-host") != 0) {
    OP_OK(init_nccl(&g_comm_host, g_nc, TEAM_TIMEOUT_MS, "host"), NULL);
    const char* hn = transport_of(g_comm_host);
    if (hn && strcmp(hn, "nccl-host") != 0)
      SBN_FAIL_("a comm made with SBN_NCCL_TRANSPORT=host says %s", hn);
  }
  if (W >= 2) OP_OK(init_nccl(&g_stuck, g_nc_stuck, STUCK_TIMEOUT_MS, NULL), NULL);
  /* an unknown SBN_NCCL_TRANSPORT: refused on every rank alike, nothing created */
  sbnComm_t bad = (sbnComm_t)&g_rank;
  sbnResult_t be = init_nccl(&bad, g_nc, TEAM_TIMEOUT_MS, "bogus");
  if (be != sbnInvalidArgument || bad != (sbnComm_t)&g_rank) {
    SBN_FAIL_("SBN_NCCL_TRANSPORT=bogus: %s, comm %s; expected sbnInvalidArgument, untouched",
              sbnGetResultName(be), bad == (sbnComm_t)&g_rank ? "untouched" : "written");
    if (be == sbnSuccess && bad != (sbnComm_t)&g_rank) sbnCommDestroy(bad);
  }
  /* the caller's NCCL comms are no longer needed: the library keeps its own duplicates */
  NCCL_OK(ncclCommDestroy(g_nc));
  g_nc = NULL;
  if (g_nc_stuck) NCCL_OK(ncclCommDestroy(g_nc_stuck));
  g_nc_stuck = NULL;
  g_fatal = 0;
  if (!init_virtual(g_virt, W, r, TEAM_TIMEOUT_MS))
    g_fatal = 1; /* the cases need it; the other ranks stop at their team timeout */
}

static void test_cases_vs_cpu(void) {
  if (g_fatal) return;
  int i = 0, ncases = 0;
  for (int dt = 0; dt < 3; dt++)
    for (int lay = 0; lay < 2; lay++)
      for (int s = 0; s < NSHAPES; s++) {
        const shape_t* sh = &kShapes[s];
        if (sh->only_dt >= 0 && dt != sh->only_dt) continue;
        if (g_quick && (dt == sbnFloat16 || (s != 1 && s != 2 && s != 5))) continue;
        case_t k = make_case(s, (sbnDataType_t)dt, (sbnLayout_t)lay, i++);
        run_case(&k);
        ncases++;
        if (g_fatal) {
          fprintf(stderr, "  stopped (an NCCL op failed) in %s\n", g_case);
          return;
        }
      }
  fprintf(stderr, "  %d cases\n", ncases);
}

/* An op (forward, then backward with global grads) on `sub` as rank `nr` of m, vs a CPU
   team of m ranks: fp32 NCHW, c = 13, spatial 5, n = (i + 1) % 3 (an empty rank at m >= 3). */
static void split_op_vs_cpu(sbnComm_t sub, int m, int nr, uint64_t seed, int group,
                            const char* label) {
  int64_t n[MAXW];
  for (int i = 0; i < MAXW; i++) n[i] = (i + 1) % 3;
  team_t c, g;
  dteam_t d;
  team_make(&c, m, sbnFloat32, sbnLayoutNCHW, 13, 5, n, 1, 1, GEN_NORMAL, seed);
  team_make(&g, m, sbnFloat32, sbnLayoutNCHW, 13, 5, n, 1, 1, GEN_NORMAL, seed);
  dteam_make_own(&d, &g, 1, &nr, &sub, g_rank);
  if (sbn_test_cur_failed_) g_fatal = 1;
  sbnParams_t p = SBN_PARAMS_DEFAULT, pb = p;
  pb.grad_mode = sbnGradGlobal;
  char l[96];
  snprintf(g_case, sizeof g_case, "%s: rank %d of %d (parent rank %d of %d)", label, nr, m, g_rank,
           g_W);
  if (!g_fatal) {
    sbnResult_t rc = team_run(&c, 0, MODE_GROUP, 0, &p);
    if (rc != sbnSuccess) SBN_FAIL_("CPU team of %d: forward %s", m, sbnGetResultName(rc));
    sbnResult_t e = dset_run(&d, &g, 0, group, &p);
    if (e != sbnSuccess) {
      SBN_FAIL_("%s: forward: %s (%s)", g_case, sbnGetResultName(e), sbnGetLastError(sub));
      g_fatal = 1;
    }
  }
  if (!g_fatal) dset_finish(&d, &g, OUT_FWD);
  if (!g_fatal) {
    cmp_forward_rank(&g, &c, nr);
    snprintf(l, sizeof l, "%s.fwd", label);
    log_hash(l, g.smean[nr], chan_bytes(&g), g.sinv[nr], chan_bytes(&g));
    for (int q = 0; q < m; q++) {
      memcpy(c.smean[q], g.smean[nr], chan_bytes(&c));
      memcpy(c.sinv[q], g.sinv[nr], chan_bytes(&c));
    }
    sbnResult_t rc = team_run(&c, 1, MODE_GROUP, 0, &pb);
    if (rc != sbnSuccess) SBN_FAIL_("CPU team of %d: backward %s", m, sbnGetResultName(rc));
    sbnResult_t e = dset_run(&d, &g, 1, !group, &pb);
    if (e != sbnSuccess) {
      SBN_FAIL_("%s: backward: %s (%s)", g_case, sbnGetResultName(e), sbnGetLastError(sub));
      g_fatal = 1;
    }
  }
  if (!g_fatal) dset_finish(&d, &g, OUT_BWD);
  if (!g_fatal) {
    cmp_backward(&g, &c, &pb, 0, nr);
    snprintf(l, sizeof l, "%s.bwdglobal", label);
    log_hash(l, g.dw[nr], chan_bytes(&g), g.db[nr], chan_bytes(&g));
  }
  dteam_free(&d);
  team_free(&c);
  team_free(&g);
}

static void test_split(void) {
  if (g_fatal) return;
  int r = g_rank, W = g_W;
  /* two colours (rank % 2), key = -rank: a sub-team is ordered by descending parent rank */
  if (W >= 2) {
    int color = r % 2, m = 0, nr = 0;
    for (int q = color; q < W; q += 2) {
      m++;
      if (q > r) nr++;
    }
    /* inside a group (the one local rank): newcomm is written by sbnGroupEnd */
    sbnComm_t sub = NULL;
    OP_OK(sbnGroupStart(), NULL);
    sbnResult_t se = sbnCommSplit(g_comm, color, -r, &sub);
    sbnResult_t ge = sbnGroupEnd();
    OP_OK(se, g_comm);
    OP_OK(ge, g_comm);
    if (sub == NULL) {
      SBN_FAIL_("sbnCommSplit(colour %d) gave newcomm NULL", color);
      g_fatal = 1; /* the sub-team's other ranks will wait for this one */
      return;
    }
    int rank = -1, count = -1;
    EXPECT_TRUE(sbnCommRank(sub, &rank) == sbnSuccess && rank == nr);
    EXPECT_TRUE(sbnCommCount(sub, &count) == sbnSuccess && count == m);
    const char* tn = transport_of(sub);
    printf("rank %d: colour %d -> rank %d of %d (expected %d of %d), transport %s\n", r, color,
           rank, count, nr, m, tn ? tn : "?");
    char label[32];
    snprintf(label, sizeof label, "split.c%d", color);
    split_op_vs_cpu(sub, m, nr, 500u + (uint64_t)color, color == 0, label);
    sbnCommDestroy(sub);
    if (g_fatal) return;
  }
  /* NOCOLOR: rank 0 joins nothing (newcomm NULL); the others form a team of W - 1 */
  sbnComm_t sub = (sbnComm_t)&g_rank; /* not NULL: the call must write NULL */
  OP_OK(sbnCommSplit(g_comm, r == 0 ? SBN_SPLIT_NOCOLOR : 3, r, &sub), g_comm);
  if (r == 0) {
    if (sub != NULL) SBN_FAIL_("SBN_SPLIT_NOCOLOR: newcomm %p, expected NULL", (void*)sub);
    return;
  }
  if (sub == NULL || sub == (sbnComm_t)&g_rank) {
    SBN_FAIL_("sbnCommSplit(colour 3) gave newcomm %p", (void*)sub);
    g_fatal = 1;
    return;
  }
  int rank = -1, count = -1;
  EXPECT_TRUE(sbnCommRank(sub, &rank) == sbnSuccess && rank == r - 1);
  EXPECT_TRUE(sbnCommCount(sub, &count) == sbnSuccess && count == W - 1);
  split_op_vs_cpu(sub, W - 1, r - 1, 600u, 0, "split.nocolor");
  sbnCommDestroy(sub);
}

/* Host pointers where device memory is needed: refused at once (the op validates before
   anything is launched), nothing written; inside a group the group runs nothing. Then one
   valid op on every rank: the comm is still usable. */
static void test_argument_errors(void) {
  if (g_fatal) return;
  int r = g_rank, W = g_W;
  int64_t n[MAXW] = {2, 2, 2, 2, 2, 2, 2, 2};
  team_t c, g;
  dteam_t d;
  team_make(&c, W, sbnFloat32, sbnLayoutNCHW, 8, 16, n, 1, 1, GEN_NORMAL, 7000);
  team_make(&g, W, sbnFloat32, sbnLayoutNCHW, 8, 16, n, 1, 1, GEN_NORMAL, 7000);
  dteam_make_own(&d, &g, 1, &r, &g_comm, g_rank);
  if (sbn_test_cur_failed_) {
    g_fatal = 1;
    goto out;
  }
  {
    sbnParams_t p = SBN_PARAMS_DEFAULT;
    const sbnTensorDesc_t* desc = &g.d[r];
    size_t tb = team_bytes(&g, r), cb = chan_bytes(&g);
    void* hx = dup_mem(g.x0[r], tb);
    float* hsm = (float*)malloc(cb);
    memset(hsm, 0xff, cb);
    sbnResult_t e;
    e = sbnForwardTrain(g_comm, desc, hx, d.y[0], d.w[0], d.b[0], d.rm[0], d.rv[0], d.nbt[0],
                        d.sm[0], d.si[0], &p, d.st[0]);
    if (e != sbnInvalidArgument)
      SBN_FAIL_("forward with a host x: %s, expected sbnInvalidArgument", sbnGetResultName(e));
    else if (sbnGetLastError(g_comm)[0] == '\0')
      SBN_FAIL_("forward with a host x: sbnGetLastError(comm) is empty");
    e = sbnForwardTrain(g_comm, desc, d.x[0], d.y[0], d.w[0], d.b[0], d.rm[0], d.rv[0], d.nbt[0],
                        hsm, d.si[0], &p, d.st[0]);
    if (e != sbnInvalidArgument)
      SBN_FAIL_("forward with a host save_mean: %s, expected sbnInvalidArgument",
                sbnGetResultName(e));
    e = sbnBackward(g_comm, desc, d.x[0], g.dy0[r], d.dx[0], d.w[0], d.sm[0], d.si[0], d.dw[0],
                    d.db[0], &p, d.st[0]);
    if (e != sbnInvalidArgument)
      SBN_FAIL_("backward with a host dy: %s, expected sbnInvalidArgument", sbnGetResultName(e));
    /* in a group: the call fails at once, sbnGroupEnd runs nothing */
    ASSERT_OK(sbnGroupStart());
    e = sbnForwardTrain(g_comm, desc, hx, d.y[0], d.w[0], d.b[0], d.rm[0], d.rv[0], d.nbt[0],
                        d.sm[0], d.si[0], &p, d.st[0]);
    sbnResult_t ge = sbnGroupEnd();
    if (e != sbnInvalidArgument || ge != sbnInvalidUsage)
      SBN_FAIL_(
          "group with a host x: call %s, sbnGroupEnd %s (expected sbnInvalidArgument, "
          "sbnInvalidUsage)",
          sbnGetResultName(e), sbnGetResultName(ge));
    CUDA_OK(cudaDeviceSynchronize());
    dteam_check_untouched(&d, &g, 0, "a refused op");
    if (!all_ff(hsm, cb)) SBN_FAIL_("the host save_mean of a refused op was written");
    free(hx);
    free(hsm);
    sbnResult_t a = sbnSuccess;
    if (sbnCommGetAsyncError(g_comm, &a) != sbnSuccess || a != sbnSuccess)
      SBN_FAIL_("async error %s after refused ops (argument errors must not abort the team)",
                sbnGetResultName(a));
    /* still usable: one valid forward on every rank, vs the CPU team */
    sbnResult_t rc = team_run(&c, 0, MODE_GROUP, 0, &p);
    if (rc != sbnSuccess) SBN_FAIL_("CPU team forward: %s", sbnGetResultName(rc));
    snprintf(g_case, sizeof g_case, "the op after the refused ones (rank %d of %d)", r, W);
    OP_OK(dset_run(&d, &g, 0, 0, &p), g_comm);
    dset_finish(&d, &g, OUT_FWD);
    if (!g_fatal) {
      cmp_forward_rank(&g, &c, r);
      log_hash("after_errors.fwd", g.smean[r], cb, g.sinv[r], cb);
    }
  }
out:
  dteam_free(&d);
  team_free(&c);
  team_free(&g);
}

/* Collective destroy of the comms of the cases (before the stuck-peer test, which may
   leave its comm broken). */
static void test_destroy(void) {
  if (g_comm_host) EXPECT_TRUE(sbnCommDestroy(g_comm_host) == sbnSuccess);
  if (g_comm) EXPECT_TRUE(sbnCommDestroy(g_comm) == sbnSuccess);
  g_comm_host = g_comm = NULL;
  for (int q = 0; q < g_W; q++)
    if (g_virt[q]) sbnCommDestroy(g_virt[q]), g_virt[q] = NULL;
}

static void stuck_path(char* path, size_t n) {
  snprintf(path, n, "%s/stuck.done", g_ctx->dir);
}

/* W >= 2: rank 0 alone calls a forward on g_stuck (timeout 2000 ms); the others stay
   alive, holding their comm, until rank 0 is done (a file in the run's directory). */
static void test_stuck_peer(void) {
  if (g_W < 2 || g_stuck == NULL) return;
  char path[320];
  stuck_path(path, sizeof path);
  int64_t n[MAXW] = {2, 2, 2, 2, 2, 2, 2, 2};
  if (g_rank != 0) {
    /* wait for rank 0 (its test ends at its op's timeout; a rank 0 that never finishes
       is the launcher's timeout) */
    struct stat sb;
    while (stat(path, &sb) != 0) sleep_ms(10);
    sbnResult_t a = sbnSuccess;
    sbnCommGetAsyncError(g_stuck, &a);
    printf("rank %d: the peer that never called: async error %s\n", g_rank, sbnGetResultName(a));
    sbnCommAbort(g_stuck);
    sbnCommDestroy(g_stuck);
    g_stuck = NULL;
    return;
  }
  team_t h;
  dteam_t d;
  int r0 = 0;
  team_make(&h, g_W, sbnFloat32, sbnLayoutNCHW, 8, 16, n, 1, 1, GEN_NORMAL, 6000);
  for (int q = 0; q < g_W; q++) h.nbt[q] = 3;
  dteam_make_own(&d, &h, 1, &r0, &g_stuck, g_rank);
  if (!sbn_test_cur_failed_) {
    sbnParams_t p = SBN_PARAMS_DEFAULT;
    double t0 = now_ms();
    sbnResult_t e = gpu_call(&d, &h, 0, 0, 0, &p);
    /* enqueued (success), or refused at once by a host path that blocks: then sbnTimeout */
    if (e != sbnSuccess && e != sbnTimeout)
      SBN_FAIL_("rank 0 alone: %s (%s); expected the op to be enqueued", sbnGetResultName(e),
                sbnGetLastError(g_stuck));
    /* until the comm reports its failure (the op's timeout ends the wait; an async error
       that never comes is the launcher's timeout) */
    sbnResult_t a = sbnSuccess;
    double el = -1.0;
    for (;;) {
      if (sbnCommGetAsyncError(g_stuck, &a) != sbnSuccess) break;
      if (a != sbnSuccess) {
        el = now_ms() - t0;
        break;
      }
      sleep_ms(5);
    }
    fprintf(stderr, "  rank 0: async error %s %.1f ms after the call (timeout %d ms)\n",
            sbnGetResultName(a), el, STUCK_TIMEOUT_MS);
    if (a != sbnTimeout)
      SBN_FAIL_("rank 0 alone: async error %s, expected sbnTimeout", sbnGetResultName(a));
    else if (el < 0.9 * STUCK_TIMEOUT_MS)
      SBN_FAIL_("the op gave up after %.1f ms, before the %d ms timeout", el, STUCK_TIMEOUT_MS);
    /* the stream finishes without a CUDA error: the kernel returns, no trap */
    cudaError_t err = cudaSuccess;
    (void)wait_stream_done(d.st[0], g_stuck, now_ms(), &err);
    if (err != cudaSuccess)
      SBN_FAIL_("rank 0's stream finished with %s (%s)", cudaGetErrorName(err),
                cudaGetErrorString(err));
    else
      dteam_check_untouched(&d, &h, 0, "the timed-out op");
    sbnResult_t f = gpu_call(&d, &h, 0, 0, 0, &p), b = gpu_call(&d, &h, 0, 1, 0, &p);
    if (f != sbnAborted || b != sbnAborted)
      SBN_FAIL_("after the timeout: forward %s, backward %s, expected sbnAborted",
                sbnGetResultName(f), sbnGetResultName(b));
  }
  FILE* f = fopen(path, "w");
  if (f) fclose(f);
  sbnCommDestroy(g_stuck);
  g_stuck = NULL;
  dteam_free(&d);
  team_free(&h);
}

/* ---- a child: rank r of W ---------------------------------------------------------------- */
static int rank_main(int rank, int W, const void* blob, void* vctx) {
  g_rank = rank;
  g_W = W;
  g_ctx = (const run_ctx_t*)vctx;
  const ncclUniqueId* ids = (const ncclUniqueId*)blob;
  int ndev = 0;
  cudaError_t ce = cudaGetDeviceCount(&ndev);
  if (ce != cudaSuccess || ndev <= rank) {
    fprintf(stderr, "rank %d: FAILED: %d device(s) (%s), rank %d needs device %d\n", rank, ndev,
            cudaGetErrorString(ce), rank, rank);
    return 1;
  }
  if (cudaSetDevice(rank) != cudaSuccess) return 1;
  g_home_device = rank; /* gpu_fixture.h's helpers return to it */
  char path[320];
  snprintf(path, sizeof path, "%s/agree.%d", g_ctx->dir, rank);
  g_log = fopen(path, "w");
  if (!g_log) {
    fprintf(stderr, "rank %d: FAILED: cannot write %s\n", rank, path);
    return 1;
  }
  double t0 = now_ms();
  if (!NCCL_OK(ncclCommInitRank(&g_nc, W, ids[0], rank))) return 1;
  if (W >= 2 && !NCCL_OK(ncclCommInitRank(&g_nc_stuck, W, ids[1], rank))) return 1;
  int dev = -1, nr = -1, nc = -1;
  if (NCCL_OK(ncclCommCuDevice(g_nc, &dev)) && NCCL_OK(ncclCommUserRank(g_nc, &nr)) &&
      NCCL_OK(ncclCommCount(g_nc, &nc)) && (dev != rank || nr != rank || nc != W)) {
    fprintf(stderr, "rank %d: FAILED: NCCL comm says device %d rank %d count %d\n", rank, dev, nr,
            nc);
    return 1;
  }
  fprintf(stderr, "rank %d of %d: NCCL comms ready (%.1f s)\n", rank, W, (now_ms() - t0) / 1e3);
  SBN_RUN(test_init);
  SBN_RUN(test_cases_vs_cpu);
  SBN_RUN(test_split);
  SBN_RUN(test_argument_errors);
  SBN_RUN(test_destroy);
  SBN_RUN(test_stuck_peer);
  if (g_stuck) sbnCommDestroy(g_stuck);
  if (g_nc) ncclCommDestroy(g_nc);
  if (g_nc_stuck) ncclCommDestroy(g_nc_stuck);
  team_comms_destroy();
  fclose(g_log);
  fprintf(stderr, "rank %d of %d: %.1f s\n", rank, W, (now_ms() - t0) / 1e3);
  return sbn_test_exit();
}

/* Rank 0 of the launch: two NCCL ids (the comm under test, the stuck-peer comm). */
static int make_ids(void* blob, size_t size, void* ctx) {
  (void)ctx;
  if (size != 2 * sizeof(ncclUniqueId)) return 1;
  ncclUniqueId* ids = (ncclUniqueId*)blob;
  for (int i = 0; i < 2; i++) {
    ncclResult_t e = ncclGetUniqueId(&ids[i]);
    if (e != ncclSuccess) {
      fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetErrorString(e));
      return 1;
    }
  }
  return 0;
}

/* ---- the parent ------------------------------------------------------------------------ */
typedef struct {
  char label[96];
  unsigned long long h;
} rec_t;

/* Reads <dir>/agree.<r>; returns the number of records (-1 if missing). */
static int read_log(const char* dir, int r, rec_t** out) {
  char path[320];
  snprintf(path, sizeof path, "%s/agree.%d", dir, r);
  FILE* f = fopen(path, "r");
  *out = NULL;
  if (!f) return -1;
  int n = 0, cap = 0;
  rec_t rec;
  while (fscanf(f, "%95s %llx", rec.label, &rec.h) == 2) {
    if (n == cap) {
      cap = cap ? 2 * cap : 256;
      rec_t* p = (rec_t*)realloc(*out, (size_t)cap * sizeof rec);
      if (!p) break;
      *out = p;
    }
    (*out)[n++] = rec;
  }
  fclose(f);
  return n;
}

/* Bitwise rank agreement: a label logged by several ranks has one hash. Every rank logged
   the same number of "case" records, and at least one. Returns 1 when all agree. */
static int check_agreement(const char* dir, int W) {
  rec_t* logs[MAXW] = {0};
  int cnt[MAXW], ok = 1, ncase0 = -1;
  for (int r = 0; r < W; r++) {
    cnt[r] = read_log(dir, r, &logs[r]);
    if (cnt[r] < 0) {
      fprintf(stderr, "rank agreement: rank %d left no log\n", r);
      ok = 0;
      continue;
    }
    int ncase = 0;
    for (int i = 0; i < cnt[r]; i++) ncase += strncmp(logs[r][i].label, "case", 4) == 0;
    if (ncase0 < 0) ncase0 = ncase;
    if (ncase == 0 || ncase != ncase0) {
      fprintf(stderr, "rank agreement: rank %d logged %d case records (rank 0: %d)\n", r, ncase,
              ncase0);
      ok = 0;
    }
  }
  int compared = 0;
  for (int a = 0; a < W && ok; a++)
    for (int i = 0; i < cnt[a]; i++)
      for (int b = a + 1; b < W; b++)
        for (int j = 0; j < cnt[b]; j++) {
          if (strcmp(logs[a][i].label, logs[b][j].label) != 0) continue;
          compared++;
          if (logs[a][i].h != logs[b][j].h) {
            if (ok)
              fprintf(stderr,
                      "rank agreement: FAILED: %s: rank %d and rank %d differ (bitwise; hashes "
                      "%016llx, %016llx)\n",
                      logs[a][i].label, a, b, logs[a][i].h, logs[b][j].h);
            ok = 0;
          }
        }
  if (ok)
    fprintf(stderr,
            "rank agreement: W = %d: %d records per rank, %d pairs compared, bitwise equal\n", W,
            W > 0 ? cnt[0] : 0, compared);
  for (int r = 0; r < W; r++) free(logs[r]);
  return ok;
}

static void rm_dir(const char* dir, int W) {
  char path[320];
  for (int r = 0; r < W; r++) {
    snprintf(path, sizeof path, "%s/agree.%d", dir, r);
    unlink(path);
  }
  snprintf(path, sizeof path, "%s/stuck.done", dir);
  unlink(path);
  rmdir(dir);
}

/* Parses "1,2,4" / "1 2 4" into ws (distinct, 1..MAXW); returns the count, -1 on error. */
static int parse_ws(const char* s, int* ws, int max) {
  int n = 0;
  while (*s) {
    if (*s == ',' || *s == ' ') {
      s++;
      continue;
    }
    char* end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > MAXW || n == max) return -1;
    ws[n++] = (int)v;
    s = end;
  }
  return n;
}

int main(int argc, char** argv) {
  unsetenv("SBN_TIMEOUT_MS"); /* the test sets its own timeouts */
  const char* q = getenv("SBN_TEST_QUICK");
  g_quick = q != NULL && q[0] != '\0' && strcmp(q, "0") != 0;
  /* no CUDA in this process before the forks: the device count comes from a child */
  char why[256] = "";
  int ndev = mp_probe_devices(why, sizeof why);
  if (ndev == 0) return gpu_skip_no_device("test_nccl_team", why);
  int req[64], nreq = 0;
  const char* wenv = getenv("SBN_TEST_NCCL_W");
  if (argc > 1) {
    for (int i = 1; i < argc && nreq >= 0; i++) {
      int k = parse_ws(argv[i], req + nreq, 64 - nreq);
      nreq = k < 0 ? -1 : nreq + k;
    }
  } else if (wenv && wenv[0]) {
    nreq = parse_ws(wenv, req, 64);
  } else {
    req[nreq++] = 1;
    for (int w = 2; w <= MAXW; w++) req[nreq++] = w;
  }
  if (nreq <= 0) {
    fprintf(stderr, "usage: test_nccl_team [W ...] (1 <= W <= %d; or SBN_TEST_NCCL_W=1,2,4)\n",
            MAXW);
    return 1;
  }
  int ws[64], nws = 0;
  char skipped[256] = "";
  size_t off = 0;
  for (int i = 0; i < nreq; i++) {
    if (req[i] <= ndev)
      ws[nws++] = req[i];
    else if (off < sizeof skipped - 8)
      off += (size_t)snprintf(skipped + off, sizeof skipped - off, "%s%d", off ? ", " : "", req[i]);
  }
  printf("test_nccl_team: %d CUDA device(s); SBN_NCCL_TRANSPORT=%s\n", ndev,
         getenv("SBN_NCCL_TRANSPORT") ? getenv("SBN_NCCL_TRANSPORT") : "(unset)");
  if (skipped[0])
    printf(
        "test_nccl_team: W = %s SKIPPED: this machine has %d GPU(s), a team of W needs W "
        "(one process per GPU)\n",
        skipped, ndev);
  if (nws == 0) {
    printf("test_nccl_team: SKIPPED: no requested team size fits on %d GPU(s)\n", ndev);
    return MP_SKIP;
  }

  run_ctx_t ctx;
  memset(&ctx, 0, sizeof ctx);
  const char* tr = getenv("SBN_NCCL_TRANSPORT");
  snprintf(ctx.transport, sizeof ctx.transport, "%s", tr ? tr : "");
  if (strcmp(ctx.transport, "auto") == 0) ctx.transport[0] = '\0';
  const char* ah = getenv("SBN_TEST_ALLOW_NCCL_HOST");
  ctx.allow_host = ah && strcmp(ah, "1") == 0;
  /* the launcher's guards against a hang, not assertions: once a rank failed, the others
     get their team timeout (their waits end there) and 10 s more before they are stopped */
  mp_opts_t opts = {300.0, (TEAM_TIMEOUT_MS + 10000.0) / 1e3};
  const char* ts = getenv("SBN_TEST_NCCL_TIMEOUT_S");
  if (ts && atof(ts) > 0) opts.timeout_s = atof(ts);

  int nfail = 0, npass = 0, nskip = 0;
  char summary[1024] = "";
  size_t so = 0;
  for (int i = 0; i < nws; i++) {
    int W = ws[i];
    snprintf(ctx.dir, sizeof ctx.dir, "%s/sbn_nccl_XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(ctx.dir) == NULL) {
      perror("mkdtemp");
      return 1;
    }
    fprintf(stderr, "test_nccl_team: ---- W = %d: %d process(es), one GPU each ----\n", W, W);
    mp_rank_status_t st[MAXW];
    memset(st, 0, sizeof st);
    double t0 = mp_now_s();
    int rc = mp_run_opts(W, 2 * sizeof(ncclUniqueId), make_ids, rank_main, &ctx, &opts, st);
    if (rc == 0 && !check_agreement(ctx.dir, W)) rc = 1;
    double el = mp_now_s() - t0;
    rm_dir(ctx.dir, W);
    const char* verdict = rc == 0 ? "passed" : rc == MP_SKIP ? "skipped" : "FAILED";
    fprintf(stderr, "test_nccl_team: W = %d %s (%.1f s)\n", W, verdict, el);
    if (so < sizeof summary - 40)
      so += (size_t)snprintf(summary + so, sizeof summary - so, " W=%d %s;", W, verdict);
    if (rc == 0)
      npass++;
    else if (rc == MP_SKIP)
      nskip++;
    else
      nfail++;
    int hung = 0;
    for (int r = 0; r < W; r++) hung |= st[r].state == MP_RANK_HUNG || st[r].state == MP_RANK_LOST;
    if (hung && i + 1 < nws) {
      fprintf(stderr, "test_nccl_team: a rank hung at W = %d: the larger teams are not run\n", W);
      break;
    }
  }
  printf("test_nccl_team:%s%s%s\n", summary, skipped[0] ? " skipped for lack of GPUs: W=" : "",
         skipped);
  if (nfail) return 1;
  return npass ? 0 : MP_SKIP;
}
