/* internal.h — the library's private types and helpers shared by src/ files. */
#ifndef SYNCBN_INTERNAL_H_
#define SYNCBN_INTERNAL_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "syncbn.h"

#define SBN_INTERNAL __attribute__((visibility("hidden")))

/* ---- diagnostics (diag.c) ---------------------------------------------------------- */
enum { SBN_LOG_NONE = 0, SBN_LOG_WARN = 1, SBN_LOG_INFO = 2 };
SBN_INTERNAL int sbn_log_level(void);
SBN_INTERNAL void sbn_log(int level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records the detail of a failure on comm (NULL: the calling thread's no-comm slot),
   logs it at WARN, and returns r so callers can `return sbn_fail(...)`. */
SBN_INTERNAL sbnResult_t sbn_fail(sbnComm_t comm, sbnResult_t r, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- comms and teams --------------------------------------------------------------- */
typedef enum {
  SBN_COMM_CPU = 1,         /* ranks are host threads, data in host memory */
  SBN_COMM_GPU_VIRTUAL = 2, /* W ranks on one GPU: one cooperative launch per op for all */
  SBN_COMM_GPU_PEER = 3,    /* a rank per listed GPU (a GPU may be listed more than once) */
  SBN_COMM_GPU_NCCL = 4     /* one rank of a team of processes (an NCCL communicator): only
                               that rank lives in this process */
} sbn_comm_kind_t;

struct sbn_gpu_team; /* src/gpu/gpu_team.c */

/* Resolved configuration of a team. */
typedef struct {
  int64_t timeout_ms;
  int64_t max_channels;
} sbn_cfg_t;

SBN_INTERNAL sbnResult_t sbn_config_resolve(const sbnConfig_t* in, sbn_cfg_t* out);

/* One mailbox slot: what rank `src` published for the op whose epoch has parity p
   (double buffering: a rank can only overwrite parity p at op k+2 after every rank has
   published op k+1, which each does only after it finished reading op k). The payload is
   written first, then `epoch` with release; readers acquire `epoch`, then read the rest. */
typedef struct {
  _Atomic uint64_t epoch;
  int64_t count;   /* n * spatial of the publishing rank */
  uint32_t op;     /* op signature: kind, dtype, layout (see sbn_op_signature) */
  int64_t c;       /* channels of the op */
  float* payload;  /* SBN_PAYLOAD_FLOATS * max_channels: fwd (mean_hi, mean_lo, m2),
                      bwd (sum_dy, sum_dy_xmu) per channel */
} sbn_mailbox_t;

/* Floats per channel in a mailbox and in a rank's partials (the forward's is largest). */
#define SBN_PAYLOAD_FLOATS 3

/* State shared by every rank of a team. */
typedef struct sbn_team {
  sbn_comm_kind_t kind;
  int nranks;
  sbn_cfg_t cfg;
  struct sbn_gpu_team* gpu; /* GPU teams: device resources (NULL for CPU teams) */
  int local_rank;           /* NCCL teams: the one rank in this process; else -1 (all) */
  _Atomic int abort_reason; /* sbnSuccess, or sbnTimeout / sbnAborted */
  _Atomic int refs;         /* ranks not yet destroyed */
  sbn_mailbox_t* mail;      /* [src][parity] */
  float* payload_store;
  /* rendezvous for sbnCommSplit driven one thread per rank */
  pthread_mutex_t split_mu;
  pthread_cond_t split_cv;
  uint64_t split_gen;
  int split_arrived;
  int* split_color;
  int* split_key;
  sbnComm_t* split_result;
  sbnResult_t split_status;
} sbn_team_t;

#define SBN_WS_STATS_FLOATS 5
#define SBN_COMM_MAGIC 0x53424e43u /* "SBNC" */

struct sbnComm {
  unsigned magic;
  sbn_team_t* team;
  int rank;
  uint64_t epoch; /* ops this rank has exchanged; the next op uses epoch + 1 */
  /* per-rank workspace sized at init from max_channels */
  float* ws_local;  /* SBN_PAYLOAD_FLOATS * max_channels: this rank's partials */
  float* ws_stats;  /* SBN_WS_STATS_FLOATS * max_channels: per-channel results */
  pthread_mutex_t err_mu;
  char last_error[512];
  _Atomic(const char*) kernel; /* sbnCommGetKernel: what ran this rank's latest op */
};

/* The team's ranks held by this process (NCCL teams: one), and a comm's index among them:
   groups queue and check ops per local rank. */
static inline int sbn_team_local_count(const sbn_team_t* t) {
  return t->kind == SBN_COMM_GPU_NCCL ? 1 : t->nranks;
}
static inline int sbn_comm_local_index(const struct sbnComm* c) {
  return c->team->kind == SBN_COMM_GPU_NCCL ? 0 : c->rank;
}

/* NCCL teams: a comm for this process's rank of the NCCL comm `nccl` (adopt: the team takes
   `nccl` as its own; otherwise it makes its own duplicate). comm.c. */
SBN_INTERNAL sbnResult_t sbn_comm_create_nccl(struct ncclComm* nccl, int adopt,
                                             const sbn_cfg_t* cfg, sbnComm_t* out);

/* Validates a comm handle; on failure records the detail on the thread slot. */
SBN_INTERNAL sbnResult_t sbn_comm_check(sbnComm_t comm);
/* sbnAborted with a message when the team was aborted, else sbnSuccess. */
SBN_INTERNAL sbnResult_t sbn_comm_check_alive(sbnComm_t comm);
/* Marks the team aborted with `reason` (first reason wins). */
SBN_INTERNAL void sbn_team_abort(sbn_team_t* team, sbnResult_t reason);

/* Builds the sub-teams of a split from every parent rank's (color, key); result[r] is
   parent rank r's new comm or NULL. All-or-nothing. */
SBN_INTERNAL sbnResult_t sbn_split_build(sbn_team_t* parent, const int* color, const int* key,
                                         sbnComm_t* result);

/* ---- operations -------------------------------------------------------------------- */
typedef enum { SBN_OP_FORWARD = 1, SBN_OP_BACKWARD = 2, SBN_OP_SPLIT = 3 } sbn_op_kind_t;

/* The arguments of one op, validated, as queued in a group or run at once. */
typedef struct {
  sbn_op_kind_t kind;
  sbnComm_t comm;
  sbnTensorDesc_t desc;
  sbnParams_t params;
  const void* x;
  const void* dy;
  void* out;           /* y (forward) or dx (backward) */
  const float* weight;
  const float* bias;
  float* running_mean;
  float* running_var;
  int64_t* num_batches_tracked;
  float* save_mean;    /* forward: output; backward: input */
  float* save_invstd;
  float* dweight;
  float* dbias;
  sbnStream_t stream;  /* GPU teams */
  int algo;            /* GPU teams: SBN_ALGO_COOP or SBN_ALGO_HOST (SBN_ALGO at the call) */
  int kernel;          /* GPU teams: SBN_KERNEL_* (kernels/coop_plan.h; SBN_KERNEL at the call) */
  int color, key;      /* split */
  sbnComm_t* newcomm;  /* split */
} sbn_op_t;

/* How a GPU team runs an op, chosen per call by the environment variable SBN_ALGO:
   "coop" (default: one cooperative kernel) or "nccl" (the host-driven path: stats,
   collective, apply, as PyTorch does). */
enum { SBN_ALGO_COOP = 0, SBN_ALGO_HOST = 1 };
/* SBN_ALGO_COOP or SBN_ALGO_HOST, or -1 (an unknown value; the detail is recorded). */
SBN_INTERNAL int sbn_algo_from_env(sbnComm_t comm);
/* The cooperative kernel's variant a GPU team's call asks for, from SBN_KERNEL:
   "auto" (default), "onchip", "stream", "legacy" (SBN_KERNEL_* of kernels/coop_plan.h),
   or -1 (an unknown value; the detail is recorded). */
SBN_INTERNAL int sbn_kernel_from_env(sbnComm_t comm);

SBN_INTERNAL uint32_t sbn_op_signature(const sbn_op_t* op);
/* Runs one validated op on the calling thread (CPU team: blocks until the team meets). */
SBN_INTERNAL sbnResult_t sbn_op_run(const sbn_op_t* op);

/* groups (group.c) */
SBN_INTERNAL int sbn_group_active(void);
SBN_INTERNAL sbnResult_t sbn_group_enqueue(const sbn_op_t* op);
/* Records that a call inside the current group failed (sbnGroupEnd then runs nothing). */
SBN_INTERNAL void sbn_group_mark_failed(sbnResult_t r);
/* Whether comm has ops queued in this thread's open group. */
SBN_INTERNAL int sbn_group_has_comm(sbnComm_t comm);

/* ---- memory kind (memkind.c) ------------------------------------------------------- */
typedef enum { SBN_MEM_HOST = 0, SBN_MEM_DEVICE = 1 } sbn_mem_kind_t;
SBN_INTERNAL sbn_mem_kind_t sbn_pointer_kind(const void* p);

#endif /* SYNCBN_INTERNAL_H_ */
