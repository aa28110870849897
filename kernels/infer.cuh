/* infer.cuh — the inference kernel (sbnForwardInference on device pointers): one
 * elementwise pass. Included by kernels/coop.cu.
 *
 * y = (x - running_mean) * (weight / sqrt(running_var + eps)) + bias, the CPU's formula
 * (sbn_forward_y): the same bits. The per-channel scale is computed once per thread and
 * channel, not per element; 16-byte vectors (VEC > 1) or single elements; no division
 * per element. Tile layouts (NHWC, or spatial == 1): thread t of T keeps the vector
 * column t % (C/VEC) and takes rows t / (C/VEC) + k * (T / (C/VEC)) (several columns in
 * turn when C/VEC > T). Plane layouts: a group of `group` threads per plane (n, c), the
 * plane's vectors masked at its unaligned ends (coop_plan.h: sbn_infer_group, the smallest
 * group whose one pass holds the plane). NCHW planes of 2048 elements or more in 16-byte
 * vectors: the flat kernel (one run of vectors over the grid's warps, evenly). Four
 * positions in flight per thread.
 * EPI: the kernels of sbnForwardInferenceEx, act(y + z) (a second copy of each).
 */
#ifndef SYNCBN_INFER_CUH_
#define SYNCBN_INFER_CUH_

constexpr int kInferBatch = SBN_INFER_BATCH; /* coop_plan.h: sbn_infer_group counts on it */

/* The epilogue of the EPI kernels (sbnForwardInferenceEx): act(y + z), z's position
   loaded with the same mask (z null: none). The CPU's order (cpu_ops.c): the same bits. */
template <int DT, int VEC, bool EPI, int Z = -1>
__device__ __forceinline__ float infer_epilogue(const sbn_infer_args_t& a, float y, const uint4& zv, int e) {
  if constexpr (EPI) {
    if (Z < 0 ? a.z != nullptr : Z > 0) y += elem_get<DT, VEC>(zv, e);
    y = sbn_act(a.act, a.slope, y);
  }
  return y;
}

template <int DT, int VEC>
__device__ __forceinline__ void infer_coef(const sbn_infer_args_t& a, int64_t c, float* mean,
                                           float* scale, float* bias) {
  *mean = a.rm[c];
  *scale = sbn_scale(a.weight ? a.weight[c] : 1.0f, sbn_invstd(a.rv[c], a.eps));
  *bias = a.bias ? a.bias[c] : 0.0f;
}

template <int DT, int VEC, bool EPI>
__global__ void __launch_bounds__(kThreads) sbn_infer_tile_kernel(const __grid_constant__ sbn_infer_args_t a) {
  const int64_t T = (int64_t)gridDim.x * kThreads, t = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  const int64_t cv = a.c / VEC, rows = a.n * a.sp;
  const int64_t rstep = T >= cv ? T / cv : 1;
  const int64_t r0 = T >= cv ? t / cv : 0;
  if (r0 >= rstep) return; /* the T % cv threads left over */
  const uint64_t pol = policy_evict_first();
  for (int64_t col = T >= cv ? t % cv : t; col < cv; col += T >= cv ? cv : T) {
    float mean[VEC], scale[VEC], bias[VEC];
SBN_UNROLL
    for (int e = 0; e < VEC; e++) infer_coef<DT, VEC>(a, col * VEC + e, &mean[e], &scale[e], &bias[e]);
    for (int64_t r = r0; r < rows; r += kInferBatch * rstep) {
      uint4 v[kInferBatch], zv[kInferBatch];
      unsigned m[kInferBatch];
SBN_UNROLL
      for (int k = 0; k < kInferBatch; k++) {
        m[k] = r + k * rstep < rows ? (1u << VEC) - 1u : 0u;
        v[k] = load_pos<DT, VEC>(a.x, ((r + k * rstep) * cv + col) * VEC, m[k], pol);
        if (EPI && a.z != nullptr) zv[k] = load_pos<DT, VEC>(a.z, ((r + k * rstep) * cv + col) * VEC, m[k], pol);
      }
SBN_UNROLL
      for (int k = 0; k < kInferBatch; k++) {
SBN_UNROLL
        for (int e = 0; e < VEC; e++)
          elem_set<DT, VEC>(v[k], e,
                            infer_epilogue<DT, VEC, EPI>(a,
                                                         sbn_forward_y(elem_get<DT, VEC>(v[k], e), mean[e], 0.0f,
                                                                       scale[e], bias[e]),
                                                         zv[k], e));
        store_pos<DT, VEC>(a.y, ((r + k * rstep) * cv + col) * VEC, m[k], v[k]);
      }
    }
  }
}

