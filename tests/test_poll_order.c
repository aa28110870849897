/* test_poll_order.c — the usual teardown fails no op, however the threads interleave.
 *
 * sbnCommDestroy's promise (include/syncbn.h): an op the destroyed rank had completed
 * completes on every peer too. A rank destroyed right after its last op aborts the team
 * (its peers' later ops cannot complete), and a peer still waiting in that op must then
 * find the records the destroyed rank saw: src/cpu/cpu_exchange.c's wait_epoch reads the
 * team's abort word before the record's epoch. Read the other way round, a rank that
 * published, finished and was destroyed between the two reads made its peer's op fail
 * (sbnAborted, nothing written): rare enough (1 in 2000-5000 teardowns of 6 threads, on a
 * 2-core x86 machine at f3a3971, 2026-12-01) that no test finds it by running teardowns.
 *
 * So this test is linked with cpu_exchange.c built with SBN_TEST_POLL_HOOK: the hook below
 * runs after the poll's two reads. Rank 0's first poll of rank 1's record (not yet
 * published) stops there until rank 1, on its own thread, has run the same forward and
 * been destroyed. Rank 0's forward must then succeed with the team's statistics. The same
 * test linked with the old order (test_poll_order_mutant: the abort read again after the
 * epoch, a line of cpu_exchange.c replaced by tests/CMakeLists.txt) must fail.
 *
 * The same can happen where a wait runs out: the epoch is read a last time, then the team
 * is aborted (sbnTimeout), and a peer may have published, finished and been destroyed in
 * between. wait_epoch reads the abort word and the epoch again after its abort.
 * test_destroy_at_deadline holds rank 0 between that last read and the abort (the second
 * hook) until rank 1 has run the forward and been destroyed; rank 0's forward must succeed.
 * test_poll_order_deadline_mutant, without the read after the abort, must fail it.
 *
 * A wait that runs out aborts the team (sbnTimeout) whatever the peer does after the last
 * read: test_own_timeout_at_deadline holds rank 0 at the same place until rank 1 has run the
 * forward (and is not destroyed); rank 0's forward must say sbnTimeout (the team is aborted,
 * its wait ran out), not succeed and leave the abort unsaid, which
 * test_poll_order_own_timeout_mutant (the epoch's success taken whatever the abort) does.
 *
 * And the hook counts a long wait's polls: test_long_wait_naps (a wait of 1 s naps longer
 * as it goes on), which test_poll_order_naps_mutant (naps of 20 us throughout) must fail.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "harness.h"

static _Thread_local int hook_armed;  /* rank 0's thread, during its forward */
static _Thread_local int count_armed; /* test_long_wait_naps: rank 0's naps recorded */
static _Thread_local long naps, nap_max_ns;
static atomic_int in_hook, rank1_gone; /* rank 0 waits in the hook; rank 1 was destroyed */
static atomic_int hook_stops;          /* polls the hook held (must be 1) */
static atomic_int hook_saw_gone;       /* the hook let go once rank 1 was destroyed */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Waits up to 10 s for *flag; whether it was set. */
static int wait_flag(atomic_int* flag) {
  const double t0 = now_ms();
  while (!atomic_load(flag) && now_ms() - t0 < 10000.0) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return atomic_load(flag);
}

/* Called by the library's wait_epoch after it read the abort word and the epoch. */
void sbn_test_poll_hook(const uint32_t* epoch, uint32_t k);
void sbn_test_poll_hook(const uint32_t* epoch, uint32_t k) {
  if (!hook_armed || __atomic_load_n(epoch, __ATOMIC_ACQUIRE) == k) return;
  hook_armed = 0; /* once: rank 1's record, unpublished when it was read */
  atomic_fetch_add(&hook_stops, 1);
  atomic_store(&in_hook, 1);
  atomic_store(&hook_saw_gone, wait_flag(&rank1_gone));
}

/* Called by the library's wait_epoch before each nap, with its length. */
void sbn_test_nap_hook(int64_t nap_ns);
void sbn_test_nap_hook(int64_t nap_ns) {
  if (!count_armed) return;
  naps++;
  if (nap_ns > nap_max_ns) nap_max_ns = (long)nap_ns;
}

/* The second hook's state: rank 0's thread during its forward; rank 1 was destroyed. */
static _Thread_local int deadline_armed;
static atomic_int in_deadline, late_gone, deadline_stops, deadline_saw_gone;

/* Called by the library's wait_epoch where the deadline passed, after the epoch's last read
   and before the team's abort. */
void sbn_test_deadline_hook(const uint32_t* epoch, uint32_t k);
void sbn_test_deadline_hook(const uint32_t* epoch, uint32_t k) {
  if (!deadline_armed || __atomic_load_n(epoch, __ATOMIC_ACQUIRE) == k) return;
  deadline_armed = 0;
  atomic_fetch_add(&deadline_stops, 1);
  atomic_store(&in_deadline, 1);
  atomic_store(&deadline_saw_gone, wait_flag(&late_gone));
}

enum { W = 2, N = 2, C = 3, SP = 4 };
typedef struct {
  sbnComm_t comm;
  float x[N * C * SP], y[N * C * SP], mean[C], invstd[C];
  sbnResult_t fwd, destroy;
} rank_t;

