/* coop_mem.cuh — how the cooperative kernels touch memory: the caller's tensors (16-byte
 * vectors with L2 eviction hints, single elements at unaligned edges), the element
 * conversions, and the memory-ordering primitives of the exchange (DESIGN.md's recipe).
 *
 * Every access to the caller's x, dy, y and dx goes through ld_v16 / st_v16 / ld_e16 /
 * ld_e32 / st_e16 / st_e32, so that the emulation (tests/emu/cuda_emu.h, which defines
 * them for the CPU) can count the bytes each op moves. They are asm volatile: the
 * compiler keeps them in program order, so a batch's loads are all issued before its
 * first use and, in stage 5, before its stores (y may alias x, dx may alias dy).
 */
#ifndef SYNCBN_COOP_MEM_CUH_
#define SYNCBN_COOP_MEM_CUH_

/* Mutants built into the kernels for the tests that must catch them (0 in the library:
   no code). check-sass.sh compiles one with -DSBN_KERNEL_MUTANTS=...; the emulation
   switches them at run time (tests/emu/cuda_emu.h defines SBN_MUTANT there). */
#define SBN_MUT_HOST_WORDS_AT_START 16 /* every publishing block reads the team's error
                                          words (host memory) at its start: the old way */
#define SBN_MUT_HOST_WORDS_EVERY_BLOCK 32 /* every waiting block reads them every 32 polls
                                             (no watcher, no rate limit): the old way */
#define SBN_MUT_SECOND_BARRIER 64 /* a second rank barrier before publishing: one more
                                     dependent round trip in the exchange */
#define SBN_MUT_HELD_COPIES 128 /* onchip: a copy of a batch's arithmetic per batch held in
                                   registers (no turn_hold): the old way, 7x that code */
#define SBN_MUT_NO_ARRIVAL_WAIT 512 /* solo ops: block 0 advances the epoch and writes
                                       num_batches_tracked without waiting for every block's
                                       arrival (after its reads of them) */
#define SBN_MUT_NO_COEF_REUSE 1024 /* a block gathers its chunk's records again for every
                                      unit (finish_coefs ignores sm.coef_chunk): the old way */
#define SBN_MUT_COEF_NO_BARRIER 2048 /* stage 5 leaves out the barrier between units of
                                        different chunks too: a shared-memory race of
                                        sm.coef that compute-sanitizer racecheck must find */
#define SBN_MUT_DZ_LATE 4096 /* the stream backward with an activation and dz reads dy and
                                y again in stage 5 and writes dz there, where dz_first
                                (coop_vec.cuh) applies: 8|x|, not 7 */
#define SBN_MUT_PARAM_PREFETCH_NEXT 8192 /* a local merge asks L2 for the next chunk's
                                            parameters, not its own (SBN_PREFETCH_PARAMS) */
#define SBN_MUT_UNIT_LATE_STOP 16384 /* the unit kernel looks at the stop words loaded at its
                                        start after its first unit's outputs, not at its
                                        start */
#define SBN_MUT_UNIT_FIRST_SLOT 32768 /* the unit kernel finishes its first unit's channel
                                         again for each later unit, whose stage 5 then reads
                                         coefficients no one wrote */
#define SBN_MUT_SMALL_LATE_STOP 65536 /* the small kernel looks at the stop words loaded at
                                         its start after its first chunk's outputs */
#define SBN_MUT_SMALL_RELOAD 131072 /* the small kernel reads x again for its outputs instead
                                       of the values it holds: 2|x| read, not |x| */
#define SBN_MUT_SMALL_Z_AFTER_ACT 262144 /* the small forward adds z after the activation */
#define SBN_MUT_SMALL_MASK_X 524288 /* the small backward takes the activation's mask from x
                                       instead of y */
#define SBN_MUT_XMASK_NO_BAND 1048576 /* the backward's mask from x takes the sign of
                                         fma(x - mean, scale, bias) everywhere: y never read,
                                         wrong where the forward's v has the other sign */
#define SBN_MUT_SOLO_END_THREAD0 2097152 /* the stream kernel's solo op ends from thread 0
                                            while the solo thread arrives: nothing orders
                                            block 0's own add before thread 0's loads */
