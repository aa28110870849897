/* coop_exchange.cuh — stages 2 to 4 of the cooperative kernels, shared by every variant:
 * the rank-local barrier, the team's failure words, the merge of a chunk's slices and
 * its publication into every rank's mailbox (the ONE exchange of an op), and the wait
 * for every rank's record, merged in rank order into the unit's coefficients.
 *
 * Memory ordering (DESIGN.md's recipe, as built):
 *   publish: the warp writes the record's data, sig and count into each destination,
 *            __syncwarp (orders the lanes' writes), then lane q stores the epoch into
 *            destination q's record with st.release.sys (one release per destination,
 *            the lanes in parallel; no fence.sc);
 *   wait:    lane q polls source q's epoch with ld.relaxed.sys (no L1 invalidation per
 *            poll); once every lane sees the op's epoch, each does ONE ld.acquire.sys of
 *            its flag, __syncwarp, and the lanes read the data (ld.relaxed.sys), the
 *            signature with it (a block waits for its unit's chunk only; see
 *            gather_chunk for a peer running an op with fewer chunks).
 * Failures: see "failures" below. No success path reads host memory: the rank's stop
 * word and NCCL teams' failure words (device memory) every 32 polls, the team's error
 * words (host memory) only by a waiting watcher block, rate-limited.
 */
#ifndef SYNCBN_COOP_EXCHANGE_CUH_
#define SYNCBN_COOP_EXCHANGE_CUH_

/* Shared memory of a block (besides the onchip variant's held batches). */
struct Smem {
  union {
    sbn_partial_t p[kWarps][kChunk];   /* forward: per-warp partials of a channel */
    sbn_bwd_csums_t s[kWarps][kChunk]; /* backward */
  } red;
  float coef[kChunk][4];  /* fwd: mean, mean_lo, scale, bias; bwd: sbn_bwd_coef_t; of
                             channel chunk*32 + slot, every channel of the chunk */
  float extra[kChunk][2]; /* fwd: invstd, var_unbiased; bwd: dweight, dbias */
  float xm[kChunk][2];    /* the backward's mask from x in the 16-byte tile kernels
                             (coop_vec.cuh: kXmaskTile): each channel's scale and bias, of
                             stage 1's unit (stats_unit) and of the chunk in coef (set_coefs);
                             in the in-place backward's tile kernels, the recovery's bias and
                             factor of the chunk in coef (set_coefs; kRecoverSmem) */
  float own[kChunk][kRec]; /* a team of one (`local`, coop_kernel.cuh): the record of the
                              chunk the block merged itself, kept here in place of its
                              mailbox (publish_chunk, gather_chunk) */
  int64_t m;
  int64_t nbt_before;
  uint32_t k;
  int status;
  int coef_chunk; /* the chunk whose coefficients coef and extra hold (-1: none yet) */
};
/* sm.coef_chunk, read where only some threads need it (warp 0 in finish_coefs; a `local`
   block's loop in coop_kernel.cuh), by a volatile load: the compiler cannot hoist it above
   the test that guards it. A plain load was hoisted into every thread, where it raced
   with lane 0's write in finish_coefs (racecheck on an H100, 2026-11-26: 2107 hazards in
   finish_coefs, then 1288 in the kernel's loop; the value was unused where it raced). */
__device__ __forceinline__ int coef_chunk_now(const Smem& sm) {
  return *(volatile const int*)&sm.coef_chunk;
}

/* The per-(slice, channel) partial of each op kind, as stages 1 and 3 merge it: forward
   (count, mean_hi, mean_lo, m2), Chan's merge; backward (sum dy, sum dy*(x - mean)), each
   a compensated sum (hi, lo), added with TwoSum. An entry of the workspace holds
   SBN_GPU_PART_FLOATS floats; `out` gives what a mailbox record carries per channel
   (SBN_GPU_REC_FLOATS). */
