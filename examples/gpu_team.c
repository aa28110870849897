/* gpu_team.c — synchronized BatchNorm on a GPU team, checked against a CPU team.
 *
 * A team of W = 2 ranks made by sbnCommInitAll: on GPUs 0 and 1 when there are two,
 * else both on GPU 0 (a GPU listed twice: the ranks share its SMs, through the same
 * code path). Each rank has a batch of its own (fp32, NCHW, N = 2 and 3) in device memory
 * of its GPU and a stream of its own. A training forward and a backward are queued from
 * ONE thread between sbnGroupStart and sbnGroupEnd (asynchronous: a cooperative kernel
 * per rank on its stream); once the streams are synchronized, sbnCommGetAsyncError says
 * whether a kernel failed (a peer that never came, for one).
 *
 * The same inputs then go through a CPU team (sbnCommInitCpu: the same formulas, the
 * library's reference), and every output of every rank must agree within the library's
 * tolerances, |gpu - cpu| <= tol + tol * |cpu|: 1e-5 for statistics, 1e-4 for y, dx,
 * dweight and dbias (the two sum in different orders). Exit 0 when all hold, 1 if not,
 * 77 without a CUDA device.
 *
 * Build against an installed syncbn built with CUDA (docs/USAGE.md, "Linking"):
 *   cc gpu_team.c $(pkg-config --cflags --libs syncbn-static) -I/usr/local/cuda/include
 * (the static CUDA runtime comes with syncbn-static).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <syncbn.h>

enum { W = 2, C = 4, S = 6 };        /* ranks, channels, spatial size (H * W) */
static const int64_t kN[W] = {2, 3}; /* each rank's batch: ranks may differ */

/* A rank's tensors, all in one block of memory (host or its GPU's): four of shape
   (N, C, S), eight of C floats, and num_batches_tracked. */
enum { X, DY, Y, DX, NBIG };
enum { WEIGHT, BIAS, RMEAN, RVAR, SMEAN, SINVSTD, DWEIGHT, DBIAS, NSMALL };
typedef struct {
  float* big[NBIG];
  float* small[NSMALL];
  int64_t* num_batches_tracked;
} rank_t;

static size_t len(int r) { return (size_t)(kN[r] * C * S); }
static size_t floats(int r) { return (NBIG * len(r) + NSMALL * C + 1) / 2 * 2; } /* 8-aligned */
static size_t block_bytes(int r) { return floats(r) * sizeof(float) + sizeof(int64_t); }
/* Rank r's tensors in the block at base. */
static rank_t lay_out(void* base, int r) {
  rank_t t;
  float* f = (float*)base;
  for (int b = 0; b < NBIG; b++) t.big[b] = f + (size_t)b * len(r);
  for (int s = 0; s < NSMALL; s++) t.small[s] = f + NBIG * len(r) + (size_t)s * C;
  t.num_batches_tracked = (int64_t*)(f + floats(r));
  return t;
}

/* Inputs in host blocks: channel c of x spread around 2c, dy, weight, bias, running
   statistics 0 and 1; the outputs NaN (one left unwritten fails the comparison). */
static void make_inputs(void* block[W]) {
  static const float weight[C] = {1.0f, 2.0f, 0.5f, -1.0f}, bias[C] = {0.0f, -1.0f, 3.0f, 0.25f};
  unsigned state = 2026u;
  for (int r = 0; r < W; r++) {
    const rank_t t = lay_out(block[r], r);
    for (size_t i = 0; i < len(r); i++) {
      const int c = (int)(i / S % C);
      state = state * 1103515245u + 12345u;
      const double u = (double)(state >> 8) / (1 << 24) * 2.0 - 1.0; /* in [-1, 1) */
      t.big[X][i] = (float)((c + 1) * u + 2 * c);
      t.big[DY][i] = (float)(u * u - 0.3 * c);
      t.big[Y][i] = t.big[DX][i] = NAN;
    }
    for (int c = 0; c < C; c++) {
      t.small[WEIGHT][c] = weight[c], t.small[BIAS][c] = bias[c];
      t.small[RMEAN][c] = 0.0f, t.small[RVAR][c] = 1.0f;
      for (int s = SMEAN; s < NSMALL; s++) t.small[s][c] = NAN;
    }
    *t.num_batches_tracked = 0;
  }
}

