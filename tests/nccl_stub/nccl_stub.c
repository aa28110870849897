/* nccl_stub.c — a stand-in libnccl.so.2 with NCCL 2.28.9's nonblocking behaviour, for
 * testing libsyncbn's NCCL protocol without a GPU (test_nccl_stub; nccl_stub.h lists its
 * configuration and what it counts as a violation).
 *
 * It implements the NCCL functions libsyncbn calls, plus ncclCommInitRank[Config] for the
 * test's own comm. A comm has ranks in this process only: a comm of one rank
 * (sbnCommInitNccl at W = 1), or the ranks of one ncclUniqueId made in one group
 * (sbnCommInitAll's comms); its collectives copy what this rank knows (its own part). What
 * it models is the timing NCCL shows on a nonblocking comm:
 *   - an operation (init, split, collective, window (de)registration, finalize) leaves
 *     the comm in progress for NCCL_STUB_POLLS polls of ncclCommGetAsyncError, while the
 *     call itself returned ncclSuccess (or ncclInProgress, NCCL_STUB_RETURN);
 *   - a call on a comm in progress is refused (ncclInvalidArgument, the message NCCL
 *     logs) and counted as a violation;
 *   - ncclCommSplit writes NULL into *newcomm at the call and the child only when the
 *     parent's part is done (a poll of the parent); the child is then in progress with its
 *     own init. ncclCommWindowRegister writes the handle when it is done;
 *   - a peer that never comes (NCCL_STUB_HANG) is an operation that never finishes.
 * On a blocking comm every operation finishes inside the call, as NCCL's do. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <limits.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudart_stub.h" /* the kernels still running on a device */
#include "nccl_stub.h"

#define STUB_COMM_MAGIC 0x4e43434cu
#define STUB_MAX_GROUP 64

/* what an operation writes when it is done */
typedef enum { OUT_NONE, OUT_SPLIT, OUT_WINDOW } out_kind_t;

struct ncclComm {
  unsigned magic; /* STUB_COMM_MAGIC while the comm lives */
  int id;         /* "cN" in the record */
  int nranks, rank, device, blocking;
  int busy;       /* an operation has not finished */
  int polls_left; /* ncclInProgress answers still to give; -1: forever */
  const char* op; /* the operation in progress, or queued in the open group */
  out_kind_t out;
  void** slot; /* where the operation writes its output */
  int split_color, split_blocking;
  void* window; /* the handle a registration writes */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  int polls, return_in_progress;
  char hang_fn[64];
  int hang_n, hang_seen;
  int peer_k, peer_n, peer_v[16], reduce_seen; /* NCCL_STUB_PEER_MIN */
} cfg;
static char* record;
static size_t record_len, record_cap;
static char last_line[256];
static int last_repeat;
static int violations, live_comms, next_comm_id, next_unique_id;
static char last_error[256];
static _Thread_local int group_depth, group_count;
static _Thread_local ncclComm_t group_comms[STUB_MAX_GROUP];

static void parse_fn(const char* v, char* fn, size_t cap, int* n) {
  fn[0] = '\0';
  *n = 1;
  if (v == NULL) return;
  snprintf(fn, cap, "%s", v);
  char* colon = strchr(fn, ':');
  if (colon != NULL) {
    *colon = '\0';
    *n = atoi(colon + 1);
  }
}

static void read_env(void) {
  const char* v = getenv("NCCL_STUB_POLLS");
  cfg.polls = v != NULL ? atoi(v) : 3;
  v = getenv("NCCL_STUB_RETURN");
  cfg.return_in_progress = v != NULL && strcmp(v, "inprogress") == 0;
  parse_fn(getenv("NCCL_STUB_HANG"), cfg.hang_fn, sizeof cfg.hang_fn, &cfg.hang_n);
  cfg.hang_seen = 0;
  /* "k:v0,v1,...": the values a peer gives the k-th int32 min ncclAllReduce */
  cfg.peer_k = cfg.peer_n = cfg.reduce_seen = 0;
  v = getenv("NCCL_STUB_PEER_MIN");
  char* end = NULL;
  if (v != NULL && (cfg.peer_k = (int)strtol(v, &end, 10)) > 0 && *end == ':')
    for (const char* q = end + 1; cfg.peer_n < 16; q = end + 1) {
      cfg.peer_v[cfg.peer_n++] = (int)strtol(q, &end, 10);
      if (*end != ',') break;
    }
}