template <int KIND> struct Part;
template <> struct Part<SBN_OP_FORWARD> {
  typedef sbn_partial_t T;
  static __device__ __forceinline__ T empty() { return T{0.0f, 0.0f, 0.0f, 0.0f}; }
  static __device__ __forceinline__ T merge(T a, T b) { return sbn_partial_merge(a, b); }
  static __device__ __forceinline__ T of_entry(float4 e) { return T{e.x, e.y, e.z, e.w}; }
  static __device__ __forceinline__ void put(float* e, T t) {
    st_weak_f32(e, t.count), st_weak_f32(e + 1, t.mean_hi), st_weak_f32(e + 2, t.mean_lo),
        st_weak_f32(e + 3, t.m2);
  }
  static __device__ __forceinline__ void out(T t, float (&v)[kRec]) {
    v[0] = t.mean_hi, v[1] = t.mean_lo, v[2] = t.m2, v[3] = 0.0f;
  }
  static __device__ __forceinline__ T shfl_down(T t, int off) {
    return T{__shfl_down_sync(0xffffffffu, t.count, off), __shfl_down_sync(0xffffffffu, t.mean_hi, off),
             __shfl_down_sync(0xffffffffu, t.mean_lo, off), __shfl_down_sync(0xffffffffu, t.m2, off)};
  }
  static __device__ __forceinline__ T shfl_xor(T t, int m) {
    return T{__shfl_xor_sync(0xffffffffu, t.count, m), __shfl_xor_sync(0xffffffffu, t.mean_hi, m),
             __shfl_xor_sync(0xffffffffu, t.mean_lo, m), __shfl_xor_sync(0xffffffffu, t.m2, m)};
  }
  static __device__ __forceinline__ T (&red(Smem& sm))[kWarps][kChunk] { return sm.red.p; }
};
template <> struct Part<SBN_OP_BACKWARD> {
  typedef sbn_bwd_csums_t T;
  static __device__ __forceinline__ T empty() { return T{{0.0f, 0.0f}, {0.0f, 0.0f}}; }
  static __device__ __forceinline__ T merge(T a, T b) { return sbn_bwd_csums_merge(a, b); }
  static __device__ __forceinline__ T of_entry(float4 e) { return T{{e.x, e.y}, {e.z, e.w}}; }
  static __device__ __forceinline__ void put(float* e, T t) {
    st_weak_f32(e, t.dy.hi), st_weak_f32(e + 1, t.dy.lo), st_weak_f32(e + 2, t.dy_xmu.hi),
        st_weak_f32(e + 3, t.dy_xmu.lo);
  }
  static __device__ __forceinline__ void out(T t, float (&v)[kRec]) {
    v[0] = t.dy.hi, v[1] = t.dy.lo, v[2] = t.dy_xmu.hi, v[3] = t.dy_xmu.lo;
  }
  static __device__ __forceinline__ T shfl_down(T t, int off) {
    return T{{__shfl_down_sync(0xffffffffu, t.dy.hi, off),
              __shfl_down_sync(0xffffffffu, t.dy.lo, off)},
             {__shfl_down_sync(0xffffffffu, t.dy_xmu.hi, off),
              __shfl_down_sync(0xffffffffu, t.dy_xmu.lo, off)}};
  }
  static __device__ __forceinline__ T shfl_xor(T t, int m) {
    return T{{__shfl_xor_sync(0xffffffffu, t.dy.hi, m), __shfl_xor_sync(0xffffffffu, t.dy.lo, m)},
             {__shfl_xor_sync(0xffffffffu, t.dy_xmu.hi, m),
              __shfl_xor_sync(0xffffffffu, t.dy_xmu.lo, m)}};
  }
  static __device__ __forceinline__ T (&red(Smem& sm))[kWarps][kChunk] { return sm.red.s; }
};

/* ---- stage 2: rank-local barrier ------------------------------------------------------ */
/* Over the G co-resident blocks of one rank. Every block adds to the counter; block 0 adds
   2^31 - (G - 1), the others 1, so the G arrivals add exactly 2^31 and bit 31 flips when
   the last block arrives. This needs the low 31 bits to be 0 on entry: they are 0 at init
   and every completed barrier adds exactly 2^31, so the counter needs no reset between
   barriers or launches. Co-residency (cooperative launch) makes the wait finite; it is
   still bounded by the deadline so that a broken assumption gives sbnTimeout, not a hang.
   Returns false on timeout (the counter is then unusable, and the team is aborted). */
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

/* ---- solo ops: arrivals instead of the barrier ------------------------------------------ */
/* In a solo op (coop_kernel.cuh: every unit of a chunk lies in the block that publishes
   the chunk) no block reads another's partials, so the blocks do not wait for each other:
   each only ARRIVES at the rank's barrier counter, after it read the epoch and
   num_batches_tracked, adding the barrier's amounts (a red: no value comes back, nobody
   waits). The counter's low 31 bits are 0 between ops (every completed barrier or set of
   arrivals adds exactly 2^31), and while an op's arrivals are under way they are not:
   block 0's own add makes them 2^31 - (G - 1) and each other arrival adds 1, so once
   block 0 has arrived they are 0 again exactly when all G have. Block 0, the one writer
   of the epoch and of num_batches_tracked, checks that before it writes them, at its end
   (rank_arrivals_done), with a load it made while its gather waited: every block read
   them before. Nothing else is assumed (not the epoch's parity): a counter left uneven by
   a barrier that timed out makes the check time out too, never pass early. The fences
   are acq_rel (a release pattern before the red, an acquire pattern after the load),
   not the fence.sc of __threadfence. */
/* The thread that makes a solo op's arrivals, and ends the op in block 0: warp 1's
   lane 0. Not thread 0: warp 0 is these kernels' critical path
   (the merges, the coefficients, the stream kernel's gathers), and the arrival's fence
   (MEMBAR.ALL.GPU) waits for every access its thread has under way, ~0.4 us on an H200
   (bench/notes/latency.md). Not warp 7 either, whose loads of a solo block's one slice
   the stream kernel's publish_chunk waits for. The arrival comes after the barrier that
   follows the block's first partials, beside warp 0's merge (the stream kernel's: warp
   7's slice loads); the same thread ends the op, so that block 0's own add is before its
   loads of the counter on every path (test_solo_stopped_weak); thread 0's reads of the
   epoch and nbt are before it, and a fence orders what precedes it in causality order,
   the block barrier's participants' accesses included (the PTX model's cumulativity:
   the pattern of the rank barrier, whose thread 0 publishes the block's partials). */
constexpr int kSoloThread = 32;
__device__ __forceinline__ void rank_arrive(uint32_t* counter, int G, bool first) {
  /* the block's reads of the epoch and nbt before its arrival */
  if (!SBN_MUTANT(SBN_MUT_ARRIVE_NO_FENCE)) fence_acq_rel_gpu();
  red_add_gpu(counter, first ? 0x80000000u - (uint32_t)(G - 1) : 1u);
}
/* The thread of block 0 that ends a solo op, which made its block's arrival: true once
   every block of the op arrived (`seen`: the counter as an earlier relaxed load found it,
   usually already complete; relaxed polls while it is not), then an acquire load of the
   counter orders what the thread writes after their reads; false when the deadline
   passes first. An acquire load (LD.E.STRONG.GPU + CCTL.IVALL: one round trip to L2), not
   a fence after the relaxed load: the fence (MEMBAR.ALL.GPU) would wait for every store
   the thread has under way, its outputs' included. */