#define SBN_MUT_ARRIVE_NO_FENCE 4194304 /* a solo block's arrival is a red with no fence
                                           before it (no release): check-sass's solo
                                           ordering must fail on it */
#define SBN_MUT_END_RELAXED 8388608 /* a solo op's end takes the relaxed load that found
                                       every block arrived for its acquire (no acquire):
                                       check-sass's solo ordering must fail on it */
#define SBN_MUT_SMALL_TEAM_LOCAL 16777216 /* the team's small kernel takes its rank's own
                                             values of a chunk for the team's (publishes,
                                             gathers nothing) */
#define SBN_MUT_RECOVER_NO_Z 33554432 /* the in-place backward of a forward with a residual
                                         recovers x from y as if there were no z */
#define SBN_MUT_NO_RECENTRE 67108864 /* a thread's forward run keeps its first element as
                                        its shift (no sbn_recentre when its count doubles) */
#define SBN_MUT_WAITER_BLIND                            \
  134217728 /* blocks that publish no chunk do not look \
               at the stop words at their start */
/* Stage stamps: the probe (bench/probe.cu) defines SBN_STAMP(i) to record %globaltimer
   per block at the cooperative kernel's stage boundaries; nothing in the library. */
#ifndef SBN_STAMP
#define SBN_STAMP(i) ((void)0)
#endif
/* The same by thread t of the block (the solo thread's arrival and end: coop_exchange.cuh). */
#ifndef SBN_STAMP_BY
#define SBN_STAMP_BY(i, t) ((void)0)
#endif
#ifndef SBN_COOP_EMU
#ifndef SBN_KERNEL_MUTANTS
#define SBN_KERNEL_MUTANTS 0
#endif
#define SBN_MUTANT(f) ((SBN_KERNEL_MUTANTS & (f)) != 0)
/* ---- the caller's tensors ------------------------------------------------------------- */
/* L2 policies (sm_80+): keep what stage 5 reads again, let go of what no one will. */
__device__ __forceinline__ uint64_t policy_evict_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint4 ld_v16(const void* p, uint64_t pol) {
  uint4 v;
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(pol));
  return v;
}
__device__ __forceinline__ void st_v16(void* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w));
}
__device__ __forceinline__ uint32_t ld_e32(const void* p, uint64_t pol) {
  uint32_t v;
  asm volatile("ld.global.L2::cache_hint.b32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(pol));
  return v;
}
__device__ __forceinline__ uint32_t ld_e16(const void* p, uint64_t pol) {
  unsigned short v;
  asm volatile("ld.global.L2::cache_hint.b16 %0, [%1], %2;" : "=h"(v) : "l"(p), "l"(pol));
  return v;
}
__device__ __forceinline__ void st_e32(void* p, uint32_t v) {
  asm volatile("st.global.b32 [%0], %1;" ::"l"(p), "r"(v));
}
__device__ __forceinline__ void st_e16(void* p, uint32_t v) {
  asm volatile("st.global.b16 [%0], %1;" ::"l"(p), "h"((unsigned short)v));
}

/* 16 bytes of global memory into shared memory without registers (sm_80+): the onchip
   variant's held positions; cp_async_wait_all before the thread reads them. */
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, uint64_t pol) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem),
               "l"(pol)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }


