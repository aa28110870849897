/* coop_vec.cuh — stages 1 and 5 of the stream and onchip variants of the cooperative
 * kernel (and of the host-driven path's stats and apply kernels, which are the stream
 * variant's). Positions, batches and held batches are described in coop_plan.h.
 *
 * Stage 1 of a unit, per thread: its positions in batches of U (all U loads issued before
 * the first use). A forward batch gives, per channel, the two-pass statistics of its
 * values d = x - shift (shift: the thread's first element of the channel, then its running
 * mean whenever its count doubles: sbn_recentre): mean_b =
 * sum(d) / cnt, m2_b = sum((d - mean_b)^2), merged into the thread's running (count,
 * mean, m2) with Chan's formula: one division per batch, none per element. A backward
 * batch adds each element's dy and dy * (x - mean) (with its rounding errors:
 * sbn_grad_term) to the thread's compensated sums of its channels (bn_math.h: sbn_csum_t,
 * TwoSum per term; the partials stay (hi, lo) through every merge up to the ranks').
 * The threads' results are merged in a fixed tree (shuffles, then the warps in order)
 * into the unit's (slice, channel) partials: the forward's as (count, mean_hi, mean_lo,
 * m2), so that threads with different shifts merge exactly (sbn_partial_merge).
 * Products go through SBN_MUL (never contracted into an FMA): the stream and onchip
 * variants, the host path and the CPU emulation compute the same bits.
 *
 * Stage 5 of a unit: the same positions again, y (dx) from the unit's coefficients; the
 * onchip variant takes the values it held, the stream variant reads them again (L2
 * evict-first; its stage 1 asked L2 to keep them, evict-last). Nothing is asked of L2
 * ahead of the loads (bench/results/2026-11-26-h100-ad98116,
 * bench/notes/experiments.md, E21).
 */
#ifndef SYNCBN_COOP_VEC_CUH_
#define SYNCBN_COOP_VEC_CUH_

/* The positions of one batch: tile units, kv whole positions i0 + k * step (k < kv);
   plane units, U element indices and 8 mask bits each; plane units of whole vectors
   (WHOLE: spatial % VEC == 0, the onchip kernels' only plane units), U element indices
   of which the first kv are whole positions (what the general form says of them, with
   masks the compiler knows to be full or empty). */
template <bool TILE, int U, bool WHOLE> struct BatchPos;
template <int U, bool WHOLE> struct BatchPos<true, U, WHOLE> {
  int64_t i0, step;
  int kv;
  __device__ __forceinline__ int64_t idx(int k) const { return i0 + k * step; }
  __device__ __forceinline__ unsigned mask(int k, unsigned full) const { return k < kv ? full : 0u; }
  __device__ __forceinline__ bool empty() const { return kv == 0; }
  __device__ __forceinline__ bool all(uint64_t) const { return kv == U; }
};
/* 8 mask bits per position, in one register where they fit (U <= 4; the stream fp16
   plane forward is at its 128 registers: check-sass.sh) */
template <bool SMALL> struct MaskBits { typedef uint64_t T; };
template <> struct MaskBits<true> { typedef uint32_t T; };
template <int U> struct BatchPos<false, U, false> {
  typedef typename MaskBits<(U <= 4)>::T Mask;
  int64_t i[U];
  Mask mk;
  __device__ __forceinline__ int64_t idx(int k) const { return i[k]; }
  __device__ __forceinline__ unsigned mask(int k, unsigned) const {
    return (unsigned)(mk >> (8 * k)) & 0xffu;
  }
  __device__ __forceinline__ bool empty() const { return mk == 0; }
  __device__ __forceinline__ bool all(uint64_t full) const { return mk == full; }
};
template <int U> struct BatchPos<false, U, true> {
  int64_t i[U];
  int kv;
  __device__ __forceinline__ int64_t idx(int k) const { return i[k]; }
  __device__ __forceinline__ unsigned mask(int k, unsigned full) const { return k < kv ? full : 0u; }
  __device__ __forceinline__ bool empty() const { return kv == 0; }
  __device__ __forceinline__ bool all(uint64_t) const { return kv == U; }
};

/* ---- the positions of one thread in one unit ------------------------------------------- */
template <bool TILE, int VEC, bool WHOLE> struct Walker;

/* Tile units: rows r0 + w*VEC + lane/(32/VEC) + k*8*VEC of the thread's vector column. */
template <int VEC, bool WHOLE> struct Walker<true, VEC, WHOLE> {
  int64_t i, step, left, K;
  __device__ Walker(const sbn_geo_t& g, int grp, int64_t r0, int64_t r1) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    constexpr int vpg = kChunk / VEC;
    K = left = sbn_tile_positions(&g, grp, r0, r1, w, lane);
    i = (r0 + (int64_t)w * VEC + lane / vpg) * g.c + (int64_t)grp * kChunk + (lane % vpg) * VEC;
    step = (int64_t)sbn_tile_step(&g) * g.c;
  }
  template <int U> __device__ __forceinline__ void batch(BatchPos<true, U, WHOLE>& bp) {
    bp.i0 = i;
    bp.step = step;
    bp.kv = (int)(left < U ? left : U);
    left -= bp.kv;
    i += U * step;
  }
};

/* Plane units: entries t, t + 256, ... of the list of vectors overlapping the unit's
   plane pieces (coop_plan.h: sbn_plane_piece), each masked to its piece. When the planes
   are whole vectors (spatial % VEC == 0; slices start at multiples of VEC), entry j is
   row r0 + j*VEC and the walk keeps the position's element index and its offset in its
   plane incrementally: a few adds per position whatever the number of planes (no
   multiply: the (plane * C + channel) * spatial + offset of each position was ~25 of the
   ~37 instructions per position on an H100, ncu in bench/results/2026-11-26-h100-0083b00).
   Otherwise (odd spatial sizes, which the plan sends here only for planes of at least
   SBN_PLANE_VEC_MIN_SPATIAL elements, and only to the stream kernels) it steps over
   pieces. WHOLE: the planes are whole vectors, known at compile
   time (the onchip kernels): only the first walk is compiled. */