__device__ bool rank_arrivals_done(const uint32_t* counter, uint32_t seen, uint64_t deadline) {
  if (SBN_MUTANT(SBN_MUT_NO_ARRIVAL_WAIT)) return true;
  for (uint32_t it = 0;; it++) {
    if ((seen & 0x7fffffffu) == 0u) {
      /* the counter does not leave "all arrived" before the next op (the calling thread
         made its block's arrival: its own add is before these loads): this load finds it
         so; it is the one that orders (a relaxed one that found it so does not) */
      if (SBN_MUTANT(SBN_MUT_END_RELAXED)) return true;
      if ((ld_acquire_gpu(counter) & 0x7fffffffu) == 0u) return true;
    }
    if ((it & 255u) == 255u && globaltimer_ns() > deadline) return false;
    __nanosleep(32);
    seen = ld_arrivals_gpu(counter);
  }
}

/* A solo op's end (`advance`: block 0's kSoloThread, which made the block's arrival, in
   every kernel that has solo ops): once every block arrived, the epoch
   advanced to k, then num_batches_tracked where channel 0's outputs were written (nbt_due),
   or sbnTimeout where the arrivals do not come by the deadline. Returns st then. */
template <int KIND>
__device__ __forceinline__ int solo_end(const sbn_coop_rank_t& R, bool advance, uint32_t arrivals,
                                        uint64_t deadline, uint32_t k, bool nbt_due, const Smem& sm,
                                        int st) {
  if (advance) {
    if (rank_arrivals_done(&R.state->barrier, arrivals, deadline)) {
      st_weak_u32(&R.state->epoch, k);
      if (KIND == SBN_OP_FORWARD && nbt_due && R.nbt != nullptr) *R.nbt = sbn_nbt_next(sm.nbt_before);
    } else if (st == 0) {
      st = sbnTimeout;
    }
  }
  return st;
}

/* ---- failures ------------------------------------------------------------------------- */
/* Where a kernel learns that it must stop (DESIGN.md, "Failures"):
     - its rank's stop word (sbn_rank_state_t.stop, device memory): set by any failing
       kernel of the team's ranks in this process (record_error, through a.stop) and by
       the host's abort (an asynchronous copy). Read at the kernel's start by the blocks
       that publish (and every block of a team of one merging its chunks itself,
       coop_kernel.cuh: `local`), and every 32 polls of a wait. A peer GPU's store into
       it is a system-scope store read here at GPU scope: it carries no data, only "stop",
       and a relaxed load of the word reads it from this GPU's L2, where the store lands;
     - NCCL teams' failure words (fail[q], device memory of the window, pushed by rank q's
       process): at the start and every 32 polls of a wait;
     - the team's error words (err[q], mapped HOST memory: every rank's cause, the host's
       abort word): only by the rank's watcher block (its block 0), only while it waits,
       at most once per a.host_poll_ns, all words in one coalesced load: every 20 us
       (SBN_HOST_POLL_NS) on the peer-pinned-host transport, where they are how another
       GPU's failure arrives; every 1 ms (SBN_HOST_POLL_FALLBACK_NS) elsewhere, where
       every failure and abort also sets the stop words and they are only a fallback.
       A read of host memory costs about a microsecond and such reads are served one at
       a time (the first GPU run), so no success path reads one: the watcher, once it
       sees a failure, sets the stop words and the other blocks see those.
   A kernel writes err[rank] (host memory) only when it fails. */
/* This lane's share of the team's error words (host memory): err[q], q <= nranks, the
   lanes q = lane, lane + 32, ... (one coalesced load for teams of up to 31 ranks). */
__device__ __forceinline__ int host_words_lane(const sbn_coop_args_t& a) {
  int seen = 0;
SBN_NO_UNROLL
  for (int q = (int)(threadIdx.x & 31); q <= a.nranks; q += 32) seen |= ld_err(&a.err[q]) != 0;
  return seen;
}
/* This lane's share of what lies in device memory: the rank's stop word (lane 0), NCCL
   teams' failure words (lanes q = lane, lane + 32, ...). Relaxed loads at GPU scope: the
   words carry no data, only "stop", and such a load reads this GPU's L2, where a peer's
   system-scope store lands. */
__device__ __forceinline__ int device_words_lane(const sbn_coop_args_t& a, const sbn_coop_rank_t& R) {
  const int lane = (int)(threadIdx.x & 31);
  int seen = lane == 0 && ld_relaxed_gpu_u32(&R.state->stop) != 0u;
  if (a.fail != nullptr) {
SBN_NO_UNROLL
    for (int q = lane; q < a.nranks; q += 32) seen |= ld_relaxed_gpu_u32(&a.fail[q]) != 0u;
  }
  return seen;
}
/* At a kernel's start (the last warp of every block with units): has the team failed?
   The device words. (The peer-pinned-host transport, whose ranks cannot
   reach each other's stop words, reads the host words too: in the cooperative kernel
   block 0 alone, before it arrives at the rank barrier, turning a failure it sees into
   the rank's stop word, which every block reads again after the barrier, so
   that the rank's blocks publish all their chunks or none; in APPLY after the block's
   first barrier. Its mailboxes are in host memory anyway.) */
