/* host_path.cuh — the host-driven path's kernels (SBN_ALGO=nccl, what PyTorch does): the
 * stream variant's stages as ordinary launches, with the exchange between them done by the
 * host's collective or by the gather kernel (coop_args.h: SBN_HOST_*). Where the plan is
 * small, small's statistics kernel (coop_small.cuh: sbn_host_small_stats_kernel) stands for
 * STATS and PUBLISH. Included by kernels/coop.cu.
 */
#ifndef SYNCBN_HOST_PATH_CUH_
#define SYNCBN_HOST_PATH_CUH_

/* See coop_args.h (SBN_HOST_*). Launch slot s owns blocks [s*G, (s+1)*G) of STATS and
   APPLY and [s*nchunks, (s+1)*nchunks) of PUBLISH. Ordered by the stream (and by the
   collective between PUBLISH and APPLY), so no epochs and no waits. */
template <int KIND, int DT, bool TILE, int VEC, int EPI>
__global__ void __launch_bounds__(kThreads, SBN_STREAM_BLOCKS_PER_SM)
    sbn_host_stats_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  const int slot = blockIdx.x / a.G, b = blockIdx.x % a.G;
  const sbn_coop_rank_t& R = a.r[slot];
  const sbn_geo_t g = sbn_geo_make(R.n, a.c, R.spatial, TILE, VEC, a.G);
  /* APPLY writes nbt + 1 from one block while others use nbt for the momentum factor:
     they all read this copy instead */
  if (KIND == SBN_OP_FORWARD && b == 0 && threadIdx.x == 0)
    R.state->nbt_snap = R.nbt != nullptr ? *R.nbt : 0;
  typedef VecPath<KIND, DT, TILE, VEC, false, EPI> Path;
  Path path;
  const int u0 = sbn_unit_begin(&g, b, a.G), u1 = sbn_unit_begin(&g, b + 1, a.G);
  if (Path::kXmaskTile && R.xmask) { /* stage1 takes unit u0's sm.xm as written (block-uniform) */
    path.xm_first(R, g, u0, u1, sm);
    __syncthreads();
  }
  path.stage1(R, g, u0, u1, nullptr, 0, sm);
}

template <int KIND, bool TILE>
__global__ void __launch_bounds__(kThreads)
    sbn_host_publish_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  const int nchunks = (int)((a.c + kChunk - 1) / kChunk);
  const int slot = blockIdx.x / nchunks, j = blockIdx.x % nchunks;
  const sbn_coop_rank_t& R = a.r[slot];
  const sbn_geo_t g = sbn_geo_make(R.n, a.c, R.spatial, TILE, 1, a.G); /* P does not depend on vec */
  publish_chunk<KIND, true>(a, R, g, j, 0u, sm);
}

/* Block (slot, src): rank src's records of this op into launch slot's gathered records. */
__global__ void __launch_bounds__(kThreads)
    sbn_host_gather_kernel(const __grid_constant__ sbn_coop_args_t a) {
  const int nchunks = (int)((a.c + kChunk - 1) / kChunk);
  const int slot = blockIdx.x / a.nranks, src = blockIdx.x % a.nranks;
  const uint32_t* from = reinterpret_cast<const uint32_t*>(a.mail[src]);
  uint32_t* to = reinterpret_cast<uint32_t*>(a.r[slot].mail + sbn_host_index(src, 0, a.nchunks_max));
  const int64_t words = (int64_t)nchunks * (int64_t)(sizeof(sbn_mail_rec_t) / 4);
  for (int64_t i = threadIdx.x; i < words; i += kThreads) to[i] = from[i];
}

template <int KIND, int DT, bool TILE, int VEC, int EPI>
__global__ void __launch_bounds__(kThreads, SBN_STREAM_BLOCKS_PER_SM)
    sbn_host_apply_kernel(const __grid_constant__ sbn_coop_args_t a) {
  SBN_SHARED(Smem, sm);
  const int slot = blockIdx.x / a.G, b = blockIdx.x % a.G;
  const sbn_coop_rank_t& R = a.r[slot];
  const sbn_geo_t g = sbn_geo_make(R.n, a.c, R.spatial, TILE, VEC, a.G);
  VecPath<KIND, DT, TILE, VEC, false, EPI> path;
  if (threadIdx.x == 0) {
    sm.nbt_before = (KIND == SBN_OP_FORWARD && R.nbt != nullptr) ? R.state->nbt_snap : 0;
    sm.coef_chunk = -1; /* finish_coefs: no chunk's coefficients yet */
  }
  /* queued behind a failure of the rank (or after sbnCommAbort, or the watchdog's abort
     of the collective a peer never joined): write nothing. The rank's stop word, device
     memory (coop_exchange.cuh, "failures"), which any failing rank of this process sets. */
  int seen = (threadIdx.x >> 5) == 0 ? start_words_lane(a, R) : 0;
  if (a.host_words_at_start) { /* peer-pinned-host: the failures of the other GPUs too */
    seen = __syncthreads_or(seen);
    if ((threadIdx.x >> 5) == 0) seen |= host_words_lane(a);
  }
  int st = __syncthreads_or(seen) ? sbnAborted : 0; /* block-uniform, as below */
  const int u0 = sbn_unit_begin(&g, b, a.G), u1 = sbn_unit_begin(&g, b + 1, a.G);
  for (int u = u0; st == 0 && u < u1; u++) {
    /* as the cooperative kernel's loop: no barrier between two units of one chunk */
    const bool same = u > u0 && coef_shared<TILE>(g, u - 1, u);
    st = finish_coefs<KIND, TILE, true>(a, R, g, u % g.ngroups, u / g.ngroups, 0u, 0u, sm, true,
                                        false, same, EPI == SBN_EPI_RECOVER ? sbn_dtype_unit(DT) : 0.0f);
    if (st != 0) break;
    int gb = 0;
    path.stage5_unit(R, g, u, &gb, nullptr, sm);
    if (!(u + 1 < u1 && coef_shared<TILE>(g, u, u + 1))) __syncthreads();
  }
  if (st != 0 && threadIdx.x == 0) record_error(a, R.rank, st); /* the one failure exit */
}

#endif /* SYNCBN_HOST_PATH_CUH_ */
