/* cpu.h — the CPU team: ranks are host threads, data in host memory. The reference every
 * other path is checked against. */
#ifndef SYNCBN_CPU_H_
#define SYNCBN_CPU_H_

#include "bn_mailbox.h"
#include "internal.h"

/* The backend's table (cpu_team.c). */
SBN_INTERNAL extern const sbn_team_ops_t sbn_cpu_team_ops;

/* Floats per channel of a rank's partials (the forward's (mean_hi, mean_lo, m2) is the
   largest) and of its per-channel results. */
#define SBN_CPU_PART_FLOATS 3
#define SBN_CPU_STATS_FLOATS 5

/* A rank's state: its exchange epoch and the workspaces sized at init from max_channels
   (no allocation inside ops). */
typedef struct {
  uint32_t epoch; /* ops this rank has exchanged; the next op uses epoch + 1 */
  float* local;   /* SBN_CPU_PART_FLOATS * max_channels: this rank's partials */
  float* stats;   /* SBN_CPU_STATS_FLOATS * max_channels: per-channel results */
} sbn_cpu_rank_t;

/* team->impl of a CPU team. */
typedef struct {
  sbn_mail_rec_t* mail; /* the team's mailbox, [src][parity][chunk] (bn_mailbox.h) */
  int nchunks_max;
  sbn_cpu_rank_t* ranks; /* [nranks] */
} sbn_cpu_team_t;

static inline sbn_cpu_team_t* sbn_cpu_team(const sbn_team_t* t) { return (sbn_cpu_team_t*)t->impl; }
static inline sbn_cpu_rank_t* sbn_cpu_rank(sbnComm_t c) { return &sbn_cpu_team(c->team)->ranks[c->rank]; }

/* ---- cpu_exchange.c: the cross-rank exchange (the protocol the GPU kernels use) ---- */
/* Every rank's records of one op, as this rank sees them after the exchange: valid until
   this rank publishes its next op. */
typedef struct {
  const sbn_mail_rec_t* mail;
  int nchunks_max;
  uint32_t epoch;
} sbn_cpu_peers_t;

/* Rank q's count (n * spatial) and its floats of channel ci. */
static inline int64_t sbn_cpu_peer_count(const sbn_cpu_peers_t* p, int q) {
  return p->mail[sbn_mail_index(q, p->epoch, 0, p->nchunks_max)].count;
}
static inline const float* sbn_cpu_peer_values(const sbn_cpu_peers_t* p, int q, int64_t ci) {
  const sbn_mail_rec_t* rec =
      &p->mail[sbn_mail_index(q, p->epoch, (int)(ci / SBN_MAIL_CHUNK), p->nchunks_max)];
  return rec->data + SBN_MAIL_REC_FLOATS * (ci % SBN_MAIL_CHUNK);
}

/* The ONE exchange of an op: publishes (count, floats_per_channel * c floats of `local`)
   under signature `sig` (which holds c), waits (bounded by the team's timeout) for every
   rank's records of the same op and describes them in *peers. sbnTimeout / sbnAborted
   when a peer does not arrive; sbnInvalidUsage when a peer runs a different op. */
SBN_INTERNAL sbnResult_t sbn_cpu_exchange(sbnComm_t comm, uint32_t sig, int floats_per_channel,
                                          int64_t count, const float* local,
                                          sbn_cpu_peers_t* peers);

/* ---- cpu_reduce.c: this rank's per-channel partials ---------------------------------- */
/* out[3*ci .. 3*ci+2] = (mean_hi, mean_lo, m2) of channel ci over the rank's n*spatial
   elements (an sbn_partial_t without its count, which is n*spatial). */
SBN_INTERNAL void sbn_cpu_local_stats(const sbnTensorDesc_t* d, const void* x, float* out);
/* What the backward reads of a rank's tensors: g = dy * act'(y) (y NULL: identity, g =
   dy) and x - mean, from x, or, when x is NULL (the in-place backward), from y:
   sbn_xmu_from_y's ((act^-1(y) - z) - bias) * rcp per channel (rcp = sbn_recover_rcp's;
   z the forward's residual, sbnBackwardInPlaceEx's, or 0). */
typedef struct {
  const void* x;
  const void* y;
  const void* dy;
  const float* mean;   /* [c]: save_mean */
  int act;
  float slope;
  const float* bias;   /* [c], x NULL: the forward's bias (NULL: 0) */
  const float* rcp;    /* [c], x NULL: sbn_recover_rcp of the weight and save_invstd */
  /* the mask from x (sbnEpilogue_t.no_residual, an activation, x given): y read only where
     sbn_xmask_sign is not sure; its scale from weight (NULL: 1) and invstd, bias above */
  int xmask;
  const float* weight; /* [c] */
  const float* invstd; /* [c]: save_invstd */
  const void* z;       /* x NULL: the forward's residual (NULL: none; sbnBackwardInPlaceEx) */
} sbn_cpu_bwd_src_t;
/* g and x - mean of `len` elements from element `at`, whose channel is ch (NCHW: the
   same for the run) or ch + i (nhwc: element i of the run). */
SBN_INTERNAL void sbn_cpu_bwd_run(const sbnTensorDesc_t* d, const sbn_cpu_bwd_src_t* s, int64_t at,
                                  int64_t len, int64_t ch, int nhwc, float* g, float* xmu);
/* out[2*ci] = sum g, out[2*ci+1] = sum g*(x - mean[ci]). */
SBN_INTERNAL void sbn_cpu_local_grad_sums(const sbnTensorDesc_t* d, const sbn_cpu_bwd_src_t* s,
                                          float* out);
/* Element loaders/storers for a run of `count` elements starting at element `start`. */
SBN_INTERNAL void sbn_cpu_load(sbnDataType_t dt, const void* base, int64_t start, int64_t count,
                               float* out);
SBN_INTERNAL void sbn_cpu_store(sbnDataType_t dt, void* base, int64_t start, int64_t count,
                                const float* in);

/* ---- cpu_ops.c -------------------------------------------------------------------- */
SBN_INTERNAL sbnResult_t sbn_cpu_forward(const sbn_op_t* op);
SBN_INTERNAL sbnResult_t sbn_cpu_backward(const sbn_op_t* op);
/* sbnForwardInference with host pointers. */
SBN_INTERNAL void sbn_cpu_inference(const sbnTensorDesc_t* d, const void* x, const void* z, void* y,
                                    const float* weight, const float* bias,
                                    const float* running_mean, const float* running_var,
                                    float eps, int act, float slope);

#endif /* SYNCBN_CPU_H_ */