template <int VEC, bool WHOLE> struct Walker<false, VEC, WHOLE> {
  const sbn_geo_t* g;
  int64_t c, r0, r1;
  /* pieces: the plane nn, its elements [e0, e1), the vector v, its end vend. Aligned:
     the position's offset s in its plane and the step's ds (below sp); the position's
     element index at, what a step adds to it da (s not wrapping), and what a wrap of s
     adds besides, wrap = (C - 1) * sp. A walk is one or the other (`aligned`): the
     fields of the two share registers (anonymous unions; the fp16 plane kernels are at
     128 registers: check-sass.sh) */
  union { int64_t nn; int64_t at; };
  union { int64_t e0; int64_t da; };
  union { int64_t e1; int64_t wrap; };
  int64_t v, vend, s, ds;
  int left, K; /* the thread's positions, ceil(V / kThreads): device memory (< 2^38
                  bytes) holds < 2^37 elements of 2 bytes, so V < 2^37 and K < 2^29 */
  bool aligned;
  __device__ Walker(const sbn_geo_t& geo, int64_t ch, int64_t a0, int64_t a1)
      : g(&geo), c(ch), r0(a0), r1(a1), nn(0), e0(0), e1(0), v(0), vend(0), s(0), ds(0) {
    aligned = WHOLE || g->sp % VEC == 0;
    const int64_t V = aligned ? (r1 > r0 ? (r1 - r0) / VEC : 0) : sbn_plane_vectors(g, c, r0, r1);
    const int t = threadIdx.x;
    K = left = V > t ? (int)((V - t + kThreads - 1) / kThreads) : 0;
    if (K == 0) return;
    if (WHOLE || aligned) {
      const int64_t r = r0 + (int64_t)t * VEC, step = (int64_t)kThreads * VEC;
      const int64_t n0 = r / g->sp, dn = step / g->sp;
      s = r - n0 * g->sp;
      ds = step - dn * g->sp;
      at = (n0 * g->c + c) * g->sp + s;
      da = dn * g->c * g->sp + ds;
      wrap = (g->c - 1) * g->sp;
      return;
    }
    nn = r0 / g->sp;
    sbn_plane_piece(g, c, nn, r0, r1, &e0, &e1, &v, &vend);
    advance(t);
  }
  __device__ __forceinline__ void advance(int64_t d) {
    v += d;
    while (v >= vend) { /* into the next plane's piece, carrying what is left of d */
      const int64_t over = v - vend;
      if (!sbn_plane_piece(g, c, ++nn, r0, r1, &e0, &e1, &v, &vend)) return;
      v += over;
    }
  }
  __device__ __forceinline__ unsigned next(int64_t* idx) {
    if (WHOLE || aligned) {
      /* no branch: past the thread's last position the walk goes on all the same (its
         positions are masked off, and the walk ends with the unit); a branch here made
         the compiler copy the walk's state at every position (sm_90 SASS, 10783ac). Such
         an index may lie past the tensor: every access tests the mask before it forms
         an address (load_pos, store_pos, copy_to_smem), and so must anything added
         (a prefetch, a zero-filling cp.async) */
      *idx = at;
      const unsigned m = left > 0 ? (1u << VEC) - 1u : 0u;
      left--;
      s += ds;
      at += da;
      if (s >= g->sp) { /* into the next plane: sp - ds further on, (C - 1) planes on */
        s -= g->sp;
        at += wrap;
      }
      return m;
    }
    const int64_t s0 = v * VEC;
    *idx = s0;
    if (left <= 0) return 0u;
    left--;
    const int lo = (int)(e0 - s0 > 0 ? e0 - s0 : 0), hi = (int)(e1 - s0 < VEC ? e1 - s0 : VEC);
    if (left > 0) advance(kThreads);
    return ((1u << hi) - 1u) & ~((1u << lo) - 1u);
  }
  template <int U> __device__ __forceinline__ void batch(BatchPos<false, U, false>& bp) {
    bp.mk = 0;
    SBN_UNROLL
    for (int k = 0; k < U; k++)
      bp.mk |= (typename BatchPos<false, U, false>::Mask)next(&bp.i[k]) << (8 * k);
  }
  template <int U> __device__ __forceinline__ void batch(BatchPos<false, U, true>& bp) {
    const int64_t kv = left < U ? (left > 0 ? left : 0) : U; /* (left < 0 only past the
                                                                 unit's last batch) */
    SBN_UNROLL
    for (int k = 0; k < U; k++) (void)next(&bp.i[k]);
    bp.kv = (int)kv;
  }
};

/* ---- per-thread accumulators ----------------------------------------------------------- */
template <int NCH> struct FwdAcc {
  float count;      /* values merged so far (the same for every channel of the thread) */
  float shift[NCH]; /* the thread's first value of each channel, then its running mean
                       whenever count doubles (sbn_recentre) */
  float mean[NCH];  /* of x - shift */
  float m2[NCH];
};
template <int NCH> struct BwdAcc {
  float mean[NCH]; /* save_mean of each channel */
  sbn_csum_t sdy[NCH];
  sbn_csum_t sdx[NCH]; /* sum dy * (x - mean) */
};

/* The epilogue of a thread's channels (the EPI kernels): the activation, and for the
   in-place backward what x - mean is recovered with, sbn_xmu_from_y's inv_slope, bias
   and rcp. */
template <int NCH> struct EpiCoef {
  int act;
  float slope, inv_slope;
  float bias[NCH], rcp[NCH]; /* the in-place backward's (kRecover); bias the mask from x's too */
  float scale[NCH], mean[NCH]; /* the mask from x's (kXmask): weight * invstd, save_mean */
};

/* Chan's merge of a batch (mean_b, m2_b) into channel e of the thread's running
   statistics; wb = cnt / (count + cnt). sbn_welford_merge's arithmetic. */
template <int NCH>
__device__ __forceinline__ void fwd_merge(FwdAcc<NCH>& A, int e, float mb, float qb, float wb) {
  if (A.count == 0.0f) {
    A.mean[e] = mb;
    A.m2[e] = qb;
  } else {
    const float delta = mb - A.mean[e];
    A.mean[e] = A.mean[e] + SBN_MUL(delta, wb);
    A.m2[e] = A.m2[e] + qb + SBN_MUL(SBN_MUL(SBN_MUL(delta, delta), A.count), wb);
  }
}

/* nb more values merged into the thread's statistics: its count, and where the count
   passed a power of two, each channel's shift re-centred on its running mean
   (sbn_recentre: the same value). */
template <int NCH>
__device__ __forceinline__ void fwd_count(FwdAcc<NCH>& A, float nb) {
  const float before = A.count;
  A.count += nb;
  if (sbn_count_doubled(before, A.count) && !SBN_MUTANT(SBN_MUT_NO_RECENTRE)) {
SBN_UNROLL
    for (int e = 0; e < NCH; e++) sbn_recentre(&A.shift[e], &A.mean[e]);
  }
}

/* ---- the data path of one variant ------------------------------------------------------ */
/* EPI: 0 the plain ops; 1 the epilogue (SBN_EPI_ACT: an activation, z, dz); 2 the in-place
   backward (SBN_EPI_RECOVER: x - mean recovered from y, which the kernel reads in x's
   place, and from z where the forward had one: load_y). A kernel of each, so that each
   keeps only the registers it needs. */
template <int KIND, int DT, bool TILE, int VEC, bool ONCHIP, int EPI = SBN_EPI_NONE>
struct VecPath {
  static constexpr int U = KIND == SBN_OP_FORWARD ? SBN_BATCH_FWD : SBN_BATCH_BWD;
  static constexpr int NV = KIND == SBN_OP_FORWARD ? 1 : 2; /* x; x and dy */
  static constexpr int NBR = ONCHIP ? SBN_HOLD_REG_BATCHES(DT, TILE) : 1;
  static constexpr int NCH = TILE ? VEC : 1; /* channels of a thread */
  static constexpr unsigned kFull = (1u << VEC) - 1u;
  /* onchip plane units: planes of whole vectors only (the plan sends odd spatial sizes to
     the stream kernels), so that only the O(1) walk and whole-vector batches are compiled:
     the other walk was half the onchip kernels' code (check-sass.sh) */
  static constexpr bool WHOLE = ONCHIP;
  /* every position whole or empty: tile units (C a multiple of VEC), WHOLE planes */
  static constexpr bool kWholePos = TILE || WHOLE;
  typedef BatchPos<TILE, U, WHOLE> Pos;
  typedef Walker<TILE, VEC, WHOLE> Walk;
  typedef uint4 Batch[U][NV];
  /* the backward of the EPI kernels (the gradient reaching the normalization is act'(y)
     dy: grad_at), and of the in-place backward's (y in slot 0) */
  static constexpr bool kBwdEpi = EPI != SBN_EPI_NONE && KIND == SBN_OP_BACKWARD;
  static constexpr bool kRecover = EPI == SBN_EPI_RECOVER && KIND == SBN_OP_BACKWARD;
  static constexpr bool kFwdEpi = EPI != SBN_EPI_NONE && KIND == SBN_OP_FORWARD;
  /* the backward's mask from x (R.xmask; load_y). The kernels of one channel a thread
     (plane units, and the scalar tile kernels) hold its scale, bias and mean in 3
     registers (EpiCoef). The 16-byte tile kernels (kXmaskTile) would need 24 for their 4
     or 8 channels, beside backwards at 127-128 registers (check-sass.sh): they take each
     channel's scale and bias from shared memory (Smem.xm, the unit's chunk: stage 1
     writes it per unit, set_coefs with the chunk's coefficients for stage 5) and its mean
     from what the stage holds anyway (stage 1: BwdAcc.mean; stage 5: the coefficients) */
  static constexpr bool kXmask = kBwdEpi && !kRecover;
  static constexpr bool kXmaskTile = kXmask && NCH > 1;
  /* the in-place backward's stage 5 in the tile kernels (4 or 8 channels a thread): each
     channel's coefficients, and its recovery's bias and factor, read from shared memory
     for each batch (sm.coef, sm.xm: set_coefs), not held in registers across the unit:
     with a residual's z the fp16/bf16 16-byte stream kernels held 24-28 bytes past their
     128 registers (check-sass.sh) */
  static constexpr bool kRecoverSmem = kRecover && NCH > 1;
  /* the in-place backward's stage 5 a position at a time (each position's dx and dz stored
     before the next one's are computed) in the 16-byte bf16 plane kernels, the batch at
     once elsewhere: whichever keeps the kernel within its registers with a residual's z
     (sm_90, CUDA 13.0, spill bytes, position / batch: plane bf16 0 / 20, fp16 4 / 0, fp32
     0 / 0; the tile kernels 0 / 0 with kRecoverSmem) */
  static constexpr bool kRecoverByPos = kRecover && NCH == 1 && DT == sbnBFloat16;
  /* the stream forward's stage 5 of a ReLU or leaky ReLU without z, in whole batches with
     the activation known at compile time (stage5_unit; which of the two, a flag uniform
     over the launch), where a second copy of the stage-5 loop fits: not in the 16-byte
     fp16/bf16 plane kernels (VEC 8), which it takes from 7352 to 8696 instructions
     (check-sass.sh's bound: 8192) with a 24-byte spill */
  static constexpr bool kReluBatches = kFwdEpi && !ONCHIP && (TILE || VEC <= 4);
  /* and of a ReLU with z, in batches of x and z with the ReLU compiled in (stage5_fwd_epi_stream's
     MODE 2): a third copy of the loop, in the tile kernels only. In the fp32 plane kernels
     (VEC 4) it took the stream forward from 7472 instructions to 8584 and a 16-byte spill
     with H = 4, 8280 with H = 3, 8080 with H = 2 (the batch of MODE 0: no gain on the tile
     kernels, bench/notes/fused-epilogue.md); they take MODE 0 in larger batches instead */
  static constexpr bool kReluZ = kFwdEpi && !ONCHIP && TILE;
  /* leaky ReLU with z in MODE 2 too, where its slope fits: the tile kernels below VEC 8,
     fp32's (VEC 4) and every dtype's scalar ones (VEC 1). In the 16-byte fp16/bf16 ones
     (VEC 8, at 128 registers) the slope and the select spill 20 bytes (sm_90, CUDA 13.0):
     leaky ReLU with z takes MODE 0 there. (MODE 1 and 2 are ReLU's and leaky ReLU's only:
     ACTK 2 computes ReLU for any other act, and the dispatch sends no other there.) */
  static constexpr bool kReluZLeaky = kReluZ && VEC < 8;

#ifdef SBN_COOP_EMU
  /* the emulation's C++: turn_hold moves slots a thread never loaded (fewer than NBR
     batches); on the GPU a register move, in C++ a read of an indeterminate value */
  Batch hold[NBR] = {};
#else
  Batch hold[NBR]; /* onchip: the thread's first NBR batches (over the block's units) */
#endif

