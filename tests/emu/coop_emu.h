/* coop_emu.h — run the cooperative kernels of kernels/coop.cu on CPU threads (see
 * cuda_emu.h). For tests only. */
#ifndef SYNCBN_TESTS_COOP_EMU_H_
#define SYNCBN_TESTS_COOP_EMU_H_

#include <stddef.h>
#include <stdint.h>

#include "coop_args.h"
#include "coop_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The emulation's stand-in for an NCCL symmetric window (the `nccl` transport): each
   rank's part by rank; the kernels address byte `off` of rank q's part as part[q] + off. */
typedef struct {
  char* part[SBN_GPU_MAX_RANKS];
} sbn_emu_window_t;

/* Runs `grid` blocks of SBN_GPU_THREADS threads of the cooperative kernel for (kind,
   dtype, tile, vec, variant: coop_plan.h's SBN_VAR_*) with *args (onchip: with
   sbn_hold_bytes(kind, args->hold_slots) of dynamic shared memory per block), and
   returns when all have returned: 0, or -1 for a kernel that is not built. Blocking;
   launches that must run at the same time (ranks of one team) are started from
   separate host threads. */
int sbn_emu_launch(int kind, int dtype, int tile, int vec, int variant,
                   const sbn_coop_args_t* args, unsigned grid);
/* Whether the kernel for (kind, dtype, tile, vec, variant, epi: SBN_EPI_*) is built (the
   library's table, kernels/coop.cu: sbn_coop_kernel_ptr). */
int sbn_emu_kernel_built(int kind, int dtype, int tile, int vec, int variant, int epi);
/* The same for one stage of the host-driven path (SBN_HOST_STATS ... SBN_HOST_APPLY). */
int sbn_emu_launch_host(int stage, int kind, int dtype, int tile, int vec,
                        const sbn_coop_args_t* args, unsigned grid);
/* The inference kernel (kind: SBN_INFER_*, coop_plan.h: sbn_infer_kind; vec: 16-byte
   kernel). */
int sbn_emu_launch_infer(int dtype, int kind, int vec, const sbn_infer_args_t* args, unsigned grid);

/* What the notify kernel does for sbnCommAbort on an NCCL team (kernels/coop.cu,
   push_failure): rank `rank`'s failure word = code in every rank's part of args->win. */
void sbn_emu_push_failure(const sbn_coop_args_t* args, int rank, int code);

/* Byte counts of the kernels' accesses to the caller's tensors (coop_mem.cuh's loads and
   stores): sbn_emu_count_track registers [p, p + bytes) (at most 64 ranges, cleared by
   sbn_emu_count_reset) and returns its slot; sbn_emu_count_get reads what the kernels
   read from and wrote to it since. */
void sbn_emu_count_reset(void);
int sbn_emu_count_track(const void* p, size_t bytes);
void sbn_emu_count_get(int slot, uint64_t* read, uint64_t* written);
/* Of those reads, the bytes read with L2's evict_last policy: what the kernel asked L2 to
   keep for a second read. */
uint64_t sbn_emu_count_kept(int slot);

/* ---- the emulator's modes (tests/emu/emu_rt.h); set them between launches ---- */
/* The weak memory model on (1) or off (0, the default: C++ atomics of the primitives'
   strength); the model's state is cleared. seed != 0 also makes the scheduler pick the
   next fiber at random (seeded), and seeds the model's choices; 0: FIFO. */
void sbn_emu_set_weak(int on, uint64_t seed);
/* Spinning launches sleep up to max_us microseconds now and then (0: never): ranks
   launched separately drift apart, as on separate GPUs. */
void sbn_emu_set_jitter(unsigned max_us);
/* Each block of a launch of the calling OS thread sleeps `us` microseconds after its
   first acquire load of a flag (a rank slow to read what it saw published; 0: never). */
void sbn_emu_set_acquire_delay(unsigned us);
/* At most max_blocks blocks of a launch resident at a time (0: all). */
void sbn_emu_set_residency(unsigned max_blocks);
/* Block `block` (blockIdx.x; -1: none) of the cooperative kernel's launches stays between
   its stage 1 and the rank barrier (SBN_STAMP(2)) for `ms` milliseconds, counted from when
   it first gets there after this call: a block descheduled or starved for longer than the
   team's timeout. */
void sbn_emu_set_stall(int block, unsigned ms);
/* Mutants of the memory-ordering primitives (weak model only; 0: none): */
#define SBN_EMU_MUT_PUBLISH_FENCE 1 /* the flag's st.release.sys becomes relaxed */
#define SBN_EMU_MUT_POLL_ACQUIRE 2  /* the poll's ld.acquire.sys becomes relaxed */
#define SBN_EMU_MUT_BARRIER_FENCE 4 /* the rank barrier's __threadfence()s dropped */
#define SBN_EMU_MUT_SINGLE_BUFFER 8 /* one mailbox buffer: the epoch parity ignored */
#define SBN_EMU_MUT_HOST_AT_START 16 /* the kernels' SBN_MUT_HOST_WORDS_AT_START: every
                                        publishing block reads the error words at start */
#define SBN_EMU_MUT_HOST_EVERY_BLOCK 32 /* SBN_MUT_HOST_WORDS_EVERY_BLOCK: every waiting
                                           block reads them every 32 polls, no rate limit */
#define SBN_EMU_MUT_SECOND_BARRIER 64 /* SBN_MUT_SECOND_BARRIER: one more round trip */
#define SBN_EMU_MUT_NO_ARRIVAL_WAIT 512 /* SBN_MUT_NO_ARRIVAL_WAIT: a solo op's block 0
                                           writes the epoch and nbt before all blocks read them */