__attribute__((constructor)) static void stub_load(void) {
  read_env();
}

static void append(const char* s) {
  size_t n = strlen(s);
  if (record_len + n + 1 > record_cap) {
    size_t cap = record_cap ? record_cap : 4096;
    while (record_len + n + 1 > cap) cap *= 2;
    char* r = realloc(record, cap);
    if (r == NULL) return;
    record = r;
    record_cap = cap;
  }
  memcpy(record + record_len, s, n + 1);
  record_len += n;
}

static void flush_repeat(void) {
  if (last_repeat > 1) {
    char buf[32];
    snprintf(buf, sizeof buf, " x%d", last_repeat);
    record_len--; /* before the newline */
    append(buf);
    append("\n");
  }
  last_repeat = 0;
}

/* One line of the record (mu held); identical consecutive lines fold into "... xN". */
static void note(const char* fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (last_repeat > 0 && strcmp(line, last_line) == 0) {
    last_repeat++;
    return;
  }
  flush_repeat();
  snprintf(last_line, sizeof last_line, "%s", line);
  last_repeat = 1;
  append(line);
  append("\n");
}

static void violation(const char* fmt, ...) {
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  violations++;
  note("VIOLATION: %s", msg);
}

static const char* result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult?";
  }
}

/* Whether the address lies on the calling thread's stack. */
static int on_my_stack(const void* p) {
  pthread_attr_t at;
  void* base = NULL;
  size_t size = 0;
  if (pthread_getattr_np(pthread_self(), &at) != 0) return 0;
  pthread_attr_getstack(&at, &base, &size);
  pthread_attr_destroy(&at);
  return (const char*)p >= (const char*)base && (const char*)p < (const char*)base + size;
}

