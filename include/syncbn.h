/* syncbn — synchronized batch normalization across ranks.
 *
 * The public C API. See README.md for usage and docs/API.md for the contract this
 * header implements. Compiles without CUDA or NCCL headers.
 *
 * Conventions: every function returns sbnResult_t; a failed call writes none of its
 * outputs; created objects come back through the first pointer argument; asynchronous
 * calls end with (..., stream). The library never prints unless SBN_DEBUG=WARN|INFO (any
 * case).
 */
#ifndef SYNCBN_H_
#define SYNCBN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define SBN_API
#else
#define SBN_API __attribute__((visibility("default")))
#endif

/* ---- version ---------------------------------------------------------------- */
/* The one definition of syncbn's version: CMakeLists.txt (the library, the CMake package,
   pkg-config) and pyproject.toml (the Python package) read these three lines. */
#define SBN_VERSION_MAJOR 0
#define SBN_VERSION_MINOR 1
#define SBN_VERSION_PATCH 0
#define SBN_VERSION_CODE (SBN_VERSION_MAJOR * 10000 + SBN_VERSION_MINOR * 100 + SBN_VERSION_PATCH)

/* ---- results: one X-macro list generates the enum, the names and the messages --- */
#define SBN_RESULT_LIST(X)                                                                  \
  X(sbnSuccess, 0, "no error")                                                              \
  X(sbnInvalidArgument, 1,                                                                  \
    "invalid argument (NULL where data is needed, bad shape or enum, global count of 1); "  \
    "sbnGetLastError(comm) has the detail (NULL: an init's, sbnGroupEnd's, inference's)")   \
  X(sbnInvalidUsage, 2,                                                                     \
    "invalid usage (calls out of order, incomplete or failed group, op mismatch between "   \
    "ranks); sbnGetLastError(comm) has the detail (NULL: an init's, sbnGroupEnd's, "         \
    "inference's)")                                                                         \
  X(sbnUnsupported, 3,                                                                      \
    "unsupported in this build or on this device; sbnGetLastError has the reason")          \
  X(sbnCudaError, 4, "CUDA runtime error; run with SBN_DEBUG=WARN for the CUDA message")     \
  X(sbnNcclError, 5, "NCCL error; run with NCCL_DEBUG=WARN for NCCL's message")              \
  X(sbnSystemError, 6, "system error (host allocation or threads)")                         \
  X(sbnTimeout, 7,                                                                          \
    "a peer did not arrive within the comm's timeout (sbnConfig_t.timeout_ms or "           \
    "SBN_TIMEOUT_MS); the team is now aborted")                                             \
  X(sbnAborted, 8,                                                                          \
    "the comm was aborted (after a timeout, sbnCommAbort, or, in a CPU team, "              \
    "sbnCommDestroy of another rank); destroy it")

typedef enum {
#define SBN_RESULT_ENUM_(name, value, text) name = value,
  SBN_RESULT_LIST(SBN_RESULT_ENUM_)
#undef SBN_RESULT_ENUM_
  sbnNumResults
} sbnResult_t;

/* ---- opaque handles and foreign types ------------------------------------------- */
typedef struct sbnComm* sbnComm_t;
typedef struct CUstream_st* sbnStream_t; /* the same type as cudaStream_t */
struct ncclComm;                         /* struct ncclComm* is ncclComm_t */

/* Static text for a result code; never NULL ("unknown result code (not an sbnResult_t)"
   for out-of-range codes). */
SBN_API const char* sbnGetErrorString(sbnResult_t r);
/* Static name of a result code ("sbnTimeout"); never NULL ("sbnUnknownResult" for
   out-of-range codes). */
SBN_API const char* sbnGetResultName(sbnResult_t r);
/* Detail of the last failure on `comm` (or, for comm == NULL, of the last failure of a
   call on this thread that had no comm: init functions, sbnGroupEnd, inference, and an
   sbnCommDestroy whose sbnTimeout released the comm).
   Thread-safe: the text is copied into a per-thread buffer, valid until this thread's
   next call of sbnGetLastError. "" when there was no failure. Never NULL. */
SBN_API const char* sbnGetLastError(sbnComm_t comm);
/* *version = SBN_VERSION_CODE of the library (which may differ from the header's).
   sbnInvalidArgument if version is NULL. */
SBN_API sbnResult_t sbnGetVersion(int* version);

/* ---- tensors ------------------------------------------------------------------- */
typedef enum { sbnFloat32 = 0, sbnFloat16 = 1, sbnBFloat16 = 2 } sbnDataType_t;
typedef enum {
  sbnLayoutNCHW = 0, /* (N, C, *spatial): channels first, contiguous */
  sbnLayoutNHWC = 1  /* (N, *spatial, C): channels last, contiguous */
} sbnLayout_t;
typedef struct {
  sbnDataType_t dtype; /* of x, y, dy, dx; statistics are always accumulated in fp32 or wider */
  sbnLayout_t layout;
  int64_t n;       /* this rank's batch; 0 is allowed (the rank still takes part) */
  int64_t c;       /* channels, >= 1 */
  int64_t spatial; /* product of spatial extents, >= 1; 1 for BatchNorm1d on (N, C) */
} sbnTensorDesc_t;

