/* coop_emu.cc — kernels/coop.cu compiled for the CPU emulation (cuda_emu.h), and a
 * "launch" that runs a grid of its kernels as fibers of the calling OS thread until every
 * thread returns (tests/emu/emu_rt.h). */
/* The kernels' entry points under names of their own: the tests link the library too. */
#define sbn_coop_kernel_ptr sbn_emu_coop_kernel_ptr
#define sbn_host_kernel_ptr sbn_emu_host_kernel_ptr
#define sbn_infer_kernel_ptr sbn_emu_infer_kernel_ptr

#include "cuda_emu.h"

#include <stdlib.h>

#include <atomic>

#include "coop_emu.h"

/* What ncclGetPeerPointer is to the GPU build (kernels/coop.cu). */
inline void* sbn_window_peer(const void* win, int64_t off, int peer) {
  return static_cast<const sbn_emu_window_t*>(win)->part[peer] + off;
}

/* sbn_emu_set_stall: the stalled block's threads yield at the kernel's stamp 2 (stage 1
   done) until g_stall_ns after the first of them got there (counted from there, not from
   the call: under ThreadSanitizer a launch takes seconds to reach it); the library's
   builds define no stamp (coop_mem.cuh). */
static std::atomic<int> g_stall_block{-1};
static std::atomic<uint64_t> g_stall_ns{0}, g_stall_until_ns{0};
static void stall_here() {
  uint64_t until = g_stall_until_ns.load();
  if (until == 0) {
    const uint64_t mine = globaltimer_ns() + g_stall_ns.load();
    until = g_stall_until_ns.compare_exchange_strong(until, mine) ? mine : until;
  }
  while (globaltimer_ns() < until) emu::spin_yield();
}
#define SBN_STAMP(i)                                                                  \
  do {                                                                                \
    if ((i) == 2 && (int)blockIdx.x == g_stall_block.load(std::memory_order_relaxed)) \
      stall_here();                                                                   \
  } while (0)
#include "coop.cu"

extern "C" void sbn_emu_set_stall(int block, unsigned ms) {
  g_stall_ns.store((uint64_t)ms * 1000000ull);
  g_stall_until_ns.store(0);
  g_stall_block.store(block);
}

static_assert(SBN_EMU_MUT_HOST_AT_START == SBN_MUT_HOST_WORDS_AT_START &&
                  SBN_EMU_MUT_HOST_EVERY_BLOCK == SBN_MUT_HOST_WORDS_EVERY_BLOCK &&
                  SBN_EMU_MUT_SECOND_BARRIER == SBN_MUT_SECOND_BARRIER &&
                  SBN_EMU_MUT_UNIT_LATE_STOP == SBN_MUT_UNIT_LATE_STOP &&
                  SBN_EMU_MUT_UNIT_FIRST_SLOT == SBN_MUT_UNIT_FIRST_SLOT &&
                  SBN_EMU_MUT_SMALL_LATE_STOP == SBN_MUT_SMALL_LATE_STOP &&
                  SBN_EMU_MUT_SMALL_RELOAD == SBN_MUT_SMALL_RELOAD &&
                  SBN_EMU_MUT_SMALL_Z_AFTER_ACT == SBN_MUT_SMALL_Z_AFTER_ACT &&
                  SBN_EMU_MUT_SMALL_MASK_X == SBN_MUT_SMALL_MASK_X &&
                  SBN_EMU_MUT_WAITER_BLIND == SBN_MUT_WAITER_BLIND,
              "coop_emu.h's names of the kernels' mutants");

/* ---- the scheduler ------------------------------------------------------------------- */
namespace {
struct CollectiveSpin {
  std::atomic<int> flag{0};
  long limit = 0, polls = 0;
};
void collective_spin(void* p) {
  CollectiveSpin* c = static_cast<CollectiveSpin*>(p);
  if (threadIdx.x < 32) {
    long n = 0; /* the same in every lane: __any_sync gives them one answer */
    while (!__any_sync(0xffffffffu, c->flag.load(std::memory_order_relaxed)) && n < c->limit) n++;
    if (threadIdx.x == 0) c->polls = n;
  } else if (threadIdx.x == 32) {
    c->flag.store(1, std::memory_order_relaxed);
  }
}
}  // namespace

