/* coop.cu — the cooperative SyncBN kernels: forward and backward are each ONE kernel per
 * launch, with the cross-rank exchange inside it (DESIGN.md, "The forward kernel").
 *
 * A launch runs `nlaunch` ranks (all W of a virtual team, or the one rank of this GPU);
 * rank slot s owns blocks [s*G, (s+1)*G). Per rank:
 *   stage 1: the rank's blocks reduce their units (below) into per-(slice, channel)
 *            partials in the rank's workspace: Welford (count, mean, M2) of x - shift
 *            (forward) or (sum dy, sum dy*(x - mean)) (backward), fixed orders only;
 *   stage 2: rank-local barrier over the rank's G blocks (co-resident: cooperative launch);
 *   stage 3: each chunk of 32 channels is merged over the slices in slice order by one
 *            block and PUSHED into every rank's mailbox: data, system-scope fence, then the
 *            record's epoch (the ONE exchange of the op);
 *   stage 4: for every unit it owns, a block waits (acquire, bounded by the timeout via
 *            %globaltimer, abortable) until every rank's record of the unit's chunk carries
 *            this op's epoch, checks they all run the same op, merges the ranks' entries
 *            in RANK ORDER (the same bits on every rank), and finalizes;
 *   stage 5: normalize (y or dx) the unit's elements; the unit's slice-0 block writes the
 *            per-channel outputs (save stats, running stats, dweight/dbias).
 * Nothing is written to the caller's outputs before stage 4 succeeded, so an op mismatch
 * or a global count of 1 leaves them untouched; on a timeout the blocks that timed out
 * write nothing (others may have finished their units).
 *
 * Units: a "tile" layout (NHWC, or NCHW with spatial == 1, which has the same addresses)
 * reduces 32 channels per unit, lane = channel, 8 warps over interleaved rows. A "plane"
 * layout (NCHW, spatial > 1) reduces one channel per unit, threads along its rows
 * (row = n*spatial + s). A unit is (channel group, slice of the rows); P slices per group
 * spread the work over the G blocks when there are fewer groups than blocks.
 *
 * Epochs: each rank's op counter lives in device memory; every block reads it before the
 * rank-local barrier and block 0 advances it after, so nothing comes from the host and a
 * captured CUDA graph replays correctly. Mailbox records are double-buffered by epoch
 * parity: a rank overwrites parity p at op k+2 only after all ranks published op k+1,
 * which each did only after its previous kernel (op k) had finished reading.
 *
 * Errors: a wait that passes the deadline, or sees an error word set (another rank's
 * failure, sbnCommAbort), makes the block write its rank's error word (mapped host memory,
 * read by sbnCommGetAsyncError) and return. No __trap: the context stays usable.
 */
#ifndef SBN_COOP_EMU
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <string.h>
#define SBN_SHARED(type, name) __shared__ type name
#else
/* tests/emu/: the kernels run on CPU threads (one per CUDA thread) for logic tests in CI;
   cuda_emu.h provides the CUDA built-ins used here and SBN_SHARED per emulated block */
#include "bn_dtype.h"
#endif

#include "bn_math.h"
#include "coop_args.h"
#include "syncbn.h"

/* The `nccl` transport (NCCL teams): mailboxes in an NCCL symmetric window, addressed
   with NCCL's device API. NCCL >= 2.28 (nccl_device.h); the emulation stands in its own
   window (tests/emu/cuda_emu.h: sbn_window_peer). */
#if defined(SBN_COOP_EMU)
#define SBN_WINDOW_TRANSPORT 1
#elif defined(SYNCBN_HAVE_NCCL) && SYNCBN_HAVE_NCCL
#include <nccl.h>
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#include <nccl_device.h>
#define SBN_WINDOW_TRANSPORT 1
/* Rank `peer`'s byte `off` of the window. The window's ranks are the NCCL comm's, which
   are the team's (the library's own duplicate of the caller's comm, same ranks), and the
   team is one LSA domain (checked at init), so the world rank is the peer. */
__device__ __forceinline__ void* sbn_window_peer(const void* win, int64_t off, int peer) {
  return ncclGetPeerPointer(static_cast<ncclWindow_t>(const_cast<void*>(win)), (size_t)off, peer);
}
#endif
#endif
#ifndef SBN_WINDOW_TRANSPORT
#define SBN_WINDOW_TRANSPORT 0
#endif

