/* coop.cu — the cooperative SyncBN kernels: forward and backward are each ONE kernel per
 * launch, with the cross-rank exchange inside it (DESIGN.md, "The forward kernel"); the
 * host-driven path's kernels (SBN_ALGO=nccl); the inference kernel.
 *
 * A launch runs `nlaunch` ranks (all W of a virtual team, or the one rank of this GPU);
 * rank slot s owns blocks [s*G, (s+1)*G). Per rank:
 *   stage 1: the rank's blocks reduce their units (coop_plan.h) into per-(slice, channel)
 *            partials in the rank's workspace: forward (count, mean_hi, mean_lo, m2),
 *            backward (sum dy, sum dy*(x - mean)); fixed orders only;
 *   stage 2: rank-local barrier over the rank's G blocks (co-resident: cooperative launch);
 *   stage 3: each chunk of 32 channels is merged over the slices in slice order by one
 *            block and PUSHED into every rank's mailbox: data, then the record's epoch
 *            with a release store (the ONE exchange of the op);
 *   stage 4: for every unit it owns, a block waits (relaxed polls and one acquire,
 *            bounded by the timeout via %globaltimer, abortable) until every rank's record
 *            of the unit's chunk carries this op's epoch, checks they all run the same op,
 *            merges the ranks' entries in RANK ORDER (the same bits on every rank), and
 *            finalizes;
 *   stage 5: normalize (y or dx) the unit's elements; the unit's slice-0 block writes the
 *            per-channel outputs (save stats, running stats, dweight/dbias).
 * Stages 1 and 5 come in three variants (coop_plan.h): onchip (x, and dy, held in
 * registers and shared memory between them: each crosses HBM once), stream (16-byte
 * loads again in stage 5), legacy (the first kernel: coop_legacy.cuh). Stages 2-4 are
 * the same for all (coop_exchange.cuh).
 * Nothing is written to the caller's outputs before stage 4 succeeded, so an op mismatch
 * or a global count of 1 leaves them untouched; on a timeout the blocks that timed out
 * write nothing (others may have finished their units).
 *
 * Epochs: each rank's op counter lives in device memory; every block reads it before the
 * rank-local barrier and block 0 advances it after, so nothing comes from the host and a
 * captured CUDA graph replays correctly. Mailbox records are double-buffered by epoch
 * parity: a rank overwrites parity p at op k+2 only after all ranks published op k+1,
 * which each did only after its previous kernel (op k) had finished reading.
 *
 * Errors: a wait that passes the deadline, or sees an error word set (another rank's
 * failure, sbnCommAbort), makes the block write its rank's error word (mapped host memory,
 * read by sbnCommGetAsyncError) and return. No __trap: the context stays usable. A
 * kernel queued behind a failure (or replayed after sbnCommAbort) publishes nothing: its
 * publishing blocks read the failure words at their start and look at them before they
 * publish (after a failure some peer may not have finished reading this rank's previous
 * records, so the double buffering no longer protects them).
 */
#ifndef SBN_COOP_EMU
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <string.h>
#define SBN_SHARED(type, name) __shared__ type name
#define SBN_DYN_SHARED(type, name) extern __shared__ type name[]
#else
/* tests/emu/: the kernels run on CPU threads for logic tests in CI; cuda_emu.h provides
   the CUDA built-ins used here, SBN_SHARED and SBN_DYN_SHARED per emulated block, and the
   memory primitives of coop_mem.cuh (counting the bytes of the caller's tensors) */
#include "bn_dtype.h"
#endif

#include "bn_math.h"
#include "coop_args.h"
#include "coop_plan.h"
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

/* Loops over a batch's positions and elements are unrolled (registers are indexed by
   compile-time constants only); the emulation's compiler need not. */
#ifdef __CUDACC__
#define SBN_UNROLL _Pragma("unroll")
#else
#define SBN_UNROLL
#endif

