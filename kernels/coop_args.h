/* coop_args.h — what the host passes to the cooperative kernels (kernels/coop.cu), and
 * the layout of the mailboxes they exchange through. Plain C: included by the host code
 * in src/gpu/ (a C compiler) and by the kernels (nvcc).
 *
 * One launch runs `nlaunch` ranks of a team of `nranks`: all of them for a virtual team
 * (blocks [r*G, (r+1)*G) are launch slot r), one for a team with a rank per GPU.
 */
#ifndef SYNCBN_COOP_ARGS_H_
#define SYNCBN_COOP_ARGS_H_

#include <stdint.h>

#include "bn_mailbox.h" /* the records: sbn_mail_rec_t, sbn_mail_index */
#include "bn_op.h"      /* SBN_OP_FORWARD, SBN_OP_BACKWARD: the kernels' KIND */
#include "syncbn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SBN_GPU_MAX_RANKS SBN_MAX_GPU_TEAM_RANKS /* kernel parameters are sized by it */
#define SBN_GPU_THREADS 256    /* threads per block of every cooperative kernel */
#define SBN_GPU_CHUNK SBN_MAIL_CHUNK           /* channels per mailbox record */
#define SBN_GPU_REC_FLOATS SBN_MAIL_REC_FLOATS /* floats per channel in a record */

#ifdef __CUDACC__
#define SBN_ARGS_HD __host__ __device__ __forceinline__
#else
#define SBN_ARGS_HD inline
#endif

/* A waiting rank's watcher block reads the team's error words (host memory) at most
   once per 20 us: a read of host memory takes about a microsecond and such reads are
   served one at a time, so a watcher that waits spends at most ~5 % of its time on them,
   and notices a failure that reaches it no other way within ~21 us. */
#define SBN_HOST_POLL_NS 20000
/* Where every failure and abort also reaches the kernels through the stop words (every
   transport but peer-pinned-host), the error words are only a fallback (an abort whose
   copy could not be made): once per millisecond. */
#define SBN_HOST_POLL_FALLBACK_NS 1000000

/* Per-rank persistent device state (in the rank's device memory, zeroed at init). */
typedef struct {
  uint32_t epoch;   /* ops this rank has run; the kernel advances it */
  uint32_t barrier; /* the rank-local barrier's arrival counter (and the solo ops'
                       arrivals: coop_exchange.cuh) */
  int64_t nbt_snap; /* host path: num_batches_tracked as the op found it (its stats kernel
                       copies it, its apply kernel reads it and writes nbt + 1) */
  uint32_t stop;    /* != 0: this rank's kernels publish nothing, write nothing and stop
                       waiting (the sbnResult_t that stopped it). Written by the rank's own
                       kernel when it fails (and, in a launch of several ranks, into each
                       of them), and by the host's abort (an asynchronous copy on a stream
                       of the rank's own, gpu_team.c: sbn_gpu_stop_ranks). Device memory:
                       the kernels read it at their start and while they wait, never a
                       word of host memory on the success path (DESIGN.md, "Failures") */
  uint32_t pad;     /* zero; the counter of the test mutant SBN_MUT_SECOND_BARRIER's extra
                       barrier (coop_kernel.cuh), which must not touch `barrier` */
} sbn_rank_state_t;

/* One rank's part of a launch. */
typedef struct {
  const void* x;
  const void* dy;
  void* out; /* y or dx (may be NULL in backward) */
  const float* weight;
  const float* bias;
  float* running_mean;
  float* running_var;
  int64_t* nbt;
  const float* save_mean_in; /* backward */
  float* save_mean;          /* forward outputs */
  float* save_invstd;        /* forward output, backward input (read) */
  float* dweight;
  float* dbias;
  int64_t n;
  int64_t spatial;
  sbn_rank_state_t* state;
  float* part;           /* partials workspace: SBN_GPU_PART_FLOATS floats per (slice,
                            channel) entry (coop_plan.h) */
  sbn_mail_rec_t* mail;  /* coop: this rank's own mailbox (it reads here); host path: the
                            records of every rank gathered for this rank, [src][chunk] */
  sbn_mail_rec_t* send;  /* host path: this rank's outgoing records [chunk] */
  int rank;              /* in the team */
  float eps;
  float momentum;
  int grad_global;
  /* the epilogue (sbnForwardTrainEx / sbnBackwardEx), read only by the kernels built with
     it (sbn_args_epilogue): act (SBN_ACT_*: bn_math.h) and its slope; forward: y =
     act(bn(x) + z), z NULL for none; backward: the gradient reaching the normalization
     is act'(y) dy (y the forward's output), written to dz when dz is non-NULL, and
     `recover`: x is NULL and x - mean comes from y (the in-place backward: `x` above
     then points at y, which is what the kernels read in its place) */
  const void* z;
  const void* y;
  void* dz;
  int act;
  float slope;
  int recover;
  /* dz may be written in stage 1, before the exchange (coop_vec.cuh: dz_first): dz is
     non-NULL and the round holds an op of every rank of the team, which the host
     compared (gpu_launch.c: sbn_gpu_check), so no kernel can find an op mismatch in
     stage 4, which writes nothing. (A timeout or an abort after stage 1 may leave dz
     written: with the values a successful op writes, which depend on no other rank.) */
  int dz_early;
  /* the backward's activation mask from x where sbn_xmask_sign is sure, y read only where
     it is not (sbnEpilogue_t.no_residual: the forward had no z; an activation, x and y
     given, no dz; gpu_launch.c). The stream, onchip, unit and host-path kernels take it
     (coop_vec.cuh: load_y; the 16-byte tile kernels' coefficients in Smem.xm); the small
     kernel reads y, the same bits. */
  int xmask;
} sbn_coop_rank_t;

