/* coop_legacy.cuh — stages 1 and 5 of the first cooperative kernel (SBN_KERNEL=legacy),
 * kept as a named variant until a GPU run has compared it with the stream and onchip
 * variants (kernels/coop_vec.cuh). One element per load (32-bit, or 16-bit for
 * fp16/bf16), a Welford step (a division) per element, x read again in stage 5.
 *
 * Tile units: lane = channel, the 8 warps over interleaved rows. Plane units: threads
 * along the channel's rows, (n, s) kept incrementally. Each (slice, channel) partial is
 * the Welford state of x - shift (shift = the rank's first element of the channel), kept
 * as (count, mean_hi, mean_lo, m2) in the workspace like the other variants'.
 */
#ifndef SYNCBN_COOP_LEGACY_CUH_
#define SYNCBN_COOP_LEGACY_CUH_

/* ---- element access ---------------------------------------------------------------- */
/* One element per access (32-bit, or 16-bit for 2-byte dtypes), through Dt<DT>. */
template <int DT> struct Elem {
  static __device__ __forceinline__ float load(const void* p, int64_t i) {
    if (Dt<DT>::kSize == 4) return Dt<DT>::to_f32(static_cast<const uint32_t*>(p)[i]);
    return Dt<DT>::to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  static __device__ __forceinline__ void store(void* p, int64_t i, float v) {
    if (Dt<DT>::kSize == 4)
      static_cast<uint32_t*>(p)[i] = Dt<DT>::from_f32(v);
    else
      static_cast<uint16_t*>(p)[i] = (uint16_t)Dt<DT>::from_f32(v);
  }
};

/* Walks rows r = r0 + first, r0 + first + step, ... < r1 of channel c in a plane layout,
   calling f(element index). Keeps (n, s) incrementally: no division per element. */
template <typename F>
__device__ __forceinline__ void plane_walk(const sbn_geo_t& g, int64_t c, int64_t r0, int64_t r1,
                                           int first, int step, F f) {
  int64_t r = r0 + first;
  if (r >= r1) return;
  int64_t n = r / g.sp, s = r - n * g.sp;
  const int64_t dn = step / g.sp, ds = step - dn * g.sp;
  for (; r < r1; r += step) {
    f((n * g.c + c) * g.sp + s);
    s += ds;
    n += dn;
    if (s >= g.sp) {
      s -= g.sp;
      n++;
    }
  }
}

/* ---- per-channel arithmetic of a run of elements -------------------------------------- */
constexpr int kLegacyRun = 32; /* elements per Welford run before it is merged into the total */

struct WelfordRun {
  sbn_welford_t total, run;
  __device__ WelfordRun() : total(sbn_welford_empty()), run(sbn_welford_empty()) {}
  __device__ __forceinline__ void push(float v) {
    sbn_welford_push(&run, v);
    if (run.count == (float)kLegacyRun) {
      total = sbn_welford_merge(total, run);
      run = sbn_welford_empty();
    }
  }
  __device__ __forceinline__ sbn_welford_t result() const { return sbn_welford_merge(total, run); }
};

/* The backward's sums: compensated, term by term, as the other variants' (coop_vec.cuh). */
struct SumsRun {
  sbn_bwd_csums_t s;
  __device__ SumsRun() : s(Part<SBN_OP_BACKWARD>::empty()) {}
  __device__ __forceinline__ void push(float dy, float x, float mean) {
    float err;
    const float t = sbn_grad_term(dy, x, mean, &err);
    sbn_csum_add(&s.dy, dy);
    sbn_csum_add2(&s.dy_xmu, t, err);
  }
  __device__ __forceinline__ sbn_bwd_csums_t result() const { return s; }
};

__device__ __forceinline__ sbn_welford_t shfl_down_welford(sbn_welford_t w, int off) {
  sbn_welford_t o;
  o.count = __shfl_down_sync(0xffffffffu, w.count, off);
  o.mean = __shfl_down_sync(0xffffffffu, w.mean, off);
  o.m2 = __shfl_down_sync(0xffffffffu, w.m2, off);
  return o;
}

/* ---- stage 1 ---------------------------------------------------------------------------- */
template <int DT, bool TILE>
__device__ void legacy_fwd_stage1(const sbn_coop_rank_t& R, const sbn_geo_t& g, int unit, Smem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int grp = unit % g.ngroups, p = unit / g.ngroups;
  int64_t r0, r1;
  sbn_geo_slice(&g, p, &r0, &r1);
  if (TILE) {
    const int64_t c = (int64_t)grp * kChunk + lane;
    const bool active = c < g.c;
    float shift = active && g.rows > 0 ? Elem<DT>::load(R.x, c) : 0.0f;
    WelfordRun acc;
    if (active)
      for (int64_t r = r0 + w; r < r1; r += kWarps) acc.push(Elem<DT>::load(R.x, r * g.c + c) - shift);
    sm.red.w[w][lane] = acc.result();
    __syncthreads();
    if (w == 0 && active) {
      sbn_welford_t t = sm.red.w[0][lane];
      for (int q = 1; q < kWarps; q++) t = sbn_welford_merge(t, sm.red.w[q][lane]);
      Part<SBN_OP_FORWARD>::put(part_entry(R, g, p, c), sbn_partial_from_shifted(t, shift));
    }
    __syncthreads();
  } else {
    const int64_t c = grp;
    float shift = g.rows > 0 ? Elem<DT>::load(R.x, c * g.sp) : 0.0f;
    WelfordRun acc;
    plane_walk(g, c, r0, r1, tid, kThreads,
               [&](int64_t i) { acc.push(Elem<DT>::load(R.x, i) - shift); });
    sbn_welford_t t = acc.result();
    for (int off = 16; off > 0; off >>= 1) t = sbn_welford_merge(t, shfl_down_welford(t, off));
    if (lane == 0) sm.red.w[w][0] = t;
    __syncthreads();
    if (tid == 0) {
      t = sm.red.w[0][0];
      for (int q = 1; q < kWarps; q++) t = sbn_welford_merge(t, sm.red.w[q][0]);
      Part<SBN_OP_FORWARD>::put(part_entry(R, g, p, c), sbn_partial_from_shifted(t, shift));
    }
    __syncthreads();
  }
}

template <int DT, bool TILE>
__device__ void legacy_bwd_stage1(const sbn_coop_rank_t& R, const sbn_geo_t& g, int unit, Smem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int grp = unit % g.ngroups, p = unit / g.ngroups;
  int64_t r0, r1;
  sbn_geo_slice(&g, p, &r0, &r1);
  if (TILE) {
    const int64_t c = (int64_t)grp * kChunk + lane;
    const bool active = c < g.c;
    SumsRun acc;
    if (active) {
      const float mean = R.save_mean_in[c];
      for (int64_t r = r0 + w; r < r1; r += kWarps) {
        int64_t i = r * g.c + c;
        acc.push(Elem<DT>::load(R.dy, i), Elem<DT>::load(R.x, i), mean);
      }
    }
    sm.red.s[w][lane] = acc.result();
    __syncthreads();
    if (w == 0 && active) {
      sbn_bwd_csums_t t = sm.red.s[0][lane];
      for (int q = 1; q < kWarps; q++) t = sbn_bwd_csums_merge(t, sm.red.s[q][lane]);
      Part<SBN_OP_BACKWARD>::put(part_entry(R, g, p, c), t);
    }
    __syncthreads();
  } else {
    const int64_t c = grp;
    const float mean = R.save_mean_in[c];
    SumsRun acc;
    plane_walk(g, c, r0, r1, tid, kThreads, [&](int64_t i) {
      acc.push(Elem<DT>::load(R.dy, i), Elem<DT>::load(R.x, i), mean);
    });
    sbn_bwd_csums_t t = acc.result();
    for (int off = 16; off > 0; off >>= 1)
      t = sbn_bwd_csums_merge(t, Part<SBN_OP_BACKWARD>::shfl_down(t, off));
    if (lane == 0) sm.red.s[w][0] = t;
    __syncthreads();
    if (tid == 0) {
      t = sm.red.s[0][0];
      for (int q = 1; q < kWarps; q++) t = sbn_bwd_csums_merge(t, sm.red.s[q][0]);
      Part<SBN_OP_BACKWARD>::put(part_entry(R, g, p, c), t);
    }
    __syncthreads();
  }
}

/* ---- stage 5: the unit's elements, from x (and dy) read again ---------------------------- */
template <int KIND, int DT, bool TILE>
__device__ void legacy_stage5(const sbn_coop_rank_t& R, const sbn_geo_t& g, int unit, const Smem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int grp = unit % g.ngroups, p = unit / g.ngroups;
  if (g.rows == 0 || R.out == nullptr) return;
  int64_t r0, r1;
  sbn_geo_slice(&g, p, &r0, &r1);
  if (TILE) {
    const int64_t c = (int64_t)grp * kChunk + lane;
    if (c >= g.c) return;
    const float k0 = sm.coef[lane][0], k1 = sm.coef[lane][1], k2 = sm.coef[lane][2],
                k3 = sm.coef[lane][3];
    for (int64_t r = r0 + w; r < r1; r += kWarps) {
      const int64_t i = r * g.c + c;
      float xv = Elem<DT>::load(R.x, i), o;
      if (KIND == SBN_OP_FORWARD) {
        o = sbn_forward_y(xv, k0, k1, k2, k3);
      } else {
        sbn_bwd_coef_t kc = {k0, k1, k2, k3};
        o = sbn_backward_dx(kc, xv, Elem<DT>::load(R.dy, i));
      }
      Elem<DT>::store(R.out, i, o);
    }
  } else {
    const float k0 = sm.coef[0][0], k1 = sm.coef[0][1], k2 = sm.coef[0][2], k3 = sm.coef[0][3];
    plane_walk(g, (int64_t)grp, r0, r1, tid, kThreads, [&](int64_t i) {
      float xv = Elem<DT>::load(R.x, i), o;
      if (KIND == SBN_OP_FORWARD) {
        o = sbn_forward_y(xv, k0, k1, k2, k3);
      } else {
        sbn_bwd_coef_t kc = {k0, k1, k2, k3};
        o = sbn_backward_dx(kc, xv, Elem<DT>::load(R.dy, i));
      }
      Elem<DT>::store(R.out, i, o);
    });
  }
}

#endif /* SYNCBN_COOP_LEGACY_CUH_ */
