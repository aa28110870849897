/* ddp_step.c — the per-process code of a C data-parallel training program around one
 * synchronized BatchNorm layer: one process per GPU, one NCCL communicator, one training
 * step (forward, a loss gradient, backward, the DDP all-reduce of the parameter gradients),
 * as PyTorch's DistributedDataParallel + SyncBatchNorm does it.
 *
 * Starting it:
 *   ./ddp_step
 *       one process, W = 1: it makes the NCCL id itself.
 *   RANK=r WORLD_SIZE=W SBN_NCCL_ID_FILE=/shared/dir/nccl.id ./ddp_step   (r = 0..W-1)
 *       rank 0 makes the ncclUniqueId and writes it to SBN_NCCL_ID_FILE ("<file>.tmp",
 *       then renamed, so a reader never sees half of it); the other ranks wait for the file
 *       (at most 60 s). Delete the file between runs. The file must be visible to every
 *       rank (a shared directory for several nodes).
 *   LOCAL_RANK (optional): the GPU to use; default RANK modulo the number of GPUs.
 *
 * Exit status: 0 done (prints one line: the team's channel-0 batch mean); 77 no CUDA
 * device (skipped, with the reason); 1 an error (printed).
 *
 * The layer: x is a (N, H, W, C) bf16 activation (channels last), weight 1, bias 0,
 * running stats, num_batches_tracked; the statistics are over every rank's batch.
 * The loss is 1/2 * sum(y^2), so dL/dy = y. Checked before printing: the batch mean equals
 * the one computed here from every rank's (deterministic) data, and after the all-reduce
 * dweight = sum(y * xhat) ~ the team's element count (y = xhat for weight 1, bias 0).
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <math.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <syncbn.h>

#define CUDA_TRY(call)                                                      \
  do {                                                                      \
    cudaError_t e_ = (call);                                                \
    if (e_ != cudaSuccess) {                                                \
      fprintf(stderr, "ddp_step: %s: %s\n", #call, cudaGetErrorString(e_)); \
      return 1;                                                             \
    }                                                                       \
  } while (0)
#define NCCL_TRY(call)                                                      \
  do {                                                                      \
    ncclResult_t e_ = (call);                                               \
    if (e_ != ncclSuccess) {                                                \
      fprintf(stderr, "ddp_step: %s: %s\n", #call, ncclGetErrorString(e_)); \
      return 1;                                                             \
    }                                                                       \
  } while (0)
#define SBN_TRY(comm, call)                                                  \
  do {                                                                       \
    sbnResult_t e_ = (call);                                                 \
    if (e_ != sbnSuccess) {                                                  \
      fprintf(stderr, "ddp_step: %s: %s: %s\n", #call, sbnGetResultName(e_), \
              sbnGetLastError(comm));                                        \
      return 1;                                                              \
    }                                                                        \
  } while (0)

enum { N = 2, H = 8, WD = 8, C = 24 }; /* this rank's batch: (2, 8, 8, 24) */

static int env_int(const char* name, int dflt) {
  const char* v = getenv(name);
  return v && v[0] ? atoi(v) : dflt;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* fp32 -> bf16, round to nearest even (finite values) */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Rank r's input: element (n, s, c), a rank-dependent offset so that the ranks' means
   differ (the synchronization matters). */
static float input_value(int r, int n, int s, int c) {
  return 0.25f * (float)(r + 1) + (float)(((n * H * WD + s) * 37 + c * 11 + r * 5) % 41) / 41.0f -
         0.5f + 0.1f * (float)c;
}

/* The NCCL id: made here (rank 0), written to / read from `path` for the others. */
static int get_nccl_id(ncclUniqueId* id, int rank, int world, const char* path) {
  if (rank == 0) {
    NCCL_TRY(ncclGetUniqueId(id));
    if (world == 1) return 0;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
      fprintf(stderr, "ddp_step: cannot write the NCCL id to %s\n", path);
      return 1;
    }
    return 0;
  }
  for (int waited = 0; waited < 60000; waited += 20) {
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return 0;
    }
    sleep_ms(20);
  }
  fprintf(stderr, "ddp_step: rank %d: no NCCL id in %s after 60 s\n", rank, path);
  return 1;
}

