/* test_mp_launch.c — the multi-process launcher (mp_launch.h) on CPU, no CUDA:
 *   - rank 0's random blob reaches W = 1, 2, 4, 8 children intact (also one larger than a
 *     pipe's buffer); every rank 0..W-1 runs exactly once, each in its own process;
 *   - aggregation: all 0 -> 0, all 77 -> 77, one rank 3 / a 0-77 mix / a signal / a return
 *     value outside 0..255 -> 1, with the right per-rank status;
 *   - a hanging rank (and a grandchild it forked) is killed at a 2 s timeout (not
 *     before), reported as hung; with fail-fast, ranks still running 0.5 s (not less)
 *     after another rank failed are killed, reported as stopped, not as hung at the
 *     timeout;
 *   - make_blob failing: the other ranks exit with MP_EXIT_NO_BLOB at once (no hang) and
 *     no child function runs;
 *   - output: every child line arrives whole, prefixed with its rank, in order;
 *   - mp_call_in_child: the value comes back; a hang is killed at its timeout; a crash
 *     gives -1.
 * No assertion bounds how long anything takes (a loaded machine is slow): what ended a
 * rank is read from its status (exited, hung at the timeout, stopped by fail-fast), and
 * elapsed times only bound from below (a kill before its deadline is a bug). A launcher
 * that never ends a hang is a hang of this test, which CTest's TIMEOUT fails.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "mp_launch.h"

/* ---- a test's context (each child has its own copy) ------------------------------------- */
enum {
  DO_CHECK_BLOB, /* compare the blob with rank 0's copy on disk; leave a marker */
  DO_RETURN,     /* rank `arg` returns `code`, the others `code2` */
  DO_SIGNAL,     /* rank `arg` kills itself with SIGTERM, the others return 0 */
  DO_HANG,       /* rank `arg` forks a grandchild, then both sleep forever (arg < 0: rank 0
                    returns 4, every other rank hangs) */
  DO_PRINT,      /* print NLINES lines to stdout and stderr alternately, and a partial one */
};
/* DO_CHECK_BLOB's distinct failure codes */
enum { BAD_ARGS = 10, BAD_REF = 11, BAD_BLOB = 12, BAD_MARKER = 13 };
#define NLINES 200
#define XRUN 80

typedef struct {
  char dir[256]; /* a fresh temporary directory per test */
  int W;
  int what, arg, code, code2;
  int make_fails; /* make_blob returns this when non-zero */
  int hold_fd;    /* write end kept open by hanging processes (-1: none) */
} tctx_t;

static void tctx_init(tctx_t* t, int W, int what) {
  memset(t, 0, sizeof *t);
  snprintf(t->dir, sizeof t->dir, "%s/sbn_mp_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (mkdtemp(t->dir) == NULL) {
    perror("mkdtemp");
    exit(1);
  }
  t->W = W;
  t->what = what;
  t->hold_fd = -1;
}

/* Removes the directory's files (flat) and the directory. */
static void tctx_cleanup(tctx_t* t) {
  char path[512];
  snprintf(path, sizeof path, "%s/blob", t->dir);
  unlink(path);
  for (int r = 0; r <= MP_MAX_RANKS; r++) {
    snprintf(path, sizeof path, "%s/rank.%d", t->dir, r);
    unlink(path);
  }
  rmdir(t->dir);
}

static double now_s(void) {
  return mp_now_s();
}

static int file_exists(const tctx_t* t, const char* name) {
  char path[512];
  struct stat sb;
  snprintf(path, sizeof path, "%s/%s", t->dir, name);
  return stat(path, &sb) == 0;
}

/* Reads a whole small file; returns its size or -1. */
static long read_file(const char* path, void* buf, size_t cap) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  size_t got = 0;
  for (;;) {
    ssize_t r = read(fd, (char*)buf + got, cap - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
    if (got == cap) break;
  }
  close(fd);
  return (long)got;
}

