/* test_team.c — how a CPU team behaves as a team: timeouts, sbnCommAbort, sub-teams
 * (sbnCommSplit in group and thread-per-rank mode), several ops per rank in one group, a
 * group whose queue cannot grow, several teams in one group (in queue order, stopping at
 * a failed op), op mismatches in
 * thread-per-rank mode, ranks out of step after a call refused on some ranks only, and a
 * rank destroyed while its peers live (and the normal teardown).
 *
 * Thread-per-rank calls run on pthreads created here; every wait is bounded by a comm
 * timeout, so a library bug shows as a failed assertion, not a hung test.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep, setenv */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h> /* _exit */

#include "harness.h"
#include "sbn_ref.h"

#define MAXC 8
#define MAXE 256
#define POISON 0xA5
#define SENTINEL_COMM ((sbnComm_t)(uintptr_t)0x5b5b5b50u)

/* Tolerances (DESIGN.md): fp32 statistics 1e-5/1e-5, fp32 outputs 1e-4/1e-4, against
   the double reference on the same data. */
#define STAT_ATOL 1e-5
#define STAT_RTOL 1e-5
#define OUT_ATOL 1e-4
#define OUT_RTOL 1e-4

typedef struct {
  sbnTensorDesc_t d;
  float x[MAXE], dy[MAXE], y[MAXE], dx[MAXE];
  float w[MAXC], b[MAXC], rm[MAXC], rv[MAXC], sm[MAXC], si[MAXC], dw[MAXC], db[MAXC];
  int64_t nbt;
} bufs_t;

/* fp32 NCHW (n, c, spatial); random inputs; outputs poisoned; running stats 0/1 */
static void bufs_init(bufs_t* b, int64_t n, int64_t c, int64_t spatial, uint64_t seed) {
  memset(b, POISON, sizeof *b);
  sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, n, c, spatial};
  b->d = d;
  sbn_rng_t r = {seed};
  for (int i = 0; i < MAXE; i++) {
    b->x[i] = (float)(0.5 + 2.0 * sbn_rng_normal(&r));
    b->dy[i] = (float)sbn_rng_normal(&r);
  }
  for (int i = 0; i < MAXC; i++) {
    b->w[i] = 1.0f + 0.25f * (float)i;
    b->b[i] = -0.5f + 0.125f * (float)i;
    b->rm[i] = 0.0f;
    b->rv[i] = 1.0f;
  }
  b->nbt = 0;
}

static sbnResult_t fwd(sbnComm_t comm, bufs_t* b) {
  return sbnForwardTrain(comm, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm,
                         b->si, NULL, NULL);
}
/* A forward refused at its arguments (y NULL), on this rank only where its peers pass y. */
static sbnResult_t fwd_refused(sbnComm_t comm, bufs_t* b) {
  return sbnForwardTrain(comm, &b->d, b->x, NULL, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm,
                         b->si, NULL, NULL);
}
static sbnResult_t bwd(sbnComm_t comm, bufs_t* b) {
  return sbnBackward(comm, &b->d, b->x, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, NULL,
                     NULL);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}
static int last_error_set(sbnComm_t comm) {
  const char* e = sbnGetLastError(comm);
  return e != NULL && e[0] != '\0';
}

/* A team timeout no wait of a passing run reaches: longer than CTest's TIMEOUT for this
   test (tests/CMakeLists.txt, 300 s), so a wait that only the timeout could end fails as
   a CTest timeout instead of passing late. */
#define BEYOND_CTEST_TIMEOUT_MS 3600000

static sbnConfig_t config_ms(int64_t timeout_ms) {
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  cfg.timeout_ms = timeout_ms;
  cfg.max_channels = MAXC;
  return cfg;
}

/* A CPU team of W ranks with a timeout, and each rank's buffers (bufs_init(n, c, spatial,
   seed + r)); snap: a copy of them (NULL: none). 0 where the team could not be made. */
static int team_bufs(sbnComm_t* comms, int W, int64_t timeout_ms, bufs_t* b, bufs_t* snap, int64_t n,
                     int64_t c, int64_t spatial, uint64_t seed) {
  sbnConfig_t cfg = config_ms(timeout_ms);
  if (sbnCommInitCpu(comms, W, &cfg) != sbnSuccess) return 0;
  for (int r = 0; r < W; r++) bufs_init(&b[r], n, c, spatial, seed + (uint64_t)r);
  if (snap != NULL) memcpy(snap, b, (size_t)W * sizeof *b);
  return 1;
}

/* ---- thread per rank ------------------------------------------------------------------ */
enum { JOB_FWD, JOB_BWD, JOB_SPLIT };
typedef struct {
  int kind;
  sbnComm_t comm;
  bufs_t* b;
  int color, key;
  sbnComm_t* newcomm;
  sbnResult_t r;
  double t0, t1; /* call start/end, ms */
  int start_ms;      /* the thread sleeps this long before its call */
  int lock_delay_ms; /* the call's first pthread_mutex_lock waits this long first */
  int refused_first;  /* JOB_FWD: a forward refused at its arguments (y NULL) first */
  sbnResult_t r_refused; /* its result */
  int fail_calloc;       /* the library's calloc fails in this thread during the call */
} job_t;

/* The wall clock as the library reads it (tests/CMakeLists.txt links test_team with
   -Wl,--wrap=clock_gettime): CLOCK_REALTIME shifted by wall_shift_s, as after a step of
   the system clock; every other clock as it is. */
static _Atomic long wall_shift_s;
int __real_clock_gettime(clockid_t clk, struct timespec* ts);
int __wrap_clock_gettime(clockid_t clk, struct timespec* ts);
int __wrap_clock_gettime(clockid_t clk, struct timespec* ts) {
  int r = __real_clock_gettime(clk, ts);
  if (r == 0 && clk == CLOCK_REALTIME) ts->tv_sec += (time_t)atomic_load(&wall_shift_s);
  return r;
}

/* The library's realloc as it reaches it (tests/CMakeLists.txt: -Wl,--wrap=realloc): while
   fail_realloc is set, every call fails as an exhausted heap's would. */
static _Atomic int fail_realloc;
void* __real_realloc(void* p, size_t size);
void* __wrap_realloc(void* p, size_t size);
void* __wrap_realloc(void* p, size_t size) {
  if (atomic_load(&fail_realloc)) return NULL;
  return __real_realloc(p, size);
}

/* The library's calloc (-Wl,--wrap=calloc): fails in a thread whose fail_calloc_here is
   set, as an exhausted heap's would (test_split_failure_detail). */
static _Thread_local int fail_calloc_here;
void* __real_calloc(size_t n, size_t size);
void* __wrap_calloc(size_t n, size_t size);
void* __wrap_calloc(size_t n, size_t size) {
  if (fail_calloc_here) return NULL;
  return __real_calloc(n, size);
}

/* The library's pthread_mutex_lock (-Wl,--wrap=pthread_mutex_lock): a thread whose
   lock_delay_ms is set sleeps that long before its next lock, as a thread the scheduler
   stalled there would (test_split_late_rank). */
static _Thread_local int lock_delay_ms, unlock_delay_ms;
static _Atomic double stall_began_ms; /* when the last delayed lock began to wait */
int __real_pthread_mutex_lock(pthread_mutex_t* m);
int __wrap_pthread_mutex_lock(pthread_mutex_t* m);
/* Sleeps *delay_ms once (then 0), noting when the stall began. */
static void stall_once(int* delay_ms) {
  if (*delay_ms <= 0) return;
  const int ms = *delay_ms;
  *delay_ms = 0;
  atomic_store(&stall_began_ms, now_ms());
  sleep_ms(ms);
}
int __wrap_pthread_mutex_lock(pthread_mutex_t* m) {
  stall_once(&lock_delay_ms);
  return __real_pthread_mutex_lock(m);
}

/* pthread_mutex_unlock likewise (-Wl,--wrap=pthread_mutex_unlock): a thread whose
   unlock_delay_ms is set sleeps that long before its next unlock (test_abort_then_destroy). */
int __real_pthread_mutex_unlock(pthread_mutex_t* m);
int __wrap_pthread_mutex_unlock(pthread_mutex_t* m);
int __wrap_pthread_mutex_unlock(pthread_mutex_t* m) {
  stall_once(&unlock_delay_ms);
  return __real_pthread_mutex_unlock(m);
}

/* pthread_create likewise (-Wl,--wrap=pthread_create): on the calling thread, once
   fail_thread_count is set, the next fail_thread_after starts succeed and then
   fail_thread_count fail with EAGAIN (test_group_thread_start_fails). */
static _Thread_local int fail_thread_after, fail_thread_count;
int __real_pthread_create(pthread_t* t, const pthread_attr_t* a, void* (*fn)(void*), void* arg);
int __wrap_pthread_create(pthread_t* t, const pthread_attr_t* a, void* (*fn)(void*), void* arg);
int __wrap_pthread_create(pthread_t* t, const pthread_attr_t* a, void* (*fn)(void*), void* arg) {
  if (fail_thread_count > 0) {
    if (fail_thread_after == 0) {
      fail_thread_count--;
      return EAGAIN;
    }
    fail_thread_after--;
  }
  return __real_pthread_create(t, a, fn, arg);
}