namespace {

constexpr int kThreads = SBN_GPU_THREADS;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = SBN_GPU_CHUNK;
constexpr int kRec = SBN_GPU_REC_FLOATS;
constexpr int kRun = 32; /* elements per Welford run before it is merged into the total */

/* ---- element access ---------------------------------------------------------------- */
template <int DT> struct Elem;
template <> struct Elem<sbnFloat32> {
  typedef float T;
  static __device__ __forceinline__ float load(const void* p, int64_t i) {
    return static_cast<const float*>(p)[i];
  }
  static __device__ __forceinline__ void store(void* p, int64_t i, float v) {
    static_cast<float*>(p)[i] = v;
  }
};
#ifndef SBN_COOP_EMU
template <> struct Elem<sbnFloat16> {
  static __device__ __forceinline__ float load(const void* p, int64_t i) {
    return __half2float(static_cast<const __half*>(p)[i]);
  }
  static __device__ __forceinline__ void store(void* p, int64_t i, float v) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  }
};
template <> struct Elem<sbnBFloat16> {
  static __device__ __forceinline__ float load(const void* p, int64_t i) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
  static __device__ __forceinline__ void store(void* p, int64_t i, float v) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  }
};
#else /* the same bits (tests/gpu/test_gpu_math.cu checks bn_dtype.h == the intrinsics) */
template <> struct Elem<sbnFloat16> {
  static float load(const void* p, int64_t i) {
    return sbn_f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  static void store(void* p, int64_t i, float v) {
    static_cast<uint16_t*>(p)[i] = sbn_f32_to_f16(v);
  }
};
template <> struct Elem<sbnBFloat16> {
  static float load(const void* p, int64_t i) {
    return sbn_bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  static void store(void* p, int64_t i, float v) {
    static_cast<uint16_t*>(p)[i] = sbn_f32_to_bf16(v);
  }
};
#endif

#ifndef SBN_COOP_EMU
/* ---- memory ordering primitives (DESIGN.md's recipe) -------------------------------- */
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
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
__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif /* the emulation defines them with C++ atomics */

/* Rank-local barrier over the G co-resident blocks of one rank. Every block adds to the
   counter; block 0 adds 2^31 - (G - 1), the others 1, so the G arrivals add exactly 2^31
   and bit 31 flips when the last block arrives. This needs the low 31 bits to be 0 on
   entry: they are 0 at init and every completed barrier adds exactly 2^31, so the counter
   needs no reset between barriers or launches. Co-residency (cooperative launch) makes
   the wait finite; it is still bounded by the deadline so that a broken assumption gives
   sbnTimeout, not a hang. Returns false on timeout (the counter is then unusable, and
   the team is aborted). */
__device__ bool rank_barrier(uint32_t* counter, int G, bool first, uint64_t deadline) {
  SBN_SHARED(int, ok);
  __syncthreads();
  if (threadIdx.x == 0) {
    ok = 1;
    uint32_t add = first ? 0x80000000u - (uint32_t)(G - 1) : 1u;
    __threadfence(); /* release this block's writes (the partials) */
    uint32_t old = atomicAdd(counter, add);
    for (uint32_t it = 0; ((old ^ ld_acquire_gpu(counter)) & 0x80000000u) == 0u; it++) {
      __nanosleep(32);
      if ((it & 255u) == 255u && globaltimer_ns() > deadline) {
        ok = 0;
        break;
      }
    }
    __threadfence();
  }
  __syncthreads();
  return ok != 0;
}

/* Any error word set (a failed rank, or the host's abort)? Reads mapped host memory:
   called only while already waiting. NCCL teams: also the failure words other
   processes' kernels pushed into this rank's window. */
__device__ bool team_failed(const sbn_coop_args_t& a) {
  for (int q = 0; q <= a.nranks; q++)
    if (a.err[q] != 0) return true;
  if (a.fail != nullptr)
    for (int q = 0; q < a.nranks; q++)
      if (ld_relaxed_sys_u32(&a.fail[q]) != 0) return true;
  return false;
}

/* This thread's share of the check at a kernel's start: threads stride over the words. */
__device__ __forceinline__ int failed_seen(const sbn_coop_args_t& a) {
  int seen = 0;
  for (int q = (int)threadIdx.x; q <= a.nranks; q += kThreads) {
    seen |= a.err[q] != 0;
    if (a.fail != nullptr && q < a.nranks) seen |= ld_relaxed_sys_u32(&a.fail[q]) != 0u;
  }
  return seen;
}

/* Rank `rank` failed with `code`: its word in every rank's window (NCCL teams). Each word
   has one writer (that rank), so the first cause stays. */
__device__ void push_failure(const sbn_coop_args_t& a, int rank, int code) {
#if SBN_WINDOW_TRANSPORT
  if (a.win == nullptr) return;
  for (int q = 0; q < a.nranks; q++) {
    uint32_t* f = static_cast<uint32_t*>(sbn_window_peer(a.win, a.fail_off, q)) + rank;
    if (ld_relaxed_sys_u32(f) == 0u) st_relaxed_sys(f, (uint32_t)code);
  }
#else
  (void)a, (void)rank, (void)code;
#endif
}

/* Records why this rank's kernel stopped, unless a cause is recorded already (a kernel
   queued behind a timeout must not turn the cause into sbnAborted). */
__device__ __forceinline__ void record_error(const sbn_coop_args_t& a, int rank, int code) {
  if (a.err[rank] == 0) a.err[rank] = code;
  push_failure(a, rank, code);
}

/* Rank q's mailbox as this device addresses it. */
__device__ __forceinline__ sbn_mail_rec_t* team_mailbox(const sbn_coop_args_t& a, int q) {
#if SBN_WINDOW_TRANSPORT
  if (a.win != nullptr) return static_cast<sbn_mail_rec_t*>(sbn_window_peer(a.win, 0, q));
#endif
  return a.mail[q];
}

/* Waits until *flag == k. 0, sbnTimeout (deadline passed), or sbnAborted. */
__device__ int wait_epoch(const uint32_t* flag, uint32_t k, const sbn_coop_args_t& a,
                          uint64_t deadline) {
  for (uint32_t it = 0;; it++) {
    if (ld_acquire_sys(flag) == k) return 0;
    if ((it & 31u) == 31u) {
      /* the flag may have arrived since it was read: a failure elsewhere must not hide
         a success (or this op's own cause) here */
      if (team_failed(a)) return ld_acquire_sys(flag) == k ? 0 : sbnAborted;
      if (globaltimer_ns() > deadline) return ld_acquire_sys(flag) == k ? 0 : sbnTimeout;
      __nanosleep(64);
    }
  }
}

__device__ __forceinline__ uint64_t deadline_after(int64_t timeout_ns) {
  const uint64_t now = globaltimer_ns();
  const uint64_t t = (uint64_t)timeout_ns;
  return now > ~0ull - t ? ~0ull : now + t;
}

__device__ __forceinline__ sbn_welford_t shfl_down_welford(sbn_welford_t w, int off) {
  sbn_welford_t o;
  o.count = __shfl_down_sync(0xffffffffu, w.count, off);
  o.mean = __shfl_down_sync(0xffffffffu, w.mean, off);
  o.m2 = __shfl_down_sync(0xffffffffu, w.m2, off);
  return o;
}

/* ---- the geometry of one rank's work -------------------------------------------------- */
struct Geo {
  int64_t rows;  /* n * spatial */
  int64_t c;
  int64_t sp;
  int ngroups;   /* channel groups */
  int P;         /* slices per group */
  int units;     /* ngroups * P */
  int nchunks;   /* mailbox records of this op: ceil(c / 32) */
};

template <bool TILE>
__device__ Geo make_geo(const sbn_coop_args_t& a, const sbn_coop_rank_t& R) {
  Geo g;
  g.c = a.c;
  g.sp = R.spatial;
  g.rows = R.n * R.spatial;
  g.nchunks = (int)((a.c + kChunk - 1) / kChunk);
  g.ngroups = TILE ? g.nchunks : (int)a.c;
  g.P = a.G > g.ngroups ? a.G / g.ngroups : 1;
  g.units = g.ngroups * g.P;
  return g;
}

__device__ __forceinline__ void slice_rows(const Geo& g, int p, int64_t* r0, int64_t* r1) {
  *r0 = g.rows * p / g.P;
  *r1 = g.rows * (p + 1) / g.P;
}

/* Walks rows r = r0 + first, r0 + first + step, ... < r1 of channel c in a plane layout,
   calling f(element index). Keeps (n, s) incrementally: no division per element. */
template <typename F>
__device__ __forceinline__ void plane_walk(const Geo& g, int64_t c, int64_t r0, int64_t r1,
                                           int first, int step, F f) {
  int64_t r = r0 + first;
  if (r >= r1) return;
  int64_t n = r / g.sp, s = r - n * g.sp;
  const int64_t dn = step / g.sp, ds = step - dn * g.sp;
  for (; r < r1; r += step) {
    f((n * g.c + c) * g.sp + s);
    s += ds;
    n += dn;
    if (s >= g.sp) {
      s -= g.sp;
      n++;
    }
  }
}

/* ---- per-channel arithmetic of a run of elements -------------------------------------- */
struct WelfordRun {
  sbn_welford_t total, run;
  __device__ WelfordRun() : total(sbn_welford_empty()), run(sbn_welford_empty()) {}
  __device__ __forceinline__ void push(float v) {
    sbn_welford_push(&run, v);
    if (run.count == (float)kRun) {
      total = sbn_welford_merge(total, run);
      run = sbn_welford_empty();
    }
  }
  __device__ __forceinline__ sbn_welford_t result() const { return sbn_welford_merge(total, run); }
};

struct SumsRun {
  sbn_bwd_sums_t total, run;
  int fill;
  __device__ SumsRun() : fill(0) { total.sum_dy = total.sum_dy_xmu = run.sum_dy = run.sum_dy_xmu = 0.0f; }
  __device__ __forceinline__ void push(float dy, float xmu) {
    run.sum_dy += dy;
    run.sum_dy_xmu += SBN_MUL(dy, xmu);
    if (++fill == kRun) {
      total = sbn_bwd_sums_merge(total, run);
      run.sum_dy = run.sum_dy_xmu = 0.0f;
      fill = 0;
    }
  }
  __device__ __forceinline__ sbn_bwd_sums_t result() const { return sbn_bwd_sums_merge(total, run); }
};

/* Shared memory of a block. */
struct Smem {
  union {
    sbn_welford_t w[kWarps][kChunk];
    sbn_bwd_sums_t s[kWarps][kChunk];
  } red;
  float coef[kChunk][4]; /* fwd: mean, mean_lo, scale, bias; bwd: sbn_bwd_coef_t */
  float extra[kChunk][3]; /* fwd: invstd, var_unbiased; bwd: dweight, dbias */
  int64_t m;
  int64_t nbt_before;
  uint32_t k;
  int status;
};

/* ---- stage 1 ---------------------------------------------------------------------------- */
template <int DT, bool TILE>
__device__ void fwd_stage1(const sbn_coop_rank_t& R, const Geo& g, int unit, Smem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int grp = unit % g.ngroups, p = unit / g.ngroups;
  int64_t r0, r1;
  slice_rows(g, p, &r0, &r1);
  float* part = R.part;
  float* shifts = R.part + (size_t)kRec * g.units * (TILE ? kChunk : 1);
  if (TILE) {
    const int64_t c = (int64_t)grp * kChunk + lane;
    const bool active = c < g.c;
    float shift = active && g.rows > 0 ? Elem<DT>::load(R.x, c) : 0.0f;
    WelfordRun acc;
    if (active)
      for (int64_t r = r0 + w; r < r1; r += kWarps) acc.push(Elem<DT>::load(R.x, r * g.c + c) - shift);
    sm.red.w[w][lane] = acc.result();
    __syncthreads();
    if (w == 0 && active) {
      sbn_welford_t t = sm.red.w[0][lane];
      for (int q = 1; q < kWarps; q++) t = sbn_welford_merge(t, sm.red.w[q][lane]);
      float* e = part + kRec * ((int64_t)p * g.c + c);
      e[0] = t.count, e[1] = t.mean, e[2] = t.m2;
      if (p == 0) shifts[c] = shift;
    }
    __syncthreads();
  } else {
    const int64_t c = grp;
    float shift = g.rows > 0 ? Elem<DT>::load(R.x, c * g.sp) : 0.0f;
    WelfordRun acc;
    plane_walk(g, c, r0, r1, tid, kThreads,
               [&](int64_t i) { acc.push(Elem<DT>::load(R.x, i) - shift); });
    sbn_welford_t t = acc.result();
    for (int off = 16; off > 0; off >>= 1) t = sbn_welford_merge(t, shfl_down_welford(t, off));
    if (lane == 0) sm.red.w[w][0] = t;
    __syncthreads();
    if (tid == 0) {
      t = sm.red.w[0][0];
      for (int q = 1; q < kWarps; q++) t = sbn_welford_merge(t, sm.red.w[q][0]);
      float* e = part + kRec * ((int64_t)p * g.c + c);
      e[0] = t.count, e[1] = t.mean, e[2] = t.m2;
      if (p == 0) shifts[c] = shift;
    }
    __syncthreads();
  }
}

template <int DT, bool TILE>
__device__ void bwd_stage1(const sbn_coop_rank_t& R, const Geo& g, int unit, Smem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int grp = unit % g.ngroups, p = unit / g.ngroups;
  int64_t r0, r1;
  slice_rows(g, p, &r0, &r1);
  if (TILE) {
    const int64_t c = (int64_t)grp * kChunk + lane;
    const bool active = c < g.c;
    SumsRun acc;
    if (active) {
      const float mean = R.save_mean_in[c];
      for (int64_t r = r0 + w; r < r1; r += kWarps) {
        int64_t i = r * g.c + c;
        acc.push(Elem<DT>::load(R.dy, i), Elem<DT>::load(R.x, i) - mean);
      }
    }
    sm.red.s[w][lane] = acc.result();
    __syncthreads();
    if (w == 0 && active) {
      sbn_bwd_sums_t t = sm.red.s[0][lane];
      for (int q = 1; q < kWarps; q++) t = sbn_bwd_sums_merge(t, sm.red.s[q][lane]);
      float* e = R.part + kRec * ((int64_t)p * g.c + c);
      e[0] = t.sum_dy, e[1] = t.sum_dy_xmu;
    }
    __syncthreads();
  } else {
    const int64_t c = grp;
    const float mean = R.save_mean_in[c];
    SumsRun acc;
    plane_walk(g, c, r0, r1, tid, kThreads, [&](int64_t i) {
      acc.push(Elem<DT>::load(R.dy, i), Elem<DT>::load(R.x, i) - mean);
    });
    sbn_bwd_sums_t t = acc.result();
    for (int off = 16; off > 0; off >>= 1) {
      sbn_bwd_sums_t o;
      o.sum_dy = __shfl_down_sync(0xffffffffu, t.sum_dy, off);
      o.sum_dy_xmu = __shfl_down_sync(0xffffffffu, t.sum_dy_xmu, off);
      t = sbn_bwd_sums_merge(t, o);
    }
    if (lane == 0) sm.red.s[w][0] = t;
    __syncthreads();
    if (tid == 0) {
      t = sm.red.s[0][0];
      for (int q = 1; q < kWarps; q++) t = sbn_bwd_sums_merge(t, sm.red.s[q][0]);
      float* e = R.part + kRec * ((int64_t)p * g.c + c);
      e[0] = t.sum_dy, e[1] = t.sum_dy_xmu;
    }
    __syncthreads();
  }
}

/* ---- stage 3: merge a chunk over the slices and push it to every rank ------------------ */
/* Warp 0: this rank's record of chunk j into every rank's mailbox, then the flags. */
__device__ __forceinline__ void publish_push(const sbn_coop_args_t& a, const sbn_coop_rank_t& R,
                                             const Geo& g, int j, uint32_t k, float v0,
                                             float v1, float v2) {
  const int lane = threadIdx.x & 31;
  const int64_t idx = sbn_mail_index(R.rank, k, j, a.nchunks_max);
  for (int dst = 0; dst < a.nranks; dst++) {
    sbn_mail_rec_t* rec = team_mailbox(a, dst) + idx;
    rec->data[kRec * lane] = v0;
    rec->data[kRec * lane + 1] = v1;
    rec->data[kRec * lane + 2] = v2;
    if (lane == 0) {
      rec->sig = a.sig;
      rec->count = R.n * g.sp;
    }
  }
  __syncwarp();
  if (lane == 0) {
    __threadfence_system(); /* the warp's data (ordered by __syncwarp) before the flags */
    for (int dst = 0; dst < a.nranks; dst++) st_relaxed_sys(&(team_mailbox(a, dst) + idx)->epoch, k);
  }
}

/* HOST: the merged record goes to the rank's own `send` only (the next launch or the
   collective moves it), no flags. */
template <int KIND, bool TILE, bool HOST>
__device__ void publish_chunk(const sbn_coop_args_t& a, const sbn_coop_rank_t& R, const Geo& g,
                              int j, uint32_t k, Smem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int64_t c = (int64_t)j * kChunk + lane;
  const bool active = c < g.c;
  if (KIND == SBN_GPU_FWD) {
    sbn_welford_t t = sbn_welford_empty();
    if (active)
      for (int p = w; p < g.P; p += kWarps) {
        const float* e = R.part + kRec * ((int64_t)p * g.c + c);
        sbn_welford_t o = {e[0], e[1], e[2]};
        t = sbn_welford_merge(t, o);
      }
    sm.red.w[w][lane] = t;
  } else {
    sbn_bwd_sums_t t = {0.0f, 0.0f};
    if (active)
      for (int p = w; p < g.P; p += kWarps) {
        const float* e = R.part + kRec * ((int64_t)p * g.c + c);
        sbn_bwd_sums_t o = {e[0], e[1]};
        t = sbn_bwd_sums_merge(t, o);
      }
    sm.red.s[w][lane] = t;
  }
  __syncthreads();
  if (w == 0) {
    float v0 = 0.0f, v1 = 0.0f, v2 = 0.0f;
    if (active && KIND == SBN_GPU_FWD) {
      sbn_welford_t t = sm.red.w[0][lane];
      for (int q = 1; q < kWarps; q++) t = sbn_welford_merge(t, sm.red.w[q][lane]);
      const float* shifts = R.part + (size_t)kRec * g.units * (TILE ? kChunk : 1);
      sbn_partial_t pt = sbn_partial_from_shifted(t, shifts[c]);
      v0 = pt.mean_hi, v1 = pt.mean_lo, v2 = pt.m2;
    } else if (active) {
      sbn_bwd_sums_t t = sm.red.s[0][lane];
      for (int q = 1; q < kWarps; q++) t = sbn_bwd_sums_merge(t, sm.red.s[q][lane]);
      v0 = t.sum_dy, v1 = t.sum_dy_xmu;
    }
    if (HOST) {
      sbn_mail_rec_t* rec = R.send + j;
      rec->data[kRec * lane] = v0;
      rec->data[kRec * lane + 1] = v1;
      rec->data[kRec * lane + 2] = v2;
      if (lane == 0) {
        rec->epoch = 0u;
        rec->sig = a.sig;
        rec->count = R.n * g.sp;
      }
    } else {
      publish_push(a, R, g, j, k, v0, v1, v2);
    }
  }
  __syncthreads();
}

/* ---- stage 4: wait for every rank's record of chunk j, merge in rank order ------------- */
/* Rank q's record of chunk j as this rank reads it. */
template <bool HOST>
__device__ __forceinline__ const sbn_mail_rec_t* rec_of(const sbn_coop_args_t& a,
                                                       const sbn_coop_rank_t& R, int q,
                                                       uint32_t k, int j) {
  return R.mail + (HOST ? sbn_host_index(q, j, a.nchunks_max) : sbn_mail_index(q, k, j, a.nchunks_max));
}

/* Warp 0 only. Returns 0 or an sbnResult_t; fills the per-lane merged values. HOST: the
   records are complete already (the previous launch or the collective wrote them), there
   is nothing to wait for. */
template <int KIND, bool HOST>
__device__ int gather_chunk(const sbn_coop_args_t& a, const sbn_coop_rank_t& R, int j,
                            uint32_t k, uint64_t deadline, int64_t* m_out, float out[3],
                            float mine[2]) {
  const int lane = threadIdx.x & 31;
  /* Chunk 0 first: every op has it, so ranks running ops with different C meet there
     (on the host path too: a rank with fewer chunks left older records behind). */
  for (int q = 0; q < a.nranks; q++) {
    const sbn_mail_rec_t* rec = rec_of<HOST>(a, R, q, k, 0);
    if (!HOST) {
      int st = wait_epoch(&rec->epoch, k, a, deadline);
      if (st) return st;
    }
    if (ld_relaxed_sys_u32(&rec->sig) != a.sig) return sbnInvalidUsage;
  }
  int64_t m = 0;
  sbn_partial_t gp = {0.0f, 0.0f, 0.0f, 0.0f};
  sbn_bwd_sums_t gs = {0.0f, 0.0f};
  for (int q = 0; q < a.nranks; q++) {
    const sbn_mail_rec_t* rec = rec_of<HOST>(a, R, q, k, j);
    if (!HOST && j != 0) {
      int st = wait_epoch(&rec->epoch, k, a, deadline);
      if (st) return st;
    }
    int64_t cnt = ld_relaxed_sys_s64(&rec->count);
    m += cnt;
    float d0 = ld_relaxed_sys_f32(&rec->data[kRec * lane]);
    float d1 = ld_relaxed_sys_f32(&rec->data[kRec * lane + 1]);
    if (KIND == SBN_GPU_FWD) {
      sbn_partial_t pt = {(float)cnt, d0, d1, ld_relaxed_sys_f32(&rec->data[kRec * lane + 2])};
      gp = sbn_partial_merge(gp, pt);
    } else {
      sbn_bwd_sums_t s = {d0, d1};
      gs = sbn_bwd_sums_merge(gs, s);
      if (q == R.rank) mine[0] = d0, mine[1] = d1;
    }
  }
  *m_out = m;
  if (KIND == SBN_GPU_FWD) {
    out[0] = gp.mean_hi, out[1] = gp.mean_lo, out[2] = gp.m2;
    if (m == 1) return sbnInvalidArgument;
  } else {
    out[0] = gs.sum_dy, out[1] = gs.sum_dy_xmu;
  }
  return 0;
}

/* ---- stage 4 + 5 of one unit ------------------------------------------------------------- */
template <int KIND, int DT, bool TILE, bool HOST>
__device__ int finish_unit(const sbn_coop_args_t& a, const sbn_coop_rank_t& R, const Geo& g,
                           int unit, uint32_t k, uint64_t deadline, Smem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int grp = unit % g.ngroups, p = unit / g.ngroups;
  const int64_t c0 = TILE ? (int64_t)grp * kChunk : grp;
  const int cw = TILE ? (int)(g.c - c0 < kChunk ? g.c - c0 : kChunk) : 1;
  const int j = (int)(c0 / kChunk);
  const int lane_c = TILE ? lane : (int)(c0 % kChunk); /* this unit's channel's lane */
  if (w == 0) {
    float v[3] = {0.0f, 0.0f, 0.0f}, mine[2] = {0.0f, 0.0f};
    int64_t m = 0;
    int st = gather_chunk<KIND, HOST>(a, R, j, k, deadline, &m, v, mine);
    /* lanes wait on their own: if any lane failed (its deadline, an error word seen), the
       whole unit fails, so no lane uses coefficients another lane did not compute */
    const unsigned cause = __reduce_max_sync(0xffffffffu, st == sbnAborted ? 0u : (unsigned)st);
    const unsigned any = __reduce_max_sync(0xffffffffu, (unsigned)st);
    st = (int)(cause ? cause : any); /* a cause (mismatch, count 1, timeout) over sbnAborted */
    const int slot = TILE ? lane : 0;
    const int64_t c = (int64_t)j * kChunk + lane;
    if (st == 0 && (TILE ? lane < cw : lane == lane_c)) {
      if (KIND == SBN_GPU_FWD) {
        sbn_partial_t gp = {(float)m, v[0], v[1], v[2]};
        sbn_stats_t s = sbn_stats_finalize(gp, m, R.eps);
        sm.coef[slot][0] = s.mean;
        sm.coef[slot][1] = s.mean_lo;
        sm.coef[slot][2] = sbn_scale(R.weight ? R.weight[c] : 1.0f, s.invstd);
        sm.coef[slot][3] = R.bias ? R.bias[c] : 0.0f;
        sm.extra[slot][0] = s.invstd;
        sm.extra[slot][1] = s.var_unbiased;
      } else {
        const float invstd = R.save_invstd[c];
        sbn_bwd_coef_t kc = sbn_backward_coefficients(v[0], v[1], m, R.save_mean_in[c], invstd,
                                                      R.weight ? R.weight[c] : 1.0f);
        sm.coef[slot][0] = kc.mean;
        sm.coef[slot][1] = kc.mean_dy;
        sm.coef[slot][2] = kc.xmu_scale;
        sm.coef[slot][3] = kc.scale;
        const float sdy = R.grad_global ? v[0] : mine[0];
        const float sdx = R.grad_global ? v[1] : mine[1];
        sm.extra[slot][0] = sbn_dweight(sdx, invstd);
        sm.extra[slot][1] = sdy;
      }
    }
    if (lane == 0) {
      sm.status = st;
      sm.m = m;
    }
  }
  __syncthreads();
  const int st = sm.status;
  if (st != 0) return st;

  /* per-channel outputs: the unit's slice-0 block */
  if (p == 0 && w == 0 && lane < cw) {
    const int slot = TILE ? lane : 0;
    const int64_t c = c0 + lane;
    if (KIND == SBN_GPU_FWD) {
      R.save_mean[c] = sm.coef[slot][0];
      R.save_invstd[c] = sm.extra[slot][0];
      if (R.running_mean != nullptr && sm.m > 0) {
        float f = sbn_momentum_factor(R.momentum, sm.nbt_before);
        R.running_mean[c] = sbn_running_update(R.running_mean[c], sm.coef[slot][0], f);
        R.running_var[c] = sbn_running_update(R.running_var[c], sm.extra[slot][1], f);
      }
      if (R.nbt != nullptr && c == 0) *R.nbt = sm.nbt_before + 1;
    } else {
      if (R.dweight != nullptr) R.dweight[c] = sm.extra[slot][0];
      if (R.dbias != nullptr) R.dbias[c] = sm.extra[slot][1];
    }
  }

  /* stage 5: the unit's elements */
  if (g.rows == 0 || R.out == nullptr) return 0;
  int64_t r0, r1;
  slice_rows(g, p, &r0, &r1);
  if (TILE) {
    if (lane >= cw) return 0;
    const int64_t c = c0 + lane;
    const float k0 = sm.coef[lane][0], k1 = sm.coef[lane][1], k2 = sm.coef[lane][2],
                k3 = sm.coef[lane][3];
    for (int64_t r = r0 + w; r < r1; r += kWarps) {
      const int64_t i = r * g.c + c;
      float xv = Elem<DT>::load(R.x, i), o;
      if (KIND == SBN_GPU_FWD) {
        o = sbn_forward_y(xv, k0, k1, k2, k3);
      } else {
        sbn_bwd_coef_t kc = {k0, k1, k2, k3};
        o = sbn_backward_dx(kc, xv, Elem<DT>::load(R.dy, i));
      }
      Elem<DT>::store(R.out, i, o);
    }
  } else {
    const float k0 = sm.coef[0][0], k1 = sm.coef[0][1], k2 = sm.coef[0][2], k3 = sm.coef[0][3];
    plane_walk(g, c0, r0, r1, tid, kThreads, [&](int64_t i) {
      float xv = Elem<DT>::load(R.x, i), o;
      if (KIND == SBN_GPU_FWD) {
        o = sbn_forward_y(xv, k0, k1, k2, k3);
      } else {
        sbn_bwd_coef_t kc = {k0, k1, k2, k3};
        o = sbn_backward_dx(kc, xv, Elem<DT>::load(R.dy, i));
      }
      Elem<DT>::store(R.out, i, o);
    });
  }
  return 0;
}

/* ---- the kernel ----------------------------------------------------------------------- */
template <int KIND, int DT, bool TILE>
__global__ void __launch_bounds__(kThreads)
    sbn_coop_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  const int slot = blockIdx.x / a.G, b = blockIdx.x % a.G;
  const sbn_coop_rank_t& R = a.r[slot];
  const Geo g = make_geo<TILE>(a, R);

  if (threadIdx.x == 0) {
    sm.k = R.state->epoch + 1u;
    sm.nbt_before = (KIND == SBN_GPU_FWD && R.nbt != nullptr) ? *R.nbt : 0;
  }
  /* The team's error words (mapped host memory): loaded now, looked at after stage 1, so
     the PCIe round trip overlaps the reduction. A kernel queued behind a failure (or
     replayed from a graph after sbnCommAbort) publishes nothing: after a failure some
     peer may not have finished reading this rank's previous records, so the double
     buffering no longer protects them. */
  const int err_seen = failed_seen(a);
  __syncthreads();
  const uint32_t k = sm.k;

  /* stage 1 */
  for (int u = b; u < g.units; u += a.G) {
    if (KIND == SBN_GPU_FWD)
      fwd_stage1<DT, TILE>(R, g, u, sm);
    else
      bwd_stage1<DT, TILE>(R, g, u, sm);
  }
  const bool failed_before = __syncthreads_or(err_seen != 0) != 0;
  /* stage 2: every block read the epoch (and nbt) above, so block 0 may advance it */
  const uint64_t deadline = deadline_after(a.timeout_ns);
  if (!rank_barrier(&R.state->barrier, a.G, b == 0, deadline)) {
    if (threadIdx.x == 0) record_error(a, R.rank, sbnTimeout);
    return;
  }
  if (failed_before) {
    if (threadIdx.x == 0) record_error(a, R.rank, sbnAborted);
    return;
  }
  if (b == 0 && threadIdx.x == 0) R.state->epoch = k;

  /* stage 3 */
  for (int j = b; j < g.nchunks; j += a.G) publish_chunk<KIND, TILE, false>(a, R, g, j, k, sm);

  /* stage 4 + 5 */
  for (int u = b; u < g.units; u += a.G) {
    int st = finish_unit<KIND, DT, TILE, false>(a, R, g, u, k, deadline, sm);
    if (st != 0) {
      if (threadIdx.x == 0) record_error(a, R.rank, st);
      return;
    }
    __syncthreads(); /* sm.coef is reused by the next unit */
  }
}

/* ---- the host-driven path (SBN_ALGO=nccl): the same stages as ordinary launches --------- */
/* See coop_args.h (SBN_HOST_*). Launch slot s owns blocks [s*G, (s+1)*G) of STATS and
   APPLY and [s*nchunks, (s+1)*nchunks) of PUBLISH. Ordered by the stream (and by the
   collective between PUBLISH and APPLY), so no epochs and no waits. */
template <int KIND, int DT, bool TILE>
__global__ void __launch_bounds__(kThreads)
    sbn_host_stats_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  const int slot = blockIdx.x / a.G, b = blockIdx.x % a.G;
  const sbn_coop_rank_t& R = a.r[slot];
  const Geo g = make_geo<TILE>(a, R);
  /* APPLY writes nbt + 1 from one block while others use nbt for the momentum factor:
     they all read this copy instead */
  if (KIND == SBN_GPU_FWD && b == 0 && threadIdx.x == 0)
    R.state->nbt_snap = R.nbt != nullptr ? *R.nbt : 0;
  for (int u = b; u < g.units; u += a.G) {
    if (KIND == SBN_GPU_FWD)
      fwd_stage1<DT, TILE>(R, g, u, sm);
    else
      bwd_stage1<DT, TILE>(R, g, u, sm);
  }
}