/* ---- communicators ------------------------------------------------------------- */
#define SBN_CONFIG_MAGIC 0x5b4e4366u /* "SBNf" */
#define SBN_CONFIG_VERSION 1u
#define SBN_DEFAULT_TIMEOUT_MS 300000
#define SBN_DEFAULT_MAX_CHANNELS 4096
typedef struct {
  size_t size;
  unsigned magic;
  unsigned version; /* filled by SBN_CONFIG_INITIALIZER */
  int64_t timeout_ms;   /* in-op wait for peers, > 0; default 300000; env SBN_TIMEOUT_MS overrides */
  int64_t max_channels; /* the widest op's C, in [1, 2^20]; workspace is sized at init (no
                           allocation inside ops; a CPU team's group starts threads: see
                           sbnGroupEnd); default 4096 */
} sbnConfig_t;
#define SBN_CONFIG_INITIALIZER                                                              \
  { sizeof(sbnConfig_t), SBN_CONFIG_MAGIC, SBN_CONFIG_VERSION, SBN_DEFAULT_TIMEOUT_MS,       \
    SBN_DEFAULT_MAX_CHANNELS }

/* Most ranks in a GPU team (sbnCommInitVirtual, sbnCommInitAll): the cooperative kernels
   take every rank's mailbox address as a launch parameter. Wider teams: sbnUnsupported. */
#define SBN_MAX_GPU_TEAM_RANKS 16

/* One thread at a time per comm: while a call on a comm runs, or while the comm has ops
   queued in a thread's open group, a call on it from another thread (an op, a split, a
   destroy) returns sbnInvalidUsage at once and does nothing (two threads driving one rank
   would pair their ops across the team at random). sbnCommAbort, sbnCommGetAsyncError,
   sbnGetLastError and the queries may be called from any thread at any time. A thread
   that exits with a group open frees its queue and gives its comms back (its ops never
   run). A destroy that races a call still entering the library (not yet holding the
   comm) is undefined behaviour, as with free(). The calls that wait for other ranks (ops, sbnGroupEnd, splits, destroys) and
   sbnCommAbort run with the calling thread's cancellation disabled: a pthread_cancel takes effect at the
   thread's next cancellation point after the call has returned. */

/* Color for sbnCommSplit: this rank joins no sub-team (*newcomm = NULL). */
#define SBN_SPLIT_NOCOLOR (-1)

/* Most ranks in a CPU team (sbnCommInitCpu). */
#define SBN_MAX_CPU_TEAM_RANKS 4096

/* The stack of each thread sbnGroupEnd starts for a CPU team's rank (bytes): what the
   address space holds per such thread (ulimit -v), where the default (RLIMIT_STACK's,
   8 MiB on most systems) would be taken. A rank's op needs under 64 KB of it. */
#define SBN_GROUP_THREAD_STACK (1u << 20)

/* CPU team: creates `nranks` comms (ranks 0..nranks-1 in comms[0..nranks-1]) whose ranks
   are host threads and whose data lives in host memory. config may be NULL (defaults).
   Each comm is owned by the caller and released with sbnCommDestroy. Always available.
   Cost: every rank of an op reads every rank's records, and the nranks threads share the
   host's cores, so an op's time grows about quadratically with nranks once they outnumber
   the cores (measured on 2 cores, C = 512: 0.7 s per forward at 256 ranks, 14-22 s at
   1024-2048); SBN_DEBUG=WARN says so at init above 256 ranks.
   A CPU team counts each rank's forward and backward calls, refused at their arguments
   or not (in a group: those of a group that runs), and fails an op whose ranks' counts
   differ (mod 7) on every rank with sbnInvalidUsage, "ranks out of step", nothing
   written: after a call refused on some ranks only, the refused rank's next op does not
   pair with the one its peers wait in, nor does any later op (abort the team). GPU teams
   of more than one rank (below) count alike and find it in the kernel (an op mismatch),
   but for a virtual team's ops and a rank's that captured an op into a CUDA graph, which
   carry no count (docs/USAGE.md).
   Errors: sbnInvalidArgument (comms NULL, nranks < 1 or > SBN_MAX_CPU_TEAM_RANKS, bad
   config), sbnSystemError. */