namespace {

constexpr int kThreads = SBN_GPU_THREADS;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = SBN_GPU_CHUNK;
constexpr int kRec = SBN_GPU_REC_FLOATS;
static_assert(kThreads == 256 && kChunk == 32, "the units' thread layouts assume 8 warps of 32");
static_assert(sizeof(sbn_mail_rec_t) % 16 == 0, "mailbox records are 16-byte aligned");
static_assert(SBN_BATCH_FWD * 8 <= 64 && SBN_BATCH_BWD * 8 <= 64, "a batch's masks fit 64 bits");

#include "coop_mem.cuh"
#include "coop_exchange.cuh"
#include "coop_legacy.cuh"
#include "coop_vec.cuh"

/* ---- compile-time limits (nvcc and the emulation's compiler both check them) ---------- */
/* Kernel parameters: the argument blocks are passed by value (__grid_constant__). 4 KB is
   the limit of every CUDA version and architecture (CUDA 12.1+ with a recent driver allows
   32764 bytes on Volta and later); within 4 KB a launch needs neither. */
static_assert(sizeof(sbn_coop_args_t) <= 4096, "the cooperative kernels' arguments exceed 4 KB");
static_assert(sizeof(sbn_infer_args_t) <= 4096, "the inference kernel's arguments exceed 4 KB");
/* Static shared memory (Smem, the legacy stage 1's union included) within the 48 KB a
   block gets without opting in. */
static_assert(sizeof(Smem) <= 48 * 1024, "static shared memory above 48 KB");
/* The onchip kernels: Smem and at least one held batch per thread (backward: x and dy, 32
   bytes a position) within the smallest opt-in limit of the built architectures (sm_80:
   163 KB; sm_90, sm_100: 227 KB). src/gpu/gpu_team.c sizes the held slots from the
   device's own limit at init. */
static_assert(sizeof(Smem) + (size_t)SBN_BATCH_BWD * SBN_GPU_THREADS * 32 <= 163 * 1024,
              "no onchip slot fits in sm_80's shared memory");
/* A partial entry is read as one 16-byte vector (ld_weak_f4): 4 floats, 16-byte aligned
   as the workspace is (cudaMalloc). */
static_assert(SBN_GPU_PART_FLOATS == 4, "a partial entry is one float4");

/* ---- the cooperative kernel ---------------------------------------------------------------- */
template <int KIND, int DT, bool TILE, int VEC, int VAR>
__global__ void __launch_bounds__(kThreads, VAR == SBN_VAR_STREAM ? SBN_STREAM_BLOCKS_PER_SM
                                            : VAR == SBN_VAR_ONCHIP ? SBN_ONCHIP_BLOCKS_PER_SM
                                                                    : 1)
    sbn_coop_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  SBN_DYN_SHARED(uint4, hold_smem); /* onchip: hold_slots batches per thread */
  constexpr bool kLegacy = VAR == SBN_VAR_LEGACY, kOnchip = VAR == SBN_VAR_ONCHIP;
  const int slot = blockIdx.x / a.G, b = blockIdx.x % a.G;
  const sbn_coop_rank_t& R = a.r[slot];
  const sbn_geo_t g = sbn_geo_make(R.n, a.c, R.spatial, TILE, kLegacy ? 1 : VEC, a.G);
  VecPath<KIND, DT, TILE, VEC, kOnchip> path;

  if (threadIdx.x == 0) {
    sm.k = ld_weak_u32(&R.state->epoch) + 1u;
    sm.nbt_before = (KIND == SBN_OP_FORWARD && R.nbt != nullptr) ? *R.nbt : 0;
  }
  /* Blocks that publish load the failure words now (the last warp's lanes, in parallel)
     and look at them after the barrier: the round trip to host memory overlaps stage 1
     and the barrier instead of delaying the barrier. */
  int err_seen = 0;
  if (b < g.nchunks && (int)(threadIdx.x >> 5) == kWarps - 1) err_seen = failure_words_lane(a);
  __syncthreads();
  const uint32_t k = sm.k;