template <int KIND, bool TILE>
__global__ void __launch_bounds__(kThreads)
    sbn_host_publish_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  const int nchunks = (int)((a.c + kChunk - 1) / kChunk);
  const int slot = blockIdx.x / nchunks, j = blockIdx.x % nchunks;
  const sbn_coop_rank_t& R = a.r[slot];
  const Geo g = make_geo<TILE>(a, R);
  publish_chunk<KIND, TILE, true>(a, R, g, j, 0u, sm);
}

/* Block (slot, src): rank src's records of this op into launch slot's gathered records. */
__global__ void __launch_bounds__(kThreads)
    sbn_host_gather_kernel(const __grid_constant__ sbn_coop_args_t a) {
  const int nchunks = (int)((a.c + kChunk - 1) / kChunk);
  const int slot = blockIdx.x / a.nranks, src = blockIdx.x % a.nranks;
  const uint32_t* from = reinterpret_cast<const uint32_t*>(a.mail[src]);
  uint32_t* to = reinterpret_cast<uint32_t*>(a.r[slot].mail + sbn_host_index(src, 0, a.nchunks_max));
  const int64_t words = (int64_t)nchunks * (int64_t)(sizeof(sbn_mail_rec_t) / 4);
  for (int64_t i = threadIdx.x; i < words; i += kThreads) to[i] = from[i];
}

