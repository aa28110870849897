/* test_nccl_stub.c — libsyncbn's NCCL protocol without a GPU: the library's objects linked
 * with a stand-in CUDA runtime (cudart_stub.c: memory, streams, no-op kernels) and a
 * stand-in libnccl.so.2 (nccl_stub.c) that behaves as NCCL 2.28.9 does on nonblocking
 * comms: a call returns ncclSuccess while its operation is still in progress, a call on a
 * comm in progress is refused, a split's child is written only when the parent's part is
 * done, and a peer that never comes is an operation that never finishes.
 *
 * What it checks, through the public API (SBN_ALGO=nccl: every op on the host path):
 *   - sbnCommInitNccl from a blocking and from a nonblocking caller comm (the latter handed
 *     over still initialising), on both transports (nccl-lsa: ncclMemAlloc and
 *     ncclCommWindowRegister; SBN_NCCL_TRANSPORT=host), ops, sbnCommSplit with and without
 *     a colour, sbnCommAbort, sbnCommDestroy; sbnCommInitAll's NCCL comms (two stand-in
 *     devices: ncclCommInitRankConfig in a group, a group of ncclAllGather, finalize);
 *   - that the stand-in saw no violation (nccl_stub.h: a call on a comm in progress, an
 *     output slot on the stack, a use after abort) and that every comm the library made is
 *     released (live comms);
 *   - a peer that never comes, at every NCCL call that waits for peers: sbnTimeout (not
 *     before timeout_ms; no upper bound is asserted: a hang is CTest's timeout), the
 *     caller's comm left to the caller, the team's own comm aborted;
 *   - a rank whose init fails (each of its callocs and thread starts in turn) tells its
 *     peers through the agreement (the record's values), and leaves nothing behind; an
 *     sbnCommSplit fails on no rank before the parent's ncclCommSplit;
 *   - a group of an sbnCommInitAll team's ranks that one rank's plan refuses
 *     (SBN_KERNEL=onchip) launches no kernel and leaves the team usable;
 *   - the cooperative path's host code, from what the stand-in logs of each launch (grid,
 *     block, dynamic shared memory, stream, argument block) and of the streams (events
 *     recorded and waited for): the plan, the arguments, the streams joined, the refusals
 *     (nothing launched), the current device kept, every runtime object given back.
 * The kernels are no-ops here: no value is checked (the GPU suites do that).
 * Environment: the stand-in's (NCCL_STUB_POLLS, NCCL_STUB_RETURN) as CTest sets them. */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv, clock_gettime */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <nccl.h>
#include <pthread.h>
#include <time.h>

#include "coop_args.h" /* sbn_rank_state_t: the stop words the abort writes */
#include "gpu/gpu_internal.h" /* sbn_gpu_stop_words: the launch's stop slots */
#include "cudart_stub.h"
#include "harness.h"
#include "nccl_stub.h"

#define TIMEOUT_MS 20000 /* never reached by the cases that succeed */
#define CHECK_()                      \
  do {                                \
    if (sbn_test_cur_failed_) return; \
  } while (0)
#define STUCK_TIMEOUT_MS 300

/* ---- the stand-in's record ---------------------------------------------------------------- */
static void print_record(void) {
  fprintf(stderr, "stand-in NCCL's record:\n%s", nccl_stub_log());
}

/* Starts a case: the stand-in forgets its record; `hang` (or NULL) is NCCL_STUB_HANG. */
static void stub_case(const char* hang) {
  if (hang != NULL)
    setenv("NCCL_STUB_HANG", hang, 1);
  else
    unsetenv("NCCL_STUB_HANG");
  unsetenv("SBN_SM_MARGIN"); /* a case that failed between its setenv and unsetenv */
  nccl_stub_reset();
  cudart_stub_reset();
}

/* Neither stand-in saw a violation. */
#define ASSERT_CLEAN()                                                                       \
  do {                                                                                       \
    if (nccl_stub_violations() != 0) {                                                       \
      SBN_FAIL_("the stand-in NCCL saw %d violation(s)", nccl_stub_violations());            \
      print_record();                                                                        \
      return;                                                                                \
    }                                                                                        \
    if (cudart_stub_violations() != 0) {                                                     \
      SBN_FAIL_("the stand-in CUDA runtime saw %d violation(s), the last: %s",               \
                cudart_stub_violations(), cudart_stub_last_violation());                     \
      return;                                                                                \
    }                                                                                        \
  } while (0)

/* The first line of the record at or after `from` (a place in nccl_stub_log()) that
   begins with `prefix`, or NULL. */
static const char* record_line_from(const char* from, const char* prefix) {
  const char* log = nccl_stub_log();
  for (const char* p = from; (p = strstr(p, prefix)) != NULL; p++)
    if (p == log || p[-1] == '\n') return p; /* at a line's beginning */
  return NULL;
}

/* The record's first line that begins with `prefix`, or NULL. */
static const char* record_line(const char* prefix) {
  return record_line_from(nccl_stub_log(), prefix);
}

/* The record has these lines' beginnings, in this order (other lines between them). */
static int record_has(const char* const* lines, int n) {
  const char* at = nccl_stub_log();
  for (int i = 0; i < n; i++) {
    const char* p = record_line_from(at, lines[i]);
    if (p == NULL) {
      fprintf(stderr, "the record lacks '%s' (after the lines before it)\n", lines[i]);
      print_record();
      return 0;
    }
    at = p + strlen(lines[i]);
  }
  return 1;
}
#define ASSERT_RECORD(...)                                              \
  do {                                                                  \
    static const char* const lines_[] = {__VA_ARGS__};                  \
    if (!record_has(lines_, (int)(sizeof lines_ / sizeof lines_[0]))) { \
      SBN_FAIL_("record order: %s", #__VA_ARGS__);                      \
      return;                                                           \
    }                                                                   \
  } while (0)
#define ASSERT_NO_RECORD(line)                   \
  do {                                           \
    if (strstr(nccl_stub_log(), line) != NULL) { \
      SBN_FAIL_("the record has '%s'", line);    \
      print_record();                            \
      return;                                    \
    }                                            \
  } while (0)

/* A call that ended in sbnTimeout waited the whole timeout first (a stuck peer). */
#define ASSERT_NOT_BEFORE_TIMEOUT(waited_ms)                                              \
  do {                                                                                 \
    if ((waited_ms) < STUCK_TIMEOUT_MS) {                                              \
      SBN_FAIL_("sbnTimeout after %.1f ms, before the timeout (%d ms)", (waited_ms),     \
                STUCK_TIMEOUT_MS);                                                     \
      return;                                                                          \
    }                                                                                  \
  } while (0)

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- comms ------------------------------------------------------------------------------- */
/* The caller's comm of one rank on device 0; nonblocking ones are waited for unless
   `ready` is 0 (handed over while NCCL still initialises it). */
static ncclComm_t caller_comm(int blocking, int ready) {
  ncclUniqueId id;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclComm_t c = NULL;
  cfg.blocking = blocking;
  cudaSetDevice(0);
  ncclGetUniqueId(&id);
  ncclResult_t r = ncclCommInitRankConfig(&c, 1, id, 0, &cfg);
  while (ready && (r == ncclSuccess || r == ncclInProgress)) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(c, &async);
    if (async != ncclInProgress) break;
  }
  return c;
}

/* The config of every team here: the case's timeout, 64 channels. */
static sbnConfig_t case_config(int64_t timeout_ms) {
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  cfg.timeout_ms = timeout_ms;
  cfg.max_channels = 64;
  return cfg;
}

/* sbnCommInitNccl into *comm as the caller left it (a failed init writes nothing). */
static sbnResult_t init_nccl_into(sbnComm_t* comm, ncclComm_t nc, const char* transport,
                                  int64_t timeout_ms) {
  const sbnConfig_t cfg = case_config(timeout_ms);
  if (transport != NULL)
    setenv("SBN_NCCL_TRANSPORT", transport, 1);
  else
    unsetenv("SBN_NCCL_TRANSPORT");
  sbnResult_t r = sbnCommInitNccl(comm, nc, &cfg);
  unsetenv("SBN_NCCL_TRANSPORT");
  if (r != sbnSuccess) fprintf(stderr, "  init: %s\n", sbnGetLastError(NULL));
  return r;
}
static sbnResult_t init_nccl(sbnComm_t* comm, ncclComm_t nc, const char* transport,
                             int64_t timeout_ms) {
  *comm = NULL;
  return init_nccl_into(comm, nc, transport, timeout_ms);
}

/* An NCCL team of one made from a nonblocking caller comm of device 0, which is then
   destroyed (the team keeps its own duplicate); `transport` as init_nccl's. */
static sbnResult_t team_of_one(sbnComm_t* comm, const char* transport, int64_t timeout_ms) {
  ncclComm_t nc = caller_comm(0, 1);
  const sbnResult_t r = init_nccl(comm, nc, transport, timeout_ms);
  const ncclResult_t d = ncclCommDestroy(nc); /* the caller's, after a failed init too */
  if (r != sbnSuccess) return r;
  if (d != ncclSuccess) {
    fprintf(stderr, "  ncclCommDestroy of the caller's comm failed\n");
    return sbnNcclError;
  }
  return sbnSuccess;
}

static const char* transport_of(sbnComm_t comm) {
  const char* t = "";
  return sbnCommGetTransport(comm, &t) == sbnSuccess ? t : "(error)";
}

/* ---- one rank's tensors (device memory of the stand-in's device 0) ------------------------- */
enum { N_ = 2, C_ = 8, S_ = 4 };
typedef struct {
  float *x, *y, *dy, *dx, *weight, *bias, *rmean, *rvar, *smean, *sinvstd, *dweight, *dbias;
  int64_t* nbt;
} tensors_t;

static void* dalloc(size_t bytes) {
  void* p = NULL;
  return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}
static void tensors_alloc(tensors_t* t, int device) {
  cudaSetDevice(device);
  const size_t big = (size_t)N_ * C_ * S_ * sizeof(float), small = C_ * sizeof(float);
  t->x = dalloc(big), t->y = dalloc(big), t->dy = dalloc(big), t->dx = dalloc(big);
  t->weight = dalloc(small), t->bias = dalloc(small), t->rmean = dalloc(small);
  t->rvar = dalloc(small), t->smean = dalloc(small), t->sinvstd = dalloc(small);
  t->dweight = dalloc(small), t->dbias = dalloc(small);
  t->nbt = dalloc(sizeof(int64_t));
}
static void tensors_free(tensors_t* t) {
  void* all[] = {t->x,    t->y,     t->dy,      t->dx,      t->weight, t->bias, t->rmean,
                 t->rvar, t->smean, t->sinvstd, t->dweight, t->dbias,  t->nbt};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cudaFree(all[i]);
}
static const sbnTensorDesc_t g_desc = {sbnFloat32, sbnLayoutNCHW, N_, C_, S_};

static sbnResult_t forward(sbnComm_t comm, tensors_t* t) {
  return sbnForwardTrain(comm, &g_desc, t->x, t->y, t->weight, t->bias, t->rmean, t->rvar, t->nbt,
                         t->smean, t->sinvstd, NULL, NULL);
}
static sbnResult_t backward(sbnComm_t comm, tensors_t* t) {
  return sbnBackward(comm, &g_desc, t->x, t->dy, t->dx, t->weight, t->smean, t->sinvstd, t->dweight,
                     t->dbias, NULL, NULL);
}

/* A forward and a backward on the host path, and no failure reported afterwards. */
static void ops_ok(sbnComm_t comm) {
  tensors_t t;
  tensors_alloc(&t, 0);
  sbnResult_t fr = forward(comm, &t), br = backward(comm, &t),
              async = sbnSystemError; /* overwritten */
  tensors_free(&t);
  if (fr != sbnSuccess || br != sbnSuccess) fprintf(stderr, "  op: %s\n", sbnGetLastError(comm));
  ASSERT_OK(fr);
  ASSERT_OK(br);
  const char* kernel = "";
  ASSERT_OK(sbnCommGetKernel(comm, &kernel));
  ASSERT_TRUE(strcmp(kernel, "host") == 0);
  ASSERT_OK(sbnCommGetAsyncError(comm, &async));
  ASSERT_RES(async, sbnSuccess);
}

/* Whether the record's ncclAllGathers (the host path's) are `n` calls, each of a rank's
   records of the team's max_channels (64 here, whatever the op's channels: every rank's
   collective of one size); `distinct`: each on a comm of its own (one round's ranks). */
static int allgathers_ok(int n, int distinct) {
  const char* const prefix = "ncclAllGather c";
  char want[48];
  snprintf(want, sizeof want, " %zu bytes ",
           (size_t)((64 + SBN_GPU_CHUNK - 1) / SBN_GPU_CHUNK) * sizeof(sbn_mail_rec_t));
  int ids[8], k = 0;
  for (const char* p = record_line(prefix); p != NULL; p = record_line_from(p + 1, prefix)) {
    const char* eol = strchr(p, '\n');
    const char* b = strstr(p, want);
    if (b == NULL || (eol != NULL && b > eol) || k == 8) {
      fprintf(stderr, "an ncclAllGather does not give%s(the records of 64 channels)\n", want);
      print_record();
      return 0;
    }
    ids[k] = atoi(p + strlen(prefix));
    for (int i = 0; i < k && distinct; i++)
      if (ids[i] == ids[k]) {
        fprintf(stderr, "two ncclAllGathers of one round on c%d\n", ids[k]);
        print_record();
        return 0;
      }
    k++;
  }
  if (k != n) {
    fprintf(stderr, "%d ncclAllGather(s) in the record, expected %d\n", k, n);
    print_record();
  }
  return k == n;
}

/* ---- the cases ---------------------------------------------------------------------------- */

/* A blocking caller comm (as ncclCommInitRank makes, and as test_nccl_team and ddp_step
   pass): the split returns at once, but its child is still initialising. */
static void test_init_window_blocking_caller(void) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  ncclComm_t nc = caller_comm(1, 1);
  sbnComm_t comm = NULL;
  ASSERT_OK(init_nccl(&comm, nc, NULL, TIMEOUT_MS));
  ASSERT_TRUE(strcmp(transport_of(comm), "nccl-lsa") == 0);
  ops_ok(comm);
  CHECK_();
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_CLEAN();
  ASSERT_RECORD("ncclCommSplit", "ncclAllReduce", "ncclMemAlloc", "ncclAllReduce",
                "ncclCommWindowRegister", "ncclAllReduce", "ncclAllGather", "ncclAllGather",
                "ncclCommWindowDeregister", "ncclCommFinalize", "ncclCommDestroy");
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0 + 1); /* the caller's */
  ASSERT_TRUE(ncclCommDestroy(nc) == ncclSuccess);
  ASSERT_CLEAN();
}

/* A nonblocking caller comm handed over while NCCL still initialises it, and the host
   transport: no window. */
static void test_init_host_nonblocking_caller(void) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  ncclComm_t nc = caller_comm(0, 0);
  sbnComm_t comm = NULL;
  ASSERT_OK(init_nccl(&comm, nc, "host", TIMEOUT_MS));
  ASSERT_TRUE(strcmp(transport_of(comm), "nccl-host") == 0);
  ops_ok(comm);
  CHECK_();
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_CLEAN();
  ASSERT_RECORD("ncclCommSplit", "ncclAllReduce", "ncclAllGather", "ncclCommFinalize",
                "ncclCommDestroy");
  ASSERT_NO_RECORD("ncclCommWindowRegister");
  ASSERT_TRUE(allgathers_ok(2, 0)); /* the forward's and the backward's */
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0 + 1);
  ASSERT_TRUE(ncclCommDestroy(nc) == ncclSuccess);
  ASSERT_CLEAN();
}

/* sbnCommInitNcclRank (for callers without an NCCL comm: the Python package): the id from
   sbnGetNcclUniqueId, the NCCL comm made by the library (nonblocking) and adopted by the
   team: no split, one comm, gone with the team. */
static sbnResult_t init_rank(sbnComm_t* comm, const sbnNcclUniqueId_t* id, int nranks, int rank,
                             int64_t timeout_ms) {
  const sbnConfig_t cfg = case_config(timeout_ms);
  cudaSetDevice(0);
  *comm = NULL;
  const sbnResult_t r = sbnCommInitNcclRank(comm, id, nranks, rank, &cfg);
  if (r != sbnSuccess) fprintf(stderr, "  init: %s\n", sbnGetLastError(NULL));
  return r;
}
static void test_init_rank_from_id(void) {
  for (int host = 0; host < 2; host++) {
    stub_case(NULL);
    const int live0 = nccl_stub_live_comms();
    sbnNcclUniqueId_t id;
    ASSERT_OK(sbnGetNcclUniqueId(&id));
    sbnComm_t comm = NULL;
    if (host) setenv("SBN_NCCL_TRANSPORT", "host", 1);
    const sbnResult_t r = init_rank(&comm, &id, 1, 0, TIMEOUT_MS);
    unsetenv("SBN_NCCL_TRANSPORT");
    ASSERT_OK(r);
    ASSERT_TRUE(strcmp(transport_of(comm), host ? "nccl-host" : "nccl-lsa") == 0);
    ASSERT_EQ_INT(nccl_stub_live_comms(), live0 + 1); /* the one comm, the team's */
    ops_ok(comm);
    CHECK_();
    ASSERT_OK(sbnCommDestroy(comm));
    ASSERT_CLEAN();
    ASSERT_RECORD("ncclGetUniqueId", "ncclCommInitRankConfig", "ncclAllReduce", "ncclAllGather",
                  "ncclCommFinalize", "ncclCommDestroy");
    ASSERT_NO_RECORD("ncclCommSplit");
    ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
  }
}
/* SBN_KERNEL, read at every call: an unknown value, and "legacy" (the first kernel, removed
   on 2026-11-26), fail the call with sbnInvalidArgument and a message saying so, before
   anything is launched or recorded; the team still works afterwards. */
static void test_kernel_env(void) {
  stub_case(NULL);
  sbnNcclUniqueId_t id;
  ASSERT_OK(sbnGetNcclUniqueId(&id));
  sbnComm_t comm = NULL;
  ASSERT_OK(init_rank(&comm, &id, 1, 0, TIMEOUT_MS));
  static const struct {
    const char* value;
    const char* says;
  } cases[] = {{"legacy", "was removed"}, {"no-such-kernel", "expected 'auto'"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tensors_t t;
    tensors_alloc(&t, 0);
    nccl_stub_reset(); /* the record from here */
    setenv("SBN_KERNEL", cases[i].value, 1);
    const sbnResult_t r = forward(comm, &t);
    unsetenv("SBN_KERNEL");
    tensors_free(&t);
    ASSERT_RES(r, sbnInvalidArgument);
    if (strstr(sbnGetLastError(comm), cases[i].says) == NULL)
      SBN_FAIL_("SBN_KERNEL=%s: '%s' does not say '%s'", cases[i].value, sbnGetLastError(comm),
                cases[i].says);
    ASSERT_NO_RECORD("ncclAllGather");
  }
  ops_ok(comm); /* SBN_KERNEL unset: the call runs */
  CHECK_();
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_CLEAN();
}

/* A rank of the id's comm that never calls: the init waits until the timeout, then
   sbnTimeout, nothing written, the comm aborted (no hang, no leak). Arguments checked
   before anything is made. */
static void test_init_rank_stuck_and_arguments(void) {
  stub_case("ncclCommInitRankConfig");
  const int live0 = nccl_stub_live_comms();
  sbnNcclUniqueId_t id;
  ASSERT_OK(sbnGetNcclUniqueId(&id));
  sbnComm_t comm = NULL;
  const double t0 = now_ms();
  const sbnResult_t r = init_rank(&comm, &id, 2, 0, STUCK_TIMEOUT_MS);
  const double waited = now_ms() - t0;
  ASSERT_RES(r, sbnTimeout);
  ASSERT_TRUE(comm == NULL);
  ASSERT_NOT_BEFORE_TIMEOUT(waited);
  ASSERT_RECORD("ncclCommInitRankConfig", "ncclCommAbort");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
  stub_case(NULL);
  sbnComm_t untouched = (sbnComm_t)&untouched;
  ASSERT_RES(sbnCommInitNcclRank(&untouched, NULL, 1, 0, NULL), sbnInvalidArgument);
  ASSERT_RES(sbnCommInitNcclRank(&untouched, &id, 2, 2, NULL), sbnInvalidArgument);
  ASSERT_RES(sbnCommInitNcclRank(&untouched, &id, 0, 0, NULL), sbnInvalidArgument);
  ASSERT_RES(sbnCommInitNcclRank(NULL, &id, 1, 0, NULL), sbnInvalidArgument);
  ASSERT_RES(sbnGetNcclUniqueId(NULL), sbnInvalidArgument);
  ASSERT_TRUE(untouched == (sbnComm_t)&untouched);
  ASSERT_NO_RECORD("ncclCommInitRankConfig");
}

/* sbnCommSplit with a colour gives a comm (NCCL writes it only once the parent is done);
   without one, NULL. On both transports. */
static void split_case(const char* transport, const char* want) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL, sub = NULL, none = NULL;
  ASSERT_OK(team_of_one(&comm, transport, TIMEOUT_MS)); /* the library keeps its own comm */
  if (transport != NULL) setenv("SBN_NCCL_TRANSPORT", transport, 1); /* read by each init */
  const sbnResult_t sr = sbnCommSplit(comm, 0, 0, &sub);
  unsetenv("SBN_NCCL_TRANSPORT");
  ASSERT_OK(sr);
  if (sub == NULL) {
    SBN_FAIL_("sbnCommSplit with colour 0 returned no comm");
    print_record();
    return;
  }
  int rank = -1, count = -1;
  ASSERT_OK(sbnCommRank(sub, &rank));
  ASSERT_OK(sbnCommCount(sub, &count));
  ASSERT_EQ_INT(rank, 0);
  ASSERT_EQ_INT(count, 1);
  ASSERT_TRUE(strcmp(transport_of(sub), want) == 0);
  ops_ok(sub);
  CHECK_();
  none = (sbnComm_t)&none; /* must be overwritten with NULL */
  ASSERT_OK(sbnCommSplit(comm, SBN_SPLIT_NOCOLOR, 0, &none));
  ASSERT_TRUE(none == NULL);
  ops_ok(comm); /* the parent is usable after its splits */
  CHECK_();
  ASSERT_OK(sbnCommDestroy(sub));
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}
static void test_split_lsa(void) {
  split_case(NULL, "nccl-lsa");
}
static void test_split_host(void) {
  split_case("host", "nccl-host");
}

/* sbnCommAbort: the team's comm is aborted (not finalized), later ops are refused, the
   destroy that follows makes no collective call. An "nccl-host" team's comm is aborted in
   sbnCommAbort; an "nccl-lsa" team's, with no host-path collective pending, when the
   destroy has waited for its device (the abort unmaps the window, which this rank's
   kernels may still be writing: test_abort_window_kernel_running). */
static void abort_case(const char* transport, int at_once) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, transport, TIMEOUT_MS));
  ops_ok(comm);
  CHECK_();
  stub_case(NULL);
  ASSERT_OK(sbnCommAbort(comm));
  if (at_once)
    ASSERT_RECORD("ncclCommAbort");
  else
    ASSERT_NO_RECORD("ncclCommAbort");
  tensors_t t;
  tensors_alloc(&t, 0);
  sbnResult_t fr = forward(comm, &t);
  tensors_free(&t);
  ASSERT_RES(fr, sbnAborted);
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_RECORD("ncclCommAbort");
  ASSERT_NO_RECORD("ncclCommFinalize");
  ASSERT_NO_RECORD("ncclCommWindowDeregister");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}
static void test_abort(void) {
  abort_case(NULL, 0); /* nccl-lsa */
}
static void test_abort_host(void) {
  abort_case("host", 1);
}

/* An "nccl-lsa" team that ran a host-path op (SBN_ALGO=nccl) whose collective may wait for
   a peer that never comes: sbnCommAbort aborts the comm at once (a destroy that waited
   for the device first could wait forever). captured: the op ran under a graph capture,
   whose replays are not watched (the stand-in's capture is only cudaStreamIsCapturing's
   answer); else its collective has not completed (collectives stuck from before the op:
   its done event never done, so the team's watchdog, every 20 ms, never forgets the op as
   finished before the abort). second: an op before it held its first watch slot (queued
   behind held work, which ended before the abort): the stuck one is in the second slot. */
static void abort_after_host_op(int captured, int second) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, NULL, TIMEOUT_MS));
  ASSERT_TRUE(strcmp(transport_of(comm), "nccl-lsa") == 0);
  tensors_t t;
  tensors_alloc(&t, 0);
  if (second) cudart_stub_hold_stream(NULL);
  const sbnResult_t f0 = second ? forward(comm, &t) : sbnSuccess;
  if (captured)
    cudart_stub_set_capturing(1);
  else
    cudart_stub_set_collectives_stuck(1);
  const sbnResult_t fr = forward(comm, &t); /* SBN_ALGO=nccl: the host path */
  cudart_stub_set_capturing(0);
  if (second) cudart_stub_release_stream(NULL); /* the first op ends; the stuck one begins */
  tensors_free(&t);
  ASSERT_OK(f0);
  ASSERT_OK(fr);
  nccl_stub_reset(); /* the records from here (not cudart_stub_reset: it stays stuck) */
  const sbnResult_t ar = sbnCommAbort(comm);
  cudart_stub_set_collectives_stuck(0);
  ASSERT_OK(ar);
  ASSERT_RECORD("ncclCommAbort");
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}
/* sbnCommAbort and sbnCommDestroy while another thread captures a CUDA graph in global
   mode (PyTorch's default): their queries, synchronizations and frees run relaxed about
   captures, so that capture stays valid (the stand-in counts no violation) and they still
   do their work: an "nccl-lsa" team whose host-path collective is pending has its comm
   aborted (as test_abort_with_host_op_pending's, where the query that finds it pending
   failed and read as "not pending"); an sbnCommInitAll team of two devices is aborted (its
   NCCL comms too: the stand-in's abort frees device memory, as NCCL's does) and destroyed.
   A caller's own capture mode (thread-local) is as it was after each. */
static void test_abort_destroy_under_foreign_capture(void) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, NULL, TIMEOUT_MS));
  tensors_t t;
  tensors_alloc(&t, 0);
  cudart_stub_set_collectives_stuck(1);
  const sbnResult_t fr = forward(comm, &t); /* SBN_ALGO=nccl: the host path */
  tensors_free(&t);
  ASSERT_OK(fr);
  nccl_stub_reset();
  cudart_stub_set_foreign_capture(1);
  const sbnResult_t ar = sbnCommAbort(comm);
  cudart_stub_set_collectives_stuck(0);
  const sbnResult_t dr = sbnCommDestroy(comm);
  cudart_stub_set_foreign_capture(0);
  ASSERT_OK(ar);
  ASSERT_OK(dr);
  ASSERT_RECORD("ncclCommAbort");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
  sbnComm_t comms[2] = {NULL, NULL};
  const int devs[2] = {0, 1};
  const sbnConfig_t cfg = case_config(TIMEOUT_MS);
  ASSERT_OK(sbnCommInitAll(comms, 2, devs, &cfg));
  cudart_stub_set_foreign_capture(1);
  const sbnResult_t ar2 = sbnCommAbort(comms[0]);
  const sbnResult_t d0 = sbnCommDestroy(comms[0]), d1 = sbnCommDestroy(comms[1]);
  cudart_stub_set_foreign_capture(0);
  ASSERT_OK(ar2);
  ASSERT_OK(d0);
  ASSERT_OK(d1);
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
  /* a caller in thread-local mode: its mode as it was after the abort and the destroy */
  ASSERT_OK(sbnCommInitAll(comms, 2, devs, &cfg));
  enum cudaStreamCaptureMode mine = cudaStreamCaptureModeThreadLocal;
  cudaThreadExchangeStreamCaptureMode(&mine);
  ASSERT_OK(sbnCommAbort(comms[0]));
  enum cudaStreamCaptureMode after_abort = cudaStreamCaptureModeThreadLocal;
  cudaThreadExchangeStreamCaptureMode(&after_abort);
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
  mine = cudaStreamCaptureModeGlobal;
  cudaThreadExchangeStreamCaptureMode(&mine);
  ASSERT_EQ_INT((int)after_abort, (int)cudaStreamCaptureModeThreadLocal);
  ASSERT_EQ_INT((int)mine, (int)cudaStreamCaptureModeThreadLocal);
}
static void test_abort_after_captured_host_op(void) {
  abort_after_host_op(1, 0);
}
static void test_abort_with_host_op_pending(void) {
  abort_after_host_op(0, 0);
  CHECK_();
  abort_after_host_op(0, 1);
}

/* sbnCommAbort of an "nccl-lsa" team while this rank's cooperative kernel may still run
   (it writes its peers' mailboxes and failure words through the window until it sees the
   stop word): the comm, whose abort unmaps the window, is aborted only after the destroy
   has waited for the device. The stand-in NCCL counts an abort or deregistration under a
   cooperative launch that no cudaDeviceSynchronize has followed as a violation. */