template <int DT, int VEC, bool EPI>
__global__ void __launch_bounds__(kThreads) sbn_infer_plane_kernel(const __grid_constant__ sbn_infer_args_t a) {
  const int groups = kThreads / a.group, gi = threadIdx.x / a.group, li = threadIdx.x % a.group;
  const int64_t planes = a.n * a.c;
  const uint64_t pol = policy_evict_first();
  for (int64_t pl = (int64_t)blockIdx.x * groups + gi; pl < planes; pl += (int64_t)gridDim.x * groups) {
    float mean, scale, bias;
    infer_coef<DT, VEC>(a, pl % a.c, &mean, &scale, &bias);
    const int64_t e0 = pl * a.sp, e1 = e0 + a.sp;
    const int64_t first = e0 / VEC, end = (e1 + VEC - 1) / VEC;
    for (int64_t v0 = first + li; v0 < end; v0 += (int64_t)kInferBatch * a.group) {
      uint4 v[kInferBatch], zv[kInferBatch];
      unsigned m[kInferBatch];
SBN_UNROLL
      for (int k = 0; k < kInferBatch; k++) {
        const int64_t s = (v0 + (int64_t)k * a.group) * VEC;
        const int lo = (int)(e0 - s > 0 ? e0 - s : 0), hi = (int)(e1 - s < VEC ? e1 - s : VEC);
        m[k] = hi > lo ? ((1u << hi) - 1u) & ~((1u << lo) - 1u) : 0u;
        v[k] = load_pos<DT, VEC>(a.x, s, m[k], pol);
        if (EPI && a.z != nullptr) zv[k] = load_pos<DT, VEC>(a.z, s, m[k], pol);
      }
SBN_UNROLL
      for (int k = 0; k < kInferBatch; k++) {
SBN_UNROLL
        for (int e = 0; e < VEC; e++)
          elem_set<DT, VEC>(v[k], e,
                            infer_epilogue<DT, VEC, EPI>(
                                a, sbn_forward_y(elem_get<DT, VEC>(v[k], e), mean, 0.0f, scale, bias), zv[k], e));
        store_pos<DT, VEC>(a.y, (v0 + (int64_t)k * a.group) * VEC, m[k], v[k]);
      }
    }
  }
}

/* NCHW planes of at least SBN_INFER_FLAT_MIN elements in 16-byte vectors
   (coop_plan.h: sbn_infer_kind): the tensor as one run of vectors, split evenly over the
   grid's warps in steps of 32 consecutive vectors (a load of a warp: 512 contiguous bytes),
   so that every warp moves the same bytes, within one step, whatever the planes' size and
   number: a plane a group left the plane kernel's last round part-empty (E34: the grid's
   planes rarely divide evenly, and 97x97 planes fill 3 passes of 1024 vectors 77 %). Each
   lane keeps the coefficients of the plane it is in: one division for its first element,
   then the plane's end moved on as the lane passes it. A lane moves 4 * 32 * VEC <= 1024
   elements a batch, less than a plane, so a batch reaches at most one end; the next
   plane's coefficients are loaded beside the batch's x where it does. A vector takes one
   plane's coefficients; one across an end (spatial not a multiple of VEC) takes each
   element's own plane's. */
