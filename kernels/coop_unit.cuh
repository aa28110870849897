/* coop_unit.cuh — the unit variant of the cooperative kernel (SBN_VAR_UNIT, coop_plan.h:
 * SBN_KERNEL=unit asks for it): a team of one whose plane units are whole channels
 * (NCHW, G < 2C: one slice per channel, sbn_unit_applies). Such a channel's statistics
 * are its own unit's, so nothing needs an exchange or another block: each block takes its
 * units one after the other, and for each runs the stream kernel's stage 1, finishes the
 * channel (its coefficients and per-channel outputs), then runs stage 5 of the same unit.
 *
 * What it is for: stage 5 reads x (and dy) again right after stage 1 read them, while the
 * G units in flight (G x the unit's bytes: 17 MB forward on S5 fp32, G = 264) are still in
 * L2, where the stream kernel reads them again only after the whole tensor's stage 1 (from
 * HBM, for tensors larger than L2). The caller's tensors are touched as often as by the
 * stream kernel (sbn_variant_bytes); HBM moves 2|x| forward and 3|x| backward, as onchip's.
 * And there is no rank barrier and no merge of other blocks' partials: the blocks only
 * arrive at the rank's counter, and block 0 advances the epoch at its end, as a solo op
 * does (coop_exchange.cuh, "solo ops"; coop_kernel.cuh for the protocol).
 *
 * The same bits as the stream kernel with the same G (test_unit_equals_stream): the same
 * stage 1 and stage 5 (coop_vec.cuh), and for the channel the stream kernel's arithmetic
 * of a team of one, one lane's worth: flush_planes' merge of the warps' partials, then
 * publish_chunk's merge of the chunk's slices (its one slice, P = 1, in warp 7's share,
 * the warps' results merged in order) and gather_chunk's merge of the ranks' records (one
 * rank), finish_coefs' coefficients and outputs (set_coefs, channel_outputs).
 *
 * Failures: the rank's stop word and NCCL teams' failure words are loaded at the start,
 * beside the epoch, and looked at in the start's barrier, before anything is written (a
 * kernel queued behind a failure of the team writes nothing: not even the dz that a
 * stream backward with an activation writes in stage 1); a launch this kernel is not
 * for (never from the library's plan) fails with sbnInvalidUsage, nothing written. Block
 * 0 checks every block's arrival at its end, as a solo op's does: a grid not co-resident
 * times out there (outputs written, sbnTimeout; test_solo_arrivals).
 */
#ifndef SYNCBN_COOP_UNIT_CUH_
#define SYNCBN_COOP_UNIT_CUH_

/* One thread, after the barrier that follows unit u's stage 1: the channel's coefficients
   into sm.coef[u % kChunk] and sm.extra, from the warps' partials of the unit in sm.red
   (stats_unit) and the channel's parameters q (P == 1: unit u is channel u). */
template <int KIND>
__device__ __forceinline__ void unit_coefs(const sbn_coop_rank_t& R, const sbn_geo_t& g, int u,
                                           const ChanParams& q, Smem& sm) {
  typedef Part<KIND> P;
  const int slot = u % kChunk;
  /* flush_planes: the warps' partials in warp order; the entry publish_chunk loads */
  typename P::T e = P::red(sm)[0][slot];
SBN_UNROLL
  for (int w = 1; w < kWarps; w++) e = P::merge(e, P::red(sm)[w][slot]);
  /* publish_chunk: warp w merges the slices [P*w/8, P*(w+1)/8) (with P = 1, warp 7 the
     one slice), then the warps' results in order */
  typename P::T t = P::empty();
  for (int w = 0; w < kWarps; w++) {
    const bool has = (int)((int64_t)g.P * w / kWarps) < (int)((int64_t)g.P * (w + 1) / kWarps);
    const typename P::T tw = has ? P::merge(P::empty(), e) : P::empty();
    t = w == 0 ? tw : P::merge(t, tw);
  }
  float d[kRec];
  P::out(t, d);
  /* gather_chunk: the one rank's record (count g.rows), merged in rank order */
  const int64_t m = g.rows;
  float v[3], mine[2] = {0.0f, 0.0f};
  if (KIND == SBN_OP_FORWARD) {
    const sbn_partial_t pt = {(float)m, d[0], d[1], d[2]};
    const sbn_partial_t gp = sbn_partial_merge(sbn_partial_t{0.0f, 0.0f, 0.0f, 0.0f}, pt);
    v[0] = gp.mean_hi, v[1] = gp.mean_lo, v[2] = gp.m2;
  } else {
    const sbn_bwd_csums_t s = {{d[0], d[1]}, {d[2], d[3]}};
    const sbn_bwd_csums_t gs = sbn_bwd_csums_merge(Part<SBN_OP_BACKWARD>::empty(), s);
    mine[0] = sbn_csum_value(s.dy), mine[1] = sbn_csum_value(s.dy_xmu);
    v[0] = sbn_csum_value(gs.dy), v[1] = sbn_csum_value(gs.dy_xmu), v[2] = 0.0f;
  }
  set_coefs<KIND>(R, slot, m, v, mine, q, sm);
}