static void test_abort_window_kernel_running(void) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, NULL, TIMEOUT_MS));
  ASSERT_TRUE(strcmp(transport_of(comm), "nccl-lsa") == 0);
  tensors_t t;
  tensors_alloc(&t, 0);
  unsetenv("SBN_ALGO"); /* the cooperative kernel */
  const sbnResult_t fr = forward(comm, &t);
  setenv("SBN_ALGO", "nccl", 1);
  if (fr != sbnSuccess) fprintf(stderr, "  op: %s\n", sbnGetLastError(comm));
  ASSERT_OK(fr);
  ASSERT_TRUE(cudart_stub_in_flight(0) > 0);
  ASSERT_OK(sbnCommAbort(comm));
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_EQ_INT(cudart_stub_in_flight(0), 0);
  tensors_free(&t);
  ASSERT_RECORD("ncclCommAbort");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}

/* The stop word of every live rank state (the device allocations of its size), by
   device: stop[d], or -1 where device d has none. Returns how many there are. */
static int stop_words(int stop[2]) {
  void* p[8];
  int dev[8];
  stop[0] = stop[1] = -1;
  const size_t n = cudart_stub_find(sizeof(sbn_rank_state_t), p, dev, 8);
  for (size_t i = 0; i < n && i < 8; i++)
    if (dev[i] >= 0 && dev[i] < 2) stop[dev[i]] = (int)((const sbn_rank_state_t*)p[i])->stop;
  return (int)n;
}

/* sbnCommAbort reaches the kernels through each rank's stop word in device memory (the
   kernels read no host memory on their success path): after it returns, the word says
   sbnAborted on the rank's device (the copy is waited for), so a kernel launched after
   the abort publishes nothing. Before it, the word is 0. */
static void test_abort_sets_stop_words(void) {
  stub_case(NULL);
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, NULL, TIMEOUT_MS));
  int stop[2];
  ASSERT_EQ_INT(stop_words(stop), 1);
  ASSERT_EQ_INT(stop[0], 0);
  ASSERT_OK(sbnCommAbort(comm));
  ASSERT_EQ_INT(stop_words(stop), 1);
  ASSERT_EQ_INT(stop[0], sbnAborted);
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_EQ_INT(stop_words(stop), 0);
}

/* An sbnCommInitAll team of two (stand-in) devices, 0 and 1. */
static sbnResult_t init_all_two(sbnComm_t comms[2], int64_t timeout_ms) {
  const int devs[2] = {0, 1};
  const sbnConfig_t cfg = case_config(timeout_ms);
  return sbnCommInitAll(comms, 2, devs, &cfg);
}

/* Waits (20 timeouts at most) until no abandoned release runs. */
static void wait_releases(void) {
  const double t0 = now_ms();
  while (sbn_gpu_releases_pending() != 0 && now_ms() - t0 < 20.0 * STUCK_TIMEOUT_MS) {
    struct timespec ts = {0, 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* sbnCommInitAll on two (stand-in) devices: its NCCL comms, made in one group, settle
   before the host path's group of ncclAllGather uses them; finalized in a group. */
static void test_initall(void) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, TIMEOUT_MS));
  tensors_t t[2];
  tensors_alloc(&t[0], 0);
  tensors_alloc(&t[1], 1);
  ASSERT_OK(sbnGroupStart());
  sbnResult_t f0 = forward(comms[0], &t[0]), f1 = forward(comms[1], &t[1]);
  sbnResult_t ge = sbnGroupEnd();
  tensors_free(&t[0]);
  tensors_free(&t[1]);
  if (ge != sbnSuccess) fprintf(stderr, "  sbnGroupEnd: %s\n", sbnGetLastError(NULL));
  ASSERT_OK(f0);
  ASSERT_OK(f1);
  ASSERT_OK(ge);
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
  ASSERT_CLEAN();
  ASSERT_RECORD("ncclCommInitRankConfig", "ncclCommInitRankConfig", "ncclGroupEnd", "ncclAllGather",
                "ncclAllGather", "ncclGroupEnd", "ncclCommFinalize", "ncclCommFinalize",
                "ncclGroupEnd", "ncclCommDestroy", "ncclCommDestroy");
  ASSERT_TRUE(allgathers_ok(2, 1)); /* one group: rank 0's comm, rank 1's */
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}

/* The destroy of an sbnCommInitAll team whose cooperative kernels may still run on both
   devices (launched, nothing waited for): every device is idle before any of the team's
   memory is freed. A rank's kernel writes its peers' mailboxes and stop words on their
   devices, and a cudaFree on one device does not wait for another's kernels (the
   stand-in CUDA runtime counts such a free as a violation). */
static void test_destroy_two_devices_kernels_running(void) {
  stub_case(NULL);
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, TIMEOUT_MS));
  ASSERT_TRUE(strcmp(transport_of(comms[0]), "peer") == 0);
  tensors_t t[2];
  tensors_alloc(&t[0], 0);
  tensors_alloc(&t[1], 1);
  unsetenv("SBN_ALGO"); /* the cooperative kernels */
  ASSERT_OK(sbnGroupStart());
  const sbnResult_t f0 = forward(comms[0], &t[0]), f1 = forward(comms[1], &t[1]);
  const sbnResult_t ge = sbnGroupEnd();
  setenv("SBN_ALGO", "nccl", 1);
  if (ge != sbnSuccess) fprintf(stderr, "  sbnGroupEnd: %s\n", sbnGetLastError(NULL));
  ASSERT_OK(f0);
  ASSERT_OK(f1);
  ASSERT_OK(ge);
  ASSERT_TRUE(cudart_stub_in_flight(0) > 0 && cudart_stub_in_flight(1) > 0);
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
  ASSERT_CLEAN();
  tensors_free(&t[0]); /* the devices are idle now */
  tensors_free(&t[1]);
  ASSERT_CLEAN();
}

/* One cooperative forward (fp32 NCHW, C c, H*W sp) of nr ranks (1 or 2): comms[r] on
   device devs[r] with batch n[r], each on a stream of its own (ranks sharing a device need
   them), two in one group; f[r] each call's result. Returns the group's result (one rank:
   its call's). Every device idle before the tensors are freed: a rank's kernel writes its
   peer's memory. */
static sbnResult_t coop_forward(const sbnComm_t* comms, int nr, const int* devs, const int64_t* n,
                                int64_t c, int64_t sp, sbnResult_t* f) {
  void* p[2][8];
  cudaStream_t s[2] = {NULL, NULL};
  for (int r = 0; r < nr; r++) {
    cudaSetDevice(devs[r]);
    const size_t big = (size_t)(n[r] * c * sp) * sizeof(float), small = (size_t)c * sizeof(float);
    for (int i = 0; i < 8; i++) p[r][i] = dalloc(i < 2 ? big : i == 7 ? sizeof(int64_t) : small);
    cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking);
  }
  unsetenv("SBN_ALGO"); /* the cooperative kernel */
  if (nr > 1) sbnGroupStart();
  for (int r = 0; r < nr; r++) {
    const sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, n[r], c, sp};
    f[r] = sbnForwardTrain(comms[r], &d, p[r][0], p[r][1], NULL, NULL, p[r][2], p[r][3], p[r][7],
                           p[r][4], p[r][5], NULL, s[r]);
  }
  const sbnResult_t ge = nr > 1 ? sbnGroupEnd() : f[0];
  setenv("SBN_ALGO", "nccl", 1);
  for (int r = 0; r < nr; r++) {
    cudaSetDevice(devs[r]);
    cudaDeviceSynchronize();
  }
  for (int r = 0; r < nr; r++) {
    cudaStreamDestroy(s[r]);
    for (int i = 0; i < 8; i++) cudaFree(p[r][i]);
  }
  return ge;
}

/* The cooperative grid of one rank's forward on (n, c, sp) fp32 NCHW tensors of the
   stand-in's device 0, in a group with the team's other comm, on `other_device`, when
   `other` is not NULL; 0 where the op failed. */
static unsigned coop_grid(sbnComm_t comm, sbnComm_t other, int other_device, int64_t n, int64_t c,
                          int64_t sp) {
  const sbnComm_t comms[2] = {comm, other};
  const int devs[2] = {0, other_device};
  const int64_t ns[2] = {n, n};
  sbnResult_t f[2] = {sbnSuccess, sbnSuccess};
  const sbnResult_t ge = coop_forward(comms, other ? 2 : 1, devs, ns, c, sp, f);
  if (f[0] != sbnSuccess || f[1] != sbnSuccess || ge != sbnSuccess) {
    fprintf(stderr, "  op: %d %d %d: %s / %s / %s\n", f[0], f[1], ge, sbnGetLastError(comm),
            other ? sbnGetLastError(other) : "", sbnGetLastError(NULL));
    return 0;
  }
  return cudart_stub_last_coop_grid();
}

/* One cooperative forward (fp32 NCHW, C 64, H*W 1024) of each rank of an sbnCommInitAll
   team of two devices, rank r's batch n[r], in one group: its result and each rank's. */
static sbnResult_t pair_forward(sbnComm_t comms[2], const int64_t n[2], sbnResult_t f[2]) {
  static const int devs[2] = {0, 1};
  const sbnResult_t ge = coop_forward(comms, 2, devs, n, 64, 1024, f);
  if (ge != sbnSuccess) fprintf(stderr, "  sbnGroupEnd: %s\n", sbnGetLastError(NULL));
  return ge;
}

/* SBN_KERNEL=onchip on an sbnCommInitAll team whose ranks' batches differ: rank 0's fits on
   chip, rank 1's (64 times as large) does not. In one group, every rank's plan comes before
   any launch: the group is refused (sbnUnsupported) with no kernel launched, and the team
   stays usable: the next group, without SBN_KERNEL, runs. (Before, rank 0's kernel was
   launched, then rank 1's refusal aborted the team for good.) */
static void test_onchip_refusal_launches_nothing(void) {
  stub_case(NULL);
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, TIMEOUT_MS));
  const int64_t uneven[2] = {1, 64}, fits[2] = {1, 1};
  sbnResult_t f[2];
  setenv("SBN_KERNEL", "onchip", 1);
  const sbnResult_t both_fit = pair_forward(comms, fits, f); /* rank 1's batch alone decides */
  const int launched = cudart_stub_launches(NULL, 0);
  cudart_stub_reset();
  const sbnResult_t ge = pair_forward(comms, uneven, f);
  unsetenv("SBN_KERNEL");
  ASSERT_OK(both_fit);
  ASSERT_EQ_INT(launched, 2);
  ASSERT_EQ_INT(ge, sbnUnsupported);
  ASSERT_TRUE(strstr(sbnGetLastError(NULL), "does not fit on chip") != NULL);
  ASSERT_EQ_INT(cudart_stub_launches(NULL, 0), 0);
  ASSERT_OK(pair_forward(comms, uneven, f));
  ASSERT_OK(f[0]);
  ASSERT_OK(f[1]);
  ASSERT_TRUE(cudart_stub_launches(NULL, 0) == 2);
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
  ASSERT_CLEAN();
}

/* A virtual team of two whose cooperative launch fails with nothing queued (the stand-in's
   cudaErrorCooperativeLaunchTooLarge): the group says sbnCudaError, sbnCommGetKernel still
   says "none" (nothing ran), and the team goes on: nobody waits for a launch that runs
   every rank, so it is not aborted, and the next group runs. */
static void test_virtual_launch_failure_keeps_team(void) {
  stub_case(NULL);
  sbnComm_t v[2] = {NULL, NULL};
  ASSERT_OK(sbnCommInitVirtual(v, 2, 0, NULL));
  tensors_t t[2];
  tensors_alloc(&t[0], 0);
  tensors_alloc(&t[1], 0);
  unsetenv("SBN_ALGO"); /* the cooperative kernel */
  sbnResult_t f[2][2], ge[2];
  const char* kernel[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++) { /* 0: the launch fails; 1: it does not */
    cudart_stub_set_coop_launch_fails(k == 0);
    ASSERT_OK(sbnGroupStart());
    f[k][0] = forward(v[0], &t[0]), f[k][1] = forward(v[1], &t[1]); /* queued */
    ge[k] = sbnGroupEnd();
    (void)sbnCommGetKernel(v[0], &kernel[k]);
    if (k == 0) fprintf(stderr, "  failed launch: %s\n", sbnGetLastError(NULL));
  }
  cudart_stub_set_coop_launch_fails(0);
  setenv("SBN_ALGO", "nccl", 1);
  cudaSetDevice(0);
  cudaDeviceSynchronize();
  ASSERT_OK(sbnCommDestroy(v[0]));
  ASSERT_OK(sbnCommDestroy(v[1]));
  tensors_free(&t[0]);
  tensors_free(&t[1]);
  for (int k = 0; k < 2; k++) ASSERT_TRUE(f[k][0] == sbnSuccess && f[k][1] == sbnSuccess);
  ASSERT_EQ_INT(ge[0], sbnCudaError);
  ASSERT_TRUE(kernel[0] != NULL && strcmp(kernel[0], "none") == 0);
  ASSERT_OK(ge[1]);
  ASSERT_TRUE(kernel[1] != NULL && strcmp(kernel[1], "none") != 0);
  ASSERT_EQ_INT(cudart_stub_launches(NULL, 0), 1);
  ASSERT_CLEAN();
}

/* The same on an sbnCommInitAll team of two devices, whose ranks launch one by one: rank
   0's launch fails with nothing queued, so no rank of the round runs or waits; the group
   says sbnCudaError with no kernel launched, and the team goes on (the next group runs).
   Had rank 0's launch succeeded and rank 1's failed, rank 0's kernel would wait for rank
   1: the team is then aborted, as before (not tested here: the stand-in fails every
   cooperative launch while the switch is on). */
static void test_initall_first_launch_failure_keeps_team(void) {
  stub_case(NULL);
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, TIMEOUT_MS));
  const int64_t n[2] = {1, 1};
  sbnResult_t f[2];
  cudart_stub_set_coop_launch_fails(1);
  const sbnResult_t failed = pair_forward(comms, n, f);
  cudart_stub_set_coop_launch_fails(0);
  const int launched = cudart_stub_launches(NULL, 0);
  const sbnResult_t next = pair_forward(comms, n, f);
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
  ASSERT_EQ_INT(failed, sbnCudaError);
  ASSERT_EQ_INT(launched, 0);
  ASSERT_OK(next);
  ASSERT_EQ_INT(cudart_stub_launches(NULL, 0), 2);
  ASSERT_CLEAN();
}

/* A runtime that cannot say where a tensor lives (cudaPointerGetAttributes fails) is the
   runtime's failure, sbnCudaError, not the caller's tensor: an op refused for it, nothing
   launched. */
static void test_pointer_query_failure(void) {
  stub_case(NULL);
  sbnComm_t v = NULL;
  ASSERT_OK(sbnCommInitVirtual(&v, 1, 0, NULL));
  tensors_t t;
  tensors_alloc(&t, 0);
  unsetenv("SBN_ALGO");
  cudart_stub_set_pointer_query_fails(1);
  const sbnResult_t f = forward(v, &t);
  cudart_stub_set_pointer_query_fails(0);
  setenv("SBN_ALGO", "nccl", 1);
  const int named = strstr(sbnGetLastError(v), "cudaPointerGetAttributes") != NULL;
  ASSERT_OK(sbnCommDestroy(v));
  tensors_free(&t);
  ASSERT_EQ_INT(f, sbnCudaError);
  ASSERT_TRUE(named);
  ASSERT_EQ_INT(cudart_stub_launches(NULL, 0), 0);
  ASSERT_CLEAN();
}

/* sbnCommSplit of a virtual team of two from one thread outside a group: refused at once
   (sbnInvalidUsage, *newcomm untouched, the team alive), as its ops are; before, it waited
   the whole timeout for a peer call that cannot come and aborted the team. Inside a group
   the split is made. */
static void test_virtual_split_outside_group(void) {
  stub_case(NULL);
  sbnConfig_t cfg = case_config(60000);
  sbnComm_t v[2], sub[2];
  ASSERT_OK(sbnCommInitVirtual(v, 2, 0, &cfg));
  sub[0] = sub[1] = (sbnComm_t)&cfg;
  const double t0 = now_ms();
  ASSERT_RES(sbnCommSplit(v[0], 0, 0, &sub[0]), sbnInvalidUsage);
  ASSERT_TRUE(now_ms() - t0 < 30000);
  ASSERT_TRUE(strstr(sbnGetLastError(v[0]), "split only inside a group") != NULL);
  ASSERT_TRUE(sub[0] == (sbnComm_t)&cfg);
  sbnResult_t async = sbnSystemError;
  ASSERT_OK(sbnCommGetAsyncError(v[1], &async));
  ASSERT_RES(async, sbnSuccess);
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommSplit(v[r], 0, 1 - r, &sub[r]));
  ASSERT_OK(sbnGroupEnd());
  int rank = -1;
  ASSERT_OK(sbnCommRank(sub[0], &rank));
  ASSERT_EQ_INT(rank, 1);
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(sub[r]));
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(v[r]));
  ASSERT_CLEAN();
}

/* sbnCommSplit of an sbnCommInitAll team called one thread per rank outside a group (as
   its ops may be): each call waits for the other, the last one makes the split, and both
   get their comm of the new team, ordered by key, on the parent's transport. */
typedef struct {
  sbnComm_t comm, sub;
  int key;
  sbnResult_t r;
} split_rank_t;
static void* split_rank_main(void* p) {
  split_rank_t* s = p;
  s->r = sbnCommSplit(s->comm, 0, s->key, &s->sub);
  return NULL;
}
static void test_initall_split_one_thread_per_rank(void) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, TIMEOUT_MS));
  split_rank_t s[2];
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    s[r] = (split_rank_t){comms[r], NULL, 1 - r, sbnSystemError};
    ASSERT_TRUE(pthread_create(&th[r], NULL, split_rank_main, &s[r]) == 0);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  const char *parent = NULL, *child = NULL;
  ASSERT_OK(sbnCommGetTransport(comms[0], &parent));
  for (int r = 0; r < 2; r++) {
    ASSERT_OK(s[r].r);
    ASSERT_TRUE(s[r].sub != NULL);
    int rank = -1, count = -1;
    ASSERT_OK(sbnCommRank(s[r].sub, &rank));
    ASSERT_OK(sbnCommCount(s[r].sub, &count));
    ASSERT_EQ_INT(rank, 1 - r);
    ASSERT_EQ_INT(count, 2);
    ASSERT_OK(sbnCommGetTransport(s[r].sub, &child));
    ASSERT_TRUE(strcmp(child, parent) == 0);
  }
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(s[r].sub));
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}

/* sbnCommSplit of an sbnCommInitAll team into one colour per rank (in a group), where the
   second colour's init fails (its first cudaSetDevice(1)) while the devices are busy: the
   split releases the first colour's new team, whose release waits out the timeout
   (sbnTimeout, "sbnCommDestroy: ... did not finish its work"), and still returns the
   second colour's own failure and message, on every rank. (The release's message replaced
   the split's: sbnCudaError said "did not finish its work".) No comm written; everything
   freed once the devices finish; the parent team works on. */
static void test_split_failure_keeps_its_message(void) {
  const double T = STUCK_TIMEOUT_MS;
  stub_case(NULL);
  const size_t before = cudart_stub_live();
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, STUCK_TIMEOUT_MS));
  const size_t parent = cudart_stub_live();
  cudaSetDevice(0);
  sbnComm_t sub[2] = {(sbnComm_t)&sub, (sbnComm_t)&sub};
  cudart_stub_set_devices_busy(1);
  cudart_stub_fail_set_device(1, 1);
  const double t0 = now_ms();
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++) (void)sbnCommSplit(comms[r], r, 0, &sub[r]);
  const sbnResult_t gr = sbnGroupEnd();
  const double took = now_ms() - t0;
  cudart_stub_fail_set_device(-1, 0);
  char why[2][512];
  for (int r = 0; r < 2; r++) snprintf(why[r], sizeof why[r], "%s", sbnGetLastError(comms[r]));
  cudart_stub_set_devices_busy(0);
  wait_releases();
  printf("  the split: %s after %.0f ms (timeout %.0f ms): %s\n", sbnGetResultName(gr), took, T,
         why[0]);
  ASSERT_RES(gr, sbnCudaError);
  for (int r = 0; r < 2; r++) {
    if (strstr(why[r], "sbnCommSplit: the new team of colour 1: cudaSetDevice") == NULL ||
        strstr(why[r], "did not finish") != NULL)
      SBN_FAIL_("rank %d: sbnGetLastError says '%s', not the second colour's failure", r, why[r]);
  }
  ASSERT_TRUE(sub[0] == (sbnComm_t)&sub && sub[1] == (sbnComm_t)&sub);
  if (took >= 2 * T) SBN_FAIL_("the split took %.0f ms", took);
  ASSERT_EQ_INT(sbn_gpu_releases_pending(), 0);
  ASSERT_EQ_INT((int)cudart_stub_live(), (int)parent);
  const int64_t n[2] = {2, 2};
  sbnResult_t f[2];
  ASSERT_OK(pair_forward(comms, n, f));
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
  ASSERT_EQ_INT((int)cudart_stub_live(), (int)before);
  ASSERT_CLEAN();
}

/* An sbnCommInitAll team of two (stand-in devices, a minute's timeout) whose rank 0 has
   been waiting 300 ms in a thread-per-rank split (s: the call's record; *th its thread,
   to join); 0 where it could not be made. */
static int rank0_in_split(sbnComm_t comms[2], split_rank_t* s, pthread_t* th) {
  if (init_all_two(comms, 60000) != sbnSuccess) return 0;
  *s = (split_rank_t){comms[0], (sbnComm_t)s, 0, sbnSystemError};
  if (pthread_create(th, NULL, split_rank_main, s) != 0) return 0;
  struct timespec ts = {0, 300 * 1000000L};
  nanosleep(&ts, NULL);
  return 1;
}

/* A thread-per-rank split of an sbnCommInitAll team whose other rank fails its launch
   (the team aborted with sbnCudaError) meanwhile: the waiting rank's split returns
   sbnAborted, as a call after the abort does, naming the reason; it returned the peer's
   sbnCudaError, a CUDA error this call never had. */
static void test_initall_split_aborted_by_peer(void) {
  stub_case(NULL);
  unsetenv("SBN_ALGO");
  sbnComm_t comms[2] = {NULL, NULL};
  split_rank_t s;
  pthread_t th;
  const double t0 = now_ms();
  ASSERT_TRUE(rank0_in_split(comms, &s, &th));
  tensors_t t;
  tensors_alloc(&t, 1);
  cudart_stub_set_coop_launch_fails(1);
  const sbnResult_t f = forward(comms[1], &t);
  cudart_stub_set_coop_launch_fails(0);
  pthread_join(th, NULL);
  tensors_free(&t);
  ASSERT_RES(f, sbnCudaError);
  ASSERT_RES(s.r, sbnAborted);
  ASSERT_TRUE(now_ms() - t0 < 30000);
  ASSERT_TRUE(s.sub == (sbnComm_t)&s);
  ASSERT_TRUE(strstr(sbnGetLastError(comms[0]), "aborted (sbnCudaError)") != NULL);
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
  ASSERT_CLEAN();
}

/* A rank of an sbnCommInitAll team destroyed while the other waits in a thread-per-rank
   split: that split returns at once (sbnInvalidUsage, naming the rank, *newcomm
   untouched), as a group lacking the rank is refused, and so does a later one; the team
   is not aborted (a GPU team's destroy does not abort it). The split waited out the
   team's timeout and then aborted the team. */
static void test_initall_split_peer_destroyed(void) {
  stub_case(NULL);
  sbnComm_t comms[2] = {NULL, NULL};
  split_rank_t s;
  pthread_t th;
  const double t0 = now_ms();
  ASSERT_TRUE(rank0_in_split(comms, &s, &th));
  ASSERT_OK(sbnCommDestroy(comms[1]));
  pthread_join(th, NULL);
  ASSERT_RES(s.r, sbnInvalidUsage);
  ASSERT_TRUE(now_ms() - t0 < 30000);
  ASSERT_TRUE(s.sub == (sbnComm_t)&s);
  ASSERT_TRUE(strstr(sbnGetLastError(comms[0]), "rank 1 of the team was destroyed") != NULL);
  sbnComm_t again = (sbnComm_t)&s;
  ASSERT_RES(sbnCommSplit(comms[0], 0, 0, &again), sbnInvalidUsage);
  ASSERT_TRUE(again == (sbnComm_t)&s);
  sbnResult_t async = sbnSystemError;
  ASSERT_OK(sbnCommGetAsyncError(comms[0], &async));
  ASSERT_RES(async, sbnSuccess);
  /* an abort after it is not the destroy's: a later call says the team was aborted, not
     that rank 1's destroy aborted it */
  ASSERT_OK(sbnCommAbort(comms[0]));
  ASSERT_RES(sbnCommSplit(comms[0], 0, 0, &again), sbnAborted);
  ASSERT_TRUE(strstr(sbnGetLastError(comms[0]), "was destroyed") == NULL);
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_CLEAN();
}

/* A training op given a tensor of another device, or of host memory, in each of its
   places in turn: sbnInvalidArgument naming the tensor, nothing launched, y unwritten. */
static void test_training_pointer_checks(void) {
  stub_case(NULL);
  unsetenv("SBN_ALGO");
  sbnComm_t v = NULL;
  ASSERT_OK(sbnCommInitVirtual(&v, 1, 0, NULL));
  tensors_t t, other;
  tensors_alloc(&other, 1);
  tensors_alloc(&t, 0);
  const size_t big = (size_t)N_ * C_ * S_ * sizeof(float);
  void* host = malloc(big);
  ASSERT_TRUE(host != NULL);
  float** places[] = {&t.x, &t.y, &t.weight, &t.bias, &t.rmean, &t.rvar, &t.smean, &t.sinvstd};
  const char* names[] = {"x",           "y",         "weight",     "bias", "running_mean",
                         "running_var", "save_mean", "save_invstd"};
  float** others[] = {&other.x,     &other.y,    &other.weight, &other.bias,
                      &other.rmean, &other.rvar, &other.smean,  &other.sinvstd};
  float* y0 = t.y;
  for (size_t k = 0; k < sizeof places / sizeof places[0] && !sbn_test_cur_failed_; k++)
    for (int kind = 0; kind < 2; kind++) { /* 0: device 1's memory, 1: host memory */
      float* keep = *places[k];
      *places[k] = kind ? host : *others[k];
      memset(y0, 0x5a, big);
      cudart_stub_reset();
      const sbnResult_t r = forward(v, &t);
      *places[k] = keep;
      const int n = cudart_stub_launches(NULL, 0);
      char want[64];
      snprintf(want, sizeof want, kind ? "%s (" : "%s is memory of device 1", names[k]);
      const char* msg = sbnGetLastError(v);
      if (r != sbnInvalidArgument || n != 0 || strstr(msg, want) == NULL ||
          (kind && strstr(msg, "is not device memory") == NULL))
        SBN_FAIL_("%s in %s memory: result %d, %d launches, '%s'", names[k],
                  kind ? "host" : "device 1's", (int)r, n, msg);
      for (size_t i = 0; i < big; i++)
        if (((unsigned char*)y0)[i] != 0x5a) {
          SBN_FAIL_("%s in %s memory: y byte %zu written", names[k], kind ? "host" : "device 1's",
                    i);
          break;
        }
    }
  /* the message names the entry point called (it said sbnForwardTrain or sbnBackward for
     the Ex ones) */
  sbnEpilogue_t leaky = SBN_EPILOGUE_INITIALIZER;
  leaky.activation = sbnActivationLeakyRelu;
  leaky.slope = 0.5f;
  for (int e = 0; e < 3 && !sbn_test_cur_failed_; e++) {
    static const char* const fn[3] = {"sbnForwardTrainEx: x is memory of device 1",
                                      "sbnBackwardEx: x is memory of device 1",
                                      "sbnBackwardInPlaceEx: y is memory of device 1"};
    cudart_stub_reset();
    const sbnResult_t r =
        e == 0 ? sbnForwardTrainEx(v, &g_desc, other.x, NULL, t.y, t.weight, t.bias, t.rmean,
                                   t.rvar, t.nbt, t.smean, t.sinvstd, NULL, &leaky, NULL)
        : e == 1
            ? sbnBackwardEx(v, &g_desc, other.x, t.y, t.dy, t.dx, NULL, t.weight, t.bias, t.smean,
                            t.sinvstd, t.dweight, t.dbias, NULL, &leaky, NULL)
            : sbnBackwardInPlaceEx(v, &g_desc, other.y, NULL, t.dy, t.dx, NULL, t.weight, t.bias,
                                   t.smean, t.sinvstd, t.dweight, t.dbias, NULL, &leaky, NULL);
    ASSERT_RES(r, sbnInvalidArgument);
    if (strstr(sbnGetLastError(v), fn[e]) == NULL)
      SBN_FAIL_("'%s', not '%s'", sbnGetLastError(v), fn[e]);
  }
  /* every tensor on the rank's device: the op runs */
  cudart_stub_reset();
  ASSERT_OK(forward(v, &t));
  ASSERT_EQ_INT(cudart_stub_launches(NULL, 0), 1);
  ASSERT_OK(sbnCommDestroy(v));
  setenv("SBN_ALGO", "nccl", 1);
  free(host);
  tensors_free(&t);
  tensors_free(&other);
  cudaSetDevice(0);
  ASSERT_CLEAN();
}

