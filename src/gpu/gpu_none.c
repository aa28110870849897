/* gpu_none.c — the GPU backends in a build without CUDA: every init and inference on
 * device pointers returns sbnUnsupported with the reason. */
#include "gpu/gpu.h"

static sbnResult_t no_cuda(void) {
  return sbn_fail(NULL, sbnUnsupported, SBN_NO_CUDA_WHY);
}

static sbnResult_t none_attach(sbn_team_t* team, sbn_team_init_t* init) {
  (void)team, (void)init;
  return no_cuda();
}

/* Never reached: no team of these tables is ever made. */
static sbnResult_t none_detach(sbn_team_t* team) {
  (void)team;
  return sbnSuccess;
}
static sbnResult_t none_run(const sbn_op_t* const* round, int n, int* failed) {
  (void)round, (void)n;
  *failed = 0;
  return no_cuda();
}
static sbnResult_t none_split(sbn_team_t* team, const int* color, const int* key,
                              sbnComm_t* result) {
  (void)team, (void)color, (void)key, (void)result;
  return no_cuda();
}
static const char* none_transport(const sbn_team_t* team) {
  (void)team;
  return "none";
}

#define SBN_NONE_TABLE(label)                                                                \
  {.name = label, .threaded = 0, .attach = none_attach, .detach = none_detach,               \
   .prepare = NULL, .check = NULL, .run = none_run, .poll = NULL, .abort = NULL,             \
   .split = none_split, .transport = none_transport}
const sbn_team_ops_t sbn_gpu_virtual_team_ops = SBN_NONE_TABLE("GPU virtual");
const sbn_team_ops_t sbn_gpu_peer_team_ops = SBN_NONE_TABLE("GPU peer");

/* sbn_nccl_team_create and the other NCCL entry points: nccl_none.c */

sbnResult_t sbn_gpu_inference(const sbnTensorDesc_t* d, const void* x, const void* z, void* y,
                              const float* weight, const float* bias, const float* running_mean,
                              const float* running_var, float eps, int act, float slope, sbnStream_t stream) {
  (void)d, (void)x, (void)z, (void)y, (void)weight, (void)bias, (void)running_mean, (void)running_var;
  (void)eps, (void)act, (void)slope, (void)stream;
  return no_cuda();
}