SBN_API sbnResult_t sbnCommInitCpu(sbnComm_t* comms, int nranks, const sbnConfig_t* config);
/* GPU teams (sbnCommInitAll, sbnCommInitVirtual). Forward and backward are each ONE
   cooperative kernel per GPU with the cross-rank exchange inside it. For their ops:
   - every pointer (x, y, dy, dx, weight, bias, running stats, num_batches_tracked as an
     int64_t, save_mean/save_invstd, dweight/dbias) is device memory of the rank's GPU;
   - ops are asynchronous on `stream`; argument errors are returned at once, as for CPU
     teams. Failures found inside the kernel (a peer that does not arrive within
     timeout_ms, ranks running different ops or out of step, a global count of 1 that
     the host could not see) write none of the op's outputs in the blocks that detect them (but dz of
     sbnBackwardEx where its stream kernel writes dz first, below: it holds then what a
     successful op writes there, which depends on no other rank), are reported by
     sbnCommGetAsyncError, and abort the team (later ops return sbnAborted);
   - epochs live on the device: ops can be captured into a CUDA graph and replayed;
   - a rank's ops must run on the GPU in the order they were called, each after the
     previous one of its comm: on one stream, or on streams the caller orders (an event
     recorded after one op and waited for before the next). Two ops of one comm that can
     run at once share its exchange slots: their results are undefined (the call numbers
     make most such mixes an asynchronous sbnInvalidUsage, "ranks out of step").
   Their init (sbnCommInitAll, sbnCommInitVirtual, sbnCommInitNccl, sbnCommInitNcclRank, and
   the new team of an sbnCommSplit) waits for its own work on the device only, never for the
   program's: a kernel that never ends there (a collective waiting for a dead peer) does
   not keep it. Its own work (zeroing the team's memory) not done within timeout_ms gives
   sbnTimeout ("the team's init: device 0 did not zero the team's memory ..."). A failed
   init frees what it made as sbnCommDestroy does (below), bounded alike, and returns its
   own error; an NCCL comm it made that did not finish its own init (a rank that never
   called) is aborted as sbnCommAbort does, waited for up to timeout_ms more. CUDA may
   still wait for the device inside its own calls (loading kernels, allocating).
   At most SBN_MAX_GPU_TEAM_RANKS ranks. sbnUnsupported in builds without CUDA, without a
   device, or on a device without cooperative launch. */

/* One process, one rank per listed GPU (devlist[r] is rank r's device). Mailboxes live in
   device memory mapped to the peers (peer access is enabled), or in pinned, mapped host
   memory where some pair of GPUs lacks P2P. A device may be listed more than once: those
   ranks share it, each launch sized to its share of the SMs (used to test separate
   launches on one GPU). Ranks call their ops either from one thread per rank, or all
   together from one thread inside sbnGroupStart/End. */
SBN_API sbnResult_t sbnCommInitAll(sbnComm_t* comms, int ndev, const int* devlist,
                                   const sbnConfig_t* config);
/* nranks virtual ranks on ONE GPU: the same in-kernel protocol as real GPUs, for tests and
   research. With nranks > 1 every op must be called for all ranks between sbnGroupStart
   and sbnGroupEnd, which makes ONE cooperative launch for all ranks (on rank 0's stream,
   ordered after the work on the other ranks' streams); outside a group: sbnInvalidUsage.
   The ranks share the GPU's co-resident blocks. */
SBN_API sbnResult_t sbnCommInitVirtual(sbnComm_t* comms, int nranks, int device,
                                       const sbnConfig_t* config);
/* Multi-process / multi-node: one rank per NCCL rank, collective over the NCCL comm (every
   rank calls it). Its first step, ncclCommSplit of `nccl`, takes the blocking mode of
   `nccl`: with a nonblocking comm (ncclConfig_t.blocking = 0) every wait of the init is
   bounded by timeout_ms (a rank that never calls gives sbnTimeout); with a blocking one
   that split waits for every rank as NCCL's own calls do, and the rest is bounded. A
   failure on one rank after that (a bad SBN_NCCL_TRANSPORT, memory) fails every rank, and
   ranks passing different max_channels get sbnInvalidArgument. The
   comm's rank and size are the NCCL comm's; its device is the NCCL comm's
   (ncclCommCuDevice), which holds every tensor of its ops. The library makes its own
   duplicate of `nccl` (ncclCommSplit), so the caller may use or destroy theirs freely.
   Ops may be called with or without sbnGroupStart/End. Each op is, by transport:
   - "nccl-lsa": ONE cooperative kernel per op, exchanging through an NCCL symmetric
     window with NCCL's device API (NCCL >= 2.28), when every rank is in one
     load/store-accessible (LSA) team of NCCL and the window is usable on every rank
     (symmetric-memory support: P2P between the GPUs, NCCL's cuMem allocator);
   - "nccl-host": the host-driven path (stats kernel, ncclAllGather, apply kernel) when
     the team spans several such domains, the NCCL lacks the device API or symmetric
     memory, or SBN_NCCL_TRANSPORT=host. The choice is made once, agreed by all ranks at
     init, logged at SBN_DEBUG=INFO, and readable with sbnCommGetTransport.
   Environment SBN_NCCL_TRANSPORT: auto (default), lsa (the in-kernel path or
   sbnUnsupported), host. sbnCommSplit on an NCCL comm is collective over its team (one
   call per process, inside a group or not). sbnCommDestroy on an NCCL comm is collective
   too (NCCL deregisters the window), except after the team was aborted or one of its
   kernels reported a failure (read or not: sbnCommGetAsyncError).
   NCCL is loaded at its first use, not linked (the libnccl.so.2 the program already
   loaded, else the one found at build time, else the loader's libnccl.so.2;
   SBN_NCCL_LIBRARY=PATH instead). sbnUnsupported in builds without NCCL, when NCCL
   cannot be loaded (the detail says what was searched), and with NCCL < 2.28 when
   SBN_NCCL_TRANSPORT=lsa;
   sbnNcclError when NCCL fails (the detail names the call). */
SBN_API sbnResult_t sbnCommInitNccl(sbnComm_t* comm, struct ncclComm* nccl,
                                    const sbnConfig_t* config);
