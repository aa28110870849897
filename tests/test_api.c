/* test_api.c — bad input for every public function of syncbn.h.
 *
 * For every rejected call we check three things: the documented result code, that
 * sbnGetLastError (of the comm, or NULL for calls without one) explains it, and that
 * no output was written (API.md: "a failed call writes none of its outputs"). Outputs
 * are poisoned with a byte pattern first and compared against a snapshot after.
 * Built twice: against the static and the shared library.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>

#include "harness.h"

/* ---- buffers of one rank's op, poisoned ------------------------------------------ */
#define MAXC 16
#define MAXE 512 /* elements per tensor */
#define POISON 0xA5

typedef struct {
  sbnTensorDesc_t d;
  float x[MAXE], dy[MAXE];                /* inputs */
  float y[MAXE], dx[MAXE];                /* outputs */
  float w[MAXC], b[MAXC];                 /* inputs */
  float rm[MAXC], rv[MAXC];               /* in/out */
  float sm[MAXC], si[MAXC];               /* forward outputs / backward inputs */
  float dw[MAXC], db[MAXC];               /* outputs */
  int64_t nbt;                            /* in/out */
} bufs_t;

/* fp32 tensors of shape (n, c, spatial), NCHW, random inputs, every output poisoned */
static void bufs_init(bufs_t* b, int64_t n, int64_t c, int64_t spatial, uint64_t seed) {
  memset(b, POISON, sizeof *b);
  sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, n, c, spatial};
  b->d = d;
  sbn_rng_t r = {seed};
  for (int i = 0; i < MAXE; i++) {
    b->x[i] = (float)sbn_rng_normal(&r);
    b->dy[i] = (float)sbn_rng_normal(&r);
  }
  for (int i = 0; i < MAXC; i++) {
    b->w[i] = 1.0f + 0.1f * (float)i;
    b->b[i] = 0.01f * (float)i;
    b->sm[i] = 0.0f; /* valid saved stats for backward calls */
    b->si[i] = 1.0f;
  }
}

static sbnResult_t fwd(sbnComm_t comm, bufs_t* b, const sbnParams_t* p) {
  return sbnForwardTrain(comm, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm,
                         b->si, p, NULL);
}
static sbnResult_t bwd(sbnComm_t comm, bufs_t* b, const sbnParams_t* p) {
  return sbnBackward(comm, &b->d, b->x, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, p, NULL);
}

static int last_error_set(sbnComm_t comm) {
  const char* e = sbnGetLastError(comm);
  return e != NULL && e[0] != '\0';
}

/* A rejected call: the code, the message, and the buffers byte-for-byte unchanged.
   `call` may reference `a` (a modifiable copy of the argument set) and `bb` (the
   buffers). Records the failure and goes on, so one run lists every bad case. */
