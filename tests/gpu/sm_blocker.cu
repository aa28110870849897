/* sm_blocker.cu — see sm_blocker.h. */
#include "sm_blocker.h"

namespace {

__device__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(640) hold_sm(sm_blocker_state_t* st, unsigned long long hold_ns) {
  extern __shared__ unsigned char smem[]; /* sized to the SM: nothing else fits beside */
  if (threadIdx.x == 0) {
    smem[0] = 1;
    *(volatile unsigned*)&st->arrived[blockIdx.x] = 1u;
    __threadfence_system();
    const unsigned long long t0 = now_ns();
    int seen = 0;
    for (;;) {
      if (*(volatile unsigned*)&st->flag != 0u) {
        seen = 1;
        break;
      }
      if (now_ns() - t0 > hold_ns) break;
      __nanosleep(2000);
    }
    *(volatile unsigned*)&st->ended[blockIdx.x] = seen ? 1u : 2u;
    __threadfence_system();
  }
  __syncthreads();
}

__global__ void set_flag(sm_blocker_state_t* st) {
  *(volatile unsigned*)&st->flag = 1u;
  __threadfence_system();
}

}  // namespace

extern "C" cudaError_t sm_blocker_load(void) {
  cudaFuncAttributes fa;
  cudaError_t e = cudaFuncGetAttributes(&fa, hold_sm);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, set_flag);
  return e;
}

extern "C" cudaError_t sm_blocker_launch(sm_blocker_state_t* st, int blocks, int hold_ms,
                                         cudaStream_t stream) {
  if (blocks < 1 || blocks > SM_BLOCKER_MAX_BLOCKS) return cudaErrorInvalidValue;
  int dev = 0, smem = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(hold_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  sm_blocker_state_t* d = nullptr;
  if (e == cudaSuccess) e = cudaHostGetDevicePointer((void**)&d, st, 0);
  if (e != cudaSuccess) return e;
  hold_sm<<<blocks, 640, (size_t)smem, stream>>>(d, (unsigned long long)hold_ms * 1000000ull);
  return cudaGetLastError();
}

extern "C" cudaError_t sm_blocker_release(sm_blocker_state_t* st, cudaStream_t stream) {
  sm_blocker_state_t* d = nullptr;
  cudaError_t e = cudaHostGetDevicePointer((void**)&d, st, 0);
  if (e != cudaSuccess) return e;
  set_flag<<<1, 1, 0, stream>>>(d);
  return cudaGetLastError();
}