__device__ __forceinline__ int start_words_lane(const sbn_coop_args_t& a, const sbn_coop_rank_t& R) {
  int seen = device_words_lane(a, R);
  if (SBN_MUTANT(SBN_MUT_HOST_WORDS_AT_START)) seen |= host_words_lane(a);
  return seen;
}
/* A wait's failure check (the calling warp, warp-uniform): the device words, and, for
   the rank's watcher block once *host_next has passed, the host words. */
__device__ __forceinline__ bool team_failed_warp(const sbn_coop_args_t& a, const sbn_coop_rank_t& R,
                                                 uint64_t* host_next) {
  int seen = device_words_lane(a, R);
  if (SBN_MUTANT(SBN_MUT_HOST_WORDS_EVERY_BLOCK)) seen |= host_words_lane(a);
  if (blockIdx.x % (unsigned)a.G == 0u) { /* the watcher */
    const uint64_t now = globaltimer_ns();
    if (*host_next == 0) {
      *host_next = now + (uint64_t)a.host_poll_ns; /* not in the first host_poll_ns */
    } else if (__any_sync(0xffffffffu, now >= *host_next)) { /* warp-uniform */
      seen |= host_words_lane(a);
      *host_next = now + (uint64_t)a.host_poll_ns;
    }
  }
  return __any_sync(0xffffffffu, seen) != 0;
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
   queued behind a timeout must not turn the cause into sbnAborted), and stops every rank
   this device can address (a.stop: the team's ranks in this process, on this GPU or a
   peer): their later kernels publish nothing, and their blocks still waiting return
   within 32 polls. Failure path only (it reads and writes host memory). */
__device__ __forceinline__ void record_error(const sbn_coop_args_t& a, int rank, int code) {
  /* with the relaxed load that saw "stop" before it (device_words_lane, by this thread in
     the waits), an acquire: a block stopped by another of its rank's blocks reads the
     cause that one wrote before its stop store (the release below), not 0, and keeps it.
     (At a kernel's start another warp loaded "stop": bench/notes/exchange.md, open.) */
  fence_release_sys();
  if (ld_err(&a.err[rank]) == 0) st_err(&a.err[rank], code);
  /* the cause in host memory before any rank can see "stop" and record sbnAborted as its
     own word: sbnCommGetAsyncError reports the cause, not the aborts it caused */
  fence_release_sys();
SBN_NO_UNROLL
  for (int q = 0; q < a.nstop; q++) st_relaxed_sys(a.stop[q], (uint32_t)code);
  push_failure(a, rank, code);
}

/* How every kernel with solo ops ends one (small, unit, stream: the stream kernel's other
   ops too, with `ends` false): solo_end by the thread that ends it (block 0's kSoloThread),
   then the failure recorded: a block's own (st, at the call) by thread 0, the end's
   timeout by the thread that saw it. True when the op failed (the caller returns). */
template <int KIND>
__device__ __forceinline__ bool op_end_failed(const sbn_coop_args_t& a, const sbn_coop_rank_t& R,
                                              bool ends, uint32_t arrivals, uint64_t deadline,
                                              uint32_t k, bool nbt_due, const Smem& sm, int st) {
  const int st_block = st;
  st = solo_end<KIND>(R, ends, arrivals, deadline, k, nbt_due, sm, st);
  if (st == 0) return false;
  if (st_block == 0 || threadIdx.x == 0) record_error(a, R.rank, st);
  return true;
}

/* Rank q's mailbox as this device addresses it. */
__device__ __forceinline__ sbn_mail_rec_t* team_mailbox(const sbn_coop_args_t& a, int q) {
#if SBN_WINDOW_TRANSPORT
  if (a.win != nullptr) return static_cast<sbn_mail_rec_t*>(sbn_window_peer(a.win, 0, q));
#endif
  return a.mail[q];
}

__device__ __forceinline__ uint64_t deadline_after(int64_t timeout_ns) {
  const uint64_t now = globaltimer_ns();
  const uint64_t t = (uint64_t)timeout_ns;
  return now > ~0ull - t ? ~0ull : now + t;
}

/* ---- stage 3: merge a chunk over the slices, push it to every rank --------------------- */
/* Partial entry (slice p, channel c) of a rank's workspace. */
__device__ __forceinline__ float* part_entry(const sbn_coop_rank_t& R, const sbn_geo_t& g, int p,
                                             int64_t c) {
  return R.part + SBN_GPU_PART_FLOATS * ((int64_t)p * g.c + c);
}

/* One lane's channel of a record, and (lane 0) its sig and count (the rank's rows). */
__device__ __forceinline__ void write_record(sbn_mail_rec_t* rec, const sbn_coop_args_t& a,
                                             int64_t rows, const float (&v)[kRec]) {
  const int lane = threadIdx.x & 31;
SBN_UNROLL
  for (int f = 0; f < kRec; f++) st_weak_f32(&rec->data[kRec * lane + f], v[f]);
  if (lane == 0) {
    st_weak_u32(&rec->sig, a.sig);
    st_weak_s64(&rec->count, rows);
  }
}

/* The host path's record of chunk j (warp 0): into the rank's own `send` records only (the
   collective or the gather kernel moves it; no flag). */
__device__ __forceinline__ void write_send_record(const sbn_coop_args_t& a, const sbn_coop_rank_t& R,
                                                  int j, int64_t rows, const float (&v)[kRec]) {
  write_record(R.send + j, a, rows, v);
  if ((threadIdx.x & 31) == 0) st_weak_u32(&R.send[j].epoch, 0u);
}

/* The chunk's record (the rank's `rows` values of each channel) into every rank's mailbox
   (warp 0): data, then the flags. */