  static __device__ __forceinline__ uint64_t full_mask() {
    uint64_t m = 0;
SBN_UNROLL
    for (int k = 0; k < U; k++) m |= (uint64_t)kFull << (8 * k);
    return m;
  }

  /* Unit u: group (tile) or channel (plane), slice, rows. */
  static __device__ __forceinline__ void unit_rows(const sbn_geo_t& g, int u, int* grp, int* p,
                                                   int64_t* r0, int64_t* r1) {
    *grp = u % g.ngroups;
    *p = u / g.ngroups;
    sbn_geo_slice(&g, *p, r0, r1);
  }

  /* A batch of U whole positions (every batch but a thread's last of a unit, where its
     planes are whole vectors) takes plain 16-byte accesses, without a test of each
     position's mask (~7 instructions a position: sm_90 SASS, d560f07); the others go
     position by position (whole, partial or empty). The backward's second tensor is read
     from dyp with L2 policy pol_dy: R.dy, or R.dz in stage 5 of a backward that wrote dz
     first (dz_first, whose stage 1 reads dy with evict_first: stage 5 reads dz instead). */
  static __device__ __forceinline__ void load_batch(const sbn_coop_rank_t& R, const Pos& bp, Batch& bt,
                                                    uint64_t pol, const void* dyp, uint64_t pol_dy) {
    if (!kWholePos && VEC > 1 && bp.all(full_mask())) {
SBN_UNROLL
      for (int k = 0; k < U; k++) {
        bt[k][0] = load_pos<DT, VEC, true>(R.x, bp.idx(k), kFull, pol);
        if (NV == 2) bt[k][NV - 1] = load_pos<DT, VEC, true>(dyp, bp.idx(k), kFull, pol_dy);
      }
    } else {
SBN_UNROLL
      for (int k = 0; k < U; k++) {
        bt[k][0] = load_pos<DT, VEC, kWholePos>(R.x, bp.idx(k), bp.mask(k, kFull), pol);
        if (NV == 2) bt[k][NV - 1] = load_pos<DT, VEC, kWholePos>(dyp, bp.idx(k), bp.mask(k, kFull), pol_dy);
      }
    }
  }
  /* The backward's epilogue: y's batch (the activation's mask) where the kernel reads it
     besides x and dy (an activation, x given), in stage 1 and again in stage 5 (the
     onchip kernels hold x and dy only); false: no y, or y is the batch's slot 0 (the
     in-place backward, which reads z's batch here where the forward had a residual:
     true then, yb holding z). mean, xm: the mask from x's in the 16-byte tile kernels
     (kXmaskTile): the thread's channels' saved means, and their (scale, bias) in shared
     memory (sm.xm from the thread's first channel's slot). */
  static __device__ __forceinline__ bool load_y(const sbn_coop_rank_t& R, const Pos& bp, const Batch& bt,
                                                const EpiCoef<NCH>& ep, uint4 (&yb)[U], uint64_t pol,
                                                const float (&mean)[NCH], const float (*xm)[2]) {
    if constexpr (kBwdEpi && !kRecover) {
      if (R.act == SBN_ACT_IDENTITY) return false;
      if constexpr (kXmaskTile) {
        if (R.xmask) {
          /* as below, a channel (element e) at a time: its scale and bias read from shared
             memory once for the batch's U positions, none held across batches (volatile:
             loads hoisted out of the batch loop put the fp16/bf16 stream backwards past
             128 registers, 8 B of stack: check-sass) */
          const float floor = sbn_xmask_floor(sbn_dtype_least(DT));
          unsigned unsure = 0u;
SBN_UNROLL
          for (int k = 0; k < U; k++) yb[k] = bt[k][0];
SBN_UNROLL
          for (int e = 0; e < VEC; e++) {
            const float s = *(volatile const float*)&xm[e][0], b = *(volatile const float*)&xm[e][1];
SBN_UNROLL
            for (int k = 0; k < U; k++) {
              const int sg = sbn_xmask_sign(elem_get<DT, VEC>(bt[k][0], e) - mean[e], s, b, mean[e], floor);
              unsure |= (sg == 0 ? bp.mask(k, kFull) >> e & 1u : 0u) << k;
              elem_set<DT, VEC>(yb[k], e, sg > 0 ? 1.0f : -1.0f);
            }
          }
SBN_UNROLL
          for (int k = 0; k < U; k++)
            if (!SBN_MUTANT(SBN_MUT_XMASK_NO_BAND) && (unsure >> k & 1u))
              yb[k] = load_pos<DT, VEC, kWholePos>(R.y, bp.idx(k), bp.mask(k, kFull), pol);
          return true;
        }
      } else if constexpr (kXmask) {
        if (R.xmask) {
          /* the mask from x (bn_math.h: sbn_xmask_sign): a position's y is the rule's sign
             (+-1, what grad_at needs of it) where the rule is sure of every element, and
             is read where it is not */
          const float floor = sbn_xmask_floor(sbn_dtype_least(DT));
SBN_UNROLL
          for (int k = 0; k < U; k++) {
            const unsigned m = bp.mask(k, kFull);
            uint4 ys = bt[k][0];
            bool sure = true;
SBN_UNROLL
            for (int e = 0; e < VEC; e++) {
              const int sg = sbn_xmask_sign(elem_get<DT, VEC>(bt[k][0], e) - ep.mean[0], ep.scale[0], ep.bias[0],
                                            ep.mean[0], floor);
              sure &= sg != 0 || !(m >> e & 1u);
              elem_set<DT, VEC>(ys, e, sg > 0 ? 1.0f : -1.0f);
            }
            yb[k] = SBN_MUTANT(SBN_MUT_XMASK_NO_BAND) || sure ? ys : load_pos<DT, VEC, kWholePos>(R.y, bp.idx(k), m, pol);
          }
          return true;
        }
      }
SBN_UNROLL
      for (int k = 0; k < U; k++) yb[k] = load_pos<DT, VEC, kWholePos>(R.y, bp.idx(k), bp.mask(k, kFull), pol);
      return true;
    } else if constexpr (kRecover) {
      /* the in-place backward of a forward with a residual (sbnBackwardInPlaceEx): z's
         batch, which the recovery subtracts (sbn_xmu_from_y); the mask is slot 0's y */
      if (R.z == nullptr || SBN_MUTANT(SBN_MUT_RECOVER_NO_Z)) return false;
SBN_UNROLL
      for (int k = 0; k < U; k++) yb[k] = load_pos<DT, VEC, kWholePos>(R.z, bp.idx(k), bp.mask(k, kFull), pol);
      return true;
    } else {
      return false;
    }
  }
  /* The gradient reaching the normalization at element e of position k: dy, or (EPI)
     act'(y) dy in fp32 as the CPU team computes it (y from yb, or the batch's slot 0). */
  template <int UB>
  static __device__ __forceinline__ float grad_at(const uint4 (&bt)[UB][NV], int k, int e, const EpiCoef<NCH>& ep,
                                                  const uint4 (&yb)[UB], bool has_y) {
    const float dy = elem_get<DT, VEC>(bt[k][NV - 1], e);
    if constexpr (!kBwdEpi) return dy;
    if (ep.act == SBN_ACT_IDENTITY) return dy;
    /* the element chosen, not the vector: a select of the two arrays by has_y put both in
       local memory (64 B of stack in the fp32 kernels with the mask from x: check-sass) */
    const float yv = !kRecover && has_y ? elem_get<DT, VEC>(yb[k], e) : elem_get<DT, VEC>(bt[k][0], e);
    return sbn_act_grad(ep.act, ep.slope, yv, dy);
  }
  /* The stream backward with an activation and dz, where dz holds the gradient g =
     act'(y) dy exactly (ReLU: dy or 0, a value of the dtype; any activation in fp32):
     stage 1, which reads x, dy and y, writes g to dz and sums it; stage 5 reads x and dz
     as the plain backward reads x and dy, and computes dx from them. 7|x| of bytes, not 8
     (stage 5 reads neither dy nor y), and the same bits: the g that stage 5 reads is the
     g it computed. Only where no kernel can refuse the op after stage 1 (R.dz_early: the
     host compared every rank's op), since a refused op writes nothing, and where dz is a
     buffer of its own: over x it would change the x that stage 5 reads, and over y or dy
     an op that fails after stage 1 (a timeout, an abort) would leave its inputs changed.
     Not in the onchip kernels (they read x and dy once) or the in-place backward (no
     dz). */
  static __device__ __forceinline__ bool dz_first(const sbn_coop_rank_t& R) {
    if constexpr (kBwdEpi && !kRecover && !ONCHIP)
      return R.dz_early && R.dz != nullptr && R.dz != R.x && R.dz != R.y && R.dz != R.dy &&
             !SBN_MUTANT(SBN_MUT_DZ_LATE) &&
             (R.act == SBN_ACT_RELU || (Dt<DT>::kSize == 4 && R.act != SBN_ACT_IDENTITY));
    else
      return false;
  }
  /* The coefficients of the gradient that the batch's dy slot holds: ep's, or (dz_first)
     identity's, the slot then holding g itself. Set only in the EPI backward (ep is unset
     elsewhere). */
  static __device__ __forceinline__ void grad_coef(const EpiCoef<NCH>& ep, bool dzf, EpiCoef<NCH>& eg) {
    if constexpr (kBwdEpi) {
      eg = ep;
      if (dzf) eg.act = SBN_ACT_IDENTITY;
    }
  }
  static __device__ __forceinline__ void store_batch(const sbn_coop_rank_t& R, const Pos& bp,
                                                     const Batch& bt) {
    if (!kWholePos && VEC > 1 && bp.all(full_mask())) {
SBN_UNROLL
      for (int k = 0; k < U; k++) store_pos<DT, VEC, true>(R.out, bp.idx(k), kFull, bt[k][0]);
      return;
    }
SBN_UNROLL
    for (int k = 0; k < U; k++)
      store_pos<DT, VEC, kWholePos>(R.out, bp.idx(k), bp.mask(k, kFull), bt[k][0]);
  }