template <int KIND, int DT, bool TILE>
__global__ void __launch_bounds__(kThreads)
    sbn_host_apply_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  const int slot = blockIdx.x / a.G, b = blockIdx.x % a.G;
  const sbn_coop_rank_t& R = a.r[slot];
  const Geo g = make_geo<TILE>(a, R);
  if (threadIdx.x == 0)
    sm.nbt_before = (KIND == SBN_GPU_FWD && R.nbt != nullptr) ? R.state->nbt_snap : 0;
  /* queued behind a failure of the team (or after sbnCommAbort): write nothing */
  if (__syncthreads_or(failed_seen(a))) {
    if (threadIdx.x == 0) record_error(a, R.rank, sbnAborted);
    return;
  }
  for (int u = b; u < g.units; u += a.G) {
    int st = finish_unit<KIND, DT, TILE, true>(a, R, g, u, 0u, 0u, sm);
    if (st != 0) {
      if (threadIdx.x == 0) record_error(a, R.rank, st);
      return;
    }
    __syncthreads();
  }
}

/* The kernel of a host-path stage for (kind, dtype, tile), as an untyped pointer. */
template <int KIND, int DT, bool TILE>
const void* host_stage_ptr(int stage) {
  switch (stage) {
    case SBN_HOST_STATS: return (const void*)sbn_host_stats_kernel<KIND, DT, TILE>;
    case SBN_HOST_PUBLISH: return (const void*)sbn_host_publish_kernel<KIND, TILE>;
    case SBN_HOST_GATHER: return (const void*)sbn_host_gather_kernel;
    default: return (const void*)sbn_host_apply_kernel<KIND, DT, TILE>;
  }
}
template <int KIND, int DT>
const void* host_pick_tile(int stage, int tile) {
  return tile ? host_stage_ptr<KIND, DT, true>(stage) : host_stage_ptr<KIND, DT, false>(stage);
}
template <int KIND>
const void* host_pick_dtype(int stage, int dtype, int tile) {
  switch (dtype) {
    case sbnFloat32: return host_pick_tile<KIND, sbnFloat32>(stage, tile);
    case sbnFloat16: return host_pick_tile<KIND, sbnFloat16>(stage, tile);
    case sbnBFloat16: return host_pick_tile<KIND, sbnBFloat16>(stage, tile);
  }
  return nullptr;
}