static void* job_main(void* arg) {
  job_t* j = (job_t*)arg;
  if (j->start_ms > 0) {
    struct timespec ts = {j->start_ms / 1000, (long)(j->start_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  lock_delay_ms = j->lock_delay_ms;
  j->t0 = now_ms();
  if (j->refused_first) j->r_refused = fwd_refused(j->comm, j->b);
  fail_calloc_here = j->fail_calloc;
  switch (j->kind) {
    case JOB_FWD: j->r = fwd(j->comm, j->b); break;
    case JOB_BWD: j->r = bwd(j->comm, j->b); break;
    default: j->r = sbnCommSplit(j->comm, j->color, j->key, j->newcomm); break;
  }
  fail_calloc_here = 0;
  j->t1 = now_ms();
  return NULL;
}
/* n jobs, rank r's a split of parent[r] into one sub-team (color 0, key r) into sub[r]. */
static void split_jobs(job_t* jobs, int n, sbnComm_t* parent, sbnComm_t* sub) {
  memset(jobs, 0, (size_t)n * sizeof *jobs);
  for (int r = 0; r < n; r++) {
    jobs[r].kind = JOB_SPLIT; jobs[r].comm = parent[r];
    jobs[r].color = 0; jobs[r].key = r; jobs[r].newcomm = &sub[r];
  }
}

/* Starts one thread per job and joins them all. Returns 0 if threads could not start. */
static int run_jobs(job_t* jobs, int n) {
  pthread_t t[16];
  for (int i = 0; i < n; i++)
    if (pthread_create(&t[i], NULL, job_main, &jobs[i]) != 0) return 0;
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  return 1;
}

/* ---- timeout ------------------------------------------------------------------------ */
/* A team of 3 where only ranks 0 and 1 call: both wait timeout_ms, return sbnTimeout,
   the team is aborted everywhere, and later calls fail fast. */
static void test_timeout(void) {
  const int64_t timeout = 300;
  sbnComm_t comms[3];
  static bufs_t b[3], snap[3];
  ASSERT_TRUE(team_bufs(comms, 3, timeout, b, snap, 2, 4, 3, 100));

  job_t jobs[2];
  for (int r = 0; r < 2; r++) {
    memset(&jobs[r], 0, sizeof jobs[r]);
    jobs[r].kind = JOB_FWD; jobs[r].comm = comms[r]; jobs[r].b = &b[r];
  }
  ASSERT_TRUE(run_jobs(jobs, 2));
  /* The first rank to arrive times out after timeout_ms and aborts the team, which wakes
     the other waiter at the same moment: so the lower bound is relative to the FIRST
     arrival (a later rank may wait a little less than timeout_ms itself). */
  double first = jobs[0].t0 < jobs[1].t0 ? jobs[0].t0 : jobs[1].t0;
  for (int r = 0; r < 2; r++) {
    double waited = jobs[r].t1 - jobs[r].t0;
    fprintf(stderr, "  rank %d: %s after %.1f ms (%.1f ms after the first arrival)\n", r,
            sbnGetResultName(jobs[r].r), waited, jobs[r].t1 - first);
    ASSERT_RES(jobs[r].r, sbnTimeout);
    /* at least the timeout after the first arrival (2 ms slack for clock granularity);
       no upper bound: a loaded machine is slow, and sbnTimeout says what ended the wait */
    EXPECT_TRUE(jobs[r].t1 - first >= (double)timeout - 2.0);
    EXPECT_TRUE(last_error_set(comms[r]));
  }
  ASSERT_MEMEQ(b, snap, sizeof b); /* a timed-out op writes nothing */
  for (int r = 0; r < 3; r++) {
    sbnResult_t async = sbnSuccess;
    ASSERT_OK(sbnCommGetAsyncError(comms[r], &async));
    ASSERT_RES(async, sbnTimeout);
  }
  /* later calls, on the rank that never called and on one that timed out: sbnAborted
     (no group: a W > 1 team would otherwise wait for its peers, and time out); that they
     return at once is test_abort's */
  for (int r = 2; r >= 0; r -= 2) {
    ASSERT_RES(fwd(comms[r], &b[r]), sbnAborted);
    ASSERT_RES(bwd(comms[r], &b[r]), sbnAborted);
    EXPECT_TRUE(last_error_set(comms[r]));
  }
  /* a whole group on the aborted team fails too (at the call or at sbnGroupEnd) */
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 3; r++) (void)fwd(comms[r], &b[r]);
  sbnResult_t g = sbnGroupEnd();
  EXPECT_TRUE(g == sbnAborted || g == sbnInvalidUsage);
  ASSERT_MEMEQ(b, snap, sizeof b);
  for (int r = 0; r < 3; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* A rank that comes late, while its peer already waits for a rank that never comes: the
   peer's wait runs out first and aborts the team; the late rank returns sbnTimeout too,
   sooner than the timeout after its own call, and its message says that another rank's
   wait ran out (it said that it had waited the whole timeout itself). */
static void test_timeout_late_arrival(void) {
  const int64_t timeout = 400;
  sbnConfig_t cfg = config_ms(timeout);
  sbnComm_t comms[3];
  ASSERT_OK(sbnCommInitCpu(comms, 3, &cfg));
  static bufs_t b[2];
  for (int r = 0; r < 2; r++) bufs_init(&b[r], 2, 4, 3, 140 + (uint64_t)r);
  job_t jobs[2];
  memset(jobs, 0, sizeof jobs);
  for (int r = 0; r < 2; r++) {
    jobs[r].kind = JOB_FWD;
    jobs[r].comm = comms[r];
    jobs[r].b = &b[r];
  }
  pthread_t th;
  ASSERT_TRUE(pthread_create(&th, NULL, job_main, &jobs[0]) == 0);
  sleep_ms(200);
  job_main(&jobs[1]);
  pthread_join(th, NULL);
  for (int r = 0; r < 2; r++) {
    fprintf(stderr, "  rank %d: %s after %.1f ms: %s\n", r, sbnGetResultName(jobs[r].r), jobs[r].t1 - jobs[r].t0,
            sbnGetLastError(comms[r]));
    ASSERT_RES(jobs[r].r, sbnTimeout);
  }
  if (jobs[0].t1 - jobs[0].t0 >= (double)timeout - 2.0) /* rank 0's own wait ran out (a thread
                                                            started late may not have) */
    EXPECT_TRUE(strstr(sbnGetLastError(comms[0]), "rank 0 waited 400 ms for rank") != NULL);
  if (jobs[1].t1 - jobs[1].t0 < (double)timeout - 2.0) /* rank 1's own wait did not run out */
    EXPECT_TRUE(strstr(sbnGetLastError(comms[1]), "when another rank's wait of 400 ms ran out") != NULL);
  else /* rank 0's thread started late: rank 1's own wait ran out first */
    EXPECT_TRUE(strstr(sbnGetLastError(comms[1]), "rank 1 waited 400 ms for rank") != NULL);
  for (int r = 0; r < 3; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* A team of 2 made with SBN_TIMEOUT_MS set to env and a config of cfg_ms: one thread
   calling it without a group waits for the timeout, at least 200 ms, and the other rank
   sees it (sbnCommGetAsyncError). */
static void env_timeout_waits_200ms(const char* env, int64_t cfg_ms) {
  sbnConfig_t cfg = config_ms(cfg_ms);
  sbnComm_t comms[2];
  ASSERT_TRUE(setenv("SBN_TIMEOUT_MS", env, 1) == 0);
  sbnResult_t r = sbnCommInitCpu(comms, 2, &cfg);
  unsetenv("SBN_TIMEOUT_MS");
  ASSERT_OK(r);
  static bufs_t b;
  bufs_init(&b, 3, 2, 2, 7);
  double t0 = now_ms();
  ASSERT_RES(fwd(comms[0], &b), sbnTimeout);
  double waited = now_ms() - t0;
  fprintf(stderr, "  SBN_TIMEOUT_MS='%s': waited %.1f ms\n", env, waited);
  EXPECT_TRUE(waited >= 195.0); /* 5 ms slack for clock granularity */
  sbnResult_t async = sbnSuccess;
  ASSERT_OK(sbnCommGetAsyncError(comms[1], &async));
  ASSERT_RES(async, sbnTimeout);
  for (int i = 0; i < 2; i++) ASSERT_OK(sbnCommDestroy(comms[i]));
}

/* SBN_TIMEOUT_MS overrides the config's timeout at init: the environment's 200 ms, since
   the config's is longer than CTest's TIMEOUT for this test (ignoring the override is a
   hang that CTest fails), and not less. */
static void test_timeout_env_override(void) { env_timeout_waits_200ms("200", BEYOND_CTEST_TIMEOUT_MS); }

/* An empty SBN_TIMEOUT_MS is as unset (as the other SBN_ variables): init succeeds and
   the config's timeout (200 ms) ends the wait (init failed with sbnInvalidArgument for
   every team: a launcher's `SBN_TIMEOUT_MS=$T` with T unset). */
static void test_timeout_env_empty(void) { env_timeout_waits_200ms("", 200); }

/* ---- abort -------------------------------------------------------------------------- */
/* Runs job on a thread of its own (a rank that will wait for a peer), lets it start
   waiting, then calls act(target) from this thread (sbnCommAbort, sbnCommDestroy) and
   joins: *act_r is act's result, *late_ms how long after act the job returned. */
static void act_on_waiter(job_t* job, sbnResult_t (*act)(sbnComm_t), sbnComm_t target,
                          sbnResult_t* act_r, double* late_ms) {
  *act_r = sbnSystemError; /* what the caller sees if the thread cannot start */
  *late_ms = -1.0;
  pthread_t th;
  ASSERT_TRUE(pthread_create(&th, NULL, job_main, job) == 0);
  sleep_ms(150); /* let the job start waiting (not required for correctness) */
  const double t_act = now_ms();
  *act_r = act(target);
  pthread_join(th, NULL);
  *late_ms = job->t1 - t_act;
}

/* Rank 0 waits for a peer that never comes; another thread aborts the team through rank
   1's handle, then (second round) through rank 0's own handle. The team's timeout is
   longer than CTest's TIMEOUT for this test: only the abort can end the wait, and later
   calls that waited instead of failing at once would be a hang that CTest fails. */
static void test_abort(void) {
  for (int target = 1; target >= 0; target--) {
    sbnComm_t comms[2];
    static bufs_t b[2], snap[2];
    ASSERT_TRUE(team_bufs(comms, 2, BEYOND_CTEST_TIMEOUT_MS, b, snap, 2, 3, 2, 200));

    job_t job;
    memset(&job, 0, sizeof job);
    job.kind = JOB_FWD; job.comm = comms[0]; job.b = &b[0];
    sbnResult_t ar;
    double late;
    act_on_waiter(&job, sbnCommAbort, comms[target], &ar, &late);
    ASSERT_OK(ar);
    fprintf(stderr, "  abort via rank %d: waiter returned %s %.1f ms after the abort\n", target,
            sbnGetResultName(job.r), late);
    ASSERT_RES(job.r, sbnAborted);
    EXPECT_TRUE(last_error_set(comms[0]));
    for (int r = 0; r < 2; r++) {
      sbnResult_t async = sbnSuccess;
      ASSERT_OK(sbnCommGetAsyncError(comms[r], &async));
      ASSERT_RES(async, sbnAborted);
    }
    for (int r = 0; r < 2; r++) {
      ASSERT_RES(fwd(comms[r], &b[r]), sbnAborted);
      ASSERT_RES(bwd(comms[r], &b[r]), sbnAborted);
    }
    ASSERT_MEMEQ(b, snap, sizeof b);
    ASSERT_OK(sbnCommAbort(comms[0])); /* idempotent */
    ASSERT_OK(sbnCommAbort(comms[1]));
    for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
  }
}

/* sbnCommAbort from a thread that is slow to finish it (stalled at its unlock of the team's
   lock, after the abort the waiter sees): the waiting rank returns at once, and its thread
   destroys both comms, the team's last, at once too. The destroy must wait for the abort
   (team->aborting), which otherwise unlocked and read a freed team (ASan: heap use after
   free; here: the destroy returned before the abort). */
typedef struct {
  sbnComm_t comm;
  sbnResult_t r;
  double t_end;
} aborter_t;
static void* aborter_main(void* p) {
  aborter_t* a = p;
  unlock_delay_ms = 300;
  a->r = sbnCommAbort(a->comm);
  a->t_end = now_ms();
  return NULL;
}
static void test_abort_then_destroy(void) {
  sbnComm_t comms[2];
  static bufs_t b[2];
  ASSERT_TRUE(team_bufs(comms, 2, BEYOND_CTEST_TIMEOUT_MS, b, NULL, 2, 3, 2, 250));
  job_t job;
  memset(&job, 0, sizeof job);
  job.kind = JOB_FWD; job.comm = comms[0]; job.b = &b[0];
  pthread_t waiter, aborter;
  ASSERT_TRUE(pthread_create(&waiter, NULL, job_main, &job) == 0);
  sleep_ms(150); /* rank 0 waits for rank 1 */
  aborter_t a = {comms[1], sbnSystemError, 0.0};
  ASSERT_TRUE(pthread_create(&aborter, NULL, aborter_main, &a) == 0);
  pthread_join(waiter, NULL);
  ASSERT_RES(job.r, sbnAborted);
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r])); /* the team's last: freed */
  const double destroyed = now_ms();
  pthread_join(aborter, NULL);
  fprintf(stderr, "  the waiter returned %.1f ms before the abort did; the destroy %.1f ms after it\n",
          a.t_end - job.t1, destroyed - a.t_end);
  ASSERT_OK(a.r);
  EXPECT_TRUE(destroyed >= a.t_end);
}

/* ---- split ---------------------------------------------------------------------------- */
/* Parent ranks 0..3 with colors {0,1,0,1} and keys {3,2,1,0}: sub-team 0 = parent ranks
   (2, 0), sub-team 1 = parent ranks (3, 1), in that rank order. */
static const int kColor[4] = {0, 1, 0, 1};
static const int kKey[4] = {3, 2, 1, 0};
static const int kSubRank[4] = {1, 1, 0, 0};

static void check_sub_ranks(sbnComm_t* sub) {
  for (int r = 0; r < 4; r++) {
    ASSERT_TRUE(sub[r] != NULL && sub[r] != SENTINEL_COMM);
    int rank = -1, count = -1;
    ASSERT_OK(sbnCommRank(sub[r], &rank));
    ASSERT_OK(sbnCommCount(sub[r], &count));
    if (rank != kSubRank[r] || count != 2)
      SBN_FAIL_("parent rank %d: sub rank %d count %d, expected %d and 2", r, rank, count,
                kSubRank[r]);
  }
}

/* Forward on both sub-teams (one group, two teams) and compare each with the reference
   over that sub-team's data only, ordered by sub-rank. */
static void check_sub_forward(sbnComm_t* sub) {
  static bufs_t b[4];
  for (int r = 0; r < 4; r++) bufs_init(&b[r], r + 1, 5, 3, 300 + (uint64_t)r);
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 4; r++) ASSERT_OK(fwd(sub[r], &b[r]));
  ASSERT_OK(sbnGroupEnd());
  for (int color = 0; color < 2; color++) {
    int members[2]; /* parent rank of sub-rank 0, 1 */
    for (int r = 0; r < 4; r++)
      if (kColor[r] == color) members[kSubRank[r]] = r;
    sbnTensorDesc_t descs[2];
    const void* xs[2];
    static double y0[MAXE], y1[MAXE];
    double* ys[2] = {y0, y1};
    double mean[MAXC], invstd[MAXC], varu[MAXC];
    int64_t m = 0;
    for (int k = 0; k < 2; k++) {
      descs[k] = b[members[k]].d;
      xs[k] = b[members[k]].x;
    }
    sbn_ref_forward(2, descs, xs, b[0].w, b[0].b, 1e-5, mean, invstd, varu, &m, ys);
    ASSERT_EQ_INT(m, (members[0] + 1 + members[1] + 1) * 3);
    for (int k = 0; k < 2; k++) {
      const bufs_t* bk = &b[members[k]];
      ASSERT_CLOSE_ARRAY(bk->sm, mean, 5, STAT_ATOL, STAT_RTOL);
      ASSERT_CLOSE_ARRAY(bk->si, invstd, 5, STAT_ATOL, STAT_RTOL);
      ASSERT_CLOSE_ARRAY(bk->y, ys[k], (size_t)sbn_ref_numel(&bk->d), OUT_ATOL, OUT_RTOL);
      ASSERT_EQ_INT(bk->nbt, 1);
    }
    /* the sub-team's ranks agree bitwise */
    ASSERT_MEMEQ(b[members[0]].sm, b[members[1]].sm, 5 * sizeof(float));
    ASSERT_MEMEQ(b[members[0]].si, b[members[1]].si, 5 * sizeof(float));
    ASSERT_MEMEQ(b[members[0]].rv, b[members[1]].rv, 5 * sizeof(float));
  }
}

static void parent_still_works(sbnComm_t* parent) {
  static bufs_t b[4];
  for (int r = 0; r < 4; r++) bufs_init(&b[r], 2, 3, 2, 400 + (uint64_t)r);
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 4; r++) ASSERT_OK(fwd(parent[r], &b[r]));
  ASSERT_OK(sbnGroupEnd());
  ASSERT_MEMEQ(b[0].sm, b[3].sm, 3 * sizeof(float));
}

static void test_split_group(void) {
  sbnConfig_t cfg = config_ms(20000);
  sbnComm_t parent[4], sub[4];
  ASSERT_OK(sbnCommInitCpu(parent, 4, &cfg));
  for (int r = 0; r < 4; r++) sub[r] = SENTINEL_COMM;
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 4; r++) ASSERT_OK(sbnCommSplit(parent[r], kColor[r], kKey[r], &sub[r]));
  ASSERT_OK(sbnGroupEnd());
  check_sub_ranks(sub);
  if (sbn_test_cur_failed_) return; /* do not run ops on bad handles */
  check_sub_forward(sub);
  parent_still_works(parent);
  /* children first, then the parent */
  for (int r = 0; r < 4; r++) ASSERT_OK(sbnCommDestroy(sub[r]));
  for (int r = 0; r < 4; r++) ASSERT_OK(sbnCommDestroy(parent[r]));
}