/* A training forward, then its backward, over the team: rank r's tensors t[r] (its GPU's
   memory for a GPU team, host memory for a CPU team), its ops on stream st[r]. */
static sbnResult_t train_step(sbnComm_t* comms, const rank_t* t, cudaStream_t* st) {
  const sbnParams_t params = SBN_PARAMS_DEFAULT; /* eps 1e-5, momentum 0.1, local grads */
  sbnTensorDesc_t desc[W];
  for (int r = 0; r < W; r++) desc[r] = (sbnTensorDesc_t){sbnFloat32, sbnLayoutNCHW, kN[r], C, S};

  sbnGroupStart();
  for (int r = 0; r < W; r++) /* validated now, launched at sbnGroupEnd */
    sbnForwardTrain(comms[r], &desc[r], t[r].big[X], t[r].big[Y], t[r].small[WEIGHT],
                    t[r].small[BIAS], t[r].small[RMEAN], t[r].small[RVAR],
                    t[r].num_batches_tracked, t[r].small[SMEAN], t[r].small[SINVSTD], &params,
                    st[r]);
  const sbnResult_t fwd = sbnGroupEnd(); /* a GPU team: returns once the kernels are queued */
  if (fwd != sbnSuccess) return fwd;

  sbnGroupStart();
  for (int r = 0; r < W; r++) /* the same streams: after the forward */
    sbnBackward(comms[r], &desc[r], t[r].big[X], t[r].big[DY], t[r].big[DX], t[r].small[WEIGHT],
                t[r].small[SMEAN], t[r].small[SINVSTD], t[r].small[DWEIGHT], t[r].small[DBIAS],
                &params, st[r]);
  return sbnGroupEnd();
}

static int failures;
static void expect_near(const char* what, int r, int i, double gpu, double cpu, double tol) {
  if (fabs(gpu - cpu) <= tol + tol * fabs(cpu)) return; /* false for NaN too */
  if (failures++ < 10)
    fprintf(stderr, "rank %d: %s[%d] = %.9g on the GPU, %.9g on the CPU\n", r, what, i, gpu, cpu);
}

/* Every output of every rank: the GPU team's (gpu) against the CPU team's (cpu). */
static void compare(void* gpu[W], void* cpu[W]) {
  static const char* big[NBIG] = {"x", "dy", "y", "dx"};
  static const char* small[NSMALL] = {"weight",    "bias",        "running_mean", "running_var",
                                      "save_mean", "save_invstd", "dweight",      "dbias"};
  for (int r = 0; r < W; r++) {
    const rank_t g = lay_out(gpu[r], r), c = lay_out(cpu[r], r);
    for (int b = Y; b < NBIG; b++)
      for (int i = 0; i < (int)len(r); i++) expect_near(big[b], r, i, g.big[b][i], c.big[b][i], 1e-4);
    for (int s = RMEAN; s < NSMALL; s++)
      for (int i = 0; i < C; i++)
        expect_near(small[s], r, i, g.small[s][i], c.small[s][i], s < DWEIGHT ? 1e-5 : 1e-4);
    if (*g.num_batches_tracked != 1 || *c.num_batches_tracked != 1) {
      fprintf(stderr, "rank %d: num_batches_tracked %lld on the GPU, %lld on the CPU, 1 expected\n",
              r, (long long)*g.num_batches_tracked, (long long)*c.num_batches_tracked);
      failures++;
    }
  }
}