/* An sbnCommInitAll team of two devices whose cudaSetDevice(1) fails once, at each of its
   calls in turn: the init fails, or its transport is "peer" only where each device enabled
   peer access to the other (the kernels read the other device's mailboxes), else another
   transport. At least one such failure lands where peer access is enabled. */
static void test_peer_transport_needs_access(void) {
  int other = 0; /* inits that succeeded without the peer transport */
  for (int nth = 1; nth <= 16 && !sbn_test_cur_failed_; nth++) {
    stub_case(NULL);
    cudart_stub_fail_set_device(1, nth);
    sbnComm_t comms[2] = {NULL, NULL};
    const sbnResult_t r = init_all_two(comms, TIMEOUT_MS);
    cudart_stub_fail_set_device(-1, 0);
    if (r != sbnSuccess) continue;
    const int peer = strcmp(transport_of(comms[0]), "peer") == 0;
    const int both = cudart_stub_peer_enabled(0, 1) && cudart_stub_peer_enabled(1, 0);
    other += !peer;
    ASSERT_OK(sbnCommDestroy(comms[0]));
    ASSERT_OK(sbnCommDestroy(comms[1]));
    if (peer && !both)
      SBN_FAIL_("cudaSetDevice(1) call %d failed: transport peer without peer access both ways",
                nth);
    ASSERT_CLEAN();
  }
  ASSERT_TRUE(other > 0);
}

/* A team whose ranks wait in-kernel for other GPUs leaves SMs free beside its cooperative
   grid (SBN_SM_MARGIN, default 32, never more than half the device), so that a kernel
   that blocks on another GPU (DDP's NCCL all-reduce on another stream) finds room and the
   two cannot wait for each other; a team on one GPU fills it unless SBN_SM_MARGIN is set.
   Here a device has 4 SMs of 2 blocks each, and the op asks for 64 blocks (one per 8192
   elements). */
static void test_grid_leaves_sms_free(void) {
  stub_case(NULL);
  const int64_t n = 2, c = 64, sp = 4096; /* 524288 elements */
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, TIMEOUT_MS));
  /* default: 4 - 32 SMs, but at least half of the 4: 2 SMs, 4 blocks */
  ASSERT_EQ_INT((int)coop_grid(comms[0], comms[1], 1, n, c, sp), 2 * CUDA_STUB_BLOCKS_PER_SM);
  setenv("SBN_SM_MARGIN", "1", 1);
  ASSERT_EQ_INT((int)coop_grid(comms[0], comms[1], 1, n, c, sp), 3 * CUDA_STUB_BLOCKS_PER_SM);
  setenv("SBN_SM_MARGIN", "0", 1);
  ASSERT_EQ_INT((int)coop_grid(comms[0], comms[1], 1, n, c, sp), CUDA_STUB_SMS * CUDA_STUB_BLOCKS_PER_SM);
  const char* bad[] = {"-1", " 1", "1 ", "+1", "4097", "x"}; /* refused: digits only, <= 4096 */
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("SBN_SM_MARGIN", bad[i], 1);
    if (coop_grid(comms[0], comms[1], 1, n, c, sp) != 0) SBN_FAIL_("SBN_SM_MARGIN='%s' was taken", bad[i]);
  }
  unsetenv("SBN_SM_MARGIN");
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
  /* a team of one (nothing on another GPU to wait for): every SM */
  sbnNcclUniqueId_t id;
  ASSERT_OK(sbnGetNcclUniqueId(&id));
  sbnComm_t one = NULL;
  ASSERT_OK(init_rank(&one, &id, 1, 0, TIMEOUT_MS));
  ASSERT_EQ_INT((int)coop_grid(one, NULL, 0, n, c, sp), CUDA_STUB_SMS * CUDA_STUB_BLOCKS_PER_SM);
  /* ... unless the margin is set: then it leaves that many, never more than half */
  setenv("SBN_SM_MARGIN", "1", 1);
  ASSERT_EQ_INT((int)coop_grid(one, NULL, 0, n, c, sp), 3 * CUDA_STUB_BLOCKS_PER_SM);
  setenv("SBN_SM_MARGIN", "3", 1);
  ASSERT_EQ_INT((int)coop_grid(one, NULL, 0, n, c, sp), 2 * CUDA_STUB_BLOCKS_PER_SM);
  unsetenv("SBN_SM_MARGIN");
  ASSERT_OK(sbnCommDestroy(one));
  /* two ranks on one GPU (sbnCommInitAll{0,0}): nothing on another GPU to wait for; they
     share the device's blocks (half each, at the lowest occupancy), with no SM left free */
  const int same[2] = {0, 0};
  const sbnConfig_t cfg = case_config(TIMEOUT_MS);
  ASSERT_OK(sbnCommInitAll(comms, 2, same, &cfg));
  ASSERT_EQ_INT((int)coop_grid(comms[0], comms[1], 0, n, c, sp),
                CUDA_STUB_SMS * CUDA_STUB_BLOCKS_PER_SM / 2);
  setenv("SBN_SM_MARGIN", "1", 1); /* 3 SMs left, half each */
  ASSERT_EQ_INT((int)coop_grid(comms[0], comms[1], 0, n, c, sp), 3 * CUDA_STUB_BLOCKS_PER_SM / 2);
  unsetenv("SBN_SM_MARGIN");
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
  ASSERT_CLEAN();
}

/* The cooperative kernel a team of one's op runs under SBN_KERNEL=auto (sbnCommGetKernel:
   gpu_launch.c's plan; the stand-in launches nothing). 2 x 64 NCHW planes: stream's G is 8
   (4 SMs of 2 blocks), below 2C, so unit applies, and auto takes it (E32's A/B): a plain op
   on planes of whole 16-byte vectors, and the backward on fp16/bf16 planes that are not
   (1030), whose forward runs stream; an op with an activation runs stream (the round's
   epilogue flag, plan_round: unit's fused kernels were not in that A/B). H*W = 1 (2 rows,
   as S10's 4): small (E33's A/B), the op with an activation too; NHWC of 2 x 4 x 8 rows
   (64) small, of 2 x 5 x 7 (70) stream. Then the host path (SBN_ALGO=nccl) of the same
   team (launch_host_nccl) and of a virtual team of one (launch_one_device's): where the
   cooperative kernel is small, small's statistics kernel and the apply kernel are what it
   launches (no stream statistics, no publish), the bits of the cooperative kernel
   (test_coop_emu: test_host_path_equals_small); elsewhere the stream stages. */
/* sbnForwardInference on device memory launches the kernel of its layout
   (coop_plan.h: sbn_infer_kind) on the grid its launch plans (gpu_infer.c): the flat kernel
   for NCHW planes of 2048 elements or more in 16-byte vectors, on no more blocks than its
   steps need nor than the device holds at once (the stand-in's CUDA_STUB_SMS x
   CUDA_STUB_BLOCKS_PER_SM); the plane kernel for smaller planes, unaligned tensors and
   SBN_INFER=plane (at most 8 blocks per SM); the tile kernel for NHWC; SBN_INFER with
   another value: sbnInvalidArgument, nothing launched. */
static void test_inference_kernel(void) {
  stub_case(NULL);
  static const struct {
    sbnDataType_t dt;
    sbnLayout_t lay;
    int64_t n, c, sp;
    int off;           /* x one element off 16-byte alignment */
    const char* env;   /* SBN_INFER (NULL: unset) */
    int kind;          /* SBN_INFER_* launched, -1: refused */
    unsigned grid;
    int occ_fails;     /* the occupancy query fails (cudart_stub_set_occupancy_fails) */
  } cases[] = {
      /* 4096 vectors: 128 steps of 32, 4 blocks of 8 warps x 4 steps */
      {sbnFloat32, sbnLayoutNCHW, 1, 4, 4096, 0, NULL, SBN_INFER_FLAT, 4, 0},
      {sbnFloat32, sbnLayoutNCHW, 4, 16, 4096, 0, NULL, SBN_INFER_FLAT, CUDA_STUB_SMS * CUDA_STUB_BLOCKS_PER_SM, 0},
      {sbnBFloat16, sbnLayoutNCHW, 4, 16, 4096, 0, "auto", SBN_INFER_FLAT, CUDA_STUB_SMS * CUDA_STUB_BLOCKS_PER_SM, 0},
      {sbnFloat32, sbnLayoutNCHW, 4, 16, 4096, 0, "plane", SBN_INFER_PLANE, CUDA_STUB_SMS * 8, 0}, /* 64 planes */
      {sbnFloat32, sbnLayoutNCHW, 1, 4, 4096, 1, NULL, SBN_INFER_PLANE, 4, 0},
      {sbnBFloat16, sbnLayoutNCHW, 2, 8, 1030, 0, NULL, SBN_INFER_PLANE, 2, 0}, /* warps: 8 planes a block */
      {sbnFloat32, sbnLayoutNHWC, 2, 8, 4096, 0, NULL, SBN_INFER_TILE, 16, 0},  /* 4096 elements a block */
      {sbnFloat32, sbnLayoutNCHW, 1, 4, 4096, 0, "flat", -1, 0, 0},
      /* fp16's flat kernel, asked first with a failing occupancy query: 32768 vectors, 1024
         steps, 32 blocks, capped at 8 per SM (the tile and plane kernels' cap), 32; then
         with the query answering 2 per SM: 8. The failure was not kept as the answer. */
      {sbnFloat16, sbnLayoutNCHW, 4, 16, 4096, 0, NULL, SBN_INFER_FLAT, CUDA_STUB_SMS * 8, 1},
      {sbnFloat16, sbnLayoutNCHW, 4, 16, 4096, 0, NULL, SBN_INFER_FLAT, CUDA_STUB_SMS * CUDA_STUB_BLOCKS_PER_SM, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !sbn_test_cur_failed_; i++) {
    const sbnTensorDesc_t d = {cases[i].dt, cases[i].lay, cases[i].n, cases[i].c, cases[i].sp};
    const size_t es = cases[i].dt == sbnFloat32 ? 4 : 2, bytes = (size_t)(d.n * d.c * d.spatial) * es;
    char *x = (char*)dalloc(bytes + 16), *y = (char*)dalloc(bytes + 16);
    float* st = (float*)dalloc((size_t)d.c * 4 * sizeof(float)); /* weight, bias, mean, var */
    if (cases[i].env)
      setenv("SBN_INFER", cases[i].env, 1);
    else
      unsetenv("SBN_INFER");
    cudart_stub_reset();
    cudart_stub_set_occupancy_fails(cases[i].occ_fails);
    const void* fns[CUDA_STUB_LAUNCH_LOG];
    const sbnResult_t r = sbnForwardInference(&d, x + cases[i].off * es, y + cases[i].off * es, st, st + d.c,
                                              st + 2 * d.c, st + 3 * d.c, 1e-5f, NULL);
    const int n = cudart_stub_launches(fns, CUDA_STUB_LAUNCH_LOG);
    const unsigned grid = cudart_stub_last_grid();
    cudart_stub_set_occupancy_fails(0);
    unsetenv("SBN_INFER");
    cudaDeviceSynchronize();
    cudaFree(x), cudaFree(y), cudaFree(st);
    if (cases[i].kind < 0) {
      ASSERT_EQ_INT(r, sbnInvalidArgument);
      ASSERT_EQ_INT(n, 0);
      if (strstr(sbnGetLastError(NULL), "SBN_INFER='flat'") == NULL)
        SBN_FAIL_("case %zu: the error says '%s'", i, sbnGetLastError(NULL));
      continue;
    }
    ASSERT_OK(r);
    const void* want = sbn_infer_kernel_ptr(cases[i].dt, cases[i].kind, !cases[i].off, 0);
    if (n != 1 || want == NULL || fns[0] != want || grid != cases[i].grid)
      SBN_FAIL_("case %zu: %d launches, the %s kernel %s, on %u blocks (want %u)", i, n,
                cases[i].kind == SBN_INFER_FLAT ? "flat" : cases[i].kind == SBN_INFER_TILE ? "tile" : "plane",
                n >= 1 && fns[0] == want ? "launched" : "not launched", grid, cases[i].grid);
  }
}

/* Two ranks' tensors (rank q's on device devs[q]) and streams of their own, for the group
   tests below. */
typedef struct {
  tensors_t t[2];
  cudaStream_t st[2];
} duo_t;
static void duo_alloc(duo_t* p, const int devs[2]) {
  for (int q = 0; q < 2; q++) {
    tensors_alloc(&p->t[q], devs[q]);
    p->st[q] = NULL;
    cudaStreamCreateWithFlags(&p->st[q], cudaStreamNonBlocking);
  }
}
static void duo_free(duo_t* p) {
  for (int q = 0; q < 2; q++) {
    tensors_free(&p->t[q]);
    cudaStreamDestroy(p->st[q]);
  }
}
/* An sbnCommInitAll team of two ranks on devs, and a duo of tensors and streams for it. */
static sbnResult_t duo_team(sbnComm_t comms[2], duo_t* p, const int devs[2]) {
  const sbnConfig_t cfg = case_config(TIMEOUT_MS);
  comms[0] = comms[1] = NULL;
  const sbnResult_t r = sbnCommInitAll(comms, 2, devs, &cfg);
  if (r == sbnSuccess) duo_alloc(p, devs);
  return r;
}
/* Both ranks' forward in one group, rank q's on st[q] (st NULL: the pair's own streams);
   sbnGroupEnd's result. */
static sbnResult_t duo_group_forward(const sbnComm_t comms[2], duo_t* p, const cudaStream_t* st) {
  sbnGroupStart();
  for (int q = 0; q < 2; q++) {
    tensors_t* t = &p->t[q];
    sbnForwardTrain(comms[q], &g_desc, t->x, t->y, t->weight, t->bias, t->rmean, t->rvar, NULL,
                    t->smean, t->sinvstd, NULL, (sbnStream_t)(st != NULL ? st[q] : p->st[q]));
  }
  return sbnGroupEnd();
}

/* Ranks of an sbnCommInitAll team that share a GPU, in one group: the legacy default
   stream by either handle (NULL, cudaStreamLegacy) for one of them, or one stream for both
   (cudaStreamPerThread from one thread included), is sbnInvalidUsage with nothing launched
   (the launches would serialize and time out); two streams of their own, or the
   per-thread stream beside another, run. */
static void test_shared_gpu_streams(void) {
  stub_case(NULL);
  const int same[2] = {0, 0};
  sbnComm_t comms[2];
  duo_t p;
  ASSERT_OK(duo_team(comms, &p, same));
  const cudaStream_t* own = p.st;
  const struct {
    cudaStream_t s0, s1;
    int ok;
  } cases[] = {{own[0], own[1], 1},
               {cudaStreamPerThread, own[1], 1},
               {NULL, own[1], 0},
               {own[0], NULL, 0},
               {cudaStreamLegacy, own[1], 0},
               {own[0], cudaStreamLegacy, 0},
               {cudaStreamPerThread, cudaStreamLegacy, 0},
               {cudaStreamLegacy, cudaStreamLegacy, 0},
               {own[0], own[0], 0},
               {cudaStreamPerThread, cudaStreamPerThread, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !sbn_test_cur_failed_; i++) {
    const cudaStream_t st[2] = {cases[i].s0, cases[i].s1};
    cudart_stub_reset();
    unsetenv("SBN_ALGO"); /* the cooperative kernel */
    const sbnResult_t r = duo_group_forward(comms, &p, st);
    setenv("SBN_ALGO", "nccl", 1);
    const void* fns[CUDA_STUB_LAUNCH_LOG];
    const int n = cudart_stub_launches(fns, CUDA_STUB_LAUNCH_LOG);
    if (cases[i].ok ? (r != sbnSuccess || n == 0)
                    : (r != sbnInvalidUsage || n != 0 ||
                       strstr(sbnGetLastError(comms[0]), "not the legacy default stream") == NULL))
      SBN_FAIL_("case %zu: %s, %d launches (%s)", i, sbnGetResultName(r), n,
                sbnGetLastError(comms[0]));
    cudaDeviceSynchronize();
  }
  for (int q = 0; q < 2; q++) ASSERT_OK(sbnCommDestroy(comms[q]));
  duo_free(&p);
  ASSERT_CLEAN();
}

/* A group of an sbnCommInitAll team under a CUDA graph capture whose first cooperative
   launch fails captured nothing: sbnCudaError, the team usable, and its ranks still carry
   their call numbers, so a call refused on rank 0 alone is found at the next group (ranks
   out of step), as without the capture. A capture that launched marks them for good:
   then the same refusal passes unseen (USAGE.md: a rank that captured carries no count). */
static void test_failed_capture_keeps_count(void) {
  stub_case(NULL);
  const int devs[2] = {0, 1};
  const sbnConfig_t cfg = case_config(TIMEOUT_MS);
  duo_t p;
  duo_alloc(&p, devs);
  unsetenv("SBN_ALGO"); /* the cooperative kernel */
  for (int capture_launches = 0; capture_launches < 2 && !sbn_test_cur_failed_;
       capture_launches++) {
    sbnComm_t comms[2] = {NULL, NULL};
    ASSERT_OK(sbnCommInitAll(comms, 2, devs, &cfg));
    cudart_stub_set_capturing(1);
    cudart_stub_set_coop_launch_fails(!capture_launches);
    const sbnResult_t captured = duo_group_forward(comms, &p, NULL);
    cudart_stub_set_capturing(0);
    cudart_stub_set_coop_launch_fails(0);
    ASSERT_EQ_INT(captured, capture_launches ? sbnSuccess : sbnCudaError);
    ASSERT_OK(duo_group_forward(comms, &p, NULL)); /* eager: the team is usable */
    /* a call refused on rank 0 alone (desc NULL): it counts there */
    ASSERT_EQ_INT(sbnForwardTrain(comms[0], NULL, p.t[0].x, p.t[0].y, NULL, NULL, NULL, NULL, NULL,
                                  p.t[0].smean, p.t[0].sinvstd, NULL, (sbnStream_t)p.st[0]),
                  sbnInvalidArgument);
    const sbnResult_t r = duo_group_forward(comms, &p, NULL);
    if (capture_launches
            ? r != sbnSuccess
            : r != sbnInvalidUsage || strstr(sbnGetLastError(NULL), "out of step") == NULL)
      SBN_FAIL_("capture %s: the group after rank 0's refused call: %s (%s)",
                capture_launches ? "launched" : "failed", sbnGetResultName(r),
                sbnGetLastError(NULL));
    for (int q = 0; q < 2; q++) {
      cudaSetDevice(q);
      cudaDeviceSynchronize();
    }
    if (r != sbnSuccess) sbnCommAbort(comms[0]);
    for (int q = 0; q < 2; q++) sbnCommDestroy(comms[q]);
  }
  setenv("SBN_ALGO", "nccl", 1);
  duo_free(&p);
}

/* A group of an sbnCommInitAll team (two devices) whose rank 0's stream captures a CUDA
   graph and rank 1's does not (or the other way): sbnInvalidUsage naming both, nothing
   launched, the team usable (the captured rank would run at the replay, the other now,
   waiting for it until the timeout); both streams capturing, or neither, run. On the
   cooperative path and the host path. */
static void test_group_mixed_capture(void) {
  stub_case(NULL);
  const int devs[2] = {0, 1};
  sbnComm_t comms[2];
  duo_t p;
  ASSERT_OK(duo_team(comms, &p, devs));
  for (int host = 0; host < 2 && !sbn_test_cur_failed_; host++)
    for (int c = 0; c < 4 && !sbn_test_cur_failed_; c++) { /* rank 0's, rank 1's, both, none */
      cudart_stub_reset();
      if (host)
        setenv("SBN_ALGO", "nccl", 1);
      else
        unsetenv("SBN_ALGO");
      if (c < 2) cudart_stub_set_capturing_stream(p.st[c]);
      cudart_stub_set_capturing(c == 2);
      const sbnResult_t r = duo_group_forward(comms, &p, NULL);
      cudart_stub_set_capturing_stream(NULL);
      cudart_stub_set_capturing(0);
      const void* fns[CUDA_STUB_LAUNCH_LOG];
      const int n = cudart_stub_launches(fns, CUDA_STUB_LAUNCH_LOG);
      char want[96];
      snprintf(want, sizeof want, "rank %d's stream captures a CUDA graph and rank %d's does not",
               c, 1 - c);
      if (c < 2 ? (r != sbnInvalidUsage || n != 0 || strstr(sbnGetLastError(NULL), want) == NULL)
                : r != sbnSuccess || n == 0)
        SBN_FAIL_("%s path, %s capturing: %s, %d launches (%s)", host ? "host" : "cooperative",
                  c == 0   ? "rank 0's stream"
                  : c == 1 ? "rank 1's stream"
                  : c == 2 ? "both"
                           : "none",
                  sbnGetResultName(r), n, sbnGetLastError(NULL));
      for (int q = 0; q < 2; q++) {
        cudaSetDevice(q);
        cudaDeviceSynchronize();
      }
    }
  setenv("SBN_ALGO", "nccl", 1);
  for (int q = 0; q < 2; q++) ASSERT_OK(sbnCommDestroy(comms[q]));
  duo_free(&p);
  ASSERT_CLEAN();
}

/* sbnForwardInference runs on the device of running_mean: a tensor of another device
   (x, z, y, weight, bias, running_var in turn on device 1) is sbnInvalidArgument that names
   it, with nothing launched, y untouched and the current device as it was; all on device 1
   runs there (one launch) and leaves device 0 current. */
static void test_inference_one_device(void) {
  stub_case(NULL);
  const sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, 2, 4, 64};
  const size_t bytes = (size_t)(d.n * d.c * d.spatial) * sizeof(float),
               chan = (size_t)d.c * sizeof(float);
  enum { X, Z, Y, W, B, MEAN, VAR, NT };
  static const char* const names[NT] = {"x",          "z", "y", "weight", "bias", "running_mean",
                                        "running_var"};
  void* t[2][NT];
  for (int dev = 0; dev < 2; dev++) {
    cudaSetDevice(dev);
    for (int k = 0; k < NT; k++) t[dev][k] = dalloc(k <= Y ? bytes : chan);
  }
  cudaSetDevice(0);
  const sbnEpilogue_t epi = SBN_EPILOGUE_INITIALIZER;
  for (int odd = -1; odd < NT && !sbn_test_cur_failed_; odd++) {
    if (odd == MEAN) continue;
    void* a[NT];
    for (int k = 0; k < NT; k++) a[k] = t[odd == k ? 1 : 0][k];
    memset(a[Y], 0x5a, bytes);
    cudart_stub_reset();
    const sbnResult_t r =
        sbnForwardInferenceEx(&d, a[X], a[Z], a[Y], a[W], a[B], a[MEAN], a[VAR], 1e-5f, &epi, NULL);
    const void* fns[CUDA_STUB_LAUNCH_LOG];
    const int n = cudart_stub_launches(fns, CUDA_STUB_LAUNCH_LOG);
    int cur = -1;
    cudaGetDevice(&cur);
    ASSERT_EQ_INT(cur, 0);
    if (odd < 0) {
      ASSERT_OK(r);
      ASSERT_EQ_INT(n, 1);
      continue;
    }
    char want[64];
    snprintf(want, sizeof want, "%s is memory of device 1", names[odd]);
    if (r != sbnInvalidArgument || n != 0 || strstr(sbnGetLastError(NULL), want) == NULL)
      SBN_FAIL_("%s on device 1: result %d, %d launches, '%s'", names[odd], (int)r, n,
                sbnGetLastError(NULL));
    for (size_t i = 0; i < bytes; i++)
      if (((unsigned char*)a[Y])[i] != 0x5a) {
        SBN_FAIL_("%s on device 1: y byte %zu written", names[odd], i);
        break;
      }
  }
  /* all on device 1, device 0 current: the op runs on device 1 and gives device 0 back */
  cudart_stub_reset();
  ASSERT_OK(sbnForwardInferenceEx(&d, t[1][X], t[1][Z], t[1][Y], t[1][W], t[1][B], t[1][MEAN],
                                  t[1][VAR], 1e-5f, &epi, NULL));
  int cur = -1;
  cudaGetDevice(&cur);
  ASSERT_EQ_INT(cur, 0);
  cudaDeviceSynchronize();
  for (int dev = 0; dev < 2; dev++)
    for (int k = 0; k < NT; k++) cudaFree(t[dev][k]);
}

/* What auto runs for a team of one (an NCCL team of one and a virtual one), the plain op
   and ReLU's alike (coop_plan.h: sbn_unit_auto, sbn_small_auto): unit on NCHW planes but
   the forward of fp16/bf16 planes that are not whole vectors, small on few rows of tile
   units, else stream; and what the host path launches for each. */
static void test_team_of_one_kernel(void) {
  stub_case(NULL);
  static const struct {
    sbnDataType_t dt;
    sbnLayout_t lay;
    int64_t sp;
    int relu;
    const char *fwd, *bwd;
  } cases[] = {{sbnFloat32, sbnLayoutNCHW, 4096, 0, "unit", "unit"},
               {sbnFloat32, sbnLayoutNCHW, 4096, 1, "unit", "unit"},
               {sbnBFloat16, sbnLayoutNCHW, 1030, 0, "stream", "unit"},
               {sbnBFloat16, sbnLayoutNCHW, 1030, 1, "stream", "unit"},
               {sbnBFloat16, sbnLayoutNCHW, 1032, 0, "unit", "unit"},
               {sbnFloat32, sbnLayoutNCHW, 1, 0, "small", "small"},
               {sbnBFloat16, sbnLayoutNCHW, 1, 1, "small", "small"},
               {sbnFloat16, sbnLayoutNHWC, 32, 0, "small", "small"},
               {sbnFloat32, sbnLayoutNHWC, 35, 0, "stream", "stream"}};
  sbnNcclUniqueId_t id;
  ASSERT_OK(sbnGetNcclUniqueId(&id));
  sbnComm_t one = NULL, virt = NULL;
  ASSERT_OK(init_rank(&one, &id, 1, 0, TIMEOUT_MS));
  ASSERT_OK(sbnCommInitVirtual(&virt, 1, 0, NULL));
  unsetenv("SBN_ALGO"); /* the cooperative kernel */
  for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !sbn_test_cur_failed_; i++)
    for (int host = 0; host < 3 && !sbn_test_cur_failed_; host++) {
      /* host 0: the cooperative kernel; 1: the host path of the NCCL team; 2: of the virtual
         team */
      if (host > 0) setenv("SBN_ALGO", "nccl", 1);
      sbnComm_t comm = host == 2 ? virt : one;
      const int64_t c = 64;
      const sbnTensorDesc_t d = {cases[i].dt, cases[i].lay, 2, c, cases[i].sp};
      const size_t big = (size_t)(2 * c * cases[i].sp) * (cases[i].dt == sbnFloat32 ? 4 : 2);
      void *x = dalloc(big), *y = dalloc(big), *dy = dalloc(big), *dx = dalloc(big);
      float *sm = (float*)dalloc((size_t)c * sizeof(float)),
            *si = (float*)dalloc((size_t)c * sizeof(float));
      sbnEpilogue_t ep = SBN_EPILOGUE_INITIALIZER;
      ep.activation = sbnActivationRelu;
      const char *kf = "", *kb = "";
      const void* fns[2][CUDA_STUB_LAUNCH_LOG];
      int nf[2];
      cudart_stub_reset();
      const sbnResult_t fr =
          cases[i].relu
              ? sbnForwardTrainEx(comm, &d, x, NULL, y, NULL, NULL, NULL, NULL, NULL, sm, si, NULL,
                                  &ep, NULL)
              : sbnForwardTrain(comm, &d, x, y, NULL, NULL, NULL, NULL, NULL, sm, si, NULL, NULL);
      const sbnResult_t gf = sbnCommGetKernel(comm, &kf);
      nf[0] = cudart_stub_launches(fns[0], CUDA_STUB_LAUNCH_LOG);
      cudart_stub_reset();
      const sbnResult_t br =
          cases[i].relu ? sbnBackwardEx(comm, &d, x, y, dy, dx, NULL, NULL, NULL, sm, si, NULL,
                                        NULL, NULL, &ep, NULL)
                        : sbnBackward(comm, &d, x, dy, dx, NULL, sm, si, NULL, NULL, NULL, NULL);
      const sbnResult_t gb = sbnCommGetKernel(comm, &kb);
      nf[1] = cudart_stub_launches(fns[1], CUDA_STUB_LAUNCH_LOG);
      cudaDeviceSynchronize();
      void* all[] = {x, y, dy, dx, sm, si};
      for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) cudaFree(all[k]);
      if (fr != sbnSuccess || br != sbnSuccess)
        fprintf(stderr, "  op: %s\n", sbnGetLastError(comm));
      ASSERT_OK(fr);
      ASSERT_OK(gf);
      ASSERT_OK(br);
      ASSERT_OK(gb);
      if (host == 0 && (strcmp(kf, cases[i].fwd) != 0 || strcmp(kb, cases[i].bwd) != 0))
        SBN_FAIL_("case %zu: forward ran '%s', backward '%s'; want '%s', '%s'", i, kf, kb,
                  cases[i].fwd, cases[i].bwd);
      if (host > 0 && (strcmp(kf, "host") != 0 || strcmp(kb, "host") != 0))
        SBN_FAIL_("case %zu, SBN_ALGO=nccl: forward ran '%s', backward '%s'", i, kf, kb);
      /* the host path's launches: small's statistics (tile units: H*W = 1 or NHWC; the
         plain kernel's for the forward, which reads x only) then APPLY (the stream apply),
         or STATS, PUBLISH, APPLY; nothing else (a team of one: no gather) */
      for (int k = 0; host > 0 && k < 2 && !sbn_test_cur_failed_; k++) {
        const int small = strcmp(k ? cases[i].bwd : cases[i].fwd, "small") == 0;
        const int tile = cases[i].lay == sbnLayoutNHWC || cases[i].sp == 1;
        const int epi = cases[i].relu ? SBN_EPI_ACT : SBN_EPI_NONE;
        const int stats_epi = k == 0 ? SBN_EPI_NONE : epi;
        const int vec =
            sbn_vec_shape_ok(tile, c, cases[i].sp, cases[i].dt); /* (cudaMalloc'd: aligned) */
        const void* want[3];
        int nw = 0;
        if (small) {
          want[nw++] = sbn_host_kernel_ptr(SBN_HOST_SMALL_STATS, k, cases[i].dt, 1, vec, stats_epi);
        } else {
          want[nw++] = sbn_host_kernel_ptr(SBN_HOST_STATS, k, cases[i].dt, tile, vec, stats_epi);
          want[nw++] = sbn_host_kernel_ptr(SBN_HOST_PUBLISH, k, cases[i].dt, tile, vec, epi);
        }
        want[nw++] = sbn_host_kernel_ptr(SBN_HOST_APPLY, k, cases[i].dt, tile, vec, epi);
        int same = nf[k] == nw;
        for (int q = 0; q < nw && same; q++) same = want[q] != NULL && fns[k][q] == want[q];
        if (!same)
          SBN_FAIL_(
              "case %zu, SBN_ALGO=nccl (%s team), %s: %d launches, not the %d of the %s host path",
              i, host == 2 ? "virtual" : "NCCL", k ? "backward" : "forward", nf[k], nw,
              small ? "small plan's" : "stream");
      }
      unsetenv("SBN_ALGO");
    }
  setenv("SBN_ALGO", "nccl", 1);
  ASSERT_OK(sbnCommDestroy(virt));
  ASSERT_OK(sbnCommDestroy(one));
  ASSERT_CLEAN();
}