/* sbnGroupEnd that cannot start a rank's thread (syncbn.h: sbnSystemError, nothing run):
   a team of 3 in one group, whose queues 1 and 2 get threads; the first start fails (both
   tries: with the library's stack size, then without), or the first succeeds and the
   second fails. No rank's buffer is written, the detail is on every queued comm as on the
   thread, and the team is still in step: the same group again runs, num_batches_tracked 1
   on every rank. */
static void test_group_thread_start_fails(void) {
  for (int after = 0; after < 2; after++) {
    sbnComm_t comms[3];
    static bufs_t b[3], snap[3];
    ASSERT_TRUE(team_bufs(comms, 3, 20000, b, snap, 2, 3, 2, 490));
    ASSERT_OK(sbnGroupStart());
    for (int r = 0; r < 3; r++) ASSERT_OK(fwd(comms[r], &b[r]));
    fail_thread_after = after;
    fail_thread_count = 2;
    const sbnResult_t g = sbnGroupEnd();
    const int unused = fail_thread_count;
    fail_thread_after = fail_thread_count = 0;
    ASSERT_RES(g, sbnSystemError);
    EXPECT_TRUE(unused == 0); /* both tries of the failing start were made */
    EXPECT_TRUE(strstr(sbnGetLastError(NULL), "could not create a thread") != NULL);
    for (int r = 0; r < 3; r++) /* and on every queued comm (USAGE.md: a group that runs nothing) */
      EXPECT_TRUE(strstr(sbnGetLastError(comms[r]), "could not create a thread") != NULL);
    ASSERT_MEMEQ(b, snap, sizeof b);
    ASSERT_OK(sbnGroupStart());
    for (int r = 0; r < 3; r++) ASSERT_OK(fwd(comms[r], &b[r]));
    ASSERT_OK(sbnGroupEnd());
    for (int r = 0; r < 3; r++) ASSERT_EQ_INT(b[r].nbt, 1);
    for (int r = 0; r < 3; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
  }
}

/* A group's splits (API.md, Groups): made before its ops run, whatever the order of the
   calls, so an op that fails at sbnGroupEnd (a team-wide count of 1) leaves them made;
   made team by team in the order of each team's first split call, so a team aborted
   since its calls fails its splits (sbnAborted) with the earlier teams' made and the
   later teams' untouched. */
static void test_split_in_group_with_ops(void) {
  sbnConfig_t cfg = config_ms(20000);
  sbnComm_t a[2], bt[2], sa[2], sb[2];
  static bufs_t b[2];
  ASSERT_OK(sbnCommInitCpu(a, 2, &cfg));
  /* an op queued first, which fails at sbnGroupEnd (M = 1), then the splits */
  bufs_init(&b[0], 1, 3, 1, 470);
  bufs_init(&b[1], 0, 3, 1, 471);
  for (int r = 0; r < 2; r++) sa[r] = SENTINEL_COMM;
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) ASSERT_OK(fwd(a[r], &b[r]));
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommSplit(a[r], 0, r, &sa[r]));
  ASSERT_RES(sbnGroupEnd(), sbnInvalidArgument);
  for (int r = 0; r < 2; r++) ASSERT_TRUE(sa[r] != SENTINEL_COMM && sa[r] != NULL);
  int rank = -1, count = 0;
  ASSERT_OK(sbnCommRank(sa[1], &rank));
  ASSERT_OK(sbnCommCount(sa[1], &count));
  EXPECT_TRUE(rank == 1 && count == 2);
  for (int r = 0; r < 2; r++) bufs_init(&b[r], 2, 3, 2, 472 + (uint64_t)r);
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) ASSERT_OK(fwd(sa[r], &b[r]));
  ASSERT_OK(sbnGroupEnd());
  ASSERT_MEMEQ(b[0].sm, b[1].sm, 3 * sizeof(float));
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(sa[r]));
  /* two teams' splits, team B aborted before sbnGroupEnd: in either order, and with an op
     of team A queued before every split (the splits' order is that of each team's first
     split, not of its first call: before, A's op put A's splits first). No op runs. */
  for (int b_first = 0; b_first < 2; b_first++) {
    ASSERT_OK(sbnCommInitCpu(bt, 2, &cfg));
    for (int r = 0; r < 2; r++) sa[r] = sb[r] = SENTINEL_COMM;
    static bufs_t snap[2];
    for (int r = 0; r < 2; r++) bufs_init(&b[r], 2, 3, 1, 480 + (uint64_t)r);
    memcpy(snap, b, sizeof snap);
    ASSERT_OK(sbnGroupStart());
    for (int r = 0; r < 2; r++) ASSERT_OK(fwd(a[r], &b[r]));
    for (int pass = 0; pass < 2; pass++) {
      const int team_b = pass == 0 ? b_first : !b_first;
      for (int r = 0; r < 2; r++)
        ASSERT_OK(sbnCommSplit(team_b ? bt[r] : a[r], 0, r, team_b ? &sb[r] : &sa[r]));
    }
    ASSERT_OK(sbnCommAbort(bt[0]));
    ASSERT_RES(sbnGroupEnd(), sbnAborted);
    EXPECT_TRUE(strstr(sbnGetLastError(NULL), "split on an aborted team") != NULL);
    ASSERT_MEMEQ(b, snap, sizeof snap); /* A's op was not run */
    for (int r = 0; r < 2; r++) {
      /* the failure's detail on every comm of the group, not on the thread's slot alone */
      EXPECT_TRUE(strstr(sbnGetLastError(a[r]), "split on an aborted team") != NULL);
      EXPECT_TRUE(strstr(sbnGetLastError(bt[r]), "split on an aborted team") != NULL);
      EXPECT_TRUE(sb[r] == SENTINEL_COMM); /* the aborted team's: untouched */
      if (b_first) EXPECT_TRUE(sa[r] == SENTINEL_COMM); /* after it: untouched */
      else EXPECT_TRUE(sa[r] != SENTINEL_COMM && sa[r] != NULL); /* before it: made */
    }
    if (!b_first)
      for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(sa[r]));
    for (int r = 0; r < 2; r++) (void)sbnCommDestroy(bt[r]);
  }
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(a[r]));
}

/* New comms inherit the parent's config (syncbn.h, sbnCommSplit): a parent of timeout
   200 ms and max_channels 3 gives a sub-team whose lone caller times out after 200 ms
   (not the default's 300 s: CTest's limit would end the test first), and whose ops of 4
   channels are refused at the call, nothing written. */
static void test_split_inherits_config(void) {
  sbnConfig_t cfg = config_ms(200);
  cfg.max_channels = 3;
  sbnComm_t parent[2], sub[2];
  ASSERT_OK(sbnCommInitCpu(parent, 2, &cfg));
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommSplit(parent[r], 0, r, &sub[r]));
  ASSERT_OK(sbnGroupEnd());
  static bufs_t b, snap;
  bufs_init(&b, 2, 4, 3, 450);
  memcpy(&snap, &b, sizeof b);
  ASSERT_RES(fwd(sub[0], &b), sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(sub[0]), "max_channels=3") != NULL);
  ASSERT_MEMEQ(&b, &snap, sizeof b);
  b.d.c = 3;
  double t0 = now_ms();
  ASSERT_RES(fwd(sub[0], &b), sbnTimeout);
  double waited = now_ms() - t0;
  fprintf(stderr, "  the sub-team's lone caller: sbnTimeout after %.1f ms\n", waited);
  EXPECT_TRUE(waited >= 195.0);
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(sub[r]));
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(parent[r]));
}

/* A timeout beyond ~100 years (INT64_MAX, in the config or SBN_TIMEOUT_MS) is taken as
   ~100 years (USAGE.md): a team's deadline arithmetic must not overflow into a past
   deadline. Ranks of such a team, and of a team split from it, one of them 100 ms late,
   both succeed. */
static void test_timeout_beyond_100_years(void) {
  for (int how = 0; how < 2; how++) {
    sbnConfig_t cfg = config_ms(how == 0 ? INT64_MAX : 1000);
    sbnComm_t comms[2], sub[2];
    if (how == 1) ASSERT_TRUE(setenv("SBN_TIMEOUT_MS", "9223372036854775807", 1) == 0);
    sbnResult_t r0 = sbnCommInitCpu(comms, 2, &cfg);
    unsetenv("SBN_TIMEOUT_MS");
    ASSERT_OK(r0);
    ASSERT_OK(sbnGroupStart());
    for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommSplit(comms[r], 0, r, &sub[r]));
    ASSERT_OK(sbnGroupEnd());
    for (int level = 0; level < 2; level++) {
      static bufs_t b[2];
      job_t jobs[2];
      memset(jobs, 0, sizeof jobs);
      for (int r = 0; r < 2; r++) {
        bufs_init(&b[r], 2, 3, 2, 460 + (uint64_t)r);
        jobs[r].kind = JOB_FWD;
        jobs[r].comm = level ? sub[r] : comms[r];
        jobs[r].b = &b[r];
      }
      jobs[1].start_ms = 100;
      ASSERT_TRUE(run_jobs(jobs, 2));
      for (int r = 0; r < 2; r++) ASSERT_OK(jobs[r].r);
      ASSERT_MEMEQ(b[0].sm, b[1].sm, 3 * sizeof(float));
    }
    for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(sub[r]));
    for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
  }
}

static void test_split_threads(void) {
  sbnConfig_t cfg = config_ms(20000);
  sbnComm_t parent[4], sub[4];
  ASSERT_OK(sbnCommInitCpu(parent, 4, &cfg));
  job_t jobs[4];
  for (int r = 0; r < 4; r++) {
    sub[r] = SENTINEL_COMM;
    memset(&jobs[r], 0, sizeof jobs[r]);
    jobs[r].kind = JOB_SPLIT; jobs[r].comm = parent[r];
    jobs[r].color = kColor[r]; jobs[r].key = kKey[r]; jobs[r].newcomm = &sub[r];
  }
  ASSERT_TRUE(run_jobs(jobs, 4));
  for (int r = 0; r < 4; r++) ASSERT_RES(jobs[r].r, sbnSuccess);
  check_sub_ranks(sub);
  if (sbn_test_cur_failed_) return; /* do not run ops on bad handles */
  check_sub_forward(sub);
  parent_still_works(parent);
  /* the parent first, then the children (the sub-teams do not depend on it) */
  for (int r = 0; r < 4; r++) ASSERT_OK(sbnCommDestroy(parent[r]));
  for (int r = 0; r < 4; r++) ASSERT_OK(sbnCommDestroy(sub[r]));
}

/* A thread-per-rank split whose rank 2 never calls: ranks 0 and 1 return sbnTimeout after
   the team's timeout, nothing written, and the message names the rank that did not call
   (it said only "while waiting for the team's other ranks"). */