  /* ---- held batches in shared memory (onchip) ---- */
  static __device__ __forceinline__ uint4* smem_at(uint4* hs, int slot, int k, int nv) {
    return hs + ((int64_t)(slot * U + k) * NV + nv) * kThreads + threadIdx.x;
  }
  static __device__ __forceinline__ void copy_to_smem(const sbn_coop_rank_t& R, const Pos& bp,
                                                      uint4* hs, int slot, uint64_t pol) {
SBN_UNROLL
    for (int k = 0; k < U; k++) {
      const unsigned m = bp.mask(k, kFull);
      if (m == 0u) continue;
SBN_UNROLL
      for (int nv = 0; nv < NV; nv++) {
        const void* src = nv == 0 ? R.x : R.dy;
        if (kWholePos || m == kFull)
          cp_async16(smem_at(hs, slot, k, nv),
                     static_cast<const char*>(src) + bp.idx(k) * Dt<DT>::kSize, pol);
        else /* a position at an unaligned plane end: element by element */
          *smem_at(hs, slot, k, nv) = load_pos<DT, VEC, kWholePos>(src, bp.idx(k), m, pol);
      }
    }
  }
  static __device__ __forceinline__ void read_smem(uint4* hs, int slot, Batch& bt) {
SBN_UNROLL
    for (int k = 0; k < U; k++)
SBN_UNROLL
      for (int nv = 0; nv < NV; nv++) bt[k][nv] = *smem_at(hs, slot, k, nv);
  }
  /* Onchip: the held batches turned one place through t (t gets hold[0], every other
     moves down one, hold[NBR - 1] gets t's copy): the thread's next held batch is always
     in hold[0], and NBR turns give back the first order. A turn is 16 * NBR register
     moves; it lets one copy of a batch's arithmetic serve every held batch (compiled once
     per held batch before, 7x the code: code size is time on small ops, check-sass.sh). */
  __device__ __forceinline__ void turn_hold(Batch& t) {
SBN_UNROLL
    for (int k = 0; k < U; k++)
SBN_UNROLL
      for (int nv = 0; nv < NV; nv++) {
        t[k][nv] = hold[0][k][nv];
SBN_UNROLL
        for (int s = 0; s + 1 < NBR; s++) hold[s][k][nv] = hold[s + 1][k][nv];
        hold[NBR - 1][k][nv] = t[k][nv];
      }
  }
  /* The nb batches of a unit in order, f(batch, positions): onchip, the thread's first
     NBR batches over the block's units (counted by *gb) from registers (turn_hold), the
     others from shared memory slot *gb - NBR; stream, each read now with L2 policy pol.
     Stage 1 and stage 5 visit the same batches in the same order through here; one copy
     of f. No L2 prefetch: the kernels that asked L2 for the block's batches ahead took up
     to 1.22x the time of these on the H100 (bench/results/2026-11-26-h100-ad98116). dyp,
     pol_dy: load_batch's. */
  template <typename F>
  __device__ __forceinline__ void each_batch(const sbn_coop_rank_t& R, Walk& wk, int nb, int* gb, uint4* hs,
                                             uint64_t pol, const void* dyp, uint64_t pol_dy, F f) {
    int bt = 0;
    if (ONCHIP && SBN_MUTANT(SBN_MUT_HELD_COPIES)) {
SBN_UNROLL
      for (int s = 0; s < NBR; s++)
        if (*gb == s && bt < nb) {
          Pos bp;
          wk.batch(bp);
          f(hold[s], bp);
          bt++, (*gb)++;
        }
    }
    for (; bt < nb; bt++) {
      Pos bp;
      wk.batch(bp);
      Batch cur;
      if (ONCHIP) {
        if (*gb < NBR)
          turn_hold(cur);
        else
          read_smem(hs, *gb - NBR, cur);
        (*gb)++;
      } else {
        load_batch(R, bp, cur, pol, dyp, pol_dy);
      }
      f(cur, bp);
    }
  }

