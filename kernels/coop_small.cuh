/* coop_small.cuh — the small variant of the cooperative kernel (SBN_VAR_SMALL, coop_plan.h:
 * auto's choice where it applies, sbn_small_auto; SBN_KERNEL=small asks for it): a team of
 * one whose op has few rows (N x H x W at most SBN_SMALL_ROWS, tile layout: NHWC, or NCHW
 * with H*W = 1): S10, the empty op. And the host path's statistics kernel for the same ops
 * (sbn_host_small_stats_kernel, at the end).
 * Teams of two or more ranks whose every rank has few rows (TEAM: SBN_VAR_SMALL_TEAM,
 * kernels of their own, under SBN_KERNEL=small only: sbn_small_team_applies; auto keeps
 * stream there until an A/B decides): after warp 0's merge of a chunk, its record goes
 * into every rank's mailbox (publish_push) and every rank's record is merged in rank order
 * (gather_chunk), as the stream kernel's solo ops publish and gather theirs; the rest as
 * for a team of one. A virtual team's ranks are one launch (slot s: blocks
 * [s*G, (s+1)*G)). Their own instantiation: with the exchange inlined, a team of one's
 * kernels would take its registers (forward 72 -> 86, 3 -> 2 blocks per SM; as a call, a
 * stack frame), and they are what the latency rows and S10 measure.
 *
 * What it is for: such an op moves a few kilobytes, and its time is the launch and the
 * kernel's critical path: the instructions one warp runs in a row (~4 cycles each: the
 * probe's code_fetch rows time 16 KB of code at 2.2 us whether straight or in a loop) and
 * the dependent memory round trips. The stream kernel's tile path spends them on what
 * small ops do not need: the walker's set-up (64-bit divisions), 16-byte batches, the
 * rows' shuffle tree, the partials' round trip through the workspace (stage 1 stores them,
 * the merge loads them back) and the parameters' load after that merge (S10 forward on an
 * H200: its blocks end at 8.45 us, the empty op's at 5.5; bench/notes/latency.md). Here:
 *   - block b takes the 32-channel chunks b, b + G, ...; thread (warp w, lane) the chunk's
 *     channel `lane` and the rows w, w + 8, ... (at most SBN_SMALL_ROWS / 8 = 8): one
 *     element load per row, a warp's 32 lanes one row's 32 channels (coalesced), every load
 *     of the thread issued at once and held in registers: x (and dy) cross memory once;
 *   - the thread's statistics of its values (two passes over registers), the warps'
 *     partials merged in warp order in shared memory by warp 0 (lane = channel), which had
 *     loaded the channels' parameters (and the forward's running statistics) beside the
 *     values; the coefficients (set_coefs, the stream kernel's arithmetic from the merged
 *     values of a team of one); the outputs from the held values. Every load of a chunk
 *     is issued at once, so the op's critical path has one memory round trip before its
 *     stores (the epoch's, the stop words', the values', the parameters': together).
 * The same statistics as every variant up to rounding (a different order of sums: each
 * thread's at most 8 values, then 8 warps; not the stream kernel's bits), within the
 * tolerances of the tests against the float64 reference (test_small_vs_reference).
 *
 * Protocol: as the unit kernel's (coop_unit.cuh): the rank's stop word and NCCL teams'
 * failure words loaded at the start beside the epoch and looked at in the start's barrier,
 * before anything is written; the blocks arrive at the rank's counter, and block 0 ends
 * the op (solo_end: every block arrived, the epoch advanced, num_batches_tracked); a grid
 * not co-resident times out there (test_solo_arrivals). A forward of one value per channel
 * (rows == 1) fails with sbnInvalidArgument, nothing written, as the stream kernel's
 * gather does; a launch the plan never makes fails with sbnInvalidUsage.
 * The epilogue (an activation, z, dz: SBN_EPI_ACT) as the stream kernels compute it, but
 * not the in-place backward's recovery of x from y (SBN_EPI_RECOVER): that kernel is not
 * built (coop.cu: coop_pick, test_small_failures), and the plan runs stream there.
 */
#ifndef SYNCBN_COOP_SMALL_CUH_
#define SYNCBN_COOP_SMALL_CUH_

constexpr int kSmallHold = SBN_SMALL_ROWS / kWarps; /* rows of a thread, at most */
static_assert(SBN_SMALL_ROWS % kWarps == 0, "SBN_SMALL_ROWS: whole rows per warp");

