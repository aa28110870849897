/* gpu.h — what the front uses of the GPU backends: the tables of the in-process GPU teams
 * (virtual ranks on one GPU, one rank per GPU), the making of an NCCL team's comm, and
 * inference on device pointers. In builds without CUDA (gpu_none.c) every one of them
 * returns sbnUnsupported with the reason. */
#ifndef SYNCBN_GPU_H_
#define SYNCBN_GPU_H_

#include "internal.h"

/* Why a build without CUDA refuses GPU and NCCL teams, and how to build one that takes
   them (gpu_none.c, nccl_none.c). */
#define SBN_NO_CUDA_WHY                                                                      \
  "this build of syncbn has no CUDA: no nvcc at configure time (or SYNCBN_CUDA=OFF). Build " \
  "it again with nvcc on PATH (or CUDACXX naming it); -DSYNCBN_CUDA=ON (pip: -C "           \
  "cmake.define.SYNCBN_CUDA=ON) makes a build without one fail"

/* sbnCommInitVirtual: W ranks on init->devices[0], every op ONE cooperative launch for
   all of them (gpu_team.c). */
SBN_INTERNAL extern const sbn_team_ops_t sbn_gpu_virtual_team_ops;
/* sbnCommInitAll: rank r on init->devices[r], a launch per rank (gpu_team.c). */
SBN_INTERNAL extern const sbn_team_ops_t sbn_gpu_peer_team_ops;

/* sbnCommInitNccl: this process's rank of a team made from the NCCL comm `nccl` (the team
   makes its own duplicate of it; nccl_team.c). Collective, bounded by the timeout. */
SBN_INTERNAL sbnResult_t sbn_nccl_team_create(struct ncclComm* nccl, const sbn_cfg_t* cfg,
                                             sbnComm_t* comm);

/* sbnGetNcclUniqueId: SBN_NCCL_UNIQUE_ID_BYTES bytes into out (nccl_team.c). */
SBN_INTERNAL sbnResult_t sbn_nccl_unique_id(char* out);
/* sbnCommInitNcclRank: the NCCL comm made here from the id (nonblocking, bounded by the
   timeout) and adopted by the team (nccl_team.c). */
SBN_INTERNAL sbnResult_t sbn_nccl_team_create_rank(const char* id, int nranks, int rank,
                                                  const sbn_cfg_t* cfg, sbnComm_t* comm);

/* sbnForwardInference(Ex) with device pointers: one kernel on `stream` (gpu_infer.c);
   z NULL and act 0 (identity): the plain op. */
SBN_INTERNAL sbnResult_t sbn_gpu_inference(const sbnTensorDesc_t* d, const void* x, const void* z, void* y,
                                           const float* weight, const float* bias,
                                           const float* running_mean,
                                           const float* running_var, float eps, int act,
                                           float slope, sbnStream_t stream);

#endif /* SYNCBN_GPU_H_ */