static void test_split_timeout_names_rank(void) {
  const int64_t timeout = 300;
  sbnConfig_t cfg = config_ms(timeout);
  sbnComm_t parent[3], sub[3] = {SENTINEL_COMM, SENTINEL_COMM, SENTINEL_COMM};
  ASSERT_OK(sbnCommInitCpu(parent, 3, &cfg));
  job_t jobs[2];
  split_jobs(jobs, 2, parent, sub);
  ASSERT_TRUE(run_jobs(jobs, 2));
  for (int r = 0; r < 2; r++) {
    char want[80];
    snprintf(want, sizeof want, "rank %d waited for rank 2, which had not called sbnCommSplit", r);
    fprintf(stderr, "  rank %d: %s after %.1f ms: %s\n", r, sbnGetResultName(jobs[r].r),
            jobs[r].t1 - jobs[r].t0, sbnGetLastError(parent[r]));
    ASSERT_RES(jobs[r].r, sbnTimeout);
    EXPECT_TRUE(strstr(sbnGetLastError(parent[r]), want) != NULL);
    EXPECT_TRUE(sub[r] == SENTINEL_COMM);
  }
  for (int r = 0; r < 3; r++) ASSERT_OK(sbnCommDestroy(parent[r]));
}

/* A thread-per-rank split that cannot be made (the library's calloc fails in both ranks'
   threads, so in the one that arrives last and makes it): every rank returns
   sbnSystemError with the cause, "out of host memory (split)" (the ranks but the one that
   made it said "sbnSystemError while waiting for the team's other ranks", and that one
   too: the cause stayed in its thread's slot, which the library's own message replaced);
   nothing written; the team is whole: the same split then succeeds. */
static void test_split_failure_detail(void) {
  sbnConfig_t cfg = config_ms(20000);
  sbnComm_t parent[2], sub[2] = {SENTINEL_COMM, SENTINEL_COMM};
  ASSERT_OK(sbnCommInitCpu(parent, 2, &cfg));
  job_t jobs[2];
  split_jobs(jobs, 2, parent, sub);
  for (int r = 0; r < 2; r++) jobs[r].fail_calloc = 1;
  ASSERT_TRUE(run_jobs(jobs, 2));
  for (int r = 0; r < 2; r++) {
    const char* e = sbnGetLastError(parent[r]);
    fprintf(stderr, "  rank %d: %s: %s\n", r, sbnGetResultName(jobs[r].r), e);
    ASSERT_RES(jobs[r].r, sbnSystemError);
    EXPECT_TRUE(strstr(e, "sbnCommSplit: no split was made: ") != NULL);
    EXPECT_TRUE(strstr(e, "out of host memory (split)") != NULL);
    EXPECT_TRUE(sub[r] == SENTINEL_COMM);
  }
  split_jobs(jobs, 2, parent, sub);
  ASSERT_TRUE(run_jobs(jobs, 2));
  for (int r = 0; r < 2; r++) ASSERT_RES(jobs[r].r, sbnSuccess);
  if (sbn_test_cur_failed_) return;
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(sub[r]));
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(parent[r]));
}

/* A GPU team wider than SBN_MAX_GPU_TEAM_RANKS (syncbn.h: sbnUnsupported) is refused
   before the team is made, in every build: with every calloc of this thread failing, the
   refusal is the same, naming the width, and comms[0] is not written. The team's per-rank
   allocations came first (sbnSystemError here; for 10^7 ranks seconds and GBs before the
   refusal). */
static void test_gpu_team_too_wide_refused_first(void) {
  static const int devs[SBN_MAX_GPU_TEAM_RANKS + 1]; /* device 0 for every rank */
  const int widths[2] = {SBN_MAX_GPU_TEAM_RANKS + 1, INT_MAX};
  char want[96];
  for (int k = 0; k < 2; k++) {
    sbnComm_t comms[1] = {SENTINEL_COMM};
    snprintf(want, sizeof want, "GPU teams have at most %d ranks, got %d", SBN_MAX_GPU_TEAM_RANKS,
             widths[k]);
    fail_calloc_here = 1;
    const sbnResult_t rv = sbnCommInitVirtual(comms, widths[k], 0, NULL);
    fail_calloc_here = 0;
    ASSERT_RES(rv, sbnUnsupported);
    EXPECT_TRUE(strstr(sbnGetLastError(NULL), want) != NULL);
    if (k == 0) { /* (a devlist as long as the team) */
      fail_calloc_here = 1;
      const sbnResult_t ra = sbnCommInitAll(comms, widths[k], devs, NULL);
      fail_calloc_here = 0;
      ASSERT_RES(ra, sbnUnsupported);
      EXPECT_TRUE(strstr(sbnGetLastError(NULL), want) != NULL);
    }
    ASSERT_TRUE(comms[0] == SENTINEL_COMM);
  }
}

/* A thread-per-rank split whose last rank calls in time but reaches the rendezvous after
   the first rank's wait ran out (stalled before the split's lock, its first: the wrapped
   pthread_mutex_lock): neither rank gets a comm, and no comm is made. The last rank made
   the split without looking at the abort: it returned sbnSuccess and a comm of a sub-team
   whose other rank's comm nobody held, while rank 0 returned sbnTimeout. The stall must
   begin before rank 0's wait runs out (else rank 1's check of the team refuses it first,
   which tests nothing here) and rank 0 must time out: a try where the machine's load moved
   either is made again, and a test of three such tries fails. (Not reached by it: the
   abort's compare-and-swap made outside split_mu, a window of a few instructions.) */
static void test_split_late_rank(void) {
  const int timeout = 400;
  for (int attempt = 0; attempt < 3; attempt++) {
    sbnConfig_t cfg = config_ms(timeout);
    sbnComm_t parent[2], sub[2] = {SENTINEL_COMM, SENTINEL_COMM};
    ASSERT_OK(sbnCommInitCpu(parent, 2, &cfg));
    job_t jobs[2];
    split_jobs(jobs, 2, parent, sub);
    jobs[1].start_ms = 50;        /* in time: the team is not aborted yet */
    jobs[1].lock_delay_ms = 1000; /* at the rendezvous after rank 0's 400 ms ran out */
    atomic_store(&stall_began_ms, 0.0);
    ASSERT_TRUE(run_jobs(jobs, 2));
    for (int r = 0; r < 2; r++)
      fprintf(stderr, "  rank %d: %s after %.1f ms: %s\n", r, sbnGetResultName(jobs[r].r),
              jobs[r].t1 - jobs[r].t0, sbnGetLastError(parent[r]));
    const double stall = atomic_load(&stall_began_ms);
    const int landed = jobs[0].r == sbnTimeout && stall > 0.0 && stall < jobs[0].t0 + timeout;
    if (landed) {
      EXPECT_TRUE(strstr(sbnGetLastError(parent[0]), "rank 0 waited for rank 1") != NULL);
      ASSERT_RES(jobs[1].r, sbnTimeout);
      EXPECT_TRUE(strstr(sbnGetLastError(parent[1]), "called after the team was aborted") != NULL);
      for (int r = 0; r < 2; r++) EXPECT_TRUE(sub[r] == SENTINEL_COMM);
    } else {
      fprintf(stderr, "  try %d: the stall did not land (rank 0 %s, stall at %+.1f ms of its deadline)\n",
              attempt + 1, sbnGetResultName(jobs[0].r), stall - (jobs[0].t0 + timeout));
    }
    for (int r = 0; r < 2; r++)
      if (sub[r] != SENTINEL_COMM && sub[r] != NULL) sbnCommDestroy(sub[r]);
    for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(parent[r]));
    if (landed) return;
  }
  SBN_FAIL_("rank 1's stall never began before rank 0's wait ran out in 3 tries: the race was not set up");
}

/* The split's wait is measured on the monotonic clock, as the ops' waits are: with the
   wall clock an hour behind (a step of the system clock while ranks meet), a split whose
   last rank comes 200 ms late succeeds. A deadline taken on CLOCK_REALTIME lay in the
   past of the wait's clock then, and both early ranks returned sbnTimeout at once. */
static void test_split_wait_monotonic(void) {
  sbnConfig_t cfg = config_ms(20000);
  sbnComm_t parent[3], sub[3];
  ASSERT_OK(sbnCommInitCpu(parent, 3, &cfg));
  job_t jobs[3];
  for (int r = 0; r < 3; r++) sub[r] = SENTINEL_COMM;
  split_jobs(jobs, 3, parent, sub);
  atomic_store(&wall_shift_s, -3600L);
  pthread_t th[2];
  for (int r = 0; r < 2; r++) ASSERT_TRUE(pthread_create(&th[r], NULL, job_main, &jobs[r]) == 0);
  sleep_ms(200);
  job_main(&jobs[2]);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  atomic_store(&wall_shift_s, 0L);
  for (int r = 0; r < 3; r++) {
    fprintf(stderr, "  rank %d: %s after %.1f ms\n", r, sbnGetResultName(jobs[r].r), jobs[r].t1 - jobs[r].t0);
    ASSERT_RES(jobs[r].r, sbnSuccess);
    ASSERT_TRUE(sub[r] != SENTINEL_COMM && sub[r] != NULL);
  }
  for (int r = 0; r < 3; r++) ASSERT_OK(sbnCommDestroy(sub[r]));
  for (int r = 0; r < 3; r++) ASSERT_OK(sbnCommDestroy(parent[r]));
}

/* SBN_SPLIT_NOCOLOR gives NULL; equal keys order by parent rank. */
static void test_split_nocolor(void) {
  sbnConfig_t cfg = config_ms(20000);
  sbnComm_t parent[4], sub[4];
  ASSERT_OK(sbnCommInitCpu(parent, 4, &cfg));
  const int color[4] = {0, SBN_SPLIT_NOCOLOR, 0, SBN_SPLIT_NOCOLOR};
  for (int r = 0; r < 4; r++) sub[r] = SENTINEL_COMM;
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 4; r++) ASSERT_OK(sbnCommSplit(parent[r], color[r], 0, &sub[r]));
  ASSERT_OK(sbnGroupEnd());
  ASSERT_TRUE(sub[1] == NULL && sub[3] == NULL);
  for (int r = 0; r <= 2; r += 2) {
    ASSERT_TRUE(sub[r] != NULL && sub[r] != SENTINEL_COMM);
    int rank = -1, count = -1;
    ASSERT_OK(sbnCommRank(sub[r], &rank));
    ASSERT_OK(sbnCommCount(sub[r], &count));
    ASSERT_EQ_INT(rank, r / 2);
    ASSERT_EQ_INT(count, 2);
  }
  /* the sub-team of 2 works on its own, thread per rank */
  static bufs_t b[2];
  job_t jobs[2];
  for (int k = 0; k < 2; k++) {
    bufs_init(&b[k], 2, 3, 3, 500 + (uint64_t)k);
    memset(&jobs[k], 0, sizeof jobs[k]);
    jobs[k].kind = JOB_FWD; jobs[k].comm = sub[2 * k]; jobs[k].b = &b[k];
  }
  ASSERT_TRUE(run_jobs(jobs, 2));
  ASSERT_OK(jobs[0].r);
  ASSERT_OK(jobs[1].r);
  ASSERT_MEMEQ(b[0].si, b[1].si, 3 * sizeof(float));
  for (int r = 0; r < 4; r++) ASSERT_OK(sbnCommDestroy(sub[r])); /* NULL accepted */
  for (int r = 0; r < 4; r++) ASSERT_OK(sbnCommDestroy(parent[r]));
}

/* ---- several ops per rank in one group ---------------------------------------------------- */
/* forward then backward queued per rank in ONE group (the backward reads the forward's
   save_mean/save_invstd, so order matters) == forward group, then backward group. */
static void test_multi_op_group(void) {
  sbnConfig_t cfg = config_ms(20000);
  sbnComm_t comms[2];
  ASSERT_OK(sbnCommInitCpu(comms, 2, &cfg));
  static bufs_t one[2], two[2];
  for (int r = 0; r < 2; r++) bufs_init(&one[r], 3 - r, 4, 5, 600 + (uint64_t)r);
  memcpy(two, one, sizeof two);

  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) {
    ASSERT_OK(fwd(comms[r], &one[r]));
    ASSERT_OK(bwd(comms[r], &one[r]));
    ASSERT_OK(fwd(comms[r], &one[r])); /* and a second forward: nbt 2 */
  }
  ASSERT_OK(sbnGroupEnd());

  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) ASSERT_OK(fwd(comms[r], &two[r]));
  ASSERT_OK(sbnGroupEnd());
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) ASSERT_OK(bwd(comms[r], &two[r]));
  ASSERT_OK(sbnGroupEnd());
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) ASSERT_OK(fwd(comms[r], &two[r]));
  ASSERT_OK(sbnGroupEnd());

  for (int r = 0; r < 2; r++) {
    ASSERT_EQ_INT(one[r].nbt, 2);
    ASSERT_MEMEQ(&one[r], &two[r], sizeof one[r]);
  }
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* A group whose queue cannot grow (realloc fails at the 17th op: a queue starts with room
   for 16): that call returns sbnSystemError, and sbnGroupEnd runs none of the 16 queued
   before it (no output touched), returns sbnInvalidUsage with the call's own detail; the
   team is whole after it. */