#ifndef SBN_COOP_EMU
/* ---- inference: one elementwise kernel --------------------------------------------------- */
template <int DT>
__global__ void sbn_inference_kernel(const void* x, void* y, const float* weight,
                                     const float* bias, const float* rm, const float* rv,
                                     float eps, int64_t numel, int64_t c, int64_t sp, int nhwc) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < numel;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t ci = nhwc ? i % c : (i / sp) % c;
    const float scale = sbn_scale(weight ? weight[ci] : 1.0f, sbn_invstd(rv[ci], eps));
    const float v = sbn_forward_y(Elem<DT>::load(x, i), rm[ci], 0.0f, scale, bias ? bias[ci] : 0.0f);
    Elem<DT>::store(y, i, v);
  }
}

#if SBN_WINDOW_TRANSPORT
/* sbnCommAbort on an NCCL team: the rank's failure word in every rank's window, so that
   the other processes' waiting kernels return now rather than at their timeout. */
__global__ void sbn_notify_kernel(const __grid_constant__ sbn_coop_args_t a, int rank, int code) {
  if (threadIdx.x == 0 && blockIdx.x == 0) push_failure(a, rank, code);
}
#endif

template <int KIND, int DT>
const void* pick_tile(int tile) {
  return tile ? (const void*)sbn_coop_kernel<KIND, DT, true>
              : (const void*)sbn_coop_kernel<KIND, DT, false>;
}
template <int KIND>
const void* pick_dtype(int dtype, int tile) {
  switch (dtype) {
    case sbnFloat32: return pick_tile<KIND, sbnFloat32>(tile);
    case sbnFloat16: return pick_tile<KIND, sbnFloat16>(tile);
    case sbnBFloat16: return pick_tile<KIND, sbnBFloat16>(tile);
  }
  return nullptr;
}