/* ---- make_blob and the child ------------------------------------------------------------ */
/* Rank 0: random bytes (from /dev/urandom, else a clock-seeded generator), also written to
   <dir>/blob (write + rename, before the blob is sent) for the other ranks to compare. */
static int make_random_blob(void* blob, size_t size, void* ctx) {
  tctx_t* t = (tctx_t*)ctx;
  if (t->make_fails) {
    fprintf(stderr, "make_blob: failing on purpose (%d)\n", t->make_fails);
    return t->make_fails;
  }
  if (read_file("/dev/urandom", blob, size) != (long)size) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    sbn_rng_t rng = {(uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32)};
    for (size_t i = 0; i < size; i++) ((unsigned char*)blob)[i] = (unsigned char)sbn_rng_u64(&rng);
  }
  char path[512], tmp[520];
  snprintf(path, sizeof path, "%s/blob", t->dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return 50;
  const char* p = (const char*)blob;
  for (size_t left = size; left > 0;) {
    ssize_t w = write(fd, p, left);
    if (w <= 0) {
      close(fd);
      return 51;
    }
    p += w;
    left -= (size_t)w;
  }
  close(fd);
  return rename(tmp, path) == 0 ? 0 : 52;
}

static int check_blob(int rank, int W, const void* blob, tctx_t* t, size_t size) {
  if (W != t->W || rank < 0 || rank >= W) {
    fprintf(stderr, "child got rank %d of W %d (expected W %d)\n", rank, W, t->W);
    return BAD_ARGS;
  }
  char path[512];
  snprintf(path, sizeof path, "%s/blob", t->dir);
  unsigned char* ref = (unsigned char*)malloc(size + 1);
  long n = read_file(path, ref, size + 1);
  if (n != (long)size) {
    fprintf(stderr, "rank %d: rank 0's copy of the blob has %ld bytes, expected %zu\n", rank, n,
            size);
    free(ref);
    return BAD_REF;
  }
  int same = memcmp(ref, blob, size) == 0;
  free(ref);
  if (!same) {
    fprintf(stderr, "rank %d: the blob differs from what rank 0 made\n", rank);
    return BAD_BLOB;
  }
  snprintf(path, sizeof path, "%s/rank.%d", t->dir, rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    fprintf(stderr, "rank %d: marker %s: %s (rank run twice?)\n", rank, path, strerror(errno));
    return BAD_MARKER;
  }
  char line[32];
  int len = snprintf(line, sizeof line, "%ld\n", (long)getpid());
  ssize_t w = write(fd, line, (size_t)len);
  close(fd);
  if (w != len) return BAD_MARKER;
  printf("rank %d of %d: blob of %zu bytes ok\n", rank, W, size);
  return 0;
}

static size_t g_blob_size; /* the current test's blob size (inherited by the children) */

static int child_fn(int rank, int W, const void* blob, void* ctx) {
  tctx_t* t = (tctx_t*)ctx;
  switch (t->what) {
    case DO_CHECK_BLOB:
      return check_blob(rank, W, blob, t, g_blob_size);
    case DO_RETURN:
      return rank == t->arg ? t->code : t->code2;
    case DO_SIGNAL:
      if (rank == t->arg) raise(SIGTERM);
      return 0;
    case DO_HANG:
      if (t->arg < 0 && rank == 0) return 4; /* test_fail_fast: rank 0 fails, the rest hang */
      if (rank == t->arg || t->arg < 0) {
        printf("rank %d: hanging (and a grandchild)\n", rank);
        fflush(stdout);
        pid_t g = fork();
        (void)g; /* both the child and the grandchild hang, holding hold_fd */
        for (;;) pause();
      }
      return 0;
    case DO_PRINT: {
      char xs[XRUN + 1];
      memset(xs, 'x', XRUN);
      xs[XRUN] = '\0';
      for (int i = 0; i < NLINES; i++) {
        if (i % 2)
          fprintf(stderr, "rank %d line %d %s\n", rank, i, xs);
        else
          printf("rank %d line %d %s\n", rank, i, xs);
      }
      printf("tail %d", rank); /* no newline: relayed when the child ends */
      return 0;
    }
  }
  return 99;
}

