/* gpu.h — the GPU harness of GPU mode (gpu.c): device 0's stream, events and L2 flush
 * buffer, the copy bandwidth B, device twins of a team's buffers, CUDA-event timing. */
#ifndef SBN_BENCH_GPU_H_
#define SBN_BENCH_GPU_H_

#include <cuda_runtime_api.h>

#include "bench.h"

typedef struct {
  bench_device_info_t info; /* what the report and the JSON say about the device */
  void* flush;              /* written before every timed call: evicts the L2 */
  cudaStream_t stream;
  cudaEvent_t* ev; /* 2 per timed call */
  int nev;
  char dead[256]; /* non-empty after a sticky CUDA error: later rows are not run */
} bench_gpu_t;

/* Records the first failure in err: "what: cudaErrorX (text)". */
void cuda_note(char* err, size_t cap, const char* what, cudaError_t e);

/* For functions with `char* err, size_t cap` and a `fail:` label. */
#define GPU_TRY(call, what)            \
  do {                                 \
    cudaError_t e_ = (call);           \
    if (e_ != cudaSuccess) {           \
      cuda_note(err, cap, (what), e_); \
      goto fail;                       \
    }                                  \
  } while (0)

/* 1 when CUDA sees a device; 0 with the reason in why. */
int gpu_present(char* why, size_t cap);
/* Device 0: its description, a stream, the events of `iters` calls, the L2 flush buffer, B.
   0, or -1 with err set. */
int gpu_setup(bench_gpu_t* g, int iters, char* err, size_t cap);
void gpu_teardown(bench_gpu_t* g);
/* After a failed row: clears a non-sticky error; a sticky one marks g->dead. */
void gpu_recover(bench_gpu_t* g);

/* Device twin of a team's host buffers (bench_team_bufs_t holding device pointers). */
int gpu_bufs_alloc(bench_team_bufs_t* b, int W, const sbnTensorDesc_t* d, char* err, size_t cap);
/* The epilogue's device tensors (z, dz) of b, as bufs_alloc_epilogue's; 0 or -1 (b freed). */
int gpu_bufs_alloc_epilogue(bench_team_bufs_t* b, int epilogue, char* err, size_t cap);
/* The split path's activation kernels (act.cu), on stream s: forward y = relu(y + z) (z
   NULL: relu(y)) in place, backward g = dy where y > 0, else 0; numel elements of dtype. */
cudaError_t bench_act_forward(int dtype, void* y, const void* z, int64_t numel, cudaStream_t s);
cudaError_t bench_act_backward(int dtype, const void* y, const void* dy, void* g, int64_t numel, cudaStream_t s);
void gpu_bufs_free(bench_team_bufs_t* b);
/* Host -> device: parameters and state of ranks 0..dev->W-1, and with `inputs` also x and dy
   (the ops only read them: once per team's buffers is enough); synchronized. */
int gpu_upload(bench_team_bufs_t* dev, const bench_team_bufs_t* host, int inputs, cudaStream_t s,
               char* err, size_t cap);
/* Every output := NaN bits. */
int gpu_poison(bench_team_bufs_t* dev, cudaStream_t s, char* err, size_t cap);
/* Device -> host: every output of ranks 0..dev->W-1; synchronized. */
int gpu_download(bench_team_bufs_t* host, const bench_team_bufs_t* dev, cudaStream_t s, char* err,
                 size_t cap);

/* An inference row's device buffers (rank 0 of host, one rank): the running statistics
   of the inference table written into host (infer_stats_fill), allocated, uploaded, y
   poisoned. 0, or -1 with err set. */
int gpu_infer_setup(bench_team_bufs_t* dev, bench_team_bufs_t* host, const sbnTensorDesc_t* d,
                    cudaStream_t s, char* err, size_t cap);
/* Device -> host of an inference row (rank 0): y, running_mean and running_var;
   synchronized. */
int gpu_download_infer(bench_team_bufs_t* host, const bench_team_bufs_t* dev, cudaStream_t s, char* err,
                       size_t cap);

/* warmup + iters calls of op, each after the L2 flush; CUDA events around the op of the
   timed ones; then synchronized. ev_us, host_us: [iters]. 0, or -1 with err set. */
int gpu_time_op(bench_gpu_t* g, bench_op_fn op, void* ctx, int fwd, const bench_opts_t* o,
                double* ev_us, double* host_us, char* err, size_t cap);

#endif
