/* emu_rt.cc — fibers, the launch scheduler, barriers and the weak memory model of the
 * emulator (see emu_rt.h). */
#include "emu_rt.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "coop_emu.h"

#if defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMU_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif

#ifdef EMU_TSAN
#include <sanitizer/tsan_interface.h>
/* The runtime's own bookkeeping (run queue, barriers, shared-variable map) is touched by
   the fibers of one OS thread in turn; TSan, which sees each fiber as a thread and no
   synchronization in a switch, must not look at it. Kernel memory is not covered. */
extern "C" void AnnotateIgnoreReadsBegin(const char* f, int l);
extern "C" void AnnotateIgnoreReadsEnd(const char* f, int l);
extern "C" void AnnotateIgnoreWritesBegin(const char* f, int l);
extern "C" void AnnotateIgnoreWritesEnd(const char* f, int l);
struct RtIgnore {
  RtIgnore() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~RtIgnore() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
};
#define RT_IGNORE RtIgnore rt_ignore_
#else
#define RT_IGNORE (void)0
#endif
#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

thread_local emu::Idx threadIdx, blockIdx, gridDim, blockDim;
thread_local emu::Block* emu_block;

namespace emu {

bool g_weak = false;
int g_mutant = 0;
namespace {
uint64_t g_seed = 0;   /* 0: FIFO scheduling, no jitter */
unsigned g_resident;   /* 0: every block of a launch at once */
unsigned g_jitter_us;  /* weak/seeded runs: occasional OS sleeps of the spinning launch */
thread_local unsigned t_acquire_delay_us; /* this OS thread's launches: a late reader */

/* ---- context switch ---------------------------------------------------------------- */
#if defined(__x86_64__)
/* Saves the callee-saved registers, MXCSR and the x87 control word on the current stack,
   stores the stack pointer in *from, loads `to` and restores the same from there. */
extern "C" void emu_ctx_switch(void** from, void* to);
extern "C" void emu_ctx_start();
__asm__(
    ".text\n"
    ".globl emu_ctx_switch\n"
    ".type emu_ctx_switch,@function\n"
    "emu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_ctx_switch,.-emu_ctx_switch\n"
    ".globl emu_ctx_start\n"
    ".type emu_ctx_start,@function\n"
    "emu_ctx_start:\n" /* first entry of a fiber: fn(arg) from r13(r12); never returns */
    "  movq %r12, %rdi\n  callq *%r13\n  ud2\n"
    ".size emu_ctx_start,.-emu_ctx_start\n");

void* ctx_make(char* stack, size_t size, void (*fn)(void*), void* arg) {
  uintptr_t top = ((uintptr_t)(stack + size) & ~(uintptr_t)15) - 16; /* rsp after `ret` */
  uint64_t* sp = (uint64_t*)top;
  *--sp = (uint64_t)(uintptr_t)emu_ctx_start; /* ret */
  *--sp = 0;                                  /* rbp */
  *--sp = 0;                                  /* rbx */
  *--sp = (uint64_t)(uintptr_t)arg;           /* r12 */
  *--sp = (uint64_t)(uintptr_t)fn;            /* r13 */
  *--sp = 0;                                  /* r14 */
  *--sp = 0;                                  /* r15 */
  *--sp = (uint64_t)0x037f << 32 | 0x1f80;    /* mxcsr, x87 control word */
  return sp;
}
#else
#include <ucontext.h>
/* Elsewhere: ucontext (slower: a signal-mask system call per switch). */
struct UCtx {
  ucontext_t uc;
};
void emu_ctx_switch(void** from, void* to) {
  UCtx* self = static_cast<UCtx*>(*from);
  if (self == nullptr) *from = self = new UCtx; /* the scheduler's context */
  swapcontext(&self->uc, &static_cast<UCtx*>(to)->uc);
}
void* ctx_make(char* stack, size_t size, void (*fn)(void*), void* arg) {
  UCtx* c = new UCtx;
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, (void (*)())fn, 1, arg);
  return c;
}
#endif

#if defined(EMU_TSAN) || defined(EMU_ASAN)
constexpr size_t kStack = 128 * 1024;
#else
constexpr size_t kStack = 128 * 1024;
#endif
/* Each stack starts at its own offset (a multiple of 64 bytes below kColor) in its
   mapping: at one offset, every fiber's top frames (the context switch's registers among
   them) fell in the same cache sets, 128 KiB apart, and a switch waited for memory
   (test_coop_emu `part 0 2`: 23 -> 16 s on a 2-core EPYC). */
constexpr size_t kColor = 32 * 1024;

/* Stacks are reused across launches (of any OS thread: the launch threads of per-rank
   launches come and go); touched pages only count. */
std::mutex g_stacks_mu;
std::vector<char*> g_stacks;
unsigned g_stacks_made;
char* stack_get() {
  size_t color;
  {
    std::lock_guard<std::mutex> lock(g_stacks_mu);
    if (!g_stacks.empty()) {
      char* s = g_stacks.back();
      g_stacks.pop_back();
      return s;
    }
    color = (size_t)(g_stacks_made++ * 17u % (kColor / 64)) * 64; /* 17: neighbours apart */
  }
  void* p = mmap(nullptr, kStack + kColor, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    fprintf(stderr, "emu: mmap of a fiber stack failed\n");
    abort();
  }
  return static_cast<char*>(p) + color;
}
void stack_put(char* s) {
  std::lock_guard<std::mutex> lock(g_stacks_mu);
  g_stacks.push_back(s);
}

uint64_t mix(uint64_t x) { /* splitmix64 */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
struct Rng {
  uint64_t s = 1;
  uint64_t next() { return s = mix(s); }
  unsigned below(unsigned n) { return (unsigned)(next() % n); }
};

/* ---- weak memory: views, stores, locations ------------------------------------------ */
struct View {
  std::unordered_map<uintptr_t, uint32_t> m;
  uint32_t get(uintptr_t a) const {
    auto it = m.find(a);
    return it == m.end() ? 0u : it->second;
  }
  void bump(uintptr_t a, uint32_t t) {
    uint32_t& x = m[a];
    if (t > x) x = t;
  }
  void join(const View& o) {
    for (const auto& kv : o.m) bump(kv.first, kv.second);
  }
};
typedef std::shared_ptr<const View> ViewP;
/* The stores of the launches completed when a launch started. These snapshots only grow
   (gen counts the completions), so the join of two is the newer one. */
struct Base {
  View v;
  uint64_t gen;
};
typedef std::shared_ptr<const Base> BaseP;
BaseP newer(const BaseP& a, const BaseP& b) {
  if (!a) return b;
  if (!b) return a;
  return b->gen > a->gen ? b : a;
}
/* What a release carries: the storing fiber's view and its launch's base. */
struct Rel {
  BaseP base;
  ViewP cur;
};
typedef std::shared_ptr<const Rel> RelP;
struct Store {
  uint64_t val;
  uint32_t ts;
  RelP rel;
};
struct Loc {
  int size = 0;
  uint32_t next = 1;
  std::vector<Store> h; /* by timestamp; the newest is in memory too */
};
constexpr size_t kHistory = 8;

/* A fiber's views. `cur` is shared (copy on write) with the fibers it met at a barrier
   and with the releases it made since it last changed. */
struct WThr {
  std::shared_ptr<View> cur; /* the oldest store it may read, per location */
  View acq;                  /* what its relaxed loads read since its last fence carried */
  RelP relf;                 /* its view at its last fence: carried by its relaxed stores */
  BaseP base;                /* completed launches it knows of (its launch's, or newer) */
  uint32_t eff(uintptr_t a) const {
    return std::max(cur ? cur->get(a) : 0u, base ? base->v.get(a) : 0u);
  }
  View& mut() {
    if (!cur)
      cur = std::make_shared<View>();
    else if (cur.use_count() > 1)
      cur = std::make_shared<View>(*cur);
    return *cur;
  }
};

std::mutex g_mu; /* the model (launches of several OS threads share it) */
std::unordered_map<uintptr_t, Loc> g_locs;
View g_completed;
uint64_t g_completed_gen;
BaseP g_base; /* the snapshot of g_completed at g_completed_gen */
uint64_t g_stale; /* loads that returned a store older than the newest */

}  // namespace

/* ---- fibers, blocks, launches -------------------------------------------------------- */
struct Launch;
struct Fiber {
  void* sp = nullptr;
  char* stack = nullptr;
  unsigned block = 0, tid = 0;
  bool done = false;
  Rng rng;
  std::unique_ptr<WThr> w;
  Launch* l = nullptr;
  uint32_t hops = 0; /* sbn_emu_hops: the longest chain of cross-block dependences behind it */
#ifdef EMU_TSAN
  void* tsan = nullptr;
#endif
};
struct Bar {
  unsigned n = 0, arrived = 0;
  bool warp = false; /* a warp's: its lanes run next when released (kHotRun) */
  std::vector<Fiber*> waiting;
};
struct BlockRt {
  Block pub;
  Bar bar;
  Bar wbar[32];
  std::vector<Fiber> fibers;
  unsigned live = 0;
  bool delayed = false; /* the reader delay (sbn_emu_set_acquire_delay) was served */
  uint64_t host_acc = 0; /* accesses to registered host memory (sbn_emu_host_track) */
  uint64_t acq_sys = 0;  /* ld.acquire.sys loads: one per rank's flag per gather
                            (sbn_emu_acquires) */
  std::unordered_set<uintptr_t> prefetched; /* lines (128 B) asked of L2 (sbn_emu_params) */
  char bar_sync_obj = 0, wbar_sync_obj[32] = {}; /* TSan: the barriers' sync addresses */
};
struct Launch {
  void (*fn)(void*);
  void* ctx;
  unsigned grid, threads;
  size_t dyn;
  std::vector<std::unique_ptr<BlockRt>> blocks;
  std::vector<Fiber*> runq;
  size_t runq_head = 0;
  std::deque<Fiber*> hot; /* released by a warp barrier: run before runq (runq_pop) */
  unsigned hot_run = 0;   /* picks from `hot` since the last from runq */
  Fiber* cur = nullptr;
  void* sched_sp = nullptr;
  unsigned started = 0, finished = 0, resident = 0, limit = 0;
  Rng rng;
  bool random = false;
  uint64_t spins = 0;
  BaseP base;                                        /* weak: completed stores at the start */
  std::vector<std::pair<uintptr_t, uint32_t>> log;   /* weak: this launch's stores */
#ifdef EMU_TSAN
  void* tsan_sched = nullptr;
  char sync_start = 0, sync_end = 0; /* a launch's start and end, for TSan (stream order) */
#endif
#ifdef EMU_ASAN
  const void* sched_stack = nullptr;
  size_t sched_stack_size = 0;
#endif
};

namespace {
thread_local Launch* t_launch;
thread_local uint64_t t_launch_seq; /* launches run by this OS thread (seeds) */

void set_idx(Fiber* f) {
  RT_IGNORE; /* the fiber's built-in variables, read by it only */
  Launch* l = f->l;
  threadIdx = Idx{f->tid, 0, 0};
  blockIdx = Idx{f->block, 0, 0};
  gridDim = Idx{l->grid, 1, 1};
  blockDim = Idx{l->threads, 1, 1};
  emu_block = &l->blocks[f->block]->pub;
}

void runq_push(Launch* l, Fiber* f) { l->runq.push_back(f); }
/* FIFO scheduling: the lanes a warp barrier (a shuffle, a vote, __syncwarp) released run
   before the queue (in their own queue, `hot`), so a warp goes on from one collective to
   the next while its 32 stacks are in the cache; at the queue's end, every other fiber
   of the launch (~1300 on average in test_coop_emu) ran in between (`part 0 2`: 14 ->
   11 s). A block barrier's release still goes to the queue's end. A seeded schedule picks
   from the queue at random, as before. After kHotRun picks from `hot` one comes from the
   queue, so no fiber there waits forever behind warps that loop on collectives without
   __nanosleep (and `hot`, first in first out, keeps none of its own waiting either). */
constexpr unsigned kHotRun = 1024;
Fiber* runq_pop(Launch* l) {
  const size_t n = l->runq.size() - l->runq_head;
  if (!l->hot.empty() && (n == 0 || l->hot_run < kHotRun)) {
    l->hot_run++;
    Fiber* f = l->hot.front();
    l->hot.pop_front();
    return f;
  }
  l->hot_run = 0;
  if (n == 0) return nullptr;
  size_t i = l->runq_head;
  if (l->random && n > 1) {
    i += l->rng.below((unsigned)n);
    std::swap(l->runq[i], l->runq[l->runq_head]);
    i = l->runq_head;
  }
  Fiber* f = l->runq[i];
  l->runq_head++;
  if (l->runq_head > 4096 && l->runq_head * 2 > l->runq.size()) {
    l->runq.erase(l->runq.begin(), l->runq.begin() + (long)l->runq_head);
    l->runq_head = 0;
  }
  return f;
}

/* From the running fiber to the scheduler; returns when the scheduler resumes it. */
void to_scheduler(Fiber* f, bool dying) {
  void** save;
  void* to;
#ifdef EMU_ASAN
  const void* sched_stack;
  size_t sched_stack_size;
#endif
#ifdef EMU_TSAN
  void* sched_fiber;
#endif
  {
    RT_IGNORE; /* ended before the switch: a dying fiber must not keep it */
    Launch* l = f->l;
    save = &f->sp;
    to = l->sched_sp;
#ifdef EMU_ASAN
    sched_stack = l->sched_stack;
    sched_stack_size = l->sched_stack_size;
#endif
#ifdef EMU_TSAN
    sched_fiber = l->tsan_sched;
#endif
  }
#ifdef EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(dying ? nullptr : &fake, sched_stack, sched_stack_size);
#endif
#ifdef EMU_TSAN
  __tsan_switch_to_fiber(sched_fiber, 1 /* __tsan_switch_to_fiber_no_sync */);
#endif
  (void)dying;
  emu_ctx_switch(save, to);
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void fiber_exit_bookkeeping(Fiber* f);

void fiber_main(void* arg) {
  Fiber* f = static_cast<Fiber*>(arg);
  void (*fn)(void*);
  void* ctx;
  {
    RT_IGNORE;
    fn = f->l->fn;
    ctx = f->l->ctx;
  }
#ifdef EMU_TSAN
  __tsan_acquire(&f->l->sync_start); /* what the host wrote before the launch */
#endif
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &f->l->sched_stack, &f->l->sched_stack_size);
#endif
  fn(ctx);
#ifdef EMU_TSAN
  __tsan_release(&f->l->sync_end); /* to the launch's end */
  { /* an exit counts as an arrival at the thread's barriers (fiber_exit_bookkeeping): its
       accesses before it (a collective's read of Warp::buf) come before what the others
       do after them */
    RT_IGNORE;
    BlockRt& B = *f->l->blocks[f->block];
    __tsan_release(&B.bar_sync_obj);
    __tsan_release(&B.wbar_sync_obj[f->tid >> 5]);
  }
#endif
  fiber_exit_bookkeeping(f);
  to_scheduler(f, true);
  abort(); /* never resumed */
}

void weak_join_all(std::vector<Fiber*>& ps);

void hops_join(std::vector<Fiber*>& ps, Fiber* last);

/* The barrier's last arrival releases the others (who are in `waiting`). */
void bar_release(Launch* l, Bar& b, bool ordering, Fiber* last) {
  hops_join(b.waiting, last); /* a barrier, a vote, a shuffle: what one knew, all know */
  if (ordering && g_weak) {
    std::vector<Fiber*> ps(b.waiting);
    if (last != nullptr) ps.push_back(last);
    weak_join_all(ps);
  }
  if (b.warp && !l->random) /* FIFO: the warp's lanes first (kHotRun) */
    l->hot.insert(l->hot.end(), b.waiting.begin(), b.waiting.end());
  else
    for (Fiber* w : b.waiting) runq_push(l, w);
  b.waiting.clear();
  b.arrived = 0;
}

void bar_arrive(Bar& b, bool ordering, void* sync_obj) {
  Launch* l = t_launch;
  Fiber* f = l->cur;
#ifdef EMU_TSAN
  __tsan_release(sync_obj);
#else
  (void)sync_obj;
#endif
  const bool wait = ++b.arrived < b.n;
  if (wait)
    b.waiting.push_back(f);
  else
    bar_release(l, b, ordering, f);
  if (wait) to_scheduler(f, false);
#ifdef EMU_TSAN
  __tsan_acquire(sync_obj);
#endif
}

/* An exited thread counts as arrived at its block's and warp's barriers (as on the GPU,
   where the barrier expects the threads that have not exited). */
void fiber_exit_bookkeeping(Fiber* f) {
  RT_IGNORE;
  Launch* l = f->l;
  BlockRt& B = *l->blocks[f->block];
  f->done = true;
  B.live--;
  Bar* bars[2] = {&B.bar, &B.wbar[f->tid >> 5]};
  for (Bar* b : bars) {
    b->n--;
    if (b->n > 0 && b->arrived == b->n) bar_release(l, *b, true, nullptr);
  }
}

void block_start(Launch* l, unsigned bi) {
  BlockRt& B = *l->blocks[bi];
  B.fibers = std::vector<Fiber>(l->threads);
  B.live = l->threads;
  B.bar.n = l->threads;
  for (unsigned w = 0; w < (l->threads + 31) / 32; w++) {
    B.wbar[w].n = std::min(32u, l->threads - w * 32);
    B.wbar[w].warp = true;
  }
  if (l->dyn) B.pub.dyn = calloc(1, l->dyn);
  for (unsigned t = 0; t < l->threads; t++) {
    Fiber& f = B.fibers[t];
    f.l = l;
    f.block = bi;
    f.tid = t;
    f.rng.s = mix(g_seed ^ mix(t_launch_seq * 0x10001ull + bi * 1024ull + t));
    f.stack = stack_get();
    f.sp = ctx_make(f.stack, kStack, fiber_main, &f);
#ifdef EMU_TSAN
    f.tsan = __tsan_create_fiber(0);
#endif
    runq_push(l, &f);
  }
  l->resident++;
}

void host_count_block(uint64_t n, unsigned bi);
void hops_finish(uint32_t h);
void acq_count_block(uint64_t n);

void block_finish(Launch* l, unsigned bi) {
  BlockRt& B = *l->blocks[bi];
  {
    RT_IGNORE; /* the block's counters and its fibers' hops: the runtime's bookkeeping */
    host_count_block(B.host_acc, bi);
    acq_count_block(B.acq_sys);
    for (Fiber& f : B.fibers) hops_finish(f.hops);
  }
#ifdef EMU_TSAN
  __tsan_acquire(&l->sync_end); /* the block's threads have returned */
#endif
  for (Fiber& f : B.fibers) {
    stack_put(f.stack);
#ifdef EMU_TSAN
    __tsan_destroy_fiber(f.tsan);
#endif
  }
  B.fibers.clear();
  for (auto& kv : B.pub.shared) free(kv.second);
  B.pub.shared.clear();
  free(B.pub.dyn);
  B.pub.dyn = nullptr;
  l->resident--;
  l->finished++;
}

}  // namespace

void run_launch(void (*fn)(void*), void* ctx, unsigned grid, unsigned threads, size_t dyn_bytes) {
  if (grid == 0) return;
  Launch l;
  l.fn = fn;
  l.ctx = ctx;
  l.grid = grid;
  l.threads = threads;
  l.dyn = dyn_bytes;
  l.limit = g_resident == 0 || g_resident > grid ? grid : g_resident;
  t_launch_seq++;
  l.rng.s = mix(g_seed ^ t_launch_seq);
  l.random = g_seed != 0;
  for (unsigned b = 0; b < grid; b++) l.blocks.emplace_back(new BlockRt);
  if (g_weak) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_base || g_base->gen != g_completed_gen)
      g_base = std::make_shared<const Base>(Base{g_completed, g_completed_gen});
    l.base = g_base;
  }