__device__ __forceinline__ void publish_push(const sbn_coop_args_t& a, const sbn_coop_rank_t& R,
                                             int64_t rows, int j, uint32_t k,
                                             const float (&v)[kRec]) {
  const int lane = threadIdx.x & 31;
  const int64_t idx = mail_index(R.rank, k, j, a.nchunks_max);
  for (int dst = 0; dst < a.nranks; dst++) write_record(team_mailbox(a, dst) + idx, a, rows, v);
  __syncwarp(); /* every lane's data before any lane's flag */
  for (int dst = lane; dst < a.nranks; dst += 32)
    st_release_sys(&(team_mailbox(a, dst) + idx)->epoch, k);
}

/* Channel c's parameters that finish_coefs loads (forward: weight, bias; backward: weight,
   the saved mean and invstd), asked of L2 (nothing waits). */
template <int KIND>
__device__ __forceinline__ void prefetch_params(const sbn_coop_rank_t& R, int64_t c) {
  if (R.weight) prefetch_l2(R.weight + c);
  if (KIND == SBN_OP_FORWARD) {
    if (R.bias) prefetch_l2(R.bias + c);
  } else {
    prefetch_l2(R.save_mean_in + c);
    prefetch_l2(R.save_invstd + c);
  }
}

/* Chunk j: the P slices' partials merged in slice order (warp w takes the contiguous
   slices [w*P/8, (w+1)*P/8), four loads in flight; then the 8 warps' results in warp
   order), published. HOST: into the rank's own `send` record only (the collective or
   the gather kernel moves it; no flag). `local` (a team of one, at most SBN_LOCAL_SLICES
   slices: each block merges its units' chunks itself): into sm.own, which the block's
   own gather reads; no mailbox. `local` also asks L2 for the chunk's parameters first
   (warp 0, SBN_PREFETCH_PARAMS: coop_plan.h), which finish_coefs loads right after the
   merge with no wait to hide them behind: their DRAM round trip overlaps the partials'
   loads instead of following them. (Asked at the kernel's start instead, the addresses
   stayed in registers through stage 1, and ten 128-register kernels spilled 8-40 B.) */
template <int KIND, bool HOST>
__device__ void publish_chunk(const sbn_coop_args_t& a, const sbn_coop_rank_t& R,
                              const sbn_geo_t& g, int j, uint32_t k, Smem& sm,
                              bool local = false) {
  typedef Part<KIND> P;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int64_t c = (int64_t)j * kChunk + lane;
  const bool active = c < g.c;
  if (SBN_PREFETCH_PARAMS && !HOST && local && w == 0) {
    const int64_t cp = c + (SBN_MUTANT(SBN_MUT_PARAM_PREFETCH_NEXT) ? kChunk : 0);
    if (cp < g.c) prefetch_params<KIND>(R, cp);
  }
  const int p0 = (int)((int64_t)g.P * w / kWarps), p1 = (int)((int64_t)g.P * (w + 1) / kWarps);
  typename P::T t = P::empty();
  for (int p = p0; active && p < p1; p += 4) {
    float4 e[4];
SBN_UNROLL
    for (int i = 0; i < 4; i++)
      if (p + i < p1) e[i] = ld_weak_f4(part_entry(R, g, p + i, c));
SBN_UNROLL
    for (int i = 0; i < 4; i++)
      if (p + i < p1) t = P::merge(t, P::of_entry(e[i]));
  }
  P::red(sm)[w][lane] = t;
  __syncthreads();
  if (w == 0) {
    float v[kRec] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (active) {
      t = P::red(sm)[0][lane];
SBN_UNROLL
      for (int q = 1; q < kWarps; q++) t = P::merge(t, P::red(sm)[q][lane]);
      P::out(t, v);
    }
    if (HOST) {
      write_send_record(a, R, j, g.rows, v);
    } else if (local) {
SBN_UNROLL
      for (int f = 0; f < kRec; f++) sm.own[lane][f] = v[f];
    } else {
      publish_push(a, R, g.rows, j, k, v);
    }
  }
  __syncthreads();
}

/* ---- stage 4: wait for every rank's record of a chunk, merge in rank order --------------- */
/* Rank q's record of chunk j as this rank reads it. */
template <bool HOST>
__device__ __forceinline__ const sbn_mail_rec_t* rec_of(const sbn_coop_args_t& a,
                                                       const sbn_coop_rank_t& R, int q,
                                                       uint32_t k, int j) {
  return R.mail + (HOST ? sbn_host_index(q, j, a.nchunks_max) : mail_index(q, k, j, a.nchunks_max));
}

/* Warp 0: until every rank's record of chunk j carries epoch k. Lane q polls source q
   (q = lane, lane + 32, ...) relaxed; then one acquire per flag. 0, sbnTimeout (the
   deadline passed) or sbnAborted (a failure word is set). */