#define EXPECT_REJECTED_BUFS(bufp, errcomm, expected, call)                                \
  do {                                                                                     \
    bufs_t snap_;                                                                          \
    memcpy(&snap_, (bufp), sizeof snap_);                                                  \
    sbnResult_t got_ = (call), exp_ = (expected);                                          \
    if (got_ != exp_)                                                                      \
      SBN_FAIL_("%s returned %s, expected %s", #call, sbnGetResultName(got_),              \
                sbnGetResultName(exp_));                                                   \
    if (!last_error_set(errcomm)) SBN_FAIL_("%s: sbnGetLastError is empty", #call);        \
    if (memcmp(&snap_, (bufp), sizeof snap_) != 0)                                         \
      SBN_FAIL_("%s: a rejected call wrote to its buffers", #call);                        \
  } while (0)

/* For calls without op buffers. */
#define EXPECT_REJECTED(errcomm, expected, call)                                           \
  do {                                                                                     \
    sbnResult_t got_ = (call), exp_ = (expected);                                          \
    if (got_ != exp_)                                                                      \
      SBN_FAIL_("%s returned %s, expected %s", #call, sbnGetResultName(got_),              \
                sbnGetResultName(exp_));                                                   \
    if (!last_error_set(errcomm)) SBN_FAIL_("%s: sbnGetLastError is empty", #call);        \
  } while (0)

#define SENTINEL_COMM ((sbnComm_t)(uintptr_t)0x5b5b5b50u)

static sbnConfig_t small_config(void) {
  /* max_channels 8 to test C > max_channels; 10 s timeout bounds any accidental wait */
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  cfg.max_channels = 8;
  cfg.timeout_ms = 10000;
  return cfg;
}

/* ---- results, names, version -------------------------------------------------------- */
static void test_result_strings(void) {
  static const struct { sbnResult_t r; const char* name; const char* text; } table[] = {
#define ROW_(name, value, text) {name, #name, text},
      SBN_RESULT_LIST(ROW_)
#undef ROW_
  };
  const int n = (int)(sizeof table / sizeof table[0]);
  ASSERT_EQ_INT(n, sbnNumResults);
  for (int i = 0; i < n; i++) {
    ASSERT_EQ_INT(table[i].r, i); /* the enum is dense 0..sbnNumResults-1 */
    const char* name = sbnGetResultName(table[i].r);
    const char* text = sbnGetErrorString(table[i].r);
    ASSERT_TRUE(name != NULL && text != NULL);
    if (strcmp(name, table[i].name) != 0) SBN_FAIL_("name of %d: '%s' != '%s'", i, name, table[i].name);
    if (strcmp(text, table[i].text) != 0) SBN_FAIL_("text of %d: '%s' != '%s'", i, text, table[i].text);
    for (int j = 0; j < i; j++) EXPECT_TRUE(strcmp(name, sbnGetResultName(table[j].r)) != 0);
  }
  /* out of range: never NULL, never empty, never a valid code's name */
  const int bad[] = {sbnNumResults, sbnNumResults + 1, -1, 1000, INT_MAX, INT_MIN};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    sbnResult_t r = (sbnResult_t)bad[k];
    const char* name = sbnGetResultName(r);
    const char* text = sbnGetErrorString(r);
    ASSERT_TRUE(name != NULL && text != NULL);
    EXPECT_TRUE(name[0] != '\0' && text[0] != '\0');
    /* the header's words */
    EXPECT_TRUE(strcmp(text, "unknown result code (not an sbnResult_t)") == 0);
    EXPECT_TRUE(strcmp(name, "sbnUnknownResult") == 0);
    for (int j = 0; j < n; j++) EXPECT_TRUE(strcmp(name, table[j].name) != 0);
  }
}

static void test_version(void) {
  int v = -1;
  ASSERT_OK(sbnGetVersion(&v));
  ASSERT_EQ_INT(v, SBN_VERSION_CODE);
  EXPECT_REJECTED(NULL, sbnInvalidArgument, sbnGetVersion(NULL));
}

/* The last-error text starts empty on a fresh thread and on a fresh comm, so the
   non-empty checks elsewhere are meaningful at least for the first failure. */
static void* fresh_thread_error(void* arg) {
  const char* e = sbnGetLastError(NULL);
  *(int*)arg = e != NULL && e[0] == '\0';
  if (sbnGetVersion(NULL) != sbnInvalidArgument) *(int*)arg = 0;
  if (!last_error_set(NULL)) *(int*)arg = 0;
  return NULL;
}
static void test_last_error_fresh(void) {
  int ok = 0;
  pthread_t t;
  ASSERT_TRUE(pthread_create(&t, NULL, fresh_thread_error, &ok) == 0);
  ASSERT_TRUE(pthread_join(t, NULL) == 0);
  EXPECT_TRUE(ok);
  sbnComm_t c = NULL;
  ASSERT_OK(sbnCommInitCpu(&c, 1, NULL));
  const char* e = sbnGetLastError(c);
  ASSERT_TRUE(e != NULL);
  EXPECT_TRUE(e[0] == '\0');
  EXPECT_REJECTED(c, sbnInvalidArgument, sbnCommRank(c, NULL)); /* now it has one */
  ASSERT_OK(sbnCommDestroy(c));
}

/* The text sbnGetLastError returned stays as it was until this thread's next
   sbnGetLastError (syncbn.h), whatever the library does meanwhile: a call refused inside a
   group, that group's sbnGroupEnd and two GPU inits refused by their team's backend each
   read a detail back where they record theirs. */
static void test_last_error_text_stays(void) {
  ASSERT_RES(sbnGetVersion(NULL), sbnInvalidArgument);
  const char* p = sbnGetLastError(NULL);
  char was[512];
  snprintf(was, sizeof was, "%s", p);
  ASSERT_TRUE(strstr(was, "sbnGetVersion") != NULL);
  sbnComm_t comms[2];
  ASSERT_OK(sbnCommInitCpu(comms, 2, NULL));
  static bufs_t b[2];
  for (int r = 0; r < 2; r++) bufs_init(&b[r], 2, 4, 3, 40 + (uint64_t)r);
  ASSERT_OK(sbnGroupStart());
  ASSERT_OK(fwd(comms[0], &b[0], NULL));
  ASSERT_RES(bwd(NULL, &b[1], NULL), sbnInvalidArgument);
  ASSERT_RES(sbnGroupEnd(), sbnInvalidUsage);
  int dev = 4096; /* no such device in any build: refused by the team's backend */
  sbnComm_t v[2];
  EXPECT_TRUE(sbnCommInitAll(v, 1, &dev, NULL) != sbnSuccess);
  EXPECT_TRUE(sbnCommInitVirtual(v, 2, dev, NULL) != sbnSuccess);
  EXPECT_TRUE(strcmp(p, was) == 0);
  if (strcmp(p, was) != 0) fprintf(stderr, "  now \"%s\", was \"%s\"\n", p, was);
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* ---- init ------------------------------------------------------------------------- */
static int comms_untouched(const sbnComm_t* c, int n) {
  for (int i = 0; i < n; i++)
    if (c[i] != SENTINEL_COMM) return 0;
  return 1;
}
#define EXPECT_INIT_REJECTED(expected, call)      \
  do {                                            \
    for (int i_ = 0; i_ < 4; i_++) comms[i_] = SENTINEL_COMM; \
    EXPECT_REJECTED(NULL, expected, call);        \
    if (!comms_untouched(comms, 4)) SBN_FAIL_("%s wrote comms", #call); \
  } while (0)

static void test_init_cpu_bad(void) {
  sbnComm_t comms[4];
  sbnConfig_t cfg;
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(NULL, 2, NULL));
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(comms, 0, NULL));
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(comms, -1, NULL));
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(comms, INT_MIN, NULL));
  EXPECT_INIT_REJECTED(sbnInvalidArgument,
                       sbnCommInitCpu(comms, SBN_MAX_CPU_TEAM_RANKS + 1, NULL)); /* syncbn.h's limit */

  const sbnConfig_t good = SBN_CONFIG_INITIALIZER;
  cfg = good; cfg.size = sizeof(sbnConfig_t) - 1;
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(comms, 2, &cfg));
  cfg = good; cfg.size = 0;
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(comms, 2, &cfg));
  cfg = good; cfg.magic = 0;
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(comms, 2, &cfg));
  cfg = good; cfg.version = SBN_CONFIG_VERSION + 1;
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(comms, 2, &cfg));
  cfg = good; cfg.version = 0;
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(comms, 2, &cfg));
  cfg = good; cfg.timeout_ms = 0;
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(comms, 2, &cfg));
  cfg = good; cfg.timeout_ms = -5;
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(comms, 2, &cfg));
  cfg = good; cfg.max_channels = 0;
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(comms, 2, &cfg));
  cfg = good; cfg.max_channels = -1;
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(comms, 2, &cfg));
  cfg = good; cfg.max_channels = ((int64_t)1 << 20) + 1;
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitCpu(comms, 2, &cfg));
  /* the detail names the init called */
  EXPECT_TRUE(strstr(sbnGetLastError(NULL),
                     "sbnCommInitCpu: config.max_channels must be in [1, 1048576], got 1048577") != NULL);
  cfg = good; cfg.timeout_ms = 0;
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitVirtual(comms, 1, 0, &cfg));
  EXPECT_TRUE(strstr(sbnGetLastError(NULL), "sbnCommInitVirtual: config.timeout_ms must be > 0, got 0") !=
              NULL);

  /* the limits themselves are valid */
  cfg = good; cfg.max_channels = 1; cfg.timeout_ms = 1;
  ASSERT_OK(sbnCommInitCpu(comms, 2, &cfg));
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
  ASSERT_OK(sbnCommInitCpu(comms, 1, NULL));
  ASSERT_OK(sbnCommDestroy(comms[0]));
  cfg = good;
  cfg.max_channels = (int64_t)1 << 20; /* USAGE.md's [1, 2^20] */
  ASSERT_OK(sbnCommInitCpu(comms, 1, &cfg));
  ASSERT_OK(sbnCommDestroy(comms[0]));
  /* a team of SBN_MAX_CPU_TEAM_RANKS ranks (its comms only: no op runs) */
  sbnComm_t* most = calloc(SBN_MAX_CPU_TEAM_RANKS, sizeof *most);
  ASSERT_TRUE(most != NULL);
  cfg = good;
  cfg.max_channels = 1;
  const sbnResult_t r = sbnCommInitCpu(most, SBN_MAX_CPU_TEAM_RANKS, &cfg);
  for (int q = 0; r == sbnSuccess && q < SBN_MAX_CPU_TEAM_RANKS; q++)
    ASSERT_OK(sbnCommDestroy(most[q]));
  free(most);
  ASSERT_OK(r);
}

static void test_init_env_timeout_bad(void) {
  sbnComm_t comms[4];
  /* a non-positive or non-integer SBN_TIMEOUT_MS makes init fail, config or not (an empty
     one is as unset: test_init_env_timeout_empty) */
  const char* bad[] = {"abc", "0", "-5", "12abc", "1.5", " ", "99999999999999999999999", " 400", "400 ",
                       "+400"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ASSERT_TRUE(setenv("SBN_TIMEOUT_MS", bad[i], 1) == 0);
    for (int k = 0; k < 4; k++) comms[k] = SENTINEL_COMM;
    sbnResult_t r = sbnCommInitCpu(comms, 2, NULL);
    if (r != sbnInvalidArgument)
      SBN_FAIL_("SBN_TIMEOUT_MS='%s': init returned %s, expected sbnInvalidArgument", bad[i],
                sbnGetResultName(r));
    if (!last_error_set(NULL)) SBN_FAIL_("SBN_TIMEOUT_MS='%s': no last error", bad[i]);
    if (!comms_untouched(comms, 4)) SBN_FAIL_("SBN_TIMEOUT_MS='%s': comms written", bad[i]);
    if (r == sbnSuccess) { sbnCommDestroy(comms[0]); sbnCommDestroy(comms[1]); }
  }
  ASSERT_TRUE(setenv("SBN_TIMEOUT_MS", "250", 1) == 0);
  sbnResult_t r = sbnCommInitCpu(comms, 2, NULL);
  unsetenv("SBN_TIMEOUT_MS");
  ASSERT_OK(r);
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
}