  /* ---- batch statistics ---- */
  static __device__ __forceinline__ void fwd_batch(FwdAcc<NCH>& A, const Batch& bt, const Pos& bp) {
    if (bp.empty()) return;
    if constexpr (TILE) { /* whole positions: the first kv are valid */
      const int kv = bp.kv;
      if (A.count == 0.0f) {
SBN_UNROLL
        for (int e = 0; e < NCH; e++) A.shift[e] = elem_get<DT, VEC>(bt[0][0], e);
      }
      const float nb = (float)kv, wb = nb / (A.count + nb);
SBN_UNROLL
      for (int e = 0; e < NCH; e++) {
        float s = 0.0f;
SBN_UNROLL
        for (int k = 0; k < U; k++)
          if (k < kv) s += elem_get<DT, VEC>(bt[k][0], e) - A.shift[e];
        const float mb = kv == U ? SBN_MUL(s, 1.0f / U) : s / nb;
        float q = 0.0f;
SBN_UNROLL
        for (int k = 0; k < U; k++)
          if (k < kv) {
            const float d = (elem_get<DT, VEC>(bt[k][0], e) - A.shift[e]) - mb;
            q += SBN_MUL(d, d);
          }
        fwd_merge(A, e, mb, q, wb);
      }
      fwd_count(A, nb);
    } else { /* one channel; the batch's elements in (position, element) order */
      if (A.count == 0.0f) { /* a thread's first position has an element */
        const unsigned m0 = WHOLE ? kFull : bp.mask(0, kFull);
        int e0 = 0;
        while (!(m0 >> e0 & 1u)) e0++;
        A.shift[0] = elem_get<DT, VEC>(bt[0][0], e0);
      }
      const float sh = A.shift[0];
      float s = 0.0f, q = 0.0f, nb;
      if (bp.all(full_mask())) {
        nb = (float)(U * VEC);
SBN_UNROLL
        for (int k = 0; k < U; k++)
SBN_UNROLL
          for (int e = 0; e < VEC; e++) s += elem_get<DT, VEC>(bt[k][0], e) - sh;
        const float mb = SBN_MUL(s, 1.0f / (U * VEC));
SBN_UNROLL
        for (int k = 0; k < U; k++)
SBN_UNROLL
          for (int e = 0; e < VEC; e++) {
            const float d = (elem_get<DT, VEC>(bt[k][0], e) - sh) - mb;
            q += SBN_MUL(d, d);
          }
        fwd_merge(A, 0, mb, q, nb / (A.count + nb));
      } else {
        int cnt = 0;
SBN_UNROLL
        for (int k = 0; k < U; k++)
SBN_UNROLL
          for (int e = 0; e < VEC; e++)
            if (bp.mask(k, kFull) >> e & 1u) {
              s += elem_get<DT, VEC>(bt[k][0], e) - sh;
              cnt++;
            }
        nb = (float)cnt;
        const float mb = s / nb;
SBN_UNROLL
        for (int k = 0; k < U; k++)
SBN_UNROLL
          for (int e = 0; e < VEC; e++)
            if (bp.mask(k, kFull) >> e & 1u) {
              const float d = (elem_get<DT, VEC>(bt[k][0], e) - sh) - mb;
              q += SBN_MUL(d, d);
            }
        fwd_merge(A, 0, mb, q, nb / (A.count + nb));
      }
      fwd_count(A, nb);
    }
  }

  static __device__ __forceinline__ void bwd_batch(BwdAcc<NCH>& A, const Batch& bt, const Pos& bp,
                                                   const EpiCoef<NCH>& ep, const uint4 (&yb)[U], bool has_y) {
    if (bp.empty()) return;
SBN_UNROLL
    for (int ch = 0; ch < NCH; ch++) {
SBN_UNROLL
      for (int k = 0; k < U; k++)
SBN_UNROLL
        for (int e = 0; e < VEC; e++) {
          if (TILE && e != ch) continue; /* tile: element e is channel e */
          if (!(bp.mask(k, kFull) >> e & 1u)) continue;
          const float dy = grad_at(bt, k, e, ep, yb, has_y);
          float err, t;
          if (kRecover)
            t = sbn_grad_term_xmu(dy,
                                  sbn_xmu_from_y(ep.act, ep.inv_slope, elem_get<DT, VEC>(bt[k][0], e),
                                                  has_y ? elem_get<DT, VEC>(yb[k], e) : 0.0f, ep.bias[ch], ep.rcp[ch]),
                                  &err);
          else
            t = sbn_grad_term(dy, elem_get<DT, VEC>(bt[k][0], e), A.mean[ch], &err);
          sbn_csum_add(&A.sdy[ch], dy);
          sbn_csum_add2(&A.sdx[ch], t, err);
        }
    }
  }

  /* ---- a unit's partials: the threads merged in a fixed tree ---- */
  /* pt[e]: the thread's partial of its channel e. Tile units: the threads of a vector
     column (rows of the warp's step) by shuffles, then the warps in order; plane units:
     the warp by shuffles, then the warps in order. Into the (slice p, channel) entries. */
  static __device__ void reduce_unit(const sbn_coop_rank_t& R, const sbn_geo_t& g, int grp, int p,
                                     typename Part<KIND>::T (&pt)[NCH], Smem& sm, int slot) {
    typedef Part<KIND> P;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    if constexpr (TILE) {
      constexpr int vpg = kChunk / VEC;
      const int ro = lane / vpg; /* the thread's row within its warp's step */
      /* The rows' tree: at level `off` (VEC/2, ..., 1) rows ro and ro + off merge, the
         lower row first. Each level halves the channels a thread carries (a butterfly):
         the thread of the pair whose row has bit `off` clear keeps the lower half of its
         channels and gives the upper half to its partner, which keeps the upper half.
         After the levels, the thread of row ro holds channel ro of its vector column,
         merged over the VEC rows in the tree's order (the bits of a shuffle-down tree
         that merged every channel at row 0: 2 - 2/VEC of the merges, VEC/2 - ... code). */
      int h = NCH; /* the channels the thread carries: pt[0, h) */
SBN_UNROLL
      for (int off = VEC / 2; off >= 1; off /= 2) {
        h /= 2;
        const bool up = (ro & off) != 0; /* the upper row of its pair: keeps the upper half */
SBN_UNROLL
        for (int e = 0; e < NCH / 2; e++) {
          if (e >= h) break;
          const typename P::T give = up ? pt[e] : pt[e + h];
          const typename P::T keep = up ? pt[e + h] : pt[e];
          const typename P::T got = P::shfl_xor(give, off * vpg);
          pt[e] = up ? P::merge(got, keep) : P::merge(keep, got);
        }
      }
      P::red(sm)[w][(lane % vpg) * VEC + ro] = pt[0];
      __syncthreads();
      const int64_t c = (int64_t)grp * kChunk + lane;
      if (w == 0 && c < g.c) {
        typename P::T t = P::red(sm)[0][lane];
SBN_UNROLL
        for (int q = 1; q < kWarps; q++) t = P::merge(t, P::red(sm)[q][lane]);
        P::put(part_entry(R, g, p, c), t);
      }
      __syncthreads();
    } else { /* the warp's partial into the unit's pending slot; the warps' merge waits
                for flush_planes (no barrier per unit) */
      typename P::T t = pt[0];
SBN_UNROLL
      for (int off = 16; off > 0; off >>= 1) t = P::merge(t, P::shfl_down(t, off));
      if (lane == 0) P::red(sm)[w][slot] = t;
    }
  }