/* An NCCL unique id (ncclUniqueId: NCCL_UNIQUE_ID_BYTES = 128 bytes), made on one rank by
   sbnGetNcclUniqueId and handed by the caller to the others (MPI, torch.distributed, a
   file) for sbnCommInitNcclRank. */
#define SBN_NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[SBN_NCCL_UNIQUE_ID_BYTES];
} sbnNcclUniqueId_t;
/* ncclGetUniqueId through the library's NCCL (loaded as for sbnCommInitNccl).
   sbnInvalidArgument (id NULL), sbnUnsupported (no NCCL), sbnNcclError. */
SBN_API sbnResult_t sbnGetNcclUniqueId(sbnNcclUniqueId_t* id);
/* Multi-process from an id, for callers without an NCCL comm of their own (Python through
   ctypes): every rank calls it with the same id and nranks and its own rank, on the CUDA
   device that will hold its tensors (the calling thread's current device). The library
   makes the NCCL comm itself (ncclCommInitRankConfig, nonblocking) and the team takes it
   as its own, so every wait of the init, that comm's included, is bounded by timeout_ms:
   a rank that never calls gives sbnTimeout on the others (their comm aborted), never a
   hang. Otherwise as sbnCommInitNccl (transports, SBN_NCCL_TRANSPORT, sbnCommSplit,
   collective destroy). Errors: sbnInvalidArgument (comm or id NULL, nranks < 1, rank
   outside [0, nranks), bad config), sbnUnsupported, sbnNcclError, sbnTimeout. */
SBN_API sbnResult_t sbnCommInitNcclRank(sbnComm_t* comm, const sbnNcclUniqueId_t* id, int nranks,
                                        int rank, const sbnConfig_t* config);
/* Sub-teams (PyTorch process_group, apex bn_group): collective over the parent's ranks.
   For in-process teams it is called for every rank inside one sbnGroupStart/End pair
   (*newcomm is written by sbnGroupEnd), or, for CPU and sbnCommInitAll teams, by one
   thread per rank outside a group (each call blocks until the team meets, bounded by the
   timeout; a virtual team's is refused there, sbnInvalidUsage). Such a wait ends at once,
   with nothing made, when the team is aborted (sbnAborted, whatever the reason; sbnTimeout
   where the wait ran out) or one of its ranks is destroyed (sbnInvalidUsage for an
   sbnCommInitAll team, which that destroy does not abort).
   Ranks with the same color >= 0 form a team, ordered by key then parent rank; color
   SBN_SPLIT_NOCOLOR gives *newcomm = NULL. New comms inherit the parent's config. */
SBN_API sbnResult_t sbnCommSplit(sbnComm_t comm, int color, int key, sbnComm_t* newcomm);
/* This comm's rank in its team / the team's size. */
SBN_API sbnResult_t sbnCommRank(sbnComm_t comm, int* rank);
SBN_API sbnResult_t sbnCommCount(sbnComm_t comm, int* count);
/* *async_error = sbnSuccess, or why the team stopped: sbnTimeout, sbnAborted, or what only
   the kernel could see (sbnInvalidUsage: ranks called different ops; sbnInvalidArgument:
   a global count of 1). */
SBN_API sbnResult_t sbnCommGetAsyncError(sbnComm_t comm, sbnResult_t* async_error);
/* Aborts the whole team: ops waiting for peers return sbnAborted at once, later ops
   return sbnAborted without running. Idempotent. GPU teams: it waits for its stop signal to
   reach each rank's device, bounded by the comm's timeout once for the team's life (a
   device that never finishes the copy costs one timeout in all: a second sbnCommAbort
   does not wait for it again), and for the abort of the team's NCCL comms
   (ncclCommAbort, which frees device memory and so waits for every kernel on the
   device) until the same deadline: behind a kernel that never ends, that abort goes on in
   a thread of the library, and the team's destroy waits for it as for the devices. */
