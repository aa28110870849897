/* gpu_infer.c — sbnForwardInference on device pointers: one elementwise kernel
 * (kernels/coop.cu), on the device of the running statistics. */
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_internal.h"

/* SBN_INFER: "plane" runs the plane kernel where the flat one would (an A/B of the two:
   bench/notes/experiments.md, E36); unset, empty or "auto": sbn_infer_kind's choice.
   1: plane, 0: auto, -1: another value. */
static int infer_plane_only(void) {
  const char* v = getenv("SBN_INFER");
  if (v == NULL || v[0] == '\0' || strcmp(v, "auto") == 0) return 0;
  return strcmp(v, "plane") == 0 ? 1 : -1;
}

/* The blocks per SM a kernel holds (cudaOccupancyMaxActiveBlocksPerMultiprocessor), kept
   per device and kernel after the first call: the flat kernel's grid is what the GPU holds
   at once, so that every warp's equal share runs from the start (a second round of blocks
   would start only as the first ends). 0: not known (the query failed). */
#define SBN_INFER_OCC_DEVICES 64
static int infer_occupancy(int dev, int dtype, int epi, const void* fn) {
  static int occ_of[SBN_INFER_OCC_DEVICES][SBN_DTYPE_COUNT][2];
  int* slot = dev >= 0 && dev < SBN_INFER_OCC_DEVICES && dtype >= 0 && dtype < SBN_DTYPE_COUNT
                  ? &occ_of[dev][dtype][epi != 0]
                  : NULL;
  int occ = slot ? __atomic_load_n(slot, __ATOMIC_RELAXED) : 0;
  if (occ > 0) return occ;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, SBN_GPU_THREADS, 0) != cudaSuccess || occ < 1) {
    (void)cudaGetLastError();
    return 0;
  }
  if (slot) __atomic_store_n(slot, occ, __ATOMIC_RELAXED);
  return occ;
}

/* The inference kernel (kernels/coop.cu): 16-byte vectors when x and y are 16-byte
   aligned (and, tile layouts, C a multiple of the vector width), each thread four
   positions at a time; the kernel of the layout (coop_plan.h: sbn_infer_kind). The tile
   and plane kernels: at most 8 blocks per SM, no more than the positions or planes need.
   The flat kernel: the blocks the GPU holds at once, no more than the steps need. */
static cudaError_t inference_launch(const sbnTensorDesc_t* d, const void* x, const void* z, void* y,
                                    const float* weight, const float* bias, const float* rm,
                                    const float* rv, float eps, int act, float slope, int plane_only,
                                    cudaStream_t stream) {
  const int64_t numel = d->n * d->c * d->spatial;
  if (numel == 0) return cudaSuccess;
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  const int nhwc = d->layout == sbnLayoutNHWC;
  const int tile = nhwc || d->spatial == 1;
  const int V = sbn_vec_of(d->dtype);
  const int vec = sbn_aligned16(x) && sbn_aligned16(y) && sbn_aligned16(z) && (!tile || d->c % V == 0);
  const int kind = sbn_infer_kind(nhwc, d->spatial, vec, plane_only);
  sbn_infer_args_t a;
  memset(&a, 0, sizeof a);
  a.x = x, a.y = y, a.weight = weight, a.bias = bias, a.rm = rm, a.rv = rv, a.eps = eps;
  a.group = sbn_infer_group(d->spatial, vec ? V : 1);
  a.n = d->n, a.c = d->c, a.sp = d->spatial;
  a.z = z, a.act = act, a.slope = slope; /* the epilogue (sbnForwardInferenceEx) */
  const void* fn = sbn_infer_kernel_ptr((int)d->dtype, kind, vec, sbn_infer_epilogue(&a));
  int64_t blocks, most = (int64_t)sms * 8;
  if (kind == SBN_INFER_FLAT) {
    /* a warp's steps are 32 vectors; a block's 8 warps take 4 steps at a time */
    const int64_t steps = ((numel + V - 1) / V + 31) / 32;
    blocks = (steps + SBN_GPU_THREADS / 32 * SBN_INFER_BATCH - 1) / (SBN_GPU_THREADS / 32 * SBN_INFER_BATCH);
    const int occ = infer_occupancy(dev, (int)d->dtype, sbn_infer_epilogue(&a), fn);
    if (occ > 0) most = (int64_t)sms * occ;
  } else {
    const int64_t per_block = tile ? (int64_t)SBN_GPU_THREADS * 4 * (vec ? V : 1)
                                   : (int64_t)(SBN_GPU_THREADS / a.group) * d->spatial;
    blocks = (numel + per_block - 1) / per_block;
  }
  if (blocks > most) blocks = most;
  if (blocks < 1) blocks = 1;
  void* args[] = {(void*)&a};
  const dim3 grid = {(unsigned)blocks, 1, 1}, block = {SBN_GPU_THREADS, 1, 1};
  /* cudaLaunchKernel returns this launch's error, not an earlier one of the caller's */
  return cudaLaunchKernel(fn, grid, block, args, 0, stream);
}

sbnResult_t sbn_gpu_inference(const sbnTensorDesc_t* d, const void* x, const void* z, void* y,
                              const float* weight, const float* bias, const float* running_mean,
                              const float* running_var, float eps, int act, float slope, sbnStream_t stream) {
  sbnResult_t r = sbnSuccess;
  const int plane_only = infer_plane_only();
  if (plane_only < 0)
    return sbn_fail(NULL, sbnInvalidArgument, "SBN_INFER='%s': expected 'auto' (the default) or 'plane'",
                    getenv("SBN_INFER"));
  struct cudaPointerAttributes at;
  int prev = 0, dev;
  cudaGetDevice(&prev);
  dev = prev;
  memset(&at, 0, sizeof at);
  /* a failed query's error is not left for the caller's next check (nor is a pending one
     of the caller's taken where none failed) */
  const cudaError_t qe = cudaPointerGetAttributes(&at, running_mean);
  if (qe != cudaSuccess)
    (void)cudaGetLastError();
  else if (at.type == cudaMemoryTypeDevice)
    dev = at.device;
  /* the kernel runs on dev: another device's tensor would be read or written through a
     peer mapping, or fault and take the context with it */
  const sbn_tensor_arg_t ts[] = {{x, "x"},           {z, "z"},       {y, "y"},
                                 {weight, "weight"}, {bias, "bias"}, {running_var, "running_var"}};
  r = sbn_gpu_check_tensors(NULL, "inference", ts, sizeof ts / sizeof ts[0], dev,
                            "running_mean's, or the current one for managed memory", 0);
  if (r != sbnSuccess) return r;
  if (dev != prev) CU(cudaSetDevice(dev), "cudaSetDevice");
  CU(inference_launch(d, x, z, y, weight, bias, running_mean, running_var, eps, act, slope, plane_only,
                      (cudaStream_t)stream),
     "sbnForwardInference kernel launch");
out:
  if (dev != prev) cudaSetDevice(prev);
  return r;
}