/* The stop words a failing kernel sets are slots, not ranks: an NCCL team may have more
   ranks than the kernels' arguments hold (SBN_GPU_MAX_RANKS). Rank 19 of 20 (the other
   ranks are other processes) fills one slot with its own word, where indexing by rank
   wrote past the array; an in-process team fills one slot per rank it can address. */
static void test_stop_slots(void) {
  stub_case(NULL);
  enum { W = 20 };
  gpu_rank_t ranks[W];
  sbn_rank_state_t states[W];
  memset(ranks, 0, sizeof ranks);
  for (int q = 0; q < W; q++) ranks[q].state = &states[q];
  struct sbn_gpu_team gt;
  memset(&gt, 0, sizeof gt);
  gt.nranks = W;
  gt.local = 19;
  gt.transport = SBN_TR_NCCL_COLL; /* nccl-host */
  gt.ranks = ranks;
  ranks[19].present = 1;
  uint32_t* slots[SBN_GPU_MAX_RANKS + 4];
  for (int i = 0; i < SBN_GPU_MAX_RANKS + 4; i++) slots[i] = NULL;
  ASSERT_EQ_INT(sbn_gpu_stop_words(&gt, 0, slots), 1);
  ASSERT_TRUE(slots[0] == &states[19].stop);
  for (int i = 1; i < SBN_GPU_MAX_RANKS + 4; i++) ASSERT_TRUE(slots[i] == NULL);
  /* an in-process team of 3 on devices {0, 1, 0} without peer access: device 0's two */
  gt.nranks = 3;
  gt.local = -1;
  gt.transport = SBN_TR_PEER_HOST;
  for (int q = 0; q < 3; q++) ranks[q].present = 1;
  ranks[1].device = 1;
  ASSERT_EQ_INT(sbn_gpu_stop_words(&gt, 0, slots), 2);
  ASSERT_TRUE(slots[0] == &states[0].stop && slots[1] == &states[2].stop);
  gt.transport = SBN_TR_PEER; /* with peer access: all three */
  ASSERT_EQ_INT(sbn_gpu_stop_words(&gt, 0, slots), 3);
  ASSERT_TRUE(slots[1] == &states[1].stop);
  ASSERT_CLEAN();
}

/* sbnCommAbort on one comm of an sbnCommInitAll team stops both ranks' kernels: each
   rank's stop word on its own device says sbnAborted. */
static void test_abort_two_devices_stop_words(void) {
  stub_case(NULL);
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, TIMEOUT_MS));
  int stop[2];
  ASSERT_EQ_INT(stop_words(stop), 2);
  ASSERT_EQ_INT(stop[0], 0);
  ASSERT_EQ_INT(stop[1], 0);
  ASSERT_OK(sbnCommAbort(comms[1]));
  ASSERT_EQ_INT(stop_words(stop), 2);
  ASSERT_EQ_INT(stop[0], sbnAborted);
  ASSERT_EQ_INT(stop[1], sbnAborted);
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
  ASSERT_EQ_INT(stop_words(stop), 0);
}

/* ---- a peer that never comes ------------------------------------------------------------ */

/* sbnCommInitNccl with NCCL call `hang` never finishing (NULL: the streams made from here
   never finish, as abort_while_waiting's): sbnTimeout, not before the timeout; every comm
   the library made is released; the caller's comm is the caller's (aborted here by the
   test when its own split hangs on it: the library must not have). */
static void init_stuck(const char* hang, const char* transport) {
  stub_case(hang);
  const int live0 = nccl_stub_live_comms();
  ncclComm_t nc = caller_comm(0, 1);
  sbnComm_t comm = NULL;
  if (hang == NULL) cudart_stub_set_new_streams_pending(1);
  const double t0 = now_ms();
  const sbnResult_t r = init_nccl(&comm, nc, transport, STUCK_TIMEOUT_MS);
  const double waited = now_ms() - t0;
  cudart_stub_set_new_streams_pending(0);
  ASSERT_RES(r, sbnTimeout);
  ASSERT_TRUE(comm == NULL);
  ASSERT_NOT_BEFORE_TIMEOUT(waited);
  ASSERT_TRUE(ncclCommAbort(nc) == ncclSuccess); /* still alive: the library left it alone */
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}
static void test_stuck_split_of_callers_comm(void) {
  init_stuck("ncclCommSplit", NULL);
}
static void test_stuck_split_child_init(void) {
  init_stuck("init (split child)", NULL);
}
static void test_stuck_agreement(void) {
  init_stuck("ncclAllReduce", NULL);
}
/* the agreement's ncclAllReduce issued, its stream never done (a peer that never makes the
   call): the wait for the result's copy ends at the timeout too */
static void test_stuck_agreement_runs(void) {
  init_stuck(NULL, "host");
}
static void test_stuck_window_register(void) {
  init_stuck("ncclCommWindowRegister", NULL);
}

/* An op whose ncclAllGather never finishes: sbnTimeout, the team aborted (later ops
   sbnAborted), its comm aborted; the destroy after it makes no collective call. */
static void stuck_op(const char* transport) {
  stub_case("ncclAllGather");
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, transport, STUCK_TIMEOUT_MS));
  tensors_t t;
  tensors_alloc(&t, 0);
  const double t0 = now_ms();
  const sbnResult_t fr = forward(comm, &t);
  const double waited = now_ms() - t0;
  const sbnResult_t again = forward(comm, &t);
  tensors_free(&t);
  ASSERT_RES(fr, sbnTimeout);
  ASSERT_NOT_BEFORE_TIMEOUT(waited);
  ASSERT_RES(again, sbnAborted);
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_RECORD("ncclAllGather", "ncclCommAbort");
  ASSERT_NO_RECORD("ncclCommFinalize");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}
static void test_stuck_allgather_lsa(void) {
  stuck_op(NULL);
}
static void test_stuck_allgather_host(void) {
  stuck_op("host");
}

/* A cooperative forward of the team (SBN_ALGO unset), its kernel left in flight on the
   stand-in device 0: an nccl-lsa comm must not be aborted under it (it maps the window the
   kernel writes through; the stand-in counts that as a violation). */
static void kernel_in_flight(sbnComm_t comm, tensors_t* t) {
  unsetenv("SBN_ALGO");
  const sbnResult_t fr = forward(comm, t);
  setenv("SBN_ALGO", "nccl", 1);
  ASSERT_OK(fr);
  ASSERT_TRUE(cudart_stub_in_flight(0) > 0);
}

/* sbnCommSplit whose ncclCommSplit never finishes (the team's own comm made the first),
   a cooperative kernel of the team still in flight: sbnTimeout, the parent team aborted,
   its comm (nccl-lsa) aborted once the device is idle (at the destroy), not at the split. */
static void test_stuck_team_split(void) {
  stub_case("ncclCommSplit:2");
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL, sub = (sbnComm_t)&sub;
  ASSERT_OK(team_of_one(&comm, NULL, STUCK_TIMEOUT_MS));
  ASSERT_TRUE(strcmp(transport_of(comm), "nccl-lsa") == 0);
  tensors_t t;
  tensors_alloc(&t, 0);
  kernel_in_flight(comm, &t);
  CHECK_();
  const double t0 = now_ms();
  const sbnResult_t sr = sbnCommSplit(comm, 0, 0, &sub);
  const double waited = now_ms() - t0;
  ASSERT_RES(sr, sbnTimeout);
  ASSERT_NOT_BEFORE_TIMEOUT(waited);
  ASSERT_TRUE(sub == (sbnComm_t)&sub);
  EXPECT_TRUE(nccl_stub_violations() == 0); /* none at the split */
  sbnResult_t a = sbnSuccess;
  EXPECT_TRUE(sbnCommGetAsyncError(comm, &a) == sbnSuccess);
  EXPECT_TRUE(a == sbnTimeout); /* the cause, not the sbnAborted of the stop word */
  /* a peer that came late: NCCL writes the child into the split's slot after the timeout,
     until the parent comm is aborted (at the destroy here); the destroy aborts it too */
  *sbn_gpu(comm->team)->split_slot = caller_comm(0, 1);
  const sbnResult_t fr = forward(comm, &t);
  tensors_free(&t);
  ASSERT_RES(fr, sbnAborted);
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}

/* sbnCommAbort from another thread while a call waits for a peer that never comes (its
   ncclAllGather, or sbnCommSplit's ncclCommSplit, never finishes): the waiting call returns
   sbnAborted at once, and so does the abort. The wait held the team's NCCL lock for
   reading and ignored the abort, which waited for the lock: both returned at the timeout
   (the call with sbnTimeout), up to 300 s later at the default. */
typedef struct {
  sbnComm_t comm;
  int split;
  sbnResult_t r;
  double t_end;
} waiter_t;
static void* waiter_main(void* p) {
  waiter_t* w = p;
  if (w->split) {
    sbnComm_t sub = NULL;
    w->r = sbnCommSplit(w->comm, 0, 0, &sub);
    if (w->r == sbnSuccess) sbnCommDestroy(sub);
  } else {
    tensors_t t;
    tensors_alloc(&t, 0);
    w->r = forward(w->comm, &t);
    tensors_free(&t);
  }
  w->t_end = now_ms();
  return NULL;
}
/* hang: the NCCL call that never finishes; NULL: the next stream made never finishes
   (cudart_stub_pend_next_streams: a split's new team's first, its agreement's, whose
   ncclAllReduce returns while the stream waits for the peer; the init's zeroing, on a
   stream made after it, finishes), the wait seen once that call is made; ZEROING: the
   next two streams (the new team's zeroing on the second never finishes: the init waits
   in it, before its agreement), the wait taken as begun once its ncclCommSplit is made */
static const char ZEROING[] = "(the split's new team's zeroing)";
static void abort_while_waiting(const char* transport, const char* hang, int split, int kernel) {
  const double timeout = 10000.0, prompt = 2000.0; /* the wait's end: at once, not the timeout */
  const int zeroing = hang == ZEROING;
  const char* waits = zeroing ? "ncclCommSplit" : hang != NULL ? "never finishes" : "ncclAllReduce";
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, transport, (int64_t)timeout));
  stub_case(zeroing ? NULL : hang); /* from here: the team's made */
  if (hang == NULL || zeroing) cudart_stub_pend_next_streams(zeroing ? 2 : 1);
  tensors_t t;
  tensors_alloc(&t, 0);
  if (kernel) kernel_in_flight(comm, &t); /* (its comm then aborted at the destroy) */
  CHECK_();
  waiter_t w = {comm, split, sbnSystemError, 0.0};
  pthread_t th;
  ASSERT_TRUE(pthread_create(&th, NULL, waiter_main, &w) == 0);
  /* the call waits in its collective once the stand-in says it never finishes (an abort
     before that would be refused by the team's check, testing nothing here) */
  const double s0 = now_ms();
  while (!nccl_stub_log_has(waits) && now_ms() - s0 < timeout / 2) {
    struct timespec ts = {0, 1000000L};
    nanosleep(&ts, NULL);
  }
  const int waiting = nccl_stub_log_has(waits);
  struct timespec ts = {0, 50 * 1000000L};
  nanosleep(&ts, NULL); /* into the settle's polls */
  const double a0 = now_ms();
  const sbnResult_t ar = sbnCommAbort(comm);
  const double a1 = now_ms();
  pthread_join(th, NULL);
  cudart_stub_pend_next_streams(0);
  fprintf(stderr, "  %s %s: the abort returned after %.1f ms; the call %s %.1f ms after the abort: %s\n",
          transport_of(comm), split ? "sbnCommSplit" : "forward", a1 - a0, sbnGetResultName(w.r), w.t_end - a0,
          sbnGetLastError(comm));
  EXPECT_TRUE(waiting); /* (the abort and the join all the same: no thread left behind) */
  ASSERT_OK(ar);
  ASSERT_RES(w.r, sbnAborted);
  EXPECT_TRUE(a1 - a0 < prompt);
  EXPECT_TRUE(w.t_end - a0 < prompt);
  ASSERT_OK(sbnCommDestroy(comm));
  tensors_free(&t);
  unsetenv("NCCL_STUB_HANG"); /* (not stub_case: its reset would clear what ASSERT_CLEAN reads) */
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}
static void test_abort_while_op_waits_host(void) {
  abort_while_waiting("host", "ncclAllGather", 0, 0);
}
static void test_abort_while_op_waits_lsa(void) {
  abort_while_waiting(NULL, "ncclAllGather", 0, 0);
}
static void test_abort_while_split_waits_host(void) {
  abort_while_waiting("host", "ncclCommSplit", 1, 0);
}
/* the team's cooperative kernel in flight: the comm is aborted at the destroy, once the
   device is idle, not while the kernel may write through its window */
static void test_abort_while_split_waits_lsa(void) {
  abort_while_waiting(NULL, "ncclCommSplit", 1, 1);
}
/* ncclCommSplit done, the new team's init waits for its ranks (its agreement, an
   ncclAllReduce; its window's registration): the abort of the team split ends that wait
   too, sbnAborted at once (it waited out the timeout: sbnTimeout) */
static void test_abort_while_split_child_agrees_host(void) {
  abort_while_waiting("host", "ncclAllReduce", 1, 0);
}
static void test_abort_while_split_child_agrees_lsa(void) {
  abort_while_waiting(NULL, "ncclAllReduce", 1, 0);
}
static void test_abort_while_split_child_registers(void) {
  abort_while_waiting(NULL, "ncclCommWindowRegister", 1, 0);
}
/* (its ncclAllReduce enqueued, its stream never done) */
static void test_abort_while_split_child_agreement_runs(void) {
  abort_while_waiting("host", NULL, 1, 0);
}
/* (before its agreement: the zeroing of its memory, on its own stream, never done) */
static void test_abort_while_split_child_zeroes(void) {
  abort_while_waiting("host", ZEROING, 1, 0);
}

/* sbnCommSplit of a virtual team of two in a group (one thread), whose new team's zeroing
   never finishes (its streams pending), and sbnCommAbort of the parent from another
   thread while the split waits for it: the parent's abort ends that wait, as it ends an
   NCCL split's (test_abort_while_split_child_zeroes): sbnAborted at once, naming the
   abort, no comm written, nothing left. (The wait ran out the timeout: sbnTimeout.) */
typedef struct {
  sbnComm_t* parent;
  sbnComm_t sub[2];
  sbnResult_t r;
  double t_end;
  char why[512];
} group_split_t;
static void* group_split_main(void* p) {
  group_split_t* g = p;
  sbnResult_t r = sbnGroupStart();
  for (int q = 0; q < 2 && r == sbnSuccess; q++) r = sbnCommSplit(g->parent[q], 0, q, &g->sub[q]);
  const sbnResult_t ge = sbnGroupEnd();
  g->r = r != sbnSuccess ? r : ge;
  g->t_end = now_ms();
  snprintf(g->why, sizeof g->why, "%s", sbnGetLastError(NULL));
  return NULL;
}
static void test_abort_while_in_process_split_zeroes(void) {
  const double timeout = 10000.0, prompt = 2000.0;
  stub_case(NULL);
  const size_t before = cudart_stub_live();
  const sbnConfig_t cfg = case_config((int64_t)timeout);
  sbnComm_t v[2] = {NULL, NULL};
  ASSERT_OK(sbnCommInitVirtual(v, 2, 0, &cfg));
  cudart_stub_reset(); /* from here: the split's steps */
  cudart_stub_set_new_streams_pending(1);
  group_split_t g = {v, {(sbnComm_t)&g, (sbnComm_t)&g}, sbnSystemError, 0.0, ""};
  pthread_t th;
  ASSERT_TRUE(pthread_create(&th, NULL, group_split_main, &g) == 0);
  /* the new team's memset issued (then its wait; an abort before the split would be
     refused by the group, testing nothing here) */
  int zeroing = 0;
  const double s0 = now_ms();
  while (!zeroing && now_ms() - s0 < timeout / 2) {
    cudart_stub_step_t st[CUDA_STUB_STEP_LOG];
    const int n = cudart_stub_steps(st, CUDA_STUB_STEP_LOG);
    for (int i = 0; i < n && i < CUDA_STUB_STEP_LOG; i++) zeroing |= st[i].what == 'M';
    struct timespec ts = {0, 1000000L};
    nanosleep(&ts, NULL);
  }
  struct timespec ts = {0, 50 * 1000000L};
  nanosleep(&ts, NULL); /* into the zeroing's polls */
  const double a0 = now_ms();
  const sbnResult_t ar = sbnCommAbort(v[0]);
  pthread_join(th, NULL);
  cudart_stub_set_new_streams_pending(0);
  fprintf(stderr, "  the split %s %.1f ms after the abort: %s\n", sbnGetResultName(g.r),
          g.t_end - a0, g.why);
  EXPECT_TRUE(zeroing);
  ASSERT_OK(ar);
  ASSERT_RES(g.r, sbnAborted);
  EXPECT_TRUE(g.t_end - a0 < prompt);
  EXPECT_TRUE(strstr(g.why, "ended by an abort") != NULL);
  ASSERT_TRUE(g.sub[0] == (sbnComm_t)&g && g.sub[1] == (sbnComm_t)&g);
  for (int q = 0; q < 2; q++) ASSERT_OK(sbnCommDestroy(v[q]));
  wait_releases();
  ASSERT_EQ_INT((int)cudart_stub_live(), (int)before);
  ASSERT_CLEAN();
}

/* What a cooperative kernel that waited for a missing peer writes at its deadline: its
   failure word (sbn_gpu_poll reads it). */
static void kernel_timed_out(void* gt) {
  __atomic_store_n(&((struct sbn_gpu_team*)gt)->err[0], (int)sbnTimeout, __ATOMIC_SEQ_CST);
}
/* sbnCommDestroy of an nccl-lsa team after a kernel reported a failure that no call read
   (no sbnCommGetAsyncError, no op since), or (running) while a kernel still waits, which
   reports it as it ends (at the destroy's cudaDeviceSynchronize): the team is counted
   aborted, so the destroy makes no collective call that the failed peer never makes (the
   window's deregistration, which never finishes here, then ncclCommFinalize): the comm
   aborted, at once. The teardown waited out the timeout, then aborted. */
static void destroy_after_kernel_failure(int running) {
  const double timeout = 5000.0;
  stub_case("ncclCommWindowDeregister");
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, NULL, (int64_t)timeout));
  ASSERT_TRUE(strcmp(transport_of(comm), "nccl-lsa") == 0);
  struct sbn_gpu_team* gt = sbn_gpu(comm->team);
  tensors_t t;
  tensors_alloc(&t, 0);
  if (running) {
    kernel_in_flight(comm, &t);
    CHECK_();
    cudart_stub_on_sync(kernel_timed_out, gt);
  } else {
    kernel_timed_out(gt);
  }
  const double t0 = now_ms();
  const sbnResult_t dr = sbnCommDestroy(comm);
  const double took = now_ms() - t0;
  tensors_free(&t);
  fprintf(stderr, "  destroy: %s after %.1f ms\n", sbnGetResultName(dr), took);
  unsetenv("NCCL_STUB_HANG"); /* (not stub_case: its reset would clear what ASSERT_CLEAN reads) */
  ASSERT_OK(dr);
  ASSERT_NO_RECORD("ncclCommWindowDeregister");
  ASSERT_NO_RECORD("ncclCommFinalize");
  ASSERT_RECORD("ncclCommAbort");
  EXPECT_TRUE(took < timeout / 2);
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}
static void test_destroy_after_unread_kernel_failure(void) {
  destroy_after_kernel_failure(0);
}
static void test_destroy_while_kernel_fails(void) {
  destroy_after_kernel_failure(1);
}

/* sbnCommDestroy whose ncclCommFinalize never finishes: the destroy returns (bounded by the
   timeout), the comm aborted. */
static void test_stuck_finalize(void) {
  stub_case("ncclCommFinalize");
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, "host", STUCK_TIMEOUT_MS));
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_RECORD("ncclCommFinalize", "ncclCommAbort");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}

/* sbnCommInitAll whose NCCL comms never finish their init: the team works without them
   (the coop path does not need them), and a host-path op says why it cannot run. */
static void stuck_initall_comms(void) {
  stub_case("ncclCommInitRankConfig");
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, STUCK_TIMEOUT_MS));
  tensors_t t;
  tensors_alloc(&t, 0);
  const sbnResult_t fr = forward(comms[0], &t);
  tensors_free(&t);
  ASSERT_RES(fr, sbnInvalidUsage);
  ASSERT_TRUE(strstr(sbnGetLastError(comms[0]), "timed out") != NULL);
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
  ASSERT_RECORD("ncclCommAbort", "ncclCommAbort");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}
/* also where rank 1's comm is ready at its first poll (NCCL_STUB_POLLS=0): the group's wait
   fails on rank 0's, whatever the comms after it say */
static void test_stuck_initall_comms(void) {
  const char* polls = getenv("NCCL_STUB_POLLS");
  char saved[32];
  snprintf(saved, sizeof saved, "%s", polls != NULL ? polls : "");
  for (int at_once = 0; at_once < 2 && !sbn_test_cur_failed_; at_once++) {
    if (at_once) setenv("NCCL_STUB_POLLS", "0", 1);
    stuck_initall_comms();
  }
  if (polls != NULL)
    setenv("NCCL_STUB_POLLS", saved, 1);
  else
    unsetenv("NCCL_STUB_POLLS");
  nccl_stub_reset();
}

/* An sbnCommInitAll team whose host-path collective may wait for a rank (collectives
   stuck), then, where `abort`, sbnCommAbort, and the destroy of both comms:
   - sbnCommAbort aborts the team's NCCL comms at once (ncclCommAbort in the record before
     sbnCommAbort returns), which is what makes such a collective return; the stand-in has
     no collective that waits, so that return itself is not observed here. Before, the
     comms were aborted only by the watchdog, at the timeout.
   - without it, the destroy aborts the comms too, and finalizes none (ncclCommFinalize
     would wait for the collective, and the device sync after it for ever). */
static void initall_op_pending(int abort) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, TIMEOUT_MS));
  tensors_t t[2];
  tensors_alloc(&t[0], 0);
  tensors_alloc(&t[1], 1);
  cudart_stub_set_collectives_stuck(1);
  ASSERT_OK(sbnGroupStart());
  const sbnResult_t f0 = forward(comms[0], &t[0]), f1 = forward(comms[1], &t[1]);
  ASSERT_OK(sbnGroupEnd());
  ASSERT_OK(f0);
  ASSERT_OK(f1);
  nccl_stub_reset();
  const sbnResult_t a = abort ? sbnCommAbort(comms[0]) : sbnSuccess;
  const int aborted_at_abort = nccl_stub_log_has("ncclCommAbort");
  const sbnResult_t d0 = sbnCommDestroy(comms[0]), d1 = sbnCommDestroy(comms[1]);
  cudart_stub_set_collectives_stuck(0);
  tensors_free(&t[0]);
  tensors_free(&t[1]);
  ASSERT_OK(a);
  ASSERT_OK(d0);
  ASSERT_OK(d1);
  if (abort && !aborted_at_abort)
    fprintf(stderr, "  no ncclCommAbort at sbnCommAbort:\n%s", nccl_stub_log());
  EXPECT_TRUE(!abort || aborted_at_abort);
  ASSERT_RECORD("ncclCommAbort", "ncclCommAbort");
  ASSERT_NO_RECORD("ncclCommFinalize");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}
static void test_initall_abort_ends_collective(void) {
  initall_op_pending(1);
}
static void test_destroy_initall_host_op_pending(void) {
  initall_op_pending(0);
}

/* ---- what a peer gives the agreements (NCCL_STUB_PEER_MIN) --------------------------------- */

/* sbnCommInitNccl of a team of one (SBN_NCCL_TRANSPORT `transport`) whose agreement `peer`
   ("k:v0,v1,...": the k-th; 1: ready, lsa possible, lsa required (-1), max_channels, its
   negation, the record's size, its negation; 2: the window part allocated; 3: the window
   usable) also holds a peer's values: the peer's part of the outcome reaches this rank.
   `want` the init's result; on success the comm says `transport_want` and runs ops, else
   `says` is in the detail; either way nothing is left behind, and a failed init wrote no
   comm. `registered`: whether the record has the window's registration. */
static void peer_case(const char* peer, const char* transport, sbnResult_t want,
                      const char* transport_want, const char* says, int registered) {
  setenv("NCCL_STUB_PEER_MIN", peer, 1);
  stub_case(NULL);
  unsetenv("NCCL_STUB_PEER_MIN"); /* read by the reset */
  const int live0 = nccl_stub_live_comms();
  ncclComm_t nc = caller_comm(0, 1);
  sbnComm_t comm = (sbnComm_t)&comm; /* a failed init writes nothing */
  const sbnResult_t r = init_nccl_into(&comm, nc, transport, TIMEOUT_MS);
  fprintf(stderr, "  peer %s, transport %s: %s %s\n", peer, transport ? transport : "auto",
          sbnGetResultName(r), r == sbnSuccess ? transport_of(comm) : sbnGetLastError(NULL));
  const int reg = nccl_stub_log_has("ncclCommWindowRegister c");
  if (r == sbnSuccess) {
    EXPECT_TRUE(transport_want != NULL && strcmp(transport_of(comm), transport_want) == 0);
    ops_ok(comm);
    EXPECT_TRUE(sbnCommDestroy(comm) == sbnSuccess);
  } else {
    EXPECT_TRUE(comm == (sbnComm_t)&comm);
    EXPECT_TRUE(says != NULL && strstr(sbnGetLastError(NULL), says) != NULL);
  }
  ASSERT_TRUE(ncclCommDestroy(nc) == ncclSuccess);
  ASSERT_RES(r, want);
  ASSERT_EQ_INT(reg, registered);
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}
/* A peer whose init failed, or whose config or build differs: every rank fails, this one
   with the peer's reason, not its own. */
static void test_peer_failed_or_differs(void) {
  peer_case("1:0", NULL, sbnInvalidUsage, NULL, "another rank of the team failed its init", 0);
  CHECK_();
  peer_case("1:1,1,0,32", NULL, sbnInvalidArgument, NULL, "max_channels differ", 0);
  CHECK_();
  peer_case("1:1,1,0,64,-64,0,-100000", NULL, sbnInvalidUsage, NULL, "different records", 0);
}
/* The transport every rank can use: a peer without the in-kernel transport makes it
   nccl-host (no window), which SBN_NCCL_TRANSPORT=lsa refuses; a peer that requires it
   refuses this rank's nccl-host; a peer without its window part, or whose window is not
   usable, makes it nccl-host too. */
