/* coop_kernel.cuh — the cooperative SyncBN kernel: forward and backward are each ONE
 * kernel per launch, with the cross-rank exchange inside it (DESIGN.md, "The forward
 * kernel"). Included by kernels/coop.cu.
 *
 * A launch runs `nlaunch` ranks (all W of a virtual team, or the one rank of this GPU);
 * rank slot s owns blocks [s*G, (s+1)*G). Per rank:
 *   stage 1: the rank's blocks reduce their units (coop_plan.h) into per-(slice, channel)
 *            partials in the rank's workspace: forward (count, mean_hi, mean_lo, m2),
 *            backward (sum dy, sum dy*(x - mean)); fixed orders only;
 *   stage 2: rank-local barrier over the rank's G blocks (co-resident: cooperative launch);
 *   stage 3: each chunk of 32 channels is merged over the slices in slice order by one
 *            block and PUSHED into every rank's mailbox: data, then the record's epoch
 *            with a release store (the ONE exchange of the op);
 *   stage 4: for every unit it owns, a block waits (relaxed polls and one acquire,
 *            bounded by the timeout via %globaltimer, abortable) until every rank's record
 *            of the unit's chunk carries this op's epoch, checks they all run the same op,
 *            merges the ranks' entries in RANK ORDER (the same bits on every rank), and
 *            finalizes;
 *   stage 5: normalize (y or dx) the unit's elements; the unit's slice-0 block writes the
 *            per-channel outputs (save stats, running stats, dweight/dbias).
 * Stages 1 and 5 come in three variants (coop_plan.h): onchip (x, and dy, held in
 * registers and shared memory between them: each crosses HBM once), stream (16-byte
 * loads again in stage 5), legacy (the first kernel: coop_legacy.cuh). Stages 2-4 are
 * the same for all (coop_exchange.cuh).
 * Nothing is written to the caller's outputs before stage 4 succeeded, so an op mismatch
 * or a global count of 1 leaves them untouched; on a timeout the blocks that timed out
 * write nothing (others may have finished their units).
 *
 * Epochs: each rank's op counter lives in device memory; every block reads it before the
 * rank-local barrier and block 0 advances it after, so nothing comes from the host and a
 * captured CUDA graph replays correctly. Mailbox records are double-buffered by epoch
 * parity: a rank overwrites parity p at op k+2 only after all ranks published op k+1,
 * which each did only after its previous kernel (op k) had finished reading.
 *
 * Errors: a wait that passes the deadline, or sees that the team failed (the rank's stop
 * word, NCCL teams' failure words; the error words of host memory only through the
 * rank's watcher block: coop_exchange.cuh, "failures"), makes the block write its rank's
 * error word (mapped host memory, read by sbnCommGetAsyncError) and the stop words of
 * the launch's ranks, and return. No __trap: the context stays usable. A kernel queued
 * behind a failure of the team (or replayed after sbnCommAbort) publishes nothing: its
 * publishing blocks read the rank's stop word (and NCCL teams' failure words) at their
 * start and look at them before they publish (after a failure some peer may not have
 * finished reading this rank's previous records, so the double buffering no longer
 * protects them; a rank whose previous kernel succeeded saw every rank's records of it,
 * so every peer had finished the kernel before: publishing is safe, and a peer that
 * failed since makes its wait end).
 */
#ifndef SYNCBN_COOP_KERNEL_CUH_
#define SYNCBN_COOP_KERNEL_CUH_

