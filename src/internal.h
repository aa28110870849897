/* internal.h — the core of the library: the types every layer shares (teams, comms, ops,
 * the team-ops table a backend implements) and the core's functions (diagnostics,
 * configuration, team lifecycle). The front (comm.c, ops.c, group.c) calls the backends
 * through the table; the backends (cpu/, gpu/) include this and never the front.
 */
#ifndef SYNCBN_INTERNAL_H_
#define SYNCBN_INTERNAL_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "bn_op.h"
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

/* Records msg as comm's detail (NULL: the thread's slot) without logging it: a detail
   already logged when it was first recorded, carried to where the caller reads it. */
SBN_INTERNAL void sbn_note(sbnComm_t comm, const char* msg);
/* sbnGetLastError's text, for the library's own use: into a buffer of the thread's other
   than the one sbnGetLastError returns, which stays as the caller last read it (valid
   until the caller's next sbnGetLastError). Valid until this thread's next call. */
SBN_INTERNAL const char* sbn_error_text(sbnComm_t comm);

/* ---- configuration (config.c) -------------------------------------------------------- */
typedef struct {
  int64_t timeout_ms;
  int64_t max_channels;
} sbn_cfg_t;

/* pthread_cond_init on CLOCK_MONOTONIC, the clock of the library's waits (a step of the
   wall clock neither ends a wait early nor stretches it): 1, or 0 with cv not made
   (team.c). */
SBN_INTERNAL int sbn_cond_init_monotonic(pthread_cond_t* cv);
/* A decimal integer in [lo, hi] from an environment variable's text v, into *out: digits
   only, nothing around them (no sign, no whitespace: " 400" and "400 " are refused alike,
   where strtoll took the first and not the second). 1 if so, 0 otherwise. */
SBN_INTERNAL int sbn_env_int(const char* v, long long lo, long long hi, long long* out);
/* The team's settings from `in` (NULL: the defaults) and SBN_TIMEOUT_MS; a refusal's
   detail names `fn`, the init called. */
SBN_INTERNAL sbnResult_t sbn_config_resolve(const char* fn, const sbnConfig_t* in, sbn_cfg_t* out);

/* ---- ops ------------------------------------------------------------------------------ */
/* SBN_OP_FORWARD, SBN_OP_BACKWARD (kernels/bn_op.h), or a split queued in a group. */
enum { SBN_OP_SPLIT = SBN_OP_KINDS };
typedef int sbn_op_kind_t;

/* The arguments of one op, validated, as queued in a group or run at once. */
typedef struct {
  sbn_op_kind_t kind;
  sbnComm_t comm;
  const char* fn;      /* the entry point, for messages ("sbnForwardTrainEx", ...; set at
                          the call: NULL in ops the library makes itself) */
  uint32_t call;       /* the rank's call number (comm->calls at the call), in the op's
                          signature (sbn_op_signature) */
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
  /* the epilogue (sbnForwardTrainEx / sbnBackwardEx; zero for the plain ops) */
  const void* z;       /* forward: the residual, or NULL */
  const void* y;       /* backward: the forward's output (the activation's mask), or NULL */
  void* dz;            /* backward: the residual's gradient, or NULL */
  int act;             /* SBN_ACT_* (kernels/bn_math.h) */
  float slope;         /* leaky ReLU's */
  int no_residual;     /* sbnEpilogue_t's: the backward may take the mask from x */
  sbnStream_t stream;  /* GPU teams */
  int algo;            /* set by the backend's prepare: how the op runs (GPU teams: SBN_ALGO_*) */
  int kernel;          /* set by the backend's prepare (GPU teams: SBN_KERNEL_*) */
  int sm_margin;       /* set by the backend's prepare (GPU teams: SBN_SM_MARGIN, the SMs
                          the grid leaves free; -1: unset, the team's default) */
  int color, key;      /* split */
  sbnComm_t* newcomm;  /* split */
} sbn_op_t;

/* Whether the op runs the epilogue: an activation, a residual (forward: z; backward: dz),
   or the in-place backward (x NULL, x recovered from y). */
