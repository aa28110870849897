/* sm_blocker.h — a kernel that holds whole SMs and waits for a flag, as an NCCL collective
 * waits for its peers (test_gpu_margin.c): each of its blocks takes an SM to itself (640
 * threads, as NCCL's, and all of the SM's shared memory), marks itself resident, then
 * spins until the flag is set or its hold expires, and marks how it ended.
 *
 * The state and the flag live in mapped host memory (cudaHostAllocMapped), so that the
 * host sees the blocks arrive while they spin, and the flag can be set by a kernel queued
 * behind other work (sm_blocker_release) or by the host. Each block writes words of its
 * own with plain stores and the host adds them up: no atomic on host memory, which a GPU
 * behind PCIe need not perform atomically (hostNativeAtomicSupported 0 on x86 hosts).
 */
#ifndef SYNCBN_TESTS_SM_BLOCKER_H_
#define SYNCBN_TESTS_SM_BLOCKER_H_

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SM_BLOCKER_MAX_BLOCKS 64

/* Block b's words: arrived[b] 1 once it started; ended[b] 1 when it saw the flag
   (released), 2 when its hold expired first (timed out), 0 while it holds. */
typedef struct {
  unsigned arrived[SM_BLOCKER_MAX_BLOCKS];
  unsigned ended[SM_BLOCKER_MAX_BLOCKS];
  unsigned flag; /* nonzero: release */
} sm_blocker_state_t;

/* How many of the first `blocks` words of w (a block's arrived or ended words) are v, as
   the host reads them while the blocks run. */
static inline int sm_blocker_count(const unsigned* w, int blocks, unsigned v) {
  int k = 0;
  for (int b = 0; b < blocks; b++) k += ((const volatile unsigned*)w)[b] == v;
  return k;
}

/* Loads both kernels now (cudaFuncGetAttributes): under lazy loading (CUDA's default) a
   kernel is loaded at its first launch, and a load may wait for the device, where the
   blocker spins until the release kernel runs. */
cudaError_t sm_blocker_load(void);
/* Launches `blocks` (1 .. SM_BLOCKER_MAX_BLOCKS, else cudaErrorInvalidValue) blocks on
   `stream`, each alone on its SM, that hold for at most hold_ms. st: mapped host memory
   (its device address is looked up here), zeroed by the caller. */
cudaError_t sm_blocker_launch(sm_blocker_state_t* st, int blocks, int hold_ms, cudaStream_t stream);
/* A one-thread kernel on `stream` that sets st->flag. */
cudaError_t sm_blocker_release(sm_blocker_state_t* st, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_TESTS_SM_BLOCKER_H_ */