#define SBN_EMU_MUT_NO_COEF_REUSE 1024 /* SBN_MUT_NO_COEF_REUSE: a gather for every unit */
#define SBN_EMU_MUT_DZ_LATE 4096 /* SBN_MUT_DZ_LATE: the stream backward with ReLU and dz
                                    reads dy and y again in stage 5 (8|x|, not 7) */
#define SBN_EMU_MUT_PARAM_PREFETCH_NEXT 8192 /* SBN_MUT_PARAM_PREFETCH_NEXT: a local merge
                                               asks L2 for the next chunk's parameters */
#define SBN_EMU_MUT_UNIT_LATE_STOP 16384 /* SBN_MUT_UNIT_LATE_STOP: the unit kernel looks at
                                            the stop words after its first unit's outputs */
#define SBN_EMU_MUT_UNIT_FIRST_SLOT 32768 /* SBN_MUT_UNIT_FIRST_SLOT: the unit kernel's later
                                             units find no coefficients of their own */
#define SBN_EMU_MUT_SMALL_LATE_STOP 65536 /* SBN_MUT_SMALL_LATE_STOP: the small kernel looks
                                             at the stop words after its first chunk's outputs */
#define SBN_EMU_MUT_SMALL_RELOAD 131072 /* SBN_MUT_SMALL_RELOAD: the small kernel reads x
                                           again for its outputs */
#define SBN_EMU_MUT_SMALL_Z_AFTER_ACT 262144 /* SBN_MUT_SMALL_Z_AFTER_ACT: the small forward
                                                adds z after the activation */
#define SBN_EMU_MUT_SMALL_MASK_X 524288 /* SBN_MUT_SMALL_MASK_X: the small backward's mask
                                           from x, not y */
#define SBN_EMU_MUT_XMASK_NO_BAND 1048576 /* SBN_MUT_XMASK_NO_BAND: the backward's mask from x
                                            without the band: y never read */
#define SBN_EMU_MUT_SOLO_END_THREAD0 2097152 /* SBN_MUT_SOLO_END_THREAD0: the stream kernel's
                                               solo op ended by another thread than the one
                                               that made block 0's arrival */
#define SBN_EMU_MUT_SMALL_TEAM_LOCAL 16777216 /* SBN_MUT_SMALL_TEAM_LOCAL: the team's small
                                                 kernel takes its rank's own values for the
                                                 team's */
#define SBN_EMU_MUT_RECOVER_NO_Z 33554432 /* SBN_MUT_RECOVER_NO_Z: the in-place backward with
                                            a residual recovers x as if z were 0 */
#define SBN_EMU_MUT_NO_RECENTRE 67108864 /* SBN_MUT_NO_RECENTRE: a thread's forward run keeps
                                            its first element as its shift */
/* SBN_MUT_WAITER_BLIND: the stream kernel's waiting blocks skip the stop word at start */
#define SBN_EMU_MUT_WAITER_BLIND 134217728
void sbn_emu_set_mutant(int flags);
/* Accesses of the kernels to host memory: sbn_emu_host_track registers [p, p + bytes)
   as mapped host memory (at most 16 ranges; sbn_emu_host_reset clears them and the
   counts); sbn_emu_host_get gives the loads and stores of the blocks that ended since,
   in all, the most of one block, how many blocks made any, and which blockIdx.x they
   had (bit blockIdx.x % 64). */
/* The longest chain of cross-block dependences (a block's store read by another block:
   a dependent round trip through memory) behind any thread of the launches since
   sbn_emu_hops_reset(1) (which clears what earlier stores recorded); barriers, votes
   and shuffles pass a thread's chain to the others. sbn_emu_hops_reset(0): off. */
void sbn_emu_hops_reset(int on);
unsigned sbn_emu_hops_max(void);
/* The ld.acquire.sys loads of the blocks that ended since sbn_emu_acquires_reset (the
   flags' acquires: one per rank per gather of a chunk's records), in all and the most by
   one block. */
void sbn_emu_acquires_reset(void);
/* Stage 4's loads of per-channel parameters (weight, bias; saved mean and invstd) since
   sbn_emu_params_reset, and how many of them were of a 128-byte line their block had
   asked of L2 (prefetch_l2) before. */
void sbn_emu_params_reset(void);
void sbn_emu_params_get(uint64_t* loads, uint64_t* hits);
void sbn_emu_acquires_get(uint64_t* total, uint64_t* max_block);
void sbn_emu_host_reset(void);
int sbn_emu_host_track(const void* p, size_t bytes);
void sbn_emu_host_get(uint64_t* total, uint64_t* max_block, uint64_t* blocks, uint64_t* block_ids);
/* Loads the weak model answered with a store older than the newest (since start). */
uint64_t sbn_emu_stale_loads(void);
/* Forget the model's locations (memory about to be freed and reused). */
void sbn_emu_weak_forget(void);
/* The scheduler's liveness (FIFO): one block of 64 threads, whose first warp polls a flag
   with __any_sync alone (no __nanosleep) until its second warp's lane 0 sets it, or
   `limit` polls. The polls made, or -1 where the warp gave up: a warp's released lanes
   run first (emu_rt.cc, kHotRun), so the second warp runs only where the
   scheduler still takes from its queue now and then. */
long sbn_emu_collective_spin(long limit);

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_TESTS_COOP_EMU_H_ */