#ifdef EMU_TSAN
  l.tsan_sched = __tsan_get_current_fiber();
  __tsan_release(&l.sync_start);
#endif
  Launch* outer = t_launch;
  t_launch = &l;
  while (l.started < l.limit) block_start(&l, l.started++);
  while (l.finished < grid) {
    Fiber* f;
    {
      RT_IGNORE;
      f = runq_pop(&l);
    }
    if (f == nullptr) {
      fprintf(stderr, "emu: every live thread of the launch waits at a barrier (a kernel bug)\n");
      abort();
    }
    l.cur = f;
    set_idx(f);
#ifdef EMU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, kStack);
#endif
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(f->tsan, 1);
#endif
    emu_ctx_switch(&l.sched_sp, f->sp);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    l.cur = nullptr;
    if (f->done && l.blocks[f->block]->live == 0) {
      block_finish(&l, f->block);
      if (l.started < grid) block_start(&l, l.started++);
    }
  }
  t_launch = outer;
#ifdef EMU_TSAN
  __tsan_acquire(&l.sync_end); /* the host sees what the kernel wrote */
#endif
  if (g_weak) { /* a kernel's end: its stores are visible to every later launch */
    std::lock_guard<std::mutex> lock(g_mu);
    for (const auto& e : l.log) g_completed.bump(e.first, e.second);
    g_completed_gen++;
  }
}

