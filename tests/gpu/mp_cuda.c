/* mp_cuda.c — see mp_cuda.h. */
#include "mp_cuda.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "mp_launch.h"

typedef struct {
  int count;
  int err; /* cudaError_t */
  char msg[240];
} probe_t;

/* Runs in the child: the only place this process family touches CUDA before mp_run. */
static int probe_main(void* out, size_t size, void* ctx) {
  (void)ctx;
  if (size != sizeof(probe_t)) return 1;
  probe_t* p = (probe_t*)out;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  p->err = (int)e;
  p->count = e == cudaSuccess ? n : 0;
  if (e != cudaSuccess)
    snprintf(p->msg, sizeof p->msg, "cudaGetDeviceCount: %s: %s", cudaGetErrorName(e),
             cudaGetErrorString(e));
  else if (n == 0)
    snprintf(p->msg, sizeof p->msg, "cudaGetDeviceCount: 0 devices");
  return 0;
}

int mp_probe_devices(char* why, size_t why_size) {
  probe_t p;
  memset(&p, 0, sizeof p);
  int rc = mp_call_in_child(probe_main, NULL, &p, sizeof p, 60.0);
  if (rc != 0) {
    if (why && why_size)
      snprintf(why, why_size, "the CUDA probe process failed (%s %d)",
               rc < 0 ? "crashed or hung:" : "exit", rc);
    return 0;
  }
  if (p.count <= 0 && why && why_size) {
    p.msg[sizeof p.msg - 1] = '\0';
    snprintf(why, why_size, "%s", p.msg);
  }
  return p.count > 0 ? p.count : 0;
}

int mp_probe_device_count(void) {
  return mp_probe_devices(NULL, 0);
}