/* ---- tests ----------------------------------------------------------------------------- */
/* Returns 0 when the case passed. */
static int share_blob_case(int W, size_t size) {
  int failed_before = sbn_test_cur_failed_;
  tctx_t t;
  tctx_init(&t, W, DO_CHECK_BLOB);
  g_blob_size = size;
  mp_rank_status_t st[MP_MAX_RANKS];
  int rc = mp_run_ex(W, size, make_random_blob, child_fn, &t, 20.0, st);
  if (rc != 0) {
    SBN_FAIL_("W = %d, blob %zu bytes: mp_run returned %d, expected 0", W, size, rc);
    goto out;
  }
  /* rank 0's blob is not all zero (make_blob ran and it was random) */
  {
    char path[512];
    snprintf(path, sizeof path, "%s/blob", t.dir);
    unsigned char* b = (unsigned char*)malloc(size);
    long n = read_file(path, b, size);
    size_t nz = 0;
    for (long i = 0; i < n; i++) nz += b[i] != 0;
    free(b);
    if (n != (long)size || nz < size / 2)
      SBN_FAIL_("W = %d: rank 0's blob: %ld bytes, %zu non-zero", W, n, nz);
  }
  /* every rank ran exactly once, each in a process of its own */
  long pids[MP_MAX_RANKS];
  for (int r = 0; r < W; r++) {
    char path[512], line[32] = {0};
    snprintf(path, sizeof path, "%s/rank.%d", t.dir, r);
    if (read_file(path, line, sizeof line - 1) <= 0) {
      SBN_FAIL_("W = %d: rank %d left no marker", W, r);
      goto out;
    }
    pids[r] = strtol(line, NULL, 10);
    if (pids[r] <= 0 || pids[r] == (long)getpid() || pids[r] != st[r].pid)
      SBN_FAIL_("W = %d: rank %d ran as pid %ld (launcher says %ld, parent %ld)", W, r, pids[r],
                st[r].pid, (long)getpid());
    for (int q = 0; q < r; q++)
      if (pids[q] == pids[r]) SBN_FAIL_("W = %d: ranks %d and %d share pid %ld", W, q, r, pids[r]);
    if (st[r].state != MP_RANK_EXITED || st[r].code != 0)
      SBN_FAIL_("W = %d: rank %d status %d code %d", W, r, (int)st[r].state, st[r].code);
  }
  {
    char name[32];
    snprintf(name, sizeof name, "rank.%d", W);
    if (file_exists(&t, name)) SBN_FAIL_("W = %d: a marker for rank %d exists", W, W);
  }
out:
  tctx_cleanup(&t);
  return sbn_test_cur_failed_ != failed_before;
}

/* Stops at the first failing case (a broken launcher may cost a timeout per case). */
static void test_share_blob(void) {
  static const int Ws[] = {1, 2, 4, 8};
  for (size_t i = 0; i < sizeof Ws / sizeof Ws[0]; i++)
    if (share_blob_case(Ws[i], 128)) return;
  if (share_blob_case(4, 300000))
    return; /* more than a pipe holds: rank 0 blocks until each reads */
  share_blob_case(3, 1);
}

static void test_all_skip(void) {
  for (int W = 1; W <= 3; W += 2) {
    tctx_t t;
    tctx_init(&t, W, DO_RETURN);
    t.arg = 0, t.code = MP_SKIP, t.code2 = MP_SKIP;
    int rc = mp_run(W, 16, NULL, child_fn, &t, 30.0);
    tctx_cleanup(&t);
    if (rc != MP_SKIP) SBN_FAIL_("W = %d, every rank 77: mp_run returned %d, expected 77", W, rc);
  }
}