template <int KIND, int DT, int VEC, int EPI>
__global__ void __launch_bounds__(kThreads, SBN_STREAM_BLOCKS_PER_SM)
    sbn_unit_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  const int b = blockIdx.x;
  const sbn_coop_rank_t& R = a.r[0];
  const sbn_geo_t g = sbn_geo_make(R.n, a.c, R.spatial, false, VEC, a.G);
  VecPath<KIND, DT, false, VEC, false, EPI> path;
  const int u0 = sbn_unit_begin(&g, b, a.G), u1 = sbn_unit_begin(&g, b + 1, a.G);
  if (a.nranks != 1 || a.nlaunch != 1 || g.P != 1 || a.host_words_at_start) {
    /* a launch the plan never makes (sbn_unit_applies): nothing read or written, no
       arrival, the epoch left as it was; sbnInvalidUsage for each rank of the launch
       (after a barrier: no system-scope load before the first, check-sass.sh) */
    __syncthreads();
SBN_NO_UNROLL
    for (int i = 0; b == 0 && threadIdx.x == 0 && i < a.nlaunch; i++) record_error(a, a.r[i].rank, sbnInvalidUsage);
    return;
  }

  SBN_STAMP(0); /* the block runs */
  if (threadIdx.x == 0) {
    sm.k = ld_weak_u32(&R.state->epoch) + 1u;
    sm.nbt_before = (KIND == SBN_OP_FORWARD && R.nbt != nullptr) ? *R.nbt : 0;
  }
  /* the rank's stop word and NCCL teams' failure words (device memory; the last warp's
     lanes), looked at in the barrier below, which waits for the epoch's load anyway; the
     block's channels' parameters and running statistics asked of L2 (warp 0's lanes: a
     block's units are at most ceil(C / G) channels), which one thread loads at each
     unit's end of stage 1 and after its coefficients */
  const int w = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
  int err_seen = w == kWarps - 1 ? start_words_lane(a, R) : 0;
  if (SBN_PREFETCH_PARAMS && w == 0)
    for (int u = u0 + lane; u < u1; u += 32) {
      prefetch_params<KIND>(R, u);
      if (KIND == SBN_OP_FORWARD && R.running_mean != nullptr)
        prefetch_l2(R.running_mean + u), prefetch_l2(R.running_var + u);
    }
  /* (the mutant looks only after its first unit's outputs) */
  int st = __syncthreads_or(err_seen != 0 && !SBN_MUTANT(SBN_MUT_UNIT_LATE_STOP)) ? sbnAborted : 0;
  const uint32_t k = sm.k;
  SBN_STAMP(1); /* its start's loads are back */
  /* every block read the epoch and nbt above (thread 0, before the barrier): it arrives
     (block 0 checks the arrivals before it advances them, at its end). The solo thread
     (warp 1, coop_exchange.cuh: kSoloThread) arrives, not thread 0, whose unit_coefs are
     the block's critical path: after the first unit's partials, while thread 0 merges
     them; a block without units now */
  const bool solo_thread = threadIdx.x == kSoloThread;
  if (solo_thread && (st != 0 || u0 >= u1)) rank_arrive(&R.state->barrier, a.G, b == 0);
  const uint64_t deadline = deadline_after(a.timeout_ns);

  /* (a forward of one value per channel, which the stream kernel's gather refuses, never
     comes here: plane units have H*W > 1, so g.rows is 0 or at least 2) */
  uint32_t arrivals = ~0u; /* block 0: the counter, loaded after its first unit */
  bool nbt_due = false;    /* block 0: channel 0's outputs were written; nbt follows */
  int gb = 0;
  for (int u = u0; st == 0 && u < u1; u++) {
    path.stats_unit(R, g, u, &gb, nullptr, sm); /* the warps' partials into sm.red */
    /* the channel's parameters, and the forward's running statistics, loaded while the
       block's other warps finish stage 1: channel_outputs takes those instead of loading
       them after the coefficients, a round trip of thread 0's (an L2 hit, ~0.6 us) that
       put its share of stage 5 that much behind the block's other threads, every unit */
    ChanParams q = {1.0f, 0.0f, 0.0f, 0.0f};
    RunningIn run = {0.0f, 0.0f};
    if (threadIdx.x == 0) {
      q = load_params<KIND>(R, u, true);
      if (KIND == SBN_OP_FORWARD && R.running_mean != nullptr)
        run = RunningIn{ld_param(R.running_mean + u), ld_param(R.running_var + u)};
    }
    __syncthreads(); /* every warp's partial is in */
    if (u == u0) {
      SBN_STAMP(2); /* the first unit's stage 1 done */
      if (solo_thread) {
        rank_arrive(&R.state->barrier, a.G, b == 0);
        SBN_STAMP_BY(3, kSoloThread); /* arrived */
      }
    }
    if (threadIdx.x == 0) unit_coefs<KIND>(R, g, SBN_MUTANT(SBN_MUT_UNIT_FIRST_SLOT) ? u0 : u, q, sm);
    __syncthreads(); /* the coefficients before stage 5 reads them */
    /* the channel's outputs (saved and running statistics; dweight, dbias): after the
       barrier, their stores (and the running statistics' loads) off the others' path */
    if (threadIdx.x == 0)
      channel_outputs<KIND>(R, u, u % kChunk, g.rows, sm, false,
                            KIND == SBN_OP_FORWARD ? &run : nullptr);
    if (u == u0) {
      SBN_STAMP(5); /* the first unit's channel finished */
      if (b == 0 && solo_thread) arrivals = ld_arrivals_gpu(&R.state->barrier);
    }
    nbt_due |= u == 0;
    path.stage5_unit(R, g, u, &gb, nullptr, sm);
    if (SBN_MUTANT(SBN_MUT_UNIT_LATE_STOP) && u == u0 && __syncthreads_or(err_seen != 0)) st = sbnAborted;
  }
  /* block 0's solo thread ends the op (solo_end waits for none of the outputs' stores) */
  const bool failed =
      op_end_failed<KIND>(a, R, b == 0 && solo_thread, arrivals, deadline, k, nbt_due, sm, st);
  if (b == 0) SBN_STAMP_BY(4, kSoloThread); /* the op ended (the epoch advanced, or timed out) */
  if (failed) return;
  SBN_STAMP(6); /* done */
}

#endif /* SYNCBN_COOP_UNIT_CUH_ */
