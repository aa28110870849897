/* mp_cuda.h — the CUDA questions a multi-process test's parent may not ask itself (a
 * CUDA context does not survive fork, and mp_run forks): asked in a child process
 * (mp_call_in_child), answered through a pipe. Links the CUDA runtime (mp_cuda.c). */
#ifndef SYNCBN_TESTS_MP_CUDA_H_
#define SYNCBN_TESTS_MP_CUDA_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices, as cudaGetDeviceCount says in a child process; 0 on any error
   (no driver, no device, the child crashed or hung for 60 s). When the count is 0 and
   why != NULL, why[0..why_size) receives the reason: gpu_skip.h's ("no NVIDIA driver on
   this machine (libcuda.so.1 not found)", "no CUDA device (the driver sees none)", ...),
   or why the probe process failed. The parent creates no CUDA context. */
int mp_probe_devices(char* why, size_t why_size);
/* mp_probe_devices(NULL, 0). */
int mp_probe_device_count(void);

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_TESTS_MP_CUDA_H_ */