/* A comm the caller may use (mu held): ncclSuccess, or the refusal NCCL gives. */
static ncclResult_t check_comm(ncclComm_t c, const char* fn) {
  if (c == NULL || c->magic != STUB_COMM_MAGIC) {
    violation("%s on a comm that was destroyed or aborted, or never made", fn);
    return ncclInvalidArgument;
  }
  if (c->busy) {
    snprintf(last_error, sizeof last_error,
             "Attempt to use communicator before the previous operation returned ncclSuccess");
    violation("%s c%d while its %s is in progress: %s", fn, c->id, c->op, last_error);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

static ncclComm_t new_comm(int nranks, int rank, int device, int blocking) {
  ncclComm_t c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->magic = STUB_COMM_MAGIC;
  c->id = ++next_comm_id;
  c->nranks = nranks;
  c->rank = rank;
  c->device = device;
  c->blocking = blocking;
  live_comms++;
  return c;
}

static void free_comm(ncclComm_t c) {
  if (c->window != NULL) cudaFree(c->window);
  c->magic = 0;
  live_comms--;
  free(c);
}

static void begin(ncclComm_t c, const char* op);

/* The operation in progress on c is done (mu held): its output is written. */
static void finish(ncclComm_t c) {
  c->busy = 0;
  if (c->out == OUT_SPLIT) {
    ncclComm_t child = NULL;
    if (c->split_color != NCCL_SPLIT_NOCOLOR) {
      child = new_comm(1, 0, c->device, c->split_blocking);
      if (child != NULL) {
        note("  c%d: child c%d written", c->id, child->id);
        begin(child, "init (split child)");
      }
    }
    *(ncclComm_t*)c->slot = child;
  } else if (c->out == OUT_WINDOW) {
    void* handle = NULL; /* device memory, as NCCL's symmetric windows are */
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(c->device);
    if (cudaMalloc(&handle, 256) != cudaSuccess) handle = NULL;
    cudaSetDevice(prev);
    c->window = handle;
    *(ncclWindow_t*)c->slot = (ncclWindow_t)handle;
  }
  c->out = OUT_NONE;
  c->slot = NULL;
}

/* Starts operation `op` (an NCCL function's name) on c (mu held). */
static void begin(ncclComm_t c, const char* op) {
  c->op = op;
  c->busy = 1;
  const int hang = strcmp(op, cfg.hang_fn) == 0 && ++cfg.hang_seen == cfg.hang_n;
  if (hang && !c->blocking) {
    note("  c%d: %s never finishes (a peer that never comes)", c->id, op);
    c->polls_left = -1;
    return;
  }
  c->polls_left = cfg.polls;
  if (c->blocking || cfg.polls == 0) finish(c);
}

/* What a call that started an operation on c returns (mu held). */
static ncclResult_t started(const ncclComm_t c) {
  return c->busy && cfg.return_in_progress ? ncclInProgress : ncclSuccess;
}

/* An operation call on c: at once, or queued for ncclGroupEnd inside a group (mu held). */
static ncclResult_t operate(ncclComm_t c, const char* op) {
  if (group_depth > 0) {
    c->op = op;
    for (int i = 0; i < group_count; i++)
      if (group_comms[i] == c) return ncclSuccess;
    if (group_count == STUB_MAX_GROUP) return ncclInternalError;
    group_comms[group_count++] = c;
    return ncclSuccess;
  }
  begin(c, op);
  return started(c);
}

/* The call's line: "fn cN[ args] -> result[ (in progress)]" (mu held). */
static ncclResult_t done_note_args(const char* fn, ncclComm_t c, const char* args, ncclResult_t r) {
  note("%s c%d%s -> %s%s", fn, c != NULL ? c->id : 0, args, result_name(r),
       c != NULL && c->magic == STUB_COMM_MAGIC && c->busy ? " (in progress)" : "");
  return r;
}
static ncclResult_t done_note(const char* fn, ncclComm_t c, ncclResult_t r) {
  return done_note_args(fn, c, "", r);
}

/* ---- the control API (nccl_stub.h) ---------------------------------------------------- */
void nccl_stub_reset(void) {
  pthread_mutex_lock(&mu);
  read_env();
  record_len = 0;
  if (record != NULL) record[0] = '\0';
  last_repeat = 0;
  violations = 0;
  pthread_mutex_unlock(&mu);
}
const char* nccl_stub_log(void) {
  pthread_mutex_lock(&mu);
  flush_repeat();
  const char* r = record != NULL ? record : "";
  pthread_mutex_unlock(&mu);
  return r;
}
int nccl_stub_log_has(const char* text) {
  pthread_mutex_lock(&mu);
  flush_repeat();
  const int has = record != NULL && strstr(record, text) != NULL;
  pthread_mutex_unlock(&mu);
  return has;
}
int nccl_stub_violations(void) {
  pthread_mutex_lock(&mu);
  int v = violations;
  pthread_mutex_unlock(&mu);
  return v;
}
int nccl_stub_live_comms(void) {
  pthread_mutex_lock(&mu);
  int v = live_comms;
  pthread_mutex_unlock(&mu);
  return v;
}

/* ---- NCCL ------------------------------------------------------------------------------- */
ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION(2, 28, 9);
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) {
  return result_name(r);
}
const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return last_error;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  pthread_mutex_lock(&mu);
  memset(id, 0, sizeof *id);
  int n = ++next_unique_id;
  memcpy(id->internal, &n, sizeof n);
  note("ncclGetUniqueId");
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  (void)id;
  int dev = 0;
  cudaGetDevice(&dev);
  pthread_mutex_lock(&mu);
  const int blocking =
      config == NULL || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  ncclResult_t r = ncclSuccess;
  ncclComm_t c = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    r = ncclInvalidArgument;
  } else {
    c = new_comm(nranks, rank, dev, blocking);
    if (c == NULL) r = ncclSystemError;
  }
  *comm = c; /* NCCL writes the comm at the call; its init goes on */
  if (c != NULL) r = operate(c, "ncclCommInitRankConfig");
  done_note("ncclCommInitRankConfig", c, r);
  pthread_mutex_unlock(&mu);
  return r;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  pthread_mutex_lock(&mu);
  int in_progress = 0;
  for (int i = 0; i < group_count; i++) {
    begin(group_comms[i], group_comms[i]->op);
    in_progress |= group_comms[i]->busy;
  }
  group_count = 0;
  const ncclResult_t r = in_progress && cfg.return_in_progress ? ncclInProgress : ncclSuccess;
  note("ncclGroupEnd -> %s%s", result_name(r), in_progress ? " (in progress)" : "");
  pthread_mutex_unlock(&mu);
  return r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
  pthread_mutex_lock(&mu);
  if (comm == NULL || comm->magic != STUB_COMM_MAGIC) {
    violation("ncclCommGetAsyncError on a comm that was destroyed or aborted");
    pthread_mutex_unlock(&mu);
    return ncclInvalidArgument;
  }
  if (comm->busy && comm->polls_left > 0)
    comm->polls_left--;
  else if (comm->busy && comm->polls_left == 0)
    finish(comm);
  *async = comm->busy ? ncclInProgress : ncclSuccess;
  note("ncclCommGetAsyncError c%d -> %s", comm->id, result_name(*async));
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