__device__ int wait_chunk(const sbn_coop_args_t& a, const sbn_coop_rank_t& R, int j, uint32_t k,
                          uint64_t deadline) {
  const int lane = threadIdx.x & 31;
  uint64_t host_next = 0; /* the watcher's next read of host memory (team_failed_warp) */
  for (int q0 = 0; q0 < a.nranks; q0 += 32) {
    const int q = q0 + lane;
    const uint32_t* flag = q < a.nranks ? &rec_of<false>(a, R, q, k, j)->epoch : nullptr;
    bool here = flag == nullptr;
    for (uint32_t it = 0;; it++) {
      if (!here) here = ld_relaxed_sys_u32(flag) == k;
      if (__all_sync(0xffffffffu, here)) break;
      if ((it & 31u) == 31u) {
        /* the flags may have arrived since they were read: a failure elsewhere must not
           hide a success (or this op's own cause) here */
        const bool failed = team_failed_warp(a, R, &host_next); /* warp-uniform */
        const bool late = __any_sync(0xffffffffu, globaltimer_ns() > deadline) != 0;
        if (failed || late) {
          if (!here) here = ld_relaxed_sys_u32(flag) == k;
          if (__all_sync(0xffffffffu, here)) break;
          return failed ? sbnAborted : sbnTimeout;
        }
        __nanosleep(64);
      }
    }
    if (flag != nullptr) (void)ld_acquire_sys(flag); /* the record's data after its flag */
    __syncwarp();
  }
  return 0;
}

/* Warp 0. Returns 0 or an sbnResult_t; fills the per-lane merged values. HOST: the
   records are complete already (the previous launch or the collective wrote them). */
template <int KIND, bool HOST>
__device__ int gather_chunk(const sbn_coop_args_t& a, const sbn_coop_rank_t& R, int j,
                            uint32_t k, uint64_t deadline, int64_t* m_out, float out[3],
                            float mine[2], const float* own, int64_t own_rows) {
  const int lane = threadIdx.x & 31;
  /* Every rank must run the same op (the signature: kind, dtype, layout, C, activation and
     the call number where given; bn_op.h: sbn_sig_same_but_call, and no two layouts that
     matter differ nor two numbers, decided over all ranks' records alike on every rank). Cooperative
     path: chunk j's records carry it and are checked with their data, one round trip.
     A peer running an op with fewer chunks never publishes chunk j: the block of this
     rank that owns a unit of chunk 0 (every op has one) sees the mismatch there and
     records it, which sets this rank's stop word, and this wait ends within 32 polls.
     Host path: chunk 0's records, which every op has (a rank with fewer chunks left
     older records of chunk j behind, possibly of an op with the same signature). */
  if (own != nullptr) {
    /* a team of one (`local`): the block's own record, in shared memory (publish_chunk) */
  } else if (!HOST) {
    const int st = wait_chunk(a, R, j, k, deadline);
    if (st) return st;
  } else {
    bool sig_ok = true;
    int layouts = 0;
    uint32_t calls = 0; /* sbn_sig_call_bit of every rank's record, OR'ed */
    for (int q = lane; q < a.nranks; q += 32) {
      const uint32_t sig = ld_relaxed_sys_u32(&rec_of<HOST>(a, R, q, k, 0)->sig);
      sig_ok &= sbn_sig_same_but_call(sig, a.sig) != 0;
      layouts |= sbn_sig_layouts(sig);
      calls |= sbn_sig_call_bit(sig);
    }
    for (int o = 16; o > 0; o >>= 1) calls |= __shfl_xor_sync(0xffffffffu, calls, o);
    const bool both = __any_sync(0xffffffffu, layouts & 1) && __any_sync(0xffffffffu, layouts & 2);
    if (!__all_sync(0xffffffffu, sig_ok) || both || sbn_sig_calls_apart(calls)) return sbnInvalidUsage;
  }
  int64_t m = 0;
  sbn_partial_t gp = {0.0f, 0.0f, 0.0f, 0.0f};
  sbn_bwd_csums_t gs = Part<SBN_OP_BACKWARD>::empty();
  /* The ranks' records, merged in rank order. Their loads do not depend on the merges:
     the records of kGatherBatch ranks are loaded before the first of them is merged,
     so a team of W ranks waits ceil(W / kGatherBatch) memory round trips here, not W
     (W = 8: 2). The loaded records then shift down one place per merge, so that one
     copy of the merge serves them all (code size is time: check-sass.sh). */
  constexpr int kGatherBatch = 4;
  constexpr int kF = KIND == SBN_OP_FORWARD ? 3 : kRec; /* floats of a record's channel */
  int layouts = 0;    /* sbn_sig_layouts of every rank's record (the same in every lane) */
  uint32_t calls = 0; /* and sbn_sig_call_bit, OR'ed alike */
  for (int q0 = 0; q0 < a.nranks; q0 += kGatherBatch) {
    const int nq = a.nranks - q0 < kGatherBatch ? a.nranks - q0 : kGatherBatch;
    int64_t cnt[kGatherBatch] = {};
    float d[kGatherBatch][kF] = {};
    bool sig_bad = false;
SBN_UNROLL
    for (int i = 0; i < kGatherBatch; i++) {
      if (i >= nq) break;
      const sbn_mail_rec_t* rec = rec_of<HOST>(a, R, q0 + i, k, j);
      if (own != nullptr) { /* the record's values, as publish_chunk would have written them */
        cnt[i] = own_rows;
SBN_UNROLL
        for (int f = 0; f < kF; f++) d[i][f] = own[f];
        continue;
      }
      if (!HOST) {
        const uint32_t sig = ld_relaxed_sys_u32(&rec->sig);
        sig_bad |= sbn_sig_same_but_call(sig, a.sig) == 0;
        layouts |= sbn_sig_layouts(sig);
        calls |= sbn_sig_call_bit(sig);
      }
      cnt[i] = ld_relaxed_sys_s64(&rec->count);
SBN_UNROLL
      for (int f = 0; f < kF; f++) d[i][f] = ld_relaxed_sys_f32(&rec->data[kRec * lane + f]);
    }
    if (!HOST && __any_sync(0xffffffffu, sig_bad)) return sbnInvalidUsage;
SBN_NO_UNROLL
    for (int i = 0; i < nq; i++) { /* rank q0 + i's record is in cnt[0], d[0] */
      m += cnt[0];
      if (KIND == SBN_OP_FORWARD) {
        const sbn_partial_t pt = {(float)cnt[0], d[0][0], d[0][1], d[0][2]};
        gp = sbn_partial_merge(gp, pt);
      } else {
        const sbn_bwd_csums_t s = {{d[0][0], d[0][1]}, {d[0][kF - 2], d[0][kF - 1]}};
        gs = sbn_bwd_csums_merge(gs, s);
        if (q0 + i == R.rank) mine[0] = sbn_csum_value(s.dy), mine[1] = sbn_csum_value(s.dy_xmu);
      }
SBN_UNROLL
      for (int t = 0; t + 1 < kGatherBatch; t++) {
        cnt[t] = cnt[t + 1];
SBN_UNROLL
        for (int f = 0; f < kF; f++) d[t][f] = d[t + 1][f];
      }
    }
  }
  /* two ranks' layouts that matter differ, or two ranks' call numbers */
  if (layouts == 3 || sbn_sig_calls_apart(calls)) return sbnInvalidUsage;
  *m_out = m;
  if (KIND == SBN_OP_FORWARD) {
    out[0] = gp.mean_hi, out[1] = gp.mean_lo, out[2] = gp.m2;
    if (m == 1) return sbnInvalidArgument;
  } else {
    out[0] = sbn_csum_value(gs.dy), out[1] = sbn_csum_value(gs.dy_xmu);
  }
  return 0;
}

