/* nccl_none.c — the front's NCCL entry points in a build without NCCL (no CUDA, or CUDA
 * without NCCL): sbnUnsupported with the reason. One copy for both kinds of build; with
 * NCCL, nccl_team.c defines them. */
#include "gpu/gpu.h"

#if !(defined(SYNCBN_HAVE_NCCL) && SYNCBN_HAVE_NCCL)

/* What a user rebuilds with: CUDA first where the build has none. */
static sbnResult_t no_nccl(void) {
#if defined(SYNCBN_HAVE_CUDA)
  return sbn_fail(NULL, sbnUnsupported,
                  "this build of syncbn has no NCCL: none found at configure time (nccl.h "
                  "and libnccl), or SYNCBN_NCCL=OFF. Build it again where NCCL is found: for pip, in an "
                  "environment with a CUDA PyTorch (its nvidia-nccl wheel), or with "
                  "SYNCBN_NCCL_ROOT naming a prefix with include/nccl.h and lib/libnccl.so.2");
#else
  return sbn_fail(NULL, sbnUnsupported, SBN_NO_CUDA_WHY);
#endif
}
sbnResult_t sbn_nccl_team_create(struct ncclComm* nccl, const sbn_cfg_t* cfg, sbnComm_t* comm) {
  (void)nccl, (void)cfg, (void)comm;
  return no_nccl();
}
sbnResult_t sbn_nccl_unique_id(char* out) {
  (void)out;
  return no_nccl();
}
sbnResult_t sbn_nccl_team_create_rank(const char* id, int nranks, int rank, const sbn_cfg_t* cfg,
                                      sbnComm_t* comm) {
  (void)id, (void)nranks, (void)rank, (void)cfg, (void)comm;
  return no_nccl();
}

#endif