static inline int sbn_op_uses_epilogue(const sbn_op_t* op) {
  return op->act != 0 || op->z != NULL || op->dz != NULL ||
         (op->kind == SBN_OP_BACKWARD && op->x == NULL && op->y != NULL);
}

/* The op's signature (kernels/bn_op.h), and its description for messages, e.g.
   "forward fp32 NCHW C=64" (ops.c). */
SBN_INTERNAL uint32_t sbn_op_signature(const sbn_op_t* op);
SBN_INTERNAL const char* sbn_sig_describe(uint32_t sig, char* buf, size_t n);
/* The message of an op mismatch between rank ra running sig a and rank rb running b:
   their two ops, or where the ops differ only in the call number, that the ranks are
   out of step. */
SBN_INTERNAL const char* sbn_sig_mismatch(int ra, uint32_t a, int rb, uint32_t b, char* buf, size_t n);
/* "sbnForwardTrain" or "sbnBackward". */
SBN_INTERNAL const char* sbn_op_name(sbn_op_kind_t kind);
/* The entry point an op came from, for messages ("sbnBackwardInPlaceEx"); its kind's name
   where it has none. */
static inline const char* sbn_op_fn(const sbn_op_t* op) {
  return op->fn != NULL ? op->fn : sbn_op_name(op->kind);
}

/* ---- teams and comms ------------------------------------------------------------------- */
struct sbn_team_ops;

/* What a backend's attach gets besides the team. */
typedef struct {
  const int* devices;    /* in-process GPU teams: rank r's device (a virtual team: [0]) */
  struct ncclComm* nccl; /* NCCL teams: the comm the team is made from; with `adopt`, the
                            team takes it as its own and attach sets nccl = NULL (what
                            the caller still holds after a failure is the caller's) */
  int adopt;
  const _Atomic int* stop; /* teams made by sbnCommSplit: the parent team's abort word, which
                              ends the init's waits (sbnCommAbort of the parent; an
                              in-process GPU team's: its zeroing's) */
} sbn_team_init_t;

/* State shared by every rank of a team. */
typedef struct sbn_team {
  const struct sbn_team_ops* ops; /* the backend */
  void* impl;                     /* the backend's state: attach makes it, detach frees it */
  int nranks;
  int first_local, nlocal; /* the ranks whose comms live in this process */
  sbn_cfg_t cfg;
  _Atomic int abort_reason; /* sbnSuccess, or sbnTimeout / sbnAborted / ... */
  _Atomic int refs;         /* local ranks not yet destroyed */
  /* sbnCommAbort calls still running (sbn_team_abort_waiting): the waiting call they end
     returns at once, and its comm may then be destroyed; the team is freed only after them */
  _Atomic int aborting;
  /* Threaded teams (ops->threaded): the rank whose sbnCommDestroy aborted the team while
     other local ranks lived; other teams of several local ranks: the first rank destroyed
     (no abort); -1 when none (sbn_comm_release; sbn_team_departed) */
  _Atomic int departed;
  /* sbnCommSplit driven one thread per rank: the local ranks meet here (team.c) */
  pthread_mutex_t split_mu;
  pthread_cond_t split_cv;
  uint64_t split_gen;
  int split_arrived;
  int* split_color; /* [nlocal] */
  int* split_key;
  unsigned char* split_here; /* [nlocal]: 1 once local rank i called in this round */
  sbnComm_t* split_result;
  sbnResult_t split_status;
  char split_detail[512]; /* why the round's split failed (the splitting thread's detail) */
} sbn_team_t;

#define SBN_COMM_MAGIC 0x53424e43u /* "SBNC" */