/* Whether the calling thread's last error (a NULL comm's) says a and, where given, b;
   printed where it does not. */
static int last_reason_says(const char* a, const char* b) {
  const char* why = sbnGetLastError(NULL);
  const int says = strstr(why, a) != NULL && (b == NULL || strstr(why, b) != NULL);
  if (!says) printf("  reason: %s\n", why);
  return says;
}

static void test_init_gpu_args(void) {
  /* NULL/bad args are invalid everywhere. Whether a GPU team can be made depends on the
     build and the machine: a one-rank virtual team on device 0 tells which case this is,
     and each case has its own exact expectations. */
  sbnComm_t comms[SBN_MAX_GPU_TEAM_RANKS + 1];
  const int devs[2] = {0, 1};
  const int bad_dev[2] = {0, 4096};
  static char fake_nccl_storage[64];
  struct ncclComm* fake_nccl = (struct ncclComm*)(void*)fake_nccl_storage;

  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitAll(NULL, 2, devs, NULL));
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitAll(comms, 0, devs, NULL));
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitAll(comms, -2, devs, NULL));
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitAll(comms, 2, NULL, NULL));
  const int neg[1] = {-1};
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitAll(comms, 1, neg, NULL));

  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitVirtual(NULL, 2, 0, NULL));
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitVirtual(comms, 0, 0, NULL));
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitVirtual(comms, -1, 0, NULL));
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitVirtual(comms, 2, -1, NULL));

  sbnResult_t probe = sbnCommInitVirtual(comms, 1, 0, NULL);
  if (probe == sbnSuccess) {
    /* a CUDA device is here: bad device indices are invalid arguments, and teams wider
       than the kernels' parameter block are unsupported */
    printf("  (GPU present: checking GPU-team argument errors)\n");
    ASSERT_OK(sbnCommDestroy(comms[0]));
    EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitAll(comms, 2, bad_dev, NULL));
    EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitVirtual(comms, 2, 4096, NULL));
    EXPECT_INIT_REJECTED(sbnUnsupported,
                         sbnCommInitVirtual(comms, SBN_MAX_GPU_TEAM_RANKS + 1, 0, NULL));
  } else {
    /* no CUDA in this build, or no device: every GPU team is unsupported, with a reason */
    ASSERT_EQ_INT(probe, sbnUnsupported);
#if SBN_TEST_HAVE_CUDA
    /* a CUDA build where the driver library the CUDA runtime loads cannot be loaded: the
       reason says there is no driver, not the runtime's "CUDA driver version is
       insufficient for CUDA runtime version" (which reads as an old driver) */
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY);
    if (driver) {
      dlclose(driver);
    } else {
      printf("  (no libcuda.so.1: checking the reason a GPU team's init gives)\n");
      EXPECT_TRUE(last_reason_says("no NVIDIA driver on this machine (libcuda.so.1 not found)", NULL));
    }
#else
    /* the reason says how to build one that has CUDA */
    EXPECT_TRUE(last_reason_says("has no CUDA", "nvcc on PATH"));
#endif
    EXPECT_INIT_REJECTED(sbnUnsupported, sbnCommInitAll(comms, 2, devs, NULL));
    EXPECT_INIT_REJECTED(sbnUnsupported, sbnCommInitVirtual(comms, 2, 0, NULL));
  }

  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitNccl(NULL, fake_nccl, NULL));
  EXPECT_INIT_REJECTED(sbnInvalidArgument, sbnCommInitNccl(comms, NULL, NULL));
#if !SBN_TEST_HAVE_NCCL
  /* no NCCL in this build: unsupported, and the comm is never looked at; the reason says
     how to build one that has it (CUDA first where the build has none) */
  EXPECT_INIT_REJECTED(sbnUnsupported, sbnCommInitNccl(comms, fake_nccl, NULL));
  EXPECT_TRUE(SBN_TEST_HAVE_CUDA ? last_reason_says("has no NCCL", "SYNCBN_NCCL_ROOT")
                                 : last_reason_says("has no CUDA", "nvcc on PATH"));
#else
  /* with NCCL the comm is handed to NCCL, which must get a real one: NCCL teams are
     tested by tests/gpu/test_nccl_team.c (processes, GPUs) */
  printf("  (NCCL in this build: sbnCommInitNccl on a real comm is test_nccl_team's)\n");
#endif
}

/* ---- comm queries ------------------------------------------------------------------- */
static void test_comm_queries(void) {
  sbnComm_t comms[3];
  sbnConfig_t cfg = small_config();
  ASSERT_OK(sbnCommInitCpu(comms, 3, &cfg));
  for (int i = 0; i < 3; i++) {
    int rank = -1, count = -1;
    sbnResult_t async = sbnNumResults;
    ASSERT_OK(sbnCommRank(comms[i], &rank));
    ASSERT_OK(sbnCommCount(comms[i], &count));
    ASSERT_OK(sbnCommGetAsyncError(comms[i], &async));
    ASSERT_EQ_INT(rank, i);
    ASSERT_EQ_INT(count, 3);
    ASSERT_RES(async, sbnSuccess);
  }
  int v = 12345;
  sbnResult_t async = (sbnResult_t)77;
  EXPECT_REJECTED(NULL, sbnInvalidArgument, sbnCommRank(NULL, &v));
  EXPECT_REJECTED(NULL, sbnInvalidArgument, sbnCommCount(NULL, &v));
  EXPECT_REJECTED(NULL, sbnInvalidArgument, sbnCommGetAsyncError(NULL, &async));
  EXPECT_REJECTED(NULL, sbnInvalidArgument, sbnCommAbort(NULL));
  EXPECT_TRUE(v == 12345 && async == (sbnResult_t)77);
  EXPECT_REJECTED(comms[1], sbnInvalidArgument, sbnCommRank(comms[1], NULL));
  EXPECT_REJECTED(comms[1], sbnInvalidArgument, sbnCommCount(comms[1], NULL));
  EXPECT_REJECTED(comms[1], sbnInvalidArgument, sbnCommGetAsyncError(comms[1], NULL));
  const char* tr = "untouched";
  ASSERT_OK(sbnCommGetTransport(comms[2], &tr));
  ASSERT_TRUE(strcmp(tr, "cpu") == 0);
  tr = "untouched";
  EXPECT_REJECTED(NULL, sbnInvalidArgument, sbnCommGetTransport(NULL, &tr));
  EXPECT_REJECTED(comms[1], sbnInvalidArgument, sbnCommGetTransport(comms[1], NULL));
  EXPECT_TRUE(strcmp(tr, "untouched") == 0);
  ASSERT_OK(sbnCommDestroy(NULL));
  for (int i = 0; i < 3; i++) ASSERT_OK(sbnCommDestroy(comms[i]));
}

/* sbnCommGetKernel: "none" before the first op, then what ran ("cpu" for a CPU team, which
   ignores SBN_KERNEL); a NULL comm or result pointer is rejected, writing nothing. */