static void test_group_queue_out_of_memory(void) {
  sbnComm_t comms[2];
  static bufs_t b[2], before[2];
  ASSERT_TRUE(team_bufs(comms, 2, 20000, b, before, 2, 3, 4, 700));

  ASSERT_OK(sbnGroupStart());
  for (int k = 0; k < 8; k++)
    for (int r = 0; r < 2; r++) ASSERT_OK(fwd(comms[r], &b[r])); /* 16 ops: the queue full */
  atomic_store(&fail_realloc, 1);
  const sbnResult_t r17 = fwd(comms[0], &b[0]);
  atomic_store(&fail_realloc, 0);
  ASSERT_RES(r17, sbnSystemError);
  EXPECT_TRUE(strstr(sbnGetLastError(comms[0]), "out of host memory (group queue)") != NULL);
  (void)fwd(comms[1], &b[1]); /* the round's other half: queued or refused, nothing runs */
  ASSERT_RES(sbnGroupEnd(), sbnInvalidUsage);
  const char* e = sbnGetLastError(NULL);
  EXPECT_TRUE(strstr(e, "sbnSystemError") != NULL);
  EXPECT_TRUE(strstr(e, "out of host memory (group queue)") != NULL);
  EXPECT_TRUE(strstr(e, "nothing was run") != NULL);
  /* and on the comms queued in the group: rank 1's, whose calls all succeeded, had "" */
  EXPECT_TRUE(strstr(sbnGetLastError(comms[1]), "sbnGroupEnd: a call in this group failed") != NULL);
  EXPECT_TRUE(strstr(sbnGetLastError(comms[1]), "out of host memory (group queue)") != NULL);
  for (int r = 0; r < 2; r++) ASSERT_MEMEQ(&b[r], &before[r], sizeof b[r]);

  /* sbnGroupEnd's own allocation fails (the calling thread's calloc): nothing is run, the
     detail on the thread and on both queued comms */
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) ASSERT_OK(fwd(comms[r], &b[r]));
  fail_calloc_here = 1;
  const sbnResult_t end = sbnGroupEnd();
  fail_calloc_here = 0;
  ASSERT_RES(end, sbnSystemError);
  for (int r = 0; r < 2; r++)
    EXPECT_TRUE(strstr(sbnGetLastError(comms[r]), "out of host memory (group)") != NULL);
  for (int r = 0; r < 2; r++) ASSERT_MEMEQ(&b[r], &before[r], sizeof b[r]);

  ASSERT_OK(sbnGroupStart()); /* the comms were given back: a normal round runs */
  for (int r = 0; r < 2; r++) ASSERT_OK(fwd(comms[r], &b[r]));
  ASSERT_OK(sbnGroupEnd());
  for (int r = 0; r < 2; r++) ASSERT_EQ_INT(b[r].nbt, 1);
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* A group whose op fails when it runs (the team's batch has one element per channel: known
   only after the exchange) stops each rank's queue there: the backward queued after it,
   which would read the forward's unwritten save_mean and save_invstd, does not run (it
   wrote dx of ~1e13 from the poison), and sbnGroupEnd gives the forward's detail. */
static void test_group_stops_at_failure(void) {
  sbnConfig_t cfg = config_ms(20000);
  sbnComm_t comms[2];
  ASSERT_OK(sbnCommInitCpu(comms, 2, &cfg));
  static bufs_t b[2], before[2];
  bufs_init(&b[0], 1, 3, 1, 800); /* M = 1 + 0 */
  bufs_init(&b[1], 0, 3, 1, 801);
  memcpy(before, b, sizeof before);
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) {
    ASSERT_OK(fwd(comms[r], &b[r]));
    ASSERT_OK(bwd(comms[r], &b[r]));
  }
  ASSERT_RES(sbnGroupEnd(), sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(NULL), "Expected more than 1 value per channel") != NULL);
  for (int r = 0; r < 2; r++) {
    ASSERT_MEMEQ(b[r].dx, before[r].dx, sizeof b[r].dx);
    ASSERT_MEMEQ(b[r].dw, before[r].dw, sizeof b[r].dw);
    ASSERT_MEMEQ(b[r].db, before[r].db, sizeof b[r].db);
    ASSERT_MEMEQ(&b[r], &before[r], sizeof b[r]); /* and the forward wrote nothing */
  }
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* Two unrelated teams (2 and 3 ranks) in one group, calls interleaved == each team in its
   own group. */
static void test_two_teams_one_group(void) {
  sbnConfig_t cfg = config_ms(20000);
  sbnComm_t ta[2], tb[3];
  ASSERT_OK(sbnCommInitCpu(ta, 2, &cfg));
  ASSERT_OK(sbnCommInitCpu(tb, 3, &cfg));
  static bufs_t a1[2], b1[3], a2[2], b2[3];
  for (int r = 0; r < 2; r++) bufs_init(&a1[r], 2 + r, 3, 4, 700 + (uint64_t)r);
  for (int r = 0; r < 3; r++) bufs_init(&b1[r], 1 + r, 6, 2, 710 + (uint64_t)r);
  memcpy(a2, a1, sizeof a2);
  memcpy(b2, b1, sizeof b2);

  ASSERT_OK(sbnGroupStart());
  ASSERT_OK(fwd(tb[2], &b1[2]));
  ASSERT_OK(fwd(ta[0], &a1[0]));
  ASSERT_OK(fwd(tb[0], &b1[0]));
  ASSERT_OK(bwd(tb[2], &b1[2]));
  ASSERT_OK(fwd(ta[1], &a1[1]));
  ASSERT_OK(fwd(tb[1], &b1[1]));
  ASSERT_OK(bwd(tb[0], &b1[0]));
  ASSERT_OK(bwd(tb[1], &b1[1]));
  ASSERT_OK(sbnGroupEnd());

  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) ASSERT_OK(fwd(ta[r], &a2[r]));
  ASSERT_OK(sbnGroupEnd());
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 3; r++) ASSERT_OK(fwd(tb[r], &b2[r]));
  ASSERT_OK(sbnGroupEnd());
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 3; r++) ASSERT_OK(bwd(tb[r], &b2[r]));
  ASSERT_OK(sbnGroupEnd());

  ASSERT_MEMEQ(a1, a2, sizeof a1);
  ASSERT_MEMEQ(b1, b2, sizeof b1);
  /* and the two teams really normalized separately */
  EXPECT_TRUE(memcmp(a1[0].sm, b1[0].sm, 3 * sizeof(float)) != 0);
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(ta[r]));
  for (int r = 0; r < 3; r++) ASSERT_OK(sbnCommDestroy(tb[r]));
}

/* Two teams in one group, the second's op reading what the first's op queued before it
   writes: team A's forward (2 ranks, 512 Ki values each: a few ms) writes y, which team
   B's forward (2 ranks) takes as its x, B's rank 0 queued between A's two ranks. The
   group runs the rounds in queue order, so B reads A's y, as when each runs in a group of
   its own: B's y, statistics and running statistics bitwise equal (ops run at the same
   time read A's y before it is written: the poison, or a part of it). */
#define ORDER_C 4
#define ORDER_SP 65536
#define ORDER_E (2 * ORDER_C * ORDER_SP)
static void test_group_order_across_teams(void) {
  sbnConfig_t cfg = config_ms(20000);
  sbnComm_t ta[2], tb[2];
  ASSERT_OK(sbnCommInitCpu(ta, 2, &cfg));
  ASSERT_OK(sbnCommInitCpu(tb, 2, &cfg));
  const sbnTensorDesc_t da = {sbnFloat32, sbnLayoutNCHW, 2, ORDER_C, ORDER_SP};
  float* xa[2];
  float* ya[2];
  for (int r = 0; r < 2; r++) {
    xa[r] = malloc(ORDER_E * sizeof(float));
    ya[r] = malloc(ORDER_E * sizeof(float));
    ASSERT_TRUE(xa[r] != NULL && ya[r] != NULL);
    sbn_rng_t g = {900 + (uint64_t)r};
    for (int i = 0; i < ORDER_E; i++) xa[r][i] = (float)(3.0 + sbn_rng_normal(&g));
  }
  float wa[ORDER_C], ba[ORDER_C], rma[2][ORDER_C], rva[2][ORDER_C], sma[2][ORDER_C], sia[2][ORDER_C];
  int64_t nbta[2];
  static bufs_t b1[2], b2[2]; /* B: n 1, C 4, spatial 16 (the first 64 values of A's y) */
  for (int round = 0; round < 2; round++) {
    for (int c = 0; c < ORDER_C; c++) {
      wa[c] = 1.0f + 0.5f * (float)c;
      ba[c] = 0.25f * (float)c;
    }
    for (int r = 0; r < 2; r++) {
      memset(ya[r], POISON, ORDER_E * sizeof(float));
      for (int c = 0; c < ORDER_C; c++) rma[r][c] = 0.0f, rva[r][c] = 1.0f;
      nbta[r] = 0;
      bufs_init(round ? &b2[r] : &b1[r], 1, ORDER_C, 16, 910 + (uint64_t)r);
    }
    bufs_t* b = round ? b2 : b1;
    ASSERT_OK(sbnGroupStart());
    for (int r = 0; r < 2; r++) {
      ASSERT_OK(sbnForwardTrain(ta[r], &da, xa[r], ya[r], wa, ba, rma[r], rva[r], &nbta[r],
                                sma[r], sia[r], NULL, NULL));
      if (round == 0) /* B's rank r queued right after A's: one group */
        ASSERT_OK(sbnForwardTrain(tb[r], &b[r].d, ya[r], b[r].y, b[r].w, b[r].b, b[r].rm,
                                  b[r].rv, &b[r].nbt, b[r].sm, b[r].si, NULL, NULL));
    }
    ASSERT_OK(sbnGroupEnd());
    if (round == 1) { /* B in a group of its own, after A's */
      ASSERT_OK(sbnGroupStart());
      for (int r = 0; r < 2; r++)
        ASSERT_OK(sbnForwardTrain(tb[r], &b[r].d, ya[r], b[r].y, b[r].w, b[r].b, b[r].rm,
                                  b[r].rv, &b[r].nbt, b[r].sm, b[r].si, NULL, NULL));
      ASSERT_OK(sbnGroupEnd());
    }
  }
  for (int r = 0; r < 2; r++) {
    ASSERT_EQ_INT(b1[r].nbt, 1);
    ASSERT_MEMEQ(b1[r].sm, b2[r].sm, ORDER_C * sizeof(float));
    ASSERT_MEMEQ(b1[r].rv, b2[r].rv, ORDER_C * sizeof(float));
    ASSERT_MEMEQ(&b1[r], &b2[r], sizeof b1[r]);
  }
  for (int r = 0; r < 2; r++) {
    free(xa[r]);
    free(ya[r]);
  }
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(ta[r]));
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(tb[r]));
}

/* A group whose op fails when it runs (team A's batch has one element per channel) runs no
   op queued after it, of its team or another: team B's forward, queued after A's on each
   rank, writes nothing, and sbnGroupEnd gives A's detail. B's team is whole after it. */
static void test_group_stops_across_teams(void) {
  sbnConfig_t cfg = config_ms(20000);
  sbnComm_t ta[2], tb[2];
  ASSERT_OK(sbnCommInitCpu(ta, 2, &cfg));
  ASSERT_OK(sbnCommInitCpu(tb, 2, &cfg));
  static bufs_t a[2], b[2], before[2];
  bufs_init(&a[0], 1, 3, 1, 920); /* M = 1 + 0 */
  bufs_init(&a[1], 0, 3, 1, 921);
  for (int r = 0; r < 2; r++) bufs_init(&b[r], 2, 3, 4, 930 + (uint64_t)r);
  memcpy(before, b, sizeof before);
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) {
    ASSERT_OK(fwd(ta[r], &a[r]));
    ASSERT_OK(fwd(tb[r], &b[r]));
  }
  ASSERT_RES(sbnGroupEnd(), sbnInvalidArgument);
  EXPECT_TRUE(strstr(sbnGetLastError(NULL), "Expected more than 1 value per channel") != NULL);
  for (int r = 0; r < 2; r++) ASSERT_MEMEQ(&b[r], &before[r], sizeof b[r]);
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) ASSERT_OK(fwd(tb[r], &b[r]));
  ASSERT_OK(sbnGroupEnd());
  for (int r = 0; r < 2; r++) ASSERT_EQ_INT(b[r].nbt, 1);
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(ta[r]));
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(tb[r]));
}