/* What the small kernel and the host path's small statistics kernel share, so that both
   sum alike (the host path's bits are the cooperative kernel's). */

/* Thread (warp w)'s values of channel c (in: c < C): rows w, w + 8, ... (kt of them), one
   element load each, all issued at once: x, dy (backward), and the epilogue's other input
   epi_in where given (forward z, backward y); 0 where the thread has no such row. */
template <int KIND, int DT, bool EPI>
__device__ __forceinline__ void small_load_values(const sbn_coop_rank_t& R, int64_t C, int64_t c,
                                                  bool in, int w, int kt, const void* epi_in,
                                                  uint64_t pol, float (&xv)[kSmallHold],
                                                  float (&dyv)[kSmallHold], float (&ev)[kSmallHold]) {
SBN_UNROLL
  for (int i = 0; i < kSmallHold; i++) {
    const int64_t e = (int64_t)(w + kWarps * i) * C + c;
    const bool has = in && i < kt;
    xv[i] = has ? Dt<DT>::to_f32(tensor_ld_elem<DT>(R.x, e, pol)) : 0.0f;
    if (KIND == SBN_OP_BACKWARD) dyv[i] = has ? Dt<DT>::to_f32(tensor_ld_elem<DT>(R.dy, e, pol)) : 0.0f;
    if (EPI) ev[i] = has && epi_in != nullptr ? Dt<DT>::to_f32(tensor_ld_elem<DT>(epi_in, e, pol)) : 0.0f;
  }
}

/* The thread's partial of its kt values (the stream kernel's per-batch forms: a shifted
   two-pass mean and M2; compensated sums of dy and dy (x - mean), mean_in the saved mean).
   Backward with an activation (EPI, R.act not the identity): the gradient that reaches
   the normalization, g = act'(y) dy (ev: y), replaces dy in dyv. */
template <int KIND, bool EPI>
__device__ __forceinline__ typename Part<KIND>::T small_partial(const sbn_coop_rank_t& R, int kt,
                                                                const float (&xv)[kSmallHold],
                                                                float (&dyv)[kSmallHold],
                                                                const float (&ev)[kSmallHold],
                                                                float mean_in) {
  typename Part<KIND>::T pt;
  if constexpr (KIND == SBN_OP_FORWARD) {
    const float sh = xv[0];
    float s = 0.0f;
SBN_UNROLL
    for (int i = 0; i < kSmallHold; i++)
      if (i < kt) s += xv[i] - sh;
    const float mb = kt > 0 ? s / (float)kt : 0.0f;
    float m2 = 0.0f;
SBN_UNROLL
    for (int i = 0; i < kSmallHold; i++)
      if (i < kt) {
        const float d = (xv[i] - sh) - mb;
        m2 += SBN_MUL(d, d);
      }
    const sbn_welford_t t = {(float)kt, mb, m2};
    pt = sbn_partial_from_shifted(t, sh);
  } else {
    pt = Part<KIND>::empty();
SBN_UNROLL
    for (int i = 0; i < kSmallHold; i++)
      if (i < kt) {
        /* (y given wherever act is not the identity: the host checks) */
        if (EPI && R.act != SBN_ACT_IDENTITY)
          dyv[i] = sbn_act_grad(R.act, R.slope, SBN_MUTANT(SBN_MUT_SMALL_MASK_X) ? xv[i] : ev[i], dyv[i]);
        float err;
        const float t = sbn_grad_term(dyv[i], xv[i], mean_in, &err);
        sbn_csum_add(&pt.dy, dyv[i]);
        sbn_csum_add2(&pt.dy_xmu, t, err);
      }
  }
  return pt;
}

/* Warp 0, lane = channel: the 8 warps' partials of the chunk (P::red, after the barrier
   that follows their stores) merged in warp order, as a record's floats. For a team of
   one these are the team's values (a merge with the empty record of no other rank gives
   them back unchanged: gather_chunk). */
template <int KIND>
__device__ __forceinline__ void small_merge(Smem& sm, int lane, float (&d)[kRec]) {
  typedef Part<KIND> P;
  typename P::T t = P::red(sm)[0][lane];
SBN_UNROLL
  for (int v = 1; v < kWarps; v++) t = P::merge(t, P::red(sm)[v][lane]);
  P::out(t, d);
}