static void test_comm_kernel(void) {
  sbnComm_t c = NULL;
  ASSERT_OK(sbnCommInitCpu(&c, 1, NULL));
  const char* k = "untouched";
  ASSERT_OK(sbnCommGetKernel(c, &k));
  ASSERT_TRUE(strcmp(k, "none") == 0);
  static bufs_t b;
  bufs_init(&b, 2, 3, 5, 11);
  ASSERT_OK(setenv("SBN_KERNEL", "no-such-kernel", 1) == 0 ? sbnSuccess : sbnSystemError);
  ASSERT_OK(fwd(c, &b, NULL));
  ASSERT_OK(unsetenv("SBN_KERNEL") == 0 ? sbnSuccess : sbnSystemError);
  ASSERT_OK(sbnCommGetKernel(c, &k));
  ASSERT_TRUE(strcmp(k, "cpu") == 0);
  ASSERT_OK(bwd(c, &b, NULL));
  ASSERT_OK(sbnCommGetKernel(c, &k));
  ASSERT_TRUE(strcmp(k, "cpu") == 0);
  k = "untouched";
  EXPECT_REJECTED(NULL, sbnInvalidArgument, sbnCommGetKernel(NULL, &k));
  EXPECT_REJECTED(c, sbnInvalidArgument, sbnCommGetKernel(c, NULL));
  EXPECT_TRUE(strcmp(k, "untouched") == 0);
  ASSERT_OK(sbnCommDestroy(c));
}

static void test_split_bad(void) {
  sbnComm_t c = NULL, nc = SENTINEL_COMM;
  ASSERT_OK(sbnCommInitCpu(&c, 1, NULL));
  EXPECT_REJECTED(NULL, sbnInvalidArgument, sbnCommSplit(NULL, 0, 0, &nc));
  EXPECT_REJECTED(c, sbnInvalidArgument, sbnCommSplit(c, 0, 0, NULL));
  EXPECT_REJECTED(c, sbnInvalidArgument, sbnCommSplit(c, -2, 0, &nc));
  EXPECT_REJECTED(c, sbnInvalidArgument, sbnCommSplit(c, INT_MIN, 0, &nc));
  EXPECT_TRUE(nc == SENTINEL_COMM);
  /* a team of 1 splits without a group */
  ASSERT_OK(sbnCommSplit(c, SBN_SPLIT_NOCOLOR, 0, &nc));
  EXPECT_TRUE(nc == NULL);
  nc = SENTINEL_COMM;
  ASSERT_OK(sbnCommSplit(c, 7, -3, &nc));
  ASSERT_TRUE(nc != NULL && nc != SENTINEL_COMM);
  int rank = -1, count = -1;
  ASSERT_OK(sbnCommRank(nc, &rank));
  ASSERT_OK(sbnCommCount(nc, &count));
  EXPECT_TRUE(rank == 0 && count == 1);
  ASSERT_OK(sbnCommDestroy(nc));
  ASSERT_OK(sbnCommDestroy(c));
}

/* ---- forward / backward argument checks (one rank, no group) ------------------------ */
static void test_forward_bad_args(void) {
  sbnConfig_t cfg = small_config();
  sbnComm_t c = NULL;
  ASSERT_OK(sbnCommInitCpu(&c, 1, &cfg));
  static bufs_t bb;
  bufs_init(&bb, 2, 3, 5, 1);
  bufs_t* b = &bb;
  const sbnParams_t good = SBN_PARAMS_DEFAULT;
  sbnParams_t p;
  sbnTensorDesc_t d;
#define FWD_(comm, desc, x, y, w, bi, rm, rv, nbt, sm, si, par) \
  sbnForwardTrain(comm, desc, x, y, w, bi, rm, rv, nbt, sm, si, par, NULL)
#define EXPECT_FWD_BAD(comm, desc, x, y, w, bi, rm, rv, nbt, sm, si, par) \
  EXPECT_REJECTED_BUFS(b, (comm) ? (comm) : NULL, sbnInvalidArgument,    \
                       FWD_(comm, desc, x, y, w, bi, rm, rv, nbt, sm, si, par))

  EXPECT_FWD_BAD(NULL, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, NULL);
  EXPECT_FWD_BAD(c, NULL, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, NULL);
  EXPECT_FWD_BAD(c, &b->d, NULL, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, NULL);
  EXPECT_FWD_BAD(c, &b->d, b->x, NULL, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, NULL);
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, NULL, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, NULL);
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, NULL, b->rm, b->rv, &b->nbt, b->sm, b->si, NULL);
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, NULL, b->rv, &b->nbt, b->sm, b->si, NULL);
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, b->rm, NULL, &b->nbt, b->sm, b->si, NULL);
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, NULL, b->si, NULL);
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, NULL, NULL);

  /* descriptors: unknown enums, non-positive sizes, overflow, C > max_channels (8) */
  const sbnTensorDesc_t bad_desc[] = {
      {(sbnDataType_t)3, sbnLayoutNCHW, 2, 3, 5},
      {(sbnDataType_t)-1, sbnLayoutNCHW, 2, 3, 5},
      {sbnFloat32, (sbnLayout_t)2, 2, 3, 5},
      {sbnFloat32, (sbnLayout_t)-1, 2, 3, 5},
      {sbnFloat32, sbnLayoutNCHW, -1, 3, 5},
      {sbnFloat32, sbnLayoutNCHW, INT64_MIN, 3, 5},
      {sbnFloat32, sbnLayoutNCHW, 2, 0, 5},
      {sbnFloat32, sbnLayoutNCHW, 2, -3, 5},
      {sbnFloat32, sbnLayoutNCHW, 2, 3, 0},
      {sbnFloat32, sbnLayoutNCHW, 2, 3, -5},
      {sbnFloat32, sbnLayoutNCHW, (int64_t)1 << 40, 8, (int64_t)1 << 40}, /* n*c*s overflows */
      {sbnFloat32, sbnLayoutNCHW, INT64_MAX, 1, 2},
      /* above 2^48 without overflowing int64 (USAGE.md): n*c*s, and c*s with n = 0 */
      {sbnFloat32, sbnLayoutNCHW, (int64_t)1 << 24, 1, ((int64_t)1 << 24) + 1},
      {sbnFloat32, sbnLayoutNCHW, 0, 1, ((int64_t)1 << 48) + 1},
      {sbnFloat32, sbnLayoutNCHW, 2, 9, 5},  /* c > max_channels */
      {sbnFloat32, sbnLayoutNCHW, 0, 9, 5},  /* ... also for an empty rank */
  };
  for (size_t i = 0; i < sizeof bad_desc / sizeof bad_desc[0]; i++) {
    d = bad_desc[i];
    bufs_t snap;
    memcpy(&snap, b, sizeof snap);
    sbnResult_t r =
        sbnForwardTrain(c, &d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, NULL, NULL);
    if (r != sbnInvalidArgument)
      SBN_FAIL_("forward with bad desc #%zu {dtype %d layout %d n %lld c %lld spatial %lld}: %s", i,
                (int)d.dtype, (int)d.layout, (long long)d.n, (long long)d.c, (long long)d.spatial,
                sbnGetResultName(r));
    if (!last_error_set(c)) SBN_FAIL_("bad desc #%zu: no last error", i);
    if (memcmp(&snap, b, sizeof snap) != 0) SBN_FAIL_("bad desc #%zu: buffers written", i);
  }

  /* params: eps < 0 / NaN, momentum NaN, momentum < 0 without num_batches_tracked,
     unknown grad_mode */
  p = good; p.eps = -1e-5f;
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, &p);
  p = good; p.eps = NAN;
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, &p);
  p = good; p.momentum = NAN;
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, &p);
  p = good; p.eps = INFINITY; /* infinite eps or momentum (USAGE.md) */
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, &p);
  p = good; p.momentum = INFINITY;
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, &p);
  p = good; p.momentum = -INFINITY;
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, &p);
  p = good; p.momentum = -1.0f;
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, NULL, b->sm, b->si, &p);
  p = good; p.grad_mode = (sbnGradMode_t)2;
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, &p);
  p = good; p.grad_mode = (sbnGradMode_t)-1;
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, &p);

  /* M == 1 on a single rank (n = 1, spatial = 1): rejected after the (trivial)
     exchange, nothing written, num_batches_tracked included */
  bufs_init(b, 1, 3, 1, 2);
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm, b->si, NULL);
  b->d.n = 1; b->d.spatial = 1; b->d.layout = sbnLayoutNHWC;
  EXPECT_FWD_BAD(c, &b->d, b->x, b->y, NULL, NULL, NULL, NULL, NULL, b->sm, b->si, NULL);

  /* the same call with valid arguments succeeds (the comm survived all of the above) */
  bufs_init(b, 2, 3, 5, 3);
  b->nbt = 0;
  for (int i = 0; i < 3; i++) { b->rm[i] = 0.0f; b->rv[i] = 1.0f; }
  ASSERT_OK(fwd(c, b, NULL));
  ASSERT_EQ_INT(b->nbt, 1);
  /* n == 0: x and y may be NULL; M == 0 is a success */
  b->d.n = 0;
  ASSERT_OK(sbnForwardTrain(c, &b->d, NULL, NULL, b->w, b->b, b->rm, b->rv, &b->nbt, b->sm,
                            b->si, NULL, NULL));
  ASSERT_EQ_INT(b->nbt, 2);
  ASSERT_OK(sbnCommDestroy(c));