int main(void) {
  int ndev = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&ndev);
  if (count_err != cudaSuccess || ndev == 0) {
    /* the runtime says "driver version is insufficient" also where there is no driver */
    printf("gpu_team: SKIPPED: %s\n",
           count_err == cudaErrorInsufficientDriver
               ? "no usable NVIDIA driver (none on this machine, or older than this build's CUDA)"
           : count_err != cudaSuccess ? cudaGetErrorString(count_err)
                                      : "no CUDA device (the driver sees none)");
    return 77;
  }
  void *gpu_out[W] = {NULL, NULL}, *cpu_out[W] = {NULL, NULL}, *dblock[W] = {NULL, NULL};
  for (int r = 0; r < W; r++) {
    gpu_out[r] = malloc(block_bytes(r)), cpu_out[r] = malloc(block_bytes(r));
    if (!gpu_out[r] || !cpu_out[r]) return 1;
  }
  make_inputs(gpu_out);
  for (int r = 0; r < W; r++) memcpy(cpu_out[r], gpu_out[r], block_bytes(r));

  /* The GPU team: a rank per GPU, or GPU 0 twice; each rank's block in its GPU's memory. */
  const int devs[W] = {0, ndev > 1 ? 1 : 0};
  sbnComm_t comms[W];
  sbnResult_t res = sbnCommInitAll(comms, W, devs, NULL); /* NULL: the default config */
  if (res != sbnSuccess) {
    fprintf(stderr, "sbnCommInitAll: %s\n", sbnGetLastError(NULL));
    return 1;
  }
  cudaStream_t st[W] = {NULL, NULL};
  rank_t t[W];
  cudaError_t ce = cudaSuccess;
  for (int r = 0; r < W && ce == cudaSuccess; r++) {
    ce = cudaSetDevice(devs[r]);
    if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking);
    if (ce == cudaSuccess) ce = cudaMalloc(&dblock[r], block_bytes(r));
    if (ce == cudaSuccess)
      ce = cudaMemcpy(dblock[r], gpu_out[r], block_bytes(r), cudaMemcpyHostToDevice);
    if (ce == cudaSuccess) t[r] = lay_out(dblock[r], r); /* device pointers */
  }
  if (ce == cudaSuccess) {
    res = train_step(comms, t, st);
    if (res != sbnSuccess) fprintf(stderr, "GPU team: %s\n", sbnGetLastError(NULL));
    for (int r = 0; r < W && ce == cudaSuccess; r++) ce = cudaStreamSynchronize(st[r]);
    /* what only the kernels saw: a timeout, an abort */
    for (int r = 0; r < W && res == sbnSuccess && ce == cudaSuccess; r++) {
      sbnResult_t async = sbnSuccess;
      sbnCommGetAsyncError(comms[r], &async);
      if (async != sbnSuccess) fprintf(stderr, "rank %d: %s\n", r, sbnGetLastError(comms[r]));
      res = async;
    }
    for (int r = 0; r < W && ce == cudaSuccess; r++)
      ce = cudaMemcpy(gpu_out[r], dblock[r], block_bytes(r), cudaMemcpyDeviceToHost);
  }
  if (ce != cudaSuccess) fprintf(stderr, "CUDA: %s\n", cudaGetErrorString(ce));
  for (int r = 0; r < W; r++) {
    sbnCommDestroy(comms[r]);
    cudaSetDevice(devs[r]);
    if (dblock[r]) cudaFree(dblock[r]);
    if (st[r]) cudaStreamDestroy(st[r]);
  }

  /* The reference: a CPU team on the same inputs (host memory, no streams). */
  if (res == sbnSuccess && ce == cudaSuccess) {
    cudaStream_t none[W] = {NULL, NULL};
    for (int r = 0; r < W; r++) t[r] = lay_out(cpu_out[r], r);
    res = sbnCommInitCpu(comms, W, NULL);
    if (res == sbnSuccess) {
      res = train_step(comms, t, none);
      for (int r = 0; r < W; r++) sbnCommDestroy(comms[r]);
    }
    if (res != sbnSuccess) fprintf(stderr, "CPU team: %s\n", sbnGetLastError(NULL));
    else compare(gpu_out, cpu_out);
  }
  const int ok = res == sbnSuccess && ce == cudaSuccess && failures == 0;
  printf("gpu_team: %d ranks on GPU %d and GPU %d, forward and backward: %s\n", W, devs[0],
         devs[1],
         ok                  ? "ok, equal to the CPU team"
         : res != sbnSuccess ? sbnGetResultName(res)
         : ce != cudaSuccess ? cudaGetErrorName(ce)
                             : "WRONG");
  for (int r = 0; r < W; r++) free(gpu_out[r]), free(cpu_out[r]);
  return ok ? 0 : 1;
}