/* A team of one's values of a channel from the rank's merged record d (which are the
   team's: a merge with the empty record of no other rank gives them back unchanged), as
   gather_chunk gives a team's: forward (n, mean, M2) in v; backward the sums of dy and
   dy (x - mean) in mine, and in v. */
template <int KIND>
__device__ __forceinline__ void small_local_values(const float (&d)[kRec], float (&v)[3], float (&mine)[2]) {
  if (KIND == SBN_OP_FORWARD) {
    v[0] = d[0], v[1] = d[1], v[2] = d[2];
  } else {
    mine[0] = sbn_csum_value(sbn_csum_t{d[0], d[1]}), mine[1] = sbn_csum_value(sbn_csum_t{d[2], d[3]});
    v[0] = mine[0], v[1] = mine[1], v[2] = 0.0f;
  }
}

/* Warp 0 of a team's block, chunk j (after the barrier that follows the warps' partials):
   the rank's record of the chunk (the warps in order) into every rank's mailbox, then
   every rank's record merged in rank order (gather_chunk: the op's signature, the team's
   count, the wait's timeout and abort), as the stream kernel's publish_chunk and
   finish_coefs do; the whole warp, inactive lanes too. The coefficients into sm.coef
   (set_coefs), the status and the team's count into sm.status, sm.m. */
template <int KIND>
__device__ __forceinline__ void small_team_coefs(const sbn_coop_args_t& a, const sbn_coop_rank_t& R,
                                              int64_t rows, int j, uint32_t k, uint64_t deadline,
                                              bool in, const ChanParams& q, Smem& sm) {
  const int lane = (int)(threadIdx.x & 31);
  float d[kRec] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (in) small_merge<KIND>(sm, lane, d);
  publish_push(a, R, rows, j, k, d);
  float v[3] = {0.0f, 0.0f, 0.0f}, mine[2] = {0.0f, 0.0f};
  int64_t m = rows;
  int gst = 0;
  if (SBN_MUTANT(SBN_MUT_SMALL_TEAM_LOCAL)) /* the rank's own values for the team's */
    small_local_values<KIND>(d, v, mine);
  else
    gst = gather_chunk<KIND, false>(a, R, j, k, deadline, &m, v, mine, nullptr, 0);
  if (gst == 0 && in) set_coefs<KIND>(R, lane, m, v, mine, q, sm);
  if (lane == 0) {
    sm.status = gst;
    sm.m = m;
  }
}

/* Whether a rank of the launch has more rows than the small kernels hold (a launch the
   plan never makes): the kernels of a launch of several ranks (a virtual team's) refuse
   it from every slot if one rank has, so that every rank records the same code, not
   sbnAborted from the stop words on the others. */
__device__ __forceinline__ bool launch_over_small_rows(const sbn_coop_args_t& a) {
  bool over = false;
SBN_NO_UNROLL
  for (int q = 0; q < a.nlaunch; q++) over |= a.r[q].n * a.r[q].spatial > SBN_SMALL_ROWS;
  return over;
}