static void expect_run(tctx_t* t, int want, const mp_state_t* state, const int* code,
                       const char* what) {
  mp_rank_status_t st[MP_MAX_RANKS];
  int rc = mp_run_ex(t->W, 16, NULL, child_fn, t, 30.0, st);
  if (rc != want) SBN_FAIL_("%s: mp_run returned %d, expected %d", what, rc, want);
  for (int r = 0; r < t->W; r++)
    if (st[r].state != state[r] || st[r].code != code[r])
      SBN_FAIL_("%s: rank %d: state %d code %d, expected state %d code %d", what, r,
                (int)st[r].state, st[r].code, (int)state[r], code[r]);
}

static void test_failures(void) {
  tctx_t t;
  {
    const mp_state_t s[4] = {MP_RANK_EXITED, MP_RANK_EXITED, MP_RANK_EXITED, MP_RANK_EXITED};
    const int c[4] = {0, 0, 3, 0};
    tctx_init(&t, 4, DO_RETURN);
    t.arg = 2, t.code = 3, t.code2 = 0;
    expect_run(&t, 1, s, c, "W = 4, rank 2 returns 3");
    tctx_cleanup(&t);
  }
  {
    const mp_state_t s[3] = {MP_RANK_EXITED, MP_RANK_EXITED, MP_RANK_EXITED};
    const int c[3] = {MP_SKIP, 0, 0};
    tctx_init(&t, 3, DO_RETURN);
    t.arg = 0, t.code = MP_SKIP, t.code2 = 0;
    expect_run(&t, 1, s, c, "W = 3, rank 0 skips, the others pass");
    tctx_cleanup(&t);
  }
  {
    const mp_state_t s[2] = {MP_RANK_EXITED, MP_RANK_SIGNALED};
    const int c[2] = {0, SIGTERM};
    tctx_init(&t, 2, DO_SIGNAL);
    t.arg = 1;
    expect_run(&t, 1, s, c, "W = 2, rank 1 dies from SIGTERM");
    tctx_cleanup(&t);
  }
  {
    /* 256 would be exit status 0 if passed to _exit as is */
    const mp_state_t s[2] = {MP_RANK_EXITED, MP_RANK_EXITED};
    const int c[2] = {1, 0};
    tctx_init(&t, 2, DO_RETURN);
    t.arg = 0, t.code = 256, t.code2 = 0;
    expect_run(&t, 1, s, c, "W = 2, rank 0 returns 256");
    tctx_cleanup(&t);
  }
  {
    const mp_state_t s[1] = {MP_RANK_EXITED};
    const int c[1] = {0};
    tctx_init(&t, 1, DO_RETURN);
    expect_run(&t, 0, s, c, "W = 1, rank 0 returns 0");
    tctx_cleanup(&t);
  }
}

static void test_hang_killed(void) {
  int hold[2];
  ASSERT_TRUE(pipe(hold) == 0);
  tctx_t t;
  tctx_init(&t, 3, DO_HANG);
  t.arg = 1;
  t.hold_fd = hold[1];
  mp_rank_status_t st[3];
  double t0 = now_s();
  int rc = mp_run_ex(3, 16, NULL, child_fn, &t, 2.0, st);
  double el = now_s() - t0;
  tctx_cleanup(&t);
  close(hold[1]);
  fprintf(stderr, "  hanging rank: mp_run returned %d after %.2f s\n", rc, el);
  if (rc != 1) SBN_FAIL_("a hanging rank: mp_run returned %d, expected 1", rc);
  /* rank 1 never returns (pause), so HUNG can only be the timeout's kill; not before it */
  if (el < 2.0) SBN_FAIL_("a hanging rank with a 2 s timeout: killed after %.2f s", el);
  if (st[1].state != MP_RANK_HUNG)
    SBN_FAIL_("rank 1: state %d, expected MP_RANK_HUNG", (int)st[1].state);
  for (int r = 0; r < 3; r += 2)
    if (st[r].state != MP_RANK_EXITED || st[r].code != 0)
      SBN_FAIL_("rank %d: state %d code %d, expected exit 0", r, (int)st[r].state, st[r].code);
  /* the hung rank and its grandchild are gone: the last write ends of `hold` closed */
  struct pollfd pf = {hold[0], POLLIN, 0};
  int k = poll(&pf, 1, 3000);
  char c;
  ssize_t n = k > 0 ? read(hold[0], &c, 1) : -1;
  close(hold[0]);
  if (n != 0) SBN_FAIL_("a process of the hung rank (child or grandchild) is still alive");
}