/* ---- op mismatch, thread per rank ----------------------------------------------------------- */
/* Whether comm's last error contains `what` (printed when it does not). */
static int error_names(sbnComm_t comm, const char* what) {
  const char* e = sbnGetLastError(comm);
  if (strstr(e, what) != NULL) return 1;
  fprintf(stderr, "  last error \"%s\" does not name \"%s\"\n", e, what);
  return 0;
}

static void test_mismatch_threads(void) {
  sbnComm_t comms[2];
  static bufs_t b[2], snap[2];
  ASSERT_TRUE(team_bufs(comms, 2, 20000, b, snap, 2, 4, 2, 800));
  job_t jobs[2];
  memset(jobs, 0, sizeof jobs);
  jobs[0].kind = JOB_FWD; jobs[0].comm = comms[0]; jobs[0].b = &b[0];
  jobs[1].kind = JOB_BWD; jobs[1].comm = comms[1]; jobs[1].b = &b[1];
  ASSERT_TRUE(run_jobs(jobs, 2));
  for (int r = 0; r < 2; r++) {
    ASSERT_RES(jobs[r].r, sbnInvalidUsage);
    EXPECT_TRUE(last_error_set(comms[r]));
    /* the message names both ops: kind, dtype, layout and C */
    EXPECT_TRUE(error_names(comms[r], "forward fp32 NCHW C=4"));
    EXPECT_TRUE(error_names(comms[r], "backward fp32 NCHW C=4"));
  }
  ASSERT_MEMEQ(b, snap, sizeof b);
  /* different C on the two ranks */
  b[1].d.c = 3;
  memcpy(snap, b, sizeof snap);
  jobs[1].kind = JOB_FWD;
  ASSERT_TRUE(run_jobs(jobs, 2));
  for (int r = 0; r < 2; r++) {
    ASSERT_RES(jobs[r].r, sbnInvalidUsage);
    EXPECT_TRUE(error_names(comms[r], "forward fp32 NCHW C=4"));
    EXPECT_TRUE(error_names(comms[r], "forward fp32 NCHW C=3"));
  }
  ASSERT_MEMEQ(b, snap, sizeof b);
  /* still usable */
  b[1].d.c = 4;
  ASSERT_TRUE(run_jobs(jobs, 2));
  for (int r = 0; r < 2; r++) ASSERT_RES(jobs[r].r, sbnSuccess);
  ASSERT_MEMEQ(b[0].sm, b[1].sm, 4 * sizeof(float));
  sbnResult_t async = sbnTimeout;
  ASSERT_OK(sbnCommGetAsyncError(comms[0], &async));
  ASSERT_RES(async, sbnSuccess);
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* ---- a call refused on some ranks only -------------------------------------------------- */
/* The statistics of a forward on both ranks, against the double-precision mean and
   biased variance of the two ranks' x (fp32 NCHW). */
static void expect_team_stats(const bufs_t* b, int W) {
  const int64_t c = b[0].d.c;
  for (int64_t ch = 0; ch < c; ch++) {
    double s = 0.0, s2 = 0.0, m = 0.0;
    for (int r = 0; r < W; r++)
      for (int64_t i = 0; i < b[r].d.n; i++)
        for (int64_t k = 0; k < b[r].d.spatial; k++) {
          const double v = b[r].x[(i * c + ch) * b[r].d.spatial + k];
          s += v, s2 += v * v, m += 1.0;
        }
    const double mean = s / m, var = s2 / m - mean * mean;
    for (int r = 0; r < W; r++) {
      ASSERT_CLOSE(b[r].sm[ch], mean, STAT_ATOL, STAT_RTOL);
      const double invstd = 1.0 / sqrt(var + 1e-5);
      ASSERT_CLOSE(b[r].si[ch], invstd, STAT_ATOL, STAT_RTOL);
    }
  }
}

/* Every op call a rank makes counts, refused at its arguments or not (its call number,
   in the op's signature), but for a group of a team whose ranks all live here, whose
   queued ops count when it runs. So:
   - a group with one rank's call refused (retried or not) runs nothing and counts
     nothing (mutants that count its calls at the call, or its queued ops, fail the next
     group: out of step);
   - a refusal every rank makes alike, thread per rank, keeps the team in step: the next
     forward runs, with the team's statistics;
   - a forward refused on rank 1 only, while rank 0 waits in its forward: rank 1's next
     forward, the same op but one call later, does not pair with rank 0's (which would
     succeed on both with rank 1's later data); both fail with sbnInvalidUsage naming the
     ranks out of step, nothing written, and so does every later op. */
static void test_refused_on_some_ranks(void) {
  sbnComm_t comms[2];
  static bufs_t b[2], snap[2];
  ASSERT_TRUE(team_bufs(comms, 2, BEYOND_CTEST_TIMEOUT_MS, b, snap, 2, 4, 3, 900));
  /* a group with one rank's call refused runs nothing, retried or not (call numbers 0
     and 0 again) */
  for (int retry = 0; retry < 2; retry++) {
    ASSERT_OK(sbnGroupStart());
    ASSERT_OK(fwd(comms[0], &b[0]));
    ASSERT_RES(fwd_refused(comms[1], &b[1]), sbnInvalidArgument);
    if (retry) ASSERT_OK(fwd(comms[1], &b[1])); /* which does not rescue the group */
    ASSERT_RES(sbnGroupEnd(), sbnInvalidUsage);
    ASSERT_MEMEQ(b, snap, sizeof b);
  }
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) ASSERT_OK(fwd(comms[r], &b[r]));
  ASSERT_OK(sbnGroupEnd());
  expect_team_stats(b, 2);
  /* thread per rank: both refused alike, then a forward */
  job_t jobs[2];
  memset(jobs, 0, sizeof jobs);
  for (int r = 0; r < 2; r++) {
    jobs[r].kind = JOB_FWD; jobs[r].comm = comms[r]; jobs[r].b = &b[r]; jobs[r].refused_first = 1;
  }
  ASSERT_TRUE(run_jobs(jobs, 2));
  for (int r = 0; r < 2; r++) ASSERT_RES(jobs[r].r_refused, sbnInvalidArgument);
  for (int r = 0; r < 2; r++) ASSERT_OK(jobs[r].r);
  for (int r = 0; r < 2; r++) ASSERT_EQ_INT(b[r].nbt, 2);
  expect_team_stats(b, 2);
  /* refused on rank 1 only: rank 0's forward (its call 3) meets rank 1's next (its 4) */
  memcpy(snap, b, sizeof snap);
  jobs[0].refused_first = 0;
  ASSERT_TRUE(run_jobs(jobs, 2));
  ASSERT_RES(jobs[1].r_refused, sbnInvalidArgument);
  for (int r = 0; r < 2; r++) {
    ASSERT_RES(jobs[r].r, sbnInvalidUsage);
    EXPECT_TRUE(error_names(comms[r], "ranks out of step: rank 0 is at its call 3 and rank 1 at its call 4 (mod 7)"));
    EXPECT_TRUE(error_names(comms[r], "forward fp32 NCHW C=4"));
  }
  ASSERT_MEMEQ(b, snap, sizeof b);
  /* and every later op, which pairs one call apart too */
  jobs[1].refused_first = 0;
  for (int r = 0; r < 2; r++) jobs[r].kind = JOB_BWD;
  ASSERT_TRUE(run_jobs(jobs, 2));
  for (int r = 0; r < 2; r++) {
    ASSERT_RES(jobs[r].r, sbnInvalidUsage);
    EXPECT_TRUE(error_names(comms[r], "ranks out of step"));
  }
  ASSERT_MEMEQ(b, snap, sizeof b);
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* An empty rank cannot check the in-place backward's conditions (syncbn.h): with ReLU,
   rank 0 (n = 2) refuses its in-place backward (x NULL) while rank 1 (n = 0) takes it
   and waits; rank 0's next op, the x-based backward with ReLU (the same signature as
   rank 1's), meets it and fails on both ranks, out of step, nothing written (it paired
   before: success). Then sbnCommAbort ends the team, as the message says. */
