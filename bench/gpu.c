/* gpu.c — the GPU harness of GPU mode: device 0 described, its copy bandwidth B measured in
 * this run, the L2 flush and the CUDA events of the timed calls, device twins of a team's
 * buffers and the copies to and from them. */
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "../src/gpu/cuda_reason.h"

void cuda_note(char* err, size_t cap, const char* what, cudaError_t e) {
  if (err[0]) return;
  snprintf(err, cap, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

/* 1 when CUDA sees a device; 0 with the reason in why (the library's words: no driver, an
   old one, no device the driver sees). */
int gpu_present(char* why, size_t cap) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return 1;
  (void)cudaGetLastError();
  sbn_cuda_no_device_reason(e, n, why, cap);
  return 0;
}

/* The copy bandwidth B of this device, in this run: a device-to-device cudaMemcpyAsync
   of 1 GiB (256 MiB when less than 4 GiB is free), median of BENCH_GPU_COPY_REPS after 3
   untimed copies; B = 2 * bytes / time (every byte is read once and written once). */
static int gpu_copy_bandwidth(bench_gpu_t* g, char* err, size_t cap) {
  void *src = NULL, *dst = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  double us[BENCH_GPU_COPY_REPS];
  size_t free_b = 0, total_b = 0;
  GPU_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  g->info.copy_bytes = free_b >= ((size_t)4 << 30) ? (size_t)1 << 30 : (size_t)256 << 20;
  GPU_TRY(cudaMalloc(&src, g->info.copy_bytes), "cudaMalloc (copy source)");
  GPU_TRY(cudaMalloc(&dst, g->info.copy_bytes), "cudaMalloc (copy destination)");
  GPU_TRY(cudaMemsetAsync(src, 0x3c, g->info.copy_bytes, g->stream), "cudaMemsetAsync");
  GPU_TRY(cudaMemsetAsync(dst, 0, g->info.copy_bytes, g->stream), "cudaMemsetAsync");
  GPU_TRY(cudaEventCreate(&e0), "cudaEventCreate");
  GPU_TRY(cudaEventCreate(&e1), "cudaEventCreate");
  for (int it = -3; it < BENCH_GPU_COPY_REPS; it++) {
    float ms = 0.0f;
    GPU_TRY(cudaEventRecord(e0, g->stream), "cudaEventRecord");
    GPU_TRY(cudaMemcpyAsync(dst, src, g->info.copy_bytes, cudaMemcpyDeviceToDevice, g->stream),
            "cudaMemcpyAsync (device to device)");
    GPU_TRY(cudaEventRecord(e1, g->stream), "cudaEventRecord");
    GPU_TRY(cudaEventSynchronize(e1), "cudaEventSynchronize");
    GPU_TRY(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    if (it >= 0) us[it] = (double)ms * 1e3;
  }
  g->info.copy_us = median(us, BENCH_GPU_COPY_REPS);
  g->info.copy_gbps = 2.0 * (double)g->info.copy_bytes / (g->info.copy_us * 1e3);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(src);
  cudaFree(dst);
  return 0;
fail:
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  cudaFree(src);
  cudaFree(dst);
  return -1;
}

void gpu_teardown(bench_gpu_t* g) {
  for (int i = 0; g->ev && i < g->nev; i++)
    if (g->ev[i]) cudaEventDestroy(g->ev[i]);
  free(g->ev);
  if (g->flush) cudaFree(g->flush);
  if (g->stream) cudaStreamDestroy(g->stream);
  memset(g, 0, sizeof *g);
}

/* Device 0: its description, a stream, the events, the L2 flush buffer, B. */
int gpu_setup(bench_gpu_t* g, int iters, char* err, size_t cap) {
  struct cudaDeviceProp prop;
  memset(g, 0, sizeof *g);
  g->info.index = 0;
  GPU_TRY(cudaSetDevice(g->info.index), "cudaSetDevice");
  GPU_TRY(cudaGetDeviceProperties(&prop, g->info.index), "cudaGetDeviceProperties");
  snprintf(g->info.name, sizeof g->info.name, "%s", prop.name);
  g->info.mem_total = prop.totalGlobalMem;
  GPU_TRY(cudaDeviceGetAttribute(&g->info.sms, cudaDevAttrMultiProcessorCount, g->info.index),
          "cudaDeviceGetAttribute");
  GPU_TRY(
      cudaDeviceGetAttribute(&g->info.cc_major, cudaDevAttrComputeCapabilityMajor, g->info.index),
      "cudaDeviceGetAttribute");
  GPU_TRY(
      cudaDeviceGetAttribute(&g->info.cc_minor, cudaDevAttrComputeCapabilityMinor, g->info.index),
      "cudaDeviceGetAttribute");
  GPU_TRY(cudaDeviceGetAttribute(&g->info.l2_bytes, cudaDevAttrL2CacheSize, g->info.index),
          "cudaDeviceGetAttribute");
  if (cudaDeviceGetPCIBusId(g->info.pci, (int)sizeof g->info.pci, g->info.index) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(g->info.pci, sizeof g->info.pci, "?");
  }
  GPU_TRY(cudaDriverGetVersion(&g->info.driver), "cudaDriverGetVersion");
  {
    char line[256] = "";
    FILE* f = fopen("/proc/driver/nvidia/version", "r");
    if (f != NULL) {
      if (fgets(line, (int)sizeof line, f) == NULL) line[0] = '\0';
      fclose(f);
    }
    (void)parse_nvidia_driver(line, g->info.nvidia_driver, sizeof g->info.nvidia_driver);
  }
  GPU_TRY(cudaRuntimeGetVersion(&g->info.runtime), "cudaRuntimeGetVersion");
  GPU_TRY(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  g->nev = 2 * iters;
  g->ev = calloc((size_t)g->nev, sizeof *g->ev);
  if (!g->ev) {
    snprintf(err, cap, "out of host memory");
    goto fail;
  }
  for (int i = 0; i < g->nev; i++) GPU_TRY(cudaEventCreate(&g->ev[i]), "cudaEventCreate");
  /* >= 2x the L2, whole MiB; 64 MiB when the device does not say */
  g->info.flush_bytes = g->info.l2_bytes > 0
                            ? (((size_t)2 * (size_t)g->info.l2_bytes + (1u << 20) - 1) >> 20) << 20
                            : (size_t)64 << 20;
  GPU_TRY(cudaMalloc(&g->flush, g->info.flush_bytes), "cudaMalloc (L2 flush buffer)");
  if (gpu_copy_bandwidth(g, err, cap) != 0) goto fail;
  return 0;
fail:
  gpu_teardown(g);
  return -1;
}

/* After a failed row: clears a non-sticky error; a context that no longer synchronizes
   (sticky error: illegal address, trap) makes the later rows fail at once. */
void gpu_recover(bench_gpu_t* g) {
  (void)cudaGetLastError();
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess && !g->dead[0])
    snprintf(g->dead, sizeof g->dead, "the CUDA context failed earlier: %s (%s)",
             cudaGetErrorName(e), cudaGetErrorString(e));
}

/* Device twin of a team's host buffers (bench_team_bufs_t holding device pointers): each
   tensor and per-channel array its own allocation (aligned as a framework's would be);
   no tensor when n == 0 (the pointers stay NULL, which the API allows). */
void gpu_bufs_free(bench_team_bufs_t* b) {
  void** per_rank[] = {b->x, b->y, b->dy, b->dx, b->z, b->dz};
  for (size_t k = 0; k < sizeof per_rank / sizeof *per_rank; k++) {
    for (int r = 0; per_rank[k] && r < b->W; r++)
      if (per_rank[k][r]) cudaFree(per_rank[k][r]);
    free(per_rank[k]);
  }
  float** chans[] = {b->rm, b->rv, b->save_mean, b->save_invstd, b->dweight, b->dbias};
  for (size_t k = 0; k < sizeof chans / sizeof *chans; k++) {
    for (int r = 0; chans[k] && r < b->W; r++)
      if (chans[k][r]) cudaFree(chans[k][r]);
    free(chans[k]);
  }
  if (b->weight) cudaFree(b->weight);
  if (b->bias) cudaFree(b->bias);
  if (b->nbt) cudaFree(b->nbt);
  memset(b, 0, sizeof *b);
}

int gpu_bufs_alloc(bench_team_bufs_t* b, int W, const sbnTensorDesc_t* d, char* err, size_t cap) {
  memset(b, 0, sizeof *b);
  b->W = W;
  b->desc = *d;
  const size_t bytes = tensor_bytes(d);
  const size_t cbytes = (size_t)d->c * sizeof(float);
  void*** tensors[] = {&b->x, &b->y, &b->dy, &b->dx};
  float*** chans[] = {&b->rm, &b->rv, &b->save_mean, &b->save_invstd, &b->dweight, &b->dbias};
  for (size_t k = 0; k < 4; k++)
    if (!(*tensors[k] = calloc((size_t)W, sizeof(void*)))) goto oom;
  for (size_t k = 0; k < 6; k++)
    if (!(*chans[k] = calloc((size_t)W, sizeof(float*)))) goto oom;
  char what[96];
  snprintf(what, sizeof what, "cudaMalloc (%d ranks x 4 tensors of %.3g MB)", W,
           (double)bytes * 1e-6);
  for (size_t k = 0; bytes && k < 4; k++)
    for (int r = 0; r < W; r++) GPU_TRY(cudaMalloc(&(*tensors[k])[r], bytes), what);
  for (size_t k = 0; k < 6; k++)
    for (int r = 0; r < W; r++)
      GPU_TRY(cudaMalloc((void**)&(*chans[k])[r], cbytes), "cudaMalloc (per-channel)");
  GPU_TRY(cudaMalloc((void**)&b->weight, cbytes), "cudaMalloc (weight)");
  GPU_TRY(cudaMalloc((void**)&b->bias, cbytes), "cudaMalloc (bias)");
  GPU_TRY(cudaMalloc((void**)&b->nbt, (size_t)W * sizeof(int64_t)), "cudaMalloc (nbt)");
  return 0;
oom:
  snprintf(err, cap, "out of host memory");
fail:
  gpu_bufs_free(b);
  return -1;
}

int gpu_bufs_alloc_epilogue(bench_team_bufs_t* b, int epilogue, char* err, size_t cap) {
  const size_t bytes = tensor_bytes(&b->desc);
  b->epilogue = epilogue;
  if (!epi_has_dz(epilogue)) return 0;
  if (!(b->dz = calloc((size_t)b->W, sizeof(void*)))) goto oom;
  if (epi_has_z(epilogue) && !(b->z = calloc((size_t)b->W, sizeof(void*)))) goto oom;
  for (int r = 0; bytes && r < b->W; r++) {
    GPU_TRY(cudaMalloc(&b->dz[r], bytes), "cudaMalloc (dz)");
    if (b->z) GPU_TRY(cudaMalloc(&b->z[r], bytes), "cudaMalloc (z)");
  }
  return 0;
oom:
  snprintf(err, cap, "out of host memory");
fail:
  gpu_bufs_free(b);
  return -1;
}

/* Host -> device for ranks 0..dev->W-1: x, dy, weight, bias, running stats and
   num_batches_tracked as they are in host. On `s`, the stream of the ops (a plain
   cudaMemcpy runs on the legacy stream, which does not order the non-blocking `s`), then
   synchronized. */
int gpu_upload(bench_team_bufs_t* dev, const bench_team_bufs_t* host, int inputs, cudaStream_t s,
               char* err, size_t cap) {
  const sbnTensorDesc_t* d = &dev->desc;
  const size_t bytes = inputs ? tensor_bytes(d) : 0;
  const size_t cbytes = (size_t)d->c * sizeof(float);
  const enum cudaMemcpyKind h2d = cudaMemcpyHostToDevice;
  for (int r = 0; r < dev->W; r++) {
    if (bytes) {
      GPU_TRY(cudaMemcpyAsync(dev->x[r], host->x[r], bytes, h2d, s), "cudaMemcpyAsync (x)");
      GPU_TRY(cudaMemcpyAsync(dev->dy[r], host->dy[r], bytes, h2d, s), "cudaMemcpyAsync (dy)");
      if (dev->z) GPU_TRY(cudaMemcpyAsync(dev->z[r], host->z[r], bytes, h2d, s), "cudaMemcpyAsync (z)");
    }
    GPU_TRY(cudaMemcpyAsync(dev->rm[r], host->rm[r], cbytes, h2d, s),
            "cudaMemcpyAsync (running_mean)");
    GPU_TRY(cudaMemcpyAsync(dev->rv[r], host->rv[r], cbytes, h2d, s),
            "cudaMemcpyAsync (running_var)");
  }
  GPU_TRY(cudaMemcpyAsync(dev->weight, host->weight, cbytes, h2d, s), "cudaMemcpyAsync (weight)");
  GPU_TRY(cudaMemcpyAsync(dev->bias, host->bias, cbytes, h2d, s), "cudaMemcpyAsync (bias)");
  GPU_TRY(cudaMemcpyAsync(dev->nbt, host->nbt, (size_t)dev->W * sizeof(int64_t), h2d, s),
          "cudaMemcpyAsync (num_batches_tracked)");
  GPU_TRY(cudaStreamSynchronize(s), "cudaStreamSynchronize (copies)");
  return 0;
fail:
  return -1;
}

/* Every output the ops write := all-ones bits (NaN in fp32, fp16 and bf16): a value the
   check run does not write cannot pass. */
int gpu_poison(bench_team_bufs_t* dev, cudaStream_t s, char* err, size_t cap) {
  const sbnTensorDesc_t* d = &dev->desc;
  const size_t bytes = tensor_bytes(d);
  const size_t cbytes = (size_t)d->c * sizeof(float);
  for (int r = 0; r < dev->W; r++) {
    if (bytes) {
      GPU_TRY(cudaMemsetAsync(dev->y[r], 0xff, bytes, s), "cudaMemsetAsync (y)");
      GPU_TRY(cudaMemsetAsync(dev->dx[r], 0xff, bytes, s), "cudaMemsetAsync (dx)");
      if (dev->dz) GPU_TRY(cudaMemsetAsync(dev->dz[r], 0xff, bytes, s), "cudaMemsetAsync (dz)");
    }
    float* chans[] = {dev->save_mean[r], dev->save_invstd[r], dev->dweight[r], dev->dbias[r]};
    for (size_t k = 0; k < 4; k++)
      GPU_TRY(cudaMemsetAsync(chans[k], 0xff, cbytes, s), "cudaMemsetAsync (per-channel)");
  }
  return 0;
fail:
  return -1;
}

/* Device -> host for ranks 0..dev->W-1: every output (y, dx, running stats,
   num_batches_tracked, saved statistics, dweight, dbias). On `s`, after the ops queued
   there; synchronized. */
int gpu_download(bench_team_bufs_t* host, const bench_team_bufs_t* dev, cudaStream_t s, char* err,
                 size_t cap) {
  const sbnTensorDesc_t* d = &dev->desc;
  const size_t bytes = tensor_bytes(d);
  const size_t cbytes = (size_t)d->c * sizeof(float);
  const enum cudaMemcpyKind d2h = cudaMemcpyDeviceToHost;
  for (int r = 0; r < dev->W; r++) {
    if (bytes) {
      GPU_TRY(cudaMemcpyAsync(host->y[r], dev->y[r], bytes, d2h, s), "cudaMemcpyAsync (y)");
      GPU_TRY(cudaMemcpyAsync(host->dx[r], dev->dx[r], bytes, d2h, s), "cudaMemcpyAsync (dx)");
      if (dev->dz && host->dz)
        GPU_TRY(cudaMemcpyAsync(host->dz[r], dev->dz[r], bytes, d2h, s), "cudaMemcpyAsync (dz)");
    }
    float* const* from[] = {dev->rm,          dev->rv,      dev->save_mean,
                            dev->save_invstd, dev->dweight, dev->dbias};
    float* const* to[] = {host->rm,          host->rv,      host->save_mean,
                          host->save_invstd, host->dweight, host->dbias};
    for (size_t k = 0; k < 6; k++)
      GPU_TRY(cudaMemcpyAsync(to[k][r], from[k][r], cbytes, d2h, s),
              "cudaMemcpyAsync (per-channel)");
  }
  GPU_TRY(cudaMemcpyAsync(host->nbt, dev->nbt, (size_t)dev->W * sizeof(int64_t), d2h, s),
          "cudaMemcpyAsync (num_batches_tracked)");
  GPU_TRY(cudaStreamSynchronize(s), "cudaStreamSynchronize (copies)");
  return 0;
fail:
  return -1;
}

int gpu_infer_setup(bench_team_bufs_t* dev, bench_team_bufs_t* host, const sbnTensorDesc_t* d,
                    cudaStream_t s, char* err, size_t cap) {
  infer_stats_fill(host->rm[0], host->rv[0], d->c);
  if (gpu_bufs_alloc(dev, 1, d, err, cap) != 0 || gpu_upload(dev, host, 1, s, err, cap) != 0 ||
      gpu_poison(dev, s, err, cap) != 0)
    return -1;
  return 0;
}

int gpu_download_infer(bench_team_bufs_t* host, const bench_team_bufs_t* dev, cudaStream_t s, char* err,
                       size_t cap) {
  const sbnTensorDesc_t* d = &dev->desc;
  const size_t bytes = tensor_bytes(d);
  const size_t cbytes = (size_t)d->c * sizeof(float);
  const enum cudaMemcpyKind d2h = cudaMemcpyDeviceToHost;
  if (bytes) GPU_TRY(cudaMemcpyAsync(host->y[0], dev->y[0], bytes, d2h, s), "cudaMemcpyAsync (y)");
  GPU_TRY(cudaMemcpyAsync(host->rm[0], dev->rm[0], cbytes, d2h, s), "cudaMemcpyAsync (running_mean)");
  GPU_TRY(cudaMemcpyAsync(host->rv[0], dev->rv[0], cbytes, d2h, s), "cudaMemcpyAsync (running_var)");
  GPU_TRY(cudaStreamSynchronize(s), "cudaStreamSynchronize (copies)");
  return 0;
fail:
  return -1;
}

/* warmup + iters calls of one op, each preceded by the L2 flush; CUDA events around the op
   of the timed ones only; then the stream is synchronized. ev_us, host_us: [iters]. */
int gpu_time_op(bench_gpu_t* g, bench_op_fn op, void* ctx, int fwd, const bench_opts_t* o,
                double* ev_us, double* host_us, char* err, size_t cap) {
  for (int it = 0; it < o->warmup + o->iters; it++) {
    const int j = it - o->warmup;
    GPU_TRY(cudaMemsetAsync(g->flush, it & 0xff, g->info.flush_bytes, g->stream),
            "cudaMemsetAsync (L2 flush)");
    if (j >= 0) GPU_TRY(cudaEventRecord(g->ev[2 * j], g->stream), "cudaEventRecord");
    double t = op(ctx, fwd, err, cap);
    if (t < 0) return -1;
    if (j >= 0) {
      host_us[j] = t;
      GPU_TRY(cudaEventRecord(g->ev[2 * j + 1], g->stream), "cudaEventRecord");
    }
  }
  GPU_TRY(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize");
  for (int j = 0; j < o->iters; j++) {
    float ms = 0.0f;
    GPU_TRY(cudaEventElapsedTime(&ms, g->ev[2 * j], g->ev[2 * j + 1]), "cudaEventElapsedTime");
    ev_us[j] = (double)ms * 1e3;
  }
  return 0;
fail:
  return -1;
}