/* fail-fast: rank 0 fails at once, ranks 1 and 2 hang; with fail_fast_s = 0.5 they are
   killed 0.5 s later (MP_RANK_STOPPED), not at the 30 s timeout (MP_RANK_HUNG). */
static void test_fail_fast(void) {
  tctx_t t;
  tctx_init(&t, 3, DO_HANG);
  t.arg = -1; /* every rank but 0 hangs: see child_fn */
  mp_rank_status_t st[3];
  mp_opts_t o = {30.0, 0.5};
  double t0 = now_s();
  int rc = mp_run_opts(3, 16, NULL, child_fn, &t, &o, st);
  double el = now_s() - t0;
  tctx_cleanup(&t);
  if (rc != 1) SBN_FAIL_("fail-fast: mp_run returned %d, expected 1", rc);
  if (el < 0.5) SBN_FAIL_("fail-fast after 0.5 s: the ranks were killed after %.2f s", el);
  if (st[0].state != MP_RANK_EXITED || st[0].code != 4)
    SBN_FAIL_("rank 0: state %d code %d, expected exit 4", (int)st[0].state, st[0].code);
  for (int r = 1; r < 3; r++)
    if (st[r].state != MP_RANK_STOPPED)
      SBN_FAIL_("rank %d: state %d, expected MP_RANK_STOPPED", r, (int)st[r].state);
}

static void test_make_blob_fails(void) {
  for (int W = 1; W <= 4; W += 3) {
    tctx_t t;
    tctx_init(&t, W, DO_CHECK_BLOB);
    t.make_fails = 5;
    g_blob_size = 128;
    mp_rank_status_t st[4];
    /* a rank that waited for the blob would be killed at the timeout (MP_RANK_HUNG),
       not exit with MP_EXIT_NO_BLOB */
    int rc = mp_run_ex(W, 128, make_random_blob, child_fn, &t, 30.0, st);
    if (rc != 1) SBN_FAIL_("W = %d, make_blob fails: mp_run returned %d, expected 1", W, rc);
    if (st[0].state != MP_RANK_EXITED || st[0].code != 5)
      SBN_FAIL_("rank 0: state %d code %d, expected exit 5 (make_blob's code)", (int)st[0].state,
                st[0].code);
    for (int r = 1; r < W; r++)
      if (st[r].state != MP_RANK_EXITED || st[r].code != MP_EXIT_NO_BLOB)
        SBN_FAIL_("rank %d: state %d code %d, expected exit %d (no blob)", r, (int)st[r].state,
                  st[r].code, MP_EXIT_NO_BLOB);
    for (int r = 0; r < W; r++) {
      char name[32];
      snprintf(name, sizeof name, "rank.%d", r);
      if (file_exists(&t, name)) SBN_FAIL_("rank %d ran its child function without a blob", r);
    }
    tctx_cleanup(&t);
  }
}