  /* stage 1 */
  if constexpr (kLegacy) {
    for (int u = b; u < g.units; u += a.G) {
      if (KIND == SBN_OP_FORWARD)
        legacy_fwd_stage1<DT, TILE>(R, g, u, sm);
      else
        legacy_bwd_stage1<DT, TILE>(R, g, u, sm);
    }
  } else if (!path.stage1(R, g, b, a.G, hold_smem, a.hold_slots, sm)) {
    /* a plan the onchip kernel cannot hold (never from the library's plan): the other
       blocks of the rank time out at the barrier; nothing is written */
    if (threadIdx.x == 0) record_error(a, R.rank, sbnInvalidUsage);
    return;
  }
  /* stage 2: every block read the epoch (and nbt) above, so block 0 may advance it */
  const uint64_t deadline = deadline_after(a.timeout_ns);
  if (!rank_barrier(&R.state->barrier, a.G, b == 0, deadline)) {
    if (threadIdx.x == 0) record_error(a, R.rank, sbnTimeout);
    return;
  }
  if (__syncthreads_or(err_seen != 0)) {
    if (threadIdx.x == 0) record_error(a, R.rank, sbnAborted);
    return;
  }
  if (b == 0 && threadIdx.x == 0) st_weak_u32(&R.state->epoch, k);

  /* stage 3 */
  for (int j = b; j < g.nchunks; j += a.G) publish_chunk<KIND, false>(a, R, g, j, k, sm);

  /* stage 4 + 5 */
  int gbase = 0;
  for (int u = b; u < g.units; u += a.G) {
    const int st = finish_coefs<KIND, TILE, false>(a, R, g, u % g.ngroups, u / g.ngroups, k,
                                                   deadline, sm);
    if (st != 0) {
      if (threadIdx.x == 0) record_error(a, R.rank, st);
      return;
    }
    if constexpr (kLegacy) {
      legacy_stage5<KIND, DT, TILE>(R, g, u, sm);
    } else {
      path.stage5_unit(R, g, u, &gbase, hold_smem, sm);
    }
    __syncthreads(); /* sm.coef is reused by the next unit */
  }
}

/* ---- the host-driven path (SBN_ALGO=nccl): the stream variant's stages as launches -------- */
/* See coop_args.h (SBN_HOST_*). Launch slot s owns blocks [s*G, (s+1)*G) of STATS and
   APPLY and [s*nchunks, (s+1)*nchunks) of PUBLISH. Ordered by the stream (and by the
   collective between PUBLISH and APPLY), so no epochs and no waits. */
template <int KIND, int DT, bool TILE, int VEC>
__global__ void __launch_bounds__(kThreads, SBN_STREAM_BLOCKS_PER_SM)
    sbn_host_stats_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  const int slot = blockIdx.x / a.G, b = blockIdx.x % a.G;
  const sbn_coop_rank_t& R = a.r[slot];
  const sbn_geo_t g = sbn_geo_make(R.n, a.c, R.spatial, TILE, VEC, a.G);
  /* APPLY writes nbt + 1 from one block while others use nbt for the momentum factor:
     they all read this copy instead */
  if (KIND == SBN_OP_FORWARD && b == 0 && threadIdx.x == 0)
    R.state->nbt_snap = R.nbt != nullptr ? *R.nbt : 0;
  VecPath<KIND, DT, TILE, VEC, false> path;
  path.stage1(R, g, b, a.G, nullptr, 0, sm);
}

template <int KIND, bool TILE>
__global__ void __launch_bounds__(kThreads)
    sbn_host_publish_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  const int nchunks = (int)((a.c + kChunk - 1) / kChunk);
  const int slot = blockIdx.x / nchunks, j = blockIdx.x % nchunks;
  const sbn_coop_rank_t& R = a.r[slot];
  const sbn_geo_t g = sbn_geo_make(R.n, a.c, R.spatial, TILE, 1, a.G); /* P does not depend on vec */
  publish_chunk<KIND, true>(a, R, g, j, 0u, sm);
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