void bar_block() {
  RT_IGNORE;
  BlockRt& B = *t_launch->blocks[t_launch->cur->block];
  bar_arrive(B.bar, true, &B.bar_sync_obj);
}

void bar_warp(bool ordering) {
  RT_IGNORE;
  Fiber* f = t_launch->cur;
  BlockRt& B = *t_launch->blocks[f->block];
  bar_arrive(B.wbar[f->tid >> 5], ordering, &B.wbar_sync_obj[f->tid >> 5]);
}

/* With jitter on, the launch's OS thread sleeps now and then (1 in `odds`): in a spin,
   and after an acquire (a reader late after it saw a flag) — ranks drift apart. */
static void jitter(Fiber* f, unsigned odds) {
  if (g_jitter_us == 0 || f->rng.below(odds) != 0) return;
  const unsigned us = f->rng.below(g_jitter_us) + 1;
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  nanosleep(&ts, nullptr);
}

void spin_yield() {
  RT_IGNORE;
  Launch* l = t_launch;
  Fiber* f = l->cur;
  runq_push(l, f);
  /* let the other launches (OS threads) run: a spinning launch waits for them */
  if ((++l->spins & 31u) == 0) {
    struct timespec ts = {0, 50000}; /* a launch left spinning does not hog a core */
    nanosleep(&ts, nullptr);
  }
  jitter(f, 256);
  to_scheduler(f, false);
}

