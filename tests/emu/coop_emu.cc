/* coop_emu.cc — kernels/coop.cu compiled for the CPU emulation (cuda_emu.h), and a
 * "launch" that runs a grid of its kernels on OS threads until every thread returns. */
#include "cuda_emu.h"

#include <stdlib.h>

#include <vector>

thread_local emu::Idx threadIdx, blockIdx;
thread_local emu::Block* emu_block;

#include "coop_emu.h"

/* What ncclGetPeerPointer is to the GPU build (kernels/coop.cu). */
inline void* sbn_window_peer(const void* win, int64_t off, int peer) {
  return static_cast<const sbn_emu_window_t*>(win)->part[peer] + off;
}

#include "coop.cu"

namespace {

typedef void (*kernel_fn)(const sbn_coop_args_t);

template <int KIND, int DT>
kernel_fn pick(int tile) {
  return tile ? (kernel_fn)sbn_coop_kernel<KIND, DT, true> : (kernel_fn)sbn_coop_kernel<KIND, DT, false>;
}
template <int KIND>
kernel_fn pick_kind(int dtype, int tile) {
  switch (dtype) {
    case sbnFloat32: return pick<KIND, sbnFloat32>(tile);
    case sbnFloat16: return pick<KIND, sbnFloat16>(tile);
    default: return pick<KIND, sbnBFloat16>(tile);
  }
}

struct ThreadArg {
  kernel_fn fn;
  const sbn_coop_args_t* args;
  emu::Block* block;
  unsigned block_idx, thread_idx;
};

void* thread_main(void* p) {
  ThreadArg* t = static_cast<ThreadArg*>(p);
  threadIdx.x = t->thread_idx;
  threadIdx.y = threadIdx.z = 0;
  blockIdx.x = t->block_idx;
  blockIdx.y = blockIdx.z = 0;
  emu_block = t->block;
  t->fn(*t->args);
  return nullptr;
}

}  // namespace

static int run_grid(kernel_fn fn, const sbn_coop_args_t* args, unsigned grid) {
  const unsigned nthreads = grid * SBN_GPU_THREADS;
  std::vector<emu::Block> blocks(grid);
  for (auto& b : blocks) {
    pthread_barrier_init(&b.bar, nullptr, SBN_GPU_THREADS);
    for (int w = 0; w < SBN_GPU_THREADS / 32; w++) pthread_barrier_init(&b.warp[w].bar, nullptr, 32);
  }
  std::vector<ThreadArg> targs(nthreads);
  std::vector<pthread_t> th(nthreads);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  int rc = 0;
  unsigned started = 0;
  for (unsigned i = 0; i < nthreads; i++) {
    targs[i] = ThreadArg{fn, args, &blocks[i / SBN_GPU_THREADS], i / SBN_GPU_THREADS,
                         i % SBN_GPU_THREADS};
    if (pthread_create(&th[i], &attr, thread_main, &targs[i]) != 0) {
      rc = -1; /* the started threads would wait forever for the rest of their block */
      abort();
    }
    started++;
  }
  for (unsigned i = 0; i < started; i++) pthread_join(th[i], nullptr);
  pthread_attr_destroy(&attr);
  for (auto& b : blocks) {
    pthread_barrier_destroy(&b.bar);
    for (int w = 0; w < SBN_GPU_THREADS / 32; w++) pthread_barrier_destroy(&b.warp[w].bar);
    for (auto& kv : b.shared) free(kv.second);
  }
  return rc;
}

extern "C" int sbn_emu_launch(int kind, int dtype, int tile, const sbn_coop_args_t* args,
                              unsigned grid) {
  return run_grid(kind == SBN_GPU_FWD ? pick_kind<SBN_GPU_FWD>(dtype, tile)
                                      : pick_kind<SBN_GPU_BWD>(dtype, tile),
                  args, grid);
}

extern "C" int sbn_emu_launch_host(int stage, int kind, int dtype, int tile,
                                   const sbn_coop_args_t* args, unsigned grid) {
  const void* fn = kind == SBN_GPU_FWD ? host_pick_dtype<SBN_GPU_FWD>(stage, dtype, tile)
                                       : host_pick_dtype<SBN_GPU_BWD>(stage, dtype, tile);
  return run_grid((kernel_fn)fn, args, grid);
}

extern "C" void sbn_emu_push_failure(const sbn_coop_args_t* args, int rank, int code) {
  push_failure(*args, rank, code);
}