template <int KIND, int DT, int EPI, bool TEAM>
__global__ void __launch_bounds__(kThreads, SBN_STREAM_BLOCKS_PER_SM)
    sbn_small_kernel(const __grid_constant__ sbn_coop_args_t a) {
  typedef Part<KIND> P;
  /* the epilogue (SBN_EPI_ACT): forward y = act(bn(x) + z), z where given; backward the
     gradient g = act'(y) dy (y the forward's output) in place of dy, written to dz where
     given (after the start's barrier, as every output). Not the in-place backward's
     recovery of x from y (SBN_EPI_RECOVER: not built) */
  static_assert(EPI == SBN_EPI_NONE || EPI == SBN_EPI_ACT, "the small kernels: plain or act");
  constexpr bool kEpi = EPI == SBN_EPI_ACT;
  SBN_SHARED(Smem, sm);
  /* TEAM: the chunks' records exchanged (publish_push, gather_chunk), and launch slot s owns
     blocks [s*G, (s+1)*G) (all W ranks of a virtual team, or one). A team of one: one slot */
  const int slot = TEAM ? blockIdx.x / a.G : 0, b = TEAM ? blockIdx.x % a.G : blockIdx.x;
  const sbn_coop_rank_t& R = a.r[slot];
  const int w = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
  const int64_t rows64 = R.n * R.spatial;
  const bool refused = (TEAM ? a.nranks < 2 : a.nranks != 1 || a.nlaunch != 1) ||
                       rows64 > SBN_SMALL_ROWS || a.host_words_at_start ||
                       (TEAM && launch_over_small_rows(a));
  if (refused) {
    /* a launch the plan never makes (sbn_small_applies, sbn_small_team_applies): the
       ranks record sbnInvalidUsage, nothing read or written, no arrival (after a barrier:
       no system-scope load before the first, check-sass.sh); a team's block 0 of each slot
       for its rank, a team of one's for every rank of the launch */
    __syncthreads();
    if (TEAM) {
      if (b == 0 && threadIdx.x == 0) record_error(a, R.rank, sbnInvalidUsage);
    } else {
SBN_NO_UNROLL
      for (int i = 0; b == 0 && threadIdx.x == 0 && i < a.nlaunch; i++) record_error(a, a.r[i].rank, sbnInvalidUsage);
    }
    return;
  }
  const int rows = (int)rows64;
  const int kt = rows > w ? (rows - w + kWarps - 1) / kWarps : 0; /* this thread's rows */
  const int nchunks = (int)((a.c + kChunk - 1) / kChunk);

  SBN_STAMP(0); /* the block runs */
  if (threadIdx.x == 0) {
    sm.k = ld_weak_u32(&R.state->epoch) + 1u;
    sm.nbt_before = (KIND == SBN_OP_FORWARD && R.nbt != nullptr) ? *R.nbt : 0;
  }
  int err_seen = w == kWarps - 1 ? start_words_lane(a, R) : 0;
  /* the first chunk's values and parameters, loaded now: their round trip overlaps the
     epoch's and the stop words' (later chunks load theirs at the top of the loop) */
  const uint64_t pol = policy_evict_first(); /* read once */
  float xv[kSmallHold], dyv[kSmallHold];
  float ev[kSmallHold]; /* the epilogue's other input: forward z, backward y (for the mask
                           of an activation: not read for the identity, as stream's) */
  const void* const epi_in =
      KIND == SBN_OP_FORWARD ? R.z : R.act != SBN_ACT_IDENTITY ? R.y : nullptr;
  ChanParams q = {1.0f, 0.0f, 0.0f, 0.0f};
  RunningIn run = {0.0f, 0.0f}; /* forward, warp 0: the channel's running statistics */
  float mean_in = 0.0f; /* backward: the channel's saved mean, which every thread's sum takes */
  auto load_chunk = [&](int j) {
    const int64_t c = (int64_t)j * kChunk + lane;
    const bool in = c < a.c;
    small_load_values<KIND, DT, kEpi>(R, a.c, c, in, w, kt, epi_in, pol, xv, dyv, ev);
    if (w == 0) {
      q = load_params<KIND>(R, c, in);
      if (KIND == SBN_OP_FORWARD && R.running_mean != nullptr && in)
        run = RunningIn{ld_param(R.running_mean + c), ld_param(R.running_var + c)};
    }
    if (KIND == SBN_OP_BACKWARD) mean_in = in && kt > 0 ? ld_param(R.save_mean_in + c) : 0.0f;
  };
  if (b < nchunks) load_chunk(b);
  int st = __syncthreads_or(err_seen != 0 && !SBN_MUTANT(SBN_MUT_SMALL_LATE_STOP)) ? sbnAborted : 0;
  const uint32_t k = sm.k;
  SBN_STAMP(1); /* its start's loads are back */
  const uint64_t deadline = deadline_after(a.timeout_ns);
  /* one value per channel: the stream kernel's gather refuses it (no unbiased variance);
     every block alike, before any write (a team: the gather, from the team's count) */
  if (KIND == SBN_OP_FORWARD && !TEAM && rows == 1 && st == 0) st = sbnInvalidArgument;
  /* every block read the epoch and nbt above (thread 0, before the barrier): it arrives
     (block 0 checks the arrivals before it advances them, at its end). The solo thread
     (warp 1) arrives, not thread 0: the arrival's fence waits for every access the thread
     has under way, and warp 0 is the block's critical path (its merge and coefficients);
     a block with a chunk arrives after its first chunk's partials, while warp 0 merges
     them, one without arrives now */
  const bool solo_thread = threadIdx.x == kSoloThread;
  if (solo_thread && (st != 0 || b >= nchunks))
    rank_arrive(&R.state->barrier, a.G, b == 0);

  uint32_t arrivals = ~0u; /* block 0: the counter, loaded before its first chunk's stores */
  bool nbt_due = false;    /* block 0: channel 0's outputs were written; nbt follows */
  for (int j = b; st == 0 && j < nchunks; j += a.G) {
    /* (a later chunk: its partials go into sm.red after the barrier that ordered warp 0's
       reads of it, and its coefficients into sm.coef after the barrier below, which
       every thread reaches after its reads of the previous chunk's) */
    if (j != b) load_chunk(j);
    const int64_t c = (int64_t)j * kChunk + lane;
    const bool in = c < a.c;
    /* the thread's partial of its values (backward with an activation: g = act'(y) dy
       now held in dy's place) */
    const typename P::T pt = small_partial<KIND, kEpi>(R, kt, xv, dyv, ev, mean_in);
    P::red(sm)[w][lane] = pt;
    __syncthreads(); /* every warp's partial is in */
    if (j == b) {
      SBN_STAMP(2); /* the first chunk's statistics */
      if (solo_thread) {
        rank_arrive(&R.state->barrier, a.G, b == 0);
        SBN_STAMP_BY(3, kSoloThread); /* arrived */
      }
    }
    if (w == 0 && TEAM) {
      small_team_coefs<KIND>(a, R, rows64, j, k, deadline, in, q, sm);
    } else if (w == 0 && in) {
      /* the warps in order: the rank's values of the channel, which are the team's (a
         merge with the empty record of no other rank gives them back unchanged) */
      float d[kRec];
      small_merge<KIND>(sm, lane, d);
      float v[3], mine[2] = {0.0f, 0.0f};
      small_local_values<KIND>(d, v, mine);
      set_coefs<KIND>(R, lane, rows, v, mine, q, sm);
    }
    __syncthreads(); /* the coefficients before the outputs read them */
    int64_t m = rows; /* the team's values of a channel */
    if (TEAM) {
      /* a failed gather: nothing written for this chunk or later ones (block-uniform) */
      const int gst = sm.status;
      if (gst != 0) {
        st = gst;
        break;
      }
      m = sm.m;
    }
    /* block 0: the arrivals counter, loaded now so that its round trip overlaps the
       chunk's stores (solo_end polls again where some block had not arrived yet) */
    if (j == b && b == 0 && solo_thread) arrivals = ld_arrivals_gpu(&R.state->barrier);
    const bool dz = kEpi && KIND == SBN_OP_BACKWARD && R.dz != nullptr;
    if ((R.out != nullptr || dz) && in) {
      const float* kc = sm.coef[lane];
SBN_UNROLL
      for (int i = 0; i < kSmallHold; i++)
        if (i < kt) {
          const int64_t e = (int64_t)(w + kWarps * i) * a.c + c;
          /* (the mutant reads x again here instead of using the held value) */
          const float xi = SBN_MUTANT(SBN_MUT_SMALL_RELOAD) ? Dt<DT>::to_f32(tensor_ld_elem<DT>(R.x, e, pol)) : xv[i];
          float r;
          if (KIND == SBN_OP_FORWARD) {
            r = sbn_forward_y(xi, kc[0], kc[1], kc[2], kc[3]);
            if (kEpi && SBN_MUTANT(SBN_MUT_SMALL_Z_AFTER_ACT))
              r = sbn_act(R.act, R.slope, r) + (epi_in != nullptr ? ev[i] : 0.0f);
            else if (kEpi)
              r = sbn_act(R.act, R.slope, epi_in != nullptr ? r + ev[i] : r);
          } else {
            r = sbn_backward_dx(sbn_bwd_coef_t{kc[0], kc[1], kc[2], kc[3]}, xi, dyv[i]);
            if (dz) tensor_st_elem<DT>(R.dz, e, Dt<DT>::from_f32(dyv[i]));
          }
          if (R.out != nullptr) tensor_st_elem<DT>(R.out, e, Dt<DT>::from_f32(r));
        }
    }
    if (w == 0 && in) channel_outputs<KIND>(R, c, lane, m, sm, false, &run);
    if (j == b) SBN_STAMP(5); /* the first chunk's outputs */
    nbt_due |= j == 0;
    if (SBN_MUTANT(SBN_MUT_SMALL_LATE_STOP) && j == b && __syncthreads_or(err_seen != 0)) st = sbnAborted;
  }
  /* block 0's solo thread ends the op (not thread 0: its outputs' stores are the block's
     last, and the end waits for none of them: solo_end) */
  const bool failed =
      op_end_failed<KIND>(a, R, b == 0 && solo_thread, arrivals, deadline, k, nbt_due, sm, st);
  if (b == 0) SBN_STAMP_BY(4, kSoloThread); /* the op ended (the epoch advanced, or timed out) */
  if (failed) return;
  SBN_STAMP(6); /* done */
}