void* block_shared(const char* name, size_t size) {
  RT_IGNORE;
  void*& p = emu_block->shared[name];
  if (p == nullptr) p = calloc(1, size);
  return p;
}

/* ---- weak memory ----------------------------------------------------------------------- */
namespace {

WThr& wthr() {
  RT_IGNORE;
  Fiber* f = t_launch->cur;
  if (!f->w) {
    f->w.reset(new WThr);
    f->w->base = t_launch->base;
  }
  return *f->w;
}

uint64_t raw_load(const void* p, int size) {
  uint64_t v = 0;
  memcpy(&v, p, (size_t)size);
  return v;
}

/* The location at p, with a store from outside the model (the host, or memory reused by
   the tests) taken as the one newest store everyone sees. */
Loc& loc_at(const void* p, int size) {
  const uintptr_t a = (uintptr_t)p;
  Loc& L = g_locs[a];
  const uint64_t mem = raw_load(p, size);
  if (L.size != size || L.h.empty() || L.h.back().val != mem) {
    L.size = size;
    L.h.clear();
    L.h.push_back(Store{mem, L.next++, nullptr});
  }
  return L;
}

/* What release r carries, into view `into` of fiber w (the base: w's own). */
void join_rel(WThr& w, View& into, const RelP& r) {
  if (!r) return;
  if (r->cur) into.join(*r->cur);
  w.base = newer(w.base, r->base);
}

RelP snapshot(WThr& w) {
  std::shared_ptr<Rel> r = std::make_shared<Rel>();
  r->base = w.base;
  if (!w.cur) w.cur = std::make_shared<View>();
  r->cur = w.cur; /* shared until the fiber's next change */
  return r;
}

const Store& choose(WThr& w, Loc& L, uintptr_t a) {
  const uint32_t v = w.eff(a);
  size_t i0 = L.h.size() - 1;
  while (i0 > 0 && L.h[i0 - 1].ts >= v) i0--;
  const size_t n = L.h.size() - i0;
  size_t pick = L.h.size() - 1;
  if (n > 1) {
    Rng& rng = t_launch->cur->rng;
    if (rng.below(2) == 0) pick = i0 + rng.below((unsigned)n);
  }
  if (pick != L.h.size() - 1) g_stale++;
  if (w.eff(a) < L.h[pick].ts) w.mut().bump(a, L.h[pick].ts);
  return L.h[pick];
}

void append(WThr& w, Loc& L, void* p, uint64_t val, RelP rel) {
  const uintptr_t a = (uintptr_t)p;
  Store s{val, L.next++, std::move(rel)};
  memcpy(p, &val, (size_t)L.size);
  w.mut().bump(a, s.ts);
  t_launch->log.emplace_back(a, s.ts);
  L.h.push_back(std::move(s));
  if (L.h.size() > kHistory) L.h.erase(L.h.begin());
}

void weak_join_all(std::vector<Fiber*>& ps) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<const View*> seen;
  for (Fiber* f : ps)
    if (f->w && f->w->cur && !f->w->cur->m.empty() &&
        std::find(seen.begin(), seen.end(), f->w->cur.get()) == seen.end())
      seen.push_back(f->w->cur.get());
  if (seen.empty()) return;
  std::shared_ptr<View> j;
  if (seen.size() == 1) {
    for (Fiber* f : ps)
      if (f->w && f->w->cur.get() == seen[0]) j = f->w->cur;
  } else {
    j = std::make_shared<View>();
    for (const View* v : seen) j->join(*v);
  }
  for (Fiber* f : ps) {
    if (!f->w) {
      f->w.reset(new WThr);
      f->w->base = f->l->base;
    }
    f->w->cur = j;
  }
}

}  // namespace