#undef EXPECT_FWD_BAD
#undef FWD_
}

static void test_backward_bad_args(void) {
  sbnConfig_t cfg = small_config();
  sbnComm_t c = NULL;
  ASSERT_OK(sbnCommInitCpu(&c, 1, &cfg));
  static bufs_t bb;
  bufs_init(&bb, 2, 3, 5, 4);
  bufs_t* b = &bb;
  const sbnParams_t good = SBN_PARAMS_DEFAULT;
  sbnParams_t p;
#define BWD_(comm, desc, x, dy, dx, w, sm, si, dw, db, par) \
  sbnBackward(comm, desc, x, dy, dx, w, sm, si, dw, db, par, NULL)
#define EXPECT_BWD_BAD(comm, desc, x, dy, dx, w, sm, si, dw, db, par) \
  EXPECT_REJECTED_BUFS(b, (comm) ? (comm) : NULL, sbnInvalidArgument, \
                       BWD_(comm, desc, x, dy, dx, w, sm, si, dw, db, par))

  EXPECT_BWD_BAD(NULL, &b->d, b->x, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, NULL);
  EXPECT_BWD_BAD(c, NULL, b->x, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, NULL);
  EXPECT_BWD_BAD(c, &b->d, NULL, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, NULL);
  EXPECT_BWD_BAD(c, &b->d, b->x, NULL, b->dx, b->w, b->sm, b->si, b->dw, b->db, NULL);
  EXPECT_BWD_BAD(c, &b->d, b->x, b->dy, b->dx, b->w, NULL, b->si, b->dw, b->db, NULL);
  EXPECT_BWD_BAD(c, &b->d, b->x, b->dy, b->dx, b->w, b->sm, NULL, b->dw, b->db, NULL);
  p = good; p.grad_mode = (sbnGradMode_t)2;
  EXPECT_BWD_BAD(c, &b->d, b->x, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, &p);
  p = good; p.grad_mode = (sbnGradMode_t)-7;
  EXPECT_BWD_BAD(c, &b->d, b->x, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, &p);

  const sbnTensorDesc_t base = b->d;
  sbnTensorDesc_t d;
  d = base; d.dtype = (sbnDataType_t)3;
  EXPECT_BWD_BAD(c, &d, b->x, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, NULL);
  d = base; d.layout = (sbnLayout_t)5;
  EXPECT_BWD_BAD(c, &d, b->x, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, NULL);
  d = base; d.n = -2;
  EXPECT_BWD_BAD(c, &d, b->x, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, NULL);
  d = base; d.c = 0;
  EXPECT_BWD_BAD(c, &d, b->x, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, NULL);
  d = base; d.spatial = 0;
  EXPECT_BWD_BAD(c, &d, b->x, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, NULL);
  d = base; d.n = (int64_t)1 << 40; d.c = 4; d.spatial = (int64_t)1 << 40;
  EXPECT_BWD_BAD(c, &d, b->x, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, NULL);
  d = base; d.c = 9; /* > max_channels */
  EXPECT_BWD_BAD(c, &d, b->x, b->dy, b->dx, b->w, b->sm, b->si, b->dw, b->db, NULL);

  /* valid: dx, weight, dweight, dbias NULL; x/dy NULL when n == 0 */
  ASSERT_OK(sbnBackward(c, &b->d, b->x, b->dy, NULL, NULL, b->sm, b->si, NULL, NULL, NULL, NULL));
  b->d.n = 0;
  ASSERT_OK(sbnBackward(c, &b->d, NULL, NULL, NULL, b->w, b->sm, b->si, b->dw, b->db, NULL, NULL));
  EXPECT_TRUE(b->dw[0] == 0.0f && b->db[2] == 0.0f); /* M == 0: zero grads */
  ASSERT_OK(sbnCommDestroy(c));
#undef EXPECT_BWD_BAD
#undef BWD_
}