  /* Plane units: the n pending units from u (slot v % kChunk of sm.red for unit v; n <=
     kChunk, within one run of kChunk slots), each
     merged over the warps in order (the bits of a merge per unit) by lane q of warp 0 and
     stored. One barrier before (every warp's partial is in), one after (sm.red is free
     again): two per kChunk units where reduce_unit had two per unit, each a wait for the
     block's slowest warp with no load in flight (ncu, S5 fp32 NCHW forward on an H100:
     10.7 % of the stall samples in the per-unit barriers; bench/notes/experiments.md, E27). */
  static __device__ void flush_planes(const sbn_coop_rank_t& R, const sbn_geo_t& g, int u, int n,
                                      Smem& sm) {
    typedef Part<KIND> P;
    __syncthreads();
    const int lane = threadIdx.x & 31;
    if ((threadIdx.x >> 5) == 0 && lane < n) {
      const int v = u + lane, grp = v % g.ngroups, p = v / g.ngroups; /* as unit_rows */
      const int q = v % kChunk;
      typename P::T t = P::red(sm)[0][q];
SBN_UNROLL
      for (int w = 1; w < kWarps; w++) t = P::merge(t, P::red(sm)[w][q]);
      P::put(part_entry(R, g, p, grp), t);
    }
    __syncthreads();
  }

  /* The thread's channel ch of unit group grp (tile: its vector column's; plane: grp). */
  static __device__ __forceinline__ int64_t thread_channel(int grp, int ch) {
    return TILE ? (int64_t)grp * kChunk + (threadIdx.x & 31) % (kChunk / VEC) * VEC + ch : (int64_t)grp;
  }
  /* Channel c's scale (sbn_scale of the saved invstd, as the forward's and the backward's
     coefficients) and bias, which the mask from x takes (bn_math.h: sbn_xmask_sign): into
     EpiCoef's registers (one channel a thread) or sm.xm (xm_fill); 0 and nothing read where
     `in` is false. */
  static __device__ __forceinline__ void xm_coef(const sbn_coop_rank_t& R, int64_t c, bool in, float* scale,
                                                 float* bias) {
    *scale = in ? sbn_scale(R.weight != nullptr ? R.weight[c] : 1.0f, R.save_invstd[c]) : 0.0f;
    *bias = in && R.bias != nullptr ? R.bias[c] : 0.0f;
  }
  /* The epilogue of the thread's channels (EPI kernels); `has`: the thread has positions
     in the unit (else its channels may lie past C, and nothing is read). */
  static __device__ __forceinline__ void epi_coef(const sbn_coop_rank_t& R, const sbn_geo_t& g, int grp,
                                                  bool has, EpiCoef<NCH>& ep) {
    ep.act = R.act;
    ep.slope = R.slope;
    ep.inv_slope = sbn_inv_slope(R.act, R.slope);
    if constexpr (kXmask && NCH == 1) {
      const int64_t c = thread_channel(grp, 0);
      const bool in = has && R.xmask && c < g.c;
      xm_coef(R, c, in, &ep.scale[0], &ep.bias[0]);
      ep.mean[0] = in ? R.save_mean_in[c] : 0.0f;
    }
    if constexpr (kRecover) {
SBN_UNROLL
      for (int ch = 0; ch < NCH; ch++) {
        const int64_t c = thread_channel(grp, ch);
        const bool in = has && c < g.c;
        ep.bias[ch] = in && R.bias != nullptr ? R.bias[c] : 0.0f;
        ep.rcp[ch] = sbn_recover_rcp(in && R.weight != nullptr ? R.weight[c] : 1.0f, ep.bias[ch], sbn_dtype_unit(DT),
                                     SBN_RECOVER_MIN_WEIGHT, in ? R.save_invstd[c] : 1.0f);
      }
    }
  }

  /* The 16-byte tile kernels' mask from x (kXmaskTile): warp 0 writes the (scale, bias) of
     group grp's 32 channels into sm.xm (load_y reads them), where the op takes the mask
     from x; the caller's barrier makes them seen. xm_first: unit u0's (a block with units),
     by a kernel before a barrier it has anyway, so that the block's first unit, most often
     its only one, waits for no round trip of its own before its loads (stats_unit's
     xm_ready). */
  static __device__ __forceinline__ void xm_fill(const sbn_coop_rank_t& R, const sbn_geo_t& g, int grp, Smem& sm) {
    const int64_t c = (int64_t)grp * kChunk + threadIdx.x;
    if (threadIdx.x < kChunk && c < g.c) xm_coef(R, c, true, &sm.xm[threadIdx.x][0], &sm.xm[threadIdx.x][1]);
  }
  static __device__ __forceinline__ void xm_first(const sbn_coop_rank_t& R, const sbn_geo_t& g, int u0, int u1,
                                                  Smem& sm) {
    if constexpr (kXmaskTile) {
      if (R.xmask && u0 < u1) xm_fill(R, g, u0 % g.ngroups, sm); /* unit_rows' group */
    }
  }

  /* ---- stage 1 ---- */
  /* Unit u's statistics from its batches: held (onchip: the first NBR of the thread's
     batches, counted by gb over the block's units, in registers, the others in shared
     memory slot gb - NBR) or read now (stream: L2 asked to keep them for stage 5). */
  __device__ void stats_unit(const sbn_coop_rank_t& R, const sbn_geo_t& g, int u, int* gb,
                             uint4* hs, Smem& sm, bool xm_ready = false) {
    int grp, p;
    int64_t r0, r1;
    unit_rows(g, u, &grp, &p, &r0, &r1);
    Walk wk(g, grp, r0, r1);
    const int nb = (int)((wk.K + U - 1) / U);
    /* stream: stage 1 asks L2 to keep x (and dy) for stage 5 (coop_plan.h: measured
       against evict_normal); onchip loads nothing here */
    const uint64_t pol = policy_evict_last();
    FwdAcc<NCH> F;
    BwdAcc<NCH> B;
    EpiCoef<NCH> ep;
    if constexpr (kBwdEpi) epi_coef(R, g, grp, wk.K > 0, ep);
    /* the 16-byte tile kernels' mask from x: the (scale, bias) of the unit's chunk into
       sm.xm, but for the block's first unit, which the kernel wrote before its first barrier
       (xm_fill; block-uniform; the previous unit's reads ended before reduce_unit's
       barriers) */
    const int slot0 = TILE ? ((threadIdx.x & 31) % (kChunk / VEC)) * VEC : 0;
    if constexpr (kXmaskTile) {
      if (R.xmask && !xm_ready) {
        xm_fill(R, g, grp, sm);
        __syncthreads();
      }
    }
    if (KIND == SBN_OP_FORWARD) {
      F.count = 0.0f;
SBN_UNROLL
      for (int e = 0; e < NCH; e++) F.shift[e] = F.mean[e] = F.m2[e] = 0.0f;
    } else {
SBN_UNROLL
      for (int ch = 0; ch < NCH; ch++) {
        const int64_t c = thread_channel(grp, ch);
        B.mean[ch] = wk.K > 0 ? R.save_mean_in[c] : 0.0f;
        B.sdy[ch] = B.sdx[ch] = sbn_csum_t{0.0f, 0.0f};
      }
    }
    /* dz_first: g in place of dy in the batch, stored to dz, then summed as identity's dy;
       dy and y read with evict_first (stage 5 reads x and dz: L2 keeps x for it) */
    const bool dzf = dz_first(R);
    const uint64_t pol_dy = dzf ? policy_evict_first() : pol;
    EpiCoef<NCH> eg;
    grad_coef(ep, dzf, eg);
    each_batch(R, wk, nb, gb, hs, pol, R.dy, pol_dy, [&](Batch& bt, const Pos& bp) {
      if (KIND == SBN_OP_FORWARD)
        fwd_batch(F, bt, bp);
      else {
        uint4 yb[U];
        const bool has_y = load_y(R, bp, bt, ep, yb, pol_dy, B.mean, sm.xm + slot0);
        if constexpr (kBwdEpi && !kRecover && !ONCHIP) {
          if (dzf) {
SBN_UNROLL
            for (int k = 0; k < U; k++) {
SBN_UNROLL
              for (int e = 0; e < VEC; e++)
                elem_set<DT, VEC>(bt[k][NV - 1], e, grad_at(bt, k, e, ep, yb, has_y));
              store_pos<DT, VEC, kWholePos>(R.dz, bp.idx(k), bp.mask(k, kFull), bt[k][NV - 1]);
            }
          }
        }
        bwd_batch(B, bt, bp, eg, yb, has_y);
      }
    });
    typename Part<KIND>::T pt[NCH];
SBN_UNROLL
    for (int e = 0; e < NCH; e++) {
      if constexpr (KIND == SBN_OP_FORWARD) {
        const sbn_welford_t t = {F.count, F.mean[e], F.m2[e]};
        pt[e] = sbn_partial_from_shifted(t, F.shift[e]);
      } else {
        pt[e] = sbn_bwd_csums_t{B.sdy[e], B.sdx[e]};
      }
    }
    reduce_unit(R, g, grp, p, pt, sm, u % kChunk);
  }