template <int KIND, int DT, bool TILE, int VEC, int VAR>
__global__ void __launch_bounds__(kThreads, VAR == SBN_VAR_STREAM ? SBN_STREAM_BLOCKS_PER_SM
                                            : VAR == SBN_VAR_ONCHIP ? SBN_ONCHIP_BLOCKS_PER_SM
                                                                    : 1)
    sbn_coop_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  SBN_DYN_SHARED(uint4, hold_smem); /* onchip: hold_slots batches per thread */
  constexpr bool kLegacy = VAR == SBN_VAR_LEGACY, kOnchip = VAR == SBN_VAR_ONCHIP;
  const int slot = blockIdx.x / a.G, b = blockIdx.x % a.G;
  const sbn_coop_rank_t& R = a.r[slot];
  const sbn_geo_t g = sbn_geo_make(R.n, a.c, R.spatial, TILE, kLegacy ? 1 : VEC, a.G);
  VecPath<KIND, DT, TILE, VEC, kOnchip> path;

  SBN_STAMP(0); /* the block runs */
  if (threadIdx.x == 0) {
    sm.k = ld_weak_u32(&R.state->epoch) + 1u;
    sm.nbt_before = (KIND == SBN_OP_FORWARD && R.nbt != nullptr) ? *R.nbt : 0;
  }
  /* Blocks that publish load the rank's stop word and NCCL teams' failure words now
     (device memory; the last warp's lanes) and look at them after the barrier. No host
     memory: see coop_exchange.cuh, "failures". */
  int err_seen = 0;
  if (b < g.nchunks && (int)(threadIdx.x >> 5) == kWarps - 1) err_seen = start_words_lane(a, R);
  __syncthreads();
  const uint32_t k = sm.k;
  SBN_STAMP(1); /* its start's loads are back */

  /* Every failure ends at the one exit below (st: block-uniform), which records it:
     one inlined copy of the failure path (code size is time: check-sass.sh). */
  int st = 0;
  /* stage 1 */
  if constexpr (kLegacy) {
    for (int u = b; u < g.units; u += a.G) {
      if (KIND == SBN_OP_FORWARD)
        legacy_fwd_stage1<DT, TILE>(R, g, u, sm);
      else
        legacy_bwd_stage1<DT, TILE>(R, g, u, sm);
    }
  } else if (!path.stage1(R, g, b, a.G, hold_smem, a.hold_slots, sm)) {
    /* a plan the onchip kernel cannot hold (never from the library's plan): the other
       blocks of the rank time out at the barrier; nothing is written */
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
  if (st == 0 && !rank_barrier(&R.state->barrier, a.G, b == 0, deadline)) st = sbnTimeout;
  if (SBN_MUTANT(SBN_MUT_SECOND_BARRIER) && st == 0 &&
      !rank_barrier(&R.state->barrier, a.G, b == 0, deadline))
    st = sbnTimeout;
  if (st == 0) {
    if (a.host_words_at_start && b < g.nchunks && threadIdx.x == kThreads - 1)
      err_seen |= ld_relaxed_gpu_u32(&R.state->stop) != 0u; /* block 0's read, above */
    if (__syncthreads_or(err_seen != 0)) st = sbnAborted;
  }
  if (st == 0) {
    if (b == 0 && threadIdx.x == 0) st_weak_u32(&R.state->epoch, k);
    SBN_STAMP(3); /* past the rank barrier */

    /* stage 3 */
    for (int j = b; j < g.nchunks; j += a.G) publish_chunk<KIND, false>(a, R, g, j, k, sm);
    SBN_STAMP(4); /* published */

    /* stage 4 + 5 */
    int gbase = 0;
    for (int u = b; u < g.units; u += a.G) {
      st = finish_coefs<KIND, TILE, false>(a, R, g, u % g.ngroups, u / g.ngroups, k, deadline, sm);
      if (st != 0) break;
      if (u == b) SBN_STAMP(5); /* the first unit's records gathered (stage 4) */
      if constexpr (kLegacy) {
        legacy_stage5<KIND, DT, TILE>(R, g, u, sm);
      } else {
        path.stage5_unit(R, g, u, &gbase, hold_smem, sm);
      }
      __syncthreads(); /* sm.coef is reused by the next unit */
    }
  }
  if (st != 0) {
    if (threadIdx.x == 0) record_error(a, R.rank, st);
    return;
  }
  SBN_STAMP(6); /* done */
}

#endif /* SYNCBN_COOP_KERNEL_CUH_ */