static sbnResult_t forward(rank_t* r) {
  const sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, N, C, SP};
  return sbnForwardTrain(r->comm, &d, r->x, r->y, NULL, NULL, NULL, NULL, NULL, r->mean, r->invstd, NULL,
                         NULL);
}

/* Rank 1's thread: once `go` is set (rank 0 waits in a hook), the same forward as rank 0,
   then its destroy (unless keep); then `gone`. */
typedef struct {
  rank_t* r;
  atomic_int *go, *gone;
  int keep;
} rank1_t;

static void* rank1_main(void* arg) {
  rank1_t* a = (rank1_t*)arg;
  (void)wait_flag(a->go); /* (not set: the hook never held rank 0, which the test asserts) */
  a->r->fwd = forward(a->r);
  if (!a->keep) a->r->destroy = sbnCommDestroy(a->r->comm);
  atomic_store(a->gone, 1);
  return NULL;
}

/* A CPU team of two with the given timeout, its inputs, statistics poisoned (NaN). */
static void team_pair(rank_t* rk, sbnComm_t* comms, int64_t timeout_ms) {
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  cfg.timeout_ms = timeout_ms;
  ASSERT_OK(sbnCommInitCpu(comms, W, &cfg));
  for (int q = 0; q < W; q++) {
    rk[q].comm = comms[q];
    for (int i = 0; i < N * C * SP; i++) rk[q].x[i] = (float)((i * 7 + q * 13) % 11) - 4.5f + 0.25f * (float)q;
    for (int c = 0; c < C; c++) rk[q].mean[c] = rk[q].invstd[c] = NAN;
  }
}

static void say_results(const rank_t* rk, sbnComm_t comm0) {
  fprintf(stderr, "  rank 0's forward %s (%s); rank 1's forward %s, destroy %s\n", sbnGetResultName(rk[0].fwd),
          rk[0].fwd == sbnSuccess ? "-" : sbnGetLastError(comm0), sbnGetResultName(rk[1].fwd),
          sbnGetResultName(rk[1].destroy));
}

/* A team of two (team_pair) whose rank 1 runs on its own thread (rank1_main) once `go` is
   set, while rank 0 runs the forward here with its thread's hook armed (*armed); then `go`
   (rank 1 goes on if the hook never ran: the test's hook count then fails it), the join
   and the results' line. */
static void run_pair(rank_t* rk, sbnComm_t* comms, int64_t timeout_ms, int* armed, atomic_int* go,
                     atomic_int* gone, int keep) {
  team_pair(rk, comms, timeout_ms);
  pthread_t th;
  rank1_t one = {&rk[1], go, gone, keep};
  ASSERT_TRUE(pthread_create(&th, NULL, rank1_main, &one) == 0);
  *armed = 1;
  rk[0].fwd = forward(&rk[0]);
  *armed = 0;
  atomic_store(go, 1);
  pthread_join(th, NULL);
  say_results(rk, comms[0]);
}

static void team_stats_right(const rank_t* rk);

static void test_destroy_between_reads(void) {
  static rank_t rk[W];
  sbnComm_t comms[W];
  run_pair(rk, comms, 20000, &hook_armed, &in_hook, &rank1_gone, 0);
  if (sbn_test_cur_failed_) return;
  /* the team is aborted now (rank 1 left): rank 0's next op says so, and writes nothing */
  float mean0[C], invstd0[C];
  memcpy(mean0, rk[0].mean, sizeof mean0);
  memcpy(invstd0, rk[0].invstd, sizeof invstd0);
  const sbnResult_t next = forward(&rk[0]);
  ASSERT_MEMEQ(mean0, rk[0].mean, sizeof mean0);
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_RES(next, sbnAborted);
  /* the hook held rank 0 while rank 1 finished: else this test cannot fail */
  ASSERT_EQ_INT(atomic_load(&hook_stops), 1);
  ASSERT_EQ_INT(atomic_load(&hook_saw_gone), 1);
  ASSERT_OK(rk[1].fwd);
  ASSERT_OK(rk[1].destroy);
  ASSERT_OK(rk[0].fwd);
  ASSERT_MEMEQ(invstd0, rk[1].invstd, sizeof invstd0);
  team_stats_right(rk);
}

/* The team's statistics, on both ranks: the same bits, and the float64 reference's. */
static void team_stats_right(const rank_t* rk) {
  ASSERT_MEMEQ(rk[0].mean, rk[1].mean, sizeof rk[0].mean);
  ASSERT_MEMEQ(rk[0].invstd, rk[1].invstd, sizeof rk[0].invstd);
  for (int c = 0; c < C; c++) {
    double s = 0.0, q = 0.0;
    const int m = W * N * SP;
    for (int r = 0; r < W; r++)
      for (int n = 0; n < N; n++)
        for (int i = 0; i < SP; i++) s += rk[r].x[(n * C + c) * SP + i];
    const double mean = s / m;
    for (int r = 0; r < W; r++)
      for (int n = 0; n < N; n++)
        for (int i = 0; i < SP; i++) q += (rk[r].x[(n * C + c) * SP + i] - mean) * (rk[r].x[(n * C + c) * SP + i] - mean);
    const double invstd = 1.0 / sqrt(q / m + 1e-5);
    /* fp32 sums of 16 values of magnitude < 10: a few ulps */
    EXPECT_TRUE(fabs(rk[0].mean[c] - mean) <= 1e-5 + 1e-5 * fabs(mean));
    EXPECT_TRUE(fabs(rk[0].invstd[c] - invstd) <= 1e-5 * invstd);
  }
}