template <int KIND, int DT, bool TILE, int VEC>
__global__ void __launch_bounds__(kThreads, SBN_STREAM_BLOCKS_PER_SM)
    sbn_host_apply_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  const int slot = blockIdx.x / a.G, b = blockIdx.x % a.G;
  const sbn_coop_rank_t& R = a.r[slot];
  const sbn_geo_t g = sbn_geo_make(R.n, a.c, R.spatial, TILE, VEC, a.G);
  VecPath<KIND, DT, TILE, VEC, false> path;
  if (threadIdx.x == 0)
    sm.nbt_before = (KIND == SBN_OP_FORWARD && R.nbt != nullptr) ? R.state->nbt_snap : 0;
  /* queued behind a failure of the team (or after sbnCommAbort): write nothing */
  int seen = (threadIdx.x >> 5) == 0 ? failure_words_lane(a) : 0;
  if (__syncthreads_or(seen)) {
    if (threadIdx.x == 0) record_error(a, R.rank, sbnAborted);
    return;
  }
  for (int u = b; u < g.units; u += a.G) {
    const int st = finish_coefs<KIND, TILE, true>(a, R, g, u % g.ngroups, u / g.ngroups, 0u, 0u, sm);
    if (st != 0) {
      if (threadIdx.x == 0) record_error(a, R.rank, st);
      return;
    }
    int gb = 0;
    path.stage5_unit(R, g, u, &gb, nullptr, sm);
    __syncthreads();
  }
}

/* ---- inference: one elementwise kernel ------------------------------------------------------ */
/* y = (x - running_mean) * (weight / sqrt(running_var + eps)) + bias, the CPU's formula
   (sbn_forward_y): the same bits. The per-channel scale is computed once per thread and
   channel, not per element; 16-byte vectors (VEC > 1) or single elements; no division
   per element. Tile layouts (NHWC, or spatial == 1): thread t of T keeps the vector
   column t % (C/VEC) and takes rows t / (C/VEC) + k * (T / (C/VEC)) (several columns in
   turn when C/VEC > T). Plane layouts: a group of `group` threads per plane (n, c), the
   plane's vectors masked at its unaligned ends. Four positions in flight per thread. */
constexpr int kInferBatch = 4;

template <int DT, int VEC>
__device__ __forceinline__ void infer_coef(const sbn_infer_args_t& a, int64_t c, float* mean,
                                           float* scale, float* bias) {
  *mean = a.rm[c];
  *scale = sbn_scale(a.weight ? a.weight[c] : 1.0f, sbn_invstd(a.rv[c], a.eps));
  *bias = a.bias ? a.bias[c] : 0.0f;
}

template <int DT, int VEC>
__global__ void __launch_bounds__(kThreads) sbn_infer_tile_kernel(const __grid_constant__ sbn_infer_args_t a) {
  const int64_t T = (int64_t)gridDim.x * kThreads, t = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  const int64_t cv = a.c / VEC, rows = a.n * a.sp;
  const int64_t rstep = T >= cv ? T / cv : 1;
  const int64_t r0 = T >= cv ? t / cv : 0;
  if (r0 >= rstep) return; /* the T % cv threads left over */
  const uint64_t pol = policy_evict_first();
  for (int64_t col = T >= cv ? t % cv : t; col < cv; col += T >= cv ? cv : T) {
    float mean[VEC], scale[VEC], bias[VEC];
SBN_UNROLL
    for (int e = 0; e < VEC; e++) infer_coef<DT, VEC>(a, col * VEC + e, &mean[e], &scale[e], &bias[e]);
    for (int64_t r = r0; r < rows; r += kInferBatch * rstep) {
      uint4 v[kInferBatch];
      unsigned m[kInferBatch];
SBN_UNROLL
      for (int k = 0; k < kInferBatch; k++) {
        m[k] = r + k * rstep < rows ? (1u << VEC) - 1u : 0u;
        v[k] = load_pos<DT, VEC>(a.x, ((r + k * rstep) * cv + col) * VEC, m[k], pol);
      }
SBN_UNROLL
      for (int k = 0; k < kInferBatch; k++) {
SBN_UNROLL
        for (int e = 0; e < VEC; e++)
          elem_set<DT, VEC>(v[k], e, sbn_forward_y(elem_get<DT, VEC>(v[k], e), mean[e], 0.0f,
                                                   scale[e], bias[e]));
        store_pos<DT, VEC>(a.y, ((r + k * rstep) * cv + col) * VEC, m[k], v[k]);
      }
    }
  }
}