static void test_inference_bad_args(void) {
  static bufs_t bb;
  bufs_init(&bb, 2, 3, 5, 5);
  bufs_t* b = &bb;
  for (int i = 0; i < MAXC; i++) { b->rm[i] = 0.5f; b->rv[i] = 2.0f; }
  const sbnTensorDesc_t base = b->d;
  sbnTensorDesc_t d = base;
#define INF_(desc, x, y, w, bi, rm, rv, eps) sbnForwardInference(desc, x, y, w, bi, rm, rv, eps, NULL)
#define EXPECT_INF_BAD(desc, x, y, w, bi, rm, rv, eps) \
  EXPECT_REJECTED_BUFS(b, NULL, sbnInvalidArgument, INF_(desc, x, y, w, bi, rm, rv, eps))

  EXPECT_INF_BAD(NULL, b->x, b->y, b->w, b->b, b->rm, b->rv, 1e-5f);
  EXPECT_INF_BAD(&d, NULL, b->y, b->w, b->b, b->rm, b->rv, 1e-5f);
  EXPECT_INF_BAD(&d, b->x, NULL, b->w, b->b, b->rm, b->rv, 1e-5f);
  EXPECT_INF_BAD(&d, b->x, b->y, NULL, b->b, b->rm, b->rv, 1e-5f);
  EXPECT_INF_BAD(&d, b->x, b->y, b->w, NULL, b->rm, b->rv, 1e-5f);
  EXPECT_INF_BAD(&d, b->x, b->y, b->w, b->b, NULL, b->rv, 1e-5f);
  EXPECT_INF_BAD(&d, b->x, b->y, b->w, b->b, b->rm, NULL, 1e-5f);
  EXPECT_INF_BAD(&d, b->x, b->y, b->w, b->b, b->rm, b->rv, -1e-5f);
  EXPECT_INF_BAD(&d, b->x, b->y, b->w, b->b, b->rm, b->rv, NAN);
  EXPECT_INF_BAD(&d, b->x, b->y, b->w, b->b, b->rm, b->rv, INFINITY);
  /* y shares a byte with another buffer: its last element is running_mean's first; weight
     inside y */
  const int64_t numel = base.n * base.c * base.spatial;
  EXPECT_INF_BAD(&d, b->x, b->y, b->w, b->b, b->y + numel - 1, b->rv, 1e-5f);
  EXPECT_INF_BAD(&d, b->x, b->y, b->y + 5, b->b, b->rm, b->rv, 1e-5f);
  /* more than 2^48 elements (n == 0 counts c * spatial alone) */
  d = base; d.n = 0; d.c = 1; d.spatial = ((int64_t)1 << 48) + 1;
  EXPECT_INF_BAD(&d, NULL, NULL, b->w, b->b, b->rm, b->rv, 1e-5f);
  d = base; d.dtype = (sbnDataType_t)9;
  EXPECT_INF_BAD(&d, b->x, b->y, b->w, b->b, b->rm, b->rv, 1e-5f);
  d = base; d.layout = (sbnLayout_t)-1;
  EXPECT_INF_BAD(&d, b->x, b->y, b->w, b->b, b->rm, b->rv, 1e-5f);
  d = base; d.n = -1;
  EXPECT_INF_BAD(&d, b->x, b->y, b->w, b->b, b->rm, b->rv, 1e-5f);
  d = base; d.c = 0;
  EXPECT_INF_BAD(&d, b->x, b->y, b->w, b->b, b->rm, b->rv, 1e-5f);
  d = base; d.spatial = -1;
  EXPECT_INF_BAD(&d, b->x, b->y, b->w, b->b, b->rm, b->rv, 1e-5f);
  d = base; d.n = INT64_MAX; d.spatial = 3;
  EXPECT_INF_BAD(&d, b->x, b->y, b->w, b->b, b->rm, b->rv, 1e-5f);

  /* valid: affine=False; n == 0 with NULL x/y; n == 1 is fine in eval mode */
  d = base;
  ASSERT_OK(sbnForwardInference(&d, b->x, b->y, NULL, NULL, b->rm, b->rv, 1e-5f, NULL));
  d.n = 0;
  ASSERT_OK(sbnForwardInference(&d, NULL, NULL, b->w, b->b, b->rm, b->rv, 1e-5f, NULL));
  d.n = 1; d.spatial = 1;
  ASSERT_OK(sbnForwardInference(&d, b->x, b->y, b->w, b->b, b->rm, b->rv, 0.0f, NULL));
  d.n = 0; d.c = 1; d.spatial = (int64_t)1 << 48; /* 2^48 exactly: not above the bound */
  ASSERT_OK(sbnForwardInference(&d, NULL, NULL, b->w, b->b, b->rm, b->rv, 1e-5f, NULL));
#undef EXPECT_INF_BAD
#undef INF_
}

/* ---- M == 1 across a team of 2 (n = {1, 0}) ------------------------------------------- */
typedef struct {
  sbnComm_t comm;
  bufs_t* b;
  sbnResult_t r;
} rank_call_t;
static void* fwd_thread(void* arg) {
  rank_call_t* a = (rank_call_t*)arg;
  a->r = fwd(a->comm, a->b, NULL);
  return NULL;
}

