/* cpu.h — the CPU team: ranks are host threads, data in host memory. */
#ifndef SYNCBN_CPU_H_
#define SYNCBN_CPU_H_

#include "internal.h"

/* ---- cpu_exchange.c: the cross-rank exchange (the protocol the GPU kernels use) ---- */
/* A peer's published entry, valid until this rank publishes its next op. */
typedef struct {
  int64_t count;
  const float* payload; /* floats_per_channel * c floats */
} sbn_peer_entry_t;

/* The ONE exchange of an op: publishes (count, floats_per_channel*c of `local`) under signature
   `sig`, waits (bounded by the team's timeout) for every rank's entry of the same op
   and fills peers[0..nranks-1]. sbnTimeout / sbnAborted when a peer does not arrive;
   sbnInvalidUsage when a peer runs a different op. */
SBN_INTERNAL sbnResult_t sbn_cpu_exchange(sbnComm_t comm, uint32_t sig, int64_t c,
                                          int floats_per_channel, int64_t count,
                                          const float* local, sbn_peer_entry_t* peers);

/* ---- cpu_reduce.c: this rank's per-channel partials ---------------------------------- */
/* out[3*ci .. 3*ci+2] = (mean_hi, mean_lo, m2) of channel ci over the rank's n*spatial
   elements (an sbn_partial_t without its count, which is n*spatial). */
SBN_INTERNAL void sbn_cpu_local_stats(const sbnTensorDesc_t* d, const void* x, float* out);
/* out[2*ci] = sum dy, out[2*ci+1] = sum dy*(x - mean[ci]). */
SBN_INTERNAL void sbn_cpu_local_grad_sums(const sbnTensorDesc_t* d, const void* x, const void* dy,
                                          const float* mean, float* out);
/* Element loaders/storers for a run of `count` elements starting at element `start`. */
SBN_INTERNAL void sbn_cpu_load(sbnDataType_t dt, const void* base, int64_t start, int64_t count,
                               float* out);
SBN_INTERNAL void sbn_cpu_store(sbnDataType_t dt, void* base, int64_t start, int64_t count,
                                const float* in);

/* ---- cpu_ops.c -------------------------------------------------------------------- */
SBN_INTERNAL sbnResult_t sbn_cpu_forward(const sbn_op_t* op);
SBN_INTERNAL sbnResult_t sbn_cpu_backward(const sbn_op_t* op);
SBN_INTERNAL void sbn_cpu_inference(const sbnTensorDesc_t* d, const void* x, void* y,
                                    const float* weight, const float* bias,
                                    const float* running_mean, const float* running_var,
                                    float eps);

#endif /* SYNCBN_CPU_H_ */