  /* Stage 1 of the block's units [u0, u1) (coop_plan.h: sbn_unit_begin). Onchip: first
     every load of the block's units is issued (registers, or cp.async into shared
     memory), then the statistics. False (the block's threads agree) when a thread has
     more batches than the registers and the hold_slots of shared memory hold: the
     host's plan guarantees it never happens
     (coop_plan.h: sbn_onchip_fits); this only keeps a broken plan from writing past the
     shared memory. Likewise false for plane units whose planes are not whole vectors
     (the onchip kernels walk only whole ones; the plan never sends them here). */
  __device__ bool stage1(const sbn_coop_rank_t& R, const sbn_geo_t& g, int u0, int u1, uint4* hs,
                         int hold_slots, Smem& sm) {
    if (ONCHIP) {
      if (!TILE && g.sp % VEC != 0) return false; /* block-uniform */
      const uint64_t pol = policy_evict_first();
      int gb = 0, overflow = 0;
      for (int u = u0; u < u1; u++) {
        int grp, p;
        int64_t r0, r1;
        unit_rows(g, u, &grp, &p, &r0, &r1);
        Walk wk(g, grp, r0, r1);
        const int nb = (int)((wk.K + U - 1) / U);
        int bt = 0;
SBN_UNROLL
        for (int s = 0; s < NBR; s++)
          if (gb == s && bt < nb) {
            Pos bp;
            wk.batch(bp);
            load_batch(R, bp, hold[s], pol, R.dy, pol);
            bt++, gb++;
          }
        for (; bt < nb; bt++, gb++) {
          Pos bp;
          wk.batch(bp);
          if (gb - NBR < hold_slots)
            copy_to_smem(R, bp, hs, gb - NBR, pol);
          else
            overflow = 1;
        }
      }
      cp_async_wait_all(); /* this thread's copies (each thread reads only its own) */
      if (__syncthreads_or(overflow)) return false;
    }
    int gb = 0;
    for (int u = u0; u < u1; u++) {
      stats_unit(R, g, u, &gb, hs, sm, u == u0); /* u0's sm.xm: the kernel's (xm_first) */
      /* plane units wait in slot u % kChunk of sm.red (reduce_unit), flushed at the last
         slot and after the block's last unit (slots of the units since the later of u0
         and the last flush) */
      if (!TILE && (u % kChunk == kChunk - 1 || u + 1 == u1)) {
        const int first = u - u % kChunk > u0 ? u - u % kChunk : u0;
        flush_planes(R, g, first, u + 1 - first, sm);
      }
    }
    if (ONCHIP && !SBN_MUTANT(SBN_MUT_HELD_COPIES)) { /* fewer than NBR batches: the held
                                                        ones back in their first order */
SBN_NO_UNROLL
      for (int s = gb; s < NBR; s++) {
        Batch t;
        turn_hold(t);
      }
    }
    return true;
  }

  /* ---- stage 5 ---- */
  /* The outputs of a batch in place of its x. EPI: forward, act(y + z) (zb: z's batch
     where has_z; ACTK: 0 the activation sbn_act's, 1 ReLU compiled in, 2 ReLU or leaky
     ReLU compiled in, which one ep.act's, the same over the launch); backward, the gradient act'(y) dy (yb: y's batch where has_y, else
     slot 0; grad_at) in place of dy when `grads` (dz), and x - mean recovered from y in
     the in-place backward's copy (kRecover; and from z, yb's, where has_y). */
  template <int UB, int ACTK = 0>
  static __device__ __forceinline__ void outputs(uint4 (&bt)[UB][NV], const float (&kc)[NCH][4],
                                                 const EpiCoef<NCH>& ep, const uint4 (&zb)[UB], bool has_z,
                                                 const uint4 (&yb)[UB], bool has_y, bool grads) {
SBN_UNROLL
    for (int k = 0; k < UB; k++) {
      uint4 o = bt[k][0];
SBN_UNROLL
      for (int e = 0; e < VEC; e++) {
        const int ch = TILE ? e : 0;
        const float xv = elem_get<DT, VEC>(bt[k][0], e);
        float r;
        if (KIND == SBN_OP_FORWARD) {
          r = sbn_forward_y(xv, kc[ch][0], kc[ch][1], kc[ch][2], kc[ch][3]);
          if constexpr (kFwdEpi) {
            if (has_z) r += elem_get<DT, VEC>(zb[k], e);
            /* sbn_act's ReLU (NaN and -0 kept) and leaky ReLU, their expressions as its */
            if constexpr (ACTK == 2)
              r = ep.act == SBN_ACT_LEAKY ? (r > 0.0f ? r : SBN_MUL(ep.slope, r)) : (r < 0.0f ? 0.0f : r);
            else if constexpr (ACTK == 1)
              r = r < 0.0f ? 0.0f : r;
            else
              r = sbn_act(ep.act, ep.slope, r);
          }
        } else {
          const sbn_bwd_coef_t c4 = {kc[ch][0], kc[ch][1], kc[ch][2], kc[ch][3]};
          const float gr = grad_at(bt, k, e, ep, yb, has_y);
          if (kRecover)
            r = sbn_backward_dx_xmu(
                c4,
                sbn_xmu_from_y(ep.act, ep.inv_slope, xv, has_y ? elem_get<DT, VEC>(yb[k], e) : 0.0f,
                                ep.bias[ch], ep.rcp[ch]),
                gr);
          else
            r = sbn_backward_dx(c4, xv, gr);
          if (kBwdEpi && grads) elem_set<DT, VEC>(bt[k][NV - 1], e, gr);
        }
        elem_set<DT, VEC>(o, e, r);
      }
      bt[k][0] = o;
    }
  }

  /* Stage 5 of the stream kernels' forward with the epilogue: the unit's positions again
     (stage 5 of the stream variant walks them on its own), in MODE 0 in batches of H0
     positions, x and z of each: half a plain batch, two tensors in the registers of one
     (the fp16 plane kernels are at 128 registers: check-sass.sh), but 3 of U = 4 in the
     fp32 plane kernels. The y of a batch is stored before the next batch's loads (y may be
     x's or z's memory: they stay behind). MODE (the caller has checked): 0 any
     activation, z where given; 1 a ReLU or leaky ReLU without z, in whole batches of H = U
     positions, x alone (a plain batch's registers and loads in flight); 2 a ReLU with z (the tile
     kernels; leaky ReLU too below VEC 8: kReluZLeaky), x and z of H positions: U (at most 4) in
     4-element and scalar vectors, twice a plain batch's loads in flight (a position moves
     1.5x a plain one's bytes); 3 in the 16-byte fp16/bf16 ones, 1.5x the loads, where 4
     spill 32 B at their 128 registers (check-sass.sh). 1 and 2 have the activation compiled in
     (outputs' ACTK). */
  template <int MODE = 0>
  __device__ __forceinline__ void stage5_fwd_epi_stream(const sbn_coop_rank_t& R, Walk& wk, const float (&kc)[NCH][4],
                                                        const EpiCoef<NCH>& ep, uint64_t pol) {
    constexpr int HZ = VEC == 8 ? 3 : 4; /* MODE 2's most: what 128 registers hold */
    /* MODE 0's: half a batch, but 3 positions in the fp32 plane kernels (6 loads in flight
       with z), where 4 spill 8 B at their 128 registers (check-sass.sh) */
    constexpr int H0 = !TILE && VEC == 4 ? (U < 3 ? U : 3) : U > 1 ? U / 2 : 1;
    constexpr int H = MODE == 1 ? U : MODE == 2 ? (U < HZ ? U : HZ) : H0;
    const bool has_z = MODE == 2 || (MODE == 0 && R.z != nullptr);
    /* outputs' activation: sbn_act's (MODE 0), or compiled in: ReLU or leaky ReLU (MODE 1, and
       MODE 2 where kReluZLeaky), ReLU alone (MODE 2 in the 16-byte fp16/bf16 tile kernels) */
    constexpr int ACTK = MODE == 1 || (MODE == 2 && kReluZLeaky) ? 2 : MODE == 2 ? 1 : 0;
    const int nbh = (int)((wk.K + H - 1) / H);
    for (int b = 0; b < nbh; b++) {
      BatchPos<TILE, H, WHOLE> bp;
      wk.batch(bp);
      uint4 bt[H][NV], zb[H];
SBN_UNROLL
      for (int k = 0; k < H; k++) {
        bt[k][0] = load_pos<DT, VEC, kWholePos>(R.x, bp.idx(k), bp.mask(k, kFull), pol);
        if (has_z) zb[k] = load_pos<DT, VEC, kWholePos>(R.z, bp.idx(k), bp.mask(k, kFull), pol);
      }
      outputs<H, ACTK>(bt, kc, ep, zb, has_z, zb, false, false);
SBN_UNROLL
      for (int k = 0; k < H; k++) store_pos<DT, VEC, kWholePos>(R.out, bp.idx(k), bp.mask(k, kFull), bt[k][0]);
    }
  }