SBN_API sbnResult_t sbnCommAbort(sbnComm_t comm);
/* Releases this rank's handle; the team's shared state goes with its last rank.
   NULL is accepted. While another thread's call on the comm runs, or the comm has ops
   queued in another thread's open group, sbnInvalidUsage (nothing done: "one thread at a
   time per comm", above); with ops queued in this thread's open group, sbnInvalidUsage
   too, and that group's sbnGroupEnd then runs nothing (a failed call of the group);
   destroy a comm whose call waits after that call has returned (sbnCommAbort ends the
   wait at once). A destroy racing a call that is still entering the library, before it
   holds the comm, is undefined behaviour, as any use of a freed handle. As with free(),
   the handle is invalid afterwards: using it, or destroying it again, is undefined
   behaviour (its memory is released; the library does not keep a registry of live
   handles).
   The last rank's destroy of a GPU or NCCL team waits for the team's devices to finish
   their work (CUDA frees device memory only on an idle device, so every kernel on them
   counts, the program's own included) for up to timeout_ms in each of its waits for them,
   beside its own steps that are bounded by the timeout (an aborted team's stop words, an
   NCCL comm's deregistration and finalize). Past that it returns sbnTimeout, the detail
   on this thread (sbnGetLastError(NULL): "sbnCommDestroy: device 0 did not finish its
   work within timeout_ms ..."), and the handle is released all the same: a thread of the
   library frees the team's device memory, streams, events and NCCL comm when the devices
   finish (a kernel that never ends, a collective waiting for a dead peer, keeps them for
   good; the library must stay loaded meanwhile: no dlclose). Every other failure leaves
   the handle as it was.
   A rank destroyed while other ranks of its team live leaves a team none of whose ops can
   complete again. What its peers see:
   - CPU teams (sbnCommInitCpu): at once. A CPU team's ops are synchronous, so the
     destroyed rank has none in flight, and the team is aborted by the destroy: peers
     waiting in an op (or in a thread-per-rank sbnCommSplit) return sbnAborted at once,
     later ops return sbnAborted without running (writing nothing), sbnCommGetAsyncError
     reports sbnAborted, and sbnGetLastError names the rank ("rank 1 of the team was
     destroyed (sbnCommDestroy) ..."). An op the destroyed rank had completed completes
     on every peer too, so destroying every rank after its last op (the usual teardown,
     in any order, from any thread) fails no op; from the first destroy on, the others'
     sbnCommGetAsyncError reports sbnAborted. A team aborted before keeps its reason.
   - GPU teams (sbnCommInitAll, sbnCommInitVirtual): not aborted by a destroy, since their
     kernels run asynchronously and a destroy must not fail a peer's kernel that is still
     finishing an op the destroyed rank took part in. A peer's later op waits in its
     kernel for the destroyed rank until the team's timeout, then ends with sbnTimeout
     (sbnCommGetAsyncError) and aborts the team; a group lacking the destroyed rank is
     sbnInvalidUsage (its team is incomplete), and so is a thread-per-rank sbnCommSplit
     (sbnCommInitAll), at once, also for a rank that was waiting in it.
   - NCCL teams: the peers are other processes and learn of neither a destroy nor a
     process's exit; their waits end at the team's timeout, as sbnTimeout, or as
     sbnNcclError where NCCL reports the lost peer first. (Destroy is collective for them
     anyway: see sbnCommInitNccl.) */
SBN_API sbnResult_t sbnCommDestroy(sbnComm_t comm);
/* How this comm's ops exchange (a static string): "cpu" (CPU team), "virtual" (ranks on one
   GPU), "peer" (InitAll, peer device memory), "peer-pinned-host" (InitAll without P2P),
   "nccl-lsa" or "nccl-host" (NCCL teams, see sbnCommInitNccl). SBN_ALGO=nccl at a call
   still runs that call on the host-driven path. */
SBN_API sbnResult_t sbnCommGetTransport(sbnComm_t comm, const char** transport);
/* What ran this rank's most recent sbnForwardTrain / sbnBackward (a static string): "cpu"
   (CPU team); for GPU teams the cooperative kernel's variant, "onchip" (x, and dy, held on
   chip: read once), "stream" (16-byte loads, read again in stage 5), "stream-scalar" (the
   same one element at a time: tensors not 16-byte aligned, NHWC with C > 1 not a multiple
   of 4 (fp32) / 8 (fp16, bf16), NCHW (or C = 1) with H*W not a multiple of it and below
   1024; C = 1 runs as NCHW whichever layout is named, so that its bits do not depend on it),
   "unit" (a team of one's channels one after the other, each read again right after its
   statistics), "small" (a team of one's op of few rows, or under SBN_KERNEL=small a team's
   whose ranks each have few: every value loaded once into registers), or "host"
   (SBN_ALGO=nccl); "none" before the first op. Chosen per call:
   SBN_KERNEL=auto (stream, or stream-scalar; unit for a team of one's ops where unit
   applies, but for the forward of fp16/bf16 planes that are not whole 16-byte vectors;
   small wherever small applies), onchip (where the rank's tensors fit on
   chip as whole 16-byte vectors, not for sbnCommInitAll ranks sharing a GPU; else
   sbnUnsupported; SBN_ALGO=nccl runs "host" whatever it asks, with the bits of the
   cooperative kernel that SBN_KERNEL would run), stream, unit (where
   it applies: a team of one, NCHW (or C = 1) with H*W > 1 a multiple of 4 (fp32) / 8 (fp16, bf16)
   or at least 1024, 16-byte aligned tensors, fewer than twice as many blocks as
   channels; else stream or stream-scalar), or small (where it applies: a team of one, NHWC with
   C > 1 or H*W = 1, N*H*W at most 64, not the in-place backward (sbnBackwardEx with x NULL);
   also a team of two or more ranks whose ranks launched each have at most 64 rows, but for
   sbnCommInitAll ranks on GPUs without peer access and ranks sharing a GPU; else what auto
   runs) (the first kernel, "legacy", was
   removed in 0.1.0: SBN_KERNEL=legacy fails with sbnInvalidArgument). */
SBN_API sbnResult_t sbnCommGetKernel(sbnComm_t comm, const char** kernel);