template <int DT, int VEC>
__global__ void __launch_bounds__(kThreads) sbn_infer_plane_kernel(const __grid_constant__ sbn_infer_args_t a) {
  const int groups = kThreads / a.group, gi = threadIdx.x / a.group, li = threadIdx.x % a.group;
  const int64_t planes = a.n * a.c;
  const uint64_t pol = policy_evict_first();
  for (int64_t pl = (int64_t)blockIdx.x * groups + gi; pl < planes; pl += (int64_t)gridDim.x * groups) {
    float mean, scale, bias;
    infer_coef<DT, VEC>(a, pl % a.c, &mean, &scale, &bias);
    const int64_t e0 = pl * a.sp, e1 = e0 + a.sp;
    const int64_t first = e0 / VEC, end = (e1 + VEC - 1) / VEC;
    for (int64_t v0 = first + li; v0 < end; v0 += (int64_t)kInferBatch * a.group) {
      uint4 v[kInferBatch];
      unsigned m[kInferBatch];
SBN_UNROLL
      for (int k = 0; k < kInferBatch; k++) {
        const int64_t s = (v0 + (int64_t)k * a.group) * VEC;
        const int lo = (int)(e0 - s > 0 ? e0 - s : 0), hi = (int)(e1 - s < VEC ? e1 - s : VEC);
        m[k] = hi > lo ? ((1u << hi) - 1u) & ~((1u << lo) - 1u) : 0u;
        v[k] = load_pos<DT, VEC>(a.x, s, m[k], pol);
      }
SBN_UNROLL
      for (int k = 0; k < kInferBatch; k++) {
SBN_UNROLL
        for (int e = 0; e < VEC; e++)
          elem_set<DT, VEC>(v[k], e, sbn_forward_y(elem_get<DT, VEC>(v[k], e), mean, 0.0f, scale, bias));
        store_pos<DT, VEC>(a.y, (v0 + (int64_t)k * a.group) * VEC, m[k], v[k]);
      }
    }
  }
}

/* ---- kernel tables ------------------------------------------------------------------------- */
/* vec: 1 for the 16-byte kernels (VEC = 16 / element size), 0 for the scalar ones. */
template <int KIND, int DT, bool TILE>
const void* coop_pick_variant(int vec, int variant) {
  constexpr int V = DT == sbnFloat32 ? 4 : 8;
  switch (variant) {
    case SBN_VAR_LEGACY: return (const void*)sbn_coop_kernel<KIND, DT, TILE, 1, SBN_VAR_LEGACY>;
    case SBN_VAR_ONCHIP: return vec ? (const void*)sbn_coop_kernel<KIND, DT, TILE, V, SBN_VAR_ONCHIP> : nullptr;
    default:
      return vec ? (const void*)sbn_coop_kernel<KIND, DT, TILE, V, SBN_VAR_STREAM>
                 : (const void*)sbn_coop_kernel<KIND, DT, TILE, 1, SBN_VAR_STREAM>;
  }
}
template <int KIND, int DT, bool TILE>
const void* host_pick_stage(int stage, int vec) {
  constexpr int V = DT == sbnFloat32 ? 4 : 8;
  switch (stage) {
    case SBN_HOST_STATS:
      return vec ? (const void*)sbn_host_stats_kernel<KIND, DT, TILE, V>
                 : (const void*)sbn_host_stats_kernel<KIND, DT, TILE, 1>;
    case SBN_HOST_PUBLISH: return (const void*)sbn_host_publish_kernel<KIND, TILE>;
    case SBN_HOST_GATHER: return (const void*)sbn_host_gather_kernel;
    default:
      return vec ? (const void*)sbn_host_apply_kernel<KIND, DT, TILE, V>
                 : (const void*)sbn_host_apply_kernel<KIND, DT, TILE, 1>;
  }
}
/* f(kind, dtype, tile) over the instantiated combinations. */
#define SBN_PICK(fn, kind, dtype, tile, ...)                                                   \
  ((kind) == SBN_OP_FORWARD                                                                     \
       ? ((dtype) == sbnFloat32 ? ((tile) ? fn<SBN_OP_FORWARD, sbnFloat32, true>(__VA_ARGS__)     \
                                          : fn<SBN_OP_FORWARD, sbnFloat32, false>(__VA_ARGS__))   \
          : (dtype) == sbnFloat16 ? ((tile) ? fn<SBN_OP_FORWARD, sbnFloat16, true>(__VA_ARGS__)   \
                                            : fn<SBN_OP_FORWARD, sbnFloat16, false>(__VA_ARGS__)) \
          : ((tile) ? fn<SBN_OP_FORWARD, sbnBFloat16, true>(__VA_ARGS__)                        \
                    : fn<SBN_OP_FORWARD, sbnBFloat16, false>(__VA_ARGS__)))                     \
       : ((dtype) == sbnFloat32 ? ((tile) ? fn<SBN_OP_BACKWARD, sbnFloat32, true>(__VA_ARGS__)     \
                                          : fn<SBN_OP_BACKWARD, sbnFloat32, false>(__VA_ARGS__))   \
          : (dtype) == sbnFloat16 ? ((tile) ? fn<SBN_OP_BACKWARD, sbnFloat16, true>(__VA_ARGS__)   \
                                            : fn<SBN_OP_BACKWARD, sbnFloat16, false>(__VA_ARGS__)) \
          : ((tile) ? fn<SBN_OP_BACKWARD, sbnBFloat16, true>(__VA_ARGS__)                        \
                    : fn<SBN_OP_BACKWARD, sbnBFloat16, false>(__VA_ARGS__))))