typedef struct {
  sbn_coop_rank_t r[SBN_GPU_MAX_RANKS]; /* launch slots 0..nlaunch-1 */
  sbn_mail_rec_t* mail[SBN_GPU_MAX_RANKS]; /* coop: every team rank's mailbox, as seen by
                                              this device; host path: every rank's `send` */
  volatile int* err; /* nranks + 1 words in mapped host memory: err[rank] written by that
                        rank's kernels, err[nranks] by the host (sbnCommAbort). The kernels
                        write them when they fail, and read them only through a waiting
                        rank's watcher block, rate-limited (coop_exchange.cuh) */
  uint32_t* stop[SBN_GPU_MAX_RANKS]; /* stop[0..nstop): the stop words (sbn_rank_state_t)
                        of the team's ranks that this device addresses: every rank of an
                        in-process team on this device (or on any, with peer access), the
                        rank itself in an NCCL team (the others are other processes'). A
                        failing kernel sets them all. Slots, not ranks: an NCCL team may
                        have more ranks than SBN_GPU_MAX_RANKS (sbn_gpu_stop_words) */
  int nstop;
  int host_words_at_start; /* the peer-pinned-host transport (mailboxes in host memory, no
                              peer access to the stop words): a kernel's start reads err */
  int64_t host_poll_ns; /* a waiting watcher reads err at most once per host_poll_ns, and
                           not in the first host_poll_ns of a wait (SBN_HOST_POLL_NS on
                           peer-pinned-host, SBN_HOST_POLL_FALLBACK_NS elsewhere) */
  int64_t c;
  int64_t timeout_ns;
  uint32_t sig;
  int nranks;
  int nlaunch;
  int G;           /* blocks per rank */
  int nchunks_max; /* records per (src, parity) in a mailbox */
  int hold_slots;  /* onchip variant: batches per thread held in dynamic shared memory
                      (coop_plan.h: sbn_hold_bytes of them per block) */
  /* NCCL teams (the `nccl` transport, one process per rank): every rank's mailbox is its
     part of an NCCL symmetric window (ncclCommWindowRegister), addressed in the kernel
     with NCCL's device API (ncclGetPeerPointer); `mail` above is then unused. NULL for
     the other teams. The window holds, at offset 0, the rank's mailbox, then at
     `fail_off` nranks failure words: fail[q] != 0 is what rank q's kernel recorded
     (sbnTimeout, sbnAborted, ...), pushed into every rank's window by rank q itself, so
     that a failure in one process makes the others' waits return at once. */
  const void* win;  /* ncclWindow_t (device memory) */
  uint32_t* fail;   /* this rank's failure words (local device memory) */
  int64_t fail_off; /* byte offset of the failure words in the window */
} sbn_coop_args_t;

/* Bytes of a rank's part of an NCCL team's window: its mailbox, then nranks failure
   words, rounded up to NCCL's window alignment (4096). */
static SBN_ARGS_HD int64_t sbn_window_fail_off(int nranks, int nchunks_max) {
  return (int64_t)nranks * 2 * nchunks_max * (int64_t)sizeof(sbn_mail_rec_t);
}
static SBN_ARGS_HD int64_t sbn_window_bytes(int nranks, int nchunks_max) {
  const int64_t b = sbn_window_fail_off(nranks, nchunks_max) + (int64_t)nranks * 4;
  return (b + 4095) / 4096 * 4096;
}

