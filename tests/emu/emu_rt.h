/* emu_rt.h — the emulator's runtime (tests/emu/emu_rt.cc): how cuda_emu.h's built-ins run.
 *
 * A launch runs on the calling OS thread. Its CUDA threads are fibers (a stack each,
 * switched in user space) that run until they reach a synchronization point — a block
 * or warp barrier, a warp collective, a __nanosleep in a spin loop — and hand over to
 * the launch's scheduler, which resumes the next runnable fiber: first the lanes a warp
 * barrier released (a warp runs from one collective to the next), then the queue in
 * order (a seeded schedule: at random). Launches that must run at the same time (the
 * ranks of a team launched separately) run on separate OS threads.
 *
 * Options (sbn_emu_set_* in coop_emu.h): at most K blocks resident at a time (blocks
 * start as earlier ones return, as under a tool that serialises kernels); the weak
 * memory model (below); a seeded random choice of the next fiber; mutants of the
 * kernels' memory-ordering primitives (what the weak model must catch).
 *
 * The weak memory model. The kernels touch memory that other blocks or ranks read
 * (partials, mailbox records and their flags, the barrier counter, epochs, error words)
 * only through the accessors of kernels/coop_mem.cuh, which cuda_emu.h sends here.
 * In weak mode every such location keeps its recent stores (value, timestamp, and for a
 * release — or a relaxed store after a fence — the view the storing thread had), and
 * every fiber keeps a view: per location, the oldest store it may still read. A load
 * returns, at the seeded choice, any store not older than the fiber's view (a plain or
 * relaxed load may return a stale value; coherence holds: a fiber never reads older
 * than what it read or wrote before); an acquire load joins the view the store carried
 * into the fiber's, a fence joins what the fiber's relaxed loads read since; barriers
 * (__syncthreads, __syncwarp) join the views of their participants (cumulativity at
 * CTA scope); an RMW reads the newest store and continues its release sequence; a
 * kernel's end makes all its stores visible to later launches. This is the
 * release/acquire part of the PTX model (scopes are not told apart: gpu and sys scope
 * are the same here, and an SC fence is treated as acq_rel), so it is weaker than x86
 * and catches a missing release, acquire or fence, but it is not the full PTX model.
 */
#ifndef SYNCBN_TESTS_EMU_RT_H_
#define SYNCBN_TESTS_EMU_RT_H_

#include <stddef.h>
#include <stdint.h>

#include <map>
#include <string>

namespace emu {

struct Idx {
  unsigned x, y, z;
};

/* What a block's CUDA threads share, besides their barriers (emu_rt.cc). */
struct Warp {
  uint64_t buf[2][32];  /* the lanes' values of a shuffle or vote, by the collective's parity */
  unsigned char par[32] = {}; /* each lane's parity of its next collective */
};
struct Block {
  Warp warp[32];
  int or_acc = 0;
  std::map<std::string, void*> shared; /* SBN_SHARED variables by name */
  void* dyn = nullptr;                 /* the launch's dynamic shared memory */
};

/* Runs grid x threads fibers of fn(ctx); returns when all have returned. */
void run_launch(void (*fn)(void* ctx), void* ctx, unsigned grid, unsigned threads, size_t dyn_bytes);

void bar_block();              /* __syncthreads: every live thread of the block */
void bar_warp(bool ordering);  /* the calling warp's 32 lanes; ordering: __syncwarp */
void spin_yield();             /* __nanosleep: another fiber runs */
void* block_shared(const char* name, size_t size);

/* ---- weak memory (kernels/coop_mem.cuh's accessors of shared locations) ---- */
/* kAcquire: ld.acquire.sys (the flags' polls: the poll mutant and the reader delays act
   on it); kAcquireGpu: ld.acquire.gpu (the rank barrier's poll). */
enum Ord { kWeak = 0, kRelaxed = 1, kAcquire = 2, kRelease = 3, kAcquireGpu = 4 };
uint64_t mem_load(const void* p, int size, int ord);
void mem_store(void* p, int size, uint64_t v, int ord);
uint32_t mem_add_u32(uint32_t* p, uint32_t v); /* atomicAdd: relaxed RMW */
void mem_red_u32(uint32_t* p, uint32_t v);     /* red.relaxed.gpu.add: the same, no value back */
uint32_t mem_rmw_add_u32(uint32_t* p, uint32_t v, bool returns);
void mem_fence();                              /* __threadfence */
void note_prefetch(const void* p);             /* prefetch.L2: the block's set of lines */
void note_param_load(const void* p);           /* a stage-4 parameter load (sbn_emu_params) */
extern bool g_weak;                            /* the weak model is on */

/* Mutants of the primitives (sbn_emu_set_mutant): what the weak model must catch. The
   first two also act without it (C++ atomics: ThreadSanitizer sees the missing order);
   the barrier's fences act only in the weak model (TSan does not model fences, so there
   atomicAdd is a seq_cst RMW). */
enum {
  kMutPublishFence = 1, /* st.release.sys of the flag becomes relaxed */
  kMutPollAcquire = 2,  /* the flag's ld.acquire.sys becomes relaxed */
  kMutBarrierFence = 4, /* the rank barrier's __threadfence()s are dropped */
  kMutSingleBuffer = 8, /* records published into one buffer (no epoch parity) */
  /* 16, 32, 64: the kernels' own mutants (kernels/coop_mem.cuh: SBN_MUT_*), which read
     g_mutant through SBN_MUTANT (cuda_emu.h); 128 (SBN_MUT_HELD_COPIES) is a code-size
     mutant for check-sass.sh, the same arithmetic */
};
extern int g_mutant;

}  // namespace emu

extern thread_local emu::Idx threadIdx, blockIdx, gridDim, blockDim;
extern thread_local emu::Block* emu_block;

#endif /* SYNCBN_TESTS_EMU_RT_H_ */
