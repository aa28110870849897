/* gpu.h — GPU teams (virtual ranks on one GPU, one rank per GPU in one process): their
 * device resources and the launches of the cooperative kernels (kernels/coop.cu).
 * Every function exists in builds without CUDA and then returns sbnUnsupported. */
#ifndef SYNCBN_GPU_H_
#define SYNCBN_GPU_H_

#include "internal.h"

/* Attaches GPU resources to a freshly created team of kind SBN_COMM_GPU_VIRTUAL (every
   rank on devices[0]) or SBN_COMM_GPU_PEER (rank r on devices[r]). On failure the team
   has no GPU part (team->gpu == NULL) and the caller frees it. */
SBN_INTERNAL sbnResult_t sbn_gpu_team_attach(sbn_team_t* team, const int* devices);
/* Releases the GPU part of a team (waits for the team's devices to be idle). */
SBN_INTERNAL void sbn_gpu_team_detach(sbn_team_t* team);
/* Device of a rank (for splits). */
SBN_INTERNAL int sbn_gpu_rank_device(const sbn_team_t* team, int rank);

/* Reads the team's error words (mapped host memory, written by the kernels): sbnSuccess,
   or the failure a kernel recorded (sbnTimeout, sbnInvalidUsage, sbnInvalidArgument,
   sbnAborted). Never blocks. */
SBN_INTERNAL sbnResult_t sbn_gpu_poll_error(const sbn_team_t* team);
/* Makes the team's waiting kernels return (sbnCommAbort). */
SBN_INTERNAL void sbn_gpu_abort(sbn_team_t* team);

/* Checks that `nops` ops, one per rank in rank order for a virtual team (or of several
   ranks of a peer team, all ranks present), can run together: same kind, dtype, layout
   and C, and a global count other than 1 for a forward. Synchronous errors. */
SBN_INTERNAL sbnResult_t sbn_gpu_check_round(const sbn_op_t* const* ops, int nops, int whole_team);
/* Launches: a virtual team's op of every rank as ONE cooperative launch (nops ==
   nranks, ops in rank order), or one rank's op of a peer team (nops == 1). Asynchronous
   on the ops' stream(s). */
SBN_INTERNAL sbnResult_t sbn_gpu_launch(const sbn_op_t* const* ops, int nops);

/* Every non-NULL tensor of a GPU team's op is device (or managed) memory, of the rank's
   device: sbnInvalidArgument naming the first that is not (one cudaPointerGetAttributes
   per pointer). */
SBN_INTERNAL sbnResult_t sbn_gpu_check_pointers(const sbn_op_t* op);
/* How the team's ops exchange: sbnCommGetTransport's names. */
SBN_INTERNAL const char* sbn_gpu_transport(const sbn_team_t* team);
/* NCCL teams whose transport is the host-driven path ("nccl-host"): every op takes it. */
SBN_INTERNAL int sbn_gpu_host_only(const sbn_team_t* team);

/* NCCL teams (src/gpu/nccl_team.c). The NCCL comm's size and this process's rank. */
SBN_INTERNAL sbnResult_t sbn_gpu_nccl_query(struct ncclComm* nccl, int* nranks, int* rank);
/* Attaches the GPU part of an NCCL team (team->local_rank set): the team's own NCCL comm
   (a duplicate of `nccl`, or `nccl` itself when adopt), device state, and the transport
   agreed by every rank. Collective, bounded by the timeout. On failure team->gpu == NULL
   (an adopted `nccl` is released). */
SBN_INTERNAL sbnResult_t sbn_gpu_team_attach_nccl(sbn_team_t* team, struct ncclComm* nccl,
                                                 int adopt);
/* Releases an NCCL comm the library made and could not adopt (ncclCommAbort). */
SBN_INTERNAL void sbn_gpu_nccl_discard(struct ncclComm* nccl);
/* sbnCommSplit of an NCCL team's rank (collective over the team: ncclCommSplit). */
SBN_INTERNAL sbnResult_t sbn_gpu_nccl_split(sbnComm_t comm, int color, int key,
                                           sbnComm_t* newcomm);

/* sbnForwardInference with device pointers: one kernel on `stream`. */
SBN_INTERNAL sbnResult_t sbn_gpu_inference(const sbnTensorDesc_t* d, const void* x, void* y,
                                           const float* weight, const float* bias,
                                           const float* running_mean,
                                           const float* running_var, float eps,
                                           sbnStream_t stream);

#endif /* SYNCBN_GPU_H_ */