const void* infer_pick(int dtype, int tile, int vec) {
#define SBN_INFER(DT)                                                                          \
  (tile ? (vec ? (const void*)sbn_infer_tile_kernel<DT, DT == sbnFloat32 ? 4 : 8>              \
               : (const void*)sbn_infer_tile_kernel<DT, 1>)                                    \
        : (vec ? (const void*)sbn_infer_plane_kernel<DT, DT == sbnFloat32 ? 4 : 8>             \
               : (const void*)sbn_infer_plane_kernel<DT, 1>))
  return dtype == sbnFloat32 ? SBN_INFER(sbnFloat32)
         : dtype == sbnFloat16 ? SBN_INFER(sbnFloat16)
                               : SBN_INFER(sbnBFloat16);
#undef SBN_INFER
}

#if SBN_WINDOW_TRANSPORT && !defined(SBN_COOP_EMU)
/* sbnCommAbort on an NCCL team: the rank's failure word in every rank's window, so that
   the other processes' waiting kernels return now rather than at their timeout. */
__global__ void sbn_notify_kernel(const __grid_constant__ sbn_coop_args_t a, int rank, int code) {
  if (threadIdx.x == 0 && blockIdx.x == 0) push_failure(a, rank, code);
}
#endif

}  // namespace

/* The host side (src/gpu/) and the emulation (tests/emu/) take the kernels from here. */
extern "C" const void* sbn_coop_kernel_ptr(int kind, int dtype, int tile, int vec,
                                                          int variant) {
  return SBN_PICK(coop_pick_variant, kind, dtype, tile, vec, variant);
}

extern "C" const void* sbn_host_kernel_ptr(int stage, int kind, int dtype, int tile,
                                                          int vec) {
  return SBN_PICK(host_pick_stage, kind, dtype, tile, stage, vec);
}

extern "C" const void* sbn_infer_kernel_ptr(int dtype, int tile, int vec) {
  return infer_pick(dtype, tile, vec);
}

/* Threads per plane of the plane inference kernel: a warp for small planes, the block
   for large ones. */
extern "C" int sbn_infer_group(int64_t sp) { return sp >= 2048 ? kThreads : 32; }

#ifndef SBN_COOP_EMU
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
#endif /* !SBN_COOP_EMU */