typedef struct {
  sbnComm_t comm;
  bufs_t* b;
  int has_data;
  sbnResult_t refused, r;
} relu_bwd_job_t;
static void* relu_bwd_main(void* arg) {
  relu_bwd_job_t* j = (relu_bwd_job_t*)arg;
  bufs_t* b = j->b;
  sbnEpilogue_t e = SBN_EPILOGUE_INITIALIZER;
  e.activation = sbnActivationRelu;
  if (j->has_data) {
    j->refused = sbnBackwardEx(j->comm, &b->d, NULL, b->y, b->dy, b->dx, NULL, b->w, b->b, b->sm, b->si,
                               b->dw, b->db, NULL, &e, NULL);
    j->r = sbnBackwardEx(j->comm, &b->d, b->x, b->y, b->dy, b->dx, NULL, b->w, b->b, b->sm, b->si, b->dw,
                         b->db, NULL, &e, NULL);
  } else {
    j->r = sbnBackwardEx(j->comm, &b->d, NULL, NULL, NULL, NULL, NULL, b->w, b->b, b->sm, b->si, b->dw,
                         b->db, NULL, &e, NULL);
  }
  return NULL;
}
static void test_inplace_refused_beside_empty_rank(void) {
  sbnComm_t comms[2];
  static bufs_t b[2], snap[2];
  ASSERT_TRUE(team_bufs(comms, 2, BEYOND_CTEST_TIMEOUT_MS, b, NULL, 2, 4, 3, 950));
  b[1].d.n = 0;
  job_t jobs[2];
  memset(jobs, 0, sizeof jobs);
  for (int r = 0; r < 2; r++) jobs[r].kind = JOB_FWD, jobs[r].comm = comms[r], jobs[r].b = &b[r];
  ASSERT_TRUE(run_jobs(jobs, 2));
  for (int r = 0; r < 2; r++) ASSERT_OK(jobs[r].r);
  memcpy(snap, b, sizeof snap);
  relu_bwd_job_t rj[2];
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    rj[r] = (relu_bwd_job_t){comms[r], &b[r], r == 0, sbnSuccess, sbnSuccess};
    ASSERT_TRUE(pthread_create(&th[r], NULL, relu_bwd_main, &rj[r]) == 0);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  ASSERT_RES(rj[0].refused, sbnInvalidArgument);
  EXPECT_TRUE(error_names(comms[0], "ranks out of step: rank 0 is at its call 2 and rank 1 at its call 1"));
  for (int r = 0; r < 2; r++) {
    ASSERT_RES(rj[r].r, sbnInvalidUsage);
    EXPECT_TRUE(error_names(comms[r], "backward fp32"));
  }
  ASSERT_MEMEQ(b, snap, sizeof b);
  ASSERT_OK(sbnCommAbort(comms[0]));
  sbnResult_t async = sbnSuccess;
  ASSERT_OK(sbnCommGetAsyncError(comms[1], &async));
  ASSERT_RES(async, sbnAborted);
  ASSERT_RES(fwd(comms[1], &b[1]), sbnAborted);
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* ---- mismatches among several ranks, thread per rank, back to back -------------------- */
/* 4 ranks each run the same long sequence of forwards and backwards on its own thread;
   every 4th op one rank (1, 2 or 3 in turn) runs the other kind or another C. Every
   rank must see sbnInvalidUsage on exactly the planned ops and succeed on the others,
   with the same statistics on every rank. A rank that leaves a mismatched op before it
   saw every rank's record could run two ops ahead and overwrite records a slower peer
   has not read yet (the double buffering's condition): that peer then waits for an epoch
   that never comes (sbnTimeout) or reads another op's data (statistics differ). */
enum { PIPE_W = 4, PIPE_OPS = 1200 };
typedef struct {
  sbnComm_t comm;
  int rank;
  sbnResult_t res[PIPE_OPS];
  float sm[PIPE_OPS][MAXC];
} pipe_rank_t;
static int pipe_planned(int op, int rank, int* kind, int64_t* c) {
  *kind = op % 2;
  *c = 1 + op % MAXC;
  if (op % 4 != 3 || rank != 1 + (op / 4) % 3) return 0;
  if ((op / 12) % 2) *kind ^= 1;
  else *c = 1 + (*c % MAXC);
  return 1;
}
static void* pipe_main(void* arg) {
  pipe_rank_t* p = (pipe_rank_t*)arg;
  static _Thread_local bufs_t b;
  bufs_init(&b, 2, MAXC, 3, 900 + (uint64_t)p->rank);
  for (int op = 0; op < PIPE_OPS; op++) {
    int kind;
    int64_t c;
    (void)pipe_planned(op, p->rank, &kind, &c);
    b.d.c = c;
    p->res[op] = kind == 0 ? fwd(p->comm, &b) : bwd(p->comm, &b);
    memcpy(p->sm[op], b.sm, sizeof b.sm);
  }
  return NULL;
}
static void test_mismatch_pipeline(void) {
  /* a correct run never waits long; a peer stuck on an overwritten record fails here as
     sbnTimeout after 60 s */
  sbnConfig_t cfg = config_ms(60000);
  sbnComm_t comms[PIPE_W];
  ASSERT_OK(sbnCommInitCpu(comms, PIPE_W, &cfg));
  static pipe_rank_t ranks[PIPE_W];
  pthread_t th[PIPE_W];
  for (int r = 0; r < PIPE_W; r++) {
    ranks[r].comm = comms[r];
    ranks[r].rank = r;
    ASSERT_TRUE(pthread_create(&th[r], NULL, pipe_main, &ranks[r]) == 0);
  }
  for (int r = 0; r < PIPE_W; r++) pthread_join(th[r], NULL);
  int bad = 0;
  for (int op = 0; op < PIPE_OPS && bad < 5; op++) {
    int mismatched = 0, kind;
    int64_t c;
    for (int r = 0; r < PIPE_W; r++) mismatched |= pipe_planned(op, r, &kind, &c);
    (void)pipe_planned(op, 0, &kind, &c);
    for (int r = 0; r < PIPE_W; r++) {
      const sbnResult_t want = mismatched ? sbnInvalidUsage : sbnSuccess;
      if (ranks[r].res[op] != want) {
        SBN_FAIL_("op %d rank %d: %s, expected %s (%s)", op, r, sbnGetResultName(ranks[r].res[op]),
                  sbnGetResultName(want), sbnGetLastError(comms[r]));
        bad++;
      } else if (!mismatched && kind == 0 &&
                 memcmp(ranks[r].sm[op], ranks[0].sm[op], (size_t)c * sizeof(float)) != 0) {
        SBN_FAIL_("op %d: rank %d's save_mean differs from rank 0's", op, r);
        bad++;
      }
    }
  }
  for (int r = 0; r < PIPE_W; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* ---- a destroyed rank ------------------------------------------------------------------ */
/* sbnCommDestroy of one rank of a CPU team while others live aborts the team at once: the
   peers' waits and later calls return sbnAborted naming that rank, never the timeout. The
   team timeout here is short, so that a library that only timed out fails these tests in
   seconds (sbnTimeout, or a return later than DEPART_PROMPT_MS) instead of hanging. */
#define DEPART_TIMEOUT_MS 3000
#define DEPART_PROMPT_MS 1500.0

/* Whether comm's last error says that `rank` was destroyed. */
static int error_names_destroyed(sbnComm_t comm, int rank) {
  char what[64];
  snprintf(what, sizeof what, "rank %d of the team was destroyed", rank);
  return error_names(comm, what);
}

/* A team of 2 runs a forward together; rank 1 is destroyed; rank 0's next forward and
   backward return sbnAborted at once, name rank 1 and write nothing. */
static void test_destroyed_rank_later_ops(void) {
  sbnComm_t comms[2];
  static bufs_t b[2], snap[2];
  ASSERT_TRUE(team_bufs(comms, 2, DEPART_TIMEOUT_MS, b, NULL, 2, 3, 2, 1000));
  job_t jobs[2];
  memset(jobs, 0, sizeof jobs);
  for (int r = 0; r < 2; r++) {
    jobs[r].kind = JOB_FWD; jobs[r].comm = comms[r]; jobs[r].b = &b[r];
  }
  ASSERT_TRUE(run_jobs(jobs, 2));
  for (int r = 0; r < 2; r++) ASSERT_OK(jobs[r].r);
  memcpy(snap, b, sizeof snap);

  ASSERT_OK(sbnCommDestroy(comms[1]));
  double t0 = now_ms();
  sbnResult_t res = fwd(comms[0], &b[0]);
  double took = now_ms() - t0;
  fprintf(stderr, "  forward after rank 1's destroy: %s after %.1f ms: %s\n",
          sbnGetResultName(res), took, sbnGetLastError(comms[0]));
  ASSERT_RES(res, sbnAborted);
  EXPECT_TRUE(took < DEPART_PROMPT_MS);
  EXPECT_TRUE(error_names_destroyed(comms[0], 1));
  EXPECT_TRUE(error_names(comms[0], "sbnCommDestroy"));
  ASSERT_MEMEQ(&b[0], &snap[0], sizeof b[0]); /* a rejected call writes nothing */
  t0 = now_ms();
  ASSERT_RES(bwd(comms[0], &b[0]), sbnAborted);
  EXPECT_TRUE(now_ms() - t0 < DEPART_PROMPT_MS);
  EXPECT_TRUE(error_names_destroyed(comms[0], 1));
  ASSERT_MEMEQ(&b[0], &snap[0], sizeof b[0]);
  /* in a group: the call itself fails, naming rank 1, and the group runs nothing */
  ASSERT_OK(sbnGroupStart());
  EXPECT_TRUE(fwd(comms[0], &b[0]) == sbnAborted);
  sbnResult_t g = sbnGroupEnd();
  EXPECT_TRUE(g == sbnAborted || g == sbnInvalidUsage);
  EXPECT_TRUE(error_names_destroyed(comms[0], 1));
  ASSERT_MEMEQ(&b[0], &snap[0], sizeof b[0]);
  sbnResult_t async = sbnSuccess;
  ASSERT_OK(sbnCommGetAsyncError(comms[0], &async));
  ASSERT_RES(async, sbnAborted);
  ASSERT_OK(sbnCommAbort(comms[0])); /* already aborted: still fine */
  ASSERT_OK(sbnCommDestroy(comms[0]));
}

/* Rank 0 already waits in a forward (or a thread-per-rank sbnCommSplit) on its thread
   when the team's last rank is destroyed from this thread: rank 0 returns sbnAborted at
   once, naming the destroyed rank, also when the rank it waits for is another one (team
   of 3: rank 0 waits for rank 1, which never calls, and rank 2 is destroyed). */
static void test_destroyed_rank_wakes_waiter(void) {
  static const struct { int w, kind; } cases[] = {{2, JOB_FWD}, {3, JOB_FWD}, {2, JOB_SPLIT}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const int w = cases[i].w, gone = w - 1;
    sbnConfig_t cfg = config_ms(DEPART_TIMEOUT_MS);
    sbnComm_t comms[3], sub = SENTINEL_COMM;
    ASSERT_OK(sbnCommInitCpu(comms, w, &cfg));
    static bufs_t b, snap;
    bufs_init(&b, 2, 3, 2, 1100 + (uint64_t)i);
    memcpy(&snap, &b, sizeof snap);
    job_t job;
    memset(&job, 0, sizeof job);
    job.kind = cases[i].kind; job.comm = comms[0]; job.b = &b;
    job.color = 0; job.key = 0; job.newcomm = &sub;
    sbnResult_t dr;
    double late;
    act_on_waiter(&job, sbnCommDestroy, comms[gone], &dr, &late);
    ASSERT_OK(dr);
    fprintf(stderr, "  %s, team of %d, rank %d destroyed: rank 0 returned %s %.1f ms later: %s\n",
            job.kind == JOB_FWD ? "forward" : "split", w, gone, sbnGetResultName(job.r), late,
            sbnGetLastError(comms[0]));
    ASSERT_RES(job.r, sbnAborted);
    EXPECT_TRUE(late < DEPART_PROMPT_MS);
    EXPECT_TRUE(error_names_destroyed(comms[0], gone));
    ASSERT_MEMEQ(&b, &snap, sizeof b);
    ASSERT_TRUE(sub == SENTINEL_COMM);
    for (int r = 0; r < gone; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
  }
}

/* The normal teardown: every rank runs its ops, then is destroyed. (1) Each rank's thread
   destroys its own comm right after its last op, while slower peers may still be
   finishing that op (they must succeed: the destroyed rank's records of it are there);
   (2) ops in a group, then the comms destroyed one after another from this thread. No
   error; the sanitizer presets find any leak or race. */
typedef struct {
  sbnComm_t comm;
  bufs_t* b;
  sbnResult_t r[2], d;
} own_teardown_t;
static void* own_teardown_main(void* arg) {
  own_teardown_t* a = (own_teardown_t*)arg;
  a->r[0] = fwd(a->comm, a->b);
  a->r[1] = bwd(a->comm, a->b);
  a->d = sbnCommDestroy(a->comm);
  return NULL;
}
static void test_destroy_after_last_op(void) {
  enum { W = 3, ROUNDS = 25 };
  sbnConfig_t cfg = config_ms(20000);
  static bufs_t b[W];
  for (int round = 0; round < ROUNDS; round++) {
    sbnComm_t comms[W];
    ASSERT_OK(sbnCommInitCpu(comms, W, &cfg));
    own_teardown_t a[W];
    pthread_t th[W];
    for (int r = 0; r < W; r++) {
      bufs_init(&b[r], 1 + r, 4, 3, 1200 + (uint64_t)r);
      a[r].comm = comms[r];
      a[r].b = &b[r];
      ASSERT_TRUE(pthread_create(&th[r], NULL, own_teardown_main, &a[r]) == 0);
    }
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < W; r++) {
      if (a[r].r[0] != sbnSuccess || a[r].r[1] != sbnSuccess || a[r].d != sbnSuccess)
        SBN_FAIL_("round %d rank %d: forward %s, backward %s, destroy %s", round, r,
                  sbnGetResultName(a[r].r[0]), sbnGetResultName(a[r].r[1]),
                  sbnGetResultName(a[r].d));
    }
    if (sbn_test_cur_failed_) return;
    ASSERT_MEMEQ(b[0].sm, b[2].sm, 4 * sizeof(float));
  }

  sbnComm_t comms[W];
  ASSERT_OK(sbnCommInitCpu(comms, W, &cfg));
  for (int r = 0; r < W; r++) bufs_init(&b[r], 1 + r, 4, 3, 1300 + (uint64_t)r);
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < W; r++) {
    ASSERT_OK(fwd(comms[r], &b[r]));
    ASSERT_OK(bwd(comms[r], &b[r]));
  }
  ASSERT_OK(sbnGroupEnd());
  sbnResult_t async = sbnTimeout;
  ASSERT_OK(sbnCommGetAsyncError(comms[2], &async));
  ASSERT_RES(async, sbnSuccess);
  ASSERT_OK(sbnCommDestroy(comms[0]));
  /* the rest of the team is aborted now: that is what its async error says */
  ASSERT_OK(sbnCommGetAsyncError(comms[2], &async));
  ASSERT_RES(async, sbnAborted);
  ASSERT_OK(sbnCommDestroy(comms[1]));
  ASSERT_OK(sbnCommDestroy(comms[2]));
}

/* ---- one rank, two threads ----------------------------------------------------------- */
/* A comm's calls must not overlap (front.h: sbn_comm_claim). Thread A holds rank 0's comm
   in its open group; meanwhile this thread's calls on it are refused at once with
   sbnInvalidUsage and write nothing: an op, a split, a destroy, an op inside a group. A's
   group then runs, and gives the comms back. Before, two threads' groups over the same
   comms both ran and could pair their ops across the team (each rank got another group's
   statistics, with no error), and a destroy under a queued or waiting call freed the comm
   under it. The team's timeout (10 s) is never reached here: a refused call that waited
   for rank 1 instead would return sbnTimeout after it. */
typedef struct {
  sbnComm_t* comms;
  bufs_t* b; /* [2] */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stage;     /* 1: A's group holds rank 0's comm; 2: A may go on */
  int exit_open; /* A exits with its group open after queuing rank 0's op */
  sbnResult_t q0, q1, end;
} holder_t;
static void* holder_main(void* arg) {
  holder_t* h = (holder_t*)arg;
  h->end = sbnGroupStart();
  h->q0 = fwd(h->comms[0], &h->b[0]);
  pthread_mutex_lock(&h->mu);
  h->stage = 1;
  pthread_cond_broadcast(&h->cv);
  while (!h->exit_open && h->stage != 2) pthread_cond_wait(&h->cv, &h->mu);
  pthread_mutex_unlock(&h->mu);
  if (h->exit_open) return NULL;
  h->q1 = fwd(h->comms[1], &h->b[1]);
  h->end = sbnGroupEnd();
  return NULL;
}
static void holder_wait(holder_t* h, int stage) {
  pthread_mutex_lock(&h->mu);
  while (h->stage != stage) pthread_cond_wait(&h->cv, &h->mu);
  pthread_mutex_unlock(&h->mu);
}
/* Lets A go on (stage 2: its second op and sbnGroupEnd) and waits for it to end. */
static void holder_go_on(holder_t* h, pthread_t th) {
  pthread_mutex_lock(&h->mu);
  h->stage = 2;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  pthread_join(th, NULL);
}
static void test_one_rank_two_threads(void) {
  sbnConfig_t cfg = config_ms(10000);
  sbnComm_t comms[2];
  ASSERT_OK(sbnCommInitCpu(comms, 2, &cfg));
  static bufs_t b[2], mine, snap;
  for (int r = 0; r < 2; r++) bufs_init(&b[r], 2, 3, 4, 1300 + (uint64_t)r);
  bufs_init(&mine, 2, 3, 4, 1310);
  memcpy(&snap, &mine, sizeof snap);
  static holder_t h;
  memset(&h, 0, sizeof h);
  h.comms = comms;
  h.b = b;
  pthread_mutex_init(&h.mu, NULL);
  pthread_cond_init(&h.cv, NULL);
  pthread_t th;
  ASSERT_TRUE(pthread_create(&th, NULL, holder_main, &h) == 0);
  holder_wait(&h, 1);
  ASSERT_OK(h.q0);
  ASSERT_RES(fwd(comms[0], &mine), sbnInvalidUsage);
  EXPECT_TRUE(strstr(sbnGetLastError(comms[0]), "in use by another thread") != NULL);
  ASSERT_RES(bwd(comms[0], &mine), sbnInvalidUsage);
  sbnComm_t sub = SENTINEL_COMM;
  ASSERT_RES(sbnCommSplit(comms[0], 0, 0, &sub), sbnInvalidUsage);
  ASSERT_RES(sbnCommDestroy(comms[0]), sbnInvalidUsage);
  ASSERT_OK(sbnGroupStart()); /* not rank 1's op: this group would hold comm 1 from A */
  ASSERT_RES(fwd(comms[0], &mine), sbnInvalidUsage);
  ASSERT_RES(sbnGroupEnd(), sbnInvalidUsage);
  ASSERT_MEMEQ(&mine, &snap, sizeof mine);
  ASSERT_TRUE(sub == SENTINEL_COMM);
  holder_go_on(&h, th);
  ASSERT_OK(h.q1);
  ASSERT_OK(h.end);
  ASSERT_MEMEQ(b[0].sm, b[1].sm, 3 * sizeof(float)); /* the team's mean, on both ranks */
  /* A's group gave its comms back: a group of this thread over both runs */
  ASSERT_OK(sbnGroupStart());
  ASSERT_OK(fwd(comms[0], &b[0]));
  ASSERT_OK(fwd(comms[1], &b[1]));
  ASSERT_OK(sbnGroupEnd());
  /* a thread that exits with its group open gives its comms back (and frees its queue:
     the asan preset's leak check) */
  h.stage = 0;
  h.exit_open = 1;
  ASSERT_TRUE(pthread_create(&th, NULL, holder_main, &h) == 0);
  pthread_join(th, NULL);
  ASSERT_OK(h.q0);
  ASSERT_OK(sbnGroupStart());
  ASSERT_OK(fwd(comms[0], &b[0]));
  ASSERT_OK(fwd(comms[1], &b[1]));
  ASSERT_OK(sbnGroupEnd());
  /* the holder's comm refused to another thread's split whatever the split's arguments and
     the team's state (its claim is checked first, as an op's): before, a split with
     newcomm NULL, or on a team aborted since, got their own errors, and their details
     went over the holder's */
  sbnComm_t held[2];
  ASSERT_OK(sbnCommInitCpu(held, 2, &cfg));
  pthread_cond_destroy(&h.cv);
  pthread_mutex_destroy(&h.mu);
  memset(&h, 0, sizeof h);
  h.comms = held;
  h.b = b;
  pthread_mutex_init(&h.mu, NULL);
  pthread_cond_init(&h.cv, NULL);
  ASSERT_TRUE(pthread_create(&th, NULL, holder_main, &h) == 0);
  holder_wait(&h, 1);
  ASSERT_OK(h.q0);
  ASSERT_RES(sbnCommSplit(held[0], 0, 0, NULL), sbnInvalidUsage);
  ASSERT_OK(sbnCommAbort(held[1]));
  ASSERT_RES(sbnCommSplit(held[0], 0, 0, &sub), sbnInvalidUsage);
  EXPECT_TRUE(strstr(sbnGetLastError(held[0]), "in use by another thread") != NULL);
  ASSERT_TRUE(sub == SENTINEL_COMM);
  holder_go_on(&h, th);
  ASSERT_RES(h.q1, sbnAborted); /* the holder's own calls see the abort */
  ASSERT_RES(h.end, sbnInvalidUsage);
  pthread_cond_destroy(&h.cv);
  pthread_mutex_destroy(&h.mu);
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
  for (int r = 0; r < 2; r++) (void)sbnCommDestroy(held[r]);
}

/* pthread_cancel of a rank's thread while it waits in a thread-per-rank split: the call
   runs with cancellation disabled (front.h), so the cancel waits until it returns, and the
   team's lock is never left held. Before, the cancelled wait left the lock held: the
   peer's split, and every later timeout, abort or destroy on the team, blocked forever.
   The peer's split runs on a thread of its own, watched: one that has not returned after
   20 s is that hang, reported as a failure at once. */
typedef struct {
  job_t job;
  atomic_int done;
} watched_t;
static void* watched_main(void* arg) {
  watched_t* w = (watched_t*)arg;
  job_main(&w->job);
  atomic_store(&w->done, 1);
  return NULL;
}
/* kind: JOB_SPLIT, or JOB_FWD (an op: cancellation is disabled there too, syncbn.h) */
static void cancel_while_waiting(int kind) {
  sbnConfig_t cfg = config_ms(BEYOND_CTEST_TIMEOUT_MS);
  sbnComm_t comms[2], sub[2] = {SENTINEL_COMM, SENTINEL_COMM};
  ASSERT_OK(sbnCommInitCpu(comms, 2, &cfg));
  static watched_t w[2];
  static bufs_t b[2];
  memset(w, 0, sizeof w);
  for (int r = 0; r < 2; r++) {
    bufs_init(&b[r], 2, 3, 2, 480 + (uint64_t)r);
    w[r].job.kind = kind;
    w[r].job.comm = comms[r];
    w[r].job.b = &b[r];
    w[r].job.color = 0;
    w[r].job.key = r;
    w[r].job.newcomm = &sub[r];
    w[r].job.r = sbnSystemError;
  }
  pthread_t th[2];
  ASSERT_TRUE(pthread_create(&th[0], NULL, watched_main, &w[0]) == 0);
  sleep_ms(150); /* rank 0 waits in the call (a cancel before that is deferred all the same) */
  ASSERT_TRUE(pthread_cancel(th[0]) == 0);
  sleep_ms(50);
  ASSERT_TRUE(pthread_create(&th[1], NULL, watched_main, &w[1]) == 0);
  const double t0 = now_ms();
  while (!atomic_load(&w[1].done) && now_ms() - t0 < 20000.0) sleep_ms(5);
  if (!atomic_load(&w[1].done)) {
    SBN_FAIL_("rank 1's %s has not returned after 20 s: the cancelled rank 0 left the team's "
              "lock held", kind == JOB_SPLIT ? "split" : "forward");
    fflush(stderr);
    _exit(1); /* the blocked thread cannot be joined */
  }
  pthread_join(th[1], NULL);
  pthread_join(th[0], NULL); /* cancelled after its split returned, or ended normally */
  ASSERT_OK(w[1].job.r);
  ASSERT_OK(w[0].job.r); /* the call completed on both ranks */
  if (kind == JOB_SPLIT) {
    for (int r = 0; r < 2; r++) ASSERT_TRUE(sub[r] != SENTINEL_COMM && sub[r] != NULL);
    for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(sub[r]));
  } else { /* the team is in step: its next op, as a group, runs */
    ASSERT_MEMEQ(b[0].sm, b[1].sm, 3 * sizeof(float));
    ASSERT_OK(sbnGroupStart());
    for (int r = 0; r < 2; r++) ASSERT_OK(bwd(comms[r], &b[r]));
    ASSERT_OK(sbnGroupEnd());
  }
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}
static void test_cancel_in_split(void) { cancel_while_waiting(JOB_SPLIT); }
static void test_cancel_in_op(void) { cancel_while_waiting(JOB_FWD); }

/* pthread_cancel of a thread in sbnGroupEnd (stalled 300 ms at its first lock, inside the
   call, where a cancel is sent): the group runs to its end all the same, the cancel taking
   effect at the thread's next cancellation point after the call (syncbn.h); its outputs
   are those of the same group run by the main thread. A sbnGroupEnd that left
   cancellation enabled dies in the stall, the group not run (checked). */
typedef struct {
  sbnComm_t* comms;
  bufs_t* b;
  sbnResult_t r;
  atomic_int returned, after;
} group_job_t;
static void* group_main(void* arg) {
  group_job_t* g = (group_job_t*)arg;
  g->r = sbnGroupStart();
  for (int r = 0; r < 2 && g->r == sbnSuccess; r++) g->r = fwd(g->comms[r], &g->b[r]);
  lock_delay_ms = 300;
  const sbnResult_t end = sbnGroupEnd();
  lock_delay_ms = 0;
  if (g->r == sbnSuccess) g->r = end;
  atomic_store(&g->returned, 1);
  pthread_testcancel(); /* the pending cancel ends the thread here */
  atomic_store(&g->after, 1);
  return NULL;
}
static void test_cancel_in_group_end(void) {
  sbnConfig_t cfg = config_ms(60000);
  sbnComm_t comms[2];
  ASSERT_OK(sbnCommInitCpu(comms, 2, &cfg));
  static bufs_t b[2], want[2];
  for (int r = 0; r < 2; r++) bufs_init(&b[r], 2, 3, 2, 490 + (uint64_t)r);
  memcpy(want, b, sizeof want);
  static group_job_t g;
  memset(&g, 0, sizeof g);
  g.comms = comms;
  g.b = b;
  g.r = sbnSystemError;
  pthread_t th;
  ASSERT_TRUE(pthread_create(&th, NULL, group_main, &g) == 0);
  sleep_ms(100); /* in the stall */
  ASSERT_TRUE(pthread_cancel(th) == 0);
  void* ret = NULL;
  ASSERT_TRUE(pthread_join(th, &ret) == 0);
  ASSERT_TRUE(atomic_load(&g.returned));
  ASSERT_TRUE(!atomic_load(&g.after) && ret == PTHREAD_CANCELED);
  ASSERT_OK(g.r);
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) ASSERT_OK(fwd(comms[r], &want[r]));
  ASSERT_OK(sbnGroupEnd());
  for (int r = 0; r < 2; r++) {
    ASSERT_MEMEQ(b[r].y, want[r].y, sizeof b[r].y);
    ASSERT_MEMEQ(b[r].sm, want[r].sm, sizeof b[r].sm);
  }
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

int main(void) {
  unsetenv("SBN_TIMEOUT_MS"); /* the tests set their own timeouts */
  SBN_RUN(test_timeout);
  SBN_RUN(test_timeout_late_arrival);
  SBN_RUN(test_timeout_env_override);
  SBN_RUN(test_timeout_env_empty);
  SBN_RUN(test_abort);
  SBN_RUN(test_abort_then_destroy);
  SBN_RUN(test_split_group);
  SBN_RUN(test_split_threads);
  SBN_RUN(test_split_inherits_config);
  SBN_RUN(test_split_in_group_with_ops);
  SBN_RUN(test_group_thread_start_fails);
  SBN_RUN(test_timeout_beyond_100_years);
  SBN_RUN(test_split_nocolor);
  SBN_RUN(test_split_timeout_names_rank);
  SBN_RUN(test_split_wait_monotonic);
  SBN_RUN(test_split_late_rank);
  SBN_RUN(test_split_failure_detail);
  SBN_RUN(test_gpu_team_too_wide_refused_first);
  SBN_RUN(test_multi_op_group);
  SBN_RUN(test_group_queue_out_of_memory);
  SBN_RUN(test_group_stops_at_failure);
  SBN_RUN(test_two_teams_one_group);
  SBN_RUN(test_group_order_across_teams);
  SBN_RUN(test_group_stops_across_teams);
  SBN_RUN(test_mismatch_threads);
  SBN_RUN(test_mismatch_pipeline);
  SBN_RUN(test_refused_on_some_ranks);
  SBN_RUN(test_inplace_refused_beside_empty_rank);
  SBN_RUN(test_destroyed_rank_later_ops);
  SBN_RUN(test_destroyed_rank_wakes_waiter);
  SBN_RUN(test_destroy_after_last_op);
  SBN_RUN(test_one_rank_two_threads);
  SBN_RUN(test_cancel_in_split);
  SBN_RUN(test_cancel_in_op);
  SBN_RUN(test_cancel_in_group_end);
  return sbn_test_exit();
}