/* ---- accesses to host memory (sbn_emu_host_track) ---------------------------------------
   The ranges the test registers as mapped host memory (the team's error words); every
   access of a block to them through the accessors is counted in its BlockRt, and added
   at the block's end to the totals. */
namespace {
/* v into a running maximum that blocks finishing on several threads update */
template <typename T>
void atomic_max(std::atomic<T>& m, T v) {
  T cur = m.load();
  while (v > cur && !m.compare_exchange_weak(cur, v)) {
  }
}

struct HostRange {
  std::atomic<const char*> lo{nullptr}, hi{nullptr};
};
HostRange g_host[16];
std::atomic<int> g_nhost{0};
std::atomic<uint64_t> g_host_total{0}, g_host_max{0}, g_host_blocks{0}, g_host_ids{0};

void host_access(const void* p) {
  RT_IGNORE; /* the runtime's bookkeeping (the current fiber, its block's counter) */
  const int n = g_nhost.load(std::memory_order_acquire);
  if (n == 0 || t_launch == nullptr || t_launch->cur == nullptr) return;
  const char* c = static_cast<const char*>(p);
  for (int i = 0; i < n; i++)
    if (c >= g_host[i].lo.load() && c < g_host[i].hi.load()) {
      t_launch->blocks[t_launch->cur->block]->host_acc++;
      return;
    }
}
/* ---- chains of cross-block dependences (sbn_emu_hops_*) ----------------------------------
   Every store through the accessors records the storing fiber's hops and its block (a
   key of launch and block); a load, or an atomic, that returns a value another block
   stored makes the loading fiber's hops at least that store's + 1; barriers, votes and
   shuffles join the hops of their participants. A fiber's hops at its end is then the
   length of the longest chain of "block A stored, block B read it" behind everything it
   did: the dependent cross-block round trips on its path. */
struct HopStore {
  uint32_t hops;
  uintptr_t key;
};
std::mutex g_hop_mu;
std::unordered_map<uintptr_t, HopStore> g_hop_map;
std::atomic<bool> g_hops_on{false};
std::atomic<uint32_t> g_hops_max{0};

uintptr_t hop_key() {
  return reinterpret_cast<uintptr_t>(t_launch) * 65536u + t_launch->cur->block;
}
void hop_load(const void* p) {
  RT_IGNORE; /* the runtime's bookkeeping (the current fiber and its hops) */
  if (!g_hops_on.load(std::memory_order_relaxed) || t_launch == nullptr || t_launch->cur == nullptr) return;
  std::lock_guard<std::mutex> lock(g_hop_mu);
  auto it = g_hop_map.find(reinterpret_cast<uintptr_t>(p));
  if (it != g_hop_map.end() && it->second.key != hop_key())
    t_launch->cur->hops = std::max(t_launch->cur->hops, it->second.hops + 1);
}
void hop_store(const void* p) {
  RT_IGNORE;
  if (!g_hops_on.load(std::memory_order_relaxed) || t_launch == nullptr || t_launch->cur == nullptr) return;
  std::lock_guard<std::mutex> lock(g_hop_mu);
  g_hop_map[reinterpret_cast<uintptr_t>(p)] = HopStore{t_launch->cur->hops, hop_key()};
}
void hops_join(std::vector<Fiber*>& ps, Fiber* last) {
  RT_IGNORE; /* the fibers' hops: the runtime's bookkeeping */
  uint32_t m = last != nullptr ? last->hops : 0;
  for (Fiber* f : ps) m = std::max(m, f->hops);
  for (Fiber* f : ps) f->hops = m;
  if (last != nullptr) last->hops = m;
}

/* An atomic add: the fiber waits a round trip for what the others added (hops + 1 from
   another block's store), but the value it leaves carries only what was known before it
   (the max, no + 1): arrivals at a counter are not a chain of round trips, they are
   pipelined at the memory; the one that reads the last of them pays one. */
void hop_rmw(const void* p) {
  RT_IGNORE;
  if (!g_hops_on.load(std::memory_order_relaxed) || t_launch == nullptr || t_launch->cur == nullptr) return;
  std::lock_guard<std::mutex> lock(g_hop_mu);
  Fiber* f = t_launch->cur;
  const uintptr_t key = hop_key();
  auto it = g_hop_map.find(reinterpret_cast<uintptr_t>(p));
  uint32_t stored = f->hops;
  if (it != g_hop_map.end()) {
    stored = std::max(stored, it->second.hops);
    if (it->second.key != key) f->hops = std::max(f->hops, it->second.hops + 1);
  }
  g_hop_map[reinterpret_cast<uintptr_t>(p)] = HopStore{stored, key};
}

/* A reduction (red.add: no value comes back): the fiber waits for nothing, so its hops
   stay; the value it leaves carries what it knew, joined with what was there. */
void hop_red(const void* p) {
  RT_IGNORE;
  if (!g_hops_on.load(std::memory_order_relaxed) || t_launch == nullptr || t_launch->cur == nullptr) return;
  std::lock_guard<std::mutex> lock(g_hop_mu);
  Fiber* f = t_launch->cur;
  auto it = g_hop_map.find(reinterpret_cast<uintptr_t>(p));
  const uint32_t stored = it != g_hop_map.end() ? std::max(f->hops, it->second.hops) : f->hops;
  g_hop_map[reinterpret_cast<uintptr_t>(p)] = HopStore{stored, hop_key()};
}
void hops_finish(uint32_t h) { atomic_max(g_hops_max, h); }

/* ---- ld.acquire.sys loads per block (sbn_emu_acquires_*): the gathers' count ---------- */
std::atomic<uint64_t> g_acq_total{0}, g_acq_max{0};
void acq_count_block(uint64_t n) {
  g_acq_total += n;
  atomic_max(g_acq_max, n);
}
void host_count_block(uint64_t n, unsigned bi) {
  if (n == 0) return;
  g_host_total += n;
  g_host_blocks += 1;
  g_host_ids |= 1ull << (bi % 64);
  atomic_max(g_host_max, n);
}
}  // namespace