/* ---- groups -------------------------------------------------------------------- */
/* NCCL's convention: calls between sbnGroupStart and sbnGroupEnd (on this thread; groups
   nest) are validated at once and queued; sbnGroupEnd runs them. A CPU team runs its
   ranks on threads inside sbnGroupEnd and returns when done: threads it starts for that
   call (one per rank the group holds ops for, over all its CPU teams, less one: tens of
   us per group) and allocates its queues, so it can fail with sbnSystemError (no CPU
   team's op run; the detail on their comms too; a GPU team's ops in the same group were
   issued before) where the system cannot start them or has no memory; ranks called from one thread
   each outside a group start none. If any call in the group
   failed, or a team has ranks missing (or unequal op counts), sbnGroupEnd runs NOTHING
   and returns sbnInvalidUsage. Otherwise it runs each team's rounds (the i-th op of
   every rank) in the order of each round's first op: the GPU teams' (issued), then the
   CPU teams' one after the other, so an op may read what a round of another team that
   started before its own writes; none after an op that failed; it returns the first
   failure.
   sbnGroupEnd without sbnGroupStart: sbnInvalidUsage. */
SBN_API sbnResult_t sbnGroupStart(void);
SBN_API sbnResult_t sbnGroupEnd(void);

/* ---- operations ---------------------------------------------------------------- */
typedef enum {
  sbnGradLocal = 0, /* dweight/dbias = this rank's contribution (PyTorch + DDP) */
  sbnGradGlobal = 1 /* dweight/dbias = sum over the whole team (free in-kernel) */
} sbnGradMode_t;
/* The params are each rank's own: they are not part of the op's signature and not
   exchanged (as nn.SyncBatchNorm's ranks each use their own eps and momentum). Ranks that
   pass the same params get the bitwise-identical save_mean, save_invstd and running
   statistics that API.md promises; ranks whose eps differ get each their own save_invstd
   (and outputs), and each rank's momentum updates its own running statistics. */
typedef struct {
  float eps;      /* >= 0; default 1e-5 */
  float momentum; /* default 0.1; < 0 means cumulative average (PyTorch momentum=None) */
  sbnGradMode_t grad_mode;
} sbnParams_t;
#define SBN_PARAMS_DEFAULT { 1e-5f, 0.1f, sbnGradLocal }

/* Training forward over the team: mean and biased variance of each channel over all
   ranks' n*spatial elements; y = (x - mean) * invstd * weight + bias.
   x, y: this rank's tensor per desc (y == x allowed); may be NULL when desc->n == 0.
   Every op's outputs share no byte with its other buffers but for the whole aliases it
   lists (here y == x): a partial overlap, or an output on another buffer, is
   sbnInvalidArgument, nothing written (tensors checked on ranks with n > 0; docs/API.md).
   weight, bias: both NULL for affine=False. running_mean/var: both NULL for none;
   updated with the unbiased variance. num_batches_tracked: may be NULL (required when
   momentum < 0); incremented by 1 per call. save_mean, save_invstd: required.
   params: NULL means SBN_PARAMS_DEFAULT. Global count M == 1: sbnInvalidArgument on
   every rank, nothing written. M == 0: success, save_mean = 0, save_invstd =
   1/sqrt(eps), running stats unchanged (num_batches_tracked still counts the call). */
SBN_API sbnResult_t sbnForwardTrain(sbnComm_t comm, const sbnTensorDesc_t* desc, const void* x,
                                    void* y, const float* weight, const float* bias,
                                    float* running_mean, float* running_var,
                                    int64_t* num_batches_tracked, float* save_mean,
                                    float* save_invstd, const sbnParams_t* params,
                                    sbnStream_t stream);

/* Backward of sbnForwardTrain (PyTorch's formulas, sums reduced over the team).
   x, dy: required when desc->n > 0; dx may be NULL (no input grad; dx == dy and dx == x
   allowed).
   weight: NULL for affine=False. save_mean/save_invstd: from the forward, required.
   dweight/dbias: NULL to skip; local or team sums by params->grad_mode. */
SBN_API sbnResult_t sbnBackward(sbnComm_t comm, const sbnTensorDesc_t* desc, const void* x,
                                const void* dy, void* dx, const float* weight,
                                const float* save_mean, const float* save_invstd,
                                float* dweight, float* dbias, const sbnParams_t* params,
                                sbnStream_t stream);

/* Eval mode: y = (x - running_mean) / sqrt(running_var + eps) * weight + bias (weight and
   bias NULL: affine=False). No team, no synchronization. The pointers are either all
   host memory (computed on the CPU, stream ignored) or all device memory (one kernel on
   `stream`, on the device that holds running_mean; a tensor of another device is
   sbnInvalidArgument); a mix is sbnInvalidArgument. Both compute the same bits (a NaN
   output's sign and payload aside). */
SBN_API sbnResult_t sbnForwardInference(const sbnTensorDesc_t* desc, const void* x, void* y,
                                        const float* weight, const float* bias,
                                        const float* running_mean, const float* running_var,
                                        float eps, sbnStream_t stream);

/* ---- batch norm + activation (+ residual) in one op ---------------------------------
   The forward's epilogue: y = act(bn(x) + z), bn(x) = (x - mean) * invstd * weight + bias
   as above, z an optional tensor of x's desc (a residual). The backward takes the
   forward's output y for the activation's mask: g = dy * act'(y), dz = g, and dx is
   sbnBackward's with g for dy. PyTorch's rules: ReLU's gradient is 0 where y <= 0 (as
   threshold_backward of the result), leaky ReLU's is slope where y <= 0 (as
   leaky_relu_backward of the result; y > 0 exactly where v = bn(x) + z > 0 when
   slope >= 0). */