static void test_peer_transport(void) {
  peer_case("1:1,0", NULL, sbnSuccess, "nccl-host", NULL, 0);
  CHECK_();
  peer_case("1:1,0", "lsa", sbnUnsupported, NULL, "SBN_NCCL_TRANSPORT=lsa", 0);
  CHECK_();
  peer_case("1:1,1,-1", "host", sbnUnsupported, NULL, "SBN_NCCL_TRANSPORT=lsa", 0);
  CHECK_();
  peer_case("2:0", NULL, sbnSuccess, "nccl-host", NULL, 0);
  CHECK_();
  peer_case("3:0", NULL, sbnSuccess, "nccl-host", NULL, 1);
}

/* NCCL registers the window, but not as a symmetric one (no P2P between the GPUs,
   NCCL_CUMEM_ENABLE=0, NCCL_WIN_ENABLE=0: a handle that is no device memory; here the query
   of the handle fails, which says no more): the team takes nccl-host, and
   SBN_NCCL_TRANSPORT=lsa is refused; nothing is left behind. */
static void test_window_not_symmetric(void) {
  for (int lsa = 0; lsa < 2; lsa++) {
    stub_case(NULL);
    const int live0 = nccl_stub_live_comms();
    ncclComm_t nc = caller_comm(0, 1);
    sbnComm_t comm = (sbnComm_t)&comm; /* a failed init writes nothing */
    cudart_stub_set_pointer_query_fails(1);
    const sbnResult_t r = init_nccl_into(&comm, nc, lsa ? "lsa" : NULL, TIMEOUT_MS);
    cudart_stub_set_pointer_query_fails(0);
    const int said = strstr(sbnGetLastError(NULL), "not as a symmetric window") != NULL;
    const int host = r == sbnSuccess && strcmp(transport_of(comm), "nccl-host") == 0;
    if (r == sbnSuccess) {
      ops_ok(comm);
      EXPECT_TRUE(sbnCommDestroy(comm) == sbnSuccess);
    }
    ASSERT_TRUE(ncclCommDestroy(nc) == ncclSuccess);
    ASSERT_RES(r, lsa ? sbnUnsupported : sbnSuccess);
    if (lsa) {
      ASSERT_TRUE(comm == (sbnComm_t)&comm);
      ASSERT_TRUE(said);
    } else {
      ASSERT_TRUE(host);
      ASSERT_RECORD("ncclCommWindowRegister", "ncclCommWindowDeregister", "ncclCommFinalize");
    }
    ASSERT_CLEAN();
    ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
  }
}

/* sbnCommSplit of an "nccl-host" team whose ncclCommSplit never finishes: sbnTimeout, the
   team's async error sbnTimeout (the cause, not the sbnAborted of its stop word), its comm
   aborted at once (no kernel writes through a window: the split's collective goes with it),
   the stop word set; later ops sbnAborted, the destroy makes no collective call. */
static void test_stuck_team_split_host(void) {
  stub_case("ncclCommSplit:2");
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL, sub = (sbnComm_t)&sub;
  ASSERT_OK(team_of_one(&comm, "host", STUCK_TIMEOUT_MS));
  const double t0 = now_ms();
  const sbnResult_t sr = sbnCommSplit(comm, 0, 0, &sub);
  const double waited = now_ms() - t0;
  const int aborted_at_split = nccl_stub_log_has("ncclCommAbort"); /* before the destroy */
  sbnResult_t a = sbnSuccess;
  const sbnResult_t ar = sbnCommGetAsyncError(comm, &a);
  const int stop0 = (int)sbn_gpu(comm->team)->ranks[0].state->stop; /* the team's own */
  tensors_t t;
  tensors_alloc(&t, 0);
  const sbnResult_t fr = forward(comm, &t);
  tensors_free(&t);
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_RES(sr, sbnTimeout);
  ASSERT_NOT_BEFORE_TIMEOUT(waited);
  ASSERT_TRUE(sub == (sbnComm_t)&sub);
  ASSERT_TRUE(aborted_at_split);
  ASSERT_OK(ar);
  ASSERT_RES(a, sbnTimeout);
  ASSERT_EQ_INT(stop0, sbnAborted);
  ASSERT_RES(fr, sbnAborted);
  ASSERT_NO_RECORD("ncclCommFinalize");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}

/* A host-path op whose collective never completes (collectives stuck: a peer that never
   comes), and nobody calls sbnCommAbort: the team's watchdog ends it at the timeout. The
   async error says sbnTimeout (not before the timeout), the comm is aborted, the stop word
   says sbnAborted (an APPLY queued behind the collective writes nothing), a later op is
   refused with sbnAborted and calls no NCCL function, the destroy finalizes nothing. */
static void test_watchdog_ends_stuck_host_op(void) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, "host", STUCK_TIMEOUT_MS));
  tensors_t t;
  tensors_alloc(&t, 0);
  cudart_stub_set_collectives_stuck(1);
  const double t0 = now_ms();
  const sbnResult_t fr = forward(comm, &t);
  nccl_stub_reset(); /* the record from here */
  sbnResult_t a = sbnSuccess;
  while (sbnCommGetAsyncError(comm, &a) == sbnSuccess && a == sbnSuccess &&
         now_ms() - t0 < 20.0 * STUCK_TIMEOUT_MS) {
    struct timespec ts = {0, 2000000L};
    nanosleep(&ts, NULL);
  }
  const double waited = now_ms() - t0;
  fprintf(stderr, "  async error %s after %.1f ms\n", sbnGetResultName(a), waited);
  /* the watchdog's abort goes on after the error word it set: the stop word, then the
     comm's abort, its last step (the stand-in's record, under its lock, orders the two) */
  while (!nccl_stub_log_has("ncclCommAbort") && now_ms() - t0 < 20.0 * STUCK_TIMEOUT_MS) {
    struct timespec ts = {0, 2000000L};
    nanosleep(&ts, NULL);
  }
  const int stop0 = (int)__atomic_load_n(&sbn_gpu(comm->team)->ranks[0].state->stop,
                                         __ATOMIC_ACQUIRE); /* the team's own */
  const sbnResult_t again = forward(comm, &t);
  const int aborted = nccl_stub_log_has("ncclCommAbort"),
            gathered = nccl_stub_log_has("ncclAllGather");
  cudart_stub_set_collectives_stuck(0);
  tensors_free(&t);
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_OK(fr);
  ASSERT_RES(a, sbnTimeout);
  ASSERT_NOT_BEFORE_TIMEOUT(waited);
  ASSERT_TRUE(aborted); /* by the watchdog, before the destroy */
  ASSERT_EQ_INT(stop0, sbnAborted);
  ASSERT_RES(again, sbnAborted);
  ASSERT_TRUE(!gathered); /* the later op called no NCCL function */
  ASSERT_NO_RECORD("ncclCommFinalize");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}

/* Polls the comm's async error every 2 ms until it reports one or `until_ms` (now_ms's
   clock) has passed; returns it. */
static sbnResult_t async_error_by(sbnComm_t comm, double until_ms) {
  sbnResult_t a = sbnSuccess;
  while (sbnCommGetAsyncError(comm, &a) == sbnSuccess && a == sbnSuccess && now_ms() < until_ms) {
    struct timespec ts = {0, 2000000L};
    nanosleep(&ts, NULL);
  }
  return a;
}

/* A host-path op queued behind work on its stream that lasts three timeouts (the stream
   held: the op's start not done): that is no stuck peer. The watchdog times an op from
   its start, so nothing is reported and no comm aborted; once the work ahead ends, the op
   ends, and a later op and the destroy (a finalize, no abort) work. Before, the watchdog
   timed an op from its launch and aborted the team at the first timeout. */
static void test_watchdog_times_from_the_start(void) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, "host", STUCK_TIMEOUT_MS));
  tensors_t t;
  tensors_alloc(&t, 0);
  cudart_stub_hold_stream(NULL); /* the op's stream: the default one */
  const double t0 = now_ms();
  const sbnResult_t fr = forward(comm, &t);
  nccl_stub_reset(); /* the record from here */
  const sbnResult_t a = async_error_by(comm, t0 + 3.0 * STUCK_TIMEOUT_MS);
  const int aborted = nccl_stub_log_has("ncclCommAbort");
  cudart_stub_release_stream(NULL);
  const sbnResult_t again = forward(comm, &t);
  const sbnResult_t a2 = async_error_by(comm, now_ms() + 100.0); /* (the watchdog's turns) */
  tensors_free(&t);
  const sbnResult_t dr = sbnCommDestroy(comm);
  fprintf(stderr, "  held %.0f ms (timeout %d ms): async error %s, then %s\n", now_ms() - t0,
          STUCK_TIMEOUT_MS, sbnGetResultName(a), sbnGetResultName(a2));
  ASSERT_OK(fr);
  ASSERT_RES(a, sbnSuccess);
  ASSERT_TRUE(!aborted);
  ASSERT_OK(again);
  ASSERT_RES(a2, sbnSuccess);
  ASSERT_OK(dr);
  ASSERT_RECORD("ncclCommFinalize");
  ASSERT_NO_RECORD("ncclCommAbort");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}

/* A host-path op whose collective never completes while the host goes on issuing ops
   behind it, one every half timeout (a training loop that does not wait for its GPU): the
   watchdog reports sbnTimeout about one timeout after the stuck op began, while the ops
   are still issued, and aborts the comm. Before, it timed only the latest launch, whose
   clock each new op restarted: nothing was reported until the ops stopped. */
static void test_watchdog_finds_a_stuck_op_behind_later_ones(void) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  const double T = STUCK_TIMEOUT_MS;
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, "host", STUCK_TIMEOUT_MS));
  tensors_t t;
  tensors_alloc(&t, 0);
  cudart_stub_set_collectives_stuck(1);
  const double t0 = now_ms();
  const sbnResult_t fr = forward(comm, &t);
  sbnResult_t a = sbnSuccess, later = sbnSuccess;
  int issued = 1;
  while (a == sbnSuccess && later == sbnSuccess && now_ms() - t0 < 6.0 * T) {
    a = async_error_by(comm, now_ms() + T / 2);
    if (a == sbnSuccess) later = forward(comm, &t), issued++;
  }
  const double waited = now_ms() - t0;
  if (a == sbnSuccess) a = async_error_by(comm, now_ms()); /* (a refused op's cause) */
  fprintf(stderr, "  async error %s after %.1f ms, %d ops issued (the last: %s)\n",
          sbnGetResultName(a), waited, issued, sbnGetResultName(later));
  cudart_stub_set_collectives_stuck(0);
  tensors_free(&t);
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_OK(fr);
  ASSERT_RES(a, sbnTimeout);
  ASSERT_NOT_BEFORE_TIMEOUT(waited);
  /* one timeout from the stuck op's start, plus the watchdog's 20 ms turns (the first sees
     the start, a later one the timeout) and a slow (sanitized) run's margin */
  EXPECT_TRUE(waited < 2.5 * T);
  EXPECT_TRUE(issued >= 2); /* ops were issued behind it meanwhile */
  ASSERT_RECORD("ncclCommAbort");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}

/* A host-path forward of every rank of `comms` (w of them: a team of one, or both ranks
   of an sbnCommInitAll pair in one group): its first failure. */
static sbnResult_t forward_all(sbnComm_t* comms, tensors_t* t, int w) {
  if (w == 1) return forward(comms[0], &t[0]);
  sbnResult_t r = sbnGroupStart(), f[2] = {sbnSuccess, sbnSuccess};
  for (int q = 0; q < w && r == sbnSuccess; q++) f[q] = forward(comms[q], &t[q]);
  const sbnResult_t e = sbnGroupEnd();
  return r != sbnSuccess ? r : e != sbnSuccess ? e : f[0] != sbnSuccess ? f[0] : f[1];
}

/* SBN_WATCH_MAX host-path ops in flight (their stream held: none starts), then one more:
   the rank has no watch slot left, and the op waits for one as CUDA's full launch queue
   would, bounded: sbnTimeout after the timeout, nothing launched, no failure reported for
   the team (its ops in flight are not stuck: they have not begun), and the team not
   aborted: the call held every rank of it (a team of one; `pair`: both ranks of an
   sbnCommInitAll team in one group), so no rank waits for the op. Once the work ahead
   ends, the ops end, their slots are free again and the next op runs. The ops before it
   made the slots beyond the first SBN_WATCH_FIRST as they were needed. */
static void watch_slots_full(int pair) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms(), w = pair ? 2 : 1;
  sbnComm_t comms[2] = {NULL, NULL};
  if (pair)
    ASSERT_OK(init_all_two(comms, STUCK_TIMEOUT_MS));
  else
    ASSERT_OK(team_of_one(&comms[0], "host", STUCK_TIMEOUT_MS));
  tensors_t t[2];
  for (int q = 0; q < w; q++) tensors_alloc(&t[q], q);
  cudart_stub_hold_stream(NULL);
  int ok = 0;
  for (int k = 0; k < SBN_WATCH_MAX; k++) ok += forward_all(comms, t, w) == sbnSuccess;
  nccl_stub_reset(); /* the record from here */
  const int launches0 = cudart_stub_launches(NULL, 0);
  const double t0 = now_ms();
  const sbnResult_t full = forward_all(comms, t, w);
  const double waited = now_ms() - t0;
  const int launches1 = cudart_stub_launches(NULL, 0);
  char why[256];
  snprintf(why, sizeof why, "%s", sbnGetLastError(comms[0]));
  sbnResult_t a = sbnSystemError;
  const sbnResult_t ar = sbnCommGetAsyncError(comms[0], &a);
  const int aborted = nccl_stub_log_has("ncclCommAbort");
  cudart_stub_release_stream(NULL);
  const sbnResult_t next = forward_all(comms, t, w);
  for (int q = 0; q < w; q++) tensors_free(&t[q]);
  sbnResult_t dr = sbnSuccess;
  for (int q = 0; q < w; q++) {
    const sbnResult_t d = sbnCommDestroy(comms[q]);
    if (dr == sbnSuccess) dr = d;
  }
  fprintf(stderr, "  %s: %d of %d ops; then %s after %.1f ms: %s\n",
          pair ? "InitAll pair" : "team of one", ok, SBN_WATCH_MAX, sbnGetResultName(full), waited,
          why);
  ASSERT_EQ_INT(ok, SBN_WATCH_MAX);
  ASSERT_RES(full, sbnTimeout);
  ASSERT_NOT_BEFORE_TIMEOUT(waited);
  EXPECT_TRUE(strstr(why, "host-path ops in flight") != NULL);
  ASSERT_EQ_INT(launches1, launches0); /* nothing of it launched */
  ASSERT_OK(ar);
  ASSERT_RES(a, sbnSuccess);
  ASSERT_TRUE(!aborted);
  ASSERT_OK(next);
  ASSERT_OK(dr);
  ASSERT_NO_RECORD("ncclCommAbort");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}
static void test_watch_slots_full_bounded(void) {
  watch_slots_full(0);
  CHECK_();
  watch_slots_full(1);
}

/* sbnCommAbort from another thread while an op waits for a watch slot (SBN_WATCH_MAX ops in
   flight behind held work): the wait ends at the abort with sbnAborted, long before the
   timeout. */
typedef struct {
  sbnComm_t comm;
  double at_ms; /* when it called sbnCommAbort */
} later_abort_t;
static void* abort_after_50ms(void* arg) {
  later_abort_t* b = arg;
  struct timespec ts = {0, 50 * 1000000L};
  nanosleep(&ts, NULL);
  b->at_ms = now_ms();
  (void)sbnCommAbort(b->comm);
  return NULL;
}
static void test_watch_slots_full_abort_ends_the_wait(void) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, "host", STUCK_TIMEOUT_MS));
  tensors_t t;
  tensors_alloc(&t, 0);
  cudart_stub_hold_stream(NULL);
  int ok = 0;
  for (int k = 0; k < SBN_WATCH_MAX; k++) ok += forward(comm, &t) == sbnSuccess;
  later_abort_t b = {comm, 0.0};
  pthread_t th;
  ASSERT_TRUE(pthread_create(&th, NULL, abort_after_50ms, &b) == 0);
  const double t0 = now_ms();
  const sbnResult_t full = forward(comm, &t);
  const double end = now_ms();
  pthread_join(th, NULL);
  cudart_stub_release_stream(NULL);
  tensors_free(&t);
  ASSERT_OK(sbnCommDestroy(comm));
  fprintf(stderr, "  %s after %.1f ms (the abort at %.1f ms)\n", sbnGetResultName(full),
          end - t0, b.at_ms - t0);
  ASSERT_EQ_INT(ok, SBN_WATCH_MAX);
  ASSERT_RES(full, sbnAborted);
  EXPECT_TRUE(end - t0 < 0.5 * STUCK_TIMEOUT_MS);
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}

/* Host-path ops that fail after their watch slot was taken (the nth cudaSetDevice of the op
   failing: nth 1 before the take, 2 after it), SBN_WATCH_MAX + 1 of them: each gives its
   slot back, so the next op runs at once (were one kept, the ops after 1024 failures would
   find no slot and wait out the timeout). The stand-in counts cudaSetDevice over every
   thread: a call of the team's watchdog thread as it starts may take an op's failure, and
   that op succeeds; so ops are issued until that many have failed. */
static void test_failed_ops_give_back_their_slots(void) {
  for (int nth = 1; nth <= 2; nth++) {
    stub_case(NULL);
    const int live0 = nccl_stub_live_comms();
    sbnComm_t comm = NULL;
    ASSERT_OK(team_of_one(&comm, "host", STUCK_TIMEOUT_MS));
    tensors_t t;
    tensors_alloc(&t, 0);
    int failed = 0;
    for (int k = 0; failed < SBN_WATCH_MAX + 1 && k < SBN_WATCH_MAX + 64; k++) {
      cudart_stub_fail_set_device(0, nth);
      failed += forward(comm, &t) != sbnSuccess;
      cudart_stub_fail_set_device(-1, 0);
    }
    const double t0 = now_ms();
    const sbnResult_t next = forward(comm, &t);
    const double took = now_ms() - t0;
    tensors_free(&t);
    ASSERT_OK(sbnCommDestroy(comm));
    fprintf(stderr, "  cudaSetDevice %d of the op failing: %d ops failed; the next %s in %.1f ms\n",
            nth, failed, sbnGetResultName(next), took);
    ASSERT_EQ_INT(failed, SBN_WATCH_MAX + 1);
    ASSERT_OK(next);
    EXPECT_TRUE(took < 0.5 * STUCK_TIMEOUT_MS);
    ASSERT_CLEAN();
    ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
  }
}

/* A slot used again: its last op began (the watchdog saw its start) and ended; the next op
   there waits behind held work for three timeouts. It is timed from its own start, not its
   slot's last one: no timeout. */
static void test_watch_slot_used_again_times_afresh(void) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, "host", STUCK_TIMEOUT_MS));
  tensors_t t;
  tensors_alloc(&t, 0);
  cudart_stub_set_collectives_stuck(1);
  const sbnResult_t f1 = forward(comm, &t); /* begins; its collective waits */
  const struct timespec ts = {0, 100 * 1000000L};
  nanosleep(&ts, NULL); /* the watchdog sees it begun (every 20 ms) */
  cudart_stub_set_collectives_stuck(0); /* the peer came */
  nanosleep(&ts, NULL); /* the watchdog frees its slot, every other one free too */
  cudart_stub_hold_stream(NULL);
  const sbnResult_t f2 = forward(comm, &t); /* a slot whose last op began 200 ms ago */
  const sbnResult_t a = async_error_by(comm, now_ms() + 3.0 * STUCK_TIMEOUT_MS);
  cudart_stub_release_stream(NULL);
  tensors_free(&t);
  ASSERT_OK(sbnCommDestroy(comm));
  fprintf(stderr, "  async error %s\n", sbnGetResultName(a));
  ASSERT_OK(f1);
  ASSERT_OK(f2);
  ASSERT_RES(a, sbnSuccess);
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}

/* Two ops of a rank in flight on two streams the caller did not order (API.md, "Streams":
   their results are undefined, but nothing may hang): the first waits behind work on its
   stream for longer than the whole case (it never starts here), the second's collective
   never completes. The watchdog times each op on its own: the second's stuck collective
   is reported about one timeout after it began, whatever the first does (a watchdog of
   the oldest op in flight alone would wait for the first for ever). */
static void test_watchdog_times_every_op_in_flight(void) {
  stub_case(NULL);
  const int live0 = nccl_stub_live_comms();
  const double T = STUCK_TIMEOUT_MS;
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, "host", STUCK_TIMEOUT_MS));
  tensors_t t;
  tensors_alloc(&t, 0);
  cudaStream_t s[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++) cudaStreamCreateWithFlags(&s[k], cudaStreamNonBlocking);
  cudart_stub_hold_stream(s[0]);
  cudart_stub_set_collectives_stuck(1);
  const double t0 = now_ms();
  sbnResult_t fr[2];
  for (int k = 0; k < 2; k++)
    fr[k] = sbnForwardTrain(comm, &g_desc, t.x, t.y, t.weight, t.bias, t.rmean, t.rvar, t.nbt,
                            t.smean, t.sinvstd, NULL, s[k]);
  const sbnResult_t a = async_error_by(comm, t0 + 4.0 * T);
  const double waited = now_ms() - t0;
  fprintf(stderr, "  async error %s after %.1f ms\n", sbnGetResultName(a), waited);
  cudart_stub_set_collectives_stuck(0);
  cudart_stub_release_stream(s[0]);
  tensors_free(&t);
  ASSERT_OK(sbnCommDestroy(comm));
  for (int k = 0; k < 2; k++) cudaStreamDestroy(s[k]);
  ASSERT_OK(fr[0]);
  ASSERT_OK(fr[1]);
  ASSERT_RES(a, sbnTimeout);
  ASSERT_NOT_BEFORE_TIMEOUT(waited);
  EXPECT_TRUE(waited < 2.5 * T);
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}

/* sbnCommDestroy of an sbnCommInitAll team whose ncclCommFinalize never finishes: the destroy
   returns (bounded by the timeout), every comm aborted, none destroyed while in progress. */
static void test_stuck_finalize_initall(void) {
  stub_case("ncclCommFinalize");
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, STUCK_TIMEOUT_MS));
  ASSERT_OK(sbnCommDestroy(comms[0]));
  ASSERT_OK(sbnCommDestroy(comms[1]));
  ASSERT_RECORD("ncclCommFinalize", "ncclCommFinalize", "ncclCommAbort", "ncclCommAbort");
  ASSERT_NO_RECORD("ncclCommDestroy");
  ASSERT_CLEAN();
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
}

/* ---- a rank that fails at init tells its peers ------------------------------------------ */

/* The library's calloc and pthread_create as it reaches them (tests/CMakeLists.txt links
   this test with -Wl,--wrap=calloc and -Wl,--wrap=pthread_create; the stand-ins are shared
   libraries, whose calls are not wrapped): while `armed` in the calling thread, the
   fail_at-th (from 0) of its callocs, or of its thread starts (`thread`), fails as an
   exhausted heap's or process's would, and the count - 1 after it (0: that one alone).
   Threads the call starts count nothing. */
typedef struct {
  int armed, thread, fail_at;
  int seen, hit; /* calls of the kind counted; whether the failure was given */
  int count;
} fault_t;
static _Thread_local fault_t fault;
static int fault_now(int thread) {
  if (!fault.armed || fault.thread != thread) return 0;
  const int k = fault.seen++;
  if (k < fault.fail_at || k >= fault.fail_at + (fault.count > 0 ? fault.count : 1)) return 0;
  fault.hit = 1;
  return 1;
}
void* __real_calloc(size_t n, size_t size);
void* __wrap_calloc(size_t n, size_t size);
void* __wrap_calloc(size_t n, size_t size) {
  return fault_now(0) ? NULL : __real_calloc(n, size);
}
int __real_pthread_create(pthread_t* th, const pthread_attr_t* attr, void* (*fn)(void*), void* arg);
int __wrap_pthread_create(pthread_t* th, const pthread_attr_t* attr, void* (*fn)(void*), void* arg);
int __wrap_pthread_create(pthread_t* th, const pthread_attr_t* attr, void* (*fn)(void*),
                          void* arg) {
  return fault_now(1) ? EAGAIN : __real_pthread_create(th, attr, fn, arg);
}

/* A group of a GPU team's op (a virtual team of one) beside a CPU team's (two ranks), whose
   rank thread cannot start (both tries: with the library's stack size, then without):
   sbnSystemError; the CPU comms' detail says so, the GPU comm's does not (its op was issued
   before the CPU team's threads: "nothing was run" was wrong for it). */
static void test_group_thread_fails_beside_gpu_team(void) {
  stub_case(NULL);
  sbnComm_t virt = NULL, cpu[2];
  ASSERT_OK(sbnCommInitVirtual(&virt, 1, 0, NULL));
  ASSERT_OK(sbnCommInitCpu(cpu, 2, NULL));
  const sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, 2, 4, 8};
  float *gx = dalloc(64 * sizeof(float)), *gy = dalloc(64 * sizeof(float)),
        *gm = dalloc(4 * sizeof(float)), *gi = dalloc(4 * sizeof(float));
  static float hx[2][64], hy[2][64], hm[2][4], hi[2][4];
  ASSERT_OK(sbnGroupStart());
  ASSERT_OK(sbnForwardTrain(virt, &d, gx, gy, NULL, NULL, NULL, NULL, NULL, gm, gi, NULL, NULL));
  for (int r = 0; r < 2; r++)
    ASSERT_OK(sbnForwardTrain(cpu[r], &d, hx[r], hy[r], NULL, NULL, NULL, NULL, NULL, hm[r], hi[r],
                              NULL, NULL));
  fault = (fault_t){1, 1, 0, 0, 0, 2};
  const sbnResult_t g = sbnGroupEnd();
  fault.armed = 0;
  fprintf(stderr, "  sbnGroupEnd: %s; cpu: '%s'\n", sbnGetResultName(g), sbnGetLastError(cpu[0]));
  fprintf(stderr, "  virtual: '%s'\n", sbnGetLastError(virt)); /* (one buffer a thread) */
  ASSERT_RES(g, sbnSystemError);
  for (int r = 0; r < 2; r++)
    EXPECT_TRUE(strstr(sbnGetLastError(cpu[r]), "could not create a thread") != NULL);
  EXPECT_TRUE(strstr(sbnGetLastError(virt), "could not create a thread") == NULL);
  cudaDeviceSynchronize();
  void* all[] = {gx, gy, gm, gi};
  for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) cudaFree(all[k]);
  ASSERT_OK(sbnCommDestroy(virt));
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(cpu[r]));
}

#define AGREEMENT "ncclAllReduce c" /* an agreement's line: "ncclAllReduce cN int32 min [...]" */
#define VALUES " int32 min ["

/* The values an agreement's line (record_line_from's) shows, past their "[", or NULL where
   it shows none; *one: whether it is one value. */
static const char* agreement_values(const char* line, int* one) {
  const char* v = strstr(line, VALUES);
  const char* eol = strchr(line, '\n');
  if (v == NULL || (eol != NULL && v > eol)) return NULL;
  v += strlen(VALUES);
  const char* close = strchr(v, ']');
  *one = close != NULL && memchr(v, ',', (size_t)(close - v)) == NULL;
  return v;
}

/* What this rank gave the record's last agreement (an int32 min ncclAllReduce) in its
   "ok" slot: v[0] of nccl_attach's first, the one value of its second and third. -1: the
   record has no agreement; -2: one without values. */
static int last_agreement_ok(void) {
  const char* last = NULL;
  for (const char* p = record_line(AGREEMENT); p != NULL; p = record_line_from(p + 1, AGREEMENT)) last = p;
  if (last == NULL) return -1;
  int one = 0;
  const char* v = agreement_values(last, &one);
  return v != NULL ? atoi(v) : -2;
}

/* The comm of the record's first agreement: N, the team's own comm; -1 where the record
   has none. */
static int first_agreement_comm(void) {
  const char* p = record_line(AGREEMENT);
  return p != NULL ? atoi(p + strlen(AGREEMENT)) : -1;
}

/* Whether the record's agreement that every rank has its window part (the first
   agreement of one value) said 1 and no ncclCommWindowRegister, the collective every
   rank then makes, follows it: a rank that skipped it leaves its peers waiting there. */
static int window_registration_skipped(void) {
  for (const char* p = record_line(AGREEMENT); p != NULL; p = record_line_from(p + 1, AGREEMENT)) {
    int one = 0;
    const char* v = agreement_values(p, &one);
    if (v != NULL && one) return atoi(v) == 1 && record_line_from(p, "ncclCommWindowRegister c") == NULL;
  }
  return 0;
}

enum { VIA_CALLER_COMM, VIA_ID, VIA_SPLIT };
static const char* const via_names[] = {"sbnCommInitNccl", "sbnCommInitNcclRank", "sbnCommSplit"};
static char untouched_slot;
#define UNTOUCHED_COMM ((sbnComm_t)&untouched_slot)

