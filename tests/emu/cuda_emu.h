/* cuda_emu.h — the few CUDA built-ins kernels/coop.cu uses, on CPU threads: one OS thread
 * per CUDA thread, a barrier per block and per warp. It runs the kernels' own source in
 * CI (no GPU there) to test their logic: indexing, reduction orders, the exchange
 * protocol (epochs, parity, chunk records, signatures, timeouts, abort), the barriers.
 * It says nothing about the GPU's memory model or speed: x86 with C++ atomics is stronger
 * than PTX, so ordering bugs can hide here; compute-sanitizer on a GPU is for those.
 *
 * Warp collectives (shuffle, reduce, vote, __syncwarp) need all 32 lanes, as the kernels
 * call them. __shared__ variables are declared with SBN_SHARED and live per emulated
 * block, dynamic shared memory (SBN_DYN_SHARED) too. The memory primitives of
 * kernels/coop_mem.cuh are defined here: 16-byte vectors and cp.async are plain copies
 * (a cp.async completes at once), cache policies are ignored, and every access to the
 * caller's tensors is counted (emu_count: test_coop_emu asserts the bytes each op moves).
 */
#ifndef SYNCBN_TESTS_CUDA_EMU_H_
#define SYNCBN_TESTS_CUDA_EMU_H_

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "bn_dtype.h"

#define SBN_COOP_EMU 1
#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__

struct uint4 {
  unsigned x, y, z, w;
};
struct float4 {
  float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

namespace emu {

struct Warp {
  pthread_barrier_t bar;
  uint64_t buf[32];
};

struct Block {
  pthread_barrier_t bar;
  Warp warp[32];
  std::atomic<int> or_acc{0};
  std::mutex mu;
  std::map<std::string, void*> shared;
  void* dyn = nullptr; /* the launch's dynamic shared memory */
};

struct Idx {
  unsigned x, y, z;
};

}  // namespace emu

extern thread_local emu::Idx threadIdx, blockIdx, gridDim;
extern thread_local emu::Block* emu_block;

namespace emu {

template <typename T>
T& block_shared(const char* name) {
  std::lock_guard<std::mutex> lock(emu_block->mu);
  void*& p = emu_block->shared[name];
  if (p == nullptr) p = calloc(1, sizeof(T));
  return *static_cast<T*>(p);
}

inline Warp& my_warp() { return emu_block->warp[threadIdx.x >> 5]; }

template <typename T>
T shfl_down(T v, int off) {
  static_assert(sizeof(T) <= 8, "shuffle of a small type");
  Warp& w = my_warp();
  const unsigned lane = threadIdx.x & 31;
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  w.buf[lane] = bits;
  pthread_barrier_wait(&w.bar);
  T r = v;
  if (lane + (unsigned)off < 32) memcpy(&r, &w.buf[lane + off], sizeof r);
  pthread_barrier_wait(&w.bar);
  return r;
}

}  // namespace emu

#define SBN_SHARED(type, name) type& name = emu::block_shared<type>(#name)
#define SBN_DYN_SHARED(type, name) type* name = static_cast<type*>(emu_block->dyn)

inline void __syncthreads() { pthread_barrier_wait(&emu_block->bar); }
inline int __syncthreads_or(int p) {
  if (p) emu_block->or_acc.fetch_or(1);
  __syncthreads();
  int r = emu_block->or_acc.load();
  __syncthreads();
  if (threadIdx.x == 0) emu_block->or_acc.store(0);
  __syncthreads();
  return r;
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)mask;
  pthread_barrier_wait(&emu::my_warp().bar);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, int off) {
  (void)mask;
  return emu::shfl_down(v, off);
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
  (void)mask;
  emu::Warp& w = emu::my_warp();
  w.buf[threadIdx.x & 31] = v;
  pthread_barrier_wait(&w.bar);
  unsigned m = 0;
  for (int i = 0; i < 32; i++) m = w.buf[i] > m ? (unsigned)w.buf[i] : m;
  pthread_barrier_wait(&w.bar);
  return m;
}
inline unsigned emu_vote(int p, bool all) {
  emu::Warp& w = emu::my_warp();
  w.buf[threadIdx.x & 31] = p != 0;
  pthread_barrier_wait(&w.bar);
  unsigned r = all ? 1u : 0u;
  for (int i = 0; i < 32; i++) r = all ? (r & (unsigned)w.buf[i]) : (r | (unsigned)w.buf[i]);
  pthread_barrier_wait(&w.bar);
  return r;
}
inline int __any_sync(unsigned mask, int p) {
  (void)mask;
  return (int)emu_vote(p, false);
}
inline int __all_sync(unsigned mask, int p) {
  (void)mask;
  return (int)emu_vote(p, true);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __nanosleep(unsigned ns) {
  (void)ns;
  sched_yield();
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

/* the PTX helpers of coop.cu, with C++ atomics of the same strength */
inline uint32_t ld_acquire_sys(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline uint32_t ld_acquire_gpu(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void st_relaxed_sys(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
inline void st_release_sys(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline uint32_t ld_relaxed_sys_u32(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline int64_t ld_relaxed_sys_s64(const int64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline float ld_relaxed_sys_f32(const float* p) {
  uint32_t u = __atomic_load_n(reinterpret_cast<const uint32_t*>(p), __ATOMIC_RELAXED);
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
inline uint64_t globaltimer_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the caller's tensors (kernels/coop_mem.cuh), counted --------------------------------- */
/* Every access of the kernels to x, dy, y, dx goes through these; tests/emu/coop_emu.cc
   adds its bytes to the tracked range it falls in (sbn_emu_count_track). */
void emu_count(const void* p, size_t bytes, int write);

inline uint64_t policy_evict_last() { return 0; }
inline uint64_t policy_evict_first() { return 0; }
inline uint4 ld_v16(const void* p, uint64_t) {
  uint4 v;
  memcpy(&v, p, 16);
  emu_count(p, 16, 0);
  return v;
}
inline void st_v16(void* p, uint4 v) {
  memcpy(p, &v, 16);
  emu_count(p, 16, 1);
}
inline uint32_t ld_e32(const void* p, uint64_t) {
  uint32_t v;
  memcpy(&v, p, 4);
  emu_count(p, 4, 0);
  return v;
}
inline uint32_t ld_e16(const void* p, uint64_t) {
  uint16_t v;
  memcpy(&v, p, 2);
  emu_count(p, 2, 0);
  return v;
}
inline void st_e32(void* p, uint32_t v) {
  memcpy(p, &v, 4);
  emu_count(p, 4, 1);
}
inline void st_e16(void* p, uint32_t v) {
  const uint16_t h = (uint16_t)v;
  memcpy(p, &h, 2);
  emu_count(p, 2, 1);
}
inline void cp_async16(void* smem, const void* gmem, uint64_t) {
  memcpy(smem, gmem, 16);
  emu_count(gmem, 16, 0);
}
inline void cp_async_wait_all() {}
inline float f16_bits_to_f32(uint32_t h) { return sbn_f16_to_f32((uint16_t)h); }
inline uint32_t f32_to_f16_bits(float f) { return sbn_f32_to_f16(f); }
inline float bf16_bits_to_f32(uint32_t h) { return sbn_bf16_to_f32((uint16_t)h); }
inline uint32_t f32_to_bf16_bits(float f) { return sbn_f32_to_bf16(f); }
inline float bits_to_f32(uint32_t u) { return sbn_f32_from_bits(u); }
inline uint32_t f32_to_bits(float f) { return sbn_f32_bits(f); }

#endif /* SYNCBN_TESTS_CUDA_EMU_H_ */