/* Every child line arrives whole, with its rank's prefix, in the child's order. */
static void test_output_relay(void) {
  const int W = 3;
  char path[] = "/tmp/sbn_mp_out_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_TRUE(fd >= 0);
  unlink(path);
  tctx_t t;
  tctx_init(&t, W, DO_PRINT);
  fflush(NULL);
  int saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  int rc = mp_run(W, 8, NULL, child_fn, &t, 30.0);
  dup2(saved, STDERR_FILENO);
  close(saved);
  tctx_cleanup(&t);
  ASSERT_EQ_INT(rc, 0);
  off_t size = lseek(fd, 0, SEEK_END);
  char* text = (char*)malloc((size_t)size + 1);
  ASSERT_TRUE(pread(fd, text, (size_t)size, 0) == (ssize_t)size);
  close(fd);
  text[size] = '\0';
  int next[8] = {0}, tails = 0, bad = 0;
  for (char* line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    int pr = -1, r = -1, i = -1, len = 0;
    if (sscanf(line, "[rank %d] tail %d%n", &pr, &r, &len) == 2 && line[len] == '\0' && pr == r) {
      tails++;
      continue;
    }
    char xs[XRUN + 2] = {0};
    if (sscanf(line, "[rank %d] rank %d line %d %81s%n", &pr, &r, &i, xs, &len) != 4 ||
        line[len] != '\0' || pr != r || r < 0 || r >= W || strlen(xs) != XRUN ||
        strspn(xs, "x") != XRUN || i != next[r]) {
      if (bad++ < 3) SBN_FAIL_("relayed line not whole, not prefixed or out of order: '%s'", line);
      continue;
    }
    next[r]++;
  }
  free(text);
  for (int r = 0; r < W; r++)
    if (next[r] != NLINES) SBN_FAIL_("rank %d: %d of %d lines relayed", r, next[r], NLINES);
  if (tails != W) SBN_FAIL_("%d of %d unterminated last lines relayed", tails, W);
}

static int fn_answer(void* out, size_t size, void* ctx) {
  (void)ctx;
  if (size != sizeof(int)) return 3;
  *(int*)out = 42;
  return 0;
}
static int fn_skip(void* out, size_t size, void* ctx) {
  (void)ctx;
  memset(out, 7, size);
  return MP_SKIP;
}
static int fn_hang(void* out, size_t size, void* ctx) {
  (void)out, (void)size, (void)ctx;
  for (;;) pause();
  return 0;
}
static int fn_crash(void* out, size_t size, void* ctx) {
  (void)out, (void)size, (void)ctx;
  raise(SIGTERM);
  return 0;
}

static void test_call_in_child(void) {
  int v = -1;
  ASSERT_EQ_INT(mp_call_in_child(fn_answer, NULL, &v, sizeof v, 30.0), 0);
  ASSERT_EQ_INT(v, 42);
  unsigned char b[3] = {0, 0, 0};
  ASSERT_EQ_INT(mp_call_in_child(fn_skip, NULL, b, sizeof b, 30.0), MP_SKIP);
  ASSERT_TRUE(b[0] == 7 && b[2] == 7);
  v = -1;
  double t0 = now_s();
  ASSERT_EQ_INT(mp_call_in_child(fn_hang, NULL, &v, sizeof v, 1.0), -1);
  double el = now_s() - t0;
  /* fn_hang never returns: -1 after at least the timeout is the timeout's kill */
  if (el < 1.0) SBN_FAIL_("a hanging child with a 1 s timeout: -1 after %.2f s", el);
  ASSERT_EQ_INT(v, -1); /* untouched */
  ASSERT_EQ_INT(mp_call_in_child(fn_crash, NULL, &v, sizeof v, 30.0), -1);
  ASSERT_EQ_INT(v, -1);
}

static void test_bad_arguments(void) {
  tctx_t t;
  memset(&t, 0, sizeof t);
  ASSERT_EQ_INT(mp_run(0, 8, NULL, child_fn, &t, 1.0), 1);
  ASSERT_EQ_INT(mp_run(MP_MAX_RANKS + 1, 8, NULL, child_fn, &t, 1.0), 1);
  ASSERT_EQ_INT(mp_run(2, 8, NULL, NULL, &t, 1.0), 1);
}

int main(void) {
  double t0 = now_s();
  SBN_RUN(test_share_blob);
  SBN_RUN(test_all_skip);
  SBN_RUN(test_failures);
  SBN_RUN(test_hang_killed);
  SBN_RUN(test_fail_fast);
  SBN_RUN(test_make_blob_fails);
  SBN_RUN(test_output_relay);
  SBN_RUN(test_call_in_child);
  SBN_RUN(test_bad_arguments);
  fprintf(stderr, "test_mp_launch: %.2f s\n", now_s() - t0);
  return sbn_test_exit();
}
