/* coop_kernel.cuh — the cooperative SyncBN kernel: forward and backward are each ONE
 * kernel per launch, with the cross-rank exchange inside it (DESIGN.md, "The forward
 * kernel"). Included by kernels/coop.cu.
 *
 * A launch runs `nlaunch` ranks (all W of a virtual team, or the one rank of this GPU);
 * rank slot s owns blocks [s*G, (s+1)*G). Per rank:
 *   stage 1: the rank's blocks reduce their units (coop_plan.h) into per-(slice, channel)
 *            partials in the rank's workspace: forward (count, mean_hi, mean_lo, m2),
 *            backward (sum dy, sum dy*(x - mean)); fixed orders only;
 *   stage 2: rank-local barrier over the rank's G blocks (co-resident: cooperative launch),
 *            left out of "solo" ops, whose chunks each lie in one block (below);
 *   stage 3: each chunk of 32 channels is merged over the slices in slice order by one
 *            block and PUSHED into every rank's mailbox: data, then the record's epoch
 *            with a release store (the ONE exchange of the op);
 *   stage 4: for every chunk its units (contiguous: coop_plan.h) lie in, a block waits
 *            (relaxed polls and one acquire, bounded by the timeout via %globaltimer,
 *            abortable) until every rank's record of the chunk carries this op's epoch,
 *            checks they all run the same op, merges the ranks' entries in RANK ORDER
 *            (the same bits on every rank), and finalizes the chunk's channels, which
 *            its units of that chunk then share;
 *   stage 5: normalize (y or dx) the unit's elements; the unit's slice-0 block writes the
 *            per-channel outputs (save stats, running stats, dweight/dbias).
 * Stages 1 and 5 come in two variants (coop_plan.h, coop_vec.cuh): onchip (x, and dy,
 * held in registers and shared memory between them: each crosses HBM once) and stream
 * (16-byte loads, again in stage 5; its scalar form for unaligned tensors). Stages 2-4
 * are the same for both (coop_exchange.cuh).
 * Nothing is written to the caller's outputs before stage 4 succeeded, so an op mismatch
 * or a global count of 1 leaves them untouched; on a timeout the blocks that timed out
 * write nothing (others may have finished their units). One exception: the stream
 * backward's dz_first (coop_vec.cuh) writes dz in stage 1, only where the host compared
 * every rank's op (no mismatch can be found here) and dz is a buffer of its own: a
 * timeout or an abort after stage 1 leaves dz with the values a successful op writes.
 *
 * Epochs: each rank's op counter lives in device memory; every block reads it before the
 * rank-local barrier and block 0 advances it after (solo ops: after every block arrived
 * at the barrier's counter, coop_exchange.cuh), so nothing comes from the host and a
 * captured CUDA graph replays correctly. Mailbox records are double-buffered by epoch
 * parity: a rank overwrites parity p at op k+2 only after all ranks published op k+1,
 * which each did only after its previous kernel (op k) had finished reading.
 *
 * Errors (a solo op's block 0 checks the arrivals after its units: when that check times
 * out, which needs blocks that are not co-resident, its units' outputs are written and
 * the op still fails with sbnTimeout): a wait that passes the deadline, or sees that the
 * team failed (the rank's stop word, NCCL teams' failure words; the error words of host
 * memory only through the rank's watcher block: coop_exchange.cuh, "failures"), makes the
 * block write its rank's error word (mapped host memory, read by sbnCommGetAsyncError)
 * and the stop words of the launch's ranks, and return. No __trap: the context stays
 * usable. A kernel queued behind a failure of the team (or replayed after sbnCommAbort)
 * publishes nothing and writes nothing: every block with units reads the rank's stop word
 * (and NCCL teams' failure words) at its start and looks at them before it publishes or
 * gathers (after a
 * failure some peer may not have finished reading this rank's previous records, so the double
 * buffering no longer protects them; a rank whose previous kernel succeeded saw every
 * rank's records of it, so every peer had finished the kernel before: publishing is safe,
 * and a peer that failed since makes its wait end).
 */
#ifndef SYNCBN_COOP_KERNEL_CUH_
#define SYNCBN_COOP_KERNEL_CUH_

