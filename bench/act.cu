/* act.cu — the split path's activation kernels (sbn-bench --epilogue, --paths split): what
 * a framework runs after a batch norm that has no epilogue, so that the fused op is timed
 * against the plain op followed by these. Elementwise, 16-byte vectors where the tensor
 * allows them (PyTorch's elementwise kernels do the same), a grid-stride loop of at most
 * 8 blocks of 256 per SM, fp32 arithmetic as the library's:
 *   forward  y = relu(y + z) in place (z NULL: relu(y)): a residual block's add + ReLU in
 *            one kernel (PyTorch runs two: the add, then the ReLU)
 *   backward g = dy where y > 0, else 0 (threshold_backward of the result)
 * The bits: fp32 the fused op's; fp16 / bf16 round bn(x) to the dtype before the add
 * (one more rounding than the fused op: the check's tolerance covers it). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "syncbn.h"

namespace {

template <typename T> struct Conv;
template <> struct Conv<float> {
  static __device__ float in(float v) { return v; }
  static __device__ float out(float v) { return v; }
};
template <> struct Conv<__half> {
  static __device__ float in(__half v) { return __half2float(v); }
  static __device__ __half out(float v) { return __float2half_rn(v); }
};
template <> struct Conv<__nv_bfloat16> {
  static __device__ float in(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __nv_bfloat16 out(float v) { return __float2bfloat16_rn(v); }
};

/* V elements of T per 16 bytes. */
template <typename T, int V> struct alignas(16) Vec { T v[V]; };

template <typename T, int V>
__global__ void __launch_bounds__(256) act_fwd(T* y, const T* z, int64_t nvec) {
  typedef Conv<T> C;
  Vec<T, V>* yv = reinterpret_cast<Vec<T, V>*>(y);
  const Vec<T, V>* zv = reinterpret_cast<const Vec<T, V>*>(z);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += (int64_t)gridDim.x * blockDim.x) {
    Vec<T, V> a = yv[i];
    if (z != nullptr) {
      const Vec<T, V> b = zv[i];
#pragma unroll
      for (int e = 0; e < V; e++) a.v[e] = C::out(C::in(a.v[e]) + C::in(b.v[e]));
    }
#pragma unroll
    for (int e = 0; e < V; e++) {
      const float f = C::in(a.v[e]);
      a.v[e] = C::out(f < 0.0f ? 0.0f : f);
    }
    yv[i] = a;
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(256) act_bwd(const T* y, const T* dy, T* g, int64_t nvec) {
  typedef Conv<T> C;
  const Vec<T, V>* yv = reinterpret_cast<const Vec<T, V>*>(y);
  const Vec<T, V>* dv = reinterpret_cast<const Vec<T, V>*>(dy);
  Vec<T, V>* gv = reinterpret_cast<Vec<T, V>*>(g);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += (int64_t)gridDim.x * blockDim.x) {
    const Vec<T, V> a = yv[i], d = dv[i];
    Vec<T, V> o;
#pragma unroll
    for (int e = 0; e < V; e++) o.v[e] = C::in(a.v[e]) <= 0.0f ? C::out(0.0f) : d.v[e];
    gv[i] = o;
  }
}

unsigned grid_for(int64_t nvec) {
  static int cap = 0;
  if (cap == 0) {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cap = (sms > 0 ? sms : 1) * 8;
  }
  const int64_t b = (nvec + 255) / 256;
  return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

bool aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

template <typename T>
cudaError_t fwd_of(void* y, const void* z, int64_t numel, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  if (numel == 0) return cudaSuccess;
  if (numel % V == 0 && aligned16(y) && (z == nullptr || aligned16(z)))
    act_fwd<T, V><<<grid_for(numel / V), 256, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(z), numel / V);
  else
    act_fwd<T, 1><<<grid_for(numel), 256, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(z), numel);
  return cudaGetLastError();
}

template <typename T>
cudaError_t bwd_of(const void* y, const void* dy, void* g, int64_t numel, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  if (numel == 0) return cudaSuccess;
  const T *yp = static_cast<const T*>(y), *dp = static_cast<const T*>(dy);
  if (numel % V == 0 && aligned16(y) && aligned16(dy) && aligned16(g))
    act_bwd<T, V><<<grid_for(numel / V), 256, 0, s>>>(yp, dp, static_cast<T*>(g), numel / V);
  else
    act_bwd<T, 1><<<grid_for(numel), 256, 0, s>>>(yp, dp, static_cast<T*>(g), numel);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t bench_act_forward(int dtype, void* y, const void* z, int64_t numel, cudaStream_t s) {
  switch (dtype) {
    case sbnFloat32: return fwd_of<float>(y, z, numel, s);
    case sbnFloat16: return fwd_of<__half>(y, z, numel, s);
    case sbnBFloat16: return fwd_of<__nv_bfloat16>(y, z, numel, s);
  }
  return cudaErrorInvalidValue;
}

extern "C" cudaError_t bench_act_backward(int dtype, const void* y, const void* dy, void* g, int64_t numel,
                                          cudaStream_t s) {
  switch (dtype) {
    case sbnFloat32: return bwd_of<float>(y, dy, g, numel, s);
    case sbnFloat16: return bwd_of<__half>(y, dy, g, numel, s);
    case sbnBFloat16: return bwd_of<__nv_bfloat16>(y, dy, g, numel, s);
  }
  return cudaErrorInvalidValue;
}