int main(void) {
  int rank = env_int("RANK", 0), world = env_int("WORLD_SIZE", 1);
  const char* id_file = getenv("SBN_NCCL_ID_FILE");
  if (world < 1 || rank < 0 || rank >= world || (world > 1 && (!id_file || !id_file[0]))) {
    fprintf(stderr,
            "ddp_step: need 0 <= RANK < WORLD_SIZE and, for WORLD_SIZE > 1, "
            "SBN_NCCL_ID_FILE (RANK=%d WORLD_SIZE=%d)\n",
            rank, world);
    return 1;
  }

  /* 1. the device */
  int ndev = 0;
  cudaError_t ce = cudaGetDeviceCount(&ndev);
  if (ce != cudaSuccess || ndev == 0) {
    /* the runtime says "driver version is insufficient" also where there is no driver */
    printf("ddp_step: SKIPPED: %s\n",
           ce == cudaErrorInsufficientDriver
               ? "no usable NVIDIA driver (none on this machine, or older than this build's CUDA)"
           : ce != cudaSuccess ? cudaGetErrorString(ce)
                               : "no CUDA device (the driver sees none)");
    return 77;
  }
  int dev = env_int("LOCAL_RANK", rank % ndev);
  CUDA_TRY(cudaSetDevice(dev));
  cudaStream_t stream;
  CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  /* 2. the NCCL communicator (the one DDP uses for gradients), then the BatchNorm team on
        it; the library keeps its own duplicate of the NCCL comm */
  ncclUniqueId id;
  if (get_nccl_id(&id, rank, world, id_file) != 0) return 1;
  ncclComm_t nccl;
  NCCL_TRY(ncclCommInitRank(&nccl, world, id, rank));
  sbnComm_t bn;
  SBN_TRY(NULL, sbnCommInitNccl(&bn, nccl, NULL)); /* NULL: default config */

  /* 3. the tensors: x, y, dy, dx (bf16, NHWC) and the per-channel fp32 vectors */
  const int64_t S = H * WD, numel = (int64_t)N * S * C;
  sbnTensorDesc_t desc = {sbnBFloat16, sbnLayoutNHWC, N, C, S};
  uint16_t* hx = (uint16_t*)malloc((size_t)numel * sizeof *hx);
  float ones[C], zeros[C];
  for (int c = 0; c < C; c++) ones[c] = 1.0f, zeros[c] = 0.0f;
  for (int n = 0; n < N; n++)
    for (int s = 0; s < S; s++)
      for (int c = 0; c < C; c++)
        hx[((int64_t)n * S + s) * C + c] = to_bf16(input_value(rank, n, s, c));
  void *x, *y, *dy, *dx;
  float *weight, *bias, *rmean, *rvar, *smean, *sinv, *dweight, *dbias;
  int64_t* nbt;
  size_t xb = (size_t)numel * sizeof(uint16_t), cb = C * sizeof(float);
  CUDA_TRY(cudaMalloc(&x, xb));
  CUDA_TRY(cudaMalloc(&y, xb));
  CUDA_TRY(cudaMalloc(&dy, xb));
  CUDA_TRY(cudaMalloc(&dx, xb));
  float** vecs[] = {&weight, &bias, &rmean, &rvar, &smean, &sinv, &dweight, &dbias};
  for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
    CUDA_TRY(cudaMalloc((void**)vecs[i], cb));
  CUDA_TRY(cudaMalloc((void**)&nbt, sizeof *nbt));
  CUDA_TRY(cudaMemcpy(x, hx, xb, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(weight, ones, cb, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(bias, zeros, cb, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(rmean, zeros, cb, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(rvar, ones, cb, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemset(nbt, 0, sizeof *nbt));

  /* 4. the step: forward (team statistics), dL/dy = y, backward (local dweight/dbias, as
        DDP expects), then DDP's all-reduce of the parameter gradients on the same stream */
  sbnParams_t params = SBN_PARAMS_DEFAULT; /* eps 1e-5, momentum 0.1, sbnGradLocal */
  SBN_TRY(bn, sbnForwardTrain(bn, &desc, x, y, weight, bias, rmean, rvar, nbt, smean, sinv, &params,
                              stream));
  CUDA_TRY(cudaMemcpyAsync(dy, y, xb, cudaMemcpyDeviceToDevice, stream));
  SBN_TRY(bn,
          sbnBackward(bn, &desc, x, dy, dx, weight, smean, sinv, dweight, dbias, &params, stream));
  NCCL_TRY(ncclAllReduce(dweight, dweight, C, ncclFloat, ncclSum, nccl, stream));
  NCCL_TRY(ncclAllReduce(dbias, dbias, C, ncclFloat, ncclSum, nccl, stream));

  /* 5. wait, checking the team's asynchronous error as we go: a peer that never arrives
        makes the step fail with sbnTimeout after the comm's timeout (the kernel's own
        deadline, or the library's watchdog on the host-driven path), and we stop then */
  sbnResult_t async = sbnSuccess;
  for (;;) {
    cudaError_t q = cudaStreamQuery(stream);
    if (q != cudaErrorNotReady) {
      CUDA_TRY(q);
      break;
    }
    SBN_TRY(bn, sbnCommGetAsyncError(bn, &async));
    if (async != sbnSuccess) break;
    sleep_ms(1);
  }
  if (async == sbnSuccess) SBN_TRY(bn, sbnCommGetAsyncError(bn, &async));
  if (async != sbnSuccess) {
    fprintf(stderr, "ddp_step: rank %d: the step failed: %s: %s\n", rank, sbnGetResultName(async),
            sbnGetLastError(bn));
    return 1;
  }

  /* 6. check and report */
  float mean0 = NAN, dw0 = NAN, db0 = NAN;
  int64_t batches = -1;
  CUDA_TRY(cudaMemcpy(&mean0, smean, sizeof mean0, cudaMemcpyDeviceToHost));
  CUDA_TRY(cudaMemcpy(&dw0, dweight, sizeof dw0, cudaMemcpyDeviceToHost));
  CUDA_TRY(cudaMemcpy(&db0, dbias, sizeof db0, cudaMemcpyDeviceToHost));
  CUDA_TRY(cudaMemcpy(&batches, nbt, sizeof batches, cudaMemcpyDeviceToHost));
  double want = 0.0, m_total = (double)world * N * S;
  for (int r = 0; r < world; r++)
    for (int n = 0; n < N; n++)
      for (int s = 0; s < S; s++) want += from_bf16(to_bf16(input_value(r, n, s, 0)));
  want /= m_total;
  int ok = fabs((double)mean0 - want) <= 1e-4 * (1.0 + fabs(want)) && /* the team's mean */
           fabs((double)dw0 / m_total - 1.0) < 0.02 &&                /* sum y*xhat ~ M */
           isfinite(db0) && batches == 1;
  printf(
      "ddp_step: rank %d of %d (GPU %d): channel-0 mean %.6f (expected %.6f), dweight[0] %.1f "
      "for %.0f elements%s\n",
      rank, world, dev, (double)mean0, want, (double)dw0, m_total, ok ? "" : ": WRONG");

  /* 7. clean up: the BatchNorm comm, then the NCCL comm, memory, stream */
  sbnCommDestroy(bn);
  ncclCommDestroy(nccl);
  for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) cudaFree(*vecs[i]);
  cudaFree(nbt);
  cudaFree(x), cudaFree(y), cudaFree(dy), cudaFree(dx);
  cudaStreamDestroy(stream);
  free(hx);
  return ok ? 0 : 1;
}