struct sbnComm {
  unsigned magic;
  sbn_team_t* team;
  int rank;  /* in the team */
  int local; /* rank - team->first_local: its index among this process's ranks */
  pthread_mutex_t err_mu;
  char last_error[512];
  _Atomic(const char*) kernel; /* sbnCommGetKernel: what ran this rank's latest op */
  /* the thread whose call, or whose open group, holds the comm (0: none): a comm's calls
     must not overlap (sbn_comm_claim, front.h) */
  _Atomic(uintptr_t) user;
  /* The op calls (forward and backward) this rank has made, counted by the thread that
     holds the comm (sbn_comm_claim): the ranks of a team count alike while they make the
     same calls, and a call refused on some ranks only sets them apart (kernels/bn_op.h,
     sbn_sig_with_call). A call counts at once, refused at its arguments or not; but in
     a group of a team whose ranks all live here (sbn_team_all_local), which holds every
     rank's calls and runs all or nothing, only the ops it queued count, when it runs
     (group.c): a group that runs nothing leaves the team as it was. */
  uint32_t calls; /* mod SBN_SIG_CALLS (the signature keeps no more) */
  uint32_t pending; /* the ops queued in the open group that are counted when it runs */
};

/* Whether every rank of the team lives in this process (its groups hold all its ranks). */
static inline int sbn_team_all_local(const struct sbn_team* t) { return t->nlocal == t->nranks; }

/* Whether comm is a comm, as far as a magic word can tell (NULL is not); the rule of where a
   failure's detail goes: a valid comm's own slot, else the thread's. */
static inline int sbn_comm_valid(sbnComm_t comm) { return comm != NULL && comm->magic == SBN_COMM_MAGIC; }

/* The team-ops table: what a backend (a kind of team) does. The front calls these and
   nothing else of a backend; a backend calls the core, never the front. Entries marked
   "may be NULL" are skipped when absent. */
typedef struct sbn_team_ops {
  const char* name; /* for logs: "cpu", "gpu-virtual", "gpu-peer", "nccl" */
  /* 1: an op blocks its thread until the team meets, so a group runs each local rank's
     queue on a thread of its own; 0: ops are issued asynchronously, and a group issues
     them round by round (round i: the i-th op of every local rank) from its thread. */
  int threaded;
  /* 1: runs the epilogue of sbnForwardTrainEx / sbnBackwardEx (an activation other than
     identity, a residual z / dz, the in-place backward from y); 0: those ops are
     refused with sbnUnsupported at the call. */
  int epilogue;
  /* Makes team->impl (team->nranks, first_local, nlocal and cfg are set). On failure
     team->impl stays NULL and nothing is left allocated. The last step of sbn_team_create
     that can fail (the comms are made before it), so that a collective attach's success
     is the team's on every rank. */
  sbnResult_t (*attach)(sbn_team_t* team, sbn_team_init_t* init);
  /* Frees team->impl (the last local comm was destroyed). sbnSuccess, or sbnTimeout with
     the detail on the thread (sbn_fail(NULL, ...)): the backend's devices did not finish
     their work in time, and what is left of team->impl is freed later, when they do (a GPU
     team's release thread). team->impl is NULL afterwards either way. */
  sbnResult_t (*detach)(sbn_team_t* team);
  /* At the call, after the front's argument checks: the backend's own checks of the op
     and its per-call choices (op->algo, op->kernel). in_group: inside sbnGroupStart/End.
     May be NULL. */
  sbnResult_t (*prepare)(sbn_op_t* op, int in_group);
  /* Before anything runs: whether a round of n ops (one per local rank, in local order,
     or one op outside a group) can run. May be NULL. */
  sbnResult_t (*check)(const sbn_op_t* const* round, int n);
  /* Runs a round (threaded backends: n == 1, blocking until the team meets). On failure
     *failed is the index of the op that failed, and the detail is on its comm. */
  sbnResult_t (*run)(const sbn_op_t* const* round, int n, int* failed);
  /* A failure the backend recorded asynchronously (e.g. a kernel's), never blocking:
     sbnSuccess or the failure. May be NULL. */
  sbnResult_t (*poll)(const sbn_team_t* team);
  /* sbnCommAbort, after the core marked the team aborted: make waiting work return.
     May be NULL. */
  void (*abort)(sbn_team_t* team);
  /* Split by color and key: one entry per local rank (local order); result[i] is local
     rank i's new comm or NULL (SBN_SPLIT_NOCOLOR). Collective over the team. */
  sbnResult_t (*split)(sbn_team_t* team, const int* color, const int* key, sbnComm_t* result);
  /* sbnCommGetTransport's name: how the team's ranks exchange. */
  const char* (*transport)(const sbn_team_t* team);
} sbn_team_ops_t;

