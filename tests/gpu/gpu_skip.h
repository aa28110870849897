/* gpu_skip.h — why a program that needs a CUDA device skips, in one line: every GPU test
 * (test_gpu_team.c, test_gpu_margin.c, test_nccl_team.c through mp_cuda.c's probe,
 * test_gpu_math.cu) prints "<test>: SKIPPED: <reason>" and exits 77 (CTest's
 * SKIP_RETURN_CODE);
 * cmake/ctest_skip_reasons.cmake prints that line after the tests.
 *
 * The reason: src/gpu/cuda_reason.h (the library gives the same words).
 *
 * Header-only, C and C++ (nvcc), no harness.h (mp_cuda.c has no test counters). Needs
 * the CUDA runtime and dlopen (CUDA::cudart_static brings ${CMAKE_DL_LIBS}; glibc 2.34+
 * has dlopen in libc).
 */
#ifndef SYNCBN_TESTS_GPU_SKIP_H_
#define SYNCBN_TESTS_GPU_SKIP_H_

#include <stdio.h>

#include "../../src/gpu/cuda_reason.h"

/* cudaGetDeviceCount: the number of devices, 0 on an error; when 0, why[0..why_size)
   receives sbn_cuda_no_device_reason's text. */
static inline int gpu_count_devices(char* why, size_t why_size) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) n = 0;
  if (n <= 0) {
    char r[320];
    sbn_cuda_no_device_reason(e, n, r, sizeof r);
    if (why && why_size) snprintf(why, why_size, "%s", r);
    return 0;
  }
  return n;
}

/* Prints "<test>: SKIPPED: <why>" and returns 77 (harness.h's SBN_TEST_SKIP, mp_launch.h's
   MP_SKIP: CTest's SKIP_RETURN_CODE) for main to return. */
static inline int gpu_skip_no_device(const char* test, const char* why) {
  printf("%s: SKIPPED: %s\n", test, why && why[0] ? why : "no usable CUDA device");
  fflush(stdout);
  return 77;
}

#endif /* SYNCBN_TESTS_GPU_SKIP_H_ */