template <int DT, int VEC, bool EPI, bool Z>
__device__ __forceinline__ void infer_flat_run(const sbn_infer_args_t& a) {
  constexpr int64_t kStep = 32 * VEC; /* the elements of a warp's step */
  static_assert(SBN_INFER_FLAT_MIN >= kInferBatch * kStep, "a lane's batch reaches at most one plane end");
  static_assert(SBN_INFER_FLAT_MIN > VEC, "the tensor's last part-vector lies in its last plane");
  const int64_t numel = a.n * a.c * a.sp, whole = numel / VEC; /* whole vectors */
  const int64_t steps = ((numel + VEC - 1) / VEC + 31) / 32;
  const int64_t warps = (int64_t)gridDim.x * kWarps, w = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int64_t s0 = w * steps / warps, s1 = (w + 1) * steps / warps;
  if (s0 >= s1) return;
  const uint64_t pol = policy_evict_first();
  const int64_t lane = threadIdx.x & 31;
  int64_t e = s0 * kStep + lane * VEC; /* the lane's first element of the batch */
  const int64_t pl = e / a.sp;         /* its plane */
  int64_t pend = (pl + 1) * a.sp;      /* the plane's end (an element index) */
  int c = (int)(pl % a.c);
  float mean, scale, bias;
  infer_coef<DT, VEC>(a, c, &mean, &scale, &bias);
  for (int64_t s = s0; s < s1; s += kInferBatch, e += kInferBatch * kStep) {
    uint4 v[kInferBatch], zv[kInferBatch];
    unsigned m[kInferBatch];
SBN_UNROLL
    for (int k = 0; k < kInferBatch; k++) {
      /* whole vectors only (the tensor's last part-vector: below): a partial load's
         element path in the loop took the fp16/bf16 kernels with z to 212 registers */
      m[k] = s + k < s1 && (e + k * kStep) / VEC < whole ? (1u << VEC) - 1u : 0u;
      v[k] = load_pos<DT, VEC, true>(a.x, e + k * kStep, m[k], pol);
      if (Z) zv[k] = load_pos<DT, VEC, true>(a.z, e + k * kStep, m[k], pol);
    }
    /* the next plane's coefficients where the lane's next batch starts in it or past it:
       the elements from the plane's end on take them, and so does the next batch */
    const bool cross = e + kInferBatch * kStep >= pend;
    const int cn = c + 1 == a.c ? 0 : c + 1;
    float nmean = mean, nscale = scale, nbias = bias;
    if (cross) infer_coef<DT, VEC>(a, cn, &nmean, &nscale, &nbias);
    const int64_t before = pend - e; /* the batch's elements before the end, from e */
SBN_UNROLL
    for (int k = 0; k < kInferBatch; k++) {
      /* element q of vector k, of this plane or (nx) the next */
      const auto y_at = [&](int q, bool nx) {
        return infer_epilogue<DT, VEC, EPI, Z>(a,
                                               sbn_forward_y(elem_get<DT, VEC>(v[k], q), nx ? nmean : mean, 0.0f,
                                                             nx ? nscale : scale, nx ? nbias : bias),
                                               zv[k], q);
      };
      const int64_t cut = before - k * kStep; /* vector k's elements before the end */
      if (cut >= VEC || cut <= 0) {           /* all in one plane: one choice a vector */
SBN_UNROLL
        for (int q = 0; q < VEC; q++) elem_set<DT, VEC>(v[k], q, y_at(q, cut <= 0));
      } else { /* across the end (spatial not a multiple of VEC): a choice an element */
SBN_UNROLL
        for (int q = 0; q < VEC; q++) elem_set<DT, VEC>(v[k], q, y_at(q, q >= cut));
      }
      store_pos<DT, VEC, true>(a.y, e + k * kStep, m[k], v[k]);
    }
    if (cross) {
      mean = nmean, scale = nscale, bias = nbias, c = cn;
      pend += a.sp;
    }
  }
  /* the tensor's last part-vector, element by element, by the lane whose step holds it:
     its elements are the last plane's (a plane is longer than a vector) */
  const int64_t tail = whole * VEC;
  if (tail < numel && whole / 32 >= s0 && whole / 32 < s1 && lane == whole % 32) {
    infer_coef<DT, VEC>(a, a.c - 1, &mean, &scale, &bias);
    for (int64_t i = tail; i < numel; i++) {
      uint4 xe = load_pos<DT, 1>(a.x, i, 1u, pol), ze = xe;
      if (Z) ze = load_pos<DT, 1>(a.z, i, 1u, pol);
      elem_set<DT, 1>(xe, 0,
                      infer_epilogue<DT, 1, EPI, Z>(a, sbn_forward_y(elem_get<DT, 1>(xe, 0), mean, 0.0f, scale, bias),
                                                    ze, 0));
      store_pos<DT, 1>(a.y, i, 1u, xe);
    }
  }
}
/* z or not, compiled apart: with z a run-time test, the loop took 159-162 registers in the
   fp16/bf16 kernels with the epilogue */
template <int DT, int VEC, bool EPI>
__global__ void __launch_bounds__(kThreads) sbn_infer_flat_kernel(const __grid_constant__ sbn_infer_args_t a) {
  if (EPI && a.z != nullptr)
    infer_flat_run<DT, VEC, EPI, EPI>(a);
  else
    infer_flat_run<DT, VEC, EPI, false>(a);
}

#endif /* SYNCBN_INFER_CUH_ */