typedef enum {
  sbnActivationIdentity = 0,
  sbnActivationRelu = 1,     /* max(v, 0) */
  sbnActivationLeakyRelu = 2 /* v > 0 ? v : slope * v */
} sbnActivation_t;
typedef struct {
  size_t size;                /* sizeof(sbnEpilogue_t): fields may be added at the end, with
                                 0 as their default and no padding between or after them
                                 (explicit reserved members instead); a library older
                                 than the caller's header reads `size` bytes (at most
                                 SBN_EPILOGUE_MAX_SIZE, else sbnInvalidArgument) and
                                 refuses (sbnUnsupported) a field it does not know that is
                                 not 0 */
  sbnActivation_t activation; /* default identity */
  float slope;                /* leaky ReLU's negative slope, finite and >= 0 (default 0.01, PyTorch's);
                                 read for leaky ReLU only: identity and ReLU take any value */
  /* Added after the first sbnEpilogue_t (16 bytes: a caller's struct of that size is
     still read, these fields then 0): */
  int no_residual;            /* sbnBackwardEx: 1 says that the forward that made y had no z
                                 and the weight and bias given are its own (a promise: the
                                 library cannot check it). A ReLU or leaky ReLU backward that
                                 is given x then takes the activation's mask from x, and reads
                                 y only where x leaves its sign in doubt: the same gradients
                                 (bitwise), fewer bytes (bench/notes/fused-epilogue.md, "The
                                 mask from x"): CPU teams, and on GPU teams the cooperative
                                 kernels and the host path's (NCHW and NHWC); the small
                                 kernel (a team of one's ops of at most 64 rows) reads y as
                                 with 0. 0 (default): the mask from y. The forwards
                                 (sbnForwardTrainEx, sbnForwardInferenceEx) and
                                 sbnBackwardInPlaceEx refuse 1 with a z; elsewhere it
                                 changes nothing. 0 or 1 */
  int reserved;               /* 0 */
} sbnEpilogue_t;
#define SBN_EPILOGUE_INITIALIZER { sizeof(sbnEpilogue_t), sbnActivationIdentity, 0.01f, 0, 0 }
#define SBN_EPILOGUE_MAX_SIZE 4096

/* sbnForwardTrain with the epilogue: y = act(bn(x) + z). z: NULL (none) or this rank's
   tensor per desc. y == x and y == z are allowed (in place). epilogue: NULL means
   SBN_EPILOGUE_INITIALIZER (identity: with z NULL, this is sbnForwardTrain). Every rank of a team must
   pass the same activation (its kind is part of the op's signature: ranks that differ get
   sbnInvalidUsage; the slope is not exchanged: each rank's acts on its own elements, as
   an activation module after the op would, and no statistic depends on it). Every team
   runs it: CPU teams, and on GPU teams the cooperative kernel's epilogue (SBN_ALGO=nccl:
   the host path's, the same bits); z 16-byte aligned like x for the 16-byte kernels
   (else the scalar ones run). */
SBN_API sbnResult_t sbnForwardTrainEx(sbnComm_t comm, const sbnTensorDesc_t* desc, const void* x,
                                      const void* z, void* y, const float* weight,
                                      const float* bias, float* running_mean, float* running_var,
                                      int64_t* num_batches_tracked, float* save_mean,
                                      float* save_invstd, const sbnParams_t* params,
                                      const sbnEpilogue_t* epilogue, sbnStream_t stream);