static ncclResult_t query(ncclComm_t comm, const char* fn, int* out, int what) {
  pthread_mutex_lock(&mu);
  ncclResult_t r = check_comm(comm, fn);
  if (r == ncclSuccess) *out = what == 0 ? comm->nranks : what == 1 ? comm->rank : comm->device;
  done_note(fn, comm, r);
  pthread_mutex_unlock(&mu);
  return r;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return query(comm, "ncclCommCount", count, 0);
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return query(comm, "ncclCommUserRank", rank, 1);
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return query(comm, "ncclCommCuDevice", device, 2);
}

/* ncclTeamLsa (nccl_device/core.h, a C++ header): every rank of a stand-in comm is in
   this process, so in one load/store-accessible team. */
struct stub_team {
  int nRanks, rank, stride;
};
struct stub_team ncclTeamLsa(ncclComm_t comm);
struct stub_team ncclTeamLsa(ncclComm_t comm) {
  struct stub_team t = {comm->nranks, comm->rank, 1};
  return t;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  (void)key;
  pthread_mutex_lock(&mu);
  ncclResult_t r = check_comm(comm, "ncclCommSplit");
  if (r == ncclSuccess && comm->nranks != 1) {
    snprintf(last_error, sizeof last_error, "the stand-in splits comms of one rank only");
    r = ncclInvalidUsage;
  }
  if (r == ncclSuccess) {
    *newcomm = NULL; /* the child comes when the parent's part is done */
    if (!comm->blocking && on_my_stack(newcomm))
      violation(
          "ncclCommSplit c%d: *newcomm is on the caller's stack, and NCCL writes it "
          "after the call returns",
          comm->id);
    comm->out = OUT_SPLIT;
    comm->slot = (void**)newcomm;
    comm->split_color = color;
    comm->split_blocking = config == NULL || config->blocking == NCCL_CONFIG_UNDEF_INT
                               ? comm->blocking
                               : config->blocking != 0;
    r = operate(comm, "ncclCommSplit");
  }
  done_note("ncclCommSplit", comm, r);
  pthread_mutex_unlock(&mu);
  return r;
}