/* team.c: the life of teams and comms. */
/* A team of nranks of which [first_local, first_local + nlocal) live here; comms[i] is
   local rank i's comm. All or nothing. */
SBN_INTERNAL sbnResult_t sbn_team_create(const sbn_team_ops_t* ops, int nranks, int first_local,
                                        int nlocal, const sbn_cfg_t* cfg, sbn_team_init_t* init,
                                        sbnComm_t* comms);
/* Destroys one comm; the last of a team frees the team (detach). In a threaded team
   (ops->threaded == 1: ops are synchronous, so the destroyed rank has no op in flight)
   with other local ranks still alive, it first records the rank (team->departed) and
   aborts the team with sbnAborted: the peers' waits return at once and name it. Teams
   whose ops run asynchronously (GPU, NCCL) are not aborted: a peer's kernel may still
   be finishing an op that the destroyed rank took part in; those with several local
   ranks record the rank too and wake the ranks waiting in a thread-per-rank split, which
   fail (sbn_split_rendezvous). Returns the detach's result where this was the team's last
   comm (sbnTimeout, detail on the thread: see detach), else sbnSuccess. */
SBN_INTERNAL sbnResult_t sbn_comm_release(sbnComm_t comm);
/* The rank whose sbnCommDestroy aborted a threaded team (a destroy racing sbnCommAbort
   may be named too: both happened), or -1 (the team is not aborted with sbnAborted, was
   aborted before any rank left, or is not threaded: its destroys abort nothing). */
SBN_INTERNAL int sbn_team_departed(const sbn_team_t* team);
/* Validates a comm handle; on failure records the detail on the thread slot. */
SBN_INTERNAL sbnResult_t sbn_comm_check(sbnComm_t comm, const char* fn);
/* sbnAborted with a message when the team was aborted (or its backend reports a failure:
   the team is aborted then), else sbnSuccess. */
SBN_INTERNAL sbnResult_t sbn_comm_check_alive(sbnComm_t comm);
/* Asks the backend for a failure it recorded asynchronously; the first seen aborts the
   team (never blocks). */
SBN_INTERNAL void sbn_team_poll(sbn_team_t* team);
/* Marks the team aborted with `reason` (first reason wins); wakes a waiting split. */
SBN_INTERNAL void sbn_team_abort(sbn_team_t* team, sbnResult_t reason);
/* sbnCommAbort's abort: sbn_team_abort(team, sbnAborted), then the backend's abort hook
   (when it has one), so that work already waiting returns at once. */
SBN_INTERNAL void sbn_team_abort_waiting(sbn_team_t* team);
/* The split of a team whose ranks all live here: sub-teams of the same backend, ranks
   ordered by (key, parent rank); rank_devices[r] (NULL: none) is parent rank r's device,
   handed to the sub-teams' attach. All or nothing. */
SBN_INTERNAL sbnResult_t sbn_split_in_process(sbn_team_t* parent, const int* color, const int* key,
                                             const int* rank_devices, sbnComm_t* result);
/* sbnCommSplit outside a group: the team's local ranks meet (one thread each), the last
   to arrive runs the backend's split for all; bounded by the timeout. */
SBN_INTERNAL sbnResult_t sbn_split_rendezvous(sbnComm_t comm, int color, int key,
                                             sbnComm_t* newcomm);

/* ---- memory kind (memkind.c) ------------------------------------------------------- */
typedef enum { SBN_MEM_HOST = 0, SBN_MEM_DEVICE = 1 } sbn_mem_kind_t;
SBN_INTERNAL sbn_mem_kind_t sbn_pointer_kind(const void* p);

#endif /* SYNCBN_INTERNAL_H_ */