#endif /* !SBN_COOP_EMU */
}  // namespace
#ifndef SBN_COOP_EMU

/* The host side (src/gpu/) launches these with cudaLaunchKernelEx. */
extern "C" __attribute__((visibility("hidden"))) const void* sbn_coop_kernel_ptr(int kind,
                                                                                  int dtype,
                                                                                  int tile) {
  return kind == SBN_GPU_FWD ? pick_dtype<SBN_GPU_FWD>(dtype, tile)
                             : pick_dtype<SBN_GPU_BWD>(dtype, tile);
}

extern "C" __attribute__((visibility("hidden"))) const void* sbn_host_kernel_ptr(int stage,
                                                                                  int kind,
                                                                                  int dtype,
                                                                                  int tile) {
  return kind == SBN_GPU_FWD ? host_pick_dtype<SBN_GPU_FWD>(stage, dtype, tile)
                             : host_pick_dtype<SBN_GPU_BWD>(stage, dtype, tile);
}

#if SBN_WINDOW_TRANSPORT
/* Ranks of comm's load/store-accessible (NVLink) team: nccl_device/core.h is C++ only. */
extern "C" __attribute__((visibility("hidden"))) int sbn_nccl_lsa_size(void* comm) {
  return ncclTeamLsa(static_cast<ncclComm_t>(comm)).nRanks;
}

