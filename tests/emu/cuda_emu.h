/* cuda_emu.h — the few CUDA built-ins kernels/coop.cu uses, for the CPU: each CUDA thread
 * is a fiber of the launch's OS thread (tests/emu/emu_rt.h), the barriers, shuffles and
 * votes are the runtime's. It runs the kernels' own source in CI (no GPU there) to test
 * their logic: indexing, reduction orders, the exchange protocol (epochs, parity, chunk
 * records, signatures, timeouts, abort), the barriers; with the weak memory model on
 * (sbn_emu_set_weak), the memory ordering of the exchange as far as emu_rt.h describes.
 * It says nothing about speed.
 *
 * Warp collectives (shuffle, reduce, vote, __syncwarp) need all 32 lanes, as the kernels
 * call them. __shared__ variables are declared with SBN_SHARED and live per emulated
 * block, dynamic shared memory (SBN_DYN_SHARED) too. The memory primitives of
 * kernels/coop_mem.cuh are defined here: 16-byte vectors and cp.async are plain copies
 * (a cp.async completes at once), cache policies are ignored, and every access to the
 * caller's tensors is counted (emu_count: test_coop_emu asserts the bytes each op moves);
 * the accessors of memory other blocks or ranks read go through the weak model.
 */
#ifndef SYNCBN_TESTS_CUDA_EMU_H_
#define SYNCBN_TESTS_CUDA_EMU_H_

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "bn_dtype.h"
#include "coop_args.h"
#include "emu_rt.h"

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

template <typename T>
T& block_shared(const char* name) {
  return *static_cast<T*>(block_shared(name, sizeof(T)));
}

inline Warp& my_warp() { return emu_block->warp[threadIdx.x >> 5]; }

/* A warp collective (shuffle, vote, reduce): every lane posts its value and waits for
   the others; returns the 32 values posted. One barrier is enough: the collectives
   alternate between two buffers, and a lane is at most one collective ahead of another
   (to post the next-but-one it passes the next's barrier, which waits for every lane to
   have read this one), so it never writes a buffer another lane still reads. (Two
   barriers, one to post and one to read, made every lane switch twice per collective:
   test_coop_emu `part 0 2` 16 -> 14 s.) */
inline const uint64_t* warp_exchange(uint64_t v) {
  Warp& w = my_warp();
  const unsigned lane = threadIdx.x & 31;
  uint64_t* buf = w.buf[w.par[lane]];
  w.par[lane] ^= 1;
  buf[lane] = v;
  bar_warp(false);
  return buf;
}
/* A warp shuffle: every lane posts v, then reads lane src's (src >= 32: keeps its own). */
template <typename T>
T shfl_from(T v, unsigned src) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of at most 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  const uint64_t* buf = warp_exchange(bits);
  T r = v;
  if (src < 32) memcpy(&r, &buf[src], sizeof r);
  return r;
}
/* __shfl_down_sync (lanes past 31 keep their value) and __shfl_xor_sync (m < 32). */
template <typename T>
T shfl_down(T v, int off) {
  return shfl_from(v, (threadIdx.x & 31) + (unsigned)off);
}
template <typename T>
T shfl_xor(T v, int m) {
  return shfl_from(v, (threadIdx.x & 31) ^ (unsigned)m);
}

}  // namespace emu

#define SBN_SHARED(type, name) type& name = emu::block_shared<type>(#name)
#define SBN_DYN_SHARED(type, name) type* name = static_cast<type*>(emu_block->dyn)