/* ---- element bits <-> fp32 (round to nearest even; bn_dtype.h has the same bits) --------- */
__device__ __forceinline__ float f16_bits_to_f32(uint32_t h) {
  return __half2float(__ushort_as_half((unsigned short)h));
}
__device__ __forceinline__ uint32_t f32_to_f16_bits(float f) {
  return __half_as_ushort(__float2half_rn(f));
}
__device__ __forceinline__ float bf16_bits_to_f32(uint32_t h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ uint32_t f32_to_bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ __forceinline__ float f32_bits_to_f32(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint32_t f32_to_f32_bits(float f) { return __float_as_uint(f); }

/* ---- memory ordering primitives (DESIGN.md's recipe) ------------------------------------ */
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ float ld_relaxed_sys_f32(const float* p) {
  float v;
  asm volatile("ld.relaxed.sys.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_relaxed_sys_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int64_t ld_relaxed_sys_s64(const int64_t* p) {
  int64_t v;
  asm volatile("ld.relaxed.sys.s64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
/* A rank's stop word (sbn_rank_state_t.stop: device memory, written by this device's
   kernels and by the host's copy engine): relaxed at GPU scope, no trip to host memory. */
__device__ __forceinline__ uint32_t ld_relaxed_gpu_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_gpu(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/* A release fence at system scope (fence.acq_rel.sys: MEMBAR.ALL.SYS, not the fence.sc of
   __threadfence_system, which check-sass.sh keeps out of the cooperative kernels); with a
   strong read before it, an acquire too (record_error). */
__device__ __forceinline__ void fence_release_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
/* fence.acq_rel.gpu (MEMBAR.GPU): with a strong write after it, a release (the solo ops'
   arrivals: coop_exchange.cuh). */
__device__ __forceinline__ void fence_acq_rel_gpu() {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
/* The solo ops' polls of the arrivals counter (coop_exchange.cuh: rank_arrivals_done):
   relaxed; the load that ends the wait is an acquire (ld_acquire_gpu). (The emulation's
   plain runs and ThreadSanitizer take it as an acquire load.) */
__device__ __forceinline__ uint32_t ld_arrivals_gpu(const uint32_t* p) {
  return ld_relaxed_gpu_u32(p);
}
/* An add that returns nothing (red): the issuing thread waits for no round trip. */
__device__ __forceinline__ void red_add_gpu(uint32_t* p, uint32_t v) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
/* Memory that other blocks or ranks read (partials, mailbox records, the epoch, error
   words), outside the flags: plain ("weak" in PTX) accesses, ordered by the barrier's
   fences and the flags' release/acquire. They are named so that the emulation can send
   them through its weak memory model (tests/emu/emu_rt.h). */
__device__ __forceinline__ void st_weak_f32(float* p, float v) { *p = v; }
__device__ __forceinline__ void st_weak_u32(uint32_t* p, uint32_t v) { *p = v; }
__device__ __forceinline__ void st_weak_s64(int64_t* p, int64_t v) { *p = v; }
__device__ __forceinline__ uint32_t ld_weak_u32(const uint32_t* p) { return *p; }
__device__ __forceinline__ float4 ld_weak_f4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
/* A hint: the line that holds p (a generic address) asked of L2 (nothing comes back,
   nothing waits). */
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.L2 [%0];" ::"l"(p));
}
/* A per-channel parameter stage 4 finalizes with (weight, bias; saved mean and invstd):
   a plain load, named so that the emulation can tell which were asked of L2 first. */
__device__ __forceinline__ float ld_param(const float* p) { return *p; }
/* The team's error words (mapped host memory): volatile, one word each. */
__device__ __forceinline__ int ld_err(const volatile int* p) { return *p; }
__device__ __forceinline__ void st_err(volatile int* p, int v) { *p = v; }
/* Where a rank's record of op `epoch` goes in a mailbox (coop_args.h). */
__device__ __forceinline__ int64_t mail_index(int src, uint32_t epoch, int chunk, int nchunks_max) {
  return sbn_mail_index(src, epoch, chunk, nchunks_max);
}
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif /* the emulation defines all of the above for the CPU (tests/emu/cuda_emu.h) */

/* ---- a dtype's elements in a position ------------------------------------------------------ */
/* A position holds VEC elements of one dtype in a uint4 (VEC == 1: the element in .x). */
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ void set_word(uint4& v, int i, uint32_t u) {
  if (i == 0) v.x = u;
  else if (i == 1) v.y = u;
  else if (i == 2) v.z = u;
  else v.w = u;
}

/* The element traits of every dtype of SBN_DTYPES (bn_dtype.h): bytes, and the bits of an
   element to and from fp32 through <tag>_bits_to_f32 / f32_to_<tag>_bits above. */
template <int DT> struct Dt;
#define SBN_DT_TRAITS_(value, bytes, name, tag, bits)                                          \
  template <> struct Dt<value> {                                                               \
    static constexpr int kSize = bytes;                                                        \
    static __device__ __forceinline__ float to_f32(uint32_t u) { return tag##_bits_to_f32(u); } \
    static __device__ __forceinline__ uint32_t from_f32(float f) { return f32_to_##tag##_bits(f); } \
  };
SBN_DTYPES(SBN_DT_TRAITS_)
#undef SBN_DT_TRAITS_
/* Elements per 16-byte position. */
template <int DT> constexpr int kVec = 16 / Dt<DT>::kSize;

/* Element e (a compile-time constant once unrolled) of a position, as fp32. */
template <int DT, int VEC>
__device__ __forceinline__ float elem_get(const uint4& v, int e) {
  if (Dt<DT>::kSize == 4 || VEC == 1) return Dt<DT>::to_f32(word_of(v, e));
  const uint32_t w = word_of(v, e >> 1);
  return Dt<DT>::to_f32((e & 1) ? w >> 16 : w & 0xffffu);
}
template <int DT, int VEC>
__device__ __forceinline__ void elem_set(uint4& v, int e, float f) {
  const uint32_t b = Dt<DT>::from_f32(f);
  if (Dt<DT>::kSize == 4 || VEC == 1) {
    set_word(v, e, b);
    return;
  }
  const uint32_t w = word_of(v, e >> 1);
  set_word(v, e >> 1, (e & 1) ? (w & 0xffffu) | (b << 16) : (w & 0xffff0000u) | b);
}

/* One element of a tensor, element index i. */
template <int DT>
__device__ __forceinline__ uint32_t tensor_ld_elem(const void* base, int64_t i, uint64_t pol) {
  const char* p = static_cast<const char*>(base) + i * Dt<DT>::kSize;
  return Dt<DT>::kSize == 4 ? ld_e32(p, pol) : ld_e16(p, pol);
}
template <int DT>
__device__ __forceinline__ void tensor_st_elem(void* base, int64_t i, uint32_t bits) {
  char* p = static_cast<char*>(base) + i * Dt<DT>::kSize;
  if (Dt<DT>::kSize == 4)
    st_e32(p, bits);
  else
    st_e16(p, bits);
}

/* The position of VEC elements starting at element i (i % VEC == 0, the tensor 16-byte
   aligned); mask bit e set: element i + e belongs to the caller's unit. A full mask is
   one 16-byte load; a partial one loads only its elements (never outside the piece, so
   never outside the tensor), the others read as 0. WHOLE: the caller's masks are full
   or empty (tile units, planes of whole vectors): the element-wise path is not compiled. */
template <int DT, int VEC, bool WHOLE = false>
__device__ __forceinline__ uint4 load_pos(const void* base, int64_t i, unsigned mask, uint64_t pol) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (VEC == 1) {
    if (mask) v.x = tensor_ld_elem<DT>(base, i, pol);
  } else if (WHOLE ? mask != 0u : mask == (1u << VEC) - 1u) {
    v = ld_v16(static_cast<const char*>(base) + i * Dt<DT>::kSize, pol);
  } else if (!WHOLE) {
SBN_UNROLL
    for (int e = 0; e < VEC; e++)
      if (mask >> e & 1u) {
        const uint32_t b = tensor_ld_elem<DT>(base, i + e, pol);
        if (Dt<DT>::kSize == 4)
          set_word(v, e, b);
        else
          set_word(v, e >> 1, word_of(v, e >> 1) | (b << ((e & 1) * 16)));
      }
  }
  return v;
}
template <int DT, int VEC, bool WHOLE = false>
__device__ __forceinline__ void store_pos(void* base, int64_t i, unsigned mask, const uint4& v) {
  if (VEC == 1) {
    if (mask) tensor_st_elem<DT>(base, i, v.x);
  } else if (WHOLE ? mask != 0u : mask == (1u << VEC) - 1u) {
    st_v16(static_cast<char*>(base) + i * Dt<DT>::kSize, v);
  } else if (!WHOLE) {
SBN_UNROLL
    for (int e = 0; e < VEC; e++)
      if (mask >> e & 1u) {
        const uint32_t w = word_of(v, Dt<DT>::kSize == 4 ? e : e >> 1);
        tensor_st_elem<DT>(base, i + e, Dt<DT>::kSize == 4 ? w : (e & 1) ? w >> 16 : w & 0xffffu);
      }
  }
}

#endif /* SYNCBN_COOP_MEM_CUH_ */