/* One thread: rank `rank` of the window's team failed with `code` (src/gpu/nccl_team.c). */
extern "C" __attribute__((visibility("hidden"))) cudaError_t sbn_gpu_notify_launch(
    const void* win, int64_t fail_off, int rank, int nranks, int code, cudaStream_t stream) {
  sbn_coop_args_t a;
  memset(&a, 0, sizeof a);
  a.win = win;
  a.fail_off = fail_off;
  a.nranks = nranks;
  void* args[] = {(void*)&a, (void*)&rank, (void*)&code};
  return cudaLaunchKernel((const void*)sbn_notify_kernel, dim3(1), dim3(32), args, 0, stream);
}
#endif

extern "C" __attribute__((visibility("hidden"))) cudaError_t sbn_gpu_inference_launch(
    int dtype, int nhwc, const void* x, void* y, const float* weight, const float* bias,
    const float* rm, const float* rv, float eps, int64_t n, int64_t c, int64_t sp,
    cudaStream_t stream) {
  const int64_t numel = n * c * sp;
  if (numel == 0) return cudaSuccess;
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  int64_t blocks = (numel + 255) / 256;
  if (blocks > (int64_t)sms * 8) blocks = (int64_t)sms * 8;
  const void* fn = dtype == sbnFloat32   ? (const void*)sbn_inference_kernel<sbnFloat32>
                   : dtype == sbnFloat16 ? (const void*)sbn_inference_kernel<sbnFloat16>
                                         : (const void*)sbn_inference_kernel<sbnBFloat16>;
  void* args[] = {(void*)&x,  (void*)&y,     (void*)&weight, (void*)&bias, (void*)&rm, (void*)&rv,
                  (void*)&eps, (void*)&numel, (void*)&c,      (void*)&sp,   (void*)&nhwc};
  /* cudaLaunchKernel returns this launch's error, not an earlier one of the caller's */
  return cudaLaunchKernel(fn, dim3((unsigned)blocks), dim3(256), args, 0, stream);
}
#endif /* !SBN_COOP_EMU */