static uint64_t load_impl(const void* p, int size, int ord);

/* ---- stage 4's parameter loads, and whether their block asked L2 for their line first
   (sbn_emu_params_*) ------------------------------------------------------------------ */
namespace {
std::atomic<uint64_t> g_param_loads{0}, g_param_hits{0};
constexpr uintptr_t kLine = 128;
}  // namespace
void note_prefetch(const void* p) {
  RT_IGNORE; /* the runtime's bookkeeping: the block's own set, its fibers take turns */
  if (t_launch == nullptr || t_launch->cur == nullptr) return;
  t_launch->blocks[t_launch->cur->block]->prefetched.insert(reinterpret_cast<uintptr_t>(p) / kLine);
}
void note_param_load(const void* p) {
  RT_IGNORE;
  if (t_launch == nullptr || t_launch->cur == nullptr) return;
  const BlockRt& B = *t_launch->blocks[t_launch->cur->block];
  g_param_loads++;
  if (B.prefetched.count(reinterpret_cast<uintptr_t>(p) / kLine)) g_param_hits++;
}

/* an ld.acquire.sys, counted in its block (sbn_emu_acquires_*) */
static void acq_access() {
  RT_IGNORE; /* the runtime's bookkeeping (the current fiber, its block's counter) */
  if (t_launch == nullptr || t_launch->cur == nullptr) return;
  t_launch->blocks[t_launch->cur->block]->acq_sys++;
}

