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
 * group whose one pass holds the plane). Four positions in flight per thread.
 * EPI: the kernels of sbnForwardInferenceEx, act(y + z) (a second copy of each).
 */
#ifndef SYNCBN_INFER_CUH_
#define SYNCBN_INFER_CUH_

constexpr int kInferBatch = SBN_INFER_BATCH; /* coop_plan.h: sbn_infer_group counts on it */

/* The epilogue of the EPI kernels (sbnForwardInferenceEx): act(y + z), z's position
   loaded with the same mask (z null: none). The CPU's order (cpu_ops.c): the same bits. */
template <int DT, int VEC, bool EPI>
__device__ __forceinline__ float infer_epilogue(const sbn_infer_args_t& a, float y, const uint4& zv, int e) {
  if constexpr (EPI) {
    if (a.z != nullptr) y += elem_get<DT, VEC>(zv, e);
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

#endif /* SYNCBN_INFER_CUH_ */