/* Every failure point of a team's init, one at a time: the k-th calloc of the calling
   thread (or its k-th pthread_create), for k = 0, 1, ... until an init hits none. The
   stand-in's teams are of one rank, so a peer is not there to see this rank's failure;
   what it would see is in the record: an init that fails must have given 0 in the "ok"
   slot of its last agreement, so that every peer fails with it, or have failed before
   the first agreement (no ncclAllReduce: the peers then wait in it and time out, as for
   a rank that never calls). A rank that failed after an agreement where it said ready
   leaves its peers a team whose first op can only time out. Each failed init also wrote
   nothing, and released everything it made (comms, no violation). `via` is the call:
   sbnCommInitNccl (a duplicate of the caller's comm), sbnCommInitNcclRank, or
   sbnCommSplit of a team of one (the child's team; the fault armed in the split only).
   A split is a collective of the parent team first: one that fails before the parent's
   ncclCommSplit (none in the record) leaves its peers waiting in theirs until their
   timeout, which aborts their parent team, while this rank keeps its own; nothing of the
   split may fail there (its slot is the team's, made at the team's init). */
static void fault_sweep(int via, const char* transport, int thread) {
  const char* kind = thread ? "pthread_create" : "calloc";
  int k = 0, failed = 0, told = 0; /* inits that failed; of them, told in an agreement */
  /* VIA_SPLIT: the parent team's own comm (cN in the record) */
  int parent_comm = -1;
  for (;; k++) {
    if (k == 1000) {
      SBN_FAIL_("%s: still hitting an injected %s failure at k = %d", via_names[via], kind, k);
      return;
    }
    stub_case(NULL);
    const int live0 = nccl_stub_live_comms();
    const sbnConfig_t cfg = case_config(TIMEOUT_MS);
    ncclComm_t nc = NULL;
    sbnComm_t parent = NULL;
    sbnNcclUniqueId_t id;
    if (via == VIA_CALLER_COMM) nc = caller_comm(0, 1);
    if (via == VIA_ID) ASSERT_OK(sbnGetNcclUniqueId(&id));
    if (via == VIA_SPLIT) {
      ASSERT_OK(team_of_one(&parent, transport, TIMEOUT_MS));
      parent_comm = first_agreement_comm(); /* its init's agreements are on its own comm */
      ASSERT_TRUE(parent_comm >= 0);
    }
    nccl_stub_reset(); /* the record of the call alone */
    if (transport != NULL)
      setenv("SBN_NCCL_TRANSPORT", transport, 1);
    else
      unsetenv("SBN_NCCL_TRANSPORT");
    cudaSetDevice(0);
    sbnComm_t comm = UNTOUCHED_COMM;
    fault = (fault_t){1, thread, k, 0, 0, 0};
    const sbnResult_t r = via == VIA_CALLER_COMM ? sbnCommInitNccl(&comm, nc, &cfg)
                          : via == VIA_ID        ? sbnCommInitNcclRank(&comm, &id, 1, 0, &cfg)
                                                 : sbnCommSplit(parent, 0, 0, &comm);
    fault.armed = 0;
    unsetenv("SBN_NCCL_TRANSPORT");
    const int hit = fault.hit, ok = last_agreement_ok();
    const char* e = r == sbnSuccess ? "" : sbnGetLastError(via == VIA_SPLIT ? parent : NULL);
    const int before = sbn_test_cur_failed_;
    if (window_registration_skipped()) {
      SBN_FAIL_(
          "%s (transport %s, %s %d failing) said it had its window part, then skipped the "
          "window's registration its peers make (%s)",
          via_names[via], transport ? transport : "auto", kind, k,
          r == sbnSuccess ? "it succeeded" : e);
      print_record();
    }
    if (r != sbnSuccess) {
      failed++;
      told += ok == 0;
      if (!hit) SBN_FAIL_("%s failed with no injected failure: %s", via_names[via], e);
      if (comm != UNTOUCHED_COMM)
        SBN_FAIL_("%s (%s %d failing) wrote *comm: %p", via_names[via], kind, k, (void*)comm);
      if (thread && strstr(e, "watchdog") == NULL) /* this rank's cause, not "another rank" */
        SBN_FAIL_("%s: the watchdog's failure is not named: %s", via_names[via], e);
      /* named as what it is (sbnUnsupported where it made SBN_NCCL_TRANSPORT=lsa impossible) */
      if (!thread && (strstr(e, "out of host memory") == NULL ||
                      (r != sbnSystemError && r != sbnUnsupported)))
        SBN_FAIL_("%s (%s %d failing): %s, not \"out of host memory\": %s", via_names[via],
                  kind, k, sbnGetResultName(r), e);
      if (ok != 0 && ok != -1) {
        SBN_FAIL_(
            "%s (transport %s, %s %d failing) failed after its last agreement said "
            "this rank was ready (ok slot %d): its peers keep a team that can only time "
            "out. It failed with: %s",
            via_names[via], transport ? transport : "auto", kind, k, ok, e);
        print_record();
      }
      char split_line[64];
      snprintf(split_line, sizeof split_line, "ncclCommSplit c%d ", parent_comm);
      if (via == VIA_SPLIT && record_line(split_line) == NULL) {
        SBN_FAIL_(
            "sbnCommSplit (transport %s, %s %d failing) failed before the parent's "
            "ncclCommSplit (c%d): its peers wait in theirs until their timeout and abort "
            "their parent team, which this rank keeps. It failed with: %s",
            transport ? transport : "auto", kind, k, parent_comm, e);
        print_record();
      }
    } else if (comm == NULL || comm == UNTOUCHED_COMM) {
      SBN_FAIL_("%s succeeded without a comm", via_names[via]);
    } else {
      EXPECT_TRUE(sbnCommDestroy(comm) == sbnSuccess);
    }
    /* released either way, so that a failed case leaves nothing to the cases after it */
    if (parent != NULL) EXPECT_TRUE(sbnCommDestroy(parent) == sbnSuccess);
    if (nc != NULL) EXPECT_TRUE(ncclCommDestroy(nc) == ncclSuccess); /* still the caller's */
    if (sbn_test_cur_failed_ != before) return;
    ASSERT_CLEAN();
    ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
    if (r == sbnSuccess && !hit) break; /* past the last */
  }
  fprintf(stderr,
          "  %s, transport %s: %d %s(s); failing each in turn, %d inits failed (%d told in "
          "an agreement, %d before the first), %d succeeded\n",
          via_names[via], transport ? transport : "auto", k, kind, failed, told, failed - told,
          k - failed);
  ASSERT_TRUE(failed > 0);
  if (thread) ASSERT_EQ_INT(told, failed); /* the watchdog's: in the first agreement */
}
static void fault_sweeps(int thread) {
  static const char* const transports[] = {NULL, "host", "lsa"};
  for (int via = VIA_CALLER_COMM; via <= VIA_SPLIT; via++)
    for (int t = 0; t < 3; t++) fault_sweep(via, transports[t], thread); /* each says */
}
/* The allocations (the team's, the comms, the NCCL slots), and the watchdog's thread.
   Both fail on 9f17060's code (checked), where the comms were allocated after the attach
   and the watchdog started after the last agreement; the first also on 123f24f's
   (checked), where sbnCommSplit allocated its slot before the parent's ncclCommSplit. */
static void test_init_fault_calloc_told(void) {
  fault_sweeps(0);
}
static void test_init_fault_thread_told(void) {
  fault_sweeps(1);
}

/* ---- the cooperative path's host code: what a launch is given ---------------------------- */

/* A buffer of `bytes` of device dev's memory (the current device is left at dev). */
static void* dalloc_on(int dev, size_t bytes) {
  cudaSetDevice(dev);
  return dalloc(bytes);
}

/* Whether `bytes` bytes at p are all zero. */
static int all_zero(const void* p, size_t bytes) {
  for (size_t i = 0; i < bytes; i++)
    if (((const unsigned char*)p)[i] != 0) return 0;
  return 1;
}

/* The step of the stand-in's stream log at or after `from` of kind `what` on stream s
   (event e, where not NULL), or -1. */
static int step_find(const cudart_stub_step_t* st, int n, int from, char what, cudaStream_t s,
                     cudaEvent_t e) {
  for (int i = from; i < n; i++)
    if (st[i].what == what && st[i].stream == s && (e == NULL || st[i].event == e)) return i;
  return -1;
}

/* A virtual team of two on device 0, each rank on a stream of its own, one cooperative
   forward in one group (fp32 NCHW, 2 x 64 x 4096 per rank: as many blocks as the device
   holds): ONE cooperative launch of 256-thread blocks, all co-resident (the stand-in's
   device holds CUDA_STUB_SMS x CUDA_STUB_BLOCKS_PER_SM: G of each rank is half of them),
   on rank 0's stream after the work queued on rank 1's (an event recorded there, waited
   for on rank 0's), and rank 1's stream waits for the launch (an event recorded after it).
   Its argument block carries each rank's parameters and the config's timeout; the
   mailboxes it is given hold the team's records (two parities) and are zero at the first
   op, the error words and the rank states too (cudaMalloc'd memory is not zeroed: the
   stand-in poisons it); each rank's workspace holds its partials. */
static void test_virtual_launch_args(void) {
  stub_case(NULL);
  unsetenv("SBN_ALGO");
  const sbnConfig_t cfg = case_config(TIMEOUT_MS);
  sbnComm_t v[2] = {NULL, NULL};
  ASSERT_OK(sbnCommInitVirtual(v, 2, 0, &cfg));
  const sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, 2, 64, 4096};
  const size_t big = (size_t)(d.n * d.c * d.spatial) * sizeof(float),
               ch = (size_t)d.c * sizeof(float);
  void* p[2][4];
  cudaStream_t s[2];
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < 4; i++) p[r][i] = dalloc_on(0, i < 2 ? big : ch);
    cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking);
  }
  const sbnParams_t prm = {0.01f, 0.25f, sbnGradGlobal};
  cudart_stub_reset();
  cudart_stub_keep_args(sizeof(sbn_coop_args_t));
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < 2; r++)
    ASSERT_OK(sbnForwardTrain(v[r], &d, p[r][0], p[r][1], NULL, NULL, NULL, NULL, NULL, p[r][2],
                              p[r][3], &prm, (sbnStream_t)s[r]));
  const sbnResult_t ge = sbnGroupEnd();
  if (ge != sbnSuccess) fprintf(stderr, "  sbnGroupEnd: %s\n", sbnGetLastError(NULL));
  static cudart_stub_launch_t l;
  cudart_stub_step_t st[CUDA_STUB_STEP_LOG];
  const int nst = cudart_stub_steps(st, CUDA_STUB_STEP_LOG);
  const int nl = cudart_stub_launches(NULL, 0);
  const int got = cudart_stub_launch_at(0, &l);
  cudaSetDevice(0);
  cudaDeviceSynchronize();
  ASSERT_OK(ge);
  ASSERT_EQ_INT(nl, 1);
  ASSERT_TRUE(got);
  const sbn_coop_args_t* a = (const sbn_coop_args_t*)l.args;
  ASSERT_TRUE(l.cooperative);
  ASSERT_EQ_INT(l.block, SBN_GPU_THREADS);
  ASSERT_EQ_INT(l.grid, CUDA_STUB_SMS * CUDA_STUB_BLOCKS_PER_SM);
  ASSERT_EQ_INT(a->nlaunch, 2);
  ASSERT_EQ_INT(a->nranks, 2);
  ASSERT_EQ_INT((int64_t)a->G * a->nlaunch, l.grid);
  ASSERT_EQ_INT(a->c, d.c);
  ASSERT_EQ_INT(a->timeout_ns, (int64_t)TIMEOUT_MS * 1000000);
  ASSERT_EQ_INT(a->nstop, 2);
  for (int r = 0; r < 2; r++) {
    const sbn_coop_rank_t* R = &a->r[r];
    ASSERT_EQ_INT(R->rank, r);
    ASSERT_TRUE(R->x == p[r][0] && R->out == p[r][1]);
    ASSERT_TRUE(R->eps == prm.eps && R->momentum == prm.momentum && R->grad_global == 1);
    ASSERT_EQ_INT(R->n, d.n);
    ASSERT_EQ_INT(R->spatial, d.spatial);
    ASSERT_TRUE(a->stop[r] == &R->state->stop);
    ASSERT_TRUE(all_zero(R->state, sizeof *R->state));
    /* the workspace: SBN_GPU_PART_FLOATS per (slice, channel) entry, max(G * 32, C + 32) */
    const int64_t entries = (int64_t)a->G * SBN_GPU_CHUNK > d.c + SBN_GPU_CHUNK
                                ? (int64_t)a->G * SBN_GPU_CHUNK
                                : d.c + SBN_GPU_CHUNK;
    if (cudart_stub_size_of(R->part) < (size_t)(SBN_GPU_PART_FLOATS * entries) * sizeof(float))
      SBN_FAIL_("rank %d's workspace: %zu bytes for %lld entries", r, cudart_stub_size_of(R->part),
                (long long)entries);
    /* its mailbox: every rank's records of the max_channels, in two parities */
    const size_t mail = (size_t)a->nranks * 2 * (size_t)a->nchunks_max * sizeof(sbn_mail_rec_t);
    ASSERT_EQ_INT(a->nchunks_max, (cfg.max_channels + SBN_GPU_CHUNK - 1) / SBN_GPU_CHUNK);
    if (cudart_stub_size_of(a->mail[r]) < mail || !all_zero(a->mail[r], mail))
      SBN_FAIL_("rank %d's mailbox: %zu bytes (want %zu), zero: %d", r,
                cudart_stub_size_of(a->mail[r]), mail,
                cudart_stub_size_of(a->mail[r]) >= mail && all_zero(a->mail[r], mail));
  }
  for (int q = 0; q <= 2; q++) ASSERT_EQ_INT(a->err[q], 0);
  /* the streams: rank 1's work before the launch, the launch before rank 1's later work */
  const int launch = step_find(st, nst, 0, 'L', s[0], NULL);
  const int rec1 = step_find(st, nst, 0, 'R', s[1], NULL);
  const int wait0 = rec1 < 0 ? -1 : step_find(st, nst, rec1, 'W', s[0], st[rec1].event);
  const int rec0 = launch < 0 ? -1 : step_find(st, nst, launch, 'R', s[0], NULL);
  const int wait1 = rec0 < 0 ? -1 : step_find(st, nst, rec0, 'W', s[1], st[rec0].event);
  if (launch < 0 || rec1 < 0 || wait0 < 0 || wait0 > launch || rec0 < 0 || wait1 < 0)
    SBN_FAIL_(
        "streams not joined around the launch (steps: launch %d, rank 1's record %d, rank 0's "
        "wait %d, rank 0's record %d, rank 1's wait %d)",
        launch, rec1, wait0, rec0, wait1);
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < 4; i++) cudaFree(p[r][i]);
    cudaStreamDestroy(s[r]);
  }
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(v[r]));
  setenv("SBN_ALGO", "nccl", 1);
  ASSERT_CLEAN();
}

/* An sbnCommInitAll team of two devices without peer access ("peer-pinned-host": the
   mailboxes in pinned host memory, no access to the peer's stop word): its kernels read
   the error words at their start, at the host-memory poll interval. Both ranks' launches
   carry their call number, and under a CUDA graph capture none (a replay does not pass
   the host). */
static void test_peer_host_launch_args(void) {
  stub_case(NULL);
  unsetenv("SBN_ALGO");
  cudart_stub_set_no_peer_access(1);
  sbnComm_t comms[2] = {NULL, NULL};
  duo_t p;
  const int devs[2] = {0, 1};
  ASSERT_OK(duo_team(comms, &p, devs));
  ASSERT_TRUE(strcmp(transport_of(comms[0]), "peer-pinned-host") == 0);
  static cudart_stub_launch_t l[2];
  for (int capture = 0; capture < 2 && !sbn_test_cur_failed_; capture++) {
    cudart_stub_reset();
    cudart_stub_set_no_peer_access(1);
    cudart_stub_set_capturing(capture);
    cudart_stub_keep_args(sizeof(sbn_coop_args_t));
    const sbnResult_t ge = duo_group_forward(comms, &p, NULL);
    cudart_stub_set_capturing(0);
    ASSERT_OK(ge);
    ASSERT_EQ_INT(cudart_stub_launches(NULL, 0), 2);
    for (int q = 0; q < 2; q++) {
      ASSERT_TRUE(cudart_stub_launch_at(q, &l[q]));
      const sbn_coop_args_t* a = (const sbn_coop_args_t*)l[q].args;
      ASSERT_EQ_INT(l[q].device, q);
      ASSERT_EQ_INT(a->host_words_at_start, 1);
      ASSERT_EQ_INT(a->host_poll_ns, SBN_HOST_POLL_NS);
      ASSERT_EQ_INT(a->nstop, 1);
      if ((sbn_sig_call(a->sig) == SBN_SIG_UNNUMBERED) != capture)
        SBN_FAIL_("rank %d's launch %s: call number %u", q, capture ? "captured" : "eager",
                  sbn_sig_call(a->sig));
    }
    for (int q = 0; q < 2; q++) {
      cudaSetDevice(q);
      cudaDeviceSynchronize();
    }
  }
  cudart_stub_set_no_peer_access(0);
  for (int q = 0; q < 2; q++) ASSERT_OK(sbnCommDestroy(comms[q]));
  duo_free(&p);
  setenv("SBN_ALGO", "nccl", 1);
  ASSERT_CLEAN();
}

/* A round that the host refuses runs nothing (no launch, y untouched) and leaves the
   team usable: a virtual team of two whose call has SBN_ALGO set to no known value (the
   call refused, sbnInvalidArgument), whose ranks ask for different paths (coop and
   nccl), mix the in-place backward (x NULL) with the x-based one, or hold one element per
   channel between them (sbnInvalidArgument, "Expected more than 1 value per channel"),
   and its op called outside a group (one launch runs every rank: sbnInvalidUsage). */
static void test_virtual_round_refusals(void) {
  stub_case(NULL);
  unsetenv("SBN_ALGO");
  sbnComm_t v[2] = {NULL, NULL};
  ASSERT_OK(sbnCommInitVirtual(v, 2, 0, NULL));
  tensors_t t[2];
  tensors_alloc(&t[0], 0);
  tensors_alloc(&t[1], 0);
  const size_t big = (size_t)N_ * C_ * S_ * sizeof(float);
  for (int k = 0; k < 6 && !sbn_test_cur_failed_; k++) {
    for (int r = 0; r < 2; r++) memset(t[r].y, 0x5a, big), memset(t[r].dx, 0x5a, big);
    cudart_stub_reset();
    sbnResult_t call[2] = {sbnSuccess, sbnSuccess}, ge = sbnSuccess, want_call = sbnSuccess,
                want = sbnInvalidUsage;
    const char* says = NULL;
    if (k == 4) { /* outside a group */
      ge = forward(v[0], &t[0]);
      says = "ONE launch for all its ranks";
    } else {
      sbnGroupStart();
      for (int r = 0; r < 2; r++) {
        if (k == 0 && r == 1) setenv("SBN_ALGO", "no-such-path", 1);
        if (k == 1 && r == 1) setenv("SBN_ALGO", "nccl", 1);
        if (k == 2) { /* rank 0 in place (x NULL, y given), rank 1 x-based */
          call[r] = sbnBackwardEx(v[r], &g_desc, r ? t[r].x : NULL, r ? NULL : t[r].y, t[r].dy,
                                  t[r].dx, NULL, NULL, NULL, t[r].smean, t[r].sinvstd, NULL, NULL,
                                  NULL, NULL, NULL);
        } else if (k == 3) { /* one element per channel in the team */
          const sbnTensorDesc_t d1 = {sbnFloat32, sbnLayoutNCHW, 1 - r, C_, 1};
          call[r] = sbnForwardTrain(v[r], &d1, t[r].x, t[r].y, NULL, NULL, NULL, NULL, NULL,
                                    t[r].smean, t[r].sinvstd, NULL, NULL);
        } else {
          call[r] = forward(v[r], &t[r]);
        }
        unsetenv("SBN_ALGO");
      }
      ge = sbnGroupEnd();
      if (k == 0) want_call = sbnInvalidArgument, says = "SBN_ALGO='no-such-path'";
      if (k == 1) says = "must run the same path";
      if (k == 2) says = "in-place backward";
      if (k == 3) want = sbnInvalidArgument, says = "Expected more than 1 value per channel";
      if (k == 5) want = sbnSuccess; /* the team goes on */
    }
    const int n = cudart_stub_launches(NULL, 0);
    const char* msg = sbnGetLastError(k == 0 ? v[1] : k == 4 ? v[0] : NULL);
    if (call[0] != sbnSuccess || call[1] != want_call || ge != want ||
        (want != sbnSuccess) != (n == 0) || (says != NULL && strstr(msg, says) == NULL))
      SBN_FAIL_("case %d: calls %s %s, %s, %d launches ('%s')", k, sbnGetResultName(call[0]),
                sbnGetResultName(call[1]), sbnGetResultName(ge), n, msg);
    for (int r = 0; r < 2 && want != sbnSuccess; r++)
      if (!(((unsigned char*)t[r].y)[0] == 0x5a && ((unsigned char*)t[r].dx)[0] == 0x5a))
        SBN_FAIL_("case %d: rank %d's output written", k, r);
    sbnResult_t async = sbnSystemError;
    ASSERT_OK(sbnCommGetAsyncError(v[0], &async));
    ASSERT_RES(async, sbnSuccess);
  }
  cudaSetDevice(0);
  cudaDeviceSynchronize();
  for (int r = 0; r < 2; r++) ASSERT_OK(sbnCommDestroy(v[r]));
  tensors_free(&t[0]);
  tensors_free(&t[1]);
  setenv("SBN_ALGO", "nccl", 1);
  ASSERT_CLEAN();
}

/* The backward's tensors and the epilogue's (dy, dx, dweight, dbias; z of the forward, y
   and dz of sbnBackwardEx) on another device: sbnInvalidArgument naming the tensor,
   nothing launched, dx unwritten (test_training_pointer_checks: the forward's). */
static void test_backward_pointer_checks(void) {
  stub_case(NULL);
  unsetenv("SBN_ALGO");
  sbnComm_t v = NULL;
  ASSERT_OK(sbnCommInitVirtual(&v, 1, 0, NULL));
  tensors_t t, o;
  tensors_alloc(&o, 1);
  tensors_alloc(&t, 0);
  const size_t big = (size_t)N_ * C_ * S_ * sizeof(float);
  void* z0 = dalloc_on(0, big);
  void* z1 = dalloc_on(1, big);
  cudaSetDevice(0);
  const sbnEpilogue_t relu = {sizeof(sbnEpilogue_t), sbnActivationRelu, 0.01f, 0, 0};
  static const char* const names[] = {"dy", "dx", "dweight", "dbias", "z", "y", "dz"};
  for (int k = 0; k < 7 && !sbn_test_cur_failed_; k++) {
    memset(t.dx, 0x5a, big);
    cudart_stub_reset();
    sbnResult_t r;
    if (k < 4) {
      r = sbnBackward(v, &g_desc, t.x, k == 0 ? o.dy : t.dy, k == 1 ? o.dx : t.dx, t.weight,
                      t.smean, t.sinvstd, k == 2 ? o.dweight : t.dweight,
                      k == 3 ? o.dbias : t.dbias, NULL, NULL);
    } else if (k == 4) {
      r = sbnForwardTrainEx(v, &g_desc, t.x, z1, t.dx, NULL, NULL, NULL, NULL, NULL, t.smean,
                            t.sinvstd, NULL, &relu, NULL);
    } else {
      r = sbnBackwardEx(v, &g_desc, t.x, k == 5 ? o.y : t.y, t.dy, t.dx, k == 6 ? z1 : z0, NULL,
                        NULL, t.smean, t.sinvstd, NULL, NULL, NULL, &relu, NULL);
    }
    const int n = cudart_stub_launches(NULL, 0);
    char want[64];
    snprintf(want, sizeof want, "%s is memory of device 1", names[k]);
    if (r != sbnInvalidArgument || n != 0 || strstr(sbnGetLastError(v), want) == NULL)
      SBN_FAIL_("%s on device 1: %s, %d launches ('%s')", names[k], sbnGetResultName(r), n,
                sbnGetLastError(v));
    if (((unsigned char*)t.dx)[0] != 0x5a)
      SBN_FAIL_("%s on device 1: the output written", names[k]);
  }
  cudart_stub_reset(); /* the same on device 0: runs */
  ASSERT_OK(sbnBackwardEx(v, &g_desc, t.x, t.y, t.dy, t.dx, z0, NULL, NULL, t.smean, t.sinvstd,
                          NULL, NULL, NULL, &relu, NULL));
  ASSERT_EQ_INT(cudart_stub_launches(NULL, 0), 1);
  cudaDeviceSynchronize();
  ASSERT_OK(sbnCommDestroy(v));
  tensors_free(&t);
  tensors_free(&o);
  cudaFree(z0), cudaFree(z1);
  cudaSetDevice(0);
  setenv("SBN_ALGO", "nccl", 1);
  ASSERT_CLEAN();
}

/* What the plan reads of a round: the 16-byte kernels only where every tensor is 16-byte
   aligned (SBN_KERNEL=stream on a team of one: the backward's dy, the forward's z one
   element off: "stream-scalar"); onchip's launch with the dynamic shared memory its
   held batches take; onchip refused for ranks that share a GPU (sbnUnsupported, nothing
   launched: their separate grids must be co-resident). */
static void test_plan_reads_round(void) {
  stub_case(NULL);
  unsetenv("SBN_ALGO");
  sbnComm_t v = NULL;
  ASSERT_OK(sbnCommInitVirtual(&v, 1, 0, NULL));
  const sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, 2, 64, 4096};
  const size_t big = (size_t)(d.n * d.c * d.spatial) * sizeof(float) + 16,
               ch = (size_t)d.c * sizeof(float);
  char* b[5];
  for (int i = 0; i < 5; i++) b[i] = dalloc_on(0, big);
  float *sm = dalloc_on(0, ch), *si = dalloc_on(0, ch);
  const sbnEpilogue_t relu = {sizeof(sbnEpilogue_t), sbnActivationRelu, 0.01f, 0, 0};
  setenv("SBN_KERNEL", "stream", 1);
  for (int k = 0; k < 4 && !sbn_test_cur_failed_; k++) { /* aligned, then one element off */
    const int off = (k & 1) * 4;
    const char* kernel = "";
    const sbnResult_t r =
        k < 2 ? sbnBackward(v, &d, b[0], b[1] + off, b[2], NULL, sm, si, NULL, NULL, NULL, NULL)
              : sbnForwardTrainEx(v, &d, b[0], b[3] + off, b[4], NULL, NULL, NULL, NULL, NULL, sm,
                                  si, NULL, &relu, NULL);
    ASSERT_OK(r);
    ASSERT_OK(sbnCommGetKernel(v, &kernel));
    if (strcmp(kernel, off ? "stream-scalar" : "stream") != 0)
      SBN_FAIL_("%s with %s %s: ran '%s'", k < 2 ? "backward" : "forward", k < 2 ? "dy" : "z",
                off ? "one element off" : "aligned", kernel);
  }
  setenv("SBN_KERNEL", "onchip", 1);
  const sbnTensorDesc_t small = {sbnFloat32, sbnLayoutNCHW, 1, 64,
                                 1024}; /* fits (test_onchip_refusal_launches_nothing) */
  cudart_stub_reset();
  cudart_stub_keep_args(sizeof(sbn_coop_args_t));
  const sbnResult_t onchip =
      sbnForwardTrain(v, &small, b[0], b[1], NULL, NULL, NULL, NULL, NULL, sm, si, NULL, NULL);
  if (onchip != sbnSuccess) fprintf(stderr, "  onchip: %s\n", sbnGetLastError(v));
  ASSERT_OK(onchip);
  static cudart_stub_launch_t l;
  ASSERT_TRUE(cudart_stub_launch_at(0, &l));
  const sbn_coop_args_t* a = (const sbn_coop_args_t*)l.args;
  if (a->hold_slots < 1 || l.dyn != (size_t)sbn_hold_bytes(SBN_OP_FORWARD, a->hold_slots))
    SBN_FAIL_("onchip: %d slots held, %zu bytes of dynamic shared memory", a->hold_slots, l.dyn);
  cudaDeviceSynchronize();
  ASSERT_OK(sbnCommDestroy(v));
  /* ranks sharing a GPU */
  sbnComm_t two[2] = {NULL, NULL};
  const int same[2] = {0, 0};
  const sbnConfig_t cfg = case_config(TIMEOUT_MS);
  ASSERT_OK(sbnCommInitAll(two, 2, same, &cfg));
  cudaStream_t s[2];
  for (int r = 0; r < 2; r++) cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking);
  cudart_stub_reset();
  sbnGroupStart();
  for (int r = 0; r < 2; r++)
    sbnForwardTrain(two[r], &small, b[2 * r], b[2 * r + 1], NULL, NULL, NULL, NULL, NULL, sm, si,
                    NULL, (sbnStream_t)s[r]);
  const sbnResult_t ge = sbnGroupEnd();
  unsetenv("SBN_KERNEL");
  if (ge != sbnUnsupported || cudart_stub_launches(NULL, 0) != 0 ||
      strstr(sbnGetLastError(NULL), "ranks sharing a GPU") == NULL)
    SBN_FAIL_("onchip on ranks sharing a GPU: %s, %d launches ('%s')", sbnGetResultName(ge),
              cudart_stub_launches(NULL, 0), sbnGetLastError(NULL));
  cudaDeviceSynchronize();
  for (int r = 0; r < 2; r++) {
    cudaStreamDestroy(s[r]);
    ASSERT_OK(sbnCommDestroy(two[r]));
  }
  for (int i = 0; i < 5; i++) cudaFree(b[i]);
  cudaFree(sm), cudaFree(si);
  setenv("SBN_ALGO", "nccl", 1);
  ASSERT_CLEAN();
}