inline void __syncthreads() { emu::bar_block(); }
inline int __syncthreads_or(int p) {
  if (p) __atomic_store_n(&emu_block->or_acc, 1, __ATOMIC_RELAXED); /* any may write */
  __syncthreads();
  int r = __atomic_load_n(&emu_block->or_acc, __ATOMIC_RELAXED);
  __syncthreads();
  if (threadIdx.x == 0) __atomic_store_n(&emu_block->or_acc, 0, __ATOMIC_RELAXED);
  __syncthreads();
  return r;
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)mask;
  emu::bar_warp(true);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, int off) {
  (void)mask;
  return emu::shfl_down(v, off);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int m) {
  (void)mask;
  return emu::shfl_xor(v, m);
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
  (void)mask;
  const uint64_t* buf = emu::warp_exchange(v);
  unsigned m = 0;
  for (int i = 0; i < 32; i++) m = buf[i] > m ? (unsigned)buf[i] : m;
  return m;
}
inline unsigned emu_vote(int p, bool all) {
  const uint64_t* buf = emu::warp_exchange(p != 0);
  unsigned r = all ? 1u : 0u;
  for (int i = 0; i < 32; i++) r = all ? (r & (unsigned)buf[i]) : (r | (unsigned)buf[i]);
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
inline void __threadfence() { emu::mem_fence(); }
inline void fence_release_sys() { emu::mem_fence(); }
inline void fence_acq_rel_gpu() { emu::mem_fence(); }
inline void __nanosleep(unsigned ns) {
  (void)ns;
  emu::spin_yield();
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return emu::mem_add_u32(p, v); }
inline void red_add_gpu(uint32_t* p, uint32_t v) { emu::mem_red_u32(p, v); }

/* The ordering primitives of coop_mem.cuh and the accessors of memory other blocks or
   ranks read, through the runtime: C++ atomics of the same strength, or the weak model.
   The mutants (emu::g_mutant) act only in the weak model. */
inline uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
inline float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline uint32_t ld_acquire_sys(const uint32_t* p) { return (uint32_t)emu::mem_load(p, 4, emu::kAcquire); }
/* The kernels' built-in mutants (kernels/coop_mem.cuh), switched by sbn_emu_set_mutant. */
#define SBN_MUTANT(f) ((emu::g_mutant & (f)) != 0)
inline uint32_t ld_relaxed_gpu_u32(const uint32_t* p) { return (uint32_t)emu::mem_load(p, 4, emu::kRelaxed); }
inline void st_relaxed_gpu(uint32_t* p, uint32_t v) { emu::mem_store(p, 4, v, emu::kRelaxed); }
inline uint32_t ld_acquire_gpu(const uint32_t* p) { return (uint32_t)emu::mem_load(p, 4, emu::kAcquireGpu); }
/* relaxed (the polls): the load that ends the wait is ld_acquire_gpu, whose acquire the
   weak model and ThreadSanitizer (C++ atomics: the arrivals' adds are seq_cst there) both
   see, so that either would miss it if it were dropped */
inline uint32_t ld_arrivals_gpu(const uint32_t* p) { return (uint32_t)emu::mem_load(p, 4, emu::kRelaxed); }
inline void st_relaxed_sys(uint32_t* p, uint32_t v) { emu::mem_store(p, 4, v, emu::kRelaxed); }
inline void st_release_sys(uint32_t* p, uint32_t v) { emu::mem_store(p, 4, v, emu::kRelease); }
inline uint32_t ld_relaxed_sys_u32(const uint32_t* p) { return (uint32_t)emu::mem_load(p, 4, emu::kRelaxed); }
inline int64_t ld_relaxed_sys_s64(const int64_t* p) { return (int64_t)emu::mem_load(p, 8, emu::kRelaxed); }
inline float ld_relaxed_sys_f32(const float* p) { return u2f((uint32_t)emu::mem_load(p, 4, emu::kRelaxed)); }
inline void st_weak_f32(float* p, float v) { emu::mem_store(p, 4, f2u(v), emu::kWeak); }
inline void st_weak_u32(uint32_t* p, uint32_t v) { emu::mem_store(p, 4, v, emu::kWeak); }
inline void st_weak_s64(int64_t* p, int64_t v) { emu::mem_store(p, 8, (uint64_t)v, emu::kWeak); }
inline uint32_t ld_weak_u32(const uint32_t* p) { return (uint32_t)emu::mem_load(p, 4, emu::kWeak); }
inline float4 ld_weak_f4(const float* p) {
  return float4{u2f((uint32_t)emu::mem_load(p, 4, emu::kWeak)), u2f((uint32_t)emu::mem_load(p + 1, 4, emu::kWeak)),
                u2f((uint32_t)emu::mem_load(p + 2, 4, emu::kWeak)), u2f((uint32_t)emu::mem_load(p + 3, 4, emu::kWeak))};
}
inline void prefetch_l2(const void* p) { emu::note_prefetch(p); }
inline float ld_param(const float* p) {
  emu::note_param_load(p);
  return *p;
}
inline int ld_err(const volatile int* p) {
  return (int)(uint32_t)emu::mem_load(const_cast<const int*>(p), 4, emu::kRelaxed);
}
inline void st_err(volatile int* p, int v) { emu::mem_store(const_cast<int*>(p), 4, (uint32_t)v, emu::kRelaxed); }
/* Where a rank's record of op `epoch` goes in a mailbox (coop_args.h); the single-buffer
   mutant ignores the parity. */
inline int64_t mail_index(int src, uint32_t epoch, int chunk, int nchunks_max) {
  return sbn_mail_index(src, (emu::g_mutant & emu::kMutSingleBuffer) ? 0u : epoch, chunk, nchunks_max);
}
inline uint64_t globaltimer_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the caller's tensors (kernels/coop_mem.cuh), counted --------------------------------- */
/* Every access of the kernels to x, dy, y, dx goes through these; tests/emu/coop_emu.cc
   adds its bytes to the tracked range it falls in (sbn_emu_count_track), and a load's
   to the range's count of bytes read with the evict_last policy (what the kernel asks L2
   to keep) where pol is it. The policies are tags here: 1 evict_last, 2 evict_first. */
void emu_count(const void* p, size_t bytes, int write, uint64_t pol = 0);

inline uint64_t policy_evict_last() { return 1; }
inline uint64_t policy_evict_first() { return 2; }
inline uint4 ld_v16(const void* p, uint64_t pol) {
  uint4 v;
  memcpy(&v, p, 16);
  emu_count(p, 16, 0, pol);
  return v;
}
inline void st_v16(void* p, uint4 v) {
  memcpy(p, &v, 16);
  emu_count(p, 16, 1);
}
inline uint32_t ld_e32(const void* p, uint64_t pol) {
  uint32_t v;
  memcpy(&v, p, 4);
  emu_count(p, 4, 0, pol);
  return v;
}
inline uint32_t ld_e16(const void* p, uint64_t pol) {
  uint16_t v;
  memcpy(&v, p, 2);
  emu_count(p, 2, 0, pol);
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
inline void cp_async16(void* smem, const void* gmem, uint64_t pol) {
  memcpy(smem, gmem, 16);
  emu_count(gmem, 16, 0, pol);
}
inline void cp_async_wait_all() {}
inline float f16_bits_to_f32(uint32_t h) { return sbn_f16_to_f32((uint16_t)h); }
inline uint32_t f32_to_f16_bits(float f) { return sbn_f32_to_f16(f); }
inline float bf16_bits_to_f32(uint32_t h) { return sbn_bf16_to_f32((uint16_t)h); }
inline uint32_t f32_to_bf16_bits(float f) { return sbn_f32_to_bf16(f); }
inline float f32_bits_to_f32(uint32_t u) { return sbn_f32_from_bits(u); }
inline uint32_t f32_to_f32_bits(float f) { return sbn_f32_bits(f); }

#endif /* SYNCBN_TESTS_CUDA_EMU_H_ */