static void test_global_count_one_team(void) {
  sbnConfig_t cfg = small_config();
  sbnComm_t comms[2];
  ASSERT_OK(sbnCommInitCpu(comms, 2, &cfg));
  static bufs_t b[2], snap[2];
  bufs_init(&b[0], 1, 3, 1, 10);
  bufs_init(&b[1], 0, 3, 1, 11);
  memcpy(snap, b, sizeof snap);

  /* thread per rank: each rank sees sbnInvalidArgument */
  rank_call_t a[2] = {{comms[0], &b[0], sbnSuccess}, {comms[1], &b[1], sbnSuccess}};
  pthread_t t[2];
  for (int r = 0; r < 2; r++) ASSERT_TRUE(pthread_create(&t[r], NULL, fwd_thread, &a[r]) == 0);
  for (int r = 0; r < 2; r++) ASSERT_TRUE(pthread_join(t[r], NULL) == 0);
  for (int r = 0; r < 2; r++) {
    if (a[r].r != sbnInvalidArgument)
      SBN_FAIL_("M == 1, rank %d returned %s, expected sbnInvalidArgument", r, sbnGetResultName(a[r].r));
    if (!last_error_set(comms[r])) SBN_FAIL_("M == 1: rank %d has no last error", r);
  }
  ASSERT_MEMEQ(b, snap, sizeof b);

  /* group mode: the queued calls are fine, sbnGroupEnd reports the failure */
  ASSERT_OK(sbnGroupStart());
  ASSERT_OK(fwd(comms[0], &b[0], NULL));
  ASSERT_OK(fwd(comms[1], &b[1], NULL));
  EXPECT_REJECTED(NULL, sbnInvalidArgument, sbnGroupEnd());
  ASSERT_MEMEQ(b, snap, sizeof b);

  /* the team still works: M = 2 */
  b[1].d.n = 1;
  ASSERT_OK(sbnGroupStart());
  ASSERT_OK(fwd(comms[0], &b[0], NULL));
  ASSERT_OK(fwd(comms[1], &b[1], NULL));
  ASSERT_OK(sbnGroupEnd());
  ASSERT_BITEQ_F32(b[0].sm[0], b[1].sm[0]);
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* ---- groups --------------------------------------------------------------------------- */
/* num_batches_tracked at INT64_MAX with the cumulative average (momentum < 0): the factor
   1 / (count + 1) and the count's increment without signed overflow (undefined behaviour,
   which UBSan reports in the asan build); the count wraps as PyTorch's int64 add does, and
   the running statistics stay finite (the factor ~1e-19: they barely move). */
static void test_batches_tracked_at_int64_max(void) {
  sbnConfig_t cfg = small_config();
  sbnComm_t comm;
  ASSERT_OK(sbnCommInitCpu(&comm, 1, &cfg));
  static bufs_t b;
  bufs_init(&b, 2, 4, 3, 77);
  b.nbt = INT64_MAX;
  for (int i = 0; i < 4; i++) b.rm[i] = 0.0f, b.rv[i] = 1.0f;
  const sbnParams_t cumulative = {1e-5f, -1.0f, sbnGradLocal};
  ASSERT_OK(fwd(comm, &b, &cumulative));
  ASSERT_TRUE(b.nbt == INT64_MIN);
  for (int i = 0; i < 4; i++) {
    ASSERT_TRUE(fabsf(b.rm[i]) < 1e-6f); /* from 0 */
    ASSERT_TRUE(fabsf(b.rv[i] - 1.0f) < 1e-6f); /* from 1 */
  }
  ASSERT_OK(sbnCommDestroy(comm));
}

static void test_group_end_without_start(void) {
  EXPECT_REJECTED(NULL, sbnInvalidUsage, sbnGroupEnd());
  /* balanced pairs work, also empty and nested ones */
  ASSERT_OK(sbnGroupStart());
  ASSERT_OK(sbnGroupEnd());
  EXPECT_REJECTED(NULL, sbnInvalidUsage, sbnGroupEnd());
}

/* One call of the group is rejected: the others' valid calls were queued; sbnGroupEnd
   runs nothing and every buffer stays as it was. The team is usable afterwards. */
static void test_group_with_rejected_call(void) {
  sbnConfig_t cfg = small_config();
  sbnComm_t comms[3];
  ASSERT_OK(sbnCommInitCpu(comms, 3, &cfg));
  static bufs_t b[3], snap[3];
  for (int r = 0; r < 3; r++) bufs_init(&b[r], 2, 4, 3, 20 + (uint64_t)r);
  memcpy(snap, b, sizeof snap);

  char detail[512], want[600];
  ASSERT_OK(sbnGroupStart());
  ASSERT_OK(fwd(comms[0], &b[0], NULL));
  EXPECT_REJECTED(comms[1], sbnInvalidArgument,
                  sbnForwardTrain(comms[1], &b[1].d, b[1].x, b[1].y, b[1].w, b[1].b, b[1].rm,
                                  b[1].rv, &b[1].nbt, NULL, b[1].si, NULL, NULL));
  snprintf(detail, sizeof detail, "%s", sbnGetLastError(comms[1]));
  ASSERT_OK(fwd(comms[1], &b[1], NULL)); /* a valid retry does not rescue the group */
  ASSERT_OK(fwd(comms[2], &b[2], NULL));
  EXPECT_REJECTED(NULL, sbnInvalidUsage, sbnGroupEnd());
  ASSERT_MEMEQ(b, snap, sizeof b);
  /* sbnGroupEnd's message (the README's sbnGetLastError(NULL)) carries the failed call's
     detail: it said only which result the call had */
  snprintf(want, sizeof want, "a call in this group failed (sbnInvalidArgument: %s)", detail);
  EXPECT_TRUE(strncmp(detail, "sbnForwardTrain: ", 17) == 0);
  EXPECT_TRUE(strstr(sbnGetLastError(NULL), want) != NULL);

  /* same for backward, with a NULL comm as the bad call (its detail names the call) */
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 3; r++) ASSERT_OK(bwd(comms[r], &b[r], NULL));
  EXPECT_REJECTED(NULL, sbnInvalidArgument, bwd(NULL, &b[0], NULL));
  EXPECT_REJECTED(NULL, sbnInvalidUsage, sbnGroupEnd());
  ASSERT_MEMEQ(b, snap, sizeof b);
  EXPECT_TRUE(strstr(sbnGetLastError(NULL), "(sbnInvalidArgument: sbnBackward: comm is NULL)") != NULL);

  /* a refused sbnCommDestroy of a comm with ops queued is a failed call of the group too:
     sbnGroupEnd runs nothing (it ran the ops) */
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 3; r++) ASSERT_OK(fwd(comms[r], &b[r], NULL));
  EXPECT_REJECTED(comms[0], sbnInvalidUsage, sbnCommDestroy(comms[0]));
  EXPECT_REJECTED(NULL, sbnInvalidUsage, sbnGroupEnd());
  ASSERT_MEMEQ(b, snap, sizeof b);
  EXPECT_TRUE(strstr(sbnGetLastError(NULL), "(sbnInvalidUsage: sbnCommDestroy: the comm has ops queued") != NULL);

  /* a bad split inside a group also fails the whole group */
  sbnComm_t nc[3] = {SENTINEL_COMM, SENTINEL_COMM, SENTINEL_COMM};
  ASSERT_OK(sbnGroupStart());
  ASSERT_OK(sbnCommSplit(comms[0], 0, 0, &nc[0]));
  EXPECT_REJECTED(comms[1], sbnInvalidArgument, sbnCommSplit(comms[1], -5, 0, &nc[1]));
  ASSERT_OK(sbnCommSplit(comms[2], 0, 0, &nc[2]));
  EXPECT_REJECTED(NULL, sbnInvalidUsage, sbnGroupEnd());
  EXPECT_TRUE(comms_untouched(nc, 3));

  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 3; r++) ASSERT_OK(fwd(comms[r], &b[r], NULL));
  ASSERT_OK(sbnGroupEnd());
  EXPECT_TRUE(b[0].nbt == snap[0].nbt + 1);
  for (int r = 0; r < 3; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

static void test_group_rank_missing(void) {
  sbnConfig_t cfg = small_config();
  sbnComm_t comms[3];
  ASSERT_OK(sbnCommInitCpu(comms, 3, &cfg));
  static bufs_t b[3], snap[3];
  for (int r = 0; r < 3; r++) bufs_init(&b[r], 2, 4, 3, 30 + (uint64_t)r);
  memcpy(snap, b, sizeof snap);

  ASSERT_OK(sbnGroupStart()); /* rank 2 missing */
  ASSERT_OK(fwd(comms[0], &b[0], NULL));
  ASSERT_OK(fwd(comms[1], &b[1], NULL));
  EXPECT_REJECTED(NULL, sbnInvalidUsage, sbnGroupEnd());
  { /* the message names the team: a group may hold several; the thread's detail and
       every queued comm's (sbnGetErrorString: "sbnGetLastError(comm) has the detail";
       the comms' read "") */
    char want[96];
    snprintf(want, sizeof want, "incomplete team of 3 ranks (that of comm %p, rank 0)", (void*)comms[0]);
    EXPECT_TRUE(strstr(sbnGetLastError(NULL), want) != NULL);
    for (int r = 0; r < 2; r++) EXPECT_TRUE(strstr(sbnGetLastError(comms[r]), want) != NULL);
  }
  ASSERT_MEMEQ(b, snap, sizeof b);

  ASSERT_OK(sbnGroupStart()); /* unequal op counts: rank 1 has two */
  ASSERT_OK(fwd(comms[0], &b[0], NULL));
  ASSERT_OK(fwd(comms[1], &b[1], NULL));
  ASSERT_OK(fwd(comms[1], &b[1], NULL));
  ASSERT_OK(fwd(comms[2], &b[2], NULL));
  EXPECT_REJECTED(NULL, sbnInvalidUsage, sbnGroupEnd());
  ASSERT_MEMEQ(b, snap, sizeof b);

  /* nested: the inner end runs nothing, the outer one runs everything */
  ASSERT_OK(sbnGroupStart());
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 3; r++) ASSERT_OK(fwd(comms[r], &b[r], NULL));
  ASSERT_OK(sbnGroupEnd());
  ASSERT_MEMEQ(b, snap, sizeof b);
  ASSERT_OK(sbnGroupEnd());
  for (int r = 0; r < 3; r++) ASSERT_EQ_INT(b[r].nbt, snap[r].nbt + 1);
  ASSERT_BITEQ_F32(b[0].si[3], b[2].si[3]);
  for (int r = 0; r < 3; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* Ranks disagree on the op: every rank fails with sbnInvalidUsage, nothing is written,
   and the team keeps working. */
static void test_op_mismatch(void) {
  sbnConfig_t cfg = small_config();
  sbnComm_t comms[2];
  ASSERT_OK(sbnCommInitCpu(comms, 2, &cfg));
  static bufs_t b[2], snap[2];
  for (int variant = 0; variant < 4; variant++) {
    for (int r = 0; r < 2; r++) bufs_init(&b[r], 2 + r, 4, 3, 40 + (uint64_t)r);
    if (variant == 1) b[1].d.c = 3;                   /* channels differ */
    if (variant == 2) b[1].d.layout = sbnLayoutNHWC;  /* layout differs */
    if (variant == 3) b[1].d.dtype = sbnBFloat16;     /* dtype differs */
    memcpy(snap, b, sizeof snap);
    ASSERT_OK(sbnGroupStart());
    ASSERT_OK(fwd(comms[0], &b[0], NULL));
    if (variant == 0)
      ASSERT_OK(bwd(comms[1], &b[1], NULL)); /* forward on rank 0, backward on rank 1 */
    else
      ASSERT_OK(fwd(comms[1], &b[1], NULL));
    sbnResult_t r = sbnGroupEnd();
    if (r != sbnInvalidUsage)
      SBN_FAIL_("mismatch variant %d: sbnGroupEnd returned %s, expected sbnInvalidUsage",
                variant, sbnGetResultName(r));
    for (int k = 0; k < 2; k++)
      if (!last_error_set(comms[k])) SBN_FAIL_("mismatch variant %d: rank %d has no last error", variant, k);
    if (memcmp(b, snap, sizeof b) != 0) SBN_FAIL_("mismatch variant %d: buffers written", variant);

    /* usable afterwards: a matching group succeeds */
    for (int k = 0; k < 2; k++) bufs_init(&b[k], 2 + k, 4, 3, 50 + (uint64_t)k);
    ASSERT_OK(sbnGroupStart());
    ASSERT_OK(fwd(comms[0], &b[0], NULL));
    ASSERT_OK(fwd(comms[1], &b[1], NULL));
    ASSERT_OK(sbnGroupEnd());
    ASSERT_MEMEQ(b[0].sm, b[1].sm, 4 * sizeof(float));
    ASSERT_MEMEQ(b[0].si, b[1].si, 4 * sizeof(float));
  }
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* A rank whose layout is immaterial (n = 0, spatial = 1: the same bytes in NCHW and NHWC)
   runs with peers of either layout: an NHWC rank, an empty NCHW one and a 1x1 NCHW one
   give the batch norm of all their values (double reference), the same statistics on
   every rank. Two ranks whose layouts matter and differ: every rank fails, the empty one
   too, and nothing is written. */
static void test_layout_immaterial_ranks(void) {
  sbnConfig_t cfg = small_config();
  sbnComm_t comms[3];
  ASSERT_OK(sbnCommInitCpu(comms, 3, &cfg));
  static bufs_t b[3], snap[3];
  const int64_t C = 4;
  for (int variant = 0; variant < 2; variant++) {
    bufs_init(&b[0], 2, C, 3, 60);
    b[0].d.layout = sbnLayoutNHWC;
    bufs_init(&b[1], 0, C, 5, 61);
    bufs_init(&b[2], 3, C, variant == 0 ? 1 : 2, 62); /* variant 1: NCHW that matters */
    memcpy(snap, b, sizeof snap);
    ASSERT_OK(sbnGroupStart());
    for (int r = 0; r < 3; r++) ASSERT_OK(fwd(comms[r], &b[r], NULL));
    sbnResult_t res = sbnGroupEnd();
    if (variant == 1) {
      ASSERT_RES(res, sbnInvalidUsage);
      ASSERT_MEMEQ(b, snap, sizeof b);
      continue;
    }
    ASSERT_RES(res, sbnSuccess);
    for (int64_t c = 0; c < C; c++) {
      double s = 0.0, ss = 0.0, cnt = 0.0;
      for (int r = 0; r < 3; r += 2)
        for (int64_t i = 0; i < b[r].d.n * b[r].d.spatial; i++) { /* rank 2: n*C + c either way */
          const double v = b[r].x[i * C + c];
          s += v, ss += v * v, cnt += 1.0;
        }
      const double mean = s / cnt, invstd = 1.0 / sqrt(ss / cnt - mean * mean + 1e-5);
      for (int r = 0; r < 3; r += 2)
        for (int64_t i = 0; i < b[r].d.n * b[r].d.spatial; i++) {
          const double want = (b[r].x[i * C + c] - mean) * invstd * b[r].w[c] + b[r].b[c];
          EXPECT_TRUE(fabs(b[r].y[i * C + c] - want) < 1e-5);
        }
      for (int r = 0; r < 3; r++) EXPECT_TRUE(fabs(b[r].sm[c] - mean) < 1e-6);
    }
    for (int r = 1; r < 3; r++) {
      ASSERT_MEMEQ(b[r].sm, b[0].sm, C * sizeof(float));
      ASSERT_MEMEQ(b[r].si, b[0].si, C * sizeof(float));
    }
  }
  for (int r = 0; r < 3; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

/* C = 1: a layout is immaterial too (the bytes of (n, 1, spatial) are the same in NCHW and
   NHWC), whatever n and spatial: ranks of 3 and 2 planes of 4 positions naming NHWC and
   NCHW run together (forward and backward), with the bits of the team that names NCHW on
   every rank, and the double reference's values. */
static void test_layout_one_channel(void) {
  sbnConfig_t cfg = small_config();
  sbnComm_t comms[2];
  ASSERT_OK(sbnCommInitCpu(comms, 2, &cfg));
  static bufs_t b[2][2];
  for (int mixed = 0; mixed < 2; mixed++) {
    for (int r = 0; r < 2; r++) bufs_init(&b[mixed][r], 3 - r, 1, 4, 70 + (uint64_t)r);
    if (mixed) b[mixed][0].d.layout = sbnLayoutNHWC;
    ASSERT_OK(sbnGroupStart());
    for (int r = 0; r < 2; r++) ASSERT_OK(fwd(comms[r], &b[mixed][r], NULL));
    ASSERT_OK(sbnGroupEnd());
    ASSERT_OK(sbnGroupStart());
    for (int r = 0; r < 2; r++) ASSERT_OK(bwd(comms[r], &b[mixed][r], NULL));
    ASSERT_OK(sbnGroupEnd());
  }
  double s = 0.0, ss = 0.0, cnt = 0.0;
  for (int r = 0; r < 2; r++)
    for (int64_t i = 0; i < b[1][r].d.n * 4; i++) s += b[1][r].x[i], ss += (double)b[1][r].x[i] * b[1][r].x[i], cnt += 1.0;
  const double mean = s / cnt, invstd = 1.0 / sqrt(ss / cnt - mean * mean + 1e-5);
  for (int r = 0; r < 2; r++) {
    ASSERT_MEMEQ(b[1][r].y, b[0][r].y, (size_t)b[0][r].d.n * 4 * sizeof(float));
    ASSERT_MEMEQ(b[1][r].dx, b[0][r].dx, (size_t)b[0][r].d.n * 4 * sizeof(float));
    ASSERT_MEMEQ(b[1][r].sm, b[0][r].sm, sizeof(float));
    ASSERT_MEMEQ(b[1][r].si, b[0][r].si, sizeof(float));
    EXPECT_TRUE(fabs(b[1][r].sm[0] - mean) < 1e-6);
    for (int64_t i = 0; i < b[1][r].d.n * 4; i++)
      EXPECT_TRUE(fabs(b[1][r].y[i] - ((b[1][r].x[i] - mean) * invstd * b[1][r].w[0] + b[1][r].b[0])) < 1e-5);
  }
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

int main(void) {
  unsetenv("SBN_TIMEOUT_MS"); /* the tests set their own timeouts */
  SBN_RUN(test_result_strings);
  SBN_RUN(test_version);
  SBN_RUN(test_last_error_fresh);
  SBN_RUN(test_last_error_text_stays);
  SBN_RUN(test_init_cpu_bad);
  SBN_RUN(test_init_env_timeout_bad);
  SBN_RUN(test_init_gpu_args);
  SBN_RUN(test_comm_queries);
  SBN_RUN(test_comm_kernel);
  SBN_RUN(test_split_bad);
  SBN_RUN(test_forward_bad_args);
  SBN_RUN(test_backward_bad_args);
  SBN_RUN(test_inference_bad_args);
  SBN_RUN(test_global_count_one_team);
  SBN_RUN(test_batches_tracked_at_int64_max);
  SBN_RUN(test_group_end_without_start);
  SBN_RUN(test_group_with_rejected_call);
  SBN_RUN(test_group_rank_missing);
  SBN_RUN(test_op_mismatch);
  SBN_RUN(test_layout_immaterial_ranks);
  SBN_RUN(test_layout_one_channel);
  return sbn_test_exit();
}