/* The host path of a virtual team of two (no NCCL: a gather kernel in its place): the
   statistics and publish stages of both ranks in one launch each, the gather of every
   rank's records for every rank (nops x nranks blocks), the apply; of a team of one: no
   gather, its apply reading its own records. */
static void test_virtual_host_path_launches(void) {
  stub_case(NULL);
  setenv("SBN_ALGO", "nccl", 1);
  for (int w = 1; w <= 2 && !sbn_test_cur_failed_; w++) {
    sbnComm_t v[2] = {NULL, NULL};
    ASSERT_OK(sbnCommInitVirtual(v, w, 0, NULL));
    const sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, 2, 64, 4096}; /* stream's plan */
    const size_t big = (size_t)(d.n * d.c * d.spatial) * sizeof(float),
                 ch = (size_t)d.c * sizeof(float);
    void* p[2][4];
    for (int r = 0; r < w; r++)
      for (int i = 0; i < 4; i++) p[r][i] = dalloc_on(0, i < 2 ? big : ch);
    cudart_stub_reset();
    cudart_stub_keep_args(sizeof(sbn_coop_args_t));
    sbnGroupStart();
    for (int r = 0; r < w; r++)
      sbnForwardTrain(v[r], &d, p[r][0], p[r][1], NULL, NULL, NULL, NULL, NULL, p[r][2], p[r][3],
                      NULL, NULL);
    const sbnResult_t ge = sbnGroupEnd();
    ASSERT_OK(ge);
    const int stages[4] = {SBN_HOST_STATS, SBN_HOST_PUBLISH, SBN_HOST_GATHER, SBN_HOST_APPLY};
    const int n = cudart_stub_launches(NULL, 0);
    static cudart_stub_launch_t l;
    int k = 0;
    for (int s = 0; s < 4; s++) {
      if (stages[s] == SBN_HOST_GATHER && w == 1) continue;
      const void* want =
          sbn_host_kernel_ptr(stages[s], SBN_OP_FORWARD, sbnFloat32, 0, 1, SBN_EPI_NONE);
      if (!cudart_stub_launch_at(k, &l) || l.fn != want) {
        SBN_FAIL_("team of %d: launch %d (of %d) is not host stage %d", w, k, n, stages[s]);
        break;
      }
      const sbn_coop_args_t* a = (const sbn_coop_args_t*)l.args;
      if (stages[s] == SBN_HOST_GATHER) ASSERT_EQ_INT(l.grid, w * w);
      if (stages[s] == SBN_HOST_APPLY) {
        ASSERT_EQ_INT(l.grid, w * a->G);
        if (w == 1 && a->r[0].mail != a->r[0].send)
          SBN_FAIL_("team of one: its apply reads %p, not its own records %p", (void*)a->r[0].mail,
                    (void*)a->r[0].send);
      }
      k++;
    }
    ASSERT_EQ_INT(n, k);
    cudaDeviceSynchronize();
    for (int r = 0; r < w; r++) ASSERT_OK(sbnCommDestroy(v[r]));
    for (int r = 0; r < w; r++)
      for (int i = 0; i < 4; i++) cudaFree(p[r][i]);
  }
  ASSERT_CLEAN();
}

/* The caller's current device is as it was (device 0) after an sbnCommInitAll team's
   init on devices 0 and 1, after rank 1's op alone (on device 1), and after the destroy. */
static void test_current_device_kept(void) {
  stub_case(NULL);
  unsetenv("SBN_ALGO");
  tensors_t t;
  tensors_alloc(&t, 1);
  cudaSetDevice(0);
  sbnComm_t comms[2] = {NULL, NULL};
  int now = -1;
  ASSERT_OK(init_all_two(comms, TIMEOUT_MS));
  cudaGetDevice(&now);
  if (now != 0) SBN_FAIL_("device %d current after sbnCommInitAll (device 0 before)", now);
  cudaSetDevice(0);
  ASSERT_OK(forward(comms[1], &t));
  cudaGetDevice(&now);
  if (now != 0) SBN_FAIL_("device %d current after rank 1's op (device 0 before)", now);
  cudaSetDevice(0);
  ASSERT_OK(sbnCommAbort(comms[0])); /* (rank 0 never comes) */
  for (int q = 0; q < 2; q++) ASSERT_OK(sbnCommDestroy(comms[q]));
  cudaGetDevice(&now);
  if (now != 0) SBN_FAIL_("device %d current after sbnCommDestroy (device 0 before)", now);
  tensors_free(&t);
  cudaSetDevice(0);
  setenv("SBN_ALGO", "nccl", 1);
  ASSERT_CLEAN();
}

/* An in-process GPU team gives back everything it took of the runtime (memory, streams,
   events): at its destroy, after ops, for a virtual team and an sbnCommInitAll one; and
   when its init fails (cudaSetDevice(1) failing at each of its calls in turn). */
static void test_teams_release_everything(void) {
  stub_case(NULL);
  unsetenv("SBN_ALGO");
  tensors_t t[2];
  tensors_alloc(&t[0], 0);
  tensors_alloc(&t[1], 1);
  cudaSetDevice(0);
  const size_t live0 = cudart_stub_live();
  for (int kind = 0; kind < 2 && !sbn_test_cur_failed_; kind++) {
    sbnComm_t comms[2] = {NULL, NULL};
    ASSERT_OK(kind ? init_all_two(comms, TIMEOUT_MS) : sbnCommInitVirtual(comms, 2, 0, NULL));
    sbnGroupStart();
    for (int r = 0; r < 2; r++) forward(comms[r], &t[kind ? r : 0]);
    ASSERT_OK(sbnGroupEnd());
    for (int q = 0; q < 2; q++) ASSERT_OK(sbnCommDestroy(comms[q]));
    if (cudart_stub_live() != live0)
      SBN_FAIL_("%s team: %zu runtime objects live after its destroy, %zu before its init",
                kind ? "sbnCommInitAll" : "virtual", cudart_stub_live(), live0);
  }
  int failed = 0;
  for (int nth = 1; nth <= 16 && !sbn_test_cur_failed_; nth++) {
    cudart_stub_fail_set_device(1, nth);
    sbnComm_t comms[2] = {NULL, NULL};
    const sbnResult_t r = init_all_two(comms, TIMEOUT_MS);
    cudart_stub_fail_set_device(-1, 0);
    cudaSetDevice(0);
    if (r == sbnSuccess) {
      for (int q = 0; q < 2; q++) ASSERT_OK(sbnCommDestroy(comms[q]));
    } else {
      failed++;
    }
    if (cudart_stub_live() != live0)
      SBN_FAIL_("cudaSetDevice(1) call %d failed (init: %s): %zu runtime objects live, %zu before",
                nth, sbnGetResultName(r), cudart_stub_live(), live0);
  }
  ASSERT_TRUE(failed > 0);
  tensors_free(&t[0]);
  tensors_free(&t[1]);
  cudaSetDevice(0);
  setenv("SBN_ALGO", "nccl", 1);
  ASSERT_CLEAN();
}

/* The team's failure is the cause a kernel wrote, not the sbnAborted of the ranks it
   stopped: rank 1's kernel timed out (its word), rank 0's was aborted by it (its word
   sbnAborted, read first): sbnCommGetAsyncError says sbnTimeout. */
static void test_err_words_cause_first(void) {
  stub_case(NULL);
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, TIMEOUT_MS));
  struct sbn_gpu_team* gt = sbn_gpu(comms[0]->team);
  __atomic_store_n(&gt->err[0], (int)sbnAborted, __ATOMIC_SEQ_CST);
  __atomic_store_n(&gt->err[1], (int)sbnTimeout, __ATOMIC_SEQ_CST);
  sbnResult_t async = sbnSuccess;
  ASSERT_OK(sbnCommGetAsyncError(comms[0], &async));
  for (int q = 0; q < 2; q++) ASSERT_OK(sbnCommDestroy(comms[q]));
  ASSERT_RES(async, sbnTimeout);
  ASSERT_CLEAN();
}

/* sbnCommAbort of an sbnCommInitAll team without NCCL comms (two ranks on device 0: NCCL
   refuses two ranks on one GPU) reaches both ranks' stop words. */
static void test_abort_without_nccl_stop_words(void) {
  stub_case(NULL);
  sbnComm_t comms[2] = {NULL, NULL};
  const int same[2] = {0, 0};
  const sbnConfig_t cfg = case_config(TIMEOUT_MS);
  ASSERT_OK(sbnCommInitAll(comms, 2, same, &cfg));
  ASSERT_TRUE(sbn_gpu(comms[0]->team)->nccl == NULL);
  ASSERT_OK(sbnCommAbort(comms[0]));
  const struct sbn_gpu_team* gt = sbn_gpu(comms[0]->team);
  for (int q = 0; q < 2; q++) ASSERT_EQ_INT(gt->ranks[q].state->stop, sbnAborted);
  for (int q = 0; q < 2; q++) ASSERT_OK(sbnCommDestroy(comms[q]));
  ASSERT_CLEAN();
}

/* s replaced by a stream that never finishes (a wedged device's copy engine). */
static void stall_stream(cudaStream_t* s) {
  cudaStreamDestroy(*s);
  cudart_stub_set_new_streams_pending(1);
  cudaStreamCreateWithFlags(s, cudaStreamNonBlocking);
  cudart_stub_set_new_streams_pending(0);
}

/* sbnCommAbort where no copy finishes (every rank's stop-word stream and an NCCL team's aux
   stream, which carries its notification, never done): the abort's waits share one
   deadline, the first abort's time plus the timeout, so sbnCommAbort returns within about
   one timeout, and a second sbnCommAbort and the destroy after it do not wait again. (Each
   wait had a timeout of its own: an "nccl-host" team's sbnCommAbort took 3 timeouts, the
   stop words' wait, the aux stream's and the stop words' again before the comm's abort,
   and its destroy a 4th.) For an "nccl-host" and an "nccl-lsa" team of one, and an
   sbnCommInitAll team of two devices. */
static void test_abort_waits_one_timeout(void) {
  const double T = STUCK_TIMEOUT_MS;
  static const char* const kind[3] = {"nccl-host", "nccl-lsa", "InitAll"};
  for (int k = 0; k < 3 && !sbn_test_cur_failed_; k++) {
    stub_case(NULL);
    sbnComm_t comms[2] = {NULL, NULL};
    const int n = k == 2 ? 2 : 1;
    ASSERT_OK(k == 2 ? init_all_two(comms, STUCK_TIMEOUT_MS)
                     : team_of_one(&comms[0], k == 0 ? "host" : NULL, STUCK_TIMEOUT_MS));
    if (k < 2) ASSERT_TRUE(strcmp(transport_of(comms[0]), kind[k]) == 0);
    struct sbn_gpu_team* gt = sbn_gpu(comms[0]->team);
    for (int q = 0; q < gt->nranks; q++)
      if (gt->ranks[q].present) stall_stream(&gt->ranks[q].stop_stream);
    if (gt->aux != NULL) stall_stream(&gt->aux);
    double t0 = now_ms();
    ASSERT_OK(sbnCommAbort(comms[0]));
    const double first = now_ms() - t0;
    t0 = now_ms();
    (void)sbnCommAbort(comms[n - 1]);
    const double again = now_ms() - t0;
    t0 = now_ms();
    for (int q = 0; q < n; q++) ASSERT_OK(sbnCommDestroy(comms[q]));
    const double destroy = now_ms() - t0;
    printf("  %s: sbnCommAbort %.0f ms, again %.0f ms, destroy %.0f ms (timeout %.0f ms)\n",
           kind[k], first, again, destroy, T);
    /* the first waits the timeout out (nothing lands); each wait of its own ran to a full
       deadline (2 T or more for a first abort of an NCCL team, T or more for a second and
       for the destroy), so the bounds below leave a slow machine T of slack and fail
       every kind of team on the old code */
    if (first < T || first >= 2 * T || again >= T || destroy >= T)
      SBN_FAIL_(
          "%s: sbnCommAbort %.0f ms (expected %.0f up to %.0f), a second %.0f ms and "
          "the destroy %.0f ms (expected below %.0f)",
          kind[k], first, T, 2 * T, again, destroy, T);
  }
  ASSERT_CLEAN();
}

static void* abort_main(void* comm) {
  (void)sbnCommAbort((sbnComm_t)comm);
  return NULL;
}
typedef struct {
  sbnComm_t comm;
  sbnResult_t r;
  _Atomic int done;
} destroy_job_t;
static void* destroy_main(void* arg) {
  destroy_job_t* d = arg;
  d->r = sbnCommDestroy(d->comm);
  atomic_store(&d->done, 1);
  return NULL;
}

/* pthread_cancel of a thread in sbnCommAbort while it waits for a stop word that does not
   land: the call runs with cancellation disabled (syncbn.h), so the cancel acts after it
   returns, and the destroy that follows returns. (A cancel in the wait's sleep left the
   team's count of aborts in progress, which the destroy waits for, at 1: the destroy never
   returned; and NCCL's lock held.) */
static void test_cancel_in_abort(void) {
  stub_case(NULL);
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, "host", STUCK_TIMEOUT_MS));
  stall_stream(&sbn_gpu(comm->team)->ranks[0].stop_stream);
  pthread_t th;
  ASSERT_TRUE(pthread_create(&th, NULL, abort_main, comm) == 0);
  struct timespec third = {0, STUCK_TIMEOUT_MS / 3 * 1000000L}; /* into the abort's wait */
  nanosleep(&third, NULL);
  ASSERT_TRUE(pthread_cancel(th) == 0);
  pthread_join(th, NULL);
  static destroy_job_t d;
  d.comm = comm;
  atomic_store(&d.done, 0);
  pthread_t dt;
  ASSERT_TRUE(pthread_create(&dt, NULL, destroy_main, &d) == 0);
  const double t0 = now_ms();
  while (!atomic_load(&d.done) && now_ms() - t0 < 20.0 * STUCK_TIMEOUT_MS) {
    struct timespec ts = {0, 2000000L};
    nanosleep(&ts, NULL);
  }
  if (!atomic_load(&d.done)) {
    pthread_detach(dt); /* it waits forever: the rest of the tests run beside it */
    SBN_FAIL_("the destroy after a cancelled sbnCommAbort has not returned after %.0f ms",
              20.0 * STUCK_TIMEOUT_MS);
  }
  pthread_join(dt, NULL);
  ASSERT_OK(d.r);
  ASSERT_CLEAN();
}

/* A team of `kind` (0 virtual of two, 1 sbnCommInitAll of two devices, 2 "nccl-host" and
   3 "nccl-lsa" of one) into comms, with the timeout T. */
static sbnResult_t init_kind(int kind, sbnComm_t comms[2], int64_t T) {
  if (kind == 0) {
    const sbnConfig_t cfg = case_config(T);
    return sbnCommInitVirtual(comms, 2, 0, &cfg);
  }
  if (kind == 1) return init_all_two(comms, T);
  return team_of_one(&comms[0], kind == 2 ? "host" : NULL, T);
}

/* sbnCommDestroy while every device runs a kernel that never ends (another library's
   collective waiting for a dead peer, which cudaDeviceSynchronize and cudaFree wait for):
   the last comm's destroy returns sbnTimeout after the timeout, naming the devices, with
   the team's memory, streams and events still held; they are freed by the library's
   thread once the devices finish. A destroy that is not the team's last waits for nothing.
   (The destroy synchronized the devices with no bound: it returned only at the stand-in's
   cap, CUDA_STUB_BUSY_MAX_MS, with a violation.) For a virtual team of two, an
   sbnCommInitAll team of two devices (its NCCL comms' finalize comes first, and moves the
   budget), and "nccl-host" and "nccl-lsa" teams of one. */
static void test_destroy_on_a_busy_device(void) {
  const double T = STUCK_TIMEOUT_MS;
  static const char* const kind[4] = {"virtual", "InitAll", "nccl-host", "nccl-lsa"};
  static const char* const names[4] = {
      "sbnCommDestroy: device 0 did not finish its work within timeout_ms",
      "sbnCommDestroy: devices 0, 1 did not finish their work within timeout_ms",
      "sbnCommDestroy: device 0 did not finish its work within timeout_ms",
      "sbnCommDestroy: device 0 did not finish its work within timeout_ms"};
  for (int k = 0; k < 4 && !sbn_test_cur_failed_; k++) {
    stub_case(NULL);
    const size_t before = cudart_stub_live();
    sbnComm_t comms[2] = {NULL, NULL};
    const int n = k < 2 ? 2 : 1;
    ASSERT_OK(init_kind(k, comms, STUCK_TIMEOUT_MS));
    if (k >= 2) ASSERT_TRUE(strcmp(transport_of(comms[0]), kind[k]) == 0);
    cudart_stub_set_devices_busy(1);
    double t0 = now_ms();
    const sbnResult_t first = n == 2 ? sbnCommDestroy(comms[0]) : sbnSuccess;
    const double first_ms = now_ms() - t0;
    t0 = now_ms();
    const sbnResult_t r = sbnCommDestroy(comms[n - 1]);
    const double waited = now_ms() - t0;
    char why[512];
    snprintf(why, sizeof why, "%s", sbnGetLastError(NULL));
    const int pending = sbn_gpu_releases_pending();
    const size_t held = cudart_stub_live();
    cudart_stub_set_devices_busy(0); /* the devices finish: the release goes on */
    t0 = now_ms();
    wait_releases();
    printf("  %s: the destroy %.0f ms (timeout %.0f ms), the release %.0f ms after the devices\n",
           kind[k], waited, T, now_ms() - t0);
    ASSERT_OK(first);
    if (first_ms >= T) SBN_FAIL_("%s: the first destroy took %.0f ms", kind[k], first_ms);
    ASSERT_RES(r, sbnTimeout);
    if (waited < T || waited >= 2 * T)
      SBN_FAIL_("%s: the destroy returned after %.0f ms (expected %.0f up to %.0f)", kind[k],
                waited, T, 2 * T);
    if (strstr(why, names[k]) == NULL)
      SBN_FAIL_("%s: sbnGetLastError(NULL) says '%s', not '%s'", kind[k], why, names[k]);
    ASSERT_EQ_INT(pending, 1);
    if (held <= before)
      SBN_FAIL_("%s: the team's resources were released under a busy device", kind[k]);
    ASSERT_EQ_INT(sbn_gpu_releases_pending(), 0);
    ASSERT_EQ_INT((int)cudart_stub_live(), (int)before);
    ASSERT_CLEAN();
  }
}

static void* devices_free_later(void* ms) {
  const long t = *(const long*)ms;
  struct timespec ts = {t / 1000, (t % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  cudart_stub_set_devices_busy(0);
  return NULL;
}

/* The destroy's budget is per wait: an "nccl-host" team of one whose device is busy for
   half the timeout (the program's own kernel, ending) and whose comm's finalize never
   settles (a peer that exited after its last op) returns sbnSuccess after ~1.5 timeouts:
   the device's wait had its timeout, then the finalize its own, then the abort. (A single
   timeout for the whole release cut it at the finalize with sbnTimeout.) */
static void test_destroy_budget_per_wait(void) {
  const double T = STUCK_TIMEOUT_MS;
  stub_case("ncclCommFinalize");
  const size_t before = cudart_stub_live();
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, "host", STUCK_TIMEOUT_MS));
  cudart_stub_set_devices_busy(1);
  static long busy_ms = STUCK_TIMEOUT_MS / 2;
  const double t0 =
      now_ms(); /* before the helper: the device is busy until t0 + busy_ms at least */
  pthread_t th;
  if (pthread_create(&th, NULL, devices_free_later, &busy_ms) != 0) {
    cudart_stub_set_devices_busy(0);
    SBN_FAIL_("pthread_create");
    return;
  }
  const sbnResult_t r = sbnCommDestroy(comm);
  const double waited = now_ms() - t0;
  pthread_join(th, NULL);
  printf("  the destroy %.0f ms (device busy %ld ms, finalize stuck, timeout %.0f ms)\n", waited,
         busy_ms, T);
  ASSERT_OK(r);
  if (waited < 1.5 * T || waited >= 3 * T)
    SBN_FAIL_("the destroy returned after %.0f ms (expected %.0f up to %.0f)", waited, 1.5 * T,
              3 * T);
  ASSERT_RECORD("ncclCommFinalize", "ncclCommAbort");
  ASSERT_EQ_INT(sbn_gpu_releases_pending(), 0);
  ASSERT_EQ_INT((int)cudart_stub_live(), (int)before);
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
  ASSERT_CLEAN();
}

/* A team's init while every device runs a kernel that never ends: the init waits for its
   own work only (the zeroing of the team's memory, on the rank's own stream), so it
   returns sbnSuccess at once, and the team's ops and destroy run once the devices finish.
   (The init synchronized whole devices: it returned only at the stand-in's cap,
   CUDA_STUB_BUSY_MAX_MS, with a violation.) For every kind of team. */
/* init_kind's team of `kind` made with the stand-in's switch `beside` on (switched off
   after); *took: the init's milliseconds. */
static sbnResult_t init_beside(int kind, sbnComm_t comms[2], void (*beside)(int on), double* took) {
  beside(1);
  const double t0 = now_ms();
  const sbnResult_t r = init_kind(kind, comms, STUCK_TIMEOUT_MS);
  *took = now_ms() - t0;
  beside(0);
  return r;
}

static void test_init_on_a_busy_device(void) {
  static const char* const kind[4] = {"virtual", "InitAll", "nccl-host", "nccl-lsa"};
  for (int k = 0; k < 4 && !sbn_test_cur_failed_; k++) {
    stub_case(NULL);
    const size_t before = cudart_stub_live();
    sbnComm_t comms[2] = {NULL, NULL};
    double took = 0.0;
    const sbnResult_t r = init_beside(k, comms, cudart_stub_set_devices_busy, &took);
    printf("  %s: the init beside busy devices %.1f ms\n", kind[k], took);
    ASSERT_OK(r);
    /* every memset of the init on a stream of its own (not the legacy default stream,
       which queues behind the program's blocking streams), found done later by a query of
       that stream: the init waited for each, every rank's */
    cudart_stub_step_t st[CUDA_STUB_STEP_LOG];
    const int ns = cudart_stub_steps(st, CUDA_STUB_STEP_LOG);
    int memsets = 0;
    for (int i = 0; i < ns && i < CUDA_STUB_STEP_LOG; i++) {
      if (st[i].what != 'M') continue;
      memsets++;
      int waited = 0;
      for (int j = i + 1; j < ns && j < CUDA_STUB_STEP_LOG && !waited; j++)
        waited = st[j].what == 'Q' && st[j].stream == st[i].stream;
      if (st[i].stream == NULL || !waited)
        SBN_FAIL_("%s: the init's memset %d %s", kind[k], memsets,
                  st[i].stream == NULL ? "on the legacy default stream" : "not waited for");
    }
    if (ns > CUDA_STUB_STEP_LOG || memsets < (k < 2    ? 4
                                              : k == 2 ? 1
                                                       : 2)) /* state, mailboxes;
                                                       an NCCL team's window */
      SBN_FAIL_("%s: %d steps, %d memsets", kind[k], ns, memsets);
    if (took >= STUCK_TIMEOUT_MS)
      SBN_FAIL_("%s: the init took %.0f ms beside busy devices", kind[k], took);
    if (k >= 2 && strcmp(transport_of(comms[0]), kind[k]) != 0)
      SBN_FAIL_("%s: the team's transport is %s", kind[k], transport_of(comms[0]));
    for (int q = 0; q < (k < 2 ? 2 : 1); q++) ASSERT_OK(sbnCommDestroy(comms[q]));
    ASSERT_EQ_INT((int)cudart_stub_live(), (int)before);
    ASSERT_CLEAN();
  }
}

/* An init whose own zeroing never finishes (every stream it makes stays busy: a device
   whose SMs are all held) gives sbnTimeout after the timeout, naming the device, and
   leaves nothing made (the team's release runs as a destroy's). An "nccl-host" team's
   agreement after it, on a stream of its own that never finishes either, takes its
   timeout too: the zeroing's failure is still the one reported (it was the agreement's,
   "did not all arrive"). */
static void test_init_zeroing_bounded(void) {
  const double T = STUCK_TIMEOUT_MS;
  static const char* const kind[3] = {"virtual", "InitAll", "nccl-host"};
  for (int k = 0; k < 3 && !sbn_test_cur_failed_; k++) {
    stub_case(NULL);
    const size_t before = cudart_stub_live();
    sbnComm_t comms[2] = {NULL, NULL};
    double took = 0.0;
    const sbnResult_t r = init_beside(k, comms, cudart_stub_set_new_streams_pending, &took);
    char why[512];
    snprintf(why, sizeof why, "%s", sbnGetLastError(NULL));
    printf("  %s: the init %.0f ms (timeout %.0f ms): %s\n", kind[k], took, T, why);
    ASSERT_RES(r, sbnTimeout);
    const double lo = k < 2 ? T : 2 * T; /* the zeroing's wait (then the agreement's) */
    if (took < lo || took >= lo + T)
      SBN_FAIL_("%s: the init returned after %.0f ms (expected %.0f up to %.0f)", kind[k], took, lo,
                lo + T);
    if (strstr(why,
               "the team's init: device 0 did not zero the team's memory within "
               "timeout_ms (300 ms)") == NULL)
      SBN_FAIL_("%s: sbnGetLastError(NULL) says '%s'", kind[k], why);
    ASSERT_TRUE(comms[0] == NULL && comms[1] == NULL);
    wait_releases();
    ASSERT_EQ_INT(sbn_gpu_releases_pending(), 0);
    ASSERT_EQ_INT((int)cudart_stub_live(), (int)before);
    ASSERT_CLEAN();
  }
}

/* sbnCommAbort while every device runs a kernel that never ends: ncclCommAbort frees the
   comm's device memory, which waits for the device (the stand-in's does while busy), so it
   runs on a thread of the library, waited for until the abort's deadline (the first
   abort's time plus the timeout): sbnCommAbort returns sbnSuccess after about the timeout,
   the team's ops are refused (sbnAborted), the last destroy returns sbnTimeout (its release
   waits for that thread), and everything is freed once the devices finish. (ncclCommAbort
   ran on the caller's thread: the stand-in's cap, then a violation.) An sbnCommInitAll team
   of two devices (its host path's comms) and an "nccl-host" team of one; and that team with
   its ncclCommAbort held alone, the devices idle: the release still waits for the abort's
   thread before it frees the team (which that thread writes when it ends, as NCCL unmaps
   an "nccl-lsa" team's window there), so the destroy still gives sbnTimeout. */
static void test_abort_on_a_busy_device(void) {
  const double T = STUCK_TIMEOUT_MS;
  static const char* const kind[3] = {"InitAll", "nccl-host", "nccl-host, ncclCommAbort held"};
  for (int k = 0; k < 3 && !sbn_test_cur_failed_; k++) {
    stub_case(NULL);
    const size_t before = cudart_stub_live();
    const int live0 = nccl_stub_live_comms();
    sbnComm_t comms[2] = {NULL, NULL};
    const int n = k == 0 ? 2 : 1;
    ASSERT_OK(init_kind(k == 0 ? 1 : 2, comms, STUCK_TIMEOUT_MS));
    tensors_t t;
    tensors_alloc(&t, 0);
    if (k < 2)
      cudart_stub_set_devices_busy(1);
    else
      cudart_stub_hold_aborts(1);
    double t0 = now_ms();
    const sbnResult_t ar = sbnCommAbort(comms[0]);
    const double abort_ms = now_ms() - t0;
    const sbnResult_t fr = forward(comms[n - 1], &t);
    const sbnResult_t first = n == 2 ? sbnCommDestroy(comms[0]) : sbnSuccess;
    t0 = now_ms();
    const sbnResult_t dr = sbnCommDestroy(comms[n - 1]);
    const double destroy_ms = now_ms() - t0;
    const int pending = sbn_gpu_releases_pending();
    cudart_stub_set_devices_busy(0);
    cudart_stub_hold_aborts(0);
    wait_releases();
    tensors_free(&t);
    printf("  %s: sbnCommAbort %.0f ms, the destroy %.0f ms (timeout %.0f ms)\n", kind[k], abort_ms,
           destroy_ms, T);
    ASSERT_OK(ar);
    if (abort_ms < 0.9 * T || abort_ms >= 2 * T)
      SBN_FAIL_("%s: sbnCommAbort returned after %.0f ms (expected %.0f up to %.0f)", kind[k],
                abort_ms, T, 2 * T);
    ASSERT_RES(fr, sbnAborted);
    ASSERT_OK(first);
    ASSERT_RES(dr, sbnTimeout);
    if (destroy_ms >= 2 * T) SBN_FAIL_("%s: the destroy took %.0f ms", kind[k], destroy_ms);
    ASSERT_EQ_INT(pending, 1);
    ASSERT_EQ_INT(sbn_gpu_releases_pending(), 0);
    ASSERT_EQ_INT((int)cudart_stub_live(), (int)before);
    ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
    ASSERT_CLEAN();
  }
}

