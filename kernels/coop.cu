/* coop.cu — the one translation unit of the kernels (nvcc, and tests/emu/ for the CPU
 * emulation): the cooperative kernel (coop_kernel.cuh) over its shared stages
 * (coop_exchange.cuh; stages 1 and 5: coop_vec.cuh), the host-driven
 * path's kernels (host_path.cuh), the inference kernel (infer.cuh); here the limits
 * checked at compile time, the kernel tables the host picks from (one row per dtype of
 * bn_dtype.h's SBN_DTYPES), and the host's entry points.
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
#define SBN_NO_UNROLL _Pragma("unroll 1") /* loops of the failure path: code size is time */
#else
#define SBN_UNROLL
#define SBN_NO_UNROLL
#endif

namespace {

constexpr int kThreads = SBN_GPU_THREADS;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = SBN_GPU_CHUNK;
constexpr int kRec = SBN_GPU_REC_FLOATS;
static_assert(kThreads == 256 && kChunk == 32, "the units' thread layouts assume 8 warps of 32");
static_assert(sizeof(sbn_mail_rec_t) % 16 == 0, "mailbox records are 16-byte aligned");
static_assert(kRec == 4, "a record carries the backward's two compensated sums (Part::out)");
static_assert(SBN_BATCH_FWD * 8 <= 64 && SBN_BATCH_BWD * 8 <= 64, "a batch's masks fit 64 bits");

#include "coop_mem.cuh"
#include "coop_exchange.cuh"
#include "coop_vec.cuh"
#include "coop_kernel.cuh"
#include "coop_unit.cuh"
#include "coop_small.cuh"
#include "host_path.cuh"
#include "infer.cuh"

/* ---- compile-time limits (nvcc and the emulation's compiler both check them) ---------- */
/* Kernel parameters: the argument blocks are passed by value (__grid_constant__). 4 KB is
   the limit of every CUDA version and architecture (CUDA 12.1+ with a recent driver allows
   32764 bytes on Volta and later); within 4 KB a launch needs neither. */
static_assert(sizeof(sbn_coop_args_t) <= 4096, "the cooperative kernels' arguments exceed 4 KB");
static_assert(sizeof(sbn_infer_args_t) <= 4096, "the inference kernel's arguments exceed 4 KB");
/* Static shared memory (Smem) within the 48 KB a
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

/* ---- kernel tables ------------------------------------------------------------------------- */
/* vec: 1 for the 16-byte kernels (VEC = 16 / element size), 0 for the scalar ones. */
/* epi: SBN_EPI_* (coop_args.h: sbn_args_epilogue): the kernels with the epilogue, and the
   in-place backward's, copies of each, so that the plain ops' kernels keep their code and
   registers. A forward never recovers x: SBN_EPI_RECOVER is its SBN_EPI_ACT.
   SBN_PLAIN_KERNELS_ONLY: the plain ops' kernels alone, the others nullptr (check-sass.sh's
   mutant build, which looks at what the mutants do to those, and bench/probe.cu, which
   launches plain ops only: half their compile time). */
#ifdef SBN_PLAIN_KERNELS_ONLY
#define SBN_EPI_BUILT false
#else
#define SBN_EPI_BUILT true
#endif
template <int KIND, int DT, bool TILE, int EPI> const void* coop_pick(int vec, int variant) {
  constexpr int V = kVec<DT>;
  switch (variant) {
    case SBN_VAR_ONCHIP:
      return vec ? (const void*)sbn_coop_kernel<KIND, DT, TILE, V, SBN_VAR_ONCHIP, EPI> : nullptr;
    case SBN_VAR_UNIT: /* the 16-byte plane kernels only (coop_plan.h: sbn_unit_applies) */
      if constexpr (!TILE) return vec ? (const void*)sbn_unit_kernel<KIND, DT, V, EPI> : nullptr;
      return nullptr;
    case SBN_VAR_SMALL: /* tile units, any width (element loads: coop_plan.h,
                           sbn_small_applies); not the in-place backward's recovery */
      if constexpr (TILE && EPI != SBN_EPI_RECOVER) return (const void*)sbn_small_kernel<KIND, DT, EPI, false>;
      return nullptr;
    case SBN_VAR_SMALL_TEAM: /* the same for a team of two or more (sbn_small_team_applies) */
      if constexpr (TILE && EPI != SBN_EPI_RECOVER) return (const void*)sbn_small_kernel<KIND, DT, EPI, true>;
      return nullptr;
    default:
      return vec ? (const void*)sbn_coop_kernel<KIND, DT, TILE, V, SBN_VAR_STREAM, EPI>
                 : (const void*)sbn_coop_kernel<KIND, DT, TILE, 1, SBN_VAR_STREAM, EPI>;
  }
}
template <int KIND, int DT, bool TILE> struct CoopKernels {
  static const void* pick(int vec, int variant, int epi) {
    if (epi == SBN_EPI_NONE) return coop_pick<KIND, DT, TILE, SBN_EPI_NONE>(vec, variant);
    if constexpr (SBN_EPI_BUILT) {
      if constexpr (KIND == SBN_OP_BACKWARD) {
        if (epi == SBN_EPI_RECOVER) return coop_pick<KIND, DT, TILE, SBN_EPI_RECOVER>(vec, variant);
      }
      return coop_pick<KIND, DT, TILE, SBN_EPI_ACT>(vec, variant);
    }
    return nullptr;
  }
};
template <int KIND, int DT, bool TILE, int EPI> const void* host_pick(int stage, int vec) {
  constexpr int V = kVec<DT>;
  switch (stage) {
    case SBN_HOST_STATS:
      return vec ? (const void*)sbn_host_stats_kernel<KIND, DT, TILE, V, EPI>
                 : (const void*)sbn_host_stats_kernel<KIND, DT, TILE, 1, EPI>;
    case SBN_HOST_SMALL_STATS: /* small's plan (tile units, any width; not the in-place
                                  backward's recovery: coop_plan.h, sbn_host_stats_stage) */
      if constexpr (TILE && EPI != SBN_EPI_RECOVER) return (const void*)sbn_host_small_stats_kernel<KIND, DT, EPI>;
      return nullptr;
    case SBN_HOST_PUBLISH: return (const void*)sbn_host_publish_kernel<KIND, TILE>;
    case SBN_HOST_GATHER: return (const void*)sbn_host_gather_kernel;
    default:
      return vec ? (const void*)sbn_host_apply_kernel<KIND, DT, TILE, V, EPI>
                 : (const void*)sbn_host_apply_kernel<KIND, DT, TILE, 1, EPI>;
  }
}
template <int KIND, int DT, bool TILE> struct HostKernels {
  static const void* pick(int stage, int vec, int epi) {
    /* the forward's statistics read x only: the plain kernel */
    if (epi == SBN_EPI_NONE ||
        (KIND == SBN_OP_FORWARD && (stage == SBN_HOST_STATS || stage == SBN_HOST_SMALL_STATS)))
      return host_pick<KIND, DT, TILE, SBN_EPI_NONE>(stage, vec);
    if constexpr (SBN_EPI_BUILT) {
      if constexpr (KIND == SBN_OP_BACKWARD) {
        if (epi == SBN_EPI_RECOVER) return host_pick<KIND, DT, TILE, SBN_EPI_RECOVER>(stage, vec);
      }
      return host_pick<KIND, DT, TILE, SBN_EPI_ACT>(stage, vec);
    }
    return nullptr;
  }
};
/* Table<KIND, DT, TILE>::pick(a...) for a run-time kind, dtype and tile: every kind, every
   dtype of SBN_DTYPES, both tiles are instantiated; nullptr for a dtype not in it. */
template <template <int, int, bool> class Table, int KIND, typename... A>
const void* pick_dtype(int dtype, int tile, A... a) {
  switch (dtype) {
#define SBN_PICK_DTYPE_(value, bytes, name, tag, bits) \
  case value: return tile ? Table<KIND, value, true>::pick(a...) : Table<KIND, value, false>::pick(a...);
    SBN_DTYPES(SBN_PICK_DTYPE_)
#undef SBN_PICK_DTYPE_
  }
  return nullptr;
}
template <template <int, int, bool> class Table, typename... A>
const void* pick(int kind, int dtype, int tile, A... a) {
  return kind == SBN_OP_FORWARD ? pick_dtype<Table, SBN_OP_FORWARD>(dtype, tile, a...)
                                : pick_dtype<Table, SBN_OP_BACKWARD>(dtype, tile, a...);
}

template <int DT, bool EPI> const void* infer_pick_dt(int kind, int vec) {
  if (kind == SBN_INFER_FLAT) /* 16-byte vectors only (sbn_infer_kind) */
    return vec ? (const void*)sbn_infer_flat_kernel<DT, kVec<DT>, EPI> : nullptr;
  return kind == SBN_INFER_TILE ? (vec ? (const void*)sbn_infer_tile_kernel<DT, kVec<DT>, EPI>
                                       : (const void*)sbn_infer_tile_kernel<DT, 1, EPI>)
                                : (vec ? (const void*)sbn_infer_plane_kernel<DT, kVec<DT>, EPI>
                                       : (const void*)sbn_infer_plane_kernel<DT, 1, EPI>);
}
const void* infer_pick(int dtype, int kind, int vec, int epi) {
  switch (dtype) {
#define SBN_PICK_INFER_(value, bytes, name, tag, bits) \
  case value: return epi ? (SBN_EPI_BUILT ? infer_pick_dt<value, SBN_EPI_BUILT>(kind, vec) : nullptr) \
                         : infer_pick_dt<value, false>(kind, vec);
    SBN_DTYPES(SBN_PICK_INFER_)
#undef SBN_PICK_INFER_
  }
  return nullptr;
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
extern "C" const void* sbn_coop_kernel_ptr(int kind, int dtype, int tile, int vec, int variant, int epi) {
  return pick<CoopKernels>(kind, dtype, tile, vec, variant, epi);
}

extern "C" const void* sbn_host_kernel_ptr(int stage, int kind, int dtype, int tile, int vec, int epi) {
  return pick<HostKernels>(kind, dtype, tile, stage, vec, epi);
}

extern "C" const void* sbn_infer_kernel_ptr(int dtype, int kind, int vec, int epi) {
  return infer_pick(dtype, kind, vec, epi);
}

#ifndef SBN_COOP_EMU
#if SBN_WINDOW_TRANSPORT
/* Ranks of comm's load/store-accessible (NVLink) team: nccl_device/core.h is C++ only.
   NCCL is loaded at run time (src/gpu/nccl_api.c): team_lsa is its ncclTeamLsa. The
   static_cast compiles only while the header declares that overload with this type
   (unevaluated: the symbol is not referenced). */
using sbn_team_lsa_fn = ncclTeam_t (*)(ncclComm_t);
static_assert(sizeof(static_cast<sbn_team_lsa_fn>(&ncclTeamLsa)) == sizeof(sbn_team_lsa_fn),
              "ncclTeamLsa(ncclComm_t)'s type");
extern "C" __attribute__((visibility("hidden"))) int sbn_nccl_lsa_size(void* comm,
                                                                       void (*team_lsa)(void)) {
  return reinterpret_cast<sbn_team_lsa_fn>(team_lsa)(static_cast<ncclComm_t>(comm)).nRanks;
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