/* Units a and b of a block (contiguous) find one chunk's coefficients in sm.coef: plane
   units of one chunk (a block's plane units are contiguous channels). Tile units never
   (a chunk each but for C <= 32: they keep their barriers, the code as it was; their fp16
   forward is at 128 registers: check-sass.sh), nor under the mutant that gathers again
   for every unit. Block-uniform: the loops of stage 5 (the cooperative kernel's and the
   host path's apply kernel) leave out finish_coefs' gather and barrier (`same`) and the
   barrier between two such units. */
template <bool TILE>
__device__ __forceinline__ bool coef_shared(const sbn_geo_t& g, int a, int b) {
  return !TILE && sbn_unit_chunk(&g, a) == sbn_unit_chunk(&g, b) &&
         !SBN_MUTANT(SBN_MUT_NO_COEF_REUSE);
}

/* Channel c's parameters that its coefficients take (forward: weight, bias; backward:
   weight, the saved mean and invstd, and the bias where the mask from x takes it: R.xmask);
   the defaults where `in` is false (a channel past C). */
struct ChanParams {
  float w, b, mean, invstd;
};
template <int KIND>
__device__ __forceinline__ ChanParams load_params(const sbn_coop_rank_t& R, int64_t c, bool in,
                                                  bool recover_bias = false) {
  ChanParams q = {1.0f, 0.0f, 0.0f, 0.0f};
  if (in) {
    if (R.weight) q.w = ld_param(R.weight + c);
    if (KIND == SBN_OP_FORWARD) {
      if (R.bias) q.b = ld_param(R.bias + c);
    } else {
      q.mean = ld_param(R.save_mean_in + c);
      q.invstd = ld_param(R.save_invstd + c);
      /* the mask from x's (sm.xm), and the in-place backward's recovery where set_coefs
         writes it (recover_bias: the tile kernels') */
      if ((R.xmask || (recover_bias && R.recover)) && R.bias) q.b = ld_param(R.bias + c);
    }
  }
  return q;
}
/* The coefficients of a channel (sm.coef[slot], sm.extra[slot]) from the team's merged
   values of it (gather_chunk: v, and this rank's own sums `mine`) over m values; sm.xm[slot]
   the backward's: the mask from x's (scale, bias), or the in-place backward's recovery
   (R.recover: bias, and sbn_recover_rcp's factor with the dtype's unit roundoff `unit`),
   which the tile kernels' stage 5 reads there (coop_vec.cuh: kRecoverSmem; `unit` 0 where
   no one reads it: plane units, which hold their one channel's in registers). */
template <int KIND>
__device__ __forceinline__ void set_coefs(const sbn_coop_rank_t& R, int slot, int64_t m,
                                          const float (&v)[3], const float (&mine)[2],
                                          const ChanParams& q, Smem& sm, float unit = 0.0f) {
  if (KIND == SBN_OP_FORWARD) {
    sbn_partial_t gp = {(float)m, v[0], v[1], v[2]};
    sbn_stats_t s = sbn_stats_finalize(gp, m, R.eps);
    sm.coef[slot][0] = s.mean;
    sm.coef[slot][1] = s.mean_lo;
    sm.coef[slot][2] = sbn_scale(q.w, s.invstd);
    sm.coef[slot][3] = q.b;
    sm.extra[slot][0] = s.invstd;
    sm.extra[slot][1] = s.var_unbiased;
  } else {
    sbn_bwd_coef_t kc = sbn_backward_coefficients(v[0], v[1], m, q.mean, q.invstd, q.w);
    sm.coef[slot][0] = kc.mean;
    sm.coef[slot][1] = kc.mean_dy;
    sm.coef[slot][2] = kc.xmu_scale;
    sm.coef[slot][3] = kc.scale;
    if (unit > 0.0f && R.recover) { /* the recovery's (epi_coef's values, coop_vec.cuh), where read */
      sm.xm[slot][0] = q.b;
      sm.xm[slot][1] = sbn_recover_rcp(q.w, q.b, unit, SBN_RECOVER_MIN_WEIGHT, q.invstd);
    } else {
      sm.xm[slot][0] = kc.scale; /* the mask from x's: sbn_scale(weight, invstd), and the bias */
      sm.xm[slot][1] = q.b;
    }
    const float sdy = R.grad_global ? v[0] : mine[0];
    const float sdx = R.grad_global ? v[1] : mine[1];
    sm.extra[slot][0] = sbn_dweight(sdx, q.invstd, m);
    sm.extra[slot][1] = sdy;
  }
}
/* Channel c's outputs from its coefficients (sm.coef[slot], sm.extra[slot]) over the
   team's m values: forward the saved statistics, the running ones, num_batches_tracked
   (channel 0, where nbt_here); backward dweight, dbias. `run` (the small kernel's): the
   running statistics as the caller loaded them earlier, in place of their loads here. */