/* The host-driven path (SBN_ALGO=nccl, what PyTorch does): the same arithmetic as the
   cooperative kernel cut into ordinary launches, with the exchange between them done by
   the host's collective (ncclAllGather of the records) or by the gather kernel:
     STATS   (G blocks per rank)       stage 1: per-(slice, channel) partials
     PUBLISH (nchunks blocks per rank) the slices merged into the rank's `send` records
     GATHER  (nlaunch*nranks blocks)   every rank's `send` copied to every rank's gathered
                                       records, in place of ncclAllGather (one device)
     APPLY   (G blocks per rank)       the ranks merged in rank order, finalize, normalize
   Same G, same orders: the bits of the cooperative kernel. Where the cooperative kernel
   would be the small variant (a team of one's few rows: coop_plan.h), SMALL_STATS (G
   blocks) replaces STATS and PUBLISH: small's sums, in small's order, straight into the
   rank's `send` records, which APPLY takes as it takes any: small's bits. */
enum {
  SBN_HOST_STATS = 0,
  SBN_HOST_PUBLISH = 1,
  SBN_HOST_GATHER = 2,
  SBN_HOST_APPLY = 3,
  SBN_HOST_SMALL_STATS = 4, /* tile units only, not the in-place backward (else NULL) */
  SBN_HOST_STAGES = 5
};

/* sbnForwardInference with device pointers: one elementwise kernel (kernels/coop.cu). */
typedef struct {
  const void* x;
  void* y;
  const float* weight;
  const float* bias;
  const float* rm;
  const float* rv;
  float eps;
  int group; /* plane kernel: threads per plane (coop_plan.h: sbn_infer_group); the flat
                kernel splits the tensor by warps (infer.cuh) */
  int64_t n, c, sp;
  /* the epilogue (sbnForwardInferenceEx): y = act(that + z); the kernels built with it
     only (act != identity or z non-NULL) */
  const void* z;
  int act;
  float slope;
} sbn_infer_args_t;

/* Whether a launch's ranks run an epilogue, and so take the kernels built with it: the
   plain ops' kernels have none (their code, registers and speed stay as they were). */
enum { SBN_EPI_NONE = 0, SBN_EPI_ACT = 1, SBN_EPI_RECOVER = 2, SBN_EPI_KINDS = 3 };
/* The kernels of a launch, from what its ranks ask (one launch runs them all, so the rule
   is the launch's, not a rank's): the in-place backward's when its ranks with data
   recover x (they all do or none does: gpu_launch.c refuses a mix; an empty rank, which
   reads nothing, may pass x or not), else the epilogue's when any rank has an
   activation, a z or a dz (a rank without them runs there as the plain op), else the
   plain ones. The host side applies the same rule to the ops of a round
   (gpu_internal.h: sbn_gpu_round_epi). */
static SBN_ARGS_HD int sbn_epi_of(int any_recover_with_data, int any_act_z_dz) {
  if (any_recover_with_data) return SBN_EPI_RECOVER;
  return any_act_z_dz ? SBN_EPI_ACT : SBN_EPI_NONE;
}
static SBN_ARGS_HD int sbn_args_epilogue(const sbn_coop_args_t* a) {
  int rec = 0, act = 0;
  for (int i = 0; i < a->nlaunch; i++) {
    const sbn_coop_rank_t* r = &a->r[i];
    rec |= r->recover && r->n > 0;
    act |= r->act != 0 || r->z != 0 || r->dz != 0 || r->recover;
  }
  return sbn_epi_of(rec, act);
}
static SBN_ARGS_HD int sbn_infer_epilogue(const sbn_infer_args_t* a) { return a->act != 0 || a->z != 0; }

/* The kernels' addresses (kernels/coop.cu), for launches by address. vec: 1 for the
   16-byte kernels, 0 for the scalar ones; variant: SBN_VAR_* (coop_plan.h). NULL for a
   combination that is not built (onchip and the flat inference kernel are 16-byte only).
   epi: SBN_EPI_* (sbn_args_epilogue; inference: 0 or 1, sbn_infer_epilogue). Inference's
   kind: SBN_INFER_* (coop_plan.h: sbn_infer_kind). */
#ifdef SBN_COOP_EMU
#define SBN_KERNEL_API
#else
#define SBN_KERNEL_API __attribute__((visibility("hidden")))
#endif
SBN_KERNEL_API const void* sbn_coop_kernel_ptr(int kind, int dtype, int tile, int vec, int variant, int epi);
SBN_KERNEL_API const void* sbn_host_kernel_ptr(int stage, int kind, int dtype, int tile, int vec, int epi);
SBN_KERNEL_API const void* sbn_infer_kernel_ptr(int dtype, int kind, int vec, int epi);

/* Where rank `src`'s record of `chunk` lies in a rank's gathered records (host path). */
static SBN_ARGS_HD int64_t sbn_host_index(int src, int chunk, int nchunks_max) {
  return (int64_t)src * nchunks_max + chunk;
}

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_COOP_ARGS_H_ */