/* The host path's statistics where the plan is small (SBN_HOST_SMALL_STATS, coop_args.h;
 * in place of STATS and PUBLISH): block b takes the chunks b, b + G, ... as the small kernel
 * does, sums them alike (small_load_values, small_partial, small_merge: its order, its
 * bits) and writes each chunk's record into the rank's `send` records, as PUBLISH would;
 * the collective (or, a team of one, nothing) and APPLY (the stream kernel's stage 5 from
 * the records) follow. No epochs, no arrivals: the stream orders the launches. A virtual
 * team's ranks are one launch (slot s: blocks [s*G, (s+1)*G)). A launch the plan never
 * makes (a rank of more than SBN_SMALL_ROWS rows) fails with sbnInvalidUsage for every
 * rank of the launch, as the cooperative kernel's, and writes no record; APPLY then writes
 * nothing (the ranks' stop words).
 */
template <int KIND, int DT, int EPI>
__global__ void __launch_bounds__(kThreads, SBN_STREAM_BLOCKS_PER_SM)
    sbn_host_small_stats_kernel(const __grid_constant__ sbn_coop_args_t a) {
  typedef Part<KIND> P;
  static_assert(EPI == SBN_EPI_NONE || EPI == SBN_EPI_ACT, "the small kernels: plain or act");
  constexpr bool kEpi = KIND == SBN_OP_BACKWARD && EPI == SBN_EPI_ACT; /* the forward's sums read x only */
  SBN_SHARED(Smem, sm);
  /* launch slot s owns blocks [s*G, (s+1)*G) (a virtual team's ranks together, or one) */
  const int slot = blockIdx.x / a.G, b = blockIdx.x % a.G;
  const sbn_coop_rank_t& R = a.r[slot];
  const int w = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
  const int64_t rows64 = R.n * R.spatial;
  if (launch_over_small_rows(a)) {
    /* (after a barrier, as the small kernel's: record_error reads the error words in host
       memory, which no kernel does before its first barrier: check-sass.sh) */
    __syncthreads();
    if (b == 0 && threadIdx.x == 0) record_error(a, R.rank, sbnInvalidUsage);
    return;
  }
  /* APPLY writes nbt + 1 from one block while others use nbt for the momentum factor:
     they all read this copy instead (as the stream statistics kernel's) */
  if (KIND == SBN_OP_FORWARD && b == 0 && threadIdx.x == 0)
    R.state->nbt_snap = R.nbt != nullptr ? *R.nbt : 0;
  const int rows = (int)rows64;
  const int kt = rows > w ? (rows - w + kWarps - 1) / kWarps : 0;
  const int nchunks = (int)((a.c + kChunk - 1) / kChunk);
  const uint64_t pol = policy_evict_first();
  const void* const epi_in = kEpi && R.act != SBN_ACT_IDENTITY ? R.y : nullptr;
  float xv[kSmallHold], dyv[kSmallHold], ev[kSmallHold];
  for (int j = b; j < nchunks; j += a.G) {
    const int64_t c = (int64_t)j * kChunk + lane;
    const bool in = c < a.c;
    small_load_values<KIND, DT, kEpi>(R, a.c, c, in, w, kt, epi_in, pol, xv, dyv, ev);
    const float mean_in = KIND == SBN_OP_BACKWARD && in && kt > 0 ? ld_param(R.save_mean_in + c) : 0.0f;
    const typename P::T pt = small_partial<KIND, kEpi>(R, kt, xv, dyv, ev, mean_in);
    P::red(sm)[w][lane] = pt;
    __syncthreads(); /* every warp's partial is in */
    if (w == 0) {
      float v[kRec] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (in) small_merge<KIND>(sm, lane, v);
      write_send_record(a, R, j, rows64, v);
    }
    __syncthreads(); /* warp 0's reads of P::red before the next chunk's stores */
  }
}

#endif /* SYNCBN_COOP_SMALL_CUH_ */