struct RunningIn {
  float mean, var;
};
template <int KIND>
__device__ __forceinline__ void channel_outputs(const sbn_coop_rank_t& R, int64_t c, int slot,
                                                int64_t m, const Smem& sm, bool nbt_here,
                                                const RunningIn* run = nullptr) {
  if (KIND == SBN_OP_FORWARD) {
    R.save_mean[c] = sm.coef[slot][0];
    R.save_invstd[c] = sm.extra[slot][0];
    if (R.running_mean != nullptr && m > 0) {
      float f = sbn_momentum_factor(R.momentum, sm.nbt_before);
      R.running_mean[c] = sbn_running_update(run ? run->mean : R.running_mean[c], sm.coef[slot][0], f);
      R.running_var[c] = sbn_running_update(run ? run->var : R.running_var[c], sm.extra[slot][1], f);
    }
    if (R.nbt != nullptr && c == 0 && nbt_here) *R.nbt = sbn_nbt_next(sm.nbt_before);
  } else {
    if (R.dweight != nullptr) R.dweight[c] = sm.extra[slot][0];
    if (R.dbias != nullptr) R.dbias[c] = sm.extra[slot][1];
  }
}

/* Stage 4 of unit (group grp, slice p): the team's statistics of every channel of the
   unit's chunk into sm.coef and sm.extra (slot = channel % 32), unless they hold that
   chunk's already (sm.coef_chunk: a block's k plane units are contiguous channels,
   coop_plan.h, in at most ceil(k/32) + 1 chunks, each gathered once), and, by the unit's
   slice-0 block, the unit's per-channel outputs (num_batches_tracked only if nbt_here: a
   solo op's block 0 writes it at its end). `local`: the chunk's record is the block's
   own, in sm.own (publish_chunk). `same` (coef_shared of the block's previous unit and
   this one, which succeeded): sm.coef holds the chunk, and nothing is gathered or written
   to shared memory: no barrier. Returns 0 or the failure (nothing written). unit: the
   dtype's unit roundoff in the in-place backward's kernels (set_coefs: the recovery's
   factor), 0 in the others (a constant: their code stays as it was). */
template <int KIND, bool TILE, bool HOST>
__device__ int finish_coefs(const sbn_coop_args_t& a, const sbn_coop_rank_t& R,
                            const sbn_geo_t& g, int grp, int p, uint32_t k, uint64_t deadline,
                            Smem& sm, bool nbt_here = true, bool local = false,
                            bool same = false, float unit = 0.0f) {
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int64_t c0 = TILE ? (int64_t)grp * kChunk : grp;
  const int cw = TILE ? (int)(g.c - c0 < kChunk ? g.c - c0 : kChunk) : 1;
  const int j = (int)(c0 / kChunk);
  if (!same) {
    /* (block-uniform: written by warp 0 before the barrier below, or at the kernel's start;
       read by warp 0 only: coef_chunk_now) */
    if (w == 0 && (coef_chunk_now(sm) != j || SBN_MUTANT(SBN_MUT_NO_COEF_REUSE))) {
      float v[3] = {0.0f, 0.0f, 0.0f}, mine[2] = {0.0f, 0.0f};
      int64_t m = 0;
      const int slot = lane;
      const int64_t c = (int64_t)j * kChunk + lane;
      const bool mine_c = c < g.c;
      /* this lane's channel's parameters, loaded before the wait: their round trip overlaps
         it instead of following the gather (forward: weight, bias; backward: the saved
         mean and invstd, weight); a team of one that merges the chunk itself, with no
         wait to overlap, asked L2 for them before its merge (publish_chunk) */
      const float tu = TILE ? unit : 0.0f; /* plane units hold their channel's own: none written */
      const ChanParams q = load_params<KIND>(R, c, mine_c, tu > 0.0f);
      int st = gather_chunk<KIND, HOST>(a, R, j, k, deadline, &m, v, mine,
                                        local ? sm.own[lane] : nullptr, g.rows);
      if (st == 0 && mine_c) set_coefs<KIND>(R, slot, m, v, mine, q, sm, tu);
      __syncwarp(); /* every lane read sm.coef_chunk (above) before lane 0 replaces it */
      if (lane == 0) {
        sm.status = st;
        sm.m = m;
        sm.coef_chunk = st == 0 ? j : -1;
      }
    }
    __syncthreads();
    const int st = sm.status;
    if (st != 0) return st;
  }

  /* per-channel outputs: the unit's slice-0 block */
  if (p == 0 && w == 0 && lane < cw)
    channel_outputs<KIND>(R, c0 + lane, (int)((c0 + lane) % kChunk), sm.m, sm, nbt_here);
  return 0;
}

#endif /* SYNCBN_COOP_EXCHANGE_CUH_ */