/* sbnBackward of sbnForwardTrainEx. y: the forward's output (its mask; NULL allowed for
   identity when x is given). dz: NULL, or where to write the residual's gradient
   dy * act'(y) (dz == dy, x or y and dx == dy, x or y allowed, each the whole buffer; the
   in-place pattern, one buffer: the forward writes y over x, the backward takes x NULL and
   writes dx over y, and x == y is refused where dx or dweight is asked for; partial
   overlaps refused; dz == dx refused; dweight or dbias on weight, bias, save_mean or
   save_invstd, or on each other, refused, as a bias without a weight is). The activation
   must be the forward's (nothing can check it: a ReLU forward's y taken as identity's
   gives wrong gradients). x NULL: the in-place backward, which
   needs no copy of x: x_hat = (act^-1(y) - bias) / weight (identity, or leaky ReLU with a
   slope >= FLT_MIN: ReLU is not invertible, and a subnormal slope loses x's bits; and a
   forward without z: dz must be NULL; with z, sbnBackwardInPlaceEx), so bias is read
   then (weight, bias NULL:
   affine=False). By policy, a channel whose |weight| < max(SBN_RECOVER_MIN_WEIGHT,
   u * |bias|), u the dtype's unit roundoff (2^-24 fp32, 2^-11 fp16, 2^-8 bf16), has its
   x_hat taken as 0 (with weight 0, y is the bias and keeps no x; below the threshold,
   dividing y - bias by the weight turns y's rounding of the bias into an x_hat off by
   more than 1): its dweight is 0 (a weight at 0 gets no gradient in place) and its dx
   weight * invstd * (g - mean(g)), g = dy * act'(y) (0 for weight 0). Accuracy against the x-based
   backward: bench/notes/tolerances.md (a y below the dtype's normal range is kept to half a
   subnormal, not relatively: a leaky slope so small that slope * v leaves that range, or
   an fp16 channel of bias near 0 and |weight| near 1e-5, recovers x_hat to 2^-25 /
   (slope |weight|) absolute in fp16; an overflow keeps nothing: an fp16 y of inf gives
   its channel's dx and dweight NaN). Every rank must pass the same
   activation (kind; the slope as in sbnForwardTrainEx). The choice of x or y is each
   rank's on CPU teams, NCCL teams and sbnCommInitAll ranks called one thread per rank
   (the results agree within the in-place backward's accuracy, but for a channel below the
   policy's weight threshold: there the in-place ranks add 0 to sum(g x_hat), so its
   dweight is the x-based ranks' part of the sum, and the x-based ranks' dx, which uses
   that sum, differs from an all-x-based team's by up to weight invstd |x_hat| times the
   in-place ranks' part of mean(|g x_hat|)); a GPU team's ops given
   together in one group (a virtual team's, sbnCommInitAll ranks') run one kernel variant
   for the round and refuse a mix (sbnInvalidUsage, nothing run). A rank with
   n == 0 cannot check the in-place backward's conditions: where they fail, it waits for
   its peers, which refuse: until the timeout (sbnTimeout), or until their next op, which
   then fails on every rank ("ranks out of step", or a GPU team's op mismatch; docs/USAGE.md:
   abort the team after a call refused on some ranks only). Every team runs it. The gradient reaching the normalization,
   dy * act'(y), is computed in fp32 (dz is it rounded to the dtype); GPU teams read y
   besides x and dy when there is an activation (x given: y twice, in the statistics and
   in dx; the in-place backward reads y in x's place, once). The stream kernel writes dz
   first, and reads y once (its statistics' pass writes dz, its dx pass reads x and dz:
   7|x| of bytes, not 8, the same bits), where: dz is a buffer of its own (not x, y or
   dy); the activation is ReLU (or any, in fp32: dz is then g exactly); and the round
   holds every rank's op, which the host compares (a team of one, a virtual team, an
   sbnCommInitAll team's group of all its ranks; not an NCCL team, whose kernels find an
   op mismatch themselves, after the statistics). */
#define SBN_RECOVER_MIN_WEIGHT 1e-5f
SBN_API sbnResult_t sbnBackwardEx(sbnComm_t comm, const sbnTensorDesc_t* desc, const void* x,
                                  const void* y, const void* dy, void* dx, void* dz,
                                  const float* weight, const float* bias, const float* save_mean,
                                  const float* save_invstd, float* dweight, float* dbias,
                                  const sbnParams_t* params, const sbnEpilogue_t* epilogue,
                                  sbnStream_t stream);

/* The in-place backward of sbnForwardTrainEx with or without a residual: sbnBackwardEx
   with x NULL, and z, the forward's residual (NULL: none, and this is sbnBackwardEx with x
   NULL). With a z, x_hat = (act^-1(y) - z - bias) / weight: a forward that wrote
   y = act(bn(x) + z) over x needs no copy of x where z is kept anyway (a residual block's
   input, which its first convolution keeps). z must be the forward's, unchanged (nothing
   can check it), so z over y, whole or in part, is refused: a forward that wrote y over z
   left no z. The rules are sbnBackwardEx's in-place ones (identity, or leaky ReLU with a
   slope >= FLT_MIN; the weight threshold's policy; dx == dy or y and dz == dy or y
   allowed, each the whole buffer, dz == dx refused; every team runs it), and z is read,
   never written: dx and dz share no byte with it. dz = dy * act'(y) where asked, as
   sbnBackwardEx gives it. Accuracy: x_hat is off by about (|act^-1(y)| u + |bn(x)| 2^-24) /
   |weight| (the in-place backward's |act^-1(y)| u / |weight|, act^-1(y) being bn(x) + z,
   so a large residual costs in proportion; bench/notes/tolerances.md, "The in-place
   backward with a residual"). The weight threshold's policy sees the bias only, not z: a
   channel whose |weight| is below u |act^-1(y)| gets x_hat off by more than 1 where that
   holds, and a dweight without a correct digit (bf16 with |z| ~ 1 wants |weight| well
   above 2^-8 |z|; a channel whose weight may come that near 0 is for the x-based
   backward). GPU teams read z in both of the kernel's passes (the
   statistics and dx), as they read y: the small kernel does not run it. */
SBN_API sbnResult_t sbnBackwardInPlaceEx(sbnComm_t comm, const sbnTensorDesc_t* desc, const void* y,
                                         const void* z, const void* dy, void* dx, void* dz,
                                         const float* weight, const float* bias, const float* save_mean,
                                         const float* save_invstd, float* dweight, float* dbias,
                                         const sbnParams_t* params, const sbnEpilogue_t* epilogue,
                                         sbnStream_t stream);

/* sbnForwardInference with the epilogue: y = act(bn_eval(x) + z), the training formula
   with the running statistics. z: NULL or a tensor per desc, in memory of x's kind (host
   or device). */
SBN_API sbnResult_t sbnForwardInferenceEx(const sbnTensorDesc_t* desc, const void* x,
                                          const void* z, void* y, const float* weight,
                                          const float* bias, const float* running_mean,
                                          const float* running_var, float eps,
                                          const sbnEpilogue_t* epilogue, sbnStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_H_ */