/* The destroy of an sbnCommInitAll team whose comms' finalize never settles aborts the
   comms instead (sbn_nccl_abort_all), on a thread of the library; with that ncclCommAbort
   held (cudart_stub_hold_aborts), the release waits for it before it frees the team, which
   the thread writes when it ends: the destroy returns sbnTimeout, the team held until the
   abort returns. (Without that wait the team was freed under the abort's thread, which
   then wrote freed memory: AddressSanitizer's heap-use-after-free.) */
static void test_destroy_waits_for_its_abort(void) {
  const double T = STUCK_TIMEOUT_MS;
  stub_case("ncclCommFinalize");
  const size_t before = cudart_stub_live();
  const int live0 = nccl_stub_live_comms();
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, STUCK_TIMEOUT_MS));
  ASSERT_OK(sbnCommDestroy(comms[0]));
  cudart_stub_hold_aborts(1);
  const double t0 = now_ms();
  const sbnResult_t r = sbnCommDestroy(comms[1]);
  const double took = now_ms() - t0;
  struct timespec third = {0, STUCK_TIMEOUT_MS / 3 * 1000000L};
  nanosleep(&third, NULL); /* (a release that did not wait has freed the team by now) */
  const int pending = sbn_gpu_releases_pending();
  const size_t held = cudart_stub_live();
  cudart_stub_hold_aborts(0);
  wait_releases();
  printf("  the destroy %.0f ms (finalize stuck, its abort held, timeout %.0f ms)\n", took, T);
  ASSERT_RES(r, sbnTimeout);
  if (took < 2 * T || took >= 4 * T)
    SBN_FAIL_("the destroy returned after %.0f ms (expected %.0f up to %.0f)", took, 2 * T, 4 * T);
  ASSERT_EQ_INT(pending, 1);
  if (held <= before) SBN_FAIL_("the team was freed while its comm's abort was held");
  ASSERT_RECORD("ncclCommFinalize", "ncclCommAbort");
  ASSERT_EQ_INT(sbn_gpu_releases_pending(), 0);
  ASSERT_EQ_INT((int)cudart_stub_live(), (int)before);
  ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
  ASSERT_CLEAN();
}

/* Waits (up to 20 timeouts) until the stand-in NCCL's live comms are `live`. */
static void wait_live_comms(int live) {
  const double t0 = now_ms();
  while (nccl_stub_live_comms() != live && now_ms() - t0 < 20.0 * STUCK_TIMEOUT_MS) {
    struct timespec ts = {0, 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* An init whose NCCL comm never finishes its own init (a peer that never comes) aborts it,
   and ncclCommAbort waits for the device (it frees the comm's device memory): behind a
   kernel that never ends, for ever. With the stand-in's ncclCommAbort held
   (cudart_stub_hold_aborts), each init returns its own failure after its timeout and at
   most one more (the abort's, on a thread of the library), the comm still live, and the
   comm is aborted once the hold ends. (ncclCommAbort ran on the caller's thread: the
   stand-in's cap, CUDA_STUB_BUSY_MAX_MS, then a violation.) For:
   - sbnCommInitNcclRank, the id's comm ("ncclCommInitRankConfig"): sbnTimeout after 2 T;
   - sbnCommInitNccl, the split child of the caller's comm ("init (split child)"): the same;
   - sbnCommSplit of an NCCL team, its child ("init (split child):2", the team's own comm
     being the first): sbnTimeout after 2 T, the team then aborted as after any split's
     timeout, the child's abort and the team's within the team's abort's deadline (its own
     comm's abort, held too: 3 T when the child's had a deadline of its own);
   - sbnCommInitAll's host-path comms ("ncclCommInitRankConfig"): sbnSuccess after 2 T,
     the team working without them, as test_stuck_initall_comms's. */
static void test_failed_init_abort_bounded(void) {
  const double T = STUCK_TIMEOUT_MS;
  static const char* const kind[4] = {"sbnCommInitNcclRank", "sbnCommInitNccl", "sbnCommSplit",
                                      "sbnCommInitAll"};
  static const char* const hang[4] = {"ncclCommInitRankConfig", "init (split child)",
                                      "init (split child):2", "ncclCommInitRankConfig"};
  static const int waits[4] = {2, 2, 2, 2}; /* timeouts the call waits out */
  for (int k = 0; k < 4 && !sbn_test_cur_failed_; k++) {
    stub_case(hang[k]);
    const int live0 = nccl_stub_live_comms();
    sbnComm_t comms[2] = {NULL, NULL}, sub = (sbnComm_t)&sub;
    ncclComm_t nc = NULL;
    sbnNcclUniqueId_t id;
    if (k == 0) ASSERT_OK(sbnGetNcclUniqueId(&id));
    if (k == 1) nc = caller_comm(0, 1);
    if (k == 2) ASSERT_OK(team_of_one(&comms[0], "host", STUCK_TIMEOUT_MS));
    const int live1 = nccl_stub_live_comms(); /* (k 1, 2: the caller's comm, the team's) */
    cudart_stub_hold_aborts(1);
    const double t0 = now_ms();
    sbnResult_t r = sbnSuccess;
    if (k == 0) r = init_rank(&comms[0], &id, 2, 0, STUCK_TIMEOUT_MS);
    if (k == 1) r = init_nccl(&comms[0], nc, NULL, STUCK_TIMEOUT_MS);
    if (k == 2) r = sbnCommSplit(comms[0], 0, 0, &sub);
    if (k == 3) r = init_all_two(comms, STUCK_TIMEOUT_MS);
    const double took = now_ms() - t0;
    char why[512];
    snprintf(why, sizeof why, "%s", sbnGetLastError(k == 2 ? comms[0] : NULL));
    const int held = nccl_stub_live_comms();
    cudart_stub_hold_aborts(0);
    printf("  %s: %s after %.0f ms (timeout %.0f ms): %s\n", kind[k], sbnGetResultName(r), took, T,
           k == 3 ? "-" : why);
    if (took < waits[k] * T || took >= (waits[k] + 1) * T)
      SBN_FAIL_("%s: the call returned after %.0f ms (expected %.0f up to %.0f)", kind[k], took,
                waits[k] * T, (waits[k] + 1) * T);
    if (held <= live1) SBN_FAIL_("%s: the comm was aborted while its abort was held", kind[k]);
    if (k < 3) {
      ASSERT_RES(r, sbnTimeout);
      if (strstr(why, "did not complete within the timeout") == NULL)
        SBN_FAIL_("%s: sbnGetLastError says '%s', not the init's timeout", kind[k], why);
      ASSERT_TRUE(k == 2 ? sub == (sbnComm_t)&sub : comms[0] == NULL);
    } else {
      ASSERT_OK(r);
    }
    wait_live_comms(live1 - (k == 2));
    ASSERT_EQ_INT(nccl_stub_live_comms(), live1 - (k == 2)); /* (a split aborts its team's comm) */
    if (k == 1) ASSERT_TRUE(ncclCommAbort(nc) == ncclSuccess); /* the caller's */
    if (k >= 2) ASSERT_OK(sbnCommDestroy(comms[0]));
    if (k == 3) ASSERT_OK(sbnCommDestroy(comms[1]));
    wait_releases();
    ASSERT_RECORD("ncclCommAbort");
    ASSERT_EQ_INT(nccl_stub_live_comms(), live0);
    unsetenv("NCCL_STUB_HANG"); /* (not stub_case: its reset would clear what ASSERT_CLEAN reads) */
    ASSERT_CLEAN();
  }
}

/* A program whose work is on device 1 (its current device) makes, uses and destroys a team
   there, has an init fail there, and aborts a team there: neither the library's release
   thread nor its abort thread makes device 0 current, which on CUDA makes device 0's
   primary context (~0.5 GB of its memory, in every process of a job on other GPUs). The
   release thread started on CUDA's default, device 0, and restored it at its end; the
   abort thread's ncclCommAbort (NCCL's restores the thread's device after it works on the
   comm's, as the stand-in's now does) did the same. For a virtual team of one, an
   sbnCommInitAll team of device 1 and an NCCL team made from an id on device 1. */
static void test_release_leaves_device_0_alone(void) {
  static const char* const kind[3] = {"virtual", "InitAll", "NCCL from an id"};
  static const char* const mode[3] = {"", ", a failed init", ", aborted"};
  for (int k = 0; k < 3 && !sbn_test_cur_failed_; k++) {
    for (int m = 0; m < 3 && !sbn_test_cur_failed_; m++) {
      stub_case(NULL);
      ASSERT_TRUE(cudaSetDevice(1) == cudaSuccess);
      const sbnConfig_t cfg = case_config(TIMEOUT_MS);
      const int dev = 1;
      sbnComm_t c = NULL;
      sbnNcclUniqueId_t id;
      if (k == 2) ASSERT_OK(sbnGetNcclUniqueId(&id));
      cudart_stub_set_occupancy_fails(m == 1); /* fails before anything is made on the device */
      const sbnResult_t r = k == 0   ? sbnCommInitVirtual(&c, 1, dev, &cfg)
                            : k == 1 ? sbnCommInitAll(&c, 1, &dev, &cfg)
                                     : sbnCommInitNcclRank(&c, &id, 1, 0, &cfg);
      cudart_stub_set_occupancy_fails(0);
      if (m != 1) {
        ASSERT_OK(r);
        tensors_t t;
        tensors_alloc(&t, 1);
        ASSERT_OK(forward(c, &t));
        ASSERT_TRUE(cudaDeviceSynchronize() == cudaSuccess);
        tensors_free(&t);
        if (m == 2) ASSERT_OK(sbnCommAbort(c));
        ASSERT_OK(sbnCommDestroy(c));
      } else {
        ASSERT_TRUE(r != sbnSuccess && c == NULL);
      }
      wait_releases();
      if (cudart_stub_devices_set() != 1u << 1)
        SBN_FAIL_("%s%s: devices made current 0x%x (device 1 only: 0x2)", kind[k], mode[m],
                  cudart_stub_devices_set());
      ASSERT_CLEAN();
    }
  }
  cudaSetDevice(0);
}

/* An init that fails while every device runs a kernel that never ends: freeing what it
   made waits for the devices, so that release is bounded as a destroy's is. The init
   returns its own failure, what it made held until the devices finish, then freed by the
   library's thread. (It freed them on the caller's thread, with no bound: the stand-in's
   cap, then a violation.) The in-process teams fail at their zeroing (streams that never
   finish: sbnTimeout after the timeout, then the release's timeout), an "nccl-host" team
   at its occupancy query (after its agreement's stream and scratch memory: the release's
   timeout). */
static void test_init_failure_on_a_busy_device(void) {
  const double T = STUCK_TIMEOUT_MS;
  static const char* const kind[3] = {"virtual", "InitAll", "nccl-host"};
  static const char* const says[3] = {"did not zero the team's memory",
                                      "did not zero the team's memory",
                                      "cudaOccupancyMaxActiveBlocksPerMultiprocessor"};
  for (int k = 0; k < 3 && !sbn_test_cur_failed_; k++) {
    stub_case(NULL);
    const size_t before = cudart_stub_live();
    const double lo = k < 2 ? 2 * T : T; /* the zeroing's wait, then the release's */
    sbnComm_t comms[2] = {NULL, NULL};
    cudart_stub_set_devices_busy(1);
    if (k < 2)
      cudart_stub_set_new_streams_pending(1);
    else
      cudart_stub_set_occupancy_fails(1);
    const double t0 = now_ms();
    const sbnResult_t r = init_kind(k, comms, STUCK_TIMEOUT_MS);
    const double took = now_ms() - t0;
    cudart_stub_set_new_streams_pending(0);
    cudart_stub_set_occupancy_fails(0);
    char why[512];
    snprintf(why, sizeof why, "%s", sbnGetLastError(NULL));
    const int pending = sbn_gpu_releases_pending();
    const size_t held = cudart_stub_live();
    cudart_stub_set_devices_busy(0);
    wait_releases();
    printf("  %s: the failed init %.0f ms (timeout %.0f ms): %s\n", kind[k], took, T, why);
    if (r == sbnSuccess || (k == 2 && r == sbnTimeout))
      SBN_FAIL_("%s: the init returned %s", kind[k], sbnGetResultName(r));
    if (took < lo || took >= lo + T)
      SBN_FAIL_("%s: the init returned after %.0f ms (expected %.0f up to %.0f)", kind[k], took, lo,
                lo + T);
    if (strstr(why, says[k]) == NULL)
      SBN_FAIL_("%s: sbnGetLastError(NULL) says '%s', not the init's failure", kind[k], why);
    ASSERT_TRUE(comms[0] == NULL && comms[1] == NULL);
    ASSERT_EQ_INT(pending, 1);
    if (held <= before) SBN_FAIL_("%s: nothing was held under the busy device", kind[k]);
    ASSERT_EQ_INT(sbn_gpu_releases_pending(), 0);
    ASSERT_EQ_INT((int)cudart_stub_live(), (int)before);
    ASSERT_CLEAN();
  }
}

/* A group of an sbnCommInitAll team whose rank 0 launched and rank 1's launch failed:
   rank 0's kernel would wait for rank 1 until the timeout, so the team is aborted (both
   stop words say so, the failure reported on both comms) and the group says why. */
static void test_second_launch_failure_aborts(void) {
  stub_case(NULL);
  sbnComm_t comms[2] = {NULL, NULL};
  ASSERT_OK(init_all_two(comms, TIMEOUT_MS));
  const int64_t n[2] = {2, 2};
  sbnResult_t f[2];
  cudart_stub_fail_coop_launch_nth(2);
  const sbnResult_t ge = pair_forward(comms, n, f);
  cudart_stub_fail_coop_launch_nth(0);
  ASSERT_RES(ge, sbnCudaError);
  ASSERT_EQ_INT(cudart_stub_launches(NULL, 0), 1);
  const struct sbn_gpu_team* gt = sbn_gpu(comms[0]->team);
  for (int q = 0; q < 2; q++) ASSERT_EQ_INT(gt->ranks[q].state->stop, sbnAborted);
  for (int q = 0; q < 2; q++) {
    sbnResult_t async = sbnSuccess;
    ASSERT_OK(sbnCommGetAsyncError(comms[q], &async));
    if (async == sbnSuccess) SBN_FAIL_("rank %d: the team was not aborted", q);
  }
  for (int q = 0; q < 2; q++) ASSERT_OK(sbnCommDestroy(comms[q]));
  ASSERT_CLEAN();
}

/* A device index past the last device (the stand-in has 2) is the caller's error,
   sbnInvalidArgument naming it, nothing written; not a CUDA error of the init. */
static void test_device_past_the_last(void) {
  stub_case(NULL);
  const int devs[2] = {0, 2};
  const sbnComm_t sentinel = (sbnComm_t)&devs;
  sbnComm_t comms[2] = {sentinel, sentinel};
  ASSERT_RES(sbnCommInitAll(comms, 2, devs, NULL), sbnInvalidArgument);
  ASSERT_TRUE(strstr(sbnGetLastError(NULL), "device 2 does not exist") != NULL);
  ASSERT_RES(sbnCommInitVirtual(comms, 2, 2, NULL), sbnInvalidArgument);
  ASSERT_TRUE(strstr(sbnGetLastError(NULL), "device 2 does not exist") != NULL);
  ASSERT_TRUE(comms[0] == sentinel && comms[1] == sentinel);
  ASSERT_CLEAN();
}

/* sbnForwardInferenceEx's kernel and arguments: the tile kernel for H*W = 1 (NCHW) and
   NHWC, its 16-byte variant only where C is a multiple of the vector width; the scalar
   plane kernel where z or y is not 16-byte aligned; the leaky ReLU's slope and z in the
   arguments; nothing launched for an empty batch. */
static void test_inference_kernel_ex(void) {
  stub_case(NULL);
  static const struct {
    sbnLayout_t lay;
    int64_t n, c, sp;
    int zoff, yoff; /* elements off 16-byte alignment */
    int kind, vec;  /* what runs (kind -1: nothing) */
  } cases[] = {
      {sbnLayoutNCHW, 64, 6, 1, 0, 0, SBN_INFER_TILE, 0},
      {sbnLayoutNCHW, 64, 8, 1, 0, 0, SBN_INFER_TILE, 1},
      {sbnLayoutNHWC, 8, 6, 16, 0, 0, SBN_INFER_TILE, 0},
      {sbnLayoutNHWC, 8, 8, 16, 0, 0, SBN_INFER_TILE, 1},
      {sbnLayoutNCHW, 2, 4, 4096, 1, 0, SBN_INFER_PLANE, 0},
      {sbnLayoutNCHW, 2, 4, 4096, 0, 1, SBN_INFER_PLANE, 0},
      {sbnLayoutNCHW, 2, 4, 4096, 0, 0, SBN_INFER_FLAT, 1},
      {sbnLayoutNCHW, 0, 4, 4096, 0, 0, -1, 0},
  };
  sbnEpilogue_t leaky = SBN_EPILOGUE_INITIALIZER;
  leaky.activation = sbnActivationLeakyRelu;
  leaky.slope = 0.25f;
  unsetenv("SBN_INFER");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !sbn_test_cur_failed_; i++) {
    const sbnTensorDesc_t d = {sbnFloat32, cases[i].lay, cases[i].n, cases[i].c, cases[i].sp};
    const size_t bytes = (size_t)(d.n * d.c * d.spatial) * sizeof(float) + 16;
    float *x = dalloc_on(0, bytes), *z = dalloc_on(0, bytes), *y = dalloc_on(0, bytes),
          *st = dalloc_on(0, (size_t)d.c * 4 * sizeof(float));
    cudart_stub_reset();
    cudart_stub_keep_args(sizeof(sbn_infer_args_t));
    const sbnResult_t r =
        sbnForwardInferenceEx(&d, x, z + cases[i].zoff, y + cases[i].yoff, st, st + d.c,
                              st + 2 * d.c, st + 3 * d.c, 1e-5f, &leaky, NULL);
    static cudart_stub_launch_t l;
    const int n = cudart_stub_launches(NULL, 0);
    const int got = cudart_stub_launch_at(0, &l);
    cudaDeviceSynchronize();
    cudaFree(x), cudaFree(z), cudaFree(y), cudaFree(st);
    ASSERT_OK(r);
    if (cases[i].kind < 0) {
      if (n != 0) SBN_FAIL_("case %zu (empty): %d launches", i, n);
      continue;
    }
    const void* want = sbn_infer_kernel_ptr(sbnFloat32, cases[i].kind, cases[i].vec, 1);
    const sbn_infer_args_t* a = (const sbn_infer_args_t*)l.args;
    if (n != 1 || !got || want == NULL || l.fn != want)
      SBN_FAIL_("case %zu: %d launches, not the %s kernel (%s)", i, n,
                cases[i].kind == SBN_INFER_TILE   ? "tile"
                : cases[i].kind == SBN_INFER_FLAT ? "flat"
                                                  : "plane",
                cases[i].vec ? "16-byte" : "scalar");
    else if (a->act != SBN_ACT_LEAKY || a->slope != 0.25f || a->z != z + cases[i].zoff)
      SBN_FAIL_("case %zu: act %d, slope %g, z %p (want %d, 0.25, %p)", i, a->act, (double)a->slope,
                a->z, SBN_ACT_LEAKY, (const void*)(z + cases[i].zoff));
  }
  ASSERT_CLEAN();
}

/* The host path of an sbnCommInitAll team without NCCL comms (two ranks on device 0) runs
   only a round of every rank: one rank's op alone is refused (sbnInvalidUsage, nothing
   launched) and the team is not aborted (nobody was launched to wait for it). */
static void test_host_path_without_nccl_whole_team(void) {
  stub_case(NULL);
  setenv("SBN_ALGO", "nccl", 1);
  sbnComm_t comms[2] = {NULL, NULL};
  duo_t p;
  const int same[2] = {0, 0};
  ASSERT_OK(duo_team(comms, &p, same));
  cudart_stub_reset();
  tensors_t* t = &p.t[0];
  const sbnResult_t r = sbnForwardTrain(comms[0], &g_desc, t->x, t->y, NULL, NULL, NULL, NULL, NULL,
                                        t->smean, t->sinvstd, NULL, (sbnStream_t)p.st[0]);
  const int n = cudart_stub_launches(NULL, 0);
  sbnResult_t async = sbnSystemError;
  ASSERT_OK(sbnCommGetAsyncError(comms[1], &async));
  if (r != sbnInvalidUsage || n != 0 ||
      strstr(sbnGetLastError(comms[0]), "has no NCCL comm") == NULL)
    SBN_FAIL_("rank 0's host-path op alone: %s, %d launches ('%s')", sbnGetResultName(r), n,
              sbnGetLastError(comms[0]));
  ASSERT_RES(async, sbnSuccess);
  for (int q = 0; q < 2; q++) ASSERT_OK(sbnCommDestroy(comms[q]));
  duo_free(&p);
  ASSERT_CLEAN();
}

/* An "nccl-host" team (no window: no in-kernel exchange) runs the host path whatever
   SBN_ALGO says: unset, its op is not the cooperative kernel. */
static void test_nccl_host_team_takes_host_path(void) {
  stub_case(NULL);
  sbnComm_t comm = NULL;
  ASSERT_OK(team_of_one(&comm, "host", TIMEOUT_MS));
  ASSERT_TRUE(strcmp(transport_of(comm), "nccl-host") == 0);
  unsetenv("SBN_ALGO");
  ops_ok(comm); /* sbnCommGetKernel: "host" */
  setenv("SBN_ALGO", "nccl", 1);
  CHECK_();
  ASSERT_OK(sbnCommDestroy(comm));
  ASSERT_CLEAN();
}

int main(void) {
  /* every op on the host path, whose NCCL calls are the subject; the configs' timeouts */
  setenv("SBN_ALGO", "nccl", 1);
  unsetenv("SBN_TIMEOUT_MS");
  unsetenv("SBN_NCCL_TRANSPORT");
  unsetenv("SBN_KERNEL");
  fprintf(stderr, "stand-in NCCL: NCCL_STUB_POLLS=%s NCCL_STUB_RETURN=%s\n",
          getenv("NCCL_STUB_POLLS") ? getenv("NCCL_STUB_POLLS") : "(3)",
          getenv("NCCL_STUB_RETURN") ? getenv("NCCL_STUB_RETURN") : "(success)");
  SBN_RUN(test_init_window_blocking_caller);
  SBN_RUN(test_init_host_nonblocking_caller);
  SBN_RUN(test_init_rank_from_id);
  SBN_RUN(test_init_rank_stuck_and_arguments);
  SBN_RUN(test_init_fault_calloc_told);
  SBN_RUN(test_init_fault_thread_told);
  SBN_RUN(test_kernel_env);
  SBN_RUN(test_split_lsa);
  SBN_RUN(test_split_host);
  SBN_RUN(test_abort);
  SBN_RUN(test_abort_host);
  SBN_RUN(test_abort_after_captured_host_op);
  SBN_RUN(test_abort_with_host_op_pending);
  SBN_RUN(test_abort_destroy_under_foreign_capture);
  SBN_RUN(test_abort_window_kernel_running);
  SBN_RUN(test_abort_sets_stop_words);
  SBN_RUN(test_abort_two_devices_stop_words);
  SBN_RUN(test_initall);
  SBN_RUN(test_destroy_two_devices_kernels_running);
  SBN_RUN(test_grid_leaves_sms_free);
  SBN_RUN(test_onchip_refusal_launches_nothing);
  SBN_RUN(test_virtual_launch_failure_keeps_team);
  SBN_RUN(test_initall_first_launch_failure_keeps_team);
  SBN_RUN(test_pointer_query_failure);
  SBN_RUN(test_training_pointer_checks);
  SBN_RUN(test_virtual_split_outside_group);
  SBN_RUN(test_initall_split_one_thread_per_rank);
  SBN_RUN(test_initall_split_aborted_by_peer);
  SBN_RUN(test_initall_split_peer_destroyed);
  SBN_RUN(test_peer_transport_needs_access);
  SBN_RUN(test_team_of_one_kernel);
  SBN_RUN(test_inference_kernel);
  SBN_RUN(test_inference_one_device);
  SBN_RUN(test_shared_gpu_streams);
  SBN_RUN(test_failed_capture_keeps_count);
  SBN_RUN(test_group_mixed_capture);
  SBN_RUN(test_stop_slots);
  SBN_RUN(test_stuck_split_of_callers_comm);
  SBN_RUN(test_stuck_split_child_init);
  SBN_RUN(test_stuck_agreement);
  SBN_RUN(test_stuck_window_register);
  SBN_RUN(test_stuck_allgather_lsa);
  SBN_RUN(test_stuck_allgather_host);
  SBN_RUN(test_stuck_team_split);
  SBN_RUN(test_stuck_finalize);
  SBN_RUN(test_stuck_agreement_runs);
  SBN_RUN(test_peer_failed_or_differs);
  SBN_RUN(test_peer_transport);
  SBN_RUN(test_window_not_symmetric);
  SBN_RUN(test_stuck_team_split_host);
  SBN_RUN(test_watchdog_ends_stuck_host_op);
  SBN_RUN(test_watchdog_times_from_the_start);
  SBN_RUN(test_watchdog_finds_a_stuck_op_behind_later_ones);
  SBN_RUN(test_watchdog_times_every_op_in_flight);
  SBN_RUN(test_watch_slots_full_bounded);
  SBN_RUN(test_watch_slots_full_abort_ends_the_wait);
  SBN_RUN(test_failed_ops_give_back_their_slots);
  SBN_RUN(test_watch_slot_used_again_times_afresh);
  SBN_RUN(test_destroy_initall_host_op_pending);
  SBN_RUN(test_stuck_finalize_initall);
  SBN_RUN(test_abort_while_op_waits_host);
  SBN_RUN(test_abort_while_op_waits_lsa);
  SBN_RUN(test_abort_while_split_waits_host);
  SBN_RUN(test_abort_while_split_waits_lsa);
  SBN_RUN(test_abort_while_split_child_agrees_host);
  SBN_RUN(test_abort_while_split_child_agrees_lsa);
  SBN_RUN(test_abort_while_split_child_registers);
  SBN_RUN(test_abort_while_split_child_agreement_runs);
  SBN_RUN(test_abort_while_split_child_zeroes);
  SBN_RUN(test_destroy_after_unread_kernel_failure);
  SBN_RUN(test_destroy_while_kernel_fails);
  SBN_RUN(test_group_thread_fails_beside_gpu_team);
  SBN_RUN(test_initall_abort_ends_collective);
  SBN_RUN(test_stuck_initall_comms);
  SBN_RUN(test_virtual_launch_args);
  SBN_RUN(test_peer_host_launch_args);
  SBN_RUN(test_virtual_round_refusals);
  SBN_RUN(test_backward_pointer_checks);
  SBN_RUN(test_plan_reads_round);
  SBN_RUN(test_virtual_host_path_launches);
  SBN_RUN(test_current_device_kept);
  SBN_RUN(test_teams_release_everything);
  SBN_RUN(test_err_words_cause_first);
  SBN_RUN(test_abort_without_nccl_stop_words);
  SBN_RUN(test_abort_waits_one_timeout);
  SBN_RUN(test_cancel_in_abort);
  SBN_RUN(test_destroy_on_a_busy_device);
  SBN_RUN(test_init_on_a_busy_device);
  SBN_RUN(test_init_zeroing_bounded);
  SBN_RUN(test_init_failure_on_a_busy_device);
  SBN_RUN(test_release_leaves_device_0_alone);
  SBN_RUN(test_abort_on_a_busy_device);
  SBN_RUN(test_destroy_waits_for_its_abort);
  SBN_RUN(test_failed_init_abort_bounded);
  SBN_RUN(test_split_failure_keeps_its_message);
  SBN_RUN(test_abort_while_in_process_split_zeroes);
  SBN_RUN(test_destroy_budget_per_wait);
  SBN_RUN(test_second_launch_failure_aborts);
  SBN_RUN(test_device_past_the_last);
  SBN_RUN(test_inference_kernel_ex);
  SBN_RUN(test_host_path_without_nccl_whole_team);
  SBN_RUN(test_nccl_host_team_takes_host_path);
  return sbn_test_exit();
}