uint64_t mem_load(const void* p, int size, int ord) {
  host_access(p);
  if (ord == kAcquire) acq_access();
  hop_load(p);
  const uint64_t v = load_impl(p, size, ord);
  if (ord == kAcquire && (g_jitter_us || t_acquire_delay_us)) {
    RT_IGNORE;
    jitter(t_launch->cur, 4);
    BlockRt& B = *t_launch->blocks[t_launch->cur->block];
    if (t_acquire_delay_us && !B.delayed) {
      B.delayed = true;
      struct timespec ts = {(time_t)(t_acquire_delay_us / 1000000),
                            (long)(t_acquire_delay_us % 1000000) * 1000};
      nanosleep(&ts, nullptr);
    }
  }
  return v;
}

static uint64_t load_impl(const void* p, int size, int ord) {
  if (ord == kAcquire && (g_mutant & kMutPollAcquire)) ord = kRelaxed;
  if (!g_weak) {
    uint64_t v = 0;
    if (ord == kWeak) return raw_load(p, size);
    const int mo = ord == kRelaxed ? __ATOMIC_RELAXED : __ATOMIC_ACQUIRE;
    if (size == 4) v = __atomic_load_n((const uint32_t*)p, mo);
    else v = (uint64_t)__atomic_load_n((const uint64_t*)p, mo);
    return v;
  }
  if (ord == kAcquireGpu) ord = kAcquire;
  std::lock_guard<std::mutex> lock(g_mu);
  WThr& w = wthr();
  Loc& L = loc_at(p, size);
  const Store& s = choose(w, L, (uintptr_t)p);
  if (ord == kAcquire && s.rel) {
    join_rel(w, w.mut(), s.rel);
  } else if (ord == kRelaxed && s.rel) {
    join_rel(w, w.acq, s.rel);
  }
  return s.val;
}