/* " int32 min [v0,v1,...]": the values this rank gives an int32 min reduction (the
   library's agreements), which its peers would see; "" for any other. The buffer is the
   stand-in runtime's device memory, which is host memory. */
static void reduce_args(char* out, size_t cap, const void* send, size_t count, ncclDataType_t type,
                        ncclRedOp_t op) {
  out[0] = '\0';
  if (type != ncclInt32 || op != ncclMin) return;
  int32_t v[16];
  const size_t shown = count < 16 ? count : 16;
  memcpy(v, send, shown * sizeof v[0]);
  size_t len = (size_t)snprintf(out, cap, " int32 min [");
  for (size_t i = 0; i < shown && len < cap; i++)
    len += (size_t)snprintf(out + len, cap - len, "%s%d", i ? "," : "", (int)v[i]);
  if (len < cap) snprintf(out + len, cap - len, "%s]", count > shown ? ",..." : "");
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  (void)stream;
  char args[160] = "";
  pthread_mutex_lock(&mu);
  ncclResult_t r = check_comm(comm, "ncclAllReduce");
  if (r == ncclSuccess && comm->nranks != 1) {
    snprintf(last_error, sizeof last_error, "the stand-in reduces over comms of one rank only");
    r = ncclInvalidUsage;
  }
  if (r == ncclSuccess) {
    reduce_args(args, sizeof args, send, count, type, op);
    const size_t elem = type == ncclInt32 || type == ncclFloat32 ? 4 : 1;
    if (send != recv) memmove(recv, send, count * elem); /* the min/sum of one rank */
    if (type == ncclInt32 && op == ncclMin && ++cfg.reduce_seen == cfg.peer_k)
      for (size_t i = 0; i < count && i < (size_t)cfg.peer_n; i++) /* and a peer's */
        if (cfg.peer_v[i] < ((int32_t*)recv)[i]) ((int32_t*)recv)[i] = cfg.peer_v[i];
    r = operate(comm, "ncclAllReduce");
  }
  done_note_args("ncclAllReduce", comm, args, r);
  pthread_mutex_unlock(&mu);
  return r;
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  char args[64] = "";
  pthread_mutex_lock(&mu);
  ncclResult_t r = check_comm(comm, "ncclAllGather");
  if (r == ncclSuccess) {
    const size_t bytes = count * (type == ncclUint8 || type == ncclInt8 ? 1 : 4);
    snprintf(args, sizeof args, " %zu bytes", bytes);
    memmove((char*)recv + (size_t)comm->rank * bytes, send, bytes); /* this rank's part */
    r = operate(comm, "ncclAllGather");
  }
  done_note_args("ncclAllGather", comm, args, r);
  pthread_mutex_unlock(&mu);
  /* queued on its stream: what is recorded there after it waits for it (a stuck one:
     cudart_stub_set_collectives_stuck) */
  if (r == ncclSuccess || r == ncclInProgress) cudart_stub_collective(stream);
  return r;
}

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  ncclResult_t r = cudaMalloc(ptr, size) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
  pthread_mutex_lock(&mu);
  note("ncclMemAlloc -> %s", result_name(r));
  pthread_mutex_unlock(&mu);
  return r;
}
ncclResult_t ncclMemFree(void* ptr) {
  ncclResult_t r = cudaFree(ptr) == cudaSuccess ? ncclSuccess : ncclInvalidArgument;
  pthread_mutex_lock(&mu);
  note("ncclMemFree -> %s", result_name(r));
  pthread_mutex_unlock(&mu);
  return r;
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int flags) {
  (void)buff, (void)size, (void)flags;
  pthread_mutex_lock(&mu);
  ncclResult_t r = check_comm(comm, "ncclCommWindowRegister");
  if (r == ncclSuccess && comm->window != NULL) r = ncclInvalidUsage; /* one window a comm */
  if (r == ncclSuccess) {
    *win = NULL;
    if (!comm->blocking && on_my_stack(win))
      violation(
          "ncclCommWindowRegister c%d: *win is on the caller's stack, and NCCL writes "
          "it after the call returns",
          comm->id);
    comm->out = OUT_WINDOW;
    comm->slot = (void**)win;
    r = operate(comm, "ncclCommWindowRegister");
  }
  done_note("ncclCommWindowRegister", comm, r);
  pthread_mutex_unlock(&mu);
  return r;
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  pthread_mutex_lock(&mu);
  ncclResult_t r = check_comm(comm, "ncclCommWindowDeregister");
  if (r == ncclSuccess && (win == NULL || (void*)win != comm->window)) {
    violation("ncclCommWindowDeregister c%d of a window it did not register", comm->id);
    r = ncclInvalidArgument;
  }
  if (r == ncclSuccess) {
    if (cudart_stub_in_flight(comm->device) > 0)
      violation("ncclCommWindowDeregister c%d while a cooperative kernel launched on device %d "
                "may still write through the window",
                comm->id, comm->device);
    cudaFree(comm->window);
    comm->window = NULL;
    r = operate(comm, "ncclCommWindowDeregister");
  }
  done_note("ncclCommWindowDeregister", comm, r);
  pthread_mutex_unlock(&mu);
  return r;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  pthread_mutex_lock(&mu);
  ncclResult_t r = check_comm(comm, "ncclCommFinalize");
  if (r == ncclSuccess) r = operate(comm, "ncclCommFinalize");
  done_note("ncclCommFinalize", comm, r);
  pthread_mutex_unlock(&mu);
  return r;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  pthread_mutex_lock(&mu);
  ncclResult_t r = check_comm(comm, "ncclCommDestroy");
  const int id = comm != NULL && comm->magic == STUB_COMM_MAGIC ? comm->id : 0;
  if (r != ncclInvalidArgument) { /* refused: in progress, or not a comm */
    free_comm(comm);
    r = ncclSuccess;
  }
  note("ncclCommDestroy c%d -> %s", id, result_name(r));
  pthread_mutex_unlock(&mu);
  return r;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  /* NCCL's abort frees the comm's device memory, a call CUDA refuses outside relaxed mode
     while another thread captures a graph (cudart_stub_set_foreign_capture) */
  int dev = -1;
  if (comm != NULL) {
    pthread_mutex_lock(&mu);
    if (comm->magic == STUB_COMM_MAGIC) dev = comm->device;
    pthread_mutex_unlock(&mu);
  }
  if (comm != NULL) {
    /* on the comm's device, the caller's made current again after, as NCCL's does (on a
       thread that never set one: cudaSetDevice(0), device 0's context on CUDA) */
    int saved = 0;
    cudaGetDevice(&saved);
    if (dev >= 0 && saved != dev) cudaSetDevice(dev);
    (void)cudaFree(NULL);
    cudart_stub_abort_gate(); /* (that memory's free waits for the device) */
    if (dev >= 0 && saved != dev) cudaSetDevice(saved);
  }
  pthread_mutex_lock(&mu);
  ncclResult_t r = ncclSuccess;
  int id = 0;
  if (comm == NULL) {
    r = ncclSuccess; /* NCCL accepts NULL */
  } else if (comm->magic != STUB_COMM_MAGIC) {
    violation("ncclCommAbort on a comm that was destroyed or aborted");
    r = ncclInvalidArgument;
  } else {
    id = comm->id;
    if (comm->window != NULL && cudart_stub_in_flight(comm->device) > 0)
      violation("ncclCommAbort c%d unmaps its window while a cooperative kernel launched on "
                "device %d may still write through it",
                id, comm->device);
    free_comm(comm); /* an operation in progress writes nothing any more */
  }
  note("ncclCommAbort c%d -> %s", id, result_name(r));
  pthread_mutex_unlock(&mu);
  return r;
}
