/* gpu_infer.c — sbnForwardInference on device pointers: one elementwise kernel
 * (kernels/coop.cu), on the device of the running statistics. */
#include <string.h>

#include "gpu/gpu_internal.h"

/* The inference kernel (kernels/coop.cu): 16-byte vectors when x and y are 16-byte
   aligned (and, tile layouts, C a multiple of the vector width); at most 8 blocks per SM,
   each thread four positions at a time. */
static cudaError_t inference_launch(const sbnTensorDesc_t* d, const void* x, const void* z, void* y,
                                    const float* weight, const float* bias, const float* rm,
                                    const float* rv, float eps, int act, float slope, cudaStream_t stream) {
  const int64_t numel = d->n * d->c * d->spatial;
  if (numel == 0) return cudaSuccess;
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  const int tile = d->layout == sbnLayoutNHWC || d->spatial == 1;
  const int V = sbn_vec_of(d->dtype);
  const int vec = sbn_aligned16(x) && sbn_aligned16(y) && sbn_aligned16(z) && (!tile || d->c % V == 0);
  sbn_infer_args_t a;
  memset(&a, 0, sizeof a);
  a.x = x, a.y = y, a.weight = weight, a.bias = bias, a.rm = rm, a.rv = rv, a.eps = eps;
  a.group = sbn_infer_group(d->spatial, vec ? V : 1);
  a.n = d->n, a.c = d->c, a.sp = d->spatial;
  a.z = z, a.act = act, a.slope = slope; /* the epilogue (sbnForwardInferenceEx) */
  const int64_t per_block = tile ? (int64_t)SBN_GPU_THREADS * 4 * (vec ? V : 1)
                                 : (int64_t)(SBN_GPU_THREADS / a.group) * d->spatial;
  int64_t blocks = (numel + per_block - 1) / per_block;
  if (blocks > (int64_t)sms * 8) blocks = (int64_t)sms * 8;
  if (blocks < 1) blocks = 1;
  void* args[] = {(void*)&a};
  const dim3 grid = {(unsigned)blocks, 1, 1}, block = {SBN_GPU_THREADS, 1, 1};
  /* cudaLaunchKernel returns this launch's error, not an earlier one of the caller's */
  return cudaLaunchKernel(sbn_infer_kernel_ptr((int)d->dtype, tile, vec, sbn_infer_epilogue(&a)), grid, block,
                          args, 0, stream);
}

sbnResult_t sbn_gpu_inference(const sbnTensorDesc_t* d, const void* x, const void* z, void* y,
                              const float* weight, const float* bias, const float* running_mean,
                              const float* running_var, float eps, int act, float slope, sbnStream_t stream) {
  sbnResult_t r = sbnSuccess;
  struct cudaPointerAttributes at;
  int prev = 0, dev;
  cudaGetDevice(&prev);
  dev = prev;
  memset(&at, 0, sizeof at);
  if (cudaPointerGetAttributes(&at, running_mean) == cudaSuccess && at.type == cudaMemoryTypeDevice)
    dev = at.device;
  (void)cudaGetLastError();
  if (dev != prev) CU(cudaSetDevice(dev), "cudaSetDevice");
  CU(inference_launch(d, x, z, y, weight, bias, running_mean, running_var, eps, act, slope,
                      (cudaStream_t)stream),
     "sbnForwardInference kernel launch");
out:
  if (dev != prev) cudaSetDevice(prev);
  return r;
}