template <int KIND, int DT, bool TILE, int VEC, int VAR, int EPI>
__global__ void __launch_bounds__(kThreads, VAR == SBN_VAR_STREAM ? SBN_STREAM_BLOCKS_PER_SM
                                                                  : SBN_ONCHIP_BLOCKS_PER_SM)
    sbn_coop_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  SBN_DYN_SHARED(uint4, hold_smem); /* onchip: hold_slots batches per thread */
  constexpr bool kOnchip = VAR == SBN_VAR_ONCHIP;
  const int slot = blockIdx.x / a.G, b = blockIdx.x % a.G;
  const sbn_coop_rank_t& R = a.r[slot];
  const sbn_geo_t g = sbn_geo_make(R.n, a.c, R.spatial, TILE, VEC, a.G);
  VecPath<KIND, DT, TILE, VEC, kOnchip, EPI> path; /* EPI: SBN_EPI_* (coop_args.h) */

  SBN_STAMP(0); /* the block runs */
  if (threadIdx.x == 0) {
    sm.k = ld_weak_u32(&R.state->epoch) + 1u;
    sm.nbt_before = (KIND == SBN_OP_FORWARD && R.nbt != nullptr) ? *R.nbt : 0;
    sm.coef_chunk = -1;
  }
  /* A team of one: the record of a chunk is the whole team's, so where it is cheap each
     block merges its units' chunks itself (publish_chunk into sm.own, before the stage 4
     of the first of its units in that chunk) and the mailbox, its release, its polls and
     the chunk owners' publishing are left out; the same values are merged the same way
     (same bits). Cheap: at most SBN_LOCAL_SLICES slices per chunk (coop_plan.h), so that
     a merge is at most two batches of loads per warp (after the barrier, or of the
     block's own partials in a solo op), where the owner's publish (the same loads, then
     a system-scope release) and a reader's poll, acquire and loads cost 2-3 dependent
     round trips more per unit. */
  const bool local = a.nranks == 1 && g.P <= SBN_LOCAL_SLICES; /* coop_plan.h */
  const int u0 = sbn_unit_begin(&g, b, a.G), u1 = sbn_unit_begin(&g, b + 1, a.G); /* its units */
  int j0, j1; /* the chunks it publishes (coop_plan.h) */
  sbn_pub_chunks(&g, u0, u1, &j0, &j1);
  /* Every block with units loads the rank's stop word and NCCL teams' failure words now
     (device memory; the last warp's lanes) and looks at them after the barrier. No host
     memory: see coop_exchange.cuh, "failures". A block that publishes nothing must look
     too: after an op whose block 0 timed out at the barrier (the epoch not advanced)
     while a late block of the rank still published at its epoch k, the rank's next op
     runs with k again and finds that chunk's records of k (the failed op's) in every
     rank's mailbox; a waiter that had not looked would merge them and write its units
     (test_coop_emu: test_stale_epoch_after_timeout). The rank's failure set its stop
     word, which the next op's blocks all see. */
  const bool looks = local || j1 > j0 || (u1 > u0 && !SBN_MUTANT(SBN_MUT_WAITER_BLIND));
  int err_seen = 0;
  if (looks && (int)(threadIdx.x >> 5) == kWarps - 1) err_seen = start_words_lane(a, R);
  path.xm_first(R, g, u0, u1, sm); /* the tile mask from x's first unit: its round trip here */
  __syncthreads();
  const uint32_t k = sm.k;
  SBN_STAMP(1); /* its start's loads are back */

  /* Solo: every unit of a chunk lies in the block that publishes the chunk (tile units
     with one slice per group, P == 1: G = max(chunks, values / 8192) < 2 chunks, so ops
     of fewer than ~500 rows (N x H x W) per rank, such as S10 and the empty op, and wide
     ops whose G the co-resident grid caps below 2 chunks; or one block per rank), so no
     block reads another's partials, and the rank barrier (a dependent round trip on
     every op's path) is left out: the blocks only arrive, and block 0 checks the
     arrivals before it advances the epoch (coop_exchange.cuh, "solo ops"). Not on the
     peer-pinned-host transport, whose start-of-kernel read of the error words is made
     the rank's decision by the barrier. */
  const bool solo = (a.G == 1 || (TILE && g.P == 1)) && !a.host_words_at_start;

  /* Every failure ends at the one exit below (st: block-uniform, but for block 0's
     solo thread at a solo op's end), which records it: one inlined copy of the failure path
     (code size is time: check-sass.sh). */
  int st = 0;
  /* stage 1 */
  if (!path.stage1(R, g, u0, u1, hold_smem, a.hold_slots, sm)) {
    /* a plan the onchip kernel cannot hold (never from the library's plan): the other
       blocks of the rank time out at the barrier, nothing is written (a solo op: the
       other blocks finish their units) */
    st = sbnInvalidUsage;
  }
  /* stage 2: every block read the epoch (and nbt) above, so block 0 may advance it */
  SBN_STAMP(2); /* stage 1 done */
  const uint64_t deadline = deadline_after(a.timeout_ns);
  if (a.host_words_at_start && b == 0 && st == 0) {
    /* peer-pinned-host: one read of the error words for the rank, made into its stop
       word before the barrier (whose fences order it): all its blocks decide alike */
    const int seen = (int)(threadIdx.x >> 5) == 0 ? host_words_lane(a) : 0;
    if (__syncthreads_or(seen) && threadIdx.x == 0) st_relaxed_gpu(&R.state->stop, sbnAborted);
  }
  if (!solo && st == 0 && !rank_barrier(&R.state->barrier, a.G, b == 0, deadline)) st = sbnTimeout;
  /* Block 0 advances the epoch once every block of the op has read it, whether or not
     the op goes on: its thread 0 right after the barrier, or (solo) the solo thread,
     which made the block's arrival (below: the same thread, so that its own add comes
     before its loads of the counter on every path), at the op's end once all arrived
     (rank_arrivals_done). */
  const bool advance = b == 0 && threadIdx.x == 0 && !solo && st == 0;
  const bool ends =
      b == 0 && threadIdx.x == (SBN_MUTANT(SBN_MUT_SOLO_END_THREAD0) ? 0 : kSoloThread) && solo;
  if (advance) st_weak_u32(&R.state->epoch, k);
  if (SBN_MUTANT(SBN_MUT_SECOND_BARRIER) && st == 0 &&
      !rank_barrier(&R.state->pad, a.G, b == 0, deadline)) /* its own counter */
    st = sbnTimeout;
  if (st == 0) {
    if (a.host_words_at_start && looks && threadIdx.x == kThreads - 1)
      err_seen |= ld_relaxed_gpu_u32(&R.state->stop) != 0u; /* block 0's read, above */
    /* (also orders a solo block's partials before its own stage 3 reads them) */
    if (__syncthreads_or(err_seen != 0)) st = sbnAborted;
  }
  /* a solo block arrives (every block read the epoch and nbt before the start's barrier):
     the solo thread (warp 1, coop_exchange.cuh: kSoloThread) after stage 1, beside warp
     7's loads of the block's one slice (publish_chunk: P = 1 in every solo op), not
     thread 0 at the start, where the arrival's fence waited for every access thread 0 had
     under way before its stage 1 began */
  if (solo && threadIdx.x == kSoloThread) rank_arrive(&R.state->barrier, a.G, b == 0);
  uint32_t arrivals = ~0u; /* solo: the counter, loaded while the gather waits (~0u: not
                              loaded, an aborted op: rank_arrivals_done loads it) */
  bool nbt_due = false;  /* solo: channel 0's outputs were written; nbt follows */
  if (st == 0) {
    SBN_STAMP(3); /* past the rank barrier */

    /* stage 3 (the block's chunks published), then stages 4 + 5 per unit (`local`: each
       chunk of the block's units merged once, before its first unit, into sm.own): one
       loop, so that publish_chunk has one call site (code size: check-sass.sh) */
    const int npub = local ? 0 : j1 - j0;
    int gbase = 0, u = u0;
    for (int step = 0;; step++) {
      const bool pub = step < npub;
      if (step == npub) {
        SBN_STAMP(4); /* published */
        if (ends) arrivals = ld_arrivals_gpu(&R.state->barrier);
      }
      if (!pub && u >= u1) break;
      const int chunk = pub ? j0 + step : sbn_unit_chunk(&g, u);
      /* local: merged once per chunk, when the block's coefficients are of another one
         (sm.coef_chunk: finish_coefs; read only if local: coef_chunk_now) */
      if (pub || (local && chunk != coef_chunk_now(sm)))
        publish_chunk<KIND, false>(a, R, g, chunk, k, sm, !pub);
      if (pub) continue;
      /* no gather or barrier before a unit of the previous one's chunk (coef_shared) */
      const bool same = u > u0 && coef_shared<TILE>(g, u - 1, u);
      st = finish_coefs<KIND, TILE, false>(a, R, g, u % g.ngroups, u / g.ngroups, k, deadline, sm,
                                           !solo, local, same,
                                           EPI == SBN_EPI_RECOVER ? sbn_dtype_unit(DT) : 0.0f);
      if (st != 0) break;
      if (u == u0) SBN_STAMP(5); /* the first unit's records gathered (stage 4) */
      nbt_due |= u == 0;
      path.stage5_unit(R, g, u, &gbase, hold_smem, sm);
      /* sm.coef is replaced when the next unit's chunk is another (computed here, not
         kept across stage 5: the fp16 plane kernels are at 128 registers) */
      const bool same_next = u + 1 < u1 && coef_shared<TILE>(g, u, u + 1);
      if (!same_next && !SBN_MUTANT(SBN_MUT_COEF_NO_BARRIER)) __syncthreads();
      u++;
    }
  }
  if (op_end_failed<KIND>(a, R, ends, arrivals, deadline, k, nbt_due, sm, st)) return;
  SBN_STAMP(6); /* done */
}

#endif /* SYNCBN_COOP_KERNEL_CUH_ */