extern "C" long sbn_emu_collective_spin(long limit) {
  CollectiveSpin c;
  c.limit = limit;
  emu::run_launch(collective_spin, &c, 1, 64, 0);
  return c.polls < limit ? c.polls : -1;
}

/* ---- byte counting --------------------------------------------------------------------- */
namespace {
struct Range {
  const char* lo;
  const char* hi;
  std::atomic<uint64_t> read{0}, written{0}, read_kept{0};
};
Range g_ranges[64];
std::atomic<int> g_nranges{0};
}  // namespace

/* The tracked range that holds [c, c + bytes), or null. */
static Range* range_of(const char* c, size_t bytes) {
  const int n = g_nranges.load(std::memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (c >= g_ranges[i].lo && c + bytes <= g_ranges[i].hi) return &g_ranges[i];
  return nullptr;
}

void emu_count(const void* p, size_t bytes, int write, uint64_t pol) {
  const char* c = static_cast<const char*>(p);
  Range* r = range_of(c, bytes);
  if (r == nullptr) return;
  (write ? r->written : r->read).fetch_add(bytes, std::memory_order_relaxed);
  if (!write && pol == policy_evict_last()) r->read_kept.fetch_add(bytes, std::memory_order_relaxed);
}

extern "C" void sbn_emu_count_reset(void) {
  g_nranges.store(0);
}

extern "C" int sbn_emu_count_track(const void* p, size_t bytes) {
  const int i = g_nranges.load();
  if (i >= 64 || p == nullptr) return -1;
  g_ranges[i].lo = static_cast<const char*>(p);
  g_ranges[i].hi = g_ranges[i].lo + bytes;
  g_ranges[i].read = 0;
  g_ranges[i].written = 0;
  g_ranges[i].read_kept = 0;
  g_nranges.store(i + 1, std::memory_order_release);
  return i;
}

extern "C" void sbn_emu_count_get(int slot, uint64_t* read, uint64_t* written) {
  *read = slot >= 0 ? g_ranges[slot].read.load() : 0;
  *written = slot >= 0 ? g_ranges[slot].written.load() : 0;
}

extern "C" uint64_t sbn_emu_count_kept(int slot) { return slot >= 0 ? g_ranges[slot].read_kept.load() : 0; }

/* ---- launches -------------------------------------------------------------------------- */
namespace {

template <typename A>
struct Entry {
  void (*fn)(const A);
  const A* args;
  static void run(void* p) {
    const Entry* e = static_cast<const Entry*>(p);
    e->fn(*e->args);
  }
};

template <typename A>
int run_grid(const void* kernel, const A* args, unsigned grid, size_t dyn_bytes) {
  if (kernel == nullptr) return -1;
  Entry<A> e{reinterpret_cast<void (*)(const A)>(const_cast<void*>(kernel)), args};
  emu::run_launch(&Entry<A>::run, &e, grid, SBN_GPU_THREADS, dyn_bytes);
  return 0;
}

}  // namespace

extern "C" int sbn_emu_launch(int kind, int dtype, int tile, int vec, int variant,
                              const sbn_coop_args_t* args, unsigned grid) {
  const size_t dyn = variant == SBN_VAR_ONCHIP ? (size_t)sbn_hold_bytes(kind, args->hold_slots) : 0;
  return run_grid(sbn_coop_kernel_ptr(kind, dtype, tile, vec, variant, sbn_args_epilogue(args)), args, grid, dyn);
}

extern "C" int sbn_emu_kernel_built(int kind, int dtype, int tile, int vec, int variant, int epi) {
  return sbn_coop_kernel_ptr(kind, dtype, tile, vec, variant, epi) != nullptr;
}

extern "C" int sbn_emu_launch_host(int stage, int kind, int dtype, int tile, int vec,
                                   const sbn_coop_args_t* args, unsigned grid) {
  return run_grid(sbn_host_kernel_ptr(stage, kind, dtype, tile, vec, sbn_args_epilogue(args)), args, grid, 0);
}

extern "C" int sbn_emu_launch_infer(int dtype, int kind, int vec, const sbn_infer_args_t* args,
                                    unsigned grid) {
  return run_grid(sbn_infer_kernel_ptr(dtype, kind, vec, sbn_infer_epilogue(args)), args, grid, 0);
}

extern "C" void sbn_emu_push_failure(const sbn_coop_args_t* args, int rank, int code) {
  push_failure(*args, rank, code);
}