  /* Stage 5 of unit u (its coefficients in sm.coef); *gb as in stats_unit. */
  __device__ void stage5_unit(const sbn_coop_rank_t& R, const sbn_geo_t& g, int u, int* gb,
                              uint4* hs, const Smem& sm) {
    int grp, p;
    int64_t r0, r1;
    unit_rows(g, u, &grp, &p, &r0, &r1);
    Walk wk(g, grp, r0, r1);
    const int nb = (int)((wk.K + U - 1) / U);
    /* Skipping a unit that holds batches in registers (onchip) would leave the turns of
       turn_hold behind: every later unit would read another batch. It never happens:
       R.out and g.rows are the launch slot's, the same for every unit of the block, so
       either every unit is skipped or none; nb == 0 holds nothing. */
    const bool dzf = dz_first(R); /* dz written in stage 1: x and dz read here */
    if (g.rows == 0 || (R.out == nullptr && (!kBwdEpi || R.dz == nullptr || dzf)) || nb == 0) {
      *gb += nb;
      return;
    }
    float kc[NCH][4];
    const int slot0 = TILE ? ((threadIdx.x & 31) % (kChunk / VEC)) * VEC : grp % kChunk;
SBN_UNROLL
    for (int ch = 0; ch < NCH; ch++)
SBN_UNROLL
      for (int q = 0; q < 4; q++) kc[ch][q] = sm.coef[slot0 + ch][q];
    const uint64_t pol = policy_evict_first();
    EpiCoef<NCH> ep;
    if constexpr (EPI != SBN_EPI_NONE) epi_coef(R, g, grp, true, ep);
    if constexpr (kFwdEpi && !ONCHIP) {
      if constexpr (kReluBatches) {
        if (R.z == nullptr && (R.act == SBN_ACT_RELU || R.act == SBN_ACT_LEAKY)) {
          stage5_fwd_epi_stream<1>(R, wk, kc, ep, pol);
          *gb += nb;
          return;
        }
      }
      if constexpr (kReluZ) {
        if (R.z != nullptr && (R.act == SBN_ACT_RELU || (kReluZLeaky && R.act == SBN_ACT_LEAKY))) {
          stage5_fwd_epi_stream<2>(R, wk, kc, ep, pol);
          *gb += nb;
          return;
        }
      }
      stage5_fwd_epi_stream(R, wk, kc, ep, pol);
      *gb += nb;
      return;
    }
    EpiCoef<NCH> eg;
    grad_coef(ep, dzf, eg);
    float mean[NCH]; /* the mask from x's (load_y): the saved means, as the coefficients hold them */
SBN_UNROLL
    for (int ch = 0; ch < NCH; ch++) mean[ch] = kc[ch][0];
    each_batch(R, wk, nb, gb, hs, pol, dzf ? R.dz : R.dy, pol, [&](Batch& bt, const Pos& bp) {
      uint4 eb[U]; /* EPI: the forward's z, or the backward's y */
      if constexpr (kFwdEpi) {
        const bool has_z = R.z != nullptr;
        if (has_z) {
SBN_UNROLL
          for (int k = 0; k < U; k++) eb[k] = load_pos<DT, VEC, kWholePos>(R.z, bp.idx(k), bp.mask(k, kFull), pol);
        }
        outputs(bt, kc, ep, eb, has_z, eb, false, false);
      } else if constexpr (kRecover && !kRecoverByPos) {
        /* the in-place backward, the batch at once (z's batch in eb where the forward had
           a residual); the tile kernels' coefficients from shared memory (kRecoverSmem) */
        const bool dz = R.dz != nullptr;
        const bool has_z = load_y(R, bp, bt, ep, eb, pol, mean, sm.xm + slot0);
        if constexpr (kRecoverSmem) {
          float kb[NCH][4];
          EpiCoef<NCH> e1 = eg;
SBN_UNROLL
          for (int ch = 0; ch < NCH; ch++) {
            kb[ch][0] = 0.0f; /* the mean: x - mean is recovered, not read */
SBN_UNROLL
            for (int q = 1; q < 4; q++) kb[ch][q] = *(volatile const float*)&sm.coef[slot0 + ch][q];
            e1.bias[ch] = *(volatile const float*)&sm.xm[slot0 + ch][0];
            e1.rcp[ch] = *(volatile const float*)&sm.xm[slot0 + ch][1];
          }
          outputs(bt, kb, e1, eb, false, eb, has_z, dz);
        } else {
          outputs(bt, kc, eg, eb, false, eb, has_z, dz);
        }
        if (dz) {
SBN_UNROLL
          for (int k = 0; k < U; k++)
            store_pos<DT, VEC, kWholePos>(R.dz, bp.idx(k), bp.mask(k, kFull), bt[k][NV - 1]);
        }
        if (R.out != nullptr) store_batch(R, bp, bt);
      } else if constexpr (kRecover) {
        /* the in-place backward a position at a time (kRecoverByPos): a position's dx and
           dz stored once computed, before the next position's, so that fewer values are
           held at once */
        const bool dz = R.dz != nullptr;
        const bool has_z = load_y(R, bp, bt, ep, eb, pol, mean, sm.xm + slot0);
SBN_UNROLL
        for (int k = 0; k < U; k++) {
          uint4 b1[1][NV], z1[1] = {eb[k]};
SBN_UNROLL
          for (int v = 0; v < NV; v++) b1[0][v] = bt[k][v];
          outputs(b1, kc, eg, z1, false, z1, has_z, dz);
          if (dz) store_pos<DT, VEC, kWholePos>(R.dz, bp.idx(k), bp.mask(k, kFull), b1[0][NV - 1]);
          if (R.out != nullptr) store_pos<DT, VEC, kWholePos>(R.out, bp.idx(k), bp.mask(k, kFull), b1[0][0]);
        }
      } else if constexpr (kBwdEpi) {
        const bool dz = R.dz != nullptr && !dzf;
        const bool has_y = !dzf && load_y(R, bp, bt, ep, eb, pol, mean, sm.xm + slot0);
        outputs(bt, kc, eg, eb, false, eb, has_y, dz);
        if (dz) { /* the gradient, rounded to the dtype, where dy was */
SBN_UNROLL
          for (int k = 0; k < U; k++)
            store_pos<DT, VEC, kWholePos>(R.dz, bp.idx(k), bp.mask(k, kFull), bt[k][NV - 1]);
        }
      } else {
        outputs(bt, kc, ep, eb, false, eb, false, false);
      }
      if (!kRecover && (!kBwdEpi || R.out != nullptr)) store_batch(R, bp, bt); /* kRecover: above */
    });
  }
};

#endif /* SYNCBN_COOP_VEC_CUH_ */
