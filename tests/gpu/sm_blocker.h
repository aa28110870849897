/* sm_blocker.h — a kernel that holds whole SMs and waits for a flag, as an NCCL collective
 * waits for its peers (test_gpu_margin.c): each of its blocks takes an SM to itself (640
 * threads, as NCCL's, and all of the SM's shared memory), counts itself resident, then
 * spins until the flag is set or its hold expires, and counts how it ended.
 *
 * The state and the flag live in mapped host memory (cudaHostAllocMapped), so that the
 * host sees the blocks arrive while they spin, and the flag can be set by a kernel queued
 * behind other work (sm_blocker_release) or by the host.
 */
#ifndef SYNCBN_TESTS_SM_BLOCKER_H_
#define SYNCBN_TESTS_SM_BLOCKER_H_

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int resident;  /* blocks that started */
  int released;  /* blocks that saw the flag */
  int timed_out; /* blocks whose hold expired first */
  unsigned flag; /* nonzero: release */
} sm_blocker_state_t;

/* Loads both kernels now (cudaFuncGetAttributes): under lazy loading (CUDA's default) a
   kernel is loaded at its first launch, and a load may wait for the device, where the
   blocker spins until the release kernel runs. */
cudaError_t sm_blocker_load(void);
/* Launches `blocks` blocks on `stream`, each alone on its SM, that hold for at most
   hold_ms. st: mapped host memory (its device address is looked up here). */
cudaError_t sm_blocker_launch(sm_blocker_state_t* st, int blocks, int hold_ms, cudaStream_t stream);
/* A one-thread kernel on `stream` that sets st->flag. */
cudaError_t sm_blocker_release(sm_blocker_state_t* st, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_TESTS_SM_BLOCKER_H_ */
