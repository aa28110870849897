/* nccl_none.c — the front's NCCL entry points in a build without NCCL (no CUDA, or CUDA
 * without NCCL): sbnUnsupported with the reason. One copy for both kinds of build; with
 * NCCL, nccl_team.c defines them. */
#include "gpu/gpu.h"

#if !(defined(SYNCBN_HAVE_NCCL) && SYNCBN_HAVE_NCCL)

static sbnResult_t no_nccl(void) {
  return sbn_fail(NULL, sbnUnsupported,
                  "this build of syncbn has no NCCL (SYNCBN_NCCL=OFF, or no CUDA/NCCL at "
                  "configure time; SYNCBN_NCCL_ROOT points CMake at an NCCL)");
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
