/* cuda_reason.h — why there is no usable CUDA device, in words: shared by the library
 * (src/gpu/gpu_team.c: a GPU team's init, sbnUnsupported) and the GPU tests' skip lines
 * (tests/gpu/gpu_skip.h).
 *
 * The reason is not cudaGetErrorString's text alone: without any NVIDIA driver the CUDA
 * runtime cannot load libcuda.so.1 and returns cudaErrorInsufficientDriver, "CUDA driver
 * version is insufficient for CUDA runtime version", which reads as an old driver. So:
 *   cudaErrorInsufficientDriver, libcuda.so.1 not loadable
 *       -> "no NVIDIA driver on this machine (libcuda.so.1 not found)"
 *   cudaErrorInsufficientDriver, a driver there
 *       -> CUDA's name and text, then "the NVIDIA driver (CUDA 12.4) is older than this
 *          build's runtime (CUDA 13.0)" (cudaDriverGetVersion, cudaRuntimeGetVersion)
 *   cudaErrorNoDevice, or a count of 0 -> "no CUDA device (the driver sees none)"
 *   any other error -> CUDA's name and text ("cudaErrorXxx: ...")
 *
 * Header-only, C and C++ (nvcc). Needs the CUDA runtime and dlopen (CUDA::cudart_static
 * brings ${CMAKE_DL_LIBS}; glibc 2.34+ has dlopen in libc).
 */
#ifndef SYNCBN_SRC_GPU_CUDA_REASON_H_
#define SYNCBN_SRC_GPU_CUDA_REASON_H_

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* Whether the driver library the CUDA runtime loads (libcuda.so.1) can be loaded: already
   in the process, else loaded (and unloaded again) now. On 0, why[0..why_size) receives
   dlerror()'s text. */
static inline int sbn_cuda_driver_loadable_(char* why, size_t why_size) {
  void* h = NULL;
#ifdef RTLD_NOLOAD
  h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
#endif
  if (!h) h = dlopen("libcuda.so.1", RTLD_LAZY);
  if (h) {
    dlclose(h);
    return 1;
  }
  const char* e = dlerror();
  snprintf(why, why_size, "%s", e ? e : "");
  return 0;
}

/* "CUDA 12.4" for a CUDA version number (12040), "CUDA version unknown" for 0. */
static inline void sbn_cuda_version_(char* out, size_t size, int v) {
  if (v > 0)
    snprintf(out, size, "CUDA %d.%d", v / 1000, (v % 1000) / 10);
  else
    snprintf(out, size, "CUDA version unknown");
}

/* Why there is no usable CUDA device, given cudaGetDeviceCount's result e and count:
   writes the reason into buf[0..size) and returns buf; returns NULL (buf empty) when
   e is cudaSuccess and count > 0 (a device is there). */
static inline const char* sbn_cuda_no_device_reason(cudaError_t e, int count, char* buf, size_t size) {
  if (!buf || !size) return NULL;
  buf[0] = '\0';
  if (e == cudaSuccess && count > 0) return NULL;
  if (e == cudaErrorInsufficientDriver) {
    char dl[200];
    if (!sbn_cuda_driver_loadable_(dl, sizeof dl)) {
      /* "libcuda.so.1: cannot open shared object file: No such file or directory" */
      if (dl[0] == '\0' || strstr(dl, "No such file"))
        snprintf(buf, size, "no NVIDIA driver on this machine (libcuda.so.1 not found)");
      else
        snprintf(buf, size, "no loadable NVIDIA driver on this machine (%s)", dl);
      return buf;
    }
    int dv = 0, rv = 0;
    if (cudaDriverGetVersion(&dv) != cudaSuccess) dv = 0;
    if (cudaRuntimeGetVersion(&rv) != cudaSuccess) rv = 0;
    char ds[40], rs[40];
    sbn_cuda_version_(ds, sizeof ds, dv);
    sbn_cuda_version_(rs, sizeof rs, rv);
    /* (a driver at least as new as the runtime that still is "insufficient": both versions,
       no verdict) */
    snprintf(buf, size, "%s: %s: the NVIDIA driver (%s)%s this build's runtime (%s)",
             cudaGetErrorName(e), cudaGetErrorString(e), ds,
             dv > 0 && rv > 0 && dv >= rv ? "," : " is older than", rs);
    return buf;
  }
  if (e == cudaErrorNoDevice || e == cudaSuccess) {
    snprintf(buf, size, "no CUDA device (the driver sees none)");
    return buf;
  }
  snprintf(buf, size, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
  return buf;
}

#endif /* SYNCBN_SRC_GPU_CUDA_REASON_H_ */