static void test_destroy_at_deadline(void) {
  static rank_t late[W];
  sbnComm_t comms[W];
  /* rank 0's wait runs out (100 ms); rank 1 starts only then */
  run_pair(late, comms, 100, &deadline_armed, &in_deadline, &late_gone, 0);
  if (sbn_test_cur_failed_) return;
  ASSERT_OK(sbnCommDestroy(comms[0]));
  /* the hook held rank 0 past its deadline while rank 1 finished: else this cannot fail */
  ASSERT_EQ_INT(atomic_load(&deadline_stops), 1);
  ASSERT_EQ_INT(atomic_load(&deadline_saw_gone), 1);
  ASSERT_OK(late[1].fwd);
  ASSERT_OK(late[1].destroy);
  ASSERT_OK(late[0].fwd);
  team_stats_right(late); /* rank 0 merged the records rank 1 saw */
}

/* Rank 0's wait runs out (100 ms) and rank 1 runs the forward only then, while the deadline
   hook holds rank 0 between its last read and its abort; rank 1 stays. Rank 1's forward found
   rank 0's record: it succeeds. Rank 0's abort (its own timeout) took effect: its forward
   says sbnTimeout and writes nothing, and the team's next op on rank 1 says it was aborted. */
static void test_own_timeout_at_deadline(void) {
  static rank_t own[W];
  sbnComm_t comms[W];
  atomic_store(&deadline_stops, 0);
  atomic_store(&in_deadline, 0);
  atomic_store(&late_gone, 0);
  run_pair(own, comms, 100, &deadline_armed, &in_deadline, &late_gone, 1);
  if (sbn_test_cur_failed_) return;
  const sbnResult_t next = forward(&own[1]);
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
  ASSERT_EQ_INT(atomic_load(&deadline_stops), 1); /* else this cannot fail */
  ASSERT_EQ_INT(atomic_load(&deadline_saw_gone), 1);
  ASSERT_OK(own[1].fwd);
  ASSERT_RES(own[0].fwd, sbnTimeout);
  for (int c = 0; c < C; c++) ASSERT_TRUE(isnan(own[0].mean[c])); /* nothing written */
  ASSERT_RES(next, sbnAborted);
}

/* Rank 1's thread for test_long_wait_naps: its forward after delay_ms. */
typedef struct {
  rank_t* r;
  long delay_ms;
} late_t;

static void* late_main(void* arg) {
  late_t* a = (late_t*)arg;
  struct timespec ts = {a->delay_ms / 1000, (a->delay_ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  a->r->fwd = forward(a->r);
  return NULL;
}

/* A rank that waits long for a late peer naps longer as the wait goes on: 64 polls of
   spinning, yields for 1 ms, then naps of a 16th of the wait so far, up to 1 ms. Rank 1
   comes 1 s late: rank 0's naps reach 1 ms after 16 ms of waiting, whatever the load (by
   the clock, not a count of polls), so it wakes ~1000 times a second. With naps of 20 us throughout (the wait until 2026-12-02: tens of thousands of
   wake-ups a second, ~0.2 of a core per waiting rank), test_poll_order_naps_mutant must
   fail it. */
static void test_long_wait_naps(void) {
  static rank_t rk[W];
  sbnComm_t comms[W];
  team_pair(rk, comms, 20000);
  pthread_t th;
  late_t one = {&rk[1], 1000};
  const double t0 = now_ms(); /* before rank 1's 1 s begins */
  ASSERT_TRUE(pthread_create(&th, NULL, late_main, &one) == 0);
  count_armed = 1;
  rk[0].fwd = forward(&rk[0]);
  count_armed = 0;
  const double waited = now_ms() - t0;
  pthread_join(th, NULL);
  fprintf(stderr, "  rank 0 waited %.0f ms for rank 1: %ld naps, the longest %ld us\n", waited,
          naps, nap_max_ns / 1000);
  ASSERT_OK(rk[0].fwd);
  ASSERT_OK(rk[1].fwd);
  team_stats_right(rk);
  ASSERT_TRUE(waited >= 900.0); /* the wait this test is about took place */
  ASSERT_TRUE(naps > 0);
  ASSERT_EQ_INT(nap_max_ns, 1000000); /* the naps grew to their cap, and not past it */
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
}

int main(void) {
  unsetenv("SBN_TIMEOUT_MS");
  SBN_RUN(test_destroy_between_reads);
  SBN_RUN(test_destroy_at_deadline);
  SBN_RUN(test_own_timeout_at_deadline);
  SBN_RUN(test_long_wait_naps);
  return sbn_test_exit();
}