void mem_store(void* p, int size, uint64_t v, int ord) {
  host_access(p);
  hop_store(p);
  if (ord == kRelease && (g_mutant & kMutPublishFence)) ord = kRelaxed;
  if (!g_weak) {
    if (ord == kWeak) {
      memcpy(p, &v, (size_t)size);
    } else {
      const int mo = ord == kRelease ? __ATOMIC_RELEASE : __ATOMIC_RELAXED;
      if (size == 4) __atomic_store_n((uint32_t*)p, (uint32_t)v, mo);
      else __atomic_store_n((uint64_t*)p, v, mo);
    }
    return;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  WThr& w = wthr();
  Loc& L = loc_at(p, size);
  RelP rel;
  if (ord == kRelease) {
    w.mut().bump((uintptr_t)p, L.next); /* the store itself */
    rel = snapshot(w);
  } else if (ord == kRelaxed) {
    rel = w.relf;
  }
  append(w, L, p, v, std::move(rel));
}

uint32_t mem_add_u32(uint32_t* p, uint32_t v) { return mem_rmw_add_u32(p, v, true); }
void mem_red_u32(uint32_t* p, uint32_t v) { (void)mem_rmw_add_u32(p, v, false); }

uint32_t mem_rmw_add_u32(uint32_t* p, uint32_t v, bool returns) {
  host_access(p);
  if (returns) {
    hop_rmw(p);
  } else {
    hop_red(p);
  }
  if (!g_weak) return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
  std::lock_guard<std::mutex> lock(g_mu);
  WThr& w = wthr();
  Loc& L = loc_at(p, 4);
  const Store& last = L.h.back(); /* an RMW reads the newest store */
  const uint32_t old = (uint32_t)last.val;
  /* relaxed: what it read carries to a later fence; it continues the release sequence
     of the store it read, and carries this fiber's last fence */
  join_rel(w, w.acq, last.rel);
  RelP rel;
  if (last.rel && w.relf) {
    std::shared_ptr<View> j = std::make_shared<View>();
    if (last.rel->cur) j->join(*last.rel->cur);
    if (w.relf->cur) j->join(*w.relf->cur);
    std::shared_ptr<Rel> r = std::make_shared<Rel>();
    r->base = newer(last.rel->base, w.relf->base);
    r->cur = j;
    rel = r;
  } else {
    rel = last.rel ? last.rel : w.relf;
  }
  const uint64_t nv = (uint64_t)(old + v);
  append(w, L, p, nv, std::move(rel));
  return old;
}

void mem_fence() {
  if (!g_weak) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return;
  }
  if (g_mutant & kMutBarrierFence) return;
  std::lock_guard<std::mutex> lock(g_mu);
  WThr& w = wthr();
  if (!w.acq.m.empty()) w.mut().join(w.acq);
  w.acq.m.clear();
  w.relf = snapshot(w);
}

}  // namespace emu

/* ---- options (coop_emu.h) ------------------------------------------------------------------- */
extern "C" void sbn_emu_set_weak(int on, uint64_t seed) {
  std::lock_guard<std::mutex> lock(emu::g_mu);
  emu::g_weak = on != 0;
  emu::g_seed = seed;
  emu::g_locs.clear();
  emu::g_completed.m.clear();
  emu::g_completed_gen++;
}
extern "C" void sbn_emu_set_jitter(unsigned max_us) { emu::g_jitter_us = max_us; }
extern "C" void sbn_emu_set_acquire_delay(unsigned us) { emu::t_acquire_delay_us = us; }
extern "C" void sbn_emu_set_residency(unsigned max_blocks) { emu::g_resident = max_blocks; }
extern "C" void sbn_emu_set_mutant(int flags) { emu::g_mutant = flags; }
extern "C" void sbn_emu_hops_reset(int on) {
  std::lock_guard<std::mutex> lock(emu::g_hop_mu);
  emu::g_hop_map.clear();
  emu::g_hops_max = 0;
  emu::g_hops_on = on != 0;
}
extern "C" unsigned sbn_emu_hops_max(void) { return emu::g_hops_max.load(); }
extern "C" void sbn_emu_params_reset(void) {
  emu::g_param_loads = 0;
  emu::g_param_hits = 0;
}
extern "C" void sbn_emu_params_get(uint64_t* loads, uint64_t* hits) {
  *loads = emu::g_param_loads.load();
  *hits = emu::g_param_hits.load();
}
extern "C" void sbn_emu_acquires_reset(void) {
  emu::g_acq_total = 0;
  emu::g_acq_max = 0;
}
extern "C" void sbn_emu_acquires_get(uint64_t* total, uint64_t* max_block) {
  *total = emu::g_acq_total.load();
  *max_block = emu::g_acq_max.load();
}
extern "C" void sbn_emu_host_reset(void) {
  emu::g_nhost.store(0);
  emu::g_host_total = 0;
  emu::g_host_max = 0;
  emu::g_host_blocks = 0;
  emu::g_host_ids = 0;
}
extern "C" int sbn_emu_host_track(const void* p, size_t bytes) {
  const int i = emu::g_nhost.load();
  if (i >= 16 || p == nullptr) return -1;
  emu::g_host[i].lo = static_cast<const char*>(p);
  emu::g_host[i].hi = static_cast<const char*>(p) + bytes;
  emu::g_nhost.store(i + 1, std::memory_order_release);
  return i;
}
extern "C" void sbn_emu_host_get(uint64_t* total, uint64_t* max_block, uint64_t* blocks,
                                 uint64_t* block_ids) {
  *block_ids = emu::g_host_ids.load();
  *total = emu::g_host_total.load();
  *max_block = emu::g_host_max.load();
  *blocks = emu::g_host_blocks.load();
}
extern "C" uint64_t sbn_emu_stale_loads(void) {
  std::lock_guard<std::mutex> lock(emu::g_mu);
  return emu::g_stale;
}
extern "C" void sbn_emu_weak_forget(void) {
  std::lock_guard<std::mutex> lock(emu::g_mu);
  emu::g_locs.clear();
  emu::g_completed.m.clear();
  emu::g_completed_gen++;
}
